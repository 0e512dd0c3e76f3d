//! The tokio driver of the core's node: [`NodeBuilder`] → [`Node`].
//!
//! The protocol is entirely in [`ratemesh_core::Node`]; this module only feeds it time, client
//! checks, peer frames and membership views, and carries out what it asks for (frames to send,
//! decisions to return, the next timer). Four tasks drive one node:
//!
//! - the **timer** task sleeps until the core's next deadline (or until a check moved it
//!   earlier) and runs the core's timers: forward batches, acknowledgements, retransmissions,
//!   sync rounds;
//! - the **receive** task hands authenticated peer frames to the core;
//! - the **membership** task turns gossip plus mutual-TLS confirmation into membership views
//!   (see [`crate::membership`]);
//! - the **gossip supervisor** restarts gossip should it end while the node runs (see
//!   [`crate::gossip`]).
//!
//! Client checks run on the caller's task: lock, decide, unlock. A check that must wait for its
//! owner (exact mode, or an approximate allowance that ran dry) registers a one-shot channel that
//! the receive or timer task completes. Forwarded checks are batched without a timer: a check
//! asks the timer task to flush, and every check that arrives before that task runs joins the
//! same batch — so batches grow with load and an idle node adds no delay.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use chitchat::ChitchatHandle;
use ratemesh_core::wire::WIRE_VERSION;
use ratemesh_core::{
    CheckOutcome, CheckRequest, Decision, Event, KeyHash, LeaseId, LeavePlan, MemberView, Namespace,
    NodeConfig, NodeConfigError, NodeId, NodeStats, Policy, RequestId, StoreStats,
};
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, trace_span};

use crate::durable::{
    FileStateStore, Persistence, SnapshotMetrics, SnapshotSettings, StateStore, cluster_fingerprint,
};
use crate::gossip::{
    GossipCounters, GossipHealth, GossipLimits, GossipSlot, GossipStarter, GossipStats, SealConfig,
    gossip_keys, supervise,
};
use crate::membership::{
    KEY_LEAVING, KEY_PROTOCOL, KEY_QUIC_ADDR, Member, MemberStatus, Membership, ViewSink,
};
use crate::security::{ClusterSecurity, SecurityError};
use crate::seeds::{Seed, SeedHost, SeedResolution, SeedSink};
use crate::top::{
    TopAnswer, TopBy, TopConfig, TopQuestion, TopReply, TopSummary, TopTable, decode_question, decode_reply,
    encode_message, merge,
};
use crate::transport::{Received, Transport, TransportConfig, TransportError, TransportStats};

/// Frames handed to the core per lock taken by the receive task (the rest wait for the next turn,
/// so that client checks are not starved by a burst of frames).
const FRAMES_PER_TURN_MAX: usize = 64;
/// Gossip rounds a leaving node waits, beyond log2 of the cluster's size, for its peers to learn
/// of the leave before it hands its keys over; also how long a node that starts with seeds takes
/// no checks while the cluster learns of it (`NodeConfig::join_grace`).
const LEAVE_GOSSIP_ROUNDS_MIN: u32 = 3;
/// The most addresses of members that left the view kept for answering them (a leaving member
/// waits for acknowledgements of its handoff after the others dropped it from their views).
const DEPARTED_ADDRS_MAX: usize = 4096;
/// Attempts at binding the gossip socket when its port is chosen by the node (port 0).
const GOSSIP_BIND_ATTEMPTS_MAX: usize = 16;

/// A policy with a name. The name separates its keys from other policies' (the same key under two
/// policies is two buckets) and appears in the `RateLimit-Policy` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedPolicy {
    name: Arc<str>,
    namespace: Namespace,
    policy: Arc<Policy>,
}

impl NamedPolicy {
    /// `policy` under `name`. Policies are plain values: there is nothing to register, and a
    /// changed policy (a configuration reload) takes effect with the next check that names it.
    pub fn new(name: impl Into<Arc<str>>, policy: Policy) -> NamedPolicy {
        let name = name.into();
        NamedPolicy { namespace: Namespace::new(name.as_bytes()), name, policy: Arc::new(policy) }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limit, mode and fallback.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The bucket of `key` under this policy.
    pub fn key(&self, key: &[u8]) -> KeyHash {
        self.namespace.key(key)
    }
}

/// Names a check in the top-keys sketches: its policy and the key as the client wrote it (cut at
/// `TopConfig::key_bytes_max`).
#[derive(Clone, Copy, Debug)]
pub struct TopLabel<'a> {
    /// The policy's name.
    pub policy: &'a str,
    /// The key.
    pub key: &'a [u8],
}

/// What [`Node::top`] found: the merged answer, who contributed, who did not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopReport {
    /// The heaviest keys, their estimates, the bound and the window.
    pub answer: TopAnswer,
    /// Members whose sketches are in the answer (this node included), by id.
    pub answered: Vec<NodeId>,
    /// Live members that did not answer, by id.
    pub missing: Vec<MissingMember>,
}

/// A member whose sketches are not in a [`TopReport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingMember {
    /// The member.
    pub id: NodeId,
    /// Why (unreachable, timed out, refused, malformed answer).
    pub reason: String,
}

/// How a node answers other members' top-keys questions: from its own sketches, at its own now.
fn top_query_handler(top: Arc<TopTable>, origin: Origin) -> crate::transport::QueryHandler {
    Arc::new(move |_from, question| {
        let reply = match decode_question(question) {
            Ok(question) => {
                let (summaries, window) = top.summaries(origin.now_instant(), &question.policy, question.by);
                let window_nanos = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
                TopReply { window_nanos, summaries }
            }
            // A question this node cannot read gets an answer that is not a reply (the asker
            // reports this member as missing).
            Err(_) => return Vec::new(),
        };
        encode_message(&reply)
    })
}

/// Why a [`NodeBuilder`] could not start a node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// No cluster security was given ([`NodeBuilder::security`]).
    #[error("cluster security is required: a shared secret or provided certificates")]
    NoSecurity,
    /// The node's certificate could not be made or loaded.
    #[error(transparent)]
    Security(#[from] SecurityError),
    /// The QUIC endpoint could not be opened.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The gossip socket could not be opened.
    #[error("gossip on {addr}: {reason}")]
    Gossip {
        /// The address.
        addr: SocketAddr,
        /// What chitchat reported.
        reason: String,
    },
    /// A setting of the core node is out of range ([`NodeConfig::validate`]).
    #[error("invalid setting: {0}")]
    Core(#[from] NodeConfigError),
    /// A setting is out of range.
    #[error("invalid setting {field}: {reason}")]
    Config {
        /// The setting.
        field: &'static str,
        /// Why.
        reason: &'static str,
    },
}

/// The most values one node publishes under one prefix ([`Node::publish_shared_values`]): with
/// ratemesh's own three, well within the default `GossipLimits::keys_per_node_max` (32). A
/// cluster that lowers that bound must keep it above 3 plus what its members publish: members
/// refuse gossip about entries with more keys.
pub const SHARED_VALUES_MAX: usize = 16;
/// The longest shared value, in bytes (the default `GossipLimits::value_len_max` is 1024).
pub const SHARED_VALUE_BYTES_MAX: usize = 1000;

/// Why [`Node::publish_shared_values`] published nothing. The caller is at fault, except for
/// `NotRunning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SharedValuesError {
    /// The prefix does not start with `app.` (ratemesh's own keys start with `ratemesh.`) or is
    /// longer than 64 bytes.
    #[error("shared value prefixes start with \"app.\" and have at most 64 bytes")]
    Prefix,
    /// More values than [`SHARED_VALUES_MAX`].
    #[error("{len} values, at most {SHARED_VALUES_MAX} are published")]
    TooMany {
        /// How many were given.
        len: usize,
    },
    /// A value longer than [`SHARED_VALUE_BYTES_MAX`].
    #[error("a value of {len} bytes, at most {SHARED_VALUE_BYTES_MAX} are published")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Gossip is not running (shut down, or being restarted): retry.
    #[error("gossip is not running")]
    NotRunning,
}

/// What a [`Node::release`] did with the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// This node owns the key and ended the lease.
    Ended,
    /// This node owns the key and the lease was not held (released already, expired, or never
    /// taken): nothing changed.
    NotHeld,
    /// Another member owns the key: the release was sent to it, which ends the lease if it is
    /// held (there is no answer to tell).
    SentToOwner(NodeId),
}

/// Why a check has no decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// The node is shutting down or shut down.
    #[error("the node is shutting down")]
    ShutDown,
    /// The node has just started and takes no checks while the cluster learns of it (a few
    /// gossip rounds; see `NodeConfig::join_grace`). Ask another node, or retry shortly.
    #[error("the node is joining the cluster")]
    Joining,
    /// [`Node::check_now`] only: the key is owned by another node and its policy is exact, so
    /// only a round trip can decide. Use [`Node::check`].
    #[error("an exact-mode check of a key owned elsewhere needs a round trip")]
    WouldWait,
}

/// Configures and starts a [`Node`]. Every setting but the node id and security has a default
/// suited to a cluster on one network: loopback addresses with ephemeral ports, 200 ms gossip,
/// the core's [`NodeConfig`] defaults.
#[derive(Clone, Debug)]
pub struct NodeBuilder {
    id: NodeId,
    security: Option<ClusterSecurity>,
    gossip_addr: SocketAddr,
    gossip_advertise_addr: Option<SocketAddr>,
    quic_addr: SocketAddr,
    quic_advertise_addr: Option<SocketAddr>,
    seeds: Vec<SocketAddr>,
    /// Seeds given by name, resolved by `crate::seeds` (not by chitchat).
    seed_hosts: Vec<SeedHost>,
    seed_resolve_interval: Duration,
    cluster_id: String,
    gossip_interval: Duration,
    dead_member_forget: Duration,
    gossip_limits: GossipLimits,
    leave_linger: Duration,
    incarnation: Option<u64>,
    seed: Option<u64>,
    core: NodeConfig,
    transport: TransportConfig,
    state_store: Option<Arc<dyn StateStore>>,
    snapshots: SnapshotSettings,
    top: TopConfig,
    top_query_timeout: Duration,
}

impl NodeBuilder {
    /// A builder for member `id` (unique in the cluster and stable across restarts).
    pub fn new(id: NodeId) -> NodeBuilder {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        NodeBuilder {
            id,
            security: None,
            gossip_addr: loopback,
            gossip_advertise_addr: None,
            quic_addr: loopback,
            quic_advertise_addr: None,
            seeds: Vec::new(),
            seed_hosts: Vec::new(),
            seed_resolve_interval: Duration::from_secs(10),
            cluster_id: "ratemesh".to_owned(),
            gossip_interval: Duration::from_millis(200),
            dead_member_forget: Duration::from_secs(120),
            gossip_limits: GossipLimits::default(),
            leave_linger: Duration::from_secs(2),
            incarnation: None,
            seed: None,
            core: NodeConfig { forward_wait: Duration::ZERO, ..NodeConfig::default() },
            transport: TransportConfig::default(),
            state_store: None,
            snapshots: SnapshotSettings::default(),
            top: TopConfig::default(),
            top_query_timeout: Duration::from_secs(1),
        }
    }

    /// Bounds of the top-keys sketches ([`Node::top`]; default [`TopConfig::default`]).
    #[must_use]
    pub fn top_config(mut self, config: TopConfig) -> Self {
        self.top = config;
        self
    }

    /// How long [`Node::top`] waits for the other members' sketches (default 1 s); a member
    /// that does not answer in time is reported missing.
    #[must_use]
    pub fn top_query_timeout(mut self, limit: Duration) -> Self {
        self.top_query_timeout = limit;
        self
    }

    /// How peers authenticate each other (required).
    #[must_use]
    pub fn security(mut self, security: ClusterSecurity) -> Self {
        self.security = Some(security);
        self
    }

    /// The UDP address gossip listens on (port 0: a free port). Default `127.0.0.1:0`.
    #[must_use]
    pub fn gossip_addr(mut self, addr: SocketAddr) -> Self {
        self.gossip_addr = addr;
        self
    }

    /// The gossip address other members reach this node at, when it differs from the listen
    /// address (a wildcard listen address, NAT).
    #[must_use]
    pub fn gossip_advertise_addr(mut self, addr: SocketAddr) -> Self {
        self.gossip_advertise_addr = Some(addr);
        self
    }

    /// The UDP address QUIC listens on (port 0: a free port). Default `127.0.0.1:0`.
    #[must_use]
    pub fn quic_addr(mut self, addr: SocketAddr) -> Self {
        self.quic_addr = addr;
        self
    }

    /// The QUIC address other members reach this node at, when it differs from the listen address.
    #[must_use]
    pub fn quic_advertise_addr(mut self, addr: SocketAddr) -> Self {
        self.quic_advertise_addr = Some(addr);
        self
    }

    /// Gossip addresses of members to join through (any one live member suffices): socket
    /// addresses, or [`Seed`]s, which may be DNS names (`"ratemesh-peers:7946".parse()?`),
    /// resolved without the C library and re-resolved every [`NodeBuilder::seed_resolve_interval`]
    /// (see [`crate::seeds`]).
    #[must_use]
    pub fn seeds<S: Into<Seed>>(mut self, seeds: impl IntoIterator<Item = S>) -> Self {
        self.seeds.clear();
        self.seed_hosts.clear();
        for seed in seeds {
            match seed.into() {
                Seed::Addr(addr) => self.seeds.push(addr),
                Seed::Host(host) => self.seed_hosts.push(host),
            }
        }
        self
    }

    /// How often seeds given by name are resolved again once the node has a live peer (default
    /// 10 s; while it has none, sooner).
    #[must_use]
    pub fn seed_resolve_interval(mut self, interval: Duration) -> Self {
        self.seed_resolve_interval = interval;
        self
    }

    /// The cluster's name; gossip from another cluster is ignored. Default `ratemesh`.
    #[must_use]
    pub fn cluster_id(mut self, cluster_id: impl Into<String>) -> Self {
        self.cluster_id = cluster_id.into();
        self
    }

    /// Time between gossip rounds (default 200 ms). A crashed member is declared dead after
    /// about ten of them.
    #[must_use]
    pub fn gossip_interval(mut self, interval: Duration) -> Self {
        self.gossip_interval = interval;
        self
    }

    /// How long a dead member counts in the cluster's size before it is forgotten (default
    /// 120 s). While it counts, every node enforces `live / (live + dead)` of each limit, which
    /// keeps the sides of a partition near one limit; after, the survivors enforce all of it.
    #[must_use]
    pub fn dead_member_forget(mut self, forget_after: Duration) -> Self {
        self.dead_member_forget = forget_after;
        self
    }

    /// Bounds on what authenticated gossip may carry and make the gossip state grow to (see
    /// [`GossipLimits`]; the defaults suit clusters of up to a few hundred members).
    #[must_use]
    pub fn gossip_limits(mut self, limits: GossipLimits) -> Self {
        self.gossip_limits = limits;
        self
    }

    /// The longest a graceful shutdown waits for its handoff to be acknowledged (default 2 s).
    #[must_use]
    pub fn leave_linger(mut self, linger: Duration) -> Self {
        self.leave_linger = linger;
        self
    }

    /// How often approximate-mode nodes sync with owners (default 50 ms).
    #[must_use]
    pub fn sync_interval(mut self, interval: Duration) -> Self {
        self.core.sync_interval = interval;
        self
    }

    /// The protocol's timings and bounds (key table size, batch lengths, timeouts). The
    /// library's default differs from the core's in one field: `forward_wait` is zero, because
    /// the driver batches forwarded checks by scheduling instead of by a timer.
    #[must_use]
    pub fn node_config(mut self, config: NodeConfig) -> Self {
        self.core = config;
        self
    }

    /// The peer transport's bounds and timings.
    #[must_use]
    pub fn transport_config(mut self, config: TransportConfig) -> Self {
        self.transport = config;
        self
    }

    /// This run's incarnation; must grow with every restart of the member. Default: the Unix
    /// time in microseconds.
    #[must_use]
    pub fn incarnation(mut self, incarnation: u64) -> Self {
        self.incarnation = Some(incarnation);
        self
    }

    /// The seed of the node's randomness (grant jitter, key-table probing). Default: derived
    /// from the node id and incarnation.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Keeps durable quotas in the data directory `dir` (a [`FileStateStore`]): see
    /// [`NodeBuilder::state_store`].
    #[must_use]
    pub fn data_dir(self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.state_store(Arc::new(FileStateStore::new(dir)))
    }

    /// Keeps durable quotas in `store`: the node takes back the snapshot stored there when it
    /// starts (joined conservatively into the cluster's state; a corrupt or foreign snapshot is
    /// refused and logged), writes a new one every snapshot interval and a last one when it
    /// shuts down, after handing its keys over. Off by default: without a store nothing is
    /// written and a restart of the whole cluster starts every key fresh.
    #[must_use]
    pub fn state_store(mut self, store: Arc<dyn StateStore>) -> Self {
        self.state_store = Some(store);
        self
    }

    /// When and what to snapshot (default: every 5 s, limits of a minute or longer, at most
    /// 256 MiB). Only used with a [`NodeBuilder::state_store`].
    #[must_use]
    pub fn snapshot_settings(mut self, settings: SnapshotSettings) -> Self {
        self.snapshots = settings;
        self
    }

    /// Opens the sockets, joins the cluster through the seeds and starts the node's tasks on the
    /// current tokio runtime. Returns once the node answers checks (alone until members are
    /// confirmed; see [`Node::subscribe_members`]).
    pub async fn start(self) -> Result<Node, StartError> {
        let security = self.security.clone().ok_or(StartError::NoSecurity)?;
        self.validate()?;
        let incarnation = self.incarnation.unwrap_or_else(unix_micros);
        let seed = self.seed.unwrap_or(incarnation ^ self.id.0.rotate_left(32));
        let (transport, received) =
            Transport::bind(self.quic_addr, &security, self.id, self.transport.clone())?;
        let quic_addr = self.quic_advertise_addr.unwrap_or_else(|| transport.local_addr());
        let counters = Arc::new(GossipCounters::default());
        let (gossip, starter) = match self.spawn_gossip(&security, incarnation, quic_addr, &counters).await {
            Ok(gossip) => gossip,
            Err(error) => {
                transport.close().await;
                return Err(error);
            }
        };
        let (gossip_state, gossip_state_rx) = watch::channel(gossip.chitchat());
        let (gossip_health, gossip_health_rx) = watch::channel(GossipHealth::Running);
        let durable = self.persistence(&security)?;
        let origin = Origin::start();
        let mut core =
            ratemesh_core::Node::new(self.id, incarnation, self.core_config(), seed, origin.now_instant())?;
        if let Some(durable) = &durable {
            restore(&mut core, durable, origin.now_instant()).await;
        }
        let me = Member { id: self.id, quic_addr, status: MemberStatus::Live };
        let (members_tx, members_rx) = watch::channel(vec![me]);
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            id: self.id,
            origin,
            state: Mutex::new(State {
                core,
                waiters: HashMap::new(),
                next_request: 0,
                addrs: HashMap::new(),
                timer_at: None,
                timer_lag: Duration::ZERO,
                leaving: false,
                left: false,
                view: MemberView { live: vec![self.id], dead: Vec::new() },
            }),
            timer_wake: Notify::new(),
            left: Notify::new(),
            transport,
            gossip_addr: gossip.chitchat_id().gossip_advertise_addr,
            quic_addr,
            members: members_rx,
            stop: stop_tx,
            gossip: Arc::new(Mutex::new(Some(gossip))),
            gossip_health: gossip_health_rx,
            gossip_counters: counters,
            tasks: Mutex::new(Vec::new()),
            leave_linger: self.leave_linger,
            gossip_interval: self.gossip_interval,
            durable,
            final_snapshot: std::sync::atomic::AtomicBool::new(false),
            top: Arc::new(TopTable::new(self.top.clone())),
            top_query_timeout: self.top_query_timeout,
        });
        shared.transport.set_query_handler(top_query_handler(Arc::clone(&shared.top), origin));
        let slot =
            GossipSlot { handle: Arc::clone(&shared.gossip), state: gossip_state, health: gossip_health };
        shared.spawn_tasks(received, me, members_tx, stop_rx, gossip_state_rx);
        shared.spawn_gossip_supervisor(starter, slot, incarnation);
        self.spawn_seed_resolution(&shared);
        info!(node = ?self.id, %quic_addr, gossip = %shared.gossip_addr, incarnation, "node started");
        Ok(Node { shared })
    }

    /// The core's configuration: a node that joins through seeds takes no checks for a few gossip
    /// rounds (unless set), while the members learn of it and stop routing its keys elsewhere.
    fn core_config(&self) -> NodeConfig {
        let mut config = self.core.clone();
        if config.join_grace.is_zero() && !self.seeds.is_empty() {
            config.join_grace = self.gossip_interval * (LEAVE_GOSSIP_ROUNDS_MIN + 1);
        }
        config
    }

    /// Refuses settings that would make a timer spin (zero durations) or a node unreachable (a
    /// wildcard address gossiped as is).
    fn validate(&self) -> Result<(), StartError> {
        let durations = [
            ("snapshot_interval", self.snapshots.interval),
            ("gossip_interval", self.gossip_interval),
            ("seed_resolve_interval", self.seed_resolve_interval),
            ("top_config.half_window", self.top.half_window),
            ("top_query_timeout", self.top_query_timeout),
        ];
        if let Some((field, _)) = durations.iter().find(|(_, duration)| duration.is_zero()) {
            return Err(StartError::Config { field, reason: "must be longer than zero" });
        }
        self.core_config().validate()?;
        if self.gossip_addr.ip().is_unspecified() && self.gossip_advertise_addr.is_none() {
            return Err(StartError::Config {
                field: "gossip_advertise_addr",
                reason: "required when gossip listens on a wildcard address",
            });
        }
        let nodes_max = self.gossip_limits.nodes_max;
        if nodes_max == 0 || nodes_max > GossipLimits::NODES_MAX_MAX {
            return Err(StartError::Config {
                field: "gossip_limits.nodes_max",
                reason: "must be at least 1 and at most GossipLimits::NODES_MAX_MAX (800)",
            });
        }
        if self.quic_addr.ip().is_unspecified() && self.quic_advertise_addr.is_none() {
            return Err(StartError::Config {
                field: "quic_advertise_addr",
                reason: "required when QUIC listens on a wildcard address",
            });
        }
        Ok(())
    }

    /// Seeds given by name are resolved by a task of their own (`crate::seeds`).
    fn spawn_seed_resolution(&self, shared: &Arc<Shared>) {
        let resolution = SeedResolution {
            hosts: self.seed_hosts.clone(),
            own_addr: shared.gossip_addr,
            resolve_interval: self.seed_resolve_interval,
            gossip_interval: self.gossip_interval,
        };
        let sink: Arc<dyn SeedSink> = shared.clone();
        if let Some(task) = crate::seeds::spawn(resolution, sink, shared.stop.subscribe()) {
            shared.tasks.lock().unwrap_or_else(PoisonError::into_inner).push(task);
        }
    }

    /// The snapshot machinery, if a store is set, bound to this cluster (its id and CA).
    fn persistence(&self, security: &ClusterSecurity) -> Result<Option<Arc<Persistence>>, StartError> {
        let Some(store) = self.state_store.clone() else { return Ok(None) };
        let identity = security.identity(self.id)?;
        let ca_certs: Vec<&[u8]> = identity.ca_certs().iter().map(|cert| cert.as_ref()).collect();
        let cluster = cluster_fingerprint(&self.cluster_id, &ca_certs);
        Ok(Some(Arc::new(Persistence::new(store, cluster, self.id.0, self.snapshots))))
    }

    /// Starts gossip (sealed with the keys of `security`) from the gossip address, choosing a
    /// free port if it is 0; returns the handle and what restarts it.
    async fn spawn_gossip(
        &self,
        security: &ClusterSecurity,
        incarnation: u64,
        quic_addr: SocketAddr,
        counters: &Arc<GossipCounters>,
    ) -> Result<(ChitchatHandle, GossipStarter), StartError> {
        let attempts = if self.gossip_addr.port() == 0 { GOSSIP_BIND_ATTEMPTS_MAX } else { 1 };
        let mut last_error = String::new();
        for _ in 0..attempts {
            let listen_addr = if self.gossip_addr.port() == 0 {
                free_udp_port(self.gossip_addr).map_err(|error| StartError::Gossip {
                    addr: self.gossip_addr,
                    reason: error.to_string(),
                })?
            } else {
                self.gossip_addr
            };
            let seal = SealConfig {
                keys: gossip_keys(security, &self.cluster_id)?,
                limits: self.gossip_limits,
                counters: Arc::clone(counters),
                advertise: self.gossip_advertise_addr.unwrap_or(listen_addr),
            };
            let starter = GossipStarter {
                node: self.id,
                listen_addr,
                cluster_id: self.cluster_id.clone(),
                seeds: self.seeds.clone(),
                gossip_interval: self.gossip_interval,
                dead_member_forget: self.dead_member_forget,
                seal: Arc::new(seal),
            };
            let key_values = vec![
                (KEY_QUIC_ADDR.to_owned(), quic_addr.to_string()),
                (KEY_PROTOCOL.to_owned(), WIRE_VERSION.to_string()),
            ];
            match starter.spawn(incarnation, key_values).await {
                Ok(handle) => return Ok((handle, starter)),
                Err(error) => last_error = format!("{error:#}"),
            }
        }
        Err(StartError::Gossip { addr: self.gossip_addr, reason: last_error })
    }
}

/// A running ratemesh node. Cheap to clone; every clone is the same node.
///
/// # Example
///
/// Two nodes of one cluster on loopback, a token bucket of 10 per second shared by both:
///
/// ```
/// use std::time::Duration;
/// use ratemesh::{ClusterSecurity, NamedPolicy, NodeBuilder, NodeId, MemberStatus};
/// use ratemesh_core::{Algorithm, Fallback, Limit, LimitSpec, Mode, Policy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let security = ClusterSecurity::from_secret("an example secret, shared by every node")?;
/// let first = NodeBuilder::new(NodeId(1)).security(security.clone()).start().await?;
/// let second = NodeBuilder::new(NodeId(2))
///     .security(security)
///     .seeds([first.gossip_addr()])
///     .start()
///     .await?;
/// let mut members = second.subscribe_members();
/// tokio::time::timeout(Duration::from_secs(30), members.wait_for(|members| {
///     members.iter().filter(|m| m.status == MemberStatus::Live).count() == 2
/// }))
/// .await??;
/// // A node that joins through seeds takes checks after a few gossip rounds (its join grace),
/// // once the other members route its keys to it.
/// second.wait_serving().await;
///
/// let limit = Limit::new(LimitSpec::new(Algorithm::TokenBucket, 10, Duration::from_secs(1)))?;
/// let policy = NamedPolicy::new("api", Policy { limit, mode: Mode::Exact, fallback: Fallback::LocalShare });
/// let decision = second.check(&policy, b"client-42", 1).await?;
/// assert!(decision.allowed);
/// assert_eq!(decision.limit, 10);
///
/// second.shutdown().await;
/// first.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Node {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.shared.id)
            .field("quic_addr", &self.shared.quic_addr)
            .finish()
    }
}

/// Counters and gauges of a node, for metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeMetrics {
    /// The protocol's counters (decisions by path, forwards, reports, grants, handoffs, delivery).
    pub protocol: NodeStats,
    /// The key table's counters (evictions, expirations).
    pub store: StoreStats,
    /// The peer transport's counters.
    pub transport: TransportStats,
    /// The gossip transport's counters (authentication failures, refusals, restarts).
    pub gossip: GossipStats,
    /// Keys tracked (owned and followed).
    pub keys: usize,
    /// Members in the ring (this node included).
    pub members_live: usize,
    /// Members counted as dead.
    pub members_dead: usize,
    /// Gossip members not confirmed by mutual TLS.
    pub members_unverified: usize,
    /// Checks waiting for their owner's answer.
    pub checks_waiting: usize,
    /// How late the node ran its last due timers (sync rounds, retransmissions, forward
    /// flushes) after their deadline: the sync lag of an overloaded node.
    pub sync_lag: Duration,
    /// The smoothed round-trip time to each peer measured so far, sorted by peer.
    pub peer_round_trips: Vec<(NodeId, Duration)>,
    /// Durable quotas: snapshots written and the result of the load at start.
    pub snapshots: SnapshotMetrics,
}

struct Shared {
    id: NodeId,
    origin: Origin,
    state: Mutex<State>,
    /// The core's next deadline moved earlier than the one the timer task sleeps until.
    timer_wake: Notify,
    /// The core's leave is complete (the shutdown waits for it).
    left: Notify,
    transport: Transport,
    gossip_addr: SocketAddr,
    quic_addr: SocketAddr,
    members: watch::Receiver<Vec<Member>>,
    stop: watch::Sender<bool>,
    /// The running gossip instance (replaced by the supervisor when it ends; taken at stop).
    gossip: Arc<Mutex<Option<ChitchatHandle>>>,
    gossip_health: watch::Receiver<GossipHealth>,
    gossip_counters: Arc<GossipCounters>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    leave_linger: Duration,
    gossip_interval: Duration,
    /// Durable quotas, when a state store is set.
    durable: Option<Arc<Persistence>>,
    /// The final snapshot was taken (a second shutdown does not take another).
    final_snapshot: std::sync::atomic::AtomicBool,
    /// Top keys per policy (its own lock: recording never holds the core's).
    top: Arc<TopTable>,
    top_query_timeout: Duration,
}

/// Everything behind the node's lock.
struct State {
    core: ratemesh_core::Node,
    /// Checks waiting for a decision from their owner.
    waiters: HashMap<RequestId, oneshot::Sender<Decision>>,
    next_request: u64,
    /// QUIC addresses of the members in the view (confirmed by mutual TLS), and of members that
    /// left it (bounded): a leaving member awaits acknowledgements of its handoff from this node.
    addrs: HashMap<NodeId, SocketAddr>,
    /// The deadline the timer task sleeps until.
    timer_at: Option<ratemesh_core::Instant>,
    /// How late the timer task ran the core's last due timers (sync rounds among them).
    timer_lag: Duration,
    /// Shutdown began (or a node task ended): no more client checks.
    leaving: bool,
    /// The core's leave is complete.
    left: bool,
    view: MemberView,
}

impl Node {
    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.shared.id
    }

    /// The gossip address other members can use as a seed.
    pub fn gossip_addr(&self) -> SocketAddr {
        self.shared.gossip_addr
    }

    /// The QUIC address peers reach this node at.
    pub fn quic_addr(&self) -> SocketAddr {
        self.shared.quic_addr
    }

    /// Checks `cost` hits (0: a query) of `key` under `policy`. Decided locally in approximate
    /// mode (waits only when the local allowance ran dry and the owner may have more); forwarded
    /// to the key's owner in exact mode. Never waits much longer than `NodeConfig::forward_timeout`:
    /// then the fallback decides.
    ///
    /// The check is counted in the policy's top-keys sketches ([`Node::top`]) under its name.
    pub async fn check(&self, policy: &NamedPolicy, key: &[u8], cost: u64) -> Result<Decision, CheckError> {
        let label = TopLabel { policy: policy.name(), key };
        self.check_labelled(&policy.policy, policy.key(key), cost, label).await
    }

    /// [`Node::check_hashed`], counted in the top-keys sketches ([`Node::top`]) of
    /// `label.policy` under `label.key` (for callers that name buckets by hash but want to see
    /// who is limited, like the daemon).
    pub async fn check_labelled(
        &self,
        policy: &Arc<Policy>,
        key: KeyHash,
        cost: u64,
        label: TopLabel<'_>,
    ) -> Result<Decision, CheckError> {
        let decision = self.check_hashed(policy, key, cost).await?;
        self.record_top(label, cost, &decision);
        Ok(decision)
    }

    fn record_top(&self, label: TopLabel<'_>, cost: u64, decision: &Decision) {
        self.shared.top.record(self.shared.now(), label.policy, label.key, cost, !decision.allowed);
    }

    /// [`Node::check`] of a bucket named by its hash (for callers that keep their own key
    /// namespaces, like the daemon).
    pub async fn check_hashed(
        &self,
        policy: &Arc<Policy>,
        key: KeyHash,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        self.decide_with(|core, id, now| {
            core.handle_check(now, CheckRequest { id, key, policy: policy.clone(), cost })
        })
        .await
    }

    /// Runs one client input (`input` hands it to the core under the lock, with a fresh request
    /// id and the node's `now`) and waits for its decision when the core answers later.
    pub(crate) async fn decide_with(
        &self,
        input: impl FnOnce(&mut ratemesh_core::Node, RequestId, ratemesh_core::Instant) -> CheckOutcome,
    ) -> Result<Decision, CheckError> {
        let waiter = {
            let mut state = self.shared.lock_state();
            if state.leaving {
                return Err(CheckError::ShutDown);
            }
            let now = self.shared.now();
            let id = RequestId(state.next_request);
            state.next_request = state.next_request.wrapping_add(1);
            let outcome = input(&mut state.core, id, now);
            let waiter = match outcome {
                CheckOutcome::Decided(decision) => Err(Ok(decision)),
                CheckOutcome::Unavailable => Err(Err(CheckError::Joining)),
                CheckOutcome::Pending => {
                    let (tx, rx) = oneshot::channel();
                    state.waiters.insert(id, tx);
                    Ok(rx)
                }
            };
            self.shared.after_input(&mut state);
            waiter
        };
        match waiter {
            Err(answer) => answer,
            // The core decides every pending check by its deadline (by the fallback if the owner is
            // silent); the channel closes without a decision only when the node shuts down.
            Ok(rx) => rx.await.map_err(|_| CheckError::ShutDown),
        }
    }

    /// Like [`Node::check`] but never waits: for approximate-mode policies on a synchronous hot
    /// path. A check only the owner can decide — an exact-mode key owned elsewhere, or an
    /// approximate-mode key this node holds no allowance of (a key whose share per node is a few
    /// hits or less is decided by its owner) — is [`CheckError::WouldWait`].
    pub fn check_now(&self, policy: &NamedPolicy, key: &[u8], cost: u64) -> Result<Decision, CheckError> {
        let mut state = self.shared.lock_state();
        if state.leaving {
            return Err(CheckError::ShutDown);
        }
        let now = self.shared.now();
        let request = CheckRequest {
            id: RequestId(u64::MAX),
            key: policy.key(key),
            policy: policy.policy.clone(),
            cost,
        };
        let decision = match state.core.handle_check_now(now, &request) {
            Some(decision) => Ok(decision),
            None if !state.core.is_serving(now) => Err(CheckError::Joining),
            None => Err(CheckError::WouldWait),
        };
        self.shared.after_input(&mut state);
        drop(state);
        if let Ok(decision) = &decision {
            self.record_top(TopLabel { policy: policy.name(), key }, cost, decision);
        }
        decision
    }

    /// Releases a concurrency lease taken by an admitted check (sent to the key's owner when it
    /// is another node; a lease that is never released expires after the policy's period).
    pub fn release(&self, policy: &NamedPolicy, key: &[u8], lease: LeaseId) -> Result<Released, CheckError> {
        self.release_hashed(&policy.policy, policy.key(key), lease)
    }

    /// [`Node::release`] of a bucket named by its hash.
    pub fn release_hashed(
        &self,
        policy: &Policy,
        key: KeyHash,
        lease: LeaseId,
    ) -> Result<Released, CheckError> {
        let mut state = self.shared.lock_state();
        if state.leaving {
            return Err(CheckError::ShutDown);
        }
        let now = self.shared.now();
        let owner = state.core.owner_of(key).unwrap_or(self.shared.id);
        let ended = state.core.handle_release(now, key, policy, lease);
        self.shared.after_input(&mut state);
        Ok(match (owner == self.shared.id, ended) {
            (false, _) => Released::SentToOwner(owner),
            (true, true) => Released::Ended,
            (true, false) => Released::NotHeld,
        })
    }

    /// Whether the node takes checks: not while it joins (its first few gossip rounds) or leaves.
    pub fn is_serving(&self) -> bool {
        let state = self.shared.lock_state();
        !state.leaving && state.core.is_serving(self.shared.now())
    }

    /// Waits until the node's join grace has passed (at once for a node started without seeds).
    /// A node that is leaving never serves again: this returns at once and checks fail.
    pub async fn wait_serving(&self) {
        let until = self.shared.lock_state().core.joining_until();
        tokio::time::sleep_until(self.shared.tokio_instant(until)).await;
    }

    /// The members this node knows, itself included, sorted by id.
    pub fn members(&self) -> Vec<Member> {
        self.shared.members.borrow().clone()
    }

    /// The members, as a watch channel that changes with them: wait on it (with a timeout) for
    /// the cluster to form.
    pub fn subscribe_members(&self) -> watch::Receiver<Vec<Member>> {
        self.shared.members.clone()
    }

    /// The owner of `key` under `policy` in this node's current ring.
    pub fn owner_of(&self, policy: &NamedPolicy, key: &[u8]) -> Option<NodeId> {
        self.owner_of_hashed(policy.key(key))
    }

    /// The owner of a bucket named by its hash in this node's current ring.
    pub fn owner_of_hashed(&self, key: KeyHash) -> Option<NodeId> {
        self.shared.lock_state().core.owner_of(key)
    }

    /// The owners of many buckets at once, in the order of `keys`, all from one view of the ring:
    /// the node's lock is taken once (probing the ring's balance with thousands of keys would
    /// otherwise contend with checks once per key).
    pub fn owners_of_hashed(&self, keys: &[KeyHash]) -> Vec<Option<NodeId>> {
        let state = self.shared.lock_state();
        keys.iter().map(|&key| state.core.owner_of(key)).collect()
    }

    /// Publishes `values` in this node's gossip state under `prefix` (keys `prefix0`, `prefix1`,
    /// …): every member reads them within a few gossip rounds ([`Node::shared_values`]). Keys of
    /// an earlier, longer publication are set empty (ratemesh gossips no deletions). Gossip is
    /// sealed: a value is authenticated as the cluster's, not as one member's. Refused (nothing
    /// published) for a prefix outside `app.`, more than [`SHARED_VALUES_MAX`] values or a value
    /// over [`SHARED_VALUE_BYTES_MAX`] bytes.
    pub async fn publish_shared_values(
        &self,
        prefix: &str,
        values: &[String],
    ) -> Result<(), SharedValuesError> {
        if !prefix.starts_with("app.") || prefix.len() > 64 {
            return Err(SharedValuesError::Prefix);
        }
        if values.len() > SHARED_VALUES_MAX {
            return Err(SharedValuesError::TooMany { len: values.len() });
        }
        if let Some(value) = values.iter().find(|v| v.len() > SHARED_VALUE_BYTES_MAX) {
            return Err(SharedValuesError::TooLong { len: value.len() });
        }
        let Some(chitchat) = self.shared.chitchat() else { return Err(SharedValuesError::NotRunning) };
        let mut chitchat = chitchat.lock().await;
        let state = chitchat.self_node_state();
        for slot in 0..SHARED_VALUES_MAX {
            let key = format!("{prefix}{slot}");
            match values.get(slot) {
                Some(value) => state.set(key, value.clone()),
                None if state.get(&key).is_some_and(|v| !v.is_empty()) => state.set(key, String::new()),
                None => {}
            }
        }
        Ok(())
    }

    /// The non-empty values published under `prefix` by every member gossip knows (this node
    /// included; earlier runs of restarted members too, until gossip forgets them), by member.
    pub async fn shared_values(&self, prefix: &str) -> Vec<(NodeId, Vec<String>)> {
        let Some(chitchat) = self.shared.chitchat() else { return Vec::new() };
        let chitchat = chitchat.lock().await;
        let mut found = Vec::new();
        for (id, state) in chitchat.node_states() {
            let Some(node) = crate::membership::parse_node_id(&id.node_id) else { continue };
            let values: Vec<String> = (0..SHARED_VALUES_MAX)
                .filter_map(|slot| state.get(&format!("{prefix}{slot}")))
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
                .collect();
            if !values.is_empty() {
                found.push((node, values));
            }
        }
        found
    }

    /// Whether gossip runs, or was restarted after it ended (the daemon is not ready then).
    pub fn gossip_health(&self) -> GossipHealth {
        self.shared.gossip_health.borrow().clone()
    }

    /// The `n` heaviest keys of `policy` by `by` over the last minute at most, cluster-wide: this
    /// node's sketches merged with every other live member's, asked over the peer transport
    /// (mutual TLS) at once and waited for at most the top query timeout. A member that does not
    /// answer in time, cannot be reached or answers garbage is listed in
    /// [`TopReport::missing`]; the answer then covers the others. See [`crate::top`] for the
    /// bound of the estimates.
    pub async fn top(&self, policy: &str, by: TopBy, n: usize) -> TopReport {
        let (mut summaries, mut window) = self.shared.top.summaries(self.shared.now(), policy, by);
        let question = encode_message(&TopQuestion { policy: policy.to_owned(), by });
        let mut asked = tokio::task::JoinSet::new();
        for member in self.members() {
            if member.id == self.shared.id || member.status != MemberStatus::Live {
                continue;
            }
            let (transport, question) = (self.shared.transport.clone(), question.clone());
            let limit = self.shared.top_query_timeout;
            asked.spawn(async move {
                let answer = transport.query(member.id, member.quic_addr, &question, limit).await;
                let reply = answer
                    .map_err(|e| e.to_string())
                    .and_then(|bytes| decode_reply(&bytes).map_err(|e| e.to_string()));
                (member.id, reply)
            });
        }
        let mut answered = vec![self.shared.id];
        let mut missing = Vec::new();
        while let Some(joined) = asked.join_next().await {
            // A query task only panics on a bug; its member then counts as missing.
            let Ok((member, reply)) = joined else { continue };
            match reply {
                Ok(reply) => {
                    window = window.max(Duration::from_nanos(reply.window_nanos));
                    summaries.extend(reply.summaries);
                    answered.push(member);
                }
                Err(reason) => missing.push(MissingMember { id: member, reason }),
            }
        }
        answered.sort_unstable();
        missing.sort_unstable_by_key(|m| m.id);
        TopReport { answer: merge(&summaries, n, window), answered, missing }
    }

    /// This node's own sketches of `policy` (what it answers other members): its summaries and
    /// the span they cover.
    pub fn top_local(&self, policy: &str, by: TopBy) -> (Vec<TopSummary>, Duration) {
        self.shared.top.summaries(self.shared.now(), policy, by)
    }

    /// The bounds of the top-keys sketches.
    pub fn top_config(&self) -> &TopConfig {
        self.shared.top.config()
    }

    /// Heap bytes held by this node's top-keys sketches, and checks not recorded because
    /// `TopConfig::policies_max` policies are recorded already.
    pub fn top_memory(&self) -> (usize, u64) {
        (self.shared.top.heap_bytes(), self.shared.top.unrecorded())
    }

    /// Counters and gauges, for metrics.
    pub fn metrics(&self) -> NodeMetrics {
        let state = self.shared.lock_state();
        let members = self.shared.members.borrow();
        let count = |status: MemberStatus| members.iter().filter(|m| m.status == status).count();
        NodeMetrics {
            protocol: state.core.stats(),
            store: state.core.store_stats(),
            transport: self.shared.transport.stats(),
            gossip: self.shared.gossip_counters.stats(),
            keys: state.core.keys_len(),
            members_live: count(MemberStatus::Live),
            members_dead: count(MemberStatus::Dead),
            members_unverified: count(MemberStatus::Unverified),
            checks_waiting: state.waiters.len(),
            sync_lag: state.timer_lag,
            peer_round_trips: state.core.round_trips(),
            snapshots: self.shared.durable.as_ref().map_or_else(
                || SnapshotMetrics { load_result: "disabled", ..SnapshotMetrics::default() },
                |durable| durable.metrics(),
            ),
        }
    }

    /// Leaves the cluster gracefully (the core's leave: `ratemesh_core::Node::handle_leave`):
    /// refuses new checks ([`CheckError::ShutDown`]), announces the leave in gossip, keeps owning
    /// and answering its keys for the few gossip rounds peers need to learn of it, hands every
    /// owned key to its new owner, waits until the handoff is acknowledged (at most the leave
    /// linger), and stops the node. Checks still waiting for an owner then fail with
    /// [`CheckError::ShutDown`]. Idempotent: a second call returns when the first is done.
    ///
    /// A `Node` whose handles are all dropped without `shutdown` keeps running (its tasks hold
    /// it) until the runtime stops: call `shutdown` to leave.
    pub async fn shutdown(&self) {
        let span = info_span!("shutdown", node = ?self.shared.id);
        self.leave().instrument(span.clone()).await;
        self.shared.save_final_snapshot().instrument(span).await;
    }

    async fn leave(&self) {
        let Some(own_for) = self.shared.announce_leave().await else {
            // Another shutdown is under way: return when it is done.
            let _ = self.shared.stop.subscribe().wait_for(|stopped| *stopped).await;
            return;
        };
        let plan = LeavePlan { own_for, drain_for: self.shared.leave_linger };
        let left = self.shared.left.notified();
        {
            let mut state = self.shared.lock_state();
            let now = self.shared.now();
            state.core.handle_leave(now, plan);
            self.shared.after_input(&mut state);
        }
        // The core emits `Left` by its own deadline (owning, then the drain bound); the timeout
        // only guards against a stopped timer task.
        let bound = own_for + self.shared.leave_linger + self.shared.gossip_interval;
        let already_left = self.shared.lock_state().left;
        if !already_left {
            let _ = tokio::time::timeout(bound, left).await;
        }
        {
            let state = self.shared.lock_state();
            info!(
                handoffs = state.core.stats().handoffs_sent,
                unacked = state.core.unacked_frames(),
                "leaving: keys handed over and acknowledged (or drain bound reached)"
            );
        }
        self.shared.stop().await;
    }
}

impl Shared {
    fn now(&self) -> ratemesh_core::Instant {
        self.origin.now_instant()
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the core half-updated in a way that matters
        // more than stopping every check: keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Carries out what the core asked for after an input: frames to send, decisions to hand to
    /// waiting checks, and a timer to move earlier.
    fn after_input(&self, state: &mut State) {
        while let Some(transmit) = state.core.poll_transmit() {
            if let Some(&addr) = state.addrs.get(&transmit.to) {
                // A dropped frame is counted by the transport and retransmitted by the core.
                let _ = self.transport.send(transmit.to, addr, transmit.bytes);
            }
        }
        while let Some(event) = state.core.poll_event() {
            match event {
                Event::Decided { id, decision } => {
                    if let Some(waiter) = state.waiters.remove(&id) {
                        // The check's caller may have gone away (its future dropped): nothing to do.
                        let _ = waiter.send(decision);
                    }
                }
                Event::Left => {
                    state.left = true;
                    self.left.notify_waiters();
                }
            }
        }
        let next = state.core.poll_timeout();
        if next.is_some() && (state.timer_at.is_none() || next < state.timer_at) {
            state.timer_at = next;
            self.timer_wake.notify_one();
        }
    }

    fn spawn_tasks(
        self: &Arc<Self>,
        received: tokio::sync::mpsc::Receiver<Received>,
        me: Member,
        members: watch::Sender<Vec<Member>>,
        stop: watch::Receiver<bool>,
        gossip: watch::Receiver<Arc<tokio::sync::Mutex<chitchat::Chitchat>>>,
    ) {
        let mut tasks = Vec::with_capacity(3);
        tasks.push(tokio::spawn(self.clone().run_timer(stop.clone())));
        tasks.push(tokio::spawn(self.clone().run_receive(received, stop.clone())));
        if let Some(durable) = self.durable.clone() {
            tasks.push(tokio::spawn(self.clone().run_snapshots(durable, stop.clone())));
        }
        let membership = Membership::new(me, self.transport.clone(), gossip);
        let sink: Arc<dyn ViewSink> = self.clone();
        tasks.push(tokio::spawn(membership.run(sink, members, self.gossip_interval * 5, stop)));
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner).extend(tasks);
    }

    /// Restarts gossip whenever it ends while the node runs (see [`supervise`]).
    fn spawn_gossip_supervisor(&self, starter: GossipStarter, slot: GossipSlot, generation: u64) {
        let task = tokio::spawn(supervise(starter, slot, generation, self.stop.subscribe()));
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner).push(task);
    }

    async fn run_timer(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let _guard = TaskGuard(self.clone());
        loop {
            let deadline = {
                let mut state = self.lock_state();
                let next = state.core.poll_timeout();
                state.timer_at = next;
                next
            };
            let sleep_until = deadline.map(|at| self.tokio_instant(at));
            tokio::select! {
                () = sleep_or_forever(sleep_until) => {}
                () = self.timer_wake.notified() => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            let mut state = self.lock_state();
            let now = self.now();
            if let Some(due) = state.core.poll_timeout().filter(|&at| at <= now) {
                let _span = trace_span!("timers", node = ?self.id).entered();
                state.timer_lag = Duration::from_nanos(now.nanos_since(due));
                state.core.handle_timeout(now);
                self.after_input(&mut state);
            }
        }
    }

    async fn run_receive(
        self: Arc<Self>,
        mut received: tokio::sync::mpsc::Receiver<Received>,
        mut stop: watch::Receiver<bool>,
    ) {
        let _guard = TaskGuard(self.clone());
        loop {
            let first = tokio::select! {
                frame = received.recv() => match frame { Some(frame) => frame, None => return },
                _ = stop.wait_for(|stopped| *stopped) => return,
            };
            let mut state = self.lock_state();
            let now = self.now();
            state.core.handle_frame(now, first.0, &first.1);
            for _ in 1..FRAMES_PER_TURN_MAX {
                let Ok((from, bytes)) = received.try_recv() else { break };
                state.core.handle_frame(now, from, &bytes);
            }
            self.after_input(&mut state);
        }
    }

    /// Refuses new client checks and announces the leave in gossip. Returns how long to keep
    /// owning while peers learn of it (a few gossip rounds, growing with the log of the cluster's
    /// size: epidemic dissemination), or `None` when a shutdown already began.
    /// The running chitchat instance, if any.
    fn chitchat(&self) -> Option<Arc<tokio::sync::Mutex<chitchat::Chitchat>>> {
        self.gossip.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(ChitchatHandle::chitchat)
    }

    async fn announce_leave(&self) -> Option<Duration> {
        let members = {
            let mut state = self.lock_state();
            if state.leaving {
                return None;
            }
            state.leaving = true;
            state.view.live.len() + state.view.dead.len()
        };
        let gossip =
            self.gossip.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(ChitchatHandle::chitchat);
        if let Some(chitchat) = gossip {
            chitchat.lock().await.self_node_state().set(KEY_LEAVING, "1");
        }
        Some(self.gossip_interval * (LEAVE_GOSSIP_ROUNDS_MIN + members.max(1).ilog2() + 1))
    }

    /// Stops the tasks, gossip and the transport.
    async fn stop(&self) {
        self.stop.send_replace(true);
        let gossip = self.gossip.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(gossip) = gossip
            && let Err(error) = gossip.shutdown().await
        {
            debug!(%error, "gossip stopped with an error");
        }
        self.transport.close().await;
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        for task in tasks {
            task.abort();
        }
        self.lock_state().waiters.clear();
    }

    /// Takes the core's durable state out under the lock and writes it (off the lock).
    async fn save_snapshot(&self, durable: &Arc<Persistence>) {
        let started = std::time::Instant::now();
        let keys = {
            let state = self.lock_state();
            state.core.durable_keys(self.now(), durable.settings().period_min)
        };
        durable.save(keys, started.elapsed(), started).await;
    }

    /// Writes a snapshot every snapshot interval until the node stops.
    async fn run_snapshots(self: Arc<Self>, durable: Arc<Persistence>, mut stop: watch::Receiver<bool>) {
        let mut ticks = tokio::time::interval(durable.settings().interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            self.save_snapshot(&durable).await;
        }
    }

    /// The last snapshot of a graceful shutdown: after the handover (what this node handed on
    /// is kept too, as a follower's view) and after the node stopped, so nothing changes after
    /// it. Once per node.
    async fn save_final_snapshot(&self) {
        let Some(durable) = &self.durable else { return };
        if self.final_snapshot.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        self.save_snapshot(durable).await;
        let written = durable.metrics();
        info!(keys = written.last_keys, bytes = written.last_bytes, "final snapshot written");
    }

    fn tokio_instant(&self, at: ratemesh_core::Instant) -> tokio::time::Instant {
        self.origin.tokio_instant(at)
    }
}

/// Held by the timer and receive tasks. Should one end while the node runs (a panic in the core,
/// or its runtime shutting down), nothing would flush, expire or answer forwarded checks any more:
/// the node then refuses checks, and those waiting fail at once instead of hanging.
struct TaskGuard(Arc<Shared>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if *self.0.stop.borrow() {
            return;
        }
        let mut state = self.0.lock_state();
        if !state.leaving {
            tracing::error!(node = ?self.0.id, "a node task ended while the node runs: refusing checks");
        }
        state.leaving = true;
        state.waiters.clear();
    }
}

impl ViewSink for Shared {
    fn apply(&self, view: &MemberView, addrs: &HashMap<NodeId, SocketAddr>) {
        let mut state = self.lock_state();
        if state.addrs.len() > DEPARTED_ADDRS_MAX {
            state.addrs.clear();
        }
        let live = addrs.iter().filter(|(id, _)| view.live.contains(id));
        state.addrs.extend(live.map(|(&id, &addr)| (id, addr)));
        state.view = view.clone();
        let now = self.now();
        let before = state.core.stats().handoffs_sent;
        state.core.handle_membership(now, view.clone());
        let moved = state.core.stats().handoffs_sent - before;
        info!(node = ?self.id, live = view.live.len(), dead = view.dead.len(), keys_handed_over = moved, "ownership moved");
        self.after_input(&mut state);
    }
}

impl SeedSink for Shared {
    fn gossip_with(&self, addr: SocketAddr) {
        let gossip = self.gossip.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(gossip) = gossip.as_ref() {
            // Fails only once chitchat has stopped: nothing to gossip with any more.
            let _ = gossip.gossip(addr);
        }
    }

    fn has_live_peer(&self) -> bool {
        self.members.borrow().iter().any(|m| m.id != self.id && m.status == MemberStatus::Live)
    }
}

/// Takes back the stored snapshot, if any, into a core that knows only itself: it owns every key
/// until the first membership view hands each one to its owner.
async fn restore(core: &mut ratemesh_core::Node, durable: &Arc<Persistence>, now: ratemesh_core::Instant) {
    if let Some((keys, age)) = durable.load().await {
        let stats = core.restore(now, keys, age);
        info!(joined = stats.joined, refused = stats.refused, "snapshot restored");
    }
}

/// The core's clock: monotonic, on Unix time. It reads the monotonic clock and counts from the
/// Unix time read once at start, so it never goes back (a wall-clock step after the start is not
/// followed; NTP's slewing is, as the monotonic clock follows it). Calendar windows are Unix
/// time: on this clock every node names a window with the same numbers, up to the skew of the
/// hosts' clocks at start.
#[derive(Clone, Copy, Debug)]
struct Origin {
    monotonic: std::time::Instant,
    unix_nanos: u64,
}

impl Origin {
    fn start() -> Origin {
        Origin { monotonic: std::time::Instant::now(), unix_nanos: crate::durable::unix_nanos_now() }
    }

    /// The core's now.
    fn now_instant(&self) -> ratemesh_core::Instant {
        let elapsed = u64::try_from(self.monotonic.elapsed().as_nanos()).unwrap_or(u64::MAX);
        ratemesh_core::Instant::from_nanos(self.unix_nanos.saturating_add(elapsed))
    }

    /// The tokio instant of the core's instant `at`.
    fn tokio_instant(&self, at: ratemesh_core::Instant) -> tokio::time::Instant {
        let since_start = Duration::from_nanos(at.as_nanos().saturating_sub(self.unix_nanos));
        tokio::time::Instant::from_std(self.monotonic + since_start)
    }
}

async fn sleep_or_forever(until: Option<tokio::time::Instant>) {
    match until {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn unix_micros() -> u64 {
    let since_epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX)
}

/// A free UDP port on `addr`'s IP (chitchat binds by address, so the port must be known first).
fn free_udp_port(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    std::net::UdpSocket::bind(addr)?.local_addr()
}
