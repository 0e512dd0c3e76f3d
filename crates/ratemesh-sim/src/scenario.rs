//! Scenario files: everything a run needs, in TOML (`simulations/*.toml`).
//!
//! A scenario fixes the cluster (nodes, limit, sync period), the network, the clocks, the
//! membership detector's delays, the workload, the faults and the strategies to compare. Whatever
//! it leaves random (arrival times, delays, losses, clock offsets) is decided by one seed: the
//! file's `seed`, a `--seed` on the command line, or else a hash of the scenario's name.
//!
//! Times are in milliseconds (`*_ms`) unless a name says otherwise; node numbers are `0..nodes`.

use std::path::Path;

use ratemesh_core::{Algorithm, Limit, LimitSpec};
use serde::{Deserialize, Serialize};

use crate::clock::{CLOCK_BASE_NANOS, DRIFT_PPM_MAX};
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
}

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

/// A scheduled fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FaultConfig {
    /// A node crashes (its state is lost) and optionally restarts (a new incarnation).
    Crash {
        /// When.
        at_ms: u64,
        /// Which node.
        node: NodeTarget,
        /// Restart this long after the crash.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        restart_after_ms: Option<u64>,
    },
    /// A node leaves gracefully (removed from every view) and optionally joins again.
    Leave {
        /// When.
        at_ms: u64,
        /// Which node.
        node: NodeTarget,
        /// Join again this long after leaving.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rejoin_after_ms: Option<u64>,
    },
    /// Links between different groups are cut both ways from `start_ms` to `end_ms`. Nodes in no
    /// group keep all their links.
    Partition {
        /// Start.
        start_ms: u64,
        /// End (the heal).
        end_ms: u64,
        /// The sides.
        groups: Vec<Vec<u32>>,
    },
    /// Messages from `from` to `to` are dropped (the other direction works) from `start_ms` to
    /// `end_ms`.
    OneWay {
        /// Start.
        start_ms: u64,
        /// End (the heal).
        end_ms: u64,
        /// Senders whose messages are dropped.
        from: Vec<u32>,
        /// Receivers that do not get them.
        to: Vec<u32>,
    },
    /// Crash churn: every `every_ms` from `start_ms` until `end_ms`, the next node of `nodes`
    /// (round robin; default all nodes from the last one down) crashes (its state is lost) and
    /// restarts `down_ms` later as a new incarnation.
    CrashChurn {
        /// First crash.
        start_ms: u64,
        /// No crash at or after this.
        end_ms: u64,
        /// Time between crashes.
        every_ms: u64,
        /// Time a node stays down.
        down_ms: u64,
        /// The nodes that take turns.
        #[serde(default)]
        nodes: Vec<u32>,
    },
    /// Membership churn: every `every_ms` from `start_ms` until `end_ms`, the next node of `nodes`
    /// (round robin; default all nodes from the last one down) leaves and joins again `down_ms`
    /// later.
    Churn {
        /// First leave.
        start_ms: u64,
        /// No leave at or after this.
        end_ms: u64,
        /// Time between leaves.
        every_ms: u64,
        /// Time a node stays out.
        down_ms: u64,
        /// The nodes that take turns.
        #[serde(default)]
        nodes: Vec<u32>,
    },
}

/// Which node a fault hits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NodeTarget {
    /// A node number.
    Id(u32),
    /// Resolved when the fault happens: `hot_owner` (the owner of key 0, the hottest key, as the
    /// lowest-numbered running node sees it) or `random` (a running node, from the faults stream).
    Named(String),
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

    fn parse_limit(&self, config: &LimitConfig) -> Result<Limit, SimError> {
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

    /// How many times the membership changes during the run (each crash, restart, leave, join,
    /// partition and heal), as the faults schedule them.
    pub fn membership_changes(&self) -> u64 {
        let end_ms = self.duration_s * 1000;
        self.faults
            .iter()
            .map(|fault| match fault {
                FaultConfig::Crash { restart_after_ms, .. } => 1 + u64::from(restart_after_ms.is_some()),
                FaultConfig::Leave { rejoin_after_ms, .. } => 1 + u64::from(rejoin_after_ms.is_some()),
                FaultConfig::Partition { .. } | FaultConfig::OneWay { .. } => 2,
                FaultConfig::Churn { start_ms, end_ms: churn_end_ms, every_ms, .. }
                | FaultConfig::CrashChurn { start_ms, end_ms: churn_end_ms, every_ms, .. } => {
                    let stop_ms = (*churn_end_ms).min(end_ms);
                    2 * stop_ms.saturating_sub(*start_ms).div_ceil((*every_ms).max(1))
                }
            })
            .sum()
    }

    /// The strategies to run, parsed.
    pub fn strategy_kinds(&self) -> Result<Vec<StrategyKind>, SimError> {
        self.strategies.iter().map(|name| StrategyKind::from_name(name)).collect()
    }

    /// Virtual duration in nanoseconds.
    pub fn duration_nanos(&self) -> u64 {
        self.duration_s.saturating_mul(1_000_000_000)
    }

    /// Checks every value; the first problem found is the error.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.nodes == 0 || self.nodes > NODES_MAX {
            return Err(self.invalid(format!("nodes must be in 1..={NODES_MAX}")));
        }
        if self.duration_s == 0 || self.sync_interval_ms == 0 {
            return Err(self.invalid("duration_s and sync_interval_ms must be positive".into()));
        }
        // The node refuses what would not work (zero timers, bounds too small to send a frame).
        crate::strategy::node_config(&self.node, self.sync_interval_ms, 0)
            .validate()
            .map_err(|error| self.invalid(format!("[node]: {error}")))?;
        if self.limit.is_some() != self.policies.is_empty() {
            return Err(self.invalid("give either [limit] or [[policies]], not both or neither".into()));
        }
        let tat = self.limits()?.iter().all(|limit| {
            matches!(
                limit.algorithm(),
                Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucketShaper
            )
        });
        if let Some(s) = self.strategy_kinds()?.into_iter().find(|s| s.needs_tat_limit() && !tat) {
            return Err(
                self.invalid(format!("strategy {} needs a token bucket, GCRA or shaper limit", s.name()))
            );
        }
        self.validate_node()?;
        self.validate_network()?;
        self.validate_clock()?;
        self.validate_workload()?;
        self.faults.iter().try_for_each(|fault| self.validate_fault(fault))
    }

    fn validate_node(&self) -> Result<(), SimError> {
        let fallback = self.node.fallback.as_deref().unwrap_or("local_share");
        if !["local_share", "fail_open", "fail_closed"].contains(&fallback) {
            return Err(self.invalid(format!(
                "node.fallback {fallback:?} is not local_share, fail_open or fail_closed"
            )));
        }
        if self.node.ring_vnodes == Some(0) {
            return Err(self.invalid("node.ring_vnodes must be positive".into()));
        }
        let windows = self.duration_s.saturating_add(2);
        if windows.saturating_mul(u64::from(self.workload.keys)) > KEY_WINDOWS_MAX {
            return Err(self
                .invalid(format!("keys × duration_s must stay below {KEY_WINDOWS_MAX} (per-key windows)")));
        }
        for e in &self.expect {
            if e.max.is_none() && e.min.is_none() {
                return Err(
                    self.invalid(format!("expect {:?} of {} has neither max nor min", e.metric, e.strategy))
                );
            }
        }
        Ok(())
    }

    fn validate_network(&self) -> Result<(), SimError> {
        let n = &self.network;
        self.probability("network.loss", n.loss)?;
        self.probability("network.duplicate", n.duplicate)?;
        self.delay("network.delay", &n.delay)?;
        if let Some(zones) = &n.zones {
            if zones.count == 0 {
                return Err(self.invalid("network.zones.count must be positive".into()));
            }
            self.delay("network.zones.between", &zones.between)?;
        }
        for link in &n.links {
            self.nodes_in_range("network.links", link.from.iter().chain(&link.to))?;
            link.delay.as_ref().map_or(Ok(()), |d| self.delay("network.links.delay", d))?;
            self.probability("network.links.loss", link.loss.unwrap_or(0.0))?;
            self.probability("network.links.duplicate", link.duplicate.unwrap_or(0.0))?;
        }
        Ok(())
    }

    fn validate_clock(&self) -> Result<(), SimError> {
        if self.clock.offset_ms_max.saturating_mul(1_000_000) >= CLOCK_BASE_NANOS {
            return Err(self.invalid("clock.offset_ms_max must be below 100 000".into()));
        }
        if self.clock.drift_ppm_max > DRIFT_PPM_MAX.unsigned_abs() {
            return Err(self.invalid(format!("clock.drift_ppm_max must be at most {DRIFT_PPM_MAX}")));
        }
        Ok(())
    }

    fn validate_workload(&self) -> Result<(), SimError> {
        let w = &self.workload;
        let rate_ok = w.rate_x_limit.is_finite() && w.rate_x_limit >= 0.0;
        if !rate_ok || w.steps.iter().any(|s| !s.factor.is_finite() || s.factor < 0.0) {
            return Err(self.invalid("workload rates and step factors must be finite and ≥ 0".into()));
        }
        if w.keys == 0 || w.keys > KEYS_MAX || w.hot_keys == 0 || w.hot_keys > w.keys {
            return Err(self.invalid(format!("workload needs 1 ≤ hot_keys ≤ keys ≤ {KEYS_MAX}")));
        }
        self.probability("workload.hot_share", w.hot_share)?;
        if !w.tail_zipf.is_finite() || w.tail_zipf < 0.0 {
            return Err(self.invalid("workload.tail_zipf must be finite and ≥ 0".into()));
        }
        if let Some(on_off) = &w.on_off
            && on_off.on_ms + on_off.off_ms == 0
        {
            return Err(self.invalid("workload.on_off needs on_ms + off_ms > 0".into()));
        }
        if let Some(rate) = w.rate_per_s
            && (!rate.is_finite() || rate < 0.0 || w.per_key)
        {
            return Err(self.invalid("workload.rate_per_s must be finite, ≥ 0 and not with per_key".into()));
        }
        if let DemandConfig::Skewed { node, share } = w.demand {
            self.nodes_in_range("workload.demand", [node].iter())?;
            self.probability("workload.demand.share", share)?;
        }
        Ok(())
    }

    fn validate_fault(&self, fault: &FaultConfig) -> Result<(), SimError> {
        match fault {
            FaultConfig::Crash { node, .. } | FaultConfig::Leave { node, .. } => self.target(node),
            FaultConfig::Partition { start_ms, end_ms, groups } => {
                self.interval(*start_ms, *end_ms)?;
                self.nodes_in_range("partition.groups", groups.iter().flatten())
            }
            FaultConfig::OneWay { start_ms, end_ms, from, to } => {
                self.interval(*start_ms, *end_ms)?;
                self.nodes_in_range("one_way", from.iter().chain(to))
            }
            FaultConfig::Churn { start_ms, end_ms, every_ms, nodes, .. }
            | FaultConfig::CrashChurn { start_ms, end_ms, every_ms, nodes, .. } => {
                self.interval(*start_ms, *end_ms)?;
                if *every_ms == 0 {
                    return Err(self.invalid("churn.every_ms must be positive".into()));
                }
                self.nodes_in_range("churn.nodes", nodes.iter())
            }
        }
    }

    fn target(&self, target: &NodeTarget) -> Result<(), SimError> {
        match target {
            NodeTarget::Id(id) => self.nodes_in_range("fault node", [*id].iter()),
            NodeTarget::Named(name) if name == "hot_owner" || name == "random" => Ok(()),
            NodeTarget::Named(name) => Err(self.invalid(format!("unknown node target {name:?}"))),
        }
    }

    fn interval(&self, start_ms: u64, end_ms: u64) -> Result<(), SimError> {
        if start_ms >= end_ms {
            return Err(self.invalid(format!("fault interval {start_ms}..{end_ms} ms is empty")));
        }
        Ok(())
    }

    fn nodes_in_range<'a>(
        &self,
        what: &str,
        mut nodes: impl Iterator<Item = &'a u32>,
    ) -> Result<(), SimError> {
        match nodes.find(|n| **n >= self.nodes) {
            Some(n) => Err(self.invalid(format!("{what}: node {n} is not in 0..{}", self.nodes))),
            None => Ok(()),
        }
    }

    fn probability(&self, what: &str, p: f64) -> Result<(), SimError> {
        if !(0.0..=1.0).contains(&p) {
            return Err(self.invalid(format!("{what} must be in [0, 1], not {p}")));
        }
        Ok(())
    }

    fn delay(&self, what: &str, delay: &DelayConfig) -> Result<(), SimError> {
        let ok = match *delay {
            DelayConfig::Uniform { min_ms, max_ms } => min_ms >= 0.0 && min_ms <= max_ms && max_ms < 1e6,
            DelayConfig::Lognormal { median_ms, sigma, max_ms } => {
                median_ms > 0.0 && (0.0..10.0).contains(&sigma) && (0.0..1e6).contains(&max_ms)
            }
        };
        if !ok {
            return Err(self.invalid(format!("{what} is out of range: {delay:?}")));
        }
        Ok(())
    }

    fn invalid(&self, message: String) -> SimError {
        SimError::Invalid { name: self.name.clone(), message }
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
fn one_u32() -> u32 {
    1
}
fn one_u64() -> u64 {
    1
}
fn one_f64() -> f64 {
    1.0
}
