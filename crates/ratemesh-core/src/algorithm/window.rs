//! Fixed window counter and sliding window counter: two counts on a grid of windows.
//!
//! The grid starts at a multiple of the period on the node's clock for a fresh key, and moves with
//! the state when state is imported from another node (the owner's grid wins). The fixed window
//! counts only the current window; the sliding counter adds the previous window's count weighted
//! by the part of it still inside the sliding window (Cloudflare's approximation).
//!
//! The expiring counter (`expiring_counter`, Redis `INCR` + `EXPIRE`) uses the same state
//! without a grid: its window starts at the first hit counted into an empty counter and ends
//! `period` later, when the count drops to zero; the next hit starts the next window. A counter
//! at zero has no window (its `start` means nothing), and `prev` stays zero.

use crate::decision::Decision;
use crate::time::Instant;

/// The state of a windowed counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    /// Start of the current window.
    pub start: Instant,
    /// Hits counted in the previous window.
    pub prev: u64,
    /// Hits counted in the current window.
    pub curr: u64,
}

/// Parameters of a windowed limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct WindowParams {
    pub period_nanos: u64,
    pub limit: u64,
    pub sliding: bool,
    /// Expiring counter: the window starts at the first hit, not on a grid (never `sliding`).
    pub expiring: bool,
}

impl Window {
    /// A fresh window grid aligned to a multiple of the period.
    pub fn fresh(p: WindowParams, now: Instant) -> Window {
        if p.expiring {
            return Window { start: now, prev: 0, curr: 0 };
        }
        let start = Instant::from_nanos(now.as_nanos() - now.as_nanos() % p.period_nanos);
        Window { start, prev: 0, curr: 0 }
    }

    /// Moves the grid forward so that `now` lies in the current window.
    pub fn roll(&mut self, p: WindowParams, now: Instant) {
        if p.expiring {
            if self.curr != 0 && now.nanos_since(self.start) >= p.period_nanos {
                self.curr = 0;
            }
            self.prev = 0;
            return;
        }
        let windows = now.nanos_since(self.start) / p.period_nanos;
        if windows == 0 {
            return;
        }
        self.prev = if windows == 1 { self.curr } else { 0 };
        self.curr = 0;
        self.start = self.start.add_nanos(windows.saturating_mul(p.period_nanos));
    }

    /// Usage × period: the weighted count scaled by the period, so that it stays an integer.
    fn scaled_usage(&self, p: WindowParams, curr: u128, now: Instant) -> u128 {
        let curr_scaled = curr * u128::from(p.period_nanos);
        if !p.sliding {
            return curr_scaled;
        }
        let prev_weight = p.period_nanos - now.nanos_since(self.start);
        u128::from(self.prev) * u128::from(prev_weight) + curr_scaled
    }

    fn remaining(&self, p: WindowParams, now: Instant) -> u64 {
        let allowed = u128::from(p.limit) * u128::from(p.period_nanos);
        let left = allowed.saturating_sub(self.scaled_usage(p, u128::from(self.curr), now));
        u64::try_from(left / u128::from(p.period_nanos)).unwrap_or(u64::MAX)
    }

    /// Nanoseconds until nothing is counted any more.
    fn reset_after(&self, p: WindowParams, now: Instant) -> u64 {
        let window_end = self.start.add_nanos(p.period_nanos).nanos_since(now);
        match (self.curr, self.prev) {
            (0, 0) => 0,
            (0, _) if p.sliding => window_end,
            (0, _) => 0,
            _ if p.sliding => window_end.saturating_add(p.period_nanos),
            _ => window_end,
        }
    }

    /// Decides a hit of `cost` at `now` (already rolled), counting it when it passes.
    pub fn check(&mut self, p: WindowParams, cost: u64, now: Instant) -> Decision {
        self.roll(p, now);
        if cost > p.limit {
            return self.decision(p, now).refused_for(None);
        }
        let probe = cost.max(1);
        let allowed = u128::from(p.limit) * u128::from(p.period_nanos);
        // Not saturating: with a limit near u64::MAX, a saturated sum would pass and overflow.
        if self.scaled_usage(p, u128::from(self.curr) + u128::from(probe), now) > allowed {
            let retry = self.retry_after(p, probe, now);
            return self.decision(p, now).refused_for(Some(retry));
        }
        self.start_counting(p, cost, now);
        self.curr += cost;
        self.decision(p, now)
    }

    /// Expiring counter: the first hit counted into an empty counter starts its window.
    fn start_counting(&mut self, p: WindowParams, hits: u64, now: Instant) {
        if p.expiring && self.curr == 0 && hits > 0 {
            self.start = now;
        }
    }

    fn decision(&self, p: WindowParams, now: Instant) -> Decision {
        let (remaining, reset) = (self.remaining(p, now), self.reset_after(p, now));
        Decision::new(true, p.limit, remaining, reset)
    }

    /// The first instant at which `cost` would pass, as nanoseconds from `now`.
    fn retry_after(&self, p: WindowParams, cost: u64, now: Instant) -> u64 {
        let period = p.period_nanos;
        let window_end = self.start.add_nanos(period);
        if p.sliding && self.curr.checked_add(cost).is_some_and(|n| n <= p.limit) {
            // Within this window, wait until the previous window's weight has shrunk enough.
            let at = self.start.add_nanos(first_offset(period, self.prev, p.limit - self.curr - cost));
            if at < window_end {
                return at.nanos_since(now);
            }
        }
        if !p.sliding {
            return window_end.nanos_since(now);
        }
        // In the next window the current count becomes the previous one.
        window_end.add_nanos(first_offset(period, self.curr, p.limit - cost)).nanos_since(now)
    }

    /// Applies `hits` unconditionally (admitted elsewhere; the window may exceed the limit).
    pub fn force(&mut self, p: WindowParams, hits: u64, now: Instant) {
        self.roll(p, now);
        self.start_counting(p, hits, now);
        self.curr = self.curr.saturating_add(hits);
    }

    /// Counts at least `hits` in the current window (see [`super::Bucket::hold`]).
    pub fn hold(&mut self, p: WindowParams, hits: u64, now: Instant) {
        self.roll(p, now);
        self.start_counting(p, hits, now);
        self.curr = self.curr.max(hits);
    }

    /// Returns `hits`: from the current window first, then from the previous one.
    pub fn refund(&mut self, p: WindowParams, hits: u64, now: Instant) {
        self.roll(p, now);
        let from_curr = hits.min(self.curr);
        self.curr -= from_curr;
        self.prev = self.prev.saturating_sub(hits - from_curr);
    }

    /// Nanoseconds from `now` until the current window ends; for an empty (or expired) expiring
    /// counter, the end of the window a hit now would start.
    pub fn end_nanos(&self, p: WindowParams, now: Instant) -> u64 {
        if p.expiring {
            let end = self.start.add_nanos(p.period_nanos);
            return if self.curr == 0 || end <= now { p.period_nanos } else { end.nanos_since(now) };
        }
        let windows = now.nanos_since(self.start) / p.period_nanos.max(1);
        let end = self.start.add_nanos((windows + 1).saturating_mul(p.period_nanos));
        end.nanos_since(now)
    }

    /// Whether nothing is counted at `now` (no window running, for an expiring counter).
    pub fn is_empty(&self, p: WindowParams, now: Instant) -> bool {
        let mut rolled = self.clone();
        rolled.roll(p, now);
        rolled.curr == 0 && rolled.prev == 0
    }

    /// The instant after which this state is the same as a fresh one.
    pub fn fresh_at(&self, p: WindowParams, now: Instant) -> Instant {
        now.add_nanos(self.reset_after(p, now))
    }

    /// Joins `other` into `self` (both at `now`): the later grid, the larger counts. The result
    /// counts every hit at least as long as either input does.
    ///
    /// Expiring counter: an empty side takes the other's window (an empty counter has none);
    /// two counting sides keep the later start and the larger count, which counts the larger
    /// count at least as long as either side does. Both empty: the later start.
    pub fn join(&mut self, p: WindowParams, mut other: Window, now: Instant) {
        self.roll(p, now);
        other.roll(p, now);
        if p.expiring && (self.curr == 0) != (other.curr == 0) {
            if self.curr == 0 {
                *self = other;
            }
            return;
        }
        self.start = self.start.max(other.start);
        self.prev = self.prev.max(other.prev);
        self.curr = self.curr.max(other.curr);
    }
}

/// The smallest offset `e` into a window with `0 <= e <= period` such that the previous window's
/// `prev` hits, weighted by `(period − e) / period`, leave room for `room` hits.
fn first_offset(period: u64, prev: u64, room: u64) -> u64 {
    if prev == 0 {
        return 0;
    }
    // prev × (period − e) ≤ room × period  ⇔  e ≥ period − ⌊room × period / prev⌋.
    let free = u128::from(room) * u128::from(period) / u128::from(prev);
    period.saturating_sub(u64::try_from(free).unwrap_or(u64::MAX))
}
