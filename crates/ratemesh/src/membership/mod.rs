//! Membership: chitchat gossip proposes members, mutual TLS confirms them.
//!
//! Every node runs a chitchat instance (UDP gossip, phi-accrual failure detection) whose node id
//! is the decimal [`NodeId`] and whose key-values carry the node's QUIC address
//! ([`KEY_QUIC_ADDR`]), the core's wire version ([`KEY_PROTOCOL`]), its region if it names one
//! ([`KEY_REGION`]) and, while it leaves gracefully, [`KEY_LEAVING`]. Gossip is not authenticated, so a gossip entry is only a
//! *proposal*: a member enters the ring after [`PeerTransport::verify`] completed a mutual-TLS
//! handshake with the advertised address whose certificate names that member. An entry that
//! fails is retried with an exponential backoff and never owns keys meanwhile.
//!
//! The view handed to the core ([`MemberView`]) is: this node and the verified live members
//! (`live`), plus verified members the failure detector declared dead and chitchat has not
//! garbage-collected yet (`dead`; they count in the cluster's size, which keeps the sides of a
//! partition near one limit). Members that announced a graceful leave are in neither. Its
//! `regions` are those members' advertised regions (but [`Region::NONE`]); a malformed region
//! value counts as none and is counted ([`crate::GossipStats::malformed_regions`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chitchat::{Chitchat, ChitchatId, NodeState};
use ratemesh_core::{MemberView, NodeId, RegionId};
use tokio::sync::{Mutex as AsyncMutex, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{info, info_span, warn};

use crate::gossip::GossipCounters;
use crate::region::Region;
use crate::transport::PeerTransport;

mod proposal;

use proposal::{Check, Proposal, propose};
pub(crate) use proposal::{chitchat_node_id, parse_node_id};

/// Gossip key: the member's QUIC address (`ip:port`).
pub const KEY_QUIC_ADDR: &str = "ratemesh.quic_addr";
/// Gossip key: the core's wire version the member speaks (a member speaking another is ignored).
pub const KEY_PROTOCOL: &str = "ratemesh.protocol";
/// Gossip key: present while the member leaves gracefully (it is then no longer in any view).
pub const KEY_LEAVING: &str = "ratemesh.leaving";
/// Gossip key: the member's region name ([`Region`]); absent when it names none.
pub const KEY_REGION: &str = "ratemesh.region";

/// The first retry of a failed verification; it doubles up to [`VERIFY_RETRY_MAX`].
const VERIFY_RETRY_INITIAL: Duration = Duration::from_millis(250);
/// The longest wait between verifications of a member that keeps failing.
const VERIFY_RETRY_MAX: Duration = Duration::from_secs(30);
/// Verifications in flight at once (each is a handshake with a timeout).
const VERIFY_IN_FLIGHT_MAX: usize = 64;
/// Unverified members proposed at once (bounds the verification work and the member list against
/// a flood of fake gossip entries; verified members are always proposed on top).
const CANDIDATES_MAX: usize = 4096;
/// Distinct addresses reported per proposed member (its verified address is always reported on
/// top).
const ADDRS_PER_ID_MAX: usize = 8;

/// How a member looks from this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemberStatus {
    /// In the ring: alive by gossip and confirmed by mutual TLS.
    Live,
    /// Confirmed once, now declared dead by the failure detector (counts in the cluster's size,
    /// owns no keys) until chitchat forgets it.
    Dead,
    /// Alive by gossip but not (yet) confirmed by mutual TLS: owns no keys.
    Unverified,
}

/// A member of the cluster as this node sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Member {
    /// The member.
    pub id: NodeId,
    /// Its QUIC address as gossiped (this node's own for itself).
    pub quic_addr: SocketAddr,
    /// Its status.
    pub status: MemberStatus,
    /// Its region as gossiped ([`Region::NONE`] when it names none; this node's own for itself).
    pub region: Region,
}

/// A verification that failed, and when to try again.
#[derive(Clone, Copy, Debug)]
struct Failure {
    /// The generation that failed: a new generation at the same address starts a fresh backoff.
    generation: u64,
    failures: u32,
    retry_at: Instant,
}

/// The membership task's state: which members mutual TLS confirmed, at which address.
pub(crate) struct Membership {
    me: Member,
    transport: Arc<dyn PeerTransport>,
    /// The running gossip instance (replaced when it is restarted).
    chitchat: watch::Receiver<Arc<AsyncMutex<Chitchat>>>,
    /// Members confirmed by mutual TLS, at the address that was verified.
    verified: HashMap<NodeId, SocketAddr>,
    /// Failed verifications by (member, address); pruned to the addresses still proposed.
    failed: HashMap<(NodeId, SocketAddr), Failure>,
    /// Verifications in flight, by (member, address).
    verifying: HashSet<(NodeId, SocketAddr)>,
    /// What each verification task checks (a task that panics reports only its id).
    tasks: HashMap<tokio::task::Id, Check>,
    checks: JoinSet<(Check, bool)>,
    /// The newest generation seen of each id that has an entry in gossip: older generations of
    /// an id never count again once a newer one was seen (see [`generations`]).
    newest: HashMap<NodeId, u64>,
    /// Entries (id, generation) already counted for advertising a malformed region; pruned to
    /// the ids present in gossip.
    regions_malformed: HashSet<(NodeId, u64)>,
    counters: Arc<GossipCounters>,
    view: MemberView,
}

/// Where the membership task publishes what it decided.
pub(crate) trait ViewSink: Send + Sync + 'static {
    /// The view changed: apply it to the core, with the verified QUIC addresses of its members.
    fn apply(&self, view: &MemberView, addrs: &HashMap<NodeId, SocketAddr>);
}

impl Membership {
    /// The membership of `me`, reading gossip from the instance `gossip` holds (a restarted
    /// instance replaces it there).
    pub(crate) fn new(
        me: Member,
        transport: Arc<dyn PeerTransport>,
        gossip: watch::Receiver<Arc<AsyncMutex<Chitchat>>>,
        counters: Arc<GossipCounters>,
    ) -> Membership {
        Membership {
            me,
            transport,
            chitchat: gossip,
            verified: HashMap::new(),
            failed: HashMap::new(),
            verifying: HashSet::new(),
            tasks: HashMap::new(),
            checks: JoinSet::new(),
            newest: HashMap::new(),
            regions_malformed: HashSet::new(),
            counters,
            view: MemberView { live: vec![me.id], dead: Vec::new(), regions: regions_of([&me]) },
        }
    }

    /// Runs until `stop` turns true: re-reads gossip when its live set changes, when a
    /// verification ends, when the gossip instance was restarted, and every `recheck` (dead-node
    /// garbage collection and verification retries do not wake the watcher).
    pub(crate) async fn run(
        mut self,
        sink: Arc<dyn ViewSink>,
        members: watch::Sender<Vec<Member>>,
        recheck: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut live_watch = self.live_watcher().await;
        let mut ticks = tokio::time::interval(recheck);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let proposal = self.read_proposal().await;
            self.start_checks(&proposal, Instant::now());
            self.publish(&proposal, sink.as_ref(), &members);
            let mut restarted = false;
            tokio::select! {
                changed = self.chitchat.changed() => {
                    if changed.is_err() { return }
                    restarted = true;
                }
                // An instance that ended closes its watcher: wait for the restarted one.
                _ = live_watch.changed(), if live_watch.has_changed().is_ok() => {}
                Some(done) = self.checks.join_next_with_id() => {
                    let (task, outcome) = match done {
                        Ok((task, (check, ok))) => (task, Some((check, ok))),
                        Err(error) => (error.id(), None),
                    };
                    let check = self.tasks.remove(&task);
                    match (outcome, check) {
                        (Some((check, ok)), _) => self.record_check(check, ok, Instant::now()),
                        // The task panicked (or was cancelled): count it as a failed check, so
                        // that it is retried with backoff instead of staying in flight forever.
                        (None, Some(check)) => self.record_check(check, false, Instant::now()),
                        (None, None) => {}
                    }
                }
                _ = ticks.tick() => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            if restarted {
                // A restarted instance: watch its live set from now on.
                live_watch = self.live_watcher().await;
            }
        }
    }

    /// The live-set watcher of the current gossip instance.
    async fn live_watcher(&mut self) -> watch::Receiver<BTreeMap<ChitchatId, NodeState>> {
        let current = self.chitchat.borrow_and_update().clone();
        let chitchat = current.lock().await;
        chitchat.live_nodes_watcher()
    }

    async fn read_proposal(&mut self) -> Proposal {
        let chitchat = self.chitchat.borrow().clone();
        let chitchat = chitchat.lock().await;
        let proposal = propose(&chitchat, self.me.id, &self.verified, &mut self.newest);
        drop(chitchat);
        self.count_malformed_regions(&proposal);
        proposal
    }

    /// Counts each entry of `proposal` that advertises a malformed region once.
    fn count_malformed_regions(&mut self, proposal: &Proposal) {
        self.regions_malformed.retain(|(id, _)| self.newest.contains_key(id));
        for &entry in &proposal.regions_malformed {
            if self.regions_malformed.insert(entry) {
                warn!(peer = ?entry.0, generation = entry.1, "gossip member advertises a malformed region: taken as none");
                self.counters.malformed_region();
            }
        }
    }

    /// Starts a verification of the newest generation's address of every proposed member not
    /// verified there and not in its retry backoff at `now` (a new generation resets the
    /// backoff).
    fn start_checks(&mut self, proposal: &Proposal, now: Instant) {
        for candidate in &proposal.live {
            let check = candidate.newest;
            let key = (check.id, check.quic_addr);
            let verified = self.verified.get(&check.id) == Some(&check.quic_addr);
            let backing_off = self
                .failed
                .get(&key)
                .is_some_and(|failure| failure.generation == check.generation && failure.retry_at > now);
            if verified
                || backing_off
                || self.verifying.contains(&key)
                || self.verifying.len() >= VERIFY_IN_FLIGHT_MAX
            {
                continue;
            }
            self.verifying.insert(key);
            let transport = Arc::clone(&self.transport);
            let task = self.checks.spawn(async move {
                let ok = transport.verify(check.quic_addr, check.id).await.is_ok();
                (check, ok)
            });
            self.tasks.insert(task.id(), check);
        }
    }

    /// Records a verification that ended at `now`: a failure backs off from then.
    fn record_check(&mut self, check: Check, ok: bool, now: Instant) {
        let key = (check.id, check.quic_addr);
        self.verifying.remove(&key);
        if ok {
            self.failed.remove(&key);
            self.verified.insert(check.id, check.quic_addr);
            return;
        }
        if self.verified.get(&check.id) == Some(&check.quic_addr) {
            self.verified.remove(&check.id);
        }
        let failures = self
            .failed
            .get(&key)
            .filter(|failure| failure.generation == check.generation)
            .map_or(1, |failure| failure.failures.saturating_add(1));
        let backoff = VERIFY_RETRY_INITIAL.saturating_mul(1 << (failures - 1).min(16)).min(VERIFY_RETRY_MAX);
        warn!(peer = ?check.id, addr = %check.quic_addr, failures, "gossip member failed mutual TLS: not admitted");
        let retry_at = now + backoff;
        self.failed.insert(key, Failure { generation: check.generation, failures, retry_at });
    }

    /// Computes the view and the member list; applies the view when it changed.
    fn publish(&mut self, proposal: &Proposal, sink: &dyn ViewSink, members: &watch::Sender<Vec<Member>>) {
        let mut list = vec![self.me];
        let mut live = vec![self.me.id];
        for candidate in &proposal.live {
            let confirmed = self.verified.get(&candidate.id) == Some(&candidate.quic_addr);
            let status = if confirmed { MemberStatus::Live } else { MemberStatus::Unverified };
            if confirmed {
                live.push(candidate.id);
            }
            list.push(Member {
                id: candidate.id,
                quic_addr: candidate.quic_addr,
                status,
                region: candidate.region,
            });
        }
        let mut dead = Vec::new();
        for (&id, &quic_addr) in &self.verified {
            if let Some(&region) = proposal.dead.get(&id) {
                dead.push(id);
                list.push(Member { id, quic_addr, status: MemberStatus::Dead, region });
            }
        }
        // Forget failures at addresses no longer proposed (rotating fake entries must not grow
        // the table).
        self.failed.retain(|(id, addr), _| {
            proposal
                .live
                .binary_search_by_key(id, |candidate| candidate.id)
                .is_ok_and(|at| proposal.live[at].addrs.contains(addr))
        });
        // Forget confirmations of members that are gone from gossip altogether (left, or
        // garbage-collected after death): they must be verified again if they come back.
        self.verified.retain(|id, _| live.contains(id) || dead.contains(id));
        live.sort_unstable();
        dead.sort_unstable();
        list.sort_unstable_by_key(|member| member.id);
        let regions = regions_of(list.iter().filter(|m| m.status != MemberStatus::Unverified));
        let view = MemberView { live, dead, regions };
        if view != self.view {
            let _span = info_span!("membership", node = ?self.me.id).entered();
            info!(live = ?view.live, dead = ?view.dead, regions = ?view.regions, "membership changed: ring rebuilt");
            for gone in self.view.live.iter().filter(|id| !view.live.contains(id)) {
                self.transport.forget(*gone);
            }
            sink.apply(&view, &self.verified);
            self.view = view;
        }
        members.send_if_modified(|current| {
            let changed = *current != list;
            if changed {
                *current = list;
            }
            changed
        });
    }
}

/// [`MemberView::regions`] of `members`: the region of each that names one, sorted by member.
fn regions_of<'a>(members: impl IntoIterator<Item = &'a Member>) -> Vec<(NodeId, RegionId)> {
    let mut regions: Vec<(NodeId, RegionId)> = members
        .into_iter()
        .filter(|member| !member.region.is_none())
        .map(|member| (member.id, member.region.id()))
        .collect();
    regions.sort_unstable();
    regions
}
