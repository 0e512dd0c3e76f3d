//! A cluster of real nodes on loopback for integration tests: each node on its own tokio runtime
//! (so that killing it stops everything it runs, as a crash does), real chitchat gossip over UDP,
//! real QUIC, ephemeral ports. Every wait is on a signal (the members watch, a counter) and
//! bounded by [`WAIT`].

#![allow(dead_code, clippy::unwrap_used)] // Each test binary uses part of the harness.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use ratemesh::{ClusterSecurity, Member, MemberStatus, NamedPolicy, Node, NodeBuilder, NodeId, NodeMetrics};
use ratemesh_core::{Algorithm, Limit, LimitSpec, Mode, NodeConfig, Policy};
use tokio::runtime::Runtime;
use tokio::time::timeout;

/// The cluster's shared secret.
pub const SECRET: &str = "integration-test cluster secret";
/// Another cluster's secret (a CA the cluster does not trust).
pub const FOREIGN_SECRET: &str = "a foreign cluster's secret!!";
/// The bound of every wait.
pub const WAIT: Duration = Duration::from_secs(30);
/// Gossip interval of test nodes: failure detection in about a second.
pub const GOSSIP_INTERVAL: Duration = Duration::from_millis(100);

/// Timings of test nodes. The forward timeout and peer silence are generous because the tests
/// assert exact counts under stable membership, and debug builds on a loaded two-core machine
/// can stall for hundreds of milliseconds: a stall must not turn into a fallback decision.
pub fn node_config() -> NodeConfig {
    NodeConfig {
        forward_wait: Duration::ZERO,
        forward_timeout: Duration::from_secs(5),
        peer_silence: Duration::from_secs(3),
        ..NodeConfig::default()
    }
}

/// The cluster name of the calling test: its process and its thread (libtest and nextest run a
/// test's body on a thread named after the test). Tests run at once, in one process and in
/// several, and each binds ephemeral ports: a node of a finished cluster still gossiping to
/// a seed address that a later test's node now holds would join that cluster if both shared a
/// name and a secret. Gossip is sealed under keys derived from the name, so it cannot.
pub fn cluster_id() -> String {
    let thread = std::thread::current();
    format!("test-{}-{}", std::process::id(), thread.name().unwrap_or("unnamed"))
}

/// A builder for test node `id` in the calling test's cluster ([`cluster_id`]) secured by
/// `secret`, joining through `seeds`. Call it from the test's body, not from a spawned task.
pub fn builder(id: u64, secret: &str, seeds: &[SocketAddr]) -> NodeBuilder {
    NodeBuilder::new(NodeId(id))
        .cluster_id(cluster_id())
        .security(ClusterSecurity::from_secret(secret).unwrap())
        .seeds(seeds.iter().copied())
        .gossip_interval(GOSSIP_INTERVAL)
        .node_config(node_config())
        .leave_linger(Duration::from_secs(5))
}

/// A node running on a runtime of its own.
pub struct TestNode {
    pub node: Node,
    runtime: Option<Runtime>,
}

impl TestNode {
    /// Starts `builder` on a new single-worker runtime.
    pub async fn start(builder: NodeBuilder) -> TestNode {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let node = runtime.spawn(builder.start()).await.expect("start task").expect("node starts");
        TestNode { node, runtime: Some(runtime) }
    }

    /// Runs `future` on the node's runtime and waits for it.
    pub async fn run<T: Send + 'static>(&self, future: impl Future<Output = T> + Send + 'static) -> T {
        self.runtime.as_ref().expect("running").spawn(future).await.expect("task")
    }

    /// Stops the node abruptly: its runtime and every task on it are gone, sockets closed, no
    /// handoff, no leave announced.
    pub fn kill(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Leaves gracefully and stops.
    pub async fn shutdown(mut self) {
        let node = self.node.clone();
        self.run(async move { node.shutdown().await }).await;
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// The node's metrics.
    pub fn metrics(&self) -> NodeMetrics {
        self.node.metrics()
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Starts `len` nodes (ids 1..=len) of one cluster, every one seeded by the first, and waits
/// until each sees all of them live.
pub async fn start_cluster(len: u64) -> Vec<TestNode> {
    let first = TestNode::start(builder(1, SECRET, &[])).await;
    let seed = first.node.gossip_addr();
    let mut nodes = vec![first];
    for id in 2..=len {
        nodes.push(TestNode::start(builder(id, SECRET, &[seed])).await);
    }
    let ids: Vec<NodeId> = (1..=len).map(NodeId).collect();
    for node in &nodes {
        wait_live(&node.node, &ids).await;
        // A node started with seeds takes checks once its join grace (a few gossip rounds) passed.
        node.node.wait_serving().await;
    }
    nodes
}

/// Waits until `node`'s live members are exactly `ids` (its ring is then built from them).
pub async fn wait_live(node: &Node, ids: &[NodeId]) {
    wait_members(node, |members| live_ids(members) == ids).await;
}

/// Waits until `node`'s member list satisfies `condition`.
pub async fn wait_members(node: &Node, condition: impl Fn(&[Member]) -> bool) {
    let mut members = node.subscribe_members();
    let waited = timeout(WAIT, members.wait_for(|members| condition(members))).await;
    assert!(
        waited.is_ok(),
        "node {:?}: members not as expected within {WAIT:?}: {:?}",
        node.id(),
        node.members()
    );
}

/// The ids of the live members in `members`, sorted.
pub fn live_ids(members: &[Member]) -> Vec<NodeId> {
    members.iter().filter(|m| m.status == MemberStatus::Live).map(|m| m.id).collect()
}

/// Polls `condition` until it holds (for counters, which have no watch), bounded by [`WAIT`].
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let polled = timeout(WAIT, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    assert!(polled.await.is_ok(), "not reached within {WAIT:?}: {what}");
}

/// A named policy.
pub fn policy(name: &str, spec: LimitSpec, mode: Mode) -> NamedPolicy {
    let limit = Limit::new(spec).unwrap();
    NamedPolicy::new(name, Policy::new(limit, mode))
}

/// A token bucket of `capacity` that refills over an hour: no refill to speak of during a test,
/// so counts are exact.
pub fn hourly_bucket(name: &str, capacity: u64, mode: Mode) -> NamedPolicy {
    policy(name, LimitSpec::new(Algorithm::TokenBucket, capacity, Duration::from_secs(3600)), mode)
}

/// A key of `policy` owned by `owner` in `node`'s ring.
pub fn key_owned_by(node: &Node, policy: &NamedPolicy, owner: NodeId) -> Vec<u8> {
    (0..100_000u32)
        .map(|i| format!("key-{i}").into_bytes())
        .find(|key| node.owner_of(policy.key(key)) == Some(owner))
        .expect("some key is owned by every member")
}
