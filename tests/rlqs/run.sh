#!/usr/bin/env bash
# Envoy's Rate Limit Quota Service, spoken as Envoy's filter speaks it (issue 44, point 5), by a
# client in Python on someone else's generated code (the PyPI xds-protos stubs, grpcio): see
# tests/rlqs/envoy_like.py for the behaviours and the bounds it checks, in Envoy's mode and in a
# spec-literal mode. Runs them against one ratemeshd (RATEMESHD) on loopback, then against a
# three-node cluster whose Envoys each speak to another node (the limit shared through the key's
# owner, rlqs::fleet), last killing the key's owner.
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
policies='[[policies]]
name = "api"
algorithm = "token_bucket"
limit = 1000
period_ms = 1000
burst = 1000

[[rlqs]]
domain = "edge"
policy = "api"'
envoy_like() { PYTHONDONTWRITEBYTECODE=1 timeout 180 "$venv/bin/python" tests/rlqs/envoy_like.py "$@"; }

ratemeshd_ports p_rlqs/tcp
write_config "$work/ratemesh.toml" <<<"$policies"
ratemeshd_pid=
stop_at_exit ratemeshd_pid
show_at_failure "ratemeshd log" 30 "$work/ratemeshd.log"
start_ratemeshd "$work/ratemesh.toml" RATEMESH_LISTEN_RLQS="127.0.0.1:$p_rlqs"
wait_for "ratemeshd ready" answers "http://127.0.0.1:$p_http/readyz" 200
for mode in envoy spec; do
    envoy_like "127.0.0.1:$p_rlqs" "$mode" || fail "the RLQS checks failed in $mode mode (above)"
done
kill "$ratemeshd_pid" && wait "$ratemeshd_pid" || true
ratemeshd_pid=

say "a three-node cluster, the fleet syncing every 100 ms"
cluster_rlqs=1 start_cluster 3 rlqs <<<"[rls]
rlqs_sync_interval_ms = 100

$policies"
addresses=$(printf '127.0.0.1:%s,' "${rlqs[@]:1}")
ports=$(printf '%s,' "${http[@]:1}")
pids=$(printf '%s,' "${node_pids[@]:1}")
envoy_like "${addresses%,}" spec "${ports%,}" || fail "the RLQS checks failed on three nodes in spec mode (above)"
envoy_like "${addresses%,}" envoy "${ports%,}" "${pids%,}" ||
    fail "the RLQS checks failed on three nodes in envoy mode (above)"
say "PASS"
