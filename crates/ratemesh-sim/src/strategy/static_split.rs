//! A static split, as a baseline: each node enforces limit / N alone, N being the live members it
//! sees. No messages. Accurate only when demand is spread exactly evenly; a partition lets each
//! side admit the whole limit once it has noticed the other side is gone.

use std::collections::BTreeMap;

use rand::SeedableRng;
use ratemesh_core::{Bucket, CoreRng, Instant, KeyHash, Limit, LimitSpec};

use super::ring::{RING_VNODES, Ring};
use super::{Check, NodeSetup, Outgoing, SimNode, Verdict, View};

/// One node of the static split. See the module documentation.
#[derive(Debug)]
pub struct StaticSplit {
    spec: LimitSpec,
    share: Limit,
    rng: CoreRng,
    ring: Ring,
    buckets: BTreeMap<KeyHash, Bucket>,
}

impl StaticSplit {
    /// A node alone in its view (the whole limit) until the first membership event.
    pub fn new(setup: NodeSetup) -> StaticSplit {
        StaticSplit {
            spec: setup.limit.spec().clone(),
            share: setup.limit,
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
        let bucket = self.buckets.entry(check.key).or_insert_with(|| Bucket::new(&self.share, now));
        if bucket.check(&self.share, check.cost, now, &mut self.rng).allowed {
            Verdict::Allowed
        } else {
            Verdict::Refused
        }
    }

    fn handle_frame(&mut self, _now: Instant, _from: u32, _bytes: &[u8]) {}

    fn handle_membership(&mut self, _now: Instant, view: &View) {
        let members = view.live.len().max(1) as u64;
        if let Some(share) = StaticSplit::share_of(&self.spec, members) {
            self.share = share;
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
