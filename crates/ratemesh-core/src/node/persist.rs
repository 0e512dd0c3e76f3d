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

impl Node {
    /// The state worth keeping across a full restart, relative to `now`: every tracked key whose
    /// bucket is not fresh at `now` and whose limit's period is at least `period_min` (state of
    /// short periods is worth little after a restart: it would be fresh again soon anyway).
    pub fn durable_keys(&self, now: Instant, period_min: core::time::Duration) -> Vec<DurableKey> {
        self.keys
            .iter()
            .filter(|(_, bucket, meta)| {
                let limit = &meta.policy.limit;
                limit.spec().period >= period_min && bucket.fresh_at(limit) > now
            })
            .map(|(key, bucket, meta)| DurableKey {
                key,
                limit: meta.policy.limit.clone(),
                state: bucket.export(now),
            })
            .collect()
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
            let policy = state_policy(&limit);
            let joined = self.keys.upsert_with(
                key,
                &limit,
                now,
                || KeyMeta::new(policy, owned),
                |bucket, _| bucket.join(&limit, state, now).map(|()| bucket.export(now)),
            );
            let Ok(merged) = joined else {
                stats.refused += 1;
                continue;
            };
            stats.joined += 1;
            if owned {
                if self.config.replicate {
                    self.replicas_due.insert(key);
                }
            } else {
                let state =
                    KeyState { key: key.0, limit: LimitWire::from_limit(&limit), state: merged.into() };
                handoffs.entry(owner).or_default().push(state);
            }
        }
        let handed_over: u64 = handoffs.values().map(|states| states.len() as u64).sum();
        stats.handed_over += handed_over;
        self.stats.handoffs_sent += handed_over;
        self.send_handoffs(handoffs, now);
        self.flush_out(now);
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
        Arc::new(Policy { limit, mode: api::Mode::Exact, fallback: api::Fallback::LocalShare })
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
        let view = MemberView { live: vec![NodeId(1), NodeId(2)], dead: vec![] };
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
}
