//! A request's plan: the request validated and every descriptor resolved to a [`ValidCheck`]
//! (its policy, Envoy limit override applied, its bucket and hits), before anything is counted.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use ratemesh_core::{Algorithm, Limit, LimitSpec, Policy};
use tonic::Status;

use super::{DESCRIPTORS_MAX, ENTRIES_MAX};
use crate::check::{InlineLimit, Target, ValidCheck};
use crate::config::{FALLBACK_DEFAULT, MODE_DEFAULT, Rule, limit_error_field, limit_error_message};
use crate::policy::{PolicyEntry, PolicyTable, envoy_bucket_key};

/// `MONTH` and `YEAR` of a limit override, in seconds, as envoyproxy/ratelimit counts them.
pub(super) const MONTH_SECS: u64 = 30 * 24 * 3600;

pub(super) const YEAR_SECS: u64 = 365 * 24 * 3600;

/// The tag after a descriptor's bucket key that names a limit override. The bucket key is a
/// sequence of length-prefixed fields; a field length starting with this byte would need a
/// field of about 4 GiB, far beyond [`MESSAGE_BYTES_MAX`], so an override's bucket never
/// collides with a longer descriptor's.
const OVERRIDE_TAG: u8 = 0xFE;

/// Validates `request` and resolves every descriptor: `None` for a descriptor that matches no
/// policy. Nothing is counted here, so an invalid request counts nothing. With
/// `upstream_overrides` (`ratemeshd envoy-ratelimit`), a limit override is applied as
/// envoyproxy/ratelimit applies it: on any descriptor of a known domain, matched or not, as a
/// fixed window of its own (no name, no `replaces`, never in shadow mode).
pub(super) fn plan(
    policies: &PolicyTable,
    request: &RateLimitRequest,
    upstream_overrides: bool,
) -> Result<Vec<Option<ValidCheck>>, Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument("domain: must not be empty"));
    }
    if request.descriptors.is_empty() {
        return Err(Status::invalid_argument("descriptors: must not be empty"));
    }
    if request.descriptors.len() > DESCRIPTORS_MAX {
        return Err(Status::invalid_argument(format!(
            "descriptors: {} given, at most {DESCRIPTORS_MAX} are accepted",
            request.descriptors.len()
        )));
    }
    // Proto3 cannot tell an unset request-level hits_addend from 0: both mean 1.
    let request_hits = u64::from(request.hits_addend.max(1));
    request
        .descriptors
        .iter()
        .enumerate()
        .map(|(index, descriptor)| {
            plan_descriptor(policies, &request.domain, index, descriptor, request_hits, upstream_overrides)
        })
        .collect()
}

fn plan_descriptor(
    policies: &PolicyTable,
    domain: &str,
    index: usize,
    descriptor: &RateLimitDescriptor,
    request_hits: u64,
    upstream_overrides: bool,
) -> Result<Option<ValidCheck>, Status> {
    let entries = &descriptor.entries;
    if entries.is_empty() || entries.len() > ENTRIES_MAX {
        return Err(Status::invalid_argument(format!(
            "descriptors[{index}].entries: {} given, 1 to {ENTRIES_MAX} are accepted",
            entries.len()
        )));
    }
    let pairs: Vec<(&str, &str)> = entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
    // Validate the override even when nothing matches: a malformed request is refused the same
    // whatever the policy file holds.
    let override_limit = descriptor.limit.map(|o| override_spec(index, &o)).transpose()?;
    let hits = match descriptor.hits_addend {
        Some(hits) => hits.value,
        None => request_hits,
    };
    let refund = descriptor.is_negative_hits;
    let key_text = pairs.iter().map(|(key, value)| format!("{key}={value}")).collect::<Vec<_>>().join(",");
    if let (true, Some((requests, period))) = (upstream_overrides, override_limit) {
        if !policies.has_domain(domain) {
            return Ok(None);
        }
        let target = upstream_override(index, requests, period)?;
        let key = target.namespace().key(&envoy_bucket_key(domain, &pairs));
        return Ok(Some(ValidCheck { target, key, key_text, cost: hits, refund }));
    }
    let Some(matched) = policies.match_descriptor(domain, &pairs) else {
        return Ok(None);
    };
    let concurrency =
        matched.entry.rule.policy().is_some_and(|p| p.limit.algorithm() == Algorithm::Concurrency);
    if refund && concurrency {
        return Err(Status::invalid_argument(format!(
            "descriptors[{index}].is_negative_hits: a refund does not apply to a concurrency limit (policy {:?})",
            matched.entry.name
        )));
    }
    let (target, key) = match (&matched.entry.rule, override_limit) {
        (Rule::Limited(policy), Some((requests, period))) => {
            let spec = LimitSpec::new(policy.limit.algorithm(), requests, period);
            let limit = Limit::new(spec).map_err(|error| {
                let field = match limit_error_field(&error) {
                    "period_ms" => "unit",
                    _ => "requests_per_unit",
                };
                Status::invalid_argument(format!(
                    "descriptors[{index}].limit.{field}: {} (under the {} algorithm of policy {:?})",
                    limit_error_message(&error),
                    policy.limit.algorithm().name(),
                    matched.entry.name,
                ))
            })?;
            let entry = PolicyEntry {
                name: matched.entry.name.clone(),
                rule: Rule::Limited(Arc::new(Policy { limit, ..Policy::clone(policy) })),
                shadow_mode: matched.entry.shadow_mode,
                envoy: None,
                namespace: matched.entry.namespace,
                overrides: Default::default(),
                tiers: Default::default(),
                home_region: matched.entry.home_region,
            };
            let mut bucket_key = matched.bucket_key.clone();
            bucket_key.push(OVERRIDE_TAG);
            bucket_key.extend_from_slice(&requests.to_be_bytes());
            bucket_key.extend_from_slice(&period.as_secs().to_be_bytes());
            let key = entry.namespace.key(&bucket_key);
            (Target::Named(Arc::new(entry)), key)
        }
        _ => (Target::Named(Arc::clone(&matched.entry)), matched.key_hash()),
    };
    Ok(Some(ValidCheck { target, key, key_text, cost: hits, refund }))
}

/// envoyproxy/ratelimit's limit override: `requests` per `period` in a fixed window, in the
/// default mode, never in shadow mode.
fn upstream_override(index: usize, requests: u64, period: Duration) -> Result<Target, Status> {
    let limit = Limit::new(LimitSpec::new(Algorithm::FixedWindow, requests, period)).map_err(|error| {
        Status::invalid_argument(format!("descriptors[{index}].limit: {}", limit_error_message(&error)))
    })?;
    let policy = Policy { fallback: FALLBACK_DEFAULT, ..Policy::new(limit, MODE_DEFAULT) };
    Ok(Target::Inline(InlineLimit::new(policy)))
}

/// The requests and period of a descriptor's limit override.
fn override_spec(index: usize, limit: &RateLimitOverride) -> Result<(u64, Duration), Status> {
    let unit_secs = match RateLimitUnit::try_from(limit.unit) {
        Ok(RateLimitUnit::Second) => 1,
        Ok(RateLimitUnit::Minute) => 60,
        Ok(RateLimitUnit::Hour) => 3600,
        Ok(RateLimitUnit::Day) => 24 * 3600,
        Ok(RateLimitUnit::Month) => MONTH_SECS,
        Ok(RateLimitUnit::Year) => YEAR_SECS,
        Ok(RateLimitUnit::Unknown) | Err(_) => {
            return Err(Status::invalid_argument(format!(
                "descriptors[{index}].limit.unit: {} is not a known unit (SECOND, MINUTE, HOUR, DAY, MONTH, YEAR)",
                limit.unit
            )));
        }
    };
    if limit.requests_per_unit == 0 {
        return Err(Status::invalid_argument(format!(
            "descriptors[{index}].limit.requests_per_unit: must be at least 1"
        )));
    }
    Ok((u64::from(limit.requests_per_unit), Duration::from_secs(unit_secs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_need_a_known_unit_and_a_rate() {
        let of = |requests_per_unit, unit: RateLimitUnit| {
            override_spec(0, &RateLimitOverride { requests_per_unit, unit: unit.into() })
        };
        assert_eq!(of(5, RateLimitUnit::Minute).expect("valid"), (5, Duration::from_secs(60)));
        assert_eq!(of(1, RateLimitUnit::Month).expect("valid"), (1, Duration::from_secs(MONTH_SECS)));
        assert_eq!(of(5, RateLimitUnit::Unknown).expect_err("unknown").code(), tonic::Code::InvalidArgument);
        assert_eq!(of(0, RateLimitUnit::Second).expect_err("zero").code(), tonic::Code::InvalidArgument);
        let unknown = override_spec(0, &RateLimitOverride { requests_per_unit: 1, unit: 99 });
        assert_eq!(unknown.expect_err("99").code(), tonic::Code::InvalidArgument);
    }
}
