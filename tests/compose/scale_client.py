#!/usr/bin/env python3
"""The HTTP side of tests/compose-scale.sh: checks sent to every node of a ratemesh cluster at once.

    scale_client.py admit POLICY KEY PER_NODE IP...    PER_NODE checks of KEY to each node (a
                                                     thread per node, in sequence on one
                                                     connection); prints how many were allowed
    scale_client.py hit POLICY KEYS IP...            one check of each key (comma-separated) on
                                                     each node; fails unless every one is allowed
    scale_client.py remaining POLICY KEYS IP...      asks (cost 0) each node for each key's
                                                     remaining; prints the distinct values seen,
                                                     e.g. `94` (all agree) or `94 100`
    scale_client.py whoami IP                        prints the node id of the node at IP

Every request is bounded (10 s) and must be answered 200; anything else exits 1 with the reason
on stderr, so the calling script fails instead of counting an error as a refusal. Nodes are
reached at IP:8080.
"""

import http.client
import json
import sys
import threading

TIMEOUT_S = 10
PORT = 8080


class Failed(Exception):
    pass


def post(connection, ip, body):
    connection.request("POST", "/v1/check", body=json.dumps(body), headers={"content-type": "application/json"})
    response = connection.getresponse()
    text = response.read().decode(errors="replace")
    if response.status != 200:
        raise Failed(f"{ip}: POST /v1/check {body}: {response.status} {text[:200]}")
    return json.loads(text)


def on_every_node(ips, work):
    """Runs work(connection, ip) on a thread per node; returns the results in the order of ips."""
    results, errors = [None] * len(ips), []

    def run(i, ip):
        connection = http.client.HTTPConnection(ip, PORT, timeout=TIMEOUT_S)
        try:
            results[i] = work(connection, ip)
        except (Failed, OSError, ValueError, http.client.HTTPException) as error:
            errors.append(f"{ip}: {error}")
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, ip)) for i, ip in enumerate(ips)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise Failed("; ".join(errors))
    return results


def admit(policy, key, per_node, ips):
    body = {"key": key, "policy": policy}
    counts = on_every_node(ips, lambda c, ip: sum(post(c, ip, body)["allowed"] is True for _ in range(per_node)))
    print(sum(counts))


def hit(policy, keys, ips):
    def work(connection, ip):
        for key in keys:
            if post(connection, ip, {"key": key, "policy": policy})["allowed"] is not True:
                raise Failed(f"{ip}: {key} refused")

    on_every_node(ips, work)


def remaining(policy, keys, ips):
    def work(connection, ip):
        return [post(connection, ip, {"key": key, "policy": policy, "cost": 0})["remaining"] for key in keys]

    seen = sorted({value for values in on_every_node(ips, work) for value in values})
    print(" ".join(map(str, seen)))


def whoami(ip):
    connection = http.client.HTTPConnection(ip, PORT, timeout=TIMEOUT_S)
    try:
        connection.request("GET", "/v1/cluster")
        response = connection.getresponse()
        text = response.read().decode(errors="replace")
        if response.status != 200:
            raise Failed(f"{ip}: GET /v1/cluster: {response.status} {text[:200]}")
        print(json.loads(text)["node"])
    finally:
        connection.close()


def main(argv):
    try:
        command, args = argv[1], argv[2:]
        if command == "admit":
            admit(args[0], args[1], int(args[2]), args[3:])
        elif command == "hit":
            hit(args[0], args[1].split(","), args[2:])
        elif command == "remaining":
            remaining(args[0], args[1].split(","), args[2:])
        elif command == "whoami":
            whoami(args[0])
        else:
            raise Failed(f"unknown command {command}")
    except (Failed, OSError, ValueError, KeyError, IndexError, http.client.HTTPException) as error:
        print(f"scale_client: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
