//! A bounded load generator for the Envoy Rate Limit Service of a running ratemeshd: `concurrency`
//! tonic clients over `connections` HTTP/2 connections call `ShouldRateLimit` with one descriptor
//! (`domain`, `(descriptor-key, value)`), until `requests` calls were made or `seconds` passed,
//! whichever comes first. Prints one JSON line:
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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Channel, Endpoint};

/// Most calls in one run: the latencies of every call are kept (8 bytes each).
const REQUESTS_MAX: u64 = 10_000_000;
/// Longest run.
const SECONDS_MAX: u64 = 60;
/// Most concurrent clients and connections.
const CONCURRENCY_MAX: usize = 4096;
/// Longest a single call or connection attempt may take before it counts as an error.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// Concurrent clients, each with one call in flight.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections the clients share (at most `concurrency`).
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

/// What one client saw.
#[derive(Debug, Default)]
struct Tally {
    latencies_nanos: Vec<u64>,
    ok: u64,
    over_limit: u64,
    errors: u64,
    first_error: Option<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    ensure!((1..=REQUESTS_MAX).contains(&args.requests), "--requests must be 1..={REQUESTS_MAX}");
    ensure!((1..=SECONDS_MAX).contains(&args.seconds), "--seconds must be 1..={SECONDS_MAX}");
    ensure!((1..=CONCURRENCY_MAX).contains(&args.concurrency), "--concurrency must be 1..={CONCURRENCY_MAX}");
    ensure!(args.keys >= 1, "--keys must be at least 1");
    let connections = args.connections.clamp(1, args.concurrency);

    let endpoint = Endpoint::from_shared(format!("http://{}", args.addr))
        .with_context(|| format!("--addr {:?}", args.addr))?
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .tcp_nodelay(true);
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections {
        channels.push(endpoint.connect().await.with_context(|| format!("connecting to {}", args.addr))?);
    }

    let issued = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let args = Arc::new(args);
    let mut workers = Vec::with_capacity(args.concurrency);
    for worker in 0..args.concurrency {
        let client = RateLimitServiceClient::new(channels[worker % connections].clone());
        workers.push(tokio::spawn(run_client(client, Arc::clone(&args), Arc::clone(&issued), deadline)));
    }
    let mut total = Tally::default();
    for worker in workers {
        let tally = worker.await.context("a client task panicked")?;
        total.latencies_nanos.extend(tally.latencies_nanos);
        total.ok += tally.ok;
        total.over_limit += tally.over_limit;
        total.errors += tally.errors;
        total.first_error = total.first_error.or(tally.first_error);
    }
    let elapsed = started.elapsed().as_secs_f64();
    total.latencies_nanos.sort_unstable();
    let calls = total.latencies_nanos.len() as u64;
    let rps = calls as f64 / elapsed.max(f64::EPSILON);
    let p50 = percentile_ms(&total.latencies_nanos, 0.50);
    let p99 = percentile_ms(&total.latencies_nanos, 0.99);
    if args.tsv {
        println!("{rps:.1}\t{p50:.3}\t{p99:.3}");
    } else {
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
    if total.errors > 0 {
        bail!(
            "{} of {calls} calls failed; first: {}",
            total.errors,
            total.first_error.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}

/// One client: calls until the run's budget of calls is spent or the deadline passed.
async fn run_client(
    mut client: RateLimitServiceClient<Channel>,
    args: Arc<Args>,
    issued: Arc<AtomicU64>,
    deadline: Instant,
) -> Tally {
    let mut tally = Tally::default();
    // Bounded: each turn takes one of the `requests` numbers, and there are no more after them.
    loop {
        let n = issued.fetch_add(1, Ordering::Relaxed);
        if n >= args.requests || Instant::now() >= deadline {
            return tally;
        }
        let value = if args.keys == 1 {
            "bench".to_owned()
        } else {
            format!("{}-{}", args.descriptor_key, n % args.keys)
        };
        let request = RateLimitRequest {
            domain: args.domain.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry { key: args.descriptor_key.clone(), value }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        let sent = Instant::now();
        let result = client.should_rate_limit(request).await;
        tally.latencies_nanos.push(u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX));
        match result {
            Ok(response) if response.get_ref().overall_code == i32::from(Code::OverLimit) => {
                tally.over_limit += 1
            }
            Ok(_) => tally.ok += 1,
            Err(status) => {
                tally.errors += 1;
                tally.first_error.get_or_insert_with(|| format!("{:?}: {}", status.code(), status.message()));
            }
        }
    }
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
