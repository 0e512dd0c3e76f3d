"""The second, well-behaved client of every case: a proper gRPC call over the h2 library's
HTTP/2 client, and a proper HTTP/1.1 `POST /v1/check`. Each asks twice for one fresh key of a
policy that allows one hit per hour, and must see it allowed, then refused: a real decision of
the daemon, not any answer."""

import itertools
import json
import socket
import time

import h2.config
import h2.connection
import h2.events

import wire

_keys = itertools.count()


def fresh_key(prefix):
    return f"{prefix}-{time.time_ns()}-{next(_keys)}"


def grpc_call(address, message, timeout_s=wire.IO_TIMEOUT_S):
    """One unary call on a new connection: (grpc-status, response message or None)."""
    sock = socket.create_connection(address, timeout=timeout_s)
    try:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, wire.request_headers(f"{address[0]}:{address[1]}"))
        conn.send_data(stream, wire.grpc_message(message), end_stream=True)
        sock.sendall(conn.data_to_send())
        return _grpc_answer(sock, conn, stream, time.monotonic() + timeout_s)
    finally:
        sock.close()


def _grpc_answer(sock, conn, stream, deadline):
    headers, data = {}, b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        assert chunk, "the gRPC connection closed before the answer"
        for event in conn.receive_data(chunk):
            if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                headers.update(dict(event.headers))
            elif isinstance(event, h2.events.DataReceived):
                data += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamReset) and event.stream_id == stream:
                raise AssertionError(f"the call was reset: error {event.error_code}")
            elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                status = headers.get("grpc-status")
                message = data[5:] if len(data) >= 5 else None
                return status, message
        sock.sendall(conn.data_to_send())
        assert time.monotonic() < deadline, "no gRPC answer in time"


def assert_grpc_served(daemon):
    """A well-behaved gRPC client gets real decisions: OK, then OVER_LIMIT for the same key."""
    assert daemon.alive(), f"ratemeshd died:\n{daemon.log_tail()}"
    request = wire.rate_limit_request("hostile", [[("probe", fresh_key("grpc"))]])
    for expected in (wire.OK, wire.OVER_LIMIT):
        status, message = grpc_call(daemon.grpc, request)
        assert status == "0", f"grpc-status {status}"
        assert message is not None and wire.overall_code(message) == expected, message


def http_check(address, key, timeout_s=wire.IO_TIMEOUT_S):
    """One `POST /v1/check` of `key` under `probe-http` on a new connection: the Response."""
    body = json.dumps({"key": key, "policy": "probe-http"}).encode()
    client = wire.Http1(address)
    try:
        client.send(wire.http_request("POST", "/v1/check", body))
        return client.read_response(timeout_s)
    finally:
        client.close()


def assert_http_served(daemon):
    """A well-behaved HTTP/1.1 client gets real decisions: allowed, then refused."""
    assert daemon.alive(), f"ratemeshd died:\n{daemon.log_tail()}"
    key = fresh_key("http")
    for allowed in (True, False):
        answer = http_check(daemon.http, key)
        assert answer.status == 200, answer
        assert json.loads(answer.body)["allowed"] is allowed, answer
