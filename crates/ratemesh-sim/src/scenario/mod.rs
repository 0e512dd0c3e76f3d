//! Scenario files: everything a run needs, in TOML (`simulations/*.toml`).
//!
//! A scenario fixes the cluster (nodes, limit, sync period), the network, the clocks, the
//! membership detector's delays, the workload, the faults and the strategies to compare. Whatever
//! it leaves random (arrival times, delays, losses, clock offsets) is decided by one seed: the
//! file's `seed`, a `--seed` on the command line, or else a hash of the scenario's name.
//!
//! Times are in milliseconds (`*_ms`) unless a name says otherwise; node numbers are `0..nodes`.
//!
//! The model is split by concern: this file holds the scenario itself (cluster, limits, node
//! settings, run bounds) and what is derived from it; `environment.rs` the network, clocks and
//! failure detector; `workload.rs` the requests; `faults.rs` the scheduled faults; `expect.rs` the
//! bounds on the results; `validate.rs` the checks of every value.

mod environment;
mod expect;
mod faults;
mod validate;
mod workload;

use std::path::Path;

use ratemesh_core::{Algorithm, Limit, LimitSpec, PolicyRegion, RegionFallback};
use serde::{Deserialize, Serialize};

pub use self::environment::{
    ClockConfig, DelayConfig, LinkOverride, MembershipConfig, NetworkConfig, RegionsConfig, ZonesConfig,
};
pub use self::expect::{Expectation, Metric};
pub use self::faults::{FaultConfig, NodeTarget, region_sides};
pub use self::workload::{DemandConfig, OnOffConfig, StepConfig, WorkloadConfig};
use crate::error::SimError;
use crate::strategy::StrategyKind;

/// The most nodes a scenario may have (the network keeps per-link state: nodes²).
pub const NODES_MAX: u32 = 256;
/// The most keys a workload may use.
pub const KEYS_MAX: u32 = 1_000_000;
/// The most (key, 1-second window) pairs a run may count (keys × seconds; each costs 8 bytes).
pub const KEY_WINDOWS_MAX: u64 = 40_000_000;

/// A whole scenario. See the module documentation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// The name used in reports and output file names (default: the file's stem).
    #[serde(default)]
    pub name: String,
    /// One line on what the scenario shows.
    #[serde(default)]
    pub description: String,
    /// Cluster size at start.
    pub nodes: u32,
    /// Virtual duration of the run in seconds.
    pub duration_s: u64,
    /// The sync (reporting) period of every strategy that has one.
    pub sync_interval_ms: u64,
    /// The seed; a command-line seed overrides it; without either, a hash of `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The strategies to run, by name (default: all of them).
    #[serde(default = "default_strategies")]
    pub strategies: Vec<String>,
    /// The limit every key is under, when the scenario has one policy (else `policies`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitConfig>,
    /// Several policies: key `k` is under policy `k % policies.len()` (mixed limits). Exactly one
    /// of `limit` and `policies` is given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<LimitConfig>,
    /// Settings of the ratemesh nodes (`ratemesh_core::NodeConfig`); unset fields keep the core's
    /// defaults.
    #[serde(default)]
    pub node: NodeSettings,
    /// The network.
    #[serde(default)]
    pub network: NetworkConfig,
    /// Node clocks.
    #[serde(default)]
    pub clock: ClockConfig,
    /// The failure detector.
    #[serde(default)]
    pub membership: MembershipConfig,
    /// The requests.
    pub workload: WorkloadConfig,
    /// Scheduled faults.
    #[serde(default)]
    pub faults: Vec<FaultConfig>,
    /// Bounds that stop a runaway run.
    #[serde(default)]
    pub bounds: BoundsConfig,
    /// Bounds the results must meet; the command line fails (and prints how to reproduce) if not.
    #[serde(default)]
    pub expect: Vec<Expectation>,
}

/// The limit of every key in the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitConfig {
    /// Algorithm name (`token_bucket`, `gcra`, `leaky_bucket`, `fixed_window`,
    /// `sliding_window_counter`, `sliding_window_log`).
    #[serde(default = "default_algorithm")]
    pub algorithm: String,
    /// Hits per period.
    pub limit: u64,
    /// The period.
    pub period_ms: u64,
    /// Bucket capacity (token bucket), burst (GCRA), queue (shaper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// `exact` or `approximate`: the mode the `ratemesh` strategy uses for this policy (default
    /// approximate; `ratemesh-exact` and `ratemesh-approx` force theirs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The policy's home region (`PolicyRegion::home`): a region's number, `0` to
    /// `network.regions.count − 1` (unset: a hash of each key over the regions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home_region: Option<u32>,
    /// The policy's own region fallback (`PolicyRegion::fallback`): `floor`, `last` or `closed`
    /// (unset: `node.region_fallback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_fallback: Option<String>,
}

/// Settings of the ratemesh nodes, as in `ratemesh_core::NodeConfig` (unset: the core's default).
/// The sync interval is the scenario's `sync_interval_ms`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSettings {
    /// `NodeConfig::forward_timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_timeout_ms: Option<u64>,
    /// `NodeConfig::forward_wait`, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_wait_us: Option<u64>,
    /// `NodeConfig::forward_batch_len_max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_batch_len_max: Option<usize>,
    /// `NodeConfig::pending_forwards_max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_forwards_max: Option<usize>,
    /// `NodeConfig::sync_batch_len_max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_batch_len_max: Option<usize>,
    /// `NodeConfig::peer_silence`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_silence_ms: Option<u64>,
    /// `NodeConfig::unacked_frames_max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unacked_frames_max: Option<usize>,
    /// `NodeConfig::retransmit_initial`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retransmit_initial_ms: Option<u64>,
    /// `NodeConfig::replicate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicate: Option<bool>,
    /// `NodeConfig::ring_vnodes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_vnodes: Option<u32>,
    /// `NodeConfig::allowance_min`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowance_min: Option<u64>,
    /// `NodeConfig::join_grace` of a restarted or rejoined node (default: the membership's
    /// `join_delay_ms`; nodes that start with the run have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join_grace_ms: Option<u64>,
    /// The fallback of every policy: `local_share` (default), `fail_open` or `fail_closed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// `NodeConfig::region_sync_interval` (used with `[network.regions]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_sync_interval_ms: Option<u64>,
    /// `NodeConfig::region_lease` (used with `[network.regions]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_lease_ms: Option<u64>,
    /// `NodeConfig::region_fallback`: `last` (default), `floor` or `closed` (used with
    /// `[network.regions]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_fallback: Option<String>,
}

/// Bounds that stop a runaway run with an error instead of exhausting the machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundsConfig {
    /// The most events waiting in the queue.
    #[serde(default = "default_queue_len_max")]
    pub queue_len_max: usize,
    /// The most events processed in one run (of one strategy).
    #[serde(default = "default_events_max")]
    pub events_max: u64,
    /// The most checks waiting for a decision at once.
    #[serde(default = "default_pending_checks_max")]
    pub pending_checks_max: usize,
    /// The most timeouts of one node at the same virtual instant in a row (a livelock guard).
    #[serde(default = "default_timer_repeat_max")]
    pub timer_repeat_max: u32,
    /// The most transmits or events one handle call may produce.
    #[serde(default = "default_outputs_per_call_max")]
    pub outputs_per_call_max: usize,
}

impl Default for BoundsConfig {
    fn default() -> Self {
        BoundsConfig {
            queue_len_max: default_queue_len_max(),
            events_max: default_events_max(),
            pending_checks_max: default_pending_checks_max(),
            timer_repeat_max: default_timer_repeat_max(),
            outputs_per_call_max: default_outputs_per_call_max(),
        }
    }
}

impl Scenario {
    /// Reads and validates the scenario in `path`; its name defaults to the file's stem.
    pub fn load(path: &Path) -> Result<Scenario, SimError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SimError::Read { path: path.to_owned(), source })?;
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Scenario::from_toml(&text, &stem)
    }

    /// Parses and validates a scenario from TOML text; `default_name` is used when it has none.
    pub fn from_toml(text: &str, default_name: &str) -> Result<Scenario, SimError> {
        let mut scenario: Scenario = toml::from_str(text)
            .map_err(|e| SimError::Parse { name: default_name.to_owned(), message: e.to_string() })?;
        if scenario.name.is_empty() {
            scenario.name = default_name.to_owned();
        }
        scenario.validate()?;
        Ok(scenario)
    }

    /// The scenario as TOML, with every default filled in (what the run prints first).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot print the scenario: {e}\n"))
    }

    /// The seed of a run: `seed_override`, else the file's seed, else a hash of the name.
    pub fn effective_seed(&self, seed_override: Option<u64>) -> u64 {
        seed_override.or(self.seed).unwrap_or_else(|| crate::rng::seed_from_name(&self.name))
    }

    /// The policies' limit configurations: `policies`, or the one `limit`.
    pub fn policy_configs(&self) -> &[LimitConfig] {
        match &self.limit {
            Some(limit) if self.policies.is_empty() => std::slice::from_ref(limit),
            _ => &self.policies,
        }
    }

    /// The validated limit of every policy, in order.
    pub fn limits(&self) -> Result<Vec<Limit>, SimError> {
        self.policy_configs().iter().map(|config| self.parse_limit(config)).collect()
    }

    /// The limit of the first policy (the only one of a `[limit]` scenario; key 0's).
    pub fn limit(&self) -> Result<Limit, SimError> {
        let first = self.policy_configs().first().ok_or_else(|| self.invalid("no limit".into()))?;
        self.parse_limit(first)
    }

    /// The policy of workload key `key`.
    pub fn policy_of_key(&self, key: u32) -> usize {
        key as usize % self.policy_configs().len().max(1)
    }

    /// The mode of policy `index` for the `ratemesh` strategy (approximate unless it says exact).
    pub fn policy_mode_exact(&self, index: usize) -> bool {
        self.policy_configs().get(index).and_then(|p| p.mode.as_deref()) == Some("exact")
    }

    /// The terms between regions of policy `index` (checked by [`Scenario::limits`]).
    pub fn policy_region(&self, index: usize) -> PolicyRegion {
        let Some(config) = self.policy_configs().get(index) else { return PolicyRegion::default() };
        PolicyRegion {
            home: config.home_region.map(crate::strategy::region_id),
            fallback: config.region_fallback.as_deref().and_then(RegionFallback::from_name),
        }
    }

    fn parse_limit(&self, config: &LimitConfig) -> Result<Limit, SimError> {
        let regions = self.network.regions.as_ref().map_or(0, |r| r.count);
        if let Some(home) = config.home_region
            && home >= regions
        {
            return Err(self.invalid(format!("policy home_region {home} is not a region (0..{regions})")));
        }
        if let Some(name) = config.region_fallback.as_deref()
            && RegionFallback::from_name(name).is_none()
        {
            return Err(self.invalid(format!("policy region_fallback {name:?} is not floor, last or closed")));
        }
        let algorithm = Algorithm::from_name(&config.algorithm)
            .filter(|a| *a != Algorithm::Concurrency)
            .ok_or_else(|| self.invalid(format!("unsupported algorithm {:?}", config.algorithm)))?;
        let mut spec =
            LimitSpec::new(algorithm, config.limit, core::time::Duration::from_millis(config.period_ms));
        spec.burst = config.burst;
        if let Some(mode) = &config.mode
            && mode != "exact"
            && mode != "approximate"
        {
            return Err(self.invalid(format!("policy mode {mode:?} is neither exact nor approximate")));
        }
        Ok(Limit::new(spec)?)
    }

    /// The rate of key 0's limit in hits per second (the unit of `rate_x_limit`).
    pub fn limit_per_s(&self) -> f64 {
        self.policy_configs().first().map_or(0.0, limit_config_per_s)
    }

    /// The rate of workload key `key`'s limit in hits per second.
    pub fn key_limit_per_s(&self, key: u32) -> f64 {
        self.policy_configs().get(self.policy_of_key(key)).map_or(0.0, limit_config_per_s)
    }

    /// The strategies to run, parsed.
    pub fn strategy_kinds(&self) -> Result<Vec<StrategyKind>, SimError> {
        self.strategies.iter().map(|name| StrategyKind::from_name(name)).collect()
    }

    /// Virtual duration in nanoseconds.
    pub fn duration_nanos(&self) -> u64 {
        self.duration_s.saturating_mul(1_000_000_000)
    }
}

fn limit_config_per_s(config: &LimitConfig) -> f64 {
    config.limit as f64 * 1000.0 / config.period_ms.max(1) as f64
}

fn default_strategies() -> Vec<String> {
    StrategyKind::ALL.iter().map(|s| s.name().to_owned()).collect()
}
fn default_algorithm() -> String {
    "token_bucket".to_owned()
}
fn default_queue_len_max() -> usize {
    4_000_000
}
fn default_events_max() -> u64 {
    200_000_000
}
fn default_pending_checks_max() -> usize {
    1_000_000
}
fn default_timer_repeat_max() -> u32 {
    10_000
}
fn default_outputs_per_call_max() -> usize {
    1_000_000
}
