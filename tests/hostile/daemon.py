"""A ratemeshd process of its own for a hostile case: free loopback ports, a configuration file it
writes, readiness, liveness and resident memory. Black box: the binary is run as an operator
would run it and only its sockets and /proc are looked at."""

import ctypes
import os
import signal
import socket
import subprocess
import time
import urllib.request

READY_S = 30  # the bound on the daemon's start (a debug build on a busy machine)

# Two policies of the RLS domain `hostile` and one named HTTP policy. `probe` and `probe-http`
# allow one hit per key per hour, so that a well-behaved client can tell a real decision
# (OK, then OVER_LIMIT for the same key) from any answer; `load` is what attacks call.
POLICIES = """
[[policies]]
name = "probe"
domain = "hostile"
descriptors = [{ key = "probe" }]
algorithm = "token_bucket"
limit = 1
period_ms = 3600000
mode = "exact"

[[policies]]
name = "load"
domain = "hostile"
descriptors = [{ key = "load" }]
algorithm = "token_bucket"
limit = 1000000000
period_ms = 60000
mode = "exact"

[[policies]]
name = "probe-http"
algorithm = "token_bucket"
limit = 1
period_ms = 3600000
mode = "exact"
"""


def _die_with_parent():
    """In the child, before exec: SIGKILL when the suite's process dies (PR_SET_PDEATHSIG), so
    that a suite killed by its timeout leaves no daemon behind."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def free_ports(kinds):
    """Distinct free loopback ports, one per kind ("tcp" or "udp"), all held while picked."""
    held, ports = [], []
    try:
        while len(ports) < len(kinds):
            kind = socket.SOCK_DGRAM if kinds[len(ports)] == "udp" else socket.SOCK_STREAM
            s = socket.socket(socket.AF_INET, kind)
            held.append(s)
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] not in ports:
                ports.append(s.getsockname()[1])
    finally:
        for s in held:
            s.close()
    return ports


class Daemon:
    """One ratemeshd: `http` and `grpc` are its (host, port) addresses."""

    def __init__(self, binary, workdir):
        self.binary = binary
        http, grpc, gossip, quic = free_ports(["tcp", "tcp", "udp", "udp"])
        self.http = ("127.0.0.1", http)
        self.grpc = ("127.0.0.1", grpc)
        self.config = os.path.join(workdir, "ratemesh.toml")
        self.log_path = os.path.join(workdir, "ratemeshd.log")
        with open(self.config, "w") as f:
            f.write("[listen]\n")
            f.write(f'http = "127.0.0.1:{http}"\ngrpc = "127.0.0.1:{grpc}"\n')
            f.write(f'gossip = "127.0.0.1:{gossip}"\nquic = "127.0.0.1:{quic}"\n')
            f.write(POLICIES)
        self.process = None

    def start(self):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # no RATEMESH_ variable leaks in
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [self.binary, "serve", "--config", self.config],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            assert self.alive(), f"ratemeshd exited at start:\n{self.log_tail()}"
            if self._ready():
                return
            time.sleep(0.05)
        raise AssertionError(f"ratemeshd not ready within {READY_S} s:\n{self.log_tail()}")

    def _ready(self):
        try:
            url = f"http://{self.http[0]}:{self.http[1]}/readyz"
            with urllib.request.urlopen(url, timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def rss_kib(self):
        """Resident memory (VmRSS) in KiB."""
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS in /proc/PID/status")

    def settled_rss_kib(self, quiet_s=0.3, bound_s=10.0):
        """VmRSS once it stopped growing for `quiet_s` (at most `bound_s`): the memory a workload
        holds once the daemon has processed what it was sent, not a snapshot mid-way."""
        deadline = time.monotonic() + bound_s
        last = self.rss_kib()
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = self.rss_kib()
            if now <= last + 256:
                return max(now, last)
            last = now
        return last

    def log_tail(self, lines=30):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self):
        """Kills the daemon: its graceful shutdown (a second or more of leaving the cluster) is
        not what this suite tests, and every case has its own daemon."""
        if self.alive():
            self.process.kill()
            self.process.wait(timeout=10)
