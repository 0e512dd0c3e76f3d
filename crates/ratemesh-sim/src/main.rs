//! The simulator's command line.
//!
//! ```text
//! ratemesh-sim <scenario.toml> [--seed N] [--strategies a,b] [--out DIR] [--log FILE] [--duration-s S]
//! ratemesh-sim --all [DIR] [--seed N] [--strategies a,b] [--out DIR] [--duration-s S]
//! ratemesh-sim --sweep <sweep.toml> [--point ID [--seed N]] [--jobs J] [--out FILE]
//! ```
//!
//! `--sweep` runs a grid (see `ratemesh_sim::sweep`) and writes one markdown table (default
//! `simulations/results/sweeps/<name>.md`); `--point` runs one point (every seed, or `--seed`)
//! and prints its full tables instead.
//!
//! Prints the seed and every parameter first, then a table per scenario; writes
//! `<out>/<scenario>.md` and `<out>/<scenario>.svg` (default `<out>`: `results/` beside the
//! scenario file), and with `--all` also `<out>/summary.md`. Exits non-zero when a run fails or
//! misses an expectation of its scenario file, after printing how to reproduce it.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result, bail};
use ratemesh_sim::engine::RunOutput;
use ratemesh_sim::sweep::{SweepFile, params_text};
use ratemesh_sim::{Report, Scenario, StrategyKind, run_strategy, summary_markdown, svg};

/// The command to reproduce the run in progress, printed if it panics.
static REPRODUCE: Mutex<String> = Mutex::new(String::new());

#[derive(Debug, Default)]
struct Args {
    scenarios: Vec<PathBuf>,
    all: Option<PathBuf>,
    seed: Option<u64>,
    strategies: Option<Vec<String>>,
    out: Option<PathBuf>,
    log: Option<PathBuf>,
    duration_s: Option<u64>,
    sweep: Option<PathBuf>,
    point: Option<String>,
    jobs: usize,
}

fn main() {
    install_panic_hook();
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::exit(2);
        }
    }
}

/// Runs what the arguments ask; `Ok(false)` when an expectation was missed.
fn run() -> Result<bool> {
    let args = parse_args(std::env::args().skip(1))?;
    if let Some(sweep) = &args.sweep {
        return run_sweep_file(sweep, &args);
    }
    if let Some(dir) = &args.all {
        return run_all(dir, &args);
    }
    let mut ok = true;
    for path in &args.scenarios {
        let (report, passed) = run_file(path, &args)?;
        ok &= passed;
        write_results(&report, &out_dir(path, &args))?;
    }
    Ok(ok)
}

fn run_sweep_file(path: &Path, args: &Args) -> Result<bool> {
    let sweep = SweepFile::load(path)?;
    if let Some(id) = &args.point {
        let point =
            sweep.points()?.into_iter().find(|p| &p.id == id).with_context(|| format!("no point {id}"))?;
        println!(
            "=== sweep {} point {id}: {}\n{}",
            sweep.name,
            params_text(&point.params),
            point.scenario.to_toml()
        );
        let seeds: Vec<u64> =
            args.seed.map_or_else(|| (1..=sweep.block_seeds(point.block)).collect(), |s| vec![s]);
        for seed in seeds {
            let runs = run_all_strategies(&point.scenario, seed, None)?;
            println!("seed {seed} at overload:\n{}", Report::new(&point.scenario, seed, &runs).text_table());
            if let Some(below) = sweep.below(&point) {
                let runs = run_all_strategies(&below, seed, None)?;
                println!("seed {seed} below the limit:\n{}", Report::new(&below, seed, &runs).text_table());
            }
        }
        let result = sweep.run_point(&point, args.seed)?;
        result.violations.iter().for_each(|v| println!("BOUND MISSED: {v}"));
        return Ok(result.violations.is_empty());
    }
    let started = std::time::Instant::now();
    let total = sweep.points()?.len();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let progress = |r: &ratemesh_sim::sweep::PointResult| {
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let missed =
            if r.violations.is_empty() { String::new() } else { format!(" MISSED {}", r.violations.len()) };
        println!(
            "[{n}/{total} {:.0}s] {} {}{missed}",
            started.elapsed().as_secs_f64(),
            r.point.id,
            params_text(&r.point.params)
        );
    };
    let results = ratemesh_sim::sweep::run_sweep(&sweep, None, args.jobs, &progress)?;
    let elapsed = started.elapsed().as_secs_f64();
    let out = args.out.clone().unwrap_or_else(|| ratemesh_sim::sweep::results_path(path, &sweep.name));
    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    fs::write(&out, ratemesh_sim::sweep::markdown(&sweep, path, &results, elapsed))
        .with_context(|| format!("cannot write {}", out.display()))?;
    let verdict = ratemesh_sim::sweep::verdict(&sweep, &results);
    verdict.known.iter().for_each(|v| println!("known miss: {v}"));
    verdict.unexpected.iter().for_each(|v| println!("BOUND MISSED: {v}"));
    verdict.now_holding.iter().for_each(|v| println!("KNOWN MISS HOLDS NOW: {v}"));
    println!("wrote {} ({} points, {elapsed:.0} s)", out.display(), results.len());
    Ok(verdict.passes())
}

fn run_all(dir: &Path, args: &Args) -> Result<bool> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    let out = args.out.clone().unwrap_or_else(|| dir.join("results"));
    let mut reports = Vec::new();
    let mut ok = true;
    for path in &files {
        let (report, passed) = run_file(path, args)?;
        ok &= passed;
        write_results(&report, &out)?;
        reports.push(report);
    }
    let summary = out.join("summary.md");
    fs::write(&summary, summary_markdown(&reports))
        .with_context(|| format!("cannot write {}", summary.display()))?;
    println!("wrote {}", summary.display());
    Ok(ok)
}

/// Runs one scenario file; the bool is whether it met its expectations.
fn run_file(path: &Path, args: &Args) -> Result<(Report, bool)> {
    let mut scenario = Scenario::load(path)?;
    if let Some(strategies) = &args.strategies {
        scenario.strategies.clone_from(strategies);
    }
    if let Some(duration_s) = args.duration_s {
        scenario.duration_s = duration_s;
    }
    scenario.validate()?;
    let seed = scenario.effective_seed(args.seed);
    let reproduce =
        format!("reproduce with: cargo run -p ratemesh-sim --release -- {} --seed {seed}", path.display());
    if let Ok(mut slot) = REPRODUCE.lock() {
        slot.clone_from(&reproduce);
    }
    println!("=== scenario {} ({})\nseed = {seed}\n{}", scenario.name, path.display(), scenario.to_toml());
    let runs =
        run_all_strategies(&scenario, seed, args.log.as_deref()).inspect_err(|_| eprintln!("{reproduce}"))?;
    let report = Report::new(&scenario, seed, &runs);
    println!("{}", report.text_table());
    let violations = report.violations();
    for violation in &violations {
        println!("EXPECTATION MISSED: {violation}");
    }
    if !violations.is_empty() {
        println!("{reproduce}");
    }
    Ok((report, violations.is_empty()))
}

fn run_all_strategies(scenario: &Scenario, seed: u64, log: Option<&Path>) -> Result<Vec<RunOutput>> {
    let mut log = match log {
        Some(path) => Some(std::io::BufWriter::new(
            fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => None,
    };
    let mut runs = Vec::new();
    for strategy in scenario.strategy_kinds()? {
        let output = match log.as_mut() {
            Some(file) => {
                let mut failed = None;
                let mut sink = |line: &str| {
                    if let Err(e) = writeln!(file, "{} {line}", strategy.name()) {
                        failed.get_or_insert(e);
                    }
                };
                let output = run_strategy(scenario, strategy, seed, Some(&mut sink))?;
                if let Some(e) = failed {
                    bail!("cannot write the event log: {e}");
                }
                output
            }
            None => run_strategy(scenario, strategy, seed, None)?,
        };
        runs.push(output);
    }
    if let Some(mut file) = log {
        file.flush().context("cannot write the event log")?;
    }
    Ok(runs)
}

fn write_results(report: &Report, dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let md = dir.join(format!("{}.md", report.scenario));
    let plot = dir.join(format!("{}.svg", report.scenario));
    fs::write(&md, report.markdown()).with_context(|| format!("cannot write {}", md.display()))?;
    fs::write(&plot, svg::plot(report)).with_context(|| format!("cannot write {}", plot.display()))?;
    println!("wrote {} and {}\n", md.display(), plot.display());
    Ok(())
}

fn out_dir(scenario: &Path, args: &Args) -> PathBuf {
    let beside = scenario.parent().unwrap_or(Path::new(".")).join("results");
    args.out.clone().unwrap_or(beside)
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args> {
    let mut parsed = Args::default();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--seed" => parsed.seed = Some(value("--seed")?.parse().context("--seed takes an integer")?),
            "--strategies" => {
                let list = value("--strategies")?;
                for name in list.split(',') {
                    StrategyKind::from_name(name)?;
                }
                parsed.strategies = Some(list.split(',').map(str::to_owned).collect());
            }
            "--out" => parsed.out = Some(value("--out")?.into()),
            "--log" => parsed.log = Some(value("--log")?.into()),
            "--duration-s" => {
                parsed.duration_s =
                    Some(value("--duration-s")?.parse().context("--duration-s takes an integer")?);
            }
            "--all" => parsed.all = Some(PathBuf::from("simulations")),
            "--sweep" => parsed.sweep = Some(value("--sweep")?.into()),
            "--point" => parsed.point = Some(value("--point")?),
            "--jobs" => parsed.jobs = value("--jobs")?.parse().context("--jobs takes an integer")?,
            "-h" | "--help" => bail!("{}", usage()),
            other if other.starts_with("--") => bail!("unknown option {other}\n{}", usage()),
            path if parsed.all.is_some() => parsed.all = Some(path.into()),
            path => parsed.scenarios.push(path.into()),
        }
    }
    if parsed.all.is_none() && parsed.scenarios.is_empty() && parsed.sweep.is_none() {
        bail!("{}", usage());
    }
    Ok(parsed)
}

fn usage() -> &'static str {
    "usage: ratemesh-sim <scenario.toml>... [--seed N] [--strategies a,b] [--out DIR] [--log FILE] [--duration-s S]\n       \
     ratemesh-sim --all [DIR] [--seed N] [--strategies a,b] [--out DIR] [--duration-s S]\n       \
     ratemesh-sim --sweep <sweep.toml> [--point ID [--seed N]] [--jobs J] [--out FILE]"
}

fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        if let Ok(reproduce) = REPRODUCE.lock() {
            eprintln!("{reproduce}");
        }
    }));
}
