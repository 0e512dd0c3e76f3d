//! Ownership moves: handoffs of keys whose owner changed, replicas to ring successors, and the
//! joining of either into the receiver's state (conservative and idempotent).

use crate::prelude::*;
use alloc::collections::BTreeMap;
use alloc::sync::Arc;

use super::*;

/// How many members a leaving node hands each key to (see `Node::handoff_targets`): the handoff
/// survives two other members leaving at the same moment without knowing of each other.
const LEAVE_HANDOFF_OWNERS: usize = 3;

impl Node {
    /// Joins state from a key's (previous) owner: a handoff when ownership moved, or a replica
    /// kept in case the owner fails. Joining is conservative and idempotent either way.
    ///
    /// A handoff of a key this node does not own (it handed its keys over already: it is
    /// leaving, or its view moved on) is passed on to the owner in its view, joined with what it
    /// holds — unless that owner is the sender — so that when several members leave at once a
    /// state handed to one that has left already still reaches the key's owner. A key is passed
    /// on at most once per sync interval: views that disagree for a moment (a leaving member
    /// takes a later one for the owner, which takes it back) could otherwise pass a state around
    /// a cycle at network speed until they agree.
    pub(super) fn on_states(&mut self, from: NodeId, states: Vec<KeyState>, replica: bool, now: Instant) {
        let mut pass_on: BTreeMap<NodeId, Vec<KeyState>> = BTreeMap::new();
        for state in states {
            let Ok(limit) = state.limit.to_limit() else {
                self.stats.items_refused += 1;
                continue;
            };
            let key = KeyHash(state.key);
            let owned = self.ring.owner(key) == Some(self.id);
            let policy = state_policy(&limit, state.region);
            let joined = self.keys.upsert_with(
                key,
                &limit,
                now,
                || KeyMeta::new(policy, owned),
                |bucket, meta| {
                    meta.born = None;
                    bucket.join(&limit, state.state.into(), now)
                },
            );
            match (joined, replica) {
                (Ok(()), false) => self.stats.handoffs_received += 1,
                (Ok(()), true) => self.stats.replicas_received += 1,
                (Err(_), _) => self.stats.items_refused += 1,
            }
            if owned && self.replicates() {
                self.replicas_due.insert(key);
            }
            let Some(owner) = self.handoff_owner(key, from).filter(|_| !replica && !owned) else { continue };
            if self.passed_on.len() < self.config.store.keys_max && self.passed_on.insert(key) {
                let exported = self.keys.update(key, &limit, |bucket, _| bucket.export(now));
                if let Some(exported) = exported {
                    let limit = LimitWire::from_limit(&limit);
                    self.stats.handoffs_sent += 1;
                    pass_on.entry(owner).or_default().push(KeyState {
                        key: key.0,
                        limit,
                        state: exported.into(),
                        region: state.region,
                    });
                }
            }
        }
        self.send_handoffs(pass_on, now);
    }

    /// Where a handoff of `key` from `from` goes on to: its owner in this node's view, unless that
    /// is this node (it keeps it). A handoff's sender gave the key up (it is leaving, or no longer
    /// owns it), so where this view still has the sender as the owner, the key is the sender's
    /// successor's: members leaving at once hand keys to each other before their views agree.
    fn handoff_owner(&self, key: KeyHash, from: NodeId) -> Option<NodeId> {
        let owner = match self.ring.owner(key) {
            Some(owner) if owner == from => self.ring.successor(key),
            owner => owner,
        };
        owner.filter(|&owner| owner != self.id && owner != from)
    }

    /// Where a key this node gave up goes: its owner; while this node leaves, its owner and the
    /// next members clockwise other than itself ([`LEAVE_HANDOFF_OWNERS`] in all). Members leaving at the same
    /// time do not know of each other's leave before they hand over: the owner in this view may
    /// be leaving too and gone before it passes the key on, but the first member clockwise that
    /// stays is the key's owner once the leaves are known, and it is among these unless more
    /// members than that leave at once (joining is idempotent: the extra copies cost bytes only).
    fn handoff_targets(&self, key: KeyHash, owner: NodeId) -> Vec<NodeId> {
        match self.leave {
            Some(_) => {
                let mut targets = self.ring.owners(key, LEAVE_HANDOFF_OWNERS + 1);
                targets.retain(|&target| target != self.id);
                targets.truncate(LEAVE_HANDOFF_OWNERS);
                targets
            }
            None => vec![owner],
        }
    }

    /// Sends key states to their owners as handoffs, batched (the callers count the keys).
    pub(super) fn send_handoffs(&mut self, handoffs: BTreeMap<NodeId, Vec<KeyState>>, now: Instant) {
        for (owner, states) in handoffs {
            for chunk in states.chunks(self.config.sync_batch_len_max.max(1)) {
                self.send(owner, Body { handoff: chunk.to_vec(), ..Body::default() }, now);
            }
        }
    }

    /// `key`'s state for its ring successor (so that the owner's crash loses at most one sync
    /// interval), if it is still owned here and has one.
    pub(super) fn key_replica(&mut self, key: KeyHash, now: Instant) -> Option<(NodeId, KeyState)> {
        let successor = self.ring.successor(key).filter(|&s| s != self.id)?;
        let meta = self.keys.extra(key).filter(|meta| meta.owned)?;
        let (limit, region) = (LimitWire::from_limit(&meta.policy.limit), meta.policy.region);
        let state = self.keys.export(key, now)?;
        Some((successor, KeyState { key: key.0, limit, state: state.into(), region }))
    }

    /// Sends `states` (at most `sync_batch_len_max`) to `successor` as replicas.
    pub(super) fn send_replicas_to(&mut self, successor: NodeId, states: Vec<KeyState>, now: Instant) {
        if states.is_empty() {
            return;
        }
        self.stats.replicas_sent += states.len() as u64;
        self.send(successor, Body { replica: states, ..Body::default() }, now);
    }

    /// After a view change: hands keys this node owned and no longer owns to their new owners,
    /// and marks followed keys whose owner changed so their next report seeds the new owner;
    /// with `replicate_owned`, every key it still owns is due for replication. Returns the counts
    /// of keys moved (members are the caller's).
    pub(super) fn move_keys(&mut self, now: Instant, replicate_owned: bool) -> ViewChange {
        let mut change = ViewChange::default();
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
                    meta.own_contended_until = Instant::ZERO;
                    // A region's lease and a home's ledger are the owner's: the new owner reports
                    // afresh (and a new home owner rebuilds its ledger from the reports).
                    meta.region = None;
                    meta.home = None;
                    meta.follower().follow(owner, epoch);
                    return Some(KeyState {
                        key: key.0,
                        limit: LimitWire::from_limit(&meta.policy.limit),
                        state: bucket.export(now).into(),
                        region: meta.policy.region,
                    });
                }
                if !was_owned && owner == me {
                    // Becoming the owner: the last authoritative view is the starting point, hits
                    // admitted here without an allowance are debited at once, and an allowance
                    // held here (debited by the previous owner) goes back into the bucket, as a
                    // departing owner's own does: kept as the owner's own, it would be spent
                    // beside a bucket refilled meanwhile, and nothing refreshes a key nobody
                    // else shares.
                    if let Some(follower) = meta.follower.take() {
                        bucket.force(&meta.policy.limit, follower.uncovered, now);
                        bucket.refund(&meta.policy.limit, follower.allowance.live(now), now);
                    }
                    change.taken_over += 1;
                    return None;
                }
                if let Some(follower) = meta.follower.as_mut().filter(|f| f.owner != Some(owner)) {
                    follower.follow(owner, epoch);
                    follower.seed_pending = true;
                    change.refollowed += 1;
                }
                None
            });
            debug_assert!(
                self.keys.extra(key).is_none_or(|meta| meta.owned == (owner == me)),
                "after a view change the key table's owners are the ring's"
            );
            if replicate_owned && owner == me {
                self.replicas_due.insert(key);
            }
            if let Some(state) = moved.flatten() {
                self.stats.handoffs_sent += 1;
                change.handed_over += 1;
                for target in self.handoff_targets(key, owner) {
                    handoffs.entry(target).or_default().push(state.clone());
                }
                self.dirty.insert(key);
            }
        }
        self.send_handoffs(handoffs, now);
        change
    }
}

/// The policy a key's state is kept under when it arrives without a client's (a handoff, a
/// replica, a report, a snapshot read back): its limit in `mode`, local share, not audited (the
/// audit goes by the checks' policies), under the terms between regions it came with. A
/// client's next check brings the key's own policy.
pub(super) fn wire_policy(limit: &Limit, mode: api::Mode, region: api::PolicyRegion) -> Arc<Policy> {
    Arc::new(Policy { audit: api::Audit::Off, region, ..Policy::new(limit.clone(), mode) })
}

/// `policy` under `region`'s terms between regions (a key's stored policy taking the terms a
/// check or its home brought; its mode and audit stay).
pub(super) fn with_region(policy: &Policy, region: api::PolicyRegion) -> Arc<Policy> {
    Arc::new(Policy { region, ..policy.clone() })
}

/// [`wire_policy`] of a state: approximate.
pub(super) fn state_policy(limit: &Limit, region: api::PolicyRegion) -> Arc<Policy> {
    wire_policy(limit, api::Mode::Approximate, region)
}
