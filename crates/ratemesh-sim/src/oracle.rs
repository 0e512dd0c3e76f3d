//! The oracle: one ideal global limiter that sees every request in arrival order.

use rand::SeedableRng;
use ratemesh_core::{Bucket, CoreRng, Instant, Limit};

use crate::clock::CLOCK_BASE_NANOS;

/// An ideal single limiter per key, driven by virtual time. Its decisions are the yardstick of
/// every metric.
#[derive(Clone, Debug)]
pub struct Oracle {
    limit: Limit,
    buckets: Vec<Bucket>,
    rng: CoreRng,
}

impl Oracle {
    /// An oracle for `keys` keys under `limit`, every bucket fresh at virtual time 0.
    pub fn new(limit: Limit, keys: u32) -> Oracle {
        let start = Instant::from_nanos(CLOCK_BASE_NANOS);
        let buckets = (0..keys).map(|_| Bucket::new(&limit, start)).collect();
        Oracle { limit, buckets, rng: CoreRng::seed_from_u64(0) }
    }

    /// Whether the ideal limiter admits `cost` hits on `key` at virtual time `at_nanos` (and
    /// counts them if so). Calls must come in arrival order.
    pub fn admit(&mut self, key: u32, cost: u64, at_nanos: u64) -> bool {
        let now = Instant::from_nanos(CLOCK_BASE_NANOS + at_nanos);
        self.buckets[key as usize].check(&self.limit, cost, now, &mut self.rng).allowed
    }
}
