#!/usr/bin/env bash
# GET /metrics scraped with curl and parsed by a Prometheus text parser this project did not
# write (PyPI prometheus-client's `text_string_to_metric_families`, and its OpenMetrics parser too
# when the node answers in OpenMetrics). Run by .ci/run.
#
# Starts one ratemeshd (the static release build), sends checks that are allowed and refused,
# scrapes, and asserts that `ratemesh_requests_total` is a counter with `policy` and `decision`
# labels whose samples for the test's policy add up to the checks sent, with both an allowing
# and a refusing decision among them, and that the membership gauge reports this node live.
#
# Installs prometheus-client into a virtualenv under target/ when missing; fails, never skips.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
root=$PWD

limit=5            # the policy's limit (per day): 8 checks → 5 allowed, 3 refused
checks=8
wait_s=60
venv=${METRICS_VENV:-$root/target/venv-tests}

require_tools curl python3
if ! "$venv/bin/python" -c 'import prometheus_client' 2>/dev/null; then
    say "installing prometheus-client into $venv"
    make_venv "$venv"
    pip_install "$venv" prometheus-client 'prometheus-client==0.26.0'
fi
"$venv/bin/python" -c 'import prometheus_client' || fail "prometheus-client is required and could not be installed"

ratemeshd_binary

ratemeshd_pid=
make_work
stop_at_exit ratemeshd_pid
show_at_failure "ratemeshd log" 30 "$work/ratemeshd.log"

ratemeshd_ports
base=http://127.0.0.1:$p_http

write_config "$work/ratemesh.toml" <<EOF
[[policies]]
name = "scraped"
algorithm = "token_bucket"
limit = $limit
period_ms = 86400000
EOF
start_ratemeshd "$work/ratemesh.toml"
wait_until "ratemeshd not ready within ${wait_s}s" answers "$base/readyz" 200

for ((i = 0; i < checks; i++)); do
    curl -sf -o /dev/null --max-time 5 -X POST -H 'content-type: application/json' \
        --data '{"key": "scraper", "policy": "scraped"}' "$base/v1/check" || fail "check $i failed"
done

curl -sf --max-time 5 -D "$work/headers" -o "$work/metrics.txt" "$base/metrics" || fail "GET /metrics failed"
content_type=$(header "$work/headers" content-type)
say "GET /metrics: $(wc -l <"$work/metrics.txt") lines, Content-Type: $content_type"

"$venv/bin/python" - "$work/metrics.txt" "$content_type" "$checks" <<'EOF'
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as prometheus_families

path, content_type, checks = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(path, encoding="utf-8").read()


def fail(message):
    print(f"metrics.sh: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def parse(parser, name):
    try:
        return list(parser(text))
    except Exception as error:  # the parser's refusal is the finding
        fail(f"not valid {name}: {error!r}")


# 1. The scrape as Prometheus text (the classic parser, as a scraper without content negotiation
#    reads it). OpenMetrics declares a counter by its family name (TYPE ratemesh_requests), which
#    this parser does not tie to the ratemesh_requests_total samples: samples are checked by name
#    here, the family's type in step 2.
samples = [s for f in parse(prometheus_families, "Prometheus text") for s in f.samples]
requests = [s for s in samples if s.name == "ratemesh_requests_total"]
if not requests:
    fail("no ratemesh_requests_total sample")
for s in requests:
    if not {"policy", "decision"} <= set(s.labels):
        fail(f"ratemesh_requests_total without policy/decision labels: {s.labels}")
decisions = {s.labels["decision"]: s.value for s in requests if s.labels["policy"] == "scraped"}
if sum(decisions.values()) != checks:
    fail(f"policy=scraped counts {decisions}, expected {checks} in all")
if len([v for v in decisions.values() if v > 0]) < 2:
    fail(f"expected an allowing and a refusing decision, got {decisions}")
live = [s for s in samples if s.name == "ratemesh_members" and s.labels.get("status") == "live"]
if not live or live[0].value < 1:
    fail(f'no ratemesh_members{{status="live"}} >= 1 sample: {live}')

# 2. The format the node declares, strictly: families and their types.
if content_type.startswith("application/openmetrics-text"):
    families = {f.name: f for f in parse(openmetrics_families, "OpenMetrics text")}
elif content_type.startswith("text/plain"):
    families = {f.name: f for f in parse(prometheus_families, "Prometheus text")}
else:
    fail(f"unexpected Content-Type {content_type!r}")
family = families.get("ratemesh_requests")  # both parsers name a counter family without _total
if family is None or family.type != "counter":
    fail(f"ratemesh_requests is not a counter family: {family}")
if {s.name for s in family.samples} - {"ratemesh_requests_total", "ratemesh_requests_created"}:
    fail(f"odd samples in ratemesh_requests: {family.samples}")
print(
    f"metrics.sh: ok: {len(families)} families ({content_type.split(';')[0]}); "
    f'ratemesh_requests_total{{policy="scraped"}} by decision: {decisions}'
)
EOF
say "PASS"
