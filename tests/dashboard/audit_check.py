"""Checks a GET /v1/audit answer against the fields the dashboard's audit panel reads.

Usage: audit_check.py AUDIT_JSON NODES POLICY...

Exit 0 (a one-line summary on stdout) when the answer has the shape below, every one of NODES
nodes answered, every POLICY has complete key windows with hits admitted, and worst keys are
listed; exit 1 (the reason on stderr) when it has the shape but not the figures yet (windows
close about a second after they end: poll again); exit 3 when the shape is wrong (do not poll).

The shape (docs/audit.md): span_s, nodes_asked, nodes_answered, policies[] and keys[]; counts
are integers, ratios numbers; over_admission_ratio = over_admitted / ideal and
false_refusal_ratio = false_refused / arrivals.
"""

import json
import re
import sys

POLICY_COUNTS = ("window_ms", "key_windows", "incomplete_key_windows", "admitted", "ideal", "arrivals",
                 "over_admitted", "false_refused")
POLICY_RATIOS = ("admitted_over_limit_ratio", "over_admission_ratio", "false_refusal_ratio")
KEY_COUNTS = ("window_ms", "admitted", "ideal", "arrivals", "over_admitted", "false_refused", "incomplete_windows")
KEY_RATIOS = ("admitted_over_limit_ratio", "over_admission_ratio")
TOLERANCE = 1e-3


def wrong(message):
    print(f"/v1/audit: {message}", file=sys.stderr)
    sys.exit(3)


def is_count(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def is_ratio(v):
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)


def check_entry(entry, what, counts, ratios):
    if not isinstance(entry, dict) or not isinstance(entry.get("policy"), str):
        wrong(f"{what}: {entry!r} has no policy name")
    for field in counts:
        if not is_count(entry.get(field)):
            wrong(f"{what} {entry['policy']}: {field} = {entry.get(field)!r}, not a count")
    for field in ratios:
        if field not in entry or not is_ratio(entry[field]):
            wrong(f"{what} {entry['policy']}: {field} = {entry.get(field)!r}, not a ratio")
    over_admitted, ideal = entry["over_admitted"], entry["ideal"]
    over = entry["over_admission_ratio"]
    if ideal > 0 and over is not None and abs(over - over_admitted / ideal) > TOLERANCE:
        wrong(f"{what} {entry['policy']}: over_admission_ratio {over} for over_admitted {over_admitted}, ideal {ideal}")
    refusal = entry.get("false_refusal_ratio")
    if "false_refusal_ratio" in ratios and entry["arrivals"] > 0 and refusal is not None and \
            abs(refusal - entry["false_refused"] / entry["arrivals"]) > TOLERANCE:
        wrong(f"{what} {entry['policy']}: false_refusal_ratio {refusal} for {entry['false_refused']} of "
              f"{entry['arrivals']}")


def main():
    path, nodes, policies = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    try:
        audit = json.load(open(path, encoding="utf-8"))
    except ValueError as error:
        wrong(f"not JSON: {error}")
    if not isinstance(audit, dict):
        wrong(f"not an object: {audit!r}")
    for field in ("span_s", "nodes_asked", "nodes_answered"):
        if not is_count(audit.get(field)):
            wrong(f"{field} = {audit.get(field)!r}")
    if not isinstance(audit.get("policies"), list) or not isinstance(audit.get("keys"), list):
        wrong("policies and keys must be lists")
    for entry in audit["policies"]:
        check_entry(entry, "policy", POLICY_COUNTS, POLICY_RATIOS)
    for entry in audit["keys"]:
        check_entry(entry, "key of", KEY_COUNTS, KEY_RATIOS)
        if not isinstance(entry.get("key"), (str, type(None))) or not re.fullmatch(r"[0-9a-f]{32}", str(entry.get("key_hash"))):
            wrong(f"key {entry.get('key')!r}: key_hash {entry.get('key_hash')!r}")
        if not isinstance(entry.get("owner"), (str, int)) or entry["owner"] == "":
            wrong(f"key {entry['key']!r}: owner {entry.get('owner')!r}")
    if len(audit["keys"]) > 5:
        wrong(f"{len(audit['keys'])} keys for n=5")

    if not (audit["nodes_asked"] == audit["nodes_answered"] == nodes):
        print(f"{audit['nodes_answered']} of {audit['nodes_asked']} nodes answered, not {nodes}", file=sys.stderr)
        sys.exit(1)
    by_name = {p["policy"]: p for p in audit["policies"]}
    for policy in policies:
        p = by_name.get(policy)
        if p is None or p["key_windows"] == 0 or p["admitted"] == 0:
            print(f"no complete key window of {policy} with hits admitted yet: {json.dumps(p)}", file=sys.stderr)
            sys.exit(1)
    if not audit["keys"]:
        print("no worst keys yet", file=sys.stderr)
        sys.exit(1)
    print("; ".join(
        f"{p['policy']}: {p['key_windows']} key windows (+{p['incomplete_key_windows']} incomplete) of "
        f"{p['window_ms']} ms, admitted {p['admitted']} / ideal {p['ideal']} of {p['arrivals']}, over-admission "
        f"{p['over_admission_ratio']}, false refusals {p['false_refusal_ratio']}, worst window "
        f"{p['admitted_over_limit_ratio']}" for p in audit["policies"])
        + f"; worst key {audit['keys'][0]['key']!r} ({audit['keys'][0]['policy']})")


if __name__ == "__main__":
    main()
