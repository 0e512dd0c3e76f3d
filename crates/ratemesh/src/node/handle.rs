//! [`Node`]: the handle applications hold — checks, releases, members, shared values, top keys,
//! metrics, the graceful leave.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ratemesh_core::{
    CheckOutcome, CheckRequest, Decision, KeyHash, LeaseId, LeavePlan, MemberView, NodeStats, Policy,
    RequestId, StoreStats,
};
use tokio::sync::{oneshot, watch};
use tracing::{Instrument, debug, info, info_span};

use super::{
    CheckError, MissingMember, NamedPolicy, NodeMetrics, Released, SHARED_VALUE_BYTES_MAX, SHARED_VALUES_MAX,
    Shared, SharedValuesError, State, TopLabel, TopReport, lane_index,
};
use crate::durable::SnapshotMetrics;
use crate::gossip::GossipHealth;
use crate::membership::{Member, MemberStatus};
use crate::top::{TopBy, TopConfig, TopQuestion, TopSummary, decode_reply, encode_message, merge};
use ratemesh_core::NodeId;

/// A running ratemesh node. Cheap to clone; every clone is the same node.
///
/// # Example
///
/// Two nodes of one cluster on loopback, a token bucket of 10 per second shared by both:
///
/// ```
/// use std::time::Duration;
/// use ratemesh::{ClusterSecurity, NamedPolicy, NodeBuilder, NodeId, MemberStatus};
/// use ratemesh_core::{Algorithm, Limit, LimitSpec, Mode, Policy};
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
/// let policy = NamedPolicy::new("api", Policy::new(limit, Mode::Exact));
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
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.shared.id)
            .field("quic_addr", &self.shared.quic_addr)
            .finish()
    }
}

impl Node {
    /// The handle of a started node.
    pub(super) fn new(shared: Arc<Shared>) -> Node {
        Node { shared }
    }

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

    /// How many lanes the node runs ([`crate::NodeBuilder::lanes`]).
    pub fn lanes(&self) -> usize {
        self.shared.lanes.len()
    }

    /// The lane that holds the bucket named by `bucket` (a key under a policy:
    /// [`NamedPolicy::key`]), below [`Node::lanes`]. Checks of different lanes share no lock and
    /// no state; threads that each check the keys of their own lanes (a dispatcher that routes
    /// each key to its lane's thread) share no cache line either, and scale with cores. Threads
    /// that check keys of every lane pay for the lanes' cache lines moving between cores instead.
    pub fn lane_of(&self, bucket: KeyHash) -> usize {
        lane_index(bucket, self.shared.lanes.len())
    }

    /// Checks `cost` hits (0: a query) of `key` under `policy`. Decided locally in approximate
    /// mode (waits only when the local allowance ran dry and the owner may have more); forwarded
    /// to the key's owner in exact mode. Never waits much longer than `NodeConfig::forward_timeout`:
    /// then the fallback decides.
    ///
    /// The check is counted in the policy's top-keys sketches ([`Node::top`]) under its name.
    pub async fn check(&self, policy: &NamedPolicy, key: &[u8], cost: u64) -> Result<Decision, CheckError> {
        let bucket = policy.key(key);
        let label = TopLabel { policy: policy.name(), key };
        self.check_labelled(&policy.policy, bucket, cost, Some(label), Some(bucket)).await
    }

    /// Counts a check under `label` in the top-keys shard of the lane whose state is `state` (its
    /// key's); `label_bucket` as in [`crate::top::TopTable::record`].
    fn record_top(
        &self,
        state: &mut State,
        now: ratemesh_core::Instant,
        label: TopLabel<'_>,
        label_bucket: Option<KeyHash>,
        cost: u64,
        decision: &Decision,
    ) {
        self.shared.top.record(&mut state.top, now, label, label_bucket, cost, !decision.allowed);
    }

    /// [`Node::check`] of a bucket named by its hash, for callers that keep their own key
    /// namespaces (the daemon: variants, tiers, inline limits). With a `label`, the check is
    /// counted in the top-keys sketches ([`Node::top`]) of `label.policy` under `label.key`.
    pub async fn check_hashed(
        &self,
        policy: &Arc<Policy>,
        key: KeyHash,
        cost: u64,
        label: Option<TopLabel<'_>>,
    ) -> Result<Decision, CheckError> {
        // The bucket may be a variant's (a tier, an override): the sketch hashes the label itself.
        self.check_labelled(policy, key, cost, label, None).await
    }

    /// [`Node::check_hashed`], with the bucket of the label's key under its policy's name when the
    /// caller has it (see [`crate::top::TopTable::record`]).
    async fn check_labelled(
        &self,
        policy: &Arc<Policy>,
        key: KeyHash,
        cost: u64,
        label: Option<TopLabel<'_>>,
        label_bucket: Option<KeyHash>,
    ) -> Result<Decision, CheckError> {
        let decision = self
            .decide_with(key, |core, id, now| {
                core.handle_check(now, CheckRequest { id, key, policy: policy.clone(), cost })
            })
            .await?;
        if let Some(label) = label {
            // Decided under the lane's lock, perhaps long ago: recorded under it again, now.
            let mut state = self.shared.lane(key).lock();
            self.record_top(&mut state, self.shared.now(), label, label_bucket, cost, &decision);
        }
        Ok(decision)
    }

    /// Runs one client input about `key` (`input` hands it to the core of the key's lane under
    /// its lock, with a fresh request id and the node's `now`) and waits for its decision when
    /// the core answers later.
    pub(crate) async fn decide_with(
        &self,
        key: KeyHash,
        input: impl FnOnce(&mut ratemesh_core::Node, RequestId, ratemesh_core::Instant) -> CheckOutcome,
    ) -> Result<Decision, CheckError> {
        let lane = self.shared.lane(key);
        let waiter = {
            let mut state = lane.lock();
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
            self.shared.after_input(lane, &mut state);
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
        let hash = policy.key(key);
        let lane = self.shared.lane(hash);
        let mut state = lane.lock();
        if state.leaving {
            return Err(CheckError::ShutDown);
        }
        let now = self.shared.now();
        let decision = match state.core.handle_check_now(now, hash, &policy.policy, cost) {
            Some(decision) => Ok(decision),
            None if !state.core.is_serving(now) => Err(CheckError::Joining),
            None => Err(CheckError::WouldWait),
        };
        self.shared.after_check_now(lane, &mut state);
        if let Ok(decision) = &decision {
            // Under the lock the check was decided under, at the decision's instant.
            self.record_top(
                &mut state,
                now,
                TopLabel { policy: policy.name(), key },
                Some(hash),
                cost,
                decision,
            );
        }
        decision
    }

    /// Releases a concurrency lease that an admitted check of the bucket `bucket` (a key under
    /// `policy`: [`NamedPolicy::key`], [`NamedPolicy::policy`]) took: sent to the key's owner when
    /// it is another node; a lease that is never released expires after the policy's period.
    pub fn release(&self, policy: &Policy, bucket: KeyHash, lease: LeaseId) -> Result<Released, CheckError> {
        let lane = self.shared.lane(bucket);
        let mut state = lane.lock();
        if state.leaving {
            return Err(CheckError::ShutDown);
        }
        let now = self.shared.now();
        let owner = state.core.owner_of(bucket).unwrap_or(self.shared.id);
        let ended = state.core.handle_release(now, bucket, policy, lease);
        self.shared.after_input(lane, &mut state);
        Ok(match (owner == self.shared.id, ended) {
            (false, _) => Released::SentToOwner(owner),
            (true, true) => Released::Ended,
            (true, false) => Released::NotHeld,
        })
    }

    /// Whether the node takes checks: not while it joins (its first few gossip rounds) or leaves.
    pub fn is_serving(&self) -> bool {
        let state = self.shared.first_lane();
        !state.leaving && state.core.is_serving(self.shared.now())
    }

    /// Waits until the node's join grace has passed (at once for a node started without seeds).
    /// A node that is leaving never serves again: this returns at once and checks fail.
    pub async fn wait_serving(&self) {
        let until = self.shared.first_lane().core.joining_until();
        tokio::time::sleep_until(self.shared.tokio_instant(until)).await;
    }

    /// The members this node knows, itself included, sorted by id.
    pub fn members(&self) -> Vec<Member> {
        self.shared.members.borrow().clone()
    }

    /// The membership view the core decides by (every lane holds the same one): the members in
    /// the ring, those counted as dead, and the region of each that names one. It changes with
    /// [`Node::members`], but holds only members confirmed by mutual TLS.
    pub fn member_view(&self) -> MemberView {
        self.shared.first_lane().view.clone()
    }

    /// The members, as a watch channel that changes with them: wait on it (with a timeout) for
    /// the cluster to form.
    pub fn subscribe_members(&self) -> watch::Receiver<Vec<Member>> {
        self.shared.members.clone()
    }

    /// The owner, in this node's current ring, of the bucket named by `bucket` (a key under a
    /// policy: [`NamedPolicy::key`]).
    pub fn owner_of(&self, bucket: KeyHash) -> Option<NodeId> {
        self.shared.lane(bucket).lock().core.owner_of(bucket)
    }

    /// Each member's part of the key space in this node's current ring, exactly
    /// ([`ratemesh_core::Ring::shares`]): `(member, share)` by member id, summing to 1. The ring is
    /// copied under the node's lock and measured outside it.
    pub fn ring_shares(&self) -> Vec<(NodeId, f64)> {
        let ring = self.shared.first_lane().core.ring().clone();
        ring.shares()
    }

    /// Whether this node is on its own ring: it owns keys and answers for them (a node is off its
    /// ring before its first view that has it live, and after the handoff of a graceful leave).
    pub fn is_on_ring(&self) -> bool {
        let state = self.shared.first_lane();
        state.core.ring().contains(state.core.id())
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
        let (mut summaries, mut window) = self.shared.top_summaries(policy, by);
        let question = encode_message(&TopQuestion { policy: policy.to_owned(), by });
        let decode = |bytes: &[u8]| decode_reply(bytes).map_err(|e| e.to_string());
        let (replies, answered, missing) = self.ask_members(question, decode).await;
        for (_, reply) in replies {
            window = window.max(Duration::from_nanos(reply.window_nanos));
            summaries.extend(reply.summaries);
        }
        TopReport { answer: merge(&summaries, n, window), answered, missing }
    }

    /// Asks every other live member `question` over the peer transport (mutual TLS) at once, and
    /// waits at most the top query timeout for each: the answers `decode` accepts, by member;
    /// the members that answered, this node included, sorted; and those that did not answer in
    /// time, could not be reached or answered what `decode` refuses, with why. The one fan-out
    /// of [`Node::top`] and [`Node::audit`].
    pub(super) async fn ask_members<T: Send + 'static>(
        &self,
        question: Vec<u8>,
        decode: fn(&[u8]) -> Result<T, String>,
    ) -> (Vec<(NodeId, T)>, Vec<NodeId>, Vec<MissingMember>) {
        let mut asked = tokio::task::JoinSet::new();
        for member in self.members() {
            if member.id == self.shared.id || member.status != MemberStatus::Live {
                continue;
            }
            let (transport, question) = (Arc::clone(&self.shared.transport), question.clone());
            let limit = self.shared.top_query_timeout;
            asked.spawn(async move {
                let answer = transport.query(member.id, member.quic_addr, &question, limit).await;
                let reply = answer.map_err(|e| e.to_string()).and_then(|bytes| decode(&bytes));
                (member.id, reply)
            });
        }
        let (mut replies, mut answered, mut missing) = (Vec::new(), vec![self.shared.id], Vec::new());
        while let Some(joined) = asked.join_next().await {
            // A query task only panics on a bug; its member then counts as missing.
            let Ok((member, reply)) = joined else { continue };
            match reply {
                Ok(reply) => {
                    replies.push((member, reply));
                    answered.push(member);
                }
                Err(reason) => missing.push(MissingMember { id: member, reason }),
            }
        }
        answered.sort_unstable();
        missing.sort_unstable_by_key(|m| m.id);
        (replies, answered, missing)
    }

    /// This node's own sketches of `policy` (what it answers other members): its summaries and
    /// the span they cover.
    pub fn top_local(&self, policy: &str, by: TopBy) -> (Vec<TopSummary>, Duration) {
        self.shared.top_summaries(policy, by)
    }

    /// The bounds of the top-keys sketches.
    pub fn top_config(&self) -> &TopConfig {
        self.shared.top.config()
    }

    /// The members whose shares this node's owned keys count, the fewest any lane counts
    /// ([`ratemesh_core::Node::members_counted`]): below the live members, owners enforce the
    /// reachable members' part of every limit.
    pub fn members_counted(&self) -> usize {
        self.shared.lanes.iter().map(|lane| lane.lock().core.members_counted()).min().unwrap_or(0)
    }

    /// Heap bytes held by this node's top-keys sketches, and checks not recorded because
    /// `TopConfig::policies_max` policies are recorded already.
    pub fn top_memory(&self) -> (usize, u64) {
        (self.shared.top_heap_bytes(), self.shared.top.unrecorded())
    }

    /// Counters and gauges, for metrics.
    /// The counters of the lanes add up (but views applied and sync rounds, which every lane
    /// counts alike: the first lane's); the sync lag is the largest lane's, a peer's round trip
    /// the first lane's that measured one.
    pub fn metrics(&self) -> NodeMetrics {
        let (mut protocol, mut store) = (NodeStats::default(), StoreStats::default());
        let (mut keys, mut checks_waiting, mut sync_lag) = (0, 0, Duration::ZERO);
        let (mut round_trips, mut first) = (BTreeMap::new(), None);
        for lane in &self.shared.lanes {
            let state = lane.lock();
            first.get_or_insert(state.core.stats());
            protocol += state.core.stats();
            store += state.core.store_stats();
            keys += state.core.keys_len();
            checks_waiting += state.waiters.len();
            sync_lag = sync_lag.max(state.timer_lag);
            for (peer, round_trip) in state.core.round_trips() {
                round_trips.entry(peer).or_insert(round_trip);
            }
        }
        protocol.delivery.malformed += self.shared.frames_unlaned.load(Ordering::Relaxed);
        // Every lane applies every view and runs a round every interval: counted once, as one
        // lane sees them.
        if let Some(first) = first {
            (protocol.membership_changes, protocol.sync_rounds) =
                (first.membership_changes, first.sync_rounds);
        }
        let members = self.shared.members.borrow();
        let count = |status: MemberStatus| members.iter().filter(|m| m.status == status).count();
        NodeMetrics {
            protocol,
            store,
            transport: self.shared.transport.stats(),
            gossip: self.shared.gossip_counters.stats(),
            keys,
            members_live: count(MemberStatus::Live),
            members_dead: count(MemberStatus::Dead),
            members_unverified: count(MemberStatus::Unverified),
            members_counted: self.members_counted(),
            checks_waiting,
            sync_lag,
            peer_round_trips: round_trips.into_iter().collect(),
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
        let Some(announced) = self.shared.announce_leave().await else {
            // Another shutdown is under way: return when it is done.
            let _ = self.shared.stop.subscribe().wait_for(|stopped| *stopped).await;
            return;
        };
        let own_for = announced.own_for;
        let plan = LeavePlan { own_for, drain_for: self.shared.leave_linger };
        let left = self.shared.left.notified();
        self.shared.each_lane(|state| state.core.handle_leave(self.shared.now(), plan));
        // Every live peer showed the leave in its gossip: the keys are handed over then, not at
        // the end of `own_for` (which bounds the wait for a peer that is slow or not heard).
        let heard = async {
            self.shared.gossip_heard.wait_for(&announced.peers, announced.version).await;
            debug!("every live member knows of the leave: handing over");
            self.shared.each_lane(|state| state.core.handle_leave_heard(self.shared.now()));
            std::future::pending::<()>().await
        };
        // Every lane's core emits `Left` by its own deadline (owning, then the drain bound); the
        // timeout only guards against a stopped timer task.
        let bound = own_for + self.shared.leave_linger + self.shared.gossip_interval;
        if !self.shared.has_left() {
            let _ = tokio::time::timeout(bound, async {
                tokio::select! {
                    () = left => {}
                    () = heard => {}
                }
            })
            .await;
        }
        let (mut handoffs, mut unacked) = (0, 0);
        for lane in &self.shared.lanes {
            let state = lane.lock();
            (handoffs, unacked) =
                (handoffs + state.core.stats().handoffs_sent, unacked + state.core.unacked_frames());
        }
        info!(handoffs, unacked, "leaving: keys handed over and acknowledged (or drain bound reached)");
        self.shared.stop().await;
    }
}
