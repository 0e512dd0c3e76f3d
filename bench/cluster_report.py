"""The table of bench/cluster.sh, in Markdown, from its measurements.

    python3 bench/cluster_report.py RUNS_TSV CLOCK_TICKS_PER_S MACHINE_LINE

RUNS_TSV: a line per node and measurement, tab-separated: config keys mode round node rps p50_ms
p99_ms requests cpu_ticks owner allowance fallback forwarded limited (the last five: deltas of
the node's /metrics counters over the load). Per configuration and round: CPU µs per decision =
the nodes' ticks over their decisions (wrk's requests); p50/p99 = the mean over the nodes;
decisions/s = the sum over the nodes; shares = the counters' sums over the decisions. Each column
is the median over the rounds; the ratio is the ratio of the medians (each round's own after it).
"""

import statistics
import sys
from collections import defaultdict

ONE, STANDALONE, CLUSTER = "one node", "three standalone", "three-node cluster"


def main():
    runs_path, hz, machine = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    nodes = defaultdict(list)  # (config, keys, mode, round) -> rows of its nodes
    order_keys, order_modes = [], []
    for line in open(runs_path):
        if not line.strip():
            continue
        f = line.rstrip("\n").split("\t")
        config, keys, mode, round_ = f[0], int(f[1]), f[2], int(f[3])
        rps, p50, p99 = float(f[5]), float(f[6]), float(f[7])
        requests, ticks = int(f[8]), int(f[9])
        owner, allowance, fallback, forwarded, limited = map(int, f[10:15])
        nodes[(config, keys, mode, round_)].append(
            dict(rps=rps, p50=p50, p99=p99, requests=requests, ticks=ticks, allowance=allowance,
                 fallback=fallback, forwarded=forwarded, limited=limited, owner=owner))
        if keys not in order_keys:
            order_keys.append(keys)
        if mode not in order_modes:
            order_modes.append(mode)

    # (config, keys, mode) -> {metric: [value per round]}
    per_round = defaultdict(lambda: defaultdict(list))
    for (config, keys, mode, round_), rows in sorted(nodes.items(), key=lambda item: item[0][3]):
        decisions = sum(r["requests"] for r in rows)
        m = per_round[(config, keys, mode)]
        m["cpu_us"].append(sum(r["ticks"] for r in rows) * 1e6 / hz / decisions)
        m["p50"].append(statistics.mean(r["p50"] for r in rows))
        m["p99"].append(statistics.mean(r["p99"] for r in rows))
        m["rps"].append(sum(r["rps"] for r in rows))
        for share in ("forwarded", "allowance", "fallback", "limited"):
            m[share].append(sum(r[share] for r in rows) / decisions)

    def med(config, keys, mode, metric):
        values = per_round.get((config, keys, mode), {}).get(metric)
        return statistics.median(values) if values else None

    def num(value, digits=2):
        return "–" if value is None else f"{value:,.{digits}f}".replace(",", " ")

    def pct(value):
        return "–" if value is None else f"{value * 100:.1f} %"

    print("| keys | mode | one node µs/decision | three standalone µs/decision | three-node cluster µs/decision "
          "| cluster / standalone (per round) | p50 ms per node, standalone → cluster "
          "| p99 ms per node, standalone → cluster | decisions/s, standalone → cluster "
          "| cluster: forwarded / from allowance / fallback / limited |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for keys in order_keys:
        for mode in order_modes:
            one, alone, cluster = (med(c, keys, mode, "cpu_us") for c in (ONE, STANDALONE, CLUSTER))
            ratio = rounds_ratio = "–"
            if alone and cluster:
                ratio = f"× {cluster / alone:.2f}"
                each = [c / a for c, a in zip(per_round[(CLUSTER, keys, mode)]["cpu_us"],
                                              per_round[(STANDALONE, keys, mode)]["cpu_us"])]
                rounds_ratio = ", ".join(f"{r:.2f}" for r in each)
            shares = " / ".join(pct(med(CLUSTER, keys, mode, s))
                                for s in ("forwarded", "allowance", "fallback", "limited"))
            keys_text = f"{keys:,}".replace(",", " ")
            print(f"| {keys_text} | {mode} | {num(one)} | {num(alone)} | {num(cluster)} "
                  f"| **{ratio}** ({rounds_ratio}) "
                  f"| {num(med(STANDALONE, keys, mode, 'p50'))} → {num(med(CLUSTER, keys, mode, 'p50'))} "
                  f"| {num(med(STANDALONE, keys, mode, 'p99'))} → {num(med(CLUSTER, keys, mode, 'p99'))} "
                  f"| {num(med(STANDALONE, keys, mode, 'rps'), 0)} → {num(med(CLUSTER, keys, mode, 'rps'), 0)} "
                  f"| {shares} |")
    print()
    print(machine)


if __name__ == "__main__":
    main()
