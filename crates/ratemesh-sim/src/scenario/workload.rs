//! A scenario's requests (`[workload]`): arrival rate, keys and their skew, cost, how arrivals
//! spread over the nodes, rate steps and on/off traffic.

use serde::{Deserialize, Serialize};

/// The requests: Poisson arrivals over keys and nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadConfig {
    /// Total arrival rate over all keys, as a multiple of the limit's rate (limit / period).
    pub rate_x_limit: f64,
    /// Distinct keys.
    #[serde(default = "one_u32")]
    pub keys: u32,
    /// The first `hot_keys` keys share `hot_share` of the arrivals evenly.
    #[serde(default = "one_u32")]
    pub hot_keys: u32,
    /// Share of arrivals on the hot keys; the rest goes to the other keys (the tail).
    #[serde(default = "one_f64")]
    pub hot_share: f64,
    /// Zipf exponent over the tail (0 = uniform).
    #[serde(default = "one_f64")]
    pub tail_zipf: f64,
    /// Hits per request.
    #[serde(default = "one_u64")]
    pub cost: u64,
    /// Every key gets `rate_x_limit` × its own limit's rate (keys drawn in proportion to their
    /// limits; `hot_keys`, `hot_share` and `tail_zipf` are ignored): per-key overload or underload.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_key: bool,
    /// A fixed total arrival rate in requests per second, instead of `rate_x_limit` × the limit of
    /// key 0 (not with `per_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_s: Option<f64>,
    /// How arrivals are spread over the nodes.
    #[serde(default)]
    pub demand: DemandConfig,
    /// Rate changes: from `at_ms` on, the rate is `factor` × `rate_x_limit`.
    #[serde(default)]
    pub steps: Vec<StepConfig>,
    /// On/off traffic: from `start_ms` on, `on_ms` of traffic, then `off_ms` of none, repeated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_off: Option<OnOffConfig>,
}

/// How arrivals are spread over the nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DemandConfig {
    /// Every node alike.
    #[default]
    Uniform,
    /// `share` of the arrivals on `node`, the rest spread evenly over the others (one hot node).
    Skewed {
        /// The hot node.
        node: u32,
        /// Its share of the arrivals.
        share: f64,
    },
    /// Arrivals spread over the regions of `[network.regions]` by weight (`shares[r]` for region
    /// `r`), evenly over each region's nodes. With `moves_every_ms`, the demand moves to the next
    /// region every so often: after `m` moves region `r` gets `shares[(r − m) mod count]`.
    Regions {
        /// One weight per region (they need not sum to 1).
        shares: Vec<f64>,
        /// Time between moves (default: the demand never moves).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        moves_every_ms: Option<u64>,
    },
}

impl DemandConfig {
    /// Region `region`'s weight at `t_nanos` (`None`: the demand is not spread by region).
    pub fn region_share(&self, region: u32, t_nanos: u64) -> Option<f64> {
        let DemandConfig::Regions { shares, moves_every_ms } = self else { return None };
        let count = shares.len().max(1) as u64;
        let moves = moves_every_ms.map_or(0, |every| t_nanos / every.saturating_mul(1_000_000).max(1));
        let from = (u64::from(region) + count - moves % count) % count;
        shares.get(from as usize).copied()
    }

    /// The instants (ns) before `end_nanos` at which the demand moves between regions.
    pub fn region_moves(&self, end_nanos: u64) -> Vec<u64> {
        let DemandConfig::Regions { moves_every_ms: Some(every), .. } = self else { return Vec::new() };
        let every_nanos = every.saturating_mul(1_000_000).max(1);
        (1..).map(|m| m * every_nanos).take_while(|t| *t < end_nanos).collect()
    }
}

/// A demand step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepConfig {
    /// When the step happens.
    pub at_ms: u64,
    /// The rate multiplier from then on.
    pub factor: f64,
}

/// On/off traffic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnOffConfig {
    /// When the first on period starts (traffic is on before).
    #[serde(default)]
    pub start_ms: u64,
    /// Length of an on period.
    pub on_ms: u64,
    /// Length of an off period.
    pub off_ms: u64,
}

fn one_u32() -> u32 {
    1
}
fn one_u64() -> u64 {
    1
}
fn one_f64() -> f64 {
    1.0
}
