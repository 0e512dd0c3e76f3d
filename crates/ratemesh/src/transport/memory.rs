//! An in-process network of nodes: [`MemoryNetwork`] and its [`MemoryTransport`]s.
//!
//! For tests of the node driver on virtual time (`#[tokio::test(start_paused = true)]`): no
//! socket, no handshake, nothing that waits on the operating system, so tokio's paused clock
//! advances only when every task waits on a timer. It keeps what the node relies on of the QUIC
//! transport:
//!
//! - every frame crosses as encoded bytes (`Vec<u8>`, copied), never as a value;
//! - the sender of a received frame is the transport the frame was sent from, as the network
//!   bound it (the certificate's node for QUIC), never a field of the frame;
//! - the bounds: the sender's `frame_len_max` (refused and counted), the receiver's
//!   `frame_len_max` (dropped, counted as oversize), the receiver's `inbound_queue_len_max`
//!   (a full channel drops and counts), `peers_max`, [`QUERY_LEN_MAX`], the asker's
//!   `frame_len_max` for an answer;
//! - [`PeerTransport::verify`] succeeds only if the transport at the address is the expected
//!   node; a frame sent to an address where another node is bound is dropped and counted (a
//!   QUIC handshake with it would fail).
//!
//! Delivery is immediate (no latency) and in order. A frame that cannot be delivered (no
//! transport at the address, a cut link, the receiver closed) is accepted by `send` and counted
//! as dropped, as QUIC drops it in its worker. `send_queue_len_max` never binds: there is no
//! queue between the two ends.
//!
//! The network also carries gossip datagrams ([`MemoryDatagrams`], used by the node's sealed
//! gossip socket when it runs on a memory network), bounded per socket
//! ([`DATAGRAM_QUEUE_LEN_MAX`]), dropped when full like UDP. [`MemoryNetwork::cut`] cuts peer
//! frames only: gossip still flows, as when a member's QUIC port is blocked.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use quinn::ReadToEndError;
use ratemesh_core::NodeId;
use tokio::sync::mpsc;
use tracing::debug;

use super::{
    Counters, PeerTransport, QUERY_LEN_MAX, QueryHandler, Received, TransportConfig, TransportError,
    TransportStats, add, bump,
};
use crate::security::SecurityError;
use crate::sync::Mutex;

/// Gossip datagrams queued per memory socket; further ones are dropped (as a full UDP buffer
/// drops them).
pub const DATAGRAM_QUEUE_LEN_MAX: usize = 1024;
/// The first port handed out for port 0.
const EPHEMERAL_PORT_FIRST: u16 = 20_000;

/// An in-process network: transports and gossip sockets bound to addresses, and the links cut
/// between nodes. Cheap to clone; clones are the same network.
#[derive(Clone, Default)]
pub struct MemoryNetwork {
    state: Arc<Mutex<NetworkState>>,
}

/// A gossip datagram in flight: its source and bytes.
type Datagram = (SocketAddr, Vec<u8>);

#[derive(Default)]
struct NetworkState {
    /// Transports by address (weak: a transport dropped without `close` is gone too).
    transports: HashMap<SocketAddr, Weak<Shared>>,
    /// Gossip sockets by address: the socket's number (a rebound address is another socket) and
    /// its queue.
    datagrams: HashMap<SocketAddr, (u64, mpsc::Sender<Datagram>)>,
    /// Cut links, each stored both ways.
    cut: HashSet<(NodeId, NodeId)>,
    next_port: u16,
    next_socket: u64,
}

impl NetworkState {
    /// `addr`, or with port 0 an unused port on its IP.
    fn allocate(&mut self, addr: SocketAddr) -> Result<SocketAddr, io::Error> {
        if addr.port() != 0 {
            return if self.is_taken(addr) { Err(io::ErrorKind::AddrInUse.into()) } else { Ok(addr) };
        }
        for _ in 0..=u16::MAX {
            self.next_port =
                self.next_port.max(EPHEMERAL_PORT_FIRST).wrapping_add(1).max(EPHEMERAL_PORT_FIRST);
            let candidate = SocketAddr::new(addr.ip(), self.next_port);
            if !self.is_taken(candidate) {
                return Ok(candidate);
            }
        }
        Err(io::ErrorKind::AddrInUse.into())
    }

    /// Whether a live transport or a gossip socket is bound at `addr`.
    fn is_taken(&self, addr: SocketAddr) -> bool {
        let transport = self.transports.get(&addr).is_some_and(|t| t.strong_count() > 0);
        transport || self.datagrams.contains_key(&addr)
    }

    fn is_cut(&self, a: NodeId, b: NodeId) -> bool {
        self.cut.contains(&(a, b))
    }
}

impl std::fmt::Debug for MemoryNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("MemoryNetwork")
            .field("transports", &state.transports.len())
            .field("gossip_sockets", &state.datagrams.len())
            .field("cut_links", &(state.cut.len() / 2))
            .finish()
    }
}

impl MemoryNetwork {
    /// An empty network.
    pub fn new() -> MemoryNetwork {
        MemoryNetwork::default()
    }

    fn lock(&self) -> MutexGuard<'_, NetworkState> {
        // Every update is a single insert or remove: a poisoned lock is still consistent.
        self.state.lock()
    }

    /// Binds a transport for `node` at `addr` (port 0: an unused port) and returns it with the
    /// channel of frames it receives. The network vouches for the sender of every frame: the
    /// node a transport was bound as.
    pub fn bind(
        &self,
        addr: SocketAddr,
        node: NodeId,
        config: TransportConfig,
    ) -> Result<(MemoryTransport, mpsc::Receiver<Received>), TransportError> {
        config.validate()?;
        let mut state = self.lock();
        let local_addr = state.allocate(addr).map_err(|source| TransportError::Bind { addr, source })?;
        let (inbox, received) = mpsc::channel(config.inbound_queue_len_max);
        let shared = Arc::new(Shared {
            node,
            local_addr,
            network: self.clone(),
            config,
            counters: Counters::default(),
            inbox,
            queries: OnceLock::new(),
            closed: AtomicBool::new(false),
            peers: Mutex::new(HashSet::new()),
        });
        state.transports.insert(local_addr, Arc::downgrade(&shared));
        Ok((MemoryTransport { shared }, received))
    }

    /// Binds a gossip socket at `addr` (port 0: an unused port).
    pub fn bind_datagrams(&self, addr: SocketAddr) -> io::Result<MemoryDatagrams> {
        let mut state = self.lock();
        let local_addr = state.allocate(addr)?;
        let (sender, inbox) = mpsc::channel(DATAGRAM_QUEUE_LEN_MAX);
        state.next_socket += 1;
        let socket = state.next_socket;
        state.datagrams.insert(local_addr, (socket, sender));
        Ok(MemoryDatagrams { network: self.clone(), local_addr, socket, inbox })
    }

    /// An unused address on `addr`'s IP (for a gossip address that must be known before the
    /// socket is bound).
    pub fn free_addr(&self, addr: SocketAddr) -> io::Result<SocketAddr> {
        self.lock().allocate(addr)
    }

    /// Cuts peer frames, queries and verifications between `a` and `b`, both ways (gossip still
    /// flows). Frames sent meanwhile are dropped and counted by the sender.
    pub fn cut(&self, a: NodeId, b: NodeId) {
        let mut state = self.lock();
        state.cut.insert((a, b));
        state.cut.insert((b, a));
    }

    /// Restores the link between `a` and `b`.
    pub fn heal(&self, a: NodeId, b: NodeId) {
        let mut state = self.lock();
        state.cut.remove(&(a, b));
        state.cut.remove(&(b, a));
    }

    /// The open transport at `addr`, unless the link from `from` to it is cut.
    fn reach(&self, from: NodeId, addr: SocketAddr) -> Option<Arc<Shared>> {
        let state = self.lock();
        let target = state.transports.get(&addr)?.upgrade()?;
        (!state.is_cut(from, target.node)).then_some(target)
    }
}

/// A gossip socket on a [`MemoryNetwork`]: datagrams to addresses, datagrams in with their
/// source. Unbound when dropped.
pub struct MemoryDatagrams {
    network: MemoryNetwork,
    local_addr: SocketAddr,
    socket: u64,
    inbox: mpsc::Receiver<Datagram>,
}

impl std::fmt::Debug for MemoryDatagrams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryDatagrams").field("local_addr", &self.local_addr).finish_non_exhaustive()
    }
}

impl MemoryDatagrams {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Sends `datagram` to `to`: delivered if a socket is bound there and its queue has room,
    /// else lost (as UDP loses it). Never waits.
    pub fn send_to(&self, datagram: &[u8], to: SocketAddr) {
        let state = self.network.lock();
        if let Some((_, sender)) = state.datagrams.get(&to) {
            let _ = sender.try_send((self.local_addr, datagram.to_vec()));
        }
    }

    /// The next datagram: its length (cut to `buf`'s, as UDP cuts it) and source.
    pub async fn recv_from(&mut self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        let Some((from, datagram)) = self.inbox.recv().await else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        let len = datagram.len().min(buf.len());
        buf[..len].copy_from_slice(&datagram[..len]);
        Ok((len, from))
    }
}

impl Drop for MemoryDatagrams {
    fn drop(&mut self) {
        let mut state = self.network.lock();
        if state.datagrams.get(&self.local_addr).is_some_and(|(socket, _)| *socket == self.socket) {
            state.datagrams.remove(&self.local_addr);
        }
    }
}

/// A node's peer transport on a [`MemoryNetwork`]. Cheap to clone; clones are the same
/// transport.
#[derive(Clone)]
pub struct MemoryTransport {
    shared: Arc<Shared>,
}

struct Shared {
    node: NodeId,
    local_addr: SocketAddr,
    network: MemoryNetwork,
    config: TransportConfig,
    counters: Counters,
    inbox: mpsc::Sender<Received>,
    queries: OnceLock<QueryHandler>,
    closed: AtomicBool,
    /// Peers sent to (bounded by `peers_max`, emptied by `forget`).
    peers: Mutex<HashSet<NodeId>>,
}

impl Shared {
    /// A frame from `from` arrives: bounded by this end's `frame_len_max` and receive channel.
    fn accept(&self, from: NodeId, frame: Vec<u8>) {
        let counters = &self.counters;
        if frame.len() > self.config.frame_len_max {
            bump(&counters.receive_oversize_frames);
            bump(&counters.receive_dropped_frames);
            return;
        }
        let len_bytes = frame.len() as u64;
        match self.inbox.try_send((from, frame)) {
            Ok(()) => {
                bump(&counters.received_frames);
                add(&counters.received_bytes, len_bytes);
            }
            Err(_) => bump(&counters.receive_dropped_frames),
        }
    }
}

impl std::fmt::Debug for MemoryTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryTransport")
            .field("node", &self.shared.node)
            .field("local_addr", &self.shared.local_addr)
            .finish_non_exhaustive()
    }
}

impl MemoryTransport {
    fn ensure_open(&self) -> Result<(), TransportError> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(TransportError::Closed);
        }
        Ok(())
    }

    /// The transport at `addr` if it is reachable and is `expected`.
    fn admitted(&self, addr: SocketAddr, expected: NodeId) -> Result<Arc<Shared>, TransportError> {
        let target =
            self.shared.network.reach(self.shared.node, addr).ok_or(TransportError::Unreachable { addr })?;
        if target.node != expected {
            return Err(SecurityError::NodeMismatch { expected, found: target.node }.into());
        }
        Ok(target)
    }

    fn enqueue(&self, to: NodeId, frame: &[u8]) -> Result<(), TransportError> {
        self.ensure_open()?;
        let max_bytes = self.shared.config.frame_len_max;
        if frame.is_empty() || frame.len() > max_bytes {
            return Err(TransportError::FrameLen { len_bytes: frame.len(), max_bytes });
        }
        let mut peers = self.shared.peers.lock();
        let max = self.shared.config.peers_max;
        if !peers.contains(&to) && peers.len() >= max {
            return Err(TransportError::PeersFull { max });
        }
        peers.insert(to);
        Ok(())
    }
}

#[async_trait::async_trait]
impl PeerTransport for MemoryTransport {
    fn node_id(&self) -> NodeId {
        self.shared.node
    }

    fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    fn stats(&self) -> TransportStats {
        self.shared.counters.snapshot()
    }

    fn send(&self, to: NodeId, addr: SocketAddr, frame: Vec<u8>) -> Result<(), TransportError> {
        let counters = &self.shared.counters;
        if let Err(error) = self.enqueue(to, &frame) {
            bump(&counters.send_dropped_frames);
            return Err(error);
        }
        match self.admitted(addr, to) {
            Ok(target) if !target.closed.load(Ordering::Acquire) => {
                bump(&counters.sent_frames);
                add(&counters.sent_bytes, frame.len() as u64);
                target.accept(self.shared.node, frame);
            }
            Ok(_) => bump(&counters.send_dropped_frames),
            Err(error) => {
                bump(&counters.send_dropped_frames);
                debug!(peer = ?to, %addr, %error, "frame dropped");
            }
        }
        Ok(())
    }

    async fn verify(&self, addr: SocketAddr, expected: NodeId) -> Result<(), TransportError> {
        self.ensure_open()?;
        let target = self.admitted(addr, expected)?;
        if target.closed.load(Ordering::Acquire) {
            return Err(TransportError::Unreachable { addr });
        }
        Ok(())
    }

    fn set_query_handler(&self, handler: QueryHandler) -> bool {
        self.shared.queries.set(handler).is_ok()
    }

    async fn query(
        &self,
        to: NodeId,
        addr: SocketAddr,
        question: &[u8],
        _limit: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        if question.is_empty() || question.len() > QUERY_LEN_MAX {
            return Err(TransportError::QueryLen { len_bytes: question.len(), max_bytes: QUERY_LEN_MAX });
        }
        self.ensure_open()?;
        let target = self.admitted(addr, to)?;
        // The handler answers at once: the limit cannot be exceeded.
        let handler = target.queries.get().ok_or(TransportError::QueryRefused)?;
        let mut answer = handler(self.shared.node, question);
        answer.truncate(target.config.frame_len_max);
        if answer.len() > self.shared.config.frame_len_max {
            return Err(TransportError::Answer(ReadToEndError::TooLong));
        }
        Ok(answer)
    }

    fn forget(&self, peer: NodeId) {
        self.shared.peers.lock().remove(&peer);
    }

    async fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        let mut state = self.shared.network.lock();
        let ours = state
            .transports
            .get(&self.shared.local_addr)
            .is_some_and(|t| t.as_ptr() == Arc::as_ptr(&self.shared));
        if ours {
            state.transports.remove(&self.shared.local_addr);
        }
    }
}
