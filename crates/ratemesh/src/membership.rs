//! Membership: chitchat gossip proposes members, mutual TLS confirms them.
//!
//! Every node runs a chitchat instance (UDP gossip, phi-accrual failure detection) whose node id
//! is the decimal [`NodeId`] and whose key-values carry the node's QUIC address
//! ([`KEY_QUIC_ADDR`]), the core's wire version ([`KEY_PROTOCOL`]) and, while it leaves
//! gracefully, [`KEY_LEAVING`]. Gossip is not authenticated, so a gossip entry is only a
//! *proposal*: a member enters the ring after [`Transport::verify`] completed a mutual-TLS
//! handshake with the advertised address whose certificate names that member. An entry that
//! fails is retried with an exponential backoff and never owns keys meanwhile.
//!
//! The view handed to the core ([`MemberView`]) is: this node and the verified live members
//! (`live`), plus verified members the failure detector declared dead and chitchat has not
//! garbage-collected yet (`dead`; they count in the cluster's size, which keeps the sides of a
//! partition near one limit). Members that announced a graceful leave are in neither.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chitchat::{Chitchat, ChitchatHandle, ChitchatId, NodeState};
use ratemesh_core::wire::WIRE_VERSION;
use ratemesh_core::{MemberView, NodeId};
use tokio::sync::{Mutex as AsyncMutex, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{info, info_span, warn};

use crate::transport::Transport;

/// Gossip key: the member's QUIC address (`ip:port`).
pub const KEY_QUIC_ADDR: &str = "ratemesh.quic_addr";
/// Gossip key: the core's wire version the member speaks (a member speaking another is ignored).
pub const KEY_PROTOCOL: &str = "ratemesh.protocol";
/// Gossip key: present while the member leaves gracefully (it is then no longer in any view).
pub const KEY_LEAVING: &str = "ratemesh.leaving";

/// The first retry of a failed verification; it doubles up to [`VERIFY_RETRY_MAX`].
const VERIFY_RETRY_INITIAL: Duration = Duration::from_millis(250);
/// The longest wait between verifications of a member that keeps failing.
const VERIFY_RETRY_MAX: Duration = Duration::from_secs(30);
/// Verifications in flight at once (each is a handshake with a timeout).
const VERIFY_IN_FLIGHT_MAX: usize = 64;
/// Gossip entries considered (bounds the work of one membership round against a flood of fake
/// gossip entries).
const CANDIDATES_MAX: usize = 4096;

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
}

/// A member proposed by gossip: alive and speaking our protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Candidate {
    id: NodeId,
    quic_addr: SocketAddr,
}

/// What one read of chitchat's state proposes.
#[derive(Debug, Default)]
struct Proposal {
    live: Vec<Candidate>,
    dead: HashSet<NodeId>,
}

/// A verification that failed, and when to try again.
#[derive(Clone, Copy, Debug)]
struct Failure {
    addr: SocketAddr,
    failures: u32,
    retry_at: Instant,
}

/// The membership task's state: which members mutual TLS confirmed, at which address.
pub(crate) struct Membership {
    me: Member,
    transport: Transport,
    chitchat: Arc<AsyncMutex<Chitchat>>,
    /// Members confirmed by mutual TLS, at the address that was verified.
    verified: HashMap<NodeId, SocketAddr>,
    failed: HashMap<NodeId, Failure>,
    verifying: HashSet<NodeId>,
    checks: JoinSet<(Candidate, bool)>,
    view: MemberView,
}

/// Where the membership task publishes what it decided.
pub(crate) trait ViewSink: Send + Sync + 'static {
    /// The view changed: apply it to the core, with the verified QUIC addresses of its members.
    fn apply(&self, view: &MemberView, addrs: &HashMap<NodeId, SocketAddr>);
}

impl Membership {
    pub(crate) fn new(me: Member, transport: Transport, gossip: &ChitchatHandle) -> Membership {
        Membership {
            me,
            transport,
            chitchat: gossip.chitchat(),
            verified: HashMap::new(),
            failed: HashMap::new(),
            verifying: HashSet::new(),
            checks: JoinSet::new(),
            view: MemberView { live: vec![me.id], dead: Vec::new() },
        }
    }

    /// Runs until `stop` turns true: re-reads gossip when its live set changes, when a
    /// verification ends, and every `recheck` (dead-node garbage collection and verification
    /// retries do not wake the watcher).
    pub(crate) async fn run(
        mut self,
        sink: Arc<dyn ViewSink>,
        members: watch::Sender<Vec<Member>>,
        recheck: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut live_watch = self.chitchat.lock().await.live_nodes_watcher();
        let mut ticks = tokio::time::interval(recheck);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let proposal = self.read_proposal().await;
            self.start_checks(&proposal);
            self.publish(&proposal, sink.as_ref(), &members);
            tokio::select! {
                changed = live_watch.changed() => if changed.is_err() { return },
                Some(done) = self.checks.join_next() => {
                    if let Ok((candidate, ok)) = done {
                        self.record_check(candidate, ok);
                    }
                }
                _ = ticks.tick() => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
        }
    }

    async fn read_proposal(&self) -> Proposal {
        let chitchat = self.chitchat.lock().await;
        propose(&chitchat, self.me.id)
    }

    /// Starts a verification for every proposed member not verified at its address and not in
    /// its retry backoff.
    fn start_checks(&mut self, proposal: &Proposal) {
        let now = Instant::now();
        for &candidate in &proposal.live {
            let verified = self.verified.get(&candidate.id) == Some(&candidate.quic_addr);
            let backing_off = self
                .failed
                .get(&candidate.id)
                .is_some_and(|failure| failure.addr == candidate.quic_addr && failure.retry_at > now);
            if verified
                || backing_off
                || self.verifying.contains(&candidate.id)
                || self.verifying.len() >= VERIFY_IN_FLIGHT_MAX
            {
                continue;
            }
            self.verifying.insert(candidate.id);
            let transport = self.transport.clone();
            self.checks.spawn(async move {
                let ok = transport.verify(candidate.quic_addr, candidate.id).await.is_ok();
                (candidate, ok)
            });
        }
    }

    fn record_check(&mut self, candidate: Candidate, ok: bool) {
        self.verifying.remove(&candidate.id);
        if ok {
            self.failed.remove(&candidate.id);
            self.verified.insert(candidate.id, candidate.quic_addr);
            return;
        }
        if self.verified.get(&candidate.id) == Some(&candidate.quic_addr) {
            self.verified.remove(&candidate.id);
        }
        let failures = self
            .failed
            .get(&candidate.id)
            .filter(|failure| failure.addr == candidate.quic_addr)
            .map_or(1, |failure| failure.failures.saturating_add(1));
        let backoff = VERIFY_RETRY_INITIAL.saturating_mul(1 << (failures - 1).min(16)).min(VERIFY_RETRY_MAX);
        warn!(peer = ?candidate.id, addr = %candidate.quic_addr, failures, "gossip member failed mutual TLS: not admitted");
        let retry_at = Instant::now() + backoff;
        self.failed.insert(candidate.id, Failure { addr: candidate.quic_addr, failures, retry_at });
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
            list.push(Member { id: candidate.id, quic_addr: candidate.quic_addr, status });
        }
        let mut dead = Vec::new();
        for (&id, &quic_addr) in &self.verified {
            if proposal.dead.contains(&id) && !live.contains(&id) {
                dead.push(id);
                list.push(Member { id, quic_addr, status: MemberStatus::Dead });
            }
        }
        // Forget confirmations of members that are gone from gossip altogether (left, or
        // garbage-collected after death): they must be verified again if they come back.
        self.verified.retain(|id, _| live.contains(id) || dead.contains(id));
        live.sort_unstable();
        dead.sort_unstable();
        list.sort_unstable_by_key(|member| member.id);
        let view = MemberView { live, dead };
        if view != self.view {
            let _span = info_span!("membership", node = ?self.me.id).entered();
            info!(live = ?view.live, dead = ?view.dead, "membership changed: ring rebuilt");
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

/// The members chitchat's state proposes: live entries with a parsable id, a QUIC address and
/// our protocol version, not leaving; and the ids the failure detector declared dead.
fn propose(chitchat: &Chitchat, me: NodeId) -> Proposal {
    let mut by_id: BTreeMap<NodeId, Candidate> = BTreeMap::new();
    for chitchat_id in chitchat.live_nodes().take(CANDIDATES_MAX) {
        let Some(state) = chitchat.node_state(chitchat_id) else { continue };
        let Some(candidate) = candidate(chitchat_id, state) else { continue };
        if candidate.id != me {
            // Several generations of one member may be live for a moment after a restart: the
            // newest entry wins because chitchat orders ids by generation after the node id.
            by_id.insert(candidate.id, candidate);
        }
    }
    let dead = chitchat
        .dead_nodes()
        .take(CANDIDATES_MAX)
        .filter(|id| chitchat.node_state(id).is_none_or(|state| state.get(KEY_LEAVING).is_none()))
        .filter_map(|id| parse_node_id(&id.node_id))
        .collect();
    Proposal { live: by_id.into_values().collect(), dead }
}

fn candidate(chitchat_id: &ChitchatId, state: &NodeState) -> Option<Candidate> {
    let id = parse_node_id(&chitchat_id.node_id)?;
    let protocol: u8 = state.get(KEY_PROTOCOL)?.parse().ok()?;
    if protocol != WIRE_VERSION || state.get(KEY_LEAVING).is_some() {
        return None;
    }
    let quic_addr = state.get(KEY_QUIC_ADDR)?.parse().ok()?;
    Some(Candidate { id, quic_addr })
}

/// Chitchat node ids are the decimal [`NodeId`].
pub(crate) fn chitchat_node_id(id: NodeId) -> String {
    id.0.to_string()
}

fn parse_node_id(text: &str) -> Option<NodeId> {
    // Canonical decimal only, so that one member has one gossip name.
    let id: u64 = text.parse().ok()?;
    (id.to_string() == text).then_some(NodeId(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_round_trip_and_only_canonical_decimal_parses() {
        assert_eq!(parse_node_id(&chitchat_node_id(NodeId(42))), Some(NodeId(42)));
        for bad in ["", "+1", "01", "n1", "1 ", "18446744073709551616", "-1"] {
            assert_eq!(parse_node_id(bad), None, "{bad:?}");
        }
    }
}
