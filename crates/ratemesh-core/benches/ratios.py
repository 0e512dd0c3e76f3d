#!/usr/bin/env python3
"""Markdown table of the `check` benchmark: median ns per check, and how many times faster ours is.

Reads criterion's `<target>/criterion/<group>/<function>/new/{benchmark,estimates}.json` as written
by `cargo bench -p ratemesh-core --bench check`. Every iteration of that bench is one check, so the
median time per iteration is the median ns per check.

Usage: python3 crates/ratemesh-core/benches/ratios.py [DIR ...]
Each DIR is a cargo target directory or a copy of its `criterion/` directory (default:
$CARGO_TARGET_DIR, else the workspace's `target/`). With several DIRs (copies of `target/criterion`
saved after repeated runs on a noisy machine), each benchmark's figure is the lowest of its medians
across the runs, i.e. the run least disturbed by other load, and the 10k-key goal is also shown per run.

Ratio columns are `governor time / our time`: above 1.0 ours is faster.
"""

import json
import os
import sys
from pathlib import Path

GROUPS = [
    ("allowed_1key", "1 key (allowed)"),
    ("refused_1key", "1 key (refused)"),
    ("allowed_10k_keys", "10k keys"),
    ("allowed_1m_keys", "1M keys"),
]
FUNCTIONS = [
    ("ours", "ours"),
    ("ours_clock", "ours + std clock"),
    ("ours_quanta", "ours + quanta clock"),
    ("ours_mutex_clock", "ours + Mutex + std clock"),
    ("governor_keyed", "governor keyed"),
    ("governor_direct", "governor direct"),
    ("naive", "naive Mutex<HashMap>"),
]
# (numerator, denominator, header): numerator / denominator = times faster the denominator is.
RATIOS = [
    ("governor_keyed", "ours", "gov keyed / ours"),
    ("governor_keyed", "ours_clock", "gov keyed / ours+std clock"),
    ("governor_keyed", "ours_quanta", "gov keyed / ours+quanta"),
    ("governor_keyed", "ours_mutex_clock", "gov keyed / ours+Mutex+std clock"),
    ("governor_direct", "ours_clock", "gov direct / ours+std clock"),
    ("naive", "ours", "naive / ours"),
]


def criterion_dirs() -> list:
    if len(sys.argv) > 1:
        dirs = [Path(arg) for arg in sys.argv[1:]]
    elif os.environ.get("CARGO_TARGET_DIR"):
        dirs = [Path(os.environ["CARGO_TARGET_DIR"])]
    else:
        # benches/ -> ratemesh-core/ -> crates/ -> workspace root
        dirs = [Path(__file__).resolve().parents[3] / "target"]
    return [d / "criterion" if (d / "criterion").is_dir() else d for d in dirs]


def load(root: Path) -> dict:
    """{(group_id, function_id): median ns} from every `new/` result under `root`."""
    medians = {}
    for estimates in root.glob("**/new/estimates.json"):
        meta_path = estimates.with_name("benchmark.json")
        try:
            meta = json.loads(meta_path.read_text())
            median = json.loads(estimates.read_text())["median"]["point_estimate"]
        except (OSError, ValueError, KeyError):
            continue
        medians[(meta.get("group_id"), meta.get("function_id"))] = median
    return medians


def fmt_ns(value):
    if value is None:
        return "–"
    return f"{value:.1f}" if value < 1000 else f"{value:,.0f}"


def goal_ratio(medians: dict, ours: str):
    num, den = medians.get(("allowed_10k_keys", "governor_keyed")), medians.get(("allowed_10k_keys", ours))
    return num / den if num and den else None


def main() -> int:
    runs = []
    for root in criterion_dirs():
        if not root.is_dir():
            print(f"no criterion results under {root}; run `cargo bench -p ratemesh-core --bench check`")
            return 1
        runs.append(load(root))
    medians = {}
    for run in runs:
        for key, value in run.items():
            medians[key] = min(value, medians.get(key, value))
    groups = [(g, label) for g, label in GROUPS if any(k[0] == g for k in medians)]
    if not groups:
        print("no results of the check bench found")
        return 1

    source = "criterion median of samples"
    if len(runs) > 1:
        source += f"; lowest median of {len(runs)} runs"
    print(f"Median ns per check ({source}):\n")
    header = ["keys"] + [label for _, label in FUNCTIONS]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for group, label in groups:
        cells = [fmt_ns(medians.get((group, f))) for f, _ in FUNCTIONS]
        print(f"| {label} | " + " | ".join(cells) + " |")

    print("\nRatios (times faster ours is; > 1.0 means ours is faster):\n")
    header = ["keys"] + [h for _, _, h in RATIOS]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for group, label in groups:
        cells = []
        for numerator, denominator, _ in RATIOS:
            num, den = medians.get((group, numerator)), medians.get((group, denominator))
            cells.append(f"{num / den:.2f}" if num and den else "–")
        print(f"| {label} | " + " | ".join(cells) + " |")

    verdict = goal_ratio(medians, "ours")
    if verdict is not None:
        clock = goal_ratio(medians, "ours_clock")
        extra = f", {clock:.2f} with our clock read (std)" if clock else ""
        status = "met" if verdict >= 1.0 else "NOT met"
        print(f"\nGoal (ours >= governor keyed at 10k keys): ratio {verdict:.2f}{extra}: {status}.")
    if len(runs) > 1:
        per_run = ", ".join(
            f"{goal_ratio(run, 'ours') or float('nan'):.2f} ({goal_ratio(run, 'ours_clock') or float('nan'):.2f})"
            for run in runs
        )
        print(f"Per run, gov keyed / ours (with std clock) at 10k keys: {per_run}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
