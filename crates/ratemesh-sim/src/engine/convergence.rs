//! The convergence checker: how long after a fault heals the cluster agrees again.
//!
//! A heal (a restart, a rejoin, the end of a cut) starts a measurement. A measurement still open
//! when the next fault or heal comes, or when the run ends, counts as not converged. The clock starts when every running member's view matches reality (the heal
//! is visible everywhere) and stops at the first event after which every running node is settled
//! and all running members name the same owner for each of the workload's first
//! [`CONVERGENCE_KEYS_MAX`] keys. The owner comparison runs at most once per
//! [`OWNER_CHECK_INTERVAL_NANOS`] of virtual time (the result's resolution).

use super::{Phase, World};

/// The most keys whose owners are compared.
pub const CONVERGENCE_KEYS_MAX: usize = 256;
/// The least virtual time between two owner comparisons.
pub const OWNER_CHECK_INTERVAL_NANOS: u64 = 1_000_000;

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub(super) struct Convergence {
    /// `Some` while a heal is being measured: `Some(t)` once the heal was visible everywhere at t.
    tracking: Option<Option<u64>>,
    /// Completed measurements, in nanoseconds.
    pub(super) done_nanos: Vec<u64>,
    /// Measurements cut short by the next fault or heal, or by the end of the run.
    pub(super) unconverged: u32,
    last_owner_check: Option<u64>,
}

impl Convergence {
    /// A heal happened: start measuring (close the open measurement first).
    pub(super) fn heal(&mut self) {
        self.tracking = Some(None);
    }

    /// A fault happened: the measurement in progress, if any, did not converge.
    pub(super) fn disrupt(&mut self) {
        self.unconverged += u32::from(self.tracking.take().is_some());
    }

    /// Whether a measurement is open.
    pub(super) fn is_tracking(&self) -> bool {
        self.tracking.is_some()
    }

    /// The end of the run: closes the open measurement; returns the count of unconverged ones.
    pub(super) fn finish(&mut self) -> u32 {
        self.disrupt();
        self.unconverged
    }
}

impl World<'_> {
    /// Closes the open measurement, if any, as not converged, logging why.
    pub(super) fn close_measurement(&mut self) {
        if self.convergence.is_tracking() {
            let blockers = self.convergence_blockers();
            self.log.line(format_args!("{} not converged: {blockers}", self.now));
        }
        self.convergence.disrupt();
    }

    /// Runs after every event.
    pub(super) fn check_convergence(&mut self) {
        let Some(visible) = self.convergence.tracking else { return };
        let visible_at = match visible {
            Some(at) => at,
            None if self.views_truthful() => {
                self.convergence.tracking = Some(Some(self.now));
                self.log.line(format_args!("{} heal visible in every view", self.now));
                self.now
            }
            None => return,
        };
        if !self.all_settled() || !self.owner_check_due() || !self.owners_agree() {
            return;
        }
        self.convergence.done_nanos.push(self.now - visible_at);
        self.convergence.tracking = None;
        self.log.line(format_args!("{} converged after {} ns", self.now, self.now - visible_at));
    }

    /// Why the cluster has not converged (for the log at the end of a run): the nodes that are
    /// not settled, and how many compared keys have disagreeing owners.
    pub(super) fn convergence_blockers(&self) -> String {
        let unsettled: Vec<u32> = self
            .members()
            .filter(|n| self.slots[*n as usize].node.as_ref().is_some_and(|node| !node.is_settled()))
            .collect();
        let nodes: Vec<&dyn crate::strategy::SimNode> =
            self.members().filter_map(|n| self.slots[n as usize].node.as_deref()).collect();
        let disagreeing = self
            .keys
            .iter()
            .take(CONVERGENCE_KEYS_MAX)
            .filter(|&&key| nodes.windows(2).any(|pair| pair[0].owner_of(key) != pair[1].owner_of(key)))
            .count();
        format!(
            "views truthful={} unsettled={unsettled:?} keys with disagreeing owners={disagreeing}",
            self.views_truthful()
        )
    }

    fn members(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.scenario.nodes).filter(|n| self.slots[*n as usize].phase == Phase::Running)
    }

    fn views_truthful(&self) -> bool {
        self.members().all(|n| self.membership.is_truthful(n, &self.network))
    }

    fn all_settled(&self) -> bool {
        self.members().all(|n| self.slots[n as usize].node.as_ref().is_some_and(|node| node.is_settled()))
    }

    fn owner_check_due(&mut self) -> bool {
        let due = self
            .convergence
            .last_owner_check
            .is_none_or(|last| self.now >= last + OWNER_CHECK_INTERVAL_NANOS);
        if due {
            self.convergence.last_owner_check = Some(self.now);
        }
        due
    }

    fn owners_agree(&self) -> bool {
        let nodes: Vec<&dyn crate::strategy::SimNode> =
            self.members().filter_map(|n| self.slots[n as usize].node.as_deref()).collect();
        let Some((first, rest)) = nodes.split_first() else { return true };
        self.keys.iter().take(CONVERGENCE_KEYS_MAX).all(|&key| {
            let owner = first.owner_of(key);
            rest.iter().all(|node| node.owner_of(key) == owner)
        })
    }
}
