//! The owner side: deciding on owned keys, answering reports with grants, handing keys over and
//! replicating them.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::Rng;

use super::*;

impl Node {
    /// What sizing grants at `now` needs from the configuration.
    pub(super) fn grant_context(&self, now: Instant) -> GrantContext {
        GrantContext {
            now,
            silence_nanos: duration_nanos(self.config.peer_silence),
            interval: self.config.sync_interval,
        }
    }

    /// Decides a check on a key this node owns. Exact mode decides on the bucket itself;
    /// approximate mode decides from the owner's own allowance, granted from the bucket like any
    /// follower's (so the owner takes its fair share, not whatever the followers left).
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
        let mode = effective_mode(policy);
        let grants = self.grant_context(now);
        let rng = &mut self.rng;
        let (decision, tracked) = self.keys.upsert_with(
            key,
            &limit,
            now,
            || KeyMeta::new(policy.clone(), true),
            |bucket, meta| {
                meta.owned = true;
                meta.demand.add(cost.max(1), now, half_life);
                // Allowances out count as in use: the bucket must not refill under them.
                bucket.hold(&limit, meta.outstanding(), now);
                let decision = match mode {
                    api::Mode::Exact => bucket.check(&limit, cost, now, rng),
                    api::Mode::Approximate => {
                        if meta.own_allowance < cost.max(1) {
                            let self_demand = meta.demand.per_second(now, half_life);
                            let own = (self_demand, meta.own_allowance);
                            let grant = grants.size(bucket, &limit, &meta.participants, own, own);
                            bucket.force(&limit, grant, now);
                            meta.own_allowance += grant;
                        }
                        decide_from_allowance(bucket, &limit, &mut meta.own_allowance, cost, now)
                    }
                };
                (decision, decision.allowed && cost > 0)
            },
        );
        if tracked && self.config.replicate {
            self.replicas_due.insert(key);
        }
        decision
    }

    pub(super) fn on_forward(&mut self, from: NodeId, checks: Vec<ForwardCheck>, now: Instant) {
        let mut decided = Vec::with_capacity(checks.len());
        for check in checks {
            let Ok(limit) = check.limit.to_limit() else {
                self.stats.items_refused += 1;
                continue;
            };
            let key = KeyHash(check.key);
            let policy =
                Arc::new(Policy { limit, mode: api::Mode::Exact, fallback: api::Fallback::LocalShare });
            let owner = self.ring.owner(key).unwrap_or(self.id);
            // A check for a key this node no longer owns (the views differ for a moment) is
            // decided by the fallback, and its hits are reported to the owner in this node's view.
            let decision = if owner == self.id {
                self.decide_as_owner(&policy, key, check.cost, now)
            } else {
                self.decide_by_fallback_now(owner, &policy, key, check.cost, now)
            };
            decided.push(Decided { id: check.id, decision: decision.into() });
        }
        if !decided.is_empty() {
            self.send(from, Body::Decided(decided), now);
        }
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

    pub(super) fn on_reports(&mut self, from: NodeId, reports: Vec<Report>, now: Instant) {
        let mut grants = Vec::with_capacity(reports.len());
        for report in reports {
            match self.apply_report(from, report, now) {
                Some(grant) => {
                    if self.config.replicate {
                        self.replicas_due.insert(KeyHash(grant.key));
                    }
                    grants.push(grant);
                }
                None => self.stats.items_refused += 1,
            }
        }
        if !grants.is_empty() {
            self.stats.grants_sent += grants.len() as u64;
            self.send(from, Body::Grant(grants), now);
        }
    }

    /// Applies one follower's report to the authoritative bucket and computes its next grant.
    pub(super) fn apply_report(&mut self, from: NodeId, report: Report, now: Instant) -> Option<Grant> {
        let limit = report.limit.to_limit().ok()?;
        let key = KeyHash(report.key);
        let policy =
            Arc::new(Policy { limit, mode: api::Mode::Approximate, fallback: api::Fallback::LocalShare });
        let limit = self.owner_limit(&policy);
        let silence = duration_nanos(self.config.peer_silence);
        let half_life = self.half_life_nanos();
        let grants = self.grant_context(now);
        self.keys.upsert_with(
            key,
            &limit,
            now,
            || KeyMeta::new(policy.clone(), true),
            |bucket, meta| {
                if let Some(seed) = report.seed {
                    // Joining is idempotent: seeds from every follower may arrive, in any order.
                    bucket.join(&limit, seed.into(), now).ok()?;
                }
                bucket.force(&limit, report.uncovered, now);
                bucket.cap_debt(&limit, now);
                bucket.refund(&limit, report.returned, now);
                let participant = participant(&mut meta.participants, from, report.epoch, now);
                // Reports may arrive out of order: the sum of grants seen only grows.
                participant.seen = participant.seen.max(report.granted_seen);
                participant.holding = report.holding;
                participant.demand_per_s = report.demand_per_s;
                participant.heard_at = now;
                let holder = (participant.demand_per_s, participant.outstanding());
                // A participant silent for long is gone (crashed, or follows another owner): what
                // it held is released.
                meta.participants.retain(|p| p.heard_at.add_nanos(8 * silence) > now);
                // Allowances out count as in use: the bucket must not refill under them.
                bucket.hold(&limit, meta.outstanding(), now);
                let own = (meta.demand.per_second(now, half_life), meta.own_allowance);
                let grant = grants.size(bucket, &limit, &meta.participants, own, holder);
                bucket.force(&limit, grant, now);
                if let Some(p) = meta.participants.iter_mut().find(|p| p.node == from) {
                    p.sent = p.sent.saturating_add(grant);
                }
                let contended = grants.contended(&limit, &meta.participants, own.0);
                let state = bucket.export(now).into();
                Some(Grant { key: key.0, epoch: report.epoch, state, grant, contended })
            },
        )
    }

    /// Joins state from a key's (previous) owner: a handoff when ownership moved, or a replica
    /// kept in case the owner fails. Joining is conservative and idempotent either way.
    pub(super) fn on_states(&mut self, states: Vec<KeyState>, replica: bool, now: Instant) {
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
        }
    }

    /// Sends the state of owned keys that changed since the last tick to their ring successors,
    /// so that an owner's crash loses at most one interval.
    pub(super) fn send_replicas(&mut self, now: Instant) {
        let mut batches: BTreeMap<NodeId, Vec<KeyState>> = BTreeMap::new();
        for key in std::mem::take(&mut self.replicas_due) {
            let Some(successor) = self.ring.successor(key).filter(|&s| s != self.id) else { continue };
            let Some(meta) = self.keys.extra(key).filter(|meta| meta.owned) else { continue };
            let limit = LimitWire::from_limit(&meta.policy.limit);
            let Some(state) = self.keys.export(key, now) else { continue };
            batches.entry(successor).or_default().push(KeyState { key: key.0, limit, state: state.into() });
        }
        for (successor, states) in batches {
            self.stats.replicas_sent += states.len() as u64;
            for chunk in states.chunks(self.config.sync_batch_len_max.max(1)) {
                self.send(successor, Body::Replica(chunk.to_vec()), now);
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
            let epoch = self.rng.next_u64();
            let moved = self.update_key(key, |bucket, meta| {
                let was_owned = meta.owned;
                meta.owned = owner == me;
                if was_owned && owner != me {
                    meta.participants.clear();
                    // The own allowance was debited in the bucket now handed over: keep using it.
                    let own_allowance = std::mem::take(&mut meta.own_allowance);
                    let follower = meta.follower();
                    follower.follow(owner, epoch);
                    follower.allowance = follower.allowance.saturating_add(own_allowance);
                    return Some(KeyState {
                        key: key.0,
                        limit: LimitWire::from_limit(&meta.policy.limit),
                        state: bucket.export(now).into(),
                    });
                }
                if !was_owned && owner == me {
                    // Becoming the owner: the last authoritative view is the starting point, and
                    // hits admitted here without an allowance are debited at once.
                    if let Some(follower) = meta.follower.take() {
                        bucket.force(&meta.policy.limit, follower.uncovered, now);
                        meta.own_allowance = meta.own_allowance.saturating_add(follower.allowance);
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
        for (owner, states) in handoffs {
            self.stats.handoffs_sent += states.len() as u64;
            for chunk in states.chunks(self.config.sync_batch_len_max.max(1)) {
                self.send(owner, Body::Handoff(chunk.to_vec()), now);
            }
        }
    }
}

/// Hits a node with `demand_per_s` needs to hold for `window_nanos`, with headroom for bursts.
pub(super) fn need_for(demand_per_s: u64, interval_nanos: u64) -> u64 {
    let expected = u128::from(demand_per_s) * u128::from(interval_nanos) / 1_000_000_000;
    let expected = u64::try_from(expected).unwrap_or(u64::MAX);
    // An interval's demand and half again, plus a little: enough to last until the next grant
    // most of the time. Holding more would strand capacity at nodes that do not need it now; a
    // node that runs dry asks the owner, which keeps what nobody holds.
    expected.saturating_add(NEED_SLACK)
}

/// What sizing a grant takes besides the key's own state.
#[derive(Clone, Copy)]
pub(super) struct GrantContext {
    now: Instant,
    silence_nanos: u64,
    interval: core::time::Duration,
}

impl GrantContext {
    /// Whether the recent demand of the owner and its active participants clearly exceeds the
    /// rate (by a quarter: demand estimates over a few intervals are noisy).
    pub(super) fn contended(&self, limit: &Limit, participants: &[Participant], own_demand: u64) -> bool {
        let demand = self.active(participants).fold(own_demand, |sum, p| sum.saturating_add(p.demand_per_s));
        let rate = limit.rate_per_second();
        demand > rate.saturating_add(rate / 4)
    }

    /// The participants heard from within the silence bound.
    pub(super) fn active<'p>(
        &self,
        participants: &'p [Participant],
    ) -> impl Iterator<Item = &'p Participant> + 'p {
        let (now, silence) = (self.now, self.silence_nanos);
        participants.iter().filter(move |p| p.heard_at.add_nanos(silence) > now)
    }

    /// The allowance to add for a holder with `(demand per second, allowance held)`: its demand's
    /// share of everything not yet admitted, minus what it holds, capped by its need (two intervals
    /// of its demand) and by what the bucket can give. `own` is the owner's own demand and
    /// allowance; `participants` are the followers (silent ones do not count).
    ///
    /// "Everything not yet admitted" is the allowances held and what the bucket will hold one
    /// interval from now: granting the coming refill early keeps holders from running dry between
    /// grants; the bucket goes into debt by at most one interval of refill, paid back by that very
    /// refill, and never holds more than its capacity.
    pub(super) fn size(
        &self,
        bucket: &Bucket,
        limit: &Limit,
        participants: &[Participant],
        own: (u64, u64),
        holder: (u64, u64),
    ) -> u64 {
        let (demand_sum, held_sum) = self
            .active(participants)
            .fold(own, |(d, h), p| (d.saturating_add(p.demand_per_s), h.saturating_add(p.outstanding())));
        let (demand, held) = holder;
        if demand_sum == 0 || demand == 0 {
            return 0;
        }
        let available = bucket.peek(limit, 0, self.now).remaining;
        let pool = u128::from(available.saturating_add(held_sum));
        let fair = u64::try_from(pool * u128::from(demand) / u128::from(demand_sum)).unwrap_or(u64::MAX);
        let need = need_for(demand, duration_nanos(self.interval));
        fair.min(need).saturating_sub(held).min(available)
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
    let fresh = Participant { node, epoch, sent: 0, seen: 0, holding: 0, demand_per_s: 0, heard_at: now };
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
