//! The daemon's Prometheus metrics (`GET /metrics`), with the `prometheus-client` crate.
//!
//! Two kinds of metrics:
//!
//! - recorded as requests are served ([`Metrics`]'s methods): decisions per policy, fill ratio,
//!   HTTP latency, in-flight requests, shed requests and refused connections (HTTP and gRPC),
//!   shadow-mode checks that failed, reloads;
//! - read from the node at scrape time ([`NodeCollector`]): the protocol's, store's and
//!   transport's counters and the members, so that a scrape shows the node as it is now and the
//!   hot path pays nothing for them.
//!
//! Label cardinality is bounded: `policy` is a configured policy's name (at most
//! `POLICIES_MAX` of them) or `inline`, never a client's key; `route` is one of the fixed API
//! paths or `other`; `status` is an HTTP status code; `server` is `http` or `grpc`. The series of
//! a policy that a reload removed are removed with it ([`Metrics::forget_policies`]), so that a
//! file edited many times does not accumulate the labels of every name it ever had.

use std::fmt::Write as _;
use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric as _};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use ratemesh::durable::SnapshotMetrics;
use ratemesh::{GossipHealth, Member, MemberStatus, Node};
use ratemesh_core::Decision;

use crate::check::{Answer, Verdict};
use crate::rates::RateHistory;

/// The content type of [`Metrics::encode`]'s output: OpenMetrics text, which Prometheus scrapes
/// natively and whose samples are also valid Prometheus text-format lines.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How a check was answered, as the `decision` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // The variant names are the label values.
pub enum DecisionLabel {
    /// Admitted.
    allowed,
    /// Refused (answered with 429 / OVER_LIMIT).
    refused,
    /// Would have been refused, but the policy is in shadow mode: answered as allowed.
    shadow_refused,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyDecision {
    policy: String,
    decision: DecisionLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShedLabels {
    server: &'static str,
    route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    server: &'static str,
}

/// Whether a decision was taken with remaining below 10 % of the limit (a refusal always is:
/// nothing remains for it).
pub fn is_near_limit(decision: &Decision) -> bool {
    !decision.allowed || u128::from(decision.remaining) * 10 < u128::from(decision.limit)
}

/// Every value of [`DecisionLabel`], to remove a policy's series whatever its decisions were.
const DECISION_LABELS: [DecisionLabel; 3] =
    [DecisionLabel::allowed, DecisionLabel::refused, DecisionLabel::shadow_refused];

/// The daemon's metrics registry and the metrics it records.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<PolicyDecision, Counter>,
    over_limit: Family<PolicyLabels, Counter>,
    fill_ratio: Family<PolicyLabels, Histogram, fn() -> Histogram>,
    near_limit: Family<PolicyLabels, Counter>,
    limited_decisions: Family<PolicyLabels, Counter>,
    rates: RateHistory,
    http_duration: Family<RouteLabels, Histogram, fn() -> Histogram>,
    http_in_flight: Gauge,
    shed: Family<ShedLabels, Counter>,
    connections_refused: Family<ServerLabels, Counter>,
    shadow_errors: Family<PolicyLabels, Counter>,
    reloads: Family<ResultLabels, Counter>,
}

fn fill_ratio_histogram() -> Histogram {
    // Tenths (written out: summed floats would print as 0.30000000000000004), enough to see
    // whether keys run near their limit.
    Histogram::new([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
}

fn http_duration_histogram() -> Histogram {
    // 50 µs to ~1.6 s: a local decision takes microseconds, a forwarded one a round trip, a
    // fallback after a timeout up to the forward timeout.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

impl Metrics {
    /// A registry with every metric registered, reading the node's counters at scrape time.
    pub fn new(node: Node) -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::<PolicyDecision, Counter>::default();
        registry.register(
            "ratemesh_requests",
            "Checks answered, by policy and decision (allowed, refused, shadow_refused)",
            requests.clone(),
        );
        let over_limit = Family::<PolicyLabels, Counter>::default();
        registry.register(
            "ratemesh_over_limit",
            "Checks over their limit (refused, or would have been in shadow mode), by policy",
            over_limit.clone(),
        );
        let fill_ratio = Family::new_with_constructor(fill_ratio_histogram as fn() -> Histogram);
        registry.register(
            "ratemesh_bucket_fill_ratio",
            "1 - remaining/limit of the key at decision time, by policy",
            fill_ratio.clone(),
        );
        let near_limit = Family::<PolicyLabels, Counter>::default();
        registry.register(
            "ratemesh_near_limit_decisions",
            "Decisions taken with remaining below 10 % of the limit (refusals included), by policy: divide by \
             ratemesh_limited_decisions for the share of decisions near the limit",
            near_limit.clone(),
        );
        let limited_decisions = Family::<PolicyLabels, Counter>::default();
        registry.register(
            "ratemesh_limited_decisions",
            "Decisions on a bucket (unlimited policies excluded), by policy: the denominator of \
             ratemesh_near_limit_decisions",
            limited_decisions.clone(),
        );
        let http_duration = Family::new_with_constructor(http_duration_histogram as fn() -> Histogram);
        registry.register(
            "ratemesh_http_request_duration_seconds",
            "HTTP API request latency, by route and status",
            http_duration.clone(),
        );
        let http_in_flight = Gauge::default();
        registry.register(
            "ratemesh_http_in_flight_requests",
            "HTTP API requests being served",
            http_in_flight.clone(),
        );
        let shed = Family::<ShedLabels, Counter>::default();
        registry.register(
            "ratemesh_shed_requests",
            "Requests refused at once for overload (HTTP 503, gRPC UNAVAILABLE): every in-flight permit \
             of their pool was taken, by server (http, grpc) and route",
            shed.clone(),
        );
        let connections_refused = Family::<ServerLabels, Counter>::default();
        registry.register(
            "ratemesh_connections_refused",
            "TCP connections closed at once because limits.connections_max were open, by server (http, grpc)",
            connections_refused.clone(),
        );
        let shadow_errors = Family::<PolicyLabels, Counter>::default();
        registry.register(
            "ratemesh_shadow_check_errors",
            "Checks of a shadow-mode policy that could not be decided (answered OK: shadow mode never \
             enforces), by policy",
            shadow_errors.clone(),
        );
        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "ratemesh_config_reloads",
            "Configuration reloads, by result (applied, unchanged, refused)",
            reloads.clone(),
        );
        registry.register_collector(Box::new(NodeCollector { node }));
        Metrics {
            registry,
            requests,
            over_limit,
            fill_ratio,
            near_limit,
            limited_decisions,
            rates: RateHistory::default(),
            http_duration,
            http_in_flight,
            shed,
            connections_refused,
            shadow_errors,
            reloads,
        }
    }

    /// Records a check's answer under its policy's label (a name or `inline`): an unlimited
    /// policy's as allowed, with no bucket (not a limited decision); a decision as the node made
    /// it, a refusal in shadow mode as `shadow_refused`.
    pub fn record(&self, answer: &Answer) {
        let policy = answer.label();
        let Verdict::Limited { decision, .. } = &answer.verdict else {
            let labels = PolicyDecision { policy: policy.to_owned(), decision: DecisionLabel::allowed };
            self.requests.get_or_create(&labels).inc();
            return;
        };
        let label = match (decision.allowed, answer.shadow_refused()) {
            (true, _) => DecisionLabel::allowed,
            (false, false) => DecisionLabel::refused,
            (false, true) => DecisionLabel::shadow_refused,
        };
        self.requests.get_or_create(&PolicyDecision { policy: policy.to_owned(), decision: label }).inc();
        self.rates.record(policy, decision.allowed);
        let labels = PolicyLabels { policy: policy.to_owned() };
        if !decision.allowed {
            self.over_limit.get_or_create(&labels).inc();
        }
        if decision.limit > 0 {
            // Remaining can exceed the limit transiently (a burst above the rate): clamp at 0.
            let fill = 1.0 - (decision.remaining as f64 / decision.limit as f64);
            self.fill_ratio.get_or_create(&labels).observe(fill.clamp(0.0, 1.0));
        }
        self.limited_decisions.get_or_create(&labels).inc();
        if is_near_limit(decision) {
            self.near_limit.get_or_create(&labels).inc();
        }
    }

    /// Records an HTTP request's latency. `route` is a fixed route name (bounded cardinality).
    pub fn record_http(&self, route: &'static str, status: u16, elapsed: Duration) {
        self.http_duration.get_or_create(&RouteLabels { route, status }).observe(elapsed.as_secs_f64());
    }

    /// The gauge of HTTP requests in flight.
    pub fn http_in_flight(&self) -> &Gauge {
        &self.http_in_flight
    }

    /// Counts a request shed for overload by `server` (`http` or `grpc`) on `route` (a fixed
    /// route name).
    pub fn record_shed(&self, server: &'static str, route: &'static str) {
        self.shed.get_or_create(&ShedLabels { server, route }).inc();
    }

    /// The counter of connections that `server` (`http` or `grpc`) closed at once because its
    /// connection bound was reached; the listener increments it.
    pub fn connections_refused(&self, server: &'static str) -> Counter {
        self.connections_refused.get_or_create(&ServerLabels { server }).clone()
    }

    /// Counts a check of the shadow-mode policy labelled `policy` that failed (answered as if
    /// allowed).
    pub fn record_shadow_error(&self, policy: &str) {
        self.shadow_errors.get_or_create(&PolicyLabels { policy: policy.to_owned() }).inc();
    }

    /// Removes every series labelled with one of the policies `names` (a reload removed them).
    /// A request still in flight under the old policy table may record one more sample after
    /// this, bringing a series back until the next reload that forgets it: harmless, and rare.
    pub fn forget_policies<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            let labels = PolicyLabels { policy: name.to_owned() };
            for decision in DECISION_LABELS {
                self.requests.remove(&PolicyDecision { policy: name.to_owned(), decision });
            }
            self.over_limit.remove(&labels);
            self.fill_ratio.remove(&labels);
            self.near_limit.remove(&labels);
            self.rates.forget(name);
            self.limited_decisions.remove(&labels);
            self.shadow_errors.remove(&labels);
        }
    }

    /// The recent decision rates per policy (for the dashboard).
    pub fn rates(&self) -> &RateHistory {
        &self.rates
    }

    /// Counts a reload attempt: `result` is `applied`, `unchanged` or `refused`.
    pub fn record_reload(&self, result: &'static str) {
        self.reloads.get_or_create(&ResultLabels { result }).inc();
    }

    /// The registry in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(8 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Reads a node's counters and gauges at scrape time.
#[derive(Debug)]
pub struct NodeCollector {
    node: Node,
}

/// Writes one unlabelled counter (`name` gets the `_total` suffix).
fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// Writes one unlabelled gauge.
fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// Saturating conversion for gauges (counts of things in memory never come near `i64::MAX`).
fn gauge_value(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl prometheus_client::collector::Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = self.node.metrics();
        let p = &m.protocol;
        let d = &p.delivery;
        let t = &m.transport;
        let g = &m.gossip;
        let e = &mut encoder;
        // (name, help, value): every counter of the node, in exposition order.
        let counters: [(&str, &str, u64); 37] = [
            ("ratemesh_owner_decisions", "Checks decided by this node as the key's owner", p.owner_decisions),
            (
                "ratemesh_allowance_decisions",
                "Checks decided locally from an allowance",
                p.allowance_decisions,
            ),
            (
                "ratemesh_fallback_decisions",
                "Checks decided by the fallback policy (owner unreachable, no grant, forward timed out)",
                p.fallback_decisions,
            ),
            ("ratemesh_forwarded", "Checks forwarded to the key's owner", p.forwarded),
            ("ratemesh_forward_timeouts", "Forwarded checks that timed out", p.forward_timeouts),
            (
                "ratemesh_forward_batches",
                "Forward batches sent; ratemesh_forwarded_total / ratemesh_forward_batches_total is the mean batch length",
                p.forward_batches,
            ),
            ("ratemesh_reports_sent", "Usage report items sent to owners", p.reports_sent),
            ("ratemesh_grants_sent", "Allowance grant items sent", p.grants_sent),
            ("ratemesh_handoffs_sent", "Keys handed over to a new owner", p.handoffs_sent),
            ("ratemesh_handoffs_received", "Keys received from a previous owner", p.handoffs_received),
            ("ratemesh_replicas_sent", "Key states sent to ring successors", p.replicas_sent),
            ("ratemesh_replicas_received", "Key states received as replicas", p.replicas_received),
            ("ratemesh_items_refused", "Items from peers refused as invalid", p.items_refused),
            ("ratemesh_membership_changes", "Membership views applied", p.membership_changes),
            ("ratemesh_sync_rounds", "Sync rounds run", p.sync_rounds),
            ("ratemesh_frames_sent", "Protocol frames sent", d.frames_sent),
            ("ratemesh_frames_received", "Protocol frames received and accepted", d.frames_received),
            ("ratemesh_retransmits", "Protocol frames retransmitted", d.retransmits),
            ("ratemesh_duplicate_frames", "Protocol frames received twice", d.duplicates),
            ("ratemesh_malformed_frames", "Protocol frames that did not decode", d.malformed),
            (
                "ratemesh_overflowed_frames",
                "Frames dropped because a retransmission buffer was full",
                d.overflowed,
            ),
            ("ratemesh_transport_sent_bytes", "Bytes written to peers", t.sent_bytes),
            ("ratemesh_transport_received_bytes", "Bytes received from peers", t.received_bytes),
            (
                "ratemesh_transport_send_dropped_frames",
                "Frames dropped on the send side",
                t.send_dropped_frames,
            ),
            (
                "ratemesh_transport_receive_dropped_frames",
                "Incoming streams dropped",
                t.receive_dropped_frames,
            ),
            (
                "ratemesh_transport_connections_opened",
                "Outbound peer connections established",
                t.connections_opened,
            ),
            ("ratemesh_transport_connect_failures", "Outbound peer connects that failed", t.connect_failures),
            (
                "ratemesh_transport_connections_accepted",
                "Inbound peer connections authenticated",
                t.connections_accepted,
            ),
            (
                "ratemesh_transport_handshake_rejections",
                "Inbound peer handshakes that failed (no or foreign certificate)",
                t.handshake_rejections,
            ),
            ("ratemesh_store_inserted", "Keys inserted in the key table", m.store.inserted),
            ("ratemesh_store_expired", "Keys dropped from the key table once fresh again", m.store.expired),
            ("ratemesh_evictions", "Keys evicted from the full key table", m.store.evicted),
            (
                "ratemesh_logs_coarsened",
                "Times a sliding window log was coarsened to stay within the node's log byte bound",
                m.store.logs_coarsened,
            ),
            (
                "ratemesh_gossip_datagrams_received",
                "Datagrams received on the gossip port",
                g.datagrams_received,
            ),
            ("ratemesh_gossip_datagrams_sent", "Sealed gossip datagrams sent", g.datagrams_sent),
            ("ratemesh_gossip_send_failures", "Gossip messages that could not be sent", g.send_failures),
            (
                "ratemesh_gossip_restarts",
                "Times gossip ended while the node ran and was restarted (see the log for why)",
                g.restarts,
            ),
        ];
        for (name, help, value) in counters {
            counter(e, name, help, value)?;
        }
        gauge(e, "ratemesh_keys", "Keys tracked by this node (owned and followed)", gauge_value(m.keys))?;
        gauge(
            e,
            "ratemesh_log_bytes",
            "Bytes the sliding window logs' entries take on this node (bounded by limits.log_bytes_max)",
            i64::try_from(m.store.log_bytes).unwrap_or(i64::MAX),
        )?;
        gauge(
            e,
            "ratemesh_checks_waiting",
            "Checks waiting for their owner's answer",
            gauge_value(m.checks_waiting),
        )?;
        let lag = ConstGauge::new(m.sync_lag.as_secs_f64());
        let lag_family = e.encode_descriptor(
            "ratemesh_sync_lag_seconds",
            "How late the node ran its last due timers (sync rounds, retransmissions) after their deadline",
            None,
            lag.metric_type(),
        )?;
        lag.encode(lag_family)?;
        let rtt = ConstGauge::new(0.0_f64);
        let mut rtt_family = e.encode_descriptor(
            "ratemesh_peer_rtt_seconds",
            "Smoothed round-trip time to each peer (label: its node id; bounded by the cluster's size)",
            None,
            rtt.metric_type(),
        )?;
        for (peer, round_trip) in &m.peer_round_trips {
            let labels = [("peer", peer.0.to_string())];
            ConstGauge::new(round_trip.as_secs_f64()).encode(rtt_family.encode_family(&labels)?)?;
        }
        let rejected = ConstCounter::new(0_u64);
        let mut rejected_family = e.encode_descriptor(
            "ratemesh_gossip_rejected",
            "Gossip datagrams dropped unanswered, by reason: unauthenticated (not sealed, or forged), \
             unknown_key (another secret), replayed, malformed or over_bound (authentic: an insider's)",
            None,
            rejected.metric_type(),
        )?;
        for (reason, count) in [
            ("unauthenticated", g.rejected_unauthenticated),
            ("unknown_key", g.rejected_unknown_key),
            ("replayed", g.rejected_replayed),
            ("malformed", g.rejected_malformed),
            ("over_bound", g.rejected_over_bound),
        ] {
            ConstCounter::new(count).encode(rejected_family.encode_family(&[("reason", reason)])?)?;
        }
        let running = matches!(self.node.gossip_health(), GossipHealth::Running);
        gauge(
            e,
            "ratemesh_gossip_running",
            "1 while gossip runs, 0 while it is being restarted",
            i64::from(running),
        )?;
        let members = ConstGauge::new(0_i64);
        let mut family = e.encode_descriptor(
            "ratemesh_members",
            "Cluster members as this node sees them, by status",
            None,
            members.metric_type(),
        )?;
        for (status, count) in
            [("live", m.members_live), ("dead", m.members_dead), ("unverified", m.members_unverified)]
        {
            let labels = [("status", status)];
            ConstGauge::new(gauge_value(count)).encode(family.encode_family(&labels)?)?;
        }
        encode_snapshots(e, &m.snapshots)
    }
}

/// Writes one unlabelled gauge of seconds.
fn gauge_seconds(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: Duration,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(value.as_secs_f64());
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// The durable quotas' metrics, `ratemesh_snapshot_*`.
fn encode_snapshots(e: &mut DescriptorEncoder, s: &SnapshotMetrics) -> Result<(), std::fmt::Error> {
    counter(e, "ratemesh_snapshot_writes", "Snapshots of durable quotas written", s.writes)?;
    counter(
        e,
        "ratemesh_snapshot_write_failures",
        "Snapshots that could not be written (the previous one stays)",
        s.write_failures,
    )?;
    gauge(
        e,
        "ratemesh_snapshot_keys",
        "Keys in the last snapshot written",
        gauge_value(s.last_keys as usize),
    )?;
    gauge(
        e,
        "ratemesh_snapshot_bytes",
        "Bytes of the last snapshot written",
        gauge_value(s.last_bytes as usize),
    )?;
    gauge_seconds(
        e,
        "ratemesh_snapshot_duration_seconds",
        "How long the last snapshot took: export, encoding and the atomic write",
        s.last_duration,
    )?;
    gauge_seconds(
        e,
        "ratemesh_snapshot_export_seconds",
        "How long the last snapshot held the node's lock (checks wait meanwhile)",
        s.last_export,
    )?;
    if let Some(written) = s.last_written_unix_nanos {
        let now = ratemesh::durable::unix_nanos_now();
        let age = Duration::from_nanos(now.saturating_sub(written));
        gauge_seconds(e, "ratemesh_snapshot_age_seconds", "Time since the last snapshot was written", age)?;
    }
    gauge(
        e,
        "ratemesh_snapshot_loaded_keys",
        "Keys taken back from the snapshot at start",
        gauge_value(s.loaded_keys as usize),
    )?;
    let result = ConstGauge::new(1_i64);
    let mut family = e.encode_descriptor(
        "ratemesh_snapshot_load",
        "What the start made of the stored snapshot: 1 for the result (disabled, none, loaded, refused_corrupt, \
         refused_version, refused_foreign, error)",
        None,
        result.metric_type(),
    )?;
    result.encode(family.encode_family(&[("result", s.load_result)])?)
}

/// The `status` label and JSON name of a member status.
pub fn status_name(status: MemberStatus) -> &'static str {
    match status {
        MemberStatus::Live => "live",
        MemberStatus::Dead => "dead",
        MemberStatus::Unverified => "unverified",
    }
}

/// A one-line summary of members, for logs: `1 live, 2 live, 3 dead`.
pub fn members_summary(members: &[Member]) -> String {
    let mut out = String::new();
    for (i, member) in members.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        // Writing to a String cannot fail.
        let _ = write!(out, "{sep}{} {}", member.id.0, status_name(member.status));
    }
    out
}
