#!/usr/bin/env python3
"""A delaying UDP relay: the WAN between the regions of tests/wan/run.sh (see README.md).

One process, one asyncio loop, one listening socket per relayed node port (gossip and QUIC).
A node advertises its relay ports, so every datagram a member sends to another crosses the
relay of the receiver:

- a datagram from source S to listener L (in front of node port T) is forwarded to T from an
  upstream socket of L's kept for S (one per distinct source, at most UPSTREAMS_MAX), so that
  T's answers to that socket come back through the relay and are sent on to S from L;
- each datagram goes one way between two regions, the source's (the region whose node owns S's
  port, from the configuration) and the listener's: it is delayed by half the pair's round-trip
  time plus a uniform jitter, dropped with the loss probability between different regions, and
  dropped while a partition cuts one of the two regions off from the others. A source the
  configuration does not know (a client on loopback) counts as in the listener's region.

Partitions are timed from the run's start: SIGUSR1 marks it (the load generator sends it when
its first request is due). Until then no partition applies; delays and loss do. On SIGTERM the
relay writes its counters (JSON) to the stats file, if one was given, and exits.

Usage: relay.py CONFIG.json [STATS.json]. CONFIG: {"rtt_ms": [[...], ...] (a full symmetric
matrix, regions 0..N-1), "jitter_ms", "loss" (0..1), "seed", "partitions": [{"region",
"start_s", "end_s"}], "sources": {"PORT": REGION}, "listeners": [{"port", "target", "region"}]}.
Prints "relay ready" on stdout once every socket is bound.
"""

import asyncio
import json
import random
import signal
import socket
import sys
import time

# Upstream sockets per listener: one per distinct source (a node's gossip or QUIC port); far
# more than a test cluster has, a bound against a flood.
UPSTREAMS_MAX = 256
HOST = "127.0.0.1"


class Wan:
    """The links between regions: delay, jitter, loss and partitions, and the counters."""

    def __init__(self, config):
        self.rtt_ms = config["rtt_ms"]
        self.jitter_ms = float(config.get("jitter_ms", 0))
        self.loss = float(config.get("loss", 0))
        self.partitions = config.get("partitions", [])
        self.sources = {int(port): region for port, region in config["sources"].items()}
        self.random = random.Random(config.get("seed", 1))
        self.started_at = None  # monotonic time of the run's start (SIGUSR1)
        regions = len(self.rtt_ms)
        self.forwarded = [[0] * regions for _ in range(regions)]
        self.lost = [[0] * regions for _ in range(regions)]
        self.partitioned = [[0] * regions for _ in range(regions)]
        self.upstreams_refused = 0

    def region_of(self, port, default):
        return self.sources.get(port, default)

    def cut(self, a, b):
        """Whether a partition separates regions a and b now."""
        if self.started_at is None or a == b:
            return False
        elapsed_s = time.monotonic() - self.started_at
        return any(
            p["start_s"] <= elapsed_s < p["end_s"] and (a == p["region"]) != (b == p["region"])
            for p in self.partitions
        )

    def delay_s(self, a, b):
        """The one-way delay of a datagram from region a to region b, or None to drop it."""
        if self.cut(a, b):
            self.partitioned[a][b] += 1
            return None
        if a != b and self.loss > 0 and self.random.random() < self.loss:
            self.lost[a][b] += 1
            return None
        self.forwarded[a][b] += 1
        delay_ms = self.rtt_ms[a][b] / 2
        if a != b and self.jitter_ms > 0:
            delay_ms += self.random.uniform(0, self.jitter_ms)
        return delay_ms / 1000

    def stats(self):
        return {
            "forwarded": self.forwarded,
            "lost": self.lost,
            "partitioned": self.partitioned,
            "upstreams_refused": self.upstreams_refused,
        }


def send_later(loop, transport, data, addr, delay_s):
    """Sends `data` to `addr` on `transport` after `delay_s` (at once when zero)."""
    if delay_s <= 0:
        transport.sendto(data, addr)
    else:
        loop.call_later(delay_s, send_if_open, transport, data, addr)


def send_if_open(transport, data, addr):
    if not transport.is_closing():
        transport.sendto(data, addr)


class Upstream(asyncio.DatagramProtocol):
    """The socket a listener uses towards its node for one source: answers go back to it."""

    def __init__(self, listener, source):
        self.listener = listener
        self.source = source
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        listener = self.listener
        source_region = listener.wan.region_of(self.source[1], listener.region)
        delay = listener.wan.delay_s(listener.region, source_region)
        if delay is not None:
            send_later(listener.loop, listener.transport, data, self.source, delay)

    def error_received(self, exc):
        pass  # an ICMP error from a node that is gone: UDP loses the datagram, as a WAN would


class Listener(asyncio.DatagramProtocol):
    """The relay port in front of one node port."""

    def __init__(self, loop, wan, target_port, region):
        self.loop = loop
        self.wan = wan
        self.target = (HOST, target_port)
        self.region = region
        self.transport = None
        self.upstreams = {}  # source address -> Upstream (its transport once bound)

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        source_region = self.wan.region_of(addr[1], self.region)
        delay = self.wan.delay_s(source_region, self.region)
        if delay is None:
            return
        upstream = self.upstreams.get(addr)
        if upstream is None:
            if len(self.upstreams) >= UPSTREAMS_MAX:
                self.wan.upstreams_refused += 1
                return
            upstream = Upstream(self, addr)
            self.upstreams[addr] = upstream
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((HOST, 0))
            sock.setblocking(False)
            connecting = self.loop.create_datagram_endpoint(lambda: upstream, sock=sock)
            # Bound at once (the socket exists): the first datagram waits for the transport.
            task = self.loop.create_task(connecting)
            task.add_done_callback(lambda _: send_later(self.loop, upstream.transport, data, self.target, delay))
            return
        if upstream.transport is None:
            return  # its socket is still being wrapped: a datagram lost, as UDP may
        send_later(self.loop, upstream.transport, data, self.target, delay)

    def error_received(self, exc):
        pass


async def main(config_path, stats_path):
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    loop = asyncio.get_running_loop()
    wan = Wan(config)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, lambda: setattr(wan, "started_at", time.monotonic()))
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    transports = []
    for spec in config["listeners"]:
        listener = Listener(loop, wan, spec["target"], spec["region"])
        transport, _ = await loop.create_datagram_endpoint(lambda l=listener: l, local_addr=(HOST, spec["port"]))
        transports.append(transport)
    print("relay ready", flush=True)
    await stop.wait()
    if stats_path:
        with open(stats_path, "w", encoding="utf-8") as f:
            json.dump(wan.stats(), f)
    for transport in transports:
        transport.close()


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: relay.py CONFIG.json [STATS.json]")
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else None))
