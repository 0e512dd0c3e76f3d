//! Graceful leave: announce, keep owning while peers learn of it, hand over, drain.
//!
//! The driver calls [`Node::handle_leave`] when it announces the leave (in gossip); from then on
//! the node refuses new checks ([`CheckOutcome::Unavailable`]) and gives back every allowance it
//! holds.
//! It keeps owning its keys and answering peers for [`LeavePlan::own_for`], long enough for the
//! announcement to reach every member, so that peers stop routing to it before its keys move;
//! or until the driver knows that every member has learned of it ([`Node::handle_leave_heard`]),
//! if that is sooner.
//! Then it applies its own view without itself: every owned key is handed to its new owner. It
//! drains until every frame to a reachable peer is acknowledged (bounded by
//! [`LeavePlan::drain_for`]) and emits [`Event::Left`]: the driver may stop it.
//!
//! When another member left its view gracefully since shortly before its own leave, it drains
//! for at least half of `own_for` (within `drain_for`), even when everything was acknowledged
//! at once: members leaving at the same moment may not have learned of this leave when they
//! hand over, and hand it keys; it passes them on to their owner in its view (see `handoff.rs`).
//! Leaving at once it would drop them, and the keys would restart from an older state, were the
//! node not among the members each key goes to (`LEAVE_HANDOFF_OWNERS`). Otherwise (a leave with
//! no other in sight: a rolling restart, a scale-down by one) it ends as soon as its handoff is
//! acknowledged: SIGTERM to exit is `own_for` plus a round trip.

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
    /// Still owning its keys, until then; then it drains for `drain_nanos` at most and
    /// `linger_nanos` at least.
    Owning { hand_over_at: Instant, drain_nanos: u64, linger_nanos: u64, own_nanos: u64 },
    /// Handed over; passing on late handoffs until `linger_until` at least, waiting for
    /// acknowledgements until `give_up_at` at most.
    Draining { linger_until: Instant, give_up_at: Instant },
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
        let drain_nanos = duration_nanos(plan.drain_for);
        let own_nanos = duration_nanos(plan.own_for);
        let linger_nanos = (own_nanos / 2).min(drain_nanos);
        self.leave = Some(Leave::Owning { hand_over_at, drain_nanos, linger_nanos, own_nanos });
        self.return_allowances(now);
        self.leave_progress(now);
        self.end_input(now);
    }

    /// Every member has learned of the leave (the driver saw it in their gossip): the node
    /// stops owning now instead of at the end of [`LeavePlan::own_for`], and hands over. Nothing
    /// when it is not owning any more (or not leaving).
    pub fn handle_leave_heard(&mut self, now: Instant) {
        if let Some(Leave::Owning { hand_over_at, .. }) = &mut self.leave {
            *hand_over_at = (*hand_over_at).min(now);
            self.leave_progress(now);
            self.end_input(now);
        }
    }

    /// Whether the node is leaving (or has left).
    pub fn is_leaving(&self) -> bool {
        self.leave.is_some()
    }

    /// Moves the leave on at `now`: hands over when owning is over, finishes when drained.
    pub(super) fn leave_progress(&mut self, now: Instant) {
        match self.leave {
            Some(Leave::Owning { hand_over_at, drain_nanos, linger_nanos, own_nanos })
                if now >= hand_over_at =>
            {
                // A member that left since `own_for` before this leave began may not have known
                // of it when it handed over (another `own_for` of margin for slow gossip).
                let since = hand_over_at.as_nanos().saturating_sub(3 * own_nanos);
                let others_leaving = self.departed_at.is_some_and(|at| at.as_nanos() >= since);
                let linger_nanos = if others_leaving { linger_nanos } else { 0 };
                let (linger_until, give_up_at) = (now.add_nanos(linger_nanos), now.add_nanos(drain_nanos));
                debug_assert!(linger_until <= give_up_at, "a leave lingers within its drain");
                self.leave = Some(Leave::Draining { linger_until, give_up_at });
                let mut view = self.view.clone();
                view.live.retain(|&m| m != self.id);
                self.apply_view(now, view);
                self.flush_forwards(now);
                // The handoff goes out (unacknowledged) before the drain can count it done.
                self.flush_out(now);
                self.leave_progress(now);
            }
            Some(Leave::Draining { linger_until, give_up_at })
                if now >= give_up_at
                    || (now >= linger_until && self.peers.unacked_frames_reachable(now) == 0) =>
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
            // While frames are unacknowledged an acknowledgement is an input: `give_up_at` is the
            // only deadline then; once all are, the linger's end is.
            Leave::Draining { linger_until, give_up_at } => {
                Some(if self.peers.unacked_frames() == 0 { linger_until.min(give_up_at) } else { give_up_at })
            }
            Leave::Left => None,
        }
    }
}
