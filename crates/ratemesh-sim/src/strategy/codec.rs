//! The baselines' messages: a small serde enum, encoded with postcard.

use serde::{Deserialize, Serialize};

/// The most bytes one baseline message may have; longer input is not decoded.
pub const MESSAGE_LEN_MAX: usize = 1 << 20;
/// The most keys in one baseline message; more are split over several.
pub const BATCH_LEN_MAX: usize = 1024;

/// A baseline message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Gubernator: hits admitted by a non-owner, per key, for the owner to apply.
    Hits(Vec<(u128, u64)>),
    /// Gubernator: the owner's state per key (token-bucket backlog in nanoseconds), overwriting
    /// the receivers' copies.
    Globals(Vec<(u128, u64)>),
    /// CRDT: G-counter states.
    Counters(Vec<Counters>),
}

/// One key's G-counter state in the CRDT baseline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// The key.
    pub key: u128,
    /// How long ago the sender started counting the key.
    pub age_nanos: u64,
    /// Refill the sender saw wasted on a full bucket.
    pub forfeit: u64,
    /// Hits admitted per node.
    pub counts: Vec<(u32, u64)>,
}

/// Encodes `message`; `None` if it does not fit [`MESSAGE_LEN_MAX`].
pub fn encode(message: &Message) -> Option<Vec<u8>> {
    postcard::to_allocvec(message).ok().filter(|bytes| bytes.len() <= MESSAGE_LEN_MAX)
}

/// Decodes `bytes`; `None` when oversized, malformed or followed by trailing bytes.
pub fn decode(bytes: &[u8]) -> Option<Message> {
    if bytes.len() > MESSAGE_LEN_MAX {
        return None;
    }
    match postcard::take_from_bytes(bytes) {
        Ok((message, [])) => Some(message),
        _ => None,
    }
}
