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
}

impl KeyMeta {
    pub fn new(policy: Arc<Policy>, owned: bool) -> KeyMeta {
        KeyMeta { policy, owned, follower: None, participants: Vec::new(), demand: DemandMeter::default() }
    }

    pub fn follower(&mut self) -> &mut Follower {
        self.follower.get_or_insert_with(Box::default)
    }
}

impl KeyExtra for KeyMeta {
    fn keep_until(&self) -> Instant {
        let follower_busy = self.follower.as_ref().is_some_and(|f| f.has_news() || f.allowance > 0);
        let shares_out = self.participants.iter().any(|p| p.outstanding > 0);
        if follower_busy || shares_out { Instant::MAX } else { Instant::ZERO }
    }
}

/// A non-owner's state of one key in approximate mode (and for fallback decisions in exact mode).
#[derive(Clone, Debug, Default)]
pub(crate) struct Follower {
    /// The owner whose grants `allowance` came from.
    pub owner: Option<NodeId>,
    /// Whether `owner` has granted anything yet.
    pub granted: bool,
    /// Hits this node may still admit without asking: granted by the owner, already debited from
    /// the authoritative bucket.
    pub allowance: u64,
    /// Hits admitted from the allowance since the last report.
    pub covered: u64,
    /// Hits admitted without an allowance (fallback) since the last report: the owner must
    /// debit them.
    pub uncovered: u64,
    /// Allowance given back since the last report: the owner credits it.
    pub returned: u64,
    /// Hits asked for, decaying: the demand that shares are proportional to.
    pub demand: DemandMeter,
    /// The owner said the key is over its limit until then: refuse locally, do not ask.
    pub over_until: Instant,
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
        self.covered > 0 || self.uncovered > 0 || self.returned > 0 || self.seed_pending
    }
}

/// A node holding a share of a key this node owns.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Participant {
    pub node: NodeId,
    /// Granted and not yet reported as used or returned.
    pub outstanding: u64,
    /// The participant's reported demand, in hits per second.
    pub demand_per_s: u64,
    pub heard_at: Instant,
}

/// A decaying count of hits: its value halves every `half_life`, so `value / (half_life / ln 2)`
/// estimates the recent rate. Integer arithmetic only (deterministic on every platform).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DemandMeter {
    milli_hits: u64,
    updated_at: Instant,
}

impl DemandMeter {
    /// Adds `hits` at `now`.
    pub fn add(&mut self, hits: u64, now: Instant, half_life_nanos: u64) {
        self.decay(now, half_life_nanos);
        self.milli_hits = self.milli_hits.saturating_add(hits.saturating_mul(1000));
    }

    /// The recent rate at `now`, in hits per second (rounded up: a key asked for once is in demand).
    pub fn per_second(&mut self, now: Instant, half_life_nanos: u64) -> u64 {
        self.decay(now, half_life_nanos);
        // rate = value × ln 2 / half_life;  ln 2 ≈ 0.693147.
        let scaled = u128::from(self.milli_hits) * 693_147 * 1_000_000 / u128::from(half_life_nanos.max(1));
        u64::try_from(scaled.div_ceil(1_000_000 * 1000)).unwrap_or(u64::MAX)
    }

    fn decay(&mut self, now: Instant, half_life_nanos: u64) {
        let elapsed = now.nanos_since(self.updated_at);
        self.updated_at = self.updated_at.max(now);
        let half_life = half_life_nanos.max(1);
        let halvings = elapsed / half_life;
        if halvings >= 64 {
            self.milli_hits = 0;
            return;
        }
        self.milli_hits >>= halvings;
        // Between halvings, 2^-x ≈ 1 − x/2 (within 6 %).
        let fraction = u128::from(elapsed % half_life);
        let shed = u128::from(self.milli_hits) * fraction / (2 * u128::from(half_life));
        self.milli_hits -= u64::try_from(shed).unwrap_or(self.milli_hits);
    }
}
