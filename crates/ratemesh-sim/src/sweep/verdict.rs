//! Judging a sweep's results: the bounds of each block on every point's worst seed, the
//! comparisons between cells, and the verdict against the list of known misses.

use super::{Cell, Comparison, Point, PointResult, SweepFile, WorstOfSeeds, params_text};
use crate::scenario::Metric;

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

impl SweepFile {
    pub(super) fn violations(&self, point: &Point, worst: &[WorstOfSeeds]) -> Vec<String> {
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
                    w.seed_of(e.metric)
                ));
            }
        }
        out
    }
}
