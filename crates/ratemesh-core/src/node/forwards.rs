//! The node's forwarded checks as one type (like quinn-proto's and foca's `Peers`): the checks
//! waiting for their owner's answer with their deadlines, the ones the fallback decided whose
//! late answer may still come, and the outbox of forwards held back per owner (group commit).
//! What is done with them is `exact.rs` (checks) and `adjust.rs` (refunds and charges); this
//! type keeps their bookkeeping consistent: every pending forward has exactly one deadline.

use crate::prelude::*;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::sync::Arc;

use super::{Adjustment, NodeId, Policy, RequestId};
use crate::key::KeyHash;
use crate::time::Instant;
use crate::wire::ForwardCheck;

/// A check forwarded to an owner, waiting for its decision.
#[derive(Debug)]
pub(super) struct PendingForward {
    pub(super) request: RequestId,
    pub(super) key: KeyHash,
    pub(super) policy: Arc<Policy>,
    pub(super) cost: u64,
    /// A refund or charge of `cost` hits rather than a check.
    pub(super) adjustment: Option<Adjustment>,
    pub(super) deadline: Instant,
    /// The owner it went to: only its answer counts.
    pub(super) owner: NodeId,
}

/// A forwarded check decided by the fallback after its wait, whose late answer may still come.
#[derive(Debug)]
pub(super) struct TimedOut {
    pub(super) key: KeyHash,
    pub(super) policy: Arc<Policy>,
    pub(super) cost: u64,
    pub(super) owner: NodeId,
    /// Whether the fallback admitted it (its hits are reported as uncovered).
    pub(super) admitted: bool,
    /// Forgotten after this.
    pub(super) until: Instant,
}

/// The forwarded checks of a node (see the module documentation).
#[derive(Debug)]
pub(super) struct Forwards {
    /// Forwards waiting for their answer, by id.
    pending: BTreeMap<u64, PendingForward>,
    /// `(deadline, id)` of every pending forward.
    deadlines: BTreeSet<(Instant, u64)>,
    /// Forwards that timed out and were decided by the fallback, by id, kept for a while: a late
    /// answer that admitted one is refunded to the owner.
    timed_out: BTreeMap<u64, TimedOut>,
    /// The id of the next forward (ids are never reused: 1, 2, ...).
    next_id: u64,
    /// Forwards queued per owner, not sent yet.
    outbox: BTreeMap<NodeId, Vec<ForwardCheck>>,
    /// Per owner: a forward batch sent to it is unanswered; until then (or its answer) new
    /// forwards to it wait in the outbox (`exact::send_forwards`).
    held_until: BTreeMap<NodeId, Instant>,
}

impl Forwards {
    pub(super) fn new() -> Forwards {
        Forwards {
            pending: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            timed_out: BTreeMap::new(),
            next_id: 1,
            outbox: BTreeMap::new(),
            held_until: BTreeMap::new(),
        }
    }

    // --- Pending forwards and their deadlines -----------------------------------------------------

    /// How many forwards wait for their answer.
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Takes the id of a new forward.
    pub(super) fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Waits for the answer to forward `id` until its deadline.
    pub(super) fn insert(&mut self, id: u64, pending: PendingForward) {
        debug_assert!(id < self.next_id, "forward ids come from next_id");
        let fresh = self.deadlines.insert((pending.deadline, id));
        debug_assert!(fresh, "a forward id is used once");
        let before = self.pending.insert(id, pending);
        debug_assert!(before.is_none(), "a forward id is used once");
    }

    /// Forward `id`, if it still waits.
    pub(super) fn get(&self, id: u64) -> Option<&PendingForward> {
        self.pending.get(&id)
    }

    /// Stops waiting for forward `id` (answered), with its deadline.
    pub(super) fn remove(&mut self, id: u64) -> Option<PendingForward> {
        let pending = self.pending.remove(&id)?;
        let had = self.deadlines.remove(&(pending.deadline, id));
        debug_assert!(had, "every pending forward has its deadline");
        Some(pending)
    }

    /// The earliest deadline of a pending forward.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(deadline, _)| deadline)
    }

    /// Takes the forward whose deadline is earliest, if it is at or before `now`.
    pub(super) fn pop_expired(&mut self, now: Instant) -> Option<(u64, PendingForward)> {
        loop {
            let &(deadline, id) = self.deadlines.first()?;
            if deadline > now {
                return None;
            }
            self.deadlines.pop_first();
            // Every deadline has its forward (`insert`, `remove`): the loop ends at the first.
            if let Some(pending) = self.pending.remove(&id) {
                return Some((id, pending));
            }
        }
    }

    /// The pending forwards, by id.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (&u64, &PendingForward)> {
        self.pending.iter()
    }

    /// Every pending forward has exactly one deadline: as many deadlines as forwards (always
    /// checked), each its own (in debug builds).
    pub(super) fn assert_deadlines(&self) {
        assert_eq!(self.pending.len(), self.deadlines.len(), "forwards and their deadlines");
        debug_assert!(self.pending.iter().all(|(&id, p)| self.deadlines.contains(&(p.deadline, id))));
    }

    // --- Forwards decided by the fallback -----------------------------------------------------

    /// Keeps a timed-out forward, dropping the oldest when `len_max` are kept.
    pub(super) fn remember_timed_out(&mut self, id: u64, late: TimedOut, len_max: usize) {
        if self.timed_out.len() >= len_max.max(1) {
            self.timed_out.pop_first();
        }
        self.timed_out.insert(id, late);
        debug_assert!(self.timed_out.len() <= len_max.max(1), "timed-out forwards are bounded");
    }

    /// Takes the record of timed-out forward `id`, if it is kept.
    pub(super) fn take_timed_out(&mut self, id: u64) -> Option<TimedOut> {
        self.timed_out.remove(&id)
    }

    /// Drops the records of timed-out forwards whose answers are no longer expected.
    pub(super) fn forget_timed_out(&mut self, now: Instant) {
        while self.timed_out.first_key_value().is_some_and(|(_, late)| late.until <= now) {
            self.timed_out.pop_first();
        }
    }

    // --- The outbox and its holds (group commit) -------------------------------------------------

    /// Queues `check` for `owner`; returns how many are queued for it now.
    pub(super) fn queue(&mut self, owner: NodeId, check: ForwardCheck) -> usize {
        let batch = self.outbox.entry(owner).or_default();
        batch.push(check);
        batch.len()
    }

    /// Takes the forwards queued for `owner`.
    pub(super) fn take_queued(&mut self, owner: NodeId) -> Vec<ForwardCheck> {
        self.outbox.get_mut(&owner).map(core::mem::take).unwrap_or_default()
    }

    /// Takes every owner's queued forwards (nonempty batches only).
    pub(super) fn take_outbox(&mut self) -> Vec<(NodeId, Vec<ForwardCheck>)> {
        core::mem::take(&mut self.outbox).into_iter().filter(|(_, batch)| !batch.is_empty()).collect()
    }

    /// Puts back forwards queued for `owner` (still held).
    pub(super) fn requeue(&mut self, owner: NodeId, batch: Vec<ForwardCheck>) {
        self.outbox.insert(owner, batch);
    }

    /// Removes what is queued for `owner`, if anything.
    pub(super) fn remove_queued(&mut self, owner: NodeId) -> Option<Vec<ForwardCheck>> {
        self.outbox.remove(&owner).filter(|batch| !batch.is_empty())
    }

    /// Whether forwards wait in the outbox.
    pub(super) fn any_queued(&self) -> bool {
        self.outbox.values().any(|batch| !batch.is_empty())
    }

    /// Until when new forwards to `owner` are held back, if they are.
    pub(super) fn held_until(&self, owner: NodeId) -> Option<Instant> {
        self.held_until.get(&owner).copied()
    }

    /// Holds new forwards to `owner` back until `until` (a batch went to it).
    pub(super) fn hold(&mut self, owner: NodeId, until: Instant) {
        self.held_until.insert(owner, until);
    }

    /// Ends the hold of `owner` (it answered); whether it was held.
    pub(super) fn release(&mut self, owner: NodeId) -> bool {
        self.held_until.remove(&owner).is_some()
    }

    /// Ends the holds that are over at `now`.
    pub(super) fn end_holds(&mut self, now: Instant) {
        self.held_until.retain(|_, &mut until| until > now);
    }
}
