//! Sliding window log: every admitted hit is kept with its time until it leaves the window.
//!
//! A hit at `t` counts while `now < t + period`; an entry is a time and the cost of the hits at
//! that time. The log never holds more entries than the limit (each entry costs at least 1, and
//! admitted hits never exceed the limit) nor than [`SLIDING_LOG_ENTRIES_MAX`] (so a log's memory
//! is bounded whatever its limit): past either bound (hits forced in from other nodes, or more
//! distinct hit times in a window than the entry bound) the oldest entry is merged into its
//! successor, which keeps every hit counted at least as long as before (conservative: a log past
//! the entry bound may refuse a little early, never late).
//!
//! Memory: a log takes [`LOG_ENTRY_BYTES`] per entry its buffer has room for (pruning gives room
//! back once the buffer is four times larger than needed). The store bounds all logs of a node
//! together (`StoreConfig::log_bytes_max`): under that bound a log that grows is coarsened
//! ([`Log::coarsen`]: the same merging, down to half its entries), which may refuse a little
//! earlier than an exact log would, never later.

use crate::prelude::*;
use alloc::collections::VecDeque;

use crate::decision::Decision;
use crate::limit::SLIDING_LOG_ENTRIES_MAX;
use crate::time::Instant;

/// The bytes of one log entry: a time and a cost.
pub(crate) const LOG_ENTRY_BYTES: usize = core::mem::size_of::<(Instant, u64)>();

/// The hits still inside the sliding window, oldest first, and their total cost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Log {
    /// `(time of the hits, their cost)`, times strictly increasing.
    pub hits: VecDeque<(Instant, u64)>,
    /// The sum of the costs in `hits`. Wider than a cost: hits forced in from other nodes can sum
    /// past `u64::MAX`, and an undercount would free them early.
    pub used: u128,
}

/// Parameters of a sliding window log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LogParams {
    pub period_nanos: u64,
    pub limit: u64,
}

impl Log {
    /// Drops the hits that have left the window at `now`.
    fn prune(&mut self, p: LogParams, now: Instant) {
        while let Some(&(at, cost)) = self.hits.front() {
            if at.add_nanos(p.period_nanos) > now {
                break;
            }
            self.hits.pop_front();
            self.used -= u128::from(cost);
        }
        // A log that was long once keeps its buffer: give most of it back.
        if self.hits.capacity() > 4 * self.hits.len() + 8 {
            self.hits.shrink_to(2 * self.hits.len());
        }
    }

    /// Decides a hit of `cost` at `now`, logging it when it passes.
    pub fn check(&mut self, p: LogParams, cost: u64, now: Instant) -> Decision {
        self.prune(p, now);
        if cost > p.limit {
            return self.decision(p, now).refused_for(None);
        }
        let probe = u128::from(cost.max(1));
        if self.used + probe > u128::from(p.limit) {
            let retry = self.retry_after(p, self.used + probe - u128::from(p.limit), now);
            return self.decision(p, now).refused_for(Some(retry));
        }
        self.push(p, now, cost);
        self.decision(p, now)
    }

    fn decision(&self, p: LogParams, now: Instant) -> Decision {
        let reset = self.hits.back().map_or(0, |&(at, _)| at.add_nanos(p.period_nanos).nanos_since(now));
        let remaining = u128::from(p.limit).saturating_sub(self.used);
        Decision::new(true, p.limit, u64::try_from(remaining).unwrap_or(0), reset)
    }

    /// Nanoseconds from `now` until at least `needed` cost has left the window.
    fn retry_after(&self, p: LogParams, needed: u128, now: Instant) -> u64 {
        let mut freed = 0u128;
        for &(at, cost) in &self.hits {
            freed += u128::from(cost);
            if freed >= needed {
                return at.add_nanos(p.period_nanos).nanos_since(now);
            }
        }
        // Unreachable for a consistent log (`used` is the sum of the costs); a safe answer anyway.
        self.hits.back().map_or(0, |&(at, _)| at.add_nanos(p.period_nanos).nanos_since(now))
    }

    /// Appends `cost` at `now` (the latest time in the log), keeping the length bound.
    fn push(&mut self, p: LogParams, now: Instant, cost: u64) {
        if cost == 0 {
            return;
        }
        self.append(now, cost);
        self.bound(p);
    }

    /// Appends `cost` at `at` (no earlier than the newest entry, into which it merges when at the
    /// same time), keeping `used` the sum of the entries. An entry saturates at `u64::MAX`, which
    /// refuses everything while it lasts anyway (limits are far smaller).
    fn append(&mut self, at: Instant, cost: u64) {
        match self.hits.back_mut() {
            Some((last, total)) if *last >= at => {
                let merged = total.saturating_add(cost);
                self.used += u128::from(merged - *total);
                *total = merged;
            }
            _ => {
                self.hits.push_back((at, cost));
                self.used += u128::from(cost);
            }
        }
    }

    /// Keeps at most `limit` entries, and at most [`SLIDING_LOG_ENTRIES_MAX`], by merging the
    /// oldest into its successor (conservative).
    fn bound(&mut self, p: LogParams) {
        self.merge_to(usize::try_from(p.limit.min(SLIDING_LOG_ENTRIES_MAX)).unwrap_or(usize::MAX));
    }

    /// Entries the log's buffer has room for: its memory, in [`LOG_ENTRY_BYTES`].
    pub fn capacity(&self) -> usize {
        self.hits.capacity()
    }

    /// Halves the log by merging each oldest entry into its successor (every hit stays counted
    /// at least as long), and shrinks its buffer to fit. False when it cannot shrink any more
    /// (one entry left, and no spare room).
    pub fn coarsen(&mut self) -> bool {
        let before = self.hits.capacity();
        self.merge_to(self.hits.len() / 2);
        self.hits.shrink_to_fit();
        self.hits.capacity() < before
    }

    /// Keeps at most `len_max` entries (at least one) by merging the oldest into its successor.
    fn merge_to(&mut self, len_max: usize) {
        let len_max = len_max.max(1);
        while self.hits.len() > len_max {
            if let Some((_, oldest)) = self.hits.pop_front() {
                self.used -= u128::from(oldest);
                if let Some((_, next)) = self.hits.front_mut() {
                    let merged = next.saturating_add(oldest);
                    self.used += u128::from(merged - *next);
                    *next = merged;
                }
            }
        }
    }

    /// Applies `hits` unconditionally (admitted elsewhere; the log may exceed the limit).
    pub fn force(&mut self, p: LogParams, hits: u64, now: Instant) {
        self.prune(p, now);
        self.push(p, now, hits);
    }

    /// Keeps at least `hits` in the window, adding the shortfall at `now` (see
    /// [`super::Bucket::hold`]).
    pub fn hold(&mut self, p: LogParams, hits: u64, now: Instant) {
        self.prune(p, now);
        let shortfall = u128::from(hits).saturating_sub(self.used);
        self.push(p, now, u64::try_from(shortfall).unwrap_or(u64::MAX));
    }

    /// Returns `hits`, taking them from the newest entries.
    pub fn refund(&mut self, p: LogParams, hits: u64, now: Instant) {
        self.prune(p, now);
        let mut left = hits;
        while left > 0 {
            let Some((_, cost)) = self.hits.back_mut() else { break };
            let taken = left.min(*cost);
            *cost -= taken;
            self.used -= u128::from(taken);
            left -= taken;
            if *cost == 0 {
                self.hits.pop_back();
            }
        }
    }

    /// The instant after which the log is empty.
    pub fn fresh_at(&self, p: LogParams) -> Instant {
        self.hits.back().map_or(Instant::ZERO, |&(at, _)| at.add_nanos(p.period_nanos))
    }

    /// Joins `other` into `self` at `now`: at every future instant the result counts as much as the
    /// larger of the two inputs (the pointwise maximum of their "still counted" functions).
    pub fn join(&mut self, p: LogParams, mut other: Log, now: Instant) {
        self.prune(p, now);
        other.prune(p, now);
        let mut times: Vec<Instant> = self.hits.iter().chain(&other.hits).map(|&(at, _)| at).collect();
        times.sort_unstable();
        times.dedup();
        // Walk from the newest time down; at each time the amount still counted at or after it is
        // the suffix sum of each log; the join keeps the larger suffix.
        let (mut mine, mut theirs) = (self.hits.iter().rev().peekable(), other.hits.iter().rev().peekable());
        let (mut suffix_mine, mut suffix_theirs, mut suffix_joined) = (0u128, 0u128, 0u128);
        let mut joined = VecDeque::with_capacity(times.len());
        for &at in times.iter().rev() {
            while let Some(&&(_, c)) = mine.peek().filter(|(t, _)| *t >= at) {
                suffix_mine += u128::from(c);
                mine.next();
            }
            while let Some(&&(_, c)) = theirs.peek().filter(|(t, _)| *t >= at) {
                suffix_theirs += u128::from(c);
                theirs.next();
            }
            let suffix = suffix_mine.max(suffix_theirs);
            if suffix > suffix_joined {
                // At most the larger of the two entries at `at`: it fits a cost.
                joined.push_front((at, u64::try_from(suffix - suffix_joined).unwrap_or(u64::MAX)));
                suffix_joined = suffix;
            }
        }
        self.used = joined.iter().map(|&(_, cost)| u128::from(cost)).sum();
        self.hits = joined;
        self.bound(p);
    }

    /// A log from `(age, cost)` pairs in any order (from another node), bounded and pruned like a
    /// local one.
    pub fn from_ages(p: LogParams, hits: Vec<(u64, u64)>, now: Instant) -> Log {
        let mut timed: Vec<(Instant, u64)> = hits
            .into_iter()
            .filter(|&(_, cost)| cost > 0)
            .map(|(age, cost)| (now.sub_nanos(age), cost))
            .collect();
        timed.sort_unstable();
        let mut incoming = Log::default();
        for (at, cost) in timed {
            incoming.append(at, cost);
        }
        // Joining into an empty log prunes and applies the length bound.
        let mut log = Log::default();
        log.join(p, incoming, now);
        log
    }
}
