//! The real thing: `ratemesh_core::Node`, in exact or approximate mode, with the local-share
//! fallback. The adapter only converts types; every decision is the core's.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ratemesh_core::{
    Audit, CheckOutcome, CheckRequest, Event, Fallback, Instant, KeyHash, LeavePlan, MemberView, Mode, Node,
    NodeConfig, NodeId, Policy, RegionFallback, RegionId, RequestId,
};

use super::{Check, NodeSetup, Outgoing, PolicyTable, SimNode, Verdict, View};
use crate::scenario::NodeSettings;

/// One ratemesh node driven by the simulator.
#[derive(Debug)]
pub struct Ratemesh {
    node: Node,
    /// Every policy of the run, with its mode and the scenario's fallback.
    policies: Vec<Arc<Policy>>,
    table: std::rc::Rc<PolicyTable>,
    decided: VecDeque<(u64, bool)>,
    left: bool,
    /// How many regions (node `n` is in region `n % count`; `None`: one region).
    regions: Option<u32>,
}

impl Ratemesh {
    /// A node of `setup` enforcing the scenario's policies in `mode` (`None`: each policy's own
    /// mode), with the scenario's node settings and fallback.
    pub fn new(setup: NodeSetup, mode: Option<Mode>) -> Ratemesh {
        let config = setup_config(&setup);
        let node = Node::new(NodeId(u64::from(setup.id)), setup.incarnation, config, setup.seed, setup.now)
            // `Scenario::validate` checked the same settings (the join grace is not validated).
            .expect("node settings validated with the scenario");
        let fallback = match setup.settings.fallback.as_deref() {
            Some("fail_open") => Fallback::FailOpen,
            Some("fail_closed") => Fallback::FailClosed,
            _ => Fallback::LocalShare,
        };
        let table = setup.policies;
        let policies = table
            .limits
            .iter()
            .zip(&table.exact)
            .zip(&table.regions)
            .enumerate()
            .map(|(index, ((limit, exact), region))| {
                let own = if *exact { Mode::Exact } else { Mode::Approximate };
                let audit = audit_of(index);
                Arc::new(Policy {
                    limit: limit.clone(),
                    mode: mode.unwrap_or(own),
                    fallback,
                    audit,
                    region: *region,
                })
            })
            .collect();
        Ratemesh { node, policies, table, decided: VecDeque::new(), left: false, regions: setup.regions }
    }

    /// The wrapped core node (for tests that inspect its counters).
    pub fn node(&self) -> &Node {
        &self.node
    }
}

impl SimNode for Ratemesh {
    fn handle_check(&mut self, now: Instant, check: Check) -> Verdict {
        let request = CheckRequest {
            id: RequestId(check.id),
            key: check.key,
            policy: Arc::clone(&self.policies[self.table.index(check.key)]),
            cost: check.cost,
        };
        match self.node.handle_check(now, request) {
            CheckOutcome::Decided(decision) if decision.allowed => Verdict::Allowed,
            CheckOutcome::Decided(_) | CheckOutcome::Unavailable => Verdict::Refused,
            CheckOutcome::Pending => Verdict::Pending,
        }
    }

    fn handle_frame(&mut self, now: Instant, from: u32, bytes: &[u8]) {
        self.node.handle_frame(now, NodeId(u64::from(from)), bytes);
    }

    fn handle_membership(&mut self, now: Instant, view: &View) {
        let ids = |nodes: &[u32]| nodes.iter().map(|n| NodeId(u64::from(*n))).collect();
        let regions = match self.regions {
            Some(count) => view
                .live
                .iter()
                .chain(&view.dead)
                .map(|n| (NodeId(u64::from(*n)), region_id(n % count.max(1))))
                .collect(),
            None => Vec::new(),
        };
        self.node
            .handle_membership(now, MemberView { live: ids(&view.live), dead: ids(&view.dead), regions });
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.node.handle_timeout(now);
    }

    fn poll_transmit(&mut self) -> Option<Outgoing> {
        let transmit = self.node.poll_transmit()?;
        // A destination outside u32 is no simulated node: the engine drops and logs it.
        let to = u32::try_from(transmit.to.0).unwrap_or(u32::MAX);
        Some(Outgoing { to, bytes: transmit.bytes })
    }

    fn poll_decided(&mut self) -> Option<(u64, bool)> {
        while let Some(event) = self.node.poll_event() {
            match event {
                Event::Decided { id, decision } => self.decided.push_back((id.0, decision.allowed)),
                Event::Left => self.left = true,
            }
        }
        self.decided.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.node.poll_timeout()
    }

    fn owner_of(&self, key: KeyHash) -> Option<u32> {
        self.node.owner_of(key).and_then(|id| u32::try_from(id.0).ok())
    }

    fn is_settled(&self) -> bool {
        self.node.is_settled()
    }

    fn audit_windows(&self, key: KeyHash) -> Vec<ratemesh_core::AuditWindow> {
        self.node.audit_windows(key)
    }

    fn handle_leave(&mut self, now: Instant, own_for_nanos: u64, drain_for_nanos: u64) {
        let plan = LeavePlan {
            own_for: Duration::from_nanos(own_for_nanos),
            drain_for: Duration::from_nanos(drain_for_nanos),
        };
        self.node.handle_leave(now, plan);
    }

    fn has_left(&self) -> bool {
        self.left
    }

    fn is_serving(&self, now: Instant) -> bool {
        self.node.is_serving(now)
    }
}

/// The core's configuration with the scenario's settings over its defaults.
/// The core node's configuration from a scenario's `[node]` settings.
pub(crate) fn node_config(settings: &NodeSettings, sync_interval_ms: u64, join_grace_ms: u64) -> NodeConfig {
    let defaults = NodeConfig::default();
    let ms = |value: Option<u64>, default: Duration| value.map_or(default, Duration::from_millis);
    NodeConfig {
        sync_interval: Duration::from_millis(sync_interval_ms),
        forward_batch_len_max: settings.forward_batch_len_max.unwrap_or(defaults.forward_batch_len_max),
        forward_wait: settings.forward_wait_us.map_or(defaults.forward_wait, Duration::from_micros),
        forward_timeout: ms(settings.forward_timeout_ms, defaults.forward_timeout),
        pending_forwards_max: settings.pending_forwards_max.unwrap_or(defaults.pending_forwards_max),
        sync_batch_len_max: settings.sync_batch_len_max.unwrap_or(defaults.sync_batch_len_max),
        peer_silence: ms(settings.peer_silence_ms, defaults.peer_silence),
        unacked_frames_max: settings.unacked_frames_max.unwrap_or(defaults.unacked_frames_max),
        retransmit_initial: ms(settings.retransmit_initial_ms, defaults.retransmit_initial),
        replicate: settings.replicate.unwrap_or(defaults.replicate),
        ring_vnodes: settings.ring_vnodes.unwrap_or(defaults.ring_vnodes),
        allowance_min: settings.allowance_min.unwrap_or(defaults.allowance_min),
        region_sync_interval: ms(settings.region_sync_interval_ms, defaults.region_sync_interval),
        region_lease: ms(settings.region_lease_ms, defaults.region_lease),
        region_fallback: settings
            .region_fallback
            .as_deref()
            .and_then(RegionFallback::from_name)
            .unwrap_or(defaults.region_fallback),
        // A restarted node serves once the others' views include it (the membership model's
        // join delay), as the library waits for gossip to spread.
        join_grace: Duration::from_millis(join_grace_ms),
        ..defaults
    }
}

/// How the ratemesh strategies audit policy `index` of a scenario: on, in group `index`, over the
/// limit's default window (`crate::audit` compares the owners' windows with the oracle).
pub fn audit_of(index: usize) -> Audit {
    Audit::On { group: index as u64, window: None }
}

/// The core node's configuration for `setup`: its `[node]` settings and, with regions, its own
/// region (node `n` in region `n % count`).
pub fn setup_config(setup: &NodeSetup) -> NodeConfig {
    let mut config = node_config(&setup.settings, setup.sync_interval_ms, setup.join_grace_ms);
    config.region = setup.regions.map_or(RegionId::NONE, |count| region_id(setup.id % count.max(1)));
    config
}

/// The core's view of `view`; with `regions` regions, the region of every member, live or dead.
pub fn member_view(view: &View, regions: Option<u32>) -> MemberView {
    let ids = |nodes: &[u32]| nodes.iter().map(|n| NodeId(u64::from(*n))).collect();
    let members = view.live.iter().chain(&view.dead);
    let regions = regions.map_or(Vec::new(), |count| {
        members.map(|n| (NodeId(u64::from(*n)), region_id(n % count.max(1)))).collect()
    });
    MemberView { live: ids(&view.live), dead: ids(&view.dead), regions }
}

/// The core's id of simulated region `region`: `RegionId::from_name("region-<region>")`.
pub fn region_id(region: u32) -> RegionId {
    RegionId::from_name(&format!("region-{region}"))
}
