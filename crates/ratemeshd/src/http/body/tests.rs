//! The HTTP API's bodies: parsing, validation naming the field, and the answers' JSON.

use super::*;
use std::sync::Arc;
use std::time::Duration;

use ratemesh_core::{Decision, Fallback, LeaseId, Limit, LimitSpec, Mode, Namespace, Policy};

use crate::check::Target;
use crate::config::{Config, INLINE_LABEL, KEY_BYTES_MAX_DEFAULT, Rule};
use crate::policy::tests::table;

fn bounds() -> Bounds {
    Bounds::default()
}

fn check(body: &str) -> Result<ValidCheck, BodyError> {
    parse_check(body.as_bytes(), &table(), &bounds())
}

/// Asserts that `body` is refused as a bad request naming `field`, and returns the message.
#[track_caller]
fn bad_check(body: &str, field: &str) -> String {
    let error = check(body).expect_err("refused");
    assert_eq!(error.field(), Some(field), "{error}");
    assert_eq!(error.http_status(), 400, "{error}");
    assert!(error.to_string().starts_with(field), "{error}");
    error.to_string()
}

#[test]
fn unlimited_and_shadow_policies_carry_their_flags() {
    let table = table();
    let health = table.match_descriptor("edge", &[("path", "/healthz")]).expect("matches");
    assert_eq!(health.entry.rule, Rule::Unlimited);
    let check = check(r#"{"key": "k", "policy": "shadow"}"#).expect("valid");
    assert!(check.target.shadow_mode());
    assert_eq!(check.target.label(), "shadow");
}

#[test]
fn an_inline_check_is_validated() {
    let body = r#"{"key": "user:42", "cost": 3, "limit": {"algorithm": "token_bucket", "limit": 100,
        "period_ms": 1000, "burst": 100, "mode": "exact"}}"#;
    let check = check(body).expect("valid");
    assert_eq!(check.cost, 3);
    assert_eq!(check.target.label(), INLINE_LABEL);
    assert!(!check.target.shadow_mode());
    let policy = check.target.policy().expect("limited");
    assert_eq!(policy.mode, Mode::Exact);
    assert_eq!(policy.fallback, Fallback::LocalShare);
    assert_eq!(policy.limit.capacity(), 100);
    assert_eq!(check.key, check.target.namespace().key(b"user:42"));
}

#[test]
fn inline_limits_share_buckets_exactly_when_they_are_the_same_limit() {
    let namespace = |limit: &str| {
        check(&format!(r#"{{"key": "k", "limit": {limit}}}"#)).expect("valid").target.namespace()
    };
    let base = r#"{"algorithm": "gcra", "limit": 10, "period_ms": 1000}"#;
    let reordered = r#"{"period_ms": 1000, "limit": 10, "algorithm": "gcra"}"#;
    assert_eq!(namespace(base), namespace(reordered));
    for other in [
        r#"{"algorithm": "gcra", "limit": 11, "period_ms": 1000}"#,
        r#"{"algorithm": "gcra", "limit": 10, "period_ms": 1001}"#,
        r#"{"algorithm": "token_bucket", "limit": 10, "period_ms": 1000}"#,
        r#"{"algorithm": "gcra", "limit": 10, "period_ms": 1000, "burst": 1}"#,
        r#"{"algorithm": "gcra", "limit": 10, "period_ms": 1000, "mode": "exact"}"#,
        r#"{"algorithm": "gcra", "limit": 10, "period_ms": 1000, "fallback": "fail_open"}"#,
    ] {
        assert_ne!(namespace(base), namespace(other), "{other}");
    }
    assert_ne!(namespace(base), table().get("api").expect("configured").namespace);
}

#[test]
fn a_policy_check_defaults_to_cost_one_and_allows_cost_zero() {
    let check_ = check(r#"{"key": "k", "policy": "api"}"#).expect("valid");
    assert_eq!(check_.cost, 1);
    assert_eq!(check_.target.label(), "api");
    assert_eq!(check_.key, Namespace::new(b"api").key(b"k"));
    assert_eq!(check(r#"{"key": "k", "policy": "api", "cost": 0}"#).expect("valid").cost, 0);
    let huge = format!(r#"{{"key": "k", "policy": "api", "cost": {}}}"#, u64::MAX);
    assert_eq!(check(&huge).expect("valid: refused by the limit, not the parser").cost, u64::MAX);
}

#[test]
fn malformed_json_is_a_syntax_error_with_a_position() {
    for body in
        ["", "{", r#"{"key": "k",}"#, "{\n\"key\" \"k\"}", r#"{"key": "k", "policy": "api"} x"#, "nul"]
    {
        let error = check(body).expect_err("malformed");
        assert!(matches!(error, BodyError::Syntax { .. }), "{body}: {error}");
        assert_eq!(error.http_status(), 400);
        assert_eq!(error.field(), None);
    }
    let error = check("{\n\"key\" \"k\"}").expect_err("malformed");
    assert!(matches!(error, BodyError::Syntax { line: 2, column: 7, .. }), "{error}");
}

#[test]
fn a_body_that_is_an_array_is_not_read_as_a_check() {
    for body in [r#"["k", "api"]"#, " \n[{\"key\": \"k\", \"policy\": \"api\"}]"] {
        let message = bad_check(body, "body");
        assert!(message.contains("object"), "{body}: {message}");
    }
}

#[test]
fn wrong_types_name_the_field() {
    bad_check(r#"{"key": 5, "policy": "api"}"#, "key");
    bad_check(r#"{"key": "k", "policy": "api", "cost": "1"}"#, "cost");
    bad_check(r#"{"key": "k", "policy": ["api"]}"#, "policy");
    bad_check(r#"{"key": "k", "limit": "100/s"}"#, "limit");
    bad_check(r#"{"key": "k", "limit": {"algorithm": 1, "limit": 1, "period_ms": 1}}"#, "limit.algorithm");
    bad_check(
        r#"{"key": "k", "limit": {"algorithm": "gcra", "limit": true, "period_ms": 1}}"#,
        "limit.limit",
    );
    bad_check(
        r#"{"key": "k", "limit": {"algorithm": "gcra", "limit": 1, "period_ms": 1.5}}"#,
        "limit.period_ms",
    );
    bad_check("[]", "body");
    bad_check("42", "body");
}

#[test]
fn negative_and_huge_numbers_name_the_field() {
    bad_check(r#"{"key": "k", "policy": "api", "cost": -9223372036854775809}"#, "cost");
    bad_check(r#"{"key": "k", "policy": "api", "cost": 18446744073709551616}"#, "cost");
    bad_check(r#"{"key": "k", "policy": "api", "cost": 1e400}"#, "cost");
    bad_check(
        r#"{"key": "k", "limit": {"algorithm": "gcra", "limit": -5, "period_ms": 1000}}"#,
        "limit.limit",
    );
    let huge =
        r#"{"key": "k", "limit": {"algorithm": "gcra", "limit": 5, "period_ms": 99999999999999999999}}"#;
    bad_check(huge, "limit.period_ms");
    // In range for the type, out of range for a limit: the core's check, named.
    let period =
        format!(r#"{{"key": "k", "limit": {{"algorithm": "gcra", "limit": 5, "period_ms": {}}}}}"#, u64::MAX);
    let message = bad_check(&period, "limit.period_ms");
    assert!(
        message.contains("too large (at most 3153600000000 ms"),
        "in milliseconds, as written: {message}"
    );
    let rate =
        format!(r#"{{"key": "k", "limit": {{"algorithm": "gcra", "limit": {}, "period_ms": 1}}}}"#, u64::MAX);
    let message = bad_check(&rate, "limit.limit");
    assert!(message.contains("at most 1000000 per 1 ms"), "{message}");
    let burst = r#"{"key": "k", "limit": {"algorithm": "token_bucket", "limit": 1, "period_ms": 1000,
        "burst": 18446744073709551615}}"#;
    bad_check(burst, "limit.burst");
}

#[test]
fn limit_values_are_checked_by_the_core_and_named() {
    let limit = |fields: &str| format!(r#"{{"key": "k", "limit": {{{fields}}}}}"#);
    bad_check(&limit(r#""algorithm": "gcra", "limit": 0, "period_ms": 1000"#), "limit.limit");
    bad_check(&limit(r#""algorithm": "gcra", "limit": 1, "period_ms": 0"#), "limit.period_ms");
    bad_check(&limit(r#""algorithm": "concurrency", "limit": 1, "period_ms": 1, "burst": 1"#), "limit.burst");
    bad_check(&limit(r#""algorithm": "gcra", "limit": 1, "period_ms": 1, "delay": 1"#), "limit.delay");
    bad_check(
        &limit(r#""algorithm": "token_bucket", "limit": 1, "period_ms": 1, "burst": 0"#),
        "limit.burst",
    );
    let message =
        bad_check(&limit(r#""algorithm": "token_buckets", "limit": 1, "period_ms": 1"#), "limit.algorithm");
    assert!(message.contains("sliding_window_log"), "{message}");
    bad_check(&limit(r#""algorithm": "gcra", "limit": 1, "period_ms": 1, "mode": "strict""#), "limit.mode");
    bad_check(
        &limit(r#""algorithm": "gcra", "limit": 1, "period_ms": 1, "fallback": "retry""#),
        "limit.fallback",
    );
    bad_check(&limit(r#""limit": 1, "period_ms": 1"#), "limit.algorithm");
    bad_check(&limit(r#""algorithm": "gcra", "period_ms": 1"#), "limit.limit");
    bad_check(&limit(r#""algorithm": "gcra", "limit": 1"#), "limit.period_ms");
}

#[test]
fn keys_must_be_present_non_empty_and_bounded() {
    bad_check(r#"{"policy": "api"}"#, "key");
    bad_check(r#"{"key": null, "policy": "api"}"#, "key");
    bad_check(r#"{"key": "", "policy": "api"}"#, "key");
    let at_bound = format!(r#"{{"key": "{}", "policy": "api"}}"#, "k".repeat(KEY_BYTES_MAX_DEFAULT));
    assert!(check(&at_bound).is_ok());
    let over = format!(r#"{{"key": "{}", "policy": "api"}}"#, "k".repeat(KEY_BYTES_MAX_DEFAULT + 1));
    let message = bad_check(&over, "key");
    assert!(message.contains("4097 bytes"), "{message}");
    // A 64 KiB key makes the body itself too large under the default bounds: 413.
    let huge = format!(r#"{{"key": "{}", "policy": "api"}}"#, "k".repeat(64 * 1024));
    let error = check(&huge).expect_err("refused");
    assert_eq!(error.http_status(), 413, "{error}");
    assert!(matches!(error, BodyError::TooLarge { max_bytes: 65536, .. }));
    // With a larger body bound, it is the key's bound that refuses it.
    let roomy = Bounds { http_body_bytes_max: 1 << 20, ..Bounds::default() };
    let error = parse_check(huge.as_bytes(), &table(), &roomy).expect_err("refused");
    assert_eq!(error.field(), Some("key"), "{error}");
}

#[test]
fn unknown_fields_are_refused_by_name() {
    let message = bad_check(r#"{"key": "k", "policy": "api", "weight": 1}"#, "weight");
    assert!(message.contains("unknown field `weight`"), "{message}");
    bad_check(
        r#"{"key": "k", "limit": {"algorithm": "gcra", "limit": 1, "period_ms": 1, "unit": "s"}}"#,
        "limit.unit",
    );
}

#[test]
fn exactly_one_of_limit_and_policy() {
    bad_check(r#"{"key": "k"}"#, "limit");
    let both = r#"{"key": "k", "policy": "api", "limit": {"algorithm": "gcra", "limit": 1, "period_ms": 1}}"#;
    bad_check(both, "policy");
}

#[test]
fn an_unknown_policy_is_not_found() {
    let error = check(r#"{"key": "k", "policy": "nope"}"#).expect_err("unknown");
    assert_eq!(error.http_status(), 404);
    assert_eq!(error.field(), Some("policy"));
    assert_eq!(
        serde_json::to_value(ErrorResponse::from(&error)).expect("serializes"),
        serde_json::json!({"error": "policy: no policy named \"nope\"", "field": "policy"})
    );
    let syntax = check("{").expect_err("malformed");
    let json = serde_json::to_value(ErrorResponse::from(&syntax)).expect("serializes");
    assert!(json.get("field").is_none(), "{json}");
}

#[test]
fn batches_are_bounded_and_name_the_item() {
    let table = table();
    let bounds = Bounds { batch_len_max: 3, ..Bounds::default() };
    let item = r#"{"key": "k", "policy": "api"}"#;
    let batch = |items: &[&str]| format!("[{}]", items.join(","));
    let checks = parse_check_batch(batch(&[item, item, item]).as_bytes(), &table, &bounds).expect("valid");
    assert_eq!(checks.len(), 3);
    assert!(parse_check_batch(b"[]", &table, &bounds).expect("valid").is_empty());
    let error = parse_check_batch(batch(&[item; 4]).as_bytes(), &table, &bounds).expect_err("too long");
    assert_eq!(error.field(), Some("[3]"), "{error}");
    let bad = batch(&[item, r#"{"key": "", "policy": "api"}"#]);
    let error = parse_check_batch(bad.as_bytes(), &table, &bounds).expect_err("bad item");
    assert_eq!(error.field(), Some("[1].key"), "{error}");
    let typed = batch(&[item, item, r#"{"key": "k", "policy": "api", "cost": "1"}"#]);
    let error = parse_check_batch(typed.as_bytes(), &table, &bounds).expect_err("bad item");
    assert_eq!(error.field(), Some("[2].cost"), "{error}");
    let unknown = batch(&[r#"{"key": "k", "policy": "nope"}"#]);
    let error = parse_check_batch(unknown.as_bytes(), &table, &bounds).expect_err("unknown policy");
    assert_eq!((error.field(), error.http_status()), (Some("[0].policy"), 404));
    let error = parse_check_batch(item.as_bytes(), &table, &bounds).expect_err("not a list");
    assert_eq!(error.field(), Some("body"), "{error}");
}

#[test]
fn releases_need_a_lease_under_a_concurrency_limit() {
    let table = table();
    let release = |body: &str| parse_release(body.as_bytes(), &table, &bounds());
    let valid = release(r#"{"key": "job", "policy": "leases", "lease": 7}"#).expect("valid");
    assert_eq!(valid.lease, LeaseId(7));
    let text =
        release(r#"{"key": "job", "policy": "leases", "lease": "18446744073709551615"}"#).expect("valid");
    assert_eq!(text.lease, LeaseId(u64::MAX), "a string keeps all 64 bits");
    for bad in [r#""""#, r#""+7""#, r#"" 7""#, r#""7.0""#, r#""18446744073709551616""#, "7.5", "true"] {
        let body = format!(r#"{{"key": "job", "policy": "leases", "lease": {bad}}}"#);
        assert_eq!(release(&body).expect_err(bad).field(), Some("lease"), "{bad}");
    }
    assert_eq!(valid.key, Namespace::new(b"leases").key(b"job"));
    assert_eq!(valid.policy.limit.algorithm(), Algorithm::Concurrency);
    let inline =
        r#"{"key": "job", "lease": 1, "limit": {"algorithm": "concurrency", "limit": 2, "period_ms": 1000}}"#;
    let inline_release = release(inline).expect("valid");
    let inline_check =
        check(r#"{"key": "job", "limit": {"algorithm": "concurrency", "limit": 2, "period_ms": 1000}}"#)
            .expect("valid");
    assert_eq!(inline_release.key, inline_check.key, "a release finds the bucket of its check");

    let missing = release(r#"{"key": "job", "policy": "leases"}"#).expect_err("no lease");
    assert_eq!(missing.field(), Some("lease"));
    let negative = release(r#"{"key": "job", "policy": "leases", "lease": -1}"#).expect_err("negative");
    assert_eq!(negative.field(), Some("lease"));
    let not_concurrency =
        release(r#"{"key": "job", "policy": "api", "lease": 1}"#).expect_err("token bucket");
    assert_eq!(not_concurrency.field(), Some("policy"));
    let inline_gcra =
        r#"{"key": "job", "lease": 1, "limit": {"algorithm": "gcra", "limit": 2, "period_ms": 1000}}"#;
    assert_eq!(release(inline_gcra).expect_err("gcra").field(), Some("limit.algorithm"));
    assert_eq!(
        release(r#"{"key": "job", "policy": "nope", "lease": 1}"#).expect_err("unknown").http_status(),
        404
    );
    assert_eq!(
        release(r#"{"key": "job", "policy": "leases", "lease": 1, "x": 1}"#).expect_err("unknown").field(),
        Some("x")
    );
}

fn decision(allowed: bool) -> Decision {
    Decision {
        allowed,
        limit: 100,
        remaining: if allowed { 41 } else { 0 },
        reset_after: Duration::from_micros(1_500),
        retry_after: (!allowed).then(|| Duration::from_nanos(2_000_001)),
        delay: Duration::ZERO,
        lease: None,
    }
}

/// The JSON of `decision` under a limit of `algorithm`, of a policy in shadow mode or not.
fn response(decision: &Decision, algorithm: Algorithm, shadow_mode: bool) -> CheckResponse {
    let name = if shadow_mode { "shadow" } else { "api" };
    let target = Target::Named(Arc::clone(table().get(name).expect("configured")));
    let limit = Limit::new(LimitSpec::new(algorithm, 100, Duration::from_secs(1))).expect("valid");
    let policy = Arc::new(Policy::new(limit, Mode::Exact));
    CheckResponse::from(&Answer::limited(target, policy, *decision))
}

#[test]
fn responses_round_up_and_show_retry_after_as_null_when_allowed() {
    let allowed = response(&decision(true), Algorithm::TokenBucket, false);
    assert_eq!(
        serde_json::to_value(&allowed).expect("serializes"),
        serde_json::json!({"allowed": true, "limit": 100, "remaining": 41, "reset_after_ms": 2, "retry_after_ms": null})
    );
    let refused = response(&decision(false), Algorithm::TokenBucket, false);
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after_ms, Some(3), "2.000001 ms rounds up: never early");
    let never = Decision { retry_after: None, ..decision(false) };
    assert_eq!(response(&never, Algorithm::TokenBucket, false).retry_after_ms, None);
}

#[test]
fn responses_carry_delay_for_the_shaper_and_leases_for_concurrency() {
    let delayed = Decision { delay: Duration::from_millis(250), ..decision(true) };
    let shaper = response(&delayed, Algorithm::LeakyBucketShaper, false);
    assert_eq!(shaper.delay_ms, Some(250));
    let json = serde_json::to_value(response(&decision(true), Algorithm::LeakyBucketShaper, false))
        .expect("serializes");
    assert_eq!(json["delay_ms"], 0);
    let leased = Decision { lease: Some(LeaseId(9)), ..decision(true) };
    let concurrency = response(&leased, Algorithm::Concurrency, false);
    assert_eq!((concurrency.lease, concurrency.delay_ms), (Some(LeaseJson(9)), None));
    let json = serde_json::to_value(&concurrency).expect("serializes");
    assert_eq!(json["lease"], "9", "a string: lease ids use all 64 bits");
    assert!(json.get("delay_ms").is_none(), "{json}");
}

#[test]
fn shadow_mode_answers_allowed_with_the_real_counts() {
    let response = response(&decision(false), Algorithm::FixedWindow, true);
    assert!(response.allowed);
    assert_eq!((response.remaining, response.retry_after_ms), (0, None));
}

#[test]
fn bodies_serialize_for_clients() {
    let body = CheckBody { key: Some("k".into()), policy: Some("api".into()), ..CheckBody::default() };
    let json = serde_json::to_string(&body).expect("serializes");
    assert_eq!(json, r#"{"key":"k","policy":"api"}"#);
    assert!(parse_check(json.as_bytes(), &table(), &bounds()).is_ok());
    let release = ReleaseBody {
        key: Some("k".into()),
        policy: Some("leases".into()),
        lease: Some(LeaseJson(3)),
        limit: None,
    };
    let json = serde_json::to_string(&release).expect("serializes");
    assert!(json.contains(r#""lease":"3""#), "{json}");
    assert!(parse_release(json.as_bytes(), &table(), &bounds()).is_ok());
}

#[test]
fn a_negative_cost_is_a_refund_except_under_a_concurrency_limit() {
    let refund = check(r#"{"key": "k", "policy": "api", "cost": -3}"#).expect("valid");
    assert_eq!((refund.cost, refund.refund), (3, true));
    let message = bad_check(r#"{"key": "k", "policy": "leases", "cost": -1}"#, "cost");
    assert!(message.contains("concurrency"), "{message}");
    let taken = check(r#"{"key": "k", "policy": "api", "cost": 3}"#).expect("valid");
    assert_eq!((taken.cost, taken.refund), (3, false));
}

#[test]
fn a_charge_needs_a_cost_and_a_limit_that_counts_hits() {
    let charge = |body: &str| parse_charge(body.as_bytes(), &table(), &bounds());
    let valid = charge(r#"{"key": "k", "policy": "api", "cost": 30}"#).expect("valid");
    assert_eq!(valid.cost, 30);
    let missing = charge(r#"{"key": "k", "policy": "api"}"#).expect_err("no cost");
    assert_eq!((missing.field(), missing.http_status()), (Some("cost"), 400), "{missing}");
    let negative = charge(r#"{"key": "k", "policy": "api", "cost": -1}"#).expect_err("negative");
    assert_eq!(negative.field(), Some("cost"), "{negative}");
    let leases = charge(r#"{"key": "k", "policy": "leases", "cost": 1}"#).expect_err("concurrency");
    assert_eq!(leases.field(), Some("policy"), "{leases}");
    let unknown = charge(r#"{"key": "k", "policy": "nope", "cost": 1}"#).expect_err("unknown");
    assert_eq!((unknown.field(), unknown.http_status()), (Some("policy"), 404), "{unknown}");
}

#[test]
fn an_all_or_nothing_group_takes_no_refunds_and_keeps_the_batch_bound() {
    let bounds = Bounds { batch_len_max: 2, ..Bounds::default() };
    let all = |body: &str| parse_check_all(body.as_bytes(), &table(), &bounds);
    let item = r#"{"key": "k", "policy": "api"}"#;
    assert_eq!(all(&format!("[{item},{item}]")).expect("valid").len(), 2);
    let long = all(&format!("[{item},{item},{item}]")).expect_err("too long");
    assert_eq!(long.field(), Some("[2]"), "{long}");
    let refund =
        all(&format!(r#"[{item},{{"key": "k", "policy": "api", "cost": -1}}]"#)).expect_err("refund");
    assert_eq!(refund.field(), Some("[1].cost"), "{refund}");
}

const VARIANTS: &str = r#"
[[policies]]
name = "plans"
algorithm = "token_bucket"
limit = 10
period_ms = 60000
overrides = [{ key = "customer:acme", limit = 100, burst = 200 }]
tiers = [{ name = "pro", limit = 50 }, { name = "slow", period_ms = 120000 }]
"#;

fn variants_table() -> PolicyTable {
    let config = Config::parse(VARIANTS, "variants.toml").expect("valid");
    PolicyTable::from_config(&config)
}

#[test]
fn overrides_and_tiers_choose_their_own_limit_and_buckets() {
    let table = variants_table();
    let check = |body: &str| parse_check(body.as_bytes(), &table, &bounds());
    let limit_of = |check: &ValidCheck| check.target.policy().expect("limited").limit.spec().clone();
    let base = check(r#"{"key": "customer:other", "policy": "plans"}"#).expect("valid");
    assert_eq!((limit_of(&base).limit, limit_of(&base).burst), (10, None));
    let acme = check(r#"{"key": "customer:acme", "policy": "plans"}"#).expect("valid");
    assert_eq!((limit_of(&acme).limit, limit_of(&acme).burst), (100, Some(200)));
    let pro = check(r#"{"key": "customer:other", "policy": "plans", "tier": "pro"}"#).expect("valid");
    assert_eq!(limit_of(&pro).limit, 50);
    let slow = check(r#"{"key": "customer:other", "policy": "plans", "tier": "slow"}"#).expect("valid");
    assert_eq!((limit_of(&slow).limit, limit_of(&slow).period), (10, Duration::from_secs(120)));
    // The override wins over the tier; each limit has its own buckets; labels stay the policy's.
    let acme_pro = check(r#"{"key": "customer:acme", "policy": "plans", "tier": "pro"}"#).expect("valid");
    assert_eq!(limit_of(&acme_pro).limit, 100);
    assert_ne!(base.key, pro.key);
    assert_ne!(base.key, acme.key);
    assert!([&base, &acme, &pro].iter().all(|c| c.target.label() == "plans"));
    let unknown = check(r#"{"key": "k", "policy": "plans", "tier": "gold"}"#).expect_err("unknown tier");
    assert_eq!((unknown.field(), unknown.http_status()), (Some("tier"), 400), "{unknown}");
    let inline = r#"{"key": "k", "limit": {"algorithm": "gcra", "limit": 1, "period_ms": 1}, "tier": "pro"}"#;
    assert_eq!(check(inline).expect_err("inline tier").field(), Some("tier"));
}
