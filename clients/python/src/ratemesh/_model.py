"""The values of the HTTP API: limits, checks, decisions, and the errors."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional, Union

Algorithm = Literal[
    "token_bucket",
    "gcra",
    "leaky_bucket",
    "fixed_window",
    "sliding_window_counter",
    "sliding_window_log",
    "concurrency",
    "expiring_counter",
]
Mode = Literal["exact", "approximate"]
OnUnavailable = Literal["raise", "allow", "deny"]
"""What a call does when no node answers: raise :class:`UnavailableError` (the default),
answer allowed (fail open) or answer refused (fail closed)."""

#: The headers of a check's answer that the middleware passes on (lower case).
RATE_LIMIT_HEADERS = (
    "retry-after",
    "ratelimit-policy",
    "ratelimit",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
)


class RatemeshError(Exception):
    """Every error of this package."""


class RequestError(RatemeshError):
    """The daemon refused the request (HTTP 4xx): bad input, an unknown policy, a body too large.
    Nothing was counted. ``message`` and ``field`` are the server's."""

    def __init__(self, status: int, message: str, field: Optional[str] = None, node: str = ""):
        self.status = status
        self.message = message
        self.field = field
        self.node = node
        super().__init__(f"HTTP {status} from {node}: {message}" if node else f"HTTP {status}: {message}")


class ServerError(RatemeshError):
    """A node answered with an error of its own (HTTP 5xx other than overload) on every node
    tried; ``message`` is the last server's."""

    def __init__(self, status: int, message: str, node: str = ""):
        self.status = status
        self.message = message
        self.node = node
        super().__init__(f"HTTP {status} from {node}: {message}")


class UnavailableError(RatemeshError):
    """No node answered (connection refused, timed out, overloaded 503) and the client is set to
    raise. ``errors`` lists each node's failure."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        detail = "; ".join(f"{node}: {why}" for node, why in errors) or "no node configured"
        super().__init__(f"no ratemesh node answered ({detail})")


@dataclass(frozen=True)
class Limit:
    """An inline limit (``"limit": {...}`` of a check). ``period_ms`` or, for ``fixed_window``,
    a calendar ``window`` (``minute`` … ``month``) in ``time_zone``."""

    algorithm: Algorithm
    limit: int
    period_ms: Optional[int] = None
    burst: Optional[int] = None
    delay: Optional[int] = None
    mode: Optional[Mode] = None
    fallback: Optional[Literal["local_share", "fail_open", "fail_closed"]] = None
    window: Optional[str] = None
    time_zone: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"algorithm": self.algorithm, "limit": self.limit}
        for name in ("period_ms", "burst", "delay", "mode", "fallback", "window", "time_zone"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        return body


Target = Union[str, Limit]
"""A configured policy's name, or an inline :class:`Limit`."""


@dataclass(frozen=True)
class Check:
    """One check of a batch or an all-or-nothing group."""

    key: str
    target: Target
    cost: int = 1
    tier: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"key": self.key, "cost": self.cost}
        body.update(target_json(self.target))
        if self.tier is not None:
            body["tier"] = self.tier
        return body


def target_json(target: Target) -> dict[str, Any]:
    if isinstance(target, Limit):
        return {"limit": target.to_json()}
    if isinstance(target, str):
        return {"policy": target}
    raise TypeError(f"a target is a policy name (str) or a Limit, not {type(target).__name__}")


@dataclass(frozen=True)
class Decision:
    """The daemon's answer to a check (``POST /v1/check``)."""

    allowed: bool
    limit: int
    remaining: int
    reset_after_ms: int
    retry_after_ms: Optional[int]
    delay_ms: Optional[int] = None
    lease: Optional[str] = None
    headers: Mapping[str, str] = field(default_factory=dict)
    """The rate-limit headers of the answer, lower case (``ratelimit``, ``retry-after``, …)."""
    node: str = ""
    """The node that answered; empty when no node did (fail open or closed)."""
    fallback: bool = False
    """True when no node answered and the client's ``on_unavailable`` decided."""

    @property
    def retry_after(self) -> Optional[float]:
        """Seconds to wait before the same request would pass (None when allowed or never)."""
        return None if self.retry_after_ms is None else self.retry_after_ms / 1000

    @property
    def reset_after(self) -> float:
        """Seconds until the key is back to fresh."""
        return self.reset_after_ms / 1000

    @staticmethod
    def from_json(body: Mapping[str, Any], headers: Mapping[str, str], node: str) -> "Decision":
        lease = body.get("lease")
        return Decision(
            allowed=bool(body["allowed"]),
            limit=int(body["limit"]),
            remaining=int(body["remaining"]),
            reset_after_ms=int(body["reset_after_ms"]),
            retry_after_ms=None if body.get("retry_after_ms") is None else int(body["retry_after_ms"]),
            delay_ms=None if body.get("delay_ms") is None else int(body["delay_ms"]),
            lease=None if lease is None else str(lease),
            headers=dict(headers),
            node=node,
        )

    @staticmethod
    def unavailable(allowed: bool, retry_after_s: float) -> "Decision":
        """The decision of ``on_unavailable="allow"`` or ``"deny"``."""
        headers = {} if allowed else {"retry-after": str(max(1, math.ceil(retry_after_s)))}
        return Decision(
            allowed=allowed,
            limit=0,
            remaining=0,
            reset_after_ms=0,
            retry_after_ms=None if allowed else int(retry_after_s * 1000),
            headers=headers,
            fallback=True,
        )


@dataclass(frozen=True)
class GroupDecision:
    """The answer to an all-or-nothing group (``POST /v1/check/all``)."""

    allowed: bool
    results: list[Decision]
    node: str = ""
    fallback: bool = False

    @property
    def refused_at(self) -> Optional[int]:
        """The index of the check that refused the group, if one did."""
        for index, result in enumerate(self.results):
            if not result.allowed:
                return index
        return None
