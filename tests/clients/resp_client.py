#!/usr/bin/env python3
"""tests/resp.sh's redis-py client: CL.THROTTLE through redis-py (RESP2 and RESP3) against ratemeshd.

Usage: resp_client.py HOST PORT

Checks, with the numbers redis-cell gives for the same sequence (max_burst 15, 30 per 60 s: the
emission interval T = 2 s, the tolerance 16 × T = 32 s, the limit 16):

- PING is True; an unknown command raises ResponseError;
- one CL.THROTTLE on a fresh key: [0, 16, 15, -1, 2];
- a client with redis-py's default protocol (RESP3 from redis-py 8: HELLO 3 on connect) gets
  the same answers: PING, then [0, 16, 15, -1, 2] on another fresh key;
- a pipeline (no MULTI: transaction=False) of 100 CL.THROTTLE on another key, sent at once:
  hits 1..16 pass with remaining 15..0 and reset_after 2, 4, ... 32 s; hits 17..100 are refused
  with remaining 0, retry_after 2 s (one interval) and reset_after 32 s.

Exits 1 with a message on the first difference.
"""

import sys

import redis


def expect(what: str, got, wanted) -> None:
    if got != wanted:
        sys.exit(f"resp_client: {what}: got {got!r}, expected {wanted!r}")


def main() -> int:
    host, port = sys.argv[1], int(sys.argv[2])
    client = redis.Redis(host=host, port=port, protocol=2, socket_timeout=5, socket_connect_timeout=5)
    expect("PING", client.ping(), True)
    expect("CL.THROTTLE on a fresh key", client.execute_command("CL.THROTTLE", "py:one", 15, 30, 60), [0, 16, 15, -1, 2])

    try:
        client.execute_command("GET", "py:one")
        sys.exit("resp_client: GET: no error")
    except redis.ResponseError as error:
        expect("GET's error", str(error).startswith("unknown command 'GET'"), True)
    default = redis.Redis(host=host, port=port, socket_timeout=5, socket_connect_timeout=5)
    expect("PING with the default protocol", default.ping(), True)
    expect("CL.THROTTLE with the default protocol", default.execute_command("CL.THROTTLE", "py:default", 15, 30, 60), [0, 16, 15, -1, 2])

    pipe = client.pipeline(transaction=False)
    for _ in range(100):
        pipe.execute_command("CL.THROTTLE", "py:pipelined", 15, 30, 60)
    answers = pipe.execute()
    expect("pipelined answers", len(answers), 100)
    for hit, answer in enumerate(answers, start=1):
        if hit <= 16:
            wanted = [0, 16, 16 - hit, -1, 2 * hit]
        else:
            wanted = [1, 16, 0, 2, 32]
        expect(f"pipelined hit {hit}", answer, wanted)
    print("resp_client: PING, errors, RESP2 and the default protocol, 1 + 100 pipelined CL.THROTTLE: as redis-cell")
    return 0


if __name__ == "__main__":
    sys.exit(main())
