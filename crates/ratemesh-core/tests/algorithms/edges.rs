//! Documented edge cases, one line each: `check(spec, script, expect)`.
//!
//! A spec is `<algorithm> <limit>/<period> [burst=<n>] [delay=<n>]`. The bucket is created at
//! instant 0. A script is a list of tokens:
//!
//! | token      | does                                   | prints                                   |
//! |------------|----------------------------------------|------------------------------------------|
//! | `@<d>`     | moves the clock to instant `d` (it may go backwards) | nothing                    |
//! | `<n>`      | a check of cost `n` (0 only asks)      | `Y`, `Y+<delay>`, `N(<retry>)`, `N(never)`|
//! | `<k>x<n>`  | `k` checks of cost `n`                 | one output each                          |
//! | `?`        | a query (cost 0), in full              | `q(r=<remaining>,t=<reset>[,N=<retry>])` |
//! | `-<n>`     | refunds `n`                            | nothing                                  |
//! | `!<n>`     | forces `n` (hits admitted elsewhere)   | nothing                                  |
//! | `R`        | releases the oldest lease not released yet | `R+` (it was held) or `R-`           |
//!
//! Durations print in the largest exact unit (`1s`, `500ms`, `7ns`). Runs of equal outputs print
//! once with a count: `Yx3`.

use std::collections::VecDeque;
use std::time::Duration;

use rand::SeedableRng;
use ratemesh_core::{Algorithm, Bucket, CoreRng, Decision, Instant, Limit, LimitSpec};

use crate::model::nanos;

/// Parses `<n><unit>` with unit `s`, `ms`, `us` or `ns`, or a bare `0`.
pub fn parse_duration(text: &str) -> Duration {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().expect("a number before the unit");
    match unit {
        "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "us" => Duration::from_micros(n),
        "ns" => Duration::from_nanos(n),
        "" if n == 0 => Duration::ZERO,
        _ => panic!("unknown unit in {text:?}"),
    }
}

fn show_duration(duration: Duration) -> String {
    let n = nanos(duration);
    match n {
        _ if n.is_multiple_of(1_000_000_000) => format!("{}s", n / 1_000_000_000),
        _ if n.is_multiple_of(1_000_000) => format!("{}ms", n / 1_000_000),
        _ if n.is_multiple_of(1_000) => format!("{}us", n / 1_000),
        _ => format!("{n}ns"),
    }
}

/// Parses a spec line.
pub fn parse_spec(text: &str) -> LimitSpec {
    let mut words = text.split_whitespace();
    let algorithm = Algorithm::from_name(words.next().expect("an algorithm")).expect("a known algorithm");
    let (limit, period) = words.next().and_then(|w| w.split_once('/')).expect("<limit>/<period>");
    let mut spec = LimitSpec::new(algorithm, limit.parse().expect("a limit"), parse_duration(period));
    for word in words {
        let (key, value) = word.split_once('=').expect("key=value");
        let value = value.parse().expect("a number");
        match key {
            "burst" => spec.burst = Some(value),
            "delay" => spec.delay = Some(value),
            _ => panic!("unknown parameter {key}"),
        }
    }
    spec
}

fn show_check(decision: &Decision) -> String {
    match (decision.allowed, decision.retry_after) {
        (true, _) if decision.delay.is_zero() => "Y".to_string(),
        (true, _) => format!("Y+{}", show_duration(decision.delay)),
        (false, Some(retry)) => format!("N({})", show_duration(retry)),
        (false, None) => "N(never)".to_string(),
    }
}

fn show_query(decision: &Decision) -> String {
    let retry = decision.retry_after.map(|r| format!(",N={}", show_duration(r))).unwrap_or_default();
    let never = if !decision.allowed && decision.retry_after.is_none() { ",N=never" } else { "" };
    format!("q(r={},t={}{retry}{never})", decision.remaining, show_duration(decision.reset_after))
}

/// Runs `script` on a fresh bucket of `spec` and prints what happened.
fn run(spec: &str, script: &str) -> String {
    let limit = Limit::new(parse_spec(spec)).expect("a valid spec");
    let mut now = Instant::ZERO;
    let mut bucket = Bucket::new(&limit, now);
    let mut rng = CoreRng::seed_from_u64(1);
    let mut leases = VecDeque::new();
    let mut out: Vec<String> = Vec::new();
    for token in script.split_whitespace() {
        if let Some(at) = token.strip_prefix('@') {
            now = Instant::ZERO.add_duration(parse_duration(at));
        } else if token == "?" {
            out.push(show_query(&bucket.check(&limit, 0, now, &mut rng)));
        } else if let Some(hits) = token.strip_prefix('-') {
            bucket.refund(&limit, hits.parse().expect("refund hits"), now);
        } else if let Some(hits) = token.strip_prefix('!') {
            bucket.force(&limit, hits.parse().expect("forced hits"), now);
        } else if token == "R" {
            let lease = leases.pop_front().expect("a lease to release");
            out.push(if bucket.release(&limit, lease, now) { "R+" } else { "R-" }.to_string());
        } else {
            let (times, cost) = token.split_once('x').unwrap_or(("1", token));
            for _ in 0..times.parse::<usize>().expect("a repeat count") {
                let decision = bucket.check(&limit, cost.parse().expect("a cost"), now, &mut rng);
                leases.extend(decision.lease);
                out.push(show_check(&decision));
            }
        }
    }
    collapse(&out)
}

fn collapse(out: &[String]) -> String {
    let mut runs: Vec<(String, usize)> = Vec::new();
    for token in out {
        match runs.last_mut() {
            Some((last, n)) if last == token => *n += 1,
            _ => runs.push((token.clone(), 1)),
        }
    }
    let shown: Vec<String> =
        runs.into_iter().map(|(t, n)| if n == 1 { t } else { format!("{t}x{n}") }).collect();
    shown.join(" ")
}

#[track_caller]
fn check(spec: &str, script: &str, expect: &str) {
    let got = run(spec, script);
    assert_eq!(got, expect, "\n  spec:   {spec}\n  script: {script}");
}

#[test]
fn fixed_window() {
    // Bursts at the edge: 2 × limit within 100 ms.
    check("fixed_window 3/1s", "@900ms 4x1 @1s 4x1", "Yx3 N(100ms) Yx3 N(1s)");
    check("fixed_window 3/1s", "@999999999ns 4x1 @1s 4x1", "Yx3 N(1ns) Yx3 N(1s)");
    // The grid is aligned to multiples of the period, not to the first hit.
    check("fixed_window 3/1s", "@1500ms 4x1", "Yx3 N(500ms)");
    check("fixed_window 3/1s", "@1200ms 1 ? @1999ms ? @2s ?", "Y q(r=2,t=800ms) q(r=2,t=1ms) q(r=3,t=0s)");
    // Costs: above the limit never passes and takes nothing; a cost that does not fit waits.
    check("fixed_window 3/1s", "@0 4 ? 3 2", "N(never) q(r=3,t=0s) Y N(1s)");
    check("fixed_window 3/1s", "@0 2 2 1", "Y N(1s) Y");
    // Cost 0 only asks; refunds never raise remaining above the limit.
    check("fixed_window 3/1s", "@0 0 0 ? 3x1 0", "Yx2 q(r=3,t=0s) Yx3 N(1s)");
    check("fixed_window 3/1s", "@0 3x1 -1 ? -5 ? 4x1", "Yx3 q(r=1,t=1s) q(r=3,t=0s) Yx3 N(1s)");
    // Time going backwards is no time passing: not the window of [0, 1s) again.
    check("fixed_window 3/1s", "@1500ms 3x1 @500ms 1 ?", "Yx3 N(500ms) q(r=0,t=500ms,N=500ms)");
    // Forced hits (from other nodes) can put the window over the limit until it ends.
    check("fixed_window 3/1s", "@0 !5 ? @1s ?", "q(r=0,t=1s,N=1s) q(r=3,t=0s)");
}

#[test]
fn sliding_window_log() {
    // A hit at t counts while now < t + period.
    check(
        "sliding_window_log 3/1s",
        "@0 1 @400ms 1 @800ms 2x1 @999ms 1 @1s 2x1",
        "Yx3 N(200ms) N(1ms) Y N(400ms)",
    );
    // No edge burst: 3 before the edge, none right after it.
    check(
        "sliding_window_log 3/1s",
        "@900ms 3x1 @1s 1 @1899ms 1 @1900ms 4x1",
        "Yx3 N(900ms) N(1ms) Yx3 N(1s)",
    );
    // A costly request waits until enough hits have left.
    check("sliding_window_log 3/1s", "@0 1 @100ms 1 @200ms 1 @300ms 2", "Yx3 N(800ms)");
    check("sliding_window_log 3/1s", "@0 4 ? 0 3 0", "N(never) q(r=3,t=0s) Yx2 N(1s)");
    // Refunds take the newest hits first and never overfill.
    check("sliding_window_log 3/1s", "@0 2 -1 ? @500ms 1 ? -9 ?", "Y q(r=2,t=1s) Y q(r=1,t=1s) q(r=3,t=0s)");
    check("sliding_window_log 3/1s", "@0 1 @500ms 2 -1 @1s ?", "Yx2 q(r=2,t=500ms)");
    check("sliding_window_log 3/1s", "@1s 3x1 @0 1", "Yx3 N(1s)");
    // Forced hits beyond the limit are kept (conservatively) until they leave.
    check(
        "sliding_window_log 2/1s",
        "@0 !1 @100ms !1 @200ms !1 ? @1100ms ? @1200ms ?",
        "q(r=0,t=1s,N=900ms) q(r=1,t=100ms) q(r=2,t=0s)",
    );
}

#[test]
fn sliding_window_counter() {
    // Cloudflare's example, scaled: 10 in the previous window, a quarter into the current one the
    // previous window still weighs 7.5, so 2 more pass; the third waits until the weight is 7.
    check("sliding_window_counter 10/1s", "@0 10x1 @1250ms 3x1", "Yx12 N(50ms)");
    // No 2 × burst across the edge: at the edge the previous window weighs fully.
    check("sliding_window_counter 10/1s", "@900ms 10x1 @1s 1", "Yx10 N(100ms)");
    check("sliding_window_counter 10/1s", "@0 10x1 @2s 10x1 1", "Yx20 N(1100ms)");
    check(
        "sliding_window_counter 10/1s",
        "@0 1 ? @1500ms ? @2s ?",
        "Y q(r=9,t=2s) q(r=9,t=500ms) q(r=10,t=0s)",
    );
    check("sliding_window_counter 10/1s", "@0 11 ? 10 0", "N(never) q(r=10,t=0s) Y N(1100ms)");
    // Refunds come off the current window first, then the previous one.
    check("sliding_window_counter 10/1s", "@0 10x1 @1500ms 5x1 -7 ?", "Yx15 q(r=6,t=500ms)");
    check("sliding_window_counter 10/1s", "@1500ms 10x1 @0 1", "Yx10 N(600ms)");
}

#[test]
fn expiring_counter() {
    // The window starts at the first hit (300 ms), not on the grid (0): it ends at 1300 ms.
    check("fixed_window 3/1s", "@300ms 3x1 1", "Yx3 N(700ms)");
    check(
        "expiring_counter 3/1s",
        "@300ms 3x1 1 ? @1299ms ? @1300ms ? 1 ?",
        "Yx3 N(1s) q(r=0,t=1s,N=1s) q(r=0,t=1ms,N=1ms) q(r=3,t=0s) Y q(r=2,t=1s)",
    );
    // A query starts no window; the first hit after the end starts the next one at its time.
    check(
        "expiring_counter 3/1s",
        "@0 ? @500ms 1 ? @1700ms ? 1 ?",
        "q(r=3,t=0s) Y q(r=2,t=1s) q(r=3,t=0s) Y q(r=2,t=1s)",
    );
    check("expiring_counter 3/1s", "@0 4 ? 3 0", "N(never) q(r=3,t=0s) Y N(1s)");
    // Refunds: a partial one keeps the window, a full one empties it (the next hit starts anew).
    check("expiring_counter 3/1s", "@0 2x1 -1 @400ms 1 ?", "Yx3 q(r=1,t=600ms)");
    check("expiring_counter 3/1s", "@0 2x1 -2 @400ms 1 ?", "Yx3 q(r=2,t=1s)");
    // Forced hits start a window too, and count beyond the limit until it ends.
    check("expiring_counter 2/1s", "@200ms !5 ? @1199ms 1 @1200ms ?", "q(r=0,t=1s,N=1s) N(1ms) q(r=2,t=0s)");
    // Time going backwards is no time passing.
    check("expiring_counter 3/1s", "@1s 3x1 @0 1", "Yx3 N(1s)");
}

#[test]
fn token_bucket() {
    // Capacity 10, rate 2/s: 10 at once, then 2 per second.
    check("token_bucket 2/1s burst=10", "@0 11x1 @1s 3x1 @2s 3x1", "Yx10 N(500ms) Yx2 N(500ms) Yx2 N(500ms)");
    // Refill after idle, capped at the capacity.
    check(
        "token_bucket 2/1s burst=10",
        "@0 10x1 ? @3s ? @5s ? @60s ?",
        "Yx10 q(r=0,t=5s,N=500ms) q(r=6,t=2s) q(r=10,t=0s)x2",
    );
    // Default capacity is the limit; the interval is rounded up: ceil(1s / 3).
    check("token_bucket 5/1s", "@0 6x1", "Yx5 N(200ms)");
    check("token_bucket 3/1s", "@0 4x1 @333333333ns 1 @333333334ns 1", "Yx3 N(333333334ns) N(1ns) Y");
    check("token_bucket 2/1s burst=10", "@0 11 ? 10 0", "N(never) q(r=10,t=0s) Y N(500ms)");
    check("token_bucket 2/1s burst=10", "@0 7 4", "Y N(500ms)");
    check("token_bucket 1/1s", "@0 0 0 1 0", "Yx3 N(1s)");
    check("token_bucket 2/1s burst=10", "@0 3 -10 ?", "Y q(r=10,t=0s)");
    check("token_bucket 2/1s burst=10", "@0 10x1 -3 ?", "Yx10 q(r=3,t=3500ms)");
    check("token_bucket 2/1s burst=10", "@1s 10x1 @0 1 @1500ms 2x1", "Yx10 N(500ms) Y N(500ms)");
    // Debt from forced hits is paid back by waiting.
    check(
        "token_bucket 2/1s burst=10",
        "@0 !14 ? @2s ? @2500ms 1",
        "q(r=0,t=7s,N=2500ms) q(r=0,t=5s,N=500ms) Y",
    );
}

#[test]
fn gcra() {
    // Default burst 1: requests are spaced by the interval.
    check("gcra 10/1s", "@0 2x1 @99ms 1 @100ms 2x1 @250ms 1", "Y N(100ms) N(1ms) Y N(100ms) Y");
    check("gcra 10/1s burst=3", "@0 4x1 @100ms 2x1", "Yx3 N(100ms) Y N(100ms)");
    check("gcra 10/1s", "@0 2 ? 0", "N(never) q(r=1,t=0s) Y");
    check("gcra 10/1s burst=3", "@0 2 2 -5 ? 3", "Y N(100ms) q(r=3,t=0s) Y");
}

#[test]
fn leaky_bucket_shaper() {
    // nginx `rate=1r/s burst=5 nodelay`: 6 back to back pass, the 7th is refused.
    check("leaky_bucket 1/1s burst=5 delay=5", "@0 7x1", "Yx6 N(1s)");
    // nginx default (delay=0): the queued requests are delayed by multiples of the interval.
    check("leaky_bucket 1/1s burst=5", "@0 7x1", "Y Y+1s Y+2s Y+3s Y+4s Y+5s N(1s)");
    // `delay=2`: the first 2 queued pass at once, the rest wait.
    check("leaky_bucket 1/1s burst=5 delay=2", "@0 7x1", "Yx3 Y+1s Y+2s Y+3s N(1s)");
    // The queue drains at the rate.
    check(
        "leaky_bucket 1/1s burst=5",
        "@0 6x1 @2500ms 3x1",
        "Y Y+1s Y+2s Y+3s Y+4s Y+5s Y+3500ms Y+4500ms N(500ms)",
    );
    // No burst: one at a time, like GCRA.
    check("leaky_bucket 2/1s", "@0 2x1 @500ms 1", "Y N(500ms) Y");
    check("leaky_bucket 1/1s burst=5", "@0 7 ? 6 ?", "N(never) q(r=6,t=0s) Y+5s q(r=0,t=6s,N=1s)");
    check("leaky_bucket 1/1s burst=5", "@0 3x1 -10 ? 1", "Y Y+1s Y+2s q(r=6,t=0s) Y");
}

#[test]
fn concurrency() {
    check("concurrency 2/10s", "@0 3x1 R 1 @1s R R 2", "Yx2 N(10s) R+ Y R+x2 Y");
    // A lease that is never released expires after the period.
    check("concurrency 2/10s", "@0 3x1 @9999ms 1 @10s 1", "Yx2 N(10s) N(1ms) Y");
    check("concurrency 2/10s", "@0 2x1 @10s R R 1", "Yx2 R-x2 Y");
    check("concurrency 3/10s", "@0 1 @1s 1 @2s 2", "Yx2 N(8s)");
    check("concurrency 2/10s", "@0 3 ? 0 2 0 ?", "N(never) q(r=2,t=0s) Yx2 N(10s) q(r=0,t=10s,N=10s)");
    // Leases are not hits: refunds and forced hits do nothing.
    check("concurrency 2/10s", "@0 2x1 -2 !9 ? R ?", "Yx2 q(r=0,t=10s,N=10s) R+ q(r=1,t=10s)");
    check("concurrency 2/10s", "@5s 2x1 @0 1", "Yx2 N(10s)");
}

/// Every algorithm: a cost above the capacity is refused for good and takes nothing; a query never
/// takes anything.
#[test]
fn costs_above_capacity_and_queries_take_nothing() {
    for (spec, capacity) in [
        ("fixed_window 3/1s", 3),
        ("sliding_window_log 3/1s", 3),
        ("sliding_window_counter 3/1s", 3),
        ("token_bucket 3/1s burst=5", 5),
        ("gcra 3/1s burst=2", 2),
        ("leaky_bucket 3/1s burst=4", 5),
        ("concurrency 3/1s", 3),
        ("expiring_counter 3/1s", 3),
    ] {
        let script = format!("@0 {} {} 5x0 ? {capacity}", capacity + 1, u64::MAX);
        let last = if spec.starts_with("leaky") { "Y+1333333336ns" } else { "Y" };
        check(spec, &script, &format!("N(never)x2 Yx5 q(r={capacity},t=0s) {last}"));
    }
}

/// A bucket used under a limit of another algorithm family (after a policy reload) starts fresh;
/// within a family the state carries over.
#[test]
fn a_limit_of_another_family_starts_fresh() {
    let spec = |text| Limit::new(parse_spec(text)).expect("a valid spec");
    let (tokens, window, sliding) =
        (spec("token_bucket 2/1s burst=3"), spec("fixed_window 3/1s"), spec("sliding_window_counter 3/1s"));
    let mut rng = CoreRng::seed_from_u64(0);
    let now = Instant::from_millis(100);
    let mut bucket = Bucket::new(&tokens, now);
    assert!(bucket.check(&tokens, 3, now, &mut rng).allowed);
    assert!(!bucket.check(&tokens, 1, now, &mut rng).allowed);
    assert_eq!(show_query(&bucket.check(&window, 0, now, &mut rng)), "q(r=3,t=0s)");
    assert!(bucket.check(&window, 3, now, &mut rng).allowed);
    // Fixed window and sliding window counter share their state: the 3 hits still count.
    assert_eq!(show_query(&bucket.check(&sliding, 0, now, &mut rng)), "q(r=0,t=1900ms,N=1233333334ns)");
    assert_eq!(show_query(&bucket.check(&tokens, 0, now, &mut rng)), "q(r=3,t=0s)");
}
