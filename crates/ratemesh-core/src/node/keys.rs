//! What a node keeps per key beyond its bucket: the policy, and the role-specific bookkeeping of
//! approximate mode (a follower's allowance and unreported hits, an owner's participants).

use std::sync::Arc;

use super::api::{NodeId, Policy};
use crate::algorithm::Bucket;
use crate::store::KeyExtra;
use crate::time::Instant;

/// Per-key bookkeeping of a node. The store's bucket next to it is the authoritative bucket when
/// this node owns the key, and the owner's last reported state otherwise.
#[derive(Clone, Debug)]
pub(crate) struct KeyMeta {
    pub policy: Arc<Policy>,
    /// Whether the bucket is authoritative (this node owns the key).
    pub owned: bool,
    /// Follower bookkeeping, when this node has decided the key without owning it.
    pub follower: Option<Box<Follower>>,
    /// Owner bookkeeping: the nodes that hold shares of this key.
    pub participants: Vec<Participant>,
    /// This node's own demand for the key (for its share when it owns the key).
    pub demand: DemandMeter,
    /// Owner only: the allowance it granted itself for its own approximate-mode checks.
    pub own_allowance: u64,
}

impl KeyMeta {
    pub fn new(policy: Arc<Policy>, owned: bool) -> KeyMeta {
        KeyMeta {
            policy,
            owned,
            follower: None,
            participants: Vec::new(),
            demand: DemandMeter::default(),
            own_allowance: 0,
        }
    }

    /// Owner only: the allowance held by the owner itself and by every participant.
    pub fn outstanding(&self) -> u64 {
        self.participants.iter().fold(self.own_allowance, |sum, p| sum.saturating_add(p.outstanding()))
    }

    pub fn follower(&mut self) -> &mut Follower {
        self.follower.get_or_insert_with(Box::default)
    }
}

/// How long a follower's entry outlives its last report: long enough for the grant to arrive.
const KEEP_AFTER_REPORT_NANOS: u64 = 1_000_000_000;

impl KeyExtra for KeyMeta {
    fn keep_until(&self) -> Instant {
        let shares_out = self.participants.iter().any(|p| p.outstanding() > 0);
        let Some(follower) = self.follower.as_ref() else {
            return if shares_out { Instant::MAX } else { Instant::ZERO };
        };
        if shares_out || follower.has_news() || follower.allowance > 0 {
            return Instant::MAX;
        }
        follower.reported_at.map_or(Instant::ZERO, |at| at.add_nanos(KEEP_AFTER_REPORT_NANOS))
    }
}

/// A non-owner's state of one key in approximate mode (and for fallback decisions in exact mode).
#[derive(Clone, Debug, Default)]
pub(crate) struct Follower {
    /// The owner this node reports to.
    pub owner: Option<NodeId>,
    /// Names this follower's relationship with `owner` (random, new for every new owner or new
    /// entry): grants of another epoch are stale, and the owner restarts its accounting for a
    /// new one.
    pub epoch: u64,
    /// Whether `owner` has granted anything in this epoch yet.
    pub granted: bool,
    /// The sum of the grants applied in this epoch (the owner subtracts it from the sum it sent to
    /// know what is still in flight).
    pub granted_seen: u64,
    /// Hits this node may still admit without asking: granted by an owner, already debited from
    /// the authoritative bucket.
    pub allowance: u64,
    /// Hits admitted without an allowance (fallback) since the last report: the owner must
    /// debit them.
    pub uncovered: u64,
    /// Allowance given back since the last report: the owner credits it.
    pub returned: u64,
    /// Hits asked for, decaying: the demand that shares are proportional to.
    pub demand: DemandMeter,
    /// The owner said the key is over its limit until then: refuse locally, do not ask.
    pub over_until: Instant,
    /// The owner said demand exceeds the rate: when the allowance runs dry, refuse locally.
    pub contended: bool,
    /// The owner changed: the next report carries the last authoritative state, to seed the new
    /// owner conservatively.
    pub seed_pending: bool,
    /// The fallback bucket (this node's local share of the limit).
    pub local: Option<Bucket>,
    /// When the last report for this key was sent.
    pub reported_at: Option<Instant>,
}

impl Follower {
    /// Whether the owner has something to learn from this node.
    pub fn has_news(&self) -> bool {
        self.uncovered > 0 || self.returned > 0 || self.seed_pending
    }

    /// Starts reporting to `owner` under a new `epoch`. The allowance is kept: it was debited by
    /// the owner that granted it, whose state the new owner inherits.
    pub fn follow(&mut self, owner: NodeId, epoch: u64) {
        self.owner = Some(owner);
        self.epoch = epoch;
        self.granted = false;
        self.granted_seen = 0;
    }
}

/// A node holding a share of a key this node owns.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Participant {
    pub node: NodeId,
    /// The follower's epoch the counters below belong to.
    pub epoch: u64,
    /// The sum of the grants sent in this epoch.
    pub sent: u64,
    /// The sum of the grants the follower had applied at its last report.
    pub seen: u64,
    /// The allowance the follower held at its last report.
    pub holding: u64,
    /// The participant's reported demand, in hits per second.
    pub demand_per_s: u64,
    pub heard_at: Instant,
}

impl Participant {
    /// Allowance the participant holds or will hold: what it reported, plus grants in flight.
    pub fn outstanding(&self) -> u64 {
        self.holding.saturating_add(self.sent.saturating_sub(self.seen))
    }
}

/// A decaying count of hits: its value halves every `half_life`, so `value × ln 2 / half_life`
/// estimates the recent rate. IEEE arithmetic on the same inputs gives the same result on every
/// run, so simulations stay reproducible.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct DemandMeter {
    hits: f64,
    updated_at: Instant,
}

impl DemandMeter {
    /// Adds `hits` at `now`.
    pub fn add(&mut self, hits: u64, now: Instant, half_life_nanos: u64) {
        self.decay(now, half_life_nanos);
        self.hits += hits as f64;
    }

    /// The recent rate at `now`, in hits per second, rounded up (a key asked for once is in
    /// demand).
    pub fn per_second(&mut self, now: Instant, half_life_nanos: u64) -> u64 {
        self.decay(now, half_life_nanos);
        let per_second = self.hits * core::f64::consts::LN_2 * 1e9 / half_life_nanos.max(1) as f64;
        // Saturating float-to-int conversion: NaN is impossible (hits ≥ 0), huge values clamp.
        per_second.ceil() as u64
    }

    fn decay(&mut self, now: Instant, half_life_nanos: u64) {
        let elapsed = now.nanos_since(self.updated_at);
        self.updated_at = self.updated_at.max(now);
        self.hits *= (-(elapsed as f64) / half_life_nanos.max(1) as f64).exp2();
        if self.hits < 1e-3 {
            self.hits = 0.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_meter_estimates_a_steady_rate() {
        // Rates well above one hit per half-life (below that, the estimate depends on the phase).
        let cases = [(10u64, 1_000_000_000u64), (90, 100_000_000), (1_000, 100_000_000), (50, 1_000_000_000)];
        for (rate_per_s, half_life_nanos) in cases {
            let mut meter = DemandMeter::default();
            let gap = 1_000_000_000 / rate_per_s;
            let mut now = Instant::from_millis(1_000);
            for _ in 0..rate_per_s * 5 {
                now = now.add_nanos(gap);
                meter.add(1, now, half_life_nanos);
            }
            let estimate = meter.per_second(now, half_life_nanos);
            let error = estimate.abs_diff(rate_per_s) as f64 / rate_per_s as f64;
            assert!(
                error < 0.15,
                "rate {rate_per_s}/s, half-life {half_life_nanos} ns: estimated {estimate}"
            );
        }
    }

    #[test]
    fn demand_meter_forgets_an_idle_key() {
        let mut meter = DemandMeter::default();
        let start = Instant::from_millis(1_000);
        meter.add(1_000, start, 100_000_000);
        assert!(meter.per_second(start, 100_000_000) > 1_000);
        assert_eq!(meter.per_second(start.add_nanos(10_000_000_000), 100_000_000), 0);
    }
}
