//! What a round trip over the peer transport costs in CPU, next to a bare quinn round trip, on
//! loopback in one process and one tokio thread (both ends' work counted, as a forwarded check
//! costs its forwarder and its owner): `cargo run --release -p ratemesh --example
//! quic_round_trip [ROUND_TRIPS] [IN_FLIGHT]`.
//!
//! - **bare quinn**: one mutual-TLS connection (the node identities' rustls configurations), one
//!   bidirectional stream kept open; the client writes a 22-byte ping, the server reads it and
//!   writes a 13-byte pong (a forwarded check and its answer, as measured on the wire).
//! - **transport**: two [`QuicTransport`]s; A sends a 22-byte frame to B, whose receiver sends a
//!   13-byte frame back (the frames' way through the queues, worker tasks and reader tasks).
//!
//! With IN_FLIGHT > 1, that many pings are outstanding at once (a ping leaves as soon as a pong
//! arrives): the transport may carry several in one write. CPU time is the process's user and
//! system time (`/proc/self/stat`), so run it on an otherwise idle machine for clean numbers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use ratemesh::security::node_dns_name;
use ratemesh::{ClusterSecurity, NodeId, PeerTransport, QuicTransport, TransportConfig};

const PING_LEN: usize = 22;
const PONG_LEN: usize = 13;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let round_trips: usize = args.next().map_or(Ok(20_000), |arg| arg.parse())?;
    let in_flight: usize = args.next().map_or(Ok(1), |arg| arg.parse())?.max(1);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let security = ClusterSecurity::from_secret("quic round trip example secret")?;
        let bare = measure(bare_quinn(&security, round_trips, in_flight).await?).await?;
        report("bare quinn (one stream)", round_trips, bare);
        let transport = measure(transport(&security, round_trips, in_flight).await?).await?;
        report("QuicTransport", round_trips, transport);
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}

fn report(name: &str, round_trips: usize, (cpu, wall): (Duration, Duration)) {
    let per = |total: Duration| total.as_secs_f64() * 1e6 / round_trips as f64;
    println!("{name:<24} {round_trips} round trips: {:.1} µs CPU, {:.1} µs wall each", per(cpu), per(wall));
}

/// The process's user + system CPU time.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command (which may hold spaces) start after the last ')'.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = [11, 12].iter().filter_map(|&i| fields.get(i)?.parse::<u64>().ok()).sum();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// Runs the measured part: its CPU and wall-clock time.
async fn measure(run: Run) -> Result<(Duration, Duration), Box<dyn std::error::Error>> {
    let (cpu, wall) = (cpu_time(), Instant::now());
    run.await?;
    Ok((cpu_time() - cpu, wall.elapsed()))
}

type Run = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Box<dyn std::error::Error>>>>>;

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Sets up a bare quinn connection and returns the measured part: the round trips.
async fn bare_quinn(
    security: &ClusterSecurity,
    round_trips: usize,
    in_flight: usize,
) -> Result<Run, Box<dyn std::error::Error>> {
    let server_identity = security.identity(NodeId(2))?;
    let client_identity = security.identity(NodeId(1))?;
    let server_tls = QuicServerConfig::try_from(server_identity.server_config()?)?;
    let server = quinn::Endpoint::server(quinn::ServerConfig::with_crypto(Arc::new(server_tls)), loopback())?;
    let server_addr = server.local_addr()?;
    let client_tls = QuicClientConfig::try_from(client_identity.client_config()?)?;
    let mut client = quinn::Endpoint::client(loopback())?;
    client.set_default_client_config(quinn::ClientConfig::new(Arc::new(client_tls)));
    tokio::spawn(async move {
        let Some(incoming) = server.accept().await else { return };
        let Ok(conn) = incoming.await else { return };
        let Ok((mut send, mut recv)) = conn.accept_bi().await else { return };
        let mut ping = [0_u8; PING_LEN];
        while recv.read_exact(&mut ping).await.is_ok() {
            if send.write_all(&[7; PONG_LEN]).await.is_err() {
                return;
            }
        }
    });
    let conn = client.connect(server_addr, &node_dns_name(NodeId(2)))?.await?;
    let (mut send, mut recv) = conn.open_bi().await?;
    Ok(Box::pin(async move {
        for _ in 0..in_flight.min(round_trips) {
            send.write_all(&[1; PING_LEN]).await?;
        }
        let mut pong = [0_u8; PONG_LEN];
        for done in 0..round_trips {
            recv.read_exact(&mut pong).await?;
            if done + in_flight < round_trips {
                send.write_all(&[1; PING_LEN]).await?;
            }
        }
        conn.close(0_u32.into(), b"done");
        Ok(())
    }))
}

/// Sets up two transports (B echoes every frame back) and returns the measured part.
async fn transport(
    security: &ClusterSecurity,
    round_trips: usize,
    in_flight: usize,
) -> Result<Run, Box<dyn std::error::Error>> {
    let config = TransportConfig { send_queue_len_max: in_flight.max(256), ..TransportConfig::default() };
    let (a, mut a_rx) = QuicTransport::bind(loopback(), security, NodeId(1), config.clone())?;
    let (b, mut b_rx) = QuicTransport::bind(loopback(), security, NodeId(2), config)?;
    let (a_addr, b_addr) = (a.local_addr(), b.local_addr());
    a.verify(b_addr, NodeId(2)).await?;
    b.verify(a_addr, NodeId(1)).await?;
    let echo = b.clone();
    tokio::spawn(async move {
        while let Some((from, _ping)) = b_rx.recv().await {
            let _ = echo.send(from, a_addr, vec![7; PONG_LEN]);
        }
    });
    Ok(Box::pin(async move {
        for _ in 0..in_flight.min(round_trips) {
            a.send(NodeId(2), b_addr, vec![1; PING_LEN])?;
        }
        for done in 0..round_trips {
            tokio::time::timeout(Duration::from_secs(5), a_rx.recv()).await?.ok_or("closed")?;
            if done + in_flight < round_trips {
                a.send(NodeId(2), b_addr, vec![1; PING_LEN])?;
            }
        }
        a.close().await;
        b.close().await;
        Ok(())
    }))
}
