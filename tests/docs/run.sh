#!/usr/bin/env bash
# Doc-tests: runs every pasteable shell block of README.md and docs/ against a node on the
# embedded default configuration, checks the output they show, and checks relative links.
# The convention (`sh` runs, a `text` block right after it is its output, `sh no-run` is shown
# only) is in tests/docs/doctest.py and docs/README.md.
#
#   RATEMESHD=path/to/ratemeshd bash tests/docs/run.sh     # the binary to test (required)
#   RATEMESHD_CONFIG=FILE                                  # optional: run the node with --config
#                                                          # FILE instead of the embedded default
#
# The node listens on the default ports (HTTP 8080, gRPC 8081, gossip 7946, QUIC 7947 on
# loopback); the script fails if something already answers on 8080. Readiness is polled
# (`GET /readyz`), never slept for. A failing block fails the script with its FILE:LINE.
set -euo pipefail
cd "$(dirname "$0")/../.."

: "${RATEMESHD:?set RATEMESHD to the ratemeshd binary the docs are tested with}"
binary=$(realpath "$RATEMESHD")
[ -x "$binary" ] || { echo "docs: $binary is not executable" >&2; exit 1; }
need() {
    command -v "$1" >/dev/null && return
    echo "docs: installing $1" >&2
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >&2
    command -v "$1" >/dev/null || { echo "docs: $1 is required and missing" >&2; exit 1; }
}
need curl
need python3

files=(README.md ARCHITECTURE.md simulations/README.md bench/README.md)
while IFS= read -r f; do files+=("$f"); done < <(find docs -name '*.md' | sort)

# Links first: cheap, and they need no node.
python3 tests/docs/doctest.py --links-only "${files[@]}"

if curl -s -o /dev/null --max-time 1 127.0.0.1:8080/healthz; then
    echo "docs: something already answers on 127.0.0.1:8080; stop it first" >&2
    exit 1
fi

work=$(mktemp -d)
mkdir "$work/bin"
ln -s "$binary" "$work/bin/ratemeshd"
config_args=()
[ -n "${RATEMESHD_CONFIG:-}" ] && config_args=(--config "$(realpath "$RATEMESHD_CONFIG")")

started=$SECONDS
"$binary" "${config_args[@]}" >"$work/node.log" 2>&1 &
node_pid=$!
stop_node() {
    kill "$node_pid" 2>/dev/null || true
    wait "$node_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap stop_node EXIT

# Ready within 30 s (polled every 50 ms), or fail with its log.
deadline=$((SECONDS + 30))
until curl -sf -o /dev/null --max-time 1 127.0.0.1:8080/readyz; do
    if ! kill -0 "$node_pid" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
        echo "docs: the node did not become ready; its log:" >&2
        cat "$work/node.log" >&2
        exit 1
    fi
    sleep 0.05
done

# Blocks run in this order: README.md first (its quick start counts on a fresh node), then docs/.
run_files=(README.md)
while IFS= read -r f; do run_files+=("$f"); done < <(find docs -name '*.md' -not -path 'docs/history/*' | sort)
status=0
PATH="$work/bin:$PATH" python3 tests/docs/doctest.py "${run_files[@]}" || status=$?
if [ $status -ne 0 ]; then
    echo "--- the node's log" >&2
    tail -n 30 "$work/node.log" >&2
fi
echo "docs: $((SECONDS - started)) s with the node up"
exit $status
