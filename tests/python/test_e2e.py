"""End to end: three web app processes, each pointed at a different node of the cluster, one
limit; requests spread over the three; the total admitted is within the policy's bound.

Flask + Flask-Limiter and FastAPI + SlowAPI, each with the fixed-window, moving-window and
sliding-window-counter strategies, the storage in exact mode (the default): the cluster counts
one key, so a moving window admits exactly the limit in a run shorter than its period, a fixed
window (an expiring counter: each window starts at its first hit) at most the limit per window
that fits in the run, a sliding window counter at most the limit in each clock-aligned window
the run spans (its counters are the cluster's, each capped at the limit)."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

LIMIT = 10
PERIOD_S = 60
REQUESTS = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_apps(
    kind: str, strategy: str, prefix: str, mode: str = "exact"
) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    """Three app processes; process i asks node i first (its URI lists every node, node i first:
    the others are its failover)."""
    nodes = os.environ["RATEMESH_NODES"].split(",")
    assert len(nodes) == 3, nodes
    work = Path(os.environ.get("RATEMESH_WORK", "/tmp"))
    processes, ports = [], []
    for index in range(3):
        port = free_port()
        ordered = ",".join(nodes[index:] + nodes[:index])
        uri = f"ratemesh://{ordered}?prefix={prefix}&mode={mode}&timeout=2"
        log = open(work / f"e2e-{kind}-{strategy}-{mode}-{index}.log", "wb")
        processes.append(
            subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("e2e_app.py")), kind, str(port), uri,
                 f"{LIMIT}/minute", strategy],
                stdout=log, stderr=subprocess.STDOUT,
            )
        )
        ports.append(port)
    deadline = time.monotonic() + 30
    for process, port in zip(processes, ports):
        while True:
            assert process.poll() is None, f"the {kind} app on port {port} exited"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the {kind} app on port {port} did not start within 30 s"
            time.sleep(0.1)
    return processes, ports


def stop_apps(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=10)


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
@pytest.mark.parametrize("strategy", ["fixed-window", "moving-window", "sliding-window-counter"])
def test_three_processes_one_limit(kind: str, strategy: str) -> None:
    processes, ports = start_apps(kind, strategy, f"e2e-{uuid.uuid4().hex[:8]}/")
    try:
        statuses = []
        start = time.time()
        with httpx.Client(timeout=5) as http:
            for i in range(REQUESTS):
                answer = http.get(f"http://127.0.0.1:{ports[i % 3]}/")
                statuses.append(answer.status_code)
                if answer.status_code == 429 and kind == "flask":
                    assert int(answer.headers["Retry-After"]) >= 0
        end = time.time()
    finally:
        stop_apps(processes)
    admitted = statuses.count(200)
    assert set(statuses) <= {200, 429}, statuses
    per_process = [statuses[i::3].count(200) for i in range(3)]
    windows = math.floor(end / PERIOD_S) - math.floor(start / PERIOD_S) + 1
    if strategy == "moving-window":
        assert end - start < PERIOD_S
        assert admitted == LIMIT, (admitted, per_process)
    elif strategy == "fixed-window":
        # Windows start at a first hit and last a period: a run starts at most this many.
        started = math.floor((end - start) / PERIOD_S) + 1
        assert LIMIT <= admitted <= LIMIT * started, (admitted, started, per_process)
    else:
        assert LIMIT <= admitted <= LIMIT * windows, (admitted, windows, per_process)
    # one limit, not three: a per-process count would admit 3 × LIMIT
    assert admitted < 3 * LIMIT or windows > 2


@pytest.mark.parametrize("kind", ["flask", "fastapi"])
@pytest.mark.parametrize("strategy", ["fixed-window", "moving-window", "sliding-window-counter"])
def test_three_processes_one_limit_approximate(kind: str, strategy: str) -> None:
    """Approximate mode: each node decides from its allowance; admissions stay within the limit
    per window (never more from allowances with stable membership)."""
    processes, ports = start_apps(kind, strategy, f"e2a-{uuid.uuid4().hex[:8]}/", mode="approximate")
    try:
        statuses = []
        start = time.time()
        with httpx.Client(timeout=5) as http:
            for i in range(REQUESTS):
                statuses.append(http.get(f"http://127.0.0.1:{ports[i % 3]}/").status_code)
        end = time.time()
    finally:
        stop_apps(processes)
    assert set(statuses) <= {200, 429}, statuses
    admitted = statuses.count(200)
    windows = math.floor(end / PERIOD_S) - math.floor(start / PERIOD_S) + 1
    if strategy == "moving-window":
        assert 1 <= admitted <= LIMIT, (admitted, statuses)
    elif strategy == "fixed-window":
        # Fixed window: windows start at a first hit and last a period.
        windows = math.floor((end - start) / PERIOD_S) + 1
        assert 1 <= admitted <= LIMIT * windows, (admitted, windows, statuses)
    else:
        # Clock-aligned windows: each window's counter is the cluster's, capped at the limit.
        assert 1 <= admitted <= LIMIT * windows, (admitted, windows, statuses)
