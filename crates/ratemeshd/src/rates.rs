//! Recent decision rates per policy for the dashboard: allowed and refused decisions in slots of
//! [`SLOT`] over the last [`SLOTS_MAX`] slots (five minutes), kept by this node for the policies
//! it decided on. Bounded: at most [`SLOTS_MAX`] slots per policy, and the policies are the
//! policy table's (their series go when a reload removes the policy, like their metrics) plus
//! `inline`.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use ratemesh::Mutex;

/// The length of one slot.
pub const SLOT: Duration = Duration::from_secs(5);
/// Slots kept per policy.
pub const SLOTS_MAX: usize = 60;

/// One slot of a policy's series.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Slot {
    /// Slots since the history started (the slot's start is `index × SLOT`).
    index: u64,
    /// Decisions allowed in the slot.
    allowed: u64,
    /// Decisions refused in the slot (shadow-mode refusals included).
    refused: u64,
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

    /// Every policy's last [`SLOTS_MAX`] slots as `(allowed, refused)`, oldest first, always
    /// [`SLOTS_MAX`] of them (slots without decisions, or before the history began, are zeros:
    /// a chart needs no gaps filled).
    pub fn snapshot(&self) -> Vec<(String, Vec<(u64, u64)>)> {
        let now = self.slot_index(Instant::now());
        let series = self.lock();
        let mut out: Vec<(String, Vec<(u64, u64)>)> = series
            .iter()
            .map(|(policy, slots)| {
                let counts = (0..SLOTS_MAX as u64)
                    .rev()
                    .map(|ago| {
                        let slot =
                            now.checked_sub(ago).and_then(|index| slots.iter().find(|s| s.index == index));
                        slot.map_or((0, 0), |slot| (slot.allowed, slot.refused))
                    })
                    .collect();
                (policy.clone(), counts)
            })
            .collect();
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        out
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
        self.series.lock()
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
        let series = history.snapshot();
        assert_eq!(series.len(), 1);
        let (policy, slots) = &series[0];
        assert_eq!(policy, "api");
        assert_eq!(slots.len(), SLOTS_MAX);
        assert_eq!(slots.last(), Some(&(2, 1)));
        assert!(slots[..SLOTS_MAX - 1].iter().all(|&slot| slot == (0, 0)));
        history.forget("api");
        assert!(history.snapshot().is_empty());
    }
}
