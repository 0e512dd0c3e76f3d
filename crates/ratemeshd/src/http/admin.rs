//! The admin routes: live per-key overrides (`PUT`, `DELETE /v1/overrides/{policy}/{key}`,
//! `GET /v1/overrides/{policy}`; `crate::overrides`), behind the `[auth] admin_token`.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::json;

use super::body::from_json_body;
use super::{Api, ApiError, ApiState, json_response, parse_body};
use crate::config::Bounds;
use crate::daemon::AdminError;
use crate::overrides::{OVERRIDE_KEY_BYTES_MAX, OverrideError};
use crate::policy::PolicyTable;

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

/// The path's parameters, or a JSON 400 naming the path (a segment that is not UTF-8 once
/// percent-decoded), like every other bad input.
fn path_params<T>(path: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    path.map(|Path(params)| params).map_err(|rejection| ApiError::bad_request("path", rejection.body_text()))
}

pub(super) async fn put_override(
    State(api): ApiState,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (policy, key) = path_params(path)?;
    authorize(&api, &headers)?;
    override_key(&key)?;
    let parse =
        |bytes: &[u8], _: &PolicyTable, bounds: &Bounds| from_json_body::<OverrideBody>(bytes, bounds);
    let values = parse_body(&api, &headers, body, parse).await?;
    let written =
        api.daemon.set_override(&policy, &key, Some((values.limit, values.burst, values.period_ms)))?;
    Ok(json_response(StatusCode::OK, &written))
}

pub(super) async fn delete_override(
    State(api): ApiState,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (policy, key) = path_params(path)?;
    authorize(&api, &headers)?;
    override_key(&key)?;
    let written = api.daemon.set_override(&policy, &key, None)?;
    Ok(json_response(StatusCode::OK, &written))
}

pub(super) async fn list_overrides(
    State(api): ApiState,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let policy = path_params(path)?;
    let overrides = api.daemon.overrides_of(&policy)?;
    Ok(json_response(StatusCode::OK, &json!({ "policy": policy, "overrides": overrides })))
}
