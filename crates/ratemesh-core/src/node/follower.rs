//! The follower side: deciding from allowances, forwarding what only the owner can decide, the
//! fallback, reporting, applying grants.

use crate::prelude::*;
use alloc::sync::Arc;

use super::owner::{admitted_from_allowance, refused_until_grant};
use super::sizing::need_for;
use super::*;

/// What a follower does with a check.
pub(super) enum FollowerStep {
    /// Decided here.
    Decided(Decision),
    /// Only the owner can decide it (no allowance, and the key is not known to be contended).
    Forward,
}

impl Node {
    /// Decides a check on a key another node owns, or says it must be forwarded: from the
    /// allowance while it lasts; refused while the owner said the key is over its limit, or
    /// contended with this node's share spent; by the policy's fallback when the owner is
    /// unreachable; else forwarded.
    pub(super) fn decide_as_follower(
        &mut self,
        owner: NodeId,
        policy: &Arc<Policy>,
        key: KeyHash,
        cost: u64,
        now: Instant,
    ) -> FollowerStep {
        let reachable = self.peers.reachable(owner, now);
        let half_life = self.half_life_nanos();
        let retry_floor = self.next_grant_nanos(owner, now);
        let limit = &policy.limit;
        let rng = &mut self.rng;
        let step = self.keys.upsert_with(
            key,
            limit,
            now,
            || KeyMeta::new(policy.clone(), false),
            |bucket, meta| {
                if meta.policy.region != policy.region {
                    // The policy's terms between regions changed (a reload), or the key's state
                    // came without them: its reports carry the check's.
                    meta.policy = handoff::with_region(&meta.policy, policy.region);
                }
                let follower = meta.follower();
                if follower.owner != Some(owner) {
                    follower.follow(owner, keys::new_epoch(rng));
                }
                follower.demand.add(cost.max(1), now, half_life);
                // An allowance held is spent first: the owner debited it, and the key being over
                // its limit for others (a refused forward) does not make it void.
                if follower.allowance.take(cost, now) {
                    follower.used = follower.used.saturating_add(cost.max(1));
                    let left = follower.allowance.live(now);
                    return Some(FollowerStep::Decided(admitted_from_allowance(bucket, limit, left, now)));
                }
                if follower.over_until > now && cost > 0 && cost >= follower.over_cost {
                    follower.refused_unasked = follower.refused_unasked.saturating_add(cost);
                    let retry = follower.over_until.nanos_since(now);
                    let windowed = bucket.window_end_nanos(limit, now).is_some();
                    if windowed && retry > retry_floor && follower.granted_seen > 0 {
                        // Reported at the next round all the same, when that comes first: as the
                        // window's stock ran out, holders whose share shrank gave hits back,
                        // which reach the owner after it told this node it had none; they
                        // would stay counted and unused until the window ends, and only a
                        // report's answer brings them here. (A node that was never granted
                        // any, whose forwards are refused, has nothing to learn that way.)
                        follower.refused = follower.refused.saturating_add(cost);
                    }
                    return Some(FollowerStep::Decided(
                        bucket.peek(limit, cost, now).refused_for(Some(retry)),
                    ));
                }
                if !reachable {
                    return None;
                }
                if follower.contended_until > now && cost > 0 {
                    // Asked and refused: the owner learns of this demand at the next report.
                    follower.refused = follower.refused.saturating_add(cost);
                    let decision = refused_until_grant(bucket, limit, cost, now, retry_floor);
                    return Some(FollowerStep::Decided(decision));
                }
                Some(FollowerStep::Forward)
            },
        );
        match step {
            Some(FollowerStep::Decided(decision)) => {
                self.stats.allowance_decisions += 1;
                self.dirty.insert(key);
                self.audit_answered(key, policy, now, cost, decision.allowed);
                FollowerStep::Decided(decision)
            }
            Some(FollowerStep::Forward) => FollowerStep::Forward,
            None => FollowerStep::Decided(self.decide_by_fallback_now(owner, policy, key, cost, now)),
        }
    }

    /// How long until `owner` can have answered this node's next report: the next sync tick plus
    /// a round trip.
    fn next_grant_nanos(&self, owner: NodeId, now: Instant) -> u64 {
        let rtt = self.peers.srtt_nanos(owner).unwrap_or(0);
        self.next_sync_at().nanos_since(now).saturating_add(rtt)
    }

    /// Decides by the policy's fallback under this node's share of the limit, following `owner`
    /// (the key's entry is created when absent).
    fn decide_by_fallback_here(
        &mut self,
        owner: NodeId,
        policy: &Arc<Policy>,
        key: KeyHash,
        cost: u64,
        now: Instant,
    ) -> Decision {
        // The owner leaves this node's share out of its own limit only when it expects to hear
        // from this node (they share allowance state) and does not: otherwise, until the failure
        // detector moves the key, the owner still enforces the whole limit and a share taken here
        // would come on top. And it does so from its own last hearing of this node, which can be
        // later than this node's of it: an owner this node just found unreachable gets nothing
        // until it is cut off (`Peers::cut_off`). (A forward timed out while the owner is
        // reachable is decided by the share: a loss, not a cut; the README's "limit plus one
        // share".)
        let share = self.peers.expects(owner, now)
            && (self.peers.reachable(owner, now) || self.peers.cut_off(owner, now));
        let local_limit = match share {
            true => self.local_limit(&policy.limit),
            false => None,
        };
        let rng = &mut self.rng;
        let init = || KeyMeta::new(policy.clone(), false);
        self.keys.upsert_with(key, &policy.limit, now, init, |bucket, meta| {
            let follower = meta.follower();
            if follower.owner != Some(owner) {
                follower.follow(owner, keys::new_epoch(rng));
            }
            decide_by_fallback(policy, local_limit.as_ref(), bucket, follower, cost, now, rng)
        })
    }

    /// Applies an owner's grants: the authoritative state, a new allowance, and whether the key is
    /// contended or over its limit.
    pub(super) fn on_grants(&mut self, from: NodeId, order: u128, grants: Vec<Grant>, now: Instant) {
        if grants.is_empty() {
            return;
        }
        self.peers.expect(from, now, self.release_nanos());
        for grant in grants {
            let key = KeyHash(grant.key);
            let applied = self.update_key(key, |bucket, meta| {
                let limit = meta.policy.limit.clone();
                let follower = meta.follower.as_mut()?;
                let epoch_matches = grant.epoch == follower.epoch || grant.epoch == 0;
                if follower.owner != Some(from) || !epoch_matches {
                    // An answer to a relationship this node has left (another owner, or state it
                    // lost): the owner debited the grant, so dropping it is conservative.
                    return None;
                }
                let imported = Bucket::import(&limit, grant.state.into(), now).ok()?;
                let expires_at = grant.expires_in_nanos.map_or(Instant::MAX, |left| now.add_nanos(left));
                // Only grants of this epoch are in the owner's ledger of it: an allowance offered
                // to this node as a forwarder (epoch 0) is reported as held, not as seen, or the
                // owner would take it for grants of this epoch no longer in flight.
                if grant.epoch == follower.epoch {
                    follower.granted_seen = follower.granted_seen.saturating_add(grant.grant);
                }
                match grant.lease {
                    true => follower.allowance.renew(grant.grant, expires_at, now),
                    false => follower.allowance.add(grant.grant, expires_at, now),
                }
                follower.local = None;
                if order <= follower.grant_order {
                    // An earlier grant overtaken by a later one: its hits count, its view does not.
                    return Some(());
                }
                follower.grant_order = order;
                *bucket = imported;
                let held = follower.allowance.live(now);
                if held > grant.hold_max {
                    follower.allowance.hits = grant.hold_max;
                    follower.returned = follower.returned.saturating_add(held - grant.hold_max);
                }
                follower.contended_until = if grant.contended { expires_at } else { Instant::ZERO };
                follower.lease = grant.lease;
                follower.over_until = Instant::ZERO;
                if follower.allowance.live(now) == 0 {
                    let probe = bucket.peek(&limit, 1, now);
                    if let Some(retry) = probe.retry_after.filter(|_| !probe.allowed) {
                        // No later than the owner's window ends (the state came a one-way delay
                        // late, so its window seems to end that much later here).
                        follower.over_until = now.add_duration(retry).min(expires_at);
                        follower.over_cost = 1;
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
        self.audit_answered(key, policy, now, cost, decision.allowed);
        decision
    }

    /// `key`'s report for its owner, if it has news: a key without news costs nothing (an idle
    /// key, or one whose checks are forwarded, sends no report). A key whose owner is unreachable
    /// keeps its news for when the owner is back, and one still active is due again next round.
    pub(super) fn key_report(&mut self, key: KeyHash, now: Instant) -> Option<(NodeId, Report)> {
        let owner = self.ring.owner(key).unwrap_or(self.id);
        if owner == self.id {
            return None;
        }
        if !self.peers.reachable(owner, now) {
            self.dirty.insert(key);
            return None;
        }
        let half_life = self.half_life_nanos();
        // A holder that used nothing for a few intervals reports anyway: the owner keeps counting
        // what it holds, and may want it back.
        // (A lease needs no keepalive: it ends by itself, at both ends.)
        let keepalive = 4 * duration_nanos(self.config.sync_interval);
        let horizon = self.report_horizon_nanos(owner);
        let outcome = self.update_key(key, |bucket, meta| {
            let policy = meta.policy.clone();
            let follower = meta.follower.as_mut()?;
            follower.allowance.expire(now);
            let keepalive_due = follower.allowance.hits > 0
                && !follower.lease
                && follower.reported_at.is_none_or(|at| at.add_nanos(keepalive) <= now);
            let running_low = lease_running_low(follower, now, half_life, horizon);
            let report = (follower.report_due(running_low) || keepalive_due)
                .then(|| take_report(key, bucket, &policy, follower, now, half_life, horizon));
            let active = follower.allowance.hits > 0 || follower.demand.per_second(now, half_life) > 0;
            Some((report, active))
        });
        let (report, active) = outcome.flatten()?;
        if active {
            self.dirty.insert(key);
        }
        Some((owner, report?))
    }

    /// Sends `reports` (at most `sync_batch_len_max`) to `owner`, whose answers are now expected.
    pub(super) fn send_reports_to(&mut self, owner: NodeId, reports: Vec<Report>, now: Instant) {
        if reports.is_empty() {
            return;
        }
        self.stats.reports_sent += reports.len() as u64;
        self.peers.expect(owner, now, self.release_nanos());
        self.send(owner, Body { report: reports, ..Body::default() }, now);
    }

    /// How long an allowance must last at this node before a report's answer can renew it.
    fn report_horizon_nanos(&self, owner: NodeId) -> u64 {
        let rtt = self.peers.srtt_nanos(owner).unwrap_or(0);
        duration_nanos(self.config.sync_interval).saturating_add(rtt)
    }

    /// Gives back every allowance this node holds (a leaving node): reported at once.
    pub(super) fn return_allowances(&mut self, now: Instant) {
        let keys: Vec<KeyHash> = self.keys.keys().collect();
        for key in keys {
            let returned = self.update_key(key, |_, meta| {
                let follower = meta.follower.as_mut()?;
                let held = follower.allowance.live(now);
                follower.allowance = keys::Allowance::NONE;
                follower.returned = follower.returned.saturating_add(held);
                follower.demand = keys::DemandMeter::default();
                follower.has_news().then_some(())
            });
            if returned.flatten().is_some() {
                self.dirty.insert(key);
            }
        }
        self.report_all_now(now);
    }
}

/// Whether a follower's lease needs renewing: it would run dry, or end, before the answer to a
/// report sent at the next round could arrive.
fn lease_running_low(follower: &mut Follower, now: Instant, half_life: u64, horizon_nanos: u64) -> bool {
    let renew_nanos = 2 * horizon_nanos;
    let need = need_for(follower.demand.per_second(now, half_life), renew_nanos).max(1);
    follower.allowance.live(now) < need || follower.allowance.expires_at <= now.add_nanos(renew_nanos)
}

/// Takes a follower's news for a report, giving back allowance it holds beyond its need (a lease
/// is sized for longer: the owner trims it by its grants' `hold_max`).
pub(super) fn take_report(
    key: KeyHash,
    bucket: &Bucket,
    policy: &Policy,
    follower: &mut Follower,
    now: Instant,
    half_life: u64,
    horizon_nanos: u64,
) -> Report {
    let demand_per_s = follower.demand.per_second(now, half_life);
    let need = if follower.lease { u64::MAX } else { need_for(demand_per_s, horizon_nanos) };
    let held = follower.allowance.live(now);
    if held > need {
        follower.returned = follower.returned.saturating_add(held - need);
        follower.allowance.hits = need;
    }
    let seed = follower.seed_pending.then(|| SnapshotWire::from(bucket.export(now)));
    let report = Report {
        key: key.0,
        limit: LimitWire::from_limit(&policy.limit),
        epoch: follower.epoch,
        holding: follower.allowance.live(now),
        granted_seen: follower.granted_seen,
        uncovered: core::mem::take(&mut follower.uncovered),
        returned: core::mem::take(&mut follower.returned),
        refunded: core::mem::take(&mut follower.refunded),
        demand_per_s,
        seed,
        region: policy.region,
    };
    follower.used = 0;
    follower.refused = 0;
    follower.seed_pending = false;
    follower.reported_at = Some(now);
    report
}

/// Decides by the policy's fallback, counting admitted hits as uncovered (to be reported). The
/// local share starts from the owner's last state when this node has one (so a partition does not
/// begin with every node's share full), else fresh.
pub(super) fn decide_by_fallback(
    policy: &Policy,
    local_limit: Option<&Limit>,
    bucket: &Bucket,
    follower: &mut Follower,
    cost: u64,
    now: Instant,
    rng: &mut CoreRng,
) -> Decision {
    let limit = policy.limit.reported_limit();
    let decision = match (policy.fallback, local_limit) {
        (api::Fallback::LocalShare, Some(local_limit)) => {
            // The share starts from what the bucket beside the entry says was spent: a grant's
            // state, a snapshot read back at start, a handoff, or this node's own as the key's
            // previous owner (a fresh bucket when there was none). Starting it full would hand out
            // a share of the whole limit for a key that had little left (after a full restart,
            // until the owner is heard again).
            let local = follower.local.get_or_insert_with(|| {
                Bucket::import(local_limit, bucket.export(now), now)
                    .unwrap_or_else(|_| Bucket::new(local_limit, now))
            });
            local.check(local_limit, cost, now, rng)
        }
        // No share here: it rounds to nothing (a limit below the node count), or the owner does not
        // leave it out yet. Refused until the owner answers again or the failure detector moves
        // the key.
        (api::Fallback::LocalShare, None) => {
            Decision::admitted_blind(limit).refused_for(Some(FAIL_CLOSED_RETRY_NANOS))
        }
        (api::Fallback::FailOpen, _) => Decision::admitted_blind(limit),
        // Nothing is known about when the owner will be back: retry after an interval.
        (api::Fallback::FailClosed, _) => {
            Decision::admitted_blind(limit).refused_for(Some(FAIL_CLOSED_RETRY_NANOS))
        }
    };
    if decision.allowed {
        follower.uncovered = follower.uncovered.saturating_add(cost);
    }
    decision
}
