//! ratemesh-core: the sans-IO heart of ratemesh.
//!
//! Everything here is deterministic: time comes in as an [`Instant`] argument, randomness from a
//! seeded [`CoreRng`], messages as values. Nothing reads a clock, spawns a task, touches a socket
//! or draws OS randomness, so the tokio node and the simulator drive the very same code.
//!
//! - [`Limit`]: a validated limit (algorithm and parameters).
//! - [`Bucket`]: the state of one key under one limit; [`Decision`]: the answer to a check.
//! - [`Store`]: many buckets, bounded by `keys_max`, with TTL expiry and counted eviction.
//! - [`Node`]: the cluster node state machine (ownership, exact and approximate modes, handoff).
//! - [`wire`]: versioned peer messages, encoded with postcard, decoded with a size bound.
//!
//! The crate is `#![no_std]` (with `alloc`): its own code cannot name a clock, a thread, a socket
//! or a file, which is the core's purity rule checked by the compiler. The `std` feature (on by
//! default) adds what needs a dependency built on `std`: the consistent-hash [`Ring`] (over the
//! `hashring` crate) and with it the cluster [`Node`]. `cargo build -p ratemesh-core
//! --no-default-features` (a step of `.ci/run`) builds the rest without `std` anywhere in its graph.

#![no_std]

extern crate alloc;
#[cfg(test)]
extern crate std;

/// What the standard prelude would bring: the core's modules `use crate::prelude::*`. Without
/// `std` the node, the main user of some of these, is not built.
#[allow(unused_imports)]
mod prelude {
    pub(crate) use alloc::borrow::ToOwned;
    pub(crate) use alloc::boxed::Box;
    pub(crate) use alloc::string::{String, ToString};
    pub(crate) use alloc::vec::Vec;
    pub(crate) use alloc::{format, vec};
}

mod algorithm;
mod decision;
mod key;
mod limit;
#[cfg(feature = "std")]
mod node;
mod region;
mod store;
mod time;
pub mod wire;

pub use algorithm::{Bucket, CoreRng, Snapshot, SnapshotMismatch};
pub use decision::{Decision, LeaseId};
pub use key::{KeyHash, KeyHasher, KeyHasherBuilder, Namespace};
pub use limit::{
    Algorithm, CONCURRENCY_LIMIT_MAX, CalendarWindow, Limit, LimitError, LimitParameter, LimitSpec,
    PERIOD_NANOS_MAX, SLIDING_LOG_ENTRIES_MAX,
};
#[cfg(feature = "std")]
pub use node::{
    AUDIT_KEYS_MAX_DEFAULT, AUDIT_SPAN_NANOS, AdjustRequest, Adjustment, Audit, AuditFigures,
    AuditKeyFigures, AuditStats, AuditSums, AuditWindow, CheckOutcome, CheckRequest, DeliveryStats,
    DurableCursor, DurableKey, Event, FRAME_ENTRY_BYTES_MAX, FRAME_LEN_MIN, Fallback, LeavePlan, MemberView,
    Mode, Node, NodeConfig, NodeConfigError, NodeId, NodeStats, Policy, REGION_LEASE_MS_DEFAULT,
    REGION_SYNC_INTERVAL_MS_DEFAULT, RING_VNODES_DEFAULT, RING_VNODES_MAX, RequestId, RestoreStats, Ring,
    SYNC_INTERVAL_MS_DEFAULT, Transmit, ViewChange,
};
pub use region::{PolicyRegion, RegionFallback, RegionId};
pub use store::{KeyExtra, Store, StoreConfig, StoreStats};
pub use time::{Instant, duration_nanos};
