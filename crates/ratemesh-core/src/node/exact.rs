//! Exact mode: checks forwarded to the owner in batches, answered later, or decided by the
//! fallback when the owner does not answer in time.

use std::sync::Arc;

use super::*;

/// A check forwarded to an owner, waiting for its decision.
#[derive(Debug)]
pub(super) struct PendingForward {
    pub(super) request: RequestId,
    pub(super) key: KeyHash,
    pub(super) policy: Arc<Policy>,
    pub(super) cost: u64,
    pub(super) deadline: Instant,
}

impl Node {
    pub(super) fn forward(&mut self, owner: NodeId, request: CheckRequest, now: Instant) -> CheckOutcome {
        if !self.peers.reachable(owner, now) || self.pending.len() >= self.config.pending_forwards_max {
            let (decision, _) =
                self.decide_as_follower(owner, &request.policy, request.key, request.cost, now);
            return CheckOutcome::Decided(decision);
        }
        let id = self.next_forward_id;
        self.next_forward_id += 1;
        let check = ForwardCheck {
            id,
            key: request.key.0,
            limit: LimitWire::from_limit(&request.policy.limit),
            cost: request.cost,
        };
        let deadline = now.add_duration(self.config.forward_timeout);
        self.pending.insert(
            id,
            PendingForward {
                request: request.id,
                key: request.key,
                policy: request.policy,
                cost: request.cost,
                deadline,
            },
        );
        self.stats.forwarded += 1;
        let batch = self.outbox.entry(owner).or_default();
        batch.push(check);
        if batch.len() >= self.config.forward_batch_len_max {
            let batch = std::mem::take(batch);
            self.send_forwards(owner, batch, now);
        } else if self.flush_at.is_none() {
            self.flush_at = Some(now.add_duration(self.config.forward_wait));
        }
        CheckOutcome::Pending
    }

    pub(super) fn flush_forwards(&mut self, now: Instant) {
        self.flush_at = None;
        let outbox = std::mem::take(&mut self.outbox);
        for (owner, batch) in outbox.into_iter().filter(|(_, b)| !b.is_empty()) {
            self.send_forwards(owner, batch, now);
        }
    }

    pub(super) fn send_forwards(&mut self, owner: NodeId, batch: Vec<ForwardCheck>, now: Instant) {
        self.stats.forward_batches += 1;
        self.send(owner, Body::Forward(batch), now);
    }

    pub(super) fn on_decided(&mut self, decided: Vec<Decided>, now: Instant) {
        for answer in decided {
            // An answer after the timeout finds nothing: the fallback decided already.
            let Some(pending) = self.pending.remove(&answer.id) else { continue };
            let decision: Decision = answer.decision.into();
            if let Some(retry) = decision.retry_after.filter(|_| !decision.allowed) {
                // The owner has no room until then: followers refuse locally, without asking.
                self.update_key(pending.key, |_, meta| {
                    if let Some(follower) = meta.follower.as_mut() {
                        follower.over_until = follower.over_until.max(now.add_duration(retry));
                    }
                });
            }
            self.events.push_back(Event::Decided { id: pending.request, decision });
        }
    }

    pub(super) fn expire_forwards(&mut self, now: Instant) {
        while let Some(entry) = self.pending.first_entry() {
            if entry.get().deadline > now {
                break;
            }
            let pending = entry.remove();
            self.stats.forward_timeouts += 1;
            let owner = self.ring.owner(pending.key).unwrap_or(self.id);
            let decision = if owner == self.id {
                self.decide_as_owner(&pending.policy, pending.key, pending.cost, now)
            } else {
                self.decide_by_fallback_now(owner, &pending.policy, pending.key, pending.cost, now)
            };
            self.events.push_back(Event::Decided { id: pending.request, decision });
        }
    }
}
