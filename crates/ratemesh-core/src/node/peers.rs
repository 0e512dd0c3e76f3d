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
//! A peer is *reachable* while it has been heard from within `peer_silence` (a member that just
//! appeared counts as heard at that moment). Reachability is per direction and per pair, so it
//! notices one-way partitions that gossip membership does not.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::api::{NodeId, Transmit};
use crate::time::Instant;
use crate::wire::{self, Body, Frame, WireError};

/// How many sequence numbers beyond the contiguous floor the receiver remembers.
const RECV_WINDOW_LEN_MAX: usize = 4096;
/// How long an acknowledgement may wait for a frame to carry it: 1 ms.
const ACK_DELAY_NANOS: u64 = 1_000_000;
/// The most peers tracked (members plus senders outside the view).
const PEERS_MAX: usize = 4096;
/// The shortest retransmission timeout, in nanoseconds.
const RTO_MIN_NANOS: u64 = 2_000_000;
/// The longest retransmission timeout, in nanoseconds.
const RTO_MAX_NANOS: u64 = 1_000_000_000;

/// Delivery settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerConfig {
    pub silence_nanos: u64,
    pub unacked_frames_max: usize,
    pub rto_initial_nanos: u64,
    pub frame_len_max: usize,
}

/// A frame waiting for its acknowledgement.
#[derive(Debug)]
struct Unacked {
    seq: u64,
    body: Body,
    sent_at: Instant,
    /// How often it was sent again; each retransmission doubles its timeout (up to the maximum),
    /// so an unreachable peer is not flooded.
    retransmits: u32,
}

impl Unacked {
    fn due_at(&self, rto_nanos: u64) -> Instant {
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
    rto_nanos: u64,
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

    /// The smoothed round-trip time to each member peer that has acknowledged a frame.
    pub fn round_trips(&self) -> impl Iterator<Item = (NodeId, u64)> + '_ {
        self.peers.iter().filter(|(_, p)| p.member).filter_map(|(&id, p)| Some((id, p.srtt_nanos?)))
    }

    /// Frames waiting for an acknowledgement, over all peers.
    pub fn unacked_frames(&self) -> usize {
        self.peers.values().map(|peer| peer.unacked.len()).sum()
    }

    /// Makes the peer set the live members (except this node): new ones start as just heard,
    /// gone ones are forgotten with their unacknowledged frames.
    ///
    /// A peer that leaves the view keeps its sequence numbering (so that, should it come back in
    /// the same incarnation, it does not take our new frames for old ones) but loses its frames
    /// waiting for acknowledgement: they would never be acknowledged.
    pub fn set_members(&mut self, live: &[NodeId], now: Instant) {
        for (id, peer) in &mut self.peers {
            let member = live.contains(id);
            if !member {
                peer.unacked.clear();
            } else if !peer.member {
                peer.heard_at = now;
            }
            peer.member = member;
        }
        for &id in live.iter().filter(|&&id| id != self.me) {
            let rto_nanos = self.config.rto_initial_nanos;
            self.peers.entry(id).or_insert_with(|| Peer::new(now, rto_nanos, true));
        }
    }

    /// Whether `peer` has been heard from within the silence bound.
    pub fn reachable(&self, peer: NodeId, now: Instant) -> bool {
        self.peers.get(&peer).is_some_and(|p| p.heard_at.add_nanos(self.config.silence_nanos) > now)
    }

    /// Sends `body` to `to` reliably (retransmitted until acknowledged). `None` when `to` is not
    /// a known peer or the frame cannot be encoded.
    pub fn send(&mut self, to: NodeId, body: Body, now: Instant) -> Option<Transmit> {
        let unacked_max = self.config.unacked_frames_max;
        let peer = self.peers.get_mut(&to)?;
        let seq = peer.next_seq;
        peer.next_seq += 1;
        if peer.unacked.len() >= unacked_max {
            peer.unacked.pop_front();
            self.stats.overflowed += 1;
        }
        peer.unacked.push_back(Unacked { seq, body: body.clone(), sent_at: now, retransmits: 0 });
        self.stats.frames_sent += 1;
        self.transmit(to, seq, body, now)
    }

    /// A heartbeat to every member that has not been sent anything for `idle_nanos`.
    pub fn heartbeats(&mut self, now: Instant, idle_nanos: u64) -> Vec<Transmit> {
        self.heartbeat_where(now, |p| {
            p.member && p.last_sent_at.is_none_or(|at| at.add_nanos(idle_nanos) <= now)
        })
    }

    /// Retransmits every frame whose timeout has passed.
    pub fn retransmits(&mut self, now: Instant) -> Vec<Transmit> {
        let mut due = Vec::new();
        for (&id, peer) in &mut self.peers {
            let rto = peer.rto_nanos;
            for frame in peer.unacked.iter_mut().filter(|f| f.due_at(rto) <= now) {
                frame.sent_at = now;
                frame.retransmits += 1;
                due.push((id, frame.seq, frame.body.clone()));
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
        let ids: Vec<NodeId> = self.peers.iter().filter(|(_, p)| due(p)).map(|(&id, _)| id).collect();
        self.stats.frames_sent += ids.len() as u64;
        ids.into_iter().filter_map(|id| self.transmit(id, 0, Body::Heartbeat, now)).collect()
    }

    /// Decodes a frame from `from`; `Ok(None)` for a duplicate or a stranger, `Ok(Some(body))`
    /// for news. Acknowledgements and reachability are updated either way.
    pub fn receive(&mut self, from: NodeId, bytes: &[u8], now: Instant) -> Result<Option<Body>, WireError> {
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
            return Err(WireError::Malformed(format!(
                "frame from {} claims to be from {}",
                from.0, frame.from
            )));
        }
        let Some(peer) = self.peer_for_sender(from, now) else { return Ok(None) };
        if peer.recv_incarnation.is_some_and(|known| known > frame.incarnation) {
            // From a previous life of the peer, delayed in the network.
            self.stats.duplicates += 1;
            return Ok(None);
        }
        peer.heard_at = now;
        peer.on_ack(frame.ack, now);
        peer.skip_to(frame.incarnation, frame.una);
        if frame.seq == 0 {
            return Ok(None);
        }
        // Acknowledge even a duplicate: the sender retransmitted because it missed our ack.
        peer.ack_due_at.get_or_insert(now.add_nanos(ACK_DELAY_NANOS));
        if !peer.accept(frame.seq) {
            self.stats.duplicates += 1;
            return Ok(None);
        }
        self.stats.frames_received += 1;
        Ok(Some(frame.body))
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

    fn transmit(&mut self, to: NodeId, seq: u64, body: Body, now: Instant) -> Option<Transmit> {
        let peer = self.peers.get_mut(&to)?;
        peer.last_sent_at = Some(now);
        peer.ack_due_at = None;
        let una = peer.unacked.front().map_or(peer.next_seq, |f| f.seq);
        let frame =
            Frame { from: self.me.0, incarnation: self.incarnation, seq, ack: peer.recv_floor, una, body };
        let bytes = wire::encode(&frame, self.config.frame_len_max).ok()?;
        self.stats.bytes_sent += bytes.len() as u64;
        Some(Transmit { to, bytes })
    }
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
            rto_nanos,
        }
    }

    /// Drops frames the peer has acknowledged (`ack`: it has every sequence number below) and
    /// samples the round trip from a frame that was sent once (Karn's rule).
    fn on_ack(&mut self, ack: u64, now: Instant) {
        if ack > self.next_seq {
            // Acknowledges frames this incarnation never sent: it refers to a previous life of
            // this node, and says nothing about the current one.
            return;
        }
        while let Some(front) = self.unacked.front() {
            if front.seq >= ack {
                break;
            }
            if front.retransmits == 0 {
                self.sample_rtt(now.nanos_since(front.sent_at));
            }
            self.unacked.pop_front();
        }
    }

    fn sample_rtt(&mut self, rtt_nanos: u64) {
        let srtt = match self.srtt_nanos {
            None => rtt_nanos,
            Some(srtt) => srtt - srtt / 8 + rtt_nanos / 8,
        };
        self.srtt_nanos = Some(srtt);
        self.rto_nanos = srtt.saturating_mul(2).clamp(RTO_MIN_NANOS, RTO_MAX_NANOS);
    }

    /// Follows the peer's own view of what it still waits for: a new incarnation starts a new
    /// numbering, and sequence numbers below `una` (the sender's oldest unacknowledged frame) will
    /// never come again, so nothing below it needs remembering.
    fn skip_to(&mut self, incarnation: u64, una: u64) {
        if self.recv_incarnation != Some(incarnation) {
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
