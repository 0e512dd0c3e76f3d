//! Deliberately naive reference models, written from the documented semantics and structured
//! unlike the implementation (which runs token bucket, GCRA and shaper on one theoretical arrival
//! time, both window counters on two counts, and so on).
//!
//! A model only answers two questions about its state: would `k` more hits fit at instant `t`, and
//! is the state at `t` the same as a fresh key's. Every field of a decision is then derived by
//! search, in [`decide`]: `remaining` is the largest `k` that fits now, `retry_after` the first
//! instant at which the request fits, `reset_after` the first instant at which the key is fresh.
//! None of the implementation's closed-form answers is repeated here.

use std::collections::BTreeMap;
use std::time::Duration;

use ratemesh_core::{Algorithm, Decision, LeaseId, LimitSpec};

/// The fields of a decision that a model predicts, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    pub allowed: bool,
    pub remaining: u64,
    pub reset_after: u64,
    pub retry_after: Option<u64>,
    pub delay: u64,
    pub lease: bool,
}

impl Expect {
    /// What the implementation answered.
    pub fn of(decision: &Decision) -> Expect {
        Expect {
            allowed: decision.allowed,
            remaining: decision.remaining,
            reset_after: nanos(decision.reset_after),
            retry_after: decision.retry_after.map(nanos),
            delay: nanos(decision.delay),
            lease: decision.lease.is_some(),
        }
    }
}

/// A duration in nanoseconds (the durations of these tests fit).
pub fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).expect("test durations fit in u64 nanoseconds")
}

/// The nanoseconds of a period.
pub fn period_nanos(spec: &LimitSpec) -> u64 {
    nanos(spec.period)
}

/// A naive model of one key. Instants passed in never go backwards: the caller clamps them, which
/// is the documented meaning of a `now` earlier than one already seen.
pub trait Model {
    /// The costliest request that passes on a fresh key.
    fn capacity(&self) -> u64;
    /// Whether `hits` more hits would pass at `t` if nothing else arrives first.
    fn fits(&self, t: u64, hits: u64) -> bool;
    /// Whether the state at `t` is that of a fresh key, if nothing else arrives first.
    fn is_fresh(&self, t: u64) -> bool;
    /// Counts an admitted request of `cost > 0` at `t` (with the lease it was given); returns the
    /// delay a shaper imposes on it.
    fn take(&mut self, t: u64, cost: u64, lease: Option<LeaseId>) -> u64;
    /// Counts `hits` admitted elsewhere, unconditionally.
    fn force(&mut self, t: u64, hits: u64);
    /// Gives back `hits`.
    fn refund(&mut self, t: u64, hits: u64);
    /// Releases a concurrency lease; whether it was held.
    fn release(&mut self, _t: u64, _id: LeaseId) -> bool {
        false
    }
    /// Whether admitted requests hold a lease (concurrency).
    fn grants_leases(&self) -> bool {
        false
    }
}

/// The model for `spec`, fresh at `start`. Parameters are derived here from the documentation, not
/// taken from [`ratemesh_core::Limit`]: `interval = ceil(period / limit)`, token bucket capacity
/// defaults to `limit`, GCRA burst to 1, shaper burst and delay to 0.
pub fn model_for(spec: &LimitSpec, start: u64) -> Box<dyn Model> {
    let period = period_nanos(spec);
    let limit = spec.limit;
    let interval = i128::from(period.div_ceil(limit));
    match spec.algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter => Box::new(Windows {
            period,
            limit,
            sliding: spec.algorithm == Algorithm::SlidingWindowCounter,
            counts: BTreeMap::new(),
        }),
        Algorithm::SlidingWindowLog => Box::new(Log { period, limit, hits: Vec::new() }),
        Algorithm::TokenBucket => {
            let capacity = spec.burst.unwrap_or(limit);
            Box::new(TokenBucket { interval, capacity, units: i128::from(capacity) * interval, last: start })
        }
        Algorithm::Gcra => {
            let burst = spec.burst.unwrap_or(1);
            let tau = i128::from(burst - 1) * interval;
            Box::new(Gcra { increment: interval, burst, tau, content: 0, lct: start })
        }
        Algorithm::LeakyBucketShaper => Box::new(Shaper {
            interval,
            burst: spec.burst.unwrap_or(0),
            delay: spec.delay.unwrap_or(0),
            state: None,
        }),
        Algorithm::Concurrency => Box::new(Leases { lease_nanos: period, limit, held: Vec::new() }),
        Algorithm::ExpiringCounter => Box::new(Expiring { period, limit, window: None }),
    }
}

/// The decision a model expects for a request of `cost` at `now` (the documented meaning of every
/// field of [`Decision`]), counting it in the model when it passes. `lease` is the lease the
/// implementation handed out, recorded by the concurrency model.
pub fn decide(model: &mut dyn Model, now: u64, cost: u64, lease: Option<LeaseId>) -> Expect {
    if cost > model.capacity() {
        return observe(model, now, false, None);
    }
    let probe = cost.max(1);
    if !model.fits(now, probe) {
        let at =
            first_instant(now, |t| model.fits(t, probe)).expect("a request within capacity passes later");
        return observe(model, now, false, Some(at - now));
    }
    let delay = if cost > 0 { model.take(now, cost, lease) } else { 0 };
    let lease = cost > 0 && model.grants_leases();
    Expect { delay, lease, ..observe(model, now, true, None) }
}

/// Remaining and reset of the model's state at `now`.
fn observe(model: &dyn Model, now: u64, allowed: bool, retry_after: Option<u64>) -> Expect {
    // Not bounded by the capacity: a model that lets a refund overfill would show it here.
    let mut remaining = 0;
    while remaining < model.capacity() + 64 && model.fits(now, remaining + 1) {
        remaining += 1;
    }
    let reset_after = fresh_at(model, now) - now;
    Expect { allowed, remaining, reset_after, retry_after, delay: 0, lease: false }
}

/// The first instant from `now` on at which the model is fresh.
pub fn fresh_at(model: &dyn Model, now: u64) -> u64 {
    first_instant(now, |t| model.is_fresh(t)).expect("every model is fresh again eventually")
}

/// The first instant in `now..=u64::MAX` at which `holds`, for a predicate that stays true once it
/// is (everything here only gets looser as time passes without requests).
pub fn first_instant(now: u64, holds: impl Fn(u64) -> bool) -> Option<u64> {
    if holds(now) {
        return Some(now);
    }
    if !holds(u64::MAX) {
        return None;
    }
    let (mut no, mut yes) = (now, u64::MAX);
    while yes - no > 1 {
        let mid = no + (yes - no) / 2;
        if holds(mid) {
            yes = mid;
        } else {
            no = mid;
        }
    }
    Some(yes)
}

fn since(t: u64, earlier: u64) -> i128 {
    i128::from(t.checked_sub(earlier).expect("model time never goes backwards"))
}

/// Token bucket as an exact integer token counter refilled on read. One token is worth `interval`
/// units so that one nanosecond refills exactly one unit (the documented rounding: one token per
/// `ceil(period / limit)` nanoseconds). Debt (forced hits) is a negative count.
struct TokenBucket {
    interval: i128,
    capacity: u64,
    units: i128,
    last: u64,
}

impl TokenBucket {
    fn full(&self) -> i128 {
        i128::from(self.capacity) * self.interval
    }

    fn units_at(&self, t: u64) -> i128 {
        (self.units + since(t, self.last)).min(self.full())
    }

    fn set(&mut self, t: u64, units: i128) {
        self.units = units;
        self.last = t;
    }
}

impl Model for TokenBucket {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn fits(&self, t: u64, hits: u64) -> bool {
        i128::from(hits) * self.interval <= self.units_at(t)
    }

    fn is_fresh(&self, t: u64) -> bool {
        self.units_at(t) == self.full()
    }

    fn take(&mut self, t: u64, cost: u64, _: Option<LeaseId>) -> u64 {
        self.force(t, cost);
        0
    }

    fn force(&mut self, t: u64, hits: u64) {
        self.set(t, self.units_at(t) - i128::from(hits) * self.interval);
    }

    fn refund(&mut self, t: u64, hits: u64) {
        self.set(t, (self.units_at(t) + i128::from(hits) * self.interval).min(self.full()));
    }
}

/// GCRA as ITU-T I.371's continuous-state leaky bucket: the content drains one unit per nanosecond
/// since the last conformance time; a cell conforms when the drained content is at most the limit
/// `tau = (burst − 1) × increment`, and then adds `increment`. A request of cost `n` is `n` cells
/// back to back, all or none.
struct Gcra {
    increment: i128,
    burst: u64,
    tau: i128,
    content: i128,
    lct: u64,
}

impl Gcra {
    fn drained(&self, t: u64) -> i128 {
        (self.content - since(t, self.lct)).max(0)
    }
}

impl Model for Gcra {
    fn capacity(&self) -> u64 {
        self.burst
    }

    fn fits(&self, t: u64, hits: u64) -> bool {
        // The last of the `hits` cells sees the content the first `hits − 1` left behind.
        hits == 0 || self.drained(t) + i128::from(hits - 1) * self.increment <= self.tau
    }

    fn is_fresh(&self, t: u64) -> bool {
        self.drained(t) == 0
    }

    fn take(&mut self, t: u64, cost: u64, _: Option<LeaseId>) -> u64 {
        self.force(t, cost);
        0
    }

    fn force(&mut self, t: u64, hits: u64) {
        self.content = self.drained(t) + i128::from(hits) * self.increment;
        self.lct = t;
    }

    fn refund(&mut self, t: u64, hits: u64) {
        self.content = (self.drained(t) - i128::from(hits) * self.increment).max(0);
        self.lct = t;
    }
}

/// The leaky bucket as a queue, in nginx `limit_req` arithmetic (`ngx_http_limit_req_lookup`):
/// `excess` is the work queued behind the request in service, in nanoseconds (one request = one
/// `interval`); per request `excess = max(0, excess − elapsed + interval)` (a new key starts at 0);
/// refused when `excess > burst`; delayed by `excess − delay` when positive. A request of cost `n`
/// is `n` such requests back to back, all or none. `None` is a key nginx has no node for, or (after
/// a refund emptied the queue) one equivalent to it.
struct Shaper {
    interval: i128,
    burst: u64,
    delay: u64,
    state: Option<(i128, u64)>,
}

impl Shaper {
    /// nginx's excess for the next request at `t`.
    fn first_excess(&self, t: u64) -> i128 {
        match self.state {
            None => 0,
            Some((excess, last)) => (excess - since(t, last) + self.interval).max(0),
        }
    }

    /// The excess of the last of `hits ≥ 1` requests back to back at `t`.
    fn excess_after(&self, t: u64, hits: u64) -> i128 {
        self.first_excess(t) + i128::from(hits - 1) * self.interval
    }

    /// Work in the queue at `t`, the one in service included.
    fn work(&self, t: u64) -> i128 {
        match self.state {
            None => 0,
            Some((excess, last)) => (excess + self.interval - since(t, last)).max(0),
        }
    }
}

impl Model for Shaper {
    fn capacity(&self) -> u64 {
        // nginx: burst=5 admits 6 back to back.
        self.burst + 1
    }

    fn fits(&self, t: u64, hits: u64) -> bool {
        hits == 0 || self.excess_after(t, hits) <= i128::from(self.burst) * self.interval
    }

    fn is_fresh(&self, t: u64) -> bool {
        self.work(t) == 0
    }

    fn take(&mut self, t: u64, cost: u64, _: Option<LeaseId>) -> u64 {
        let excess = self.excess_after(t, cost);
        self.state = Some((excess, t));
        let delay = (excess - i128::from(self.delay) * self.interval).max(0);
        u64::try_from(delay).expect("delays of these tests fit")
    }

    fn force(&mut self, t: u64, hits: u64) {
        if hits > 0 {
            self.state = Some((self.excess_after(t, hits), t));
        }
    }

    fn refund(&mut self, t: u64, hits: u64) {
        let left = (self.work(t) - i128::from(hits) * self.interval).max(0);
        self.state = if left == 0 { None } else { Some((left - self.interval, t)) };
    }
}

/// Fixed window and sliding window counter: a count per window index `t / period`. The sliding
/// counter uses Cloudflare's formula `prev × (period − elapsed) / period + curr`, multiplied
/// through by `period` so that it stays in integers.
struct Windows {
    period: u64,
    limit: u64,
    sliding: bool,
    counts: BTreeMap<u64, u128>,
}

impl Windows {
    fn count(&self, index: u64) -> u128 {
        self.counts.get(&index).copied().unwrap_or(0)
    }

    fn prev_index(&self, t: u64) -> Option<u64> {
        (t / self.period).checked_sub(1).filter(|_| self.sliding)
    }

    fn usage_times_period(&self, t: u64) -> u128 {
        let period = u128::from(self.period);
        let elapsed = u128::from(t % self.period);
        let curr = self.count(t / self.period);
        let prev = self.prev_index(t).map_or(0, |i| self.count(i));
        prev * (period - elapsed) + curr * period
    }
}

impl Model for Windows {
    fn capacity(&self) -> u64 {
        self.limit
    }

    fn fits(&self, t: u64, hits: u64) -> bool {
        let period = u128::from(self.period);
        self.usage_times_period(t) + u128::from(hits) * period <= u128::from(self.limit) * period
    }

    fn is_fresh(&self, t: u64) -> bool {
        self.count(t / self.period) == 0 && self.prev_index(t).is_none_or(|i| self.count(i) == 0)
    }

    fn take(&mut self, t: u64, cost: u64, _: Option<LeaseId>) -> u64 {
        self.force(t, cost);
        0
    }

    fn force(&mut self, t: u64, hits: u64) {
        *self.counts.entry(t / self.period).or_default() += u128::from(hits);
    }

    fn refund(&mut self, t: u64, hits: u64) {
        // Documented: from the current window first, then from the previous one.
        let mut left = u128::from(hits);
        for index in [Some(t / self.period), (t / self.period).checked_sub(1)].into_iter().flatten() {
            let count = self.counts.entry(index).or_default();
            let taken = left.min(*count);
            *count -= taken;
            left -= taken;
        }
    }
}

/// Sliding window log: every hit is a `(time, cost)` in a plain list that is never pruned and is
/// scanned in full for every question; a hit counts while `t < time + period`.
struct Log {
    period: u64,
    limit: u64,
    hits: Vec<(u64, u128)>,
}

impl Log {
    fn counts_at(&self, hit: &(u64, u128), t: u64) -> bool {
        u128::from(hit.0) + u128::from(self.period) > u128::from(t) && hit.1 > 0
    }

    fn used(&self, t: u64) -> u128 {
        self.hits.iter().filter(|hit| self.counts_at(hit, t)).map(|hit| hit.1).sum()
    }

    /// Documented bound: when hits forced in leave more than `limit` distinct times in the log,
    /// the oldest time's hits are merged into the next (later) time.
    fn bound(&mut self, t: u64) {
        loop {
            let mut times: Vec<u64> =
                self.hits.iter().filter(|hit| self.counts_at(hit, t)).map(|hit| hit.0).collect();
            times.sort_unstable();
            times.dedup();
            if times.len() as u64 <= self.limit {
                return;
            }
            for hit in &mut self.hits {
                if hit.0 == times[0] {
                    hit.0 = times[1];
                }
            }
        }
    }
}

impl Model for Log {
    fn capacity(&self) -> u64 {
        self.limit
    }

    fn fits(&self, t: u64, hits: u64) -> bool {
        self.used(t) + u128::from(hits) <= u128::from(self.limit)
    }

    fn is_fresh(&self, t: u64) -> bool {
        self.used(t) == 0
    }

    fn take(&mut self, t: u64, cost: u64, _: Option<LeaseId>) -> u64 {
        self.force(t, cost);
        0
    }

    fn force(&mut self, t: u64, hits: u64) {
        self.hits.push((t, u128::from(hits)));
        self.bound(t);
    }

    fn refund(&mut self, t: u64, hits: u64) {
        // Documented: taken from the newest hits.
        let mut newest_first: Vec<usize> = (0..self.hits.len()).collect();
        newest_first.sort_by_key(|&i| std::cmp::Reverse(self.hits[i].0));
        let mut left = u128::from(hits);
        for i in newest_first {
            if self.counts_at(&self.hits[i], t) {
                let taken = left.min(self.hits[i].1);
                self.hits[i].1 -= taken;
                left -= taken;
            }
        }
    }
}

/// Expiring counter: `(first hit, count)` of the window running, if any. The window holds its
/// count while `t < first hit + period`; a hit into no window (none, ended, or emptied by
/// refunds) opens a new one at its own time.
struct Expiring {
    period: u64,
    limit: u64,
    window: Option<(u64, u128)>,
}

impl Expiring {
    fn count(&self, t: u64) -> u128 {
        match self.window {
            Some((start, count)) if u128::from(start) + u128::from(self.period) > u128::from(t) => count,
            _ => 0,
        }
    }
}

impl Model for Expiring {
    fn capacity(&self) -> u64 {
        self.limit
    }

    fn fits(&self, t: u64, hits: u64) -> bool {
        self.count(t) + u128::from(hits) <= u128::from(self.limit)
    }

    fn is_fresh(&self, t: u64) -> bool {
        self.count(t) == 0
    }

    fn take(&mut self, t: u64, cost: u64, _: Option<LeaseId>) -> u64 {
        self.force(t, cost);
        0
    }

    fn force(&mut self, t: u64, hits: u64) {
        if hits == 0 {
            return;
        }
        let count = self.count(t);
        self.window = match self.window {
            Some((start, _)) if count > 0 => Some((start, count + u128::from(hits))),
            _ => Some((t, u128::from(hits))),
        };
    }

    fn refund(&mut self, t: u64, hits: u64) {
        let count = self.count(t);
        if let Some((start, _)) = self.window {
            self.window = Some((start, count - count.min(u128::from(hits))));
        }
    }
}

/// Concurrency: a list of `(lease, slots, expiry)`; a lease holds its slots while `t < expiry`.
struct Leases {
    lease_nanos: u64,
    limit: u64,
    held: Vec<(LeaseId, u64, u64)>,
}

impl Leases {
    fn in_use(&self, t: u64) -> u128 {
        self.held.iter().filter(|lease| lease.2 > t).map(|lease| u128::from(lease.1)).sum()
    }
}

impl Model for Leases {
    fn capacity(&self) -> u64 {
        self.limit
    }

    fn fits(&self, t: u64, hits: u64) -> bool {
        self.in_use(t) + u128::from(hits) <= u128::from(self.limit)
    }

    fn is_fresh(&self, t: u64) -> bool {
        self.in_use(t) == 0
    }

    fn take(&mut self, t: u64, cost: u64, lease: Option<LeaseId>) -> u64 {
        // A missing lease is reported by the caller's comparison; any id will do meanwhile.
        let id = lease.unwrap_or(LeaseId(u64::MAX));
        self.held.push((id, cost, t.saturating_add(self.lease_nanos)));
        0
    }

    fn force(&mut self, _: u64, _: u64) {}

    fn refund(&mut self, _: u64, _: u64) {}

    fn release(&mut self, t: u64, id: LeaseId) -> bool {
        match self.held.iter().position(|lease| lease.0 == id && lease.2 > t) {
            Some(i) => {
                self.held.remove(i);
                true
            }
            None => false,
        }
    }

    fn grants_leases(&self) -> bool {
        true
    }
}
