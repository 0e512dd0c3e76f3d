//! The same scenario and seed give the same run, bit for bit; another seed gives another run.

use ratemesh_sim::{Report, Scenario, run_scenario};

/// A short scenario with every source of randomness and every kind of fault, all strategies.
const EVERYTHING: &str = r#"
nodes = 5
duration_s = 3
sync_interval_ms = 50

[limit]
limit = 200
period_ms = 1000
burst = 20

[network]
loss = 0.05
duplicate = 0.05
delay = { kind = "lognormal", median_ms = 3.0, sigma = 0.8, max_ms = 40.0 }

[clock]
offset_ms_max = 1000
drift_ppm_max = 500

[membership]
detection_delay_ms = 300
join_delay_ms = 100

[workload]
rate_x_limit = 2.0
keys = 30
hot_keys = 2
hot_share = 0.8
demand = { kind = "skewed", node = 1, share = 0.5 }
steps = [{ at_ms = 2000, factor = 3.0 }]

[[faults]]
kind = "crash"
at_ms = 500
node = "hot_owner"
restart_after_ms = 700

[[faults]]
kind = "partition"
start_ms = 1500
end_ms = 2200
groups = [[0, 1], [2, 3, 4]]

[[faults]]
kind = "one_way"
start_ms = 2500
end_ms = 2900
from = [3]
to = [0, 1]

[[faults]]
kind = "leave"
at_ms = 3000
node = "random"
rejoin_after_ms = 400
"#;

fn scenario() -> Scenario {
    Scenario::from_toml(EVERYTHING, "everything").expect("valid scenario")
}

fn run(seed: u64) -> Report {
    run_scenario(scenario(), Some(seed)).expect("the run completes")
}

#[test]
fn the_run_is_a_function_of_the_seed_bit_for_bit() {
    let (first, again) = (run(7), run(7));
    let digests =
        |r: &Report| r.strategies.iter().map(|s| (s.strategy.clone(), s.digest)).collect::<Vec<_>>();
    assert_eq!(digests(&first), digests(&again));
    assert_eq!(first, again, "every metric is equal too");
    assert!(first.strategies.iter().all(|s| s.requests > 500 && s.events > s.requests));
    let other = run(8);
    for (a, b) in first.strategies.iter().zip(&other.strategies) {
        assert_ne!(a.digest, b.digest, "another seed, another {} run", a.strategy);
    }
    assert_ne!(first.digest(), other.digest());
}

#[test]
fn the_seed_defaults_to_the_file_then_the_name() {
    let mut scenario = scenario();
    assert_eq!(scenario.effective_seed(Some(3)), 3);
    let by_name = scenario.effective_seed(None);
    assert_eq!(by_name, ratemesh_sim::rng::seed_from_name("everything"));
    scenario.seed = Some(11);
    assert_eq!(scenario.effective_seed(None), 11);
    assert_eq!(scenario.effective_seed(Some(3)), 3);
}
