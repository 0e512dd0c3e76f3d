//! Peers over QUIC (quinn) with mutual TLS: frames out to members, authenticated frames in.
//!
//! One [`QuicTransport`] per node: a quinn endpoint that is both server and client, secured by the
//! node's [`NodeIdentity`] (see [`crate::security`]).
//!
//! - **Out.** [`QuicTransport::send`] never waits: it queues one encoded frame for a peer and returns.
//!   Each peer has one long-lived outbound connection (opened on demand, reused) and a worker that
//!   writes the frames on one long-lived unidirectional stream, each prefixed by its length (4
//!   bytes, big endian); every write takes all the frames queued since the last one (batches grow
//!   with the load, a lone frame leaves at once). With a peer of an older build (ALPN
//!   [`crate::security::ALPN`] negotiated instead of [`crate::security::ALPN_STREAMED`]) every
//!   frame goes on its own stream (write all, finish). The queue per peer is
//!   bounded (`send_queue_len_max`); a frame over the bound, or one that cannot be written (peer
//!   unreachable, in reconnect backoff, write timeout), is dropped and counted. Dropping is safe:
//!   the core retransmits. After a failed connect, the next attempt waits an exponential backoff
//!   (`backoff_initial_ms` doubling up to `backoff_max_ms`).
//! - **In.** Every incoming connection must complete mutual TLS with a certificate from the
//!   cluster CA that names a node; that node is the `from` of every frame read on the
//!   connection — never anything the frame says. Frames are read off the long-lived stream as they
//!   complete (one task per stream, not per frame); a frame longer than `frame_len_max` is skipped
//!   unread and counted, one not complete within a time limit stops its stream (the sender opens
//!   another), the connection stays up. From a peer of an older build each stream is one frame,
//!   read to its end with the same size and time limits. Frames are delivered as
//!   `(NodeId, Vec<u8>)` on a bounded channel; a full channel drops and counts. A zero-length
//!   stream is a probe ([`QuicTransport::verify`]) and is never delivered.
//! - **Admission.** [`QuicTransport::verify`] is the "gossip proposes, mTLS confirms" check: a
//!   handshake with the proposed member's address whose certificate must name the proposed node,
//!   and a probe stream the member must acknowledge (so it accepted our certificate too).
//!
//! - **Queries.** [`QuicTransport::query`] asks a peer a question and waits for the answer on one
//!   bidirectional stream of the outbound connection (used for the members' top-keys sketches:
//!   [`crate::Node::top`]). The peer answers with the handler set by
//!   [`QuicTransport::set_query_handler`], at most [`QUERIES_PER_CONNECTION_MAX`] at once per
//!   connection; a question is at most [`QUERY_LEN_MAX`] bytes, an answer at most
//!   `frame_len_max`, both within the read and write time limits. A peer without a handler
//!   resets the stream. The asker is authenticated like every frame's sender.
//!
//! Everything is bounded: peers, inbound connections, streams per connection, queues, frame
//! length, handshake, write and read times.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, MutexGuard, OnceLock};
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Endpoint, EndpointConfig, VarInt};
use quinn_proto::HashedConnectionIdGenerator;
use ratemesh_core::NodeId;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::{Instant, timeout};
use tracing::info;

use super::{
    Counters, PeerTransport, QUERIES_PER_CONNECTION_MAX, QUERY_LEN_MAX, QueryHandler, Received,
    TransportConfig, TransportError, TransportStats, bump, millis,
};
use crate::security::{ClusterSecurity, NodeIdentity, admit};
use crate::sync::Mutex;

mod inbound;
mod outbound;

use inbound::{Acceptor, run_acceptor};
use outbound::{Dialer, Link, Peer, peer_certificates, probe, run_sender};

/// Stream stop code: this node answers no queries.
pub(crate) const STOP_NO_HANDLER: u32 = 3;

/// Application close code: orderly shutdown.
pub(crate) const CLOSE_SHUTDOWN: u32 = 0;
/// How long a closing transport waits for its connections' close to go out (not for their
/// draining period to end).
pub(crate) const CLOSE_NOTIFY_WAIT: Duration = Duration::from_millis(50);
/// Application close code: the peer's certificate names no node.
pub(crate) const CLOSE_UNAUTHENTICATED: u32 = 1;
/// Stream stop code: the frame exceeds `frame_len_max`.
pub(crate) const STOP_TOO_LONG: u32 = 1;
/// Stream stop code: the frame was not complete within `stream_read_timeout_ms`.
pub(crate) const STOP_TIMEOUT: u32 = 2;

/// A node's peer transport. Cheap to clone (all clones share one endpoint); dropping the last
/// clone closes the endpoint abruptly; [`QuicTransport::close`] closes it gracefully.
#[derive(Clone)]
pub struct QuicTransport {
    shared: Arc<Shared>,
}

struct Shared {
    node: NodeId,
    local_addr: SocketAddr,
    dialer: Dialer,
    closing: watch::Sender<bool>,
    runtime: tokio::runtime::Handle,
    peers: Mutex<HashMap<NodeId, Peer>>,
    queries: Arc<OnceLock<QueryHandler>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.dialer.endpoint.close(VarInt::from_u32(CLOSE_SHUTDOWN), b"dropped");
    }
}

impl QuicTransport {
    /// Binds `addr` (use port 0 for an ephemeral port) as `node`, secured by `security`, and
    /// returns the transport and the channel of authenticated received frames. Must be called
    /// inside a tokio runtime; the transport's tasks run on it.
    pub fn bind(
        addr: SocketAddr,
        security: &ClusterSecurity,
        node: NodeId,
        config: TransportConfig,
    ) -> Result<(Self, mpsc::Receiver<Received>), TransportError> {
        Self::bind_with_identity(addr, &security.identity(node)?, config)
    }

    /// Like [`QuicTransport::bind`], with an identity built beforehand (it names the node).
    pub fn bind_with_identity(
        addr: SocketAddr,
        identity: &NodeIdentity,
        config: TransportConfig,
    ) -> Result<(Self, mpsc::Receiver<Received>), TransportError> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| TransportError::NoRuntime)?;
        let endpoint = open_endpoint(addr, identity, &config)?;
        let local_addr = endpoint.local_addr().map_err(|source| TransportError::Bind { addr, source })?;
        let config = Arc::new(config);
        let counters = Arc::new(Counters::default());
        let (closing, closing_seen) = watch::channel(false);
        let (delivered, received) = mpsc::channel(config.inbound_queue_len_max);
        let acceptor = Acceptor {
            endpoint: endpoint.clone(),
            counters: counters.clone(),
            config: config.clone(),
            delivered,
            slots: Arc::new(Semaphore::new(config.connections_inbound_max)),
            queries: Arc::new(OnceLock::new()),
        };
        let queries = acceptor.queries.clone();
        drop(runtime.spawn(run_acceptor(acceptor)));
        let shared = Shared {
            node: identity.node_id(),
            local_addr,
            dialer: Dialer { endpoint, counters, config, closing: closing_seen },
            closing,
            runtime,
            peers: Mutex::new(HashMap::new()),
            queries,
        };
        info!(node = ?shared.node, %local_addr, "peer transport bound");
        Ok((Self { shared: Arc::new(shared) }, received))
    }

    fn enqueue(&self, to: NodeId, addr: SocketAddr, frame: Vec<u8>) -> Result<(), TransportError> {
        // A frame's length prefix on the stream is 4 bytes.
        let max_bytes = self.shared.dialer.config.frame_len_max.min(u32::MAX as usize);
        if frame.is_empty() || frame.len() > max_bytes {
            return Err(TransportError::FrameLen { len_bytes: frame.len(), max_bytes });
        }
        let mut peers = self.peers()?;
        let stale = peers.get(&to).is_some_and(|peer| peer.link.addr != addr);
        if !peers.contains_key(&to) || stale {
            let peer = self.admit_peer(&peers, Arc::new(Link::new(to, addr)))?;
            peers.insert(to, peer);
        }
        let Some(peer) = peers.get(&to) else { return Err(TransportError::Closed) };
        peer.queue.try_send(frame).map_err(|error| match error {
            mpsc::error::TrySendError::Full(_) => TransportError::QueueFull { peer: to },
            mpsc::error::TrySendError::Closed(_) => TransportError::Closed,
        })
    }

    /// A new table entry for `link`, if the table has room for it.
    fn admit_peer(&self, peers: &HashMap<NodeId, Peer>, link: Arc<Link>) -> Result<Peer, TransportError> {
        let max = self.shared.dialer.config.peers_max;
        if !peers.contains_key(&link.peer) && peers.len() >= max {
            return Err(TransportError::PeersFull { max });
        }
        let (queue, frames) = mpsc::channel(self.shared.dialer.config.send_queue_len_max);
        let worker = self.shared.runtime.spawn(run_sender(link.clone(), self.shared.dialer.clone(), frames));
        Ok(Peer { link, queue, worker: Some(worker) })
    }

    async fn try_verify(&self, addr: SocketAddr, expected: NodeId) -> Result<(), TransportError> {
        let known =
            self.peers()?.get(&expected).map(|peer| peer.link.clone()).filter(|link| link.addr == addr);
        let link = known.unwrap_or_else(|| Arc::new(Link::new(expected, addr)));
        let conn = link.connection(&self.shared.dialer, false).await?;
        admit(expected, &peer_certificates(&conn)?)?;
        let probed = probe(&conn, millis(self.shared.dialer.config.handshake_timeout_ms)).await;
        if probed.is_err() && conn.close_reason().is_some() {
            link.broke(&conn, &self.shared.dialer.config).await;
        }
        probed?;
        self.keep_link(link)
    }

    /// Puts a verified link in the table, unless the peer is there already at that address or
    /// the table is full (the connection is then simply not reused).
    fn keep_link(&self, link: Arc<Link>) -> Result<(), TransportError> {
        let mut peers = self.peers()?;
        if peers.get(&link.peer).is_some_and(|peer| peer.link.addr == link.addr) {
            return Ok(());
        }
        if let Ok(peer) = self.admit_peer(&peers, link.clone()) {
            peers.insert(link.peer, peer);
        }
        Ok(())
    }

    fn peers(&self) -> Result<MutexGuard<'_, HashMap<NodeId, Peer>>, TransportError> {
        if *self.shared.closing.borrow() {
            return Err(TransportError::Closed);
        }
        Ok(self.lock_peers())
    }

    fn lock_peers(&self) -> MutexGuard<'_, HashMap<NodeId, Peer>> {
        // A panic while holding the lock cannot leave the map inconsistent (single inserts and
        // removes), so a poisoned lock is still usable.
        self.shared.peers.lock()
    }
}

#[async_trait::async_trait]
impl PeerTransport for QuicTransport {
    /// This node.
    fn node_id(&self) -> NodeId {
        self.shared.node
    }

    /// The bound address (with the actual port when bound to port 0).
    fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// A snapshot of the counters.
    fn stats(&self) -> TransportStats {
        self.shared.dialer.counters.snapshot()
    }

    /// Queues `frame` for `to` at `addr` without waiting. `Err` means the frame was dropped (and
    /// counted): empty or too long, queue full, peer table full, or transport closed. A peer
    /// seen at a new address gets a new connection.
    fn send(&self, to: NodeId, addr: SocketAddr, frame: Vec<u8>) -> Result<(), TransportError> {
        let result = self.enqueue(to, addr, frame);
        if result.is_err() {
            bump(&self.shared.dialer.counters.send_dropped_frames);
        }
        result
    }

    /// The admission check ("gossip proposes, mTLS confirms"): `Ok` only after a mutual-TLS
    /// handshake with `addr` whose certificate, from the cluster CA, names `expected`, and that
    /// the peer completed too (it acknowledged a probe, so it accepted our certificate). Reuses
    /// the peer's live connection if there is one; otherwise connects now (ignoring any reconnect
    /// backoff) and keeps the connection for later sends.
    async fn verify(&self, addr: SocketAddr, expected: NodeId) -> Result<(), TransportError> {
        let result = self.try_verify(addr, expected).await;
        if let Err(error) = &result {
            info!(peer = ?expected, %addr, %error, "peer not admitted");
        }
        result
    }

    /// Sets how this node answers peers' queries (once: later calls change nothing and return
    /// `false`). Until then queries are refused (the stream is reset).
    fn set_query_handler(&self, handler: QueryHandler) -> bool {
        self.shared.queries.set(handler).is_ok()
    }

    /// Asks `to` at `addr` a question and returns its answer, all within `limit`: over the
    /// peer's live connection (or a new one, honoring the reconnect backoff), one bidirectional
    /// stream, the answer read to its end (at most `frame_len_max` bytes).
    async fn query(
        &self,
        to: NodeId,
        addr: SocketAddr,
        question: &[u8],
        limit: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        if question.is_empty() || question.len() > QUERY_LEN_MAX {
            return Err(TransportError::QueryLen { len_bytes: question.len(), max_bytes: QUERY_LEN_MAX });
        }
        let known = self.peers()?.get(&to).map(|peer| peer.link.clone()).filter(|link| link.addr == addr);
        let link = known.unwrap_or_else(|| Arc::new(Link::new(to, addr)));
        let dialer = &self.shared.dialer;
        let asked = timeout(limit, async {
            let conn = link.connection(dialer, true).await?;
            let (mut send, mut recv) = conn.open_bi().await?;
            send.write_all(question).await?;
            send.finish()?;
            Ok::<Vec<u8>, TransportError>(recv.read_to_end(dialer.config.frame_len_max).await?)
        })
        .await;
        asked.map_err(|_| TransportError::QueryTimeout)?
    }

    /// Drops `peer`'s queue, worker and connection (a member left). Later sends reconnect.
    fn forget(&self, peer: NodeId) {
        if let Ok(mut peers) = self.peers() {
            peers.remove(&peer);
        }
    }

    /// Closes gracefully: refuses new sends, abandons connects in progress, lets every peer's
    /// worker write out its queue over its live connection and wait for the peer's
    /// acknowledgement (within `close_timeout_ms`), then closes the endpoint and gives the
    /// connections 50 ms to send their close to the peers. Frames still queued
    /// then, or queued for peers without a live connection, are lost (the core's
    /// acknowledgements tell which). Idempotent.
    async fn close(&self) {
        self.shared.closing.send_replace(true);
        let peers = std::mem::take(&mut *self.lock_peers());
        // Dropping a peer whose worker was taken out closes its queue: the worker drains it.
        let workers: Vec<JoinHandle<()>> =
            peers.into_values().filter_map(|mut peer| peer.worker.take()).collect();
        let stragglers: Vec<AbortHandle> = workers.iter().map(JoinHandle::abort_handle).collect();
        let limit = millis(self.shared.dialer.config.close_timeout_ms);
        let deadline = Instant::now() + limit;
        for worker in workers {
            let _ = tokio::time::timeout_at(deadline, worker).await;
        }
        stragglers.iter().for_each(AbortHandle::abort);
        let endpoint = &self.shared.dialer.endpoint;
        endpoint.close(VarInt::from_u32(CLOSE_SHUTDOWN), b"shutdown");
        // Not the whole draining period (three probe timeouts, hundreds of milliseconds on a
        // loaded machine): the close goes out on each connection's next poll, and the draining
        // only absorbs a peer's late packets, which a process that exits need not wait for.
        let _ = timeout(limit.min(CLOSE_NOTIFY_WAIT), endpoint.wait_idle()).await;
        info!(node = ?self.shared.node, "peer transport closed");
    }
}

impl std::fmt::Debug for QuicTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicTransport")
            .field("node", &self.shared.node)
            .field("local_addr", &self.shared.local_addr)
            .finish_non_exhaustive()
    }
}

/// A quinn endpoint serving `identity` on `addr`, with `identity`'s client configuration as the
/// default for outbound connections.
fn open_endpoint(
    addr: SocketAddr,
    identity: &NodeIdentity,
    config: &TransportConfig,
) -> Result<Endpoint, TransportError> {
    let server_tls = QuicServerConfig::try_from(identity.server_config()?)?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_tls));
    server.transport_config(Arc::new(transport_config(config, Side::Server)?));
    server.max_incoming(config.connections_inbound_max);
    server.migration(false);
    let client_tls = QuicClientConfig::try_from(identity.client_config()?)?;
    let mut client = quinn::ClientConfig::new(Arc::new(client_tls));
    client.transport_config(Arc::new(transport_config(config, Side::Client)?));
    let mut endpoint_config = EndpointConfig::new(Arc::new(identity.stateless_reset_key()));
    let cid_key = identity.connection_id_key()?;
    endpoint_config.cid_generator(move || Box::new(HashedConnectionIdGenerator::from_key(cid_key)));
    let bind_error = |source| TransportError::Bind { addr, source };
    let socket = UdpSocket::bind(addr).map_err(bind_error)?;
    let runtime = quinn::default_runtime().ok_or(TransportError::NoRuntime)?;
    let mut endpoint = Endpoint::new(endpoint_config, Some(server), socket, runtime).map_err(bind_error)?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Server,
    Client,
}

/// Packets a peer may receive before it must acknowledge them at once (QUIC acknowledgement
/// frequency extension, negotiated: a peer of an older build acknowledges every other packet).
/// A connection carries frames one way only (each node writes on the connection it dialed), so
/// every acknowledgement is a packet of its own: one per 16 packets or per [`ACK_DELAY_MAX`]
/// instead of one per 2. The core's own acknowledgements and retransmissions do not depend on
/// QUIC's timing; a lost packet is retransmitted by QUIC a little later (its loss detection
/// allows for the peer's acknowledgement delay).
const ACK_ELICITING_THRESHOLD: u32 = 16;
/// The longest a peer delays an acknowledgement (see [`ACK_ELICITING_THRESHOLD`]).
const ACK_DELAY_MAX: Duration = Duration::from_millis(10);

/// QUIC transport parameters. Inbound connections (server side) accept unidirectional streams
/// (frames), `streams_per_connection_max` at once, and [`QUERIES_PER_CONNECTION_MAX`]
/// bidirectional ones (queries); outbound connections accept no streams and send keep-alives. Both ask their peer to
/// acknowledge less often ([`ACK_ELICITING_THRESHOLD`]).
fn transport_config(config: &TransportConfig, side: Side) -> Result<quinn::TransportConfig, TransportError> {
    let idle = quinn::IdleTimeout::try_from(millis(config.idle_timeout_ms))
        .map_err(|_| TransportError::Config { reason: "idle_timeout_ms is too large" })?;
    let (uni_streams, bidi_streams) = match side {
        Side::Server => (config.streams_per_connection_max, QUERIES_PER_CONNECTION_MAX),
        Side::Client => (0, 0),
    };
    let mut transport = quinn::TransportConfig::default();
    let mut acks = quinn::AckFrequencyConfig::default();
    acks.ack_eliciting_threshold(VarInt::from_u32(ACK_ELICITING_THRESHOLD))
        .max_ack_delay(Some(ACK_DELAY_MAX));
    transport
        .max_concurrent_uni_streams(VarInt::from_u32(uni_streams))
        .max_concurrent_bidi_streams(VarInt::from_u32(bidi_streams))
        .max_idle_timeout(Some(idle))
        .ack_frequency_config(Some(acks));
    if side == Side::Client {
        transport.keep_alive_interval(Some(millis(config.keep_alive_interval_ms)));
    }
    Ok(transport)
}
