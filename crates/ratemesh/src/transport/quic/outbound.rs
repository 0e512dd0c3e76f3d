//! The outbound side of [`super::QuicTransport`]: dialing (handshake, admission), one link per
//! peer with its reconnect backoff, and the worker that writes a peer's queued frames.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::{Connection, Endpoint};
use ratemesh_core::NodeId;
use rustls_pki_types::CertificateDer;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tracing::debug;

use crate::security::{SecurityError, admit, node_dns_name};
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

/// Writes the peer's queued frames, one stream each, until the queue closes; then confirms
/// (bounded) that the peer acknowledged what was written.
pub(super) async fn run_sender(link: Arc<Link>, dialer: Dialer, mut queue: mpsc::Receiver<Vec<u8>>) {
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
