//! The node driver on virtual time: whole nodes (gossip, membership, the timer and receive tasks,
//! the core) on an in-memory network with tokio's clock paused. Time advances only when every
//! task waits on a timer, so the durations asserted here are virtual: exact, and independent of
//! the machine's load. A driver whose clock were not tokio's would busy-loop here (its timer
//! fires by tokio's clock but is not due by its own) and the tests would hang.

use std::time::Duration;

use ratemesh::{
    ClusterSecurity, MemberStatus, MemoryNetwork, NamedPolicy, Node, NodeBuilder, NodeId, PeerTransport,
    Region, TransportConfig,
};
use ratemesh_core::{Algorithm, Limit, LimitSpec, Mode, NodeConfig, Policy};
use tokio::time::{Instant, timeout};

/// Bound on every wait, in virtual time.
const WAIT: Duration = Duration::from_secs(60);

/// `count` nodes (ids 1…) on `network`, all seeing each other live and serving.
async fn cluster(network: &MemoryNetwork, count: u64) -> Vec<Node> {
    cluster_of_lanes(network, count, 1).await
}

/// A node of the virtual-time cluster on `network`, with `lanes` lanes.
fn builder(network: &MemoryNetwork, id: u64, lanes: usize) -> NodeBuilder {
    let security = ClusterSecurity::from_secret("virtual time secret, 16+ bytes").expect("long enough");
    NodeBuilder::new(NodeId(id)).security(security).memory_network(network.clone()).lanes(lanes)
}

/// [`cluster`] of nodes with `lanes` lanes each.
async fn cluster_of_lanes(network: &MemoryNetwork, count: u64, lanes: usize) -> Vec<Node> {
    let first = builder(network, 1, lanes).start().await.expect("starts");
    let mut nodes = vec![first];
    for id in 2..=count {
        let node = builder(network, id, lanes).seeds([nodes[0].gossip_addr()]).start().await.expect("starts");
        nodes.push(node);
    }
    for node in &nodes {
        let mut members = node.subscribe_members();
        let all_live = |members: &Vec<ratemesh::Member>| {
            members.iter().filter(|m| m.status == MemberStatus::Live).count() as u64 == count
        };
        timeout(WAIT, members.wait_for(all_live)).await.expect("cluster forms").expect("open");
        node.wait_serving().await;
    }
    nodes
}

fn policy(mode: Mode) -> NamedPolicy {
    let limit =
        Limit::new(LimitSpec::new(Algorithm::TokenBucket, 10, Duration::from_secs(1))).expect("valid");
    NamedPolicy::new("api", Policy::new(limit, mode))
}

/// A key of `policy` that `asker` sees owned by `owner`.
fn key_owned_by(asker: &Node, policy: &NamedPolicy, owner: NodeId) -> Vec<u8> {
    (0..10_000)
        .map(|i| format!("user:{i}").into_bytes())
        .find(|key| asker.owner_of(policy.key(key)) == Some(owner))
        .expect("some key is owned by each member")
}

/// The second of three nodes leaves gracefully; returns once the first sees two live members.
async fn leave_second(nodes: &mut Vec<Node>) {
    let leaving = nodes.remove(1);
    timeout(WAIT, leaving.shutdown()).await.expect("the leave is bounded");
    let mut members = nodes[0].subscribe_members();
    let two_live = |members: &Vec<ratemesh::Member>| {
        members.iter().filter(|m| m.status == MemberStatus::Live).count() == 2
    };
    timeout(WAIT, members.wait_for(two_live)).await.expect("the leave is seen").expect("open");
}

async fn shutdown(nodes: Vec<Node>) {
    for node in nodes {
        node.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_forwarded_exact_check_is_answered_by_its_owner() {
    let network = MemoryNetwork::new();
    let nodes = cluster(&network, 3).await;
    let policy = policy(Mode::Exact);
    let key = key_owned_by(&nodes[0], &policy, NodeId(2));
    let decision = timeout(WAIT, nodes[0].check(&policy, &key, 1)).await.expect("bounded").expect("decided");
    assert!(decision.allowed);
    assert_eq!(decision.limit, 10);
    let asker = nodes[0].metrics().protocol;
    assert_eq!((asker.forwarded, asker.forward_timeouts, asker.fallback_decisions), (1, 0, 0));
    assert_eq!(nodes[1].metrics().protocol.owner_decisions, 1);
    shutdown(nodes).await;
}

#[tokio::test(start_paused = true)]
async fn with_the_owner_cut_off_the_fallback_decides_after_the_forward_timeout() {
    let network = MemoryNetwork::new();
    let nodes = cluster(&network, 3).await;
    let policy = policy(Mode::Exact);
    let key = key_owned_by(&nodes[0], &policy, NodeId(2));
    // Peer frames between 1 and 2 are lost; gossip still says 2 is live, so 1 still forwards.
    network.cut(NodeId(1), NodeId(2));
    let asked = Instant::now();
    let decision = timeout(WAIT, nodes[0].check(&policy, &key, 1)).await.expect("bounded").expect("decided");
    let waited = asked.elapsed();
    // The core waits for an answer at least 50 ms and at most `forward_timeout`, then decides by
    // the fallback from this node's share of the limit.
    let forward_timeout = NodeConfig::default().forward_timeout;
    assert!(waited >= Duration::from_millis(50) && waited <= forward_timeout, "waited {waited:?}");
    // Whether it admits depends on the fallback's share (a cold key's owner does not expect to
    // hear from this node, so it keeps enforcing the whole limit and this node's share is none);
    // what matters here is who decided and when.
    let _ = decision;
    let asker = nodes[0].metrics().protocol;
    assert_eq!((asker.forwarded, asker.forward_timeouts, asker.fallback_decisions), (1, 1, 1));
    assert_eq!(nodes[1].metrics().protocol.owner_decisions, 0, "the owner never saw it");
    network.heal(NodeId(1), NodeId(2));
    shutdown(nodes).await;
}

#[tokio::test(start_paused = true)]
async fn sync_rounds_follow_virtual_time() {
    let network = MemoryNetwork::new();
    let nodes = cluster(&network, 2).await;
    let sync_interval = NodeConfig::default().sync_interval;
    let before: Vec<u64> = nodes.iter().map(|node| node.metrics().protocol.sync_rounds).collect();
    let span = sync_interval * 20;
    tokio::time::sleep(span).await;
    for (node, before) in nodes.iter().zip(before) {
        let rounds = node.metrics().protocol.sync_rounds - before;
        // One round per interval of virtual time (the first may fall either side of the span).
        assert!((19..=21).contains(&rounds), "node {:?}: {rounds} rounds in {span:?}", node.id());
    }
    shutdown(nodes).await;
}

#[tokio::test(start_paused = true)]
async fn approximate_checks_are_reported_to_the_owner_within_sync_rounds() {
    let network = MemoryNetwork::new();
    let nodes = cluster(&network, 2).await;
    let policy = policy(Mode::Approximate);
    let key = key_owned_by(&nodes[0], &policy, NodeId(2));
    let mut admitted = 0;
    for _ in 0..5 {
        let decision =
            timeout(WAIT, nodes[0].check(&policy, &key, 1)).await.expect("bounded").expect("decided");
        admitted += u64::from(decision.allowed);
    }
    assert_eq!(admitted, 5, "5 of a limit of 10 in one second");
    // Four sync intervals (200 ms) later the owner has counted them: of 10, 5 are used and at
    // most 2 refilled (10 per second).
    tokio::time::sleep(NodeConfig::default().sync_interval * 4).await;
    let at_owner = timeout(WAIT, nodes[1].check(&policy, &key, 0)).await.expect("bounded").expect("decided");
    assert!(at_owner.remaining <= 5 + 2, "owner still sees {} remaining", at_owner.remaining);
    shutdown(nodes).await;
}

#[tokio::test(start_paused = true)]
async fn a_graceful_leave_hands_the_owners_counts_over() {
    let network = MemoryNetwork::new();
    let mut nodes = cluster(&network, 3).await;
    // 10 per minute: what refills during the leave (a few virtual seconds) is under one hit.
    let limit =
        Limit::new(LimitSpec::new(Algorithm::TokenBucket, 10, Duration::from_secs(60))).expect("valid");
    let policy = NamedPolicy::new("slow", Policy::new(limit, Mode::Exact));
    let key = key_owned_by(&nodes[0], &policy, NodeId(2));
    for _ in 0..3 {
        let decision =
            timeout(WAIT, nodes[0].check(&policy, &key, 1)).await.expect("bounded").expect("decided");
        assert!(decision.allowed);
    }
    leave_second(&mut nodes).await;
    assert_ne!(nodes[0].owner_of(policy.key(&key)), Some(NodeId(2)));
    // The new owner took over the three hits: the fourth leaves six, decided without fallback.
    let decision = timeout(WAIT, nodes[0].check(&policy, &key, 1)).await.expect("bounded").expect("decided");
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 6);
    assert_eq!(nodes[0].metrics().protocol.fallback_decisions, 0);
    shutdown(nodes).await;
}

/// Keys `user:0`… owned by another member than `asker`, at most `count`.
fn keys_owned_elsewhere(asker: &Node, policy: &NamedPolicy, count: usize) -> Vec<Vec<u8>> {
    (0..10_000)
        .map(|i| format!("user:{i}").into_bytes())
        .filter(|key| asker.owner_of(policy.key(key)) != Some(asker.id()))
        .take(count)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_cluster_of_four_lane_nodes_enforces_each_limit_exactly_and_hands_it_over() {
    let network = MemoryNetwork::new();
    let mut nodes = cluster_of_lanes(&network, 3, 4).await;
    // 10 per minute: nothing refills during the test's few virtual seconds.
    let limit =
        Limit::new(LimitSpec::new(Algorithm::TokenBucket, 10, Duration::from_secs(60))).expect("valid");
    let policy = NamedPolicy::new("lanes", Policy::new(limit, Mode::Exact));
    // Keys of every lane (64 keys over 4 lanes), all owned by the other nodes: forwarded.
    let keys = keys_owned_elsewhere(&nodes[0], &policy, 64);
    assert_eq!(nodes[0].lanes(), 4);
    let lanes: std::collections::BTreeSet<usize> =
        keys.iter().map(|key| nodes[0].lane_of(policy.key(key))).collect();
    assert_eq!(lanes.into_iter().collect::<Vec<_>>(), [0, 1, 2, 3], "the keys fall in every lane");
    for key in &keys {
        let mut admitted = 0;
        for _ in 0..4 {
            let decision =
                timeout(WAIT, nodes[0].check(&policy, key, 1)).await.expect("bounded").expect("decided");
            admitted += u64::from(decision.allowed);
        }
        assert_eq!(admitted, 4);
    }
    let asker = nodes[0].metrics().protocol;
    assert_eq!((asker.forwarded, asker.forward_timeouts, asker.fallback_decisions), (256, 0, 0));
    let owners: u64 = nodes[1..].iter().map(|node| node.metrics().protocol.owner_decisions).sum();
    assert_eq!(owners, 256, "every lane of the owners decided its keys");
    // Node 2 leaves: its keys' counts move to their new owners, lane by lane.
    leave_second(&mut nodes).await;
    for key in &keys {
        // 4 of 10 spent before the leave, wherever the key is owned now.
        let decision =
            timeout(WAIT, nodes[0].check(&policy, key, 6)).await.expect("bounded").expect("decided");
        assert!(decision.allowed, "the rest of the limit is left");
        let over = timeout(WAIT, nodes[0].check(&policy, key, 1)).await.expect("bounded").expect("decided");
        assert!(!over.allowed, "no more than the limit after the handover");
    }
    assert_eq!(nodes[0].metrics().protocol.fallback_decisions, 0);
    shutdown(nodes).await;
}

/// Top keys of a node with lanes: each lane records its checks in its own shard (`check` after
/// its decision came, `check_now` under the lock it decided under), and an answer, this node's
/// or another member's asked over the network, holds every lane's keys, each counted once.
#[tokio::test(start_paused = true)]
async fn top_keys_of_every_lane_are_in_any_members_answer() {
    let network = MemoryNetwork::new();
    let nodes = cluster_of_lanes(&network, 2, 4).await;
    let policy = policy(Mode::Approximate);
    let keys: Vec<Vec<u8>> = (0..64).map(|i| format!("user:{i}").into_bytes()).collect();
    let mut expected = std::collections::BTreeMap::new();
    for (i, key) in keys.iter().enumerate() {
        let cost = i as u64 % 3 + 1;
        timeout(WAIT, nodes[0].check(&policy, key, cost)).await.expect("bounded").expect("decided");
        // A check only the owner can decide is `WouldWait`, and not counted.
        let now = u64::from(nodes[0].check_now(&policy, key, 1).is_ok());
        expected.insert(String::from_utf8(key.clone()).expect("text"), cost + now);
    }
    let lanes: std::collections::BTreeSet<usize> =
        keys.iter().map(|key| nodes[0].lane_of(policy.key(key))).collect();
    assert_eq!(lanes.len(), 4, "the keys fall in every lane");
    for node in &nodes {
        let report = node.top("api", ratemesh::TopBy::Demand, 100).await;
        assert!(report.missing.is_empty(), "{:?}", report.missing);
        let answer = report.answer;
        // 64 keys over four shards of 128 counters each: every count exact.
        assert_eq!(answer.error_bound, 0);
        let counted: std::collections::BTreeMap<String, u64> =
            answer.entries.iter().map(|entry| (entry.key.clone(), entry.count)).collect();
        assert_eq!(counted, expected, "asked at {:?}", node.id());
        assert_eq!(answer.total, expected.values().sum::<u64>());
    }
    shutdown(nodes).await;
}

#[tokio::test(start_paused = true)]
async fn a_member_running_another_lane_count_is_not_proposed() {
    let network = MemoryNetwork::new();
    let two_lanes = builder(&network, 1, 2).start().await.expect("starts");
    let one_lane = builder(&network, 2, 1).seeds([two_lanes.gossip_addr()]).start().await.expect("starts");
    let three = builder(&network, 3, 2).seeds([two_lanes.gossip_addr()]).start().await.expect("starts");
    // Node 3 speaks node 1's protocol: once it is live at node 1, gossip has carried node 2's
    // entry too (both seeded from node 1), which node 1 still does not propose.
    let mut members = two_lanes.subscribe_members();
    let three_live = |members: &Vec<ratemesh::Member>| {
        members.iter().any(|m| m.id == NodeId(3) && m.status == MemberStatus::Live)
    };
    timeout(WAIT, members.wait_for(three_live)).await.expect("node 3 joins").expect("open");
    // Many gossip rounds more: node 2 never enters node 1's ring, nor node 1 node 2's.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(two_lanes.members().iter().all(|m| m.id != NodeId(2)), "{:?}", two_lanes.members());
    assert!(one_lane.members().iter().all(|m| m.id == NodeId(2)), "{:?}", one_lane.members());
    shutdown(vec![two_lanes, one_lane, three]).await;
}

#[tokio::test(start_paused = true)]
async fn a_frame_naming_no_lane_is_counted_as_malformed_and_dropped() {
    let network = MemoryNetwork::new();
    let node = builder(&network, 1, 4).start().await.expect("starts");
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let (peer, _received) = network.bind(loopback, NodeId(9), TransportConfig::default()).expect("binds");
    // Lane 4 of a 4-lane node, and lane 255 (the transport refuses an empty frame itself).
    for frame in [vec![1, 2, 3, 4], vec![7, 255]] {
        peer.send(NodeId(1), node.quic_addr(), frame).expect("queued");
    }
    let malformed = || node.metrics().protocol.delivery.malformed;
    timeout(WAIT, async {
        while malformed() < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the frames arrive");
    assert_eq!(malformed(), 2);
    assert!(node.is_serving(), "the node keeps serving");
    let decision =
        timeout(WAIT, node.check(&policy(Mode::Exact), b"k", 1)).await.expect("bounded").expect("decided");
    assert!(decision.allowed);
    node.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn members_in_different_regions_see_each_others_regions_in_the_core_view() {
    let network = MemoryNetwork::new();
    let (eu, us) = (Region::new("eu-west").expect("valid"), Region::new("us-east").expect("valid"));
    let first = builder(&network, 1, 1).region(eu).start().await.expect("starts");
    let second =
        builder(&network, 2, 1).region(us).seeds([first.gossip_addr()]).start().await.expect("starts");
    let expected = vec![(NodeId(1), eu.id()), (NodeId(2), us.id())];
    for node in [&first, &second] {
        let mut members = node.subscribe_members();
        let both_live = |members: &Vec<ratemesh::Member>| {
            members.iter().filter(|m| m.status == MemberStatus::Live).count() == 2
        };
        timeout(WAIT, members.wait_for(both_live)).await.expect("cluster forms").expect("open");
        let regions: Vec<(NodeId, Region)> = node.members().iter().map(|m| (m.id, m.region)).collect();
        assert_eq!(regions, vec![(NodeId(1), eu), (NodeId(2), us)]);
        let view = node.member_view();
        assert_eq!(view.live, vec![NodeId(1), NodeId(2)]);
        assert_eq!(view.regions, expected, "the view the core decides by names both regions");
        assert_eq!(node.metrics().gossip.malformed_regions, 0);
    }
    shutdown(vec![first, second]).await;
}

/// The audit over lanes and members: keys owned by node 2 (of two lanes each) checked through
/// node 1 under an exact policy are audited by node 2; node 1's cluster-wide report holds node
/// 2's figures (its lanes' added), ranks its keys with node 2 as owner and names them from node
/// 1's top-keys sketches (node 2 never saw the texts: node 1 forwarded hashes).
#[tokio::test(start_paused = true)]
async fn the_cluster_audit_adds_the_owners_lanes_and_names_keys_from_the_askers_sketches() {
    let network = MemoryNetwork::new();
    let nodes = cluster_of_lanes(&network, 2, 2).await;
    let policy = policy(Mode::Exact);
    let keys: Vec<Vec<u8>> = (0..10_000)
        .map(|i| format!("user:{i}").into_bytes())
        .filter(|key| nodes[0].owner_of(policy.key(key)) == Some(NodeId(2)))
        .take(8)
        .collect();
    assert!(keys.iter().any(|k| nodes[1].lane_of(policy.key(k)) != nodes[1].lane_of(policy.key(&keys[0]))));
    // Five checks per key per second for four seconds, half the limit (10 per second): the
    // ideal admits every hit, and so does the owner.
    let mut admitted = 0;
    for _ in 0..20 {
        for key in &keys {
            let decision =
                timeout(WAIT, nodes[0].check(&policy, key, 1)).await.expect("bounded").expect("decided");
            admitted += u64::from(decision.allowed);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(admitted, 20 * 8);
    // The windows close a settle time after they end (virtual time: exact).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let group = NamedPolicy::audit_group("api");
    let report = timeout(WAIT, nodes[0].audit(Some(group), 5)).await.expect("bounded");
    assert_eq!(report.answered, [NodeId(1), NodeId(2)]);
    assert!(report.missing.is_empty(), "{:?}", report.missing);
    assert_eq!(report.figures, nodes[1].audit_figures(), "node 2 owns every key checked");
    let [figures] = report.figures.as_slice() else { panic!("one group: {:?}", report.figures) };
    assert_eq!((figures.group, figures.window), (group, Duration::from_secs(1)));
    let sums = figures.sums;
    // Each key's first window began before its record, and the next is within the ideal's memory
    // of it (a second at 10/s with a burst of 10): both incomplete, left out (10 hits per key).
    assert!(sums.admitted <= admitted && sums.admitted >= admitted - 8 * 10, "{sums:?}");
    assert_eq!((sums.admitted, sums.over_admitted, sums.false_refused), (sums.ideal, 0, 0), "{sums:?}");
    assert_eq!(figures.incomplete_key_windows, 2 * 8);
    assert_eq!(report.keys.len(), 5);
    for key in &report.keys {
        assert_eq!(key.owner, NodeId(2));
        let text = key.text.as_deref().expect("node 1's sketches know the key");
        assert_eq!(policy.key(text.as_bytes()), key.figures.key);
        assert_eq!(nodes[1].audit_windows(key.figures.key).len() as u64, key.figures.sums.key_windows + 2);
    }
    assert_eq!(nodes[1].audit_stats().keys, 8);
    assert_eq!(nodes[0].audit_stats().keys, 0);
    assert!(nodes[1].audit_worst_keys(Some(group + 1), 5).is_empty());
    shutdown(nodes).await;
}
