//! The validated configuration: one type per section, every value typed, in range and
//! consistent (validation is `super::validate`, defaults `super::defaults`).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ratemesh::security::{PemSource, ProvidedCerts};
use ratemesh::{CalendarPolicy, ClusterSecret, ClusterSecurity, Region, SecurityError, Seed};
use ratemesh_core::{
    AUDIT_KEYS_MAX_DEFAULT, Algorithm, Fallback, Mode, NodeId, Policy, REGION_LEASE_MS_DEFAULT,
    REGION_SYNC_INTERVAL_MS_DEFAULT, RegionFallback,
};
use zeroize::Zeroizing;

use ratemesh::durable::SnapshotSettings;
use ratemesh_core::StoreConfig;

use super::defaults::{
    AUTH_KEY_HEADER_DEFAULT, AUTH_POLICY_HEADER_DEFAULT, BATCH_LEN_MAX_DEFAULT, CLUSTER_ID_DEFAULT,
    DEAD_MEMBER_FORGET_MS_DEFAULT, DEV_CLUSTER_SECRET, GOSSIP_INTERVAL_MS_DEFAULT, GOSSIP_LISTEN_DEFAULT,
    GRPC_LISTEN_DEFAULT, HTTP_BODY_BYTES_MAX_DEFAULT, HTTP_IN_FLIGHT_MAX_DEFAULT, HTTP_LISTEN_DEFAULT,
    KEY_BYTES_MAX_DEFAULT, LEAVE_LINGER_MS_DEFAULT, QUIC_LISTEN_DEFAULT, RLQS_BUCKETS_PER_STREAM_MAX_DEFAULT,
    RLQS_STREAMS_MAX_DEFAULT, SEED_RESOLVE_INTERVAL_MS_DEFAULT, SYNC_INTERVAL_MS_DEFAULT,
    connections_max_default,
};

/// Whether a reload applies a field at once, or only a restart (`super::reload`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    /// A reload applies it.
    Reload,
    /// Only a restart applies it: a reload that changes it is refused.
    Restart,
}

/// The sections of single values (`[node]`, `[cluster]`, `[listen]`, `[limits]`, `[log]`,
/// `[auth]`), each field stated once: its documentation, type, default (what an empty file gives,
/// from the constants of `super::defaults`), its reload class (`Reload` or `Restart`) and the
/// name operators know it by. Generates the struct, its `Default`, its `FIELDS` (for
/// [`super::RELOADABLE`]) and its `restart_only_changes` (for [`super::restart_only_changes`]):
/// a field is classified where it is declared, so an unclassified field does not compile.
macro_rules! sections {
    (
        $(#[$meta:meta])*
        pub struct $section:ident {
            $(
                $(#[$field_meta:meta])*
                pub $field:ident: $ty:ty = $default:expr, $class:ident $name:literal;
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct $section {
            $($(#[$field_meta])* pub $field: $ty,)*
        }

        impl Default for $section {
            fn default() -> Self {
                $section { $($field: $default,)* }
            }
        }

        impl $section {
            /// Every field, as operators name it, with its reload class.
            pub(super) const FIELDS: &[(&str, Class)] = &[$(($name, Class::$class),)*];

            /// Appends to `fields` each restart-only field that differs between `self` (the
            /// configuration running) and `new`.
            // A section whose every field is reloadable compares nothing: its arguments go unused.
            #[allow(unused_variables, clippy::ptr_arg)]
            pub(super) fn restart_only_changes(&self, new: &Self, fields: &mut Vec<&'static str>) {
                $(sections!(@compare $class $name, self.$field, new.$field, fields);)*
            }
        }
    };
    (@compare Restart $name:literal, $running:expr, $new:expr, $fields:ident) => {
        if $running != $new {
            $fields.push($name);
        }
    };
    (@compare Reload $name:literal, $running:expr, $new:expr, $fields:ident) => {};
}

/// A validated configuration: every value typed, in range and consistent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// `[node]`.
    pub node: NodeSection,
    /// `[cluster]`.
    pub cluster: ClusterSection,
    /// `[listen]`.
    pub listen: ListenSection,
    /// `[limits]`: bounds of tables, queues and requests.
    pub limits: Bounds,
    /// `[log]`.
    pub log: LogSection,
    /// `[auth]`: where `GET /v1/auth` finds the policy and key when the query has none.
    pub auth: AuthSection,
    /// `[rls]`: the Envoy Rate Limit Service.
    pub rls: RlsSection,
    /// `[[policies]]`, in file order; names unique, Envoy descriptor paths unique per domain.
    pub policies: Vec<PolicyConfig>,
    /// `[[rlqs]]` with `[rls] rlqs_*`: Envoy's Rate Limit Quota Service (`crate::rlqs`).
    pub rlqs: RlqsSection,
}

/// Envoy's Rate Limit Quota Service: `[[rlqs]]` domains, and `[rls] rlqs_*` for all of them.
/// Reloadable: every report reads the configuration in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlqsSection {
    /// `[[rlqs]]`, in file order; domains unique.
    pub domains: Vec<RlqsDomain>,
    /// `[rls] rlqs_unknown_domain`: the answer to buckets of a domain no `[[rlqs]]` names
    /// (default allow all).
    pub unknown_domain: UnknownDomain,
    /// `[rls] rlqs_report_period_ms`: how often Envoys report (default 5000: Envoy's filter reports
    /// every 5 s whatever its configuration says). Assignments live 2 periods (whole seconds); a
    /// bucket is abandoned after `abandon_after_periods` silent ones.
    pub report_period: Duration,
    /// `[rls] rlqs_abandon_after_periods`: report periods without a report of a bucket after which
    /// the server abandons it on that stream (default 3).
    pub abandon_after_periods: u32,
    /// `[rls] rlqs_sync_interval_ms`: how often each node tells the owner of each key its
    /// Envoys' demand and learns its part of the key's limit (default 1000; `crate::rlqs::fleet`).
    pub sync_interval: Duration,
}

/// One `[[rlqs]]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlqsDomain {
    /// `domain`: the Envoy filter's `domain`.
    pub domain: String,
    /// `policy`: the policy whose limit the domain's buckets split (its per-key overrides apply,
    /// and its tiers through `tier_entry`).
    pub policy: String,
    /// `key_entries`: the bucket-id entries whose values, joined with `:` in this order, form the
    /// key; unset, every entry sorted by name as `name=value` joined with `,`.
    pub key_entries: Option<Vec<String>>,
    /// `tier_entry`: the bucket-id entry whose value names the policy's tier for the bucket
    /// (unset, absent from a bucket id, or naming no tier of the policy: the policy's own limit).
    pub tier_entry: Option<String>,
}

/// What the RLQS server answers for a domain no `[[rlqs]]` names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnknownDomain {
    /// A blanket `ALLOW_ALL` (the default).
    #[default]
    AllowAll,
    /// A blanket `DENY_ALL`.
    DenyAll,
}

sections! {
    /// `[node]`: this member's identity and where it keeps its durable state.
    pub struct NodeSection {
        /// `id`: the member's id, stable across restarts and unique in the cluster (default 1).
        /// Ignored when `id_from` is set.
        pub id: NodeId = NodeId(1), Restart "node.id";
        /// `id_from`: derive the id at start from a name of this host instead of `id` (see
        /// [`IdFrom`] and `crate::identity`). Conflicts with `id`.
        pub id_from: Option<IdFrom> = None, Restart "node.id_from";
        /// `incarnation`: distinguishes restarts of the same id; unset, the daemon picks one at start
        /// (so that peers can tell a restarted node from a delayed message of its previous life).
        pub incarnation: Option<u64> = None, Restart "node.incarnation";
        /// `data_dir`: an absolute path, where the node keeps its snapshot of durable quotas
        /// (`ratemesh.snapshot`), so that long-period limits survive a restart of the whole
        /// cluster. Unset (the default): nothing is written, and a full restart starts every key
        /// fresh.
        pub data_dir: Option<PathBuf> = None, Restart "node.data_dir";
        /// `snapshot_interval_ms`: time between snapshots (default 5000): a crash of every node at
        /// once loses at most this much of the hits.
        pub snapshot_interval: Duration =
            SnapshotSettings::default().interval, Restart "node.snapshot_interval_ms";
        /// `snapshot_period_min_ms`: limits with a shorter period are not written (default 60000):
        /// they refill within a restart anyway.
        pub snapshot_period_min: Duration =
            SnapshotSettings::default().period_min, Restart "node.snapshot_period_min_ms";
        /// `region`: the region this node runs in (`eu-west`: at most 64 characters of `a`-`z`,
        /// `0`-`9`, `.`, `_`, `-`). Unset or empty (the default): no region; a cluster whose
        /// members name none is one region. Members of a region share an owner per key; regions
        /// share each global limit by leases (`region_*`).
        pub region: Region = Region::NONE, Restart "node.region";
        /// `region_sync_interval_ms`: how often a region's owner of a key reports its region's
        /// demand to the key's home owner and renews its lease (default 250).
        pub region_sync_interval: Duration =
            Duration::from_millis(REGION_SYNC_INTERVAL_MS_DEFAULT), Restart "node.region_sync_interval_ms";
        /// `region_lease_ms`: how long a region's lease on a share of a key's limit lasts without
        /// a renewal (default 2000; longer than `region_sync_interval_ms`).
        pub region_lease: Duration =
            Duration::from_millis(REGION_LEASE_MS_DEFAULT), Restart "node.region_lease_ms";
        /// `region_fallback`: what a region's share falls to when its lease ends without a
        /// renewal (it cannot reach the key's home region): `last` (default), `floor`, `closed`.
        pub region_fallback: RegionFallback = RegionFallback::Last, Restart "node.region_fallback";
        /// `audit_keys_max`: the most keys this node audits as their owner (default 4096, 0:
        /// none); past it, keys are sampled by hash (docs/audit.md).
        pub audit_keys_max: usize = AUDIT_KEYS_MAX_DEFAULT, Restart "node.audit_keys_max";
    }
}

/// The [`RegionFallback`] named `name` in a configuration (`node.region_fallback`, a policy's
/// `region_fallback`), or the message that refuses it.
pub(super) fn region_fallback_named(name: &str) -> Result<RegionFallback, String> {
    RegionFallback::from_name(name).ok_or_else(|| format!("unknown {name:?}: use floor, last or closed"))
}

/// Where `[node] id_from` takes the node's name from; the id is the name's ordinal or hash
/// (`crate::identity::id_from_name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdFrom {
    /// `"hostname"`: the kernel's host name. A Kubernetes pod's is its pod name: `ratemesh-3`
    /// of a StatefulSet → 3.
    Hostname,
    /// `"reverse_dns"`: the name the advertised gossip IP resolves back to (PTR). Docker's
    /// embedded DNS answers a container's name: `project_ratemesh_2.project_default` → 2, a
    /// stable small id for each replica of a service run with `docker-compose --scale`, whose
    /// host names are container ids.
    ReverseDns,
}

impl IdFrom {
    pub(super) const ALL: [IdFrom; 2] = [IdFrom::Hostname, IdFrom::ReverseDns];

    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            IdFrom::Hostname => "hostname",
            IdFrom::ReverseDns => "reverse_dns",
        }
    }
}

/// Where `[listen] advertise_ip_from` takes the advertised IP from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdvertiseIpFrom {
    /// `"hostname"`: the address the host name resolves to, `/etc/hosts` first: Docker and
    /// Kubernetes write the container's own name and address there.
    Hostname,
}

impl AdvertiseIpFrom {
    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            AdvertiseIpFrom::Hostname => "hostname",
        }
    }
}

sections! {
    /// `[cluster]`: membership and peer security.
    pub struct ClusterSection {
        /// `cluster_id`: nodes only gossip with nodes of the same id.
        pub cluster_id: String = CLUSTER_ID_DEFAULT.to_owned(), Restart "cluster.cluster_id";
        /// `seeds`: gossip addresses (`ip:port`) or DNS names (`host:port`: every address the name
        /// resolves to, re-resolved every `seed_resolve_interval_ms`) contacted to join. Empty: a
        /// cluster of one, until others seed from it. With seeds, the daemon is ready (`GET
        /// /readyz`) only while another member is live: a seeded node that cannot reach anyone is not
        /// ready (see `crate::daemon`).
        pub seeds: Vec<Seed> = Vec::new(), Restart "cluster.seeds";
        /// `secret` alone, or `ca_cert_path` + `cert_path` + `key_path` and `secret` (which then
        /// seals gossip only); `secret_accepted` during a rotation.
        pub auth: ClusterAuth =
            ClusterAuth::Secret { secret: SecretString::new(DEV_CLUSTER_SECRET), accepted: None },
            Restart "cluster.secret/certificates";
        /// `gossip_interval_ms`.
        pub gossip_interval: Duration =
            Duration::from_millis(GOSSIP_INTERVAL_MS_DEFAULT), Restart "cluster.gossip_interval_ms";
        /// `sync_interval_ms`: how often approximate-mode allowances are renewed.
        pub sync_interval: Duration =
            Duration::from_millis(SYNC_INTERVAL_MS_DEFAULT), Restart "cluster.sync_interval_ms";
        /// `dead_member_forget_ms`: how long a dead member still counts in the cluster size.
        pub dead_member_forget: Duration =
            Duration::from_millis(DEAD_MEMBER_FORGET_MS_DEFAULT), Restart "cluster.dead_member_forget_ms";
        /// `seed_resolve_interval_ms`: how often seeds given by name are resolved again.
        pub seed_resolve_interval: Duration =
            Duration::from_millis(SEED_RESOLVE_INTERVAL_MS_DEFAULT),
            Restart "cluster.seed_resolve_interval_ms";
        /// `leave_linger_ms`: the longest a graceful shutdown waits for the handoff of this node's
        /// keys to be acknowledged.
        pub leave_linger: Duration =
            Duration::from_millis(LEAVE_LINGER_MS_DEFAULT), Restart "cluster.leave_linger_ms";
    }
}

/// How peers authenticate each other and gossip is sealed (see `ratemesh::security` and
/// `ratemesh::gossip`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterAuth {
    /// A shared secret (at least 16 bytes) from which every node derives the cluster CA and the
    /// gossip key.
    Secret {
        /// `secret`.
        secret: SecretString,
        /// `secret_accepted`: a second secret accepted during a rotation (its CA trusted, its
        /// gossip opened).
        accepted: Option<SecretString>,
    },
    /// Certificates made beforehand (`ratemeshd certs`), PEM files read at start, and the
    /// secret that seals gossip.
    Certs {
        /// `ca_cert_path`: the cluster CA certificate(s).
        ca_cert_path: PathBuf,
        /// `cert_path`: this node's certificate.
        cert_path: PathBuf,
        /// `key_path`: this node's private key.
        key_path: PathBuf,
        /// `secret`: seals gossip (certificates give no key every member shares).
        gossip_secret: SecretString,
        /// `secret_accepted`: a second gossip secret accepted during a rotation.
        accepted: Option<SecretString>,
    },
}

impl ClusterAuth {
    /// The security setup for the peer transport and gossip. Files are not read here but when
    /// the node's identity is built.
    pub fn security(&self) -> Result<ClusterSecurity, SecurityError> {
        let secret = |secret: &SecretString, accepted: &Option<SecretString>| {
            let secret = ClusterSecret::new(secret.expose())?;
            Ok::<_, SecurityError>(match accepted {
                Some(accepted) => secret.also_accepting(ClusterSecret::new(accepted.expose())?),
                None => secret,
            })
        };
        match self {
            ClusterAuth::Secret { secret: s, accepted } => Ok(ClusterSecurity::Secret(secret(s, accepted)?)),
            ClusterAuth::Certs { ca_cert_path, cert_path, key_path, gossip_secret, accepted } => {
                Ok(ClusterSecurity::Provided(ProvidedCerts {
                    ca_cert: PemSource::Path(ca_cert_path.clone()),
                    node_cert: PemSource::Path(cert_path.clone()),
                    node_key: PemSource::Path(key_path.clone()),
                    gossip_secret: secret(gossip_secret, accepted)?,
                }))
            }
        }
    }

    /// Whether this is the public [`DEV_CLUSTER_SECRET`] (worth a warning at start).
    pub fn is_dev_secret(&self) -> bool {
        matches!(self, ClusterAuth::Secret { secret, .. } if secret.expose() == DEV_CLUSTER_SECRET)
    }
}

/// A secret string: zeroed on drop, never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(Zeroizing<String>);

impl SecretString {
    /// Wraps `secret`.
    pub fn new(secret: impl Into<String>) -> SecretString {
        SecretString(Zeroizing::new(secret.into()))
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretString(<redacted>)")
    }
}

sections! {
    /// `[listen]`: the node's sockets.
    pub struct ListenSection {
        /// `http`: the HTTP API (TCP).
        pub http: SocketAddr = HTTP_LISTEN_DEFAULT, Restart "listen.http";
        /// `grpc`: the Envoy Rate Limit Service (TCP).
        pub grpc: SocketAddr = GRPC_LISTEN_DEFAULT, Restart "listen.grpc";
        /// `resp`: the Redis protocol listener (TCP, redis-cell's `CL.THROTTLE`); off unless set.
        pub resp: Option<SocketAddr> = None, Restart "listen.resp";
        /// `rlqs`: Envoy's Rate Limit Quota Service (gRPC, plain HTTP/2); off unless set.
        pub rlqs: Option<SocketAddr> = None, Restart "listen.rlqs";
        /// `gossip`: membership gossip (UDP).
        pub gossip: SocketAddr = GOSSIP_LISTEN_DEFAULT, Restart "listen.gossip";
        /// `quic`: the peer transport (UDP).
        pub quic: SocketAddr = QUIC_LISTEN_DEFAULT, Restart "listen.quic";
        /// `advertise_gossip`: the gossip address peers use, when it differs from `gossip` (NAT,
        /// containers, a listener on `0.0.0.0`).
        pub advertise_gossip: Option<SocketAddr> = None, Restart "listen.advertise_gossip";
        /// `advertise_quic`: the QUIC address peers use, when it differs from `quic`.
        pub advertise_quic: Option<SocketAddr> = None, Restart "listen.advertise_quic";
        /// `advertise_ip_from`: advertise gossip and QUIC on an IP found at start, with the ports of
        /// `gossip` and `quic` (see `crate::identity`). Conflicts with `advertise_gossip` and
        /// `advertise_quic`.
        pub advertise_ip_from: Option<AdvertiseIpFrom> = None, Restart "listen.advertise_ip_from";
        /// `grpc_tls_cert_path`, `grpc_tls_key_path` and `grpc_tls_client_ca_path`: TLS on the gRPC
        /// listener (mutual with a client CA); plain HTTP/2 unless set. Read at start.
        pub grpc_tls: Option<crate::rls::tls::TlsFiles> = None, Restart "listen.grpc_tls_*";
    }
}

impl ListenSection {
    /// The gossip address to announce to peers. Port 0 (bound at start) must be replaced by the
    /// port actually bound.
    pub fn gossip_advertised(&self) -> SocketAddr {
        self.advertise_gossip.unwrap_or(self.gossip)
    }

    /// The QUIC address to announce to peers (port 0: see [`Self::gossip_advertised`]).
    pub fn quic_advertised(&self) -> SocketAddr {
        self.advertise_quic.unwrap_or(self.quic)
    }
}

sections! {
    /// `[limits]`: the bounds of the daemon's tables, queues and requests. Every bound has a default;
    /// none is unbounded.
    pub struct Bounds {
        /// `keys_max`: keys held by the node's store (oldest-to-fresh evicted beyond it).
        pub keys_max: usize = StoreConfig::default().keys_max, Restart "limits.keys_max";
        /// `log_bytes_max`: the bytes all sliding window logs of the node may take together;
        /// beyond it logs are coarsened (conservatively). Restart only.
        pub log_bytes_max: usize = StoreConfig::default().log_bytes_max, Restart "limits.log_bytes_max";
        /// `http_body_bytes_max`: larger request bodies get 413.
        pub http_body_bytes_max: usize = HTTP_BODY_BYTES_MAX_DEFAULT, Reload "limits.http_body_bytes_max";
        /// `http_in_flight_max`: requests served at once; more get 503 at once (load shedding, no
        /// queue). The Envoy RLS server has a bound of its own of the same size.
        pub http_in_flight_max: usize = HTTP_IN_FLIGHT_MAX_DEFAULT, Restart "limits.http_in_flight_max";
        /// `connections_max`: open TCP connections per listener (the HTTP API and the Envoy RLS
        /// server each have this many); a connection beyond it is closed as soon as it is accepted.
        /// Default [`super::CONNECTIONS_PER_IN_FLIGHT_DEFAULT`] × `http_in_flight_max`. Restart only.
        pub connections_max: usize =
            connections_max_default(HTTP_IN_FLIGHT_MAX_DEFAULT), Restart "limits.connections_max";
        /// `batch_len_max`: checks in one `POST /v1/check/batch`.
        pub batch_len_max: usize = BATCH_LEN_MAX_DEFAULT, Reload "limits.batch_len_max";
        /// `key_bytes_max`: the longest client key.
        pub key_bytes_max: usize = KEY_BYTES_MAX_DEFAULT, Reload "limits.key_bytes_max";
        /// `rlqs_streams_max`: RLQS streams open at once on this node; one more is refused
        /// `RESOURCE_EXHAUSTED`.
        pub rlqs_streams_max: usize = RLQS_STREAMS_MAX_DEFAULT, Reload "limits.rlqs_streams_max";
        /// `rlqs_buckets_per_stream_max`: buckets one RLQS stream may report; a report that would
        /// exceed it ends the stream `RESOURCE_EXHAUSTED`.
        pub rlqs_buckets_per_stream_max: usize =
            RLQS_BUCKETS_PER_STREAM_MAX_DEFAULT, Reload "limits.rlqs_buckets_per_stream_max";
    }
}

sections! {
    /// `[log]`.
    pub struct LogSection {
        /// `format`: `"text"` (default) or `"json"`.
        pub format: LogFormat = LogFormat::default(), Restart "log.format";
        /// `level`: `"error"`, `"warn"`, `"info"` (default), `"debug"` or `"trace"`.
        pub level: LogLevel = LogLevel::default(), Reload "log.level";
    }
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

sections! {
    /// `[auth]`: the request headers `GET /v1/auth` (nginx `auth_request`, Traefik forwardAuth)
    /// reads when the query string has no `policy` or `key`. Without the key header, the key is
    /// the client address from `X-Real-IP`, else the **last** entry of `X-Forwarded-For` (the one the
    /// nearest proxy appended; earlier entries are whatever the client sent).
    ///
    /// These headers are trusted as they arrive, so the proxy in front must **set** them, replacing
    /// any value the client sent: nginx passes the client's own request headers to the
    /// `auth_request` subrequest, and a client that chose its own `X-RateLimit-Key` (or policy, or
    /// `X-Real-IP`) would pick its own bucket. With nginx: `proxy_set_header X-RateLimit-Key
    /// $remote_addr;` (or `X-Real-IP`), or pass the key in the query string, which the client cannot
    /// reach.
    pub struct AuthSection {
        /// `policy_header`: the header naming the policy (default `X-RateLimit-Policy`), stored
        /// lowercase.
        pub policy_header: String = AUTH_POLICY_HEADER_DEFAULT.to_owned(), Reload "auth.policy_header";
        /// `key_header`: the header carrying the key (default `X-RateLimit-Key`), stored lowercase.
        pub key_header: String = AUTH_KEY_HEADER_DEFAULT.to_owned(), Reload "auth.key_header";
        /// `admin_token`: the bearer token of the admin API (`PUT`/`DELETE /v1/overrides/...`:
        /// `Authorization: Bearer <token>`), at least 16 bytes; without one the admin API refuses
        /// every change (403).
        pub admin_token: Option<SecretString> = None, Reload "auth.admin_token";
    }
}

/// `[rls]`: the Envoy Rate Limit Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RlsSection {
    /// `all_or_nothing_domains`: domains whose requests are all or nothing: when a descriptor is
    /// over its limit, the hits the request's other descriptors took are given back (as
    /// `POST /v1/check/all`). Default none: every descriptor counts on its own, like Envoy's
    /// ratelimit service.
    pub all_or_nothing_domains: Vec<String>,
    /// envoyproxy/ratelimit's answers, set by `ratemeshd envoy-ratelimit` (never by the file).
    pub envoy_ratelimit: Option<Arc<EnvoyRatelimitAnswers>>,
}
/// The most verbose level logged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// And warnings.
    Warn,
    /// And information.
    #[default]
    Info,
    /// And debugging detail.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    pub(super) const ALL: [LogLevel; 5] =
        [LogLevel::Error, LogLevel::Warn, LogLevel::Info, LogLevel::Debug, LogLevel::Trace];

    /// The configuration name (also what `tracing` level filters accept).
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// The metrics label and header name of inline limits: no policy may have this name.
pub const INLINE_LABEL: &str = "inline";

/// One validated `[[policies]]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyConfig {
    /// `name`: what `"policy"` in API requests and metrics labels refer to. Letters, digits,
    /// `_`, `-` and `.` only: names appear in metric labels and in `RateLimit-Policy` headers, and
    /// cannot collide with inline limits' namespaces (`inline:…`). [`INLINE_LABEL`] itself is
    /// refused: it is how metrics and headers name inline limits.
    pub name: String,
    /// `domain` + `descriptors`: the Envoy descriptor path this policy answers, if any.
    pub envoy: Option<EnvoyPattern>,
    /// The limit, or `unlimited = true`.
    pub rule: Rule,
    /// `shadow_mode`: decisions are counted and reported in metrics, but every request is allowed.
    pub shadow_mode: bool,
    /// `overrides = [{ key, limit, burst, period_ms }]`: per-key limits (a limited policy only),
    /// by key. A key's override wins over a check's `tier`.
    pub overrides: BTreeMap<String, Arc<Policy>>,
    /// `tiers = [{ name, limit, burst, period_ms }]`: named limits a check may ask for with
    /// `"tier"` (a limited policy only), by name.
    pub tiers: BTreeMap<String, Arc<Policy>>,
    /// `home_region`: its name, as configured (the rule's policy holds its id).
    pub home_region: Option<Region>,
}
/// What a policy enforces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A limit, with its cluster mode and fallback (`algorithm`, `limit`, `period_ms`, `burst`,
    /// `delay`, `mode`, `fallback`). Shared: every check names it by reference.
    Limited(Arc<Policy>),
    /// A calendar-aligned fixed window (`window`, `time_zone`): `limit` hits per minute, hour,
    /// day, week or month of the zone's calendar, resolved per check into the current window.
    Calendar(Arc<CalendarPolicy>),
    /// `unlimited = true`: matching requests are always allowed and not counted (Envoy-style
    /// allow-listing of a descriptor).
    Unlimited,
}

impl Rule {
    /// The policy a check made now runs under, unless unlimited (a calendar rule's is the
    /// current window's).
    pub fn policy(&self) -> Option<Arc<Policy>> {
        match self {
            Rule::Limited(policy) => Some(Arc::clone(policy)),
            Rule::Calendar(calendar) => Some(calendar.policy_now()),
            Rule::Unlimited => None,
        }
    }
}

/// The Envoy request descriptors a policy applies to, like an envoyproxy/ratelimit config path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyPattern {
    /// `domain`: the RLS request's domain.
    pub domain: String,
    /// `descriptors`: one pattern per descriptor entry; a request's entries must match them one by
    /// one, with the same count.
    pub descriptors: Vec<DescriptorPattern>,
    /// envoyproxy/ratelimit's `rate_limit.name` (`ratemeshd envoy-ratelimit` only): what other
    /// limits' `replaces` name, and `current_limit.name` in answers.
    pub limit_name: Option<String>,
    /// envoyproxy/ratelimit's `rate_limit.replaces`: the names of the limits that are not applied
    /// when this one matches a descriptor of the same request.
    pub replaces: Vec<String>,
    /// A path that matches without a limit (an envoyproxy/ratelimit descriptor with no
    /// `rate_limit`, which takes a request's entry from a wildcard or a key without value): the
    /// policy holds no limit of its own and is answered as matching nothing.
    pub path_only: bool,
    /// envoyproxy/ratelimit's `requests_per_unit: 0` (its files only): every request is over the
    /// limit of 0 per this unit. The policy's rule is then [`Rule::Unlimited`] (nothing is
    /// counted) and the Rate Limit Service answers `OVER_LIMIT` itself.
    pub deny_all: Option<Duration>,
    /// envoyproxy/ratelimit's `quota_mode` (its files only): this descriptor over its limit makes
    /// the call `OVER_LIMIT` only when every quota-mode descriptor of the call is.
    pub quota_mode: bool,
}

/// One descriptor entry of a policy: `{ key = "...", value = "..." }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorPattern {
    /// The entry's key, matched exactly.
    pub key: String,
    /// Which values match.
    pub value: ValuePattern,
}

/// Which values of a descriptor entry a pattern matches. Whatever matches, each distinct value is
/// its own bucket (the bucket key is made of the request's values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValuePattern {
    /// `value` absent: any value.
    Any,
    /// `value = "v"`: exactly `v`.
    Exact(String),
    /// `value = "v*"`: any value starting with `v` (`"*"` alone: any value, but tried before a
    /// pattern without value, as in envoyproxy/ratelimit).
    Prefix(String),
    /// envoyproxy/ratelimit's wildcard with a `*` inside (`"bar*b"`, `"foo*bar*baz"`): the parts
    /// between the stars, in order, each `*` any run of characters. Tried, with the prefixes, in
    /// file order (written by `ratemeshd envoy-ratelimit`'s YAML files only).
    Wildcard(Vec<String>),
}

impl ValuePattern {
    /// The pattern as written in a file (`None`: no value, any value matches).
    pub fn text(&self) -> Option<String> {
        match self {
            ValuePattern::Any => None,
            ValuePattern::Exact(value) => Some(value.clone()),
            ValuePattern::Prefix(prefix) => Some(format!("{prefix}*")),
            ValuePattern::Wildcard(parts) => Some(parts.join("*")),
        }
    }

    /// Whether `value` matches this pattern.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            ValuePattern::Any => true,
            ValuePattern::Exact(exact) => exact == value,
            ValuePattern::Prefix(prefix) => value.starts_with(prefix.as_str()),
            ValuePattern::Wildcard(parts) => wildcard_matches(parts, value),
        }
    }
}

/// envoyproxy/ratelimit's `wildcardMatch`: `value` starts with the first part, ends with the last,
/// and holds the middle ones in order between them, without overlap.
fn wildcard_matches(parts: &[String], value: &str) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else { return false };
    if parts.len() == 1 {
        return first == value;
    }
    let fixed: usize = parts.iter().map(String::len).sum();
    if value.len() < fixed || !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
        return false;
    }
    let Some(mut rest) = value.get(first.len()..value.len() - last.len()) else { return false };
    for part in &parts[1..parts.len() - 1] {
        let Some(at) = rest.find(part.as_str()) else { return false };
        rest = &rest[at + part.len()..];
    }
    true
}
/// The mode called `name` in the file and the HTTP API.
pub(crate) fn mode_from_name(name: &str) -> Option<Mode> {
    match name {
        "exact" => Some(Mode::Exact),
        "approximate" => Some(Mode::Approximate),
        _ => None,
    }
}

/// The configuration name of `mode` (inverse of [`mode_from_name`]).
pub(crate) fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Exact => "exact",
        Mode::Approximate => "approximate",
    }
}

/// The configuration name of `fallback` (inverse of [`fallback_from_name`]).
pub(crate) fn fallback_name(fallback: Fallback) -> &'static str {
    match fallback {
        Fallback::LocalShare => "local_share",
        Fallback::FailOpen => "fail_open",
        Fallback::FailClosed => "fail_closed",
    }
}

/// The fallback called `name` in the file and the HTTP API.
pub(crate) fn fallback_from_name(name: &str) -> Option<Fallback> {
    match name {
        "local_share" => Some(Fallback::LocalShare),
        "fail_open" => Some(Fallback::FailOpen),
        "fail_closed" => Some(Fallback::FailClosed),
        _ => None,
    }
}

/// Every algorithm name, for error messages.
pub(crate) fn algorithm_names() -> String {
    Algorithm::ALL.map(Algorithm::name).join(", ")
}

/// How `ratemeshd envoy-ratelimit` answers, as envoyproxy/ratelimit's environment sets it: read
/// at start and kept by reloads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvoyRatelimitAnswers {
    /// `SHADOW_MODE`: an `OVER_LIMIT` overall code is answered `OK` (the descriptors' statuses
    /// stay as decided).
    pub global_shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is in quota mode (see [`EnvoyPattern::quota_mode`]).
    pub global_quota_mode: bool,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`: the names of the limit, remaining and reset headers
    /// (`LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`); `None`: no headers.
    pub headers: Option<[String; 3]>,
    /// The loaded configuration as `GET /rlconfig` prints it.
    pub dump: String,
}
