//! ratemesh: the embedded node library.
//!
//! This crate will run a ratemesh node inside a Rust service: a tokio driver over the sans-IO
//! core (`ratemesh-core`), gossip membership, and peers over QUIC with mutual TLS. So far it holds
//! the security and peer-transport layers:
//!
//! - [`security`]: cluster security — a CA derived from a shared secret or user-provided
//!   certificates, node names in certificates, the admission rule, certificate files.
//! - [`transport`]: [`Transport`], QUIC peers (quinn) that send the core's frames to members and
//!   deliver frames whose sender is authenticated by its certificate.

pub mod security;
pub mod transport;

pub use ratemesh_core::NodeId;
pub use security::{ClusterSecret, ClusterSecurity, ProvidedCerts, SecurityError};
pub use transport::{Received, Transport, TransportConfig, TransportError, TransportStats};
