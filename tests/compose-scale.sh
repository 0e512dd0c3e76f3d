#!/usr/bin/env bash
# The scaled compose cluster (deploy/compose/scaled.yml), which behaves like the Kubernetes
# StatefulSet: one service, every replica on the same configuration, seeds = the service's DNS
# name, node ids from Docker's DNS (replica n is node n). Run by .ci/run:
#
#  1. builds the image FROM scratch (deploy/docker/build-image.sh) and starts 3 replicas: each
#     joins by the DNS seed, has the id of its replica number, and every node sees all of them;
#  2. scales 3 -> 5 -> 2 -> 3 (`up --scale`; a shrink stops the highest-numbered replicas with
#     SIGTERM), then restarts every replica in turn (`docker restart`: SIGTERM, start again);
#  3. after every step, with every node seeing the same members, drives keys through every node:
#     - one exact-mode key, 10 checks per node per step: the step admits exactly what is left of
#       the limit (100 in total over the whole run, never more: a reset anywhere would show);
#     - twelve exact-mode keys, one hit per node per step, spread over every owner: every node
#       answers every key's remaining as exactly 100 minus all hits so far, so the keys of a
#       scaled-down or restarted node moved with their counts, never reset;
#     - one approximate-mode key, 10 checks per node per step: its total is asserted loosely
#       (at most twice the limit, at least half of it) and printed per step.
#
# Every wait is a bounded poll on a condition (/readyz, the member view of /v1/cluster). Everything
# is torn down on exit (`down -v`), and any failure exits non-zero.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
root=$PWD

project=ratemeshscale
limit=100           # the scaled-exact and scaled-approx policies: 100 per day
per_node=10         # checks of the hot keys per node per step
spread_keys=$(printf 'spread-%s,' {1..12})
spread_keys=${spread_keys%,}
wait_s=120          # the bound of every wait
poll_s=0.2          # and its poll interval
stop_timeout_s=20   # SIGTERM to SIGKILL at a shrink or restart (a leave takes about 3 s)

# --- tools: fail, never skip --------------------------------------------------------------------
require_tools docker
docker info >/dev/null 2>&1 || fail "the docker daemon does not answer"
require_tools curl python3
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
compose() { "${compose_cmd[@]}" -p "$project" -f "$root/deploy/compose/scaled.yml" "$@"; }
client() { python3 "$root/tests/compose/scale_client.py" "$@"; }

teardown() {
    local status=$?
    if [[ $status -ne 0 ]]; then
        echo "compose-scale.sh: failed (exit $status); the nodes' last logs:" >&2
        compose logs --no-color --tail=40 >&2 2>&1 || true
    fi
    compose down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true
    exit "$status"
}
trap teardown EXIT

# --- the replicas -------------------------------------------------------------------------------
# refresh: the running replicas, by number: `numbers` (sorted), `ip[n]` and `cid[n]`.
declare -A ip=() cid=()
numbers=()
refresh() {
    local id name state address
    ip=() cid=() numbers=()
    for id in $(compose ps -q ratemesh); do
        read -r state name address < <(docker inspect -f \
            '{{.State.Running}} {{.Name}} {{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$id")
        [[ $state == true ]] || continue
        [[ $name =~ _([0-9]+)$ ]] || fail "container $name has no replica number"
        ip[${BASH_REMATCH[1]}]=$address
        cid[${BASH_REMATCH[1]}]=$id
    done
    mapfile -t numbers < <(printf '%s\n' "${!ip[@]}" | sort -n)
}
ips() { local n; for n in "${numbers[@]}"; do printf '%s ' "${ip[$n]}"; done; }
joined() { local IFS=,; echo "${numbers[*]}"; }

is_ready() { [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://${ip[$1]}:8080/readyz") == 200 ]]; }
view_is() { [[ $(curl -sf --max-time 2 "http://${ip[$1]}:8080/v1/cluster" | python3 tests/compose/cluster_view.py) =~ $2 ]]; }

# settle: every running replica is ready, is the node of its replica number, and sees exactly the
# running replicas live (none dead: a shrink and a restart are leaves, not crashes).
settle() {
    local n expected
    refresh
    for n in "${numbers[@]}"; do
        wait_for "replica $n ready" is_ready "$n"
        [[ $(client whoami "${ip[$n]}") == "$n" ]] || fail "replica $n is node $(client whoami "${ip[$n]}")"
    done
    expected="^live=$(joined) dead=- .* counted=${#numbers[@]}$"
    for n in "${numbers[@]}"; do
        wait_for "replica $n sees /$expected/" view_is "$n" "$expected"
    done
    say "ok: replicas $(joined) ready, each node n = replica n, every one sees live=$(joined)"
}

# scale N: the service at N replicas, settled.
scale() {
    local started=$SECONDS
    compose up -d --no-recreate --timeout "$stop_timeout_s" --scale ratemesh="$1" >/dev/null 2>&1 ||
        fail "scaling to $1 failed"
    refresh
    ((${#numbers[@]} == $1)) || fail "scaled to $1 but ${#numbers[@]} replicas run: $(joined)"
    settle
    say "scaled to $1 replicas ($(joined)) in $((SECONDS - started)) s"
}

# --- the keys -----------------------------------------------------------------------------------
exact_admitted=0    # admitted so far of the hot exact-mode key
approx_admitted=0   # and of the approximate-mode key
spread_hits=0       # hits so far of every spread key (all admitted)
checked=0           # checks sent so far of each hot key

# drive WHAT: one round of every key through every running replica, and the bounds.
drive() {
    local what=$1 count=${#numbers[@]} sent got expected left
    # shellcheck disable=SC2046 # ips is a list of words.
    set -- $(ips)
    sent=$((per_node * count))
    left=$((limit - exact_admitted))
    expected=$((sent < left ? sent : left))
    got=$(client admit scaled-exact hot-exact "$per_node" "$@") || fail "$what: checks of hot-exact failed"
    ((got == expected)) ||
        fail "$what: hot-exact admitted $got of $sent, expected exactly $expected ($exact_admitted admitted before)"
    exact_admitted=$((exact_admitted + got))
    [[ $(client remaining scaled-exact hot-exact "$@") == $((limit - exact_admitted)) ]] ||
        fail "$what: nodes disagree on hot-exact's remaining: $(client remaining scaled-exact hot-exact "$@")"

    client hit scaled-exact "$spread_keys" "$@" || fail "$what: a spread key was refused or not answered"
    spread_hits=$((spread_hits + count))
    got=$(client remaining scaled-exact "$spread_keys" "$@") || fail "$what: remaining of the spread keys"
    [[ $got == $((limit - spread_hits)) ]] ||
        fail "$what: spread keys' remaining on the nodes: $got, expected $((limit - spread_hits)) everywhere (a moved key was reset or lost hits)"

    got=$(client admit scaled-approx hot-approx "$per_node" "$@") || fail "$what: checks of hot-approx failed"
    approx_admitted=$((approx_admitted + got))
    checked=$((checked + sent))
    ((approx_admitted <= 2 * limit)) || fail "$what: hot-approx admitted $approx_admitted in total (loose bound $((2 * limit)))"
    say "ok: $what ($count nodes): exact key $exact_admitted admitted of $checked sent (this step exactly $expected), spread keys at $((limit - spread_hits)) left on every node; approximate key $approx_admitted admitted of $checked sent (+$got this step)"
}

# --- 1. three replicas, joined by the DNS seed --------------------------------------------------
say "building the image"
RATEMESHD_IMAGE=ratemeshd:test
export RATEMESHD_IMAGE
IMAGE=$RATEMESHD_IMAGE bash deploy/docker/build-image.sh >/dev/null
compose down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true # a previous run's leftovers
scale 3
drive "3 replicas"

# --- 2. scale up and down ------------------------------------------------------------------------
scale 5
drive "scaled up to 5"
scale 2
drive "scaled down to 2"
scale 3
drive "scaled up to 3"

# --- 3. a rolling restart -----------------------------------------------------------------------
for n in "${numbers[@]}"; do
    started=$SECONDS
    docker restart --time "$stop_timeout_s" "${cid[$n]}" >/dev/null || fail "restarting replica $n failed"
    settle
    say "ok: replica $n restarted and rejoined in $((SECONDS - started)) s"
done
drive "after a rolling restart"

((approx_admitted >= limit / 2)) || fail "approximate mode starved the key: $approx_admitted admitted"
((exact_admitted == limit)) || fail "the exact key admitted $exact_admitted in total, expected the limit $limit"
say "PASS"
