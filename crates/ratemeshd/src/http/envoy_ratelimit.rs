//! envoyproxy/ratelimit's HTTP endpoints, served by `ratemeshd envoy-ratelimit`:
//! `GET /healthcheck` (`OK` when ready, else 500 as upstream), `POST /json` (a `RateLimitRequest`
//! in protobuf's JSON mapping, answered as `ShouldRateLimit` is: 200, or 429 when over the limit;
//! 400 for a body that is not a request or a call refused) and `GET /rlconfig` (the loaded
//! configuration, one line per limit).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use super::{ApiError, ApiState, read_body};
use crate::daemon::Daemon;
use crate::envoy_ratelimit::json;
use crate::rls::RlsService;

/// `GET /healthcheck`: `OK` when the daemon is ready, else 500 with the reason.
pub(super) async fn healthcheck(State(api): ApiState) -> Response {
    match api.daemon.not_ready_reason() {
        None => "OK".into_response(),
        Some(reason) => (StatusCode::INTERNAL_SERVER_ERROR, reason).into_response(),
    }
}

/// `GET /rlconfig`: the loaded configuration.
pub(super) async fn rlconfig(State(api): ApiState) -> Response {
    rlconfig_text(&api.daemon).into_response()
}

/// The text of `GET /rlconfig` (also served on `DEBUG_PORT`, where upstream serves it).
pub fn rlconfig_text(daemon: &Daemon) -> String {
    let (config, _) = daemon.current();
    config.rls.envoy_ratelimit.as_ref().map(|answers| answers.dump.clone()).unwrap_or_default()
}

/// `POST /json`.
pub(super) async fn json(State(api): ApiState, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (config, _) = api.daemon.current();
    let bytes = read_body(&headers, body, config.limits.http_body_bytes_max, api.timeouts.body_read).await?;
    let bad_request = |message: String| ApiError::new(StatusCode::BAD_REQUEST, message, Some("body"));
    let request = json::request(&bytes).map_err(|error| bad_request(error.to_string()))?;
    let service = RlsService::new(Arc::clone(&api.daemon));
    let response = service
        .should_rate_limit_request(&request)
        .await
        .map_err(|status| bad_request(status.message().to_owned()))?;
    let code = match Code::try_from(response.overall_code) {
        Ok(Code::OverLimit) => StatusCode::TOO_MANY_REQUESTS,
        Ok(Code::Ok) => StatusCode::OK,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = json::response(&response).to_string();
    Ok((code, [(CONTENT_TYPE, "application/json")], body).into_response())
}
