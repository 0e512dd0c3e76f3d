//! Reports: the metrics of each strategy's run, as a terminal table, markdown, and a summary of
//! many scenarios side by side.

use core::fmt::Write as _;

use crate::engine::RunOutput;
use crate::metrics::{
    BIN_NANOS, BINS_PER_WINDOW, Recorder, bins_to_reach, over_admission, peak_rate, worst_window,
};
use crate::scenario::{Expectation, FaultConfig, Metric, Scenario};

/// The metrics of one strategy on one scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct StrategyReport {
    /// The strategy's name.
    pub strategy: String,
    /// Requests that arrived.
    pub requests: u64,
    /// Hits the cluster admitted.
    pub admitted: u64,
    /// Hits the ideal global limiter admitted.
    pub ideal: u64,
    /// `(admitted − ideal) / ideal` over the run.
    pub over_admission: f64,
    /// `max(0, admitted − ideal) / ideal` of the worst 1-second window, over all keys together
    /// and over each hot key alone (the largest of these).
    pub worst_window_over_admission: f64,
    /// Which second that was.
    pub worst_window_s: Option<usize>,
    /// The worst 1-second window of any single key (every key, not only the hot ones).
    pub worst_key_window_over_admission: f64,
    /// Which key and second that was.
    pub worst_key_window_at: Option<(u32, usize)>,
    /// Hits admitted over hits the ideal admitted (1 = as the ideal; below: under-admission).
    pub admitted_x_ideal: f64,
    /// The worst node's `|admitted from it − ideal admitted from it|` over the key's ideal
    /// admitted hits, over the tracked keys; with the key and node (`None`: no tracked key had an
    /// ideal admission).
    pub fairness: Option<(f64, u32, u32)>,
    /// The largest admitted hits of one hot key in a 1-second window, as a multiple of the limit per
    /// second.
    pub peak_rate_x_limit: f64,
    /// The same, over the windows entirely inside a partition (`None`: the scenario has none). The
    /// partition bound of the issue: ≤ 1.10 with the local-share fallback.
    pub partition_peak_rate_x_limit: Option<f64>,
    /// Requests the ideal admitted and the cluster refused, as a fraction of requests.
    pub false_reject_rate: f64,
    /// Requests the cluster admitted and the ideal refused, as a fraction of requests.
    pub false_admit_rate: f64,
    /// Hits admitted beyond the ideal per membership change, in sync intervals of the limit (0
    /// without membership changes).
    pub excess_per_change_sync_intervals: f64,
    /// Convergence time after each heal that converged, in milliseconds.
    pub convergence_ms: Vec<f64>,
    /// Heals after which the cluster never converged before the end of the run.
    pub unconverged: u32,
    /// Messages sent per node per second, averaged over nodes.
    pub msgs_per_node_s: f64,
    /// Messages sent per second by the busiest node.
    pub msgs_per_node_s_max: f64,
    /// Bytes sent per node per second, averaged over nodes.
    pub bytes_per_node_s: f64,
    /// Messages sent per second by the whole cluster.
    pub cluster_msgs_s: f64,
    /// Per message kind: `(messages, bytes)` per node per second.
    pub traffic_by_kind: Vec<(String, f64, f64)>,
    /// Message copies lost to random loss.
    pub lost: u64,
    /// Messages dropped by cut links.
    pub cut: u64,
    /// Events processed.
    pub events: u64,
    /// Digest of the run's event log (equal for equal runs, bit for bit).
    pub digest: u64,
    /// Admitted hits per 100 ms bin.
    pub admitted_bins: Vec<u64>,
    /// Ideal admitted hits per 100 ms bin.
    pub ideal_bins: Vec<u64>,
    /// What only runs with regions measure (`None` without `[network.regions]`).
    pub regions: Option<RegionReport>,
}

/// The metrics of a run with regions.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionReport {
    /// Per region: `(admitted, ideal)` hits of the requests that arrived there (the ideal's is
    /// the region's ideal share of the one global limiter).
    pub hits: Vec<(u64, u64)>,
    /// After each move of the demand between regions, the time until every region whose share
    /// rose admits 90 % of the ideal's from it over the next second ([`bins_to_reach`]), the
    /// longest, in ms; infinite when one never did before the next move; `None` without moves.
    pub move_ms: Option<f64>,
    /// Messages sent from one region to another, per key per second.
    pub cross_msgs_per_key_s: f64,
    /// Bytes sent from one region to another, per key per second.
    pub cross_bytes_per_key_s: f64,
    /// Per pair of distinct regions `(from, to)`: messages and bytes per second.
    pub pairs: Vec<((u32, u32), f64, f64)>,
}

impl RegionReport {
    /// The region metrics of `run` (`None` without regions).
    fn from_run(scenario: &Scenario, run: &RunOutput) -> Option<RegionReport> {
        scenario.network.regions.as_ref()?;
        let r = &run.recorder;
        let sum = |bins: &Vec<u64>| bins.iter().sum::<u64>();
        let hits = r.region_bins.iter().zip(&r.region_ideal_bins).map(|(a, i)| (sum(a), sum(i))).collect();
        let duration_s = scenario.duration_s as f64;
        let pairs: Vec<((u32, u32), f64, f64)> = run
            .region_traffic
            .iter()
            .filter(|((a, b), _)| a != b)
            .map(|(pair, t)| (*pair, t.sent_msgs as f64 / duration_s, t.sent_bytes as f64 / duration_s))
            .collect();
        let keys = f64::from(scenario.workload.keys.max(1));
        Some(RegionReport {
            hits,
            move_ms: region_move_ms(scenario, r),
            cross_msgs_per_key_s: pairs.iter().map(|p| p.1).sum::<f64>() / keys,
            cross_bytes_per_key_s: pairs.iter().map(|p| p.2).sum::<f64>() / keys,
            pairs,
        })
    }
}

/// The longest time (ms) from a demand move until each region whose share rose admits 90 % of its
/// ideal share over a second; infinite when one never does before the next move.
fn region_move_ms(scenario: &Scenario, r: &Recorder) -> Option<f64> {
    let demand = &scenario.workload.demand;
    let moves = demand.region_moves(scenario.duration_nanos());
    let bin_ms = BIN_NANOS as f64 / 1e6;
    let mut longest: Option<f64> = None;
    for (i, &at) in moves.iter().enumerate() {
        let from = at.div_ceil(BIN_NANOS) as usize;
        let until = moves.get(i + 1).map_or(r.admitted_bins.len(), |next| (next / BIN_NANOS) as usize);
        if until < from + BINS_PER_WINDOW {
            continue; // less than a second before the next move or the end: nothing to measure
        }
        for region in 0..r.region_bins.len() as u32 {
            let share = |t: u64| demand.region_share(region, t).unwrap_or(0.0);
            if share(at) <= share(at.saturating_sub(1)) {
                continue;
            }
            let (admitted, ideal) = (&r.region_bins[region as usize], &r.region_ideal_bins[region as usize]);
            let ms =
                bins_to_reach(admitted, ideal, from, until, 0.9).map_or(f64::INFINITY, |b| b as f64 * bin_ms);
            longest = Some(longest.map_or(ms, |l| l.max(ms)));
        }
    }
    longest
}

impl StrategyReport {
    /// Summarises a run of `scenario`.
    pub fn from_run(scenario: &Scenario, run: &RunOutput) -> StrategyReport {
        let r = &run.recorder;
        let limit_per_s = |key: usize| scenario.key_limit_per_s(key as u32);
        let key_windows = r.key_windows();
        let (worst_key, worst_key_at) = r.worst_key_window();
        let (worst, worst_at) = std::iter::once(r.windows())
            .chain(key_windows.iter().cloned())
            .map(|windows| worst_window(&windows))
            .fold((0.0, None), |a, b| if b.1.is_some() && (a.1.is_none() || b.0 > a.0) { b } else { a });
        let worst = if worst_key > worst { worst_key } else { worst };
        let partitions = partition_windows(scenario);
        let duration_s = scenario.duration_s as f64;
        let nodes = run.traffic.len().max(1) as f64;
        let msgs: Vec<f64> = run.traffic.iter().map(|t| t.sent_msgs as f64 / duration_s).collect();
        let bytes: f64 = run.traffic.iter().map(|t| t.sent_bytes as f64).sum();
        let requests = r.requests.max(1) as f64;
        StrategyReport {
            strategy: run.strategy.name().to_owned(),
            requests: r.requests,
            admitted: r.admitted(),
            ideal: r.ideal(),
            over_admission: over_admission(r.admitted(), r.ideal()),
            worst_window_over_admission: worst,
            worst_window_s: worst_at,
            worst_key_window_over_admission: worst_key,
            worst_key_window_at: worst_key_at,
            admitted_x_ideal: if r.ideal() == 0 { 1.0 } else { r.admitted() as f64 / r.ideal() as f64 },
            fairness: r.fairness(),
            peak_rate_x_limit: peak_rate(&key_windows, limit_per_s, |_| true).unwrap_or(0.0),
            partition_peak_rate_x_limit: peak_rate(&key_windows, limit_per_s, |w| partitions.contains(&w)),
            false_reject_rate: r.false_rejects as f64 / requests,
            false_admit_rate: r.false_admits as f64 / requests,
            excess_per_change_sync_intervals: excess_per_change(scenario, r.admitted(), r.ideal()),
            convergence_ms: run.convergence_nanos.iter().map(|n| *n as f64 / 1e6).collect(),
            unconverged: run.unconverged,
            msgs_per_node_s: msgs.iter().sum::<f64>() / nodes,
            msgs_per_node_s_max: msgs.iter().copied().fold(0.0, f64::max),
            bytes_per_node_s: bytes / nodes / duration_s,
            cluster_msgs_s: msgs.iter().sum::<f64>(),
            traffic_by_kind: run
                .traffic_by_kind
                .iter()
                .map(|(kind, (m, b))| {
                    ((*kind).to_owned(), *m as f64 / nodes / duration_s, *b as f64 / nodes / duration_s)
                })
                .collect(),
            lost: run.network.lost,
            cut: run.network.cut,
            events: run.events,
            digest: run.digest,
            admitted_bins: r.admitted_bins.clone(),
            ideal_bins: r.ideal_bins.clone(),
            regions: RegionReport::from_run(scenario, run),
        }
    }

    /// The longest convergence in ms; infinite when a heal never converged; `None` without heals.
    pub fn convergence_max_ms(&self) -> Option<f64> {
        if self.unconverged > 0 {
            return Some(f64::INFINITY);
        }
        self.convergence_ms.iter().copied().reduce(f64::max)
    }

    /// The value of `metric` (0 for a metric the scenario does not define, e.g. no partition).
    pub fn metric(&self, metric: Metric) -> f64 {
        match metric {
            Metric::OverAdmission => self.over_admission,
            Metric::WorstWindowOverAdmission => self.worst_window_over_admission,
            Metric::PeakRateXLimit => self.peak_rate_x_limit,
            Metric::PartitionPeakRateXLimit => self.partition_peak_rate_x_limit.unwrap_or(0.0),
            Metric::FalseRejectRate => self.false_reject_rate,
            Metric::ConvergenceMaxMs => self.convergence_max_ms().unwrap_or(0.0),
            Metric::ExcessPerChangeSyncIntervals => self.excess_per_change_sync_intervals,
            Metric::AdmittedXIdeal => self.admitted_x_ideal,
            Metric::Fairness => self.fairness.map_or(0.0, |f| f.0),
            Metric::BytesPerNodeS => self.bytes_per_node_s,
            Metric::MsgsPerNodeS => self.msgs_per_node_s,
            Metric::ClusterMsgsS => self.cluster_msgs_s,
            Metric::RegionMoveMs => self.regions.as_ref().and_then(|r| r.move_ms).unwrap_or(0.0),
            Metric::CrossRegionMsgsPerKeyS => self.regions.as_ref().map_or(0.0, |r| r.cross_msgs_per_key_s),
            Metric::CrossRegionBytesPerKeyS => self.regions.as_ref().map_or(0.0, |r| r.cross_bytes_per_key_s),
        }
    }
}

/// A scenario's results: every strategy's metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// Its description.
    pub description: String,
    /// The seed the run used.
    pub seed: u64,
    /// Every parameter, as TOML.
    pub parameters: String,
    /// The limit in hits per second.
    pub limit_per_s: f64,
    /// Virtual duration in seconds.
    pub duration_s: u64,
    /// Intervals (ms) with a partition or a crashed node, with a label, for the plot.
    pub fault_intervals_ms: Vec<(String, u64, u64)>,
    /// The expectations of the scenario file.
    pub expectations: Vec<Expectation>,
    /// One entry per strategy, in run order.
    pub strategies: Vec<StrategyReport>,
}

impl Report {
    /// A report of `runs` of `scenario` with `seed`.
    pub fn new(scenario: &Scenario, seed: u64, runs: &[RunOutput]) -> Report {
        Report {
            scenario: scenario.name.clone(),
            description: scenario.description.clone(),
            seed,
            parameters: scenario.to_toml(),
            limit_per_s: scenario.limit_per_s(),
            duration_s: scenario.duration_s,
            fault_intervals_ms: fault_intervals(scenario),
            expectations: scenario.expect.clone(),
            strategies: runs.iter().map(|run| StrategyReport::from_run(scenario, run)).collect(),
        }
    }

    /// The metrics of the strategy called `name`.
    pub fn strategy(&self, name: &str) -> Option<&StrategyReport> {
        self.strategies.iter().find(|s| s.strategy == name)
    }

    /// The command that reruns this report's scenario file with its seed and duration (assuming
    /// the file is `simulations/<name>.toml`).
    pub fn reproduce_command(&self) -> String {
        format!(
            "cargo run -p ratemesh-sim --release -- simulations/{}.toml --seed {} --duration-s {}",
            self.scenario, self.seed, self.duration_s
        )
    }

    /// `reproduce with: <command>`, for assertion messages.
    pub fn reproduce(&self) -> String {
        format!("reproduce with: {}", self.reproduce_command())
    }

    /// One digest over every strategy's event log.
    pub fn digest(&self) -> u64 {
        let bytes: Vec<u8> = self.strategies.iter().flat_map(|s| s.digest.to_le_bytes()).collect();
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }

    /// The expectations this report misses, one line each (strategies not run are skipped).
    pub fn violations(&self) -> Vec<String> {
        let mut violations = Vec::new();
        for e in &self.expectations {
            let Some(s) = self.strategy(&e.strategy) else { continue };
            let value = s.metric(e.metric);
            if let Some(max) = e.max
                && (value.is_nan() || value > max)
            {
                violations.push(format!("{}: {:?} = {value:.5} > {max}", e.strategy, e.metric));
            }
            if let Some(min) = e.min
                && (value.is_nan() || value < min)
            {
                violations.push(format!("{}: {:?} = {value:.5} < {min}", e.strategy, e.metric));
            }
        }
        violations
    }

    /// A compact table for the terminal.
    pub fn text_table(&self) -> String {
        let mut out = format!(
            "{:<16} {:>9} {:>9} {:>8} {:>8} {:>7} {:>8} {:>9} {:>13} {:>9} {:>10} {:>18}\n",
            "strategy",
            "over-adm",
            "worst-1s",
            "adm/ideal",
            "fairness",
            "peak/L",
            "part/L",
            "false-rej",
            "conv-max-ms",
            "msg/n/s",
            "B/n/s",
            "digest"
        );
        for s in &self.strategies {
            let _ = writeln!(
                out,
                "{:<16} {:>9} {:>9} {:>8.4} {:>8} {:>7.3} {:>8} {:>9} {:>13} {:>9.1} {:>10.0} {:>18}",
                s.strategy,
                percent(s.over_admission),
                percent(s.worst_window_over_admission),
                s.admitted_x_ideal,
                s.fairness.map_or("-".into(), |f| percent(f.0)),
                s.peak_rate_x_limit,
                s.partition_peak_rate_x_limit.map_or("-".into(), |p| format!("{p:.3}")),
                percent(s.false_reject_rate),
                convergence(s),
                s.msgs_per_node_s,
                s.bytes_per_node_s,
                format!("{:016x}", s.digest),
            );
        }
        out.push_str(&self.regions_text());
        out
    }

    /// One line per strategy with regions: admitted / ideal per region, the demand move's time,
    /// traffic between regions (empty without regions).
    pub fn regions_text(&self) -> String {
        let mut out = String::new();
        for (s, r) in self.strategies.iter().filter_map(|s| Some((s, s.regions.as_ref()?))) {
            let hits: Vec<String> = r.hits.iter().map(|(a, i)| format!("{a}/{i}")).collect();
            let _ = writeln!(
                out,
                "{:<16} regions admitted/ideal {} · move-to-90% {} · between regions {:.2} msgs {:.0} B per key per s",
                s.strategy,
                hits.join(" "),
                move_ms(r),
                r.cross_msgs_per_key_s,
                r.cross_bytes_per_key_s,
            );
        }
        out
    }

    /// The regions' table of the markdown file (empty without regions).
    fn regions_markdown(&self) -> String {
        if self.strategies.iter().all(|s| s.regions.is_none()) {
            return String::new();
        }
        let mut out = String::from(
            "\nRegions: admitted / ideal hits of the requests that arrived in each region; the time until a region \
             whose demand share rose admits 90 % of its ideal share over a second (longest over the moves); \
             messages and bytes sent between regions per key per second:\n\n\
             | strategy | admitted / ideal per region | move to 90 % (ms) | msgs/key/s between | bytes/key/s between |\n\
             |---|---|---:|---:|---:|\n",
        );
        for (s, r) in self.strategies.iter().filter_map(|s| Some((s, s.regions.as_ref()?))) {
            let hits: Vec<String> = r.hits.iter().map(|(a, i)| format!("{a} / {i}")).collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.3} | {:.1} |",
                s.strategy,
                hits.join(" · "),
                move_ms(r),
                r.cross_msgs_per_key_s,
                r.cross_bytes_per_key_s
            );
        }
        out.push_str("\nTraffic between regions, per second:\n\n| strategy | from → to | msgs/s | bytes/s |\n|---|---|---:|---:|\n");
        for (s, r) in self.strategies.iter().filter_map(|s| Some((s, s.regions.as_ref()?))) {
            for ((from, to), msgs, bytes) in &r.pairs {
                let _ = writeln!(out, "| {} | {from} → {to} | {msgs:.1} | {bytes:.0} |", s.strategy);
            }
        }
        out
    }

    /// The markdown results file: parameters, table, plot reference.
    pub fn markdown(&self) -> String {
        let mut out = format!("# Scenario `{}`\n\n{}\n\n", self.scenario, self.description);
        let _ = writeln!(
            out,
            "Seed {} · limit {} hits/s · {} s virtual.\n",
            self.seed, self.limit_per_s, self.duration_s
        );
        out.push_str(
            "| strategy | admitted | ideal | over-admission | worst 1-s window | fairness | peak rate / L | \
             partition peak / L | false rejects | convergence max (ms) | msgs/node/s | bytes/node/s |\n",
        );
        out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for s in &self.strategies {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {:.3} | {} | {} | {} | {:.1} | {:.0} |",
                s.strategy,
                s.admitted,
                s.ideal,
                percent(s.over_admission),
                percent(s.worst_window_over_admission),
                s.fairness.map_or("–".into(), |f| percent(f.0)),
                s.peak_rate_x_limit,
                s.partition_peak_rate_x_limit.map_or("–".into(), |p| format!("{p:.3}")),
                percent(s.false_reject_rate),
                convergence(s),
                s.msgs_per_node_s,
                s.bytes_per_node_s,
            );
        }
        out.push_str(
            "\nTraffic by message kind (a frame counts under its first section), per node per second:\n\n",
        );
        out.push_str("| strategy | kind | msgs/node/s | bytes/node/s |\n|---|---|---:|---:|\n");
        for s in &self.strategies {
            for (kind, msgs, bytes) in &s.traffic_by_kind {
                let _ = writeln!(out, "| {} | {kind} | {msgs:.1} | {bytes:.0} |", s.strategy);
            }
        }
        out.push_str(&self.regions_markdown());
        let _ = write!(
            out,
            "\n![admitted rate per 100 ms]({}.svg)\n\nReproduce: `{}`\n\n<details><summary>Parameters</summary>\n\n```toml\n{}```\n</details>\n",
            self.scenario,
            self.reproduce_command(),
            self.parameters
        );
        out
    }
}

/// All strategies × all scenarios, one table per metric.
pub fn summary_markdown(reports: &[Report]) -> String {
    let mut strategies: Vec<&str> = Vec::new();
    for s in reports.iter().flat_map(|r| &r.strategies) {
        if !strategies.contains(&s.strategy.as_str()) {
            strategies.push(&s.strategy);
        }
    }
    let mut out = String::from("# Simulation results: all strategies × all scenarios\n\n");
    out.push_str("Generated by `cargo run -p ratemesh-sim --release -- --all`. Each scenario's own file has the seed,\n");
    out.push_str("every parameter and a plot. Over-admission is against one ideal global limiter seeing every request.\n");
    out.push_str("Metric definitions: `simulations/README.md`. Scenarios where a metric does not apply are left out of\n");
    out.push_str(
        "its table. False rejects under overload mostly measure *which* requests passed, not how many. The\n",
    );
    out.push_str("baselines are always settled, so their convergence only measures ring agreement.\n\n");
    let tables: [(&str, Cell); 6] = [
        ("Over-admission over the run", |s| percent(s.over_admission)),
        ("Over-admission in the worst 1-second window", |s| percent(s.worst_window_over_admission)),
        ("Peak admitted rate in a 1-second window inside a partition, × L", |s| {
            s.partition_peak_rate_x_limit.map_or("–".into(), |p| format!("{p:.3}"))
        }),
        ("False rejects (fraction of requests)", |s| percent(s.false_reject_rate)),
        ("Longest convergence after a heal (ms)", convergence),
        ("Messages per node per second", |s| format!("{:.1}", s.msgs_per_node_s)),
    ];
    for (title, cell) in tables {
        let _ = writeln!(out, "## {title}\n\n| scenario | {} |", strategies.join(" | "));
        let _ = writeln!(out, "|---|{}", "---:|".repeat(strategies.len()));
        for r in reports {
            let cells: Vec<String> =
                strategies.iter().map(|name| r.strategy(name).map_or("".into(), cell)).collect();
            if cells.iter().all(|c| c == "–") {
                continue;
            }
            let _ = writeln!(out, "| [{}]({}.md) | {} |", r.scenario, r.scenario, cells.join(" | "));
        }
        out.push('\n');
    }
    out
}

/// Formats one cell of a summary table.
type Cell = fn(&StrategyReport) -> String;

fn percent(fraction: f64) -> String {
    format!("{:.3}%", fraction * 100.0)
}

fn move_ms(r: &RegionReport) -> String {
    match r.move_ms {
        None => "–".into(),
        Some(ms) if ms.is_infinite() => "never".into(),
        Some(ms) => format!("{ms:.0}"),
    }
}

fn convergence(s: &StrategyReport) -> String {
    match s.convergence_max_ms() {
        None => "–".into(),
        Some(ms) if ms.is_infinite() => {
            format!("never ({} of {})", s.unconverged, s.unconverged as usize + s.convergence_ms.len())
        }
        Some(ms) => format!("{ms:.1} ({})", s.convergence_ms.len()),
    }
}

/// Indices of the 1-second windows that lie entirely inside a partition or one-way cut.
/// `max(0, admitted − ideal)` per membership change, in sync intervals of the limit.
fn excess_per_change(scenario: &Scenario, admitted: u64, ideal: u64) -> f64 {
    let changes = scenario.membership_changes();
    if changes == 0 {
        return 0.0;
    }
    let interval_hits = scenario.limit_per_s() * scenario.sync_interval_ms as f64 / 1000.0;
    admitted.saturating_sub(ideal) as f64 / (changes as f64 * interval_hits)
}

fn partition_windows(scenario: &Scenario) -> Vec<usize> {
    let window_ms = BIN_NANOS * BINS_PER_WINDOW as u64 / 1_000_000;
    let mut windows = Vec::new();
    for fault in &scenario.faults {
        if let FaultConfig::Partition { start_ms, end_ms, .. }
        | FaultConfig::OneWay { start_ms, end_ms, .. }
        | FaultConfig::RegionPartition { start_ms, end_ms, .. } = fault
        {
            let first = start_ms.div_ceil(window_ms);
            let last = end_ms / window_ms;
            windows.extend((first..last).map(|w| w as usize));
        }
    }
    windows.sort_unstable();
    windows.dedup();
    windows
}

/// Intervals with a partition or a crashed node, for shading the plot.
fn fault_intervals(scenario: &Scenario) -> Vec<(String, u64, u64)> {
    let end = scenario.duration_s * 1000;
    let mut intervals = Vec::new();
    for fault in &scenario.faults {
        match fault {
            FaultConfig::Partition { start_ms, end_ms, .. } => {
                intervals.push(("partition".into(), *start_ms, *end_ms))
            }
            FaultConfig::OneWay { start_ms, end_ms, .. } => {
                intervals.push(("one-way cut".into(), *start_ms, *end_ms))
            }
            FaultConfig::RegionPartition { start_ms, end_ms, .. } => {
                intervals.push(("region partition".into(), *start_ms, *end_ms))
            }
            FaultConfig::RegionLoss { start_ms, end_ms, .. } => {
                intervals.push(("loss between regions".into(), *start_ms, *end_ms))
            }
            FaultConfig::Crash { at_ms, restart_after_ms, .. } => {
                let until = restart_after_ms.map_or(end, |after| at_ms + after);
                intervals.push(("node down".into(), *at_ms, until.min(end)));
            }
            _ => {}
        }
    }
    intervals
}
