//! The decision routes: `POST /v1/check`, `/v1/check/batch`, `/v1/check/all`, `/v1/charge`,
//! `/v1/release` and `GET /v1/auth`, each rendering the daemon's [`Answer`]s once.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use ratemesh::Released;
use ratemesh::headers::insert_headers_for;
use serde::Serialize;
use serde_json::json;

use super::body::{
    CheckBody, CheckResponse, is_concurrency, parse_charge, parse_check, parse_check_all, parse_check_batch,
    parse_release,
};
use super::{Api, ApiError, ApiState, Unknown, json_response, parse_body, query_params, within};
use crate::check::{Answer, ValidCheck};

/// The answer to one check: its JSON and, unless the policy is unlimited, the rate-limit
/// headers.
fn answer_response(status: StatusCode, answer: &Answer) -> Response {
    let mut response = json_response(status, &CheckResponse::from(answer));
    if let Some((policy, decision)) = answer.answered() {
        let window = policy.limit.spec().period;
        insert_headers_for(response.headers_mut(), answer.label(), window, &decision);
    }
    response
}

pub(super) async fn check(
    State(api): ApiState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let valid = parse_body(&api, &headers, body, parse_check).await?;
    let answer = within(api.timeouts.request, decide(&api, &valid)).await?;
    Ok(answer_response(StatusCode::OK, &answer))
}

/// One check's answer: a refund when its cost was negative.
pub(super) async fn decide(api: &Api, check: &ValidCheck) -> Result<Answer, ApiError> {
    match check.refund {
        true => Ok(api.daemon.refund(&check.target, check.key, check.cost).await?),
        false => Ok(api.daemon.check(&check.target, check.key, &check.key_text, check.cost).await?),
    }
}

pub(super) async fn charge(
    State(api): ApiState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let valid = parse_body(&api, &headers, body, parse_charge).await?;
    let answer = within(api.timeouts.request, async {
        Ok(api.daemon.charge(&valid.target, valid.key, valid.cost).await?)
    })
    .await?;
    Ok(answer_response(StatusCode::OK, &answer))
}

/// The answer of `POST /v1/check/all`: whether the group passed, and one answer per check.
#[derive(Serialize)]
struct GroupResponse {
    allowed: bool,
    results: Vec<CheckResponse>,
}

pub(super) async fn check_all(
    State(api): ApiState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let checks = parse_body(&api, &headers, body, parse_check_all).await?;
    let (allowed, answers) =
        within(api.timeouts.request, async { Ok(api.daemon.check_all(&checks).await?) }).await?;
    let results = answers.iter().map(CheckResponse::from).collect();
    Ok(json_response(StatusCode::OK, &GroupResponse { allowed, results }))
}

pub(super) async fn check_batch(
    State(api): ApiState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let checks = parse_body(&api, &headers, body, parse_check_batch).await?;
    // In request order, one after the other: checks of the same key in one batch are decided in
    // the order given (at most `batch_len_max` of them), all within one request deadline.
    let answers = within(api.timeouts.request, async {
        let mut answers = Vec::with_capacity(checks.len());
        for check in &checks {
            answers.push(CheckResponse::from(&decide(&api, check).await?));
        }
        Ok(answers)
    })
    .await?;
    Ok(json_response(StatusCode::OK, &answers))
}

pub(super) async fn release(
    State(api): ApiState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let valid = parse_body(&api, &headers, body, parse_release).await?;
    let answer = match api.daemon.release(&valid.policy, valid.key, valid.lease)? {
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
        let [policy, key, cost] = query_params(uri, ["policy", "key", "cost"], Unknown::Ignore)?;
        Ok(AuthQuery { policy, key, cost })
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

pub(super) async fn auth(State(api): ApiState, uri: Uri, headers: HeaderMap) -> Result<Response, ApiError> {
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
    if is_concurrency(&valid.target) {
        // A proxy's auth subrequest cannot give a lease back: each would hold its slot for the
        // whole period, and the policy would quietly become N per period.
        let message = "a concurrency limit's leases are given back with POST /v1/release, which an auth subrequest cannot send: use a rate limit";
        return Err(ApiError::bad_request("policy", message));
    }
    let answer = within(api.timeouts.request, async {
        Ok(api.daemon.check(&valid.target, valid.key, &valid.key_text, valid.cost).await?)
    })
    .await?;
    let status = if answer.allowed() { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS };
    Ok(answer_response(status, &answer))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

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
}
