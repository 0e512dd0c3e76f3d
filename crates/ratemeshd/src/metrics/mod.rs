//! The daemon's Prometheus metrics (`GET /metrics`), with the `prometheus-client` crate.
//!
//! Two kinds of metrics:
//!
//! - recorded as requests are served ([`Metrics`]'s methods): decisions per policy, fill ratio,
//!   HTTP latency, in-flight requests, shed requests and refused connections (HTTP and gRPC),
//!   shadow-mode checks that failed, reloads;
//! - read from the node at scrape time (`node::NodeCollector`, every counter of the library's `NodeMetrics`): the protocol's, store's and
//!   transport's counters and the members, so that a scrape shows the node as it is now and the
//!   hot path pays nothing for them; and the RLQS streams and quota shares
//!   (`rlqs::RlqsCollector`); and the audit's figures per policy and window, over the keys
//!   this node owns (`audit::AuditCollector`).
//!
//! Label cardinality is bounded: `policy` is a configured policy's name (at most
//! `POLICIES_MAX` of them) or `inline`, never a client's key; `route` is one of the fixed API
//! paths or `other`; `status` is an HTTP status code; `server` is `http` or `grpc`. The series of
//! a policy that a reload removed are removed with it ([`Metrics::forget_policies`]), so that a
//! file edited many times does not accumulate the labels of every name it ever had.

mod audit;
mod node;
mod rlqs;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use ratemesh::{Member, MemberStatus, Node, RwLock};
use ratemesh_core::Decision;

use crate::check::{Answer, Verdict};
use crate::policy::PolicyTable;
use crate::rates::RateHistory;
use node::NodeCollector;

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

/// What a client's adjustment did, as the `adjustment` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // The variant names are the label values.
pub enum AdjustmentLabel {
    /// Hits given back (a negative cost on `/v1/check`, RLS `is_negative_hits`).
    refund,
    /// Hits charged after the fact (`/v1/charge`).
    charge,
}

impl From<ratemesh::Adjustment> for AdjustmentLabel {
    fn from(adjustment: ratemesh::Adjustment) -> Self {
        match adjustment {
            ratemesh::Adjustment::Refund => AdjustmentLabel::refund,
            ratemesh::Adjustment::Charge => AdjustmentLabel::charge,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyAdjustment {
    policy: String,
    adjustment: AdjustmentLabel,
}

/// Every value of [`AdjustmentLabel`], to remove a policy's series.
const ADJUSTMENT_LABELS: [AdjustmentLabel; 2] = [AdjustmentLabel::refund, AdjustmentLabel::charge];

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
    adjustments: Family<PolicyAdjustment, Counter>,
    adjusted_hits: Family<PolicyAdjustment, Counter>,
    rates: RateHistory,
    http_duration: Family<RouteLabels, Histogram, fn() -> Histogram>,
    http_in_flight: Gauge,
    shed: Family<ShedLabels, Counter>,
    connections_refused: Family<ServerLabels, Counter>,
    shadow_errors: Family<PolicyLabels, Counter>,
    reloads: Family<ResultLabels, Counter>,
    /// The policies in force, for the audit's labels.
    policies: Arc<RwLock<Arc<PolicyTable>>>,
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
    pub fn new(node: Node, rlqs: Arc<crate::rlqs::State>) -> Metrics {
        let policies = Arc::new(RwLock::new(Arc::new(PolicyTable::default())));
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
        let adjustments = Family::<PolicyAdjustment, Counter>::default();
        registry.register(
            "ratemesh_adjustments",
            "Refunds and charges applied (not checks: ratemesh_requests counts those), by policy and \
             adjustment (refund, charge)",
            adjustments.clone(),
        );
        let adjusted_hits = Family::<PolicyAdjustment, Counter>::default();
        registry.register(
            "ratemesh_adjusted_hits",
            "Hits refunded or charged, by policy and adjustment (refund, charge)",
            adjusted_hits.clone(),
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
             of their pool was taken, by server (http, grpc, resp) and route",
            shed.clone(),
        );
        let connections_refused = Family::<ServerLabels, Counter>::default();
        registry.register(
            "ratemesh_connections_refused",
            "TCP connections closed at once because limits.connections_max were open, by server (http, grpc, resp)",
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
        let audit = audit::AuditCollector { node: node.clone(), policies: Arc::clone(&policies) };
        registry.register_collector(Box::new(NodeCollector { node }));
        registry.register_collector(Box::new(audit));
        registry.register_collector(Box::new(rlqs::RlqsCollector { state: rlqs }));
        Metrics {
            registry,
            requests,
            over_limit,
            fill_ratio,
            near_limit,
            limited_decisions,
            adjustments,
            adjusted_hits,
            rates: RateHistory::default(),
            http_duration,
            http_in_flight,
            shed,
            connections_refused,
            shadow_errors,
            reloads,
            policies,
        }
    }

    /// The policies in force, which name the audit's series: set at start and by every reload.
    pub fn set_policies(&self, table: Arc<PolicyTable>) {
        *self.policies.write() = table;
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

    /// Records a refund or charge of `hits` applied under `answer`'s policy (an unlimited policy
    /// has no bucket: nothing is recorded).
    pub fn record_adjustment(&self, answer: &Answer, adjustment: ratemesh::Adjustment, hits: u64) {
        if matches!(answer.verdict, Verdict::Unlimited) {
            return;
        }
        let labels = PolicyAdjustment { policy: answer.label().to_owned(), adjustment: adjustment.into() };
        self.adjustments.get_or_create(&labels).inc();
        self.adjusted_hits.get_or_create(&labels).inc_by(hits);
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
            for adjustment in ADJUSTMENT_LABELS {
                let labels = PolicyAdjustment { policy: name.to_owned(), adjustment };
                self.adjustments.remove(&labels);
                self.adjusted_hits.remove(&labels);
            }
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
