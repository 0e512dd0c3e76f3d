//! Questions between members over the peer transport (mutual TLS, bounded, timed): ratemesh's
//! own top-keys question, and one application channel ([`Node::ask`], [`Node::answer_queries`])
//! on which an embedder's members ask each other what the core's protocol does not carry (the
//! daemon's RLQS quota shares ask a key's owner, for one).
//!
//! The first byte of a question says whose it is: [`APP_QUERY_TAG`] for the application's,
//! [`AUDIT_QUERY_TAG`] for the audit's ([`Node::audit`]), anything else for ratemesh's own
//! top keys (their version byte). An empty answer is no answer:
//! a member without an application handler gives one, and the asker gets
//! [`AskError::NotAnswered`].

use std::sync::{Arc, Weak};
use std::time::Duration;

use ratemesh_core::NodeId;

use super::audit::audit_query_handler;
use super::driver::top_query_handler;
use super::{Node, Shared};
use crate::audit::AUDIT_QUERY_TAG;
use crate::membership::MemberStatus;
use crate::transport::{QUERY_LEN_MAX, QueryHandler, TransportError};

/// The first byte of an application question (never a top-keys version, nor the audit's tag).
pub const APP_QUERY_TAG: u8 = 0xA7;

/// Why [`Node::ask`] has no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AskError {
    /// The member is not a live member of this node's view.
    #[error("{0:?} is not a live member")]
    NotLive(NodeId),
    /// The question is empty or longer than [`APP_QUESTION_LEN_MAX`].
    #[error("a question of {len_bytes} bytes (1 to {APP_QUESTION_LEN_MAX} are sent)")]
    QuestionLen {
        /// The question's length.
        len_bytes: usize,
    },
    /// The transport failed: unreachable, timed out, refused, answer too long.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The member answered nothing (it has no application handler, or its handler declined).
    #[error("the member answered nothing")]
    NotAnswered,
}

/// The longest application question, in bytes (the transport's bound less the tag).
pub const APP_QUESTION_LEN_MAX: usize = QUERY_LEN_MAX - 1;

/// The transport's one handler: the tag picks the application's handler (once set), the
/// audit's answer or ratemesh's own top-keys answer.
pub(super) fn query_handler(shared: Weak<Shared>) -> QueryHandler {
    let top = top_query_handler(shared.clone());
    let audit = audit_query_handler(shared.clone());
    Arc::new(move |from, question| match question.split_first() {
        Some((&AUDIT_QUERY_TAG, _)) => audit(from, question),
        Some((&APP_QUERY_TAG, body)) => {
            let Some(shared) = shared.upgrade() else { return Vec::new() };
            shared.app_queries.get().map_or_else(Vec::new, |handler| handler(from, body))
        }
        _ => top(from, question),
    })
}

impl Node {
    /// Sets how this node answers other members' [`Node::ask`] (once: a later call changes
    /// nothing and returns `false`). The handler runs on the transport's tasks, so it must not
    /// block; it gets the asker (from its certificate) and the question, and returns the answer
    /// (empty: no answer). Until it is set, questions get no answer.
    pub fn answer_queries(&self, handler: QueryHandler) -> bool {
        self.shared.app_queries.set(handler).is_ok()
    }

    /// Asks live member `member` `question` (1 to [`APP_QUESTION_LEN_MAX`] bytes) over the peer
    /// transport, and returns its handler's answer, all within `limit`. A question to this node
    /// itself is answered by its own handler, without the network.
    pub async fn ask(&self, member: NodeId, question: &[u8], limit: Duration) -> Result<Vec<u8>, AskError> {
        if question.is_empty() || question.len() > APP_QUESTION_LEN_MAX {
            return Err(AskError::QuestionLen { len_bytes: question.len() });
        }
        let answer = if member == self.shared.id {
            let handler = self.shared.app_queries.get().ok_or(AskError::NotAnswered)?;
            handler(member, question)
        } else {
            let addr = self
                .members()
                .into_iter()
                .find(|m| m.id == member && m.status == MemberStatus::Live)
                .map(|m| m.quic_addr)
                .ok_or(AskError::NotLive(member))?;
            let mut tagged = Vec::with_capacity(question.len() + 1);
            tagged.push(APP_QUERY_TAG);
            tagged.extend_from_slice(question);
            self.shared.transport.query(member, addr, &tagged, limit).await?
        };
        if answer.is_empty() {
            return Err(AskError::NotAnswered);
        }
        Ok(answer)
    }
}
