//! Sizing allowances: a key's pool, demand and contention, each node's target and credit, and
//! the owner's ledger of participants.
//!
//! # Allowances and regimes
//!
//! An owner decides every check on a key it owns on the bucket (first come, first served), except
//! those a holder decides from an *allowance*: hits the owner debited from the bucket when it
//! granted them. The bucket must not refill under allowances that sit unused at their holders (an
//! idle holder's allowance and a full bucket would admit more than the capacity at once):
//! decisions first `hold` what the holders said they hold at their last reports, capped at the
//! capacity so that an estimate gone stale never turns into debt. Grants still in flight are not
//! held: they are the pipeline that keeps holders supplied across a round trip longer than the
//! sync interval, which a small bucket could not hold besides. Whether a node holds an allowance
//! is the owner's choice, per key and per node, from what the key can supply and what the node
//! asks for ([`SizingContext`]):
//!
//! - A node's *target* is its demand-proportional share of the key's pool (what the bucket holds,
//!   what is out in allowances and one interval of refill), capped by what its demand needs until
//!   the next grant can reach it (an interval and a round trip, with headroom).
//! - A target of at least `allowance_min` hits is worth an allowance: the node decides at memory
//!   speed and reports once per interval. A smaller one is not: a key whose share per node and
//!   interval is a few hits or less (a low limit, many nodes, many keys, a long period near its
//!   end) is split no further — its checks are forwarded and the owner decides them, exactly.
//! - A node whose target is below that still gets an allowance when the key has *headroom*: the
//!   demand of all its nodes over a lease (4 s, or 8 sync intervals if longer) fits [`HEADROOM_X`]
//!   times in the key's refill over it. Such a *headroom lease* covers the node's demand for the
//!   whole lease, expires with it at both ends, and is renewed when it runs low or nears its end, not
//!   at every interval: a key far below its limit is decided locally from its first checks on and
//!   costs one report per lease or so, not a round trip per check. Leases share at most a
//!   [`HEADROOM_X`]th of the bucket's capacity (the rest stays for a burst anywhere); stranded leases
//!   (a node that stops asking, or crashes: the owner holds a lease until its end) hold at most that,
//!   and the refill replaces them: nothing adds up (keys refilling fewer than [`HEADROOM_X`] hits a
//!   sync interval — windows, daily quotas, low limits — get no lease). The lease regime ends where
//!   contention could begin: a key whose demand comes within that factor of its supply goes back to
//!   per-interval allowances or forwarding.
//! - The key is *contended* when the demand of one interval exceeds the pool. Then a holder whose
//!   allowance runs dry refuses locally until its next grant (the owner has nothing more to give
//!   it); otherwise it forwards the check. The owner's own checks follow the same rule: while the
//!   key is contended it decides from an allowance sized like anybody's, so that it takes its fair
//!   share, not whatever arrives first.

use crate::prelude::*;

use super::owner::{first_come, hold_outstanding, refused_until_grant};
use super::*;

/// Hits an allowance holds beyond the expected demand.
const NEED_SLACK: u64 = 2;
/// The fewest hits of refill over two horizons that a contended key's credit shares (below, the
/// refill goes first come, first served).
const CREDIT_REFILL_MIN: u64 = 4;
/// How many sync intervals ahead contention is judged over.
const CONTENTION_INTERVALS: u64 = 4;
/// The shortest headroom lease: long enough that a key asked for about once a second per node
/// keeps its lease between checks (each lapse costs a forward).
pub(super) const LEASE_NANOS_MIN: u64 = 4_000_000_000;
/// A lease lasts at least this many sync intervals.
pub(super) const LEASE_INTERVALS_MIN: u64 = 8;
/// A key has headroom for leases while what it can supply over a lease is at least this many
/// times the demand of all its nodes over it.
pub(super) const HEADROOM_X: u64 = 4;

impl Node {
    /// What sizing an allowance for `holder` at `now` needs beyond the key's own state.
    pub(super) fn sizing_context(&self, holder: NodeId, now: Instant) -> SizingContext {
        let interval_nanos = duration_nanos(self.config.sync_interval);
        let rtt_nanos = if holder == self.id { 0 } else { self.peers.srtt_nanos(holder).unwrap_or(0) };
        SizingContext {
            now,
            half_life_nanos: self.half_life_nanos(),
            interval_nanos,
            horizon_nanos: interval_nanos.saturating_add(rtt_nanos),
            // The grant reaches a follower one way later: it expires that much earlier there.
            one_way_nanos: rtt_nanos / 2,
            release_nanos: self.release_nanos(),
            lease_nanos: self.lease_nanos(),
            active_nanos: 2 * interval_nanos + rtt_nanos.max(duration_nanos(self.config.peer_silence)),
            allowance_min: self.config.allowance_min.max(1),
        }
    }
}

/// Hits a node with `demand_per_s` needs to hold for `horizon_nanos` (until its next grant can
/// arrive), with headroom for bursts; nothing without demand.
pub(super) fn need_for(demand_per_s: u64, horizon_nanos: u64) -> u64 {
    if demand_per_s == 0 {
        return 0;
    }
    let expected = u128::from(demand_per_s) * u128::from(horizon_nanos) / 1_000_000_000;
    let expected = u64::try_from(expected).unwrap_or(u64::MAX);
    // A quarter above the expected demand, plus a little: enough to last until the next grant
    // most of the time. Holding more would strand capacity at nodes that do not need it now; a
    // node that runs dry asks the owner, which keeps what nobody holds.
    expected.saturating_add(expected / 4).saturating_add(NEED_SLACK)
}

/// What sizing allowances at one instant takes besides the key's own state.
#[derive(Clone, Copy, Debug)]
pub(super) struct SizingContext {
    pub(super) now: Instant,
    half_life_nanos: u64,
    interval_nanos: u64,
    /// Until the holder's next grant can reach it: an interval and a round trip.
    horizon_nanos: u64,
    one_way_nanos: u64,
    release_nanos: u64,
    /// How long a headroom lease lasts.
    lease_nanos: u64,
    /// A participant heard from within this long counts in the key's demand.
    active_nanos: u64,
    allowance_min: u64,
}

/// What a grant may give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Offer {
    /// Nothing: a partition's side without a share of the limit.
    Nothing,
    /// An allowance if the holder's share is worth one, no lease: the holder does not ask for
    /// hits (an exact-mode key's seed or fallback hits).
    Allowance,
    /// An allowance, or a headroom lease: the holder asks for hits (a forwarded check, a report
    /// of demand).
    AllowanceOrLease,
}

/// What a node should hold of a key: its target, and whether that is a headroom lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Target {
    hits: u64,
    lease: bool,
}

/// A key's pool and demand at one instant.
#[derive(Clone, Copy, Debug)]
struct Pool {
    /// What the bucket can admit now.
    available: u64,
    /// Available plus the allowances out: everything not admitted yet.
    unused: u64,
    /// Nanoseconds per hit of refill (0: none before the window's end).
    refill_nanos_per_hit: u64,
    /// The bucket's capacity.
    capacity: u64,
    /// Hits per second asked for by the owner and its active participants.
    demand_per_s: u64,
    /// Window algorithms: allowances die with the owner's current window, this far ahead.
    expires_in_nanos: Option<u64>,
    /// What the leaseholders hold or will hold.
    leased: u64,
}

impl SizingContext {
    /// Notes a check of `cost` forwarded by participant `p`: its demand is what it forwards,
    /// unless it reported a larger one lately (a holder forwards only what its allowance did not
    /// cover). Measured before this check: the estimate just after an arrival is biased up by it.
    pub(super) fn forwarded(&self, p: &mut Participant, cost: u64, refused_here: u64, now: Instant) {
        // A lease that ended is void at the holder too: what it held and what was in flight is
        // gone (it forwards because it holds nothing).
        if p.leased && p.released_at <= now {
            p.holding = 0;
            p.seen = p.sent;
            p.leased = false;
        }
        p.forwards.add(cost.max(1).saturating_add(refused_here), now, self.half_life_nanos);
        let rate = p.forwards.per_second_without(now, self.half_life_nanos, cost.max(1));
        let reported_lately = p.reported_at.add_nanos(self.active_nanos) > now;
        p.demand_per_s = if reported_lately { p.demand_per_s.max(rate) } else { rate };
    }

    /// Notes that participant `p` was heard from: what it holds stays counted for another
    /// release period (or until its window ends).
    pub(super) fn heard(&self, p: &mut Participant, bucket: &Bucket, limit: &Limit, now: Instant) {
        p.heard_at = now;
        let expires = bucket.window_end_nanos(limit, now).map_or(Instant::MAX, |left| now.add_nanos(left));
        p.released_at = now.add_nanos(self.release_nanos).min(expires);
    }

    fn pool(&self, bucket: &mut Bucket, limit: &Limit, meta: &mut KeyMeta) -> Pool {
        let now = self.now;
        let active = self.now.sub_nanos(self.active_nanos);
        meta.participants.retain(|p| p.released_at > now || p.heard_at > active);
        hold_outstanding(bucket, limit, meta, now);
        let outstanding = meta.outstanding(now);
        let available = bucket.peek(limit, 0, now).remaining;
        let own = meta.demand.per_second(now, self.half_life_nanos);
        // A leaseholder reports rarely: its demand counts for as long as its lease.
        let counted = |p: &&Participant| p.heard_at > active || (p.leased && p.released_at > now);
        let others = meta.participants.iter().filter(counted).map(|p| p.demand_per_s);
        let leased = meta.participants.iter().filter(|p| p.leased).map(|p| p.outstanding(now)).sum();
        Pool {
            available,
            unused: available.saturating_add(outstanding),
            refill_nanos_per_hit: bucket.refill_nanos_per_hit(limit),
            capacity: limit.capacity(),
            demand_per_s: others.fold(own, u64::saturating_add),
            expires_in_nanos: bucket.window_end_nanos(limit, now),
            leased,
        }
    }

    /// What the key can supply over `nanos`: everything not admitted yet and the refill meanwhile.
    fn supply(pool: &Pool, nanos: u64) -> u64 {
        let refill = nanos.checked_div(pool.refill_nanos_per_hit).unwrap_or(0);
        pool.unused.saturating_add(refill)
    }

    /// Whether demand will exhaust what the key can supply within a few intervals: demand above
    /// the refill rate that drains the stock (the bucket and the allowances out) within
    /// [`CONTENTION_INTERVALS`]. Judged over one interval, the stock of a key at twice its rate
    /// would always look sufficient for the next one, and the owner would take its own checks
    /// first come first served from what the holders' next grants need.
    fn contended(&self, pool: &Pool) -> bool {
        let span = self.interval_nanos.saturating_mul(CONTENTION_INTERVALS);
        let demand = u128::from(pool.demand_per_s) * u128::from(span) / 1_000_000_000;
        demand > u128::from(Self::supply(pool, span))
    }

    /// The allowance a holder with `demand_per_s` that holds `held` should hold: its demand's
    /// share of what the key can give it until its next grant can arrive (grants in flight count
    /// as held, so over a long round trip the share must cover it), capped by its need for as
    /// long; when that is below `allowance_min`, a headroom lease if `lease_ok` and the key has
    /// headroom ([`Self::lease_nanos_for`]), else zero (its checks are forwarded).
    ///
    /// What the key can give a holder is what the bucket holds, the refill meanwhile and what the
    /// holder itself holds — not what the others hold: a share of their allowances, which they
    /// are about to spend, would be taken again from the bucket, and at overload the holders that
    /// ask while the bucket has hits (the small ones, whose targets are quickly met) would get
    /// more than their demand's share of the refill.
    fn target(&self, pool: &Pool, demand_per_s: u64, held: u64, lease_ok: bool) -> Target {
        // All forward when the bucket cannot hold one interval's refill (a burst of one at a high
        // rate): grants, each at most what the bucket holds, could not keep up with the refill.
        let refill = self.interval_nanos.checked_div(pool.refill_nanos_per_hit).unwrap_or(0);
        if pool.capacity < refill {
            return Target::default();
        }
        // A node that would not use `allowance_min` hits before its next grant forwards, unless
        // it gets a lease.
        let expected = u128::from(demand_per_s) * u128::from(self.horizon_nanos) / 1_000_000_000;
        let regular = pool.demand_per_s > 0 && demand_per_s > 0 && expected >= u128::from(self.allowance_min);
        let (horizon_nanos, demand_per_s, pool_demand_per_s) = match regular {
            true => (self.horizon_nanos, demand_per_s, pool.demand_per_s),
            false => match self.lease_nanos_for(pool, demand_per_s).filter(|_| lease_ok) {
                // A node that asks has some demand, whatever the estimate says yet.
                Some(lease_nanos) => {
                    (lease_nanos, demand_per_s.max(1), pool.demand_per_s.max(demand_per_s).max(1))
                }
                None => return Target::default(),
            },
        };
        let refill_meanwhile = horizon_nanos.checked_div(pool.refill_nanos_per_hit).unwrap_or(0);
        let supply = pool.available.saturating_add(held).saturating_add(refill_meanwhile);
        let fair = u128::from(supply) * u128::from(demand_per_s) / u128::from(pool_demand_per_s);
        let mut hits = u64::try_from(fair).unwrap_or(u64::MAX).min(need_for(demand_per_s, horizon_nanos));
        if !regular {
            // All the leases of a key hold at most a quarter of its capacity (the rest stays in
            // the bucket for a burst anywhere), whatever their holders' demand estimates say
            // (a cold key's first forwards all look slow).
            let leased_by_others = pool.leased.saturating_sub(held);
            hits = hits.min((pool.capacity / HEADROOM_X).saturating_sub(leased_by_others));
        }
        match hits < self.allowance_min {
            true => Target::default(),
            false => Target { hits, lease: !regular },
        }
    }

    /// How long a headroom lease for a node with `demand_per_s` lasts, if the key has headroom:
    /// the demand of all its nodes over a lease fits [`HEADROOM_X`] times in the key's refill
    /// over it. The refill, not the stock: a lease nobody uses strands its hits until it ends,
    /// and only a refill that replaces them meanwhile keeps that from adding up (a daily quota,
    /// a window algorithm, a low limit: no lease; their slow nodes forward).
    fn lease_nanos_for(&self, pool: &Pool, demand_per_s: u64) -> Option<u64> {
        let lease_nanos = self.lease_nanos;
        let demand_per_s = pool.demand_per_s.max(demand_per_s).max(1);
        let demand = u128::from(demand_per_s) * u128::from(lease_nanos) / 1_000_000_000;
        let refill = lease_nanos.checked_div(pool.refill_nanos_per_hit).unwrap_or(0);
        let headroom = demand.saturating_add(1) * u128::from(HEADROOM_X) <= u128::from(refill);
        // A key refilling only a few hits an interval is decided by its owner: at such a rate a
        // hit held anywhere else is a share of the limit the others feel (10/s: 0.5 a hit an
        // interval).
        let interval_refill = self.interval_nanos.checked_div(pool.refill_nanos_per_hit).unwrap_or(0);
        (headroom && interval_refill >= HEADROOM_X).then_some(lease_nanos)
    }

    /// The rate a node with `demand_per_s` gets of the key's refill while the key is contended
    /// and its stock is down to what a couple of horizons refill; `None` otherwise (then checks
    /// on the bucket go first come, first served, and grants as their targets say). Window
    /// algorithms (no refill before their window ends) and keys refilling fewer than
    /// [`CREDIT_REFILL_MIN`] hits per two horizons are never metered.
    fn credit_rate(&self, pool: &Pool, demand_per_s: u64, allowance: bool) -> Option<keys::CreditRate> {
        // The stock (a burst) goes first come, first served, as one limiter would give it. A key
        // that refills only a few hits in that span has no flow worth sharing (a daily quota, a
        // 10/s key): credit in whole hits would refuse more than it shares.
        let metering_nanos = 2 * self.horizon_nanos;
        let refill = metering_nanos
            .checked_div(pool.refill_nanos_per_hit)
            .filter(|&hits| hits >= CREDIT_REFILL_MIN)?;
        // Never while the bucket is more than a quarter full: hits a node's credit refuses stay in the
        // bucket, and a full bucket would lose the refill (nobody else may take it meanwhile). But
        // an allowance from a bucket that holds no more than two such spans of refill is metered
        // whatever it holds: what it holds is the refill since the last grant, which the first
        // grant sized after it would take whole — and the owner's tick and a holder's report come
        // in the same order every interval, so one of them would take every interval's refill.
        // (Checks decided on the bucket are not: first come, first served is fair among them, and
        // a refusal with hits in the bucket would lose refill.)
        let stock_max = match allowance && pool.capacity <= 2 * refill {
            true => pool.capacity,
            false => refill.saturating_add(1).min(pool.capacity / 4),
        };
        if pool.available > stock_max || !self.contended(pool) {
            return None;
        }
        let demand = demand_per_s.max(1);
        let mut rate = keys::CreditRate {
            refill_nanos_per_hit: pool.refill_nanos_per_hit,
            demand,
            total: pool.demand_per_s.max(demand),
            cap_hits: 0,
        };
        // Enough to cover a grant's pipeline (a round trip and an interval) and arrivals bunched
        // within it, no more: credit one node does not use is refill another could have had.
        rate.cap_hits = rate.micro_per_nanos(metering_nanos) / 1_000_000 + 1;
        Some(rate)
    }

    /// Decides a check of `cost` on the bucket for `node` (a forwarder; `None`: the owner itself):
    /// first come, first served, except while [`credit_rate`](Self::credit_rate) meters the key,
    /// when the node's checks pass only within its credit — its demand's share of the refill
    /// ([`keys::Credit`]).
    pub(super) fn metered(
        &self,
        bucket: &mut Bucket,
        limit: &Limit,
        meta: &mut KeyMeta,
        node: Option<NodeId>,
        cost: u64,
        rng: &mut CoreRng,
    ) -> Decision {
        let now = self.now;
        let pool = self.pool(bucket, limit, meta);
        let demand = match node {
            None => meta.demand.per_second(now, self.half_life_nanos),
            Some(node) => meta.participants.iter().find(|p| p.node == node).map_or(0, |p| p.demand_per_s),
        };
        let rate = match self.credit_rate(&pool, demand, false) {
            Some(rate) if cost > 0 => rate,
            _ => return first_come(bucket, limit, meta, cost, now, rng),
        };
        let Some(credit) = meta.credit(node) else { return first_come(bucket, limit, meta, cost, now, rng) };
        if let Err(wait_nanos) = credit.take(cost, rate, now) {
            return refused_until_grant(bucket, limit, cost, now, wait_nanos);
        }
        let decision = first_come(bucket, limit, meta, cost, now, rng);
        if !decision.allowed {
            meta.credit(node).into_iter().for_each(|credit| credit.give_back(cost));
        }
        decision
    }

    /// Sizes and debits `holder`'s next grant (its participant entry is current) and answers it,
    /// within what `offer` allows.
    pub(super) fn grant(
        &self,
        key: KeyHash,
        bucket: &mut Bucket,
        limit: &Limit,
        meta: &mut KeyMeta,
        holder: NodeId,
        offer: Offer,
    ) -> Option<Grant> {
        let now = self.now;
        // An expiring counter's window starts at its first hit: none is granted ahead of it.
        let offer = if bucket.opens_window_on_debit(limit, now) { Offer::Nothing } else { offer };
        let pool = self.pool(bucket, limit, meta);
        let contended = self.contended(&pool);
        let p = meta.participants.iter_mut().find(|p| p.node == holder)?;
        let target = match offer {
            Offer::Nothing => Target::default(),
            Offer::Allowance => self.target(&pool, p.demand_per_s, p.outstanding(now), false),
            Offer::AllowanceOrLease => self.target(&pool, p.demand_per_s, p.outstanding(now), true),
        };
        let mut grant = target.hits.saturating_sub(p.outstanding(now)).min(pool.available);
        if let Some(rate) = self.credit_rate(&pool, p.demand_per_s, true) {
            grant = p.credit.take_up_to(grant, rate, now);
        }
        // Admissions within allowances never exceed the limit: a grant is debited from what the
        // bucket holds, which is at most its capacity.
        debug_assert!(grant <= pool.available && grant <= pool.capacity, "a grant of {grant} from {pool:?}");
        p.sent = p.sent.saturating_add(grant);
        p.leased = target.lease;
        let mut expires_in_nanos = pool.expires_in_nanos;
        if target.lease {
            // Everything it holds is void at the lease's end, here and there.
            // (Only refilling algorithms get leases: no window ends within one.)
            expires_in_nanos = Some(expires_in_nanos.unwrap_or(u64::MAX).min(self.lease_nanos));
            p.released_at = now.add_nanos(self.lease_nanos);
        }
        let epoch = p.epoch;
        bucket.force(limit, grant, now);
        Some(Grant {
            key: key.0,
            epoch,
            state: bucket.export(now).into(),
            grant,
            hold_max: target.hits,
            contended: contended && target.hits > 0 && !target.lease,
            expires_in_nanos: expires_in_nanos.map(|left| left.saturating_sub(self.one_way_nanos)),
            lease: target.lease,
        })
    }

    /// Renews the owner's own allowance; whether the key needs another look at the next tick:
    /// while the owner holds an allowance or its share of a contended key is worth one. An
    /// uncontended key the owner holds nothing of is done with (it decides first come on the
    /// bucket): its next own check puts it back, so that a sync round does no work for keys
    /// nobody shares (on a single node, every key).
    pub(super) fn refresh_own(&self, bucket: &mut Bucket, limit: &Limit, meta: &mut KeyMeta) -> bool {
        let now = self.now;
        let pool = self.pool(bucket, limit, meta);
        let own_demand = meta.demand.per_second(now, self.half_life_nanos);
        let held = meta.own.live(now);
        let opens_window = bucket.opens_window_on_debit(limit, now);
        // The owner decides on the bucket itself: a lease would only take hits out of it.
        let target = match self.contended(&pool) && !opens_window {
            true => self.target(&pool, own_demand, held, false).hits,
            false => 0,
        };
        let expires = pool.expires_in_nanos.map_or(Instant::MAX, |left| now.add_nanos(left));
        meta.own_contended_until = if target > 0 { expires } else { Instant::ZERO };
        if held > target {
            bucket.refund(limit, held - target, now);
            meta.own.hits = target;
        } else {
            let mut grant = (target - held).min(pool.available);
            if let Some(rate) = self.credit_rate(&pool, own_demand, true) {
                grant = meta.own_credit.take_up_to(grant, rate, now);
            }
            debug_assert!(grant <= pool.available, "the owner's own grant of {grant} from {pool:?}");
            bucket.force(limit, grant, now);
            meta.own.add(grant, expires, now);
        }
        debug_assert!(
            meta.own.live(now) <= target,
            "the owner holds at most its target of its own allowance"
        );
        meta.own_contended_until > now || meta.own.live(now) > 0
    }
}

/// The participant entry of `node` for `epoch`; a new epoch starts the accounting afresh (the
/// follower lost its state, or follows this owner anew).
pub(super) fn participant(
    participants: &mut Vec<Participant>,
    node: NodeId,
    epoch: u64,
    now: Instant,
) -> &mut Participant {
    let fresh = Participant {
        node,
        epoch,
        sent: 0,
        seen: 0,
        holding: 0,
        demand_per_s: 0,
        report_order: 0,
        forwards: keys::DemandMeter::default(),
        reported_at: Instant::ZERO,
        heard_at: now,
        released_at: now,
        credit: keys::Credit::default(),
        leased: false,
    };
    let index = match participants.iter().position(|p| p.node == node) {
        Some(index) => index,
        None => {
            participants.push(fresh);
            participants.len() - 1
        }
    };
    let participant = &mut participants[index];
    if participant.epoch != epoch {
        *participant = fresh;
    }
    participant
}

/// The participant entry of `node` for its forwarded checks: the entry it has (whatever its
/// epoch), or a new one in epoch 0 (a forwarder that never reported).
pub(super) fn forwarder(participants: &mut Vec<Participant>, node: NodeId, now: Instant) -> &mut Participant {
    let epoch = participants.iter().find(|p| p.node == node).map_or(0, |p| p.epoch);
    participant(participants, node, epoch, now)
}
