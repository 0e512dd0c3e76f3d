//! Peer messages on the wire: versioned types of their own, encoded with postcard.
//!
//! Core types are not the wire format. The types here are a protocol contract: a field is never
//! reordered or retyped within a version; a change makes a new [`WIRE_VERSION`]. Every frame starts
//! with its version byte, then the postcard encoding of a [`Frame`].
//!
//! Decoding is bounded twice: a frame longer than the caller's `frame_len_max` is refused before
//! any parsing, and postcard never reads (or allocates for) more than the slice holds. Malformed,
//! truncated, oversized or unknown-version input is a [`WireError`], never a panic. Values are
//! then validated when they are turned into core types ([`LimitWire::to_limit`]). Only the canonical
//! encoding (the bytes [`encode`] produces) decodes: a frame has exactly one byte representation.

use core::time::Duration;

use serde::{Deserialize, Serialize};

use crate::algorithm::Snapshot;
use crate::decision::{Decision, LeaseId};
use crate::limit::{Algorithm, CalendarWindow, Limit, LimitError, LimitSpec};
use crate::time::{Instant, duration_nanos};

/// The wire version this build speaks.
pub const WIRE_VERSION: u8 = 2;
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
    Malformed(String),
    /// The frame decoded but bytes were left over.
    #[error("{0} trailing bytes after the frame")]
    Trailing(usize),
    /// Encoding failed (only for a frame larger than the bound).
    #[error("cannot encode frame: {0}")]
    Encode(String),
}

/// One message between peers: who sent it, delivery bookkeeping, and what it says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// What a frame says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Body {
    /// Exact mode: checks forwarded to the owner of their keys, batched.
    Forward(Vec<ForwardCheck>),
    /// Exact mode: the owner's decisions, matched to the checks by `id`.
    Decided(Vec<Decided>),
    /// Approximate mode: per key, what a follower admitted and gave back, and its demand.
    Report(Vec<Report>),
    /// Approximate mode: per key, the owner's authoritative state and a new allowance.
    Grant(Vec<Grant>),
    /// Ownership moved: the sender's state of keys the receiver now owns.
    Handoff(Vec<KeyState>),
    /// Concurrency leases to release at the owner.
    Release(Vec<Release>),
    /// Nothing but the header: keeps acknowledgements and reachability current.
    Heartbeat,
    /// The owner's state of keys the receiver would own if the owner failed (its ring successor).
    Replica(Vec<KeyState>),
}

/// A limit as it travels: the spec, checked again on arrival.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitWire {
    /// The algorithm's configuration name (`token_bucket`, …).
    pub algorithm: String,
    /// Hits per period.
    pub limit: u64,
    /// The period in nanoseconds.
    pub period_nanos: u64,
    /// Burst, if set.
    pub burst: Option<u64>,
    /// Shaper delay, if set.
    pub delay: Option<u64>,
    /// The calendar window of a calendar-aligned fixed window (added in wire version 2).
    pub calendar: Option<CalendarWire>,
}

/// A calendar window as it travels: Unix time in nanoseconds, the same numbers on every node
/// (see [`crate::CalendarWindow`]: drivers of calendar limits run their clocks on Unix time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalendarWire {
    /// The window's first instant.
    pub start_unix_nanos: u64,
    /// The next window's first instant.
    pub end_unix_nanos: u64,
}

/// Why a [`LimitWire`] is not a limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitWireError {
    /// The algorithm name is unknown.
    #[error("unknown algorithm {0:?}")]
    UnknownAlgorithm(String),
    /// The parameters are invalid.
    #[error(transparent)]
    Invalid(#[from] LimitError),
}

impl LimitWire {
    /// The wire form of `limit`.
    pub fn from_limit(limit: &Limit) -> LimitWire {
        let spec = limit.spec();
        LimitWire {
            algorithm: spec.algorithm.name().to_owned(),
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

    /// The validated limit.
    pub fn to_limit(&self) -> Result<Limit, LimitWireError> {
        let algorithm = Algorithm::from_name(&self.algorithm)
            .ok_or_else(|| LimitWireError::UnknownAlgorithm(self.algorithm.clone()))?;
        let spec = LimitSpec {
            algorithm,
            limit: self.limit,
            period: Duration::from_nanos(self.period_nanos),
            burst: self.burst,
            delay: self.delay,
            calendar: self.calendar.map(|window| CalendarWindow {
                start: Instant::from_nanos(window.start_unix_nanos),
                end: Instant::from_nanos(window.end_unix_nanos),
            }),
        };
        Ok(Limit::new(spec)?)
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The sender's follower epoch of the key (see [`Report::epoch`]); a grant answers it.
    pub epoch: u64,
    /// The sender's recent demand for the key, in hits per second.
    pub demand_per_s: u64,
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Hits asked for per second, recently: the follower's demand.
    pub demand_per_s: u64,
    /// The follower's last authoritative state, sent once to a new owner to seed it.
    pub seed: Option<SnapshotWire>,
}

/// The owner's answer to a report for one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The bucket.
    pub key: u128,
    /// The epoch of the report answered.
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
    /// Window algorithms: the allowance is void after this many nanoseconds (the owner's current
    /// window ends).
    pub expires_in_nanos: Option<u64>,
}

/// A concurrency lease to release.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// The bucket.
    pub key: u128,
    /// The limit.
    pub limit: LimitWire,
    /// The lease.
    pub lease: u64,
}

/// A key's state, handed over or replicated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyState {
    /// The bucket.
    pub key: u128,
    /// The limit.
    pub limit: LimitWire,
    /// The state.
    pub state: SnapshotWire,
}

/// Encodes `frame`, refusing to produce more than `frame_len_max` bytes.
pub fn encode(frame: &Frame, frame_len_max: usize) -> Result<Vec<u8>, WireError> {
    let mut bytes =
        postcard::to_allocvec(&(WIRE_VERSION, frame)).map_err(|e| WireError::Encode(e.to_string()))?;
    if bytes.len() > frame_len_max {
        return Err(WireError::Encode(format!("{} bytes exceed the bound of {frame_len_max}", bytes.len())));
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
    let (frame, rest) =
        postcard::take_from_bytes::<Frame>(body).map_err(|e| WireError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(WireError::Trailing(rest.len()));
    }
    // postcard accepts overlong varints (`81 00` for 1): refuse them, so that a frame has exactly
    // one encoding (the one `encode` produces) and frames can be compared or hashed as bytes.
    if !postcard::serialize_with_flavor(&frame, SameAs(body)).unwrap_or(false) {
        return Err(WireError::Malformed("non-canonical encoding".to_owned()));
    }
    Ok(frame)
}

/// A postcard output that compares what is serialized with the bytes a frame was decoded from,
/// without allocating: `true` when every byte matches and none is left over.
struct SameAs<'a>(&'a [u8]);

impl postcard::ser_flavors::Flavor for SameAs<'_> {
    type Output = bool;

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        match self.0.split_first() {
            Some((&expected, rest)) if expected == byte => {
                self.0 = rest;
                Ok(())
            }
            _ => Err(postcard::Error::SerializeBufferFull),
        }
    }

    fn finalize(self) -> postcard::Result<bool> {
        Ok(self.0.is_empty())
    }
}
