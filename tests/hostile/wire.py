"""What the hostile cases say on the wire: the Envoy RLS messages (hand-encoded protobuf), raw
HTTP/2 frames (well-formed or not), a raw HTTP/2 connection that reads frames under a deadline,
and HTTP/1.1 answers read off a socket. Every read has a timeout; nothing here waits unbounded."""

import socket
import struct
import time

import hpack

IO_TIMEOUT_S = 5.0  # every socket read and write of the suite

PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types, flags, settings and error codes (RFC 9113 6, 6.5.2, 7).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE = 0x2, 0x4
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x6
CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x8, 0x9, 0xB

# RateLimitResponse.Code.
OK, OVER_LIMIT = 1, 2


# --- protobuf -------------------------------------------------------------------------------------

def varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, payload):
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def rate_limit_request(domain, descriptors, hits_addend=1):
    """RateLimitRequest{domain=1, descriptors=2 [{entries=1 [{key=1, value=2}]}], hits_addend=3}."""
    body = field(1, domain.encode())
    for entries in descriptors:
        entry_bytes = b"".join(field(1, field(1, k.encode()) + field(2, v.encode())) for k, v in entries)
        body += field(2, entry_bytes)
    return body + varint(3 << 3 | 0) + varint(hits_addend)


def overall_code(message):
    """RateLimitResponse.overall_code (field 1, varint); 0 when absent (the enum's UNKNOWN)."""
    i = 0
    while i < len(message):
        key, i = _read_varint(message, i)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, i = _read_varint(message, i)
            if number == 1:
                return value
        elif kind == 2:
            length, i = _read_varint(message, i)
            i += length
        elif kind == 1:
            i += 8
        elif kind == 5:
            i += 4
        else:
            raise ValueError(f"protobuf wire type {kind}")
    return 0


def _read_varint(data, i):
    shift = value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def grpc_message(message):
    """A gRPC length-prefixed message (uncompressed)."""
    return b"\x00" + struct.pack(">I", len(message)) + message


# --- HTTP/2 frames ----------------------------------------------------------------------------------

def frame(kind, flags, stream, payload=b"", length=None):
    """One frame; `length` overrides the header's length field (for lying frames)."""
    length = len(payload) if length is None else length
    return struct.pack(">I", length)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def settings(*pairs, ack=False):
    return frame(SETTINGS, ACK if ack else 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


def request_headers(authority, extra=()):
    return [(":method", "POST"), (":scheme", "http"), (":path", PATH), (":authority", authority),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra]


def call_frames(encoder, stream, authority, message):
    """A whole unary call on `stream`: HEADERS, then DATA with END_STREAM."""
    block = encoder.encode(request_headers(authority))
    return (frame(HEADERS, END_HEADERS, stream, block)
            + frame(DATA, END_STREAM, stream, grpc_message(message)))


class Closed(Exception):
    """The peer closed the connection (EOF or reset)."""


class RawH2:
    """A client connection that sends raw bytes and reads frames under deadlines."""

    def __init__(self, address, preface=True, client_settings=(), receive_buffer=None):
        """`receive_buffer`: a small SO_RCVBUF, so that a client that does not read fills it soon."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(IO_TIMEOUT_S)
        self.sock.connect(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.authority = f"{address[0]}:{address[1]}"
        self.buffer = b""
        self.encoder = hpack.Encoder()
        if preface:
            self.send(PREFACE + settings(*client_settings))

    def send(self, data):
        """Sends `data`; raises Closed if the server closed or reset the connection."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as error:
            raise Closed(str(error)) from error

    def read_frame(self, deadline):
        """(type, flags, stream, payload) of the next frame; None at the deadline; Closed at EOF."""
        while True:
            if len(self.buffer) >= 9:
                length = int.from_bytes(self.buffer[:3], "big")
                if len(self.buffer) >= 9 + length:
                    head, payload = self.buffer[:9], self.buffer[9:9 + length]
                    self.buffer = self.buffer[9 + length:]
                    return head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return None
            except ConnectionResetError as error:
                raise Closed(str(error)) from error
            if not chunk:
                raise Closed("EOF")
            self.buffer += chunk

    def until_closed(self, within_s):
        """Reads frames for at most `within_s`: (closed, goaway_code or None, frames read)."""
        deadline = time.monotonic() + within_s
        goaway, count = None, 0
        try:
            while (read := self.read_frame(deadline)) is not None:
                count += 1
                kind, _, _, payload = read
                if kind == GOAWAY and len(payload) >= 8:
                    goaway = int.from_bytes(payload[4:8], "big")
            return False, goaway, count
        except Closed:
            return True, goaway, count

    def close(self):
        self.sock.close()


# --- HTTP/1.1 ---------------------------------------------------------------------------------------

class Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def header(self, name):
        return self.headers.get(name.lower())

    def __repr__(self):
        return f"Response({self.status}, {self.headers}, {self.body[:200]!r})"


class Http1:
    """A raw HTTP/1.1 client connection: bytes out, responses parsed off the socket in order."""

    def __init__(self, address):
        self.sock = socket.create_connection(address, timeout=IO_TIMEOUT_S)
        self.buffer = b""

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no whole HTTP response in time")
        self.sock.settimeout(left)
        chunk = self.sock.recv(65536)
        if not chunk:
            raise Closed("EOF")
        self.buffer += chunk

    def read_response(self, within_s=IO_TIMEOUT_S):
        """The next response (a 1xx interim one too); its body by Content-Length or chunked."""
        deadline = time.monotonic() + within_s
        while b"\r\n\r\n" not in self.buffer:
            self._fill(deadline)
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200 or status in (204, 304):
            return Response(status, headers, b"")
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._read_chunked(deadline)
        else:
            length = int(headers.get("content-length", "0"))
            while len(self.buffer) < length:
                self._fill(deadline)
            body, self.buffer = self.buffer[:length], self.buffer[length:]
        return Response(status, headers, body)

    def _read_chunked(self, deadline):
        body = b""
        while True:
            while b"\r\n" not in self.buffer:
                self._fill(deadline)
            size_line, rest = self.buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(rest) < size + 2:
                self._fill(deadline)
                size_line, rest = self.buffer.split(b"\r\n", 1)
            body, self.buffer = body + rest[:size], rest[size + 2:]
            if size == 0:
                return body

    def closed_within(self, within_s):
        """True when the server closes the connection within `within_s` and sends nothing more
        meanwhile (bytes received instead: AssertionError, they would be an unasked answer)."""
        deadline = time.monotonic() + within_s
        try:
            while not self.buffer:  # bytes read along with the answer count too
                self._fill(deadline)
            raise AssertionError(f"unexpected bytes after the answer: {self.buffer[:200]!r}")
        except (Closed, ConnectionResetError):
            return True
        except (TimeoutError, socket.timeout):
            return False

    def close(self):
        self.sock.close()


def http_request(method, path, body=b"", headers=(), host="ratemesh"):
    """A well-formed HTTP/1.1 request."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
