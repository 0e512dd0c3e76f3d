//! Forwarded checks: sent to the owner in batches (every exact-mode check; approximate-mode checks
//! that no allowance covers), answered later, or decided by the fallback when the owner does not
//! answer in time.

use crate::prelude::*;

use super::forwards::TimedOut;
use super::*;
use crate::limit::Algorithm;
use crate::wire::WireMode;

/// The shortest wait for a forwarded check's answer: well above a LAN round trip and a scheduling
/// hiccup of a loaded host. A fallback decision is the expensive outcome (a share of the limit
/// instead of the owner's exact answer); a longer wait costs latency only when the owner is gone.
const FORWARD_WAIT_MIN_NANOS: u64 = 50_000_000;

/// The longest new forwards to an owner are held back while a batch sent to it is unanswered
/// (group commit). The hold is two round trips to the owner, at most this: the answer normally
/// ends it first, and a lost answer (or a far owner) delays the next batch by no more than this.
const FORWARD_HOLD_MAX_NANOS: u64 = 1_000_000;

impl Node {
    pub(super) fn forward(&mut self, owner: NodeId, request: CheckRequest, now: Instant) -> CheckOutcome {
        if let Some(decision) = self.refused_here(&request, now) {
            return CheckOutcome::Decided(decision);
        }
        if !self.peers.reachable(owner, now) || self.forwards.len() >= self.config.pending_forwards_max {
            let decision =
                self.decide_by_fallback_now(owner, &request.policy, request.key, request.cost, now);
            return CheckOutcome::Decided(decision);
        }
        let id = self.forwards.next_id();
        let mode = match effective_mode(&request.policy) {
            api::Mode::Exact => WireMode::Exact,
            api::Mode::Approximate => WireMode::Approximate,
        };
        let refused_here = self.take_refused_unasked(request.key);
        let check = ForwardCheck {
            id,
            key: request.key.0,
            limit: LimitWire::from_limit(&request.policy.limit),
            cost: request.cost,
            mode,
            refused_here,
            region: request.policy.region,
        };
        let deadline = now.add_nanos(self.forward_wait_nanos(owner));
        debug_assert!(deadline > now, "a forward waits for its answer");
        self.forwards.insert(
            id,
            PendingForward {
                request: request.id,
                key: request.key,
                policy: request.policy,
                cost: request.cost,
                adjustment: None,
                deadline,
                owner,
            },
        );
        debug_assert!(
            self.forwards.len() <= self.config.pending_forwards_max,
            "pending forwards are bounded"
        );
        self.stats.forwarded += 1;
        if self.forwards.queue(owner, check) >= self.config.forward_batch_len_max {
            let batch = self.forwards.take_queued(owner);
            self.send_forwards(owner, batch, now);
        } else {
            let at = self.forward_flush_at(owner, now);
            self.timers.set_earliest(Timer::FlushForwards, at);
        }
        CheckOutcome::Pending
    }

    /// When the forwards queued for `owner` leave, unless its answer releases them earlier:
    /// after `forward_wait`, and not before the hold of the batch in flight to it ends.
    fn forward_flush_at(&self, owner: NodeId, now: Instant) -> Instant {
        let waited = now.add_duration(self.config.forward_wait);
        self.forwards.held_until(owner).map_or(waited, |until| until.max(waited))
    }

    /// How long forwards to `owner` are held back after a batch went to it: two round trips (its
    /// answer is expected within one), at most `FORWARD_HOLD_MAX_NANOS`, which is also the hold
    /// before a round trip to it was measured.
    fn forward_hold_nanos(&self, owner: NodeId) -> u64 {
        self.peers
            .srtt_nanos(owner)
            .map_or(FORWARD_HOLD_MAX_NANOS, |srtt| srtt.saturating_mul(2).min(FORWARD_HOLD_MAX_NANOS))
    }

    /// How long a check forwarded to `owner` waits for its answer: a round trip and two
    /// retransmission timeouts (a lost forward or a lost answer is survived), bounded by
    /// `forward_timeout` (also the wait before any round trip to `owner` was measured).
    pub(super) fn forward_wait_nanos(&self, owner: NodeId) -> u64 {
        let bound = duration_nanos(self.config.forward_timeout);
        match (self.peers.srtt_nanos(owner), self.peers.rto_nanos(owner)) {
            (Some(srtt), Some(rto)) => {
                let wait = srtt.saturating_add(rto.saturating_mul(2)).saturating_add(peers::ACK_DELAY_NANOS);
                wait.max(FORWARD_WAIT_MIN_NANOS).min(bound)
            }
            _ => bound,
        }
    }

    /// Sends the queued forwards of every owner whose hold is over; the others wait for their
    /// owner's answer or the end of their hold.
    pub(super) fn flush_forwards(&mut self, now: Instant) {
        self.timers.stop(Timer::FlushForwards);
        self.forwards.end_holds(now);
        for (owner, batch) in self.forwards.take_outbox() {
            match self.forwards.held_until(owner) {
                Some(until) => {
                    self.timers.set_earliest(Timer::FlushForwards, until);
                    self.forwards.requeue(owner, batch);
                }
                None => self.send_forwards(owner, batch, now),
            }
        }
    }

    /// Sends a batch of forwards to `owner` and holds the next ones back until it answers
    /// (group commit): under load the checks that arrive during a round trip leave together, so
    /// batches grow with the load while a lone check leaves at once.
    pub(super) fn send_forwards(&mut self, owner: NodeId, batch: Vec<ForwardCheck>, now: Instant) {
        self.stats.forward_batches += 1;
        self.forwards.hold(owner, now.add_nanos(self.forward_hold_nanos(owner)));
        self.send(owner, Body { forward: batch, ..Body::default() }, now);
    }

    /// `owner` answered forwards: the forwards held back for it leave now.
    fn release_forwards(&mut self, owner: NodeId, now: Instant) {
        if !self.forwards.release(owner) {
            return;
        }
        if let Some(batch) = self.forwards.remove_queued(owner) {
            self.send_forwards(owner, batch, now);
        }
    }

    pub(super) fn on_decided(&mut self, from: NodeId, decided: Vec<Decided>, now: Instant) {
        if !decided.is_empty() {
            self.release_forwards(from, now);
        }
        for answer in decided {
            // An answer after the timeout finds nothing: the fallback decided already. An answer
            // from another node than the check went to is not trusted.
            let Some(pending) = self.forwards.get(answer.id) else {
                self.on_late_answer(from, &answer, now);
                continue;
            };
            if pending.owner != from {
                self.stats.items_refused += 1;
                continue;
            }
            let Some(pending) = self.forwards.remove(answer.id) else { continue };
            let decision: Decision = answer.decision.into();
            if let Some(retry) = decision.retry_after.filter(|_| !decision.allowed) {
                self.refuse_until(&pending, duration_nanos(retry), now);
            }
            if pending.adjustment.is_none() {
                self.audit_answered(pending.key, &pending.policy, now, pending.cost, decision.allowed);
            }
            self.events.push_back(Event::Decided { id: pending.request, decision });
        }
    }

    /// A late answer to a check the fallback decided: if the owner admitted it, the owner debited
    /// hits whose admission never reached the client (or that the fallback's `uncovered` report
    /// debits again) — not yet reported uncovered hits are taken back, the rest refunded.
    fn on_late_answer(&mut self, from: NodeId, answer: &Decided, now: Instant) {
        let Some(late) = self.forwards.take_timed_out(answer.id) else { return };
        if late.owner != from || !answer.decision.allowed || late.cost == 0 {
            return;
        }
        let changed = self.keys.update(late.key, &late.policy.limit, |_, meta| {
            let follower = meta.follower.as_mut()?;
            if late.admitted && follower.uncovered >= late.cost {
                follower.uncovered -= late.cost;
            } else {
                follower.refunded = follower.refunded.saturating_add(late.cost);
            }
            Some(())
        });
        if changed.flatten().is_some() {
            self.dirty.insert(late.key);
        }
        self.forget_timed_out(now);
    }

    /// Drops the records of timed-out forwards whose answers are no longer expected.
    pub(super) fn forget_timed_out(&mut self, now: Instant) {
        self.forwards.forget_timed_out(now);
    }

    /// A refusal without asking, while the owner said the key has no room (see `refuse_until`).
    fn refused_here(&mut self, request: &CheckRequest, now: Instant) -> Option<Decision> {
        let follower = self.keys.extra(request.key)?.follower.as_ref()?;
        if request.cost == 0 || request.cost < follower.over_cost || follower.over_until <= now {
            return None;
        }
        let retry = follower.over_until.nanos_since(now);
        self.keys.update(request.key, &request.policy.limit, |_, meta| {
            if let Some(follower) = meta.follower.as_mut() {
                follower.refused_unasked = follower.refused_unasked.saturating_add(request.cost);
            }
        });
        self.audit_answered(request.key, &request.policy, now, request.cost, false);
        let decision = Decision::admitted_blind(request.policy.limit.reported_limit());
        Some(Decision { remaining: 0, ..decision }.refused_for(Some(retry)))
    }

    /// The hits refused here unasked since the last forward of `key` (the next forward carries them).
    fn take_refused_unasked(&mut self, key: KeyHash) -> u64 {
        let Some(meta) = self.keys.extra(key) else { return 0 };
        if meta.follower.as_ref().is_none_or(|f| f.refused_unasked == 0) {
            return 0;
        }
        let limit = meta.policy.limit.clone();
        self.keys
            .update(key, &limit, |_, meta| {
                meta.follower.as_mut().map_or(0, |f| core::mem::take(&mut f.refused_unasked))
            })
            .unwrap_or(0)
    }

    /// The owner has no room for `retry_nanos`: refuse the key locally meanwhile, without asking
    /// — until one round trip before then, so that the next check forwarded arrives when the room
    /// does (and competes with the owner's own checks on equal terms).
    ///
    /// Not for a concurrency limit: its refusal's retry is when the held leases expire, and a
    /// release (through any node, this one never hears of it) frees room any time before.
    fn refuse_until(&mut self, pending: &PendingForward, retry_nanos: u64, now: Instant) {
        if pending.policy.limit.algorithm() == Algorithm::Concurrency {
            return;
        }
        let rtt = self.peers.srtt_nanos(pending.owner).unwrap_or(0);
        let Some(blind_nanos) = retry_nanos.checked_sub(rtt).filter(|&n| n > 0) else { return };
        let until = now.add_nanos(blind_nanos);
        let init = || KeyMeta::new(pending.policy.clone(), false);
        let owner = pending.owner;
        let rng = &mut self.rng;
        self.keys.upsert_with(pending.key, &pending.policy.limit, now, init, |_, meta| {
            let follower = meta.follower();
            if follower.owner != Some(owner) {
                follower.follow(owner, keys::new_epoch(rng));
            }
            // A larger cost never fits sooner than a smaller one: the refusal of the smallest
            // cost seen is the one that holds for every cost at or above it.
            // (A refund's or charge's answer is the view of a cost-1 check.)
            let cost = if pending.adjustment.is_some() { 1 } else { pending.cost.max(1) };
            if follower.over_until <= now || cost < follower.over_cost {
                follower.over_until = until;
                follower.over_cost = cost;
            } else if cost == follower.over_cost {
                follower.over_until = follower.over_until.max(until);
            }
        });
    }

    pub(super) fn expire_forwards(&mut self, now: Instant) {
        while let Some((id, pending)) = self.forwards.pop_expired(now) {
            self.stats.forward_timeouts += 1;
            let owner = self.ring.owner(pending.key).unwrap_or(self.id);
            let decision = if let Some(adjustment) = pending.adjustment {
                self.adjust_anywhere(owner, &pending.policy, pending.key, adjustment, pending.cost, now)
            } else if owner == self.id {
                self.decide_as_owner(&pending.policy, pending.key, pending.cost, now)
            } else {
                let decision =
                    self.decide_by_fallback_now(owner, &pending.policy, pending.key, pending.cost, now);
                self.remember_timed_out(id, &pending, decision.allowed, now);
                decision
            };
            self.events.push_back(Event::Decided { id: pending.request, decision });
        }
        self.forget_timed_out(now);
    }

    /// Keeps a timed-out forward (bounded like the pending ones) for as long as its answer can
    /// still come: a participant's release period.
    fn remember_timed_out(&mut self, id: u64, pending: &PendingForward, admitted: bool, now: Instant) {
        let late = TimedOut {
            key: pending.key,
            policy: pending.policy.clone(),
            cost: pending.cost,
            owner: pending.owner,
            admitted,
            until: now.add_nanos(self.release_nanos()),
        };
        self.forwards.remember_timed_out(id, late, self.config.pending_forwards_max);
    }
}
