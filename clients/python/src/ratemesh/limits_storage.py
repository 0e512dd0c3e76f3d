"""A `limits` storage over a ratemesh cluster: ``ratemesh://host:port[,host:port…]`` and
``async+ratemesh://…`` (the nodes' HTTP ports), registered when :mod:`ratemesh` is imported.

Every operation is a check of an inline limit on the daemon (``POST /v1/check``), so counts are
the cluster's, one per key, whichever node is asked:

- fixed window (``incr``, ``get``, ``get_expiry``): an ``expiring_counter`` limit of the rate
  limit's amount and period (the amount and period are read from the key that ``limits`` builds,
  ``…/{amount}/{multiples}/{granularity}``; a key that is not of that form counts against a
  limit of 10^15). Like Redis ``INCR`` + ``EXPIRE``, the window starts at the first hit and the
  count expires a period later. A hit the daemon refuses is not counted (Redis would count it):
  ``incr`` answers the limit plus the hit, and the window's count stays at the limit.
- moving window (``acquire_entry``, ``get_moving_window``): a ``sliding_window_log`` (any
  limit: a hit is one entry whatever its cost).
- sliding window counter (``acquire_sliding_window_entry``, ``get_sliding_window``): as
  ``limits``' own memory storage does it, two counters per key, one per clock-aligned window
  (``key/{now // expiry}``, expiring 2 × expiry after their first hit), each an
  ``expiring_counter`` of the rate limit's amount on the cluster (so the cluster never counts a
  window past the amount, in approximate mode too). A hit reads the previous window's count and
  adds to the current one in one request; when ``floor(previous × its remaining share +
  current)`` then exceeds the limit, the hit is given back and refused (upstream's race:
  concurrent hits may refuse one another, never admit too many). So the counts ``limits`` sees
  are the previous and current windows' apart, and its reset times and admissions are the same
  as with Redis.
- ``clear``: refunds every hit of the key's limits; ``reset``: clears the keys this storage
  object used (the cluster has no listing of keys).

Options (URI query or keyword arguments): ``mode`` (``exact``, the default, or ``approximate``),
``timeout`` (seconds per node, default 1), ``on_unavailable`` (``raise``, the default, ``allow`` or
``deny``), ``prefix`` (prepended to every key), ``cooldown`` (seconds a failed node is skipped).
"""

from __future__ import annotations

import time
from math import floor
import urllib.parse
from typing import Any, Optional, Union

from limits.aio.storage import MovingWindowSupport as AsyncMovingWindowSupport
from limits.aio.storage import SlidingWindowCounterSupport as AsyncSlidingWindowCounterSupport
from limits.aio.storage import Storage as AsyncStorage
from limits.errors import ConfigurationError
from limits.storage import MovingWindowSupport, SlidingWindowCounterSupport, Storage
from limits.storage.base import TimestampedSlidingWindow

from ._model import Check, Decision, Limit, Mode, OnUnavailable, RatemeshError
from .client import AsyncClient, Client

COUNTER_LIMIT = 10**15
"""The limit of an expiring counter (or a sliding window's counters) whose key and calls do not
say its limit."""
REFUND_ALL = 2**62
SECONDS = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86400,
    "month": 30 * 86400,
    "year": 12 * 30 * 86400,
}

Spec = tuple[str, int, int]
"""(algorithm, limit, expiry in seconds)."""


def parse_limits_key(key: str) -> Optional[tuple[int, int]]:
    """``LIMITER/…/10/2/minute`` → (10, 120): the amount and the expiry of ``limits``' key."""
    parts = key.rsplit("/", 3)
    if len(parts) != 4 or parts[3] not in SECONDS or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[1]), int(parts[2]) * SECONDS[parts[3]]


class _Options:
    def __init__(self, uri: Optional[str], options: dict[str, Any], scheme: str):
        if not uri:
            raise ConfigurationError(f"{scheme}: a URI with at least one host:port is required")
        parsed = urllib.parse.urlparse(uri)
        locations: list[tuple[str, int]] = []
        for location in parsed.netloc.split(","):
            if not location.strip():
                continue
            try:
                sub = urllib.parse.urlparse(f"http://{location.strip()}")
                host, port = sub.hostname, sub.port
            except ValueError as error:
                raise ConfigurationError(f"{scheme}: bad location {location!r} in {uri!r}: {error}") from error
            if not host or port is None:
                raise ConfigurationError(f"{scheme}: location {location!r} in {uri!r} is not host:port")
            locations.append((host, port))
        if not locations:
            raise ConfigurationError(f"{scheme}: {uri!r} names no host:port")
        query = {name: values[-1] for name, values in urllib.parse.parse_qs(parsed.query).items()}
        merged: dict[str, Any] = {**query, **options}
        unknown = set(merged) - {"mode", "timeout", "on_unavailable", "prefix", "cooldown"}
        if unknown:
            raise ConfigurationError(f"{scheme}: unknown option(s) {sorted(unknown)}")
        mode = str(merged.get("mode", "exact"))
        if mode not in ("exact", "approximate"):
            raise ConfigurationError(f"{scheme}: mode is 'exact' or 'approximate', not {mode!r}")
        on_unavailable = str(merged.get("on_unavailable", "raise"))
        if on_unavailable not in ("raise", "allow", "deny"):
            raise ConfigurationError(f"{scheme}: on_unavailable is 'raise', 'allow' or 'deny', not {on_unavailable!r}")
        try:
            self.timeout = float(merged.get("timeout", 1.0))
            self.cooldown = float(merged.get("cooldown", 5.0))
        except ValueError as error:
            raise ConfigurationError(f"{scheme}: timeout and cooldown are seconds: {error}") from error
        self.mode: Mode = "exact" if mode == "exact" else "approximate"
        self.on_unavailable: OnUnavailable = (
            "raise" if on_unavailable == "raise" else "allow" if on_unavailable == "allow" else "deny"
        )
        self.prefix = str(merged.get("prefix", ""))
        self.nodes = [f"{host}:{port}" if ":" not in host else f"[{host}]:{port}" for host, port in locations]


class _Mapping:
    """What both storages share: the limits that a key's operations map to."""

    def _setup(self, options: _Options) -> None:
        self._options = options
        self._used: dict[str, set[Spec]] = {}

    def _limit(self, spec: Spec) -> Limit:
        algorithm, limit, expiry = spec
        return Limit(algorithm, limit, period_ms=max(1, expiry) * 1000, mode=self._options.mode)  # type: ignore[arg-type]

    def _remember(self, key: str, spec: Spec) -> Spec:
        self._used.setdefault(key, set()).add(spec)
        return spec

    def _counter(self, key: str, expiry: Optional[int]) -> Optional[Spec]:
        """The fixed-window spec of ``key`` (``expiry`` None: from the key or an earlier incr)."""
        parsed = parse_limits_key(key)
        if expiry is not None:
            limit = parsed[0] if parsed and parsed[1] == expiry else COUNTER_LIMIT
            return ("expiring_counter", limit, expiry)
        used = [s for s in self._used.get(key, ()) if s[0] == "expiring_counter"]
        if used:
            return used[0]
        return ("expiring_counter", parsed[0], parsed[1]) if parsed else None

    def _window_limit(self, key: str, expiry: int) -> int:
        """The amount of ``key``'s sliding window counter of ``expiry`` (from an earlier hit, or
        the key ``limits`` builds)."""
        used = [s[1] for s in self._used.get(key, ()) if s[0] == "sliding_window_counter" and s[2] == expiry]
        parsed = parse_limits_key(key)
        if used:
            return used[0]
        return parsed[0] if parsed and parsed[1] == expiry else COUNTER_LIMIT

    def _window_checks(self, key: str, expiry: int, cost: tuple[int, int], now: float) -> list[Check]:
        """Checks of the previous and the current window's counters of ``cost``, each of the
        key's amount."""
        counter = self._limit(("expiring_counter", self._window_limit(key, expiry), 2 * expiry))
        previous, current = TimestampedSlidingWindow.sliding_window_keys(key, expiry, now)
        prefix = self._options.prefix
        return [Check(prefix + previous, counter, cost=cost[0]), Check(prefix + current, counter, cost=cost[1])]

    def _clear_checks(self, key: str) -> list[Check]:
        specs = set(self._used.get(key, ()))
        parsed = parse_limits_key(key)
        if parsed:
            amount, expiry = parsed
            specs |= {
                ("expiring_counter", amount, expiry),
                ("sliding_window_counter", amount, expiry),
                ("sliding_window_log", amount, expiry),
            }
        checks: list[Check] = []
        for spec in sorted(specs):
            if spec[0] == "sliding_window_counter":
                checks += self._window_checks(key, spec[2], (-REFUND_ALL, -REFUND_ALL), time.time())
            else:
                checks.append(Check(self._options.prefix + key, self._limit(spec), cost=-REFUND_ALL))
        return checks

    @staticmethod
    def _count(decision: Decision) -> int:
        return max(0, decision.limit - decision.remaining)

    def _incr_result(self, decision: Decision, amount: int) -> int:
        if decision.fallback:
            return 0 if decision.allowed else COUNTER_LIMIT
        count = self._count(decision)
        if decision.allowed:
            return count
        # Refused: above the limit whatever the count reads (in approximate mode a node may
        # refuse from its own view while its bucket still shows room).
        return max(count, decision.limit) + amount

    @staticmethod
    def _window_start(query: Decision, probe: Optional[Decision], expiry: int) -> float:
        now = time.time()
        if probe is not None and probe.retry_after_ms is not None:
            return now + probe.retry_after_ms / 1000 - expiry
        return now + query.reset_after_ms / 1000 - expiry

    def _sliding_window(self, windows: list[Decision], expiry: int, now: float) -> tuple[int, float, int, float]:
        """``get_sliding_window``'s answer, as upstream's memory storage computes it."""
        previous, current = windows
        if previous.fallback or current.fallback:
            return 0, 0.0, 0, 0.0
        previous_count, current_count = self._count(previous), self._count(current)
        previous_ttl = 0.0 if previous_count == 0 else (1 - (((now - expiry) / expiry) % 1)) * expiry
        current_ttl = (1 - ((now / expiry) % 1)) * expiry + expiry
        return previous_count, previous_ttl, current_count, current_ttl

    def _sliding_admits(self, windows: list[Decision], limit: int, expiry: int, now: float) -> Optional[bool]:
        """A hit charged in ``windows``: admitted (True), refused uncounted (False), or counted above
        the limit (None: refused, and the caller gives it back)."""
        current = windows[1]
        if current.fallback:
            return current.allowed
        if not current.allowed:
            return False
        previous_count, previous_ttl, current_count, _ = self._sliding_window(windows, expiry, now)
        if floor(previous_count * previous_ttl / expiry + current_count) <= limit:
            return True
        return None


class RatemeshStorage(
    _Mapping, Storage, MovingWindowSupport, SlidingWindowCounterSupport, TimestampedSlidingWindow
):
    """``ratemesh://host:port[,host:port…][?mode=approximate&timeout=1&on_unavailable=raise&prefix=]``."""

    STORAGE_SCHEME = ["ratemesh"]

    def __init__(self, uri: Optional[str] = None, wrap_exceptions: bool = False, **options: Union[float, str, bool]):
        self._setup(_Options(uri, dict(options), "ratemesh"))
        self._client = Client(
            self._options.nodes,
            timeout=self._options.timeout,
            on_unavailable=self._options.on_unavailable,
            cooldown=self._options.cooldown,
        )
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    @property
    def base_exceptions(self) -> Union[type[Exception], tuple[type[Exception], ...]]:
        return RatemeshError

    def _check(self, key: str, spec: Spec, cost: int) -> Decision:
        return self._client.check(self._options.prefix + key, self._limit(spec), cost=cost)

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        spec = self._remember(key, self._counter(key, expiry))  # type: ignore[arg-type]
        return self._incr_result(self._check(key, spec, amount), amount)

    def get(self, key: str) -> int:
        spec = self._counter(key, None)
        if spec is None:
            return 0
        decision = self._check(key, spec, 0)
        return 0 if decision.fallback else self._count(decision)

    def get_expiry(self, key: str) -> float:
        spec = self._counter(key, None)
        if spec is None:
            return time.time()
        return time.time() + self._check(key, spec, 0).reset_after_ms / 1000

    def check(self) -> bool:
        return self._client.healthy()

    def reset(self) -> Optional[int]:
        keys = list(self._used)
        for key in keys:
            self.clear(key)
        return len(keys)

    def clear(self, key: str) -> None:
        checks = self._clear_checks(key)
        if checks:
            self._client.check_batch(checks)
        self._used.pop(key, None)

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        spec = self._remember(key, ("sliding_window_log", limit, expiry))
        return self._check(key, spec, amount).allowed

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        spec: Spec = ("sliding_window_log", limit, expiry)
        query = self._check(key, spec, 0)
        count = 0 if query.fallback else self._count(query)
        if count == 0:
            return time.time(), 0
        probe = None
        if query.remaining + 1 <= limit:
            # Refused (the window has no room for it) and so not counted: its retry time is when
            # the oldest entry leaves the window. Admitted in a race: given back at once.
            probe = self._check(key, spec, query.remaining + 1)
            if probe.allowed and not probe.fallback:
                self._client.refund(self._options.prefix + key, self._limit(spec), query.remaining + 1)
        return self._window_start(query, probe, expiry), count

    def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        if amount > limit:
            return False
        self._remember(key, ("sliding_window_counter", limit, expiry))
        now = time.time()
        checks = self._window_checks(key, expiry, (0, amount), now)
        admits = self._sliding_admits(self._client.check_batch(checks), limit, expiry, now)
        if admits is None and amount > 0:
            try:
                self._client.refund(checks[1].key, checks[1].target, amount)
            except RatemeshError:
                pass  # Counted above the limit until the window ends: refuses early, never late.
        return bool(admits)

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        now = time.time()
        windows = self._client.check_batch(self._window_checks(key, expiry, (0, 0), now))
        return self._sliding_window(windows, expiry, now)

    def clear_sliding_window(self, key: str, expiry: int) -> None:
        self._client.check_batch(self._window_checks(key, expiry, (-REFUND_ALL, -REFUND_ALL), time.time()))


class AsyncRatemeshStorage(
    _Mapping,
    AsyncStorage,
    AsyncMovingWindowSupport,
    AsyncSlidingWindowCounterSupport,
    TimestampedSlidingWindow,
):
    """``async+ratemesh://host:port[,host:port…]``: the asyncio twin of :class:`RatemeshStorage`."""

    STORAGE_SCHEME = ["async+ratemesh"]

    def __init__(self, uri: Optional[str] = None, wrap_exceptions: bool = False, **options: Union[float, str, bool]):
        self._setup(_Options(uri, dict(options), "async+ratemesh"))
        self._client = AsyncClient(
            self._options.nodes,
            timeout=self._options.timeout,
            on_unavailable=self._options.on_unavailable,
            cooldown=self._options.cooldown,
        )
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    @property
    def base_exceptions(self) -> Union[type[Exception], tuple[type[Exception], ...]]:
        return RatemeshError

    async def _check(self, key: str, spec: Spec, cost: int) -> Decision:
        return await self._client.check(self._options.prefix + key, self._limit(spec), cost=cost)

    async def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        spec = self._remember(key, self._counter(key, expiry))  # type: ignore[arg-type]
        return self._incr_result(await self._check(key, spec, amount), amount)

    async def get(self, key: str) -> int:
        spec = self._counter(key, None)
        if spec is None:
            return 0
        decision = await self._check(key, spec, 0)
        return 0 if decision.fallback else self._count(decision)

    async def get_expiry(self, key: str) -> float:
        spec = self._counter(key, None)
        if spec is None:
            return time.time()
        return time.time() + (await self._check(key, spec, 0)).reset_after_ms / 1000

    async def check(self) -> bool:
        return await self._client.healthy()

    async def reset(self) -> Optional[int]:
        keys = list(self._used)
        for key in keys:
            await self.clear(key)
        return len(keys)

    async def clear(self, key: str) -> None:
        checks = self._clear_checks(key)
        if checks:
            await self._client.check_batch(checks)
        self._used.pop(key, None)

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        spec = self._remember(key, ("sliding_window_log", limit, expiry))
        return (await self._check(key, spec, amount)).allowed

    async def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        spec: Spec = ("sliding_window_log", limit, expiry)
        query = await self._check(key, spec, 0)
        count = 0 if query.fallback else self._count(query)
        if count == 0:
            return time.time(), 0
        probe = None
        if query.remaining + 1 <= limit:
            probe = await self._check(key, spec, query.remaining + 1)
            if probe.allowed and not probe.fallback:
                await self._client.refund(self._options.prefix + key, self._limit(spec), query.remaining + 1)
        return self._window_start(query, probe, expiry), count

    async def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        if amount > limit:
            return False
        self._remember(key, ("sliding_window_counter", limit, expiry))
        now = time.time()
        checks = self._window_checks(key, expiry, (0, amount), now)
        admits = self._sliding_admits(await self._client.check_batch(checks), limit, expiry, now)
        if admits is None and amount > 0:
            try:
                await self._client.refund(checks[1].key, checks[1].target, amount)
            except RatemeshError:
                pass  # Counted above the limit until the window ends: refuses early, never late.
        return bool(admits)

    async def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        now = time.time()
        windows = await self._client.check_batch(self._window_checks(key, expiry, (0, 0), now))
        return self._sliding_window(windows, expiry, now)

    async def clear_sliding_window(self, key: str, expiry: int) -> None:
        await self._client.check_batch(self._window_checks(key, expiry, (-REFUND_ALL, -REFUND_ALL), time.time()))
