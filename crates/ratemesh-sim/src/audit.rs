//! The core's audit against the oracle (issue 46): does what every key's owner reports of its
//! own cluster agree with what the simulator counted from the outside?
//!
//! A run with an [`AuditLens`] (`World::with_audit`) does two things besides its usual work:
//!
//! - It counts every request a second time, per key and per *audit window on each node's clock*:
//!   the owner numbers its windows on its own [`Instant`]s (`index = local / window`), and a
//!   node's clock is `CLOCK_BASE + offset + virtual × (1 + drift)` (see `clock.rs`), so with
//!   clock skew the windows of two owners cover different spans of virtual time. Nodes with the
//!   same clock share one count. Per window: the hits that arrived (and those that reached a
//!   node: clients that found none are refused by the simulator, unseen by any node), the hits
//!   the cluster admitted and the hits the oracle admitted, each at the request's arrival time.
//!   The window of a key is its policy's ([`ratemesh_core::Policy::audit_window`]: 1 s for the
//!   token bucket family, the period for the window algorithms), not the recorder's 1-second bins.
//! - It collects every node's closed audit windows of every key ([`SimNode::audit_windows`]):
//!   every [`COLLECT_EVERY_NANOS`] of virtual time (an owner keeps a minute of them), before a
//!   node's view changes (a key it stops owning loses its record at the next round), before a
//!   node stops, and at the end. Windows are de-duplicated by (key, node, index).
//!
//! [`AuditComparison`] lines each collected window up with the simulator's count of the same key
//! over the same span of virtual time, and sums them ([`AuditSummary`]).

use std::collections::BTreeMap;

use ratemesh_core::{AuditWindow, Instant, KeyHash};

use crate::clock::NodeClock;
use crate::strategy::SimNode;

/// How often a run with a lens collects the nodes' closed audit windows (they keep a minute).
pub const COLLECT_EVERY_NANOS: u64 = 10_000_000_000;

/// What the simulator counted of one key in one audit window of one clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimWindow {
    /// Hits that arrived (clients that found no serving node included).
    pub arrivals: u64,
    /// Hits that reached a node (what the audit can count as arrivals).
    pub served: u64,
    /// Hits the cluster admitted (the answers clients got).
    pub admitted: u64,
    /// Hits the oracle admitted.
    pub ideal: u64,
    /// Hits the oracle admitted and the cluster refused, request by request.
    pub false_refused: u64,
}

/// The simulator's second count of a run, per audit window, and the windows collected from the
/// owners. See the module documentation.
#[derive(Clone, Debug)]
pub struct AuditLens {
    /// Per key: its audit window in nanoseconds (`None`: not audited).
    window_nanos: Vec<Option<u64>>,
    /// The distinct node clocks.
    clocks: Vec<NodeClock>,
    /// Per node: its clock in `clocks`.
    clock_of: Vec<usize>,
    /// Per key: counts by (clock, window index).
    counts: Vec<BTreeMap<(usize, u64), SimWindow>>,
    /// Collected windows by (key, node, index).
    collected: BTreeMap<(u32, u32, u64), AuditWindow>,
    /// The same (key, node, index) collected twice with different figures (a restarted node's
    /// new record, or a closed window that changed: a bug).
    changed: u64,
}

impl AuditLens {
    /// A lens over keys with audit windows `window_nanos` (per key) and nodes with `clocks`.
    pub fn new(window_nanos: Vec<Option<u64>>, node_clocks: &[NodeClock]) -> AuditLens {
        let mut clocks: Vec<NodeClock> = Vec::new();
        let clock_of = node_clocks
            .iter()
            .map(|c| match clocks.iter().position(|k| k == c) {
                Some(i) => i,
                None => {
                    clocks.push(*c);
                    clocks.len() - 1
                }
            })
            .collect();
        let counts = vec![BTreeMap::new(); window_nanos.len()];
        AuditLens { window_nanos, clocks, clock_of, counts, collected: BTreeMap::new(), changed: 0 }
    }

    /// Counts one request for `key` that arrived at `at_nanos` (virtual), with both decisions;
    /// `served`: a node took it.
    pub fn record(&mut self, at_nanos: u64, key: u32, cost: u64, served: bool, ideal: bool, admitted: bool) {
        let Some(Some(window)) = self.window_nanos.get(key as usize).copied() else { return };
        for (c, clock) in self.clocks.iter().enumerate() {
            let index = clock.local(at_nanos).as_nanos() / window;
            let w = self.counts[key as usize].entry((c, index)).or_default();
            w.arrivals += cost;
            w.served += if served { cost } else { 0 };
            w.admitted += if admitted { cost } else { 0 };
            w.ideal += if ideal { cost } else { 0 };
            w.false_refused += if ideal && !admitted { cost } else { 0 };
        }
    }

    /// Collects `node`'s closed audit windows of every audited key (`keys[k]` is key `k`'s hash).
    pub fn collect(&mut self, node: u32, sim_node: &dyn SimNode, keys: &[KeyHash]) {
        for (k, hash) in keys.iter().enumerate() {
            if self.window_nanos.get(k).copied().flatten().is_none() {
                continue;
            }
            for window in sim_node.audit_windows(*hash) {
                match self.collected.entry((k as u32, node, window.index)) {
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(window);
                    }
                    std::collections::btree_map::Entry::Occupied(o) if *o.get() != window => {
                        self.changed += 1;
                    }
                    std::collections::btree_map::Entry::Occupied(_) => {}
                }
            }
        }
    }

    /// Every collected window with the simulator's count of the same span.
    pub fn compare(&self) -> AuditComparison {
        let rows = self
            .collected
            .iter()
            .map(|(&(key, node, index), audit)| {
                let class = self.clock_of[node as usize];
                let window = self.window_nanos[key as usize].unwrap_or(1);
                let sim = self.counts[key as usize].get(&(class, index)).copied().unwrap_or_default();
                let clock = &self.clocks[class];
                let virtual_at =
                    |local: u64| clock.virtual_at(Instant::from_nanos(local)).unwrap_or(u64::MAX);
                let span = (virtual_at(index * window), virtual_at((index + 1) * window));
                AuditRow { key, node, index, span, audit: *audit, sim }
            })
            .collect();
        let arrivals = self.counts.iter().map(|windows| {
            windows.iter().filter(|((class, _), _)| *class == 0).map(|(_, w)| w.arrivals).sum()
        });
        AuditComparison { rows, arrivals: arrivals.collect(), changed: self.changed }
    }
}

/// One collected audit window and the simulator's count of the same key over the same span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuditRow {
    /// The key's workload index.
    pub key: u32,
    /// The owner that reported it.
    pub node: u32,
    /// The window's index on the owner's clock.
    pub index: u64,
    /// The window's span in virtual time, `[start, end)` nanoseconds.
    pub span: (u64, u64),
    /// What the owner's audit reported.
    pub audit: AuditWindow,
    /// What the simulator counted.
    pub sim: SimWindow,
}

/// A run's audit windows lined up with the simulator's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditComparison {
    /// Every collected window, by key, node and index.
    pub rows: Vec<AuditRow>,
    /// Hits that arrived over the whole run, per key.
    pub arrivals: Vec<u64>,
    /// Windows collected twice with different figures.
    pub changed: u64,
}

/// Sums of one side (the audit's or the simulator's) over a set of key windows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Side {
    /// Hits admitted by the cluster.
    pub admitted: u64,
    /// Hits the ideal limiter admitted (the audit's ideal bucket; the oracle).
    pub ideal: u64,
    /// Hits that arrived (the audit: that reached a node; the simulator: that reached a node).
    pub arrivals: u64,
    /// `Σ max(0, admitted − ideal)` window by window.
    pub over_admitted: u64,
    /// `Σ max(0, ideal − admitted)` window by window.
    pub false_refused: u64,
}

impl Side {
    fn add(&mut self, admitted: u64, ideal: u64, arrivals: u64) {
        self.admitted += admitted;
        self.ideal += ideal;
        self.arrivals += arrivals;
        self.over_admitted += admitted.saturating_sub(ideal);
        self.false_refused += ideal.saturating_sub(admitted);
    }

    /// Over-admission over the windows: `max(0, Σadmitted − Σideal) / Σideal` (0 without ideal).
    pub fn over_admission(&self) -> f64 {
        ratio(self.admitted.saturating_sub(self.ideal), self.ideal)
    }

    /// `Σ max(0, admitted − ideal)` over `Σ ideal`: the over-admission window by window.
    pub fn window_over_admission(&self) -> f64 {
        ratio(self.over_admitted, self.ideal)
    }

    /// `Σ max(0, ideal − admitted)` over `Σ ideal`: false refusals window by window.
    pub fn false_refusal(&self) -> f64 {
        ratio(self.false_refused, self.ideal)
    }
}

/// A run's comparison, summed over its complete windows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AuditSummary {
    /// Key windows collected.
    pub windows: u64,
    /// Of which incomplete (the owner did not see all of them).
    pub incomplete: u64,
    /// Of the incomplete, those before a key's first complete window at its owner (the record
    /// began during the first; the ideal limiter's memory of it covers the next).
    pub incomplete_first: u64,
    /// Complete key windows of different owners that overlap in virtual time (one key owned twice).
    pub overlapping: u64,
    /// The audit's sums over the complete windows.
    pub audit: Side,
    /// The simulator's sums over the same windows (the oracle as the ideal).
    pub sim: Side,
    /// Hits the oracle admitted and the cluster refused, request by request, in those windows.
    pub sim_false_refused_requests: u64,
    /// Hits that arrived and found no serving node, in those windows (the audit cannot see them).
    pub unserved: u64,
    /// The share of the arrivals of the keys with windows that fell inside collected windows
    /// (complete or not; windows of two owners that overlap count twice).
    pub coverage: f64,
    /// Windows collected twice with different figures.
    pub changed: u64,
}

impl AuditSummary {
    /// The share of key windows marked incomplete.
    pub fn incomplete_share(&self) -> f64 {
        ratio(self.incomplete, self.windows)
    }

    /// The share of key windows marked incomplete after a key's first complete one at its owner.
    pub fn incomplete_later_share(&self) -> f64 {
        ratio(self.incomplete - self.incomplete_first, self.windows)
    }
}

impl AuditComparison {
    /// The sums over the complete windows that `keep` accepts.
    pub fn summary_where(&self, keep: impl Fn(&AuditRow) -> bool) -> AuditSummary {
        let mut s = AuditSummary { changed: self.changed, ..AuditSummary::default() };
        let mut covered = 0;
        let mut keys = std::collections::BTreeSet::new();
        let mut complete: Vec<&AuditRow> = Vec::new();
        let mut first_complete = std::collections::BTreeMap::new();
        for row in self.rows.iter().filter(|r| keep(r) && r.audit.complete) {
            first_complete.entry((row.key, row.node)).or_insert(row.index);
        }
        for row in self.rows.iter().filter(|r| keep(r)) {
            s.windows += 1;
            keys.insert(row.key);
            covered += row.sim.arrivals;
            if !row.audit.complete {
                s.incomplete += 1;
                let first = first_complete.get(&(row.key, row.node)).is_none_or(|&i| row.index < i);
                s.incomplete_first += u64::from(first);
                continue;
            }
            complete.push(row);
            s.audit.add(row.audit.admitted, row.audit.ideal, row.audit.arrivals);
            s.sim.add(row.sim.admitted, row.sim.ideal, row.sim.served);
            s.sim_false_refused_requests += row.sim.false_refused;
            s.unserved += row.sim.arrivals - row.sim.served;
        }
        complete.sort_by_key(|r| (r.key, r.span.0));
        for pair in complete.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            s.overlapping += u64::from(a.key == b.key && a.node != b.node && b.span.0 < a.span.1);
        }
        let arrivals = keys.iter().map(|&k| self.arrivals.get(k as usize).copied().unwrap_or(0)).sum();
        s.coverage = ratio(covered, arrivals);
        s
    }

    /// The sums over every complete window.
    pub fn summary(&self) -> AuditSummary {
        self.summary_where(|_| true)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}
