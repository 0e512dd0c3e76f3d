//! Helpers shared by the Rate Limit Service tests (`rls.rs`, `envoy_ratelimit_mode.rs`): requests
//! built from `(key, value)` pairs, and what an answer says.
// Each test binary uses some of them.
#![allow(dead_code)]

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// A descriptor of `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry { key: (*k).to_owned(), value: (*v).to_owned() })
            .collect(),
        ..Default::default()
    }
}

/// A request of `domain` with `descriptors`.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest { domain: domain.to_owned(), descriptors, hits_addend: 0 }
}

/// A status's code.
pub fn code(status: &DescriptorStatus) -> Code {
    Code::try_from(status.code).expect("a known code")
}

/// A response's overall code.
pub fn overall(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).expect("a known code")
}

/// `(name, requests_per_unit, unit)` of a status's current limit.
pub fn limit(status: &DescriptorStatus) -> Option<(String, u32, Unit)> {
    status.current_limit.as_ref().map(|limit| {
        (limit.name.clone(), limit.requests_per_unit, Unit::try_from(limit.unit).expect("a known unit"))
    })
}

/// The value of a header the response adds.
pub fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response.response_headers_to_add.iter().find(|h| h.key == name).map(|h| h.value.as_str())
}

/// A status's `duration_until_reset`.
pub fn until_reset(status: &DescriptorStatus) -> Duration {
    let reset = status.duration_until_reset.expect("duration_until_reset is set");
    Duration::new(
        u64::try_from(reset.seconds).expect("non-negative"),
        u32::try_from(reset.nanos).expect("ok"),
    )
}
