//! Concurrency limit: leases held at once, each expiring if its holder never releases it.

use crate::decision::{Decision, LeaseId};
use crate::prelude::*;
use crate::time::Instant;

/// One lease: who holds how many slots until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    pub id: LeaseId,
    pub slots: u64,
    pub expires_at: Instant,
}

/// The leases held on one key, ordered by expiry, and the leases released here that another
/// node's older copy of the table may still hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Leases {
    pub held: Vec<Lease>,
    /// Released leases, each until no copy of it can be live any more (its expiry): a replica or
    /// handoff sent before the release (a retransmission, another route) arrives after it, and
    /// the union in [`Leases::join`] would bring the lease back until it expires. At most
    /// `limit` of them (the earliest-expiring dropped first: that lease then only waits for its
    /// expiry, conservative).
    released: Vec<(LeaseId, Instant)>,
}

/// Parameters of a concurrency limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LeaseParams {
    pub lease_nanos: u64,
    pub limit: u64,
}

impl Leases {
    fn prune(&mut self, now: Instant) {
        self.held.retain(|lease| lease.expires_at > now);
        self.released.retain(|&(_, expires_at)| expires_at > now);
    }

    /// Slots held. Wider than a slot count: leases from other nodes can sum past `u64::MAX`.
    fn in_use(&self) -> u128 {
        self.held.iter().map(|lease| u128::from(lease.slots)).sum()
    }

    /// Takes a lease of `cost` slots at `now` if they are free; `id` names it.
    pub fn check(&mut self, p: LeaseParams, cost: u64, now: Instant, id: LeaseId) -> Decision {
        self.prune(now);
        let in_use = self.in_use();
        if cost > p.limit {
            return self.decision(p, now).refused_for(None);
        }
        let probe = u128::from(cost.max(1));
        if in_use + probe > u128::from(p.limit) {
            let retry = self.retry_after(in_use + probe - u128::from(p.limit), now);
            return self.decision(p, now).refused_for(Some(retry));
        }
        if cost == 0 {
            return self.decision(p, now);
        }
        let expires_at = now.add_nanos(p.lease_nanos);
        self.held.push(Lease { id, slots: cost, expires_at });
        self.sort();
        let mut decision = self.decision(p, now);
        decision.lease = Some(id);
        decision
    }

    fn decision(&self, p: LeaseParams, now: Instant) -> Decision {
        let reset = self.held.last().map_or(0, |lease| lease.expires_at.nanos_since(now));
        let remaining = u128::from(p.limit).saturating_sub(self.in_use());
        Decision::new(true, p.limit, u64::try_from(remaining).unwrap_or(0), reset)
    }

    /// Nanoseconds until leases holding at least `needed` slots have expired.
    fn retry_after(&self, needed: u128, now: Instant) -> u64 {
        let mut freed = 0u128;
        for lease in &self.held {
            freed += u128::from(lease.slots);
            if freed >= needed {
                return lease.expires_at.nanos_since(now);
            }
        }
        self.held.last().map_or(0, |lease| lease.expires_at.nanos_since(now))
    }

    /// Releases lease `id`; false when no such lease is held (already released, expired, or not
    /// known here yet). Either way the release is remembered until the lease would have expired,
    /// so that a copy of the table from before it does not bring the lease back.
    pub fn release(&mut self, p: LeaseParams, id: LeaseId, now: Instant) -> bool {
        self.prune(now);
        let held = self.held.iter().position(|lease| lease.id == id).map(|at| self.held.remove(at));
        // A lease not seen here was granted at most one lease period ago.
        let expires_at = held.map_or(now.add_nanos(p.lease_nanos), |lease| lease.expires_at);
        match self.released.iter_mut().find(|(released, _)| *released == id) {
            Some((_, until)) => *until = (*until).max(expires_at),
            None => self.released.push((id, expires_at)),
        }
        let len_max = usize::try_from(p.limit).unwrap_or(usize::MAX).max(1);
        if self.released.len() > len_max {
            self.released.sort_by_key(|&(id, expires_at)| (expires_at, id));
            self.released.drain(..self.released.len() - len_max);
        }
        held.is_some()
    }

    /// The instant after which no lease is held and no release needs remembering.
    pub fn fresh_at(&self) -> Instant {
        let held = self.held.last().map_or(Instant::ZERO, |lease| lease.expires_at);
        self.released.iter().map(|&(_, expires_at)| expires_at).fold(held, Instant::max)
    }

    fn sort(&mut self) {
        self.held.sort_by_key(|lease| (lease.expires_at, lease.id));
    }

    /// Joins `other` into `self`: the union of the leases, less those released here; a lease in
    /// both keeps the later expiry.
    pub fn join(&mut self, p: LeaseParams, other: Leases, now: Instant) {
        for lease in other.held {
            if self.released.iter().any(|&(released, _)| released == lease.id) {
                continue;
            }
            match self.held.iter_mut().find(|held| held.id == lease.id) {
                Some(held) => held.expires_at = held.expires_at.max(lease.expires_at),
                None => self.held.push(lease),
            }
        }
        self.prune(now);
        self.sort();
        // Two owners at once (a split brain) can leave more leases than the limit allows. Keep the
        // table bounded without freeing slots early: the earliest-expiring lease's slots move into
        // the next one, which expires later. Its holder's release then finds nothing to release and
        // the slots wait for that expiry (conservative).
        let len_max = usize::try_from(p.limit).unwrap_or(usize::MAX).max(1);
        while self.held.len() > len_max {
            let oldest = self.held.remove(0);
            self.held[0].slots = self.held[0].slots.saturating_add(oldest.slots);
        }
    }

    /// A lease table from `(lease, slots, nanoseconds until expiry)` (from another node), bounded
    /// and pruned like a local one.
    pub fn from_expiries(p: LeaseParams, leases: Vec<(LeaseId, u64, u64)>, now: Instant) -> Leases {
        let held = leases
            .into_iter()
            .filter(|&(_, slots, _)| slots > 0)
            .map(|(id, slots, expires_in)| Lease { id, slots, expires_at: now.add_nanos(expires_in) })
            .collect();
        let mut table = Leases::default();
        table.join(p, Leases { held, released: Vec::new() }, now);
        table
    }
}
