//! The top-keys sketch against an exact counter: every estimate within the documented bound,
//! every heavy key present, merging across members and half-windows within the merged bound, and
//! memory bounded under a million distinct keys (measured by a counting allocator).

// The workspace denies `unsafe_code`; counting allocations needs a `#[global_allocator]`, which
// only forwards to the system allocator here.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use ratemesh::top::{SpaceSaving, TopSummary, merge};
use ratemesh_core::Namespace;

/// Counts live heap bytes per thread, to measure what the sketch holds (other tests' threads
/// allocate meanwhile).
struct Counting;

thread_local! {
    static LIVE_BYTES: Cell<isize> = const { Cell::new(0) };
}

fn live_bytes() -> isize {
    LIVE_BYTES.with(Cell::get)
}

fn count(delta: isize) {
    // `try_with`: the thread's counter may be gone while the thread exits.
    let _ = LIVE_BYTES.try_with(|live| live.set(live.get() + delta));
}

// SAFETY: forwards to the system allocator and only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: the caller's layout is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: `ptr` was allocated by `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Streams of hits over a small key space with a skew (a few heavy keys, many light ones).
fn streams() -> impl Strategy<Value = Vec<(u16, u64)>> {
    let key = prop_oneof![3 => 0_u16..4, 7 => 0_u16..2000];
    proptest::collection::vec((key, 1_u64..5), 0..3000)
}

fn exact(stream: &[(u16, u64)]) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    for &(key, weight) in stream {
        *counts.entry(format!("k{key}")).or_insert(0) += weight;
    }
    counts
}

/// The identity of a key, as the node names a bucket (its hash).
fn id(key: &str) -> u128 {
    Namespace::new(b"top").key(key.as_bytes()).0
}

/// An identity whose high half is zero: every key without a counter in the same filter cell
/// (the filter degenerates to one sum; the bounds must hold all the same).
fn one_cell_id(key: &str) -> u128 {
    u128::from(id(key) as u64)
}

/// Counts `weight` hits of `key` in `sketch`, as the node does.
fn add(sketch: &mut SpaceSaving, key: &str, weight: u64) {
    sketch.add(id(key), weight, |text| text.push_str(key));
}

fn sketch_by(stream: &[(u16, u64)], capacity: usize, id: fn(&str) -> u128) -> SpaceSaving {
    let mut sketch = SpaceSaving::new(capacity);
    for &(key, weight) in stream {
        let key = format!("k{key}");
        sketch.add(id(&key), weight, |text| text.push_str(&key));
    }
    sketch
}

fn sketch(stream: &[(u16, u64)], capacity: usize) -> SpaceSaving {
    sketch_by(stream, capacity, id)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn estimates_are_within_the_bound(stream in streams(), capacity in 1_usize..200, one_cell: bool) {
        let id: fn(&str) -> u128 = if one_cell { one_cell_id } else { id };
        let truth = exact(&stream);
        let sketch = sketch_by(&stream, capacity, id);
        let total: u64 = truth.values().sum();
        let bound = sketch.error_bound();
        prop_assert_eq!(sketch.total(), total);
        prop_assert!(sketch.len() <= capacity);
        prop_assert!(bound <= total / capacity as u64, "bound {} > total/capacity {}", bound, total / capacity as u64);
        let summary = sketch.summary();
        for entry in &summary.entries {
            let true_count = truth.get(&entry.key).copied().unwrap_or(0);
            prop_assert!(entry.count >= true_count, "{} underestimated", entry.key);
            prop_assert!(entry.count - true_count <= entry.error, "{} over its own error", entry.key);
            prop_assert!(entry.error <= bound);
        }
        for (key, &true_count) in &truth {
            let estimate = sketch.estimate(id(key));
            prop_assert!(estimate >= true_count && estimate - true_count <= bound, "{} off", key);
            if true_count > bound {
                prop_assert!(summary.entries.iter().any(|e| &e.key == key), "heavy {} missing", key);
            }
        }
    }

    #[test]
    fn merged_estimates_are_within_the_merged_bound(
        parts in proptest::collection::vec(streams(), 1..6),
        capacity in 1_usize..100,
        n in 1_usize..20,
    ) {
        let summaries: Vec<TopSummary> = parts.iter().map(|part| sketch(part, capacity).summary()).collect();
        let all: Vec<(u16, u64)> = parts.concat();
        let truth = exact(&all);
        let answer = merge(&summaries, n, Duration::from_secs(60));
        let total: u64 = truth.values().sum();
        prop_assert_eq!(answer.total, total);
        let per_part: u64 = parts.iter().map(|p| p.iter().map(|(_, w)| w).sum::<u64>() / capacity as u64).sum();
        prop_assert!(answer.error_bound <= per_part);
        prop_assert!(answer.entries.len() <= n);
        for entry in &answer.entries {
            let true_count = truth.get(&entry.key).copied().unwrap_or(0);
            prop_assert!(entry.count >= true_count && entry.count - true_count <= answer.error_bound);
            prop_assert!(entry.count - true_count <= entry.error);
        }
        // Ranking: a key left out was not hit more than the last listed key's estimate (or the bound).
        let last = answer.entries.last().map_or(0, |e| e.count);
        if answer.entries.len() == n {
            for (key, &true_count) in &truth {
                if !answer.entries.iter().any(|e| &e.key == key) {
                    prop_assert!(true_count <= last.max(answer.error_bound), "{} ({}) left out", key, true_count);
                }
            }
        }
    }
}

#[test]
fn memory_is_bounded_under_a_million_distinct_keys() {
    let capacity = 128;
    let before = live_bytes();
    let mut sketch = SpaceSaving::new(capacity);
    let mut key = String::with_capacity(64);
    let mut peak = 0;
    for i in 0..1_000_000_u32 {
        key.clear();
        // 64-byte keys, the default cut: the largest a counter holds.
        use std::fmt::Write as _;
        write!(key, "{i:064}").expect("write to a string");
        add(&mut sketch, &key, 1);
        // Three heavy keys among them.
        if i % 100 == 0 {
            add(&mut sketch, &format!("abusive-{}", i % 3), 10);
        }
        if i % 10_000 == 0 {
            peak = peak.max(live_bytes() - before);
        }
    }
    let held = live_bytes() - before - key.capacity() as isize;
    println!(
        "sketch of {capacity} counters after 1 000 000 distinct keys: {held} bytes live (peak {peak}), estimated {}",
        sketch.heap_bytes()
    );
    assert!(sketch.len() <= capacity);
    // 128 counters × (a 64-byte key + identity + count + error + index slot) and the filter's
    // 1024 cells of 8 bytes: about 29 KB measured.
    assert!(held < 64 * 1024, "{held} bytes");
    assert!(peak < 64 * 1024, "{peak} bytes at peak");
    let top = merge(&[sketch.summary()], 3, Duration::ZERO);
    let keys: Vec<_> = top.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|k| k.starts_with("abusive-")), "{keys:?}");
    for entry in &top.entries {
        // Each abusive key: 3334 or 3333 additions of 10.
        let truth = if entry.key == "abusive-0" { 33_340 } else { 33_330 };
        assert!(
            entry.count >= truth && entry.count - truth <= top.error_bound,
            "{entry:?}, bound {}",
            top.error_bound
        );
    }
}
