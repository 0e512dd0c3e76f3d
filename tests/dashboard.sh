#!/usr/bin/env bash
# The dashboard (GET /) in a real headless browser, Debian's chromium. Run by .ci/run.
#
# Starts a three-node cluster of ratemeshd on loopback (the static release build the other
# real-client scripts share, or RATEMESHD_BIN), sends checks through all three nodes (three
# abusive keys among 600 normal ones), waits until GET /v1/audit on node 3 answers, in the shape
# the page reads (tests/dashboard/audit_check.py), with every node and complete windows of the
# policy "search" (ten keys checked steadily), and then:
#   1. `chromium --headless --dump-dom` of node 2's page must contain the members, the abusive
#      keys and the audit panel's row of "search" with its figures once its scripts ran (virtual
#      time budget);
#   2. tests/dashboard/cdp_check.py drives chromium over the DevTools protocol (standard library
#      only): no console error or warning, no exception, no request outside the node, the members
#      live with ring shares, the abusive keys first, a chart drawn, the audit panel's rows (search's
#      figures, the mark over the 2 % bound exactly where over-admission exceeds it, the worst
#      keys with their owners), the page refreshed itself, accessibility basics; it writes a
#      screenshot to target/dashboard.png.
# Installs chromium with apt-get when missing; fails, never skips.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
root=$PWD

wait_s=60
nodes=3
screenshot=${DASHBOARD_SCREENSHOT:-$root/target/dashboard.png}

require_tools curl python3
if ! command -v chromium >/dev/null; then
    say "installing chromium"
    apt_install chromium || fail "chromium is required and could not be installed"
fi
require_tools chromium

ratemeshd_binary ${RATEMESHD_BIN:+"$RATEMESHD_BIN"}

make_work
chromium_pid=
stop_at_exit chromium_pid
cluster_rlqs=1 start_cluster "$nodes" dashboard <<TOML
[[policies]]
name = "api"
algorithm = "token_bucket"
limit = 20
period_ms = 86400000
mode = "approximate"

# Per second: the audit's ideal forgets a window's history within a window (api's, a day
# long, keeps a key's windows incomplete for a day after its first, partial one).
[[policies]]
name = "search"
algorithm = "token_bucket"
limit = 20
period_ms = 1000
mode = "approximate"

[[policies]]
name = "login"
algorithm = "fixed_window"
limit = 5
period_ms = 60000

[[rlqs]]
domain = "edge"
policy = "api"
TOML
say "$nodes nodes live"

# Load: every normal key twice, each abusive key 60 times, spread over the nodes, in batches;
# then ten keys steadily for 3 s.
python3 - "${http[@]:1}" <<'PY' || fail "sending the checks failed"
import json, sys, time, urllib.request
ports = sys.argv[1:]
checks = []
for i in range(600):
    checks += [("api", f"user-{i}"), ("api", f"user-{i}")]
    if i % 10 == 0:
        checks += [("api", key) for key in ("abuser-a", "abuser-b", "abuser-c") for _ in range(1)]
for key in ("abuser-a", "abuser-b", "abuser-c"):
    checks += [("login", key)] * 8
for start in range(0, len(checks), 50):
    port = ports[(start // 50) % len(ports)]
    body = json.dumps([{"policy": p, "key": k} for p, k in checks[start:start + 50]]).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/check/batch", body, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200, answer.status
# Then ten keys of search steadily for 4 s, through every node: a key's first window (partial)
# and the next (within the ideal's memory of it) are incomplete, the later ones complete, with
# every hit admitted (10/s against 20/s).
rounds = 40
for r in range(rounds):
    body = json.dumps([{"policy": "search", "key": f"steady-{k}"} for k in range(10)]).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{ports[r % len(ports)]}/v1/check/batch", body, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200, answer.status
    time.sleep(0.1)  # the pace of a steady load, not a synchronization
print(f"{len(checks) + rounds * 10} checks sent")
PY

page="http://127.0.0.1:${http[2]}/"
bytes=$(curl -sf --max-time 5 "$page" | wc -c) || fail "GET / failed"
say "GET / : $bytes bytes"
((bytes < 32768)) || fail "the page is $bytes bytes (over 32 KiB)"
top=$(curl -sf --max-time 5 "http://127.0.0.1:${http[3]}/v1/top?policy=api&n=3") || fail "GET /v1/top failed"
say "GET /v1/top on node 3: $top"

# The audit: search's 1 s windows close about a second after they end (a settle time); the figures
# cover the last minute, so the page sees them for a minute after the load.
audit_url="http://127.0.0.1:${http[3]}/v1/audit?n=5"
audit_ready() {
    local code
    code=$(curl -s --max-time 5 -o "$work/audit.json" -w '%{http_code}' "$audit_url") || code=000
    if [[ $code != 200 ]]; then
        echo "GET /v1/audit: HTTP $code" >"$work/audit.why"
        return 1
    fi
    python3 tests/dashboard/audit_check.py "$work/audit.json" "$nodes" search >"$work/audit.summary" 2>"$work/audit.why"
}
deadline=$((SECONDS + wait_s))
until audit_ready; do
    status=$?
    ((status != 3)) || fail "$(cat "$work/audit.why")"
    ((SECONDS < deadline)) || fail "not within ${wait_s}s: the audit of search on node 3: $(cat "$work/audit.why")"
    sleep "$poll_s" # the poll interval of a bounded poll
done
say "GET /v1/audit on node 3: $(cat "$work/audit.summary")"

chromium_flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run
    --no-default-browser-check --disable-background-networking --disable-component-update
    --disable-sync --disable-extensions --metrics-recording-only --user-data-dir="$work/chromium")

# 1. --dump-dom: the DOM once the page's scripts ran.
timeout 60 chromium "${chromium_flags[@]}" --virtual-time-budget=8000 --dump-dom "$page" \
    >"$work/dom.html" 2>"$work/chromium-dump.log" || fail "chromium --dump-dom failed: $(tail -5 "$work/chromium-dump.log")"
for expected in abuser-a abuser-b abuser-c '(this node)' '>live<' 'RLQS streams: 0'; do
    grep -qF -- "$expected" "$work/dom.html" || fail "the dumped DOM lacks '$expected'"
done
# The audit panel's row of search: the policy, a window, admitted / ideal, two percentages, a ratio.
audit_row='<tr( class="over-bound")?><td>search</td><td class="num">[0-9.]+ (ms|s|min|h)</td><td class="num">[1-9][0-9]* / [1-9][0-9]*</td>'
audit_row+='<td class="num( over)?">[0-9]+\.[0-9]{2} %[^<]*</td><td class="num">[0-9]+\.[0-9]{2} %</td><td class="num">[0-9]+\.[0-9]{2} ×</td>'
audit_row+='<td class="num">[0-9]+ of [1-9][0-9]*</td></tr>'
grep -qE -- "$audit_row" "$work/dom.html" || fail "the dumped DOM lacks the audit row of search: $(grep -o '<table id="audit">.*</table>' "$work/dom.html" | head -c 2000)"
grep -qF -- "the $nodes of $nodes nodes that answered" "$work/dom.html" || fail "the audit panel does not say that every node answered"
say "--dump-dom shows the members, the top keys, the audit of search and the RLQS panel"

# 2. DevTools protocol: console, requests, content, screenshot.
free_ports p_devtools/tcp
chromium "${chromium_flags[@]}" --remote-debugging-port="$p_devtools" --remote-allow-origins='*' \
    about:blank >"$work/chromium.log" 2>&1 &
chromium_pid=$!
show_at_failure "chromium log" 20 "$work/chromium.log"
mkdir -p "$(dirname "$screenshot")"
timeout 120 python3 tests/dashboard/cdp_check.py "$p_devtools" "$page" "$screenshot" "$nodes" \
    abuser-a abuser-b abuser-c --audit search || fail "the dashboard check failed"
[[ -s $screenshot ]] || fail "no screenshot at $screenshot"
say "ok"
