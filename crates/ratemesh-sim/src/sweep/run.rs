//! Running a sweep: every point on every seed (points in parallel on threads, each run still
//! single-threaded and deterministic), folded into the worst of the seeds per strategy.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Point, SweepFile};
use crate::error::SimError;
use crate::report::StrategyReport;
use crate::scenario::{Metric, Scenario};
use crate::{Report, run_strategy};

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
    /// Runs `point` on every seed of its block (or only `seed`), one seed after another on this
    /// thread; [`run_sweep`] runs points in parallel.
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
