//! The baselines' key placement: the core's [`ratemesh_core::Ring`] (the very ring the ratemesh
//! node places keys on), addressed by the simulator's `u32` member ids. One ring in the project:
//! a baseline and ratemesh assign every key of a run to the same owner.

use ratemesh_core::{KeyHash, NodeId, RING_VNODES_DEFAULT};

/// Virtual nodes per member on the baselines' rings: the node's default.
pub const RING_VNODES: u32 = RING_VNODES_DEFAULT;

/// Owners of keys among a set of members.
#[derive(Clone, Debug)]
pub struct Ring(ratemesh_core::Ring);

impl Ring {
    /// The ring of `members` with `vnodes` points each.
    pub fn new(members: &[u32], vnodes: u32) -> Ring {
        let ids: Vec<NodeId> = members.iter().map(|&m| NodeId(u64::from(m))).collect();
        Ring(ratemesh_core::Ring::new(&ids, vnodes))
    }

    /// The member owning `key` (`None` on an empty ring).
    pub fn owner(&self, key: KeyHash) -> Option<u32> {
        // Every member was a `u32`: the conversion back cannot fail.
        self.0.owner(key).and_then(|node| u32::try_from(node.0).ok())
    }
}
