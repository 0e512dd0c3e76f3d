//! The configuration file as written: every value optional and remembered with where it came from
//! (a span of the file, or an environment variable), so that validation can name the line of a
//! bad value. Nothing here is checked beyond TOML types; `super` validates.

use std::ops::Range;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

/// Where a value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum At {
    /// Bytes of the configuration text.
    File(Range<usize>),
    /// An environment variable (its name).
    Env(String),
}

/// A value and where it came from.
#[derive(Clone, Debug)]
pub(super) struct Val<T> {
    pub(super) value: T,
    pub(super) at: At,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Val<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<T>::deserialize(deserializer)?;
        let span = spanned.span();
        Ok(Val { value: spanned.into_inner(), at: At::File(span) })
    }
}

/// The whole file. Absent sections and fields take their defaults in validation.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawConfig {
    pub(super) node: RawNode,
    pub(super) cluster: RawCluster,
    pub(super) listen: RawListen,
    pub(super) limits: RawLimits,
    pub(super) log: RawLog,
    pub(super) auth: RawAuth,
    pub(super) rls: RawRls,
    pub(super) policies: Vec<Spanned<RawPolicy>>,
    pub(super) rlqs: Vec<Spanned<RawRlqs>>,
}

/// One `[[rlqs]]` entry: an Envoy RLQS domain and the policy whose limit its buckets split.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawRlqs {
    pub(super) domain: Option<Val<String>>,
    pub(super) policy: Option<Val<String>>,
    pub(super) key_entries: Option<Vec<Val<String>>>,
    pub(super) tier_entry: Option<Val<String>>,
}

/// `[rls]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawRls {
    pub(super) all_or_nothing_domains: Option<Vec<Val<String>>>,
    pub(super) rlqs_unknown_domain: Option<Val<String>>,
    pub(super) rlqs_report_period_ms: Option<Val<u64>>,
    pub(super) rlqs_abandon_after_periods: Option<Val<u64>>,
    pub(super) rlqs_sync_interval_ms: Option<Val<u64>>,
}

/// `[node]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawNode {
    pub(super) id: Option<Val<u64>>,
    pub(super) id_from: Option<Val<String>>,
    pub(super) incarnation: Option<Val<u64>>,
    pub(super) data_dir: Option<Val<String>>,
    pub(super) snapshot_interval_ms: Option<Val<u64>>,
    pub(super) snapshot_period_min_ms: Option<Val<u64>>,
}

/// `[cluster]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawCluster {
    pub(super) cluster_id: Option<Val<String>>,
    pub(super) seeds: Option<Vec<Val<String>>>,
    pub(super) secret: Option<Val<String>>,
    pub(super) secret_accepted: Option<Val<String>>,
    pub(super) ca_cert_path: Option<Val<String>>,
    pub(super) cert_path: Option<Val<String>>,
    pub(super) key_path: Option<Val<String>>,
    pub(super) gossip_interval_ms: Option<Val<u64>>,
    pub(super) sync_interval_ms: Option<Val<u64>>,
    pub(super) dead_member_forget_ms: Option<Val<u64>>,
    pub(super) seed_resolve_interval_ms: Option<Val<u64>>,
    pub(super) leave_linger_ms: Option<Val<u64>>,
}

/// `[listen]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawListen {
    pub(super) http: Option<Val<String>>,
    pub(super) grpc: Option<Val<String>>,
    pub(super) resp: Option<Val<String>>,
    pub(super) rlqs: Option<Val<String>>,
    pub(super) gossip: Option<Val<String>>,
    pub(super) quic: Option<Val<String>>,
    pub(super) advertise_gossip: Option<Val<String>>,
    pub(super) advertise_quic: Option<Val<String>>,
    pub(super) advertise_ip_from: Option<Val<String>>,
    pub(super) grpc_tls_cert_path: Option<Val<String>>,
    pub(super) grpc_tls_key_path: Option<Val<String>>,
    pub(super) grpc_tls_client_ca_path: Option<Val<String>>,
}

/// `[limits]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawLimits {
    pub(super) keys_max: Option<Val<u64>>,
    pub(super) http_body_bytes_max: Option<Val<u64>>,
    pub(super) http_in_flight_max: Option<Val<u64>>,
    pub(super) connections_max: Option<Val<u64>>,
    pub(super) batch_len_max: Option<Val<u64>>,
    pub(super) key_bytes_max: Option<Val<u64>>,
    pub(super) log_bytes_max: Option<Val<u64>>,
    pub(super) rlqs_streams_max: Option<Val<u64>>,
    pub(super) rlqs_buckets_per_stream_max: Option<Val<u64>>,
}

/// `[log]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawLog {
    pub(super) format: Option<Val<String>>,
    pub(super) level: Option<Val<String>>,
}

/// `[auth]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawAuth {
    pub(super) policy_header: Option<Val<String>>,
    pub(super) key_header: Option<Val<String>>,
    pub(super) admin_token: Option<Val<String>>,
}

/// One `[[policies]]` entry.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawPolicy {
    pub(super) name: Option<Val<String>>,
    pub(super) domain: Option<Val<String>>,
    pub(super) descriptors: Option<Val<Vec<Spanned<RawDescriptor>>>>,
    pub(super) algorithm: Option<Val<String>>,
    pub(super) limit: Option<Val<u64>>,
    pub(super) period_ms: Option<Val<u64>>,
    pub(super) window: Option<Val<String>>,
    pub(super) time_zone: Option<Val<String>>,
    pub(super) burst: Option<Val<u64>>,
    pub(super) delay: Option<Val<u64>>,
    pub(super) mode: Option<Val<String>>,
    pub(super) fallback: Option<Val<String>>,
    pub(super) shadow_mode: Option<Val<bool>>,
    pub(super) unlimited: Option<Val<bool>>,
    pub(super) overrides: Option<Val<Vec<Spanned<RawVariant>>>>,
    pub(super) tiers: Option<Val<Vec<Spanned<RawVariant>>>>,
}

/// One per-key override (`key`) or named tier (`name`) of a policy: its own limit, burst and
/// period, the policy's algorithm, mode and fallback.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawVariant {
    pub(super) key: Option<Val<String>>,
    pub(super) name: Option<Val<String>>,
    pub(super) limit: Option<Val<u64>>,
    pub(super) burst: Option<Val<u64>>,
    pub(super) period_ms: Option<Val<u64>>,
}

/// One entry of a policy's Envoy descriptor path.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawDescriptor {
    pub(super) key: Option<Val<String>>,
    pub(super) value: Option<Val<String>>,
}

/// Just where each policy, and each of its descriptors, starts: read again, leniently, after a
/// type error, to put the array indices the toml crate leaves out back into the field's path.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct PolicyStarts {
    pub(super) policies: Vec<Spanned<DescriptorStarts>>,
}

/// See [`PolicyStarts`].
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct DescriptorStarts {
    pub(super) descriptors: Vec<Spanned<serde::de::IgnoredAny>>,
}

impl PolicyStarts {
    /// `path` (`policies.descriptors.key`) with the indices of the policy and descriptor whose
    /// text holds byte `offset` (`policies[1].descriptors[0].key`).
    pub(super) fn index_path(&self, path: &str, offset: usize) -> String {
        let Some(rest) = path.strip_prefix("policies") else {
            return path.to_owned();
        };
        let Some(i) = last_starting_before(&self.policies, offset) else {
            return path.to_owned();
        };
        let Some(rest) = rest.strip_prefix(".descriptors") else {
            return format!("policies[{i}]{rest}");
        };
        match last_starting_before(&self.policies[i].get_ref().descriptors, offset) {
            Some(j) => format!("policies[{i}].descriptors[{j}]{rest}"),
            None => format!("policies[{i}].descriptors{rest}"),
        }
    }
}

fn last_starting_before<T>(items: &[Spanned<T>], offset: usize) -> Option<usize> {
    items.iter().rposition(|item| item.span().start <= offset)
}
