//! What the daemon checks and what it answers, shared by every front end:
//!
//! - [`Target`]: what a check counts against, a configured policy ([`PolicyEntry`]) or an
//!   [`InlineLimit`]; [`ValidCheck`]: a check validated by a front end (HTTP body, `GET
//!   /v1/auth` query, Envoy descriptor).
//! - [`Answer`]: the one typed answer of `crate::daemon::Daemon`'s checks, refunds and charges:
//!   the target (the policy's identity and its shadow mode) and the [`Verdict`], unlimited or
//!   decided on a bucket. The HTTP API, the Envoy RLS server and the metrics each render it once.
//!   Shadow mode is applied in one place, [`Answer::answered`]; "unlimited" has one form,
//!   [`Verdict::Unlimited`].

use std::sync::Arc;

use ratemesh_core::{Decision, KeyHash, Namespace, Policy};

use crate::config::{INLINE_LABEL, fallback_name, mode_name};
use crate::policy::PolicyEntry;

/// What a check counts against: a configured policy or an inline limit.
#[derive(Clone, Debug)]
pub enum Target {
    /// A configured policy.
    Named(Arc<PolicyEntry>),
    /// A limit given in the request.
    Inline(InlineLimit),
}

/// A validated inline limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InlineLimit {
    /// The limit with its mode and fallback.
    pub policy: Arc<Policy>,
    /// The namespace of its buckets (from its canonical text).
    pub namespace: Namespace,
}

impl InlineLimit {
    /// Wraps `policy`, with its namespace.
    pub fn new(policy: Policy) -> InlineLimit {
        let namespace = Namespace::new(inline_name(&policy).as_bytes());
        InlineLimit { policy: Arc::new(policy), namespace }
    }
}

/// The canonical text of an inline limit: every parameter that changes what the bucket admits.
fn inline_name(policy: &Policy) -> String {
    let spec = policy.limit.spec();
    let optional = |value: Option<u64>| value.map_or_else(|| "-".to_owned(), |v| v.to_string());
    format!(
        "inline:{}:{}/{}ns:burst={}:delay={}:{}:{}",
        spec.algorithm.name(),
        spec.limit,
        spec.period.as_nanos(),
        optional(spec.burst),
        optional(spec.delay),
        mode_name(policy.mode),
        fallback_name(policy.fallback),
    )
}

impl Target {
    /// The limit a check made now runs under, unless the policy is unlimited (for a calendar
    /// window: the current window's).
    pub fn policy(&self) -> Option<Arc<Policy>> {
        match self {
            Target::Named(entry) => entry.rule.policy(),
            Target::Inline(inline) => Some(Arc::clone(&inline.policy)),
        }
    }

    /// Whether refusals are only reported (a policy's `shadow_mode`).
    pub fn shadow_mode(&self) -> bool {
        match self {
            Target::Named(entry) => entry.shadow_mode,
            Target::Inline(_) => false,
        }
    }

    /// The `policy` label of metrics and the name in `RateLimit-Policy`: the policy's name, or
    /// [`INLINE_LABEL`].
    pub fn label(&self) -> &str {
        match self {
            Target::Named(entry) => &entry.name,
            Target::Inline(_) => INLINE_LABEL,
        }
    }

    /// The namespace of the target's buckets.
    pub fn namespace(&self) -> Namespace {
        match self {
            Target::Named(entry) => entry.namespace,
            Target::Inline(inline) => inline.namespace,
        }
    }
}

/// A validated check: hand `key`, `cost` and the target's policy to the node.
#[derive(Clone, Debug)]
pub struct ValidCheck {
    /// What it counts against. An unlimited policy ([`Target::policy`] is `None`) is allowed
    /// without asking the node.
    pub target: Target,
    /// The bucket.
    pub key: KeyHash,
    /// The key as the client wrote it (for the top-keys sketches, never for metrics).
    pub key_text: String,
    /// Hits (0 = query); with `refund`, hits to give back.
    pub cost: u64,
    /// A refund (the JSON cost was negative): `cost` hits go back to the bucket.
    pub refund: bool,
}

/// The daemon's answer to one check, refund or charge (see the module documentation).
#[derive(Clone, Debug)]
pub struct Answer {
    /// What it was decided against: the policy's label and shadow mode.
    pub target: Target,
    /// What was decided.
    pub verdict: Verdict,
}

/// What the daemon decided.
#[derive(Clone, Debug)]
pub enum Verdict {
    /// An unlimited policy: allowed without asking the node, nothing counted, no limit to
    /// report (front ends write no rate-limit headers for it).
    Unlimited,
    /// Decided on a bucket.
    Limited {
        /// The limit the decision was made under (a calendar rule's: the window it fell in).
        policy: Arc<Policy>,
        /// The node's decision as made, before shadow mode.
        decision: Decision,
    },
}

impl Answer {
    /// The answer of an unlimited policy.
    pub fn unlimited(target: Target) -> Answer {
        Answer { target, verdict: Verdict::Unlimited }
    }

    /// The answer of `decision`, made under `policy`.
    pub fn limited(target: Target, policy: Arc<Policy>, decision: Decision) -> Answer {
        Answer { target, verdict: Verdict::Limited { policy, decision } }
    }

    /// The `policy` label of metrics and the name in `RateLimit-Policy`.
    pub fn label(&self) -> &str {
        self.target.label()
    }

    /// The limit and the decision as the client is answered: the node's decision, except that
    /// in shadow mode a refusal is answered as allowed, with no retry time (the refusal itself
    /// is only reported: [`Answer::shadow_refused`]). `None` for an unlimited policy.
    ///
    /// This is the one place shadow mode applies.
    pub fn answered(&self) -> Option<(&Policy, Decision)> {
        match &self.verdict {
            Verdict::Unlimited => None,
            Verdict::Limited { policy, decision } if self.shadow_refused() => {
                Some((policy, Decision { allowed: true, retry_after: None, ..*decision }))
            }
            Verdict::Limited { policy, decision } => Some((policy, *decision)),
        }
    }

    /// Whether the request passes: always under an unlimited policy, and in shadow mode.
    pub fn allowed(&self) -> bool {
        self.answered().is_none_or(|(_, decision)| decision.allowed)
    }

    /// Whether the node refused, and shadow mode answered allowed.
    pub fn shadow_refused(&self) -> bool {
        matches!(&self.verdict, Verdict::Limited { decision, .. } if !decision.allowed)
            && self.target.shadow_mode()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ratemesh_core::{Algorithm, Limit, LimitSpec, Mode};

    use super::*;
    use crate::policy::tests::table;

    fn answer(policy_name: &str, allowed: bool) -> Answer {
        let target = Target::Named(Arc::clone(table().get(policy_name).expect("configured")));
        let limit =
            Limit::new(LimitSpec::new(Algorithm::FixedWindow, 1, Duration::from_secs(1))).expect("valid");
        let policy = Arc::new(Policy::new(limit, Mode::Approximate));
        let decision = Decision {
            allowed,
            limit: 1,
            remaining: 0,
            reset_after: Duration::from_secs(1),
            retry_after: (!allowed).then_some(Duration::from_secs(1)),
            delay: Duration::ZERO,
            lease: None,
        };
        Answer::limited(target, policy, decision)
    }

    #[test]
    fn shadow_mode_answers_a_refusal_as_allowed_and_reports_it() {
        let refused = answer("api", false);
        assert!(!refused.allowed() && !refused.shadow_refused());
        assert_eq!(refused.answered().map(|(_, d)| d.retry_after), Some(Some(Duration::from_secs(1))));
        let shadow = answer("shadow", false);
        assert!(shadow.allowed() && shadow.shadow_refused());
        let (_, answered) = shadow.answered().expect("limited");
        assert_eq!((answered.allowed, answered.retry_after, answered.remaining), (true, None, 0));
        assert!(!answer("shadow", true).shadow_refused());
    }

    #[test]
    fn an_unlimited_answer_is_allowed_with_no_limit() {
        let health = Target::Named(Arc::clone(table().get("health").expect("configured")));
        let unlimited = Answer::unlimited(health);
        assert!(unlimited.allowed() && !unlimited.shadow_refused());
        assert!(unlimited.answered().is_none());
        assert_eq!(unlimited.label(), "health");
    }
}
