//! The cluster node: a sans-IO state machine that decides checks, talks to peers and moves key
//! ownership with the membership.
//!
//! # Contract for drivers
//!
//! A driver (the tokio node in `crates/ratemesh`, the simulator's `ratemesh` strategy, a test)
//! owns a [`Node`] and its clock. Every input takes the node's local `now`: monotonic, never
//! compared across nodes. These are all the inputs, by source:
//!
//! - **Time.** [`Node::handle_timeout`] once `now` reaches [`Node::poll_timeout`] (called at any
//!   other time it does what is due, usually nothing).
//! - **Peer messages.** [`Node::handle_frame`] for the bytes of a frame from a peer; the transport
//!   must authenticate the sender. Malformed frames are counted and dropped, never a panic.
//! - **Membership.** [`Node::handle_membership`] when the failure detector's view changes; it
//!   returns a [`ViewChange`] (who joined or left the ring, keys handed over, taken over and
//!   re-followed) to log. A graceful leave: [`Node::handle_leave`] when the leave is announced,
//!   [`Node::handle_leave_heard`] once every member knows of it (optional: it only shortens the
//!   leave); the node then emits [`Event::Left`] (`leave.rs`).
//! - **Local requests.** [`Node::handle_check`] (decided now or [`CheckOutcome::Pending`]),
//!   [`Node::handle_check_now`] (decided now or not at all: never waits), [`Node::handle_adjust`]
//!   (a refund or charge of hits), [`Node::handle_release`] (a concurrency lease).
//! - **Persistence.** [`Node::restore`] takes back durable state the driver read (at start);
//!   [`Node::durable_keys`] and [`Node::export_durable`] only read (`persist.rs`).
//!
//! After every input the driver drains the outputs, in this order:
//! 1. [`Node::poll_transmit`] until `None`: send each frame to its peer (loss is tolerated: the
//!    node retransmits);
//! 2. [`Node::poll_event`] until `None`: [`Event::Decided`] answers a check that was pending,
//!    [`Event::Left`] says the leave is done (the driver may stop the node; no input is needed
//!    any more);
//! 3. [`Node::poll_timeout`], which may have moved earlier or later: the next `handle_timeout`.
//!    After a `handle_check_now` that queued no frame it has not moved.
//!
//! Everything else is a read (`stats`, `owner_of`, `is_serving`, ...). The node never blocks
//! and never reads a clock; everything it keeps is bounded by [`NodeConfig`]. Inside, its
//! deadlines are one table (`timer.rs`) and its forwarded checks one type (`forwards.rs`).
//!
//! # Protocol in one paragraph
//!
//! Keys are placed on a [`Ring`] of the live members. The owner holds the authoritative bucket.
//! Exact-mode checks are forwarded to the owner in batches and its decision is returned.
//! Approximate-mode checks are decided locally from an *allowance* where the owner granted one:
//! hits already debited from its bucket, so admissions within allowances can never exceed the
//! limit. The owner grants an allowance to a node only when that node's demand-proportional share
//! is worth one (see `owner.rs`); a key whose share per node and interval is a few hits or less
//! is not split — its checks are forwarded and decided by the owner, like exact mode. A holder
//! reports, once per interval and only when it has news, the hits it admitted, the allowance it
//! gives back and its demand; the owner answers with a new grant. A node that cannot reach the
//! owner decides by the policy's [`Fallback`] under its rank's share of the limit (shares sum to
//! the limit); hits admitted that way are reported later and debited. Every owner enforces the
//! share of the members it can reach, so that the sides of a partition together stay within one
//! limit. When ownership moves, the old owner hands its state over and followers send their last
//! authoritative view; the new owner joins them conservatively, never starting from a full bucket.
//! A graceful leave is a phase of the node itself (`leave.rs`).

use crate::prelude::*;
mod adjust;
mod api;
mod audit;
mod exact;
mod follower;
mod forwards;
mod handoff;
mod keys;
mod leave;
mod owner;
mod peers;
mod persist;
mod region;
mod ring;
mod round;
mod share;
mod sizing;
mod timer;

use alloc::collections::{BTreeMap, VecDeque};
use alloc::sync::Arc;

use hashbrown::HashMap;

use indexmap::IndexSet;

pub use api::{
    AUDIT_KEYS_MAX_DEFAULT, AdjustRequest, Adjustment, Audit, CheckOutcome, CheckRequest, Event,
    FRAME_ENTRY_BYTES_MAX, FRAME_LEN_MIN, Fallback, MemberView, Mode, NodeConfig, NodeConfigError, NodeId,
    Policy, PolicyRegion, REGION_LEASE_MS_DEFAULT, REGION_SYNC_INTERVAL_MS_DEFAULT, RING_VNODES_MAX,
    RequestId, SYNC_INTERVAL_MS_DEFAULT, Transmit, ViewChange,
};
pub use audit::{AUDIT_SPAN_NANOS, AuditFigures, AuditKeyFigures, AuditStats, AuditSums, AuditWindow};
pub use leave::LeavePlan;
pub use peers::DeliveryStats;
pub use persist::{DurableCursor, DurableKey, RestoreStats};
pub use ring::{RING_VNODES_DEFAULT, Ring};

use crate::algorithm::{Bucket, CoreRng};
use crate::decision::{Decision, LeaseId};
use crate::key::{KeyHash, KeyHasherBuilder};
use crate::limit::{Limit, LimitSpec};
use crate::store::Store;
use crate::time::{Instant, duration_nanos};
use crate::wire::{Body, Decided, ForwardCheck, Grant, KeyState, LimitWire, Release, Report, SnapshotWire};
use follower::FollowerStep;
use forwards::{Forwards, PendingForward};
use keys::{Follower, KeyMeta, Participant};
use peers::{PeerConfig, Peers};
use timer::{Timer, TimerTable};

/// Separates the node's random stream from its key table's, which is seeded with the same seed.
const NODE_RNG_SALT: u64 = 0x9e37_79b9_7f4a_7c15;
/// The retry hint of a fail-closed refusal: 100 ms.
const FAIL_CLOSED_RETRY_NANOS: u64 = 100_000_000;
/// The most distinct limit specs whose scaled forms are cached.
const SCALED_LIMITS_MAX: usize = 1024;

/// Counters of a node, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Checks decided by this node as the owner (its own and forwarded ones).
    pub owner_decisions: u64,
    /// Checks decided from an allowance (or refused while the owner said there is no room).
    pub allowance_decisions: u64,
    /// Checks decided by a fallback policy (owner unreachable, forward timed out).
    pub fallback_decisions: u64,
    /// Checks forwarded to an owner.
    pub forwarded: u64,
    /// Forwarded checks that timed out.
    pub forward_timeouts: u64,
    /// Forward batches sent (`forwarded / forward_batches` is the mean batch length).
    pub forward_batches: u64,
    /// Report items sent.
    pub reports_sent: u64,
    /// Grant items sent.
    pub grants_sent: u64,
    /// Keys handed over to a new owner.
    pub handoffs_sent: u64,
    /// Keys received from a previous owner.
    pub handoffs_received: u64,
    /// Key states sent to ring successors as replicas.
    pub replicas_sent: u64,
    /// Key states received as replicas.
    pub replicas_received: u64,
    /// Items from peers that were refused (invalid limit, mismatched state, wrong sender).
    pub items_refused: u64,
    /// Membership views applied.
    pub membership_changes: u64,
    /// Sync rounds run (one per sync interval: reports, grants, replicas, heartbeats).
    pub sync_rounds: u64,
    /// Delivery counters.
    pub delivery: DeliveryStats,
}

/// The counters of several nodes (a driver's lanes) add up field by field.
impl core::ops::AddAssign for NodeStats {
    fn add_assign(&mut self, other: NodeStats) {
        let NodeStats {
            owner_decisions,
            allowance_decisions,
            fallback_decisions,
            forwarded,
            forward_timeouts,
            forward_batches,
            reports_sent,
            grants_sent,
            handoffs_sent,
            handoffs_received,
            replicas_sent,
            replicas_received,
            items_refused,
            membership_changes,
            sync_rounds,
            delivery,
        } = other;
        self.owner_decisions += owner_decisions;
        self.allowance_decisions += allowance_decisions;
        self.fallback_decisions += fallback_decisions;
        self.forwarded += forwarded;
        self.forward_timeouts += forward_timeouts;
        self.forward_batches += forward_batches;
        self.reports_sent += reports_sent;
        self.grants_sent += grants_sent;
        self.handoffs_sent += handoffs_sent;
        self.handoffs_received += handoffs_received;
        self.replicas_sent += replicas_sent;
        self.replicas_received += replicas_received;
        self.items_refused += items_refused;
        self.membership_changes += membership_changes;
        self.sync_rounds += sync_rounds;
        self.delivery += delivery;
    }
}

/// One ratemesh node. See the module documentation for the driver contract.
#[derive(Debug)]
pub struct Node {
    id: NodeId,
    config: NodeConfig,
    keys: Store<KeyMeta>,
    rng: CoreRng,
    ring: Ring,
    /// Every member of the last view, live and dead, sorted: ranks apportion each limit.
    members: Vec<NodeId>,
    /// The ranks of the members this node could reach at the last sync tick (itself included).
    reachable_ranks: Vec<usize>,
    /// This node's rank in `members`, if it is one.
    rank: Option<usize>,
    /// Limits as the reachable members enforce them (owners), by spec.
    owner_limits: HashMap<LimitSpec, Option<Limit>, KeyHasherBuilder>,
    /// Limits as this node's share enforces them (the fallback), by spec.
    local_limits: HashMap<LimitSpec, Option<Limit>, KeyHasherBuilder>,
    /// The last view applied (every region's members).
    view: MemberView,
    /// The regions of the view (`region.rs`): one, unless the members name several.
    regions: region::Regions,
    /// Limits as a region's part of them, by spec and part.
    region_limits: HashMap<(LimitSpec, u64), Option<Limit>, KeyHasherBuilder>,
    /// Keys this node decided as its region's owner since the last region sync round (bounded
    /// by the key table).
    region_due: IndexSet<KeyHash, KeyHasherBuilder>,
    peers: Peers,
    /// Checks forwarded to their owners (`forwards.rs`).
    forwards: Forwards,
    /// What inputs queued for each peer, sent when the input is done (one frame per peer).
    outgoing: BTreeMap<NodeId, Body>,
    /// Followed keys with something to report or an allowance to keep (bounded by the key table).
    dirty: IndexSet<KeyHash, KeyHasherBuilder>,
    /// Keys whose handoff this node passed on since the last tick (each at most once a tick;
    /// bounded by the key table's `keys_max`).
    passed_on: IndexSet<KeyHash, KeyHasherBuilder>,
    /// Owned keys changed since the last tick, to replicate to their successors.
    replicas_due: IndexSet<KeyHash, KeyHasherBuilder>,
    /// Owned approximate-mode keys this node decided since the last tick (its own allowance).
    own_due: IndexSet<KeyHash, KeyHasherBuilder>,
    /// Counts the sync rounds begun (from 1, wrapping past 0): a check that marked its key
    /// with this epoch put it in `own_due` and `replicas_due` already (`keys::mark_due`).
    due_epoch: u32,
    /// The sync round in progress, run in slices (`round.rs`).
    round: Option<round::SyncRound>,
    /// Every deadline of the node, by kind (`timer.rs`).
    timers: TimerTable,
    fallbacks_since_sync: u64,
    settled: bool,
    leave: Option<leave::Leave>,
    /// When a member last left this node's view gracefully (gone from the live members without
    /// being dead): a leave at about the same time may hand this node keys late (see `leave.rs`).
    departed_at: Option<Instant>,
    /// Until then the node takes no client checks (`NodeConfig::join_grace`).
    joining_until: Instant,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: NodeStats,
    /// The audit of the keys this node owns (`audit.rs`).
    audit: audit::AuditBook,
}

impl Node {
    /// A node that knows only itself; `incarnation` must grow with every restart of the member.
    /// Refused (no node) when `config` does not pass [`NodeConfig::validate`].
    pub fn new(
        id: NodeId,
        incarnation: u64,
        config: NodeConfig,
        seed: u64,
        now: Instant,
    ) -> Result<Node, NodeConfigError> {
        config.validate()?;
        let peer_config = PeerConfig {
            silence_nanos: duration_nanos(config.peer_silence),
            sync_nanos: duration_nanos(config.sync_interval),
            unacked_frames_max: config.unacked_frames_max,
            rto_initial_nanos: duration_nanos(config.retransmit_initial),
            frame_len_max: config.frame_len_max,
        };
        let mut rng: CoreRng = rand::SeedableRng::seed_from_u64(seed ^ NODE_RNG_SALT);
        // Nodes started together must not sync in lockstep: every holder's report would reach an
        // owner at the same instant, and the first ones would take what the others need.
        let interval = duration_nanos(config.sync_interval).max(1);
        let first_sync_at = now.add_nanos(1 + rand::Rng::next_u64(&mut rng) % interval);
        Ok(Node {
            id,
            keys: Store::new(config.store, seed),
            rng,
            ring: Ring::new(&[id], config.ring_vnodes),
            members: vec![id],
            reachable_ranks: vec![0],
            rank: Some(0),
            owner_limits: HashMap::default(),
            local_limits: HashMap::default(),
            view: MemberView { live: vec![id], dead: Vec::new(), regions: Vec::new() },
            regions: region::Regions::default(),
            region_limits: HashMap::default(),
            region_due: IndexSet::default(),
            peers: Peers::new(id, incarnation, peer_config),
            forwards: Forwards::new(),
            outgoing: BTreeMap::new(),
            dirty: IndexSet::default(),
            passed_on: IndexSet::default(),
            replicas_due: IndexSet::default(),
            own_due: IndexSet::default(),
            due_epoch: 1,
            round: None,
            timers: {
                let mut timers = TimerTable::default();
                timers.set(Timer::Sync, first_sync_at);
                timers
            },
            fallbacks_since_sync: 0,
            settled: true,
            leave: None,
            departed_at: None,
            // No grace: serving from the epoch on (a driver's clock may start below `now`).
            joining_until: match config.join_grace.is_zero() {
                true => Instant::ZERO,
                false => now.add_duration(config.join_grace),
            },
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: NodeStats::default(),
            audit: audit::AuditBook::new(seed, now),
            config,
        })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The owner of `key` in this node's view.
    pub fn owner_of(&self, key: KeyHash) -> Option<NodeId> {
        self.ring.owner(key)
    }

    /// The ring of this node's view.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Whether the node is in its steady state: every live peer reachable at the last sync tick and
    /// no check decided by a fallback since then.
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// The members whose shares the limits this node enforces as an owner count: itself and the
    /// ring members reachable for two retransmission timeouts (refreshed every sync round). Below
    /// the members' count, owners enforce the reachable members' part of every limit (a member
    /// back from the dead counts again a little after it is heard).
    pub fn members_counted(&self) -> usize {
        self.reachable_ranks.len()
    }

    /// The node's counters.
    pub fn stats(&self) -> NodeStats {
        NodeStats { delivery: self.peers.stats(), ..self.stats }
    }

    /// How many keys the node tracks (owned and followed).
    pub fn keys_len(&self) -> usize {
        self.keys.len()
    }

    /// Frames sent to peers and not acknowledged yet.
    pub fn unacked_frames(&self) -> usize {
        self.peers.unacked_frames()
    }

    /// The smoothed round-trip time to each member this node has measured one for (acknowledged
    /// frames), sorted by member.
    pub fn round_trips(&self) -> Vec<(NodeId, core::time::Duration)> {
        self.peers.round_trips().map(|(id, nanos)| (id, core::time::Duration::from_nanos(nanos))).collect()
    }

    /// The key table's counters.
    pub fn store_stats(&self) -> crate::store::StoreStats {
        self.keys.stats()
    }

    /// When the node's join grace ends (`NodeConfig::join_grace` after it started).
    pub fn joining_until(&self) -> Instant {
        self.joining_until
    }

    /// Whether the node takes client checks at `now`: not while it joins or leaves.
    pub fn is_serving(&self, now: Instant) -> bool {
        self.leave.is_none() && now >= self.joining_until
    }

    /// Decides a client's check now, or forwards it and answers later.
    pub fn handle_check(&mut self, now: Instant, request: CheckRequest) -> CheckOutcome {
        let frames_sent = self.peers.stats().frames_sent;
        let outcome = self.check(now, request);
        self.end_check(now, frames_sent);
        outcome
    }

    fn check(&mut self, now: Instant, request: CheckRequest) -> CheckOutcome {
        if !self.is_serving(now) {
            return CheckOutcome::Unavailable;
        }
        let owner = self.ring.owner(request.key).unwrap_or(self.id);
        if owner == self.id {
            let decision = self.decide_as_owner(&request.policy, request.key, request.cost, now);
            return CheckOutcome::Decided(decision);
        }
        if effective_mode(&request.policy) == api::Mode::Approximate {
            let step = self.decide_as_follower(owner, &request.policy, request.key, request.cost, now);
            if let FollowerStep::Decided(decision) = step {
                return CheckOutcome::Decided(decision);
            }
        }
        self.forward(owner, request, now)
    }

    /// Decides a client's check without a round trip, or returns `None` when only the owner can
    /// (an exact-mode key owned by another node, an approximate-mode key this node holds no
    /// allowance of, a node that does not serve now): for callers that must never wait.
    ///
    /// It takes the check's parts by reference (there is no request to keep): a caller on many
    /// threads does not touch the policy's reference count, a cache line all of them share. It
    /// moves [`Node::poll_timeout`] only when it queues a frame (a report or an allowance request
    /// to the owner): a driver need not re-read the deadline after a check that sent nothing.
    pub fn handle_check_now(
        &mut self,
        now: Instant,
        key: KeyHash,
        policy: &Arc<Policy>,
        cost: u64,
    ) -> Option<Decision> {
        let frames_sent = self.peers.stats().frames_sent;
        let decision = self.check_now(now, key, policy, cost);
        self.end_check(now, frames_sent);
        decision
    }

    fn check_now(&mut self, now: Instant, key: KeyHash, policy: &Arc<Policy>, cost: u64) -> Option<Decision> {
        if !self.is_serving(now) {
            return None;
        }
        let owner = self.ring.owner(key).unwrap_or(self.id);
        if owner == self.id {
            return Some(self.decide_as_owner(policy, key, cost, now));
        }
        if effective_mode(policy) == api::Mode::Exact {
            return None;
        }
        match self.decide_as_follower(owner, policy, key, cost, now) {
            FollowerStep::Decided(decision) => Some(decision),
            FollowerStep::Forward => None,
        }
    }

    /// Releases a concurrency lease (at the owner; sent there when it is another node). Returns
    /// whether it was released here; a release sent to the owner returns `false`.
    pub fn handle_release(&mut self, now: Instant, key: KeyHash, policy: &Policy, lease: LeaseId) -> bool {
        let owner = self.ring.owner(key).unwrap_or(self.id);
        let release = Release { key: key.0, limit: LimitWire::from_limit(&policy.limit), lease: lease.0 };
        if owner == self.id {
            let released = self.release_lease(key, &policy.limit, lease, now);
            if released {
                self.release_replica(release, now);
                self.end_input(now);
            }
            return released;
        }
        self.send(owner, Body { release: vec![release], ..Body::default() }, now);
        self.end_input(now);
        false
    }

    /// Takes bytes from peer `from`. Malformed input is counted and dropped, never a panic.
    pub fn handle_frame(&mut self, now: Instant, from: NodeId, bytes: &[u8]) {
        if let Ok(Some((order, body))) = self.peers.receive(from, bytes, now) {
            let Body {
                forward,
                decided,
                report,
                grant,
                handoff,
                replica,
                release,
                adjust,
                region_report,
                region_grant,
                audit,
                // Spent by `Peers::receive` on the audit pieces' ages.
                audit_clock_nanos: _,
            } = body;
            self.on_forward(from, forward, now);
            self.on_adjust(from, adjust, now);
            self.on_decided(from, decided, now);
            self.on_reports(from, order, report, now);
            self.on_grants(from, order, grant, now);
            self.on_states(from, handoff, false, now);
            self.on_states(from, replica, true, now);
            self.on_release(release, now);
            self.on_region_reports(from, region_report, now);
            self.on_region_grants(from, region_grant, now);
            // After the reports and forwards that created the keys' entries.
            self.on_audit(from, audit, now);
        }
        // An acknowledgement may complete a leave's drain.
        self.leave_progress(now);
        self.end_input(now);
    }

    /// Applies a new membership view: the ring is rebuilt from the live members, and state of
    /// keys that moved is handed to their new owners. A leaving node stays in its own ring until
    /// it hands over, and out of it afterwards, whatever the view says. Returns what moved.
    pub fn handle_membership(&mut self, now: Instant, view: MemberView) -> ViewChange {
        self.stats.membership_changes += 1;
        let mut live = view.live;
        match self.leave {
            None => {}
            Some(leave::Leave::Owning { .. }) if !live.contains(&self.id) => live.push(self.id),
            Some(_) => live.retain(|&m| m != self.id),
        }
        let change = self.apply_view(now, MemberView { live, ..view });
        self.end_input(now);
        change
    }

    fn apply_view(&mut self, now: Instant, view: MemberView) -> ViewChange {
        // A round's entries were all taken under one ring.
        self.finish_round(now);
        // Frames go to members of every region; ownership, shares and reachability are the own
        // region's.
        let probes = self.peers.set_members(&view.live, now);
        self.transmits.extend(probes);
        self.regions = region::Regions::new(&view, (self.id, self.config.region), self.config.ring_vnodes);
        self.view = view.clone();
        self.region_limits.clear();
        let region_timer = self.regions.active().then(|| {
            let interval = duration_nanos(self.config.region_sync_interval).max(1);
            self.timers.get(Timer::RegionSync).unwrap_or(now.add_nanos(interval))
        });
        self.timers.set_or_stop(Timer::RegionSync, region_timer);
        let live = self.regions.filter(self.config.region, &view.live);
        let dead = self.regions.filter(self.config.region, &view.dead);
        let mut members: Vec<NodeId> = live.iter().chain(&dead).copied().collect();
        members.sort_unstable();
        members.dedup();
        let replicated = self.replicates();
        let departed = self.ring.members().iter().any(|m| *m != self.id && !members.contains(m));
        if departed {
            self.departed_at = Some(now);
        }
        let before = core::mem::replace(&mut self.ring, Ring::new(&live, self.config.ring_vnodes));
        let (old, new) = (before.members(), self.ring.members());
        let joined: Vec<NodeId> = new.iter().filter(|m| !old.contains(m)).copied().collect();
        let left_ring: Vec<NodeId> = old.iter().filter(|m| !new.contains(m)).copied().collect();
        self.rank = members.binary_search(&self.id).ok();
        debug_assert!(members.windows(2).all(|w| w[0] < w[1]), "members are sorted, each once: ranks");
        debug_assert!(
            live.iter().all(|m| members.binary_search(m).is_ok()),
            "the ring's members are members"
        );
        let forgotten = self.members.iter().any(|m| members.binary_search(m).is_err());
        // Back from the dead (a healed partition), not new: the other side may hand windows over.
        let returned = joined.iter().any(|m| self.members.binary_search(m).is_ok());
        let dead_since = dead.iter().map(|&m| self.audit_dead_since(m, now)).min();
        self.audit_view_changed(now, forgotten, returned, dead_since);
        self.members = members;
        self.refresh_reachability(now, true);
        // Owners mark no key for replication while they are alone on their ring: the first
        // successor gets every key they still own.
        let replicate_owned = !replicated && self.replicates();
        let moved = self.move_keys(now, replicate_owned);
        ViewChange { joined, departed: left_ring, ..moved }
    }

    /// Whether owners replicate their changed keys now: configured to, and the ring has a
    /// successor for them (the view that brings the first marks every key owned).
    fn replicates(&self) -> bool {
        self.config.replicate && self.ring.members().len() > 1
    }

    /// Runs the timers that are due at `now`: every expired one, in a fixed order (`timer.rs`).
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut synced = false;
        for timer in Timer::VALUES {
            if !self.timers.is_expired(timer, now) {
                continue;
            }
            match timer {
                Timer::FlushForwards => self.flush_forwards(now),
                Timer::ForwardExpiry => self.expire_forwards(now),
                Timer::Peers => {
                    let retransmits = self.peers.retransmits(now);
                    self.transmits.extend(retransmits);
                }
                Timer::Sync => synced = self.on_sync_timeout(now),
                Timer::SyncSlice => self.run_slice(now, self.config.sync_slice_len_max),
                Timer::RegionSync => {
                    self.region_round(now);
                    let interval = duration_nanos(self.config.region_sync_interval);
                    self.timers.set(Timer::RegionSync, now.add_nanos(interval.max(1)));
                }
                // Below: a leave also moves on without its deadline (its last acknowledgement).
                Timer::Leave => {}
            }
        }
        // The records of timed-out forwards expire with any timeout (they arm no timer).
        self.forget_timed_out(now);
        self.leave_progress(now);
        // Frames first: they carry the acknowledgements due; then what is still due goes alone,
        // and peers that got nothing for an interval get a heartbeat.
        self.flush_out(now);
        let acks = self.peers.acks(now);
        self.transmits.extend(acks);
        if synced {
            let idle = duration_nanos(self.config.sync_interval);
            let heartbeats = self.peers.heartbeats(now, idle);
            self.transmits.extend(heartbeats);
            let probes = self.peers.probes(now);
            self.transmits.extend(probes);
        }
        self.arm_derived_timers();
        self.assert_timers(now);
    }

    /// The sync timer expired: a round begins, unless one is still in progress (it goes on in
    /// slices; the next begins once it ended: rounds stretch under a load the node cannot keep
    /// up with, rather than one input running the rest of a round under the driver's lock).
    /// Returns whether a round began.
    fn on_sync_timeout(&mut self, now: Instant) -> bool {
        if self.round.is_some() {
            self.timers.set(Timer::Sync, now.add_nanos(1));
            return false;
        }
        let due_at = self.next_sync_at();
        self.sync(now);
        let interval = duration_nanos(self.config.sync_interval);
        self.timers.set(Timer::Sync, due_at.add_nanos(interval).max(now.add_nanos((interval / 2).max(1))));
        true
    }

    /// When the next sync round is due (the sync timer is always armed).
    fn next_sync_at(&self) -> Instant {
        let at = self.timers.get(Timer::Sync);
        debug_assert!(at.is_some(), "the sync timer is always armed");
        at.unwrap_or(Instant::ZERO)
    }

    /// Ends an input: sends what it queued (one frame per peer) and re-arms the timers that
    /// mirror other state.
    fn end_input(&mut self, now: Instant) {
        self.flush_out(now);
        self.arm_derived_timers();
    }

    /// Ends a client's check: as [`Node::end_input`], without scanning the peers' frames when
    /// the check sent none (`frames_sent`: the count before it), which is the common case.
    fn end_check(&mut self, now: Instant, frames_sent: u64) {
        self.flush_out(now);
        self.arm_forward_expiry();
        if self.peers.stats().frames_sent != frames_sent {
            self.arm_peer_timers();
        }
    }

    /// Re-arms the timers that mirror state kept elsewhere (`timer.rs`).
    fn arm_derived_timers(&mut self) {
        self.arm_forward_expiry();
        self.arm_peer_timers();
    }

    /// Re-arms the forward expiry timer: the earliest pending forward's deadline.
    fn arm_forward_expiry(&mut self) {
        self.timers.set_or_stop(Timer::ForwardExpiry, self.forwards.next_deadline());
    }

    /// Re-arms the timers that the peers' frames move: retransmissions and acknowledgements, and
    /// a leave's drain (which waits for the acknowledgements).
    fn arm_peer_timers(&mut self) {
        self.timers.set_or_stop(Timer::Peers, self.peers.next_timeout());
        self.timers.set_or_stop(Timer::Leave, self.leave_deadline());
    }

    /// The timer invariants a driver relies on: after [`Node::handle_timeout`] at `now` nothing is
    /// due at or before `now` (a driver would call it again at once, forever), and every forwarded
    /// check waiting for an answer has exactly one deadline, so each is decided by it.
    fn assert_timers(&self, now: Instant) {
        let sync_at = self.next_sync_at();
        assert!(sync_at > now, "sync due at {sync_at:?}, handled at {now:?}");
        assert!(
            self.forwards.next_deadline().is_none_or(|deadline| deadline > now),
            "a forward's deadline passed at {now:?} without deciding it"
        );
        self.forwards.assert_deadlines();
        debug_assert!(self.poll_timeout().is_none_or(|at| at > now), "a timer due again at {now:?}");
    }

    /// The next frame to send.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Node::handle_timeout`] should run next: the earliest armed timer. A node that left
    /// is not woken for its sync rounds (its sync timer stays armed: a timeout for another timer
    /// still runs the round due).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.debug_assert_timer_table();
        let left = matches!(self.leave, Some(leave::Leave::Left));
        self.timers.next_timeout(left.then_some(Timer::Sync))
    }

    /// The timer table's sanity: the derived timers equal their sources, the sync timer is always
    /// armed and a slice's timer exactly while a round is in progress.
    fn debug_assert_timer_table(&self) {
        debug_assert_eq!(self.timers.get(Timer::Peers), self.peers.next_timeout(), "the peers' timer");
        debug_assert_eq!(self.timers.get(Timer::Leave), self.leave_deadline(), "the leave's timer");
        debug_assert_eq!(
            self.timers.get(Timer::ForwardExpiry),
            self.forwards.next_deadline(),
            "the forward expiry timer"
        );
        debug_assert!(self.timers.get(Timer::Sync).is_some(), "the sync timer is always armed");
        debug_assert_eq!(
            self.timers.get(Timer::SyncSlice).is_some(),
            self.round.is_some(),
            "a slice's timer is armed exactly while a round is in progress"
        );
        debug_assert!(
            self.timers.get(Timer::FlushForwards).is_some() || !self.forwards.any_queued(),
            "forwards wait in the outbox only while their flush is armed"
        );
    }

    // --- Limits as the reachable part of the cluster enforces them ---------------------------------

    /// The limit an owner enforces for `key`: its region's part of it (`region.rs`), of which the
    /// share of the members it can reach (`None`: nothing, a side of a partition whose share
    /// rounds to zero, or a region without a part).
    fn owner_limit(&mut self, policy: &Policy, key: KeyHash, now: Instant) -> Option<Limit> {
        let regional = match self.region_part(key, policy, now) {
            None => None,
            Some(part) => {
                self.region_rescale(key, policy, part, now);
                Some(self.region_limit(&policy.limit, part)?)
            }
        };
        let limit = regional.as_ref().unwrap_or(&policy.limit);
        if self.reachable_ranks.len() >= self.members.len() {
            return Some(limit.clone());
        }
        let (ranks, n) = (&self.reachable_ranks, self.members.len());
        let scaled = cached(&mut self.owner_limits, limit.spec(), || share::apportion(limit, ranks, n));
        debug_assert!(
            scaled.as_ref().is_none_or(|s| s.spec().limit <= policy.limit.spec().limit),
            "an owner enforces at most the limit: the reachable members' shares"
        );
        scaled
    }

    /// `limit` as a region enforces `part` of it (cached by spec and part; the cache is bounded).
    fn region_limit(&mut self, limit: &Limit, part: u64) -> Option<Limit> {
        cached(&mut self.region_limits, &(limit.spec().clone(), part), || region::scale(limit, part))
    }

    /// The limit this node's fallback enforces: its own rank's share.
    fn local_limit(&mut self, limit: &Limit) -> Option<Limit> {
        let rank = self.rank?;
        let n = self.members.len();
        // Across regions, the share is of the region's floor: the part of the limit its home
        // keeps for the region whatever happens (the follower does not know the region's lease).
        let regional = match self.regions.active() {
            true => Some(self.region_limit(limit, self.regions.floor(limit.spec().limit))?),
            false => None,
        };
        let limit = regional.as_ref().unwrap_or(limit);
        debug_assert!(
            rank < n && self.members[rank] == self.id,
            "the node's rank is its place among the members"
        );
        let scaled = cached(&mut self.local_limits, limit.spec(), || share::apportion(limit, &[rank], n));
        debug_assert!(
            scaled.as_ref().is_none_or(|s| s.spec().limit <= limit.spec().limit.div_ceil(n.max(1) as u64)),
            "a fallback enforces its rank's share of the limit"
        );
        scaled
    }

    /// Recomputes which members are reachable; the scaled limits are recomputed when that (or the
    /// membership, `changed`) changed.
    fn refresh_reachability(&mut self, now: Instant, changed: bool) {
        let ranks: Vec<usize> = (0..self.members.len())
            .filter(|&r| {
                let member = self.members[r];
                member == self.id
                    || (self.ring.members().contains(&member) && self.peers.counted_reachable(member, now))
            })
            .collect();
        debug_assert!(self.rank.is_none_or(|rank| ranks.contains(&rank)), "a member always reaches itself");
        if changed || ranks != self.reachable_ranks {
            self.reachable_ranks = ranks;
            self.owner_limits.clear();
            self.local_limits.clear();
            self.region_limits.clear();
        }
    }

    // --- Sync tick ---------------------------------------------------------------------------------

    fn sync(&mut self, now: Instant) {
        self.stats.sync_rounds += 1;
        self.passed_on.clear();
        self.refresh_reachability(now, false);
        let all_reachable = self.ring.members().iter().all(|&m| m == self.id || self.peers.reachable(m, now));
        self.settled = all_reachable && self.fallbacks_since_sync == 0;
        self.fallbacks_since_sync = 0;
        self.begin_round(now);
    }

    /// Runs `change` on a tracked key's bucket and bookkeeping (under the key's own policy).
    fn update_key<R>(
        &mut self,
        key: KeyHash,
        change: impl FnOnce(&mut Bucket, &mut KeyMeta) -> R,
    ) -> Option<R> {
        let limit = self.keys.extra(key)?.policy.limit.clone();
        self.keys.update(key, &limit, change)
    }

    fn half_life_nanos(&self) -> u64 {
        2 * duration_nanos(self.config.sync_interval)
    }

    /// Queues `body` for `to`: everything for one peer leaves in one frame when the input that
    /// produced it is done ([`Node::flush_out`]), or at once when it reached the batch bound.
    fn send(&mut self, to: NodeId, body: Body, now: Instant) {
        let batch_len_max = self.config.sync_batch_len_max.max(1);
        let pending = self.outgoing.entry(to).or_default();
        pending.append(body);
        if pending.items() >= batch_len_max {
            let full = core::mem::take(pending);
            self.transmit_body(to, full, now);
        }
        debug_assert!(
            self.outgoing.get(&to).is_none_or(|b| b.items() < batch_len_max),
            "a frame's items are bounded"
        );
    }

    /// Sends what inputs queued for each peer, one frame per peer.
    fn flush_out(&mut self, now: Instant) {
        for (to, body) in core::mem::take(&mut self.outgoing) {
            self.transmit_body(to, body, now);
        }
    }

    /// Sends `body` to `to` as one frame, or as several when it does not fit in one (halves,
    /// halved again as need be: the states of long sliding window logs add up past
    /// `frame_len_max`). A state no frame holds is coarsened until one does (a log's neighbouring
    /// entries merged: more cautious, never less); an item that still does not fit is dropped
    /// and counted, not retried forever.
    fn transmit_body(&mut self, to: NodeId, body: Body, now: Instant) {
        if body.is_empty() {
            return;
        }
        match self.peers.send(to, body, now) {
            Ok(Some(transmit)) => self.transmits.push_back(transmit),
            Ok(None) => {}
            Err(mut body) if body.items() == 1 => match body.coarsen_states() {
                true => self.transmit_body(to, *body, now),
                false => self.peers.count_unencodable(1),
            },
            Err(mut body) => {
                let rest = body.split_off(body.items() / 2);
                self.transmit_body(to, *body, now);
                self.transmit_body(to, rest, now);
            }
        }
    }
}

/// What `scale` makes of a limit, cached by `key` (its spec, or its spec and a part); the cache is
/// bounded and cleared when full.
fn cached<K: core::hash::Hash + Eq + Clone>(
    cache: &mut HashMap<K, Option<Limit>, KeyHasherBuilder>,
    key: &K,
    scale: impl FnOnce() -> Option<Limit>,
) -> Option<Limit> {
    if let Some(scaled) = cache.get(key) {
        return scaled.clone();
    }
    let scaled = scale();
    if cache.len() >= SCALED_LIMITS_MAX {
        cache.clear();
    }
    cache.insert(key.clone(), scaled.clone());
    scaled
}

/// The mode a policy runs in: concurrency leases and the shaper's queue position only exist at
/// the owner, and a sliding window log counts every hit at the time it is admitted (an allowance
/// debited earlier would leave the window earlier), so those algorithms are always exact.
fn effective_mode(policy: &Policy) -> api::Mode {
    match policy.limit.algorithm() {
        crate::limit::Algorithm::Concurrency
        | crate::limit::Algorithm::LeakyBucketShaper
        | crate::limit::Algorithm::SlidingWindowLog => api::Mode::Exact,
        _ => policy.mode,
    }
}

#[cfg(test)]
mod tests;
