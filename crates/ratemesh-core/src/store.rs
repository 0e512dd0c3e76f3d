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
//! - A check that consumes nothing (a refusal, a query) on an unknown key inserts nothing, so
//!   refused floods of random keys cannot fill the table.

use indexmap::IndexMap;
use rand::{RngExt, SeedableRng};

use crate::algorithm::{Bucket, CoreRng, Snapshot, SnapshotMismatch};
use crate::decision::{Decision, LeaseId};
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
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig { keys_max: 1_000_000, sweep_len_max: 1024, eviction_sample_len: 8 }
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

#[derive(Clone, Debug)]
struct Entry<X> {
    fresh_at: Instant,
    bucket: Bucket,
    extra: X,
}

impl<X: KeyExtra> Entry<X> {
    fn refresh(&mut self, limit: &Limit) {
        self.fresh_at = self.bucket.fresh_at(limit).max(self.extra.keep_until());
    }
}

/// The buckets of many keys, each with optional extra data `X`. See the module documentation for
/// the bounds.
#[derive(Clone, Debug)]
pub struct Store<X = ()> {
    config: StoreConfig,
    entries: IndexMap<KeyHash, Entry<X>, KeyHasherBuilder>,
    rng: CoreRng,
    sweep_cursor: usize,
    stats: StoreStats,
}

impl<X: KeyExtra> Store<X> {
    /// An empty store; `seed` decides eviction samples and lease ids.
    pub fn new(config: StoreConfig, seed: u64) -> Store<X> {
        Store {
            config: StoreConfig { keys_max: config.keys_max.max(1), ..config },
            entries: IndexMap::default(),
            rng: CoreRng::seed_from_u64(seed),
            sweep_cursor: 0,
            stats: StoreStats::default(),
        }
    }

    /// Decides a request of `cost` hits on `key` under `limit` at `now`, counting it if it passes.
    /// A new key gets `extra()` beside its bucket.
    pub fn check_with(
        &mut self,
        key: KeyHash,
        limit: &Limit,
        cost: u64,
        now: Instant,
        extra: impl FnOnce() -> X,
    ) -> Decision {
        if let Some(entry) = self.entries.get_mut(&key) {
            let decision = entry.bucket.check(limit, cost, now, &mut self.rng);
            entry.refresh(limit);
            return decision;
        }
        let mut bucket = Bucket::new(limit, now);
        let decision = bucket.check(limit, cost, now, &mut self.rng);
        if decision.allowed && cost > 0 {
            self.insert(key, limit, bucket, extra(), now);
        }
        decision
    }

    /// Returns `hits` to `key` (see [`Bucket::refund`]). An unknown key is full already.
    pub fn refund(&mut self, key: KeyHash, limit: &Limit, hits: u64, now: Instant) {
        self.update(key, limit, |bucket, _| bucket.refund(limit, hits, now));
    }

    /// Releases a concurrency lease on `key`; false when it is not held.
    pub fn release(&mut self, key: KeyHash, limit: &Limit, lease: LeaseId, now: Instant) -> bool {
        self.update(key, limit, |bucket, _| bucket.release(limit, lease, now)).unwrap_or(false)
    }

    /// `key`'s state relative to `now`, if tracked.
    pub fn export(&self, key: KeyHash, now: Instant) -> Option<Snapshot> {
        self.entries.get(&key).map(|entry| entry.bucket.export(now))
    }

    /// `key`'s bucket, if tracked.
    pub fn get(&self, key: KeyHash) -> Option<&Bucket> {
        self.entries.get(&key).map(|entry| &entry.bucket)
    }

    /// The extra data beside `key`'s bucket, if tracked.
    pub fn extra(&self, key: KeyHash) -> Option<&X> {
        self.entries.get(&key).map(|entry| &entry.extra)
    }

    /// Runs `change` on `key`'s bucket and extra data, if tracked; `limit` is the key's limit
    /// (for its TTL).
    pub fn update<R>(
        &mut self,
        key: KeyHash,
        limit: &Limit,
        change: impl FnOnce(&mut Bucket, &mut X) -> R,
    ) -> Option<R> {
        let entry = self.entries.get_mut(&key)?;
        let result = change(&mut entry.bucket, &mut entry.extra);
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
        if let Some(entry) = self.entries.get_mut(&key) {
            let result = change(&mut entry.bucket, &mut entry.extra);
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
        self.entries.swap_remove(&key).map(|entry| entry.bucket)
    }

    /// The tracked keys, in table order.
    pub fn keys(&self) -> impl Iterator<Item = KeyHash> + '_ {
        self.entries.keys().copied()
    }

    /// Examines up to `sweep_len_max` entries, continuing where the last call stopped, and drops
    /// those that are fresh at `now`. Returns how many it dropped.
    pub fn sweep(&mut self, now: Instant) -> usize {
        let mut dropped = 0;
        for _ in 0..self.config.sweep_len_max.min(self.entries.len()) {
            if self.sweep_cursor >= self.entries.len() {
                self.sweep_cursor = 0;
            }
            let expired = self.entries.get_index(self.sweep_cursor).is_some_and(|(_, e)| e.fresh_at <= now);
            if expired {
                // swap_remove moves the last entry here: examine this index again next.
                self.entries.swap_remove_index(self.sweep_cursor);
                dropped += 1;
            } else {
                self.sweep_cursor += 1;
            }
        }
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
        self.stats
    }

    /// The bounds in force.
    pub fn config(&self) -> StoreConfig {
        self.config
    }

    fn insert(&mut self, key: KeyHash, limit: &Limit, bucket: Bucket, extra: X, now: Instant) {
        if self.entries.len() >= self.config.keys_max {
            self.evict_one(now);
        }
        let mut entry = Entry { fresh_at: Instant::ZERO, bucket, extra };
        entry.refresh(limit);
        self.entries.insert(key, entry);
        self.stats.inserted += 1;
    }

    /// Drops the sampled entry that becomes fresh soonest.
    fn evict_one(&mut self, now: Instant) {
        let len = self.entries.len();
        let samples = self.config.eviction_sample_len.clamp(1, len);
        let victim = (0..samples)
            .map(|_| self.rng.random_range(0..len))
            .min_by_key(|&index| self.entries.get_index(index).map(|(_, e)| e.fresh_at));
        let Some((_, entry)) = victim.and_then(|index| self.entries.swap_remove_index(index)) else {
            return;
        };
        if entry.fresh_at <= now {
            self.stats.expired += 1;
        } else {
            self.stats.evicted += 1;
        }
    }
}

impl<X: KeyExtra + Default> Store<X> {
    /// Decides a request of `cost` hits on `key` under `limit` at `now`, counting it if it passes.
    pub fn check(&mut self, key: KeyHash, limit: &Limit, cost: u64, now: Instant) -> Decision {
        self.check_with(key, limit, cost, now, X::default)
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
