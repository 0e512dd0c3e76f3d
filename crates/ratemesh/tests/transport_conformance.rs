//! One conformance suite for every [`PeerTransport`]: the QUIC transport on loopback and the
//! in-memory network run the same cases (chitchat's pattern for its `ChannelTransport`): delivery
//! with the authenticated sender, an oversize frame dropped and counted on both sides, the
//! receive queue's bound, verification of a wrong identity refused, a query answered (and
//! refused without a handler), close.
//!
//! Counters that change asynchronously are polled with `eventually` (bounded by `WAIT`); no test
//! sleeps to synchronize or asserts a duration.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ratemesh::{
    ClusterSecurity, MemoryNetwork, NodeId, PeerTransport, QuicTransport, Received, TransportConfig,
    TransportError, TransportStats,
};
use tokio::sync::mpsc;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(10);

/// A transport under test and the channel of what it receives.
type Bound = (Arc<dyn PeerTransport>, mpsc::Receiver<Received>);

/// Makes transports of one cluster (one CA, or one in-memory network).
trait Network {
    fn bind(&self, id: u64, config: TransportConfig) -> Bound;
}

struct Quic(ClusterSecurity);

impl Network for Quic {
    fn bind(&self, id: u64, config: TransportConfig) -> Bound {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let (transport, received) = QuicTransport::bind(loopback, &self.0, NodeId(id), config).expect("bind");
        (Arc::new(transport), received)
    }
}

struct Memory(MemoryNetwork);

impl Network for Memory {
    fn bind(&self, id: u64, config: TransportConfig) -> Bound {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let (transport, received) = self.0.bind(loopback, NodeId(id), config).expect("bind");
        (Arc::new(transport), received)
    }
}

fn quic() -> Quic {
    Quic(ClusterSecurity::from_secret("conformance secret, sixteen+ bytes").expect("long enough"))
}

fn memory() -> Memory {
    Memory(MemoryNetwork::new())
}

async fn recv(received: &mut mpsc::Receiver<Received>) -> Received {
    timeout(WAIT, received.recv()).await.expect("a frame within WAIT").expect("channel open")
}

/// Polls `condition` on the transport's counters until it holds, bounded by `WAIT`.
async fn eventually(transport: &dyn PeerTransport, condition: impl Fn(TransportStats) -> bool) {
    let polled = timeout(WAIT, async {
        while !condition(transport.stats()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    polled.await.unwrap_or_else(|_| panic!("condition not reached; stats: {:?}", transport.stats()));
}

async fn frames_arrive_with_the_authenticated_sender(network: impl Network) {
    let (a, mut a_rx) = network.bind(1, TransportConfig::default());
    let (b, mut b_rx) = network.bind(2, TransportConfig::default());
    a.send(NodeId(2), b.local_addr(), b"from a".to_vec()).expect("queued");
    b.send(NodeId(1), a.local_addr(), b"from b".to_vec()).expect("queued");
    assert_eq!(recv(&mut b_rx).await, (NodeId(1), b"from a".to_vec()));
    assert_eq!(recv(&mut a_rx).await, (NodeId(2), b"from b".to_vec()));
    eventually(a.as_ref(), |stats| stats.sent_frames == 1 && stats.sent_bytes == 6).await;
    let received = b.stats();
    assert_eq!((received.received_frames, received.received_bytes), (1, 6));
    assert_eq!(a.node_id(), NodeId(1));
    a.close().await;
    b.close().await;
}

async fn an_oversize_frame_is_dropped_and_counted(network: impl Network) {
    let large = TransportConfig { frame_len_max: 64 * 1024, ..TransportConfig::default() };
    let small = TransportConfig { frame_len_max: 1024, ..TransportConfig::default() };
    let (a, _a_rx) = network.bind(1, large);
    let (b, mut b_rx) = network.bind(2, small);
    // Over the sender's own bound: refused at once, counted.
    let refused = a.send(NodeId(2), b.local_addr(), vec![7; 64 * 1024 + 1]);
    assert!(matches!(refused, Err(TransportError::FrameLen { .. })), "{refused:?}");
    assert_eq!(a.stats().send_dropped_frames, 1);
    // Within the sender's, over the receiver's: dropped there, counted as oversize.
    a.send(NodeId(2), b.local_addr(), vec![7; 2000]).expect("queued");
    eventually(b.as_ref(), |stats| stats.receive_oversize_frames == 1).await;
    assert_eq!(b.stats().receive_dropped_frames, 1);
    // Nothing of it was delivered: the next frame is the first thing received.
    a.send(NodeId(2), b.local_addr(), b"fits".to_vec()).expect("queued");
    assert_eq!(recv(&mut b_rx).await, (NodeId(1), b"fits".to_vec()));
    assert_eq!(b.stats().received_frames, 1);
    a.close().await;
    b.close().await;
}

async fn the_receive_queue_is_bounded(network: impl Network) {
    let (a, _a_rx) = network.bind(1, TransportConfig::default());
    let tiny = TransportConfig { inbound_queue_len_max: 2, ..TransportConfig::default() };
    let (b, mut b_rx) = network.bind(2, tiny);
    for i in 0..5_u8 {
        a.send(NodeId(2), b.local_addr(), vec![i; 16]).expect("queued");
    }
    // Nobody reads: two frames fit, the other three are dropped and counted.
    eventually(b.as_ref(), |stats| stats.received_frames + stats.receive_dropped_frames == 5).await;
    assert_eq!(b.stats().received_frames, 2);
    assert_eq!(b.stats().receive_dropped_frames, 3);
    for _ in 0..2 {
        assert_eq!(recv(&mut b_rx).await.0, NodeId(1));
    }
    assert!(b_rx.try_recv().is_err(), "no third frame was queued");
    a.close().await;
    b.close().await;
}

async fn a_wrong_identity_is_not_admitted(network: impl Network) {
    let (a, _a_rx) = network.bind(1, TransportConfig::default());
    let (b, _b_rx) = network.bind(2, TransportConfig::default());
    assert!(a.verify(b.local_addr(), NodeId(3)).await.is_err(), "b is not node 3");
    a.verify(b.local_addr(), NodeId(2)).await.expect("b is node 2");
    // A frame addressed to node 3 at b's address never reaches b.
    let _ = a.send(NodeId(3), b.local_addr(), b"misaddressed".to_vec());
    a.send(NodeId(2), b.local_addr(), b"addressed".to_vec()).expect("queued");
    eventually(b.as_ref(), |stats| stats.received_frames == 1).await;
    eventually(a.as_ref(), |stats| stats.send_dropped_frames == 1).await;
    assert_eq!(b.stats().received_frames, 1);
    a.close().await;
    b.close().await;
}

async fn a_query_is_answered_with_the_askers_identity(network: impl Network) {
    let (a, _a_rx) = network.bind(1, TransportConfig::default());
    let (b, _b_rx) = network.bind(2, TransportConfig::default());
    let (c, _c_rx) = network.bind(3, TransportConfig::default());
    let answer_with_asker: ratemesh::transport::QueryHandler = Arc::new(|from, question| {
        let mut answer = from.0.to_be_bytes().to_vec();
        answer.extend_from_slice(question);
        answer
    });
    assert!(b.set_query_handler(answer_with_asker));
    let answer = a.query(NodeId(2), b.local_addr(), b"who?", WAIT).await.expect("answered");
    assert_eq!(answer, [&1_u64.to_be_bytes()[..], b"who?"].concat());
    // A peer without a handler answers nothing; a question over the bound is refused here.
    assert!(a.query(NodeId(3), c.local_addr(), b"who?", WAIT).await.is_err());
    let long = vec![0; ratemesh::transport::QUERY_LEN_MAX + 1];
    let refused = a.query(NodeId(2), b.local_addr(), &long, WAIT).await;
    assert!(matches!(refused, Err(TransportError::QueryLen { .. })), "{refused:?}");
    for transport in [a, b, c] {
        transport.close().await;
    }
}

async fn a_closed_transport_sends_nothing_and_is_not_admitted(network: impl Network) {
    // A closed QUIC peer is found out by a handshake timeout: keep it short.
    let quick = TransportConfig { handshake_timeout_ms: 500, ..TransportConfig::default() };
    let (a, _a_rx) = network.bind(1, quick);
    let (b, _b_rx) = network.bind(2, TransportConfig::default());
    let b_addr = b.local_addr();
    a.verify(b_addr, NodeId(2)).await.expect("b is node 2");
    b.close().await;
    b.close().await; // idempotent
    let refused = b.send(NodeId(1), a.local_addr(), b"after close".to_vec());
    assert!(matches!(refused, Err(TransportError::Closed)), "{refused:?}");
    assert!(a.verify(b_addr, NodeId(2)).await.is_err(), "a closed peer is not admitted");
    a.close().await;
}

/// Runs every case against the transport `$network` makes, in a module named `$name`.
macro_rules! conformance {
    ($name:ident, $network:expr) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn frames_arrive_with_the_authenticated_sender() {
                super::frames_arrive_with_the_authenticated_sender($network).await;
            }

            #[tokio::test]
            async fn an_oversize_frame_is_dropped_and_counted() {
                super::an_oversize_frame_is_dropped_and_counted($network).await;
            }

            #[tokio::test]
            async fn the_receive_queue_is_bounded() {
                super::the_receive_queue_is_bounded($network).await;
            }

            #[tokio::test]
            async fn a_wrong_identity_is_not_admitted() {
                super::a_wrong_identity_is_not_admitted($network).await;
            }

            #[tokio::test]
            async fn a_query_is_answered_with_the_askers_identity() {
                super::a_query_is_answered_with_the_askers_identity($network).await;
            }

            #[tokio::test]
            async fn a_closed_transport_sends_nothing_and_is_not_admitted() {
                super::a_closed_transport_sends_nothing_and_is_not_admitted($network).await;
            }
        }
    };
}

conformance!(over_quic, quic());
conformance!(in_memory, memory());
