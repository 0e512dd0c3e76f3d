//! What a node keeps per key beyond its bucket: the policy, and the role-specific bookkeeping of
//! approximate mode (a follower's allowance and unreported hits, an owner's participants).

use crate::prelude::*;
use alloc::sync::Arc;

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
    /// Owner bookkeeping: the other nodes that hold allowances of this key or forward its checks.
    pub participants: Vec<Participant>,
    /// This node's own demand for the key (for its share when it owns the key).
    pub demand: DemandMeter,
    /// Owner only: the allowance it granted itself (only while the key is contended: otherwise
    /// its own checks are decided on the bucket directly).
    pub own: Allowance,
    /// Owner only: at the last sizing, demand exceeded what the key can supply and the owner's
    /// own share was worth an allowance, so its checks beyond that allowance are refused — until
    /// the next sizing, or until this instant, the window's end under a window algorithm (as a
    /// holder's [`Follower::contended_until`]); [`Instant::ZERO`] when not contended.
    pub own_contended_until: Instant,
    /// Owner only: its own share of a contended key's refill, when it decides on the bucket.
    pub own_credit: Credit,
    /// The sync round (`Node::due_epoch`) for which a client check last put the key in the
    /// node's own allowances due (0: none).
    pub own_due_epoch: u32,
    /// The same for the replicas due.
    pub replica_due_epoch: u32,
    /// Regions: this region's lease on a part of the key's limit (as the region's owner).
    pub region: Option<Box<super::region::RegionLease>>,
    /// Regions: the ledger of every region's lease (as the key's home owner).
    pub home: Option<Box<super::region::HomeLedger>>,
    /// Owner only: its own checks of the current audit slot (`audit.rs`; read by nothing else).
    pub audit_hot: super::audit::Hot,
    /// Owner only: when a client's check created this entry with no state from elsewhere (the
    /// key's first check, if nothing was lost before: `audit.rs`). Taken by the key's first audit
    /// record; cleared when state from elsewhere joins the bucket.
    pub born: Option<Instant>,
}

/// Marks a key due in sync round `epoch` (`KeyMeta::own_due_epoch` or `replica_due_epoch`):
/// whether it was not marked for this round yet, so must be added to the round's set. A mark
/// only skips an insert into a set that already holds the key: the sets are taken when the
/// round begins, and the epoch moves on at the same moment. (A key untouched for exactly 2^32
/// rounds would skip one insert: at a round a millisecond, once in 50 days, its refresh delayed
/// by a round.)
pub(super) fn mark_due(mark: &mut u32, epoch: u32) -> bool {
    let unmarked = *mark != epoch;
    *mark = epoch;
    unmarked
}

impl KeyMeta {
    pub fn new(policy: Arc<Policy>, owned: bool) -> KeyMeta {
        KeyMeta {
            policy,
            owned,
            follower: None,
            participants: Vec::new(),
            demand: DemandMeter::default(),
            own: Allowance::NONE,
            own_contended_until: Instant::ZERO,
            own_credit: Credit::default(),
            own_due_epoch: 0,
            replica_due_epoch: 0,
            region: None,
            home: None,
            audit_hot: super::audit::Hot::default(),
            born: None,
        }
    }

    /// The entry of a key an owner's client check creates at `now`: born here.
    pub fn born(policy: Arc<Policy>, now: Instant) -> KeyMeta {
        KeyMeta { born: Some(now), ..KeyMeta::new(policy, true) }
    }

    /// Owner only: the allowance held at `now` by the owner itself and by every participant.
    pub fn outstanding(&self, now: Instant) -> u64 {
        let own = self.own.live(now);
        self.participants.iter().fold(own, |sum, p| sum.saturating_add(p.outstanding(now)))
    }

    /// Owner only: the allowance held at `now` where it is used — by the owner, and by the
    /// participants as they last reported — leaving out grants still in flight.
    pub fn held(&self, now: Instant) -> u64 {
        let own = self.own.live(now);
        self.participants.iter().fold(own, |sum, p| sum.saturating_add(p.held(now)))
    }

    /// Owner only: the refill credit of `node` (`None`: the owner itself), if it participates.
    pub fn credit(&mut self, node: Option<NodeId>) -> Option<&mut Credit> {
        match node {
            None => Some(&mut self.own_credit),
            Some(node) => self.participants.iter_mut().find(|p| p.node == node).map(|p| &mut p.credit),
        }
    }

    pub fn follower(&mut self) -> &mut Follower {
        self.follower.get_or_insert_with(Box::default)
    }
}

/// How long a follower's entry outlives its last report (long enough for the grant to arrive) and
/// its last check.
const KEEP_AFTER_REPORT_NANOS: u64 = 1_000_000_000;

impl KeyExtra for KeyMeta {
    fn keep_until(&self) -> Instant {
        // What participants hold is kept until it is released (or void).
        let shares = self.participants.iter().map(|p| p.released_at).max().unwrap_or(Instant::ZERO);
        let own = if self.own.hits > 0 { self.own.expires_at } else { Instant::ZERO };
        // A region's lease and a home's ledger are kept while they last (a lease's part is what
        // the home counts the region as using).
        let lease = self.region.as_ref().map_or(Instant::ZERO, |lease| lease.until);
        let ledger = self.home.as_ref().map_or(Instant::ZERO, |home| home.until());
        let owner_side = shares.max(own).max(lease).max(ledger);
        let Some(follower) = self.follower.as_ref() else { return owner_side };
        if follower.has_news() || follower.allowance.hits > 0 {
            return Instant::MAX;
        }
        // A key asked for lately keeps its demand history (what allowances are sized from).
        let reported = follower.reported_at.map_or(Instant::ZERO, |at| at.add_nanos(KEEP_AFTER_REPORT_NANOS));
        let asked = follower.demand.updated_at.add_nanos(KEEP_AFTER_REPORT_NANOS);
        owner_side.max(reported).max(asked).max(follower.over_until)
    }
}

/// Hits a node may admit without asking, debited from the authoritative bucket when granted,
/// valid until `expires_at` (the end of the owner's current window for the window algorithms;
/// never for the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Allowance {
    pub hits: u64,
    pub expires_at: Instant,
}

impl Default for Allowance {
    fn default() -> Self {
        Allowance::NONE
    }
}

impl Allowance {
    pub const NONE: Allowance = Allowance { hits: 0, expires_at: Instant::MAX };

    /// The hits still usable at `now`.
    pub fn live(&self, now: Instant) -> u64 {
        if now < self.expires_at { self.hits } else { 0 }
    }

    /// Drops an expired allowance (its hits were counted in a window that has passed).
    pub fn expire(&mut self, now: Instant) {
        if now >= self.expires_at {
            *self = Allowance::NONE;
        }
    }

    /// Takes `cost` hits (at least one must be held, so a query needs a live allowance too).
    pub fn take(&mut self, cost: u64, now: Instant) -> bool {
        self.expire(now);
        if self.hits < cost.max(1) {
            return false;
        }
        self.hits -= cost;
        true
    }

    /// Adds a lease's `hits` and moves the expiry of everything held to `expires_at` (or keeps a
    /// later one): the owner counts all of it held until the lease it just granted ends.
    pub fn renew(&mut self, hits: u64, expires_at: Instant, now: Instant) {
        self.expire(now);
        let held_before = self.hits > 0 && self.expires_at != Instant::MAX;
        self.hits = self.hits.saturating_add(hits);
        self.expires_at = if held_before { self.expires_at.max(expires_at) } else { expires_at };
    }

    /// Adds `hits` valid until `expires_at`; an expired remainder is dropped first.
    pub fn add(&mut self, hits: u64, expires_at: Instant, now: Instant) {
        self.expire(now);
        if hits == 0 {
            return;
        }
        self.hits = self.hits.saturating_add(hits);
        self.expires_at = if self.hits == hits { expires_at } else { self.expires_at.min(expires_at) };
    }
}

/// A share of a contended key's refill, for checks decided on the owner's bucket (forwarded ones,
/// and the owner's own without an allowance): it accrues at the node's demand-proportional share
/// of the refill rate, up to a small cap, and a check passes only if it covers its cost. First come
/// first served on the bucket alone would give the refill to whoever asks most often — at
/// overload, the owner's own checks, which arrive without a round trip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Credit {
    /// Millionths of a hit.
    micro_hits: u64,
    /// When it last accrued (`Instant::ZERO`: never used, starts at its cap).
    at: Instant,
}

/// The share of a contended key's refill one node gets, and the credit it may keep.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CreditRate {
    /// Nanoseconds per hit of the key's refill (nonzero).
    pub refill_nanos_per_hit: u64,
    /// The node's demand and the key's, any unit: its share is `demand / total`.
    pub demand: u64,
    pub total: u64,
    /// The most hits it may keep.
    pub cap_hits: u64,
}

impl CreditRate {
    /// Millionths of a hit accrued over `nanos`.
    pub fn micro_per_nanos(&self, nanos: u64) -> u64 {
        let micro = u128::from(nanos) * 1_000_000 * u128::from(self.demand)
            / (u128::from(self.refill_nanos_per_hit) * u128::from(self.total.max(1)));
        u64::try_from(micro).unwrap_or(u64::MAX)
    }

    /// Nanoseconds to accrue `micro` millionths of a hit (`u64::MAX` without demand).
    fn nanos_for(&self, micro: u64) -> u64 {
        if self.demand == 0 {
            return u64::MAX;
        }
        let nanos = u128::from(micro) * u128::from(self.refill_nanos_per_hit) * u128::from(self.total.max(1))
            / (1_000_000 * u128::from(self.demand));
        u64::try_from(nanos).unwrap_or(u64::MAX)
    }
}

impl Credit {
    /// Accrues up to `now`, at most `cap_hits` (or `cost`, if more) in all.
    fn accrue(&mut self, cost: u64, rate: CreditRate, now: Instant) {
        let cap = rate.cap_hits.max(cost).max(1).saturating_mul(1_000_000);
        self.micro_hits = match self.at {
            Instant::ZERO => cap,
            at => self.micro_hits.saturating_add(rate.micro_per_nanos(now.nanos_since(at))).min(cap),
        };
        self.at = now;
    }

    /// Accrues up to `now`, then takes `cost` hits if the credit covers them; else says how long
    /// until it would.
    pub fn take(&mut self, cost: u64, rate: CreditRate, now: Instant) -> Result<(), u64> {
        self.accrue(cost, rate, now);
        let need = cost.saturating_mul(1_000_000);
        match self.micro_hits.checked_sub(need) {
            Some(left) => {
                self.micro_hits = left;
                Ok(())
            }
            None => Err(rate.nanos_for(need - self.micro_hits)),
        }
    }

    /// Accrues up to `now`, then takes the whole hits it holds, at most `hits`.
    pub fn take_up_to(&mut self, hits: u64, rate: CreditRate, now: Instant) -> u64 {
        self.accrue(0, rate, now);
        let taken = (self.micro_hits / 1_000_000).min(hits);
        self.micro_hits -= taken * 1_000_000;
        taken
    }

    /// Gives back `cost` hits taken for a check the bucket refused after all.
    pub fn give_back(&mut self, cost: u64) {
        self.micro_hits = self.micro_hits.saturating_add(cost.saturating_mul(1_000_000));
    }
}

/// A new follower epoch: never 0 (the epoch of allowances offered to forwarders), and small (two
/// bytes on the wire; a new epoch has to differ from the one before it at one owner only, and
/// a collision costs at most one stale grant, already debited).
pub(crate) fn new_epoch(rng: &mut crate::algorithm::CoreRng) -> u64 {
    1 + rand::Rng::next_u64(rng) % 0x3fff
}

/// A non-owner's state of one key: allowances and reports in approximate mode, the fallback in
/// either mode.
#[derive(Clone, Debug, Default)]
pub(crate) struct Follower {
    /// The owner this node reports to.
    pub owner: Option<NodeId>,
    /// Names this follower's relationship with `owner` (random, new for every new owner or new
    /// entry): grants of another epoch are stale, and the owner restarts its accounting for a
    /// new one.
    pub epoch: u64,
    /// The sum of the grants applied in this epoch (the owner subtracts it from the sum it sent to
    /// know what is still in flight).
    pub granted_seen: u64,
    /// Hits this node may still admit without asking.
    pub allowance: Allowance,
    /// Allowance hits admitted since the last report (news for the owner's demand accounting).
    pub used: u64,
    /// Hits refused here for want of an allowance since the last report (the owner learns of the
    /// demand at the next report).
    pub refused: u64,
    /// Hits admitted without an allowance (fallback) since the last report: the owner must
    /// debit them.
    pub uncovered: u64,
    /// Allowance given back since the last report: the owner credits it.
    pub returned: u64,
    /// Hits the owner admitted for forwards that timed out here (see [`Report::refunded`]).
    ///
    /// [`Report::refunded`]: crate::wire::Report::refunded
    pub refunded: u64,
    /// Hits asked for, decaying: the demand that shares are proportional to.
    pub demand: DemandMeter,
    /// The owner said the key is over its limit until then for checks of `over_cost` hits or
    /// more: refuse those locally, do not ask.
    pub over_until: Instant,
    /// The smallest cost `over_until` holds for: a check of fewer hits may fit sooner (a log or
    /// window with room for 1 hit refuses 2 until an older hit leaves) and is forwarded.
    pub over_cost: u64,
    /// Hits refused locally while `over_until` held, since the last forward (which carries them
    /// to the owner: demand it would not see otherwise).
    pub refused_unasked: u64,
    /// The owner said demand exceeds what the key can supply and this node's share is an
    /// allowance: when it runs dry, refuse locally until the next grant instead of asking — or
    /// until this instant, the end of the owner's window under a window algorithm (a new window
    /// is not contended: refusing until the next grant would refuse its first interval's
    /// arrivals, which the one ideal limiter admits); [`Instant::ZERO`] when not contended.
    pub contended_until: Instant,
    /// The allowance is a headroom lease ([`Grant::lease`]): reported when it runs low or nears
    /// its expiry, not whenever it was used.
    ///
    /// [`Grant::lease`]: crate::wire::Grant::lease
    pub lease: bool,
    /// The owner changed: the next report carries the last authoritative state, to seed the new
    /// owner conservatively.
    pub seed_pending: bool,
    /// The fallback bucket (this node's share of the limit).
    pub local: Option<Bucket>,
    /// When the last report for this key was sent.
    pub reported_at: Option<Instant>,
    /// The frame order of the grant whose state and flags are applied.
    pub grant_order: u128,
}

impl Follower {
    /// Whether the owner has something to learn from this node.
    pub fn has_news(&self) -> bool {
        self.uncovered > 0
            || self.returned > 0
            || self.refunded > 0
            || self.seed_pending
            || self.used > 0
            || self.refused > 0
    }

    /// Whether this round's report is due: the owner must debit or credit something, or learn of
    /// a seed — or of the hits used or refused, unless the allowance is a lease not `running_low`
    /// (a lease is renewed by exception, not every round).
    pub fn report_due(&self, running_low: bool) -> bool {
        let owed = self.uncovered > 0 || self.returned > 0 || self.refunded > 0 || self.seed_pending;
        let asked = self.used > 0 || self.refused > 0;
        owed || (asked && (!self.lease || running_low))
    }

    /// Starts reporting to `owner` under a new `epoch`. The allowance is kept: it was debited by
    /// the owner that granted it, whose state the new owner inherits.
    pub fn follow(&mut self, owner: NodeId, epoch: u64) {
        self.owner = Some(owner);
        self.epoch = epoch;
        self.granted_seen = 0;
        self.contended_until = Instant::ZERO;
        self.lease = false;
        self.over_until = Instant::ZERO;
    }
}

/// Another node holding an allowance of, or forwarding checks for, a key this node owns.
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
    /// The participant's demand, in hits per second (from its reports and forwarded checks).
    pub demand_per_s: u64,
    /// The frame order of the report `holding` and `demand_per_s` come from.
    pub report_order: u128,
    /// The checks it forwarded, decaying (its demand when it does not report).
    pub forwards: DemandMeter,
    /// When it last reported.
    pub reported_at: Instant,
    pub heard_at: Instant,
    /// Its share of the key's refill while the key is contended, for its forwarded checks.
    pub credit: Credit,
    /// After this, what the participant holds no longer counts: it has been silent too long
    /// (crashed, or follows another owner), or its allowances are void (the window passed, the
    /// lease ended).
    pub released_at: Instant,
    /// Its last grant was a headroom lease: what it holds is void once `released_at` passes,
    /// and it counts in the key's demand until then even when silent.
    pub leased: bool,
}

impl Participant {
    /// Allowance the participant holds or will hold at `now`: what it reported, plus grants in
    /// flight.
    pub fn outstanding(&self, now: Instant) -> u64 {
        self.held(now).saturating_add(self.in_flight(now))
    }

    /// What it held at its last report (until released).
    pub fn held(&self, now: Instant) -> u64 {
        if now >= self.released_at { 0 } else { self.holding }
    }

    /// Grants sent that it had not applied at its last report (until released).
    pub fn in_flight(&self, now: Instant) -> u64 {
        if now >= self.released_at { 0 } else { self.sent.saturating_sub(self.seen) }
    }
}

/// A decaying count of hits: its value halves every `half_life`, so `value × ln 2 / half_life`
/// estimates the recent rate. IEEE arithmetic on the same inputs gives the same result on every
/// run, so simulations stay reproducible.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct DemandMeter {
    hits: f64,
    pub updated_at: Instant,
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
        self.per_second_without(now, half_life_nanos, 0)
    }

    /// The recent rate at `now` leaving out `hits` added at `now` — the estimate just after an
    /// arrival is biased up by the arrival itself (by `ln 2 / half_life` per hit, 6.9/s at a
    /// 100 ms half-life, whatever the true rate), which would make a key asked for once a second
    /// look busy.
    pub fn per_second_without(&mut self, now: Instant, half_life_nanos: u64, hits: u64) -> u64 {
        self.decay(now, half_life_nanos);
        let left = (self.hits - hits as f64).max(0.0);
        let per_second = left * core::f64::consts::LN_2 * 1e9 / half_life_nanos.max(1) as f64;
        // Saturating float-to-int conversion: NaN is impossible (hits ≥ 0), huge values clamp.
        libm::ceil(per_second) as u64
    }

    fn decay(&mut self, now: Instant, half_life_nanos: u64) {
        let elapsed = now.nanos_since(self.updated_at);
        self.updated_at = self.updated_at.max(now);
        self.hits *= libm::exp2(-(elapsed as f64) / half_life_nanos.max(1) as f64);
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
