//! Live per-key overrides: `PUT`/`DELETE /v1/overrides/{policy}/{key}` on any node, applied by
//! every node within a few gossip rounds, kept across restarts.
//!
//! The table, its merge and bounds, its gossip and its file are the library's
//! ([`ratemesh::overrides`]: [`LiveOverrides`], started on the daemon's node with the data
//! directory). What is the daemon's: the admin routes (`http.rs`), and this glue, which puts the
//! live overrides into the policy table (over the file's override of the same key; like those,
//! each counts in buckets of its own limit).

use std::sync::Arc;

pub use ratemesh::overrides::{LiveOverride, LiveOverrides, OVERRIDE_KEY_BYTES_MAX, OverrideError};

use crate::config::{PolicyConfig, Rule};

/// `policies` with the live overrides in their `overrides` (over the file's for the same key).
/// Overrides of unknown or not limited policies, or whose limit no longer validates (the policy
/// changed), are left out.
pub fn apply(live: &LiveOverrides, policies: &[PolicyConfig]) -> Vec<PolicyConfig> {
    let mut policies = policies.to_vec();
    for policy in &mut policies {
        let Rule::Limited(base) = &policy.rule else { continue };
        let base = Arc::clone(base);
        for entry in live.list(&policy.name) {
            if let Ok(variant) = entry.override_limit().variant(&base) {
                policy.overrides.insert(entry.key, Arc::new(variant));
            }
        }
    }
    policies
}
