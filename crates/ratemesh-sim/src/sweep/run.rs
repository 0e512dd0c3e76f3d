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
    /// Longest time for a region to reach 90 % of its ideal share after a demand move, ms
    /// (`None`: no move).
    pub region_move_ms: Option<f64>,
    /// Largest bytes between regions per key per second (`None`: no regions).
    pub cross_region_bytes_per_key_s: Option<f64>,
    /// Largest messages between regions per key per second (`None`: no regions).
    pub cross_region_msgs_per_key_s: Option<f64>,
    /// The seed that gave each metric of [`FOLDED`] its worst value, in its order.
    seeds: [u64; FOLDED.len()],
}

/// The metrics a point's seeds are folded over (each the worst of its seeds).
const FOLDED: [Metric; 12] = [
    Metric::OverAdmission,
    Metric::WorstWindowOverAdmission,
    Metric::AdmittedXIdeal,
    Metric::Fairness,
    Metric::FalseRejectRate,
    Metric::PartitionPeakRateXLimit,
    Metric::BytesPerNodeS,
    Metric::MsgsPerNodeS,
    Metric::ClusterMsgsS,
    Metric::RegionMoveMs,
    Metric::CrossRegionMsgsPerKeyS,
    Metric::CrossRegionBytesPerKeyS,
];

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
            Metric::RegionMoveMs => self.region_move_ms.unwrap_or(0.0),
            Metric::CrossRegionMsgsPerKeyS => self.cross_region_msgs_per_key_s.unwrap_or(0.0),
            Metric::CrossRegionBytesPerKeyS => self.cross_region_bytes_per_key_s.unwrap_or(0.0),
            Metric::PeakRateXLimit | Metric::ConvergenceMaxMs | Metric::ExcessPerChangeSyncIntervals => {
                f64::NAN
            }
        }
    }

    /// The seed whose run gave `metric` its worst value: the one to reproduce a missed bound
    /// with (the largest over-admission's for a metric not folded).
    pub fn seed_of(&self, metric: Metric) -> u64 {
        let index = FOLDED.iter().position(|&m| m == metric).unwrap_or(0);
        self.seeds[index]
    }

    /// The seed of the largest over-admission.
    pub fn worst_seed(&self) -> u64 {
        self.seed_of(Metric::OverAdmission)
    }

    fn fold(&mut self, seed: u64, over: &StrategyReport, below: Option<&StrategyReport>) {
        let first = self.strategy.is_empty();
        let before = FOLDED.map(|metric| self.metric(metric));
        self.fold_values(over, below);
        for (index, (metric, old)) in FOLDED.into_iter().zip(before).enumerate() {
            // Values only ever get worse: a change is this seed's.
            if first || self.metric(metric).total_cmp(&old).is_ne() {
                self.seeds[index] = seed;
            }
        }
    }

    fn fold_values(&mut self, over: &StrategyReport, below: Option<&StrategyReport>) {
        let first = self.strategy.is_empty();
        if first {
            self.strategy.clone_from(&over.strategy);
            self.admitted_x_ideal = f64::INFINITY;
        }
        if first || over.over_admission > self.over_admission {
            self.over_admission = over.over_admission;
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
        if let Some(regions) = &over.regions {
            let max = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o.max(new)));
            if let Some(ms) = regions.move_ms {
                self.region_move_ms = max(self.region_move_ms, ms);
            }
            self.cross_region_msgs_per_key_s =
                max(self.cross_region_msgs_per_key_s, regions.cross_msgs_per_key_s);
            self.cross_region_bytes_per_key_s =
                max(self.cross_region_bytes_per_key_s, regions.cross_bytes_per_key_s);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn report(over_admission: f64, fairness: f64) -> StrategyReport {
        StrategyReport {
            strategy: "s".into(),
            requests: 10,
            admitted: 10,
            ideal: 10,
            over_admission,
            worst_window_over_admission: 0.0,
            worst_window_s: None,
            worst_key_window_over_admission: 0.0,
            worst_key_window_at: None,
            admitted_x_ideal: 1.0,
            fairness: Some((fairness, 0, 0)),
            peak_rate_x_limit: 1.0,
            partition_peak_rate_x_limit: None,
            false_reject_rate: 0.0,
            false_admit_rate: 0.0,
            excess_per_change_sync_intervals: 0.0,
            convergence_ms: Vec::new(),
            unconverged: 0,
            msgs_per_node_s: 1.0,
            msgs_per_node_s_max: 1.0,
            bytes_per_node_s: 1.0,
            cluster_msgs_s: 1.0,
            traffic_by_kind: Vec::new(),
            lost: 0,
            cut: 0,
            events: 0,
            digest: 0,
            admitted_bins: Vec::new(),
            ideal_bins: Vec::new(),
            regions: None,
        }
    }

    #[test]
    fn each_metric_names_the_seed_of_its_own_worst_value() {
        let mut worst = WorstOfSeeds::default();
        worst.fold(1, &report(0.01, 0.02), None);
        worst.fold(2, &report(0.03, 0.01), None);
        worst.fold(3, &report(0.02, 0.40), None);
        worst.fold(4, &report(0.00, 0.05), None);
        assert_eq!((worst.over_admission, worst.seed_of(Metric::OverAdmission)), (0.03, 2));
        assert_eq!((worst.fairness, worst.seed_of(Metric::Fairness)), (0.40, 3));
        // Equal on every seed: the first seed's.
        assert_eq!(worst.seed_of(Metric::BytesPerNodeS), 1);
        assert_eq!(worst.worst_seed(), 2);
    }
}
