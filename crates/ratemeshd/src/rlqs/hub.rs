//! The node's RLQS state shared by its streams: the open streams (their response senders, for
//! pushes) and the groups (one per policy and key) with their members. One mutex; every
//! operation is bounded by the members of the groups it touches.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::MutexGuard;
use std::time::Instant;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaResponse};
use ratemesh::Mutex;
use ratemesh_core::{KeyHash, NodeId};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tonic::Status;

use super::alloc::{Member, Share, assign};

/// A stream's response sender.
pub type Responses = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

/// One (policy, key): what a group of members splits.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    /// The policy's name.
    pub policy: String,
    /// The key (from the bucket id, see `super::key_of`).
    pub key: String,
}

/// A rate (tokens per second) and a burst: a policy's whole limit, or this node's part of it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Quota {
    /// Tokens per second.
    pub rate: f64,
    /// Tokens at once.
    pub burst: u64,
}

/// A member: a stream and the canonical form of one of its bucket ids.
type MemberId = (u64, String);

#[derive(Debug)]
struct Group {
    /// The policy's whole limit.
    limit: Quota,
    /// The bucket of the key at its owner (`super::fleet`).
    hash: KeyHash,
    /// This node's part of the limit, once the key's owner (or the fallback) said it.
    node: Option<NodePart>,
    members: BTreeMap<MemberId, (BucketId, Member)>,
}

/// This node's part of a group as the key's owner (or the fallback) last said it.
#[derive(Clone, Copy, Debug)]
struct NodePart {
    quota: Quota,
    /// The owner that said it (`None`: the fallback).
    from: Option<NodeId>,
    at: Instant,
}

impl Group {
    /// What this node's members split: its part (once known: nothing is assigned before).
    fn quota(&self) -> Quota {
        self.node.map_or(Quota { rate: 0.0, burst: 0 }, |part| part.quota)
    }
}

/// What one stream learns from another's report: a new share for one of its buckets.
#[derive(Debug)]
pub struct Push {
    /// The stream.
    pub stream: u64,
    /// Its bucket.
    pub bucket_id: BucketId,
    /// The new share.
    pub share: Share,
}

/// An open stream.
#[derive(Debug)]
struct Stream {
    responses: Responses,
    /// Its domain as metrics label it (a configured domain, or `unknown`), once it said one.
    domain: Option<String>,
    /// Its buckets.
    buckets: usize,
}

#[derive(Debug, Default)]
struct Inner {
    next_stream: u64,
    streams: HashMap<u64, Stream>,
    groups: HashMap<GroupKey, Group>,
}

/// The node's RLQS streams and groups.
#[derive(Debug, Default)]
pub struct Hub {
    inner: Mutex<Inner>,
}

/// The group totals for metrics and tests.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupTotals {
    /// Members.
    pub members: usize,
    /// Σ of the assigned token rates (tokens per second).
    pub assigned_rate: f64,
    /// The policy's limit (tokens per second).
    pub limit_rate: f64,
    /// This node's part of it, once known.
    pub node_rate: Option<f64>,
}

/// What this node tells a key's owner about one group (`super::fleet`).
#[derive(Clone, Debug)]
pub struct GroupDemand {
    /// The group.
    pub group: GroupKey,
    /// Its key's bucket (the owner is found from it).
    pub hash: KeyHash,
    /// The policy's whole limit.
    pub limit: Quota,
    /// Each member's demand used for shares (`None`: unknown yet), in member order.
    pub demands: Vec<Option<f64>>,
    /// This node's part now, if it has one.
    pub held: Option<HeldPart>,
}

/// A node's part of a group as it holds it.
#[derive(Clone, Copy, Debug)]
pub struct HeldPart {
    /// The part.
    pub quota: Quota,
    /// How long ago it was said.
    pub age: std::time::Duration,
    /// The owner that said it (`None`: the fallback).
    pub from: Option<NodeId>,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic under the lock leaves consistent-enough data (every operation recomputes).
        self.inner.lock()
    }

    /// Registers a stream, unless `max` are open: its id.
    pub fn open(&self, responses: Responses, max: usize) -> Option<u64> {
        let mut inner = self.lock();
        if inner.streams.len() >= max {
            return None;
        }
        inner.next_stream += 1;
        let id = inner.next_stream;
        inner.streams.insert(id, Stream { responses, domain: None, buckets: 0 });
        Some(id)
    }

    /// Streams open.
    pub fn streams(&self) -> usize {
        self.lock().streams.len()
    }

    /// Stream `stream` is of domain `label` (for metrics: a configured domain or `unknown`) and
    /// holds `buckets` buckets.
    pub fn describe(&self, stream: u64, label: &str, buckets: usize) {
        let mut inner = self.lock();
        if let Some(s) = inner.streams.get_mut(&stream) {
            if s.domain.as_deref() != Some(label) {
                s.domain = Some(label.to_owned());
            }
            s.buckets = buckets;
        }
    }

    /// Streams and buckets by domain label (streams that said no domain yet are left out).
    pub fn by_domain(&self) -> BTreeMap<String, (usize, usize)> {
        let inner = self.lock();
        let mut by_domain: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for stream in inner.streams.values() {
            if let Some(domain) = &stream.domain {
                let row = by_domain.entry(domain.clone()).or_default();
                row.0 += 1;
                row.1 += stream.buckets;
            }
        }
        by_domain
    }

    /// Takes a report of `requests` over `elapsed_s` for the member (`stream`, `canon`) of
    /// `group` (key bucket `hash`), whose policy's limit is now `limit`; members whose share
    /// changed, but for this one, are sent theirs. Returns whether this node's part of the
    /// group is known (else the caller asks the key's owner before answering).
    #[allow(clippy::too_many_arguments)]
    pub fn report(
        &self,
        stream: u64,
        group: &GroupKey,
        hash: KeyHash,
        canon: &str,
        bucket_id: &BucketId,
        limit: Quota,
        requests: u64,
        elapsed_s: f64,
        ttl_s: u64,
    ) -> bool {
        let mut inner = self.lock();
        let g = inner.groups.entry(group.clone()).or_insert_with(|| Group {
            limit,
            hash,
            node: None,
            members: BTreeMap::new(),
        });
        let mut changed = g.limit != limit;
        g.limit = limit;
        g.hash = hash;
        let id = (stream, canon.to_owned());
        let (_, member) = g.members.entry(id.clone()).or_insert_with(|| {
            changed = true;
            (bucket_id.clone(), Member::default())
        });
        changed |= member.observe(requests, elapsed_s);
        // Until this node's part is known nothing is assigned: the caller asks for it first.
        let known = g.node.is_some();
        let due = known && (changed || member.assigned.is_none());
        let pushes = if due { recompute(g, &id) } else { Vec::new() };
        send(&inner, pushes, ttl_s);
        known
    }

    /// The share of member (`stream`, `canon`) of `group` (a refusal if it is not one).
    pub fn share(&self, stream: u64, group: &GroupKey, canon: &str) -> Share {
        let inner = self.lock();
        let member = inner.groups.get(group).and_then(|g| g.members.get(&(stream, canon.to_owned())));
        member.and_then(|(_, m)| m.assigned).unwrap_or(Share::DenyAll)
    }

    /// What this node tells the keys' owners: every group with members (`only`: of these).
    pub fn demands(&self, only: Option<&HashSet<GroupKey>>) -> Vec<GroupDemand> {
        let inner = self.lock();
        let now = Instant::now();
        let groups: Box<dyn Iterator<Item = (&GroupKey, &Group)>> = match only {
            Some(only) => Box::new(only.iter().filter_map(|k| inner.groups.get_key_value(k))),
            None => Box::new(inner.groups.iter()),
        };
        groups
            .map(|(group, g)| GroupDemand {
                group: group.clone(),
                hash: g.hash,
                limit: g.limit,
                demands: g.members.values().map(|(_, m)| m.demand).collect(),
                held: g.node.map(|part| HeldPart {
                    quota: part.quota,
                    age: now.saturating_duration_since(part.at),
                    from: part.from,
                }),
            })
            .collect()
    }

    /// This node's part of `group` is now `quota`, said by the key's owner `from` (`None`: the
    /// fallback): the members' shares are recomputed and the changed ones pushed.
    pub fn set_node_quota(&self, group: &GroupKey, quota: Quota, from: Option<NodeId>, ttl_s: u64) {
        let mut inner = self.lock();
        let Some(g) = inner.groups.get_mut(group) else { return };
        let unchanged = g.node.is_some_and(|part| part.quota == quota);
        g.node = Some(NodePart { quota, from, at: Instant::now() });
        if unchanged {
            return;
        }
        let pushes = recompute(g, &(0, String::new()));
        send(&inner, pushes, ttl_s);
    }

    /// The member (`stream`, `canon`) of `group` left (abandoned, or moved to another group);
    /// the others' shares are recomputed and pushed.
    pub fn leave(&self, stream: u64, group: &GroupKey, canon: &str, ttl_s: u64) {
        let mut inner = self.lock();
        let pushes = remove(&mut inner, stream, group, canon);
        send(&inner, pushes, ttl_s);
    }

    /// The stream closed: its members leave, its sender is dropped.
    pub fn close(&self, stream: u64, members: impl IntoIterator<Item = (GroupKey, String)>, ttl_s: u64) {
        let mut inner = self.lock();
        inner.streams.remove(&stream);
        let mut pushes = Vec::new();
        for (group, canon) in members {
            pushes.extend(remove(&mut inner, stream, &group, &canon));
        }
        send(&inner, pushes, ttl_s);
    }

    /// The totals of `group`, if it has members.
    pub fn totals(&self, group: &GroupKey) -> Option<GroupTotals> {
        let inner = self.lock();
        let g = inner.groups.get(group)?;
        Some(totals(g))
    }

    /// Every group's totals, in key order (metrics, the dashboard).
    pub fn all_totals(&self) -> Vec<(GroupKey, GroupTotals)> {
        let inner = self.lock();
        let mut all: Vec<_> = inner.groups.iter().map(|(k, g)| (k.clone(), totals(g))).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

fn totals(g: &Group) -> GroupTotals {
    GroupTotals {
        members: g.members.len(),
        assigned_rate: g.members.values().filter_map(|(_, m)| m.assigned).map(Share::rate).sum(),
        limit_rate: g.limit.rate,
        node_rate: g.node.map(|part| part.quota.rate),
    }
}

fn remove(inner: &mut Inner, stream: u64, group: &GroupKey, canon: &str) -> Vec<Push> {
    let Some(g) = inner.groups.get_mut(group) else { return Vec::new() };
    if g.members.remove(&(stream, canon.to_owned())).is_none() {
        return Vec::new();
    }
    if g.members.is_empty() {
        inner.groups.remove(group);
        return Vec::new();
    }
    recompute(g, &(stream, canon.to_owned()))
}

/// Assigns every member of `g` its share; the changed ones other than `except` as pushes.
fn recompute(g: &mut Group, except: &MemberId) -> Vec<Push> {
    let shares = {
        let members: Vec<&Member> = g.members.values().map(|(_, m)| m).collect();
        let quota = g.quota();
        assign(quota.rate, quota.burst, &members)
    };
    let mut pushes = Vec::new();
    for ((id, (bucket_id, member)), share) in g.members.iter_mut().zip(shares) {
        if member.assigned == Some(share) {
            continue;
        }
        let first = member.assigned.is_none();
        member.assigned = Some(share);
        // A member not yet answered gets its share with its own report's answer.
        if id != except && !first {
            pushes.push(Push { stream: id.0, bucket_id: bucket_id.clone(), share });
        }
    }
    pushes
}

/// Sends the pushes, one response per stream. A stream whose queue is full (it does not read)
/// misses the push; its next report's answer carries the share.
fn send(inner: &Inner, pushes: Vec<Push>, ttl_s: u64) {
    let mut by_stream: BTreeMap<u64, Vec<Push>> = BTreeMap::new();
    for push in pushes {
        by_stream.entry(push.stream).or_default().push(push);
    }
    for (stream, pushes) in by_stream {
        let Some(Stream { responses, .. }) = inner.streams.get(&stream) else { continue };
        let _ = responses.try_send(Ok(super::response(
            pushes.iter().map(|p| super::assignment(p.bucket_id.clone(), p.share, ttl_s)),
        )));
    }
}
