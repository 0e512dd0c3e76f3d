//! ratemesh: the embedded node library.
//!
//! A Rust service links this crate to run a ratemesh node in its own process: a tokio driver
//! ([`Node`]) over the sans-IO protocol core (`ratemesh-core`), chitchat gossip membership, and
//! peers over QUIC with mutual TLS. Start one with [`NodeBuilder`]; see [`Node`] for an example.
//!
//! - [`node`]: [`NodeBuilder`], [`Node`] (`check`, `check_now`, `release`, `members`,
//!   `metrics`, `shutdown`), [`NamedPolicy`].
//! - [`calendar`]: calendar-aligned windows ([`Calendar`], [`CalendarPolicy`]) in UTC or an IANA
//!   time zone.
//! - [`durable`]: durable quotas — [`StateStore`] (default: [`FileStateStore`], a file in a data
//!   directory) and the snapshot format.
//! - [`headers`]: the rate-limit response headers (`X-RateLimit-*`, `Retry-After`, IETF `RateLimit`).
//! - `layer` (feature `tower`, on by default): `RateLimitLayer`, a `tower::Layer` for HTTP services.
//! - [`membership`]: gossip proposes members, mutual TLS confirms them.
//! - [`security`]: cluster security — a CA derived from a shared secret or user-provided
//!   certificates, node names in certificates, the admission rule, certificate files.
//! - [`transport`]: [`Transport`], QUIC peers (quinn) that send the core's frames to members and
//!   deliver frames whose sender is authenticated by its certificate.

pub mod calendar;
pub mod durable;
pub mod headers;
#[cfg(feature = "tower")]
pub mod layer;
pub mod membership;
pub mod node;
pub mod security;
pub mod transport;

pub use calendar::{Calendar, CalendarPolicy, CalendarUnit};
pub use durable::{FileStateStore, StateStore};
#[cfg(feature = "tower")]
pub use layer::{HeaderKey, KeyExtractor, RateLimitBody, RateLimitLayer, RateLimitService};
pub use membership::{Member, MemberStatus};
pub use node::{CheckError, NamedPolicy, Node, NodeBuilder, NodeMetrics, StartError};
pub use ratemesh_core::NodeId;
pub use security::{ClusterSecret, ClusterSecurity, ProvidedCerts, SecurityError};
pub use transport::{Received, Transport, TransportConfig, TransportError, TransportStats};
