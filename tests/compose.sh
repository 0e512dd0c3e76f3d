#!/usr/bin/env bash
# The three-node docker compose cluster (docker-compose.yml), end to end, run by .ci/run:
#
#  1. builds the image FROM scratch (deploy/docker/build-image.sh) and starts the cluster;
#  2. exact mode: 300 checks of one key spread over the three nodes admit exactly the limit (100);
#     approximate mode stays within its bound;
#  3. `docker kill` of node 3: the others see it dead and a fresh key admits at most the reachable
#     fraction of the limit (2/3: the dead member still counts in the cluster size), never a
#     reset to full;
#  4. node 3 restarts and rejoins: three live members, exactly the limit again;
#  5. `docker network disconnect` of node 2 (a partition 2 | 1,3): each side enforces its fraction
#     of the limit (1/3 and 2/3), both sides keep serving;
#  6. reconnects node 2: three live members, exactly the limit again;
#  7. durable quotas: a daily key spent to 40 remaining, then `docker-compose down` (graceful:
#     SIGTERM, every node hands over and writes its last snapshot to its named volume) and `up`:
#     the key has exactly 40 remaining again, asked at every node (never more: a node that has not
#     heard from the owner yet in the first moments answers from its share of the 40).
#
# The bounds are those of docs/protocol.md, "Ownership and shares": an owner enforces
# limit × reachable / (live + dead), rounded down. Every wait is a bounded poll on a condition
# (/readyz, the member view of /v1/cluster). Everything is torn down on exit (`down -v`, the
# network), and any failure exits non-zero. Needs root (nsenter reaches the partitioned node).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
root=$PWD

project=ratemeshci
network=${project}_mesh
limit=100           # the compose-exact and compose-approx policies: 100 per day
wait_s=90           # the bound of every wait
poll_s=0.2          # and its poll interval
declare -A ip=([1]=172.28.0.11 [2]=172.28.0.12 [3]=172.28.0.13)
declare -A isolated=([1]=0 [2]=0 [3]=0)
declare -A cid=()

# --- tools: fail, never skip --------------------------------------------------------------------
require_tools docker
docker info >/dev/null 2>&1 || fail "the docker daemon does not answer"
require_tools curl python3 nsenter
if docker compose version >/dev/null 2>&1; then
    compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null; then
    compose_cmd=(docker-compose)
else
    say "installing docker-compose (Debian)"
    apt_install docker-compose || fail "docker-compose could not be installed from Debian"
    command -v docker-compose >/dev/null || fail "neither 'docker compose' nor docker-compose available"
    compose_cmd=(docker-compose)
fi
compose() { "${compose_cmd[@]}" -p "$project" -f "$root/docker-compose.yml" "$@"; }

workdir=$(mktemp -d)
teardown() {
    local status=$?
    if [[ $status -ne 0 ]]; then
        echo "compose.sh: failed (exit $status); the nodes' last logs:" >&2
        compose logs --no-color --tail=60 >&2 2>&1 || true
    fi
    compose down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true
    docker network rm "$network" >/dev/null 2>&1 || true
    rm -rf "$workdir"
    exit "$status"
}
trap teardown EXIT

# --- talking to a node --------------------------------------------------------------------------
# Nodes are reached at their container address from the host (the bridge is local), except a
# node cut off from the network: it is reached on its own loopback, inside its network namespace.

# node_curl N PATH [curl options...]: curl against node N's HTTP API.
node_curl() {
    local n=$1 path=$2
    shift 2
    if [[ ${isolated[$n]} == 1 ]]; then
        local pid
        pid=$(docker inspect -f '{{.State.Pid}}' "${cid[$n]}")
        nsenter -t "$pid" -n curl "$@" "http://127.0.0.1:8080$path"
    else
        curl "$@" "http://${ip[$n]}:8080$path"
    fi
}

# view N: node N's member view, as `live=1,2,3 dead=- unverified=- counted=3` (fails if not
# answered). A whole view is waited for with counted=3: a member back from the dead (a restart, a
# heal) counts in the owners' limits two retransmission timeouts after it is heard, and until
# then a key begun enforces the reachable 2/3.
view() {
    node_curl "$1" /v1/cluster -sf --max-time 2 | python3 tests/compose/cluster_view.py
}

is_ready() { [[ $(node_curl "$1" /readyz -s -o /dev/null -w '%{http_code}' --max-time 2) == 200 ]]; }
# view_is N REGEX: node N's member view matches REGEX.
view_is() { [[ $(view "$1") =~ $2 ]]; }

# wait_view REGEX NODES...: every node's member view matches REGEX.
wait_view() {
    local regex=$1 n deadline
    shift
    for n in "$@"; do
        deadline=$((SECONDS + wait_s))
        until view_is "$n" "$regex" 2>/dev/null; do
            ((SECONDS < deadline)) ||
                fail "not within ${wait_s}s: node $n sees /$regex/ (it sees: $(view "$n" 2>&1 || true))"
            sleep "$poll_s" # the poll interval of a bounded poll, not a synchronization
        done
        say "ok: node $n sees $(view "$n")"
    done
}

# admitted POLICY KEY PER_NODE NODES...: sends PER_NODE checks of KEY to each of NODES, all
# nodes at once (one keep-alive connection per node, requests in sequence on it); prints how many
# were allowed. Fails unless every check was answered 200.
admitted() {
    local policy=$1 key=$2 per_node=$3 n i
    shift 3
    local body="{\"key\": \"$key\", \"policy\": \"$policy\"}"
    for n in "$@"; do
        (
            # One curl per node; every URL of it is the same POST.
            args=(-s --max-time 30 -X POST -H 'content-type: application/json' --data "$body"
                -w ' HTTP%{http_code}\n')
            if [[ ${isolated[$n]} == 1 ]]; then
                prefix=(nsenter -t "$(docker inspect -f '{{.State.Pid}}' "${cid[$n]}")" -n)
                base=http://127.0.0.1:8080
            else
                prefix=()
                base=http://${ip[$n]}:8080
            fi
            urls=()
            for ((i = 0; i < per_node; i++)); do urls+=("$base/v1/check"); done
            "${prefix[@]}" curl "${args[@]}" "${urls[@]}"
        ) >"$workdir/$key.$n" 2>&1 &
    done
    wait
    local allowed=0 answered
    for n in "$@"; do
        answered=$(grep -c ' HTTP200$' "$workdir/$key.$n" || true)
        [[ $answered == "$per_node" ]] ||
            fail "node $n answered $answered of $per_node checks of $key with 200: $(grep -v ' HTTP200$' "$workdir/$key.$n" | head -3)"
        allowed=$((allowed + $(grep -c '"allowed": *true' "$workdir/$key.$n" || true)))
    done
    echo "$allowed"
}

# expect_between WHAT VALUE MIN MAX
expect_between() {
    local what=$1 value=$2 min=$3 max=$4
    ((value >= min && value <= max)) || fail "$what: $value admitted, expected $min..=$max"
    say "ok: $what: $value admitted (bound $min..=$max)"
}

# --- 1. the cluster -----------------------------------------------------------------------------
say "building the image"
RATEMESHD_IMAGE=ratemeshd:test
export RATEMESHD_IMAGE
IMAGE=$RATEMESHD_IMAGE bash deploy/docker/build-image.sh >/dev/null
image_size=$(docker image inspect -f '{{.Size}}' "$RATEMESHD_IMAGE")
say "image $RATEMESHD_IMAGE: $((image_size / 1024 / 1024)) MiB, $(docker image inspect -f '{{len .RootFS.Layers}}' "$RATEMESHD_IMAGE") layers"

compose down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true # a previous run's leftovers
compose up -d
for n in 1 2 3; do
    cid[$n]=$(compose ps -q "node$n")
    [[ -n ${cid[$n]} ]] || fail "no container for node$n"
    [[ $(docker inspect -f '{{.Config.User}}' "${cid[$n]}") == 65532:65532 ]] || fail "node$n does not run as 65532"
done
for n in 1 2 3; do
    wait_for "node $n ready" is_ready "$n"
    say "ok: node $n ready"
done
wait_view '^live=1,2,3 .* counted=3$' 1 2 3
# The published ports (what a user of docker-compose.yml reaches).
for n in 1 2 3; do
    [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:1808$n/healthz") == 200 ]] ||
        fail "127.0.0.1:1808$n/healthz (published port of node$n) does not answer 200"
done
say "ok: published ports 127.0.0.1:18081-18083 answer"

# --- 2. exact and approximate over three nodes --------------------------------------------------
n=$(admitted compose-exact exact-1 100 1 2 3)
expect_between "exact mode, 300 checks over 3 nodes" "$n" "$limit" "$limit"
# Approximate mode: with every owner reachable, admissions come from allowances held against the
# bucket (never above the limit), except a cold key's first checks on a follower before its first
# grant, which the fallback decides from that follower's local share (limit / 3) and the owner
# debits afterwards. Worst case: the limit plus two local shares. Liveness: at least half.
n=$(admitted compose-approx approx-1 100 1 2 3)
expect_between "approximate mode, 300 checks over 3 nodes" "$n" $((limit / 2)) $((limit + 2 * (limit / 3)))

# Shares of the limit are apportioned by rank so that they sum to the limit (docs/protocol.md,
# "Ownership and shares"): of 100 over three members, 34 / 33 / 33. One share is at most ceil(L/3),
# two at most ceil(2L/3); both sides of a partition together at most L.
one_share=$(((limit + 2) / 3))
two_shares=$(((2 * limit + 2) / 3))

# --- 3. a node killed ---------------------------------------------------------------------------
docker kill "${cid[3]}" >/dev/null
say "killed node 3"
wait_view '^live=1,2 dead=3 ' 1 2
# Exact mode, a fresh key: its owner enforces 2/3 of the limit (2 reachable of 2 live + 1 dead).
n=$(admitted compose-exact after-kill-1 150 1 2)
expect_between "node 3 dead, 300 checks over nodes 1 and 2" "$n" 1 "$two_shares"

# --- 4. the killed node restarts and rejoins ----------------------------------------------------
docker start "${cid[3]}" >/dev/null
say "restarted node 3"
wait_for "node 3 ready again" is_ready 3
say "ok: node 3 ready again"
wait_view '^live=1,2,3 .* counted=3$' 1 2 3
n=$(admitted compose-exact rejoined-1 100 1 2 3)
expect_between "node 3 rejoined, 300 checks over 3 nodes" "$n" "$limit" "$limit"

# --- 5. a partition: node 2 | nodes 1 and 3 -----------------------------------------------------
docker network disconnect "$network" "${cid[2]}"
isolated[2]=1
say "disconnected node 2 from $network"
wait_view '^live=1,3 dead=2 ' 1 3
wait_view '^live=2 dead=1,3 ' 2
# Both sides at once, one fresh key: the majority side enforces 2/3, node 2 alone 1/3.
(admitted compose-exact split-1 75 1 3 >"$workdir/majority") &
majority_pid=$!
minority=$(admitted compose-exact split-1 150 2)
wait "$majority_pid" || fail "the majority side's checks failed"
majority=$(<"$workdir/majority")
expect_between "partition, nodes 1+3 (150 checks)" "$majority" 1 "$two_shares"
expect_between "partition, node 2 alone (150 checks)" "$minority" 1 "$one_share"
expect_between "partition, both sides together" $((majority + minority)) 2 "$limit"

# --- 6. the partition heals ---------------------------------------------------------------------
docker network connect --ip "${ip[2]}" "$network" "${cid[2]}"
isolated[2]=0
say "reconnected node 2"
wait_view '^live=1,2,3 .* counted=3$' 1 2 3
n=$(admitted compose-exact healed-1 100 1 2 3)
expect_between "partition healed, 300 checks over 3 nodes" "$n" "$limit" "$limit"

# --- 7. durable quotas: down and up keeps them -------------------------------------------------
# remaining N KEY: the remaining hits of KEY under compose-exact, asked at node N with cost 0 (an
# exact-mode query is forwarded to the key's owner).
remaining() {
    node_curl "$1" /v1/check -sf --max-time 10 -X POST -H 'content-type: application/json' \
        --data "{\"key\": \"$2\", \"policy\": \"compose-exact\", \"cost\": 0}" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["remaining"])'
}
n=$(admitted compose-exact durable-1 20 1 2 3)
expect_between "durable key, 60 checks over 3 nodes" "$n" 60 60
[[ $(remaining 1 durable-1) == 40 ]] || fail "durable-1: $(remaining 1 durable-1) remaining before down, expected 40"
compose down --timeout 30 # not -v: the named volumes (the quotas) stay
say "docker-compose down (volumes kept)"
compose up -d
for n in 1 2 3; do
    cid[$n]=$(compose ps -q "node$n")
    wait_for "node $n ready after up" is_ready "$n"
done
wait_view '^live=1,2,3 .* counted=3$' 1 2 3
# remaining_back N: whether durable-1 asked at node N is back to its 40, or says more (`left`
# holds the answer). Right after a start a node may not have heard from the key's owner yet: its
# fallback answers with its share of what it restored (fewer), until the owner answers.
remaining_back() {
    left=$(remaining "$1" durable-1) || return 1
    ((left >= 40))
}
for n in 1 2 3; do
    wait_for "durable-1 asked at node $n has its 40 remaining after down and up" remaining_back "$n"
    ((left == 40)) || fail "durable-1 after down and up, asked at node $n: $left remaining, more than the 40 left"
done
say "ok: durable-1 still has 40 of 100 remaining after docker-compose down and up"
for n in 1 2 3; do
    loaded=$(node_curl "$n" /metrics -sf --max-time 2 | grep -c '^ratemesh_snapshot_load{result="loaded"} 1' || true)
    [[ $loaded == 1 ]] || fail "node $n did not load its snapshot: $(node_curl "$n" /metrics -s | grep '^ratemesh_snapshot')"
done
say "ok: every node loaded its snapshot from its volume"

say "PASS"
