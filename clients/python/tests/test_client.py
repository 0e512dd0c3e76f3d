"""The client and the middleware. Against a live cluster: RATEMESH_NODES="h:p,h:p,h:p" (the
HTTP ports of a three-node cluster with the policies of tests/python/run.sh); without it those
tests fail (they never skip). Failover and server errors also use httpx's mock transport."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

import httpx
import pytest

from ratemesh import (
    AsyncClient,
    Check,
    Client,
    Limit,
    RateLimitMiddleware,
    RequestError,
    ServerError,
    UnavailableError,
    WSGIRateLimitMiddleware,
)


def cluster_nodes() -> list[str]:
    nodes = os.environ.get("RATEMESH_NODES", "")
    assert nodes, "RATEMESH_NODES (the cluster's HTTP host:port list) is not set"
    return nodes.split(",")


def unique(prefix: str) -> str:
    return f"{prefix}:{uuid.uuid4().hex}"


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


EXACT = Limit("token_bucket", 3, period_ms=60_000, mode="exact")


def test_one_limit_across_three_nodes() -> None:
    key = unique("k")
    answers = []
    for node in cluster_nodes():
        with Client(node) as client:
            answers.append(client.check(key, EXACT))
            answers.append(client.check(key, EXACT))
    assert [a.allowed for a in answers].count(True) == 3
    refused = [a for a in answers if not a.allowed]
    assert refused and all(a.retry_after_ms and a.retry_after_ms > 0 for a in refused)
    assert refused[0].headers["retry-after"].isdigit()
    assert "ratelimit-policy" in refused[0].headers and "ratelimit" in refused[0].headers


def test_query_refund_charge_policy() -> None:
    key = unique("q")
    with Client(cluster_nodes()) as client:
        assert client.check(key, "api", cost=4).remaining == 1
        query = client.query(key, "api")
        assert query.allowed and query.remaining == 1
        assert client.query(key, "api").remaining == 1  # a query takes nothing
        assert client.refund(key, "api", 2).remaining == 3
        charged = client.charge(key, "api", 10)
        assert not charged.allowed and charged.retry_after_ms
        assert not client.check(key, "api").allowed


def test_batch_and_all_or_nothing() -> None:
    a, b = unique("a"), unique("b")
    one = Limit("fixed_window", 1, period_ms=60_000, mode="exact")
    with Client(cluster_nodes()) as client:
        group = client.check_all([Check(a, one), Check(b, one)])
        assert group.allowed and group.refused_at is None
        again = client.check_all([Check(unique("c"), one), Check(b, one)])
        assert not again.allowed and again.refused_at == 1
        batch = client.check_batch([Check(a, one, cost=0), Check(unique("d"), one)])
        assert [d.allowed for d in batch] == [False, True]


def test_concurrency_lease_release() -> None:
    key = unique("lease")
    with Client(cluster_nodes()) as client:
        first = client.check(key, "conc")
        second = client.check(key, "conc")
        assert first.lease and second.lease and first.allowed and second.allowed
        assert not client.check(key, "conc").allowed
        released = client.release(key, "conc", first.lease)
        assert released in (True, None)  # None: the owner is another member, the release went there
        deadline = time.monotonic() + 5
        while not client.query(key, "conc").allowed:  # a release sent on to the owner lands soon
            assert time.monotonic() < deadline, "the lease was not released within 5 s"
            time.sleep(0.05)
        assert client.check(key, "conc").allowed
        assert client.release(key, "conc", "12345") in (False, None)


def test_request_error_carries_server_message() -> None:
    with Client(cluster_nodes()) as client:
        with pytest.raises(RequestError) as bad:
            client.check("k", Limit("token_bucket", 0, period_ms=1000))
        assert bad.value.status == 400 and bad.value.field == "limit.limit"
        with pytest.raises(RequestError) as unknown:
            client.check("k", "no-such-policy")
        assert unknown.value.status == 404 and "no-such-policy" in unknown.value.message


def test_failover_past_dead_nodes() -> None:
    nodes = [f"127.0.0.1:{dead_port()}"] + cluster_nodes()
    with Client(nodes, timeout=0.5) as client:
        decision = client.check(unique("f"), EXACT)
        assert decision.allowed and decision.node == "http://" + cluster_nodes()[0]
        # the dead node is in cooldown: the next call starts with the one that answered
        assert client.check(unique("f"), EXACT).node == decision.node


def test_no_node_answers() -> None:
    nodes = [f"127.0.0.1:{dead_port()}", f"127.0.0.1:{dead_port()}"]
    with Client(nodes, timeout=0.3) as client:
        with pytest.raises(UnavailableError) as error:
            client.check("k", EXACT)
        assert len(error.value.errors) == 2
    with Client(nodes, timeout=0.3, on_unavailable="allow") as client:
        opened = client.check("k", EXACT)
        assert opened.allowed and opened.fallback
    with Client(nodes, timeout=0.3, on_unavailable="deny", cooldown=2) as client:
        closed = client.check("k", EXACT)
        assert not closed.allowed and closed.fallback and closed.headers["retry-after"] == "2"
        with pytest.raises(UnavailableError):
            client.release("k", "conc", "1")  # a release never pretends


def test_bad_node_addresses() -> None:
    for bad in ["", "localhost", "ftp://h:1", " , "]:
        with pytest.raises(ValueError):
            Client(bad)
    with pytest.raises(ValueError):
        Client("h:1", on_unavailable="maybe")  # type: ignore[arg-type]


def mock(handler: "httpx.MockTransport") -> Client:
    return Client(["n1:1", "n2:2"], transport=handler)


def test_server_error_and_overload_failover() -> None:
    answer = {"allowed": True, "limit": 5, "remaining": 4, "reset_after_ms": 1, "retry_after_ms": None}
    seen: list[str] = []

    def overloaded_then_ok(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        if request.url.host == "n1":
            return httpx.Response(503, json={"error": "overloaded"})
        return httpx.Response(200, json=answer, headers={"ratelimit": '"api";r=4;t=1'})

    decision = mock(httpx.MockTransport(overloaded_then_ok)).check("k", "api")
    assert decision.allowed and decision.node == "http://n2:2" and seen == ["n1", "n2"]
    assert decision.headers == {"ratelimit": '"api";r=4;t=1'}

    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": "internal: something broke"})

    with pytest.raises(ServerError) as error:
        mock(httpx.MockTransport(broken)).check("k", "api")
    assert "something broke" in str(error.value)

    def garbage(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"not json")

    with pytest.raises(UnavailableError):
        mock(httpx.MockTransport(garbage)).check("k", "api")


async def test_async_client() -> None:
    key = unique("async")
    async with AsyncClient(cluster_nodes()) as client:
        assert (await client.check(key, EXACT, cost=3)).remaining == 0
        assert not (await client.check(key, EXACT)).allowed
        assert (await client.refund(key, EXACT, 1)).allowed
        group = await client.check_all([Check(key, EXACT), Check(unique("x"), EXACT)])
        assert group.allowed
        assert await client.healthy()
    async with AsyncClient([f"127.0.0.1:{dead_port()}"], timeout=0.3, on_unavailable="deny") as dead:
        assert not (await dead.check(key, EXACT)).allowed


def test_asgi_middleware() -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("hello")

    key = unique("asgi")
    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(
        RateLimitMiddleware,
        client=AsyncClient(cluster_nodes()),
        target=Limit("fixed_window", 2, period_ms=60_000, mode="exact"),
        key=lambda scope: None if scope["path"] == "/free" else key,
    )
    with TestClient(app) as http:
        ok = [http.get("/") for _ in range(2)]
        assert [r.status_code for r in ok] == [200, 200]
        assert ok[0].text == "hello" and ok[1].headers["ratelimit"].endswith(f"r=0;t={ok[1].headers['x-ratelimit-reset']}")
        refused = http.get("/")
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["ratelimit-policy"] and refused.headers["x-ratelimit-remaining"] == "0"
        assert json.loads(refused.text)["error"] == "rate limited"
        assert http.get("/free").status_code == 404  # not limited: the app answers


def test_wsgi_middleware() -> None:
    from flask import Flask

    app = Flask(__name__)

    @app.get("/")
    def hello() -> str:
        return "hello"

    key = unique("wsgi")
    app.wsgi_app = WSGIRateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app,
        client=Client(cluster_nodes()),
        target=Limit("sliding_window_log", 2, period_ms=60_000, mode="exact"),
        key=lambda environ: key,
    )
    http = app.test_client()
    assert [http.get("/").status_code for _ in range(2)] == [200, 200]
    refused = http.get("/")
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) >= 50
    assert refused.headers["RateLimit-Policy"] and refused.headers["X-RateLimit-Limit"] == "2"
