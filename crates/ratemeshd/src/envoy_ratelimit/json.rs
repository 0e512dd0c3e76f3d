//! `POST /json`: a `RateLimitRequest` in protobuf's JSON mapping (as upstream decodes it with
//! `protojson`: lowerCamelCase or the proto field names, enums by name or number, 64-bit integers
//! as numbers or strings, unknown fields refused) and the `RateLimitResponse` in the same mapping
//! (lowerCamelCase, default values left out, durations as `"<seconds>s"`).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{Map, Value, json};

/// A `/json` body that is not a `RateLimitRequest` in protobuf's JSON mapping.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a RateLimitRequest: {0}")]
pub struct JsonError(String);

fn error(message: impl Into<String>) -> JsonError {
    JsonError(message.into())
}

/// Decodes a `RateLimitRequest` from `body`.
pub fn request(body: &[u8]) -> Result<RateLimitRequest, JsonError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| error(e.to_string()))?;
    let mut request = RateLimitRequest::default();
    for (name, value) in object(&value, "request")? {
        match name.as_str() {
            "domain" => request.domain = string(value, name)?,
            "descriptors" => {
                request.descriptors = list(value, name)?.iter().map(descriptor).collect::<Result<_, _>>()?
            }
            "hitsAddend" | "hits_addend" => request.hits_addend = u32_value(value, name)?,
            other => return Err(error(format!("unknown field {other:?}"))),
        }
    }
    Ok(request)
}

fn object<'a>(value: &'a Value, what: &str) -> Result<&'a Map<String, Value>, JsonError> {
    value.as_object().ok_or_else(|| error(format!("{what}: not an object")))
}

fn list<'a>(value: &'a Value, what: &str) -> Result<&'a [Value], JsonError> {
    match value {
        Value::Null => Ok(&[]),
        Value::Array(items) => Ok(items),
        _ => Err(error(format!("{what}: not a list"))),
    }
}

fn string(value: &Value, what: &str) -> Result<String, JsonError> {
    match value {
        Value::Null => Ok(String::new()),
        Value::String(text) => Ok(text.clone()),
        _ => Err(error(format!("{what}: not a string"))),
    }
}

fn u64_value(value: &Value, what: &str) -> Result<u64, JsonError> {
    let number = match value {
        Value::Null => Some(0),
        Value::Number(n) => n.as_u64(),
        Value::String(text) => text.parse().ok(),
        _ => None,
    };
    number.ok_or_else(|| error(format!("{what}: not an unsigned integer")))
}

fn u32_value(value: &Value, what: &str) -> Result<u32, JsonError> {
    u32::try_from(u64_value(value, what)?).map_err(|_| error(format!("{what}: out of range")))
}

fn descriptor(value: &Value) -> Result<RateLimitDescriptor, JsonError> {
    let mut descriptor = RateLimitDescriptor::default();
    for (name, value) in object(value, "descriptor")? {
        match name.as_str() {
            "entries" => {
                descriptor.entries = list(value, name)?.iter().map(entry).collect::<Result<_, _>>()?
            }
            "limit" => descriptor.limit = Some(limit(value)?),
            "hitsAddend" | "hits_addend" => {
                descriptor.hits_addend = Some(UInt64Value { value: u64_value(value, name)? });
            }
            "isNegativeHits" | "is_negative_hits" => {
                descriptor.is_negative_hits =
                    value.as_bool().ok_or_else(|| error(format!("{name}: not a boolean")))?;
            }
            other => return Err(error(format!("descriptor: unknown field {other:?}"))),
        }
    }
    Ok(descriptor)
}

fn entry(value: &Value) -> Result<Entry, JsonError> {
    let mut entry = Entry::default();
    for (name, value) in object(value, "entry")? {
        match name.as_str() {
            "key" => entry.key = string(value, name)?,
            "value" => entry.value = string(value, name)?,
            other => return Err(error(format!("entry: unknown field {other:?}"))),
        }
    }
    Ok(entry)
}

fn limit(value: &Value) -> Result<RateLimitOverride, JsonError> {
    let mut limit = RateLimitOverride::default();
    for (name, value) in object(value, "limit")? {
        match name.as_str() {
            "requestsPerUnit" | "requests_per_unit" => limit.requests_per_unit = u32_value(value, name)?,
            "unit" => limit.unit = unit(value)?,
            other => return Err(error(format!("limit: unknown field {other:?}"))),
        }
    }
    Ok(limit)
}

fn unit(value: &Value) -> Result<i32, JsonError> {
    let unit = match value {
        Value::String(name) => RateLimitUnit::from_str_name(name).map(i32::from),
        Value::Number(n) => n.as_i64().and_then(|n| i32::try_from(n).ok()),
        _ => None,
    };
    unit.ok_or_else(|| error(format!("unit: {value} is not a RateLimitUnit")))
}

/// Encodes `response` as protobuf's JSON mapping does.
pub fn response(response: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    if let Ok(code) = Code::try_from(response.overall_code)
        && code != Code::Unknown
    {
        out.insert("overallCode".into(), json!(code.as_str_name()));
    }
    if !response.statuses.is_empty() {
        out.insert("statuses".into(), response.statuses.iter().map(status).collect());
    }
    if !response.response_headers_to_add.is_empty() {
        let headers =
            response.response_headers_to_add.iter().map(|h| json!({ "key": h.key, "value": h.value }));
        out.insert("responseHeadersToAdd".into(), headers.collect());
    }
    Value::Object(out)
}

fn status(status: &DescriptorStatus) -> Value {
    let mut out = Map::new();
    if let Ok(code) = Code::try_from(status.code)
        && code != Code::Unknown
    {
        out.insert("code".into(), json!(code.as_str_name()));
    }
    if let Some(limit) = &status.current_limit {
        let mut current = Map::new();
        if !limit.name.is_empty() {
            current.insert("name".into(), json!(limit.name));
        }
        if limit.requests_per_unit != 0 {
            current.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
        }
        if let Ok(unit) = Unit::try_from(limit.unit)
            && unit != Unit::Unknown
        {
            current.insert("unit".into(), json!(unit.as_str_name()));
        }
        out.insert("currentLimit".into(), Value::Object(current));
    }
    if status.limit_remaining != 0 {
        out.insert("limitRemaining".into(), json!(status.limit_remaining));
    }
    if let Some(reset) = &status.duration_until_reset {
        out.insert("durationUntilReset".into(), json!(duration(reset.seconds, reset.nanos)));
    }
    Value::Object(out)
}

/// A duration as protobuf's JSON mapping writes it: seconds, then 0, 3, 6 or 9 digits.
fn duration(seconds: i64, nanos: i32) -> String {
    match nanos {
        0 => format!("{seconds}s"),
        n if n % 1_000_000 == 0 => format!("{seconds}.{:03}s", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{seconds}.{:06}s", n / 1_000),
        n => format!("{seconds}.{n:09}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_decode_in_both_spellings_and_refuse_unknown_fields() {
        let body = br#"{"domain":"d","hits_addend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],
            "limit":{"requestsPerUnit":5,"unit":"MINUTE"},"hitsAddend":"3"}]}"#;
        let request = request(body).expect("valid");
        assert_eq!(request.domain, "d");
        assert_eq!(request.hits_addend, 2);
        let descriptor = &request.descriptors[0];
        assert_eq!((descriptor.entries[0].key.as_str(), descriptor.entries[0].value.as_str()), ("k", "v"));
        assert_eq!(
            descriptor.limit,
            Some(RateLimitOverride { requests_per_unit: 5, unit: RateLimitUnit::Minute.into() })
        );
        assert_eq!(descriptor.hits_addend, Some(UInt64Value { value: 3 }));
        assert!(super::request(br#"{"domain":"d","nope":1}"#).is_err());
        assert!(super::request(b"not json").is_err());
    }

    #[test]
    fn responses_leave_defaults_out() {
        let response = RateLimitResponse {
            overall_code: Code::OverLimit.into(),
            statuses: vec![DescriptorStatus { code: Code::Ok.into(), ..Default::default() }],
            ..Default::default()
        };
        assert_eq!(
            super::response(&response),
            json!({"overallCode": "OVER_LIMIT", "statuses": [{"code": "OK"}]})
        );
        assert_eq!(
            [duration(60, 0), duration(1, 500_000_000), duration(0, 2_000), duration(0, 1_500)],
            ["60s", "1.500s", "0.000002s", "0.000001500s"]
        );
    }
}
