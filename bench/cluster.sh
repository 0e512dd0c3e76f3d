#!/usr/bin/env bash
# What a cluster costs per decision, on this machine and in one run (issue 42). Run as
# `BENCH_CLUSTER=1 bash bench/run.sh` (which execs this script) or `bash bench/cluster.sh`.
#
# Three configurations side by side, each node under its own `wrk -t1 -cBENCH_CONNECTIONS
# --latency` POSTing /v1/check (bench/post_json.lua) over the same BENCH_KEYS keys, every
# wrk of a configuration started at once:
#
#  - one node: a single node and a single wrk;
#  - three standalone nodes: three nodes without seeds, each its own cluster (its own
#    cluster_id), under three wrks: the control;
#  - a three-node cluster (start_cluster 3), under the same three wrks: the same key space on
#    every node, so the nodes share the keys: what differs from the control is the cluster.
#
# The policy: a token bucket of 1 000/s, burst 1 000, once in approximate mode
# ("bench-approximate") and once in exact mode ("bench-exact"), both in every node's one
# configuration. Every node runs one tokio worker (TOKIO_WORKER_THREADS=1, as bench/run.sh),
# and the nodes and the wrks share the machine's cores. The standalone node 1 is also the "one
# node". The six nodes run for the whole run; the idle ones are not stopped (SIGSTOP, as
# bench/run.sh does: the cluster's members would suspect each other).
#
# Measured per configuration: CPU µs per decision = the nodes' user + system time
# (/proc/PID/stat) over the load divided by the decisions their wrks were answered; p50 and p99
# per node = the mean over the nodes of each wrk's percentile; decisions/s = the sum over the
# nodes; and, from each node's /metrics, the share of the checks that were forwarded to their
# key's owner, decided from an allowance, decided by the fallback, or limited. Every response
# must be 200 (wrk's "Non-2xx" line fails the run); at the end every cluster member must still
# see three live members.
#
# For each round, for each BENCH_CLUSTER_KEYS, for each BENCH_CLUSTER_MODES: one node, three
# standalone, the cluster (interleaved); the table (medians over the rounds) is printed on
# stdout and written to target/bench/cluster.md, each measurement to target/bench/cluster.tsv.
#
# Environment: RATEMESHD (the binary; default: `cargo build --release` of ratemeshd, as
# bench/run.sh; either way it is copied into the scratch directory first, so a rebuild during
# the run changes nothing), BENCH_ROUNDS (2), BENCH_SECONDS (5, 1..60), BENCH_CONNECTIONS per
# node (16: three nodes make 48 in all, about bench/run.sh's 64 on one node; enough in flight
# to keep a one-worker node busy at pipeline 1), BENCH_CLUSTER_KEYS ("10 1000 10000"),
# BENCH_CLUSTER_MODES ("approximate exact").
# shellcheck source-path=SCRIPTDIR
# shellcheck disable=SC2034 # the port and pid arrays are read through measure's namerefs
set -euo pipefail
source "$(dirname "$0")/../tests/lib.sh"
source "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/.."
root=$PWD
script_name="bench/cluster.sh"

rounds=${BENCH_ROUNDS:-2}
seconds=${BENCH_SECONDS:-5}
connections=${BENCH_CONNECTIONS:-16}
read -r -a key_counts <<<"${BENCH_CLUSTER_KEYS:-10 1000 10000}"
read -r -a modes <<<"${BENCH_CLUSTER_MODES:-approximate exact}"
out_dir=$root/target/bench
wait_s=30 # the bound of every wait
say_fd=2  # stdout is the results table

[[ $rounds =~ ^[1-9][0-9]*$ ]] || fail "BENCH_ROUNDS must be a positive number"
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds < 1 || seconds > 60)); then fail "BENCH_SECONDS must be 1..60"; fi
[[ $connections =~ ^[1-9][0-9]*$ ]] || fail "BENCH_CONNECTIONS must be a positive number"
((${#key_counts[@]})) || fail "BENCH_CLUSTER_KEYS is empty"
for keys in "${key_counts[@]}"; do
    [[ $keys =~ ^[1-9][0-9]*$ ]] || fail "BENCH_CLUSTER_KEYS: '$keys' is no positive number"
done
((${#modes[@]})) || fail "BENCH_CLUSTER_MODES is empty"
for mode in "${modes[@]}"; do
    [[ $mode == approximate || $mode == exact ]] || fail "BENCH_CLUSTER_MODES: '$mode' is neither approximate nor exact"
done

# --- tools and binary -----------------------------------------------------------------------------
if ! command -v wrk >/dev/null; then
    say "installing wrk from Debian"
    apt_install wrk || fail "installing wrk from Debian failed"
fi
require_tools wrk curl python3 timeout

make_work
if [[ -n ${RATEMESHD:-} ]]; then
    ratemeshd_binary "$RATEMESHD"
else
    require_tools cargo
    say "building ratemeshd (release)"
    cargo build --release --locked -p ratemeshd >&2 || fail "building ratemeshd failed"
    target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    ratemeshd_binary "$target_dir/release/ratemeshd"
fi
cp "$binary" "$work/ratemeshd" || fail "cannot copy $binary"
binary_source=$binary
binary=$work/ratemeshd
binary_version=$("$binary" --version) || fail "$binary_source --version failed"

# --- nodes ----------------------------------------------------------------------------------------
all_pids=() # every node started here, stopped at exit
wrk_pids=() # the running wrks, stopped at exit
stop_at_exit wrk_pids all_pids

policies=$(
    for mode in approximate exact; do
        cat <<EOF
[[policies]]
name = "bench-$mode"
algorithm = "token_bucket"
limit = 1000
period_ms = 1000
burst = 1000
mode = "$mode"

EOF
    done
)

# start_set NAME COUNT PORTS PIDS: start_cluster COUNT NAME, in its own directory of $work (its
# node-ID.toml and node-ID.log); the nodes' HTTP ports into the array PORTS, their pids into the
# array PIDS and all_pids (start_cluster's own arrays are overwritten by its next call).
start_set() {
    local name=$1 count=$2 work=$work/$1 id
    local -n set_ports=$3 set_pids=$4
    mkdir -p "$work" || fail "cannot create $work"
    say "starting $name ($count node(s))"
    cluster_env=(TOKIO_WORKER_THREADS=1)
    start_cluster "$count" "$name" <<EOF
[log]
level = "warn"

[limits]
http_in_flight_max = 4096

$policies
EOF
    set_ports=()
    set_pids=()
    for ((id = 1; id <= count; id++)); do
        set_ports+=("${http[id]}")
        set_pids+=("${node_pids[id]}")
        all_pids+=("${node_pids[id]}")
    done
}

standalone_ports=()
standalone_pids=()
for i in 1 2 3; do
    start_set "standalone-$i" 1 ports pids
    standalone_ports+=("${ports[@]}")
    standalone_pids+=("${pids[@]}")
done
one_ports=("${standalone_ports[0]}")
one_pids=("${standalone_pids[0]}")
cluster_ports=()
cluster_pids=()
start_set cluster 3 cluster_ports cluster_pids

# One check by hand on each node, in each mode: 200 and allowed.
for port in "${standalone_ports[@]}" "${cluster_ports[@]}"; do
    for mode in "${modes[@]}"; do
        answer=$(curl -s --max-time 5 -H 'Content-Type: application/json' \
            -d "{\"key\":\"probe\",\"policy\":\"bench-$mode\"}" "http://127.0.0.1:$port/v1/check") ||
            fail "node on $port: the probe check failed"
        [[ $answer == *'"allowed":true'* ]] || fail "node on $port, $mode: the probe check answered '$answer'"
    done
done

# --- one measurement ------------------------------------------------------------------------------
# node_counts PORT: the node's protocol counters, "OWNER ALLOWANCE FALLBACK FORWARDED LIMITED"
# (LIMITED: the checks of ratemesh_requests_total not allowed).
node_counts() {
    curl -sf --max-time 5 "http://127.0.0.1:$1/metrics" | awk '
        $1 == "ratemesh_owner_decisions_total" { owner = $2 }
        $1 == "ratemesh_allowance_decisions_total" { allowance = $2 }
        $1 == "ratemesh_fallback_decisions_total" { fallback = $2 }
        $1 == "ratemesh_forwarded_total" { forwarded = $2 }
        /^ratemesh_requests_total\{/ && !/decision="allowed"/ { limited += $2 }
        END { printf "%d %d %d %d %d\n", owner, allowance, fallback, forwarded, limited }' ||
        fail "cannot read the metrics of the node on $1"
}

runs=$work/runs.tsv
: >"$runs"

# measure CONFIG KEYS MODE PORTS PIDS: one wrk per node of the arrays PORTS (pids PIDS), all at
# once, over KEYS keys of the policy bench-MODE; a line per node into $runs:
# config keys mode round node rps p50_ms p99_ms requests cpu_ticks owner allowance fallback forwarded limited
measure() {
    local config=$1 keys=$2 mode=$3 i status
    local -n m_ports=$4 m_pids=$5
    local ticks_before=() ticks_after=() counts_before=() counts_after=()
    say "round $round/$rounds: $keys keys, $mode, $config"
    for i in "${!m_ports[@]}"; do
        counts_before[i]=$(node_counts "${m_ports[i]}")
        ticks_before[i]=$(cpu_ticks "${m_pids[i]}")
    done
    wrk_pids=()
    for i in "${!m_ports[@]}"; do
        BENCH_KEYS=$keys BENCH_BODY="{\"key\":\"user-%d\",\"policy\":\"bench-$mode\"}" \
            timeout $((seconds + 20)) wrk -t1 -c"$connections" -d"${seconds}s" --latency \
            -s bench/post_json.lua "http://127.0.0.1:${m_ports[i]}/v1/check" >"$work/wrk-$i.log" 2>&1 &
        wrk_pids[i]=$!
    done
    for i in "${!m_ports[@]}"; do
        status=0
        wait "${wrk_pids[i]}" || status=$?
        ((status == 0)) || fail "wrk against node $((i + 1)) of $config failed ($status): $(cat "$work/wrk-$i.log")"
    done
    wrk_pids=()
    for i in "${!m_ports[@]}"; do
        ticks_after[i]=$(cpu_ticks "${m_pids[i]}")
        counts_after[i]=$(node_counts "${m_ports[i]}")
    done
    for i in "${!m_ports[@]}"; do
        row=$(wrk_row "$work/wrk-$i.log" "node $((i + 1)) of $config ($keys keys, $mode)")
        python3 - "$config" "$keys" "$mode" "$round" "$((i + 1))" "$row" "${ticks_before[i]}" "${ticks_after[i]}" \
            "${counts_before[i]}" "${counts_after[i]}" >>"$runs" <<'EOF' || fail "cannot record a measurement"
import sys
config, keys, mode, round_, node, row, tb, ta, cb, ca = sys.argv[1:]
ticks = sum(map(int, ta.split())) - sum(map(int, tb.split()))
counts = [after - before for before, after in zip(map(int, cb.split()), map(int, ca.split()))]
print("\t".join([config, keys, mode, round_, node, row] + [str(ticks)] + [str(c) for c in counts]))
EOF
    done
}

mkdir -p "$out_dir" || fail "cannot create $out_dir"
for ((round = 1; round <= rounds; round++)); do
    for keys in "${key_counts[@]}"; do
        for mode in "${modes[@]}"; do
            measure "one node" "$keys" "$mode" one_ports one_pids
            measure "three standalone" "$keys" "$mode" standalone_ports standalone_pids
            measure "three-node cluster" "$keys" "$mode" cluster_ports cluster_pids
        done
    done
done
for pid in "${all_pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || fail "a node (pid $pid) died during the benchmark"
done
for port in "${cluster_ports[@]}"; do
    live_members_are "$port" 3 || fail "after the run, the cluster node on $port does not see 3 live members"
done

commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
wrk_version=$(wrk -v 2>&1 | awk 'NR == 1 { print $1, $2 }' || true) # wrk -v exits 1
machine="Machine: $(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), nodes and load generators sharing them, loopback; $wrk_version; $binary_version ($binary_source; this checkout at $commit), one tokio worker per node; wrk -t1 -c$connections per node, ${seconds} s per load; token bucket 1 000/s, burst 1 000; $rounds interleaved rounds, medians."
python3 bench/cluster_report.py "$runs" "$clock_ticks_per_s" "$machine" | tee "$out_dir/cluster.md"
cp "$runs" "$out_dir/cluster.tsv"
say "written to $out_dir/cluster.md"
