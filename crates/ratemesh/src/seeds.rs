//! Seeds: the gossip addresses a node joins through, given as addresses or as DNS names.
//!
//! A [`Seed`] is either a socket address (`10.0.0.2:7946`) or a host name and port
//! (`ratemesh-peers.default.svc.cluster.local:7946`, the headless Service of a Kubernetes
//! StatefulSet, or a docker compose service name). Addresses go to chitchat as its seed list, as
//! they always did. Names do not: chitchat 0.13 resolves hostname seeds itself, through tokio's
//! `lookup_host` (`getaddrinfo`, which cannot resolve in a `FROM scratch` image, see
//! [`crate::dns`]), only every 60 s, and its seed list cannot be changed after start. So names
//! are resolved here, by [`crate::dns::Dns`], and the node gossips with what they resolve to
//! through chitchat's handle, as chitchat does with a seed:
//!
//! - every resolution uses every A and AAAA record of every name (a headless Service answers one
//!   address per pod), less this node's own gossip address, at most [`SEED_ADDRS_MAX`];
//! - after each resolution the node gossips once with every address resolved: a member that
//!   DNS knows but gossip does not yet (a new pod, the other side of a healed split) is
//!   contacted;
//! - while the node sees no other live member it also gossips with them every gossip round, and
//!   resolves again after a backoff that starts at the gossip interval and doubles up to the
//!   resolve interval (a new StatefulSet's pods appear in DNS one by one, and CoreDNS caches
//!   answers for about 30 s); once it has a live peer, it resolves every resolve interval;
//! - a failed lookup is logged (a warning) and retried the same way; it is never fatal.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::dns::Dns;

/// The most seed addresses a node gossips with after a resolution (all names together).
pub const SEED_ADDRS_MAX: usize = 64;
/// The longest host name of a seed, in bytes (the DNS limit).
pub const SEED_HOST_BYTES_MAX: usize = 253;

/// A gossip address to join the cluster through.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Seed {
    /// An IP address and port, given to chitchat as is.
    Addr(SocketAddr),
    /// A DNS name and port, resolved (and re-resolved) by the node (see the module documentation).
    Host(SeedHost),
}

/// A seed given by name: a host name and a gossip port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SeedHost {
    host: String,
    port: u16,
}

impl SeedHost {
    /// The host name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The gossip port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// Why a seed was refused. The operator's input is at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SeedError {
    /// Not of the form `ip:port`, `[ipv6]:port` or `host:port`.
    #[error("{0:?} is not a seed of the form ip:port, [ipv6]:port or host:port")]
    Form(String),
    /// The port is missing, not a number, or 0.
    #[error("{0:?}: the port must be 1 to 65535")]
    Port(String),
    /// The host is not a DNS name: 1 to 253 bytes of dot-separated labels of letters, digits,
    /// `-` and `_`, each 1 to 63 bytes.
    #[error("{0:?}: the host is not a DNS name")]
    Host(String),
    /// An unspecified address (`0.0.0.0`, `::`) cannot be connected to.
    #[error("{0:?}: an unspecified address cannot be connected to")]
    Unspecified(String),
}

impl FromStr for Seed {
    type Err = SeedError;

    fn from_str(text: &str) -> Result<Seed, SeedError> {
        let text = text.trim();
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return match addr {
                addr if addr.ip().is_unspecified() => Err(SeedError::Unspecified(text.to_owned())),
                addr if addr.port() == 0 => Err(SeedError::Port(text.to_owned())),
                addr => Ok(Seed::Addr(addr)),
            };
        }
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err(SeedError::Form(text.to_owned()));
        };
        let port = port.parse::<u16>().ok().filter(|&port| port != 0);
        let port = port.ok_or_else(|| SeedError::Port(text.to_owned()))?;
        if host.contains(':') || host.starts_with('[') {
            // An IPv6 address written wrongly, not a name.
            return Err(SeedError::Form(text.to_owned()));
        }
        if !is_dns_name(host) {
            return Err(SeedError::Host(text.to_owned()));
        }
        Ok(Seed::Host(SeedHost { host: host.to_owned(), port }))
    }
}

impl From<SocketAddr> for Seed {
    fn from(addr: SocketAddr) -> Seed {
        Seed::Addr(addr)
    }
}

impl fmt::Display for Seed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Seed::Addr(addr) => write!(f, "{addr}"),
            Seed::Host(SeedHost { host, port }) => write!(f, "{host}:{port}"),
        }
    }
}

/// Whether `host` is a DNS name (see [`SeedError::Host`]). `_` is allowed: Docker's container
/// names have it, and its embedded DNS answers them.
fn is_dns_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    !host.is_empty()
        && host.len() <= SEED_HOST_BYTES_MAX
        && host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Where the seed task sends its gossip and what it needs to know of the node.
pub(crate) trait SeedSink: Send + Sync + 'static {
    /// Gossips once with `addr` (chitchat's `ChitchatHandle::gossip`). Does nothing once gossip
    /// is stopped.
    fn gossip_with(&self, addr: SocketAddr);

    /// Whether another member is live in this node's view.
    fn has_live_peer(&self) -> bool;
}

/// How the seed task runs.
#[derive(Clone, Debug)]
pub(crate) struct SeedResolution {
    /// The seeds given by name.
    pub(crate) hosts: Vec<SeedHost>,
    /// This node's advertised gossip address (left out of what the names resolve to).
    pub(crate) own_addr: SocketAddr,
    /// Time between resolutions once the node has a live peer.
    pub(crate) resolve_interval: Duration,
    /// The gossip interval: the first backoff, and how often to gossip with the seeds while alone.
    pub(crate) gossip_interval: Duration,
}

/// Starts the seed task (see the module documentation) on the current runtime; it ends when
/// `stop` turns true. `None` when no seed is given by name.
pub(crate) fn spawn(
    resolution: SeedResolution,
    sink: Arc<dyn SeedSink>,
    mut stop: watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    if resolution.hosts.is_empty() {
        return None;
    }
    Some(tokio::spawn(async move {
        tokio::select! {
            () = run(resolution, sink.as_ref()) => {}
            _ = stop.wait_for(|stopped| *stopped) => {}
        }
    }))
}

/// The seed task's loop; runs until dropped.
async fn run(resolution: SeedResolution, sink: &dyn SeedSink) {
    let mut dns: Option<Dns> = None;
    let mut addrs: Vec<SocketAddr> = Vec::new();
    let backoff = crate::Backoff { initial: resolution.gossip_interval, max: resolution.resolve_interval };
    let mut alone_backoff = backoff.initial;
    // Runs until the node stops (the caller drops this future).
    loop {
        let resolved = resolve(&mut dns, &resolution).await;
        if resolved != addrs {
            info!(resolved = ?resolved, "seed names resolved");
            addrs = resolved;
        }
        gossip_with_all(sink, &addrs);
        let wait = if sink.has_live_peer() {
            alone_backoff = resolution.gossip_interval;
            resolution.resolve_interval
        } else {
            let wait = alone_backoff;
            alone_backoff = backoff.next(alone_backoff);
            wait
        };
        let next_resolution = Instant::now() + wait;
        // Until then, gossip with the seeds every round while alone. Bounded by the wait.
        loop {
            let now = Instant::now();
            if now >= next_resolution {
                break;
            }
            tokio::time::sleep_until((now + resolution.gossip_interval).min(next_resolution)).await;
            if !sink.has_live_peer() {
                gossip_with_all(sink, &addrs);
            }
        }
    }
}

fn gossip_with_all(sink: &dyn SeedSink, addrs: &[SocketAddr]) {
    for &addr in addrs {
        sink.gossip_with(addr);
    }
}

/// Resolves every seed name: the union of their addresses, without `own_addr`, sorted, at most
/// [`SEED_ADDRS_MAX`]. Failures are logged; a name that fails contributes nothing this time.
async fn resolve(dns: &mut Option<Dns>, resolution: &SeedResolution) -> Vec<SocketAddr> {
    let dns = match dns {
        Some(dns) => dns,
        None => match Dns::from_system() {
            Ok(made) => dns.insert(made),
            Err(error) => {
                warn!(%error, "seed names cannot be resolved now (retrying)");
                return Vec::new();
            }
        },
    };
    let mut addrs = Vec::new();
    for seed in &resolution.hosts {
        match dns.lookup(&seed.host, seed.port).await {
            Ok(found) if found.is_empty() => warn!(seed = %seed.host, "seed name has no address (retrying)"),
            Ok(found) => {
                debug!(seed = %seed.host, addrs = ?found, "seed name resolved");
                addrs.extend(found);
            }
            Err(error) => warn!(seed = %seed.host, %error, "seed name not resolved (retrying)"),
        }
    }
    addrs.retain(|&addr| addr != resolution.own_addr);
    addrs.sort_unstable();
    addrs.dedup();
    addrs.truncate(SEED_ADDRS_MAX);
    addrs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(text: &str, expected: Result<&str, &str>) {
        let parsed = text.parse::<Seed>();
        match (parsed, expected) {
            (Ok(seed), Ok(shown)) => assert_eq!(seed.to_string(), shown, "{text}"),
            (Err(error), Err(kind)) => assert!(format!("{error:?}").starts_with(kind), "{text}: {error:?}"),
            (parsed, expected) => panic!("{text}: {parsed:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn seeds_parse_as_addresses_or_names() {
        check("10.0.0.2:7946", Ok("10.0.0.2:7946"));
        check(" [::1]:7946 ", Ok("[::1]:7946"));
        check("ratemesh-peers:7946", Ok("ratemesh-peers:7946"));
        check(
            "ratemesh-peers.default.svc.cluster.local.:7946",
            Ok("ratemesh-peers.default.svc.cluster.local.:7946"),
        );
        check("project_node_1.project_default:7946", Ok("project_node_1.project_default:7946"));
        check("ratemesh-peers", Err("Form"));
        check("ratemesh-peers:", Err("Port"));
        check("ratemesh-peers:0", Err("Port"));
        check("ratemesh-peers:65536", Err("Port"));
        check("10.0.0.2:0", Err("Port"));
        check("0.0.0.0:7946", Err("Unspecified"));
        check("::1:7946", Err("Form"));
        check("[::1:7946", Err("Form"));
        check("-bad:7946", Err("Host"));
        check("a..b:7946", Err("Host"));
        check("sp ace:7946", Err("Host"));
        check(&format!("{}:7946", "a".repeat(64)), Err("Host"));
        check(&format!("{}:7946", ["a"; 128].join(".")), Err("Host"));
        assert_eq!(
            Seed::from(SocketAddr::from(([10, 0, 0, 2], 7946))),
            "10.0.0.2:7946".parse().expect("an address")
        );
    }

    /// Records what the seed task gossips with.
    struct Recorder {
        sent: std::sync::Mutex<Vec<SocketAddr>>,
        peer: std::sync::atomic::AtomicBool,
        progress: tokio::sync::Notify,
    }

    impl SeedSink for Recorder {
        fn gossip_with(&self, addr: SocketAddr) {
            self.sent.lock().expect("not poisoned").push(addr);
            self.progress.notify_one();
        }

        fn has_live_peer(&self) -> bool {
            self.peer.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    impl Recorder {
        /// Waits (bounded) until `condition` holds of what was sent.
        async fn wait_for(&self, what: &str, condition: impl Fn(&[SocketAddr]) -> bool) {
            let waited = tokio::time::timeout(Duration::from_secs(30), async {
                loop {
                    let progress = self.progress.notified();
                    if condition(&self.sent.lock().expect("not poisoned")) {
                        return;
                    }
                    progress.await;
                }
            });
            waited.await.unwrap_or_else(|_| {
                panic!("not within 30 s: {what}: {:?}", self.sent.lock().expect("not poisoned"))
            });
        }
    }

    #[tokio::test]
    async fn names_are_resolved_and_gossiped_with_every_round_while_alone() {
        let recorder = Arc::new(Recorder {
            sent: std::sync::Mutex::new(Vec::new()),
            peer: false.into(),
            progress: tokio::sync::Notify::new(),
        });
        let host = |host: &str, port| SeedHost { host: host.to_owned(), port };
        let resolution = SeedResolution {
            // `localhost` is in /etc/hosts; a name that does not resolve is logged and skipped.
            hosts: vec![host("localhost", 7946), host("no-such-seed.invalid", 7946), host("localhost", 7000)],
            own_addr: SocketAddr::from(([127, 0, 0, 1], 7946)),
            resolve_interval: Duration::from_secs(3600),
            gossip_interval: Duration::from_millis(10),
        };
        let (stop_tx, stop) = watch::channel(false);
        let sink: Arc<dyn SeedSink> = recorder.clone();
        let task = spawn(resolution, sink, stop).expect("names to resolve");
        let other = SocketAddr::from(([127, 0, 0, 1], 7000));
        // Alone: the same address again every gossip round.
        recorder
            .wait_for("gossip with 127.0.0.1:7000 three times", |sent| {
                sent.iter().filter(|&&addr| addr == other).count() >= 3
            })
            .await;
        let own = SocketAddr::from(([127, 0, 0, 1], 7946));
        assert!(!recorder.sent.lock().expect("not poisoned").contains(&own), "never with itself");
        stop_tx.send_replace(true);
        tokio::time::timeout(Duration::from_secs(30), task).await.expect("stops").expect("no panic");
        let sink: Arc<dyn SeedSink> = recorder.clone();
        assert!(spawn(no_names(), sink, watch::channel(false).1).is_none(), "no names, no task");
    }

    /// A resolution without names: no task.
    fn no_names() -> SeedResolution {
        SeedResolution {
            hosts: Vec::new(),
            own_addr: SocketAddr::from(([127, 0, 0, 1], 7946)),
            resolve_interval: Duration::from_secs(1),
            gossip_interval: Duration::from_millis(10),
        }
    }
}
