//! The sync round, run in slices.
//!
//! Once per interval a node reports its followed keys' news to their owners, renews its own
//! allowances of the keys it owns and replicates its changed keys to their successors: work for
//! every key that changed, which at a hundred thousand keys takes milliseconds. A driver holds
//! its lock around each input, so checks would wait behind the whole round. The round therefore
//! takes the keys due when it begins and visits them in slices of at most
//! [`NodeConfig::sync_slice_len_max`] keys, one slice per [`Node::handle_timeout`]; between
//! slices the node asks for its timer again at once (one nanosecond later) and the driver serves
//! whatever waited. Entries are batched per peer across slices, so a round sends the same frames
//! whether it ran in one slice or many.
//!
//! A round never spans a view change or a leave: both finish it first (in one go, like the rest
//! of their work), so every entry of a round was taken under one ring. Keys that change while a
//! round runs are due in the next one, which begins once the round in progress ended: a node that
//! cannot keep up with its rounds stretches its interval rather than running a whole round in one
//! input.

use crate::prelude::*;
use alloc::collections::BTreeMap;

use super::*;

/// A sync round in progress: the keys it has still to visit and the entries taken so far.
#[derive(Debug, Default)]
pub(super) struct SyncRound {
    /// Followed keys with news for their owners (the `dirty` set when the round began).
    reports: Vec<KeyHash>,
    /// Owned keys whose own allowance is due for renewal.
    own: Vec<KeyHash>,
    /// Owned keys changed since the last round, to replicate.
    replicas: Vec<KeyHash>,
    /// How many keys of the three lists, in that order, were visited.
    pub(super) visited: usize,
    /// Reports taken and not sent yet, per owner (each under `sync_batch_len_max`).
    report_batches: BTreeMap<NodeId, Vec<Report>>,
    /// Replicas taken and not sent yet, per successor (each under `sync_batch_len_max`).
    replica_batches: BTreeMap<NodeId, Vec<KeyState>>,
}

impl SyncRound {
    /// How many keys the round visits in all.
    pub(super) fn len(&self) -> usize {
        self.reports.len() + self.own.len() + self.replicas.len()
    }
}

impl Node {
    /// Begins a sync round at `now` (finishing one still running) and runs its first slice.
    pub(super) fn begin_round(&mut self, now: Instant) {
        self.finish_round(now);
        self.audit_round(now);
        // The sets are taken here: keys marked for the past epoch are due again (0 is no epoch).
        self.due_epoch = self.due_epoch.wrapping_add(1).max(1);
        let round = SyncRound {
            reports: core::mem::take(&mut self.dirty).into_iter().collect(),
            own: core::mem::take(&mut self.own_due).into_iter().collect(),
            replicas: core::mem::take(&mut self.replicas_due).into_iter().collect(),
            ..SyncRound::default()
        };
        self.round = Some(round);
        self.run_slice(now, self.config.sync_slice_len_max);
    }

    /// Reports every followed key's news at once (a leaving node giving its allowances back).
    pub(super) fn report_all_now(&mut self, now: Instant) {
        self.finish_round(now);
        let reports = core::mem::take(&mut self.dirty).into_iter().collect();
        self.round = Some(SyncRound { reports, ..SyncRound::default() });
        self.finish_round(now);
    }

    /// Runs what is left of the round in progress, if any, at once.
    pub(super) fn finish_round(&mut self, now: Instant) {
        self.run_slice(now, usize::MAX);
    }

    /// Visits up to `len_max` more keys of the round in progress; sends what is left of its
    /// batches when it is done, else asks for the next slice.
    pub(super) fn run_slice(&mut self, now: Instant, len_max: usize) {
        let Some(mut round) = self.round.take() else { return };
        self.timers.stop(Timer::SyncSlice);
        let end = round.visited.saturating_add(len_max.max(1)).min(round.len());
        let sizing = self.sizing_context(self.id, now);
        let (reports, own) = (round.reports.len(), round.own.len());
        for index in round.visited..end {
            if index < reports {
                self.take_key_report(round.reports[index], now, &mut round.report_batches);
            } else if index < reports + own {
                self.refresh_own_allowance(round.own[index - reports], &sizing);
            } else {
                self.take_replica(round.replicas[index - reports - own], now, &mut round.replica_batches);
            }
        }
        round.visited = end;
        debug_assert!(round.visited <= round.len(), "a round visits each of its keys once");
        if round.visited < round.len() {
            self.timers.set(Timer::SyncSlice, now.add_nanos(1));
            self.round = Some(round);
            return;
        }
        for (owner, reports) in round.report_batches {
            self.send_reports_to(owner, reports, now);
        }
        for (successor, states) in round.replica_batches {
            self.send_replicas_to(successor, states, now);
        }
        // With the round's frames: audit pieces ride them (`audit.rs`).
        self.audit_send(now);
        // After the round's sends, as every round: a key whose replica was due goes out before
        // the sweep may drop it as fresh.
        self.keys.sweep(now);
    }

    /// Takes `key`'s report, if it has news for its owner, into `batches`; a full batch is sent.
    fn take_key_report(&mut self, key: KeyHash, now: Instant, batches: &mut BTreeMap<NodeId, Vec<Report>>) {
        let Some((owner, report)) = self.key_report(key, now) else { return };
        if let Some(full) = push_batched(batches, owner, report, self.config.sync_batch_len_max) {
            self.send_reports_to(owner, full, now);
        }
    }

    /// Takes `key`'s replica, if it has a successor, into `batches`; a full batch is sent.
    fn take_replica(&mut self, key: KeyHash, now: Instant, batches: &mut BTreeMap<NodeId, Vec<KeyState>>) {
        let Some((successor, state)) = self.key_replica(key, now) else { return };
        if let Some(full) = push_batched(batches, successor, state, self.config.sync_batch_len_max) {
            self.send_replicas_to(successor, full, now);
        }
    }
}

/// Adds `entry` to the batch for `to`; returns the batch, taken out, once it holds `len_max`.
fn push_batched<T>(
    batches: &mut BTreeMap<NodeId, Vec<T>>,
    to: NodeId,
    entry: T,
    len_max: usize,
) -> Option<Vec<T>> {
    let batch = batches.entry(to).or_default();
    batch.push(entry);
    (batch.len() >= len_max.max(1)).then(|| core::mem::take(batch))
}
