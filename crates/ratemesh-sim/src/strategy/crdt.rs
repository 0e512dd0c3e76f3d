//! Per-node counters merged as a CRDT (Limitador's distributed mode), as a baseline.
//!
//! Every node decides alone. Per key it keeps a G-counter: the hits admitted by each node since
//! the key was first counted. A token bucket is judged on the merged sum: tokens = capacity +
//! refill since the start − Σ counts − forfeit, where `forfeit` is refill that would have
//! overflowed a full bucket (so idle time does not bank tokens). Every sync period a node sends
//! the full state of every key it changed to all live peers; receivers merge (max per node, the
//! earliest start, the largest forfeit). Between syncs, and across a partition, every node
//! spends what it believes is left: the known over-admission.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ratemesh_core::{Instant, KeyHash};

use super::codec::{self, BATCH_LEN_MAX, Counters, Message};
use super::ring::{RING_VNODES, Ring};
use super::{Check, NodeSetup, Outgoing, PolicyTable, SimNode, Ticker, Verdict, View, interval_nanos};

#[derive(Clone, Debug)]
struct Counter {
    counts: BTreeMap<u32, u64>,
    start: Instant,
    forfeit: u64,
}

/// One CRDT-style node. See the module documentation.
#[derive(Debug)]
pub struct Crdt {
    id: u32,
    /// Capacity and nanoseconds per hit of each policy.
    params: Vec<(u64, u64)>,
    policies: std::rc::Rc<PolicyTable>,
    live: Vec<u32>,
    ring: Ring,
    counters: BTreeMap<KeyHash, Counter>,
    changed: BTreeSet<KeyHash>,
    outbox: VecDeque<Outgoing>,
    ticker: Ticker,
    malformed: u64,
}

impl Crdt {
    /// A node alone in its view until the first membership event.
    pub fn new(setup: NodeSetup) -> Crdt {
        let params = setup.policies.limits.iter().map(|l| (l.capacity(), interval_nanos(l))).collect();
        Crdt {
            id: setup.id,
            params,
            policies: setup.policies,
            live: vec![setup.id],
            ring: Ring::new(&[setup.id], RING_VNODES),
            counters: BTreeMap::new(),
            changed: BTreeSet::new(),
            outbox: VecDeque::new(),
            ticker: Ticker::new(setup.now, setup.sync_interval_ms, setup.seed),
            malformed: 0,
        }
    }

    /// Tokens left in `counter` at `now` by the merged counts; refill past capacity is forfeited.
    fn tokens(capacity: u64, interval_nanos: u64, counter: &mut Counter, now: Instant) -> i128 {
        let capacity = i128::from(capacity);
        let refill = i128::from(now.nanos_since(counter.start) / interval_nanos);
        let used: i128 =
            counter.counts.values().map(|c| i128::from(*c)).sum::<i128>() + i128::from(counter.forfeit);
        let tokens = capacity + refill - used;
        if tokens > capacity {
            counter.forfeit += u64::try_from(tokens - capacity).unwrap_or(u64::MAX);
            return capacity;
        }
        tokens
    }

    fn merge(&mut self, state: Counters, now: Instant) {
        let counter = self.counters.entry(KeyHash(state.key)).or_insert_with(|| Counter {
            counts: BTreeMap::new(),
            start: now,
            forfeit: 0,
        });
        counter.start = counter.start.min(now.sub_nanos(state.age_nanos));
        counter.forfeit = counter.forfeit.max(state.forfeit);
        for (node, count) in state.counts {
            let mine = counter.counts.entry(node).or_default();
            *mine = (*mine).max(count);
        }
    }

    fn sync(&mut self, now: Instant) {
        let states: Vec<Counters> = std::mem::take(&mut self.changed)
            .into_iter()
            .filter_map(|key| {
                let c = self.counters.get(&key)?;
                let counts = c.counts.iter().map(|(n, v)| (*n, *v)).collect();
                Some(Counters { key: key.0, age_nanos: now.nanos_since(c.start), forfeit: c.forfeit, counts })
            })
            .collect();
        for chunk in states.chunks(BATCH_LEN_MAX) {
            let Some(bytes) = codec::encode(&Message::Counters(chunk.to_vec())) else { continue };
            for &peer in self.live.iter().filter(|p| **p != self.id) {
                self.outbox.push_back(Outgoing { to: peer, bytes: bytes.clone() });
            }
        }
    }
}

impl SimNode for Crdt {
    fn handle_check(&mut self, now: Instant, check: Check) -> Verdict {
        let counter = self.counters.entry(check.key).or_insert_with(|| Counter {
            counts: BTreeMap::new(),
            start: now,
            forfeit: 0,
        });
        let (capacity, interval) = self.params[self.policies.index(check.key)];
        let tokens = Crdt::tokens(capacity, interval, counter, now);
        let allowed = check.cost <= capacity && tokens >= i128::from(check.cost.max(1));
        if allowed && check.cost > 0 {
            *counter.counts.entry(self.id).or_default() += check.cost;
            self.changed.insert(check.key);
        }
        if allowed { Verdict::Allowed } else { Verdict::Refused }
    }

    fn handle_frame(&mut self, now: Instant, _from: u32, bytes: &[u8]) {
        match codec::decode(bytes) {
            Some(Message::Counters(states)) => states.into_iter().for_each(|s| self.merge(s, now)),
            Some(_) | None => self.malformed += 1,
        }
    }

    fn handle_membership(&mut self, _now: Instant, view: &View) {
        self.live.clone_from(&view.live);
        self.ring = Ring::new(&self.live, RING_VNODES);
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.ticker.due(now) {
            self.sync(now);
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
