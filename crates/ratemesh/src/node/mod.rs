//! The tokio driver of the core's node: [`NodeBuilder`] → [`Node`].
//!
//! The protocol is entirely in [`ratemesh_core::Node`]; this module only feeds it time, client
//! checks, peer frames and membership views, and carries out what it asks for (frames to send,
//! decisions to return, the next timer). Four kinds of task drive one node:
//!
//! - the **timer** task of each lane sleeps until its core's next deadline (or until a check
//!   moved it earlier) and runs the core's timers: forward batches, acknowledgements,
//!   retransmissions, sync rounds;
//! - the **receive** task hands authenticated peer frames to their lanes' cores;
//! - the **membership** task turns gossip plus mutual-TLS confirmation into membership views
//!   (see [`crate::membership`]);
//! - the **gossip supervisor** restarts gossip should it end while the node runs (see
//!   [`crate::gossip`]).
//!
//! A node runs one or more **lanes** ([`NodeBuilder::lanes`]): a core node per lane, each for
//! the keys whose hash falls in it, behind its own lock, with its own timer task. Lane *i* of a
//! node talks only to lane *i* of its peers (with several lanes a frame names its lane in its
//! last byte), so each lane is the whole protocol over its part of the keys.
//!
//! Client checks run on the caller's task: lock the key's lane, decide, unlock. A check that must wait for its
//! owner (exact mode, or an approximate allowance that ran dry) registers a one-shot channel that
//! the receive or timer task completes. Forwarded checks are batched without a timer: a check
//! asks the timer task to flush, and every check that arrives before that task runs joins the
//! same batch — so batches grow with load and an idle node adds no delay.
//!
//! The files: `builder.rs` ([`NodeBuilder`]: settings and the start), `handle.rs` ([`Node`]: the
//! API), `driver.rs` (the tasks and what they do under the lock), `clock.rs` (the core's clock
//! on tokio time); this file holds the types they share.
//!
//! The node runs over any [`PeerTransport`]: QUIC by default, or an in-process
//! [`crate::transport::MemoryNetwork`] ([`NodeBuilder::memory_network`]), which also carries
//! gossip, so that a whole cluster runs on tokio's paused (virtual) time.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::time::Duration;

use chitchat::ChitchatHandle;
use ratemesh_core::{
    Audit, Decision, KeyHash, MemberView, Namespace, NodeId, NodeStats, Policy, RequestId, StoreStats,
};
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinHandle;

use crate::durable::{Persistence, SnapshotMetrics};
use crate::gossip::{GossipCounters, GossipHealth, GossipStats, HeardVersions};
use crate::membership::Member;
use crate::security::SecurityError;
use crate::sync::Mutex;
use crate::top::{TopAnswer, TopShard, TopTable};
use crate::transport::{PeerTransport, TransportError, TransportStats};

mod audit;
mod builder;
mod clock;
mod driver;
mod handle;
mod queries;

pub use builder::NodeBuilder;
use clock::Origin;
pub use handle::Node;
pub use queries::{APP_QUERY_TAG, APP_QUESTION_LEN_MAX, AskError};

/// Frames handed to the core per lock taken by the receive task (the rest wait for the next turn,
/// so that client checks are not starved by a burst of frames).
const FRAMES_PER_TURN_MAX: usize = 64;
/// Bytes of frames handed to the core per lock taken by the receive task: a turn of full sync
/// frames (a thousand entries each) would otherwise hold the lock for milliseconds. A turn takes
/// at least one frame.
const FRAME_BYTES_PER_TURN_MAX: usize = 64 * 1024;
/// Slots of the key table (entries and empty ones) a snapshot exports per lock: at most seven
/// eighths as many keys (the table's load), a fraction of a millisecond.
const SNAPSHOT_SLOTS_PER_TURN: usize = 1024;
/// The most addresses of members that left the view kept for answering them (a leaving member
/// waits for acknowledgements of its handoff after the others dropped it from their views).
const DEPARTED_ADDRS_MAX: usize = 4096;
/// Attempts at binding the gossip socket when its port is chosen by the node (port 0).
const GOSSIP_BIND_ATTEMPTS_MAX: usize = 16;
/// The most lanes a node runs ([`NodeBuilder::lanes`]): a frame names its lane in one byte.
pub const LANES_MAX: usize = 64;
/// Spreads key hashes over lanes (the golden ratio's odd 64-bit constant).
const LANE_MIX: u64 = 0x9E37_79B9_7F4A_7C15;
/// Separates the lanes' random streams (an odd constant: lane `i` is seeded `seed ^ i × step`).
const LANE_SEED_STEP: u64 = 0xD1B5_4A32_D192_ED03;

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
    /// An audit in group 0 (the default) is put in the name's group, [`NamedPolicy::audit_group`]:
    /// the audit's figures come per policy.
    pub fn new(name: impl Into<Arc<str>>, policy: Policy) -> NamedPolicy {
        let name = name.into();
        let namespace = Namespace::new(name.as_bytes());
        let audit = match policy.audit {
            Audit::On { group: 0, window } => Audit::On { group: namespace.0, window },
            audit => audit,
        };
        NamedPolicy { namespace, name, policy: Arc::new(Policy { audit, ..policy }) }
    }

    /// The audit group of the policy named `name` ([`Audit::On`]'s `group`, as
    /// [`NamedPolicy::new`] sets it): to name the audit's figures.
    pub fn audit_group(name: &str) -> u64 {
        Namespace::new(name.as_bytes()).0
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
    /// A setting of the core node is out of range ([`ratemesh_core::NodeConfig::validate`]).
    #[error("invalid setting: {0}")]
    Core(#[from] ratemesh_core::NodeConfigError),
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
    /// [`Node::members_counted`].
    pub members_counted: usize,
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

/// What the node's handle and tasks share.
struct Shared {
    id: NodeId,
    origin: Origin,
    /// The node's lanes, each a core node for the keys of its lane ([`lane_index`]).
    lanes: Box<[Lane]>,
    /// Every lane's leave is complete (the shutdown waits for it).
    left: Notify,
    /// Lanes whose leave is complete.
    lanes_left: AtomicUsize,
    /// A shutdown began (`Node::shutdown`; a second one waits for the first).
    shutdown_begun: AtomicBool,
    /// Frames received that named no lane of this node (counted as malformed).
    frames_unlaned: AtomicU64,
    transport: Arc<dyn PeerTransport>,
    gossip_addr: SocketAddr,
    quic_addr: SocketAddr,
    members: watch::Receiver<Vec<Member>>,
    stop: watch::Sender<bool>,
    /// The running gossip instance (replaced by the supervisor when it ends; taken at stop).
    gossip: Arc<Mutex<Option<ChitchatHandle>>>,
    gossip_health: watch::Receiver<GossipHealth>,
    gossip_counters: Arc<GossipCounters>,
    /// What the peers know of this node's gossip state (a leave waits for its version).
    gossip_heard: Arc<HeardVersions>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    leave_linger: Duration,
    gossip_interval: Duration,
    /// Durable quotas, when a state store is set.
    durable: Option<Arc<Persistence>>,
    /// The final snapshot was taken (a second shutdown does not take another).
    final_snapshot: std::sync::atomic::AtomicBool,
    /// What the lanes' top-keys shards share (each lane holds its shard: [`State::top`]).
    top: TopTable,
    top_query_timeout: Duration,
    /// How this node answers members' [`Node::ask`] (set once by the application).
    app_queries: std::sync::OnceLock<crate::transport::QueryHandler>,
}

/// One lane of a node: a core node that holds the keys of the lane, behind its own lock, with its
/// own timer task. Lanes share nothing but the transport: a check takes the lock of its key's lane
/// only, so checks of different lanes run in parallel, and so do the lanes' sync rounds.
struct Lane {
    /// Its index, the last byte of its frames when the node has more than one lane.
    index: u8,
    state: parking_lot::Mutex<State>,
    /// The core's next deadline moved earlier than the one the lane's timer task sleeps until.
    timer_wake: Notify,
}

/// Everything behind a lane's lock.
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
    /// The lane's top-keys sketches: a check records itself under the lock it was decided under.
    top: TopShard,
}

/// The lane of `key` among `lanes`: a function of the key's hash alone, the same on every member
/// (a lane talks only to the same lane of its peers), and independent of the bits the key table
/// and the ring use (the hash's halves folded, multiplied by an odd constant, then the high bits).
fn lane_index(key: KeyHash, lanes: usize) -> usize {
    let folded = (key.0 >> 64) as u64 ^ key.0 as u64;
    let mixed = folded.wrapping_mul(LANE_MIX);
    ((u128::from(mixed) * lanes as u128) >> 64) as usize
}

/// The value of the gossip key `ratemesh.protocol`: the core's wire version, and the lane count
/// when it is not one (members of one cluster must run the same number of lanes, and a member
/// that speaks another protocol is not proposed; one lane is the wire of a node without lanes).
fn protocol_tag(lanes: usize) -> String {
    match lanes {
        1 => ratemesh_core::wire::WIRE_VERSION.to_string(),
        lanes => format!("{}/{lanes}", ratemesh_core::wire::WIRE_VERSION),
    }
}
