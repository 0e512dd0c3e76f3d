//! Shares of a limit: how much of each limit a subset of the members enforces.
//!
//! Every member of a view (live and dead, sorted by id) has a rank; rank `r` of `n` holds
//! `⌊v·(r+1)/n⌋ − ⌊v·r/n⌋` of a value `v` (the limit, the burst). The shares of all ranks sum to
//! `v` exactly, so the fallback shares of the nodes cut off from an owner and the owner's own
//! part never sum to more than the limit — also when the limit is below the node count, where
//! most ranks hold nothing (a node without a share refuses while it cannot reach the owner) and
//! rounding each share up to one hit would multiply the limit.

use crate::limit::{Algorithm, Limit, LimitSpec};

/// The part of `value` that rank `rank` of `n` holds.
pub(super) fn share(value: u64, rank: usize, n: usize) -> u64 {
    let n = n.max(1) as u128;
    let at = |r: usize| u128::from(value) * r as u128 / n;
    let part = u64::try_from(at(rank + 1) - at(rank)).unwrap_or(value);
    // The shares of all ranks sum to `value` (telescoping), so no rank holds more than its
    // rounded-up part of it.
    debug_assert!(part <= value.div_ceil(n as u64), "rank {rank} of {n} holds {part} of {value}");
    part
}

/// The part of `value` that the `ranks` of `n` hold together.
fn share_of(value: u64, ranks: &[usize], n: usize) -> u64 {
    ranks.iter().fold(0u64, |sum, &rank| sum.saturating_add(share(value, rank, n)))
}

/// `limit` as the `ranks` of `n` members enforce it, or `None` when their share of its rate is
/// zero. All ranks together enforce the limit itself. A share of the rate keeps at least one hit
/// of burst (a bucket that holds nothing would never admit); everything else is apportioned.
pub(super) fn apportion(limit: &Limit, ranks: &[usize], n: usize) -> Option<Limit> {
    if ranks.len() >= n {
        return Some(limit.clone());
    }
    let spec = limit.spec();
    let rate = share_of(spec.limit, ranks, n);
    debug_assert!(rate <= spec.limit, "some of the members enforce at most the limit");
    if rate == 0 {
        return None;
    }
    let burst = match spec.algorithm {
        Algorithm::TokenBucket => Some(share_of(spec.burst.unwrap_or(spec.limit), ranks, n).max(1)),
        Algorithm::Gcra => Some(share_of(spec.burst.unwrap_or(1), ranks, n).max(1)),
        Algorithm::LeakyBucketShaper => Some(share_of(spec.burst.unwrap_or(0), ranks, n)),
        _ => spec.burst,
    };
    let delay = spec.delay.map(|d| share_of(d, ranks, n).min(burst.unwrap_or(0)));
    let scaled = LimitSpec {
        algorithm: spec.algorithm,
        limit: rate,
        period: spec.period,
        burst,
        delay,
        calendar: spec.calendar,
    };
    Limit::new(scaled).ok()
}

#[cfg(test)]
mod tests {
    use crate::prelude::*;
    use core::time::Duration;

    use super::*;

    #[test]
    fn shares_of_every_rank_sum_to_the_value() {
        for n in 1..=40 {
            for value in [0u64, 1, 2, 3, 5, 7, 10, 99, 100, 1_000, 86_400, u64::MAX] {
                let total: u128 = (0..n).map(|r| u128::from(share(value, r, n))).sum();
                assert_eq!(total, u128::from(value), "value {value} over {n}");
                let (lo, hi) = (value / n as u64, value.div_ceil(n as u64));
                assert!((0..n).all(|r| (lo..=hi).contains(&share(value, r, n))));
            }
        }
    }

    #[test]
    fn the_sides_of_a_partition_never_sum_above_the_limit() {
        let limit =
            Limit::new(LimitSpec::new(Algorithm::TokenBucket, 1, Duration::from_secs(1))).expect("valid");
        let n = 10;
        // 7 | 3: the owner's side enforces its ranks' share, each cut-off node its own.
        let owner_side: Vec<usize> = (0..7).collect();
        let rates: u64 = core::iter::once(apportion(&limit, &owner_side, n))
            .chain((7..10).map(|r| apportion(&limit, &[r], n)))
            .map(|l| l.map_or(0, |l| l.spec().limit))
            .sum();
        assert_eq!(rates, 1);
    }

    #[test]
    fn a_share_keeps_a_burst_of_one_hit() {
        let spec = LimitSpec::new(Algorithm::Gcra, 100, Duration::from_secs(1));
        let limit = Limit::new(spec).expect("valid");
        let part = apportion(&limit, &[3], 10).expect("a share of 100 over 10");
        assert_eq!((part.spec().limit, part.capacity()), (10, 1));
    }
}
