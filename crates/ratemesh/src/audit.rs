//! The audit (`ratemesh_core`'s `node/audit.rs`) as a node and a cluster report it: each lane's
//! core audits the keys it owns, so a node adds its lanes' sums, and a cluster adds its members'
//! (each key has one owner: sums add, [`AuditSums::merge`]).
//!
//! - [`crate::Node::audit_figures`], [`crate::Node::audit_worst_keys`] and
//!   [`crate::Node::audit_stats`] are this node's, over its lanes;
//! - [`crate::Node::audit`] is the cluster's: this node's figures and worst keys with every other
//!   live member's, asked at once over the peer transport like the top keys (the same fan-out,
//!   the same timeout), as an [`AuditReport`]. A member that does not answer is listed as
//!   missing; the report then covers the keys the others own.
//!
//! Members exchange an [`AuditQuestion`] and an [`AuditReply`], versioned by their first byte
//! ([`AUDIT_QUERY_TAG`]) and decoded with bounds ([`AUDIT_FIGURES_PER_ANSWER_MAX`],
//! [`AUDIT_KEYS_PER_ANSWER_MAX`]): a peer of another version or a malformed answer is a missing
//! member, never a panic. Core types are not the wire format: the reply carries its own.

use std::collections::BTreeMap;
use std::time::Duration;

use ratemesh_core::{AuditFigures, AuditKeyFigures, AuditSums, KeyHash, NodeId};
use serde::{Deserialize, Serialize};

use crate::node::MissingMember;

/// The first byte of an audit question and of its answer between members (never a top-keys
/// version, nor [`crate::APP_QUERY_TAG`]). A peer that does not know it answers nothing this
/// node reads, and is reported as missing.
pub(crate) const AUDIT_QUERY_TAG: u8 = 0xA6;
/// The most (group, window) figures a member's answer holds (more are left out by the sender and
/// refused by the receiver).
pub(crate) const AUDIT_FIGURES_PER_ANSWER_MAX: usize = 4096;
/// The most keys a member's answer holds, and so the most [`crate::Node::audit`] lists.
pub const AUDIT_KEYS_PER_ANSWER_MAX: usize = 1000;
/// The longest key text an answer carries (the top-keys sketches' bound is lower by default).
const KEY_TEXT_BYTES_MAX: usize = 1024;

/// Why a member's audit answer was not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AuditQueryError {
    /// The bytes are not an audit message of this version, or break a bound (nothing was
    /// changed; the member is reported as missing).
    #[error("malformed or foreign-version audit message: {0}")]
    Malformed(&'static str),
}

/// What a member asks another: the figures of every group, and its `n` worst keys (of `group`
/// only, when given).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AuditQuestion {
    /// The group of the keys asked for (`None`: every group).
    pub group: Option<u64>,
    /// How many keys (at most [`AUDIT_KEYS_PER_ANSWER_MAX`] are answered).
    pub n: u32,
}

/// Sums over complete key windows, as they travel ([`AuditSums`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireSums {
    /// [`AuditSums::key_windows`].
    pub key_windows: u64,
    /// [`AuditSums::admitted`].
    pub admitted: u64,
    /// [`AuditSums::ideal`].
    pub ideal: u64,
    /// [`AuditSums::arrivals`].
    pub arrivals: u64,
    /// [`AuditSums::over_admitted`].
    pub over_admitted: u64,
    /// [`AuditSums::false_refused`].
    pub false_refused: u64,
    /// [`AuditSums::worst`].
    pub worst: Option<(u64, u64)>,
}

impl From<&AuditSums> for WireSums {
    fn from(s: &AuditSums) -> WireSums {
        WireSums {
            key_windows: s.key_windows,
            admitted: s.admitted,
            ideal: s.ideal,
            arrivals: s.arrivals,
            over_admitted: s.over_admitted,
            false_refused: s.false_refused,
            worst: s.worst,
        }
    }
}

impl WireSums {
    /// The core's sums.
    pub(crate) fn sums(&self) -> AuditSums {
        AuditSums {
            key_windows: self.key_windows,
            admitted: self.admitted,
            ideal: self.ideal,
            arrivals: self.arrivals,
            over_admitted: self.over_admitted,
            false_refused: self.false_refused,
            worst: self.worst,
        }
    }
}

/// One group's figures at one member, as they travel ([`AuditFigures`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireFigures {
    /// The group.
    pub group: u64,
    /// The window length, in nanoseconds.
    pub window_nanos: u64,
    /// The sums.
    pub sums: WireSums,
    /// [`AuditFigures::incomplete_key_windows`].
    pub incomplete_key_windows: u64,
}

/// One key's figures at its owner, as they travel ([`AuditKeyFigures`]), with its text if the
/// owner's top-keys sketches know it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireKey {
    /// The bucket's hash.
    pub key: u128,
    /// The group.
    pub group: u64,
    /// The window length, in nanoseconds.
    pub window_nanos: u64,
    /// The sums.
    pub sums: WireSums,
    /// [`AuditKeyFigures::incomplete_windows`].
    pub incomplete_windows: u64,
    /// The key as a client named it, when known.
    pub text: Option<String>,
}

/// What a member answers: its figures and its worst keys.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AuditReply {
    /// Per group and window, over the keys it owns.
    pub figures: Vec<WireFigures>,
    /// Its worst keys, worst first.
    pub keys: Vec<WireKey>,
}

/// `message` as bytes: [`AUDIT_QUERY_TAG`], then postcard.
pub(crate) fn encode_audit_message<T: Serialize>(message: &T) -> Vec<u8> {
    let mut bytes = vec![AUDIT_QUERY_TAG];
    // Serializing these plain structures into a vector cannot fail.
    bytes.extend(postcard::to_allocvec(message).unwrap_or_default());
    bytes
}

/// A question from its bytes (tag included).
pub(crate) fn decode_audit_question(bytes: &[u8]) -> Result<AuditQuestion, AuditQueryError> {
    decode(bytes)
}

/// An answer from its bytes (tag included), checked against the bounds.
pub(crate) fn decode_audit_reply(bytes: &[u8]) -> Result<AuditReply, AuditQueryError> {
    let reply: AuditReply = decode(bytes)?;
    if reply.figures.len() > AUDIT_FIGURES_PER_ANSWER_MAX {
        return Err(AuditQueryError::Malformed("too many figures"));
    }
    if reply.keys.len() > AUDIT_KEYS_PER_ANSWER_MAX {
        return Err(AuditQueryError::Malformed("too many keys"));
    }
    if reply.keys.iter().any(|k| k.text.as_ref().is_some_and(|t| t.len() > KEY_TEXT_BYTES_MAX)) {
        return Err(AuditQueryError::Malformed("key text too long"));
    }
    Ok(reply)
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, AuditQueryError> {
    match bytes.split_first() {
        Some((&AUDIT_QUERY_TAG, body)) => match postcard::take_from_bytes::<T>(body) {
            Ok((message, [])) => Ok(message),
            Ok(_) => Err(AuditQueryError::Malformed("trailing bytes")),
            Err(_) => Err(AuditQueryError::Malformed("undecodable body")),
        },
        Some(_) => Err(AuditQueryError::Malformed("unknown tag")),
        None => Err(AuditQueryError::Malformed("empty")),
    }
}

/// One of the worst keys of an [`AuditReport`]: its figures, its owner, and its text when the
/// owner's (or the asking node's) top-keys sketches know the bucket (see
/// [`crate::top::TopShard::key_of`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditKey {
    /// The key's figures at its owner.
    pub figures: AuditKeyFigures,
    /// The member that audited it (its owner; a key whose owner changed in the last minute is
    /// listed once per owner, each with the windows it saw).
    pub owner: NodeId,
    /// The key as a client named it, when a sketch knows it.
    pub text: Option<String>,
}

/// What [`crate::Node::audit`] found: the figures per group and window summed over the members
/// that answered, the worst keys among theirs, who contributed and who did not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditReport {
    /// Per group and window, by group then window: the members' sums added.
    pub figures: Vec<AuditFigures>,
    /// The worst keys, worst first.
    pub keys: Vec<AuditKey>,
    /// Members whose figures are in the report (this node included), by id.
    pub answered: Vec<NodeId>,
    /// Live members that did not answer, by id.
    pub missing: Vec<MissingMember>,
}

/// Figures of lanes or members added per group and window: sums merged ([`AuditSums::merge`]),
/// incomplete windows added. Sorted by group, then window.
pub(crate) fn merge_figures(figures: impl IntoIterator<Item = AuditFigures>) -> Vec<AuditFigures> {
    let mut merged: BTreeMap<(u64, Duration), AuditFigures> = BTreeMap::new();
    for f in figures {
        let slot = merged.entry((f.group, f.window)).or_insert(AuditFigures {
            group: f.group,
            window: f.window,
            sums: AuditSums::default(),
            incomplete_key_windows: 0,
        });
        slot.sums.merge(&f.sums);
        slot.incomplete_key_windows = slot.incomplete_key_windows.saturating_add(f.incomplete_key_windows);
    }
    merged.into_values().collect()
}

/// The worst window's admitted over its limit, in millionths (0 without windows): how the core
/// ranks keys of equal over-admission.
fn worst_ratio_millionths(sums: &AuditSums) -> u128 {
    sums.worst.map_or(0, |(admitted, limit)| u128::from(admitted) * 1_000_000 / u128::from(limit.max(1)))
}

/// Sorts keys as the core ranks them (`ratemesh_core::Node::audit_worst_keys`): the most hits
/// admitted above the ideal first, then the highest worst admitted/limit ratio, then by key.
pub(crate) fn sort_worst<T>(keys: &mut [T], figures: impl Fn(&T) -> &AuditKeyFigures) {
    keys.sort_by(|a, b| {
        let (a, b) = (figures(a), figures(b));
        b.sums
            .over_admitted
            .cmp(&a.sums.over_admitted)
            .then(worst_ratio_millionths(&b.sums).cmp(&worst_ratio_millionths(&a.sums)))
            .then(a.key.cmp(&b.key))
    });
}

/// Figures from their wire form.
pub(crate) fn figures_of(wire: &WireFigures) -> AuditFigures {
    AuditFigures {
        group: wire.group,
        window: Duration::from_nanos(wire.window_nanos),
        sums: wire.sums.sums(),
        incomplete_key_windows: wire.incomplete_key_windows,
    }
}

/// Figures in their wire form.
pub(crate) fn wire_figures(f: &AuditFigures) -> WireFigures {
    WireFigures {
        group: f.group,
        window_nanos: u64::try_from(f.window.as_nanos()).unwrap_or(u64::MAX),
        sums: WireSums::from(&f.sums),
        incomplete_key_windows: f.incomplete_key_windows,
    }
}

/// A key's figures in their wire form, with its text.
pub(crate) fn wire_key(f: &AuditKeyFigures, text: Option<String>) -> WireKey {
    WireKey {
        key: f.key.0,
        group: f.group,
        window_nanos: u64::try_from(f.window.as_nanos()).unwrap_or(u64::MAX),
        sums: WireSums::from(&f.sums),
        incomplete_windows: f.incomplete_windows,
        text: text.filter(|t| t.len() <= KEY_TEXT_BYTES_MAX),
    }
}

/// A key's figures from their wire form, owned by `owner`.
pub(crate) fn key_of_wire(wire: WireKey, owner: NodeId) -> AuditKey {
    AuditKey {
        figures: AuditKeyFigures {
            key: KeyHash(wire.key),
            group: wire.group,
            window: Duration::from_nanos(wire.window_nanos),
            sums: wire.sums.sums(),
            incomplete_windows: wire.incomplete_windows,
        },
        owner,
        text: wire.text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums(admitted: u64, ideal: u64, worst: (u64, u64)) -> AuditSums {
        AuditSums {
            key_windows: 1,
            admitted,
            ideal,
            arrivals: admitted.max(ideal) * 2,
            over_admitted: admitted.saturating_sub(ideal),
            false_refused: ideal.saturating_sub(admitted),
            worst: Some(worst),
        }
    }

    #[test]
    fn messages_round_trip_and_garbage_or_past_bounds_is_an_error() {
        let question = AuditQuestion { group: Some(7), n: 10 };
        assert_eq!(decode_audit_question(&encode_audit_message(&question)).expect("round trip"), question);
        let figures = AuditFigures {
            group: 7,
            window: Duration::from_millis(500),
            sums: sums(120, 100, (70, 50)),
            incomplete_key_windows: 2,
        };
        let key = AuditKeyFigures {
            key: KeyHash(42),
            group: 7,
            window: Duration::from_millis(500),
            sums: sums(60, 50, (35, 50)),
            incomplete_windows: 1,
        };
        let reply = AuditReply {
            figures: vec![wire_figures(&figures)],
            keys: vec![wire_key(&key, Some("k".into()))],
        };
        let decoded = decode_audit_reply(&encode_audit_message(&reply)).expect("round trip");
        assert_eq!(decoded, reply);
        assert_eq!(figures_of(&decoded.figures[0]), figures);
        assert_eq!(key_of_wire(decoded.keys[0].clone(), NodeId(3)).figures, key);
        let too_many = AuditReply {
            figures: vec![wire_figures(&figures); AUDIT_FIGURES_PER_ANSWER_MAX + 1],
            keys: vec![],
        };
        assert!(decode_audit_reply(&encode_audit_message(&too_many)).is_err());
        let top_version = crate::top::encode_message(&reply);
        for garbage in [&[][..], &[AUDIT_QUERY_TAG][..], &[AUDIT_QUERY_TAG, 0xFF, 0xFF], &top_version] {
            assert!(decode_audit_reply(garbage).is_err(), "{garbage:?}");
        }
        let mut trailing = encode_audit_message(&reply);
        trailing.push(0);
        assert!(decode_audit_reply(&trailing).is_err());
    }

    #[test]
    fn figures_add_per_group_and_window_and_keep_the_worst_window() {
        let at = |group, ms, s| AuditFigures {
            group,
            window: Duration::from_millis(ms),
            sums: s,
            incomplete_key_windows: 1,
        };
        let merged = merge_figures([
            at(2, 1000, sums(110, 100, (110, 100))),
            at(1, 1000, sums(90, 100, (90, 100))),
            at(2, 1000, sums(100, 100, (60, 50))),
            at(2, 500, sums(10, 10, (10, 10))),
        ]);
        let keys: Vec<(u64, u64)> = merged.iter().map(|f| (f.group, f.window.as_millis() as u64)).collect();
        assert_eq!(keys, [(1, 1000), (2, 500), (2, 1000)]);
        let two = merged[2];
        assert_eq!((two.sums.key_windows, two.sums.admitted, two.sums.ideal), (2, 210, 200));
        assert_eq!(two.sums.over_admitted, 10);
        assert_eq!(two.sums.worst, Some((60, 50)), "1.2 is worse than 1.1");
        assert_eq!(two.incomplete_key_windows, 2);
    }

    #[test]
    fn worst_keys_rank_by_over_admission_then_ratio_then_key() {
        let key = |hash, s| AuditKeyFigures {
            key: KeyHash(hash),
            group: 1,
            window: Duration::from_secs(1),
            sums: s,
            incomplete_windows: 0,
        };
        let mut keys = vec![
            key(1, sums(100, 100, (100, 100))),
            key(2, sums(130, 100, (130, 100))),
            key(3, sums(110, 100, (60, 50))),
            key(4, sums(110, 100, (55, 50))),
            key(0, sums(100, 100, (100, 100))),
        ];
        sort_worst(&mut keys, |k| k);
        let order: Vec<u128> = keys.iter().map(|k| k.key.0).collect();
        assert_eq!(order, [2, 3, 4, 0, 1]);
    }
}
