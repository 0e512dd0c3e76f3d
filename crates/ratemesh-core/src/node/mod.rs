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
mod keys;
mod peers;
mod ring;

use std::collections::{BTreeMap, HashMap, VecDeque};

use indexmap::IndexSet;
use rand::Rng;
use std::sync::Arc;

pub use api::{
    CheckOutcome, CheckRequest, Event, Fallback, MemberView, Mode, NodeConfig, NodeId, Policy, RequestId,
    Transmit,
};
pub use peers::DeliveryStats;
pub use ring::{RING_VNODES_DEFAULT, Ring};

use crate::algorithm::{Bucket, CoreRng};
use crate::decision::{Decision, LeaseId};
use crate::key::{KeyHash, KeyHasherBuilder};
use crate::limit::{Limit, LimitSpec};
use crate::store::Store;
use crate::time::{Instant, duration_nanos};
use crate::wire::{Body, Decided, ForwardCheck, Grant, KeyState, LimitWire, Release, Report, SnapshotWire};
use keys::{Follower, KeyMeta, Participant};
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
    /// Delivery counters.
    pub delivery: DeliveryStats,
}

/// A check forwarded to an owner, waiting for its decision.
#[derive(Debug)]
struct PendingForward {
    request: RequestId,
    key: KeyHash,
    policy: Arc<Policy>,
    cost: u64,
    deadline: Instant,
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

    // --- Owner side --------------------------------------------------------------------------------

    /// Decides a check on a key this node owns. Exact mode decides on the bucket itself;
    /// approximate mode decides from the owner's own allowance, granted from the bucket like any
    /// follower's (so the owner takes its fair share, not whatever the followers left).
    fn decide_as_owner(&mut self, policy: &Arc<Policy>, key: KeyHash, cost: u64, now: Instant) -> Decision {
        self.stats.owner_decisions += 1;
        let limit = self.owner_limit(policy);
        let half_life = self.half_life_nanos();
        let mode = effective_mode(policy);
        let grants = self.grant_context(now);
        let rng = &mut self.rng;
        let (decision, tracked) = self.keys.upsert_with(
            key,
            &limit,
            now,
            || KeyMeta::new(policy.clone(), true),
            |bucket, meta| {
                meta.owned = true;
                meta.demand.add(cost.max(1), now, half_life);
                // Allowances out count as in use: the bucket must not refill under them.
                bucket.hold(&limit, meta.outstanding(), now);
                let decision = match mode {
                    api::Mode::Exact => bucket.check(&limit, cost, now, rng),
                    api::Mode::Approximate => {
                        if meta.own_allowance < cost.max(1) {
                            let self_demand = meta.demand.per_second(now, half_life);
                            let own = (self_demand, meta.own_allowance);
                            let grant = grants.size(bucket, &limit, &meta.participants, own, own);
                            bucket.force(&limit, grant, now);
                            meta.own_allowance += grant;
                        }
                        decide_from_allowance(bucket, &limit, &mut meta.own_allowance, cost, now)
                    }
                };
                (decision, decision.allowed && cost > 0)
            },
        );
        if tracked && self.config.replicate {
            self.replicas_due.insert(key);
        }
        decision
    }

    fn on_forward(&mut self, from: NodeId, checks: Vec<ForwardCheck>, now: Instant) {
        let mut decided = Vec::with_capacity(checks.len());
        for check in checks {
            let Ok(limit) = check.limit.to_limit() else {
                self.stats.items_refused += 1;
                continue;
            };
            let key = KeyHash(check.key);
            let policy =
                Arc::new(Policy { limit, mode: api::Mode::Exact, fallback: api::Fallback::LocalShare });
            let owner = self.ring.owner(key).unwrap_or(self.id);
            // A check for a key this node no longer owns (the views differ for a moment) is
            // decided by the fallback, and its hits are reported to the owner in this node's view.
            let decision = if owner == self.id {
                self.decide_as_owner(&policy, key, check.cost, now)
            } else {
                self.decide_by_fallback_now(owner, &policy, key, check.cost, now)
            };
            decided.push(Decided { id: check.id, decision: decision.into() });
        }
        if !decided.is_empty() {
            self.send(from, Body::Decided(decided), now);
        }
    }

    fn on_release(&mut self, releases: Vec<Release>, now: Instant) {
        for release in releases {
            match release.limit.to_limit() {
                Ok(limit) => {
                    self.keys.release(KeyHash(release.key), &limit, LeaseId(release.lease), now);
                }
                Err(_) => self.stats.items_refused += 1,
            }
        }
    }

    fn on_reports(&mut self, from: NodeId, reports: Vec<Report>, now: Instant) {
        let mut grants = Vec::with_capacity(reports.len());
        for report in reports {
            match self.apply_report(from, report, now) {
                Some(grant) => {
                    if self.config.replicate {
                        self.replicas_due.insert(KeyHash(grant.key));
                    }
                    grants.push(grant);
                }
                None => self.stats.items_refused += 1,
            }
        }
        if !grants.is_empty() {
            self.stats.grants_sent += grants.len() as u64;
            self.send(from, Body::Grant(grants), now);
        }
    }

    /// Applies one follower's report to the authoritative bucket and computes its next grant.
    fn apply_report(&mut self, from: NodeId, report: Report, now: Instant) -> Option<Grant> {
        let limit = report.limit.to_limit().ok()?;
        let key = KeyHash(report.key);
        let policy =
            Arc::new(Policy { limit, mode: api::Mode::Approximate, fallback: api::Fallback::LocalShare });
        let limit = self.owner_limit(&policy);
        let silence = duration_nanos(self.config.peer_silence);
        let half_life = self.half_life_nanos();
        let grants = self.grant_context(now);
        self.keys.upsert_with(
            key,
            &limit,
            now,
            || KeyMeta::new(policy.clone(), true),
            |bucket, meta| {
                if let Some(seed) = report.seed {
                    // Joining is idempotent: seeds from every follower may arrive, in any order.
                    bucket.join(&limit, seed.into(), now).ok()?;
                }
                bucket.force(&limit, report.uncovered, now);
                bucket.refund(&limit, report.returned, now);
                let participant = participant(&mut meta.participants, from, report.epoch, now);
                // Reports may arrive out of order: the sum of grants seen only grows.
                participant.seen = participant.seen.max(report.granted_seen);
                participant.holding = report.holding;
                participant.demand_per_s = report.demand_per_s;
                participant.heard_at = now;
                let holder = (participant.demand_per_s, participant.outstanding());
                // A participant silent for long is gone (crashed, or follows another owner): what
                // it held is released.
                meta.participants.retain(|p| p.heard_at.add_nanos(8 * silence) > now);
                // Allowances out count as in use: the bucket must not refill under them.
                bucket.hold(&limit, meta.outstanding(), now);
                let own = (meta.demand.per_second(now, half_life), meta.own_allowance);
                let grant = grants.size(bucket, &limit, &meta.participants, own, holder);
                bucket.force(&limit, grant, now);
                if let Some(p) = meta.participants.iter_mut().find(|p| p.node == from) {
                    p.sent = p.sent.saturating_add(grant);
                }
                let contended = grants.contended(&limit, &meta.participants, own.0);
                let state = bucket.export(now).into();
                Some(Grant { key: key.0, epoch: report.epoch, state, grant, contended })
            },
        )
    }

    /// Joins state from a key's (previous) owner: a handoff when ownership moved, or a replica
    /// kept in case the owner fails. Joining is conservative and idempotent either way.
    fn on_states(&mut self, states: Vec<KeyState>, replica: bool, now: Instant) {
        for state in states {
            let Ok(limit) = state.limit.to_limit() else {
                self.stats.items_refused += 1;
                continue;
            };
            let key = KeyHash(state.key);
            let owned = self.ring.owner(key) == Some(self.id);
            let policy = Arc::new(Policy {
                limit: limit.clone(),
                mode: api::Mode::Approximate,
                fallback: api::Fallback::LocalShare,
            });
            let joined = self.keys.upsert_with(
                key,
                &limit,
                now,
                || KeyMeta::new(policy, owned),
                |bucket, _| bucket.join(&limit, state.state.into(), now),
            );
            match (joined, replica) {
                (Ok(()), false) => self.stats.handoffs_received += 1,
                (Ok(()), true) => self.stats.replicas_received += 1,
                (Err(_), _) => self.stats.items_refused += 1,
            }
            if owned && self.config.replicate {
                self.replicas_due.insert(key);
            }
        }
    }

    /// Sends the state of owned keys that changed since the last tick to their ring successors,
    /// so that an owner's crash loses at most one interval.
    fn send_replicas(&mut self, now: Instant) {
        let mut batches: BTreeMap<NodeId, Vec<KeyState>> = BTreeMap::new();
        for key in std::mem::take(&mut self.replicas_due) {
            let Some(successor) = self.ring.successor(key).filter(|&s| s != self.id) else { continue };
            let Some(meta) = self.keys.extra(key).filter(|meta| meta.owned) else { continue };
            let limit = LimitWire::from_limit(&meta.policy.limit);
            let Some(state) = self.keys.export(key, now) else { continue };
            batches.entry(successor).or_default().push(KeyState { key: key.0, limit, state: state.into() });
        }
        for (successor, states) in batches {
            self.stats.replicas_sent += states.len() as u64;
            for chunk in states.chunks(self.config.sync_batch_len_max.max(1)) {
                self.send(successor, Body::Replica(chunk.to_vec()), now);
            }
        }
    }

    /// After a view change: hands keys this node owned and no longer owns to their new owners,
    /// and marks followed keys whose owner changed so their next report seeds the new owner.
    fn move_keys(&mut self, now: Instant) {
        let mut handoffs: BTreeMap<NodeId, Vec<KeyState>> = BTreeMap::new();
        let keys: Vec<KeyHash> = self.keys.keys().collect();
        for key in keys {
            let owner = self.ring.owner(key).unwrap_or(self.id);
            let me = self.id;
            let epoch = self.rng.next_u64();
            let moved = self.update_key(key, |bucket, meta| {
                let was_owned = meta.owned;
                meta.owned = owner == me;
                if was_owned && owner != me {
                    meta.participants.clear();
                    // The own allowance was debited in the bucket now handed over: keep using it.
                    let own_allowance = std::mem::take(&mut meta.own_allowance);
                    let follower = meta.follower();
                    follower.follow(owner, epoch);
                    follower.allowance = follower.allowance.saturating_add(own_allowance);
                    return Some(KeyState {
                        key: key.0,
                        limit: LimitWire::from_limit(&meta.policy.limit),
                        state: bucket.export(now).into(),
                    });
                }
                if !was_owned && owner == me {
                    // Becoming the owner: the last authoritative view is the starting point, and
                    // hits admitted here without an allowance are debited at once.
                    if let Some(follower) = meta.follower.take() {
                        bucket.force(&meta.policy.limit, follower.uncovered, now);
                        meta.own_allowance = meta.own_allowance.saturating_add(follower.allowance);
                    }
                    return None;
                }
                if let Some(follower) = meta.follower.as_mut().filter(|f| f.owner != Some(owner)) {
                    follower.follow(owner, epoch);
                    follower.seed_pending = true;
                }
                None
            });
            if let Some(state) = moved.flatten() {
                handoffs.entry(owner).or_default().push(state);
                self.dirty.insert(key);
            }
        }
        for (owner, states) in handoffs {
            self.stats.handoffs_sent += states.len() as u64;
            for chunk in states.chunks(self.config.sync_batch_len_max.max(1)) {
                self.send(owner, Body::Handoff(chunk.to_vec()), now);
            }
        }
    }

    // --- Follower side -----------------------------------------------------------------------------

    fn decide_as_follower(
        &mut self,
        owner: NodeId,
        policy: &Arc<Policy>,
        key: KeyHash,
        cost: u64,
        now: Instant,
    ) -> (Decision, Path) {
        let reachable = self.peers.reachable(owner, now);
        let half_life = self.half_life_nanos();
        let (num, den) = (1, self.cluster_len);
        let local_limit = self.scaled_limit(&policy.limit, num, den);
        let limit = policy.limit.clone();
        let rng = &mut self.rng;
        let (decision, path) = self.keys.upsert_with(
            key,
            &limit,
            now,
            || KeyMeta::new(policy.clone(), false),
            |bucket, meta| {
                let follower = meta.follower();
                if follower.owner != Some(owner) {
                    follower.follow(owner, rng.next_u64());
                }
                follower.demand.add(cost.max(1), now, half_life);
                if follower.over_until > now && cost > 0 {
                    let retry = follower.over_until.nanos_since(now);
                    let decision = bucket.peek(&limit, cost, now).refused_for(Some(retry));
                    return (decision, Path::Allowance);
                }
                if reachable && follower.granted {
                    let decision = decide_from_allowance(bucket, &limit, &mut follower.allowance, cost, now);
                    let path = match decision.retry_after {
                        Some(_) if !decision.allowed && !follower.contended => Path::Exhausted,
                        _ => Path::Allowance,
                    };
                    return (decision, path);
                }
                (decide_by_fallback(policy, &local_limit, follower, cost, now, rng), Path::Fallback)
            },
        );
        match path {
            Path::Allowance | Path::Exhausted => self.stats.allowance_decisions += 1,
            Path::Fallback => {
                self.stats.fallback_decisions += 1;
                self.fallbacks_since_sync += 1;
            }
        }
        self.dirty.insert(key);
        if reachable && (path != Path::Allowance || !decision.allowed) {
            self.report_early(owner, key, now);
        }
        (decision, path)
    }

    /// Sends one key's report now (no grant yet, or allowance exhausted), at most once per quarter
    /// interval per key.
    fn report_early(&mut self, owner: NodeId, key: KeyHash, now: Instant) {
        let gap = duration_nanos(self.config.sync_interval) / 4;
        let half_life = self.half_life_nanos();
        let report = self.update_key(key, |bucket, meta| {
            let follower = meta.follower.as_mut()?;
            if follower.reported_at.is_some_and(|at| at.add_nanos(gap) > now) {
                return None;
            }
            Some(take_report(key, bucket, &meta.policy.limit, follower, now, half_life))
        });
        if let Some(report) = report.flatten() {
            self.stats.reports_sent += 1;
            self.send(owner, Body::Report(vec![report]), now);
        }
    }

    fn on_grants(&mut self, from: NodeId, grants: Vec<Grant>, now: Instant) {
        for grant in grants {
            let key = KeyHash(grant.key);
            let applied = self.update_key(key, |bucket, meta| {
                let limit = meta.policy.limit.clone();
                let follower = meta.follower.as_mut()?;
                if follower.owner != Some(from) || follower.epoch != grant.epoch {
                    // An answer to a relationship this node has left (another owner, or state it
                    // lost): the owner debited the grant, so dropping it is conservative.
                    return None;
                }
                let imported = Bucket::import(&limit, grant.state.into(), now).ok()?;
                *bucket = imported;
                follower.granted = true;
                follower.granted_seen = follower.granted_seen.saturating_add(grant.grant);
                follower.allowance = follower.allowance.saturating_add(grant.grant);
                follower.contended = grant.contended;
                follower.local = None;
                follower.over_until = Instant::ZERO;
                if follower.allowance == 0 {
                    let probe = bucket.peek(&limit, 1, now);
                    if let Some(retry) = probe.retry_after.filter(|_| !probe.allowed) {
                        follower.over_until = now.add_duration(retry);
                    }
                }
                Some(())
            });
            if applied.flatten().is_none() {
                self.stats.items_refused += 1;
            }
        }
    }

    // --- Exact mode forwarding ---------------------------------------------------------------------

    fn forward(&mut self, owner: NodeId, request: CheckRequest, now: Instant) -> CheckOutcome {
        if !self.peers.reachable(owner, now) || self.pending.len() >= self.config.pending_forwards_max {
            let (decision, _) =
                self.decide_as_follower(owner, &request.policy, request.key, request.cost, now);
            return CheckOutcome::Decided(decision);
        }
        let id = self.next_forward_id;
        self.next_forward_id += 1;
        let check = ForwardCheck {
            id,
            key: request.key.0,
            limit: LimitWire::from_limit(&request.policy.limit),
            cost: request.cost,
        };
        let deadline = now.add_duration(self.config.forward_timeout);
        self.pending.insert(
            id,
            PendingForward {
                request: request.id,
                key: request.key,
                policy: request.policy,
                cost: request.cost,
                deadline,
            },
        );
        self.stats.forwarded += 1;
        let batch = self.outbox.entry(owner).or_default();
        batch.push(check);
        if batch.len() >= self.config.forward_batch_len_max {
            let batch = std::mem::take(batch);
            self.send_forwards(owner, batch, now);
        } else if self.flush_at.is_none() {
            self.flush_at = Some(now.add_duration(self.config.forward_wait));
        }
        CheckOutcome::Pending
    }

    fn flush_forwards(&mut self, now: Instant) {
        self.flush_at = None;
        let outbox = std::mem::take(&mut self.outbox);
        for (owner, batch) in outbox.into_iter().filter(|(_, b)| !b.is_empty()) {
            self.send_forwards(owner, batch, now);
        }
    }

    fn send_forwards(&mut self, owner: NodeId, batch: Vec<ForwardCheck>, now: Instant) {
        self.stats.forward_batches += 1;
        self.send(owner, Body::Forward(batch), now);
    }

    fn on_decided(&mut self, decided: Vec<Decided>, now: Instant) {
        for answer in decided {
            // An answer after the timeout finds nothing: the fallback decided already.
            let Some(pending) = self.pending.remove(&answer.id) else { continue };
            let decision: Decision = answer.decision.into();
            if let Some(retry) = decision.retry_after.filter(|_| !decision.allowed) {
                // The owner has no room until then: followers refuse locally, without asking.
                self.update_key(pending.key, |_, meta| {
                    if let Some(follower) = meta.follower.as_mut() {
                        follower.over_until = follower.over_until.max(now.add_duration(retry));
                    }
                });
            }
            self.events.push_back(Event::Decided { id: pending.request, decision });
        }
    }

    fn expire_forwards(&mut self, now: Instant) {
        while let Some(entry) = self.pending.first_entry() {
            if entry.get().deadline > now {
                break;
            }
            let pending = entry.remove();
            self.stats.forward_timeouts += 1;
            let owner = self.ring.owner(pending.key).unwrap_or(self.id);
            let decision = if owner == self.id {
                self.decide_as_owner(&pending.policy, pending.key, pending.cost, now)
            } else {
                self.decide_by_fallback_now(owner, &pending.policy, pending.key, pending.cost, now)
            };
            self.events.push_back(Event::Decided { id: pending.request, decision });
        }
    }

    /// A fallback decision regardless of reachability (the owner did not answer in time).
    fn decide_by_fallback_now(
        &mut self,
        owner: NodeId,
        policy: &Arc<Policy>,
        key: KeyHash,
        cost: u64,
        now: Instant,
    ) -> Decision {
        self.stats.fallback_decisions += 1;
        self.fallbacks_since_sync += 1;
        let local_limit = self.scaled_limit(&policy.limit, 1, self.cluster_len);
        let limit = policy.limit.clone();
        let rng = &mut self.rng;
        let decision = self.keys.upsert_with(
            key,
            &limit,
            now,
            || KeyMeta::new(policy.clone(), false),
            |_, meta| {
                let follower = meta.follower();
                follower.owner = Some(owner);
                decide_by_fallback(policy, &local_limit, follower, cost, now, rng)
            },
        );
        self.dirty.insert(key);
        decision
    }

    // --- Sync tick ---------------------------------------------------------------------------------

    fn sync(&mut self, now: Instant) {
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

    /// One report per key with news, batched per owner.
    fn send_reports(&mut self, now: Instant) {
        let half_life = self.half_life_nanos();
        let mut batches: BTreeMap<NodeId, Vec<Report>> = BTreeMap::new();
        let dirty = std::mem::take(&mut self.dirty);
        for key in dirty {
            let owner = self.ring.owner(key).unwrap_or(self.id);
            if owner == self.id || !self.peers.reachable(owner, now) {
                // Unreachable owner: keep the news for later; owned: nothing to report.
                if owner != self.id {
                    self.dirty.insert(key);
                }
                continue;
            }
            let report = self.update_key(key, |bucket, meta| {
                let follower = meta.follower.as_mut()?;
                let report = take_report(key, bucket, &meta.policy.limit, follower, now, half_life);
                let active = report.demand_per_s > 0
                    || report.holding > 0
                    || report.uncovered.saturating_add(report.returned) > 0;
                active.then_some(report)
            });
            if let Some(report) = report.flatten() {
                // A key still in demand (or holding an allowance) reports again next tick.
                self.dirty.insert(key);
                batches.entry(owner).or_default().push(report);
            }
        }
        for (owner, reports) in batches {
            self.stats.reports_sent += reports.len() as u64;
            for chunk in reports.chunks(self.config.sync_batch_len_max.max(1)) {
                self.send(owner, Body::Report(chunk.to_vec()), now);
            }
        }
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

    fn grant_context(&self, now: Instant) -> GrantContext {
        GrantContext {
            now,
            silence_nanos: duration_nanos(self.config.peer_silence),
            interval: self.config.sync_interval,
        }
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

/// How a follower decided.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    /// From its allowance (or refused while the owner says the key is over its limit).
    Allowance,
    /// Refused: the allowance is spent though the owner may have room.
    Exhausted,
    /// By the fallback policy.
    Fallback,
}

/// Takes a follower's news for a report, returning allowance it holds beyond its need.
fn take_report(
    key: KeyHash,
    bucket: &Bucket,
    limit: &Limit,
    follower: &mut Follower,
    now: Instant,
    half_life: u64,
) -> Report {
    let demand_per_s = follower.demand.per_second(now, half_life);
    // Keep what the coming interval needs (see `need_for`); give back the rest.
    let need = need_for(demand_per_s, half_life / 2);
    if follower.allowance > need {
        follower.returned = follower.returned.saturating_add(follower.allowance - need);
        follower.allowance = need;
    }
    let seed = follower.seed_pending.then(|| SnapshotWire::from(bucket.export(now)));
    let report = Report {
        key: key.0,
        limit: LimitWire::from_limit(limit),
        epoch: follower.epoch,
        holding: follower.allowance,
        granted_seen: follower.granted_seen,
        uncovered: std::mem::take(&mut follower.uncovered),
        returned: std::mem::take(&mut follower.returned),
        demand_per_s,
        seed,
    };
    follower.seed_pending = false;
    follower.reported_at = Some(now);
    report
}

/// Hits a node with `demand_per_s` needs to hold for `window_nanos`, with headroom for bursts.
fn need_for(demand_per_s: u64, interval_nanos: u64) -> u64 {
    let expected = u128::from(demand_per_s) * u128::from(interval_nanos) / 1_000_000_000;
    let expected = u64::try_from(expected).unwrap_or(u64::MAX);
    // An interval's demand and half again, plus a little: enough to last until the next grant
    // most of the time. Holding more would strand capacity at nodes that do not need it now; a
    // node that runs dry asks the owner, which keeps what nobody holds.
    expected.saturating_add(NEED_SLACK)
}

/// What sizing a grant takes besides the key's own state.
#[derive(Clone, Copy)]
struct GrantContext {
    now: Instant,
    silence_nanos: u64,
    interval: core::time::Duration,
}

impl GrantContext {
    /// Whether the recent demand of the owner and its active participants clearly exceeds the
    /// rate (by a quarter: demand estimates over a few intervals are noisy).
    fn contended(&self, limit: &Limit, participants: &[Participant], own_demand: u64) -> bool {
        let demand = self.active(participants).fold(own_demand, |sum, p| sum.saturating_add(p.demand_per_s));
        let rate = limit.rate_per_second();
        demand > rate.saturating_add(rate / 4)
    }

    /// The participants heard from within the silence bound.
    fn active<'p>(&self, participants: &'p [Participant]) -> impl Iterator<Item = &'p Participant> + 'p {
        let (now, silence) = (self.now, self.silence_nanos);
        participants.iter().filter(move |p| p.heard_at.add_nanos(silence) > now)
    }

    /// The allowance to add for a holder with `(demand per second, allowance held)`: its demand's
    /// share of everything not yet admitted, minus what it holds, capped by its need (two intervals
    /// of its demand) and by what the bucket can give. `own` is the owner's own demand and
    /// allowance; `participants` are the followers (silent ones do not count).
    ///
    /// "Everything not yet admitted" is the allowances held and what the bucket will hold one
    /// interval from now: granting the coming refill early keeps holders from running dry between
    /// grants; the bucket goes into debt by at most one interval of refill, paid back by that very
    /// refill, and never holds more than its capacity.
    fn size(
        &self,
        bucket: &Bucket,
        limit: &Limit,
        participants: &[Participant],
        own: (u64, u64),
        holder: (u64, u64),
    ) -> u64 {
        let (demand_sum, held_sum) = self
            .active(participants)
            .fold(own, |(d, h), p| (d.saturating_add(p.demand_per_s), h.saturating_add(p.outstanding())));
        let (demand, held) = holder;
        if demand_sum == 0 || demand == 0 {
            return 0;
        }
        let horizon = self.now;
        let available = bucket.peek(limit, 0, horizon).remaining;
        let pool = u128::from(available.saturating_add(held_sum));
        let fair = u64::try_from(pool * u128::from(demand) / u128::from(demand_sum)).unwrap_or(u64::MAX);
        let need = need_for(demand, duration_nanos(self.interval));
        fair.min(need).saturating_sub(held).min(available)
    }
}

/// The participant entry of `node` for `epoch`; a new epoch starts the accounting afresh (the
/// follower lost its state, or follows this owner anew).
fn participant(
    participants: &mut Vec<Participant>,
    node: NodeId,
    epoch: u64,
    now: Instant,
) -> &mut Participant {
    let fresh = Participant { node, epoch, sent: 0, seen: 0, holding: 0, demand_per_s: 0, heard_at: now };
    let index = match participants.iter().position(|p| p.node == node) {
        Some(index) => index,
        None => {
            participants.push(fresh);
            participants.len() - 1
        }
    };
    let participant = &mut participants[index];
    if participant.epoch != epoch {
        *participant = fresh;
    }
    participant
}

/// Decides from the allowance: pass while it lasts; refuse with the authoritative state's view of
/// when the request could pass.
fn decide_from_allowance(
    bucket: &Bucket,
    limit: &Limit,
    allowance: &mut u64,
    cost: u64,
    now: Instant,
) -> Decision {
    let auth = bucket.peek(limit, cost, now);
    if *allowance >= cost.max(1) {
        *allowance -= cost;
        let mut decision = auth;
        decision.allowed = true;
        decision.retry_after = None;
        decision.remaining = allowance.saturating_add(bucket.peek(limit, 0, now).remaining);
        return decision;
    }
    if cost > limit.capacity() {
        return auth.refused_for(None);
    }
    // The allowance is spent; a new grant comes within an interval (or sooner: an early report).
    let retry = auth.retry_after.map_or(1, crate::time::duration_nanos).max(1);
    auth.refused_for(Some(retry))
}

/// Decides by the policy's fallback, counting admitted hits as uncovered (to be reported).
fn decide_by_fallback(
    policy: &Policy,
    local_limit: &Limit,
    follower: &mut Follower,
    cost: u64,
    now: Instant,
    rng: &mut CoreRng,
) -> Decision {
    let limit = policy.limit.reported_limit();
    let decision = match policy.fallback {
        api::Fallback::LocalShare => {
            let local = follower.local.get_or_insert_with(|| Bucket::new(local_limit, now));
            local.check(local_limit, cost, now, rng)
        }
        api::Fallback::FailOpen => Decision::admitted_blind(limit),
        // Nothing is known about when the owner will be back: retry after an interval.
        api::Fallback::FailClosed => {
            Decision::admitted_blind(limit).refused_for(Some(FAIL_CLOSED_RETRY_NANOS))
        }
    };
    if decision.allowed {
        follower.uncovered = follower.uncovered.saturating_add(cost);
    }
    decision
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
    };
    Limit::new(scaled).unwrap_or_else(|_| limit.clone())
}

#[cfg(test)]
mod tests;
