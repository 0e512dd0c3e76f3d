//! Sweeps: one TOML file describes a grid of scenarios (`simulations/sweeps/*.toml`); every grid
//! point runs every strategy on several seeds, and the worst of the seeds is reported, accuracy
//! next to cost, in one markdown table per grid block.
//!
//! A sweep file has a `[base]` scenario (any scenario file's content) and one or more `[[grid]]`
//! blocks. Each block lists values per axis; its points are the product of its axes (an axis left
//! out keeps the base's value). A block's `[[grid.expect]]` bounds apply to every one of its points,
//! on the worst seed. Axis values:
//!
//! - `nodes`, `keys`, `sync_ms`, `rate_x_limit`: numbers.
//! - `limits`: `"10/s"`, `"5/min"`, `"100/h"`, `"100/day"`, `"250/500ms"`, or a list of them (mixed
//!   limits: key `k` is under the `k % len`-th).
//! - `burst_x_limit`: burst as a multiple of the limit (at least 1 hit); `burst`: absolute hits.
//! - `algorithm`: algorithm names (baselines that need a token bucket skip the others).
//! - `net`: `"rtt:2"` (uniform one-way delay, 0.4–0.6 × the round trip in ms), or `"zones:3:1:80"`
//!   (3 zones, 1 ms round trips inside, 80 ms between).
//! - `workload`: `"base"`, `"per_key"` (every key at `rate_x_limit` × its own limit), `"hot"` (95 %
//!   on key 0), `"rate:4000"` (a fixed 4 000 requests/s, uniform over the keys).
//! - `demand`: `"uniform"`, `"skewed:0:0.75"` (node 0 gets 75 % of the arrivals).
//! - `faults`: `"none"`, `"loss:0.05"`, `"crash_churn"`, `"churn"`, `"partition"` (70/30 in the
//!   middle third), `"owner_crash"`, each timed relative to the run's duration.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::report::StrategyReport;
use crate::scenario::{
    DelayConfig, DemandConfig, FaultConfig, LimitConfig, Metric, NodeTarget, Scenario, ZonesConfig,
};
use crate::strategy::StrategyKind;
use crate::{Report, run_strategy};

/// A sweep file. See the module documentation.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepFile {
    /// Name of the sweep (default: the file's stem): the output is `<name>.md`.
    #[serde(default)]
    pub name: String,
    /// What the sweep shows.
    #[serde(default)]
    pub description: String,
    /// Seeds per point: `1..=seeds`.
    #[serde(default = "default_seeds")]
    pub seeds: u64,
    /// Virtual duration of every point's run (overrides the base's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<u64>,
    /// Also run every point at this multiple of the limit, for the false rejects below the limit
    /// (the `false_reject_rate` column and bounds); points with a fixed-rate workload skip it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below_rate_x_limit: Option<f64>,
    /// The scenario every point starts from.
    pub base: Scenario,
    /// The grid blocks.
    pub grid: Vec<GridBlock>,
    /// Bounds between two cells (one strategy at one point each): `left ≤ max_ratio × right`.
    #[serde(default)]
    pub compare: Vec<Comparison>,
    /// Bounds known to be missed, listed so that a run still passes while the protocol cannot
    /// meet them; each must still be missed (else remove it). Entries are `"<point> <strategy>
    /// <Metric>"` (as in a missed bound's line) or a comparison's label.
    #[serde(default)]
    pub known_missed: Vec<KnownMiss>,
}

/// A bound known to be missed, with what was measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KnownMiss {
    /// `"<point> <strategy> <Metric>"` or a comparison's label.
    pub bound: String,
    /// What was measured and why (for the reader; not checked).
    pub note: String,
}

/// One cell of a sweep's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cell {
    /// The point id (`block:index`).
    pub point: String,
    /// The strategy.
    pub strategy: String,
}

/// `left ≤ max_ratio × right` for one metric.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Comparison {
    /// What it checks, in words (also its name in `known_missed`).
    pub label: String,
    /// The metric compared (worst of seeds).
    pub metric: Metric,
    /// The cell that must be smaller.
    pub left: Cell,
    /// The cell it is compared to.
    pub right: Cell,
    /// The largest accepted `left / right`.
    pub max_ratio: f64,
}

/// The outcome of one comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct ComparisonResult {
    /// The comparison.
    pub comparison: Comparison,
    /// `left`'s value (`None`: the cell was not run).
    pub left: Option<f64>,
    /// `right`'s value.
    pub right: Option<f64>,
    /// Whether it holds.
    pub holds: bool,
}

/// Every comparison of `sweep` on `results`.
pub fn comparisons(sweep: &SweepFile, results: &[PointResult]) -> Vec<ComparisonResult> {
    let value = |cell: &Cell, metric: Metric| {
        let r = results.iter().find(|r| r.point.id == cell.point)?;
        Some(r.strategies.iter().find(|s| s.strategy == cell.strategy)?.metric(metric))
    };
    sweep
        .compare
        .iter()
        .map(|c| {
            let left = value(&c.left, c.metric);
            let right = value(&c.right, c.metric);
            let holds = matches!((left, right), (Some(l), Some(r)) if l <= c.max_ratio * r);
            ComparisonResult { comparison: c.clone(), left, right, holds }
        })
        .collect()
}

/// The verdict of a sweep against its bounds and its list of known misses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verdict {
    /// Missed bounds and comparisons not listed as known.
    pub unexpected: Vec<String>,
    /// Known misses that were missed again (with their notes).
    pub known: Vec<String>,
    /// Known misses that now hold (remove them from the list).
    pub now_holding: Vec<String>,
}

impl Verdict {
    /// Whether the sweep passes: nothing unexpected, no known miss that now holds.
    pub fn passes(&self) -> bool {
        self.unexpected.is_empty() && self.now_holding.is_empty()
    }
}

/// Sorts every missed bound and comparison into unexpected and known, and finds known misses that
/// now hold. A known miss whose point was not run (see `--point`) is not judged.
pub fn verdict(sweep: &SweepFile, results: &[PointResult]) -> Verdict {
    let mut v = Verdict::default();
    let mut missed: Vec<(String, String)> = Vec::new();
    for r in results {
        for line in &r.violations {
            missed.push((miss_key(line), line.clone()));
        }
    }
    for c in comparisons(sweep, results).into_iter().filter(|c| !c.holds) {
        let line = format!(
            "comparison {:?}: {:?} {} at {} = {:?} > {} × {} at {} = {:?}",
            c.comparison.label,
            c.comparison.metric,
            c.comparison.left.strategy,
            c.comparison.left.point,
            c.left,
            c.comparison.max_ratio,
            c.comparison.right.strategy,
            c.comparison.right.point,
            c.right
        );
        missed.push((c.comparison.label.clone(), line));
    }
    for (key, line) in &missed {
        match sweep.known_missed.iter().find(|k| &k.bound == key) {
            Some(k) => v.known.push(format!("{line} (known: {})", k.note)),
            None => v.unexpected.push(line.clone()),
        }
    }
    let ran = |bound: &str| {
        let point = bound.split_whitespace().next().unwrap_or("");
        results.iter().any(|r| r.point.id == point) || sweep.compare.iter().any(|c| c.label == bound)
    };
    for k in &sweep.known_missed {
        if ran(&k.bound) && !missed.iter().any(|(key, _)| key == &k.bound) {
            v.now_holding.push(format!("{} now holds: remove it from known_missed", k.bound));
        }
    }
    v
}

/// `"<point> <strategy> <Metric>"` of a missed bound's line.
fn miss_key(line: &str) -> String {
    let point = line.split_whitespace().nth(1).unwrap_or("");
    let rest = line.split_once("): ").map_or("", |(_, rest)| rest);
    let mut words = rest.split_whitespace();
    let strategy = words.next().unwrap_or("");
    let metric = words.next().unwrap_or("");
    format!("{point} {strategy} {metric}")
}

/// One block of a grid: the product of its axes.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridBlock {
    /// A heading for the block's table.
    pub label: String,
    /// Virtual duration of this block's runs (overrides the sweep's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<u64>,
    /// Seeds of this block's points (overrides the sweep's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seeds: Option<u64>,
    /// Whether this block's points also run below the limit (default: the sweep's setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below: Option<bool>,
    /// Cluster sizes.
    #[serde(default)]
    pub nodes: Vec<u32>,
    /// Limits (one, or a list per point for mixed limits).
    #[serde(default)]
    pub limits: Vec<LimitsValue>,
    /// Burst as a multiple of the limit.
    #[serde(default)]
    pub burst_x_limit: Vec<f64>,
    /// Absolute burst.
    #[serde(default)]
    pub burst: Vec<u64>,
    /// Algorithms.
    #[serde(default)]
    pub algorithm: Vec<String>,
    /// Active keys.
    #[serde(default)]
    pub keys: Vec<u32>,
    /// Networks.
    #[serde(default)]
    pub net: Vec<String>,
    /// Sync intervals in ms.
    #[serde(default)]
    pub sync_ms: Vec<u64>,
    /// Offered load over the limit.
    #[serde(default)]
    pub rate_x_limit: Vec<f64>,
    /// Workloads.
    #[serde(default)]
    pub workload: Vec<String>,
    /// Demand over the nodes.
    #[serde(default)]
    pub demand: Vec<String>,
    /// Faults.
    #[serde(default)]
    pub faults: Vec<String>,
    /// Strategies (default: the base's).
    #[serde(default)]
    pub strategies: Vec<String>,
    /// Bounds every point of the block must meet on its worst seed.
    #[serde(default)]
    pub expect: Vec<SweepExpectation>,
}

/// One limit or several (mixed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LimitsValue {
    /// Every key under one limit.
    One(String),
    /// Keys spread over several.
    Mixed(Vec<String>),
}

/// A bound on the worst seed of every point of a block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepExpectation {
    /// The strategy.
    pub strategy: String,
    /// The metric (`false_reject_rate`: of the run below the limit).
    pub metric: Metric,
    /// Largest accepted value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Smallest accepted value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
}

/// One point of a grid: its axis values, as text, and the scenario.
#[derive(Clone, Debug)]
pub struct Point {
    /// `block:index`, for `--point`.
    pub id: String,
    /// Index of the block.
    pub block: usize,
    /// `axis=value` pairs that differ from the base.
    pub params: Vec<(String, String)>,
    /// The scenario at overload.
    pub scenario: Scenario,
}

/// Worst-of-seeds metrics of one strategy at one point.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorstOfSeeds {
    /// The strategy.
    pub strategy: String,
    /// Largest over-admission over the run.
    pub over_admission: f64,
    /// Largest worst 1-second window (over every key).
    pub worst_window: f64,
    /// Smallest admitted / ideal.
    pub admitted_x_ideal: f64,
    /// Largest fairness gap.
    pub fairness: f64,
    /// Largest false-reject rate of the run below the limit (`None`: not run).
    pub false_reject_rate: Option<f64>,
    /// Largest partition peak / L (`None`: no partition).
    pub partition_peak: Option<f64>,
    /// Largest bytes per node per second.
    pub bytes_per_node_s: f64,
    /// Largest messages per node per second.
    pub msgs_per_node_s: f64,
    /// Largest cluster-wide messages per second.
    pub cluster_msgs_s: f64,
    /// The seed of the largest over-admission.
    pub worst_seed: u64,
}

impl WorstOfSeeds {
    /// The value of `metric` (worst over the seeds).
    pub fn metric(&self, metric: Metric) -> f64 {
        match metric {
            Metric::OverAdmission => self.over_admission,
            Metric::WorstWindowOverAdmission => self.worst_window,
            Metric::AdmittedXIdeal => self.admitted_x_ideal,
            Metric::Fairness => self.fairness,
            Metric::FalseRejectRate => self.false_reject_rate.unwrap_or(0.0),
            Metric::PartitionPeakRateXLimit => self.partition_peak.unwrap_or(0.0),
            Metric::BytesPerNodeS => self.bytes_per_node_s,
            Metric::MsgsPerNodeS => self.msgs_per_node_s,
            Metric::ClusterMsgsS => self.cluster_msgs_s,
            Metric::PeakRateXLimit | Metric::ConvergenceMaxMs | Metric::ExcessPerChangeSyncIntervals => {
                f64::NAN
            }
        }
    }

    fn fold(&mut self, seed: u64, over: &StrategyReport, below: Option<&StrategyReport>) {
        let first = self.strategy.is_empty();
        if first {
            self.strategy.clone_from(&over.strategy);
            self.admitted_x_ideal = f64::INFINITY;
        }
        if first || over.over_admission > self.over_admission {
            self.over_admission = over.over_admission;
            self.worst_seed = seed;
        }
        self.worst_window = self.worst_window.max(over.worst_window_over_admission);
        self.admitted_x_ideal = self.admitted_x_ideal.min(over.admitted_x_ideal);
        self.fairness = self.fairness.max(over.fairness.map_or(0.0, |f| f.0));
        if let Some(b) = below {
            self.false_reject_rate = Some(self.false_reject_rate.unwrap_or(0.0).max(b.false_reject_rate));
        }
        if let Some(p) = over.partition_peak_rate_x_limit {
            self.partition_peak = Some(self.partition_peak.unwrap_or(0.0).max(p));
        }
        self.bytes_per_node_s = self.bytes_per_node_s.max(over.bytes_per_node_s);
        self.msgs_per_node_s = self.msgs_per_node_s.max(over.msgs_per_node_s);
        self.cluster_msgs_s = self.cluster_msgs_s.max(over.cluster_msgs_s);
    }
}

/// A point's results.
#[derive(Clone, Debug)]
pub struct PointResult {
    /// The point.
    pub point: Point,
    /// One entry per strategy, in run order.
    pub strategies: Vec<WorstOfSeeds>,
    /// Missed bounds, one line each (with how to reproduce).
    pub violations: Vec<String>,
}

impl SweepFile {
    /// Reads a sweep file; its name defaults to the file's stem.
    pub fn load(path: &Path) -> Result<SweepFile, SimError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SimError::Read { path: path.to_owned(), source })?;
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let mut sweep: SweepFile = toml::from_str(&text)
            .map_err(|e| SimError::Parse { name: stem.clone(), message: e.to_string() })?;
        if sweep.name.is_empty() {
            sweep.name = stem;
        }
        if sweep.base.name.is_empty() {
            sweep.base.name.clone_from(&sweep.name);
        }
        if sweep.seeds == 0 {
            return Err(SimError::Invalid { name: sweep.name, message: "seeds must be positive".into() });
        }
        sweep.points()?;
        Ok(sweep)
    }

    /// Every point of every block, validated.
    pub fn points(&self) -> Result<Vec<Point>, SimError> {
        let mut points = Vec::new();
        for (block_index, block) in self.grid.iter().enumerate() {
            for (index, params) in product(&axes(block)).into_iter().enumerate() {
                let mut scenario = self.base.clone();
                if let Some(d) = block.duration_s.or(self.duration_s) {
                    scenario.duration_s = d;
                }
                if !block.strategies.is_empty() {
                    scenario.strategies.clone_from(&block.strategies);
                }
                scenario.expect.clear();
                apply_all(&mut scenario, &params).map_err(|message| self.invalid(message))?;
                drop_unfit_strategies(&mut scenario);
                let id = format!("{block_index}:{index}");
                scenario.name = format!("{}-{}", self.name, id.replace(':', "-"));
                scenario.validate()?;
                points.push(Point { id, block: block_index, params, scenario });
            }
        }
        Ok(points)
    }

    fn invalid(&self, message: String) -> SimError {
        SimError::Invalid { name: self.name.clone(), message }
    }

    /// Seeds of block `block`'s points.
    pub fn block_seeds(&self, block: usize) -> u64 {
        self.grid.get(block).and_then(|b| b.seeds).unwrap_or(self.seeds)
    }

    /// The scenario of `point` below the limit (for false rejects), if the sweep asks for one.
    pub fn below(&self, point: &Point) -> Option<Scenario> {
        let rate = self.below_rate_x_limit?;
        if point.scenario.workload.rate_per_s.is_some() || self.grid[point.block].below == Some(false) {
            return None;
        }
        let mut scenario = point.scenario.clone();
        scenario.workload.rate_x_limit = rate;
        Some(scenario)
    }

    /// Runs `point` on every seed (or only `seed`), `jobs` seeds at a time is not done: one point
    /// runs on one thread; see [`run_sweep`] for points in parallel.
    pub fn run_point(&self, point: &Point, seed: Option<u64>) -> Result<PointResult, SimError> {
        let seeds: Vec<u64> = seed.map_or_else(|| (1..=self.block_seeds(point.block)).collect(), |s| vec![s]);
        let below = self.below(point);
        let mut worst: Vec<WorstOfSeeds> = Vec::new();
        for &seed in &seeds {
            let over = run_report(&point.scenario, seed)?;
            let below = below.as_ref().map(|b| run_report(b, seed)).transpose()?;
            for (i, s) in over.strategies.iter().enumerate() {
                if worst.len() <= i {
                    worst.push(WorstOfSeeds::default());
                }
                worst[i].fold(seed, s, below.as_ref().and_then(|b| b.strategies.get(i)));
            }
        }
        let violations = self.violations(point, &worst);
        Ok(PointResult { point: point.clone(), strategies: worst, violations })
    }

    fn violations(&self, point: &Point, worst: &[WorstOfSeeds]) -> Vec<String> {
        let mut out = Vec::new();
        for e in &self.grid[point.block].expect {
            let Some(w) = worst.iter().find(|w| w.strategy == e.strategy) else { continue };
            let value = w.metric(e.metric);
            let missed = e.max.is_some_and(|m| value.is_nan() || value > m)
                || e.min.is_some_and(|m| value.is_nan() || value < m);
            if missed {
                let bound = match (e.min, e.max) {
                    (Some(min), Some(max)) => format!("in [{min}, {max}]"),
                    (Some(min), None) => format!("≥ {min}"),
                    (_, max) => format!("≤ {}", max.unwrap_or(f64::NAN)),
                };
                out.push(format!(
                    "point {} ({}): {} {:?} = {value:.5}, bound {bound} (worst seed {})",
                    point.id,
                    params_text(&point.params),
                    e.strategy,
                    e.metric,
                    w.worst_seed
                ));
            }
        }
        out
    }
}

fn run_report(scenario: &Scenario, seed: u64) -> Result<Report, SimError> {
    let runs = scenario
        .strategy_kinds()?
        .into_iter()
        .map(|strategy| run_strategy(scenario, strategy, seed, None))
        .collect::<Result<Vec<_>, SimError>>()?;
    Ok(Report::new(scenario, seed, &runs))
}

/// Runs every point of `sweep` (only the ones whose id starts with `only`, if given), `jobs`
/// points at a time; `progress` is called after each point with its result.
pub fn run_sweep(
    sweep: &SweepFile,
    only: Option<&str>,
    jobs: usize,
    progress: &(dyn Fn(&PointResult) + Sync),
) -> Result<Vec<PointResult>, SimError> {
    let points: Vec<Point> = sweep
        .points()?
        .into_iter()
        .filter(|p| only.is_none_or(|o| p.id == o || p.id.starts_with(&format!("{o}:"))))
        .collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<PointResult, SimError>>>> =
        Mutex::new((0..points.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, points.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(point) = points.get(index) else { break };
                    let result = sweep.run_point(point, None);
                    if let Ok(r) = &result {
                        progress(r);
                    }
                    if let Ok(mut slots) = results.lock() {
                        slots[index] = Some(result);
                    }
                }
            });
        }
    });
    let slots = results.into_inner().unwrap_or_default();
    slots
        .into_iter()
        .map(|slot| {
            slot.unwrap_or_else(|| {
                Err(SimError::Invalid { name: sweep.name.clone(), message: "a sweep worker stopped".into() })
            })
        })
        .collect()
}

/// The sweep's results as markdown: one table per block, then the missed bounds.
pub fn markdown(sweep: &SweepFile, path: &Path, results: &[PointResult], elapsed_s: f64) -> String {
    use core::fmt::Write as _;
    let mut out = format!("# Sweep `{}`\n\n{}\n\n", sweep.name, sweep.description);
    let _ = writeln!(
        out,
        "Generated by `cargo run -p ratemesh-sim --release -- --sweep {}` in {elapsed_s:.0} s. Every point runs \
         every strategy on seeds 1..={} ({} s virtual each); each cell is the worst of the seeds. \
         False rejects are of a second run at {} × L. Bytes and messages are sent ones, per node per second \
         (worst seed). Fairness: the worst node's |admitted − ideal admitted from it| / the ideal's admitted \
         hits of the key, over the tracked keys. `✗` marks a strategy that missed a bound of its block \
         (listed at the end).\n",
        path.display(),
        sweep.seeds,
        sweep.duration_s.unwrap_or(sweep.base.duration_s),
        sweep.below_rate_x_limit.map_or("–".into(), |r| r.to_string()),
    );
    for (block_index, block) in sweep.grid.iter().enumerate() {
        let _ = writeln!(
            out,
            "## {}\n\n{} seeds, {} s virtual per run.\n",
            block.label,
            sweep.block_seeds(block_index),
            block.duration_s.or(sweep.duration_s).unwrap_or(sweep.base.duration_s)
        );
        if !block.expect.is_empty() {
            let bounds: Vec<String> = block
                .expect
                .iter()
                .map(|e| {
                    let min = e.min.map_or(String::new(), |m| format!(" ≥ {m}"));
                    let max = e.max.map_or(String::new(), |m| format!(" ≤ {m}"));
                    format!("{} {:?}{min}{max}", e.strategy, e.metric)
                })
                .collect();
            let _ = writeln!(out, "Bounds: {}.\n", bounds.join("; "));
        }
        out.push_str(
            "| point | parameters | strategy | over-adm (run) | worst 1-s | admitted/ideal | fairness | \
             false rej @below | partition peak/L | bytes/node/s | msgs/node/s | cluster msgs/s |\n",
        );
        out.push_str("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for r in results.iter().filter(|r| r.point.block == block_index) {
            for (i, s) in r.strategies.iter().enumerate() {
                let missed = r.violations.iter().any(|v| v.contains(&format!(": {} ", s.strategy)));
                let (id, params) = if i == 0 {
                    (r.point.id.as_str(), params_text(&r.point.params))
                } else {
                    ("", String::new())
                };
                let _ = writeln!(
                    out,
                    "| {id} | {params} | {}{} | {} | {} | {:.4} | {} | {} | {} | {:.0} | {:.1} | {:.0} |",
                    s.strategy,
                    if missed { " ✗" } else { "" },
                    percent(s.over_admission),
                    percent(s.worst_window),
                    s.admitted_x_ideal,
                    percent(s.fairness),
                    s.false_reject_rate.map_or("–".into(), percent),
                    s.partition_peak.map_or("–".into(), |p| format!("{p:.3}")),
                    s.bytes_per_node_s,
                    s.msgs_per_node_s,
                    s.cluster_msgs_s,
                );
            }
        }
        out.push('\n');
    }
    let compared = comparisons(sweep, results);
    if !compared.is_empty() {
        out.push_str("## Comparisons\n\n| check | metric | left | right | left / right | bound | holds |\n");
        out.push_str("|---|---|---|---|---:|---:|---|\n");
        for c in &compared {
            let cell = |cell: &Cell, value: Option<f64>| {
                format!(
                    "{} at {}: {}",
                    cell.strategy,
                    cell.point,
                    value.map_or("–".into(), |v| format!("{v:.1}"))
                )
            };
            let ratio = match (c.left, c.right) {
                (Some(l), Some(r)) if r != 0.0 => format!("{:.3}", l / r),
                _ => "–".into(),
            };
            let _ = writeln!(
                out,
                "| {} | {:?} | {} | {} | {ratio} | ≤ {} | {} |",
                c.comparison.label,
                c.comparison.metric,
                cell(&c.comparison.left, c.left),
                cell(&c.comparison.right, c.right),
                c.comparison.max_ratio,
                if c.holds { "yes" } else { "**no**" }
            );
        }
        out.push('\n');
    }
    if !sweep.known_missed.is_empty() {
        out.push_str("## Known misses (listed in the sweep file)\n\n");
        for k in &sweep.known_missed {
            let _ = writeln!(out, "- `{}`: {}", k.bound, k.note);
        }
        out.push('\n');
    }
    let violations: Vec<&String> = results.iter().flat_map(|r| &r.violations).collect();
    let _ = writeln!(out, "## Missed bounds ({})\n", violations.len());
    for v in violations {
        let id = v.split_whitespace().nth(1).unwrap_or("");
        let _ = writeln!(
            out,
            "- {v}: `cargo run -p ratemesh-sim --release -- --sweep {} --point {id}`",
            path.display()
        );
    }
    out
}

/// `axis=value, …`.
pub fn params_text(params: &[(String, String)]) -> String {
    params.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
}

fn percent(fraction: f64) -> String {
    format!("{:.3}%", fraction * 100.0)
}

fn default_seeds() -> u64 {
    5
}

/// The axes of a block, as `(name, values as text)`, in application order (limits before bursts,
/// workload before rates).
fn axes(block: &GridBlock) -> Vec<(&'static str, Vec<String>)> {
    let text = |v: &[f64]| v.iter().map(f64::to_string).collect::<Vec<_>>();
    let limits = block
        .limits
        .iter()
        .map(|l| match l {
            LimitsValue::One(one) => one.clone(),
            LimitsValue::Mixed(many) => many.join("+"),
        })
        .collect();
    let all: Vec<(&'static str, Vec<String>)> = vec![
        ("nodes", block.nodes.iter().map(u32::to_string).collect()),
        ("algorithm", block.algorithm.clone()),
        ("limits", limits),
        ("burst_x_limit", text(&block.burst_x_limit)),
        ("burst", block.burst.iter().map(u64::to_string).collect()),
        ("keys", block.keys.iter().map(u32::to_string).collect()),
        ("net", block.net.clone()),
        ("sync_ms", block.sync_ms.iter().map(u64::to_string).collect()),
        ("workload", block.workload.clone()),
        ("rate_x_limit", text(&block.rate_x_limit)),
        ("demand", block.demand.clone()),
        ("faults", block.faults.clone()),
    ];
    all.into_iter().filter(|(_, values)| !values.is_empty()).collect()
}

fn product(axes: &[(&'static str, Vec<String>)]) -> Vec<Vec<(String, String)>> {
    let mut points = vec![Vec::new()];
    for (name, values) in axes {
        points = points
            .into_iter()
            .flat_map(|p: Vec<(String, String)>| {
                values.iter().map(move |v| {
                    let mut next = p.clone();
                    next.push(((*name).to_owned(), v.clone()));
                    next
                })
            })
            .collect();
    }
    points
}

fn apply_all(scenario: &mut Scenario, params: &[(String, String)]) -> Result<(), String> {
    params.iter().try_for_each(|(axis, value)| apply(scenario, axis, value))?;
    apply_faults(scenario, params.iter().find(|(a, _)| a == "faults").map_or("none", |(_, v)| v.as_str()))
}

fn number<T: std::str::FromStr>(axis: &str, value: &str) -> Result<T, String> {
    value.parse().map_err(|_| format!("{axis}: {value:?} is not a number"))
}

fn apply(s: &mut Scenario, axis: &str, value: &str) -> Result<(), String> {
    match axis {
        "nodes" => s.nodes = number(axis, value)?,
        "algorithm" => {
            for p in policies_mut(s) {
                p.algorithm = value.to_owned();
            }
        }
        "limits" => {
            let algorithm = s.policy_configs().first().map_or("token_bucket".into(), |p| p.algorithm.clone());
            let policies = value
                .split('+')
                .map(|one| parse_limit(one, &algorithm))
                .collect::<Result<Vec<LimitConfig>, String>>()?;
            if policies.len() == 1 {
                s.limit = policies.into_iter().next();
                s.policies.clear();
            } else {
                s.limit = None;
                s.policies = policies;
            }
        }
        "burst_x_limit" => {
            let x: f64 = number(axis, value)?;
            for p in policies_mut(s) {
                p.burst = Some(((p.limit as f64 * x).round() as u64).max(1));
            }
        }
        "burst" => {
            let burst: u64 = number(axis, value)?;
            for p in policies_mut(s) {
                p.burst = Some(burst);
            }
        }
        "keys" => {
            s.workload.keys = number(axis, value)?;
            s.workload.hot_keys = s.workload.hot_keys.min(s.workload.keys);
        }
        "net" => apply_net(s, value)?,
        "sync_ms" => s.sync_interval_ms = number(axis, value)?,
        "rate_x_limit" => s.workload.rate_x_limit = number(axis, value)?,
        "workload" => apply_workload(s, value)?,
        "demand" => {
            s.workload.demand = match value.split(':').collect::<Vec<_>>().as_slice() {
                ["uniform"] => DemandConfig::Uniform,
                ["skewed", node, share] => {
                    DemandConfig::Skewed { node: number("demand", node)?, share: number("demand", share)? }
                }
                _ => return Err(format!("demand {value:?} is not uniform or skewed:NODE:SHARE")),
            }
        }
        "faults" => {}
        other => return Err(format!("unknown axis {other}")),
    }
    Ok(())
}

fn policies_mut(s: &mut Scenario) -> impl Iterator<Item = &mut LimitConfig> {
    s.limit.iter_mut().chain(s.policies.iter_mut())
}

/// `"10/s"`, `"5/min"`, `"100/h"`, `"100/day"`, `"250/500ms"`.
pub fn parse_limit(text: &str, algorithm: &str) -> Result<LimitConfig, String> {
    let (count, per) = text.split_once('/').ok_or_else(|| format!("limit {text:?} is not N/unit"))?;
    let period_ms = match per {
        "s" => 1000,
        "min" => 60_000,
        "h" => 3_600_000,
        "day" => 86_400_000,
        ms => ms
            .strip_suffix("ms")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("limit {text:?}: unknown unit"))?,
    };
    Ok(LimitConfig {
        algorithm: algorithm.to_owned(),
        limit: number("limits", count)?,
        period_ms,
        burst: None,
        mode: None,
    })
}

fn apply_net(s: &mut Scenario, value: &str) -> Result<(), String> {
    let one_way = |rtt_ms: f64| DelayConfig::Uniform { min_ms: rtt_ms * 0.4, max_ms: rtt_ms * 0.6 };
    match value.split(':').collect::<Vec<_>>().as_slice() {
        ["rtt", rtt] => {
            s.network.delay = one_way(number("net", rtt)?);
            s.network.zones = None;
        }
        ["zones", count, inside, between] => {
            s.network.delay = one_way(number("net", inside)?);
            s.network.zones =
                Some(ZonesConfig { count: number("net", count)?, between: one_way(number("net", between)?) });
        }
        _ => return Err(format!("net {value:?} is not rtt:MS or zones:COUNT:INSIDE_MS:BETWEEN_MS")),
    }
    Ok(())
}

fn apply_workload(s: &mut Scenario, value: &str) -> Result<(), String> {
    let w = &mut s.workload;
    match value.split(':').collect::<Vec<_>>().as_slice() {
        ["base"] => {}
        ["per_key"] => {
            w.per_key = true;
            w.rate_per_s = None;
        }
        ["hot"] => {
            w.per_key = false;
            w.hot_keys = 1;
            w.hot_share = if w.keys > 1 { 0.95 } else { 1.0 };
        }
        ["rate", rate] => {
            w.per_key = false;
            w.rate_per_s = Some(number("workload", rate)?);
            w.hot_keys = w.keys;
            w.hot_share = 1.0;
        }
        _ => return Err(format!("workload {value:?} is not base, per_key, hot or rate:N")),
    }
    Ok(())
}

fn apply_faults(s: &mut Scenario, value: &str) -> Result<(), String> {
    let d = s.duration_s * 1000;
    let every = (d / 8).max(2000);
    s.faults.clear();
    match value.split(':').collect::<Vec<_>>().as_slice() {
        ["none"] => {}
        ["loss", p] => s.network.loss = number("faults", p)?,
        ["crash_churn"] => s.faults.push(FaultConfig::CrashChurn {
            start_ms: d / 4,
            end_ms: d * 3 / 4,
            every_ms: every,
            down_ms: every / 2,
            nodes: Vec::new(),
        }),
        ["churn"] => s.faults.push(FaultConfig::Churn {
            start_ms: d / 4,
            end_ms: d * 3 / 4,
            every_ms: every,
            down_ms: every / 2,
            nodes: Vec::new(),
        }),
        ["partition"] => {
            let cut = (s.nodes * 7).div_ceil(10).clamp(1, s.nodes.saturating_sub(1).max(1));
            s.faults.push(FaultConfig::Partition {
                start_ms: d / 3,
                end_ms: d * 2 / 3,
                groups: vec![(0..cut).collect(), (cut..s.nodes).collect()],
            });
        }
        ["owner_crash"] => s.faults.push(FaultConfig::Crash {
            at_ms: d / 3,
            node: NodeTarget::Named("hot_owner".into()),
            restart_after_ms: Some(d / 3),
        }),
        _ => {
            return Err(format!(
                "faults {value:?} is not none, loss:P, crash_churn, churn, partition or owner_crash"
            ));
        }
    }
    Ok(())
}

/// Baselines that need a token-bucket-family limit are left out of points without one.
fn drop_unfit_strategies(s: &mut Scenario) {
    let tat = ["token_bucket", "gcra", "leaky_bucket"];
    let all_tat = s.policy_configs().iter().all(|p| tat.contains(&p.algorithm.as_str()));
    if !all_tat {
        s.strategies.retain(|name| StrategyKind::from_name(name).is_ok_and(|k| !k.needs_tat_limit()));
    }
}

/// Where a sweep's results go: `<dir of the sweep>/../results/sweeps/<name>.md`.
pub fn results_path(sweep_path: &Path, name: &str) -> PathBuf {
    let dir = sweep_path.parent().and_then(Path::parent).unwrap_or(Path::new("."));
    dir.join("results").join("sweeps").join(format!("{name}.md"))
}
