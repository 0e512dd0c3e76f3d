"""Request-smuggling and framing probes against the HTTP/1.1 front. Each case sends requests a
correct HTTP/1.1 server (RFC 9112) must refuse or answer in a way that no proxy in front of it
can be desynchronised by, then checks that the daemon lives, that a well-behaved client is
served real decisions, and that resident memory grew by less than a stated bound."""

import json
import select
import time

import pytest

import wellbehaved
import wire

HIDDEN = b"GET /healthz HTTP/1.1\r\nHost: ratemesh\r\n\r\n"  # a request smuggled in a body


def check_body(key):
    return json.dumps({"key": key, "policy": "probe-http"}).encode()


def connect(daemon):
    return wire.Http1(daemon.http)


def assert_only_answer(client, within_s=2.0):
    """Nothing but the answer already read: the server sends no second response (it would be
    the answer to a smuggled request) and may close the connection or keep it open."""
    client.closed_within(within_s)


def test_duplicate_content_length_is_refused(daemon, memory):
    """Two differing Content-Length fields (5 and the body's length): RFC 9112 6.3 makes the
    message's framing invalid; the server must answer 400 and close the connection, whatever
    follows. Memory: 8 MiB."""
    body = check_body(wellbehaved.fresh_key("dup"))
    client = connect(daemon)
    client.send(b"POST /v1/check HTTP/1.1\r\nHost: ratemesh\r\nContent-Length: 5\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    answer = client.read_response()
    assert answer.status == 400, answer
    assert client.closed_within(5.0), "the connection stayed open after a refused framing"
    client.close()
    wellbehaved.assert_http_served(daemon)
    memory.assert_growth_below(8)


SMUGGLED_CHUNKED = b"0\r\n\r\n" + HIDDEN  # the body ends after "0" by TE; HIDDEN is then a request
SMUGGLED_LENGTH = b"%x\r\n" % len(HIDDEN) + HIDDEN + b"\r\n0\r\n\r\n"  # by CL (4), HIDDEN follows


@pytest.mark.parametrize("order", ["cl-then-te", "te-then-cl"])
@pytest.mark.parametrize("body,length", [(SMUGGLED_CHUNKED, len(SMUGGLED_CHUNKED)), (SMUGGLED_LENGTH, 4)],
                         ids=["cl-covers-hidden", "te-covers-hidden"])
def test_content_length_with_transfer_encoding_is_not_smuggled(daemon, memory, order, body, length):
    """Content-Length and Transfer-Encoding: chunked together, with a second request that one
    framing hides in the body and the other exposes (CL.TE and TE.CL). RFC 9112 6.1: the server
    may refuse (400) or frame by Transfer-Encoding alone, and either way MUST close the
    connection after answering; so exactly one answer, then the close, and never an answer to
    the hidden request. Neither framing makes the body a check (an empty body, or the hidden
    request as the body), so that one answer is 400 either way. Memory: 8 MiB."""
    cl, te = f"Content-Length: {length}\r\n", "Transfer-Encoding: chunked\r\n"
    fields = cl + te if order == "cl-then-te" else te + cl
    client = connect(daemon)
    client.send(f"POST /v1/check HTTP/1.1\r\nHost: ratemesh\r\n{fields}\r\n".encode() + body)
    answer = client.read_response()
    assert answer.status == 400, f"{answer}: not refused"
    assert client.closed_within(5.0), "the connection stayed open after CL with TE (RFC 9112 6.1: MUST close)"
    client.close()
    wellbehaved.assert_http_served(daemon)
    memory.assert_growth_below(8)


def test_obs_fold_is_refused(daemon, memory):
    """A header folded over two lines (obs-fold, RFC 9112 5.2): a server must refuse it with 400
    or unfold it; a front that unfolds while a proxy does not (or the reverse) disagrees on the
    fields, so this daemon refuses: 400 and no answer to the check. Memory: 8 MiB."""
    body = check_body(wellbehaved.fresh_key("fold"))
    client = connect(daemon)
    client.send(b"POST /v1/check HTTP/1.1\r\nHost: ratemesh\r\nX-Note: folded\r\n  over two lines\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    answer = client.read_response()
    assert answer.status == 400, answer
    assert_only_answer(client)
    client.close()
    wellbehaved.assert_http_served(daemon)
    memory.assert_growth_below(8)


def test_bare_lf_never_exposes_a_hidden_request(daemon, memory):
    """A request whose lines end in a bare LF, its body (by Content-Length) an HTTP request.
    RFC 9112 2.2 lets a server accept a bare LF as a line terminator or refuse the request;
    what it must never do is answer the body as a request. So: one answer, 400 (the body is
    not a check, or the request is refused), and nothing else. Memory: 8 MiB."""
    client = connect(daemon)
    client.send(f"POST /v1/check HTTP/1.1\nHost: ratemesh\nContent-Length: {len(HIDDEN)}\n\n".encode() + HIDDEN)
    answer = client.read_response()
    assert answer.status == 400, answer
    assert_only_answer(client)
    client.close()
    wellbehaved.assert_http_served(daemon)
    memory.assert_growth_below(8)


def test_bare_lf_check_is_answered_or_refused(daemon, memory):
    """A whole, valid check whose lines end in a bare LF: answered as the check it is (200 and
    a decision) or refused with 400 (RFC 9112 2.2 allows both); never anything else."""
    key = wellbehaved.fresh_key("lf")
    body = check_body(key)
    client = connect(daemon)
    client.send(f"POST /v1/check HTTP/1.1\nHost: ratemesh\nContent-Length: {len(body)}\n\n".encode() + body)
    answer = client.read_response()
    print(f"bare LF check: {answer.status}")
    assert answer.status in (200, 400), answer
    if answer.status == 200:
        assert json.loads(answer.body)["allowed"] is True, answer
    assert_only_answer(client)
    client.close()
    wellbehaved.assert_http_served(daemon)
    memory.assert_growth_below(8)


HUGE_HEADER_BYTES = 1024 * 1024


def send_while_reading(client, data, within_s):
    """Sends `data` while watching for an answer; stops sending once one arrives, the server
    closes, or the time is up (a server may answer a head it refuses before all of it came)."""
    sock, sent, deadline = client.sock, 0, time.monotonic() + within_s
    sock.setblocking(False)
    try:
        while sent < len(data) and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 0.1)
            if readable:
                return
            if writable:
                try:
                    sent += sock.send(data[sent:sent + 65536])
                except (BrokenPipeError, ConnectionResetError, BlockingIOError):
                    return
    finally:
        sock.setblocking(True)


def test_one_megabyte_header_is_refused(daemon, memory):
    """A request with one header of 1 MiB: the server must bound a request head; the answer is
    431 (Request Header Fields Too Large, RFC 6585) and the connection closed. Memory: 8 MiB,
    as the head is bounded well below 1 MiB."""
    client = connect(daemon)
    head = b"POST /v1/check HTTP/1.1\r\nHost: ratemesh\r\nX-Huge: " + b"h" * HUGE_HEADER_BYTES + b"\r\n"
    send_while_reading(client, head + b"Content-Length: 2\r\n\r\n{}", within_s=10.0)
    answer = client.read_response()
    assert answer.status == 431, answer
    assert client.closed_within(5.0), "the connection stayed open after 431"
    client.close()
    wellbehaved.assert_http_served(daemon)
    memory.assert_growth_below(8)


def test_pipelined_mixed_routes_are_answered_in_order(daemon, memory):
    """Seven requests in one write, mixing the fast check path with the other routes and an
    error: every one answered, in order, each with its own answer (a front that hands the rest
    of a connection to another parser must lose and reorder nothing), the connection closed
    after the last (Connection: close). Memory: 8 MiB."""
    key = wellbehaved.fresh_key("pipe")
    requests = [
        (wire.http_request("POST", "/v1/check", check_body(key)), 200, lambda b: json.loads(b)["allowed"] is True),
        (wire.http_request("GET", "/healthz"), 200, None),
        (wire.http_request("POST", "/v1/check", b"{not json"), 400, lambda b: "error" in json.loads(b)),
        (wire.http_request("GET", "/v1/policies"), 200, lambda b: b"probe-http" in b),
        (wire.http_request("POST", "/v1/check", check_body(key)), 200, lambda b: json.loads(b)["allowed"] is False),
        (wire.http_request("GET", "/no/such/route"), 404, None),
        (wire.http_request("POST", "/v1/check", check_body(key + "-last"), headers=[("Connection", "close")]),
         200, lambda b: json.loads(b)["allowed"] is True),
    ]
    client = connect(daemon)
    client.send(b"".join(request for request, _, _ in requests))
    for index, (_, status, body_ok) in enumerate(requests):
        answer = client.read_response()
        assert answer.status == status, f"answer {index}: {answer}"
        assert body_ok is None or body_ok(answer.body), f"answer {index}: {answer}"
    assert client.closed_within(5.0), "the connection stayed open after Connection: close"
    client.close()
    wellbehaved.assert_http_served(daemon)
    memory.assert_growth_below(8)


def test_expect_100_continue(daemon, memory):
    """A check with `Expect: 100-continue` whose body is sent only after 1 s or on 100 Continue
    (as curl does): the answer is a 100 Continue then the decision, or the decision directly
    (RFC 9110 10.1.1); either way the check is decided once. Memory: 8 MiB."""
    key = wellbehaved.fresh_key("expect")
    body = check_body(key)
    client = connect(daemon)
    client.send(b"POST /v1/check HTTP/1.1\r\nHost: ratemesh\r\nExpect: 100-continue\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode())
    interim = None
    try:
        interim = client.read_response(within_s=1.0)
    except TimeoutError:
        pass  # no 100 Continue: the body goes anyway
    if interim is not None:
        assert interim.status == 100, f"{interim}: not 100 Continue before the body came"
    client.send(body)
    answer = client.read_response()
    assert answer.status == 200 and json.loads(answer.body)["allowed"] is True, answer
    assert_only_answer(client)
    client.close()
    again = wellbehaved.http_check(daemon.http, key)
    assert json.loads(again.body)["allowed"] is False, f"the check was not counted once: {again}"
    wellbehaved.assert_http_served(daemon)
    memory.assert_growth_below(8)
