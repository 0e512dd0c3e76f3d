//! ratemesh: the embedded node library.
//!
//! A Rust service links this crate to run a ratemesh node in its own process: a tokio driver
//! ([`Node`]) over the sans-IO protocol core (`ratemesh-core`), chitchat gossip membership, and
//! peers over QUIC with mutual TLS. Start one with [`NodeBuilder`]; see [`Node`] for an example.
//!
//! - The node: [`NodeBuilder`], [`Node`] (`check`, `check_now`, `release`, `members`, `metrics`,
//!   `shutdown`), [`NamedPolicy`]; refunds ([`Node::refund`]), charges after the fact
//!   ([`Node::charge`]) and all-or-nothing checks across limits ([`Node::check_all`]).
//! - The audit of what the cluster admitted against one ideal limiter, per policy and key, over
//!   a node's lanes and the cluster's members ([`Node::audit`], [`AuditReport`]).
//! - Calendar-aligned windows ([`Calendar`], [`CalendarPolicy`]) in UTC or an IANA time zone.
//! - Seeds ([`Seed`]) given as addresses or DNS names, resolved by [`dns`] (no C library: works
//!   in a `FROM scratch` image) and re-resolved periodically; regions ([`Region`]).
//! - [`layer`] (feature `tower`, on by default): [`RateLimitLayer`], a `tower::Layer` for HTTP services.
//! - [`durable`]: durable quotas — [`StateStore`] (default: [`FileStateStore`], a file in a data
//!   directory) and the snapshot format.
//! - [`headers`]: the rate-limit response headers (`X-RateLimit-*`, `Retry-After`, IETF `RateLimit`).
//! - [`gossip`]: chitchat over sealed (authenticated, encrypted) UDP, bounded for insiders,
//!   restarted when it ends.
//! - [`membership`]: gossip proposes members, mutual TLS confirms them.
//! - [`overrides`]: live per-key overrides, set on any node for the whole cluster
//!   ([`Node::start_live_overrides`], [`LiveOverrides`]).
//! - [`security`]: cluster security — a CA derived from a shared secret or user-provided
//!   certificates, node names in certificates, the admission rule, certificate files.
//! - [`top`]: who is being limited — per policy, the heaviest keys by refused hits or demand
//!   over the last minute, in bounded heavy-hitter sketches ([`Node::top`] merges the members').
//! - [`transport`]: [`PeerTransport`], what the node needs of a peer transport (send frames to
//!   members, deliver frames whose sender is authenticated, admit members, queries), with
//!   [`QuicTransport`] (QUIC with mutual TLS) and [`MemoryTransport`] (an in-process
//!   [`MemoryNetwork`], for tests on virtual time).
//! - [`defaults`]: every default of the builder and the configurations, defined once.
//! - [`Mutex`], [`RwLock`]: std's blocking locks with the crate's one poisoning policy (a
//!   poisoned lock is recovered), used here and by the daemon.
//!
//! What an embedder needs is named at the crate's root; the modules left public are namespaces
//! of the advanced parts (durable state, headers, gossip, security, transports, defaults).
// Everything `pub` is reachable from the root: the boundary is what the root names.
#![warn(unreachable_pub)]

mod audit;
mod backoff;
mod calendar;
pub mod defaults;
pub mod dns;
pub mod durable;
pub mod gossip;
pub mod headers;
#[cfg(feature = "tower")]
pub mod layer;
pub mod membership;
mod node;
pub mod overrides;
mod region;
pub mod security;
mod seeds;
mod sync;
pub mod top;
pub mod transport;
mod usage;

pub use audit::{AUDIT_KEYS_PER_ANSWER_MAX, AuditKey, AuditReport};
pub use backoff::Backoff;
pub use calendar::{Calendar, CalendarError, CalendarPolicy, CalendarUnit};
pub use durable::{FileStateStore, StateStore};
pub use gossip::{GossipHealth, GossipLimits, GossipStats};
#[cfg(feature = "tower")]
pub use layer::{HeaderKey, KeyExtractor, RateLimitBody, RateLimitLayer, RateLimitService};
pub use membership::{Member, MemberStatus};
pub use node::{
    APP_QUERY_TAG, APP_QUESTION_LEN_MAX, AskError, CheckError, LANES_MAX, MissingMember, NamedPolicy, Node,
    NodeBuilder, NodeMetrics, Released, SHARED_VALUE_BYTES_MAX, SHARED_VALUES_MAX, SharedValuesError,
    StartError, TopLabel, TopReport,
};
pub use overrides::{LiveOverride, LiveOverrides, OverrideError, OverrideLimit};
pub use region::{REGION_NAME_BYTES_MAX, Region, RegionError};
// What an embedder names from the core (policies, limits, decisions, the node's configuration),
// so that an application imports one crate.
pub use ratemesh_core::{
    AUDIT_KEYS_MAX_DEFAULT, Adjustment, Algorithm, Audit, AuditFigures, AuditKeyFigures, AuditStats,
    AuditSums, AuditWindow, Decision, Fallback, KeyHash, LeaseId, Limit, LimitError, LimitSpec, MemberView,
    Mode, Namespace, NodeConfig, NodeConfigError, NodeId, Policy, PolicyRegion, RegionFallback, RegionId,
};
pub use security::{ClusterSecret, ClusterSecurity, ProvidedCerts, SecurityError};
pub use seeds::{SEED_ADDRS_MAX, SEED_HOST_BYTES_MAX, Seed, SeedError, SeedHost};
// The crate's blocking locks, one poisoning policy (recovered; `sync.rs` says why), for the daemon too.
pub use sync::{Mutex, RwLock};
pub use top::{TopAnswer, TopBy, TopConfig, TopEntry};
pub use transport::{
    MemoryNetwork, MemoryTransport, PeerTransport, QuicTransport, Received, TransportConfig, TransportError,
    TransportStats,
};
pub use usage::{AdjustError, GroupCheck, GroupDecision};
