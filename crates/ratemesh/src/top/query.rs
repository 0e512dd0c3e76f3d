//! The versioned top-keys question and answer members exchange over the peer transport.

use serde::{Deserialize, Serialize};

use super::{TopBy, TopSummary};

/// The first byte of a top-keys question and answer between members: a peer of another version
/// answers nothing this node reads (and is reported as missing).
pub const TOP_QUERY_VERSION: u8 = 1;
/// Summaries a member's answer may hold (two half-windows; room for a later layout).
const SUMMARIES_PER_ANSWER_MAX: usize = 8;

/// Why a member's top-keys answer was not used.
#[derive(Debug, thiserror::Error)]
pub enum TopQueryError {
    /// The bytes are not a question or answer of [`TOP_QUERY_VERSION`] (a peer of another
    /// version, or a malformed message; nothing was changed).
    #[error("malformed or foreign-version top-keys message: {0}")]
    Malformed(&'static str),
}

/// What a member asks another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopQuestion {
    /// The policy's name.
    pub policy: String,
    /// Demand or refused hits.
    pub by: TopBy,
}

/// What a member answers: its summaries and the span they cover.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopReply {
    /// The span, in nanoseconds.
    pub window_nanos: u64,
    /// Current half-window first.
    pub summaries: Vec<TopSummary>,
}

/// `message` as bytes: the version, then postcard.
pub fn encode_message<T: Serialize>(message: &T) -> Vec<u8> {
    let mut bytes = vec![TOP_QUERY_VERSION];
    // Serializing these plain structures into a vector cannot fail.
    bytes.extend(postcard::to_allocvec(message).unwrap_or_default());
    bytes
}

/// A question from its bytes.
pub fn decode_question(bytes: &[u8]) -> Result<TopQuestion, TopQueryError> {
    decode(bytes)
}

/// An answer from its bytes, checked against the bounds.
pub fn decode_reply(bytes: &[u8]) -> Result<TopReply, TopQueryError> {
    let reply: TopReply = decode(bytes)?;
    if reply.summaries.len() > SUMMARIES_PER_ANSWER_MAX {
        return Err(TopQueryError::Malformed("too many summaries"));
    }
    Ok(reply)
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, TopQueryError> {
    match bytes.split_first() {
        Some((&TOP_QUERY_VERSION, body)) => match postcard::take_from_bytes::<T>(body) {
            Ok((message, [])) => Ok(message),
            Ok(_) => Err(TopQueryError::Malformed("trailing bytes")),
            Err(_) => Err(TopQueryError::Malformed("undecodable body")),
        },
        Some(_) => Err(TopQueryError::Malformed("unknown version")),
        None => Err(TopQueryError::Malformed("empty")),
    }
}
