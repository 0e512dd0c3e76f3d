//! What the library adds to a check, and what an exact-mode check costs across the network.
//!
//! Run: `cargo bench -p ratemesh --bench node` (prints its summary at the end; criterion's
//! reports land in `target/criterion/library_*`).
//!
//! 1. **Approximate-mode check, library vs core** (criterion, same harness as the core's
//!    `check` bench), approximate token buckets on 10 000 keys picked by a deterministic
//!    xorshift, all populated before timing:
//!    - `core`: `ratemesh_core::Node::handle_check` with `now` from a counter (the core alone);
//!    - `core_clock`: the same plus one `std::time::Instant` read per check (what any driver pays);
//!    - `library_check_now`: `ratemesh::Node::check_now` (lock, clock, core, drain outputs,
//!      top keys);
//!    - `library_check_now_no_top`: the same with top keys off (`TopConfig::policies_max` 0);
//!    - `library_check`: `ratemesh::Node::check` awaited on a current-thread runtime (decided
//!      locally, so the future completes at its first poll);
//!    - `top_record`: counting one check in the top-keys sketches (`ratemesh::top::TopTable`),
//!      which both library checks include.
//!
//!    Goal: `check_now` within 1.3 × `core_clock`. The policy is audited; `BENCH_AUDIT_OFF=1`
//!    measures it unaudited. On a machine whose speed moves between seconds, criterion's
//!    one-after-the-other timings compare little: the same comparison follows in interleaved
//!    rounds (`check_now_cost`: `check_now` with and without top keys against the core with a
//!    clock read, its timers run but left out of its time, the median of the rounds' ratios);
//!    `BENCH_CHECK_ONLY=1` runs that alone.
//!
//!    Then what the audit adds to the core's check (the owner counts every check into the key's
//!    open window: `ratemesh_core`'s `audit.rs`): the same core with the policy audited and with
//!    `Audit::Off`, `AUDIT_ROUNDS` interleaved rounds of `AUDIT_CHECKS` checks each, the median of
//!    the rounds' ratios (interleaved, so that a busy machine weighs on both alike). Goal ≤ 1.1.
//!    `BENCH_AUDIT_ONLY=1` runs this alone.
//!
//!    Then the throughput of `check_now` on 2 threads over 1 thread at 1, 2, 4 and 8 lanes
//!    (`NodeBuilder::lanes`; goal ≥ 1.7), both threads over every key, over disjoint halves of
//!    the keys (every lane), and each thread over the keys of its own lanes (`Node::lane_of`, as
//!    a dispatcher routing keys to per-lane threads would): each lane is behind its own lock, so
//!    two threads contend only when their keys fall in the same lane, and share cache lines only
//!    when they check keys of the same lanes. Beside it, the same two-thread ratios for
//!    governor's keyed limiter (`DashMap`, an atomic state per key) on the same keys: what a
//!    lock-free keyed limiter gets from a second thread on this machine.
//! 2. **Exact-mode forwarded checks between two nodes on loopback** (real QUIC with mutual TLS):
//!    every key is owned by the other node. Latency p50/p99 of one check at a time (`REPEATS` runs
//!    of `SEQUENTIAL_CHECKS`, medians of the percentiles), and throughput with `IN_FLIGHT` checks
//!    in flight, with the mean forward batch length from the node's counters (batches form
//!    under load), beside the loopback round trip of a UDP datagram between two tokio tasks on the
//!    same runtime, measured in the same run (the floor any peer protocol pays), and of a message
//!    over bare quinn the way the transport sends frames (a unidirectional stream each way, no
//!    node: the floor of QUIC on this runtime). Goals: mean batch
//!    ≥ 8 at 64 in flight (forwards wait for the answer to the batch in flight to their owner, see
//!    the core's `exact.rs`); p50 of a lone check ≤ 2 × the loopback round trip.
//! 3. **Check latency under a sync-heavy load**: two nodes on loopback, approximate mode,
//!    `SYNC_KEYS` keys; one thread times `check_now` at one node over `SYNC_CHECKS` random keys
//!    (decided or `WouldWait`: both take the node's lock), so every sync round has work for tens of
//!    thousands of keys (reports, own allowances, replicas). Latency p50/p99/p99.9/max with the
//!    round in one piece (`NodeConfig::sync_slice_len_max` unbounded) and in the default slices,
//!    `REPEATS` interleaved pairs, medians. Goal: no check waits behind a whole round (the sliced
//!    max and count of checks over a millisecond well below the one-piece ones; p99.9 rises, as
//!    many checks wait for one slice instead of a few for a whole round).

#![allow(missing_docs, clippy::unwrap_used)] // criterion_group! defines an undocumented `pub fn`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use criterion::Criterion;
use ratemesh::{ClusterSecurity, MemberStatus, NamedPolicy, NodeBuilder, NodeId, TopConfig};
use ratemesh_core::{
    Algorithm, Audit, CheckRequest, Fallback, Instant, KeyHash, Limit, LimitSpec, Mode, NodeConfig, Policy,
    PolicyRegion, RequestId,
};
use tokio::runtime::Runtime;

const KEYS: usize = 10_000;
const AUDIT_ROUNDS: usize = 21;
const AUDIT_CHECKS: usize = 200_000;
const SEQUENTIAL_CHECKS: usize = 2_000;
const CONCURRENT_CHECKS: usize = 40_000;
const IN_FLIGHT: usize = 64;
const REPEATS: usize = 5;
/// The lane counts whose thread scaling is measured (`NodeBuilder::lanes`).
const LANE_COUNTS: [usize; 4] = [1, 2, 4, 8];
const SECRET: &str = "benchmark cluster secret, 16+";

fn policy(mode: Mode) -> NamedPolicy {
    // Allowed for the whole run (a burst of a billion) and never back to fresh (1 token per second
    // refills less than a key's share of the checks), so that neither side spends its time
    // re-inserting keys that a sync round swept as fresh: core and library do the same work.
    let spec = LimitSpec::new(Algorithm::TokenBucket, 1, Duration::from_secs(1)).with_burst(1_000_000_000);
    NamedPolicy::new(
        "bench",
        Policy {
            limit: Limit::new(spec).unwrap(),
            mode,
            fallback: Fallback::LocalShare,
            // `BENCH_AUDIT_OFF=1`: the policy unaudited (what the audit adds to `check_now`).
            audit: match std::env::var_os("BENCH_AUDIT_OFF") {
                Some(_) => Audit::Off,
                None => Audit::default(),
            },
            region: PolicyRegion::default(),
        },
    )
}

fn keys() -> Vec<Vec<u8>> {
    (0..KEYS).map(|i| format!("client-{i}").into_bytes()).collect()
}

/// A deterministic index sequence over the keys.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self, len: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % len as u64) as usize
    }
}

fn approximate_check(c: &mut Criterion, runtime: &Runtime) {
    let policy = policy(Mode::Approximate);
    let keys = keys();
    let hashes: Vec<KeyHash> = keys.iter().map(|k| policy.key(k)).collect();
    let shared = Arc::new(policy.policy().clone());
    let mut group = c.benchmark_group("library_approx_10k_keys");

    let mut core = ratemesh_core::Node::new(NodeId(1), 1, NodeConfig::default(), 7, Instant::ZERO)
        .expect("the default config is valid");
    let mut nanos = 0u64;
    let request =
        |i: usize| CheckRequest { id: RequestId(0), key: hashes[i], policy: shared.clone(), cost: 1 };
    for i in 0..KEYS {
        let _ = core.handle_check(Instant::from_nanos(0), request(i));
    }
    let mut pick = XorShift(0x2545_f491_4f6c_dd1d);
    group.bench_function("core", |b| {
        b.iter(|| {
            nanos += 50;
            let i = pick.next(KEYS);
            // The key's hash is part of the library's per-check work: pay it here too.
            let key = policy.key(&keys[i]);
            let req = CheckRequest { id: RequestId(0), key, policy: shared.clone(), cost: 1 };
            black_box(core.handle_check(Instant::from_nanos(nanos), req))
        })
    });
    let origin = std::time::Instant::now();
    group.bench_function("core_clock", |b| {
        b.iter(|| {
            let now = Instant::from_nanos(origin.elapsed().as_nanos() as u64);
            let i = pick.next(KEYS);
            let key = policy.key(&keys[i]);
            let req = CheckRequest { id: RequestId(0), key, policy: shared.clone(), cost: 1 };
            black_box(core.handle_check(now, req))
        })
    });

    let node = runtime.block_on(builder(1).start()).unwrap();
    for key in &keys {
        node.check_now(&policy, key, 1).unwrap();
    }
    group.bench_function("library_check_now", |b| {
        b.iter(|| black_box(node.check_now(&policy, &keys[pick.next(KEYS)], 1).unwrap()))
    });
    // The same without top keys (`TopConfig::policies_max` 0): the library's own cost.
    let untracked = TopConfig { policies_max: 0, ..TopConfig::default() };
    let plain = runtime.block_on(builder(3).top_config(untracked).start()).unwrap();
    for key in &keys {
        plain.check_now(&policy, key, 1).unwrap();
    }
    group.bench_function("library_check_now_no_top", |b| {
        b.iter(|| black_box(plain.check_now(&policy, &keys[pick.next(KEYS)], 1).unwrap()))
    });
    runtime.block_on(plain.shutdown());
    let local = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    group.bench_function("library_check", |b| {
        b.iter(|| black_box(local.block_on(node.check(&policy, &keys[pick.next(KEYS)], 1)).unwrap()))
    });
    // What counting a check in the top-keys sketches adds (part of both library checks above).
    let (top, mut shard) =
        (ratemesh::top::TopTable::new(TopConfig::default()), ratemesh::top::TopShard::default());
    group.bench_function("top_record", |b| {
        b.iter(|| {
            nanos += 50;
            let i = pick.next(KEYS);
            let label = ratemesh::TopLabel { policy: "bench", key: &keys[i] };
            top.record(&mut shard, Instant::from_nanos(nanos), label, Some(hashes[i]), 1, false);
        })
    });
    group.finish();
    runtime.block_on(node.shutdown());
}

/// `check_now` throughput by lane count (one row of [`lane_scaling`]).
struct LaneScaling {
    lanes: usize,
    /// Checks per second on one thread over every key.
    one_thread: f64,
    /// Two threads over every key, over one thread.
    shared: f64,
    /// Two threads over disjoint halves of the keys (every lane), over one thread: each key's
    /// state stays in one core's cache, the lanes' locks do not.
    disjoint: f64,
    /// Two threads each over the keys of its own lanes (`Node::lane_of`: even lanes, odd lanes)
    /// over one thread over every key; `None` with one lane.
    lane_affine: Option<f64>,
}

/// For each of `LANE_COUNTS`: a node with that many lanes, its `check_now` throughput on one
/// thread, and on 2 threads over 1, with threads sharing every key or each owning half the lanes
/// (medians of `REPEATS` interleaved runs).
fn lane_scaling(runtime: &Runtime) -> Vec<LaneScaling> {
    let policy = policy(Mode::Approximate);
    let keys = keys();
    LANE_COUNTS
        .iter()
        .map(|&lanes| {
            let node = runtime.block_on(builder(10 + lanes as u64).lanes(lanes).start()).unwrap();
            for key in &keys {
                node.check_now(&policy, key, 1).unwrap();
            }
            let halves: Vec<Vec<Vec<u8>>> = (0..2)
                .map(|half| {
                    keys.iter().filter(|key| node.lane_of(policy.key(key)) % 2 == half).cloned().collect()
                })
                .collect();
            let interleaved = disjoint_halves(&keys);
            let check = |key: &Vec<u8>| {
                black_box(node.check_now(&policy, key, 1).unwrap());
            };
            let mut pairs = vec![[&keys, &keys], [&interleaved[0], &interleaved[1]]];
            if lanes > 1 {
                pairs.push([&halves[0], &halves[1]]);
            }
            let (one_thread, ratios) = two_thread_ratios(&keys, &pairs, check);
            runtime.block_on(node.shutdown());
            LaneScaling {
                lanes,
                one_thread,
                shared: ratios[0],
                disjoint: ratios[1],
                lane_affine: ratios.get(2).copied(),
            }
        })
        .collect()
}

/// In-process throughput of `check`, one thread per entry of `key_sets` (each its own
/// sequence over its keys), in checks per second.
fn checks_per_s(key_sets: &[&Vec<Vec<u8>>], check: impl Fn(&Vec<u8>) + Sync) -> f64 {
    const CHECKS_PER_THREAD: usize = 400_000;
    let check = &check;
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        for (thread, keys) in key_sets.iter().enumerate() {
            scope.spawn(move || {
                let mut pick = XorShift(0x9E37_79B9_7F4A_7C15 ^ (thread as u64 + 1));
                for _ in 0..CHECKS_PER_THREAD {
                    check(&keys[pick.next(keys.len())]);
                }
            });
        }
    });
    (key_sets.len() * CHECKS_PER_THREAD) as f64 / started.elapsed().as_secs_f64()
}

/// The same scaling for governor's keyed limiter (`DashMap` shards, one atomic state per key),
/// the baseline of what any keyed in-process limiter gets from a second thread on this machine:
/// threads over every key, and over disjoint halves of the keys (each key checked by one thread).
fn governor_scaling() -> (f64, f64) {
    let keys = keys();
    let quota = governor::Quota::per_second(std::num::NonZeroU32::MIN)
        .allow_burst(std::num::NonZeroU32::new(1_000_000_000).unwrap());
    let limiter = governor::RateLimiter::keyed(quota);
    let check = |key: &Vec<u8>| {
        let _ = black_box(limiter.check_key(key));
    };
    let halves = disjoint_halves(&keys);
    // The map fills on first use: once over every key before timing.
    checks_per_s(&[&keys], check);
    let (_, ratios) = two_thread_ratios(&keys, &[[&keys, &keys], [&halves[0], &halves[1]]], check);
    (ratios[0], ratios[1])
}

/// `REPEATS` interleaved rounds of one thread over `keys`, then two threads over each pair of
/// key sets: the median checks per second of one thread, and for each pair the median of its
/// throughput over the same round's one thread.
fn two_thread_ratios(
    keys: &Vec<Vec<u8>>,
    pairs: &[[&Vec<Vec<u8>>; 2]],
    check: impl Fn(&Vec<u8>) + Sync,
) -> (f64, Vec<f64>) {
    let check = &check;
    let (mut one, mut ratios) = (Vec::new(), vec![Vec::new(); pairs.len()]);
    for _ in 0..REPEATS {
        let alone = checks_per_s(&[keys], check);
        one.push(alone);
        for (pair, ratio) in pairs.iter().zip(&mut ratios) {
            ratio.push(checks_per_s(pair, check) / alone);
        }
    }
    (median(one), ratios.into_iter().map(median).collect())
}

/// The keys in two halves, alternately (whatever their lanes).
fn disjoint_halves(keys: &[Vec<u8>]) -> Vec<Vec<Vec<u8>>> {
    (0..2).map(|half| keys.iter().skip(half).step_by(2).cloned().collect()).collect()
}

fn builder(id: u64) -> NodeBuilder {
    NodeBuilder::new(NodeId(id)).security(ClusterSecurity::from_secret(SECRET).unwrap())
}

/// Percentile `p` (0..=100) of sorted durations.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() - 1) * p / 100]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

const SYNC_KEYS: usize = 100_000;
const SYNC_CHECKS: usize = 1_500_000;

/// Latency percentiles of checks, in microseconds (p50, p99, p99.9, max), the checks that took
/// a millisecond or more, and the reports and replicas the loaded node sent per sync round
/// meanwhile (how heavy its rounds were).
type Percentiles = [f64; 6];

/// Two nodes, `check_now` timed at one of them under a sync-heavy load (section 3), for each
/// slice bound: the medians over `REPEATS` interleaved runs.
fn sync_heavy_latency(slice_bounds: &[usize]) -> Vec<Percentiles> {
    // The nodes on one worker, the timing thread on the other core: what a check waits for is the
    // lock, not a core.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let policy = policy(Mode::Approximate);
    let keys: Vec<Vec<u8>> = (0..SYNC_KEYS).map(|i| format!("sync-{i}").into_bytes()).collect();
    let mut runs: Vec<Vec<Percentiles>> = vec![vec![]; slice_bounds.len()];
    for _ in 0..REPEATS {
        for (bound, runs) in slice_bounds.iter().zip(&mut runs) {
            let config = NodeConfig { sync_slice_len_max: *bound, ..NodeConfig::default() };
            let (loaded, other) = runtime.block_on(pair(|id| builder(id).node_config(config.clone())));
            runs.push(time_checks(&loaded, &policy, &keys));
            runtime.block_on(loaded.shutdown());
            runtime.block_on(other.shutdown());
        }
    }
    runs.into_iter()
        .map(|runs| core::array::from_fn(|i| median(runs.iter().map(|run| run[i]).collect())))
        .collect()
}

/// Times `SYNC_CHECKS` checks over `keys` at `node` from this thread, after a second of warm-up
/// (owners learn the demand and grant allowances).
fn time_checks(node: &ratemesh::Node, policy: &NamedPolicy, keys: &[Vec<u8>]) -> Percentiles {
    let mut pick = XorShift(0x2545_f491_4f6c_dd1d);
    let warm_until = std::time::Instant::now() + Duration::from_secs(1);
    while std::time::Instant::now() < warm_until {
        black_box(node.check_now(policy, &keys[pick.next(keys.len())], 1)).ok();
    }
    let before = node.metrics().protocol;
    let mut latencies = Vec::with_capacity(SYNC_CHECKS);
    for _ in 0..SYNC_CHECKS {
        let key = &keys[pick.next(keys.len())];
        let started = std::time::Instant::now();
        black_box(node.check_now(policy, key, 1)).ok();
        latencies.push(started.elapsed());
    }
    let after = node.metrics().protocol;
    let sent = (after.reports_sent + after.replicas_sent) - (before.reports_sent + before.replicas_sent);
    let per_round = sent as f64 / (after.sync_rounds - before.sync_rounds).max(1) as f64;
    latencies.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let p999 = latencies[(latencies.len() - 1) * 999 / 1000];
    let max = latencies[latencies.len() - 1];
    let slow = latencies.iter().filter(|&&latency| latency >= Duration::from_millis(1)).count();
    [
        us(percentile(&latencies, 50)),
        us(percentile(&latencies, 99)),
        us(p999),
        us(max),
        slow as f64,
        per_round,
    ]
}

/// Starts two nodes (ids 1 and 2, the second seeded with the first) and waits until both see
/// each other and serve.
async fn pair(builder: impl Fn(u64) -> NodeBuilder) -> (ratemesh::Node, ratemesh::Node) {
    let first = builder(1).start().await.unwrap();
    let second = builder(2).seeds([first.gossip_addr()]).start().await.unwrap();
    for node in [&first, &second] {
        let mut members = node.subscribe_members();
        let live =
            |m: &Vec<ratemesh::Member>| m.iter().filter(|m| m.status == MemberStatus::Live).count() == 2;
        tokio::time::timeout(Duration::from_secs(30), members.wait_for(live)).await.unwrap().unwrap();
        // A seeded node serves once its join grace has passed.
        node.wait_serving().await;
    }
    (second, first)
}

struct ExactResult {
    p50_us: f64,
    p99_us: f64,
    throughput_per_s: f64,
    batch_len_mean: f64,
}

async fn exact_forwarded() -> ExactResult {
    let (client, owner) = pair(builder).await;
    let policy = policy(Mode::Exact);
    let keys: Vec<Vec<u8>> =
        keys().into_iter().filter(|k| client.owner_of(policy.key(k)) == Some(NodeId(1))).take(1000).collect();
    // Warm up the connection and the owner's keys.
    for key in &keys {
        client.check(&policy, key, 1).await.unwrap();
    }
    let (mut p50s, mut p99s, mut rates, mut batch_lens) = (vec![], vec![], vec![], vec![]);
    for _ in 0..REPEATS {
        let mut latencies = Vec::with_capacity(SEQUENTIAL_CHECKS);
        for i in 0..SEQUENTIAL_CHECKS {
            let started = std::time::Instant::now();
            black_box(client.check(&policy, &keys[i % keys.len()], 1).await.unwrap());
            latencies.push(started.elapsed());
        }
        latencies.sort_unstable();
        p50s.push(percentile(&latencies, 50).as_secs_f64() * 1e6);
        p99s.push(percentile(&latencies, 99).as_secs_f64() * 1e6);

        let before = client.metrics().protocol;
        let started = std::time::Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..IN_FLIGHT {
            let (client, policy, keys) = (client.clone(), policy.clone(), keys.clone());
            tasks.spawn(async move {
                for i in (worker..CONCURRENT_CHECKS).step_by(IN_FLIGHT) {
                    black_box(client.check(&policy, &keys[i % keys.len()], 1).await.unwrap());
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        rates.push(CONCURRENT_CHECKS as f64 / started.elapsed().as_secs_f64());
        let after = client.metrics().protocol;
        let batches = (after.forward_batches - before.forward_batches).max(1);
        batch_lens.push((after.forwarded - before.forwarded) as f64 / batches as f64);
        assert_eq!(after.forward_timeouts, 0, "a forwarded check timed out");
    }
    client.shutdown().await;
    owner.shutdown().await;
    ExactResult {
        p50_us: median(p50s),
        p99_us: median(p99s),
        throughput_per_s: median(rates),
        batch_len_mean: median(batch_lens),
    }
}

/// The median round trip of one datagram over loopback between two tokio tasks (an echo).
async fn loopback_round_trip_us() -> f64 {
    let echo = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let client = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client.connect(echo.local_addr().unwrap()).await.unwrap();
    let echoing = tokio::spawn(async move {
        let mut buffer = [0u8; 64];
        for _ in 0..SEQUENTIAL_CHECKS + 100 {
            let (len, from) = echo.recv_from(&mut buffer).await.unwrap();
            echo.send_to(&buffer[..len], from).await.unwrap();
        }
    });
    let mut round_trips = Vec::with_capacity(SEQUENTIAL_CHECKS + 100);
    let mut buffer = [0u8; 64];
    for i in 0..SEQUENTIAL_CHECKS + 100 {
        let started = std::time::Instant::now();
        client.send(&(i as u64).to_le_bytes()).await.unwrap();
        client.recv(&mut buffer).await.unwrap();
        // The first hundred warm up.
        if i >= 100 {
            round_trips.push(started.elapsed());
        }
    }
    echoing.await.unwrap();
    round_trips.sort_unstable();
    percentile(&round_trips, 50).as_secs_f64() * 1e6
}

/// The median round trip of one message over bare quinn on loopback, as the node's transport
/// sends frames (a unidirectional stream per message, each way) but with no node around it:
/// the floor of a forwarded check over QUIC on this runtime, measured beside the UDP echo.
async fn quic_round_trip_us() -> f64 {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = rustls_pki_types::CertificateDer::from(certified.cert);
    let key = rustls_pki_types::PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let server_config = quinn::ServerConfig::with_single_cert(vec![cert.clone()], key.into()).unwrap();
    let server = quinn::Endpoint::server(server_config, "127.0.0.1:0".parse().unwrap()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    client.set_default_client_config(quinn::ClientConfig::with_root_certificates(Arc::new(roots)).unwrap());
    let addr = server.local_addr().unwrap();
    let echoing = tokio::spawn(async move {
        let at_server = server.accept().await.unwrap().await.unwrap();
        for _ in 0..SEQUENTIAL_CHECKS + 100 {
            let mut stream = at_server.accept_uni().await.unwrap();
            let message = stream.read_to_end(64).await.unwrap();
            let mut answer = at_server.open_uni().await.unwrap();
            answer.write_all(&message).await.unwrap();
            answer.finish().unwrap();
        }
        at_server
    });
    let at_client = client.connect(addr, "localhost").unwrap().await.unwrap();
    let mut round_trips = Vec::with_capacity(SEQUENTIAL_CHECKS + 100);
    for i in 0..SEQUENTIAL_CHECKS + 100 {
        let started = std::time::Instant::now();
        let mut stream = at_client.open_uni().await.unwrap();
        stream.write_all(&(i as u64).to_le_bytes()).await.unwrap();
        stream.finish().unwrap();
        let mut answer = at_client.accept_uni().await.unwrap();
        answer.read_to_end(64).await.unwrap();
        // The first hundred warm up.
        if i >= 100 {
            round_trips.push(started.elapsed());
        }
    }
    let at_server = echoing.await.unwrap();
    at_client.close(0u32.into(), b"done");
    at_server.closed().await;
    round_trips.sort_unstable();
    percentile(&round_trips, 50).as_secs_f64() * 1e6
}

/// Where criterion writes its reports (cargo's target directory, as for the core's bench).
fn criterion_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"), PathBuf::from);
    target.join("criterion")
}

/// Criterion's median estimate of one benchmark of the approximate group, in nanoseconds.
fn median_nanos(function: &str) -> Option<f64> {
    let path = criterion_dir().join("library_approx_10k_keys").join(function).join("new/estimates.json");
    let estimates: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    estimates["median"]["point_estimate"].as_f64()
}

fn print_approximate_summary() {
    let functions = [
        "core",
        "core_clock",
        "library_check_now",
        "library_check_now_no_top",
        "library_check",
        "top_record",
    ];
    let medians: Vec<Option<f64>> = functions.iter().map(|f| median_nanos(f)).collect();
    println!(
        "\napproximate mode, 10k keys, median ns per check (ratio to `core_clock`, the core with a clock read):"
    );
    println!("| {} |", functions.join(" | "));
    println!("|{}", "---|".repeat(functions.len()));
    let cells: Vec<String> = medians
        .iter()
        .map(|m| match (m, medians[1]) {
            (Some(m), Some(core_clock)) => format!("{m:.1} ({:.2}×)", m / core_clock),
            _ => "n/a".to_owned(),
        })
        .collect();
    println!("| {} |", cells.join(" | "));
}

/// What [`check_now_cost`] measured, medians of its interleaved rounds.
struct CheckNowCost {
    /// `check_now` over the core with a clock read.
    ratio: f64,
    /// `check_now` with top keys off over the same.
    ratio_no_top: f64,
    core_ns: f64,
    library_ns: f64,
}

/// The library's `check_now` (with and without top keys) over the core's check with a clock read:
/// `AUDIT_ROUNDS` interleaved rounds on the same keys and policy, so that a busy machine weighs on
/// all alike. The core runs its timers as it asks (its sync rounds close the audit's windows), but
/// their time is left out of its figure, as the library runs them on its timer task, not in
/// `check_now`: the comparison is of the checks alone.
fn check_now_cost(runtime: &Runtime) -> CheckNowCost {
    let keys = keys();
    let policy = policy(Mode::Approximate);
    let shared = Arc::new(policy.policy().clone());
    let mut core = ratemesh_core::Node::new(NodeId(1), 1, NodeConfig::default(), 7, Instant::ZERO).unwrap();
    let origin = std::time::Instant::now();
    let mut core_round = |checks: usize| {
        let mut pick = XorShift(0x2545_f491_4f6c_dd1d);
        let mut timers = Duration::ZERO;
        let started = std::time::Instant::now();
        for _ in 0..checks {
            let now = Instant::from_nanos(origin.elapsed().as_nanos() as u64);
            let key = policy.key(&keys[pick.next(KEYS)]);
            let request = CheckRequest { id: RequestId(0), key, policy: shared.clone(), cost: 1 };
            black_box(core.handle_check(now, request));
            if core.poll_timeout().is_some_and(|t| t <= now) {
                // Rare (a sync round per interval): timed apart, left out.
                let timer_started = std::time::Instant::now();
                core.handle_timeout(now);
                timers += timer_started.elapsed();
            }
        }
        (started.elapsed() - timers).as_nanos() as f64 / checks as f64
    };
    let untracked = TopConfig { policies_max: 0, ..TopConfig::default() };
    let nodes = [builder(1), builder(3).top_config(untracked)].map(|b| runtime.block_on(b.start()).unwrap());
    let library_round = |node: &ratemesh::Node, checks: usize| {
        let mut pick = XorShift(0x2545_f491_4f6c_dd1d);
        let started = std::time::Instant::now();
        for _ in 0..checks {
            black_box(node.check_now(&policy, &keys[pick.next(KEYS)], 1).unwrap());
        }
        started.elapsed().as_nanos() as f64 / checks as f64
    };
    core_round(KEYS * 4);
    for node in &nodes {
        library_round(node, KEYS * 4);
    }
    let mut rounds = Vec::new();
    for _ in 0..AUDIT_ROUNDS {
        let core_ns = core_round(AUDIT_CHECKS);
        let [library_ns, no_top_ns] = [0, 1].map(|i| library_round(&nodes[i], AUDIT_CHECKS));
        rounds.push([library_ns / core_ns, no_top_ns / core_ns, core_ns, library_ns]);
    }
    for node in nodes {
        runtime.block_on(node.shutdown());
    }
    let column = |i: usize| median(rounds.iter().map(|round| round[i]).collect());
    CheckNowCost { ratio: column(0), ratio_no_top: column(1), core_ns: column(2), library_ns: column(3) }
}

/// The core's check with the audit on over the same with it off: medians of interleaved rounds
/// (with the nanoseconds per check of each).
fn audit_cost() -> (f64, f64, f64) {
    let keys = keys();
    let audited = policy(Mode::Approximate);
    let hashes: Vec<KeyHash> = keys.iter().map(|k| audited.key(k)).collect();
    let on = Arc::new(Policy { audit: Audit::default(), ..audited.policy().clone() });
    let off = Arc::new(Policy { audit: Audit::Off, ..audited.policy().clone() });
    let mut nodes = [on, off].map(|policy| {
        let node = ratemesh_core::Node::new(NodeId(1), 1, NodeConfig::default(), 7, Instant::ZERO).unwrap();
        (node, policy, 0u64)
    });
    let round = |(node, policy, nanos): &mut (ratemesh_core::Node, Arc<Policy>, u64), checks: usize| {
        let mut pick = XorShift(0x2545_f491_4f6c_dd1d);
        let started = std::time::Instant::now();
        for _ in 0..checks {
            *nanos += 50;
            let key = hashes[pick.next(KEYS)];
            let request = CheckRequest { id: RequestId(0), key, policy: policy.clone(), cost: 1 };
            black_box(node.handle_check(Instant::from_nanos(*nanos), request));
            // The sync rounds (the audit closes its windows there) run as the node asks.
            if node.poll_timeout().is_some_and(|t| t <= Instant::from_nanos(*nanos)) {
                node.handle_timeout(Instant::from_nanos(*nanos));
            }
        }
        started.elapsed().as_nanos() as f64 / checks as f64
    };
    for node in &mut nodes {
        round(node, KEYS * 4);
    }
    let (mut ratios, mut on_ns, mut off_ns) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..AUDIT_ROUNDS {
        let [audit_on, audit_off] = &mut nodes;
        let (a, b) = (round(audit_on, AUDIT_CHECKS), round(audit_off, AUDIT_CHECKS));
        ratios.push(a / b);
        on_ns.push(a);
        off_ns.push(b);
    }
    (median(ratios), median(on_ns), median(off_ns))
}

fn print_check_now_cost(runtime: &Runtime) {
    let cost = check_now_cost(runtime);
    println!(
        "check_now over the core with a clock read (10k keys, medians of {AUDIT_ROUNDS} interleaved rounds): {:.0} ns over {:.0} ns: {:.3} × (top keys off: {:.3} ×)",
        cost.library_ns, cost.core_ns, cost.ratio, cost.ratio_no_top
    );
}

fn main() {
    if std::env::var_os("BENCH_AUDIT_ONLY").is_some() {
        let (ratio, on_ns, off_ns) = audit_cost();
        println!("the audit in the core's check: {on_ns:.0} ns on, {off_ns:.0} ns off: {ratio:.3} ×");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    if std::env::var_os("BENCH_CHECK_ONLY").is_some() {
        return print_check_now_cost(&runtime);
    }
    let mut criterion = Criterion::default().output_directory(&criterion_dir()).configure_from_args();
    approximate_check(&mut criterion, &runtime);
    criterion.final_summary();
    print_approximate_summary();
    print_check_now_cost(&runtime);
    let (ratio, on_ns, off_ns) = audit_cost();
    println!(
        "
the audit in the core's check (10k keys, medians of {AUDIT_ROUNDS} interleaved rounds): {on_ns:.0} ns on, {off_ns:.0} ns off: {ratio:.3} ×"
    );
    println!("\nin-process check_now throughput by lanes (10k keys, medians of {REPEATS}):");
    println!(
        "| lanes | 1 thread: checks/s | 2 threads / 1, every key | disjoint halves of the keys | 2 lane-affine threads / 1 |"
    );
    println!("|---|---|---|---|---|");
    for row in lane_scaling(&runtime) {
        let affine = row.lane_affine.map_or_else(|| "—".to_owned(), |ratio| format!("{ratio:.2}"));
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {affine} |",
            row.lanes, row.one_thread, row.shared, row.disjoint
        );
    }
    let (governor_shared, governor_disjoint) = governor_scaling();
    println!(
        "governor keyed, 2 threads / 1 (same keys, medians of {REPEATS}): every key {governor_shared:.2}, disjoint halves {governor_disjoint:.2}"
    );
    let exact = runtime.block_on(exact_forwarded());
    let round_trip_us = runtime.block_on(loopback_round_trip_us());
    let quic_us = runtime.block_on(quic_round_trip_us());
    println!("\nexact mode, forwarded to the owner over QUIC on loopback (medians of {REPEATS} runs):");
    println!(
        "| one at a time p50 (× UDP loopback round trip) | bare quinn round trip p50 (× UDP) | p99 | {IN_FLIGHT} in flight: checks/s | mean batch |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| {:.0} µs ({:.2} × {round_trip_us:.0} µs) | {quic_us:.0} µs ({:.2} ×) | {:.0} µs | {:.0} | {:.1} |",
        exact.p50_us,
        exact.p50_us / round_trip_us,
        quic_us / round_trip_us,
        exact.p99_us,
        exact.throughput_per_s,
        exact.batch_len_mean
    );
    let bounds = [usize::MAX, NodeConfig::default().sync_slice_len_max];
    let latencies = sync_heavy_latency(&bounds);
    println!(
        "\ncheck_now latency under a sync-heavy load ({SYNC_KEYS} keys, 2 nodes, medians of {REPEATS} runs):"
    );
    println!("| sync round | p50 | p99 | p99.9 | max | checks ≥ 1 ms | reports + replicas per round |");
    println!("|---|---|---|---|---|---|---|");
    for (bound, [p50, p99, p999, max, slow, per_round]) in bounds.iter().zip(latencies) {
        let round =
            if *bound == usize::MAX { "one piece".to_owned() } else { format!("slices of {bound} keys") };
        println!(
            "| {round} | {p50:.1} µs | {p99:.1} µs | {p999:.1} µs | {max:.0} µs | {slow:.0} | {per_round:.0} |"
        );
    }
}
