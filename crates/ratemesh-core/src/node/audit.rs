//! The audit: the owner of a key measures what the whole cluster admitted of it, window by
//! window, against what one ideal limiter would have admitted of the same arrivals.
//!
//! Every node counts the hits it answers its clients on a key it does not own (from an
//! allowance, refused while its share is spent, by a fallback, or forwarded and answered by the
//! owner) into a [`Tally`]: pieces of at most a tenth of the key's audit window (a sparse piece,
//! of few hits, up to half a window or a second), each with the instants of its first and last
//! hit. The pieces ride to the owner with the node's reports (the `audit` section of a frame)
//! once [`Node::audit_flush_nanos`] old, as ages (how long before the send): the owner places
//! them on its own clock (receive time minus the age minus half the round trip), so no clocks
//! are compared; a frame that waited on the way (a stalled stream) is placed back by its wait
//! (`Peer::lateness_nanos`: the frame carries the sender's clock, compared only with the same
//! sender's other frames). The owner counts its own clients' checks; the ones it decides for others are
//! counted where they were answered, so none counts twice.
//!
//! The owner keeps, per audited key, the windows still open ([`Record`]): per tenth of a window
//! (a slot) the hits that arrived and were admitted, a piece spread evenly over the slots its
//! span covers. A window closes once it ended [`Node::audit_settle_nanos`] ago, every member of
//! the ring has been reachable that long, and every member that sent pieces lately has been heard
//! from since (a member that did keeps sending its owner a frame every half second for a minute);
//! while one is not, windows stay open (up to [`WINDOWS_OPEN_MAX`]) and close when it is heard
//! again, with what it answered meanwhile. A node that stops owning a key (the view changed, or a
//! partition the failure detector saw healed and the side that owned the key on its own gives it
//! back) hands its open windows over to the new owner as pieces. Closing feeds the window's
//! arrivals, slot by slot in chunks, to an ideal bucket of the key's limit that lives as long as
//! the record: what it admits is the window's ideal. A window is *complete* unless the owner did
//! not own the key for all of it, a member left the view (for good) while it was open, it was
//! closed by force, the cluster has several regions, or it follows an incomplete one within the
//! ideal limiter's memory (the time its capacity takes to refill); figures use complete windows
//! only, and count the others. A key *born* at its owner (its entry created by a client's check,
//! no state from elsewhere: [`KeyMeta::born`]) while nothing of its history can have escaped the
//! owner (it ran, its view stayed calm and it evicted no key since [`history_start`]) had no
//! history: its record is whole from the window of its first check.
//!
//! Per group (a driver's policy) and window length the owner sums the closed windows of the last
//! minute ([`AUDIT_SPAN_NANOS`], or the last window when windows are longer): admitted, ideal,
//! arrivals, the hits admitted above the ideal and refused below it, and the worst window against
//! the limit. Memory is bounded: at most [`NodeConfig::audit_keys_max`] records; past it, keys
//! are sampled by hash (a key is audited while the top `sample_bits` bits of its hash are zero,
//! and every time the cap is reached one more bit is required and the records that no longer
//! qualify are dropped), so figures describe an unbiased sample of the keys.
//!
//! [`NodeConfig::audit_keys_max`]: super::NodeConfig::audit_keys_max

use crate::prelude::*;
use alloc::collections::{BTreeMap, VecDeque};
use core::time::Duration;

use hashbrown::HashMap;
use indexmap::IndexMap;

use super::api::Audit;
use super::*;
use crate::wire::AuditPiece;

/// Slots per audit window: the resolution at which arrivals feed the ideal limiter.
pub(crate) const SLOTS_PER_WINDOW: u64 = 10;
/// The most windows of a key kept open while a member is unreachable (then closed by force).
pub(crate) const WINDOWS_OPEN_MAX: usize = 64;
/// The most pieces a tally holds (older pieces merge when it is full: a long cut loses
/// resolution, not hits).
const PIECES_MAX: usize = 32;
/// Chunks per slot fed to the ideal limiter (arrivals spread evenly inside a slot): 40 checks of
/// the ideal bucket per busy window at most.
const CHUNKS_PER_SLOT: u64 = 4;
/// Windows are closed every this many sync rounds (each closing pass visits every record).
const CLOSE_EVERY_ROUNDS: u32 = 4;
/// What the audit's figures cover: the last minute.
pub const AUDIT_SPAN_NANOS: u64 = 60_000_000_000;
/// The default audit window of a bucket algorithm (token bucket, GCRA, shaper).
const BUCKET_WINDOW_NANOS: u64 = 1_000_000_000;
/// The longest default audit window (a day's limit is audited by the hour).
const WINDOW_NANOS_MAX: u64 = 3_600_000_000_000;
/// The shortest audit window that can be asked for (a peer's piece too): 10 ms.
const WINDOW_NANOS_MIN: u64 = 10_000_000;
/// The longest audit window that can be asked for: a day.
const WINDOW_NANOS_LONGEST: u64 = 86_400_000_000_000;
/// How long after its last pieces a member counts as a sender at the owner, and keeps sending
/// the owner a frame at least every [`KEEPALIVE_NANOS`] (see `AuditBook::senders`).
const SENDER_ACTIVE_NANOS: u64 = 60_000_000_000;
/// The longest a member that sent an owner pieces lately stays silent towards it.
const KEEPALIVE_NANOS: u64 = 500_000_000;
/// How many periods with members believed dead the audit remembers.
const DEAD_PERIODS_MAX: usize = 8;
/// How long windows wait, after members came back the ring, for the windows the other side of a
/// healed partition hands over (its view changes later than this one's by up to a gossip round).
const HANDOFF_GRACE_NANOS: u64 = 2_000_000_000;
/// How often a follower tells an owner a key's group and window again (see [`Tally`]).
const ANNOUNCE_EVERY_NANOS: u64 = 10_000_000_000;
/// Separates the audit's random stream (the ideal buckets) from the node's.
const AUDIT_RNG_SALT: u64 = 0x6175_6469_7400_0001;

/// The audit window of a key under `limit` audited as `audit`, in nanoseconds; `None` when it is
/// not audited (off, or a concurrency limit: leases, not rates).
pub(crate) fn window_nanos(limit: &Limit, audit: Audit) -> Option<u64> {
    let Audit::On { window, .. } = audit else { return None };
    let algorithm = limit.algorithm();
    if algorithm == crate::limit::Algorithm::Concurrency {
        return None;
    }
    if let Some(window) = window {
        return Some(duration_nanos(window).clamp(WINDOW_NANOS_MIN, WINDOW_NANOS_LONGEST));
    }
    let period = duration_nanos(limit.spec().period);
    Some(match algorithm {
        crate::limit::Algorithm::TokenBucket
        | crate::limit::Algorithm::Gcra
        | crate::limit::Algorithm::LeakyBucketShaper => BUCKET_WINDOW_NANOS,
        _ => period.clamp(BUCKET_WINDOW_NANOS, WINDOW_NANOS_MAX),
    })
}

impl Policy {
    /// The audit window of a key under this policy ([`AuditWindow::index`] counts these on the
    /// owner's clock); `None` when it is not audited (off, or a concurrency limit).
    pub fn audit_window(&self) -> Option<Duration> {
        window_nanos(&self.limit, self.audit).map(Duration::from_nanos)
    }
}

/// A follower's hits on one key since they last went to the owner.
#[derive(Clone, Debug)]
pub(crate) struct Tally {
    pieces: Vec<Piece>,
    /// The group and window the hits were counted under (the last check's policy).
    group: u64,
    window_nanos: u64,
    /// A piece of at most this many hits is sparse: it may span up to [`sparse_span_nanos`]
    /// (a key far below its limit costs a piece per half window, not one per hit).
    small: u64,
    /// The key's owner in this node's view (the pieces go there).
    owner: NodeId,
    /// The owner last told the group and window, and when: later pieces to it leave them out
    /// (0: 2 bytes instead of 15 a piece), until it changes or [`ANNOUNCE_EVERY_NANOS`] passed
    /// (an owner that restarted has forgotten).
    announced: Option<(NodeId, Instant)>,
}

#[derive(Clone, Copy, Debug)]
struct Piece {
    first: Instant,
    last: Instant,
    admitted: u64,
    refused: u64,
}

impl Piece {
    fn hits(&self) -> u64 {
        self.admitted.saturating_add(self.refused)
    }
}

/// How long a sparse piece may grow: half a window, at most a second.
fn sparse_span_nanos(window_nanos: u64) -> u64 {
    (window_nanos / 2).min(1_000_000_000)
}

/// The most hits of a sparse piece under `limit` audited over `window_nanos`: a 64th of the
/// window's limit (at least 1).
fn small_hits(limit: &Limit, window_nanos: u64) -> u64 {
    (window_limit(limit, window_nanos) / 64).max(1)
}

impl Tally {
    /// An empty tally for `owner`.
    pub fn new(owner: NodeId) -> Tally {
        Tally { pieces: Vec::new(), group: 0, window_nanos: 0, small: 0, owner, announced: None }
    }

    /// Counts `cost` hits decided at `now` under `audit` (a group, a window and the most hits of
    /// a sparse piece); a piece spans at most a slot of the window, or a sparse span while it
    /// holds few hits.
    pub fn add(&mut self, now: Instant, cost: u64, allowed: bool, audit: (u64, u64, u64)) {
        let (admitted, refused) = if allowed { (cost, 0) } else { (0, cost) };
        (self.group, self.window_nanos, self.small) = audit;
        let slot_nanos = self.window_nanos / SLOTS_PER_WINDOW;
        let sparse_nanos = sparse_span_nanos(self.window_nanos);
        let small = self.small;
        if let Some(piece) = self.pieces.last_mut()
            && (now.nanos_since(piece.first) < slot_nanos
                || (piece.hits().saturating_add(cost) <= small
                    && now.nanos_since(piece.first) < sparse_nanos))
        {
            piece.last = piece.last.max(now);
            piece.admitted = piece.admitted.saturating_add(admitted);
            piece.refused = piece.refused.saturating_add(refused);
            return;
        }
        if self.pieces.len() >= PIECES_MAX {
            let merged = self.pieces.remove(1);
            let oldest = &mut self.pieces[0];
            oldest.last = merged.last;
            oldest.admitted = oldest.admitted.saturating_add(merged.admitted);
            oldest.refused = oldest.refused.saturating_add(merged.refused);
        }
        self.pieces.push(Piece { first: now, last: now, admitted, refused });
    }

    /// When the oldest hit not yet sent was decided.
    pub fn oldest(&self) -> Option<Instant> {
        self.pieces.first().map(|p| p.first)
    }

    /// Whether the pieces should go at `now`: the oldest hit is `flush_nanos` old, and the last
    /// piece is closed, full, or as old as a sparse piece may grow.
    pub fn due(&self, now: Instant, flush_nanos: u64) -> bool {
        let Some(oldest) = self.oldest() else { return false };
        let age = now.nanos_since(oldest);
        let open_sparse = self.pieces.len() == 1 && self.pieces[0].hits() <= self.small;
        age >= flush_nanos && (!open_sparse || age >= sparse_span_nanos(self.window_nanos))
    }

    /// Takes every piece for `owner`, as wire items, ages counted back from `now`; they tell the
    /// group and window when `owner` may not know them.
    pub fn take(&mut self, key: KeyHash, owner: NodeId, now: Instant) -> Vec<AuditPiece> {
        let known =
            self.announced.is_some_and(|(to, at)| to == owner && now.nanos_since(at) < ANNOUNCE_EVERY_NANOS);
        if !known && !self.pieces.is_empty() {
            self.announced = Some((owner, now));
        }
        let (group, window_nanos) = if known { (0, 0) } else { (self.group, self.window_nanos) };
        let piece = |p: Piece| AuditPiece {
            key: key.0,
            group,
            window_nanos,
            first_age_nanos: now.nanos_since(p.first),
            last_age_nanos: now.nanos_since(p.last),
            admitted: p.admitted,
            refused: p.refused,
        };
        self.pieces.drain(..).map(piece).collect()
    }
}

/// An owner's own checks of a key in one slot, counted in the key's entry, which the check holds
/// anyway (no probe of the records on the check's path); folded into the key's record when a
/// check falls in a later slot, or at a closing round.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Hot {
    slot: u64,
    admitted: u64,
    arrivals: u64,
}

impl Hot {
    /// Counts a check of `cost` hits in `slot`; returns counts to fold: an earlier slot's, or
    /// this check's when it is the entry's first (the record begins with it, before any piece
    /// from another node could begin it mid-window).
    pub fn add(&mut self, slot: u64, cost: u64, allowed: bool) -> Option<Hot> {
        let admitted = if allowed { cost } else { 0 };
        if self.slot == 0 {
            self.slot = slot;
            return Some(Hot { slot, admitted, arrivals: cost });
        }
        if self.slot == slot {
            self.admitted = self.admitted.saturating_add(admitted);
            self.arrivals = self.arrivals.saturating_add(cost);
            return None;
        }
        let earlier = core::mem::replace(self, Hot { slot, admitted, arrivals: cost });
        (earlier.arrivals > 0).then_some(earlier)
    }

    /// The counts of a slot before `slot`, taken out.
    fn take_before(&mut self, slot: u64) -> Option<Hot> {
        (self.slot < slot && self.arrivals > 0).then(|| core::mem::take(self))
    }
}

/// One window of a key still open at its owner.
#[derive(Clone, Debug)]
struct OpenWindow {
    index: u64,
    /// Hits that arrived, per slot.
    arrivals: [u64; SLOTS_PER_WINDOW as usize],
    admitted: u64,
}

/// One closed window of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuditWindow {
    /// The window's number on the owner's clock: it spans `[index × window, (index + 1) × window)`
    /// nanoseconds of the owner's [`Instant`]s.
    pub index: u64,
    /// Hits the cluster admitted in it.
    pub admitted: u64,
    /// Hits an ideal single limiter would have admitted of the same arrivals.
    pub ideal: u64,
    /// Hits that arrived (admitted and refused).
    pub arrivals: u64,
    /// The limit over one window (the policy's limit scaled from its period to the window).
    pub window_limit: u64,
    /// Whether the owner saw all of it (see the module documentation of `node/audit.rs`).
    pub complete: bool,
}

/// The owner's audit of one key.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    group: u64,
    window_nanos: u64,
    /// Windows before this one were not (all) the owner's: incomplete.
    first_index: u64,
    /// Windows before this one are incomplete too: within the ideal limiter's memory of a window
    /// that lacked hits ([`ideal_memory_windows`]: its state still depends on what it missed).
    trusted_from: u64,
    /// Windows before this one are closed (or began before the record): hits for them are late.
    open_from: u64,
    open: VecDeque<OpenWindow>,
    done: VecDeque<AuditWindow>,
    /// The limit audited against (the owner's policy of the key when the record began).
    limit: Limit,
    /// The ideal limiter, fed with every closed window's arrivals in order.
    ideal: Bucket,
}

impl Record {
    fn new(group: u64, window_nanos: u64, limit: &Limit, now: Instant) -> Record {
        let index = now.as_nanos() / window_nanos;
        let start = Instant::from_nanos(index * window_nanos);
        Record {
            group,
            window_nanos,
            first_index: index + u64::from(now > start),
            trusted_from: 0,
            open_from: index,
            open: VecDeque::new(),
            done: VecDeque::new(),
            limit: limit.clone(),
            ideal: Bucket::new(limit, start),
        }
    }

    /// The record of a key born at `born` (its first check in the cluster): the window it was
    /// born in is whole, since nothing came before it.
    fn born(group: u64, window_nanos: u64, limit: &Limit, born: Instant) -> Record {
        let record = Record::new(group, window_nanos, limit, born);
        Record { first_index: born.as_nanos() / window_nanos, ..record }
    }

    fn slot_nanos(&self) -> u64 {
        (self.window_nanos / SLOTS_PER_WINDOW).max(1)
    }

    /// The first window whose ideal no longer depends on window `index`, which lacked hits: for
    /// a fixed window on the grid (its count starts afresh at each window of its own), the first
    /// one that begins once the fixed window holding `index`'s end is over; otherwise the ideal
    /// limiter's memory later ([`ideal_memory_windows`]).
    fn trusted_after(&self, index: u64) -> u64 {
        let next = index.saturating_add(1);
        let spec = self.limit.spec();
        if spec.algorithm == crate::limit::Algorithm::FixedWindow && spec.calendar.is_none() {
            let period = duration_nanos(spec.period).max(1);
            let fixed_end = next.saturating_mul(self.window_nanos).div_ceil(period).saturating_mul(period);
            return fixed_end.div_ceil(self.window_nanos);
        }
        next.saturating_add(ideal_memory_windows(&self.limit, self.window_nanos))
    }

    /// Counts `admitted` and `refused` hits spread evenly over `[from, to]`; returns the hits that
    /// fell in windows already closed, before the record, or more than [`WINDOWS_OPEN_MAX`]
    /// windows before `to` (a span that long is a merged one: its oldest part is not placed).
    fn add(&mut self, from: Instant, to: Instant, admitted: u64, refused: u64) -> u64 {
        if from == to {
            return self.add_at(to, admitted, refused);
        }
        let to = to.as_nanos();
        let from = from.as_nanos().min(to);
        let slot = self.slot_nanos();
        let arrivals = admitted.saturating_add(refused);
        // The hits before `x` nanoseconds into a span of `span`, rounded: parts of a span add up
        // to its hits exactly, without a bias towards its last slot.
        let before = |hits: u64, x: u64, span: u64| {
            ((u128::from(hits) * u128::from(x) + u128::from(span / 2)) / u128::from(span)) as u64
        };
        // The part of the span that can still be placed, and the hits in it (in proportion).
        let span = to - from + 1;
        let placeable_from = from
            .max(self.open_from.saturating_mul(self.window_nanos))
            .max(to.saturating_sub(WINDOWS_OPEN_MAX as u64 * self.window_nanos));
        if placeable_from > to {
            return arrivals;
        }
        let skipped = placeable_from - from;
        let placed = |hits: u64| hits - before(hits, skipped, span);
        let (admitted, placed_arrivals) = (placed(admitted), placed(arrivals));
        let mut late = arrivals - placed_arrivals;
        let placeable = to - placeable_from + 1;
        for s in placeable_from / slot..=to / slot {
            let start = (s * slot).max(placeable_from) - placeable_from;
            let end = ((s + 1) * slot).min(to + 1) - placeable_from;
            let a = before(admitted, end, placeable) - before(admitted, start, placeable);
            let n = before(placed_arrivals, end, placeable) - before(placed_arrivals, start, placeable);
            if n == 0 && a == 0 {
                continue;
            }
            match self.open_window(s / SLOTS_PER_WINDOW) {
                Some(window) => {
                    let slot = &mut window.arrivals[(s % SLOTS_PER_WINDOW) as usize];
                    *slot = slot.saturating_add(n.max(a));
                    window.admitted = window.admitted.saturating_add(a);
                }
                None => late = late.saturating_add(n.max(a)),
            }
        }
        late
    }

    /// [`Record::add`] at one instant (an owner's own decision: the check's hot path).
    fn add_at(&mut self, at: Instant, admitted: u64, refused: u64) -> u64 {
        let slot = at.as_nanos() / self.slot_nanos();
        let index = slot / SLOTS_PER_WINDOW;
        let window = match self.open.back_mut() {
            Some(window) if window.index == index => window,
            _ => match self.open_window(index) {
                Some(window) => window,
                None => return admitted.saturating_add(refused),
            },
        };
        let arrivals = &mut window.arrivals[(slot % SLOTS_PER_WINDOW) as usize];
        *arrivals = arrivals.saturating_add(admitted.saturating_add(refused));
        window.admitted = window.admitted.saturating_add(admitted);
        0
    }

    /// The open window `index`, opened if it is not closed yet; `None` when it is (or it began
    /// before the record).
    fn open_window(&mut self, index: u64) -> Option<&mut OpenWindow> {
        if index < self.open_from {
            return None;
        }
        let position = self.open.iter().position(|w| w.index >= index);
        let at = match position {
            Some(p) if self.open[p].index == index => p,
            Some(p) => {
                self.open.insert(p, OpenWindow::new(index));
                p
            }
            None => {
                self.open.push_back(OpenWindow::new(index));
                self.open.len() - 1
            }
        };
        self.open.get_mut(at)
    }

    /// Closes the windows before `until_index`, oldest first, and the oldest ones beyond
    /// [`WINDOWS_OPEN_MAX`] (incomplete: closed by force); `incomplete` says which others are;
    /// returns them.
    fn close(
        &mut self,
        until_index: u64,
        incomplete: impl Fn(u64) -> bool,
        rng: &mut CoreRng,
    ) -> Vec<AuditWindow> {
        let mut closed = Vec::new();
        while let Some(window) = self.open.front() {
            let forced = self.open.len() > WINDOWS_OPEN_MAX;
            if window.index >= until_index && !forced {
                break;
            }
            let Some(window) = self.open.pop_front() else { break };
            self.open_from = window.index + 1;
            let partial = window.index < self.first_index || forced || incomplete(window.index);
            if partial {
                self.trusted_from = self.trusted_from.max(self.trusted_after(window.index));
            }
            let complete = !partial && window.index >= self.trusted_from;
            let done = self.feed(&window, complete, rng);
            closed.push(done);
            self.done.push_back(done);
        }
        closed
    }

    /// Feeds a window's arrivals to the ideal limiter, slot by slot in chunks.
    fn feed(&mut self, window: &OpenWindow, complete: bool, rng: &mut CoreRng) -> AuditWindow {
        let limit = &self.limit;
        let slot = self.slot_nanos();
        let start = window.index * self.window_nanos;
        let mut ideal = 0u64;
        for (s, &arrived) in window.arrivals.iter().enumerate() {
            let chunks = arrived.clamp(1, CHUNKS_PER_SLOT);
            for c in 0..chunks {
                let hits = arrived / chunks + u64::from(c < arrived % chunks);
                if hits == 0 {
                    continue;
                }
                // The first chunk at the slot's start: the refill until the next one is not
                // lost to a full bucket.
                let at = Instant::from_nanos(start + s as u64 * slot + c * slot / chunks);
                ideal = ideal.saturating_add(admit_most(&mut self.ideal, &self.limit, hits, at, rng));
            }
        }
        AuditWindow {
            index: window.index,
            admitted: window.admitted,
            ideal,
            arrivals: window.arrivals.iter().fold(0, |sum: u64, &n| sum.saturating_add(n)),
            window_limit: window_limit(limit, self.window_nanos),
            complete,
        }
    }

    /// Drops closed windows that ended more than the span before window `index`.
    fn trim(&mut self, index: u64) {
        let keep = AUDIT_SPAN_NANOS.div_ceil(self.window_nanos).max(1);
        while self.done.front().is_some_and(|w| w.index + keep < index) {
            self.done.pop_front();
        }
    }
}

impl OpenWindow {
    fn new(index: u64) -> OpenWindow {
        OpenWindow { index, arrivals: [0; SLOTS_PER_WINDOW as usize], admitted: 0 }
    }
}

/// Admits as many of `hits` as `bucket` has room for at `at` (all-or-nothing checks halved
/// until one passes); returns how many.
fn admit_most(bucket: &mut Bucket, limit: &Limit, hits: u64, at: Instant, rng: &mut CoreRng) -> u64 {
    let mut want = hits.min(bucket.peek(limit, 0, at).remaining.max(1));
    while want > 0 {
        if bucket.check(limit, want, at, rng).allowed {
            return want;
        }
        want /= 2;
    }
    0
}

/// How many windows after an incomplete one the ideal limiter's state may still depend on what it
/// missed: the time its capacity takes to refill (a window algorithm's period), in windows, at
/// least one.
fn ideal_memory_windows(limit: &Limit, window_nanos: u64) -> u64 {
    refill_nanos(limit).div_ceil(window_nanos.max(1)).max(1)
}

/// The time `limit`'s capacity takes to refill, in nanoseconds (a window algorithm's period).
fn refill_nanos(limit: &Limit) -> u64 {
    let period = u128::from(duration_nanos(limit.spec().period));
    let refill = u128::from(limit.capacity()) * period / u128::from(limit.reported_limit().max(1));
    u64::try_from(refill).unwrap_or(u64::MAX)
}

/// Whether a member whose last pieces came at `pieces_at` still counts as a sender at `now` (and
/// so sends the owner a frame at least every [`KEEPALIVE_NANOS`]).
fn sender_active(pieces_at: Instant, now: Instant) -> bool {
    now.nanos_since(pieces_at) < SENDER_ACTIVE_NANOS + KEEPALIVE_NANOS
}

/// The earliest instant whose hits the state at `at` of a key under `limit` can depend on: the
/// start of its fixed (or calendar) window, of the sliding counter's previous window, or the time
/// its capacity takes to refill (the bucket algorithms, the log, the expiring counter).
fn history_start(limit: &Limit, at: Instant) -> Instant {
    let spec = limit.spec();
    let (t, period) = (at.as_nanos(), duration_nanos(spec.period).max(1));
    let from = match (spec.algorithm, spec.calendar) {
        (_, Some(window)) => window.start.as_nanos().min(t),
        (crate::limit::Algorithm::FixedWindow, None) => t - t % period,
        (crate::limit::Algorithm::SlidingWindowCounter, None) => (t - t % period).saturating_sub(period),
        _ => t.saturating_sub(refill_nanos(limit)),
    };
    Instant::from_nanos(from)
}

/// The limit over one audit window: the policy's limit scaled from its period to the window.
fn window_limit(limit: &Limit, window_nanos: u64) -> u64 {
    let period = duration_nanos(limit.spec().period).max(1);
    let scaled = u128::from(limit.reported_limit()) * u128::from(window_nanos) / u128::from(period);
    u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
}

impl Record {
    /// The hits of the windows still open, as pieces for the key's new owner (this node no longer
    /// owns the key: the two sides of a partition each owned it, and the side that gives it back
    /// hands over what it counted), ages counted back from `now`.
    fn hand_over(&self, key: KeyHash, now: Instant) -> Vec<AuditPiece> {
        let slot = self.slot_nanos();
        let mut pieces = Vec::new();
        for window in &self.open {
            let arrivals: u64 = window.arrivals.iter().fold(0, |sum: u64, &n| sum.saturating_add(n));
            let (mut seen, mut admitted_before) = (0u64, 0u64);
            for (s, &n) in window.arrivals.iter().enumerate() {
                if n == 0 {
                    continue;
                }
                seen = seen.saturating_add(n);
                // The window's admitted hits, spread like its arrivals (cumulative, rounded).
                let admitted_until =
                    (u128::from(window.admitted) * u128::from(seen) / u128::from(arrivals.max(1))) as u64;
                let admitted = admitted_until - admitted_before;
                admitted_before = admitted_until;
                let start = (window.index * SLOTS_PER_WINDOW + s as u64).saturating_mul(slot);
                pieces.push(AuditPiece {
                    key: key.0,
                    group: self.group,
                    window_nanos: self.window_nanos,
                    first_age_nanos: now.as_nanos().saturating_sub(start),
                    last_age_nanos: now.as_nanos().saturating_sub(start + slot - 1),
                    admitted,
                    refused: n.saturating_sub(admitted),
                });
            }
        }
        pieces
    }

    /// Whether the record has nothing more to say: no open window, and its last closed one
    /// older than the span.
    fn idle(&self, now: Instant) -> bool {
        let window = self.window_nanos;
        let last = self.done.back().map_or(0, |w| (w.index + 1).saturating_mul(window));
        self.open.is_empty() && last.saturating_add(AUDIT_SPAN_NANOS.max(2 * window)) < now.as_nanos()
    }
}

/// The sums of one group's closed windows at one window index.
#[derive(Clone, Copy, Debug, Default)]
struct GroupWindow {
    index: u64,
    complete: AuditSums,
    incomplete_keys: u64,
}

/// Sums over complete key windows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuditSums {
    /// Key windows summed.
    pub key_windows: u64,
    /// Hits the cluster admitted.
    pub admitted: u64,
    /// Hits an ideal single limiter would have admitted.
    pub ideal: u64,
    /// Hits that arrived.
    pub arrivals: u64,
    /// Hits admitted above the ideal, window by window (`Σ max(0, admitted − ideal)`).
    pub over_admitted: u64,
    /// Hits refused that the ideal would have admitted, window by window (`Σ max(0, ideal −
    /// admitted)`: a lower bound, exact when the cluster refused a subset of what the ideal did).
    pub false_refused: u64,
    /// The worst key window: admitted hits and that window's limit (the largest ratio).
    pub worst: Option<(u64, u64)>,
}

impl AuditSums {
    fn add(&mut self, w: &AuditWindow) {
        self.key_windows += 1;
        self.admitted = self.admitted.saturating_add(w.admitted);
        self.ideal = self.ideal.saturating_add(w.ideal);
        self.arrivals = self.arrivals.saturating_add(w.arrivals);
        self.over_admitted = self.over_admitted.saturating_add(w.admitted.saturating_sub(w.ideal));
        self.false_refused = self.false_refused.saturating_add(w.ideal.saturating_sub(w.admitted));
        let worse = |(a, l): (u64, u64)| {
            u128::from(w.admitted) * u128::from(l) > u128::from(a) * u128::from(w.window_limit)
        };
        if self.worst.is_none_or(worse) {
            self.worst = Some((w.admitted, w.window_limit));
        }
    }

    /// Adds `other`'s sums (another node's, another lane's: each key has one owner, so sums add).
    pub fn merge(&mut self, other: &AuditSums) {
        self.key_windows += other.key_windows;
        self.admitted = self.admitted.saturating_add(other.admitted);
        self.ideal = self.ideal.saturating_add(other.ideal);
        self.arrivals = self.arrivals.saturating_add(other.arrivals);
        self.over_admitted = self.over_admitted.saturating_add(other.over_admitted);
        self.false_refused = self.false_refused.saturating_add(other.false_refused);
        if let Some((a, l)) = other.worst {
            let worse =
                |(wa, wl): (u64, u64)| u128::from(a) * u128::from(wl) > u128::from(wa) * u128::from(l);
            if self.worst.is_none_or(worse) {
                self.worst = Some((a, l));
            }
        }
    }
}

/// One group's audit figures at this node (the keys it owns), over the last minute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuditFigures {
    /// The group ([`Audit::On`]'s `group`: the driver's policy).
    pub group: u64,
    /// The window length.
    pub window: Duration,
    /// Sums over the complete key windows.
    pub sums: AuditSums,
    /// Key windows left out as incomplete (the owner did not see all of them).
    pub incomplete_key_windows: u64,
}

/// One key's audit figures over the last minute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuditKeyFigures {
    /// The key.
    pub key: KeyHash,
    /// Its group.
    pub group: u64,
    /// Its window length.
    pub window: Duration,
    /// Sums over its complete windows.
    pub sums: AuditSums,
    /// Its windows left out as incomplete.
    pub incomplete_windows: u64,
}

/// The audit's counters at one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuditStats {
    /// Keys audited now (records).
    pub keys: u64,
    /// Keys are audited when this many top bits of their hash are zero (0: every key).
    pub sample_bits: u32,
    /// Hits reported for windows already closed (or before the owner audited the key): not
    /// counted in any window.
    pub late_hits: u64,
    /// Pieces for keys this node does not own (a view changed): dropped.
    pub stray_pieces: u64,
    /// Hits not counted at all: the tallies were full (as many keys as the key table holds).
    pub tally_overflow_hits: u64,
}

impl AuditStats {
    /// Adds `other`'s counters (another lane's): keys and hits add up, the sample is the
    /// narrowest.
    pub fn merge(&mut self, other: &AuditStats) {
        let AuditStats { keys, sample_bits, late_hits, stray_pieces, tally_overflow_hits } = *other;
        self.keys = self.keys.saturating_add(keys);
        self.sample_bits = self.sample_bits.max(sample_bits);
        self.late_hits = self.late_hits.saturating_add(late_hits);
        self.stray_pieces = self.stray_pieces.saturating_add(stray_pieces);
        self.tally_overflow_hits = self.tally_overflow_hits.saturating_add(tally_overflow_hits);
    }
}

/// The owner-side audit of a node: which keys it audits, and the figures per group.
#[derive(Debug)]
pub(crate) struct AuditBook {
    /// The keys this node audits as their owner (at most `audit_keys_max`).
    /// (A hash map: one probe on the check's path, where an index map takes two.)
    records: HashMap<KeyHash, Record, KeyHasherBuilder>,
    /// Hits this node answered of keys others own, not sent yet (at most the key table's
    /// `keys_max` keys; hits beyond are counted in `AuditStats::tally_overflow_hits`).
    tallies: IndexMap<KeyHash, Tally, KeyHasherBuilder>,
    groups: BTreeMap<(u64, u64), VecDeque<GroupWindow>>,
    /// When a ring member was last seen unreachable (or the view changed): windows close a settle
    /// time after it.
    disturbed_at: Instant,
    /// Owner side: the members that sent pieces lately, and when the last came. Until
    /// [`SENDER_ACTIVE_NANOS`] after it, a window closes only once each was heard from a settle
    /// time after its end (a member cut off holds the windows of its cut open).
    senders: BTreeMap<NodeId, Instant>,
    /// Member side: the owners this node sent pieces lately, and when; and when it last sent each
    /// a frame for the audit (pieces, or a heartbeat that says it is still there and has sent
    /// what it had).
    sent_to: BTreeMap<NodeId, (Instant, Instant)>,
    /// The last times members were believed dead (from, until; `None`: still): windows open then
    /// are incomplete.
    dead_periods: VecDeque<(Instant, Option<Instant>)>,
    /// When a member last left the view: windows open then are incomplete.
    departed_at: Option<Instant>,
    /// Before this instant this node may not know a key's history: when it started, and when it
    /// last saw its key table evict a key (`evicted_seen`: the table's count then) to make room.
    history_from: Instant,
    evicted_seen: u64,
    rng: CoreRng,
    stats: AuditStats,
}

impl AuditBook {
    pub fn new(seed: u64, now: Instant) -> AuditBook {
        AuditBook {
            records: HashMap::default(),
            tallies: IndexMap::default(),
            groups: BTreeMap::new(),
            disturbed_at: Instant::ZERO,
            senders: BTreeMap::new(),
            sent_to: BTreeMap::new(),
            dead_periods: VecDeque::new(),
            departed_at: None,
            history_from: now,
            evicted_seen: 0,
            rng: rand::SeedableRng::seed_from_u64(seed ^ AUDIT_RNG_SALT),
            stats: AuditStats::default(),
        }
    }

    fn sampled(&self, key: KeyHash) -> bool {
        sampled_at(key, self.stats.sample_bits)
    }

    fn add_to_group(&mut self, group: (u64, u64), window: &AuditWindow) {
        let windows = self.groups.entry(group).or_default();
        let position = windows.iter().position(|w| w.index >= window.index);
        let at = match position {
            Some(p) if windows[p].index == window.index => p,
            Some(p) => {
                windows.insert(p, GroupWindow { index: window.index, ..GroupWindow::default() });
                p
            }
            None => {
                windows.push_back(GroupWindow { index: window.index, ..GroupWindow::default() });
                windows.len() - 1
            }
        };
        match window.complete {
            true => windows[at].complete.add(window),
            false => windows[at].incomplete_keys += 1,
        }
        let keep = AUDIT_SPAN_NANOS.div_ceil(group.1).max(1);
        let newest = windows.back().map_or(0, |w| w.index);
        while windows.front().is_some_and(|w| w.index + keep < newest) {
            windows.pop_front();
        }
    }
}

impl Node {
    /// How long after its first hit a follower's piece goes to the owner at the earliest.
    pub(super) fn audit_flush_nanos(&self) -> u64 {
        2 * duration_nanos(self.config.sync_interval)
    }

    /// How long after the end of a window of `window_nanos` (and after every ring member was last
    /// unreachable) the owner closes it: a sparse piece's span and its longest wait for a frame
    /// to ride (each up to half the window, at most a second), two rounds and a margin.
    pub(super) fn audit_settle_nanos(&self, window_nanos: u64) -> u64 {
        self.audit_flush_nanos()
            + 2 * sparse_span_nanos(window_nanos)
            + 2 * duration_nanos(self.config.sync_interval)
            + duration_nanos(self.config.peer_silence) / 4
    }

    /// Whether the audit runs on this node (`NodeConfig::audit_keys_max` > 0).
    fn audit_on(&self) -> bool {
        self.config.audit_keys_max > 0
    }

    /// The slot an owner's own check of `key` counts in (its [`Hot`] counts, in the key's
    /// entry), if the key is audited here: no probe of the records.
    pub(super) fn audit_slot(&self, key: KeyHash, policy: &Policy, cost: u64, now: Instant) -> Option<u64> {
        // A key out of the sample has no record, and gets none.
        if cost == 0 || !self.audit_on() || policy.audit == Audit::Off || !self.audit.sampled(key) {
            return None;
        }
        let window = window_nanos(&policy.limit, policy.audit)?;
        Some(now.as_nanos() / (window / SLOTS_PER_WINDOW).max(1))
    }

    /// An earlier slot's own checks of `key` (its [`Hot`] counts) into the key's record, begun
    /// here if the key is to be audited. The checks an owner decides for other nodes are counted
    /// where they were answered.
    pub(super) fn audit_fold(&mut self, key: KeyHash, policy: &Policy, hot: Hot, now: Instant) {
        let Some(window) = window_nanos(&policy.limit, policy.audit) else { return };
        let slot_nanos = (window / SLOTS_PER_WINDOW).max(1);
        // A slot past counts at its start; the current one (an entry's first check) at `now`, where
        // a record it begins starts.
        let at = match hot.slot == now.as_nanos() / slot_nanos {
            true => now,
            false => Instant::from_nanos(hot.slot.saturating_mul(slot_nanos)),
        };
        let (admitted, refused) = (hot.admitted, hot.arrivals.saturating_sub(hot.admitted));
        if let Some(record) = self.audit.records.get_mut(&key) {
            if record.limit.spec() == policy.limit.spec() && record.window_nanos == window {
                let late = record.add_at(at, admitted, refused);
                self.audit.stats.late_hits = self.audit.stats.late_hits.saturating_add(late);
                return;
            }
            // The key's limit changed (an override): audited afresh against the new one.
            self.audit.records.remove(&key);
        }
        let hits = Hits { from: at, to: at, admitted, refused };
        self.audit_adopt(key, policy.audit, &policy.limit, hits, now);
    }

    /// A check of `key` decided here as its owner, outside the check's path (an answer that came
    /// back after this node became the owner): counted at once.
    fn audit_decided(&mut self, key: KeyHash, policy: &Policy, now: Instant, cost: u64, allowed: bool) {
        let Some(slot) = self.audit_slot(key, policy, cost, now) else { return };
        let admitted = if allowed { cost } else { 0 };
        self.audit_fold(key, policy, Hot { slot, admitted, arrivals: cost }, now);
    }

    /// A check this node answered its client for a key another node owns (from an allowance,
    /// refused unasked or while its share is spent, by the fallback, or forwarded and answered):
    /// into the key's tally, for its owner (counted here when this node owns the key by now).
    pub(super) fn audit_answered(
        &mut self,
        key: KeyHash,
        policy: &Policy,
        now: Instant,
        cost: u64,
        allowed: bool,
    ) {
        if cost == 0 || !self.audit_on() {
            return;
        }
        let (Some(window), Audit::On { group, .. }) =
            (window_nanos(&policy.limit, policy.audit), policy.audit)
        else {
            return;
        };
        let owner = self.ring.owner(key).unwrap_or(self.id);
        if owner == self.id {
            return self.audit_decided(key, policy, now, cost, allowed);
        }
        let full = self.audit.tallies.len() >= self.config.store.keys_max;
        let tally = match self.audit.tallies.get_mut(&key) {
            Some(tally) => tally,
            None if full => {
                self.audit.stats.tally_overflow_hits =
                    self.audit.stats.tally_overflow_hits.saturating_add(cost);
                return;
            }
            None => self.audit.tallies.entry(key).or_insert(Tally::new(owner)),
        };
        tally.owner = owner;
        tally.add(now, cost, allowed, (group, window, small_hits(&policy.limit, window)));
    }

    /// Begins `key`'s record with `hits` if the key is to be audited: its policy says so, it is
    /// in the sample, and (past the cap) the sample narrows until the records fit. A key born
    /// here ([`KeyMeta::born`]) whose history this node knows is whole from its first window.
    fn audit_adopt(&mut self, key: KeyHash, audit: Audit, limit: &Limit, hits: Hits, now: Instant) {
        let (Some(window), Audit::On { group, .. }) = (window_nanos(limit, audit), audit) else { return };
        if !self.audit.sampled(key) {
            return;
        }
        let born = self.keys.extra_mut(key).and_then(|meta| meta.born.take());
        let mut record = match born.filter(|&born| self.history_known(limit, born, now)) {
            Some(born) => Record::born(group, window, limit, born),
            None => Record::new(group, window, limit, hits.from),
        };
        let late = record.add(hits.from, hits.to, hits.admitted, hits.refused);
        self.audit.stats.late_hits = self.audit.stats.late_hits.saturating_add(late);
        self.audit.records.insert(key, record);
        while self.audit.records.len() > self.config.audit_keys_max && self.audit.stats.sample_bits < 128 {
            self.audit.stats.sample_bits += 1;
            let book = &mut self.audit;
            let bits = book.stats.sample_bits;
            book.records.retain(|&k, _| sampled_at(k, bits));
        }
        self.audit.stats.keys = self.audit.records.len() as u64;
    }

    /// Whether a key of `limit` born here at `born` had no history before: nothing since the
    /// earliest instant its state at `born` could depend on ([`history_start`]) may have escaped
    /// this node — it ran, its view and every member stayed as they were, and it evicted no key.
    fn history_known(&mut self, limit: &Limit, born: Instant, now: Instant) -> bool {
        let evicted = self.keys.stats().evicted;
        if evicted != self.audit.evicted_seen {
            (self.audit.evicted_seen, self.audit.history_from) = (evicted, now);
        }
        let unsure_until = self.audit.history_from.max(self.audit.disturbed_at);
        unsure_until <= history_start(limit, born)
    }

    /// Pieces from `from`, a node that answered checks of keys this node owns.
    pub(super) fn on_audit(&mut self, from: NodeId, pieces: Vec<AuditPiece>, now: Instant) {
        if pieces.is_empty() {
            return;
        }
        if from != self.id {
            self.audit.senders.insert(from, now);
        }
        let half_rtt = self.peers.srtt_nanos(from).unwrap_or(0) / 2;
        for piece in pieces {
            let key = KeyHash(piece.key);
            let back =
                |age: u64| Instant::from_nanos(now.as_nanos().saturating_sub(age.saturating_add(half_rtt)));
            let hits = Hits {
                from: back(piece.first_age_nanos.max(piece.last_age_nanos)),
                to: back(piece.last_age_nanos),
                admitted: piece.admitted,
                refused: piece.refused,
            };
            if self.ring.owner(key) != Some(self.id) {
                self.audit.stats.stray_pieces += 1;
                continue;
            }
            if let Some(record) = self.audit.records.get_mut(&key) {
                let late = record.add(hits.from, hits.to, hits.admitted, hits.refused);
                self.audit.stats.late_hits = self.audit.stats.late_hits.saturating_add(late);
                continue;
            }
            // Window 0: the group and window were told before; a record that is gone (the
            // sample narrowed) is not begun again from such a piece.
            let limit = self.keys.extra(key).map(|meta| meta.policy.limit.clone());
            let (Some(limit), true) = (limit, piece.window_nanos > 0) else {
                self.audit.stats.stray_pieces += 1;
                continue;
            };
            let window = Some(Duration::from_nanos(piece.window_nanos));
            self.audit_adopt(key, Audit::On { group: piece.group, window }, &limit, hits, now);
        }
    }

    /// At the end of a sync round, every other round: sends the tallies due (their oldest hit a
    /// flush old, a sparse piece grown) to their owners — with a frame the round sends the owner
    /// anyway, or alone once one has waited as long as a sparse piece may grow. An owner that is
    /// unreachable gets them when it is back; this node's own keys (it became their owner) are
    /// counted here.
    pub(super) fn audit_send(&mut self, now: Instant) {
        if !self.due_epoch.is_multiple_of(2) {
            return;
        }
        if !self.audit_on() {
            self.audit.tallies.clear();
            return;
        }
        // The owners sent pieces lately hear from this node even when it has none (below).
        if self.audit.tallies.is_empty() {
            return self.audit_keepalives(now);
        }
        let flush = self.audit_flush_nanos();
        // The owners that get pieces this round.
        let mut owners: Vec<NodeId> = Vec::new();
        for tally in self.audit.tallies.values().filter(|t| t.due(now, flush)) {
            let overdue = tally
                .oldest()
                .is_some_and(|at| now.nanos_since(at) >= flush + 2 * sparse_span_nanos(tally.window_nanos));
            let riding = self.outgoing.contains_key(&tally.owner) || tally.owner == self.id;
            // An owner out of reach gets its pieces when it is back.
            let reachable = tally.owner == self.id || self.peers.reachable(tally.owner, now);
            if (riding || overdue) && reachable && !owners.contains(&tally.owner) {
                owners.push(tally.owner);
            }
        }
        let mut pieces: BTreeMap<NodeId, Vec<AuditPiece>> = BTreeMap::new();
        for (&key, tally) in self.audit.tallies.iter_mut() {
            if owners.contains(&tally.owner) && tally.due(now, flush) {
                let owner = tally.owner;
                pieces.entry(owner).or_default().extend(tally.take(key, owner, now));
            }
        }
        // An empty tally is kept while its owner knows the key's group (a later piece can leave
        // it out).
        self.audit.tallies.retain(|_, t| {
            t.oldest().is_some()
                || t.announced.is_some_and(|(_, at)| now.nanos_since(at) < ANNOUNCE_EVERY_NANOS)
        });
        for (owner, pieces) in pieces {
            if owner == self.id {
                self.on_audit(owner, pieces, now);
                continue;
            }
            for chunk in pieces.chunks(self.config.sync_batch_len_max.max(1)) {
                self.send(owner, Body { audit: chunk.to_vec(), ..Body::default() }, now);
            }
            self.audit.sent_to.insert(owner, (now, now));
        }
        self.audit_keepalives(now);
    }

    /// A member that sent an owner pieces lately sends it a frame at least every
    /// [`KEEPALIVE_NANOS`] (a heartbeat when nothing else goes): the owner, which waits to hear
    /// from its recent senders before it closes a window, tells a member that is quiet from one
    /// that is cut off.
    fn audit_keepalives(&mut self, now: Instant) {
        self.audit.sent_to.retain(|_, (pieces_at, _)| now.nanos_since(*pieces_at) < SENDER_ACTIVE_NANOS);
        let due: Vec<NodeId> = self
            .audit
            .sent_to
            .iter()
            .filter(|(owner, (_, frame_at))| {
                !self.outgoing.contains_key(owner) && now.nanos_since(*frame_at) >= KEEPALIVE_NANOS
            })
            .map(|(&owner, _)| owner)
            .collect();
        for owner in due {
            // An empty frame, sequenced (acknowledged) like a probe: `send` leaves empty bodies out.
            if self.peers.reachable(owner, now)
                && let Some(transmit) = self.peers.send(owner, Body::default(), now).ok().flatten()
            {
                self.transmits.push_back(transmit);
                if let Some((_, frame_at)) = self.audit.sent_to.get_mut(&owner) {
                    *frame_at = now;
                }
            }
        }
        for (owner, (_, frame_at)) in self.audit.sent_to.iter_mut() {
            if self.outgoing.contains_key(owner) {
                *frame_at = now;
            }
        }
    }

    /// At the start of every sync round: notes whether a ring member is unreachable; every
    /// [`CLOSE_EVERY_ROUNDS`] rounds, closes the windows that are due and drops the records of
    /// keys this node no longer owns or that have gone quiet.
    pub(super) fn audit_round(&mut self, now: Instant) {
        // A member unreachable, or a recent sender silent past its keepalives (cut off: what it
        // answered meanwhile comes after it is back, a flush and a ride later).
        let silent =
            |m: &NodeId| self.peers.heard_at(*m).is_none_or(|at| now.nanos_since(at) > 2 * KEEPALIVE_NANOS);
        let unreachable = self.members.iter().any(|&m| m != self.id && !self.peers.reachable(m, now));
        if unreachable || self.audit.senders.keys().any(silent) {
            self.audit.disturbed_at = now;
        }
        if !self.due_epoch.is_multiple_of(CLOSE_EVERY_ROUNDS) || self.audit.records.is_empty() {
            return;
        }
        let settle_base = self.audit_settle_nanos(0);
        // What every recent sender has sent is in up to when it was last heard from.
        self.audit.senders.retain(|_, &mut at| sender_active(at, now));
        let heard = |m: &NodeId| self.peers.heard_at(*m).unwrap_or(Instant::ZERO);
        let watermark = self.audit.senders.keys().map(heard).min().unwrap_or(now).min(now);
        let regions = self.regions.active();
        let (ring, id, keys) = (&self.ring, self.id, &mut self.keys);
        let book = &mut self.audit;
        // The owner's own checks of a slot past: into the records (a key checked no more).
        for (&key, record) in book.records.iter_mut() {
            let slot = now.as_nanos() / record.slot_nanos();
            let limit = record.limit.clone();
            if let Some(Some(hot)) = keys.update(key, &limit, |_, meta| meta.audit_hot.take_before(slot)) {
                let at = Instant::from_nanos(hot.slot.saturating_mul(record.slot_nanos()));
                let late = record.add_at(at, hot.admitted, hot.arrivals.saturating_sub(hot.admitted));
                book.stats.late_hits = book.stats.late_hits.saturating_add(late);
            }
        }
        let (disturbed_at, departed) = (book.disturbed_at, book.departed_at.map(|at| at.as_nanos()));
        let dead_periods = book.dead_periods.clone();
        let mut closed_all: Vec<((u64, u64), AuditWindow)> = Vec::new();
        let mut handed: BTreeMap<NodeId, Vec<AuditPiece>> = BTreeMap::new();
        book.records.retain(|&key, record| {
            if let Some(owner) = ring.owner(key).filter(|&o| o != id) {
                handed.entry(owner).or_default().extend(record.hand_over(key, now));
                return false;
            }
            let window = record.window_nanos;
            let settle = settle_base + 2 * sparse_span_nanos(window);
            let calm = now >= disturbed_at.add_nanos(settle);
            let until_index = if calm { watermark.as_nanos().saturating_sub(settle) / window } else { 0 };
            // A window still open when a member was forgotten (it left the view for good) may
            // lack what that member answered: incomplete.
            let incomplete = |index: u64| {
                let start = index.saturating_mul(window);
                let end = (index + 1).saturating_mul(window).saturating_add(settle);
                let dead = dead_periods.iter().any(|&(from, until)| {
                    from.as_nanos() < end && until.is_none_or(|u| u.as_nanos() > start)
                });
                regions || dead || departed.is_some_and(|d| start <= d)
            };
            for w in record.close(until_index, incomplete, &mut book.rng) {
                closed_all.push(((record.group, window), w));
            }
            record.trim(now.as_nanos() / window);
            !record.idle(now)
        });
        for (group, window) in closed_all {
            book.add_to_group(group, &window);
        }
        book.stats.keys = book.records.len() as u64;
        for (owner, pieces) in handed {
            for chunk in pieces.chunks(self.config.sync_batch_len_max.max(1)) {
                self.send(owner, Body { audit: chunk.to_vec(), ..Body::default() }, now);
            }
            self.audit.sent_to.insert(owner, (now, now));
        }
    }

    /// Since when the audit counts `member`, believed dead at `now`, as perhaps answering by
    /// itself: a member that sent this node pieces lately (and so a frame at least every
    /// [`KEEPALIVE_NANOS`]) since it was last heard from — its side may have seen this node die
    /// first and answered by its fallback meanwhile; another, from now.
    pub(super) fn audit_dead_since(&self, member: NodeId, now: Instant) -> Instant {
        let recent = self.audit.senders.get(&member).is_some_and(|&at| sender_active(at, now));
        match (recent, self.peers.heard_at(member)) {
            (true, Some(at)) => at.min(now),
            _ => now,
        }
    }

    /// A view change at `now`: windows open now close only a settle time later, those open when
    /// a member was `forgotten` (gone from the view's live and dead members) are incomplete, and
    /// tallies go to their keys' owners in the new ring. When members `returned` to the ring
    /// (believed dead before: back from a partition, whose side owned keys on its own meanwhile
    /// and hands their windows over once it sees the heal too), windows wait
    /// [`HANDOFF_GRACE_NANOS`] more.
    ///
    /// While members are believed dead (`dead_since`: since when, at the earliest), windows are
    /// incomplete: such a member may be alive behind a cut, its side owning the key on its own
    /// (from when this node last heard from it: its side may have seen this one die first, and
    /// answered by its fallback meanwhile); its windows come back with the handover at the heal,
    /// but the owner cannot tell that from a crash, nor when it will come.
    pub(super) fn audit_view_changed(
        &mut self,
        now: Instant,
        forgotten: bool,
        returned: bool,
        dead_since: Option<Instant>,
    ) {
        let grace = if returned { HANDOFF_GRACE_NANOS } else { 0 };
        self.audit.disturbed_at = self.audit.disturbed_at.max(now.add_nanos(grace));
        let periods = &mut self.audit.dead_periods;
        let ongoing = periods.back().is_some_and(|(_, until)| until.is_none());
        match (dead_since, ongoing) {
            (Some(since), false) => periods.push_back((since, None)),
            // Another member seen dead later may have been gone since before this period began.
            (Some(since), true) => {
                if let Some((from, _)) = periods.back_mut() {
                    *from = (*from).min(since);
                }
            }
            (None, true) => {
                if let Some((_, until)) = periods.back_mut() {
                    *until = Some(now);
                }
            }
            _ => {}
        }
        while periods.len() > DEAD_PERIODS_MAX {
            periods.pop_front();
        }
        if forgotten {
            self.audit.departed_at = Some(now);
        }
        let (ring, id) = (&self.ring, self.id);
        for (&key, tally) in self.audit.tallies.iter_mut() {
            tally.owner = ring.owner(key).unwrap_or(id);
        }
    }

    /// The audit's figures per group and window length over the last minute (or the last two
    /// windows, when windows are longer), from the keys this node owns.
    pub fn audit_figures(&self, now: Instant) -> Vec<AuditFigures> {
        let figures = self.audit.groups.iter().map(|(&(group, window), windows)| {
            let since = now.as_nanos().saturating_sub(AUDIT_SPAN_NANOS.max(2 * window));
            let mut sums = AuditSums::default();
            let mut incomplete_key_windows = 0;
            for w in windows.iter().filter(|w| (w.index + 1).saturating_mul(window) >= since) {
                sums.merge(&w.complete);
                incomplete_key_windows += w.incomplete_keys;
            }
            AuditFigures { group, window: Duration::from_nanos(window), sums, incomplete_key_windows }
        });
        figures.filter(|f| f.sums.key_windows + f.incomplete_key_windows > 0).collect()
    }

    /// The `n` keys this node owns with the most hits admitted above the ideal over the last
    /// minute (ties: the highest admitted/limit ratio), in `group` if given.
    pub fn audit_worst_keys(&self, group: Option<u64>, n: usize, now: Instant) -> Vec<AuditKeyFigures> {
        let records = self.audit.records.iter().filter(|(_, r)| group.is_none_or(|g| g == r.group));
        let mut keys: Vec<AuditKeyFigures> = records
            .map(|(&key, record)| {
                let window = record.window_nanos;
                let since = now.as_nanos().saturating_sub(AUDIT_SPAN_NANOS.max(2 * window));
                let mut sums = AuditSums::default();
                let mut incomplete_windows = 0;
                for w in record.done.iter().filter(|w| (w.index + 1).saturating_mul(window) >= since) {
                    match w.complete {
                        true => sums.add(w),
                        false => incomplete_windows += 1,
                    }
                }
                let window = Duration::from_nanos(window);
                AuditKeyFigures { key, group: record.group, window, sums, incomplete_windows }
            })
            .collect();
        let ratio = |f: &AuditKeyFigures| {
            f.sums.worst.map_or(0, |(a, l)| u128::from(a) * 1_000_000 / u128::from(l.max(1)))
        };
        keys.sort_by(|a, b| {
            let by_over = b.sums.over_admitted.cmp(&a.sums.over_admitted);
            by_over.then(ratio(b).cmp(&ratio(a))).then(a.key.cmp(&b.key))
        });
        keys.truncate(n);
        keys
    }

    /// The closed windows of `key` this node keeps (the last minute's), oldest first: for tests
    /// and the simulator's comparison with its oracle.
    pub fn audit_windows(&self, key: KeyHash) -> Vec<AuditWindow> {
        self.audit.records.get(&key).map_or_else(Vec::new, |r| r.done.iter().copied().collect())
    }

    /// The audit's counters.
    pub fn audit_stats(&self) -> AuditStats {
        self.audit.stats
    }
}

/// Whether `key` is in the sample of keys audited when `bits` top bits must be zero.
fn sampled_at(key: KeyHash, bits: u32) -> bool {
    bits == 0 || (bits < 128 && key.0 >> (128 - bits) == 0)
}

/// Hits spread over `[from, to]` on the owner's clock.
#[derive(Clone, Copy, Debug)]
struct Hits {
    from: Instant,
    to: Instant,
    admitted: u64,
    refused: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, LimitSpec};
    use rand::SeedableRng;

    const SECOND: u64 = 1_000_000_000;

    fn limit() -> Limit {
        Limit::new(LimitSpec::new(Algorithm::TokenBucket, 100, Duration::from_secs(1))).expect("valid")
    }

    fn at(nanos: u64) -> Instant {
        Instant::from_nanos(nanos)
    }

    #[test]
    fn a_tally_tells_each_owner_the_group_once_and_splits_pieces_by_slot() {
        let mut tally = Tally::new(NodeId(2));
        for ms in [0, 40, 99, 100, 150] {
            tally.add(at(10 * SECOND + ms * 1_000_000), 1, ms != 150, (7, SECOND, 0));
        }
        let now = at(10 * SECOND + 200_000_000);
        let first = tally.take(KeyHash(1), NodeId(2), now);
        assert_eq!(first.len(), 2, "pieces of at most a tenth of the window: {first:?}");
        assert_eq!((first[0].admitted, first[0].refused), (3, 0));
        assert_eq!((first[1].admitted, first[1].refused), (1, 1));
        assert_eq!((first[0].first_age_nanos, first[0].last_age_nanos), (200_000_000, 101_000_000));
        assert!(first.iter().all(|p| (p.group, p.window_nanos) == (7, SECOND)), "{first:?}");
        tally.add(now, 1, true, (7, SECOND, 0));
        let again = tally.take(KeyHash(1), NodeId(2), now);
        assert_eq!((again[0].group, again[0].window_nanos), (0, 0), "told already");
        tally.add(now, 1, true, (7, SECOND, 0));
        let moved = tally.take(KeyHash(1), NodeId(3), now);
        assert_eq!((moved[0].group, moved[0].window_nanos), (7, SECOND), "a new owner is told");
        assert!(tally.oldest().is_none());
    }

    #[test]
    fn a_sparse_key_sends_a_piece_per_half_window_not_one_per_hit() {
        let mut tally = Tally::new(NodeId(2));
        let flush = 100_000_000;
        for ms in [0, 150, 300, 450] {
            let now = at(SECOND + ms * 1_000_000);
            tally.add(now, 1, true, (7, SECOND, 4));
            assert!(!tally.due(now, flush), "few hits: the piece grows");
        }
        assert!(tally.due(at(SECOND + 500_000_000), flush), "half a window old");
        assert_eq!(tally.take(KeyHash(1), NodeId(2), at(SECOND + 500_000_000)).len(), 1);
        // Past `small` hits a piece is dense again: split by tenths of the window.
        for ms in [0, 10, 20, 30, 40, 150] {
            tally.add(at(2 * SECOND + ms * 1_000_000), 1, true, (7, SECOND, 4));
        }
        assert!(tally.due(at(2 * SECOND + 150_000_000), flush));
        assert_eq!(tally.take(KeyHash(1), NodeId(2), at(2 * SECOND + 150_000_000)).len(), 2);
    }

    #[test]
    fn a_record_spreads_hits_over_slots_and_counts_closed_windows_late() {
        let limit = limit();
        let mut record = Record::new(0, SECOND, &limit, at(3 * SECOND));
        let mut rng = CoreRng::seed_from_u64(1);
        // 40 hits over [3.9 s, 4.1 s]: half in window 3, half in window 4.
        assert_eq!(record.add(at(3_900_000_000), at(4_100_000_000), 30, 10), 0);
        let closed = record.close(4, |_| false, &mut rng);
        assert_eq!(closed.len(), 1);
        let w = closed[0];
        assert_eq!((w.index, w.admitted, w.arrivals, w.complete), (3, 15, 20, true), "{w:?}");
        assert_eq!(w.ideal, 20, "a fresh bucket admits all 20: {w:?}");
        // Window 3 is closed: its hits come too late now.
        assert_eq!(record.add(at(3_500_000_000), at(3_500_000_000), 5, 0), 5);
        // A span reaching back before every open window: the part before is late, by proportion.
        let late = record.add(at(0), at(4_999_999_999), 50, 0);
        assert_eq!(late, 40, "four fifths of the span were before window 4");
    }

    #[test]
    fn a_record_closes_windows_by_force_beyond_the_open_bound() {
        let limit = limit();
        let mut record = Record::new(0, SECOND, &limit, at(0));
        let mut rng = CoreRng::seed_from_u64(1);
        for s in 0..(WINDOWS_OPEN_MAX as u64 + 3) {
            record.add(at(s * SECOND), at(s * SECOND), 1, 0);
        }
        let closed = record.close(0, |_| false, &mut rng);
        assert_eq!(closed.len(), 3, "the three oldest beyond the bound");
        assert!(closed.iter().all(|w| !w.complete), "closed by force: incomplete {closed:?}");
        assert_eq!(record.open.len(), WINDOWS_OPEN_MAX);
    }

    /// After a window that lacked hits, the ideal is trusted again once its memory of it is
    /// gone: a fixed window's at the end of the fixed window (at once when audit windows are the
    /// fixed windows), a bucket's once its capacity has refilled.
    #[test]
    fn the_ideal_is_trusted_again_once_it_forgot_a_partial_window() {
        let second = 1_000_000_000;
        let fixed =
            Limit::new(LimitSpec::new(Algorithm::FixedWindow, 10, Duration::from_secs(60))).expect("valid");
        assert_eq!(
            Record::new(0, 60 * second, &fixed, at(0)).trusted_after(5),
            6,
            "windows are the fixed ones"
        );
        assert_eq!(Record::new(0, second, &fixed, at(0)).trusted_after(5), 60, "the minute's end");
        assert_eq!(Record::new(0, second, &fixed, at(0)).trusted_after(59), 60);
        assert_eq!(Record::new(0, second, &limit(), at(0)).trusted_after(5), 7, "a second's refill");
        let sliding =
            Limit::new(LimitSpec::new(Algorithm::SlidingWindowCounter, 10, Duration::from_secs(60)))
                .expect("valid");
        assert_eq!(Record::new(0, 60 * second, &sliding, at(0)).trusted_after(5), 7);
    }

    /// A key's history begins where its state at an instant can depend on hits.
    #[test]
    fn a_key_history_starts_where_its_state_forgets() {
        let s = |secs: u64| at(secs * 1_000_000_000);
        let of =
            |algorithm| Limit::new(LimitSpec::new(algorithm, 10, Duration::from_secs(60))).expect("valid");
        assert_eq!(history_start(&of(Algorithm::FixedWindow), s(130)), s(120));
        assert_eq!(history_start(&of(Algorithm::SlidingWindowCounter), s(130)), s(60));
        assert_eq!(history_start(&of(Algorithm::SlidingWindowLog), s(130)), s(70));
        assert_eq!(history_start(&limit(), s(130)), s(129), "a second's refill");
    }

    #[test]
    fn the_default_window_follows_the_algorithm() {
        let spec = |a, period| LimitSpec::new(a, 10, Duration::from_secs(period));
        let window = |a, period| window_nanos(&Limit::new(spec(a, period)).expect("valid"), Audit::default());
        assert_eq!(window(Algorithm::TokenBucket, 60), Some(SECOND));
        assert_eq!(window(Algorithm::FixedWindow, 60), Some(60 * SECOND));
        assert_eq!(window(Algorithm::SlidingWindowLog, 86_400), Some(3_600 * SECOND));
        assert_eq!(window(Algorithm::Concurrency, 60), None);
        let off = window_nanos(&limit(), Audit::Off);
        assert_eq!(off, None);
        let tiny = Audit::On { group: 0, window: Some(Duration::from_nanos(1)) };
        assert_eq!(window_nanos(&limit(), tiny), Some(WINDOW_NANOS_MIN), "a peer cannot ask for less");
    }
}
