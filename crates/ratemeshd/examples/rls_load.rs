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
//! With `--keys K` the values are spread over `user-0` … `user-{K-1}` (K buckets); by default
//! every call hits one bucket. How to run it by hand, and the policy the daemon needs:
//! `bench/README.md`; `bench/run.sh` builds and runs it. It is an example of this crate, not a
//! script under `bench/`, because it is built from this crate's dependencies (h2, the Envoy
//! protobuf types).
//!
//! # Why h2 and not tonic
//!
//! A benchmark's client must cost less than the server it measures, or it measures itself: a
//! tonic client on one core tops out near 45 000 calls/s, half of what the daemon answers on
//! one core, and its queueing was most of the p99 reported. This one is a gRPC client on the
//! `h2` crate alone (the HTTP/2 of tonic, hyper and the daemon), on one thread: per call one
//! request head, one DATA frame with the message, and the answer's head, message and trailers
//! read back, `grpc-status` and the response's `overall_code` checked; h2 keeps the flow control,
//! HPACK and the server's `MAX_CONCURRENT_STREAMS`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use bytes::{BufMut as _, Bytes, BytesMut};
use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use h2::client::SendRequest;
use http::{HeaderValue, Method, Request};
use prost::Message as _;
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
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The stream window this client advertises: far above any answer.
const STREAM_WINDOW_BYTES: u32 = 1 << 20;
/// The connection window this client advertises.
const CONNECTION_WINDOW_BYTES: u32 = 1 << 24;

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
        tasks.push(tokio::spawn(connection(stream, Arc::clone(&args), in_flight, Arc::clone(&budget))));
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

/// One HTTP/2 connection with `in_flight` callers on it, until the budget is spent; what they
/// saw. A connection that fails counts every call in flight on it as failed.
async fn connection(
    stream: TcpStream,
    args: Arc<Args>,
    in_flight: usize,
    budget: Arc<Budget>,
) -> Result<Tally> {
    let (client, driver) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .enable_push(false)
        .handshake::<_, Bytes>(stream)
        .await
        .context("the HTTP/2 handshake")?;
    let driver = tokio::spawn(driver);
    let authority = args.addr.clone();
    let callers: Vec<_> = (0..in_flight)
        .map(|_| {
            tokio::spawn(caller(client.clone(), Arc::clone(&args), authority.clone(), Arc::clone(&budget)))
        })
        .collect();
    drop(client);
    let mut tally = Tally::default();
    for caller in callers {
        tally.add(caller.await.context("a caller panicked")?);
    }
    // Every caller is done: the connection closes once its last stream did.
    if let Ok(Err(error)) = tokio::time::timeout(CALL_TIMEOUT, driver).await.context("the connection task")? {
        tally.error(|| format!("the connection failed: {error}"));
    }
    Ok(tally)
}

/// Makes calls one after another on `client` until the budget is spent.
async fn caller(
    mut client: SendRequest<Bytes>,
    args: Arc<Args>,
    authority: String,
    budget: Arc<Budget>,
) -> Tally {
    let mut tally = Tally::default();
    let mut request = RateLimitRequest {
        domain: args.domain.clone(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry { key: args.descriptor_key.clone(), value: String::new() }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let uri: http::Uri = match format!("http://{authority}{PATH}").parse() {
        Ok(uri) => uri,
        Err(error) => {
            tally.error(|| format!("--addr {authority}: {error}"));
            return tally;
        }
    };
    while let Some(n) = budget.take() {
        let message = encode_message(&mut request, &args, n);
        let sent_at = Instant::now();
        match tokio::time::timeout(CALL_TIMEOUT, call(&mut client, &uri, message)).await {
            Ok(Ok(code)) => {
                tally.latencies_nanos.push(sent_at.elapsed().as_nanos() as u64);
                match code {
                    Code::Ok => tally.ok += 1,
                    Code::OverLimit => tally.over_limit += 1,
                    other => tally.error(|| format!("overall_code {other:?}")),
                }
            }
            Ok(Err(error)) => tally.error(|| format!("{error:#}")),
            Err(_) => tally.error(|| "no answer within 5 s".to_owned()),
        }
    }
    tally
}

/// One call: the request's head and message, then the answer's head, message and trailers.
async fn call(client: &mut SendRequest<Bytes>, uri: &http::Uri, message: Bytes) -> Result<Code> {
    let mut head = Request::new(());
    *head.method_mut() = Method::POST;
    *head.uri_mut() = uri.clone();
    let headers = head.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    std::future::poll_fn(|cx| client.poll_ready(cx)).await.context("waiting for a stream")?;
    let (answer, mut send) = client.send_request(head, false).context("sending the request head")?;
    send.send_data(message, true).context("sending the message")?;
    let answer = answer.await.context("the answer's head")?;
    ensure!(answer.status() == http::StatusCode::OK, "HTTP status {}", answer.status());
    let mut body = answer.into_body();
    let mut received = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.context("the answer's message")?;
        let _ = body.flow_control().release_capacity(chunk.len());
        received.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.context("the answer's trailers")?.unwrap_or_default();
    let status = trailers.get("grpc-status").and_then(|value| value.to_str().ok()).unwrap_or("none");
    if status != "0" {
        let message = trailers.get("grpc-message").and_then(|value| value.to_str().ok()).unwrap_or("");
        bail!("grpc-status {status}: {message}");
    }
    ensure!(received.len() >= 5, "an answer without a message");
    let response = RateLimitResponse::decode(&received[5..]).context("not a RateLimitResponse")?;
    Ok(Code::try_from(response.overall_code).unwrap_or(Code::Unknown))
}

/// The gRPC message (5-byte prefix, then the request) of call number `n`.
fn encode_message(request: &mut RateLimitRequest, args: &Args, n: u64) -> Bytes {
    let value = &mut request.descriptors[0].entries[0].value;
    value.clear();
    if args.keys == 1 {
        value.push_str("bench");
    } else {
        use std::fmt::Write as _;
        let _ = write!(value, "{}-{}", args.descriptor_key, n % args.keys);
    }
    let mut message = BytesMut::with_capacity(5 + request.encoded_len());
    message.put_u8(0);
    message.put_u32(request.encoded_len() as u32);
    request.encode(&mut message).expect("the buffer holds the encoded length");
    message.freeze()
}

/// The latency at quantile `q` of sorted `latencies`, in milliseconds.
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
