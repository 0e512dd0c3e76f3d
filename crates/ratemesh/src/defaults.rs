//! Every default of the library, defined once: [`crate::NodeBuilder`], [`crate::TransportConfig`],
//! [`crate::GossipLimits`], [`crate::TopConfig`] and [`crate::durable::SnapshotSettings`] take
//! their defaults from here, and so should anything that restates them (the daemon's
//! configuration, documentation). Names carry their unit last; durations are in milliseconds.
//!
//! The core's protocol defaults (`ratemesh_core::NodeConfig`) are the core's; the one the
//! library changes is [`FORWARD_WAIT_MS`].

use ratemesh_core::wire::FRAME_LEN_MAX_DEFAULT;

// --- NodeBuilder -------------------------------------------------------------------------------

/// The cluster's name when none is set: gossip of another cluster is ignored.
pub const CLUSTER_ID: &str = "ratemesh";
/// Time between gossip rounds. A crashed member is declared dead after about ten of them.
pub const GOSSIP_INTERVAL_MS: u64 = 200;
/// How long a dead member counts in the cluster's size before it is forgotten: meanwhile every
/// node enforces `live / (live + dead)` of each limit. A minute: long enough for a restarted pod
/// to come back under the same id, short enough that a member gone for good does not keep its
/// share of every limit unused for long (chitchat's own default, 24 h, would).
pub const DEAD_MEMBER_FORGET_MS: u64 = 60_000;
/// How often seeds given by DNS name are resolved again once the node has a live peer.
pub const SEED_RESOLVE_INTERVAL_MS: u64 = 10_000;
/// The longest a graceful shutdown waits for its handoff to be acknowledged.
pub const LEAVE_LINGER_MS: u64 = 2000;
/// How long [`crate::Node::top`] waits for the other members' sketches.
pub const TOP_QUERY_TIMEOUT_MS: u64 = 1000;
/// The core's `NodeConfig::forward_wait` in the library: zero, because the driver batches
/// forwarded checks by scheduling (a check wakes the timer task; every check that arrives before
/// it runs joins the batch), not by a timer (tokio timers have 1 ms granularity).
pub const FORWARD_WAIT_MS: u64 = 0;
/// Lanes of a node ([`crate::NodeBuilder::lanes`]): one, the wire of a node without lanes.
/// Every member of a cluster runs the same number.
pub const LANES: usize = 1;
/// Gossip rounds a leaving node waits, beyond log2 of the cluster's size, for its peers to learn
/// of the leave; a node that joins through seeds takes no checks for one more round than this
/// (its join grace) unless `NodeConfig::join_grace` is set.
pub const LEAVE_GOSSIP_ROUNDS_MIN: u32 = 3;

// --- TransportConfig ---------------------------------------------------------------------------

/// Largest frame sent or accepted, in bytes: the core's bound (1 MiB).
pub const FRAME_LEN_MAX: usize = FRAME_LEN_MAX_DEFAULT;
/// Capacity of the channel of received frames.
pub const INBOUND_QUEUE_LEN_MAX: usize = 1024;
/// Frames queued per peer before new ones are dropped.
pub const SEND_QUEUE_LEN_MAX: usize = 256;
/// Peers with an outbound queue and connection.
pub const PEERS_MAX: usize = 1024;
/// Incoming connections served at once.
pub const CONNECTIONS_INBOUND_MAX: usize = 1024;
/// Concurrent incoming streams a peer may open on one connection.
pub const STREAMS_PER_CONNECTION_MAX: u32 = 128;
/// Limit on a connect and TLS handshake.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 5000;
/// Limit on writing one frame, including waiting for stream credit.
pub const WRITE_TIMEOUT_MS: u64 = 5000;
/// Limit on reading one incoming stream to its end.
pub const STREAM_READ_TIMEOUT_MS: u64 = 10_000;
/// A connection with no traffic for this long is closed.
pub const IDLE_TIMEOUT_MS: u64 = 15_000;
/// Outbound connections send a keep-alive this often.
pub const KEEP_ALIVE_INTERVAL_MS: u64 = 3000;
/// First reconnect delay after a failed connect.
pub const BACKOFF_INITIAL_MS: u64 = 50;
/// Largest reconnect delay.
pub const BACKOFF_MAX_MS: u64 = 5000;
/// Limit on closing the transport (flushing queued frames, then the close itself).
pub const CLOSE_TIMEOUT_MS: u64 = 2000;

// --- GossipLimits ------------------------------------------------------------------------------

/// Gossip entries (members, all generations) the state may grow to.
pub const GOSSIP_NODES_MAX: usize = 512;
/// Key-values per gossip entry.
pub const GOSSIP_KEYS_PER_NODE_MAX: usize = 32;
/// Longest gossip key, in bytes.
pub const GOSSIP_KEY_LEN_MAX: usize = 128;
/// Longest gossip value, in bytes.
pub const GOSSIP_VALUE_LEN_MAX: usize = 1024;
/// Bytes a gossip message may decompress to.
pub const GOSSIP_DECOMPRESSED_BYTES_MAX: usize = 1 << 20;
/// Largest jump of a member's heartbeat or version in one message.
pub const GOSSIP_COUNTER_JUMP_MAX: u64 = 1 << 20;

// --- TopConfig ---------------------------------------------------------------------------------

/// Counters per top-keys sketch.
pub const TOP_CAPACITY: usize = 128;
/// Key bytes kept per counter (cut on a character boundary).
pub const TOP_KEY_BYTES_MAX: usize = 64;
/// The span of one half-window of the top-keys sketches.
pub const TOP_HALF_WINDOW_MS: u64 = 30_000;
/// Policies with sketches.
pub const TOP_POLICIES_MAX: usize = 256;

// --- SnapshotSettings --------------------------------------------------------------------------

/// Time between durable snapshots.
pub const SNAPSHOT_INTERVAL_MS: u64 = 5000;
/// Keys of limits with a shorter period are not snapshotted.
pub const SNAPSHOT_PERIOD_MIN_MS: u64 = 60_000;
/// Largest snapshot, in bytes.
pub const SNAPSHOT_BYTES_MAX: usize = 256 << 20;
