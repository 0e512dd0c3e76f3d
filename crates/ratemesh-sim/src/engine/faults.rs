//! Scheduled faults: crashes and restarts, graceful leaves and rejoins, partitions, and loss
//! between regions.

use super::{Event, Phase, World};
use crate::error::SimError;
use crate::network::{one_way_links, partition_links};
use crate::rng::below;
use crate::scenario::{FaultConfig, NodeTarget, Scenario, region_sides};

/// A fault, or the second half of one (a restart, a heal), due at an instant.
pub(super) enum FaultEvent {
    /// Crash a node; restart it later if asked.
    Crash { node: NodeTarget, restart_after_ms: Option<u64> },
    /// A new incarnation of a crashed node.
    Restart { node: u32 },
    /// A node leaves gracefully; joins again later if asked.
    Leave { node: NodeTarget, rejoin_after_ms: Option<u64> },
    /// A leaving node's linger is over: it stops (unless it rejoined since).
    Stop { node: u32, incarnation: u64 },
    /// A node that left joins again.
    Rejoin { node: u32 },
    /// Links are cut.
    CutStart { id: u64, links: Vec<(u32, u32)> },
    /// The cut `id` heals.
    CutEnd { id: u64 },
    /// Links get lossier.
    SpellStart { id: u64, links: Vec<(u32, u32)>, loss: f64 },
    /// The lossy spell `id` ends.
    SpellEnd { id: u64 },
}

/// Every fault of `scenario`, with its virtual time in nanoseconds, in file order.
pub(super) fn schedule(scenario: &Scenario) -> Vec<(u64, FaultEvent)> {
    let mut events = Vec::new();
    for (index, fault) in scenario.faults.iter().enumerate() {
        let id = index as u64;
        match fault {
            FaultConfig::Crash { at_ms, node, restart_after_ms } => {
                let event = FaultEvent::Crash { node: node.clone(), restart_after_ms: *restart_after_ms };
                events.push((ms(*at_ms), event));
            }
            FaultConfig::Leave { at_ms, node, rejoin_after_ms } => {
                let event = FaultEvent::Leave { node: node.clone(), rejoin_after_ms: *rejoin_after_ms };
                events.push((ms(*at_ms), event));
            }
            FaultConfig::Partition { start_ms, end_ms, groups } => {
                events.push((ms(*start_ms), FaultEvent::CutStart { id, links: partition_links(groups) }));
                events.push((ms(*end_ms), FaultEvent::CutEnd { id }));
            }
            FaultConfig::OneWay { start_ms, end_ms, from, to } => {
                events.push((ms(*start_ms), FaultEvent::CutStart { id, links: one_way_links(from, to) }));
                events.push((ms(*end_ms), FaultEvent::CutEnd { id }));
            }
            FaultConfig::RegionPartition { start_ms, end_ms, regions, groups } => {
                let links = partition_links(&region_node_groups(scenario, regions, groups));
                events.push((ms(*start_ms), FaultEvent::CutStart { id, links }));
                events.push((ms(*end_ms), FaultEvent::CutEnd { id }));
            }
            FaultConfig::RegionLoss { start_ms, end_ms, regions, groups, loss } => {
                let links = partition_links(&region_node_groups(scenario, regions, groups));
                events.push((ms(*start_ms), FaultEvent::SpellStart { id, links, loss: *loss }));
                events.push((ms(*end_ms), FaultEvent::SpellEnd { id }));
            }
            FaultConfig::CrashChurn { start_ms, end_ms, every_ms, down_ms, nodes } => {
                let nodes: Vec<u32> =
                    if nodes.is_empty() { (0..scenario.nodes).rev().collect() } else { nodes.clone() };
                let crashes = (*start_ms..*end_ms).step_by(*every_ms as usize);
                for (turn, at_ms) in crashes.enumerate() {
                    let node = NodeTarget::Id(nodes[turn % nodes.len()]);
                    events.push((ms(at_ms), FaultEvent::Crash { node, restart_after_ms: Some(*down_ms) }));
                }
            }
            FaultConfig::Churn { start_ms, end_ms, every_ms, down_ms, nodes } => {
                let nodes: Vec<u32> =
                    if nodes.is_empty() { (0..scenario.nodes).rev().collect() } else { nodes.clone() };
                let leaves = (*start_ms..*end_ms).step_by(*every_ms as usize);
                for (turn, at_ms) in leaves.enumerate() {
                    let node = NodeTarget::Id(nodes[turn % nodes.len()]);
                    events.push((ms(at_ms), FaultEvent::Leave { node, rejoin_after_ms: Some(*down_ms) }));
                }
            }
        }
    }
    events
}

/// The nodes on each side of a region fault (validation requires `[network.regions]`).
fn region_node_groups(scenario: &Scenario, regions: &[u32], groups: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let Some(config) = &scenario.network.regions else { return Vec::new() };
    config.node_groups(&region_sides(regions, groups, config.count), scenario.nodes)
}

/// The virtual time of `at_ms`, in nanoseconds.
fn ms(at_ms: u64) -> u64 {
    at_ms.saturating_mul(1_000_000)
}

impl World<'_> {
    pub(super) fn on_fault(&mut self, fault: FaultEvent) -> Result<(), SimError> {
        match fault {
            FaultEvent::Crash { node, restart_after_ms } => self.crash(&node, restart_after_ms),
            FaultEvent::Restart { node } => self.restart(node),
            FaultEvent::Leave { node, rejoin_after_ms } => self.leave(&node, rejoin_after_ms),
            FaultEvent::Stop { node, incarnation } => {
                let slot = &self.slots[node as usize];
                if slot.phase == Phase::Leaving && slot.incarnation == incarnation {
                    self.stop_left(node);
                }
                Ok(())
            }
            FaultEvent::Rejoin { node } => self.rejoin(node),
            FaultEvent::CutStart { id, links } => {
                self.log.line(format_args!("{} F cut#{id} {} links", self.now, links.len()));
                self.network.add_cut(id, links);
                self.close_measurement();
                self.reality_changed()
            }
            FaultEvent::CutEnd { id } => {
                self.log.line(format_args!("{} F heal cut#{id}", self.now));
                self.network.remove_cut(id);
                self.close_measurement();
                self.convergence.heal();
                self.reality_changed()
            }
            FaultEvent::SpellStart { id, links, loss } => {
                self.log.line(format_args!("{} F loss#{id} {} links +{loss}", self.now, links.len()));
                self.network.add_spell(id, links, loss);
                Ok(())
            }
            FaultEvent::SpellEnd { id } => {
                self.log.line(format_args!("{} F end loss#{id}", self.now));
                self.network.remove_spell(id);
                Ok(())
            }
        }
    }

    fn crash(&mut self, target: &NodeTarget, restart_after_ms: Option<u64>) -> Result<(), SimError> {
        let Some(node) = self.resolve(target) else {
            self.log.line(format_args!("{} F crash {target:?}: no running node", self.now));
            return Ok(());
        };
        self.log.line(format_args!("{} F crash n{node}", self.now));
        self.kill(node);
        self.membership.set_up(node, false);
        self.close_measurement();
        if let Some(after) = restart_after_ms {
            self.queue
                .push(self.now.saturating_add(ms(after)), Event::Fault(FaultEvent::Restart { node }))?;
        }
        self.reality_changed()
    }

    fn restart(&mut self, node: u32) -> Result<(), SimError> {
        if self.slots[node as usize].phase != Phase::Down || !self.membership.is_joined(node) {
            return Ok(());
        }
        self.log.line(format_args!("{} F restart n{node}", self.now));
        self.membership.set_up(node, true);
        self.spawn(node)?;
        self.close_measurement();
        self.convergence.heal();
        self.reality_changed()
    }

    fn leave(&mut self, target: &NodeTarget, rejoin_after_ms: Option<u64>) -> Result<(), SimError> {
        let Some(node) = self.resolve(target) else {
            self.log.line(format_args!("{} F leave {target:?}: no running node", self.now));
            return Ok(());
        };
        self.log.line(format_args!("{} F leave n{node}", self.now));
        self.membership.set_joined(node, false);
        self.membership.reset_observer(node, &self.network);
        // The node keeps owning while the others' views drop it, then hands over and drains
        // within what is left of the linger; the engine stops it when it says it is done.
        let linger = ms(self.scenario.membership.leave_linger_ms);
        let own_for = ms(self.scenario.membership.leave_delay_ms).min(linger);
        let local = self.local_now(node);
        if let Some(n) = self.node_mut(node) {
            n.handle_leave(local, own_for, linger - own_for);
        }
        let slot = &mut self.slots[node as usize];
        slot.phase = Phase::Leaving;
        let stop = FaultEvent::Stop { node, incarnation: slot.incarnation };
        self.queue.push(self.now.saturating_add(linger), Event::Fault(stop))?;
        if let Some(after) = rejoin_after_ms {
            self.queue.push(self.now.saturating_add(ms(after)), Event::Fault(FaultEvent::Rejoin { node }))?;
        }
        self.close_measurement();
        self.deliver_view(node)?;
        self.reality_changed()
    }

    fn rejoin(&mut self, node: u32) -> Result<(), SimError> {
        if self.membership.is_joined(node) {
            return Ok(());
        }
        if self.slots[node as usize].phase != Phase::Down {
            self.kill(node);
        }
        self.log.line(format_args!("{} F rejoin n{node}", self.now));
        self.membership.set_joined(node, true);
        self.membership.set_up(node, true);
        self.spawn(node)?;
        self.close_measurement();
        self.convergence.heal();
        self.reality_changed()
    }

    /// The running node a fault hits, if any.
    fn resolve(&mut self, target: &NodeTarget) -> Option<u32> {
        let running: Vec<u32> =
            (0..self.scenario.nodes).filter(|n| self.slots[*n as usize].phase == Phase::Running).collect();
        match target {
            NodeTarget::Id(node) => running.contains(node).then_some(*node),
            NodeTarget::Named(name) if name == "random" => {
                let pick = below(&mut self.faults_rng, running.len() as u64) as usize;
                running.get(pick).copied()
            }
            NodeTarget::Named(_) => {
                let observer = *running.first()?;
                let key = self.keys[0];
                let owner = self.node_mut(observer).and_then(|n| n.owner_of(key));
                owner.filter(|o| running.contains(o)).or(Some(observer))
            }
        }
    }
}
