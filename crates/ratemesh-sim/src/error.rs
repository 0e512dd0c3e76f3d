//! The simulator's errors.

use std::path::PathBuf;

/// Why a scenario could not be loaded or run. Every variant is an operating error (a bad scenario
/// file, a bound that the run exceeded, an unwritable output); programmer errors are assertions.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scenario file could not be read. Nothing was run.
    #[error("cannot read scenario {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The scenario is not valid TOML, or has unknown or mistyped fields. Nothing was run.
    #[error("cannot parse scenario {name}: {message}")]
    Parse {
        /// The file or scenario name.
        name: String,
        /// The parser's message.
        message: String,
    },
    /// The scenario parses but its values are inconsistent (out of range, unknown node). Nothing
    /// was run.
    #[error("invalid scenario {name}: {message}")]
    Invalid {
        /// The scenario's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The scenario's limit is refused by `ratemesh_core::Limit::new`. Nothing was run.
    #[error("invalid limit: {0}")]
    Limit(#[from] ratemesh_core::LimitError),
    /// A strategy name that the simulator does not know. Nothing was run.
    #[error("unknown strategy {0:?} (known: {known})", known = crate::strategy::StrategyKind::known_names())]
    UnknownStrategy(String),
    /// The event queue grew past `bounds.queue_len_max`: the run was stopped.
    #[error("event queue exceeded queue_len_max = {max} at virtual time {at_nanos} ns")]
    QueueFull {
        /// The bound in force.
        max: usize,
        /// Virtual time when it was exceeded.
        at_nanos: u64,
    },
    /// The run processed more than `bounds.events_max` events: it was stopped.
    #[error("run exceeded events_max = {max} at virtual time {at_nanos} ns")]
    TooManyEvents {
        /// The bound in force.
        max: u64,
        /// Virtual time when it was exceeded.
        at_nanos: u64,
    },
    /// A node asked to be woken at the same virtual instant more than `bounds.timer_repeat_max`
    /// times in a row without time advancing: a livelock in the strategy. The run was stopped.
    #[error("node {node} livelocked: {times} timeouts at virtual time {at_nanos} ns")]
    Livelock {
        /// The node.
        node: u32,
        /// Consecutive timeouts at the same instant.
        times: u32,
        /// Virtual time.
        at_nanos: u64,
    },
    /// More checks than `bounds.pending_checks_max` waited for a decision at once.
    #[error("more than pending_checks_max = {max} checks pending at virtual time {at_nanos} ns")]
    TooManyPending {
        /// The bound in force.
        max: usize,
        /// Virtual time.
        at_nanos: u64,
    },
    /// One handle call produced more than `bounds.outputs_per_call_max` transmits or events.
    #[error("node {node} produced more than outputs_per_call_max = {max} outputs in one call")]
    TooManyOutputs {
        /// The node.
        node: u32,
        /// The bound in force.
        max: usize,
    },
    /// An output file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
}
