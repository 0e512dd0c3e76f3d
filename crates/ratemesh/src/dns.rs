//! Name resolution that needs nothing from the C library.
//!
//! A statically linked glibc binary in a `FROM scratch` image cannot resolve names with
//! `getaddrinfo` (which tokio's `lookup_host`, and chitchat's own seed resolution, call): glibc
//! loads its resolver as NSS modules at run time, and the image has none. [`Dns`] is
//! hickory-resolver, a stub resolver in Rust that reads `/etc/resolv.conf` (name servers,
//! `search` domains, `ndots`: what Docker and Kubernetes write into every container) and
//! `/etc/hosts` itself.
//!
//! Every lookup is bounded by [`LOOKUP_TIMEOUT`] and its answer by [`ADDRS_MAX`] addresses. The
//! resolver's cache is cleared before each lookup: seeds are re-resolved to see members come and
//! go, and a cached answer (Docker's embedded DNS gives a TTL of 600 s) would hide that.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{LookupIpStrategy, ResolveHosts};
use hickory_resolver::proto::rr::RData;

/// The longest one lookup may take (every search domain and record type included).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// The most addresses or names one lookup returns (a headless Service of a large StatefulSet
/// answers one address per pod; more than this many seeds add nothing).
pub const ADDRS_MAX: usize = 256;

/// Why a name could not be resolved. Nothing changed; the caller retries or gives up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DnsError {
    /// The resolver configuration (`/etc/resolv.conf`) could not be read or parsed.
    #[error("resolver configuration (/etc/resolv.conf): {0}")]
    Config(String),
    /// The name server did not answer, answered an error, or had no record.
    #[error("looking up {name}: {reason}")]
    Lookup {
        /// The name (or address, for a reverse lookup).
        name: String,
        /// What the resolver reported.
        reason: String,
    },
    /// The lookup took longer than [`LOOKUP_TIMEOUT`].
    #[error("looking up {name}: no answer within {LOOKUP_TIMEOUT:?}")]
    Timeout {
        /// The name (or address).
        name: String,
    },
}

/// A DNS stub resolver configured from `/etc/resolv.conf` and `/etc/hosts` (see the module
/// documentation). Cheap to clone.
#[derive(Clone)]
pub struct Dns {
    /// `/etc/hosts`, then the name servers.
    resolver: TokioResolver,
    /// The name servers only (reverse lookups).
    servers: TokioResolver,
}

impl std::fmt::Debug for Dns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dns").finish_non_exhaustive()
    }
}

impl Dns {
    /// A resolver configured like the system's: `/etc/resolv.conf`, and `/etc/hosts` first for
    /// every name looked up (not for reverse lookups). Both IPv4 and IPv6 addresses are asked for.
    pub fn from_system() -> Result<Dns, DnsError> {
        Ok(Dns {
            resolver: system_resolver(ResolveHosts::Always)?,
            servers: system_resolver(ResolveHosts::Never)?,
        })
    }

    /// Every address of `host` (A and AAAA records, or `/etc/hosts`), with `port`: sorted, without
    /// duplicates, at most [`ADDRS_MAX`]. An IP address literal is returned as it is.
    pub async fn lookup(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, DnsError> {
        self.resolver.clear_cache();
        let lookup = self.bounded(host, self.resolver.lookup_ip(host)).await?;
        let mut addrs: Vec<SocketAddr> = lookup.iter().map(|ip| SocketAddr::new(ip, port)).collect();
        addrs.sort_unstable();
        addrs.dedup();
        addrs.truncate(ADDRS_MAX);
        Ok(addrs)
    }

    /// The names the name servers give `ip` (PTR records), without the final dot, at most
    /// [`ADDRS_MAX`]. Docker's embedded DNS answers `<container name>.<network name>` for a
    /// container's address. `/etc/hosts` is not asked: Docker writes the container's id there.
    pub async fn reverse(&self, ip: IpAddr) -> Result<Vec<String>, DnsError> {
        self.servers.clear_cache();
        let name = ip.to_string();
        let lookup = self.bounded(&name, self.servers.reverse_lookup(ip)).await?;
        let names = lookup
            .answers()
            .iter()
            .filter_map(|record| match &record.data {
                RData::PTR(ptr) => Some(ptr.0.to_utf8().trim_end_matches('.').to_owned()),
                _ => None,
            })
            .take(ADDRS_MAX)
            .collect();
        Ok(names)
    }

    /// `lookup`, bounded by [`LOOKUP_TIMEOUT`], its error named after `name`.
    async fn bounded<T, E: std::fmt::Display>(
        &self,
        name: &str,
        lookup: impl Future<Output = Result<T, E>>,
    ) -> Result<T, DnsError> {
        match tokio::time::timeout(LOOKUP_TIMEOUT, lookup).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => Err(DnsError::Lookup { name: name.to_owned(), reason: error.to_string() }),
            Err(_) => Err(DnsError::Timeout { name: name.to_owned() }),
        }
    }
}

/// A resolver from `/etc/resolv.conf`, asking for A and AAAA records, with `hosts` deciding
/// whether `/etc/hosts` is read.
fn system_resolver(hosts: ResolveHosts) -> Result<TokioResolver, DnsError> {
    let mut builder = TokioResolver::builder_tokio().map_err(|error| DnsError::Config(error.to_string()))?;
    builder.options_mut().ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    builder.options_mut().use_hosts_file = hosts;
    builder.build().map_err(|error| DnsError::Config(error.to_string()))
}
