"""Emulated Envoys against ratemeshd's RLQS listeners (run by run.sh): ADDRESSES MODE [HTTP PIDS].

ADDRESSES is one RLQS address, or several (comma-separated, one per node of a cluster): the
Envoys of a scenario connect to them in turn, so every Envoy of a three-node cluster speaks to
another node, and the limit they share goes through the key's owner (`rlqs::fleet`). With a
cluster, HTTP (the nodes' HTTP ports) lets the run wait for two fleet rounds on every node after
each simulated period (`GET /v1/rlqs`), and PIDS (the nodes' process ids) lets it kill the
key's owner (scenario 6).

MODE `envoy` behaves as Envoy's `rate_limit_quota` filter does (FIELD-NOTES-3 §1.2): one stream
per Envoy and domain; the domain on every message; a bucket's first report at once, with a
time_elapsed truncated to whole seconds (so 0 s); then every bucket every 5 s, elapsed in whole
seconds; a token bucket's rate is tokens_per_fill over the whole seconds of fill_interval; a
changed assignment starts its bucket full, an identical one keeps it. MODE `spec` reads the proto
literally: elapsed times with nanoseconds (4.75 s, 5.25 s) and rates over the exact fill_interval.

Traffic runs in simulated time (each Envoy's token bucket from the assignments the server really
sent; a report says what it admitted and refused over its period), so a minute takes a second.
Each report is answered at once; a reader thread per stream applies the pushes. Checked, against
a policy of 1 000/s with a burst of 1 000 (the bounds of issue 44, point 6, on one node):

 1. a first report is answered at once: a token bucket, whole-second fill interval and TTL;
 2. 3 Envoys at 600/s: after the first 10 s, the admitted total is within 0.95-1.05 x the limit,
    and the assigned rates sum to at most the limit;
 3. skew 1 500 / 300 / 200 per s: each Envoy's admitted rate within 10 % of 750 / 150 / 100;
 4. below the limit (3 x 200/s): at least 99 % admitted;
 5. one Envoy leaves: the server pushes the two others larger shares as soon as the stream ends,
    and they hold the whole limit within 3 report periods.
 6. (a cluster) the key's owner is killed (SIGKILL) and its Envoy reconnects to the next node,
    keeping what it holds until it is answered there: after every period the rates the three
    Envoys hold sum to at most the limit; what they admit from the kill on is at most the limit
    over that time plus one burst (Envoy starts a changed assignment's bucket full); and they
    hold at least 0.95 x the limit at the end.
"""

import json
import os
import queue
import signal
import sys
import threading
import time
import urllib.request

import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc

ADDRESSES, MODE = sys.argv[1].split(","), sys.argv[2]
HTTP = sys.argv[3].split(",") if len(sys.argv) > 3 else []
PIDS = [int(pid) for pid in sys.argv[4].split(",")] if len(sys.argv) > 4 else []
CLUSTER = len(ADDRESSES) > 1
LIVE = list(range(len(ADDRESSES)))  # the nodes not killed
DOMAIN = "edge"
LIMIT = 1000.0
BURST = 1000.0
TIMEOUT_S = 10


def fail(message):
    print(f"envoy_like ({MODE}): FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def say(message):
    print(f"envoy_like ({MODE}): {message}", flush=True)


class Envoy:
    """One stream; the assignments it holds; its simulated token buckets."""

    def __init__(self, name, node=0):
        self.name = name
        self.node = node
        self.outbox = queue.Queue()
        self.answers = queue.Queue()
        self.held = {}  # bucket key -> (rate, max_tokens, fill_interval_s, ttl_s)
        self.tokens = {}
        self.lock = threading.Lock()
        self.reports = 0
        channel = grpc.insecure_channel(ADDRESSES[node])
        stub = rlqs_pb2_grpc.RateLimitQuotaServiceStub(channel)
        self.call = stub.StreamRateLimitQuotas(iter(self.outbox.get, None))
        self.channel = channel
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        """Queues what the server sends; the main thread applies it in stream order, at its
        report (so every run sees the same sequence, whatever the threads' timing)."""
        try:
            for response in self.call:
                self.answers.put(response)
        except grpc.RpcError as error:
            self.answers.put(error)

    def take(self, what):
        """Applies the next message from the server (bounded wait); returns it."""
        try:
            answer = self.answers.get(timeout=TIMEOUT_S)
        except queue.Empty:
            fail(f"{self.name}: nothing from the server within {TIMEOUT_S} s: {what}")
        if isinstance(answer, grpc.RpcError):
            fail(f"{self.name}: the stream failed: {answer.code()} {answer.details()}")
        with self.lock:
            for action in answer.bucket_action:
                self.apply(action)
        return answer

    def apply(self, action):
        key = tuple(sorted(action.bucket_id.bucket.items()))
        if action.HasField("abandon_action"):
            self.held.pop(key, None)
            return
        assignment = action.quota_assignment_action
        ttl = assignment.assignment_time_to_live
        strategy = assignment.rate_limit_strategy
        if not strategy.HasField("token_bucket"):
            if strategy.HasField("requests_per_time_unit"):
                fail("requests_per_time_unit: Envoy ignores it")
            rate = float("inf") if strategy.blanket_rule == 0 else 0.0  # ALLOW_ALL = 0
            held = (rate, float("inf") if rate else 0.0, 1, ttl.seconds)
        else:
            bucket = strategy.token_bucket
            fill = bucket.fill_interval
            if fill.seconds < 1 or fill.nanos or ttl.nanos or ttl.seconds < 10:
                fail(f"a fill interval or TTL Envoy cannot use: fill {fill}, ttl {ttl}")
            seconds = fill.seconds if MODE == "envoy" else fill.seconds + fill.nanos / 1e9
            held = (bucket.tokens_per_fill.value / seconds, float(bucket.max_tokens), fill.seconds, ttl.seconds)
        if self.held.get(key) != held:
            self.tokens[key] = held[1]  # a changed (or new) assignment starts full
        self.held[key] = held

    def report(self, usages):
        """Sends a report of (bucket, elapsed_s, allowed, denied) and waits for its answer."""
        message = rlqs_pb2.RateLimitQuotaUsageReports(domain=DOMAIN)
        for bucket, elapsed_s, allowed, denied in usages:
            usage = message.bucket_quota_usages.add(num_requests_allowed=allowed, num_requests_denied=denied)
            usage.bucket_id.bucket.update(bucket)
            whole = int(elapsed_s)
            usage.time_elapsed.seconds = whole
            if MODE == "spec":
                usage.time_elapsed.nanos = int(round((elapsed_s - whole) * 1e9))
        # A marker bucket of this report's own: its answer comes after every push sent before
        # it on this stream (one stream is in order), so what this Envoy holds is then current.
        self.reports += 1
        marker = message.bucket_quota_usages.add()
        # (named to sort after the scenarios' buckets in GET /v1/rlqs's lists)
        marker.bucket_id.bucket.update({"~marker": f"{self.name}-{self.reports}"})
        self.outbox.put(message)
        marker_key = tuple(sorted(marker.bucket_id.bucket.items()))
        while marker_key not in {tuple(sorted(a.bucket_id.bucket.items())) for a in self.take("an answer").bucket_action}:
            pass

    def run(self, bucket, demand_per_s, seconds):
        """Admits demand_per_s for `seconds` from its token bucket; (allowed, denied)."""
        key = tuple(sorted(bucket.items()))
        with self.lock:
            rate, max_tokens, _, _ = self.held.get(key, (float("inf"), float("inf"), 1, 0))
            tokens = self.tokens.get(key, max_tokens)
            arrivals = int(round(demand_per_s * seconds))
            allowed = 0
            for _ in range(arrivals):
                tokens = min(max_tokens, tokens + rate * seconds / max(arrivals, 1))
                if tokens >= 1:
                    tokens -= 1
                    allowed += 1
            self.tokens[key] = tokens
        return allowed, arrivals - allowed

    def rate(self, bucket):
        with self.lock:
            return self.held.get(tuple(sorted(bucket.items())), (0.0,))[0]

    def wait_for_rate(self, bucket, done):
        """Applies what the server sends until the rate held for `bucket` satisfies `done`."""
        while not done(self.rate(bucket)):
            self.take("a push")

    def close(self):
        self.outbox.put(None)
        self.channel.close()


def rlqs_state(node):
    with urllib.request.urlopen(f"http://127.0.0.1:{HTTP[node]}/v1/rlqs", timeout=2) as answer:
        return json.load(answer)


def settle(envoys):
    """A cluster: waits until every live node ran two more fleet rounds (its part then reflects
    every report sent before), then has each Envoy take what was pushed to it meanwhile (a
    report of its marker alone). One node: nothing to wait for (its answers are at once)."""
    if not CLUSTER:
        return
    start = {node: rlqs_state(node)["fleet_rounds"] for node in LIVE}
    deadline = time.monotonic() + TIMEOUT_S
    for node in LIVE:
        while rlqs_state(node)["fleet_rounds"] < start[node] + 2:
            if time.monotonic() > deadline:
                fail(f"node {node + 1} ran no two fleet rounds within {TIMEOUT_S} s")
            time.sleep(0.02)  # a bounded poll of the node's counter, not a synchronization
    for envoy in envoys:
        envoy.report([])


def period_s(i):
    """Envoy: 5 s; spec: 4.75 s and 5.25 s in turn (10 s per two periods either way)."""
    return 5.0 if MODE == "envoy" else (4.75 if i % 2 == 0 else 5.25)


def fleet(label, demands, periods, warmup_periods=2, leave_at=None):
    """Runs Envoys with `demands` on one bucket; returns (admitted per s per Envoy after the
    warm-up, the final assigned rates)."""
    bucket = {"scenario": label}
    envoys = [Envoy(f"{label}-{i}", LIVE[i % len(LIVE)]) for i in range(len(demands))]
    for envoy in envoys:
        envoy.report([(bucket, 0.0, 0, 0)])  # the immediate first report: 0 s in whole seconds
        if envoy.rate(bucket) <= 0:
            fail(f"{label}: {envoy.name}'s first report got no quota")
    settle(envoys)
    admitted = [0] * len(envoys)
    measured_s = 0.0
    active = list(range(len(envoys)))
    for i in range(periods):
        if leave_at is not None and i == leave_at:
            envoys[active.pop()].close()
            # The server learns of the leave when the stream ends, in real time (Envoy's reports
            # come every 5 s; here they come at once): the rest get their new shares pushed.
            fair = 0.95 * LIMIT / len(active)
            for e in active:
                envoys[e].wait_for_rate(bucket, lambda rate: rate >= fair)
        seconds = period_s(i)
        for e in active:
            allowed, denied = envoys[e].run(bucket, demands[e], seconds)
            envoys[e].report([(bucket, seconds, allowed, denied)])
            if i >= warmup_periods:
                admitted[e] += allowed
        if i >= warmup_periods:
            measured_s += seconds
        settle([envoys[e] for e in active])
    rates = [envoys[e].rate(bucket) for e in active]
    for e in active:
        envoys[e].close()
    return [a / measured_s for a in admitted], rates


def main():
    first = Envoy("first")
    bucket = {"scenario": "first"}
    first.report([(bucket, 0.0, 0, 0)])
    rate = first.rate(bucket)
    if not 0 < rate <= LIMIT:
        fail(f"the first report's assignment: rate {rate}")
    first.close()
    say(f"ok 1: a first 0-s report answered at once with a token bucket ({rate:.0f}/s)")

    per_s, rates = fleet("over", [600, 600, 600], periods=14)
    total = sum(per_s)
    if not 0.95 * LIMIT <= total <= 1.05 * LIMIT or sum(rates) > LIMIT * 1.0001:
        fail(f"3 x 600/s: admitted {per_s} (total {total:.0f}/s), assigned {rates}")
    say(f"ok 2: 3 x 600/s against 1000/s: {total:.0f}/s admitted ({', '.join(f'{r:.0f}' for r in per_s)}), "
        f"assigned {sum(rates):.0f}/s (static strategy: 1800/s)")

    per_s, rates = fleet("skew", [1500, 300, 200], periods=14)
    for got, want in zip(per_s, [750, 150, 100]):
        if abs(got - want) > 0.1 * want:
            fail(f"skew 1500/300/200: admitted {per_s}, want within 10 % of 750/150/100")
    say(f"ok 3: skew 1500/300/200: {', '.join(f'{r:.0f}' for r in per_s)}/s admitted")

    per_s, _ = fleet("below", [200, 200, 200], periods=8)
    if sum(per_s) < 0.99 * 600:
        fail(f"3 x 200/s: admitted {per_s}")
    say(f"ok 4: 3 x 200/s below the limit: {sum(per_s):.0f} of 600/s admitted")

    # Two periods after the third Envoy leaves, the rest hold the whole limit (3 periods allowed).
    _, rates = fleet("leave", [600, 600, 600], periods=9, leave_at=6)
    if sum(rates) < 0.95 * LIMIT:
        fail(f"one of three left 3 periods ago: the others hold {rates}")
    say(f"ok 5: one of three left: the others hold {sum(rates):.0f}/s within 3 periods")

    if PIDS:
        owner_killed()


def owner_of(label):
    """The node whose ledger holds the scenario's group."""
    for node in LIVE:
        if any(g["key"] == f"scenario={label}" for g in rlqs_state(node)["owned"]):
            return node
    fail(f"no node owns scenario={label}")


def owner_killed():
    """Scenario 6: 3 x 600/s, one Envoy per node; the key's owner is killed after 4 periods."""
    label, demand, periods, kill_at = "kill", 600, 12, 4
    bucket = {"scenario": label}
    envoys = [Envoy(f"{label}-{i}", i) for i in range(3)]
    for envoy in envoys:
        envoy.report([(bucket, 0.0, 0, 0)])
    settle(envoys)
    killed, admitted, elapsed_s, held_max, held_min = None, 0, 0.0, 0.0, LIMIT
    for i in range(periods):
        if i == kill_at:
            killed = owner_of(label)
            os.kill(PIDS[killed], signal.SIGKILL)
            LIVE.remove(killed)
            # Its Envoy reconnects to the next node, holding what it held (Envoy keeps
            # assignments across streams until their TTL).
            orphan = envoys[killed]
            moved = Envoy(orphan.name + "-moved", LIVE[0])
            moved.held, moved.tokens = dict(orphan.held), dict(orphan.tokens)
            orphan.outbox.put(None)
            envoys[killed] = moved
            moved.report([(bucket, 0.0, 0, 0)])
        seconds = period_s(i)
        for envoy in envoys:
            allowed, denied = envoy.run(bucket, demand, seconds)
            envoy.report([(bucket, seconds, allowed, denied)])
            if killed is not None:
                admitted += allowed
        if killed is not None:
            elapsed_s += seconds
        settle(envoys)
        held = sum(envoy.rate(bucket) for envoy in envoys)
        held_max = max(held_max, held)
        if killed is not None:
            held_min = min(held_min, held)
    for envoy in envoys:
        envoy.close()
    bound = LIMIT * elapsed_s + BURST
    if held_max > LIMIT * 1.0001 or admitted > bound or held < 0.95 * LIMIT:
        fail(f"owner (node {killed + 1}) killed: held at most {held_max:.0f}/s, admitted {admitted} "
             f"in {elapsed_s:.0f} s (bound {bound:.0f}), {held:.0f}/s held at the end")
    say(f"ok 6: the key's owner (node {killed + 1}) killed: {held_min:.0f} to {held_max:.0f}/s held after each period, "
        f"{admitted} admitted in the {elapsed_s:.0f} s from the kill (bound {bound:.0f}), {held:.0f}/s held at the end")


if __name__ == "__main__":
    main()
