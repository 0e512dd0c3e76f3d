//! The running daemon: a ratemesh [`Node`] started from a [`Config`], the current policies
//! (swapped by hot reload), metrics, readiness and the HTTP in-flight bounds. The HTTP API
//! (`crate::http`) and the Envoy RLS server (`crate::rls`) are thin front ends over [`Daemon`].
//!
//! # Readiness
//!
//! [`Daemon::is_ready`] (`GET /readyz`) is true when the daemon is not shutting down, its gossip
//! runs (not while it is restarted after it ended: the membership view would be stale), the node's
//! ring contains it as a live member, — when `cluster.seeds` is not empty — at least one other
//! member is live, and the node's join grace has passed (see `ratemesh::Node::wait_serving`). A
//! seeded node that cannot reach anyone is therefore **not ready**: at
//! start until it joined, and later whenever it lost every peer (a partition, or all others
//! down). Alone in its own ring it would own every key and admit each limit in full by itself;
//! a load balancer should send traffic to nodes that are part of the cluster. A node without
//! seeds is a cluster of one by configuration, and ready alone.
//!
//! # Hot reload
//!
//! [`Daemon::reload`] (SIGHUP, or the configuration file changed) reads the file again with the
//! same environment overrides and validates it. A refused file changes nothing. A valid file is
//! applied only if it changes nothing that needs a restart (the classification is
//! [`crate::config::restart_only_changes`]: reloadable are [`crate::config::RELOADABLE`]).
//!
//! A reload holds one lock from reading the file to swapping the configuration in, so that two
//! reloads (SIGHUP and the file watcher) cannot apply an older read over a newer one.
//!
//! A policy keeps its buckets across a reload that changes its limit (its buckets are named by
//! the policy's name), so clients are not handed a fresh budget by an edit.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, MutexGuard};

use ratemesh::durable::SnapshotSettings;
use ratemesh::{GossipHealth, Member, MemberStatus, Mutex, Node, NodeBuilder, NodeId, RwLock, StartError};
use tokio::sync::{Semaphore, watch};
use tracing::{info, warn};

use crate::config::{Config, LogLevel};
use crate::metrics::Metrics;
use crate::overrides::LiveOverrides;
use crate::policy::PolicyTable;

mod decide;
mod live;
mod reload;
mod source;

pub use live::AdminError;
pub use reload::{ReloadError, Reloaded};
pub use source::{ConfigSource, FileStamp, SourceError, SourceStamp, XdsDocuments};

/// Requests in flight on the observation routes (`/metrics`, `/readyz`, `/v1/cluster`,
/// `/v1/policies`). They have their own small pool, apart from the API's
/// `limits.http_in_flight_max`: an overloaded node stays observable, and scrapes (each of which
/// encodes every series) cannot pile up without bound either.
pub const OBSERVE_IN_FLIGHT_MAX: usize = 8;

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The cluster security (secret or certificate paths) is unusable.
    #[error("cluster security: {0}")]
    Security(#[from] ratemesh::SecurityError),
    /// The node could not start (sockets, certificates).
    #[error("starting the node: {0}")]
    Start(#[from] StartError),
    /// The node's id or advertised address, to be found in the environment, was not.
    #[error("the node's identity: {0}")]
    Identity(#[from] crate::identity::IdentityError),
}

/// The configuration in force and its policy table, swapped together by a reload.
#[derive(Debug)]
struct Current {
    config: Arc<Config>,
    policies: Arc<PolicyTable>,
}

/// A running daemon. Shared by the servers as `Arc<Daemon>`.
#[derive(Debug)]
pub struct Daemon {
    node: Node,
    current: RwLock<Current>,
    /// The configuration file's path, if there is one (the same as the source's; kept apart so
    /// that reading it needs no lock).
    source_path: Option<PathBuf>,
    /// The configuration file, behind the lock that serializes reloads from reading the file to
    /// applying it (SIGHUP and the file watcher may fire together, and [`Daemon::apply`] too).
    source: Mutex<Option<ConfigSource>>,
    metrics: Metrics,
    http_permits: Arc<Semaphore>,
    observe_permits: Arc<Semaphore>,
    shutting_down: AtomicBool,
    shutdown_tx: watch::Sender<bool>,
    /// Turns true once the node has left: the listeners close then.
    close_tx: watch::Sender<bool>,
    log_level: watch::Sender<LogLevel>,
    reloads: watch::Sender<u64>,
    /// Live per-key overrides (`crate::overrides`).
    live: LiveOverrides,
    /// Envoy RLQS streams and the quota shares this node keeps or owns (`crate::rlqs`).
    rlqs: Arc<crate::rlqs::State>,
}

impl Daemon {
    /// Starts the node of `config` (no file to reload from: [`Daemon::reload`] is refused, but
    /// [`Daemon::apply`] works).
    pub async fn start(config: Config) -> Result<Arc<Daemon>, DaemonError> {
        Daemon::start_with_source(config, None).await
    }

    /// Starts the node of `config`, which was read from `source` by [`ConfigSource::load`]
    /// (reloads read it again; the file watcher compares the file with the stamp taken then).
    pub async fn start_with_source(
        config: Config,
        source: Option<ConfigSource>,
    ) -> Result<Arc<Daemon>, DaemonError> {
        if config.cluster.auth.is_dev_secret() {
            warn!(
                "cluster.secret is the PUBLIC development secret: fine on loopback, never for a real cluster"
            );
        }
        let identity = crate::identity::resolve(&config).await?;
        let security = config.cluster.auth.security()?;
        // What `ratemeshd validate` checks: certificates the peers would refuse stop the start.
        security.checked_identity(identity.id)?;
        let mut builder = NodeBuilder::new(identity.id)
            .security(security)
            .gossip_addr(config.listen.gossip)
            .quic_addr(config.listen.quic)
            .seeds(config.cluster.seeds.iter().cloned())
            .seed_resolve_interval(config.cluster.seed_resolve_interval)
            .cluster_id(config.cluster.cluster_id.clone())
            .gossip_interval(config.cluster.gossip_interval)
            .dead_member_forget(config.cluster.dead_member_forget)
            .leave_linger(config.cluster.leave_linger)
            .node_config(config.node_config())
            .region(config.node.region);
        if let Some(addr) = identity.advertise_gossip {
            builder = builder.gossip_advertise_addr(addr);
        }
        if let Some(addr) = identity.advertise_quic {
            builder = builder.quic_advertise_addr(addr);
        }
        if let Some(incarnation) = config.node.incarnation {
            builder = builder.incarnation(incarnation);
        }
        if let Some(dir) = &config.node.data_dir {
            let settings = SnapshotSettings {
                interval: config.node.snapshot_interval,
                period_min: config.node.snapshot_period_min,
                ..SnapshotSettings::default()
            };
            builder = builder.data_dir(dir).snapshot_settings(settings);
            info!(data_dir = %dir.display(), "durable quotas: snapshots kept in the data directory");
        }
        let node = builder.start().await?;
        let live = node.start_live_overrides(config.node.data_dir.as_deref());
        let policies = Arc::new(PolicyTable::new(&crate::overrides::apply(&live, &config.policies)));
        info!(
            node = identity.id.0,
            policies = policies.len(),
            gossip = %node.gossip_addr(),
            quic = %node.quic_addr(),
            seeds = config.cluster.seeds.len(),
            "daemon started"
        );
        let http_permits = Arc::new(Semaphore::new(config.limits.http_in_flight_max));
        let (shutdown_tx, _) = watch::channel(false);
        let (close_tx, _) = watch::channel(false);
        let (log_level, _) = watch::channel(config.log.level);
        let (reloads, _) = watch::channel(0);
        let rlqs = Arc::new(crate::rlqs::State::default());
        let metrics = Metrics::new(node.clone(), Arc::clone(&rlqs));
        metrics.set_policies(Arc::clone(&policies));
        let daemon = Arc::new(Daemon {
            metrics,
            node,
            current: RwLock::new(Current { config: Arc::new(config), policies }),
            source_path: source.as_ref().map(|source| source.path.clone()),
            source: Mutex::new(source),
            http_permits,
            observe_permits: Arc::new(Semaphore::new(OBSERVE_IN_FLIGHT_MAX)),
            shutting_down: AtomicBool::new(false),
            shutdown_tx,
            close_tx,
            log_level,
            reloads,
            live,
            rlqs,
        });
        // Every node answers RLQS fleet questions, whether it serves RLQS or not: it may own
        // keys that other nodes' Envoys report.
        daemon.node.answer_queries(crate::rlqs::fleet::handler(Arc::downgrade(&daemon)));
        daemon.spawn_override_watch();
        Ok(daemon)
    }

    /// The node's RLQS state.
    pub fn rlqs(&self) -> &crate::rlqs::State {
        &self.rlqs
    }

    /// The ratemesh node.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.node.id()
    }

    /// The configuration in force and its policy table, taken together: a reload swaps both at
    /// once, and a request works on the one snapshot it took (its bounds and its policies always
    /// from the same file). The configuration is as validated: listener ports 0 stay 0 here, the
    /// bound addresses are the servers'.
    pub fn current(&self) -> (Arc<Config>, Arc<PolicyTable>) {
        let current = self.read_current();
        (Arc::clone(&current.config), Arc::clone(&current.policies))
    }

    /// The file the configuration was read from, if any.
    pub fn source_path(&self) -> Option<&Path> {
        self.source_path.as_deref()
    }

    /// The configuration file's stamp when it was last read (at start or by a reload): the file
    /// watcher reloads when the file no longer has it. `None` without a file, or when its
    /// metadata could not be read.
    pub fn read_stamp(&self) -> Option<SourceStamp> {
        self.lock_source().as_ref().and_then(ConfigSource::read_stamp)
    }

    /// The configuration files' stamps now (`None` without a file): the file watcher compares
    /// them with [`Daemon::read_stamp`].
    pub fn stamp_now(&self) -> Option<SourceStamp> {
        self.lock_source().as_ref().map(ConfigSource::stamp_now)
    }

    fn lock_source(&self) -> MutexGuard<'_, Option<ConfigSource>> {
        // The source is replaced whole or not at all: a panic elsewhere cannot leave it torn.
        self.source.lock()
    }

    fn read_current(&self) -> std::sync::RwLockReadGuard<'_, Current> {
        // A panic while holding the lock cannot leave `Current` half-written (it is replaced
        // whole): keep serving.
        self.current.read()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether the daemon should receive traffic (see the module documentation):
    /// [`Daemon::not_ready_reason`] has none.
    pub fn is_ready(&self) -> bool {
        self.not_ready_reason().is_none()
    }

    /// Why the daemon should not receive traffic now, or `None` when it is ready: shutting down;
    /// gossip being restarted after it ended; not (yet) a live member of its own ring; or seeded (`cluster.seeds` not empty) and no
    /// other member is live.
    pub fn not_ready_reason(&self) -> Option<&'static str> {
        if self.is_shutting_down() {
            return Some("shutting down");
        }
        if self.node.gossip_health() != GossipHealth::Running {
            return Some(
                "gossip ended and is being restarted: membership is not updated meanwhile (see the log and \
                 ratemesh_gossip_restarts_total)",
            );
        }
        let me = self.node.id();
        let members = self.node.members();
        let live = |m: &Member| m.status == MemberStatus::Live;
        if !self.node.is_on_ring() {
            return Some("this node is not in its ring yet");
        }
        let (config, _) = self.current();
        if !config.cluster.seeds.is_empty() && !members.iter().any(|m| m.id != me && live(m)) {
            return Some("cluster.seeds are configured but no other member is live (not joined, or cut off)");
        }
        if !self.node.is_serving() {
            return Some("joining: the other members are learning of this node (a few gossip rounds)");
        }
        None
    }

    /// Every member's share of the ring, exactly: `(member, share)` sorted by member id, shares
    /// summing to 1 (empty for an empty ring).
    pub fn ring_shares(&self) -> Vec<(NodeId, f64)> {
        self.node.ring_shares()
    }

    /// The HTTP API's in-flight bound (`limits.http_in_flight_max` permits). A request that
    /// finds none free is shed with 503 at once. Holding permits from outside (tests,
    /// diagnostics) makes the API shed deterministically.
    pub fn http_permits(&self) -> &Arc<Semaphore> {
        &self.http_permits
    }

    /// The observation routes' in-flight bound ([`OBSERVE_IN_FLIGHT_MAX`] permits), apart from
    /// [`Daemon::http_permits`]; `/healthz` needs none. Like the API's, a request that finds
    /// none free gets 503 at once.
    pub fn observe_permits(&self) -> &Arc<Semaphore> {
        &self.observe_permits
    }

    /// Whether shutdown began.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Begins shutdown: readiness turns false, checks fail with [`ratemesh::CheckError::ShutDown`], and the
    /// futures of [`Daemon::shutdown_signal`] complete (the file watcher stops). The node keeps
    /// running until [`Daemon::shutdown`], and the listeners keep answering until it has left
    /// ([`Daemon::close_signal`]). Idempotent.
    pub fn begin_shutdown(&self) {
        if !self.shutting_down.swap(true, Ordering::AcqRel) {
            info!("shutting down");
        }
        self.shutdown_tx.send_replace(true);
    }

    /// A future that completes when shutdown begins (for tasks that stop at once: the file
    /// watcher).
    pub fn shutdown_signal(&self) -> impl Future<Output = ()> + Send + 'static {
        signal(&self.shutdown_tx)
    }

    /// A future that completes once the node has left the cluster at shutdown: give it to a
    /// server as its graceful shutdown signal. Until then the servers answer every request (in
    /// flight or new: readiness 503, checks 503 / `UNAVAILABLE` "shutting down", metrics), so
    /// that a client or load balancer still routing here gets an answer, not a refused
    /// connection, while the node hands its keys over.
    pub fn close_signal(&self) -> impl Future<Output = ()> + Send + 'static {
        signal(&self.close_tx)
    }

    /// Shuts down: [`Daemon::begin_shutdown`], then the node leaves the cluster gracefully
    /// (announces the leave, hands its keys to their new owners, waits at most
    /// `cluster.leave_linger_ms` for the acknowledgements), then [`Daemon::close_signal`]
    /// completes.
    pub async fn shutdown(&self) {
        self.begin_shutdown();
        self.node.shutdown().await;
        self.close_tx.send_replace(true);
    }

    /// The log level in force; changes when a reload changes `[log] level`.
    pub fn subscribe_log_level(&self) -> watch::Receiver<LogLevel> {
        self.log_level.subscribe()
    }
}

/// A future that completes when `flag` turns true (or its sender is gone: the daemon too).
fn signal(flag: &watch::Sender<bool>) -> impl Future<Output = ()> + Send + 'static {
    let mut rx = flag.subscribe();
    async move {
        let _ = rx.wait_for(|set| *set).await;
    }
}
