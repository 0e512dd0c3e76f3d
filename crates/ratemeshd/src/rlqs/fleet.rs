//! One limit across the cluster: the Envoys of every node that report a (policy, key) share its
//! limit, through the key's owner.
//!
//! Every `[rls] rlqs_sync_interval_ms` (and at once for a group new on a node), each node sends
//! the owner of each key its Envoys report (the ring's owner of the key's bucket, as for checks)
//! the demands of its members of that group ([`super::hub::Hub::demands`]), batched per owner in questions
//! over the peer transport ([`ratemesh::Node::ask`]: mutual TLS, bounded, timed). The owner keeps
//! what each node last said in its [`Ledger`] and answers each node its part: the split of the
//! policy's rate over *every* member of the cluster ([`super::alloc::shares`]), summed over that
//! node's members, and the burst in proportion. The node then splits its part over its own
//! members with the same function, which gives each member the share the cluster-wide split gives
//! it (proportional above the limit; demand plus an equal part of the rest below it), so that
//! Σ of the parts ≤ the limit and Σ of every Envoy's assignment ≤ its node's part.
//!
//! No new coordinator: the owner is the key's, and when it changes (a death, a join) the new
//! owner starts an empty ledger for the key. When the first node to ask already holds a part
//! (the old owner's), for one interval and a half it answers each node the part that node says it
//! holds, so that the move hands out nothing new until every node has told it its demand; then it
//! splits as above. A key new to the cluster is split from its first question.
//!
//! # Transients and failures
//!
//! - A node's part is computed from the others' last demands: when demand moves, the parts move
//!   within one interval at each node (a node whose demand rose gets more at its next question,
//!   the others less at theirs), so Σ of parts can exceed the limit by the moved demand's share
//!   for at most one interval. Envoys hold an assignment until their next report (5 s) or a push.
//! - An owner forgets a node not heard from for [`STALE_INTERVALS`] intervals (a dead node's
//!   part returns to the others then).
//! - A node that gets no answer keeps its part for [`STALE_INTERVALS`] intervals, then falls
//!   back to the limit over the live members (the equal split, safe whatever the others do); a
//!   group new on a node whose owner does not answer starts there.
//! - Questions are at most [`ratemesh::APP_QUESTION_LEN_MAX`] bytes (a batch is cut in as many
//!   as it takes); an owner keeps at most [`LEDGER_GROUPS_MAX`] groups (beyond, new groups are
//!   not answered: their nodes fall back), [`DEMANDS_PER_NODE_MAX`] demands per node and group
//!   (the rest are summed into the last) and [`LEDGER_DEMANDS_MAX`] in all (past it, a node's
//!   demands of a group are kept as their sum).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, MutexGuard, Weak};
use std::time::{Duration, Instant};

use ratemesh::{APP_QUESTION_LEN_MAX, MemberStatus, Mutex, NodeId};
use serde::{Deserialize, Serialize};
use tracing::debug;

use super::alloc::shares;
use super::hub::{GroupDemand, GroupKey, Quota};
use crate::daemon::Daemon;

/// The first byte of a fleet question and answer: a peer of another version answers nothing
/// this node reads (it falls back).
pub const FLEET_VERSION: u8 = 1;
/// Groups an owner keeps.
pub const LEDGER_GROUPS_MAX: usize = 100_000;
/// Demands one node says per group.
pub const DEMANDS_PER_NODE_MAX: usize = 1024;
/// Demands an owner keeps in all (16 MiB of them): past it, what a node says of a group is kept
/// as one summed demand (its members then split the node's part by the node's rule, not the
/// owner's: fairness across nodes holds, within the node it is proportional).
pub const LEDGER_DEMANDS_MAX: usize = 1 << 20;
/// Intervals after which an owner forgets a silent node, and a node its unrenewed part.
pub const STALE_INTERVALS: u32 = 3;

/// What a node says of one group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ask {
    /// The group's policy.
    pub policy: String,
    /// The group's key.
    pub key: String,
    /// The policy's limit as the node knows it.
    pub limit: Quota,
    /// Its members' demands.
    pub demands: Vec<Option<f64>>,
    /// Its part now, if it has one.
    pub held: Option<Quota>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Question {
    asks: Vec<Ask>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Answer {
    /// One per ask, in order; `None`: not answered (the node falls back).
    parts: Vec<Option<Quota>>,
}

/// What an owner heard from one node about one group.
#[derive(Debug)]
struct Heard {
    limit: Quota,
    demands: Vec<Option<f64>>,
    at: Instant,
}

#[derive(Debug)]
struct LedgerGroup {
    /// When this owner first heard of the group.
    since: Instant,
    /// Whether the first node to speak of it already held a part (from a previous owner: this
    /// one took the key over, and answers what the nodes hold for the warm-up).
    inherited: bool,
    nodes: BTreeMap<NodeId, Heard>,
}

impl LedgerGroup {
    /// The demands recorded of it.
    fn demands(&self) -> usize {
        self.nodes.values().map(|heard| heard.demands.len()).sum()
    }
}

#[derive(Debug, Default)]
struct LedgerInner {
    groups: HashMap<GroupKey, LedgerGroup>,
    /// Σ of the demands recorded in `groups` (bounded by [`LEDGER_DEMANDS_MAX`]).
    demands: usize,
    swept_at: Option<Instant>,
}

/// The owner's side: what each node last said of each group this node owns.
#[derive(Debug, Default)]
pub struct Ledger {
    inner: Mutex<LedgerInner>,
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, LedgerInner> {
        // Every answer recomputes from what is recorded: a panic under the lock leaves nothing
        // half-made that matters.
        self.inner.lock()
    }

    /// Groups recorded.
    pub fn groups(&self) -> usize {
        self.lock().groups.len()
    }

    /// The first `max` groups recorded in (policy, key) order, each with the nodes heard of.
    pub fn first_groups(&self, max: usize) -> Vec<(GroupKey, Vec<NodeId>)> {
        let inner = self.lock();
        let mut keys: Vec<&GroupKey> = inner.groups.keys().collect();
        keys.sort_unstable();
        keys.into_iter()
            .take(max)
            .map(|key| (key.clone(), inner.groups[key].nodes.keys().copied().collect()))
            .collect()
    }

    /// Records `from`'s asks at `now` and answers each with `from`'s part (see the module's
    /// documentation); a record older than `stale` is forgotten, and a group known for less than
    /// `warmup` answers what the node holds.
    pub fn answer(
        &self,
        from: NodeId,
        asks: Vec<Ask>,
        now: Instant,
        stale: Duration,
        warmup: Duration,
    ) -> Vec<Option<Quota>> {
        let mut inner = self.lock();
        if inner.swept_at.is_none_or(|at| now.saturating_duration_since(at) >= stale) {
            inner.swept_at = Some(now);
            inner.groups.retain(|_, g| {
                g.nodes.retain(|_, heard| now.saturating_duration_since(heard.at) < stale);
                !g.nodes.is_empty()
            });
            inner.demands = inner.groups.values().map(LedgerGroup::demands).sum();
        }
        asks.into_iter().map(|ask| record(&mut inner, from, ask, now, stale, warmup)).collect()
    }
}

fn record(
    inner: &mut LedgerInner,
    from: NodeId,
    ask: Ask,
    now: Instant,
    stale: Duration,
    warmup: Duration,
) -> Option<Quota> {
    let key = GroupKey { policy: ask.policy, key: ask.key };
    if !inner.groups.contains_key(&key) && inner.groups.len() >= LEDGER_GROUPS_MAX {
        return None;
    }
    let inherited = ask.held.is_some();
    let LedgerInner { groups, demands: total, .. } = inner;
    let group =
        groups.entry(key).or_insert_with(|| LedgerGroup { since: now, inherited, nodes: BTreeMap::new() });
    let before = group.demands();
    group.nodes.retain(|_, heard| now.saturating_duration_since(heard.at) < stale);
    *total = *total - before + group.demands();
    // The ledger's demands without what `from` said of this group before.
    let others = *total - group.nodes.get(&from).map_or(0, |heard| heard.demands.len());
    let mut demands = capped(ask.demands);
    if others + demands.len() > LEDGER_DEMANDS_MAX {
        if others + 1 > LEDGER_DEMANDS_MAX {
            // Full even for one summed demand: not answered (the node falls back).
            return None;
        }
        demands = vec![Some(demands.iter().map(|d| d.unwrap_or(0.0)).sum())];
    }
    // A limit that is not a number splits nothing.
    let limit = match ask.limit.rate {
        rate if rate.is_finite() && rate > 0.0 => Quota { rate, burst: ask.limit.burst },
        _ => Quota { rate: 0.0, burst: 0 },
    };
    *total = others + demands.len();
    group.nodes.insert(from, Heard { limit, demands, at: now });
    debug_assert!(*total <= LEDGER_DEMANDS_MAX, "the ledger's demands are bounded");
    if group.inherited
        && now.saturating_duration_since(group.since) < warmup
        && let Some(held) = ask.held
    {
        // Just became the owner: what the node holds stands until every node has spoken.
        return Some(Quota { rate: held.rate.clamp(0.0, limit.rate), burst: held.burst.min(limit.burst) });
    }
    Some(part_of(group, from))
}

/// At most [`DEMANDS_PER_NODE_MAX`] demands, the rest summed into the last (unknown ones as 0).
fn capped(mut demands: Vec<Option<f64>>) -> Vec<Option<f64>> {
    if demands.len() > DEMANDS_PER_NODE_MAX {
        let rest: f64 = demands.drain(DEMANDS_PER_NODE_MAX - 1..).map(|d| d.unwrap_or(0.0)).sum();
        demands.push(Some(rest));
    }
    demands.into_iter().map(|d| d.filter(|d| d.is_finite() && *d >= 0.0)).collect()
}

/// `node`'s part of `group`: the cluster-wide split summed over its members. The limit is the
/// least any node said (a reload in progress splits the smaller).
fn part_of(group: &LedgerGroup, node: NodeId) -> Quota {
    let rate = group.nodes.values().map(|h| h.limit.rate).fold(f64::INFINITY, f64::min);
    let burst = group.nodes.values().map(|h| h.limit.burst).min().unwrap_or(0);
    if !rate.is_finite() || rate <= 0.0 {
        return Quota { rate: 0.0, burst: 0 };
    }
    let mut owners = Vec::new();
    let mut demands = Vec::new();
    for (id, heard) in &group.nodes {
        owners.extend(std::iter::repeat_n(*id, heard.demands.len()));
        demands.extend(heard.demands.iter().copied());
    }
    let split = shares(rate, &demands);
    let part: f64 = owners.iter().zip(split).filter(|(id, _)| **id == node).map(|(_, r)| r).sum();
    let part = part.min(rate);
    debug_assert!(part <= rate, "a node's part never exceeds the limit");
    Quota { rate: part, burst: (burst as f64 * part / rate).floor() as u64 }
}

/// The query handler an owner answers fleet questions with (installed on every daemon's node,
/// whether it serves RLQS or not: it may own keys that other nodes' Envoys report).
pub fn handler(daemon: Weak<Daemon>) -> ratemesh::transport::QueryHandler {
    Arc::new(move |from, bytes| {
        let Some(daemon) = daemon.upgrade() else { return Vec::new() };
        let Some(question) = decode::<Question>(bytes) else { return Vec::new() };
        let interval = daemon.current().0.rlqs.sync_interval;
        let parts = daemon.rlqs().ledger.answer(
            from,
            question.asks,
            Instant::now(),
            interval.saturating_mul(STALE_INTERVALS),
            interval.saturating_mul(3) / 2,
        );
        encode(&Answer { parts })
    })
}

fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    let mut bytes = vec![FLEET_VERSION];
    // Serializing these plain structures into a vector cannot fail.
    bytes.extend(postcard::to_allocvec(message).unwrap_or_default());
    bytes
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    match bytes.split_first() {
        Some((&FLEET_VERSION, body)) => match postcard::take_from_bytes::<T>(body) {
            Ok((message, [])) => Some(message),
            _ => None,
        },
        _ => None,
    }
}

/// Asks the keys' owners for this node's part of every group (`only`: of these groups), and
/// gives the hub what they answer, or the fallback. Returns when every question is answered or
/// timed out (at most one sync interval).
pub async fn sync(daemon: &Arc<Daemon>, only: Option<&HashSet<GroupKey>>) {
    let config = daemon.current().0;
    let interval = config.rlqs.sync_interval;
    let ttl = super::ttl_s(&config);
    let hub = &daemon.rlqs().hub;
    let node = daemon.node();
    let mut by_owner: BTreeMap<NodeId, Vec<GroupDemand>> = BTreeMap::new();
    let mut orphans = Vec::new();
    for demand in hub.demands() {
        if only.is_some_and(|only| !only.contains(&demand.group)) {
            continue;
        }
        match node.owner_of_hashed(demand.hash) {
            Some(owner) => by_owner.entry(owner).or_default().push(demand),
            None => orphans.push(demand),
        }
    }
    let mut asked = tokio::task::JoinSet::new();
    for (owner, demands) in by_owner {
        for batch in batches(demands) {
            let node = node.clone();
            asked.spawn(async move {
                let question = encode(&Question { asks: batch.iter().map(ask_of).collect() });
                let answer = node.ask(owner, &question, interval).await;
                let parts = match answer {
                    Ok(bytes) => decode::<Answer>(&bytes).map(|a| a.parts),
                    Err(error) => {
                        debug!(?owner, %error, "RLQS fleet question not answered");
                        None
                    }
                };
                (batch, parts)
            });
        }
    }
    let live = node.members().iter().filter(|m| m.status == MemberStatus::Live).count().max(1);
    let stale = interval.saturating_mul(STALE_INTERVALS);
    let fall_back = |demand: &GroupDemand| match demand.held {
        Some((_, age)) if age < stale => {}
        _ => {
            let rate = demand.limit.rate / live as f64;
            let burst = demand.limit.burst / live as u64;
            hub.set_node_quota(&demand.group, Quota { rate, burst }, ttl);
            daemon.rlqs().fallbacks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    };
    orphans.iter().for_each(fall_back);
    while let Some(joined) = asked.join_next().await {
        // A question task only panics on a bug; its groups fall back at the next round.
        let Ok((batch, parts)) = joined else { continue };
        let parts = parts.filter(|p| p.len() == batch.len());
        for (i, demand) in batch.iter().enumerate() {
            match parts.as_ref().and_then(|p| p[i]) {
                Some(part) => hub.set_node_quota(&demand.group, part, ttl),
                None => fall_back(demand),
            }
        }
    }
}

fn ask_of(demand: &GroupDemand) -> Ask {
    Ask {
        policy: demand.group.policy.clone(),
        key: demand.group.key.clone(),
        limit: demand.limit,
        demands: capped(demand.demands.clone()),
        held: demand.held.map(|(quota, _)| quota),
    }
}

/// `demands` cut into batches whose questions fit [`APP_QUESTION_LEN_MAX`].
fn batches(demands: Vec<GroupDemand>) -> Vec<Vec<GroupDemand>> {
    // The question's envelope: the version byte and the asks' count.
    const ENVELOPE_BYTES: usize = 16;
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut bytes = ENVELOPE_BYTES;
    for demand in demands {
        let len = postcard::to_allocvec(&ask_of(&demand)).map_or(APP_QUESTION_LEN_MAX, |b| b.len());
        if !batch.is_empty() && bytes + len > APP_QUESTION_LEN_MAX {
            batches.push(std::mem::take(&mut batch));
            bytes = ENVELOPE_BYTES;
        }
        bytes += len;
        batch.push(demand);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

/// Runs [`sync`] every `[rls] rlqs_sync_interval_ms` until the daemon shuts down, counting the
/// rounds ([`super::State::sync_rounds`]).
pub async fn run(daemon: Arc<Daemon>) {
    let shutdown = daemon.shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let interval = daemon.current().0.rlqs.sync_interval;
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = &mut shutdown => return,
        }
        sync(&daemon, None).await;
        daemon.rlqs().sync_rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(demands: &[f64], held: Option<Quota>) -> Ask {
        Ask {
            policy: "p".into(),
            key: "k".into(),
            limit: Quota { rate: 1000.0, burst: 1000 },
            demands: demands.iter().map(|d| Some(*d)).collect(),
            held,
        }
    }

    const STALE: Duration = Duration::from_secs(3);
    const WARMUP: Duration = Duration::from_millis(1500);

    #[test]
    fn the_parts_of_the_nodes_split_the_limit_over_every_envoy() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        let later = t0 + WARMUP;
        // Node 1: two Envoys at 600/s; node 2: one at 600/s; node 3: one at 200/s.
        let mut parts = Vec::new();
        for (node, demands) in [(1, vec![600.0, 600.0]), (2, vec![600.0]), (3, vec![200.0])] {
            ledger.answer(NodeId(node), vec![ask(&demands, None)], t0, STALE, WARMUP);
        }
        for (node, demands) in [(1, vec![600.0, 600.0]), (2, vec![600.0]), (3, vec![200.0])] {
            let part = ledger.answer(NodeId(node), vec![ask(&demands, None)], later, STALE, WARMUP)[0];
            parts.push(part.expect("answered"));
        }
        let total: f64 = parts.iter().map(|p| p.rate).sum();
        assert!((total - 1000.0).abs() < 1e-6, "{parts:?}");
        // Proportional over every Envoy: 600/2000 of the limit each, node 1 twice that.
        assert!((parts[0].rate - 600.0).abs() < 1e-6 && (parts[1].rate - 300.0).abs() < 1e-6, "{parts:?}");
        assert!(parts.iter().map(|p| p.burst).sum::<u64>() <= 1000);
    }

    #[test]
    fn a_new_owner_answers_what_the_nodes_hold_then_splits() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        let held = Quota { rate: 250.0, burst: 250 };
        let part = ledger.answer(NodeId(1), vec![ask(&[900.0], Some(held))], t0, STALE, WARMUP)[0];
        assert_eq!(part, Some(held), "no new hand-out while the others have not spoken");
        ledger.answer(NodeId(2), vec![ask(&[100.0], Some(held))], t0, STALE, WARMUP);
        let part = ledger.answer(NodeId(1), vec![ask(&[900.0], Some(held))], t0 + WARMUP, STALE, WARMUP)[0];
        assert!((part.expect("answered").rate - 900.0).abs() < 1e-6, "{part:?}");
    }

    #[test]
    fn a_new_key_is_split_at_once_without_a_warmup() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        let first = ledger.answer(NodeId(1), vec![ask(&[600.0], None)], t0, STALE, WARMUP)[0];
        assert!((first.expect("answered").rate - 1000.0).abs() < 1e-6, "alone: the whole limit");
        let second = ledger.answer(NodeId(2), vec![ask(&[600.0], None)], t0, STALE, WARMUP)[0];
        assert!((second.expect("answered").rate - 500.0).abs() < 1e-6, "{second:?}");
        // Node 1 asks again within what would be a warm-up, holding the whole limit: it is not a
        // previous owner's part, so the split stands (Σ of the parts back at the limit).
        let again =
            ledger.answer(NodeId(1), vec![ask(&[600.0], Some(first.expect("part")))], t0, STALE, WARMUP)[0];
        assert!((again.expect("answered").rate - 500.0).abs() < 1e-6, "{again:?}");
    }

    #[test]
    fn a_silent_node_is_forgotten_and_its_part_returns() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        ledger.answer(NodeId(1), vec![ask(&[600.0], None)], t0, STALE, Duration::ZERO);
        let part = ledger.answer(NodeId(2), vec![ask(&[600.0], None)], t0, STALE, Duration::ZERO)[0];
        assert!((part.expect("answered").rate - 500.0).abs() < 1e-6);
        let part = ledger.answer(NodeId(2), vec![ask(&[600.0], None)], t0 + STALE, STALE, Duration::ZERO)[0];
        assert!((part.expect("answered").rate - 1000.0).abs() < 1e-6, "node 1 is forgotten: {part:?}");
        assert_eq!(ledger.groups(), 1);
    }

    #[test]
    fn hostile_asks_are_bounded() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        let mut bad = ask(&[f64::NAN, -5.0, f64::INFINITY], Some(Quota { rate: 1e12, burst: u64::MAX }));
        bad.limit.rate = f64::NAN;
        let part = ledger.answer(NodeId(1), vec![bad], t0, STALE, WARMUP)[0].expect("answered");
        assert_eq!(part, Quota { rate: 0.0, burst: 0 }, "a limit that is not a number splits nothing");
        let many = ask(&vec![1.0; DEMANDS_PER_NODE_MAX * 3], None);
        ledger.answer(NodeId(2), vec![many], t0 + WARMUP, STALE, WARMUP);
        assert_eq!(capped(vec![Some(1.0); DEMANDS_PER_NODE_MAX + 5]).len(), DEMANDS_PER_NODE_MAX);
        assert!(decode::<Question>(&[FLEET_VERSION, 0xFF, 0xFF]).is_none());
        assert!(decode::<Question>(&[9, 0]).is_none());
    }

    #[test]
    fn the_demands_an_owner_keeps_are_bounded_in_all() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        let groups = LEDGER_DEMANDS_MAX / DEMANDS_PER_NODE_MAX + 3;
        for i in 0..groups {
            let mut many = ask(&vec![1.0; DEMANDS_PER_NODE_MAX], None);
            many.key = format!("k{i}");
            let part = ledger.answer(NodeId(1), vec![many], t0, STALE, WARMUP)[0];
            assert!(part.is_none_or(|p| p.rate <= 1000.0), "{part:?}");
        }
        let inner = ledger.lock();
        assert_eq!(inner.demands, LEDGER_DEMANDS_MAX, "full");
        assert_eq!(inner.demands, inner.groups.values().map(LedgerGroup::demands).sum::<usize>());
        // Exactly full with whole records: the groups past the bound are not answered.
        let unrecorded = (0..groups)
            .filter(|i| inner.groups[&GroupKey { policy: "p".into(), key: format!("k{i}") }].nodes.is_empty())
            .count();
        assert_eq!(unrecorded, 3);
        drop(inner);
        // A smaller record (one demand) of a known group replaces a larger one: room again.
        let mut one = ask(&[5.0], None);
        one.key = "k0".into();
        assert!(ledger.answer(NodeId(1), vec![one], t0, STALE, WARMUP)[0].is_some());
        let mut many = ask(&vec![1.0; DEMANDS_PER_NODE_MAX], None);
        many.key = format!("k{}", groups - 1);
        assert!(ledger.answer(NodeId(1), vec![many], t0, STALE, WARMUP)[0].is_some());
        let inner = ledger.lock();
        let last = &inner.groups[&GroupKey { policy: "p".into(), key: format!("k{}", groups - 1) }];
        assert_eq!(last.nodes[&NodeId(1)].demands, [Some(DEMANDS_PER_NODE_MAX as f64)], "kept as their sum");
        assert_eq!(inner.demands, LEDGER_DEMANDS_MAX - DEMANDS_PER_NODE_MAX + 2);
    }

    #[test]
    fn batches_fit_a_question() {
        let demand = |i: usize| GroupDemand {
            group: GroupKey { policy: "p".into(), key: format!("{i}-{}", "k".repeat(3000)) },
            hash: ratemesh_core::Namespace::new(b"p").key(i.to_string().as_bytes()),
            limit: Quota { rate: 1.0, burst: 1 },
            demands: vec![Some(1.0)],
            held: None,
        };
        let all: Vec<GroupDemand> = (0..100).map(demand).collect();
        let cut = batches(all);
        assert!(cut.len() > 1);
        assert_eq!(cut.iter().map(Vec::len).sum::<usize>(), 100);
        for batch in &cut {
            let question = encode(&Question { asks: batch.iter().map(ask_of).collect() });
            assert!(question.len() <= APP_QUESTION_LEN_MAX, "{}", question.len());
        }
    }
}
