//! One HTTP/2 connection of the RLS server, on the `h2` crate.
//!
//! One task per connection drives h2's connection and every call it carries: a call reads its
//! request, is decided as soon as its last byte is read (in approximate mode, on the owner's own
//! keys, without waiting: the usual case) and hands its answer to h2, which writes the answers of
//! a round together when the task next drives the connection. No task per call, no timer per call
//! that needs no wait.
//!
//! # h2's defences, set on purpose
//!
//! | setting | value | why |
//! |---|---|---|
//! | `max_concurrent_streams` | [`STREAMS_PER_CONNECTION_MAX`] | Envoy multiplexes its calls over a few connections; the daemon-wide bound is `limits.http_in_flight_max` |
//! | `max_header_list_size` | [`HEADER_LIST_BYTES_MAX`] | a gRPC request head is a few hundred bytes; also bounds what h2 buffers to decode a header block (CONTINUATION floods, HPACK bombs) |
//! | `header_table_size` | 4 096 (HTTP/2's default) | HPACK's dynamic table for what Envoy repeats |
//! | `initial_window_size` | [`STREAM_WINDOW_BYTES`] | room for the largest request ([`MESSAGE_BYTES_MAX`] and its prefix) at once |
//! | `initial_connection_window_size` | [`CONNECTION_WINDOW_BYTES`] | a few hundred requests in flight before the first is read |
//! | `max_frame_size` | 16 384 (the default) | |
//! | `max_send_buffer_size` | [`MESSAGE_BYTES_MAX`] + 5 | an answer is handed to h2 only as the client's window takes it (see below) |
//! | `max_pending_accept_reset_streams` | [`PENDING_ACCEPT_RESETS_MAX`] | streams reset before the server took them (rapid reset): GOAWAY `ENHANCE_YOUR_CALM` past it |
//! | `max_local_error_reset_streams` | [`LOCAL_ERROR_RESETS_MAX`] | streams the server had to reset for the client's protocol errors: GOAWAY `ENHANCE_YOUR_CALM` past it |
//! | `max_concurrent_reset_streams`, `reset_stream_duration` | [`RESET_STREAMS_KEPT_MAX`], [`RESET_STREAM_KEPT`] | what h2 remembers of streams it reset, to ignore their late frames |
//! | `data_frame_budget` | h2's default (half the connection window) | floods of small DATA frames |
//!
//! A client that resets its streams after the server took them (the rapid reset that h2's
//! pending-accept budget does not see, because the server takes streams at once) is counted
//! here: past [`PEER_RESETS_MAX`] resets, and more resets than answers, the connection is closed
//! with GOAWAY `ENHANCE_YOUR_CALM`. An Envoy that cancels calls on its timeout gets most of its
//! answers and is never cut off.
//!
//! # Answers that are not taken
//!
//! An answer goes to h2 only as far as the client's flow-control window takes it, so h2 never
//! buffers more than it can send. An answer that has to wait for the client's window is held,
//! with its stream's state: at most one per stream of its connection ([`STREAMS_PER_CONNECTION_MAX`],
//! so a client that reads is never cut off for a round of answers beyond its window), and
//! [`ANSWERS_HELD_BYTES_MAX`] daemon-wide (each answer's bytes and about 2 KiB of state). A
//! connection that would pass the daemon's bound is a slow reader: GOAWAY `ENHANCE_YOUR_CALM`,
//! and it closes (the answers it held are dropped; their hits were counted, as for a client that
//! went away). So clients that never open their windows cannot grow the daemon's memory with the
//! number of their connections. An answer
//! still waiting after the write timeout closes its connection too, as a write the socket does
//! not take does ([`crate::listener`]). A request must arrive whole within the call timeout
//! (`DEADLINE_EXCEEDED` after it).
//!
//! # Keepalive
//!
//! h2 PINGs the client every [`HTTP2_KEEPALIVE_INTERVAL`]; without its answer within
//! [`HTTP2_KEEPALIVE_TIMEOUT`] the connection is closed (an Envoy that went away without
//! closing its connections stops holding a connection slot).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use prost::Message as _;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, watch};
use tonic::Status;
use tracing::debug;

use super::{MESSAGE_BYTES_MAX, RlsService, STREAMS_PER_CONNECTION_MAX};

/// The path of the one method served.
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The largest request head (h2's `max_header_list_size`: names, values and 32 bytes per field).
pub const HEADER_LIST_BYTES_MAX: u32 = 16 * 1024;

/// Each stream's receive window: the largest request message and its 5-byte prefix fit at once.
pub const STREAM_WINDOW_BYTES: u32 = 96 * 1024;

/// The connection's receive window.
pub const CONNECTION_WINDOW_BYTES: u32 = 256 * 1024;

/// Streams reset by the client before the server took them, at once (h2's default).
pub const PENDING_ACCEPT_RESETS_MAX: usize = 20;

/// Streams the server reset for the client's protocol errors, over the connection's life (h2's
/// default).
pub const LOCAL_ERROR_RESETS_MAX: usize = 1024;

/// Streams reset by the server that h2 remembers at once, and for how long (h2's defaults).
pub const RESET_STREAMS_KEPT_MAX: usize = 50;
/// See [`RESET_STREAMS_KEPT_MAX`].
pub const RESET_STREAM_KEPT: Duration = Duration::from_secs(1);

/// Calls the client reset after the server took them, before the connection is closed as a
/// rapid-reset abuser (when it also reset more calls than it was answered).
pub const PEER_RESETS_MAX: u64 = 1024;

/// Daemon-wide, the bytes of answers waiting for their clients' flow-control windows, with
/// their state (see the module documentation): about 4 000 answers.
pub const ANSWERS_HELD_BYTES_MAX: usize = 8 * 1024 * 1024;

/// What a held answer counts against [`ANSWERS_HELD_BYTES_MAX`] beyond its own bytes: its open
/// stream's state in h2 and its call's here, measured (about 1.5 KiB) and rounded up.
const HELD_ANSWER_STATE_BYTES: usize = 2048;

/// How often the server pings a connection, and how long it waits for the answer
/// ([`HTTP2_KEEPALIVE_TIMEOUT`]) before closing it.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// See [`HTTP2_KEEPALIVE_INTERVAL`].
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest `grpc-message` sent: error texts may quote a client's input.
const GRPC_MESSAGE_BYTES_MAX: usize = 1024;

/// What every connection of one server shares.
#[derive(Clone, Debug)]
pub(super) struct Shared {
    /// The service that decides calls.
    pub service: RlsService,
    /// The daemon-wide budget of answers held for clients' windows, in bytes.
    pub held: Arc<Semaphore>,
    /// How long a request may take to arrive whole.
    pub request_timeout: Duration,
    /// How long an answer may wait for the client's window.
    pub write_timeout: Duration,
}

impl Shared {
    /// What the connections of a server over `service` share: requests must arrive within the
    /// service's call timeout, answers be taken within `write_timeout`.
    pub fn new(service: RlsService, write_timeout: Duration) -> Shared {
        Shared {
            request_timeout: service.call_timeout,
            service,
            held: Arc::new(Semaphore::new(ANSWERS_HELD_BYTES_MAX)),
            write_timeout,
        }
    }
}

/// How a call ended, as far as its connection cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CallEnd {
    /// Answered (or refused with a status).
    Answered,
    /// The client reset the stream before its answer.
    ResetByPeer,
    /// Its answer waited for the client's window past the write timeout.
    Stalled,
    /// Its answer would wait for the client's window beyond what this connection
    /// the daemon ([`ANSWERS_HELD_BYTES_MAX`]) may hold.
    TooManyHeld,
    /// Its stream failed otherwise (the connection is going away).
    Failed,
}

/// The h2 server settings (see the module documentation).
fn builder() -> h2::server::Builder {
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(STREAMS_PER_CONNECTION_MAX)
        .max_header_list_size(HEADER_LIST_BYTES_MAX)
        .header_table_size(4096)
        .initial_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(16_384)
        .max_send_buffer_size(MESSAGE_BYTES_MAX + 5)
        .max_pending_accept_reset_streams(PENDING_ACCEPT_RESETS_MAX)
        .max_local_error_reset_streams(Some(LOCAL_ERROR_RESETS_MAX))
        .max_concurrent_reset_streams(RESET_STREAMS_KEPT_MAX)
        .reset_stream_duration(RESET_STREAM_KEPT);
    builder
}

/// Serves one HTTP/2 connection until the client closes it, a protocol error (h2 sends GOAWAY
/// with its code), an unanswered keepalive PING, an answer stalled past the write timeout, or the
/// server closes (GOAWAY, then the calls in progress are answered).
pub(super) async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    shared: Shared,
    stream: S,
    mut closing: watch::Receiver<bool>,
) {
    let mut connection = match builder().handshake::<_, Bytes>(stream).await {
        Ok(connection) => connection,
        Err(error) => return debug!(%error, "gRPC connection closed during the HTTP/2 handshake"),
    };
    let mut ping_pong = connection.ping_pong();
    let keepalive = tokio::time::sleep(HTTP2_KEEPALIVE_INTERVAL);
    tokio::pin!(keepalive);
    let mut ping_sent = false;
    let mut calls = FuturesUnordered::new();
    let mut tally = Tally::default();
    let (mut calm_sent, mut shutting_down) = (false, false);
    // Made once, not once per wake: a fresh `wait_for` would take the channel's lock each time.
    // A closed sender is a server gone: closing too.
    let mut server_closing = std::pin::pin!(closing.wait_for(|closing| *closing));
    loop {
        tokio::select! {
            turn = std::future::poll_fn(|cx| {
                turn(cx, &mut connection, &mut calls, &mut tally, |request, respond| {
                    call(&shared, request, respond)
                })
            }) => match turn {
                Turn::Closed(None) => return,
                Turn::Closed(Some(error)) => return debug!(%error, "gRPC connection closed"),
                Turn::Stalled => {
                    return debug!("gRPC connection closed: an answer not taken within the write timeout (a slow reader)");
                }
                Turn::Calm(_) if calm_sent => {}
                Turn::Calm(why) => {
                    debug!(why, "gRPC connection closed with ENHANCE_YOUR_CALM");
                    connection.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
                    calm_sent = true;
                }
            },
            pong = std::future::poll_fn(|cx| match ping_pong.as_mut() {
                Some(pings) => pings.poll_pong(cx),
                None => Poll::Pending,
            }), if ping_sent => {
                if pong.is_err() {
                    return;
                }
                ping_sent = false;
                keepalive.as_mut().reset(tokio::time::Instant::now() + HTTP2_KEEPALIVE_INTERVAL);
            }
            () = &mut keepalive => {
                if ping_sent {
                    return debug!("gRPC connection closed: no answer to the keepalive PING");
                }
                if let Some(pings) = ping_pong.as_mut()
                    && pings.send_ping(h2::Ping::opaque()).is_ok()
                {
                    ping_sent = true;
                }
                keepalive.as_mut().reset(tokio::time::Instant::now() + HTTP2_KEEPALIVE_TIMEOUT);
            }
            _ = &mut server_closing, if !shutting_down => {
                connection.graceful_shutdown();
                shutting_down = true;
            }
        }
    }
}

/// What a connection's calls came to so far.
#[derive(Debug, Default)]
struct Tally {
    answered: u64,
    peer_resets: u64,
}

/// Why [`turn`] stopped.
enum Turn {
    /// The connection is over (with h2's error, if any: h2 sent GOAWAY for it).
    Closed(Option<h2::Error>),
    /// An answer waited for its client's window past the write timeout.
    Stalled,
    /// The client is abusive (the reason): the connection is to be closed.
    Calm(&'static str),
}

/// One turn of a connection: every request h2 has read is taken and decided, every call that
/// can finish does, and the answers go out together when h2 is driven again (one write for a
/// round's answers, not one per answer); until nothing moves (`Pending`) or the connection must
/// end.
fn turn<S: AsyncRead + AsyncWrite + Unpin, F: Future<Output = CallEnd>>(
    cx: &mut Context<'_>,
    connection: &mut h2::server::Connection<S, Bytes>,
    calls: &mut FuturesUnordered<F>,
    tally: &mut Tally,
    mut call: impl FnMut(http::Request<RecvStream>, SendResponse<Bytes>) -> F,
) -> Poll<Turn> {
    loop {
        let mut moved = false;
        loop {
            match connection.poll_accept(cx) {
                Poll::Ready(Some(Ok((request, respond)))) => calls.push(call(request, respond)),
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Turn::Closed(Some(error))),
                Poll::Ready(None) => return Poll::Ready(Turn::Closed(None)),
                Poll::Pending => break,
            }
        }
        while let Poll::Ready(Some(end)) = calls.poll_next_unpin(cx) {
            moved = true;
            match end {
                CallEnd::Answered => tally.answered += 1,
                CallEnd::ResetByPeer => tally.peer_resets += 1,
                CallEnd::Failed => {}
                CallEnd::Stalled => return Poll::Ready(Turn::Stalled),
                CallEnd::TooManyHeld => {
                    return Poll::Ready(Turn::Calm("too many answers wait for its window"));
                }
            }
            if tally.peer_resets > PEER_RESETS_MAX && tally.peer_resets > tally.answered {
                return Poll::Ready(Turn::Calm("the client resets the calls it makes"));
            }
        }
        // Answers were handed to h2: driving it again writes them (and reads what came).
        if !moved {
            return Poll::Pending;
        }
    }
}

/// One call: its request read, decided and answered (see the module documentation).
async fn call(
    shared: &Shared,
    request: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) -> CallEnd {
    let (head, mut body) = request.into_parts();
    if let Err(end) = check_head(&head, &mut respond) {
        return end;
    }
    // Not kept while the call waits: every byte of a call's state counts for each open stream.
    drop(head);
    let message = match read_in_time(&mut body, shared.request_timeout).await {
        Ok(message) => message,
        Err(Refusal::Stream(error)) => return ended_by(&error),
        Err(Refusal::Status(status)) => return answer_status(&mut respond, &status),
    };
    // Boxed: a decision's state is large (kilobytes) and lives only while it decides; unboxed it
    // would size every call, also the calls that wait for their request or their client's window.
    match Box::pin(decide(&shared.service, message)).await {
        Ok(data) => answer(shared, respond, data).await,
        Err(status) => answer_status(&mut respond, &status),
    }
}

/// Whether a request's head is the gRPC call served; if not, it is answered (405, 415,
/// `UNIMPLEMENTED`) and how it ended is the error.
fn check_head(head: &http::request::Parts, respond: &mut SendResponse<Bytes>) -> Result<(), CallEnd> {
    if head.method != Method::POST {
        return Err(answer_http(respond, StatusCode::METHOD_NOT_ALLOWED));
    }
    if !head.headers.get(http::header::CONTENT_TYPE).is_some_and(is_grpc_content_type) {
        return Err(answer_http(respond, StatusCode::UNSUPPORTED_MEDIA_TYPE));
    }
    if head.uri.path() != PATH {
        let status = Status::unimplemented("unknown method: only ShouldRateLimit is served");
        return Err(answer_status(respond, &status));
    }
    Ok(())
}

/// The decisions of a request's `message`: the answer's gRPC message (prefix and response), or
/// the status that refuses the call.
async fn decide(service: &RlsService, message: Bytes) -> Result<Bytes, Status> {
    let request = RateLimitRequest::decode(message)
        .map_err(|error| Status::invalid_argument(format!("not a RateLimitRequest: {error}")))?;
    match service.should_rate_limit_request(&request).await {
        Ok(response) => encode(&response),
        Err(status) => {
            debug!(domain = %request.domain, code = ?status.code(), message = status.message(), "RLS call refused");
            Err(status)
        }
    }
}

/// `response` as a gRPC message: its 5-byte prefix and its encoding.
fn encode(response: &RateLimitResponse) -> Result<Bytes, Status> {
    let length = response.encoded_len();
    if length > MESSAGE_BYTES_MAX {
        return Err(Status::internal(format!("an answer of {length} bytes, above {MESSAGE_BYTES_MAX}")));
    }
    let mut data = BytesMut::with_capacity(5 + length);
    data.put_u8(0);
    data.put_u32(length as u32);
    // The buffer holds the encoded length: encoding cannot run out of room.
    response.encode(&mut data).map_err(|error| Status::internal(error.to_string()))?;
    Ok(data.freeze())
}

/// Why a request's message cannot be decided.
enum Refusal {
    /// The stream failed (reset by the client, the connection going away).
    Stream(h2::Error),
    /// The message is not one a gRPC server takes: answered with this status.
    Status(Status),
}

/// The request's message, within `timeout` (`DEADLINE_EXCEEDED` after it): a stream whose
/// request never ends must not hold its state for good. A request that came whole with its head
/// (the usual case) is read without a timer.
async fn read_in_time(body: &mut RecvStream, timeout: Duration) -> Result<Bytes, Refusal> {
    let mut read = std::pin::pin!(read_message(body));
    if let Poll::Ready(read) = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await {
        return read;
    }
    tokio::time::timeout(timeout, read).await.unwrap_or_else(|_| {
        let message = format!("the request did not arrive whole within {timeout:?}");
        Err(Refusal::Status(Status::deadline_exceeded(message)))
    })
}

/// The request's one gRPC message (behind its 5-byte prefix), read whole; the flow-control
/// window it took is given back as it is read.
async fn read_message(body: &mut RecvStream) -> Result<Bytes, Refusal> {
    let mut received = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(Refusal::Stream)?;
        // Given back whatever becomes of the bytes: the stream never holds the connection's window.
        let _ = body.flow_control().release_capacity(chunk.len());
        received.extend_from_slice(&chunk);
        if let Some(length) = message_length(&received)?
            && received.len() > 5 + length
        {
            return Err(Refusal::Status(Status::invalid_argument("more than one gRPC message")));
        }
    }
    match message_length(&received)? {
        Some(length) if received.len() == 5 + length => Ok(received.freeze().split_off(5)),
        Some(_) => Err(Refusal::Status(Status::invalid_argument("not one length-prefixed gRPC message"))),
        None if received.is_empty() => Err(Refusal::Status(Status::invalid_argument("no request message"))),
        None => Err(Refusal::Status(Status::invalid_argument("not one length-prefixed gRPC message"))),
    }
}

/// The length of the message a gRPC prefix announces, once its 5 bytes are there; a compressed
/// message or one above [`MESSAGE_BYTES_MAX`] is refused as soon as its prefix says so
/// (`RESOURCE_EXHAUSTED`, as gRPC's own servers answer a message above their receive limit).
fn message_length(received: &[u8]) -> Result<Option<usize>, Refusal> {
    let Some(&[compressed, a, b, c, d]) = received.first_chunk::<5>() else { return Ok(None) };
    if compressed != 0 {
        let message = "a compressed message: only identity is accepted";
        return Err(Refusal::Status(Status::unimplemented(message)));
    }
    let length = u32::from_be_bytes([a, b, c, d]) as usize;
    if length > MESSAGE_BYTES_MAX {
        let message = format!("a message of {length} bytes, above the limit of {MESSAGE_BYTES_MAX}");
        return Err(Refusal::Status(Status::resource_exhausted(message)));
    }
    Ok(Some(length))
}

/// `application/grpc` or `application/grpc+proto`, each alone or with `;parameters`: gRPC over
/// HTTP/2 in protobuf, the one message format served (`+json` and the others are 415).
fn is_grpc_content_type(value: &HeaderValue) -> bool {
    let rest = value.as_bytes().strip_prefix(b"application/grpc");
    let rest = rest.map(|rest| rest.strip_prefix(b"+proto").unwrap_or(rest));
    rest.is_some_and(|rest| rest.is_empty() || rest.starts_with(b";"))
}

/// The head of a gRPC answer: `:status 200`, `content-type: application/grpc`.
fn grpc_head() -> http::Response<()> {
    let mut head = http::Response::new(());
    head.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    head
}

/// Answers with `data` (a gRPC message), as far as the client's window lets it through (see the module
/// documentation), then `grpc-status: 0`.
async fn answer(shared: &Shared, mut respond: SendResponse<Bytes>, mut data: Bytes) -> CallEnd {
    let mut send = match respond.send_response(grpc_head(), false) {
        Ok(send) => send,
        Err(error) => return ended_by(&error),
    };
    send.reserve_capacity(data.len());
    if send.capacity() < data.len() {
        // The client's window is short: the rest waits for it, held against the daemon's bound.
        // A client past it is a slow reader: its connection is closed.
        let charge = (data.len() + HELD_ANSWER_STATE_BYTES).min(ANSWERS_HELD_BYTES_MAX) as u32;
        let held = shared.held.try_acquire_many(charge);
        if held.is_err() {
            send.send_reset(Reason::ENHANCE_YOUR_CALM);
            return CallEnd::TooManyHeld;
        }
        match tokio::time::timeout(shared.write_timeout, send_as_window_allows(&mut send, &mut data)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return ended_by(&error),
            Err(_) => return CallEnd::Stalled,
        }
    }
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let sent = send.send_data(data, false).and_then(|()| send.send_trailers(trailers));
    match sent {
        Ok(()) => CallEnd::Answered,
        Err(error) => ended_by(&error),
    }
}

/// Hands `data` to h2 as the client's window takes it, until what is left fits the capacity
/// the stream has now.
async fn send_as_window_allows(send: &mut SendStream<Bytes>, data: &mut Bytes) -> Result<(), h2::Error> {
    while send.capacity() < data.len() {
        let capacity = send.capacity();
        if capacity > 0 {
            send.send_data(data.split_to(capacity), false)?;
        }
        send.reserve_capacity(data.len());
        match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(error),
            // The stream closed meanwhile: what is left cannot be sent.
            None => return Err(h2::Error::from(Reason::CANCEL)),
        }
    }
    Ok(())
}

/// Answers with a gRPC status and no message (a trailers-only answer).
fn answer_status(respond: &mut SendResponse<Bytes>, status: &Status) -> CallEnd {
    let mut head = grpc_head();
    let status = match status.message().len() > GRPC_MESSAGE_BYTES_MAX {
        true => Status::new(status.code(), truncated(status.message(), GRPC_MESSAGE_BYTES_MAX)),
        false => status.clone(),
    };
    if status.add_header(head.headers_mut()).is_err() {
        // A message that is no header value even percent-encoded: the code alone.
        head.headers_mut().insert("grpc-status", HeaderValue::from(status.code() as i32));
    }
    match respond.send_response(head, true) {
        Ok(_) => CallEnd::Answered,
        Err(error) => ended_by(&error),
    }
}

/// An answer that is not gRPC's (405, 415): the status alone, ending the stream.
fn answer_http(respond: &mut SendResponse<Bytes>, status: StatusCode) -> CallEnd {
    let mut head = http::Response::new(());
    *head.status_mut() = status;
    match respond.send_response(head, true) {
        Ok(_) => CallEnd::Answered,
        Err(error) => ended_by(&error),
    }
}

/// How a call whose stream failed with `error` ended.
fn ended_by(error: &h2::Error) -> CallEnd {
    match error.is_reset() && error.is_remote() {
        true => CallEnd::ResetByPeer,
        false => CallEnd::Failed,
    }
}

/// `text` cut to at most `bytes_max` bytes, on a character boundary.
fn truncated(text: &str, bytes_max: usize) -> String {
    let mut end = bytes_max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn length(received: &[u8]) -> Result<Option<usize>, tonic::Code> {
        message_length(received).map_err(|refusal| match refusal {
            Refusal::Status(status) => status.code(),
            Refusal::Stream(_) => tonic::Code::Unknown,
        })
    }

    #[test]
    fn a_prefix_is_read_once_whole_and_refused_as_soon_as_it_says_too_much() {
        assert_eq!(length(&[0, 0, 0]), Ok(None));
        assert_eq!(length(&[0, 0, 0, 1, 0]), Ok(Some(256)));
        assert_eq!(length(&[0, 0, 1, 0, 0, 9]), Ok(Some(MESSAGE_BYTES_MAX)));
        // 4 GiB less one, and the first length past the limit.
        assert_eq!(length(&[0, 0xff, 0xff, 0xff, 0xff]), Err(tonic::Code::ResourceExhausted));
        assert_eq!(length(&[0, 0, 1, 0, 1]), Err(tonic::Code::ResourceExhausted));
        assert_eq!(length(&[1, 0, 0, 0, 1]), Err(tonic::Code::Unimplemented));
    }

    #[test]
    fn grpc_content_types_in_protobuf_with_or_without_parameters_are_grpc() {
        for grpc in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc;charset=utf-8",
            "application/grpc+proto;charset=utf-8",
        ] {
            assert!(is_grpc_content_type(&HeaderValue::from_static(grpc)), "{grpc}");
        }
        for other in ["application/grpcx", "application/json", "text/plain", "application/grpc+json"] {
            assert!(!is_grpc_content_type(&HeaderValue::from_static(other)), "{other}");
        }
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        assert_eq!(truncated("héllo", 2), "h");
        assert_eq!(truncated("héllo", 3), "hé");
        assert_eq!(truncated("abc", 10), "abc");
    }
}
