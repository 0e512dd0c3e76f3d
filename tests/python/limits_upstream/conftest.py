"""Fixtures that point the `limits` project's tests at the ratemesh storage on the cluster that
tests/python/run.sh started (RATEMESH_NODES: the nodes' HTTP host:port, comma-separated).

Upstream, a fixture flushes Redis (or Memcached, MongoDB) before every test. A ratemesh cluster
has no flush: each test gets a fresh key prefix instead (the storage's ``prefix`` option), so
the upstream tests' fixed keys (``LIMITER/10/2/second``) are new keys in every test.
"""

from __future__ import annotations

import os
import uuid

import pytest

import ratemesh  # noqa: F401  registers ratemesh:// and async+ratemesh:// with limits


def _nodes() -> str:
    nodes = os.environ.get("RATEMESH_NODES", "")
    assert nodes, "RATEMESH_NODES (the cluster's HTTP host:port list) is not set"
    return nodes


@pytest.fixture
def ratemesh_cluster() -> str:
    return _nodes()


@pytest.fixture
def ratemesh_uri() -> str:
    return f"ratemesh://{_nodes()}?prefix=t{uuid.uuid4().hex[:12]}/"


@pytest.fixture
def async_ratemesh_uri() -> str:
    return f"async+ratemesh://{_nodes()}?prefix=t{uuid.uuid4().hex[:12]}/"


# Racy at a window's edge for every timestamp-based storage (upstream's memory storage too: its
# three hits 1 s apart may straddle a minute's edge): run again once, as upstream's CI reruns the
# tests it marks flaky (pytest-rerunfailures honours those marks here).
EDGE_RACES = {"test_sliding_window_counter_stats"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = getattr(item, "originalname", item.name)
        if "limits_upstream" not in str(item.path):
            continue
        if name in EDGE_RACES:
            item.add_marker(pytest.mark.flaky(reruns=1))
