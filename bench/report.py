#!/usr/bin/env python3
"""Turns bench/run.sh's runs into a markdown table (medians of the runs per path).

Usage: report.py RUNS_TSV MACHINE_NOTE > results.md

RUNS_TSV lines: path<TAB>round<TAB>requests_per_second<TAB>p50_ms<TAB>p99_ms<TAB>cpu_us<TAB>kernel_us,
where cpu_us is the server's CPU time per decision answered (µs) and kernel_us the part of it
spent in the kernel (system time). The path named "ratemeshd HTTP" is
compared with the one named "Redis + Lua" (throughput ratio and p99 ratio); every ratemeshd path
is compared per core (CPU per decision) with Redis + Lua at the same pipeline depth ("P16" paths
with "Redis + Lua P16"), and so is every peer's path (BENCH_PEERS=1: paths named after
throttlecrab or rateguard); then ratemeshd's paths are compared per core with the peers' paths
of the same protocol (HTTP with HTTP, RESP with RESP). The path named "Redis PING (floor)" is
the cost of a bare request and answer: the per-core goals are set against it, and against the
kernel's part of each server's cost, which no server of requests over sockets avoids at
pipeline 1.
"""

import statistics
import sys

HTTP = "ratemeshd HTTP"
REDIS = "Redis + Lua"
FLOOR = "Redis PING (floor)"
PEERS = ("throttlecrab", "rateguard")
# Paths with several calls in flight per connection: not pipeline 1 (and the same path of a
# baseline build, BENCH_RLS_BASELINE).
MULTIPLEXED = ("ratemeshd gRPC RLS", "ratemeshd gRPC RLS (baseline)")


def protocol(path: str) -> str:
    """The protocol a path speaks, for comparing servers on the same one."""
    return "RESP" if "RESP" in path else "HTTP" if "HTTP" in path else path


def baseline(path: str) -> str:
    """The Redis + Lua path a ratemeshd path is compared with per core."""
    return f"{REDIS} P16" if path.endswith(" P16") else REDIS


def medians_of(path_runs: list[tuple[float, ...]]) -> tuple[float, ...]:
    """Each value's median over a path's runs, but the kernel's part: that is the one of the run
    whose CPU time is the median, so that it is a part of the CPU time shown (with an even number
    of runs, the CPU median falls between two runs and the kernel's part is the lower one's)."""
    rps, p50, p99, cpu_us = (statistics.median(run[i] for run in path_runs) for i in range(4))
    kernel_us = sorted(path_runs, key=lambda run: run[3])[(len(path_runs) - 1) // 2][4]
    return rps, p50, p99, cpu_us, kernel_us


def main() -> int:
    runs_path, machine = sys.argv[1], sys.argv[2]
    runs: dict[str, list[tuple[float, ...]]] = {}
    with open(runs_path, encoding="utf-8") as runs_file:
        for line in runs_file:
            if not line.strip():
                continue
            path, _round, *values = line.rstrip("\n").split("\t")
            runs.setdefault(path, []).append(tuple(float(value) for value in values))
    medians = {path: medians_of(path_runs) for path, path_runs in runs.items()}
    print("| path | requests/s (median) | p50 ms | p99 ms | CPU µs per decision | of it, kernel µs | runs (requests/s) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for path, (rps, p50, p99, cpu_us, kernel_us) in medians.items():
        each = ", ".join(f"{run[0]:,.0f}" for run in runs[path])
        print(f"| {path} | {rps:,.0f} | {p50:.3f} | {p99:.3f} | {cpu_us:.2f} | {kernel_us:.2f} | {each} |")
    print()
    if HTTP in medians and REDIS in medians:
        (h_rps, _, h_p99, _, _), (r_rps, _, r_p99, _, _) = medians[HTTP], medians[REDIS]
        print(
            f"ratemeshd HTTP / Redis+Lua: throughput ×{h_rps / r_rps:.2f}, "
            f"p99 ×{h_p99 / r_p99:.2f} (goal: throughput ≥ ×1.00 at comparable p99)."
        )
        print()
    if FLOOR in medians and REDIS in medians:
        floor_us, redis_us = medians[FLOOR][3], medians[REDIS][3]
        print(
            f"- floor: a request and its answer at pipeline 1 (Redis PING) cost {floor_us:.2f} CPU µs here; "
            f"× 2 Redis + Lua per core is {redis_us / 2:.2f} µs per decision "
            f"({redis_us / 2 / floor_us:.2f} × the floor), × 3 is {redis_us / 3:.2f} µs "
            f"({redis_us / 3 / floor_us:.2f} × the floor)"
        )
        kernel = ", ".join(
            f"{path} {values[4]:.2f}"
            for path, values in medians.items()
            if not path.endswith(" P16") and path not in MULTIPLEXED
        )
        print(f"- the kernel's part alone, CPU µs per decision at pipeline 1: {kernel}")
    for path, (_, _, p99, cpu_us, _) in medians.items():
        base = baseline(path)
        if path.startswith(("ratemeshd",) + PEERS) and base in medians and cpu_us > 0:
            _, _, b_p99, b_cpu_us, _ = medians[base]
            print(
                f"- per core, {path} / {base}: ×{b_cpu_us / cpu_us:.2f} "
                f"({cpu_us:.2f} against {b_cpu_us:.2f} CPU µs per decision), p99 ×{p99 / b_p99:.2f}"
            )
    for path, (_, _, p99, cpu_us, _) in medians.items():
        if not path.startswith("ratemeshd") or path.endswith(" P16") or cpu_us <= 0:
            continue
        for peer, (_, _, peer_p99, peer_cpu_us, _) in medians.items():
            if peer.startswith(PEERS) and protocol(peer) == protocol(path) and peer_cpu_us > 0:
                print(
                    f"- per core, {path} / {peer}: ×{peer_cpu_us / cpu_us:.2f} "
                    f"({cpu_us:.2f} against {peer_cpu_us:.2f} CPU µs per decision), p99 ×{p99 / peer_p99:.2f}"
                )
    print()
    print(machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
