//! [`NodeBuilder`]: a node's settings, their validation, and the start (transport, gossip,
//! durable state, the tasks).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::time::{Duration, SystemTime};

use chitchat::ChitchatHandle;
use ratemesh_core::{MemberView, NodeConfig, NodeId, RegionFallback};
use tokio::sync::{Notify, mpsc, watch};
use tracing::info;

use super::driver::restore;
use super::queries::query_handler;
use super::{
    GOSSIP_BIND_ATTEMPTS_MAX, LANE_SEED_STEP, LANES_MAX, Lane, Node, Origin, Shared, StartError, State,
    protocol_tag,
};
use crate::defaults;
use crate::durable::{FileStateStore, Persistence, SnapshotSettings, StateStore, cluster_fingerprint};
use crate::gossip::{
    GossipCounters, GossipHealth, GossipLimits, GossipSlot, GossipStarter, SealConfig, gossip_keys,
};
use crate::membership::{KEY_PROTOCOL, KEY_QUIC_ADDR, KEY_REGION, Member, MemberStatus};
use crate::region::Region;
use crate::security::ClusterSecurity;
use crate::seeds::{Seed, SeedHost, SeedResolution, SeedSink};
use crate::sync::Mutex;
use crate::top::{TopConfig, TopShard, TopTable};
use crate::transport::{MemoryNetwork, PeerTransport, QuicTransport, Received, TransportConfig};

/// Milliseconds as a duration (the defaults are in milliseconds).
const fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// Configures and starts a [`Node`]. Every setting but the node id and security has a default
/// suited to a cluster on one network: loopback addresses with ephemeral ports, the
/// constants of [`crate::defaults`], the core's [`NodeConfig`] defaults.
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
    /// Advertised in gossip; its id is every lane's `NodeConfig::region`.
    region: Region,
    core: NodeConfig,
    transport: TransportConfig,
    state_store: Option<Arc<dyn StateStore>>,
    snapshots: SnapshotSettings,
    top: TopConfig,
    top_query_timeout: Duration,
    lanes: usize,
    /// Run on this in-process network instead of QUIC and UDP.
    network: Option<MemoryNetwork>,
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
            seed_resolve_interval: millis(defaults::SEED_RESOLVE_INTERVAL_MS),
            cluster_id: defaults::CLUSTER_ID.to_owned(),
            gossip_interval: millis(defaults::GOSSIP_INTERVAL_MS),
            dead_member_forget: millis(defaults::DEAD_MEMBER_FORGET_MS),
            gossip_limits: GossipLimits::default(),
            leave_linger: millis(defaults::LEAVE_LINGER_MS),
            incarnation: None,
            seed: None,
            region: Region::NONE,
            core: NodeConfig { forward_wait: millis(defaults::FORWARD_WAIT_MS), ..NodeConfig::default() },
            transport: TransportConfig::default(),
            state_store: None,
            snapshots: SnapshotSettings::default(),
            top: TopConfig::default(),
            top_query_timeout: millis(defaults::TOP_QUERY_TIMEOUT_MS),
            lanes: defaults::LANES,
            network: None,
        }
    }

    /// How many lanes the node runs (default [`defaults::LANES`], at most [`LANES_MAX`]): each
    /// is a core node for the keys that hash to it ([`Node`]'s checks of different lanes take
    /// different locks, and the lanes' sync rounds run apart): threads that each take the keys
    /// of their own lanes ([`Node::lane_of`]) scale with cores; threads that take any key share
    /// every lane's cache lines and scale far less. **Every member of a cluster must run the
    /// same number**: it is
    /// part of the protocol members gossip, and a member with another count is not proposed (it
    /// forms a cluster of its own). Costs per lane: a timer task, a heartbeat per peer and sync
    /// interval when there is no news, and forward batches split among the lanes. The key
    /// table's `keys_max` is the node's, split evenly among its lanes; the other bounds of the
    /// core's [`NodeConfig`] are each lane's.
    #[must_use]
    pub fn lanes(mut self, lanes: usize) -> Self {
        self.lanes = lanes;
        self
    }

    /// Bounds of the top-keys sketches ([`Node::top`]; default [`TopConfig::default`]).
    #[must_use]
    pub fn top_config(mut self, config: TopConfig) -> Self {
        self.top = config;
        self
    }

    /// How long [`Node::top`] waits for the other members' sketches (default
    /// [`defaults::TOP_QUERY_TIMEOUT_MS`]); a member that does not answer in time is reported missing.
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
    /// (see [`Seed`]).
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
    /// [`defaults::SEED_RESOLVE_INTERVAL_MS`]; while it has none, sooner).
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

    /// Time between gossip rounds (default [`defaults::GOSSIP_INTERVAL_MS`]). A crashed member is declared
    /// dead after about ten of them.
    #[must_use]
    pub fn gossip_interval(mut self, interval: Duration) -> Self {
        self.gossip_interval = interval;
        self
    }

    /// How long a dead member counts in the cluster's size before it is forgotten (default
    /// [`defaults::DEAD_MEMBER_FORGET_MS`]). While it counts, every node enforces `live / (live + dead)` of
    /// each limit, which keeps the sides of a partition near one limit; after, the survivors enforce all of
    /// it.
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

    /// The longest a graceful shutdown waits for its handoff to be acknowledged (default
    /// [`defaults::LEAVE_LINGER_MS`]).
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

    /// The region this node runs in (default [`Region::NONE`]: with no member naming a region,
    /// the cluster is one region). The node advertises it in gossip
    /// ([`crate::membership::KEY_REGION`]); each member's region is in [`Node::members`] and in the
    /// view the core gets. Members of one region share an owner per key; regions share each
    /// global limit by leases ([`NodeBuilder::region_sync_interval`], [`NodeBuilder::region_lease`],
    /// [`NodeBuilder::region_fallback`]).
    #[must_use]
    pub fn region(mut self, region: Region) -> Self {
        self.region = region;
        self
    }

    /// How often a region's owner of a key reports its region's demand to the key's home owner
    /// and renews its lease (default [`ratemesh_core::REGION_SYNC_INTERVAL_MS_DEFAULT`]; only in
    /// a cluster of several regions).
    #[must_use]
    pub fn region_sync_interval(mut self, interval: Duration) -> Self {
        self.core.region_sync_interval = interval;
        self
    }

    /// How long a region's lease on a share of a key's limit lasts without a renewal (default
    /// [`ratemesh_core::REGION_LEASE_MS_DEFAULT`]).
    #[must_use]
    pub fn region_lease(mut self, lease: Duration) -> Self {
        self.core.region_lease = lease;
        self
    }

    /// What a region's share of a key falls to when its lease ends without a renewal (default
    /// [`RegionFallback::Last`]).
    #[must_use]
    pub fn region_fallback(mut self, fallback: RegionFallback) -> Self {
        self.core.region_fallback = fallback;
        self
    }

    /// The most keys this node audits as their owner (default
    /// [`ratemesh_core::AUDIT_KEYS_MAX_DEFAULT`]; 0: none), split evenly among its lanes like the
    /// key table; past it, keys are sampled by hash (`NodeConfig::audit_keys_max`).
    #[must_use]
    pub fn audit_keys_max(mut self, keys: usize) -> Self {
        self.core.audit_keys_max = keys;
        self
    }

    /// The protocol's timings and bounds (key table size, batch lengths, timeouts). The
    /// library's default differs from the core's in one field: `forward_wait` is zero, because
    /// the driver batches forwarded checks by scheduling instead of by a timer. Its `region` is
    /// replaced by [`NodeBuilder::region`]'s id (the region the node advertises).
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

    /// Runs the node on an in-process network instead of QUIC and UDP: its peer transport is a
    /// [`crate::transport::MemoryTransport`] and its sealed gossip goes over the network's
    /// datagrams. Nothing waits on the operating system, so a cluster of such nodes runs on
    /// tokio's paused (virtual) time. The addresses are the network's (port 0: one it chooses).
    /// For tests and simulations; security is still required (it keys gossip).
    #[must_use]
    pub fn memory_network(mut self, network: MemoryNetwork) -> Self {
        self.network = Some(network);
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

    /// When and what to snapshot (default: [`SnapshotSettings::default`], from
    /// [`crate::defaults`]). Only used with a [`NodeBuilder::state_store`].
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
        let (transport, received) = self.bind_transport(&security)?;
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
        // One instant for every lane: their join graces end together.
        let started_at = origin.now_instant();
        let mut cores = (0..self.lanes)
            .map(|lane| {
                // Each lane its own random stream; lane 0's is the node's seed as without lanes.
                let lane_seed = seed ^ (lane as u64).wrapping_mul(LANE_SEED_STEP);
                ratemesh_core::Node::new(self.id, incarnation, self.lane_config(), lane_seed, started_at)
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(durable) = &durable {
            restore(&mut cores, durable, origin.now_instant()).await;
        }
        let me = Member { id: self.id, quic_addr, status: MemberStatus::Live, region: self.region };
        let (members_tx, members_rx) = watch::channel(vec![me]);
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            id: self.id,
            origin,
            lanes: cores.into_iter().enumerate().map(|(index, core)| self.lane(index, core)).collect(),
            left: Notify::new(),
            lanes_left: AtomicUsize::new(0),
            shutdown_begun: AtomicBool::new(false),
            frames_unlaned: AtomicU64::new(0),
            transport,
            gossip_addr: gossip.chitchat_id().gossip_advertise_addr,
            quic_addr,
            members: members_rx,
            stop: stop_tx,
            gossip: Arc::new(Mutex::new(Some(gossip))),
            gossip_health: gossip_health_rx,
            gossip_counters: counters,
            gossip_heard: Arc::clone(&starter.seal.heard),
            tasks: Mutex::new(Vec::new()),
            leave_linger: self.leave_linger,
            gossip_interval: self.gossip_interval,
            durable,
            final_snapshot: std::sync::atomic::AtomicBool::new(false),
            top: TopTable::new(self.top.clone()),
            top_query_timeout: self.top_query_timeout,
            app_queries: std::sync::OnceLock::new(),
        });
        shared.transport.set_query_handler(query_handler(Arc::downgrade(&shared)));
        let slot =
            GossipSlot { handle: Arc::clone(&shared.gossip), state: gossip_state, health: gossip_health };
        shared.spawn_tasks(received, me, members_tx, stop_rx, gossip_state_rx);
        shared.spawn_gossip_supervisor(starter, slot, incarnation);
        self.spawn_seed_resolution(&shared);
        info!(node = ?self.id, %quic_addr, gossip = %shared.gossip_addr, incarnation, "node started");
        Ok(Node::new(shared))
    }

    /// The peer transport: QUIC, or the memory network's.
    fn bind_transport(
        &self,
        security: &ClusterSecurity,
    ) -> Result<(Arc<dyn PeerTransport>, mpsc::Receiver<Received>), StartError> {
        let config = self.transport.clone();
        Ok(match &self.network {
            Some(network) => {
                let (transport, received) = network.bind(self.quic_addr, self.id, config)?;
                (Arc::new(transport), received)
            }
            None => {
                let (transport, received) = QuicTransport::bind(self.quic_addr, security, self.id, config)?;
                (Arc::new(transport), received)
            }
        })
    }

    /// A lane's core configuration: a node that joins through seeds takes no checks for a few
    /// gossip rounds (unless set), while the members learn of it and stop routing its keys
    /// elsewhere; with several lanes, each holds its part of `keys_max` and `audit_keys_max`, and
    /// its frames leave a byte for the lane's index. Every lane is in the node's region.
    fn lane_config(&self) -> NodeConfig {
        let mut config = self.core.clone();
        config.region = self.region.id();
        if config.join_grace.is_zero() && !self.seeds.is_empty() {
            config.join_grace = self.gossip_interval * (defaults::LEAVE_GOSSIP_ROUNDS_MIN + 1);
        }
        if self.lanes > 1 {
            config.store.keys_max = config.store.keys_max.div_ceil(self.lanes);
            config.audit_keys_max = config.audit_keys_max.div_ceil(self.lanes);
            config.frame_len_max = config.frame_len_max.saturating_sub(1);
        }
        config
    }

    /// Lane `index` around its core, alone in its view until the first membership view.
    fn lane(&self, index: usize, core: ratemesh_core::Node) -> Lane {
        let state = State {
            core,
            waiters: HashMap::new(),
            next_request: 0,
            addrs: HashMap::new(),
            timer_at: None,
            timer_lag: Duration::ZERO,
            leaving: false,
            left: false,
            view: MemberView {
                live: vec![self.id],
                dead: Vec::new(),
                regions: if self.region.is_none() { Vec::new() } else { vec![(self.id, self.region.id())] },
            },
            top: TopShard::default(),
        };
        // `validate` bounds the lanes by `LANES_MAX`, which fits a byte.
        let index = u8::try_from(index).unwrap_or(u8::MAX);
        Lane { index, state: parking_lot::Mutex::new(state), timer_wake: Notify::new() }
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
        if self.lanes == 0 || self.lanes > LANES_MAX {
            return Err(StartError::Config {
                field: "lanes",
                reason: "must be at least 1 and at most LANES_MAX (64)",
            });
        }
        self.lane_config().validate()?;
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
            shared.tasks.lock().push(task);
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

    /// A free port on the gossip address's IP (chitchat binds by address, so the port must be
    /// known first): a UDP port, or the memory network's.
    fn free_gossip_addr(&self) -> std::io::Result<SocketAddr> {
        match &self.network {
            Some(network) => network.free_addr(self.gossip_addr),
            None => std::net::UdpSocket::bind(self.gossip_addr)?.local_addr(),
        }
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
                self.free_gossip_addr().map_err(|error| StartError::Gossip {
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
                heard: Arc::default(),
            };
            let starter = GossipStarter {
                node: self.id,
                listen_addr,
                cluster_id: self.cluster_id.clone(),
                seeds: self.seeds.clone(),
                gossip_interval: self.gossip_interval,
                dead_member_forget: self.dead_member_forget,
                seal: Arc::new(seal),
                network: self.network.clone(),
            };
            let mut key_values = vec![
                (KEY_QUIC_ADDR.to_owned(), quic_addr.to_string()),
                (KEY_PROTOCOL.to_owned(), protocol_tag(self.lanes)),
            ];
            if !self.region.is_none() {
                key_values.push((KEY_REGION.to_owned(), self.region.name().to_owned()));
            }
            match starter.spawn(incarnation, key_values).await {
                Ok(handle) => return Ok((handle, starter)),
                Err(error) => last_error = format!("{error:#}"),
            }
        }
        Err(StartError::Gossip { addr: self.gossip_addr, reason: last_error })
    }
}

fn unix_micros() -> u64 {
    let since_epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX)
}
