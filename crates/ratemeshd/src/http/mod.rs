//! The HTTP API (axum 0.8, HTTP/1.1), behind a front (`Front`) that answers `POST /v1/check`
//! on its own and hands every connection that asks anything else to hyper and this router.
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/check` | 200, [`CheckResponse`](body::CheckResponse) JSON and the rate-limit headers (a negative `cost` is a refund) |
//! | `POST /v1/check/batch` | 200, a JSON array of [`CheckResponse`](body::CheckResponse), in request order |
//! | `POST /v1/check/all` | 200, `{"allowed": bool, "results": [CheckResponse...]}`: all or nothing ([`ratemesh::Node::check_all`]) |
//! | `POST /v1/charge` | 200, [`CheckResponse`](body::CheckResponse) for the next request after `cost` hits applied unconditionally |
//! | `POST /v1/release` | 200, `{"released": true}` (ended here), `false` (this node owns the key and the lease was not held: released already or expired), or `null` with `"owner"` (sent to the owning member) |
//! | `GET /v1/auth` | 200 when allowed, 429 when not, with the rate-limit headers (nginx `auth_request`, Traefik forwardAuth); 400 for a concurrency policy (a subrequest cannot release its lease) |
//! | `GET /metrics` | Prometheus (OpenMetrics) text |
//! | `GET /healthz` | 200 while the process serves |
//! | `GET /readyz` | 200 when ready (in its ring and, with `cluster.seeds`, another member live: `crate::daemon`), 503 with the reason otherwise |
//! | `GET /v1/cluster` | members, statuses, ring shares |
//! | `GET /v1/policies` | the configured policies |
//! | `GET /v1/top?policy=NAME&n=20&by=refused` | the `n` (1 to [`TOP_N_MAX`], default 20) heaviest keys of a named policy by `refused` (default) or `demand` hits over the last minute at most, merged from every live member; the estimates' error bound, the window, the members that answered and those missing |
//! | `GET /v1/audit?policy=NAME&n=10` | the audit, cluster-wide like `/v1/top`: per policy and window, what the cluster admitted over the last minute against one ideal limiter of the same arrivals (every live member's owned keys added), and the `n` (1 to [`TOP_N_MAX`], default 10) keys admitted most above the ideal; both parameters optional, an unknown policy is 404 |
//! | `GET /v1/stats` | this node: allowed and refused decisions per policy in 5 s slots over the last 5 minutes, sync lag, peer round-trip times, bytes held by the top-keys sketches |
//! | `GET /v1/rlqs` | this node's RLQS state: streams, fleet rounds and fallbacks, the groups whose keys it owns, and its groups (the first 100 by policy and key) with the policy's rate, this node's part and what its Envoys are assigned |
//! | `GET /` | the dashboard: one self-contained HTML page (no external assets) that polls `/v1/cluster`, `/v1/stats`, `/v1/policies`, `/v1/top` and `/v1/rlqs` (its RLQS panel shows when the node serves RLQS) |
//! | `PUT`, `DELETE /v1/overrides/{policy}/{key}` | a live override set or deleted cluster-wide (`crate::overrides`; `Authorization: Bearer` the `[auth] admin_token`: 403 without one configured, 401 when missing or wrong) |
//! | `GET /v1/overrides/{policy}` | the live overrides of a policy |
//!
//! Errors are JSON [`ErrorResponse`]s: 400 names the field, 404 an unknown policy or path, 405 a
//! wrong method, 408 a body not received within [`BODY_READ_TIMEOUT`], 413 a body over
//! `limits.http_body_bytes_max`, 503 overload (more than `limits.http_in_flight_max` requests
//! in flight: shed at once, never queued), decisions not made within [`REQUEST_TIMEOUT`], or
//! shutdown. Request bodies are read as JSON whatever their `Content-Type` (so that `curl -d`
//! works).
//!
//! # Bounds
//!
//! Every request holds an in-flight permit while it is served, from one of two pools: the API's
//! routes (`/v1/check`, `/v1/check/batch`, `/v1/check/all`, `/v1/charge`, `/v1/release`,
//! `/v1/auth`, and unknown paths) from
//! [`Daemon::http_permits`], the observation routes (`/metrics`, `/readyz`, `/v1/cluster`,
//! `/v1/policies`) from the small [`Daemon::observe_permits`], so that an overloaded API stays
//! observable and scrapes cannot crowd out checks. `/healthz` (liveness: it does nothing) needs
//! none. A request's body is read before its permit is taken (a client trickling a body in holds
//! no permit), within [`BODY_READ_TIMEOUT`] (then 408); a permit is held for at most
//! [`REQUEST_TIMEOUT`]: decisions that take longer (a batch of exact-mode checks against an unreachable
//! owner, each waiting for its forward timeout) get 503. Connections themselves are bounded by
//! `crate::serve` (`limits.connections_max`, [`HEADER_READ_TIMEOUT`] for a request's head, which
//! is also how long a kept-alive connection may sit idle) and `crate::listener` (a write the
//! client does not take within [`crate::listener::WRITE_TIMEOUT`] closes the connection: slow
//! readers cannot hold slots).
//!
//! # `GET /v1/auth` and proxies
//!
//! The key is the `key` query parameter, else the `[auth] key_header` request header, else
//! `X-Real-IP`, else the **last** `X-Forwarded-For` entry (the one the nearest proxy appended:
//! the entries before it are whatever the client sent). These headers are trusted as they come,
//! so the proxy in front must set them, replacing the client's values (nginx `proxy_set_header`),
//! and likewise the policy header: see [`crate::config::AuthSection`].

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use prometheus_client::metrics::gauge::Gauge;
use ratemesh::{AdjustError, CheckError};
use serde::Serialize;

use crate::config::Bounds;
use crate::daemon::Daemon;
use crate::policy::PolicyTable;

mod admin;
pub mod body;
mod decide;
pub mod envoy_ratelimit;
mod front;
mod observe;

pub(crate) use front::Front;

pub use observe::{AUDIT_N_DEFAULT, TOP_BY_DEFAULT, TOP_N_DEFAULT, TOP_N_MAX};

use body::{BodyError, ErrorResponse};

/// The JSON content type of every answer but `/metrics`.
const JSON: &str = "application/json";

/// How long a request's head (request line and headers) may take to arrive, counted from the
/// moment the connection waits for it: a client that opens a connection, or keeps an idle one
/// alive, and sends nothing (or sends it a byte at a time) is disconnected after this, freeing
/// its connection slot. Enforced by the connection's HTTP/1 server (`crate::serve`).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a request body may take to arrive once its head did. A check's body is a few hundred
/// bytes, sent with its head; a client trickling its body would otherwise hold one of the
/// in-flight permits (a slow-body attack starving the API).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the decisions of one request (a check, a batch, an auth request) may take. A
/// decision is local or one round trip to the key's owner, bounded by the node's forward
/// timeout; a batch of many exact-mode checks against an unreachable owner would wait for each
/// in turn while holding an in-flight permit. Past this the answer is 503 (ask another node);
/// the hits already taken by earlier checks of a batch stay taken.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The API's time bounds. The defaults are the constants of this module (and the listener's
/// write timeout); tests shorten them to see them work without waiting seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// [`HEADER_READ_TIMEOUT`] (used by the connection server, `crate::serve`).
    pub header_read: Duration,
    /// [`BODY_READ_TIMEOUT`].
    pub body_read: Duration,
    /// [`REQUEST_TIMEOUT`].
    pub request: Duration,
    /// [`crate::listener::WRITE_TIMEOUT`]: a write the client does not take within it closes
    /// the connection (used by the listener).
    pub write: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read: HEADER_READ_TIMEOUT,
            body_read: BODY_READ_TIMEOUT,
            request: REQUEST_TIMEOUT,
            write: crate::listener::WRITE_TIMEOUT,
        }
    }
}

/// What the handlers share: the daemon and the time bounds.
#[derive(Debug)]
struct Api {
    daemon: Arc<Daemon>,
    timeouts: Timeouts,
}

/// The handlers' state.
type ApiState = State<Arc<Api>>;

/// The axum router of the API over `daemon`, with the default [`Timeouts`].
pub fn router(daemon: Arc<Daemon>) -> Router {
    router_with(daemon, Timeouts::default())
}

/// The axum router of the API over `daemon`, with `timeouts` (only `body_read` and `request`
/// matter here; `header_read` is the connection server's).
pub fn router_with(daemon: Arc<Daemon>, timeouts: Timeouts) -> Router {
    let envoy_ratelimit = daemon.current().0.rls.envoy_ratelimit.is_some();
    let api = Arc::new(Api { daemon, timeouts });
    let router = match envoy_ratelimit {
        true => Router::new()
            .route("/healthcheck", get(envoy_ratelimit::healthcheck))
            .route("/json", post(envoy_ratelimit::json))
            .route("/rlconfig", get(envoy_ratelimit::rlconfig)),
        false => Router::new(),
    };
    router
        .route("/v1/check", post(decide::check))
        .route("/v1/check/batch", post(decide::check_batch))
        .route("/v1/check/all", post(decide::check_all))
        .route("/v1/charge", post(decide::charge))
        .route("/v1/overrides/{policy}", get(admin::list_overrides))
        .route("/v1/overrides/{policy}/{key}", put(admin::put_override).delete(admin::delete_override))
        .route("/v1/release", post(decide::release))
        .route("/v1/auth", get(decide::auth))
        .route("/metrics", get(observe::metrics))
        .route("/healthz", get(observe::healthz))
        .route("/readyz", get(observe::readyz))
        .route("/v1/cluster", get(observe::cluster))
        .route("/v1/policies", get(observe::policies))
        .route("/v1/top", get(observe::top))
        .route("/v1/audit", get(observe::audit))
        .route("/v1/rlqs", get(observe::rlqs))
        .route("/v1/stats", get(observe::stats))
        .route("/", get(observe::dashboard))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(from_fn_with_state(Arc::clone(&api), admit))
        .with_state(api)
}

/// The metrics label of a request's route: one of the fixed paths, or `other` (bounded
/// cardinality: never the client's path).
fn route_label(path: &str) -> &'static str {
    match path {
        "/v1/check" => "check",
        "/v1/check/batch" => "check_batch",
        "/v1/check/all" => "check_all",
        "/v1/charge" => "charge",
        "/v1/release" => "release",
        "/v1/auth" => "auth",
        "/metrics" => "metrics",
        "/healthz" => "healthz",
        "/readyz" => "readyz",
        "/v1/cluster" => "cluster",
        "/v1/policies" => "policies",
        "/v1/top" => "top",
        "/v1/audit" => "audit",
        "/v1/rlqs" => "rlqs",
        "/v1/stats" => "stats",
        "/" => "dashboard",
        "/healthcheck" => "healthcheck",
        "/json" => "json",
        "/rlconfig" => "rlconfig",
        // Never the policy or the key of the path.
        p if p.starts_with("/v1/overrides/") => "overrides",
        _ => "other",
    }
}

/// Decrements the in-flight gauge when the request ends, however it ends (a client that
/// disconnects drops the handler's future).
struct InFlight<'a>(&'a Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Load shedding and request metrics: a request runs only with a permit of its route's pool
/// (see the module documentation); without one it gets 503 at once (no queue, so that overload
/// shows as fast refusals the client can retry elsewhere, not as growing latency). `/healthz`
/// needs no permit.
async fn admit(State(api): ApiState, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let daemon = &api.daemon;
    let route = route_label(request.uri().path());
    let pool = match route {
        "healthz" => None,
        "metrics" | "readyz" | "cluster" | "policies" | "top" | "audit" | "stats" | "dashboard" => {
            Some(daemon.observe_permits())
        }
        _ => Some(daemon.http_permits()),
    };
    // The body first, without a permit: a client trickling its body in must not hold one of the
    // permits that decisions need (a few hundred such connections would shed every check). The
    // fast path (`front`) reads its bodies before its permit too.
    let request = match pool {
        Some(_) => match buffer_body(&api, request).await {
            Ok(request) => request,
            Err(error) => {
                let response = error.into_response();
                daemon.metrics().record_http(route, response.status().as_u16(), started.elapsed());
                return response;
            }
        },
        None => request,
    };
    let response = match pool.map(|pool| pool.try_acquire()).transpose() {
        Err(_) => {
            daemon.metrics().record_shed("http", route);
            ApiError::overloaded().into_response()
        }
        // The permit (if any) is held until the response is ready.
        Ok(_permit) => {
            let gauge = daemon.metrics().http_in_flight();
            gauge.inc();
            let _in_flight = InFlight(gauge);
            next.run(request).await
        }
    };
    daemon.metrics().record_http(route, response.status().as_u16(), started.elapsed());
    response
}

/// A JSON answer.
fn json_response(status: StatusCode, value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (status, [(CONTENT_TYPE, HeaderValue::from_static(JSON))], body).into_response(),
        // Serializing plain data structures cannot fail; say so rather than panic if it did.
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("serializing the answer: {e}")).into_response(),
    }
}

/// A JSON error answer.
fn error(status: StatusCode, message: impl Into<String>, field: Option<&str>) -> Response {
    ApiError::new(status, message, field).into_response()
}

/// A refused request: its status and [`ErrorResponse`] JSON.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    body: ErrorResponse,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>, field: Option<&str>) -> ApiError {
        ApiError { status, body: ErrorResponse { error: message.into(), field: field.map(str::to_owned) } }
    }

    /// 503: no in-flight permit was free (shed at once, never queued).
    fn overloaded() -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded: too many requests in flight, retry", None)
    }

    /// 408: the body did not arrive within `timeout`.
    fn body_timeout(timeout: Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("body: not received within {timeout:?}"),
            Some("body"),
        )
    }

    fn bad_request(field: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, format!("{field}: {message}"), Some(field))
    }
}

/// What [`query_params`] does with a parameter it was not asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unknown {
    /// A 400 naming it (an API's own query).
    Refuse,
    /// Skipped (a proxy's subrequest may carry its own parameters).
    Ignore,
}

/// The query parameters `names` of `uri`, percent-decoded (`+` as a space), each given at most
/// once. A value that is not UTF-8 once decoded is refused, not decoded lossily (two byte strings
/// would otherwise read as one); so is a repeated parameter, and an unknown one if `unknown` says
/// so: a 400 naming it.
fn query_params<const N: usize>(
    uri: &Uri,
    names: [&str; N],
    unknown: Unknown,
) -> Result<[Option<String>; N], ApiError> {
    let mut values: [Option<String>; N] = std::array::from_fn(|_| None);
    for pair in uri.query().unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let Some(slot) = names.iter().position(|known| *known == name) else {
            if unknown == Unknown::Ignore {
                continue;
            }
            let name: String = name.chars().take(32).collect();
            return Err(ApiError::bad_request(&name, format!("unknown parameter ({})", names.join(", "))));
        };
        if values[slot].is_some() {
            return Err(ApiError::bad_request(name, "given twice"));
        }
        let spaced = value.replace('+', " ");
        let decoded = percent_encoding::percent_decode_str(&spaced)
            .decode_utf8()
            .map_err(|_| ApiError::bad_request(name, "not valid UTF-8 once percent-decoded"))?;
        values[slot] = Some(decoded.into_owned());
    }
    Ok(values)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.status, &self.body)
    }
}

impl From<BodyError> for ApiError {
    fn from(error: BodyError) -> Self {
        let status = StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
        ApiError { status, body: ErrorResponse::from(&error) }
    }
}

impl From<AdjustError> for ApiError {
    fn from(error: AdjustError) -> Self {
        match error {
            // Validation refuses these before they reach the node.
            AdjustError::Concurrency => ApiError::bad_request("policy", error),
            _ => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("{error}: ask another node"), None),
        }
    }
}

impl From<CheckError> for ApiError {
    fn from(error: CheckError) -> Self {
        // Every check error means this node cannot decide now (shutting down): the client
        // should ask another node.
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("{error}: ask another node"), None)
    }
}

/// Reads the body, at most `max_bytes` (a larger one is refused with 413 before it is read
/// when its length is announced, else as soon as the bound is passed), within `timeout` (408).
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    max_bytes: usize,
    timeout: Duration,
) -> Result<Bytes, ApiError> {
    let too_large = |len: Option<u64>| {
        let len = len.map_or_else(|| format!("more than {max_bytes} bytes"), |len| format!("{len} bytes"));
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body is {len}: at most {max_bytes} bytes are accepted (limits.http_body_bytes_max)"),
            Some("body"),
        )
    };
    let announced = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|len| len > max_bytes as u64) {
        return Err(too_large(announced));
    }
    let read = tokio::time::timeout(timeout, axum::body::to_bytes(body, max_bytes)).await;
    let Ok(read) = read else {
        return Err(ApiError::body_timeout(timeout));
    };
    read.map_err(|e| {
        if e.into_inner().is::<http_body_util::LengthLimitError>() {
            too_large(None)
        } else {
            ApiError::bad_request("body", "could not be read")
        }
    })
}

/// `request` with its body read into memory ([`read_body`]: bounded, within the body timeout).
async fn buffer_body(api: &Api, request: Request) -> Result<Request, ApiError> {
    let (parts, body) = request.into_parts();
    let (config, _) = api.daemon.current();
    let bytes =
        read_body(&parts.headers, body, config.limits.http_body_bytes_max, api.timeouts.body_read).await?;
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// Reads the body and parses it with `parse` (one of [`body`]'s `parse_*`), against one
/// snapshot of the configuration's bounds and its policies.
async fn parse_body<T>(
    api: &Api,
    headers: &HeaderMap,
    body: Body,
    parse: impl FnOnce(&[u8], &PolicyTable, &Bounds) -> Result<T, BodyError>,
) -> Result<T, ApiError> {
    let (config, policies) = api.daemon.current();
    let bytes = read_body(headers, body, config.limits.http_body_bytes_max, api.timeouts.body_read).await?;
    Ok(parse(&bytes, &policies, &config.limits)?)
}

/// Runs a request's decisions, at most `timeout` (then 503: this node cannot decide in time,
/// ask another one). Dropping the decisions' future at the deadline frees the request's permit.
async fn within<T>(
    timeout: Duration,
    decide: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    tokio::time::timeout(timeout, decide).await.unwrap_or_else(|_| {
        let message = format!("no decision within {timeout:?}: ask another node");
        Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message, None))
    })
}

async fn not_found(method: Method, uri: Uri) -> Response {
    error(StatusCode::NOT_FOUND, format!("no route {method} {}", uri.path()), None)
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    error(StatusCode::METHOD_NOT_ALLOWED, format!("method {method} not allowed on {}", uri.path()), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn decisions_past_the_request_deadline_are_503() {
        let stuck = within(Duration::from_millis(20), std::future::pending::<Result<(), ApiError>>());
        let error = stuck.await.expect_err("timed out");
        assert_eq!(error.status, StatusCode::SERVICE_UNAVAILABLE, "{error:?}");
        assert!(error.body.error.contains("no decision within"), "{error:?}");
        let quick = within(Duration::from_secs(10), async { Ok::<_, ApiError>(7) });
        assert_eq!(quick.await.expect("in time"), 7);
    }
}
