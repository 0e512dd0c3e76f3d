//! The accuracy bounds of ratemesh, measured by the simulator: every scenario in `simulations/`
//! runs the real node (exact and approximate mode) on the scenario's own seed and duration, and
//! must meet every `[[expect]]` bound written in the scenario file. Each bound is the issue's
//! acceptance bound for that scenario; where one is missed, change the protocol, not the bound.
//!
//! A 60-second scenario takes a few seconds in a release build and minutes in a debug build, so
//! these tests are ignored by `cargo test --workspace` and run by `.ci/run` with
//! `cargo test -p ratemesh-sim --release --test acceptance -- --ignored`.

use std::path::PathBuf;

use ratemesh_sim::{Scenario, run_scenario};

/// The strategies the bounds are about (the baselines are measured by the CLI, not bounded).
const RATEMESH: [&str; 2] = ["ratemesh-exact", "ratemesh-approx"];

fn scenario_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../simulations").join(format!("{name}.toml"))
}

/// Runs `name` for the ratemesh strategies and asserts every bound of its file.
fn check(name: &str) {
    let mut scenario = Scenario::load(&scenario_path(name)).expect("scenario file loads");
    assert!(
        scenario.expect.iter().any(|e| RATEMESH.contains(&e.strategy.as_str())),
        "{name}: a scenario without bounds for ratemesh proves nothing"
    );
    scenario.strategies = RATEMESH.iter().map(|s| (*s).to_owned()).collect();
    let report = run_scenario(scenario, None).expect("scenario runs");
    let violations = report.violations();
    assert!(
        violations.is_empty(),
        "{name}:\n{}\n{}\n{}",
        violations.join("\n"),
        report.text_table(),
        report.reproduce()
    );
}

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            #[ignore = "slow in debug builds: .ci/run runs it in release"]
            fn $name() {
                check(stringify!($name));
            }
        )*

        /// Every scenario file has a test above (the region scenarios, `regions_*.toml`, have theirs
        /// in `tests/regions.rs`).
        #[test]
        fn every_scenario_file_is_checked() {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../simulations");
            let mut files: Vec<String> = std::fs::read_dir(&dir)
                .expect("simulations/ exists")
                .filter_map(|entry| entry.ok()?.path().file_stem()?.to_str().map(str::to_owned))
                .filter(|stem| dir.join(format!("{stem}.toml")).exists() && !stem.starts_with("regions_"))
                .collect();
            files.sort();
            let mut tested = vec![$(stringify!($name).to_owned()),*];
            tested.sort();
            assert_eq!(files, tested);
        }
    };
}

scenarios!(
    steady,
    below_uniform,
    below_skewed,
    hot_node,
    demand_step,
    lossy,
    clock_skew,
    owner_crash,
    churn,
    partition,
    one_way,
    on_off,
    loopback_steady,
    below_many_keys,
    lease_to_overload,
);
