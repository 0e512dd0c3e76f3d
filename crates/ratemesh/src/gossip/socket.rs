//! chitchat's `Transport` and `Socket` over sealed UDP datagrams.
//!
//! Sending: the envelope is serialized (chitchat's codec, public in the patched copy), prefixed
//! with this node's gossip address and sealed ([`Sealer`]). Receiving: a datagram is opened
//! ([`Opener`]: authentication first, constant work), summarized under the limits and checked
//! against chitchat's state ([`super::check`]), and only then parsed by chitchat. A datagram
//! refused at any step is counted and dropped — never answered. chitchat answers to the
//! *authenticated* sender address, not to the datagram's source, so a replayed or spoofed
//! datagram cannot aim a reply at a third party.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport};
use chitchat::{Chitchat, ChitchatEnvelope};
use ratemesh_core::NodeId;
use tokio::sync::{Mutex as AsyncMutex, watch};
use tracing::{debug, warn};

use super::check::{GossipLimits, Summary, check_against, summarize};
use super::seal::{DATAGRAM_LEN_MAX, GossipKeys, Opener, Reject, SEAL_OVERHEAD_MAX, Sealer};
use super::{GossipCounters, bump};
use crate::membership::parse_node_id;
use crate::transport::{MemoryDatagrams, MemoryNetwork};

/// What every socket of a node shares: keys, limits, counters, the address it gossips from.
#[derive(Debug)]
pub(crate) struct SealConfig {
    pub(crate) keys: GossipKeys,
    pub(crate) limits: GossipLimits,
    pub(crate) counters: Arc<GossipCounters>,
    /// This node's gossip address as peers reach it: where they answer.
    pub(crate) advertise: SocketAddr,
    /// The version of this node's own state each peer showed in its last digest.
    pub(crate) heard: Arc<HeardVersions>,
}

/// What the peers know of this node's own gossip state: the highest version of it each peer
/// showed in a digest (the peer found by the gossip address sealed into its datagram). A leave
/// ends its wait for the peers to learn of it once every live peer showed the leave's version.
#[derive(Debug)]
pub(crate) struct HeardVersions {
    versions: watch::Sender<BTreeMap<NodeId, u64>>,
}

impl Default for HeardVersions {
    fn default() -> Self {
        HeardVersions { versions: watch::Sender::new(BTreeMap::new()) }
    }
}

impl HeardVersions {
    /// `peer` showed `version` of this node's state.
    fn record(&self, peer: NodeId, version: u64) {
        self.versions.send_if_modified(|versions| {
            let known = versions.entry(peer).or_insert(0);
            let newer = version > *known;
            *known = (*known).max(version);
            newer
        });
    }

    /// Waits until every one of `peers` showed at least `version` of this node's state.
    pub(crate) async fn wait_for(&self, peers: &[NodeId], version: u64) {
        let mut versions = self.versions.subscribe();
        let heard = |versions: &BTreeMap<NodeId, u64>| {
            peers.iter().all(|peer| versions.get(peer).is_some_and(|&seen| seen >= version))
        };
        // The sender lives as long as `self`: the wait ends only when all were heard.
        let _ = versions.wait_for(heard).await;
    }
}

/// The transport of one chitchat instance: its sockets check messages against its state, which
/// exists only once chitchat started (hence the watch, filled right after the spawn).
pub(crate) struct SealedTransport {
    pub(crate) config: Arc<SealConfig>,
    pub(crate) chitchat: watch::Receiver<Option<Arc<AsyncMutex<Chitchat>>>>,
    /// Datagrams over this in-process network instead of UDP (tests on virtual time).
    pub(crate) network: Option<MemoryNetwork>,
}

/// Where sealed datagrams go: a UDP socket, or a socket of an in-process network.
enum Datagrams {
    Udp(tokio::net::UdpSocket),
    Memory(MemoryDatagrams),
}

impl Datagrams {
    async fn bind(listen_addr: SocketAddr, network: Option<&MemoryNetwork>) -> anyhow::Result<Datagrams> {
        let socket = match network {
            Some(network) => Datagrams::Memory(network.bind_datagrams(listen_addr)?),
            None => Datagrams::Udp(tokio::net::UdpSocket::bind(listen_addr).await?),
        };
        Ok(socket)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Datagrams::Udp(socket) => socket.local_addr(),
            Datagrams::Memory(socket) => Ok(socket.local_addr()),
        }
    }

    async fn send_to(&self, datagram: &[u8], to: SocketAddr) -> std::io::Result<()> {
        match self {
            Datagrams::Udp(socket) => socket.send_to(datagram, to).await.map(drop),
            Datagrams::Memory(socket) => {
                socket.send_to(datagram, to);
                Ok(())
            }
        }
    }

    async fn recv_from(&mut self, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr)> {
        match self {
            Datagrams::Udp(socket) => socket.recv_from(buf).await,
            Datagrams::Memory(socket) => socket.recv_from(buf).await,
        }
    }
}

#[async_trait::async_trait]
impl Transport for SealedTransport {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let socket = Datagrams::bind(listen_addr, self.network.as_ref())
            .await
            .with_context(|| format!("failed to bind to {listen_addr}/UDP for gossip"))?;
        Ok(Box::new(SealedSocket {
            socket,
            config: Arc::clone(&self.config),
            chitchat: self.chitchat.clone(),
            sealer: Sealer::new().context("no OS randomness for the gossip session")?,
            opener: Opener::default(),
            received: vec![0_u8; DATAGRAM_LEN_MAX + 1].into_boxed_slice(),
            message: Vec::with_capacity(DATAGRAM_LEN_MAX),
            sealed: Vec::with_capacity(DATAGRAM_LEN_MAX),
            pending: None,
        }))
    }
}

/// An authentic, well-formed message waiting for the check against chitchat's state (kept
/// across a cancelled `recv`, so that cancelling loses nothing).
struct Pending {
    from: SocketAddr,
    message: Vec<u8>,
    summary: Summary,
    len: usize,
}

struct SealedSocket {
    socket: Datagrams,
    config: Arc<SealConfig>,
    chitchat: watch::Receiver<Option<Arc<AsyncMutex<Chitchat>>>>,
    sealer: Sealer,
    opener: Opener,
    /// One more byte than the largest datagram: a longer one is seen as too long.
    received: Box<[u8]>,
    message: Vec<u8>,
    sealed: Vec<u8>,
    pending: Option<Pending>,
}

#[async_trait::async_trait]
impl Socket for SealedSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.socket.local_addr().context("failed to get UDP socket address")
    }

    async fn send(&mut self, to: SocketAddr, envelope: ChitchatEnvelope) -> anyhow::Result<SendOutcome> {
        self.message.clear();
        envelope.serialize(&mut self.message);
        let counters = &self.config.counters;
        if self.message.len() + SEAL_OVERHEAD_MAX > DATAGRAM_LEN_MAX {
            // chitchat sizes deltas to fit; only a digest of more nodes than the limits allow
            // could be this long.
            bump(&counters.send_failures);
            anyhow::bail!("gossip message of {} bytes does not fit in a datagram", self.message.len());
        }
        self.sealer
            .seal(&self.config.keys, self.config.advertise, &self.message, &mut self.sealed)
            .context("sealing a gossip message")?;
        if let Err(error) = self.socket.send_to(&self.sealed, to).await {
            bump(&counters.send_failures);
            return Err(error).context("failed to send a gossip message to a peer");
        }
        bump(&counters.sent);
        Ok(SendOutcome { num_bytes_sent: self.sealed.len() })
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            if self.pending.is_none() {
                self.pending = self.receive_one().await?;
                continue;
            }
            // Both waits are cancellable: the message stays pending meanwhile.
            let chitchat = self.state().await?;
            let state = chitchat.lock().await;
            let Some(pending) = self.pending.take() else { continue };
            let verdict = check_against(&pending.summary, &state, &self.config.limits);
            if verdict.is_ok() {
                self.note_versions(&pending, &state);
            }
            drop(state);
            if let Err(reject) = verdict {
                self.refuse(reject, pending.from, pending.len);
                continue;
            }
            match ChitchatEnvelope::deserialize(&mut &pending.message[..]) {
                Ok(envelope) => {
                    return Ok(RecvOutcome {
                        from_addr: pending.from,
                        envelope,
                        num_bytes_received: pending.len,
                    });
                }
                // The checks accepted what chitchat refuses: a gap in them, logged to be fixed.
                Err(error) => {
                    warn!(from = %pending.from, %error, "gossip message passed the checks but chitchat refused it");
                    self.refuse(Reject::Malformed, pending.from, pending.len);
                }
            }
        }
    }
}

impl SealedSocket {
    /// Records the version of this node's state that the sender of an accepted digest knows.
    fn note_versions(&self, pending: &Pending, state: &Chitchat) {
        let me = state.self_chitchat_id();
        let Some(mine) = pending.summary.digest.iter().find(|entry| entry.id == *me) else { return };
        let sender =
            state.node_states().keys().find(|id| id.gossip_advertise_addr == pending.from && id != &me);
        if let Some(peer) = sender.and_then(|id| parse_node_id(&id.node_id)) {
            self.config.heard.record(peer, mine.max_version);
        }
    }

    /// The chitchat instance this socket serves, once it exists.
    async fn state(&mut self) -> anyhow::Result<Arc<AsyncMutex<Chitchat>>> {
        let state = self.chitchat.wait_for(Option::is_some).await.context("the gossip instance is gone")?;
        state.clone().context("the gossip instance is gone")
    }

    /// Receives one datagram: the pending message it carries, or `None` when it was refused.
    async fn receive_one(&mut self) -> anyhow::Result<Option<Pending>> {
        let (len, source) = match self.socket.recv_from(&mut self.received).await {
            Ok(received) => received,
            Err(error) if is_transient(&error) => {
                debug!(%error, "transient gossip receive error");
                return Ok(None);
            }
            Err(error) => return Err(error).context("fatal gossip receive error"),
        };
        let config = &self.config;
        bump(&config.counters.received);
        let (from, message) = match self.opener.open(&config.keys, &mut self.received[..len]) {
            Ok(opened) => opened,
            Err(reject) => {
                self.refuse(reject, source, len);
                return Ok(None);
            }
        };
        match summarize(message, &config.limits) {
            Ok(summary) => Ok(Some(Pending { from, message: message.to_vec(), summary, len })),
            Err(reject) => {
                self.refuse(reject, from, len);
                Ok(None)
            }
        }
    }

    /// Counts a refused datagram. Refusals of authenticated datagrams (an insider's) are logged
    /// at the 1st, 2nd, 4th, 8th… occurrence, so that a flood cannot flood the log; the others
    /// (anyone on the network) only at debug level.
    fn refuse(&self, reject: Reject, from: SocketAddr, len: usize) {
        let counters = &self.config.counters;
        let counter = match reject {
            Reject::NotSealed | Reject::Forged => &counters.unauthenticated,
            Reject::UnknownKey => &counters.unknown_key,
            Reject::Replayed => &counters.replayed,
            Reject::Malformed => &counters.malformed,
            Reject::OverBound => &counters.over_bound,
        };
        let count = bump(counter);
        let authenticated = matches!(reject, Reject::Malformed | Reject::OverBound);
        if authenticated && count.is_power_of_two() {
            warn!(?reject, %from, len, count, "authenticated gossip message refused");
        } else {
            debug!(?reject, %from, len, "gossip datagram dropped");
        }
    }
}

fn is_transient(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    // A previous send to a closed port comes back as a refused or reset receive on some systems.
    matches!(error.kind(), ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset | ErrorKind::OutOfMemory)
}
