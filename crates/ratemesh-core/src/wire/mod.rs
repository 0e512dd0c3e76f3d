//! Peer messages: versioned types of their own, encoded with postcard.
//!
//! Core types are not the wire format. The types here are a protocol contract: a field is never
//! reordered or retyped within a version; a change makes a new [`WIRE_VERSION`]. Every frame starts
//! with its version byte, then the postcard encoding of its serialized form (`codec.rs`).
//!
//! A frame carries everything a node has for one peer at once ([`Body`]: forwarded checks,
//! answers, reports, grants, states — any of them, possibly none: a heartbeat). The serialized
//! form is compact: only the sections present are written; the limits the items name are written
//! once per frame, in a table the items refer to by index (a limit is tens of bytes; an index,
//! one); key hashes are 16 fixed bytes (a 128-bit varint takes up to 19); numbers are varints.
//!
//! Decoding is bounded twice: a frame longer than the caller's `frame_len_max` is refused before
//! any parsing, and postcard never reads (or allocates for) more than the slice holds. Malformed,
//! truncated, oversized or unknown-version input is a [`WireError`], never a panic. Values are
//! then validated when they are turned into core types ([`LimitWire::to_limit`]). Only the canonical
//! encoding (the bytes [`encode`] produces) decodes: a frame has exactly one byte representation.

use crate::prelude::*;
use core::time::Duration;

use serde::{Deserialize, Serialize};

use crate::algorithm::Snapshot;
use crate::decision::{Decision, LeaseId};
mod codec;

use crate::limit::{Algorithm, CalendarWindow, Limit, LimitError, LimitSpec};
use crate::region::PolicyRegion;
use crate::time::{Instant, duration_nanos};

/// The wire version this build speaks.
pub const WIRE_VERSION: u8 = 4;
/// The default bound on one encoded frame: 1 MiB.
pub const FRAME_LEN_MAX_DEFAULT: usize = 1 << 20;

/// Why bytes from a peer are not a frame. The peer (or the network) is at fault; nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The input is empty.
    #[error("empty frame")]
    Empty,
    /// The frame is longer than the bound.
    #[error("frame of {len} bytes exceeds the bound of {max} bytes")]
    Oversized {
        /// The frame's length.
        len: usize,
        /// The bound in force.
        max: usize,
    },
    /// The frame is of a version this build does not speak.
    #[error("wire version {0} is not supported (this build speaks {WIRE_VERSION})")]
    Version(u8),
    /// The frame does not decode (malformed or truncated).
    #[error("malformed frame: {0}")]
    Malformed(postcard::Error),
    /// The frame decoded but is not in the one encoding [`encode`] produces (an overlong varint,
    /// sections out of order or empty, a limit table out of first-use order).
    #[error("non-canonical frame encoding")]
    NonCanonical,
    /// A limit names an algorithm code this build does not know.
    #[error("unknown algorithm code {0}")]
    UnknownAlgorithm(u8),
    /// An item refers to a limit the frame's table does not have.
    #[error("limit index {index} outside the frame's table of {len}")]
    LimitIndex {
        /// The index given.
        index: u32,
        /// The table's length.
        len: usize,
    },
    /// The frame names another sender than the authenticated one the transport reports.
    #[error("frame from {from} claims to be from {claimed}")]
    ForgedSender {
        /// The sender the transport authenticated.
        from: u64,
        /// The sender the frame names.
        claimed: u64,
    },
    /// The frame decoded but bytes were left over.
    #[error("{0} trailing bytes after the frame")]
    Trailing(usize),
    /// Encoding failed: the frame is larger than the bound.
    #[error("cannot encode a frame of {len} bytes over the bound of {max}")]
    TooLarge {
        /// The encoded length.
        len: usize,
        /// The bound in force.
        max: usize,
    },
    /// Encoding failed in postcard (cannot happen for frames this crate builds).
    #[error("cannot encode frame: {0}")]
    Encode(postcard::Error),
}

/// One message between peers: who sent it, delivery bookkeeping, and what it says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The sending node.
    pub from: u64,
    /// The sender's incarnation: a restarted node starts a new one, and its sequence numbers
    /// start again.
    pub incarnation: u64,
    /// Increases by one per sequenced frame this incarnation sends to the receiver; 0 for a
    /// heartbeat (not retransmitted, not acknowledged). Receivers drop sequence numbers seen before.
    pub seq: u64,
    /// Cumulative acknowledgement: the sender has received every sequenced frame of the
    /// receiver's current incarnation below this number.
    pub ack: u64,
    /// Selective acknowledgement: bit `i` set means the sender has received frame `ack + 1 + i`
    /// too (frames reordered by the network are not retransmitted for want of an ack).
    pub sack: u64,
    /// The sender's oldest frame to this receiver not yet acknowledged (or its next sequence
    /// number): lower numbers will never be sent again.
    pub una: u64,
    /// The message.
    pub body: Body,
}

/// What a frame says: every section may be empty (all empty: a heartbeat, which keeps
/// acknowledgements and reachability current).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Body {
    /// Checks forwarded to the owner of their keys.
    pub forward: Vec<ForwardCheck>,
    /// The owner's decisions, matched to the checks by `id`.
    pub decided: Vec<Decided>,
    /// Approximate mode: per key, what a holder admitted and gave back, and its demand.
    pub report: Vec<Report>,
    /// Approximate mode: per key, the owner's authoritative state and a new allowance.
    pub grant: Vec<Grant>,
    /// Ownership moved: the sender's state of keys the receiver now owns.
    pub handoff: Vec<KeyState>,
    /// The owner's state of keys the receiver would own if the owner failed (its ring successor).
    pub replica: Vec<KeyState>,
    /// Concurrency leases to release at the owner.
    pub release: Vec<Release>,
    /// Refunds and charges for the owner of their keys, answered in `decided` by `id`.
    pub adjust: Vec<Adjust>,
    /// Regions: a region's owner of a key to the key's home owner.
    pub region_report: Vec<RegionReport>,
    /// Regions: a home owner's lease to a region's owner of a key.
    pub region_grant: Vec<RegionGrant>,
    /// The audit: hits a node decided of keys the receiver owns (`node/audit.rs`).
    pub audit: Vec<AuditPiece>,
    /// The sender's clock when it sent the frame (nanoseconds of its own monotonic clock, which
    /// means nothing on another node), set when the frame carries audit pieces: their ages count
    /// back from it. The receiver learns from it how much longer than its fastest lately a frame
    /// took (a stream stalled behind a loss, a cut) and places the pieces back by as much.
    pub audit_clock_nanos: Option<u64>,
}

impl Body {
    /// Whether it says nothing (a heartbeat).
    pub fn is_empty(&self) -> bool {
        self.items() == 0
    }

    /// How many items it carries, over every section.
    pub fn items(&self) -> usize {
        self.forward.len()
            + self.decided.len()
            + self.report.len()
            + self.grant.len()
            + self.handoff.len()
            + self.replica.len()
            + self.release.len()
            + self.adjust.len()
            + self.region_report.len()
            + self.region_grant.len()
            + self.audit.len()
    }

    /// Ages the audit pieces by `nanos` (a retransmission, sent so long after the frame was
    /// first: their ages count back from each send).
    pub fn age_audit(&mut self, nanos: u64) {
        for piece in &mut self.audit {
            piece.first_age_nanos = piece.first_age_nanos.saturating_add(nanos);
            piece.last_age_nanos = piece.last_age_nanos.saturating_add(nanos);
        }
    }

    /// Coarsens every sliding window log and lease state it carries ([`SnapshotWire::coarsen`]):
    /// for an item no frame holds. Whether any was.
    pub fn coarsen_states(&mut self) -> bool {
        let grants = self.grant.iter_mut().map(|g| &mut g.state);
        let states = self.handoff.iter_mut().chain(self.replica.iter_mut()).map(|s| &mut s.state);
        let seeds = self.report.iter_mut().filter_map(|r| r.seed.as_mut());
        grants.chain(states).chain(seeds).fold(false, |any, state| state.coarsen() | any)
    }

    /// Keeps the first `keep` items (section by section, in order) and returns the others.
    pub fn split_off(&mut self, mut keep: usize) -> Body {
        fn split<T>(items: &mut Vec<T>, keep: &mut usize) -> Vec<T> {
            let at = (*keep).min(items.len());
            *keep -= at;
            items.split_off(at)
        }
        // Fields in declaration order: a struct expression evaluates them as written.
        Body {
            forward: split(&mut self.forward, &mut keep),
            decided: split(&mut self.decided, &mut keep),
            report: split(&mut self.report, &mut keep),
            grant: split(&mut self.grant, &mut keep),
            handoff: split(&mut self.handoff, &mut keep),
            replica: split(&mut self.replica, &mut keep),
            release: split(&mut self.release, &mut keep),
            adjust: split(&mut self.adjust, &mut keep),
            region_report: split(&mut self.region_report, &mut keep),
            region_grant: split(&mut self.region_grant, &mut keep),
            audit: split(&mut self.audit, &mut keep),
            audit_clock_nanos: self.audit_clock_nanos,
        }
    }

    /// Appends what `other` says (section by section, in order).
    pub fn append(&mut self, mut other: Body) {
        self.forward.append(&mut other.forward);
        self.decided.append(&mut other.decided);
        self.report.append(&mut other.report);
        self.grant.append(&mut other.grant);
        self.handoff.append(&mut other.handoff);
        self.replica.append(&mut other.replica);
        self.release.append(&mut other.release);
        self.adjust.append(&mut other.adjust);
        self.region_report.append(&mut other.region_report);
        self.region_grant.append(&mut other.region_grant);
        self.audit.append(&mut other.audit);
    }

    /// The name of its first non-empty section (`forward`, `decided`, `report`, `grant`,
    /// `handoff`, `replica`, `release`, `adjust`, `region_report`, `region_grant`, `audit`), or
    /// `heartbeat`:
    /// for traffic accounting.
    pub fn kind(&self) -> &'static str {
        let sections = [
            ("forward", self.forward.is_empty()),
            ("decided", self.decided.is_empty()),
            ("report", self.report.is_empty()),
            ("grant", self.grant.is_empty()),
            ("handoff", self.handoff.is_empty()),
            ("replica", self.replica.is_empty()),
            ("release", self.release.is_empty()),
            ("adjust", self.adjust.is_empty()),
            ("region_report", self.region_report.is_empty()),
            ("region_grant", self.region_grant.is_empty()),
            ("audit", self.audit.is_empty()),
        ];
        sections.into_iter().find(|(_, empty)| !empty).map_or("heartbeat", |(name, _)| name)
    }
}

/// A limit as it travels: the spec, checked again on arrival.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LimitWire {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Hits per period.
    pub limit: u64,
    /// The period in nanoseconds.
    pub period_nanos: u64,
    /// Burst, if set.
    pub burst: Option<u64>,
    /// Shaper delay, if set.
    pub delay: Option<u64>,
    /// The calendar window of a calendar-aligned fixed window.
    pub calendar: Option<CalendarWire>,
}

/// A calendar window as it travels: Unix time in nanoseconds, the same numbers on every node
/// (see [`crate::CalendarWindow`]: drivers of calendar limits run their clocks on Unix time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CalendarWire {
    /// The window's first instant.
    pub start_unix_nanos: u64,
    /// The next window's first instant.
    pub end_unix_nanos: u64,
}

impl LimitWire {
    /// The wire form of `limit`.
    pub fn from_limit(limit: &Limit) -> LimitWire {
        let spec = limit.spec();
        LimitWire {
            algorithm: spec.algorithm,
            limit: spec.limit,
            period_nanos: duration_nanos(spec.period),
            burst: spec.burst,
            delay: spec.delay,
            calendar: spec.calendar.map(|window| CalendarWire {
                start_unix_nanos: window.start.as_nanos(),
                end_unix_nanos: window.end.as_nanos(),
            }),
        }
    }

    /// The validated limit (a peer's parameters are checked like a user's).
    pub fn to_limit(&self) -> Result<Limit, LimitError> {
        let spec = LimitSpec {
            algorithm: self.algorithm,
            limit: self.limit,
            period: Duration::from_nanos(self.period_nanos),
            burst: self.burst,
            delay: self.delay,
            calendar: self.calendar.map(|window| CalendarWindow {
                start: Instant::from_nanos(window.start_unix_nanos),
                end: Instant::from_nanos(window.end_unix_nanos),
            }),
        };
        Limit::new(spec)
    }
}

/// A bucket's state as it travels (times relative to the sender's now).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotWire {
    /// See [`Snapshot::Tat`].
    Tat {
        /// Nanoseconds the theoretical arrival time is ahead of now.
        backlog_nanos: u64,
    },
    /// See [`Snapshot::Window`].
    Window {
        /// Nanoseconds since the current window started.
        elapsed_nanos: u64,
        /// Hits in the previous window.
        prev: u64,
        /// Hits in the current window.
        curr: u64,
    },
    /// See [`Snapshot::Log`]: `(age in nanoseconds, cost)`.
    Log(Vec<(u64, u64)>),
    /// See [`Snapshot::Leases`]: `(lease, slots, nanoseconds until expiry)`.
    Leases(Vec<(u64, u64, u64)>),
    /// See [`Snapshot::Calendar`] (added in wire version 2).
    Calendar {
        /// Nanoseconds since the window started.
        elapsed_nanos: u64,
        /// Nanoseconds until it ends.
        remaining_nanos: u64,
        /// Hits counted in it.
        curr: u64,
    },
}

impl SnapshotWire {
    /// Halves the entries of a sliding window log or of a concurrency limit's leases, each pair
    /// of neighbours merged into one; whether there was anything to merge. The state only grows
    /// more cautious: merged hits take the newer one's age (they leave the window later), merged
    /// leases the first one's id, both their slots and the later expiry (a release of the other
    /// id finds nothing, and its slots stay held until that expiry). Other states are as small
    /// as they come.
    pub fn coarsen(&mut self) -> bool {
        match self {
            SnapshotWire::Log(hits) if hits.len() >= 2 => {
                let pair = |pair: &[(u64, u64)]| {
                    let age = pair.iter().map(|&(age, _)| age).min().unwrap_or(0);
                    (age, pair.iter().fold(0u64, |sum, &(_, cost)| sum.saturating_add(cost)))
                };
                *hits = hits.chunks(2).map(pair).collect();
                true
            }
            SnapshotWire::Leases(leases) if leases.len() >= 2 => {
                let pair = |pair: &[(u64, u64, u64)]| {
                    let slots = pair.iter().fold(0u64, |sum, &(_, slots, _)| sum.saturating_add(slots));
                    let left = pair.iter().map(|&(_, _, left)| left).max().unwrap_or(0);
                    (pair[0].0, slots, left)
                };
                *leases = leases.chunks(2).map(pair).collect();
                true
            }
            _ => false,
        }
    }
}

impl From<Snapshot> for SnapshotWire {
    fn from(snapshot: Snapshot) -> Self {
        match snapshot {
            Snapshot::Tat { backlog_nanos } => SnapshotWire::Tat { backlog_nanos },
            Snapshot::Window { elapsed_nanos, prev, curr } => {
                SnapshotWire::Window { elapsed_nanos, prev, curr }
            }
            Snapshot::Log { hits } => SnapshotWire::Log(hits),
            Snapshot::Leases { leases } => SnapshotWire::Leases(
                leases.into_iter().map(|(id, slots, left)| (id.0, slots, left)).collect(),
            ),
            Snapshot::Calendar { elapsed_nanos, remaining_nanos, curr } => {
                SnapshotWire::Calendar { elapsed_nanos, remaining_nanos, curr }
            }
        }
    }
}

impl From<SnapshotWire> for Snapshot {
    fn from(wire: SnapshotWire) -> Self {
        match wire {
            SnapshotWire::Tat { backlog_nanos } => Snapshot::Tat { backlog_nanos },
            SnapshotWire::Window { elapsed_nanos, prev, curr } => {
                Snapshot::Window { elapsed_nanos, prev, curr }
            }
            SnapshotWire::Log(hits) => Snapshot::Log { hits },
            SnapshotWire::Leases(leases) => Snapshot::Leases {
                leases: leases.into_iter().map(|(id, slots, left)| (LeaseId(id), slots, left)).collect(),
            },
            SnapshotWire::Calendar { elapsed_nanos, remaining_nanos, curr } => {
                Snapshot::Calendar { elapsed_nanos, remaining_nanos, curr }
            }
        }
    }
}

/// A decision as it travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionWire {
    /// See [`Decision::allowed`].
    pub allowed: bool,
    /// See [`Decision::limit`].
    pub limit: u64,
    /// See [`Decision::remaining`].
    pub remaining: u64,
    /// See [`Decision::reset_after`], in nanoseconds.
    pub reset_after_nanos: u64,
    /// See [`Decision::retry_after`], in nanoseconds.
    pub retry_after_nanos: Option<u64>,
    /// See [`Decision::delay`], in nanoseconds.
    pub delay_nanos: u64,
    /// See [`Decision::lease`].
    pub lease: Option<u64>,
}

impl From<Decision> for DecisionWire {
    fn from(d: Decision) -> Self {
        DecisionWire {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            reset_after_nanos: duration_nanos(d.reset_after),
            retry_after_nanos: d.retry_after.map(duration_nanos),
            delay_nanos: duration_nanos(d.delay),
            lease: d.lease.map(|lease| lease.0),
        }
    }
}

impl From<DecisionWire> for Decision {
    fn from(w: DecisionWire) -> Self {
        Decision {
            allowed: w.allowed,
            limit: w.limit,
            remaining: w.remaining,
            reset_after: Duration::from_nanos(w.reset_after_nanos),
            retry_after: w.retry_after_nanos.map(Duration::from_nanos),
            delay: Duration::from_nanos(w.delay_nanos),
            lease: w.lease.map(LeaseId),
        }
    }
}

/// How a forwarded check's key is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireMode {
    /// Exact mode: the owner decides every check.
    Exact,
    /// Approximate mode: the owner may answer with an allowance for the sender.
    Approximate,
}

/// One forwarded check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardCheck {
    /// Chosen by the sender to match the answer.
    pub id: u64,
    /// The bucket.
    pub key: u128,
    /// The limit to check under.
    pub limit: LimitWire,
    /// Hits.
    pub cost: u64,
    /// The key's mode.
    pub mode: WireMode,
    /// Hits refused at the sender since its last forward of this key, without asking (the owner
    /// had said the key is over its limit for a while): demand the owner did not see, which its
    /// demand-proportional shares at overload must count.
    pub refused_here: u64,
    /// The policy's terms between regions: the owner reports the key to its home under them.
    pub region: PolicyRegion,
}

/// The owner's answer to one forwarded check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decided {
    /// The [`ForwardCheck::id`] answered.
    pub id: u64,
    /// The decision.
    pub decision: DecisionWire,
}

/// What a follower has to tell the owner of one key since its last report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The bucket.
    pub key: u128,
    /// The limit.
    pub limit: LimitWire,
    /// The follower's relationship with this owner; a new epoch restarts the owner's accounting.
    pub epoch: u64,
    /// The allowance the follower holds after this report.
    pub holding: u64,
    /// The sum of the grants the follower has applied in this epoch.
    pub granted_seen: u64,
    /// Hits admitted without an allowance (by the fallback): the owner debits them.
    pub uncovered: u64,
    /// Allowance given back: the owner credits it.
    pub returned: u64,
    /// Hits the owner admitted for checks this node had already decided by the fallback when
    /// the answer came (it timed out): the owner credits them, since its admission never reached
    /// the client (or the fallback's admission was debited as `uncovered` too).
    pub refunded: u64,
    /// Hits asked for per second, recently: the follower's demand.
    pub demand_per_s: u64,
    /// The follower's last authoritative state, sent once to a new owner to seed it.
    pub seed: Option<SnapshotWire>,
    /// The policy's terms between regions (see [`ForwardCheck::region`]).
    pub region: PolicyRegion,
}

/// A region's owner of a key to the key's home owner: its region's demand and the part of the
/// limit it enforces (`node/region.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionReport {
    /// The bucket.
    pub key: u128,
    /// The limit.
    pub limit: LimitWire,
    /// Hits asked for per second in the sender's region, recently.
    pub demand_per_s: u64,
    /// The number of this report (grants echo it).
    pub report_count: u64,
    /// The number of the last lease the sender applied (0: none yet).
    pub applied_seq: u64,
    /// The part of the limit's rate the sender enforces now.
    pub applied_part: u64,
    /// The policy's terms between regions: the home it pins, and what the sender's part falls
    /// to when its lease lapses (the home keeps reserved what the region may go on using).
    pub region: PolicyRegion,
}

/// A home owner's lease to a region's owner of a key: a part of the limit, for a while.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionGrant {
    /// The bucket.
    pub key: u128,
    /// The limit (a region's owner that no longer decides the key answers with it).
    pub limit: LimitWire,
    /// The lease's number (grows with every grant of the key's home owner).
    pub seq: u64,
    /// The part of the limit's rate the region may enforce.
    pub part: u64,
    /// How long the lease lasts, counted from the report it answers.
    pub lease_nanos: u64,
    /// The number of the report it answers (a push: the last one the home heard).
    pub report_count: u64,
    /// The key's first lease anywhere: the key is new, and the region may have its part of a
    /// full bucket.
    pub first: bool,
    /// The terms the report named ([`RegionReport::region`]): the receiver checks that the
    /// sender is the key's home owner under their home, and a release echoes them.
    pub region: PolicyRegion,
}

/// Hits a node decided itself of a key another node owns, for the owner's audit: a piece of at
/// most a tenth of the key's audit window (`node/audit.rs`). Ages count back from the frame's
/// send, so no clocks are compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditPiece {
    /// The bucket.
    pub key: u128,
    /// The audit group (the sender's policy).
    pub group: u64,
    /// The audit window's length.
    pub window_nanos: u64,
    /// How long before the send the piece's first hit was decided.
    pub first_age_nanos: u64,
    /// How long before the send its last hit was decided.
    pub last_age_nanos: u64,
    /// Hits admitted.
    pub admitted: u64,
    /// Hits refused.
    pub refused: u64,
}

/// The owner's answer to a report for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The bucket.
    pub key: u128,
    /// The epoch of the report answered; 0 for an allowance offered to a node whose checks the
    /// owner saw forwarded (it has not reported in any epoch the owner knows).
    pub epoch: u64,
    /// The authoritative state, after this grant was debited.
    pub state: SnapshotWire,
    /// New allowance: hits the receiver may admit without asking.
    pub grant: u64,
    /// The most the receiver should hold: it gives back any excess at its next report (the
    /// owner's share for it shrank).
    pub hold_max: u64,
    /// Whether the key's demand exceeds what it can supply and the receiver's share is an
    /// allowance: then, when it runs dry, the receiver refuses locally until its next grant
    /// instead of asking the owner for room it does not have.
    pub contended: bool,
    /// The allowance is void after this many nanoseconds: the owner's current window ends (window
    /// algorithms), or the lease does.
    pub expires_in_nanos: Option<u64>,
    /// A headroom lease (added in wire version 4): the key is far below its limit, so the
    /// allowance covers the receiver's demand for many intervals. It is renewed when it runs low or
    /// near its expiry, not at every interval, and the whole of what the receiver holds lives
    /// until this grant's expiry (the owner counts it held until then).
    pub lease: bool,
}

/// A concurrency lease to release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// The bucket.
    pub key: u128,
    /// The limit.
    pub limit: LimitWire,
    /// The lease.
    pub lease: u64,
}

/// What an [`Adjust`] does to the owner's bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdjustKind {
    /// Returns hits (never above the capacity).
    Refund,
    /// Applies hits unconditionally (the bucket may go into debt).
    Charge,
}

/// A refund or a charge sent to the owner of its key (added in wire version 3 as a section of
/// its own; answered by a [`Decided`] with the same `id`: the decision a cost-1 check would get).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adjust {
    /// Chosen by the sender to match the answer.
    pub id: u64,
    /// The bucket.
    pub key: u128,
    /// The limit.
    pub limit: LimitWire,
    /// Refund or charge.
    pub kind: AdjustKind,
    /// Hits.
    pub hits: u64,
    /// The key's mode.
    pub mode: WireMode,
}

/// A key's state, handed over or replicated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyState {
    /// The bucket.
    pub key: u128,
    /// The limit.
    pub limit: LimitWire,
    /// The state.
    pub state: SnapshotWire,
    /// The key's policy's terms between regions (see [`ForwardCheck::region`]): the node that
    /// takes the state over reports the key to the same home.
    pub region: PolicyRegion,
}

/// Encodes `frame`, refusing to produce more than `frame_len_max` bytes.
pub fn encode(frame: &Frame, frame_len_max: usize) -> Result<Vec<u8>, WireError> {
    let wire = codec::FrameWire::from_frame(frame);
    let mut bytes = postcard::to_allocvec(&(WIRE_VERSION, &wire)).map_err(WireError::Encode)?;
    if bytes.len() > frame_len_max {
        return Err(WireError::TooLarge { len: bytes.len(), max: frame_len_max });
    }
    bytes.shrink_to_fit();
    Ok(bytes)
}

/// Decodes one frame from exactly `bytes`.
pub fn decode(bytes: &[u8], frame_len_max: usize) -> Result<Frame, WireError> {
    if bytes.len() > frame_len_max {
        return Err(WireError::Oversized { len: bytes.len(), max: frame_len_max });
    }
    let (&version, body) = bytes.split_first().ok_or(WireError::Empty)?;
    if version != WIRE_VERSION {
        return Err(WireError::Version(version));
    }
    let (wire, rest) = postcard::take_from_bytes::<codec::FrameWire>(body).map_err(WireError::Malformed)?;
    if !rest.is_empty() {
        return Err(WireError::Trailing(rest.len()));
    }
    let frame = wire.into_frame()?;
    // postcard accepts overlong varints (`81 00` for 1), and the serialized form could order its
    // sections or its limit table otherwise than the encoder does: refuse all of that, so that a
    // frame has exactly one encoding (the one `encode` produces) and can be compared or hashed as
    // bytes.
    let canonical = codec::FrameWire::from_frame(&frame);
    if !postcard::serialize_with_flavor(&canonical, codec::SameAs(body)).unwrap_or(false) {
        return Err(WireError::NonCanonical);
    }
    Ok(frame)
}

/// The kind of the frame in `bytes` (see [`Body::kind`]), for traffic accounting; `None` when
/// `bytes` is not a frame.
pub fn frame_kind(bytes: &[u8]) -> Option<&'static str> {
    Some(decode(bytes, bytes.len()).ok()?.body.kind())
}
