//! The inbound side of [`super::QuicTransport`]: accepting connections (mutual TLS, the sender
//! named by the certificate), reading frames bounded in length and time, answering queries.

use std::sync::{Arc, OnceLock};

use quinn::{Connection, Endpoint, Incoming, ReadToEndError, RecvStream, SendStream, VarInt};
use ratemesh_core::NodeId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::timeout;
use tracing::{debug, info};

use super::outbound::{is_streamed, peer_certificates};
use super::{CLOSE_UNAUTHENTICATED, STOP_NO_HANDLER, STOP_TIMEOUT, STOP_TOO_LONG};
use crate::security::peer_node_id;
use crate::transport::{
    Counters, QUERY_LEN_MAX, QueryHandler, Received, TransportConfig, TransportError, add, bump, millis,
};

/// What inbound work needs.
#[derive(Clone)]
pub(super) struct Acceptor {
    pub(super) endpoint: Endpoint,
    pub(super) counters: Arc<Counters>,
    pub(super) config: Arc<TransportConfig>,
    pub(super) delivered: mpsc::Sender<Received>,
    pub(super) slots: Arc<Semaphore>,
    pub(super) queries: Arc<OnceLock<QueryHandler>>,
}

/// Accepts connections until the endpoint closes; each is served by its own task, at most
/// `connections_inbound_max` at once.
pub(super) async fn run_acceptor(acceptor: Acceptor) {
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
    let streamed = is_streamed(&conn);
    while let Ok(stream) = conn.accept_uni().await {
        if streamed {
            drop(tokio::spawn(read_frames(acceptor.clone(), from, stream)));
        } else {
            drop(tokio::spawn(read_frame(acceptor.clone(), from, stream)));
        }
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

/// Bytes asked of a stream per read.
const READ_CHUNK_LEN: usize = 64 * 1024;

/// Reads the length-prefixed frames of a streamed connection's stream until it ends, delivering
/// each as it completes; no task per frame. A frame longer than `frame_len_max` is skipped
/// (read and discarded, never held) and counted; a frame that does not complete within
/// `stream_read_timeout_ms` of its first byte stops the stream (the sender opens another). A
/// stream that ends with no bytes is a probe.
async fn read_frames(acceptor: Acceptor, from: NodeId, mut stream: RecvStream) {
    let counters = &acceptor.counters;
    let frame_len_max = acceptor.config.frame_len_max;
    let limit = millis(acceptor.config.stream_read_timeout_ms);
    let mut chunk = vec![0_u8; READ_CHUNK_LEN];
    // Bytes read and not yet delivered: at most one frame and a chunk.
    let mut pending: Vec<u8> = Vec::new();
    // Bytes of an oversize frame still to be discarded.
    let mut skip: usize = 0;
    // When the frame being read must be complete.
    let mut frame_deadline: Option<tokio::time::Instant> = None;
    loop {
        let mut start = 0;
        loop {
            if skip > 0 {
                let skipped = skip.min(pending.len() - start);
                (skip, start) = (skip - skipped, start + skipped);
                if skip > 0 {
                    break;
                }
            }
            let Some(header) = pending.get(start..start + 4) else { break };
            let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
            if len == 0 || len > frame_len_max {
                if len > frame_len_max {
                    bump(&counters.receive_oversize_frames);
                }
                bump(&counters.receive_dropped_frames);
                debug!(peer = ?from, len, "incoming frame dropped");
                (skip, start) = (len, start + 4);
                continue;
            }
            let Some(frame) = pending.get(start + 4..start + 4 + len) else { break };
            deliver(&acceptor, from, frame.to_vec());
            start += 4 + len;
        }
        pending.drain(..start);
        if pending.is_empty() && skip == 0 {
            frame_deadline = None;
        } else if start > 0 || frame_deadline.is_none() {
            frame_deadline = Some(tokio::time::Instant::now() + limit);
        }
        let read = match frame_deadline {
            None => stream.read(&mut chunk).await,
            Some(deadline) => match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
                Ok(read) => read,
                Err(_) => {
                    bump(&counters.receive_dropped_frames);
                    debug!(peer = ?from, "incoming frame too slow: stream stopped");
                    let _ = stream.stop(VarInt::from_u32(STOP_TIMEOUT));
                    return;
                }
            },
        };
        match read {
            Ok(Some(read)) => pending.extend_from_slice(&chunk[..read]),
            Ok(None) | Err(_) => {
                if !pending.is_empty() || skip > 0 {
                    bump(&counters.receive_dropped_frames);
                    debug!(peer = ?from, "incoming stream ended within a frame");
                }
                return;
            }
        }
    }
}

/// Answers the queries a peer asks on `conn` until it closes (the peer's QUIC stream limit,
/// [`crate::transport::QUERIES_PER_CONNECTION_MAX`], bounds how many run at once).
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
