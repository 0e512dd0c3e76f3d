//! Time as the core sees it: an [`Instant`] handed in by the driver.
//!
//! The core never reads a clock. A driver (the tokio node, the simulator, a test) passes `now` into
//! every call. Instants are nanoseconds on one node's monotonic clock since an epoch of the driver's
//! choosing; they are never compared across nodes, and never put on the wire (the wire carries
//! durations relative to the sender's `now`).

use core::time::Duration;

/// A point on one node's monotonic clock, in nanoseconds since the driver's epoch.
///
/// Arithmetic saturates: an instant never wraps around, whatever the input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The driver's epoch.
    pub const ZERO: Instant = Instant(0);
    /// The last representable instant ("never").
    pub const MAX: Instant = Instant(u64::MAX);

    /// The instant `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    /// The instant `millis` milliseconds after the epoch (saturating).
    pub const fn from_millis(millis: u64) -> Instant {
        Instant(millis.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self + nanos`, saturating at [`Instant::MAX`].
    #[must_use]
    pub const fn add_nanos(self, nanos: u64) -> Instant {
        Instant(self.0.saturating_add(nanos))
    }

    /// `self - nanos`, saturating at [`Instant::ZERO`].
    #[must_use]
    pub const fn sub_nanos(self, nanos: u64) -> Instant {
        Instant(self.0.saturating_sub(nanos))
    }

    /// `self + duration`, saturating at [`Instant::MAX`].
    #[must_use]
    pub fn add_duration(self, duration: Duration) -> Instant {
        self.add_nanos(duration_nanos(duration))
    }

    /// Nanoseconds from `earlier` to `self`; zero when `earlier` is later.
    pub const fn nanos_since(self, earlier: Instant) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// A duration in whole nanoseconds, saturating at `u64::MAX` (about 584 years).
pub fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
