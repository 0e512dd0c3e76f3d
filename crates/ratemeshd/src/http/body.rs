//! The JSON bodies of the HTTP API and their answers.
//!
//! - [`CheckBody`], [`ChargeBody`], [`ReleaseBody`]: what `POST /v1/check`, `/v1/check/batch`,
//!   `/v1/check/all`, `/v1/charge` and `/v1/release` accept; [`parse_check`],
//!   [`parse_check_batch`], [`parse_check_all`], [`parse_charge`] and [`parse_release`] turn bytes
//!   into validated requests ([`ValidCheck`], [`ValidCharge`], [`ValidRelease`]) or a
//!   [`BodyError`] that names the field (`limit.period_ms`) and maps to an HTTP status.
//! - [`CheckResponse`]: an [`Answer`]'s JSON; [`ErrorResponse`]: the JSON of a refusal.

use std::time::Duration;

use ratemesh_core::Algorithm;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::check::{Answer, ValidCheck};
use crate::config::Bounds;
use crate::policy::PolicyTable;

#[cfg(test)]
mod tests;
mod validate;

pub(crate) use validate::is_concurrency;
pub use validate::{ValidCharge, ValidRelease};

/// Why a request body was refused. The client's input is at fault; nothing was counted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The body is larger than `http_body_bytes_max` (HTTP 413).
    #[error("body is {len_bytes} bytes, at most {max_bytes} are accepted")]
    TooLarge {
        /// The body's length.
        len_bytes: usize,
        /// The bound.
        max_bytes: usize,
    },
    /// The body is not JSON (HTTP 400).
    #[error("malformed JSON at line {line}, column {column}: {message}")]
    Syntax {
        /// 1-based.
        line: usize,
        /// 1-based.
        column: usize,
        /// What the parser found.
        message: String,
    },
    /// A field is missing, unknown, of the wrong type or out of range (HTTP 400).
    #[error("{field}: {message}")]
    Invalid {
        /// The field's path: `key`, `limit.period_ms`, `[3].cost` in a batch; `body` for the body
        /// as a whole.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The named policy is not configured (HTTP 404).
    #[error("{field}: no policy named {name:?}")]
    UnknownPolicy {
        /// The field's path (`policy`, `[3].policy`).
        field: String,
        /// The name given.
        name: String,
    },
}

impl BodyError {
    /// The field at fault, if one is.
    pub fn field(&self) -> Option<&str> {
        match self {
            BodyError::Invalid { field, .. } | BodyError::UnknownPolicy { field, .. } => Some(field),
            BodyError::TooLarge { .. } | BodyError::Syntax { .. } => None,
        }
    }

    /// The HTTP status to answer with: 413, 404 or 400.
    pub fn http_status(&self) -> u16 {
        match self {
            BodyError::TooLarge { .. } => 413,
            BodyError::UnknownPolicy { .. } => 404,
            BodyError::Syntax { .. } | BodyError::Invalid { .. } => 400,
        }
    }

    /// The same error, about an item of a batch: its field path gains the prefix `[index].`.
    fn in_batch(self, index: usize) -> BodyError {
        match self {
            BodyError::Invalid { field, message } => {
                BodyError::Invalid { field: format!("[{index}].{field}"), message }
            }
            BodyError::UnknownPolicy { field, name } => {
                BodyError::UnknownPolicy { field: format!("[{index}].{field}"), name }
            }
            other => other,
        }
    }
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> BodyError {
    BodyError::Invalid { field: field.into(), message: message.into() }
}

/// The JSON body of an error answer: `{"error": "...", "field": "limit.period_ms"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ErrorResponse {
    /// The whole message.
    pub error: String,
    /// The field at fault, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl From<&BodyError> for ErrorResponse {
    fn from(error: &BodyError) -> Self {
        ErrorResponse { error: error.to_string(), field: error.field().map(str::to_owned) }
    }
}

/// The body of `POST /v1/check`:
/// `{"key": "user:42", "cost": 1, "limit": {...}}` or `{"key": "user:42", "policy": "api"}`.
///
/// Every field is optional in the type so that [`CheckBody::validate`] can name a missing one
/// like any other bad field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CheckBody {
    /// The client's key (required; 1 to `key_bytes_max` bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Hits (default 1; 0 asks whether a hit would pass without taking one; below 0 returns
    /// that many hits: a refund).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostJson>,
    /// An inline limit (exactly one of `limit` and `policy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitBody>,
    /// A configured policy's name (exactly one of `limit` and `policy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// One of the policy's `tiers` (a key's override still wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
}

/// A check's cost in JSON: hits to take (0 to `u64::MAX`) or, negative, hits to give back (a
/// refund, down to `-u64::MAX`... as far as JSON integers reach: `i64::MIN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostJson {
    /// Hits to take.
    Take(u64),
    /// Hits to give back.
    Refund(u64),
}

impl From<u64> for CostJson {
    fn from(hits: u64) -> Self {
        CostJson::Take(hits)
    }
}

impl Serialize for CostJson {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match *self {
            CostJson::Take(hits) => serializer.serialize_u64(hits),
            CostJson::Refund(hits) => serializer.serialize_i128(-i128::from(hits)),
        }
    }
}

impl<'de> Deserialize<'de> for CostJson {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = CostJson;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an integer: hits to take, or below 0 hits to refund")
            }

            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<CostJson, E> {
                Ok(CostJson::Take(value))
            }

            fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<CostJson, E> {
                match u64::try_from(value) {
                    Ok(hits) => Ok(CostJson::Take(hits)),
                    Err(_) => Ok(CostJson::Refund(value.unsigned_abs())),
                }
            }
        }
        deserializer.deserialize_i64(Visitor)
    }
}

/// The body of `POST /v1/charge`: `{"key": "user:42", "policy": "tokens", "cost": 1234}` (or an
/// inline `limit`): `cost` hits applied unconditionally (the bucket may go into debt).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChargeBody {
    /// The client's key (required).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Hits to apply (required).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// An inline limit (exactly one of `limit` and `policy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitBody>,
    /// A configured policy's name (exactly one of `limit` and `policy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// One of the policy's `tiers` (a key's override still wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
}

/// An inline limit: `{"algorithm": "token_bucket", "limit": 100, "period_ms": 1000, "burst": 100,
/// "mode": "exact"}`. `algorithm`, `limit` and `period_ms` are required; `burst` and `delay`
/// default per algorithm; `mode` defaults to `approximate`, `fallback` to `local_share`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitBody {
    /// One of `token_bucket`, `gcra`, `leaky_bucket`, `fixed_window`, `sliding_window_counter`,
    /// `sliding_window_log`, `concurrency`, `expiring_counter`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// Hits per period (concurrency: leases at once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// The period (concurrency: lease lifetime), in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period_ms: Option<u64>,
    /// Instead of `period_ms`, for `fixed_window`: a calendar window, `minute`, `hour`, `day`,
    /// `week` (from Monday) or `month`, in `time_zone`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// The IANA time zone of `window` (default `UTC`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// Bucket capacity / burst / shaper queue length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// Shaper only: queued hits that pass without delay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<u64>,
    /// `exact` or `approximate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `local_share`, `fail_open` or `fail_closed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

/// The body of `POST /v1/release`: `{"key": "...", "policy": "..." | "limit": {...}, "lease": "n"}`,
/// with `key` and `policy`/`limit` as in the check that took the lease.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The client's key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The inline limit of the check (exactly one of `limit` and `policy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitBody>,
    /// The policy of the check (exactly one of `limit` and `policy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The lease the check answered with (a decimal string; a JSON number is accepted too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseJson>,
}

/// A concurrency lease in JSON: written as a decimal string, because lease ids use all 64 bits
/// and JSON numbers beyond 2⁵³ lose digits in JavaScript (and beyond 2⁶³ do not fit Go's `int64`
/// or Java's `long`); read as such a string or as a number (what earlier versions wrote).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseJson(pub u64);

impl Serialize for LeaseJson {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for LeaseJson {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = LeaseJson;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a lease: a decimal string (or a non-negative integer)")
            }

            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<LeaseJson, E> {
                Ok(LeaseJson(value))
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<LeaseJson, E> {
                let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
                match text.parse() {
                    Ok(value) if digits => Ok(LeaseJson(value)),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(text), &self)),
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Deserializes a JSON object body (a check's, an admin call's), bounded and naming the field at
/// fault like `from_json`, refusing an array, from which serde would read a struct too (its fields
/// in order: `["k", "api"]` a check).
pub fn from_json_body<T: DeserializeOwned>(body: &[u8], bounds: &Bounds) -> Result<T, BodyError> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(invalid(
            "body",
            "a JSON object is expected, not an array (a batch goes to /v1/check/batch)",
        ));
    }
    from_json(body, bounds)
}

/// Deserializes a JSON body, naming the field of a type or value error by its path.
fn from_json<T: DeserializeOwned>(body: &[u8], bounds: &Bounds) -> Result<T, BodyError> {
    if body.len() > bounds.http_body_bytes_max {
        return Err(BodyError::TooLarge { len_bytes: body.len(), max_bytes: bounds.http_body_bytes_max });
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        json_error(if path == "." { "body".to_owned() } else { path }, error.into_inner())
    })?;
    // Trailing bytes after the value are malformed JSON too.
    deserializer.end().map_err(|error| json_error("body".to_owned(), error))?;
    Ok(value)
}

fn json_error(field: String, error: serde_json::Error) -> BodyError {
    // A number beyond f64 (`1e400`) is well-formed JSON that serde_json reports as a syntax error;
    // it is a bad value of the field being read.
    let out_of_range = error.to_string().starts_with("number out of range");
    match error.classify() {
        serde_json::error::Category::Data => invalid(field, error.to_string()),
        _ if out_of_range && field != "body" => invalid(field, error.to_string()),
        _ => BodyError::Syntax { line: error.line(), column: error.column(), message: error.to_string() },
    }
}

/// Parses and validates the body of `POST /v1/check`.
pub fn parse_check(body: &[u8], table: &PolicyTable, bounds: &Bounds) -> Result<ValidCheck, BodyError> {
    from_json_body::<CheckBody>(body, bounds)?.validate(table, bounds)
}

/// Parses and validates the body of `POST /v1/check/batch`: a JSON array of check bodies, at most
/// `batch_len_max`. One bad item refuses the whole batch (its error names the item: `[3].key`).
pub fn parse_check_batch(
    body: &[u8],
    table: &PolicyTable,
    bounds: &Bounds,
) -> Result<Vec<ValidCheck>, BodyError> {
    let checks = from_json::<Vec<CheckBody>>(body, bounds)?;
    if checks.len() > bounds.batch_len_max {
        return Err(invalid(
            format!("[{}]", bounds.batch_len_max),
            format!("batch of {} checks, at most {} are accepted", checks.len(), bounds.batch_len_max),
        ));
    }
    checks
        .iter()
        .enumerate()
        .map(|(index, check)| check.validate(table, bounds).map_err(|error| error.in_batch(index)))
        .collect()
}

/// Parses and validates the body of `POST /v1/charge`.
pub fn parse_charge(body: &[u8], table: &PolicyTable, bounds: &Bounds) -> Result<ValidCharge, BodyError> {
    from_json_body::<ChargeBody>(body, bounds)?.validate(table, bounds)
}

/// Parses and validates the body of `POST /v1/check/all`: a batch like `POST /v1/check/batch`
/// (at most `batch_len_max`), without refunds (a group takes hits).
pub fn parse_check_all(
    body: &[u8],
    table: &PolicyTable,
    bounds: &Bounds,
) -> Result<Vec<ValidCheck>, BodyError> {
    let checks = parse_check_batch(body, table, bounds)?;
    match checks.iter().position(|check| check.refund) {
        Some(index) => Err(invalid(
            format!("[{index}].cost"),
            "a negative cost (refund) has no place in an all-or-nothing group",
        )),
        None => Ok(checks),
    }
}

/// Parses and validates the body of `POST /v1/release`.
pub fn parse_release(body: &[u8], table: &PolicyTable, bounds: &Bounds) -> Result<ValidRelease, BodyError> {
    from_json_body::<ReleaseBody>(body, bounds)?.validate(table, bounds)
}

/// The answer to a check:
/// `{"allowed": true, "limit": 100, "remaining": 99, "reset_after_ms": 10, "retry_after_ms": null}`,
/// plus `delay_ms` for the shaper and `lease` for an admitted concurrency check.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct CheckResponse {
    /// Whether the request passes.
    pub allowed: bool,
    /// The limit in force.
    pub limit: u64,
    /// Hits that would still pass now.
    pub remaining: u64,
    /// Time until the key is back to fresh, rounded up to whole milliseconds.
    pub reset_after_ms: u64,
    /// When refused: the wait until the same request would pass, rounded up (never early);
    /// `null` when allowed or when it can never pass (cost above capacity).
    pub retry_after_ms: Option<u64>,
    /// Shaper (`leaky_bucket`) only: how long to hold the request before serving it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Concurrency only, when admitted: the lease to give back with `POST /v1/release` (a
    /// decimal string, see [`LeaseJson`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseJson>,
}

impl From<&Answer> for CheckResponse {
    /// The JSON of `answer` as answered (shadow mode applied); an unlimited policy's has `limit`
    /// and `remaining` at `u64::MAX` and nothing to wait for.
    fn from(answer: &Answer) -> CheckResponse {
        let Some((policy, decision)) = answer.answered() else {
            return CheckResponse {
                allowed: true,
                limit: u64::MAX,
                remaining: u64::MAX,
                reset_after_ms: 0,
                retry_after_ms: None,
                delay_ms: None,
                lease: None,
            };
        };
        let shaper = policy.limit.algorithm() == Algorithm::LeakyBucketShaper;
        CheckResponse {
            allowed: decision.allowed,
            limit: decision.limit,
            remaining: decision.remaining,
            reset_after_ms: ceil_ms(decision.reset_after),
            retry_after_ms: if decision.allowed { None } else { decision.retry_after.map(ceil_ms) },
            delay_ms: shaper.then(|| ceil_ms(decision.delay)),
            lease: decision.lease.map(|lease| LeaseJson(lease.0)),
        }
    }
}

/// Whole milliseconds, rounded up: a client told to wait must not come back too early.
fn ceil_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}
