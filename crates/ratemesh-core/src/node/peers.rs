//! Per-peer delivery: sequence numbers, acknowledgements, retransmission, deduplication, and
//! reachability.
//!
//! Every frame a node sends to a peer carries the sender's incarnation, a sequence number and a
//! cumulative acknowledgement of the peer's frames. Sequenced frames are kept until acknowledged
//! and retransmitted after a timeout adapted to the measured round trip, so a lost report, grant
//! or forwarded check is sent again; the receiver drops any sequence number it has seen, so a
//! duplicated or retransmitted frame is applied once. Heartbeats (sequence number 0) are neither
//! retransmitted nor acknowledged; they keep reachability and acknowledgements flowing when there
//! is nothing else to say.
//!
//! Reachability is per direction and per pair, so it notices one-way partitions that gossip
//! membership does not, without a heartbeat between every pair of members: a node *expects* to
//! hear from a peer while they share allowance state (reports and grants flow between them, and
//! heartbeats fill idle intervals); such a peer is reachable while it has been heard from within
//! its silence bound. Any peer is unreachable while a frame sent to it has gone unacknowledged
//! for longer than that bound and nothing newer was acknowledged meanwhile (one lost frame is a
//! loss, not a cut) — also while it is heard from: on a one-way cut towards it, it hears nothing
//! from this node and decides by its share. A peer that went unreachable is sent
//! a probe (an empty sequenced frame) that keeps it so until it acknowledges, after the
//! expectation ran out and across a flap of the view. Each side counts from its own last hearing
//! and its own oldest unacknowledged frame, which do not line up; so a holder of allowances falls
//! back on its share of an owner's limit only once the owner is *cut off*, unreachable for two
//! sync intervals and a timeout longer, by when the owner has counted the holder unreachable too
//! (and enforces the limit less that share). An unreachable member's oldest frame goes again
//! every sync interval, not at its backed-off timeout, so that a healed cut is noticed within an
//! interval; and an owner counts a peer back in its limits only two timeouts after it became
//! reachable again (`Peers::counted_reachable`), by when the peer has heard its
//! acknowledgements and stopped deciding by its share. The silence bound is `peer_silence`, raised to
//! cover two sync intervals and two retransmission timeouts of the peer (a slow link or a long
//! interval is not a partition).
//!
//! Round trips are measured on acknowledged frames (Karn's rule) and smoothed as TCP does
//! (RFC 6298: `srtt`, `rttvar`, `rto = srtt + 4 rttvar`); forwarded checks and allowances are sized
//! from them.

use crate::prelude::*;
use alloc::collections::{BTreeMap, BTreeSet, VecDeque};

use super::api::{NodeId, Transmit};
use crate::time::Instant;
use crate::wire::{self, Body, Frame, WireError};

/// How many sequence numbers beyond the contiguous floor the receiver remembers.
const RECV_WINDOW_LEN_MAX: usize = 4096;
/// How long an acknowledgement may wait for a frame to carry it: 5 ms (under steady traffic the
/// next frame to the peer carries it; alone it costs a frame).
pub(crate) const ACK_DELAY_NANOS: u64 = 5_000_000;
/// The most peers tracked (members plus senders outside the view).
const PEERS_MAX: usize = 4096;
/// Room a new frame keeps for what its retransmissions change: the acknowledgement fields and
/// the audit clock (varints of up to ten bytes each).
const FRAME_SLACK_BYTES: usize = 64;
/// Room a new frame keeps per audit piece: its two ages (varints) grow as it is sent again,
/// from a byte each to six or seven an hour later.
const AUDIT_AGES_GROWTH_BYTES: usize = 12;
/// Two nodes' clocks drift apart by at most one part in this many (500 ppm, the most NTP
/// slews a clock by): how fast the least transit seen of a peer's frames may creep up.
const CLOCK_DRIFT_PARTS: u64 = 2_000;
/// The shortest retransmission timeout, in nanoseconds.
const RTO_MIN_NANOS: u64 = 2_000_000;
/// The longest retransmission timeout, in nanoseconds.
const RTO_MAX_NANOS: u64 = 1_000_000_000;

/// Delivery settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerConfig {
    /// The shortest silence bound (`NodeConfig::peer_silence`).
    pub silence_nanos: u64,
    /// The sync interval: heartbeats fill idle intervals, so silence is measured in them.
    pub sync_nanos: u64,
    pub unacked_frames_max: usize,
    pub rto_initial_nanos: u64,
    pub frame_len_max: usize,
}

/// A frame waiting for its acknowledgement.
#[derive(Debug)]
struct Unacked {
    seq: u64,
    body: Body,
    /// When it was first sent: a peer that has not acknowledged it for longer than the silence
    /// bound is unreachable.
    first_sent_at: Instant,
    sent_at: Instant,
    /// How often it was sent again; each retransmission doubles its timeout (up to the maximum),
    /// so an unreachable peer is not flooded.
    retransmits: u32,
    /// Declared lost by the acknowledgement of a frame sent after it: due again now.
    lost: bool,
}

impl Unacked {
    fn due_at(&self, rto_nanos: u64) -> Instant {
        if self.lost {
            return self.sent_at;
        }
        let backoff = rto_nanos.saturating_mul(1 << self.retransmits.min(16)).min(RTO_MAX_NANOS);
        self.sent_at.add_nanos(backoff)
    }
}

/// What this node knows of one peer.
#[derive(Debug)]
struct Peer {
    /// Whether the peer is in this node's view (heartbeats go to members only).
    member: bool,
    next_seq: u64,
    unacked: VecDeque<Unacked>,
    /// The peer's incarnation and, for it, every sequence number below `floor` has been received,
    /// plus those in `above`.
    recv_incarnation: Option<u64>,
    recv_floor: u64,
    recv_above: BTreeSet<u64>,
    heard_at: Instant,
    last_sent_at: Option<Instant>,
    /// A sequenced frame arrived and no frame has carried its acknowledgement back yet: send one
    /// by then (a delayed acknowledgement, as in TCP, so that replies can carry it instead).
    ack_due_at: Option<Instant>,
    srtt_nanos: Option<u64>,
    rttvar_nanos: u64,
    rto_nanos: u64,
    /// Until then this node expects to hear from the peer (they share allowance state).
    expect_until: Instant,
    /// Until then idle heartbeats to the peer are sequenced, so acknowledged: it holds a lease
    /// of this node's and may be silent for all of it, and only this node's own frames that it
    /// does not acknowledge can show a cut towards it.
    acks_wanted_until: Instant,
    /// Since when the peer owed this node a frame when it left the view (an acknowledgement, or
    /// any frame if this node expected it): the probe sent when it comes back inherits the age,
    /// so a flap of the view does not restart the count.
    left_owing_since: Option<Instant>,
    /// When the peer last acknowledged a frame not acknowledged before: a frame overdue while
    /// newer ones are acknowledged is a loss, not a cut.
    acked_at: Instant,
    /// When a frame from the peer last made it reachable again: its side counts this node
    /// reachable only once its own frames are acknowledged, up to a timeout later.
    back_at: Instant,
    /// The least transit seen lately of the peer's frames that tell their send time.
    transit: Option<Transit>,
}

/// The least of `receive time - send time` over a peer incarnation's frames (the clocks' offset
/// plus the quickest transit), allowed to creep up by the clocks' drift, and when it was last
/// updated.
#[derive(Clone, Copy, Debug)]
struct Transit {
    incarnation: u64,
    least_nanos: i128,
    at: Instant,
}

/// Delivery counters, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeliveryStats {
    /// Frames sent (first transmissions and heartbeats).
    pub frames_sent: u64,
    /// Bytes sent, retransmissions included.
    pub bytes_sent: u64,
    /// Frames received and accepted.
    pub frames_received: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Frames retransmitted.
    pub retransmits: u64,
    /// Frames received twice (dropped).
    pub duplicates: u64,
    /// Frames that did not decode.
    pub malformed: u64,
    /// Frames dropped unacknowledged because a peer's retransmission buffer was full.
    pub overflowed: u64,
    /// Items dropped because no frame of `frame_len_max` bytes holds them (one state larger than
    /// a frame; a body too large for one frame is split over several first), and retransmissions
    /// that grew past the bound (the frame is dropped: it would never be sent).
    pub unencodable: u64,
}

/// The counters of several nodes (a driver's lanes) add up field by field.
impl core::ops::AddAssign for DeliveryStats {
    fn add_assign(&mut self, other: DeliveryStats) {
        let DeliveryStats {
            frames_sent,
            bytes_sent,
            frames_received,
            bytes_received,
            retransmits,
            duplicates,
            malformed,
            overflowed,
            unencodable,
        } = other;
        self.frames_sent += frames_sent;
        self.bytes_sent += bytes_sent;
        self.frames_received += frames_received;
        self.bytes_received += bytes_received;
        self.retransmits += retransmits;
        self.duplicates += duplicates;
        self.malformed += malformed;
        self.overflowed += overflowed;
        self.unencodable += unencodable;
    }
}

/// All peers of this node.
#[derive(Debug)]
pub(crate) struct Peers {
    me: NodeId,
    incarnation: u64,
    config: PeerConfig,
    peers: BTreeMap<NodeId, Peer>,
    stats: DeliveryStats,
}

impl Peers {
    pub fn new(me: NodeId, incarnation: u64, config: PeerConfig) -> Peers {
        Peers { me, incarnation, config, peers: BTreeMap::new(), stats: DeliveryStats::default() }
    }

    pub fn stats(&self) -> DeliveryStats {
        self.stats
    }

    /// The sequence number of the next new frame to `peer` (earlier ones are retransmissions).
    #[cfg(test)]
    pub fn next_seq(&self, peer: NodeId) -> u64 {
        self.peers.get(&peer).map_or(1, |p| p.next_seq)
    }

    /// The smoothed round-trip time to `peer`, once measured.
    pub fn srtt_nanos(&self, peer: NodeId) -> Option<u64> {
        self.peers.get(&peer)?.srtt_nanos
    }

    /// The retransmission timeout of `peer` (`srtt + 4 rttvar`, bounded), once a round trip was
    /// measured.
    pub fn rto_nanos(&self, peer: NodeId) -> Option<u64> {
        let peer = self.peers.get(&peer)?;
        peer.srtt_nanos.map(|_| peer.rto_nanos)
    }

    /// Notes that this node and `peer` share allowance state for the next `for_nanos`: heartbeats
    /// keep the pair talking when idle, and silence from the peer makes it unreachable.
    pub fn expect(&mut self, peer: NodeId, now: Instant, for_nanos: u64) {
        if let Some(peer) = self.peers.get_mut(&peer) {
            peer.expect_until = peer.expect_until.max(now.add_nanos(for_nanos));
        }
    }

    /// Makes idle heartbeats to `peer` sequenced for `for_nanos` from `now`
    /// (`Peer::acks_wanted_until`).
    pub fn want_acks(&mut self, peer: NodeId, now: Instant, for_nanos: u64) {
        if let Some(peer) = self.peers.get_mut(&peer) {
            peer.acks_wanted_until = peer.acks_wanted_until.max(now.add_nanos(for_nanos));
        }
    }

    /// Whether this node expects to hear from `peer` at `now` (and so `peer` expects to hear from
    /// it: the state they share flows both ways).
    pub fn expects(&self, peer: NodeId, now: Instant) -> bool {
        self.peers.get(&peer).is_some_and(|p| p.expect_until > now)
    }

    /// When a frame from `peer` last arrived (its first heartbeat counts).
    pub fn heard_at(&self, peer: NodeId) -> Option<Instant> {
        self.peers.get(&peer).map(|p| p.heard_at)
    }

    /// The smoothed round-trip time to each member peer that has acknowledged a frame.
    pub fn round_trips(&self) -> impl Iterator<Item = (NodeId, u64)> + '_ {
        self.peers.iter().filter(|(_, p)| p.member).filter_map(|(&id, p)| Some((id, p.srtt_nanos?)))
    }

    /// Frames waiting for an acknowledgement, over all peers.
    pub fn unacked_frames(&self) -> usize {
        self.peers.values().map(|peer| peer.unacked.len()).sum()
    }

    /// Frames waiting for an acknowledgement from peers that are reachable at `now` (a leaving
    /// node waits for those; frames to an unreachable peer would make it wait for nothing).
    pub fn unacked_frames_reachable(&self, now: Instant) -> usize {
        let reachable = self.peers.iter().filter(|(_, p)| peer_reachable(&self.config, p, now, 0));
        reachable.map(|(_, peer)| peer.unacked.len()).sum()
    }

    /// Makes the peer set the live members (except this node): new ones start as just heard,
    /// gone ones are forgotten with their unacknowledged frames.
    ///
    /// A peer that leaves the view keeps its sequence numbering (so that, should it come back in
    /// the same incarnation, it does not take our new frames for old ones) but loses its frames
    /// waiting for acknowledgement (they would never be acknowledged) and this node's expectation
    /// to hear from it: if it comes back restarted, it holds nothing of what they shared and stays
    /// quiet, and a stale expectation would hold it unreachable (its owners would enforce the
    /// share of the others) until the expectation ran out.
    ///
    /// Returns a probe (an empty sequenced frame) for each peer that came back into the view: the
    /// view can flap while the data path to a peer stays cut, and that peer may still hold
    /// allowances and decide by its share; without a frame awaiting its acknowledgement, nothing
    /// would make this node count it unreachable again, and it would enforce the whole limit on
    /// top of that share. A peer that left unreachable comes back unreachable until it
    /// acknowledges the probe; a restarted one does within a round trip.
    pub fn set_members(&mut self, live: &[NodeId], now: Instant) -> Vec<Transmit> {
        let mut returned = Vec::new();
        for (&id, peer) in &mut self.peers {
            let member = live.contains(&id);
            if !member && peer.member {
                // What the peer owed when it left: the acknowledgement of the oldest frame it
                // has not acknowledged, and a frame since it was last heard if it was expected.
                let unacked = peer.unacked.front().map(|frame| frame.first_sent_at);
                let expected = (peer.expect_until > now).then_some(peer.heard_at);
                peer.left_owing_since = unacked.into_iter().chain(expected).min();
            }
            if !member {
                peer.unacked.clear();
                peer.expect_until = Instant::ZERO;
            } else if !peer.member {
                peer.heard_at = now;
                returned.push((id, peer.left_owing_since.take().unwrap_or(now)));
            }
            peer.member = member;
        }
        for &id in live.iter().filter(|&&id| id != self.me) {
            let rto_nanos = self.config.rto_initial_nanos;
            self.peers.entry(id).or_insert_with(|| Peer::new(now, rto_nanos, true));
        }
        let probe = |(id, since)| self.send_first_sent_at(id, Body::default(), since, now).ok().flatten();
        returned.into_iter().filter_map(probe).collect()
    }

    /// A probe (an empty sequenced frame, as late as the silence bound) to every member that is
    /// unreachable with no frame awaiting its acknowledgement (it fell silent while this node
    /// expected it): the probe keeps it unreachable until it acknowledges, also after the
    /// expectation ran out. The peer may still decide by its share (it has not heard this node
    /// either), and a peer this node expects nothing from and sends nothing to would otherwise
    /// count as reachable.
    ///
    /// An unreachable member's oldest frame is also sent again if it was last sent a sync
    /// interval ago (one frame per interval, a heartbeat's cost, instead of the backoff's up to a
    /// second): when the cut heals, the pair hears each other within an interval.
    pub fn probes(&mut self, now: Instant) -> Vec<Transmit> {
        let config = self.config;
        let (mut silent, mut again) = (Vec::new(), Vec::new());
        for (&id, peer) in &mut self.peers {
            if !peer.member || peer_reachable(&config, peer, now, 0) {
                continue;
            }
            match peer.unacked.front_mut() {
                Some(frame) if frame.sent_at.add_nanos(config.sync_nanos) <= now => {
                    // Sent again without backing off: a keepalive, not a timeout.
                    frame.sent_at = now;
                    let mut body = frame.body.clone();
                    body.age_audit(now.nanos_since(frame.first_sent_at));
                    again.push((id, frame.seq, body));
                }
                Some(_) => {}
                None => silent.push((id, now.sub_nanos(silence_nanos(&config, peer)))),
            }
        }
        self.stats.retransmits += again.len() as u64;
        let mut transmits: Vec<Transmit> =
            again.into_iter().filter_map(|(id, seq, body)| self.transmit(id, seq, body, now)).collect();
        let probe = |(id, since)| self.send_first_sent_at(id, Body::default(), since, now).ok().flatten();
        transmits.extend(silent.into_iter().filter_map(probe));
        transmits
    }

    /// Whether `peer` is reachable at `now` (see the module documentation).
    pub fn reachable(&self, peer: NodeId, now: Instant) -> bool {
        self.peers.get(&peer).is_some_and(|p| peer_reachable(&self.config, p, now, 0))
    }

    /// Whether `peer` counts as reachable for the limits this node enforces as an owner: reachable,
    /// and for two timeouts since it was last reachable again. A peer that held allowances decides
    /// by its share until it counts this node reachable, which is when its own frames are
    /// acknowledged: a round trip and an acknowledgement delay after this node heard it, or more
    /// (1.4 round trips measured at 80 ms one-way delays).
    pub fn counted_reachable(&self, peer: NodeId, now: Instant) -> bool {
        self.peers.get(&peer).is_some_and(|p| {
            let rto = estimated_rto_or_initial(&self.config, p);
            peer_reachable(&self.config, p, now, 0) && p.back_at.add_nanos(rto.saturating_mul(2)) <= now
        })
    }

    /// Whether `peer` has been unreachable for a while at `now`: long enough that this node's
    /// unreachability of it has reached the peer's side too, which counts from its own last
    /// hearing of this node and its own oldest unacknowledged frame. These differ from this
    /// node's by up to two sync intervals (the pair's frames, heartbeats included, are up to a
    /// sync interval apart each way, and the peer refreshes its reachability at its sync rounds)
    /// and a round trip (the first frame after a one-way cut leaves as an answer).
    pub fn cut_off(&self, peer: NodeId, now: Instant) -> bool {
        self.peers.get(&peer).is_some_and(|p| {
            let rto = estimated_rto_or_initial(&self.config, p);
            let lead = self.config.sync_nanos.saturating_mul(2).saturating_add(rto);
            !peer_reachable(&self.config, p, now, lead)
        })
    }

    /// Sends `body` to `to` reliably (retransmitted until acknowledged). `Ok(None)` when `to` is
    /// not a known peer; `Err(body)`, nothing sent, when the body does not fit in one frame (with
    /// room for what its retransmissions change): the caller splits it.
    pub fn send(&mut self, to: NodeId, body: Body, now: Instant) -> Result<Option<Transmit>, Box<Body>> {
        self.send_first_sent_at(to, body, now, now)
    }

    /// Counts items dropped for want of a frame that holds them.
    pub fn count_unencodable(&mut self, items: usize) {
        self.stats.unencodable += items as u64;
    }

    fn send_first_sent_at(
        &mut self,
        to: NodeId,
        body: Body,
        first_sent_at: Instant,
        now: Instant,
    ) -> Result<Option<Transmit>, Box<Body>> {
        let unacked_max = self.config.unacked_frames_max;
        let Some(peer) = self.peers.get(&to) else { return Ok(None) };
        let seq = peer.next_seq;
        // A retransmission carries other acknowledgements and older audit ages (longer varints).
        let slack = FRAME_SLACK_BYTES + AUDIT_AGES_GROWTH_BYTES * body.audit.len();
        let len_max = self.config.frame_len_max.saturating_sub(slack);
        let (transmit, body) = self.frame(to, seq, body, now, len_max)?;
        let Some(peer) = self.peers.get_mut(&to) else { return Ok(None) };
        peer.next_seq += 1;
        if peer.unacked.len() >= unacked_max {
            peer.unacked.pop_front();
            self.stats.overflowed += 1;
        }
        peer.unacked.push_back(Unacked {
            seq,
            body,
            first_sent_at,
            sent_at: now,
            retransmits: 0,
            lost: false,
        });
        self.stats.frames_sent += 1;
        Ok(Some(transmit))
    }

    /// A heartbeat to every member this node expects to hear from and has not sent anything for
    /// `idle_nanos`: pairs that share no allowance state stay quiet.
    pub fn heartbeats(&mut self, now: Instant, idle_nanos: u64) -> Vec<Transmit> {
        self.heartbeat_where(now, |p| {
            p.member
                && p.expect_until > now
                && p.last_sent_at.is_none_or(|at| at.add_nanos(idle_nanos) <= now)
        })
    }

    /// Retransmits every frame whose timeout has passed.
    pub fn retransmits(&mut self, now: Instant) -> Vec<Transmit> {
        let mut due = Vec::new();
        for (&id, peer) in &mut self.peers {
            let rto = peer.rto_nanos;
            let mut timed_out = false;
            for frame in peer.unacked.iter_mut().filter(|f| f.due_at(rto) <= now) {
                // A loss the acknowledgements showed is no sign of a slower path: no backoff.
                timed_out |= frame.retransmits == 0 && !frame.lost;
                frame.lost = false;
                frame.sent_at = now;
                frame.retransmits += 1;
                let mut body = frame.body.clone();
                body.age_audit(now.nanos_since(frame.first_sent_at));
                due.push((id, frame.seq, body));
            }
            // A timeout backs the peer's timeout off until a frame sent once is acknowledged
            // (RFC 6298 5.5): with a timeout below the round trip every frame would be sent twice,
            // and Karn's rule would never let a sample correct it.
            if timed_out {
                peer.rto_nanos = rto.saturating_mul(2).min(RTO_MAX_NANOS);
            }
        }
        self.stats.retransmits += due.len() as u64;
        due.into_iter().filter_map(|(id, seq, body)| self.transmit(id, seq, body, now)).collect()
    }

    /// The earliest retransmission or delayed acknowledgement.
    pub fn next_timeout(&self) -> Option<Instant> {
        let frames = self.peers.values().flat_map(|p| p.unacked.iter().map(|f| f.due_at(p.rto_nanos)));
        let acks = self.peers.values().filter_map(|p| p.ack_due_at);
        frames.chain(acks).min()
    }

    /// Acknowledgements that waited long enough for a frame to carry them: sent alone.
    pub fn acks(&mut self, now: Instant) -> Vec<Transmit> {
        self.heartbeat_where(now, |p| p.ack_due_at.is_some_and(|at| at <= now))
    }

    /// A heartbeat (header only: acknowledgement and liveness) to every peer that is `due`.
    fn heartbeat_where(&mut self, now: Instant, due: impl Fn(&Peer) -> bool) -> Vec<Transmit> {
        let (mut plain, mut sequenced) = (Vec::new(), Vec::new());
        for (&id, peer) in self.peers.iter().filter(|(_, p)| due(p)) {
            // A frame in flight already shows a cut when it goes unacknowledged.
            match peer.acks_wanted_until > now && peer.unacked.is_empty() {
                true => sequenced.push(id),
                false => plain.push(id),
            }
        }
        self.stats.frames_sent += plain.len() as u64;
        let mut transmits: Vec<Transmit> =
            plain.into_iter().filter_map(|id| self.transmit(id, 0, Body::default(), now)).collect();
        transmits.extend(
            sequenced.into_iter().filter_map(|id| self.send(id, Body::default(), now).ok().flatten()),
        );
        transmits
    }

    /// Decodes a frame from `from`; `Ok(None)` for a duplicate or a stranger, `Ok(Some((order,
    /// body)))` for news. `order` (the sender's incarnation, then the frame's sequence number)
    /// grows with every frame the sender sends: frames may arrive out of order, and state that
    /// replaces earlier state is applied only from a later frame. Acknowledgements and
    /// reachability are updated either way.
    pub fn receive(
        &mut self,
        from: NodeId,
        bytes: &[u8],
        now: Instant,
    ) -> Result<Option<(u128, Body)>, WireError> {
        let frame = match wire::decode(bytes, self.config.frame_len_max) {
            Ok(frame) => frame,
            Err(error) => {
                self.stats.malformed += 1;
                return Err(error);
            }
        };
        self.stats.bytes_received += bytes.len() as u64;
        // The transport authenticates `from`; a frame claiming another sender is not trusted.
        if frame.from != from.0 {
            self.stats.malformed += 1;
            return Err(WireError::ForgedSender { from: from.0, claimed: frame.from });
        }
        let config = self.config;
        let Some(peer) = self.peer_for_sender(from, now) else { return Ok(None) };
        if peer.recv_incarnation.is_some_and(|known| known > frame.incarnation) {
            // From a previous life of the peer, delayed in the network.
            self.stats.duplicates += 1;
            return Ok(None);
        }
        let was_reachable = peer_reachable(&config, peer, now, 0);
        peer.heard_at = now;
        peer.on_ack(frame.ack, frame.sack, now);
        peer.skip_to(frame.incarnation, frame.una);
        if !was_reachable && peer_reachable(&config, peer, now, 0) {
            peer.back_at = now;
        }
        if frame.seq == 0 {
            return Ok(None);
        }
        // Acknowledge even a duplicate: the sender retransmitted because it missed our ack.
        peer.ack_due_at.get_or_insert(now.add_nanos(ACK_DELAY_NANOS));
        if !peer.accept(frame.seq) {
            self.stats.duplicates += 1;
            return Ok(None);
        }
        let mut body = frame.body;
        // Audit pieces are placed by their ages from the arrival: a frame that waited on the way
        // is placed back by the wait (its retransmissions, re-aged, queue behind it on a stream).
        if let Some(clock) = body.audit_clock_nanos.take() {
            body.age_audit(peer.lateness_nanos(frame.incarnation, clock, now));
        }
        self.stats.frames_received += 1;
        let order = u128::from(frame.incarnation) << 64 | u128::from(frame.seq);
        Ok(Some((order, body)))
    }

    /// The peer state of an authenticated sender; a sender outside the view (a member that just
    /// left and hands its keys over, or one this node's view has not caught up with) gets one,
    /// up to a bound.
    fn peer_for_sender(&mut self, from: NodeId, now: Instant) -> Option<&mut Peer> {
        if !self.peers.contains_key(&from) && self.peers.len() < PEERS_MAX && from != self.me {
            self.peers.insert(from, Peer::new(now, self.config.rto_initial_nanos, false));
        }
        self.peers.get_mut(&from)
    }

    /// Frame `seq` (0: a heartbeat) of `body` to `to`, sent again or alone; a frame that no
    /// longer fits is dropped from the unacknowledged ones (counted), never retried forever.
    fn transmit(&mut self, to: NodeId, seq: u64, body: Body, now: Instant) -> Option<Transmit> {
        if !self.peers.contains_key(&to) {
            return None;
        }
        match self.frame(to, seq, body, now, self.config.frame_len_max) {
            Ok((transmit, _)) => Some(transmit),
            Err(body) => {
                self.stats.unencodable += body.items().max(1) as u64;
                if let Some(peer) = self.peers.get_mut(&to) {
                    peer.unacked.retain(|frame| frame.seq != seq);
                }
                None
            }
        }
    }

    /// Encodes `body` as frame `seq` to `to` in at most `len_max` bytes: the transmit and the body
    /// back (for the unacknowledged queue), or the body alone when it does not fit (nothing sent).
    fn frame(
        &mut self,
        to: NodeId,
        seq: u64,
        mut body: Body,
        now: Instant,
        len_max: usize,
    ) -> Result<(Transmit, Body), Box<Body>> {
        let Some(peer) = self.peers.get_mut(&to) else { return Err(Box::new(body)) };
        let una = peer.unacked.front().map_or(peer.next_seq, |f| f.seq);
        // The audit pieces' ages count back from now (see `Peer::lateness_nanos`).
        body.audit_clock_nanos = (!body.audit.is_empty()).then(|| now.as_nanos());
        let (ack, sack) = (peer.recv_floor, peer.sack_bits());
        let frame = Frame { from: self.me.0, incarnation: self.incarnation, seq, ack, sack, una, body };
        let Ok(bytes) = wire::encode(&frame, len_max) else { return Err(Box::new(frame.body)) };
        peer.last_sent_at = Some(now);
        peer.ack_due_at = None;
        self.stats.bytes_sent += bytes.len() as u64;
        Ok((Transmit { to, bytes }, frame.body))
    }
}

/// Whether `peer` is reachable at `now`, with the silence bound `extra_nanos` longer (see the
/// module documentation).
fn peer_reachable(config: &PeerConfig, peer: &Peer, now: Instant, extra_nanos: u64) -> bool {
    let silence = silence_nanos(config, peer).saturating_add(extra_nanos);
    let overdue = peer.unacked.front().is_some_and(|f| f.first_sent_at.add_nanos(silence) <= now)
        && peer.acked_at.add_nanos(silence) <= now;
    !overdue && (peer.heard_at.add_nanos(silence) > now || peer.expect_until <= now)
}

/// How long `peer` may be silent before it counts as unreachable.
///
/// The slack counts the round-trip estimate's timeout, not the backed-off one: backing off
/// doubles the timeout at each loss, so a silence bound that followed it would grow faster than
/// the silence itself and a cut-off peer would never count as unreachable here, while that peer
/// (which heard this node later, or backed off less) already decided by its share of the limit
/// on top of this node's whole limit.
fn silence_nanos(config: &PeerConfig, peer: &Peer) -> u64 {
    let rto = estimated_rto_or_initial(config, peer);
    let slack = config.sync_nanos.saturating_add(rto).saturating_mul(2);
    config.silence_nanos.max(slack)
}

/// `peer`'s retransmission timeout as its round trips estimate it (no backoff), or the initial
/// one before any was measured.
fn estimated_rto_or_initial(config: &PeerConfig, peer: &Peer) -> u64 {
    peer.estimated_rto_nanos().unwrap_or(config.rto_initial_nanos)
}

impl Peer {
    fn new(now: Instant, rto_nanos: u64, member: bool) -> Peer {
        Peer {
            member,
            next_seq: 1,
            unacked: VecDeque::new(),
            recv_incarnation: None,
            recv_floor: 0,
            recv_above: BTreeSet::new(),
            heard_at: now,
            last_sent_at: None,
            ack_due_at: None,
            srtt_nanos: None,
            rttvar_nanos: 0,
            rto_nanos,
            expect_until: Instant::ZERO,
            acks_wanted_until: Instant::ZERO,
            left_owing_since: None,
            back_at: Instant::ZERO,
            acked_at: now,
            transit: None,
        }
    }

    /// How much longer than the quickest of the peer's frames lately a frame of `incarnation`
    /// sent at `clock` (the peer's clock) took to arrive at `now`: how long it waited on the way
    /// (a stream stalled behind a loss or a cut delivers what it held when the path heals).
    fn lateness_nanos(&mut self, incarnation: u64, clock: u64, now: Instant) -> u64 {
        let transit = i128::from(now.as_nanos()) - i128::from(clock);
        let least = match self.transit {
            Some(t) if t.incarnation == incarnation => {
                let drift = i128::from(now.nanos_since(t.at) / CLOCK_DRIFT_PARTS);
                transit.min(t.least_nanos.saturating_add(drift))
            }
            _ => transit,
        };
        self.transit = Some(Transit { incarnation, least_nanos: least, at: now });
        u64::try_from(transit - least).unwrap_or(0)
    }

    /// Drops frames the peer has acknowledged (`ack`: it has every sequence number below; `sack`:
    /// the ones above it whose bits are set), samples the round trip from the newest of them if
    /// it was sent once (Karn's rule), and declares lost the frames sent before the newest one
    /// acknowledged and longer ago than the round-trip bound (RFC 9002's time threshold, but
    /// neither its 9/8 of a round trip nor its packet threshold: jitter of a round trip's size
    /// reorders frames sent microseconds apart, and both resent frames that were on their way).
    /// An acknowledgement of anything new ends the backoff (RFC 9002, 6.2.1): under random loss a
    /// timeout doubled at every lost frame would soon stay at its maximum, and every check
    /// forwarded across a lossy link would wait for it.
    fn on_ack(&mut self, ack: u64, sack: u64, now: Instant) {
        if ack > self.next_seq {
            // Acknowledges frames this incarnation never sent: it refers to a previous life of
            // this node, and says nothing about the current one.
            return;
        }
        let acked =
            |seq: u64| seq < ack || (seq > ack && seq - ack <= 64 && sack >> (seq - ack - 1) & 1 == 1);
        // The newest frame this acknowledgement covers, by sequence: (seq, sent_at, sent once).
        let mut newest: Option<(u64, Instant, bool)> = None;
        self.unacked.retain(|frame| {
            let done = acked(frame.seq);
            if done && newest.is_none_or(|(seq, _, _)| seq < frame.seq) {
                newest = Some((frame.seq, frame.sent_at, frame.retransmits == 0));
            }
            !done
        });
        let Some((_, newest_sent_at, sent_once)) = newest else { return };
        self.acked_at = now;
        // One sample per acknowledgement, of its newest frame (RFC 9002, 5.1): an older frame
        // covered only now had its own acknowledgement lost, and its wait is no round trip.
        if sent_once {
            self.sample_rtt(now.nanos_since(newest_sent_at));
        }
        self.rto_nanos = self.estimated_rto_nanos().unwrap_or(self.rto_nanos);
        // No acknowledgement delay: acknowledgements are flowing, this one just came.
        let Some(threshold) = self.round_trip_bound_nanos() else { return };
        for frame in self.unacked.iter_mut().filter(|f| f.sent_at < newest_sent_at) {
            frame.lost |= frame.sent_at.add_nanos(threshold) <= now;
        }
    }

    /// The selective acknowledgement bits for the frames received above the floor.
    fn sack_bits(&self) -> u64 {
        let above = self.recv_above.range(self.recv_floor + 1..=self.recv_floor + 64);
        above.fold(0, |bits, &seq| bits | 1 << (seq - self.recv_floor - 1))
    }

    /// RFC 6298: `srtt` and `rttvar` smoothed with gains 1/8 and 1/4; the timeout is QUIC's
    /// (RFC 9002's PTO): `srtt + 4 rttvar` plus the peer's acknowledgement delay, which a sample
    /// may or may not include (an acknowledgement alone waits for it, one carried by an answer does
    /// not) — without it, every acknowledgement that waits looks lost.
    fn sample_rtt(&mut self, rtt_nanos: u64) {
        let (srtt, rttvar) = match self.srtt_nanos {
            None => (rtt_nanos, rtt_nanos / 2),
            Some(srtt) => {
                let rttvar = self.rttvar_nanos - self.rttvar_nanos / 4 + srtt.abs_diff(rtt_nanos) / 4;
                (srtt - srtt / 8 + rtt_nanos / 8, rttvar)
            }
        };
        self.srtt_nanos = Some(srtt);
        self.rttvar_nanos = rttvar;
        self.rto_nanos = self.estimated_rto_nanos().unwrap_or(RTO_MAX_NANOS);
    }

    /// The timeout the round-trip estimate gives, before any backoff (`None` before a sample).
    fn estimated_rto_nanos(&self) -> Option<u64> {
        Some(self.round_trip_bound_nanos()?.saturating_add(ACK_DELAY_NANOS).min(RTO_MAX_NANOS))
    }

    /// `srtt + 4 rttvar`, at least the shortest timeout: a round trip this long is late.
    fn round_trip_bound_nanos(&self) -> Option<u64> {
        let bound = self.srtt_nanos?.saturating_add(self.rttvar_nanos.saturating_mul(4));
        Some(bound.max(RTO_MIN_NANOS))
    }

    /// Follows the peer's own view of what it still waits for: a new incarnation starts a new
    /// numbering, and sequence numbers below `una` (the sender's oldest unacknowledged frame) will
    /// never come again, so nothing below it needs remembering.
    fn skip_to(&mut self, incarnation: u64, una: u64) {
        if self.recv_incarnation != Some(incarnation) {
            if self.recv_incarnation.is_some() {
                // The peer restarted (before the view noticed): what they shared died with its
                // previous life, and the new one will not keep talking for it.
                self.expect_until = Instant::ZERO;
            }
            self.recv_incarnation = Some(incarnation);
            self.recv_floor = una;
            self.recv_above.clear();
        }
        if una > self.recv_floor {
            self.recv_floor = una;
            self.recv_above = self.recv_above.split_off(&una);
        }
        self.advance_floor();
    }

    /// Whether `seq` (of the current incarnation) is new; records it.
    fn accept(&mut self, seq: u64) -> bool {
        if seq < self.recv_floor
            || self.recv_above.len() >= RECV_WINDOW_LEN_MAX
            || !self.recv_above.insert(seq)
        {
            return false;
        }
        self.advance_floor();
        true
    }

    fn advance_floor(&mut self) {
        while self.recv_above.remove(&self.recv_floor) {
            self.recv_floor += 1;
        }
    }
}
