# Helpers shared by the real-client shell suites (tests/envoy_rls.sh, tests/metrics.sh,
# tests/nginx.sh, bench/run.sh, bench/cluster.sh, tests/compose.sh). Sourced, never run:
#
#   set -euo pipefail
#   source "$(dirname "$0")/lib.sh"        # bench/*.sh: "$(dirname "$0")/../tests/lib.sh"
#   cd "$(dirname "$0")/.."
#
# The scripts run it under `set -euo pipefail`, but no function here relies on `set -e` (which
# bash turns off inside a function called from a condition or an `||` list): each one fails
# loudly, through `fail`, on its own, except `apt_install`, which returns apt-get's status for
# its caller to judge (a fallback package, then a check that fails). Nothing here skips.
#
# Settings, as variables of the sourcing script:
#   script_name      the prefix of every message (default: the script's file name, e.g. nginx.sh)
#   say_fd           where `say` writes (default 1; bench/run.sh's stdout is its results: 2)
#   wait_s           the bound, in seconds, of `wait_for` and `wait_until` (no default: required)
#   poll_s           their poll interval (default 0.1)
#   pip_timeout_s    the bound of `pip_install` (default 600)
#   build_timeout_s  the bound of the static release build (default 2400)
# Sourcing sets the defaults; a script changes them after sourcing.

script_name=$(basename -- "$0")
say_fd=1
poll_s=0.1
pip_timeout_s=600
build_timeout_s=2400

fail() { echo "$script_name: FAIL: $*" >&2; exit 1; }
say() { printf '%s: %s\n' "$script_name" "$*" >&"$say_fd"; }

# require_tools TOOL...: fails unless every TOOL is on PATH.
require_tools() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || fail "$tool is required and missing"
    done
}

# apt_install PACKAGE...: installs the Debian packages. Returns apt-get's status: the caller
# follows it with `|| fail ...`, or with a fallback and then a check that fails.
apt_install() {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

# make_venv DIR: a Python venv in DIR, created when DIR/bin/python is missing (installing Debian's
# python3-venv when `python3 -m venv` fails: Debian ships it separately).
make_venv() {
    local venv=$1
    [[ -x $venv/bin/python ]] && return 0
    say "creating a Python venv in $venv"
    mkdir -p "$(dirname "$venv")" || fail "cannot create $(dirname "$venv")"
    if ! python3 -m venv "$venv"; then
        say "python3 -m venv failed: installing python3-venv from Debian"
        rm -rf "$venv"
        apt_install python3-venv || fail "python3-venv is required and could not be installed"
        python3 -m venv "$venv" || fail "cannot create a Python venv in $venv"
    fi
}

# pip_install VENV WHAT PIP_ARGS...: `pip install -q PIP_ARGS` into VENV, at most $pip_timeout_s
# seconds; fails "pip install of WHAT failed".
pip_install() {
    local venv=$1 what=$2
    shift 2
    timeout "$pip_timeout_s" "$venv/bin/python" -m pip install --disable-pip-version-check -q "$@" ||
        fail "pip install of $what failed"
}

# ratemeshd_binary [PATH]: sets `binary` to PATH or, without one, to the static release build
# that the real-client scripts share (deploy/docker/static-binary.sh, at most $build_timeout_s
# seconds; run from the repository root). Fails unless the result is executable.
ratemeshd_binary() {
    if (($#)); then
        binary=$1
    else
        binary=$(timeout "$build_timeout_s" bash deploy/docker/static-binary.sh | tail -n 1) ||
            fail "building ratemeshd failed"
    fi
    [[ -x $binary ]] || fail "no ratemeshd binary at '$binary'"
}

# free_ports NAME/KIND...: distinct free loopback ports (KIND tcp or udp), one per NAME, each
# stored in the variable NAME. All are held at once while they are picked, so no two are equal,
# whatever their kinds.
free_ports() {
    local lib_spec lib_kinds=() lib_names=() lib_ports=() lib_out lib_i
    for lib_spec in "$@"; do
        [[ $lib_spec =~ ^([A-Za-z_][A-Za-z0-9_]*)/(tcp|udp)$ ]] || fail "free_ports: bad spec '$lib_spec' (NAME/tcp or NAME/udp)"
        lib_names+=("${BASH_REMATCH[1]}")
        lib_kinds+=("${BASH_REMATCH[2]}")
    done
    lib_out=$(python3 - "${lib_kinds[@]}" <<'EOF'
import socket, sys
kinds = sys.argv[1:]
ports, held = [], []
while len(ports) < len(kinds):
    kind = socket.SOCK_DGRAM if kinds[len(ports)] == "udp" else socket.SOCK_STREAM
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    held.append(s)
    if s.getsockname()[1] not in ports:
        ports.append(s.getsockname()[1])
print(*ports)
EOF
    ) || fail "cannot pick free loopback ports"
    read -r -a lib_ports <<<"$lib_out"
    ((${#lib_ports[@]} == ${#lib_names[@]})) || fail "free_ports: wanted ${#lib_names[@]} ports, got '$lib_out'"
    for lib_i in "${!lib_names[@]}"; do
        printf -v "${lib_names[lib_i]}" '%s' "${lib_ports[lib_i]}"
    done
}

# ratemeshd_ports [NAME/KIND...]: free ports for ratemeshd's four listeners, in p_http and
# p_grpc (TCP), p_gossip and p_quic (UDP), and for any NAME/KIND after them (see free_ports).
ratemeshd_ports() {
    free_ports p_http/tcp p_grpc/tcp p_gossip/udp p_quic/udp "$@"
}

# write_config FILE: writes FILE, a ratemeshd configuration: its [listen] section on 127.0.0.1
# and the ports of ratemeshd_ports, then a blank line and stdin (the policies, ...).
write_config() {
    {
        printf '[listen]\n'
        printf 'http = "127.0.0.1:%s"\n' "$p_http"
        printf 'grpc = "127.0.0.1:%s"\n' "$p_grpc"
        printf 'gossip = "127.0.0.1:%s"\n' "$p_gossip"
        printf 'quic = "127.0.0.1:%s"\n' "$p_quic"
        printf '\n'
        cat
    } >"$1" || fail "cannot write $1"
}

# start_ratemeshd CONFIG [NAME=VALUE...]: starts `$binary serve --config CONFIG` in the
# background, its output in $work/ratemeshd.log, its pid in ratemeshd_pid. Its environment is
# PATH and the NAME=VALUE pairs only: no RATEMESH_ variable of the caller's may leak in.
start_ratemeshd() {
    local config=$1
    shift
    env -i PATH="$PATH" "$@" "$binary" serve --config "$config" >"$work/ratemeshd.log" 2>&1 &
    ratemeshd_pid=$!
}

# start_cluster N NAME: starts N ratemeshd nodes (ids 1 to N) of cluster NAME on loopback, node 1
# the seed of the others, gossiping every 100 ms. Node ID's configuration is $work/node-ID.toml:
# its [listen] section, [node] and [cluster], then stdin (the policies, ...); its log is
# $work/node-ID.log (shown at failure). With cluster_rlqs=1, each node also serves RLQS on
# rlqs[ID]; with cluster_env=(NAME=VALUE...), each node's environment also holds those pairs.
# Sets http[ID], gossip[ID], node_pids[ID] (stopped at exit) and node_list ("127.0.0.1:HTTP,..."),
# then waits until every node is ready and sees N live members.
start_cluster() {
    local count=$1 name=$2 id seeds config
    config=$(cat)
    declare -ga http=() gossip=() rlqs=() node_pids=()
    node_list=""
    stop_at_exit node_pids
    for ((id = 1; id <= count; id++)); do
        if [[ -n ${cluster_rlqs:-} ]]; then ratemeshd_ports p_rlqs/tcp; else ratemeshd_ports; fi
        http[id]=$p_http
        gossip[id]=$p_gossip
        rlqs[id]=${p_rlqs:-}
        seeds=""
        ((id == 1)) || seeds="\"127.0.0.1:${gossip[1]}\""
        write_config "$work/node-$id.toml" <<TOML
[node]
id = $id

[cluster]
cluster_id = "$name"
seeds = [$seeds]
secret = "$name test: a cluster secret"
gossip_interval_ms = 100

$config
TOML
        env -i PATH="$PATH" ${cluster_rlqs:+RATEMESH_LISTEN_RLQS="127.0.0.1:${rlqs[id]}"} \
            ${cluster_env[@]+"${cluster_env[@]}"} "$binary" serve --config "$work/node-$id.toml" >"$work/node-$id.log" 2>&1 &
        node_pids[id]=$!
        show_at_failure "node $id log" 30 "$work/node-$id.log"
        node_list+="${node_list:+,}127.0.0.1:${http[id]}"
    done
    for ((id = 1; id <= count; id++)); do
        wait_for "node $id ready" answers "http://127.0.0.1:${http[id]}/readyz" 200
        wait_for "node $id sees $count live members" live_members_are "${http[id]}" "$count"
    done
}

# live_members_are HTTP_PORT N: the node on HTTP_PORT sees N live members.
live_members_are() {
    [[ $(curl -sf --max-time 2 "http://127.0.0.1:$1/v1/cluster" |
        python3 -c 'import json,sys; print(sum(m["status"] == "live" for m in json.load(sys.stdin)["members"]))') == "$2" ]]
}

# answers URL CODE: URL answers HTTP status CODE (within 2 s).
answers() { [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1") == "$2" ]]; }

# header FILE NAME: a response header's value from a curl -D dump (NAME in lower case).
header() { tr -d '\r' <"$1" | awk -F': *' -v name="$2" 'tolower($1) == name { print $2 }'; }

# wait_until MESSAGE COMMAND...: polls COMMAND (its output discarded) every $poll_s seconds until
# it succeeds; fails with MESSAGE after $wait_s seconds, and with "ratemeshd exited" as soon as
# a ratemeshd started here ($ratemeshd_pid, when set) is gone.
wait_until() {
    local message=$1 bound=${wait_s:?wait_s, the bound of every wait, is not set}
    local deadline=$((SECONDS + bound))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "$message"
        [[ -z ${ratemeshd_pid:-} ]] || kill -0 "$ratemeshd_pid" 2>/dev/null || fail "ratemeshd exited"
        sleep "$poll_s" # the poll interval of a bounded poll, not a synchronization
    done
}

# wait_for WHAT COMMAND...: wait_until, failing "not within ${wait_s}s: WHAT".
wait_for() {
    local what=$1
    shift
    wait_until "not within ${wait_s:?wait_s, the bound of every wait, is not set}s: $what" "$@"
}

# --- scratch directory and cleanup ----------------------------------------------------------------
lib_stop=() # names of the variables that hold the pids to stop at exit, in this order
lib_logs=() # "LINES|FILE|TITLE" of the logs to show when the script fails

# stop_at_exit VARIABLE...: at exit, kill and reap the processes whose pids VARIABLE (a scalar or
# an array) holds then (nothing when it is empty: a script that stopped a process clears it).
stop_at_exit() { lib_stop+=("$@"); }

# show_at_failure TITLE LINES FILE: on a failed exit, the last LINES lines of FILE, on stderr,
# under "--- TITLE ---".
show_at_failure() { lib_logs+=("$2|$3|$1"); }

# make_work: a scratch directory in `work`, and the EXIT trap: stop the processes of
# stop_at_exit, show the logs of show_at_failure when the exit status is not 0, remove `work`,
# exit with the script's status.
make_work() {
    work=$(mktemp -d) || fail "mktemp -d failed"
    trap lib_exit EXIT
}

lib_exit() {
    local status=$? variable pid entry lines file title
    for variable in "${lib_stop[@]}"; do
        # A variable holds one pid, or an array of them (start_cluster's node_pids).
        eval "local -a lib_pids=(\"\${${variable}[@]}\")"
        for pid in "${lib_pids[@]}"; do
            [[ -n $pid ]] || continue
            kill "$pid" 2>/dev/null || true
            # A process stopped by SIGSTOP (bench/run.sh quiets idle servers) acts on it once continued.
            kill -CONT "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        done
    done
    if [[ $status -ne 0 ]]; then
        for entry in "${lib_logs[@]}"; do
            IFS='|' read -r lines file title <<<"$entry"
            echo "--- $title ---" >&2
            tail -n "$lines" "$file" >&2 2>/dev/null || true
        done
    fi
    rm -rf "$work"
    exit "$status"
}
