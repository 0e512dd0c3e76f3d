"""ASGI (Starlette, FastAPI) and WSGI (Flask, Django) middleware.

Each request's key comes from a callable (``None``: the request is not limited). A refused
request is answered 429 with ``Retry-After`` and the ``RateLimit-*`` / ``X-RateLimit-*`` headers
the daemon returned, and a JSON body; an allowed one goes to the application, its response
gaining the same rate-limit headers when ``add_headers`` (default). What happens when no node
answers is the client's ``on_unavailable``.
"""

from __future__ import annotations

import inspect
import json
import math
from typing import Any, Awaitable, Callable, Iterable, Mapping, MutableMapping, Optional, Union

from ._model import Decision, Target
from .client import AsyncClient, Client

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

AsgiKey = Callable[[Scope], Union[Optional[str], Awaitable[Optional[str]]]]
WsgiKey = Callable[[Mapping[str, Any]], Optional[str]]

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def refusal_headers(decision: Decision) -> list[tuple[str, str]]:
    """The headers of a 429: the daemon's rate-limit headers, ``Retry-After`` in whole seconds
    (rounded up) when the daemon gave none but a retry time."""
    headers = dict(decision.headers)
    if "retry-after" not in headers and decision.retry_after_ms is not None:
        headers["retry-after"] = str(max(1, math.ceil(decision.retry_after_ms / 1000)))
    return sorted(headers.items())


def refusal_body(decision: Decision) -> bytes:
    return json.dumps(
        {"error": "rate limited", "retry_after_ms": decision.retry_after_ms, "limit": decision.limit}
    ).encode()


def client_ip_asgi(scope: Scope) -> Optional[str]:
    """The peer's address (behind a proxy, derive the key from the header it sets instead)."""
    client = scope.get("client")
    return None if not client else str(client[0])


def client_ip_wsgi(environ: Mapping[str, Any]) -> Optional[str]:
    value = environ.get("REMOTE_ADDR")
    return None if not value else str(value)


class RateLimitMiddleware:
    """ASGI middleware: ``app.add_middleware(RateLimitMiddleware, client=..., target="api")``.

    ``key(scope)`` (sync or async) gives the key, ``target`` the policy name or inline limit,
    ``cost`` the hits per request (a number or a callable of the scope)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        client: AsyncClient,
        target: Target,
        key: AsgiKey = client_ip_asgi,
        cost: Union[int, Callable[[Scope], int]] = 1,
        add_headers: bool = True,
    ):
        self.app = app
        self.client = client
        self.target = target
        self.key = key
        self.cost = cost
        self.add_headers = add_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = self.key(scope)
        if inspect.isawaitable(key):
            key = await key
        if key is None:
            await self.app(scope, receive, send)
            return
        cost = self.cost(scope) if callable(self.cost) else self.cost
        decision = await self.client.check(str(key), self.target, cost=cost)
        if not decision.allowed:
            body = refusal_body(decision)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            headers += [(n.encode("latin-1"), v.encode("latin-1")) for n, v in refusal_headers(decision)]
            await send({"type": "http.response.start", "status": 429, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        if not self.add_headers or not decision.headers:
            await self.app(scope, receive, send)
            return
        extra = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in sorted(decision.headers.items())]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        await self.app(scope, receive, send_with_headers)


class WSGIRateLimitMiddleware:
    """WSGI middleware: ``app.wsgi_app = WSGIRateLimitMiddleware(app.wsgi_app, client=..., target="api")``
    (Flask), or wrap Django's ``get_wsgi_application()``."""

    def __init__(
        self,
        app: WSGIApp,
        *,
        client: Client,
        target: Target,
        key: WsgiKey = client_ip_wsgi,
        cost: Union[int, Callable[[Mapping[str, Any]], int]] = 1,
        add_headers: bool = True,
    ):
        self.app = app
        self.client = client
        self.target = target
        self.key = key
        self.cost = cost
        self.add_headers = add_headers

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        key = self.key(environ)
        if key is None:
            return self.app(environ, start_response)
        cost = self.cost(environ) if callable(self.cost) else self.cost
        decision = self.client.check(str(key), self.target, cost=cost)
        if not decision.allowed:
            body = refusal_body(decision)
            headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
            headers += [(_title(n), v) for n, v in refusal_headers(decision)]
            start_response("429 Too Many Requests", headers)
            return [body]
        if not self.add_headers or not decision.headers:
            return self.app(environ, start_response)
        extra = [(_title(n), v) for n, v in sorted(decision.headers.items())]

        def start_with_headers(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, list(headers) + extra, exc_info)

        return self.app(environ, start_with_headers)


def _title(name: str) -> str:
    special = {"ratelimit-policy": "RateLimit-Policy", "ratelimit": "RateLimit"}
    return special.get(name, "-".join(part.capitalize() for part in name.split("-")).replace("Ratelimit", "RateLimit"))
