//! The simulator's scenario `simulations/loopback_steady.toml`, replayed on real nodes: the same
//! file, the same arrival generator (`ratemesh_sim::workload::Workload`, same seed), the same
//! ideal limiter (`ratemesh_sim::oracle::Oracle`) and the same metric and bound (its `[[expect]]`
//! lines), so the real run and the simulated run are directly comparable. Both are printed.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ratemesh::{NamedPolicy, Node};
use ratemesh_core::{Mode, Policy};
use ratemesh_sim::metrics::over_admission;
use ratemesh_sim::oracle::Oracle;
use ratemesh_sim::scenario::Metric;
use ratemesh_sim::workload::{Arrival, Workload};
use ratemesh_sim::{Scenario, run_scenario};
use support::*;
use tokio::task::JoinSet;

fn scenario() -> Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../simulations/loopback_steady.toml");
    Scenario::load(&path).unwrap()
}

/// One replayed arrival: when it was actually checked (since the replay started), and whether
/// the cluster admitted it.
struct Outcome {
    arrival: Arrival,
    at_nanos: u64,
    allowed: bool,
}

/// Replays the scenario's arrivals in real time: arrival `i` goes to node `node % len` at its
/// arrival time, as its own task (a check that waits for the owner does not delay the next).
async fn replay(nodes: &[Node], policy: &NamedPolicy, arrivals: &[Arrival]) -> Vec<Outcome> {
    let started = tokio::time::Instant::now();
    let mut checks = JoinSet::new();
    for &arrival in arrivals {
        tokio::time::sleep_until(started + Duration::from_nanos(arrival.at_nanos)).await;
        let node = nodes[arrival.node as usize % nodes.len()].clone();
        let policy = policy.clone();
        checks.spawn(async move {
            let at_nanos = started.elapsed().as_nanos() as u64;
            let key = format!("key-{}", arrival.key);
            let allowed = node.check(&policy, key.as_bytes(), arrival.cost).await.unwrap().allowed;
            Outcome { arrival, at_nanos, allowed }
        });
    }
    let mut outcomes = Vec::with_capacity(arrivals.len());
    while let Some(outcome) = checks.join_next().await {
        outcomes.push(outcome.unwrap());
    }
    outcomes
}

/// Admitted hits, and what the ideal limiter admits given the real check times.
fn admitted_and_ideal(scenario: &Scenario, outcomes: &mut [Outcome]) -> (u64, u64) {
    outcomes.sort_by_key(|o| o.at_nanos);
    let policy_of = |key: u32| scenario.policy_of_key(key);
    let mut oracle = Oracle::new(scenario.limits().unwrap(), scenario.workload.keys, policy_of);
    let (mut admitted, mut ideal) = (0, 0);
    for outcome in outcomes.iter() {
        let cost = outcome.arrival.cost;
        admitted += if outcome.allowed { cost } else { 0 };
        ideal += if oracle.admit(outcome.arrival.key, cost, outcome.at_nanos) { cost } else { 0 };
    }
    (admitted, ideal)
}

fn bound(scenario: &Scenario, strategy: &str) -> f64 {
    let expectation =
        scenario.expect.iter().find(|e| e.strategy == strategy && e.metric == Metric::OverAdmission);
    expectation.unwrap().max.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loopback_steady_scenario_holds_its_bounds_on_real_nodes_as_in_the_simulator() {
    let mut scenario = scenario();
    scenario.strategies = vec!["ratemesh-approx".to_owned(), "ratemesh-exact".to_owned()];
    let simulated = run_scenario(scenario.clone(), None).unwrap();
    let seed = scenario.effective_seed(None);
    let arrivals: Vec<Arrival> = {
        let mut workload = Workload::new(&scenario, seed);
        std::iter::from_fn(|| workload.next_arrival()).collect()
    };
    let nodes = start_cluster(u64::from(scenario.nodes)).await;
    let handles: Vec<Node> = nodes.iter().map(|n| n.node.clone()).collect();
    for (strategy, mode) in [("ratemesh-approx", Mode::Approximate), ("ratemesh-exact", Mode::Exact)] {
        let policy = Policy::new(scenario.limit().unwrap(), mode);
        let policy = NamedPolicy::new(Arc::from(strategy), policy);
        let mut outcomes = replay(&handles, &policy, &arrivals).await;
        let (admitted, ideal) = admitted_and_ideal(&scenario, &mut outcomes);
        let real = over_admission(admitted, ideal);
        let sim = simulated.strategy(strategy).unwrap().over_admission;
        let max = bound(&scenario, strategy);
        eprintln!(
            "{strategy}: {} arrivals; real: admitted {admitted}, ideal {ideal}, over-admission {:+.3}%; \
             simulated {:+.3}%; bound {:.1}%",
            arrivals.len(),
            real * 100.0,
            sim * 100.0,
            max * 100.0
        );
        // The oracle sees each check at the time its task started; the owner decides it a moment
        // later, when a token may have refilled: allow one hit per key of that jitter.
        let jitter = f64::from(scenario.workload.keys) / ideal as f64;
        assert!(real <= max + jitter, "{strategy}: real over-admission {real} above the bound {max}");
        assert!(sim <= max, "{strategy}: simulated over-admission {sim} above {max}");
        // Under-admission would also be a failure to limit well: within 10 % of the ideal.
        assert!(real >= -0.10, "{strategy}: admitted far less than the ideal: {real}");
    }
    for node in nodes {
        node.shutdown().await;
    }
}
