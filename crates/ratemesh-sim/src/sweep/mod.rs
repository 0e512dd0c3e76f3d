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
//!   limits: key `k` is under the `k % len`-th). A `limits` value replaces the base's whole limit:
//!   its burst is the algorithm's default (one hit for `gcra` and `leaky_bucket`) unless the point
//!   also sets `burst_x_limit` or `burst`.
//! - `burst_x_limit`: burst as a multiple of the limit (at least 1 hit); `burst`: absolute hits.
//! - `algorithm`: algorithm names (baselines that need a token bucket skip the others).
//! - `net`: `"rtt:2"` (uniform one-way delay, 0.4–0.6 × the round trip in ms), or `"zones:3:1:80"`
//!   (3 zones, 1 ms round trips inside, 80 ms between).
//! - `regions`: `"regions:3:80"` (3 protocol regions, 80 ms round trips between every two) or
//!   `"regions:3:40,80,300"` (the upper triangle of the round-trip matrix, row by row: 0–1, 0–2,
//!   1–2); inside a region the delay stays `net`'s (or the base's).
//! - `nodes_per_region`: nodes = regions × this (applied after `regions`).
//! - `region_fallback`: `floor`, `last`, `closed`.
//! - `workload`: `"base"`, `"per_key"` (every key at `rate_x_limit` × its own limit), `"hot"` (95 %
//!   on key 0), `"rate:4000"` (a fixed 4 000 requests/s, uniform over the keys).
//! - `demand`: `"uniform"`, `"skewed:0:0.75"` (node 0 gets 75 % of the arrivals); with regions
//!   `"regions:even"`, `"regions:hot:0.8"` (80 % in region 0, the rest even over the others),
//!   `"regions:0.8,0.1,0.1"` (one weight per region) or `"regions:moving:5000"` (all of it in one
//!   region, moving to the next every 5 000 ms).
//! - `faults`: `"none"`, `"loss:0.05"`, `"crash_churn"`, `"churn"`, `"partition"` (70/30 in the
//!   middle third), `"owner_crash"`, `"region_partition"` or `"region_partition:2"` (region 0, or
//!   2, cut off from the others in the middle third), each timed relative to the run's duration.
//!
//! The code is split by concern: this file holds the sweep file's model and its loading;
//! `grid.rs` expands the grid into points (scenarios); `run.rs` runs the points on their seeds and
//! keeps the worst; `verdict.rs` checks the results against the bounds, comparisons and known
//! misses; `report.rs` writes them as markdown.

mod grid;
mod report;
mod run;
mod verdict;

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use self::grid::{Point, parse_limit};
pub use self::report::{markdown, params_text, results_path};
pub use self::run::{PointResult, WorstOfSeeds, run_sweep};
pub use self::verdict::{ComparisonResult, Verdict, comparisons, verdict};
use crate::error::SimError;
use crate::scenario::{Metric, Scenario};

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
    /// Protocol regions and their round trips.
    #[serde(default)]
    pub regions: Vec<String>,
    /// Nodes per region (nodes = regions × this).
    #[serde(default)]
    pub nodes_per_region: Vec<u32>,
    /// Region fallbacks of the ratemesh nodes.
    #[serde(default)]
    pub region_fallback: Vec<String>,
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
}

fn default_seeds() -> u64 {
    5
}
