#!/usr/bin/env bash
# The Python package (clients/python) against a real three-node cluster on loopback. Run by .ci/run.
#
# Creates a venv under target/python-venv (pinned PyPI versions: tests/python/requirements.txt),
# installs `pip install ./clients/python`, runs mypy --strict on the package, starts three
# ratemeshd nodes (RATEMESHD, or the static release build of deploy/docker/static-binary.sh) and
# runs pytest (bounded by pytest-timeout and `timeout`) on:
#   clients/python/tests          the client, the middleware, failover, fail-open/closed, errors;
#   tests/python/limits_upstream  the `limits` project's own storage and strategy tests, adapted
#                                 to the ratemesh storage (see its conftest.py);
#   tests/python/test_e2e.py      Flask-Limiter and SlowAPI apps, three processes each pointed at
#                                 a different node, one limit: the total admitted within bounds;
#   tests/python/test_node_killed.py  then, alone: node 3 killed mid-run, no error, within bounds.
# Stops every process it started. Fails, never skips.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$(dirname "$0")/../.."
root=$PWD

wait_s=60
nodes=3
venv=$root/target/python-venv
pytest_timeout_s=${PYTEST_TIMEOUT_S:-900}

require_tools curl python3 timeout
ratemeshd_binary ${RATEMESHD:+"$RATEMESHD"}

make_venv "$venv"
pip_install "$venv" "tests/python/requirements.txt" -r tests/python/requirements.txt
pip_install "$venv" "clients/python" --force-reinstall --no-deps ./clients/python
say "mypy --strict on clients/python/src"
(cd clients/python && "$venv/bin/mypy" src) || fail "mypy found type errors in clients/python"

make_work
start_cluster "$nodes" python <<TOML
[[policies]]
name = "api"
algorithm = "token_bucket"
limit = 5
period_ms = 60000
mode = "exact"

[[policies]]
name = "conc"
algorithm = "concurrency"
limit = 2
period_ms = 60000
TOML
say "$nodes nodes live: $node_list"

export RATEMESH_NODES=$node_list
export RATEMESH_WORK=$work
say "pytest (at most ${pytest_timeout_s}s)"
timeout "$pytest_timeout_s" "$venv/bin/python" -m pytest -p no:cacheprovider -c tests/python/pytest.ini --rootdir=. \
    --timeout=120 -q -rfEx \
    clients/python/tests tests/python/limits_upstream tests/python/test_e2e.py "$@" ||
    fail "pytest failed"

# Last, alone: it kills node 3 (SIGKILL) mid-run.
say "pytest: a node killed mid-run"
export RATEMESH_KILL_PID=${node_pids[3]}
timeout 300 "$venv/bin/python" -m pytest -p no:cacheprovider -c tests/python/pytest.ini --rootdir=. \
    --timeout=120 -q -rfEx tests/python/test_node_killed.py ||
    fail "pytest (a node killed mid-run) failed"
