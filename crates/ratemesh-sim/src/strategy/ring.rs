//! A plain consistent-hash ring for the baselines: sorted virtual nodes hashed with XXH3.

use ratemesh_core::KeyHash;
use xxhash_rust::xxh3::xxh3_64;

/// Virtual nodes per member on the baselines' rings.
pub const RING_VNODES: u32 = 64;

/// Owners of keys among a set of members.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ring {
    points: Vec<(u64, u32)>,
}

impl Ring {
    /// The ring of `members` with `vnodes` points each.
    pub fn new(members: &[u32], vnodes: u32) -> Ring {
        let mut points: Vec<(u64, u32)> =
            members.iter().flat_map(|&m| (0..vnodes).map(move |v| (point(m, v), m))).collect();
        points.sort_unstable();
        Ring { points }
    }

    /// The member owning `key`: the first point at or after the key's hash, wrapping around.
    pub fn owner(&self, key: KeyHash) -> Option<u32> {
        let at = self.points.partition_point(|p| p.0 < key.low64());
        self.points.get(at).or(self.points.first()).map(|p| p.1)
    }
}

fn point(member: u32, vnode: u32) -> u64 {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&member.to_le_bytes());
    bytes[4..].copy_from_slice(&vnode.to_le_bytes());
    xxh3_64(&bytes)
}
