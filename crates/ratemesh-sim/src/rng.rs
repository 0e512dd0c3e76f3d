//! Randomness: one scenario seed, split into independent sub-streams per purpose.
//!
//! Every random draw of a run comes from a [`SimRng`] derived from the scenario seed and a label
//! (`"workload.time"`, `"network"` with the link index, …). Streams are independent, so adding a
//! key to the workload does not move a single network draw, and vice versa.

use rand::{Rng, SeedableRng};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The simulator's random number generator.
pub type SimRng = rand_xoshiro::Xoshiro256PlusPlus;

/// The sub-stream named `label` and `index` of the run seeded with `seed`.
pub fn substream(seed: u64, label: &str, index: u64) -> SimRng {
    SimRng::seed_from_u64(substream_seed(seed, label, index))
}

/// The seed of the sub-stream named `label` and `index` (for seeding a node's own RNG).
pub fn substream_seed(seed: u64, label: &str, index: u64) -> u64 {
    let mut bytes = Vec::with_capacity(label.len() + 8);
    bytes.extend_from_slice(label.as_bytes());
    bytes.extend_from_slice(&index.to_le_bytes());
    xxh3_64_with_seed(&bytes, seed)
}

/// The seed a scenario runs with when neither the file nor the command line gives one.
pub fn seed_from_name(name: &str) -> u64 {
    xxh3_64_with_seed(name.as_bytes(), 0)
}

/// A uniform draw in `[0, 1)` with 53 bits of precision.
pub fn unit(rng: &mut SimRng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// True with probability `p` (p ≤ 0: never; p ≥ 1: always). Draws exactly once either way.
pub fn chance(rng: &mut SimRng, p: f64) -> bool {
    unit(rng) < p
}

/// A uniform integer in `0..n` (n ≥ 1), by multiply-shift (bias below 2⁻³² for small n).
pub fn below(rng: &mut SimRng, n: u64) -> u64 {
    ((u128::from(rng.next_u64()) * u128::from(n)) >> 64) as u64
}

/// An exponential draw with mean `1 / rate` (rate > 0).
pub fn exponential(rng: &mut SimRng, rate: f64) -> f64 {
    -(1.0 - unit(rng)).ln() / rate
}

/// A standard normal draw (Box–Muller; uses two uniforms).
pub fn standard_normal(rng: &mut SimRng) -> f64 {
    let u1 = 1.0 - unit(rng);
    let u2 = unit(rng);
    (-2.0 * u1.ln()).sqrt() * (core::f64::consts::TAU * u2).cos()
}
