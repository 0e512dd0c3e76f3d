//! The checks of a scenario's values ([`Scenario::validate`]): ranges, node numbers, delays,
//! probabilities, regions, and limits and strategies that fit together.

use ratemesh_core::Algorithm;

use super::{
    DelayConfig, DemandConfig, FaultConfig, KEY_WINDOWS_MAX, KEYS_MAX, NODES_MAX, NodeTarget, RegionsConfig,
    Scenario,
};
use crate::clock::{CLOCK_BASE_NANOS, DRIFT_PPM_MAX};
use crate::error::SimError;

impl Scenario {
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
        if let Some(name) = self.node.region_fallback.as_deref()
            && ratemesh_core::RegionFallback::from_name(name).is_none()
        {
            return Err(self.invalid(format!("node.region_fallback {name:?} is not floor, last or closed")));
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
        if let Some(regions) = &n.regions {
            if n.zones.is_some() {
                return Err(self.invalid("give either [network.zones] or [network.regions], not both".into()));
            }
            self.validate_regions(regions)?;
        }
        for link in &n.links {
            self.nodes_in_range("network.links", link.from.iter().chain(&link.to))?;
            link.delay.as_ref().map_or(Ok(()), |d| self.delay("network.links.delay", d))?;
            self.probability("network.links.loss", link.loss.unwrap_or(0.0))?;
            self.probability("network.links.duplicate", link.duplicate.unwrap_or(0.0))?;
        }
        Ok(())
    }

    fn validate_regions(&self, regions: &RegionsConfig) -> Result<(), SimError> {
        let count = regions.count;
        if count == 0 || count > self.nodes {
            return Err(self.invalid(format!(
                "network.regions.count must be in 1..={} (every region needs a node), not {count}",
                self.nodes
            )));
        }
        let rows = &regions.rtt_ms;
        let shape =
            |what: String| self.invalid(format!("network.regions.rtt_ms must be {count} × {count}: {what}"));
        if rows.len() != count as usize {
            return Err(shape(format!("it has {} rows", rows.len())));
        }
        if let Some(row) = rows.iter().position(|r| r.len() != count as usize) {
            return Err(shape(format!("row {row} has {} values", rows[row].len())));
        }
        for (a, row) in rows.iter().enumerate() {
            for (b, &rtt) in row.iter().enumerate() {
                self.region_rtt(a, b, rtt, rows[b][a])?;
            }
        }
        if !(0.0..=1.0).contains(&regions.jitter) {
            return Err(
                self.invalid(format!("network.regions.jitter must be in [0, 1], not {}", regions.jitter))
            );
        }
        self.probability("network.regions.loss", regions.loss.unwrap_or(0.0))
    }

    /// One entry `rtt_ms[a][b]`, with its mirror `rtt_ms[b][a]`.
    fn region_rtt(&self, a: usize, b: usize, rtt: f64, mirror: f64) -> Result<(), SimError> {
        let at = format!("network.regions.rtt_ms[{a}][{b}]");
        if !rtt.is_finite() || !(0.0..1e6).contains(&rtt) {
            return Err(self.invalid(format!("{at} must be finite, ≥ 0 and below 1 000 000, not {rtt}")));
        }
        if a == b && rtt != 0.0 {
            return Err(self.invalid(format!("{at} must be 0 (the diagonal: inside a region), not {rtt}")));
        }
        if rtt != mirror {
            return Err(self.invalid(format!(
                "network.regions.rtt_ms must be symmetric: [{a}][{b}] = {rtt} but [{b}][{a}] = {mirror}"
            )));
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
        match &w.demand {
            DemandConfig::Uniform => Ok(()),
            DemandConfig::Skewed { node, share } => {
                self.nodes_in_range("workload.demand", [*node].iter())?;
                self.probability("workload.demand.share", *share)
            }
            DemandConfig::Regions { shares, moves_every_ms } => {
                self.validate_region_demand(shares, *moves_every_ms)
            }
        }
    }

    fn validate_region_demand(&self, shares: &[f64], moves_every_ms: Option<u64>) -> Result<(), SimError> {
        let count = self.region_count("workload.demand (kind = \"regions\")")?;
        if shares.len() != count as usize {
            return Err(self.invalid(format!(
                "workload.demand.shares has {} values: one per region ({count}) is needed",
                shares.len()
            )));
        }
        let total: f64 = shares.iter().sum();
        if shares.iter().any(|s| !s.is_finite() || *s < 0.0) || total <= 0.0 {
            return Err(self.invalid("workload.demand.shares must be finite, ≥ 0 and not all 0".into()));
        }
        if moves_every_ms == Some(0) {
            return Err(self.invalid("workload.demand.moves_every_ms must be positive".into()));
        }
        Ok(())
    }

    /// The number of regions, for `what`, which needs `[network.regions]`.
    fn region_count(&self, what: &str) -> Result<u32, SimError> {
        let regions = self.network.regions.as_ref();
        regions.map(|r| r.count).ok_or_else(|| self.invalid(format!("{what} needs [network.regions]")))
    }

    /// The sides of a region fault: regions in range, each on one side at most, two sides or more.
    fn region_sides(&self, what: &str, regions: &[u32], groups: &[Vec<u32>]) -> Result<(), SimError> {
        let count = self.region_count(what)?;
        if regions.is_empty() == groups.is_empty() {
            return Err(self.invalid(format!("{what}: give either regions or groups, not both or neither")));
        }
        let all: Vec<u32> = regions.iter().chain(groups.iter().flatten()).copied().collect();
        if let Some(r) = all.iter().find(|r| **r >= count) {
            return Err(self.invalid(format!("{what}: region {r} is not in 0..{count}")));
        }
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != all.len() {
            return Err(self.invalid(format!("{what}: a region is named twice")));
        }
        if groups.len() == 1 || regions.len() == count as usize {
            return Err(self.invalid(format!("{what}: the regions cut off must leave another side")));
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
            FaultConfig::RegionPartition { start_ms, end_ms, regions, groups } => {
                self.interval(*start_ms, *end_ms)?;
                self.region_sides("region_partition", regions, groups)
            }
            FaultConfig::RegionLoss { start_ms, end_ms, regions, groups, loss } => {
                self.interval(*start_ms, *end_ms)?;
                self.region_sides("region_loss", regions, groups)?;
                self.probability("region_loss.loss", *loss)
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

    pub(super) fn invalid(&self, message: String) -> SimError {
        SimError::Invalid { name: self.name.clone(), message }
    }
}
