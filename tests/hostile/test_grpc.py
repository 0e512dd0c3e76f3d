"""Hostile HTTP/2 clients against the Envoy RLS (gRPC) listener. Each case runs one attack,
bounded in frames and wall-clock time, then checks that the daemon lives, that a well-behaved
gRPC client is still served real decisions, and that the daemon's resident memory grew by less
than a bound stated in the case (over a warm baseline, once settled)."""

import hpack
import hpack.hpack
import pytest

import wellbehaved
import wire
from wire import (CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PING, RST_STREAM,
                  SETTINGS, frame)

ATTACK_S = 15  # wall-clock bound of every attack loop


def load_call():
    return wire.rate_limit_request("hostile", [[("load", "abuser")]])


def send_for(conn, data, time_up, slice_bytes=64 * 1024):
    """Sends `data` in slices until all is sent, the time is up, the server closes, or a send
    waits longer than the socket timeout (a server that stopped reading). Bytes sent."""
    sent = 0
    while sent < len(data) and not time_up():
        try:
            conn.send(data[sent:sent + slice_bytes])
        except (wire.Closed, TimeoutError):
            break
        sent += slice_bytes
    return min(sent, len(data))


# --- rapid reset -------------------------------------------------------------------------------------

RESETS = 20_000
RESET_BATCH = 500


def rapid_reset(conn, time_up):
    """Opens and cancels streams on `conn`, RESET_BATCH at a time, until RESETS were sent, the
    time is up, or the server closes the connection or sends GOAWAY (looked for after each
    batch, then for 5 s after the last): (streams sent, closed, GOAWAY code or None)."""
    headers = [hpack.NeverIndexedHeaderTuple(k, v) for k, v in wire.request_headers(conn.authority)]
    block = conn.encoder.encode(headers)
    cancel = wire.CANCEL.to_bytes(4, "big")
    sent, closed, goaway = 0, False, None
    while sent < RESETS and not (closed or goaway is not None or time_up()):
        streams = range(1 + 2 * sent, 1 + 2 * (sent + RESET_BATCH), 2)
        try:
            conn.send(b"".join(frame(HEADERS, END_HEADERS, s, block) + frame(RST_STREAM, 0, s, cancel)
                               for s in streams))
        except wire.Closed:
            return sent, True, goaway
        sent += RESET_BATCH
        closed, goaway, _ = conn.until_closed(0.005)
    if not closed and goaway is None:
        closed, goaway, _ = conn.until_closed(5.0)
    return sent, closed, goaway


def test_rapid_reset_abuser_is_closed(daemon, memory, timer):
    """CVE-2023-44487: one connection opens 20 000 streams and cancels each at once (HEADERS,
    then RST_STREAM CANCEL), which costs the server work per stream and the client nothing.
    The server must stop it: GOAWAY ENHANCE_YOUR_CALM, or at least close the connection, before
    the resets were all sent or within 5 s after. Servers with a reset budget (h2's is 20 streams
    reset before they were accepted) close after a few dozen. Memory: 16 MiB, as no call
    completes; only stream state could grow."""
    conn = wire.RawH2(daemon.grpc)
    sent, closed, goaway = rapid_reset(conn, timer(ATTACK_S))
    conn.close()
    print(f"rapid reset: {sent} streams opened and reset; closed={closed}, GOAWAY={goaway}")
    assert closed or goaway == wire.ENHANCE_YOUR_CALM, (
        f"the abuser's connection is still open after {sent} rapid resets (GOAWAY: {goaway})")
    assert goaway in (None, wire.ENHANCE_YOUR_CALM), f"GOAWAY {goaway:#x}, not ENHANCE_YOUR_CALM"
    wellbehaved.assert_grpc_served(daemon)
    memory.assert_growth_below(16)


# --- CONTINUATION flood --------------------------------------------------------------------------------

FLOOD_BYTES = 48 * 1024 * 1024
FRAME_BYTES = 16_384


def test_continuation_flood_closes_the_connection(daemon, memory, timer):
    """A header block that never ends: HEADERS without END_HEADERS, then 48 MiB of CONTINUATION
    frames (one literal header whose value is 48 MiB long). The server cannot decode the block
    without holding it, so it must bound it and close the connection (before the flood is sent,
    or within 5 s after). Memory: 16 MiB, a third of the flood: a server that holds the block
    is well over it."""
    conn = wire.RawH2(daemon.grpc)
    start = conn.encoder.encode(wire.request_headers(conn.authority))
    start += b"\x00" + hpack.hpack.encode_integer(7, 7) + b"x-flood" + hpack.hpack.encode_integer(FLOOD_BYTES, 7)
    conn.send(frame(HEADERS, 0, 1, start))
    continuation = frame(CONTINUATION, 0, 1, b"a" * FRAME_BYTES)
    batch = continuation * 64  # 1 MiB
    time_up, sent, closed = timer(ATTACK_S), 0, False
    while sent < FLOOD_BYTES and not time_up():
        try:
            conn.send(batch)
        except wire.Closed:
            closed = True
            break
        except TimeoutError:  # the server stopped reading: whether it closes is read below
            break
        sent += len(batch)
    if not closed:
        closed, _, _ = conn.until_closed(5.0)
    conn.close()
    print(f"CONTINUATION flood: {sent / 2**20:.0f} MiB sent; closed={closed}")
    assert closed, f"the connection is still open after {sent / 2**20:.0f} MiB of CONTINUATION"
    wellbehaved.assert_grpc_served(daemon)
    memory.assert_growth_below(16)


# --- HPACK bomb ----------------------------------------------------------------------------------------

BOMB_VALUE_BYTES = 4000  # 4 038 bytes in the table: the whole of HTTP/2's default 4 096
BOMB_STREAMS = 20


class Answers:
    """The server's frames per stream, its header blocks decoded."""

    def __init__(self):
        self.decoder = hpack.Decoder()
        self.headers, self.resets, self.goaway, self.closed = {}, {}, None, False

    def read(self, conn, streams, within_s):
        """Reads until every one of `streams` ended (answered or reset) or the connection closed."""
        deadline = wire.time.monotonic() + within_s
        try:
            while not all(self.ended(s) for s in streams):
                read = conn.read_frame(deadline)
                if read is None:
                    return
                self.take(*read)
        except wire.Closed:
            self.closed = True

    def take(self, kind, flags, stream, payload):
        if kind == HEADERS:
            assert flags & END_HEADERS, "answer headers in CONTINUATION frames: not handled here"
            fields = dict(self.decoder.decode(payload))
            self.headers.setdefault(stream, []).append((fields, bool(flags & END_STREAM)))
        elif kind == RST_STREAM:
            self.resets[stream] = int.from_bytes(payload[:4], "big")
        elif kind == GOAWAY:
            self.goaway = int.from_bytes(payload[4:8], "big")

    def ended(self, stream):
        return stream in self.resets or any(end for _, end in self.headers.get(stream, []))

    def grpc_ok(self, stream):
        """True when `stream` was answered :status 200 and grpc-status 0."""
        fields = {}
        for block, _ in self.headers.get(stream, []):
            fields.update(block)
        return fields.get(":status") == "200" and fields.get("grpc-status") == "0"


def test_hpack_bomb_is_refused(daemon, memory):
    """An HPACK bomb: one 4 000-byte header put in the dynamic table, then 20 streams whose
    16 KB header blocks reference it about 16 000 times each (64 MB decoded per stream, 1.3 GB
    in all, from 320 KB sent). The header list bound must trigger: each bomb stream is reset or
    refused (any answer but gRPC OK), or the connection closed. Memory: 16 MiB, under one
    stream's decoded list."""
    conn = wire.RawH2(daemon.grpc)
    request = [hpack.NeverIndexedHeaderTuple(k, v) for k, v in wire.request_headers(conn.authority)]
    plain = hpack.Encoder()
    insert = (b"\x40" + hpack.hpack.encode_integer(6, 7) + b"x-bomb"
              + hpack.hpack.encode_integer(BOMB_VALUE_BYTES, 7) + b"b" * BOMB_VALUE_BYTES)
    message = wire.grpc_message(load_call())
    first = plain.encode(request) + insert
    bombs = [3 + 2 * i for i in range(BOMB_STREAMS)]
    answers = Answers()
    try:
        conn.send(frame(HEADERS, END_HEADERS, 1, first) + frame(DATA, END_STREAM, 1, message))
        for stream in bombs:
            block = plain.encode(request)
            block += b"\xbe" * (16_000 - len(block))  # index 62: the newest dynamic entry, x-bomb
            conn.send(frame(HEADERS, END_HEADERS, stream, block) + frame(DATA, END_STREAM, stream, message))
    except wire.Closed:
        answers.closed = True  # closed while the bombs were sent: a refusal
    answers.read(conn, bombs, within_s=10.0)
    conn.close()
    accepted = [s for s in bombs if answers.grpc_ok(s)]
    unanswered = [s for s in bombs if not answers.ended(s)]
    print(f"HPACK bomb: resets {answers.resets}, GOAWAY {answers.goaway}, closed {answers.closed}")
    assert not accepted, f"bomb streams {accepted} were answered gRPC OK: their header lists were taken"
    assert answers.closed or not unanswered, f"bomb streams {unanswered} got no answer within 10 s"
    wellbehaved.assert_grpc_served(daemon)
    memory.assert_growth_below(16)


# --- SETTINGS and PING floods ------------------------------------------------------------------------

FLOOD_FRAMES = 1_000_000


@pytest.mark.parametrize("kind", ["settings", "ping"])
def test_control_frame_flood_without_reading(daemon, memory, timer, kind):
    """1 000 000 SETTINGS (or PING) frames, each asking for an acknowledgement (15 or 17 MB),
    from a client that never reads (a 64 KiB receive buffer, soon full); sent until the server
    stops reading, or 15 s. The server may close the connection or stall it, but must not
    queue acknowledgements without bound nor stop serving others: while the flooder's
    connection is still open, a well-behaved client is served. Memory: 16 MiB; the
    acknowledgements of the flood are 9 or 17 MB of frames alone."""
    conn = wire.RawH2(daemon.grpc, receive_buffer=64 * 1024)
    one = (wire.settings((wire.SETTINGS_INITIAL_WINDOW_SIZE, 65_535)) if kind == "settings"
           else frame(PING, 0, 0, b"hostile!"))
    sent = send_for(conn, one * FLOOD_FRAMES, timer(ATTACK_S))
    print(f"{kind} flood: {sent // len(one)} frames sent; the server's answers: {conn.until_closed(0.01)}")
    wellbehaved.assert_grpc_served(daemon)
    memory.assert_growth_below(16)
    conn.close()


# --- zero-window readers -------------------------------------------------------------------------------

def zero_window_reader(daemon, calls):
    """A connection that sets SETTINGS_INITIAL_WINDOW_SIZE to 0, never sends WINDOW_UPDATE and
    makes `calls` calls: no answer's DATA can ever be sent to it. (It reads what the server
    sends, which gives no flow-control window, to know when the server has taken every call.)"""
    conn = wire.RawH2(daemon.grpc, client_settings=[(wire.SETTINGS_INITIAL_WINDOW_SIZE, 0)])
    message = load_call()
    first = wire.call_frames(conn.encoder, 1, conn.authority, message)
    block = conn.encoder.encode(wire.request_headers(conn.authority))  # all indexed by now
    data = wire.grpc_message(message)
    try:
        conn.send(first + b"".join(frame(HEADERS, END_HEADERS, stream, block) + frame(DATA, END_STREAM, stream, data)
                                   for stream in range(3, 2 * calls, 2)))
    except wire.Closed:
        pass  # closed by the server while the calls were sent: the reads that follow see it
    return conn


def taken(conn, calls, deadline):
    """Reads until the server answered (HEADERS) or refused (RST_STREAM) each of the `calls`
    streams, or closed, or the deadline: the Answers."""
    answers = Answers()
    try:
        while len(set(answers.headers) | set(answers.resets)) < calls and answers.goaway is None:
            read = conn.read_frame(deadline)
            if read is None:
                break
            answers.take(*read)
    except wire.Closed:
        answers.closed = True
    return answers


def test_zero_window_reader_with_many_calls(daemon, memory):
    """One zero-window reader with 1 000 calls in flight. The server may hold the answers or
    refuse streams, but must go on serving others. Memory: 16 MiB (16 KiB per call, far more
    than an RLS answer needs; today's server holds about 0.7 MiB here, the h2 one of 6 December
    about 6.4 MiB in a debug build); what a connection holds is the next case's business."""
    conn = zero_window_reader(daemon, 1000)
    answers = taken(conn, 1000, wire.time.monotonic() + 10.0)
    print(f"zero window: {len(answers.headers)} streams answered headers, {len(answers.resets)} reset, "
          f"GOAWAY {answers.goaway}, closed {answers.closed}")
    assert answers.goaway in (None, wire.NO_ERROR, wire.ENHANCE_YOUR_CALM), f"GOAWAY {answers.goaway}"
    wellbehaved.assert_grpc_served(daemon)
    memory.assert_growth_below(16)
    conn.close()


ZERO_WINDOW_CONNECTIONS = 64
ZERO_WINDOW_CALLS = 1000


def test_many_zero_window_readers(daemon, memory, timer):
    """64 zero-window readers with 1 000 calls in flight each, all open at once (64 000 answers
    that can never be sent). What a server holds for such a connection must be bounded however
    many calls it makes: today's server holds every answer, about 560 bytes each, 560 KiB per
    connection (1 000 connections: 561 MiB); 64 of them are about 35 MiB. The bound, 16 MiB, is
    256 KiB per connection: room for a server that holds a few hundred streams per connection
    (SETTINGS_MAX_CONCURRENT_STREAMS, refusing the rest) or refuses, closes, or holds little per
    call. (Many connections with fewer calls each do not tell: 100 held answers cost about as
    much on any server.) The calls are sent within 15 s and taken within 15 s more; while the readers
    are all open, a well-behaved client is served."""
    time_up, readers = timer(ATTACK_S), []
    try:
        while len(readers) < ZERO_WINDOW_CONNECTIONS and not time_up():
            try:
                readers.append(zero_window_reader(daemon, ZERO_WINDOW_CALLS))
            except (wire.Closed, OSError) as error:
                print(f"zero window: connection {len(readers)} refused: {error}")
                break
        deadline = wire.time.monotonic() + 15.0
        answered = refused = closed = 0
        for reader in readers:
            # Past the deadline, what already came is still read.
            answers = taken(reader, ZERO_WINDOW_CALLS, max(deadline, wire.time.monotonic() + 0.05))
            answered, refused = answered + len(answers.headers), refused + len(answers.resets)
            closed += answers.closed or answers.goaway is not None
        print(f"zero window: {len(readers)} connections of {ZERO_WINDOW_CALLS} calls: {answered} answered "
              f"headers, {refused} refused, {closed} connections closed")
        started = wire.time.monotonic()
        try:
            wellbehaved.assert_grpc_served(daemon)
            served = None
        except (AssertionError, OSError) as error:  # reported after the memory, the case's point
            served = error
        print(f"zero window: well-behaved client {'served' if served is None else 'NOT served'} "
              f"in {wire.time.monotonic() - started:.1f} s")
        memory.assert_growth_below(16)
        assert served is None, f"a well-behaved client was not served beside the readers: {served!r}"
    finally:
        for reader in readers:
            reader.close()


# --- invalid frames -------------------------------------------------------------------------------------

def _block():
    return hpack.Encoder().encode(wire.request_headers("127.0.0.1"))


def _u32(n):
    return n.to_bytes(4, "big")


# (case, bytes after the preface and an empty SETTINGS (None: sent instead of them), the error
# RFC 9113 names). Each is a connection error: the server must close the connection, and a
# GOAWAY, if it sends one, must carry that code or PROTOCOL_ERROR, the generic one (the h2 crate
# answers malformed SETTINGS and PING frames and HPACK errors with it; the code is cosmetic, the
# close is what protects the server). Left out: a first frame other than SETTINGS (RFC 9113 3.4
# makes it PROTOCOL_ERROR; the h2 crate lets it pass, harmlessly).
INVALID = [
    ("data-on-stream-0", lambda: frame(DATA, 0, 0, b"x"), wire.PROTOCOL_ERROR),
    ("window-update-of-0", lambda: frame(wire.WINDOW_UPDATE, 0, 0, _u32(0)), wire.PROTOCOL_ERROR),
    ("connection-window-overflow", lambda: frame(wire.WINDOW_UPDATE, 0, 0, _u32(2**31 - 1)),
     wire.FLOW_CONTROL_ERROR),
    ("oversize-headers", lambda: frame(HEADERS, END_HEADERS, 1, b"\x00" * 20_000), wire.FRAME_SIZE_ERROR),
    ("length-field-16mib", lambda: frame(DATA, 0, 1, b"x" * 64, length=0xFFFFFF), wire.FRAME_SIZE_ERROR),
    ("ping-of-7-bytes", lambda: frame(PING, 0, 0, b"1234567"), wire.FRAME_SIZE_ERROR),
    ("settings-of-5-bytes", lambda: frame(SETTINGS, 0, 0, b"\x00" * 5), wire.FRAME_SIZE_ERROR),
    ("settings-ack-with-payload", lambda: frame(SETTINGS, wire.ACK, 0, b"\x00" * 6), wire.FRAME_SIZE_ERROR),
    ("enable-push-2", lambda: wire.settings((wire.SETTINGS_ENABLE_PUSH, 2)), wire.PROTOCOL_ERROR),
    ("initial-window-2-31", lambda: wire.settings((wire.SETTINGS_INITIAL_WINDOW_SIZE, 2**31)),
     wire.FLOW_CONTROL_ERROR),
    ("headers-on-even-stream", lambda: frame(HEADERS, END_HEADERS, 2, _block()), wire.PROTOCOL_ERROR),
    ("headers-on-stream-0", lambda: frame(HEADERS, END_HEADERS, 0, _block()), wire.PROTOCOL_ERROR),
    ("push-promise-from-client", lambda: frame(wire.PUSH_PROMISE, END_HEADERS, 1, _u32(2) + _block()),
     wire.PROTOCOL_ERROR),
    ("continuation-without-headers", lambda: frame(CONTINUATION, END_HEADERS, 1, _block()),
     wire.PROTOCOL_ERROR),
    ("ping-inside-a-header-block", lambda: frame(HEADERS, 0, 1, _block()) + frame(PING, 0, 0, b"x" * 8),
     wire.PROTOCOL_ERROR),
    ("rst-stream-on-idle-stream", lambda: frame(RST_STREAM, 0, 7, _u32(wire.CANCEL)), wire.PROTOCOL_ERROR),
    ("hpack-index-out-of-range", lambda: frame(HEADERS, END_HEADERS, 1, b"\xff\x7f"), wire.COMPRESSION_ERROR),
    ("padding-longer-than-frame", lambda: frame(HEADERS, END_HEADERS, 1, _block())
     + frame(DATA, 0x8, 1, bytes([200]) + b"x" * 10), wire.PROTOCOL_ERROR),
    ("bad-preface", lambda: None, wire.PROTOCOL_ERROR),
    ("http1-request", lambda: None, wire.PROTOCOL_ERROR),
]

# What the cases that replace the preface send.
RAW = {
    "bad-preface": b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + wire.settings(),
    "http1-request": b"POST /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit HTTP/1.1\r\n"
                     b"Host: 127.0.0.1\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("case,attack,code", INVALID, ids=[case for case, _, _ in INVALID])
def test_invalid_frames_close_the_connection(daemon, memory, case, attack, code):
    """A frame (or preface) that RFC 9113 makes a connection error: the connection is closed
    within 5 s (a GOAWAY, if any, carries the code RFC 9113 names or PROTOCOL_ERROR), the
    server goes on. Memory: 4 MiB, a connection's worth."""
    sent = attack()
    conn = wire.RawH2(daemon.grpc, preface=sent is not None)
    try:
        conn.send(RAW[case] if sent is None else sent)
    except wire.Closed:
        pass  # closed while we were still sending: what is asked
    closed, goaway, _ = conn.until_closed(5.0)
    conn.close()
    assert closed, "the connection is still open 5 s after a connection error"
    assert goaway in (None, code, wire.PROTOCOL_ERROR), f"GOAWAY {goaway:#x}, RFC 9113 names {code:#x}"
    wellbehaved.assert_grpc_served(daemon)
    memory.assert_growth_below(4)


def test_unknown_frame_type_is_ignored(daemon, memory):
    """RFC 9113 5.5: frames of unknown types are ignored. An unknown type on stream 0 and on a
    stream, then a PING: the connection stays up and the PING is acknowledged."""
    conn = wire.RawH2(daemon.grpc)
    conn.send(frame(0xFA, 0, 0, b"junk") + frame(0xFB, 0xFF, 1, b"more junk") + frame(PING, 0, 0, b"still-up"))
    deadline = wire.time.monotonic() + wire.IO_TIMEOUT_S
    acked = False
    while not acked and (read := conn.read_frame(deadline)) is not None:
        kind, flags, _, payload = read
        assert kind != GOAWAY, f"GOAWAY {int.from_bytes(payload[4:8], 'big'):#x} after unknown frame types"
        acked = kind == PING and flags & wire.ACK and payload == b"still-up"
    conn.close()
    assert acked, "no PING acknowledgement after frames of unknown types"
    wellbehaved.assert_grpc_served(daemon)
    memory.assert_growth_below(4)


def test_stream_id_going_down_is_never_served(daemon, memory):
    """A new stream whose id does not count up (HEADERS on 5, then a whole call on 3). RFC 9113
    5.1.1 makes it a connection error PROTOCOL_ERROR; refusing the stream alone (RST_STREAM) is
    as safe and is accepted here. What must not happen: stream 3 answered as a call, or left
    without an answer."""
    conn = wire.RawH2(daemon.grpc)
    answers = Answers()
    try:
        conn.send(frame(HEADERS, END_HEADERS, 5, _block()) + frame(HEADERS, END_HEADERS, 3, _block())
                  + frame(DATA, END_STREAM, 3, wire.grpc_message(load_call())))
    except wire.Closed:
        answers.closed = True
    answers.read(conn, [3], within_s=5.0)
    conn.close()
    print(f"stream id going down: resets {answers.resets}, GOAWAY {answers.goaway}, closed {answers.closed}")
    assert not answers.headers.get(3), f"stream 3 was answered: {answers.headers[3]}"
    assert 3 in answers.resets or answers.closed, "stream 3 got neither RST_STREAM nor a closed connection"
    assert answers.goaway in (None, wire.PROTOCOL_ERROR), f"GOAWAY {answers.goaway:#x}"
    wellbehaved.assert_grpc_served(daemon)
    memory.assert_growth_below(4)
