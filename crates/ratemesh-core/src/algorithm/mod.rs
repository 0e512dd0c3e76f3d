//! The limiting algorithms, behind one [`Bucket`] type: the state of one key under one limit.
//!
//! Every operation takes `now`; a `now` earlier than one the bucket has already seen is treated
//! as no time passing. Arithmetic saturates and never panics, whatever the inputs.

use crate::prelude::*;
mod calendar;
mod leases;
mod log;
mod tat;
mod window;

use rand::{Rng, SeedableRng};

use crate::decision::{Decision, LeaseId};
use crate::limit::{Kind, Limit};
use crate::time::Instant;
use calendar::Calendar;
pub(crate) use calendar::CalendarParams;
pub(crate) use leases::LeaseParams;
use leases::Leases;
use log::Log;
pub(crate) use log::{LOG_ENTRY_BYTES, LogParams};
pub(crate) use tat::TatParams;
use window::Window;
pub(crate) use window::WindowParams;

/// The seeded random number generator the core draws from (never from the OS).
pub type CoreRng = rand_xoshiro::Xoshiro256PlusPlus;

/// The state of one key under one limit.
///
/// A bucket does not remember its limit: the caller passes the same [`Limit`] to every call. If the
/// limit changes to another algorithm family (a policy reload), the bucket starts fresh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    updated_at: Instant,
    state: State,
}

/// The algorithm-specific part of a bucket. Large states are boxed so that the common ones (TAT,
/// window) keep this at 32 bytes and a bucket (this plus `updated_at`) at 40.
#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Tat(Instant),
    Window(Window),
    Log(Box<Log>),
    Leases(Box<Leases>),
    Calendar(Calendar),
}

/// A bucket's state as it travels between nodes: times are relative to the sender's `now`, never
/// instants, because nodes' clocks have different epochs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Snapshot {
    /// Token bucket, GCRA, shaper: how far the theoretical arrival time is ahead of now.
    Tat {
        /// `TAT − now` in nanoseconds (0 for a full bucket).
        backlog_nanos: u64,
    },
    /// Fixed window or sliding window counter.
    Window {
        /// Time since the current window started, in nanoseconds.
        elapsed_nanos: u64,
        /// Hits in the previous window.
        prev: u64,
        /// Hits in the current window.
        curr: u64,
    },
    /// Sliding window log: `(age in nanoseconds, cost)` per logged time.
    Log {
        /// The logged hits.
        hits: Vec<(u64, u64)>,
    },
    /// Concurrency: `(lease, slots, nanoseconds until it expires)` per lease held.
    Leases {
        /// The leases held.
        leases: Vec<(LeaseId, u64, u64)>,
    },
    /// Calendar-aligned fixed window: the window counted in, relative to now, and its count.
    Calendar {
        /// Time since the window started, in nanoseconds.
        elapsed_nanos: u64,
        /// Time until it ends, in nanoseconds (`u64::MAX`-ish: an end not known yet).
        remaining_nanos: u64,
        /// Hits counted in it.
        curr: u64,
    },
}

impl Snapshot {
    /// The same state `nanos` later, nothing having happened in between: what a snapshot written
    /// `nanos` ago says about now (the time passed is credited as refill, expired hits and leases
    /// drop out). Saturating: a state older than its own memory is fresh.
    #[must_use]
    pub fn aged(self, nanos: u64) -> Snapshot {
        match self {
            Snapshot::Tat { backlog_nanos } => {
                Snapshot::Tat { backlog_nanos: backlog_nanos.saturating_sub(nanos) }
            }
            Snapshot::Window { elapsed_nanos, prev, curr } => {
                Snapshot::Window { elapsed_nanos: elapsed_nanos.saturating_add(nanos), prev, curr }
            }
            Snapshot::Log { hits } => Snapshot::Log {
                hits: hits.into_iter().map(|(age, cost)| (age.saturating_add(nanos), cost)).collect(),
            },
            Snapshot::Leases { leases } => Snapshot::Leases {
                leases: leases
                    .into_iter()
                    .filter(|&(_, _, left)| left > nanos)
                    .map(|(id, slots, left)| (id, slots, left - nanos))
                    .collect(),
            },
            Snapshot::Calendar { elapsed_nanos, remaining_nanos, curr } => Snapshot::Calendar {
                elapsed_nanos: elapsed_nanos.saturating_add(nanos),
                remaining_nanos: remaining_nanos.saturating_sub(nanos),
                curr,
            },
        }
    }
}

/// What [`Bucket::rescale`] keeps of a theoretical arrival time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// The hits in use.
    Used,
    /// The hits left.
    Left,
}

/// A snapshot that does not fit the limit it is applied under. The peer that sent it (or a policy
/// that differs between nodes) is at fault; the local bucket is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("snapshot of another algorithm family than the limit's ({0})")]
pub struct SnapshotMismatch(pub &'static str);

impl Bucket {
    /// A fresh bucket: nothing counted.
    pub fn new(limit: &Limit, now: Instant) -> Bucket {
        Bucket { updated_at: now, state: State::fresh(limit.kind(), now) }
    }

    /// Decides a request of `cost` hits at `now` and counts it when it passes (`cost` 0 only asks).
    /// `rng` names concurrency leases.
    pub fn check(&mut self, limit: &Limit, cost: u64, now: Instant, rng: &mut CoreRng) -> Decision {
        let now = self.advance(limit, now);
        let decision = match (&mut self.state, limit.kind()) {
            (State::Tat(at), Kind::Tat(p)) => tat::check(at, p, cost, now),
            (State::Window(w), Kind::Window(p)) => w.check(p, cost, now),
            (State::Log(l), Kind::Log(p)) => l.check(p, cost, now),
            (State::Leases(l), Kind::Leases(p)) => l.check(p, cost, now, LeaseId(rng.next_u64())),
            (State::Calendar(c), Kind::Calendar(p)) => c.check(p, cost, now),
            // advance() replaced a state of another family by a fresh one: cannot happen.
            _ => Decision::new(false, limit.reported_limit(), 0, 0).refused_for(None),
        };
        // The capacity bound: no bucket ever holds more than a fresh one.
        assert!(decision.remaining <= limit.capacity(), "{decision:?} above the capacity of {limit:?}");
        decision
    }

    /// The decision a request of `cost` would get at `now`, changing nothing.
    pub fn peek(&self, limit: &Limit, cost: u64, now: Instant) -> Decision {
        let mut copy = self.clone();
        // Only a concurrency limit draws a lease id, and a peek takes no lease: any state will do,
        // and a fixed one costs a copy (`seed_from_u64` runs SplitMix on every peek).
        let mut decision = copy.check(limit, cost, now, &mut CoreRng::from_seed([1; 32]));
        decision.lease = None;
        decision
    }

    /// Applies `hits` admitted elsewhere, unconditionally: the bucket may go into debt, which later
    /// requests pay back. Concurrency leases are not hits: for them this does nothing.
    pub fn force(&mut self, limit: &Limit, hits: u64, now: Instant) {
        let now = self.advance(limit, now);
        match (&mut self.state, limit.kind()) {
            (State::Tat(at), Kind::Tat(p)) => tat::force(at, p, hits, now),
            (State::Window(w), Kind::Window(p)) => w.force(p, hits, now),
            (State::Log(l), Kind::Log(p)) => l.force(p, hits, now),
            (State::Calendar(c), _) => c.force(hits),
            _ => {}
        }
    }

    /// Makes sure at least `hits` count as in use now, without adding any: hits held elsewhere
    /// (allowances granted to other nodes and not used yet) must not be refilled under them, or
    /// the bucket plus the allowances would exceed the capacity. Concurrency: does nothing.
    pub fn hold(&mut self, limit: &Limit, hits: u64, now: Instant) {
        let now = self.advance(limit, now);
        match (&mut self.state, limit.kind()) {
            (State::Tat(at), Kind::Tat(p)) => tat::hold(at, p, hits, now),
            (State::Window(w), Kind::Window(p)) => w.hold(p, hits, now),
            (State::Log(l), Kind::Log(p)) => l.hold(p, hits, now),
            (State::Calendar(c), _) => c.hold(hits),
            _ => {}
        }
    }

    /// Forgives debt beyond one capacity: the bucket owes at most one full bucket. Hits forced in
    /// after the fact (admitted by a fallback while the owner was unreachable) keep being charged,
    /// but a long outage does not turn into an equally long refusal afterwards. Token bucket, GCRA
    /// and shaper only; the other algorithms forget their debt as their windows pass anyway.
    pub fn cap_debt(&mut self, limit: &Limit, now: Instant) {
        let now = self.advance(limit, now);
        if let (State::Tat(at), Kind::Tat(p)) = (&mut self.state, limit.kind()) {
            tat::cap_debt(at, p, now);
        }
    }

    /// Returns `hits` (e.g. for work that failed downstream); never fills above capacity.
    /// Concurrency leases are returned with [`Bucket::release`] instead.
    pub fn refund(&mut self, limit: &Limit, hits: u64, now: Instant) {
        let now = self.advance(limit, now);
        match (&mut self.state, limit.kind()) {
            (State::Tat(at), Kind::Tat(p)) => tat::refund(at, p, hits, now),
            (State::Window(w), Kind::Window(p)) => w.refund(p, hits, now),
            (State::Log(l), Kind::Log(p)) => l.refund(p, hits, now),
            (State::Calendar(c), _) => c.refund(hits),
            _ => {}
        }
        debug_assert!(self.peek(limit, 0, now).remaining <= limit.capacity(), "refunded above capacity");
    }

    /// Releases a concurrency lease; false when it is not held (released, expired, or not a
    /// concurrency limit).
    pub fn release(&mut self, limit: &Limit, lease: LeaseId, now: Instant) -> bool {
        let now = self.advance(limit, now);
        match (&mut self.state, limit.kind()) {
            (State::Leases(leases), Kind::Leases(p)) => leases.release(p, lease, now),
            _ => false,
        }
    }

    /// How often the bucket gains back one hit, in nanoseconds: the TAT algorithms refill
    /// steadily; the windows only at their edge, and an allowance does not outlive its window, so
    /// for allowances they refill never (0).
    pub fn refill_nanos_per_hit(&self, limit: &Limit) -> u64 {
        match limit.kind() {
            Kind::Tat(p) => p.interval_nanos,
            _ => 0,
        }
    }

    /// Sliding window log only: the entries its buffer has room for (its memory, at
    /// [`LOG_ENTRY_BYTES`] each); 0 under other algorithms.
    pub(crate) fn log_capacity(&self) -> usize {
        match &self.state {
            State::Log(l) => l.capacity(),
            _ => 0,
        }
    }

    /// Window algorithms: nanoseconds from `now` until the current window ends (what is counted
    /// in it stops counting for the fixed window, and weighs less for the sliding counter).
    pub fn window_end_nanos(&self, limit: &Limit, now: Instant) -> Option<u64> {
        match (&self.state, limit.kind()) {
            (State::Window(w), Kind::Window(p)) => {
                let now = now.max(self.updated_at);
                Some(w.end_nanos(p, now))
            }
            _ => None,
        }
    }

    /// Expiring counter only: whether it counts nothing at `now`, so that the next hit counted
    /// into it (a check, an allowance debited, a hold) would open its window. An owner grants no
    /// allowance from such a counter: its window must start at a hit, not at a grant. False
    /// under every other algorithm.
    pub fn opens_window_on_debit(&self, limit: &Limit, now: Instant) -> bool {
        match (&self.state, limit.kind()) {
            (State::Window(w), Kind::Window(p)) if p.expiring => w.is_empty(p, now.max(self.updated_at)),
            _ => false,
        }
    }

    /// Sliding window log only: halves the log, conservatively (see `Log::coarsen`); false when
    /// it cannot shrink any more, or under other algorithms.
    pub(crate) fn coarsen_log(&mut self) -> bool {
        match &mut self.state {
            State::Log(l) => l.coarsen(),
            _ => false,
        }
    }

    /// The instant after which this bucket is indistinguishable from a fresh one (its TTL).
    pub fn fresh_at(&self, limit: &Limit) -> Instant {
        let now = self.updated_at;
        match (&self.state, limit.kind()) {
            (State::Tat(at), _) => *at,
            (State::Window(w), Kind::Window(p)) => w.fresh_at(p, now),
            (State::Log(l), Kind::Log(p)) => l.fresh_at(p),
            (State::Leases(l), _) => l.fresh_at(),
            (State::Calendar(c), _) => c.fresh_at(now),
            // A state of another family is dropped at the next call: it is stale already.
            _ => now,
        }
        .max(now)
    }

    /// Re-expresses the state counted under `from` under `to`, a limit of the same algorithm
    /// with another rate and burst (a region's part of a limit changed). Counters count hits and
    /// stay as they are. A theoretical arrival time keeps either the *hits in use* (`Keep::Used`:
    /// its lead over now scales with the time per hit) or the *hits left* (`Keep::Left`: a
    /// bucket that grows gets the new room empty, one that shrinks loses what is above its new
    /// size, and a debt stays a debt). Keeping what is left never adds hits: a region whose part
    /// grows while it is full must not hand out a full bucket of its new size on top of what the
    /// other regions hold.
    pub fn rescale(&mut self, from: &Limit, to: &Limit, keep: Keep, now: Instant) {
        let (State::Tat(at), Kind::Tat(p), Kind::Tat(q)) = (&mut self.state, from.kind(), to.kind()) else {
            return;
        };
        let now = now.max(self.updated_at);
        let lead = i128::from(at.nanos_since(now));
        let (t_from, t_to) = (i128::from(p.interval_nanos.max(1)), i128::from(q.interval_nanos));
        let scaled = lead * t_to / t_from;
        let lead = match keep {
            Keep::Used => scaled,
            Keep::Left => scaled + (i128::from(q.capacity) - i128::from(p.capacity)) * t_to,
        };
        *at = now.add_nanos(u64::try_from(lead.max(0)).unwrap_or(u64::MAX));
    }

    /// The state at `now`, relative to `now`, for another node.
    pub fn export(&self, now: Instant) -> Snapshot {
        let now = now.max(self.updated_at);
        match &self.state {
            State::Tat(at) => Snapshot::Tat { backlog_nanos: at.nanos_since(now) },
            State::Window(w) => {
                Snapshot::Window { elapsed_nanos: now.nanos_since(w.start), prev: w.prev, curr: w.curr }
            }
            State::Log(l) => {
                Snapshot::Log { hits: l.hits.iter().map(|&(at, cost)| (now.nanos_since(at), cost)).collect() }
            }
            State::Leases(l) => Snapshot::Leases {
                leases: l.held.iter().map(|h| (h.id, h.slots, h.expires_at.nanos_since(now))).collect(),
            },
            State::Calendar(c) => Snapshot::Calendar {
                elapsed_nanos: now.nanos_since(c.start),
                remaining_nanos: c.end.nanos_since(now),
                curr: c.curr,
            },
        }
    }

    /// A bucket holding `snapshot`, received at `now`.
    pub fn import(limit: &Limit, snapshot: Snapshot, now: Instant) -> Result<Bucket, SnapshotMismatch> {
        let state = State::from_snapshot(limit, snapshot, now)?;
        Ok(Bucket { updated_at: now, state })
    }

    /// Joins `snapshot` into this bucket: afterwards the bucket admits no more, at any future
    /// instant, than either the bucket or the snapshot would have. Commutative, associative and
    /// idempotent, so state that arrives twice or by several routes is never counted twice.
    pub fn join(&mut self, limit: &Limit, snapshot: Snapshot, now: Instant) -> Result<(), SnapshotMismatch> {
        // A `now` this bucket has passed already is no time passing: the snapshot is anchored at
        // the bucket's own now, not in its past (where the peer's hits would count less long).
        let other = State::from_snapshot(limit, snapshot, now.max(self.updated_at))?;
        let now = self.advance(limit, now);
        match (&mut self.state, other, limit.kind()) {
            (State::Tat(at), State::Tat(theirs), _) => *at = (*at).max(theirs),
            (State::Window(w), State::Window(theirs), Kind::Window(p)) => w.join(p, theirs, now),
            (State::Log(l), State::Log(theirs), Kind::Log(p)) => l.join(p, *theirs, now),
            (State::Leases(l), State::Leases(theirs), Kind::Leases(p)) => l.join(p, *theirs, now),
            (State::Calendar(c), State::Calendar(mut theirs), Kind::Calendar(p)) => {
                theirs.advance(p, now);
                c.join(theirs);
            }
            // Both sides were checked against the limit's family above: cannot happen.
            _ => {}
        }
        Ok(())
    }

    /// Clamps `now` so time never goes backwards for this bucket, and replaces a state of another
    /// algorithm family (after a policy change) by a fresh one.
    fn advance(&mut self, limit: &Limit, now: Instant) -> Instant {
        let now = now.max(self.updated_at);
        self.updated_at = now;
        match (&mut self.state, limit.kind()) {
            (state, kind) if !state.fits(kind) => *state = State::fresh(kind, now),
            (State::Calendar(c), Kind::Calendar(p)) => c.advance(p, now),
            _ => {}
        }
        now
    }
}

impl State {
    fn fresh(kind: Kind, now: Instant) -> State {
        match kind {
            Kind::Tat(_) => State::Tat(now),
            Kind::Window(p) => State::Window(Window::fresh(p, now)),
            Kind::Log(_) => State::Log(Box::default()),
            Kind::Leases(_) => State::Leases(Box::default()),
            Kind::Calendar(p) => State::Calendar(Calendar::fresh(p, now)),
        }
    }

    fn fits(&self, kind: Kind) -> bool {
        matches!(
            (self, kind),
            (State::Tat(_), Kind::Tat(_))
                | (State::Window(_), Kind::Window(_))
                | (State::Log(_), Kind::Log(_))
                | (State::Leases(_), Kind::Leases(_))
                | (State::Calendar(_), Kind::Calendar(_))
        )
    }

    fn from_snapshot(limit: &Limit, snapshot: Snapshot, now: Instant) -> Result<State, SnapshotMismatch> {
        let mismatch = SnapshotMismatch(limit.algorithm().name());
        let state = match (snapshot, limit.kind()) {
            (Snapshot::Tat { backlog_nanos }, Kind::Tat(_)) => State::Tat(now.add_nanos(backlog_nanos)),
            (Snapshot::Window { elapsed_nanos, prev, curr }, Kind::Window(_)) => {
                State::Window(Window { start: now.sub_nanos(elapsed_nanos), prev, curr })
            }
            (Snapshot::Log { hits }, Kind::Log(p)) => State::Log(Box::new(Log::from_ages(p, hits, now))),
            (Snapshot::Leases { leases }, Kind::Leases(p)) => {
                State::Leases(Box::new(Leases::from_expiries(p, leases, now)))
            }
            (Snapshot::Calendar { elapsed_nanos, remaining_nanos, curr }, Kind::Calendar(_)) => {
                let (start, end) = (now.sub_nanos(elapsed_nanos), now.add_nanos(remaining_nanos));
                State::Calendar(Calendar { start, end, curr })
            }
            _ => return Err(mismatch),
        };
        Ok(state)
    }
}
