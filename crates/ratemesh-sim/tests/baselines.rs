//! Facts about the baselines: each shows the failure mode the field knows it for. These are not
//! goals; they check that the simulator reproduces what the baselines' designs imply.

use ratemesh_sim::{Scenario, StrategyReport, run_scenario};

/// 10 nodes, token bucket 1000/s with burst 100, sync 50 ms, one hot key; `extra` adds the
/// workload and faults.
fn run(strategy: &str, extra: &str) -> StrategyReport {
    let text = format!(
        r#"
nodes = 10
duration_s = 10
sync_interval_ms = 50
strategies = ["{strategy}"]
limit = {{ limit = 1000, period_ms = 1000, burst = 100 }}
membership = {{ detection_delay_ms = 500, join_delay_ms = 200 }}
{extra}
"#
    );
    let scenario = Scenario::from_toml(&text, strategy).expect("valid scenario");
    let report = run_scenario(scenario, Some(1)).expect("the run completes");
    report.strategies.into_iter().next().expect("one strategy ran")
}

const STEADY_2X: &str = r#"workload = { rate_x_limit = 2.0 }"#;

const PARTITION_5_5_AT_4X: &str = r#"
workload = { rate_x_limit = 4.0 }
[[faults]]
kind = "partition"
start_ms = 2000
end_ms = 9000
groups = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
"#;

const BELOW_SKEWED: &str =
    r#"workload = { rate_x_limit = 0.9, demand = { kind = "skewed", node = 0, share = 0.8 } }"#;

#[test]
fn gubernator_over_admits_in_steady_state_with_many_nodes() {
    // Every local copy refills at the full rate between broadcasts, so each of the 9 non-owners
    // admits nearly all of its own demand.
    let s = run("gubernator", STEADY_2X);
    assert!(s.over_admission > 0.5, "{}", s.over_admission);
    assert!(s.peak_rate_x_limit > 1.7, "{}", s.peak_rate_x_limit);
}

#[test]
fn crdt_is_close_in_steady_state() {
    let s = run("crdt", STEADY_2X);
    assert!(s.over_admission.abs() < 0.05, "{}", s.over_admission);
}

#[test]
fn crdt_admits_the_whole_limit_on_each_side_of_a_partition() {
    let s = run("crdt", PARTITION_5_5_AT_4X);
    let peak = s.partition_peak_rate_x_limit.expect("the scenario has a partition");
    assert!(peak > 1.8, "{peak}");
}

#[test]
fn static_split_admits_the_whole_limit_on_each_side_once_the_partition_is_detected() {
    let s = run("static", PARTITION_5_5_AT_4X);
    let peak = s.partition_peak_rate_x_limit.expect("the scenario has a partition");
    assert!(peak > 1.8, "{peak}");
}

#[test]
fn static_split_refuses_skewed_demand_below_the_limit() {
    // Node 0 gets 0.72 × L but may admit only L / 10.
    let s = run("static", BELOW_SKEWED);
    assert!(s.false_reject_rate > 0.3, "{}", s.false_reject_rate);
}

#[test]
fn crdt_and_gubernator_admit_demand_below_the_limit() {
    for strategy in ["crdt", "gubernator"] {
        let s = run(strategy, BELOW_SKEWED);
        assert!(s.false_reject_rate < 0.01, "{strategy}: {}", s.false_reject_rate);
    }
}
