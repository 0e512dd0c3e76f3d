//! The audit over a node's lanes and over the cluster ([`crate::audit`]): [`Node::audit_figures`],
//! [`Node::audit_worst_keys`], [`Node::audit_stats`], [`Node::audit_windows`] and
//! [`Node::audit`], and how a node answers other members' audit questions.

use std::sync::{Arc, Weak};

use ratemesh_core::{AuditFigures, AuditKeyFigures, AuditStats, AuditWindow, KeyHash};

use super::{Node, Shared};
use crate::audit::{
    AUDIT_FIGURES_PER_ANSWER_MAX, AUDIT_KEYS_PER_ANSWER_MAX, AuditKey, AuditQuestion, AuditReply,
    AuditReport, decode_audit_question, decode_audit_reply, encode_audit_message, figures_of, key_of_wire,
    merge_figures, sort_worst, wire_figures, wire_key,
};
use crate::transport::QueryHandler;

impl Shared {
    /// The audit's figures of every lane at this node's now, added per group and window.
    fn audit_figures(&self) -> Vec<AuditFigures> {
        let now = self.now();
        merge_figures(self.lanes.iter().flat_map(|lane| lane.lock().core.audit_figures(now)))
    }

    /// The `n` worst keys over every lane (each key is in one lane: no sums to add), with their
    /// text from the top-keys shard of their lane when it knows the bucket.
    fn audit_worst_keys(&self, group: Option<u64>, n: usize) -> Vec<(AuditKeyFigures, Option<String>)> {
        let now = self.now();
        let mut keys = Vec::new();
        for lane in &self.lanes {
            let state = lane.lock();
            for figures in state.core.audit_worst_keys(group, n, now) {
                let text = state.top.key_of(figures.group, figures.key);
                keys.push((figures, text));
            }
        }
        sort_worst(&mut keys, |(figures, _)| figures);
        keys.truncate(n);
        keys
    }

    /// What this node answers an audit question: its figures and its worst keys.
    fn audit_reply(&self, group: Option<u64>, n: usize) -> AuditReply {
        let mut figures: Vec<_> = self.audit_figures().iter().map(wire_figures).collect();
        figures.truncate(AUDIT_FIGURES_PER_ANSWER_MAX);
        let keys = self
            .audit_worst_keys(group, n.min(AUDIT_KEYS_PER_ANSWER_MAX))
            .into_iter()
            .map(|(figures, text)| wire_key(&figures, text))
            .collect();
        AuditReply { figures, keys }
    }
}

/// How a node answers other members' audit questions: from its own lanes, at its own now
/// (nothing, which the asker reports as missing, once the node is gone or the question is
/// unreadable).
pub(super) fn audit_query_handler(shared: Weak<Shared>) -> QueryHandler {
    Arc::new(move |_from, question| {
        let Some(shared) = shared.upgrade() else { return Vec::new() };
        match decode_audit_question(question) {
            Ok(question) => {
                let n = usize::try_from(question.n).unwrap_or(usize::MAX);
                encode_audit_message(&shared.audit_reply(question.group, n))
            }
            Err(_) => Vec::new(),
        }
    })
}

impl Node {
    /// The audit's figures at this node over the last minute, per group (a policy:
    /// [`crate::NamedPolicy::audit_group`]; 0 for limits without a name) and window length:
    /// what the cluster admitted of the keys this node owns against what one ideal limiter
    /// would have, every lane's sums added. Groups without a closed window are left out.
    pub fn audit_figures(&self) -> Vec<AuditFigures> {
        self.shared.audit_figures()
    }

    /// The `n` keys this node owns that were admitted most above the ideal over the last minute
    /// (ties: the worst admitted/limit ratio of a window), in `group` if given, over every lane.
    pub fn audit_worst_keys(&self, group: Option<u64>, n: usize) -> Vec<AuditKeyFigures> {
        self.shared.audit_worst_keys(group, n).into_iter().map(|(figures, _)| figures).collect()
    }

    /// The audit's counters, every lane's added (`sample_bits`: the largest lane's).
    pub fn audit_stats(&self) -> AuditStats {
        let mut total = AuditStats::default();
        for lane in &self.shared.lanes {
            total.merge(&lane.lock().core.audit_stats());
        }
        total
    }

    /// The closed audit windows of bucket `key` this node keeps as its owner (the last minute's),
    /// oldest first; empty when it does not audit the key.
    pub fn audit_windows(&self, key: KeyHash) -> Vec<AuditWindow> {
        self.shared.lane(key).lock().core.audit_windows(key)
    }

    /// The audit of the whole cluster: this node's figures and `n` worst keys (of `group` if
    /// given; at most [`AUDIT_KEYS_PER_ANSWER_MAX`]) with every other live member's, asked at once
    /// over the peer transport like [`Node::top`] and waited for at most the top query timeout.
    /// Figures are added per group and window (each key has one owner); keys are ranked like
    /// [`Node::audit_worst_keys`], each with its owner and its text when the owner's top-keys
    /// sketches (or this node's) know it.
    pub async fn audit(&self, group: Option<u64>, n: usize) -> AuditReport {
        let n = n.min(AUDIT_KEYS_PER_ANSWER_MAX);
        let own = self.shared.audit_reply(group, n);
        let question = AuditQuestion { group, n: u32::try_from(n).unwrap_or(u32::MAX) };
        let decode = |bytes: &[u8]| decode_audit_reply(bytes).map_err(|e| e.to_string());
        let (replies, answered, missing) = self.ask_members(encode_audit_message(&question), decode).await;
        let mut figures = Vec::new();
        let mut keys = Vec::new();
        for (member, reply) in std::iter::once((self.shared.id, own)).chain(replies) {
            figures.extend(reply.figures.iter().map(figures_of));
            keys.extend(reply.keys.into_iter().map(|wire| key_of_wire(wire, member)));
        }
        sort_worst(&mut keys, |key: &AuditKey| &key.figures);
        keys.truncate(n);
        // A key another member owns may have been checked here: this node's sketches may know it.
        for key in keys.iter_mut().filter(|key| key.text.is_none()) {
            let state = self.shared.lane(key.figures.key).lock();
            key.text = state.top.key_of(key.figures.group, key.figures.key);
        }
        AuditReport { figures: merge_figures(figures), keys, answered, missing }
    }
}
