"""Sync and asyncio clients of ratemeshd's HTTP API, with failover over a list of nodes.

Each call tries the nodes in turn, starting with the one that answered last: a node that refuses
the connection, times out or answers 503 (overloaded, not ready) is skipped for ``cooldown``
seconds and the next one is asked. A 4xx answer is the server's verdict on the input and raises
:class:`RequestError` at once. When no node answers, ``on_unavailable`` decides: ``"raise"``
(:class:`UnavailableError`, or :class:`ServerError` when a node answered 5xx), ``"allow"`` (fail
open) or ``"deny"`` (fail closed, ``retry_after`` = ``cooldown``).

A check retried on another node after a timeout may have been counted by the first node too:
a retry errs towards consuming, never towards admitting more.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import httpx

from ._model import (
    RATE_LIMIT_HEADERS,
    Check,
    Decision,
    GroupDecision,
    OnUnavailable,
    RequestError,
    ServerError,
    Target,
    UnavailableError,
    target_json,
)

Nodes = Union[str, Sequence[str]]


def parse_nodes(nodes: Nodes) -> list[str]:
    """``"h1:8080,h2:8080"``, ``["h1:8080", "http://h2:8080"]`` → base URLs. Raises ValueError
    naming the bad entry."""
    items = nodes.split(",") if isinstance(nodes, str) else list(nodes)
    urls: list[str] = []
    for item in items:
        text = item.strip().rstrip("/")
        if not text:
            continue
        url = text if "://" in text else f"http://{text}"
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host or parsed.port is None:
            raise ValueError(f"ratemesh node {item!r}: expected host:port or http(s)://host:port")
        urls.append(f"{parsed.scheme}://{parsed.host}:{parsed.port}" if ":" not in parsed.host else f"{parsed.scheme}://[{parsed.host}]:{parsed.port}")
    if not urls:
        raise ValueError("ratemesh: at least one node address (host:port) is required")
    return urls


class _Retry(Exception):
    """This node could not decide; try the next."""

    def __init__(self, why: str, server_error: Optional[ServerError] = None):
        super().__init__(why)
        self.why = why
        self.server_error = server_error


class _Core:
    """What the sync and async clients share: node order, cooldowns, answers."""

    def __init__(self, nodes: Nodes, timeout: float, on_unavailable: OnUnavailable, cooldown: float):
        if on_unavailable not in ("raise", "allow", "deny"):
            raise ValueError(f"on_unavailable: 'raise', 'allow' or 'deny', not {on_unavailable!r}")
        if timeout <= 0 or cooldown < 0:
            raise ValueError("timeout must be above 0 and cooldown at least 0")
        self.nodes = parse_nodes(nodes)
        self.timeout = timeout
        self.on_unavailable = on_unavailable
        self.cooldown = cooldown
        self._preferred = 0
        self._down_until: dict[str, float] = {}
        self._lock = threading.Lock()

    def order(self) -> list[str]:
        """Nodes to try: the preferred one first, nodes in cooldown last."""
        now = time.monotonic()
        with self._lock:
            start = self._preferred
            ring = self.nodes[start:] + self.nodes[:start]
            up = [n for n in ring if self._down_until.get(n, 0.0) <= now]
            down = [n for n in ring if self._down_until.get(n, 0.0) > now]
        return up + down

    def answered(self, node: str) -> None:
        with self._lock:
            self._down_until.pop(node, None)
            self._preferred = self.nodes.index(node)

    def failed(self, node: str) -> None:
        with self._lock:
            self._down_until[node] = time.monotonic() + self.cooldown

    def interpret(self, node: str, status: int, content: bytes) -> Any:
        """The JSON of a 2xx answer; raises RequestError (4xx) or _Retry."""
        if 200 <= status < 300:
            try:
                return json.loads(content)
            except ValueError as error:
                raise _Retry(f"malformed JSON answer: {error}") from None
        message, field = _error_of(content)
        if status in (502, 503, 504):
            raise _Retry(f"HTTP {status}: {message}")
        if 400 <= status < 500:
            raise RequestError(status, message, field, node)
        raise _Retry(f"HTTP {status}: {message}", ServerError(status, message, node))

    def give_up(self, errors: list[tuple[str, str]], server_error: Optional[ServerError]) -> None:
        """Raises unless on_unavailable decides (then the caller builds the fallback)."""
        if self.on_unavailable == "raise":
            if server_error is not None:
                raise server_error
            raise UnavailableError(errors)


def _error_of(content: bytes) -> tuple[str, Optional[str]]:
    try:
        body = json.loads(content)
        if isinstance(body, dict) and "error" in body:
            field = body.get("field")
            return str(body["error"]), None if field is None else str(field)
    except ValueError:
        pass
    return content.decode("utf-8", "replace").strip()[:500] or "(empty body)", None


def _rate_headers(headers: httpx.Headers) -> dict[str, str]:
    return {name: headers[name] for name in RATE_LIMIT_HEADERS if name in headers}


def _check_body(key: str, target: Target, cost: int, tier: Optional[str]) -> dict[str, Any]:
    return Check(key, target, cost, tier).to_json()


def _group(body: Any, headers: Mapping[str, str], node: str) -> GroupDecision:
    return GroupDecision(
        allowed=bool(body["allowed"]),
        results=[Decision.from_json(item, {}, node) for item in body["results"]],
        node=node,
    )


def _release_body(key: str, target: Target, lease: Union[str, int]) -> dict[str, Any]:
    body: dict[str, Any] = {"key": key, "lease": str(lease)}
    body.update(target_json(target))
    return body


def _fallback_group(core: _Core, count: int) -> GroupDecision:
    allowed = core.on_unavailable == "allow"
    decision = Decision.unavailable(allowed, core.cooldown)
    return GroupDecision(allowed=allowed, results=[decision] * count, fallback=True)


class Client:
    """A synchronous client. Thread-safe; keeps connections alive (one pool for all nodes).

    >>> client = Client(["127.0.0.1:8080", "127.0.0.1:8082"], timeout=0.5, on_unavailable="allow")
    >>> client.check("user:42", "api").allowed  # doctest: +SKIP
    """

    def __init__(
        self,
        nodes: Nodes,
        *,
        timeout: float = 1.0,
        on_unavailable: OnUnavailable = "raise",
        cooldown: float = 5.0,
        headers: Optional[Mapping[str, str]] = None,
        transport: Optional[httpx.BaseTransport] = None,
    ):
        self._core = _Core(nodes, timeout, on_unavailable, cooldown)
        self._http = httpx.Client(
            timeout=timeout,
            headers=dict(headers or {}),
            # ratemeshd closes a connection idle for 5 s: stop reusing it before that.
            limits=httpx.Limits(max_keepalive_connections=32, keepalive_expiry=4.0),
            transport=transport,
        )

    @property
    def nodes(self) -> list[str]:
        return list(self._core.nodes)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(
        self, method: str, path: str, body: Any = None, *, raise_always: bool = False
    ) -> Optional[tuple[Any, dict[str, str], str]]:
        errors: list[tuple[str, str]] = []
        server_error: Optional[ServerError] = None
        for node in self._core.order():
            try:
                answer = self._http.request(
                    method, node + path, content=None if body is None else json.dumps(body).encode(),
                    headers=None if body is None else {"content-type": "application/json"},
                )
                result = self._core.interpret(node, answer.status_code, answer.content)
            except httpx.HTTPError as error:
                errors.append((node, f"{type(error).__name__}: {error}"))
                self._core.failed(node)
                continue
            except _Retry as retry:
                errors.append((node, retry.why))
                server_error = retry.server_error or server_error
                self._core.failed(node)
                continue
            self._core.answered(node)
            return result, _rate_headers(answer.headers), node
        if raise_always:
            raise server_error if server_error is not None else UnavailableError(errors)
        self._core.give_up(errors, server_error)
        return None

    def check(self, key: str, target: Target, *, cost: int = 1, tier: Optional[str] = None) -> Decision:
        """Takes ``cost`` hits of ``key`` under a policy name or an inline :class:`Limit`."""
        got = self._request("POST", "/v1/check", _check_body(key, target, cost, tier))
        if got is None:
            return Decision.unavailable(self._core.on_unavailable == "allow", self._core.cooldown)
        return Decision.from_json(got[0], got[1], got[2])

    def query(self, key: str, target: Target, *, tier: Optional[str] = None) -> Decision:
        """Whether a hit would pass now, without taking one (cost 0)."""
        return self.check(key, target, cost=0, tier=tier)

    def refund(self, key: str, target: Target, hits: int, *, tier: Optional[str] = None) -> Decision:
        """Gives ``hits`` back (a check of cost ``-hits``); the answer is a cost-1 view."""
        if hits <= 0:
            raise ValueError("refund: hits must be above 0")
        return self.check(key, target, cost=-hits, tier=tier)

    def charge(self, key: str, target: Target, cost: int, *, tier: Optional[str] = None) -> Decision:
        """Applies ``cost`` hits unconditionally (``POST /v1/charge``; the key may go into debt)."""
        body = _check_body(key, target, cost, tier)
        got = self._request("POST", "/v1/charge", body)
        if got is None:
            return Decision.unavailable(self._core.on_unavailable == "allow", self._core.cooldown)
        return Decision.from_json(got[0], got[1], got[2])

    def check_batch(self, checks: Iterable[Check]) -> list[Decision]:
        """Independent checks in one request (``POST /v1/check/batch``)."""
        items = list(checks)
        got = self._request("POST", "/v1/check/batch", [c.to_json() for c in items])
        if got is None:
            return _fallback_group(self._core, len(items)).results
        return [Decision.from_json(item, {}, got[2]) for item in got[0]]

    def check_all(self, checks: Iterable[Check]) -> GroupDecision:
        """All or nothing (``POST /v1/check/all``): every check passes, or none takes hits."""
        items = list(checks)
        got = self._request("POST", "/v1/check/all", [c.to_json() for c in items])
        if got is None:
            return _fallback_group(self._core, len(items))
        return _group(got[0], got[1], got[2])

    def release(self, key: str, target: Target, lease: Union[str, int]) -> Optional[bool]:
        """Ends a concurrency lease: True released, False not held (already released or
        expired), None when the key's owner is another member (the release went there). Raises
        :class:`UnavailableError` when no node answers, whatever ``on_unavailable`` (the lease then
        expires a period after its grant)."""
        got = self._request("POST", "/v1/release", _release_body(key, target, lease), raise_always=True)
        assert got is not None
        released = got[0].get("released")
        return None if released is None else bool(released)

    def healthy(self) -> bool:
        """Whether some node answers ``GET /readyz`` with 200."""
        for node in self._core.order():
            try:
                if self._http.get(node + "/readyz").status_code == 200:
                    return True
            except httpx.HTTPError:
                continue
        return False


class AsyncClient:
    """The asyncio client: the same calls as :class:`Client`, awaited."""

    def __init__(
        self,
        nodes: Nodes,
        *,
        timeout: float = 1.0,
        on_unavailable: OnUnavailable = "raise",
        cooldown: float = 5.0,
        headers: Optional[Mapping[str, str]] = None,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ):
        self._core = _Core(nodes, timeout, on_unavailable, cooldown)
        self._http = httpx.AsyncClient(
            timeout=timeout,
            headers=dict(headers or {}),
            limits=httpx.Limits(max_keepalive_connections=32, keepalive_expiry=4.0),
            transport=transport,
        )

    @property
    def nodes(self) -> list[str]:
        return list(self._core.nodes)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(
        self, method: str, path: str, body: Any = None, *, raise_always: bool = False
    ) -> Optional[tuple[Any, dict[str, str], str]]:
        errors: list[tuple[str, str]] = []
        server_error: Optional[ServerError] = None
        for node in self._core.order():
            try:
                answer = await self._http.request(
                    method, node + path, content=None if body is None else json.dumps(body).encode(),
                    headers=None if body is None else {"content-type": "application/json"},
                )
                result = self._core.interpret(node, answer.status_code, answer.content)
            except httpx.HTTPError as error:
                errors.append((node, f"{type(error).__name__}: {error}"))
                self._core.failed(node)
                continue
            except _Retry as retry:
                errors.append((node, retry.why))
                server_error = retry.server_error or server_error
                self._core.failed(node)
                continue
            self._core.answered(node)
            return result, _rate_headers(answer.headers), node
        if raise_always:
            raise server_error if server_error is not None else UnavailableError(errors)
        self._core.give_up(errors, server_error)
        return None

    async def check(self, key: str, target: Target, *, cost: int = 1, tier: Optional[str] = None) -> Decision:
        got = await self._request("POST", "/v1/check", _check_body(key, target, cost, tier))
        if got is None:
            return Decision.unavailable(self._core.on_unavailable == "allow", self._core.cooldown)
        return Decision.from_json(got[0], got[1], got[2])

    async def query(self, key: str, target: Target, *, tier: Optional[str] = None) -> Decision:
        return await self.check(key, target, cost=0, tier=tier)

    async def refund(self, key: str, target: Target, hits: int, *, tier: Optional[str] = None) -> Decision:
        if hits <= 0:
            raise ValueError("refund: hits must be above 0")
        return await self.check(key, target, cost=-hits, tier=tier)

    async def charge(self, key: str, target: Target, cost: int, *, tier: Optional[str] = None) -> Decision:
        got = await self._request("POST", "/v1/charge", _check_body(key, target, cost, tier))
        if got is None:
            return Decision.unavailable(self._core.on_unavailable == "allow", self._core.cooldown)
        return Decision.from_json(got[0], got[1], got[2])

    async def check_batch(self, checks: Iterable[Check]) -> list[Decision]:
        items = list(checks)
        got = await self._request("POST", "/v1/check/batch", [c.to_json() for c in items])
        if got is None:
            return _fallback_group(self._core, len(items)).results
        return [Decision.from_json(item, {}, got[2]) for item in got[0]]

    async def check_all(self, checks: Iterable[Check]) -> GroupDecision:
        items = list(checks)
        got = await self._request("POST", "/v1/check/all", [c.to_json() for c in items])
        if got is None:
            return _fallback_group(self._core, len(items))
        return _group(got[0], got[1], got[2])

    async def release(self, key: str, target: Target, lease: Union[str, int]) -> Optional[bool]:
        got = await self._request("POST", "/v1/release", _release_body(key, target, lease), raise_always=True)
        assert got is not None
        released = got[0].get("released")
        return None if released is None else bool(released)

    async def healthy(self) -> bool:
        for node in self._core.order():
            try:
                if (await self._http.get(node + "/readyz")).status_code == 200:
                    return True
            except httpx.HTTPError:
                continue
        return False
