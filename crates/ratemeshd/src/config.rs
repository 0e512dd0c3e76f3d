//! The configuration file (TOML): node, cluster, listeners, bounds, logging and policies.
//!
//! Every field has a default, so an empty file is valid and gives [`Config::default`]: a single
//! node on loopback (HTTP 127.0.0.1:8080, Envoy RLS gRPC 127.0.0.1:8081, gossip UDP
//! 127.0.0.1:7946, QUIC 127.0.0.1:7947) secured by the public [`DEV_CLUSTER_SECRET`].
//!
//! Loading is three steps: TOML into a raw model that remembers where each value came from, then
//! environment overrides (`RATEMESH_<SECTION>_<FIELD>`, see [`env_variable_names`]), then
//! validation into the typed [`Config`]. Every refusal is a [`ConfigError`] that names the field
//! and where its value came from: `file:line:column`, or the environment variable. A refused file
//! changes nothing: the caller keeps the configuration it runs on (hot reload relies on this).
//!
//! ```toml
//! [node]
//! id = 1
//!
//! [cluster]
//! seeds = ["10.0.0.2:7946"]     # or a DNS name: ["ratemesh-peers:7946"]
//! secret = "a long shared secret, 16 bytes or more"
//!
//! [[policies]]
//! name = "api"
//! algorithm = "token_bucket"
//! limit = 100
//! period_ms = 1000
//! ```

mod env;
mod raw;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ratemesh::durable::SnapshotSettings;
use ratemesh::security::{CLUSTER_SECRET_LEN_MIN, PemSource, ProvidedCerts};
use ratemesh::{Calendar, CalendarPolicy, CalendarUnit, ClusterSecret, ClusterSecurity, SecurityError, Seed};
use ratemesh_core::{
    Algorithm, Fallback, Limit, LimitError, LimitParameter, LimitSpec, Mode, NodeConfig, NodeId,
    PERIOD_NANOS_MAX, Policy, StoreConfig,
};
use toml::Spanned;
use zeroize::Zeroizing;

pub use env::{ENV_PREFIX, variable_name as env_variable_name, variable_names as env_variable_names};
use raw::{At, PolicyStarts, RawConfig, RawDescriptor, RawListen, RawPolicy, RawVariant, Val};

use crate::policy::INLINE_LABEL;

/// The largest configuration file accepted, in bytes. A policy file is small; a larger one is a
/// wrong path (a log, a binary), refused before it is parsed.
pub const CONFIG_FILE_BYTES_MAX: usize = 1 << 20;

/// The cluster secret used when the file sets neither `secret` nor certificate paths.
///
/// **INSECURE, for development only.** It is public (it is in the source code): anyone who can
/// reach the gossip or QUIC ports can derive the cluster CA from it and join the cluster. It is
/// therefore refused unless gossip and QUIC listen on loopback only; any real cluster must set
/// `cluster.secret` (or `RATEMESH_CLUSTER_SECRET`) or certificate paths.
pub const DEV_CLUSTER_SECRET: &str = "ratemesh INSECURE development secret: public, do not use";

/// The default cluster id: nodes gossip only with nodes that have the same one.
pub const CLUSTER_ID_DEFAULT: &str = "ratemesh";

/// The default HTTP API address.
pub const HTTP_LISTEN_DEFAULT: SocketAddr = loopback(8080);
/// The default Envoy Rate Limit Service (gRPC) address.
pub const GRPC_LISTEN_DEFAULT: SocketAddr = loopback(8081);
/// The default gossip (UDP) address.
pub const GOSSIP_LISTEN_DEFAULT: SocketAddr = loopback(7946);
/// The default QUIC peer transport (UDP) address.
pub const QUIC_LISTEN_DEFAULT: SocketAddr = loopback(7947);

/// Default gossip interval. With chitchat's initial interval set to the same, a dead node is
/// detected in about two seconds (the library's 5 s prior made it ~26 s).
pub const GOSSIP_INTERVAL_MS_DEFAULT: u64 = 200;
/// Default approximate-mode sync interval: the core's `NodeConfig` default.
pub const SYNC_INTERVAL_MS_DEFAULT: u64 = 50;
/// Default time after which a dead member is forgotten (and stops counting in the cluster size).
/// chitchat's own default, 24 h, would keep a departed node's share of every limit unused for a day.
pub const DEAD_MEMBER_FORGET_MS_DEFAULT: u64 = 60_000;
/// Default time between resolutions of seeds given by name, once the node has a live peer (while
/// it has none, it resolves sooner: see `ratemesh::seeds`). Kubernetes' CoreDNS caches answers
/// for about 30 s; new members also announce themselves by gossip.
pub const SEED_RESOLVE_INTERVAL_MS_DEFAULT: u64 = 10_000;
/// Default longest wait, at shutdown, for the handoff of this node's keys to be acknowledged (the
/// library's default).
pub const LEAVE_LINGER_MS_DEFAULT: u64 = 2_000;

/// Default `[limits] http_body_bytes_max`: 64 KiB.
pub const HTTP_BODY_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// Default `[limits] http_in_flight_max`.
pub const HTTP_IN_FLIGHT_MAX_DEFAULT: usize = 1024;
/// Default `[limits] connections_max`, as a multiple of `http_in_flight_max`: keep-alive clients
/// hold connections between requests, so a listener needs more connections than requests in
/// flight, but not unboundedly more.
pub const CONNECTIONS_PER_IN_FLIGHT_DEFAULT: usize = 4;
/// Default `[limits] batch_len_max`.
pub const BATCH_LEN_MAX_DEFAULT: usize = 1000;
/// Default `[limits] key_bytes_max`.
pub const KEY_BYTES_MAX_DEFAULT: usize = 4096;

/// The most seeds a node gossips with at start.
pub const SEEDS_MAX: usize = 256;
/// The most policies in one file.
pub const POLICIES_MAX: usize = 10_000;
/// The most entries in one policy's descriptor path.
pub const DESCRIPTOR_DEPTH_MAX: usize = 16;
/// The longest policy name, cluster id, domain, descriptor key or value, in bytes.
pub const NAME_BYTES_MAX: usize = 255;

/// Shortest and longest snapshot interval: more often than every 100 ms is a disk busy for
/// nothing; beyond an hour a crash of the whole cluster loses most of an hour's hits.
const SNAPSHOT_INTERVAL_MS_MIN: u64 = 100;
const SNAPSHOT_INTERVAL_MS_MAX: u64 = 3_600_000;

/// Longest gossip or sync interval: beyond a minute the cluster no longer reacts in useful time.
const INTERVAL_MS_MAX: u64 = 60_000;
/// Shortest seed resolve interval: more often would only load the name server.
const SEED_RESOLVE_INTERVAL_MS_MIN: u64 = 100;
/// Longest leave linger: a shutdown must fit a pod's termination grace period.
const LEAVE_LINGER_MS_MAX: u64 = 60_000;
/// Longest time a dead member is remembered: a week.
const DEAD_MEMBER_FORGET_MS_MAX: u64 = 7 * 24 * 3600 * 1000;
/// Upper bounds of `[limits]`, far above any sane setting: they catch typos (an extra digit or
/// three), not tuning.
const KEYS_MAX_MAX: u64 = 1 << 32;
/// Largest accepted `limits.log_bytes_max` (64 GiB).
const LOG_BYTES_MAX_MAX: u64 = 64 << 30;
const HTTP_BODY_BYTES_MAX_MAX: u64 = 16 << 20;
const HTTP_IN_FLIGHT_MAX_MAX: u64 = 1 << 20;
const CONNECTIONS_MAX_MAX: u64 = 4 << 20;
const BATCH_LEN_MAX_MAX: u64 = 100_000;

const fn loopback(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
}

/// Where a refused value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A position in a configuration text, both 1-based; the column counts characters.
    File {
        /// The file's name, or what the text was called by the caller.
        origin: String,
        /// Line.
        line: usize,
        /// Column.
        column: usize,
    },
    /// An environment variable.
    Env {
        /// The variable's name.
        variable: String,
    },
    /// The configuration as a whole (a rule about values that all took their defaults).
    Whole {
        /// The file's name, or what the text was called by the caller.
        origin: String,
    },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File { origin, line, column } => write!(f, "{origin}:{line}:{column}"),
            Location::Env { variable } => write!(f, "environment variable {variable}"),
            Location::Whole { origin } => f.write_str(origin),
        }
    }
}

/// Why a configuration was refused. The operator's input is at fault; nothing was applied.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The text is larger than [`CONFIG_FILE_BYTES_MAX`].
    #[error("{origin}: larger than {max_bytes} bytes")]
    TooLarge {
        /// The file's name, or what the text was called.
        origin: String,
        /// The bound.
        max_bytes: usize,
    },
    /// The text is not valid TOML (no field can be named yet).
    #[error("{location}: invalid TOML: {message}")]
    Syntax {
        /// Where.
        location: Location,
        /// What is wrong.
        message: String,
    },
    /// A field has a wrong type or value, is unknown, missing, or conflicts with another.
    #[error("{location}: {field}: {message}")]
    Invalid {
        /// Where the value came from.
        location: Location,
        /// The field, as a path: `listen.http`, `policies[2].limit`,
        /// `policies[0].descriptors[1].value`. Errors found while reading TOML types name the
        /// path without array indices (`policies.limit`); the location has the line.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// An environment variable starts with [`ENV_PREFIX`] but overrides no field.
    #[error("environment variable {variable}: unknown (known: {})", env_variable_names().collect::<Vec<_>>().join(", "))]
    UnknownVariable {
        /// The variable's name.
        variable: String,
    },
}

impl ConfigError {
    /// The field the error names, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }

    /// Where the error is, if it has a place.
    pub fn location(&self) -> Option<&Location> {
        match self {
            ConfigError::Invalid { location, .. } | ConfigError::Syntax { location, .. } => Some(location),
            _ => None,
        }
    }

    /// The line in the file, if the error is at one.
    pub fn line(&self) -> Option<usize> {
        match self.location() {
            Some(Location::File { line, .. }) => Some(*line),
            _ => None,
        }
    }
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
}

/// `[node]`: this member's identity and where it keeps its durable state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSection {
    /// `id`: the member's id, stable across restarts and unique in the cluster (default 1).
    /// Ignored when `id_from` is set.
    pub id: NodeId,
    /// `id_from`: derive the id at start from a name of this host instead of `id` (see
    /// [`IdFrom`] and `crate::identity`). Conflicts with `id`.
    pub id_from: Option<IdFrom>,
    /// `incarnation`: distinguishes restarts of the same id; unset, the daemon picks one at start
    /// (so that peers can tell a restarted node from a delayed message of its previous life).
    pub incarnation: Option<u64>,
    /// `data_dir`: an absolute path, where the node keeps its snapshot of durable quotas (`ratemesh.snapshot`),
    /// so that long-period limits survive a restart of the whole cluster. Unset (the default):
    /// nothing is written, and a full restart starts every key fresh.
    pub data_dir: Option<PathBuf>,
    /// `snapshot_interval_ms`: time between snapshots (default 5000): a crash of every node at
    /// once loses at most this much of the hits.
    pub snapshot_interval: Duration,
    /// `snapshot_period_min_ms`: limits with a shorter period are not written (default 60000):
    /// they refill within a restart anyway.
    pub snapshot_period_min: Duration,
}

impl Default for NodeSection {
    fn default() -> Self {
        NodeSection {
            id: NodeId(1),
            id_from: None,
            incarnation: None,
            data_dir: None,
            snapshot_interval: SnapshotSettings::default().interval,
            snapshot_period_min: SnapshotSettings::default().period_min,
        }
    }
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
    const ALL: [IdFrom; 2] = [IdFrom::Hostname, IdFrom::ReverseDns];

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

/// `[cluster]`: membership and peer security.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSection {
    /// `cluster_id`: nodes only gossip with nodes of the same id.
    pub cluster_id: String,
    /// `seeds`: gossip addresses (`ip:port`) or DNS names (`host:port`: every address the name
    /// resolves to, re-resolved every `seed_resolve_interval_ms`) contacted to join. Empty: a
    /// cluster of one, until others seed from it. With seeds, the daemon is ready (`GET
    /// /readyz`) only while another member is live: a seeded node that cannot reach anyone is not
    /// ready (see `crate::daemon`).
    pub seeds: Vec<Seed>,
    /// `seed_resolve_interval_ms`: how often seeds given by name are resolved again.
    pub seed_resolve_interval: Duration,
    /// `leave_linger_ms`: the longest a graceful shutdown waits for the handoff of this node's
    /// keys to be acknowledged.
    pub leave_linger: Duration,
    /// `secret` alone, or `ca_cert_path` + `cert_path` + `key_path` and `secret` (which then
    /// seals gossip only); `secret_accepted` during a rotation.
    pub auth: ClusterAuth,
    /// `gossip_interval_ms`.
    pub gossip_interval: Duration,
    /// `sync_interval_ms`: how often approximate-mode allowances are renewed.
    pub sync_interval: Duration,
    /// `dead_member_forget_ms`: how long a dead member still counts in the cluster size.
    pub dead_member_forget: Duration,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            cluster_id: CLUSTER_ID_DEFAULT.to_owned(),
            seeds: Vec::new(),
            seed_resolve_interval: Duration::from_millis(SEED_RESOLVE_INTERVAL_MS_DEFAULT),
            leave_linger: Duration::from_millis(LEAVE_LINGER_MS_DEFAULT),
            auth: ClusterAuth::Secret { secret: SecretString::new(DEV_CLUSTER_SECRET), accepted: None },
            gossip_interval: Duration::from_millis(GOSSIP_INTERVAL_MS_DEFAULT),
            sync_interval: Duration::from_millis(SYNC_INTERVAL_MS_DEFAULT),
            dead_member_forget: Duration::from_millis(DEAD_MEMBER_FORGET_MS_DEFAULT),
        }
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

/// `[listen]`: the node's sockets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenSection {
    /// `http`: the HTTP API (TCP).
    pub http: SocketAddr,
    /// `grpc`: the Envoy Rate Limit Service (TCP).
    pub grpc: SocketAddr,
    /// `gossip`: membership gossip (UDP).
    pub gossip: SocketAddr,
    /// `quic`: the peer transport (UDP).
    pub quic: SocketAddr,
    /// `advertise_gossip`: the gossip address peers use, when it differs from `gossip` (NAT,
    /// containers, a listener on `0.0.0.0`).
    pub advertise_gossip: Option<SocketAddr>,
    /// `advertise_quic`: the QUIC address peers use, when it differs from `quic`.
    pub advertise_quic: Option<SocketAddr>,
    /// `advertise_ip_from`: advertise gossip and QUIC on an IP found at start, with the ports of
    /// `gossip` and `quic` (see `crate::identity`). Conflicts with `advertise_gossip` and
    /// `advertise_quic`.
    pub advertise_ip_from: Option<AdvertiseIpFrom>,
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

impl Default for ListenSection {
    fn default() -> Self {
        ListenSection {
            http: HTTP_LISTEN_DEFAULT,
            grpc: GRPC_LISTEN_DEFAULT,
            gossip: GOSSIP_LISTEN_DEFAULT,
            quic: QUIC_LISTEN_DEFAULT,
            advertise_gossip: None,
            advertise_quic: None,
            advertise_ip_from: None,
        }
    }
}

/// `[limits]`: the bounds of the daemon's tables, queues and requests. Every bound has a default;
/// none is unbounded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// `keys_max`: keys held by the node's store (oldest-to-fresh evicted beyond it).
    pub keys_max: usize,
    /// `http_body_bytes_max`: larger request bodies get 413.
    pub http_body_bytes_max: usize,
    /// `http_in_flight_max`: requests served at once; more get 503 at once (load shedding, no
    /// queue). The Envoy RLS server has a bound of its own of the same size.
    pub http_in_flight_max: usize,
    /// `connections_max`: open TCP connections per listener (the HTTP API and the Envoy RLS
    /// server each have this many); a connection beyond it is closed as soon as it is accepted.
    /// Default [`CONNECTIONS_PER_IN_FLIGHT_DEFAULT`] × `http_in_flight_max`. Restart only.
    pub connections_max: usize,
    /// `batch_len_max`: checks in one `POST /v1/check/batch`.
    pub batch_len_max: usize,
    /// `key_bytes_max`: the longest client key.
    pub key_bytes_max: usize,
    /// `log_bytes_max`: the bytes all sliding window logs of the node may take together;
    /// beyond it logs are coarsened (conservatively). Restart only.
    pub log_bytes_max: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            keys_max: StoreConfig::default().keys_max,
            http_body_bytes_max: HTTP_BODY_BYTES_MAX_DEFAULT,
            http_in_flight_max: HTTP_IN_FLIGHT_MAX_DEFAULT,
            connections_max: CONNECTIONS_PER_IN_FLIGHT_DEFAULT * HTTP_IN_FLIGHT_MAX_DEFAULT,
            batch_len_max: BATCH_LEN_MAX_DEFAULT,
            key_bytes_max: KEY_BYTES_MAX_DEFAULT,
            log_bytes_max: StoreConfig::default().log_bytes_max,
        }
    }
}

/// `[log]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogSection {
    /// `format`: `"text"` (default) or `"json"`.
    pub format: LogFormat,
    /// `level`: `"error"`, `"warn"`, `"info"` (default), `"debug"` or `"trace"`.
    pub level: LogLevel,
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

/// Default `[auth] policy_header`.
pub const AUTH_POLICY_HEADER_DEFAULT: &str = "x-ratelimit-policy";
/// Default `[auth] key_header`.
pub const AUTH_KEY_HEADER_DEFAULT: &str = "x-ratelimit-key";

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthSection {
    /// `policy_header`: the header naming the policy (default `X-RateLimit-Policy`), stored
    /// lowercase.
    pub policy_header: String,
    /// `key_header`: the header carrying the key (default `X-RateLimit-Key`), stored lowercase.
    pub key_header: String,
    /// `admin_token`: the bearer token of the admin API (`PUT`/`DELETE /v1/overrides/...`:
    /// `Authorization: Bearer <token>`), at least 16 bytes; without one the admin API refuses
    /// every change (403).
    pub admin_token: Option<SecretString>,
}

/// `[rls]`: the Envoy Rate Limit Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RlsSection {
    /// `all_or_nothing_domains`: domains whose requests are all or nothing: when a descriptor is
    /// over its limit, the hits the request's other descriptors took are given back (as
    /// `POST /v1/check/all`). Default none: every descriptor counts on its own, like Envoy's
    /// ratelimit service.
    pub all_or_nothing_domains: Vec<String>,
}

/// The shortest accepted `[auth] admin_token`.
pub const ADMIN_TOKEN_BYTES_MIN: usize = 16;

impl Default for AuthSection {
    fn default() -> Self {
        AuthSection {
            policy_header: AUTH_POLICY_HEADER_DEFAULT.to_owned(),
            key_header: AUTH_KEY_HEADER_DEFAULT.to_owned(),
            admin_token: None,
        }
    }
}

/// Whether `name` is a plausible HTTP header name: 1 to [`NAME_BYTES_MAX`] ASCII letters,
/// digits, `-` and `_` (a subset of RFC 9110 tokens: every header a proxy sets in practice, and
/// no punctuation that would more likely be a typo).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
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
    const ALL: [LogLevel; 5] =
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
}

/// The most overrides, and the most tiers, of one policy in the file.
pub const VARIANTS_MAX: usize = 10_000;

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
}

impl Config {
    /// Parses and validates `text`, with no environment overrides. `origin` names the text in
    /// errors (usually the file's path).
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        Config::parse_with_env(text, origin, std::iter::empty::<(&str, &str)>())
    }

    /// Parses `text`, applies the `RATEMESH_` variables among `vars` (pass `std::env::vars_os()`),
    /// and validates the result.
    pub fn parse_with_env<I, K, V>(text: &str, origin: &str, vars: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<std::ffi::OsStr>,
        V: AsRef<std::ffi::OsStr>,
    {
        if text.len() > CONFIG_FILE_BYTES_MAX {
            return Err(ConfigError::TooLarge {
                origin: origin.to_owned(),
                max_bytes: CONFIG_FILE_BYTES_MAX,
            });
        }
        let ctx = Ctx { text, origin };
        let mut raw: RawConfig = toml::from_str(text).map_err(|error| ctx.toml_error(error))?;
        env::apply(&mut raw, vars)?;
        ctx.validate(&raw)
    }

    /// Reads (at most [`CONFIG_FILE_BYTES_MAX`] bytes), parses and validates the file at `path`,
    /// with no environment overrides.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_with_env(path, std::iter::empty::<(&str, &str)>())
    }

    /// [`Config::load`], then the `RATEMESH_` variables among `vars`.
    pub fn load_with_env<I, K, V>(path: &Path, vars: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<std::ffi::OsStr>,
        V: AsRef<std::ffi::OsStr>,
    {
        let text = read_bounded(path)?;
        Config::parse_with_env(&text, &path.display().to_string(), vars)
    }

    /// The core node's configuration: the defaults, with this file's sync interval and key bound,
    /// and `forward_wait` zero as in `ratemesh::NodeBuilder`'s default (the tokio driver batches
    /// forwarded checks by scheduling; the core's timer-based wait would add latency to every
    /// exact-mode check of a key owned elsewhere).
    pub fn node_config(&self) -> NodeConfig {
        let defaults = NodeConfig::default();
        NodeConfig {
            forward_wait: Duration::ZERO,
            sync_interval: self.cluster.sync_interval,
            store: StoreConfig {
                keys_max: self.limits.keys_max,
                log_bytes_max: self.limits.log_bytes_max,
                ..defaults.store
            },
            ..defaults
        }
    }
}

/// Whole milliseconds of a default duration.
fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn read_bounded(path: &Path) -> Result<String, ConfigError> {
    let read_error = |source| ConfigError::Read { path: path.to_owned(), source };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    // One byte more than the bound, to tell "exactly at the bound" from "over it".
    file.take(CONFIG_FILE_BYTES_MAX as u64 + 1).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() > CONFIG_FILE_BYTES_MAX {
        return Err(ConfigError::TooLarge {
            origin: path.display().to_string(),
            max_bytes: CONFIG_FILE_BYTES_MAX,
        });
    }
    String::from_utf8(bytes)
        .map_err(|error| read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, error.utf8_error())))
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

/// The user-facing field a [`LimitError`] is about (`limit`, `period_ms`, `burst` or `delay`), so
/// that the error can name it; the checks themselves stay in `Limit::new`.
pub(crate) fn limit_error_field(error: &LimitError) -> &'static str {
    match error.parameter() {
        LimitParameter::Limit => "limit",
        LimitParameter::Period => "period_ms",
        LimitParameter::Burst => "burst",
        LimitParameter::Delay => "delay",
        LimitParameter::Window => "window",
    }
}

/// A [`LimitError`] in the units users write: the core counts periods in nanoseconds, the
/// configuration and the API in milliseconds (`period_ms`).
pub(crate) fn limit_error_message(error: &LimitError) -> String {
    const NANOS_PER_MS: u64 = 1_000_000;
    match error {
        LimitError::TooLarge { parameter: LimitParameter::Period, max } => {
            format!("period_ms is too large (at most {} ms, 100 years)", max / NANOS_PER_MS)
        }
        LimitError::RateTooHigh { limit, period_nanos } => {
            let period_ms = period_nanos / NANOS_PER_MS;
            format!(
                "{limit} per {period_ms} ms is above one hit per nanosecond: at most {} per {period_ms} ms",
                period_nanos
            )
        }
        other => other.to_string(),
    }
}

/// Whether `name` is a valid policy name or cluster id: 1 to [`NAME_BYTES_MAX`] bytes of ASCII
/// letters, digits, `_`, `-` and `.`.
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The text being validated, for locating errors.
struct Ctx<'a> {
    text: &'a str,
    origin: &'a str,
}

impl Ctx<'_> {
    /// The line and column (1-based, in characters) of byte `offset`.
    fn position(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let line = before.matches('\n').count() + 1;
        let column = before[line_start..].chars().count() + 1;
        (line, column)
    }

    fn location(&self, at: &At) -> Location {
        match at {
            At::File(span) => {
                let (line, column) = self.position(span.start);
                Location::File { origin: self.origin.to_owned(), line, column }
            }
            At::Env(variable) => Location::Env { variable: variable.clone() },
        }
    }

    fn invalid(&self, field: impl Into<String>, at: &At, message: impl fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            location: self.location(at),
            field: field.into(),
            message: message.to_string(),
        }
    }

    /// An error where no value was given: the whole configuration.
    fn invalid_whole(&self, field: impl Into<String>, message: impl fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            location: Location::Whole { origin: self.origin.to_owned() },
            field: field.into(),
            message: message.to_string(),
        }
    }

    /// A TOML syntax or type error. The toml crate keeps the key path private but prints it when
    /// the error has no input attached ("in `a.b`"), so it is read back from there.
    fn toml_error(&self, mut error: toml::de::Error) -> ConfigError {
        let location = match error.span() {
            Some(span) => self.location(&At::File(span)),
            None => Location::Whole { origin: self.origin.to_owned() },
        };
        let message = error.message().trim_end().to_owned();
        error.set_input(None);
        let rendered = error.to_string();
        let keys =
            rendered.lines().filter_map(|line| line.strip_prefix("in `")?.strip_suffix('`')).next_back();
        // An unknown field is reported at its key, with the enclosing table as the path.
        let unknown = message.strip_prefix("unknown field `").and_then(|rest| rest.split('`').next());
        let field = match (keys, unknown) {
            (Some(keys), Some(name)) => format!("{keys}.{name}"),
            (None, Some(name)) => name.to_owned(),
            (Some(keys), None) => keys.to_owned(),
            (None, None) => return ConfigError::Syntax { location, message },
        };
        // The TOML is well-formed (only a type was wrong), so the lenient reading succeeds.
        let field = match (error.span(), toml::from_str::<PolicyStarts>(self.text)) {
            (Some(span), Ok(starts)) => starts.index_path(&field, span.start),
            _ => field,
        };
        ConfigError::Invalid { location, field, message }
    }

    fn validate(&self, raw: &RawConfig) -> Result<Config, ConfigError> {
        let node = self.node(raw)?;
        let listen = self.listen(raw)?;
        let cluster = self.cluster(raw, &listen)?;
        let limits = self.bounds(raw)?;
        let log = self.log(raw)?;
        let auth = self.auth_section(raw)?;
        let rls = self.rls(raw)?;
        let policies = self.policies(&raw.policies)?;
        Ok(Config { node, cluster, listen, limits, log, auth, rls, policies })
    }

    fn rls(&self, raw: &RawConfig) -> Result<RlsSection, ConfigError> {
        let mut domains = Vec::new();
        for (i, v) in raw.rls.all_or_nothing_domains.iter().flatten().enumerate() {
            if v.value.is_empty()
                || v.value.len() > NAME_BYTES_MAX
                || v.value.contains(char::is_whitespace)
                || v.value.contains('!')
            {
                return Err(self.invalid(
                    format!("rls.all_or_nothing_domains[{i}]"),
                    &v.at,
                    format!("{:?}: a domain of 1 to {NAME_BYTES_MAX} bytes without spaces", v.value),
                ));
            }
            domains.push(v.value.clone());
        }
        Ok(RlsSection { all_or_nothing_domains: domains })
    }

    fn node(&self, raw: &RawConfig) -> Result<NodeSection, ConfigError> {
        let n = &raw.node;
        let id_from = match &n.id_from {
            None => None,
            Some(v) if n.id.is_some() => {
                return Err(self.invalid("node.id_from", &v.at, "conflicts with node.id: set one of them"));
            }
            Some(v) => {
                Some(IdFrom::ALL.into_iter().find(|from| from.name() == v.value).ok_or_else(|| {
                    self.invalid(
                        "node.id_from",
                        &v.at,
                        format!("unknown {:?}: use hostname or reverse_dns", v.value),
                    )
                })?)
            }
        };
        let defaults = NodeSection::default();
        let data_dir = match &n.data_dir {
            // A relative directory would depend on where the daemon happens to be started.
            Some(v) if !Path::new(&v.value).is_absolute() => {
                return Err(self.invalid(
                    "node.data_dir",
                    &v.at,
                    format!("{:?}: must be an absolute path (leave it out for none)", v.value),
                ));
            }
            Some(v) => Some(PathBuf::from(&v.value)),
            None => None,
        };
        let interval_default = duration_ms(defaults.snapshot_interval);
        let snapshot_interval_ms = self.number(
            "node.snapshot_interval_ms",
            &n.snapshot_interval_ms,
            interval_default,
            SNAPSHOT_INTERVAL_MS_MIN,
            SNAPSHOT_INTERVAL_MS_MAX,
        )?;
        let period_min_default = duration_ms(defaults.snapshot_period_min);
        let snapshot_period_min_ms = self.number(
            "node.snapshot_period_min_ms",
            &n.snapshot_period_min_ms,
            period_min_default,
            0,
            PERIOD_NANOS_MAX / 1_000_000,
        )?;
        Ok(NodeSection {
            id: n.id.as_ref().map_or(defaults.id, |v| NodeId(v.value)),
            id_from,
            incarnation: n.incarnation.as_ref().map(|v| v.value),
            data_dir,
            snapshot_interval: Duration::from_millis(snapshot_interval_ms),
            snapshot_period_min: Duration::from_millis(snapshot_period_min_ms),
        })
    }

    fn cluster(&self, raw: &RawConfig, listen: &ListenSection) -> Result<ClusterSection, ConfigError> {
        let c = &raw.cluster;
        let cluster_id = match &c.cluster_id {
            Some(v) if !is_plain_name(&v.value) => {
                return Err(self.invalid(
                    "cluster.cluster_id",
                    &v.at,
                    format!("{:?}: use 1 to {NAME_BYTES_MAX} letters, digits, '_', '-' or '.'", v.value),
                ));
            }
            Some(v) => v.value.clone(),
            None => CLUSTER_ID_DEFAULT.to_owned(),
        };
        let seeds = c.seeds.as_deref().unwrap_or_default();
        if seeds.len() > SEEDS_MAX {
            let at = &seeds[SEEDS_MAX].at;
            return Err(self.invalid("cluster.seeds", at, format!("more than {SEEDS_MAX} seeds")));
        }
        let seeds = seeds
            .iter()
            .enumerate()
            .map(|(i, seed)| {
                seed.value
                    .parse::<Seed>()
                    .map_err(|error| self.invalid(format!("cluster.seeds[{i}]"), &seed.at, error))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let auth = self.auth(raw, listen)?;
        let gossip_ms = self.number(
            "cluster.gossip_interval_ms",
            &c.gossip_interval_ms,
            GOSSIP_INTERVAL_MS_DEFAULT,
            1,
            INTERVAL_MS_MAX,
        )?;
        let sync_ms = self.number(
            "cluster.sync_interval_ms",
            &c.sync_interval_ms,
            SYNC_INTERVAL_MS_DEFAULT,
            1,
            INTERVAL_MS_MAX,
        )?;
        // A member forgotten before the failure detector could have declared it dead would come
        // back as a new member on every gossip round.
        let forget_ms = self.number(
            "cluster.dead_member_forget_ms",
            &c.dead_member_forget_ms,
            DEAD_MEMBER_FORGET_MS_DEFAULT,
            gossip_ms,
            DEAD_MEMBER_FORGET_MS_MAX,
        )?;
        let resolve_ms = self.number(
            "cluster.seed_resolve_interval_ms",
            &c.seed_resolve_interval_ms,
            SEED_RESOLVE_INTERVAL_MS_DEFAULT,
            SEED_RESOLVE_INTERVAL_MS_MIN,
            INTERVAL_MS_MAX,
        )?;
        let linger_ms = self.number(
            "cluster.leave_linger_ms",
            &c.leave_linger_ms,
            LEAVE_LINGER_MS_DEFAULT,
            0,
            LEAVE_LINGER_MS_MAX,
        )?;
        Ok(ClusterSection {
            cluster_id,
            seeds,
            seed_resolve_interval: Duration::from_millis(resolve_ms),
            leave_linger: Duration::from_millis(linger_ms),
            auth,
            gossip_interval: Duration::from_millis(gossip_ms),
            sync_interval: Duration::from_millis(sync_ms),
            dead_member_forget: Duration::from_millis(forget_ms),
        })
    }

    fn auth(&self, raw: &RawConfig, listen: &ListenSection) -> Result<ClusterAuth, ConfigError> {
        let c = &raw.cluster;
        let paths =
            [("ca_cert_path", &c.ca_cert_path), ("cert_path", &c.cert_path), ("key_path", &c.key_path)];
        let given: Vec<_> = paths.iter().filter_map(|(name, v)| v.as_ref().map(|v| (*name, v))).collect();
        for (name, value) in [("cluster.secret", &c.secret), ("cluster.secret_accepted", &c.secret_accepted)]
        {
            if let Some(secret) = value
                && let Err(error) = ClusterSecret::new(secret.value.as_str())
            {
                return Err(self.invalid(name, &secret.at, error));
            }
        }
        let accepted = c.secret_accepted.as_ref().map(|v| SecretString::new(v.value.as_str()));
        if !given.is_empty() {
            for (name, value) in &paths {
                match value {
                    None => {
                        let (other, v) = given[0];
                        let message = format!(
                            "missing: cluster.{other} is set, and certificates need ca_cert_path, cert_path \
                             and key_path"
                        );
                        return Err(self.invalid(format!("cluster.{name}"), &v.at, message));
                    }
                    Some(v) if v.value.is_empty() => {
                        return Err(self.invalid(format!("cluster.{name}"), &v.at, "must not be empty"));
                    }
                    Some(_) => {}
                }
            }
            let Some(gossip_secret) = &c.secret else {
                let (other, v) = given[0];
                let message = format!(
                    "missing: cluster.{other} is set, and with certificates cluster.secret (at least \
                     {CLUSTER_SECRET_LEN_MIN} bytes, shared by every node) seals gossip"
                );
                return Err(self.invalid("cluster.secret", &v.at, message));
            };
            let path = |v: &Option<Val<String>>| PathBuf::from(v.as_ref().map_or("", |v| v.value.as_str()));
            return Ok(ClusterAuth::Certs {
                ca_cert_path: path(&c.ca_cert_path),
                cert_path: path(&c.cert_path),
                key_path: path(&c.key_path),
                gossip_secret: SecretString::new(gossip_secret.value.as_str()),
                accepted,
            });
        }
        let secret = c.secret.as_ref().map_or(DEV_CLUSTER_SECRET, |v| v.value.as_str());
        if secret == DEV_CLUSTER_SECRET {
            // The development secret is public: a node reachable from other hosts with it would
            // admit anyone into its cluster.
            let exposed =
                [("gossip", listen.gossip, &raw.listen.gossip), ("quic", listen.quic, &raw.listen.quic)]
                    .into_iter()
                    .find(|(_, addr, _)| !addr.ip().is_loopback());
            if let Some((name, addr, at)) = exposed {
                let message = format!(
                    "the built-in development secret is public and only allowed on loopback, but \
                     listen.{name} is {addr}: set cluster.secret (at least {CLUSTER_SECRET_LEN_MIN} \
                     bytes)"
                );
                return Err(match (&c.secret, at) {
                    (Some(v), _) | (None, Some(v)) => self.invalid("cluster.secret", &v.at, message),
                    (None, None) => self.invalid_whole("cluster.secret", message),
                });
            }
        }
        Ok(ClusterAuth::Secret { secret: SecretString::new(secret), accepted })
    }

    fn listen(&self, raw: &RawConfig) -> Result<ListenSection, ConfigError> {
        let l = &raw.listen;
        let http = self.address("listen.http", l.http.as_ref())?.unwrap_or(HTTP_LISTEN_DEFAULT);
        let grpc = self.address("listen.grpc", l.grpc.as_ref())?.unwrap_or(GRPC_LISTEN_DEFAULT);
        let gossip = self.address("listen.gossip", l.gossip.as_ref())?.unwrap_or(GOSSIP_LISTEN_DEFAULT);
        let quic = self.address("listen.quic", l.quic.as_ref())?.unwrap_or(QUIC_LISTEN_DEFAULT);
        let advertise_gossip = l
            .advertise_gossip
            .as_ref()
            .map(|v| self.peer_address("listen.advertise_gossip", v))
            .transpose()?;
        let advertise_quic =
            l.advertise_quic.as_ref().map(|v| self.peer_address("listen.advertise_quic", v)).transpose()?;
        let advertise_ip_from =
            l.advertise_ip_from.as_ref().map(|v| self.advertise_ip_from(v, l, [gossip, quic])).transpose()?;
        // Two sockets of one protocol on one address fail at bind; say so now, with the line.
        // Port 0 asks the OS for a free port, so it never clashes.
        for ((a, addr_a, va), (b, addr_b, vb)) in [
            (("http", http, &l.http), ("grpc", grpc, &l.grpc)),
            (("gossip", gossip, &l.gossip), ("quic", quic, &l.quic)),
        ] {
            if addr_a == addr_b && addr_a.port() != 0 {
                let message = format!("listen.{a} and listen.{b} are both {addr_a}");
                return Err(match (va, vb) {
                    (_, Some(v)) => self.invalid(format!("listen.{b}"), &v.at, message),
                    (Some(v), None) => self.invalid(format!("listen.{a}"), &v.at, message),
                    (None, None) => self.invalid_whole(format!("listen.{b}"), message),
                });
            }
        }
        // Peers cannot reach "any address": a node must announce a concrete one.
        for (name, addr, advertised, v) in
            [("gossip", gossip, advertise_gossip, &l.gossip), ("quic", quic, advertise_quic, &l.quic)]
        {
            if advertised.is_none() && advertise_ip_from.is_none() && addr.ip().is_unspecified() {
                let message = format!(
                    "listens on {addr}, which peers cannot reach: set listen.advertise_{name} to the \
                     address peers should use"
                );
                return Err(match v {
                    Some(v) => self.invalid(format!("listen.{name}"), &v.at, message),
                    None => self.invalid_whole(format!("listen.{name}"), message),
                });
            }
        }
        Ok(ListenSection { http, grpc, gossip, quic, advertise_gossip, advertise_quic, advertise_ip_from })
    }

    /// A listen address (`ip:port`; port 0 lets the OS choose), if given.
    fn address(&self, field: &str, v: Option<&Val<String>>) -> Result<Option<SocketAddr>, ConfigError> {
        v.map(|v| {
            v.value.trim().parse().map_err(|_| {
                self.invalid(field, &v.at, format!("{:?} is not an address of the form ip:port", v.value))
            })
        })
        .transpose()
    }

    /// `listen.advertise_ip_from`, which replaces both advertised addresses: the IP found at
    /// start with the ports of `listen` (which must therefore be chosen, not 0).
    fn advertise_ip_from(
        &self,
        v: &Val<String>,
        l: &RawListen,
        listen: [SocketAddr; 2],
    ) -> Result<AdvertiseIpFrom, ConfigError> {
        if v.value != AdvertiseIpFrom::Hostname.name() {
            return Err(self.invalid(
                "listen.advertise_ip_from",
                &v.at,
                format!("unknown {:?}: use hostname", v.value),
            ));
        }
        let given =
            [("listen.advertise_gossip", &l.advertise_gossip), ("listen.advertise_quic", &l.advertise_quic)];
        if let Some((field, Some(other))) = given.into_iter().find(|(_, v)| v.is_some()) {
            let message =
                "conflicts with listen.advertise_ip_from: give the addresses or where to find them, not both";
            return Err(self.invalid(field, &other.at, message));
        }
        if listen.iter().any(|addr| addr.port() == 0) {
            let message = "needs fixed ports in listen.gossip and listen.quic (0 is chosen at start, too late to advertise)";
            return Err(self.invalid("listen.advertise_ip_from", &v.at, message));
        }
        Ok(AdvertiseIpFrom::Hostname)
    }

    /// An address peers connect to: a concrete IP and a port.
    fn peer_address(&self, field: &str, v: &Val<String>) -> Result<SocketAddr, ConfigError> {
        match self.address(field, Some(v))? {
            Some(addr) if !addr.ip().is_unspecified() && addr.port() != 0 => Ok(addr),
            addr => {
                let shown = addr.map_or_else(|| v.value.clone(), |addr| addr.to_string());
                Err(self.invalid(field, &v.at, format!("{shown} cannot be connected to")))
            }
        }
    }

    /// A number in `min..=max`, or `default` when absent.
    fn number(
        &self,
        field: &str,
        v: &Option<Val<u64>>,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<u64, ConfigError> {
        match v {
            None => Ok(default),
            Some(v) if v.value < min || v.value > max => {
                Err(self.invalid(field, &v.at, format!("{} is out of range {min}..={max}", v.value)))
            }
            Some(v) => Ok(v.value),
        }
    }

    /// [`Self::number`] as a `usize`.
    fn size(
        &self,
        field: &str,
        v: &Option<Val<u64>>,
        default: usize,
        max: u64,
    ) -> Result<usize, ConfigError> {
        let value = self.number(field, v, default as u64, 1, max)?;
        // Bounds are far below usize::MAX on 64-bit targets; on smaller ones a huge value is
        // refused like any out-of-range value.
        usize::try_from(value).map_err(|_| match v {
            Some(v) => self.invalid(field, &v.at, format!("{value} is too large for this platform")),
            None => self.invalid_whole(field, "default too large for this platform"),
        })
    }

    fn bounds(&self, raw: &RawConfig) -> Result<Bounds, ConfigError> {
        let l = &raw.limits;
        let defaults = Bounds::default();
        let http_body_bytes_max = self.size(
            "limits.http_body_bytes_max",
            &l.http_body_bytes_max,
            defaults.http_body_bytes_max,
            HTTP_BODY_BYTES_MAX_MAX,
        )?;
        let http_in_flight_max = self.size(
            "limits.http_in_flight_max",
            &l.http_in_flight_max,
            defaults.http_in_flight_max,
            HTTP_IN_FLIGHT_MAX_MAX,
        )?;
        Ok(Bounds {
            keys_max: self.size("limits.keys_max", &l.keys_max, defaults.keys_max, KEYS_MAX_MAX)?,
            log_bytes_max: self.size(
                "limits.log_bytes_max",
                &l.log_bytes_max,
                defaults.log_bytes_max,
                LOG_BYTES_MAX_MAX,
            )?,
            http_in_flight_max,
            // The default follows the in-flight bound; the product is at most 4 << 20.
            connections_max: self.size(
                "limits.connections_max",
                &l.connections_max,
                CONNECTIONS_PER_IN_FLIGHT_DEFAULT * http_in_flight_max,
                CONNECTIONS_MAX_MAX,
            )?,
            batch_len_max: self.size(
                "limits.batch_len_max",
                &l.batch_len_max,
                defaults.batch_len_max,
                BATCH_LEN_MAX_MAX,
            )?,
            // A key must fit in a request body.
            key_bytes_max: self.size(
                "limits.key_bytes_max",
                &l.key_bytes_max,
                defaults.key_bytes_max.min(http_body_bytes_max),
                http_body_bytes_max as u64,
            )?,
            http_body_bytes_max,
        })
    }

    fn log(&self, raw: &RawConfig) -> Result<LogSection, ConfigError> {
        let format = match &raw.log.format {
            None => LogFormat::default(),
            Some(v) => match v.value.as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => {
                    return Err(self.invalid(
                        "log.format",
                        &v.at,
                        format!("unknown format {other:?}: use text or json"),
                    ));
                }
            },
        };
        let level = match &raw.log.level {
            None => LogLevel::default(),
            Some(v) => LogLevel::ALL.into_iter().find(|level| level.name() == v.value).ok_or_else(|| {
                self.invalid(
                    "log.level",
                    &v.at,
                    format!("unknown level {:?}: use error, warn, info, debug or trace", v.value),
                )
            })?,
        };
        Ok(LogSection { format, level })
    }

    fn auth_section(&self, raw: &RawConfig) -> Result<AuthSection, ConfigError> {
        let header = |field: &str, value: &Option<Val<String>>, default: &str| match value {
            None => Ok(default.to_owned()),
            Some(v) if is_header_name(&v.value) => Ok(v.value.to_ascii_lowercase()),
            Some(v) => Err(self.invalid(
                field,
                &v.at,
                format!(
                    "{:?} is not a header name: use 1 to {NAME_BYTES_MAX} letters, digits, '-' or '_'",
                    v.value
                ),
            )),
        };
        let admin_token = match &raw.auth.admin_token {
            None => None,
            Some(v) if v.value.len() < ADMIN_TOKEN_BYTES_MIN || v.value.trim() != v.value => {
                return Err(self.invalid(
                    "auth.admin_token",
                    &v.at,
                    format!("use at least {ADMIN_TOKEN_BYTES_MIN} bytes, without surrounding spaces"),
                ));
            }
            Some(v) => Some(SecretString::new(v.value.clone())),
        };
        Ok(AuthSection {
            policy_header: header("auth.policy_header", &raw.auth.policy_header, AUTH_POLICY_HEADER_DEFAULT)?,
            key_header: header("auth.key_header", &raw.auth.key_header, AUTH_KEY_HEADER_DEFAULT)?,
            admin_token,
        })
    }

    fn policies(&self, raw: &[Spanned<RawPolicy>]) -> Result<Vec<PolicyConfig>, ConfigError> {
        if raw.len() > POLICIES_MAX {
            let at = At::File(raw[POLICIES_MAX].span());
            return Err(self.invalid("policies", &at, format!("more than {POLICIES_MAX} policies")));
        }
        let mut policies: Vec<PolicyConfig> = Vec::with_capacity(raw.len());
        for (i, spanned) in raw.iter().enumerate() {
            let policy = self.policy(i, spanned)?;
            if let Some(first) = policies.iter().find(|p| p.name == policy.name) {
                let at = spanned.get_ref().name.as_ref().map_or(At::File(spanned.span()), |v| v.at.clone());
                return Err(self.invalid(
                    format!("policies[{i}].name"),
                    &at,
                    format!("duplicate policy name {:?} (names must be unique)", first.name),
                ));
            }
            if let Some(envoy) = &policy.envoy
                && let Some(first) = policies.iter().find(|p| p.envoy.as_ref() == Some(envoy))
            {
                let descriptors = spanned.get_ref().descriptors.as_ref();
                let at = descriptors.map_or(At::File(spanned.span()), |v| v.at.clone());
                return Err(self.invalid(
                    format!("policies[{i}].descriptors"),
                    &at,
                    format!(
                        "policy {:?} has the same domain {:?} and descriptors (each path must be unique)",
                        first.name, envoy.domain
                    ),
                ));
            }
            policies.push(policy);
        }
        Ok(policies)
    }

    fn policy(&self, i: usize, spanned: &Spanned<RawPolicy>) -> Result<PolicyConfig, ConfigError> {
        let p = spanned.get_ref();
        let table = At::File(spanned.span());
        let field = |name: &str| format!("policies[{i}].{name}");
        let name = match &p.name {
            None => return Err(self.invalid(field("name"), &table, "missing")),
            Some(v) if !is_plain_name(&v.value) => {
                return Err(self.invalid(
                    field("name"),
                    &v.at,
                    format!("{:?}: use 1 to {NAME_BYTES_MAX} letters, digits, '_', '-' or '.'", v.value),
                ));
            }
            // Metrics and rate-limit headers label inline limits with this name: a policy of the
            // same name could not be told apart from them.
            Some(v) if v.value == INLINE_LABEL => {
                return Err(self.invalid(
                    field("name"),
                    &v.at,
                    format!("{INLINE_LABEL:?} is reserved for the limits given inline in requests"),
                ));
            }
            Some(v) => v.value.clone(),
        };
        let envoy = self.envoy_pattern(i, p)?;
        let unlimited = p.unlimited.as_ref().is_some_and(|v| v.value);
        let rule = if unlimited {
            if envoy.is_none() {
                let at = p.unlimited.as_ref().map_or(&table, |v| &v.at);
                return Err(self.invalid(
                    field("unlimited"),
                    at,
                    "applies to Envoy descriptors only: set domain and descriptors",
                ));
            }
            let limit_fields = [
                ("algorithm", p.algorithm.as_ref().map(|v| &v.at)),
                ("limit", p.limit.as_ref().map(|v| &v.at)),
                ("period_ms", p.period_ms.as_ref().map(|v| &v.at)),
                ("burst", p.burst.as_ref().map(|v| &v.at)),
                ("delay", p.delay.as_ref().map(|v| &v.at)),
                ("mode", p.mode.as_ref().map(|v| &v.at)),
                ("fallback", p.fallback.as_ref().map(|v| &v.at)),
                ("window", p.window.as_ref().map(|v| &v.at)),
                ("time_zone", p.time_zone.as_ref().map(|v| &v.at)),
            ];
            if let Some((name, Some(at))) = limit_fields.into_iter().find(|(_, at)| at.is_some()) {
                return Err(self.invalid(field(name), at, "does not apply to an unlimited policy"));
            }
            Rule::Unlimited
        } else if p.window.is_some() {
            Rule::Calendar(Arc::new(self.calendar(i, p, &table)?))
        } else {
            Rule::Limited(Arc::new(self.limited(i, p, &table)?))
        };
        let shadow_mode = p.shadow_mode.as_ref().is_some_and(|v| v.value);
        let overrides = self.variants(i, "overrides", p.overrides.as_ref(), &rule)?;
        let tiers = self.variants(i, "tiers", p.tiers.as_ref(), &rule)?;
        Ok(PolicyConfig { name, envoy, rule, shadow_mode, overrides, tiers })
    }

    /// A policy's `overrides` (named by `key`) or `tiers` (named by `name`): each its own limit
    /// under the policy's algorithm, mode and fallback; `limit` and `period_ms` default to the
    /// policy's, `burst` to the policy's when `limit` is not given (else the algorithm's default).
    fn variants(
        &self,
        i: usize,
        list: &str,
        raw: Option<&Val<Vec<Spanned<RawVariant>>>>,
        rule: &Rule,
    ) -> Result<BTreeMap<String, Arc<Policy>>, ConfigError> {
        let mut variants = BTreeMap::new();
        let Some(raw) = raw else { return Ok(variants) };
        let field = format!("policies[{i}].{list}");
        let Rule::Limited(base) = rule else {
            return Err(self.invalid(
                field,
                &raw.at,
                "applies to a limited policy only (not calendar or unlimited)",
            ));
        };
        if raw.value.len() > VARIANTS_MAX {
            return Err(self.invalid(field, &raw.at, format!("more than {VARIANTS_MAX} entries")));
        }
        let name_field = if list == "overrides" { "key" } else { "name" };
        for (j, spanned) in raw.value.iter().enumerate() {
            let v = spanned.get_ref();
            let at = At::File(spanned.span());
            let sub = |name: &str| format!("{field}[{j}].{name}");
            let (named, other) = if list == "overrides" { (&v.key, &v.name) } else { (&v.name, &v.key) };
            if let Some(other) = other {
                let other_name = if list == "overrides" { "name" } else { "key" };
                return Err(self.invalid(
                    sub(other_name),
                    &other.at,
                    format!("{list} are named by {name_field}"),
                ));
            }
            let name = match named {
                None => return Err(self.invalid(sub(name_field), &at, "missing")),
                Some(n) if n.value.is_empty() || n.value.len() > NAME_BYTES_MAX => {
                    return Err(self.invalid(
                        sub(name_field),
                        &n.at,
                        format!("must be 1 to {NAME_BYTES_MAX} bytes"),
                    ));
                }
                Some(n) if variants.contains_key(&n.value) => {
                    return Err(self.invalid(
                        sub(name_field),
                        &n.at,
                        format!("duplicate {name_field} {:?}", n.value),
                    ));
                }
                Some(n) => n.value.clone(),
            };
            let spec = base.limit.spec();
            let limit = v.limit.as_ref().map_or(spec.limit, |l| l.value);
            let burst = match (&v.burst, &v.limit) {
                (Some(b), _) => Some(b.value),
                (None, Some(_)) => None,
                (None, None) => spec.burst,
            };
            let period = v.period_ms.as_ref().map_or(spec.period, |p| Duration::from_millis(p.value));
            let variant = LimitSpec { limit, burst, period, ..spec.clone() };
            let limit = Limit::new(variant).map_err(|error| {
                let name = limit_error_field(&error);
                let v_at = match name {
                    "period_ms" => v.period_ms.as_ref(),
                    "burst" => v.burst.as_ref(),
                    _ => v.limit.as_ref(),
                };
                self.invalid(sub(name), v_at.map_or(&at, |v| &v.at), limit_error_message(&error))
            })?;
            variants.insert(name, Arc::new(Policy { limit, ..Policy::clone(base) }));
        }
        Ok(variants)
    }

    fn limited(&self, i: usize, p: &RawPolicy, table: &At) -> Result<Policy, ConfigError> {
        let field = |name: &str| format!("policies[{i}].{name}");
        let missing =
            |name: &str| self.invalid(field(name), table, "missing (required unless unlimited = true)");
        let algorithm_v = p.algorithm.as_ref().ok_or_else(|| missing("algorithm"))?;
        let algorithm = Algorithm::from_name(&algorithm_v.value).ok_or_else(|| {
            self.invalid(
                field("algorithm"),
                &algorithm_v.at,
                format!("unknown algorithm {:?}: use one of {}", algorithm_v.value, algorithm_names()),
            )
        })?;
        let limit = p.limit.as_ref().ok_or_else(|| missing("limit"))?;
        let period_ms = p.period_ms.as_ref().ok_or_else(|| missing("period_ms"))?;
        let spec = LimitSpec {
            algorithm,
            limit: limit.value,
            period: Duration::from_millis(period_ms.value),
            burst: p.burst.as_ref().map(|v| v.value),
            delay: p.delay.as_ref().map(|v| v.value),
            calendar: None,
        };
        if let Some(v) = &p.time_zone {
            return Err(self.invalid(
                field("time_zone"),
                &v.at,
                "applies only with window (a calendar window)",
            ));
        }
        let limit = Limit::new(spec).map_err(|error| {
            let name = limit_error_field(&error);
            let v = match name {
                "period_ms" => Some(period_ms),
                "burst" => p.burst.as_ref(),
                "delay" => p.delay.as_ref(),
                _ => Some(limit),
            };
            self.invalid(field(name), v.map_or(table, |v| &v.at), limit_error_message(&error))
        })?;
        let (mode, fallback) = self.mode_and_fallback(i, p)?;
        Ok(Policy { limit, mode, fallback })
    }

    /// A calendar-aligned fixed window: `window` (and `time_zone`, default UTC) instead of
    /// `period_ms`; `algorithm`, if given, is `fixed_window`.
    fn calendar(&self, i: usize, p: &RawPolicy, table: &At) -> Result<CalendarPolicy, ConfigError> {
        let field = |name: &str| format!("policies[{i}].{name}");
        let window = p.window.as_ref().ok_or_else(|| self.invalid(field("window"), table, "missing"))?;
        let unit = CalendarUnit::from_name(&window.value).ok_or_else(|| {
            let units: Vec<&str> = CalendarUnit::ALL.iter().map(|u| u.name()).collect();
            self.invalid(
                field("window"),
                &window.at,
                format!("unknown window {:?}: use one of {}", window.value, units.join(", ")),
            )
        })?;
        if let Some(v) = p.algorithm.as_ref().filter(|v| v.value != Algorithm::FixedWindow.name()) {
            return Err(self.invalid(
                field("algorithm"),
                &v.at,
                "a calendar window (window) is a fixed_window",
            ));
        }
        let not_with_window = [
            ("period_ms", p.period_ms.as_ref().map(|v| &v.at)),
            ("burst", p.burst.as_ref().map(|v| &v.at)),
            ("delay", p.delay.as_ref().map(|v| &v.at)),
        ];
        if let Some((name, Some(at))) = not_with_window.into_iter().find(|(_, at)| at.is_some()) {
            return Err(self.invalid(
                field(name),
                at,
                "does not apply with window (the window is the period)",
            ));
        }
        let limit = p.limit.as_ref().ok_or_else(|| self.invalid(field("limit"), table, "missing"))?;
        let zone = p.time_zone.as_ref().map_or("UTC", |v| v.value.as_str());
        let zone_at = p.time_zone.as_ref().map_or(&window.at, |v| &v.at);
        let calendar =
            Calendar::new(unit, zone).map_err(|error| self.invalid(field("time_zone"), zone_at, error))?;
        let (mode, fallback) = self.mode_and_fallback(i, p)?;
        CalendarPolicy::new(calendar, limit.value, mode, fallback)
            .map_err(|error| self.invalid(field("limit"), &limit.at, error))
    }

    fn mode_and_fallback(&self, i: usize, p: &RawPolicy) -> Result<(Mode, Fallback), ConfigError> {
        let field = |name: &str| format!("policies[{i}].{name}");
        let mode = match &p.mode {
            None => Mode::Approximate,
            Some(v) => mode_from_name(&v.value).ok_or_else(|| {
                self.invalid(
                    field("mode"),
                    &v.at,
                    format!("unknown mode {:?}: use exact or approximate", v.value),
                )
            })?,
        };
        let fallback = match &p.fallback {
            None => Fallback::LocalShare,
            Some(v) => fallback_from_name(&v.value).ok_or_else(|| {
                self.invalid(
                    field("fallback"),
                    &v.at,
                    format!("unknown fallback {:?}: use local_share, fail_open or fail_closed", v.value),
                )
            })?,
        };
        Ok((mode, fallback))
    }

    fn envoy_pattern(&self, i: usize, p: &RawPolicy) -> Result<Option<EnvoyPattern>, ConfigError> {
        let field = |name: &str| format!("policies[{i}].{name}");
        let (domain, descriptors) = match (&p.domain, &p.descriptors) {
            (None, None) => return Ok(None),
            (None, Some(v)) => {
                return Err(self.invalid(field("domain"), &v.at, "missing: descriptors need a domain"));
            }
            (Some(v), None) => {
                return Err(self.invalid(field("descriptors"), &v.at, "missing: a domain needs descriptors"));
            }
            (Some(domain), Some(descriptors)) => (domain, descriptors),
        };
        if domain.value.is_empty() || domain.value.len() > NAME_BYTES_MAX {
            return Err(self.invalid(
                field("domain"),
                &domain.at,
                format!("must be 1 to {NAME_BYTES_MAX} bytes"),
            ));
        }
        let entries = &descriptors.value;
        if entries.is_empty() || entries.len() > DESCRIPTOR_DEPTH_MAX {
            return Err(self.invalid(
                field("descriptors"),
                &descriptors.at,
                format!("must hold 1 to {DESCRIPTOR_DEPTH_MAX} entries"),
            ));
        }
        let descriptors = entries
            .iter()
            .enumerate()
            .map(|(j, entry)| self.descriptor(&field(&format!("descriptors[{j}]")), entry))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(EnvoyPattern { domain: domain.value.clone(), descriptors }))
    }

    fn descriptor(
        &self,
        field: &str,
        entry: &Spanned<RawDescriptor>,
    ) -> Result<DescriptorPattern, ConfigError> {
        let e = entry.get_ref();
        let key = match &e.key {
            None => return Err(self.invalid(format!("{field}.key"), &At::File(entry.span()), "missing")),
            Some(v) if v.value.is_empty() || v.value.len() > NAME_BYTES_MAX => {
                return Err(self.invalid(
                    format!("{field}.key"),
                    &v.at,
                    format!("must be 1 to {NAME_BYTES_MAX} bytes"),
                ));
            }
            Some(v) => v.value.clone(),
        };
        let value = match &e.value {
            None => ValuePattern::Any,
            // An empty value would match nothing in Envoy's format (it means "no value"): say so
            // rather than silently treat it as a wildcard.
            Some(v) if v.value.is_empty() || v.value.len() > NAME_BYTES_MAX => {
                return Err(self.invalid(
                    format!("{field}.value"),
                    &v.at,
                    format!("must be 1 to {NAME_BYTES_MAX} bytes; leave value out to match any value"),
                ));
            }
            Some(v) => match v.value.strip_suffix('*') {
                Some(prefix) => ValuePattern::Prefix(prefix.to_owned()),
                None => ValuePattern::Exact(v.value.clone()),
            },
        };
        Ok(DescriptorPattern { key, value })
    }
}
