//! ratemesh-sim: a deterministic discrete-event simulator of ratemesh clusters.
//!
//! It runs many nodes of a strategy (the real `ratemesh_core` node, or a baseline of the field)
//! over a simulated network and clock, under the faults of a scenario file, and measures how far
//! the cluster's admitted traffic strays from one ideal global limiter that sees every request.
//!
//! - [`Scenario`]: a scenario file (`simulations/*.toml`).
//! - [`run_scenario`]: runs every strategy of a scenario on the same seed; returns a [`Report`].
//! - [`engine::World`]: one strategy's run: virtual time, event queue, nodes, network, faults.
//! - [`strategy::SimNode`]: the node interface every strategy implements.
//! - [`sweep`]: grids of scenarios from one file, worst of several seeds per point.
//! - [`audit`]: the owners' audit (the core's) lined up with the oracle, window by window
//!   ([`run_strategy_audited`]; `tests/audit.rs`).
//!
//! One seed decides everything random, split into independent streams per purpose
//! ([`rng::substream`]). There is no wall clock, no thread and no hash-map iteration anywhere: the
//! same scenario and seed give the same run bit for bit, which [`Report::digest`] checks.

pub mod audit;
pub mod clock;
pub mod engine;
mod error;
pub mod membership;
pub mod metrics;
pub mod network;
pub mod oracle;
mod report;
pub mod rng;
pub mod scenario;
pub mod strategy;
pub mod svg;
pub mod sweep;
pub mod workload;

use std::path::{Path, PathBuf};

pub use error::SimError;
pub use report::{Report, StrategyReport, summary_markdown};
pub use scenario::Scenario;
pub use strategy::StrategyKind;

use engine::{LogSink, RunOutput, World};

/// Something a scenario can be loaded from: a path to a TOML file, or a scenario.
pub trait IntoScenario {
    /// The scenario, validated.
    fn into_scenario(self) -> Result<Scenario, SimError>;
}

impl IntoScenario for Scenario {
    fn into_scenario(self) -> Result<Scenario, SimError> {
        self.validate()?;
        Ok(self)
    }
}

impl IntoScenario for &Scenario {
    fn into_scenario(self) -> Result<Scenario, SimError> {
        self.clone().into_scenario()
    }
}

impl IntoScenario for &Path {
    fn into_scenario(self) -> Result<Scenario, SimError> {
        Scenario::load(self)
    }
}

impl IntoScenario for PathBuf {
    fn into_scenario(self) -> Result<Scenario, SimError> {
        Scenario::load(&self)
    }
}

impl IntoScenario for &str {
    /// A path to a scenario file.
    fn into_scenario(self) -> Result<Scenario, SimError> {
        Scenario::load(Path::new(self))
    }
}

/// Runs every strategy of a scenario with `seed` (default: the scenario's seed, else a hash of its
/// name) and returns their metrics.
pub fn run_scenario(scenario: impl IntoScenario, seed: Option<u64>) -> Result<Report, SimError> {
    let scenario = scenario.into_scenario()?;
    let seed = scenario.effective_seed(seed);
    let strategies = scenario.strategy_kinds()?;
    run_strategies(&scenario, seed, &strategies)
}

/// Runs `strategies` on `scenario` with `seed`, one after the other, each in a fresh world.
pub fn run_strategies(
    scenario: &Scenario,
    seed: u64,
    strategies: &[StrategyKind],
) -> Result<Report, SimError> {
    let runs = strategies
        .iter()
        .map(|&strategy| run_strategy(scenario, strategy, seed, None))
        .collect::<Result<Vec<RunOutput>, SimError>>()?;
    Ok(Report::new(scenario, seed, &runs))
}

/// Runs one strategy on `scenario` with `seed`, comparing the owners' audit with the oracle
/// ([`audit`]): the output's `audit` holds the comparison.
pub fn run_strategy_audited(
    scenario: &Scenario,
    strategy: StrategyKind,
    seed: u64,
) -> Result<RunOutput, SimError> {
    World::new(scenario, strategy, seed, None)?.with_audit().run()
}

/// Runs one strategy on `scenario` with `seed`; every event-log line also goes to `sink`.
pub fn run_strategy<'a>(
    scenario: &'a Scenario,
    strategy: StrategyKind,
    seed: u64,
    sink: Option<LogSink<'a>>,
) -> Result<RunOutput, SimError> {
    World::new(scenario, strategy, seed, sink)?.run()
}
