#!/usr/bin/env bash
# ratemeshd's Redis protocol listener ([listen] resp) with real clients this project did not
# write: redis-cli (Debian's redis-tools) and redis-py (PyPI, tests/clients/resp_client.py).
# Both must get redis-cell's CL.THROTTLE answers: redis-cli for a 5-per-minute key with a burst
# of 4 (5 pass, the 6th is refused for 12 s), redis-py for one call on RESP2, one on its default (RESP3) and a pipeline of 100.
#
#   bash tests/resp.sh [RATEMESHD_BINARY]
#
# Without a binary, it runs the static release build that the other real-client scripts share
# (deploy/docker/static-binary.sh). redis-py is pinned (tests/clients/resp_requirements.txt) and
# installed into a venv under target/ (RESP_VENV to change it). A missing tool is a failure,
# never a skip. Every wait is bounded.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
root=$PWD

wait_s=30            # ratemeshd's /readyz
client_timeout_s=60  # each client run
pip_timeout_s=600
build_timeout_s=2400

# --- tools --------------------------------------------------------------------------------------
if ! command -v redis-cli >/dev/null; then
    say "installing redis-tools from Debian"
    apt_install redis-tools || fail "redis-cli is required and could not be installed"
fi
require_tools redis-cli curl python3 timeout
say "$(redis-cli --version)"

venv=${RESP_VENV:-$root/target/resp-venv}
make_venv "$venv"
say "installing the pinned client package (redis-py)"
pip_install "$venv" "redis-py" -r tests/clients/resp_requirements.txt
"$venv/bin/python" -c 'import redis; print("redis-py", redis.__version__)' || fail "redis-py does not import"

ratemeshd_binary "${@:1:1}"

# --- scratch directory, process, cleanup --------------------------------------------------------
ratemeshd_pid=
make_work
stop_at_exit ratemeshd_pid
show_at_failure "ratemeshd log" 40 "$work/ratemeshd.log"

ratemeshd_ports p_resp/tcp

# --- ratemeshd ----------------------------------------------------------------------------------
# No policy: CL.THROTTLE carries its limit. The RESP address comes from the environment.
write_config "$work/ratemesh.toml" </dev/null
start_ratemeshd "$work/ratemesh.toml" RATEMESH_LISTEN_RESP="127.0.0.1:$p_resp"
wait_for "ratemeshd ready on 127.0.0.1:$p_http" answers "http://127.0.0.1:$p_http/readyz" 200
say "ratemeshd ready: RESP on 127.0.0.1:$p_resp"

# --- redis-cli ----------------------------------------------------------------------------------
cli() { timeout "$client_timeout_s" redis-cli -h 127.0.0.1 -p "$p_resp" "$@"; }

[[ $(cli PING) == PONG ]] || fail "redis-cli PING: '$(cli PING)'"
[[ $(cli ECHO hello) == hello ]] || fail "redis-cli ECHO"

# redis-cell's numbers: max_burst 4, 5 per 60 s (T = 12 s, tolerance 60 s, limit 5). Printed by
# redis-cli one integer per line: limited, limit, remaining, retry_after, reset_after.
for hit in 1 2 3 4 5; do
    answer=$(cli CL.THROTTLE cli:key 4 5 60 | tr '\n' ' ')
    expected="0 5 $((5 - hit)) -1 $((12 * hit)) "
    [[ $answer == "$expected" ]] || fail "CL.THROTTLE hit $hit: '$answer', expected '$expected'"
done
answer=$(cli CL.THROTTLE cli:key 4 5 60 | tr '\n' ' ')
[[ $answer == "1 5 0 12 60 " ]] || fail "CL.THROTTLE hit 6: '$answer', expected refused: '1 5 0 12 60 '"
say "redis-cli: PING, ECHO, CL.THROTTLE admits 5 then refuses for 12 s"

answer=$(cli CL.THROTTLE cli:key x 5 60 2>&1)
[[ $answer == *"Couldn't parse as integer: x"* ]] || fail "CL.THROTTLE with a bad integer: '$answer'"

# --- redis-py -----------------------------------------------------------------------------------
timeout "$client_timeout_s" "$venv/bin/python" tests/clients/resp_client.py 127.0.0.1 "$p_resp" ||
    fail "the redis-py client's checks failed"

# Decisions are counted like the HTTP API's inline checks: 6 + 1 + 1 (default protocol) + 100
# CL.THROTTLE, 85 refused.
metrics=$(curl -s --max-time 5 "http://127.0.0.1:$p_http/metrics")
grep -q '^ratemesh_requests_total{policy="inline",decision="allowed"} 23$' <<<"$metrics" ||
    fail "metrics: $(grep 'ratemesh_requests_total' <<<"$metrics")"
grep -q '^ratemesh_requests_total{policy="inline",decision="refused"} 85$' <<<"$metrics" ||
    fail "metrics: $(grep 'ratemesh_requests_total' <<<"$metrics")"
kill -0 "$ratemeshd_pid" 2>/dev/null || fail "ratemeshd died during the test"
say "passed"
