//! The owner side: deciding on owned keys, sizing allowances, answering reports and forwarded
//! checks, handing keys over and replicating them.
//!
//! # Allowances and regimes
//!
//! An owner decides every check on a key it owns on the bucket (first come, first served), except
//! those a holder decides from an *allowance*: hits the owner debited from the bucket when it
//! granted them. The bucket must not refill under allowances that sit unused at their holders (an
//! idle holder's allowance and a full bucket would admit more than the capacity at once):
//! decisions first `hold` what the holders said they hold at their last reports, capped at the
//! capacity so that an estimate gone stale never turns into debt. Grants still in flight are not
//! held: they are the pipeline that keeps holders supplied across a round trip longer than the
//! sync interval, which a small bucket could not hold besides. Whether a node holds an allowance
//! is the owner's choice, per key and per node, from what the key can supply and what the node
//! asks for ([`SizingContext`]):
//!
//! - A node's *target* is its demand-proportional share of the key's pool (what the bucket holds,
//!   what is out in allowances and one interval of refill), capped by what its demand needs until
//!   the next grant can reach it (an interval and a round trip, with headroom).
//! - A target of at least `allowance_min` hits is worth an allowance: the node decides at memory
//!   speed and reports once per interval. A smaller one is not: a key whose share per node and
//!   interval is a few hits or less (a low limit, many nodes, many keys, a long period near its
//!   end) is split no further — its checks are forwarded and the owner decides them, exactly.
//! - The key is *contended* when the demand of one interval exceeds the pool. Then a holder whose
//!   allowance runs dry refuses locally until its next grant (the owner has nothing more to give
//!   it); otherwise it forwards the check. The owner's own checks follow the same rule: while the
//!   key is contended it decides from an allowance sized like anybody's, so that it takes its fair
//!   share, not whatever arrives first.

use crate::prelude::*;
use alloc::collections::BTreeMap;
use alloc::sync::Arc;

use super::*;
use crate::wire::WireMode;

/// Hits an allowance holds beyond the expected demand.
const NEED_SLACK: u64 = 2;
/// The fewest hits of refill over two horizons that a contended key's credit shares (below, the
/// refill goes first come, first served).
const CREDIT_REFILL_MIN: u64 = 4;
/// How many sync intervals ahead contention is judged over.
const CONTENTION_INTERVALS: u64 = 4;

impl Node {
    /// How long a participant may be silent before what it holds is released.
    pub(super) fn release_nanos(&self) -> u64 {
        8 * duration_nanos(self.config.peer_silence).max(2 * duration_nanos(self.config.sync_interval))
    }

    /// Decides a client's check on a key this node owns.
    pub(super) fn decide_as_owner(
        &mut self,
        policy: &Arc<Policy>,
        key: KeyHash,
        cost: u64,
        now: Instant,
    ) -> Decision {
        self.stats.owner_decisions += 1;
        let limit = self.owner_limit(policy);
        let half_life = self.half_life_nanos();
        let approximate = effective_mode(policy) == api::Mode::Approximate;
        let retry_floor = self.next_sync_at.nanos_since(now);
        let sizing = self.sizing_context(self.id, now);
        let rng = &mut self.rng;
        let (decision, tracked) = self.keys.upsert_with(
            key,
            limit.as_ref().unwrap_or(&policy.limit),
            now,
            || KeyMeta::new(policy.clone(), true),
            |bucket, meta| {
                meta.owned = true;
                meta.demand.add(cost.max(1), now, half_life);
                let decision = match limit.as_ref() {
                    None => zero_share(policy),
                    Some(limit) if approximate => {
                        decide_own(&sizing, bucket, limit, meta, cost, retry_floor, rng)
                    }
                    Some(limit) => sizing.metered(bucket, limit, meta, None, cost, rng),
                };
                (decision, decision.allowed && cost > 0)
            },
        );
        if approximate {
            self.own_due.insert(key);
        }
        if tracked && self.config.replicate {
            self.replicas_due.insert(key);
        }
        decision
    }

    /// Decides checks forwarded by `from`: on the bucket for keys this node owns (and, for
    /// approximate-mode keys, grants `from` an allowance when its share became worth one), by
    /// the fallback for keys it no longer owns (views differ for a moment; the hits are reported
    /// to the owner in this node's view).
    pub(super) fn on_forward(&mut self, from: NodeId, checks: Vec<ForwardCheck>, now: Instant) {
        let mut decided = Vec::with_capacity(checks.len());
        let mut grants = Vec::new();
        for check in checks {
            let Ok(limit) = check.limit.to_limit() else {
                self.stats.items_refused += 1;
                continue;
            };
            let key = KeyHash(check.key);
            let mode = match check.mode {
                WireMode::Exact => api::Mode::Exact,
                WireMode::Approximate => api::Mode::Approximate,
            };
            let policy = Arc::new(Policy { limit, mode, fallback: api::Fallback::LocalShare });
            let owner = self.ring.owner(key).unwrap_or(self.id);
            let decision = if owner == self.id {
                let (decision, grant) = self.decide_forwarded(from, &policy, key, &check, now);
                grants.extend(grant);
                decision
            } else {
                self.decide_by_fallback_now(owner, &policy, key, check.cost, now)
            };
            decided.push(Decided { id: check.id, decision: decision.into() });
        }
        if !decided.is_empty() {
            self.send(from, Body { decided, ..Body::default() }, now);
        }
        self.send_grants(from, grants, now);
    }

    /// One forwarded check on an owned key, and the allowance to grant its sender, if any (at most
    /// one grant per key and batch).
    fn decide_forwarded(
        &mut self,
        from: NodeId,
        policy: &Arc<Policy>,
        key: KeyHash,
        check: &ForwardCheck,
        now: Instant,
    ) -> (Decision, Option<Grant>) {
        self.stats.owner_decisions += 1;
        let limit = self.owner_limit(policy);
        let sizing = self.sizing_context(from, now);
        let approximate = check.mode == WireMode::Approximate;
        let rng = &mut self.rng;
        let (decision, grant) = self.keys.upsert_with(
            key,
            limit.as_ref().unwrap_or(&policy.limit),
            now,
            || KeyMeta::new(policy.clone(), true),
            |bucket, meta| {
                meta.owned = true;
                let Some(limit) = limit.as_ref() else { return (zero_share(policy), None) };
                let p = forwarder(&mut meta.participants, from, now);
                sizing.forwarded(p, check.cost, check.refused_here, now);
                sizing.heard(p, bucket, limit, now);
                let decision = sizing.metered(bucket, limit, meta, Some(from), check.cost, rng);
                // A holder's share is renewed by its reports; a forwarder gets one once it is worth it.
                let has_share = meta.participants.iter().any(|p| p.node == from && p.outstanding(now) > 0);
                let grant = (approximate && !has_share)
                    .then(|| sizing.grant(key, bucket, limit, meta, from, true))
                    .flatten()
                    .filter(|g| g.grant > 0);
                (decision, grant)
            },
        );
        if decision.allowed && check.cost > 0 && self.config.replicate {
            self.replicas_due.insert(key);
        }
        (decision, grant)
    }

    pub(super) fn on_release(&mut self, releases: Vec<Release>, now: Instant) {
        for release in releases {
            match release.limit.to_limit() {
                Ok(limit) => {
                    self.keys.release(KeyHash(release.key), &limit, LeaseId(release.lease), now);
                }
                Err(_) => self.stats.items_refused += 1,
            }
        }
    }

    pub(super) fn on_reports(&mut self, from: NodeId, order: u128, reports: Vec<Report>, now: Instant) {
        let mut grants = Vec::with_capacity(reports.len());
        for report in reports {
            match self.apply_report(from, order, report, now) {
                Some(grant) => {
                    if self.config.replicate {
                        self.replicas_due.insert(KeyHash(grant.key));
                    }
                    grants.push(grant);
                }
                None => self.stats.items_refused += 1,
            }
        }
        self.send_grants(from, grants, now);
    }

    fn send_grants(&mut self, to: NodeId, grants: Vec<Grant>, now: Instant) {
        if grants.is_empty() {
            return;
        }
        self.stats.grants_sent += grants.len() as u64;
        self.peers.expect(to, now, self.release_nanos());
        for chunk in grants.chunks(self.config.sync_batch_len_max.max(1)) {
            self.send(to, Body { grant: chunk.to_vec(), ..Body::default() }, now);
        }
    }

    /// Applies one follower's report (from a frame at `order`) to the authoritative bucket and
    /// computes its next grant.
    pub(super) fn apply_report(
        &mut self,
        from: NodeId,
        order: u128,
        report: Report,
        now: Instant,
    ) -> Option<Grant> {
        let limit = report.limit.to_limit().ok()?;
        let key = KeyHash(report.key);
        let policy =
            Arc::new(Policy { limit, mode: api::Mode::Approximate, fallback: api::Fallback::LocalShare });
        // A side of a partition whose share rounds to nothing still debits and credits what it
        // is told, under the whole limit, and grants nothing.
        let scaled = self.owner_limit(&policy);
        let share = scaled.is_some();
        let limit = scaled.unwrap_or_else(|| policy.limit.clone());
        let sizing = self.sizing_context(from, now);
        self.peers.expect(from, now, self.release_nanos());
        self.keys.upsert_with(
            key,
            &limit,
            now,
            || KeyMeta::new(policy.clone(), true),
            |bucket, meta| {
                meta.owned = true;
                if let Some(seed) = report.seed {
                    // Joining is idempotent: seeds from every follower may arrive, in any order.
                    bucket.join(&limit, seed.into(), now).ok()?;
                }
                // Hits admitted without an allowance (by the fallback) are debited, with the debt
                // capped at one capacity (only then: a client's charge is a debt owed in full).
                if report.uncovered > 0 {
                    bucket.force(&limit, report.uncovered, now);
                    bucket.cap_debt(&limit, now);
                }
                bucket.refund(&limit, report.refunded, now);
                let p = participant(&mut meta.participants, from, report.epoch, now);
                // Only what it still holds can come back (a void allowance is gone already). An
                // entry new with this report knows nothing it holds: what an allowance offered to
                // it as a forwarder (epoch 0) held comes back, bounded by the capacity.
                let known = p.report_order != 0 || p.sent != 0;
                let holds_max = if known { p.outstanding(now) } else { limit.capacity() };
                let returned = report.returned.min(holds_max);
                // What it holds and asks for replaces what an earlier report said, not what a later
                // one did (frames may arrive out of order); the sum of grants seen only grows.
                p.seen = p.seen.max(report.granted_seen);
                if order > p.report_order {
                    p.report_order = order;
                    p.holding = report.holding;
                    p.demand_per_s = report.demand_per_s;
                    p.reported_at = now;
                }
                sizing.heard(p, bucket, &limit, now);
                bucket.refund(&limit, returned, now);
                sizing.grant(key, bucket, &limit, meta, from, share)
            },
        )
    }

    /// What sizing an allowance for `holder` at `now` needs beyond the key's own state.
    pub(super) fn sizing_context(&self, holder: NodeId, now: Instant) -> SizingContext {
        let interval_nanos = duration_nanos(self.config.sync_interval);
        let rtt_nanos = if holder == self.id { 0 } else { self.peers.srtt_nanos(holder).unwrap_or(0) };
        SizingContext {
            now,
            half_life_nanos: self.half_life_nanos(),
            interval_nanos,
            horizon_nanos: interval_nanos.saturating_add(rtt_nanos),
            // The grant reaches a follower one way later: it expires that much earlier there.
            one_way_nanos: rtt_nanos / 2,
            release_nanos: self.release_nanos(),
            active_nanos: 2 * interval_nanos + rtt_nanos.max(duration_nanos(self.config.peer_silence)),
            allowance_min: self.config.allowance_min.max(1),
        }
    }

    /// At a sync tick: renews the owner's own allowance of every owned approximate key it used
    /// since (sized like any holder's while the key is contended, given back when not).
    pub(super) fn refresh_own_allowances(&mut self, now: Instant) {
        let sizing = self.sizing_context(self.id, now);
        for key in core::mem::take(&mut self.own_due) {
            let Some(meta) = self.keys.extra(key).filter(|m| m.owned) else { continue };
            let policy = meta.policy.clone();
            let Some(limit) = self.owner_limit(&policy) else { continue };
            let keep = self.keys.update(key, &limit, |bucket, meta| sizing.refresh_own(bucket, &limit, meta));
            if keep == Some(true) {
                self.own_due.insert(key);
            }
        }
    }

    /// Joins state from a key's (previous) owner: a handoff when ownership moved, or a replica
    /// kept in case the owner fails. Joining is conservative and idempotent either way.
    ///
    /// A handoff of a key this node does not own (it handed its keys over already: it is
    /// leaving, or its view moved on) is passed on to the owner in its view, joined with what it
    /// holds — unless that owner is the sender — so that when several members leave at once a
    /// state handed to one that has left already still reaches the key's owner.
    pub(super) fn on_states(&mut self, from: NodeId, states: Vec<KeyState>, replica: bool, now: Instant) {
        let mut pass_on: BTreeMap<NodeId, Vec<KeyState>> = BTreeMap::new();
        for state in states {
            let Ok(limit) = state.limit.to_limit() else {
                self.stats.items_refused += 1;
                continue;
            };
            let key = KeyHash(state.key);
            let owned = self.ring.owner(key) == Some(self.id);
            let policy = Arc::new(Policy {
                limit: limit.clone(),
                mode: api::Mode::Approximate,
                fallback: api::Fallback::LocalShare,
            });
            let joined = self.keys.upsert_with(
                key,
                &limit,
                now,
                || KeyMeta::new(policy, owned),
                |bucket, _| bucket.join(&limit, state.state.into(), now),
            );
            match (joined, replica) {
                (Ok(()), false) => self.stats.handoffs_received += 1,
                (Ok(()), true) => self.stats.replicas_received += 1,
                (Err(_), _) => self.stats.items_refused += 1,
            }
            if owned && self.config.replicate {
                self.replicas_due.insert(key);
            }
            let owner = self.ring.owner(key).filter(|&o| o != self.id && o != from);
            if let (Some(owner), false) = (owner, replica || owned) {
                let exported = self.keys.update(key, &limit, |bucket, _| bucket.export(now));
                if let Some(exported) = exported {
                    let limit = LimitWire::from_limit(&limit);
                    pass_on.entry(owner).or_default().push(KeyState {
                        key: key.0,
                        limit,
                        state: exported.into(),
                    });
                }
            }
        }
        self.send_handoffs(pass_on, now);
    }

    /// Sends key states to their owners as handoffs, batched.
    fn send_handoffs(&mut self, handoffs: BTreeMap<NodeId, Vec<KeyState>>, now: Instant) {
        for (owner, states) in handoffs {
            self.stats.handoffs_sent += states.len() as u64;
            for chunk in states.chunks(self.config.sync_batch_len_max.max(1)) {
                self.send(owner, Body { handoff: chunk.to_vec(), ..Body::default() }, now);
            }
        }
    }

    /// Sends the state of owned keys that changed since the last tick to their ring successors,
    /// so that an owner's crash loses at most one interval.
    pub(super) fn send_replicas(&mut self, now: Instant) {
        let mut batches: BTreeMap<NodeId, Vec<KeyState>> = BTreeMap::new();
        for key in core::mem::take(&mut self.replicas_due) {
            let Some(successor) = self.ring.successor(key).filter(|&s| s != self.id) else { continue };
            let Some(meta) = self.keys.extra(key).filter(|meta| meta.owned) else { continue };
            let limit = LimitWire::from_limit(&meta.policy.limit);
            let Some(state) = self.keys.export(key, now) else { continue };
            batches.entry(successor).or_default().push(KeyState { key: key.0, limit, state: state.into() });
        }
        for (successor, states) in batches {
            self.stats.replicas_sent += states.len() as u64;
            for chunk in states.chunks(self.config.sync_batch_len_max.max(1)) {
                self.send(successor, Body { replica: chunk.to_vec(), ..Body::default() }, now);
            }
        }
    }

    /// After a view change: hands keys this node owned and no longer owns to their new owners,
    /// and marks followed keys whose owner changed so their next report seeds the new owner.
    pub(super) fn move_keys(&mut self, now: Instant) {
        let mut handoffs: BTreeMap<NodeId, Vec<KeyState>> = BTreeMap::new();
        let keys: Vec<KeyHash> = self.keys.keys().collect();
        for key in keys {
            let owner = self.ring.owner(key).unwrap_or(self.id);
            let me = self.id;
            let epoch = keys::new_epoch(&mut self.rng);
            let moved = self.update_key(key, |bucket, meta| {
                let was_owned = meta.owned;
                meta.owned = owner == me;
                if was_owned && owner != me {
                    // Allowances out were debited in the bucket handed over, so holders keep
                    // them; the own allowance goes back into it: the new owner receives no hit
                    // counted that nobody will admit.
                    meta.participants.clear();
                    let own = core::mem::take(&mut meta.own).live(now);
                    bucket.refund(&meta.policy.limit, own, now);
                    meta.own_contended = false;
                    meta.follower().follow(owner, epoch);
                    return Some(KeyState {
                        key: key.0,
                        limit: LimitWire::from_limit(&meta.policy.limit),
                        state: bucket.export(now).into(),
                    });
                }
                if !was_owned && owner == me {
                    // Becoming the owner: the last authoritative view is the starting point, hits
                    // admitted here without an allowance are debited at once, and an allowance
                    // held here (debited by the previous owner) becomes the owner's own.
                    if let Some(follower) = meta.follower.take() {
                        bucket.force(&meta.policy.limit, follower.uncovered, now);
                        meta.own.add(follower.allowance.live(now), follower.allowance.expires_at, now);
                    }
                    return None;
                }
                if let Some(follower) = meta.follower.as_mut().filter(|f| f.owner != Some(owner)) {
                    follower.follow(owner, epoch);
                    follower.seed_pending = true;
                }
                None
            });
            if let Some(state) = moved.flatten() {
                handoffs.entry(owner).or_default().push(state);
                self.dirty.insert(key);
            }
        }
        self.send_handoffs(handoffs, now);
    }
}

/// The refusal of a side of a partition whose share of the limit rounds to nothing (a limit
/// below the node count): retry after a period.
pub(super) fn zero_share(policy: &Policy) -> Decision {
    let period = duration_nanos(policy.limit.spec().period);
    Decision::admitted_blind(policy.limit.reported_limit()).refused_for(Some(period.max(1)))
}

/// Decides on the bucket itself, first come first served: exact mode, forwarded checks, and the
/// owner's own checks while its share is not an allowance.
fn first_come(
    bucket: &mut Bucket,
    limit: &Limit,
    meta: &KeyMeta,
    cost: u64,
    now: Instant,
    rng: &mut CoreRng,
) -> Decision {
    hold_outstanding(bucket, limit, meta, now);
    bucket.check(limit, cost, now, rng)
}

/// Keeps what holders hold counted as in use (the module documentation says what and why).
pub(super) fn hold_outstanding(bucket: &mut Bucket, limit: &Limit, meta: &KeyMeta, now: Instant) {
    bucket.hold(limit, meta.held(now).min(limit.capacity()), now);
}

/// The owner's own approximate-mode check: from its allowance while it has one; refused when it
/// ran dry while the key is contended (its share is spent until the next tick); else on the
/// bucket, metered.
fn decide_own(
    sizing: &SizingContext,
    bucket: &mut Bucket,
    limit: &Limit,
    meta: &mut KeyMeta,
    cost: u64,
    retry_floor_nanos: u64,
    rng: &mut CoreRng,
) -> Decision {
    let now = sizing.now;
    if meta.own.take(cost, now) {
        return admitted_from_allowance(bucket, limit, meta.own.live(now), now);
    }
    if meta.own_contended && cost > 0 {
        return refused_until_grant(bucket, limit, cost, now, retry_floor_nanos);
    }
    sizing.metered(bucket, limit, meta, None, cost, rng)
}

/// An admission from an allowance with `left` hits still in it: the authoritative state (already
/// debited) says what else is left and when the key is fresh again.
pub(super) fn admitted_from_allowance(bucket: &Bucket, limit: &Limit, left: u64, now: Instant) -> Decision {
    let mut decision = bucket.peek(limit, 0, now);
    decision.allowed = true;
    decision.retry_after = None;
    decision.remaining = left.saturating_add(decision.remaining);
    decision
}

/// A refusal while the key is contended and this holder's allowance is spent: the next grant
/// comes at the next sync tick at the earliest.
pub(super) fn refused_until_grant(
    bucket: &Bucket,
    limit: &Limit,
    cost: u64,
    now: Instant,
    retry_floor_nanos: u64,
) -> Decision {
    let auth = bucket.peek(limit, cost, now);
    if cost > limit.capacity() {
        return auth.refused_for(None);
    }
    let retry = auth.retry_after.map_or(0, duration_nanos).max(retry_floor_nanos).max(1);
    auth.refused_for(Some(retry))
}

/// Hits a node with `demand_per_s` needs to hold for `horizon_nanos` (until its next grant can
/// arrive), with headroom for bursts; nothing without demand.
pub(super) fn need_for(demand_per_s: u64, horizon_nanos: u64) -> u64 {
    if demand_per_s == 0 {
        return 0;
    }
    let expected = u128::from(demand_per_s) * u128::from(horizon_nanos) / 1_000_000_000;
    let expected = u64::try_from(expected).unwrap_or(u64::MAX);
    // A quarter above the expected demand, plus a little: enough to last until the next grant
    // most of the time. Holding more would strand capacity at nodes that do not need it now; a
    // node that runs dry asks the owner, which keeps what nobody holds.
    expected.saturating_add(expected / 4).saturating_add(NEED_SLACK)
}

/// What sizing allowances at one instant takes besides the key's own state.
#[derive(Clone, Copy, Debug)]
pub(super) struct SizingContext {
    now: Instant,
    half_life_nanos: u64,
    interval_nanos: u64,
    /// Until the holder's next grant can reach it: an interval and a round trip.
    horizon_nanos: u64,
    one_way_nanos: u64,
    release_nanos: u64,
    /// A participant heard from within this long counts in the key's demand.
    active_nanos: u64,
    allowance_min: u64,
}

/// A key's pool and demand at one instant.
#[derive(Clone, Copy, Debug)]
struct Pool {
    /// What the bucket can admit now.
    available: u64,
    /// Available plus the allowances out: everything not admitted yet.
    unused: u64,
    /// Nanoseconds per hit of refill (0: none before the window's end).
    refill_nanos_per_hit: u64,
    /// The bucket's capacity.
    capacity: u64,
    /// Hits per second asked for by the owner and its active participants.
    demand_per_s: u64,
    /// Window algorithms: allowances die with the owner's current window, this far ahead.
    expires_in_nanos: Option<u64>,
}

impl SizingContext {
    /// Notes a check of `cost` forwarded by participant `p`: its demand is what it forwards,
    /// unless it reported a larger one lately (a holder forwards only what its allowance did not
    /// cover). Measured before this check: the estimate just after an arrival is biased up by it.
    fn forwarded(&self, p: &mut Participant, cost: u64, refused_here: u64, now: Instant) {
        p.forwards.add(cost.max(1).saturating_add(refused_here), now, self.half_life_nanos);
        let rate = p.forwards.per_second_without(now, self.half_life_nanos, cost.max(1));
        let reported_lately = p.reported_at.add_nanos(self.active_nanos) > now;
        p.demand_per_s = if reported_lately { p.demand_per_s.max(rate) } else { rate };
    }

    /// Notes that participant `p` was heard from: what it holds stays counted for another
    /// release period (or until its window ends).
    fn heard(&self, p: &mut Participant, bucket: &Bucket, limit: &Limit, now: Instant) {
        p.heard_at = now;
        let expires = bucket.window_end_nanos(limit, now).map_or(Instant::MAX, |left| now.add_nanos(left));
        p.released_at = now.add_nanos(self.release_nanos).min(expires);
    }

    fn pool(&self, bucket: &mut Bucket, limit: &Limit, meta: &mut KeyMeta) -> Pool {
        let now = self.now;
        let active = self.now.sub_nanos(self.active_nanos);
        meta.participants.retain(|p| p.released_at > now || p.heard_at > active);
        hold_outstanding(bucket, limit, meta, now);
        let outstanding = meta.outstanding(now);
        let available = bucket.peek(limit, 0, now).remaining;
        let own = meta.demand.per_second(now, self.half_life_nanos);
        let others = meta.participants.iter().filter(|p| p.heard_at > active).map(|p| p.demand_per_s);
        Pool {
            available,
            unused: available.saturating_add(outstanding),
            refill_nanos_per_hit: bucket.refill_nanos_per_hit(limit),
            capacity: limit.capacity(),
            demand_per_s: others.fold(own, u64::saturating_add),
            expires_in_nanos: bucket.window_end_nanos(limit, now),
        }
    }

    /// What the key can supply over `nanos`: everything not admitted yet and the refill meanwhile.
    fn supply(pool: &Pool, nanos: u64) -> u64 {
        let refill = nanos.checked_div(pool.refill_nanos_per_hit).unwrap_or(0);
        pool.unused.saturating_add(refill)
    }

    /// Whether demand will exhaust what the key can supply within a few intervals: demand above
    /// the refill rate that drains the stock (the bucket and the allowances out) within
    /// [`CONTENTION_INTERVALS`]. Judged over one interval, the stock of a key at twice its rate
    /// would always look sufficient for the next one, and the owner would take its own checks
    /// first come first served from what the holders' next grants need.
    fn contended(&self, pool: &Pool) -> bool {
        let span = self.interval_nanos.saturating_mul(CONTENTION_INTERVALS);
        let demand = u128::from(pool.demand_per_s) * u128::from(span) / 1_000_000_000;
        demand > u128::from(Self::supply(pool, span))
    }

    /// The allowance a holder with `demand_per_s` that holds `held` should hold: its demand's
    /// share of what the key can give it until its next grant can arrive (grants in flight count
    /// as held, so over a long round trip the share must cover it), capped by its need for as
    /// long; zero when that is below `allowance_min` (its checks are forwarded).
    ///
    /// What the key can give a holder is what the bucket holds, the refill meanwhile and what the
    /// holder itself holds — not what the others hold: a share of their allowances, which they
    /// are about to spend, would be taken again from the bucket, and at overload the holders that
    /// ask while the bucket has hits (the small ones, whose targets are quickly met) would get
    /// more than their demand's share of the refill.
    fn target(&self, pool: &Pool, demand_per_s: u64, held: u64) -> u64 {
        if pool.demand_per_s == 0 || demand_per_s == 0 {
            return 0;
        }
        // A node that would not use `allowance_min` hits before its next grant forwards instead;
        // so do all when the bucket cannot hold one interval's refill (a burst of one at a high
        // rate): grants, each at most what the bucket holds, could not keep up with the refill.
        let expected = u128::from(demand_per_s) * u128::from(self.horizon_nanos) / 1_000_000_000;
        let refill = self.interval_nanos.checked_div(pool.refill_nanos_per_hit).unwrap_or(0);
        if expected < u128::from(self.allowance_min) || pool.capacity < refill {
            return 0;
        }
        let refill_meanwhile = self.horizon_nanos.checked_div(pool.refill_nanos_per_hit).unwrap_or(0);
        let supply = pool.available.saturating_add(held).saturating_add(refill_meanwhile);
        let fair = u128::from(supply) * u128::from(demand_per_s) / u128::from(pool.demand_per_s);
        let target = u64::try_from(fair).unwrap_or(u64::MAX).min(need_for(demand_per_s, self.horizon_nanos));
        if target < self.allowance_min { 0 } else { target }
    }

    /// The rate a node with `demand_per_s` gets of the key's refill while the key is contended
    /// and its stock is down to what a couple of horizons refill; `None` otherwise (then checks
    /// on the bucket go first come, first served, and grants as their targets say). Window
    /// algorithms (no refill before their window ends) and keys refilling fewer than
    /// [`CREDIT_REFILL_MIN`] hits per two horizons are never metered.
    fn credit_rate(&self, pool: &Pool, demand_per_s: u64) -> Option<keys::CreditRate> {
        // The stock (a burst) goes first come, first served, as one limiter would give it. A key
        // that refills only a few hits in that span has no flow worth sharing (a daily quota, a
        // 10/s key): credit in whole hits would refuse more than it shares.
        let metering_nanos = 2 * self.horizon_nanos;
        let refill = metering_nanos
            .checked_div(pool.refill_nanos_per_hit)
            .filter(|&hits| hits >= CREDIT_REFILL_MIN)?;
        // Never while the bucket is more than a quarter full: hits a node's credit refuses stay in the
        // bucket, and a full bucket would lose the refill (nobody else may take it meanwhile).
        let stock_max = refill.saturating_add(1).min(pool.capacity / 4);
        if pool.available > stock_max || !self.contended(pool) {
            return None;
        }
        let demand = demand_per_s.max(1);
        let mut rate = keys::CreditRate {
            refill_nanos_per_hit: pool.refill_nanos_per_hit,
            demand,
            total: pool.demand_per_s.max(demand),
            cap_hits: 0,
        };
        // Enough to cover a grant's pipeline (a round trip and an interval) and arrivals bunched
        // within it, no more: credit one node does not use is refill another could have had.
        rate.cap_hits = rate.micro_per_nanos(metering_nanos) / 1_000_000 + 1;
        Some(rate)
    }

    /// Decides a check of `cost` on the bucket for `node` (a forwarder; `None`: the owner itself):
    /// first come, first served, except while [`credit_rate`](Self::credit_rate) meters the key,
    /// when the node's checks pass only within its credit — its demand's share of the refill
    /// ([`keys::Credit`]).
    fn metered(
        &self,
        bucket: &mut Bucket,
        limit: &Limit,
        meta: &mut KeyMeta,
        node: Option<NodeId>,
        cost: u64,
        rng: &mut CoreRng,
    ) -> Decision {
        let now = self.now;
        let pool = self.pool(bucket, limit, meta);
        let demand = match node {
            None => meta.demand.per_second(now, self.half_life_nanos),
            Some(node) => meta.participants.iter().find(|p| p.node == node).map_or(0, |p| p.demand_per_s),
        };
        let rate = match self.credit_rate(&pool, demand) {
            Some(rate) if cost > 0 => rate,
            _ => return first_come(bucket, limit, meta, cost, now, rng),
        };
        let Some(credit) = meta.credit(node) else { return first_come(bucket, limit, meta, cost, now, rng) };
        if let Err(wait_nanos) = credit.take(cost, rate, now) {
            return refused_until_grant(bucket, limit, cost, now, wait_nanos);
        }
        let decision = first_come(bucket, limit, meta, cost, now, rng);
        if !decision.allowed {
            meta.credit(node).into_iter().for_each(|credit| credit.give_back(cost));
        }
        decision
    }

    /// Sizes and debits `holder`'s next grant (its participant entry is current) and answers it;
    /// without a `share` of the limit (a partition's side that has none), nothing is granted.
    fn grant(
        &self,
        key: KeyHash,
        bucket: &mut Bucket,
        limit: &Limit,
        meta: &mut KeyMeta,
        holder: NodeId,
        share: bool,
    ) -> Option<Grant> {
        let now = self.now;
        let pool = self.pool(bucket, limit, meta);
        let contended = self.contended(&pool);
        let p = meta.participants.iter_mut().find(|p| p.node == holder)?;
        let target = if share { self.target(&pool, p.demand_per_s, p.outstanding(now)) } else { 0 };
        let mut grant = target.saturating_sub(p.outstanding(now)).min(pool.available);
        if let Some(rate) = self.credit_rate(&pool, p.demand_per_s) {
            grant = p.credit.take_up_to(grant, rate, now);
        }
        p.sent = p.sent.saturating_add(grant);
        let epoch = p.epoch;
        bucket.force(limit, grant, now);
        let expires_in_nanos = pool.expires_in_nanos.map(|left| left.saturating_sub(self.one_way_nanos));
        Some(Grant {
            key: key.0,
            epoch,
            state: bucket.export(now).into(),
            grant,
            hold_max: target,
            contended: contended && target > 0,
            expires_in_nanos,
        })
    }

    /// Renews the owner's own allowance; whether the key needs another look at the next tick.
    fn refresh_own(&self, bucket: &mut Bucket, limit: &Limit, meta: &mut KeyMeta) -> bool {
        let now = self.now;
        let pool = self.pool(bucket, limit, meta);
        let own_demand = meta.demand.per_second(now, self.half_life_nanos);
        let held = meta.own.live(now);
        let target = if self.contended(&pool) { self.target(&pool, own_demand, held) } else { 0 };
        meta.own_contended = target > 0;
        if held > target {
            bucket.refund(limit, held - target, now);
            meta.own.hits = target;
        } else {
            let mut grant = (target - held).min(pool.available);
            if let Some(rate) = self.credit_rate(&pool, own_demand) {
                grant = meta.own_credit.take_up_to(grant, rate, now);
            }
            bucket.force(limit, grant, now);
            let expires = pool.expires_in_nanos.map_or(Instant::MAX, |left| now.add_nanos(left));
            meta.own.add(grant, expires, now);
        }
        own_demand > 0 || meta.own.hits > 0
    }
}

/// The participant entry of `node` for `epoch`; a new epoch starts the accounting afresh (the
/// follower lost its state, or follows this owner anew).
pub(super) fn participant(
    participants: &mut Vec<Participant>,
    node: NodeId,
    epoch: u64,
    now: Instant,
) -> &mut Participant {
    let fresh = Participant {
        node,
        epoch,
        sent: 0,
        seen: 0,
        holding: 0,
        demand_per_s: 0,
        report_order: 0,
        forwards: keys::DemandMeter::default(),
        reported_at: Instant::ZERO,
        heard_at: now,
        released_at: now,
        credit: keys::Credit::default(),
    };
    let index = match participants.iter().position(|p| p.node == node) {
        Some(index) => index,
        None => {
            participants.push(fresh);
            participants.len() - 1
        }
    };
    let participant = &mut participants[index];
    if participant.epoch != epoch {
        *participant = fresh;
    }
    participant
}

/// The participant entry of `node` for its forwarded checks: the entry it has (whatever its
/// epoch), or a new one in epoch 0 (a forwarder that never reported).
pub(super) fn forwarder(participants: &mut Vec<Participant>, node: NodeId, now: Instant) -> &mut Participant {
    let epoch = participants.iter().find(|p| p.node == node).map_or(0, |p| p.epoch);
    participant(participants, node, epoch, now)
}
