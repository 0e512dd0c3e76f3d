//! Peers over QUIC (quinn) with mutual TLS: frames out to members, authenticated frames in.
//!
//! One [`Transport`] per node: a quinn endpoint that is both server and client, secured by the
//! node's [`NodeIdentity`] (see [`crate::security`]).
//!
//! - **Out.** [`Transport::send`] never waits: it queues one encoded frame for a peer and returns.
//!   Each peer has one long-lived outbound connection (opened on demand, reused) and a worker that
//!   writes every frame on its own unidirectional stream (write all, finish). The queue per peer is
//!   bounded (`send_queue_len_max`); a frame over the bound, or one that cannot be written (peer
//!   unreachable, in reconnect backoff, write timeout), is dropped and counted. Dropping is safe:
//!   the core retransmits. After a failed connect, the next attempt waits an exponential backoff
//!   (`backoff_initial_ms` doubling up to `backoff_max_ms`).
//! - **In.** Every incoming connection must complete mutual TLS with a certificate from the
//!   cluster CA that names a node; that node is the `from` of every frame read on the
//!   connection — never anything the frame says. Each stream is read to its end with a size limit
//!   (`frame_len_max`) and a time limit; oversize, reset or slow streams are dropped and counted,
//!   the connection stays up. Frames are delivered as `(NodeId, Vec<u8>)` on a bounded channel; a
//!   full channel drops and counts. A zero-length stream is a probe ([`Transport::verify`]) and is
//!   never delivered.
//! - **Admission.** [`Transport::verify`] is the "gossip proposes, mTLS confirms" check: a
//!   handshake with the proposed member's address whose certificate must name the proposed node,
//!   and a probe stream the member must acknowledge (so it accepted our certificate too).
//!
//! - **Queries.** [`Transport::query`] asks a peer a question and waits for the answer on one
//!   bidirectional stream of the outbound connection (used for the members' top-keys sketches:
//!   [`crate::Node::top`]). The peer answers with the handler set by
//!   [`Transport::set_query_handler`], at most [`QUERIES_PER_CONNECTION_MAX`] at once per
//!   connection; a question is at most [`QUERY_LEN_MAX`] bytes, an answer at most
//!   `frame_len_max`, both within the read and write time limits. A peer without a handler
//!   resets the stream. The asker is authenticated like every frame's sender.
//!
//! Everything is bounded: peers, inbound connections, streams per connection, queues, frame
//! length, handshake, write and read times.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use quinn::crypto::rustls::{NoInitialCipherSuite, QuicClientConfig, QuicServerConfig};
use quinn::{Connection, Endpoint, EndpointConfig, Incoming, ReadToEndError, RecvStream, SendStream, VarInt};
use quinn_proto::HashedConnectionIdGenerator;
use ratemesh_core::NodeId;
use ratemesh_core::wire::FRAME_LEN_MAX_DEFAULT;
use rustls_pki_types::CertificateDer;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::{Instant, timeout};
use tracing::{debug, info};

use crate::security::{ClusterSecurity, NodeIdentity, SecurityError, admit, node_dns_name, peer_node_id};

/// A frame received from an authenticated peer: the sender (from its certificate) and the bytes.
pub type Received = (NodeId, Vec<u8>);

/// Answers a peer's query: the asker (from its certificate) and the question's bytes in, the
/// answer's bytes out. Runs on the transport's tasks: it must not block.
pub type QueryHandler = Arc<dyn Fn(NodeId, &[u8]) -> Vec<u8> + Send + Sync>;

/// Concurrent queries a peer may ask on one connection (bidirectional streams).
pub const QUERIES_PER_CONNECTION_MAX: u32 = 4;
/// Largest question of a query, in bytes.
pub const QUERY_LEN_MAX: usize = 4096;
/// Stream stop code: this node answers no queries.
const STOP_NO_HANDLER: u32 = 3;

/// Application close code: orderly shutdown.
const CLOSE_SHUTDOWN: u32 = 0;
/// Application close code: the peer's certificate names no node.
const CLOSE_UNAUTHENTICATED: u32 = 1;
/// Stream stop code: the frame exceeds `frame_len_max`.
const STOP_TOO_LONG: u32 = 1;
/// Stream stop code: the frame was not complete within `stream_read_timeout_ms`.
const STOP_TIMEOUT: u32 = 2;
/// The backoff doubles at most this many times (then it stays at `backoff_max_ms`).
const BACKOFF_DOUBLINGS_MAX: u32 = 20;

/// Bounds and timings of a [`Transport`]. Every field has a default ([`Default`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportConfig {
    /// Largest frame sent or accepted, in bytes (default: the core's `FRAME_LEN_MAX_DEFAULT`,
    /// 1 MiB). Longer incoming streams are stopped and counted.
    pub frame_len_max: usize,
    /// Capacity of the channel of received frames (default 1024). Frames that find it full are
    /// dropped and counted.
    pub inbound_queue_len_max: usize,
    /// Frames queued per peer before new ones are dropped (default 256).
    pub send_queue_len_max: usize,
    /// Peers with an outbound queue and connection (default 1024). Sends to further peers are
    /// refused until [`Transport::forget`] makes room.
    pub peers_max: usize,
    /// Incoming connections served at once (default 1024); more are refused.
    pub connections_inbound_max: usize,
    /// Concurrent incoming streams a peer may open on one connection (default 128).
    pub streams_per_connection_max: u32,
    /// Limit on a connect and TLS handshake (default 5000 ms).
    pub handshake_timeout_ms: u64,
    /// Limit on writing one frame, including waiting for stream credit (default 5000 ms).
    pub write_timeout_ms: u64,
    /// Limit on reading one incoming stream to its end (default 10000 ms).
    pub stream_read_timeout_ms: u64,
    /// A connection with no traffic for this long is closed (default 15000 ms).
    pub idle_timeout_ms: u64,
    /// Outbound connections send a keep-alive this often (default 3000 ms).
    pub keep_alive_interval_ms: u64,
    /// First reconnect delay after a failed connect (default 50 ms).
    pub backoff_initial_ms: u64,
    /// Largest reconnect delay (default 5000 ms).
    pub backoff_max_ms: u64,
    /// Limit on [`Transport::close`] flushing queued frames and closing (default 2000 ms).
    pub close_timeout_ms: u64,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            frame_len_max: FRAME_LEN_MAX_DEFAULT,
            inbound_queue_len_max: 1024,
            send_queue_len_max: 256,
            peers_max: 1024,
            connections_inbound_max: 1024,
            streams_per_connection_max: 128,
            handshake_timeout_ms: 5000,
            write_timeout_ms: 5000,
            stream_read_timeout_ms: 10_000,
            idle_timeout_ms: 15_000,
            keep_alive_interval_ms: 3000,
            backoff_initial_ms: 50,
            backoff_max_ms: 5000,
            close_timeout_ms: 2000,
        }
    }
}

impl TransportConfig {
    fn validate(&self) -> Result<(), TransportError> {
        let checks = [
            (self.frame_len_max > 0, "frame_len_max must be positive"),
            (self.inbound_queue_len_max > 0, "inbound_queue_len_max must be positive"),
            (self.send_queue_len_max > 0, "send_queue_len_max must be positive"),
            (self.peers_max > 0, "peers_max must be positive"),
            (self.connections_inbound_max > 0, "connections_inbound_max must be positive"),
            (self.streams_per_connection_max > 0, "streams_per_connection_max must be positive"),
            (self.backoff_initial_ms <= self.backoff_max_ms, "backoff_initial_ms exceeds backoff_max_ms"),
            (
                self.keep_alive_interval_ms < self.idle_timeout_ms,
                "keep-alive must be shorter than idle timeout",
            ),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, reason)) => Err(TransportError::Config { reason }),
            None => Ok(()),
        }
    }

    /// The reconnect delay after `failures` consecutive failed connects (≥ 1).
    fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(BACKOFF_DOUBLINGS_MAX);
        let delay_ms = self.backoff_initial_ms.saturating_mul(1_u64 << doublings);
        Duration::from_millis(delay_ms.min(self.backoff_max_ms))
    }
}

/// Why a transport operation failed. Send-side errors mean the frame was dropped (and counted);
/// nothing else changed. Connect and verify errors leave the peer unadmitted.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The configuration is inconsistent (operator error; nothing was bound).
    #[error("invalid transport configuration: {reason}")]
    Config {
        /// What is wrong.
        reason: &'static str,
    },
    /// Security setup failed, or a peer's certificate was refused.
    #[error(transparent)]
    Security(#[from] SecurityError),
    /// `bind` was called outside a tokio runtime (integration bug).
    #[error("no tokio runtime: bind inside one")]
    NoRuntime,
    /// The UDP socket could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: io::Error,
    },
    /// The TLS configuration is unusable for QUIC (a local bug).
    #[error("TLS configuration unusable for QUIC: {0}")]
    QuicTls(#[from] NoInitialCipherSuite),
    /// A connection could not be started (for example an invalid address).
    #[error("connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    /// The connection failed or was closed: handshake refused by either side, peer gone, timeout.
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// The handshake (or the admission probe) did not complete in time.
    #[error("handshake timed out")]
    HandshakeTimeout,
    /// The peer's last connect failed; no new attempt before the backoff expires.
    #[error("peer {peer:?} is in reconnect backoff")]
    Backoff {
        /// The peer.
        peer: NodeId,
    },
    /// Writing the frame's stream failed.
    #[error("write: {0}")]
    Write(#[from] quinn::WriteError),
    /// The stream was closed before it could be finished.
    #[error("stream: {0}")]
    Stream(#[from] quinn::ClosedStream),
    /// The admission probe was not acknowledged.
    #[error("probe: {0}")]
    Probe(#[from] quinn::StoppedError),
    /// Writing the frame did not complete within `write_timeout_ms`.
    #[error("write timed out")]
    WriteTimeout,
    /// The frame is empty or longer than `frame_len_max` (caller error).
    #[error("frame of {len_bytes} bytes is empty or exceeds {max_bytes}")]
    FrameLen {
        /// The frame's length.
        len_bytes: usize,
        /// The bound.
        max_bytes: usize,
    },
    /// The peer's send queue is full.
    #[error("send queue to {peer:?} is full")]
    QueueFull {
        /// The peer.
        peer: NodeId,
    },
    /// The peer table is full (`peers_max`).
    #[error("peer table is full ({max} peers)")]
    PeersFull {
        /// The bound.
        max: usize,
    },
    /// The transport is closed.
    #[error("transport is closed")]
    Closed,
    /// A query's question is empty or over [`QUERY_LEN_MAX`].
    #[error("query of {len_bytes} bytes (1 to {max_bytes} are sent)")]
    QueryLen {
        /// The question's length.
        len_bytes: usize,
        /// The bound.
        max_bytes: usize,
    },
    /// Reading a query's answer failed (stream reset by the peer, answer over `frame_len_max`).
    #[error("query answer: {0}")]
    Answer(#[from] ReadToEndError),
    /// The query was not answered within its time limit.
    #[error("query timed out")]
    QueryTimeout,
}

/// Counters of a [`Transport`] since it was bound (a snapshot; all monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Frames written to a peer's stream.
    pub sent_frames: u64,
    /// Bytes of those frames.
    pub sent_bytes: u64,
    /// Frames dropped on the send side: queue full, peer table full, invalid length, peer
    /// unreachable or in backoff, write failed or timed out.
    pub send_dropped_frames: u64,
    /// Frames delivered to the receive channel.
    pub received_frames: u64,
    /// Bytes of those frames.
    pub received_bytes: u64,
    /// Incoming streams dropped: oversize, reset, too slow, or receive channel full.
    pub receive_dropped_frames: u64,
    /// Of those, streams longer than `frame_len_max`.
    pub receive_oversize_frames: u64,
    /// Outbound connections established (handshake done, peer named as expected).
    pub connections_opened: u64,
    /// Outbound connects that failed (refused, timed out, wrong certificate).
    pub connect_failures: u64,
    /// Inbound connections authenticated (certificate from the cluster CA naming a node).
    pub connections_accepted: u64,
    /// Inbound handshakes that failed: no certificate, another CA, no node name, timeout.
    pub handshake_rejections: u64,
    /// Inbound connections refused because `connections_inbound_max` were being served.
    pub connections_refused: u64,
}

#[derive(Default)]
struct Counters {
    sent_frames: AtomicU64,
    sent_bytes: AtomicU64,
    send_dropped_frames: AtomicU64,
    received_frames: AtomicU64,
    received_bytes: AtomicU64,
    receive_dropped_frames: AtomicU64,
    receive_oversize_frames: AtomicU64,
    connections_opened: AtomicU64,
    connect_failures: AtomicU64,
    connections_accepted: AtomicU64,
    handshake_rejections: AtomicU64,
    connections_refused: AtomicU64,
}

fn add(counter: &AtomicU64, amount: u64) {
    counter.fetch_add(amount, Ordering::Relaxed);
}

fn bump(counter: &AtomicU64) {
    add(counter, 1);
}

impl Counters {
    fn snapshot(&self) -> TransportStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        TransportStats {
            sent_frames: get(&self.sent_frames),
            sent_bytes: get(&self.sent_bytes),
            send_dropped_frames: get(&self.send_dropped_frames),
            received_frames: get(&self.received_frames),
            received_bytes: get(&self.received_bytes),
            receive_dropped_frames: get(&self.receive_dropped_frames),
            receive_oversize_frames: get(&self.receive_oversize_frames),
            connections_opened: get(&self.connections_opened),
            connect_failures: get(&self.connect_failures),
            connections_accepted: get(&self.connections_accepted),
            handshake_rejections: get(&self.handshake_rejections),
            connections_refused: get(&self.connections_refused),
        }
    }
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// What outbound work needs: the endpoint, the counters, the bounds.
#[derive(Clone)]
struct Dialer {
    endpoint: Endpoint,
    counters: Arc<Counters>,
    config: Arc<TransportConfig>,
    /// Turns `true` in [`Transport::close`]: connects in progress are abandoned, no new ones
    /// start, only live connections are flushed.
    closing: watch::Receiver<bool>,
}

impl Dialer {
    /// A new connection to `peer` at `addr`, counted.
    async fn dial(&self, peer: NodeId, addr: SocketAddr) -> Result<Connection, TransportError> {
        let mut closing = self.closing.clone();
        let result = tokio::select! {
            result = self.try_dial(peer, addr) => result,
            _ = closing.wait_for(|closing| *closing) => Err(TransportError::Closed),
        };
        match &result {
            Ok(_) => bump(&self.counters.connections_opened),
            Err(TransportError::Closed) => {}
            Err(error) => {
                bump(&self.counters.connect_failures);
                debug!(?peer, %addr, %error, "connect failed");
            }
        }
        result
    }

    async fn try_dial(&self, peer: NodeId, addr: SocketAddr) -> Result<Connection, TransportError> {
        // The server name is the peer's node name: rustls refuses a certificate naming anyone else.
        let connecting = self.endpoint.connect(addr, &node_dns_name(peer))?;
        let limit = millis(self.config.handshake_timeout_ms);
        let conn = timeout(limit, connecting).await.map_err(|_| TransportError::HandshakeTimeout)??;
        admit(peer, &peer_certificates(&conn)?)?;
        Ok(conn)
    }
}

/// The verified certificate chain of a connection's peer.
fn peer_certificates(conn: &Connection) -> Result<Vec<CertificateDer<'static>>, SecurityError> {
    let identity = conn.peer_identity().ok_or(SecurityError::NoPeerCertificate)?;
    identity
        .downcast::<Vec<CertificateDer<'static>>>()
        .map(|chain| *chain)
        .map_err(|_| SecurityError::NoPeerCertificate)
}

/// Confirms that the peer completed the handshake (accepted our certificate): it must
/// acknowledge a zero-length stream, which it can only do once the handshake is complete.
async fn probe(conn: &Connection, limit: Duration) -> Result<(), TransportError> {
    let mut stream = conn.open_uni().await?;
    stream.finish()?;
    timeout(limit, stream.stopped()).await.map_err(|_| TransportError::HandshakeTimeout)??;
    Ok(())
}

/// The outbound connection to one peer and its reconnect backoff.
struct Link {
    peer: NodeId,
    addr: SocketAddr,
    state: tokio::sync::Mutex<LinkState>,
}

#[derive(Default)]
struct LinkState {
    conn: Option<Connection>,
    failures: u32,
    retry_at: Option<Instant>,
}

impl LinkState {
    fn fail(&mut self, now: Instant, config: &TransportConfig) {
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(now + config.backoff(self.failures));
    }
}

impl Link {
    fn new(peer: NodeId, addr: SocketAddr) -> Self {
        Self { peer, addr, state: tokio::sync::Mutex::new(LinkState::default()) }
    }

    /// The live connection, or a new one. Connect attempts are serialized per peer. With
    /// `honor_backoff`, no attempt is made while the backoff of a previous failure runs.
    async fn connection(&self, dialer: &Dialer, honor_backoff: bool) -> Result<Connection, TransportError> {
        let mut state = self.state.lock().await;
        if let Some(conn) = state.conn.as_ref().filter(|conn| conn.close_reason().is_none()) {
            return Ok(conn.clone());
        }
        state.conn = None;
        if *dialer.closing.borrow() {
            return Err(TransportError::Closed);
        }
        let now = Instant::now();
        if honor_backoff && state.retry_at.is_some_and(|at| now < at) {
            return Err(TransportError::Backoff { peer: self.peer });
        }
        match dialer.dial(self.peer, self.addr).await {
            Ok(conn) => {
                *state = LinkState { conn: Some(conn.clone()), failures: 0, retry_at: None };
                Ok(conn)
            }
            Err(error) => {
                state.fail(now, &dialer.config);
                Err(error)
            }
        }
    }

    /// Records that `conn` broke in use (for example the peer refused our certificate after the
    /// client side of the handshake completed): the next connect waits a backoff, like after a
    /// failed connect, so a peer that refuses us is not re-dialed for every frame.
    async fn broke(&self, conn: &Connection, config: &TransportConfig) {
        let mut state = self.state.lock().await;
        if state.conn.as_ref().is_some_and(|current| current.stable_id() == conn.stable_id()) {
            state.conn = None;
            state.fail(Instant::now(), config);
        }
    }

    fn live_connection(&self) -> Option<Connection> {
        let state = self.state.try_lock().ok()?;
        state.conn.clone().filter(|conn| conn.close_reason().is_none())
    }
}

/// A peer in the table: its link, its queue, its worker (aborted when the peer is dropped).
struct Peer {
    link: Arc<Link>,
    queue: mpsc::Sender<Vec<u8>>,
    worker: Option<JoinHandle<()>>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.take() {
            worker.abort();
        }
    }
}

/// Writes the peer's queued frames, one stream each, until the queue closes; then confirms
/// (bounded) that the peer acknowledged what was written.
async fn run_sender(link: Arc<Link>, dialer: Dialer, mut queue: mpsc::Receiver<Vec<u8>>) {
    while let Some(frame) = queue.recv().await {
        match send_frame(&link, &dialer, &frame).await {
            Ok(()) => {
                bump(&dialer.counters.sent_frames);
                add(&dialer.counters.sent_bytes, frame.len() as u64);
            }
            Err(error) => {
                bump(&dialer.counters.send_dropped_frames);
                debug!(peer = ?link.peer, %error, "frame dropped");
            }
        }
    }
    if let Some(conn) = link.live_connection() {
        let _ = probe(&conn, millis(dialer.config.close_timeout_ms)).await;
    }
}

async fn send_frame(link: &Link, dialer: &Dialer, frame: &[u8]) -> Result<(), TransportError> {
    let conn = link.connection(dialer, true).await?;
    let limit = millis(dialer.config.write_timeout_ms);
    let written = timeout(limit, write_frame(&conn, frame)).await.map_err(|_| TransportError::WriteTimeout);
    let written = written.and_then(|result| result);
    if written.is_err() && conn.close_reason().is_some() {
        link.broke(&conn, &dialer.config).await;
    }
    written
}

async fn write_frame(conn: &Connection, frame: &[u8]) -> Result<(), TransportError> {
    let mut stream = conn.open_uni().await?;
    stream.write_all(frame).await?;
    stream.finish()?;
    Ok(())
}

/// What inbound work needs.
#[derive(Clone)]
struct Acceptor {
    endpoint: Endpoint,
    counters: Arc<Counters>,
    config: Arc<TransportConfig>,
    delivered: mpsc::Sender<Received>,
    slots: Arc<Semaphore>,
    queries: Arc<OnceLock<QueryHandler>>,
}

/// Accepts connections until the endpoint closes; each is served by its own task, at most
/// `connections_inbound_max` at once.
async fn run_acceptor(acceptor: Acceptor) {
    while let Some(incoming) = acceptor.endpoint.accept().await {
        match acceptor.slots.clone().try_acquire_owned() {
            Ok(slot) => drop(tokio::spawn(serve(acceptor.clone(), incoming, slot))),
            Err(_) => {
                bump(&acceptor.counters.connections_refused);
                incoming.refuse();
            }
        }
    }
}

async fn serve(acceptor: Acceptor, incoming: Incoming, _slot: OwnedSemaphorePermit) {
    let remote = incoming.remote_address();
    let (conn, from) = match authenticate(&acceptor, incoming).await {
        Ok(accepted) => accepted,
        Err(error) => {
            bump(&acceptor.counters.handshake_rejections);
            info!(%remote, %error, "peer handshake rejected");
            return;
        }
    };
    bump(&acceptor.counters.connections_accepted);
    debug!(%remote, peer = ?from, "peer connected");
    drop(tokio::spawn(serve_queries(acceptor.clone(), conn.clone(), from)));
    while let Ok(stream) = conn.accept_uni().await {
        drop(tokio::spawn(read_frame(acceptor.clone(), from, stream)));
    }
}

/// Completes the handshake (rustls has verified the client certificate against the cluster CA)
/// and reads the node the certificate names: the authenticated `from` of the connection.
async fn authenticate(
    acceptor: &Acceptor,
    incoming: Incoming,
) -> Result<(Connection, NodeId), TransportError> {
    let limit = millis(acceptor.config.handshake_timeout_ms);
    let conn = timeout(limit, incoming).await.map_err(|_| TransportError::HandshakeTimeout)??;
    match peer_certificates(&conn).and_then(|chain| peer_node_id(&chain)) {
        Ok(from) => Ok((conn, from)),
        Err(error) => {
            conn.close(VarInt::from_u32(CLOSE_UNAUTHENTICATED), b"certificate names no node");
            Err(error.into())
        }
    }
}

/// Reads one stream to its end (bounded in length and time) and delivers it.
async fn read_frame(acceptor: Acceptor, from: NodeId, mut stream: RecvStream) {
    let counters = &acceptor.counters;
    let limit = millis(acceptor.config.stream_read_timeout_ms);
    let read = timeout(limit, stream.read_to_end(acceptor.config.frame_len_max)).await;
    let stop = match read {
        Ok(Ok(frame)) if frame.is_empty() => return, // a probe
        Ok(Ok(frame)) => return deliver(&acceptor, from, frame),
        Ok(Err(ReadToEndError::TooLong)) => {
            bump(&counters.receive_oversize_frames);
            Some(STOP_TOO_LONG)
        }
        Ok(Err(ReadToEndError::Read(_))) => None,
        Err(_) => Some(STOP_TIMEOUT),
    };
    bump(&counters.receive_dropped_frames);
    debug!(peer = ?from, ?stop, "incoming stream dropped");
    if let Some(code) = stop {
        let _ = stream.stop(VarInt::from_u32(code));
    }
}

/// Answers the queries a peer asks on `conn` until it closes (the peer's QUIC stream limit,
/// [`QUERIES_PER_CONNECTION_MAX`], bounds how many run at once).
async fn serve_queries(acceptor: Acceptor, conn: Connection, from: NodeId) {
    while let Ok((send, recv)) = conn.accept_bi().await {
        drop(tokio::spawn(answer_query(acceptor.clone(), from, send, recv)));
    }
}

/// Reads one question (bounded in length and time), answers it with the handler, and writes the
/// answer (bounded in time).
async fn answer_query(acceptor: Acceptor, from: NodeId, mut send: SendStream, mut recv: RecvStream) {
    let Some(handler) = acceptor.queries.get() else {
        let _ = recv.stop(VarInt::from_u32(STOP_NO_HANDLER));
        let _ = send.reset(VarInt::from_u32(STOP_NO_HANDLER));
        return;
    };
    let read_limit = millis(acceptor.config.stream_read_timeout_ms);
    let question = match timeout(read_limit, recv.read_to_end(QUERY_LEN_MAX)).await {
        Ok(Ok(question)) => question,
        Ok(Err(_)) | Err(_) => {
            debug!(peer = ?from, "query dropped");
            let _ = recv.stop(VarInt::from_u32(STOP_TOO_LONG));
            let _ = send.reset(VarInt::from_u32(STOP_TOO_LONG));
            return;
        }
    };
    let mut answer = handler(from, &question);
    answer.truncate(acceptor.config.frame_len_max);
    let write_limit = millis(acceptor.config.write_timeout_ms);
    let written = timeout(write_limit, async {
        send.write_all(&answer).await?;
        send.finish()?;
        Ok::<(), TransportError>(())
    })
    .await;
    if !matches!(written, Ok(Ok(()))) {
        debug!(peer = ?from, "query answer not written");
        let _ = send.reset(VarInt::from_u32(STOP_TIMEOUT));
    }
}

fn deliver(acceptor: &Acceptor, from: NodeId, frame: Vec<u8>) {
    let len_bytes = frame.len() as u64;
    match acceptor.delivered.try_send((from, frame)) {
        Ok(()) => {
            bump(&acceptor.counters.received_frames);
            add(&acceptor.counters.received_bytes, len_bytes);
        }
        Err(_) => bump(&acceptor.counters.receive_dropped_frames),
    }
}

/// A node's peer transport. Cheap to clone (all clones share one endpoint); dropping the last
/// clone closes the endpoint abruptly; [`Transport::close`] closes it gracefully.
#[derive(Clone)]
pub struct Transport {
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

impl Transport {
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

    /// Like [`Transport::bind`], with an identity built beforehand (it names the node).
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

    /// This node.
    pub fn node_id(&self) -> NodeId {
        self.shared.node
    }

    /// The bound address (with the actual port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> TransportStats {
        self.shared.dialer.counters.snapshot()
    }

    /// Queues `frame` for `to` at `addr` without waiting. `Err` means the frame was dropped (and
    /// counted): empty or too long, queue full, peer table full, or transport closed. A peer
    /// seen at a new address gets a new connection.
    pub fn send(&self, to: NodeId, addr: SocketAddr, frame: Vec<u8>) -> Result<(), TransportError> {
        let result = self.enqueue(to, addr, frame);
        if result.is_err() {
            bump(&self.shared.dialer.counters.send_dropped_frames);
        }
        result
    }

    fn enqueue(&self, to: NodeId, addr: SocketAddr, frame: Vec<u8>) -> Result<(), TransportError> {
        let max_bytes = self.shared.dialer.config.frame_len_max;
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

    /// The admission check ("gossip proposes, mTLS confirms"): `Ok` only after a mutual-TLS
    /// handshake with `addr` whose certificate, from the cluster CA, names `expected`, and that
    /// the peer completed too (it acknowledged a probe, so it accepted our certificate). Reuses
    /// the peer's live connection if there is one; otherwise connects now (ignoring any reconnect
    /// backoff) and keeps the connection for later sends.
    pub async fn verify(&self, addr: SocketAddr, expected: NodeId) -> Result<(), TransportError> {
        let result = self.try_verify(addr, expected).await;
        if let Err(error) = &result {
            info!(peer = ?expected, %addr, %error, "peer not admitted");
        }
        result
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

    /// Sets how this node answers peers' queries (once: later calls change nothing and return
    /// `false`). Until then queries are refused (the stream is reset).
    pub fn set_query_handler(&self, handler: QueryHandler) -> bool {
        self.shared.queries.set(handler).is_ok()
    }

    /// Asks `to` at `addr` a question and returns its answer, all within `limit`: over the
    /// peer's live connection (or a new one, honoring the reconnect backoff), one bidirectional
    /// stream, the answer read to its end (at most `frame_len_max` bytes).
    pub async fn query(
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
    pub fn forget(&self, peer: NodeId) {
        if let Ok(mut peers) = self.peers() {
            peers.remove(&peer);
        }
    }

    /// Closes gracefully: refuses new sends, abandons connects in progress, lets every peer's
    /// worker write out its queue over its live connection and wait for the peer's
    /// acknowledgement, then closes the endpoint and waits for the close to reach the peers,
    /// each step within `close_timeout_ms`. Frames still queued then, or queued for peers
    /// without a live connection, are lost (the core's acknowledgements tell which). Idempotent.
    pub async fn close(&self) {
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
        let _ = timeout(limit, endpoint.wait_idle()).await;
        info!(node = ?self.shared.node, "peer transport closed");
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
        self.shared.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
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

/// QUIC transport parameters. Inbound connections (server side) accept unidirectional streams
/// (frames), `streams_per_connection_max` at once, and [`QUERIES_PER_CONNECTION_MAX`]
/// bidirectional ones (queries); outbound connections accept no streams and send keep-alives.
fn transport_config(config: &TransportConfig, side: Side) -> Result<quinn::TransportConfig, TransportError> {
    let idle = quinn::IdleTimeout::try_from(millis(config.idle_timeout_ms))
        .map_err(|_| TransportError::Config { reason: "idle_timeout_ms is too large" })?;
    let (uni_streams, bidi_streams) = match side {
        Side::Server => (config.streams_per_connection_max, QUERIES_PER_CONNECTION_MAX),
        Side::Client => (0, 0),
    };
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_uni_streams(VarInt::from_u32(uni_streams))
        .max_concurrent_bidi_streams(VarInt::from_u32(bidi_streams))
        .max_idle_timeout(Some(idle));
    if side == Side::Client {
        transport.keep_alive_interval(Some(millis(config.keep_alive_interval_ms)));
    }
    Ok(transport)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_initial_up_to_max() {
        let config =
            TransportConfig { backoff_initial_ms: 50, backoff_max_ms: 1000, ..TransportConfig::default() };
        let delays_ms: Vec<u128> = (1..=7).map(|failures| config.backoff(failures).as_millis()).collect();
        assert_eq!(delays_ms, [50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(config.backoff(u32::MAX), millis(1000));
    }

    #[test]
    fn inconsistent_configurations_are_refused() {
        let zero_queue = TransportConfig { send_queue_len_max: 0, ..TransportConfig::default() };
        assert!(matches!(zero_queue.validate(), Err(TransportError::Config { .. })));
        assert!(TransportConfig::default().validate().is_ok());
    }
}
