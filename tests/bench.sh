#!/usr/bin/env bash
# Benchmark, on this machine and in one run, of three ways to ask "may this request pass?":
#
#  - ratemeshd's HTTP API: `wrk -t2 -c64 -d10s --latency` POSTing /v1/check for one policy and
#    keys spread over BENCH_KEYS (tests/bench/post_check.lua), against a single node;
#  - the seed article's Redis + Lua token bucket (tests/bench/rate_limit.lua, loaded with SCRIPT
#    LOAD), against redis-server from Debian:
#    `redis-benchmark --threads 2 -c 64 EVALSHA <sha> 1 rl:<random key> 100 10 1 <now>`;
#  - ratemeshd's Envoy RLS gRPC path, with the `rls_load` example of the ratemeshd crate, when it
#    exists.
#
# Each measurement runs 3 times, interleaved (HTTP, Redis, gRPC, HTTP, ...), each load at most
# 10 s; the table reports the medians (per column) and the throughput and p99 ratios ratemeshd /
# Redis+Lua, on stdout and in target/bench/results.md. Not run by .ci/run (it measures, it does
# not assert), but bounded and self-contained: installs wrk, redis-server and redis-tools from
# Debian when missing. Load generators and servers share the machine's cores (2 here): no
# pinning, so absolute numbers include that contention, for both sides alike.
#
# Environment: BENCH_ROUNDS (3), BENCH_SECONDS (10, at most 10), BENCH_CONNECTIONS (64),
# BENCH_KEYS (10000), BENCH_REDIS_REQUESTS (200000).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
root=$PWD

rounds=${BENCH_ROUNDS:-3}
seconds=${BENCH_SECONDS:-10}
connections=${BENCH_CONNECTIONS:-64}
keys=${BENCH_KEYS:-10000}
redis_requests=${BENCH_REDIS_REQUESTS:-200000}
out_dir=$root/target/bench
((seconds >= 1 && seconds <= 10)) || { echo "bench.sh: BENCH_SECONDS must be 1..10" >&2; exit 1; }
wait_s=30          # the bound of every wait
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
require_tools wrk redis-server redis-cli redis-benchmark curl python3 cargo timeout

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

# --- processes and cleanup ----------------------------------------------------------------------
ratemeshd_pid=
redis_pid=
make_work
stop_at_exit ratemeshd_pid redis_pid
show_at_failure "ratemeshd log" 20 "$work/ratemeshd.log"

ratemeshd_ports p_redis/tcp

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
start_ratemeshd "$work/ratemesh.toml"
wait_for "ratemeshd ready" answers "http://127.0.0.1:$p_http/readyz" 200

redis-server --bind 127.0.0.1 --port "$p_redis" --save '' --appendonly no --daemonize no \
    --logfile "$work/redis.log" &
redis_pid=$!
wait_for "redis-server up" redis-cli -p "$p_redis" ping
sha=$(redis-cli -p "$p_redis" SCRIPT LOAD "$(cat tests/bench/rate_limit.lua)")
[[ $sha =~ ^[0-9a-f]{40}$ ]] || fail "SCRIPT LOAD answered '$sha'"
# One call by hand: the script runs and allows.
[[ $(redis-cli -p "$p_redis" EVALSHA "$sha" 1 rl:probe 100 10 1 "$(date +%s)" | head -n 1) == 1 ]] ||
    fail "the Lua token bucket did not allow its first call"

# --- one measurement each -------------------------------------------------------------------------
# Each prints: requests_per_second<TAB>p50_ms<TAB>p99_ms

# wrk's "1.23ms" / "456.78us" / "1.02s" → milliseconds.
to_ms() {
    python3 -c '
import re, sys
value, unit = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", sys.argv[1]).groups()
print(float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit])' "$1"
}

run_http() {
    local log=$work/wrk.log
    BENCH_KEYS=$keys timeout $((seconds + 20)) wrk -t2 -c"$connections" -d"${seconds}s" --latency \
        -s tests/bench/post_check.lua "http://127.0.0.1:$p_http/v1/check" >"$log" 2>&1 ||
        fail "wrk failed: $(cat "$log")"
    ! grep -q 'Non-2xx' "$log" || fail "ratemeshd answered errors: $(grep -E 'Non-2xx|Socket errors' "$log")"
    local rps p50 p99
    rps=$(awk '/^Requests\/sec:/ { print $2 }' "$log")
    p50=$(awk '$1 == "50%" { print $2 }' "$log")
    p99=$(awk '$1 == "99%" { print $2 }' "$log")
    [[ -n $rps && -n $p50 && -n $p99 ]] || fail "cannot read wrk's output: $(cat "$log")"
    printf '%s\t%s\t%s\n' "$rps" "$(to_ms "$p50")" "$(to_ms "$p99")"
}

run_redis() {
    local log=$work/redis-benchmark.csv
    # The seed's script takes the client's clock (ARGV[4]); redis-benchmark sends one fixed value.
    # With 64 clients over $keys keys, each key sees few hits: they are allowed, as with wrk.
    # Two client threads, as wrk's -t2.
    timeout 30 redis-benchmark -p "$p_redis" --threads 2 -n "$redis_requests" -c "$connections" -r "$keys" --csv \
        EVALSHA "$sha" 1 'rl:__rand_int__' 100 10 1 "$(date +%s)" >"$log" 2>&1 ||
        fail "redis-benchmark failed: $(cat "$log")"
    python3 - "$log" <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
header, data = rows[0], rows[-1]
if "p99_latency_ms" not in header:
    sys.exit(f"this redis-benchmark reports no percentiles: {rows}")
row = dict(zip(header, data))
print(f"{row['rps']}\t{row['p50_latency_ms']}\t{row['p99_latency_ms']}")
EOF
}

run_rls() {
    local log=$work/rls_load.log
    # Time-bounded like wrk: the request count is only a cap.
    timeout $((seconds + 20)) "$rls_load" --addr "127.0.0.1:$p_grpc" --domain bench --descriptor-key user \
        --keys "$keys" --concurrency "$connections" --requests 5000000 --seconds "$seconds" --tsv \
        >"$log" 2>&1 || fail "rls_load failed: $(cat "$log")"
    # --tsv: the last line is requests_per_second<TAB>p50_ms<TAB>p99_ms
    tail -n 1 "$log"
}

mkdir -p "$out_dir"
runs=$work/runs.tsv
: >"$runs"
for ((round = 1; round <= rounds; round++)); do
    say "round $round/$rounds: ratemeshd HTTP (wrk, ${seconds}s)"
    row=$(run_http) || fail "ratemeshd HTTP: the measurement failed"
    printf 'ratemeshd HTTP\t%s\t%s\n' "$round" "$row" >>"$runs"
    say "round $round/$rounds: Redis + Lua (redis-benchmark, $redis_requests EVALSHA)"
    row=$(run_redis) || fail "Redis + Lua: the measurement failed"
    printf 'Redis + Lua\t%s\t%s\n' "$round" "$row" >>"$runs"
    if [[ -n $rls_load ]]; then
        say "round $round/$rounds: ratemeshd gRPC RLS (rls_load, ${seconds}s)"
        row=$(run_rls) || fail "ratemeshd gRPC RLS: the measurement failed"
        printf 'ratemeshd gRPC RLS\t%s\t%s\n' "$round" "$row" >>"$runs"
    fi
done
kill -0 "$ratemeshd_pid" || fail "ratemeshd died during the benchmark"

machine="Machine: $(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), load generators and servers on the same cores, loopback; $(wrk -v 2>&1 | head -n 1 | awk '{ print $1, $2 }'), $(redis-server --version | awk '{ print $1, $3 }'); $connections connections, $keys keys, one token bucket (capacity 100, 10/s) on both sides; $rounds interleaved rounds, medians."
python3 tests/bench/report.py "$runs" "$machine" | tee "$out_dir/results.md"
cp "$runs" "$out_dir/runs.tsv"
say "written to $out_dir/results.md"
