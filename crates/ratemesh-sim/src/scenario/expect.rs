//! Bounds a scenario's results must meet (`[[expect]]`) and the metrics they can bound.

use serde::{Deserialize, Serialize};

/// A bound a strategy's result must meet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectation {
    /// The strategy (skipped when it was not run).
    pub strategy: String,
    /// The metric.
    pub metric: Metric,
    /// Its largest accepted value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Its smallest accepted value (e.g. `admitted_x_ideal`: under-admission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
}

/// A metric of [`crate::StrategyReport`] that an [`Expectation`] can bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Over-admission over the run.
    OverAdmission,
    /// Over-admission in the worst 1-second window.
    WorstWindowOverAdmission,
    /// Largest admitted rate in a 1-second window, as a multiple of the limit.
    PeakRateXLimit,
    /// Largest admitted rate in a 1-second window inside a partition, as a multiple of the limit.
    PartitionPeakRateXLimit,
    /// False rejects as a fraction of requests.
    FalseRejectRate,
    /// Longest convergence after a heal in ms (infinite when one never converged).
    ConvergenceMaxMs,
    /// Hits admitted over hits the ideal admitted (under-admission: below 1).
    AdmittedXIdeal,
    /// The worst node's `|admitted from it − ideal admitted from it|` over the ideal's admitted
    /// hits of the key, over the overloaded tracked keys (0 when none is overloaded).
    Fairness,
    /// Bytes sent per node per second.
    BytesPerNodeS,
    /// Messages sent per node per second.
    MsgsPerNodeS,
    /// Messages sent per second by the whole cluster.
    ClusterMsgsS,
    /// Hits admitted beyond the ideal, per membership change, in sync intervals of the limit
    /// (`max(0, admitted − ideal) / (changes × limit per second × sync interval)`): exact mode's
    /// bound is one interval per ownership change.
    ExcessPerChangeSyncIntervals,
    /// After a move of the demand between regions, the longest time (ms) until a region whose
    /// share rose admits 90 % of its ideal share over a second (infinite: never; 0 without moves).
    RegionMoveMs,
    /// Messages between regions per key per second (0 without regions).
    CrossRegionMsgsPerKeyS,
    /// Bytes between regions per key per second (0 without regions).
    CrossRegionBytesPerKeyS,
}
