//! envoyproxy/ratelimit's rules for a request's answers that the YAML files carry: `replaces`
//! and the `current_limit` name (`src/service/ratelimit.go`).

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
                Target::Named(entry) => !matches!(entry.rule, Rule::Unlimited),
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
