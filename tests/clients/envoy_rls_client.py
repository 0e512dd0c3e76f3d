#!/usr/bin/env python3
"""A real Envoy Rate Limit Service v3 client against ratemeshd (run by tests/envoy_rls.sh).

The messages and the gRPC stub are the PyPI package `envoy-data-plane` (code generated from
Envoy's own protos by betterproto2), over grpcio: nothing here was written by this project
except the calls and the assertions. The descriptors are those Envoy's route actions produce for
tests/clients/envoy_policies.toml:

    ("remote_address", ip), ("path", "/login")   -> login-per-ip: 5 per hour
    ("remote_address", ip)                       -> per-ip: 100 per minute
    ("path", "/healthz")                         -> health: unlimited

Exits non-zero (an AssertionError with the response) on the first mismatch. Every call has a
deadline (CALL_TIMEOUT_S): a hung server fails the test, it never hangs it.
"""

import argparse
import collections
import datetime
import importlib.metadata
import sys

import grpc
from envoy_data_plane.envoy.extensions.common.ratelimit.v3 import (
    RateLimitDescriptor,
    RateLimitDescriptorEntry,
)
from envoy_data_plane.envoy.service.ratelimit.v3 import (
    RateLimitRequest,
    RateLimitResponse,
    RateLimitResponseCode,
    RateLimitResponseRateLimitUnit,
    RateLimitServiceSyncStub,
)

CALL_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 10.0
LOGIN_LIMIT = 5
PER_IP_LIMIT = 100
U32_MAX = 2**32 - 1


class _Details(
    collections.namedtuple(
        "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    """Call details with a deadline (grpcio's documented way to change them in an interceptor)."""


class Deadline(grpc.UnaryUnaryClientInterceptor):
    """Gives every unary call a deadline: the package's sync stub takes none."""

    def __init__(self, seconds):
        self.seconds = seconds

    def intercept_unary_unary(self, continuation, details, request):
        bounded = _Details(
            details.method,
            self.seconds,
            details.metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )
        return continuation(bounded, request)


def entry(key, value):
    return RateLimitDescriptorEntry(key=key, value=value)


def login(ip):
    return RateLimitDescriptor(entries=[entry("remote_address", ip), entry("path", "/login")])


def per_ip(ip):
    return RateLimitDescriptor(entries=[entry("remote_address", ip)])


def health():
    return RateLimitDescriptor(entries=[entry("path", "/healthz")])


def show(response: RateLimitResponse) -> str:
    statuses = [
        f"{s.code.name}(limit={s.current_limit and (s.current_limit.name, s.current_limit.requests_per_unit, s.current_limit.unit.name)}, "
        f"remaining={s.limit_remaining}, reset={s.duration_until_reset})"
        for s in response.statuses
    ]
    headers = {h.key: h.value for h in response.response_headers_to_add}
    return f"overall={response.overall_code.name} statuses=[{', '.join(statuses)}] headers={headers}"


def check(condition, what, response):
    if not condition:
        raise AssertionError(f"{what}\n  response: {show(response)}")


def check_limited(status, response, code, name, requests_per_unit, unit, remaining, reset_max_s):
    check(status.code == code, f"code {code.name} expected", response)
    limit = status.current_limit
    check(limit is not None, "current_limit expected", response)
    check(
        (limit.name, limit.requests_per_unit, limit.unit) == (name, requests_per_unit, unit),
        f"current_limit {(name, requests_per_unit, unit.name)} expected",
        response,
    )
    check(status.limit_remaining == remaining, f"limit_remaining {remaining} expected", response)
    reset = status.duration_until_reset
    check(
        isinstance(reset, datetime.timedelta)
        and datetime.timedelta(0) < reset <= datetime.timedelta(seconds=reset_max_s),
        f"duration_until_reset in (0, {reset_max_s} s] expected",
        response,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", required=True, help="ratemeshd's gRPC address, host:port")
    args = parser.parse_args()

    print(
        f"envoy_rls_client: envoy-data-plane {importlib.metadata.version('envoy-data-plane')}, "
        f"grpcio {grpc.__version__}, Python {sys.version.split()[0]}"
    )
    channel = grpc.insecure_channel(args.addr)
    grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT_S)
    stub = RateLimitServiceSyncStub(grpc.intercept_channel(channel, Deadline(CALL_TIMEOUT_S)))
    OK, OVER = RateLimitResponseCode.OK, RateLimitResponseCode.OVER_LIMIT
    HOUR, MINUTE = RateLimitResponseRateLimitUnit.HOUR, RateLimitResponseRateLimitUnit.MINUTE

    # 1. OK until the limit, with every status field filled.
    ip = "203.0.113.7"
    for i in range(LOGIN_LIMIT):
        response = stub.should_rate_limit(RateLimitRequest(domain="edge", descriptors=[login(ip)], hits_addend=1))
        check(response.overall_code == OK, f"call {i + 1}: overall OK expected", response)
        check(len(response.statuses) == 1, "one status per descriptor expected", response)
        check_limited(response.statuses[0], response, OK, "login-per-ip", LOGIN_LIMIT, HOUR, LOGIN_LIMIT - 1 - i, 3600)
        print(f"envoy_rls_client: call {i + 1}: {show(response)}")

    # 2. Then OVER_LIMIT, still filled: the reset is when a token comes back (12 min at most).
    response = stub.should_rate_limit(RateLimitRequest(domain="edge", descriptors=[login(ip)]))
    check(response.overall_code == OVER, "overall OVER_LIMIT expected beyond the limit", response)
    check_limited(response.statuses[0], response, OVER, "login-per-ip", LOGIN_LIMIT, HOUR, 0, 12 * 60)
    headers = {h.key: h.value for h in response.response_headers_to_add}
    check(headers.get("x-ratelimit-remaining") == "0", "x-ratelimit-remaining: 0 expected", response)
    check(headers.get("retry-after", "").isdigit(), "retry-after expected when over the limit", response)
    print(f"envoy_rls_client: call {LOGIN_LIMIT + 1}: {show(response)}")

    # 3. A query (descriptor hits_addend 0) takes nothing and still says OVER_LIMIT.
    query = login(ip)
    query.hits_addend = 0
    response = stub.should_rate_limit(RateLimitRequest(domain="edge", descriptors=[query]))
    check(response.overall_code == OVER, "a query of an exhausted bucket is OVER_LIMIT", response)

    # 4. What Envoy sends for a request with three rate-limit actions: one status per descriptor,
    #    in order; a refused one makes the whole answer OVER_LIMIT.
    response = stub.should_rate_limit(
        RateLimitRequest(domain="edge", descriptors=[per_ip(ip), login(ip), health()])
    )
    check(response.overall_code == OVER, "overall OVER_LIMIT expected (login exhausted)", response)
    check(len(response.statuses) == 3, "three statuses expected", response)
    check_limited(response.statuses[0], response, OK, "per-ip", PER_IP_LIMIT, MINUTE, PER_IP_LIMIT - 1, 60)
    check(response.statuses[1].code == OVER, "login OVER_LIMIT expected", response)
    unlimited = response.statuses[2]
    check(
        unlimited.code == OK and unlimited.current_limit is None and unlimited.limit_remaining == U32_MAX,
        "the unlimited descriptor: OK, no current_limit, limit_remaining 2^32-1 expected",
        response,
    )
    print(f"envoy_rls_client: three descriptors: {show(response)}")

    # 5. Another client address is another bucket; request-level hits_addend counts that many.
    response = stub.should_rate_limit(
        RateLimitRequest(domain="edge", descriptors=[login("203.0.113.8")], hits_addend=2)
    )
    check(response.overall_code == OK, "a fresh address is OK", response)
    check_limited(response.statuses[0], response, OK, "login-per-ip", LOGIN_LIMIT, HOUR, LOGIN_LIMIT - 2, 3600)

    # 6. A domain no policy names: OK, nothing limited.
    response = stub.should_rate_limit(RateLimitRequest(domain="other", descriptors=[login(ip)]))
    check(
        response.overall_code == OK and response.statuses[0].code == OK and response.statuses[0].current_limit is None,
        "an unknown domain is OK without a limit",
        response,
    )

    # 7. A request without descriptors is refused as INVALID_ARGUMENT.
    try:
        stub.should_rate_limit(RateLimitRequest(domain="edge", descriptors=[]))
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
            raise AssertionError(f"INVALID_ARGUMENT expected, got {error.code()}: {error.details()}") from error
    else:
        raise AssertionError("a request without descriptors must be refused")

    channel.close()
    print("envoy_rls_client: OK then OVER_LIMIT with filled statuses: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
