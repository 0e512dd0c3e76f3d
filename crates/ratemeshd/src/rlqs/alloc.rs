//! Dividing one limit among the streams that report a bucket: pure functions, no IO, no clock.
//!
//! A **group** is one (policy, key): its rate `C` (tokens per second) and burst `B`, and the
//! members that report it (one per stream and bucket id). Each member has a *demand*: the
//! allowed + denied requests per second of its reports, or unknown until its first report that
//! covers time (Envoy's first report says 0 s).
//!
//! - **Shares** ([`shares`]): an unknown demand counts as `C / n`; every demand counts as at least
//!   [`DEMAND_FLOOR_FRACTION`] of `C / n` (an idle Envoy keeps a foothold). When the demands sum
//!   to more than `C`, each member gets `C × d / Σd` (proportional; no member gets more than it
//!   asked, so this is also max-min fair in the sense of the issue); otherwise each gets its
//!   demand plus an equal part of what is left, so that `Σ = C` and below the limit every
//!   Envoy has headroom.
//! - **Token buckets** ([`Share::of`]): a rate of at least 1/s is `floor(rate)` tokens every
//!   1 s; a smaller one is 1 token every `ceil(1 / rate)` s (at most [`FILL_INTERVAL_S_MAX`]);
//!   0 is a blanket `DENY_ALL`. `max_tokens = max(1, floor(B × rate / C))`. So Σ rates ≤ `C`
//!   and Σ `max_tokens` ≤ `B` (but for the floor of 1 when there are more members than `B`).
//! - **Stability** ([`Member::observe`]): a member's demand used for shares changes only when a
//!   report moves it by more than [`DEMAND_BAND`] (relative): shares are a deterministic function
//!   of the demands used, so steady demand never changes an assignment (every change hands the
//!   Envoy a fresh burst).

/// Relative change of a member's reported demand below which the demand used for shares is kept.
pub const DEMAND_BAND: f64 = 0.10;
/// The least demand a member counts for, as a fraction of the equal share `C / n`.
pub const DEMAND_FLOOR_FRACTION: f64 = 0.05;
/// The longest fill interval of an assignment (a rate below one token per hour is one per hour).
pub const FILL_INTERVAL_S_MAX: u64 = 3600;

/// A token bucket as Envoy's filter reads it, or a refusal of everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    /// `tokens_per_fill` tokens every `fill_interval_s` seconds, at most `max_tokens`.
    Bucket {
        /// Tokens added per fill (> 0).
        tokens_per_fill: u64,
        /// Whole seconds between fills (≥ 1).
        fill_interval_s: u64,
        /// The bucket's capacity and initial fill (> 0).
        max_tokens: u64,
    },
    /// A blanket `DENY_ALL`: the member's share is zero.
    DenyAll,
}

impl Share {
    /// The bucket for `rate` tokens per second out of a group of rate `limit_rate` and burst
    /// `burst`.
    pub fn of(rate: f64, limit_rate: f64, burst: u64) -> Share {
        if !rate.is_finite() || rate <= 0.0 || limit_rate <= 0.0 {
            return Share::DenyAll;
        }
        let (tokens_per_fill, fill_interval_s) = if rate >= 1.0 {
            (rate.floor() as u64, 1)
        } else {
            let interval = (1.0 / rate).ceil();
            if interval > FILL_INTERVAL_S_MAX as f64 {
                return Share::DenyAll;
            }
            (1, interval as u64)
        };
        let burst_share = (burst as f64 * (rate / limit_rate).min(1.0)).floor() as u64;
        Share::Bucket { tokens_per_fill, fill_interval_s, max_tokens: burst_share.max(1) }
    }

    /// Tokens per second.
    pub fn rate(self) -> f64 {
        match self {
            Share::Bucket { tokens_per_fill, fill_interval_s, .. } => {
                tokens_per_fill as f64 / fill_interval_s as f64
            }
            Share::DenyAll => 0.0,
        }
    }

    /// The bucket's capacity (0 for a refusal).
    pub fn max_tokens(self) -> u64 {
        match self {
            Share::Bucket { max_tokens, .. } => max_tokens,
            Share::DenyAll => 0,
        }
    }
}

/// The rates (tokens per second) of members with demands `demands` (`None`: unknown) sharing
/// `limit_rate`: see the module's documentation. Σ of the result ≤ `limit_rate`.
pub fn shares(limit_rate: f64, demands: &[Option<f64>]) -> Vec<f64> {
    let n = demands.len();
    if n == 0 || limit_rate <= 0.0 || !limit_rate.is_finite() {
        return vec![0.0; n];
    }
    let equal = limit_rate / n as f64;
    let floor = equal * DEMAND_FLOOR_FRACTION;
    let counted: Vec<f64> =
        demands.iter().map(|d| d.filter(|d| d.is_finite()).unwrap_or(equal).max(floor)).collect();
    let total: f64 = counted.iter().sum();
    if total > limit_rate {
        counted.iter().map(|d| limit_rate * d / total).collect()
    } else {
        let extra = (limit_rate - total) / n as f64;
        counted.iter().map(|d| d + extra).collect()
    }
}

/// What the group keeps of one member.
#[derive(Clone, Debug, Default)]
pub struct Member {
    /// The demand used for shares (requests per second), `None` until a report covered time.
    pub demand: Option<f64>,
    /// The share last assigned.
    pub assigned: Option<Share>,
}

impl Member {
    /// Takes a report of `requests` (allowed + denied) over `elapsed_s` seconds; returns whether
    /// the demand used for shares changed. A report over no time (Envoy's first) changes nothing.
    pub fn observe(&mut self, requests: u64, elapsed_s: f64) -> bool {
        if elapsed_s <= 0.0 || !elapsed_s.is_finite() {
            return false;
        }
        let measured = requests as f64 / elapsed_s;
        match self.demand {
            Some(used) if (measured - used).abs() <= DEMAND_BAND * used.max(1.0) => false,
            _ => {
                self.demand = Some(measured);
                true
            }
        }
    }
}

/// The shares of `members` (in their order) under `limit_rate` and `burst`, as buckets.
pub fn assign(limit_rate: f64, burst: u64, members: &[&Member]) -> Vec<Share> {
    let demands: Vec<Option<f64>> = members.iter().map(|m| m.demand).collect();
    shares(limit_rate, &demands).into_iter().map(|rate| Share::of(rate, limit_rate, burst)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(shares: &[Share]) -> (f64, u64) {
        (shares.iter().map(|s| s.rate()).sum(), shares.iter().map(|s| s.max_tokens()).sum())
    }

    fn members(demands: &[Option<f64>]) -> Vec<Member> {
        demands.iter().map(|&demand| Member { demand, assigned: None }).collect()
    }

    #[test]
    fn over_the_limit_shares_are_proportional_and_sum_below_it() {
        let m = members(&[Some(1500.0), Some(300.0), Some(200.0)]);
        let s = assign(1000.0, 1000, &m.iter().collect::<Vec<_>>());
        assert_eq!(s.iter().map(|s| s.rate()).collect::<Vec<_>>(), [750.0, 150.0, 100.0]);
        let (rate, burst) = sum(&s);
        assert!(rate <= 1000.0 && burst <= 1000, "{rate} {burst}");
        let m = members(&[Some(600.0), Some(600.0), Some(600.0)]);
        let s = assign(1000.0, 500, &m.iter().collect::<Vec<_>>());
        assert_eq!(s[0], Share::Bucket { tokens_per_fill: 333, fill_interval_s: 1, max_tokens: 166 });
        assert!(sum(&s).0 >= 990.0 && sum(&s).1 <= 500);
    }

    #[test]
    fn below_the_limit_each_gets_its_demand_and_headroom() {
        let rates = shares(1000.0, &[Some(200.0), Some(200.0), Some(200.0)]);
        assert!(rates.iter().all(|r| (r - 333.33).abs() < 0.01), "{rates:?}");
        let rates = shares(1000.0, &[Some(100.0), Some(500.0)]);
        assert_eq!(rates, [300.0, 700.0]);
    }

    #[test]
    fn unknown_and_idle_demands_keep_a_share() {
        // A newcomer (unknown demand) counts as the equal share; an idle one as the floor.
        let rates = shares(1000.0, &[Some(1000.0), None]);
        assert!((rates[1] - 1000.0 * 500.0 / 1500.0).abs() < 1e-9, "{rates:?}");
        let rates = shares(1000.0, &[Some(2000.0), Some(0.0)]);
        assert!(rates[1] > 0.0 && rates.iter().sum::<f64>() <= 1000.0 + 1e-9, "{rates:?}");
        assert_eq!(shares(1000.0, &[None]), [1000.0]);
        assert!(shares(0.0, &[None, None]).iter().all(|r| *r == 0.0));
    }

    #[test]
    fn buckets_are_whole_seconds_and_never_zero() {
        assert_eq!(
            Share::of(0.25, 1.0, 10),
            Share::Bucket { tokens_per_fill: 1, fill_interval_s: 4, max_tokens: 2 }
        );
        assert_eq!(
            Share::of(0.3, 1.0, 10),
            Share::Bucket { tokens_per_fill: 1, fill_interval_s: 4, max_tokens: 3 }
        );
        assert!(Share::of(0.3, 1.0, 10).rate() <= 0.3);
        assert_eq!(Share::of(0.0, 1.0, 10), Share::DenyAll);
        assert_eq!(Share::of(1e-9, 1.0, 10), Share::DenyAll);
        assert_eq!(Share::of(f64::NAN, 1.0, 10), Share::DenyAll);
        // More members than burst: each still holds one token.
        assert_eq!(Share::of(1.0, 100.0, 10).max_tokens(), 1);
    }

    #[test]
    fn steady_demand_keeps_the_demand_used() {
        let mut m = Member::default();
        assert!(!m.observe(1, 0.0), "a 0-s report measures nothing");
        assert!(m.observe(3000, 5.0));
        assert_eq!(m.demand, Some(600.0));
        assert!(!m.observe(3100, 5.0), "2 % noise");
        assert!(!m.observe(2800, 5.0), "7 % noise");
        assert!(m.observe(2000, 5.0), "a third less");
        assert_eq!(m.demand, Some(400.0));
        assert!(!m.observe(u64::MAX, f64::INFINITY));
    }
}
