//! Regions: one global limit per key across regions, every decision taken inside its region.
//!
//! A node's view names each member's region ([`MemberView::regions`]). Inside a region nothing
//! changes: the region's live members form the node's ring, keys have owners there, and the
//! owner grants allowances and leases to the region's other nodes as in a one-region cluster.
//! Between regions, each key has a *home region* (rendezvous hashing of the key over the view's
//! regions) and a *home owner* (the key's owner in the home region). Every region's owner of the
//! key enforces a *part* of the key's limit (hits of its rate; the burst in proportion) that it
//! leases from the home owner:
//!
//! - **Reports.** Every region sync interval, a region's owner reports each key it decided since
//!   the last one, when it has news: no live lease, a lease ending within two intervals, its
//!   region's demand moved by a quarter, or a lease applied that the home has not seen
//!   acknowledged. A key with no lease yet is reported at once. A steady key costs about one
//!   report and one grant per region per lease; an idle one nothing.
//! - **Leases.** The home owner keeps a ledger per key: per region, its demand, the part granted
//!   and the part before a decrease until the region acknowledges it. On each report it computes
//!   every region's *desired* part — a floor plus the rest in proportion to demand — and grants
//!   the reporter `min(desired, limit − what every other region may still be using)`. A region
//!   above its desired part is sent the decrease at once (a push), and one below it the increase
//!   once the capacity is free. So the parts that may be in use never sum above the limit.
//! - **Expiry.** A region's owner counts its lease from the report it last sent (earlier than
//!   the home's grant), so it ends no later than the home's view of it. When it ends without a
//!   renewal (the home is unreachable), the part falls to [`RegionFallback`]: the floor (every
//!   region's floor is always reserved by the home), the last part (the home keeps a silent
//!   region's last grant reserved), or nothing.
//!
//! Exact mode is exact per region within its part: checks never leave their region.

use crate::prelude::*;
use alloc::sync::Arc;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::api::{MemberView, NodeId, Policy, PolicyRegion, RegionFallback, RegionId};
use super::ring::Ring;
use super::*;
use crate::algorithm::Keep;
use crate::limit::{Algorithm, LimitSpec};
use crate::wire::{RegionGrant, RegionReport};

/// The floors of all regions together: 3 % of the limit, split evenly (at least a hit each when
/// the limit has that many). A region admits its floor before its first lease, and with
/// `RegionFallback::Floor` when its lease ended without a renewal.
const FLOOR_PERMILLE: u64 = 30;

/// A region's reported demand must move by this fraction (1/4) to be reported before its lease
/// nears its end.
const DEMAND_CHANGE_DIVISOR: u64 = 4;

/// How many reports' send times a region's owner keeps (`RegionLease::sent_at`).
pub(crate) const REPORTS_KEPT: usize = 4;

/// A decrease of a region's part by at most this fraction (1/32) of the limit is not made:
/// demand estimates are noisy, and a part that follows the noise down refuses the next burst.
const STICKY_DIVISOR: u64 = 32;

/// How long a home owner keeps a silent region's last part reserved beyond its lease
/// (`RegionFallback::Last`): the failure detector's default time to forget a dead member
/// (`dead_member_forget`, 60 s), after which the region has left the view anyway.
const RESERVATION_KEEP_NANOS: u64 = 60_000_000_000;

/// The half-life at which a region's smoothed demand falls (it rises at once): short enough
/// that demand leaving a region is followed within a second, long enough that a part does not
/// follow the noise of a Poisson arrival stream down (the nodes' estimates have a 100 ms
/// half-life: ±16 % at 300/s).
const REGION_DEMAND_HALF_LIFE_NANOS: u64 = 200_000_000;

/// The regions of a view and a ring of each one's live members.
#[derive(Clone, Debug, Default)]
pub(super) struct Regions {
    /// Every region of the view (of live and dead members), sorted.
    ids: Vec<RegionId>,
    /// The ring of each region's live members, in `ids` order.
    rings: Vec<Ring>,
    /// Every member's region, sorted by member.
    of: Vec<(NodeId, RegionId)>,
}

impl Regions {
    /// The regions of `view`, in which node `me` is in region `mine` (a node's own region is its
    /// configuration's, whatever a view says, and it is in its own view while it leaves).
    pub fn new(view: &MemberView, me: (NodeId, RegionId), vnodes: u32) -> Regions {
        let named =
            |m: NodeId| view.regions.iter().find(|(n, _)| *n == m).map_or(RegionId::NONE, |(_, r)| *r);
        let mut of: Vec<(NodeId, RegionId)> = core::iter::once(me)
            .chain(view.live.iter().chain(&view.dead).filter(|&&m| m != me.0).map(|&m| (m, named(m))))
            .collect();
        of.sort_unstable();
        of.dedup_by_key(|(m, _)| *m);
        let mut ids: Vec<RegionId> = of.iter().map(|(_, r)| *r).collect();
        ids.sort_unstable();
        ids.dedup();
        let rings = ids
            .iter()
            .map(|&region| {
                let members: Vec<NodeId> =
                    view.live.iter().copied().filter(|&m| Self::find(&of, m) == region).collect();
                Ring::new(&members, vnodes)
            })
            .collect();
        Regions { ids, rings, of }
    }

    /// The region of `member` in `of` (sorted by member).
    fn find(of: &[(NodeId, RegionId)], member: NodeId) -> RegionId {
        of.binary_search_by_key(&member, |(m, _)| *m).map_or(RegionId::NONE, |at| of[at].1)
    }

    /// Whether the view spans several regions (else the protocol is a one-region cluster's).
    pub fn active(&self) -> bool {
        self.ids.len() > 1
    }

    /// How many regions the view names.
    pub fn count(&self) -> usize {
        self.ids.len().max(1)
    }

    /// The region of `member` ([`RegionId::NONE`] when the view does not name one).
    pub fn region_of(&self, member: NodeId) -> RegionId {
        Self::find(&self.of, member)
    }

    /// The members of `region` among `members`.
    pub fn filter(&self, region: RegionId, members: &[NodeId]) -> Vec<NodeId> {
        members.iter().copied().filter(|&m| self.region_of(m) == region).collect()
    }

    /// The key's home region and its owner there (none while the region has no live member):
    /// the region its policy pins (`pinned`) when the view has it, else rendezvous hashing of
    /// the key over the view's regions (a region leaving moves only its own keys).
    pub fn home(&self, key: KeyHash, pinned: Option<RegionId>) -> (RegionId, Option<NodeId>) {
        if let Some(at) = pinned.and_then(|region| self.ids.binary_search(&region).ok()) {
            return (self.ids[at], self.rings[at].owner(key));
        }
        let bytes = key.0.to_le_bytes();
        let score = |at: usize| xxh3_64_with_seed(&bytes, self.ids[at].0);
        let Some(at) = (0..self.ids.len()).max_by_key(|&at| (score(at), self.ids[at])) else {
            return (RegionId::NONE, None);
        };
        (self.ids[at], self.rings[at].owner(key))
    }

    /// The owner of `key` in `region` (none while the region has no live member, or is not in
    /// the view).
    pub fn owner_in(&self, region: RegionId, key: KeyHash) -> Option<NodeId> {
        let at = self.ids.binary_search(&region).ok()?;
        self.rings[at].owner(key)
    }

    /// A region's floor of a limit of `value` hits: its part of 3 % of the limit, and at least
    /// one hit where every region can have one (a key a region checks once in a while must not
    /// be refused for want of a part below one hit).
    pub fn floor(&self, value: u64) -> u64 {
        let regions = self.count() as u64;
        let floor = value.saturating_mul(FLOOR_PERMILLE) / 1000 / regions;
        floor.max(u64::from(value >= regions))
    }
}

/// A region owner's lease on a part of one key's limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RegionLease {
    /// Hits of the limit's rate leased (and the burst in proportion).
    pub part: u64,
    /// When the lease ends: the last report's time plus the lease.
    pub until: Instant,
    /// The home's number of the last grant applied (0: none yet).
    pub seq: u64,
    /// The home owner that granted it (numbers are that home's: a new home starts its own).
    pub home: Option<NodeId>,
    /// The number of the grant the last report acknowledged (a grant applied since is news).
    pub seq_reported: u64,
    /// When the last report was sent.
    pub reported_at: Instant,
    /// When each of the last [`REPORTS_KEPT`] reports was sent, by number modulo that: a grant
    /// answering any of them counts its lease from it (round trips longer than a round leave
    /// a report or two in flight).
    pub sent_at: [Instant; REPORTS_KEPT],
    /// The number of the last report sent (grants echo it: a lease counts from that report).
    pub report_count: u64,
    /// The demand the last report said.
    pub demand_reported: u64,
    /// The region's demand, smoothed over region rounds (milli-hits per second).
    pub demand_milli: u64,
    /// When `demand_milli` was last updated.
    pub demand_at: Instant,
    /// The part the owner's bucket counts in (0: not known yet); see [`Node::region_rescale`].
    pub bucket_part: u64,
    /// Whether `bucket_part` was the floor before the first lease.
    pub bucket_before_lease: bool,
    /// The lease applied last was the key's first anywhere (`RegionGrant::first`).
    pub first: bool,
}

impl RegionLease {
    /// The part enforced at `now`: the lease's while it lasts, else `fallback`'s (the floor
    /// before any lease).
    fn part_at(&self, now: Instant, floor: u64, fallback: RegionFallback) -> u64 {
        match (self.seq, fallback) {
            (0, _) => floor,
            _ if now < self.until => self.part,
            (_, RegionFallback::Floor) => floor,
            (_, RegionFallback::Last) => self.part,
            (_, RegionFallback::Closed) => 0,
        }
    }

    /// Whether the home should hear from this region now: no lease yet, a lease near its end,
    /// demand moved by a quarter, a grant applied since the last report (the home frees a
    /// decrease on hearing it, and answers only when the part changes or the lease nears its
    /// end: no ping-pong), or a new home owner (which rebuilds its ledger from the reports).
    fn news(&self, demand_per_s: u64, home: Option<NodeId>, now: Instant, renew_nanos: u64) -> bool {
        let moved =
            demand_per_s.abs_diff(self.demand_reported) > self.demand_reported / DEMAND_CHANGE_DIVISOR + 1;
        let applied = self.seq != self.seq_reported;
        let rehomed = self.seq > 0 && self.home != home;
        self.seq == 0 || applied || rehomed || self.until <= now.add_nanos(renew_nanos) || moved
    }
}

/// The home owner's ledger of one key: every region's lease.
#[derive(Clone, Debug, Default)]
pub(crate) struct HomeLedger {
    regions: Vec<RegionEntry>,
    /// The number of the last grant.
    seq: u64,
    /// Until then the key is new (see [`HomeLedger::apply`]).
    new_until: Instant,
    /// Until then (or until every region reported) the ledger is being rebuilt by a new home
    /// owner (see [`HomeLedger::apply`]).
    rebuilt_until: Instant,
    /// The terms of the last report applied: what [`HomeLedger::until`] keeps reserved.
    fallback: RegionFallback,
    floor: u64,
    /// The limit's rate the ledger splits (a report of another is of a changed policy).
    pub value: u64,
}

/// A grant the home owner sends (or applies itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct HomeGrant {
    /// The region's owner of the key that reported last.
    pub to: NodeId,
    /// The part of the limit's rate.
    pub part: u64,
    /// The grant's number.
    pub seq: u64,
    /// The number of the report it answers (a push: the last one heard).
    pub report_count: u64,
}

/// One region in a home owner's ledger.
#[derive(Clone, Copy, Debug)]
struct RegionEntry {
    region: RegionId,
    /// The member that last reported for the region (its owner of the key): where pushes go.
    reporter: NodeId,
    /// The number of the reporter's last report (grants echo it).
    report_count: u64,
    /// The region's demand, as last reported.
    demand_per_s: u64,
    /// The part granted last.
    granted: u64,
    /// The number of the last grant.
    seq: u64,
    /// When the lease of the last grant ends at the latest.
    until: Instant,
    /// A decrease not acknowledged yet: the part before it.
    prior: u64,
}

/// What a region may be using of a key's limit, seen from its home.
#[derive(Clone, Copy, Debug)]
struct Ledgered {
    floor: u64,
    fallback: RegionFallback,
    now: Instant,
}

impl Ledgered {
    /// What the region may be using: its larger of the granted and unacknowledged parts while
    /// its lease lasts, then what its fallback leaves it.
    fn committed(&self, entry: &RegionEntry) -> u64 {
        if self.now < entry.until {
            return entry.granted.max(entry.prior);
        }
        match self.fallback {
            // A region that forgot the key (or whose owner changed) starts again at its floor.
            RegionFallback::Floor | RegionFallback::Closed => self.floor,
            RegionFallback::Last => entry.granted.max(entry.prior).max(self.floor),
        }
    }
}

/// A report as the home applies it (`RegionReport`'s fields, with the sender and its region).
#[derive(Clone, Copy, Debug)]
pub(super) struct HomeReport {
    /// The sender's region.
    pub region: RegionId,
    /// The sender: the region's owner of the key.
    pub from: NodeId,
    /// The region's demand.
    pub demand_per_s: u64,
    /// The number of the report.
    pub report_count: u64,
    /// The number of the last grant the region applied.
    pub applied_seq: u64,
    /// The part it enforces.
    pub applied_part: u64,
}

/// How the home sizes leases.
#[derive(Clone, Copy, Debug)]
pub(super) struct HomeTerms {
    /// The limit's rate (hits per period).
    pub value: u64,
    /// Every region's floor.
    pub floor: u64,
    /// Every region's even share of the limit (the limit over the view's regions).
    pub even: u64,
    /// What a lapsed lease falls to.
    pub fallback: RegionFallback,
    /// The lease as the home counts it (the lease and a region sync interval of slack).
    pub lease_nanos: u64,
    /// How long a key stays new after its first report (two region sync intervals: every
    /// region's second report, with a demand estimate worth the name, arrives by then).
    pub new_nanos: u64,
    /// The home owner's time.
    pub now: Instant,
}

impl HomeLedger {
    /// Applies a report and returns the grants to send: the reporter's first, then pushes to
    /// other regions (`(to, grant part, number, echoed report)`); and whether the reporter's
    /// grant is its region's first of a new key (`RegionGrant::first`).
    ///
    /// A key is new for two region intervals after its ledger began with a report of no lease
    /// applied. Then a region's first grant says so and is its even share, and the region's
    /// bucket holds its even share of the new key's burst (`Node::region_rescale`): the even
    /// shares sum to the burst, so the regions share a new key's burst once. A ledger that began
    /// with a report of a lease applied was another home owner's: until every region of the
    /// view has reported (or a lease has passed), no region's part grows, since a region not
    /// heard from yet may hold anything up to what the others do not.
    pub(super) fn apply(
        &mut self,
        report: HomeReport,
        regions: &[RegionId],
        terms: HomeTerms,
    ) -> (Vec<HomeGrant>, bool) {
        if self.seq == 0 && self.regions.is_empty() {
            let rebuilt = report.applied_seq > 0;
            self.new_until = if rebuilt { Instant::ZERO } else { terms.now.add_nanos(terms.new_nanos) };
            self.rebuilt_until = if rebuilt { terms.now.add_nanos(terms.lease_nanos) } else { Instant::ZERO };
        }
        (self.fallback, self.floor) = (terms.fallback, terms.floor);
        // Regions gone from the view are forgotten (their members left: they admit nothing).
        self.regions.retain(|e| regions.contains(&e.region));
        let known = self.regions.iter().any(|e| e.region == report.region);
        let first = terms.now < self.new_until && report.applied_seq == 0 && !known;
        let lease_left = match self.regions.iter().find(|e| e.region == report.region) {
            Some(e) => e.until.nanos_since(terms.now),
            None => 0,
        };
        let at = self.entry(report, terms);
        // A region without demand (idle, or the key is not decided there any more) only
        // acknowledges: it gets no grant back, which it would acknowledge again. A region's
        // first report asks, whatever its estimate says: a check made it.
        let asks = report.demand_per_s > 0 || report.applied_seq == 0;
        let ledgered = Ledgered { floor: terms.floor, fallback: terms.fallback, now: terms.now };
        let desired = self.desired(regions, terms, ledgered);
        let mut grants = self.push_decreases(at, &desired, terms);
        let silent = regions.iter().any(|r| !self.regions.iter().any(|e| e.region == *r));
        let frozen = silent && terms.now < self.rebuilt_until;
        if asks {
            let free = terms.value.saturating_sub(self.committed_except(Some(at), regions, terms, ledgered));
            let part = self.reporter_part(at, desired[at], first, frozen, free, terms);
            // Nothing to say (after the key's first moments): the same part, and half a lease
            // or more left. Else the region would acknowledge it, and so on every round.
            let same = part == self.regions[at].granted && report.applied_seq == self.regions[at].seq;
            let quiet = same && terms.now >= self.new_until && lease_left > terms.lease_nanos / 2;
            if !quiet {
                grants.insert(0, self.grant(at, part, terms));
            }
        }
        if !frozen {
            self.push_increases(at, &desired, regions, terms, ledgered, &mut grants);
        }
        (grants, first && asks)
    }

    /// The reporter's entry (made for a region new to the ledger, which holds what it says it
    /// applied — another home owner's lease — at least its floor), updated by the report.
    fn entry(&mut self, report: HomeReport, terms: HomeTerms) -> usize {
        let at = match self.regions.iter().position(|e| e.region == report.region) {
            Some(at) => at,
            None => {
                self.regions.push(RegionEntry {
                    region: report.region,
                    reporter: report.from,
                    report_count: 0,
                    demand_per_s: 0,
                    granted: report.applied_part,
                    seq: 0,
                    until: terms.now.add_nanos(terms.lease_nanos),
                    prior: 0,
                });
                self.regions.len() - 1
            }
        };
        let entry = &mut self.regions[at];
        entry.reporter = report.from;
        entry.report_count = report.report_count;
        entry.demand_per_s = report.demand_per_s;
        // The region has seen the latest grant (numbers above this ledger's are another home
        // owner's): it uses what it says — less than granted when its lease fell to the floor,
        // or nothing when the key left its owner.
        if report.applied_seq >= entry.seq && report.applied_seq <= self.seq {
            entry.prior = 0;
            entry.granted = report.applied_part;
        }
        // The reporter's lease is live from now on: it takes part in the split.
        entry.until = entry.until.max(terms.now.add_nanos(1));
        at
    }

    /// Pushes decreases to the regions above their desired part (not the reporter), so that the
    /// reporter's grant can use what they free once they acknowledge; also to a region whose
    /// lease lapsed when it keeps its last part (it is idle, or cut off: its acknowledgement
    /// tells which). Not while the key is new: the others' demand is known only from their first
    /// checks, which says little.
    fn push_decreases(&mut self, at: usize, desired: &[u64], terms: HomeTerms) -> Vec<HomeGrant> {
        let keeps_last = terms.fallback == RegionFallback::Last;
        let sticky = terms.value / STICKY_DIVISOR;
        let mut grants = Vec::new();
        for (i, &want) in desired.iter().enumerate() {
            let e = &self.regions[i];
            let push = i != at
                && terms.now >= self.new_until
                && (terms.now < e.until || keeps_last)
                && want < e.granted
                && e.granted - want > sticky;
            if push {
                grants.push(self.grant(i, want, terms));
            }
        }
        grants
    }

    /// The reporter's new part: its desired part (kept when it would fall by no more than the
    /// sticky fraction), within what the others may be using. A region's first grant of a new
    /// key is its even share, and no region gets more while the key is new: the demand
    /// estimate of a key's first checks says little, and every other region may be about to ask.
    /// While the ledger is rebuilt, the reporter keeps at most what it has.
    fn reporter_part(
        &self,
        at: usize,
        desired: u64,
        first: bool,
        frozen: bool,
        free: u64,
        terms: HomeTerms,
    ) -> u64 {
        let granted = self.regions[at].granted;
        let want = match desired < granted && granted - desired <= terms.value / STICKY_DIVISOR {
            true => granted,
            false => desired,
        };
        let even = terms.even;
        match (first, terms.now < self.new_until) {
            _ if frozen => want.min(free).min(granted),
            (true, _) => even.min(free),
            (false, true) => want.min(free).min(even),
            (false, false) => want.min(free),
        }
    }

    /// What every region but `except` may be using, with the floor of every region of the view
    /// not in the ledger.
    fn committed_except(
        &self,
        except: Option<usize>,
        regions: &[RegionId],
        terms: HomeTerms,
        ledgered: Ledgered,
    ) -> u64 {
        let known = (0..self.regions.len()).filter(|&i| Some(i) != except);
        let known = known.fold(0u64, |sum, i| sum.saturating_add(ledgered.committed(&self.regions[i])));
        let unknown = regions.iter().filter(|r| !self.regions.iter().any(|e| e.region == **r)).count() as u64;
        known.saturating_add(unknown.saturating_mul(terms.floor))
    }

    /// Pushes increases to the regions below their desired part, from what is free now (not
    /// while the key is new).
    fn push_increases(
        &mut self,
        at: usize,
        desired: &[u64],
        regions: &[RegionId],
        terms: HomeTerms,
        ledgered: Ledgered,
        grants: &mut Vec<HomeGrant>,
    ) {
        let mut used = self.committed_except(None, regions, terms, ledgered);
        for (i, &want) in desired.iter().enumerate() {
            let e = self.regions[i];
            let new = terms.now < self.new_until;
            if i == at || new || terms.now >= e.until || want <= e.granted || used >= terms.value {
                continue;
            }
            let more = (want - e.granted).min(terms.value - used);
            if more > terms.value / STICKY_DIVISOR {
                used = used.saturating_add(more);
                grants.push(self.grant(i, e.granted + more, terms));
            }
        }
    }

    /// Records a grant of `part` to region `i`.
    fn grant(&mut self, i: usize, part: u64, terms: HomeTerms) -> HomeGrant {
        self.seq = self.seq.saturating_add(1);
        let e = &mut self.regions[i];
        if part < e.granted {
            e.prior = e.prior.max(e.granted);
        }
        e.granted = part;
        e.seq = self.seq;
        e.until = terms.now.add_nanos(terms.lease_nanos);
        HomeGrant { to: e.reporter, part, seq: self.seq, report_count: e.report_count }
    }

    /// Every known region's desired part. A region whose lease lapsed is idle or cut off: it is
    /// asked down to its floor (nothing with `Closed`), while the home still counts what it may
    /// be using until it acknowledges; every other region gets its floor and the rest of the
    /// limit in proportion to its demand (by largest remainders, so that the parts sum to the
    /// limit). Regions of the view that never reported keep their floor.
    fn desired(&self, regions: &[RegionId], terms: HomeTerms, ledgered: Ledgered) -> Vec<u64> {
        let live = |e: &RegionEntry| terms.now < e.until;
        let lapsed = self.regions.iter().filter(|e| !live(e)).map(|e| ledgered.committed(e));
        let lapsed = lapsed.fold(0u64, u64::saturating_add);
        let floored = regions.len().saturating_sub(self.regions.iter().filter(|e| !live(e)).count());
        let rest =
            terms.value.saturating_sub(lapsed).saturating_sub(terms.floor.saturating_mul(floored as u64));
        let total: u128 = self.regions.iter().filter(|e| live(e)).map(|e| u128::from(e.demand_per_s)).sum();
        let idle = match terms.fallback {
            RegionFallback::Closed => 0,
            RegionFallback::Floor | RegionFallback::Last => terms.floor,
        };
        let exact: Vec<(u64, u128)> = self
            .regions
            .iter()
            .map(|e| match (live(e), total) {
                (false, _) | (true, 0) => (0, 0),
                (true, _) => {
                    let scaled = u128::from(rest) * u128::from(e.demand_per_s);
                    (u64::try_from(scaled / total).unwrap_or(rest), scaled % total)
                }
            })
            .collect();
        let mut parts: Vec<u64> = self
            .regions
            .iter()
            .zip(&exact)
            .map(|(e, (p, _))| if live(e) { terms.floor.saturating_add(*p) } else { idle })
            .collect();
        if total == 0 {
            return parts;
        }
        let given = exact.iter().fold(0u64, |sum, (p, _)| sum.saturating_add(*p));
        let mut order: Vec<usize> = (0..exact.len()).filter(|&i| live(&self.regions[i])).collect();
        order.sort_by(|&a, &b| exact[b].1.cmp(&exact[a].1).then(a.cmp(&b)));
        for &i in order.iter().take(usize::try_from(rest.saturating_sub(given)).unwrap_or(0)) {
            parts[i] += 1;
        }
        parts
    }

    /// Until when the ledger must be kept: the end of its last lease, or, while it keeps a
    /// silent region's last part reserved (`RegionFallback::Last`), [`RESERVATION_KEEP_NANOS`]
    /// after that: a ledger forgotten and made again would count that region at its floor.
    pub(super) fn until(&self) -> Instant {
        let last = self.regions.iter().map(|e| e.until).max().unwrap_or(Instant::ZERO);
        let floor = self.floor;
        let reserves = self.fallback == RegionFallback::Last
            && self.regions.iter().any(|e| e.granted.max(e.prior) > floor);
        if reserves { last.add_nanos(RESERVATION_KEEP_NANOS) } else { last }
    }
}

/// `limit` with `part` hits of its rate (its burst and delay in proportion), or `None` for
/// nothing.
pub(super) fn scale(limit: &Limit, part: u64) -> Option<Limit> {
    let spec = limit.spec();
    if part >= spec.limit {
        return Some(limit.clone());
    }
    if part == 0 {
        return None;
    }
    let of = |value: u64| {
        u64::try_from(u128::from(value) * u128::from(part) / u128::from(spec.limit)).unwrap_or(value)
    };
    let burst = match spec.algorithm {
        Algorithm::TokenBucket => Some(of(spec.burst.unwrap_or(spec.limit)).max(1)),
        Algorithm::Gcra => Some(of(spec.burst.unwrap_or(1)).max(1)),
        Algorithm::LeakyBucketShaper => Some(of(spec.burst.unwrap_or(0))),
        _ => spec.burst,
    };
    let delay = spec.delay.map(|d| of(d).min(burst.unwrap_or(0)));
    let scaled = LimitSpec {
        algorithm: spec.algorithm,
        limit: part,
        period: spec.period,
        burst,
        delay,
        calendar: spec.calendar,
    };
    Limit::new(scaled).ok()
}

impl Node {
    /// The part of `policy`'s limit this region enforces for `key` at `now`, or `None` when the
    /// cluster is one region (the whole limit).
    pub(super) fn region_part(&self, key: KeyHash, policy: &Policy, now: Instant) -> Option<u64> {
        if !self.regions.active() {
            return None;
        }
        let floor = self.regions.floor(policy.limit.spec().limit);
        let lease = self.keys.extra(key).and_then(|meta| meta.region.as_deref().copied()).unwrap_or_default();
        Some(lease.part_at(now, floor, self.region_fallback(policy.region)))
    }

    /// What a part under `region`'s terms falls to when a lease lapses: the policy's own
    /// choice, else this node's.
    fn region_fallback(&self, region: PolicyRegion) -> RegionFallback {
        region.fallback.unwrap_or(self.config.region_fallback)
    }

    /// Before a decision on `key` under `part` of its limit: the bucket is re-expressed in that
    /// part if it counted in another (a lease changed it, or ended). It keeps the hits left
    /// (`Keep::Left`): a part that grows gets its new room empty. At its first lease of a new key
    /// (`RegionGrant::first`) it first takes its even share of the key's burst, less what it
    /// admitted by its floor meanwhile (`Keep::Used`).
    pub(super) fn region_rescale(&mut self, key: KeyHash, policy: &Policy, part: u64, now: Instant) {
        let Some(lease) = self.keys.extra(key).and_then(|meta| meta.region.as_deref().copied()) else {
            return;
        };
        if part == 0 && lease.bucket_part != 0 {
            // Closed (`RegionFallback::Closed`, the lease ended): the region accrues no credit while
            // the other regions use the limit, or it would reopen with a full bucket on top of
            // theirs. Its bucket is kept empty, in the part it counted in.
            let Some(from) = self.region_limit(&policy.limit, lease.bucket_part) else { return };
            self.keys.update(key, &policy.limit, |bucket, _| bucket.hold(&from, from.capacity(), now));
            return;
        }
        if part == 0 || lease.bucket_part == 0 || lease.bucket_part == part {
            return;
        }
        let first = lease.bucket_before_lease && lease.first;
        let even = policy.limit.spec().limit / self.regions.count() as u64;
        let (Some(from), Some(to)) =
            (self.region_limit(&policy.limit, lease.bucket_part), self.region_limit(&policy.limit, part))
        else {
            return;
        };
        // A new key's first lease: the bucket began at the floor; it holds its even share of the
        // burst, less what it admitted meanwhile, before it takes its part.
        let via = match first {
            true => self.region_limit(&policy.limit, even.max(1)),
            false => None,
        };
        self.keys.update(key, &policy.limit, |bucket, meta| {
            match via.as_ref() {
                Some(even) => {
                    bucket.rescale(&from, even, Keep::Used, now);
                    bucket.rescale(even, &to, Keep::Left, now);
                }
                None => bucket.rescale(&from, &to, Keep::Left, now),
            }
            if let Some(lease) = meta.region.as_deref_mut() {
                lease.bucket_part = part;
                lease.bucket_before_lease = lease.seq == 0;
            }
        });
    }

    /// After this node decided a check of `key` as its region's owner: the key is due for a report
    /// to its home, at once when it holds no lease yet.
    pub(super) fn region_touched(&mut self, key: KeyHash, policy: &Arc<Policy>, now: Instant) {
        if !self.regions.active() {
            return;
        }
        let interval = duration_nanos(self.config.region_sync_interval);
        let meta = self.keys.extra(key);
        if meta.is_some_and(|meta| meta.policy.region != policy.region) {
            // The key's state came without its policy (a handoff, a report): a check brings its
            // terms between regions (only them: the key keeps its mode and audit).
            let (limit, region) = (policy.limit.clone(), policy.region);
            self.keys.update(key, &limit, |_, meta| meta.policy = handoff::with_region(&meta.policy, region));
        }
        let lease = self.keys.extra(key).and_then(|meta| meta.region.as_deref().copied());
        // A key with no live lease is reported at once (once an interval): it decides by its
        // floor until the lease comes.
        let asked = lease.is_some_and(|l| l.until > now || l.reported_at.add_nanos(interval) > now);
        if asked {
            self.region_due.insert(key);
        } else {
            let demand = self.region_demand(key, now);
            self.report_region(key, policy, demand, now);
        }
    }

    /// The region sync round: reports every due key with news to its home. A key whose lease
    /// is live and whose last report said it had demand stays due without checks: the home must
    /// hear when its demand ends (else it would keep the region's part from the others until
    /// the lease lapsed).
    ///
    /// A round visits at most `sync_batch_len_max` keys (one input holds the driver's lock that
    /// long at most); the rest stay due for the next round.
    pub(super) fn region_round(&mut self, now: Instant) {
        let visit = self.region_due.len().min(self.config.sync_batch_len_max.max(1));
        let due: Vec<KeyHash> = self.region_due.drain(..visit).collect();
        let renew = duration_nanos(self.config.region_sync_interval).saturating_mul(2);
        for key in due {
            let Some(meta) = self.keys.extra(key).filter(|m| m.owned) else { continue };
            let policy = meta.policy.clone();
            let lease = meta.region.as_deref().copied().unwrap_or_default();
            let demand = self.region_demand(key, now);
            if lease.news(demand, self.regions.home(key, policy.region.home).1, now, renew) {
                self.report_region(key, &policy, demand, now);
            }
            let watched = self.keys.extra(key).and_then(|m| m.region.as_deref().copied());
            if watched.is_some_and(|l| l.until > now && l.demand_reported > 0) {
                self.region_due.insert(key);
            }
        }
    }

    /// The demand for `key` in this region, smoothed over region rounds: this node's and its
    /// participants'.
    fn region_demand(&mut self, key: KeyHash, now: Instant) -> u64 {
        let half_life = self.half_life_nanos();
        let sync = duration_nanos(self.config.sync_interval);
        let active = now.sub_nanos(sync.saturating_mul(2).max(self.release_nanos() / 8));
        let Some(limit) = self.keys.extra(key).map(|meta| meta.policy.limit.clone()) else { return 0 };
        let demand = self.keys.update(key, &limit, |_, meta| {
            // Now: this node's and its participants' estimates.
            let own = meta.demand.per_second(now, half_life);
            let counted = |p: &&Participant| p.heard_at > active || (p.leased && p.released_at > now);
            let participants = meta.participants.iter().filter(counted).map(|p| p.demand_per_s);
            let instant = participants.fold(own, u64::saturating_add);
            let lease = meta.region.get_or_insert_with(Box::default);
            // No history: the estimate starts from what is seen now.
            let keep = match lease.demand_at == Instant::ZERO {
                true => 0.0,
                false => {
                    let elapsed = now.nanos_since(lease.demand_at);
                    libm::exp2(-(elapsed as f64) / REGION_DEMAND_HALF_LIFE_NANOS as f64)
                }
            };
            let milli = (keep * lease.demand_milli as f64 + (1.0 - keep) * instant as f64 * 1000.0)
                .max(instant as f64 * 1000.0);
            lease.demand_milli = milli as u64;
            lease.demand_at = lease.demand_at.max(now);
            lease.demand_milli.div_ceil(1000)
        });
        demand.unwrap_or(0)
    }

    /// Sends `key`'s report (its region's `demand`) to its home owner (applies it here when
    /// this node is the home owner).
    fn report_region(&mut self, key: KeyHash, policy: &Arc<Policy>, demand: u64, now: Instant) {
        let (home, owner) = self.regions.home(key, policy.region.home);
        let Some(home_owner) = owner else { return };
        let floor = self.regions.floor(policy.limit.spec().limit);
        let fallback = self.region_fallback(policy.region);
        let lease = self.keys.update(key, &policy.limit, |_, meta| {
            let lease = meta.region.get_or_insert_with(Box::default);
            lease.reported_at = now;
            lease.report_count = lease.report_count.saturating_add(1);
            lease.sent_at[(lease.report_count % REPORTS_KEPT as u64) as usize] = now;
            lease.demand_reported = demand;
            let part = lease.part_at(now, floor, fallback);
            lease.seq_reported = lease.seq;
            if lease.bucket_part == 0 {
                // The bucket was made under the part it decided its first check by.
                lease.bucket_part = part;
                lease.bucket_before_lease = lease.seq == 0;
            }
            RegionLease { part, ..**lease }
        });
        let Some(lease) = lease else { return };
        let report = RegionReport {
            key: key.0,
            limit: LimitWire::from_limit(&policy.limit),
            demand_per_s: demand,
            report_count: lease.report_count,
            // A number of another home owner's is above a new home's own: the new home takes
            // the part as what the region uses, and knows the key is not new.
            applied_seq: lease.seq,
            applied_part: lease.part,
            region: policy.region,
        };
        self.stats.reports_sent += 1;
        if home_owner == self.id && home == self.config.region {
            self.home_report(self.id, report, now);
        } else {
            self.send(home_owner, Body { region_report: vec![report], ..Body::default() }, now);
        }
    }

    /// Reports from other regions' owners of keys whose home owner this node is (refused in a
    /// view of one region: nothing is leased there).
    pub(super) fn on_region_reports(&mut self, from: NodeId, reports: Vec<RegionReport>, now: Instant) {
        for report in reports {
            if !self.regions.active() || from == self.id {
                self.stats.items_refused += 1;
                continue;
            }
            self.home_report(from, report, now);
        }
    }

    /// Applies a report of `from`'s region to the key's ledger, as its home owner, and sends
    /// the grants it makes. Refused unless this node is the key's home owner and `from` is the
    /// key's owner in its own region, in this node's view (views differ for a moment: the
    /// region's lease then lapses, or it reports again).
    fn home_report(&mut self, from: NodeId, report: RegionReport, now: Instant) {
        let key = KeyHash(report.key);
        let region = self.regions.region_of(from);
        let (home, owner) = self.regions.home(key, report.region.home);
        let Ok(limit) = report.limit.to_limit() else {
            self.stats.items_refused += 1;
            return;
        };
        let reporter_owns = from == self.id || self.regions.owner_in(region, key) == Some(from);
        if home != self.config.region || owner != Some(self.id) || !reporter_owns {
            self.stats.items_refused += 1;
            return;
        }
        let value = limit.spec().limit;
        let terms = HomeTerms {
            value,
            floor: self.regions.floor(value),
            even: value / self.regions.count() as u64,
            fallback: self.region_fallback(report.region),
            lease_nanos: duration_nanos(self.config.region_lease)
                .saturating_add(duration_nanos(self.config.region_sync_interval)),
            new_nanos: duration_nanos(self.config.region_sync_interval).saturating_mul(2),
            now,
        };
        let home_report = HomeReport {
            region,
            from,
            demand_per_s: report.demand_per_s,
            report_count: report.report_count,
            applied_seq: report.applied_seq,
            applied_part: report.applied_part.min(value),
        };
        let ids = self.regions.ids.clone();
        let policy = handoff::state_policy(&limit, report.region);
        let (grants, first) = self.keys.upsert_with(
            key,
            &limit,
            now,
            || KeyMeta::new(policy, true),
            |_, meta| {
                let ledger = meta.home.get_or_insert_with(Box::default);
                // A ledger of another limit (the policy changed) is rebuilt.
                if ledger.value != value {
                    **ledger = HomeLedger { value, ..HomeLedger::default() };
                }
                ledger.apply(home_report, &ids, terms)
            },
        );
        let lease_nanos = duration_nanos(self.config.region_lease);
        let limit = report.limit;
        for (i, g) in grants.into_iter().enumerate() {
            let grant = RegionGrant {
                key: key.0,
                limit: limit.clone(),
                seq: g.seq,
                part: g.part,
                lease_nanos,
                report_count: g.report_count,
                first: first && i == 0,
                region: report.region,
            };
            let to = g.to;
            if to == self.id {
                if !self.apply_region_grant(&grant, self.id, now) {
                    self.release_region_grant(self.id, grant, now);
                }
            } else {
                self.stats.grants_sent += 1;
                self.send(to, Body { region_grant: vec![grant], ..Body::default() }, now);
            }
        }
    }

    /// Leases from home owners (`from`): only the key's home owner in this node's view grants
    /// (another member's grant is refused and changes nothing).
    pub(super) fn on_region_grants(&mut self, from: NodeId, grants: Vec<RegionGrant>, now: Instant) {
        for grant in grants {
            let home = self.regions.home(KeyHash(grant.key), grant.region.home).1;
            if !self.regions.active() || home != Some(from) || from == self.id {
                self.stats.items_refused += 1;
                continue;
            }
            if !self.apply_region_grant(&grant, from, now) {
                self.release_region_grant(from, grant, now);
            }
        }
    }

    /// A lease of a key this node does not decide (it moved to another member of the region, or
    /// was forgotten): the home hears that the region holds nothing of it here, so it neither
    /// keeps the part reserved nor sends it again.
    fn release_region_grant(&mut self, home: NodeId, grant: RegionGrant, now: Instant) {
        let release = RegionReport {
            key: grant.key,
            limit: grant.limit,
            demand_per_s: 0,
            report_count: grant.report_count,
            applied_seq: grant.seq,
            applied_part: 0,
            region: grant.region,
        };
        if home == self.id {
            self.home_report(self.id, release, now);
        } else {
            self.send(home, Body { region_report: vec![release], ..Body::default() }, now);
        }
    }

    /// Applies a lease of `home`; whether this node decides the key (else the lease is not for
    /// it). The lease counts from the report it answers, if that is one of the last
    /// [`REPORTS_KEPT`] sent (else it is not extended: its time is not kept), and lasts at most
    /// this node's own `region_lease`.
    fn apply_region_grant(&mut self, grant: &RegionGrant, home: NodeId, now: Instant) -> bool {
        let key = KeyHash(grant.key);
        let Some(limit) = self.keys.extra(key).filter(|m| m.owned).map(|m| m.policy.limit.clone()) else {
            return false;
        };
        let lease_nanos = grant.lease_nanos.min(duration_nanos(self.config.region_lease));
        let applied = self.keys.update(key, &limit, |_, meta| {
            let lease = meta.region.get_or_insert_with(Box::default);
            // Grants are numbered by their home: an older one arriving late changes nothing. A
            // new home owner numbers its own.
            if lease.home == Some(home) && grant.seq <= lease.seq {
                return None;
            }
            if meta.policy.region == PolicyRegion::default() {
                // The key's state came without its terms (a snapshot read back): the home that
                // granted under them (`on_region_grants` checked it) is the key's, so its
                // reports go back there.
                meta.policy = handoff::with_region(&meta.policy, grant.region);
            }
            let part = grant.part.min(limit.spec().limit);
            let decrease = part < lease.part;
            lease.home = Some(home);
            lease.seq = grant.seq;
            lease.first = grant.first;
            lease.part = part;
            let behind = lease.report_count.checked_sub(grant.report_count);
            if behind.is_some_and(|behind| behind < REPORTS_KEPT as u64) {
                let sent_at = lease.sent_at[(grant.report_count % REPORTS_KEPT as u64) as usize];
                let until = sent_at.add_nanos(lease_nanos).min(now.add_nanos(lease_nanos));
                lease.until = lease.until.max(until);
            }
            Some(decrease)
        });
        match applied.flatten() {
            // A decrease frees part of the limit for another region once the home hears it was
            // applied: it hears at once.
            Some(true) => {
                let policy = self.keys.extra(key).map(|meta| meta.policy.clone());
                if let Some(policy) = policy {
                    let demand = self.region_demand(key, now);
                    self.report_region(key, &policy, demand, now);
                }
            }
            // The home learns that an increase was applied from the next report.
            Some(false) => {
                self.region_due.insert(key);
            }
            None => {}
        }
        true
    }
}
