//! The keyed store: bounds, TTL expiry, eviction, and that it never loses information early.

use core::time::Duration;

use ratemesh_core::{
    Algorithm, Instant, KeyHash, Limit, LimitSpec, Namespace, Store, StoreConfig, StoreStats,
};

fn token_bucket(limit: u64, burst: u64) -> Limit {
    Limit::new(LimitSpec::new(Algorithm::TokenBucket, limit, Duration::from_secs(1)).with_burst(burst))
        .expect("valid limit")
}

fn key(i: u64) -> KeyHash {
    Namespace::new(b"test").key(&i.to_le_bytes())
}

fn store(keys_max: usize) -> Store {
    Store::new(StoreConfig { keys_max, sweep_len_max: 64, ..StoreConfig::default() }, 7)
}

const T0: Instant = Instant::from_millis(1_000);

#[test]
fn table_never_exceeds_keys_max_and_counts_evictions() {
    let limit = token_bucket(10, 10);
    let mut store = store(100);
    for i in 0..1_000 {
        assert!(store.check(key(i), &limit, 1, T0).allowed);
        assert!(store.len() <= 100);
    }
    assert_eq!(store.len(), 100);
    // Every key is still live (a token bucket takes 100 ms to refill one token): all 900 were
    // evictions of live keys, none an expiry.
    assert_eq!(
        store.stats(),
        StoreStats { inserted: 1_000, expired: 0, evicted: 900, ..StoreStats::default() }
    );
}

#[test]
fn eviction_prefers_keys_that_are_fresh_already() {
    let limit = token_bucket(10, 10);
    let mut store = store(100);
    for i in 0..100 {
        store.check(key(i), &limit, 1, T0);
    }
    // 100 ms later all of them are full again: evicting them loses nothing.
    let later = T0.add_nanos(100_000_000);
    for i in 100..200 {
        store.check(key(i), &limit, 1, later);
    }
    let stats = store.stats();
    assert_eq!(stats.evicted + stats.expired, 100);
    // The i-th insertion finds (100 − i) stale entries among 100: a uniform random victim would be
    // live about 50 times in all; sampling 8 and taking the stalest, about 8 times.
    assert!(stats.evicted <= 25, "sampling should prefer stale entries: {stats:?}");
}

#[test]
fn sweep_drops_exactly_the_fresh_entries() {
    let limit = token_bucket(10, 10);
    let mut store = store(1_000);
    for i in 0..50 {
        store.check(key(i), &limit, 1, T0); // full again after 100 ms
        store.check(key(1_000 + i), &limit, 5, T0); // full again after 500 ms
    }
    let mut dropped = 0;
    for _ in 0..10 {
        dropped += store.sweep(T0.add_nanos(100_000_000));
    }
    assert_eq!(dropped, 50);
    assert_eq!(store.len(), 50);
    for i in 0..50 {
        assert!(store.get(key(1_000 + i)).is_some(), "a live key was swept");
    }
}

#[test]
fn sweep_work_per_call_is_bounded() {
    let limit = token_bucket(10, 10);
    let mut store = store(1_000);
    for i in 0..1_000 {
        store.check(key(i), &limit, 1, T0);
    }
    // sweep_len_max is 64: one call examines (and so drops) at most 64 entries.
    assert_eq!(store.sweep(T0.add_nanos(1_000_000_000)), 64);
    assert_eq!(store.len(), 936);
}

#[test]
fn refusals_and_queries_on_unknown_keys_insert_nothing() {
    let limit = token_bucket(10, 10);
    let mut store = store(10);
    assert!(store.check(key(1), &limit, 0, T0).allowed, "a query on a fresh key");
    let refused = store.check(key(2), &limit, 11, T0);
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, None, "cost above capacity never passes");
    assert!(store.is_empty());
    store.refund(key(3), &limit, 5, T0);
    assert!(store.is_empty(), "refunding an unknown key (already full) tracks nothing");
}

#[test]
fn expiry_loses_no_information() {
    // A key dropped at its fresh_at decides exactly like the kept one would have.
    let limit = token_bucket(10, 10);
    let mut kept = store(10);
    let mut swept = store(10);
    kept.check(key(1), &limit, 10, T0);
    swept.check(key(1), &limit, 10, T0);
    let fresh = T0.add_nanos(1_000_000_000);
    assert_eq!(swept.sweep(fresh), 1);
    for step in 0..30u64 {
        let now = fresh.add_nanos(step * 10_000_000);
        assert_eq!(kept.check(key(1), &limit, 1, now), swept.check(key(1), &limit, 1, now));
    }
}

#[test]
fn force_creates_debt_and_export_join_move_it() {
    let limit = token_bucket(10, 10);
    let mut owner = store(10);
    owner.force(key(1), &limit, 15, T0);
    let decision = owner.check(key(1), &limit, 1, T0);
    assert!(!decision.allowed);
    // 15 hits into a bucket of 10: 5 in debt, plus one token for this request: 600 ms at 10/s.
    assert_eq!(decision.retry_after, Some(Duration::from_millis(600)));

    let snapshot = owner.export(key(1), T0).expect("tracked");
    let mut successor = store(10);
    successor.join(key(1), &limit, snapshot, T0).expect("same family");
    assert_eq!(successor.check(key(1), &limit, 1, T0), decision);
}

#[test]
fn same_seed_same_evictions() {
    let limit = token_bucket(10, 10);
    let run = || {
        let mut store = store(50);
        for i in 0..500 {
            store.check(key(i % 173), &limit, 1, T0.add_nanos(i * 1_000_000));
        }
        store.keys().collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
}

#[test]
fn debt_is_capped_at_one_capacity() {
    use rand::SeedableRng;
    use ratemesh_core::{Bucket, CoreRng};
    let limit = token_bucket(10, 10);
    let mut rng = CoreRng::seed_from_u64(1);
    let mut bucket = Bucket::new(&limit, T0);
    bucket.force(&limit, 1_000, T0); // 100 s of debt at 10/s
    bucket.cap_debt(&limit, T0);
    // Empty, plus one capacity (10 hits = 1 s) of debt: a hit passes after 1.1 s, not 100 s.
    let refused = bucket.check(&limit, 1, T0, &mut rng);
    assert_eq!(refused.retry_after, Some(Duration::from_millis(1_100)));
    // A bucket within the cap is left alone.
    let mut within = Bucket::new(&limit, T0);
    within.force(&limit, 15, T0);
    let before = within.clone();
    within.cap_debt(&limit, T0);
    assert_eq!(within, before);
}

#[test]
fn sliding_window_logs_stay_within_their_byte_bound_and_never_admit_more() {
    let limit = Limit::new(LimitSpec::new(Algorithm::SlidingWindowLog, 10_000, Duration::from_secs(3600)))
        .expect("valid limit");
    let bound = 1 << 20;
    let mut bounded = Store::<()>::new(StoreConfig { log_bytes_max: bound, ..StoreConfig::default() }, 7);
    let mut unbounded = store(1_000);
    // 100 keys, 5 000 hits each at distinct times: about 8 MB of log entries unbounded.
    for hit in 0..5_000_u64 {
        for k in 0..100 {
            let now = T0.add_nanos(hit * 1_000 + k);
            assert!(bounded.check(key(k), &limit, 1, now).allowed);
            assert!(unbounded.check(key(k), &limit, 1, now).allowed);
            assert!(bounded.stats().log_bytes <= bound as u64, "{:?}", bounded.stats());
        }
    }
    let (tight, loose) = (bounded.stats(), unbounded.stats());
    assert!(loose.log_bytes >= 100 * 5_000 * 16, "{loose:?}");
    assert_eq!(loose.logs_coarsened, 0);
    assert!(tight.logs_coarsened > 0, "{tight:?}");
    // Coarsened logs still count every hit: exactly 5 000 more pass per key within the hour.
    let later = T0.add_nanos(10_000_000_000);
    for k in 0..100 {
        for _ in 0..5_000 {
            assert!(bounded.check(key(k), &limit, 1, later).allowed);
        }
        assert!(!bounded.check(key(k), &limit, 1, later).allowed, "key {k}: the limit holds");
    }
    // Dropped logs give their bytes back.
    for k in 0..100 {
        bounded.remove(key(k));
    }
    assert_eq!(bounded.stats().log_bytes, 0);
}
