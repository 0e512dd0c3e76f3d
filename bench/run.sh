#!/usr/bin/env bash
# Benchmark, on this machine and in one run, of three ways to ask "may this request pass?":
#
#  - ratemeshd's HTTP API: `wrk -t2 -c64 -d10s --latency` POSTing /v1/check for one policy and
#    keys spread over BENCH_KEYS (bench/post_json.lua), against a single node;
#  - the seed article's Redis + Lua token bucket (bench/rate_limit.lua, loaded with SCRIPT
#    LOAD), against redis-server from Debian:
#    `redis-benchmark --threads 2 -c 64 EVALSHA <sha> 1 rl:<random key> 100 10 1 <now>`;
#  - ratemeshd's Envoy RLS gRPC path, with the `rls_load` example of the ratemeshd crate (a lean
#    one-thread HTTP/2 gRPC client; bench/README.md says why it is a cargo example),
#    BENCH_CONNECTIONS calls in flight over 4 connections (as Envoy multiplexes its calls to an
#    RLS) and over BENCH_CONNECTIONS connections (one each, as the other clients here);
#  - ratemeshd's Redis protocol listener with the same client as Redis + Lua: redis-benchmark
#    sending redis-cell's `CL.THROTTLE key:__rand_int__ 15 30 60` (-r BENCH_KEYS), at pipeline 1
#    and 16, beside Redis + Lua's EVALSHA at pipeline 1 and 16.
#
# Per core: each server's own CPU time (utime + stime of /proc/PID/stat, from before to after a
# load) divided by the decisions it answered in that load, in CPU µs per decision.
#
# The floor: Redis answering PING at pipeline 1 with the same client, the cost on this kernel of a
# request and its answer (a read and a write system call on loopback TCP) with nearly no work
# between them; every server here pays it per request at pipeline 1.
#
# Each measurement runs 3 times, interleaved (HTTP, Redis, PING, RESP, Redis P16, RESP P16, gRPC,
# HTTP, ...), each load at most 10 s (redis-benchmark: a request count); the table reports the medians
# (per column), the throughput and p99 ratios ratemeshd HTTP / Redis+Lua and the per-core ratios
# (CPU per decision) of each ratemeshd path / Redis+Lua at the same pipeline depth, on stdout and
# in target/bench/results.md. Not run by .ci/run (it measures, it does not assert), but bounded
# and self-contained: installs wrk, redis-server and redis-tools from Debian when missing. By
# default load generators and servers share the machine's cores (2 here), so absolute numbers
# include that contention, for both sides alike; BENCH_PINNED=1 separates them (below).
#
# Peers mode (BENCH_PEERS=1): the two open-source peers from crates.io in the same table, the
# same way: throttlecrab-server's HTTP `POST /throttle` (wrk) and RESP `THROTTLE`
# (redis-benchmark, pipeline 1), and rateguard-sidecar's `POST /v1/check` (wrk), each a single node with a bucket like ratemeshd's; they
# are installed with `cargo install --locked` into target/peers when missing (throttlecrab's
# build needs Debian's protobuf-compiler), which takes minutes the first time.
#
# Baseline mode (BENCH_RLS_BASELINE=PATH): a second ratemeshd, the binary at PATH (an earlier
# build, e.g. of another commit), runs beside the first with the same configuration on other
# ports, and its gRPC RLS paths are measured in the same rounds with the same client, as
# "ratemeshd gRPC RLS (baseline)": two server stacks side by side in one run.
#
# Cluster mode (BENCH_CLUSTER=1): what a cluster costs per decision, bench/cluster.sh (its
# header says how): one node, three standalone nodes and a three-node cluster side by side, each
# node under its own `wrk -t1`, over 10, 1 000 and 10 000 keys, approximate and exact mode; table
# in target/bench/cluster.md. run.sh execs it first thing; its environment is its own
# (BENCH_ROUNDS, BENCH_SECONDS, BENCH_CONNECTIONS, BENCH_CLUSTER_KEYS, BENCH_CLUSTER_MODES,
# RATEMESHD).
#
# Environment: BENCH_ROUNDS (3), BENCH_SECONDS (10, at most 10), BENCH_CONNECTIONS (64),
# BENCH_KEYS (10000), BENCH_REDIS_REQUESTS (200000; at pipeline 16, 5 times as many),
# BENCH_PEERS (0), BENCH_RLS_BASELINE (unset).
set -euo pipefail
# Cluster mode runs its own script, before any of this one's tools and builds.
[[ ${BENCH_CLUSTER:-0} != 1 ]] || exec bash "$(dirname "$0")/cluster.sh"
source "$(dirname "$0")/../tests/lib.sh"
source "$(dirname "$0")/common.sh"
script_name=bench/run.sh
cd "$(dirname "$0")/.."
root=$PWD

rounds=${BENCH_ROUNDS:-3}
seconds=${BENCH_SECONDS:-10}
connections=${BENCH_CONNECTIONS:-64}
keys=${BENCH_KEYS:-10000}
pinned=${BENCH_PINNED:-0}
peers=${BENCH_PEERS:-0}
rls_baseline=${BENCH_RLS_BASELINE:-}
[[ -z $rls_baseline || -x $rls_baseline ]] || { echo "bench/run.sh: BENCH_RLS_BASELINE is no executable" >&2; exit 1; }
redis_requests=${BENCH_REDIS_REQUESTS:-200000}
out_dir=$root/target/bench
((seconds >= 1 && seconds <= 10)) || { echo "bench/run.sh: BENCH_SECONDS must be 1..10" >&2; exit 1; }
wait_s=30          # the bound of every wait
# Pinned: servers on core 0, load generators on core 1 (and one load-generator thread).
server_cpu=()
load_cpu=()
load_threads=2
if [[ $pinned == 1 ]]; then
    (($(nproc) >= 2)) || { echo "bench/run.sh: BENCH_PINNED=1 needs 2 cores" >&2; exit 1; }
    server_cpu=(taskset -c 0)
    load_cpu=(taskset -c 1)
    load_threads=1
fi
say_fd=2           # stdout is the results table

# --- tools --------------------------------------------------------------------------------------
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-benchmark >/dev/null || missing+=(redis-tools)
if ((${#missing[@]})); then
    say "installing ${missing[*]} from Debian"
    apt_install "${missing[@]}" || fail "installing ${missing[*]} from Debian failed"
fi
require_tools wrk redis-server redis-cli redis-benchmark curl python3 cargo timeout taskset

say "building ratemeshd (release)"
cargo build --release --locked -p ratemeshd >&2
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
binary=$target_dir/release/ratemeshd
rls_load=
if [[ -f crates/ratemeshd/examples/rls_load.rs ]]; then
    say "building the rls_load example (release)"
    cargo build --release --locked -p ratemeshd --example rls_load >&2
    rls_load=$target_dir/release/examples/rls_load
else
    say "no crates/ratemeshd/examples/rls_load.rs: the gRPC RLS path is not measured"
fi

peers_root=$root/target/peers
if [[ $peers == 1 ]]; then
    command -v protoc >/dev/null || apt_install protobuf-compiler || fail "installing protobuf-compiler failed"
    for crate in throttlecrab-server rateguard-sidecar; do
        [[ -x $peers_root/bin/$crate ]] && continue
        say "installing $crate from crates.io (cargo install --locked; minutes)"
        cargo install --locked --root "$peers_root" "$crate" >&2 || fail "cargo install $crate failed"
    done
fi

# --- processes and cleanup ----------------------------------------------------------------------
ratemeshd_pid=
redis_pid=
throttlecrab_pid=
rateguard_pid=
baseline_pid=
make_work
stop_at_exit ratemeshd_pid redis_pid throttlecrab_pid rateguard_pid baseline_pid
show_at_failure "ratemeshd log" 20 "$work/ratemeshd.log"

ratemeshd_ports p_redis/tcp p_resp/tcp p_tc_http/tcp p_tc_resp/tcp p_rg_http/tcp p_rg_gossip/udp \
    p_base_http/tcp p_base_grpc/tcp p_base_gossip/udp p_base_quic/udp

# The same token bucket on both sides: capacity 100, 10 tokens per second.
write_config "$work/ratemesh.toml" <<EOF
[log]
level = "warn"

[limits]
http_in_flight_max = 4096

[[policies]]
name = "bench"
algorithm = "token_bucket"
limit = 10
period_ms = 1000
burst = 100

[[policies]]
name = "bench-rls"
domain = "bench"
descriptors = [{ key = "user" }]
algorithm = "token_bucket"
limit = 10
period_ms = 1000
burst = 100
EOF
# Every server runs one thread, as Redis does: ratemeshd and the peers (tokio runtimes, which size
# themselves to the cores they may run on) get TOKIO_WORKER_THREADS=1. Pinned, that is what their
# runtimes choose on core 0 anyway (sched_getaffinity). Unpinned, a worker per core would make
# four busy threads on two cores with the load generator's two, and the scheduler's time slices
# would be the p99 (2.6-3.4 ms against 1.7-2.1 with one worker, in a quick run of wrk -t2).
start_ratemeshd "$work/ratemesh.toml" RATEMESH_LISTEN_RESP="127.0.0.1:$p_resp" TOKIO_WORKER_THREADS=1 "${server_cpu[@]}"
wait_for "ratemeshd ready" answers "http://127.0.0.1:$p_http/readyz" 200
[[ $(redis-cli -p "$p_resp" CL.THROTTLE probe 15 30 60 | head -n 1) == 0 ]] ||
    fail "ratemeshd's CL.THROTTLE did not allow its first call"

"${server_cpu[@]}" redis-server --bind 127.0.0.1 --port "$p_redis" --save '' --appendonly no --daemonize no \
    --logfile "$work/redis.log" &
redis_pid=$!
wait_for "redis-server up" redis-cli -p "$p_redis" ping
sha=$(redis-cli -p "$p_redis" SCRIPT LOAD "$(cat bench/rate_limit.lua)")
[[ $sha =~ ^[0-9a-f]{40}$ ]] || fail "SCRIPT LOAD answered '$sha'"
# One call by hand: the script runs and allows.
[[ $(redis-cli -p "$p_redis" EVALSHA "$sha" 1 rl:probe 100 10 1 "$(date +%s)" | head -n 1) == 1 ]] ||
    fail "the Lua token bucket did not allow its first call"

if [[ -n $rls_baseline ]]; then
    # The same configuration, its listeners moved by the environment (RATEMESH_LISTEN_*).
    env -i PATH="$PATH" RATEMESH_LISTEN_HTTP="127.0.0.1:$p_base_http" RATEMESH_LISTEN_GRPC="127.0.0.1:$p_base_grpc" \
        RATEMESH_LISTEN_GOSSIP="127.0.0.1:$p_base_gossip" RATEMESH_LISTEN_QUIC="127.0.0.1:$p_base_quic" \
        TOKIO_WORKER_THREADS=1 "${server_cpu[@]}" "$rls_baseline" serve --config "$work/ratemesh.toml" \
        >"$work/baseline.log" 2>&1 &
    baseline_pid=$!
    wait_for "baseline ratemeshd ready" answers "http://127.0.0.1:$p_base_http/readyz" 200
fi

if [[ $peers == 1 ]]; then
    TOKIO_WORKER_THREADS=1 "${server_cpu[@]}" "$peers_root/bin/throttlecrab-server" --http --http-host 127.0.0.1 --http-port "$p_tc_http" \
        --redis --redis-host 127.0.0.1 --redis-port "$p_tc_resp" --log-level warn >"$work/throttlecrab.log" 2>&1 &
    throttlecrab_pid=$!
    # Capacity 100, 10 a second, as ratemeshd's "bench" policy; one node, no seeds.
    TOKIO_WORKER_THREADS=1 "${server_cpu[@]}" "$peers_root/bin/rateguard-sidecar" --limit 10 --burst 100 \
        --bind "127.0.0.1:$p_rg_gossip" --listen "127.0.0.1:$p_rg_http" >"$work/rateguard.log" 2>&1 &
    rateguard_pid=$!
    wait_for "throttlecrab-server up" redis-cli -p "$p_tc_resp" ping
    wait_for "rateguard-sidecar up" answers "http://127.0.0.1:$p_rg_http/healthz" 200
fi

# --- one measurement each -------------------------------------------------------------------------
# Each prints: requests_per_second<TAB>p50_ms<TAB>p99_ms<TAB>decisions_answered

# measure PID COMMAND...: runs COMMAND (one of run_*) and prints its line with, instead of the
# decisions, the CPU µs per decision the server PID spent in it, and the part of it spent in the
# kernel (system time: the socket reads and writes, the wakeups):
# rps<TAB>p50<TAB>p99<TAB>cpu_us_per_decision<TAB>kernel_us_per_decision.
measure() {
    local pid=$1 before after row
    shift
    before=$(cpu_ticks "$pid")
    row=$("$@") || return 1
    after=$(cpu_ticks "$pid")
    python3 - "$row" "$before" "$after" "$clock_ticks_per_s" <<'EOF'
import sys
row, hz = sys.argv[1].split("\t"), int(sys.argv[4])
(user_before, system_before), (user_after, system_after) = (map(int, ticks.split()) for ticks in sys.argv[2:4])
rps, p50, p99, decisions = row
per_decision_us = 1e6 / hz / float(decisions)
cpu_us = (user_after - user_before + system_after - system_before) * per_decision_us
kernel_us = (system_after - system_before) * per_decision_us
print(f"{rps}\t{p50}\t{p99}\t{cpu_us:.2f}\t{kernel_us:.2f}")
EOF
}

# run_http [URL BODY]: wrk POSTing BODY (a format string, %d the key number) to URL (default:
# ratemeshd's POST /v1/check under the "bench" policy).
run_http() {
    local log=$work/wrk.log url=${1:-http://127.0.0.1:$p_http/v1/check} body=${2:-'{"key":"user-%d","policy":"bench"}'}
    BENCH_KEYS=$keys BENCH_BODY=$body timeout $((seconds + 20)) "${load_cpu[@]}" wrk -t"$load_threads" -c"$connections" -d"${seconds}s" --latency \
        -s bench/post_json.lua "$url" >"$log" 2>&1 ||
        fail "wrk failed: $(cat "$log")"
    wrk_row "$log" "$url"
}

# redis_benchmark PORT PIPELINE COMMAND...: redis-benchmark's COMMAND at PIPELINE, keys spread
# over $keys (__rand_int__), two client threads (as wrk's -t2); all its requests are answered.
redis_benchmark() {
    local port=$1 pipeline=$2 log=$work/redis-benchmark.csv requests=$redis_requests
    shift 2
    ((pipeline == 1)) || requests=$((redis_requests * 5))
    timeout 60 "${load_cpu[@]}" redis-benchmark -p "$port" --threads "$load_threads" -n "$requests" -c "$connections" -P "$pipeline" \
        -r "$keys" --csv "$@" >"$log" 2>&1 || fail "redis-benchmark failed: $(cat "$log")"
    python3 - "$log" "$requests" <<'EOF'
import csv, sys
# A server without CONFIG (a peer) makes redis-benchmark print a warning line first.
rows = [row for row in csv.reader(open(sys.argv[1])) if row]
headers = [row for row in rows if "rps" in row]
if not headers or "p99_latency_ms" not in headers[0]:
    sys.exit(f"this redis-benchmark reports no percentiles: {rows}")
header, data = headers[0], rows[-1]
row = dict(zip(header, data))
print(f"{row['rps']}\t{row['p50_latency_ms']}\t{row['p99_latency_ms']}\t{sys.argv[2]}")
EOF
}

# The seed's script takes the client's clock (ARGV[4]); redis-benchmark sends one fixed value.
# With 64 clients over $keys keys, each key sees few hits: they are allowed, as with wrk.
run_redis() {
    redis_benchmark "$p_redis" "$1" EVALSHA "$sha" 1 'rl:__rand_int__' 100 10 1 "$(date +%s)"
}

# redis-cell's parameters: a burst of 16, 30 per minute.
run_resp() {
    redis_benchmark "$p_resp" "$1" CL.THROTTLE 'key:__rand_int__' 15 30 60
}

# run_rls CONNECTIONS [PORT]: rls_load with $connections calls in flight over CONNECTIONS HTTP/2
# connections, to PORT (default: ratemeshd's gRPC port).
run_rls() {
    local log=$work/rls_load.log port=${2:-$p_grpc}
    # Time-bounded like wrk: the request count is only a cap.
    timeout $((seconds + 20)) "${load_cpu[@]}" "$rls_load" --addr "127.0.0.1:$port" --domain bench --descriptor-key user \
        --keys "$keys" --concurrency "$connections" --connections "$1" --requests 5000000 --seconds "$seconds" --tsv \
        >"$log" 2>&1 || fail "rls_load failed: $(cat "$log")"
    # --tsv: the last line is requests_per_second<TAB>p50_ms<TAB>p99_ms; decisions ≈ rate × time.
    tail -n 1 "$log" | awk -v seconds="$seconds" -F'\t' '{ printf "%s\t%s\t%s\t%d\n", $1, $2, $3, $1 * seconds }'
}

mkdir -p "$out_dir"
runs=$work/runs.tsv
: >"$runs"
# signal_servers SIGNAL PID: sends SIGNAL to every server but PID.
signal_servers() {
    local pid
    for pid in "$ratemeshd_pid" "$redis_pid" "$throttlecrab_pid" "$rateguard_pid" "$baseline_pid"; do
        [[ -n $pid && $pid != "$2" ]] && kill "-$1" "$pid"
    done
    return 0
}

# measure_path NAME PID COMMAND...: one measurement of NAME (served by PID) into $runs. The other
# servers are stopped (SIGSTOP) meanwhile: idle, they still wake up (a peer's gossip, Redis's
# cron), and pinned those wakeups take slices of the measured server's core (with the peers
# idle on core 0, ratemeshd's HTTP p99 was 1.85 ms; alone, 0.71).
measure_path() {
    local name=$1 row
    shift
    say "round $round/$rounds: $name"
    signal_servers STOP "$1"
    row=$(measure "$@") || fail "$name: the measurement failed"
    signal_servers CONT "$1"
    printf '%s\t%s\t%s\n' "$name" "$round" "$row" >>"$runs"
}

for ((round = 1; round <= rounds; round++)); do
    measure_path "ratemeshd HTTP" "$ratemeshd_pid" run_http
    measure_path "Redis + Lua" "$redis_pid" run_redis 1
    # The floor: a request and its answer, one read and one write, and almost nothing between.
    measure_path "Redis PING (floor)" "$redis_pid" redis_benchmark "$p_redis" 1 PING
    measure_path "ratemeshd RESP CL.THROTTLE" "$ratemeshd_pid" run_resp 1
    measure_path "Redis + Lua P16" "$redis_pid" run_redis 16
    measure_path "ratemeshd RESP CL.THROTTLE P16" "$ratemeshd_pid" run_resp 16
    if [[ -n $rls_load ]]; then
        # As Envoy calls an RLS: many calls in flight on few connections (16 on each of 4).
        measure_path "ratemeshd gRPC RLS" "$ratemeshd_pid" run_rls 4
        # As redis-benchmark and wrk at pipeline 1: one call in flight per connection.
        measure_path "ratemeshd gRPC RLS, 1 call per connection" "$ratemeshd_pid" run_rls "$connections"
    fi
    if [[ -n $rls_load && -n $rls_baseline ]]; then
        measure_path "ratemeshd gRPC RLS (baseline)" "$baseline_pid" run_rls 4 "$p_base_grpc"
        measure_path "ratemeshd gRPC RLS, 1 call per connection (baseline)" "$baseline_pid" run_rls "$connections" "$p_base_grpc"
    fi
    if [[ $peers == 1 ]]; then
        # The same bucket as ratemeshd's "bench" policy: capacity 100, 10 a second.
        measure_path "throttlecrab HTTP" "$throttlecrab_pid" run_http "http://127.0.0.1:$p_tc_http/throttle" \
            '{"key":"user-%d","max_burst":99,"count_per_period":10,"period":1}'
        measure_path "throttlecrab RESP THROTTLE" "$throttlecrab_pid" \
            redis_benchmark "$p_tc_resp" 1 THROTTLE 'key:__rand_int__' 15 30 60
        measure_path "rateguard HTTP" "$rateguard_pid" run_http "http://127.0.0.1:$p_rg_http/v1/check" \
            '{"key":"user-%d"}'
    fi
done
kill -0 "$ratemeshd_pid" || fail "ratemeshd died during the benchmark"
[[ -z $rls_baseline ]] || kill -0 "$baseline_pid" || fail "the baseline ratemeshd died during the benchmark"

placement="load generators and servers on the same cores"
[[ $pinned == 1 ]] && placement="pinned: every server on core 0, every load generator on core 1 (one thread)"
machine="Machine: $(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), $placement, loopback; $(wrk -v 2>&1 | head -n 1 | awk '{ print $1, $2 }'), $(redis-server --version | awk '{ print $1, $3 }'); $connections connections, $keys keys, one token bucket (capacity 100, 10/s) on both sides (CL.THROTTLE: its own, burst 16, 30/min); redis-benchmark -c $connections --threads $load_threads at pipeline 1 (P16: 16); $rounds interleaved rounds, medians."
python3 bench/report.py "$runs" "$machine" | tee "$out_dir/results.md"
cp "$runs" "$out_dir/runs.tsv"
say "written to $out_dir/results.md"
