//! Where a scenario's cluster runs: the network model (`[network]`: delays, loss, duplication,
//! zones, per-link overrides), the node clocks (`[clock]`) and the failure detector
//! (`[membership]`: how late views follow reality).

use serde::{Deserialize, Serialize};

/// The network model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    /// One-way delay of every link without an override.
    #[serde(default)]
    pub delay: DelayConfig,
    /// Probability that a message is lost.
    #[serde(default)]
    pub loss: f64,
    /// Probability that a message is delivered twice (each copy with its own delay and loss).
    #[serde(default)]
    pub duplicate: f64,
    /// Per-link overrides; the first one that matches a link wins.
    #[serde(default)]
    pub links: Vec<LinkOverride>,
    /// Zones: node `n` is in zone `n % count`; links inside a zone have `delay`, links between
    /// zones `between` (link overrides still win).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zones: Option<ZonesConfig>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            delay: DelayConfig::default(),
            loss: 0.0,
            duplicate: 0.0,
            links: Vec::new(),
            zones: None,
        }
    }
}

/// Zones of a network: low delay inside, high delay between.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZonesConfig {
    /// How many zones (node `n` is in zone `n % count`).
    pub count: u32,
    /// One-way delay between nodes of different zones.
    pub between: DelayConfig,
}

/// A delay distribution. Reordering falls out of random delays.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DelayConfig {
    /// Uniform between `min_ms` and `max_ms`.
    Uniform {
        /// Shortest delay.
        min_ms: f64,
        /// Longest delay.
        max_ms: f64,
    },
    /// Log-normal with the given median and σ (of the underlying normal), cut at `max_ms`.
    Lognormal {
        /// Median delay.
        median_ms: f64,
        /// σ of ln(delay).
        sigma: f64,
        /// Delays above this are cut to it.
        max_ms: f64,
    },
}

impl Default for DelayConfig {
    fn default() -> Self {
        DelayConfig::Uniform { min_ms: 0.5, max_ms: 2.0 }
    }
}

/// Link parameters for the links from any of `from` to any of `to`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkOverride {
    /// Senders.
    pub from: Vec<u32>,
    /// Receivers.
    pub to: Vec<u32>,
    /// Delay on these links (default: the network's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<DelayConfig>,
    /// Loss on these links (default: the network's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Duplication on these links (default: the network's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<f64>,
}

/// Node clocks: each node draws an offset uniform in ±`offset_ms_max` and a drift uniform in
/// ±`drift_ppm_max`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockConfig {
    /// Largest |offset| from virtual time.
    #[serde(default)]
    pub offset_ms_max: u64,
    /// Largest |drift| in parts per million.
    #[serde(default)]
    pub drift_ppm_max: u64,
}

/// The failure detector: how late membership views follow reality.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MembershipConfig {
    /// A crash or a cut link shows as `dead` in the affected views this long after it happens.
    #[serde(default = "default_detection_delay_ms")]
    pub detection_delay_ms: u64,
    /// A restart, a join or a healed link shows as `live` this long after it happens.
    #[serde(default = "default_join_delay_ms")]
    pub join_delay_ms: u64,
    /// A member seen dead this long is forgotten (removed from the views: it no longer counts in
    /// the cluster's size) until it comes back; default never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_forget_ms: Option<u64>,
    /// A graceful leave removes the node from the others' views this long after it happens.
    #[serde(default = "default_leave_delay_ms")]
    pub leave_delay_ms: u64,
    /// A leaving node keeps running (frames and timers, no client checks) this long after it
    /// left, so that it can hand its keys over; then it stops.
    #[serde(default = "default_leave_linger_ms")]
    pub leave_linger_ms: u64,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        MembershipConfig {
            detection_delay_ms: default_detection_delay_ms(),
            dead_forget_ms: None,
            join_delay_ms: default_join_delay_ms(),
            leave_delay_ms: default_leave_delay_ms(),
            leave_linger_ms: default_leave_linger_ms(),
        }
    }
}

fn default_detection_delay_ms() -> u64 {
    2000
}
fn default_join_delay_ms() -> u64 {
    500
}
fn default_leave_delay_ms() -> u64 {
    100
}
fn default_leave_linger_ms() -> u64 {
    500
}
