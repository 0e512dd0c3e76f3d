//! Calendar-aligned fixed windows: at most `limit` hits per calendar window (a minute, an hour,
//! a day, a week or a month, in some time zone). The driver computes the window a check falls in
//! from the wall clock and passes it in the limit ([`crate::CalendarWindow`]); the core only
//! counts, and never does calendar arithmetic. Windows have any length (28 to 31 days, 23 or 25
//! hours across a DST change).
//!
//! The state is the window counted in (`start`, `end`) and its count. The limit's window moves
//! it forward, never back (see [`crate::CalendarWindow`] for the rules at a boundary). When the
//! state's window is over and no newer window is known yet (only stale limits came since), the
//! count starts again at zero in a window that begins where the old one ended and whose end is
//! unknown (`Instant::MAX`) until a limit names it.

use crate::decision::Decision;
use crate::time::Instant;

/// The window a calendar limit believes current.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CalendarParams {
    pub limit: u64,
    pub start: Instant,
    pub end: Instant,
}

/// The window counted in and its count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Calendar {
    pub start: Instant,
    pub end: Instant,
    pub curr: u64,
}

impl Calendar {
    /// A fresh count in the window the limit names for `now`.
    pub fn fresh(p: CalendarParams, now: Instant) -> Calendar {
        let mut fresh = if now < p.start {
            // The caller's clock is ahead: the current window ends where its window begins.
            Calendar { start: now, end: p.start, curr: 0 }
        } else {
            Calendar { start: p.start, end: p.end, curr: 0 }
        };
        fresh.advance(p, now);
        fresh
    }

    /// Moves the state to the window of `now`, as far as the state and the limit tell.
    pub fn advance(&mut self, p: CalendarParams, now: Instant) {
        if now >= self.end {
            *self = Calendar { start: self.end, end: Instant::MAX, curr: 0 };
        }
        if now < p.start {
            // A window that has not begun on this clock: it tells only where the current ends.
            self.end = self.end.min(p.start);
        } else if now < p.end {
            if p.start > self.start {
                *self = Calendar { start: p.start, end: p.end, curr: 0 };
            } else if p.start == self.start {
                self.end = p.end;
            }
        } else if p.end > self.start {
            // The limit's window is over too: the current one begins at its end at the latest.
            *self = Calendar { start: p.end, end: Instant::MAX, curr: 0 };
        }
    }

    fn remaining(&self, p: CalendarParams) -> u64 {
        p.limit.saturating_sub(self.curr)
    }

    /// Nanoseconds until nothing is counted any more (the window's end; 0 when nothing is).
    fn reset_after(&self, now: Instant) -> u64 {
        if self.curr == 0 { 0 } else { self.end.nanos_since(now) }
    }

    fn decision(&self, p: CalendarParams, now: Instant) -> Decision {
        Decision::new(true, p.limit, self.remaining(p), self.reset_after(now))
    }

    /// Decides a hit of `cost` at `now` (already advanced), counting it when it passes.
    pub fn check(&mut self, p: CalendarParams, cost: u64, now: Instant) -> Decision {
        if cost > p.limit {
            return self.decision(p, now).refused_for(None);
        }
        if u128::from(self.curr) + u128::from(cost.max(1)) > u128::from(p.limit) {
            // The next window starts afresh: the same request passes at this window's end.
            return self.decision(p, now).refused_for(Some(self.end.nanos_since(now)));
        }
        self.curr += cost;
        self.decision(p, now)
    }

    /// Applies `hits` unconditionally (admitted elsewhere).
    pub fn force(&mut self, hits: u64) {
        self.curr = self.curr.saturating_add(hits);
    }

    /// Counts at least `hits` in the current window.
    pub fn hold(&mut self, hits: u64) {
        self.curr = self.curr.max(hits);
    }

    /// Returns `hits` to the current window.
    pub fn refund(&mut self, hits: u64) {
        self.curr = self.curr.saturating_sub(hits);
    }

    /// The instant after which this state is the same as a fresh one.
    pub fn fresh_at(&self, now: Instant) -> Instant {
        now.add_nanos(self.reset_after(now))
    }

    /// Joins `other` into `self` (both advanced to `now`): the later window wins; in the same
    /// window, the larger count and the later end (counts held the longer). Commutative,
    /// associative and idempotent. Two states in different windows are two clocks on either side
    /// of a boundary: the later window is the one the cluster moves to (at most the clocks' skew
    /// early, see [`crate::CalendarWindow`]).
    pub fn join(&mut self, other: Calendar) {
        if other.start > self.start {
            *self = other;
        } else if other.start == self.start {
            self.end = self.end.max(other.end);
            self.curr = self.curr.max(other.curr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000_000_000;

    fn at(minutes: u64, nanos: u64) -> Instant {
        Instant::from_nanos(minutes * MINUTE + nanos)
    }

    /// The limit of 3 per window for the window `[start, end)` in minutes.
    fn window(start: u64, end: u64) -> CalendarParams {
        CalendarParams { limit: 3, start: at(start, 0), end: at(end, 0) }
    }

    #[test]
    fn counts_per_window_and_resets_at_the_boundary_it_was_told() {
        let p = window(10, 12);
        let mut state = Calendar::fresh(p, at(10, 5));
        for _ in 0..3 {
            assert!(state.check(p, 1, at(10, 5)).allowed);
        }
        let refused = state.check(p, 1, at(11, 0));
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Some(core::time::Duration::from_secs(60)), "until 12:00");
        assert_eq!(refused.reset_after, core::time::Duration::from_secs(60));
        // The next window, named by the limit, starts afresh.
        let next = window(12, 15);
        state.advance(next, at(12, 0));
        assert_eq!(state.check(next, 1, at(12, 0)).remaining, 2);
        assert_eq!(state.end, at(15, 0));
    }

    #[test]
    fn a_stale_limit_never_moves_the_window_back_nor_keeps_an_ended_one() {
        let (old, new) = (window(10, 12), window(12, 15));
        let mut state = Calendar::fresh(new, at(13, 0));
        state.check(new, 2, at(13, 0));
        // A report or replica still carrying the old window: counted in the current one.
        state.advance(old, at(13, 1));
        state.force(1);
        assert_eq!((state.start, state.end, state.curr), (at(12, 0), at(15, 0), 3));
        // Past the state's end with only the old limit known: the count starts again at zero
        // in a window of unknown end, which the next limit naming it completes.
        state.advance(old, at(15, 1));
        assert_eq!((state.start, state.end, state.curr), (at(15, 0), Instant::MAX, 0));
        state.force(2);
        state.advance(window(15, 20), at(16, 0));
        assert_eq!((state.start, state.end, state.curr), (at(15, 0), at(20, 0), 2));
    }

    #[test]
    fn a_window_that_has_not_begun_here_does_not_open_early() {
        // The owner's clock is a second behind the follower that forwarded the check.
        let (current, next) = (window(10, 12), window(12, 15));
        let mut state = Calendar::fresh(current, at(11, 0));
        state.check(current, 3, at(11, 0));
        let owner_now = at(12, 0).sub_nanos(1_000_000_000);
        state.advance(next, owner_now);
        assert!(!state.check(next, 1, owner_now).allowed, "still the full window at the owner");
        // A fresh key at the owner: the window it is in ends where the named one begins.
        let fresh = Calendar::fresh(next, owner_now);
        assert_eq!(fresh.end, at(12, 0));
        // Once the owner's clock passes the boundary, the next window opens.
        state.advance(next, at(12, 0));
        assert!(state.check(next, 1, at(12, 0)).allowed);
    }

    #[test]
    fn join_is_a_semilattice_that_follows_the_later_window() {
        let states = [
            Calendar { start: at(10, 0), end: at(12, 0), curr: 2 },
            Calendar { start: at(10, 0), end: at(12, 5), curr: 1 },
            Calendar { start: at(12, 0), end: at(15, 0), curr: 0 },
            Calendar { start: at(12, 0), end: Instant::MAX, curr: 3 },
        ];
        let join = |a: &Calendar, b: &Calendar| {
            let mut a = a.clone();
            a.join(b.clone());
            a
        };
        for a in &states {
            assert_eq!(join(a, a), *a, "idempotent");
            for b in &states {
                assert_eq!(join(a, b), join(b, a), "commutative");
                for c in &states {
                    assert_eq!(join(&join(a, b), c), join(a, &join(b, c)), "associative");
                }
            }
        }
        assert_eq!(join(&states[0], &states[1]), Calendar { start: at(10, 0), end: at(12, 5), curr: 2 });
        assert_eq!(join(&states[0], &states[2]), states[2]);
    }
}
