//! The configuration file as written: every value optional and remembered with where it came from
//! (a span of the file, or an environment variable), so that validation can name the line of a
//! bad value. Nothing here is checked beyond TOML types; `super` validates.

use std::ops::Range;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

use super::env::{Locate, Slot};

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

/// The file's sections of single values (`[node]` … `[rls]`), each field once, with how its text is
/// read: `Number` (`u64`), `Text` or `List` (of strings). Generates each section's struct and
/// [`OVERRIDES`], the fields an environment variable may replace (`super::env`): a field of
/// these sections is declared here, in one line, and nowhere else in the raw file or `env.rs`.
macro_rules! raw_sections {
    ($($(#[$meta:meta])* $section:ident: $raw:ident { $($field:ident: $kind:ident,)* })*) => {
        $(
            $(#[$meta])*
            #[derive(Debug, Default, Deserialize)]
            #[serde(deny_unknown_fields, default)]
            pub(super) struct $raw {
                $(pub(super) $field: raw_sections!(@type $kind),)*
            }
        )*

        /// Every field of those sections, as `section.field`, with where it lives. The variable's
        /// name is derived from the field's (`super::env::variable_name`), so the two cannot drift
        /// apart.
        pub(super) const OVERRIDES: &[(&str, Locate)] = &[$($(
            (
                concat!(stringify!($section), ".", stringify!($field)),
                |raw| Slot::$kind(&mut raw.$section.$field),
            ),
        )*)*];
    };
    (@type Number) => { Option<Val<u64>> };
    (@type Text) => { Option<Val<String>> };
    (@type List) => { Option<Vec<Val<String>>> };
}

raw_sections! {
    /// `[node]`.
    node: RawNode {
        id: Number,
        id_from: Text,
        incarnation: Number,
        data_dir: Text,
        snapshot_interval_ms: Number,
        snapshot_period_min_ms: Number,
        region: Text,
        region_sync_interval_ms: Number,
        region_lease_ms: Number,
        region_fallback: Text,
        audit_keys_max: Number,
    }
    /// `[cluster]`.
    cluster: RawCluster {
        cluster_id: Text,
        seeds: List,
        secret: Text,
        secret_accepted: Text,
        ca_cert_path: Text,
        cert_path: Text,
        key_path: Text,
        gossip_interval_ms: Number,
        sync_interval_ms: Number,
        dead_member_forget_ms: Number,
        seed_resolve_interval_ms: Number,
        leave_linger_ms: Number,
    }
    /// `[listen]`.
    listen: RawListen {
        http: Text,
        grpc: Text,
        resp: Text,
        rlqs: Text,
        gossip: Text,
        quic: Text,
        advertise_gossip: Text,
        advertise_quic: Text,
        advertise_ip_from: Text,
        grpc_tls_cert_path: Text,
        grpc_tls_key_path: Text,
        grpc_tls_client_ca_path: Text,
    }
    /// `[limits]`.
    limits: RawLimits {
        keys_max: Number,
        http_body_bytes_max: Number,
        http_in_flight_max: Number,
        connections_max: Number,
        batch_len_max: Number,
        key_bytes_max: Number,
        log_bytes_max: Number,
        rlqs_streams_max: Number,
        rlqs_buckets_per_stream_max: Number,
    }
    /// `[log]`.
    log: RawLog {
        format: Text,
        level: Text,
    }
    /// `[auth]`.
    auth: RawAuth {
        policy_header: Text,
        key_header: Text,
        admin_token: Text,
    }
    /// `[rls]`.
    rls: RawRls {
        all_or_nothing_domains: List,
        rlqs_unknown_domain: Text,
        rlqs_report_period_ms: Number,
        rlqs_abandon_after_periods: Number,
        rlqs_sync_interval_ms: Number,
    }
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
    pub(super) audit: Option<Val<bool>>,
    pub(super) audit_window_ms: Option<Val<u64>>,
    pub(super) home_region: Option<Val<String>>,
    pub(super) region_fallback: Option<Val<String>>,
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
