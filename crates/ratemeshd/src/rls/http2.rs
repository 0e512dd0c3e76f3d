//! The server side of HTTP/2 (RFC 9113) for unary gRPC calls of one method, sans IO: bytes in,
//! calls and bytes out. [`Connection`] is one connection's state; the driver (`super::serve`)
//! reads into it, decides the calls it hands out and writes what it answers.
//!
//! # What it speaks
//!
//! - The connection preface, SETTINGS (and their acknowledgements), PING, WINDOW_UPDATE,
//!   RST_STREAM, GOAWAY both ways, PRIORITY (ignored), HEADERS with CONTINUATION, DATA with
//!   padding; unknown frame types are ignored, as RFC 9113 5.5 asks.
//! - A request is a stream that carries one header block, a body, and optionally trailers. When
//!   the client ends it, its body (a gRPC length-prefixed message, [`Call::message`]) is handed
//!   out as a [`Call`]; the answer is `:status 200`, the message, and `grpc-status` trailers
//!   ([`Connection::respond`]), or a trailers-only answer ([`Connection::respond_status`]).
//! - The server never pushes and never uses the peer's dynamic HPACK table (its answers are
//!   literals without indexing: a few bytes more per answer, no shared state to get wrong).
//!
//! # Bounds
//!
//! - Frames are at most [`FRAME_BYTES_MAX`] (the default SETTINGS_MAX_FRAME_SIZE, advertised); a
//!   header block at most [`HEADER_BLOCK_BYTES_MAX`] bytes in at most [`CONTINUATIONS_MAX`]
//!   CONTINUATION frames (beyond, the connection ends: the block cannot be decoded without
//!   being held); a decoded list over [`HEADER_LIST_BYTES_MAX`] is answered
//!   `RESOURCE_EXHAUSTED` on its own stream; at most [`super::STREAMS_PER_CONNECTION_MAX`]
//!   streams open (one more is refused with REFUSED_STREAM).
//! - Request bodies are held only until their stream ends, and the connection's receive window
//!   ([`CONNECTION_WINDOW_BYTES`]) is given back only as they are handed out or dropped: the
//!   bytes a connection holds are bounded by that window, however many streams it opens. A body
//!   longer than [`super::MESSAGE_BYTES_MAX`] is answered `OUT_OF_RANGE` at once (the rest of
//!   the stream is ignored).
//! - Answers respect the peer's flow-control windows: what does not fit waits for its
//!   WINDOW_UPDATE (an answer waiting for its own stream's window holds up no other). Stream
//!   windows count from the peer's initial window, so a new SETTINGS_INITIAL_WINDOW_SIZE costs
//!   the same however many streams are open.
//! - A peer that lowers its HPACK table size gets a size update to 0 in the server's next
//!   header block (RFC 7541 4.2).
//! - Control frames (PING, SETTINGS, PRIORITY, empty DATA) are not rate-limited: a flooding
//!   connection can keep one core's share busy, bounded per round (`super::FRAMES_PER_ROUND_MAX`
//!   frames, then other connections run) and without growing memory.
//! - Anything malformed is an error of its stream (RST_STREAM) or of the connection (GOAWAY, then
//!   close) as RFC 9113 says; nothing a peer sends panics.

use std::collections::{HashMap, VecDeque};

use super::hpack::{self, Decoder};

/// The client's connection preface.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The largest frame payload accepted (SETTINGS_MAX_FRAME_SIZE's default, which the server keeps).
pub const FRAME_BYTES_MAX: usize = 16_384;

/// The largest header block (HEADERS and its CONTINUATION frames, compressed). Above the list
/// bound, so that a list a little over it (gRPC clients send what metadata they are given) is
/// decoded and refused on its own stream rather than ending the connection.
pub const HEADER_BLOCK_BYTES_MAX: usize = 64 * 1024;

/// The most CONTINUATION frames in one header block (empty ones would otherwise never end it).
pub const CONTINUATIONS_MAX: usize = 16;

/// The largest decoded header list (RFC 9113 SETTINGS_MAX_HEADER_LIST_SIZE, advertised).
pub const HEADER_LIST_BYTES_MAX: usize = 16 * 1024;

/// The HPACK dynamic table the server keeps for the peer's header blocks (HTTP/2's default).
pub const HEADER_TABLE_BYTES: usize = 4096;

/// The window each request stream starts with (SETTINGS_INITIAL_WINDOW_SIZE, advertised): room
/// for the largest message and its prefix, so that a stream never needs a WINDOW_UPDATE.
pub const STREAM_WINDOW_BYTES: u32 = 96 * 1024;

/// The connection's receive window: the most request bytes the peer may have sent that the
/// server has not handed out or dropped yet.
pub const CONNECTION_WINDOW_BYTES: u32 = 256 * 1024;

/// The receive window given back once at least this much is owed (one WINDOW_UPDATE per many
/// small requests, not one per request).
const WINDOW_UPDATE_BYTES_MIN: u32 = 32 * 1024;

/// The largest window RFC 9113 allows.
const WINDOW_MAX: i64 = (1 << 31) - 1;

/// HTTP/2's default initial window, before the peer's SETTINGS say otherwise.
const DEFAULT_WINDOW: i64 = 65_535;

/// The longest `grpc-message` sent (longer ones are cut on a character boundary).
const GRPC_MESSAGE_BYTES_MAX: usize = 1024;

/// An HPACK dynamic table size update to 0 (RFC 7541 6.3).
const TABLE_SIZE_ZERO: u8 = 0x20;

/// The one path served.
const PATH: &[u8] = b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Frame types (RFC 9113 6).
#[allow(missing_docs)]
pub mod frame {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags (RFC 9113 6).
#[allow(missing_docs)]
pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

/// HTTP/2 error codes (RFC 9113 7) the server sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// Graceful: no error.
    NoError = 0x0,
    /// The peer broke the protocol.
    ProtocolError = 0x1,
    /// A flow-control window was overrun or overflowed.
    FlowControlError = 0x3,
    /// A frame on a stream that is closed for it.
    StreamClosed = 0x5,
    /// A frame of the wrong size.
    FrameSizeError = 0x6,
    /// A stream refused before any processing (the peer may retry it).
    RefusedStream = 0x7,
    /// A header block that cannot be decoded.
    CompressionError = 0x9,
    /// The peer does what costs the server too much.
    EnhanceYourCalm = 0xb,
}

/// An error of the whole connection: the server sends GOAWAY with `code` and closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HTTP/2 {code:?}: {reason}")]
pub struct ConnectionError {
    /// The GOAWAY's error code.
    pub code: ErrorCode,
    /// What went wrong (the GOAWAY's debug data).
    pub reason: String,
}

fn connection_error(code: ErrorCode, reason: impl Into<String>) -> ConnectionError {
    ConnectionError { code, reason: reason.into() }
}

/// A complete request, handed out to be decided.
#[derive(Debug)]
pub struct Call {
    /// Its stream, to answer on.
    pub stream: u32,
    /// The request's body: the gRPC message behind its 5-byte prefix.
    body: Vec<u8>,
}

impl Call {
    /// The gRPC message (the encoded request).
    pub fn message(&self) -> &[u8] {
        self.body.get(5..).unwrap_or_default()
    }
}

/// A request stream the server has not finished answering.
#[derive(Debug)]
struct Stream {
    /// The request's body so far, while the client sends it; `None` once it ended.
    body: Option<Vec<u8>>,
    /// Bytes the client sent on this stream (DATA payloads with padding), against the stream
    /// window ([`STREAM_WINDOW_BYTES`]).
    received: u32,
    /// What the peer lets the server send on this stream, counted from the peer's
    /// SETTINGS_INITIAL_WINDOW_SIZE (its WINDOW_UPDATEs less what was sent): a new initial size
    /// moves every stream's window at once, without a visit to each.
    send_credit: i64,
    /// The answer's DATA and trailers that wait for flow-control window, if any.
    pending: Option<Pending>,
}

/// An answer that waits for window: `data[sent..]` as DATA frames, then `trailers` (a header
/// block) with END_STREAM.
#[derive(Debug)]
struct Pending {
    data: Vec<u8>,
    sent: usize,
    trailers: Vec<u8>,
}

/// A header block being received (HEADERS without END_HEADERS, waiting for CONTINUATION).
#[derive(Debug)]
struct PartialBlock {
    stream: u32,
    end_stream: bool,
    block: Vec<u8>,
    continuations: usize,
}

/// What a request's header block says, as far as the server cares.
#[derive(Debug, Default)]
struct RequestHead {
    method: Option<bool>,
    path: Option<bool>,
    scheme: bool,
    grpc_content_type: bool,
    /// Why the block is malformed (RFC 9113 8.1.1), if it is.
    malformed: Option<&'static str>,
    regular_seen: bool,
}

impl RequestHead {
    fn field(&mut self, name: &[u8], value: &[u8]) {
        if let Some(pseudo) = name.strip_prefix(b":") {
            if self.regular_seen {
                self.malformed.get_or_insert("a pseudo-header after a regular header");
            }
            match pseudo {
                b"method" if self.method.is_none() => self.method = Some(value == b"POST"),
                b"path" if self.path.is_none() => self.path = Some(value == PATH),
                b"scheme" if !self.scheme => self.scheme = true,
                b"authority" => {}
                _ => {
                    self.malformed.get_or_insert("an unknown or repeated pseudo-header");
                }
            }
            return;
        }
        self.regular_seen = true;
        if name.iter().any(u8::is_ascii_uppercase) {
            self.malformed.get_or_insert("an upper-case header name");
        }
        match name {
            b"content-type" => self.grpc_content_type = is_grpc_content_type(value),
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade" => {
                self.malformed.get_or_insert("a connection-specific header");
            }
            _ => {}
        }
    }
}

/// `application/grpc`, alone or with a `+format` or `;parameters` (gRPC over HTTP/2).
fn is_grpc_content_type(value: &[u8]) -> bool {
    value
        .strip_prefix(b"application/grpc")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"+") || rest.starts_with(b";"))
}

/// One HTTP/2 connection's state (see the module documentation).
pub struct Connection {
    hpack: Decoder,
    /// Whether the client's preface was read.
    preface_read: bool,
    /// Whether its first SETTINGS frame was read (it must come first).
    settings_read: bool,
    streams: HashMap<u32, Stream>,
    /// The highest stream the client opened.
    last_stream: u32,
    partial: Option<PartialBlock>,
    /// Streams whose answers wait for window, in the order they began to wait.
    blocked: VecDeque<u32>,
    /// The peer's SETTINGS_INITIAL_WINDOW_SIZE and SETTINGS_MAX_FRAME_SIZE.
    peer_initial_window: i64,
    peer_frame_bytes_max: usize,
    /// What the peer lets the server send on the connection.
    send_window: i64,
    /// What the server lets the peer send on the connection, and how much it owes back.
    receive_window: i64,
    receive_owed: u32,
    /// The highest stream GOAWAY let through, once the server sent one.
    goaway_sent: Option<u32>,
    /// Whether the peer sent GOAWAY.
    goaway_received: bool,
    /// The payload of the server's PING not yet acknowledged.
    ping_sent: Option<[u8; 8]>,
    /// Whether the peer lowered its HPACK table size: the server's next header block must say
    /// so (RFC 7541 4.2), with a size update to 0 (it never uses the table).
    table_size_update_due: bool,
    /// Whether that update was sent (the table is then 0 for good, and no lowering matters).
    table_size_zero: bool,
    calls: Vec<Call>,
    output: Vec<u8>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("streams", &self.streams.len())
            .field("last_stream", &self.last_stream)
            .field("goaway_sent", &self.goaway_sent)
            .finish_non_exhaustive()
    }
}

impl Default for Connection {
    fn default() -> Self {
        Connection::new()
    }
}

impl Connection {
    /// A new connection, its server preface (SETTINGS, and the connection window's
    /// WINDOW_UPDATE) already in [`Connection::output`].
    pub fn new() -> Connection {
        let mut connection = Connection {
            hpack: Decoder::new(HEADER_TABLE_BYTES, HEADER_LIST_BYTES_MAX),
            preface_read: false,
            settings_read: false,
            streams: HashMap::new(),
            last_stream: 0,
            partial: None,
            blocked: VecDeque::new(),
            peer_initial_window: DEFAULT_WINDOW,
            peer_frame_bytes_max: FRAME_BYTES_MAX,
            send_window: DEFAULT_WINDOW,
            receive_window: i64::from(CONNECTION_WINDOW_BYTES),
            receive_owed: 0,
            goaway_sent: None,
            goaway_received: false,
            ping_sent: None,
            table_size_update_due: false,
            table_size_zero: false,
            calls: Vec::new(),
            output: Vec::with_capacity(4096),
        };
        let streams_max = super::STREAMS_PER_CONNECTION_MAX;
        let settings: [(u16, u32); 3] =
            [(0x3, streams_max), (0x4, STREAM_WINDOW_BYTES), (0x6, HEADER_LIST_BYTES_MAX as u32)];
        connection.frame_header(settings.len() * 6, frame::SETTINGS, 0, 0);
        for (id, value) in settings {
            connection.output.extend_from_slice(&id.to_be_bytes());
            connection.output.extend_from_slice(&value.to_be_bytes());
        }
        connection.window_update(0, CONNECTION_WINDOW_BYTES - DEFAULT_WINDOW as u32);
        connection
    }

    /// What the server has to send; the driver writes it and clears it.
    pub fn output(&mut self) -> &mut Vec<u8> {
        &mut self.output
    }

    /// The requests that became complete, to be decided and answered.
    pub fn take_calls(&mut self) -> Vec<Call> {
        std::mem::take(&mut self.calls)
    }

    /// Whether the connection has nothing left to do: GOAWAY went one way or the other, and no
    /// stream is open.
    pub fn is_finished(&self) -> bool {
        (self.goaway_sent.is_some() || self.goaway_received) && self.streams.is_empty()
    }

    /// Reads the frames at the start of `input`, at most `frames_max` of them; returns how many
    /// bytes they took (an incomplete frame stays for the next call) and whether `frames_max`
    /// stopped it (more may be buffered).
    pub fn receive(&mut self, input: &[u8], frames_max: usize) -> Result<(usize, bool), ConnectionError> {
        let mut consumed = 0;
        if !self.preface_read {
            let available = input.len().min(PREFACE.len());
            if input[..available] != PREFACE[..available] {
                return Err(connection_error(ErrorCode::ProtocolError, "not an HTTP/2 connection preface"));
            }
            if available < PREFACE.len() {
                return Ok((0, false));
            }
            self.preface_read = true;
            consumed = PREFACE.len();
        }
        let mut frames = 0;
        while frames < frames_max {
            let Some((length, kind, flags, stream)) = read_frame_header(&input[consumed..]) else { break };
            if length > FRAME_BYTES_MAX {
                return Err(connection_error(
                    ErrorCode::FrameSizeError,
                    format!("a frame of {length} bytes (at most {FRAME_BYTES_MAX})"),
                ));
            }
            let Some(payload) = input.get(consumed + 9..consumed + 9 + length) else { break };
            self.frame(kind, flags, stream, payload)?;
            consumed += 9 + length;
            frames += 1;
        }
        self.give_back_window();
        Ok((consumed, frames == frames_max))
    }

    fn frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<(), ConnectionError> {
        if !self.settings_read && kind != frame::SETTINGS {
            return Err(connection_error(
                ErrorCode::ProtocolError,
                "the preface's first frame is not SETTINGS",
            ));
        }
        if self.partial.is_some() && kind != frame::CONTINUATION {
            return Err(connection_error(ErrorCode::ProtocolError, "a header block interrupted"));
        }
        match kind {
            frame::DATA => self.data(flags, stream, payload),
            frame::HEADERS => self.headers(flags, stream, payload),
            frame::PRIORITY => priority(stream, payload),
            frame::RST_STREAM => self.rst_stream(stream, payload),
            frame::SETTINGS => self.settings(flags, stream, payload),
            frame::PUSH_PROMISE => {
                Err(connection_error(ErrorCode::ProtocolError, "PUSH_PROMISE from a client"))
            }
            frame::PING => self.ping(flags, stream, payload),
            frame::GOAWAY => self.goaway(stream, payload),
            frame::WINDOW_UPDATE => self.window_update_received(stream, payload),
            frame::CONTINUATION => self.continuation(flags, stream, payload),
            // Unknown frame types are ignored (RFC 9113 5.5).
            _ => Ok(()),
        }
    }

    fn settings(&mut self, flags: u8, stream: u32, payload: &[u8]) -> Result<(), ConnectionError> {
        if stream != 0 {
            return Err(connection_error(ErrorCode::ProtocolError, "SETTINGS on a stream"));
        }
        if flags & flag::ACK != 0 {
            if !payload.is_empty() {
                return Err(connection_error(
                    ErrorCode::FrameSizeError,
                    "a SETTINGS acknowledgement with a payload",
                ));
            }
            return Ok(());
        }
        if !payload.len().is_multiple_of(6) {
            return Err(connection_error(
                ErrorCode::FrameSizeError,
                "SETTINGS of a length not a multiple of 6",
            ));
        }
        self.settings_read = true;
        for setting in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([setting[0], setting[1]]);
            let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
            match id {
                0x2 if value > 1 => {
                    return Err(connection_error(
                        ErrorCode::ProtocolError,
                        "SETTINGS_ENABLE_PUSH not 0 or 1",
                    ));
                }
                0x1 if value < HEADER_TABLE_BYTES as u32 && !self.table_size_zero => {
                    self.table_size_update_due = true;
                }
                0x4 => self.initial_window(value)?,
                0x5 => {
                    if !(FRAME_BYTES_MAX as u32..=0xff_ffff).contains(&value) {
                        return Err(connection_error(
                            ErrorCode::ProtocolError,
                            "SETTINGS_MAX_FRAME_SIZE out of range",
                        ));
                    }
                    self.peer_frame_bytes_max = value as usize;
                }
                // The header table size only bounds a dynamic table the server never uses;
                // the others are for the peer's own streams, or unknown (ignored).
                _ => {}
            }
        }
        self.frame_header(0, frame::SETTINGS, flag::ACK, 0);
        self.flush_blocked();
        Ok(())
    }

    /// A new SETTINGS_INITIAL_WINDOW_SIZE: every open stream's window moves by the difference, at
    /// once (streams count their windows from it: a flood of SETTINGS costs no visit to each).
    fn initial_window(&mut self, value: u32) -> Result<(), ConnectionError> {
        let value = i64::from(value);
        if value > WINDOW_MAX {
            return Err(connection_error(
                ErrorCode::FlowControlError,
                "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1",
            ));
        }
        self.peer_initial_window = value;
        Ok(())
    }

    /// What the peer lets the server send on a stream of `credit` (see [`Stream::send_credit`]);
    /// a window a new initial size took past 2^31-1 counts as 2^31-1 (the answers are small).
    fn stream_window(&self, credit: i64) -> i64 {
        (self.peer_initial_window + credit).min(WINDOW_MAX)
    }

    fn ping(&mut self, flags: u8, stream: u32, payload: &[u8]) -> Result<(), ConnectionError> {
        if stream != 0 {
            return Err(connection_error(ErrorCode::ProtocolError, "PING on a stream"));
        }
        let Ok(payload) = <[u8; 8]>::try_from(payload) else {
            return Err(connection_error(ErrorCode::FrameSizeError, "PING not of 8 bytes"));
        };
        if flags & flag::ACK != 0 {
            if self.ping_sent == Some(payload) {
                self.ping_sent = None;
            }
            return Ok(());
        }
        self.frame_header(8, frame::PING, flag::ACK, 0);
        self.output.extend_from_slice(&payload);
        Ok(())
    }

    fn goaway(&mut self, stream: u32, payload: &[u8]) -> Result<(), ConnectionError> {
        if stream != 0 {
            return Err(connection_error(ErrorCode::ProtocolError, "GOAWAY on a stream"));
        }
        if payload.len() < 8 {
            return Err(connection_error(ErrorCode::FrameSizeError, "GOAWAY shorter than 8 bytes"));
        }
        self.goaway_received = true;
        Ok(())
    }

    fn window_update_received(&mut self, stream: u32, payload: &[u8]) -> Result<(), ConnectionError> {
        let Ok(bytes) = <[u8; 4]>::try_from(payload) else {
            return Err(connection_error(ErrorCode::FrameSizeError, "WINDOW_UPDATE not of 4 bytes"));
        };
        let increment = i64::from(u32::from_be_bytes(bytes) & 0x7fff_ffff);
        if stream == 0 {
            if increment == 0 {
                return Err(connection_error(ErrorCode::ProtocolError, "a WINDOW_UPDATE of 0"));
            }
            self.send_window += increment;
            if self.send_window > WINDOW_MAX {
                return Err(connection_error(
                    ErrorCode::FlowControlError,
                    "the connection window above 2^31-1",
                ));
            }
        } else if let Some(open) = self.streams.get_mut(&stream) {
            open.send_credit += increment;
            if increment == 0 || self.peer_initial_window + open.send_credit > WINDOW_MAX {
                let code =
                    if increment == 0 { ErrorCode::ProtocolError } else { ErrorCode::FlowControlError };
                self.reset(stream, code);
                return Ok(());
            }
        } else if stream > self.last_stream {
            return Err(connection_error(ErrorCode::ProtocolError, "WINDOW_UPDATE on an idle stream"));
        }
        self.flush_blocked();
        Ok(())
    }

    fn rst_stream(&mut self, stream: u32, payload: &[u8]) -> Result<(), ConnectionError> {
        if payload.len() != 4 {
            return Err(connection_error(ErrorCode::FrameSizeError, "RST_STREAM not of 4 bytes"));
        }
        if stream == 0 || stream > self.last_stream {
            return Err(connection_error(ErrorCode::ProtocolError, "RST_STREAM on an idle stream"));
        }
        // A call in progress runs to its end (its in-flight permit bounds it); its answer is
        // dropped, as the stream is gone.
        self.close(stream);
        Ok(())
    }

    fn data(&mut self, flags: u8, stream: u32, payload: &[u8]) -> Result<(), ConnectionError> {
        if stream == 0 {
            return Err(connection_error(ErrorCode::ProtocolError, "DATA on stream 0"));
        }
        if stream > self.last_stream {
            return Err(connection_error(ErrorCode::ProtocolError, "DATA on an idle stream"));
        }
        // Flow control counts the whole payload, padding included.
        let length = payload.len() as u32;
        self.receive_window -= i64::from(length);
        if self.receive_window < 0 {
            return Err(connection_error(ErrorCode::FlowControlError, "DATA beyond the connection window"));
        }
        let data = unpad(flags, payload)?;
        // What is not kept is given back at once; a body's bytes when it is handed out.
        let kept = match self.streams.get_mut(&stream) {
            Some(Stream { body: Some(body), received, .. }) => {
                *received = received.saturating_add(length);
                if *received > STREAM_WINDOW_BYTES {
                    self.owe(length);
                    self.reset(stream, ErrorCode::FlowControlError);
                    return Ok(());
                }
                if body.len() + data.len() > super::MESSAGE_BYTES_MAX + 5 {
                    self.owe(length);
                    let message = format!("a message larger than {} bytes", super::MESSAGE_BYTES_MAX);
                    self.respond_status(stream, tonic::Code::OutOfRange, &message);
                    return Ok(());
                }
                body.extend_from_slice(data);
                data.len() as u32
            }
            // Closed by the client's END_STREAM: DATA after it is a stream error.
            Some(_) => {
                self.owe(length);
                self.reset(stream, ErrorCode::StreamClosed);
                return Ok(());
            }
            // A stream closed meanwhile (reset, answered early): ignored (RFC 9113 5.1).
            None => 0,
        };
        self.owe(length - kept);
        if flags & flag::END_STREAM != 0 {
            self.end_of_request(stream);
        }
        Ok(())
    }

    fn headers(&mut self, flags: u8, stream: u32, payload: &[u8]) -> Result<(), ConnectionError> {
        if stream == 0 {
            return Err(connection_error(ErrorCode::ProtocolError, "HEADERS on stream 0"));
        }
        let mut fragment = unpad(flags, payload)?;
        if flags & flag::PRIORITY != 0 {
            fragment = fragment.get(5..).ok_or_else(|| {
                connection_error(ErrorCode::FrameSizeError, "HEADERS too short for its priority")
            })?;
        }
        let end_stream = flags & flag::END_STREAM != 0;
        if flags & flag::END_HEADERS != 0 {
            return self.header_block(stream, end_stream, fragment);
        }
        if fragment.len() > HEADER_BLOCK_BYTES_MAX {
            return Err(header_block_too_large());
        }
        let block = fragment.to_vec();
        self.partial = Some(PartialBlock { stream, end_stream, block, continuations: 0 });
        Ok(())
    }

    fn continuation(&mut self, flags: u8, stream: u32, payload: &[u8]) -> Result<(), ConnectionError> {
        let Some(partial) = &mut self.partial else {
            return Err(connection_error(ErrorCode::ProtocolError, "CONTINUATION without a header block"));
        };
        if partial.stream != stream {
            return Err(connection_error(ErrorCode::ProtocolError, "CONTINUATION of another stream"));
        }
        partial.continuations += 1;
        if partial.continuations > CONTINUATIONS_MAX
            || partial.block.len() + payload.len() > HEADER_BLOCK_BYTES_MAX
        {
            return Err(header_block_too_large());
        }
        partial.block.extend_from_slice(payload);
        if flags & flag::END_HEADERS == 0 {
            return Ok(());
        }
        let Some(partial) = self.partial.take() else { return Ok(()) };
        self.header_block(partial.stream, partial.end_stream, &partial.block)
    }

    /// A complete header block: a new request, or a request's trailers.
    fn header_block(&mut self, stream: u32, end_stream: bool, block: &[u8]) -> Result<(), ConnectionError> {
        // Decoded whatever becomes of the stream: the dynamic table must follow the peer's.
        let mut head = RequestHead::default();
        let list = self
            .hpack
            .decode(block, |name, value| head.field(name, value))
            .map_err(|error| connection_error(ErrorCode::CompressionError, error.to_string()))?;
        if let Some(open) = self.streams.get(&stream) {
            // Trailers: they must end the request, and are otherwise ignored.
            if open.body.is_none() {
                self.reset(stream, ErrorCode::StreamClosed);
            } else if !end_stream {
                self.reset(stream, ErrorCode::ProtocolError);
            } else {
                self.end_of_request(stream);
            }
            return Ok(());
        }
        if stream <= self.last_stream {
            // A stream closed before (answered, reset, or a new stream that does not count up):
            // late trailers of a reset stream need no answer, but a request must not hang.
            self.rst(stream, ErrorCode::StreamClosed);
            return Ok(());
        }
        if stream.is_multiple_of(2) {
            return Err(connection_error(ErrorCode::ProtocolError, "a client stream of an even number"));
        }
        self.last_stream = stream;
        if self.goaway_sent.is_some_and(|last| stream > last) {
            // After GOAWAY, new streams are ignored; the client retries them elsewhere.
            return Ok(());
        }
        if self.streams.len() >= super::STREAMS_PER_CONNECTION_MAX as usize {
            self.rst(stream, ErrorCode::RefusedStream);
            return Ok(());
        }
        let initial = Stream { body: Some(Vec::new()), received: 0, send_credit: 0, pending: None };
        self.streams.insert(stream, initial);
        if let hpack::List::TooLarge { size } = list {
            let message = format!("request headers of {size} bytes (at most {HEADER_LIST_BYTES_MAX})");
            self.respond_status(stream, tonic::Code::ResourceExhausted, &message);
        } else if let Some(reason) = head.malformed {
            tracing::debug!(stream, reason, "malformed gRPC request head");
            self.reset(stream, ErrorCode::ProtocolError);
        } else if head.method.is_none() || head.path.is_none() || !head.scheme {
            self.reset(stream, ErrorCode::ProtocolError);
        } else if head.method == Some(false) {
            self.answer_http(stream, b"405");
        } else if !head.grpc_content_type {
            self.answer_http(stream, b"415");
        } else if head.path == Some(false) {
            self.respond_status(
                stream,
                tonic::Code::Unimplemented,
                "unknown method: only ShouldRateLimit is served",
            );
        } else if end_stream {
            self.end_of_request(stream);
        }
        Ok(())
    }

    /// The client ended `stream`'s request: its message is handed out as a call, or the stream
    /// is answered with what is wrong with it.
    fn end_of_request(&mut self, stream: u32) {
        let Some(open) = self.streams.get_mut(&stream) else { return };
        let Some(body) = open.body.take() else { return };
        self.owe(body.len() as u32);
        let (code, message) = match body.as_slice() {
            [0, a, b, c, d, message @ ..]
                if u32::from_be_bytes([*a, *b, *c, *d]) as usize == message.len() =>
            {
                self.calls.push(Call { stream, body });
                return;
            }
            [1, ..] => (tonic::Code::Unimplemented, "a compressed message: only identity is accepted"),
            [] => (tonic::Code::InvalidArgument, "no request message"),
            _ => (tonic::Code::InvalidArgument, "not one length-prefixed gRPC message"),
        };
        self.respond_status(stream, code, message);
    }

    /// Answers `stream` with `message` (an encoded response) and `grpc-status: 0`.
    pub fn respond(&mut self, stream: u32, message: &[u8]) {
        let Some(open) = self.streams.get(&stream) else { return };
        let window = self.send_window.min(self.stream_window(open.send_credit));
        let length = 5 + message.len();
        self.response_head(stream);
        if length <= self.peer_frame_bytes_max && length as i64 <= window {
            // The common case: the whole answer at once, written where it goes.
            write_frame_header(&mut self.output, length, frame::DATA, 0, stream);
            self.output.push(0);
            self.output.extend_from_slice(&(message.len() as u32).to_be_bytes());
            self.output.extend_from_slice(message);
            self.send_window -= length as i64;
            let mut trailers = [0u8; 16];
            let trailers = grpc_status_ok(&mut trailers);
            self.header_frames(stream, flag::END_HEADERS | flag::END_STREAM, trailers);
            self.close(stream);
            return;
        }
        let mut data = Vec::with_capacity(length);
        data.push(0);
        data.extend_from_slice(&(message.len() as u32).to_be_bytes());
        data.extend_from_slice(message);
        let mut trailers = [0u8; 16];
        let trailers = grpc_status_ok(&mut trailers).to_vec();
        let Some(open) = self.streams.get_mut(&stream) else { return };
        open.pending = Some(Pending { data, sent: 0, trailers });
        self.blocked.push_back(stream);
        self.flush_blocked();
    }

    /// Answers `stream` with a gRPC status and no message (trailers only).
    pub fn respond_status(&mut self, stream: u32, code: tonic::Code, message: &str) {
        if !self.streams.contains_key(&stream) {
            return;
        }
        let mut block = Vec::with_capacity(64 + message.len());
        response_headers(&mut block);
        hpack::encode_literal(
            &mut block,
            b"grpc-status",
            itoa::Buffer::new().format(i32::from(code)).as_bytes(),
        );
        if !message.is_empty() {
            hpack::encode_literal(&mut block, b"grpc-message", &percent_encode(message));
        }
        self.end_with(stream, &block);
    }

    /// An answer that is not gRPC's (405, 415): the status alone, ending the stream.
    fn answer_http(&mut self, stream: u32, status: &[u8]) {
        let mut block = Vec::with_capacity(8);
        hpack::encode_literal_indexed_name(&mut block, 8, status);
        self.end_with(stream, &block);
    }

    /// Ends `stream` with the header block of a complete answer. If the client is still sending
    /// its request, the rest is not wanted (RFC 9113 8.1: RST_STREAM with NO_ERROR after a
    /// complete answer).
    fn end_with(&mut self, stream: u32, block: &[u8]) {
        let still_sending = self.streams.get(&stream).is_some_and(|open| open.body.is_some());
        self.header_frames(stream, flag::END_HEADERS | flag::END_STREAM, block);
        self.close(stream);
        if still_sending {
            self.rst(stream, ErrorCode::NoError);
        }
    }

    /// The answer's HEADERS (`:status 200`, `content-type: application/grpc`).
    fn response_head(&mut self, stream: u32) {
        let start = self.output.len();
        write_frame_header(&mut self.output, 0, frame::HEADERS, flag::END_HEADERS, stream);
        let block_start = self.output.len();
        if self.table_size_update_due {
            self.table_size_updated();
            self.output.push(TABLE_SIZE_ZERO);
        }
        response_headers(&mut self.output);
        // A few bytes, far below any frame size: the length is written once they are.
        let length = (self.output.len() - block_start) as u32;
        self.output[start..start + 3].copy_from_slice(&length.to_be_bytes()[1..]);
    }

    /// Sends what the windows let through of the answers that wait, in the order they began to
    /// wait; one that waits for its own stream's window does not hold up the others.
    fn flush_blocked(&mut self) {
        if self.blocked.is_empty() {
            return;
        }
        let blocked = std::mem::take(&mut self.blocked);
        for stream in blocked {
            if self.send_window <= 0 || !self.send_pending(stream) {
                self.blocked.push_back(stream);
            }
        }
    }

    /// Sends what the windows allow of `stream`'s pending answer; whether it is all sent (or
    /// the stream is gone).
    fn send_pending(&mut self, stream: u32) -> bool {
        let initial = self.peer_initial_window;
        let Some(open) = self.streams.get_mut(&stream) else { return true };
        let Some(pending) = open.pending.as_mut() else { return true };
        while pending.sent < pending.data.len() {
            let window = self.send_window.min((initial + open.send_credit).min(WINDOW_MAX));
            let left = pending.data.len() - pending.sent;
            let chunk = left.min(self.peer_frame_bytes_max).min(usize::try_from(window.max(0)).unwrap_or(0));
            if chunk == 0 {
                return false;
            }
            write_frame_header(&mut self.output, chunk, frame::DATA, 0, stream);
            self.output.extend_from_slice(&pending.data[pending.sent..pending.sent + chunk]);
            pending.sent += chunk;
            self.send_window -= chunk as i64;
            open.send_credit -= chunk as i64;
        }
        let trailers = std::mem::take(&mut pending.trailers);
        self.header_frames(stream, flag::END_HEADERS | flag::END_STREAM, &trailers);
        self.close(stream);
        true
    }

    /// Sends GOAWAY: no stream after those open now will be served. With an error, the
    /// connection is over; without, the streams open finish first.
    pub fn go_away(&mut self, code: ErrorCode, reason: &str) {
        let last = *self.goaway_sent.get_or_insert(self.last_stream);
        let debug = &reason.as_bytes()[..reason.len().min(256)];
        self.frame_header(8 + debug.len(), frame::GOAWAY, 0, 0);
        self.output.extend_from_slice(&last.to_be_bytes());
        self.output.extend_from_slice(&(code as u32).to_be_bytes());
        self.output.extend_from_slice(debug);
    }

    /// Whether GOAWAY was sent.
    pub fn goaway_sent(&self) -> bool {
        self.goaway_sent.is_some()
    }

    /// Sends a PING with `payload` (a keepalive probe); [`Connection::ping_outstanding`] until
    /// the peer acknowledges it.
    pub fn send_ping(&mut self, payload: [u8; 8]) {
        self.ping_sent = Some(payload);
        self.frame_header(8, frame::PING, 0, 0);
        self.output.extend_from_slice(&payload);
    }

    /// Whether the last PING sent is not acknowledged yet.
    pub fn ping_outstanding(&self) -> bool {
        self.ping_sent.is_some()
    }

    /// Closes `stream` with RST_STREAM `code` (a stream error).
    fn reset(&mut self, stream: u32, code: ErrorCode) {
        self.close(stream);
        self.rst(stream, code);
    }

    fn rst(&mut self, stream: u32, code: ErrorCode) {
        self.frame_header(4, frame::RST_STREAM, 0, stream);
        self.output.extend_from_slice(&(code as u32).to_be_bytes());
    }

    /// Forgets `stream`; the body bytes it held are given back to the connection window.
    fn close(&mut self, stream: u32) {
        if let Some(closed) = self.streams.remove(&stream)
            && let Some(body) = closed.body
        {
            self.owe(body.len() as u32);
        }
    }

    /// Counts `bytes` of the connection's receive window as given back (sent by
    /// [`Connection::give_back_window`]).
    fn owe(&mut self, bytes: u32) {
        self.receive_owed += bytes;
    }

    /// Sends the connection WINDOW_UPDATE owed, once it is worth a frame or the peer has used
    /// half its window.
    fn give_back_window(&mut self) {
        let owed = self.receive_owed;
        let half_used = self.receive_window < i64::from(CONNECTION_WINDOW_BYTES / 2);
        if owed == 0 || (owed < WINDOW_UPDATE_BYTES_MIN && !half_used) {
            return;
        }
        self.receive_owed = 0;
        self.receive_window += i64::from(owed);
        self.window_update(0, owed);
    }

    fn window_update(&mut self, stream: u32, increment: u32) {
        self.frame_header(4, frame::WINDOW_UPDATE, 0, stream);
        self.output.extend_from_slice(&increment.to_be_bytes());
    }

    /// The size update to 0 is sent: the table is 0 for good.
    fn table_size_updated(&mut self) {
        self.table_size_update_due = false;
        self.table_size_zero = true;
    }

    /// A header block as HEADERS (and CONTINUATION frames if it is longer than a frame).
    fn header_frames(&mut self, stream: u32, flags: u8, block: &[u8]) {
        if self.table_size_update_due {
            // Rare (a peer that lowered its table): the block with the update in front.
            self.table_size_updated();
            let mut updated = Vec::with_capacity(1 + block.len());
            updated.push(TABLE_SIZE_ZERO);
            updated.extend_from_slice(block);
            return self.header_frames(stream, flags, &updated);
        }
        let frame_max = self.peer_frame_bytes_max;
        let mut chunks = block.chunks(frame_max).peekable();
        let first = chunks.next().unwrap_or_default();
        let more = chunks.peek().is_some();
        let first_flags = if more { flags & !flag::END_HEADERS } else { flags };
        write_frame_header(&mut self.output, first.len(), frame::HEADERS, first_flags, stream);
        self.output.extend_from_slice(first);
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let flags = if last { flag::END_HEADERS } else { 0 };
            write_frame_header(&mut self.output, chunk.len(), frame::CONTINUATION, flags, stream);
            self.output.extend_from_slice(chunk);
        }
    }

    fn frame_header(&mut self, length: usize, kind: u8, flags: u8, stream: u32) {
        write_frame_header(&mut self.output, length, kind, flags, stream);
    }
}

/// The frame header (RFC 9113 4.1) at the start of `bytes`, once its 9 bytes are there: the
/// payload's length, the type, the flags and the stream (its reserved bit cleared).
pub fn read_frame_header(bytes: &[u8]) -> Option<(usize, u8, u8, u32)> {
    let header = bytes.get(..9)?;
    let length = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    Some((length, header[3], header[4], stream))
}

/// Appends a frame header (RFC 9113 4.1); `length` is the payload's, at most 2^24 - 1.
pub fn write_frame_header(output: &mut Vec<u8>, length: usize, kind: u8, flags: u8, stream: u32) {
    let length = length as u32;
    output.extend_from_slice(&length.to_be_bytes()[1..]);
    output.push(kind);
    output.push(flags);
    output.extend_from_slice(&stream.to_be_bytes());
}

/// The trailers of a successful answer, `grpc-status: 0`, encoded into `buffer`.
fn grpc_status_ok(buffer: &mut [u8; 16]) -> &[u8] {
    // Literal without indexing, new name (0x00), "grpc-status" (11 bytes), "0" (1 byte).
    const BLOCK: &[u8; 15] = b"\x00\x0bgrpc-status\x01\x30";
    buffer[..BLOCK.len()].copy_from_slice(BLOCK);
    &buffer[..BLOCK.len()]
}

/// `:status 200` (static table entry 8) and `content-type: application/grpc` (name 31).
fn response_headers(block: &mut Vec<u8>) {
    hpack::encode_indexed(block, 8);
    hpack::encode_literal_indexed_name(block, 31, b"application/grpc");
}

fn header_block_too_large() -> ConnectionError {
    let reason =
        format!("a header block over {HEADER_BLOCK_BYTES_MAX} bytes or {CONTINUATIONS_MAX} CONTINUATIONs");
    connection_error(ErrorCode::EnhanceYourCalm, reason)
}

/// A PRIORITY frame: checked, and ignored (RFC 9113 deprecates the scheme).
fn priority(stream: u32, payload: &[u8]) -> Result<(), ConnectionError> {
    if stream == 0 {
        return Err(connection_error(ErrorCode::ProtocolError, "PRIORITY on stream 0"));
    }
    if payload.len() != 5 {
        return Err(connection_error(ErrorCode::FrameSizeError, "PRIORITY not of 5 bytes"));
    }
    Ok(())
}

/// The payload of a DATA or HEADERS frame without its padding (also the load generator's,
/// `examples/rls_load.rs`).
pub fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], ConnectionError> {
    if flags & flag::PADDED == 0 {
        return Ok(payload);
    }
    let Some((&padding, rest)) = payload.split_first() else {
        return Err(connection_error(ErrorCode::FrameSizeError, "a padded frame without its pad length"));
    };
    rest.len()
        .checked_sub(usize::from(padding))
        .map(|end| &rest[..end])
        .ok_or_else(|| connection_error(ErrorCode::ProtocolError, "padding longer than the frame"))
}

/// `grpc-message`'s encoding: printable ASCII but `%` as is, other bytes as `%XX`; at most
/// [`GRPC_MESSAGE_BYTES_MAX`] bytes of the message.
fn percent_encode(message: &str) -> Vec<u8> {
    let mut end = message.len().min(GRPC_MESSAGE_BYTES_MAX);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let mut encoded = Vec::with_capacity(end);
    for &byte in &message.as_bytes()[..end] {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            encoded.push(byte);
        } else {
            encoded.extend_from_slice(format!("%{byte:02X}").as_bytes());
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame as (type, flags, stream, payload).
    type Frame = (u8, u8, u32, Vec<u8>);

    fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        write_frame_header(&mut bytes, payload.len(), kind, flags, stream);
        bytes.extend_from_slice(payload);
        bytes
    }

    /// The frames of `bytes` (whole frames only).
    fn frames(mut bytes: &[u8]) -> Vec<Frame> {
        let mut frames = Vec::new();
        while bytes.len() >= 9 {
            let length = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            frames.push((bytes[3], bytes[4], stream, bytes[9..9 + length].to_vec()));
            bytes = &bytes[9 + length..];
        }
        frames
    }

    fn request_block(path: &[u8]) -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", path),
            (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ] {
            hpack::encode_literal(&mut block, name, value);
        }
        block
    }

    fn grpc_body(message: &[u8]) -> Vec<u8> {
        let mut body = vec![0];
        body.extend_from_slice(&(message.len() as u32).to_be_bytes());
        body.extend_from_slice(message);
        body
    }

    /// A connection past the preface and the client's SETTINGS (`settings`), its output taken.
    fn connected(settings: &[(u16, u32)]) -> Connection {
        let mut connection = Connection::new();
        let mut payload = Vec::new();
        for (id, value) in settings {
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(&value.to_be_bytes());
        }
        let mut input = PREFACE.to_vec();
        input.extend(frame_bytes(frame::SETTINGS, 0, 0, &payload));
        let (consumed, _) = connection.receive(&input, 100).expect("a valid preface");
        assert_eq!(consumed, input.len());
        let output = frames(&std::mem::take(connection.output()));
        assert_eq!(output[0].0, frame::SETTINGS, "the server preface first");
        assert!(output.iter().any(|f| f.0 == frame::SETTINGS && f.1 == flag::ACK), "SETTINGS acknowledged");
        connection
    }

    fn receive(connection: &mut Connection, input: &[u8]) -> Result<Vec<Frame>, ConnectionError> {
        let (consumed, _) = connection.receive(input, 100_000)?;
        assert_eq!(consumed, input.len(), "every frame read");
        Ok(frames(&std::mem::take(connection.output())))
    }

    /// Two complete calls, on streams 1 and 3; what the server answers at once is dropped.
    fn send_two_calls(connection: &mut Connection) {
        let mut input = Vec::new();
        for stream in [1, 3] {
            input.extend(frame_bytes(frame::HEADERS, flag::END_HEADERS, stream, &request_block(PATH)));
            input.extend(frame_bytes(frame::DATA, flag::END_STREAM, stream, &grpc_body(b"x")));
        }
        receive(connection, &input).expect("valid");
    }

    /// The fields of a header block the server wrote.
    fn fields(block: &[u8]) -> Vec<(String, String)> {
        let mut fields = Vec::new();
        let mut decoder = Decoder::new(HEADER_TABLE_BYTES, HEADER_LIST_BYTES_MAX);
        decoder
            .decode(block, |name, value| {
                fields.push((
                    String::from_utf8_lossy(name).into_owned(),
                    String::from_utf8_lossy(value).into_owned(),
                ))
            })
            .expect("the server's blocks decode");
        fields
    }

    fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
        fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_call_is_handed_out_then_answered_with_its_message_and_trailers() {
        let mut connection = connected(&[]);
        let mut input = frame_bytes(frame::HEADERS, flag::END_HEADERS, 1, &request_block(PATH));
        input.extend(frame_bytes(frame::DATA, flag::END_STREAM, 1, &grpc_body(b"hello")));
        assert!(receive(&mut connection, &input).expect("valid").is_empty());
        let calls = connection.take_calls();
        assert_eq!(calls.len(), 1);
        assert_eq!((calls[0].stream, calls[0].message()), (1, &b"hello"[..]));
        connection.respond(1, b"answer");
        let output = frames(&std::mem::take(connection.output()));
        let kinds: Vec<_> = output.iter().map(|f| (f.0, f.1, f.2)).collect();
        assert_eq!(
            kinds,
            [
                (frame::HEADERS, flag::END_HEADERS, 1),
                (frame::DATA, 0, 1),
                (frame::HEADERS, flag::END_HEADERS | flag::END_STREAM, 1)
            ]
        );
        let head = fields(&output[0].3);
        assert_eq!(
            (field(&head, ":status"), field(&head, "content-type")),
            (Some("200"), Some("application/grpc"))
        );
        assert_eq!(output[1].3, grpc_body(b"answer"));
        assert_eq!(field(&fields(&output[2].3), "grpc-status"), Some("0"));
        assert!(connection.streams.is_empty(), "the stream is closed");
    }

    #[test]
    fn an_answer_waits_for_the_peers_window_without_holding_up_others() {
        // The peer lets 3 bytes through per stream.
        let mut connection = connected(&[(0x4, 3)]);
        send_two_calls(&mut connection);
        assert_eq!(connection.take_calls().len(), 2);
        connection.respond(1, b"0123456789");
        connection.respond(3, b"ab");
        let sent = frames(&std::mem::take(connection.output()));
        let data: Vec<_> = sent.iter().filter(|f| f.0 == frame::DATA).map(|f| (f.2, f.3.len())).collect();
        assert_eq!(data, [(1, 3), (3, 3)], "each stream as far as its own window lets it");
        // More window for stream 1: the rest of its answer and its trailers; stream 3 waits.
        let update = frame_bytes(frame::WINDOW_UPDATE, 0, 1, &100u32.to_be_bytes());
        let sent = receive(&mut connection, &update).expect("valid");
        let data: Vec<_> = sent.iter().filter(|f| f.0 == frame::DATA).map(|f| (f.2, f.3.len())).collect();
        assert_eq!(data, [(1, 12)]);
        let ends: Vec<_> = sent.iter().filter(|f| f.1 & flag::END_STREAM != 0).map(|f| f.2).collect();
        assert_eq!(ends, [1], "stream 3 has 4 of its 7 bytes left");
        // A new initial window moves the waiting stream's too.
        let settings = frame_bytes(frame::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 5]);
        let sent = receive(&mut connection, &settings).expect("valid");
        let data: Vec<_> = sent.iter().filter(|f| f.0 == frame::DATA).map(|f| (f.2, f.3.len())).collect();
        assert_eq!(data, [(3, 2)], "window 5, of which 3 used");
        let update = frame_bytes(frame::WINDOW_UPDATE, 0, 3, &4u32.to_be_bytes());
        let sent = receive(&mut connection, &update).expect("valid");
        assert_eq!(sent.iter().map(|f| (f.0, f.2, f.3.len())).next(), Some((frame::DATA, 3, 2)));
        assert!(connection.streams.is_empty());
    }

    #[test]
    fn bodies_hold_the_connection_window_until_handed_out() {
        let mut connection = connected(&[]);
        let body = grpc_body(&[7; 20_000]);
        let mut input = Vec::new();
        for stream in [1u32, 3] {
            input.extend(frame_bytes(frame::HEADERS, flag::END_HEADERS, stream, &request_block(PATH)));
            for chunk in body.chunks(FRAME_BYTES_MAX) {
                input.extend(frame_bytes(frame::DATA, 0, stream, chunk));
            }
        }
        let sent = receive(&mut connection, &input).expect("valid");
        assert!(sent.iter().all(|f| f.0 != frame::WINDOW_UPDATE), "nothing handed out, nothing given back");
        // Handed out, the bodies are owed back: one WINDOW_UPDATE once that is worth a frame.
        let end = frame_bytes(frame::DATA, flag::END_STREAM, 1, &[]);
        let sent = receive(&mut connection, &end).expect("valid");
        assert!(sent.iter().all(|f| f.0 != frame::WINDOW_UPDATE), "{} bytes owed: not yet", body.len());
        let end = frame_bytes(frame::DATA, flag::END_STREAM, 3, &[]);
        let sent = receive(&mut connection, &end).expect("valid");
        let updates: Vec<_> =
            sent.iter().filter(|f| f.0 == frame::WINDOW_UPDATE).map(|f| f.3.clone()).collect();
        assert_eq!(updates, [(2 * body.len() as u32).to_be_bytes().to_vec()], "both bodies given back");
        assert_eq!(connection.take_calls().len(), 2);
        // Beyond the window is a connection error.
        let mut connection = connected(&[]);
        let mut input = Vec::new();
        let mut stream = 1;
        while input.len() < CONNECTION_WINDOW_BYTES as usize + 100_000 {
            input.extend(frame_bytes(frame::HEADERS, flag::END_HEADERS, stream, &request_block(PATH)));
            for chunk in body.chunks(FRAME_BYTES_MAX) {
                input.extend(frame_bytes(frame::DATA, 0, stream, chunk));
            }
            stream += 2;
        }
        let error = connection.receive(&input, usize::MAX).expect_err("over the window");
        assert_eq!(error.code, ErrorCode::FlowControlError);
    }

    #[test]
    fn a_message_over_the_bound_is_answered_out_of_range_and_the_rest_ignored() {
        let mut connection = connected(&[]);
        let mut input = frame_bytes(frame::HEADERS, flag::END_HEADERS, 1, &request_block(PATH));
        let body = grpc_body(&vec![1; super::super::MESSAGE_BYTES_MAX + 1]);
        for chunk in body.chunks(FRAME_BYTES_MAX) {
            input.extend(frame_bytes(frame::DATA, 0, 1, chunk));
        }
        input.extend(frame_bytes(frame::DATA, flag::END_STREAM, 1, b"late"));
        let sent = receive(&mut connection, &input).expect("valid");
        assert!(connection.take_calls().is_empty());
        let trailers = sent.iter().find(|f| f.0 == frame::HEADERS).expect("an answer");
        assert_eq!(field(&fields(&trailers.3), "grpc-status"), Some("11"), "OUT_OF_RANGE");
        let reset = sent.iter().find(|f| f.0 == frame::RST_STREAM).expect("the rest refused");
        assert_eq!(reset.3, 0u32.to_be_bytes(), "NO_ERROR");
    }

    #[test]
    fn requests_that_are_not_a_grpc_call_of_the_method_get_their_answer() {
        let cases: [(&[u8], Vec<u8>, &str, &str); 4] = [
            (b"/other.Service/Method", grpc_body(b"x"), "grpc-status", "12"),
            (PATH, vec![1, 0, 0, 0, 1, 9], "grpc-status", "12"),
            (PATH, vec![0, 0, 0, 0, 9, 1], "grpc-status", "3"),
            (PATH, Vec::new(), "grpc-status", "3"),
        ];
        for (path, body, name, value) in cases {
            let mut connection = connected(&[]);
            let mut input = frame_bytes(frame::HEADERS, flag::END_HEADERS, 1, &request_block(path));
            input.extend(frame_bytes(frame::DATA, flag::END_STREAM, 1, &body));
            let sent = receive(&mut connection, &input).expect("valid");
            assert!(connection.take_calls().is_empty());
            let answer = sent.iter().find(|f| f.0 == frame::HEADERS).expect("an answer");
            assert_eq!(field(&fields(&answer.3), name), Some(value), "{path:?} {body:?}");
        }
        // Not gRPC at all: HTTP's own status.
        let mut block = Vec::new();
        for (name, value) in [(":method", "GET"), (":scheme", "http"), (":path", "/")] {
            hpack::encode_literal(&mut block, name.as_bytes(), value.as_bytes());
        }
        let mut connection = connected(&[]);
        let sent = receive(
            &mut connection,
            &frame_bytes(frame::HEADERS, flag::END_HEADERS | flag::END_STREAM, 1, &block),
        )
        .expect("valid");
        assert_eq!(field(&fields(&sent[0].3), ":status"), Some("405"));
    }

    #[test]
    fn streams_beyond_the_bound_are_refused() {
        let mut connection = connected(&[]);
        let mut input = Vec::new();
        let streams_max = super::super::STREAMS_PER_CONNECTION_MAX;
        for index in 0..=streams_max {
            input.extend(frame_bytes(frame::HEADERS, flag::END_HEADERS, 2 * index + 1, &request_block(PATH)));
        }
        let sent = receive(&mut connection, &input).expect("valid");
        assert_eq!(connection.streams.len(), streams_max as usize);
        let refused: Vec<_> =
            sent.iter().filter(|f| f.0 == frame::RST_STREAM).map(|f| (f.2, f.3.clone())).collect();
        assert_eq!(
            refused,
            [(2 * streams_max + 1, (ErrorCode::RefusedStream as u32).to_be_bytes().to_vec())]
        );
    }

    #[test]
    fn protocol_errors_close_the_connection_with_their_code() {
        let big = vec![0; FRAME_BYTES_MAX + 1];
        let headers = request_block(PATH);
        let cases: Vec<(Vec<u8>, ErrorCode)> = vec![
            (frame_bytes(frame::DATA, 0, 5, b"x"), ErrorCode::ProtocolError),
            (frame_bytes(frame::HEADERS, flag::END_HEADERS, 2, &headers), ErrorCode::ProtocolError),
            (frame_bytes(frame::DATA, 0, 1, &big), ErrorCode::FrameSizeError),
            (frame_bytes(frame::PING, 0, 0, b"short"), ErrorCode::FrameSizeError),
            (frame_bytes(frame::WINDOW_UPDATE, 0, 0, &0u32.to_be_bytes()), ErrorCode::ProtocolError),
            (
                frame_bytes(frame::WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes()),
                ErrorCode::FlowControlError,
            ),
            (frame_bytes(frame::SETTINGS, 0, 0, &[0, 4, 0x80, 0, 0, 0]), ErrorCode::FlowControlError),
            (frame_bytes(frame::SETTINGS, 0, 0, &[0, 5, 0, 0, 0, 1]), ErrorCode::ProtocolError),
            (frame_bytes(frame::PUSH_PROMISE, 0, 1, &[0; 4]), ErrorCode::ProtocolError),
            (frame_bytes(frame::CONTINUATION, flag::END_HEADERS, 1, &headers), ErrorCode::ProtocolError),
            (
                frame_bytes(frame::HEADERS, flag::END_HEADERS, 1, &[0xff, 0xff, 0xff]),
                ErrorCode::CompressionError,
            ),
            (
                frame_bytes(frame::HEADERS, flag::PADDED | flag::END_HEADERS, 1, &[9, 1]),
                ErrorCode::ProtocolError,
            ),
        ];
        for (input, code) in cases {
            let mut connection = connected(&[]);
            let error = connection.receive(&input, 100).expect_err("an error");
            assert_eq!(error.code, code, "{error}");
        }
        // A header block that never ends.
        let mut connection = connected(&[]);
        let mut input = frame_bytes(frame::HEADERS, 0, 1, &headers[..4]);
        for _ in 0..=CONTINUATIONS_MAX {
            input.extend(frame_bytes(frame::CONTINUATION, 0, 1, &[]));
        }
        let error = connection.receive(&input, 100).expect_err("an error");
        assert_eq!(error.code, ErrorCode::EnhanceYourCalm);
        // Not HTTP/2.
        let error = Connection::new().receive(b"GET / HTTP/1.1\r\n", 100).expect_err("an error");
        assert_eq!(error.code, ErrorCode::ProtocolError);
    }

    #[test]
    fn pings_are_answered_and_goaway_lets_the_open_streams_finish() {
        let mut connection = connected(&[]);
        let sent = receive(&mut connection, &frame_bytes(frame::PING, 0, 0, b"12345678")).expect("valid");
        assert_eq!(sent, [(frame::PING, flag::ACK, 0, b"12345678".to_vec())]);
        connection.send_ping(*b"abcdefgh");
        assert!(connection.ping_outstanding());
        let ack = frame_bytes(frame::PING, flag::ACK, 0, b"abcdefgh");
        receive(&mut connection, &ack).expect("valid");
        assert!(!connection.ping_outstanding());

        let mut input = frame_bytes(frame::HEADERS, flag::END_HEADERS, 1, &request_block(PATH));
        input.extend(frame_bytes(frame::DATA, flag::END_STREAM, 1, &grpc_body(b"x")));
        receive(&mut connection, &input).expect("valid");
        connection.go_away(ErrorCode::NoError, "closing");
        assert!(!connection.is_finished(), "stream 1 is still open");
        // A stream opened after GOAWAY is ignored.
        let mut late = frame_bytes(frame::HEADERS, flag::END_HEADERS, 3, &request_block(PATH));
        late.extend(frame_bytes(frame::DATA, flag::END_STREAM, 3, &grpc_body(b"x")));
        let sent = receive(&mut connection, &late).expect("valid");
        assert_eq!(sent.iter().filter(|f| f.0 == frame::GOAWAY).count(), 1);
        assert_eq!(connection.take_calls().iter().map(|c| c.stream).collect::<Vec<_>>(), [1]);
        connection.respond(1, b"y");
        assert!(connection.is_finished());
    }

    #[test]
    fn a_peer_that_lowers_its_table_size_is_told_in_the_next_block_once() {
        let mut connection = connected(&[(0x1, 0)]);
        send_two_calls(&mut connection);
        connection.respond(1, b"a");
        connection.respond(3, b"b");
        let sent = frames(&std::mem::take(connection.output()));
        let blocks: Vec<_> = sent.iter().filter(|f| f.0 == frame::HEADERS).map(|f| f.3.clone()).collect();
        assert_eq!(blocks[0][0], TABLE_SIZE_ZERO, "the first block starts with the size update");
        assert!(blocks[1..].iter().all(|block| block[0] != TABLE_SIZE_ZERO), "and no other");
        // A decoder whose table the peer set to 0 reads every block.
        let mut decoder = Decoder::new(0, HEADER_LIST_BYTES_MAX);
        for block in &blocks {
            decoder.decode(block, |_, _| {}).expect("decodes with a table of 0");
        }
    }

    #[test]
    fn a_header_list_over_the_bound_refuses_its_stream_alone() {
        let mut connection = connected(&[]);
        let mut big = request_block(PATH);
        hpack::encode_literal(&mut big, b"x-metadata", &vec![b'a'; HEADER_LIST_BYTES_MAX]);
        let mut input = Vec::new();
        for chunk in [&big[..FRAME_BYTES_MAX], &big[FRAME_BYTES_MAX..]].iter().enumerate() {
            let (kind, flags) =
                if chunk.0 == 0 { (frame::HEADERS, 0) } else { (frame::CONTINUATION, flag::END_HEADERS) };
            input.extend(frame_bytes(kind, flags, 1, chunk.1));
        }
        input.extend(frame_bytes(frame::DATA, flag::END_STREAM, 1, &grpc_body(b"x")));
        input.extend(frame_bytes(frame::HEADERS, flag::END_HEADERS, 3, &request_block(PATH)));
        input.extend(frame_bytes(frame::DATA, flag::END_STREAM, 3, &grpc_body(b"y")));
        let sent = receive(&mut connection, &input).expect("not a connection error");
        let answer = sent.iter().find(|f| f.0 == frame::HEADERS && f.2 == 1).expect("stream 1 answered");
        assert_eq!(field(&fields(&answer.3), "grpc-status"), Some("8"), "RESOURCE_EXHAUSTED");
        let calls = connection.take_calls();
        assert_eq!(calls.iter().map(|c| (c.stream, c.message())).collect::<Vec<_>>(), [(3, &b"y"[..])]);
    }

    #[test]
    fn a_request_on_a_stream_that_does_not_count_up_is_refused_not_left_hanging() {
        let mut connection = connected(&[]);
        let mut input = frame_bytes(frame::HEADERS, flag::END_HEADERS, 5, &request_block(PATH));
        input.extend(frame_bytes(frame::HEADERS, flag::END_HEADERS, 3, &request_block(PATH)));
        let sent = receive(&mut connection, &input).expect("valid");
        let resets: Vec<_> =
            sent.iter().filter(|f| f.0 == frame::RST_STREAM).map(|f| (f.2, f.3.clone())).collect();
        assert_eq!(resets, [(3, (ErrorCode::StreamClosed as u32).to_be_bytes().to_vec())]);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..2_000 {
            let mut connection = connected(&[]);
            let mut input = Vec::new();
            // Frames of random types, flags and lengths on small stream numbers, random bodies.
            for _ in 0..(next() % 8) {
                let length = (next() % 40) as usize;
                let payload: Vec<u8> = (0..length).map(|_| next() as u8).collect();
                let kind = (next() % 11) as u8;
                input.extend(frame_bytes(kind, next() as u8, (next() % 6) as u32, &payload));
            }
            let _ = connection.receive(&input, 100);
            connection.respond(1, b"x");
            connection.respond_status(3, tonic::Code::Internal, "\u{e9}%\n");
        }
    }
}
