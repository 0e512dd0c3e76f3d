//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3.RateLimitQuotaService/
//! StreamRateLimitQuotas`) on tonic's server, over a [`Daemon`]'s configuration.
//!
//! Each Envoy opens one stream per domain and reports, per bucket, the requests it allowed and
//! denied; the server answers with a token bucket per bucket (a *quota assignment*) that the
//! Envoy enforces alone until the next. Here the buckets of every stream on this node that map to
//! the same (policy, key) split the policy's rate and burst by reported demand (`alloc`).
//!
//! # Mapping
//!
//! A stream's domain (its first message's; later messages may repeat it or leave it empty) names
//! a `[[rlqs]]` table: its `policy`, and `key_entries` (the bucket-id values joined with `:` in
//! that order; unset, every entry sorted by name as `name=value` joined with `,`). The policy's
//! per-key overrides apply to the key (live ones too), and its tiers when `tier_entry` names the
//! bucket-id entry that holds the tier (one the policy lacks: its own limit); its shadow mode and
//! algorithm do not: the split is of its sustained rate (`limit` per `period_ms`) and its capacity (`burst`,
//! or `limit` for window algorithms). An `unlimited` policy answers `ALLOW_ALL`. A domain no
//! table names is answered with a blanket rule, `[rls] rlqs_unknown_domain`.
//!
//! # What Envoy gets (as its filter really behaves, FIELD-NOTES-3 §1.2)
//!
//! - Only `token_bucket` and blanket rules (Envoy ignores `requests_per_time_unit`), with
//!   whole-second fill intervals ≥ 1 s (Envoy divides by the whole seconds).
//! - A TTL of whole seconds, two report periods (`[rls] rlqs_report_period_ms`, default 5 s):
//!   every report's answer renews it; the strategy is unchanged unless the share changed, and a
//!   share changes only when a member's demand moves by more than 10 % or members come and go
//!   (`alloc`), since every change hands the Envoy a fresh bucket.
//! - Every report is answered at once, a new bucket's first (0-s) report included: a bucket of
//!   unknown demand counts as the equal share. When a report changes other streams' shares
//!   (a newcomer, a demand shift, a bucket abandoned) they are pushed to those streams at once.
//! - A bucket not reported for `[rls] rlqs_abandon_after_periods` periods gets an
//!   `abandon_action` and leaves its group.
//! - At shutdown (when it begins) every stream is ended with `OK`, so that the Envoys reconnect
//!   to another node, keeping their assignments until their TTL; new streams are refused
//!   `UNAVAILABLE` meanwhile.
//!
//! # Bad input
//!
//! `INVALID_ARGUMENT` ends the stream for: a first message without a domain, another domain
//! later, a usage without a bucket id, a bucket id without entries or with an empty name or
//! value, a bucket id without one of `key_entries`. `RESOURCE_EXHAUSTED`: a stream beyond
//! `[limits] rlqs_streams_max` (refused at once), a report that takes a stream beyond
//! `[limits] rlqs_buckets_per_stream_max` buckets, a message over [`MESSAGE_BYTES_MAX`]. A client
//! that does not read its answers for [`STALLED_WRITE_TIMEOUT`] has its stream ended; pushes to
//! it are dropped when its queue is full. Garbage that is not HTTP/2 or gRPC is refused by tonic.

pub mod alloc;
pub mod fleet;
pub mod hub;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::{
    BucketAction, bucket_action,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket, rate_limit_strategy};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};

use crate::config::{Config, RlqsDomain, UnknownDomain};
use crate::daemon::Daemon;
use crate::listener::LimitedIncoming;
use alloc::Share;
use hub::{GroupKey, Hub, Quota};
use ratemesh_core::KeyHash;

/// The largest message accepted (4 MiB, gRPC's default receive limit); a larger one ends the
/// stream `RESOURCE_EXHAUSTED`.
pub const MESSAGE_BYTES_MAX: usize = 4 << 20;
/// Answers queued per stream before pushes are dropped and the stream's own answers wait.
pub const QUEUE_LEN: usize = 16;
/// How long a stream's answer may wait for the client to take it before the stream is ended.
pub const STALLED_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// HTTP/2 streams per connection (an Envoy opens one per domain).
pub const STREAMS_PER_CONNECTION_MAX: u32 = 128;
/// The longest bucket id, all names and values together, in bytes.
pub const BUCKET_ID_BYTES_MAX: usize = 4096;

/// A daemon's RLQS state: its streams and groups, and the ledger of the keys it owns.
#[derive(Debug, Default)]
pub struct State {
    /// The node's streams and groups.
    pub hub: Arc<Hub>,
    /// What the other nodes said of the groups whose keys this node owns (`fleet`).
    pub ledger: fleet::Ledger,
    /// Fleet sync rounds completed ([`fleet::run`]).
    pub sync_rounds: AtomicU64,
    /// Groups set to the fallback part (their owner silent for [`fleet::STALE_INTERVALS`]).
    pub fallbacks: AtomicU64,
    /// Bucket reports of domains no `[[rlqs]]` names (answered `[rls] rlqs_unknown_domain`).
    pub unknown_domain_reports: AtomicU64,
}

/// The metrics label of the domains no `[[rlqs]]` names.
pub const UNKNOWN_DOMAIN_LABEL: &str = "unknown";

/// The RLQS service over a [`Daemon`].
#[derive(Debug, Clone)]
pub struct RlqsService {
    daemon: Arc<Daemon>,
    hub: Arc<Hub>,
}

impl RlqsService {
    /// The service over the daemon's streams and groups.
    pub fn new(daemon: Arc<Daemon>) -> RlqsService {
        let hub = Arc::clone(&daemon.rlqs().hub);
        RlqsService { daemon, hub }
    }

    /// The node's streams and groups.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }
}

/// Serves RLQS on `listener` until `shutdown` completes (then waits for the connections to end).
pub async fn serve(
    daemon: Arc<Daemon>,
    listener: TcpListener,
    connections: Arc<Semaphore>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), String> {
    let refused = daemon.metrics().connections_refused("rlqs");
    let incoming = LimitedIncoming::new(TcpListenerStream::new(listener), connections, "rlqs", refused);
    tokio::spawn(fleet::run(Arc::clone(&daemon)));
    let service = RateLimitQuotaServiceServer::new(RlqsService::new(daemon))
        .max_decoding_message_size(MESSAGE_BYTES_MAX)
        .max_encoding_message_size(MESSAGE_BYTES_MAX);
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(STREAMS_PER_CONNECTION_MAX))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .serve_with_incoming_shutdown(service, incoming, shutdown)
        .await
        .map_err(|error| error.to_string())
}

type Answers = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        if self.daemon.is_shutting_down() {
            return Err(Status::unavailable("shutting down"));
        }
        let (config, _) = self.daemon.current();
        let (tx, rx) = mpsc::channel(QUEUE_LEN);
        let Some(id) = self.hub.open(tx.clone(), config.limits.rlqs_streams_max) else {
            return Err(Status::resource_exhausted(format!(
                "more than {} RLQS streams on this node (limits.rlqs_streams_max)",
                config.limits.rlqs_streams_max
            )));
        };
        let stream = StreamState {
            id,
            daemon: Arc::clone(&self.daemon),
            hub: Arc::clone(&self.hub),
            domain: None,
            buckets: HashMap::new(),
        };
        tokio::spawn(stream.run(request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// A bucket a stream reported.
#[derive(Debug)]
struct Tracked {
    /// Its group, when its domain maps to a limited policy.
    group: Option<GroupKey>,
    last_report: Instant,
    bucket_id: BucketId,
}

struct StreamState {
    id: u64,
    daemon: Arc<Daemon>,
    hub: Arc<Hub>,
    domain: Option<String>,
    /// By canonical bucket id ([`canonical`]).
    buckets: HashMap<String, Tracked>,
}

impl StreamState {
    async fn run(
        mut self,
        mut inbound: Streaming<RateLimitQuotaUsageReports>,
        tx: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    ) {
        let period = self.daemon.current().0.rlqs.report_period;
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let shutdown = self.daemon.shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            let answer = tokio::select! {
                message = inbound.message() => match message {
                    Ok(Some(reports)) => self.on_reports(reports).await,
                    Ok(None) => break,
                    Err(status) => Err(refusal(status)),
                },
                _ = tick.tick() => Ok(self.abandon_silent()),
                () = &mut shutdown => break,
            };
            let end = answer.is_err();
            let answer = match answer {
                Ok(actions) if actions.is_empty() => continue,
                Ok(actions) => Ok(RateLimitQuotaResponse { bucket_action: actions }),
                Err(status) => {
                    debug!(stream = self.id, %status, "RLQS stream refused");
                    Err(status)
                }
            };
            if tokio::time::timeout(STALLED_WRITE_TIMEOUT, tx.send(answer))
                .await
                .map_or(true, |sent| sent.is_err())
            {
                break;
            }
            if end {
                break;
            }
        }
        let ttl = ttl_s(&self.daemon.current().0);
        let members = self.buckets.into_iter().filter_map(|(canon, t)| Some((t.group?, canon)));
        self.hub.close(self.id, members, ttl);
    }

    /// One message: its actions, in the order of its usages. Groups new on this node wait for
    /// their part from the keys' owners (one fleet round, at most a sync interval).
    async fn on_reports(&mut self, reports: RateLimitQuotaUsageReports) -> Result<Vec<BucketAction>, Status> {
        match &self.domain {
            None if reports.domain.is_empty() => {
                return Err(Status::invalid_argument("the first report of a stream must name its domain"));
            }
            None => self.domain = Some(reports.domain.clone()),
            Some(domain) if !reports.domain.is_empty() && reports.domain != *domain => {
                return Err(Status::invalid_argument(format!(
                    "the stream's domain is {domain:?}, not {:?}: open a new stream for another domain",
                    reports.domain
                )));
            }
            Some(_) => {}
        }
        let (config, policies) = self.daemon.current();
        let domain = self.domain.clone().unwrap_or_default();
        let table = config.rlqs.domains.iter().find(|d| d.domain == domain);
        let cap = config.limits.rlqs_buckets_per_stream_max;
        let ttl = ttl_s(&config);
        let now = Instant::now();
        let mut answered = Vec::with_capacity(reports.bucket_quota_usages.len());
        let mut unknown = HashSet::new();
        for usage in reports.bucket_quota_usages {
            let bucket_id =
                usage.bucket_id.ok_or_else(|| Status::invalid_argument("a usage without bucket_id"))?;
            let canon = canonical(&bucket_id)?;
            if !self.buckets.contains_key(&canon) && self.buckets.len() >= cap {
                return Err(Status::resource_exhausted(format!(
                    "more than {cap} buckets on one RLQS stream (limits.rlqs_buckets_per_stream_max)"
                )));
            }
            let elapsed_s = usage.time_elapsed.map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9);
            let requests = usage.num_requests_allowed.saturating_add(usage.num_requests_denied);
            let target = match table {
                None => Target::Blanket(config.rlqs.unknown_domain),
                Some(table) => target(table, &bucket_id, &policies)?,
            };
            let group = match &target {
                Target::Group(group, ..) => Some(group.clone()),
                Target::Blanket(_) => None,
            };
            // A reload may move a bucket to another group: it leaves the old one first.
            if let Some(old) = self.buckets.get(&canon).and_then(|t| t.group.clone())
                && group.as_ref() != Some(&old)
            {
                self.hub.leave(self.id, &old, &canon, ttl);
            }
            if let Target::Group(group, hash, limit) = &target {
                let known = self
                    .hub
                    .report(self.id, group, *hash, &canon, &bucket_id, *limit, requests, elapsed_s, ttl);
                if !known {
                    unknown.insert(group.clone());
                }
            }
            answered.push((canon.clone(), bucket_id.clone(), target));
            self.buckets.insert(canon, Tracked { group, last_report: now, bucket_id });
        }
        let label = table.map_or(UNKNOWN_DOMAIN_LABEL, |t| t.domain.as_str());
        self.hub.describe(self.id, label, self.buckets.len());
        if table.is_none() {
            let reports = u64::try_from(answered.len()).unwrap_or(u64::MAX);
            self.daemon
                .rlqs()
                .unknown_domain_reports
                .fetch_add(reports, std::sync::atomic::Ordering::Relaxed);
        }
        if !unknown.is_empty() {
            fleet::sync(&self.daemon, Some(&unknown)).await;
        }
        Ok(answered
            .into_iter()
            .map(|(canon, bucket_id, target)| match target {
                Target::Blanket(rule) => blanket(bucket_id, rule, ttl),
                Target::Group(group, ..) => {
                    assignment(bucket_id, self.hub.share(self.id, &group, &canon), ttl)
                }
            })
            .collect())
    }

    /// Abandons the buckets not reported for `abandon_after_periods` periods.
    fn abandon_silent(&mut self) -> Vec<BucketAction> {
        let config = self.daemon.current().0;
        let silence = config.rlqs.report_period.saturating_mul(config.rlqs.abandon_after_periods);
        let ttl = ttl_s(&config);
        let now = Instant::now();
        let silent: Vec<String> = self
            .buckets
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(t.last_report) >= silence)
            .map(|(canon, _)| canon.clone())
            .collect();
        let mut actions = Vec::with_capacity(silent.len());
        for canon in silent {
            let Some(tracked) = self.buckets.remove(&canon) else { continue };
            if let Some(group) = &tracked.group {
                self.hub.leave(self.id, group, &canon, ttl);
            }
            actions.push(BucketAction {
                bucket_id: Some(tracked.bucket_id),
                bucket_action: Some(bucket_action::BucketAction::AbandonAction(
                    bucket_action::AbandonAction {},
                )),
            });
        }
        actions
    }
}

/// What a bucket's answer comes from.
enum Target {
    /// A blanket rule.
    Blanket(UnknownDomain),
    /// A share of a group's limit; the key's bucket finds its owner.
    Group(GroupKey, KeyHash, Quota),
}

/// The group of `bucket_id` under `table`, with its limit now.
fn target(table: &RlqsDomain, bucket_id: &BucketId, policies: &crate::PolicyTable) -> Result<Target, Status> {
    let key = key_of(table, bucket_id)?;
    let Some(base) = policies.get(&table.policy) else {
        return Ok(Target::Blanket(UnknownDomain::AllowAll));
    };
    // The owner is the key's under the policy's own name, whatever tier or override applies:
    // one key, one owner, one split (of the smallest limit the nodes report).
    let hash = base.namespace.key(key.as_bytes());
    // The key's override, else the tier the bucket names (one the policy lacks: its own limit).
    let tier = table.tier_entry.as_ref().and_then(|name| bucket_id.bucket.get(name));
    let entry = base.resolve(&key, tier.map(String::as_str)).unwrap_or_else(|_| Arc::clone(base));
    let Some(policy) = entry.rule.policy() else {
        return Ok(Target::Blanket(UnknownDomain::AllowAll));
    };
    let limit = &policy.limit;
    let period_s = limit.spec().period.as_secs_f64();
    let rate = if period_s > 0.0 { limit.reported_limit() as f64 / period_s } else { 0.0 };
    let quota = Quota { rate, burst: limit.capacity() };
    Ok(Target::Group(GroupKey { policy: table.policy.clone(), key }, hash, quota))
}

/// The key of `bucket_id` under `table` (see the module's documentation).
pub fn key_of(table: &RlqsDomain, bucket_id: &BucketId) -> Result<String, Status> {
    match &table.key_entries {
        Some(names) => {
            let mut values = Vec::with_capacity(names.len());
            for name in names {
                let value = bucket_id.bucket.get(name).ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "the bucket id has no entry {name:?}, which [[rlqs]] domain {:?} keys on",
                        table.domain
                    ))
                })?;
                values.push(value.as_str());
            }
            Ok(values.join(":"))
        }
        None => {
            let mut entries: Vec<(&String, &String)> = bucket_id.bucket.iter().collect();
            entries.sort();
            Ok(entries.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
        }
    }
}

/// An unambiguous form of a bucket id (entries sorted by name, each length-prefixed), after
/// checking it: at least one entry, no empty name or value, at most [`BUCKET_ID_BYTES_MAX`].
pub fn canonical(bucket_id: &BucketId) -> Result<String, Status> {
    if bucket_id.bucket.is_empty() {
        return Err(Status::invalid_argument("an empty bucket id"));
    }
    let mut entries: Vec<(&String, &String)> = bucket_id.bucket.iter().collect();
    entries.sort();
    let mut canon = String::new();
    for (name, value) in entries {
        if name.is_empty() || value.is_empty() {
            return Err(Status::invalid_argument(format!(
                "bucket id entry {name:?} = {value:?}: names and values must not be empty"
            )));
        }
        canon.push_str(&format!("{}:{name}{}:{value}", name.len(), value.len()));
        if canon.len() > BUCKET_ID_BYTES_MAX {
            return Err(Status::invalid_argument(format!("a bucket id over {BUCKET_ID_BYTES_MAX} bytes")));
        }
    }
    Ok(canon)
}

/// The TTL of assignments: two report periods, in whole seconds (at least 1).
pub fn ttl_s(config: &Config) -> u64 {
    let twice = config.rlqs.report_period.saturating_mul(2);
    twice.as_secs() + u64::from(twice.subsec_nanos() > 0)
}

/// A response of `actions`.
pub fn response(actions: impl IntoIterator<Item = BucketAction>) -> RateLimitQuotaResponse {
    RateLimitQuotaResponse { bucket_action: actions.into_iter().collect() }
}

fn quota(bucket_id: BucketId, strategy: rate_limit_strategy::Strategy, ttl_s: u64) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
            bucket_action::QuotaAssignmentAction {
                assignment_time_to_live: Some(ProtoDuration {
                    seconds: i64::try_from(ttl_s).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
                rate_limit_strategy: Some(RateLimitStrategy { strategy: Some(strategy) }),
            },
        )),
    }
}

fn blanket(bucket_id: BucketId, rule: UnknownDomain, ttl_s: u64) -> BucketAction {
    let rule = match rule {
        UnknownDomain::AllowAll => rate_limit_strategy::BlanketRule::AllowAll,
        UnknownDomain::DenyAll => rate_limit_strategy::BlanketRule::DenyAll,
    };
    quota(bucket_id, rate_limit_strategy::Strategy::BlanketRule(rule as i32), ttl_s)
}

/// The quota assignment of `share` to `bucket_id`.
pub fn assignment(bucket_id: BucketId, share: Share, ttl_s: u64) -> BucketAction {
    match share {
        Share::DenyAll => blanket(bucket_id, UnknownDomain::DenyAll, ttl_s),
        Share::Bucket { tokens_per_fill, fill_interval_s, max_tokens } => {
            let u32_of = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
            let bucket = TokenBucket {
                max_tokens: u32_of(max_tokens),
                tokens_per_fill: Some(UInt32Value { value: u32_of(tokens_per_fill) }),
                fill_interval: Some(ProtoDuration {
                    seconds: i64::try_from(fill_interval_s).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
            };
            quota(bucket_id, rate_limit_strategy::Strategy::TokenBucket(bucket), ttl_s)
        }
    }
}

/// A decode error as the status the stream ends with: a message over the size bound is
/// `RESOURCE_EXHAUSTED` (tonic says `OUT_OF_RANGE`), as gRPC servers answer it.
fn refusal(status: Status) -> Status {
    if status.code() == tonic::Code::OutOfRange && status.message().contains("message length too large") {
        warn!("RLQS message over {MESSAGE_BYTES_MAX} bytes refused");
        return Status::resource_exhausted(format!("a message over {MESSAGE_BYTES_MAX} bytes"));
    }
    status
}

#[cfg(test)]
mod tests;
