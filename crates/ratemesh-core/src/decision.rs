//! The answer to a check.

use core::time::Duration;

/// Identifies one concurrency lease, so that its holder can release it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(pub u64);

/// The answer to a check: allowed or not, and what a client needs to pace itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request passes. For a cost-0 query: whether a request of cost 1 would pass now.
    pub allowed: bool,
    /// The limit in force, as reported to clients (`X-RateLimit-Limit`).
    pub limit: u64,
    /// Hits that would still pass right now, after this request.
    pub remaining: u64,
    /// Time until the key is back to its fresh state if nothing else arrives (`X-RateLimit-Reset`).
    pub reset_after: Duration,
    /// When refused: the earliest time after which the same request would pass if nothing else
    /// arrives (`Retry-After`). `None` when allowed, and when the request can never pass (its cost
    /// exceeds the limit's capacity).
    pub retry_after: Option<Duration>,
    /// Shaper only: how long the caller must hold an admitted request before serving it.
    pub delay: Duration,
    /// Concurrency only: the lease taken by an admitted request, to be released when done.
    pub lease: Option<LeaseId>,
}

impl Decision {
    /// A decision with the given fields and no delay or lease.
    pub(crate) fn new(allowed: bool, limit: u64, remaining: u64, reset_after_nanos: u64) -> Self {
        Decision {
            allowed,
            limit,
            remaining,
            reset_after: Duration::from_nanos(reset_after_nanos),
            retry_after: None,
            delay: Duration::ZERO,
            lease: None,
        }
    }

    /// An admission with nothing known about the state (a fail-open fallback).
    #[cfg_attr(not(feature = "std"), allow(dead_code))]
    pub(crate) fn admitted_blind(limit: u64) -> Self {
        Decision::new(true, limit, limit, 0)
    }

    /// The same decision, refused, passing after `nanos` (or never, for `None`).
    pub(crate) fn refused_for(mut self, nanos: Option<u64>) -> Self {
        self.allowed = false;
        self.retry_after = nanos.map(Duration::from_nanos);
        self
    }
}
