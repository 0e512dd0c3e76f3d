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
//! No new coordinator: the owner is the key's (under the policy's own name, whatever tier
//! applies), and when it changes (a death, a join) the new owner starts an empty ledger for the
//! key. For [`STALE_INTERVALS`] intervals from then (the warm-up) it answers a node that holds a
//! part another owner gave it (a *claim*) that part, and a node without one at most what the
//! claims recorded so far leave; then it splits as above. A key new to the cluster has no claims
//! and is split from its first question.
//!
//! # Transients and failures
//!
//! - A node's part is computed from the others' last demands: when demand moves, the parts move
//!   within one interval at each node (a node whose demand rose gets more at its next question,
//!   the others less at theirs), so Σ of parts can exceed the limit by the moved demand's share
//!   for at most one interval. Envoys hold an assignment until their next report (5 s) or a push.
//! - After an owner change, a node without a part that asks before the nodes holding parts have
//!   spoken can be given what they hold too, until their questions (at most one interval).
//! - An owner forgets a node not heard from for [`STALE_INTERVALS`] of the larger of its own and
//!   that node's interval (each question says the asker's): a dead node's part returns to the
//!   others then, and nodes configured with different intervals are not forgotten early.
//! - A node that gets no answer keeps its part for [`STALE_INTERVALS`] intervals, then falls
//!   back to the limit over the live members it sees. That is safe when every node falls back
//!   (the owner is gone for all); when only this node cannot reach the owner (an asymmetric
//!   partition, a peer of another version) the others keep splitting the whole limit, and Σ can
//!   exceed it by that fallback part while it lasts. A group new on a node whose owner does not
//!   answer starts at the fallback.
//! - What an owner answers is clamped to the limit the node knows.
//! - Bounds: questions of at most [`ratemesh::APP_QUESTION_LEN_MAX`] bytes (a batch is cut in as
//!   many as it takes) and [`ASKS_PER_QUESTION_MAX`] asks, one per key (a repeated key is not
//!   answered); keys of at most [`KEY_BYTES_MAX`] bytes; an owner keeps at most
//!   [`LEDGER_GROUPS_MAX`] groups and [`LEDGER_DEMANDS_MAX`] demands in all (beyond, a new group
//!   is not answered and its node falls back; a known group always is: its node's demands are then
//!   kept as their sum), [`DEMANDS_PER_NODE_MAX`] per node and group (the rest summed into the
//!   last). Each question's work is linear in its asks and their groups' demands.

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
/// Intervals after which an owner forgets a silent node, and a node its unrenewed part; also
/// how long a new owner honours the parts the nodes hold (the warm-up).
pub const STALE_INTERVALS: u32 = 3;
/// Asks one question may carry (the rest are not answered).
pub const ASKS_PER_QUESTION_MAX: usize = 4096;
/// The longest key an owner records (a canonical bucket id at most, `super::BUCKET_ID_BYTES_MAX`).
pub const KEY_BYTES_MAX: usize = super::BUCKET_ID_BYTES_MAX;
/// The longest policy name an owner records.
pub const POLICY_BYTES_MAX: usize = 256;

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
    /// The owner that said `held` (`None`: the fallback): a part another owner said is a claim
    /// the asked owner honours while it warms up.
    pub held_from: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Question {
    /// The asker's sync interval: the owner forgets it after [`STALE_INTERVALS`] of the larger of
    /// its own and this.
    interval_ms: u64,
    asks: Vec<Ask>,
}

/// How an owner times one question's records.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// A record not renewed for this long is forgotten.
    pub stale: Duration,
    /// A group known for less than this honours the parts nodes hold from another owner.
    pub warmup: Duration,
}

impl Timing {
    /// [`STALE_INTERVALS`] of the larger of the owner's and the asker's intervals, for both.
    pub fn of(own: Duration, asker: Duration) -> Timing {
        let stale = own.max(asker).saturating_mul(STALE_INTERVALS);
        Timing { stale, warmup: stale }
    }
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
    /// Forgotten when not renewed for this long.
    stale: Duration,
    /// The part it holds from another owner, if any.
    claim: Option<Quota>,
}

#[derive(Debug)]
struct LedgerGroup {
    /// When this owner first heard of the group.
    since: Instant,
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
    /// documentation), as owner `me`. A group asked twice in one question, and asks past
    /// [`ASKS_PER_QUESTION_MAX`], are not answered.
    pub fn answer(
        &self,
        me: NodeId,
        from: NodeId,
        asks: Vec<Ask>,
        now: Instant,
        timing: Timing,
    ) -> Vec<Option<Quota>> {
        let mut inner = self.lock();
        if inner.swept_at.is_none_or(|at| now.saturating_duration_since(at) >= timing.stale) {
            inner.swept_at = Some(now);
            inner.groups.retain(|_, g| {
                g.nodes.retain(|_, heard| now.saturating_duration_since(heard.at) < heard.stale);
                !g.nodes.is_empty()
            });
            inner.demands = inner.groups.values().map(LedgerGroup::demands).sum();
        }
        let mut seen = HashSet::new();
        asks.into_iter()
            .enumerate()
            .map(|(i, ask)| {
                let first = seen.insert((ask.policy.clone(), ask.key.clone()));
                if !first || i >= ASKS_PER_QUESTION_MAX {
                    return None;
                }
                record(&mut inner, me, from, ask, now, timing)
            })
            .collect()
    }
}

fn record(
    inner: &mut LedgerInner,
    me: NodeId,
    from: NodeId,
    ask: Ask,
    now: Instant,
    timing: Timing,
) -> Option<Quota> {
    if ask.key.len() > KEY_BYTES_MAX || ask.policy.len() > POLICY_BYTES_MAX {
        return None;
    }
    let key = GroupKey { policy: ask.policy, key: ask.key };
    let LedgerInner { groups, demands: total, .. } = inner;
    // A new group needs room for at least one demand; a known one always has it (its node's
    // demands are summed into one when the ledger is full), so a node of a known key is never
    // left to fall back alone while the others are answered.
    if !groups.contains_key(&key) && (groups.len() >= LEDGER_GROUPS_MAX || *total >= LEDGER_DEMANDS_MAX) {
        return None;
    }
    let group = groups.entry(key).or_insert_with(|| LedgerGroup { since: now, nodes: BTreeMap::new() });
    let before = group.demands();
    group.nodes.retain(|_, heard| now.saturating_duration_since(heard.at) < heard.stale);
    *total = *total - before + group.demands();
    // The ledger's demands without what `from` said of this group before.
    let others = *total - group.nodes.get(&from).map_or(0, |heard| heard.demands.len());
    let mut demands = capped(ask.demands);
    if others + demands.len() > LEDGER_DEMANDS_MAX {
        demands = vec![Some(demands.iter().map(|d| d.unwrap_or(0.0)).sum())];
    }
    // A limit that is not a number splits nothing.
    let limit = match ask.limit.rate {
        rate if rate.is_finite() && rate > 0.0 => Quota { rate, burst: ask.limit.burst },
        _ => Quota { rate: 0.0, burst: 0 },
    };
    let claim = ask.held.filter(|_| ask.held_from != Some(me.0)).map(|held| Quota {
        rate: if held.rate.is_finite() { held.rate.clamp(0.0, limit.rate) } else { 0.0 },
        burst: held.burst.min(limit.burst),
    });
    *total = others + demands.len();
    group.nodes.insert(from, Heard { limit, demands, at: now, stale: timing.stale, claim });
    let part = part_of(group, from);
    if now.saturating_duration_since(group.since) >= timing.warmup {
        return Some(part);
    }
    // Warming up (this owner is new to the key): a node keeps what another owner gave it, and
    // one without such a part gets at most what the others' parts leave.
    if let Some(claim) = claim {
        return Some(claim);
    }
    let claimed: f64 = group
        .nodes
        .iter()
        .filter(|(id, _)| **id != from)
        .filter_map(|(_, heard)| heard.claim)
        .map(|q| q.rate)
        .sum();
    let room = (group_limit(group).rate - claimed).max(0.0);
    if part.rate <= room {
        return Some(part);
    }
    let scale = if part.rate > 0.0 { room / part.rate } else { 0.0 };
    Some(Quota { rate: room, burst: (part.burst as f64 * scale).floor() as u64 })
}

/// The limit a group splits: the least any node said (a reload in progress splits the smaller).
fn group_limit(group: &LedgerGroup) -> Quota {
    let rate = group.nodes.values().map(|h| h.limit.rate).fold(f64::INFINITY, f64::min);
    let burst = group.nodes.values().map(|h| h.limit.burst).min().unwrap_or(0);
    if rate.is_finite() { Quota { rate, burst } } else { Quota { rate: 0.0, burst: 0 } }
}

/// At most [`DEMANDS_PER_NODE_MAX`] demands, the rest summed into the last (unknown ones as 0).
fn capped(mut demands: Vec<Option<f64>>) -> Vec<Option<f64>> {
    if demands.len() > DEMANDS_PER_NODE_MAX {
        let rest: f64 = demands.drain(DEMANDS_PER_NODE_MAX - 1..).map(|d| d.unwrap_or(0.0)).sum();
        demands.push(Some(rest));
    }
    demands.into_iter().map(|d| d.filter(|d| d.is_finite() && *d >= 0.0)).collect()
}

/// `node`'s part of `group`: the cluster-wide split of [`group_limit`] summed over its members.
fn part_of(group: &LedgerGroup, node: NodeId) -> Quota {
    let Quota { rate, burst } = group_limit(group);
    if rate <= 0.0 {
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
    // Shares sum to the rate; the bound holds against their float rounding.
    let part = part.min(rate);
    Quota { rate: part, burst: (burst as f64 * part / rate).floor() as u64 }
}

/// The query handler an owner answers fleet questions with (installed on every daemon's node,
/// whether it serves RLQS or not: it may own keys that other nodes' Envoys report).
pub fn handler(daemon: Weak<Daemon>) -> ratemesh::transport::QueryHandler {
    Arc::new(move |from, bytes| {
        let Some(daemon) = daemon.upgrade() else { return Vec::new() };
        let Some(question) = decode::<Question>(bytes) else { return Vec::new() };
        let own = daemon.current().0.rlqs.sync_interval;
        let timing = Timing::of(own, Duration::from_millis(question.interval_ms));
        let me = daemon.id();
        let parts = daemon.rlqs().ledger.answer(me, from, question.asks, Instant::now(), timing);
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
    for demand in hub.demands(only) {
        match node.owner_of(demand.hash) {
            Some(owner) => by_owner.entry(owner).or_default().push(demand),
            None => orphans.push(demand),
        }
    }
    let mut asked = tokio::task::JoinSet::new();
    let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    // Half an interval: a round, answered or not, ends well before the next is due.
    let limit = (interval / 2).max(Duration::from_millis(5));
    for (owner, demands) in by_owner {
        for batch in batches(demands) {
            let node = node.clone();
            asked.spawn(async move {
                let question = encode(&Question { interval_ms, asks: batch.iter().map(ask_of).collect() });
                let answer = node.ask(owner, &question, limit).await;
                let parts = match answer {
                    Ok(bytes) => decode::<Answer>(&bytes).map(|a| a.parts),
                    Err(error) => {
                        debug!(?owner, %error, "RLQS fleet question not answered");
                        None
                    }
                };
                (owner, batch, parts)
            });
        }
    }
    let live = node.members().iter().filter(|m| m.status == MemberStatus::Live).count().max(1);
    let stale = interval.saturating_mul(STALE_INTERVALS);
    let fall_back = |demand: &GroupDemand| match demand.held {
        Some(held) if held.age < stale => {}
        _ => {
            let rate = demand.limit.rate / live as f64;
            let burst = demand.limit.burst / live as u64;
            hub.set_node_quota(&demand.group, Quota { rate, burst }, None, ttl);
            daemon.rlqs().fallbacks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    };
    orphans.iter().for_each(fall_back);
    while let Some(joined) = asked.join_next().await {
        // A question task only panics on a bug; its groups fall back at the next round.
        let Ok((owner, batch, parts)) = joined else { continue };
        let parts = parts.filter(|p| p.len() == batch.len());
        for (i, demand) in batch.iter().enumerate() {
            // What an owner says is at most the limit this node knows (a bug or another
            // version elsewhere hands out nothing more).
            let part =
                parts.as_ref().and_then(|p| p[i]).filter(|part| part.rate.is_finite()).map(|part| Quota {
                    rate: part.rate.clamp(0.0, demand.limit.rate),
                    burst: part.burst.min(demand.limit.burst),
                });
            match part {
                Some(part) => hub.set_node_quota(&demand.group, part, Some(owner), ttl),
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
        held: demand.held.map(|held| held.quota),
        held_from: demand.held.and_then(|held| held.from).map(|id| id.0),
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
    let mut interval = daemon.current().0.rlqs.sync_interval;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = &mut shutdown => return,
        }
        // Rounds every interval, however long the last took (a reload takes effect at once).
        let now_interval = daemon.current().0.rlqs.sync_interval;
        if now_interval != interval {
            interval = now_interval;
            ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
            held_from: None,
        }
    }

    /// The owner answering in these tests.
    const ME: NodeId = NodeId(9);
    const TIMING: Timing = Timing { stale: STALE, warmup: WARMUP };
    const NO_WARMUP: Timing = Timing { stale: STALE, warmup: Duration::ZERO };

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
            ledger.answer(ME, NodeId(node), vec![ask(&demands, None)], t0, TIMING);
        }
        for (node, demands) in [(1, vec![600.0, 600.0]), (2, vec![600.0]), (3, vec![200.0])] {
            let part = ledger.answer(ME, NodeId(node), vec![ask(&demands, None)], later, TIMING)[0];
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
        let part = ledger.answer(ME, NodeId(1), vec![ask(&[900.0], Some(held))], t0, TIMING)[0];
        assert_eq!(part, Some(held), "no new hand-out while the others have not spoken");
        ledger.answer(ME, NodeId(2), vec![ask(&[100.0], Some(held))], t0, TIMING);
        let part = ledger.answer(ME, NodeId(1), vec![ask(&[900.0], Some(held))], t0 + WARMUP, TIMING)[0];
        assert!((part.expect("answered").rate - 900.0).abs() < 1e-6, "{part:?}");
    }

    #[test]
    fn a_new_key_is_split_at_once_without_a_warmup() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        let first = ledger.answer(ME, NodeId(1), vec![ask(&[600.0], None)], t0, TIMING)[0];
        assert!((first.expect("answered").rate - 1000.0).abs() < 1e-6, "alone: the whole limit");
        let second = ledger.answer(ME, NodeId(2), vec![ask(&[600.0], None)], t0, TIMING)[0];
        assert!((second.expect("answered").rate - 500.0).abs() < 1e-6, "{second:?}");
        // Node 1 asks again within what would be a warm-up, holding the whole limit: it is not a
        // previous owner's part, so the split stands (Σ of the parts back at the limit).
        let mine = Ask { held_from: Some(ME.0), ..ask(&[600.0], Some(first.expect("part"))) };
        let again = ledger.answer(ME, NodeId(1), vec![mine], t0, TIMING)[0];
        assert!((again.expect("answered").rate - 500.0).abs() < 1e-6, "{again:?}");
    }

    #[test]
    fn a_new_owner_gives_a_node_without_a_part_only_what_the_claims_leave() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        // Nodes 1 and 2 hold 400 each from the previous owner (node 5).
        let held = Quota { rate: 400.0, burst: 400 };
        for node in [1, 2] {
            let claim = Ask { held_from: Some(5), ..ask(&[600.0], Some(held)) };
            assert_eq!(ledger.answer(ME, NodeId(node), vec![claim], t0, TIMING)[0], Some(held));
        }
        // Node 3, new to the key, gets at most the 200 the claims leave while warming up.
        let newcomer = ledger.answer(ME, NodeId(3), vec![ask(&[600.0], None)], t0, TIMING)[0];
        assert!((newcomer.expect("answered").rate - 200.0).abs() < 1e-6, "{newcomer:?}");
        // After the warm-up: the split, a third each.
        let later = ledger.answer(ME, NodeId(3), vec![ask(&[600.0], None)], t0 + WARMUP, TIMING)[0];
        assert!((later.expect("answered").rate - 1000.0 / 3.0).abs() < 1e-6, "{later:?}");
    }

    #[test]
    fn a_question_is_answered_once_per_key_and_keys_are_bounded() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        let answers = ledger.answer(ME, NodeId(1), vec![ask(&[1.0], None), ask(&[2.0], None)], t0, TIMING);
        assert!(answers[0].is_some() && answers[1].is_none(), "{answers:?}");
        let long = Ask { key: "k".repeat(KEY_BYTES_MAX + 1), ..ask(&[1.0], None) };
        assert_eq!(ledger.answer(ME, NodeId(1), vec![long], t0, TIMING), [None]);
        assert_eq!(ledger.groups(), 1);
        // An asker with a longer interval is remembered for three of its intervals.
        let timing = Timing::of(Duration::from_secs(1), Duration::from_secs(10));
        assert_eq!(timing.stale, Duration::from_secs(30));
    }

    #[test]
    fn a_silent_node_is_forgotten_and_its_part_returns() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        ledger.answer(ME, NodeId(1), vec![ask(&[600.0], None)], t0, NO_WARMUP);
        let part = ledger.answer(ME, NodeId(2), vec![ask(&[600.0], None)], t0, NO_WARMUP)[0];
        assert!((part.expect("answered").rate - 500.0).abs() < 1e-6);
        let part = ledger.answer(ME, NodeId(2), vec![ask(&[600.0], None)], t0 + STALE, NO_WARMUP)[0];
        assert!((part.expect("answered").rate - 1000.0).abs() < 1e-6, "node 1 is forgotten: {part:?}");
        assert_eq!(ledger.groups(), 1);
    }

    #[test]
    fn hostile_asks_are_bounded() {
        let ledger = Ledger::default();
        let t0 = Instant::now();
        let mut bad = ask(&[f64::NAN, -5.0, f64::INFINITY], Some(Quota { rate: 1e12, burst: u64::MAX }));
        bad.limit.rate = f64::NAN;
        let part = ledger.answer(ME, NodeId(1), vec![bad], t0, TIMING)[0].expect("answered");
        assert_eq!(part, Quota { rate: 0.0, burst: 0 }, "a limit that is not a number splits nothing");
        let many = ask(&vec![1.0; DEMANDS_PER_NODE_MAX * 3], None);
        ledger.answer(ME, NodeId(2), vec![many], t0 + WARMUP, TIMING);
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
            let part = ledger.answer(ME, NodeId(1), vec![many], t0, TIMING)[0];
            assert!(part.is_none_or(|p| p.rate <= 1000.0), "{part:?}");
        }
        let inner = ledger.lock();
        assert_eq!(inner.demands, LEDGER_DEMANDS_MAX, "full");
        assert_eq!(inner.demands, inner.groups.values().map(LedgerGroup::demands).sum::<usize>());
        // Exactly full with whole records: the groups past the bound are not answered (nor kept).
        let unrecorded = (0..groups)
            .filter(|i| !inner.groups.contains_key(&GroupKey { policy: "p".into(), key: format!("k{i}") }))
            .count();
        assert_eq!(unrecorded, 3);
        drop(inner);
        // A smaller record (one demand) of a known group replaces a larger one: room again.
        let mut one = ask(&[5.0], None);
        one.key = "k0".into();
        assert!(ledger.answer(ME, NodeId(1), vec![one], t0, TIMING)[0].is_some());
        let mut many = ask(&vec![1.0; DEMANDS_PER_NODE_MAX], None);
        many.key = format!("k{}", groups - 1);
        assert!(ledger.answer(ME, NodeId(1), vec![many], t0, TIMING)[0].is_some());
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
            let question = encode(&Question { interval_ms: 1000, asks: batch.iter().map(ask_of).collect() });
            assert!(question.len() <= APP_QUESTION_LEN_MAX, "{}", question.len());
        }
    }
}
