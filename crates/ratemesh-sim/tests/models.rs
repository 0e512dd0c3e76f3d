//! The workload model, the scenario files and the outputs.

use std::path::Path;

use ratemesh_sim::scenario::{DemandConfig, Scenario};
use ratemesh_sim::workload::{Arrival, Workload};
use ratemesh_sim::{StrategyKind, run_scenario, svg};

/// Top-level lines may go before it; workload lines after it.
const BASE: &str = r#"
nodes = 4
duration_s = 20
sync_interval_ms = 50
strategies = ["static"]
limit = { limit = 1000, period_ms = 1000 }
[workload]
rate_x_limit = 2.0
keys = 50
hot_keys = 2
hot_share = 0.5
"#;

fn scenario(edit: impl FnOnce(&mut Scenario)) -> Scenario {
    let mut scenario = Scenario::from_toml(BASE, "base").expect("valid");
    edit(&mut scenario);
    scenario.validate().expect("still valid");
    scenario
}

fn with_workload(lines: &str) -> Scenario {
    Scenario::from_toml(&format!("{BASE}{lines}"), "base").expect("valid")
}

fn arrivals(scenario: &Scenario) -> Vec<Arrival> {
    let mut workload = Workload::new(scenario, 9);
    std::iter::from_fn(|| workload.next_arrival()).collect()
}

#[test]
fn arrivals_are_poisson_at_the_configured_rate() {
    let arrivals = arrivals(&scenario(|_| {}));
    // 2 × 1000/s for 20 s: 40 000 ± 200 (σ).
    assert!((arrivals.len() as f64 - 40_000.0).abs() < 1000.0, "{}", arrivals.len());
    assert!(arrivals.windows(2).all(|w| w[0].at_nanos <= w[1].at_nanos));
    let hot = arrivals.iter().filter(|a| a.key < 2).count() as f64 / arrivals.len() as f64;
    assert!((hot - 0.5).abs() < 0.02, "{hot}");
    let nodes: Vec<usize> = (0..4).map(|n| arrivals.iter().filter(|a| a.node == n).count()).collect();
    assert!(nodes.iter().all(|&c| (c as f64 - 10_000.0).abs() < 500.0), "{nodes:?}");
}

#[test]
fn changing_the_key_mix_does_not_move_arrival_times() {
    let times = |s: &Scenario| arrivals(s).iter().map(|a| a.at_nanos).collect::<Vec<_>>();
    let other = scenario(|s| {
        s.workload.keys = 500;
        s.workload.demand = DemandConfig::Skewed { node: 2, share: 0.9 };
    });
    assert_eq!(times(&scenario(|_| {})), times(&other));
}

#[test]
fn skewed_demand_puts_its_share_on_one_node() {
    let arrivals = arrivals(&scenario(|s| s.workload.demand = DemandConfig::Skewed { node: 3, share: 0.8 }));
    let on_3 = arrivals.iter().filter(|a| a.node == 3).count() as f64 / arrivals.len() as f64;
    assert!((on_3 - 0.8).abs() < 0.01, "{on_3}");
}

#[test]
fn steps_and_on_off_shape_the_rate() {
    let arrivals = arrivals(&with_workload(
        "steps = [{ at_ms = 10000, factor = 5.0 }]\non_off = { start_ms = 15000, on_ms = 1000, off_ms = 1000 }",
    ));
    let count = |from_ms: u64, to_ms: u64| {
        let range = from_ms * 1_000_000..to_ms * 1_000_000;
        arrivals.iter().filter(|a| range.contains(&a.at_nanos)).count() as f64
    };
    // 2000/s before the step, 10 000/s after; on from 15 s to 16 s, off to 17 s, on to 18 s, …
    assert!((count(5000, 10_000) - 10_000.0).abs() < 500.0);
    assert!((count(10_000, 15_000) - 50_000.0).abs() < 1200.0);
    assert!((count(15_000, 16_000) - 10_000.0).abs() < 500.0);
    assert_eq!(count(16_000, 17_000), 0.0);
    assert!((count(17_000, 18_000) - 10_000.0).abs() < 500.0);
    assert_eq!(count(18_000, 19_000), 0.0);
}

#[test]
fn every_scenario_file_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../simulations");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("simulations/ exists") {
        let path = entry.expect("readable").path();
        if path.extension().is_some_and(|e| e == "toml") {
            let scenario = Scenario::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(scenario.strategy_kinds().expect("known"), StrategyKind::ALL.to_vec());
            names.push(scenario.name);
        }
    }
    assert!(names.len() >= 10, "{names:?}");
}

#[test]
fn invalid_scenarios_are_errors() {
    for (bad, why) in [
        ("nodes = 0", "no nodes"),
        ("network = { loss = 1.5 }", "probability"),
        ("strategies = [\"redis\"]", "unknown strategy"),
        ("faults = [{ kind = \"crash\", at_ms = 1, node = 9 }]", "node out of range"),
        ("faults = [{ kind = \"partition\", start_ms = 5, end_ms = 5, groups = [] }]", "empty interval"),
        ("clock = { offset_ms_max = 200000 }", "offset beyond the clock base"),
        ("colour = \"blue\"", "unknown field"),
    ] {
        let text = format!("{bad}\n{BASE}");
        let text = if bad.starts_with("nodes") { text.replacen("nodes = 4\n", "", 1) } else { text };
        assert!(Scenario::from_toml(&text, "bad").is_err(), "{why}");
    }
}

#[test]
fn the_plot_and_tables_show_every_strategy() {
    let scenario = scenario(|s| {
        s.duration_s = 3;
        s.strategies = vec!["static".into(), "crdt".into()];
    });
    let report = run_scenario(scenario, Some(1)).expect("runs");
    let plot = svg::plot(&report);
    assert!(plot.starts_with("<svg") && plot.trim_end().ends_with("</svg>"));
    assert_eq!(plot.matches("<polyline").count(), 3, "two strategies and the ideal");
    for text in [
        report.text_table(),
        report.markdown(),
        ratemesh_sim::summary_markdown(std::slice::from_ref(&report)),
    ] {
        assert!(text.contains("static") && text.contains("crdt"), "{text}");
    }
}

#[test]
fn the_format_reference_in_the_readme_is_a_valid_scenario() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../simulations/README.md");
    let text = std::fs::read_to_string(readme).expect("simulations/README.md exists");
    let block =
        text.split("```toml\n").nth(1).and_then(|rest| rest.split("```").next()).expect("a toml block");
    let scenario = Scenario::from_toml(block, "readme").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(scenario.faults.len(), 6);
}
