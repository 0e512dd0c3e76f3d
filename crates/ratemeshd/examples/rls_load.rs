//! A bounded load generator for the Envoy Rate Limit Service of a running ratemeshd: `concurrency`
//! calls in flight over `connections` HTTP/2 connections, each call `ShouldRateLimit` with one
//! descriptor (`domain`, `(descriptor-key, value)`), until `requests` calls were made or
//! `seconds` passed, whichever comes first. Prints one JSON line:
//!
//! ```text
//! {"requests":200000,"seconds":4.1,"requests_per_second":48780.5,"p50_ms":1.2,"p99_ms":3.4,
//!  "ok":…,"over_limit":…,"errors":0,"concurrency":64,"connections":4}
//! ```
//!
//! (`--tsv`: the line `requests_per_second<TAB>p50_ms<TAB>p99_ms` instead). Exits non-zero if any
//! call failed (an OVER_LIMIT answer is a success: the service answered).
//!
//! ```text
//! cargo run --release -p ratemeshd --example rls_load -- --addr 127.0.0.1:8081 \
//!     --requests 200000 --concurrency 64
//! ```
//!
//! The daemon needs a policy for the descriptor, e.g.
//! `domain = "bench"`, `descriptors = [{ key = "user" }]`. With `--keys K` the values are spread
//! over `user-0` … `user-{K-1}` (K buckets); by default every call hits one bucket.
//!
//! # Why not a gRPC library
//!
//! A benchmark's client must cost less than the server it measures, or it measures itself: a
//! tonic client on one core tops out near 45 000 calls/s, half of what the daemon answers on
//! one core, and its queueing was most of the p99 reported. This one speaks just what a gRPC
//! client of the RLS says, on one thread, with the daemon's own HTTP/2 framing and HPACK
//! decoder: HEADERS with the fields every request repeats indexed after the first (as Envoy's
//! HTTP/2 codec sends them), one DATA frame, and the answer's HEADERS, DATA and trailers read
//! back, `grpc-status` and the response's `overall_code` checked. It honours the server's flow
//! control (connection and stream windows, `MAX_CONCURRENT_STREAMS`) and answers its PINGs and
//! SETTINGS.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message as _;
use ratemeshd::rls::hpack::{self, Decoder};
use ratemeshd::rls::http2::{PREFACE, flag, frame, read_frame_header, unpad, write_frame_header};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Most calls in one run: the latencies of every call are kept (8 bytes each).
const REQUESTS_MAX: u64 = 10_000_000;
/// Longest run.
const SECONDS_MAX: u64 = 60;
/// Most concurrent calls and connections.
const CONCURRENCY_MAX: usize = 4096;
/// Longest the server may stay silent while calls are in flight (or a connect may take).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The method's path.
const PATH: &[u8] = b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The stream window this client advertises: far above any answer.
const STREAM_WINDOW_BYTES: u32 = 1 << 20;
/// Credit given back on the connection once this much DATA was received.
const CONNECTION_CREDIT_BYTES: u32 = 1 << 24;
/// The largest frame this client accepts (HTTP/2's default SETTINGS_MAX_FRAME_SIZE).
const FRAME_BYTES_MAX: usize = 16_384;
/// The largest answer header list decoded.
const HEADER_LIST_BYTES_MAX: usize = 16 * 1024;
/// HEADERS payload of a request once the repeated fields are in the server's table:
/// `:method POST`, `:scheme http` (static), then `:path`, `:authority`, `content-type`, `te`
/// (dynamic 65 … 62, in the order the first request added them).
const INDEXED_FIELDS: [u8; 6] = [0x83, 0x86, 0x80 | 65, 0x80 | 64, 0x80 | 63, 0x80 | 62];
/// What the first request's fields add to the server's dynamic table (RFC 7541 4.1 sizes), at
/// most: with a smaller table the fields are sent as literals every time.
const INDEXED_TABLE_BYTES: usize = 512;

/// Command line.
#[derive(Debug, Parser)]
#[command(name = "rls_load", about = "Bounded load on ratemeshd's Envoy RLS (gRPC)")]
struct Args {
    /// The daemon's gRPC address (`listen.grpc`), host:port.
    #[arg(long)]
    addr: String,
    /// Total calls (at most 10 000 000).
    #[arg(long, default_value_t = 200_000)]
    requests: u64,
    /// Stop after this many seconds even if calls remain (at most 60).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Calls in flight, spread over the connections.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections (at most `concurrency`).
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// The request's domain.
    #[arg(long, default_value = "bench")]
    domain: String,
    /// The descriptor entry's key.
    #[arg(long, default_value = "user")]
    descriptor_key: String,
    /// Distinct descriptor values (buckets), chosen round-robin.
    #[arg(long, default_value_t = 1)]
    keys: u64,
    /// Print `requests_per_second<TAB>p50_ms<TAB>p99_ms` instead of JSON.
    #[arg(long)]
    tsv: bool,
}

/// What one connection saw.
#[derive(Debug, Default)]
struct Tally {
    latencies_nanos: Vec<u64>,
    ok: u64,
    over_limit: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn error(&mut self, what: impl FnOnce() -> String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(what());
        }
    }

    fn add(&mut self, other: Tally) {
        self.latencies_nanos.extend(other.latencies_nanos);
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.errors += other.errors;
        self.first_error = self.first_error.take().or(other.first_error);
    }
}

/// The run's shared budget of calls and its deadline.
struct Budget {
    issued: AtomicU64,
    requests: u64,
    deadline: Instant,
}

impl Budget {
    /// The number of the next call, if the run has calls and time left.
    fn take(&self) -> Option<u64> {
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        (n < self.requests && Instant::now() < self.deadline).then_some(n)
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!((1..=REQUESTS_MAX).contains(&args.requests), "--requests must be 1..={REQUESTS_MAX}");
    ensure!((1..=SECONDS_MAX).contains(&args.seconds), "--seconds must be 1..={SECONDS_MAX}");
    ensure!((1..=CONCURRENCY_MAX).contains(&args.concurrency), "--concurrency must be 1..={CONCURRENCY_MAX}");
    ensure!(args.keys >= 1, "--keys must be at least 1");
    ensure!(args.addr.len() < 127, "--addr is too long");
    // One thread: the generator's cost is one core's at most, whatever the connection count.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let connections = args.connections.clamp(1, args.concurrency);
    let mut streams = Vec::with_capacity(connections);
    for _ in 0..connections {
        let stream = tokio::time::timeout(CALL_TIMEOUT, TcpStream::connect(&args.addr))
            .await
            .map_err(|_| anyhow!("connecting to {} timed out", args.addr))?
            .with_context(|| format!("connecting to {}", args.addr))?;
        stream.set_nodelay(true)?;
        streams.push(stream);
    }
    let started = Instant::now();
    let budget = Arc::new(Budget {
        issued: AtomicU64::new(0),
        requests: args.requests,
        deadline: started + Duration::from_secs(args.seconds),
    });
    let args = Arc::new(args);
    let mut tasks = Vec::with_capacity(connections);
    for (index, stream) in streams.into_iter().enumerate() {
        // The calls in flight, spread as evenly as they go.
        let in_flight = args.concurrency / connections + usize::from(index < args.concurrency % connections);
        let connection = Connection::new(stream, Arc::clone(&args), in_flight);
        tasks.push(tokio::spawn(connection.run(Arc::clone(&budget))));
    }
    let mut total = Tally::default();
    for task in tasks {
        total.add(task.await.context("a connection task panicked")??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    report(&args, &mut total, elapsed, connections);
    if total.errors > 0 {
        bail!(
            "{} of {} calls failed; first: {}",
            total.errors,
            total.latencies_nanos.len(),
            total.first_error.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}

fn report(args: &Args, total: &mut Tally, elapsed: f64, connections: usize) {
    total.latencies_nanos.sort_unstable();
    let calls = total.latencies_nanos.len() as u64;
    let rps = calls as f64 / elapsed.max(f64::EPSILON);
    let p50 = percentile_ms(&total.latencies_nanos, 0.50);
    let p99 = percentile_ms(&total.latencies_nanos, 0.99);
    if args.tsv {
        println!("{rps:.1}\t{p50:.3}\t{p99:.3}");
        return;
    }
    let line = serde_json::json!({
        "requests": calls,
        "seconds": round3(elapsed),
        "requests_per_second": (rps * 10.0).round() / 10.0,
        "p50_ms": round3(p50),
        "p99_ms": round3(p99),
        "ok": total.ok,
        "over_limit": total.over_limit,
        "errors": total.errors,
        "concurrency": args.concurrency,
        "connections": connections,
    });
    println!("{line}");
}

/// A call in flight.
#[derive(Debug)]
struct Call {
    sent_at: Instant,
    /// `:status` of the answer's first HEADERS.
    http_status: Option<u16>,
    /// The answer's `overall_code`, once its message came.
    code: Option<i32>,
    /// `grpc-status` (and `grpc-message`) of the trailers.
    grpc_status: Option<(u32, String)>,
}

/// One HTTP/2 connection and its calls.
struct Connection {
    stream: TcpStream,
    args: Arc<Args>,
    in_flight_max: usize,
    calls: HashMap<u32, Call>,
    next_stream: u32,
    decoder: Decoder,
    output: Vec<u8>,
    /// The request, its value rewritten for every call, and its gRPC message.
    request: RateLimitRequest,
    message: Vec<u8>,
    /// The longest message of the run (the highest key number's), for the window checks.
    message_bytes_max: usize,
    /// The server's settings and this connection's send credit.
    settings_read: bool,
    streams_max: usize,
    stream_window: i64,
    connection_window: i64,
    /// Whether the server's table takes the repeated fields, and whether they are in it.
    index_fields: bool,
    fields_indexed: bool,
    /// DATA bytes received since credit was last given back.
    received_bytes: u32,
    /// A header block in progress (HEADERS then CONTINUATIONs): its stream, END_STREAM, bytes.
    block: Option<(u32, bool, Vec<u8>)>,
    /// No new calls after the server's GOAWAY.
    going_away: bool,
    tally: Tally,
}

impl Connection {
    fn new(stream: TcpStream, args: Arc<Args>, in_flight_max: usize) -> Connection {
        let request = RateLimitRequest {
            domain: args.domain.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry { key: args.descriptor_key.clone(), value: String::new() }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        let mut connection = Connection {
            stream,
            args,
            in_flight_max,
            calls: HashMap::with_capacity(in_flight_max),
            next_stream: 1,
            decoder: Decoder::new(4096, HEADER_LIST_BYTES_MAX),
            output: Vec::with_capacity(16 * 1024),
            request,
            message: Vec::with_capacity(128),
            message_bytes_max: 0,
            settings_read: false,
            streams_max: 100,
            stream_window: 65_535,
            connection_window: 65_535,
            index_fields: true,
            fields_indexed: false,
            received_bytes: 0,
            block: None,
            going_away: false,
            tally: Tally::default(),
        };
        connection.encode_message(connection.args.keys - 1);
        connection.message_bytes_max = connection.message.len();
        connection
    }

    /// Calls until the budget is spent and every call is answered; `Err` when the connection
    /// fails (every call still in flight then counts as failed).
    async fn run(mut self, budget: Arc<Budget>) -> Result<Tally> {
        self.output.extend_from_slice(PREFACE);
        // SETTINGS: ENABLE_PUSH 0, INITIAL_WINDOW_SIZE; then the connection's credit.
        write_frame_header(&mut self.output, 12, frame::SETTINGS, 0, 0);
        self.output.extend_from_slice(&[0, 2, 0, 0, 0, 0, 0, 4]);
        self.output.extend_from_slice(&STREAM_WINDOW_BYTES.to_be_bytes());
        self.window_update(CONNECTION_CREDIT_BYTES);
        let mut input = vec![0u8; 64 * 1024];
        let mut filled = 0;
        let mut budget_left = true;
        loop {
            if self.settings_read && budget_left {
                budget_left = self.issue(&budget);
            }
            if !self.output.is_empty() {
                self.stream.write_all(&self.output).await.context("writing to the server")?;
                self.output.clear();
            }
            if self.settings_read && self.calls.is_empty() && (!budget_left || self.going_away) {
                return Ok(self.tally);
            }
            let read = tokio::time::timeout(CALL_TIMEOUT, self.stream.read(&mut input[filled..])).await;
            let read = match read {
                Ok(read) => read.context("reading from the server")?,
                Err(_) => return Err(self.fail("no answer within 5 s")),
            };
            if read == 0 {
                return Err(self.fail("the server closed the connection"));
            }
            filled += read;
            let consumed = self.frames(&input[..filled])?;
            input.copy_within(consumed..filled, 0);
            filled -= consumed;
        }
    }

    /// Counts every call in flight as failed; the error to end the connection with.
    fn fail(&mut self, why: &str) -> anyhow::Error {
        let calls = self.calls.len();
        for _ in 0..calls {
            self.tally.error(|| why.to_owned());
        }
        anyhow!("{why} ({calls} calls in flight)")
    }

    /// Starts calls up to the bounds; false once the budget is spent.
    fn issue(&mut self, budget: &Budget) -> bool {
        let in_flight_max = self.in_flight_max.min(self.streams_max);
        while !self.going_away && self.calls.len() < in_flight_max {
            if self.connection_window < self.message_bytes_max as i64 {
                return true; // Wait for the server's WINDOW_UPDATE.
            }
            let Some(n) = budget.take() else { return false };
            self.encode_message(n);
            self.start_call();
        }
        true
    }

    /// The gRPC message (5-byte prefix, then the request) of call number `n` into `message`.
    fn encode_message(&mut self, n: u64) {
        let value = &mut self.request.descriptors[0].entries[0].value;
        value.clear();
        if self.args.keys == 1 {
            value.push_str("bench");
        } else {
            use std::fmt::Write as _;
            let _ = write!(value, "{}-{}", self.args.descriptor_key, n % self.args.keys);
        }
        self.message.clear();
        self.message.push(0);
        self.message.extend_from_slice(&(self.request.encoded_len() as u32).to_be_bytes());
        self.request.encode(&mut self.message).expect("a Vec grows");
    }

    /// Writes HEADERS and DATA of a new stream carrying `message`.
    fn start_call(&mut self) {
        let stream = self.next_stream;
        self.next_stream += 2;
        if self.fields_indexed {
            let fields = &INDEXED_FIELDS;
            write_frame_header(&mut self.output, fields.len(), frame::HEADERS, flag::END_HEADERS, stream);
            self.output.extend_from_slice(fields);
        } else {
            let mut fields = Vec::with_capacity(128);
            self.first_fields(&mut fields);
            write_frame_header(&mut self.output, fields.len(), frame::HEADERS, flag::END_HEADERS, stream);
            self.output.extend_from_slice(&fields);
        }
        write_frame_header(&mut self.output, self.message.len(), frame::DATA, flag::END_STREAM, stream);
        self.output.extend_from_slice(&self.message);
        self.connection_window -= self.message.len() as i64;
        let call = Call { sent_at: Instant::now(), http_status: None, code: None, grpc_status: None };
        self.calls.insert(stream, call);
    }

    /// The request's fields in full: added to the server's table (when it has room) so that the
    /// next requests name them by index.
    fn first_fields(&mut self, fields: &mut Vec<u8>) {
        hpack::encode_indexed(fields, 3); // :method POST
        hpack::encode_indexed(fields, 6); // :scheme http
        let authority = self.args.addr.as_bytes();
        if self.index_fields {
            hpack::encode_literal_indexing(fields, 4, b"", PATH);
            hpack::encode_literal_indexing(fields, 1, b"", authority);
            hpack::encode_literal_indexing(fields, 31, b"", b"application/grpc");
            hpack::encode_literal_indexing(fields, 0, b"te", b"trailers");
            self.fields_indexed = true;
        } else {
            hpack::encode_literal_indexed_name(fields, 4, PATH);
            hpack::encode_literal_indexed_name(fields, 1, authority);
            hpack::encode_literal_indexed_name(fields, 31, b"application/grpc");
            hpack::encode_literal(fields, b"te", b"trailers");
        }
    }

    fn window_update(&mut self, increment: u32) {
        write_frame_header(&mut self.output, 4, frame::WINDOW_UPDATE, 0, 0);
        self.output.extend_from_slice(&increment.to_be_bytes());
    }

    /// Handles the complete frames at the start of `input`; the bytes they took.
    fn frames(&mut self, input: &[u8]) -> Result<usize> {
        let mut consumed = 0;
        while let Some((length, kind, flags, stream)) = read_frame_header(&input[consumed..]) {
            ensure!(length <= FRAME_BYTES_MAX, "a frame of {length} bytes from the server");
            let Some(payload) = input.get(consumed + 9..consumed + 9 + length) else { break };
            self.frame(kind, flags, stream, payload)?;
            consumed += 9 + length;
        }
        Ok(consumed)
    }

    fn frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<()> {
        match kind {
            frame::SETTINGS if flags & flag::ACK == 0 => self.settings(payload)?,
            frame::PING if flags & flag::ACK == 0 => {
                write_frame_header(&mut self.output, payload.len(), frame::PING, flag::ACK, 0);
                self.output.extend_from_slice(payload);
            }
            frame::WINDOW_UPDATE => {
                let increment = i64::from(u32::from_be_bytes(fixed(payload)?) & 0x7fff_ffff);
                if stream == 0 {
                    self.connection_window += increment;
                }
            }
            frame::HEADERS => {
                let fields = unpad(flags, payload)?;
                let fields = if flags & flag::PRIORITY != 0 { fields.get(5..) } else { Some(fields) };
                let fields = fields.ok_or_else(|| anyhow!("a HEADERS frame too short"))?;
                self.block = Some((stream, flags & flag::END_STREAM != 0, fields.to_vec()));
                if flags & flag::END_HEADERS != 0 {
                    self.header_block()?;
                }
            }
            frame::CONTINUATION => {
                let Some((_, _, block)) = self.block.as_mut() else { bail!("a CONTINUATION out of place") };
                block.extend_from_slice(payload);
                if flags & flag::END_HEADERS != 0 {
                    self.header_block()?;
                }
            }
            frame::DATA => self.data(flags, stream, payload)?,
            frame::RST_STREAM if self.calls.remove(&stream).is_some() => {
                let code = u32::from_be_bytes(fixed(payload)?);
                self.tally.error(|| format!("stream reset, HTTP/2 error code {code}"));
            }
            frame::GOAWAY => self.goaway(payload)?,
            _ => {}
        }
        Ok(())
    }

    fn settings(&mut self, payload: &[u8]) -> Result<()> {
        for setting in payload.chunks_exact(6) {
            let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
            match u16::from_be_bytes([setting[0], setting[1]]) {
                0x1 => {
                    let room = value as usize >= INDEXED_TABLE_BYTES;
                    ensure!(
                        room || !self.fields_indexed,
                        "the server shrank its header table to {value} bytes"
                    );
                    self.index_fields = room;
                }
                0x3 => self.streams_max = value as usize,
                0x4 => self.stream_window = i64::from(value),
                _ => {}
            }
        }
        ensure!(
            self.stream_window >= self.message_bytes_max as i64,
            "the server's stream window ({} bytes) is below one request",
            self.stream_window
        );
        self.settings_read = true;
        write_frame_header(&mut self.output, 0, frame::SETTINGS, flag::ACK, 0);
        Ok(())
    }

    fn header_block(&mut self) -> Result<()> {
        let Some((stream, end_stream, block)) = self.block.take() else { return Ok(()) };
        let (mut status, mut grpc_status, mut grpc_message) = (None, None, String::new());
        self.decoder
            .decode(&block, |name, value| match name {
                b":status" => status = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()),
                b"grpc-status" => grpc_status = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()),
                b"grpc-message" => grpc_message = String::from_utf8_lossy(value).into_owned(),
                _ => {}
            })
            .context("the server's header block")?;
        let Some(call) = self.calls.get_mut(&stream) else { return Ok(()) };
        call.http_status = call.http_status.or(status);
        if let Some(code) = grpc_status {
            call.grpc_status = Some((code, grpc_message));
        }
        if end_stream {
            self.finish(stream);
        }
        Ok(())
    }

    fn data(&mut self, flags: u8, stream: u32, payload: &[u8]) -> Result<()> {
        self.received_bytes += payload.len() as u32;
        if self.received_bytes >= CONNECTION_CREDIT_BYTES / 2 {
            let credit = std::mem::take(&mut self.received_bytes);
            self.window_update(credit);
        }
        let message = unpad(flags, payload)?;
        if let Some(call) = self.calls.get_mut(&stream) {
            // One gRPC message per answer: the 5-byte prefix, then the response.
            call.code = message
                .get(5..)
                .and_then(|bytes| RateLimitResponse::decode(bytes).ok())
                .map(|r| r.overall_code);
        }
        if flags & flag::END_STREAM != 0 {
            self.finish(stream);
        }
        Ok(())
    }

    fn goaway(&mut self, payload: &[u8]) -> Result<()> {
        ensure!(payload.len() >= 8, "a GOAWAY frame too short");
        let last = u32::from_be_bytes(fixed(&payload[..4])?) & 0x7fff_ffff;
        let code = u32::from_be_bytes(fixed(&payload[4..8])?);
        self.going_away = true;
        // Calls above the last stream the server took were not processed.
        let refused: Vec<u32> = self.calls.keys().copied().filter(|&id| id > last).collect();
        for id in refused {
            self.calls.remove(&id);
            self.tally.error(|| format!("GOAWAY (code {code}) before the call was processed"));
        }
        ensure!(code == 0, "GOAWAY with error code {code}: {}", String::from_utf8_lossy(&payload[8..]));
        Ok(())
    }

    /// The call on `stream` has its whole answer: latency and outcome.
    fn finish(&mut self, stream: u32) {
        let Some(call) = self.calls.remove(&stream) else { return };
        let nanos = u64::try_from(call.sent_at.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.tally.latencies_nanos.push(nanos);
        match (call.http_status, call.grpc_status, call.code) {
            (Some(200), Some((0, _)), Some(code)) if code == i32::from(Code::OverLimit) => {
                self.tally.over_limit += 1
            }
            (Some(200), Some((0, _)), Some(_)) => self.tally.ok += 1,
            (Some(200), Some((code, message)), _) if code != 0 => {
                self.tally.error(|| format!("grpc-status {code}: {message}"))
            }
            (status, grpc, code) => self.tally.error(|| {
                format!("an incomplete answer: :status {status:?}, grpc-status {grpc:?}, code {code:?}")
            }),
        }
    }
}

/// The first 4 bytes of `payload`.
fn fixed(payload: &[u8]) -> Result<[u8; 4]> {
    payload.get(..4).and_then(|bytes| bytes.try_into().ok()).ok_or_else(|| anyhow!("a frame too short"))
}

/// The `q` quantile of sorted nanoseconds, in milliseconds (nearest rank).
fn percentile_ms(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1e6
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
