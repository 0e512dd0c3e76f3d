//! A [`tower::Layer`] that rate-limits an HTTP service (axum, hyper, tonic) through a [`Node`]
//! (feature `tower`, on by default).
//!
//! [`RateLimitLayer`] wraps any `tower::Service<http::Request<B>, Response = http::Response<ResBody>>`.
//! For each request it extracts a key with a [`KeyExtractor`] (a closure
//! `Fn(&http::Request<B>) -> Option<Vec<u8>>`, or [`HeaderKey`] for a header's value) and checks one
//! hit of that key under its [`NamedPolicy`]:
//!
//! - **no key** (the extractor returned `None`): calls the inner service; no limit, no headers;
//! - **allowed**: calls the inner service and adds the [`crate::headers`] to its response;
//! - **allowed with a delay** (leaky-bucket shaper): waits the delay, then as above;
//! - **allowed with a lease** (concurrency limit): as above, and releases the lease
//!   ([`Node::release`]) when the inner service's response future completes **or is dropped**
//!   (client gone, timeout);
//! - **refused**: answers `429 Too Many Requests` with the headers (`Retry-After` when there is a
//!   time to wait) and a short text body; the inner service is not called;
//! - **no decision** ([`CheckError`]: the node is shutting down): answers `503 Service
//!   Unavailable`; the inner service is not called.
//!
//! A concurrency lease covers the inner service until it produced its response (its head), not the
//! streaming of a body after that. Errors of the inner service pass through unchanged.
//!
//! The response body is [`RateLimitBody<ResBody>`]: the inner service's body, or the layer's own
//! short text. `http_body_util::Either` is a `http_body::Body` whenever `ResBody` is one with `Bytes`
//! chunks, so the wrapped service still works with axum (`Router::layer`), hyper and tonic, without
//! asking `ResBody` for a constructor.
//!
//! Readiness is the inner service's: `poll_ready` delegates to it, and `call` moves the service
//! that was polled ready into the response future (leaving a fresh clone behind), the standard tower
//! way. A refused request therefore drops that readiness unused, which tower allows.
//!
//! # Example
//!
//! An axum router limited per API key (the full two-node program is
//! `crates/ratemesh/examples/axum_two_nodes.rs`):
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use ratemesh::{HeaderKey, NamedPolicy, Node, RateLimitLayer};
//! use ratemesh_core::{Algorithm, Limit, LimitSpec, Mode, Policy};
//!
//! fn app(node: Node) -> Result<Router, ratemesh_core::LimitError> {
//!     let limit = Limit::new(LimitSpec::new(Algorithm::TokenBucket, 100, Duration::from_secs(60)))?;
//!     let policy = Policy::new(limit, Mode::Exact);
//!     let policy = NamedPolicy::new("api", policy);
//!     Ok(Router::new()
//!         .route("/", get(|| async { "hello" }))
//!         .layer(RateLimitLayer::new(node, policy, HeaderKey::from_static("x-api-key"))))
//! }
//!
//! // Or any closure over the request: here, the first path segment.
//! fn by_tenant(node: Node, policy: NamedPolicy) -> Router {
//!     Router::new().route("/{tenant}", get(|| async { "hello" })).layer(RateLimitLayer::new(
//!         node,
//!         policy,
//!         |request: &http::Request<axum::body::Body>| {
//!             request.uri().path().split('/').nth(1).map(|tenant| tenant.as_bytes().to_vec())
//!         },
//!     ))
//! }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use ratemesh_core::LeaseId;
use tower::{Layer, Service};

use crate::headers::insert_headers;
use crate::node::{CheckError, NamedPolicy, Node};

/// The response body of a [`RateLimitService`]: the inner service's body (`Left`), or the
/// layer's own short text for a 429 or 503 (`Right`).
pub type RateLimitBody<B> = Either<B, Full<Bytes>>;

/// The body of a refused request's 429.
const REFUSED_BODY: &str = "rate limit exceeded\n";
/// The body of a 503 when the node cannot decide.
const UNAVAILABLE_BODY: &str = "rate limiter unavailable\n";

/// Finds the key a request is limited by. `None`: the request is not limited.
///
/// Implemented by every closure `Fn(&http::Request<B>) -> Option<Vec<u8>>` and by [`HeaderKey`].
pub trait KeyExtractor<B> {
    /// The key of `request`, or `None` to let it pass unlimited.
    fn key(&self, request: &Request<B>) -> Option<Vec<u8>>;
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<Vec<u8>>,
{
    fn key(&self, request: &Request<B>) -> Option<Vec<u8>> {
        self(request)
    }
}

/// Keys requests by the value of one header (an API key, a tenant id set by a gateway). A request
/// without the header is not limited; when the header repeats, its first value is the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys by header `name`.
    pub fn new(name: HeaderName) -> HeaderKey {
        HeaderKey { name }
    }

    /// Keys by the header named `name`, a lowercase literal (e.g. `"x-api-key"`). Panics, at the
    /// call, if `name` is not a valid lowercase header name, like [`HeaderName::from_static`].
    pub fn from_static(name: &'static str) -> HeaderKey {
        HeaderKey { name: HeaderName::from_static(name) }
    }

    /// The header's name.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    fn key(&self, request: &Request<B>) -> Option<Vec<u8>> {
        request.headers().get(&self.name).map(|value| value.as_bytes().to_vec())
    }
}

/// What every service of one layer shares.
struct Limiter<K> {
    node: Node,
    policy: NamedPolicy,
    extractor: K,
}

/// A [`tower::Layer`] that limits requests by a key under one policy. See the [module
/// documentation](self) for the semantics.
pub struct RateLimitLayer<K> {
    limiter: Arc<Limiter<K>>,
}

impl<K> RateLimitLayer<K> {
    /// Limits requests by the key `extractor` finds, one hit per request under `policy`, checked
    /// on `node`.
    pub fn new(node: Node, policy: NamedPolicy, extractor: K) -> RateLimitLayer<K> {
        RateLimitLayer { limiter: Arc::new(Limiter { node, policy, extractor }) }
    }

    /// The policy requests are checked under.
    pub fn policy(&self) -> &NamedPolicy {
        &self.limiter.policy
    }
}

// Manual: cloning shares the limiter, so `K` (often a closure) need not be `Clone`.
impl<K> Clone for RateLimitLayer<K> {
    fn clone(&self) -> Self {
        RateLimitLayer { limiter: self.limiter.clone() }
    }
}

impl<K> fmt::Debug for RateLimitLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("node", &self.limiter.node)
            .field("policy", &self.limiter.policy.name())
            .finish_non_exhaustive()
    }
}

impl<S, K> Layer<S> for RateLimitLayer<K> {
    type Service = RateLimitService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService { inner, limiter: self.limiter.clone() }
    }
}

/// The service made by [`RateLimitLayer`]: `inner`, limited. See the [module
/// documentation](self) for the semantics.
pub struct RateLimitService<S, K> {
    inner: S,
    limiter: Arc<Limiter<K>>,
}

impl<S, K> RateLimitService<S, K> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, K> Clone for RateLimitService<S, K> {
    fn clone(&self) -> Self {
        RateLimitService { inner: self.inner.clone(), limiter: self.limiter.clone() }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for RateLimitService<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("policy", &self.limiter.policy.name())
            .finish_non_exhaustive()
    }
}

impl<S, K, B, ResBody> Service<Request<B>> for RateLimitService<S, K>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    K: KeyExtractor<B> + Send + Sync + 'static,
    B: Send + 'static,
    ResBody: 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    // Boxed: the future awaits `Node::check`, an `async fn` whose future has no name. axum boxes
    // every handler future anyway.
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service polled ready is the one to call; the clone left behind is polled anew.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let key = self.limiter.extractor.key(&request);
        let limiter = self.limiter.clone();
        Box::pin(limit(limiter, inner, key, request))
    }
}

async fn limit<S, K, B, ResBody>(
    limiter: Arc<Limiter<K>>,
    mut inner: S,
    key: Option<Vec<u8>>,
    request: Request<B>,
) -> Result<Response<RateLimitBody<ResBody>>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    let Some(key) = key else {
        return Ok(inner.call(request).await?.map(Either::Left));
    };
    let decision = match limiter.node.check(&limiter.policy, &key, 1).await {
        Ok(decision) => decision,
        Err(CheckError::ShutDown | CheckError::Joining | CheckError::WouldWait) => {
            // `WouldWait` comes only from `check_now`; matched so that a new variant is a compile error.
            return Ok(text_response(StatusCode::SERVICE_UNAVAILABLE, UNAVAILABLE_BODY));
        }
    };
    if !decision.allowed {
        let mut response = text_response(StatusCode::TOO_MANY_REQUESTS, REFUSED_BODY);
        insert_headers(response.headers_mut(), &limiter.policy, &decision);
        return Ok(response);
    }
    // Taken before any await, so the lease is released on every path, including this future
    // being dropped while it waits.
    let _lease = decision.lease.map(|lease| LeaseGuard { limiter: limiter.clone(), key, lease });
    if !decision.delay.is_zero() {
        // The shaper admitted the request for later: holding it is what shaping means.
        tokio::time::sleep(decision.delay).await;
    }
    let mut response = inner.call(request).await?.map(Either::Left);
    insert_headers(response.headers_mut(), &limiter.policy, &decision);
    Ok(response)
}

fn text_response<B>(status: StatusCode, text: &'static str) -> Response<RateLimitBody<B>> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from_static(text.as_bytes()))));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// Releases a concurrency lease when dropped: when the response future completes, fails, or is
/// dropped unfinished.
struct LeaseGuard<K> {
    limiter: Arc<Limiter<K>>,
    key: Vec<u8>,
    lease: LeaseId,
}

impl<K> Drop for LeaseGuard<K> {
    fn drop(&mut self) {
        // Fails only when the node is shutting down, which ends every lease anyway (and a lease
        // never released expires after the policy's period).
        let policy = &self.limiter.policy;
        let _ = self.limiter.node.release(policy.policy(), policy.key(&self.key), self.lease);
    }
}
