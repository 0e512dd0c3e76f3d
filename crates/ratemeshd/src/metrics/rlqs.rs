//! The RLQS metrics, read at scrape time ([`RlqsCollector`]): streams, groups, the rates
//! assigned per policy on this node against this node's parts, and the fleet's rounds.
//!
//! Summed over the nodes, `ratemesh_rlqs_node_rate` of a policy with one key is the rate the
//! cluster hands out for it: at most the policy's rate but for the transients
//! `docs/integrations/envoy-rlqs.md` states.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::gauge::ConstGauge;

use super::node::{counter, gauge, gauge_len};
use crate::rlqs::State;

/// One policy's groups on this node: (groups, Σ assigned rate, Σ node parts, Σ limits).
type PolicyRow = (usize, f64, f64, f64);

/// Reads a daemon's RLQS state at scrape time.
#[derive(Debug)]
pub(super) struct RlqsCollector {
    pub(super) state: Arc<State>,
}

impl prometheus_client::collector::Collector for RlqsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut encoder;
        let state = &self.state;
        gauge(e, "ratemesh_rlqs_streams", "RLQS streams open on this node", gauge_len(state.hub.streams()))?;
        gauge(
            e,
            "ratemesh_rlqs_owned_groups",
            "RLQS groups (policy, key) whose key this node owns and whose nodes ask it for their parts",
            gauge_len(state.ledger.groups()),
        )?;
        counter(
            e,
            "ratemesh_rlqs_fleet_rounds",
            "RLQS fleet rounds run (each asks the keys' owners for this node's parts)",
            state.sync_rounds.load(Ordering::Relaxed),
        )?;
        counter(
            e,
            "ratemesh_rlqs_fleet_fallbacks",
            "RLQS groups set to the fallback part (the limit over the live members): no owner, no answer, or none for 3 intervals",
            state.fallbacks.load(Ordering::Relaxed),
        )?;
        counter(
            e,
            "ratemesh_rlqs_unknown_domain_reports",
            "RLQS bucket reports of domains no [[rlqs]] names (answered [rls] rlqs_unknown_domain)",
            state.unknown_domain_reports.load(Ordering::Relaxed),
        )?;
        // By domain: a configured domain or `unknown`, bounded by the configuration.
        let by_domain = state.hub.by_domain();
        let streams = by_domain.iter().map(|(d, row)| (d.as_str(), row.0 as f64));
        by_label_gauge(
            e,
            "ratemesh_rlqs_domain_streams",
            "RLQS streams open on this node, by domain",
            "domain",
            streams,
        )?;
        let buckets = by_domain.iter().map(|(d, row)| (d.as_str(), row.1 as f64));
        by_label_gauge(
            e,
            "ratemesh_rlqs_domain_buckets",
            "RLQS buckets of this node's streams, by domain",
            "domain",
            buckets,
        )?;
        // By policy: bounded by the configuration's policies (keys never become labels).
        let mut by_policy: BTreeMap<String, PolicyRow> = BTreeMap::new();
        for (group, totals) in state.hub.all_totals() {
            let row = by_policy.entry(group.policy).or_default();
            row.0 += 1;
            row.1 += totals.assigned_rate;
            row.2 += totals.node_rate.unwrap_or(0.0);
            row.3 += totals.limit_rate;
        }
        let per =
            |value: fn(&PolicyRow) -> f64| by_policy.iter().map(move |(p, row)| (p.as_str(), value(row)));
        by_label_gauge(
            e,
            "ratemesh_rlqs_groups",
            "RLQS groups (policy, key) with buckets on this node, by policy",
            "policy",
            per(|r| r.0 as f64),
        )?;
        by_label_gauge(
            e,
            "ratemesh_rlqs_assigned_rate",
            "Tokens per second assigned to this node's Envoys, by policy (at most ratemesh_rlqs_node_rate)",
            "policy",
            per(|r| r.1),
        )?;
        by_label_gauge(
            e,
            "ratemesh_rlqs_node_rate",
            "This node's parts of its RLQS groups' limits, tokens per second, by policy",
            "policy",
            per(|r| r.2),
        )?;
        by_label_gauge(
            e,
            "ratemesh_rlqs_limit_rate",
            "The limits of this node's RLQS groups, tokens per second, summed by policy (one per key)",
            "policy",
            per(|r| r.3),
        )?;
        Ok(())
    }
}

/// Writes one gauge family with one label.
fn by_label_gauge<'a>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: impl Iterator<Item = (&'a str, f64)>,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(0.0_f64);
    let mut family = e.encode_descriptor(name, help, None, metric.metric_type())?;
    for (value_label, value) in values {
        ConstGauge::new(value).encode(family.encode_family(&[(label, value_label)])?)?;
    }
    Ok(())
}
