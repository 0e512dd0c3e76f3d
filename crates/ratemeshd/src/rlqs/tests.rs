//! The wire form of RLQS messages (golden encodings) and the mapping of bucket ids to keys.

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use prost::Message;

use super::alloc::Share;
use super::*;

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId { bucket: entries.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect() }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The repeated `bucket_quota_usages` (field 2, one length-delimited message per usage), not the
/// unmerged `map<uint64, BucketQuotaUsage>` form (FIELD-NOTES-3 §1.1): a change of envoy-types
/// to that form fails here.
#[test]
fn golden_usage_report() {
    let report = RateLimitQuotaUsageReports {
        domain: "d".to_owned(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(bucket(&[("name", "a")])),
            time_elapsed: Some(ProtoDuration { seconds: 5, nanos: 0 }),
            num_requests_allowed: 3,
            num_requests_denied: 1,
        }],
    };
    let bytes = report.encode_to_vec();
    assert_eq!(hex(&bytes), "0a01641215".to_owned() + "0a0b0a090a046e616d6512016112020805" + "18032001");
    assert_eq!(RateLimitQuotaUsageReports::decode(bytes.as_slice()).expect("decodes"), report);
}

/// A token-bucket assignment: whole-second TTL and fill interval, `tokens_per_fill` as a
/// `UInt32Value`.
#[test]
fn golden_assignment() {
    let share = Share::Bucket { tokens_per_fill: 50, fill_interval_s: 1, max_tokens: 100 };
    let bytes = response([assignment(bucket(&[("name", "a")]), share, 10)]).encode_to_vec();
    let expected = "0a21".to_owned()
        + "0a0b0a090a046e616d651201"
        + "61"
        + "1212"
        + "1202080a"
        + "1a0c1a0a"
        + "0864"
        + "12020832"
        + "1a020801";
    assert_eq!(hex(&bytes), expected);
    let deny = response([assignment(bucket(&[("name", "a")]), Share::DenyAll, 10)]).encode_to_vec();
    // blanket_rule DENY_ALL (field 1 of the strategy, value 1).
    assert!(hex(&deny).ends_with("1a020801"), "{}", hex(&deny));
}

#[test]
fn bucket_ids_are_checked_and_keyed() {
    assert_eq!(canonical(&bucket(&[])).expect_err("empty").code(), tonic::Code::InvalidArgument);
    assert_eq!(
        canonical(&bucket(&[("a", "")])).expect_err("empty value").code(),
        tonic::Code::InvalidArgument
    );
    assert_eq!(
        canonical(&bucket(&[("", "x")])).expect_err("empty name").code(),
        tonic::Code::InvalidArgument
    );
    let long = "x".repeat(BUCKET_ID_BYTES_MAX);
    assert!(canonical(&bucket(&[("a", &long)])).is_err());
    // Unambiguous: "a=b,c" = "d" and "a" = "b,c=d" differ.
    assert_ne!(
        canonical(&bucket(&[("a=b,c", "d")])).expect("valid"),
        canonical(&bucket(&[("a", "b,c=d")])).expect("valid")
    );
    let id = bucket(&[("user", "alice"), ("app", "web"), ("route", "/x")]);
    let table = |key_entries: Option<&[&str]>| RlqsDomain {
        domain: "d".to_owned(),
        policy: "p".to_owned(),
        key_entries: key_entries.map(|names| names.iter().map(|n| (*n).to_owned()).collect()),
        tier_entry: None,
    };
    assert_eq!(key_of(&table(None), &id).expect("key"), "app=web,route=/x,user=alice");
    assert_eq!(key_of(&table(Some(&["user", "app"])), &id).expect("key"), "alice:web");
    assert_eq!(
        key_of(&table(Some(&["tenant"])), &id).expect_err("missing").code(),
        tonic::Code::InvalidArgument
    );
}
