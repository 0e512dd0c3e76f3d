//! The peer wire format: round trips, canonical encoding, hostile and malformed input, size bounds,
//! the pinned byte layout (golden frames) and the conversions between wire and core types.
//!
//! Over 600 lines on purpose: one test binary per codec, so that the allocation probe (the global
//! allocator below) watches every decode, and the strategies and golden frames are shared.

use core::time::Duration;

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use ratemesh_core::wire::{
    Adjust, AdjustKind, AuditPiece, Body, CalendarWire, Decided, DecisionWire, FRAME_LEN_MAX_DEFAULT,
    ForwardCheck, Frame, Grant, KeyState, LimitWire, RegionGrant, RegionReport, Release, Report,
    SnapshotWire, WIRE_VERSION, WireError, WireMode, decode, encode,
};
use ratemesh_core::{
    Algorithm, CONCURRENCY_LIMIT_MAX, Decision, LeaseId, Limit, LimitError, LimitParameter, LimitSpec,
    PERIOD_NANOS_MAX, PolicyRegion, RegionFallback, RegionId, SLIDING_LOG_ENTRIES_MAX, Snapshot,
};

const MAX: usize = FRAME_LEN_MAX_DEFAULT;
/// Elements per generated Vec (outer and nested): enough to cover lengths of 0, 1 and several.
const VEC_LEN: usize = 6;

// ---------------------------------------------------------------------------------------------
// Allocation probe: the largest single allocation requested by the current thread.
// ---------------------------------------------------------------------------------------------

/// Wraps the system allocator to record, per thread, the largest single allocation requested, so a
/// test can show that hostile input allocates nothing large. Test-only; no behaviour changes.
#[allow(unsafe_code)]
mod alloc_probe {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        // A const-initialised Cell without Drop: reading it never allocates, so the allocator may use it.
        static LARGEST: Cell<usize> = const { Cell::new(0) };
        static CALLS: Cell<usize> = const { Cell::new(0) };
    }

    pub struct Probe;

    fn note(size: usize) {
        // `try_with`: the slot may be gone while the thread shuts down.
        let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
        let _ = CALLS.try_with(|calls| calls.set(calls.get() + 1));
    }

    // SAFETY: every call is forwarded unchanged to `System`, which upholds the `GlobalAlloc`
    // contract; the probe only records sizes in a thread-local `Cell`, which does not allocate.
    unsafe impl GlobalAlloc for Probe {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note(new_size);
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    /// Runs `f` and returns its result with the largest single allocation it requested.
    pub fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
        let (out, largest, _) = allocations(f);
        (out, largest)
    }

    /// Runs `f` and returns its result, its largest single allocation and how many allocations
    /// (and reallocations) it made.
    pub fn allocations<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
        LARGEST.with(|largest| largest.set(0));
        CALLS.with(|calls| calls.set(0));
        let out = f();
        (out, LARGEST.with(Cell::get), CALLS.with(Cell::get))
    }
}

#[global_allocator]
static PROBE: alloc_probe::Probe = alloc_probe::Probe;

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// Integers of every varint length, including the edges.
fn int() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0), Just(u64::MAX), 0..128u64, 128..1u64 << 21, any::<u64>()]
}

fn key() -> impl Strategy<Value = u128> {
    prop_oneof![Just(0), Just(u128::MAX), 0..1u128 << 21, any::<u128>()]
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    select(Algorithm::ALL.to_vec())
}

fn limit_wire() -> impl Strategy<Value = LimitWire> {
    (algorithm(), int(), int(), option::of(int()), option::of(int())).prop_map(
        |(algorithm, limit, period_nanos, burst, delay)| LimitWire {
            algorithm,
            limit,
            period_nanos,
            burst,
            delay,
            calendar: None,
        },
    )
}

fn snapshot_wire() -> impl Strategy<Value = SnapshotWire> {
    prop_oneof![
        int().prop_map(|backlog_nanos| SnapshotWire::Tat { backlog_nanos }),
        (int(), int(), int()).prop_map(|(elapsed_nanos, prev, curr)| SnapshotWire::Window {
            elapsed_nanos,
            prev,
            curr
        }),
        vec((int(), int()), 0..VEC_LEN).prop_map(SnapshotWire::Log),
        vec((int(), int(), int()), 0..VEC_LEN).prop_map(SnapshotWire::Leases),
    ]
}

fn decision_wire() -> impl Strategy<Value = DecisionWire> {
    (any::<bool>(), int(), int(), int(), option::of(int()), int(), option::of(int())).prop_map(
        |(allowed, limit, remaining, reset_after_nanos, retry_after_nanos, delay_nanos, lease)| {
            DecisionWire {
                allowed,
                limit,
                remaining,
                reset_after_nanos,
                retry_after_nanos,
                delay_nanos,
                lease,
            }
        },
    )
}

/// A policy's terms between regions, the default (sent as nothing) as often as the others.
fn policy_region() -> impl Strategy<Value = PolicyRegion> {
    let fallback =
        prop_oneof![Just(RegionFallback::Last), Just(RegionFallback::Floor), Just(RegionFallback::Closed)];
    prop_oneof![
        Just(PolicyRegion::default()),
        (option::of(int()), option::of(fallback))
            .prop_map(|(home, fallback)| PolicyRegion { home: home.map(RegionId), fallback }),
    ]
}

fn body() -> impl Strategy<Value = Body> {
    let mode = prop_oneof![Just(WireMode::Exact), Just(WireMode::Approximate)];
    // Few distinct limits, so that frames share table entries.
    let limit = || prop_oneof![Just(gcra_wire()), limit_wire()];
    let forward = (int(), key(), limit(), int(), mode, int(), policy_region()).prop_map(
        |(id, key, limit, cost, mode, refused_here, region)| ForwardCheck {
            id,
            key,
            limit,
            cost,
            mode,
            refused_here,
            region,
        },
    );
    let decided = (int(), decision_wire()).prop_map(|(id, decision)| Decided { id, decision });
    let counters = (int(), int(), int(), int(), int(), int(), int());
    let report = (key(), limit(), counters, option::of(snapshot_wire()), policy_region()).prop_map(
        |(
            key,
            limit,
            (epoch, holding, granted_seen, uncovered, returned, refunded, demand_per_s),
            seed,
            region,
        )| {
            Report {
                key,
                limit,
                epoch,
                holding,
                granted_seen,
                uncovered,
                returned,
                refunded,
                demand_per_s,
                seed,
                region,
            }
        },
    );
    let flags = (any::<bool>(), any::<bool>());
    let grant = (key(), int(), snapshot_wire(), (int(), int()), flags, option::of(int())).prop_map(
        |(key, epoch, state, (grant, hold_max), (contended, lease), expires_in_nanos)| Grant {
            key,
            epoch,
            state,
            grant,
            hold_max,
            contended,
            expires_in_nanos,
            lease,
        },
    );
    let release = (key(), limit_wire(), int()).prop_map(|(key, limit, lease)| Release { key, limit, lease });
    let key_state = || {
        (key(), limit_wire(), snapshot_wire(), policy_region())
            .prop_map(|(key, limit, state, region)| KeyState { key, limit, state, region })
    };
    let kind = prop_oneof![Just(AdjustKind::Refund), Just(AdjustKind::Charge)];
    let mode_again = prop_oneof![Just(WireMode::Exact), Just(WireMode::Approximate)];
    let adjust = (int(), key(), limit(), kind, int(), mode_again)
        .prop_map(|(id, key, limit, kind, hits, mode)| Adjust { id, key, limit, kind, hits, mode });
    let region_report = (key(), limit(), int(), int(), int(), int(), policy_region()).prop_map(
        |(key, limit, demand_per_s, report_count, applied_seq, applied_part, region)| RegionReport {
            key,
            limit,
            demand_per_s,
            report_count,
            applied_seq,
            applied_part,
            region,
        },
    );
    let region_grant = (key(), limit(), int(), int(), int(), int(), any::<bool>(), policy_region()).prop_map(
        |(key, limit, seq, part, lease_nanos, report_count, first, region)| RegionGrant {
            key,
            limit,
            seq,
            part,
            lease_nanos,
            report_count,
            first,
            region,
        },
    );
    let audit = (key(), int(), int(), int(), int(), int(), int()).prop_map(
        |(key, group, window_nanos, first_age_nanos, last_age_nanos, admitted, refused)| AuditPiece {
            key,
            group,
            window_nanos,
            first_age_nanos,
            last_age_nanos,
            admitted,
            refused,
        },
    );
    (
        vec(forward, 0..VEC_LEN),
        vec(decided, 0..VEC_LEN),
        vec(report, 0..VEC_LEN),
        vec(grant, 0..VEC_LEN),
        vec(key_state(), 0..VEC_LEN),
        vec(key_state(), 0..VEC_LEN),
        vec(release, 0..VEC_LEN),
        vec(adjust, 0..VEC_LEN),
        vec(region_report, 0..VEC_LEN),
        vec(region_grant, 0..VEC_LEN),
        vec(audit, 0..VEC_LEN),
        proptest::option::of(int()),
    )
        .prop_map(
            |(
                forward,
                decided,
                report,
                grant,
                handoff,
                replica,
                release,
                adjust,
                region_report,
                region_grant,
                audit,
                audit_clock_nanos,
            )| Body {
                forward,
                decided,
                report,
                grant,
                handoff,
                replica,
                release,
                adjust,
                region_report,
                region_grant,
                audit,
                audit_clock_nanos,
            },
        )
}

fn frame() -> impl Strategy<Value = Frame> {
    ((int(), int(), int(), int(), int(), int()), body()).prop_map(
        |((from, incarnation, seq, ack, sack, una), body)| Frame {
            from,
            incarnation,
            seq,
            ack,
            sack,
            una,
            body,
        },
    )
}

/// A valid limit of any algorithm (parameters that do not apply are dropped, the rest filtered by
/// [`Limit::new`]).
fn valid_limit() -> impl Strategy<Value = Limit> {
    let limit = prop_oneof![1..=1_000u64, 1..=SLIDING_LOG_ENTRIES_MAX, 1..=u64::MAX];
    let period = prop_oneof![1..=1_000_000_000_000u64, 1..=PERIOD_NANOS_MAX, Just(PERIOD_NANOS_MAX)];
    let param = option::of(prop_oneof![0..=100u64, any::<u64>()]);
    (select(Algorithm::ALL.to_vec()), limit, period, param.clone(), param).prop_filter_map(
        "invalid limit",
        |(algorithm, limit, period_nanos, burst, delay)| {
            let takes_burst =
                matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucketShaper);
            let mut spec = LimitSpec::new(algorithm, limit, Duration::from_nanos(period_nanos));
            spec.burst = burst.filter(|_| takes_burst);
            if algorithm == Algorithm::LeakyBucketShaper {
                spec.delay = delay.map(|d| d.min(spec.burst.unwrap_or(0)));
            }
            Limit::new(spec).ok()
        },
    )
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    prop_oneof![
        int().prop_map(|backlog_nanos| Snapshot::Tat { backlog_nanos }),
        (int(), int(), int()).prop_map(|(elapsed_nanos, prev, curr)| Snapshot::Window {
            elapsed_nanos,
            prev,
            curr
        }),
        vec((int(), int()), 0..VEC_LEN).prop_map(|hits| Snapshot::Log { hits }),
        vec((int().prop_map(LeaseId), int(), int()), 0..VEC_LEN)
            .prop_map(|leases| Snapshot::Leases { leases }),
    ]
}

fn decision() -> impl Strategy<Value = Decision> {
    let nanos = || int().prop_map(Duration::from_nanos);
    (any::<bool>(), int(), int(), nanos(), option::of(nanos()), nanos(), option::of(int().prop_map(LeaseId)))
        .prop_map(|(allowed, limit, remaining, reset_after, retry_after, delay, lease)| Decision {
            allowed,
            limit,
            remaining,
            reset_after,
            retry_after,
            delay,
            lease,
        })
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn enc(frame: &Frame) -> Vec<u8> {
    encode(frame, MAX).expect("a generated frame fits the default bound")
}

/// Decodes `bytes` (must not panic) and checks what any outcome must satisfy: a decoded frame
/// re-encodes to exactly `bytes` (the encoding is canonical); an error names the right cause for
/// empty input and for a foreign version byte.
fn check_decode(bytes: &[u8]) -> Result<Frame, WireError> {
    let decoded = decode(bytes, MAX);
    match &decoded {
        Ok(frame) => assert_eq!(enc(frame), bytes, "decoded frame does not re-encode to its input"),
        Err(err) => match bytes.first() {
            None => assert_eq!(*err, WireError::Empty),
            Some(&v) if v != WIRE_VERSION => assert_eq!(*err, WireError::Version(v)),
            Some(_) => assert!(
                matches!(
                    err,
                    WireError::Malformed(_)
                        | WireError::Trailing(_)
                        | WireError::NonCanonical
                        | WireError::UnknownAlgorithm(_)
                        | WireError::LimitIndex { .. }
                ),
                "unexpected error {err:?}"
            ),
        },
    }
    decoded
}

/// Postcard's varint: 7 bits a byte, least significant group first, high bit = more follow.
fn varint(mut value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn gcra_wire() -> LimitWire {
    LimitWire {
        algorithm: Algorithm::Gcra,
        limit: 10,
        period_nanos: 1_000_000_000,
        burst: Some(5),
        delay: None,
        calendar: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A body split in two keeps every item once, in order; coarsened, every log state keeps
    /// its hits in half the entries (rounded up), none younger than before, and every lease
    /// state its slots, none expiring sooner.
    #[test]
    fn bodies_split_and_coarsen_without_losing_hits(body in body(), keep in 0usize..40) {
        let mut first = body.clone();
        let rest = first.split_off(keep);
        prop_assert_eq!(first.items(), keep.min(body.items()));
        first.append(rest);
        prop_assert_eq!(&first, &body);
        let mut coarse = body.clone();
        let changed = coarse.coarsen_states();
        let logs = |b: &Body| -> Vec<Vec<(u64, u64)>> {
            let states = b.handoff.iter().chain(&b.replica).map(|s| &s.state);
            let all = b.grant.iter().map(|g| &g.state).chain(states).chain(b.report.iter().filter_map(|r| r.seed.as_ref()));
            all.filter_map(|s| match s { SnapshotWire::Log(hits) => Some(hits.clone()), _ => None }).collect()
        };
        let leases = |b: &Body| -> Vec<Vec<(u64, u64, u64)>> {
            let states = b.handoff.iter().chain(&b.replica).map(|s| &s.state);
            let all = b.grant.iter().map(|g| &g.state).chain(states).chain(b.report.iter().filter_map(|r| r.seed.as_ref()));
            all.filter_map(|s| match s { SnapshotWire::Leases(l) => Some(l.clone()), _ => None }).collect()
        };
        for (old, new) in leases(&body).iter().zip(&leases(&coarse)) {
            let slots = |l: &[(u64, u64, u64)]| l.iter().fold(0u64, |s, &(_, n, _)| s.saturating_add(n));
            prop_assert_eq!(new.len(), if old.len() >= 2 { old.len().div_ceil(2) } else { old.len() });
            prop_assert_eq!(slots(new), slots(old));
            prop_assert!(new.iter().zip(old.chunks(2)).all(|(n, pair)| pair.iter().all(|&(_, _, left)| left <= n.2)));
        }
        let (before, after) = (logs(&body), logs(&coarse));
        let coarsened = before.iter().any(|hits| hits.len() >= 2) || leases(&body).iter().any(|l| l.len() >= 2);
        prop_assert_eq!(changed, coarsened);
        for (old, new) in before.iter().zip(&after) {
            let sum = |hits: &[(u64, u64)]| hits.iter().fold(0u64, |s, &(_, c)| s.saturating_add(c));
            prop_assert_eq!(new.len(), if old.len() >= 2 { old.len().div_ceil(2) } else { old.len() });
            prop_assert_eq!(sum(new), sum(old));
            prop_assert!(new.iter().zip(old.chunks(2)).all(|(n, pair)| pair.iter().any(|&(age, _)| age == n.0)));
        }
    }

    /// (a) Every frame survives encode → decode; (g) the bound is exact: the encoding fits a bound
    /// of its own length and is refused by one byte less.
    #[test]
    fn frames_round_trip(frame in frame()) {
        let bytes = enc(&frame);
        prop_assert_eq!(bytes[0], WIRE_VERSION);
        prop_assert_eq!(decode(&bytes, MAX), Ok(frame.clone()));
        prop_assert_eq!(decode(&bytes, bytes.len()), Ok(frame.clone()));
        prop_assert_eq!(encode(&frame, bytes.len()), Ok(bytes.clone()));
        let too_large = matches!(encode(&frame, bytes.len() - 1), Err(WireError::TooLarge { .. }));
        prop_assert!(too_large);
    }

    /// (b) Arbitrary bytes never panic; what decodes is canonical. Half the inputs start with the
    /// right version byte so that they reach the parser.
    #[test]
    fn garbage_never_panics(
        mut bytes in vec(any::<u8>(), 0..4096),
        versioned in any::<bool>(),
    ) {
        if versioned && !bytes.is_empty() {
            bytes[0] = WIRE_VERSION;
        }
        let _ = check_decode(&bytes);
    }

    /// (c) Every strict prefix of a valid frame is an error: `Empty` for no bytes, else `Malformed`.
    #[test]
    fn truncations_are_errors(frame in frame()) {
        let bytes = enc(&frame);
        prop_assert_eq!(decode(&[], MAX), Err(WireError::Empty));
        for len in 1..bytes.len() {
            let err = decode(&bytes[..len], MAX);
            prop_assert!(matches!(err, Err(WireError::Malformed(_))), "prefix {} of {}: {:?}", len, bytes.len(), err);
        }
    }

    /// (d) Flipping bits of a valid frame never panics, and whatever still decodes is canonical.
    #[test]
    fn bit_flips_never_panic(frame in frame(), flips in vec(any::<Index>(), 1..=4)) {
        let mut bytes = enc(&frame);
        let bits = bytes.len() * 8;
        for flip in &flips {
            let bit = flip.index(bits);
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
        let _ = check_decode(&bytes);
    }

    /// (e) Trailing bytes after a valid frame are counted, not ignored.
    #[test]
    fn trailing_bytes_are_refused(frame in frame(), extra in vec(any::<u8>(), 1..64)) {
        let mut bytes = enc(&frame);
        bytes.extend_from_slice(&extra);
        prop_assert_eq!(decode(&bytes, MAX), Err(WireError::Trailing(extra.len())));
    }

    /// (e) Any version byte but ours is refused as such, whatever follows.
    #[test]
    fn foreign_versions_are_refused(frame in frame(), version in any::<u8>()) {
        prop_assume!(version != WIRE_VERSION);
        let mut bytes = enc(&frame);
        bytes[0] = version;
        prop_assert_eq!(decode(&bytes, MAX), Err(WireError::Version(version)));
    }

    /// (h) A valid limit survives the wire, and its wire form is the one it came from.
    #[test]
    fn valid_limits_round_trip(limit in valid_limit()) {
        let wire = LimitWire::from_limit(&limit);
        prop_assert_eq!(wire.to_limit(), Ok(limit.clone()));
        prop_assert_eq!(LimitWire::from_limit(&wire.to_limit().expect("valid")), wire);
    }

    /// (h) Any wire limit (arbitrary numbers) is validated exactly like a local spec, and what
    /// validates maps back to the same wire form.
    #[test]
    fn wire_limits_validate_like_specs(wire in limit_wire()) {
        let result = wire.to_limit();
        let spec = LimitSpec {
            algorithm: wire.algorithm,
            limit: wire.limit,
            period: Duration::from_nanos(wire.period_nanos),
            burst: wire.burst,
            delay: wire.delay,
            calendar: None,
        };
        prop_assert_eq!(&result, &Limit::new(spec));
        if let Ok(limit) = result {
            prop_assert_eq!(LimitWire::from_limit(&limit), wire);
        }
    }

    /// (h) Snapshots convert both ways without loss.
    #[test]
    fn snapshots_round_trip(snapshot in snapshot(), wire in snapshot_wire()) {
        prop_assert_eq!(Snapshot::from(SnapshotWire::from(snapshot.clone())), snapshot);
        prop_assert_eq!(SnapshotWire::from(Snapshot::from(wire.clone())), wire);
    }

    /// (h) Decisions convert both ways without loss (durations in whole nanoseconds up to u64::MAX).
    #[test]
    fn decisions_round_trip(decision in decision(), wire in decision_wire()) {
        prop_assert_eq!(Decision::from(DecisionWire::from(decision)), decision);
        prop_assert_eq!(DecisionWire::from(Decision::from(wire)), wire);
    }
}

// ---------------------------------------------------------------------------------------------
// Bounds and error kinds (e, g)
// ---------------------------------------------------------------------------------------------

#[test]
fn empty_input_is_empty() {
    assert_eq!(decode(&[], MAX), Err(WireError::Empty));
    assert_eq!(decode(&[], 0), Err(WireError::Empty));
}

#[test]
fn oversized_input_is_refused_before_parsing() {
    // A version byte we do not speak: had the decoder looked at the bytes, it would say `Version`.
    let junk = vec![0xff; MAX + 1];
    assert_eq!(decode(&junk, MAX), Err(WireError::Oversized { len: MAX + 1, max: MAX }));

    let bytes = enc(&golden_frames()[0].0);
    let n = bytes.len();
    assert_eq!(decode(&bytes, n - 1), Err(WireError::Oversized { len: n, max: n - 1 }));
    assert_eq!(decode(&bytes, 0), Err(WireError::Oversized { len: n, max: 0 }));
    assert!(decode(&bytes, n).is_ok());
}

#[test]
fn encode_refuses_frames_over_the_bound() {
    // About 10 × 4096 bytes of log entries.
    let state = SnapshotWire::Log(vec![(u64::MAX - 1, 1); 4096]);
    let frame = Frame {
        from: 1,
        incarnation: 1,
        seq: 1,
        ack: 0,
        sack: 0,
        una: 0,
        body: Body {
            handoff: vec![KeyState { key: 1, limit: gcra_wire(), state, region: PolicyRegion::default() }],
            ..Body::default()
        },
    };
    let bytes = encode(&frame, MAX).expect("fits 1 MiB");
    assert!(bytes.len() > 40_000);
    assert!(matches!(encode(&frame, 40_000), Err(WireError::TooLarge { .. })));
    assert!(matches!(encode(&frame, bytes.len() - 1), Err(WireError::TooLarge { .. })));
    assert!(matches!(encode(&frame, 0), Err(WireError::TooLarge { .. })));
    assert_eq!(encode(&frame, bytes.len()), Ok(bytes));
}

#[test]
fn unknown_versions_are_refused() {
    let mut bytes = enc(&golden_frames()[5].0);
    for version in [0, 1, 2, 3, 0x80, 0xff] {
        bytes[0] = version;
        assert_eq!(decode(&bytes, MAX), Err(WireError::Version(version)));
    }
    // A version byte alone: still a version error, not a truncation.
    assert_eq!(decode(&[7], MAX), Err(WireError::Version(7)));
    assert!(matches!(decode(&[WIRE_VERSION], MAX), Err(WireError::Malformed(_))));
}

#[test]
fn trailing_bytes_are_counted() {
    let mut bytes = enc(&golden_frames()[0].0);
    bytes.push(0);
    assert_eq!(decode(&bytes, MAX), Err(WireError::Trailing(1)));
    bytes.extend_from_slice(&[1, 2, 3]);
    assert_eq!(decode(&bytes, MAX), Err(WireError::Trailing(4)));
}

/// (b) A value written with more varint bytes than it needs (here `from` = 1 as `81 00`, and an
/// overlong enum tag) is refused: each frame has exactly one encoding, so bytes can be compared,
/// hashed or deduplicated as frames.
#[test]
fn overlong_varints_are_refused() {
    let frame = Frame { from: 1, incarnation: 2, seq: 3, ack: 4, sack: 0, una: 5, body: Body::default() };
    let bytes = enc(&frame);
    assert_eq!(hex(&bytes), "0401020304000500");
    for overlong in [
        vec![WIRE_VERSION, 0x81, 0x00, 2, 3, 4, 0, 5, 0], // from
        vec![WIRE_VERSION, 1, 2, 3, 4, 0, 5, 0x80, 0x00], // section count
        vec![WIRE_VERSION, 1, 2, 3, 0x84, 0x80, 0x80, 0x00, 0, 5, 0], // ack
    ] {
        let err = decode(&overlong, MAX);
        let refused = matches!(err, Err(WireError::Malformed(_) | WireError::NonCanonical));
        assert!(refused, "{}: {err:?}", hex(&overlong));
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile length prefixes (f)
// ---------------------------------------------------------------------------------------------

/// Frames whose length prefixes claim far more elements than the input holds: each must be a
/// clean `Malformed` error, found quickly, without allocating for the claimed length.
#[test]
fn hostile_length_prefixes_allocate_nothing_large() {
    const HUGE: u64 = 1 << 60;
    let huge = varint(HUGE);
    assert_eq!(hex(&huge), "808080808080808010"); // 2^60: eight empty groups, then 0x10 << 56.
    let header = [WIRE_VERSION, 1, 2, 3, 4, 0, 5]; // version, from, incarnation, seq, ack, sack, una
    let key = [0u8; 16];
    let cat = |parts: &[&[u8]]| -> Vec<u8> {
        let mut b = header.to_vec();
        for part in parts {
            b.extend_from_slice(part);
        }
        // A little real data after the claim, so that the decoder has something to chew on.
        b.extend_from_slice(&[1; 32]);
        b
    };
    // Sections claiming 2^60 (and u64::MAX) of themselves.
    let mut hostile = vec![cat(&[&huge]), cat(&[&varint(u64::MAX)])];
    // One section of every kind (tags 0 to 7) claiming 2^60 and u64::MAX items.
    for tag in 0..=7u8 {
        hostile.push(cat(&[&[1, tag], &huge]));
        hostile.push(cat(&[&[1, tag], &varint(u64::MAX)]));
    }
    // A grant (tag 4): key, epoch 0, state Log (tag 2) claiming 2^60 entries.
    hostile.push(cat(&[&[1, 4, 1], &key, &[0, 2], &huge]));
    // A handoff (tag 5): key, limit 0, state Leases (tag 3) claiming 2^60 entries.
    hostile.push(cat(&[&[1, 5, 1], &key, &[0, 3], &huge]));
    // Forwards (tag 1) claiming 2^60 checks, the first of them well-formed.
    hostile.push(cat(&[&[1, 1], &huge, &[7], &key, &[0, 1, 0]]));

    // The probe sees a large allocation when there is one.
    let (_, largest) =
        alloc_probe::largest_allocation(|| std::hint::black_box(Vec::<u8>::with_capacity(1 << 20)));
    assert!(largest >= 1 << 20, "the allocation probe is blind: {largest}");

    for bytes in &hostile {
        let (result, largest, calls) = alloc_probe::allocations(|| decode(bytes, MAX));
        assert!(matches!(result, Err(WireError::Malformed(_))), "{}: {result:?}", hex(bytes));
        // Error messages and a partial element are all that may be allocated: a decoder that
        // went on with the claim would allocate (or grow) again and again.
        assert!(largest < 4096, "{}: allocated {largest} bytes at once", hex(bytes));
        assert!(calls < 64, "{}: {calls} allocations", hex(bytes));
    }
}

/// A length prefix that does not exceed the input may preallocate for it, but serde caps any
/// preallocation at 1 MiB, whatever the claim: the memory a frame costs stays proportional to its
/// length and bounded.
#[test]
fn plausible_length_prefixes_preallocate_boundedly() {
    for len in [4096usize, 200_000] {
        // Forward claiming `len` checks, followed by `len` bytes of 0xff: the first check's id is a
        // varint that never ends, so only the preallocation happens.
        let mut bytes = vec![WIRE_VERSION, 1, 2, 3, 4, 5, 0];
        bytes.extend_from_slice(&varint(len as u64));
        bytes.extend(std::iter::repeat_n(0xffu8, len));
        let (result, largest) = alloc_probe::largest_allocation(|| decode(&bytes, MAX));
        assert!(matches!(result, Err(WireError::Malformed(_))), "{result:?}");
        assert!(largest <= 1 << 20, "claim of {len}: allocated {largest} bytes at once");
    }
}

// ---------------------------------------------------------------------------------------------
// Golden frames: the byte layout of WIRE_VERSION 2, pinned (version 2 added the calendar window
// of a limit and the calendar snapshot).
// ---------------------------------------------------------------------------------------------

/// One frame per body variant (together every wire type and every enum variant), with its
/// encoding.
///
/// THESE BYTES ARE THE WIRE FORMAT. If this test fails, the encoding changed and peers of the
/// previous build can no longer read this one: do not update the hex; restore the format, or make
/// the change a new `WIRE_VERSION` (and pin the new version's bytes here).
fn golden_frames() -> Vec<(Frame, &'static str)> {
    vec![
        (
            Frame {
                from: 1,
                incarnation: 2,
                seq: 3,
                ack: 0,
                sack: 0,
                una: 0,
                body: Body {
                    forward: vec![ForwardCheck {
                        id: 7,
                        key: 0x0102_0304,
                        limit: gcra_wire(),
                        cost: 1,
                        mode: WireMode::Approximate,
                        refused_here: 0,
                        region: PolicyRegion::default(),
                    }],
                    ..Body::default()
                },
            },
            "04010203000000020001040a8094ebdc03010500000101070403020100000000000000000000000000010100",
        ),
        (
            Frame {
                from: 300,
                incarnation: 1,
                seq: 4,
                ack: 0,
                sack: 0,
                una: 0,
                body: Body {
                    decided: vec![
                        Decided {
                            id: 7,
                            decision: DecisionWire {
                                allowed: true,
                                limit: 10,
                                remaining: 4,
                                reset_after_nanos: 500_000_000,
                                retry_after_nanos: None,
                                delay_nanos: 0,
                                lease: None,
                            },
                        },
                        Decided {
                            id: 8,
                            decision: DecisionWire {
                                allowed: false,
                                limit: 10,
                                remaining: 0,
                                reset_after_nanos: 1_000,
                                retry_after_nanos: Some(100),
                                delay_nanos: 5,
                                lease: Some(0xdead_beef),
                            },
                        },
                    ],
                    ..Body::default()
                },
            },
            "04ac02010400000001020207010a0480cab5ee0100000008000a00e80701640501effdb6f50d",
        ),
        (
            Frame {
                from: 2,
                incarnation: u64::MAX,
                seq: 0,
                ack: 0,
                sack: 0,
                una: 0,
                body: Body {
                    report: vec![Report {
                        key: u128::MAX,
                        limit: LimitWire {
                            algorithm: Algorithm::LeakyBucketShaper,
                            limit: 5,
                            period_nanos: 60_000_000_000,
                            burst: Some(3),
                            delay: Some(1),
                            calendar: None,
                        },
                        epoch: 0xabcd,
                        holding: 300,
                        granted_seen: 1 << 20,
                        uncovered: 2,
                        returned: 0,
                        refunded: 0,
                        demand_per_s: 12,
                        seed: Some(SnapshotWire::Tat { backlog_nanos: 7 }),
                        region: PolicyRegion::default(),
                    }],
                    ..Body::default()
                },
            },
            "0402ffffffffffffffffff0100000000020001050580b09dc2df0101030101000301ffffffffffffffffffffffffffffffff00cdd702ac028080400200000c010007",
        ),
        (
            Frame {
                from: 3,
                incarnation: 3,
                seq: 9,
                ack: 0,
                sack: 0,
                una: 0,
                body: Body {
                    grant: vec![
                        Grant {
                            key: 42,
                            epoch: 7,
                            state: SnapshotWire::Window { elapsed_nanos: 250, prev: 6, curr: 2 },
                            grant: 3,
                            hold_max: 5,
                            contended: false,
                            expires_in_nanos: Some(750),
                            lease: true,
                        },
                        Grant {
                            key: 43,
                            epoch: u64::MAX,
                            state: SnapshotWire::Tat { backlog_nanos: 1 << 40 },
                            grant: 0,
                            hold_max: 0,
                            contended: true,
                            expires_in_nanos: None,
                            lease: false,
                        },
                    ],
                    ..Body::default()
                },
            },
            "040303090000000104022a0000000000000000000000000000000701fa01060203050001ee05012b000000000000000000000000000000ffffffffffffffffff01008080808080200000010000",
        ),
        (
            Frame {
                from: 4,
                incarnation: 1,
                seq: 1,
                ack: 0,
                sack: 0,
                una: 0,
                body: Body {
                    handoff: vec![
                        KeyState {
                            key: 9,
                            limit: LimitWire {
                                algorithm: Algorithm::SlidingWindowLog,
                                limit: 3,
                                period_nanos: 1_000,
                                burst: None,
                                delay: None,
                                calendar: None,
                            },
                            state: SnapshotWire::Log(vec![(1, 2), (300, 1)]),
                            region: PolicyRegion::default(),
                        },
                        KeyState {
                            key: 10,
                            limit: LimitWire {
                                algorithm: Algorithm::Concurrency,
                                limit: 2,
                                period_nanos: 5_000,
                                burst: None,
                                delay: None,
                                calendar: None,
                            },
                            state: SnapshotWire::Leases(vec![(0xdead_beef, 1, 2_000)]),
                            region: PolicyRegion::default(),
                        },
                        KeyState {
                            key: 13,
                            limit: LimitWire {
                                algorithm: Algorithm::FixedWindow,
                                limit: 100,
                                period_nanos: 3_000,
                                burst: None,
                                delay: None,
                                calendar: Some(CalendarWire {
                                    start_unix_nanos: 7_000,
                                    end_unix_nanos: 10_000,
                                }),
                            },
                            state: SnapshotWire::Calendar { elapsed_nanos: 5, remaining_nanos: 6, curr: 7 },
                            region: PolicyRegion::default(),
                        },
                    ],
                    ..Body::default()
                },
            },
            "040401010000000200030103e807000000060288270000000064b817000001d836904e0503090000000000000000000000000000000002020102ac02010a000000000000000000000000000000010301effdb6f50d01d00f0d0000000000000000000000000000000204050607",
        ),
        (
            Frame {
                from: 6,
                incarnation: 2,
                seq: 5,
                ack: 0,
                sack: 0,
                una: 0,
                body: Body {
                    release: vec![Release { key: 11, limit: gcra_wire(), lease: 0xdead_beef }],
                    ..Body::default()
                },
            },
            "04060205000000020001040a8094ebdc030105000007010b00000000000000000000000000000000effdb6f50d",
        ),
        (
            Frame { from: 5, incarnation: 6, seq: 0, ack: 128, sack: 5, una: 7, body: Body::default() },
            "040506008001050700",
        ),
        (
            Frame {
                from: 7,
                incarnation: 1,
                seq: 2,
                ack: 3,
                sack: 0,
                una: 2,
                body: Body {
                    replica: vec![KeyState {
                        key: 12,
                        limit: gcra_wire(),
                        state: SnapshotWire::Tat { backlog_nanos: 1_000 },
                        region: PolicyRegion::default(),
                    }],
                    ..Body::default()
                },
            },
            "04070102030002020001040a8094ebdc030105000006010c0000000000000000000000000000000000e807",
        ),
        (
            Frame {
                from: 8,
                incarnation: 1,
                seq: 3,
                ack: 0,
                sack: 0,
                una: 3,
                body: Body {
                    adjust: vec![
                        Adjust {
                            id: 9,
                            key: 13,
                            limit: gcra_wire(),
                            kind: AdjustKind::Refund,
                            hits: 4,
                            mode: WireMode::Exact,
                        },
                        Adjust {
                            id: 10,
                            key: 13,
                            limit: gcra_wire(),
                            kind: AdjustKind::Charge,
                            hits: 300,
                            mode: WireMode::Approximate,
                        },
                    ],
                    ..Body::default()
                },
            },
            "04080103000003020001040a8094ebdc03010500000802090d000000000000000000000000000000000004000a0d0000000000000000000000000000000001ac0201",
        ),
        (
            Frame {
                from: 9,
                incarnation: 1,
                seq: 4,
                ack: 0,
                sack: 0,
                una: 4,
                body: Body {
                    region_report: vec![RegionReport {
                        key: 14,
                        limit: gcra_wire(),
                        demand_per_s: 300,
                        report_count: 5,
                        applied_seq: 2,
                        applied_part: 97,
                        region: PolicyRegion::default(),
                    }],
                    region_grant: vec![RegionGrant {
                        key: 15,
                        limit: gcra_wire(),
                        seq: 3,
                        part: 99,
                        lease_nanos: 2_000_000_000,
                        report_count: 5,
                        first: true,
                        region: PolicyRegion::default(),
                    }],
                    ..Body::default()
                },
            },
            "04090104000004030001040a8094ebdc030105000009010e00000000000000000000000000000000ac020502610a010f00000000000000000000000000000000036380a8d6b9070501",
        ),
        (
            // A policy's terms between regions (`RegionTerms`, the last section): only where they
            // are not the defaults, by section and position.
            Frame {
                from: 9,
                incarnation: 1,
                seq: 5,
                ack: 0,
                sack: 0,
                una: 5,
                body: Body {
                    forward: vec![ForwardCheck {
                        id: 1,
                        key: 16,
                        limit: gcra_wire(),
                        cost: 1,
                        mode: WireMode::Approximate,
                        refused_here: 0,
                        region: PolicyRegion { home: Some(RegionId(7)), fallback: None },
                    }],
                    region_report: vec![
                        RegionReport {
                            key: 14,
                            limit: gcra_wire(),
                            demand_per_s: 300,
                            report_count: 5,
                            applied_seq: 2,
                            applied_part: 97,
                            region: PolicyRegion::default(),
                        },
                        RegionReport {
                            key: 17,
                            limit: gcra_wire(),
                            demand_per_s: 3,
                            report_count: 1,
                            applied_seq: 0,
                            applied_part: 1,
                            region: PolicyRegion {
                                home: Some(RegionId(7)),
                                fallback: Some(RegionFallback::Closed),
                            },
                        },
                    ],
                    ..Body::default()
                },
            },
            "04090105000005040001040a8094ebdc0301050000010101100000000000000000000000000000000001010009020e00000000000000000000000000000000ac020502611100000000000000000000000000000000030100010c020000010700020101070102",
        ),
    ]
}

#[test]
fn golden_frames_are_pinned() {
    assert_eq!(WIRE_VERSION, 4, "a new wire version needs golden frames of its own");
    for (i, (frame, expected)) in golden_frames().into_iter().enumerate() {
        let bytes = enc(&frame);
        assert_eq!(hex(&bytes), expected, "golden frame {i}: the wire format changed");
        assert_eq!(decode(&bytes, MAX), Ok(frame), "golden frame {i}");
    }
}

/// (d) Every single-bit flip of every golden frame, exhaustively.
#[test]
fn golden_frames_survive_every_bit_flip() {
    for (frame, _) in golden_frames() {
        let bytes = enc(&frame);
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let _ = check_decode(&flipped);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// LimitWire validation (h)
// ---------------------------------------------------------------------------------------------

fn wire(algorithm: &str, limit: u64, period_nanos: u64, burst: Option<u64>, delay: Option<u64>) -> LimitWire {
    let algorithm = Algorithm::from_name(algorithm).expect("a known algorithm");
    LimitWire { algorithm, limit, period_nanos, burst, delay, calendar: None }
}

#[test]
fn unknown_algorithm_codes_are_refused() {
    // A replica under a GCRA limit: the algorithm's code is the byte right after the table's
    // section tag and length.
    let frame = Frame {
        from: 7,
        incarnation: 1,
        seq: 2,
        ack: 3,
        sack: 0,
        una: 2,
        body: Body {
            replica: vec![KeyState {
                key: 12,
                limit: gcra_wire(),
                state: SnapshotWire::Tat { backlog_nanos: 9 },
                region: PolicyRegion::default(),
            }],
            ..Body::default()
        },
    };
    let mut bytes = enc(&frame);
    let code_at = 1 + 6 + 1 + 1 + 1; // version, header, section count, table tag, table length
    assert_eq!(bytes[code_at], 4, "{}", hex(&bytes));
    for code in [8u8, 9, 100, 0x7f] {
        bytes[code_at] = code;
        assert_eq!(decode(&bytes, MAX), Err(WireError::UnknownAlgorithm(code)));
    }
    // Code 7 is the expiring counter (added in wire v3: a node built before it refuses it as
    // above; the round trip of every algorithm is checked by the properties).
    assert_eq!(Algorithm::ALL[7], Algorithm::ExpiringCounter);
    bytes[code_at] = 7;
    assert_ne!(decode(&bytes, MAX).err(), Some(WireError::UnknownAlgorithm(7)));
}

#[test]
fn invalid_parameters_are_refused() {
    use LimitError::*;
    let s = 1_000_000_000;
    let cases = [
        (wire("gcra", 0, s, None, None), ZeroLimit),
        (wire("token_bucket", 10, 0, None, None), ZeroPeriod),
        (
            wire("fixed_window", 10, PERIOD_NANOS_MAX + 1, None, None),
            TooLarge { parameter: LimitParameter::Period, max: PERIOD_NANOS_MAX },
        ),
        (
            wire("fixed_window", 10, u64::MAX, None, None),
            TooLarge { parameter: LimitParameter::Period, max: PERIOD_NANOS_MAX },
        ),
        (
            wire("fixed_window", 10, s, Some(1), None),
            NotApplicable { parameter: LimitParameter::Burst, algorithm: Algorithm::FixedWindow },
        ),
        (
            wire("concurrency", 10, s, Some(1), None),
            NotApplicable { parameter: LimitParameter::Burst, algorithm: Algorithm::Concurrency },
        ),
        (
            wire("gcra", 10, s, None, Some(1)),
            NotApplicable { parameter: LimitParameter::Delay, algorithm: Algorithm::Gcra },
        ),
        (wire("token_bucket", 10, s, Some(0), None), ZeroBurst(Algorithm::TokenBucket)),
        (wire("leaky_bucket", 10, s, Some(2), Some(3)), DelayAboveBurst { delay: 3, burst: 2 }),
        (wire("gcra", 2_000, 1_000, None, None), RateTooHigh { limit: 2_000, period_nanos: 1_000 }),
        (
            wire("concurrency", CONCURRENCY_LIMIT_MAX + 1, s, None, None),
            TooLarge { parameter: LimitParameter::Limit, max: CONCURRENCY_LIMIT_MAX },
        ),
    ];
    for (wire, expected) in cases {
        assert_eq!(wire.to_limit(), Err(expected), "{wire:?}");
    }
}

#[test]
fn decisions_saturate_beyond_u64_nanos() {
    let decision = Decision {
        allowed: false,
        limit: 1,
        remaining: 0,
        reset_after: Duration::MAX,
        retry_after: Some(Duration::MAX),
        delay: Duration::ZERO,
        lease: None,
    };
    let wire = DecisionWire::from(decision);
    assert_eq!(wire.reset_after_nanos, u64::MAX);
    assert_eq!(wire.retry_after_nanos, Some(u64::MAX));
}

/// An adjustment naming a limit past the frame's table is refused, like any other item.
#[test]
fn adjustments_name_limits_of_the_table() {
    let adjust = golden_frames().into_iter().find(|(frame, _)| !frame.body.adjust.is_empty());
    let (frame, _) = adjust.expect("the adjust frame");
    let mut bytes = enc(&frame);
    // The first item's limit index is the byte after its 16 key bytes: point it past the table.
    let key_at = bytes.windows(16).position(|w| w == 13u128.to_le_bytes()).expect("the key");
    bytes[key_at + 16] = 5;
    assert_eq!(decode(&bytes, MAX), Err(WireError::LimitIndex { index: 5, len: 1 }));
}

/// (b) The compact form has one encoding too: a limit table with an entry nobody uses, an empty
/// section, or an index past the table is refused.
#[test]
fn tables_and_sections_have_one_encoding() {
    let replica = golden_frames().into_iter().find(|(frame, _)| !frame.body.replica.is_empty());
    let (frame, _) = replica.expect("the replica frame");
    let bytes = enc(&frame);
    // version, 6 header varints, section count 2, Limits tag 0 with one entry (11 bytes of gcra),
    // then Replica tag 6 with one state.
    let header = 1 + 6;
    assert_eq!(&bytes[header..header + 3], &[2, 0, 1], "{}", hex(&bytes));
    let gcra = &bytes[header + 3..header + 3 + 11];
    let rest = &bytes[header + 3 + 11..];
    assert_eq!(rest[0], 6, "{}", hex(&bytes));

    let unused_entry = [&bytes[..header], &[2, 0, 2], gcra, gcra, rest].concat();
    assert_eq!(decode(&unused_entry, MAX), Err(WireError::NonCanonical));
    let empty_section = [&bytes[..header], &[3], &bytes[header + 1..], &[7, 0]].concat();
    assert_eq!(decode(&empty_section, MAX), Err(WireError::NonCanonical));
    let mut past_the_table = bytes.clone();
    let index_at = header + 3 + 11 + 1 + 1 + 16; // Replica tag, count, key
    assert_eq!(past_the_table[index_at], 0);
    past_the_table[index_at] = 1;
    assert_eq!(decode(&past_the_table, MAX), Err(WireError::LimitIndex { index: 1, len: 1 }));
}

/// (b) Region terms have one encoding too: an item naming no report, a default item (sent as
/// nothing) and two items for one report are refused; the golden frame's ends with the section
/// `0c`, two items: (forward 0, home 7, no fallback), (region report 1, home 7, closed).
#[test]
fn region_terms_have_one_encoding() {
    let with_terms = golden_frames()
        .into_iter()
        .find(|(frame, _)| frame.body.forward.iter().any(|f| f.region.home.is_some()));
    let (frame, _) = with_terms.expect("the region terms frame");
    let bytes = enc(&frame);
    let tail = [0x0c, 2, 0, 0, 1, 7, 0, 2, 1, 1, 7, 1, 2];
    let at = bytes.len() - tail.len();
    assert_eq!(&bytes[at..], &tail, "{}", hex(&bytes));
    let with_tail = |tail: &[u8]| [&bytes[..at], tail].concat();
    let no_such_report = with_tail(&[0x0c, 2, 0, 0, 1, 7, 0, 2, 5, 1, 7, 1, 2]);
    assert_eq!(decode(&no_such_report, MAX), Err(WireError::NonCanonical));
    let default_item = with_tail(&[0x0c, 2, 0, 0, 0, 0, 2, 1, 1, 7, 1, 2]);
    assert_eq!(decode(&default_item, MAX), Err(WireError::NonCanonical));
    let twice = with_tail(&[0x0c, 3, 0, 0, 1, 7, 0, 2, 1, 1, 7, 1, 2, 2, 1, 1, 7, 1, 2]);
    assert_eq!(decode(&twice, MAX), Err(WireError::NonCanonical));
    assert_eq!(decode(&bytes, MAX), Ok(frame));
}

/// What a frame costs per item, printed for the README (`cargo test -p ratemesh-core --test wire
/// bytes_per_item -- --nocapture`): forwarded checks and answers under one shared limit, the
/// common case of a batch.
#[test]
fn bytes_per_item() {
    let header =
        |body| Frame { from: 3, incarnation: 1 << 50, seq: 1_000, ack: 900, sack: 0, una: 990, body };
    let keys = || (0..100u128).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835));
    let forward: Vec<ForwardCheck> = keys()
        .enumerate()
        .map(|(i, key)| ForwardCheck {
            id: 5_000 + i as u64,
            key,
            limit: gcra_wire(),
            cost: 1,
            mode: WireMode::Exact,
            refused_here: 0,
            region: PolicyRegion::default(),
        })
        .collect();
    let decision = DecisionWire {
        allowed: true,
        limit: 10,
        remaining: 4,
        reset_after_nanos: 400_000_000,
        retry_after_nanos: None,
        delay_nanos: 0,
        lease: None,
    };
    let decided: Vec<Decided> = (0..100).map(|i| Decided { id: 5_000 + i, decision }).collect();
    let one = |body: Body| enc(&header(body)).len();
    let forward_one = one(Body { forward: forward[..1].to_vec(), ..Body::default() });
    let forward_all = one(Body { forward, ..Body::default() });
    let decided_one = one(Body { decided: decided[..1].to_vec(), ..Body::default() });
    let decided_all = one(Body { decided, ..Body::default() });
    let report: Vec<Report> = keys()
        .map(|key| Report {
            key,
            limit: gcra_wire(),
            epoch: 0x1234,
            holding: 12,
            granted_seen: 4_000,
            uncovered: 0,
            returned: 0,
            refunded: 0,
            demand_per_s: 240,
            seed: None,
            region: PolicyRegion::default(),
        })
        .collect();
    let grant: Vec<Grant> = keys()
        .map(|key| Grant {
            key,
            epoch: 0x1234,
            state: SnapshotWire::Tat { backlog_nanos: 40_000_000 },
            grant: 12,
            hold_max: 15,
            contended: false,
            expires_in_nanos: None,
            lease: false,
        })
        .collect();
    let report_one = one(Body { report: report[..1].to_vec(), ..Body::default() });
    let report_all = one(Body { report, ..Body::default() });
    let grant_one = one(Body { grant: grant[..1].to_vec(), ..Body::default() });
    let grant_all = one(Body { grant, ..Body::default() });
    let heartbeat = one(Body::default());
    let per = |all: usize, one: usize| (all - one) as f64 / 99.0;
    println!(
        "heartbeat {heartbeat} B; forwarded check {:.1} B each (one alone: {forward_one} B); answer {:.1} B \
         each (one alone: {decided_one} B); report {:.1} B each (one alone: {report_one} B); grant {:.1} B \
         each (one alone: {grant_one} B)",
        per(forward_all, forward_one),
        per(decided_all, decided_one),
        per(report_all, report_one),
        per(grant_all, grant_one)
    );
    // A shared limit is written once: a check costs its id, key, index, cost and mode.
    assert!(per(forward_all, forward_one) < 24.0);
}
