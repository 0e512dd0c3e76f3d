//! The node driver's clock: tokio's, mapped onto the core's nanoseconds.

use std::time::Duration;

/// The core's clock: tokio's monotonic clock, counted from the Unix time read once at start, so
/// it never goes back (a wall-clock step after the start is not followed; NTP's slewing is, as
/// the monotonic clock follows it). Calendar windows are Unix time: on this clock every node
/// names a window with the same numbers, up to the skew of the hosts' clocks at start.
///
/// It reads `tokio::time::Instant`, so that the node's timers (`sleep_until` of the core's
/// deadlines) and its notion of now are one clock: under `#[tokio::test(start_paused = true)]`
/// both are virtual, and a timer that is due is due by the same clock that runs it (no busy
/// loop of a timer that fired by tokio's clock but is not due by another).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Origin {
    monotonic: tokio::time::Instant,
    unix_nanos: u64,
}

impl Origin {
    /// The clock, starting now.
    pub(crate) fn start() -> Origin {
        Origin { monotonic: tokio::time::Instant::now(), unix_nanos: crate::durable::unix_nanos_now() }
    }

    /// The core's now.
    pub(crate) fn now_instant(&self) -> ratemesh_core::Instant {
        let elapsed = u64::try_from(self.monotonic.elapsed().as_nanos()).unwrap_or(u64::MAX);
        ratemesh_core::Instant::from_nanos(self.unix_nanos.saturating_add(elapsed))
    }

    /// The tokio instant of the core's instant `at`.
    pub(crate) fn tokio_instant(&self, at: ratemesh_core::Instant) -> tokio::time::Instant {
        let since_start = Duration::from_nanos(at.as_nanos().saturating_sub(self.unix_nanos));
        self.monotonic + since_start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_core_clock_follows_tokio_time_and_maps_back_exactly() {
        let origin = Origin::start();
        let start = origin.now_instant();
        tokio::time::advance(Duration::from_millis(1500)).await;
        let later = origin.now_instant();
        assert_eq!(later.nanos_since(start), 1_500_000_000);
        assert_eq!(origin.tokio_instant(later), origin.monotonic + Duration::from_millis(1500));
    }
}
