#!/usr/bin/env bash
# The WAN harness (tests/wan/README.md): real ratemeshd processes in several regions on loopback,
# the links between regions emulated in user space by a delaying UDP relay (relay.py) in front of
# every node's gossip and QUIC ports, an open-loop HTTP load per region (load.py); prints one JSON
# object (the run's parameters and results) on stdout. Everything it starts is stopped at exit.
#
#   bash tests/wan/run.sh --regions 3 --nodes-per-region 2 --rtt-ms 40,80,120 \
#       --limit 100 --period-ms 1000 --secs 20 --demand 80,10,10 --keys 1 \
#       [--loss 0.01] [--jitter-ms 5] [--partition-region 2@5-12]... [--seed 1] \
#       [--home-region 1] [--region-fallback closed]
#
# --rtt-ms is the upper triangle of the round-trip matrix, row by row: for 3 regions
# 1-2,1-3,2-3. --partition-region R@START-END cuts region R (1-based) off from every other
# region from START to END seconds of the load (repeatable). --home-region R pins the policy's
# home region (1-based; default: a hash of each key), --region-fallback its own fallback (floor,
# last or closed; default: the nodes' last). The binary: RATEMESHD, else a
# release build (`cargo build --release -p ratemeshd`, into CARGO_TARGET_DIR or target/).
# shellcheck source-path=SCRIPTDIR/..
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$(dirname "$0")/../.."
script_name="tests/wan/run.sh"
say_fd=2 # stdout is the JSON report
wait_s=60

usage() {
    echo "usage: $script_name --regions N --nodes-per-region K --rtt-ms A,B,C --limit L --period-ms P" \
        "--secs S --demand D1,D2,... [--keys K] [--loss P] [--jitter-ms J] [--partition-region R@START-END]..." \
        "[--seed N] [--home-region R] [--region-fallback floor|last|closed]" >&2
    exit 2
}

regions="" per_region="" rtt="" limit="" period_ms="" secs="" demand="" keys=1 loss=0 jitter_ms=0 seed=1
home_region="" region_fallback=""
partitions=()
while (($#)); do
    (($# >= 2)) || { echo "$script_name: $1 needs a value" >&2; usage; }
    case $1 in
    --regions) regions=$2 ;;
    --nodes-per-region) per_region=$2 ;;
    --rtt-ms) rtt=$2 ;;
    --limit) limit=$2 ;;
    --period-ms) period_ms=$2 ;;
    --secs) secs=$2 ;;
    --demand) demand=$2 ;;
    --keys) keys=$2 ;;
    --loss) loss=$2 ;;
    --jitter-ms) jitter_ms=$2 ;;
    --partition-region) partitions+=("$2") ;;
    --seed) seed=$2 ;;
    --home-region) home_region=$2 ;;
    --region-fallback) region_fallback=$2 ;;
    *) echo "$script_name: unknown argument '$1'" >&2; usage ;;
    esac
    shift 2
done

# --- arguments: checked, then written as the run's parameters ---------------------------------------
work_params=$(
    python3 - "$regions" "$per_region" "$rtt" "$limit" "$period_ms" "$secs" "$demand" "$keys" "$loss" \
        "$jitter_ms" "$seed" "$home_region" "$region_fallback" ${partitions[@]+"${partitions[@]}"} <<'EOF'
import json, re, sys
(regions, per_region, rtt, limit, period_ms, secs, demand, keys, loss, jitter_ms, seed, home, fallback), partitions = sys.argv[1:14], sys.argv[14:]
def bad(message):
    sys.exit(f"tests/wan/run.sh: {message}")
def whole(name, text, low, high):
    if not re.fullmatch(r"[0-9]+", text or ""):
        bad(f"--{name} must be a whole number, not {text!r}")
    value = int(text)
    if not low <= value <= high:
        bad(f"--{name} {value} is out of range {low}..={high}")
    return value
def number(name, text, low, high):
    try:
        value = float(text)
    except ValueError:
        bad(f"--{name} must be a number, not {text!r}")
    if not low <= value <= high:
        bad(f"--{name} {value} is out of range {low}..={high}")
    return value
n = whole("regions", regions, 1, 8)
k = whole("nodes-per-region", per_region, 1, 8)
pairs = n * (n - 1) // 2
rtts = [whole("rtt-ms", v, 0, 10_000) for v in rtt.split(",")] if rtt else []
if len(rtts) != pairs:
    bad(f"--rtt-ms needs {pairs} values for {n} regions (the upper triangle: 1-2,1-3,...,2-3,...), got {len(rtts)}")
matrix = [[0] * n for _ in range(n)]
it = iter(rtts)
for a in range(n):
    for b in range(a + 1, n):
        matrix[a][b] = matrix[b][a] = next(it)
demands = [number("demand", v, 0, 100_000) for v in demand.split(",")] if demand else []
if len(demands) != n:
    bad(f"--demand needs {n} values (requests/s per region), got {len(demands)}")
cuts = []
for p in partitions:
    m = re.fullmatch(r"([0-9]+)@([0-9.]+)-([0-9.]+)", p)
    if not m:
        bad(f"--partition-region {p!r}: use R@START-END (region 1..{n}, seconds of the load)")
    region, start, end = int(m[1]), float(m[2]), float(m[3])
    if not 1 <= region <= n or not start < end:
        bad(f"--partition-region {p!r}: region 1..{n}, START before END")
    cuts.append({"region": region, "start_s": start, "end_s": end})
params = {
    "regions": n, "nodes_per_region": k, "rtt_ms": matrix,
    "limit": whole("limit", limit, 1, 1_000_000), "period_ms": whole("period-ms", period_ms, 1, 3_600_000),
    "secs": whole("secs", secs, 1, 600), "demand_per_s": demands, "keys": whole("keys", keys, 1, 100_000),
    "loss": number("loss", loss, 0, 1), "jitter_ms": number("jitter-ms", jitter_ms, 0, 10_000),
    "partitions": cuts, "seed": whole("seed", seed, 0, 2**32),
    "home_region": whole("home-region", home, 1, n) if home else None,
    "region_fallback": fallback or None,
}
if fallback and fallback not in ("floor", "last", "closed"):
    bad(f"--region-fallback {fallback!r}: use floor, last or closed")
print(json.dumps(params))
EOF
) || exit 2
read -r region_count per_region secs < <(python3 -c 'import json,sys; p=json.loads(sys.argv[1]); print(p["regions"], p["nodes_per_region"], p["secs"])' "$work_params")
nodes=$((region_count * per_region))

# --- the binary -------------------------------------------------------------------------------------
require_tools python3 curl
if [[ -n ${RATEMESHD:-} ]]; then
    binary=$RATEMESHD
else
    say "building ratemeshd (release)"
    timeout "$build_timeout_s" cargo build --release --locked -p ratemeshd >&2 || fail "cargo build failed"
    binary=${CARGO_TARGET_DIR:-target}/release/ratemeshd
fi
[[ -x $binary ]] || fail "no ratemeshd binary at '$binary'"

make_work
# A signal ends the script through its EXIT trap (which stops everything started here); the
# long waits below are `wait`s, which a signal interrupts at once.
trap 'exit 130' INT
trap 'exit 143' TERM
printf '%s\n' "$work_params" >"$work/params.json"

# --- ports and the relay ----------------------------------------------------------------------------
# Node ID (1..nodes) is in region (ID-1)/per_region (0-based), named region-R (R 1-based).
declare -a http=() gossip=() quic=() relay_gossip=() relay_quic=() node_pids=()
for ((id = 1; id <= nodes; id++)); do
    free_ports p_http/tcp p_gossip/udp p_quic/udp p_rgossip/udp p_rquic/udp
    http[id]=$p_http gossip[id]=$p_gossip quic[id]=$p_quic relay_gossip[id]=$p_rgossip relay_quic[id]=$p_rquic
done
python3 - "$work" "$nodes" "$per_region" "${gossip[*]:1}" "${quic[*]:1}" "${relay_gossip[*]:1}" "${relay_quic[*]:1}" <<'EOF'
import json, sys
work, nodes, per_region = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
gossip, quic, rgossip, rquic = (list(map(int, a.split())) for a in sys.argv[4:8])
p = json.load(open(f"{work}/params.json"))
config = {
    "rtt_ms": p["rtt_ms"], "jitter_ms": p["jitter_ms"], "loss": p["loss"], "seed": p["seed"],
    # The relay numbers regions from 0.
    "partitions": [dict(cut, region=cut["region"] - 1) for cut in p["partitions"]],
    "sources": {}, "listeners": [],
}
for i in range(nodes):
    region = i // per_region
    config["sources"][str(gossip[i])] = region
    config["sources"][str(quic[i])] = region
    config["listeners"].append({"port": rgossip[i], "target": gossip[i], "region": region})
    config["listeners"].append({"port": rquic[i], "target": quic[i], "region": region})
json.dump(config, open(f"{work}/relay.json", "w"))
EOF
python3 tests/wan/relay.py "$work/relay.json" "$work/relay-stats.json" >"$work/relay.log" 2>&1 &
relay_pid=$!
stop_at_exit node_pids relay_pid
show_at_failure "relay log" 20 "$work/relay.log"
wait_for "the relay is ready" grep -q "relay ready" "$work/relay.log"

# --- the nodes ----------------------------------------------------------------------------------------
read -r limit period_ms < <(python3 -c 'import json,sys; p=json.loads(sys.argv[1]); print(p["limit"], p["period_ms"])' "$work_params")
# The policy's own terms between regions, when given: TOML lines of [[policies]].
policy_region=$(python3 - "$work_params" <<'EOF'
import json, sys
p = json.loads(sys.argv[1])
if p["home_region"]:
    print('home_region = "region-%d"' % p["home_region"])
if p["region_fallback"]:
    print('region_fallback = "%s"' % p["region_fallback"])
EOF
)
for ((id = 1; id <= nodes; id++)); do
    region=$(((id - 1) / per_region + 1))
    seeds=""
    ((id == 1)) || seeds="\"127.0.0.1:${relay_gossip[1]}\""
    cat >"$work/node-$id.toml" <<TOML
[node]
id = $id
region = "region-$region"

[listen]
http = "127.0.0.1:${http[id]}"
grpc = "127.0.0.1:0"
gossip = "127.0.0.1:${gossip[id]}"
quic = "127.0.0.1:${quic[id]}"
advertise_gossip = "127.0.0.1:${relay_gossip[id]}"
advertise_quic = "127.0.0.1:${relay_quic[id]}"

[cluster]
cluster_id = "wan"
seeds = [$seeds]
secret = "wan harness: a cluster secret"
gossip_interval_ms = 100

[[policies]]
name = "wan"
algorithm = "token_bucket"
limit = $limit
period_ms = $period_ms
$policy_region
TOML
    env -i PATH="$PATH" TOKIO_WORKER_THREADS=1 "$binary" serve --config "$work/node-$id.toml" >"$work/node-$id.log" 2>&1 &
    node_pids[id]=$!
    show_at_failure "node $id log" 20 "$work/node-$id.log"
done
say "$nodes nodes in $region_count regions started; waiting for the cluster"
for ((id = 1; id <= nodes; id++)); do
    kill -0 "${node_pids[id]}" 2>/dev/null || fail "node $id exited"
    wait_for "node $id ready" answers "http://127.0.0.1:${http[id]}/readyz" 200
    wait_for "node $id sees $nodes live members" live_members_are "${http[id]}" "$nodes"
done
# Every member is listed in its region, through the relays, by every node.
for ((id = 1; id <= nodes; id++)); do
    curl -sf --max-time 2 "http://127.0.0.1:${http[id]}/v1/cluster" >"$work/cluster-$id.json" ||
        fail "GET /v1/cluster of node $id"
    python3 - "$work/cluster-$id.json" "$per_region" <<'EOF' || fail "node $id lists a member in the wrong region"
import json, sys
members = json.load(open(sys.argv[1]))["members"]
per_region = int(sys.argv[2])
wrong = [m for m in members if m["region"] != f"region-{(m['id'] - 1) // per_region + 1}"]
sys.exit(f"{wrong}" if wrong else 0)
EOF
done

# --- the load -----------------------------------------------------------------------------------------
python3 - "$work" "$per_region" "$relay_pid" "${http[*]:1}" <<'EOF'
import json, sys
work, per_region, relay_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
http = sys.argv[4].split()
p = json.load(open(f"{work}/params.json"))
regions = [
    {"name": f"region-{r + 1}", "demand_per_s": p["demand_per_s"][r],
     "nodes": [f"127.0.0.1:{port}" for port in http[r * per_region:(r + 1) * per_region]]}
    for r in range(p["regions"])
]
load = {"regions": regions, "secs": p["secs"], "keys": p["keys"], "limit": p["limit"],
        "period_ms": p["period_ms"], "policy": "wan", "seed": p["seed"], "relay_pid": relay_pid, "params": p}
json.dump(load, open(f"{work}/load.json", "w"))
EOF
say "load: $secs s"
timeout $((secs + 30)) python3 tests/wan/load.py "$work/load.json" >"$work/report.json" &
load_pid=$!
stop_at_exit load_pid
wait "$load_pid" || fail "the load generator failed"
load_pid=""
for ((id = 1; id <= nodes; id++)); do
    kill -0 "${node_pids[id]}" 2>/dev/null || fail "node $id exited during the load"
done
kill -TERM "$relay_pid"
wait "$relay_pid" || true
relay_pid=""
python3 - "$work/report.json" "$work/relay-stats.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
try:
    report["relay"] = json.load(open(sys.argv[2]))
except OSError:
    report["relay"] = None
print(json.dumps(report))
EOF
