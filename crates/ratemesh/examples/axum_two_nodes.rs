//! Two in-process ratemesh nodes of one cluster, each behind its own axum app, sharing one limit.
//!
//! The apps limit requests by their `x-api-key` header with an exact-mode token bucket of 5 per
//! minute. As a self-check the program sends 8 requests with the same key, alternately to the two
//! apps, over a minimal HTTP/1.1 client, prints each status and its rate-limit headers, and asserts
//! that exactly 5 passed and 3 were refused: the cluster enforces one limit, not one per node.
//!
//! ```text
//! cargo run -p ratemesh --example axum_two_nodes
//! ```
//!
//! Every wait is bounded: the program ends by itself within seconds, or fails.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratemesh::{
    Algorithm, ClusterSecurity, HeaderKey, Limit, LimitSpec, MemberStatus, Mode, NamedPolicy, Node,
    NodeBuilder, NodeConfig, NodeId, Policy, RateLimitLayer,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The bound of every wait (cluster formation, each request, each shutdown).
const WAIT: Duration = Duration::from_secs(20);
const SECRET: &str = "axum example cluster secret (16+ bytes)";
const REQUESTS: usize = 8;
const LIMIT: u64 = 5;

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> Result<T, Error> {
    tokio::time::timeout(WAIT, future).await.map_err(|_| format!("{what}: no answer within {WAIT:?}").into())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    // Generous timeouts: the point is an exact count, and a debug build on a busy machine can stall
    // long enough for the defaults (100 ms forward timeout) to hand a check to the fallback.
    let config = NodeConfig {
        forward_timeout: Duration::from_secs(5),
        peer_silence: Duration::from_secs(3),
        // The library's default: forwarded checks are batched by scheduling, not by a timer.
        forward_wait: Duration::ZERO,
        ..NodeConfig::default()
    };
    let security = ClusterSecurity::from_secret(SECRET)?;
    let first = bounded(
        "start node 1",
        NodeBuilder::new(NodeId(1)).security(security.clone()).node_config(config.clone()).start(),
    )
    .await??;
    let second = bounded(
        "start node 2",
        NodeBuilder::new(NodeId(2))
            .security(security)
            .node_config(config)
            .seeds([first.gossip_addr()])
            .start(),
    )
    .await??;
    for node in [&first, &second] {
        let mut members = node.subscribe_members();
        bounded(
            "cluster formation",
            members
                .wait_for(|members| members.iter().filter(|m| m.status == MemberStatus::Live).count() == 2),
        )
        .await??;
    }
    println!("cluster formed: nodes 1 and 2 are live on both");

    let limit = Limit::new(LimitSpec::new(Algorithm::TokenBucket, LIMIT, Duration::from_secs(60)))?;
    let policy = NamedPolicy::new("api", Policy::new(limit, Mode::Exact));
    println!("key \"client-42\" is owned by {:?}", first.owner_of(policy.key(b"client-42")));

    let mut apps = Vec::new();
    let mut servers = Vec::new();
    for node in [&first, &second] {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        apps.push(listener.local_addr()?);
        let app = app(node.clone(), policy.clone());
        servers.push(tokio::spawn(async move { axum::serve(listener, app).await }));
    }

    let (mut passed, mut refused) = (0, 0);
    for i in 0..REQUESTS {
        let addr = apps[i % apps.len()];
        let response = bounded("request", http_get(addr, "client-42")).await??;
        println!("request {} -> node {}: {}", i + 1, i % apps.len() + 1, response.status_line);
        for (name, value) in &response.headers {
            if name.contains("ratelimit") || name == "retry-after" {
                println!("    {name}: {value}");
            }
        }
        match response.status {
            200 => passed += 1,
            429 => {
                assert!(response.header("retry-after").is_some(), "a refusal says when to retry");
                refused += 1;
            }
            other => return Err(format!("unexpected status {other}").into()),
        }
    }
    println!("{passed} passed, {refused} refused");
    assert_eq!((passed, refused), (5, 3), "the two nodes enforce one limit of {LIMIT}");

    for server in servers {
        server.abort();
    }
    bounded("shutdown of node 2", second.shutdown()).await?;
    bounded("shutdown of node 1", first.shutdown()).await?;
    println!("both nodes shut down");
    Ok(())
}

/// An app on `node`: one route, limited per `x-api-key` under `policy`.
fn app(node: Node, policy: NamedPolicy) -> Router {
    let id = node.id().0;
    Router::new()
        .route("/", get(move || async move { format!("hello from node {id}\n") }))
        .layer(RateLimitLayer::new(node, policy, HeaderKey::from_static("x-api-key")))
}

/// A parsed HTTP/1.1 response head.
struct Head {
    status_line: String,
    status: u16,
    headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `GET /` with an API key, over a fresh connection that the server closes after the response
/// (`Connection: close`), so reading to the end reads exactly one response.
async fn http_get(addr: SocketAddr, api_key: &str) -> Result<Head, Error> {
    let mut stream = TcpStream::connect(addr).await?;
    let request =
        format!("GET / HTTP/1.1\r\nHost: {addr}\r\nx-api-key: {api_key}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let raw = String::from_utf8(raw)?;
    let head = raw.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default().to_owned();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {status_line:?}"))?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Ok(Head { status_line, status, headers })
}
