//! Exponential backoff, written once: the transport's reconnects, gossip restarts, seed
//! resolution while alone, and the daemon's xDS client all wait [`Backoff::delay`].

use std::time::Duration;

/// The delay doubles at most this many times (then it stays at the maximum).
const DOUBLINGS_MAX: u32 = 30;

/// A delay that starts at `initial` and doubles after each failure, up to `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failure.
    pub initial: Duration,
    /// The largest delay (when it is below `initial`, `initial`).
    pub max: Duration,
}

impl Backoff {
    /// The delay after `failures` consecutive failures (≥ 1; 0 counts as 1): `initial` × 2^(failures − 1),
    /// at most `max`.
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(DOUBLINGS_MAX);
        let doubled = self.initial.saturating_mul(1_u32 << doublings);
        doubled.min(self.max.max(self.initial))
    }

    /// The delay after the one that was `previous`: doubled, at most `max`.
    pub fn next(&self, previous: Duration) -> Duration {
        previous.saturating_mul(2).clamp(self.initial, self.max.max(self.initial))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_initial_up_to_max() {
        let backoff = Backoff { initial: Duration::from_millis(50), max: Duration::from_millis(1000) };
        let delays_ms: Vec<u128> = (1..=7).map(|failures| backoff.delay(failures).as_millis()).collect();
        assert_eq!(delays_ms, [50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.delay(0), Duration::from_millis(50));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_millis(1000));
        assert_eq!(backoff.next(Duration::from_millis(400)), Duration::from_millis(800));
        assert_eq!(backoff.next(Duration::from_millis(800)), Duration::from_millis(1000));
        let inverted = Backoff { initial: Duration::from_secs(2), max: Duration::from_secs(1) };
        assert_eq!(inverted.delay(5), Duration::from_secs(2), "a max below initial is initial");
    }
}
