//! The tower layer over one real node on loopback: refusals with their headers, unlimited requests
//! without a key, independent keys, concurrency leases released when the response completes or
//! its future is dropped, the shaper's delay, 503 once the node shut down. Requests go through
//! `tower::ServiceExt::oneshot` to a `service_fn`; every wait is bounded by `WAIT` and waits on a
//! signal, never on a sleep.

#![cfg(feature = "tower")]
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use ratemesh::{
    ClusterSecurity, HeaderKey, MemoryNetwork, NamedPolicy, Node, NodeBuilder, NodeId, RateLimitBody,
    RateLimitLayer,
};
use ratemesh_core::{Algorithm, Limit, LimitSpec, Mode, Policy};
use tokio::sync::Notify;
use tower::{Layer, Service, ServiceExt, service_fn};

const SECRET: &str = "layer-test cluster secret, 16+ bytes";
const WAIT: Duration = Duration::from_secs(30);
const RATE_HEADERS: [&str; 6] = [
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
    "ratelimit-policy",
    "ratelimit",
];

async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future).await.expect("bounded wait")
}

async fn start_node() -> Node {
    let security = ClusterSecurity::from_secret(SECRET).unwrap();
    within(NodeBuilder::new(NodeId(1)).security(security).start()).await.unwrap()
}

fn policy(name: &str, spec: LimitSpec) -> NamedPolicy {
    let limit = Limit::new(spec).unwrap();
    NamedPolicy::new(name, Policy::new(limit, Mode::Exact))
}

fn per_minute(limit: u64) -> NamedPolicy {
    policy("per-minute", LimitSpec::new(Algorithm::TokenBucket, limit, Duration::from_secs(60)))
}

/// The inner service: counts its calls; a request with `x-block` waits (after signalling
/// `entered`) until `gate` is opened.
#[derive(Clone, Default)]
struct Inner {
    calls: Arc<AtomicUsize>,
    entered: Arc<Notify>,
    gate: Arc<Notify>,
}

impl Inner {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// The response of the limited service.
type Limited = Response<RateLimitBody<Full<Bytes>>>;

/// The limited service's type, named by what it does.
trait LimitedService: Service<Request<()>, Response = Limited, Error = Infallible, Future: Send> + Clone {}
impl<S: Service<Request<()>, Response = Limited, Error = Infallible, Future: Send> + Clone> LimitedService
    for S
{
}

fn service(node: &Node, policy: NamedPolicy, inner: &Inner) -> impl LimitedService + use<> {
    let state = inner.clone();
    let handler = service_fn(move |request: Request<()>| {
        let state = state.clone();
        async move {
            state.calls.fetch_add(1, Ordering::SeqCst);
            if request.headers().contains_key("x-block") {
                state.entered.notify_one();
                state.gate.notified().await;
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
        }
    });
    RateLimitLayer::new(node.clone(), policy, HeaderKey::from_static("x-api-key")).layer(handler)
}

fn request(key: Option<&str>) -> Request<()> {
    let mut builder = Request::builder().uri("/");
    if let Some(key) = key {
        builder = builder.header("x-api-key", key);
    }
    builder.body(()).unwrap()
}

async fn send(service: &impl LimitedService, key: Option<&str>) -> Limited {
    within(service.clone().oneshot(request(key))).await.unwrap()
}

async fn body_text(response: Limited) -> String {
    let bytes = within(response.into_body().collect()).await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers.get(name).unwrap_or_else(|| panic!("{name} missing in {headers:?}")).to_str().unwrap()
}

fn number(headers: &HeaderMap, name: &str) -> u64 {
    header(headers, name).parse().unwrap_or_else(|_| panic!("{name} is not a number"))
}

/// Parses `"<name>";a=1;b=2` into the name and its parameters (simple sf-item, no escapes).
fn structured(value: &str) -> (String, Vec<(String, u64)>) {
    let mut parts = value.split(';');
    let name = parts.next().unwrap();
    let name = name.strip_prefix('"').and_then(|n| n.strip_suffix('"')).unwrap().to_owned();
    let params = parts
        .map(|param| {
            let (key, value) = param.split_once('=').unwrap();
            (key.to_owned(), value.parse().unwrap())
        })
        .collect();
    (name, params)
}

#[tokio::test]
async fn fourth_request_of_three_per_minute_is_429_with_every_header() {
    let node = start_node().await;
    let inner = Inner::default();
    let service = service(&node, per_minute(3), &inner);

    for expected_remaining in [2, 1, 0] {
        let response = send(&service, Some("client-a")).await;
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers();
        assert_eq!(number(headers, "x-ratelimit-limit"), 3);
        assert_eq!(number(headers, "x-ratelimit-remaining"), expected_remaining);
        assert!(number(headers, "x-ratelimit-reset") <= 60);
        assert!(!headers.contains_key("retry-after"), "an admission has no Retry-After");
        assert_eq!(header(headers, "ratelimit-policy"), r#""per-minute";q=3;w=60"#);
        assert_eq!(body_text(response).await, "hello");
    }
    assert_eq!(inner.calls(), 3);

    let response = send(&service, Some("client-a")).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let headers = response.headers();
    assert_eq!(number(headers, "x-ratelimit-limit"), 3);
    assert_eq!(number(headers, "x-ratelimit-remaining"), 0);
    let reset = number(headers, "x-ratelimit-reset");
    assert!((1..=60).contains(&reset), "reset {reset}");
    // One token refills every 20 s: the retry is at most that, and never 0.
    let retry = number(headers, "retry-after");
    assert!((1..=20).contains(&retry), "retry {retry}");
    let (name, params) = structured(header(headers, "ratelimit-policy"));
    assert_eq!(name, "per-minute");
    assert_eq!(params, [("q".to_owned(), 3), ("w".to_owned(), 60)]);
    let (name, params) = structured(header(headers, "ratelimit"));
    assert_eq!(name, "per-minute");
    assert_eq!(params, [("r".to_owned(), 0), ("t".to_owned(), reset)]);
    assert_eq!(header(headers, "content-type"), "text/plain; charset=utf-8");
    assert_eq!(body_text(response).await, "rate limit exceeded\n");
    assert_eq!(inner.calls(), 3, "a refused request never reaches the inner service");

    within(node.shutdown()).await;
}

#[tokio::test]
async fn a_request_without_a_key_passes_unlimited_and_without_headers() {
    let node = start_node().await;
    let inner = Inner::default();
    let service = service(&node, per_minute(1), &inner);

    for _ in 0..5 {
        let response = send(&service, None).await;
        assert_eq!(response.status(), StatusCode::OK);
        for name in RATE_HEADERS {
            assert!(!response.headers().contains_key(name), "{name} on an unlimited request");
        }
    }
    assert_eq!(inner.calls(), 5);
    assert_eq!(node.metrics().keys, 0, "no key was checked");

    within(node.shutdown()).await;
}

#[tokio::test]
async fn different_keys_are_limited_independently() {
    let node = start_node().await;
    let inner = Inner::default();
    let service = service(&node, per_minute(2), &inner);

    for _ in 0..2 {
        assert_eq!(send(&service, Some("a")).await.status(), StatusCode::OK);
    }
    assert_eq!(send(&service, Some("a")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    let response = send(&service, Some("b")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(number(response.headers(), "x-ratelimit-remaining"), 1, "b has its own bucket");
    assert_eq!(send(&service, Some("b")).await.status(), StatusCode::OK);
    assert_eq!(send(&service, Some("b")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&service, Some("a")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(inner.calls(), 4);

    within(node.shutdown()).await;
}

fn blocking_request(key: &str) -> Request<()> {
    let mut request = request(Some(key));
    request.headers_mut().insert("x-block", http::HeaderValue::from_static("1"));
    request
}

#[tokio::test]
async fn a_concurrency_lease_is_released_when_the_response_completes() {
    let node = start_node().await;
    let inner = Inner::default();
    let policy = policy("one-at-a-time", LimitSpec::new(Algorithm::Concurrency, 1, Duration::from_secs(60)));
    let service = service(&node, policy, &inner);

    let first = service.clone().oneshot(blocking_request("k"));
    tokio::pin!(first);
    // Drive the first request until the inner service holds it (it then waits on the gate).
    within(async {
        tokio::select! {
            _ = &mut first => panic!("the first request finished before its gate opened"),
            () = inner.entered.notified() => {}
        }
    })
    .await;
    let second = send(&service, Some("k")).await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS, "the lease is held");
    assert_eq!(number(second.headers(), "x-ratelimit-remaining"), 0);

    inner.gate.notify_one();
    let first = within(first).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(number(first.headers(), "x-ratelimit-limit"), 1);

    let third = send(&service, Some("k")).await;
    assert_eq!(third.status(), StatusCode::OK, "the first lease was released");
    let fourth = send(&service, Some("k")).await;
    assert_eq!(fourth.status(), StatusCode::OK, "so was the third's");
    assert_eq!(inner.calls(), 3);

    within(node.shutdown()).await;
}

#[tokio::test]
async fn a_concurrency_lease_is_released_when_the_response_future_is_dropped() {
    let node = start_node().await;
    let inner = Inner::default();
    let policy = policy("one-at-a-time", LimitSpec::new(Algorithm::Concurrency, 1, Duration::from_secs(60)));
    let service = service(&node, policy, &inner);

    let mut first = Box::pin(service.clone().oneshot(blocking_request("k")));
    within(async {
        tokio::select! {
            _ = &mut first => panic!("the first request finished before its gate opened"),
            () = inner.entered.notified() => {}
        }
    })
    .await;
    assert_eq!(send(&service, Some("k")).await.status(), StatusCode::TOO_MANY_REQUESTS);
    // The client went away: the future is dropped with the inner service still working.
    drop(first);
    assert_eq!(send(&service, Some("k")).await.status(), StatusCode::OK, "the lease was released");

    within(node.shutdown()).await;
}

/// On virtual time (a node on the in-memory network, tokio's clock paused): the delay is
/// measured exactly, whatever the machine does meanwhile.
#[tokio::test(start_paused = true)]
async fn a_shaper_delay_holds_the_request_before_the_inner_service() {
    let security = ClusterSecurity::from_secret(SECRET).unwrap();
    let start = NodeBuilder::new(NodeId(1)).security(security).memory_network(MemoryNetwork::new()).start();
    let node = within(start).await.unwrap();
    let inner = Inner::default();
    // 10 per second: hits queued behind the first are held 100 ms apart.
    let shaper = LimitSpec::new(Algorithm::LeakyBucketShaper, 10, Duration::from_secs(1)).with_burst(5);
    let service = service(&node, policy("shaped", shaper), &inner);

    let started = tokio::time::Instant::now();
    assert_eq!(send(&service, Some("k")).await.status(), StatusCode::OK);
    assert_eq!(started.elapsed(), Duration::ZERO, "the first hit is not held");
    let response = send(&service, Some("k")).await;
    assert_eq!(response.status(), StatusCode::OK);
    // The second hit is held until 100 ms (virtual) after the first was admitted.
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!(inner.calls(), 2);

    within(node.shutdown()).await;
}

#[tokio::test]
async fn a_node_shut_down_answers_503_without_calling_the_inner_service() {
    let node = start_node().await;
    let inner = Inner::default();
    let service = service(&node, per_minute(3), &inner);
    assert_eq!(send(&service, Some("a")).await.status(), StatusCode::OK);

    within(node.shutdown()).await;
    let response = send(&service, Some("a")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!response.headers().contains_key("retry-after"));
    assert_eq!(body_text(response).await, "rate limiter unavailable\n");
    assert_eq!(inner.calls(), 1);
    // A request that is not limited does not need the node.
    assert_eq!(send(&service, None).await.status(), StatusCode::OK);
    assert_eq!(inner.calls(), 2);
}
