//! The rate-limit response headers of a decision, for any server on `http` 1 (axum, hyper,
//! tonic; the tower layer and the daemon both write them with [`insert_headers`]).
//!
//! Two families are written, because clients read one or the other:
//!
//! - the legacy, widely read `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`
//!   and `Retry-After`;
//! - the IETF httpapi draft's structured fields (RFC 8941 lists):
//!   `RateLimit-Policy: "<name>";q=<limit>;w=<window>` and `RateLimit: "<name>";r=<remaining>;t=<reset>`.
//!
//! Every duration is whole seconds **rounded up**: a client that waits the advertised time is never
//! early. The header values are printable ASCII by construction (the policy name goes through
//! [`sf_string`]), so writing them cannot fail.
//!
//! ```
//! use std::time::Duration;
//! use ratemesh::NamedPolicy;
//! use ratemesh::headers::insert_headers;
//! use ratemesh_core::{Algorithm, Decision, Limit, LimitSpec, Mode, Policy};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limit = Limit::new(LimitSpec::new(Algorithm::TokenBucket, 100, Duration::from_secs(60)))?;
//! let policy = NamedPolicy::new("api", Policy::new(limit, Mode::Exact));
//! let decision = Decision {
//!     allowed: true,
//!     limit: 100,
//!     remaining: 42,
//!     reset_after: Duration::from_millis(34_800),
//!     retry_after: None,
//!     delay: Duration::ZERO,
//!     lease: None,
//! };
//! let mut headers = http::HeaderMap::new();
//! insert_headers(&mut headers, &policy, &decision);
//! assert_eq!(headers["x-ratelimit-remaining"], "42");
//! assert_eq!(headers["x-ratelimit-reset"], "35");
//! assert_eq!(headers["ratelimit-policy"], r#""api";q=100;w=60"#);
//! assert_eq!(headers["ratelimit"], r#""api";r=42;t=35"#);
//! assert!(!headers.contains_key("retry-after"));
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use ratemesh_core::Decision;

use crate::node::NamedPolicy;

/// `X-RateLimit-Limit`: the limit in force ([`Decision::limit`]).
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`: hits that would still pass now ([`Decision::remaining`]).
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`: seconds (rounded up) until the key is fresh again ([`Decision::reset_after`]).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit-Policy` (IETF draft): `"<name>";q=<limit>;w=<window seconds>`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF draft): `"<name>";r=<remaining>;t=<seconds until reset>`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Writes the rate-limit headers of `decision`, taken under `policy`, into `headers`, replacing
/// any values of the same names (one limiter's answer per response: a nested limiter's headers
/// would otherwise contradict each other).
///
/// - `X-RateLimit-Limit` = `decision.limit`, `X-RateLimit-Remaining` = `decision.remaining`,
///   `X-RateLimit-Reset` = `decision.reset_after` in seconds rounded up;
/// - `Retry-After` only when the decision refuses **and** has a retry time: seconds rounded up,
///   at least 1 (a refused client told `0` would retry at once and be refused again). A request
///   that can never pass (its cost exceeds the capacity) gets none: there is no time to wait for;
/// - `RateLimit-Policy: "<name>";q=<limit>;w=<window>`, the window being the policy's period in
///   seconds rounded up, at least 1 (`w=0` is meaningless);
/// - `RateLimit: "<name>";r=<remaining>;t=<reset>`, `t` as in `X-RateLimit-Reset`.
pub fn insert_headers(headers: &mut HeaderMap, policy: &NamedPolicy, decision: &Decision) {
    insert_headers_for(headers, policy.name(), policy.policy().limit.spec().period, decision);
}

/// [`insert_headers`] for a caller that has a policy's name and window but no [`NamedPolicy`]
/// (the daemon, whose policies live in its own table): `name` is the policy's name in
/// `RateLimit-Policy` and `RateLimit`, `window` its period.
pub fn insert_headers_for(headers: &mut HeaderMap, name: &str, window: Duration, decision: &Decision) {
    let fields = Fields::of(window, decision);
    headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(fields.limit));
    headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(fields.remaining));
    headers.insert(X_RATELIMIT_RESET, HeaderValue::from(fields.reset));
    match fields.retry_after {
        Some(secs) => headers.insert(RETRY_AFTER, HeaderValue::from(secs)),
        // A stale `Retry-After` from an inner service would contradict an admission.
        None => headers.remove(RETRY_AFTER),
    };
    let name = sf_string(name);
    let Fields { quota, window, sf_remaining, sf_reset, .. } = fields;
    insert_ascii(headers, RATELIMIT_POLICY, format!("{name};q={quota};w={window}"));
    insert_ascii(headers, RATELIMIT, format!("{name};r={sf_remaining};t={sf_reset}"));
}

/// Appends the rate-limit headers of [`insert_headers_for`] (the same fields, values and order) to
/// `out` as HTTP/1.1 header lines, `name: value\r\n` with lowercase names, without an allocation:
/// for a server that writes its responses itself (the daemon's `POST /v1/check` front).
pub fn write_header_lines(out: &mut Vec<u8>, name: &str, window: Duration, decision: &Decision) {
    let fields = Fields::of(window, decision);
    let mut number = itoa::Buffer::new();
    let mut line = |header: &HeaderName, value: u64| {
        out.extend_from_slice(header.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(number.format(value).as_bytes());
        out.extend_from_slice(b"\r\n");
    };
    line(&X_RATELIMIT_LIMIT, fields.limit);
    line(&X_RATELIMIT_REMAINING, fields.remaining);
    line(&X_RATELIMIT_RESET, fields.reset);
    if let Some(secs) = fields.retry_after {
        line(&RETRY_AFTER, secs);
    }
    let mut structured = |header: &HeaderName, parameters: [(&[u8], u64); 2]| {
        out.extend_from_slice(header.as_str().as_bytes());
        out.extend_from_slice(b": ");
        push_sf_string(out, name);
        for (parameter, value) in parameters {
            out.extend_from_slice(parameter);
            out.extend_from_slice(number.format(value).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
    };
    structured(&RATELIMIT_POLICY, [(b";q=", fields.quota), (b";w=", fields.window)]);
    structured(&RATELIMIT, [(b";r=", fields.sf_remaining), (b";t=", fields.sf_reset)]);
}

/// The values of one decision's rate-limit headers, computed once for either way of writing them.
struct Fields {
    limit: u64,
    remaining: u64,
    /// Seconds until fresh, rounded up.
    reset: u64,
    retry_after: Option<u64>,
    /// The structured fields' integers (clamped to 15 digits).
    quota: u64,
    window: u64,
    sf_remaining: u64,
    sf_reset: u64,
}

impl Fields {
    fn of(window: Duration, decision: &Decision) -> Fields {
        let reset = ceil_secs(decision.reset_after);
        Fields {
            limit: decision.limit,
            remaining: decision.remaining,
            reset,
            retry_after: retry_after_secs(decision),
            quota: sf_integer(decision.limit),
            window: sf_integer(ceil_secs(window).max(1)),
            sf_remaining: sf_integer(decision.remaining),
            sf_reset: sf_integer(reset),
        }
    }
}

/// The largest structured-field integer (RFC 8941: at most 15 digits).
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// `value` as a valid structured-field integer: clamped to 15 digits (an unlimited policy reports
/// `u64::MAX`, which has 20).
fn sf_integer(value: u64) -> u64 {
    value.min(SF_INTEGER_MAX)
}

/// The `Retry-After` of `decision` in seconds: `Some` only when it refuses and names a time to
/// wait; rounded up and at least 1.
pub fn retry_after_secs(decision: &Decision) -> Option<u64> {
    if decision.allowed {
        return None;
    }
    decision.retry_after.map(|wait| ceil_secs(wait).max(1))
}

/// `text` as a structured-field string (RFC 8941 `sf-string`): in double quotes, with `"` and `\`
/// escaped by a backslash.
///
/// An sf-string can hold printable ASCII only and has no escape for anything else, so every other
/// character (controls, DEL, non-ASCII) is written as the `%XX` escapes of its UTF-8 bytes, and
/// `%` itself as `%25`: the mapping stays one-to-one (two policy names never render the same) and
/// the result is always a valid header value.
pub fn sf_string(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len() + 2);
    push_sf_string(&mut out, text);
    // Printable ASCII by construction.
    String::from_utf8(out).unwrap_or_default()
}

/// Appends [`sf_string`]`(text)` to `out`.
fn push_sf_string(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push(b'"');
    for c in text.chars() {
        match c {
            '"' | '\\' => out.extend_from_slice(&[b'\\', c as u8]),
            '%' => out.extend_from_slice(b"%25"),
            // Printable ASCII: one byte.
            ' '..='~' => out.push(c as u8),
            _ => {
                let mut utf8 = [0; 4];
                for byte in c.encode_utf8(&mut utf8).bytes() {
                    out.extend_from_slice(&[b'%', HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 0xf)]]);
                }
            }
        }
    }
    out.push(b'"');
}

/// Whole seconds in `duration`, rounded up (saturating at `u64::MAX`).
fn ceil_secs(duration: Duration) -> u64 {
    duration.as_secs().saturating_add(u64::from(duration.subsec_nanos() > 0))
}

fn insert_ascii(headers: &mut HeaderMap, name: HeaderName, value: String) {
    // Always `Ok`: the value is printable ASCII by construction (numbers and `sf_string`), which
    // the tests check; dropping the header is the harmless outcome if that ever broke.
    if let Ok(value) = HeaderValue::try_from(value) {
        headers.insert(name, value);
    } else {
        debug_assert!(false, "rate-limit header value is not printable ASCII");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratemesh_core::{Algorithm, LeaseId, Limit, LimitSpec, Mode, Policy};

    #[test]
    fn structured_field_integers_never_exceed_fifteen_digits() {
        let decision = Decision {
            allowed: true,
            limit: u64::MAX,
            remaining: u64::MAX,
            reset_after: Duration::from_secs(u64::MAX),
            retry_after: None,
            delay: Duration::ZERO,
            lease: None,
        };
        let mut headers = HeaderMap::new();
        insert_headers_for(&mut headers, "p", Duration::from_secs(u64::MAX), &decision);
        assert_eq!(headers[RATELIMIT_POLICY], "\"p\";q=999999999999999;w=999999999999999");
        assert_eq!(headers[RATELIMIT], "\"p\";r=999999999999999;t=999999999999999");
    }

    fn policy(name: &str, limit: u64, period: Duration) -> NamedPolicy {
        let limit = Limit::new(LimitSpec::new(Algorithm::TokenBucket, limit, period)).expect("valid limit");
        NamedPolicy::new(name, Policy::new(limit, Mode::Exact))
    }

    fn decision(
        allowed: bool,
        remaining: u64,
        reset_after: Duration,
        retry_after: Option<Duration>,
    ) -> Decision {
        Decision {
            allowed,
            limit: 10,
            remaining,
            reset_after,
            retry_after,
            delay: Duration::ZERO,
            lease: None,
        }
    }

    fn written(policy: &NamedPolicy, decision: &Decision) -> HeaderMap {
        let mut headers = HeaderMap::new();
        insert_headers(&mut headers, policy, decision);
        headers
    }

    fn get<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
        headers.get(name).map(|value| value.to_str().expect("ASCII"))
    }

    #[test]
    fn allowed_decision_writes_every_header_but_retry_after() {
        let policy = policy("api", 10, Duration::from_secs(60));
        let headers = written(&policy, &decision(true, 7, Duration::from_secs(18), None));
        assert_eq!(get(&headers, "X-RateLimit-Limit"), Some("10"));
        assert_eq!(get(&headers, "X-RateLimit-Remaining"), Some("7"));
        assert_eq!(get(&headers, "X-RateLimit-Reset"), Some("18"));
        assert_eq!(get(&headers, "RateLimit-Policy"), Some(r#""api";q=10;w=60"#));
        assert_eq!(get(&headers, "RateLimit"), Some(r#""api";r=7;t=18"#));
        assert_eq!(get(&headers, "Retry-After"), None);
        assert_eq!(headers.len(), 5);
    }

    #[test]
    fn durations_round_up_to_whole_seconds() {
        let policy = policy("api", 10, Duration::from_secs(60));
        let headers = written(&policy, &decision(true, 7, Duration::from_nanos(1), None));
        assert_eq!(get(&headers, "X-RateLimit-Reset"), Some("1"));
        assert_eq!(get(&headers, "RateLimit"), Some(r#""api";r=7;t=1"#));
        let headers = written(&policy, &decision(true, 7, Duration::from_millis(2_001), None));
        assert_eq!(get(&headers, "X-RateLimit-Reset"), Some("3"));
        let headers = written(&policy, &decision(true, 10, Duration::ZERO, None));
        assert_eq!(get(&headers, "X-RateLimit-Reset"), Some("0"), "a fresh key resets now");
        let headers = written(&policy, &decision(true, 7, Duration::MAX, None));
        assert_eq!(get(&headers, "X-RateLimit-Reset"), Some(u64::MAX.to_string().as_str()), "saturates");
    }

    #[test]
    fn window_rounds_up_and_is_at_least_one_second() {
        let d = decision(true, 1, Duration::ZERO, None);
        let headers = written(&policy("p", 10, Duration::from_millis(1_500)), &d);
        assert_eq!(get(&headers, "RateLimit-Policy"), Some(r#""p";q=10;w=2"#));
        let headers = written(&policy("p", 10, Duration::from_millis(100)), &d);
        assert_eq!(get(&headers, "RateLimit-Policy"), Some(r#""p";q=10;w=1"#));
    }

    #[test]
    fn refused_decision_has_retry_after_rounded_up_and_at_least_one() {
        let policy = policy("api", 10, Duration::from_secs(60));
        let refused =
            |retry: Duration| written(&policy, &decision(false, 0, Duration::from_secs(60), Some(retry)));
        assert_eq!(get(&refused(Duration::from_millis(5_200)), "Retry-After"), Some("6"));
        assert_eq!(get(&refused(Duration::from_secs(6)), "Retry-After"), Some("6"));
        assert_eq!(get(&refused(Duration::from_millis(1)), "Retry-After"), Some("1"));
        assert_eq!(get(&refused(Duration::ZERO), "Retry-After"), Some("1"), "never tell a refused client 0");
        let headers = refused(Duration::from_secs(6));
        assert_eq!(get(&headers, "X-RateLimit-Remaining"), Some("0"));
        assert_eq!(get(&headers, "RateLimit"), Some(r#""api";r=0;t=60"#));
    }

    #[test]
    fn refused_decision_without_retry_has_no_retry_after() {
        // Cost above capacity: the request can never pass, so there is no time to wait for.
        let policy = policy("api", 10, Duration::from_secs(60));
        let headers = written(&policy, &decision(false, 10, Duration::ZERO, None));
        assert_eq!(get(&headers, "Retry-After"), None);
        assert_eq!(get(&headers, "X-RateLimit-Remaining"), Some("10"));
        assert_eq!(headers.len(), 5);
    }

    #[test]
    fn headers_replace_earlier_values_and_clear_a_stale_retry_after() {
        let policy = policy("api", 10, Duration::from_secs(60));
        let mut headers = HeaderMap::new();
        headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from_static("99"));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("30"));
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        insert_headers(&mut headers, &policy, &decision(true, 4, Duration::from_secs(1), None));
        assert_eq!(headers.get_all(X_RATELIMIT_REMAINING).iter().count(), 1);
        assert_eq!(get(&headers, "X-RateLimit-Remaining"), Some("4"));
        assert_eq!(get(&headers, "Retry-After"), None);
        assert_eq!(get(&headers, "content-type"), Some("text/plain"), "other headers are kept");
    }

    #[test]
    fn headers_for_a_name_and_window_equal_those_of_the_named_policy() {
        let policy = policy("api", 10, Duration::from_millis(1_500));
        let decision = decision(false, 0, Duration::from_secs(3), Some(Duration::from_millis(10)));
        let mut by_name = HeaderMap::new();
        insert_headers_for(&mut by_name, "api", Duration::from_millis(1_500), &decision);
        assert_eq!(by_name, written(&policy, &decision));
    }

    #[test]
    fn leases_and_delays_do_not_change_the_headers() {
        let policy = policy("api", 10, Duration::from_secs(60));
        let plain = decision(true, 3, Duration::from_secs(2), None);
        let with_extras = Decision { delay: Duration::from_secs(1), lease: Some(LeaseId(7)), ..plain };
        assert_eq!(written(&policy, &plain), written(&policy, &with_extras));
    }

    #[test]
    fn sf_string_escapes_quotes_and_backslashes() {
        assert_eq!(sf_string("api"), r#""api""#);
        assert_eq!(sf_string(""), r#""""#);
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("with space ~!"), r#""with space ~!""#);
    }

    #[test]
    fn sf_string_encodes_everything_not_printable_ascii() {
        assert_eq!(sf_string("a\nb"), r#""a%0Ab""#);
        assert_eq!(sf_string("tab\there"), r#""tab%09here""#);
        assert_eq!(sf_string("\u{7f}"), r#""%7F""#);
        assert_eq!(sf_string("é"), r#""%C3%A9""#);
        assert_eq!(sf_string("💡"), r#""%F0%9F%92%A1""#);
        // `%` is escaped too, so an encoded name never collides with a literal one.
        assert_eq!(sf_string("100%"), r#""100%25""#);
        assert_ne!(sf_string("%0A"), sf_string("\n"));
    }

    /// A check of RFC 8941 §3.3.3 sf-string against the output: DQUOTE, then unescaped
    /// printable ASCII other than `"` and `\`, or `\` followed by one of them, then DQUOTE.
    fn is_sf_string(value: &str) -> bool {
        let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else { return false };
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('"' | '\\') => {}
                    _ => return false,
                },
                '"' => return false,
                ' '..='~' => {}
                _ => return false,
            }
        }
        true
    }

    #[test]
    fn every_policy_name_gives_valid_header_values() {
        let names = [
            "api",
            "",
            "\"",
            "\\",
            "\\\"",
            "a\r\nSet-Cookie: x=1",
            "\0",
            "名前",
            "é\u{7f}%\"\\ z",
            "\u{10FFFF}",
        ];
        for name in names {
            assert!(is_sf_string(&sf_string(name)), "{name:?} -> {}", sf_string(name));
            let policy = policy(name, 10, Duration::from_secs(60));
            let headers =
                written(&policy, &decision(false, 0, Duration::from_secs(5), Some(Duration::from_secs(5))));
            assert_eq!(headers.len(), 6, "{name:?}: every header written");
            for (header, value) in &headers {
                let text = value.to_str().expect("ASCII");
                assert!(text.bytes().all(|b| (b' '..=b'~').contains(&b)), "{header}: {text:?}");
            }
            let field = get(&headers, "RateLimit-Policy").expect("written");
            let (item, params) = field.rsplit_once(";q=").expect("q parameter");
            assert!(is_sf_string(item), "{field}");
            assert_eq!(params, "10;w=60");
        }
        // Every one- and two-byte UTF-8 char, and a spread of the longer ones.
        let all: String =
            (0..0x800).chain((0x800..=0x10FFFF).step_by(97)).filter_map(char::from_u32).collect();
        let encoded = sf_string(&all);
        assert!(is_sf_string(&encoded));
        assert!(HeaderValue::try_from(encoded).is_ok());
    }

    #[test]
    fn header_lines_are_the_header_map_written_out() {
        let names = ["api", "a\"b\\c", "100%", "名前", "a\r\nSet-Cookie: x=1"];
        let decisions = [
            decision(true, 7, Duration::from_millis(1_500), None),
            decision(false, 0, Duration::from_secs(5), Some(Duration::from_millis(1))),
            decision(false, 0, Duration::from_secs(5), None),
            Decision { limit: u64::MAX, remaining: u64::MAX, ..decision(true, 0, Duration::MAX, None) },
        ];
        for name in names {
            for decision in &decisions {
                let window = Duration::from_millis(2_500);
                let mut headers = HeaderMap::new();
                insert_headers_for(&mut headers, name, window, decision);
                let mut expected = Vec::new();
                for (header, value) in &headers {
                    expected.extend_from_slice(format!("{header}: ").as_bytes());
                    expected.extend_from_slice(value.as_bytes());
                    expected.extend_from_slice(b"\r\n");
                }
                let mut lines = b"before\r\n".to_vec();
                write_header_lines(&mut lines, name, window, decision);
                assert_eq!(
                    String::from_utf8_lossy(&lines[8..]),
                    String::from_utf8_lossy(&expected),
                    "{name:?} {decision:?}"
                );
            }
        }
    }
}
