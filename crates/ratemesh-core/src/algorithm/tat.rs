//! Token bucket, GCRA and the leaky-bucket shaper: one theoretical arrival time (TAT) per key.
//!
//! The TAT is the instant at which the bucket would be full again. A hit of cost `n` moves it
//! `n × interval` later; a hit passes when the TAT stays within `capacity × interval` of now. The
//! token count of the classic token bucket is `capacity − (TAT − now) / interval`, so the three
//! algorithms are one arithmetic with different parameters and outputs. Debt (hits applied from
//! other nodes past the capacity) is a TAT further ahead, paid back by waiting.

use crate::decision::Decision;
use crate::time::Instant;

/// Parameters of a TAT limit, as precomputed by [`crate::Limit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TatParams {
    pub interval_nanos: u64,
    pub capacity: u64,
    pub delay_free: u64,
    pub reported_limit: u64,
}

impl TatParams {
    fn tolerance_nanos(self) -> u64 {
        // Validated by `Limit::new`: capacity × interval fits well within u64.
        self.capacity.saturating_mul(self.interval_nanos)
    }
}

/// Decides a hit of `cost` at `now`, moving `tat` when it passes and `cost > 0`.
///
/// The hot path of every token bucket check: inlined, and it divides at most once (the hits left
/// now are only computed for the answers that report them; a full bucket needs no division).
#[inline]
pub(crate) fn check(tat: &mut Instant, p: TatParams, cost: u64, now: Instant) -> Decision {
    let base = (*tat).max(now);
    let backlog = base.nanos_since(now);
    let tolerance = p.tolerance_nanos();
    // Hits that would pass now: reported by refusals and queries, which change nothing.
    let remaining_now = || tolerance.saturating_sub(backlog) / p.interval_nanos;
    if cost > p.capacity {
        return Decision::new(false, p.reported_limit, remaining_now(), backlog).refused_for(None);
    }
    let need = cost.max(1) * p.interval_nanos;
    let backlog_after = backlog.saturating_add(need);
    if backlog_after > tolerance {
        let decision = Decision::new(false, p.reported_limit, remaining_now(), backlog);
        return decision.refused_for(Some(backlog_after - tolerance));
    }
    if cost == 0 {
        return Decision::new(true, p.reported_limit, remaining_now(), backlog);
    }
    *tat = base.add_nanos(need);
    let remaining = if backlog == 0 {
        // A full bucket (the common case for most keys): tolerance and need are whole intervals,
        // `capacity × interval` fits (validated by `Limit::new`), and cost ≤ capacity here.
        p.capacity - cost
    } else {
        (tolerance - backlog_after) / p.interval_nanos
    };
    let mut decision = Decision::new(true, p.reported_limit, remaining, backlog_after);
    let delay_free_nanos = p.delay_free.saturating_mul(p.interval_nanos);
    decision.delay = core::time::Duration::from_nanos(backlog_after.saturating_sub(delay_free_nanos));
    decision
}

/// Applies `hits` unconditionally (they were admitted elsewhere): the bucket may go into debt.
pub(crate) fn force(tat: &mut Instant, p: TatParams, hits: u64, now: Instant) {
    *tat = (*tat).max(now).add_nanos(hits.saturating_mul(p.interval_nanos));
}

/// Keeps the TAT at least `hits` intervals ahead of now (see [`super::Bucket::hold`]).
pub(crate) fn hold(tat: &mut Instant, p: TatParams, hits: u64, now: Instant) {
    *tat = (*tat).max(now.add_nanos(hits.saturating_mul(p.interval_nanos)));
}

/// Keeps the TAT within two capacities of now: empty, plus at most one capacity of debt.
pub(crate) fn cap_debt(tat: &mut Instant, p: TatParams, now: Instant) {
    *tat = (*tat).min(now.add_nanos(p.tolerance_nanos().saturating_mul(2)));
}

/// Returns `hits` to the bucket; it never fills above capacity.
pub(crate) fn refund(tat: &mut Instant, p: TatParams, hits: u64, now: Instant) {
    *tat = (*tat).sub_nanos(hits.saturating_mul(p.interval_nanos)).max(now);
}
