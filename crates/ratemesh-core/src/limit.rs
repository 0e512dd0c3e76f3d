//! What a limit is: the algorithm and its parameters, validated once.
//!
//! A [`LimitSpec`] is what a user writes (policy file, HTTP body, builder). [`Limit::new`] checks it
//! and precomputes what the hot path needs, so that a decision is integer arithmetic only.

use core::fmt;
use core::time::Duration;

use crate::algorithm::{CalendarParams, LeaseParams, LogParams, TatParams, WindowParams};
use crate::time::{Instant, duration_nanos};

/// The limiting algorithms of ratemesh. See ARCHITECTURE.md for the semantics of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// At most `limit` hits in each window of `period`, windows aligned to a fixed grid. Admits up to
    /// 2 × `limit` across a window edge.
    FixedWindow,
    /// At most `limit` hits in any interval of length `period`, kept as a log of hits (at most
    /// [`SLIDING_LOG_ENTRIES_MAX`] entries of a time and a cost per key).
    SlidingWindowLog,
    /// The previous window's count weighted by its overlap with the sliding window, plus the current
    /// window's count, must stay within `limit` (Cloudflare's approximation).
    SlidingWindowCounter,
    /// Capacity `burst` (default `limit`) refilled at `limit` per `period`.
    TokenBucket,
    /// Leaky bucket as a meter (GCRA, one theoretical arrival time per key): `limit` per `period`
    /// with `burst` hits (default 1, i.e. no burst) allowed at once.
    Gcra,
    /// Leaky bucket as a queue (a shaper, like nginx `limit_req`): drains at `limit` per `period`;
    /// up to `burst` hits wait in the queue and are admitted with a delay, the first `delay` of them
    /// without one; past the queue bound a hit is refused.
    LeakyBucketShaper,
    /// At most `limit` leases held at once; a lease not released expires after `period`.
    Concurrency,
    /// A counter with an expiry, like Redis `INCR` + `EXPIRE`: at most `limit` hits in a window
    /// of `period` that starts at the first hit counted into an empty counter (not on a grid) and
    /// after which the count is zero; the next hit starts the next window.
    ExpiringCounter,
}

impl Algorithm {
    /// Every algorithm, in declaration order.
    pub const ALL: [Algorithm; 8] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucketShaper,
        Algorithm::Concurrency,
        Algorithm::ExpiringCounter,
    ];

    /// The name used in configuration and APIs (`token_bucket`, `gcra`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::LeakyBucketShaper => "leaky_bucket",
            Algorithm::Concurrency => "concurrency",
            Algorithm::ExpiringCounter => "expiring_counter",
        }
    }

    /// The algorithm with this configuration name, if any.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// A limit as a user states it, before validation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LimitSpec {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Hits per `period` (for [`Algorithm::Concurrency`]: leases held at once).
    pub limit: u64,
    /// The window, or the refill period (for [`Algorithm::Concurrency`]: the lease lifetime).
    pub period: Duration,
    /// Token bucket capacity; GCRA burst; shaper queue length. `None` takes the algorithm's default.
    pub burst: Option<u64>,
    /// Shaper only: how many queued hits pass without delay (nginx `delay=`). Default 0.
    pub delay: Option<u64>,
    /// Fixed window only: the calendar window this check falls in (a day in Europe/Berlin, a
    /// month in UTC), instead of a grid of `period`-long windows. `period` is then the window's
    /// length. See [`CalendarWindow`].
    pub calendar: Option<CalendarWindow>,
}

/// One window of a calendar-aligned fixed window, computed by the driver from the wall clock
/// (the core does no calendar or time-zone arithmetic). The bounds are instants of the driver's
/// clock, which for calendar limits must run on Unix time (nanoseconds since 1970, advancing
/// monotonically): every node then names the same window with the same numbers, and a forwarded
/// check or a report carries its window to the owner as is.
///
/// A limit carries the window its caller believes current; the bucket keeps the window it
/// counts in. Windows only move forward: a newer window that has begun on this node's clock
/// starts a fresh count, an older one (a stale limit, a clock behind) is counted in the
/// bucket's current window, and a window that has not begun yet on this node's clock (the
/// caller's clock is ahead) only tells where the current window ends. So at a boundary the owner's
/// clock decides: a follower ahead of it cannot open the next window early at the owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CalendarWindow {
    /// The window's first instant.
    pub start: Instant,
    /// The instant after its last (the next window's start).
    pub end: Instant,
}

impl LimitSpec {
    /// A spec with no `burst` or `delay`: every algorithm takes its defaults.
    pub fn new(algorithm: Algorithm, limit: u64, period: Duration) -> LimitSpec {
        LimitSpec { algorithm, limit, period, burst: None, delay: None, calendar: None }
    }

    /// A fixed window of `limit` hits in the calendar window `window` (its length is the period).
    pub fn calendar(limit: u64, window: CalendarWindow) -> LimitSpec {
        let period = Duration::from_nanos(window.end.nanos_since(window.start));
        LimitSpec { calendar: Some(window), ..LimitSpec::new(Algorithm::FixedWindow, limit, period) }
    }

    /// The same spec with `burst` set.
    #[must_use]
    pub fn with_burst(mut self, burst: u64) -> LimitSpec {
        self.burst = Some(burst);
        self
    }

    /// The same spec with the shaper's `delay` set.
    #[must_use]
    pub fn with_delay(mut self, delay: u64) -> LimitSpec {
        self.delay = Some(delay);
        self
    }
}

/// The parameter of a [`LimitSpec`] that a [`LimitError`] is about, so that a driver can name the
/// field its users wrote (`period_ms`, a TOML line) without reading the error's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitParameter {
    /// `limit`: hits per period (or leases).
    Limit,
    /// `period`: the window, refill period or lease lifetime.
    Period,
    /// `burst`: the bucket's capacity (token bucket, GCRA) or the shaper's queue.
    Burst,
    /// `delay`: the shaper's hits admitted without waiting.
    Delay,
    /// `calendar`: the calendar window of a fixed window.
    Window,
}

impl LimitParameter {
    /// The parameter's name in [`LimitSpec`].
    pub fn name(self) -> &'static str {
        match self {
            LimitParameter::Limit => "limit",
            LimitParameter::Period => "period",
            LimitParameter::Burst => "burst",
            LimitParameter::Delay => "delay",
            LimitParameter::Window => "window",
        }
    }
}

impl fmt::Display for LimitParameter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a [`LimitSpec`] is not a valid limit. Caused by the caller's input; nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// `limit` is zero.
    #[error("limit must be at least 1")]
    ZeroLimit,
    /// `period` is zero.
    #[error("period must be longer than zero")]
    ZeroPeriod,
    /// `burst` is zero where a capacity of zero would refuse everything.
    #[error("burst must be at least 1 for {}", .0.name())]
    ZeroBurst(Algorithm),
    /// A parameter was given to an algorithm that has no use for it.
    #[error("{parameter} does not apply to {}", .algorithm.name())]
    NotApplicable {
        /// The parameter.
        parameter: LimitParameter,
        /// The algorithm.
        algorithm: Algorithm,
    },
    /// `delay` is larger than the shaper's `burst`.
    #[error("delay ({delay}) must not exceed burst ({burst})")]
    DelayAboveBurst {
        /// The delay given.
        delay: u64,
        /// The burst in force.
        burst: u64,
    },
    /// The rate is above one hit per nanosecond, the resolution of the clock.
    #[error("rate above one hit per nanosecond ({limit} per {period_nanos} ns)")]
    RateTooHigh {
        /// Hits per period.
        limit: u64,
        /// The period in nanoseconds.
        period_nanos: u64,
    },
    /// A calendar window on a limit that is not a fixed window, or whose bounds do not match
    /// its period (`end − start`).
    #[error("calendar window: {0}")]
    Calendar(&'static str),
    /// A value so large that the state it implies cannot be represented.
    #[error("{parameter} is too large (at most {max})")]
    TooLarge {
        /// The parameter.
        parameter: LimitParameter,
        /// The largest accepted value (for the period: in nanoseconds).
        max: u64,
    },
}

impl LimitError {
    /// The parameter the error is about.
    pub fn parameter(&self) -> LimitParameter {
        match self {
            LimitError::ZeroLimit | LimitError::RateTooHigh { .. } => LimitParameter::Limit,
            LimitError::ZeroPeriod => LimitParameter::Period,
            LimitError::ZeroBurst(_) => LimitParameter::Burst,
            LimitError::DelayAboveBurst { .. } => LimitParameter::Delay,
            LimitError::Calendar(_) => LimitParameter::Window,
            LimitError::NotApplicable { parameter, .. } | LimitError::TooLarge { parameter, .. } => {
                *parameter
            }
        }
    }
}

/// The most entries a sliding window log keeps per key, whatever its limit: an entry is a time
/// and the cost of the hits at that time (16 bytes), so a log's memory is bounded by its entries,
/// not by its limit. A log whose window holds hits at more distinct times merges its oldest
/// entries into their successors (conservative: it may refuse a little early, never admit more).
pub const SLIDING_LOG_ENTRIES_MAX: u64 = 100_000;
/// The most leases a concurrency limit tracks per key: its memory is O(limit).
pub const CONCURRENCY_LIMIT_MAX: u64 = 100_000;
/// The longest period accepted: about 100 years, so that instants never saturate in practice.
pub const PERIOD_NANOS_MAX: u64 = 100 * 365 * 24 * 3600 * 1_000_000_000;

/// A validated limit. Cheap to clone; every decision takes one by reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    spec: LimitSpec,
    kind: Kind,
}

/// The precomputed form that the algorithms run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// Token bucket, GCRA and shaper: a theoretical arrival time.
    Tat(TatParams),
    /// Fixed window, sliding window counter and expiring counter.
    Window(WindowParams),
    /// Sliding window log.
    Log(LogParams),
    /// Concurrency leases.
    Leases(LeaseParams),
    /// Calendar-aligned fixed window.
    Calendar(CalendarParams),
}

impl Limit {
    /// Validates `spec`.
    ///
    /// Token bucket, GCRA and shaper drain one hit every `ceil(period / limit)` nanoseconds: when
    /// `period` is not a multiple of `limit` the rate is rounded down by under one part in
    /// `period_nanos / limit`, never up.
    pub fn new(spec: LimitSpec) -> Result<Limit, LimitError> {
        let period_nanos = duration_nanos(spec.period);
        if spec.limit == 0 {
            return Err(LimitError::ZeroLimit);
        }
        if period_nanos == 0 {
            return Err(LimitError::ZeroPeriod);
        }
        if period_nanos > PERIOD_NANOS_MAX {
            return Err(LimitError::TooLarge { parameter: LimitParameter::Period, max: PERIOD_NANOS_MAX });
        }
        let reject = |parameter| LimitError::NotApplicable { parameter, algorithm: spec.algorithm };
        if spec.delay.is_some() && spec.algorithm != Algorithm::LeakyBucketShaper {
            return Err(reject(LimitParameter::Delay));
        }
        if let Some(window) = spec.calendar {
            return calendar_kind(&spec, window, period_nanos).map(|kind| Limit { spec, kind });
        }
        let kind = match spec.algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindowCounter | Algorithm::ExpiringCounter => {
                no_burst(&spec, reject)?;
                let sliding = spec.algorithm == Algorithm::SlidingWindowCounter;
                let expiring = spec.algorithm == Algorithm::ExpiringCounter;
                Kind::Window(WindowParams { period_nanos, limit: spec.limit, sliding, expiring })
            }
            Algorithm::SlidingWindowLog => {
                no_burst(&spec, reject)?;
                Kind::Log(LogParams { period_nanos, limit: spec.limit })
            }
            Algorithm::Concurrency => {
                no_burst(&spec, reject)?;
                at_most(LimitParameter::Limit, spec.limit, CONCURRENCY_LIMIT_MAX)?;
                Kind::Leases(LeaseParams { lease_nanos: period_nanos, limit: spec.limit })
            }
            Algorithm::TokenBucket | Algorithm::Gcra => {
                let default_burst = if spec.algorithm == Algorithm::Gcra { 1 } else { spec.limit };
                let capacity = spec.burst.unwrap_or(default_burst);
                if capacity == 0 {
                    return Err(LimitError::ZeroBurst(spec.algorithm));
                }
                tat_kind(&spec, period_nanos, capacity, 0, capacity)?
            }
            Algorithm::LeakyBucketShaper => {
                let burst = spec.burst.unwrap_or(0);
                let delay = spec.delay.unwrap_or(0);
                if delay > burst {
                    return Err(LimitError::DelayAboveBurst { delay, burst });
                }
                // The queue holds `burst` waiting hits plus the one being served (nginx counts the
                // same way: burst=5 admits 6 back to back).
                tat_kind(&spec, period_nanos, burst, 1, delay.saturating_add(1))?
            }
        };
        Ok(Limit { spec, kind })
    }

    /// The spec this limit was made from.
    pub fn spec(&self) -> &LimitSpec {
        &self.spec
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.spec.algorithm
    }

    /// The most hits one request may cost and still pass on a fresh key; a costlier request is
    /// refused without consuming anything and with no retry time (it can never pass).
    pub fn capacity(&self) -> u64 {
        match self.kind {
            Kind::Tat(p) => p.capacity,
            Kind::Window(WindowParams { limit, .. })
            | Kind::Log(LogParams { limit, .. })
            | Kind::Leases(LeaseParams { limit, .. })
            | Kind::Calendar(CalendarParams { limit, .. }) => limit,
        }
    }

    /// The limit as reported to clients (`X-RateLimit-Limit`): hits per period, or leases.
    pub fn reported_limit(&self) -> u64 {
        self.spec.limit
    }

    /// The sustained rate in hits per second (for concurrency: leases per lease lifetime).
    pub fn rate_per_second(&self) -> u64 {
        let period_nanos = u128::from(duration_nanos(self.spec.period)).max(1);
        u64::try_from(u128::from(self.spec.limit) * 1_000_000_000 / period_nanos).unwrap_or(u64::MAX)
    }

    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }
}

/// The parameters of a calendar window: a fixed window without burst or delay whose period is
/// the window's length.
fn calendar_kind(spec: &LimitSpec, window: CalendarWindow, period_nanos: u64) -> Result<Kind, LimitError> {
    if spec.algorithm != Algorithm::FixedWindow {
        return Err(LimitError::Calendar("only a fixed window can be calendar-aligned"));
    }
    no_burst(spec, |parameter| LimitError::NotApplicable { parameter, algorithm: Algorithm::FixedWindow })?;
    if window.end <= window.start || window.end.nanos_since(window.start) != period_nanos {
        return Err(LimitError::Calendar("the period must be the window's length (end − start > 0)"));
    }
    Ok(Kind::Calendar(CalendarParams { limit: spec.limit, start: window.start, end: window.end }))
}

fn no_burst(spec: &LimitSpec, reject: impl FnOnce(LimitParameter) -> LimitError) -> Result<(), LimitError> {
    match spec.burst {
        Some(_) => Err(reject(LimitParameter::Burst)),
        None => Ok(()),
    }
}

fn at_most(parameter: LimitParameter, value: u64, max: u64) -> Result<(), LimitError> {
    if value > max {
        return Err(LimitError::TooLarge { parameter, max });
    }
    Ok(())
}

/// The parameters of a TAT limit whose bucket holds `burst + in_service` hits.
fn tat_kind(
    spec: &LimitSpec,
    period_nanos: u64,
    burst: u64,
    in_service: u64,
    delay_free: u64,
) -> Result<Kind, LimitError> {
    if spec.limit > period_nanos {
        return Err(LimitError::RateTooHigh { limit: spec.limit, period_nanos });
    }
    let interval_nanos = period_nanos.div_ceil(spec.limit);
    // The whole bucket must fit in the clock: capacity × interval within the period bound keeps
    // every theoretical arrival time far from saturation.
    let capacity_max = PERIOD_NANOS_MAX / interval_nanos;
    // The error reports the largest `burst` accepted, which the shaper's hit in service lowers.
    at_most(LimitParameter::Burst, burst, capacity_max - in_service)?;
    let capacity = burst + in_service;
    let reported_limit = spec.limit;
    Ok(Kind::Tat(TatParams { interval_nanos, capacity, delay_free, reported_limit }))
}
