//! Membership views that lag reality, like a gossip failure detector's.
//!
//! Reality is which nodes are in the cluster (`joined`), which processes run (`up`), and which
//! links the network cuts. Observer `i` should believe subject `j` is
//! - `Absent` when `j` left the cluster (removed from the view entirely),
//! - `Dead` when `j` is down, or `j`'s messages do not reach `i` (a cut `j → i`),
//! - `Live` otherwise.
//!
//! A change of what `i` should believe reaches `i`'s view only after a delay: the detection delay
//! towards `Dead`, the join delay towards `Live`, the leave delay towards `Absent`. A later change
//! supersedes one still on its way (each carries a version), so a crash followed by a quick
//! restart may never be seen at all — as with a real detector.

use crate::network::Network;
use crate::scenario::MembershipConfig;
use crate::strategy::View;

/// What an observer believes about a subject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// In the ring.
    Live,
    /// Failed recently: owns no keys, still counts in the cluster's size.
    Dead,
    /// Not a member.
    Absent,
}

/// One belief change on its way to an observer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewChange {
    /// About whom.
    pub subject: u32,
    /// The new belief.
    pub status: Status,
    /// Applies only if no later change for the same pair was made since.
    pub version: u64,
}

/// Belief changes for one observer, due after one delay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingView {
    /// Whose view.
    pub observer: u32,
    /// How long after the change in reality they reach the view.
    pub delay_nanos: u64,
    /// The changes.
    pub changes: Vec<ViewChange>,
}

/// Reality and every node's belief about it. See the module documentation.
#[derive(Clone, Debug)]
pub struct Membership {
    nodes: u32,
    config: MembershipConfig,
    up: Vec<bool>,
    joined: Vec<bool>,
    /// `belief[i * nodes + j]`: what `i`'s view says about `j`.
    belief: Vec<Status>,
    /// The latest belief scheduled for each pair, and its version.
    target: Vec<(Status, u64)>,
    version: u64,
}

impl Membership {
    /// `nodes` nodes, all up and joined, every view complete.
    pub fn new(nodes: u32, config: MembershipConfig) -> Membership {
        let pairs = nodes as usize * nodes as usize;
        Membership {
            nodes,
            config,
            up: vec![true; nodes as usize],
            joined: vec![true; nodes as usize],
            belief: vec![Status::Live; pairs],
            target: vec![(Status::Live, 0); pairs],
            version: 0,
        }
    }

    /// Marks `node`'s process as running or not.
    pub fn set_up(&mut self, node: u32, up: bool) {
        self.up[node as usize] = up;
    }

    /// Marks `node` as a member of the cluster or not.
    pub fn set_joined(&mut self, node: u32, joined: bool) {
        self.joined[node as usize] = joined;
    }

    /// Whether `node` is a member of the cluster.
    pub fn is_joined(&self, node: u32) -> bool {
        self.joined[node as usize]
    }

    /// What `observer` should believe about `subject` now.
    pub fn truth(&self, observer: u32, subject: u32, network: &Network) -> Status {
        if !self.joined[subject as usize] {
            Status::Absent
        } else if observer == subject {
            Status::Live
        } else if !self.up[subject as usize] || network.is_cut(subject, observer) {
            Status::Dead
        } else {
            Status::Live
        }
    }

    /// Call after every change of reality: schedules the belief changes it implies for every
    /// observer's view of the other nodes (an observer's belief about itself is set by
    /// [`Membership::reset_observer`]).
    pub fn reality_changed(&mut self, network: &Network) -> Vec<PendingView> {
        let mut pending = Vec::new();
        for observer in 0..self.nodes {
            let mut by_status: [Vec<ViewChange>; 3] = Default::default();
            for subject in (0..self.nodes).filter(|s| *s != observer) {
                let status = self.truth(observer, subject, network);
                let pair = self.pair(observer, subject);
                if self.target[pair].0 != status {
                    self.version += 1;
                    self.target[pair] = (status, self.version);
                    by_status[status as usize].push(ViewChange { subject, status, version: self.version });
                }
            }
            if let Some(forget_ms) = self.config.dead_forget_ms
                && !by_status[Status::Dead as usize].is_empty()
            {
                // Forgotten with the same version: a later change of reality cancels both.
                let changes = by_status[Status::Dead as usize]
                    .iter()
                    .map(|c| ViewChange { status: Status::Absent, ..*c });
                let delay_nanos =
                    self.delay_nanos(Status::Dead).saturating_add(forget_ms.saturating_mul(1_000_000));
                pending.push(PendingView { observer, delay_nanos, changes: changes.collect() });
            }
            for changes in by_status.into_iter().filter(|c| !c.is_empty()) {
                let delay_nanos = self.delay_nanos(changes[0].status);
                pending.push(PendingView { observer, delay_nanos, changes });
            }
        }
        pending
    }

    /// Applies the changes that are still current; true when `observer`'s view changed.
    pub fn apply(&mut self, observer: u32, changes: &[ViewChange]) -> bool {
        let mut changed = false;
        for change in changes {
            let pair = self.pair(observer, change.subject);
            if self.target[pair].1 == change.version && self.belief[pair] != change.status {
                self.belief[pair] = change.status;
                changed = true;
            }
        }
        changed
    }

    /// Sets every belief of `observer` to the truth at once (a node that starts or joins learns the
    /// membership from the cluster), cancelling belief changes still on their way to it.
    pub fn reset_observer(&mut self, observer: u32, network: &Network) {
        for subject in 0..self.nodes {
            let status = self.truth(observer, subject, network);
            let pair = self.pair(observer, subject);
            self.version += 1;
            self.target[pair] = (status, self.version);
            self.belief[pair] = status;
        }
    }

    /// `observer`'s view: members it believes live, and those it believes dead.
    pub fn view(&self, observer: u32) -> View {
        let mut view = View::default();
        for subject in 0..self.nodes {
            match self.belief[self.pair(observer, subject)] {
                Status::Live => view.live.push(subject),
                Status::Dead => view.dead.push(subject),
                Status::Absent => {}
            }
        }
        view
    }

    /// Whether `observer`'s view matches reality about every node.
    pub fn is_truthful(&self, observer: u32, network: &Network) -> bool {
        (0..self.nodes).all(|subject| {
            let belief = self.belief[self.pair(observer, subject)];
            let truth = self.truth(observer, subject, network);
            // A dead member forgotten is as true as one still listed dead.
            belief == truth || (truth == Status::Dead && belief == Status::Absent)
        })
    }

    fn delay_nanos(&self, status: Status) -> u64 {
        let ms = match status {
            Status::Live => self.config.join_delay_ms,
            Status::Dead => self.config.detection_delay_ms,
            Status::Absent => self.config.leave_delay_ms,
        };
        ms.saturating_mul(1_000_000)
    }

    fn pair(&self, observer: u32, subject: u32) -> usize {
        observer as usize * self.nodes as usize + subject as usize
    }
}
