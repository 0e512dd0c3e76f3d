//! What gossip proposes: chitchat's entries reduced to each id's newest generation and grouped
//! by member, with bounds against a flood of fake entries. Pure functions of chitchat's state
//! and what mutual TLS confirmed (tested without a network below).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;

use chitchat::{Chitchat, ChitchatId, NodeState};
use ratemesh_core::NodeId;

use super::{ADDRS_PER_ID_MAX, CANDIDATES_MAX, KEY_LEAVING, KEY_PROTOCOL, KEY_QUIC_ADDR, KEY_REGION};
use crate::region::Region;

/// One gossip entry (live or dead by the failure detector) with a parsable id and QUIC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) id: NodeId,
    /// Chitchat's generation of the entry (a restart gossips under a new one).
    pub(super) generation: u64,
    pub(super) quic_addr: SocketAddr,
    /// It gossips the protocol this node gossips (the wire version and the lane count).
    pub(super) speaks_ours: bool,
    pub(super) leaving: bool,
    /// Live by the failure detector (else dead).
    pub(super) live: bool,
    /// The region it advertises ([`Region::NONE`] when it advertises none, or a malformed one).
    pub(super) region: Region,
    /// It advertises a region that is not a valid name (an insider's bug or attack): taken as none.
    pub(super) region_malformed: bool,
}

/// A member proposed by gossip: its newest generation is live, speaks our protocol and is not
/// leaving. Several live entries may share one id (a restart's old and new generation while the
/// old one is not declared dead yet); none of them evicts a verified address while it is still
/// advertised, so a member keeps its place until the new address is confirmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Candidate {
    pub(super) id: NodeId,
    /// Where the member is: its verified address while any live entry advertises it, else the
    /// newest generation's address.
    pub(super) quic_addr: SocketAddr,
    /// The newest live generation and its address: what verification tries.
    pub(super) newest: Check,
    /// The distinct addresses its live entries advertise, newest generation first (at most
    /// [`ADDRS_PER_ID_MAX`], plus the verified one).
    pub(super) addrs: Vec<SocketAddr>,
    /// The region its newest live generation advertises.
    pub(super) region: Region,
}

/// A verification target: a member's id at the address of one of its generations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Check {
    pub(super) id: NodeId,
    pub(super) generation: u64,
    pub(super) quic_addr: SocketAddr,
}

/// What one read of chitchat's state proposes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Proposal {
    pub(super) live: Vec<Candidate>,
    /// Verified members whose newest generation the failure detector declared dead (and that
    /// did not leave), with the region that generation advertised.
    pub(super) dead: HashMap<NodeId, Region>,
    /// The entries (id and generation) that advertise a malformed region, whatever their state.
    pub(super) regions_malformed: Vec<(NodeId, u64)>,
}

/// What chitchat's state proposes: the entries the failure detector declared live or dead,
/// reduced to each id's newest generation ([`generations`]), then grouped ([`select`]).
pub(super) fn propose(
    chitchat: &Chitchat,
    me: NodeId,
    verified: &HashMap<NodeId, SocketAddr>,
    newest: &mut HashMap<NodeId, u64>,
) -> Proposal {
    let ours = chitchat.node_state(chitchat.self_chitchat_id()).and_then(|state| state.get(KEY_PROTOCOL));
    let live = chitchat.live_nodes().map(|id| (id, true));
    let dead = chitchat.dead_nodes().map(|id| (id, false));
    let entries = live
        .chain(dead)
        .filter_map(|(chitchat_id, live)| entry(chitchat_id, chitchat.node_state(chitchat_id)?, live, ours?));
    let present = chitchat.node_states().keys().filter_map(|id| parse_node_id(&id.node_id));
    proposal(entries, present, me, verified, newest)
}

/// [`propose`] from the entries (and the ids `present` in gossip).
fn proposal(
    entries: impl IntoIterator<Item = Entry>,
    present: impl IntoIterator<Item = NodeId>,
    me: NodeId,
    verified: &HashMap<NodeId, SocketAddr>,
    newest: &mut HashMap<NodeId, u64>,
) -> Proposal {
    let entries: Vec<Entry> = entries.into_iter().collect();
    let regions_malformed = entries
        .iter()
        .filter(|entry| entry.region_malformed)
        .map(|entry| (entry.id, entry.generation))
        .collect();
    let entries = generations(entries, present, newest);
    let dead = entries
        .iter()
        .filter(|entry| !entry.live && !entry.leaving && verified.contains_key(&entry.id))
        .map(|entry| (entry.id, entry.region))
        .collect();
    Proposal { live: select(entries, me, verified), dead, regions_malformed }
}

/// Per id, a newer generation supersedes the older ones for good: keeps the entries of ids whose
/// newest generation is among `entries` and is not leaving, and of those ids the newest
/// generation's entries, plus older live ones when the newest is live (a live old generation
/// keeps a verified address while the new one is verified). An id whose newest generation left, or
/// is gone from gossip while an older one lingers, has no entries. `newest` remembers the newest
/// generation of every id still `present` in gossip (and forgets the others).
fn generations(
    entries: impl IntoIterator<Item = Entry>,
    present: impl IntoIterator<Item = NodeId>,
    newest: &mut HashMap<NodeId, u64>,
) -> Vec<Entry> {
    let entries: Vec<Entry> = entries.into_iter().collect();
    let present: HashSet<NodeId> = present.into_iter().collect();
    newest.retain(|id, _| present.contains(id));
    for entry in &entries {
        let generation = newest.entry(entry.id).or_insert(entry.generation);
        *generation = (*generation).max(entry.generation);
    }
    let newest_of = |entry: &Entry| newest.get(&entry.id).copied().unwrap_or(entry.generation);
    let superseded: HashSet<NodeId> = newest
        .iter()
        .filter(|&(&id, &generation)| {
            let at_newest = entries.iter().filter(|entry| entry.id == id && entry.generation == generation);
            let mut at_newest = at_newest.peekable();
            at_newest.peek().is_none() || at_newest.any(|entry| entry.leaving)
        })
        .map(|(&id, _)| id)
        .collect();
    let newest_live: HashSet<NodeId> = entries
        .iter()
        .filter(|entry| entry.live && entry.generation == newest_of(entry))
        .map(|entry| entry.id)
        .collect();
    entries
        .into_iter()
        .filter(|entry| !superseded.contains(&entry.id))
        .filter(|entry| {
            entry.generation == newest_of(entry) || (entry.live && newest_live.contains(&entry.id))
        })
        .collect()
}

/// Groups live entries speaking our protocol and not leaving by member (other than `me`), sorted
/// by id. Each member keeps its verified address while any of its entries advertises it, so an
/// entry at another address cannot evict it before that address is confirmed; verification
/// targets the newest generation (ties broken by address, so the choice does not depend on
/// iteration order). Members already verified are always proposed; at most [`CANDIDATES_MAX`]
/// others are, the lowest ids first.
fn select(
    entries: impl IntoIterator<Item = Entry>,
    me: NodeId,
    verified: &HashMap<NodeId, SocketAddr>,
) -> Vec<Candidate> {
    let mut by_id: BTreeMap<NodeId, Vec<(u64, SocketAddr, Region)>> = BTreeMap::new();
    for entry in entries {
        if entry.live && entry.id != me && entry.speaks_ours && !entry.leaving {
            by_id.entry(entry.id).or_default().push((entry.generation, entry.quic_addr, entry.region));
        }
    }
    let mut unverified = 0;
    let mut candidates = Vec::with_capacity(by_id.len().min(CANDIDATES_MAX));
    for (id, mut generations) in by_id {
        if !verified.contains_key(&id) {
            if unverified == CANDIDATES_MAX {
                continue;
            }
            unverified += 1;
        }
        generations.sort_unstable_by_key(|&(generation, addr, _)| std::cmp::Reverse((generation, addr)));
        let (generation, newest_addr, region) = generations[0];
        let at_verified =
            verified.get(&id).copied().filter(|addr| generations.iter().any(|(_, at, _)| at == addr));
        let mut addrs: Vec<SocketAddr> = Vec::new();
        for (_, addr, _) in generations {
            if addrs.len() == ADDRS_PER_ID_MAX {
                break;
            }
            if !addrs.contains(&addr) {
                addrs.push(addr);
            }
        }
        if let Some(addr) = at_verified.filter(|addr| !addrs.contains(addr)) {
            addrs.push(addr);
        }
        candidates.push(Candidate {
            id,
            quic_addr: at_verified.unwrap_or(newest_addr),
            newest: Check { id, generation, quic_addr: newest_addr },
            addrs,
            region,
        });
    }
    candidates
}

fn entry(chitchat_id: &ChitchatId, state: &NodeState, live: bool, ours: &str) -> Option<Entry> {
    let (region, region_malformed) = match state.get(KEY_REGION).map(Region::new) {
        None => (Region::NONE, false),
        Some(Ok(region)) => (region, false),
        Some(Err(_)) => (Region::NONE, true),
    };
    Some(Entry {
        id: parse_node_id(&chitchat_id.node_id)?,
        generation: chitchat_id.generation_id,
        quic_addr: state.get(KEY_QUIC_ADDR)?.parse().ok()?,
        speaks_ours: state.get(KEY_PROTOCOL)? == ours,
        leaving: state.get(KEY_LEAVING).is_some(),
        live,
        region,
        region_malformed,
    })
}

/// Chitchat node ids are the decimal [`NodeId`].
pub(crate) fn chitchat_node_id(id: NodeId) -> String {
    id.0.to_string()
}

/// The member a chitchat node id names: canonical decimal only, so that one member has one
/// gossip name.
pub(crate) fn parse_node_id(text: &str) -> Option<NodeId> {
    let id: u64 = text.parse().ok()?;
    (id.to_string() == text).then_some(NodeId(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_round_trip_and_only_canonical_decimal_parses() {
        assert_eq!(parse_node_id(&chitchat_node_id(NodeId(42))), Some(NodeId(42)));
        for bad in ["", "+1", "01", "n1", "1 ", "18446744073709551616", "-1"] {
            assert_eq!(parse_node_id(bad), None, "{bad:?}");
        }
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    fn live(id: u64, generation: u64, port: u16) -> Entry {
        Entry {
            id: NodeId(id),
            generation,
            quic_addr: addr(port),
            speaks_ours: true,
            leaving: false,
            live: true,
            region: Region::NONE,
            region_malformed: false,
        }
    }

    #[test]
    fn a_forged_entry_with_a_verified_id_does_not_evict_the_member() {
        let verified = HashMap::from([(NodeId(2), addr(2))]);
        // Whatever the order of chitchat's set, and whether the forged generation is newer or older.
        for forged_generation in [0, 5, u64::MAX] {
            let mut entries = vec![live(2, 3, 2), live(2, forged_generation, 666)];
            for _ in 0..2 {
                let candidates = select(entries.clone(), NodeId(1), &verified);
                assert_eq!(candidates.len(), 1);
                assert_eq!(candidates[0].quic_addr, addr(2), "forged generation {forged_generation}");
                assert!(candidates[0].addrs.contains(&addr(2)) && candidates[0].addrs.contains(&addr(666)));
                entries.reverse();
            }
        }
    }

    #[test]
    fn the_newest_generation_is_verified_and_replaces_the_old_address_once_it_dies() {
        let verified = HashMap::from([(NodeId(2), addr(2))]);
        let mut entries = vec![live(2, 7, 20), live(2, 3, 2), live(2, 5, 21)];
        for _ in 0..2 {
            let candidates = select(entries.clone(), NodeId(1), &verified);
            assert_eq!(candidates[0].quic_addr, addr(2), "keeps its verified place meanwhile");
            assert_eq!(candidates[0].newest, Check { id: NodeId(2), generation: 7, quic_addr: addr(20) });
            assert_eq!(candidates[0].addrs, vec![addr(20), addr(21), addr(2)]);
            entries.reverse();
        }
        // The old generation is gone: the member is proposed at the new address (unverified).
        let candidates = select([live(2, 7, 20)], NodeId(1), &verified);
        assert_eq!(candidates[0].quic_addr, addr(20));
    }

    fn dead(id: u64, generation: u64, port: u16) -> Entry {
        Entry { live: false, ..live(id, generation, port) }
    }

    fn leaving(entry: Entry) -> Entry {
        Entry { leaving: true, ..entry }
    }

    /// The live candidates and dead ids of `entries` (every id present in gossip), for node 1
    /// with node 2 verified at `addr(2)`.
    fn view(entries: &[Entry], newest: &mut HashMap<NodeId, u64>) -> (Vec<NodeId>, Vec<NodeId>) {
        let verified = HashMap::from([(NodeId(2), addr(2))]);
        let present = entries.iter().map(|entry| entry.id);
        let proposal = proposal(entries.iter().copied(), present, NodeId(1), &verified, newest);
        let mut dead: Vec<NodeId> = proposal.dead.into_keys().collect();
        dead.sort_unstable();
        (proposal.live.iter().map(|candidate| candidate.id).collect(), dead)
    }

    #[test]
    fn a_node_that_crashed_came_back_and_left_gracefully_is_gone_not_dead() {
        let mut newest = HashMap::new();
        // Crashed: generation 1 dead, counted in the cluster's size.
        assert_eq!(view(&[dead(2, 1, 2)], &mut newest), (vec![], vec![NodeId(2)]));
        // Came back as generation 2 (same address): live, and its dead generation no longer counts.
        assert_eq!(view(&[dead(2, 1, 2), live(2, 2, 2)], &mut newest), (vec![NodeId(2)], vec![]));
        // Leaves gracefully: gone, while generation 1 still lingers dead in gossip.
        assert_eq!(view(&[dead(2, 1, 2), leaving(live(2, 2, 2))], &mut newest), (vec![], vec![]));
        assert_eq!(view(&[dead(2, 1, 2), leaving(dead(2, 2, 2))], &mut newest), (vec![], vec![]));
        // Generation 2 garbage-collected first: generation 1 still never counts again.
        assert_eq!(view(&[dead(2, 1, 2)], &mut newest), (vec![], vec![]));
        assert_eq!(newest.get(&NodeId(2)), Some(&2));
        // Once the id is gone from gossip altogether it is forgotten.
        assert_eq!(view(&[], &mut newest), (vec![], vec![]));
        assert!(newest.is_empty());
    }

    #[test]
    fn the_newest_generation_decides_between_live_and_dead() {
        let mut newest = HashMap::new();
        // A new generation crashed too: the member is dead (once), whatever the order.
        for entries in [[dead(2, 1, 2), dead(2, 3, 2)], [dead(2, 3, 2), dead(2, 1, 2)]] {
            assert_eq!(view(&entries, &mut newest), (vec![], vec![NodeId(2)]));
        }
        // An old generation still live meanwhile keeps the verified address but the member is
        // live only through its newest generation: here it is dead.
        assert_eq!(view(&[live(2, 1, 2), dead(2, 3, 2)], &mut newest), (vec![], vec![NodeId(2)]));
        // A newer live generation makes it live again; the older live entry then only keeps its
        // verified address while the new one is verified.
        let (live_ids, dead_ids) = view(&[live(2, 1, 2), dead(2, 3, 2), live(2, 4, 20)], &mut newest);
        assert_eq!((live_ids, dead_ids), (vec![NodeId(2)], vec![]));
        // A leaving newest generation removes the id even with an older one live.
        assert_eq!(view(&[live(2, 1, 2), leaving(live(2, 5, 2))], &mut newest), (vec![], vec![]));
    }

    #[test]
    fn entries_of_another_protocol_leaving_or_of_this_node_are_not_proposed() {
        let mut old_protocol = live(3, 1, 3);
        old_protocol.speaks_ours = false;
        let mut leaving = live(4, 1, 4);
        leaving.leaving = true;
        let candidates =
            select([live(1, 1, 1), old_protocol, leaving, live(5, 1, 5)], NodeId(1), &HashMap::new());
        assert_eq!(candidates.iter().map(|candidate| candidate.id).collect::<Vec<_>>(), vec![NodeId(5)]);
    }

    #[test]
    fn the_candidate_cap_keeps_verified_members() {
        let max = CANDIDATES_MAX as u64;
        // A flood of fake ids, all lower than the verified member's, and more than the cap.
        let verified = HashMap::from([(NodeId(max * 3), addr(9))]);
        let mut entries: Vec<Entry> = (0..max * 2).map(|id| live(id, 1, 1000)).collect();
        entries.push(live(max * 3, 1, 9));
        let candidates = select(entries, NodeId(u64::MAX), &verified);
        assert_eq!(candidates.len(), CANDIDATES_MAX + 1);
        let member = candidates.last().expect("verified member proposed");
        assert_eq!((member.id, member.quic_addr), (NodeId(max * 3), addr(9)));
    }

    #[test]
    fn regions_come_from_the_newest_generation_and_malformed_ones_are_listed() {
        let eu = Region::new("eu-west").expect("valid");
        let us = Region::new("us-east").expect("valid");
        let mut newest = HashMap::new();
        let verified = HashMap::from([(NodeId(2), addr(2)), (NodeId(3), addr(3))]);
        // Member 2 restarted in another region (generation 5 is newest); member 3 is dead in
        // `us`; member 4 advertises a malformed region and is taken as naming none.
        let entries = [
            Entry { region: eu, ..live(2, 1, 2) },
            Entry { region: us, ..live(2, 5, 2) },
            Entry { region: us, ..dead(3, 1, 3) },
            Entry { region_malformed: true, ..live(4, 2, 4) },
        ];
        let present = entries.iter().map(|entry| entry.id);
        let proposal = proposal(entries, present, NodeId(1), &verified, &mut newest);
        let regions: Vec<(NodeId, Region)> =
            proposal.live.iter().map(|candidate| (candidate.id, candidate.region)).collect();
        assert_eq!(regions, vec![(NodeId(2), us), (NodeId(4), Region::NONE)]);
        assert_eq!(proposal.dead, HashMap::from([(NodeId(3), us)]));
        assert_eq!(proposal.regions_malformed, vec![(NodeId(4), 2)]);
    }

    #[test]
    fn addresses_per_member_are_bounded_but_keep_the_verified_one() {
        let verified = HashMap::from([(NodeId(2), addr(2))]);
        let mut entries: Vec<Entry> =
            (0..100).map(|generation| live(2, 10 + generation, 1000 + generation as u16)).collect();
        entries.push(live(2, 1, 2));
        let candidates = select(entries, NodeId(1), &verified);
        assert_eq!(candidates[0].addrs.len(), ADDRS_PER_ID_MAX + 1);
        assert_eq!(candidates[0].addrs[0], addr(1099));
        assert_eq!(candidates[0].quic_addr, addr(2));
    }
}
