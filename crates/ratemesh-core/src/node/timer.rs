//! The node's timers: one deadline per kind of work that waits for time, kept in a table indexed
//! by [`Timer`] (quinn-proto's `connection/timer.rs`). [`Node::poll_timeout`] is the table's
//! earliest deadline and [`Node::handle_timeout`] runs the timers that expired, in [`Timer::VALUES`]
//! order.
//!
//! Three timers are the node's own deadlines and live only here (`Sync`, `SyncSlice`,
//! `FlushForwards`). Three mirror a deadline whose source of truth is a set kept elsewhere: the
//! earliest forward's ([`super::forwards::Forwards`]), the peers' earliest retransmission or
//! delayed acknowledgement ([`super::peers::Peers`]) and the leave's next step (`leave.rs`). The
//! node re-arms those after every input that can move them (`Node::arm_derived_timers`), and a
//! debug assertion in `poll_timeout` checks that each still equals its source.

use crate::time::Instant;

/// Kinds of timeouts the node keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Timer {
    /// Forwards queued in the outbox leave (after `forward_wait`, or when the hold of the batch
    /// in flight to their owner ends).
    FlushForwards = 0,
    /// The earliest forwarded check's wait for its owner's answer ends: the fallback decides it.
    ForwardExpiry = 1,
    /// A frame to a peer is due for retransmission, or an acknowledgement waited long enough.
    Peers = 2,
    /// The next sync round begins. Always armed: a round that is still running pushes it on.
    Sync = 3,
    /// The next slice of the sync round in progress runs (armed exactly while a round is).
    SyncSlice = 4,
    /// A graceful leave moves on by itself (hands over, or gives up draining).
    Leave = 5,
    /// Regions: the next region sync round (armed exactly while the view spans several regions).
    RegionSync = 6,
}

impl Timer {
    /// Every timer, in the order `handle_timeout` runs them.
    pub(super) const VALUES: [Timer; 7] = [
        Timer::FlushForwards,
        Timer::ForwardExpiry,
        Timer::Peers,
        Timer::Sync,
        Timer::SyncSlice,
        Timer::Leave,
        Timer::RegionSync,
    ];
}

/// A deadline per [`Timer`], `None` when it is stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct TimerTable {
    data: [Option<Instant>; Timer::VALUES.len()],
}

impl TimerTable {
    /// Arms `timer` at `time` (moving it if it was armed).
    pub(super) fn set(&mut self, timer: Timer, time: Instant) {
        self.data[timer as usize] = Some(time);
    }

    /// Arms `timer` at `time`, or stops it for `None`.
    pub(super) fn set_or_stop(&mut self, timer: Timer, time: Option<Instant>) {
        self.data[timer as usize] = time;
    }

    /// When `timer` expires, if it is armed.
    pub(super) fn get(&self, timer: Timer) -> Option<Instant> {
        self.data[timer as usize]
    }

    /// Stops `timer`.
    pub(super) fn stop(&mut self, timer: Timer) {
        self.data[timer as usize] = None;
    }

    /// Arms `timer` at `time` unless it is armed earlier already.
    pub(super) fn set_earliest(&mut self, timer: Timer, time: Instant) {
        let at = self.get(timer).map_or(time, |at| at.min(time));
        self.set(timer, at);
    }

    /// The earliest deadline of every armed timer but `except`.
    pub(super) fn next_timeout(&self, except: Option<Timer>) -> Option<Instant> {
        Timer::VALUES
            .iter()
            .filter(|&&timer| Some(timer) != except)
            .filter_map(|&timer| self.get(timer))
            .min()
    }

    /// Whether `timer` is armed and its deadline is at or before `now`.
    pub(super) fn is_expired(&self, timer: Timer, now: Instant) -> bool {
        self.get(timer).is_some_and(|at| at <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_armed_timer_is_next() {
        let mut table = TimerTable::default();
        assert_eq!(table.next_timeout(None), None);
        table.set(Timer::Sync, Instant::from_nanos(30));
        table.set(Timer::Peers, Instant::from_nanos(20));
        table.set_earliest(Timer::Peers, Instant::from_nanos(25));
        assert_eq!(table.get(Timer::Peers), Some(Instant::from_nanos(20)));
        assert_eq!(table.next_timeout(None), Some(Instant::from_nanos(20)));
        assert_eq!(table.next_timeout(Some(Timer::Peers)), Some(Instant::from_nanos(30)));
        assert!(table.is_expired(Timer::Peers, Instant::from_nanos(20)));
        assert!(!table.is_expired(Timer::Sync, Instant::from_nanos(20)));
        table.stop(Timer::Peers);
        assert!(!table.is_expired(Timer::Peers, Instant::from_nanos(20)));
        assert_eq!(table.next_timeout(None), Some(Instant::from_nanos(30)));
    }

    #[test]
    fn values_index_the_table() {
        for (index, timer) in Timer::VALUES.iter().enumerate() {
            assert_eq!(*timer as usize, index);
        }
    }
}
