//! Refunds and charges: hits returned to a key's bucket, or applied to it unconditionally, at the
//! key's owner in either mode (sent there like a forwarded check, answered by the decision a
//! cost-1 check would get afterwards).
//!
//! Without the owner (unreachable, or no answer in time) a charge is counted like hits a fallback
//! admitted: reported to the owner when it is reachable and debited then (a charge whose answer
//! was lost after the owner applied it counts twice: conservative). A refund is dropped then:
//! nobody knows whether the owner applied it, and returning it twice would over-admit.

use crate::prelude::*;
use alloc::sync::Arc;

use super::*;
use crate::wire::{Adjust, AdjustKind, WireMode};

impl Node {
    /// Applies a client's refund or charge at the key's owner: decided now when this node owns
    /// the key (or cannot reach its owner), else sent to the owner and decided later
    /// ([`Event::Decided`]). The decision says whether a cost-1 check would pass afterwards.
    pub fn handle_adjust(&mut self, now: Instant, request: AdjustRequest) -> CheckOutcome {
        let outcome = self.adjust(now, request);
        self.end_input(now);
        outcome
    }

    fn adjust(&mut self, now: Instant, request: AdjustRequest) -> CheckOutcome {
        if !self.is_serving(now) {
            return CheckOutcome::Unavailable;
        }
        let AdjustRequest { id: request_id, key, policy, adjustment, hits } = request;
        let owner = self.ring.owner(key).unwrap_or(self.id);
        if owner == self.id {
            return CheckOutcome::Decided(self.adjust_as_owner(&policy, key, adjustment, hits, now));
        }
        if !self.peers.reachable(owner, now) || self.forwards.len() >= self.config.pending_forwards_max {
            return CheckOutcome::Decided(self.adjust_here(owner, &policy, key, adjustment, hits, now));
        }
        if adjustment == Adjustment::Refund {
            // This node's own local refusal ends: the hits it returns are there to take.
            self.update_key(key, |_, meta| {
                if let Some(follower) = meta.follower.as_mut() {
                    follower.over_until = Instant::ZERO;
                }
            });
        }
        let id = self.forwards.next_id();
        let deadline = now.add_nanos(self.forward_wait_nanos(owner));
        let item = Adjust {
            id,
            key: key.0,
            limit: LimitWire::from_limit(&policy.limit),
            kind: match adjustment {
                Adjustment::Refund => AdjustKind::Refund,
                Adjustment::Charge => AdjustKind::Charge,
            },
            hits,
            mode: match effective_mode(&policy) {
                api::Mode::Exact => WireMode::Exact,
                api::Mode::Approximate => WireMode::Approximate,
            },
        };
        let pending = PendingForward {
            request: request_id,
            key,
            policy,
            cost: hits,
            adjustment: Some(adjustment),
            deadline,
            owner,
        };
        self.forwards.insert(id, pending);
        debug_assert!(
            self.forwards.len() <= self.config.pending_forwards_max,
            "pending forwards are bounded"
        );
        self.send(owner, Body { adjust: vec![item], ..Body::default() }, now);
        CheckOutcome::Pending
    }

    /// Applies an adjustment where `owner` (in this node's view) decides: here or, without it,
    /// as [`Node::adjust_here`] says.
    pub(super) fn adjust_anywhere(
        &mut self,
        owner: NodeId,
        policy: &Arc<Policy>,
        key: KeyHash,
        adjustment: Adjustment,
        hits: u64,
        now: Instant,
    ) -> Decision {
        match owner == self.id {
            true => self.adjust_as_owner(policy, key, adjustment, hits, now),
            false => self.adjust_here(owner, policy, key, adjustment, hits, now),
        }
    }

    /// Applies an adjustment to the authoritative bucket. Allowances out stay counted (held)
    /// first, so a refund never lifts the bucket and the allowances together above the capacity.
    fn adjust_as_owner(
        &mut self,
        policy: &Arc<Policy>,
        key: KeyHash,
        adjustment: Adjustment,
        hits: u64,
        now: Instant,
    ) -> Decision {
        let scaled = self.owner_limit(policy, key, now);
        let limit = scaled.clone().unwrap_or_else(|| policy.limit.clone());
        let rng = &mut self.rng;
        let decision = self.keys.upsert_with(
            key,
            &limit,
            now,
            || KeyMeta::new(policy.clone(), true),
            |bucket, meta| {
                meta.owned = true;
                owner::hold_outstanding(bucket, &limit, meta, now);
                match adjustment {
                    Adjustment::Refund => bucket.refund(&limit, hits, now),
                    Adjustment::Charge => bucket.force(&limit, hits, now),
                }
                match scaled.is_some() {
                    true => bucket.check(&limit, 0, now, rng),
                    false => owner::zero_share(policy),
                }
            },
        );
        if hits > 0 && self.replicates() {
            self.replicas_due.insert(key);
        }
        decision
    }

    /// Without the owner: a charge is counted as uncovered hits (reported and debited later) and
    /// in this node's view of the bucket; a refund is dropped (see the module documentation).
    fn adjust_here(
        &mut self,
        owner: NodeId,
        policy: &Arc<Policy>,
        key: KeyHash,
        adjustment: Adjustment,
        hits: u64,
        now: Instant,
    ) -> Decision {
        let rng = &mut self.rng;
        let limit = &policy.limit;
        let init = || KeyMeta::new(policy.clone(), false);
        let decision = self.keys.upsert_with(key, limit, now, init, |bucket, meta| {
            let follower = meta.follower();
            if follower.owner != Some(owner) {
                follower.follow(owner, keys::new_epoch(rng));
            }
            if adjustment == Adjustment::Charge {
                follower.uncovered = follower.uncovered.saturating_add(hits);
                bucket.force(limit, hits, now);
            }
            bucket.peek(limit, 0, now)
        });
        self.dirty.insert(key);
        decision
    }

    /// Applies the adjustments `from` sent and answers each.
    pub(super) fn on_adjust(&mut self, from: NodeId, items: Vec<Adjust>, now: Instant) {
        let mut decided = Vec::with_capacity(items.len());
        for item in items {
            let Ok(limit) = item.limit.to_limit() else {
                self.stats.items_refused += 1;
                continue;
            };
            let key = KeyHash(item.key);
            let mode = match item.mode {
                WireMode::Exact => api::Mode::Exact,
                WireMode::Approximate => api::Mode::Approximate,
            };
            // Adjustments are not admissions: not audited. They carry no terms between regions:
            // the key's own (from its checks) keep its part.
            let region = self.keys.extra(key).map_or_else(api::PolicyRegion::default, |m| m.policy.region);
            let policy = handoff::wire_policy(&limit, mode, region);
            let adjustment = match item.kind {
                AdjustKind::Refund => Adjustment::Refund,
                AdjustKind::Charge => Adjustment::Charge,
            };
            let owner = self.ring.owner(key).unwrap_or(self.id);
            let decision = self.adjust_anywhere(owner, &policy, key, adjustment, item.hits, now);
            decided.push(Decided { id: item.id, decision: decision.into() });
        }
        if !decided.is_empty() {
            self.send(from, Body { decided, ..Body::default() }, now);
        }
    }
}
