"""A stand-in Envoy Gateway for ratemeshd's rate limit contract (run by run.sh).

Envoy Gateway runs its rate limit Deployment as `/bin/ratelimit` with CONFIG_TYPE=GRPC_XDS_SOTW,
its xDS server (ADS, state of the world, mutual TLS from /certs) as the config source, and RLS
over mutual TLS on 8081 with GET /healthcheck on 8080. This script plays Envoy Gateway and its
Envoy, and checks, in order:

 1. with FORCE_START_WITHOUT_INITIAL_CONFIG off, nothing listens before the first configuration;
    the xDS request names the node and the RateLimitConfig type;
 2. the first configuration is applied and ACKed: /healthcheck 200, RLS over mutual TLS counts
    to the limit (OK ... OVER_LIMIT), REDIS_URL is ignored;
 3. a changed configuration (a higher limit, a new domain) is applied and ACKed;
 3b. Envoy Gateway's translated shape (the listener as domain, a route key whose value is itself
    and holds a `*`, a distinct header under it) limits each header value on its own;
 4. a configuration to refuse (a duplicate domain across two resources) is NACKed with the
    error and the last accepted version; the running limits stay;
 5. a resource that is not a RateLimitConfig is NACKed;
 6. the server drops the stream: the client comes back (reporting the accepted version) and
    takes the next configuration;
 7. an RLS client without a certificate, or with one from another CA, is refused;
 8. SIGTERM stops the process.
"""

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent import futures

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory

RATEMESHD = os.environ["RATEMESHD"]
WORK = os.environ["WORK"]
TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
RLS_METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
DEADLINE_S = 20


def fail(message):
    print(f"stand_in: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def say(message):
    print(f"stand_in: {message}", flush=True)


# --- messages the PyPI stubs do not carry, from their field numbers ------------------------------

def messages():
    """RateLimitConfig (ratelimit.config.ratelimit.v3) and RateLimitRequest/Response
    (envoy.service.ratelimit.v3), as far as this test uses them."""
    pool = descriptor_pool.DescriptorPool()
    F = descriptor_pb2.FieldDescriptorProto

    def field(name, number, kind, label=F.LABEL_OPTIONAL, type_name=None):
        f = F(name=name, number=number, type=kind, label=label)
        if type_name:
            f.type_name = type_name
        return f

    conf = descriptor_pb2.FileDescriptorProto(name="rls_conf.proto", package="ratelimit.config.ratelimit.v3", syntax="proto3")
    conf.message_type.add(name="RateLimitConfig", field=[
        field("name", 1, F.TYPE_STRING), field("domain", 2, F.TYPE_STRING),
        field("descriptors", 3, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".ratelimit.config.ratelimit.v3.RateLimitDescriptor")])
    conf.message_type.add(name="RateLimitDescriptor", field=[
        field("key", 1, F.TYPE_STRING), field("value", 2, F.TYPE_STRING),
        field("rate_limit", 3, F.TYPE_MESSAGE, type_name=".ratelimit.config.ratelimit.v3.RateLimitPolicy"),
        field("descriptors", 4, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".ratelimit.config.ratelimit.v3.RateLimitDescriptor")])
    conf.message_type.add(name="RateLimitPolicy", field=[
        field("unit", 1, F.TYPE_UINT32), field("requests_per_unit", 2, F.TYPE_UINT32), field("unlimited", 3, F.TYPE_BOOL)])
    rls = descriptor_pb2.FileDescriptorProto(name="rls.proto", package="envoy.service.ratelimit.v3", syntax="proto3")
    rls.message_type.add(name="Entry", field=[field("key", 1, F.TYPE_STRING), field("value", 2, F.TYPE_STRING)])
    rls.message_type.add(name="Descriptor", field=[
        field("entries", 1, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".envoy.service.ratelimit.v3.Entry")])
    rls.message_type.add(name="RateLimitRequest", field=[
        field("domain", 1, F.TYPE_STRING),
        field("descriptors", 2, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".envoy.service.ratelimit.v3.Descriptor"),
        field("hits_addend", 3, F.TYPE_UINT32)])
    rls.message_type.add(name="Limit", field=[field("requests_per_unit", 1, F.TYPE_UINT32), field("unit", 2, F.TYPE_UINT32)])
    rls.message_type.add(name="Status", field=[
        field("code", 1, F.TYPE_UINT32),
        field("current_limit", 2, F.TYPE_MESSAGE, type_name=".envoy.service.ratelimit.v3.Limit"),
        field("limit_remaining", 3, F.TYPE_UINT32)])
    rls.message_type.add(name="RateLimitResponse", field=[
        field("overall_code", 1, F.TYPE_UINT32),
        field("statuses", 2, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".envoy.service.ratelimit.v3.Status")])
    pool.Add(conf)
    pool.Add(rls)
    get = lambda name: message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    return (get("ratelimit.config.ratelimit.v3.RateLimitConfig"), get("envoy.service.ratelimit.v3.RateLimitRequest"),
            get("envoy.service.ratelimit.v3.RateLimitResponse"))


RateLimitConfig, RateLimitRequest, RateLimitResponse = messages()
SECOND, MINUTE, HOUR = 1, 2, 3
OK, OVER_LIMIT = 1, 2


def config(name, domain, key, per_unit, unit=HOUR):
    c = RateLimitConfig(name=name, domain=domain)
    d = c.descriptors.add(key=key)
    d.rate_limit.unit = unit
    d.rate_limit.requests_per_unit = per_unit
    return any_pb2.Any(type_url=TYPE_URL, value=c.SerializeToString())


# --- the stand-in xDS server -------------------------------------------------------------------

class Ads(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """Records every request; sends what the test queues to the stream open at the time."""

    def __init__(self):
        self.requests = queue.Queue()
        self.outbox = None
        self.streams = 0
        self.lock = threading.Lock()

    def StreamAggregatedResources(self, request_iterator, context):
        outbox = queue.Queue()
        with self.lock:
            self.outbox = outbox
            self.streams += 1

        def read():
            try:
                for request in request_iterator:
                    self.requests.put(request)
            except grpc.RpcError:
                pass
        threading.Thread(target=read, daemon=True).start()
        while context.is_active():
            try:
                item = outbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if item is None:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the management server restarts")
            yield item

    def send(self, version, nonce, resources):
        with self.lock:
            outbox = self.outbox
        if outbox is None:
            fail("no xDS stream is open")
        outbox.put(discovery_pb2.DiscoveryResponse(version_info=version, nonce=nonce, type_url=TYPE_URL, resources=resources))

    def drop_stream(self):
        with self.lock:
            outbox, self.outbox = self.outbox, None
        outbox.put(None)

    def next_request(self, what):
        try:
            return self.requests.get(timeout=DEADLINE_S)
        except queue.Empty:
            fail(f"no xDS request within {DEADLINE_S} s: {what}")


# --- helpers ------------------------------------------------------------------------------------

def free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=WORK)


def certificates():
    """A CA (Envoy Gateway's), a certificate for the servers (localhost) and one for clients; and
    another CA with a client certificate the servers must refuse."""
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
                "-subj", f"/CN={ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.crt")
    for name, ca, ext in (("server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
                          ("client", "ca", "subjectAltName=DNS:envoy"),
                          ("stranger", "other-ca", "subjectAltName=DNS:stranger")):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr")
        with open(os.path.join(WORK, f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
                "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.crt")


def read(name):
    with open(os.path.join(WORK, name), "rb") as f:
        return f.read()


def http_status(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def wait_until(what, condition):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    fail(f"not within {DEADLINE_S} s: {what}")


def rls_channel(port, cert="client", ca="ca"):
    credentials = grpc.ssl_channel_credentials(read(f"{ca}.crt"), read(f"{cert}.key"), read(f"{cert}.crt")) \
        if cert else grpc.ssl_channel_credentials(read(f"{ca}.crt"))
    return grpc.secure_channel(f"localhost:{port}", credentials)


def should_rate_limit(channel, domain, key, value="10.0.0.1"):
    request = RateLimitRequest(domain=domain)
    request.descriptors.add().entries.add(key=key, value=value)
    call = channel.unary_unary(RLS_METHOD, request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=RateLimitResponse.FromString)
    return call(request, timeout=5)


def count_allowed(channel, domain, key, calls, value="10.0.0.1"):
    codes = [should_rate_limit(channel, domain, key, value).overall_code for _ in range(calls)]
    return codes.count(OK), codes


# --- the steps ----------------------------------------------------------------------------------

def main():
    certificates()
    ads = Ads()
    xds_server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(ads, xds_server)
    server_credentials = grpc.ssl_server_credentials([(read("server.key"), read("server.crt"))], read("ca.crt"), True)
    xds_port = xds_server.add_secure_port("127.0.0.1:0", server_credentials)
    xds_server.start()

    http, rls, debug = free_ports(3)
    gossip, quic = free_ports(2)
    bin_dir = os.path.join(WORK, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    ratelimit = os.path.join(bin_dir, "ratelimit")
    os.symlink(RATEMESHD, ratelimit)
    certs = lambda name: os.path.join(WORK, name)
    env = {
        "PATH": "/usr/bin:/bin",
        # Envoy Gateway's variables (its testdata deployments/default.yaml), on loopback ports.
        "RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true",
        "RUNTIME_WATCH_ROOT": "false", "LOG_LEVEL": "info", "USE_STATSD": "false",
        "CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{xds_port}",
        "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit", "FORCE_START_WITHOUT_INITIAL_CONFIG": "false",
        "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": certs("server.crt"),
        "GRPC_SERVER_TLS_KEY": certs("server.key"), "GRPC_CLIENT_TLS_CACERT": certs("ca.crt"),
        "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": certs("client.crt"),
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": certs("client.key"), "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": certs("ca.crt"),
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN": "localhost",
        "REDIS_URL": "ratemesh-needs-no-redis.invalid:6379",
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "500ms",
        "HOST": "127.0.0.1", "PORT": str(http), "GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(rls),
        "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": str(debug),
        # The cluster: a single node here, on loopback.
        "RATEMESH_LISTEN_GOSSIP": f"127.0.0.1:{gossip}", "RATEMESH_LISTEN_QUIC": f"127.0.0.1:{quic}",
    }
    log = open(os.path.join(WORK, "ratelimit.log"), "wb")
    process = subprocess.Popen([ratelimit], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        steps(ads, process, http, rls)
    except SystemExit:
        log.flush()
        sys.stderr.write(read("ratelimit.log").decode(errors="replace")[-4000:])
        raise
    finally:
        if process.poll() is None:
            process.kill()
        xds_server.stop(None)


def steps(ads, process, http, rls):
    first = ads.next_request("the first")
    if first.type_url != TYPE_URL or first.node.id != "envoy-ratelimit" or first.version_info:
        fail(f"the first request: {first}")
    time.sleep(0.3)  # a moment in which a premature listener would show
    if http_status(http, "/healthcheck") is not None:
        fail("/healthcheck answered before the first configuration")
    say("ok 1: no listener before the first configuration; the request names the node and the type")

    ads.send("1", "n1", [config("eg-a", "eg", "remote_address", 3)])
    ack = ads.next_request("the ACK of version 1")
    if (ack.version_info, ack.response_nonce, ack.HasField("error_detail")) != ("1", "n1", False):
        fail(f"not an ACK of 1: {ack}")
    wait_until("/healthcheck 200", lambda: http_status(http, "/healthcheck") == 200)
    channel = rls_channel(rls)
    allowed, codes = count_allowed(channel, "eg", "remote_address", 5)
    if allowed != 3 or codes[-1] != OVER_LIMIT:
        fail(f"3 per hour: {codes}")
    log = read("ratelimit.log").decode(errors="replace")
    if "REDIS_URL" not in log:
        fail("REDIS_URL is not named in the log as ignored")
    say("ok 2: version 1 applied and ACKed; RLS over mutual TLS: OK x3 then OVER_LIMIT; REDIS_URL ignored")

    ads.send("2", "n2", [config("eg-a", "eg", "remote_address", 10), config("eg-b", "other", "user", 1)])
    ack = ads.next_request("the ACK of version 2")
    if (ack.version_info, ack.response_nonce, ack.HasField("error_detail")) != ("2", "n2", False):
        fail(f"not an ACK of 2: {ack}")
    wait_until("version 2 in force", lambda: should_rate_limit(channel, "other", "user", "u1").overall_code == OK)
    allowed, codes = count_allowed(channel, "other", "user", 2, "u2")
    if codes != [OK, OVER_LIMIT]:
        fail(f"the new domain, 1 per hour: {codes}")
    say("ok 3: version 2 (a new domain) applied and ACKed")

    # Envoy Gateway's translated shape (its translator's tests): the listener as name and domain,
    # the route as a generic key whose value is itself (with a `*`), a distinct header under it.
    route = "httproute/default/backend/rule/0/match/0/*"
    translated = RateLimitConfig(name="default/eg/listener-0", domain="default/eg/listener-0")
    rule = translated.descriptors.add(key=route, value=route).descriptors.add(key="rule-0-match-0")
    rule.rate_limit.unit = MINUTE
    rule.rate_limit.requests_per_unit = 2
    eg = any_pb2.Any(type_url=TYPE_URL, value=translated.SerializeToString())
    ads.send("3", "n3", [config("eg-a", "eg", "remote_address", 10), config("eg-b", "other", "user", 1), eg])
    ack = ads.next_request("the ACK of version 3")
    if (ack.version_info, ack.response_nonce, ack.HasField("error_detail")) != ("3", "n3", False):
        fail(f"not an ACK of 3: {ack}")

    def translated_call(user):
        request = RateLimitRequest(domain="default/eg/listener-0")
        entries = request.descriptors.add().entries
        entries.add(key=route, value=route)
        entries.add(key="rule-0-match-0", value=user)
        call = channel.unary_unary(RLS_METHOD, request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=RateLimitResponse.FromString)
        return call(request, timeout=5).overall_code

    wait_until("version 3 in force", lambda: translated_call("probe") == OK)
    codes = [translated_call("alice") for _ in range(3)] + [translated_call("bob")]
    if codes != [OK, OK, OVER_LIMIT, OK]:
        fail(f"Envoy Gateway's translated config, 2 per minute per distinct header value: {codes}")
    say("ok 3b: Envoy Gateway's translated shape (route key with '*', distinct header): 2 per minute per user")

    ads.send("3d", "n3d", [config("eg-a", "eg", "remote_address", 10), config("eg-dup", "eg", "path", 1)])
    nack = ads.next_request("the NACK of version 3d")
    if (nack.version_info, nack.response_nonce) != ("3", "n3d") or "duplicate domain" not in nack.error_detail.message:
        fail(f"not a NACK of 3d naming the duplicate domain: {nack}")
    if should_rate_limit(channel, "other", "user", "u3").overall_code != OK:
        fail("the running configuration changed after a refused one")
    say("ok 4: version 3d (a duplicate domain) NACKed with the last accepted version; version 3 stays")

    garbage = any_pb2.Any(type_url="type.googleapis.com/envoy.config.cluster.v3.Cluster", value=b"\x0a\x01x")
    ads.send("4", "n4", [garbage])
    nack = ads.next_request("the NACK of version 4")
    if (nack.version_info, nack.response_nonce) != ("3", "n4") or not nack.error_detail.message:
        fail(f"not a NACK of 4: {nack}")
    say("ok 5: a resource of another type NACKed")

    streams = ads.streams
    ads.drop_stream()
    again = ads.next_request("a request on a new stream")
    if ads.streams <= streams or again.version_info != "3" or again.response_nonce:
        fail(f"not a new stream reporting version 3: {again} (streams {streams} -> {ads.streams})")
    ads.send("5", "n5", [config("eg-c", "fresh", "user", 2)])
    ack = ads.next_request("the ACK of version 5")
    if (ack.version_info, ack.response_nonce, ack.HasField("error_detail")) != ("5", "n5", False):
        fail(f"not an ACK of 5: {ack}")
    wait_until("version 5 in force", lambda: should_rate_limit(channel, "fresh", "user", "f1").overall_code == OK)
    say("ok 6: the stream dropped, the client came back with version 3 and took version 5")

    for cert, ca, who in ((None, "ca", "no certificate"), ("stranger", "ca", "another CA's certificate")):
        try:
            should_rate_limit(rls_channel(rls, cert, ca), "fresh", "user", "f2")
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                fail(f"{who}: {error.code()} {error.details()}")
        else:
            fail(f"an RLS client with {who} was served")
    say("ok 7: RLS clients without a certificate of the CA are refused")

    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        fail("still running 10 s after SIGTERM")
    if code != 0:
        fail(f"exited with {code} after SIGTERM")
    say("ok 8: SIGTERM stops it (exit 0)")


if __name__ == "__main__":
    main()
