//! Fuzz-style tests on stable Rust, bounded in time: the gossip decoder path and the peer-frame
//! decoder get mutations of valid inputs and random bytes, from a seeded generator.
//!
//! - Gossip: chitchat messages (written by `support/chitchat_wire.rs`: valid ones, and ones put
//!   together from random parts of the format) and sealed datagrams, mutated, go through what a node does with a datagram — open, summarize under the limits,
//!   check against a running chitchat instance's state, chitchat's decoder — and whatever passes
//!   is handed to that instance. Nothing may panic, the instance must keep running, its state
//!   stays within the limits, and a mutated sealed datagram never opens.
//! - Peer frames: frames a small in-memory cluster of cores actually sends (so the inputs follow
//!   the wire format whatever it becomes), mutated, go to `wire::decode` (which must accept only
//!   canonical encodings) and to a core's `handle_frame`. Nothing may panic.
//!
//! Each part runs for `RATEMESH_FUZZ_SECONDS` (default 5) or 200 000 inputs, whichever ends
//! first; `RATEMESH_FUZZ_SEED` replays a run (the seed is printed). The cargo-fuzz target
//! (`crates/ratemesh-core/fuzz`) is for longer runs of the frame decoder.

#![allow(clippy::unwrap_used)]

#[path = "support/chitchat_wire.rs"]
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport};
use chitchat::{
    ChitchatConfig, ChitchatEnvelope, ChitchatHandle, ChitchatId, FailureDetectorConfig, ProtocolVersion,
};
use rand::{RngExt, SeedableRng};
use ratemesh::ClusterSecret;
use ratemesh::gossip::GossipLimits;
use ratemesh::gossip::check::{check_against, summarize};
use ratemesh::gossip::seal::{GossipKeys, Opener, Sealer};
use ratemesh_core::wire::{FRAME_LEN_MAX_DEFAULT, decode, encode};
use ratemesh_core::{
    AdjustRequest, Adjustment, Algorithm, CheckRequest, CoreRng, Limit, LimitSpec, MemberView, Mode,
    Namespace, NodeConfig, NodeId, Policy, RequestId,
};
use tokio::sync::mpsc;
use wire::{DigestEntry, Id, Op};

/// Inputs per part at most.
const INPUTS_MAX: u64 = 200_000;

fn budget() -> Duration {
    let seconds = std::env::var("RATEMESH_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    Duration::from_secs(seconds)
}

fn rng(part: &str) -> CoreRng {
    let seed = std::env::var("RATEMESH_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos()
            as u64
    });
    println!("{part}: seed {seed} (reproduce with RATEMESH_FUZZ_SEED={seed})");
    CoreRng::seed_from_u64(seed)
}

/// Byte-level mutations: flips, overwrites with interesting values, inserts, deletes,
/// truncation, duplication of a slice.
fn mutate(input: &[u8], rng: &mut CoreRng) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        if out.is_empty() {
            out.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..out.len());
        match rng.random_range(0..7) {
            0 => out[at] ^= 1 << rng.random_range(0..8),
            1 => out[at] = rng.random(),
            2 => {
                let value: u64 =
                    [0, 1, 2, 255, 256, 65_535, 1 << 48, u64::MAX / 2, u64::MAX][rng.random_range(0..9)];
                let bytes = value.to_le_bytes();
                let len = bytes.len().min(out.len() - at);
                out[at..at + len].copy_from_slice(&bytes[..len]);
            }
            3 => out.insert(at, rng.random()),
            4 => {
                out.remove(at);
            }
            5 => out.truncate(at),
            _ => {
                let end = rng.random_range(at..out.len()).min(at + 64);
                let slice = out[at..end].to_vec();
                let to = rng.random_range(0..=out.len());
                out.splice(to..to, slice);
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Gossip.

/// A transport whose one socket receives the envelopes of a channel and drops what it sends.
struct Inject(std::sync::Mutex<Option<mpsc::Receiver<ChitchatEnvelope>>>);

struct InjectSocket {
    addr: SocketAddr,
    envelopes: mpsc::Receiver<ChitchatEnvelope>,
}

#[async_trait::async_trait]
impl Transport for Inject {
    async fn open(&self, addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let envelopes = self.0.lock().unwrap().take().ok_or_else(|| anyhow::anyhow!("opened once"))?;
        Ok(Box::new(InjectSocket { addr, envelopes }))
    }
}

#[async_trait::async_trait]
impl Socket for InjectSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.addr)
    }

    async fn send(&mut self, _: SocketAddr, _: ChitchatEnvelope) -> anyhow::Result<SendOutcome> {
        Ok(SendOutcome { num_bytes_sent: 0 })
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        let envelope = self.envelopes.recv().await.ok_or_else(|| anyhow::anyhow!("closed"))?;
        Ok(RecvOutcome {
            from_addr: SocketAddr::from(([10, 0, 0, 2], 7946)),
            envelope,
            num_bytes_received: 0,
        })
    }
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], port))
}

/// The victim's id and the members it knows.
fn ids() -> Vec<Id> {
    (1..=4).map(|n| Id::new(n.to_string(), 100 + u64::from(n), addr(7000 + n))).collect()
}

async fn victim(envelopes: mpsc::Receiver<ChitchatEnvelope>) -> ChitchatHandle {
    let me = &ids()[0];
    let config = ChitchatConfig {
        chitchat_id: ChitchatId::new(me.node.clone(), me.generation, me.addr),
        cluster_id: "fuzz".to_owned(),
        gossip_interval: Duration::from_millis(20),
        listen_addr: me.addr,
        seed_nodes: Vec::new(),
        failure_detector_config: FailureDetectorConfig {
            phi_threshold: 8.0,
            sampling_window_size: 1000,
            max_interval: Duration::from_millis(200),
            initial_interval: Duration::from_millis(20),
            dead_node_grace_period: Duration::from_secs(60),
        },
        marked_for_deletion_grace_period: Duration::from_secs(60),
        catchup_callback: None,
        extra_liveness_predicate: None,
        protocol_version: ProtocolVersion::V0,
    };
    let key_values = vec![("ratemesh.quic_addr".to_owned(), "10.0.0.1:7947".to_owned())];
    let transport = Inject(std::sync::Mutex::new(Some(envelopes)));
    chitchat::spawn_chitchat(config, key_values, &transport).await.unwrap()
}

/// Valid messages about the members, for the victim to learn and the fuzzer to mutate.
fn gossip_corpus() -> Vec<Vec<u8>> {
    let ids = ids();
    let entry = |id: &Id, heartbeat, max_version| DigestEntry {
        id: id.clone(),
        heartbeat,
        last_gc_version: 0,
        max_version,
    };
    let digest: Vec<DigestEntry> = ids.iter().map(|id| entry(id, 10, 2)).collect();
    let delta: Vec<Op> = ids[1..]
        .iter()
        .flat_map(|id| {
            [
                Op::Node { id: id.clone(), last_gc_version: 0, from_version_excluded: 0 },
                Op::KeyValue {
                    key: "ratemesh.quic_addr".into(),
                    value: "10.0.0.9:1".into(),
                    version: 1,
                    status: 0,
                },
                Op::KeyValue { key: "ratemesh.protocol".into(), value: "1".into(), version: 2, status: 0 },
            ]
        })
        .collect();
    let ops = wire::ops(&delta);
    let mut compressed = wire::compressed_block(&ops);
    compressed.push(0);
    let empty =
        [Op::Node { id: ids[2].clone(), last_gc_version: 0, from_version_excluded: 2 }, Op::SetMaxVersion(3)];
    vec![
        wire::syn("fuzz", &digest),
        wire::syn_ack(&digest, &wire::stored(&ops)),
        wire::ack(&wire::stored(&ops)),
        wire::ack(&compressed),
        wire::ack(&wire::stored(&wire::ops(&empty))),
        wire::syn_ack(&[entry(&ids[1], 11, 2)], &wire::stored(&[])),
    ]
}

/// A value from the interesting ones around what the victim knows (versions 0..=2), or large.
fn counter(rng: &mut CoreRng) -> u64 {
    match rng.random_range(0..8) {
        0..=4 => rng.random_range(0..6),
        5 => rng.random_range(0..100),
        6 => [1 << 20, 1 << 48, (1 << 48) + 1, u64::MAX][rng.random_range(0..4)],
        _ => rng.random(),
    }
}

/// A message built from random parts of the format: node deltas (a node operation, key-values,
/// maybe a max version; sometimes in any order) about the members mostly, digests of them or
/// others, counters around the victim's (the structure byte mutations rarely reach).
fn random_message(rng: &mut CoreRng) -> Vec<u8> {
    let known = ids();
    let id = |rng: &mut CoreRng| match rng.random_range(0..8) {
        0 => Id::new(rng.random_range(0..1000_u32).to_string(), counter(rng), addr(rng.random())),
        1 => known[0].clone(),
        _ => known[rng.random_range(1..known.len())].clone(),
    };
    let rare = |rng: &mut CoreRng| if rng.random_range(0..8) == 0 { counter(rng) } else { 0 };
    let digest: Vec<DigestEntry> = (0..rng.random_range(0..4))
        .map(|_| DigestEntry {
            id: id(rng),
            heartbeat: counter(rng),
            last_gc_version: rare(rng),
            max_version: counter(rng),
        })
        .collect();
    let keys = ["ratemesh.quic_addr", "ratemesh.protocol", "ratemesh.leaving", "other"];
    let mut ops = Vec::new();
    for _ in 0..rng.random_range(0..3) {
        ops.push(Op::Node { id: id(rng), last_gc_version: rare(rng), from_version_excluded: counter(rng) });
        for _ in 0..rng.random_range(0..3) {
            let key = keys[rng.random_range(0..keys.len())].to_owned();
            let status = if rng.random_range(0..8) == 0 { rng.random_range(0..4) } else { 0 };
            ops.push(Op::KeyValue { key, value: "10.0.0.9:1".to_owned(), version: counter(rng), status });
        }
        if rng.random() {
            ops.push(Op::SetMaxVersion(counter(rng)));
        }
    }
    if rng.random_range(0..8) == 0 {
        // Any order.
        for i in (1..ops.len()).rev() {
            ops.swap(i, rng.random_range(0..=i));
        }
    }
    let bytes = wire::ops(&ops);
    let delta = if rng.random() {
        wire::stored(&bytes)
    } else {
        let mut blocks = wire::compressed_block(&bytes);
        blocks.push(0);
        blocks
    };
    match rng.random_range(0..3) {
        0 => wire::syn("fuzz", &digest),
        1 => wire::syn_ack(&digest, &delta),
        _ => wire::ack(&delta),
    }
}

/// Inputs fed to one victim before a fresh one takes over: random deltas push the versions the
/// victim knows up, after which most inputs no longer apply.
const EPOCH_INPUTS: u64 = 500;

/// A running chitchat instance fed through [`Inject`], and whether it ended (a panic).
struct Victim {
    handle: ChitchatHandle,
    inject: mpsc::Sender<ChitchatEnvelope>,
    ended: Arc<AtomicBool>,
}

impl Victim {
    async fn start() -> Victim {
        let (inject, envelopes) = mpsc::channel(1);
        let handle = victim(envelopes).await;
        let ended = Arc::new(AtomicBool::new(false));
        let termination = handle.termination_watcher();
        let flag = Arc::clone(&ended);
        tokio::spawn(async move {
            let _ = termination.await;
            flag.store(true, Ordering::SeqCst);
        });
        Victim { handle, inject, ended }
    }

    async fn deliver(&self, message: &[u8]) {
        let envelope = ChitchatEnvelope::deserialize(&mut &message[..])
            .unwrap_or_else(|error| panic!("the checks passed what chitchat refuses ({error}): {message:?}"));
        self.inject.send(envelope).await.expect("the victim still receives (did not panic)");
    }

    /// Checks that it survived everything delivered and stayed within the limits; stops it.
    async fn finish(self, corpus: &[Vec<u8>], limits: &GossipLimits) {
        // The channel holds one envelope: once this one is taken, the previous was processed.
        self.deliver(&corpus[0]).await;
        self.deliver(&corpus[0]).await;
        assert!(!self.ended.load(Ordering::SeqCst), "the chitchat instance ended (a panic)");
        let states = self.handle.chitchat().lock().await.node_states().len();
        assert!(states <= limits.nodes_max, "{states} node states");
        self.handle.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gossip_path_survives_mutated_and_random_input() {
    let mut rng = rng("gossip");
    let limits = GossipLimits::default();
    let corpus = gossip_corpus();
    let keys = GossipKeys::derive(&ClusterSecret::new("fuzzing secret, 16+ bytes").unwrap(), "fuzz").unwrap();
    let mut sealer = Sealer::new().unwrap();
    let mut opener = Opener::default();
    let (mut inputs, mut summarized, mut delivered, mut opened, mut victims) =
        (0_u64, 0_u64, 0_u64, 0_u64, 0_u64);
    let deadline = Instant::now() + budget();
    let mut victim = Victim::start().await;
    while inputs < INPUTS_MAX && Instant::now() < deadline {
        if inputs % EPOCH_INPUTS == 0 {
            victim.finish(&corpus, &limits).await;
            victim = Victim::start().await;
            victims += 1;
            for message in &corpus {
                victim.deliver(message).await;
            }
        }
        inputs += 1;
        let message = match rng.random_range(0..10) {
            // The corpus itself, so the state keeps growing legitimately.
            0 => corpus[rng.random_range(0..corpus.len())].clone(),
            1 => (0..rng.random_range(0..512)).map(|_| rng.random()).collect(),
            2..=4 => random_message(&mut rng),
            5 => mutate(&random_message(&mut rng), &mut rng),
            _ => mutate(&corpus[rng.random_range(0..corpus.len())], &mut rng),
        };
        // A sealed datagram of it, mutated, never opens.
        let mut sealed = Vec::new();
        sealer.seal(&keys, addr(9), &message, &mut sealed).unwrap();
        let mut tampered = mutate(&sealed, &mut rng);
        if tampered != sealed && opener.open(&keys, &mut tampered).is_ok() {
            opened += 1;
        }
        let Ok(summary) = summarize(&message, &limits) else { continue };
        summarized += 1;
        let chitchat = victim.handle.chitchat();
        if check_against(&summary, &*chitchat.lock().await, &limits).is_err() {
            continue;
        }
        victim.deliver(&message).await;
        delivered += 1;
    }
    victim.finish(&corpus, &limits).await;
    println!(
        "gossip: {inputs} inputs, {summarized} decoded under the limits, {delivered} delivered to {victims} chitchat \
         instances, {opened} tampered datagrams opened"
    );
    assert_eq!(opened, 0, "a tampered sealed datagram opened");
    assert!(delivered > 0, "inputs reached chitchat");
}

// ---------------------------------------------------------------------------------------------
// Peer frames.

/// Frames that three cores exchange for checks, refunds and charges of every mode, with
/// deliveries and timers.
fn frame_corpus() -> Vec<(NodeId, Vec<u8>)> {
    let ids = [NodeId(1), NodeId(2), NodeId(3)];
    let mut now = ratemesh_core::Instant::from_millis(1);
    let mut nodes: Vec<ratemesh_core::Node> = ids
        .iter()
        .map(|&id| {
            ratemesh_core::Node::new(id, 1, NodeConfig::default(), id.0, now)
                .expect("the default config is valid")
        })
        .collect();
    for node in &mut nodes {
        node.handle_membership(now, MemberView { live: ids.to_vec(), dead: Vec::new(), regions: Vec::new() });
    }
    let policies: Vec<Arc<Policy>> = [
        (Algorithm::TokenBucket, Mode::Exact),
        (Algorithm::TokenBucket, Mode::Approximate),
        (Algorithm::SlidingWindowLog, Mode::Approximate),
        (Algorithm::Concurrency, Mode::Exact),
    ]
    .into_iter()
    .map(|(algorithm, mode)| {
        let limit = Limit::new(LimitSpec::new(algorithm, 20, Duration::from_secs(1))).unwrap();
        Arc::new(Policy::new(limit, mode))
    })
    .collect();
    let namespace = Namespace::new(b"fuzz");
    let mut frames = Vec::new();
    for round in 0..200_u64 {
        now = now.add_nanos(5_000_000);
        let node = &mut nodes[(round % 3) as usize];
        for (i, policy) in policies.iter().enumerate() {
            let key = namespace.key(format!("key-{}-{i}", round % 7).as_bytes());
            let request = CheckRequest { id: RequestId(round), key, policy: Arc::clone(policy), cost: 1 };
            let _ = node.handle_check(now, request);
            // Refunds and charges too: their own section of the frame.
            let adjustment = if round % 2 == 0 { Adjustment::Refund } else { Adjustment::Charge };
            let adjust =
                AdjustRequest { id: RequestId(round), key, policy: Arc::clone(policy), adjustment, hits: 1 };
            let _ = node.handle_adjust(now, adjust);
        }
        for node in &mut nodes {
            node.handle_timeout(now);
        }
        let mut sent = Vec::new();
        for node in &mut nodes {
            while let Some(transmit) = node.poll_transmit() {
                sent.push((node.id(), transmit));
            }
            while node.poll_event().is_some() {}
        }
        for (from, transmit) in sent {
            let to = &mut nodes[(transmit.to.0 - 1) as usize];
            to.handle_frame(now, from, &transmit.bytes);
            if frames.len() < 2000 {
                frames.push((from, transmit.bytes));
            }
        }
    }
    frames
}

#[test]
fn the_peer_frame_decoder_survives_mutated_and_random_input() {
    let mut rng = rng("frames");
    let corpus = frame_corpus();
    assert!(corpus.len() > 100, "the cores exchanged frames: {}", corpus.len());
    let with_adjustments = corpus
        .iter()
        .filter(|(_, bytes)| decode(bytes, FRAME_LEN_MAX_DEFAULT).is_ok_and(|f| !f.body.adjust.is_empty()))
        .count();
    assert!(with_adjustments > 0, "the corpus has frames with refunds and charges");
    for (_, bytes) in &corpus {
        let frame = decode(bytes, FRAME_LEN_MAX_DEFAULT).expect("a sent frame decodes");
        assert_eq!(&encode(&frame, FRAME_LEN_MAX_DEFAULT).unwrap(), bytes, "canonical");
    }
    let mut receiver =
        ratemesh_core::Node::new(NodeId(1), 1, NodeConfig::default(), 7, ratemesh_core::Instant::ZERO)
            .expect("the default config is valid");
    let ids = vec![NodeId(1), NodeId(2), NodeId(3)];
    receiver.handle_membership(
        ratemesh_core::Instant::ZERO,
        MemberView { live: ids, dead: Vec::new(), regions: Vec::new() },
    );
    let (mut inputs, mut decoded) = (0_u64, 0_u64);
    let deadline = Instant::now() + budget();
    while inputs < INPUTS_MAX && Instant::now() < deadline {
        inputs += 1;
        let (from, base) = &corpus[rng.random_range(0..corpus.len())];
        let bytes = if rng.random_range(0..10) == 0 {
            (0..rng.random_range(0..256)).map(|_| rng.random()).collect()
        } else {
            mutate(base, &mut rng)
        };
        if let Ok(frame) = decode(&bytes, FRAME_LEN_MAX_DEFAULT) {
            decoded += 1;
            assert_eq!(
                encode(&frame, FRAME_LEN_MAX_DEFAULT).unwrap(),
                bytes,
                "decode accepted a non-canonical encoding"
            );
        }
        let now = ratemesh_core::Instant::from_nanos(inputs * 1_000_000);
        receiver.handle_frame(now, *from, &bytes);
        receiver.handle_timeout(now);
        while receiver.poll_transmit().is_some() {}
        while receiver.poll_event().is_some() {}
    }
    println!("frames: {inputs} inputs ({} corpus frames), {decoded} decoded", corpus.len());
}
