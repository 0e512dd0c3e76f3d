# Adapted from the `limits` project's tests (github.com/alisaifee/limits, tag 5.8.0, tests/utils.py;
# MIT licence, Copyright (c) 2023 Ali-Akber Saifee: LICENSE.limits). Changes: the storages
# parametrized are ratemesh's (utils.py); the Redis, Memcached and MongoDB
# entries are gone.
from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import time

import pytest
from pytest_lazy_fixtures import lf

from limits.limits import RateLimitItem

ASYNC_REDIS_IMPLEMENTATION = os.environ.get("ASYNC_REDIS_IMPLEMENTATION", "coredis")
ASYNC_MEMCACHED_IMPLEMENTATION = os.environ.get(
    "ASYNC_MEMCACHED_IMPLEMENTATION", "memcachio"
)


def fixed_start(fn):
    @functools.wraps(fn)
    def __inner(*a, **k):
        start = time.time()

        while time.time() < math.ceil(start):
            time.sleep(0.01)

        return fn(*a, **k)

    return __inner


def timestamp_based_key_ttl(item: RateLimitItem, now: float | None = None) -> float:
    """
    Return the current timestamp-based key TTL.

    Used for some implementations of thesliding window counter that generates keys based on the timestamp.

    Args:
        item (RateLimitItem): the rate limit item
        now (Optional[float], optional): the current timestamp. If None, generates the current timestamp
    """
    if now is None:
        now = time.time()
    return item.get_expiry() - (now % item.get_expiry())


def async_fixed_start(fn):
    @functools.wraps(fn)
    async def __inner(*a, **k):
        start = time.time()

        while time.time() < math.ceil(start):
            time.sleep(0.01)

        return await fn(*a, **k)

    return __inner


@contextlib.contextmanager
def window(delay_end: float, delay: float | None = None):
    start = time.time()

    if delay is not None:
        while time.time() - start < delay:
            time.sleep(0.001)
    yield (start, start + delay_end)

    while time.time() - start < delay_end:
        time.sleep(0.001)


@contextlib.asynccontextmanager
async def async_window(delay_end: float, delay: float | None = None):
    start = time.time()

    if delay is not None:
        while time.time() - start < delay:
            await asyncio.sleep(0.001)

    yield (start, start + delay_end)

    while time.time() - start < delay_end:
        await asyncio.sleep(0.001)


ALL_STORAGES = {
    "ratemesh": pytest.param(
        lf("ratemesh_uri"), {}, lf("ratemesh_cluster"), id="ratemesh-3-nodes"
    ),
}
ALL_STORAGES_ASYNC = {
    "ratemesh": pytest.param(
        lf("async_ratemesh_uri"), {}, lf("ratemesh_cluster"), id="ratemesh-3-nodes"
    ),
}

all_storage = pytest.mark.parametrize("uri, args, fixture", ALL_STORAGES.values())

moving_window_storage = pytest.mark.parametrize(
    "uri, args, fixture",
    [
        storage
        for name, storage in ALL_STORAGES.items()
        if not name.startswith("memcached")
    ],
)

sliding_window_counter_storage = pytest.mark.parametrize(
    "uri, args, fixture", ALL_STORAGES.values()
)

async_all_storage = pytest.mark.parametrize(
    "uri, args, fixture", ALL_STORAGES_ASYNC.values()
)

async_moving_window_storage = pytest.mark.parametrize(
    "uri, args, fixture",
    [
        storage
        for name, storage in ALL_STORAGES_ASYNC.items()
        if not name.startswith("memcached")
    ],
)

async_sliding_window_counter_storage = pytest.mark.parametrize(
    "uri, args, fixture", ALL_STORAGES_ASYNC.values()
)
