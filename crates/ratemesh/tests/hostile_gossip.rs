//! Hostile gossip against a running three-node cluster on loopback: every class of forged
//! datagram found against unauthenticated chitchat (address, leave and protocol rewrites,
//! heartbeat overflow, a reset of the receiver's own state, oversize digests, the delta that
//! panicked chitchat, a compression bomb, a reflection probe), sent in the clear, under another
//! cluster's key and — for the classes the bounds must stop — sealed with the cluster's own key
//! (an insider), plus the replay of a captured datagram, and an insider's malformed region. After each: the membership, the ring
//! and exact admission are unchanged, nothing panicked, nothing was answered, and memory stayed
//! bounded.

#![allow(clippy::unwrap_used)]

mod support;
#[path = "support/chitchat_wire.rs"]
mod wire;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use ratemesh::gossip::seal::{GossipKeys, Sealer};
use ratemesh::membership::{KEY_LEAVING, KEY_PROTOCOL, KEY_QUIC_ADDR, KEY_REGION};
use ratemesh::{ClusterSecret, GossipHealth, GossipStats, Member, NamedPolicy, Node, NodeId, Region};
use ratemesh_core::Mode;
use support::*;
use tokio::net::UdpSocket;
use tokio::task::JoinSet;
use wire::{DigestEntry, Id, Op};

/// The cluster under attack and what it looked like before.
struct Target {
    nodes: Vec<TestNode>,
    /// Chitchat ids of the nodes (their generations are their incarnations).
    ids: Vec<Id>,
    baseline: Vec<(Vec<Member>, Vec<Option<NodeId>>)>,
    attacker: UdpSocket,
    probes: Vec<NamedPolicy>,
    insider: Insider,
}

/// Seals messages with the cluster's key, as a member (or an insider who stole the secret) would.
struct Insider {
    keys: GossipKeys,
    sealer: Sealer,
}

impl Insider {
    fn seal(&mut self, sender: SocketAddr, message: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        self.sealer.seal(&self.keys, sender, message, &mut out).unwrap();
        out
    }
}

fn keys(secret: &str) -> GossipKeys {
    GossipKeys::derive(&ClusterSecret::new(secret).unwrap(), &cluster_id()).unwrap()
}

const INCARNATIONS: [u64; 3] = [1_000_001, 2_000_002, 3_000_003];

/// Nodes 1 and 2, and node 3 seeded through `proxy` (which sees its datagrams to node 1).
async fn start(proxy: &UdpSocket) -> Target {
    let first = TestNode::start(builder(1, SECRET, &[]).incarnation(INCARNATIONS[0])).await;
    let seed = first.node.gossip_addr();
    let second = TestNode::start(builder(2, SECRET, &[seed]).incarnation(INCARNATIONS[1])).await;
    let third =
        TestNode::start(builder(3, SECRET, &[proxy.local_addr().unwrap()]).incarnation(INCARNATIONS[2]))
            .await;
    let nodes = vec![first, second, third];
    let ids: Vec<Id> = nodes
        .iter()
        .zip(INCARNATIONS)
        .map(|(node, incarnation)| {
            Id::new(node.node.id().0.to_string(), incarnation, node.node.gossip_addr())
        })
        .collect();
    let attacker = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let insider = Insider { keys: keys(SECRET), sealer: Sealer::new().unwrap() };
    let probes = vec![hourly_bucket("ring-probe", 1, Mode::Exact)];
    Target { nodes, ids, baseline: Vec::new(), attacker, probes, insider }
}

impl Target {
    fn node(&self, index: usize) -> &Node {
        &self.nodes[index].node
    }

    fn seen(&self) -> Vec<(Vec<Member>, Vec<Option<NodeId>>)> {
        self.nodes
            .iter()
            .map(|node| {
                let owners = (0..1000)
                    .map(|i| node.node.owner_of(self.probes[0].key(format!("k{i}").as_bytes())))
                    .collect();
                (node.node.members(), owners)
            })
            .collect()
    }

    fn stats(&self) -> Vec<GossipStats> {
        self.nodes.iter().map(|node| node.metrics().gossip).collect()
    }

    async fn send(&self, datagram: &[u8], to: usize) {
        self.attacker.send_to(datagram, self.node(to).gossip_addr()).await.unwrap();
    }

    /// Sends `datagrams` to node `to`, each once the previous one was counted as refused (of the
    /// kind `counted` reads; one at a time, so that the socket's buffer never drops one); then
    /// the membership and ring of every node must be as before.
    async fn refused(&self, class: &str, datagrams: &[Vec<u8>], to: usize, counted: fn(&GossipStats) -> u64) {
        for datagram in datagrams {
            let expected = counted(&self.nodes[to].metrics().gossip) + 1;
            self.send(datagram, to).await;
            eventually(class, || counted(&self.nodes[to].metrics().gossip) >= expected).await;
            assert_eq!(counted(&self.nodes[to].metrics().gossip), expected, "{class}: one refusal each");
        }
        self.assert_unchanged(class);
    }

    fn assert_unchanged(&self, class: &str) {
        let now = self.seen();
        for (index, (before, after)) in self.baseline.iter().zip(&now).enumerate() {
            assert_eq!(before.0, after.0, "{class}: members of node {} changed", index + 1);
            assert_eq!(before.1, after.1, "{class}: ring of node {} changed", index + 1);
        }
        for node in &self.nodes {
            assert_eq!(node.node.gossip_health(), GossipHealth::Running, "{class}: gossip ended");
            assert_eq!(node.metrics().gossip.restarts, 0, "{class}: gossip restarted");
        }
    }
}

/// Each forged class, as chitchat bytes (before any sealing): `(name, datagrams)`, all to node 1.
fn forged(ids: &[Id]) -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let (me, member) = (&ids[0], &ids[1]);
    let rewrite = |key: &str, value: &str| {
        let node = Op::Node { id: member.clone(), last_gc_version: 0, from_version_excluded: 0 };
        let kv = Op::KeyValue { key: key.to_owned(), value: value.to_owned(), version: 100, status: 0 };
        vec![wire::ack(&wire::stored(&wire::ops(&[node, kv])))]
    };
    let heartbeat =
        DigestEntry { id: member.clone(), heartbeat: u64::MAX, last_gc_version: 0, max_version: 3 };
    let reset = Op::Node { id: me.clone(), last_gc_version: 1 << 40, from_version_excluded: 0 };
    let fakes = |from: u16| -> Vec<DigestEntry> {
        (from..from + 450)
            .map(|i| DigestEntry {
                id: Id::new(format!("{}", 10_000 + u32::from(i)), 1, SocketAddr::from(([10, 9, 0, 1], i))),
                heartbeat: 1,
                last_gc_version: 0,
                max_version: 0,
            })
            .collect()
    };
    let panicking = wire::ops(&[
        Op::Node { id: member.clone(), last_gc_version: 0, from_version_excluded: 0 },
        Op::KeyValue { key: "k".to_owned(), value: "v".to_owned(), version: 100, status: 0 },
        Op::SetMaxVersion(5),
    ]);
    vec![
        ("address rewrite", rewrite(KEY_QUIC_ADDR, "127.0.0.1:1")),
        ("leave flag", rewrite(KEY_LEAVING, "1")),
        ("protocol rewrite", rewrite(KEY_PROTOCOL, "255")),
        ("heartbeat overflow", vec![wire::syn_ack(&[heartbeat], &wire::stored(&[]))]),
        ("self-state reset", vec![wire::ack(&wire::stored(&wire::ops(&[reset])))]),
        ("oversize digests", (0..3).map(|i| wire::syn(&cluster_id(), &fakes(i * 450))).collect()),
        ("panicking delta", vec![wire::syn_ack(&[], &wire::stored(&panicking))]),
        ("compression bomb", vec![bomb()]),
        ("reflection probe", vec![wire::syn_ack(&[], &[0])]),
    ]
}

/// An Ack of zstd blocks that each decompress to 64 KiB, as many as fit in a datagram
/// (unbounded, one decompresses to about 300 MB).
fn bomb() -> Vec<u8> {
    let block = wire::compressed_block(&[0_u8; u16::MAX as usize]);
    let mut delta = Vec::new();
    while delta.len() + block.len() < 65_000 {
        delta.extend_from_slice(&block);
    }
    delta.push(0);
    wire::ack(&delta)
}

/// Resident memory of this process (all the nodes), in bytes.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("VmRSS");
    let kib: u64 = line.split_whitespace().nth(1).expect("value").parse().expect("number");
    kib * 1024
}

/// Checks of an exact limit of 5 on 10 keys, 100 of them spread over the nodes: how many passed.
async fn admitted(nodes: &[Node], name: &str) -> u64 {
    let policy = hourly_bucket(name, 5, Mode::Exact);
    let mut checks = JoinSet::new();
    for i in 0..100 {
        let node = nodes[i % nodes.len()].clone();
        let policy = policy.clone();
        checks.spawn(async move { node.check(&policy, format!("key-{}", i % 10).as_bytes(), 1).await });
    }
    let mut allowed = 0;
    while let Some(decision) = checks.join_next().await {
        allowed += u64::from(decision.unwrap().unwrap().allowed);
    }
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_gossip_changes_nothing() {
    let proxy = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut target = start(&proxy).await;
    // The proxy forwards node 3's datagrams to node 1 and keeps a copy of each.
    let captured = Arc::new(Mutex::new(Vec::new()));
    let relay = tokio::spawn(relay(proxy, target.node(0).gossip_addr(), Arc::clone(&captured)));
    let all = [NodeId(1), NodeId(2), NodeId(3)];
    for node in &target.nodes {
        wait_live(&node.node, &all).await;
        node.node.wait_serving().await;
    }
    let handles: Vec<Node> = target.nodes.iter().map(|node| node.node.clone()).collect();
    assert_eq!(admitted(&handles, "before").await, 50);
    target.baseline = target.seen();
    // Real traffic passed every check: no false refusals.
    for stats in target.stats() {
        assert_eq!((stats.rejected_malformed, stats.rejected_over_bound, stats.rejected_replayed), (0, 0, 0));
    }

    let resident_before = resident_bytes();
    let foreign = keys(FOREIGN_SECRET);
    let mut foreign_sealer = Sealer::new().unwrap();
    let attacker = target.attacker.local_addr().unwrap();
    for (class, datagrams) in forged(&target.ids) {
        // In the clear, as in the attacks found: dropped unparsed.
        target.refused(class, &datagrams, 0, |s| s.rejected_unauthenticated).await;
        // Sealed under another cluster's key: dropped without decryption.
        let sealed: Vec<Vec<u8>> = datagrams
            .iter()
            .map(|message| {
                let mut out = Vec::new();
                foreign_sealer.seal(&foreign, attacker, message, &mut out).unwrap();
                out
            })
            .collect();
        target.refused(class, &sealed, 0, |s| s.rejected_unknown_key).await;
        // A flipped bit in an authentic datagram: forged.
        let mut flipped = target.insider.seal(attacker, &datagrams[0]);
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        target.refused(class, &[flipped], 0, |s| s.rejected_unauthenticated).await;
    }
    // 20 more bombs in the clear and 20 under the cluster's key (an insider's: cut off at the
    // decompression bound).
    let bombs: Vec<Vec<u8>> = (0..20).map(|_| bomb()).collect();
    target.refused("bombs in the clear", &bombs, 0, |s| s.rejected_unauthenticated).await;
    let sealed_bombs: Vec<Vec<u8>> = bombs.iter().map(|bomb| target.insider.seal(attacker, bomb)).collect();
    target.refused("insider bombs", &sealed_bombs, 0, |s| s.rejected_over_bound).await;
    let resident_after = resident_bytes();
    let block_len = wire::compressed_block(&[0_u8; u16::MAX as usize]).len();
    let inflated_mib = ((bomb().len() / block_len) * usize::from(u16::MAX)) >> 20;
    println!(
        "resident memory: {} MiB before the forged datagrams, {} MiB after (40 bombs of {} bytes, each {} MiB if \
         decompressed whole)",
        resident_before >> 20,
        resident_after >> 20,
        bomb().len(),
        inflated_mib,
    );
    assert!(resident_after < resident_before + (64 << 20), "{resident_before} -> {resident_after}");

    insiders_are_bounded(&mut target, attacker).await;
    no_reply_to_unauthenticated(&mut target).await;
    replays_are_refused(&target, &captured).await;

    assert_eq!(admitted(&handles, "after").await, 50);
    target.assert_unchanged("the end");
    relay.abort();
    for node in target.nodes {
        node.shutdown().await;
    }
}

/// Sealed with the cluster's key, the classes that hit chitchat's assertions or bounds are
/// refused as malformed or over a bound.
async fn insiders_are_bounded(target: &mut Target, sender: SocketAddr) {
    let classes = forged(&target.ids);
    let malformed = ["self-state reset", "panicking delta"];
    let over_bound = ["heartbeat overflow", "compression bomb"];
    for (class, datagrams) in classes {
        let sealed: Vec<Vec<u8>> =
            datagrams.iter().map(|message| target.insider.seal(sender, message)).collect();
        if malformed.contains(&class) {
            target.refused(class, &sealed, 0, |s| s.rejected_malformed).await;
        } else if over_bound.contains(&class) {
            target.refused(class, &sealed, 0, |s| s.rejected_over_bound).await;
        }
    }
    // One digest of more nodes than the state may hold.
    let many: Vec<DigestEntry> = (0..600_u16)
        .map(|i| DigestEntry {
            id: Id::new(format!("{}", 20_000 + u32::from(i)), 1, SocketAddr::from(([10, 9, 1, 1], i))),
            heartbeat: 1,
            last_gc_version: 0,
            max_version: 0,
        })
        .collect();
    let datagram = target.insider.seal(sender, &wire::syn(&cluster_id(), &many));
    target.refused("insider oversize digest", &[datagram], 0, |s| s.rejected_over_bound).await;
    // A newer generation of the receiver itself (only it writes its own state).
    let mut newer = target.ids[0].clone();
    newer.generation += 1;
    let entry = DigestEntry { id: newer, heartbeat: 5, last_gc_version: 0, max_version: 3 };
    let datagram = target.insider.seal(sender, &wire::syn_ack(&[entry], &wire::stored(&[])));
    target.refused("newer generation of the receiver", &[datagram], 0, |s| s.rejected_malformed).await;
}

/// A probe in the clear draws nothing: the first datagram the prober receives is the answer to
/// the authenticated Syn it sent after the probe (the reply goes to the authenticated sender).
async fn no_reply_to_unauthenticated(target: &mut Target) {
    let prober = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let to = target.node(0).gossip_addr();
    let before = target.nodes[0].metrics().gossip.rejected_unauthenticated;
    prober.send_to(&wire::syn_ack(&[], &[0]), to).await.unwrap();
    prober.send_to(&wire::syn(&cluster_id(), &[]), to).await.unwrap();
    eventually("probe refused", || target.nodes[0].metrics().gossip.rejected_unauthenticated == before + 2)
        .await;
    let authentic = target.insider.seal(prober.local_addr().unwrap(), &wire::syn(&cluster_id(), &[]));
    prober.send_to(&authentic, to).await.unwrap();
    let mut buffer = vec![0_u8; 65_536];
    let (len, from) = tokio::time::timeout(WAIT, prober.recv_from(&mut buffer)).await.unwrap().unwrap();
    assert_eq!(from, to);
    let mut opener = ratemesh::gossip::seal::Opener::default();
    let (sender, message) = opener.open(&target.insider.keys, &mut buffer[..len]).expect("a sealed reply");
    assert_eq!(sender, to);
    assert_eq!(message[3], 1, "a SynAck to the authenticated Syn, nothing to the probes");
}

/// A captured datagram (node 3 to node 1, through the proxy) replayed to node 1 is refused.
async fn replays_are_refused(target: &Target, captured: &Mutex<Vec<Vec<u8>>>) {
    let datagram = captured.lock().unwrap().first().cloned().expect("node 3 gossiped through the proxy");
    let replays = vec![datagram.clone(), datagram];
    target.refused("replayed datagram", &replays, 0, |s| s.rejected_replayed).await;
}

/// Forwards what `proxy` receives to `to`, keeping a copy of the first 16 datagrams.
async fn relay(proxy: UdpSocket, to: SocketAddr, captured: Arc<Mutex<Vec<Vec<u8>>>>) {
    let mut buffer = vec![0_u8; 65_536];
    while let Ok((len, _)) = proxy.recv_from(&mut buffer).await {
        {
            let mut captured = captured.lock().unwrap();
            if captured.len() < 16 {
                captured.push(buffer[..len].to_vec());
            }
        }
        if proxy.send_to(&buffer[..len], to).await.is_err() {
            return;
        }
    }
}

/// A rotation half-way (the second of its three rolling restarts): nodes on the old secret that
/// accept the new one, and a node on the new one that accepts the old, form one cluster (gossip
/// and mutual TLS alike), while a node on an unrelated secret stays out, counted as unknown key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_rotate_without_splitting_the_cluster() {
    let secret = |text: &str| ClusterSecret::new(text).unwrap();
    let rotating = |id: u64, current: &str, accepted: &str, seeds: &[SocketAddr]| {
        let security = ratemesh::ClusterSecurity::Secret(secret(current).also_accepting(secret(accepted)));
        builder(id, SECRET, seeds).security(security)
    };
    let (old, new) = ("the old cluster secret!!", "the new cluster secret!!");
    let first = TestNode::start(rotating(1, old, new, &[])).await;
    let seed = first.node.gossip_addr();
    let second = TestNode::start(rotating(2, old, new, &[seed])).await;
    let third = TestNode::start(rotating(3, new, old, &[seed])).await;
    let stranger = TestNode::start(builder(4, FOREIGN_SECRET, &[seed])).await;
    let all = [NodeId(1), NodeId(2), NodeId(3)];
    for node in [&first, &second, &third] {
        wait_live(&node.node, &all).await;
        node.node.wait_serving().await;
    }
    eventually("the stranger's gossip is refused", || first.metrics().gossip.rejected_unknown_key > 0).await;
    for node in [&first, &second, &third] {
        assert!(node.node.members().iter().all(|member| member.id != NodeId(4)), "{:?}", node.node.members());
    }
    assert_eq!(live_ids(&stranger.node.members()), [NodeId(4)]);
    stranger.kill();
    for node in [first, second, third] {
        node.shutdown().await;
    }
}

/// An insider gossips a malformed region for a member (sealed with the cluster's key, so
/// chitchat takes it): the member is taken as naming no region and stays in the ring, the value
/// is counted once however often the membership is read again, and nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_region_is_taken_as_none_and_counted_once() {
    let eu = Region::new("eu-west").unwrap();
    let first = TestNode::start(builder(1, SECRET, &[]).incarnation(INCARNATIONS[0]).region(eu)).await;
    let seed = first.node.gossip_addr();
    let second = TestNode::start(builder(2, SECRET, &[seed]).incarnation(INCARNATIONS[1])).await;
    let both = [NodeId(1), NodeId(2)];
    wait_live(&first.node, &both).await;
    let member = Id::new("2".to_owned(), INCARNATIONS[1], second.node.gossip_addr());
    let entry = Op::Node { id: member, last_gc_version: 0, from_version_excluded: 0 };
    let region = Op::KeyValue {
        key: KEY_REGION.to_owned(),
        value: "Not a region!".to_owned(),
        version: 100,
        status: 0,
    };
    let attacker = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut insider = Insider { keys: keys(SECRET), sealer: Sealer::new().unwrap() };
    let message = wire::ack(&wire::stored(&wire::ops(&[entry, region])));
    let datagram = insider.seal(attacker.local_addr().unwrap(), &message);
    attacker.send_to(&datagram, seed).await.unwrap();
    eventually("the malformed region is counted", || first.metrics().gossip.malformed_regions == 1).await;
    // Several membership re-reads later (one every 5 gossip intervals): still once.
    tokio::time::sleep(GOSSIP_INTERVAL * 20).await;
    assert_eq!(first.metrics().gossip.malformed_regions, 1);
    wait_live(&first.node, &both).await;
    let regions: Vec<(NodeId, Region)> = first.node.members().iter().map(|m| (m.id, m.region)).collect();
    assert_eq!(regions, vec![(NodeId(1), eu), (NodeId(2), Region::NONE)]);
    assert_eq!(first.node.member_view().regions, vec![(NodeId(1), eu.id())]);
    assert_eq!(first.node.gossip_health(), GossipHealth::Running);
    second.shutdown().await;
    first.shutdown().await;
}
