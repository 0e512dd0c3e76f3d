//! The HTTP/1.1 front of every API connection.
//!
//! `POST /v1/check`, the route that carries the load, is recognised
//! ([`ratemeshd_wire::http::parse`], over `httparse`), decided and answered here, from and into
//! the connection's own reused buffers: no per-request allocation but the decision's, headers
//! written as bytes ([`ratemesh::headers::write_header_lines`]), pipelined requests answered with
//! one write. The profile of the daemon under `wrk` had hyper and axum's routing, middleware and
//! response building at a quarter of its CPU.
//!
//! Any other request — another route, a body not announced by one `Content-Length`, not exactly
//! one `Host` (the router then answers 400, as RFC 9112 requires of HTTP/1.1),
//! `Transfer-Encoding`, `Expect`, a `Connection` other than `keep-alive` or `close`, HTTP/1.0, a
//! head of more than [`HEAD_BYTES_MAX`](ratemeshd_wire::http::HEAD_BYTES_MAX) or
//! [`HEADERS_MAX`](ratemeshd_wire::http::HEADERS_MAX) headers, a body that does not parse or
//! validate — hands the connection, with every byte not yet answered, to hyper's HTTP/1 server
//! and the axum router for the rest of its life ([`Front::hand_off`]). So every error answer, every
//! other route and every corner of HTTP/1.1 is theirs, written once; what is answered here is a
//! valid check, and the bytes are the router's for the same check (`tests/http_api.rs` compares them).
//!
//! The bounds are the router's: the same in-flight permits, request deadline and metrics, the
//! head timeout from the moment a request is waited for (also how long a kept-alive connection
//! may stay idle), the body timeout from the moment its head arrived (then 408, as the router
//! answers, and the connection closes).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::sync::watch;
use tracing::debug;

use ratemeshd_wire::http::{Parsed, parse};

use super::body::{CheckResponse, parse_check};
use super::decide::decide;
use super::{Api, ApiError, InFlight, JSON, Timeouts, within};
use crate::check::Answer;
use crate::daemon::Daemon;
use crate::listener::LimitedStream;

/// Bytes asked of the socket per read.
const READ_BYTES: usize = 8 * 1024;

/// Pipelined requests answered before their answers are written and other connections run.
const REQUESTS_PER_ROUND_MAX: usize = 64;

/// Answer bytes written at once, mid-round.
const OUTPUT_FLUSH_BYTES: usize = 64 * 1024;

/// The API's connections: the router, hyper's server for what the front hands off, and what the
/// front's own answers need.
#[derive(Clone)]
pub(crate) struct Front {
    api: Arc<Api>,
    router: Router,
    hyper: auto::Builder<TokioExecutor>,
}

impl Front {
    /// The front of the API over `daemon` with `timeouts`.
    pub(crate) fn new(daemon: Arc<Daemon>, timeouts: Timeouts) -> Front {
        let router =
            super::router_with(Arc::clone(&daemon), timeouts).layer(axum::middleware::from_fn(require_host));
        let mut hyper = auto::Builder::new(TokioExecutor::new()).http1_only();
        hyper.http1().timer(TokioTimer::new()).header_read_timeout(timeouts.header_read).keep_alive(true);
        Front { api: Arc::new(Api { daemon, timeouts }), router, hyper }
    }

    /// Serves one connection until it closes, a deadline passes, or `closing` turns true (then
    /// the requests in progress finish first).
    pub(crate) async fn serve(self, mut stream: LimitedStream, mut closing: watch::Receiver<bool>) {
        let mut connection = Connection { input: Vec::new(), output: Vec::new() };
        match connection.run(&self.api, &mut stream, &mut closing).await {
            Ok(Ended::Closed) => {}
            Ok(Ended::HandOff) => {
                let rest = std::mem::take(&mut connection.input);
                self.hand_off(Rewound { prefix: rest, read: 0, stream }, closing).await;
            }
            Err(error) => debug!(%error, "HTTP connection closed"),
        }
    }

    /// Serves the rest of a connection with hyper and the router: `io` starts with the bytes the
    /// front read and did not answer.
    async fn hand_off(self, io: Rewound, mut closing: watch::Receiver<bool>) {
        let service = TowerToHyperService::new(self.router);
        let connection = self.hyper.serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let closing = async move {
            // An error means the server is gone: closing too.
            let _ = closing.wait_for(|closing| *closing).await;
        };
        let served = tokio::select! {
            served = connection.as_mut() => served,
            () = closing => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        // A client that closed early, a header timeout, a malformed request: the connection's
        // own business, not the server's.
        if let Err(error) = served {
            debug!(%error, "HTTP connection ended with an error");
        }
    }
}

/// RFC 9112, section 3.2: an HTTP/1.1 request without exactly one `Host` field is answered 400
/// (an HTTP/1.0 request may omit it; HTTP/2 carries `:authority` instead). A layer of the
/// connections' router only, so that the router serves in-process requests built without one.
async fn require_host(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let hosts = request.headers().get_all(axum::http::header::HOST).iter().count();
    if request.version() == axum::http::Version::HTTP_11 && hosts != 1 {
        let message = format!("{hosts} Host fields; an HTTP/1.1 request has exactly one");
        return ApiError::bad_request("host", message).into_response();
    }
    next.run(request).await
}

/// How the front's part of a connection ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// Closed: by the client, a deadline, or the server's shutdown.
    Closed,
    /// A request the front does not answer begins at the start of the input.
    HandOff,
}

/// A connection's reused buffers.
struct Connection {
    /// Bytes read and not yet answered.
    input: Vec<u8>,
    /// Answers not yet written.
    output: Vec<u8>,
}

impl Connection {
    async fn run(
        &mut self,
        api: &Api,
        stream: &mut LimitedStream,
        closing: &mut watch::Receiver<bool>,
    ) -> std::io::Result<Ended> {
        let timeouts = api.timeouts;
        let deadline = tokio::time::sleep(timeouts.header_read);
        tokio::pin!(deadline);
        // Whether the deadline is a body's (since its head arrived) rather than a head's.
        let mut body_deadline = false;
        // Each round answers the whole requests buffered, writes the answers, then reads.
        loop {
            let (answered, next) = self.answer_buffered(api, stream).await?;
            if !self.output.is_empty() {
                stream.write_all(&self.output).await?;
                self.output.clear();
            }
            let head_whole = match next {
                Parsed::Other => return Ok(Ended::HandOff),
                Parsed::Http2 => {
                    stream.write_all(&http2_refusal()).await?;
                    return Ok(Ended::Closed);
                }
                Parsed::Check { close: true, .. } => return Ok(Ended::Closed),
                Parsed::Check { close: false, .. } => {
                    // A full round: more are buffered; answer them after other tasks ran.
                    tokio::task::yield_now().await;
                    continue;
                }
                Parsed::Incomplete { head_whole } => head_whole,
            };
            if answered > 0 {
                body_deadline = false;
                deadline.as_mut().reset(tokio::time::Instant::now() + timeouts.header_read);
            }
            if head_whole && !body_deadline {
                body_deadline = true;
                deadline.as_mut().reset(tokio::time::Instant::now() + timeouts.body_read);
            }
            self.input.reserve(READ_BYTES);
            let read = tokio::select! {
                read = stream.read_buf(&mut self.input) => Some(read?),
                () = &mut deadline => None,
                // A closed sender is a server gone: closing too.
                _ = closing.wait_for(|closing| *closing) => return Ok(Ended::Closed),
            };
            match read {
                None => return self.timed_out(stream, body_deadline, timeouts).await,
                Some(0) => return Ok(Ended::Closed),
                Some(_) => {}
            }
        }
    }

    /// A deadline passed: a body that did not arrive is answered 408 (the router's answer);
    /// a head that did not, or an idle connection, is closed without one (as hyper does).
    async fn timed_out(
        &mut self,
        stream: &mut LimitedStream,
        body_deadline: bool,
        timeouts: Timeouts,
    ) -> std::io::Result<Ended> {
        if body_deadline {
            write_error(&mut self.output, &ApiError::body_timeout(timeouts.body_read), true);
            stream.write_all(&self.output).await?;
        }
        Ok(Ended::Closed)
    }

    /// Answers the whole checks at the start of the input (at most [`REQUESTS_PER_ROUND_MAX`],
    /// and none after one that asked to close), drops them from it, and returns how many and
    /// what the input begins with now (the check that asked to close, answered, if one did).
    async fn answer_buffered(
        &mut self,
        api: &Api,
        stream: &mut LimitedStream,
    ) -> std::io::Result<(usize, Parsed)> {
        // One snapshot of the configuration for the round.
        let (config, policies) = api.daemon.current();
        let mut start = 0;
        let mut answered = 0;
        let next = loop {
            let parsed = parse(&self.input[start..], config.limits.http_body_bytes_max);
            let Parsed::Check { body, close } = parsed else { break parsed };
            if answered == REQUESTS_PER_ROUND_MAX {
                break Parsed::Check { body, close };
            }
            let body = start + body.start..start + body.end;
            let Ok(check) = parse_check(&self.input[body.clone()], &policies, &config.limits) else {
                // The router says what is wrong with it.
                break Parsed::Other;
            };
            answer(api, &check, close, &mut self.output).await;
            start = body.end;
            answered += 1;
            if close {
                break Parsed::Check { body, close };
            }
            if self.output.len() >= OUTPUT_FLUSH_BYTES {
                stream.write_all(&self.output).await?;
                self.output.clear();
            }
        };
        self.input.drain(..start);
        Ok((answered, next))
    }
}

/// The answer to an HTTP/2 connection preface, where hyper would close without a word: the
/// server preface (an empty SETTINGS frame, RFC 9113, 3.4) and a GOAWAY with `HTTP_1_1_REQUIRED`
/// (0xd) and the reason, so that an HTTP/2 client says why (curl: "HTTP_1_1_REQUIRED").
fn http2_refusal() -> Vec<u8> {
    const REASON: &[u8] = b"this port serves HTTP/1.1; Envoy RLS (gRPC) has its own listener";
    const SETTINGS: u8 = 0x4;
    const GOAWAY: u8 = 0x7;
    const HTTP_1_1_REQUIRED: u32 = 0xd;
    let frame_head = |len: usize, kind: u8| {
        let len = u32::try_from(len).unwrap_or(0).to_be_bytes();
        // Length (24 bits), type, flags 0, stream 0.
        [len[1], len[2], len[3], kind, 0, 0, 0, 0, 0]
    };
    let mut bytes = frame_head(0, SETTINGS).to_vec();
    bytes.extend(frame_head(8 + REASON.len(), GOAWAY));
    bytes.extend(0u32.to_be_bytes()); // The last stream processed: none.
    bytes.extend(HTTP_1_1_REQUIRED.to_be_bytes());
    bytes.extend(REASON);
    bytes
}

/// Decides `check` under the router's bounds (an in-flight permit or 503 at once, the request
/// deadline, the request metrics) and writes the answer to `output` (with `connection: close`
/// if `close`).
async fn answer(api: &Api, check: &crate::check::ValidCheck, close: bool, output: &mut Vec<u8>) {
    let started = Instant::now();
    let daemon = &api.daemon;
    let status = match daemon.http_permits().try_acquire() {
        Err(_) => {
            daemon.metrics().record_shed("http", "check");
            write_error(output, &ApiError::overloaded(), close)
        }
        Ok(_permit) => {
            let gauge = daemon.metrics().http_in_flight();
            gauge.inc();
            let _in_flight = InFlight(gauge);
            match within(api.timeouts.request, decide(api, check)).await {
                Ok(answer) => write_answer(output, &answer, close),
                Err(error) => write_error(output, &error, close),
            }
        }
    };
    daemon.metrics().record_http("check", status.as_u16(), started.elapsed());
}

/// Writes a check's answer: 200, its rate-limit headers unless unlimited, its JSON.
fn write_answer(output: &mut Vec<u8>, answer: &Answer, close: bool) -> StatusCode {
    let status = StatusCode::OK;
    write_status_line(output, status);
    if let Some((policy, decision)) = answer.answered() {
        ratemesh::headers::write_header_lines(output, answer.label(), policy.limit.spec().period, &decision);
    }
    write_json(output, &CheckResponse::from(answer), close);
    status
}

/// Writes an error answer; `close` adds `connection: close`.
fn write_error(output: &mut Vec<u8>, error: &ApiError, close: bool) -> StatusCode {
    write_status_line(output, error.status);
    write_json(output, &error.body, close);
    error.status
}

fn write_status_line(output: &mut Vec<u8>, status: StatusCode) {
    output.extend_from_slice(b"HTTP/1.1 ");
    output.extend_from_slice(status.as_str().as_bytes());
    output.push(b' ');
    output.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    output.extend_from_slice(b"\r\ncontent-type: ");
    output.extend_from_slice(JSON.as_bytes());
    output.extend_from_slice(b"\r\n");
}

/// Ends the head (the body's length, `connection: close` if `close`, the date) and writes `value`
/// as the JSON body.
fn write_json(output: &mut Vec<u8>, value: &impl serde::Serialize, close: bool) {
    // The body goes after the head, whose `content-length` needs its length: written at the end
    // of the output, then moved behind the head.
    let body_start = output.len();
    // Serializing plain data structures into a vector cannot fail.
    let _ = serde_json::to_writer(&mut *output, value);
    let body_len = output.len() - body_start;
    let mut head = [0_u8; 128];
    let unused = {
        let mut cursor = &mut head[..];
        let mut number = itoa::Buffer::new();
        // hyper's order.
        let parts: [&[u8]; 6] = [
            b"content-length: ",
            number.format(body_len).as_bytes(),
            if close { b"\r\nconnection: close" } else { b"" },
            b"\r\ndate: ",
            &http_date(),
            b"\r\n\r\n",
        ];
        for part in parts {
            // At most 96 bytes in all: the array holds them.
            let _ = std::io::Write::write_all(&mut cursor, part);
        }
        cursor.len()
    };
    let head_len = head.len() - unused;
    output.splice(body_start..body_start, head[..head_len].iter().copied());
}

/// The `Date` header's value (IMF-fixdate, 29 bytes), formatted at most once a second per thread.
fn http_date() -> [u8; 29] {
    thread_local! {
        static CACHED: std::cell::Cell<(u64, [u8; 29])> = const { std::cell::Cell::new((u64::MAX, [0; 29])) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs();
    CACHED.with(|cached| {
        let (at, date) = cached.get();
        if at == secs {
            return date;
        }
        let mut date = [0; 29];
        let text = httpdate::fmt_http_date(now);
        if text.len() == date.len() {
            date.copy_from_slice(text.as_bytes());
        }
        cached.set((secs, date));
        date
    })
}

/// A connection handed off: the bytes the front read and did not answer, then the socket.
struct Rewound {
    prefix: Vec<u8>,
    read: usize,
    stream: LimitedStream,
}

impl AsyncRead for Rewound {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let rest = &this.prefix[this.read..];
        if rest.is_empty() {
            return Pin::new(&mut this.stream).poll_read(cx, buf);
        }
        let len = rest.len().min(buf.remaining());
        buf.put_slice(&rest[..len]);
        this.read += len;
        if this.read == this.prefix.len() {
            this.prefix = Vec::new();
            this.read = 0;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Rewound {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
