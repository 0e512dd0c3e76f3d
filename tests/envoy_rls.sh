#!/usr/bin/env bash
# The Envoy Rate Limit Service v3 with a real client this project did not write: the PyPI package
# envoy-data-plane (messages and gRPC stub generated from Envoy's protos) over grpcio calls
# ShouldRateLimit on a ratemeshd process with Envoy-style descriptors, and must see OK until the
# limit, then OVER_LIMIT, with every status filled (tests/clients/envoy_rls_client.py).
#
#   bash tests/envoy_rls.sh [RATEMESHD_BINARY]
#
# Without a binary, it runs the static release build that the other real-client scripts share
# (deploy/docker/static-binary.sh: one release build in CI for all of them). The client's packages
# are pinned (tests/clients/envoy_rls_requirements.txt) and installed into a venv under target/
# (ENVOY_RLS_VENV to change it). A missing tool is a failure, never a skip. Every wait is bounded.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
root=$PWD

wait_s=30            # ratemeshd's /readyz
client_timeout_s=120 # the whole Python client run (each call also has its own 5 s deadline)
pip_timeout_s=600
build_timeout_s=2400

# --- tools --------------------------------------------------------------------------------------
require_tools curl python3 timeout

venv=${ENVOY_RLS_VENV:-$root/target/envoy-rls-venv}
make_venv "$venv"
say "installing the pinned client packages (envoy-data-plane, grpcio)"
pip_install "$venv" "the client packages" -r tests/clients/envoy_rls_requirements.txt
"$venv/bin/python" -c 'import envoy_data_plane.envoy.service.ratelimit.v3 as rls, grpc; rls.RateLimitServiceSyncStub' ||
    fail "envoy-data-plane does not provide envoy.service.ratelimit.v3.RateLimitServiceSyncStub"

ratemeshd_binary "${@:1:1}"

# --- scratch directory, process, cleanup --------------------------------------------------------
ratemeshd_pid=
make_work
stop_at_exit ratemeshd_pid
show_at_failure "ratemeshd log" 40 "$work/ratemeshd.log"

# Four distinct free loopback ports: HTTP and gRPC (TCP), gossip and QUIC (UDP).
ratemeshd_ports

# --- ratemeshd ----------------------------------------------------------------------------------
# The policy file is the operator's; the listeners come from the environment. No RATEMESH_
# variable of the caller's environment may leak in.
start_ratemeshd tests/clients/envoy_policies.toml \
    RATEMESH_LISTEN_HTTP="127.0.0.1:$p_http" RATEMESH_LISTEN_GRPC="127.0.0.1:$p_grpc" \
    RATEMESH_LISTEN_GOSSIP="127.0.0.1:$p_gossip" RATEMESH_LISTEN_QUIC="127.0.0.1:$p_quic"
wait_until "ratemeshd not ready within ${wait_s}s" answers "http://127.0.0.1:$p_http/readyz" 200
say "ratemeshd ready: HTTP 127.0.0.1:$p_http, Envoy RLS gRPC 127.0.0.1:$p_grpc"

# --- the client ---------------------------------------------------------------------------------
timeout "$client_timeout_s" "$venv/bin/python" tests/clients/envoy_rls_client.py --addr "127.0.0.1:$p_grpc" ||
    fail "the envoy-data-plane client's checks failed (status $?)"
kill -0 "$ratemeshd_pid" 2>/dev/null || fail "ratemeshd died during the test"
say "passed"
