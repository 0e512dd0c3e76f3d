//! The node's inputs, outputs and configuration.

use crate::prelude::*;
use alloc::sync::Arc;
use core::time::Duration;

use crate::decision::Decision;
use crate::key::KeyHash;
use crate::limit::Limit;
pub use crate::region::{PolicyRegion, RegionFallback, RegionId};
use crate::store::StoreConfig;

/// A member of the cluster. Stable across restarts of the same member (its *incarnation* changes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u64);

/// The membership as a node's failure detector sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberView {
    /// Members believed alive (including this node). They form the ring.
    pub live: Vec<NodeId>,
    /// Members that failed recently and have not been forgotten yet. They own no keys, but still
    /// count in the cluster's size: a node that sees `live` of `live + dead` members admits that
    /// fraction of each limit, so that the sides of a partition together never admit much more
    /// than the limit.
    pub dead: Vec<NodeId>,
    /// The region of every member (live or dead) that is not in [`RegionId::NONE`]. Members in
    /// this node's region form its ring; the others are reached only for cross-region leases.
    pub regions: Vec<(NodeId, RegionId)>,
}

/// What a membership view moved at one node ([`Node::handle_membership`]): for a driver to log
/// (or count) instead of diffing the node's counters.
///
/// [`Node::handle_membership`]: super::Node::handle_membership
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ViewChange {
    /// Members that entered this node's ring (live now, not before), sorted.
    pub joined: Vec<NodeId>,
    /// Members that left this node's ring (dead or gone from the view, or this node itself when
    /// it hands over at the end of a leave), sorted.
    pub departed: Vec<NodeId>,
    /// Keys this node owned and handed over to their new owners.
    pub handed_over: u64,
    /// Keys this node owns now and did not before (it followed them, or held their state).
    pub taken_over: u64,
    /// Followed keys whose owner changed: their next report seeds the new owner.
    pub refollowed: u64,
}

/// How a limit is enforced across the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Every check is decided by the key's owner (forwarded in batches). No over-admission while
    /// membership is stable; one peer round trip per check.
    Exact,
    /// Checks are decided locally from a share of the limit granted by the owner every sync
    /// period. Memory-speed decisions; bounded over-admission under faults.
    Approximate,
}

/// What a node does for a key whose owner it cannot reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// Admit this node's share of the limit (`limit / cluster size`) from a local bucket.
    LocalShare,
    /// Admit everything.
    FailOpen,
    /// Refuse everything.
    FailClosed,
}

/// A limit with its cluster behaviour: what a check names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    /// The limit.
    pub limit: Limit,
    /// Exact or approximate.
    pub mode: Mode,
    /// Behaviour when the owner is unreachable.
    pub fallback: Fallback,
    /// Whether the key's owner audits what the cluster admitted (`node/audit.rs`).
    pub audit: Audit,
    /// Its terms between regions (`node/region.rs`): the node's where it sets none.
    pub region: PolicyRegion,
}

impl Policy {
    /// `limit` in `mode`, with the defaults: the local share when the owner is unreachable,
    /// audited ([`Audit::default`]), the node's terms between regions.
    pub fn new(limit: Limit, mode: Mode) -> Policy {
        let (fallback, audit, region) = (Fallback::LocalShare, Audit::default(), PolicyRegion::default());
        Policy { limit, mode, fallback, audit, region }
    }
}

/// Whether the owner of a key audits what the whole cluster admitted of it, window by window,
/// against an ideal single limiter ([`crate::Node::audit_figures`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Audit {
    /// Not audited.
    Off,
    /// Audited: the owner sums its figures per `group` (a driver's name for the policy), over
    /// windows of `window` (`None`: the limit's period for the window algorithms, between 1 s and
    /// 1 h; 1 s for the token bucket, GCRA and the shaper). Concurrency limits are not audited.
    On {
        /// The group.
        group: u64,
        /// The window.
        window: Option<Duration>,
    },
}

impl Default for Audit {
    /// Audited in group 0, over the limit's default window.
    fn default() -> Audit {
        Audit::On { group: 0, window: None }
    }
}

/// Names one pending check, so that its decision can be matched when it arrives later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// A client's check.
#[derive(Clone, Debug)]
pub struct CheckRequest {
    /// Chosen by the caller; echoed in [`Event::Decided`].
    pub id: RequestId,
    /// The bucket.
    pub key: KeyHash,
    /// The limit and its mode.
    pub policy: Arc<Policy>,
    /// Hits (0 = query).
    pub cost: u64,
}

/// What a client's adjustment does to a key's bucket, at the key's owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Adjustment {
    /// Returns hits admitted earlier (work that failed, an estimate above the real cost). The
    /// bucket never rises above its capacity; window algorithms take the hits from the current
    /// window first (then, for the sliding window counter, the previous one).
    Refund,
    /// Applies hits unconditionally (the real cost, known after the work): the bucket may go
    /// into debt, which later requests pay back.
    Charge,
}

/// A client's refund or charge, decided by the key's owner.
#[derive(Clone, Debug)]
pub struct AdjustRequest {
    /// Chosen by the caller; echoed in [`Event::Decided`].
    pub id: RequestId,
    /// The bucket.
    pub key: KeyHash,
    /// The limit and its mode.
    pub policy: Arc<Policy>,
    /// Refund or charge.
    pub adjustment: Adjustment,
    /// Hits.
    pub hits: u64,
}

/// The immediate result of [`crate::Node::handle_check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckOutcome {
    /// Decided now.
    Decided(Decision),
    /// Sent to the owner; the decision will come as [`Event::Decided`] with the request's id.
    Pending,
    /// Not taken: the node is joining (its first `join_grace`, while the cluster learns of it)
    /// or leaving (see [`crate::Node::handle_leave`]). Clients should use another node.
    Unavailable,
}

/// Bytes for a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// The destination.
    pub to: NodeId,
    /// One encoded frame.
    pub bytes: Vec<u8>,
}

/// Something the driver should know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A pending check was decided.
    Decided {
        /// The request.
        id: RequestId,
        /// Its decision.
        decision: Decision,
    },
    /// A graceful leave is complete: every owned key was handed over and acknowledged (or the
    /// drain bound passed). The driver may stop the node.
    Left,
}

/// Timing and bounds of a node. Every bound has a default that suits a cluster of tens of nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    /// How often approximate-mode hits are reported to owners (and grants renewed).
    pub sync_interval: Duration,
    /// The most checks in one forwarded batch.
    pub forward_batch_len_max: usize,
    /// How long a forwarded check may wait for its batch to fill.
    pub forward_wait: Duration,
    /// The longest a forwarded check waits for the owner before the fallback decides it, and the
    /// wait before a round trip to that owner was measured. Once one was, the wait is a round trip
    /// plus a retransmission timeout (`srtt + rto`, as TCP estimates them): enough to survive one
    /// lost frame, short when the network is.
    pub forward_timeout: Duration,
    /// The most forwarded checks waiting for an answer at once; more are decided by the fallback.
    pub pending_forwards_max: usize,
    /// The most keys in one report or grant frame.
    pub sync_batch_len_max: usize,
    /// The most keys one slice of a sync round visits (reports, own allowances, replicas): a
    /// driver that holds a lock around each input holds it that long at most for a round, and
    /// serves what waited between slices. Default 256 (a few hundred microseconds at most: a visit is
    /// a few lookups in tables too large for the CPU's caches).
    pub sync_slice_len_max: usize,
    /// A peer this node expects to hear from (they share allowance state), silent for this long,
    /// is treated as unreachable. Raised per peer to two sync intervals plus two retransmission
    /// timeouts when that is longer.
    pub peer_silence: Duration,
    /// The most frames kept per peer for retransmission.
    pub unacked_frames_max: usize,
    /// The first retransmission timeout (adapted to the measured round trip afterwards).
    pub retransmit_initial: Duration,
    /// The most bytes in one frame.
    pub frame_len_max: usize,
    /// Whether owners send the state of changed keys to their ring successors every interval, so
    /// that an owner's crash loses at most one interval.
    pub replicate: bool,
    /// Virtual nodes per member on the ring.
    pub ring_vnodes: u32,
    /// Approximate mode: the smallest allowance worth granting, in hits. A node whose share of a
    /// key is smaller gets none: its checks are forwarded and the owner decides them.
    pub allowance_min: u64,
    /// How long a node takes no client checks after it starts: about the time the cluster takes
    /// to learn of it. It owns keys from its first view on, but until the other members route to
    /// it, the keys' previous owners decide for their clients; if it decided for its own clients
    /// meanwhile, from buckets the previous owners have not handed over yet, both would admit.
    /// Zero for a node that starts alone.
    pub join_grace: Duration,
    /// Bounds of the key table.
    pub store: StoreConfig,
    /// This node's region ([`RegionId::NONE`]: the cluster is one region, or this node names none).
    pub region: RegionId,
    /// How often a region's owner of a key reports its region's demand to the key's home owner,
    /// which answers with the region's lease (only in a cluster of several regions).
    pub region_sync_interval: Duration,
    /// How long a region's lease on a share of a key's limit lasts without a renewal.
    pub region_lease: Duration,
    /// What a region's share falls to when its lease ends without a renewal.
    pub region_fallback: RegionFallback,
    /// The most keys this node audits as their owner (`node/audit.rs`); past it, keys are sampled
    /// by hash. 0: the audit is off on this node both ways (it audits nothing and sends no audit
    /// pieces: for a rolling upgrade from a build without the audit, which cannot decode them).
    pub audit_keys_max: usize,
}

/// The default [`NodeConfig::sync_interval`], in milliseconds.
pub const SYNC_INTERVAL_MS_DEFAULT: u64 = 50;
/// The default [`NodeConfig::region_sync_interval`], in milliseconds.
pub const REGION_SYNC_INTERVAL_MS_DEFAULT: u64 = 250;
/// The default [`NodeConfig::audit_keys_max`].
pub const AUDIT_KEYS_MAX_DEFAULT: usize = 4096;
/// The default [`NodeConfig::region_lease`], in milliseconds.
pub const REGION_LEASE_MS_DEFAULT: u64 = 2_000;

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            sync_interval: Duration::from_millis(SYNC_INTERVAL_MS_DEFAULT),
            forward_batch_len_max: 256,
            forward_wait: Duration::from_micros(200),
            forward_timeout: Duration::from_secs(1),
            pending_forwards_max: 65_536,
            sync_batch_len_max: 1024,
            sync_slice_len_max: 256,
            peer_silence: Duration::from_millis(200),
            unacked_frames_max: 1024,
            retransmit_initial: Duration::from_millis(20),
            frame_len_max: crate::wire::FRAME_LEN_MAX_DEFAULT,
            replicate: true,
            ring_vnodes: super::ring::RING_VNODES_DEFAULT,
            allowance_min: 2,
            join_grace: Duration::ZERO,
            store: StoreConfig::default(),
            region: RegionId::NONE,
            region_sync_interval: Duration::from_millis(REGION_SYNC_INTERVAL_MS_DEFAULT),
            region_lease: Duration::from_millis(REGION_LEASE_MS_DEFAULT),
            region_fallback: RegionFallback::Last,
            audit_keys_max: AUDIT_KEYS_MAX_DEFAULT,
        }
    }
}

/// The smallest `frame_len_max` a node accepts, whatever its batch bounds: room for a heartbeat,
/// acknowledgements and a few entries of every section.
pub const FRAME_LEN_MIN: usize = 1024;

/// A bound on the encoded size of one entry of a frame's sections other than a long state (a
/// forwarded check is 22 bytes, a report 28, a grant 27: ARCHITECTURE.md, "Wire v3"). A frame
/// carries at most `sync_batch_len_max` entries (`forward_batch_len_max` forwarded checks), so
/// `frame_len_max` must hold that many of these: else frames would fail to encode. The states of
/// a sliding window log or of leases can be larger: a body they make too large for one frame goes
/// over several, and a state too long for any frame is coarsened until it fits.
pub const FRAME_ENTRY_BYTES_MAX: usize = 128;

/// Why a [`NodeConfig`] cannot run a node. The driver's settings are at fault (an integration
/// error, not a peer's or a client's); no node was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeConfigError {
    /// A duration that paces a timer is zero: the timer would fire again at once, forever.
    #[error("{0} must be longer than zero")]
    ZeroDuration(&'static str),
    /// A bound is below the smallest with which the node can work.
    #[error("{field} must be at least {min}")]
    TooSmall {
        /// The field of [`NodeConfig`] (`store.keys_max` for the store's).
        field: &'static str,
        /// The smallest accepted value.
        min: u64,
    },
    /// A setting above what the node can hold (the ring's points are kept in memory and sorted
    /// on every view change).
    #[error("{field} must be at most {max}")]
    TooLarge {
        /// The field of [`NodeConfig`].
        field: &'static str,
        /// The largest accepted value.
        max: u64,
    },
}

/// The most virtual nodes per member a ring accepts ([`NodeConfig::ring_vnodes`]).
pub const RING_VNODES_MAX: u32 = 65_536;

impl NodeConfig {
    /// The smallest `frame_len_max` for these batch bounds (see [`FRAME_ENTRY_BYTES_MAX`]).
    pub fn frame_len_min(&self) -> usize {
        let entries = self.sync_batch_len_max.max(self.forward_batch_len_max);
        entries.saturating_mul(FRAME_ENTRY_BYTES_MAX).saturating_add(FRAME_LEN_MIN)
    }

    /// Checks what the node relies on: timers that advance, bounds that let it work. `Node::new`
    /// refuses a configuration that fails this.
    pub fn validate(&self) -> Result<(), NodeConfigError> {
        let durations = [
            ("sync_interval", self.sync_interval),
            ("forward_timeout", self.forward_timeout),
            ("peer_silence", self.peer_silence),
            ("retransmit_initial", self.retransmit_initial),
            ("region_sync_interval", self.region_sync_interval),
            ("region_lease", self.region_lease),
        ];
        if let Some(&(field, _)) = durations.iter().find(|(_, duration)| duration.is_zero()) {
            return Err(NodeConfigError::ZeroDuration(field));
        }
        let bounds = [
            ("forward_batch_len_max", self.forward_batch_len_max, 1),
            ("pending_forwards_max", self.pending_forwards_max, 1),
            ("sync_batch_len_max", self.sync_batch_len_max, 1),
            ("sync_slice_len_max", self.sync_slice_len_max, 1),
            ("unacked_frames_max", self.unacked_frames_max, 1),
            ("frame_len_max", self.frame_len_max, self.frame_len_min()),
            ("ring_vnodes", self.ring_vnodes as usize, 1),
            ("store.keys_max", self.store.keys_max, 1),
            ("store.sweep_len_max", self.store.sweep_len_max, 1),
            ("store.eviction_sample_len", self.store.eviction_sample_len, 1),
        ];
        if let Some(&(field, _, min)) = bounds.iter().find(|&&(_, value, min)| value < min) {
            return Err(NodeConfigError::TooSmall { field, min: min as u64 });
        }
        if self.ring_vnodes > RING_VNODES_MAX {
            return Err(NodeConfigError::TooLarge { field: "ring_vnodes", max: u64::from(RING_VNODES_MAX) });
        }
        Ok(())
    }
}
