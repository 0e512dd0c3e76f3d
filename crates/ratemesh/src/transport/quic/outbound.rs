//! The outbound side of [`super::QuicTransport`]: dialing (handshake, admission), one link per
//! peer with its reconnect backoff, and the worker that writes a peer's queued frames.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::{Connection, Endpoint, SendStream, VarInt};
use ratemesh_core::NodeId;
use rustls_pki_types::CertificateDer;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tracing::debug;

use super::STOP_TIMEOUT;
use crate::security::{ALPN_STREAMED, SecurityError, admit, node_dns_name};
use crate::transport::{Counters, TransportConfig, TransportError, add, bump, millis};

/// What outbound work needs: the endpoint, the counters, the bounds.
#[derive(Clone)]
pub(super) struct Dialer {
    pub(super) endpoint: Endpoint,
    pub(super) counters: Arc<Counters>,
    pub(super) config: Arc<TransportConfig>,
    /// Turns `true` in [`Transport::close`]: connects in progress are abandoned, no new ones
    /// start, only live connections are flushed.
    pub(super) closing: watch::Receiver<bool>,
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
pub(super) fn peer_certificates(conn: &Connection) -> Result<Vec<CertificateDer<'static>>, SecurityError> {
    let identity = conn.peer_identity().ok_or(SecurityError::NoPeerCertificate)?;
    identity
        .downcast::<Vec<CertificateDer<'static>>>()
        .map(|chain| *chain)
        .map_err(|_| SecurityError::NoPeerCertificate)
}

/// Confirms that the peer completed the handshake (accepted our certificate): it must
/// acknowledge a zero-length stream, which it can only do once the handshake is complete.
pub(super) async fn probe(conn: &Connection, limit: Duration) -> Result<(), TransportError> {
    let mut stream = conn.open_uni().await?;
    stream.finish()?;
    timeout(limit, stream.stopped()).await.map_err(|_| TransportError::HandshakeTimeout)??;
    Ok(())
}

/// The outbound connection to one peer and its reconnect backoff.
pub(super) struct Link {
    pub(super) peer: NodeId,
    pub(super) addr: SocketAddr,
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
    pub(super) fn new(peer: NodeId, addr: SocketAddr) -> Self {
        Self { peer, addr, state: tokio::sync::Mutex::new(LinkState::default()) }
    }

    /// The live connection, or a new one. Connect attempts are serialized per peer. With
    /// `honor_backoff`, no attempt is made while the backoff of a previous failure runs.
    pub(super) async fn connection(
        &self,
        dialer: &Dialer,
        honor_backoff: bool,
    ) -> Result<Connection, TransportError> {
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
    pub(super) async fn broke(&self, conn: &Connection, config: &TransportConfig) {
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
pub(super) struct Peer {
    pub(super) link: Arc<Link>,
    pub(super) queue: mpsc::Sender<Vec<u8>>,
    pub(super) worker: Option<JoinHandle<()>>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.take() {
            worker.abort();
        }
    }
}

/// Most frames one write carries (a batch drained from the peer's queue).
const WRITE_FRAMES_MAX: usize = 256;
/// Most bytes one write carries, beyond its first frame.
const WRITE_BYTES_MAX: usize = 256 * 1024;

/// Whether `conn` negotiated [`ALPN_STREAMED`]: its frames go length-prefixed on one long-lived
/// stream. Otherwise (a peer of an older build) every frame goes on its own stream.
pub(super) fn is_streamed(conn: &Connection) -> bool {
    conn.handshake_data()
        .and_then(|data| data.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .is_some_and(|data| data.protocol.as_deref() == Some(ALPN_STREAMED))
}

/// The long-lived stream of a streamed connection, and which connection it belongs to.
struct Outgoing {
    conn: usize,
    stream: SendStream,
}

/// Writes the peer's queued frames until the queue closes; then confirms (bounded) that the peer
/// read what was written. Every write drains the queue: the frames queued while the previous
/// write was under way go together in the next one (batches grow with the load, a lone frame
/// leaves at once), length-prefixed on the connection's one long-lived stream.
pub(super) async fn run_sender(link: Arc<Link>, dialer: Dialer, mut queue: mpsc::Receiver<Vec<u8>>) {
    let mut outgoing: Option<Outgoing> = None;
    let mut batch: Vec<Vec<u8>> = Vec::with_capacity(WRITE_FRAMES_MAX);
    let mut buffer: Vec<u8> = Vec::new();
    while let Some(frame) = queue.recv().await {
        let mut bytes = frame.len();
        batch.push(frame);
        while batch.len() < WRITE_FRAMES_MAX && bytes < WRITE_BYTES_MAX {
            let Ok(frame) = queue.try_recv() else { break };
            bytes += frame.len();
            batch.push(frame);
        }
        let frames = batch.len() as u64;
        match send_batch(&link, &dialer, &mut outgoing, &batch, &mut buffer).await {
            Ok(()) => {
                add(&dialer.counters.sent_frames, frames);
                add(&dialer.counters.sent_bytes, bytes as u64);
            }
            Err(error) => {
                add(&dialer.counters.send_dropped_frames, frames);
                debug!(peer = ?link.peer, %error, frames, "frames dropped");
            }
        }
        batch.clear();
        // A burst's buffer is not kept for ever.
        if buffer.capacity() > 2 * WRITE_BYTES_MAX {
            buffer = Vec::new();
        }
    }
    let limit = millis(dialer.config.close_timeout_ms);
    match outgoing {
        Some(mut outgoing) => {
            if outgoing.stream.finish().is_ok() {
                let _ = timeout(limit, outgoing.stream.stopped()).await;
            }
        }
        None => {
            if let Some(conn) = link.live_connection() {
                let _ = probe(&conn, limit).await;
            }
        }
    }
}

async fn send_batch(
    link: &Link,
    dialer: &Dialer,
    outgoing: &mut Option<Outgoing>,
    batch: &[Vec<u8>],
    buffer: &mut Vec<u8>,
) -> Result<(), TransportError> {
    let conn = link.connection(dialer, true).await?;
    let limit = millis(dialer.config.write_timeout_ms);
    let known = outgoing.as_ref().is_some_and(|current| current.conn == conn.stable_id());
    let written = if known || is_streamed(&conn) {
        buffer.clear();
        for frame in batch {
            // `enqueue` refuses frames over 4 GiB - 1.
            let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
            buffer.extend_from_slice(&len.to_be_bytes());
            buffer.extend_from_slice(frame);
        }
        let written = timeout(limit, write_streamed(&conn, outgoing, buffer)).await;
        written.map_err(|_| TransportError::WriteTimeout).and_then(|result| result)
    } else {
        *outgoing = None;
        let written = timeout(limit, async {
            for frame in batch {
                write_frame(&conn, frame).await?;
            }
            Ok(())
        })
        .await;
        written.map_err(|_| TransportError::WriteTimeout).and_then(|result| result)
    };
    if written.is_err() {
        // A stream that failed or timed out mid-write may hold part of a frame: it is given up
        // (the peer drops the partial frame), the next write opens a new one.
        if let Some(mut failed) = outgoing.take() {
            let _ = failed.stream.reset(VarInt::from_u32(STOP_TIMEOUT));
        }
        if conn.close_reason().is_some() {
            link.broke(&conn, &dialer.config).await;
        }
    }
    written
}

/// Writes `bytes` on the connection's long-lived stream (opened if there is none yet, or if the
/// previous one belongs to an older connection). A stream the peer stopped (it refused a frame,
/// or gave up on a slow one) is replaced by a new one once: what the peer had not read of it is
/// written again (the core ignores a frame it already has).
async fn write_streamed(
    conn: &Connection,
    outgoing: &mut Option<Outgoing>,
    bytes: &[u8],
) -> Result<(), TransportError> {
    for attempt in 0..2 {
        if outgoing.as_ref().is_none_or(|current| current.conn != conn.stable_id()) {
            let stream = conn.open_uni().await?;
            *outgoing = Some(Outgoing { conn: conn.stable_id(), stream });
        }
        let Some(current) = outgoing.as_mut() else { return Err(TransportError::Closed) };
        match current.stream.write_all(bytes).await {
            Ok(()) => return Ok(()),
            Err(quinn::WriteError::Stopped(_)) if attempt == 0 => *outgoing = None,
            Err(error) => return Err(error.into()),
        }
    }
    Err(TransportError::Closed)
}

async fn write_frame(conn: &Connection, frame: &[u8]) -> Result<(), TransportError> {
    let mut stream = conn.open_uni().await?;
    stream.write_all(frame).await?;
    stream.finish()?;
    Ok(())
}
