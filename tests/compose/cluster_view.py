#!/usr/bin/env python3
"""Summarizes a ratemeshd `GET /v1/cluster` answer read from stdin, for shell tests.

Prints one line: `live=<ids> dead=<ids> unverified=<ids> counted=<n>`, each a comma-separated
sorted list of member ids (`-` when empty), and `members_counted` (the members whose shares the
node's owned keys count: all live ones once a member back from the dead counts again), e.g.
`live=1,2 dead=3 unverified=- counted=2`. Exits 1, saying why on stderr,
when the input is not a cluster view (not JSON, no member list): a test waiting on the view then
keeps polling until its bound instead of misreading an error page.
"""

import json
import sys


def main() -> int:
    try:
        view = json.load(sys.stdin)
    except ValueError as error:
        print(f"cluster_view: not JSON: {error}", file=sys.stderr)
        return 1
    members = view.get("members") if isinstance(view, dict) else None
    if not isinstance(members, list):
        print(f"cluster_view: no member list in {view!r:.200}", file=sys.stderr)
        return 1
    by_status = {"live": [], "dead": [], "unverified": []}
    for member in members:
        if not isinstance(member, dict) or "id" not in member or "status" not in member:
            print(f"cluster_view: odd member entry {member!r:.200}", file=sys.stderr)
            return 1
        by_status.setdefault(str(member["status"]), []).append(int(member["id"]))
    lists = " ".join(f"{status}={','.join(map(str, sorted(ids))) or '-'}" for status, ids in by_status.items())
    print(f"{lists} counted={view.get('members_counted', '-')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
