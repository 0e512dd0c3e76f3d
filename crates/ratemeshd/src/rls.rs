//! The Envoy Rate Limit Service v3 over gRPC
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`), a front end over [`Daemon`].
//!
//! # Semantics
//!
//! A request's `domain` and each descriptor's entries are matched against the policy file with
//! [`PolicyTable::match_descriptor`] (envoyproxy/ratelimit's rules: nested descriptors, wildcard
//! values, exact entry count). Then, for every descriptor, in request order:
//!
//! - **no policy matches** (or the domain is unknown): `OK`, no `current_limit`, nothing counted
//!   (what Envoy expects of envoyproxy/ratelimit);
//! - **`unlimited` policy**: `OK`, no `current_limit`, `limit_remaining` = `u32::MAX`, nothing
//!   counted (as envoyproxy/ratelimit answers);
//! - **a limited policy**: `hits` are taken from its bucket (see below) and the status carries the
//!   decision: `OK` or `OVER_LIMIT`, `current_limit` (see [`current_limit`]), `limit_remaining`,
//!   `duration_until_reset`. In `shadow_mode` a refusal is answered `OK` (the daemon counts it as
//!   `shadow_refused` in metrics), and so is a check that fails (the node cannot decide): a
//!   shadow policy is never enforced, so its failure must not fail the call. That descriptor is
//!   answered like one without a limit (`OK`, no `current_limit`) and counted in
//!   `ratemesh_shadow_check_errors_total`.
//!
//! `overall_code` is `OVER_LIMIT` when any descriptor is. `response_headers_to_add` carries the
//! `X-RateLimit-*`, `RateLimit-Policy`/`RateLimit` (and, when refused, `Retry-After`) headers of
//! the most restrictive limited descriptor (a refused one first, then the least remaining), the
//! same headers the HTTP API writes ([`ratemesh::headers::insert_headers`]).
//!
//! ## Hits
//!
//! A descriptor's own `hits_addend` when it is set (0 is a query: is there room for one more hit,
//! without taking it); otherwise the request's `hits_addend`, where 0 (unset in proto3) means 1.
//! A descriptor with `is_negative_hits` is a refund of its hits (`hits_addend`, else the
//! request's): they go back to the bucket at the key's owner, never above the capacity (see
//! `POST /v1/check` with a negative cost); its status is the answer a one-hit check would get
//! afterwards. A refund under a concurrency limit is `INVALID_ARGUMENT` (leases are released, not
//! refunded).
//!
//! ## All or nothing
//!
//! A domain listed in `[rls] all_or_nothing_domains` answers each request all or nothing: its
//! descriptors' checks run as one group (`Daemon::check_all`, as `POST /v1/check/all`), so when
//! one descriptor is over its limit the hits the others took are given back (the statuses before
//! it show the answer to the give-back, those after it a query's). Other domains count every
//! descriptor on its own, like envoyproxy/ratelimit. Refund descriptors run on their own.
//!
//! ## Limit override
//!
//! A descriptor's `limit` ({`requests_per_unit`, `unit`}) replaces the matched policy's limit for
//! that descriptor: same algorithm, mode, fallback and shadow mode, `requests_per_unit` per unit
//! (`MONTH` = 30 days, `YEAR` = 365 days, as envoyproxy/ratelimit counts them), the algorithm's
//! default burst. An override is counted in its own bucket (one per distinct override), so that
//! a bucket is never checked under two different limits. Differences from envoyproxy/ratelimit,
//! which applies an override even without a matching config entry: here an override needs a
//! matching limited policy (its algorithm and mode are not in the request); on a descriptor that
//! matches nothing or an `unlimited` policy it changes nothing. An invalid override (`UNKNOWN`
//! unit, 0 requests, a rate the algorithm cannot hold) refuses the request as `INVALID_ARGUMENT`.
//!
//! ## Errors and bounds
//!
//! - `INVALID_ARGUMENT`, before anything is counted: empty domain, no descriptors, more than
//!   [`DESCRIPTORS_MAX`] descriptors, a descriptor with no entries or more than
//!   [`ENTRIES_MAX`], an invalid limit override.
//! - `UNAVAILABLE`: the node is shutting down or cannot decide ([`ratemesh::CheckError`]) for a
//!   descriptor of an enforced policy, or more than `limits.http_in_flight_max` RLS requests are
//!   in flight (load shedding: answered at once, never queued, counted in
//!   `ratemesh_shed_requests_total{server="grpc"}`), or the call's decisions took longer than
//!   [`CALL_TIMEOUT`]. Envoy then applies its `failure_mode_deny` setting.
//! - `INVALID_ARGUMENT` too for a request that is not a `RateLimitRequest` at all (malformed
//!   protobuf: tonic says `INTERNAL`, which is turned into the client's fault it is).
//! - Messages larger than [`MESSAGE_BYTES_MAX`] are refused by the gRPC layer (`OUT_OF_RANGE`,
//!   tonic's code for it).
//!
//! ## Connections
//!
//! At most `limits.connections_max` connections are open at once (one more is closed as soon as
//! it is accepted, see `crate::listener`); a connection must send its HTTP/2 preface within
//! [`HANDSHAKE_TIMEOUT`]; a write the client does not take within
//! [`crate::listener::WRITE_TIMEOUT`] closes the connection; HTTP/2 pings every [`HTTP2_KEEPALIVE_INTERVAL`] (and TCP keepalive)
//! find peers that vanished without closing their connections.
//!
//! ## Concurrency
//!
//! The descriptors of one request are checked **sequentially**, in request order: most requests
//! carry one to three descriptors, each check is a local decision in approximate mode (or one
//! round trip to the key's owner in exact mode), and sequential checks keep the answer
//! deterministic. As in envoyproxy/ratelimit, hits taken by earlier descriptors stay taken when a
//! later one is over its limit, and when a check fails midway (`UNAVAILABLE`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue as EnvoyHeader;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use http::HeaderMap;
use ratemesh_core::{Algorithm, Decision, Limit, LimitSpec, Policy};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tracing::debug;

use crate::check::{Answer, Target, ValidCheck};
use crate::config::{Rule, limit_error_field, limit_error_message};
use crate::daemon::Daemon;
use crate::listener::{FirstBytes, LimitedIncoming};
use crate::policy::{PolicyEntry, PolicyTable};

/// The most descriptors in one request. Envoy sends one per matching rate-limit action set of a
/// route (a handful); 64 leaves room for generous configurations and bounds the work per call.
pub const DESCRIPTORS_MAX: usize = 64;

/// The most entries in one descriptor. A policy path holds at most
/// [`crate::config::DESCRIPTOR_DEPTH_MAX`] entries, so a longer descriptor can never match; the
/// bound is above it so that such a descriptor is answered (`OK`, no limit) rather than refused.
pub const ENTRIES_MAX: usize = 32;

/// The largest request or response message, in bytes. A request of [`DESCRIPTORS_MAX`]
/// descriptors with long header values fits easily; anything larger is not from Envoy.
pub const MESSAGE_BYTES_MAX: usize = 64 * 1024;

/// Concurrent calls (HTTP/2 streams) per connection. Envoy multiplexes its calls over a few
/// connections; the daemon-wide bound is `limits.http_in_flight_max` (see the module doc).
pub const STREAMS_PER_CONNECTION_MAX: u32 = 1024;

/// The longest a call's decisions may take. Envoy gives up after 20 ms by default; a call still
/// running after this is stuck (an owner unreachable past the node's own timeouts): it is
/// answered `UNAVAILABLE` and frees its in-flight permit. tonic's own timeout, a second longer,
/// is only a backstop (it would answer `CANCELLED`, which Envoy does not treat as the service
/// being unavailable).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection may take to send its HTTP/2 preface (see `crate::listener`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The HTTP/2 client preface (24 bytes) and the frame header of the SETTINGS frame that must
/// follow it (9 bytes): what a connection must send within [`HANDSHAKE_TIMEOUT`].
const HANDSHAKE_BYTES: usize = 24 + 9;

/// How often the server pings an idle HTTP/2 connection, and how long it waits for the answer
/// ([`HTTP2_KEEPALIVE_TIMEOUT`]) before closing it: an Envoy that went away without closing its
/// connections (a crash, a lost network) stops holding connection slots.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// See [`HTTP2_KEEPALIVE_INTERVAL`].
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP keepalive of accepted connections: idle time before the first probe, and between probes.
/// It finds dead peers even on a connection whose HTTP/2 pings are not answered by anything.
const TCP_KEEPALIVE_TIME: Duration = Duration::from_secs(60);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// The time bounds of the RLS server. The defaults are the constants of this module; tests
/// shorten them to see them work without waiting seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// [`HANDSHAKE_TIMEOUT`].
    pub handshake: Duration,
    /// [`CALL_TIMEOUT`].
    pub call: Duration,
    /// [`crate::listener::WRITE_TIMEOUT`].
    pub write: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { handshake: HANDSHAKE_TIMEOUT, call: CALL_TIMEOUT, write: crate::listener::WRITE_TIMEOUT }
    }
}

/// `MONTH` and `YEAR` of a limit override, in seconds, as envoyproxy/ratelimit counts them.
const MONTH_SECS: u64 = 30 * 24 * 3600;
const YEAR_SECS: u64 = 365 * 24 * 3600;

/// The tag after a descriptor's bucket key that names a limit override. The bucket key is a
/// sequence of length-prefixed fields; a field length starting with this byte would need a
/// field of about 4 GiB, far beyond [`MESSAGE_BYTES_MAX`], so an override's bucket never
/// collides with a longer descriptor's.
const OVERRIDE_TAG: u8 = 0xFE;

/// Why the RLS server stopped.
#[derive(Debug, thiserror::Error)]
pub enum RlsError {
    /// The gRPC server failed.
    #[error("Envoy RLS gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The `RateLimitService` implementation over a [`Daemon`]. Use [`serve`] to run it on a
/// listener, or [`RlsService::into_server`] to mount it in another tonic server.
#[derive(Debug, Clone)]
pub struct RlsService {
    daemon: Arc<Daemon>,
    /// In-flight calls across every connection (load shedding, no queue).
    permits: Arc<Semaphore>,
    /// How long a call's decisions may take.
    call_timeout: Duration,
}

impl RlsService {
    /// The service over `daemon`, with as many calls in flight as the HTTP API may have
    /// (`limits.http_in_flight_max`, read once: it changes only with a restart), each answered
    /// within [`CALL_TIMEOUT`].
    pub fn new(daemon: Arc<Daemon>) -> RlsService {
        let (config, _) = daemon.current();
        let permits = Arc::new(Semaphore::new(config.limits.http_in_flight_max));
        RlsService { daemon, permits, call_timeout: CALL_TIMEOUT }
    }

    /// The same service, with calls answered within `call_timeout` instead.
    pub fn with_call_timeout(self, call_timeout: Duration) -> RlsService {
        RlsService { call_timeout, ..self }
    }

    /// The tonic service, with the message size bounds ([`MESSAGE_BYTES_MAX`]).
    pub fn into_server(self) -> RateLimitServiceServer<RlsService> {
        RateLimitServiceServer::new(self)
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX)
    }

    /// The in-flight bound. Holding its permits from outside (tests, diagnostics) makes the
    /// service shed calls deterministically.
    pub fn permits(&self) -> &Arc<Semaphore> {
        &self.permits
    }

    /// Answers one `ShouldRateLimit` request (see the module documentation): with an in-flight
    /// permit, and within the call timeout.
    pub async fn should_rate_limit_request(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        let Ok(_permit) = self.permits.try_acquire() else {
            self.daemon.metrics().record_shed("grpc", "should_rate_limit");
            return Err(Status::unavailable("overloaded: too many rate limit calls in flight"));
        };
        within(self.call_timeout, self.decide(request)).await
    }

    /// The decisions of one request.
    async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        // One policy table for the whole request, even if a reload swaps it meanwhile.
        let (config, policies) = self.daemon.current();
        let plans = plan(&policies, request)?;
        let mut decided = match config.rls.all_or_nothing_domains.contains(&request.domain) {
            true => self.all_or_nothing(&plans).await?,
            false => vec![None; plans.len()],
        };
        let mut response = RateLimitResponse { overall_code: Code::Ok.into(), ..Default::default() };
        // The most restrictive limited descriptor so far: its answer and decision as answered.
        let mut tightest: Option<(Answer, Decision)> = None;
        for (index, plan) in plans.iter().enumerate() {
            let Some(check) = plan else {
                response.statuses.push(no_limit_status(0));
                continue;
            };
            let outcome = match (decided[index].take(), check.refund) {
                (Some(answer), _) => Ok(answer),
                (None, true) => {
                    self.daemon.refund(&check.target, check.key, check.cost).await.map_err(|e| e.to_string())
                }
                (None, false) => self
                    .daemon
                    .check(&check.target, check.key, &check.key_text, check.cost)
                    .await
                    .map_err(|e| e.to_string()),
            };
            let answer = match outcome {
                Ok(answer) => answer,
                // Never enforced: its failure must not fail the call (see the module doc).
                Err(error) if check.target.shadow_mode() => {
                    debug!(policy = check.target.label(), %error, "shadow-mode check failed: answered OK");
                    self.daemon.metrics().record_shadow_error(check.target.label());
                    response.statuses.push(no_limit_status(0));
                    continue;
                }
                Err(error) => return Err(Status::unavailable(format!("cannot decide: {error}"))),
            };
            let Some((policy, decision)) = answer.answered() else {
                response.statuses.push(no_limit_status(u32::MAX));
                continue;
            };
            let status = limited_status(answer.label(), policy.limit.spec(), &decision);
            if !decision.allowed {
                response.overall_code = Code::OverLimit.into();
            }
            response.statuses.push(status);
            if tightest.as_ref().is_none_or(|(_, best)| more_restrictive(&decision, best)) {
                tightest = Some((answer, decision));
            }
        }
        if let Some((answer, decision)) = tightest
            && let Some((policy, _)) = answer.answered()
        {
            let period = policy.limit.spec().period;
            response.response_headers_to_add = envoy_headers(answer.label(), period, &decision);
        }
        Ok(response)
    }
}

impl RlsService {
    /// The decisions of a request of an all-or-nothing domain (`[rls] all_or_nothing_domains`):
    /// its checks (refunds aside, which run on their own) as one group, so that when one is over
    /// its limit the others' hits are given back (`Daemon::check_all`).
    async fn all_or_nothing(&self, plans: &[Option<ValidCheck>]) -> Result<Vec<Option<Answer>>, Status> {
        let grouped: Vec<usize> =
            (0..plans.len()).filter(|&i| plans[i].as_ref().is_some_and(|check| !check.refund)).collect();
        let checks: Vec<ValidCheck> = grouped.iter().filter_map(|&i| plans[i].clone()).collect();
        let (_, answers) = self
            .daemon
            .check_all(&checks)
            .await
            .map_err(|error| Status::unavailable(format!("cannot decide: {error}")))?;
        let mut decided = vec![None; plans.len()];
        for (index, answer) in grouped.into_iter().zip(answers) {
            decided[index] = Some(answer);
        }
        Ok(decided)
    }
}

/// Runs a call's decisions, at most `timeout`; then `UNAVAILABLE` (Envoy applies its
/// `failure_mode_deny`). Dropping the decisions' future frees the call's in-flight permit.
async fn within<T>(timeout: Duration, decide: impl Future<Output = Result<T, Status>>) -> Result<T, Status> {
    tokio::time::timeout(timeout, decide)
        .await
        .unwrap_or_else(|_| Err(Status::unavailable(format!("no decision within {timeout:?}"))))
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        match self.should_rate_limit_request(&request).await {
            Ok(response) => Ok(Response::new(response)),
            Err(status) => {
                debug!(domain = %request.domain, code = ?status.code(), message = status.message(), "RLS call refused");
                Err(status)
            }
        }
    }
}

/// Serves the Envoy Rate Limit Service of `daemon` on `listener` until `shutdown` completes,
/// then stops accepting and waits for the calls in progress. At most as many connections are
/// open at once as `connections` has permits (see the module documentation).
pub async fn serve(
    daemon: Arc<Daemon>,
    listener: TcpListener,
    connections: Arc<Semaphore>,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RlsError> {
    // Calls are small request/response pairs: Nagle's algorithm would hold each answer back
    // waiting for the client's delayed ACK.
    let accepted = TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(TCP_KEEPALIVE_TIME))
        .with_keepalive_interval(Some(TCP_KEEPALIVE_INTERVAL));
    let refused = daemon.metrics().connections_refused("grpc");
    let incoming = LimitedIncoming::new(accepted, connections, "grpc", refused)
        .first_bytes(FirstBytes { bytes: HANDSHAKE_BYTES, timeout: timeouts.handshake })
        .write_timeout(timeouts.write);
    let service = RlsService::new(daemon).with_call_timeout(timeouts.call);
    tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(undecodable_is_invalid_argument))
        .max_concurrent_streams(STREAMS_PER_CONNECTION_MAX)
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
        // A backstop only: the service answers UNAVAILABLE at its own call timeout first.
        .timeout(timeouts.call + Duration::from_secs(1))
        .serve_with_incoming_shutdown(service.into_server(), incoming, shutdown)
        .await?;
    Ok(())
}

/// tonic answers a request it cannot decode (malformed protobuf, no message, more than one) with
/// `INTERNAL`; the fault is the client's, so this turns it into `INVALID_ARGUMENT`. It may look
/// at every answer's status alone because [`RlsService`] itself never answers `INTERNAL`: in this
/// server that code only comes from tonic's decoding of requests.
fn undecodable_is_invalid_argument<B>(mut response: http::Response<B>) -> http::Response<B> {
    let internal = i32::from(tonic::Code::Internal).to_string();
    let status = response.headers().get(tonic::Status::GRPC_STATUS);
    if status.is_some_and(|code| code.as_bytes() == internal.as_bytes()) {
        let invalid = i32::from(tonic::Code::InvalidArgument);
        response.headers_mut().insert(tonic::Status::GRPC_STATUS, http::HeaderValue::from(invalid));
    }
    response
}

/// Validates `request` and resolves every descriptor: `None` for a descriptor that matches no
/// policy. Nothing is counted here, so an invalid request counts nothing.
fn plan(policies: &PolicyTable, request: &RateLimitRequest) -> Result<Vec<Option<ValidCheck>>, Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument("domain: must not be empty"));
    }
    if request.descriptors.is_empty() {
        return Err(Status::invalid_argument("descriptors: must not be empty"));
    }
    if request.descriptors.len() > DESCRIPTORS_MAX {
        return Err(Status::invalid_argument(format!(
            "descriptors: {} given, at most {DESCRIPTORS_MAX} are accepted",
            request.descriptors.len()
        )));
    }
    // Proto3 cannot tell an unset request-level hits_addend from 0: both mean 1.
    let request_hits = u64::from(request.hits_addend.max(1));
    request
        .descriptors
        .iter()
        .enumerate()
        .map(|(index, descriptor)| {
            plan_descriptor(policies, &request.domain, index, descriptor, request_hits)
        })
        .collect()
}

fn plan_descriptor(
    policies: &PolicyTable,
    domain: &str,
    index: usize,
    descriptor: &RateLimitDescriptor,
    request_hits: u64,
) -> Result<Option<ValidCheck>, Status> {
    let entries = &descriptor.entries;
    if entries.is_empty() || entries.len() > ENTRIES_MAX {
        return Err(Status::invalid_argument(format!(
            "descriptors[{index}].entries: {} given, 1 to {ENTRIES_MAX} are accepted",
            entries.len()
        )));
    }
    let pairs: Vec<(&str, &str)> = entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
    // Validate the override even when nothing matches: a malformed request is refused the same
    // whatever the policy file holds.
    let override_limit = descriptor.limit.map(|o| override_spec(index, &o)).transpose()?;
    let Some(matched) = policies.match_descriptor(domain, &pairs) else {
        return Ok(None);
    };
    let hits = match descriptor.hits_addend {
        Some(hits) => hits.value,
        None => request_hits,
    };
    let refund = descriptor.is_negative_hits;
    let concurrency =
        matched.entry.rule.policy().is_some_and(|p| p.limit.algorithm() == Algorithm::Concurrency);
    if refund && concurrency {
        return Err(Status::invalid_argument(format!(
            "descriptors[{index}].is_negative_hits: a refund does not apply to a concurrency limit (policy {:?})",
            matched.entry.name
        )));
    }
    let (target, key) = match (&matched.entry.rule, override_limit) {
        (Rule::Limited(policy), Some((requests, period))) => {
            let spec = LimitSpec::new(policy.limit.algorithm(), requests, period);
            let limit = Limit::new(spec).map_err(|error| {
                let field = match limit_error_field(&error) {
                    "period_ms" => "unit",
                    _ => "requests_per_unit",
                };
                Status::invalid_argument(format!(
                    "descriptors[{index}].limit.{field}: {} (under the {} algorithm of policy {:?})",
                    limit_error_message(&error),
                    policy.limit.algorithm().name(),
                    matched.entry.name,
                ))
            })?;
            let entry = PolicyEntry {
                name: matched.entry.name.clone(),
                rule: Rule::Limited(Arc::new(Policy { limit, ..Policy::clone(policy) })),
                shadow_mode: matched.entry.shadow_mode,
                envoy: None,
                namespace: matched.entry.namespace,
                overrides: Default::default(),
                tiers: Default::default(),
            };
            let mut bucket_key = matched.bucket_key.clone();
            bucket_key.push(OVERRIDE_TAG);
            bucket_key.extend_from_slice(&requests.to_be_bytes());
            bucket_key.extend_from_slice(&period.as_secs().to_be_bytes());
            let key = entry.namespace.key(&bucket_key);
            (Target::Named(Arc::new(entry)), key)
        }
        _ => (Target::Named(Arc::clone(&matched.entry)), matched.key_hash()),
    };
    let key_text = pairs.iter().map(|(key, value)| format!("{key}={value}")).collect::<Vec<_>>().join(",");
    Ok(Some(ValidCheck { target, key, key_text, cost: hits, refund }))
}

/// The requests and period of a descriptor's limit override.
fn override_spec(index: usize, limit: &RateLimitOverride) -> Result<(u64, Duration), Status> {
    let unit_secs = match RateLimitUnit::try_from(limit.unit) {
        Ok(RateLimitUnit::Second) => 1,
        Ok(RateLimitUnit::Minute) => 60,
        Ok(RateLimitUnit::Hour) => 3600,
        Ok(RateLimitUnit::Day) => 24 * 3600,
        Ok(RateLimitUnit::Month) => MONTH_SECS,
        Ok(RateLimitUnit::Year) => YEAR_SECS,
        Ok(RateLimitUnit::Unknown) | Err(_) => {
            return Err(Status::invalid_argument(format!(
                "descriptors[{index}].limit.unit: {} is not a known unit (SECOND, MINUTE, HOUR, DAY, MONTH, YEAR)",
                limit.unit
            )));
        }
    };
    if limit.requests_per_unit == 0 {
        return Err(Status::invalid_argument(format!(
            "descriptors[{index}].limit.requests_per_unit: must be at least 1"
        )));
    }
    Ok((u64::from(limit.requests_per_unit), Duration::from_secs(unit_secs)))
}

/// The status of a descriptor checked against no limit: `OK`, no `current_limit`.
fn no_limit_status(limit_remaining: u32) -> DescriptorStatus {
    DescriptorStatus { code: Code::Ok.into(), limit_remaining, ..Default::default() }
}

/// The status of a descriptor decided under the limit `spec` of the policy `name`.
fn limited_status(name: &str, spec: &LimitSpec, decision: &Decision) -> DescriptorStatus {
    let code = if decision.allowed { Code::Ok } else { Code::OverLimit };
    DescriptorStatus {
        code: code.into(),
        current_limit: Some(current_limit(name, spec)),
        limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(pb_duration(until_reset(decision))),
        quota: None,
    }
}

/// `duration_until_reset` of a decision. Envoy turns it into `X-RateLimit-Reset`, which a
/// refused client reads as "when to come back": for a refusal with a known retry time, that
/// time (never early); otherwise the time until the bucket is fresh again. For a fixed window
/// both are the end of the window, as in envoyproxy/ratelimit.
fn until_reset(decision: &Decision) -> Duration {
    match (decision.allowed, decision.retry_after) {
        (false, Some(retry_after)) => retry_after,
        _ => decision.reset_after,
    }
}

fn pb_duration(duration: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        // Below 1e9 by construction.
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}

/// The units `current_limit` can name, shortest first, with their length in nanoseconds.
const UNITS: [(Unit, u128); 4] = [
    (Unit::Second, 1_000_000_000),
    (Unit::Minute, 60 * 1_000_000_000),
    (Unit::Hour, 3600 * 1_000_000_000),
    (Unit::Day, 24 * 3600 * 1_000_000_000),
];

/// The `current_limit` of a policy named `name` with the limit `spec` (`limit` hits per
/// `period`). RLS can only say "N per SECOND/MINUTE/HOUR/DAY", so:
///
/// 1. a period of exactly one unit is that unit (`100 per 60 s` → 100/MINUTE);
/// 2. otherwise the shortest unit in which the rate is a whole number (`10 per 1500 ms` →
///    400/MINUTE, `100 per 2 s` → 50/SECOND, `7 per 7 days` → 1/DAY);
/// 3. otherwise the shortest unit at least as long as the period (DAY beyond a day), with the
///    rate rounded down and at least 1 (`7 per 13 s` → 32/MINUTE): never more than is granted.
///
/// `requests_per_unit` saturates at `u32::MAX`. The burst is not represented (RLS has no field
/// for it); the decision's `limit_remaining` reflects it.
pub fn current_limit(name: &str, spec: &LimitSpec) -> RateLimit {
    let period = spec.period.as_nanos().max(1);
    let limit = u128::from(spec.limit);
    let scaled = |unit_nanos: u128| limit * unit_nanos / period;
    let exact = UNITS
        .iter()
        .find(|(_, nanos)| *nanos == period)
        .or_else(|| UNITS.iter().find(|(_, nanos)| (limit * nanos) % period == 0));
    let (unit, requests) = match exact {
        Some(&(unit, nanos)) => (unit, scaled(nanos)),
        None => {
            let (unit, nanos) = UNITS.iter().copied().find(|(_, nanos)| *nanos >= period).unwrap_or(UNITS[3]);
            (unit, scaled(nanos).max(u128::from(spec.limit > 0)))
        }
    };
    RateLimit {
        name: name.to_owned(),
        requests_per_unit: u32::try_from(requests).unwrap_or(u32::MAX),
        unit: unit.into(),
    }
}

/// Whether `a` is more restrictive than `b`: a refusal before an admission, then the one with
/// less remaining.
fn more_restrictive(a: &Decision, b: &Decision) -> bool {
    (!a.allowed, std::cmp::Reverse(a.remaining)) > (!b.allowed, std::cmp::Reverse(b.remaining))
}

/// The HTTP API's rate-limit headers for `decision` under the policy labelled `label` with the
/// window `period`, as Envoy header values.
fn envoy_headers(label: &str, period: Duration, decision: &Decision) -> Vec<EnvoyHeader> {
    let mut headers = HeaderMap::new();
    ratemesh::headers::insert_headers_for(&mut headers, label, period, decision);
    headers
        .iter()
        .filter_map(|(name, value)| {
            // Always ASCII (insert_headers writes numbers and sf-strings only).
            let value = value.to_str().ok()?;
            Some(EnvoyHeader {
                key: name.as_str().to_owned(),
                value: value.to_owned(),
                raw_value: Vec::new(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use ratemesh_core::Algorithm;

    use super::*;

    fn limit_of(limit: u64, period: Duration) -> (u32, Unit) {
        let rate = current_limit("p", &LimitSpec::new(Algorithm::FixedWindow, limit, period));
        assert_eq!(rate.name, "p");
        (rate.requests_per_unit, Unit::try_from(rate.unit).expect("a known unit"))
    }

    #[test]
    fn a_period_of_one_unit_is_that_unit() {
        assert_eq!(limit_of(100, Duration::from_secs(1)), (100, Unit::Second));
        assert_eq!(limit_of(100, Duration::from_secs(60)), (100, Unit::Minute));
        assert_eq!(limit_of(7, Duration::from_secs(3600)), (7, Unit::Hour));
        assert_eq!(limit_of(7, Duration::from_secs(86_400)), (7, Unit::Day));
    }

    #[test]
    fn other_periods_take_the_shortest_unit_with_a_whole_rate() {
        assert_eq!(limit_of(100, Duration::from_secs(2)), (50, Unit::Second));
        assert_eq!(limit_of(10, Duration::from_millis(1500)), (400, Unit::Minute));
        assert_eq!(limit_of(1, Duration::from_secs(7200)), (12, Unit::Day));
        assert_eq!(limit_of(7, Duration::from_secs(7 * 86_400)), (1, Unit::Day));
        assert_eq!(limit_of(5, Duration::from_millis(100)), (50, Unit::Second));
    }

    #[test]
    fn inexact_rates_are_rounded_down_in_the_unit_covering_the_period() {
        assert_eq!(limit_of(7, Duration::from_secs(13)), (32, Unit::Minute));
        assert_eq!(limit_of(1, Duration::from_secs(7 * 86_400 + 1)), (1, Unit::Day));
        assert_eq!(limit_of(u64::MAX, Duration::from_millis(3)), (u32::MAX, Unit::Second));
    }

    fn decision(allowed: bool, remaining: u64) -> Decision {
        Decision {
            allowed,
            limit: 10,
            remaining,
            reset_after: Duration::from_millis(1500),
            retry_after: (!allowed).then_some(Duration::from_millis(250)),
            delay: Duration::ZERO,
            lease: None,
        }
    }

    #[test]
    fn a_refusal_is_more_restrictive_than_any_admission() {
        assert!(more_restrictive(&decision(false, 5), &decision(true, 0)));
        assert!(more_restrictive(&decision(true, 1), &decision(true, 2)));
        assert!(!more_restrictive(&decision(true, 2), &decision(true, 2)));
        assert!(!more_restrictive(&decision(true, 0), &decision(false, 9)));
    }

    #[test]
    fn reset_is_the_retry_time_of_a_refusal() {
        assert_eq!(until_reset(&decision(false, 0)), Duration::from_millis(250));
        assert_eq!(until_reset(&decision(true, 3)), Duration::from_millis(1500));
        assert_eq!(pb_duration(Duration::from_millis(1500)), PbDuration { seconds: 1, nanos: 500_000_000 });
    }

    #[tokio::test]
    async fn a_call_past_its_timeout_is_unavailable_not_cancelled() {
        let stuck = within(Duration::from_millis(20), std::future::pending::<Result<(), Status>>());
        let status = stuck.await.expect_err("timed out");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        let quick = within(Duration::from_secs(10), async { Ok::<_, Status>(7) });
        assert_eq!(quick.await.expect("in time"), 7);
    }

    #[test]
    fn envoy_headers_are_the_http_api_headers() {
        let headers = envoy_headers("per-ip", Duration::from_secs(60), &decision(false, 0));
        let value = |name: &str| headers.iter().find(|h| h.key == name).map(|h| h.value.as_str());
        assert_eq!(value("x-ratelimit-limit"), Some("10"));
        assert_eq!(value("x-ratelimit-remaining"), Some("0"));
        assert_eq!(value("retry-after"), Some("1"));
        assert_eq!(value("ratelimit-policy"), Some(r#""per-ip";q=10;w=60"#));
    }

    #[test]
    fn overrides_need_a_known_unit_and_a_rate() {
        let of = |requests_per_unit, unit: RateLimitUnit| {
            override_spec(0, &RateLimitOverride { requests_per_unit, unit: unit.into() })
        };
        assert_eq!(of(5, RateLimitUnit::Minute).expect("valid"), (5, Duration::from_secs(60)));
        assert_eq!(of(1, RateLimitUnit::Month).expect("valid"), (1, Duration::from_secs(MONTH_SECS)));
        assert_eq!(of(5, RateLimitUnit::Unknown).expect_err("unknown").code(), tonic::Code::InvalidArgument);
        assert_eq!(of(0, RateLimitUnit::Second).expect_err("zero").code(), tonic::Code::InvalidArgument);
        let unknown = override_spec(0, &RateLimitOverride { requests_per_unit: 1, unit: 99 });
        assert_eq!(unknown.expect_err("99").code(), tonic::Code::InvalidArgument);
    }
}
