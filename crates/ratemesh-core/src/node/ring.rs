//! Key ownership: a consistent-hash ring of the live members, with virtual nodes.
//!
//! Placement must be identical on every node of every build, so nothing here depends on the
//! compiler's hashing: a virtual node's position is XXH3-64 of a fixed byte layout, and a key's
//! position is 64 bits of its (already XXH3-128) [`KeyHash`]. Golden vectors pin both.

use crate::prelude::*;
use core::hash::{BuildHasher, Hash, Hasher};

use hashring::HashRing;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::api::NodeId;
use crate::key::KeyHash;

/// The default number of virtual nodes per member: balance max/mean ≈ 1.05 at 10 members (1.10
/// with 256, 1.03 with 1024).
pub const RING_VNODES_DEFAULT: u32 = 512;

/// The most members [`Ring::owners`] names.
pub const OWNERS_MAX: usize = 8;

/// The ring of live members; answers "who owns this key".
#[derive(Clone, Debug)]
pub struct Ring {
    ring: HashRing<VNode, RingHasherBuilder>,
    members: Vec<NodeId>,
    vnodes: u32,
}

/// One of a member's points on the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct VNode {
    node: NodeId,
    index: u32,
}

impl Hash for VNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // A fixed little-endian layout, hashed in one write: the same bytes on every platform.
        let mut bytes = [0u8; 12];
        bytes[..8].copy_from_slice(&self.node.0.to_le_bytes());
        bytes[8..].copy_from_slice(&self.index.to_le_bytes());
        state.write(&bytes);
    }
}

/// Positions on the ring: XXH3-64 of written bytes; a [`KeyHash`] folds to 64 bits.
#[derive(Clone, Copy, Debug, Default)]
struct RingHasher(u64);

impl Hasher for RingHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = xxh3_64_with_seed(bytes, self.0);
    }

    fn write_u128(&mut self, value: u128) {
        self.0 = (value as u64) ^ ((value >> 64) as u64);
    }

    /// A [`Position`]: already a point on the ring.
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// A raw point on the ring, for walking from one virtual node to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Position(u64);

/// Where `vnode` sits on the ring (as the ring itself computes it).
fn position(vnode: &VNode) -> u64 {
    RingHasherBuilder.hash_one(vnode)
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct RingHasherBuilder;

impl BuildHasher for RingHasherBuilder {
    type Hasher = RingHasher;

    fn build_hasher(&self) -> RingHasher {
        RingHasher::default()
    }
}

impl Ring {
    /// The ring of `members` (order and duplicates do not matter), `vnodes` points each.
    pub fn new(members: &[NodeId], vnodes: u32) -> Ring {
        let mut sorted = members.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut ring = HashRing::with_hasher(RingHasherBuilder);
        let points =
            sorted.iter().flat_map(|&node| (0..vnodes.max(1)).map(move |index| VNode { node, index }));
        ring.batch_add(points.collect());
        Ring { ring, members: sorted, vnodes: vnodes.max(1) }
    }

    /// The owner of `key`; `None` for an empty ring.
    pub fn owner(&self, key: KeyHash) -> Option<NodeId> {
        self.ring.get(&key).map(|vnode| vnode.node)
    }

    /// The member that would own `key` if its owner left: where the owner replicates it.
    pub fn successor(&self, key: KeyHash) -> Option<NodeId> {
        let (mut found, mut successor) = (0, None);
        self.walk(key, 2, |node| {
            found += 1;
            if found == 2 {
                successor = Some(node);
            }
        });
        successor
    }

    /// The first `count` distinct members clockwise from `key`: its owner, then each member that
    /// would own it were the ones before it gone (at most every member, and at most
    /// `OWNERS_MAX`).
    pub fn owners(&self, key: KeyHash, count: usize) -> Vec<NodeId> {
        let mut owners = Vec::with_capacity(count.min(self.members.len()));
        self.walk(key, count, |node| owners.push(node));
        owners
    }

    /// Calls `found` with each of the first `count` distinct members clockwise from `key`. Walks
    /// the ring from the owner's virtual node, each step to the next virtual node; a member seen
    /// already is passed over, and the walk visits each virtual node at most once.
    fn walk(&self, key: KeyHash, count: usize, mut found: impl FnMut(NodeId)) {
        let count = count.min(self.members.len()).min(OWNERS_MAX);
        let Some(owner) = self.ring.get(&key) else { return };
        if count == 0 {
            return;
        }
        found(owner.node);
        // At most OWNERS_MAX members are kept: a linear search is the cheapest set.
        let mut seen = [owner.node; OWNERS_MAX];
        let mut seen_len = 1;
        let mut point = position(owner);
        for _ in 0..self.ring.len() {
            if seen_len >= count {
                return;
            }
            let Some(next) = self.ring.get(&Position(point.wrapping_add(1))) else { return };
            if !seen[..seen_len].contains(&next.node) {
                found(next.node);
                seen[seen_len] = next.node;
                seen_len += 1;
            }
            point = position(next);
        }
    }

    /// The virtual nodes per member.
    pub fn vnodes(&self) -> u32 {
        self.vnodes
    }

    /// The members, sorted.
    pub fn members(&self) -> &[NodeId] {
        &self.members
    }

    /// Whether `node` is on the ring.
    pub fn contains(&self, node: NodeId) -> bool {
        self.members.binary_search(&node).is_ok()
    }

    /// The part of the key space each member owns, exactly (from the virtual nodes' positions, not
    /// by sampling keys), in member order; the fractions sum to 1 (empty for an empty ring). A key
    /// belongs to the first virtual node at or after its position, wrapping around, so a virtual
    /// node owns the arc from its predecessor's position (excluded) to its own (included).
    pub fn shares(&self) -> Vec<(NodeId, f64)> {
        let mut points: Vec<(u64, NodeId)> = self
            .members
            .iter()
            .flat_map(|&node| (0..self.vnodes).map(move |index| VNode { node, index }))
            .map(|vnode| (position(&vnode), vnode.node))
            .collect();
        points.sort_unstable();
        let mut arcs: Vec<u128> = vec![0; self.members.len()];
        let mut previous = points.last().map_or(0, |&(at, _)| at);
        for (i, &(at, node)) in points.iter().enumerate() {
            // The first point's arc wraps around from the last one (the whole circle when alone).
            let arc = if i == 0 {
                (1u128 << 64) - u128::from(previous) + u128::from(at)
            } else {
                u128::from(at - previous)
            };
            previous = at;
            if let Ok(rank) = self.members.binary_search(&node) {
                arcs[rank] += arc;
            }
        }
        let circle = (1u128 << 64) as f64;
        self.members.iter().zip(arcs).map(|(&node, arc)| (node, arc as f64 / circle)).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::println;

    use super::*;
    use crate::key::Namespace;

    fn ids(n: u64) -> Vec<NodeId> {
        (1..=n).map(NodeId).collect()
    }

    fn keys(n: u64) -> Vec<KeyHash> {
        let namespace = Namespace::new(b"ring-test");
        (0..n).map(|i| namespace.key(&i.to_le_bytes())).collect()
    }

    /// Golden vectors: owners are part of the protocol; every build must place keys alike. The
    /// expected owners were computed independently (Python `xxhash`, the same byte layouts, a
    /// sorted list and a binary search).
    #[test]
    fn owners_are_pinned() {
        let ring = Ring::new(&ids(5), 512);
        let owners: Vec<u64> = keys(12).into_iter().map(|key| ring.owner(key).map_or(0, |n| n.0)).collect();
        assert_eq!(owners, vec![3, 5, 5, 2, 2, 5, 3, 5, 5, 2, 5, 2]);
    }

    #[test]
    fn balance_at_ten_members() {
        let ring = Ring::new(&ids(10), RING_VNODES_DEFAULT);
        let mut counts = [0u64; 11];
        for key in keys(200_000) {
            counts[ring.owner(key).map_or(0, |n| n.0) as usize] += 1;
        }
        let max = *counts[1..].iter().max().unwrap_or(&0) as f64;
        let ratio = max / (200_000.0 / 10.0);
        println!("ring balance at 10 members, {RING_VNODES_DEFAULT} vnodes: max/mean = {ratio:.3}");
        assert!(ratio <= 1.10, "max/mean {ratio}");
    }

    #[test]
    fn movement_on_join_and_leave_is_near_ideal() {
        let before = Ring::new(&ids(10), RING_VNODES_DEFAULT);
        let joined = Ring::new(&ids(11), RING_VNODES_DEFAULT);
        let left = Ring::new(&ids(9), RING_VNODES_DEFAULT);
        let all = keys(100_000);
        let moved = |a: &Ring, b: &Ring| all.iter().filter(|&&k| a.owner(k) != b.owner(k)).count() as f64;
        let join = moved(&before, &joined) / all.len() as f64 / (1.0 / 11.0);
        let leave = moved(&before, &left) / all.len() as f64 / (1.0 / 10.0);
        println!("movement vs ideal: join {join:.3}, leave {leave:.3}");
        assert!(join <= 1.2 && leave <= 1.2, "join {join}, leave {leave}");
        // Consistent hashing: only keys of the joining/leaving member move.
        assert!(
            all.iter().all(|&k| before.owner(k) == joined.owner(k) || joined.owner(k) == Some(NodeId(11)))
        );
        assert!(all.iter().all(|&k| before.owner(k) == left.owner(k) || before.owner(k) == Some(NodeId(10))));
    }

    #[test]
    fn successor_is_the_owner_once_the_owner_leaves() {
        let ring = Ring::new(&ids(10), 64);
        let without: Vec<Ring> = (1..=10u64)
            .map(|gone| {
                Ring::new(&ids(10).into_iter().filter(|&n| n != NodeId(gone)).collect::<Vec<_>>(), 64)
            })
            .collect();
        for key in keys(5_000) {
            let owner = ring.owner(key).expect("non-empty");
            assert_eq!(ring.successor(key), without[owner.0 as usize - 1].owner(key));
        }
        assert_eq!(Ring::new(&ids(1), 64).successor(keys(1)[0]), None);
    }

    /// Each of the first members clockwise owns the key once the ones before it are gone.
    #[test]
    fn owners_are_the_owners_as_the_members_before_them_leave() {
        let ring = Ring::new(&ids(6), 64);
        for key in keys(2_000) {
            let owners = ring.owners(key, 4);
            assert_eq!(owners.len(), 4);
            for (i, &owner) in owners.iter().enumerate() {
                let left: Vec<NodeId> = ids(6).into_iter().filter(|n| !owners[..i].contains(n)).collect();
                assert_eq!(Ring::new(&left, 64).owner(key), Some(owner), "owner {i} of {owners:?}");
            }
        }
        assert_eq!(Ring::new(&ids(2), 64).owners(keys(1)[0], 5).len(), 2, "at most every member");
    }

    /// Shares are exact: they sum to one and match how many of many keys each member owns.
    #[test]
    fn shares_are_the_owned_part_of_the_key_space() {
        let ring = Ring::new(&ids(5), 64);
        let shares = ring.shares();
        let sum: f64 = shares.iter().map(|&(_, share)| share).sum();
        assert!((sum - 1.0).abs() < 1e-9, "sum {sum}");
        let all = keys(200_000);
        for &(node, share) in &shares {
            let owned = all.iter().filter(|&&k| ring.owner(k) == Some(node)).count() as f64 / 200_000.0;
            // Sampling error of 200 000 keys: a standard deviation below 0.1 %.
            assert!((owned - share).abs() < 0.005, "{node:?}: owns {owned} of sampled keys, share {share}");
        }
        assert_eq!(Ring::new(&ids(1), 8).shares(), vec![(NodeId(1), 1.0)]);
        assert!(Ring::new(&[], 8).shares().is_empty());
        assert!(ring.contains(NodeId(5)) && !ring.contains(NodeId(6)));
    }

    #[test]
    fn member_order_does_not_matter() {
        let a = Ring::new(&[NodeId(3), NodeId(1), NodeId(2)], 64);
        let b = Ring::new(&[NodeId(1), NodeId(2), NodeId(3), NodeId(2)], 64);
        assert!(keys(1_000).into_iter().all(|k| a.owner(k) == b.owner(k)));
    }
}
