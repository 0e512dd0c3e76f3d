//! Node clocks: each simulated node reads its own skewed, drifting clock.
//!
//! `local = CLOCK_BASE_NANOS + offset + virtual × (1 + drift_ppm / 10⁶)`, with the drift term
//! rounded down. The base keeps every local instant above zero for offsets up to ±100 s; for
//! |drift| below 10⁶ ppm the mapping is monotone (never decreasing) in virtual time.

use ratemesh_core::Instant;

/// Local clocks start here (100 s), so that a negative offset never takes them below zero.
pub const CLOCK_BASE_NANOS: u64 = 100_000_000_000;
/// The largest accepted |drift|, in parts per million.
pub const DRIFT_PPM_MAX: i64 = 100_000;

const PPM: i128 = 1_000_000;

/// One node's clock: an offset and a drift against virtual time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeClock {
    offset_nanos: i64,
    drift_ppm: i64,
}

impl NodeClock {
    /// A clock `offset_nanos` ahead of (or behind) virtual time that runs `drift_ppm` fast (or
    /// slow). Panics (a programmer error: scenarios are validated) when |offset| ≥ the base or
    /// |drift| > [`DRIFT_PPM_MAX`].
    pub fn new(offset_nanos: i64, drift_ppm: i64) -> NodeClock {
        assert!(offset_nanos.unsigned_abs() < CLOCK_BASE_NANOS, "clock offset beyond the base");
        assert!(drift_ppm.abs() <= DRIFT_PPM_MAX, "clock drift beyond DRIFT_PPM_MAX");
        NodeClock { offset_nanos, drift_ppm }
    }

    /// A perfect clock (no offset, no drift).
    pub fn perfect() -> NodeClock {
        NodeClock::new(0, 0)
    }

    /// The offset in nanoseconds.
    pub fn offset_nanos(&self) -> i64 {
        self.offset_nanos
    }

    /// The drift in parts per million.
    pub fn drift_ppm(&self) -> i64 {
        self.drift_ppm
    }

    /// The node's local reading at virtual time `virtual_nanos`.
    pub fn local(&self, virtual_nanos: u64) -> Instant {
        Instant::from_nanos(clamp_u64(self.local_i128(virtual_nanos)))
    }

    /// The earliest virtual time at which the local clock reads `local` or later; `None` when that
    /// is beyond the representable range (e.g. [`Instant::MAX`], "never").
    pub fn virtual_at(&self, local: Instant) -> Option<u64> {
        if local == Instant::MAX {
            return None;
        }
        let target = i128::from(local.as_nanos()) - self.start();
        if target <= 0 {
            return Some(0);
        }
        let rate = PPM + i128::from(self.drift_ppm);
        let mut guess = (target * PPM + rate - 1) / rate;
        // Rounding of the drift term can put the guess a step off either way; walk to the exact one.
        while self.local_i128_wide(guess) < i128::from(local.as_nanos()) {
            guess += 1;
        }
        while guess > 0 && self.local_i128_wide(guess - 1) >= i128::from(local.as_nanos()) {
            guess -= 1;
        }
        u64::try_from(guess).ok()
    }

    fn start(&self) -> i128 {
        i128::from(CLOCK_BASE_NANOS) + i128::from(self.offset_nanos)
    }

    fn local_i128(&self, virtual_nanos: u64) -> i128 {
        self.local_i128_wide(i128::from(virtual_nanos))
    }

    fn local_i128_wide(&self, virtual_nanos: i128) -> i128 {
        let drift = (virtual_nanos * i128::from(self.drift_ppm)).div_euclid(PPM);
        self.start() + virtual_nanos + drift
    }
}

fn clamp_u64(value: i128) -> u64 {
    u64::try_from(value.max(0)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_at_inverts_local() {
        for (offset, drift) in [(0, 0), (-999_000_000, -500), (999_000_000, 500), (5, 99_999), (-7, -100_000)]
        {
            let clock = NodeClock::new(offset, drift);
            for v in [0u64, 1, 999, 1_000_000, 123_456_789_012, 60_000_000_000] {
                let local = clock.local(v);
                let back = clock.virtual_at(local).expect("in range");
                assert!(back <= v, "{offset} {drift} {v}");
                assert_eq!(clock.local(back), local);
                assert!(back == 0 || clock.local(back - 1) < local);
            }
        }
    }
}
