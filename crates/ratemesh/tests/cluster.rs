//! Real clusters on loopback: gossip membership, mutual-TLS admission, exact limits across
//! nodes, a crash, a graceful leave. Approximate mode against the simulator's bound is in
//! `scenario.rs`. See `support` for the harness (every wait is on a signal, bounded).

#![allow(clippy::unwrap_used)]

mod support;

use ratemesh::security::{ClusterCa, PemSource};
use ratemesh::{
    CheckError, ClusterSecret, ClusterSecurity, MemberStatus, NamedPolicy, Node, NodeBuilder, NodeId,
    ProvidedCerts,
};
use ratemesh_core::Mode;
use support::*;
use tokio::task::JoinSet;

/// Sends `total` checks of cost 1 for `key`, spread round-robin over `nodes`, all in flight at
/// once; returns how many were allowed.
async fn admitted_concurrently(nodes: &[Node], policy: &NamedPolicy, key: &[u8], total: usize) -> u64 {
    let mut checks = JoinSet::new();
    for i in 0..total {
        let node = nodes[i % nodes.len()].clone();
        let (policy, key) = (policy.clone(), key.to_vec());
        checks.spawn(async move { node.check(&policy, &key, 1).await.unwrap().allowed });
    }
    let mut allowed = 0;
    while let Some(result) = checks.join_next().await {
        allowed += u64::from(result.unwrap());
    }
    allowed
}

fn handles(nodes: &[TestNode]) -> Vec<Node> {
    nodes.iter().map(|n| n.node.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_form_a_cluster_and_agree_on_the_owner_of_every_key() {
    let nodes = start_cluster(5).await;
    let policy = hourly_bucket("owners", 10, Mode::Exact);
    let mut owned = [0usize; 5];
    for i in 0..2000 {
        let key = format!("user-{i}");
        let owners: Vec<Option<NodeId>> =
            nodes.iter().map(|n| n.node.owner_of(policy.key(key.as_bytes()))).collect();
        assert!(owners.iter().all(|o| *o == owners[0]), "{key}: {owners:?}");
        let owner = owners[0].unwrap();
        owned[(owner.0 - 1) as usize] += 1;
    }
    // 512 virtual nodes per member: every member owns a fair share (ideal 400 of 2000).
    assert!(owned.iter().all(|&n| (300..=500).contains(&n)), "{owned:?}");
    for node in nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_mode_admits_exactly_the_limit_while_requests_are_spread_over_three_nodes() {
    let nodes = start_cluster(3).await;
    let policy = hourly_bucket("exact", 100, Mode::Exact);
    let allowed = admitted_concurrently(&handles(&nodes), &policy, b"tenant-1", 300).await;
    assert_eq!(allowed, 100);
    let forwarded: u64 = nodes.iter().map(|n| n.metrics().protocol.forwarded).sum();
    let timeouts: u64 = nodes.iter().map(|n| n.metrics().protocol.forward_timeouts).sum();
    // Two thirds of the checks arrive at followers and go to the owner, until the owner says the
    // key has no room for an hour: followers then refuse locally without asking.
    assert!(forwarded >= 60, "the followers' checks go to the owner: {forwarded}");
    assert_eq!(timeouts, 0);
    for node in nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owner_is_detected_and_its_keys_move_without_a_reset_to_full() {
    let mut nodes = start_cluster(3).await;
    let policy = hourly_bucket("crash", 100, Mode::Exact);
    let victim = NodeId(3);
    let key = key_owned_by(&nodes[0].node, &policy, victim);
    let survivors: Vec<Node> = nodes[..2].iter().map(|n| n.node.clone()).collect();
    assert_eq!(admitted_concurrently(&survivors, &policy, &key, 60).await, 60);
    // The owner replicates keys changed since its last sync round to their ring successor: wait
    // for a round after the last check, then for its replicas to arrive.
    let victim_node = nodes[2].node.clone();
    let rounds = victim_node.metrics().protocol.sync_rounds;
    eventually("a sync round after the last check", || victim_node.metrics().protocol.sync_rounds > rounds)
        .await;
    let sent = victim_node.metrics().protocol.replicas_sent;
    eventually("the replicas arrived", || {
        nodes[..2].iter().map(|n| n.metrics().protocol.replicas_received).sum::<u64>() >= sent
    })
    .await;
    nodes.pop().unwrap().kill();
    for node in &survivors {
        wait_members(node, |members| {
            members.iter().any(|m| m.id == victim && m.status == MemberStatus::Dead)
                && live_ids(members) == [NodeId(1), NodeId(2)]
        })
        .await;
    }
    let new_owner = survivors[0].owner_of(policy.key(&key)).unwrap();
    assert_ne!(new_owner, victim);
    assert_eq!(survivors[1].owner_of(policy.key(&key)), Some(new_owner));
    // 40 remain. The dead member still counts in the cluster's size, so the survivors enforce
    // 2/3 of the limit: never more than the 40 left, and no reset to a full bucket of 100.
    let after = admitted_concurrently(&survivors, &policy, &key, 150).await;
    eprintln!("after the crash: {after} admitted (40 remained)");
    assert!(after <= 40, "{after}");
    assert!(after >= 6, "the state moved, the key is not stuck: {after}");
    for node in nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_hands_the_owned_state_over() {
    let mut nodes = start_cluster(3).await;
    let policy = hourly_bucket("leave", 100, Mode::Exact);
    let leaver = NodeId(3);
    let key = key_owned_by(&nodes[0].node, &policy, leaver);
    let survivors: Vec<Node> = nodes[..2].iter().map(|n| n.node.clone()).collect();
    assert_eq!(admitted_concurrently(&survivors, &policy, &key, 30).await, 30);
    nodes.pop().unwrap().shutdown().await;
    for node in &survivors {
        // Gone, not dead: a leave does not shrink the limit.
        wait_members(node, |members| {
            members.iter().map(|m| m.id).collect::<Vec<_>>() == [NodeId(1), NodeId(2)]
        })
        .await;
    }
    let query = survivors[0].check(&policy, &key, 0).await.unwrap();
    assert_eq!((query.limit, query.remaining), (100, 70), "{query:?}");
    assert_eq!(admitted_concurrently(&survivors, &policy, &key, 100).await, 70);
    let received: u64 = nodes.iter().map(|n| n.metrics().protocol.handoffs_received).sum();
    assert!(received >= 1);
    for node in nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_without_a_cluster_certificate_are_never_admitted_even_when_gossiped() {
    let nodes = start_cluster(3).await;
    let seed = nodes[0].node.gossip_addr();
    // Gossip insiders (they hold the gossip secret) without a cluster certificate: node 7 with
    // a certificate of another CA, node 8 claiming node 2's QUIC address (whose certificate
    // names node 2), node 9 advertising an address where nothing answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let foreign = TestNode::start(foreign_insider(7, seed, None)).await;
    let impostor = TestNode::start(foreign_insider(8, seed, Some(nodes[1].node.quic_addr()))).await;
    let nobody = TestNode::start(foreign_insider(9, seed, Some(silent.local_addr().unwrap()))).await;
    let rogues = [NodeId(7), NodeId(8), NodeId(9)];
    for node in &nodes {
        // The gossip entries reached every member, and none of them got further.
        wait_members(&node.node, |members| {
            rogues.iter().all(|r| members.iter().any(|m| m.id == *r && m.status == MemberStatus::Unverified))
        })
        .await;
    }
    for node in &nodes {
        // Every member tried each rogue and failed: wrong CA, a certificate naming another node,
        // no answer.
        eventually("three failed verifications", || node.metrics().transport.connect_failures >= 3).await;
        assert_eq!(live_ids(&node.node.members()), [NodeId(1), NodeId(2), NodeId(3)]);
    }
    let policy = hourly_bucket("admission", 10, Mode::Exact);
    for i in 0..2000 {
        let owner = nodes[0].node.owner_of(policy.key(format!("k{i}").as_bytes())).unwrap();
        assert!(!rogues.contains(&owner));
    }
    assert_eq!(live_ids(&foreign.node.members()), [NodeId(7)]);
    for rogue in [foreign, impostor, nobody] {
        rogue.kill();
    }
    for node in nodes {
        node.shutdown().await;
    }
}

/// Node `id` holding the cluster's gossip secret but a certificate of another CA (which it
/// trusts alone), advertising `quic_addr` instead of its own QUIC address if given.
fn foreign_insider(
    id: u64,
    seed: std::net::SocketAddr,
    quic_addr: Option<std::net::SocketAddr>,
) -> NodeBuilder {
    let ca = ClusterCa::derive(&ClusterSecret::new(FOREIGN_SECRET).unwrap()).unwrap();
    let identity = ca.issue(NodeId(id)).unwrap();
    let security = ClusterSecurity::Provided(ProvidedCerts {
        ca_cert: PemSource::Bytes(ca.cert_pem().into_bytes()),
        node_cert: PemSource::Bytes(identity.cert_pem().into_bytes()),
        node_key: PemSource::Bytes(identity.key_pem().as_bytes().to_vec()),
        gossip_secret: ClusterSecret::new(SECRET).unwrap(),
    });
    let builder = builder(id, SECRET, &[seed]).security(security);
    match quic_addr {
        Some(addr) => builder.quic_advertise_addr(addr),
        None => builder,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_tasks_stopped_refuses_checks_instead_of_hanging() {
    let test_node = TestNode::start(builder(1, SECRET, &[])).await;
    let node = test_node.node.clone();
    let policy = hourly_bucket("orphan", 10, Mode::Exact);
    assert!(node.check(&policy, b"k", 1).await.is_ok());
    // Its runtime stops under it (as after a panic in one of its tasks): nothing would run its
    // timers any more, so checks must fail fast rather than wait for a decision.
    test_node.kill();
    eventually("checks refused", || node.check_now(&policy, b"k", 1) == Err(CheckError::ShutDown)).await;
    let refused = tokio::time::timeout(WAIT, node.check(&policy, b"k", 1)).await;
    assert_eq!(refused.ok(), Some(Err(CheckError::ShutDown)));
}
