//! Graceful leave: announce, keep owning while peers learn of it, hand over, drain.
//!
//! The driver calls [`Node::handle_leave`] when it announces the leave (in gossip); from then on
//! the node refuses new checks ([`CheckOutcome::Unavailable`]) and gives back every allowance it
//! holds.
//! It keeps owning its keys and answering peers for [`LeavePlan::own_for`], long enough for the
//! announcement to reach every member, so that peers stop routing to it before its keys move.
//! Then it applies its own view without itself: every owned key is handed to its new owner. It
//! drains until every frame to a reachable peer is acknowledged (bounded by
//! [`LeavePlan::drain_for`]) and emits [`Event::Left`]: the driver may stop it.

use crate::prelude::*;
use core::time::Duration;

use super::*;

/// How a node leaves; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeavePlan {
    /// How long the node keeps owning its keys after announcing the leave: about the time the
    /// announcement takes to reach every member.
    pub own_for: Duration,
    /// The longest the node waits for its handoff to be acknowledged.
    pub drain_for: Duration,
}

/// Where a leaving node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Leave {
    /// Still owning its keys, until then; then it drains for `drain_nanos` at most.
    Owning { hand_over_at: Instant, drain_nanos: u64 },
    /// Handed over; waiting for acknowledgements until then.
    Draining { give_up_at: Instant },
    /// Done: [`Event::Left`] was emitted.
    Left,
}

impl Node {
    /// Starts a graceful leave (see the module documentation). A second call changes nothing.
    pub fn handle_leave(&mut self, now: Instant, plan: LeavePlan) {
        if self.leave.is_some() {
            return;
        }
        let hand_over_at = now.add_duration(plan.own_for);
        self.leave = Some(Leave::Owning { hand_over_at, drain_nanos: duration_nanos(plan.drain_for) });
        self.return_allowances(now);
        self.leave_progress(now);
        self.flush_out(now);
    }

    /// Whether the node is leaving (or has left).
    pub fn is_leaving(&self) -> bool {
        self.leave.is_some()
    }

    /// Moves the leave on at `now`: hands over when owning is over, finishes when drained.
    pub(super) fn leave_progress(&mut self, now: Instant) {
        match self.leave {
            Some(Leave::Owning { hand_over_at, drain_nanos }) if now >= hand_over_at => {
                self.leave = Some(Leave::Draining { give_up_at: now.add_nanos(drain_nanos) });
                let live: Vec<NodeId> =
                    self.ring.members().iter().copied().filter(|&m| m != self.id).collect();
                let dead = self.dead.clone();
                self.apply_view(now, live, dead);
                self.flush_forwards(now);
                self.leave_progress(now);
            }
            Some(Leave::Draining { give_up_at })
                if now >= give_up_at || self.peers.unacked_frames_reachable(now) == 0 =>
            {
                self.leave = Some(Leave::Left);
                self.events.push_back(Event::Left);
            }
            _ => {}
        }
    }

    /// The next instant the leave moves on by itself.
    pub(super) fn leave_deadline(&self) -> Option<Instant> {
        match self.leave? {
            Leave::Owning { hand_over_at, .. } => Some(hand_over_at),
            Leave::Draining { give_up_at } => Some(give_up_at),
            Leave::Left => None,
        }
    }
}
