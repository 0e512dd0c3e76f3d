//! Arbitrary `u64` inputs to every operation never panic, and decisions stay well formed.

use std::time::Duration;

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use rand::SeedableRng;
use ratemesh_core::{
    Algorithm, Bucket, CONCURRENCY_LIMIT_MAX, CoreRng, Instant, LeaseId, Limit, LimitSpec, PERIOD_NANOS_MAX,
    SLIDING_LOG_ENTRIES_MAX, Snapshot,
};

use crate::config;

fn big() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![Just(0), Just(1), 0..=10u64, any::<u64>(), Just(u64::MAX), (u64::MAX - 10)..=u64::MAX]
}

fn instant() -> impl Strategy<Value = Instant> {
    prop_oneof![big(), 0..=PERIOD_NANOS_MAX].prop_map(Instant::from_nanos)
}

/// Valid limits at the edges of what `Limit::new` accepts.
fn limit() -> impl Strategy<Value = Limit> {
    let period = prop_oneof![Just(1), 1..=1_000u64, 1..=PERIOD_NANOS_MAX, Just(PERIOD_NANOS_MAX)];
    let count = prop_oneof![Just(1), 1..=10u64, any::<u64>().prop_map(|n| n.max(1)), Just(u64::MAX)];
    let burst = prop_oneof![Just(1), 0..=10u64, 1..=PERIOD_NANOS_MAX, Just(u64::MAX)];
    (select(Algorithm::ALL.to_vec()), period, count, option::of(burst), any::<u64>()).prop_filter_map(
        "valid limits only",
        |(algorithm, period, count, burst, delay)| {
            let mut spec = LimitSpec::new(algorithm, count, Duration::from_nanos(period));
            match algorithm {
                Algorithm::FixedWindow
                | Algorithm::SlidingWindowCounter
                | Algorithm::ExpiringCounter
                | Algorithm::SlidingWindowLog => {}
                Algorithm::Concurrency => spec.limit = count.min(CONCURRENCY_LIMIT_MAX),
                Algorithm::TokenBucket | Algorithm::Gcra => {
                    spec.limit = count.min(period);
                    spec.burst = burst;
                }
                Algorithm::LeakyBucketShaper => {
                    spec.limit = count.min(period);
                    spec.burst = burst;
                    spec.delay = Some(delay % burst.unwrap_or(0).saturating_add(1));
                }
            }
            Limit::new(spec).ok()
        },
    )
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    prop_oneof![
        big().prop_map(|backlog_nanos| Snapshot::Tat { backlog_nanos }),
        (big(), big(), big()).prop_map(|(elapsed_nanos, prev, curr)| Snapshot::Window {
            elapsed_nanos,
            prev,
            curr
        }),
        vec((big(), big()), 0..12).prop_map(|hits| Snapshot::Log { hits }),
        vec((big(), big(), big()), 0..12).prop_map(|leases| Snapshot::Leases {
            leases: leases.into_iter().map(|(id, slots, left)| (LeaseId(id % 4), slots, left)).collect()
        }),
    ]
}

#[derive(Clone, Debug)]
enum AnyOp {
    Check(Instant, u64),
    Force(Instant, u64),
    Refund(Instant, u64),
    Release(Instant, u64),
    Export(Instant),
    Import(Instant, Snapshot),
    Join(Instant, Snapshot),
    /// Join the bucket's own export.
    JoinSelf(Instant),
}

fn any_op() -> impl Strategy<Value = AnyOp> {
    prop_oneof![
        6 => (instant(), big()).prop_map(|(at, cost)| AnyOp::Check(at, cost)),
        2 => (instant(), big()).prop_map(|(at, hits)| AnyOp::Force(at, hits)),
        2 => (instant(), big()).prop_map(|(at, hits)| AnyOp::Refund(at, hits)),
        1 => (instant(), big()).prop_map(|(at, id)| AnyOp::Release(at, id)),
        1 => instant().prop_map(AnyOp::Export),
        1 => (instant(), snapshot()).prop_map(|(at, s)| AnyOp::Import(at, s)),
        2 => (instant(), snapshot()).prop_map(|(at, s)| AnyOp::Join(at, s)),
        1 => instant().prop_map(AnyOp::JoinSelf),
    ]
}

proptest! {
    #![proptest_config(config(192))]

    #[test]
    fn arbitrary_inputs_never_panic(limit in limit(), start in instant(), ops in vec(any_op(), 1..40)) {
        let mut bucket = Bucket::new(&limit, start);
        let mut rng = CoreRng::seed_from_u64(7);
        let capacity = limit.capacity();
        let concurrency = limit.algorithm() == Algorithm::Concurrency;
        for op in ops {
            match op {
                AnyOp::Check(at, cost) => {
                    let d = bucket.check(&limit, cost, at, &mut rng);
                    prop_assert_eq!(d.limit, limit.spec().limit);
                    prop_assert!(!d.allowed || d.retry_after.is_none());
                    prop_assert!(cost <= capacity || (!d.allowed && d.retry_after.is_none()));
                    prop_assert!(d.remaining <= capacity);
                    prop_assert!(d.delay.is_zero() || limit.algorithm() == Algorithm::LeakyBucketShaper);
                    prop_assert_eq!(d.lease.is_some(), concurrency && d.allowed && cost > 0);
                }
                AnyOp::Force(at, hits) => bucket.force(&limit, hits, at),
                AnyOp::Refund(at, hits) => bucket.refund(&limit, hits, at),
                AnyOp::Release(at, id) => {
                    bucket.release(&limit, LeaseId(id % 4), at);
                }
                AnyOp::Export(at) => {
                    let _ = bucket.export(at);
                }
                AnyOp::Import(at, snapshot) => {
                    if let Ok(imported) = Bucket::import(&limit, snapshot, at) {
                        bucket = imported;
                    }
                }
                AnyOp::Join(at, snapshot) => {
                    let _ = bucket.join(&limit, snapshot, at);
                }
                AnyOp::JoinSelf(at) => {
                    let own = bucket.export(at);
                    prop_assert!(bucket.join(&limit, own, at).is_ok());
                }
            }
            let _ = bucket.fresh_at(&limit);
        }
    }
}

fn limit_of(algorithm: Algorithm, limit: u64, period_nanos: u64) -> Limit {
    Limit::new(LimitSpec::new(algorithm, limit, Duration::from_nanos(period_nanos))).expect("valid limit")
}

/// A log of a limit above [`SLIDING_LOG_ENTRIES_MAX`] keeps at most that many entries: hits at
/// more distinct times merge the oldest into their successors, which may refuse a little early
/// (the merged hits count until the later time), never admit more than the limit. A costly hit is
/// one entry whatever its cost (`limits`' test: a million per 2 s, one hit, then 999 999 at once).
#[test]
fn a_log_with_a_huge_limit_keeps_its_entries_bounded() {
    let entries_max = SLIDING_LOG_ENTRIES_MAX;
    let limit = limit_of(Algorithm::SlidingWindowLog, 1_000_000, 2_000_000_000);
    let mut rng = CoreRng::seed_from_u64(0);
    let mut bucket = Bucket::new(&limit, Instant::ZERO);
    assert!(bucket.check(&limit, 1, Instant::ZERO, &mut rng).allowed);
    let d = bucket.check(&limit, 999_999, Instant::from_nanos(1_000_000_000), &mut rng);
    assert_eq!((d.allowed, d.remaining), (true, 0));
    assert!(!bucket.check(&limit, 1, Instant::from_nanos(1_000_000_000), &mut rng).allowed);
    // The first hit leaves at 2 s, the rest at 3 s.
    let d = bucket.check(&limit, 0, Instant::from_nanos(2_000_000_000), &mut rng);
    assert_eq!(d.remaining, 1);
    // 150 000 hits at distinct times in one window: at most the entry bound is kept, every hit
    // still counted, and nothing is admitted past the limit.
    let mut bucket = Bucket::new(&limit, Instant::ZERO);
    let hits = entries_max + 50_000;
    for i in 0..hits {
        assert!(bucket.check(&limit, 1, Instant::from_nanos(i), &mut rng).allowed);
    }
    let Snapshot::Log { hits: entries } = bucket.export(Instant::from_nanos(hits)) else { panic!("a log") };
    assert_eq!(entries.len() as u64, entries_max);
    assert_eq!(entries.iter().map(|&(_, cost)| cost).sum::<u64>(), hits);
    let d = bucket.check(&limit, 1_000_000 - hits, Instant::from_nanos(hits), &mut rng);
    assert_eq!((d.allowed, d.remaining), (true, 0));
    assert!(!bucket.check(&limit, 1, Instant::from_nanos(hits), &mut rng).allowed);
    // Early, never late: the merged oldest hits leave with the later time they merged into (the
    // costly hit took one more entry: the 50 002 oldest merged into the one at 50 001 ns).
    let d = bucket.check(&limit, 0, Instant::from_nanos(2_000_000_000 + 50_000), &mut rng);
    assert_eq!(d.remaining, 0);
    let d = bucket.check(&limit, 0, Instant::from_nanos(2_000_000_000 + 50_001), &mut rng);
    assert_eq!(d.remaining, 50_002);
}

/// Regression: forced hits summing past `u64::MAX` overflowed the log's total (and undercounted
/// it once the first of them left).
#[test]
fn a_log_holds_forced_hits_past_u64_max() {
    let limit = limit_of(Algorithm::SlidingWindowLog, 2, 1_000);
    let mut rng = CoreRng::seed_from_u64(0);
    let mut bucket = Bucket::new(&limit, Instant::ZERO);
    bucket.force(&limit, u64::MAX, Instant::from_nanos(0));
    bucket.force(&limit, u64::MAX, Instant::from_nanos(10));
    bucket.force(&limit, 5, Instant::from_nanos(20));
    let d = bucket.check(&limit, 1, Instant::from_nanos(20), &mut rng);
    assert_eq!((d.allowed, d.remaining, d.retry_after), (false, 0, Some(Duration::from_nanos(1_000))));
    // The first entry has left; the other two still refuse everything until they leave too.
    let d = bucket.check(&limit, 1, Instant::from_nanos(1_000), &mut rng);
    assert_eq!((d.allowed, d.retry_after), (false, Some(Duration::from_nanos(20))));
    assert!(bucket.check(&limit, 2, Instant::from_nanos(1_020), &mut rng).allowed);
}

/// Regression: with a limit near `u64::MAX` a saturated sum let a request pass and overflow.
#[test]
fn a_window_with_a_huge_limit_refuses_what_does_not_fit() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter, Algorithm::ExpiringCounter] {
        let limit = limit_of(algorithm, u64::MAX, 1_000);
        let mut rng = CoreRng::seed_from_u64(0);
        let mut bucket = Bucket::new(&limit, Instant::ZERO);
        assert!(bucket.check(&limit, 1, Instant::ZERO, &mut rng).allowed);
        let d = bucket.check(&limit, u64::MAX, Instant::ZERO, &mut rng);
        assert_eq!((d.allowed, d.remaining), (false, u64::MAX - 1), "{algorithm:?}");
        assert!(bucket.check(&limit, u64::MAX - 1, Instant::ZERO, &mut rng).allowed);
    }
}

/// Regression: leases imported from another node with slots summing past `u64::MAX` overflowed.
#[test]
fn leases_from_another_node_may_hold_any_number_of_slots() {
    let limit = limit_of(Algorithm::Concurrency, 3, 1_000);
    let leases = vec![(LeaseId(1), u64::MAX, 100), (LeaseId(2), u64::MAX, 300)];
    let mut bucket = Bucket::import(&limit, Snapshot::Leases { leases }, Instant::ZERO).expect("same family");
    let d = bucket.check(&limit, 0, Instant::ZERO, &mut CoreRng::seed_from_u64(0));
    assert_eq!((d.allowed, d.remaining, d.retry_after), (false, 0, Some(Duration::from_nanos(300))));
}
