//! chitchat 0.13's wire format, written by hand: what an attacker sends. Messages are
//! `magic (45139, LE) | protocol version | type | body`; a digest is a count and entries (id,
//! heartbeat, last GC version, max version); a delta is a block stream of operations (node,
//! key-value, max version), each block zstd-compressed or stored.

#![allow(dead_code)] // Each test binary uses part of it.

use std::net::{IpAddr, SocketAddr};

const MAGIC: u16 = 45_139;

/// A chitchat node id: name, generation, gossip address.
#[derive(Clone, Debug)]
pub struct Id {
    pub node: String,
    pub generation: u64,
    pub addr: SocketAddr,
}

impl Id {
    pub fn new(node: impl Into<String>, generation: u64, addr: SocketAddr) -> Id {
        Id { node: node.into(), generation, addr }
    }

    fn write(&self, out: &mut Vec<u8>) {
        string(&self.node, out);
        out.extend_from_slice(&self.generation.to_le_bytes());
        match self.addr.ip() {
            IpAddr::V4(ip) => {
                out.push(4);
                out.extend_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                out.push(6);
                out.extend_from_slice(&ip.octets());
            }
        }
        out.extend_from_slice(&self.addr.port().to_le_bytes());
    }
}

/// What a digest says of one node.
#[derive(Clone, Debug)]
pub struct DigestEntry {
    pub id: Id,
    pub heartbeat: u64,
    pub last_gc_version: u64,
    pub max_version: u64,
}

/// One delta operation.
#[derive(Clone, Debug)]
pub enum Op {
    Node {
        id: Id,
        last_gc_version: u64,
        from_version_excluded: u64,
    },
    /// `status`: 0 set, 1 deleted, 2 deleted after a TTL.
    KeyValue {
        key: String,
        value: String,
        version: u64,
        status: u8,
    },
    SetMaxVersion(u64),
}

fn string(text: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&u16::try_from(text.len()).expect("short string").to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn header(kind: u8) -> Vec<u8> {
    let mut out = MAGIC.to_le_bytes().to_vec();
    out.push(0); // protocol version 0: uncompressed digests
    out.push(kind);
    out
}

/// A version-0 digest.
pub fn digest(entries: &[DigestEntry]) -> Vec<u8> {
    let mut out = u16::try_from(entries.len()).expect("few entries").to_le_bytes().to_vec();
    for entry in entries {
        entry.id.write(&mut out);
        for counter in [entry.heartbeat, entry.last_gc_version, entry.max_version] {
            out.extend_from_slice(&counter.to_le_bytes());
        }
    }
    out
}

/// The operations' bytes, before they are cut into blocks.
pub fn ops(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Node { id, last_gc_version, from_version_excluded } => {
                out.push(0);
                id.write(&mut out);
                out.extend_from_slice(&last_gc_version.to_le_bytes());
                out.extend_from_slice(&from_version_excluded.to_le_bytes());
            }
            Op::KeyValue { key, value, version, status } => {
                out.push(1);
                string(key, &mut out);
                string(value, &mut out);
                out.extend_from_slice(&version.to_le_bytes());
                out.push(*status);
            }
            Op::SetMaxVersion(version) => {
                out.push(2);
                out.extend_from_slice(&version.to_le_bytes());
            }
        }
    }
    out
}

/// `bytes` as a block stream of stored blocks.
pub fn stored(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in bytes.chunks(u16::MAX as usize) {
        out.push(2);
        out.extend_from_slice(&u16::try_from(block.len()).expect("block").to_le_bytes());
        out.extend_from_slice(block);
    }
    out.push(0);
    out
}

/// One zstd-compressed block of `bytes` (at most 65 535 of them), without the end marker.
pub fn compressed_block(bytes: &[u8]) -> Vec<u8> {
    let compressed = zstd::bulk::compress(bytes, 19).expect("compresses");
    let mut out = vec![1];
    out.extend_from_slice(&u16::try_from(compressed.len()).expect("block").to_le_bytes());
    out.extend_from_slice(&compressed);
    out
}

/// `Syn { cluster_id, digest }`.
pub fn syn(cluster_id: &str, entries: &[DigestEntry]) -> Vec<u8> {
    let mut out = header(0);
    out.extend_from_slice(&digest(entries));
    string(cluster_id, &mut out);
    out
}

/// `SynAck { digest, delta }` with `delta` a block stream.
pub fn syn_ack(entries: &[DigestEntry], delta: &[u8]) -> Vec<u8> {
    let mut out = header(1);
    out.extend_from_slice(&digest(entries));
    out.extend_from_slice(delta);
    out
}

/// `Ack { delta }` with `delta` a block stream.
pub fn ack(delta: &[u8]) -> Vec<u8> {
    let mut out = header(2);
    out.extend_from_slice(delta);
    out
}
