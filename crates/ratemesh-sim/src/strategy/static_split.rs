//! A static split, as a baseline: each node enforces limit / N alone, N being the live members it
//! sees. No messages. Accurate only when demand is spread exactly evenly; a partition lets each
//! side admit the whole limit once it has noticed the other side is gone.

use std::collections::BTreeMap;

use rand::SeedableRng;
use std::rc::Rc;

use ratemesh_core::{Bucket, CoreRng, Instant, KeyHash, Limit, LimitSpec};

use super::ring::{RING_VNODES, Ring};
use super::{Check, NodeSetup, Outgoing, PolicyTable, SimNode, Verdict, View};

/// One node of the static split. See the module documentation.
#[derive(Debug)]
pub struct StaticSplit {
    policies: Rc<PolicyTable>,
    /// Each policy's limit divided by the live members.
    shares: Vec<Limit>,
    rng: CoreRng,
    ring: Ring,
    buckets: BTreeMap<KeyHash, Bucket>,
}

impl StaticSplit {
    /// A node alone in its view (the whole limit) until the first membership event.
    pub fn new(setup: NodeSetup) -> StaticSplit {
        StaticSplit {
            shares: setup.policies.limits.clone(),
            policies: setup.policies,
            rng: CoreRng::seed_from_u64(setup.seed),
            ring: Ring::new(&[setup.id], RING_VNODES),
            buckets: BTreeMap::new(),
        }
    }

    /// The limit divided by `members` (every parameter at least 1).
    fn share_of(spec: &LimitSpec, members: u64) -> Option<Limit> {
        let mut share = spec.clone();
        share.limit = (spec.limit / members).max(1);
        share.burst = spec.burst.map(|b| (b / members).max(1));
        Limit::new(share).ok()
    }
}

impl SimNode for StaticSplit {
    fn handle_check(&mut self, now: Instant, check: Check) -> Verdict {
        let share = &self.shares[self.policies.index(check.key)];
        let bucket = self.buckets.entry(check.key).or_insert_with(|| Bucket::new(share, now));
        if bucket.check(share, check.cost, now, &mut self.rng).allowed {
            Verdict::Allowed
        } else {
            Verdict::Refused
        }
    }

    fn handle_frame(&mut self, _now: Instant, _from: u32, _bytes: &[u8]) {}

    fn handle_membership(&mut self, _now: Instant, view: &View) {
        let members = view.live.len().max(1) as u64;
        for (share, limit) in self.shares.iter_mut().zip(&self.policies.limits) {
            if let Some(new) = StaticSplit::share_of(limit.spec(), members) {
                *share = new;
            }
        }
        self.ring = Ring::new(&view.live, RING_VNODES);
    }

    fn handle_timeout(&mut self, _now: Instant) {}

    fn poll_transmit(&mut self) -> Option<Outgoing> {
        None
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn owner_of(&self, key: KeyHash) -> Option<u32> {
        self.ring.owner(key)
    }
}
