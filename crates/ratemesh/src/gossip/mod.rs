//! Gossip: chitchat over sealed UDP, bounded for insiders, supervised.
//!
//! - [`seal`]: every datagram is ChaCha20-Poly1305-sealed under a key derived (HKDF-SHA256) from
//!   the cluster's gossip secret and cluster id, with a per-session counter nonce and a replay
//!   window. Authentication comes first and costs the same for any datagram; contents (member
//!   addresses, keys) are encrypted. Two secrets are accepted during a rotation.
//! - [`check`]: what an authenticated message may contain — decoded under [`GossipLimits`] and
//!   checked against the state before chitchat parses it, so that an insider's malformed message
//!   is a counted refusal, never a panic or a bloated state.
//! - `socket`: chitchat's `Transport` over the two; refusals are counted ([`GossipStats`]) and
//!   never answered.
//! - Supervision (`supervise`): when the chitchat task ends (an error, or a panic), it is
//!   restarted under a new generation with the same key-values, with a backoff; meanwhile the
//!   node reports [`GossipHealth::Restarting`] (the daemon is not ready then) and counts it.
//!
//! The keys: with [`ClusterSecurity::Secret`] the cluster secret (which also derives the CA);
//! with [`ClusterSecurity::Provided`] the required `gossip_secret` — certificates give every
//! member a key of its own, but no secret they share, and a datagram must be authenticated
//! before anything about it is parsed (a per-message signature would cost an outsider nothing
//! to send and a receiver a signature check each).

pub mod check;
pub mod seal;
mod socket;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use chitchat::{
    Chitchat, ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, ProtocolVersion,
};
use ratemesh_core::NodeId;
use tokio::sync::{Mutex as AsyncMutex, watch};
use tracing::{error, info, warn};

pub use check::GossipLimits;
use seal::GossipKeys;
use socket::SealedTransport;
pub(crate) use socket::{HeardVersions, SealConfig};

use crate::membership::chitchat_node_id;
use crate::security::{ClusterSecurity, SecurityError};
use crate::sync::Mutex;
use crate::transport::MemoryNetwork;

/// The first pause before restarting a gossip instance that ended; it doubles up to
/// [`RESTART_BACKOFF_MAX`].
const RESTART_BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// The longest pause between restarts.
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// An instance that ran this long before ending restarts after the initial pause again.
const RESTART_BACKOFF_RESET: Duration = Duration::from_secs(60);

/// The gossip secret of `security` (see the module documentation).
pub(crate) fn gossip_keys(security: &ClusterSecurity, cluster_id: &str) -> Result<GossipKeys, SecurityError> {
    let secret = match security {
        ClusterSecurity::Secret(secret) => secret,
        ClusterSecurity::Provided(certs) => &certs.gossip_secret,
    };
    GossipKeys::derive(secret, cluster_id)
}

/// Counters of the gossip transport and its supervisor (monotonic, since the node started).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GossipStats {
    /// Datagrams received on the gossip port.
    pub datagrams_received: u64,
    /// Datagrams sent.
    pub datagrams_sent: u64,
    /// Received datagrams that were not sealed, or whose tag did not verify (forged, corrupt):
    /// dropped after constant work, never answered.
    pub rejected_unauthenticated: u64,
    /// Received datagrams sealed under a key this node does not hold (another cluster, or a
    /// member with another secret: check secrets during a rotation).
    pub rejected_unknown_key: u64,
    /// Authentic datagrams seen before (replays).
    pub rejected_replayed: u64,
    /// Authentic datagrams whose contents no ratemesh node sends (an insider's bug or attack).
    pub rejected_malformed: u64,
    /// Authentic datagrams over a bound of [`GossipLimits`].
    pub rejected_over_bound: u64,
    /// Messages that could not be sent (socket errors, or too long for a datagram).
    pub send_failures: u64,
    /// Times the gossip instance ended while the node ran and was restarted.
    pub restarts: u64,
    /// Gossip entries (a member's generation) that advertise a region that is not a valid region
    /// name (an insider's bug or attack): each counted once, the member taken as naming no region.
    pub malformed_regions: u64,
}

/// The shared counters behind [`GossipStats`].
#[derive(Debug, Default)]
pub(crate) struct GossipCounters {
    received: AtomicU64,
    sent: AtomicU64,
    unauthenticated: AtomicU64,
    unknown_key: AtomicU64,
    replayed: AtomicU64,
    malformed: AtomicU64,
    over_bound: AtomicU64,
    send_failures: AtomicU64,
    restarts: AtomicU64,
    malformed_regions: AtomicU64,
}

impl GossipCounters {
    /// The counters now.
    pub(crate) fn stats(&self) -> GossipStats {
        GossipStats {
            datagrams_received: get(&self.received),
            datagrams_sent: get(&self.sent),
            rejected_unauthenticated: get(&self.unauthenticated),
            rejected_unknown_key: get(&self.unknown_key),
            rejected_replayed: get(&self.replayed),
            rejected_malformed: get(&self.malformed),
            rejected_over_bound: get(&self.over_bound),
            send_failures: get(&self.send_failures),
            restarts: get(&self.restarts),
            malformed_regions: get(&self.malformed_regions),
        }
    }

    /// Counts a gossip entry that advertises a malformed region.
    pub(crate) fn malformed_region(&self) {
        bump(&self.malformed_regions);
    }
}

/// Adds one; returns the new count.
fn bump(counter: &AtomicU64) -> u64 {
    counter.fetch_add(1, Ordering::Relaxed) + 1
}

/// Reads a counter.
fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// Whether gossip runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GossipHealth {
    /// The gossip instance runs.
    Running,
    /// The gossip instance ended while the node ran (see the log for why) and is being
    /// restarted: the membership view is not updated meanwhile.
    Restarting {
        /// What ended it.
        reason: String,
    },
}

/// Everything needed to start a chitchat instance, again after one ended.
pub(crate) struct GossipStarter {
    pub(crate) node: NodeId,
    pub(crate) listen_addr: SocketAddr,
    pub(crate) cluster_id: String,
    pub(crate) seeds: Vec<SocketAddr>,
    pub(crate) gossip_interval: Duration,
    pub(crate) dead_member_forget: Duration,
    pub(crate) seal: Arc<SealConfig>,
    /// Gossip over this in-process network instead of UDP.
    pub(crate) network: Option<MemoryNetwork>,
}

impl GossipStarter {
    /// Starts a chitchat instance of `generation` with `key_values` on the sealed transport.
    pub(crate) async fn spawn(
        &self,
        generation: u64,
        key_values: Vec<(String, String)>,
    ) -> anyhow::Result<ChitchatHandle> {
        let (state_tx, state_rx) = watch::channel(None);
        let transport = SealedTransport {
            config: Arc::clone(&self.seal),
            chitchat: state_rx,
            network: self.network.clone(),
        };
        let handle = chitchat::spawn_chitchat(self.config(generation), key_values, &transport).await?;
        state_tx.send_replace(Some(handle.chitchat()));
        Ok(handle)
    }

    fn config(&self, generation: u64) -> ChitchatConfig {
        // The failure detector's prior is `initial_interval`: set to the gossip interval, a crashed
        // member is declared dead after ~2 s at 200 ms gossip, not after ~26 s (chitchat's 5 s prior).
        let failure_detector_config = FailureDetectorConfig {
            phi_threshold: 8.0,
            sampling_window_size: 1000,
            max_interval: self.gossip_interval * 10,
            initial_interval: self.gossip_interval,
            dead_node_grace_period: self.dead_member_forget,
        };
        ChitchatConfig {
            chitchat_id: ChitchatId::new(chitchat_node_id(self.node), generation, self.seal.advertise),
            cluster_id: self.cluster_id.clone(),
            gossip_interval: self.gossip_interval,
            listen_addr: self.listen_addr,
            seed_nodes: self.seeds.iter().map(SocketAddr::to_string).collect(),
            failure_detector_config,
            marked_for_deletion_grace_period: self.dead_member_forget,
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: ProtocolVersion::V0,
        }
    }
}

/// Where the running instance is: the handle (taken by the node's stop), and its state for the
/// membership task.
pub(crate) struct GossipSlot {
    pub(crate) handle: Arc<Mutex<Option<ChitchatHandle>>>,
    pub(crate) state: watch::Sender<Arc<AsyncMutex<Chitchat>>>,
    pub(crate) health: watch::Sender<GossipHealth>,
}

/// Restarts the instance in `slot` whenever it ends while the node runs (until `stop`, or until
/// the node's stop took the handle): a new generation (peers see a restarted member), the same
/// key-values as the instance that ended (its leave flag included), after a pause that doubles
/// while instances keep ending young.
pub(crate) async fn supervise(
    starter: GossipStarter,
    slot: GossipSlot,
    mut generation: u64,
    mut stop: watch::Receiver<bool>,
) {
    let lock = |handle: &Mutex<Option<ChitchatHandle>>| {
        // Held only to read or swap the handle: a panic elsewhere cannot leave it half-made.
        handle.lock().as_ref().map(ChitchatHandle::termination_watcher)
    };
    let mut backoff = RESTART_BACKOFF_INITIAL;
    loop {
        let Some(ended) = lock(&slot.handle) else { return };
        let started = tokio::time::Instant::now();
        let reason = tokio::select! {
            outcome = ended => match outcome {
                Ok(()) => "the gossip loop stopped".to_owned(),
                Err(error) => format!("{error:#}"),
            },
            _ = stop.wait_for(|stopped| *stopped) => return,
        };
        if *stop.borrow() {
            return;
        }
        starter.seal.counters.restarts.fetch_add(1, Ordering::Relaxed);
        error!(node = ?starter.node, %reason, "gossip ended while the node runs: restarting it (not ready meanwhile)");
        slot.health.send_replace(GossipHealth::Restarting { reason });
        if started.elapsed() >= RESTART_BACKOFF_RESET {
            backoff = RESTART_BACKOFF_INITIAL;
        }
        let key_values: Vec<(String, String)> = {
            let old = slot.state.borrow().clone();
            let mut old = old.lock().await;
            old.self_node_state()
                .key_values()
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .collect()
        };
        let handle = loop {
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            backoff =
                crate::Backoff { initial: RESTART_BACKOFF_INITIAL, max: RESTART_BACKOFF_MAX }.next(backoff);
            generation = next_generation(generation);
            match starter.spawn(generation, key_values.clone()).await {
                Ok(handle) => break handle,
                Err(error) => {
                    warn!(node = ?starter.node, error = %format!("{error:#}"), "gossip restart failed; retrying")
                }
            }
        };
        let state = handle.chitchat();
        {
            let mut current = slot.handle.lock();
            if current.is_none() {
                // The node stopped meanwhile: this instance must not outlive it.
                handle.abort();
                return;
            }
            *current = Some(handle);
        }
        slot.state.send_replace(state);
        slot.health.send_replace(GossipHealth::Running);
        info!(node = ?starter.node, generation, "gossip restarted");
    }
}

/// A generation newer than `previous`: the Unix time in microseconds, as at a start, unless the
/// clock is behind.
fn next_generation(previous: u64) -> u64 {
    let since_epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX).max(previous.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::ClusterSecret;

    const BOUND: Duration = Duration::from_secs(20);

    fn starter(listen_addr: SocketAddr, counters: &Arc<GossipCounters>) -> GossipStarter {
        let secret = ClusterSecret::new("a test secret of 16+ bytes").expect("long enough");
        let seal = SealConfig {
            keys: GossipKeys::derive(&secret, "test").expect("derive"),
            limits: GossipLimits::default(),
            counters: Arc::clone(counters),
            advertise: listen_addr,
            heard: Arc::default(),
        };
        GossipStarter {
            node: NodeId(1),
            listen_addr,
            cluster_id: "test".to_owned(),
            seeds: Vec::new(),
            gossip_interval: Duration::from_millis(50),
            dead_member_forget: Duration::from_secs(60),
            seal: Arc::new(seal),
            network: None,
        }
    }

    #[tokio::test]
    async fn an_ended_instance_is_restarted_under_a_new_generation_with_its_key_values() {
        let listen =
            std::net::UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).expect("a free port");
        let counters = Arc::new(GossipCounters::default());
        let starter = starter(listen, &counters);
        let handle = starter.spawn(7, vec![("a".to_owned(), "1".to_owned())]).await.expect("starts");
        // Set while it runs (as the leave flag is): must survive the restart.
        handle.chitchat().lock().await.self_node_state().set("b", "2");
        let (state, mut state_rx) = watch::channel(handle.chitchat());
        let (health, mut health_rx) = watch::channel(GossipHealth::Running);
        let slot_handle = Arc::new(Mutex::new(Some(handle)));
        let slot = GossipSlot { handle: Arc::clone(&slot_handle), state, health };
        let (stop, stop_rx) = watch::channel(false);
        let supervisor = tokio::spawn(supervise(starter, slot, 7, stop_rx));

        // The instance ends (aborted, as a panic ends it) and its port is taken meanwhile: the
        // restart fails and is retried, and the health says so all along.
        slot_handle.lock().as_ref().expect("running").abort();
        let blocker = tokio::time::timeout(BOUND, async {
            loop {
                match std::net::UdpSocket::bind(listen) {
                    Ok(socket) => break socket,
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        })
        .await
        .expect("the ended instance releases its port");
        let restarting =
            tokio::time::timeout(BOUND, health_rx.wait_for(|h| *h != GossipHealth::Running)).await;
        assert!(matches!(*restarting.expect("bounded").expect("open"), GossipHealth::Restarting { .. }));
        assert_eq!(counters.stats().restarts, 1);

        // The port is free again: a new instance runs, with a newer generation and the same keys.
        drop(blocker);
        tokio::time::timeout(BOUND, state_rx.changed()).await.expect("restarted").expect("open");
        tokio::time::timeout(BOUND, health_rx.wait_for(|h| *h == GossipHealth::Running))
            .await
            .expect("running again")
            .expect("open");
        let restarted = state_rx.borrow().clone();
        let mut restarted = restarted.lock().await;
        assert!(restarted.self_chitchat_id().generation_id > 7);
        let node = restarted.self_node_state();
        assert_eq!((node.get("a"), node.get("b")), (Some("1"), Some("2")));
        drop(restarted);
        assert_eq!(counters.stats().restarts, 1);

        // The node's stop takes the instance: the supervisor ends.
        stop.send_replace(true);
        let taken = slot_handle.lock().take().expect("running");
        taken.shutdown().await.expect("stops");
        tokio::time::timeout(BOUND, supervisor).await.expect("supervisor ends").expect("no panic");
    }
}
