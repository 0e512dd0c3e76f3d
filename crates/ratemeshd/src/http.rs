//! The HTTP API (axum 0.8, HTTP/1.1).
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/check` | 200, [`CheckResponse`] JSON and the rate-limit headers (a negative `cost` is a refund) |
//! | `POST /v1/check/batch` | 200, a JSON array of [`CheckResponse`], in request order |
//! | `POST /v1/check/all` | 200, `{"allowed": bool, "results": [CheckResponse...]}`: all or nothing ([`ratemesh::Node::check_all`]) |
//! | `POST /v1/charge` | 200, [`CheckResponse`] for the next request after `cost` hits applied unconditionally |
//! | `POST /v1/release` | 200, `{"released": true}` (ended here), `false` (this node owns the key and the lease was not held: released already or expired), or `null` with `"owner"` (sent to the owning member) |
//! | `GET /v1/auth` | 200 when allowed, 429 when not, with the rate-limit headers (nginx `auth_request`, Traefik forwardAuth) |
//! | `GET /metrics` | Prometheus (OpenMetrics) text |
//! | `GET /healthz` | 200 while the process serves |
//! | `GET /readyz` | 200 when ready (in its ring and, with `cluster.seeds`, another member live: `crate::daemon`), 503 with the reason otherwise |
//! | `GET /v1/cluster` | members, statuses, ring shares |
//! | `GET /v1/policies` | the configured policies |
//! | `GET /v1/top?policy=NAME&n=20&by=refused` | the `n` (1 to [`TOP_N_MAX`], default 20) heaviest keys of a named policy by `refused` (default) or `demand` hits over the last minute at most, merged from every live member; the estimates' error bound, the window, the members that answered and those missing |
//! | `GET /v1/stats` | this node: allowed and refused decisions per policy in 5 s slots over the last 5 minutes, sync lag, peer round-trip times, bytes held by the top-keys sketches |
//! | `GET /` | the dashboard: one self-contained HTML page (no external assets) that polls `/v1/cluster`, `/v1/stats`, `/v1/policies` and `/v1/top` |
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
//! none. A permit is held for at most [`BODY_READ_TIMEOUT`] + [`REQUEST_TIMEOUT`]: a slow body
//! gets 408, and decisions that take longer (a batch of exact-mode checks against an unreachable
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
use axum::extract::Path;
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use prometheus_client::metrics::gauge::Gauge;
use ratemesh::headers::insert_headers_for;
use ratemesh::{AdjustError, CheckError, Released, TopBy};
use ratemesh_core::{Algorithm, Decision};
use serde::Serialize;
use serde_json::json;

use crate::config::{Bounds, Rule, fallback_name, mode_name};
use crate::daemon::{AdminError, Daemon, RING_PROBES};
use crate::metrics::{CONTENT_TYPE as METRICS_CONTENT_TYPE, status_name};
use crate::overrides::{OVERRIDE_KEY_BYTES_MAX, OverrideError};
use crate::policy::{
    BodyError, CheckBody, CheckResponse, ErrorResponse, PolicyTable, Target, ValidCheck, parse_charge,
    parse_check, parse_check_all, parse_check_batch, parse_release,
};

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
    let api = Arc::new(Api { daemon, timeouts });
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/check/batch", post(check_batch))
        .route("/v1/check/all", post(check_all))
        .route("/v1/charge", post(charge))
        .route("/v1/overrides/{policy}", get(list_overrides))
        .route("/v1/overrides/{policy}/{key}", put(put_override).delete(delete_override))
        .route("/v1/release", post(release))
        .route("/v1/auth", get(auth))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/cluster", get(cluster))
        .route("/v1/policies", get(policies))
        .route("/v1/top", get(top))
        .route("/v1/stats", get(stats))
        .route("/", get(dashboard))
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
        "/v1/stats" => "stats",
        "/" => "dashboard",
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
        "metrics" | "readyz" | "cluster" | "policies" | "top" | "stats" | "dashboard" => {
            Some(daemon.observe_permits())
        }
        _ => Some(daemon.http_permits()),
    };
    let response = match pool.map(|pool| pool.try_acquire()).transpose() {
        Err(_) => {
            daemon.metrics().record_shed("http", route);
            error(StatusCode::SERVICE_UNAVAILABLE, "overloaded: too many requests in flight, retry", None)
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

    fn bad_request(field: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, format!("{field}: {message}"), Some(field))
    }
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
        let len = len.map_or_else(|| "more than".to_owned(), |len| format!("{len} bytes,"));
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body is {len} at most {max_bytes} bytes are accepted (limits.http_body_bytes_max)"),
            Some("body"),
        )
    };
    let announced = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|len| len > max_bytes as u64) {
        return Err(too_large(announced));
    }
    let read = tokio::time::timeout(timeout, axum::body::to_bytes(body, max_bytes)).await;
    let Ok(read) = read else {
        let message = format!("body: not received within {timeout:?}");
        return Err(ApiError::new(StatusCode::REQUEST_TIMEOUT, message, Some("body")));
    };
    read.map_err(|e| {
        if e.into_inner().is::<http_body_util::LengthLimitError>() {
            too_large(None)
        } else {
            ApiError::bad_request("body", "could not be read")
        }
    })
}

/// Reads the body and parses it with `parse` (one of `crate::policy`'s `parse_*`), against one
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

/// The answer to one decision: the JSON and, unless the policy is unlimited, the headers.
fn decision_response(status: StatusCode, target: &Target, decision: &Decision) -> Response {
    let mut response = json_response(status, &check_response(target, decision));
    if let Some(policy) = target.policy() {
        insert_headers_for(response.headers_mut(), target.label(), policy.limit.spec().period, decision);
    }
    response
}

/// The JSON of an unlimited policy's admission: `limit` and `remaining` are `u64::MAX`.
fn unlimited_response() -> CheckResponse {
    CheckResponse {
        allowed: true,
        limit: u64::MAX,
        remaining: u64::MAX,
        reset_after_ms: 0,
        retry_after_ms: None,
        delay_ms: None,
        lease: None,
    }
}

/// The JSON of one decision.
fn check_response(target: &Target, decision: &Decision) -> CheckResponse {
    match target.policy() {
        Some(policy) => CheckResponse::new(decision, policy.limit.algorithm(), target.shadow_mode()),
        None => unlimited_response(),
    }
}

async fn check(State(api): ApiState, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let valid = parse_body(&api, &headers, body, parse_check).await?;
    let decision = within(api.timeouts.request, decide(&api, &valid)).await?;
    Ok(decision_response(StatusCode::OK, &valid.target, &decision))
}

/// One check's decision: a refund when its cost was negative.
async fn decide(api: &Api, check: &ValidCheck) -> Result<Decision, ApiError> {
    match check.refund {
        true => Ok(api.daemon.refund(&check.target, check.key, check.cost).await?),
        false => Ok(api.daemon.check(&check.target, check.key, &check.key_text, check.cost).await?),
    }
}

async fn charge(State(api): ApiState, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let valid = parse_body(&api, &headers, body, parse_charge).await?;
    let decision = within(api.timeouts.request, async {
        Ok(api.daemon.charge(&valid.target, valid.key, valid.cost).await?)
    })
    .await?;
    Ok(decision_response(StatusCode::OK, &valid.target, &decision))
}

/// The body of `PUT /v1/overrides/{policy}/{key}`: the override's limit (each defaults to the
/// policy's).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct OverrideBody {
    limit: Option<u64>,
    burst: Option<u64>,
    period_ms: Option<u64>,
}

/// Refuses an admin request without the configured token (`Authorization: Bearer <token>`):
/// 403 when none is configured (the admin API is off), 401 when it is missing or wrong.
fn authorize(api: &Api, headers: &HeaderMap) -> Result<(), ApiError> {
    let (config, _) = api.daemon.current();
    let Some(token) = &config.auth.admin_token else {
        let message = "the admin API is off: set [auth] admin_token (or RATEMESH_AUTH_ADMIN_TOKEN)";
        return Err(ApiError::new(StatusCode::FORBIDDEN, message, Some("authorization")));
    };
    let given = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let given = given.and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
    // Compared in constant time for equal lengths: the token is not guessed byte by byte.
    let expected = token.expose().as_bytes();
    let same = given.len() == expected.len()
        && given.bytes().zip(expected).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0;
    match same {
        true => Ok(()),
        false => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authorization: missing or wrong admin token (Authorization: Bearer <token>)",
            Some("authorization"),
        )),
    }
}

impl From<AdminError> for ApiError {
    fn from(error: AdminError) -> Self {
        match &error {
            AdminError::UnknownPolicy(_) => {
                ApiError::new(StatusCode::NOT_FOUND, error.to_string(), Some("policy"))
            }
            AdminError::Invalid { field, .. } => {
                let field = field.clone();
                ApiError::new(StatusCode::BAD_REQUEST, error.to_string(), Some(&field))
            }
            AdminError::Table(OverrideError::Full) => {
                ApiError::new(StatusCode::CONFLICT, error.to_string(), None)
            }
            AdminError::Table(_) => ApiError::bad_request("key", error),
        }
    }
}

/// The path's key, checked like a check's.
fn override_key(key: &str) -> Result<(), ApiError> {
    match key.len() {
        0 => Err(ApiError::bad_request("key", "must not be empty")),
        n if n > OVERRIDE_KEY_BYTES_MAX => Err(ApiError::bad_request(
            "key",
            format!("{n} bytes, at most {OVERRIDE_KEY_BYTES_MAX} for a live override"),
        )),
        _ => Ok(()),
    }
}

async fn put_override(
    State(api): ApiState,
    Path((policy, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    authorize(&api, &headers)?;
    override_key(&key)?;
    let parse = |bytes: &[u8], _: &PolicyTable, bounds: &Bounds| {
        crate::policy::from_json_body::<OverrideBody>(bytes, bounds)
    };
    let values = parse_body(&api, &headers, body, parse).await?;
    let written =
        api.daemon.set_override(&policy, &key, Some((values.limit, values.burst, values.period_ms)))?;
    Ok(json_response(StatusCode::OK, &written))
}

async fn delete_override(
    State(api): ApiState,
    Path((policy, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authorize(&api, &headers)?;
    override_key(&key)?;
    let written = api.daemon.set_override(&policy, &key, None)?;
    Ok(json_response(StatusCode::OK, &written))
}

async fn list_overrides(State(api): ApiState, Path(policy): Path<String>) -> Result<Response, ApiError> {
    let overrides = api.daemon.overrides_of(&policy)?;
    Ok(json_response(StatusCode::OK, &json!({ "policy": policy, "overrides": overrides })))
}

/// The answer of `POST /v1/check/all`: whether the group passed, and one answer per check.
#[derive(Serialize)]
struct GroupResponse {
    allowed: bool,
    results: Vec<CheckResponse>,
}

async fn check_all(State(api): ApiState, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let checks = parse_body(&api, &headers, body, parse_check_all).await?;
    let (allowed, decisions) =
        within(api.timeouts.request, async { Ok(api.daemon.check_all(&checks).await?) }).await?;
    let results = checks.iter().zip(&decisions).map(|(check, d)| check_response(&check.target, d)).collect();
    Ok(json_response(StatusCode::OK, &GroupResponse { allowed, results }))
}

async fn check_batch(State(api): ApiState, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let checks = parse_body(&api, &headers, body, parse_check_batch).await?;
    // In request order, one after the other: checks of the same key in one batch are decided in
    // the order given (at most `batch_len_max` of them), all within one request deadline.
    let answers = within(api.timeouts.request, async {
        let mut answers = Vec::with_capacity(checks.len());
        for check in &checks {
            let decision = decide(&api, check).await?;
            answers.push(check_response(&check.target, &decision));
        }
        Ok(answers)
    })
    .await?;
    Ok(json_response(StatusCode::OK, &answers))
}

async fn release(State(api): ApiState, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let valid = parse_body(&api, &headers, body, parse_release).await?;
    let answer = match api.daemon.release(&valid)? {
        Released::Ended => json!({ "released": true }),
        Released::NotHeld => json!({ "released": false }),
        // The owner ends it if it holds it, and says nothing back.
        Released::SentToOwner(owner) => json!({ "released": null, "owner": owner.0 }),
    };
    Ok(json_response(StatusCode::OK, &answer))
}

/// The query of `GET /v1/auth`; unknown parameters are ignored (a proxy may pass its own).
#[derive(Debug, Default)]
struct AuthQuery {
    policy: Option<String>,
    key: Option<String>,
    cost: Option<String>,
}

impl AuthQuery {
    /// Parses `?policy=&key=&cost=` (form encoding: `+` is a space, `%XX` a byte). A value that
    /// is not UTF-8 once decoded is refused, not decoded lossily: two different byte strings
    /// would otherwise share one bucket. A parameter given twice is refused too.
    fn parse(uri: &Uri) -> Result<AuthQuery, ApiError> {
        let mut query = AuthQuery::default();
        for pair in uri.query().unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (field, slot) = match name {
                "policy" => ("policy", &mut query.policy),
                "key" => ("key", &mut query.key),
                "cost" => ("cost", &mut query.cost),
                _ => continue,
            };
            if slot.is_some() {
                return Err(ApiError::bad_request(field, "given twice"));
            }
            let spaced = value.replace('+', " ");
            let decoded = percent_encoding::percent_decode_str(&spaced)
                .decode_utf8()
                .map_err(|_| ApiError::bad_request(field, "not valid UTF-8 once percent-decoded"))?;
            *slot = Some(decoded.into_owned());
        }
        Ok(query)
    }
}

/// A request header's value as text, or a 400 naming it.
fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|text| Some(text.trim()))
            .map_err(|_| ApiError::bad_request(name, "header value is not visible ASCII")),
    }
}

/// The key of an auth request: the `key` query parameter, else the configured key header, else
/// the client address from `X-Real-IP`, else the last entry of `X-Forwarded-For`.
///
/// The last `X-Forwarded-For` entry is the address the nearest proxy saw and appended; the
/// entries before it come from the request as the client sent it, so a client could put any
/// address first and get a fresh bucket with every request. Of several `X-Forwarded-For` lines,
/// the last one holds the last entry.
fn auth_key(query: &AuthQuery, headers: &HeaderMap, key_header: &str) -> Result<Option<String>, ApiError> {
    if let Some(key) = &query.key {
        return Ok(Some(key.clone()));
    }
    if let Some(key) = header_text(headers, key_header)? {
        return Ok(Some(key.to_owned()));
    }
    if let Some(real_ip) = header_text(headers, "x-real-ip")?.filter(|ip| !ip.is_empty()) {
        return Ok(Some(real_ip.to_owned()));
    }
    let Some(forwarded) = headers.get_all("x-forwarded-for").iter().next_back() else {
        return Ok(None);
    };
    let forwarded = forwarded
        .to_str()
        .map_err(|_| ApiError::bad_request("x-forwarded-for", "header value is not visible ASCII"))?;
    let last = forwarded.rsplit(',').next().unwrap_or_default().trim();
    Ok((!last.is_empty()).then(|| last.to_owned()))
}

async fn auth(State(api): ApiState, uri: Uri, headers: HeaderMap) -> Result<Response, ApiError> {
    let (config, policies) = api.daemon.current();
    let query = AuthQuery::parse(&uri)?;
    let policy = match &query.policy {
        Some(policy) => Some(policy.clone()),
        None => header_text(&headers, &config.auth.policy_header)?.map(str::to_owned),
    };
    let Some(policy) = policy else {
        let message = format!("missing: give ?policy= or the {} header", config.auth.policy_header);
        return Err(ApiError::bad_request("policy", message));
    };
    let key = auth_key(&query, &headers, &config.auth.key_header)?;
    let cost = match query.cost.as_deref().map(str::parse::<u64>) {
        None => None,
        Some(Ok(cost)) => Some(cost),
        Some(Err(e)) => return Err(ApiError::bad_request("cost", format!("not an unsigned integer ({e})"))),
    };
    let body = CheckBody { key, cost: cost.map(Into::into), limit: None, policy: Some(policy), tier: None };
    let valid = body.validate(&policies, &config.limits)?;
    let decision = within(api.timeouts.request, async {
        Ok(api.daemon.check(&valid.target, valid.key, &valid.key_text, valid.cost).await?)
    })
    .await?;
    let status = if decision.allowed { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS };
    Ok(decision_response(status, &valid.target, &decision))
}

async fn metrics(State(api): ApiState) -> Response {
    match api.daemon.metrics().encode() {
        Ok(text) => ([(CONTENT_TYPE, HeaderValue::from_static(METRICS_CONTENT_TYPE))], text).into_response(),
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "encoding metrics failed", None),
    }
}

async fn healthz() -> Response {
    json_response(StatusCode::OK, &json!({ "status": "ok" }))
}

async fn readyz(State(api): ApiState) -> Response {
    match api.daemon.not_ready_reason() {
        None => json_response(StatusCode::OK, &json!({ "ready": true })),
        Some(reason) => {
            json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({ "ready": false, "reason": reason }))
        }
    }
}

async fn cluster(State(api): ApiState) -> Response {
    let daemon = &api.daemon;
    let (config, _) = daemon.current();
    let shares = daemon.ring_shares();
    let share_of = |id| shares.iter().find(|(member, _)| *member == id).map_or(0.0, |(_, share)| *share);
    let members: Vec<_> = daemon
        .node()
        .members()
        .iter()
        .map(|m| {
            json!({
                "id": m.id.0,
                "quic_addr": m.quic_addr.to_string(),
                "status": status_name(m.status),
                "ring_share": share_of(m.id),
            })
        })
        .collect();
    let owners = shares.len();
    let max_share = shares.iter().map(|(_, share)| *share).fold(0.0, f64::max);
    // 1.0 is a perfectly balanced ring: the largest share over the fair one.
    let balance = if owners == 0 { 0.0 } else { max_share * owners as f64 };
    json_response(
        StatusCode::OK,
        &json!({
            "node": daemon.id().0,
            "cluster_id": config.cluster.cluster_id,
            "gossip_addr": daemon.node().gossip_addr().to_string(),
            "quic_addr": daemon.node().quic_addr().to_string(),
            "ready": daemon.is_ready(),
            "shutting_down": daemon.is_shutting_down(),
            "members": members,
            "ring": {
                "probes": RING_PROBES,
                "owners": owners,
                "this_node_share": share_of(daemon.id()),
                "balance": balance,
            },
        }),
    )
}

async fn policies(State(api): ApiState) -> Response {
    let (_, table) = api.daemon.current();
    let list: Vec<_> = table
        .iter()
        .map(|entry| {
            let mut item = json!({ "name": entry.name, "shadow_mode": entry.shadow_mode });
            match entry.rule.policy() {
                None => item["unlimited"] = json!(true),
                Some(policy) => {
                    let spec = policy.limit.spec();
                    item["unlimited"] = json!(false);
                    item["algorithm"] = json!(spec.algorithm.name());
                    item["limit"] = json!(spec.limit);
                    item["period_ms"] = json!(u64::try_from(spec.period.as_millis()).unwrap_or(u64::MAX));
                    item["burst"] = json!(spec.burst);
                    if spec.algorithm == Algorithm::LeakyBucketShaper {
                        item["delay"] = json!(spec.delay);
                    }
                    if let Rule::Calendar(calendar) = &entry.rule {
                        item["window"] = json!(calendar.calendar().unit().name());
                        item["time_zone"] = json!(calendar.calendar().zone_name());
                    }
                    item["mode"] = json!(mode_name(policy.mode));
                    item["fallback"] = json!(fallback_name(policy.fallback));
                }
            }
            if !entry.tiers.is_empty() || !entry.overrides.is_empty() {
                let tiers: Vec<_> = entry.tiers.keys().collect();
                item["tiers"] = json!(tiers);
                item["overrides"] = json!(entry.overrides.len());
            }
            if let Some(envoy) = &entry.envoy {
                let descriptors: Vec<_> = envoy
                    .descriptors
                    .iter()
                    .map(|d| {
                        let value = match &d.value {
                            crate::config::ValuePattern::Any => None,
                            crate::config::ValuePattern::Exact(value) => Some(value.clone()),
                            crate::config::ValuePattern::Prefix(prefix) => Some(format!("{prefix}*")),
                        };
                        json!({ "key": d.key, "value": value })
                    })
                    .collect();
                item["domain"] = json!(envoy.domain);
                item["descriptors"] = json!(descriptors);
            }
            item
        })
        .collect();
    json_response(StatusCode::OK, &json!({ "policies": list }))
}

/// The most keys `GET /v1/top` lists.
pub const TOP_N_MAX: usize = 100;

/// The query of `GET /v1/top`, validated.
#[derive(Debug, PartialEq, Eq)]
struct TopQuery {
    policy: String,
    n: usize,
    by: TopBy,
}

impl TopQuery {
    /// Parses `?policy=&n=&by=`; every refusal names its parameter (an unknown or repeated one
    /// too). The policy must be a limited named policy of `table`.
    fn parse(uri: &Uri, table: &PolicyTable) -> Result<TopQuery, ApiError> {
        let (mut policy, mut n, mut by) = (None, None, None);
        for pair in uri.query().unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decoded = percent_encoding::percent_decode_str(&value.replace('+', " "))
                .decode_utf8()
                .map(|v| v.into_owned());
            let slot = match name {
                "policy" => &mut policy,
                "n" => &mut n,
                "by" => &mut by,
                _ => {
                    let name: String = name.chars().take(32).collect();
                    return Err(ApiError::bad_request(&name, "unknown parameter (policy, n, by)"));
                }
            };
            if slot.is_some() {
                return Err(ApiError::bad_request(name, "given twice"));
            }
            *slot = Some(
                decoded.map_err(|_| ApiError::bad_request(name, "not valid UTF-8 once percent-decoded"))?,
            );
        }
        let policy = policy.ok_or_else(|| ApiError::bad_request("policy", "missing: give ?policy=NAME"))?;
        match table.get(&policy) {
            Some(entry) if entry.rule.policy().is_some() => {}
            Some(_) => {
                return Err(ApiError::bad_request(
                    "policy",
                    format!("{policy:?} is unlimited: nothing is counted"),
                ));
            }
            None => return Err(ApiError::bad_request("policy", format!("no policy named {policy:?}"))),
        }
        let n = match n.as_deref().map(str::parse::<usize>) {
            None => 20,
            Some(Ok(n)) if (1..=TOP_N_MAX).contains(&n) => n,
            Some(_) => return Err(ApiError::bad_request("n", format!("an integer from 1 to {TOP_N_MAX}"))),
        };
        let by = match by.as_deref() {
            None => TopBy::Refused,
            Some(name) => {
                TopBy::from_name(name).ok_or_else(|| ApiError::bad_request("by", "refused or demand"))?
            }
        };
        Ok(TopQuery { policy, n, by })
    }
}

async fn top(State(api): ApiState, uri: Uri) -> Result<Response, ApiError> {
    let (_, table) = api.daemon.current();
    let query = TopQuery::parse(&uri, &table)?;
    let report = api.daemon.node().top(&query.policy, query.by, query.n).await;
    let answer = &report.answer;
    let keys: Vec<_> =
        answer.entries.iter().map(|e| json!({ "key": e.key, "count": e.count, "error": e.error })).collect();
    let missing: Vec<_> =
        report.missing.iter().map(|m| json!({ "id": m.id.0, "reason": m.reason })).collect();
    let config = api.daemon.node().top_config();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "policy": query.policy,
            "by": query.by.name(),
            "n": query.n,
            "keys": keys,
            "error_bound": answer.error_bound,
            "total": answer.total,
            "window_ms": u64::try_from(answer.window.as_millis()).unwrap_or(u64::MAX),
            "window_max_ms": u64::try_from(config.half_window.as_millis() * 2).unwrap_or(u64::MAX),
            "key_bytes_max": config.key_bytes_max,
            "members": report.answered.iter().map(|id| id.0).collect::<Vec<_>>(),
            "missing": missing,
        }),
    ))
}

async fn stats(State(api): ApiState) -> Response {
    let daemon = &api.daemon;
    let node = daemon.node().metrics();
    let policies: Vec<_> = daemon
        .metrics()
        .rates()
        .snapshot()
        .iter()
        .map(|(policy, slots)| {
            json!({
                "policy": policy,
                "allowed": slots.iter().map(|s| s.0).collect::<Vec<_>>(),
                "refused": slots.iter().map(|s| s.1).collect::<Vec<_>>(),
            })
        })
        .collect();
    let round_trips: Vec<_> = node
        .peer_round_trips
        .iter()
        .map(|(peer, rtt)| json!({ "peer": peer.0, "rtt_ms": rtt.as_secs_f64() * 1000.0 }))
        .collect();
    let (top_bytes, _) = daemon.node().top_memory();
    json_response(
        StatusCode::OK,
        &json!({
            "node": daemon.id().0,
            "slot_ms": u64::try_from(crate::rates::SLOT.as_millis()).unwrap_or(u64::MAX),
            "policies": policies,
            "sync_lag_ms": node.sync_lag.as_secs_f64() * 1000.0,
            "peer_round_trips": round_trips,
            "keys": node.keys,
            "checks_waiting": node.checks_waiting,
            "top_sketch_bytes": top_bytes,
        }),
    )
}

/// The dashboard page: self-contained (inline CSS and JavaScript, no external request).
const DASHBOARD_HTML: &str = include_str!("dashboard.html");

async fn dashboard() -> Response {
    let headers = [
        (CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
        // Nothing but this node: the page loads no other origin's resources.
        (
            axum::http::header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
            ),
        ),
    ];
    (StatusCode::OK, headers, DASHBOARD_HTML).into_response()
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

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    }

    fn key_of(query_key: Option<&str>, pairs: &[(&'static str, &'static str)]) -> Option<String> {
        let query = AuthQuery { key: query_key.map(str::to_owned), ..AuthQuery::default() };
        auth_key(&query, &headers(pairs), "x-ratelimit-key").expect("valid headers")
    }

    #[test]
    fn the_auth_key_is_what_the_proxy_set_not_what_the_client_sent() {
        let forwarded = ("x-forwarded-for", "203.0.113.9, 198.51.100.1 , 10.0.0.1");
        assert_eq!(key_of(None, &[forwarded]).as_deref(), Some("10.0.0.1"), "the last entry");
        let real_ip = ("x-real-ip", "10.0.0.2");
        assert_eq!(key_of(None, &[forwarded, real_ip]).as_deref(), Some("10.0.0.2"), "X-Real-IP first");
        let key = ("x-ratelimit-key", "user-1");
        assert_eq!(key_of(None, &[forwarded, real_ip, key]).as_deref(), Some("user-1"), "the key header");
        assert_eq!(key_of(Some("q"), &[forwarded, real_ip, key]).as_deref(), Some("q"), "the query first");
        // Several lines: the last line's last entry; an empty one names no key.
        let lines = [("x-forwarded-for", "10.9.9.9"), ("x-forwarded-for", "10.0.0.3, 10.0.0.4")];
        assert_eq!(key_of(None, &lines).as_deref(), Some("10.0.0.4"));
        assert_eq!(key_of(None, &[("x-forwarded-for", "10.0.0.5, ")]), None);
        assert_eq!(
            key_of(None, &[("x-real-ip", ""), ("x-forwarded-for", "10.0.0.6")]).as_deref(),
            Some("10.0.0.6")
        );
        assert_eq!(key_of(None, &[]), None);
        let mut bad = HeaderMap::new();
        bad.insert("x-forwarded-for", HeaderValue::from_bytes(b"10.0.0.7\xff").expect("opaque bytes"));
        let error = auth_key(&AuthQuery::default(), &bad, "x-ratelimit-key").expect_err("refused");
        assert_eq!(
            (error.status, error.body.field.as_deref()),
            (StatusCode::BAD_REQUEST, Some("x-forwarded-for"))
        );
    }

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
