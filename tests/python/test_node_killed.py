"""A node killed mid-run (run by tests/python/run.sh after the other tests, alone: it kills the
node whose pid is RATEMESH_KILL_PID, the third of RATEMESH_NODES).

Three Flask-Limiter processes, each asking a different node first with the other two as its
failover, one moving-window limit in exact mode. Halfway through, the third node is killed
(SIGKILL): every request is still answered 200 or 429 (the storage fails over: no 500), the
client of the killed node's process and the AsyncClient too, and the total admitted stays within
twice the limit (the key's state survives on the owner's replica, or the fallback's local share
decides while the owner is being replaced)."""

from __future__ import annotations

import os
import signal
import time
import uuid

import httpx

from ratemesh import Client, Limit

from .test_e2e import LIMIT, start_apps, stop_apps


def test_a_node_killed_mid_run() -> None:
    pid = int(os.environ["RATEMESH_KILL_PID"])
    nodes = os.environ["RATEMESH_NODES"].split(",")
    processes, ports = start_apps("flask", "moving-window", f"kill-{uuid.uuid4().hex[:8]}/")
    statuses = []
    try:
        with httpx.Client(timeout=10) as http:
            for i in range(30):
                statuses.append(http.get(f"http://127.0.0.1:{ports[i % 3]}/").status_code)
            os.kill(pid, signal.SIGKILL)
            for i in range(60):
                statuses.append(http.get(f"http://127.0.0.1:{ports[i % 3]}/").status_code)
                time.sleep(0.02)
    finally:
        stop_apps(processes)
    assert set(statuses) <= {200, 429}, statuses
    admitted = statuses.count(200)
    assert LIMIT <= admitted <= 2 * LIMIT, (admitted, statuses)

    # The client asked the dead node first: it fails over and remembers.
    with Client([nodes[2], nodes[0], nodes[1]], timeout=1) as client:
        first = client.check(f"after-kill:{uuid.uuid4().hex}", Limit("token_bucket", 5, period_ms=60_000))
        assert first.allowed and first.node != "http://" + nodes[2]
