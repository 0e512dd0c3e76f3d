//! Node tests on a tiny in-memory cluster: plain queues and a shared clock, stepped to the next
//! delivery or timer (in the spirit of quinn-proto's `Pair`). Faults are edits to the queues.

use core::time::Duration;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::limit::Algorithm;

const LATENCY_NANOS: u64 = 1_000_000;

/// A cluster of nodes connected by queues with a fixed one-way latency.
struct Cluster {
    now: Instant,
    nodes: BTreeMap<NodeId, Node>,
    /// (delivery time, sequence, from, to, bytes)
    in_flight: Vec<(Instant, u64, NodeId, NodeId, Vec<u8>)>,
    sent: u64,
    decided: Vec<(RequestId, Decision)>,
    /// Links that drop everything: (from, to).
    cut: Vec<(NodeId, NodeId)>,
}

impl Cluster {
    fn new(n: u64) -> Cluster {
        let now = Instant::from_millis(1_000);
        let ids: Vec<NodeId> = (1..=n).map(NodeId).collect();
        let mut nodes = BTreeMap::new();
        for &id in &ids {
            let mut node = Node::new(id, 1, NodeConfig::default(), id.0, now);
            node.handle_membership(now, MemberView { live: ids.clone(), dead: vec![] });
            nodes.insert(id, node);
        }
        let mut cluster = Cluster { now, nodes, in_flight: vec![], sent: 0, decided: vec![], cut: vec![] };
        cluster.drain();
        cluster
    }

    fn node(&mut self, id: u64) -> &mut Node {
        self.nodes.get_mut(&NodeId(id)).expect("node exists")
    }

    fn drain(&mut self) {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for id in ids {
            let node = self.nodes.get_mut(&id).expect("node exists");
            while let Some(transmit) = node.poll_transmit() {
                if self.cut.contains(&(id, transmit.to)) {
                    continue;
                }
                self.sent += 1;
                self.in_flight.push((
                    self.now.add_nanos(LATENCY_NANOS),
                    self.sent,
                    id,
                    transmit.to,
                    transmit.bytes,
                ));
            }
            while let Some(Event::Decided { id, decision }) = node.poll_event() {
                self.decided.push((id, decision));
            }
        }
    }

    /// Advances to the next delivery or timer before `until`; false when there is none.
    fn step(&mut self, until: Instant) -> bool {
        let next_delivery = self.in_flight.iter().map(|m| (m.0, m.1)).min();
        let next_timer = self.nodes.values().filter_map(|n| n.poll_timeout()).min();
        let next = match (next_delivery, next_timer) {
            (Some((d, _)), Some(t)) => d.min(t),
            (Some((d, _)), None) => d,
            (None, Some(t)) => t,
            (None, None) => return false,
        };
        if next > until {
            return false;
        }
        self.now = self.now.max(next);
        if let Some(index) =
            self.in_flight.iter().position(|m| Some((m.0, m.1)) == next_delivery && m.0 <= self.now)
        {
            let (_, _, from, to, bytes) = self.in_flight.remove(index);
            let now = self.now;
            if let Some(node) = self.nodes.get_mut(&to) {
                node.handle_frame(now, from, &bytes);
            }
        }
        let now = self.now;
        for node in self.nodes.values_mut() {
            if node.poll_timeout().is_some_and(|t| t <= now) {
                node.handle_timeout(now);
            }
        }
        self.drain();
        true
    }

    fn run_for(&mut self, duration: Duration) {
        let until = self.now.add(duration);
        while self.step(until) {}
        self.now = until;
    }

    fn check(&mut self, node: u64, request: CheckRequest) -> CheckOutcome {
        let now = self.now;
        let outcome = self.node(node).handle_check(now, request);
        self.drain();
        outcome
    }
}

fn policy(mode: Mode, limit: u64, burst: u64) -> Arc<Policy> {
    let spec = LimitSpec::new(Algorithm::TokenBucket, limit, Duration::from_secs(1)).with_burst(burst);
    Arc::new(Policy { limit: Limit::new(spec).expect("valid"), mode, fallback: Fallback::LocalShare })
}

fn key(name: &str) -> KeyHash {
    crate::key::Namespace::new(b"node-test").key(name.as_bytes())
}

#[test]
fn every_node_agrees_on_owners() {
    let cluster = Cluster::new(5);
    for i in 0..1_000u64 {
        let k = key(&i.to_string());
        let owners: Vec<_> = cluster.nodes.values().map(|n| n.owner_of(k)).collect();
        assert!(owners.windows(2).all(|w| w[0] == w[1]));
    }
}

#[test]
fn exact_mode_admits_exactly_the_burst_across_nodes() {
    let mut cluster = Cluster::new(3);
    let policy = policy(Mode::Exact, 10, 20);
    let k = key("exact");
    let mut allowed = 0;
    for i in 0..60u64 {
        let node = 1 + i % 3;
        let request = CheckRequest { id: RequestId(i), key: k, policy: policy.clone(), cost: 1 };
        if let CheckOutcome::Decided(d) = cluster.check(node, request) {
            allowed += u64::from(d.allowed);
        }
    }
    cluster.run_for(Duration::from_millis(5));
    allowed += cluster.decided.iter().filter(|(_, d)| d.allowed).count() as u64;
    // Within 5 ms at 10/s nothing refills: exactly the burst passes.
    assert_eq!(allowed, 20);
    assert_eq!(cluster.decided.len() as u64 + 60 - cluster.decided.len() as u64, 60);
}

#[test]
fn approximate_mode_converges_to_the_limit() {
    let mut cluster = Cluster::new(3);
    let policy = policy(Mode::Approximate, 100, 10);
    let k = key("approx");
    let mut allowed = 0u64;
    // 3 nodes × 100/s each = 3× the limit, for 10 s.
    for step in 0..3_000u64 {
        cluster.run_for(Duration::from_millis(10));
        for node in 1..=3 {
            let request =
                CheckRequest { id: RequestId(step * 3 + node), key: k, policy: policy.clone(), cost: 1 };
            if let CheckOutcome::Decided(d) = cluster.check(node, request) {
                allowed += u64::from(d.allowed && step >= 1_000);
            }
        }
    }
    // Steady state (last 20 s): the limit is 100/s, so about 2 000.
    println!("approximate mode admitted {allowed} in 20 s at 100/s");
    assert!((1_900..=2_060).contains(&allowed), "admitted {allowed}");
}
