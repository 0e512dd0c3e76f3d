#!/usr/bin/env bash
# The hostile suite (issue 39, point 4): abusive HTTP/2 clients against the Envoy RLS (gRPC)
# listener and request-smuggling and framing probes against the HTTP front, each followed by a
# well-behaved client that must still be served, a liveness check and a bound on the daemon's
# resident memory. Black box: the suite speaks only on the wire (and reads /proc/PID/status),
# so it runs against any build of ratemeshd.
#
#   RATEMESHD=/path/to/ratemeshd bash tests/hostile/run.sh [PYTEST_ARGS...]
#
# Builds nothing: RATEMESHD names the binary (.ci/run passes the static release build that the
# real-client suites share). Each case starts its own ratemeshd on free loopback ports with a
# configuration it writes. The packages are pinned (tests/hostile/requirements.txt) and
# installed into a venv under target/ (HOSTILE_VENV to change it). Exits with pytest's status:
# non-zero when a case fails (or when none ran).
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
script_name=hostile
cd "$(dirname "$0")/../.."
root=$PWD

suite_timeout_s=600 # the whole pytest run; every case is bounded well below it
pip_timeout_s=600

require_tools python3 timeout
[[ -n ${RATEMESHD:-} ]] || fail "RATEMESHD must name the ratemeshd binary to attack (this script builds nothing)"
[[ -x $RATEMESHD ]] || fail "RATEMESHD=$RATEMESHD is not an executable"
RATEMESHD=$(cd "$(dirname "$RATEMESHD")" && pwd)/$(basename "$RATEMESHD")

venv=${HOSTILE_VENV:-$root/target/hostile-venv}
make_venv "$venv"
say "installing the pinned packages (h2, hpack, hyperframe, pytest)"
pip_install "$venv" "the hostile suite's packages" -r tests/hostile/requirements.txt

say "attacking $RATEMESHD"
cd tests/hostile
started=$SECONDS
status=0
RATEMESHD=$RATEMESHD PYTHONDONTWRITEBYTECODE=1 timeout "$suite_timeout_s" "$venv/bin/python" -m pytest "$@" || status=$?
say "took $((SECONDS - started)) s"
((status == 0)) || fail "pytest exited with status $status"
say "passed"
