//! The cluster node: a sans-IO state machine that decides checks, talks to peers and moves key
//! ownership with the membership.
//!
//! # Contract for drivers
//!
//! A driver (the tokio node, the simulator, a test) owns a [`Node`] and its clock, and:
//! 1. feeds inputs, each with the node's local `now` (monotonic; never compared across nodes):
//!    [`Node::handle_check`] for a client's check, [`Node::handle_release`] for a concurrency
//!    lease, [`Node::handle_frame`] for bytes from a peer (the transport must authenticate the
//!    sender), [`Node::handle_membership`] when the failure detector's view changes, and
//!    [`Node::handle_timeout`] once `now` reaches [`Node::poll_timeout`];
//! 2. after every input, drains the outputs: [`Node::poll_transmit`] until `None` (send each
//!    frame to its peer; loss is tolerated), then [`Node::poll_event`] until `None` (decisions of
//!    checks that were [`CheckOutcome::Pending`]);
//! 3. re-reads [`Node::poll_timeout`], which may have moved.
//!
//! The node never blocks and never reads a clock; everything it keeps is bounded by
//! [`NodeConfig`].
//!
//! # Protocol in one paragraph
//!
//! Keys are placed on a [`Ring`] of the live members. The owner holds the authoritative bucket.
//! Exact-mode checks are forwarded to the owner in batches and its decision is returned.
//! Approximate-mode checks are decided locally from an *allowance*: hits the owner granted and
//! already debited from its bucket, so admissions within allowances can never exceed the limit.
//! Every sync interval a follower reports, per key, the hits it admitted (from the allowance, and
//! without one, under the fallback), the allowance it gives back, and its demand; the owner applies
//! them and grants a new allowance, proportional to the follower's share of recent demand and
//! capped by two intervals of that demand. A node that cannot reach the owner (or has no grant
//! yet) decides by the policy's [`Fallback`]; hits admitted that way are reported later and
//! debited (the bucket may go into debt, which is paid back). Every node scales limits by the
//! fraction of the cluster it can reach, so that the sides of a partition together stay near one
//! limit. When ownership moves, the old owner hands its state over and followers send their last
//! authoritative view; the new owner joins them conservatively, never starting from a full bucket.

mod api;
mod exact;
mod follower;
mod keys;
mod owner;
mod peers;
mod persist;
mod ring;

use std::collections::{BTreeMap, HashMap, VecDeque};

use indexmap::IndexSet;

pub use api::{
    CheckOutcome, CheckRequest, Event, Fallback, MemberView, Mode, NodeConfig, NodeId, Policy, RequestId,
    Transmit,
};
pub use peers::DeliveryStats;
pub use persist::{DurableKey, RestoreStats};
pub use ring::{RING_VNODES_DEFAULT, Ring};

use crate::algorithm::{Bucket, CoreRng};
use crate::decision::{Decision, LeaseId};
use crate::key::{KeyHash, KeyHasherBuilder};
use crate::limit::{Limit, LimitSpec};
use crate::store::Store;
use crate::time::{Instant, duration_nanos};
use crate::wire::{Body, Decided, ForwardCheck, Grant, KeyState, LimitWire, Release, Report, SnapshotWire};
use exact::PendingForward;
use follower::{Path, decide_from_allowance};
use keys::{Follower, KeyMeta, Participant};
use owner::need_for;
use peers::{PeerConfig, Peers};

/// Separates the node's random stream from its key table's, which is seeded with the same seed.
const NODE_RNG_SALT: u64 = 0x9e37_79b9_7f4a_7c15;
/// Hits an allowance holds beyond the expected demand (see `need_for`).
const NEED_SLACK: u64 = 2;
/// The retry hint of a fail-closed refusal: 100 ms.
const FAIL_CLOSED_RETRY_NANOS: u64 = 100_000_000;
/// The most distinct limit specs whose scaled forms are cached.
const SCALED_LIMITS_MAX: usize = 1024;

/// Counters of a node, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Checks decided by this node as the owner.
    pub owner_decisions: u64,
    /// Checks decided from an allowance.
    pub allowance_decisions: u64,
    /// Checks decided by a fallback policy (owner unreachable, no grant yet, forward timed out).
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
    /// Items from peers that were refused (invalid limit, mismatched state).
    pub items_refused: u64,
    /// Membership views applied.
    pub membership_changes: u64,
    /// Sync rounds run (one per sync interval: reports, grants, replicas, heartbeats).
    pub sync_rounds: u64,
    /// Delivery counters.
    pub delivery: DeliveryStats,
}

/// One ratemesh node. See the module documentation for the driver contract.
#[derive(Debug)]
pub struct Node {
    id: NodeId,
    config: NodeConfig,
    keys: Store<KeyMeta>,
    rng: CoreRng,
    ring: Ring,
    /// Members in the last view (live + dead): the cluster's size for local shares.
    cluster_len: usize,
    /// Live members this node could reach at the last sync tick, itself included.
    reachable_len: usize,
    /// Scaled limits by (spec, numerator, denominator).
    scaled: HashMap<(LimitSpec, usize, usize), Limit, KeyHasherBuilder>,
    peers: Peers,
    pending: BTreeMap<u64, PendingForward>,
    next_forward_id: u64,
    outbox: BTreeMap<NodeId, Vec<ForwardCheck>>,
    flush_at: Option<Instant>,
    /// Keys with something to report, by owner (bounded by the key table).
    dirty: IndexSet<KeyHash, KeyHasherBuilder>,
    /// Owned keys changed since the last tick, to replicate to their successors.
    replicas_due: IndexSet<KeyHash, KeyHasherBuilder>,
    next_sync_at: Instant,
    fallbacks_since_sync: u64,
    settled: bool,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: NodeStats,
}

impl Node {
    /// A node that knows only itself; `incarnation` must grow with every restart of the member.
    pub fn new(id: NodeId, incarnation: u64, config: NodeConfig, seed: u64, now: Instant) -> Node {
        let peer_config = PeerConfig {
            silence_nanos: duration_nanos(config.peer_silence),
            unacked_frames_max: config.unacked_frames_max,
            rto_initial_nanos: duration_nanos(config.retransmit_initial),
            frame_len_max: config.frame_len_max,
        };
        Node {
            id,
            keys: Store::new(config.store, seed),
            rng: rand::SeedableRng::seed_from_u64(seed ^ NODE_RNG_SALT),
            ring: Ring::new(&[id], config.ring_vnodes),
            cluster_len: 1,
            reachable_len: 1,
            scaled: HashMap::default(),
            peers: Peers::new(id, incarnation, peer_config),
            pending: BTreeMap::new(),
            next_forward_id: 1,
            outbox: BTreeMap::new(),
            flush_at: None,
            dirty: IndexSet::default(),
            replicas_due: IndexSet::default(),
            next_sync_at: now.add_duration(config.sync_interval),
            fallbacks_since_sync: 0,
            settled: true,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: NodeStats::default(),
            config,
        }
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

    /// The node's counters.
    pub fn stats(&self) -> NodeStats {
        NodeStats { delivery: self.peers.stats(), ..self.stats }
    }

    /// How many keys the node tracks (owned and followed).
    pub fn keys_len(&self) -> usize {
        self.keys.len()
    }

    /// Frames sent to peers and not acknowledged yet (a leaving node waits for its handoff to be
    /// acknowledged).
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

    /// Decides a client's check now, or forwards it and answers later (exact mode).
    pub fn handle_check(&mut self, now: Instant, request: CheckRequest) -> CheckOutcome {
        let owner = self.ring.owner(request.key).unwrap_or(self.id);
        if owner == self.id {
            return CheckOutcome::Decided(self.decide_as_owner(
                &request.policy,
                request.key,
                request.cost,
                now,
            ));
        }
        match effective_mode(&request.policy) {
            api::Mode::Exact => self.forward(owner, request, now),
            api::Mode::Approximate => {
                let (decision, path) =
                    self.decide_as_follower(owner, &request.policy, request.key, request.cost, now);
                // The allowance ran dry while the owner may still have room: ask it (one round
                // trip) rather than refuse what the ideal limiter would admit.
                if path == Path::Exhausted && self.pending.len() < self.config.pending_forwards_max {
                    return self.forward(owner, request, now);
                }
                CheckOutcome::Decided(decision)
            }
        }
    }

    /// Decides a client's check without a round trip, or returns `None` when only the owner can
    /// (an exact-mode key owned by another node). Unlike [`Node::handle_check`], an
    /// approximate-mode check whose allowance ran dry is refused here instead of being forwarded:
    /// for callers that must never wait.
    pub fn handle_check_now(&mut self, now: Instant, request: &CheckRequest) -> Option<Decision> {
        let owner = self.ring.owner(request.key).unwrap_or(self.id);
        if owner == self.id {
            return Some(self.decide_as_owner(&request.policy, request.key, request.cost, now));
        }
        match effective_mode(&request.policy) {
            api::Mode::Exact => None,
            api::Mode::Approximate => {
                Some(self.decide_as_follower(owner, &request.policy, request.key, request.cost, now).0)
            }
        }
    }

    /// Releases a concurrency lease (at the owner; sent there when it is another node). Returns
    /// whether it was released here; a release sent to the owner returns `false`.
    pub fn handle_release(&mut self, now: Instant, key: KeyHash, policy: &Policy, lease: LeaseId) -> bool {
        let owner = self.ring.owner(key).unwrap_or(self.id);
        if owner == self.id {
            return self.keys.release(key, &policy.limit, lease, now);
        }
        let body = Body::Release(vec![Release {
            key: key.0,
            limit: LimitWire::from_limit(&policy.limit),
            lease: lease.0,
        }]);
        self.send(owner, body, now);
        false
    }

    /// Takes bytes from peer `from`. Malformed input is counted and dropped, never a panic.
    pub fn handle_frame(&mut self, now: Instant, from: NodeId, bytes: &[u8]) {
        let Ok(Some(body)) = self.peers.receive(from, bytes, now) else { return };
        match body {
            Body::Forward(checks) => self.on_forward(from, checks, now),
            Body::Decided(decided) => self.on_decided(decided, now),
            Body::Report(reports) => self.on_reports(from, reports, now),
            Body::Grant(grants) => self.on_grants(from, grants, now),
            Body::Handoff(states) => self.on_states(states, false, now),
            Body::Replica(states) => self.on_states(states, true, now),
            Body::Release(releases) => self.on_release(releases, now),
            Body::Heartbeat => {}
        }
    }

    /// Applies a new membership view: the ring is rebuilt from the live members, and state of
    /// keys that moved is handed to their new owners.
    pub fn handle_membership(&mut self, now: Instant, view: MemberView) {
        self.stats.membership_changes += 1;
        self.cluster_len = (view.live.len() + view.dead.len()).max(1);
        self.peers.set_members(&view.live, now);
        self.ring = Ring::new(&view.live, self.config.ring_vnodes);
        self.reachable_len = self.reachable_members(now);
        self.move_keys(now);
    }

    /// Runs the timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.flush_at.is_some_and(|at| at <= now) {
            self.flush_forwards(now);
        }
        self.expire_forwards(now);
        let retransmits = self.peers.retransmits(now);
        self.transmits.extend(retransmits);
        let acks = self.peers.acks(now);
        self.transmits.extend(acks);
        if now >= self.next_sync_at {
            self.sync(now);
            let interval = duration_nanos(self.config.sync_interval);
            self.next_sync_at = self.next_sync_at.add_nanos(interval).max(now.add_nanos(interval / 2));
        }
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

    /// When [`Node::handle_timeout`] should run next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let deadlines = [
            Some(self.next_sync_at),
            self.flush_at,
            self.pending.values().next().map(|p| p.deadline),
            self.peers.next_timeout(),
        ];
        deadlines.into_iter().flatten().min()
    }

    // --- Limits scaled to the reachable part of the cluster ---------------------------------------

    /// `limit` scaled by `num / den` (cached; the cache is bounded and cleared when full).
    fn scaled_limit(&mut self, limit: &Limit, num: usize, den: usize) -> Limit {
        if num >= den {
            return limit.clone();
        }
        let cache_key = (limit.spec().clone(), num, den);
        if let Some(scaled) = self.scaled.get(&cache_key) {
            return scaled.clone();
        }
        let scaled = scale(limit, num as u64, den as u64);
        if self.scaled.len() >= SCALED_LIMITS_MAX {
            self.scaled.clear();
        }
        self.scaled.insert(cache_key, scaled.clone());
        scaled
    }

    /// The limit an owner enforces: the reachable fraction of the cluster's limit.
    fn owner_limit(&mut self, policy: &Policy) -> Limit {
        let (num, den) = (self.reachable_len, self.cluster_len);
        self.scaled_limit(&policy.limit, num, den)
    }

    fn reachable_members(&self, now: Instant) -> usize {
        let live_peers = self.ring.members().iter().filter(|&&m| m != self.id);
        1 + live_peers.filter(|&&m| self.peers.reachable(m, now)).count()
    }

    // --- Sync tick ---------------------------------------------------------------------------------

    fn sync(&mut self, now: Instant) {
        self.stats.sync_rounds += 1;
        self.reachable_len = self.reachable_members(now);
        let all_reachable = self.reachable_len == self.ring.members().len();
        self.settled = all_reachable && self.fallbacks_since_sync == 0;
        self.fallbacks_since_sync = 0;
        self.send_reports(now);
        if self.config.replicate {
            self.send_replicas(now);
        }
        let idle = duration_nanos(self.config.sync_interval);
        let heartbeats = self.peers.heartbeats(now, idle);
        self.transmits.extend(heartbeats);
        self.keys.sweep(now);
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

    fn send(&mut self, to: NodeId, body: Body, now: Instant) {
        if let Some(transmit) = self.peers.send(to, body, now) {
            self.transmits.push_back(transmit);
        }
    }
}

/// The mode a policy runs in: concurrency leases and the shaper's queue position only exist at
/// the owner, so those algorithms are always exact.
fn effective_mode(policy: &Policy) -> api::Mode {
    match policy.limit.algorithm() {
        crate::limit::Algorithm::Concurrency | crate::limit::Algorithm::LeakyBucketShaper => api::Mode::Exact,
        _ => policy.mode,
    }
}

/// `limit` with its rate and burst multiplied by `num / den` (at least 1 each).
fn scale(limit: &Limit, num: u64, den: u64) -> Limit {
    let part = |value: u64| {
        u64::try_from(u128::from(value) * u128::from(num) / u128::from(den.max(1))).unwrap_or(value).max(1)
    };
    let spec = limit.spec();
    let scaled = LimitSpec {
        algorithm: spec.algorithm,
        limit: part(spec.limit),
        period: spec.period,
        burst: spec.burst.map(part),
        delay: spec.delay.map(|d| part(d).min(spec.burst.map_or(d, part))),
        calendar: spec.calendar,
    };
    Limit::new(scaled).unwrap_or_else(|_| limit.clone())
}

#[cfg(test)]
mod tests;
