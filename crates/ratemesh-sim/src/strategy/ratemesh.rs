//! The real thing: `ratemesh_core::Node`, in exact or approximate mode, with the local-share
//! fallback. The adapter only converts types; every decision is the core's.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ratemesh_core::{
    CheckOutcome, CheckRequest, Event, Fallback, Instant, KeyHash, LeavePlan, MemberView, Mode, Node,
    NodeConfig, NodeId, Policy, RequestId,
};

use super::{Check, NodeSetup, Outgoing, SimNode, Verdict, View};

/// One ratemesh node driven by the simulator.
#[derive(Debug)]
pub struct Ratemesh {
    node: Node,
    policy: Arc<Policy>,
    decided: VecDeque<(u64, bool)>,
    left: bool,
}

impl Ratemesh {
    /// A node of `setup` enforcing the scenario's limit in `mode` with [`Fallback::LocalShare`].
    pub fn new(setup: NodeSetup, mode: Mode) -> Ratemesh {
        let config = NodeConfig {
            sync_interval: Duration::from_millis(setup.sync_interval_ms),
            // A restarted node serves once the others' views include it (the membership model's
            // join delay), as the library waits for gossip to spread.
            join_grace: Duration::from_millis(setup.join_grace_ms),
            ..NodeConfig::default()
        };
        let node = Node::new(NodeId(u64::from(setup.id)), setup.incarnation, config, setup.seed, setup.now);
        let policy = Arc::new(Policy { limit: setup.limit, mode, fallback: Fallback::LocalShare });
        Ratemesh { node, policy, decided: VecDeque::new(), left: false }
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
            policy: Arc::clone(&self.policy),
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
        self.node.handle_membership(now, MemberView { live: ids(&view.live), dead: ids(&view.dead) });
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
