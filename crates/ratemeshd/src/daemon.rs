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
//! applied only if it changes nothing that needs a restart (see [`restart_only_changes`]):
//!
//! - applied at once: `[[policies]]`, `[log] level`, `[auth]`, and the per-request bounds
//!   `[limits] http_body_bytes_max`, `batch_len_max`, `key_bytes_max`;
//! - need a restart: `[node]`, `[cluster]`, `[listen]`, `[log] format`, `[limits] keys_max`, `log_bytes_max`,
//!   `http_in_flight_max` and `connections_max` (sockets, the node's identity, its key table and
//!   the servers' bounds are made once).
//!
//! A reload holds one lock from reading the file to swapping the configuration in, so that two
//! reloads (SIGHUP and the file watcher) cannot apply an older read over a newer one.
//!
//! A policy keeps its buckets across a reload that changes its limit (its buckets are named by
//! the policy's name), so clients are not handed a fresh budget by an edit.

use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime};

use ratemesh::durable::SnapshotSettings;
use ratemesh::{
    AdjustError, Adjustment, CheckError, GossipHealth, GroupCheck, Member, MemberStatus, NamedPolicy, Node,
    NodeBuilder, NodeId, OverrideLimit, Released, StartError, TopLabel,
};
use ratemesh_core::{Decision, KeyHash, Namespace};
use tokio::sync::{Semaphore, watch};
use tracing::{info, warn};

use crate::config::Rule;
use crate::config::{
    AuthSection, Bounds, ClusterSection, Config, ConfigError, ListenSection, LogLevel, LogSection,
    NodeSection,
};
use crate::metrics::Metrics;
use crate::overrides::{LiveOverride, LiveOverrides, OverrideError};
use crate::policy::{PolicyTable, Target, ValidCheck, ValidRelease};

/// How many probe keys estimate the ring's shares (`GET /v1/cluster`, `ratemeshd cluster`):
/// enough for a share to within about 1 %, cheap enough for a request.
pub const RING_PROBES: u32 = 4096;

/// Requests in flight on the observation routes (`/metrics`, `/readyz`, `/v1/cluster`,
/// `/v1/policies`). They have their own small pool, apart from the API's
/// `limits.http_in_flight_max`: an overloaded node stays observable, and scrapes (each of which
/// encodes every series, or probes the ring) cannot pile up without bound either.
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

/// Why a reload was not applied. The running configuration stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The daemon was started without a file (the embedded default): nothing to reload from.
    #[error("no configuration file to reload (started on the embedded default)")]
    NoFile,
    /// The file is invalid; the error names the line and the field.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// The file changes settings that only a restart applies.
    #[error("not applied: {} can only change with a restart (reloadable: policies, log.level, auth, rls, limits.http_body_bytes_max, limits.batch_len_max, limits.key_bytes_max)", fields.join(", "))]
    RestartRequired {
        /// The fields that changed.
        fields: Vec<&'static str>,
    },
}

/// What a reload did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// The new configuration is in force.
    Applied,
    /// The file's configuration equals the running one.
    Unchanged,
}

/// A file's identity (device and inode), modification time and length: what the file watcher
/// compares to notice a change without reading the file. Symlinks are followed, and the
/// identity is the target's: a Kubernetes ConfigMap volume is updated by swapping a symlink to a
/// new directory (the kubelet's atomic writer), which gives the path another file, whatever
/// that file's time and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    device: u64,
    inode: u64,
    modified: SystemTime,
    len: u64,
}

impl FileStamp {
    /// The stamp of the file at `path` now, `None` if its metadata cannot be read.
    pub fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt as _;
        let metadata = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            device: metadata.dev(),
            inode: metadata.ino(),
            modified: metadata.modified().ok()?,
            len: metadata.len(),
        })
    }
}

/// Where the configuration came from, for reloads.
#[derive(Clone, Debug)]
pub struct ConfigSource {
    /// The file.
    pub path: PathBuf,
    /// The `RATEMESH_` environment overrides read at start, applied again at every reload (the
    /// process's environment does not change; keeping them makes reloads reproducible).
    pub env: Vec<(OsString, OsString)>,
    /// The file's stamp as it was when it was last read (see [`ConfigSource::load`]).
    read_stamp: Option<FileStamp>,
}

impl ConfigSource {
    /// The file at `path`, with the `RATEMESH_` variables among `vars`. Not read yet: load the
    /// configuration with [`ConfigSource::load`], so that the file watcher's starting point is
    /// the file that configuration came from.
    pub fn new(path: PathBuf, vars: impl IntoIterator<Item = (OsString, OsString)>) -> ConfigSource {
        let prefix = crate::config::ENV_PREFIX;
        let env = vars.into_iter().filter(|(name, _)| name.to_string_lossy().starts_with(prefix)).collect();
        ConfigSource { path, env, read_stamp: None }
    }

    /// Reads and validates the file, and remembers the file's stamp, whatever the outcome: the
    /// file watcher reloads when the file differs from what was last read (an invalid file is not
    /// read again every poll, only once it changes).
    pub fn load(&mut self) -> Result<Config, ConfigError> {
        // Taken before reading: a write that races the read changes the file after the stamp,
        // so the watcher sees a difference and reads again. Taken after, that write could be
        // stamped as read while its content was not.
        self.read_stamp = FileStamp::of(&self.path);
        Config::load_with_env(&self.path, self.env.iter().map(|(k, v)| (k, v)))
    }

    /// The file's stamp when it was last read by [`ConfigSource::load`] (`None`: never read, or
    /// its metadata could not be read).
    pub fn read_stamp(&self) -> Option<FileStamp> {
        self.read_stamp
    }
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
}

/// Why an override of a calendar or unlimited policy is refused.
const LIMITED_ONLY: &str = "live overrides apply to limited policies only (not calendar or unlimited)";

/// Why a live override was not written or listed. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No such policy (404).
    #[error("policy: no policy named {0:?}")]
    UnknownPolicy(String),
    /// The policy is not a plain limit (calendar or unlimited), or the override's values do not
    /// make a valid limit under it (400, naming the field).
    #[error("{field}: {message}")]
    Invalid {
        /// The field at fault.
        field: String,
        /// Why.
        message: String,
    },
    /// The table is full, or the entry too long (409 / 400).
    #[error(transparent)]
    Table(OverrideError),
}

impl From<OverrideError> for AdminError {
    fn from(error: OverrideError) -> Self {
        match error {
            OverrideError::Limit(error) => AdminError::Invalid {
                field: crate::config::limit_error_field(&error).to_owned(),
                message: crate::config::limit_error_message(&error),
            },
            OverrideError::Calendar => {
                AdminError::Invalid { field: "policy".to_owned(), message: LIMITED_ONLY.to_owned() }
            }
            other => AdminError::Table(other),
        }
    }
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
        let mut builder = NodeBuilder::new(identity.id)
            .security(config.cluster.auth.security()?)
            .gossip_addr(config.listen.gossip)
            .quic_addr(config.listen.quic)
            .seeds(config.cluster.seeds.iter().cloned())
            .seed_resolve_interval(config.cluster.seed_resolve_interval)
            .cluster_id(config.cluster.cluster_id.clone())
            .gossip_interval(config.cluster.gossip_interval)
            .dead_member_forget(config.cluster.dead_member_forget)
            .leave_linger(config.cluster.leave_linger)
            .node_config(config.node_config());
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
        let daemon = Arc::new(Daemon {
            metrics: Metrics::new(node.clone()),
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
        });
        daemon.spawn_override_watch();
        Ok(daemon)
    }

    /// Rebuilds the policy table whenever the live overrides change (merged from gossip), until
    /// the daemon is dropped or shuts down.
    fn spawn_override_watch(self: &Arc<Self>) {
        let daemon = Arc::downgrade(self);
        let mut changes = self.live.subscribe();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let Some(daemon) = daemon.upgrade() else { return };
                if daemon.is_shutting_down() {
                    return;
                }
                daemon.overrides_changed();
            }
        });
    }

    /// After the live table changed: rebuilds the policy table (the library wrote the data
    /// directory's file).
    fn overrides_changed(&self) {
        let _source = self.lock_source();
        let (config, _) = self.current();
        let policies = Arc::new(PolicyTable::new(&crate::overrides::apply(&self.live, &config.policies)));
        let mut current = self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        current.policies = policies;
    }

    /// Sets (`Some`: limit, burst, period in ms) or deletes (`None`) the live override of `key`
    /// under `policy`, on every node within a few gossip rounds.
    pub fn set_override(
        &self,
        policy: &str,
        key: &str,
        values: Option<(Option<u64>, Option<u64>, Option<u64>)>,
    ) -> Result<LiveOverride, AdminError> {
        let (config, table) = self.current();
        if table.get(policy).is_none() {
            return Err(AdminError::UnknownPolicy(policy.to_owned()));
        }
        let file_entry = config.policies.iter().find(|p| p.name == policy);
        let Some(Rule::Limited(base)) = file_entry.map(|p| &p.rule) else {
            return Err(AdminError::Invalid { field: "policy".to_owned(), message: LIMITED_ONLY.to_owned() });
        };
        let written = match values {
            Some((limit, burst, period_ms)) => {
                let named = NamedPolicy::new(policy, base.as_ref().clone());
                self.live.set(&named, key, OverrideLimit { limit, burst, period_ms })?
            }
            None => self.live.remove(policy, key)?,
        };
        self.overrides_changed();
        Ok(written)
    }

    /// The live overrides of `policy`.
    pub fn overrides_of(&self, policy: &str) -> Result<Vec<LiveOverride>, AdminError> {
        let (_, table) = self.current();
        table.get(policy).ok_or_else(|| AdminError::UnknownPolicy(policy.to_owned()))?;
        Ok(self.live.list(policy))
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
    pub fn read_stamp(&self) -> Option<FileStamp> {
        self.lock_source().as_ref().and_then(ConfigSource::read_stamp)
    }

    fn lock_source(&self) -> MutexGuard<'_, Option<ConfigSource>> {
        // The source is replaced whole or not at all: a panic elsewhere cannot leave it torn.
        self.source.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn read_current(&self) -> std::sync::RwLockReadGuard<'_, Current> {
        // A panic while holding the lock cannot leave `Current` half-written (it is replaced
        // whole): keep serving.
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Checks `cost` hits of `key` against `target`. A named policy's check is counted in the
    /// node's top-keys sketches under `key_text` (the key as the client wrote it); inline limits
    /// are not (they have no name to ask for).
    ///
    /// - An unlimited policy is allowed without asking the node ([`unlimited_decision`]).
    /// - A shadow-mode refusal is returned as allowed (no retry time), and counted as
    ///   `decision="shadow_refused"` in metrics.
    /// - Once shutdown began, [`CheckError::ShutDown`] (answer 503 / UNAVAILABLE: the client
    ///   should ask another node).
    pub async fn check(
        &self,
        target: &Target,
        key: KeyHash,
        key_text: &str,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        let Some(policy) = target.policy() else {
            self.metrics.record_unlimited(target.label());
            return Ok(unlimited_decision());
        };
        if self.is_shutting_down() {
            return Err(CheckError::ShutDown);
        }
        let mut decision = match target {
            Target::Named(entry) => {
                let label = TopLabel { policy: &entry.name, key: key_text.as_bytes() };
                self.node.check_labelled(&policy, key, cost, label).await?
            }
            Target::Inline(_) => self.node.check_hashed(&policy, key, cost).await?,
        };
        let shadow_mode = target.shadow_mode();
        self.metrics.record_decision(target.label(), &decision, shadow_mode);
        if shadow_mode && !decision.allowed {
            decision.allowed = true;
            decision.retry_after = None;
        }
        Ok(decision)
    }

    /// Returns `hits` to `key`'s bucket (a negative cost), at the key's owner. The decision says
    /// whether a cost-1 check would pass afterwards.
    pub async fn refund(&self, target: &Target, key: KeyHash, hits: u64) -> Result<Decision, AdjustError> {
        self.adjust(target, key, Adjustment::Refund, hits).await
    }

    /// Applies `hits` to `key`'s bucket unconditionally (it may go into debt), at the key's owner.
    /// The decision says whether a cost-1 check would pass now, and when it will.
    pub async fn charge(&self, target: &Target, key: KeyHash, hits: u64) -> Result<Decision, AdjustError> {
        self.adjust(target, key, Adjustment::Charge, hits).await
    }

    async fn adjust(
        &self,
        target: &Target,
        key: KeyHash,
        adjustment: Adjustment,
        hits: u64,
    ) -> Result<Decision, AdjustError> {
        let Some(policy) = target.policy() else { return Ok(unlimited_decision()) };
        if self.is_shutting_down() {
            return Err(AdjustError::ShutDown);
        }
        let mut decision = self.node.adjust_hashed(&policy, key, adjustment, hits).await?;
        if target.shadow_mode() && !decision.allowed {
            decision.allowed = true;
            decision.retry_after = None;
        }
        Ok(decision)
    }

    /// Checks every one of `checks`, all or nothing (see [`Node::check_all`]); an unlimited
    /// policy always passes, and a shadow-mode policy is checked on its own (it never refuses).
    /// The decisions are in the order of `checks`.
    pub async fn check_all(&self, checks: &[ValidCheck]) -> Result<(bool, Vec<Decision>), CheckError> {
        if self.is_shutting_down() {
            return Err(CheckError::ShutDown);
        }
        let grouped = |check: &&ValidCheck| check.target.policy().is_some() && !check.target.shadow_mode();
        let group: Vec<GroupCheck> = checks
            .iter()
            .filter(grouped)
            .filter_map(|check| {
                Some(GroupCheck { policy: check.target.policy()?, key: check.key, cost: check.cost })
            })
            .collect();
        let answer = self.node.check_all(&group).await?;
        let mut group_decisions = answer.decisions.into_iter();
        let mut decisions = Vec::with_capacity(checks.len());
        for check in checks {
            let decision = match grouped(&check) {
                true => group_decisions.next().unwrap_or_else(unlimited_decision),
                false => self.check(&check.target, check.key, &check.key_text, check.cost).await?,
            };
            if grouped(&check) {
                self.metrics.record_decision(check.target.label(), &decision, false);
            }
            decisions.push(decision);
        }
        Ok((answer.allowed, decisions))
    }

    /// Gives back a concurrency lease.
    pub fn release(&self, release: &ValidRelease) -> Result<Released, CheckError> {
        if self.is_shutting_down() {
            return Err(CheckError::ShutDown);
        }
        self.node.release_hashed(&release.policy, release.key, release.lease)
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
        // A ring that contains this node has an owner for every key.
        let in_ring = members.iter().any(|m| m.id == me && live(m))
            && self.node.owner_of_hashed(Namespace::new(b"ratemeshd").key(b"readyz")).is_some();
        if !in_ring {
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

    /// This node's share of the ring, and every member's, estimated from [`RING_PROBES`] keys
    /// whose owners are looked up under one lock of the node: `(member, share)` sorted by member
    /// id, shares summing to 1 (empty if no key has an owner).
    pub fn ring_shares(&self) -> Vec<(NodeId, f64)> {
        let namespace = Namespace::new(b"ratemeshd:ring-probe");
        let probes: Vec<KeyHash> =
            (0..RING_PROBES).map(|probe| namespace.key(&probe.to_le_bytes())).collect();
        let mut counts: Vec<(NodeId, u32)> = Vec::new();
        for owner in self.node.owners_of_hashed(&probes).into_iter().flatten() {
            // A handful of members: a linear search beats hashing.
            match counts.iter_mut().find(|(id, _)| *id == owner) {
                Some((_, count)) => *count += 1,
                None => counts.push((owner, 1)),
            }
        }
        let total: u32 = counts.iter().map(|(_, count)| count).sum();
        counts.sort_unstable_by_key(|(id, _)| *id);
        counts.into_iter().map(|(id, count)| (id, f64::from(count) / f64::from(total.max(1)))).collect()
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

    /// Begins shutdown: readiness turns false, checks fail with [`CheckError::ShutDown`], and the
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

    /// A counter of reload attempts (applied or not): wait on it to see that a reload happened.
    pub fn subscribe_reloads(&self) -> watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// Reads the configuration file again and applies it (as [`Daemon::apply`]), holding the
    /// reload lock from the read to the swap. Errors are logged by the caller; the running
    /// configuration stays.
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        let mut source = self.lock_source();
        let result = match source.as_mut() {
            None => Err(ReloadError::NoFile),
            Some(source) => {
                source.load().map_err(ReloadError::from).and_then(|config| self.apply_locked(config))
            }
        };
        self.count_reload(&result);
        result
    }

    /// Applies a validated configuration if it changes only reloadable settings (see the module
    /// documentation); otherwise refuses it and keeps the running one.
    pub fn apply(&self, config: Config) -> Result<Reloaded, ReloadError> {
        let _source = self.lock_source();
        let result = self.apply_locked(config);
        self.count_reload(&result);
        result
    }

    /// Counts a reload attempt in metrics and for [`Daemon::subscribe_reloads`].
    fn count_reload(&self, result: &Result<Reloaded, ReloadError>) {
        let label = match result {
            Ok(Reloaded::Applied) => "applied",
            Ok(Reloaded::Unchanged) => "unchanged",
            Err(_) => "refused",
        };
        self.metrics.record_reload(label);
        self.reloads.send_modify(|count| *count = count.wrapping_add(1));
    }

    /// [`Daemon::apply`]; the caller holds the reload lock.
    fn apply_locked(&self, config: Config) -> Result<Reloaded, ReloadError> {
        let (running, running_policies) = self.current();
        if *running == config {
            return Ok(Reloaded::Unchanged);
        }
        let fields = restart_only_changes(&running, &config);
        if !fields.is_empty() {
            return Err(ReloadError::RestartRequired { fields });
        }
        let policies = Arc::new(PolicyTable::new(&crate::overrides::apply(&self.live, &config.policies)));
        let removed: Vec<&str> = running_policies
            .iter()
            .map(|entry| entry.name.as_str())
            .filter(|name| policies.get(name).is_none())
            .collect();
        let level = config.log.level;
        {
            let mut current = self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            *current = Current { config: Arc::new(config), policies };
        }
        self.metrics.forget_policies(removed);
        self.log_level.send_if_modified(|current| std::mem::replace(current, level) != level);
        Ok(Reloaded::Applied)
    }
}

/// A future that completes when `flag` turns true (or its sender is gone: the daemon too).
fn signal(flag: &watch::Sender<bool>) -> impl Future<Output = ()> + Send + 'static {
    let mut rx = flag.subscribe();
    async move {
        let _ = rx.wait_for(|set| *set).await;
    }
}

/// The decision of an unlimited policy: allowed, with `limit` and `remaining` at `u64::MAX`
/// ("no limit"), nothing to wait for. Front ends write no rate-limit headers for it.
pub fn unlimited_decision() -> Decision {
    Decision {
        allowed: true,
        limit: u64::MAX,
        remaining: u64::MAX,
        reset_after: Duration::ZERO,
        retry_after: None,
        delay: Duration::ZERO,
        lease: None,
    }
}

/// The fields that differ between `running` and `new` and that only a restart can apply.
///
/// Every section is destructured without `..`: a field added to the configuration does not
/// compile here until it is classified, restart-only (compared) or reloadable (`_`).
pub fn restart_only_changes(running: &Config, new: &Config) -> Vec<&'static str> {
    let mut fields = Vec::new();
    let mut differs = |field, changed: bool| {
        if changed {
            fields.push(field);
        }
    };
    // [rls] is reloadable: nothing to compare.
    let Config { node, cluster, listen, limits, log, auth, rls: _, policies: _ } = running;

    let NodeSection { id, id_from, incarnation, data_dir, snapshot_interval, snapshot_period_min } = node;
    let b = &new.node;
    differs("node.id", *id != b.id);
    differs("node.id_from", *id_from != b.id_from);
    differs("node.incarnation", *incarnation != b.incarnation);
    differs("node.data_dir", *data_dir != b.data_dir);
    differs("node.snapshot_interval_ms", *snapshot_interval != b.snapshot_interval);
    differs("node.snapshot_period_min_ms", *snapshot_period_min != b.snapshot_period_min);

    let ClusterSection {
        cluster_id,
        seeds,
        auth: cluster_auth,
        gossip_interval,
        sync_interval,
        dead_member_forget,
        seed_resolve_interval,
        leave_linger,
    } = cluster;
    let b = &new.cluster;
    differs("cluster.cluster_id", *cluster_id != b.cluster_id);
    differs("cluster.seeds", *seeds != b.seeds);
    differs("cluster.secret/certificates", *cluster_auth != b.auth);
    differs("cluster.gossip_interval_ms", *gossip_interval != b.gossip_interval);
    differs("cluster.sync_interval_ms", *sync_interval != b.sync_interval);
    differs("cluster.dead_member_forget_ms", *dead_member_forget != b.dead_member_forget);
    differs("cluster.seed_resolve_interval_ms", *seed_resolve_interval != b.seed_resolve_interval);
    differs("cluster.leave_linger_ms", *leave_linger != b.leave_linger);

    let ListenSection { http, grpc, gossip, quic, advertise_gossip, advertise_quic, advertise_ip_from } =
        listen;
    let b = &new.listen;
    differs("listen.http", *http != b.http);
    differs("listen.grpc", *grpc != b.grpc);
    differs("listen.gossip", *gossip != b.gossip);
    differs("listen.quic", *quic != b.quic);
    differs("listen.advertise_gossip", *advertise_gossip != b.advertise_gossip);
    differs("listen.advertise_quic", *advertise_quic != b.advertise_quic);
    differs("listen.advertise_ip_from", *advertise_ip_from != b.advertise_ip_from);

    // The per-request bounds are read by each request: reloadable.
    let Bounds {
        keys_max,
        http_body_bytes_max: _,
        http_in_flight_max,
        connections_max,
        batch_len_max: _,
        key_bytes_max: _,
        log_bytes_max,
    } = limits;
    let b = &new.limits;
    differs("limits.keys_max", *keys_max != b.keys_max);
    differs("limits.log_bytes_max", *log_bytes_max != b.log_bytes_max);
    differs("limits.http_in_flight_max", *http_in_flight_max != b.http_in_flight_max);
    differs("limits.connections_max", *connections_max != b.connections_max);

    // The level is followed by the subscriber; the format is how it was built.
    let LogSection { format, level: _ } = log;
    differs("log.format", *format != new.log.format);

    // Read by each auth request: reloadable.
    let AuthSection { policy_header: _, key_header: _, admin_token: _ } = auth;
    fields
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    #[test]
    fn restart_only_fields_are_named_and_reloadable_ones_are_not() {
        let running = Config::default();
        let mut new = Config::default();
        new.limits.connections_max += 1;
        new.limits.keys_max += 1;
        new.log.format = crate::config::LogFormat::Json;
        new.cluster.seeds.push(SocketAddr::from(([10, 0, 0, 1], 7946)).into());
        assert_eq!(
            restart_only_changes(&running, &new),
            ["cluster.seeds", "limits.keys_max", "limits.connections_max", "log.format"]
        );
        let mut reloadable = Config::default();
        reloadable.limits.batch_len_max += 1;
        reloadable.limits.http_body_bytes_max += 1;
        reloadable.limits.key_bytes_max += 1;
        reloadable.log.level = LogLevel::Debug;
        reloadable.auth.key_header = "x-user".to_owned();
        assert!(restart_only_changes(&running, &reloadable).is_empty());
    }
}
