//! The Envoy Rate Limit Service v3 over gRPC
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`), a front end over [`Daemon`].
//!
//! # Semantics
//!
//! A request's `domain` and each descriptor's entries are matched against the policy file with
//! [`crate::policy::PolicyTable::match_descriptor`] (envoyproxy/ratelimit's rules: nested descriptors, wildcard
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
//! matches nothing or an `unlimited` policy it changes nothing. Under `ratemeshd envoy-ratelimit`
//! an override is applied as envoyproxy/ratelimit applies it: on any descriptor of a known
//! domain, as a fixed window of its own (no name, no `replaces`, never in shadow mode). An invalid override (`UNKNOWN`
//! unit, 0 requests, a rate the algorithm cannot hold) refuses the request as `INVALID_ARGUMENT`.
//!
//! ## Errors and bounds
//!
//! - `INVALID_ARGUMENT`, before anything is counted: empty domain, no descriptors, more than
//!   [`DESCRIPTORS_MAX`] descriptors, a descriptor with no entries or more than
//!   [`ENTRIES_MAX`], an invalid limit override. Descriptor values are not bounded by
//!   `limits.key_bytes_max` (the bound of an HTTP or RESP key): Envoy builds them from request
//!   headers and paths, and refusing a call for a long one would let any request through
//!   uncounted where Envoy fails open; they are bounded by [`MESSAGE_BYTES_MAX`] and hashed into
//!   the bucket key (top keys keep at most their first bytes).
//! - `UNAVAILABLE`: the node is shutting down or cannot decide ([`ratemesh::CheckError`]) for a
//!   descriptor of an enforced policy, or more than `limits.http_in_flight_max` RLS requests are
//!   in flight (load shedding: answered at once, never queued, counted in
//!   `ratemesh_shed_requests_total{server="grpc"}`), or the call's decisions took longer than
//!   [`CALL_TIMEOUT`]. Envoy then applies its `failure_mode_deny` setting.
//! - `INVALID_ARGUMENT` too for a request that is not a `RateLimitRequest` at all (malformed
//!   protobuf, no message, more than one), `UNIMPLEMENTED` for a compressed message or another
//!   method, HTTP 405 / 415 for a request that is not a gRPC `POST`.
//! - A message larger than [`MESSAGE_BYTES_MAX`] is refused as soon as its length prefix says so
//!   (`RESOURCE_EXHAUSTED`, as gRPC's own servers answer a message above their receive limit).
//!
//! ## Connections
//!
//! The server speaks HTTP/2 through the `h2` crate ([`connection`]): one task per connection
//! drives it and the calls it carries; a call is decided as soon as its request is read, without
//! a task of its own when its decisions need no wait (approximate mode, an owner's own keys: the
//! usual case), and the answers of a round are written together. [`connection`] lists h2's
//! defences as set here (streams, header list size, reset budgets, send buffer) and the
//! daemon-wide bound on answers held for clients that do not open their flow-control windows.
//!
//! At most `limits.connections_max` connections are open at once (one more is closed as soon as
//! it is accepted, see `crate::listener`); a connection must send its HTTP/2 preface within
//! [`HANDSHAKE_TIMEOUT`]; a write the client does not take within
//! [`crate::listener::WRITE_TIMEOUT`], or an answer that waits that long for the client's window,
//! closes the connection; an HTTP/2 PING every [`HTTP2_KEEPALIVE_INTERVAL`], unanswered within
//! [`HTTP2_KEEPALIVE_TIMEOUT`], closes it too (and TCP keepalive finds peers that vanished without
//! closing their connections). At shutdown each connection sends GOAWAY, answers the calls it
//! has, and closes.
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
use std::task::Poll;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ratemesh_core::Decision;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Status;
use tracing::debug;

use crate::check::{Answer, ValidCheck};
use crate::config::EnvoyRatelimitAnswers;
use crate::daemon::Daemon;
use crate::listener::{FirstBytes, LimitedIncoming, serve_connections};

pub mod connection;
mod plan;

pub use connection::{HTTP2_KEEPALIVE_INTERVAL, HTTP2_KEEPALIVE_TIMEOUT};
mod status;
pub mod tls;

pub use status::current_limit;

use plan::plan;
use status::{
    denied_status, envoy_headers, envoy_ratelimit_headers, limited_status, more_restrictive, no_limit_status,
};

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
/// connections; the daemon-wide bound is `limits.http_in_flight_max` (see the module doc). Also
/// the most answers one connection can have waiting for its client's window: a client that
/// keeps to the streams it is allowed and reads its answers is never taken for a slow reader,
/// whatever its window (answers a round decides can wait for the window until it reads).
pub const STREAMS_PER_CONNECTION_MAX: u32 = 256;

/// The longest a call's decisions may take. Envoy gives up after 20 ms by default; a call still
/// running after this is stuck (an owner unreachable past the node's own timeouts): it is
/// answered `UNAVAILABLE` (which Envoy treats as the service being unavailable) and frees its
/// in-flight permit.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection may take to send its HTTP/2 preface (see `crate::listener`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The HTTP/2 client preface (24 bytes) and the frame header of the SETTINGS frame that must
/// follow it (9 bytes): what a connection must send within [`HANDSHAKE_TIMEOUT`].
const HANDSHAKE_BYTES: usize = 24 + 9;

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

/// The `RateLimitService` implementation over a [`Daemon`]. Use [`serve`] to run it on a
/// listener.
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
        let mut decide = std::pin::pin!(self.decide(request));
        // A decision that needs no wait (the usual case) needs no timer either.
        if let Poll::Ready(outcome) = std::future::poll_fn(|cx| Poll::Ready(decide.as_mut().poll(cx))).await {
            return outcome;
        }
        within(self.call_timeout, decide).await
    }

    /// The decisions of one request.
    async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        // One policy table for the whole request, even if a reload swaps it meanwhile.
        let (config, policies) = self.daemon.current();
        let compat = config.rls.envoy_ratelimit.as_deref();
        let mut plans = plan(&policies, request, compat.is_some())?;
        crate::envoy_ratelimit::replaced(&mut plans);
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
            if let Some(unit) = crate::envoy_ratelimit::deny_all(check) {
                let name = crate::envoy_ratelimit::status_limit_name(check);
                let status = denied_status(name, unit, check.target.shadow_mode());
                if status.code == i32::from(Code::OverLimit) {
                    response.overall_code = Code::OverLimit.into();
                }
                response.statuses.push(status);
                continue;
            }
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
            let name = match compat {
                Some(_) => crate::envoy_ratelimit::status_limit_name(check),
                None => answer.label(),
            };
            let status = limited_status(name, policy.limit.spec(), &decision);
            if !decision.allowed {
                response.overall_code = Code::OverLimit.into();
            }
            response.statuses.push(status);
            if tightest.as_ref().is_none_or(|(_, best)| more_restrictive(&decision, best)) {
                tightest = Some((answer, decision));
            }
        }
        match compat {
            None => {
                if let Some((answer, decision)) = tightest
                    && let Some((policy, _)) = answer.answered()
                {
                    let period = policy.limit.spec().period;
                    response.response_headers_to_add = envoy_headers(answer.label(), period, &decision);
                }
            }
            Some(compat) => envoy_ratelimit_answer(compat, &plans, &mut response),
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

/// What `ratemeshd envoy-ratelimit` changes in an answer, as envoyproxy/ratelimit answers:
/// `duration_until_reset` in whole seconds, the overall code with quota mode (`OVER_LIMIT` when a descriptor not in quota mode is, or when
/// every quota-mode descriptor is), its headers (only when `LIMIT_RESPONSE_HEADERS_ENABLED`),
/// and `SHADOW_MODE`, under which an `OVER_LIMIT` overall code is `OK` (the descriptors'
/// statuses stay as decided).
fn envoy_ratelimit_answer(
    compat: &EnvoyRatelimitAnswers,
    plans: &[Option<ValidCheck>],
    response: &mut RateLimitResponse,
) {
    let quota: Vec<bool> = plans
        .iter()
        .map(|plan| compat.global_quota_mode || plan.as_ref().is_some_and(crate::envoy_ratelimit::quota_mode))
        .collect();
    let (mut failed, mut failed_quota, mut total_quota) = (0, 0, 0);
    for (status, &quota) in response.statuses.iter().zip(&quota) {
        let unlimited = status.current_limit.is_none() && status.limit_remaining == u32::MAX;
        if unlimited {
            continue;
        }
        let over = status.code == i32::from(Code::OverLimit);
        match quota {
            true => (failed_quota, total_quota) = (failed_quota + usize::from(over), total_quota + 1),
            false => failed += usize::from(over),
        }
    }
    // Whole seconds, rounded up, as upstream computes them from the Unix time in seconds.
    for reset in response.statuses.iter_mut().filter_map(|status| status.duration_until_reset.as_mut()) {
        if reset.nanos > 0 {
            (reset.seconds, reset.nanos) = (reset.seconds.saturating_add(1), 0);
        }
    }
    let over = failed > 0 || (total_quota > 0 && total_quota == failed_quota);
    response.overall_code = if over { Code::OverLimit } else { Code::Ok }.into();
    if let Some(names) = &compat.headers {
        response.response_headers_to_add = envoy_ratelimit_headers(names, &response.statuses, &quota);
    }
    if compat.global_shadow_mode && over {
        response.overall_code = Code::Ok.into();
    }
}

/// Runs a call's decisions, at most `timeout`; then `UNAVAILABLE` (Envoy applies its
/// `failure_mode_deny`). Dropping the decisions' future frees the call's in-flight permit.
async fn within<T>(timeout: Duration, decide: impl Future<Output = Result<T, Status>>) -> Result<T, Status> {
    tokio::time::timeout(timeout, decide)
        .await
        .unwrap_or_else(|_| Err(Status::unavailable(format!("no decision within {timeout:?}"))))
}

/// Serves the Envoy Rate Limit Service of `daemon` on `listener` until `shutdown` completes,
/// then stops accepting, sends every connection GOAWAY and waits for the calls in progress. At
/// most as many connections are open at once as `connections` has permits (see the module
/// documentation).
pub async fn serve(
    daemon: Arc<Daemon>,
    listener: TcpListener,
    connections: Arc<Semaphore>,
    timeouts: Timeouts,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let refused = daemon.metrics().connections_refused("grpc");
    let incoming = LimitedIncoming::new(TcpListenerStream::new(listener), connections, "grpc", refused)
        .first_bytes(FirstBytes { bytes: HANDSHAKE_BYTES, timeout: timeouts.handshake })
        .write_timeout(timeouts.write);
    let service = RlsService::new(daemon).with_call_timeout(timeouts.call);
    let shared = connection::Shared::new(service, timeouts.write);
    serve_connections(incoming, "gRPC", shutdown, |stream, closing| {
        let keepalive =
            socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE_TIME).with_interval(TCP_KEEPALIVE_INTERVAL);
        if let Err(error) = socket2::SockRef::from(stream.get_ref()).set_tcp_keepalive(&keepalive) {
            debug!(%error, "cannot set TCP keepalive");
        }
        let (shared, acceptor) = (shared.clone(), tls.clone().map(tokio_rustls::TlsAcceptor::from));
        async move {
            let Some(acceptor) = acceptor else {
                return connection::serve_connection(shared, stream, closing).await;
            };
            // The whole handshake within the handshake timeout, as a request head's first bytes.
            match tokio::time::timeout(timeouts.handshake, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => connection::serve_connection(shared, stream, closing).await,
                Ok(Err(error)) => debug!(%error, "gRPC connection closed during the TLS handshake"),
                Err(_) => debug!("gRPC connection closed: no TLS handshake within the handshake timeout"),
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_past_its_timeout_is_unavailable_not_cancelled() {
        let stuck = within(Duration::from_millis(20), std::future::pending::<Result<(), Status>>());
        let status = stuck.await.expect_err("timed out");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        let quick = within(Duration::from_secs(10), async { Ok::<_, Status>(7) });
        assert_eq!(quick.await.expect("in time"), 7);
    }
}
