//! The implementation against the naive models, and properties every algorithm must have.

use proptest::prelude::*;
use rand::SeedableRng;
use ratemesh_core::{Algorithm, Bucket, CoreRng, Instant, LimitSpec};

use crate::config;
use crate::generate::{Clock, Op, Scenario, Step, any_scenario, pick_lease, scenario, step};
use crate::model::{Expect, decide, fresh_at, model_for, period_nanos};

/// Runs `sc` on a bucket and on the model, comparing every decision, every release, a pure query
/// after every other operation, and `fresh_at`.
fn agrees_with_model(sc: &Scenario) -> Result<(), TestCaseError> {
    let limit = sc.limit();
    let mut bucket = Bucket::new(&limit, Instant::from_nanos(sc.start));
    let mut model = model_for(&sc.spec, sc.start);
    let mut rng = CoreRng::seed_from_u64(sc.seed);
    let mut clock = Clock::new(sc.start);
    let mut granted = Vec::new();
    for (i, &(step, op)) in sc.ops.iter().enumerate() {
        let at = clock.step(step);
        let now = clock.now();
        let context = format!("op {i} {op:?} at {} (now {now})", at.as_nanos());
        match op {
            Op::Check(cost) => {
                let got = bucket.check(&limit, cost, at, &mut rng);
                let want = decide(model.as_mut(), now, cost, got.lease);
                prop_assert_eq!(Expect::of(&got), want, "{}", context);
                prop_assert_eq!(got.limit, sc.spec.limit);
                granted.extend(got.lease);
                continue;
            }
            Op::Refund(hits) => {
                bucket.refund(&limit, hits, at);
                model.refund(now, hits);
            }
            Op::Force(hits) => {
                bucket.force(&limit, hits, at);
                model.force(now, hits);
            }
            Op::Release(pick) => {
                let lease = pick_lease(&granted, pick);
                prop_assert_eq!(bucket.release(&limit, lease, at), model.release(now, lease), "{}", context);
            }
        }
        let fresh = fresh_at(model.as_ref(), now);
        let bucket_fresh = bucket.fresh_at(&limit).as_nanos();
        // Never early (a TTL that forgets a live key resets it); windows may be late by up to one
        // period, because a release (a no-op for them) does not roll the window.
        prop_assert!(bucket_fresh >= fresh, "fresh_at {} < {}: {}", bucket_fresh, fresh, context);
        prop_assert!(bucket_fresh <= fresh + period_nanos(&sc.spec), "fresh_at late: {}", context);
        let got = bucket.check(&limit, 0, at, &mut rng);
        let want = decide(model.as_mut(), now, 0, None);
        prop_assert_eq!(Expect::of(&got), want, "query after {}", context);
    }
    Ok(())
}

macro_rules! against_model {
    ($($name:ident: $algorithm:expr;)*) => {
        proptest! {
            #![proptest_config(config(192))]
            $(
                #[test]
                fn $name(sc in scenario($algorithm, true)) {
                    agrees_with_model(&sc)?;
                }
            )*
        }
    };
}

against_model! {
    fixed_window_agrees_with_model: Algorithm::FixedWindow;
    sliding_window_log_agrees_with_model: Algorithm::SlidingWindowLog;
    sliding_window_counter_agrees_with_model: Algorithm::SlidingWindowCounter;
    token_bucket_agrees_with_model: Algorithm::TokenBucket;
    gcra_agrees_with_model: Algorithm::Gcra;
    shaper_agrees_with_model: Algorithm::LeakyBucketShaper;
    concurrency_agrees_with_model: Algorithm::Concurrency;
    expiring_counter_agrees_with_model: Algorithm::ExpiringCounter;
}

/// When a request is refused with `retry_after = Some(d)`, the same request passes at `now + d`,
/// and not at `now + d − 1ns`, if nothing else happens in between.
fn retry_after_is_exact(sc: &Scenario) -> Result<(), TestCaseError> {
    let limit = sc.limit();
    let mut bucket = Bucket::new(&limit, Instant::from_nanos(sc.start));
    let mut rng = CoreRng::seed_from_u64(sc.seed);
    let mut clock = Clock::new(sc.start);
    let mut granted = Vec::new();
    for &(step, op) in &sc.ops {
        let at = clock.step(step);
        match op {
            Op::Check(cost) => {
                let decision = bucket.check(&limit, cost, at, &mut rng);
                granted.extend(decision.lease);
                let Some(retry) = decision.retry_after else { continue };
                prop_assert!(!decision.allowed);
                let retry = u64::try_from(retry.as_nanos()).expect("short retries");
                let then = Instant::from_nanos(clock.now() + retry);
                let (mut b, mut r) = (bucket.clone(), rng.clone());
                prop_assert!(
                    b.check(&limit, cost, then, &mut r).allowed,
                    "cost {} refused at now + {}",
                    cost,
                    retry
                );
                if retry > 0 {
                    let (mut b, mut r) = (bucket.clone(), rng.clone());
                    let before = Instant::from_nanos(clock.now() + retry - 1);
                    prop_assert!(
                        !b.check(&limit, cost, before, &mut r).allowed,
                        "passes before now + {}",
                        retry
                    );
                }
            }
            Op::Refund(hits) => bucket.refund(&limit, hits, at),
            Op::Force(hits) => bucket.force(&limit, hits, at),
            Op::Release(pick) => {
                bucket.release(&limit, pick_lease(&granted, pick), at);
            }
        }
    }
    Ok(())
}

/// Admitted `(instant, cost)` of a run of checks only (no refunds, releases or forced hits).
fn admitted(spec: &LimitSpec, start: u64, requests: &[(Step, u64)]) -> Vec<(u64, u64)> {
    let limit = ratemesh_core::Limit::new(spec.clone()).expect("valid spec");
    let mut bucket = Bucket::new(&limit, Instant::from_nanos(start));
    let mut rng = CoreRng::seed_from_u64(0);
    let mut clock = Clock::new(start);
    let mut out = Vec::new();
    for &(step, cost) in requests {
        let at = clock.step(step);
        if bucket.check(&limit, cost, at, &mut rng).allowed {
            out.push((clock.now(), cost));
        }
    }
    out
}

/// The most cost admitted in any interval `[from, from + span)` with `span ≥ 1`, for every span,
/// as `(span, cost)` pairs of the tightest intervals: the ones that start and end at admissions.
fn heaviest(admitted: &[(u64, u64)], holds: impl Fn(u64, u64) -> bool) -> Result<(), TestCaseError> {
    for (i, &(from, _)) in admitted.iter().enumerate() {
        let mut sum = 0u64;
        for &(to, cost) in &admitted[i..] {
            sum += cost;
            // The interval [from, to] has length to − from + 1.
            prop_assert!(holds(to - from + 1, sum), "{} admitted in {}ns from {}", sum, to - from + 1, from);
        }
    }
    Ok(())
}

fn traffic(spec: LimitSpec) -> impl Strategy<Value = (LimitSpec, u64, Vec<(Step, u64)>)> {
    let period = period_nanos(&spec);
    let capacity = ratemesh_core::Limit::new(spec.clone()).expect("valid spec").capacity();
    let requests = proptest::collection::vec((step(period), 0..=capacity + 1), 1..=150);
    (Just(spec), 0..=10 * period, requests)
}

fn window_spec(algorithm: Algorithm) -> impl Strategy<Value = LimitSpec> {
    (1..=8u64, 1..=2_000u64).prop_map(move |(limit, period)| {
        LimitSpec::new(algorithm, limit, std::time::Duration::from_nanos(period))
    })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn retry_after_is_exact_for_every_algorithm(sc in any_scenario(true)) {
        retry_after_is_exact(&sc)?;
    }

    /// A sliding window log never admits more than `limit` in any interval of length `period`.
    #[test]
    fn sliding_window_log_never_exceeds_the_limit_in_any_window(
        (spec, start, requests) in window_spec(Algorithm::SlidingWindowLog).prop_flat_map(traffic)
    ) {
        let period = period_nanos(&spec);
        heaviest(&admitted(&spec, start, &requests), |span, sum| span > period || sum <= spec.limit)?;
    }

    /// Without releases, concurrency leases are a sliding window log of lease lifetimes.
    #[test]
    fn concurrency_never_holds_more_than_the_limit(
        (spec, start, requests) in window_spec(Algorithm::Concurrency).prop_flat_map(traffic)
    ) {
        let period = period_nanos(&spec);
        heaviest(&admitted(&spec, start, &requests), |span, sum| span > period || sum <= spec.limit)?;
    }

    /// A fixed window admits at most `limit` per aligned window, so at most 2 × `limit` in any
    /// interval of length `period`.
    #[test]
    fn fixed_window_admits_at_most_twice_the_limit_across_an_edge(
        (spec, start, requests) in window_spec(Algorithm::FixedWindow).prop_flat_map(traffic)
    ) {
        let period = period_nanos(&spec);
        let admitted = admitted(&spec, start, &requests);
        heaviest(&admitted, |span, sum| span > period || sum <= 2 * spec.limit)?;
        for &(at, _) in &admitted {
            let in_window: u64 = admitted.iter().filter(|&&(t, _)| t / period == at / period).map(|&(_, c)| c).sum();
            prop_assert!(in_window <= spec.limit);
        }
    }

    /// An expiring counter admits at most `limit` in a period from a window's first hit, so at
    /// most 2 × `limit` in any interval of length `period`; and every window starts at an admitted
    /// hit.
    #[test]
    fn expiring_counter_admits_at_most_the_limit_from_a_first_hit(
        (spec, start, requests) in window_spec(Algorithm::ExpiringCounter).prop_flat_map(traffic)
    ) {
        let period = period_nanos(&spec);
        let admitted = admitted(&spec, start, &requests);
        heaviest(&admitted, |span, sum| span > period || sum <= 2 * spec.limit)?;
        // Replay: a window opens at the first admitted hit after the last one ended (a query,
        // cost 0, opens none).
        let mut window: Option<(u64, u64)> = None;
        for &(at, cost) in admitted.iter().filter(|&&(_, cost)| cost > 0) {
            match window {
                Some((first, count)) if at < first + period => window = Some((first, count + cost)),
                _ => window = Some((at, cost)),
            }
            prop_assert!(window.is_some_and(|(_, count)| count <= spec.limit), "{window:?} at {at}");
        }
    }

    /// The sliding window counter admits at most 2 × `limit` in any interval of length `period`
    /// (it weighs the previous window by its overlap, so never the full 2 × at once).
    #[test]
    fn sliding_window_counter_admits_under_twice_the_limit(
        (spec, start, requests) in window_spec(Algorithm::SlidingWindowCounter).prop_flat_map(traffic)
    ) {
        let period = period_nanos(&spec);
        heaviest(&admitted(&spec, start, &requests), |span, sum| span > period || sum <= 2 * spec.limit)?;
    }

    /// Token bucket, GCRA and shaper: in any interval of length `span`, at most the capacity plus
    /// one hit per interval of `ceil(period / limit)`.
    #[test]
    fn rate_limits_stay_within_their_envelope(
        (spec, start, requests) in proptest::sample::select(vec![
            Algorithm::TokenBucket, Algorithm::Gcra, Algorithm::LeakyBucketShaper,
        ]).prop_flat_map(crate::generate::spec).prop_flat_map(traffic)
    ) {
        let limit = ratemesh_core::Limit::new(spec.clone()).expect("valid spec");
        let interval = period_nanos(&spec).div_ceil(spec.limit);
        let capacity = limit.capacity();
        heaviest(&admitted(&spec, start, &requests), |span, sum| sum <= capacity + (span - 1) / interval)?;
    }
}
