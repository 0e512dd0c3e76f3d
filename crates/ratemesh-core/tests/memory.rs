//! Memory per tracked key, measured with a counting global allocator.
//!
//! Run with `cargo test -p ratemesh-core --test memory -- --nocapture --test-threads=1` to see the
//! numbers. The goal: at most 64 bytes of state per key plus the 16-byte key hash; the hash table's
//! own overhead (its control bytes, its growth slack) is reported separately.

// The workspace denies `unsafe_code`. Counting allocations needs a `#[global_allocator]`, and
// `GlobalAlloc` is an unsafe trait: its impl (which only forwards to `System` and counts) must be
// `unsafe impl`. This file is a test binary of its own, so the allowance reaches nothing else.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::mem::{align_of, size_of};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ratemesh_core::{Algorithm, Bucket, Instant, KeyHash, Limit, LimitSpec, Namespace, Store, StoreConfig};

/// Forwards to the system allocator and keeps the number of live heap bytes.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees carry over; the counter is only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc_zeroed`'s contract.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is; `ptr` was allocated by this allocator, i.e. by `System`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is; `ptr` was allocated by `System` with `layout`.
        let new_ptr = unsafe { System.realloc(ptr, layout, new_size) };
        if !new_ptr.is_null() {
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
        }
        new_ptr
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Tests run on several threads by default; measurements must not see each other's allocations.
static SERIAL: Mutex<()> = Mutex::new(());

const KEYS: u64 = 100_000;

/// The goal for a key's state (bucket plus store bookkeeping), excluding the key itself.
const STATE_BYTES_MAX: usize = 64;
/// Everything the store holds per key, hash table included, with its growth slack. 100 000 keys fill
/// 76 % of the table's 131 072 slots of 64 + 1 bytes (measured: 85.2 B; the bound leaves ~15 %).
const TOTAL_BYTES_PER_KEY_MAX: f64 = 98.0;

/// The state the store keeps next to each bucket: its TTL instant (`store::Entry` is private; this
/// mirrors its fields).
type EntryValue = (Instant, Bucket);

/// The store's table slot (`store::Entry<()>`: the key beside its state, no cached hash), mirrored
/// to learn its size with padding.
#[allow(dead_code)] // Only measured with `size_of`.
struct TableSlot {
    key: KeyHash,
    value: EntryValue,
}

/// The table's (hashbrown `HashTable`) control byte, one per slot.
const CONTROL_BYTES: usize = 1;

struct Measured {
    live_bytes: usize,
    per_key: f64,
}

/// Fills a fresh store with `KEYS` keys under `limit` and measures the live heap bytes it holds.
fn measure(limit: &Limit) -> Measured {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let namespace = Namespace::new(b"memory");
    let now = Instant::from_millis(1_000);
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut store: Store = Store::new(StoreConfig { keys_max: 1_000_000, ..StoreConfig::default() }, 1);
    for i in 0..KEYS {
        // Keys are hashed on the stack: no allocation outside the store.
        let decision = store.check(namespace.key(&i.to_le_bytes()), limit, 1, now);
        assert!(decision.allowed);
    }
    let live_bytes = LIVE_BYTES.load(Ordering::Relaxed) - before;
    assert_eq!(store.len(), KEYS as usize);
    drop(store);
    Measured { live_bytes, per_key: live_bytes as f64 / KEYS as f64 }
}

fn report(name: &str, measured: &Measured) {
    let state = size_of::<EntryValue>();
    let slot = size_of::<TableSlot>();
    let per_key_min = slot + CONTROL_BYTES;
    println!("{name}: {KEYS} keys, {} live heap bytes", measured.live_bytes);
    println!(
        "  size_of: KeyHash {} (align {}), Bucket {}, Instant (TTL) {}, state = Bucket + TTL {}",
        size_of::<KeyHash>(),
        align_of::<KeyHash>(),
        size_of::<Bucket>(),
        size_of::<Instant>(),
        state,
    );
    println!(
        "  table slot (key {} + state {} + padding {}) = {slot} B; control byte {} B",
        size_of::<KeyHash>(),
        state,
        slot - size_of::<KeyHash>() - state,
        CONTROL_BYTES,
    );
    println!(
        "  per key: state {state} B + key {} B = {} B; table overhead at 100 % load {} B; measured total {:.1} B",
        size_of::<KeyHash>(),
        state + size_of::<KeyHash>(),
        per_key_min - state - size_of::<KeyHash>(),
        measured.per_key,
    );
    println!(
        "  hash table overhead per key (measured total - state - key): {:.1} B",
        measured.per_key - (state + size_of::<KeyHash>()) as f64
    );
    println!(
        "  measured total / minimum ({per_key_min} B at 100 % load) = {:.2} (growth slack)",
        measured.per_key / per_key_min as f64
    );
}

fn check_bounds(measured: &Measured) {
    assert!(size_of::<EntryValue>() <= STATE_BYTES_MAX, "state per key {} B", size_of::<EntryValue>());
    assert!(size_of::<KeyHash>() <= 16);
    // The measurement can only be above the slots' own size: it includes the table's slack.
    assert!(measured.per_key >= (size_of::<TableSlot>() + CONTROL_BYTES) as f64);
    assert!(
        measured.per_key <= TOTAL_BYTES_PER_KEY_MAX,
        "{:.1} B per key, more than {TOTAL_BYTES_PER_KEY_MAX}",
        measured.per_key
    );
}

#[test]
fn bucket_is_at_most_40_bytes() {
    assert!(size_of::<Bucket>() <= 40, "Bucket is {} bytes", size_of::<Bucket>());
}

#[test]
fn token_bucket_keys_fit_the_memory_budget() {
    let spec = LimitSpec::new(Algorithm::TokenBucket, 100, Duration::from_secs(1)).with_burst(100);
    let measured = measure(&Limit::new(spec).expect("valid limit"));
    report("token bucket", &measured);
    check_bounds(&measured);
}

#[test]
fn fixed_window_keys_fit_the_memory_budget() {
    let spec = LimitSpec::new(Algorithm::FixedWindow, 100, Duration::from_secs(60));
    let measured = measure(&Limit::new(spec).expect("valid limit"));
    report("fixed window", &measured);
    check_bounds(&measured);
}

/// The audit's memory per audited key at its owner (docs/audit.md, Cost): the closed windows of
/// the last minute (61 of 1 s, 48 B each, in a deque of 64), one or two open windows (96 B each),
/// the ideal bucket and the record's header, and its slot in the records' table with the table's
/// growth slack (measured: 4 051 B at 2 000 keys, a table half full).
const AUDIT_BYTES_PER_KEY_MAX: f64 = 5_120.0;
const AUDIT_KEYS: u64 = 2_000;

/// Live heap bytes of a one-node core after `AUDIT_KEYS` keys under `policy` were each checked
/// every 250 ms for 65 s of its clock (the audit's last minute full) and its timers ran.
fn node_bytes(policy: &ratemesh_core::Policy) -> usize {
    use ratemesh_core::{CheckOutcome, CheckRequest, Node, NodeConfig, NodeId, RequestId};
    let policy = std::sync::Arc::new(policy.clone());
    let namespace = Namespace::new(b"audit memory");
    let keys: Vec<KeyHash> = (0..AUDIT_KEYS).map(|i| namespace.key(&i.to_le_bytes())).collect();
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut node = Node::new(NodeId(1), 1, NodeConfig::default(), 7, Instant::ZERO).expect("valid config");
    for step in 1..=260u64 {
        let now = Instant::from_millis(step * 250);
        for &key in &keys {
            let request = CheckRequest { id: RequestId(0), key, policy: policy.clone(), cost: 1 };
            let outcome = node.handle_check(now, request);
            assert!(matches!(outcome, CheckOutcome::Decided(ref d) if d.allowed), "{outcome:?}");
        }
        while let Some(at) = node.poll_timeout().filter(|&at| at <= now) {
            node.handle_timeout(at.max(now));
        }
        while node.poll_transmit().is_some() || node.poll_event().is_some() {}
    }
    let bytes = LIVE_BYTES.load(Ordering::Relaxed) - before;
    drop(node);
    bytes
}

#[test]
fn an_audited_key_costs_its_owner_a_minute_of_windows() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let spec = LimitSpec::new(Algorithm::TokenBucket, 1_000, Duration::from_secs(1)).with_burst(1_000);
    let limit = Limit::new(spec).expect("valid limit");
    let audited = ratemesh_core::Policy::new(limit, ratemesh_core::Mode::Approximate);
    let unaudited = ratemesh_core::Policy { audit: ratemesh_core::Audit::Off, ..audited.clone() };
    let (on, off) = (node_bytes(&audited), node_bytes(&unaudited));
    let per_key = (on as f64 - off as f64) / AUDIT_KEYS as f64;
    println!(
        "the audit: {AUDIT_KEYS} keys checked every 250 ms for 65 s: {on} live bytes with it, {off} without: \
         {per_key:.0} B per audited key"
    );
    // At least the minute of closed windows it keeps; at most the stated bound.
    assert!(per_key >= 61.0 * 48.0, "{per_key:.0} B per key: less than the minute of windows it keeps");
    assert!(
        per_key <= AUDIT_BYTES_PER_KEY_MAX,
        "{per_key:.0} B per key, more than {AUDIT_BYTES_PER_KEY_MAX}"
    );
}
