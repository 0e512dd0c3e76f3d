//! Random limits and operation sequences, and a driver's clock that sometimes goes backwards.

use std::time::Duration;

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use ratemesh_core::{Algorithm, Instant, LeaseId, Limit, LimitSpec};

use crate::model::period_nanos;

/// How the driver's clock moves before an operation.
#[derive(Clone, Copy, Debug)]
pub enum Step {
    Forward(u64),
    /// Time going backwards, which the bucket must treat as no time passing.
    Back(u64),
}

/// One operation on a bucket.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// A check of this cost (0 only asks).
    Check(u64),
    Refund(u64),
    Force(u64),
    /// Release a lease: one handed out before when there is one (picked by this number), or an
    /// unknown id.
    Release(u64),
}

/// A limit, a start instant, an RNG seed and operations.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub spec: LimitSpec,
    pub start: u64,
    pub seed: u64,
    pub ops: Vec<(Step, Op)>,
}

impl Scenario {
    pub fn limit(&self) -> Limit {
        Limit::new(self.spec.clone()).expect("generated specs are valid")
    }
}

/// The driver's clock: the raw instants handed to the bucket, which sometimes go backwards, and
/// the effective `now`, the latest instant seen.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    raw: u64,
    now: u64,
}

impl Clock {
    pub fn new(start: u64) -> Clock {
        Clock { raw: start, now: start }
    }

    /// Moves the raw clock by `step`; returns the raw instant.
    pub fn step(&mut self, step: Step) -> Instant {
        self.raw = match step {
            Step::Forward(n) => self.raw.saturating_add(n),
            Step::Back(n) => self.raw.saturating_sub(n),
        };
        self.now = self.now.max(self.raw);
        Instant::from_nanos(self.raw)
    }

    /// The effective instant: the latest seen.
    pub fn now(&self) -> u64 {
        self.now
    }
}

/// The lease an [`Op::Release`] names.
pub fn pick_lease(granted: &[LeaseId], pick: u64) -> LeaseId {
    if granted.is_empty() || pick.is_multiple_of(5) {
        return LeaseId(pick);
    }
    granted[usize::try_from(pick / 5).expect("u64 fits usize") % granted.len()]
}

fn nanos(n: u64) -> Duration {
    Duration::from_nanos(n)
}

/// Small limits and short periods, so that a hundred operations cross many windows, refills and
/// expiries. Rate periods are not multiples of the limit, so the rounding of the interval shows.
pub fn spec(algorithm: Algorithm) -> BoxedStrategy<LimitSpec> {
    let rate = (1..=8u64, 1..=400u64, 0..8u64);
    match algorithm {
        Algorithm::FixedWindow
        | Algorithm::SlidingWindowCounter
        | Algorithm::ExpiringCounter
        | Algorithm::SlidingWindowLog
        | Algorithm::Concurrency => (1..=8u64, 1..=3_000u64)
            .prop_map(move |(limit, period)| LimitSpec::new(algorithm, limit, nanos(period)))
            .boxed(),
        Algorithm::TokenBucket | Algorithm::Gcra => (rate, option::of(1..=12u64))
            .prop_map(move |((limit, per_hit, extra), burst)| {
                let period = limit * per_hit + extra % limit;
                LimitSpec { burst, ..LimitSpec::new(algorithm, limit, nanos(period)) }
            })
            .boxed(),
        Algorithm::LeakyBucketShaper => (rate, option::of(0..=8u64), option::of(any::<u64>()))
            .prop_map(move |((limit, per_hit, extra), burst, delay)| {
                let period = limit * per_hit + extra % limit;
                let delay = delay.map(|d| d % (burst.unwrap_or(0) + 1));
                LimitSpec { burst, delay, ..LimitSpec::new(algorithm, limit, nanos(period)) }
            })
            .boxed(),
    }
}

/// Time steps: often none, mostly up to two periods, sometimes a long idle, sometimes backwards.
pub fn step(period: u64) -> BoxedStrategy<Step> {
    prop_oneof![
        3 => Just(Step::Forward(0)),
        6 => (0..=2 * period).prop_map(Step::Forward),
        1 => (0..=20 * period).prop_map(Step::Forward),
        1 => (1..=period).prop_map(Step::Back),
    ]
    .boxed()
}

/// Costs: queries, single hits, anything up to the capacity, and more than it.
pub fn cost(capacity: u64) -> BoxedStrategy<u64> {
    prop_oneof![
        2 => Just(0),
        5 => Just(1),
        3 => 0..=capacity,
        1 => (capacity + 1)..=(3 * capacity + 1),
    ]
    .boxed()
}

/// Operations; `forced` turns forced hits on.
pub fn op(capacity: u64, forced: bool) -> BoxedStrategy<Op> {
    let hits = 0..=capacity + 2;
    let unforced = prop_oneof![
        10 => cost(capacity).prop_map(Op::Check),
        2 => hits.clone().prop_map(Op::Refund),
        2 => any::<u64>().prop_map(Op::Release),
    ];
    if forced { prop_oneof![14 => unforced, 1 => hits.prop_map(Op::Force)].boxed() } else { unforced.boxed() }
}

/// Steps and operations for `spec`.
pub fn ops(spec: &LimitSpec, forced: bool, len_max: usize) -> BoxedStrategy<Vec<(Step, Op)>> {
    let capacity = Limit::new(spec.clone()).expect("generated specs are valid").capacity();
    vec((step(period_nanos(spec)), op(capacity, forced)), 1..=len_max).boxed()
}

/// A scenario for `algorithm`.
pub fn scenario(algorithm: Algorithm, forced: bool) -> BoxedStrategy<Scenario> {
    spec(algorithm)
        .prop_flat_map(move |spec| {
            let period = period_nanos(&spec);
            let ops = ops(&spec, forced, 100);
            (Just(spec), 0..=20 * period, any::<u64>(), ops)
        })
        .prop_map(|(spec, start, seed, ops)| Scenario { spec, start, seed, ops })
        .boxed()
}

/// A scenario for any algorithm.
pub fn any_scenario(forced: bool) -> BoxedStrategy<Scenario> {
    select(Algorithm::ALL.to_vec()).prop_flat_map(move |algorithm| scenario(algorithm, forced)).boxed()
}
