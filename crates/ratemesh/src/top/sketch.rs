//! [`SpaceSaving`]: the bounded heavy-hitter sketch (fixed slots; the smallest counter found by a
//! scan of the counts, remembered until it is used up).

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::{TopEntry, TopSummary};

/// One counter of a sketch (its count is apart, in [`SpaceSaving::counts`]).
#[derive(Clone, Debug)]
struct Counter {
    key: String,
    /// The key's hash in the index (kept, so that a key is hashed once per hit).
    hash: u64,
    error: u64,
}

/// A Space-Saving heavy-hitter sketch of at most `capacity` counters (see the module
/// documentation for its bound). The counters live in slots that never move; a hash table of slot
/// numbers finds a key's slot (the key is stored once, in its counter). A key without a counter
/// takes over one of the smallest: a scan of the counts finds the smallest count and every slot
/// holding it, and takeovers use those slots up before the next scan. Counts only grow and a
/// taken-over slot counts at least the smallest, so a remembered slot still at that count is a
/// smallest one. Under even load (every hit a takeover) a scan serves about `capacity` takeovers;
/// at worst it serves one, `O(capacity)`: when the smallest count is held by one slot only and
/// takeovers of large weight keep making a new one (weighted hits over many keys; measured in
/// the README's performance section). A key taking over a counter reuses the evicted key's
/// buffer: in steady state a check allocates nothing and hashes its key once.
#[derive(Clone, Debug)]
pub struct SpaceSaving {
    pub(super) capacity: usize,
    counters: Vec<Counter>,
    /// Each slot's count, apart from its counter: the scan for the smallest reads only these.
    counts: Vec<u64>,
    /// Slots whose count was `floor` at the last scan (used up from the end; a slot counted since
    /// is skipped).
    smallest: Vec<usize>,
    /// The smallest count at the last scan: no count is below it.
    floor: u64,
    /// Slots by their key's hash.
    index: HashTable<usize>,
    /// Bytes of the counters' key buffers (kept as they change: reading it costs no walk).
    key_bytes: usize,
    /// Keys are the clients': a seeded hash (no flooding), fast (hashed on every check).
    hasher: foldhash::fast::RandomState,
    total: u64,
}

impl SpaceSaving {
    /// An empty sketch of at most `capacity` counters (at least one).
    pub fn new(capacity: usize) -> SpaceSaving {
        let capacity = capacity.max(1);
        SpaceSaving {
            capacity,
            counters: Vec::new(),
            counts: Vec::new(),
            smallest: Vec::new(),
            floor: 0,
            index: HashTable::new(),
            key_bytes: 0,
            hasher: foldhash::fast::RandomState::default(),
            total: 0,
        }
    }

    /// Counts `weight` hits of `key` (already cut to its length bound).
    pub fn add(&mut self, key: &str, weight: u64) {
        if weight == 0 {
            return;
        }
        self.total = self.total.saturating_add(weight);
        let hash = self.hasher.hash_one(key);
        if let Some(slot) = self.slot(hash, key) {
            self.counts[slot] = self.counts[slot].saturating_add(weight);
            return;
        }
        if self.counters.len() < self.capacity {
            let counter = Counter { key: key.to_owned(), hash, error: 0 };
            self.key_bytes += counter.key.capacity();
            self.counters.push(counter);
            self.counts.push(weight);
            self.index_slot(self.counters.len() - 1);
            return;
        }
        // Full: the new key takes over a smallest counter, inheriting its count as its error.
        let slot = self.take_smallest();
        if let Ok(indexed) = self.index.find_entry(self.counters[slot].hash, |&other| other == slot) {
            indexed.remove();
        }
        let smallest = self.counts[slot];
        let counter = &mut self.counters[slot];
        let held = counter.key.capacity();
        counter.key.clear();
        counter.key.push_str(key);
        self.key_bytes = self.key_bytes - held + counter.key.capacity();
        counter.hash = hash;
        counter.error = smallest;
        self.counts[slot] = smallest.saturating_add(weight);
        self.index_slot(slot);
    }

    /// A slot of the smallest count (the sketch is full, so there is one).
    fn take_smallest(&mut self) -> usize {
        loop {
            while let Some(slot) = self.smallest.pop() {
                if self.counts[slot] == self.floor {
                    return slot;
                }
            }
            // One pass, the smallest count and its slots together (faster than a min then a
            // filter where scans are frequent: weighted hits).
            let mut floor = u64::MAX;
            for (slot, &count) in self.counts.iter().enumerate() {
                if count <= floor {
                    if count < floor {
                        floor = count;
                        self.smallest.clear();
                    }
                    self.smallest.push(slot);
                }
            }
            self.floor = floor;
        }
    }

    /// The slot counting `key` (of hash `hash`), if any.
    fn slot(&self, hash: u64, key: &str) -> Option<usize> {
        self.index.find(hash, |&slot| self.counters[slot].key == key).copied()
    }

    /// Enters `slot` into the index under its counter's hash.
    fn index_slot(&mut self, slot: usize) {
        let counters = &self.counters;
        self.index.insert_unique(counters[slot].hash, slot, |&other| counters[other].hash);
    }

    /// Hits counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The smallest count when every counter is taken (0 before): the most by which an estimate
    /// exceeds its key's true count, and the most a key without a counter was hit.
    pub fn error_bound(&self) -> u64 {
        if self.counters.len() < self.capacity { 0 } else { self.counts.iter().copied().min().unwrap_or(0) }
    }

    /// Counters taken.
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    /// The estimate of `key`: its counter's count, or [`SpaceSaving::error_bound`] without one.
    pub fn estimate(&self, key: &str) -> u64 {
        let hash = self.hasher.hash_one(key);
        self.slot(hash, key).map_or_else(|| self.error_bound(), |slot| self.counts[slot])
    }

    /// Bytes of heap memory the sketch holds, from its allocations' capacities (the hash table
    /// counted at one control byte and one slot per bucket).
    pub fn heap_bytes(&self) -> usize {
        let table_slot = std::mem::size_of::<usize>() + 1;
        self.key_bytes
            + self.counters.capacity() * std::mem::size_of::<Counter>()
            + self.counts.capacity() * std::mem::size_of::<u64>()
            + self.smallest.capacity() * std::mem::size_of::<usize>()
            + self.index.capacity() * table_slot
    }

    /// The sketch's content, for merging.
    pub fn summary(&self) -> TopSummary {
        let entries = (self.counters.iter().zip(&self.counts))
            .map(|(c, &count)| TopEntry { key: c.key.clone(), count, error: c.error })
            .collect();
        TopSummary { total: self.total, error_bound: self.error_bound(), entries }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_bytes_kept_are_the_key_buffers_held() {
        let mut sketch = SpaceSaving::new(8);
        // Keys of growing and shrinking lengths: takeovers reuse, and sometimes grow, buffers.
        for i in 0..500_usize {
            let key = "k".repeat(1 + (i * 7) % 40);
            sketch.add(&format!("{key}{i}"), 1 + (i % 3) as u64);
            let walked: usize = sketch.counters.iter().map(|counter| counter.key.capacity()).sum();
            assert_eq!(sketch.key_bytes, walked, "after {i} adds");
        }
    }
}
