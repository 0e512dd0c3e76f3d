#!/usr/bin/env python3
"""Asserts bounds on a report of tests/wan/run.sh (README.md defines every field).

    python3 tests/wan/check.py REPORT.json [--over-run 0.02] [--over-window 0.05] \
        [--false-rejects 0.01] [--shortfall 0.01] [--failed 0.0] [--p99-ms 500]

Each bound given is checked (a bound not given is not): over_run, over_window,
false_reject_share, shortfall_share and failed_share at most their bound, p99_ms at most its
bound. Prints one
line per bound and exits 1 if any is exceeded, 2 on a bad argument or report.
"""

import argparse
import json
import sys

BOUNDS = [
    # (option, report field, what it is)
    ("over_run", "over_run", "admitted over the ideal token bucket's most, minus 1"),
    ("over_window", "over_window", "worst 1-s window over the token bucket's most in a second, minus 1"),
    ("false_rejects", "false_reject_share", "refusals the ideal bucket would have admitted, share of requests"),
    ("shortfall", "shortfall_share", "admissions missing against the ideal bucket's total, share of requests"),
    ("failed", "failed_share", "requests without an answer (errors, timeouts), share of requests"),
    ("p99_ms", "p99_ms", "99th percentile check latency, ms"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="the JSON printed by tests/wan/run.sh ('-': stdin)")
    for option, _, what in BOUNDS:
        parser.add_argument("--" + option.replace("_", "-"), type=float, help=f"bound on {what}")
    args = parser.parse_args()
    try:
        text = sys.stdin.read() if args.report == "-" else open(args.report, encoding="utf-8").read()
        report = json.loads(text)
    except (OSError, ValueError) as error:
        print(f"check.py: cannot read the report {args.report}: {error}", file=sys.stderr)
        return 2
    exceeded = 0
    for option, field, what in BOUNDS:
        bound = getattr(args, option)
        if bound is None:
            continue
        value = report.get(field)
        if not isinstance(value, (int, float)):
            print(f"check.py: the report has no {field}", file=sys.stderr)
            return 2
        ok = value <= bound
        exceeded += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {field} = {value} (bound {bound}: {what})")
    return 1 if exceeded else 0


if __name__ == "__main__":
    sys.exit(main())
