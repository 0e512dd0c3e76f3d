//! A scenario's scheduled faults (`[[faults]]`: crashes, leaves, partitions, one-way cuts, churn,
//! region partitions and loss between regions) and the membership changes they cause.

use serde::{Deserialize, Serialize};

use super::Scenario;

/// A scheduled fault.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Links between regions of different sides are cut both ways from `start_ms` to `end_ms`
    /// (needs `[network.regions]`). The sides are `groups` of regions, or else `regions` against
    /// every other region; regions on no side keep their links.
    RegionPartition {
        /// Start.
        start_ms: u64,
        /// End (the heal).
        end_ms: u64,
        /// Regions cut off from all the others (when `groups` is empty).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        regions: Vec<u32>,
        /// The sides, as lists of regions.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        groups: Vec<Vec<u32>>,
    },
    /// Messages between regions of different sides are lost with probability `loss` (on top of
    /// the links' own loss) from `start_ms` to `end_ms`, both ways; sides as in `region_partition`.
    RegionLoss {
        /// Start.
        start_ms: u64,
        /// End.
        end_ms: u64,
        /// Regions whose links to all the others are lossy (when `groups` is empty).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        regions: Vec<u32>,
        /// The sides, as lists of regions.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        groups: Vec<Vec<u32>>,
        /// Probability that a message between the sides is lost.
        loss: f64,
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

impl Scenario {
    /// How many times the membership changes during the run (each crash, restart, leave, join,
    /// partition and heal), as the faults schedule them.
    pub fn membership_changes(&self) -> u64 {
        let end_ms = self.duration_s * 1000;
        self.faults
            .iter()
            .map(|fault| match fault {
                FaultConfig::Crash { restart_after_ms, .. } => 1 + u64::from(restart_after_ms.is_some()),
                FaultConfig::Leave { rejoin_after_ms, .. } => 1 + u64::from(rejoin_after_ms.is_some()),
                FaultConfig::Partition { .. }
                | FaultConfig::OneWay { .. }
                | FaultConfig::RegionPartition { .. } => 2,
                FaultConfig::RegionLoss { .. } => 0,
                FaultConfig::Churn { start_ms, end_ms: churn_end_ms, every_ms, .. }
                | FaultConfig::CrashChurn { start_ms, end_ms: churn_end_ms, every_ms, .. } => {
                    let stop_ms = (*churn_end_ms).min(end_ms);
                    2 * stop_ms.saturating_sub(*start_ms).div_ceil((*every_ms).max(1))
                }
            })
            .sum()
    }
}

/// The sides of a region fault, as lists of regions: `groups`, or else `regions` and every other
/// region of `count`.
pub fn region_sides(regions: &[u32], groups: &[Vec<u32>], count: u32) -> Vec<Vec<u32>> {
    if !groups.is_empty() {
        return groups.to_vec();
    }
    let others = (0..count).filter(|r| !regions.contains(r)).collect();
    vec![regions.to_vec(), others]
}
