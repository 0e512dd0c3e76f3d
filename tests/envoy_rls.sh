#!/usr/bin/env bash
# The Envoy Rate Limit Service v3 with a real client this project did not write: the PyPI package
# envoy-data-plane (messages and gRPC stub generated from Envoy's protos) over grpcio calls
# ShouldRateLimit on a ratemeshd process with Envoy-style descriptors, and must see OK until the
# limit, then OVER_LIMIT, with every status filled (tests/clients/envoy_rls_client.py).
#
#   bash tests/envoy_rls.sh [RATEMESHD_BINARY]
#
# Without a binary, it runs the static release build that the other real-client scripts share
# (tests/docker/static-binary.sh: one release build in CI for all of them). The client's packages
# are pinned (tests/clients/envoy_rls_requirements.txt) and installed into a venv under target/
# (ENVOY_RLS_VENV to change it). A missing tool is a failure, never a skip. Every wait is bounded.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

ready_wait_s=30      # ratemeshd's /readyz
client_timeout_s=120 # the whole Python client run (each call also has its own 5 s deadline)
pip_timeout_s=600
build_timeout_s=2400

fail() { echo "envoy_rls.sh: FAIL: $*" >&2; exit 1; }
say() { printf 'envoy_rls.sh: %s\n' "$*"; }

# --- tools --------------------------------------------------------------------------------------
for tool in curl python3 timeout; do
    command -v "$tool" >/dev/null || fail "$tool is required and missing"
done

venv=${ENVOY_RLS_VENV:-$root/target/envoy-rls-venv}
if [[ ! -x $venv/bin/python ]]; then
    say "creating a Python venv in $venv"
    mkdir -p "$(dirname "$venv")"
    if ! python3 -m venv "$venv"; then
        # Debian's python3 ships venv separately.
        say "python3 -m venv failed: installing python3-venv from Debian"
        rm -rf "$venv"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv ||
            fail "python3-venv is required and could not be installed"
        python3 -m venv "$venv" || fail "cannot create a Python venv in $venv"
    fi
fi
say "installing the pinned client packages (envoy-data-plane, grpcio)"
timeout "$pip_timeout_s" "$venv/bin/python" -m pip install --disable-pip-version-check -q \
    -r tests/clients/envoy_rls_requirements.txt || fail "pip install of the client packages failed"
"$venv/bin/python" -c 'import envoy_data_plane.envoy.service.ratelimit.v3 as rls, grpc; rls.RateLimitServiceSyncStub' ||
    fail "envoy-data-plane does not provide envoy.service.ratelimit.v3.RateLimitServiceSyncStub"

if [[ $# -ge 1 ]]; then
    binary=$1
else
    binary=$(timeout "$build_timeout_s" bash tests/docker/static-binary.sh | tail -n 1) ||
        fail "building ratemeshd failed"
fi
[[ -x $binary ]] || fail "no ratemeshd binary at '$binary'"

# --- scratch directory, process, cleanup --------------------------------------------------------
work=$(mktemp -d)
ratemeshd_pid=
cleanup() {
    local status=$?
    if [[ -n $ratemeshd_pid ]]; then
        kill "$ratemeshd_pid" 2>/dev/null || true
        wait "$ratemeshd_pid" 2>/dev/null || true
    fi
    if [[ $status -ne 0 ]]; then
        echo "--- ratemeshd log ---" >&2
        tail -n 40 "$work/ratemeshd.log" >&2 2>/dev/null || true
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

# Four distinct free loopback ports: HTTP and gRPC (TCP), gossip and QUIC (UDP).
read -r p_http p_grpc p_gossip p_quic < <(python3 - <<'PY'
import socket
ports, held = [], []
while len(ports) < 4:
    kind = socket.SOCK_DGRAM if len(ports) >= 2 else socket.SOCK_STREAM
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    held.append(s)
    if s.getsockname()[1] not in ports:
        ports.append(s.getsockname()[1])
print(*ports)
PY
)

# --- ratemeshd ----------------------------------------------------------------------------------
# The policy file is the operator's; the listeners come from the environment. No RATEMESH_
# variable of the caller's environment may leak in.
env -i PATH="$PATH" \
    RATEMESH_LISTEN_HTTP="127.0.0.1:$p_http" RATEMESH_LISTEN_GRPC="127.0.0.1:$p_grpc" \
    RATEMESH_LISTEN_GOSSIP="127.0.0.1:$p_gossip" RATEMESH_LISTEN_QUIC="127.0.0.1:$p_quic" \
    "$binary" serve --config tests/clients/envoy_policies.toml >"$work/ratemeshd.log" 2>&1 &
ratemeshd_pid=$!

deadline=$((SECONDS + ready_wait_s))
until [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$p_http/readyz") == 200 ]]; do
    ((SECONDS < deadline)) || fail "ratemeshd not ready within ${ready_wait_s}s"
    kill -0 "$ratemeshd_pid" 2>/dev/null || fail "ratemeshd exited"
    sleep 0.1 # the poll interval of a bounded poll, not a synchronization
done
say "ratemeshd ready: HTTP 127.0.0.1:$p_http, Envoy RLS gRPC 127.0.0.1:$p_grpc"

# --- the client ---------------------------------------------------------------------------------
timeout "$client_timeout_s" "$venv/bin/python" tests/clients/envoy_rls_client.py --addr "127.0.0.1:$p_grpc" ||
    fail "the envoy-data-plane client's checks failed (status $?)"
kill -0 "$ratemeshd_pid" 2>/dev/null || fail "ratemeshd died during the test"
say "passed"
