#!/usr/bin/env bash
# Envoy's Rate Limit Quota Service, spoken as Envoy's filter speaks it (issue 44, point 5), by a
# client in Python on someone else's generated code (the PyPI xds-protos stubs, grpcio): see
# tests/rlqs/envoy_like.py for the behaviours and the bounds it checks, in Envoy's mode and in a
# spec-literal mode. Starts one ratemeshd (RATEMESHD) on loopback with its own configuration.
#
#   RATEMESHD=/path/to/ratemeshd bash tests/rlqs/run.sh
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
script_name=rlqs
cd "$(dirname "$0")/../.."
root=$PWD

pip_timeout_s=600
wait_s=30
require_tools python3 curl timeout
[[ -n ${RATEMESHD:-} && -x ${RATEMESHD:-} ]] || fail "RATEMESHD must name the ratemeshd binary"
binary=$RATEMESHD
venv=${RLQS_VENV:-$root/target/envoy-gateway-venv} # the same pinned stubs as tests/envoy_gateway
make_venv "$venv"
pip_install "$venv" "grpcio and xds-protos" -r tests/envoy_gateway/requirements.txt
make_work
ratemeshd_ports p_rlqs/tcp
write_config "$work/ratemesh.toml" <<EOF2
[[policies]]
name = "api"
algorithm = "token_bucket"
limit = 1000
period_ms = 1000
burst = 1000

[[rlqs]]
domain = "edge"
policy = "api"
EOF2
ratemeshd_pid=
stop_at_exit ratemeshd_pid
show_at_failure "ratemeshd log" 30 "$work/ratemeshd.log"
start_ratemeshd "$work/ratemesh.toml" RATEMESH_LISTEN_RLQS="127.0.0.1:$p_rlqs"
wait_for "ratemeshd ready" answers "http://127.0.0.1:$p_http/readyz" 200
for mode in envoy spec; do
    PYTHONDONTWRITEBYTECODE=1 timeout 120 "$venv/bin/python" tests/rlqs/envoy_like.py "127.0.0.1:$p_rlqs" "$mode" ||
        fail "the RLQS checks failed in $mode mode (above)"
done
say "PASS"
