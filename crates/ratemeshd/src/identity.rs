//! The node's id and advertised addresses when the environment decides them: `[node] id_from`
//! and `[listen] advertise_ip_from`, resolved once at start ([`resolve`]).
//!
//! Orchestrators that run many copies of one configuration give each copy a stable name, not a
//! number:
//!
//! - a Kubernetes StatefulSet names its pods `<set>-<ordinal>` (`ratemesh-0`, `ratemesh-1`, …),
//!   and a pod's host name is its pod name: `id_from = "hostname"` gives `ratemesh-3` the id 3,
//!   the same after every restart and reschedule;
//! - `docker-compose --scale` gives each replica a container name `<project>_<service>_<n>` but a
//!   host name that is its container id (new at every recreation); Docker's embedded DNS answers
//!   the container name for the container's address: `id_from = "reverse_dns"` gives the id `n`.
//!
//! A name whose first label ends in `-<digits>` or `_<digits>` has that ordinal as its id; any
//! other name (a stable host name without an ordinal) has a 64-bit hash of the name
//! ([`id_from_name`]). Either way the incarnation still tells restarts apart (by default the
//! start time in microseconds), so peers never mistake a restarted node for its previous life.
//!
//! `advertise_ip_from = "hostname"` advertises the address the host name resolves to, looked up
//! in `/etc/hosts` first, where Docker and Kubernetes write the container's own name and address:
//! a replica of a scaled compose service has no other way to learn its address (in Kubernetes,
//! the downward API's `status.podIP` is the usual alternative). Both lookups go through
//! [`ratemesh::dns::Dns`], which needs no C library resolver, and are retried
//! [`LOOKUP_ATTEMPTS_MAX`] times: a node that cannot learn its identity does not start.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ratemesh::NodeId;
use ratemesh::dns::{Dns, DnsError};
use ratemesh_core::Namespace;
use tracing::{info, warn};

use crate::config::{AdvertiseIpFrom, Config, IdFrom};

/// Where Linux keeps the host name (no C library call needed).
pub const HOSTNAME_PATH: &str = "/proc/sys/kernel/hostname";
/// Attempts at each lookup before the start fails.
pub const LOOKUP_ATTEMPTS_MAX: u32 = 5;
/// Time between two attempts.
pub const LOOKUP_RETRY_DELAY: Duration = Duration::from_secs(1);

/// Why the node's identity could not be found. Nothing started.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The host name could not be read.
    #[error("reading the host name from {HOSTNAME_PATH}: {0}")]
    Hostname(std::io::Error),
    /// A lookup failed every attempt.
    #[error("{what}: {source} ({LOOKUP_ATTEMPTS_MAX} attempts)")]
    Dns {
        /// What was looked up.
        what: String,
        /// The last attempt's error.
        source: DnsError,
    },
    /// A lookup answered, but with nothing usable.
    #[error("{0}")]
    Nothing(String),
}

/// The node's id and the addresses it advertises, as the configuration and the environment
/// decide them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The node's id.
    pub id: NodeId,
    /// The gossip address to advertise, if not the listen address.
    pub advertise_gossip: Option<SocketAddr>,
    /// The QUIC address to advertise, if not the listen address.
    pub advertise_quic: Option<SocketAddr>,
}

/// Resolves `config`'s identity: its `node.id` and advertised addresses as they are, or found
/// through the host name and DNS (see the module documentation).
pub async fn resolve(config: &Config) -> Result<Identity, IdentityError> {
    let listen = &config.listen;
    let mut identity = Identity {
        id: config.node.id,
        advertise_gossip: listen.advertise_gossip,
        advertise_quic: listen.advertise_quic,
    };
    if listen.advertise_ip_from == Some(AdvertiseIpFrom::Hostname) {
        let ip = own_ip(&system_dns()?).await?;
        info!(%ip, "advertised IP from the host name");
        identity.advertise_gossip = Some(SocketAddr::new(ip, listen.gossip.port()));
        identity.advertise_quic = Some(SocketAddr::new(ip, listen.quic.port()));
    }
    let name = match config.node.id_from {
        None => return Ok(identity),
        Some(IdFrom::Hostname) => hostname()?,
        Some(IdFrom::ReverseDns) => {
            let ip = identity.advertise_gossip.unwrap_or(listen.gossip).ip();
            reverse_name(&system_dns()?, ip).await?
        }
    };
    identity.id = id_from_name(&name);
    let from = config.node.id_from.map_or("", IdFrom::name);
    info!(id = identity.id.0, name, from, "node id from the environment");
    Ok(identity)
}

/// The id of the node called `name`: the ordinal at the end of its first label (`ratemesh-3`,
/// `project_ratemesh_3.project_default` → 3), else a 64-bit hash of the whole name (lower case,
/// without a final dot), stable across builds (XXH3, as key hashes).
pub fn id_from_name(name: &str) -> NodeId {
    let name = name.trim().trim_end_matches('.').to_ascii_lowercase();
    let label = name.split('.').next().unwrap_or_default();
    let ordinal = label
        .rsplit_once(['-', '_'])
        .map(|(_, digits)| digits)
        .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|digits| digits.parse::<u64>().ok());
    NodeId(ordinal.unwrap_or_else(|| Namespace::new(b"ratemeshd:node-id").key(name.as_bytes()).low64()))
}

/// The kernel's host name.
pub fn hostname() -> Result<String, IdentityError> {
    let name = std::fs::read_to_string(HOSTNAME_PATH).map_err(IdentityError::Hostname)?;
    let name = name.trim();
    if name.is_empty() {
        return Err(IdentityError::Nothing(format!("{HOSTNAME_PATH} is empty")));
    }
    Ok(name.to_owned())
}

fn system_dns() -> Result<Dns, IdentityError> {
    Dns::from_system().map_err(|source| IdentityError::Dns { what: "the resolver".to_owned(), source })
}

/// The address the host name resolves to: its first IPv4 address that is not loopback, else
/// its first IPv6 address that is not loopback.
async fn own_ip(dns: &Dns) -> Result<IpAddr, IdentityError> {
    let name = hostname()?;
    let addrs = retried(&format!("the address of host name {name}"), || dns.lookup(&name, 0)).await?;
    let usable =
        |v4: bool| addrs.iter().map(SocketAddr::ip).find(|ip| ip.is_ipv4() == v4 && !ip.is_loopback());
    usable(true).or_else(|| usable(false)).ok_or_else(|| {
        IdentityError::Nothing(format!("host name {name} resolves to no usable address: {addrs:?}"))
    })
}

/// The first name `ip` resolves back to.
async fn reverse_name(dns: &Dns, ip: IpAddr) -> Result<String, IdentityError> {
    let names = retried(&format!("the name of {ip}"), || dns.reverse(ip)).await?;
    names.into_iter().next().ok_or_else(|| IdentityError::Nothing(format!("{ip} has no name in DNS")))
}

/// `lookup`, retried up to [`LOOKUP_ATTEMPTS_MAX`] times, [`LOOKUP_RETRY_DELAY`] apart.
async fn retried<T, F: Future<Output = Result<T, DnsError>>>(
    what: &str,
    mut lookup: impl FnMut() -> F,
) -> Result<T, IdentityError> {
    let mut attempt = 1;
    // Bounded by LOOKUP_ATTEMPTS_MAX.
    loop {
        match lookup().await {
            Ok(found) => return Ok(found),
            Err(source) if attempt >= LOOKUP_ATTEMPTS_MAX => {
                return Err(IdentityError::Dns { what: what.to_owned(), source });
            }
            Err(error) => warn!(what, %error, attempt, "lookup failed; retrying"),
        }
        attempt += 1;
        tokio::time::sleep(LOOKUP_RETRY_DELAY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(name: &str, id: u64) {
        assert_eq!(id_from_name(name), NodeId(id), "{name}");
    }

    #[test]
    fn ids_are_ordinals_of_names_or_their_hashes() {
        check("ratemesh-0", 0);
        check("ratemesh-3", 3);
        check("ratemesh-3.ratemesh-peers.default.svc.cluster.local", 3);
        check("ratemeshscale_node_2.ratemeshscale_default", 2);
        check("ratemeshscale-node-12.ratemeshscale_default.", 12);
        check("web-007", 7);
        // Without an ordinal: a hash of the whole name, stable and case-insensitive.
        let hashed = id_from_name("3f2a1b4c5d6e");
        assert_eq!(hashed, id_from_name("3F2A1B4C5D6E"));
        assert_ne!(hashed, id_from_name("3f2a1b4c5d6f"));
        assert_ne!(id_from_name("ratemesh-"), id_from_name("ratemesh"));
        check("ratemesh-3a", id_from_name("ratemesh-3a").0);
        assert_ne!(id_from_name("ratemesh-3a"), NodeId(3));
        // An ordinal too long for 64 bits is not an ordinal.
        assert_ne!(id_from_name("ratemesh-99999999999999999999999"), NodeId(u64::MAX));
        // The hash is fixed by the code (XXH3), not the build: pinned.
        assert_eq!(id_from_name("localhost"), NodeId(480_053_118_790_132_701));
        assert_eq!(id_from_name("localhost."), id_from_name("localhost"));
    }

    #[test]
    fn the_host_name_is_read_without_the_c_library() {
        let name = hostname().expect("Linux has a host name");
        assert!(!name.is_empty() && !name.contains('\n'), "{name:?}");
    }

    #[tokio::test]
    async fn an_explicit_configuration_needs_no_lookup() {
        let config = Config::default();
        let identity = resolve(&config).await.expect("nothing to look up");
        assert_eq!(identity, Identity { id: NodeId(1), advertise_gossip: None, advertise_quic: None });
    }
}
