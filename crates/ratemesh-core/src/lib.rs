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

mod algorithm;
mod decision;
mod key;
mod limit;
mod node;
mod store;
mod time;
pub mod wire;

pub use algorithm::{Bucket, CoreRng, Snapshot, SnapshotMismatch};
pub use decision::{Decision, LeaseId};
pub use key::{KeyHash, KeyHasher, KeyHasherBuilder, Namespace};
pub use limit::{
    Algorithm, CONCURRENCY_LIMIT_MAX, CalendarWindow, Limit, LimitError, LimitSpec, PERIOD_NANOS_MAX,
    SLIDING_LOG_LIMIT_MAX,
};
pub use node::{
    AdjustRequest, Adjustment, CheckOutcome, CheckRequest, DeliveryStats, DurableKey, Event, Fallback,
    LeavePlan, MemberView, Mode, Node, NodeConfig, NodeId, NodeStats, Policy, RING_VNODES_DEFAULT, RequestId,
    RestoreStats, Ring, Transmit,
};
pub use store::{KeyExtra, Store, StoreConfig, StoreStats};
pub use time::{Instant, duration_nanos};
