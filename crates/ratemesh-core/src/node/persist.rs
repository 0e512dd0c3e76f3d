//! Durable state: what a node keeps across a restart of the whole cluster, and how it takes it
//! back. The core does no IO: [`Node::durable_keys`] hands the driver the state worth writing,
//! [`Node::restore`] takes back what the driver read, and the driver stores the bytes (the
//! library's snapshot file).
//!
//! - **What is kept:** every tracked key whose bucket is not fresh and whose limit's period is
//!   at least the driver's threshold: the buckets this node owns, the replicas it holds for its
//!   ring predecessors, and the authoritative state it last heard as a follower. Each is a lower
//!   bound of what the key's owner had admitted, so keeping all of them costs nothing in
//!   accuracy. Allowances, demand and fallback buckets are not kept: an allowance was debited
//!   from the owner's bucket when granted, so forgetting it is conservative.
//! - **How it comes back:** the state is aged by the time since it was written (credited as
//!   refill, as if nothing happened meanwhile) and joined with [`Bucket::join`], so a restored key
//!   admits no more than both what the node holds and what was written. A key this node owns in
//!   its current ring is joined into its own bucket; a key another node owns is joined locally
//!   and handed to its owner with the ordinary handoff (`Body::Handoff`), which joins it again.
//!   At start a node knows only itself and owns every key; the handoff of the first membership
//!   view then moves each key to its owner, where the states of every node that wrote one meet.

use crate::prelude::*;
use alloc::collections::BTreeMap;

use super::handoff::state_policy;
use super::*;
use crate::algorithm::Snapshot;

/// One key's state worth keeping (see [`Node::durable_keys`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurableKey {
    /// The bucket.
    pub key: KeyHash,
    /// The limit the state was kept under.
    pub limit: Limit,
    /// The state, relative to the `now` it was exported at.
    pub state: Snapshot,
}

/// What [`Node::restore`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreStats {
    /// Keys joined into this node's state (owned here, or held until their owner has them).
    pub joined: u64,
    /// Keys whose state did not fit their limit (refused, nothing changed).
    pub refused: u64,
    /// Keys sent to their owner in this node's ring.
    pub handed_over: u64,
}

/// Where an export of the durable state in pages stands (see [`Node::export_durable`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DurableCursor {
    /// The next slot of the key table to visit.
    slot: usize,
    /// The table's slots and layout ([`Store::layout`]) when the export (re)started; `None`
    /// before the first page.
    table: Option<(usize, u64)>,
    /// Times the export started again because entries may have moved.
    restarts: u32,
}

impl DurableCursor {
    /// Whether every slot of the key table was visited: the export is complete.
    pub fn is_done(&self) -> bool {
        self.table.is_some_and(|(slots, _)| self.slot >= slots)
    }
}

/// Restarts of a paged export (entries of the key table moved meanwhile) after which the rest is
/// exported in one page, so that an export always ends.
const DURABLE_RESTARTS_MAX: u32 = 2;

impl Node {
    /// The state worth keeping across a full restart, relative to `now`: every tracked key whose
    /// bucket is not fresh at `now` and whose limit's period is at least `period_min` (state of
    /// short periods is worth little after a restart: it would be fresh again soon anyway).
    /// In one piece; [`Node::export_durable`] takes it in pages.
    pub fn durable_keys(&self, now: Instant, period_min: core::time::Duration) -> Vec<DurableKey> {
        let mut keys = Vec::new();
        self.export_durable(now, period_min, &mut DurableCursor::default(), usize::MAX, &mut keys);
        keys
    }

    /// Appends to `into` the durable keys (as [`Node::durable_keys`] chooses them) of the next
    /// `slots_max` slots of the key table, relative to `now`, and moves `cursor` past them: a
    /// driver holding a lock around each call exports a large table without holding it for the
    /// whole table. Each page's states are relative to its own `now`, so a snapshot is written
    /// with a time no earlier than its last page's (its earlier pages then look older than they
    /// are: less refill is credited at restore, never more). A key tracked for the whole export
    /// is in it once, in its state at its page; one tracked meanwhile may be missed (it is in
    /// the next snapshot). If entries may have moved since the previous page (the table grew or
    /// rehashed in place: [`Store::layout`]), `into` is cleared and the export starts again;
    /// after `DURABLE_RESTARTS_MAX` restarts the rest comes in one page. Give `into` room for [`Node::keys_len`] keys first: growing it would
    /// copy what it holds within a page.
    pub fn export_durable(
        &self,
        now: Instant,
        period_min: core::time::Duration,
        cursor: &mut DurableCursor,
        slots_max: usize,
        into: &mut Vec<DurableKey>,
    ) {
        let table = (self.keys.slots(), self.keys.layout());
        if cursor.table.is_some_and(|before| before != table) {
            into.clear();
            cursor.slot = 0;
            cursor.restarts += 1;
        }
        cursor.table = Some(table);
        let slots = table.0;
        let len = if cursor.restarts >= DURABLE_RESTARTS_MAX { usize::MAX } else { slots_max.max(1) };
        let end = cursor.slot.saturating_add(len).min(slots);
        for slot in cursor.slot..end {
            let Some((key, bucket, meta)) = self.keys.at_slot(slot) else { continue };
            let limit = &meta.policy.limit;
            if limit.spec().period >= period_min && bucket.fresh_at(limit) > now {
                into.push(DurableKey { key, limit: limit.clone(), state: bucket.export(now) });
            }
        }
        cursor.slot = end;
    }

    /// Joins state read back from durable storage, written `age` ago, into this node's state (see
    /// the module documentation). Idempotent, like every join: restoring the same keys twice, or
    /// keys the cluster knows already, never counts a hit twice.
    pub fn restore(
        &mut self,
        now: Instant,
        keys: Vec<DurableKey>,
        age: core::time::Duration,
    ) -> RestoreStats {
        let age_nanos = duration_nanos(age);
        let mut stats = RestoreStats::default();
        let mut handoffs: BTreeMap<NodeId, Vec<KeyState>> = BTreeMap::new();
        for durable in keys {
            let key = durable.key;
            let owner = self.ring.owner(key).unwrap_or(self.id);
            let owned = owner == self.id;
            let limit = durable.limit;
            let state = durable.state.aged(age_nanos);
            // Snapshots on disk keep no terms between regions: a check, or the home's next
            // grant, brings them back.
            let policy = state_policy(&limit, PolicyRegion::default());
            let joined = self.keys.upsert_with(
                key,
                &limit,
                now,
                || KeyMeta::new(policy, owned),
                |bucket, meta| {
                    meta.born = None;
                    bucket.join(&limit, state, now).map(|()| bucket.export(now))
                },
            );
            let Ok(merged) = joined else {
                stats.refused += 1;
                continue;
            };
            stats.joined += 1;
            if owned {
                if self.replicates() {
                    self.replicas_due.insert(key);
                }
            } else {
                let (limit, region) = (LimitWire::from_limit(&limit), PolicyRegion::default());
                let state = KeyState { key: key.0, limit, state: merged.into(), region };
                handoffs.entry(owner).or_default().push(state);
            }
        }
        let handed_over: u64 = handoffs.values().map(|states| states.len() as u64).sum();
        stats.handed_over += handed_over;
        self.stats.handoffs_sent += handed_over;
        self.send_handoffs(handoffs, now);
        self.end_input(now);
        stats
    }
}

#[cfg(test)]
mod tests {
    use alloc::sync::Arc;
    use core::time::Duration;

    use super::*;
    use crate::key::Namespace;
    use crate::limit::Algorithm;

    const DAY: Duration = Duration::from_secs(86_400);
    const T0: Instant = Instant::from_millis(1_000);

    fn policy(algorithm: Algorithm, period: Duration) -> Arc<Policy> {
        let limit = Limit::new(LimitSpec::new(algorithm, 100, period)).expect("valid limit");
        Arc::new(Policy::new(limit, api::Mode::Exact))
    }

    fn key(name: &str) -> KeyHash {
        Namespace::new(b"persist").key(name.as_bytes())
    }

    /// Spends `hits` of `key` on `node` (the owner) at `now`.
    fn spend(node: &mut Node, policy: &Arc<Policy>, key: KeyHash, hits: u64, now: Instant) {
        let request = CheckRequest { id: RequestId(0), key, policy: policy.clone(), cost: hits };
        assert!(matches!(node.handle_check(now, request), CheckOutcome::Decided(d) if d.allowed));
    }

    fn remaining(node: &mut Node, policy: &Arc<Policy>, key: KeyHash, now: Instant) -> u64 {
        let request = CheckRequest { id: RequestId(0), key, policy: policy.clone(), cost: 0 };
        match node.handle_check(now, request) {
            CheckOutcome::Decided(decision) => decision.remaining,
            other => panic!("a query at the owner is decided at once: {other:?}"),
        }
    }

    fn node(id: u64) -> Node {
        Node::new(NodeId(id), 1, NodeConfig::default(), id, T0).expect("the default config is valid")
    }

    #[test]
    fn kept_state_comes_back_and_is_never_more_permissive() {
        for algorithm in [Algorithm::TokenBucket, Algorithm::FixedWindow, Algorithm::SlidingWindowLog] {
            let daily = policy(algorithm, DAY);
            let mut before = node(1);
            spend(&mut before, &daily, key("a"), 60, T0);
            let kept = before.durable_keys(T0, Duration::from_secs(60));
            assert_eq!(kept.len(), 1, "{algorithm:?}");

            // A new process: another clock epoch, state written a minute ago.
            let later = Instant::from_millis(5);
            let mut after = node(1);
            let stats = after.restore(later, kept.clone(), Duration::from_secs(60));
            assert_eq!(stats, RestoreStats { joined: 1, refused: 0, handed_over: 0 });
            let left = remaining(&mut after, &daily, key("a"), later);
            // A token bucket refills 100 per day: a minute credits nothing (0.07 of a hit).
            assert_eq!(left, 40, "{algorithm:?}");
            // Restoring again (or what the node knows already) counts nothing twice.
            after.restore(later, kept, Duration::from_secs(60));
            assert_eq!(remaining(&mut after, &daily, key("a"), later), 40, "{algorithm:?}");
        }
    }

    #[test]
    fn the_time_since_the_snapshot_is_credited_as_refill() {
        let daily = policy(Algorithm::TokenBucket, DAY);
        let mut before = node(1);
        spend(&mut before, &daily, key("a"), 60, T0);
        let kept = before.durable_keys(T0, Duration::ZERO);
        let mut after = node(1);
        // Half a day: 50 hits back.
        after.restore(T0, kept.clone(), DAY / 2);
        assert_eq!(remaining(&mut after, &daily, key("a"), T0), 90);
        // A day or more: nothing left to restore.
        let mut after = node(1);
        after.restore(T0, kept, DAY * 2);
        assert_eq!(remaining(&mut after, &daily, key("a"), T0), 100);
    }

    #[test]
    fn fresh_keys_and_short_periods_are_not_kept() {
        let daily = policy(Algorithm::TokenBucket, DAY);
        let per_second = policy(Algorithm::TokenBucket, Duration::from_secs(1));
        let mut node = node(1);
        spend(&mut node, &daily, key("spent"), 1, T0);
        spend(&mut node, &per_second, key("short"), 1, T0);
        let kept = node.durable_keys(T0, Duration::from_secs(60));
        assert_eq!(kept.iter().map(|k| k.key).collect::<Vec<_>>(), [key("spent")]);
        // A day later the daily key is fresh again: nothing to keep.
        assert!(node.durable_keys(T0.add_duration(DAY), Duration::ZERO).is_empty());
    }

    #[test]
    fn a_key_owned_elsewhere_is_handed_to_its_owner() {
        let daily = policy(Algorithm::TokenBucket, DAY);
        let view = MemberView { live: vec![NodeId(1), NodeId(2)], dead: vec![], regions: Vec::new() };
        let (mut one, mut two) = (node(1), node(2));
        one.handle_membership(T0, view.clone());
        two.handle_membership(T0, view);
        // A key node 2 owns, written by node 1 (it held a replica, say).
        let owned_by_two = (0..).map(|i| key(&format!("k{i}"))).find(|&k| one.owner_of(k) == Some(NodeId(2)));
        let k = owned_by_two.expect("some key is node 2's");
        let mut writer = node(1);
        spend(&mut writer, &daily, k, 60, T0);
        let stats = one.restore(T0, writer.durable_keys(T0, Duration::ZERO), Duration::ZERO);
        assert_eq!(stats, RestoreStats { joined: 1, refused: 0, handed_over: 1 });
        while let Some(transmit) = one.poll_transmit() {
            assert_eq!(transmit.to, NodeId(2));
            two.handle_frame(T0, NodeId(1), &transmit.bytes);
        }
        assert_eq!(remaining(&mut two, &daily, k, T0), 40);
    }

    #[test]
    fn a_state_of_another_family_is_refused() {
        let daily = policy(Algorithm::TokenBucket, DAY);
        let mut writer = node(1);
        spend(&mut writer, &daily, key("a"), 60, T0);
        let mut kept = writer.durable_keys(T0, Duration::ZERO);
        kept[0].state = Snapshot::Window { elapsed_nanos: 0, prev: 0, curr: 100 };
        let mut after = node(1);
        assert_eq!(after.restore(T0, kept, Duration::ZERO).refused, 1);
        assert_eq!(remaining(&mut after, &daily, key("a"), T0), 100);
    }

    /// Exports `node` in pages of `slots_max` slots, running `between` after each page; returns
    /// the keys and the cursor at its end.
    fn export_in_pages(
        node: &mut Node,
        slots_max: usize,
        mut between: impl FnMut(&mut Node),
    ) -> (Vec<DurableKey>, DurableCursor, usize) {
        let (mut cursor, mut keys, mut pages) = (DurableCursor::default(), Vec::new(), 0);
        while !cursor.is_done() {
            node.export_durable(T0, Duration::ZERO, &mut cursor, slots_max, &mut keys);
            pages += 1;
            between(node);
        }
        (keys, cursor, pages)
    }

    fn sorted(mut keys: Vec<DurableKey>) -> Vec<DurableKey> {
        keys.sort_unstable_by_key(|kept| kept.key);
        keys
    }

    #[test]
    fn an_export_in_pages_is_the_export_in_one_piece() {
        let daily = policy(Algorithm::TokenBucket, DAY);
        let mut writer = node(1);
        for i in 0..1_000 {
            spend(&mut writer, &daily, key(&format!("k{i}")), 1 + i % 50, T0);
        }
        let whole = writer.durable_keys(T0, Duration::ZERO);
        assert_eq!(whole.len(), 1_000);
        let (paged, _, pages) = export_in_pages(&mut writer, 64, |_| {});
        assert!(pages >= writer.keys.slots() / 64, "{pages} pages");
        assert_eq!(sorted(paged), sorted(whole));
    }

    #[test]
    fn a_table_that_grows_during_an_export_restarts_it_and_it_still_ends() {
        let daily = policy(Algorithm::TokenBucket, DAY);
        let mut writer = node(1);
        for i in 0..100 {
            spend(&mut writer, &daily, key(&format!("k{i}")), 10, T0);
        }
        let mut added = 100;
        // Every page inserts enough keys to grow the table now and then: entries move.
        let (paged, cursor, _) = export_in_pages(&mut writer, 16, |node| {
            for _ in 0..40 {
                spend(node, &daily, key(&format!("k{added}")), 10, T0);
                added += 1;
            }
        });
        assert_eq!(cursor.restarts, DURABLE_RESTARTS_MAX, "the table grew, then the rest came in one page");
        let keys: Vec<KeyHash> = sorted(paged).into_iter().map(|kept| kept.key).collect();
        let mut unique = keys.clone();
        unique.dedup();
        assert_eq!(keys, unique, "no key twice");
        for i in 0..100 {
            assert!(keys.contains(&key(&format!("k{i}"))), "k{i}, tracked for the whole export, is in it");
        }
    }

    /// Where each tracked key sits in the table.
    fn positions(node: &Node) -> Vec<(usize, KeyHash)> {
        (0..node.keys.slots())
            .filter_map(|slot| node.keys.at_slot(slot).map(|(key, _, _)| (slot, key)))
            .collect()
    }

    #[test]
    fn a_table_that_rehashes_in_place_during_an_export_loses_no_key() {
        let daily = policy(Algorithm::TokenBucket, DAY);
        let mut writer = node(1);
        // 124 short-lived keys, then 100 kept: 224 keys in 256 slots.
        let gone: Vec<KeyHash> = (0..124).map(|i| key(&format!("g{i}"))).collect();
        let tracked: Vec<KeyHash> = (0..100).map(|i| key(&format!("t{i}"))).collect();
        for &k in gone.iter().chain(&tracked) {
            spend(&mut writer, &daily, k, 1, T0);
        }
        let (slots, before) = (writer.keys.slots(), positions(&writer));
        let mut churn = 0;
        let (paged, cursor, _) = export_in_pages(&mut writer, 1, |node| {
            // The short-lived keys go (tombstones in a full table), then keys come and go: with
            // no room left, an insert rehashes the table in place.
            for k in gone.iter().filter(|&&k| node.keys.extra(k).is_some()).copied().collect::<Vec<_>>() {
                node.keys.remove(k);
            }
            for _ in 0..40 {
                spend(node, &daily, key(&format!("c{churn}")), 1, T0);
                if churn >= 10 {
                    node.keys.remove(key(&format!("c{}", churn - 10)));
                }
                churn += 1;
            }
        });
        let after = positions(&writer);
        assert_eq!(writer.keys.slots(), slots, "the table never grew");
        assert!(
            before.iter().any(|entry| tracked.contains(&entry.1) && !after.contains(entry)),
            "entries moved"
        );
        assert!(cursor.restarts > 0, "the export saw it");
        let keys: Vec<KeyHash> = sorted(paged).into_iter().map(|kept| kept.key).collect();
        let mut unique = keys.clone();
        unique.dedup();
        assert_eq!(keys, unique, "no key twice");
        assert!(tracked.iter().all(|k| keys.contains(k)), "every key tracked for the whole export is in it");
    }
}
