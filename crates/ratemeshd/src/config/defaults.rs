//! Every default of the configuration file, stated once: the constants, from which each field's
//! default in the section tables of `model.rs` is taken (so that an empty file is
//! [`Config::default`]), and the core node's configuration the daemon starts from. Validation
//! takes a value that is not given from here.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ratemesh_core::{Fallback, Mode, NodeConfig, StoreConfig};

use super::model::{Config, RlqsSection, UnknownDomain};

/// The configuration `ratemeshd` runs on without `--config`: every default (a single node on
/// loopback) and one policy, `api`, with a tier `pro`, so that README.md's quick start and the
/// shell blocks of docs/ run as written (`tests/docs/run.sh` runs them against it). An empty
/// file is [`Config::default`], without it.
pub const EMBEDDED_CONFIG: &str = r#"
[[policies]]
name = "api"
algorithm = "token_bucket"
limit = 100
period_ms = 1000
tiers = [{ name = "pro", limit = 1000 }]
"#;

/// The name the embedded configuration is called by in errors.
pub const EMBEDDED_CONFIG_ORIGIN: &str = "<embedded default>";

/// The cluster secret used when the file sets neither `secret` nor certificate paths.
///
/// **INSECURE, for development only.** It is public (it is in the source code): anyone who can
/// reach the gossip or QUIC ports can derive the cluster CA from it and join the cluster. It is
/// therefore refused unless gossip and QUIC listen on loopback only; any real cluster must set
/// `cluster.secret` (or `RATEMESH_CLUSTER_SECRET`) or certificate paths.
pub const DEV_CLUSTER_SECRET: &str = "ratemesh INSECURE development secret: public, do not use";

/// The default cluster id: nodes gossip only with nodes that have the same one (the library's).
pub const CLUSTER_ID_DEFAULT: &str = ratemesh::defaults::CLUSTER_ID;

/// The default HTTP API address.
pub const HTTP_LISTEN_DEFAULT: SocketAddr = loopback(8080);
/// The default Envoy Rate Limit Service (gRPC) address.
pub const GRPC_LISTEN_DEFAULT: SocketAddr = loopback(8081);
/// The default gossip (UDP) address.
pub const GOSSIP_LISTEN_DEFAULT: SocketAddr = loopback(7946);
/// The default QUIC peer transport (UDP) address.
pub const QUIC_LISTEN_DEFAULT: SocketAddr = loopback(7947);

/// Default gossip interval (the library's). With chitchat's initial interval set to the same, a
/// dead node is detected in about two seconds (chitchat's 5 s prior made it ~26 s).
pub const GOSSIP_INTERVAL_MS_DEFAULT: u64 = ratemesh::defaults::GOSSIP_INTERVAL_MS;
/// Default approximate-mode sync interval: the core's `NodeConfig` default.
pub const SYNC_INTERVAL_MS_DEFAULT: u64 = ratemesh_core::SYNC_INTERVAL_MS_DEFAULT;
/// Default time after which a dead member is forgotten (and stops counting in the cluster size):
/// the library's.
pub const DEAD_MEMBER_FORGET_MS_DEFAULT: u64 = ratemesh::defaults::DEAD_MEMBER_FORGET_MS;
/// Default time between resolutions of seeds given by name, once the node has a live peer (while
/// it has none, it resolves sooner: see `ratemesh::seeds`): the library's.
pub const SEED_RESOLVE_INTERVAL_MS_DEFAULT: u64 = ratemesh::defaults::SEED_RESOLVE_INTERVAL_MS;
/// Default longest wait, at shutdown, for the handoff of this node's keys to be acknowledged (the
/// library's default).
pub const LEAVE_LINGER_MS_DEFAULT: u64 = ratemesh::defaults::LEAVE_LINGER_MS;

/// Default `[limits] http_body_bytes_max`: 64 KiB.
pub const HTTP_BODY_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// Default `[limits] http_in_flight_max`.
pub const HTTP_IN_FLIGHT_MAX_DEFAULT: usize = 1024;
/// Default `[limits] connections_max`, as a multiple of `http_in_flight_max`: keep-alive clients
/// hold connections between requests, so a listener needs more connections than requests in
/// flight, but not unboundedly more.
pub const CONNECTIONS_PER_IN_FLIGHT_DEFAULT: usize = 4;
/// Default `[limits] connections_max` for an in-flight bound of `http_in_flight_max`.
pub const fn connections_max_default(http_in_flight_max: usize) -> usize {
    CONNECTIONS_PER_IN_FLIGHT_DEFAULT.saturating_mul(http_in_flight_max)
}
/// Default `[limits] batch_len_max`.
pub const BATCH_LEN_MAX_DEFAULT: usize = 1000;
/// Default `[limits] key_bytes_max`.
pub const KEY_BYTES_MAX_DEFAULT: usize = 4096;
/// Default `mode` of a policy, in the file and inline.
pub const MODE_DEFAULT: Mode = Mode::Approximate;
/// Default `fallback` of a policy, in the file and inline.
pub const FALLBACK_DEFAULT: Fallback = Fallback::LocalShare;
/// Default `time_zone` of a calendar window, in the file and inline.
pub const TIME_ZONE_DEFAULT: &str = "UTC";

/// The core's `forward_wait` the daemon runs with: zero, as `ratemesh::NodeBuilder`'s default
/// (the tokio driver batches forwarded checks by scheduling; the core's timer-based wait would
/// add latency to every exact-mode check of a key owned elsewhere).
pub const FORWARD_WAIT: Duration = Duration::from_millis(ratemesh::defaults::FORWARD_WAIT_MS);

/// Default `[auth] policy_header`.
pub const AUTH_POLICY_HEADER_DEFAULT: &str = "x-ratelimit-policy";
/// Default `[auth] key_header`.
pub const AUTH_KEY_HEADER_DEFAULT: &str = "x-ratelimit-key";
const fn loopback(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
}
/// Default `[limits] rlqs_streams_max`: RLQS streams open at once on a node (one per Envoy and
/// domain).
pub const RLQS_STREAMS_MAX_DEFAULT: usize = 10_000;
/// Default `[limits] rlqs_buckets_per_stream_max`.
pub const RLQS_BUCKETS_PER_STREAM_MAX_DEFAULT: usize = 10_000;
/// Default `[rls] rlqs_report_period_ms`: Envoy's filter reports every 5 s, hard-coded.
pub const RLQS_REPORT_PERIOD_MS_DEFAULT: u64 = 5_000;
/// Default `[rls] rlqs_sync_interval_ms`: how often a node tells the keys' owners its Envoys'
/// demand and learns its part of each limit.
pub const RLQS_SYNC_INTERVAL_MS_DEFAULT: u64 = 1_000;
/// Default `[rls] rlqs_abandon_after_periods`.
pub const RLQS_ABANDON_AFTER_PERIODS_DEFAULT: u32 = 3;

/// Whole milliseconds of a default duration.
pub(super) fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Default for RlqsSection {
    fn default() -> Self {
        RlqsSection {
            domains: Vec::new(),
            unknown_domain: UnknownDomain::AllowAll,
            report_period: Duration::from_millis(RLQS_REPORT_PERIOD_MS_DEFAULT),
            abandon_after_periods: RLQS_ABANDON_AFTER_PERIODS_DEFAULT,
            sync_interval: Duration::from_millis(RLQS_SYNC_INTERVAL_MS_DEFAULT),
        }
    }
}

impl Config {
    /// The core node's configuration: the core's defaults, with this file's sync interval and
    /// key bounds, and [`FORWARD_WAIT`].
    pub fn node_config(&self) -> NodeConfig {
        let defaults = NodeConfig::default();
        NodeConfig {
            forward_wait: FORWARD_WAIT,
            sync_interval: self.cluster.sync_interval,
            region: self.node.region.id(),
            region_sync_interval: self.node.region_sync_interval,
            region_lease: self.node.region_lease,
            region_fallback: self.node.region_fallback,
            audit_keys_max: self.node.audit_keys_max,
            store: StoreConfig {
                keys_max: self.limits.keys_max,
                log_bytes_max: self.limits.log_bytes_max,
                ..defaults.store
            },
            ..defaults
        }
    }
}
