//! Snapshots: export/import keeps every future decision; join is commutative, idempotent,
//! associative and never looser than either side; a snapshot of another family is refused.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use rand::SeedableRng;
use ratemesh_core::{
    Algorithm, Bucket, CoreRng, Instant, LeaseId, Limit, LimitSpec, Snapshot, SnapshotMismatch,
};

use crate::config;
use crate::generate::{Clock, Op, Step, ops, pick_lease, spec};
use crate::model::period_nanos;

/// Runs `ops` on `bucket` from `start` on; returns the effective `now` after them.
fn play(bucket: &mut Bucket, limit: &Limit, start: u64, seed: u64, ops: &[(Step, Op)]) -> u64 {
    let mut rng = CoreRng::seed_from_u64(seed);
    let mut clock = Clock::new(start);
    let mut granted = Vec::new();
    for &(step, op) in ops {
        let at = clock.step(step);
        match op {
            Op::Check(cost) => granted.extend(bucket.check(limit, cost, at, &mut rng).lease),
            Op::Refund(hits) => bucket.refund(limit, hits, at),
            Op::Force(hits) => bucket.force(limit, hits, at),
            Op::Release(pick) => {
                bucket.release(limit, pick_lease(&granted, pick), at);
            }
        }
    }
    clock.now()
}

/// Runs the same `ops` on `a` (from instant `from`) and on `b` (from `from + shift`, another
/// node's clock), never earlier than `from`, and requires the same decisions and releases.
fn same_future(
    limit: &Limit,
    (mut a, mut b): (Bucket, Bucket),
    from: u64,
    shift: u64,
    seed: u64,
    ops: &[(Step, Op)],
) -> Result<(), TestCaseError> {
    let (mut rng_a, mut rng_b) = (CoreRng::seed_from_u64(seed), CoreRng::seed_from_u64(seed));
    let mut clock = Clock::new(from);
    let mut granted = Vec::new();
    for (i, &(step, op)) in ops.iter().enumerate() {
        // The buckets may have seen different instants before `from`; only later ones compare.
        let at = clock.step(step).max(Instant::from_nanos(from));
        let shifted = at.add_nanos(shift);
        match op {
            Op::Check(cost) => {
                let (x, y) =
                    (a.check(limit, cost, at, &mut rng_a), b.check(limit, cost, shifted, &mut rng_b));
                prop_assert_eq!(x, y, "op {} {:?} at {}", i, op, at.as_nanos());
                granted.extend(x.lease);
            }
            Op::Refund(hits) => {
                a.refund(limit, hits, at);
                b.refund(limit, hits, shifted);
            }
            Op::Force(hits) => {
                a.force(limit, hits, at);
                b.force(limit, hits, shifted);
            }
            Op::Release(pick) => {
                let lease = pick_lease(&granted, pick);
                prop_assert_eq!(a.release(limit, lease, at), b.release(limit, lease, shifted), "op {}", i);
            }
        }
    }
    Ok(())
}

/// A bucket importing `first` at `at` and joining the `rest`.
fn joined(limit: &Limit, first: &Snapshot, rest: &[&Snapshot], at: Instant) -> Bucket {
    let mut bucket = Bucket::import(limit, first.clone(), at).expect("same family");
    for snapshot in rest {
        bucket.join(limit, (*snapshot).clone(), at).expect("same family");
    }
    bucket
}

fn query(bucket: &Bucket, limit: &Limit, at: Instant) -> ratemesh_core::Decision {
    bucket.clone().check(limit, 0, at, &mut CoreRng::seed_from_u64(0))
}

/// A limit, a start, three histories with their seeds, a future, and how far past the histories
/// the snapshots are taken.
#[derive(Clone, Debug)]
struct Case {
    spec: LimitSpec,
    start: u64,
    histories: [(u64, Vec<(Step, Op)>); 3],
    future: Vec<(Step, Op)>,
    gap: u64,
    shift: u64,
}

/// `forced`: whether histories contain forced hits. Without them a log or lease table never
/// outgrows its bound, and the join is exact.
fn case(forced: bool) -> impl Strategy<Value = Case> {
    select(Algorithm::ALL.to_vec()).prop_flat_map(spec).prop_flat_map(move |spec| {
        let period = period_nanos(&spec);
        let history = (any::<u64>(), ops(&spec, forced, 40));
        (
            Just(spec.clone()),
            0..=10 * period,
            [history.clone(), history.clone(), history],
            ops(&spec, true, 40),
            prop_oneof![Just(0), 0..=2 * period],
            prop_oneof![Just(0), 0..=1_000_000_000_000u64],
        )
            .prop_map(|(spec, start, histories, future, gap, shift)| Case {
                spec,
                start,
                histories,
                future,
                gap,
                shift,
            })
    })
}

impl Case {
    /// The three buckets after their histories, and the common instant after all of them.
    fn buckets(&self, limit: &Limit) -> ([Bucket; 3], u64) {
        let mut end = self.start;
        let buckets = self.histories.clone().map(|(seed, ops)| {
            let mut bucket = Bucket::new(limit, Instant::from_nanos(self.start));
            end = end.max(play(&mut bucket, limit, self.start, seed, &ops));
            bucket
        });
        (buckets, end + self.gap)
    }
}

proptest! {
    #![proptest_config(config(160))]

    /// A bucket imported from an export decides as the original from then on, also on another
    /// node whose clock reads differently.
    #[test]
    fn export_then_import_decides_the_same(c in case(true)) {
        let limit = Limit::new(c.spec.clone()).expect("valid spec");
        let ([a, _, _], t) = c.buckets(&limit);
        let snapshot = a.export(Instant::from_nanos(t));
        let imported = Bucket::import(&limit, snapshot, Instant::from_nanos(t + c.shift)).expect("same family");
        same_future(&limit, (a, imported), t, c.shift, c.histories[1].0, &c.future)?;
    }

    /// Joining is commutative, idempotent and associative in its decisions, and never looser than
    /// either side: remaining is at most each input's, and whatever the join admits, each input
    /// would have admitted.
    #[test]
    fn join_is_a_semilattice_and_never_looser(c in case(false)) {
        let limit = Limit::new(c.spec.clone()).expect("valid spec");
        let ([a, b, x], t) = c.buckets(&limit);
        let at = Instant::from_nanos(t);
        let (sa, sb, sc) = (a.export(at), b.export(at), x.export(at));
        let seed = c.histories[0].0;
        let same = |p: Bucket, q: Bucket| same_future(&limit, (p, q), t, 0, seed, &c.future);

        same(joined(&limit, &sa, &[&sb], at), joined(&limit, &sb, &[&sa], at))?;
        same(joined(&limit, &sa, &[&sa], at), joined(&limit, &sa, &[], at))?;
        let mut own = a.clone();
        own.join(&limit, sa.clone(), at).expect("same family");
        same(own, a.clone())?;
        let bc = joined(&limit, &sb, &[&sc], at).export(at);
        same(joined(&limit, &sa, &[&sb, &sc], at), joined(&limit, &sa, &[&bc], at))?;

        let ab = joined(&limit, &sa, &[&sb], at);
        let remaining = query(&ab, &limit, at).remaining;
        prop_assert!(remaining <= query(&a, &limit, at).remaining);
        prop_assert!(remaining <= query(&b, &limit, at).remaining);
        let period = period_nanos(&c.spec);
        for &(step, op) in &c.future {
            let (Step::Forward(d) | Step::Back(d), Op::Check(cost)) = (step, op) else { continue };
            let later = at.add_nanos(d % (3 * period));
            let admits = |bucket: &Bucket| {
                bucket.clone().check(&limit, cost, later, &mut CoreRng::seed_from_u64(0)).allowed
            };
            if admits(&ab) {
                prop_assert!(admits(&a) && admits(&b), "the join admits cost {} at +{}", cost, d % (3 * period));
            }
        }
    }

    /// With forced hits a log or a lease table can outgrow its bound and be merged
    /// conservatively; a snapshot can arrive late, and a bucket can receive its own state back
    /// (a lease then known on both sides with different expiries). Whatever the joined bucket
    /// admits, both the bucket and the snapshot alone would have admitted.
    #[test]
    fn join_is_never_looser_than_either_side(c in case(true), late in 0..=3u64) {
        let limit = Limit::new(c.spec.clone()).expect("valid spec");
        let ([a, b, _], t) = c.buckets(&limit);
        let period = period_nanos(&c.spec);
        let (at, arrival) = (Instant::from_nanos(t), Instant::from_nanos(t + late * period / 2));
        for theirs in [b.export(at), a.export(at)] {
            let mut joined = a.clone();
            joined.join(&limit, theirs.clone(), arrival).expect("same family");
            let alone = Bucket::import(&limit, theirs, arrival).expect("same family");
            for &(step, op) in &c.future {
                let (Step::Forward(d) | Step::Back(d), Op::Check(cost)) = (step, op) else { continue };
                let later = arrival.add_nanos(d % (3 * period));
                let admits = |bucket: &Bucket| {
                    bucket.clone().check(&limit, cost, later, &mut CoreRng::seed_from_u64(0)).allowed
                };
                if admits(&joined) {
                    prop_assert!(admits(&a) && admits(&alone), "the join admits cost {} at {:?}", cost, later);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config(128))]

    /// A join at a `now` earlier than one the bucket has seen is no time passing: the snapshot,
    /// taken at the sender's now, is anchored at the bucket's now, not in its past.
    #[test]
    fn join_with_time_going_backwards_is_no_time_passing(c in case(true), back in 1..=u64::MAX) {
        let limit = Limit::new(c.spec.clone()).expect("valid spec");
        let ([mut a, b, _], t) = c.buckets(&limit);
        let at = Instant::from_nanos(t);
        a.refund(&limit, 0, at);
        let theirs = b.export(at);
        let mut late = a.clone();
        late.join(&limit, theirs.clone(), at.sub_nanos(back)).expect("same family");
        a.join(&limit, theirs, at).expect("same family");
        same_future(&limit, (late, a), t, 0, c.histories[2].0, &c.future)?;
    }
}

proptest! {
    #![proptest_config(config(128))]

    /// On a node whose clock reads less than a snapshot's ages (one that started recently), times
    /// before its epoch cannot be represented: the import is then not exact, but never looser.
    #[test]
    fn import_on_a_younger_clock_is_never_looser(c in case(true), their_now in any::<u64>()) {
        let limit = Limit::new(c.spec.clone()).expect("valid spec");
        let ([a, _, _], t) = c.buckets(&limit);
        let (at, their_now) = (Instant::from_nanos(t), their_now % (t + 1));
        let imported =
            Bucket::import(&limit, a.export(at), Instant::from_nanos(their_now)).expect("same family");
        let period = period_nanos(&c.spec);
        for &(step, op) in &c.future {
            let (Step::Forward(d) | Step::Back(d), Op::Check(cost)) = (step, op) else { continue };
            let d = d % (3 * period);
            let admits = |bucket: &Bucket, now: u64| {
                let later = Instant::from_nanos(now + d);
                bucket.clone().check(&limit, cost, later, &mut CoreRng::seed_from_u64(0)).allowed
            };
            if admits(&imported, their_now) {
                prop_assert!(admits(&a, t), "the import admits cost {} at +{}", cost, d);
            }
        }
    }
}

/// Regression: a join at an earlier `now` anchored the peer's state in the bucket's past, so the
/// peer's leases (and hits) counted for less time than they should.
#[test]
fn a_late_join_keeps_the_peers_leases() {
    let limit = Limit::new(LimitSpec::new(Algorithm::Concurrency, 1, std::time::Duration::from_secs(10)))
        .expect("valid");
    let mut rng = CoreRng::seed_from_u64(0);
    let mut bucket = Bucket::new(&limit, Instant::ZERO);
    assert!(bucket.check(&limit, 0, Instant::from_millis(20_000), &mut rng).allowed);
    let theirs = Snapshot::Leases { leases: vec![(LeaseId(7), 1, 5_000_000_000)] };
    bucket.join(&limit, theirs, Instant::from_millis(19_000)).expect("same family");
    let d = bucket.check(&limit, 1, Instant::from_millis(20_000), &mut rng);
    assert_eq!((d.allowed, d.retry_after), (false, Some(std::time::Duration::from_secs(5))));
}

fn family(snapshot: &Snapshot) -> &'static str {
    match snapshot {
        Snapshot::Tat { .. } => "tat",
        Snapshot::Window { .. } => "window",
        Snapshot::Log { .. } => "log",
        Snapshot::Leases { .. } => "leases",
        Snapshot::Calendar { .. } => "calendar",
    }
}

fn family_of(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter | Algorithm::ExpiringCounter => "window",
        Algorithm::SlidingWindowLog => "log",
        Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucketShaper => "tat",
        Algorithm::Concurrency => "leases",
    }
}

/// Import and join of a snapshot of another algorithm family are refused, naming the limit's
/// algorithm, and leave the bucket unchanged; within a family they are accepted.
#[test]
fn snapshots_of_another_family_are_refused() {
    let now = Instant::from_millis(5_000);
    let snapshots = [
        Snapshot::Tat { backlog_nanos: 7 },
        Snapshot::Window { elapsed_nanos: 3, prev: 1, curr: 2 },
        Snapshot::Log { hits: vec![(1, 1)] },
        Snapshot::Leases { leases: vec![(LeaseId(9), 1, 100)] },
    ];
    for algorithm in Algorithm::ALL {
        let limit =
            Limit::new(LimitSpec::new(algorithm, 3, std::time::Duration::from_secs(1))).expect("valid");
        let mut bucket = Bucket::new(&limit, now);
        bucket.check(&limit, 1, now, &mut CoreRng::seed_from_u64(3));
        let before = bucket.clone();
        for snapshot in &snapshots {
            let same_family = family(snapshot) == family_of(algorithm);
            let imported = Bucket::import(&limit, snapshot.clone(), now);
            let joined = bucket.join(&limit, snapshot.clone(), now);
            if same_family {
                assert!(imported.is_ok() && joined.is_ok(), "{algorithm:?} {snapshot:?}");
                bucket = before.clone();
            } else {
                let refused = Err(SnapshotMismatch(algorithm.name()));
                assert_eq!(imported.map(|_| ()), refused, "{algorithm:?} {snapshot:?}");
                assert_eq!(joined, refused, "{algorithm:?} {snapshot:?}");
                assert_eq!(bucket, before, "a refused join changed the bucket");
            }
        }
    }
}

/// A snapshot carries times relative to the sender's `now`: a TAT backlog or a window's elapsed
/// time means the same on a node whose clock reads differently.
#[test]
fn snapshots_are_relative_to_now() {
    let limit = Limit::new(LimitSpec::new(Algorithm::FixedWindow, 3, std::time::Duration::from_secs(1)))
        .expect("valid");
    let mut rng = CoreRng::seed_from_u64(0);
    let mut bucket = Bucket::new(&limit, Instant::from_millis(1_200));
    for _ in 0..3 {
        assert!(bucket.check(&limit, 1, Instant::from_millis(1_200), &mut rng).allowed);
    }
    let snapshot = bucket.export(Instant::from_millis(1_700));
    assert_eq!(snapshot, Snapshot::Window { elapsed_nanos: 700_000_000, prev: 0, curr: 3 });
    // On a node at 50 s, the window ends 300 ms later, at 50.3 s.
    let mut other = Bucket::import(&limit, snapshot, Instant::from_millis(50_000)).expect("same family");
    let decision = other.check(&limit, 1, Instant::from_millis(50_000), &mut rng);
    assert_eq!(decision.retry_after, Some(std::time::Duration::from_millis(300)));
    assert!(other.check(&limit, 1, Instant::from_millis(50_300), &mut rng).allowed);
}

proptest! {
    #![proptest_config(config(64))]

    /// Joining snapshots in any order and with repeats gives one decision sequence.
    #[test]
    fn join_order_and_repeats_do_not_matter(
        c in case(false),
        order in vec(0..3usize, 1..8),
    ) {
        let limit = Limit::new(c.spec.clone()).expect("valid spec");
        let ([a, b, x], t) = c.buckets(&limit);
        let at = Instant::from_nanos(t);
        let snapshots = [a.export(at), b.export(at), x.export(at)];
        let all = joined(&limit, &snapshots[0], &[&snapshots[1], &snapshots[2]], at);
        let mut any_order: Vec<&Snapshot> = order.iter().map(|&i| &snapshots[i]).collect();
        any_order.extend(snapshots.iter());
        let mixed = joined(&limit, any_order[0], &any_order[1..], at);
        same_future(&limit, (all, mixed), t, 0, c.histories[2].0, &c.future)?;
    }
}
