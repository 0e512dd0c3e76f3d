//! [`SpaceSaving`]: the bounded heavy-hitter sketch (fixed slots; the smallest counter found by a
//! scan of the counts, remembered until it is used up), with a filter of hashed counters in front
//! of takeovers (Filtered Space-Saving).

use hashbrown::HashTable;

use super::{TopEntry, TopSummary};

/// Filter cells per counter (the filter is a power of two of cells at least this many times the
/// capacity). More cells make takeovers rarer under even load (each cell sums the hits of fewer
/// keys, so it reaches the smallest count later) at 8 bytes a cell.
const FILTER_CELLS_PER_COUNTER: usize = 8;

/// One counter of a sketch (its count is apart, in [`SpaceSaving::counts`]).
#[derive(Clone, Debug)]
struct Counter {
    /// The key as answered (written once, when the counter is taken).
    key: String,
    /// The key's identity, the caller's (a [`ratemesh_core::KeyHash`] of policy and key text).
    id: u128,
    error: u64,
}

/// A Space-Saving heavy-hitter sketch of at most `capacity` counters (see the module
/// documentation for its bound), with a filter in front of takeovers.
///
/// - Keys are named by a 128-bit identity the caller computed (the node's hash of policy and key
///   text, most often the check's bucket hash), so a hit hashes nothing; the key's text is
///   written only when a counter is taken.
/// - The counters live in slots that never move; a hash table of slot numbers, under the low half
///   of the identity, finds a key's slot.
/// - **The filter** (Homem and Carvalho 2010): once every counter is taken, a hit of a key
///   without one adds to a cell picked by the identity's high half. Only when that cell's sum
///   passes the smallest count does the key take over a smallest counter, with the cell's sum as
///   its count and the cell's sum before the hit as its error; the evicted key's count goes into
///   its own cell (raising it to that count). A cell bounds the hits of every key without a counter
///   that maps to it, and never exceeds the smallest count, so the bounds are Space-Saving's. Under
///   even load over many keys (where without the filter every hit is a takeover) a cell sums the
///   hits of `keys / cells` keys and takeovers are about `capacity / cells` of the hits.
/// - A takeover finds a smallest counter by a scan of the counts that finds the smallest count
///   and every slot holding it; takeovers use those slots up before the next scan. Counts only
///   grow and a taken-over slot counts more than the smallest, so a remembered slot still at that
///   count is a smallest one. At worst a scan serves one takeover, `O(capacity)`: weighted hits
///   over many keys (measured in docs/performance-history.md).
/// - A key taking over a counter reuses the evicted key's buffer: in steady state a hit
///   allocates nothing.
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
    /// Slots by the low half of their key's identity.
    index: HashTable<usize>,
    /// The filter's cells (empty until every counter is taken).
    filter: Vec<u64>,
    /// Bytes of the counters' key buffers (kept as they change: reading it costs no walk).
    key_bytes: usize,
    total: u64,
}

impl SpaceSaving {
    /// An empty sketch of at most `capacity` counters (at least one).
    pub fn new(capacity: usize) -> SpaceSaving {
        SpaceSaving {
            capacity: capacity.max(1),
            counters: Vec::new(),
            counts: Vec::new(),
            smallest: Vec::new(),
            floor: 0,
            index: HashTable::new(),
            filter: Vec::new(),
            key_bytes: 0,
            total: 0,
        }
    }

    /// Counts `weight` hits of the key of identity `id`; `key` writes its text into an empty
    /// buffer, called only when the key takes a counter. Keys of one identity are one key.
    pub fn add(&mut self, id: u128, weight: u64, key: impl FnOnce(&mut String)) {
        if weight == 0 {
            return;
        }
        self.total = self.total.saturating_add(weight);
        if let Some(slot) = self.slot(id) {
            self.counts[slot] = self.counts[slot].saturating_add(weight);
            return;
        }
        if self.counters.len() < self.capacity {
            let mut counter = Counter { key: String::new(), id, error: 0 };
            key(&mut counter.key);
            self.key_bytes += counter.key.capacity();
            self.counters.push(counter);
            self.counts.push(weight);
            self.index_slot(self.counters.len() - 1);
            return;
        }
        let cell = self.cell(id);
        let filtered = self.filter[cell].saturating_add(weight);
        let (smallest, slot) = self.smallest();
        if filtered <= smallest {
            self.filter[cell] = filtered;
            return;
        }
        // Used up: its count is no longer the smallest.
        self.smallest.pop();
        self.take_over(slot, id, self.filter[cell], filtered, key);
    }

    /// The key of identity `id` takes over the counter in `slot` with `count` hits, `error` of
    /// them perhaps other keys'; the evicted key's count goes into its filter cell.
    fn take_over(&mut self, slot: usize, id: u128, error: u64, count: u64, key: impl FnOnce(&mut String)) {
        let evicted = self.counters[slot].id;
        if let Ok(indexed) = self.index.find_entry(evicted as u64, |&other| other == slot) {
            indexed.remove();
        }
        let evicted_cell = self.cell(evicted);
        self.filter[evicted_cell] = self.filter[evicted_cell].max(self.counts[slot]);
        let counter = &mut self.counters[slot];
        let held = counter.key.capacity();
        counter.key.clear();
        key(&mut counter.key);
        self.key_bytes = self.key_bytes - held + counter.key.capacity();
        counter.id = id;
        counter.error = error;
        self.counts[slot] = count;
        self.index_slot(slot);
    }

    /// The smallest count (the sketch is full) and a slot holding it, the last of `smallest`.
    fn smallest(&mut self) -> (u64, usize) {
        loop {
            while let Some(&slot) = self.smallest.last() {
                if self.counts[slot] == self.floor {
                    return (self.floor, slot);
                }
                self.smallest.pop();
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

    /// The filter cell of identity `id` (allocating the filter at the first).
    fn cell(&mut self, id: u128) -> usize {
        if self.filter.is_empty() {
            self.filter = vec![0; (self.capacity * FILTER_CELLS_PER_COUNTER).next_power_of_two()];
        }
        (id >> 64) as usize & (self.filter.len() - 1)
    }

    /// The slot counting the key of identity `id`, if any.
    fn slot(&self, id: u128) -> Option<usize> {
        self.index.find(id as u64, |&slot| self.counters[slot].id == id).copied()
    }

    /// Enters `slot` into the index under its counter's identity.
    fn index_slot(&mut self, slot: usize) {
        let counters = &self.counters;
        self.index.insert_unique(counters[slot].id as u64, slot, |&other| counters[other].id as u64);
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

    /// The estimate of the key of identity `id`: its counter's count, or without one its filter
    /// cell's sum (at most [`SpaceSaving::error_bound`]; 0 before any key was filtered).
    pub fn estimate(&self, id: u128) -> u64 {
        match self.slot(id) {
            Some(slot) => self.counts[slot],
            None if self.filter.is_empty() => 0,
            None => self.filter[(id >> 64) as usize & (self.filter.len() - 1)],
        }
    }

    /// The text of the key of identity `id`, if it holds a counter.
    pub fn key_of(&self, id: u128) -> Option<&str> {
        self.slot(id).map(|slot| self.counters[slot].key.as_str())
    }

    /// Bytes of heap memory the sketch holds, from its allocations' capacities (the hash table
    /// counted at one control byte and one slot per bucket).
    pub fn heap_bytes(&self) -> usize {
        let table_slot = std::mem::size_of::<usize>() + 1;
        self.key_bytes
            + self.counters.capacity() * std::mem::size_of::<Counter>()
            + self.counts.capacity() * std::mem::size_of::<u64>()
            + self.smallest.capacity() * std::mem::size_of::<usize>()
            + self.filter.capacity() * std::mem::size_of::<u64>()
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
            let key = format!("{key}{i}");
            // Spread identities, as bucket hashes are (every key distinct).
            let id = (i as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
            sketch.add(id, 1 + (i % 3) as u64, |buf| buf.push_str(&key));
            let walked: usize = sketch.counters.iter().map(|counter| counter.key.capacity()).sum();
            assert_eq!(sketch.key_bytes, walked, "after {i} adds");
        }
    }
}
