//! A scenario's scheduled faults (`[[faults]]`: crashes, leaves, partitions, one-way cuts, churn)
//! and the membership changes they cause.

use serde::{Deserialize, Serialize};

use super::Scenario;

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
                FaultConfig::Partition { .. } | FaultConfig::OneWay { .. } => 2,
                FaultConfig::Churn { start_ms, end_ms: churn_end_ms, every_ms, .. }
                | FaultConfig::CrashChurn { start_ms, end_ms: churn_end_ms, every_ms, .. } => {
                    let stop_ms = (*churn_end_ms).min(end_ms);
                    2 * stop_ms.saturating_sub(*start_ms).div_ceil((*every_ms).max(1))
                }
            })
            .sum()
    }
}
