"""Fixtures of the hostile suite: a ratemeshd of its own per case (RATEMESHD names the binary),
its memory baseline, and a summary of each case's memory growth at the end of the run."""

import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from daemon import Daemon  # noqa: E402
import wellbehaved  # noqa: E402

_measured = []  # (case, RSS growth KiB, bound KiB)


@pytest.fixture
def daemon(tmp_path):
    binary = os.environ.get("RATEMESHD")
    assert binary, "RATEMESHD must name the ratemeshd binary to attack"
    assert os.access(binary, os.X_OK), f"RATEMESHD={binary} is not an executable"
    process = Daemon(os.path.abspath(binary), str(tmp_path))
    process.start()
    try:
        yield process
    finally:
        alive = process.alive()
        process.stop()
        if not alive:
            sys.stderr.write(f"--- ratemeshd log ---\n{process.log_tail()}\n")


class Memory:
    """The daemon's VmRSS before an attack, once warm (both servers answered a client)."""

    def __init__(self, daemon, request):
        self.daemon, self.case = daemon, request.node.name
        wellbehaved.assert_grpc_served(daemon)
        wellbehaved.assert_http_served(daemon)
        self.baseline_kib = daemon.settled_rss_kib()

    def assert_growth_below(self, bound_mib):
        """The settled RSS grew by less than `bound_mib` MiB over the baseline."""
        assert self.daemon.alive(), f"ratemeshd died:\n{self.daemon.log_tail()}"
        growth = self.daemon.settled_rss_kib() - self.baseline_kib
        _measured.append((self.case, growth, bound_mib * 1024))
        assert growth < bound_mib * 1024, (
            f"RSS grew by {growth / 1024:.1f} MiB (baseline {self.baseline_kib / 1024:.1f} MiB), "
            f"bound {bound_mib} MiB")
        return growth


@pytest.fixture
def memory(daemon, request):
    return Memory(daemon, request)


@pytest.fixture
def timer():
    """Wall-clock bound of an attack loop: `timer(seconds)` is a function telling time's up."""
    def start(seconds):
        deadline = time.monotonic() + seconds
        return lambda: time.monotonic() >= deadline
    return start


def pytest_terminal_summary(terminalreporter):
    if not _measured:
        return
    terminalreporter.section("ratemeshd RSS growth per case (settled VmRSS over the warm baseline)")
    for case, growth, bound in _measured:
        verdict = "ok" if growth < bound else "OVER"
        terminalreporter.write_line(
            f"{case:<60} {growth / 1024:8.1f} MiB   bound {bound / 1024:5.0f} MiB   {verdict}")
