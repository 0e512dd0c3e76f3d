//! The keyed store: the buckets of many keys, bounded in number, expiring when idle.
//!
//! - Every entry carries the instant after which its bucket is indistinguishable from a fresh one
//!   (`fresh_at`, its TTL). Dropping it after that loses nothing, so expiry is exact, not a guess.
//! - `keys_max` bounds the table. Inserting into a full table first drops an entry: among
//!   `eviction_sample_len` entries drawn at random (seeded), the one that becomes fresh soonest;
//!   an expired one if the sample holds any (counted as expired), otherwise a live one (counted as
//!   evicted: that key's next request starts from a fresh bucket, which the metrics make visible).
//! - [`Store::sweep`] walks a bounded number of entries per call and drops the expired ones, so
//!   memory follows the live key set without a full scan.
//! - Layout: one flat open-addressing table (hashbrown's SwissTable) whose slots hold the key, its
//!   TTL and its bucket together (64 bytes without extra data), so a lookup reads one control-byte
//!   group and then the slot itself: two dependent memory accesses.
//! - A check that consumes nothing (a refusal, a query) on an unknown key inserts nothing, so
//!   refused floods of random keys cannot fill the table.
//! - Sliding window logs grow with their traffic (up to `SLIDING_LOG_ENTRIES_MAX`, 100 000
//!   entries of 16 bytes each per key, whatever the limit):
//!   `log_bytes_max` bounds all of them together. Past it, a log that is changed is coarsened
//!   (halved, conservatively: it may refuse a little early, never admit more) until the total is
//!   back under the bound or the log is down to one entry; counted in
//!   [`StoreStats::logs_coarsened`]. The total is [`StoreStats::log_bytes`].

use core::hash::BuildHasher;

use hashbrown::HashTable;
use rand::{RngExt, SeedableRng};

use crate::algorithm::{Bucket, CoreRng, LOG_ENTRY_BYTES, Snapshot, SnapshotMismatch};
use crate::decision::Decision;
use crate::key::{KeyHash, KeyHasherBuilder};
use crate::limit::Limit;
use crate::time::Instant;

/// Bounds of a [`Store`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// The most keys tracked at once.
    pub keys_max: usize,
    /// The most entries one [`Store::sweep`] call examines.
    pub sweep_len_max: usize,
    /// How many entries are sampled to choose one to evict from a full table.
    pub eviction_sample_len: usize,
    /// The most bytes the entries of all sliding window logs may take together (see the module
    /// documentation). Default 64 MiB.
    pub log_bytes_max: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            keys_max: 1_000_000,
            sweep_len_max: 1024,
            eviction_sample_len: 8,
            log_bytes_max: 64 << 20,
        }
    }
}

/// Counters of a [`Store`], for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Keys inserted since the store was created.
    pub inserted: u64,
    /// Entries dropped because they had become fresh (no information lost).
    pub expired: u64,
    /// Live entries dropped because the table was full (their keys restart fresh).
    pub evicted: u64,
    /// Bytes the sliding window logs' entries take now (bounded by `log_bytes_max`).
    pub log_bytes: u64,
    /// Times a sliding window log was coarsened to stay within `log_bytes_max`.
    pub logs_coarsened: u64,
}

/// The counters of several stores (a driver's lanes) add up field by field.
impl core::ops::AddAssign for StoreStats {
    fn add_assign(&mut self, other: StoreStats) {
        let StoreStats { inserted, expired, evicted, log_bytes, logs_coarsened } = other;
        self.inserted += inserted;
        self.expired += expired;
        self.evicted += evicted;
        self.log_bytes += log_bytes;
        self.logs_coarsened += logs_coarsened;
    }
}

/// What the sliding window logs of a store take, against its bound.
#[derive(Clone, Copy, Debug, Default)]
struct LogBudget {
    /// Entries the logs' buffers have room for, together.
    entries: usize,
    entries_max: usize,
    coarsened: u64,
}

impl LogBudget {
    /// Accounts for `bucket`, which had room for `before` log entries, after a change, and
    /// coarsens it while the logs are over the bound.
    #[inline]
    fn changed(&mut self, before: usize, bucket: &mut Bucket) {
        let mut after = bucket.log_capacity();
        if before == 0 && after == 0 {
            return;
        }
        self.entries = (self.entries + after).saturating_sub(before);
        while self.entries > self.entries_max && bucket.coarsen_log() {
            let shrunk = bucket.log_capacity();
            self.entries = self.entries.saturating_sub(after - shrunk);
            after = shrunk;
            self.coarsened += 1;
        }
    }

    /// Accounts for a bucket that is dropped.
    #[inline]
    fn removed(&mut self, bucket: &Bucket) {
        self.entries = self.entries.saturating_sub(bucket.log_capacity());
    }
}

/// Data kept beside a key's bucket by a user of the store (the cluster node keeps its per-key
/// bookkeeping there); `()` for none.
pub trait KeyExtra {
    /// The entry must be kept until then even if its bucket is fresh (e.g. unreported hits).
    fn keep_until(&self) -> Instant {
        Instant::ZERO
    }
}

impl KeyExtra for () {}

/// One slot of the table: the key and everything kept for it, side by side (64 bytes for `X = ()`).
#[derive(Clone, Debug)]
struct Entry<X> {
    key: KeyHash,
    fresh_at: Instant,
    bucket: Bucket,
    extra: X,
}

impl<X: KeyExtra> Entry<X> {
    #[inline]
    fn refresh(&mut self, limit: &Limit) {
        self.fresh_at = self.bucket.fresh_at(limit).max(self.extra.keep_until());
    }
}

/// The table hash of `key`: the key is a uniform hash already, [`KeyHasherBuilder`] only folds it.
#[inline]
fn table_hash(key: KeyHash) -> u64 {
    KeyHasherBuilder::default().hash_one(key)
}

/// How many slots one [`Store::sweep`] call may pass over per entry it may examine: empty slots
/// cost one control byte each, and this bounds a call's work on a sparse table (one that held
/// many more keys once: the table does not shrink).
const SWEEP_SLOTS_PER_ENTRY: usize = 8;

/// How many random slots an eviction sample draws before it settles for the next occupied one.
const SAMPLE_DRAWS_MAX: usize = 32;

/// The buckets of many keys, each with optional extra data `X`. See the module documentation for
/// the bounds.
#[derive(Clone, Debug)]
pub struct Store<X = ()> {
    config: StoreConfig,
    /// Hashed with [`table_hash`]. Its slot order (which [`Store::keys`] follows) depends only on
    /// the sequence of operations, so it is deterministic.
    entries: HashTable<Entry<X>>,
    rng: CoreRng,
    /// The table slot (bucket index) the next sweep starts at.
    sweep_cursor: usize,
    /// Counts inserts that may have moved entries (see [`Store::layout`]).
    layout: u64,
    stats: StoreStats,
    logs: LogBudget,
}

impl<X: KeyExtra> Store<X> {
    /// An empty store; `seed` decides eviction samples and lease ids.
    pub fn new(config: StoreConfig, seed: u64) -> Store<X> {
        Store {
            config: StoreConfig { keys_max: config.keys_max.max(1), ..config },
            entries: HashTable::new(),
            rng: CoreRng::seed_from_u64(seed),
            sweep_cursor: 0,
            layout: 0,
            stats: StoreStats::default(),
            logs: LogBudget { entries_max: config.log_bytes_max / LOG_ENTRY_BYTES, ..LogBudget::default() },
        }
    }

    /// Returns `hits` to `key` (see [`Bucket::refund`]). An unknown key is full already.
    pub fn refund(&mut self, key: KeyHash, limit: &Limit, hits: u64, now: Instant) {
        self.update(key, limit, |bucket, _| bucket.refund(limit, hits, now));
    }

    /// `key`'s state relative to `now`, if tracked.
    pub fn export(&self, key: KeyHash, now: Instant) -> Option<Snapshot> {
        self.entry(key).map(|entry| entry.bucket.export(now))
    }

    /// `key`'s bucket, if tracked.
    pub fn get(&self, key: KeyHash) -> Option<&Bucket> {
        self.entry(key).map(|entry| &entry.bucket)
    }

    /// The extra data beside `key`'s bucket, if tracked.
    pub fn extra(&self, key: KeyHash) -> Option<&X> {
        self.entry(key).map(|entry| &entry.extra)
    }

    /// The extra data beside `key`'s bucket, to change, if tracked (its TTL stays as it is).
    pub fn extra_mut(&mut self, key: KeyHash) -> Option<&mut X> {
        self.entries.find_mut(table_hash(key), |entry| entry.key == key).map(|entry| &mut entry.extra)
    }

    /// Runs `change` on `key`'s bucket and extra data, if tracked; `limit` is the key's limit
    /// (for its TTL).
    pub fn update<R>(
        &mut self,
        key: KeyHash,
        limit: &Limit,
        change: impl FnOnce(&mut Bucket, &mut X) -> R,
    ) -> Option<R> {
        let entry = self.entries.find_mut(table_hash(key), |entry| entry.key == key)?;
        let before = entry.bucket.log_capacity();
        let result = change(&mut entry.bucket, &mut entry.extra);
        self.logs.changed(before, &mut entry.bucket);
        entry.refresh(limit);
        Some(result)
    }

    /// Runs `change` on `key`'s bucket and extra data, creating them (`Bucket::new`, `extra()`,
    /// making room if needed) when absent.
    pub fn upsert_with<R>(
        &mut self,
        key: KeyHash,
        limit: &Limit,
        now: Instant,
        extra: impl FnOnce() -> X,
        change: impl FnOnce(&mut Bucket, &mut X) -> R,
    ) -> R {
        if let Some(entry) = self.entries.find_mut(table_hash(key), |entry| entry.key == key) {
            let before = entry.bucket.log_capacity();
            let result = change(&mut entry.bucket, &mut entry.extra);
            self.logs.changed(before, &mut entry.bucket);
            entry.refresh(limit);
            return result;
        }
        let mut bucket = Bucket::new(limit, now);
        let mut fresh_extra = extra();
        let result = change(&mut bucket, &mut fresh_extra);
        self.insert(key, limit, bucket, fresh_extra, now);
        result
    }

    /// Stops tracking `key`, returning its bucket.
    pub fn remove(&mut self, key: KeyHash) -> Option<Bucket> {
        let occupied = self.entries.find_entry(table_hash(key), |entry| entry.key == key).ok()?;
        let bucket = occupied.remove().0.bucket;
        self.logs.removed(&bucket);
        Some(bucket)
    }

    /// The tracked keys, in table order (deterministic for a given sequence of operations).
    pub fn keys(&self) -> impl Iterator<Item = KeyHash> + '_ {
        self.entries.iter().map(|entry| entry.key)
    }

    /// Every tracked key with its bucket and extra data, in table order.
    pub fn iter(&self) -> impl Iterator<Item = (KeyHash, &Bucket, &X)> + '_ {
        self.entries.iter().map(|entry| (entry.key, &entry.bucket, &entry.extra))
    }

    /// The table's slots, entries and empty ones: the positions [`Store::at_slot`] reads.
    pub fn slots(&self) -> usize {
        self.entries.num_buckets()
    }

    /// Changes whenever entries may have moved between slots: an insert with no room left (the
    /// table grows, or rehashes in place to reclaim the slots of removed entries). Removals and
    /// other inserts move no entry, so a walk over the slots that sees the same layout before
    /// and after each step visits every entry that stayed, once.
    pub fn layout(&self) -> u64 {
        self.layout
    }

    /// The key, bucket and extra data in slot `slot`, if one is there.
    pub fn at_slot(&self, slot: usize) -> Option<(KeyHash, &Bucket, &X)> {
        self.entries.get_bucket(slot).map(|entry| (entry.key, &entry.bucket, &entry.extra))
    }

    /// Examines up to `sweep_len_max` entries, continuing where the last call stopped, and drops
    /// those that are fresh at `now`. Returns how many it dropped. A call passes over at most one
    /// lap of the table and at most `8 × sweep_len_max` slots, empty ones included.
    pub fn sweep(&mut self, now: Instant) -> usize {
        let slots = self.entries.num_buckets();
        let mut examine = self.config.sweep_len_max.min(self.entries.len());
        let mut visit = slots.min(self.config.sweep_len_max.saturating_mul(SWEEP_SLOTS_PER_ENTRY));
        // The table may have grown or been rehashed since the last call: the cursor is only a
        // place to resume from, every slot is reached again within a lap.
        let mut cursor = if self.sweep_cursor < slots { self.sweep_cursor } else { 0 };
        let mut dropped = 0;
        while examine > 0 && visit > 0 {
            visit -= 1;
            // Removing an entry moves no other one: the cursor simply moves on.
            if let Ok(occupied) = self.entries.get_bucket_entry(cursor) {
                examine -= 1;
                if occupied.get().fresh_at <= now {
                    self.logs.removed(&occupied.remove().0.bucket);
                    dropped += 1;
                }
            }
            cursor += 1;
            if cursor == slots {
                cursor = 0;
            }
        }
        self.sweep_cursor = cursor;
        self.stats.expired += dropped as u64;
        dropped
    }

    /// How many keys are tracked.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The store's counters.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            log_bytes: (self.logs.entries * LOG_ENTRY_BYTES) as u64,
            logs_coarsened: self.logs.coarsened,
            ..self.stats
        }
    }

    /// The bounds in force.
    pub fn config(&self) -> StoreConfig {
        self.config
    }

    #[inline]
    fn entry(&self, key: KeyHash) -> Option<&Entry<X>> {
        self.entries.find(table_hash(key), |entry| entry.key == key)
    }

    /// Inserts `key`, which is not tracked.
    fn insert(&mut self, key: KeyHash, limit: &Limit, mut bucket: Bucket, extra: X, now: Instant) {
        if self.entries.len() >= self.config.keys_max {
            self.evict_one(now);
        }
        self.logs.changed(0, &mut bucket);
        let mut entry = Entry { key, fresh_at: Instant::ZERO, bucket, extra };
        entry.refresh(limit);
        if self.entries.len() >= self.entries.capacity() {
            // No room left: the table grows or, with many tombstones, rehashes in place; either
            // way its entries may move.
            self.layout += 1;
        }
        self.entries.insert_unique(table_hash(key), entry, |entry| table_hash(entry.key));
        self.stats.inserted += 1;
    }

    /// Drops the sampled entry that becomes fresh soonest. The first expired entry sampled ends
    /// the sample: any expired entry is as good a victim as another (dropping it loses nothing),
    /// and a table full of expired entries (after a flood of one-off keys) then costs one draw
    /// per insert instead of `eviction_sample_len`.
    fn evict_one(&mut self, now: Instant) {
        let samples = self.config.eviction_sample_len.clamp(1, self.entries.len().max(1));
        // (slot, fresh_at) of the soonest-fresh sample so far; the first one on ties.
        let mut victim: Option<(usize, Instant)> = None;
        for _ in 0..samples {
            let Some((slot, fresh_at)) = self.sample() else { return };
            if victim.is_none_or(|(_, soonest)| fresh_at < soonest) {
                victim = Some((slot, fresh_at));
            }
            if fresh_at <= now {
                break;
            }
        }
        let Some(Ok(occupied)) = victim.map(|(slot, _)| self.entries.get_bucket_entry(slot)) else {
            return;
        };
        let (entry, _) = occupied.remove();
        self.logs.removed(&entry.bucket);
        if entry.fresh_at <= now {
            self.stats.expired += 1;
        } else {
            self.stats.evicted += 1;
        }
    }

    /// A uniformly random entry: its slot and `fresh_at`; `None` when the table is empty.
    ///
    /// Slots are drawn until one is occupied. Taking the next occupied slot after an empty one
    /// instead would favour the entries that follow empty runs, which are mostly the ones inserted
    /// last (an insert takes the first free slot from its hash on): the live ones eviction should
    /// spare. A table that holds `keys_max` entries is at least about a fifth full (it only grows
    /// when more than 7/16 full), so a few draws suffice; after `SAMPLE_DRAWS_MAX` empty draws
    /// (odds below 10⁻³ at a fifth full) it does take the next occupied slot, to bound the work.
    fn sample(&mut self) -> Option<(usize, Instant)> {
        if self.entries.is_empty() {
            return None;
        }
        let slots = self.entries.num_buckets();
        let mut slot = 0;
        for _ in 0..SAMPLE_DRAWS_MAX {
            slot = self.rng.random_range(0..slots);
            if let Some(entry) = self.entries.get_bucket(slot) {
                return Some((slot, entry.fresh_at));
            }
        }
        // The table holds an entry, so this finds one within a lap.
        for _ in 0..slots {
            slot = if slot + 1 == slots { 0 } else { slot + 1 };
            if let Some(entry) = self.entries.get_bucket(slot) {
                return Some((slot, entry.fresh_at));
            }
        }
        None
    }
}

impl<X: KeyExtra + Default> Store<X> {
    /// Decides a request of `cost` hits on `key` under `limit` at `now`, counting it if it passes.
    /// A refusal or a query on an unknown key inserts nothing.
    pub fn check(&mut self, key: KeyHash, limit: &Limit, cost: u64, now: Instant) -> Decision {
        if let Some(entry) = self.entries.find_mut(table_hash(key), |entry| entry.key == key) {
            let before = entry.bucket.log_capacity();
            let decision = entry.bucket.check(limit, cost, now, &mut self.rng);
            self.logs.changed(before, &mut entry.bucket);
            entry.refresh(limit);
            return decision;
        }
        let mut bucket = Bucket::new(limit, now);
        let decision = bucket.check(limit, cost, now, &mut self.rng);
        if decision.allowed && cost > 0 {
            self.insert(key, limit, bucket, X::default(), now);
        }
        decision
    }

    /// Applies `hits` admitted elsewhere to `key`, unconditionally (see [`Bucket::force`]).
    pub fn force(&mut self, key: KeyHash, limit: &Limit, hits: u64, now: Instant) {
        if hits == 0 {
            return;
        }
        self.upsert_with(key, limit, now, X::default, |bucket, _| bucket.force(limit, hits, now));
    }

    /// Joins a snapshot from another node into `key`'s bucket (see [`Bucket::join`]).
    pub fn join(
        &mut self,
        key: KeyHash,
        limit: &Limit,
        snapshot: Snapshot,
        now: Instant,
    ) -> Result<(), SnapshotMismatch> {
        self.upsert_with(key, limit, now, X::default, |bucket, _| bucket.join(limit, snapshot, now))
    }
}

#[cfg(test)]
mod tests {
    use core::time::Duration;

    use super::*;
    use crate::key::Namespace;
    use crate::limit::{Algorithm, LimitSpec};

    fn limit() -> Limit {
        Limit::new(LimitSpec::new(Algorithm::TokenBucket, 10, Duration::from_secs(1)).with_burst(10))
            .expect("valid limit")
    }

    fn key(i: u64) -> KeyHash {
        Namespace::new(b"store").key(&i.to_le_bytes())
    }

    const T0: Instant = Instant::from_millis(1_000);
    /// Every bucket checked once at `T0` is full again by then.
    const LATER: Instant = Instant::from_millis(2_000);

    #[test]
    fn sweep_of_a_sparse_table_is_bounded_and_still_reaches_every_entry() {
        let limit = limit();
        let config = StoreConfig { keys_max: 100_000, sweep_len_max: 4, ..StoreConfig::default() };
        let mut store: Store = Store::new(config, 1);
        for i in 0..10_000 {
            store.check(key(i), &limit, 1, T0);
        }
        let slots = store.entries.num_buckets();
        for i in 10..10_000 {
            store.remove(key(i));
        }
        assert_eq!(store.entries.num_buckets(), slots, "the table keeps its slots");
        // 10 entries in 16 384 slots: a call passes over at most 8 × 4 slots.
        let calls = slots.div_ceil(SWEEP_SLOTS_PER_ENTRY * 4);
        let mut dropped = 0;
        for _ in 0..calls {
            let before = store.sweep_cursor;
            let now_dropped = store.sweep(LATER);
            assert!(now_dropped <= 4);
            let passed = (store.sweep_cursor + slots - before) % slots;
            assert!(passed <= SWEEP_SLOTS_PER_ENTRY * 4, "passed over {passed} slots");
            dropped += now_dropped;
        }
        assert_eq!(dropped, 10, "one lap of calls reaches every entry");
        assert!(store.is_empty());
        assert_eq!(store.stats().expired, 10);
    }

    #[test]
    fn sweep_resumes_after_the_table_grew() {
        let limit = limit();
        let config = StoreConfig { keys_max: 1_000, sweep_len_max: 8, ..StoreConfig::default() };
        let mut store: Store = Store::new(config, 1);
        for i in 0..100 {
            store.check(key(i), &limit, 1, T0);
        }
        assert_eq!(store.sweep(T0), 0, "nothing is fresh yet");
        store.sweep_cursor = store.entries.num_buckets() - 1;
        for i in 100..900 {
            store.check(key(i), &limit, 1, T0);
        }
        let mut dropped = 0;
        for _ in 0..200 {
            dropped += store.sweep(LATER);
        }
        assert_eq!(dropped, 900);
    }

    #[test]
    fn eviction_works_on_the_smallest_tables() {
        let limit = limit();
        for keys_max in 1..=4 {
            let config = StoreConfig { keys_max, sweep_len_max: 8, ..StoreConfig::default() };
            let mut store: Store = Store::new(config, 3);
            for i in 0..50 {
                assert!(store.check(key(i), &limit, 1, T0).allowed);
                assert!(store.get(key(i)).is_some(), "the new key is tracked");
            }
            assert_eq!(store.len(), keys_max);
            assert_eq!(store.stats().evicted, 50 - keys_max as u64);
        }
    }

    #[test]
    fn eviction_samples_only_entries_and_prefers_the_soonest_fresh() {
        let limit = limit();
        let config =
            StoreConfig { keys_max: 64, sweep_len_max: 8, eviction_sample_len: 64, ..StoreConfig::default() };
        let mut store: Store = Store::new(config, 5);
        // One key that is fresh soonest (one hit), the others ten hits deep.
        store.check(key(0), &limit, 1, T0);
        for i in 1..64 {
            store.check(key(i), &limit, 10, T0);
        }
        // 64 samples of 64 entries miss a given one with odds (63/64)^64 ≈ 37 %: over 40 seeds,
        // the soonest-fresh key must be the victim most of the time.
        let mut soonest_evicted = 0;
        for seed in 0..40 {
            let mut copy = store.clone();
            copy.rng = CoreRng::seed_from_u64(seed);
            copy.check(key(1_000), &limit, 1, T0);
            assert_eq!(copy.len(), 64);
            soonest_evicted += usize::from(copy.get(key(0)).is_none());
        }
        assert!(soonest_evicted >= 15, "soonest-fresh key evicted {soonest_evicted} times in 40");
    }
}
