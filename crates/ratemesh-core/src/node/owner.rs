//! The owner side: deciding on owned keys, answering reports and forwarded checks.
//!
//! How allowances are sized, and what a key's regime is: `sizing.rs`; handoffs and replicas:
//! `handoff.rs`.

use crate::prelude::*;
use alloc::sync::Arc;

use super::sizing::{LEASE_INTERVALS_MIN, LEASE_NANOS_MIN, Offer, SizingContext, forwarder, participant};
use super::*;
use crate::wire::WireMode;

impl Node {
    /// How long a participant may be silent before what it holds is released.
    pub(super) fn release_nanos(&self) -> u64 {
        8 * duration_nanos(self.config.peer_silence).max(2 * duration_nanos(self.config.sync_interval))
    }

    /// How long a headroom lease lasts (`sizing.rs`): 4 s, or 8 sync intervals if longer.
    pub(super) fn lease_nanos(&self) -> u64 {
        LEASE_NANOS_MIN.max(LEASE_INTERVALS_MIN * duration_nanos(self.config.sync_interval))
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
        let limit = self.owner_limit(policy, key, now);
        let half_life = self.half_life_nanos();
        let approximate = effective_mode(policy) == api::Mode::Approximate;
        let retry_floor = self.next_sync_at().nanos_since(now);
        let sizing = self.sizing_context(self.id, now);
        let (epoch, replicate) = (self.due_epoch, self.replicates());
        let audit_slot = self.audit_slot(key, policy, cost, now);
        let rng = &mut self.rng;
        let (decision, own_due, replica_due, audit_fold) = self.keys.upsert_with(
            key,
            limit.as_ref().unwrap_or(&policy.limit),
            now,
            || KeyMeta::born(policy.clone(), now),
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
                let tracked = decision.allowed && cost > 0;
                // Only a key another member draws on needs the owner's own allowance renewed: one
                // nobody shares is decided first come on the bucket. (The owner holds an
                // allowance only from a refresh, which keeps the key due while it does.)
                let shared = !meta.participants.is_empty();
                let own_due = approximate && shared && keys::mark_due(&mut meta.own_due_epoch, epoch);
                let replica_due = tracked && replicate && keys::mark_due(&mut meta.replica_due_epoch, epoch);
                let audit_fold = audit_slot.and_then(|slot| meta.audit_hot.add(slot, cost, decision.allowed));
                (decision, own_due, replica_due, audit_fold)
            },
        );
        if let Some(hot) = audit_fold {
            self.audit_fold(key, policy, hot, now);
        }
        self.region_touched(key, policy, now);
        // Marked in the key's entry, which the check has just touched: a key already due this
        // round costs no probe of the sets (most checks of a busy key).
        if own_due {
            self.own_due.insert(key);
        }
        if replica_due {
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
        // The checks of a batch mostly share a limit and mode: each policy is built once.
        let mut last: Option<(LimitWire, WireMode, Arc<Policy>)> = None;
        for check in checks {
            let policy = match last.as_ref() {
                Some((limit, mode, policy))
                    if *limit == check.limit && *mode == check.mode && policy.region == check.region =>
                {
                    policy.clone()
                }
                _ => {
                    let Ok(limit) = check.limit.to_limit() else {
                        self.stats.items_refused += 1;
                        continue;
                    };
                    let mode = match check.mode {
                        WireMode::Exact => api::Mode::Exact,
                        WireMode::Approximate => api::Mode::Approximate,
                    };
                    // The forwarder counts the answer for the audit (`audit.rs`): not this node.
                    let policy = handoff::wire_policy(&limit, mode, check.region);
                    last = Some((check.limit.clone(), check.mode, policy.clone()));
                    policy
                }
            };
            let key = KeyHash(check.key);
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
        let limit = self.owner_limit(policy, key, now);
        let sizing = self.sizing_context(from, now);
        let approximate = check.mode == WireMode::Approximate;
        let rng = &mut self.rng;
        let (decision, grant) = self.keys.upsert_with(
            key,
            limit.as_ref().unwrap_or(&policy.limit),
            now,
            || KeyMeta::born(policy.clone(), now),
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
                    .then(|| sizing.grant(key, bucket, limit, meta, from, Offer::AllowanceOrLease))
                    .flatten()
                    .filter(|g| g.grant > 0);
                (decision, grant)
            },
        );
        if decision.allowed && check.cost > 0 && self.replicates() {
            self.replicas_due.insert(key);
        }
        self.region_touched(key, policy, now);
        (decision, grant)
    }

    pub(super) fn on_release(&mut self, releases: Vec<Release>, now: Instant) {
        for release in releases {
            match release.limit.to_limit() {
                Ok(limit) => {
                    let key = KeyHash(release.key);
                    if self.release_lease(key, &limit, LeaseId(release.lease), now) {
                        self.release_replica(release, now);
                    }
                }
                Err(_) => self.stats.items_refused += 1,
            }
        }
    }

    /// Releases `lease` of `key`; whether it was held here. The key is tracked even when it was
    /// not, to remember the release: the state that holds the lease (a replica, a handoff to a
    /// new owner) can arrive after it.
    pub(super) fn release_lease(
        &mut self,
        key: KeyHash,
        limit: &Limit,
        lease: LeaseId,
        now: Instant,
    ) -> bool {
        let owned = self.ring.owner(key) == Some(self.id);
        let region = api::PolicyRegion::default();
        let policy = || KeyMeta::new(handoff::state_policy(limit, region), owned);
        self.keys.upsert_with(key, limit, now, policy, |bucket, _| bucket.release(limit, lease, now))
    }

    /// After a lease of a key this node owns was released here: the release goes to the key's
    /// successor too. Its replica joins the owner's (a union of leases), so it would otherwise
    /// hold the lease until it expires, and hold it against the key if it took over.
    pub(super) fn release_replica(&mut self, release: Release, now: Instant) {
        let key = KeyHash(release.key);
        if self.ring.owner(key) != Some(self.id) || !self.replicates() {
            return;
        }
        let Some(successor) = self.ring.successor(key).filter(|&s| s != self.id) else { return };
        self.send(successor, Body { release: vec![release], ..Body::default() }, now);
    }

    pub(super) fn on_reports(&mut self, from: NodeId, order: u128, reports: Vec<Report>, now: Instant) {
        let mut grants = Vec::with_capacity(reports.len());
        for report in reports {
            match self.apply_report(from, order, report, now) {
                Some(grant) => {
                    if self.replicates() {
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
        if grants.iter().any(|g| g.lease) {
            // A leaseholder may be silent for a whole lease while it holds state shared with this
            // node: expected (heartbeats, reachability counted) until its lease and a release
            // period passed, and sent sequenced heartbeats meanwhile, so that a cut towards it
            // shows here as frames it does not acknowledge, as soon as it would show to it. (Else
            // it could decide by its share while this node, hearing it, enforces the whole limit.)
            let for_nanos = self.release_nanos().saturating_add(self.lease_nanos());
            self.peers.expect(to, now, for_nanos);
            self.peers.want_acks(to, now, for_nanos);
        }
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
        // A follower whose state came without terms (a snapshot read back) reports none: the
        // key keeps those its checks brought.
        let region = match report.region == api::PolicyRegion::default() {
            true => self.keys.extra(key).map_or(report.region, |meta| meta.policy.region),
            false => report.region,
        };
        let policy = handoff::state_policy(&limit, region);
        // A side of a partition whose share rounds to nothing still debits and credits what it
        // is told, under the whole limit, and grants nothing.
        let scaled = self.owner_limit(&policy, key, now);
        let share = scaled.is_some();
        let limit = scaled.unwrap_or_else(|| policy.limit.clone());
        let sizing = self.sizing_context(from, now);
        self.peers.expect(from, now, self.release_nanos());
        let grant = self.keys.upsert_with(
            key,
            &limit,
            now,
            || KeyMeta::new(policy.clone(), true),
            |bucket, meta| {
                meta.owned = true;
                if let Some(seed) = report.seed {
                    // Joining is idempotent: seeds from every follower may arrive, in any order.
                    meta.born = None;
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
                let offer = match (share, report.demand_per_s > 0) {
                    (false, _) => Offer::Nothing,
                    (true, false) => Offer::Allowance,
                    (true, true) => Offer::AllowanceOrLease,
                };
                sizing.grant(key, bucket, &limit, meta, from, offer)
            },
        );
        self.region_touched(key, &policy, now);
        grant
    }

    /// At a sync round: renews the owner's own allowance of an owned approximate key it used
    /// since (sized like any holder's while the key is contended, given back when not); due again
    /// while it is shared.
    pub(super) fn refresh_own_allowance(&mut self, key: KeyHash, sizing: &SizingContext) {
        let Some(meta) = self.keys.extra(key).filter(|m| m.owned) else { return };
        let policy = meta.policy.clone();
        let Some(limit) = self.owner_limit(&policy, key, sizing.now) else { return };
        let keep = self.keys.update(key, &limit, |bucket, meta| sizing.refresh_own(bucket, &limit, meta));
        if keep == Some(true) {
            self.own_due.insert(key);
        }
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
pub(super) fn first_come(
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
/// ran dry while the key is contended by other members too (its share is spent until the next
/// tick); else on the bucket, metered. A key no other member uses (no participant) is the
/// owner's alone: there is nobody to share with, and refusing while the bucket holds hits would be
/// a false reject.
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
    if meta.own_contended_until > now && cost > 0 && !meta.participants.is_empty() {
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
