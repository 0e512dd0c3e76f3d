//! The observation routes: `/metrics`, `/healthz`, `/readyz`, `/v1/cluster`, `/v1/policies`,
//! `/v1/top`, `/v1/audit`, `/v1/rlqs`, `/v1/stats` and the dashboard page (`dashboard.html`, at `/`).

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use ratemesh::TopBy;
use ratemesh_core::Algorithm;
use serde_json::json;

use super::{ApiError, ApiState, Unknown, error, json_response, query_params};
use crate::config::{Rule, fallback_name, mode_name};
use crate::metrics::{CONTENT_TYPE as METRICS_CONTENT_TYPE, status_name};
use crate::policy::PolicyTable;

pub(super) async fn metrics(State(api): ApiState) -> Response {
    match api.daemon.metrics().encode() {
        Ok(text) => ([(CONTENT_TYPE, HeaderValue::from_static(METRICS_CONTENT_TYPE))], text).into_response(),
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "encoding metrics failed", None),
    }
}

pub(super) async fn healthz() -> Response {
    json_response(StatusCode::OK, &json!({ "status": "ok" }))
}

pub(super) async fn readyz(State(api): ApiState) -> Response {
    match api.daemon.not_ready_reason() {
        None => json_response(StatusCode::OK, &json!({ "ready": true })),
        Some(reason) => {
            json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({ "ready": false, "reason": reason }))
        }
    }
}

/// Groups listed by `GET /v1/rlqs` (the first in (policy, key) order; `groups_total` counts all).
const RLQS_GROUPS_SHOWN_MAX: usize = 100;

/// This node's RLQS state: streams, fleet rounds, and its groups with their parts.
pub(super) async fn rlqs(State(api): ApiState) -> Response {
    let daemon = &api.daemon;
    let (config, _) = daemon.current();
    let state = daemon.rlqs();
    let all = state.hub.all_totals();
    let groups: Vec<_> = all
        .iter()
        .take(RLQS_GROUPS_SHOWN_MAX)
        .map(|(group, totals)| {
            json!({
                "policy": group.policy,
                "key": group.key,
                "buckets": totals.members,
                "limit_rate": totals.limit_rate,
                "node_rate": totals.node_rate,
                "assigned_rate": totals.assigned_rate,
            })
        })
        .collect();
    let owned: Vec<_> = state
        .ledger
        .first_groups(RLQS_GROUPS_SHOWN_MAX)
        .into_iter()
        .map(|(group, nodes)| {
            json!({ "policy": group.policy, "key": group.key, "nodes": nodes.iter().map(|n| n.0).collect::<Vec<_>>() })
        })
        .collect();
    let ordering = std::sync::atomic::Ordering::Relaxed;
    json_response(
        StatusCode::OK,
        &json!({
            "node": daemon.id().0,
            "serving": config.listen.rlqs.is_some(),
            "sync_interval_ms": u64::try_from(config.rlqs.sync_interval.as_millis()).unwrap_or(u64::MAX),
            "fleet_rounds": state.sync_rounds.load(ordering),
            "fleet_fallbacks": state.fallbacks.load(ordering),
            "streams": state.hub.streams(),
            "owned_groups": state.ledger.groups(),
            "owned": owned,
            "groups_total": all.len(),
            "groups": groups,
        }),
    )
}

pub(super) async fn cluster(State(api): ApiState) -> Response {
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
                "region": m.region.name(),
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
            "members_counted": daemon.node().members_counted(),
            "ring": {
                "owners": owners,
                "this_node_share": share_of(daemon.id()),
                "balance": balance,
            },
        }),
    )
}

pub(super) async fn policies(State(api): ApiState) -> Response {
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
                    if let Some(home) = entry.home_region {
                        item["home_region"] = json!(home.name());
                    }
                    if let Some(fallback) = policy.region.fallback {
                        item["region_fallback"] = json!(fallback.name());
                    }
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
                    .map(|d| json!({ "key": d.key, "value": d.value.text() }))
                    .collect();
                item["domain"] = json!(envoy.domain);
                item["descriptors"] = json!(descriptors);
            }
            item
        })
        .collect();
    json_response(StatusCode::OK, &json!({ "policies": list }))
}

/// How many keys `GET /v1/top` (and `ratemeshd top`) lists by default.
pub const TOP_N_DEFAULT: usize = 20;
/// What `GET /v1/top` (and `ratemeshd top`) ranks keys by by default.
pub const TOP_BY_DEFAULT: TopBy = TopBy::Refused;

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
        let [policy, n, by] = query_params(uri, ["policy", "n", "by"], Unknown::Refuse)?;
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
            None => TOP_N_DEFAULT,
            Some(Ok(n)) if (1..=TOP_N_MAX).contains(&n) => n,
            Some(_) => return Err(ApiError::bad_request("n", format!("an integer from 1 to {TOP_N_MAX}"))),
        };
        let by = match by.as_deref() {
            None => TOP_BY_DEFAULT,
            Some(name) => {
                TopBy::from_name(name).ok_or_else(|| ApiError::bad_request("by", "refused or demand"))?
            }
        };
        Ok(TopQuery { policy, n, by })
    }
}

pub(super) async fn top(State(api): ApiState, uri: Uri) -> Result<Response, ApiError> {
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

/// How many keys `GET /v1/audit` (and `ratemeshd audit`) lists by default.
pub const AUDIT_N_DEFAULT: usize = 10;

/// The query of `GET /v1/audit`, validated: the policy's name and audit group (`None`: every
/// policy), and how many keys.
#[derive(Debug, PartialEq, Eq)]
struct AuditQuery {
    policy: Option<(String, u64)>,
    n: usize,
}

impl AuditQuery {
    /// Parses `?policy=&n=`, both optional; every refusal names its parameter (an unknown or
    /// repeated one too). A policy `table` does not have (nor `inline`) is 404.
    fn parse(uri: &Uri, table: &PolicyTable) -> Result<AuditQuery, ApiError> {
        let [policy, n] = query_params(uri, ["policy", "n"], Unknown::Refuse)?;
        let policy = match policy {
            None => None,
            Some(name) => match crate::audit::group_of(table, &name) {
                Some(group) => Some((name, group)),
                None => {
                    let shown: String = name.chars().take(64).collect();
                    return Err(ApiError::new(
                        StatusCode::NOT_FOUND,
                        format!(
                            "policy: no policy named {shown:?} (GET /v1/policies lists them; inline limits are \"inline\")"
                        ),
                        Some("policy"),
                    ));
                }
            },
        };
        let n = match n.as_deref().map(str::parse::<usize>) {
            None => AUDIT_N_DEFAULT,
            Some(Ok(n)) if (1..=TOP_N_MAX).contains(&n) => n,
            Some(_) => return Err(ApiError::bad_request("n", format!("an integer from 1 to {TOP_N_MAX}"))),
        };
        Ok(AuditQuery { policy, n })
    }
}

/// The audit, cluster-wide: every live member's figures per policy and window (the keys each
/// owns, added) and the worst keys, as [`ratemesh::Node::audit`] gathers them.
pub(super) async fn audit(State(api): ApiState, uri: Uri) -> Result<Response, ApiError> {
    use crate::audit::{policy_label, ratios, window_ms};
    let (_, table) = api.daemon.current();
    let query = AuditQuery::parse(&uri, &table)?;
    let group = query.policy.as_ref().map(|(_, group)| *group);
    let report = api.daemon.node().audit(group, query.n).await;
    let policies: Vec<_> = report
        .figures
        .iter()
        .filter(|f| group.is_none_or(|g| g == f.group))
        .filter_map(|f| {
            let (worst, over, false_refusal) = ratios(&f.sums);
            Some(json!({
                "policy": policy_label(&table, f.group)?,
                "window_ms": window_ms(f.window),
                "key_windows": f.sums.key_windows,
                "incomplete_key_windows": f.incomplete_key_windows,
                "admitted": f.sums.admitted,
                "ideal": f.sums.ideal,
                "arrivals": f.sums.arrivals,
                "over_admitted": f.sums.over_admitted,
                "false_refused": f.sums.false_refused,
                "admitted_over_limit_ratio": worst,
                "over_admission_ratio": over,
                "false_refusal_ratio": false_refusal,
            }))
        })
        .collect();
    let keys: Vec<_> = report
        .keys
        .iter()
        .filter_map(|key| {
            let f = &key.figures;
            let (worst, over, _) = ratios(&f.sums);
            Some(json!({
                "policy": policy_label(&table, f.group)?,
                "key": key.text,
                "key_hash": format!("{:032x}", f.key.0),
                "owner": key.owner.0,
                "window_ms": window_ms(f.window),
                "admitted": f.sums.admitted,
                "ideal": f.sums.ideal,
                "arrivals": f.sums.arrivals,
                "over_admitted": f.sums.over_admitted,
                "false_refused": f.sums.false_refused,
                "incomplete_windows": f.incomplete_windows,
                "admitted_over_limit_ratio": worst,
                "over_admission_ratio": over,
            }))
        })
        .collect();
    let missing: Vec<_> =
        report.missing.iter().map(|m| json!({ "id": m.id.0, "reason": m.reason })).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "span_s": ratemesh_core::AUDIT_SPAN_NANOS / 1_000_000_000,
            "nodes_asked": report.answered.len() + report.missing.len(),
            "nodes_answered": report.answered.len(),
            "members": report.answered.iter().map(|id| id.0).collect::<Vec<_>>(),
            "missing": missing,
            "policies": policies,
            "keys": keys,
        }),
    ))
}

pub(super) async fn stats(State(api): ApiState) -> Response {
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
const DASHBOARD_HTML: &str = include_str!("../dashboard.html");

pub(super) async fn dashboard() -> Response {
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
