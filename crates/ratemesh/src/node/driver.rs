//! The node's tasks — timer, receive, membership, gossip supervisor, snapshots — and what they
//! do under the node's lock: feed the core and carry out its outputs (`after_input`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use chitchat::ChitchatHandle;
use parking_lot::MutexGuard;
use ratemesh_core::{DurableCursor, DurableKey, Event, KeyHash, MemberView, NodeId, ViewChange};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, trace_span};

use super::{
    DEPARTED_ADDRS_MAX, FRAME_BYTES_PER_TURN_MAX, FRAMES_PER_TURN_MAX, Lane, SNAPSHOT_SLOTS_PER_TURN, Shared,
    State, lane_index,
};
use crate::defaults;
use crate::durable::Persistence;
use crate::gossip::{GossipSlot, GossipStarter, supervise};
use crate::membership::{KEY_LEAVING, Member, MemberStatus, Membership, ViewSink};
use crate::seeds::SeedSink;
use crate::top::{TopBy, TopReply, TopSummary, decode_question, encode_message};
use crate::transport::{QueryHandler, Received};

/// How a node answers other members' top-keys questions: from its own sketches, at its own now
/// (nothing, which the asker reports as missing, once the node is gone: the transport holds the
/// handler, the node the transport).
pub(super) fn top_query_handler(shared: Weak<Shared>) -> QueryHandler {
    Arc::new(move |_from, question| {
        let Some(shared) = shared.upgrade() else { return Vec::new() };
        let reply = match decode_question(question) {
            Ok(question) => {
                let (summaries, window) = shared.top_summaries(&question.policy, question.by);
                let window_nanos = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
                TopReply { window_nanos, summaries }
            }
            // A question this node cannot read gets an answer that is not a reply (the asker
            // reports this member as missing).
            Err(_) => return Vec::new(),
        };
        encode_message(&reply)
    })
}

impl Lane {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // No poisoning: a panic while holding the lock cannot leave the core half-updated in a
        // way that matters more than stopping every check: keep serving.
        self.state.lock()
    }
}

impl Shared {
    pub(super) fn now(&self) -> ratemesh_core::Instant {
        self.origin.now_instant()
    }

    /// The lane that holds `key`.
    pub(super) fn lane(&self, key: KeyHash) -> &Lane {
        &self.lanes[lane_index(key, self.lanes.len())]
    }

    /// This node's summaries of `policy` by `by` at its now: every lane's top-keys shard, each
    /// read under its lane's lock in turn, combined.
    pub(super) fn top_summaries(&self, policy: &str, by: TopBy) -> (Vec<TopSummary>, Duration) {
        let now = self.now();
        self.top.combine(self.lanes.iter().filter_map(|lane| lane.lock().top.summaries(now, policy, by)))
    }

    /// Bytes of heap memory held by the lanes' top-keys shards.
    pub(super) fn top_heap_bytes(&self) -> usize {
        self.lanes.iter().map(|lane| lane.lock().top.heap_bytes()).sum()
    }

    /// The first lane: every lane sees the same views, so its ring, ranks and join grace are
    /// the node's.
    pub(super) fn first_lane(&self) -> MutexGuard<'_, State> {
        self.lanes[0].lock()
    }

    /// Whether every lane's leave is complete.
    pub(super) fn has_left(&self) -> bool {
        self.lanes_left.load(Ordering::Acquire) == self.lanes.len()
    }

    /// Carries out what a lane's core asked for after an input: frames to send (naming the lane
    /// in their last byte when the node has several), decisions to hand to waiting checks, and a
    /// timer to move earlier.
    pub(super) fn after_input(&self, lane: &Lane, state: &mut State) {
        self.send_and_answer(lane, state);
        self.wake_timer_if_earlier(lane, state);
    }

    /// [`Shared::after_input`] of a check decided without a round trip, which moves the core's
    /// deadline only when it sends a frame (`ratemesh_core::Node::handle_check_now`): the
    /// deadline is read again only then.
    pub(super) fn after_check_now(&self, lane: &Lane, state: &mut State) {
        if self.send_and_answer(lane, state) {
            self.wake_timer_if_earlier(lane, state);
        }
    }

    /// Sends the frames the core queued and hands out its events; returns whether it queued any
    /// frame.
    fn send_and_answer(&self, lane: &Lane, state: &mut State) -> bool {
        let mut sent = false;
        while let Some(transmit) = state.core.poll_transmit() {
            sent = true;
            if let Some(&addr) = state.addrs.get(&transmit.to) {
                let mut frame = transmit.bytes;
                if self.lanes.len() > 1 {
                    frame.push(lane.index);
                }
                // A dropped frame is counted by the transport and retransmitted by the core.
                let _ = self.transport.send(transmit.to, addr, frame);
            }
        }
        while let Some(event) = state.core.poll_event() {
            match event {
                Event::Decided { id, decision } => {
                    if let Some(waiter) = state.waiters.remove(&id) {
                        // The check's caller may have gone away (its future dropped): nothing to do.
                        let _ = waiter.send(decision);
                    }
                }
                Event::Left if !state.left => {
                    state.left = true;
                    if self.lanes_left.fetch_add(1, Ordering::AcqRel) + 1 == self.lanes.len() {
                        self.left.notify_waiters();
                    }
                }
                Event::Left => {}
            }
        }
        sent
    }

    /// Wakes the lane's timer task when the core's deadline moved before the one it sleeps until.
    fn wake_timer_if_earlier(&self, lane: &Lane, state: &mut State) {
        let next = state.core.poll_timeout();
        if next.is_some() && (state.timer_at.is_none() || next < state.timer_at) {
            state.timer_at = next;
            lane.timer_wake.notify_one();
        }
    }

    /// Runs `input` on every lane's core in turn, each under its own lock, and carries out its
    /// outputs.
    pub(super) fn each_lane(&self, mut input: impl FnMut(&mut State)) {
        for lane in &self.lanes {
            let mut state = lane.lock();
            input(&mut state);
            self.after_input(lane, &mut state);
        }
    }

    pub(super) fn spawn_tasks(
        self: &Arc<Self>,
        received: mpsc::Receiver<Received>,
        me: Member,
        members: watch::Sender<Vec<Member>>,
        stop: watch::Receiver<bool>,
        gossip: watch::Receiver<Arc<tokio::sync::Mutex<chitchat::Chitchat>>>,
    ) {
        let mut tasks = Vec::with_capacity(self.lanes.len() + 3);
        for lane in 0..self.lanes.len() {
            tasks.push(tokio::spawn(self.clone().run_timer(lane, stop.clone())));
        }
        tasks.push(tokio::spawn(self.clone().run_receive(received, stop.clone())));
        if let Some(durable) = self.durable.clone() {
            tasks.push(tokio::spawn(self.clone().run_snapshots(durable, stop.clone())));
        }
        let membership =
            Membership::new(me, Arc::clone(&self.transport), gossip, Arc::clone(&self.gossip_counters));
        let sink: Arc<dyn ViewSink> = self.clone();
        tasks.push(tokio::spawn(membership.run(sink, members, self.gossip_interval * 5, stop)));
        self.tasks.lock().extend(tasks);
    }

    /// Restarts gossip whenever it ends while the node runs (see [`supervise`]).
    pub(super) fn spawn_gossip_supervisor(&self, starter: GossipStarter, slot: GossipSlot, generation: u64) {
        let task = tokio::spawn(supervise(starter, slot, generation, self.stop.subscribe()));
        self.tasks.lock().push(task);
    }

    /// The timer task of lane `lane`.
    pub(super) async fn run_timer(self: Arc<Self>, lane: usize, mut stop: watch::Receiver<bool>) {
        let _guard = TaskGuard(self.clone());
        let lane = &self.lanes[lane];
        let mut deadline = next_deadline(&mut lane.lock());
        loop {
            if deadline.is_some_and(|at| at <= self.now()) {
                // Due already (the next slice of a sync round): tokio's timer would round the
                // wait up to a millisecond; a yield lets the runtime's other tasks run first.
                tokio::task::yield_now().await;
                if *stop.borrow() {
                    return;
                }
            } else {
                let sleep_until = deadline.map(|at| self.tokio_instant(at));
                tokio::select! {
                    () = sleep_or_forever(sleep_until) => {}
                    () = lane.timer_wake.notified() => {}
                    _ = stop.wait_for(|stopped| *stopped) => return,
                }
            }
            let mut state = lane.lock();
            let now = self.now();
            if let Some(due) = state.core.poll_timeout().filter(|&at| at <= now) {
                let _span = trace_span!("timers", node = ?self.id).entered();
                state.timer_lag = Duration::from_nanos(now.nanos_since(due));
                state.core.handle_timeout(now);
                self.after_input(lane, &mut state);
            }
            deadline = next_deadline(&mut state);
            // A check waiting for the lock gets it before the next slice of a round does.
            MutexGuard::unlock_fair(state);
        }
    }

    pub(super) async fn run_receive(
        self: Arc<Self>,
        mut received: mpsc::Receiver<Received>,
        mut stop: watch::Receiver<bool>,
    ) {
        let _guard = TaskGuard(self.clone());
        // One turn's frames by lane, kept across turns (its capacity is reused).
        let mut turn: Vec<(usize, Received)> = Vec::with_capacity(FRAMES_PER_TURN_MAX);
        loop {
            let first = tokio::select! {
                frame = received.recv() => match frame { Some(frame) => frame, None => return },
                _ = stop.wait_for(|stopped| *stopped) => return,
            };
            let mut turn_bytes = first.1.len();
            self.take_frame(&mut turn, first);
            while turn.len() < FRAMES_PER_TURN_MAX && turn_bytes < FRAME_BYTES_PER_TURN_MAX {
                let Ok(frame) = received.try_recv() else { break };
                turn_bytes += frame.1.len();
                self.take_frame(&mut turn, frame);
            }
            self.hand_frames(&mut turn);
        }
    }

    /// Adds a received frame to the turn under the lane it names (its last byte, when the node
    /// has several lanes). A frame that names no lane of this node (a peer configured with
    /// another lane count, which gossip would not have proposed) is counted as malformed and
    /// dropped.
    fn take_frame(&self, turn: &mut Vec<(usize, Received)>, (from, mut bytes): Received) {
        let lanes = self.lanes.len();
        let lane = match lanes {
            1 => Some(0),
            _ => bytes.pop().map(usize::from).filter(|&lane| lane < lanes),
        };
        match lane {
            Some(lane) => turn.push((lane, (from, bytes))),
            None => _ = self.frames_unlaned.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Hands a turn of received frames to their lanes' cores, each lane's under one lock, in the
    /// order they arrived within a lane, and empties the turn.
    fn hand_frames(&self, turn: &mut Vec<(usize, Received)>) {
        turn.sort_by_key(|(lane, _)| *lane);
        for group in turn.chunk_by(|a, b| a.0 == b.0) {
            let lane = &self.lanes[group[0].0];
            let mut state = lane.lock();
            let now = self.now();
            for (_, (from, bytes)) in group {
                state.core.handle_frame(now, *from, bytes);
            }
            self.after_input(lane, &mut state);
            MutexGuard::unlock_fair(state);
        }
        turn.clear();
    }

    /// The running chitchat instance, if any.
    pub(super) fn chitchat(&self) -> Option<Arc<tokio::sync::Mutex<chitchat::Chitchat>>> {
        self.gossip.lock().as_ref().map(ChitchatHandle::chitchat)
    }

    /// Refuses new client checks and announces the leave in gossip. Returns how long to keep
    /// owning while peers learn of it (a few gossip rounds, growing with the log of the cluster's
    /// size: epidemic dissemination), or `None` when a shutdown already began.
    pub(super) async fn announce_leave(&self) -> Option<Announced> {
        // Once per node: a task that ended set `leaving` but began no shutdown.
        if self.shutdown_begun.swap(true, Ordering::AcqRel) {
            return None;
        }
        let (mut members, mut peers) = (None, Vec::new());
        for lane in &self.lanes {
            let mut state = lane.lock();
            state.leaving = true;
            if members.is_none() {
                members = Some(state.view.live.len() + state.view.dead.len());
                peers = state.view.live.iter().copied().filter(|&m| m != self.id).collect();
            }
        }
        let members = members.unwrap_or(1);
        let gossip = self.gossip.lock().as_ref().map(ChitchatHandle::chitchat);
        // Without gossip no peer can be heard to know: the leave owns for `own_for`.
        let mut version = u64::MAX;
        if let Some(chitchat) = gossip {
            let mut chitchat = chitchat.lock().await;
            let state = chitchat.self_node_state();
            state.set(KEY_LEAVING, "1");
            version = state.max_version();
        }
        let own_for = self.gossip_interval * (defaults::LEAVE_GOSSIP_ROUNDS_MIN + members.max(1).ilog2() + 1);
        Some(Announced { own_for, version, peers })
    }

    /// Stops the tasks, gossip and the transport.
    pub(super) async fn stop(&self) {
        self.stop.send_replace(true);
        let gossip = self.gossip.lock().take();
        if let Some(gossip) = gossip
            && let Err(error) = gossip.shutdown().await
        {
            debug!(%error, "gossip stopped with an error");
        }
        self.transport.close().await;
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for task in tasks {
            task.abort();
        }
        for lane in &self.lanes {
            lane.lock().waiters.clear();
        }
    }

    /// Takes every lane's durable state out under its lock, `SNAPSHOT_SLOTS_PER_TURN` slots of
    /// its key table per lock (checks go between two pages), and writes it (off the locks) as one
    /// snapshot. Returns once written; `save` stamps the snapshot after the last page (see
    /// `ratemesh_core::Node::export_durable`).
    pub(super) async fn save_snapshot(&self, durable: &Arc<Persistence>) {
        let started = std::time::Instant::now();
        let period_min = durable.settings().period_min;
        // Room for every tracked key, allocated off the locks: a vector growing under one would
        // copy all it holds (milliseconds at a hundred thousand keys).
        let tracked = self.lanes.iter().map(|lane| lane.lock().core.keys_len()).sum();
        let (mut keys, mut export) = (Vec::with_capacity(tracked), Duration::ZERO);
        let mut lane_keys = Vec::new();
        for lane in &self.lanes {
            // A lane's export starts over when its table moves entries between pages (clearing
            // what it exported so far): it goes into its own vector, appended once complete.
            let mut cursor = DurableCursor::default();
            while !cursor.is_done() {
                export += self.export_page(lane, period_min, &mut cursor, &mut lane_keys);
                tokio::task::yield_now().await;
            }
            keys.append(&mut lane_keys);
        }
        durable.save(keys, export, started).await;
    }

    /// One page of a lane's snapshot export under its lock; returns how long it held it.
    fn export_page(
        &self,
        lane: &Lane,
        period_min: Duration,
        cursor: &mut DurableCursor,
        keys: &mut Vec<DurableKey>,
    ) -> Duration {
        let state = lane.lock();
        let started = std::time::Instant::now();
        state.core.export_durable(self.now(), period_min, cursor, SNAPSHOT_SLOTS_PER_TURN, keys);
        let held = started.elapsed();
        MutexGuard::unlock_fair(state);
        held
    }

    /// Writes a snapshot every snapshot interval until the node stops.
    pub(super) async fn run_snapshots(
        self: Arc<Self>,
        durable: Arc<Persistence>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut ticks = tokio::time::interval(durable.settings().interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            self.save_snapshot(&durable).await;
        }
    }

    /// The last snapshot of a graceful shutdown: after the handover (what this node handed on
    /// is kept too, as a follower's view) and after the node stopped, so nothing changes after
    /// it. Once per node.
    pub(super) async fn save_final_snapshot(&self) {
        let Some(durable) = &self.durable else { return };
        if self.final_snapshot.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        self.save_snapshot(durable).await;
        let written = durable.metrics();
        info!(keys = written.last_keys, bytes = written.last_bytes, "final snapshot written");
    }

    pub(super) fn tokio_instant(&self, at: ratemesh_core::Instant) -> tokio::time::Instant {
        self.origin.tokio_instant(at)
    }
}

/// Held by the timer and receive tasks. Should one end while the node runs (a panic in the core,
/// or its runtime shutting down), nothing would flush, expire or answer forwarded checks any more:
/// the node then refuses checks, and those waiting fail at once instead of hanging.
struct TaskGuard(Arc<Shared>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if *self.0.stop.borrow() {
            return;
        }
        for lane in &self.0.lanes {
            let mut state = lane.lock();
            if !state.leaving && lane.index == 0 {
                tracing::error!(node = ?self.0.id, "a node task ended while the node runs: refusing checks");
            }
            state.leaving = true;
            state.waiters.clear();
        }
    }
}

impl ViewSink for Shared {
    fn apply(&self, view: &MemberView, addrs: &HashMap<NodeId, SocketAddr>) {
        let mut moved = ViewChange::default();
        self.each_lane(|state| {
            if state.addrs.len() > DEPARTED_ADDRS_MAX {
                state.addrs.clear();
            }
            let live = addrs.iter().filter(|(id, _)| view.live.contains(id));
            state.addrs.extend(live.map(|(&id, &addr)| (id, addr)));
            state.view = view.clone();
            let change = state.core.handle_membership(self.now(), view.clone());
            // Every lane applies the same view: the members moved alike, the keys add up.
            moved.joined = change.joined;
            moved.departed = change.departed;
            moved.handed_over += change.handed_over;
            moved.taken_over += change.taken_over;
            moved.refollowed += change.refollowed;
        });
        info!(
            node = ?self.id,
            live = view.live.len(),
            dead = view.dead.len(),
            joined = ?moved.joined,
            departed = ?moved.departed,
            keys_handed_over = moved.handed_over,
            keys_taken_over = moved.taken_over,
            keys_refollowed = moved.refollowed,
            "ownership moved"
        );
    }
}

impl SeedSink for Shared {
    fn gossip_with(&self, addr: SocketAddr) {
        let gossip = self.gossip.lock();
        if let Some(gossip) = gossip.as_ref() {
            // Fails only once chitchat has stopped: nothing to gossip with any more.
            let _ = gossip.gossip(addr);
        }
    }

    fn has_live_peer(&self) -> bool {
        self.members.borrow().iter().any(|m| m.id != self.id && m.status == MemberStatus::Live)
    }
}

/// Takes back the stored snapshot, if any, into the lanes' cores (each key into its lane's; the
/// snapshot does not depend on the lane count), which know only themselves: they own every key
/// until the first membership view hands each one to its owner.
pub(super) async fn restore(
    cores: &mut [ratemesh_core::Node],
    durable: &Arc<Persistence>,
    now: ratemesh_core::Instant,
) {
    let Some((keys, age)) = durable.load().await else { return };
    let mut by_lane: Vec<Vec<DurableKey>> = cores.iter().map(|_| Vec::new()).collect();
    for key in keys {
        by_lane[lane_index(key.key, cores.len())].push(key);
    }
    let (mut joined, mut refused) = (0, 0);
    for (core, keys) in cores.iter_mut().zip(by_lane) {
        let stats = core.restore(now, keys, age);
        (joined, refused) = (joined + stats.joined, refused + stats.refused);
    }
    info!(joined, refused, "snapshot restored");
}

/// A lane core's next deadline, which its timer task sleeps until.
fn next_deadline(state: &mut State) -> Option<ratemesh_core::Instant> {
    state.timer_at = state.core.poll_timeout();
    state.timer_at
}

async fn sleep_or_forever(until: Option<tokio::time::Instant>) {
    match until {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A leave announced in gossip ([`Shared::announce_leave`]).
pub(super) struct Announced {
    /// How long the node owns its keys at most before it hands them over.
    pub(super) own_for: Duration,
    /// The version of this node's gossip state that carries the leave.
    pub(super) version: u64,
    /// The live members other than this node: once each showed `version`, all know of the leave.
    pub(super) peers: Vec<NodeId>,
}
