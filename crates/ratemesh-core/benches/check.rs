//! Cost of one rate-limit check: ratemesh-core's `Store` against governor 0.10 and a naive
//! `Mutex<HashMap<String, TokenBucket>>`, all token buckets, all keyed by a string that each check
//! hashes, on one hot key, on 10 000 keys and on 1 000 000 keys.
//!
//! Run: `cargo bench -p ratemesh-core --bench check`, then
//! `python3 crates/ratemesh-core/benches/ratios.py` for the table of medians and ratios.
//!
//! What each variant pays per check:
//! - `ours`: `Namespace::key` (XXH3-128 of the string key) + `Store::check`, with `now` taken from
//!   a counter. The core never reads a clock (it is sans-IO), so this is the cost of the core alone.
//!   It returns the full `Decision` (remaining, reset, retry-after) to `black_box`; governor's
//!   default middleware returns `Result<(), NotUntil>`.
//! - `ours_clock`: the same plus `std::time::Instant::now()` converted to our `Instant`, once per
//!   check. This is the fair comparison with governor: governor pays its clock read inside every
//!   check (the field notes say 17–28 ns for a clock read on these machines), and our embedding
//!   library will also read a clock once per check. Measured on a 2-core EPYC VM: `std` ~31–35 ns
//!   (vDSO `clock_gettime`, whose ordered TSC read also stops consecutive checks' cache misses from
//!   overlapping), quanta ~12–15 ns (a plain `rdtsc`).
//! - `ours_quanta`: the same with governor's own clock (`governor::clock::QuantaClock`, TSC-based)
//!   instead of `std::time::Instant`, so that both sides pay the very same clock read.
//! - `ours_mutex_clock`: `ours_clock` through an uncontended `Mutex<Store>`, since `Store::check`
//!   takes `&mut self` while governor's limiters are `&self` (atomics and DashMap shard locks).
//! - `governor_keyed`: `RateLimiter::keyed` (DashMap, `String` keys, std `RandomState` hasher),
//!   `check_key`; it reads its clock per check. `governor_direct`: `RateLimiter::direct`, no key.
//! - `naive`: `Mutex<HashMap<String, TokenBucket>>` with `f64` tokens refilled on read, like the
//!   seed article's Python; it takes `now` from the same counter as `ours` (no clock read).
//!
//! Multi-key runs pick keys with a deterministic xorshift from a pre-built `Vec<String>`, and
//! every store is populated with every key before timing, so each timed check finds its key.

#![allow(missing_docs)] // criterion_group! defines an undocumented `pub fn`.

use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime};
use governor::clock::{Clock as _, QuantaClock, QuantaInstant, Reference as _};
use governor::{Quota, RateLimiter};
use ratemesh_core::{Algorithm, Instant, Limit, LimitSpec, Namespace, Store, StoreConfig};

/// How far the counter clock of `ours` and `naive` moves per check: about the real pace of one
/// check, so that refill behaves roughly as under a real clock.
const TICK_NANOS: u64 = 50;

/// A token bucket limit: `rate` per second, capacity `burst`.
#[derive(Clone, Copy)]
struct Params {
    rate: u32,
    burst: u32,
}

/// Mostly allowed: refills one token every 10 ns, faster than any variant checks, so even the hot
/// key under a real clock stays admitted. (At 1 M/s a real-clock hot key checked every ~50–100 ns
/// gets one token per 1 µs, so ~90 % of its checks would be refused.)
const ALLOWED: Params = Params { rate: 100_000_000, burst: 1000 };
/// Mostly refused: after the first 1000 checks, one admitted per millisecond.
const REFUSED: Params = Params { rate: 1000, burst: 1000 };

fn our_limit(p: Params) -> Limit {
    let spec = LimitSpec::new(Algorithm::TokenBucket, u64::from(p.rate), Duration::from_secs(1))
        .with_burst(u64::from(p.burst));
    Limit::new(spec).expect("valid limit")
}

fn quota(p: Params) -> Quota {
    let nonzero = |n| NonZeroU32::new(n).expect("nonzero");
    Quota::per_second(nonzero(p.rate)).allow_burst(nonzero(p.burst))
}

fn new_store() -> Store {
    Store::new(StoreConfig { keys_max: 4_000_000, ..StoreConfig::default() }, 7)
}

/// Deterministic key picker (xorshift64), cheap enough not to blur the comparison; every variant
/// of a multi-key run pays it the same.
struct Picker(u64);

impl Picker {
    fn new() -> Picker {
        Picker(0x9e37_79b9_7f4a_7c15)
    }

    #[inline]
    fn pick(&mut self, len: usize) -> usize {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        // Multiply-shift into 0..len (len < 2^32).
        (((x >> 32) * len as u64) >> 32) as usize
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce5_e9b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `n` distinct keys like `user:3f2a…` (21 bytes), pseudo-random but deterministic.
fn make_keys(n: usize) -> Vec<String> {
    (0..n as u64).map(|i| format!("user:{:016x}", splitmix64(i))).collect()
}

/// The seed article's token bucket: `f64` tokens, refilled on read.
struct NaiveBucket {
    tokens: f64,
    last_refill: f64,
}

struct Naive {
    capacity: f64,
    refill_rate: f64,
    buckets: Mutex<HashMap<String, NaiveBucket>>,
}

impl Naive {
    fn new(p: Params) -> Naive {
        Naive {
            capacity: f64::from(p.burst),
            refill_rate: f64::from(p.rate),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// `now` in seconds.
    fn allow(&self, key: &str, now: f64) -> bool {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(key) {
            return self.take(bucket, now);
        }
        let bucket =
            buckets.entry(key.to_owned()).or_insert(NaiveBucket { tokens: self.capacity, last_refill: now });
        self.take(bucket, now)
    }

    fn take(&self, bucket: &mut NaiveBucket, now: f64) -> bool {
        let elapsed = now - bucket.last_refill;
        bucket.tokens = self.capacity.min(bucket.tokens + elapsed * self.refill_rate);
        bucket.last_refill = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Converts the real monotonic clock to our `Instant`, as the embedding library does.
struct Clock(std::time::Instant);

impl Clock {
    #[inline]
    fn now(&self) -> Instant {
        Instant::from_nanos(self.0.elapsed().as_nanos() as u64)
    }
}

/// governor's clock (quanta), converted to our `Instant`.
struct Quanta(QuantaClock, QuantaInstant);

impl Quanta {
    fn new() -> Quanta {
        let clock = QuantaClock::default();
        let start = clock.now();
        Quanta(clock, start)
    }

    #[inline]
    fn now(&self) -> Instant {
        Instant::from_nanos(u64::from(self.0.now().duration_since(self.1)))
    }
}

/// Benchmarks every variant on `keys` (one key: no picking).
fn run(group: &mut BenchmarkGroup<'_, WallTime>, keys: &[String], p: Params, direct: bool) {
    let namespace = Namespace::new(b"bench");
    let limit = our_limit(p);
    let one = keys.len() == 1;

    // ours: time from a counter.
    {
        let mut store = new_store();
        let mut now = 1_000_000_000u64;
        for key in keys {
            store.check(namespace.key(key.as_bytes()), &limit, 1, Instant::from_nanos(now));
        }
        let mut picker = Picker::new();
        group.bench_function("ours", |b| {
            b.iter(|| {
                let key = if one { &keys[0] } else { &keys[picker.pick(keys.len())] };
                now += TICK_NANOS;
                store.check(namespace.key(black_box(key).as_bytes()), &limit, 1, Instant::from_nanos(now))
            })
        });
    }

    // ours, reading the real clock once per check (what governor does too).
    {
        let mut store = new_store();
        let clock = Clock(std::time::Instant::now());
        for key in keys {
            store.check(namespace.key(key.as_bytes()), &limit, 1, clock.now());
        }
        let mut picker = Picker::new();
        group.bench_function("ours_clock", |b| {
            b.iter(|| {
                let key = if one { &keys[0] } else { &keys[picker.pick(keys.len())] };
                store.check(namespace.key(black_box(key).as_bytes()), &limit, 1, clock.now())
            })
        });
    }

    // ours, reading governor's clock once per check.
    {
        let mut store = new_store();
        let clock = Quanta::new();
        for key in keys {
            store.check(namespace.key(key.as_bytes()), &limit, 1, clock.now());
        }
        let mut picker = Picker::new();
        group.bench_function("ours_quanta", |b| {
            b.iter(|| {
                let key = if one { &keys[0] } else { &keys[picker.pick(keys.len())] };
                store.check(namespace.key(black_box(key).as_bytes()), &limit, 1, clock.now())
            })
        });
    }

    // ours, real clock, through an uncontended mutex (a `&self` API like governor's).
    {
        let store = Mutex::new(new_store());
        let clock = Clock(std::time::Instant::now());
        for key in keys {
            let mut store = store.lock().unwrap_or_else(|e| e.into_inner());
            store.check(namespace.key(key.as_bytes()), &limit, 1, clock.now());
        }
        let mut picker = Picker::new();
        group.bench_function("ours_mutex_clock", |b| {
            b.iter(|| {
                let key = if one { &keys[0] } else { &keys[picker.pick(keys.len())] };
                let hash = namespace.key(black_box(key).as_bytes());
                let now = clock.now();
                let mut store = store.lock().unwrap_or_else(|e| e.into_inner());
                store.check(hash, &limit, 1, now)
            })
        });
    }

    // governor, keyed: DashMap<String, _>, quanta clock read inside check_key.
    {
        let limiter = RateLimiter::keyed(quota(p));
        for key in keys {
            let _ = limiter.check_key(key);
        }
        let mut picker = Picker::new();
        group.bench_function("governor_keyed", |b| {
            b.iter(|| {
                let key = if one { &keys[0] } else { &keys[picker.pick(keys.len())] };
                limiter.check_key(black_box(key))
            })
        });
    }

    // governor, direct (one state, no key at all): only meaningful on one key.
    if direct {
        let limiter = RateLimiter::direct(quota(p));
        group.bench_function("governor_direct", |b| b.iter(|| limiter.check()));
    }

    // naive Mutex<HashMap<String, f64 bucket>>, counter time.
    {
        let naive = Naive::new(p);
        let mut now = 1_000_000_000u64;
        let seconds = |nanos: u64| nanos as f64 * 1e-9;
        for key in keys {
            naive.allow(key, seconds(now));
        }
        let mut picker = Picker::new();
        group.bench_function("naive", |b| {
            b.iter(|| {
                let key = if one { &keys[0] } else { &keys[picker.pick(keys.len())] };
                now += TICK_NANOS;
                naive.allow(black_box(key), seconds(now))
            })
        });
    }
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    group.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
}

fn bench_check(c: &mut Criterion) {
    let hot = make_keys(1);

    let mut group = c.benchmark_group("allowed_1key");
    configure(&mut group);
    run(&mut group, &hot, ALLOWED, true);
    group.finish();

    let mut group = c.benchmark_group("refused_1key");
    configure(&mut group);
    run(&mut group, &hot, REFUSED, true);
    group.finish();

    let keys = make_keys(10_000);
    let mut group = c.benchmark_group("allowed_10k_keys");
    configure(&mut group);
    run(&mut group, &keys, ALLOWED, false);
    group.finish();

    let keys = make_keys(1_000_000);
    let mut group = c.benchmark_group("allowed_1m_keys");
    configure(&mut group);
    run(&mut group, &keys, ALLOWED, false);
    group.finish();
}

criterion_group!(benches, bench_check);
criterion_main!(benches);
