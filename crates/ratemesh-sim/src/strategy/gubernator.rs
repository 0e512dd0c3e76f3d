//! Gubernator GLOBAL mode, as a baseline.
//!
//! - Every node answers from its own copy of the bucket; a node that has never seen a key starts
//!   from a FULL bucket.
//! - A non-owner queues the hits it admitted and sends them to the key's owner every sync period.
//! - The owner applies them without debt (clamped at what is left) and broadcasts its state for
//!   every changed key to all nodes every sync period; the broadcast OVERWRITES their copies,
//!   losing the hits they admitted since (the known over-admission).
//! - A new owner after a membership change starts from whatever copy it has, or full.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rand::SeedableRng;
use std::rc::Rc;

use ratemesh_core::{Bucket, CoreRng, Instant, KeyHash, Snapshot};

use super::codec::{self, BATCH_LEN_MAX, Message};
use super::ring::{RING_VNODES, Ring};
use super::{Check, NodeSetup, Outgoing, PolicyTable, SimNode, Ticker, Verdict, View};

/// One Gubernator-style node. See the module documentation.
#[derive(Debug)]
pub struct Gubernator {
    id: u32,
    policies: Rc<PolicyTable>,
    rng: CoreRng,
    live: Vec<u32>,
    ring: Ring,
    buckets: BTreeMap<KeyHash, Bucket>,
    /// Hits admitted here for keys owned elsewhere, not yet sent.
    hits: BTreeMap<KeyHash, u64>,
    /// Owned keys changed since the last broadcast.
    dirty: BTreeSet<KeyHash>,
    outbox: VecDeque<Outgoing>,
    ticker: Ticker,
    /// Frames that did not decode.
    malformed: u64,
}

impl Gubernator {
    /// A node alone in its view until the first membership event.
    pub fn new(setup: NodeSetup) -> Gubernator {
        Gubernator {
            id: setup.id,
            rng: CoreRng::seed_from_u64(setup.seed),
            live: vec![setup.id],
            ring: Ring::new(&[setup.id], RING_VNODES),
            buckets: BTreeMap::new(),
            hits: BTreeMap::new(),
            dirty: BTreeSet::new(),
            outbox: VecDeque::new(),
            ticker: Ticker::new(setup.now, setup.sync_interval_ms, setup.seed),
            malformed: 0,
            policies: setup.policies,
        }
    }

    fn owns(&self, key: KeyHash) -> bool {
        self.ring.owner(key).is_none_or(|owner| owner == self.id)
    }

    /// The owner applies hits from a non-owner: no debt, clamped at what is left.
    fn apply_hits(&mut self, key: KeyHash, hits: u64, now: Instant) {
        let limit = self.policies.limit(key);
        let bucket = self.buckets.entry(key).or_insert_with(|| Bucket::new(limit, now));
        let remaining = bucket.check(limit, 0, now, &mut self.rng).remaining;
        bucket.force(limit, hits.min(remaining), now);
        self.dirty.insert(key);
    }

    fn flush_hits(&mut self, now: Instant) {
        let mut by_owner: BTreeMap<u32, Vec<(u128, u64)>> = BTreeMap::new();
        for (key, hits) in std::mem::take(&mut self.hits) {
            match self.ring.owner(key) {
                Some(owner) if owner != self.id => by_owner.entry(owner).or_default().push((key.0, hits)),
                _ => self.apply_hits(key, hits, now),
            }
        }
        for (owner, hits) in by_owner {
            self.send_chunks(&[owner], hits, Message::Hits);
        }
    }

    fn broadcast(&mut self, now: Instant) {
        let dirty = std::mem::take(&mut self.dirty);
        let states: Vec<(u128, u64)> = dirty
            .into_iter()
            .filter(|key| self.owns(*key))
            .filter_map(|key| match self.buckets.get(&key)?.export(now) {
                Snapshot::Tat { backlog_nanos } => Some((key.0, backlog_nanos)),
                _ => None,
            })
            .collect();
        let peers: Vec<u32> = self.live.iter().copied().filter(|p| *p != self.id).collect();
        self.send_chunks(&peers, states, Message::Globals);
    }

    fn send_chunks(&mut self, to: &[u32], items: Vec<(u128, u64)>, wrap: fn(Vec<(u128, u64)>) -> Message) {
        for chunk in items.chunks(BATCH_LEN_MAX) {
            let Some(bytes) = codec::encode(&wrap(chunk.to_vec())) else { continue };
            self.outbox.extend(to.iter().map(|&peer| Outgoing { to: peer, bytes: bytes.clone() }));
        }
    }

    fn overwrite(&mut self, key: KeyHash, backlog_nanos: u64, now: Instant) {
        if let Ok(bucket) = Bucket::import(self.policies.limit(key), Snapshot::Tat { backlog_nanos }, now) {
            self.buckets.insert(key, bucket);
        }
    }
}

impl SimNode for Gubernator {
    fn handle_check(&mut self, now: Instant, check: Check) -> Verdict {
        let owned = self.owns(check.key);
        let limit = self.policies.limit(check.key);
        let bucket = self.buckets.entry(check.key).or_insert_with(|| Bucket::new(limit, now));
        let allowed = bucket.check(limit, check.cost, now, &mut self.rng).allowed;
        if allowed && check.cost > 0 {
            if owned {
                self.dirty.insert(check.key);
            } else {
                *self.hits.entry(check.key).or_default() += check.cost;
            }
        }
        if allowed { Verdict::Allowed } else { Verdict::Refused }
    }

    fn handle_frame(&mut self, now: Instant, _from: u32, bytes: &[u8]) {
        match codec::decode(bytes) {
            Some(Message::Hits(hits)) => {
                hits.into_iter().for_each(|(key, n)| self.apply_hits(KeyHash(key), n, now));
            }
            Some(Message::Globals(states)) => {
                states.into_iter().for_each(|(key, backlog)| self.overwrite(KeyHash(key), backlog, now));
            }
            Some(Message::Counters(_)) | None => self.malformed += 1,
        }
    }

    fn handle_membership(&mut self, _now: Instant, view: &View) {
        self.live.clone_from(&view.live);
        self.ring = Ring::new(&self.live, RING_VNODES);
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.ticker.due(now) {
            self.flush_hits(now);
            self.broadcast(now);
        }
    }

    fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.outbox.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        Some(self.ticker.next())
    }

    fn owner_of(&self, key: KeyHash) -> Option<u32> {
        self.ring.owner(key)
    }
}
