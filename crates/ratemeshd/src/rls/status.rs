//! A descriptor's status and the call's headers in RLS terms: `OK`/`OVER_LIMIT`,
//! `current_limit` in the units RLS can name, `duration_until_reset`, and the HTTP API's
//! rate-limit headers as Envoy header values.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue as EnvoyHeader;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use ratemesh_core::{Algorithm, Decision, LimitSpec};

use super::plan::{MONTH_SECS, YEAR_SECS};

/// The status of a descriptor checked against no limit: `OK`, no `current_limit`.
pub(super) fn no_limit_status(limit_remaining: u32) -> DescriptorStatus {
    DescriptorStatus { code: Code::Ok.into(), limit_remaining, ..Default::default() }
}

/// The status of a descriptor decided under the limit `spec` of the policy `name`.
pub(super) fn limited_status(name: &str, spec: &LimitSpec, decision: &Decision) -> DescriptorStatus {
    let code = if decision.allowed { Code::Ok } else { Code::OverLimit };
    DescriptorStatus {
        code: code.into(),
        current_limit: Some(current_limit(name, spec)),
        limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(pb_duration(until_reset(decision))),
        quota: None,
    }
}

/// `duration_until_reset` of a decision. Envoy turns it into `X-RateLimit-Reset`, which a
/// refused client reads as "when to come back": for a refusal with a known retry time, that
/// time (never early); otherwise the time until the bucket is fresh again. For a fixed window
/// both are the end of the window, as in envoyproxy/ratelimit.
fn until_reset(decision: &Decision) -> Duration {
    match (decision.allowed, decision.retry_after) {
        (false, Some(retry_after)) => retry_after,
        _ => decision.reset_after,
    }
}

fn pb_duration(duration: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        // Below 1e9 by construction.
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}

/// The units `current_limit` can name, shortest first, with their length in nanoseconds.
/// `MONTH` and `YEAR` are as a request's limit override reads them ([`MONTH_SECS`],
/// [`YEAR_SECS`]: as envoyproxy/ratelimit counts them).
const UNITS: [(Unit, u128); 7] = [
    (Unit::Second, 1_000_000_000),
    (Unit::Minute, 60 * 1_000_000_000),
    (Unit::Hour, 3600 * 1_000_000_000),
    (Unit::Day, 24 * 3600 * 1_000_000_000),
    (Unit::Week, 7 * 24 * 3600 * 1_000_000_000),
    (Unit::Month, MONTH_SECS as u128 * 1_000_000_000),
    (Unit::Year, YEAR_SECS as u128 * 1_000_000_000),
];

/// The `current_limit` of a policy named `name` with the limit `spec` (`limit` hits per
/// `period`). RLS can only say "N per SECOND/MINUTE/HOUR/DAY/WEEK/MONTH/YEAR", so:
///
/// 1. a period of exactly one unit is that unit (`100 per 60 s` → 100/MINUTE);
/// 2. otherwise the shortest unit in which the rate is a whole number (`10 per 1500 ms` →
///    400/MINUTE, `100 per 2 s` → 50/SECOND, `14 per 2 days` → 7/DAY);
/// 3. otherwise the shortest unit at least as long as the period, with the rate rounded down
///    (`7 per 13 s` → 32/MINUTE, `1 per 8 days` → 3/MONTH): never more than is granted — but
///    for a period beyond a year with fewer hits than years, which is 1/YEAR.
///
/// `requests_per_unit` saturates at `u32::MAX`. The burst is not represented (RLS has no field
/// for it); the decision's `limit_remaining` reflects it.
pub fn current_limit(name: &str, spec: &LimitSpec) -> RateLimit {
    let period = spec.period.as_nanos().max(1);
    let limit = u128::from(spec.limit);
    let scaled = |unit_nanos: u128| limit * unit_nanos / period;
    let exact = UNITS
        .iter()
        .find(|(_, nanos)| *nanos == period)
        .or_else(|| UNITS.iter().find(|(_, nanos)| (limit * nanos) % period == 0));
    let (unit, requests) = match exact {
        Some(&(unit, nanos)) => (unit, scaled(nanos)),
        None => {
            let (unit, nanos) =
                UNITS.iter().copied().find(|(_, nanos)| *nanos >= period).unwrap_or(UNITS[UNITS.len() - 1]);
            (unit, scaled(nanos).max(u128::from(spec.limit > 0)))
        }
    };
    RateLimit {
        name: name.to_owned(),
        requests_per_unit: u32::try_from(requests).unwrap_or(u32::MAX),
        unit: unit.into(),
    }
}

/// Whether `a` is more restrictive than `b`: a refusal before an admission, then the one with
/// less remaining.
pub(super) fn more_restrictive(a: &Decision, b: &Decision) -> bool {
    (!a.allowed, std::cmp::Reverse(a.remaining)) > (!b.allowed, std::cmp::Reverse(b.remaining))
}

/// The HTTP API's rate-limit headers for `decision` under the policy labelled `label` with the
/// window `period`, as Envoy header values.
pub(super) fn envoy_headers(label: &str, period: Duration, decision: &Decision) -> Vec<EnvoyHeader> {
    // The header lines the HTTP front writes (no header map: this is every call's path).
    let mut lines = Vec::with_capacity(256);
    ratemesh::headers::write_header_lines(&mut lines, label, period, decision);
    lines
        .split(|&byte| byte == b'\n')
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r")?;
            let colon = line.iter().position(|&byte| byte == b':')?;
            // Always ASCII: names, numbers and sf-strings.
            let key = std::str::from_utf8(&line[..colon]).ok()?;
            let value = std::str::from_utf8(&line[colon + 1..]).ok()?.trim_start();
            Some(EnvoyHeader { key: key.to_owned(), value: value.to_owned(), raw_value: Vec::new() })
        })
        .collect()
}

/// envoyproxy/ratelimit's three headers (`names`: limit, remaining, reset) for the status it
/// picks: the last one over its limit not in quota mode (`quota`, by status), else the one with
/// the least remaining (the first of equals) among those with a `current_limit`; the reset is
/// its `duration_until_reset`'s seconds.
pub(super) fn envoy_ratelimit_headers(
    names: &[String; 3],
    statuses: &[DescriptorStatus],
    quota: &[bool],
) -> Vec<EnvoyHeader> {
    let mut chosen: Option<&DescriptorStatus> = None;
    let mut least = u32::MAX;
    for (status, &quota) in statuses.iter().zip(quota).filter(|(status, _)| status.current_limit.is_some()) {
        if status.code == i32::from(Code::OverLimit) && !quota {
            (chosen, least) = (Some(status), 0);
        } else if status.limit_remaining < least {
            (chosen, least) = (Some(status), status.limit_remaining);
        }
    }
    let Some(status) = chosen else { return Vec::new() };
    let limit = status.current_limit.as_ref().map_or(0, |limit| limit.requests_per_unit);
    let reset = status.duration_until_reset.map_or(0, |d| d.seconds);
    let values = [limit.to_string(), status.limit_remaining.to_string(), reset.to_string()];
    names
        .iter()
        .zip(values)
        .map(|(key, value)| EnvoyHeader { key: key.clone(), value, ..Default::default() })
        .collect()
}

/// The status of a descriptor under envoyproxy/ratelimit's `requests_per_unit: 0` per `unit`:
/// `OVER_LIMIT` (`OK` in shadow mode), nothing remaining, reset at the end of the unit's
/// current window on the Unix clock (as upstream's windows).
pub(super) fn denied_status(name: &str, unit: Duration, shadow_mode: bool) -> DescriptorStatus {
    let code = if shadow_mode { Code::Ok } else { Code::OverLimit };
    let spec = LimitSpec::new(Algorithm::FixedWindow, 0, unit);
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let unit_nanos = unit.as_nanos().max(1);
    let into_window = Duration::from_nanos(u64::try_from(since_epoch.as_nanos() % unit_nanos).unwrap_or(0));
    DescriptorStatus {
        code: code.into(),
        current_limit: Some(current_limit(name, &spec)),
        limit_remaining: 0,
        duration_until_reset: Some(pb_duration(unit.saturating_sub(into_window))),
        quota: None,
    }
}

#[cfg(test)]
mod tests {
    use ratemesh_core::Algorithm;

    use super::*;

    fn limit_of(limit: u64, period: Duration) -> (u32, Unit) {
        let rate = current_limit("p", &LimitSpec::new(Algorithm::FixedWindow, limit, period));
        assert_eq!(rate.name, "p");
        (rate.requests_per_unit, Unit::try_from(rate.unit).expect("a known unit"))
    }

    #[test]
    fn a_period_of_one_unit_is_that_unit() {
        assert_eq!(limit_of(100, Duration::from_secs(1)), (100, Unit::Second));
        assert_eq!(limit_of(100, Duration::from_secs(60)), (100, Unit::Minute));
        assert_eq!(limit_of(7, Duration::from_secs(3600)), (7, Unit::Hour));
        assert_eq!(limit_of(7, Duration::from_secs(86_400)), (7, Unit::Day));
        assert_eq!(limit_of(3, Duration::from_secs(7 * 86_400)), (3, Unit::Week));
        assert_eq!(limit_of(3, Duration::from_secs(30 * 86_400)), (3, Unit::Month));
        assert_eq!(limit_of(3, Duration::from_secs(365 * 86_400)), (3, Unit::Year));
    }

    #[test]
    fn other_periods_take_the_shortest_unit_with_a_whole_rate() {
        assert_eq!(limit_of(100, Duration::from_secs(2)), (50, Unit::Second));
        assert_eq!(limit_of(10, Duration::from_millis(1500)), (400, Unit::Minute));
        assert_eq!(limit_of(1, Duration::from_secs(7200)), (12, Unit::Day));
        assert_eq!(limit_of(14, Duration::from_secs(2 * 86_400)), (7, Unit::Day));
        assert_eq!(limit_of(5, Duration::from_millis(100)), (50, Unit::Second));
    }

    #[test]
    fn inexact_rates_are_rounded_down_in_the_unit_covering_the_period() {
        assert_eq!(limit_of(7, Duration::from_secs(13)), (32, Unit::Minute));
        // Was 1/DAY: seven times what is granted.
        assert_eq!(limit_of(1, Duration::from_secs(7 * 86_400 + 1)), (4, Unit::Month));
        assert_eq!(limit_of(1, Duration::from_secs(8 * 86_400)), (3, Unit::Month));
        assert_eq!(limit_of(5, Duration::from_secs(2 * 365 * 86_400)), (2, Unit::Year));
        assert_eq!(limit_of(u64::MAX, Duration::from_millis(3)), (u32::MAX, Unit::Second));
    }

    fn decision(allowed: bool, remaining: u64) -> Decision {
        Decision {
            allowed,
            limit: 10,
            remaining,
            reset_after: Duration::from_millis(1500),
            retry_after: (!allowed).then_some(Duration::from_millis(250)),
            delay: Duration::ZERO,
            lease: None,
        }
    }

    #[test]
    fn a_refusal_is_more_restrictive_than_any_admission() {
        assert!(more_restrictive(&decision(false, 5), &decision(true, 0)));
        assert!(more_restrictive(&decision(true, 1), &decision(true, 2)));
        assert!(!more_restrictive(&decision(true, 2), &decision(true, 2)));
        assert!(!more_restrictive(&decision(true, 0), &decision(false, 9)));
    }

    #[test]
    fn reset_is_the_retry_time_of_a_refusal() {
        assert_eq!(until_reset(&decision(false, 0)), Duration::from_millis(250));
        assert_eq!(until_reset(&decision(true, 3)), Duration::from_millis(1500));
        assert_eq!(pb_duration(Duration::from_millis(1500)), PbDuration { seconds: 1, nanos: 500_000_000 });
    }

    #[test]
    fn envoy_headers_are_the_http_api_headers() {
        let headers = envoy_headers("per-ip", Duration::from_secs(60), &decision(false, 0));
        let value = |name: &str| headers.iter().find(|h| h.key == name).map(|h| h.value.as_str());
        assert_eq!(value("x-ratelimit-limit"), Some("10"));
        assert_eq!(value("x-ratelimit-remaining"), Some("0"));
        assert_eq!(value("retry-after"), Some("1"));
        assert_eq!(value("ratelimit-policy"), Some(r#""per-ip";q=10;w=60"#));
        // Field for field, in order, what the HTTP API's header map holds.
        for decision in [decision(false, 0), decision(true, 7)] {
            let mut map = http::HeaderMap::new();
            ratemesh::headers::insert_headers_for(&mut map, "per-ip", Duration::from_secs(60), &decision);
            let expected: Vec<_> = map
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.to_str().expect("ASCII").to_owned()))
                .collect();
            let envoy = envoy_headers("per-ip", Duration::from_secs(60), &decision);
            let got: Vec<_> = envoy.into_iter().map(|h| (h.key, h.value)).collect();
            assert_eq!(got, expected);
        }
    }
}
