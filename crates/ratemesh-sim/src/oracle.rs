//! The oracle: one ideal global limiter that sees every request in arrival order.

use rand::SeedableRng;
use ratemesh_core::{Bucket, CoreRng, Instant, Limit};

use crate::clock::CLOCK_BASE_NANOS;

/// An ideal single limiter per key, driven by virtual time. Its decisions are the yardstick of
/// every metric.
#[derive(Clone, Debug)]
pub struct Oracle {
    limits: Vec<Limit>,
    /// Per key: its policy's index in `limits` and its bucket.
    buckets: Vec<(usize, Bucket)>,
    rng: CoreRng,
}

impl Oracle {
    /// An oracle for `keys` keys, key `k` under `limits[policy_of(k)]`, every bucket fresh at
    /// virtual time 0.
    pub fn new(limits: Vec<Limit>, keys: u32, policy_of: impl Fn(u32) -> usize) -> Oracle {
        let start = Instant::from_nanos(CLOCK_BASE_NANOS);
        let buckets = (0..keys)
            .map(|key| {
                let policy = policy_of(key);
                (policy, Bucket::new(&limits[policy], start))
            })
            .collect();
        Oracle { limits, buckets, rng: CoreRng::seed_from_u64(0) }
    }

    /// Whether the ideal limiter admits `cost` hits on `key` at virtual time `at_nanos` (and
    /// counts them if so). Calls must come in arrival order.
    pub fn admit(&mut self, key: u32, cost: u64, at_nanos: u64) -> bool {
        let now = Instant::from_nanos(CLOCK_BASE_NANOS + at_nanos);
        let (policy, bucket) = &mut self.buckets[key as usize];
        bucket.check(&self.limits[*policy], cost, now, &mut self.rng).allowed
    }
}
