//! The audit's series (`ratemesh_audit_*`), read from the node at scrape time
//! ([`AuditCollector`]): per policy and window, over the keys this node owns and the last minute
//! of their complete windows (`crate::audit`); and the audit's own counters.

use std::sync::Arc;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::gauge::ConstGauge;
use ratemesh::{AuditStats, Node, RwLock};

use super::node::{counter, gauge};
use crate::audit::{policy_label, ratios, window_label};
use crate::policy::PolicyTable;

/// Reads the node's audit at scrape time and names its groups from the running policies.
#[derive(Debug)]
pub(super) struct AuditCollector {
    pub(super) node: Node,
    /// The policies in force (set at start and by every reload).
    pub(super) policies: Arc<RwLock<Arc<PolicyTable>>>,
}

/// One labelled gauge family: `(name, help, samples of (labels, value))`, written only when it has
/// a sample.
fn family<const N: usize>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[([(&str, &str); N], f64)],
) -> Result<(), std::fmt::Error> {
    if samples.is_empty() {
        return Ok(());
    }
    let kind = ConstGauge::new(0.0_f64).metric_type();
    let mut family = e.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

impl prometheus_client::collector::Collector for AuditCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut encoder;
        let table = Arc::clone(&self.policies.read());
        // (policy, window) labels and the figures, for the groups the running policies name.
        let named: Vec<(&str, String, ratemesh::AuditFigures)> = self
            .node
            .audit_figures()
            .into_iter()
            .filter_map(|f| Some((policy_label(&table, f.group)?, window_label(f.window), f)))
            .collect();
        let mut worst = Vec::new();
        let mut over = Vec::new();
        let mut false_refusal = Vec::new();
        let mut windows = Vec::new();
        for (policy, window, f) in &named {
            let labels = [("policy", *policy), ("window", window.as_str())];
            if f.sums.key_windows > 0 {
                let (w, o, r) = ratios(&f.sums);
                worst.push((labels, w));
                over.push((labels, o));
                false_refusal.push((labels, r));
            }
            for (complete, count) in [("true", f.sums.key_windows), ("false", f.incomplete_key_windows)] {
                windows.push(([labels[0], labels[1], ("complete", complete)], count as f64));
            }
        }
        family(
            e,
            "ratemesh_audit_admitted_over_limit_ratio",
            "The audit, last minute, keys this node owns: the worst key window's hits admitted by the \
             whole cluster over the window's limit (1 is the limit)",
            &worst,
        )?;
        family(
            e,
            "ratemesh_audit_over_admission_ratio",
            "The audit, last minute, keys this node owns: hits the cluster admitted above what one ideal \
             limiter would have admitted of the same arrivals, over the ideal's, window by window (sum of max(0, admitted - ideal) / sum of ideal)",
            &over,
        )?;
        family(
            e,
            "ratemesh_audit_false_refusal_ratio",
            "The audit, last minute, keys this node owns: hits refused that one ideal limiter would have \
             admitted, over the hits that arrived",
            &false_refusal,
        )?;
        family(
            e,
            "ratemesh_audit_key_windows",
            "The audit, last minute, keys this node owns: key windows closed, complete (in the ratios) or \
             not (the owner did not see all of them: a member left, ownership moved, closed by force)",
            &windows,
        )?;
        let AuditStats { keys, sample_bits, late_hits, stray_pieces, tally_overflow_hits } =
            self.node.audit_stats();
        gauge(
            e,
            "ratemesh_audit_keys",
            "Keys this node audits as their owner (bounded by node.audit_keys_max)",
            i64::try_from(keys).unwrap_or(i64::MAX),
        )?;
        gauge(
            e,
            "ratemesh_audit_sample_bits",
            "Keys are audited when this many top bits of their hash are zero: 0 audits every key, n one key in 2^n",
            i64::from(sample_bits),
        )?;
        counter(
            e,
            "ratemesh_audit_late_hits",
            "Hits reported to the audit for windows already closed: counted in no window",
            late_hits,
        )?;
        counter(
            e,
            "ratemesh_audit_stray_pieces",
            "Audit reports for keys this node does not own (the ring changed): dropped",
            stray_pieces,
        )?;
        counter(
            e,
            "ratemesh_audit_uncounted_hits",
            "Hits this node answered that no audit counts: its tallies for other owners were full",
            tally_overflow_hits,
        )
    }
}
