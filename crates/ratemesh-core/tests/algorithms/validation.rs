//! `Limit::new`: which specs are refused, and with which `LimitError`.

use std::time::Duration;

use ratemesh_core::{
    Algorithm, CONCURRENCY_LIMIT_MAX, Limit, LimitError, LimitParameter, LimitSpec, PERIOD_NANOS_MAX,
};

use crate::edges::parse_spec;

#[track_caller]
fn check(spec: &str, expect: Result<(), LimitError>) {
    check_spec(parse_spec(spec), expect);
}

#[track_caller]
fn check_spec(spec: LimitSpec, expect: Result<(), LimitError>) {
    let got = Limit::new(spec.clone()).map(|limit| assert_eq!(limit.spec(), &spec));
    assert_eq!(got, expect, "{spec:?}");
}

fn not_applicable(parameter: &str, algorithm: &str) -> Result<(), LimitError> {
    let parameter = parameter_named(parameter);
    let algorithm = Algorithm::from_name(algorithm).expect("an algorithm's name");
    Err(LimitError::NotApplicable { parameter, algorithm })
}

fn too_large(parameter: &str, max: u64) -> Result<(), LimitError> {
    Err(LimitError::TooLarge { parameter: parameter_named(parameter), max })
}

/// The parameter by its name, and the name is what `LimitParameter::name` says.
fn parameter_named(name: &str) -> LimitParameter {
    let all = [
        LimitParameter::Limit,
        LimitParameter::Period,
        LimitParameter::Burst,
        LimitParameter::Delay,
        LimitParameter::Window,
    ];
    all.into_iter().find(|p| p.name() == name).expect("a parameter's name")
}

#[test]
fn zero_limit_and_zero_period() {
    for algorithm in Algorithm::ALL {
        let name = algorithm.name();
        check(&format!("{name} 0/1s"), Err(LimitError::ZeroLimit));
        check(&format!("{name} 1/0s"), Err(LimitError::ZeroPeriod));
        check(&format!("{name} 0/0s"), Err(LimitError::ZeroLimit));
        check(&format!("{name} 1/1ns"), Ok(()));
    }
}

#[test]
fn parameters_that_do_not_apply() {
    for name in
        ["fixed_window", "sliding_window_counter", "sliding_window_log", "concurrency", "expiring_counter"]
    {
        check(&format!("{name} 3/1s burst=3"), not_applicable("burst", name));
        check(&format!("{name} 3/1s delay=0"), not_applicable("delay", name));
    }
    check("token_bucket 3/1s delay=0", not_applicable("delay", "token_bucket"));
    check("gcra 3/1s burst=2 delay=1", not_applicable("delay", "gcra"));
    check("leaky_bucket 3/1s burst=2 delay=1", Ok(()));
}

#[test]
fn bursts_and_delays() {
    check("token_bucket 3/1s burst=0", Err(LimitError::ZeroBurst(Algorithm::TokenBucket)));
    check("gcra 3/1s burst=0", Err(LimitError::ZeroBurst(Algorithm::Gcra)));
    // nginx's default is burst=0: one at a time.
    check("leaky_bucket 3/1s burst=0", Ok(()));
    check("leaky_bucket 3/1s burst=0 delay=0", Ok(()));
    check("leaky_bucket 3/1s burst=2 delay=2", Ok(()));
    check("leaky_bucket 3/1s burst=2 delay=3", Err(LimitError::DelayAboveBurst { delay: 3, burst: 2 }));
    check("leaky_bucket 3/1s delay=1", Err(LimitError::DelayAboveBurst { delay: 1, burst: 0 }));
    let huge = LimitSpec::new(Algorithm::LeakyBucketShaper, 1, Duration::from_secs(1));
    check_spec(
        huge.with_burst(1).with_delay(u64::MAX),
        Err(LimitError::DelayAboveBurst { delay: u64::MAX, burst: 1 }),
    );
}

#[test]
fn rates_above_one_per_nanosecond() {
    for name in ["token_bucket", "gcra", "leaky_bucket"] {
        check(&format!("{name} 11/10ns"), Err(LimitError::RateTooHigh { limit: 11, period_nanos: 10 }));
        check(&format!("{name} 10/10ns"), Ok(()));
        check(
            &format!("{name} {}/1s", u64::MAX),
            Err(LimitError::RateTooHigh { limit: u64::MAX, period_nanos: 1_000_000_000 }),
        );
    }
    // Counters only count: 11 hits per 10 ns window is a valid (if odd) limit.
    check("fixed_window 11/10ns", Ok(()));
    check("sliding_window_counter 11/10ns", Ok(()));
    check(&format!("fixed_window {}/1ns", u64::MAX), Ok(()));
}

#[test]
fn values_too_large() {
    let period_max = Duration::from_nanos(PERIOD_NANOS_MAX);
    for algorithm in Algorithm::ALL {
        check_spec(LimitSpec::new(algorithm, 1, period_max), Ok(()));
        check_spec(
            LimitSpec::new(algorithm, 1, period_max + Duration::from_nanos(1)),
            too_large("period", PERIOD_NANOS_MAX),
        );
        check_spec(LimitSpec::new(algorithm, 1, Duration::MAX), too_large("period", PERIOD_NANOS_MAX));
    }
    // A log's memory is bounded by its entries, not by its limit: any limit is accepted.
    check("sliding_window_log 1000000/1s", Ok(()));
    check(&format!("sliding_window_log {}/1s", u64::MAX), Ok(()));
    check(&format!("concurrency {CONCURRENCY_LIMIT_MAX}/1s"), Ok(()));
    check(
        &format!("concurrency {}/1s", CONCURRENCY_LIMIT_MAX + 1),
        too_large("limit", CONCURRENCY_LIMIT_MAX),
    );
    // The whole bucket must fit in the longest period: capacity × interval ≤ PERIOD_NANOS_MAX.
    // With one hit per second, that is 3_153_600_000 hits; `max` is the largest burst accepted.
    let burst_max = PERIOD_NANOS_MAX / 1_000_000_000;
    for name in ["token_bucket", "gcra"] {
        check(&format!("{name} 1/1s burst={burst_max}"), Ok(()));
        check(&format!("{name} 1/1s burst={}", burst_max + 1), too_large("burst", burst_max));
        check(&format!("{name} 1/1s burst={}", u64::MAX), too_large("burst", burst_max));
    }
    // The shaper's queue holds `burst` waiting hits plus the one in service.
    check(&format!("leaky_bucket 1/1s burst={}", burst_max - 1), Ok(()));
    check(&format!("leaky_bucket 1/1s burst={burst_max}"), too_large("burst", burst_max - 1));
    check(&format!("leaky_bucket 1/1s burst={}", u64::MAX), too_large("burst", burst_max - 1));
}
