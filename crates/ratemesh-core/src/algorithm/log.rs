//! Sliding window log: every admitted hit is kept with its time until it leaves the window.
//!
//! A hit at `t` counts while `now < t + period`. The log never holds more entries than the limit
//! (each entry costs at least 1, and admitted hits never exceed the limit); hits forced in from
//! other nodes may exceed it, and then the two oldest entries are merged into the later of the two,
//! which keeps every hit counted at least as long as before (conservative).

use std::collections::VecDeque;

use crate::decision::Decision;
use crate::time::Instant;

/// The hits still inside the sliding window, oldest first, and their total cost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Log {
    /// `(time of the hits, their cost)`, times strictly increasing.
    pub hits: VecDeque<(Instant, u64)>,
    /// The sum of the costs in `hits`.
    pub used: u64,
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
            self.used -= cost;
        }
    }

    /// Decides a hit of `cost` at `now`, logging it when it passes.
    pub fn check(&mut self, p: LogParams, cost: u64, now: Instant) -> Decision {
        self.prune(p, now);
        if cost > p.limit {
            return self.decision(p, now).refused_for(None);
        }
        let probe = cost.max(1);
        if self.used.saturating_add(probe) > p.limit {
            let retry = self.retry_after(p, self.used + probe - p.limit, now);
            return self.decision(p, now).refused_for(Some(retry));
        }
        self.push(p, now, cost);
        self.decision(p, now)
    }

    fn decision(&self, p: LogParams, now: Instant) -> Decision {
        let reset = self.hits.back().map_or(0, |&(at, _)| at.add_nanos(p.period_nanos).nanos_since(now));
        Decision::new(true, p.limit, p.limit.saturating_sub(self.used), reset)
    }

    /// Nanoseconds from `now` until at least `needed` cost has left the window.
    fn retry_after(&self, p: LogParams, needed: u64, now: Instant) -> u64 {
        let mut freed = 0u64;
        for &(at, cost) in &self.hits {
            freed = freed.saturating_add(cost);
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
        self.used = self.used.saturating_add(cost);
        match self.hits.back_mut() {
            Some((at, total)) if *at >= now => *total = total.saturating_add(cost),
            _ => self.hits.push_back((now, cost)),
        }
        self.bound(p);
    }

    /// Keeps at most `limit` entries by merging the oldest into its successor (conservative).
    fn bound(&mut self, p: LogParams) {
        let len_max = usize::try_from(p.limit).unwrap_or(usize::MAX).max(1);
        while self.hits.len() > len_max {
            if let Some((_, oldest)) = self.hits.pop_front() {
                if let Some((_, next)) = self.hits.front_mut() {
                    *next = next.saturating_add(oldest);
                }
            }
        }
    }

    /// Applies `hits` unconditionally (admitted elsewhere; the log may exceed the limit).
    pub fn force(&mut self, p: LogParams, hits: u64, now: Instant) {
        self.prune(p, now);
        self.push(p, now, hits);
    }

    /// Returns `hits`, taking them from the newest entries.
    pub fn refund(&mut self, p: LogParams, hits: u64, now: Instant) {
        self.prune(p, now);
        let mut left = hits;
        while left > 0 {
            let Some((_, cost)) = self.hits.back_mut() else { break };
            let taken = left.min(*cost);
            *cost -= taken;
            self.used -= taken;
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
        let (mut suffix_mine, mut suffix_theirs, mut suffix_joined) = (0u64, 0u64, 0u64);
        let mut joined = VecDeque::with_capacity(times.len());
        for &at in times.iter().rev() {
            while let Some(&&(_, c)) = mine.peek().filter(|(t, _)| *t >= at) {
                suffix_mine = suffix_mine.saturating_add(c);
                mine.next();
            }
            while let Some(&&(_, c)) = theirs.peek().filter(|(t, _)| *t >= at) {
                suffix_theirs = suffix_theirs.saturating_add(c);
                theirs.next();
            }
            let suffix = suffix_mine.max(suffix_theirs);
            if suffix > suffix_joined {
                joined.push_front((at, suffix - suffix_joined));
                suffix_joined = suffix;
            }
        }
        self.hits = joined;
        self.used = suffix_joined;
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
            match incoming.hits.back_mut() {
                Some((last, total)) if *last == at => *total = total.saturating_add(cost),
                _ => incoming.hits.push_back((at, cost)),
            }
            incoming.used = incoming.used.saturating_add(cost);
        }
        // Joining into an empty log prunes and applies the length bound.
        let mut log = Log::default();
        log.join(p, incoming, now);
        log
    }
}
