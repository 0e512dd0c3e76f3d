#!/usr/bin/env python3
"""The open-loop load of tests/wan/run.sh and its report (definitions in README.md).

Each region sends `demand` checks per second, evenly spaced, for `secs` seconds, round-robin
over the region's nodes (`POST /v1/check` of policy `policy`, a key drawn uniformly from `keys`
keys by a seeded generator), whatever the answers (open loop: a request is due at its time
even while earlier ones are outstanding; each has its own deadline). Connections are kept
alive, a pool per node, opened as needed up to POOL_MAX (a request due while all are busy waits
for one, and that wait counts in its latency).

Prints one JSON object: the run's parameters, per region and in total the requests sent,
admitted, refused and failed and the latency percentiles, and the accuracy against an ideal
token bucket per key fed every region's requests in time order.

Usage: load.py PARAMS.json, PARAMS: {"regions": [{"name", "demand_per_s", "nodes":
["127.0.0.1:PORT", ...]}], "secs", "keys", "limit", "period_ms", "policy", "seed",
"relay_pid" (sent SIGUSR1 when the first request is due; 0: none), "params": {...} (echoed)}.
"""

import asyncio
import json
import math
import os
import random
import signal
import sys
import time

POOL_MAX = 64  # connections per node
REQUEST_TIMEOUT_S = 3.0  # a request unanswered by then counts as failed
DRAIN_S = REQUEST_TIMEOUT_S + 1  # after the last request is due, the longest the run waits


class Pool:
    """Kept-alive HTTP/1.1 connections to one node."""

    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.idle = []
        self.open = 0
        self.freed = asyncio.Condition()

    async def take(self):
        async with self.freed:
            while not self.idle and self.open >= POOL_MAX:
                await self.freed.wait()
            if self.idle:
                return self.idle.pop()
            self.open += 1
        try:
            return await asyncio.open_connection(self.host, self.port)
        except OSError:
            await self.lost()
            raise

    async def give(self, conn):
        async with self.freed:
            self.idle.append(conn)
            self.freed.notify()

    async def lost(self):
        async with self.freed:
            self.open -= 1
            self.freed.notify()


async def check(pool, body):
    """One check: whether it was allowed, or None when it failed (an error, a non-200, a timeout)."""
    conn = await pool.take()
    reader, writer = conn
    try:
        head = (
            f"POST /v1/check HTTP/1.1\r\nHost: {pool.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        writer.write(head + body)
        await writer.drain()
        status_line = await reader.readuntil(b"\r\n")
        length = 0
        while True:
            line = await reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        payload = await reader.readexactly(length)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, asyncio.CancelledError):
        writer.close()
        await pool.lost()
        raise
    await pool.give(conn)
    if status_line.split(b" ", 2)[1] != b"200":
        return None
    return bool(json.loads(payload)["allowed"])


async def request(record, pool, body, due):
    try:
        allowed = await asyncio.wait_for(check(pool, body), REQUEST_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, KeyError):
        allowed = None
    record["allowed"] = allowed
    record["latency_s"] = time.monotonic() - due


def schedule(params):
    """Every request of the run: (due offset in seconds, region index, node address, key)."""
    rng = random.Random(params["seed"])
    plan = []
    for index, region in enumerate(params["regions"]):
        count = int(region["demand_per_s"] * params["secs"])
        if count == 0:
            continue
        spacing_s = 1.0 / region["demand_per_s"]
        # A phase per region, so that regions do not send in lockstep.
        phase_s = rng.uniform(0, spacing_s)
        for i in range(count):
            node = region["nodes"][i % len(region["nodes"])]
            plan.append((phase_s + i * spacing_s, index, node, f"wan-key-{rng.randrange(params['keys'])}"))
    plan.sort()
    return plan


async def run(params):
    plan = schedule(params)
    pools = {node: Pool(node) for region in params["regions"] for node in region["nodes"]}
    records = []
    tasks = []
    started = time.monotonic()
    if params.get("relay_pid"):
        os.kill(params["relay_pid"], signal.SIGUSR1)
    for offset_s, region, node, key in plan:
        due = started + offset_s
        wait_s = due - time.monotonic()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        record = {"t_s": offset_s, "region": region, "key": key}
        records.append(record)
        body = json.dumps({"key": key, "policy": params["policy"]}).encode()
        tasks.append(asyncio.ensure_future(request(record, pools[node], body, due)))
    if tasks:
        await asyncio.wait(tasks, timeout=DRAIN_S)
    for task in tasks:
        task.cancel()
    return records


def percentile(values, share):
    """The nearest-rank percentile of `values` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * share // 1))
    return ordered[int(rank) - 1]


def ms(seconds):
    return None if seconds is None else round(seconds * 1000, 2)


def ideal(records, limit, period_ms):
    """Whether an ideal token bucket per key (capacity `limit`, `limit` per `period_ms`, full at
    the start) fed every request in time order admits each."""
    rate_per_s = limit * 1000 / period_ms
    buckets = {}
    admitted = []
    for record in records:
        tokens, last = buckets.get(record["key"], (float(limit), 0.0))
        tokens = min(float(limit), tokens + (record["t_s"] - last) * rate_per_s)
        ok = tokens >= 1.0 - 1e-9
        if ok:
            tokens -= 1.0
        buckets[record["key"]] = (tokens, record["t_s"])
        admitted.append(ok)
    return admitted


def worst_window(records, limit, period_ms):
    """The most admissions of one key in any 1-second window [t, t + 1 s), over the limit per
    second (L × 1000 / P)."""
    times = {}
    for record in records:
        if record["allowed"]:
            times.setdefault(record["key"], []).append(record["t_s"])
    most = 0
    for ts in times.values():
        ts.sort()
        start = 0
        for end, t in enumerate(ts):
            while ts[start] <= t - 1.0:
                start += 1
            most = max(most, end - start + 1)
    return most / (limit * 1000 / period_ms)


def per_second(records, secs):
    """Admissions in each whole second of the run (by due time)."""
    counts = [0] * max(1, math.ceil(secs))
    for record in records:
        if record.get("allowed") is True:
            counts[min(len(counts) - 1, int(record["t_s"]))] += 1
    return counts


def report(params, records):
    limit, period_ms, secs, keys = params["limit"], params["period_ms"], params["secs"], params["keys"]
    rate_per_s = limit * 1000 / period_ms
    ideal_admits = ideal(records, limit, period_ms)
    regions = []
    for index, region in enumerate(params["regions"]):
        mine = [r for r in records if r["region"] == index]
        latencies = [r["latency_s"] for r in mine if r.get("allowed") is not None]
        regions.append(
            {
                "name": region["name"],
                "demand_per_s": region["demand_per_s"],
                "nodes": len(region["nodes"]),
                "sent": len(mine),
                "admitted": sum(1 for r in mine if r.get("allowed") is True),
                "refused": sum(1 for r in mine if r.get("allowed") is False),
                "failed": sum(1 for r in mine if r.get("allowed") is None),
                "p50_ms": ms(percentile(latencies, 0.5)),
                "p99_ms": ms(percentile(latencies, 0.99)),
                "admitted_per_s": per_second(mine, secs),
            }
        )
    sent = len(records)
    admitted = sum(region["admitted"] for region in regions)
    failed = sum(region["failed"] for region in regions)
    false_rejects = sum(1 for r, ok in zip(records, ideal_admits) if ok and r.get("allowed") is False)
    # What a token bucket can admit per key in the run at most: its burst, then its rate.
    ideal_max = keys * (limit + rate_per_s * secs)
    window = worst_window(records, limit, period_ms)
    # A token bucket's most in one second: its burst (L) and a second's refill (L × 1000 / P).
    window_bound = (limit + rate_per_s) / rate_per_s
    latencies = [r["latency_s"] for r in records if r.get("allowed") is not None]
    return {
        "params": params["params"],
        "regions": regions,
        "sent": sent,
        "admitted": admitted,
        "refused": sum(region["refused"] for region in regions),
        "failed": failed,
        "limit_x_seconds": round(keys * rate_per_s * secs, 3),
        "ideal_max": round(ideal_max, 3),
        "ideal_admitted": sum(ideal_admits),
        "over_run": round(admitted / ideal_max - 1, 4) if ideal_max else None,
        "worst_window": round(window, 4),
        "worst_window_bound": round(window_bound, 4),
        "over_window": round(window / window_bound - 1, 4),
        "false_rejects": false_rejects,
        "false_reject_share": round(false_rejects / sent, 4) if sent else None,
        # Which requests are admitted differs between two limiters even when their totals agree
        # (under overload, most of all): the shortfall counts only admissions missing in total.
        "shortfall_share": round(max(0, sum(ideal_admits) - admitted) / sent, 4) if sent else None,
        "failed_share": round(failed / sent, 4) if sent else None,
        "p50_ms": ms(percentile(latencies, 0.5)),
        "p99_ms": ms(percentile(latencies, 0.99)),
    }


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: load.py PARAMS.json")
    with open(sys.argv[1], encoding="utf-8") as f:
        params = json.load(f)
    records = asyncio.run(run(params))
    print(json.dumps(report(params, records)))


if __name__ == "__main__":
    main()
