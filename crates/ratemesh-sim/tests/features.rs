//! Scenario features: mixed policies, node settings, zones, crash churn, dead-member forgetting,
//! `min` bounds, traffic by kind, fairness, and sweep expansion.

use ratemesh_sim::network::Network;
use ratemesh_sim::scenario::{Metric, Scenario};
use ratemesh_sim::sweep::{SweepFile, parse_limit};
use ratemesh_sim::{StrategyKind, run_strategies};

const BASE: &str = r#"
nodes = 3
duration_s = 4
sync_interval_ms = 50
seed = 7
[workload]
rate_x_limit = 2.0
keys = 6
per_key = true
"#;

fn scenario(extra: &str) -> Scenario {
    Scenario::from_toml(&format!("{BASE}\n{extra}"), "features").expect("scenario parses")
}

const TWO_POLICIES: &str = r#"
[[policies]]
limit = 10
period_ms = 1000
[[policies]]
limit = 100
period_ms = 1000
mode = "exact"
"#;

#[test]
fn keys_alternate_over_policies_and_the_oracle_follows_each_limit() {
    let s = scenario(TWO_POLICIES);
    assert_eq!(s.policy_of_key(0), 0);
    assert_eq!(s.policy_of_key(3), 1);
    assert_eq!(s.key_limit_per_s(1), 100.0);
    assert!(s.policy_mode_exact(1) && !s.policy_mode_exact(0));
    let report = run_strategies(&s, 7, &[StrategyKind::Static]).expect("runs");
    // Every key at 2 × its own limit for 4 s: the ideal admits about 4 s × (3 × 10 + 3 × 100) plus
    // the full buckets at the start.
    let ideal = report.strategies[0].ideal as f64;
    let expected = 4.0 * 330.0 + 330.0;
    assert!((ideal - expected).abs() / expected < 0.1, "ideal {ideal} vs {expected}");
}

#[test]
fn limit_and_policies_are_exclusive() {
    let both = format!("{BASE}\n[limit]\nlimit = 1\nperiod_ms = 1000\n{TWO_POLICIES}");
    assert!(Scenario::from_toml(&both, "x").is_err());
    assert!(Scenario::from_toml(BASE, "x").is_err());
}

#[test]
fn node_settings_reach_the_core_and_bad_ones_are_refused() {
    let slow = scenario(&format!("{TWO_POLICIES}\n[node]\nforward_timeout_ms = 5\nreplicate = false"));
    let fast = scenario(TWO_POLICIES);
    let a = run_strategies(&slow, 7, &[StrategyKind::Ratemesh]).expect("runs");
    let b = run_strategies(&fast, 7, &[StrategyKind::Ratemesh]).expect("runs");
    assert_ne!(a.digest(), b.digest(), "replicate = false changes what is sent");
    let bad = format!("{BASE}\n{TWO_POLICIES}\n[node]\nfallback = \"maybe\"");
    assert!(Scenario::from_toml(&bad, "x").is_err());
    let unknown = format!("{BASE}\n{TWO_POLICIES}\n[node]\nforward_timeout = 5");
    assert!(Scenario::from_toml(&unknown, "x").is_err());
}

#[test]
fn zones_put_the_between_delay_on_cross_zone_links() {
    let s = scenario(&format!(
        "{TWO_POLICIES}\n[network.delay]\nkind = \"uniform\"\nmin_ms = 1.0\nmax_ms = 1.0\n\
         [network.zones]\ncount = 2\nbetween = {{ kind = \"uniform\", min_ms = 40.0, max_ms = 40.0 }}"
    ));
    let mut network = Network::new(&s.network, 3, 1);
    let inside: Vec<u64> = network.send(0, 2, 10).deliveries().collect();
    let between: Vec<u64> = network.send(0, 1, 10).deliveries().collect();
    assert_eq!(inside, vec![1_000_000]);
    assert_eq!(between, vec![40_000_000]);
}

#[test]
fn crash_churn_counts_as_membership_changes_and_runs() {
    let s = scenario(&format!(
        "{TWO_POLICIES}\n[[faults]]\nkind = \"crash_churn\"\nstart_ms = 1000\nend_ms = 3000\nevery_ms = 1000\ndown_ms = 500"
    ));
    assert_eq!(s.membership_changes(), 4);
    let report = run_strategies(&s, 7, &[StrategyKind::RatemeshApprox]).expect("runs");
    assert!(report.strategies[0].admitted > 0);
}

#[test]
fn min_bounds_are_checked() {
    let s = scenario(&format!(
        "{TWO_POLICIES}\n[[expect]]\nstrategy = \"static\"\nmetric = \"admitted_x_ideal\"\nmin = 1.5"
    ));
    let report = run_strategies(&s, 7, &[StrategyKind::Static]).expect("runs");
    let violations = report.violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].contains("< 1.5"));
    let none = format!("{BASE}\n{TWO_POLICIES}\n[[expect]]\nstrategy = \"static\"\nmetric = \"fairness\"");
    assert!(Scenario::from_toml(&none, "x").is_err(), "a bound needs min or max");
}

#[test]
fn traffic_is_broken_down_by_kind_and_fairness_is_measured() {
    let s = scenario(TWO_POLICIES);
    let report =
        run_strategies(&s, 7, &[StrategyKind::RatemeshExact, StrategyKind::Gubernator]).expect("runs");
    for r in &report.strategies {
        let by_kind: f64 = r.traffic_by_kind.iter().map(|(_, _, bytes)| bytes).sum();
        assert!((by_kind - r.bytes_per_node_s).abs() < 1e-6, "{}: kinds sum to the total", r.strategy);
        assert!(r.traffic_by_kind.iter().all(|(kind, _, _)| kind != "malformed"));
        assert!(r.fairness.is_some());
        assert!(r.metric(Metric::Fairness) >= 0.0);
    }
    let exact = &report.strategies[0];
    assert!(
        exact.traffic_by_kind.iter().any(|(kind, _, _)| kind == "forward"),
        "{:?}",
        exact.traffic_by_kind
    );
    let gubernator = &report.strategies[1];
    assert!(gubernator.traffic_by_kind.iter().any(|(kind, _, _)| kind == "hits"));
}

#[test]
fn dead_members_are_forgotten_after_the_delay() {
    let s = scenario(&format!(
        "{TWO_POLICIES}\n[membership]\ndetection_delay_ms = 100\ndead_forget_ms = 200\n\
         [[faults]]\nkind = \"crash\"\nat_ms = 1000\nnode = 2"
    ));
    let forgetting = run_strategies(&s, 7, &[StrategyKind::Static]).expect("runs");
    let mut keeping = s.clone();
    keeping.membership.dead_forget_ms = None;
    let kept = run_strategies(&keeping, 7, &[StrategyKind::Static]).expect("runs");
    // The static split divides by the live members either way; the views differ, so the logs do.
    assert_ne!(forgetting.digest(), kept.digest());
}

#[test]
fn a_sweep_expands_its_blocks_into_the_product_of_their_axes() {
    let dir = std::env::temp_dir().join(format!("ratemesh-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("s.toml");
    let text = format!(
        "seeds = 5\n[base]\n{}\n[base.limit]\nlimit = 10\nperiod_ms = 1000\n\
         [[grid]]\nlabel = \"a\"\nnodes = [3, 5]\nlimits = [\"1/s\", [\"5/min\", \"100/day\"]]\nfaults = [\"none\", \"partition\"]\n\
         [[grid]]\nlabel = \"b\"\nnet = [\"zones:3:1:80\"]\nsync_ms = [20]",
        BASE.replace("seed = 7\n", "").replace("[workload]", "[base.workload]")
    );
    std::fs::write(&path, text).expect("write");
    let sweep = SweepFile::load(&path).expect("sweep loads");
    let points = sweep.points().expect("points");
    assert_eq!(points.len(), 2 * 2 * 2 + 1);
    let mixed = &points[2].scenario;
    assert_eq!(mixed.policies.len(), 2);
    assert_eq!(mixed.policies[1].period_ms, 86_400_000);
    assert_eq!(points[1].scenario.faults.len(), 1);
    let zoned = &points[8].scenario;
    assert_eq!(zoned.network.zones.as_ref().map(|z| z.count), Some(3));
    assert_eq!(zoned.sync_interval_ms, 20);
    assert!(parse_limit("3/week", "token_bucket").is_err());
    std::fs::remove_dir_all(&dir).ok();
}
