#!/usr/bin/env python3
"""Turns tests/bench.sh's runs into a markdown table (medians of the runs per path).

Usage: report.py RUNS_TSV MACHINE_NOTE > results.md

RUNS_TSV lines: path<TAB>round<TAB>requests_per_second<TAB>p50_ms<TAB>p99_ms. The path named
"ratemeshd HTTP" is compared with the one named "Redis + Lua" (throughput ratio and p99 ratio).
"""

import statistics
import sys

HTTP = "ratemeshd HTTP"
REDIS = "Redis + Lua"


def main() -> int:
    runs_path, machine = sys.argv[1], sys.argv[2]
    runs: dict[str, list[tuple[float, float, float]]] = {}
    with open(runs_path, encoding="utf-8") as runs_file:
        for line in runs_file:
            if not line.strip():
                continue
            path, _round, rps, p50, p99 = line.rstrip("\n").split("\t")
            runs.setdefault(path, []).append((float(rps), float(p50), float(p99)))
    medians = {
        path: tuple(statistics.median(run[i] for run in path_runs) for i in range(3))
        for path, path_runs in runs.items()
    }
    print("| path | requests/s (median) | p50 ms | p99 ms | runs (requests/s) |")
    print("|---|---:|---:|---:|---|")
    for path, (rps, p50, p99) in medians.items():
        each = ", ".join(f"{run[0]:,.0f}" for run in runs[path])
        print(f"| {path} | {rps:,.0f} | {p50:.3f} | {p99:.3f} | {each} |")
    print()
    if HTTP in medians and REDIS in medians:
        (h_rps, _, h_p99), (r_rps, _, r_p99) = medians[HTTP], medians[REDIS]
        print(
            f"ratemeshd / Redis+Lua: throughput ×{h_rps / r_rps:.2f}, "
            f"p99 ×{h_p99 / r_p99:.2f} (goal: throughput ≥ ×1.00 at comparable p99)."
        )
        print()
    print(machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
