//! [`SpaceSaving`]: the bounded heavy-hitter sketch (fixed slots, a heap of slot numbers).

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::{TopEntry, TopSummary};

/// One counter of a sketch.
#[derive(Clone, Debug)]
struct Counter {
    key: String,
    /// The key's hash in the index (kept, so that a key is hashed once per hit).
    hash: u64,
    count: u64,
    error: u64,
}

/// A Space-Saving heavy-hitter sketch of at most `capacity` counters (see the module
/// documentation for its bound). The counters live in slots that never move; a min-heap of slot
/// numbers orders them by count (`position` maps a slot to its place in the heap, so moving a
/// counter in the heap costs no hashing), and a hash table of slot numbers finds a key's slot (the
/// key is stored once, in its counter). A key taking over a counter reuses the evicted key's
/// buffer: in steady state a check allocates nothing and hashes its key once.
#[derive(Clone, Debug)]
pub struct SpaceSaving {
    pub(super) capacity: usize,
    counters: Vec<Counter>,
    heap: Vec<usize>,
    position: Vec<usize>,
    /// Slots by their key's hash.
    index: HashTable<usize>,
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
            heap: Vec::new(),
            position: Vec::new(),
            index: HashTable::new(),
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
            self.counters[slot].count = self.counters[slot].count.saturating_add(weight);
            self.sift_down(self.position[slot]);
            return;
        }
        if self.counters.len() < self.capacity {
            let slot = self.counters.len();
            self.counters.push(Counter { key: key.to_owned(), hash, count: weight, error: 0 });
            self.index_slot(slot);
            self.heap.push(slot);
            self.position.push(self.heap.len() - 1);
            self.sift_up(self.heap.len() - 1);
            return;
        }
        // Full: the new key takes over the smallest counter (the heap's root).
        let slot = self.heap[0];
        if let Ok(indexed) = self.index.find_entry(self.counters[slot].hash, |&other| other == slot) {
            indexed.remove();
        }
        let counter = &mut self.counters[slot];
        let smallest = counter.count;
        counter.key.clear();
        counter.key.push_str(key);
        counter.hash = hash;
        counter.count = smallest.saturating_add(weight);
        counter.error = smallest;
        self.index_slot(slot);
        self.sift_down(0);
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
        if self.counters.len() < self.capacity { 0 } else { self.count_at(0) }
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
        self.slot(hash, key).map_or_else(|| self.error_bound(), |slot| self.counters[slot].count)
    }

    /// Bytes of heap memory the sketch holds, from its allocations' capacities (the hash table
    /// counted at one control byte and one slot per bucket).
    pub fn heap_bytes(&self) -> usize {
        let keys: usize = self.counters.iter().map(|counter| counter.key.capacity()).sum();
        let table_slot = std::mem::size_of::<usize>() + 1;
        keys + self.counters.capacity() * std::mem::size_of::<Counter>()
            + (self.heap.capacity() + self.position.capacity()) * std::mem::size_of::<usize>()
            + self.index.capacity() * table_slot
    }

    /// The sketch's content, for merging.
    pub fn summary(&self) -> TopSummary {
        let entries = self
            .counters
            .iter()
            .map(|c| TopEntry { key: c.key.clone(), count: c.count, error: c.error })
            .collect();
        TopSummary { total: self.total, error_bound: self.error_bound(), entries }
    }

    fn count_at(&self, at: usize) -> u64 {
        self.counters[self.heap[at]].count
    }

    fn sift_up(&mut self, mut at: usize) {
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.count_at(parent) <= self.count_at(at) {
                break;
            }
            self.swap(at, parent);
            at = parent;
        }
    }

    fn sift_down(&mut self, mut at: usize) {
        loop {
            let (left, right) = (2 * at + 1, 2 * at + 2);
            let mut smallest = at;
            if left < self.heap.len() && self.count_at(left) < self.count_at(smallest) {
                smallest = left;
            }
            if right < self.heap.len() && self.count_at(right) < self.count_at(smallest) {
                smallest = right;
            }
            if smallest == at {
                return;
            }
            self.swap(at, smallest);
            at = smallest;
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.position[self.heap[a]] = a;
        self.position[self.heap[b]] = b;
    }
}
