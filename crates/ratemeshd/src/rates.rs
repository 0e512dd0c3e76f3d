//! Recent decision rates per policy for the dashboard: allowed and refused decisions in slots of
//! [`SLOT`] over the last [`SLOTS_MAX`] slots (five minutes), kept by this node for the policies
//! it decided on. Bounded: at most [`SLOTS_MAX`] slots per policy, and the policies are the
//! policy table's (their series go when a reload removes the policy, like their metrics) plus
//! `inline`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The length of one slot.
pub const SLOT: Duration = Duration::from_secs(5);
/// Slots kept per policy.
pub const SLOTS_MAX: usize = 60;

/// One slot of a policy's series.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Slot {
    /// Slots since the history started (the slot's start is `index × SLOT`).
    pub index: u64,
    /// Decisions allowed in the slot.
    pub allowed: u64,
    /// Decisions refused in the slot (shadow-mode refusals included).
    pub refused: u64,
}

/// The per-policy series of this node.
#[derive(Debug)]
pub struct RateHistory {
    started: Instant,
    series: Mutex<HashMap<String, VecDeque<Slot>>>,
}

impl Default for RateHistory {
    fn default() -> Self {
        RateHistory { started: Instant::now(), series: Mutex::new(HashMap::new()) }
    }
}

impl RateHistory {
    /// Counts one decision of `policy`.
    pub fn record(&self, policy: &str, allowed: bool) {
        let index = self.slot_index(Instant::now());
        let mut series = self.lock();
        if !series.contains_key(policy) {
            series.insert(policy.to_owned(), VecDeque::new());
        }
        let Some(slots) = series.get_mut(policy) else { return };
        if slots.back().is_none_or(|slot| slot.index != index) {
            slots.push_back(Slot { index, ..Slot::default() });
            while slots.len() > SLOTS_MAX {
                slots.pop_front();
            }
        }
        if let Some(slot) = slots.back_mut() {
            if allowed {
                slot.allowed += 1;
            } else {
                slot.refused += 1;
            }
        }
    }

    /// Every policy's slots of the last [`SLOTS_MAX`] slots, oldest first, including empty ones
    /// (so a chart needs no gaps filled), and the index of the current slot.
    pub fn snapshot(&self) -> (u64, Vec<(String, Vec<Slot>)>) {
        let now = self.slot_index(Instant::now());
        let first = now.saturating_sub(SLOTS_MAX as u64 - 1);
        let series = self.lock();
        let mut out: Vec<(String, Vec<Slot>)> = series
            .iter()
            .map(|(policy, slots)| {
                let filled = (first..=now)
                    .map(|index| {
                        slots
                            .iter()
                            .find(|slot| slot.index == index)
                            .copied()
                            .unwrap_or(Slot { index, ..Slot::default() })
                    })
                    .collect();
                (policy.clone(), filled)
            })
            .collect();
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        (now, out)
    }

    /// Drops the series of `policy` (a reload removed it).
    pub fn forget(&self, policy: &str) {
        self.lock().remove(policy);
    }

    fn slot_index(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.started);
        u64::try_from(elapsed.as_nanos() / SLOT.as_nanos()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<Slot>>> {
        // Plain counters: a panic elsewhere leaves them usable.
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_are_counted_in_the_current_slot_and_gaps_are_filled() {
        let history = RateHistory::default();
        history.record("api", true);
        history.record("api", false);
        history.record("api", true);
        let (now, series) = history.snapshot();
        assert_eq!(series.len(), 1);
        let (policy, slots) = &series[0];
        assert_eq!(policy, "api");
        assert!(slots.len() <= SLOTS_MAX && slots.last().map(|s| s.index) == Some(now));
        let last = slots.last().copied().unwrap_or_default();
        assert_eq!((last.allowed, last.refused), (2, 1));
        history.forget("api");
        assert!(history.snapshot().1.is_empty());
    }
}
