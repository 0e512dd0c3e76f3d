//! The follower side: deciding from allowances or by the fallback, reporting, applying grants.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::Rng;

use super::*;

impl Node {
    /// Decides a check on a key another node owns: from the allowance while the owner is
    /// reachable and has granted one, else by the policy's fallback.
    pub(super) fn decide_as_follower(
        &mut self,
        owner: NodeId,
        policy: &Arc<Policy>,
        key: KeyHash,
        cost: u64,
        now: Instant,
    ) -> (Decision, Path) {
        let reachable = self.peers.reachable(owner, now);
        let half_life = self.half_life_nanos();
        let limit = &policy.limit;
        let rng = &mut self.rng;
        let decided = self.keys.upsert_with(
            key,
            limit,
            now,
            || KeyMeta::new(policy.clone(), false),
            |bucket, meta| {
                let follower = meta.follower();
                if follower.owner != Some(owner) {
                    follower.follow(owner, rng.next_u64());
                }
                follower.demand.add(cost.max(1), now, half_life);
                if follower.over_until > now && cost > 0 {
                    let retry = follower.over_until.nanos_since(now);
                    return Some((bucket.peek(limit, cost, now).refused_for(Some(retry)), Path::Allowance));
                }
                if !(reachable && follower.granted) {
                    return None;
                }
                let decision = decide_from_allowance(bucket, limit, &mut follower.allowance, cost, now);
                let path = match decision.retry_after {
                    Some(_) if !decision.allowed && !follower.contended => Path::Exhausted,
                    _ => Path::Allowance,
                };
                Some((decision, path))
            },
        );
        // The fallback is the rare path: only it needs the local share of the limit.
        let (decision, path) = match decided {
            Some(decided) => decided,
            None => (self.decide_by_fallback_here(owner, policy, key, cost, now), Path::Fallback),
        };
        match path {
            Path::Allowance | Path::Exhausted => self.stats.allowance_decisions += 1,
            Path::Fallback => {
                self.stats.fallback_decisions += 1;
                self.fallbacks_since_sync += 1;
            }
        }
        self.dirty.insert(key);
        // Ask for a grant now when there is none yet or the allowance ran dry; not when the key
        // is contended or over its limit: the owner has nothing more to give before the next tick.
        if reachable && path != Path::Allowance {
            self.report_early(owner, key, now);
        }
        (decision, path)
    }

    /// Decides by the policy's fallback under this node's local share of the limit, following
    /// `owner` (the key's entry is created when absent).
    fn decide_by_fallback_here(
        &mut self,
        owner: NodeId,
        policy: &Arc<Policy>,
        key: KeyHash,
        cost: u64,
        now: Instant,
    ) -> Decision {
        let local_limit = self.scaled_limit(&policy.limit, 1, self.cluster_len);
        let rng = &mut self.rng;
        let init = || KeyMeta::new(policy.clone(), false);
        self.keys.upsert_with(key, &policy.limit, now, init, |_, meta| {
            let follower = meta.follower();
            if follower.owner != Some(owner) {
                follower.follow(owner, rng.next_u64());
            }
            decide_by_fallback(policy, &local_limit, follower, cost, now, rng)
        })
    }

    /// Sends one key's report now (no grant yet, or allowance exhausted), at most once per quarter
    /// interval per key.
    pub(super) fn report_early(&mut self, owner: NodeId, key: KeyHash, now: Instant) {
        let gap = duration_nanos(self.config.sync_interval) / 4;
        let half_life = self.half_life_nanos();
        let report = self.update_key(key, |bucket, meta| {
            let follower = meta.follower.as_mut()?;
            if follower.reported_at.is_some_and(|at| at.add_nanos(gap) > now) {
                return None;
            }
            Some(take_report(key, bucket, &meta.policy.limit, follower, now, half_life))
        });
        if let Some(report) = report.flatten() {
            self.stats.reports_sent += 1;
            self.send(owner, Body::Report(vec![report]), now);
        }
    }

    /// Applies an owner's grants: the authoritative state, a new allowance, and whether the key is
    /// contended or over its limit.
    pub(super) fn on_grants(&mut self, from: NodeId, grants: Vec<Grant>, now: Instant) {
        for grant in grants {
            let key = KeyHash(grant.key);
            let applied = self.update_key(key, |bucket, meta| {
                let limit = meta.policy.limit.clone();
                let follower = meta.follower.as_mut()?;
                if follower.owner != Some(from) || follower.epoch != grant.epoch {
                    // An answer to a relationship this node has left (another owner, or state it
                    // lost): the owner debited the grant, so dropping it is conservative.
                    return None;
                }
                let imported = Bucket::import(&limit, grant.state.into(), now).ok()?;
                *bucket = imported;
                follower.granted = true;
                follower.granted_seen = follower.granted_seen.saturating_add(grant.grant);
                follower.allowance = follower.allowance.saturating_add(grant.grant);
                follower.contended = grant.contended;
                follower.local = None;
                follower.over_until = Instant::ZERO;
                if follower.allowance == 0 {
                    let probe = bucket.peek(&limit, 1, now);
                    if let Some(retry) = probe.retry_after.filter(|_| !probe.allowed) {
                        follower.over_until = now.add_duration(retry);
                    }
                }
                Some(())
            });
            if applied.flatten().is_none() {
                self.stats.items_refused += 1;
            }
        }
    }

    /// A fallback decision regardless of reachability (the owner did not answer in time).
    pub(super) fn decide_by_fallback_now(
        &mut self,
        owner: NodeId,
        policy: &Arc<Policy>,
        key: KeyHash,
        cost: u64,
        now: Instant,
    ) -> Decision {
        self.stats.fallback_decisions += 1;
        self.fallbacks_since_sync += 1;
        let decision = self.decide_by_fallback_here(owner, policy, key, cost, now);
        self.dirty.insert(key);
        decision
    }

    /// One report per key with news, batched per owner.
    pub(super) fn send_reports(&mut self, now: Instant) {
        let half_life = self.half_life_nanos();
        let mut batches: BTreeMap<NodeId, Vec<Report>> = BTreeMap::new();
        let dirty = std::mem::take(&mut self.dirty);
        for key in dirty {
            let owner = self.ring.owner(key).unwrap_or(self.id);
            if owner == self.id || !self.peers.reachable(owner, now) {
                // Unreachable owner: keep the news for later; owned: nothing to report.
                if owner != self.id {
                    self.dirty.insert(key);
                }
                continue;
            }
            let report = self.update_key(key, |bucket, meta| {
                let follower = meta.follower.as_mut()?;
                let report = take_report(key, bucket, &meta.policy.limit, follower, now, half_life);
                let active = report.demand_per_s > 0
                    || report.holding > 0
                    || report.uncovered.saturating_add(report.returned) > 0;
                active.then_some(report)
            });
            if let Some(report) = report.flatten() {
                // A key still in demand (or holding an allowance) reports again next tick.
                self.dirty.insert(key);
                batches.entry(owner).or_default().push(report);
            }
        }
        for (owner, reports) in batches {
            self.stats.reports_sent += reports.len() as u64;
            for chunk in reports.chunks(self.config.sync_batch_len_max.max(1)) {
                self.send(owner, Body::Report(chunk.to_vec()), now);
            }
        }
    }
}

/// How a follower decided.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    /// From its allowance (or refused while the owner says the key is over its limit).
    Allowance,
    /// Refused: the allowance is spent though the owner may have room.
    Exhausted,
    /// By the fallback policy.
    Fallback,
}

/// Takes a follower's news for a report, returning allowance it holds beyond its need.
pub(super) fn take_report(
    key: KeyHash,
    bucket: &Bucket,
    limit: &Limit,
    follower: &mut Follower,
    now: Instant,
    half_life: u64,
) -> Report {
    let demand_per_s = follower.demand.per_second(now, half_life);
    // Keep what the coming interval needs (see `need_for`); give back the rest.
    let need = need_for(demand_per_s, half_life / 2);
    if follower.allowance > need {
        follower.returned = follower.returned.saturating_add(follower.allowance - need);
        follower.allowance = need;
    }
    let seed = follower.seed_pending.then(|| SnapshotWire::from(bucket.export(now)));
    let report = Report {
        key: key.0,
        limit: LimitWire::from_limit(limit),
        epoch: follower.epoch,
        holding: follower.allowance,
        granted_seen: follower.granted_seen,
        uncovered: std::mem::take(&mut follower.uncovered),
        returned: std::mem::take(&mut follower.returned),
        demand_per_s,
        seed,
    };
    follower.seed_pending = false;
    follower.reported_at = Some(now);
    report
}

/// Decides from the allowance: pass while it lasts; refuse with the authoritative state's view of
/// when the request could pass.
pub(super) fn decide_from_allowance(
    bucket: &Bucket,
    limit: &Limit,
    allowance: &mut u64,
    cost: u64,
    now: Instant,
) -> Decision {
    if *allowance >= cost.max(1) {
        *allowance -= cost;
        // The owner debited the allowance already: the authoritative state as it stands says
        // when the key is fresh again and what else is left.
        let mut decision = bucket.peek(limit, 0, now);
        decision.allowed = true;
        decision.retry_after = None;
        decision.remaining = allowance.saturating_add(decision.remaining);
        return decision;
    }
    let auth = bucket.peek(limit, cost, now);
    if cost > limit.capacity() {
        return auth.refused_for(None);
    }
    // The allowance is spent; a new grant comes within an interval (or sooner: an early report).
    let retry = auth.retry_after.map_or(1, crate::time::duration_nanos).max(1);
    auth.refused_for(Some(retry))
}

/// Decides by the policy's fallback, counting admitted hits as uncovered (to be reported).
pub(super) fn decide_by_fallback(
    policy: &Policy,
    local_limit: &Limit,
    follower: &mut Follower,
    cost: u64,
    now: Instant,
    rng: &mut CoreRng,
) -> Decision {
    let limit = policy.limit.reported_limit();
    let decision = match policy.fallback {
        api::Fallback::LocalShare => {
            let local = follower.local.get_or_insert_with(|| Bucket::new(local_limit, now));
            local.check(local_limit, cost, now, rng)
        }
        api::Fallback::FailOpen => Decision::admitted_blind(limit),
        // Nothing is known about when the owner will be back: retry after an interval.
        api::Fallback::FailClosed => {
            Decision::admitted_blind(limit).refused_for(Some(FAIL_CLOSED_RETRY_NANOS))
        }
    };
    if decision.allowed {
        follower.uncovered = follower.uncovered.saturating_add(cost);
    }
    decision
}
