//! envoyproxy/ratelimit's rules for a request's answers that the YAML files carry: `replaces`
//! and the `current_limit` name (`src/service/ratelimit.go`).

use std::time::Duration;

use crate::check::{Target, ValidCheck};
use crate::config::{EnvoyPattern, Rule};

fn envoy(check: &ValidCheck) -> Option<&EnvoyPattern> {
    match &check.target {
        Target::Named(entry) => entry.envoy.as_ref(),
        Target::Inline(_) => None,
    }
}

/// Upstream's `replaces`: a limit whose `name` another matched limit of the same request
/// `replaces` (an unlimited one too) is not applied: its descriptor is answered as matching
/// nothing. Unlimited descriptors stay unlimited.
pub(crate) fn replaced(plans: &mut [Option<ValidCheck>]) {
    let replacing: Vec<String> =
        plans.iter().flatten().filter_map(envoy).flat_map(|envoy| envoy.replaces.iter().cloned()).collect();
    if replacing.is_empty() {
        return;
    }
    for plan in plans.iter_mut() {
        let is_replaced = plan.as_ref().is_some_and(|check| {
            let limited = match &check.target {
                Target::Named(entry) => !matches!(entry.rule, Rule::Unlimited) || deny_all(check).is_some(),
                Target::Inline(_) => true,
            };
            let name = envoy(check).and_then(|envoy| envoy.limit_name.as_ref());
            limited && name.is_some_and(|name| replacing.contains(name))
        });
        if is_replaced {
            *plan = None;
        }
    }
}

/// The `current_limit.name` of a descriptor's status: the limit's `rate_limit.name` (empty
/// without one), as upstream answers.
pub(crate) fn status_limit_name(check: &ValidCheck) -> &str {
    envoy(check).and_then(|envoy| envoy.limit_name.as_deref()).unwrap_or("")
}

/// The unit of a `requests_per_unit: 0` limit (every request over it), if this is one.
pub(crate) fn deny_all(check: &ValidCheck) -> Option<Duration> {
    envoy(check).and_then(|envoy| envoy.deny_all)
}

/// Whether a descriptor's limit is in `quota_mode`.
pub(crate) fn quota_mode(check: &ValidCheck) -> bool {
    envoy(check).is_some_and(|envoy| envoy.quota_mode)
}
