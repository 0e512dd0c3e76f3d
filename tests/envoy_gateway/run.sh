#!/usr/bin/env bash
# Envoy Gateway's rate limit contract, end to end (issue 43): ratemeshd started as
# /bin/ratelimit with the environment Envoy Gateway gives its rate limit Deployment, against a
# stand-in Envoy Gateway in Python (grpcio; xds-protos for the ADS service): its xDS server
# (mutual TLS, ADS state of the world) pushes RateLimitConfig resources, changes them, sends
# ones to refuse and drops the stream, while RLS calls over mutual TLS check the answers. See
# tests/envoy_gateway/stand_in.py for the steps.
#
#   RATEMESHD=/path/to/ratemeshd bash tests/envoy_gateway/run.sh
#
# Builds nothing: RATEMESHD names the binary (.ci/run passes the static release build the other
# real-client suites share). Needs python3 and openssl (the certificates are made here).
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
script_name=envoy-gateway
cd "$(dirname "$0")/../.."
root=$PWD

pip_timeout_s=600
require_tools python3 openssl timeout
[[ -n ${RATEMESHD:-} && -x ${RATEMESHD:-} ]] || fail "RATEMESHD must name the ratemeshd binary"
RATEMESHD=$(cd "$(dirname "$RATEMESHD")" && pwd)/$(basename "$RATEMESHD")
venv=${ENVOY_GATEWAY_VENV:-$root/target/envoy-gateway-venv}
make_venv "$venv"
pip_install "$venv" "the stand-in's packages (grpcio, xds-protos)" -r tests/envoy_gateway/requirements.txt
make_work
started=$SECONDS
RATEMESHD=$RATEMESHD WORK=$work PYTHONDONTWRITEBYTECODE=1 timeout 300 "$venv/bin/python" tests/envoy_gateway/stand_in.py ||
    fail "the stand-in Envoy Gateway's checks failed (above)"
say "PASS ($((SECONDS - started)) s)"
