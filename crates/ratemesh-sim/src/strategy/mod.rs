//! Strategies: the node logic under test, behind one object-safe trait with the shape of
//! `ratemesh_core::Node`'s API (`handle_*` inputs, `poll_*` outputs drained after every input).
//!
//! The baselines (`gubernator`, `crdt`, `static`) reimplement the field's known designs on
//! `ratemesh_core::Bucket`; `ratemesh-exact` and `ratemesh-approx` drive the real core node. Only
//! the ratemesh strategies know regions (`[network.regions]`); the baselines ignore them and run
//! as one cluster over the same network. Every
//! strategy of a run sees the same scenario, seed, workload and fault schedule.

pub mod codec;
mod crdt;
mod gubernator;
mod ratemesh;
pub mod ring;
mod static_split;

use std::collections::HashMap;
use std::rc::Rc;

use ratemesh_core::{Instant, KeyHash, Limit, Mode, PolicyRegion};

pub use crdt::Crdt;
pub use gubernator::Gubernator;
pub use ratemesh::Ratemesh;
pub(crate) use ratemesh::node_config;
pub use ratemesh::{audit_of, member_view, region_id, setup_config};
pub use static_split::StaticSplit;

use crate::error::SimError;
use crate::scenario::NodeSettings;

/// The policies of a run and which key is under which (looked up by key hash, never iterated).
#[derive(Clone, Debug)]
pub struct PolicyTable {
    /// Every policy's limit, in scenario order.
    pub limits: Vec<Limit>,
    /// Whether the `ratemesh` strategy runs policy `i` in exact mode.
    pub exact: Vec<bool>,
    /// Policy `i`'s terms between regions (the defaults where it sets none).
    pub regions: Vec<PolicyRegion>,
    by_key: HashMap<KeyHash, usize>,
}

impl PolicyTable {
    /// `limits`, with `keys[i]` under policy `policy_of(i)`.
    pub fn new(
        limits: Vec<Limit>,
        exact: Vec<bool>,
        keys: &[KeyHash],
        policy_of: impl Fn(u32) -> usize,
    ) -> PolicyTable {
        let by_key = keys.iter().enumerate().map(|(i, key)| (*key, policy_of(i as u32))).collect();
        let regions = vec![PolicyRegion::default(); limits.len()];
        PolicyTable { limits, exact, regions, by_key }
    }

    /// The same policies with their terms between regions, `regions[i]` policy `i`'s.
    pub fn with_regions(self, regions: Vec<PolicyRegion>) -> PolicyTable {
        PolicyTable { regions, ..self }
    }

    /// One policy for every key.
    pub fn single(limit: Limit) -> PolicyTable {
        let regions = vec![PolicyRegion::default()];
        PolicyTable { limits: vec![limit], exact: vec![false], regions, by_key: HashMap::new() }
    }

    /// The policy index of `key` (keys outside the workload: policy 0).
    pub fn index(&self, key: KeyHash) -> usize {
        self.by_key.get(&key).copied().unwrap_or(0)
    }

    /// The limit of `key`.
    pub fn limit(&self, key: KeyHash) -> &Limit {
        &self.limits[self.index(key)]
    }
}

/// A client's check, as the simulator hands it to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Check {
    /// Unique in the run; echoed by [`SimNode::poll_decided`] for pending checks.
    pub id: u64,
    /// The bucket.
    pub key: KeyHash,
    /// Hits.
    pub cost: u64,
}

/// The immediate answer to a [`Check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted now.
    Allowed,
    /// Refused now.
    Refused,
    /// Decided later, through [`SimNode::poll_decided`].
    Pending,
}

/// Bytes for a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The destination node.
    pub to: u32,
    /// One encoded message.
    pub bytes: Vec<u8>,
}

/// A node's membership view (node numbers, ascending).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Members believed alive (the node itself included, unless it is leaving).
    pub live: Vec<u32>,
    /// Members believed failed, not yet forgotten: they own nothing but count in the cluster size.
    pub dead: Vec<u32>,
}

/// One node of a strategy, driven by the simulator. Same contract as `ratemesh_core::Node`: after
/// every `handle_*` call the driver drains [`SimNode::poll_transmit`] and
/// [`SimNode::poll_decided`], then asks [`SimNode::poll_timeout`]. `now` is the node's local clock.
pub trait SimNode {
    /// A client's check.
    fn handle_check(&mut self, now: Instant, check: Check) -> Verdict;
    /// Bytes from a peer (malformed bytes are dropped and counted, never a panic).
    fn handle_frame(&mut self, now: Instant, from: u32, bytes: &[u8]);
    /// A new membership view.
    fn handle_membership(&mut self, now: Instant, view: &View);
    /// The instant from [`SimNode::poll_timeout`] has come.
    fn handle_timeout(&mut self, now: Instant);
    /// The next message to send.
    fn poll_transmit(&mut self) -> Option<Outgoing>;
    /// The next decision of a pending check: `(check id, allowed)`. Strategies that decide every
    /// check at once have none.
    fn poll_decided(&mut self) -> Option<(u64, bool)> {
        None
    }
    /// When [`SimNode::handle_timeout`] should be called next (local clock).
    fn poll_timeout(&self) -> Option<Instant>;
    /// The owner of `key` in this node's view.
    fn owner_of(&self, key: KeyHash) -> Option<u32>;
    /// The node starts a graceful leave: it keeps owning its keys for `own_for_nanos` (while the
    /// others' views drop it), then hands them over and drains. Strategies without a leave phase
    /// ignore it (the engine stops them after the linger).
    fn handle_leave(&mut self, now: Instant, own_for_nanos: u64, drain_for_nanos: u64) {
        let _ = (now, own_for_nanos, drain_for_nanos);
    }
    /// Whether a leave started with [`SimNode::handle_leave`] is complete (the engine stops the
    /// node at once).
    fn has_left(&self) -> bool {
        false
    }
    /// Whether the node takes client checks at `now` (clients go to another node otherwise).
    fn is_serving(&self, now: Instant) -> bool {
        let _ = now;
        true
    }
    /// The closed audit windows of `key` this node keeps as its owner (the core's
    /// `Node::audit_windows`); strategies without an audit keep none.
    fn audit_windows(&self, key: KeyHash) -> Vec<ratemesh_core::AuditWindow> {
        let _ = key;
        Vec::new()
    }
    /// Nothing in fallback and nothing handed off pending. Strategies without a fallback are
    /// always settled.
    fn is_settled(&self) -> bool {
        true
    }
}

/// What a strategy needs to create one node.
#[derive(Clone, Debug)]
pub struct NodeSetup {
    /// The node's number.
    pub id: u32,
    /// 1 at start; +1 per restart or rejoin.
    pub incarnation: u64,
    /// The limit of every key.
    pub policies: Rc<PolicyTable>,
    /// Node settings (the ratemesh strategies; the baselines ignore them).
    pub settings: NodeSettings,
    /// The sync period.
    pub sync_interval_ms: u64,
    /// How many regions (node `n` is in region `n % count`; `None`: one region). The baselines
    /// ignore it.
    pub regions: Option<u32>,
    /// How long a (re)started node takes no client checks (0 at the start of a run).
    pub join_grace_ms: u64,
    /// Seeds the node's own randomness.
    pub seed: u64,
    /// The node's local clock at creation.
    pub now: Instant,
}

/// The strategies the simulator knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StrategyKind {
    /// Gubernator GLOBAL: local buckets start full, the owner's broadcasts overwrite them.
    Gubernator,
    /// Limitador distributed: every node decides alone from merged G-counters.
    Crdt,
    /// limit / live members, enforced by each node alone.
    Static,
    /// `ratemesh_core::Node` in exact mode (checks forwarded to the owner).
    RatemeshExact,
    /// `ratemesh_core::Node` in approximate mode (local decisions from owner grants).
    RatemeshApprox,
    /// `ratemesh_core::Node`, each policy in its own `mode` (default approximate).
    Ratemesh,
}

impl StrategyKind {
    /// Every strategy, in report order.
    pub const ALL: [StrategyKind; 5] = [
        StrategyKind::Gubernator,
        StrategyKind::Crdt,
        StrategyKind::Static,
        StrategyKind::RatemeshExact,
        StrategyKind::RatemeshApprox,
    ];

    /// Every strategy a scenario may name (`ALL` plus `ratemesh`, which runs each policy in its own
    /// mode).
    pub const KNOWN: [StrategyKind; 6] = [
        StrategyKind::Gubernator,
        StrategyKind::Crdt,
        StrategyKind::Static,
        StrategyKind::RatemeshExact,
        StrategyKind::RatemeshApprox,
        StrategyKind::Ratemesh,
    ];

    /// The name used in scenario files, on the command line and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            StrategyKind::Gubernator => "gubernator",
            StrategyKind::Crdt => "crdt",
            StrategyKind::Static => "static",
            StrategyKind::RatemeshExact => "ratemesh-exact",
            StrategyKind::RatemeshApprox => "ratemesh-approx",
            StrategyKind::Ratemesh => "ratemesh",
        }
    }

    /// The strategy called `name`.
    pub fn from_name(name: &str) -> Result<StrategyKind, SimError> {
        StrategyKind::KNOWN
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| SimError::UnknownStrategy(name.into()))
    }

    /// The known names, comma-separated (for messages).
    pub fn known_names() -> String {
        StrategyKind::KNOWN.map(StrategyKind::name).join(", ")
    }

    /// Whether the strategy needs a limit of the token bucket family (token bucket, GCRA, shaper).
    pub const fn needs_tat_limit(self) -> bool {
        matches!(self, StrategyKind::Gubernator | StrategyKind::Crdt)
    }

    /// A new node of this strategy.
    pub fn build(self, setup: NodeSetup) -> Box<dyn SimNode> {
        match self {
            StrategyKind::Gubernator => Box::new(Gubernator::new(setup)),
            StrategyKind::Crdt => Box::new(Crdt::new(setup)),
            StrategyKind::Static => Box::new(StaticSplit::new(setup)),
            StrategyKind::RatemeshExact => Box::new(Ratemesh::new(setup, Some(Mode::Exact))),
            StrategyKind::RatemeshApprox => Box::new(Ratemesh::new(setup, Some(Mode::Approximate))),
            StrategyKind::Ratemesh => Box::new(Ratemesh::new(setup, None)),
        }
    }

    /// The kind of one message this strategy sent, for traffic accounting: the core frame's first
    /// section (`ratemesh_core::wire::frame_kind`), or the baseline message's variant.
    pub fn message_kind(self, bytes: &[u8]) -> &'static str {
        match self {
            StrategyKind::RatemeshExact | StrategyKind::RatemeshApprox | StrategyKind::Ratemesh => {
                ratemesh_core::wire::frame_kind(bytes).unwrap_or("malformed")
            }
            _ => match codec::decode(bytes) {
                Some(codec::Message::Hits(_)) => "hits",
                Some(codec::Message::Globals(_)) => "globals",
                Some(codec::Message::Counters(_)) => "counters",
                None => "malformed",
            },
        }
    }
}

/// A periodic wakeup with a per-node phase (nodes do not sync in lockstep).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticker {
    next: Instant,
    interval_nanos: u64,
}

impl Ticker {
    /// First tick at `now + phase`, with `phase` in `1..=interval` drawn from `seed`.
    pub(crate) fn new(now: Instant, interval_ms: u64, seed: u64) -> Ticker {
        let interval_nanos = interval_ms.saturating_mul(1_000_000).max(1);
        let phase = seed % interval_nanos + 1;
        Ticker { next: now.add_nanos(phase), interval_nanos }
    }

    /// Whether a tick is due at `now`; if so, the next one is scheduled after `now`.
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        let missed = now.nanos_since(self.next) / self.interval_nanos;
        self.next = self.next.add_nanos((missed + 1) * self.interval_nanos);
        true
    }

    /// The next tick.
    pub(crate) fn next(&self) -> Instant {
        self.next
    }
}

/// Nanoseconds per hit of a token-bucket-family limit: `ceil(period / limit)`, as the core uses.
pub(crate) fn interval_nanos(limit: &Limit) -> u64 {
    let period = ratemesh_core::duration_nanos(limit.spec().period);
    period.div_ceil(limit.spec().limit.max(1)).max(1)
}
