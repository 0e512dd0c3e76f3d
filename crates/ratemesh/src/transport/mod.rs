//! The peer transport: frames out to members, frames in with an authenticated sender.
//!
//! [`PeerTransport`] is what the node driver uses of a transport: send a frame to a peer without
//! waiting, receive `(NodeId, bytes)` whose sender the transport authenticated (never a field of
//! the frame), admit a member proposed by gossip ([`PeerTransport::verify`]), ask a peer a
//! question ([`PeerTransport::query`]), forget a peer, close, count. Two implementations:
//!
//! - [`QuicTransport`] (`quic`): QUIC (quinn) with mutual TLS, the production transport;
//! - [`MemoryTransport`] (`memory`): an in-process network of nodes ([`MemoryNetwork`]) that
//!   still passes every frame as encoded bytes and enforces the same bounds (`frame_len_max`,
//!   the inbound queue, the peer table, the query length) and the same sender semantics, for
//!   tests on virtual time (chitchat's `ChannelTransport` pattern).
//!
//! One conformance suite (`tests/transport_conformance.rs`) runs against both.
//!
//! Everything is bounded ([`TransportConfig`]); the defaults live in [`crate::defaults`].

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quinn::ReadToEndError;
use quinn::crypto::rustls::NoInitialCipherSuite;
use ratemesh_core::NodeId;

use crate::defaults;
use crate::security::SecurityError;

mod memory;
mod quic;

pub use memory::{DATAGRAM_QUEUE_LEN_MAX, MemoryDatagrams, MemoryNetwork, MemoryTransport};
pub use quic::QuicTransport;

/// A frame received from an authenticated peer: the sender (from its certificate) and the bytes.
pub type Received = (NodeId, Vec<u8>);

/// Answers a peer's query: the asker (from its certificate) and the question's bytes in, the
/// answer's bytes out. Runs on the transport's tasks: it must not block.
pub type QueryHandler = Arc<dyn Fn(NodeId, &[u8]) -> Vec<u8> + Send + Sync>;

/// Concurrent queries a peer may ask on one connection (bidirectional streams).
pub const QUERIES_PER_CONNECTION_MAX: u32 = 4;
/// Largest question of a query, in bytes: room for a batch of application questions (a member
/// reads at most this much per question, [`QUERIES_PER_CONNECTION_MAX`] at once per connection).
pub const QUERY_LEN_MAX: usize = 64 * 1024;

/// Bounds and timings of a [`PeerTransport`]. Every field has a default ([`Default`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportConfig {
    /// Largest frame sent or accepted, in bytes (default [`defaults::FRAME_LEN_MAX`], the core's
    /// bound: 1 MiB). Longer incoming streams are stopped and counted.
    pub frame_len_max: usize,
    /// Capacity of the channel of received frames (default [`defaults::INBOUND_QUEUE_LEN_MAX`]). Frames that
    /// find it full are dropped and counted.
    pub inbound_queue_len_max: usize,
    /// Frames queued per peer before new ones are dropped (default [`defaults::SEND_QUEUE_LEN_MAX`]).
    pub send_queue_len_max: usize,
    /// Peers with an outbound queue and connection (default [`defaults::PEERS_MAX`]). Sends to further peers
    /// are refused until [`PeerTransport::forget`] makes room.
    pub peers_max: usize,
    /// Incoming connections served at once (default [`defaults::CONNECTIONS_INBOUND_MAX`]); more are refused.
    pub connections_inbound_max: usize,
    /// Concurrent incoming streams a peer may open on one connection (default
    /// [`defaults::STREAMS_PER_CONNECTION_MAX`]).
    pub streams_per_connection_max: u32,
    /// Limit on a connect and TLS handshake (default [`defaults::HANDSHAKE_TIMEOUT_MS`]).
    pub handshake_timeout_ms: u64,
    /// Limit on writing one batch of frames, including waiting for stream credit (default
    /// [`defaults::WRITE_TIMEOUT_MS`]).
    pub write_timeout_ms: u64,
    /// Limit on reading one incoming frame: from its first byte on a long-lived stream, or a
    /// per-frame stream of an older peer to its end (default [`defaults::STREAM_READ_TIMEOUT_MS`]).
    pub stream_read_timeout_ms: u64,
    /// A connection with no traffic for this long is closed (default [`defaults::IDLE_TIMEOUT_MS`]).
    pub idle_timeout_ms: u64,
    /// Outbound connections send a keep-alive this often (default [`defaults::KEEP_ALIVE_INTERVAL_MS`]).
    pub keep_alive_interval_ms: u64,
    /// First reconnect delay after a failed connect (default [`defaults::BACKOFF_INITIAL_MS`]).
    pub backoff_initial_ms: u64,
    /// Largest reconnect delay (default [`defaults::BACKOFF_MAX_MS`]).
    pub backoff_max_ms: u64,
    /// Limit on [`PeerTransport::close`] flushing queued frames and closing (default
    /// [`defaults::CLOSE_TIMEOUT_MS`]).
    pub close_timeout_ms: u64,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            frame_len_max: defaults::FRAME_LEN_MAX,
            inbound_queue_len_max: defaults::INBOUND_QUEUE_LEN_MAX,
            send_queue_len_max: defaults::SEND_QUEUE_LEN_MAX,
            peers_max: defaults::PEERS_MAX,
            connections_inbound_max: defaults::CONNECTIONS_INBOUND_MAX,
            streams_per_connection_max: defaults::STREAMS_PER_CONNECTION_MAX,
            handshake_timeout_ms: defaults::HANDSHAKE_TIMEOUT_MS,
            write_timeout_ms: defaults::WRITE_TIMEOUT_MS,
            stream_read_timeout_ms: defaults::STREAM_READ_TIMEOUT_MS,
            idle_timeout_ms: defaults::IDLE_TIMEOUT_MS,
            keep_alive_interval_ms: defaults::KEEP_ALIVE_INTERVAL_MS,
            backoff_initial_ms: defaults::BACKOFF_INITIAL_MS,
            backoff_max_ms: defaults::BACKOFF_MAX_MS,
            close_timeout_ms: defaults::CLOSE_TIMEOUT_MS,
        }
    }
}

impl TransportConfig {
    pub(crate) fn validate(&self) -> Result<(), TransportError> {
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
    pub(crate) fn backoff(&self, failures: u32) -> Duration {
        let initial = Duration::from_millis(self.backoff_initial_ms);
        crate::Backoff { initial, max: Duration::from_millis(self.backoff_max_ms) }.delay(failures)
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
    /// The peer answers no queries (it has no handler).
    #[error("the peer answers no queries")]
    QueryRefused,
    /// No member is reachable at the address (memory transport: nothing bound there, the link
    /// is cut, or the member closed).
    #[error("nothing reachable at {addr}")]
    Unreachable {
        /// The address.
        addr: SocketAddr,
    },
}

/// Counters of a [`PeerTransport`] since it was bound (a snapshot; all monotonic).
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
pub(crate) struct Counters {
    pub(crate) sent_frames: AtomicU64,
    pub(crate) sent_bytes: AtomicU64,
    pub(crate) send_dropped_frames: AtomicU64,
    pub(crate) received_frames: AtomicU64,
    pub(crate) received_bytes: AtomicU64,
    pub(crate) receive_dropped_frames: AtomicU64,
    pub(crate) receive_oversize_frames: AtomicU64,
    pub(crate) connections_opened: AtomicU64,
    pub(crate) connect_failures: AtomicU64,
    pub(crate) connections_accepted: AtomicU64,
    pub(crate) handshake_rejections: AtomicU64,
    pub(crate) connections_refused: AtomicU64,
}

pub(crate) fn add(counter: &AtomicU64, amount: u64) {
    counter.fetch_add(amount, Ordering::Relaxed);
}

pub(crate) fn bump(counter: &AtomicU64) {
    add(counter, 1);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> TransportStats {
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

pub(crate) fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// What the node driver needs of a peer transport. Implementations are cheap to share (`Arc`)
/// and deliver received frames on the bounded channel their constructor returns.
///
/// Contract (checked for both implementations by `tests/transport_conformance.rs`):
/// - [`PeerTransport::send`] never waits; `Err` means the frame was dropped and counted
///   (`send_dropped_frames`). A frame may also be lost later (peer unreachable): the core
///   retransmits.
/// - A received frame's `NodeId` is the sender as the transport authenticated it. A frame
///   longer than the receiver's `frame_len_max` is dropped and counted
///   (`receive_oversize_frames`); a frame that finds the receive channel full is dropped and
///   counted (`receive_dropped_frames`).
/// - [`PeerTransport::verify`] succeeds only if the member at `addr` is `expected`.
/// - After [`PeerTransport::close`], sends are refused.
#[async_trait::async_trait]
pub trait PeerTransport: Send + Sync + std::fmt::Debug + 'static {
    /// This node.
    fn node_id(&self) -> NodeId;

    /// The address peers reach this node at (with the actual port when bound to port 0).
    fn local_addr(&self) -> SocketAddr;

    /// A snapshot of the counters.
    fn stats(&self) -> TransportStats;

    /// Queues `frame` for `to` at `addr` without waiting. `Err` means the frame was dropped
    /// (and counted): empty or too long, queue full, peer table full, or transport closed.
    fn send(&self, to: NodeId, addr: SocketAddr, frame: Vec<u8>) -> Result<(), TransportError>;

    /// The admission check ("gossip proposes, the transport confirms"): `Ok` only if the
    /// member reached at `addr` is authenticated as `expected`.
    async fn verify(&self, addr: SocketAddr, expected: NodeId) -> Result<(), TransportError>;

    /// Sets how this node answers peers' queries (once: later calls change nothing and return
    /// `false`). Until then queries are refused.
    fn set_query_handler(&self, handler: QueryHandler) -> bool;

    /// Asks `to` at `addr` a question (1 to [`QUERY_LEN_MAX`] bytes) and returns its answer (at
    /// most `frame_len_max` bytes), all within `limit`.
    async fn query(
        &self,
        to: NodeId,
        addr: SocketAddr,
        question: &[u8],
        limit: Duration,
    ) -> Result<Vec<u8>, TransportError>;

    /// Drops what is kept for `peer` (a member left). Later sends reconnect.
    fn forget(&self, peer: NodeId);

    /// Closes gracefully (queued frames flushed within `close_timeout_ms`); sends are refused
    /// from then on. Idempotent.
    async fn close(&self);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inconsistent_configurations_are_refused() {
        let zero_queue = TransportConfig { send_queue_len_max: 0, ..TransportConfig::default() };
        assert!(matches!(zero_queue.validate(), Err(TransportError::Config { .. })));
        assert!(TransportConfig::default().validate().is_ok());
    }
}
