//! The event queue: a binary heap ordered by (virtual time, sequence number), so that events at
//! the same instant run in the order they were scheduled. Bounded.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::error::SimError;

struct Entry<E> {
    at_nanos: u64,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at_nanos, self.seq) == (other.at_nanos, other.seq)
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    /// Reversed: the heap's maximum is the earliest event.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at_nanos, other.seq).cmp(&(self.at_nanos, self.seq))
    }
}

/// Pending events of a run, earliest first. See the module documentation.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
    len_max: usize,
}

impl<E> EventQueue<E> {
    /// An empty queue holding at most `len_max` events.
    pub fn new(len_max: usize) -> EventQueue<E> {
        EventQueue { heap: BinaryHeap::new(), seq: 0, len_max }
    }

    /// Schedules `event` at `at_nanos`; an error when the queue is full.
    pub fn push(&mut self, at_nanos: u64, event: E) -> Result<(), SimError> {
        if self.heap.len() >= self.len_max {
            return Err(SimError::QueueFull { max: self.len_max, at_nanos });
        }
        self.seq += 1;
        self.heap.push(Entry { at_nanos, seq: self.seq, event });
        Ok(())
    }

    /// The earliest event and its time.
    pub fn pop(&mut self) -> Option<(u64, E)> {
        self.heap.pop().map(|entry| (entry.at_nanos, entry.event))
    }
}
