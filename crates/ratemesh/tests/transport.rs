//! What is particular to the QUIC transport, on loopback: connections reused, mutual-TLS
//! rejections, the send queue, reconnect backoff, restarted and crashed peers (the cases every
//! transport shares are in `transport_conformance.rs`). Ephemeral ports only; every wait is
//! bounded by `WAIT`, and no test sleeps to synchronize (counters that change asynchronously are
//! polled with `eventually`).

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use ratemesh::security::{ALPN, ClusterCa, PemSource, node_dns_name};
use ratemesh::{
    ClusterSecret, ClusterSecurity, NodeId, PeerTransport, ProvidedCerts, QuicTransport, Received,
    SecurityError, TransportConfig, TransportError, TransportStats,
};
use tokio::sync::mpsc;
use tokio::time::timeout;

const SECRET_A: &str = "cluster-a secret, sixteen+ bytes";
const SECRET_B: &str = "cluster-b secret, sixteen+ bytes";
const WAIT: Duration = Duration::from_secs(10);

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn secret(secret: &str) -> ClusterSecurity {
    ClusterSecurity::from_secret(secret).expect("secret is long enough")
}

fn bind(
    security: &ClusterSecurity,
    id: u64,
    config: TransportConfig,
) -> (QuicTransport, mpsc::Receiver<Received>) {
    QuicTransport::bind(loopback(), security, NodeId(id), config).expect("bind")
}

fn node(security: &ClusterSecurity, id: u64) -> (QuicTransport, mpsc::Receiver<Received>) {
    bind(security, id, TransportConfig::default())
}

async fn recv(received: &mut mpsc::Receiver<Received>) -> Received {
    timeout(WAIT, received.recv()).await.expect("a frame within WAIT").expect("channel open")
}

/// Polls `condition` on the transport's counters until it holds, bounded by `WAIT`.
async fn eventually(transport: &QuicTransport, condition: impl Fn(TransportStats) -> bool) {
    let polled = timeout(WAIT, async {
        while !condition(transport.stats()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    polled.await.unwrap_or_else(|_| panic!("condition not reached; stats: {:?}", transport.stats()));
}

/// Sends a frame from a legitimate member and checks it is the first (and only) thing `receiver`
/// delivers: nothing from a rejected peer got through before it.
async fn assert_only_legitimate_frames(receiver: &QuicTransport, received: &mut mpsc::Receiver<Received>) {
    let (good, _good_rx) = node(&secret(SECRET_A), 2);
    good.send(receiver.node_id(), receiver.local_addr(), b"legitimate".to_vec()).expect("queued");
    assert_eq!(recv(received).await, (NodeId(2), b"legitimate".to_vec()));
    assert_eq!(receiver.stats().received_frames, 1);
    good.close().await;
}

#[tokio::test]
async fn two_nodes_exchange_frames_both_ways() {
    let security = secret(SECRET_A);
    let (a, mut a_rx) = node(&security, 1);
    let (b, mut b_rx) = node(&security, 2);
    a.send(NodeId(2), b.local_addr(), b"from a".to_vec()).expect("queued");
    b.send(NodeId(1), a.local_addr(), b"from b".to_vec()).expect("queued");
    assert_eq!(recv(&mut b_rx).await, (NodeId(1), b"from a".to_vec()));
    assert_eq!(recv(&mut a_rx).await, (NodeId(2), b"from b".to_vec()));
    a.verify(b.local_addr(), NodeId(2)).await.expect("b is admitted");
    b.verify(a.local_addr(), NodeId(1)).await.expect("a is admitted");
    assert_eq!(a.stats().connections_opened, 1, "verify reused the connection");
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn two_hundred_frames_arrive_intact() {
    let security = secret(SECRET_A);
    let config = TransportConfig { send_queue_len_max: 256, ..TransportConfig::default() };
    let (a, _a_rx) = bind(&security, 1, config);
    let (b, mut b_rx) = node(&security, 2);
    let frame = |i: u32| -> Vec<u8> {
        let mut frame = i.to_be_bytes().to_vec();
        frame.extend((0..(i * 97) % 5000).map(|j| (i ^ j) as u8));
        frame
    };
    let expected: Vec<Vec<u8>> = (0..200).map(frame).collect();
    for bytes in &expected {
        a.send(NodeId(2), b.local_addr(), bytes.clone()).expect("queued");
    }
    let mut got = Vec::with_capacity(expected.len());
    for _ in 0..expected.len() {
        let (from, bytes) = recv(&mut b_rx).await;
        assert_eq!(from, NodeId(1));
        got.push(bytes);
    }
    // One long-lived stream: the frames arrive in the order they were sent.
    assert_eq!(got, expected);
    eventually(&a, |stats| stats.sent_frames == 200).await;
    assert_eq!(a.stats().connections_opened, 1);
    assert_eq!(b.stats().received_frames, 200);
    assert_eq!(a.stats().send_dropped_frames, 0);
    a.close().await;
    b.close().await;
}

/// A node of an older build offers only ALPN `ratemesh/1` and sends every frame on its own
/// stream: a node of this build still reads them (a rolling upgrade keeps the cluster talking).
#[tokio::test]
async fn frames_of_a_peer_of_an_older_build_are_read() {
    let security = secret(SECRET_A);
    let (a, mut a_rx) = node(&security, 1);
    let mut tls = security.identity(NodeId(2)).expect("identity").client_config().expect("client config");
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC TLS");
    let mut old = quinn::Endpoint::client(loopback()).expect("client endpoint");
    old.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
    let conn = timeout(WAIT, old.connect(a.local_addr(), &node_dns_name(NodeId(1))).expect("connect"))
        .await
        .expect("bounded")
        .expect("handshake");
    for frame in [&b"first"[..], b"second"] {
        let mut stream = conn.open_uni().await.expect("stream");
        stream.write_all(frame).await.expect("written");
        stream.finish().expect("finished");
    }
    let mut got = vec![recv(&mut a_rx).await, recv(&mut a_rx).await];
    got.sort();
    assert_eq!(got, vec![(NodeId(2), b"first".to_vec()), (NodeId(2), b"second".to_vec())]);
    old.close(0_u32.into(), b"done");
    a.close().await;
}

#[tokio::test]
async fn a_node_of_another_ca_is_rejected_as_server_and_as_client() {
    let (a, mut a_rx) = node(&secret(SECRET_A), 1);
    let (x, _x_rx) = node(&secret(SECRET_B), 9);
    // As server: a refuses x's certificate.
    assert!(a.verify(x.local_addr(), NodeId(9)).await.is_err());
    // As client: x refuses a's certificate, so its frame never leaves.
    x.send(NodeId(1), a.local_addr(), b"foreign".to_vec()).expect("queued");
    assert!(x.verify(a.local_addr(), NodeId(1)).await.is_err());
    // x's queued frame found the link in the backoff that verify's failure started: dropped.
    eventually(&x, |stats| stats.connect_failures >= 1 && stats.send_dropped_frames == 1).await;
    assert_eq!(x.stats().sent_frames, 0);
    eventually(&a, |stats| stats.handshake_rejections >= 1).await;
    assert_only_legitimate_frames(&a, &mut a_rx).await;
    a.close().await;
    x.close().await;
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_rejected_by_the_server() {
    let (a, mut a_rx) = node(&secret(SECRET_A), 1);
    // y trusts a's CA, so it accepts a's certificate, but presents one issued by another CA.
    let ca_a = ClusterCa::derive(&ClusterSecret::new(SECRET_A).expect("long")).expect("derive");
    let ca_b = ClusterCa::derive(&ClusterSecret::new(SECRET_B).expect("long")).expect("derive");
    let y_identity = ca_b.issue(NodeId(9)).expect("issue");
    let y_security = ClusterSecurity::Provided(ProvidedCerts {
        ca_cert: PemSource::Bytes(ca_a.cert_pem().into_bytes()),
        node_cert: PemSource::Bytes(y_identity.cert_pem().into_bytes()),
        node_key: PemSource::Bytes(y_identity.key_pem().as_bytes().to_vec()),
        gossip_secret: ClusterSecret::new(SECRET_A).expect("long"),
    });
    let (y, _y_rx) = node(&y_security, 9);
    y.send(NodeId(1), a.local_addr(), b"forged".to_vec()).expect("queued");
    assert!(y.verify(a.local_addr(), NodeId(1)).await.is_err(), "a never completed the handshake");
    eventually(&a, |stats| stats.handshake_rejections >= 1).await;
    assert_eq!(a.stats().connections_accepted, 0);
    assert_only_legitimate_frames(&a, &mut a_rx).await;
    a.close().await;
    y.close().await;
}

#[tokio::test]
async fn a_client_without_certificate_is_rejected() {
    let (a, mut a_rx) = node(&secret(SECRET_A), 1);
    let ca_a = ClusterCa::derive(&ClusterSecret::new(SECRET_A).expect("long")).expect("derive");
    let client = anonymous_client(ca_a.cert_der().clone());
    let outcome = async {
        let conn = client.connect(a.local_addr(), &node_dns_name(NodeId(1)))?.await?;
        if let Ok(mut stream) = conn.open_uni().await {
            let _ = stream.write_all(b"anonymous").await;
            let _ = stream.finish();
        }
        Err::<(), Box<dyn std::error::Error>>(conn.closed().await.into())
    };
    let closed: Result<(), Box<dyn std::error::Error>> = timeout(WAIT, outcome).await.expect("bounded");
    assert!(closed.is_err(), "the server closed the connection");
    eventually(&a, |stats| stats.handshake_rejections >= 1).await;
    assert_only_legitimate_frames(&a, &mut a_rx).await;
    client.close(0_u32.into(), b"done");
    a.close().await;
}

/// A quinn client that trusts `ca` but presents no certificate.
fn anonymous_client(ca: rustls::pki_types::CertificateDer<'static>) -> quinn::Endpoint {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).expect("CA certificate");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC TLS");
    let mut endpoint = quinn::Endpoint::client(loopback()).expect("client endpoint");
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
    endpoint
}

#[tokio::test]
async fn an_oversize_stream_is_dropped_and_the_connection_keeps_working() {
    let security = secret(SECRET_A);
    let small_limit = TransportConfig { frame_len_max: 1024, ..TransportConfig::default() };
    let (a, mut a_rx) = bind(&security, 1, small_limit);
    let (b, _b_rx) = node(&security, 2);
    b.send(NodeId(1), a.local_addr(), vec![0xAB; 4096]).expect("queued (b's own limit is 1 MiB)");
    eventually(&a, |stats| stats.receive_oversize_frames == 1 && stats.receive_dropped_frames == 1).await;
    b.send(NodeId(1), a.local_addr(), b"small".to_vec()).expect("queued");
    assert_eq!(recv(&mut a_rx).await, (NodeId(2), b"small".to_vec()));
    assert_eq!(b.stats().connections_opened, 1, "the same connection carried both frames");
    assert_eq!(a.stats().connections_accepted, 1);
    let too_long = a.send(NodeId(2), b.local_addr(), vec![0; 1025]);
    assert!(matches!(too_long, Err(TransportError::FrameLen { len_bytes: 1025, max_bytes: 1024 })));
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn sends_over_the_queue_bound_are_dropped_and_counted() {
    let security = secret(SECRET_A);
    let config = TransportConfig { send_queue_len_max: 4, ..TransportConfig::default() };
    let (a, _a_rx) = bind(&security, 1, config);
    let silent = UdpSocket::bind(loopback()).expect("bind a socket that never answers");
    let addr = silent.local_addr().expect("address");
    // The current-thread test runtime does not run the peer's worker until this loop yields.
    let dropped = (0..50).filter(|_| a.send(NodeId(5), addr, b"frame".to_vec()).is_err()).count();
    assert_eq!(dropped, 46);
    assert_eq!(a.stats().send_dropped_frames, 46);
    a.close().await;
}

#[tokio::test]
async fn failed_connects_back_off_and_verify_retries_at_once() {
    let security = secret(SECRET_A);
    let config = TransportConfig {
        handshake_timeout_ms: 200,
        backoff_initial_ms: 60_000,
        backoff_max_ms: 60_000,
        close_timeout_ms: 300,
        ..TransportConfig::default()
    };
    let (a, _a_rx) = bind(&security, 1, config);
    let silent = UdpSocket::bind(loopback()).expect("bind a socket that never answers");
    let addr = silent.local_addr().expect("address");
    a.send(NodeId(5), addr, b"first".to_vec()).expect("queued");
    eventually(&a, |stats| stats.connect_failures == 1 && stats.send_dropped_frames == 1).await;
    for _ in 0..10 {
        a.send(NodeId(5), addr, b"during backoff".to_vec()).expect("queued");
    }
    eventually(&a, |stats| stats.send_dropped_frames == 11).await;
    assert_eq!(a.stats().connect_failures, 1, "no connect attempt during the backoff");
    let verified = a.verify(addr, NodeId(5)).await;
    assert!(matches!(verified, Err(TransportError::HandshakeTimeout)), "{verified:?}");
    assert_eq!(a.stats().connect_failures, 2, "verify does not wait for the backoff");
    a.close().await;
}

#[tokio::test]
async fn a_restarted_peer_on_the_same_address_is_reached_again() {
    let security = secret(SECRET_A);
    let (a, _a_rx) = node(&security, 1);
    let (b, mut b_rx) = node(&security, 2);
    let b_addr = b.local_addr();
    a.send(NodeId(2), b_addr, b"before".to_vec()).expect("queued");
    assert_eq!(recv(&mut b_rx).await, (NodeId(1), b"before".to_vec()));
    b.close().await;
    drop((b, b_rx));
    let (b, mut b_rx) = rebind(b_addr, &security, NodeId(2)).await;
    // `verify` reconnects as soon as the old connection is known dead (closed by b, or reset by
    // its new run); it may take one failed attempt, so retry a bounded number of times.
    let mut admitted = false;
    for _ in 0..5 {
        if a.verify(b_addr, NodeId(2)).await.is_ok() {
            admitted = true;
            break;
        }
    }
    assert!(admitted, "b was not admitted again: {:?}", a.stats());
    a.send(NodeId(2), b_addr, b"after".to_vec()).expect("queued");
    assert_eq!(recv(&mut b_rx).await, (NodeId(1), b"after".to_vec()));
    a.close().await;
    b.close().await;
}

/// A node that crashes (its connections are never closed) and comes back under the same address
/// derives the same stateless-reset key, so a peer's stale connection is reset by the first
/// packet instead of black-holing frames until the idle timeout. The "address" is a UDP relay
/// that switches from the old run to the new one and drops the old run's packets.
#[tokio::test]
async fn a_crashed_peer_back_on_its_address_resets_stale_connections() {
    let security = secret(SECRET_A);
    let config = TransportConfig { handshake_timeout_ms: 3000, ..TransportConfig::default() };
    let (a, _a_rx) = bind(&security, 1, config);
    let (b_old, _old_rx) = node(&security, 2);
    let (target, target_seen) = tokio::sync::watch::channel(b_old.local_addr());
    let relay = tokio::net::UdpSocket::bind(loopback()).await.expect("relay socket");
    let b_addr = relay.local_addr().expect("relay address");
    let relaying = tokio::spawn(relay_between(relay, a.local_addr(), target_seen));
    a.verify(b_addr, NodeId(2)).await.expect("b admitted through the relay");
    let (b_new, _new_rx) = node(&security, 2);
    target.send_replace(b_new.local_addr()); // the crash: b_old is never heard from again
    drop(b_old);
    let stale = a.verify(b_addr, NodeId(2)).await;
    let reset = quinn::ConnectionError::Reset;
    let was_reset = match &stale {
        Err(TransportError::Connection(error)) => *error == reset,
        Err(TransportError::Probe(quinn::StoppedError::ConnectionLost(error))) => *error == reset,
        _ => false,
    };
    // A reset, not a timeout: the stale connection ended at the first packet the new run saw
    // (an idle or handshake timeout is another error).
    assert!(was_reset, "expected a stateless reset, got {stale:?}");
    a.verify(b_addr, NodeId(2)).await.expect("the new run of b is admitted");
    for transport in [a, b_new] {
        transport.close().await;
    }
    relaying.abort();
}

/// Forwards datagrams from `client` to the current target and from the current target to
/// `client`; anything else is dropped.
async fn relay_between(
    socket: tokio::net::UdpSocket,
    client: SocketAddr,
    target: tokio::sync::watch::Receiver<SocketAddr>,
) {
    let mut datagram = vec![0_u8; 65_536];
    while let Ok((len, from)) = socket.recv_from(&mut datagram).await {
        let to = *target.borrow();
        let destination = if from == client { Some(to) } else { (from == to).then_some(client) };
        if let Some(destination) = destination {
            let _ = socket.send_to(&datagram[..len], destination).await;
        }
    }
}

/// Binds `addr` again once the previous run's socket is released (quinn's endpoint driver
/// releases it asynchronously after the last handle is dropped; a new process would not wait).
async fn rebind(
    addr: SocketAddr,
    security: &ClusterSecurity,
    id: NodeId,
) -> (QuicTransport, mpsc::Receiver<Received>) {
    let bound = timeout(WAIT, async {
        loop {
            match QuicTransport::bind(addr, security, id, TransportConfig::default()) {
                Ok(bound) => return bound,
                Err(TransportError::Bind { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(error) => panic!("rebind: {error}"),
            }
        }
    });
    bound.await.expect("the old socket is released within WAIT")
}

#[test]
fn ca_derivation_is_deterministic_per_secret() {
    let derive = |s: &str| ClusterCa::derive(&ClusterSecret::new(s).expect("long")).expect("derive");
    assert_eq!(derive(SECRET_A).cert_der(), derive(SECRET_A).cert_der());
    assert_ne!(derive(SECRET_A).cert_der(), derive(SECRET_B).cert_der());
}

#[test]
fn a_short_secret_is_a_typed_error() {
    let short = ClusterSecurity::from_secret("too short");
    assert!(matches!(short, Err(SecurityError::SecretTooShort { len_bytes: 9, min_bytes: 16 })));
}

#[test]
fn certificate_files_are_written_once_and_load_as_provided_certs() {
    let dir = std::env::temp_dir().join(format!("ratemesh-certs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ca = ClusterCa::generate().expect("generate");
    let files = ratemesh::security::write_cert_files(&dir, &ca, &[NodeId(1), NodeId(2)]).expect("write");
    assert_eq!(files.nodes.len(), 2);
    let node = &files.nodes[1];
    let provided = ClusterSecurity::Provided(ProvidedCerts {
        ca_cert: PemSource::Path(files.ca_cert.clone()),
        node_cert: PemSource::Path(node.cert.clone()),
        node_key: PemSource::Path(node.key.clone()),
        gossip_secret: ClusterSecret::new("a gossip secret of 16+ bytes").expect("long"),
    });
    assert_eq!(provided.identity(NodeId(2)).expect("loads").node_id(), NodeId(2));
    let mismatch = provided.identity(NodeId(1));
    assert!(
        matches!(&mismatch, Err(SecurityError::File { path, reason }) if *path == node.cert
            && matches!(**reason, SecurityError::NodeMismatch { .. })),
        "{mismatch:?}"
    );
    let again = ratemesh::security::write_cert_files(&dir, &ca, &[NodeId(1)]);
    assert!(matches!(again, Err(SecurityError::FileExists { .. })), "never overwrites");
    std::fs::remove_dir_all(&dir).expect("clean up");
}
