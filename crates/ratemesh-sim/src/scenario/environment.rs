//! Where a scenario's cluster runs: the network model (`[network]`: delays, loss, duplication,
//! zones, regions, per-link overrides), the node clocks (`[clock]`) and the failure detector
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
    /// Protocol regions: node `n` is in region `n % count`; links inside a region have `delay`,
    /// links between regions half the round trip of `rtt_ms` (link overrides still win). Unlike
    /// zones, the ratemesh strategies tell the core each member's region. Not with `zones`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regions: Option<RegionsConfig>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            delay: DelayConfig::default(),
            loss: 0.0,
            duplicate: 0.0,
            links: Vec::new(),
            zones: None,
            regions: None,
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

/// Regions of a network (`[network.regions]`): node `n` is in region `n % count`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionsConfig {
    /// How many regions.
    pub count: u32,
    /// Round trips between regions: `count` rows of `count` values, symmetric, 0 on the diagonal.
    pub rtt_ms: Vec<Vec<f64>>,
    /// A link between regions `a` and `b` delays each message uniformly in
    /// `rtt_ms[a][b] / 2 × (1 ± jitter)`.
    #[serde(default = "default_region_jitter")]
    pub jitter: f64,
    /// Probability that a message between regions is lost (default: the network's `loss`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
}

impl RegionsConfig {
    /// The region of `node`.
    pub fn region_of(&self, node: u32) -> u32 {
        node % self.count.max(1)
    }

    /// The nodes of `region` among `nodes` nodes, ascending.
    pub fn nodes_of(&self, region: u32, nodes: u32) -> impl Iterator<Item = u32> + '_ {
        (0..nodes).filter(move |n| self.region_of(*n) == region)
    }

    /// The nodes (of `nodes`) of each side, a side being a list of regions.
    pub fn node_groups(&self, sides: &[Vec<u32>], nodes: u32) -> Vec<Vec<u32>> {
        sides.iter().map(|side| (0..nodes).filter(|n| side.contains(&self.region_of(*n))).collect()).collect()
    }

    /// The one-way delay between regions `a` and `b` (`None` inside a region).
    pub fn delay_between(&self, a: u32, b: u32) -> Option<DelayConfig> {
        let rtt_ms = *self.rtt_ms.get(a as usize)?.get(b as usize)?;
        let half_ms = rtt_ms / 2.0;
        (a != b).then_some(DelayConfig::Uniform {
            min_ms: half_ms * (1.0 - self.jitter),
            max_ms: half_ms * (1.0 + self.jitter),
        })
    }

    /// The largest round trip between two regions, in ms.
    pub fn rtt_max_ms(&self) -> f64 {
        self.rtt_ms.iter().flatten().copied().fold(0.0, f64::max)
    }
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

fn default_region_jitter() -> f64 {
    0.1
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
