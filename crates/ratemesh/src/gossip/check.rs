//! What an authenticated gossip message may contain, checked before chitchat parses it.
//!
//! Authentication keeps outsiders out; this keeps an insider's bug or attack (a member holding
//! the key) from panicking or bloating a node. The message is decoded here with chitchat 0.13's
//! wire format (magic, version, type; digests of node ids with heartbeats and versions; deltas
//! as a block stream of node, key-value and max-version operations, zstd-compressed or not)
//! into a [`Summary`], under [`GossipLimits`], and refused ([`Reject::Malformed`] or
//! [`Reject::OverBound`]) when it is not what a ratemesh node sends:
//!
//! - anything chitchat itself would refuse to decode, and trailing bytes;
//! - more than `decompressed_bytes_max` bytes once decompressed (a compression bomb is cut off
//!   after that many bytes, never decompressed whole);
//! - node ids that are not canonical decimal [`ratemesh_core::NodeId`]s; more than `nodes_max`
//!   digest entries or node deltas; keys or values longer than their bounds;
//! - a max-version operation after key-values (chitchat asserts, and panics, when a delta's max
//!   version is below its key-values' versions) or twice for one node;
//! - deletions and garbage-collection versions: ratemesh never deletes a gossip key, so a
//!   non-zero `last_gc_version` or a tombstone can only be forged — and they are what resets a
//!   node's state (wiping its keys);
//! - heartbeats and versions above [`COUNTER_MAX`] (a heartbeat of 2⁶⁴−1 would make a member
//!   dead for good).
//!
//! Then, against chitchat's current state ([`check_against`]): nothing about this node's own
//! state (only this node writes it) or a newer generation of its id (this node is the newest
//! while it runs); no digest that would grow the state past `nodes_max` nodes (chitchat's own
//! digest must fit in a datagram: it panics when it does not); no key-values that would give a
//! node more than `keys_per_node_max` keys; no heartbeat or max version that jumps more than
//! `counter_jump_max` past what this node knows.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use chitchat::{Chitchat, ChitchatId};

use super::seal::Reject;
use crate::defaults;
use crate::membership::parse_node_id;

/// chitchat's magic number, first two bytes (little-endian) of every message.
const MAGIC: u16 = 45_139;
/// The largest block of a compressed stream, decompressed (chitchat's own bound).
const BLOCK_LEN_MAX: usize = u16::MAX as usize;
/// The largest heartbeat or version accepted: at a million increments per second, 8.9 years.
pub const COUNTER_MAX: u64 = 1 << 48;
/// The longest cluster id a Syn may carry, in bytes.
const CLUSTER_ID_LEN_MAX: usize = 255;

/// Bounds on what one authenticated gossip message may carry and make the state grow to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GossipLimits {
    /// Gossip entries (node id and generation) the state may hold; also the most digest entries
    /// or node deltas in one message. Default [`defaults::GOSSIP_NODES_MAX`]; at most
    /// [`GossipLimits::NODES_MAX_MAX`], so that this node's own digest always fits in one datagram.
    pub nodes_max: usize,
    /// Keys one entry may have (ratemesh uses three). Default [`defaults::GOSSIP_KEYS_PER_NODE_MAX`].
    pub keys_per_node_max: usize,
    /// The longest key, in bytes. Default [`defaults::GOSSIP_KEY_LEN_MAX`].
    pub key_len_max: usize,
    /// The longest value, in bytes. Default [`defaults::GOSSIP_VALUE_LEN_MAX`].
    pub value_len_max: usize,
    /// The most bytes one message may decompress to. Default
    /// [`defaults::GOSSIP_DECOMPRESSED_BYTES_MAX`] (1 MiB).
    pub decompressed_bytes_max: usize,
    /// How far past the known value a heartbeat or a max version may jump in one message.
    /// Default [`defaults::GOSSIP_COUNTER_JUMP_MAX`], 2²⁰ (about six hours of heartbeats at 50 per
    /// second).
    pub counter_jump_max: u64,
}

impl GossipLimits {
    /// The largest accepted `nodes_max`: chitchat sends its whole digest in one datagram and
    /// panics when the rest of the datagram has less than 100 bytes for the delta. An entry is at
    /// most 73 bytes (a 20-digit id, an IPv6 address, three counters).
    pub const NODES_MAX_MAX: usize = 800;
}

impl Default for GossipLimits {
    fn default() -> Self {
        GossipLimits {
            nodes_max: defaults::GOSSIP_NODES_MAX,
            keys_per_node_max: defaults::GOSSIP_KEYS_PER_NODE_MAX,
            key_len_max: defaults::GOSSIP_KEY_LEN_MAX,
            value_len_max: defaults::GOSSIP_VALUE_LEN_MAX,
            decompressed_bytes_max: defaults::GOSSIP_DECOMPRESSED_BYTES_MAX,
            counter_jump_max: defaults::GOSSIP_COUNTER_JUMP_MAX,
        }
    }
}

/// A digest entry: what the sender knows of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DigestEntry {
    /// The node.
    pub id: ChitchatId,
    /// Its heartbeat as the sender knows it.
    pub heartbeat: u64,
    /// Its max version as the sender knows it.
    pub max_version: u64,
}

/// A node delta: updates to one node's key-values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDelta {
    /// The node.
    pub id: ChitchatId,
    /// The max version after the delta.
    pub max_version: u64,
    /// The keys it sets.
    pub keys: Vec<String>,
}

/// What an accepted message carries, as far as the checks against the state need it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// The digest (Syn, SynAck).
    pub digest: Vec<DigestEntry>,
    /// The delta (SynAck, Ack).
    pub deltas: Vec<NodeDelta>,
}

/// Decodes `message` (a chitchat envelope) under `limits` without applying it: its summary, or
/// why it is refused.
pub fn summarize(message: &[u8], limits: &GossipLimits) -> Result<Summary, Reject> {
    let mut input = Input { bytes: message, decompressed: 0, limits };
    let magic = input.u16()?;
    let version = input.u8()?;
    let kind = input.u8()?;
    if magic != MAGIC || version > 1 {
        return Err(Reject::Malformed);
    }
    let mut summary = Summary::default();
    match kind {
        // Syn: digest, cluster id.
        0 => {
            summary.digest = input.digest(version)?;
            input.string(CLUSTER_ID_LEN_MAX)?;
        }
        // SynAck: digest, delta.
        1 => {
            summary.digest = input.digest(version)?;
            summary.deltas = input.delta()?;
        }
        // Ack: delta.
        2 => summary.deltas = input.delta()?,
        // BadCluster: nothing.
        3 => {}
        _ => return Err(Reject::Malformed),
    }
    if !input.bytes.is_empty() {
        return Err(Reject::Malformed);
    }
    Ok(summary)
}

/// Checks `summary` against chitchat's current state (see the module documentation).
pub fn check_against(summary: &Summary, chitchat: &Chitchat, limits: &GossipLimits) -> Result<(), Reject> {
    let me = chitchat.self_chitchat_id();
    let states = chitchat.node_states();
    let newer_me = |id: &ChitchatId| id.node_id == me.node_id && id.generation_id > me.generation_id;
    let mut new_nodes = BTreeSet::new();
    for entry in &summary.digest {
        if newer_me(&entry.id) {
            return Err(Reject::Malformed);
        }
        match states.get(&entry.id) {
            Some(state) => {
                let known = u64::from(state.heartbeat());
                if known > 0 && entry.heartbeat > known.saturating_add(limits.counter_jump_max) {
                    return Err(Reject::OverBound);
                }
            }
            None => {
                new_nodes.insert(&entry.id);
            }
        }
    }
    if states.len() + new_nodes.len() > limits.nodes_max {
        return Err(Reject::OverBound);
    }
    for delta in &summary.deltas {
        if delta.id == *me || newer_me(&delta.id) {
            return Err(Reject::Malformed);
        }
        // chitchat applies deltas to known nodes only.
        let Some(state) = states.get(&delta.id) else { continue };
        if delta.max_version > state.max_version().saturating_add(limits.counter_jump_max) {
            return Err(Reject::OverBound);
        }
        let known = state.key_values_including_deleted().count();
        let new = delta.keys.iter().filter(|key| state.get_versioned(key).is_none()).count();
        if known + new > limits.keys_per_node_max {
            return Err(Reject::OverBound);
        }
    }
    Ok(())
}

/// A cursor over a message, with the decompression budget of the whole message.
struct Input<'a> {
    bytes: &'a [u8],
    decompressed: usize,
    limits: &'a GossipLimits,
}

impl<'a> Input<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], Reject> {
        if self.bytes.len() < len {
            return Err(Reject::Malformed);
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, Reject> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Reject> {
        let bytes = self.take(2)?;
        Ok(u16::from_le_bytes([bytes[0], bytes[1]]))
    }

    fn u64(&mut self) -> Result<u64, Reject> {
        let bytes = self.take(8)?;
        let mut array = [0_u8; 8];
        array.copy_from_slice(bytes);
        Ok(u64::from_le_bytes(array))
    }

    fn counter(&mut self) -> Result<u64, Reject> {
        let value = self.u64()?;
        if value > COUNTER_MAX {
            return Err(Reject::OverBound);
        }
        Ok(value)
    }

    /// A string: u16 length, UTF-8 bytes (at most `len_max` of them).
    fn string(&mut self, len_max: usize) -> Result<&'a str, Reject> {
        let len = usize::from(self.u16()?);
        let bytes = self.take(len)?;
        let text = std::str::from_utf8(bytes).map_err(|_| Reject::Malformed)?;
        if len > len_max {
            return Err(Reject::OverBound);
        }
        Ok(text)
    }

    fn addr(&mut self) -> Result<SocketAddr, Reject> {
        let ip = match self.u8()? {
            4 => {
                let mut octets = [0_u8; 4];
                octets.copy_from_slice(self.take(4)?);
                IpAddr::V4(Ipv4Addr::from(octets))
            }
            6 => {
                let mut octets = [0_u8; 16];
                octets.copy_from_slice(self.take(16)?);
                IpAddr::V6(Ipv6Addr::from(octets))
            }
            _ => return Err(Reject::Malformed),
        };
        Ok(SocketAddr::new(ip, self.u16()?))
    }

    /// A chitchat id whose node id is a canonical decimal `NodeId`.
    fn chitchat_id(&mut self) -> Result<ChitchatId, Reject> {
        let node_id = self.string(usize::MAX)?;
        parse_node_id(node_id).ok_or(Reject::Malformed)?;
        let generation = self.u64()?;
        let addr = self.addr()?;
        Ok(ChitchatId::new(Arc::<str>::from(node_id), generation, addr))
    }

    fn digest_entry(&mut self) -> Result<DigestEntry, Reject> {
        let id = self.chitchat_id()?;
        let heartbeat = self.counter()?;
        let last_gc_version = self.u64()?;
        let max_version = self.counter()?;
        if last_gc_version != 0 {
            return Err(Reject::Malformed);
        }
        Ok(DigestEntry { id, heartbeat, max_version })
    }

    fn digest(&mut self, version: u8) -> Result<Vec<DigestEntry>, Reject> {
        let mut entries = Vec::new();
        if version == 0 {
            let len = usize::from(self.u16()?);
            if len > self.limits.nodes_max {
                return Err(Reject::OverBound);
            }
            for _ in 0..len {
                entries.push(self.digest_entry()?);
            }
        } else {
            let stream = self.stream()?;
            let mut items = Input { bytes: &stream, decompressed: 0, limits: self.limits };
            while !items.bytes.is_empty() {
                if entries.len() == self.limits.nodes_max {
                    return Err(Reject::OverBound);
                }
                entries.push(items.digest_entry()?);
            }
        }
        // chitchat keeps the last of duplicate entries; a ratemesh node never sends any.
        let distinct: BTreeSet<&ChitchatId> = entries.iter().map(|entry| &entry.id).collect();
        if distinct.len() != entries.len() {
            return Err(Reject::Malformed);
        }
        Ok(entries)
    }

    /// A block stream, decompressed, within the message's decompression budget.
    fn stream(&mut self) -> Result<Vec<u8>, Reject> {
        let mut out = Vec::new();
        let mut block = vec![0_u8; BLOCK_LEN_MAX];
        loop {
            match self.u8()? {
                0 => return Ok(out),
                1 => {
                    let len = usize::from(self.u16()?);
                    let compressed = self.take(len)?;
                    let decompressed = zstd::bulk::decompress_to_buffer(compressed, &mut block[..])
                        .map_err(|_| Reject::Malformed)?;
                    self.spend(decompressed)?;
                    out.extend_from_slice(&block[..decompressed]);
                }
                2 => {
                    let len = usize::from(self.u16()?);
                    let bytes = self.take(len)?;
                    self.spend(len)?;
                    out.extend_from_slice(bytes);
                }
                _ => return Err(Reject::Malformed),
            }
        }
    }

    fn spend(&mut self, len: usize) -> Result<(), Reject> {
        self.decompressed = self.decompressed.saturating_add(len);
        if self.decompressed > self.limits.decompressed_bytes_max {
            return Err(Reject::OverBound);
        }
        Ok(())
    }

    /// A delta: operations (node, key-value, max version) in a block stream.
    fn delta(&mut self) -> Result<Vec<NodeDelta>, Reject> {
        let stream = self.stream()?;
        let limits = *self.limits;
        let mut ops = Input { bytes: &stream, decompressed: 0, limits: &limits };
        let mut deltas: Vec<NodeDelta> = Vec::new();
        // Whether the current node's max version was set by an operation of its own.
        let mut max_version_set = false;
        while !ops.bytes.is_empty() {
            match ops.u8()? {
                0 => {
                    let id = ops.chitchat_id()?;
                    let last_gc_version = ops.u64()?;
                    let _from_version_excluded = ops.counter()?;
                    if last_gc_version != 0 || deltas.iter().any(|delta| delta.id == id) {
                        return Err(Reject::Malformed);
                    }
                    if deltas.len() == limits.nodes_max {
                        return Err(Reject::OverBound);
                    }
                    deltas.push(NodeDelta { id, max_version: 0, keys: Vec::new() });
                    max_version_set = false;
                }
                1 => {
                    let key = ops.string(limits.key_len_max)?.to_owned();
                    ops.string(limits.value_len_max)?;
                    let version = ops.counter()?;
                    let status = ops.u8()?;
                    let delta = deltas.last_mut().ok_or(Reject::Malformed)?;
                    // Set only (no tombstones); versions strictly increasing, after no max-version.
                    if status != 0 || version <= delta.max_version || max_version_set {
                        return Err(Reject::Malformed);
                    }
                    if delta.keys.len() == limits.keys_per_node_max {
                        return Err(Reject::OverBound);
                    }
                    delta.max_version = version;
                    delta.keys.push(key);
                }
                2 => {
                    let max_version = ops.counter()?;
                    let delta = deltas.last_mut().ok_or(Reject::Malformed)?;
                    // chitchat writes it only for a node without key-values, once, above zero.
                    if !delta.keys.is_empty() || max_version_set || max_version == 0 {
                        return Err(Reject::Malformed);
                    }
                    delta.max_version = max_version;
                    max_version_set = true;
                }
                _ => return Err(Reject::Malformed),
            }
        }
        Ok(deltas)
    }
}
