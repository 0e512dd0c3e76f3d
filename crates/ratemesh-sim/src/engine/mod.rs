//! The discrete-event engine: one [`World`] per strategy run.
//!
//! Virtual time jumps from event to event (a heap ordered by time, then scheduling order). The
//! world owns the nodes, their clocks, the network, the membership model, the workload and the
//! oracle. Every event is one line in the event log. After every event the convergence checker
//! looks at the cluster (see `convergence.rs`). Nothing here reads a clock, spawns a thread or
//! iterates a hash map: the same scenario and seed give the same run, bit for bit.

mod convergence;
mod faults;
mod log;
mod queue;

use std::collections::BTreeMap;
use std::rc::Rc;

use ratemesh_core::{Instant, KeyHash, Namespace};

use self::convergence::Convergence;
use self::faults::FaultEvent;
use self::log::EventLog;
pub use self::log::LogSink;
use self::queue::EventQueue;
use crate::audit::{AuditComparison, AuditLens, COLLECT_EVERY_NANOS};
use crate::clock::NodeClock;
use crate::error::SimError;
use crate::membership::{Membership, PendingView};
use crate::metrics::Recorder;
use crate::network::{Network, NetworkStats, NodeTraffic};
use crate::oracle::Oracle;
use crate::rng::{SimRng, substream, substream_seed, unit};
use crate::scenario::Scenario;
use crate::strategy::{Check, NodeSetup, Outgoing, PolicyTable, SimNode, StrategyKind, Verdict};
use crate::workload::{Arrival, Workload};

/// How long after the end of a run checks still pending may be decided.
pub const END_DRAIN_NANOS: u64 = 1_000_000_000;

/// The namespace of the simulated keys.
pub const KEY_NAMESPACE: &[u8] = b"ratemesh-sim";

/// The key hash of workload key `index`.
pub fn key_hash(index: u32) -> KeyHash {
    Namespace::new(KEY_NAMESPACE).key(format!("key-{index}").as_bytes())
}

/// Something that happens at an instant of virtual time.
enum Event {
    Arrival(Arrival),
    Deliver { from: u32, to: u32, bytes: Rc<[u8]> },
    Timer { node: u32, token: u64 },
    View(PendingView),
    Fault(FaultEvent),
}

/// Where a node's process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// In the cluster, taking checks.
    Running,
    /// Left the cluster; still handles frames and timers until it stops.
    Leaving,
    /// Not running (crashed, or stopped after leaving).
    Down,
}

/// A check waiting for its decision.
#[derive(Clone, Copy, Debug)]
struct PendingCheck {
    at_nanos: u64,
    key: u32,
    /// The node the client sent it to.
    origin: u32,
    cost: u64,
    ideal: bool,
}

/// One node's machine: the process (if running), its clock and the driver's bookkeeping.
struct Slot {
    node: Option<Box<dyn SimNode>>,
    phase: Phase,
    incarnation: u64,
    clock: NodeClock,
    /// The wakeup scheduled for this node: (virtual time, token).
    timer: Option<(u64, u64)>,
    timer_token: u64,
    /// The last virtual instant the node's timer fired at, and how often in a row.
    repeat: (u64, u32),
    pending: BTreeMap<u64, PendingCheck>,
}

/// What one strategy's run produced, before it is summarised into a report.
#[derive(Clone, Debug)]
pub struct RunOutput {
    /// The strategy.
    pub strategy: StrategyKind,
    /// Admitted and ideal hits.
    pub recorder: Recorder,
    /// Convergence time after each heal that converged, in nanoseconds.
    pub convergence_nanos: Vec<u64>,
    /// Heals after which the cluster had not converged before the next fault or the end.
    pub unconverged: u32,
    /// Traffic sent per node.
    pub traffic: Vec<NodeTraffic>,
    /// Messages and bytes sent, by message kind ([`StrategyKind::message_kind`]).
    pub traffic_by_kind: BTreeMap<&'static str, (u64, u64)>,
    /// Network counters.
    pub network: NetworkStats,
    /// Traffic from region `a` to region `b`, by `(a, b)` (empty without regions).
    pub region_traffic: Vec<((u32, u32), NodeTraffic)>,
    /// Events processed.
    pub events: u64,
    /// Digest of the event log.
    pub digest: u64,
    /// The owners' audit windows lined up with the simulator's counts (a world
    /// [`World::with_audit`]).
    pub audit: Option<AuditComparison>,
}

/// The simulated world of one strategy run. See the module documentation.
pub struct World<'a> {
    scenario: &'a Scenario,
    strategy: StrategyKind,
    seed: u64,
    policies: Rc<PolicyTable>,
    keys: Vec<KeyHash>,
    traffic_by_kind: BTreeMap<&'static str, (u64, u64)>,
    now: u64,
    events: u64,
    queue: EventQueue<Event>,
    slots: Vec<Slot>,
    network: Network,
    membership: Membership,
    workload: Workload,
    oracle: Oracle,
    recorder: Recorder,
    convergence: Convergence,
    faults_rng: SimRng,
    next_check_id: u64,
    pending_total: usize,
    log: EventLog<'a>,
    /// Counts for the comparison with the owners' audit, and the windows collected.
    audit: Option<AuditLens>,
    /// When the audit windows are collected next (virtual time).
    next_collect: u64,
}

impl<'a> World<'a> {
    /// A world running `strategy` on `scenario` with `seed`; every line of its event log also
    /// goes to `sink`.
    pub fn new(
        scenario: &'a Scenario,
        strategy: StrategyKind,
        seed: u64,
        sink: Option<LogSink<'a>>,
    ) -> Result<World<'a>, SimError> {
        let limits = scenario.limits()?;
        let keys: Vec<KeyHash> = (0..scenario.workload.keys).map(key_hash).collect();
        let exact = (0..limits.len()).map(|i| scenario.policy_mode_exact(i)).collect();
        let policy_of = |key: u32| scenario.policy_of_key(key);
        let regions = (0..limits.len()).map(|i| scenario.policy_region(i)).collect();
        let policies =
            Rc::new(PolicyTable::new(limits.clone(), exact, &keys, policy_of).with_regions(regions));
        let mut clock_rng = substream(seed, "clock", 0);
        let slots = (0..scenario.nodes).map(|_| new_slot(scenario, &mut clock_rng)).collect();
        Ok(World {
            strategy,
            seed,
            keys,
            traffic_by_kind: BTreeMap::new(),
            now: 0,
            events: 0,
            queue: EventQueue::new(scenario.bounds.queue_len_max),
            slots,
            network: Network::new(&scenario.network, scenario.nodes, seed),
            membership: Membership::new(scenario.nodes, scenario.membership.clone()),
            workload: Workload::new(scenario, seed),
            oracle: Oracle::new(limits, scenario.workload.keys, policy_of),
            recorder: Recorder::new(
                scenario.duration_nanos(),
                tracked_keys(scenario),
                scenario.workload.keys,
                scenario.nodes,
            )
            .with_regions(region_of(scenario), scenario.network.regions.as_ref().map_or(0, |r| r.count)),
            convergence: Convergence::default(),
            faults_rng: substream(seed, "faults", 0),
            next_check_id: 0,
            pending_total: 0,
            log: EventLog::new(sink),
            audit: None,
            next_collect: COLLECT_EVERY_NANOS,
            policies,
            scenario,
        })
    }

    /// The same world, also comparing the owners' audit with its own counts
    /// ([`crate::audit`]): the run's output carries the comparison. Only reads the nodes: the run
    /// is the same, event for event.
    pub fn with_audit(mut self) -> World<'a> {
        let windows = (0..self.scenario.workload.keys)
            .map(|key| {
                let index = self.scenario.policy_of_key(key);
                let policy = ratemesh_core::Policy {
                    limit: self.policies.limits[index].clone(),
                    mode: ratemesh_core::Mode::Approximate,
                    fallback: ratemesh_core::Fallback::LocalShare,
                    audit: crate::strategy::audit_of(index),
                    region: ratemesh_core::PolicyRegion::default(),
                };
                policy.audit_window().map(ratemesh_core::duration_nanos)
            })
            .collect();
        let clocks: Vec<NodeClock> = self.slots.iter().map(|s| s.clock).collect();
        self.audit = Some(AuditLens::new(windows, &clocks));
        self
    }

    /// Runs the scenario to its end, then lets checks still pending be decided: for up to
    /// [`END_DRAIN_NANOS`] more, messages and timers run (no arrivals, no faults).
    pub fn run(mut self) -> Result<RunOutput, SimError> {
        self.start()?;
        let end = self.scenario.duration_nanos();
        while let Some((at, event)) = self.queue.pop() {
            let draining = at >= end;
            if draining && (self.pending_total == 0 || at >= end.saturating_add(END_DRAIN_NANOS)) {
                break;
            }
            if draining && matches!(event, Event::Arrival(_) | Event::Fault(_)) {
                continue;
            }
            if at >= self.next_collect {
                self.next_collect = at.saturating_add(COLLECT_EVERY_NANOS);
                (0..self.scenario.nodes).for_each(|node| self.collect_audit(node));
            }
            self.now = at;
            self.count_event()?;
            self.dispatch(event)?;
            if !draining {
                self.check_convergence();
            }
        }
        self.now = self.now.max(end);
        Ok(self.finish())
    }

    fn start(&mut self) -> Result<(), SimError> {
        for (at, fault) in faults::schedule(self.scenario) {
            self.queue.push(at, Event::Fault(fault))?;
        }
        if let Some(first) = self.workload.next_arrival() {
            self.queue.push(first.at_nanos, Event::Arrival(first))?;
        }
        for (node, slot) in self.slots.iter().enumerate() {
            self.log.line(format_args!(
                "0 clock n{node} offset={}ns drift={}ppm",
                slot.clock.offset_nanos(),
                slot.clock.drift_ppm()
            ));
        }
        (0..self.scenario.nodes).try_for_each(|node| self.spawn(node))
    }

    fn count_event(&mut self) -> Result<(), SimError> {
        self.events += 1;
        if self.events > self.scenario.bounds.events_max {
            return Err(SimError::TooManyEvents { max: self.scenario.bounds.events_max, at_nanos: self.now });
        }
        Ok(())
    }

    fn dispatch(&mut self, event: Event) -> Result<(), SimError> {
        match event {
            Event::Arrival(arrival) => self.on_arrival(arrival),
            Event::Deliver { from, to, bytes } => self.on_deliver(from, to, &bytes),
            Event::Timer { node, token } => self.on_timer(node, token),
            Event::View(pending) => self.on_view(pending),
            Event::Fault(fault) => self.on_fault(fault),
        }
    }

    fn finish(mut self) -> RunOutput {
        (0..self.scenario.nodes).for_each(|node| self.collect_audit(node));
        for node in 0..self.scenario.nodes {
            self.refuse_pending(node);
        }
        self.close_measurement();
        let unconverged = self.convergence.finish();
        self.log.line(format_args!("{} end events={}", self.now, self.events));
        RunOutput {
            strategy: self.strategy,
            convergence_nanos: self.convergence.done_nanos.clone(),
            unconverged,
            traffic: self.network.traffic().to_vec(),
            traffic_by_kind: std::mem::take(&mut self.traffic_by_kind),
            network: self.network.stats(),
            region_traffic: self.network.region_traffic(),
            events: self.events,
            digest: self.log.digest(),
            recorder: self.recorder,
            audit: self.audit.as_ref().map(AuditLens::compare),
        }
    }

    /// Collects `node`'s closed audit windows (a world with an audit; a running node).
    fn collect_audit(&mut self, node: u32) {
        let (Some(lens), Some(n)) = (self.audit.as_mut(), self.slots[node as usize].node.as_deref()) else {
            return;
        };
        lens.collect(node, n, &self.keys);
    }

    /// Records one request for `key` that arrived at `at_nanos` at `node`, with both decisions
    /// `(ideal, admitted)`, in the recorder (and the audit's lens); `served`: a node took it.
    fn record(
        &mut self,
        at_nanos: u64,
        key: u32,
        node: u32,
        cost: u64,
        decisions: (bool, bool),
        served: bool,
    ) {
        let (ideal, admitted) = decisions;
        self.recorder.record(at_nanos, key, node, cost, ideal, admitted);
        if let Some(lens) = self.audit.as_mut() {
            lens.record(at_nanos, key, cost, served, ideal, admitted);
        }
    }

    // --- Requests -------------------------------------------------------------------------------

    fn on_arrival(&mut self, arrival: Arrival) -> Result<(), SimError> {
        if let Some(next) = self.workload.next_arrival() {
            self.queue.push(next.at_nanos, Event::Arrival(next))?;
        }
        let ideal = self.oracle.admit(arrival.key, arrival.cost, arrival.at_nanos);
        let Some(node) = self.route(arrival.node) else {
            self.log.line(format_args!("{} A n- k{} i{} -> R", self.now, arrival.key, u8::from(ideal)));
            self.record(arrival.at_nanos, arrival.key, arrival.node, arrival.cost, (ideal, false), false);
            return Ok(());
        };
        let id = self.next_check_id;
        self.next_check_id += 1;
        let check = Check { id, key: self.keys[arrival.key as usize], cost: arrival.cost };
        let local = self.local_now(node);
        let verdict = self.node_mut(node).map(|n| n.handle_check(local, check));
        let verdict = verdict.unwrap_or(Verdict::Refused);
        self.log.line(format_args!(
            "{} A n{node} k{} c{} i{} -> {} #{id}",
            self.now,
            arrival.key,
            arrival.cost,
            u8::from(ideal),
            verdict_code(verdict)
        ));
        match verdict {
            Verdict::Allowed | Verdict::Refused => {
                let admitted = verdict == Verdict::Allowed;
                self.record(
                    arrival.at_nanos,
                    arrival.key,
                    arrival.node,
                    arrival.cost,
                    (ideal, admitted),
                    true,
                );
            }
            Verdict::Pending => {
                let check = PendingCheck {
                    at_nanos: self.now,
                    key: arrival.key,
                    origin: arrival.node,
                    cost: arrival.cost,
                    ideal,
                };
                self.add_pending(node, id, check)?;
            }
        }
        self.drain(node)
    }

    /// The node that takes a request sent to `wanted`: itself if it serves, else the next serving
    /// node in number order (clients fail over).
    fn route(&self, wanted: u32) -> Option<u32> {
        let n = self.scenario.nodes;
        (0..n).map(|i| (wanted + i) % n).find(|&node| {
            let slot = &self.slots[node as usize];
            let serving = slot.node.as_ref().is_some_and(|n| n.is_serving(slot.clock.local(self.now)));
            slot.phase == Phase::Running && serving
        })
    }

    fn add_pending(&mut self, node: u32, id: u64, check: PendingCheck) -> Result<(), SimError> {
        if self.pending_total >= self.scenario.bounds.pending_checks_max {
            let max = self.scenario.bounds.pending_checks_max;
            return Err(SimError::TooManyPending { max, at_nanos: self.now });
        }
        self.pending_total += 1;
        self.slots[node as usize].pending.insert(id, check);
        Ok(())
    }

    fn on_decided(&mut self, node: u32, id: u64, allowed: bool) {
        let Some(check) = self.slots[node as usize].pending.remove(&id) else {
            self.log.line(format_args!("{} D n{node} #{id} unknown", self.now));
            return;
        };
        self.pending_total -= 1;
        self.log.line(format_args!("{} D n{node} #{id} {}", self.now, if allowed { 'A' } else { 'R' }));
        self.record(check.at_nanos, check.key, check.origin, check.cost, (check.ideal, allowed), true);
    }

    /// Checks still pending on `node` are refused (the client got no answer).
    fn refuse_pending(&mut self, node: u32) {
        let pending = std::mem::take(&mut self.slots[node as usize].pending);
        self.pending_total -= pending.len();
        for (id, check) in pending {
            self.log.line(format_args!("{} D n{node} #{id} lost", self.now));
            self.record(check.at_nanos, check.key, check.origin, check.cost, (check.ideal, false), true);
        }
    }

    // --- Messages and timers ----------------------------------------------------------------------

    fn on_deliver(&mut self, from: u32, to: u32, bytes: &[u8]) -> Result<(), SimError> {
        let local = self.local_now(to);
        let Some(node) = self.node_mut(to) else {
            self.log.line(format_args!("{} R n{to}<n{from} {}B down", self.now, bytes.len()));
            return Ok(());
        };
        node.handle_frame(local, from, bytes);
        self.log.line(format_args!("{} R n{to}<n{from} {}B", self.now, bytes.len()));
        self.drain(to)
    }

    fn transmit(&mut self, from: u32, out: Outgoing) -> Result<(), SimError> {
        let len = out.bytes.len();
        let hash = xxhash_rust::xxh3::xxh3_64(&out.bytes);
        if out.to >= self.scenario.nodes {
            self.log.line(format_args!("{} S n{from}>n{} {len}B {hash:016x} unknown", self.now, out.to));
            return Ok(());
        }
        let kind = self.traffic_by_kind.entry(self.strategy.message_kind(&out.bytes)).or_default();
        kind.0 += 1;
        kind.1 += len as u64;
        let fate = self.network.send(from, out.to, len);
        let mut text = String::new();
        fate.deliveries().for_each(|d| text.push_str(&format!("+{d}")));
        let text = if fate.cut {
            "cut".into()
        } else if text.is_empty() {
            "lost".into()
        } else {
            text
        };
        self.log.line(format_args!("{} S n{from}>n{} {len}B {hash:016x} {text}", self.now, out.to));
        let bytes: Rc<[u8]> = out.bytes.into();
        for delay in fate.deliveries() {
            let event = Event::Deliver { from, to: out.to, bytes: Rc::clone(&bytes) };
            self.queue.push(self.now.saturating_add(delay), event)?;
        }
        Ok(())
    }

    fn on_timer(&mut self, node: u32, token: u64) -> Result<(), SimError> {
        let slot = &mut self.slots[node as usize];
        if slot.timer != Some((self.now, token)) {
            return Ok(());
        }
        slot.timer = None;
        slot.repeat = if slot.repeat.0 == self.now { (self.now, slot.repeat.1 + 1) } else { (self.now, 1) };
        if slot.repeat.1 > self.scenario.bounds.timer_repeat_max {
            return Err(SimError::Livelock { node, times: slot.repeat.1, at_nanos: self.now });
        }
        let local = self.local_now(node);
        if let Some(n) = self.node_mut(node) {
            n.handle_timeout(local);
        }
        self.log.line(format_args!("{} T n{node}", self.now));
        self.drain(node)
    }

    /// Drains `node`'s outputs after an input: transmits, decisions, then its next wakeup.
    fn drain(&mut self, node: u32) -> Result<(), SimError> {
        let max = self.scenario.bounds.outputs_per_call_max;
        let mut outputs = 0;
        while let Some(out) = self.node_mut(node).and_then(|n| n.poll_transmit()) {
            outputs += 1;
            if outputs > max {
                return Err(SimError::TooManyOutputs { node, max });
            }
            self.transmit(node, out)?;
        }
        while let Some((id, allowed)) = self.node_mut(node).and_then(|n| n.poll_decided()) {
            outputs += 1;
            if outputs > max {
                return Err(SimError::TooManyOutputs { node, max });
            }
            self.on_decided(node, id, allowed);
        }
        let slot = &self.slots[node as usize];
        if slot.phase == Phase::Leaving && slot.node.as_ref().is_some_and(|n| n.has_left()) {
            self.log.line(format_args!("{} left n{node}", self.now));
            self.stop_left(node);
            return Ok(());
        }
        self.rearm_timer(node)
    }

    /// Stops a node whose leave is complete (or whose linger ran out).
    fn stop_left(&mut self, node: u32) {
        self.kill(node);
        self.membership.set_up(node, false);
    }

    fn rearm_timer(&mut self, node: u32) -> Result<(), SimError> {
        let slot = &mut self.slots[node as usize];
        let wanted = slot.node.as_ref().and_then(|n| n.poll_timeout());
        let at = wanted.and_then(|local| slot.clock.virtual_at(local)).map(|v| v.max(self.now));
        match (at, slot.timer) {
            (Some(at), Some((scheduled, _))) if at == scheduled => Ok(()),
            (Some(at), _) => {
                slot.timer_token += 1;
                slot.timer = Some((at, slot.timer_token));
                let token = slot.timer_token;
                self.queue.push(at, Event::Timer { node, token })
            }
            (None, _) => {
                slot.timer = None;
                Ok(())
            }
        }
    }

    // --- Membership -------------------------------------------------------------------------------

    fn on_view(&mut self, pending: PendingView) -> Result<(), SimError> {
        if self.membership.apply(pending.observer, &pending.changes) {
            self.deliver_view(pending.observer)?;
        }
        Ok(())
    }

    /// Hands `observer` its current view (if it runs).
    fn deliver_view(&mut self, observer: u32) -> Result<(), SimError> {
        let view = self.membership.view(observer);
        self.log.line(format_args!("{} V n{observer} live={:?} dead={:?}", self.now, view.live, view.dead));
        let local = self.local_now(observer);
        // A key this node stops owning loses its audit record at the node's next round.
        self.collect_audit(observer);
        if let Some(node) = self.node_mut(observer) {
            node.handle_membership(local, &view);
            return self.drain(observer);
        }
        Ok(())
    }

    /// Schedules the view changes that the latest change of reality implies.
    fn reality_changed(&mut self) -> Result<(), SimError> {
        for pending in self.membership.reality_changed(&self.network) {
            self.queue.push(self.now.saturating_add(pending.delay_nanos), Event::View(pending))?;
        }
        Ok(())
    }

    // --- Node lifecycle ---------------------------------------------------------------------------

    /// Starts a new incarnation of `node`, with a complete view of the cluster.
    fn spawn(&mut self, node: u32) -> Result<(), SimError> {
        let local = self.local_now(node);
        let slot = &mut self.slots[node as usize];
        slot.incarnation += 1;
        let setup = NodeSetup {
            id: node,
            incarnation: slot.incarnation,
            policies: Rc::clone(&self.policies),
            settings: self.scenario.node.clone(),
            sync_interval_ms: self.scenario.sync_interval_ms,
            regions: self.scenario.network.regions.as_ref().map(|r| r.count),
            join_grace_ms: if slot.incarnation == 1 {
                0
            } else {
                self.scenario.node.join_grace_ms.unwrap_or(self.scenario.membership.join_delay_ms)
            },
            seed: substream_seed(self.seed, "node", u64::from(node) << 32 | slot.incarnation),
            now: local,
        };
        slot.node = Some(self.strategy.build(setup));
        slot.phase = Phase::Running;
        slot.timer = None;
        self.log.line(format_args!("{} start n{node} incarnation={}", self.now, slot.incarnation));
        self.membership.reset_observer(node, &self.network);
        self.deliver_view(node)
    }

    /// Stops `node`: its state is lost, its pending checks are refused.
    fn kill(&mut self, node: u32) {
        // What a stopped owner audited is lost with it (the simulator reads it first).
        self.collect_audit(node);
        let slot = &mut self.slots[node as usize];
        slot.node = None;
        slot.phase = Phase::Down;
        slot.timer = None;
        self.log.line(format_args!("{} stop n{node}", self.now));
        self.refuse_pending(node);
    }

    fn node_mut(&mut self, node: u32) -> Option<&mut (dyn SimNode + 'static)> {
        self.slots.get_mut(node as usize)?.node.as_deref_mut()
    }

    fn local_now(&self, node: u32) -> Instant {
        self.slots[node as usize].clock.local(self.now)
    }
}

/// Keys tracked one by one (bins for the plot and peak rates, per node for fairness): the hot keys,
/// or with a per-key workload the first keys.
fn tracked_keys(scenario: &Scenario) -> u32 {
    let w = &scenario.workload;
    if w.per_key { w.keys } else { w.hot_keys }
}

/// The region of each node (empty without regions).
fn region_of(scenario: &Scenario) -> Vec<u32> {
    let regions = scenario.network.regions.as_ref();
    regions.map_or(Vec::new(), |r| (0..scenario.nodes).map(|n| r.region_of(n)).collect())
}

fn new_slot(scenario: &Scenario, rng: &mut SimRng) -> Slot {
    let offset_max = scenario.clock.offset_ms_max as f64 * 1e6;
    let drift_max = scenario.clock.drift_ppm_max as f64;
    let offset = ((unit(rng) * 2.0 - 1.0) * offset_max) as i64;
    let drift = ((unit(rng) * 2.0 - 1.0) * drift_max).round() as i64;
    Slot {
        node: None,
        phase: Phase::Down,
        incarnation: 0,
        clock: NodeClock::new(offset, drift),
        timer: None,
        timer_token: 0,
        repeat: (u64::MAX, 0),
        pending: BTreeMap::new(),
    }
}

fn verdict_code(verdict: Verdict) -> char {
    match verdict {
        Verdict::Allowed => 'A',
        Verdict::Refused => 'R',
        Verdict::Pending => 'P',
    }
}
