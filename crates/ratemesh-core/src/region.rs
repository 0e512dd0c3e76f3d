//! Regions as a policy and the wire name them (no_std, like the wire): a region's id, what a
//! region's part falls to when its lease lapses, and a policy's terms between regions. The
//! protocol between regions is `node/region.rs`.

/// A region: members close to one another (a data centre, a cloud region). Inside a region,
/// keys have owners and grants as in a one-region cluster; between regions, each region's owner
/// of a key holds a lease on a share of the key's global limit from the key's home owner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RegionId(pub u64);

impl RegionId {
    /// The region of a member that names none: a cluster whose members name no region is one
    /// region, today's cluster.
    pub const NONE: RegionId = RegionId(0);

    /// The region named `name` (XXH3-64 of its bytes, pinned like ring positions; the empty name
    /// is [`RegionId::NONE`], and no other name is).
    pub fn from_name(name: &str) -> RegionId {
        if name.is_empty() {
            return RegionId::NONE;
        }
        match xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), REGION_NAME_SEED) {
            0 => RegionId(1),
            id => RegionId(id),
        }
    }
}

/// The seed of [`RegionId::from_name`]'s hash (fixed: region ids cross nodes).
const REGION_NAME_SEED: u64 = 0x7265_6769_6f6e_0001;

/// What a region's share of a key falls to when its lease from the key's home owner ends
/// without a renewal (the region cannot reach the home region): the global limit holds in every
/// case, because the home owner keeps that much reserved for a silent region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RegionFallback {
    /// The last share leased (the default): the home owner keeps it reserved while the region
    /// is silent (until its members leave the view), so both sides of a partition go on
    /// admitting their shares, and the other regions cannot use the silent one's meanwhile.
    #[default]
    Last,
    /// The region's floor: a small share the home owner always keeps for every region (what a
    /// region admits before its first lease, too); the rest goes to the regions that ask.
    Floor,
    /// Nothing: the region refuses the key until a lease arrives.
    Closed,
}

impl RegionFallback {
    /// Its name in a configuration (the inverse of [`RegionFallback::from_name`]).
    pub fn name(self) -> &'static str {
        match self {
            RegionFallback::Last => "last",
            RegionFallback::Floor => "floor",
            RegionFallback::Closed => "closed",
        }
    }

    /// The fallback named `name` in a configuration: `last`, `floor` or `closed`.
    pub fn from_name(name: &str) -> Option<RegionFallback> {
        match name {
            "last" => Some(RegionFallback::Last),
            "floor" => Some(RegionFallback::Floor),
            "closed" => Some(RegionFallback::Closed),
            _ => None,
        }
    }
}

/// A policy's terms between regions; each `None` takes the node's (a cluster of one region
/// ignores both).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PolicyRegion {
    /// The home region of the policy's keys, whose owner leases the other regions their parts:
    /// the region where most of its demand is, so that its checks wait on no other region for
    /// their leases. `None`, or a region not in a node's view: a hash of the key over the
    /// view's regions.
    pub home: Option<RegionId>,
    /// What a region's part falls to when its lease ends without a renewal. `None`: the node's
    /// `NodeConfig::region_fallback`.
    pub fallback: Option<RegionFallback>,
}
