//! Usage-based limiting on top of checks: refunds, charges after the fact, and all-or-nothing
//! checks across several limits.
//!
//! A refund or a charge is decided by the key's owner in either mode (see
//! `ratemesh_core::node` `adjust.rs`): a refund returns hits, never above the capacity; a charge
//! applies hits unconditionally, and the bucket may go into debt, which later requests pay back.
//! The LLM-token pattern: check with an estimate, do the work, then charge the difference when
//! the real cost is above the estimate, or refund it when below.

use std::collections::HashMap;
use std::sync::Arc;

use ratemesh_core::{AdjustRequest, Adjustment, Algorithm, Decision, KeyHash, Policy};

use crate::node::{CheckError, NamedPolicy, Node, Released};

/// Why a refund or a charge was not applied. Nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdjustError {
    /// The node is shutting down or shut down (the caller should use another node).
    #[error("the node is shutting down")]
    ShutDown,
    /// The node is joining the cluster (see [`CheckError::Joining`]).
    #[error("the node is joining the cluster")]
    Joining,
    /// The policy is a concurrency limit: it counts leases, not hits (release the lease instead).
    #[error("refunds and charges do not apply to concurrency limits: release the lease")]
    Concurrency,
}

impl From<CheckError> for AdjustError {
    fn from(error: CheckError) -> Self {
        match error {
            CheckError::Joining => AdjustError::Joining,
            _ => AdjustError::ShutDown,
        }
    }
}

/// One check of an all-or-nothing group.
#[derive(Clone, Debug)]
pub struct GroupCheck {
    /// The limit, mode and fallback.
    pub policy: Arc<Policy>,
    /// The bucket (see [`NamedPolicy::key`]).
    pub key: KeyHash,
    /// Hits.
    pub cost: u64,
}

impl GroupCheck {
    /// A check of `cost` hits of `key` under `policy`.
    pub fn new(policy: &NamedPolicy, key: &[u8], cost: u64) -> GroupCheck {
        GroupCheck { policy: Arc::new(policy.policy().clone()), key: policy.key(key), cost }
    }
}

/// The answer to an all-or-nothing group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupDecision {
    /// Whether every check passed (and was consumed); when `false`, none was.
    pub allowed: bool,
    /// One decision per check, in order. When the group is refused: the check that refused has
    /// its refusal; checks before it passed and were given back, and have the answer to the
    /// give-back (whether a cost-1 check would pass now); checks after it were not taken and
    /// have the answer to a query (cost 0). A group that can never pass — the costs of one
    /// bucket's checks in it add up to more than its capacity — takes nothing: every check has
    /// the answer to a query, and the first one past the capacity is refused with no retry time.
    pub decisions: Vec<Decision>,
    /// The index of the check that refused, when the group is refused.
    pub refused_at: Option<usize>,
}

impl Node {
    /// Returns `hits` of `key` under `policy` (work that failed, or an estimate above the real
    /// cost), at the key's owner; never above the capacity. The decision says whether a cost-1
    /// check would pass afterwards. Window algorithms take the hits back from the current window
    /// (then, for the sliding window counter, the previous one).
    pub async fn refund(&self, policy: &NamedPolicy, key: &[u8], hits: u64) -> Result<Decision, AdjustError> {
        self.adjust(&Arc::new(policy.policy().clone()), policy.key(key), Adjustment::Refund, hits).await
    }

    /// Applies `hits` of `key` under `policy` unconditionally (the real cost, known after the
    /// work), at the key's owner: the bucket may go into debt, which later checks pay back. The
    /// decision says whether a cost-1 check would pass now, and when it will.
    pub async fn charge(&self, policy: &NamedPolicy, key: &[u8], hits: u64) -> Result<Decision, AdjustError> {
        self.adjust(&Arc::new(policy.policy().clone()), policy.key(key), Adjustment::Charge, hits).await
    }

    /// Refunds or charges `hits` of the bucket `bucket` (a key under `policy`:
    /// [`NamedPolicy::key`]), at the key's owner: [`Node::refund`] and [`Node::charge`] by name.
    pub async fn adjust(
        &self,
        policy: &Arc<Policy>,
        key: KeyHash,
        adjustment: Adjustment,
        hits: u64,
    ) -> Result<Decision, AdjustError> {
        if policy.limit.algorithm() == Algorithm::Concurrency {
            return Err(AdjustError::Concurrency);
        }
        let decision = self
            .decide_with(key, |core, id, now| {
                core.handle_adjust(now, AdjustRequest { id, key, policy: policy.clone(), adjustment, hits })
            })
            .await?;
        Ok(decision)
    }

    /// Checks every one of `checks`, all or nothing: when one refuses, none is consumed. The
    /// checks run in order; the first refusal stops the group, and the checks before it are given
    /// back (refunded, or their concurrency leases released). Meanwhile — for one round trip per
    /// check to its owner and one per give-back — their hits are reserved: a concurrent check of
    /// those keys may be refused for hits that are given back an instant later (never admitted
    /// beyond the limits). In approximate mode the given-back hits return to the owner's bucket,
    /// not to an allowance, and each check keeps approximate mode's bounds.
    pub async fn check_all(&self, checks: &[GroupCheck]) -> Result<GroupDecision, CheckError> {
        if let Some(refused_at) = never_passes(checks) {
            return self.refuse_for_good(checks, refused_at).await;
        }
        let mut decisions = Vec::with_capacity(checks.len());
        for check in checks {
            let decision = self.check_hashed(&check.policy, check.key, check.cost, None).await?;
            let refused = !decision.allowed;
            decisions.push(decision);
            if refused {
                break;
            }
        }
        let refused_at = decisions.iter().position(|d| !d.allowed);
        let Some(refused_at) = refused_at else {
            return Ok(GroupDecision { allowed: true, decisions, refused_at: None });
        };
        for (index, check) in checks.iter().enumerate().take(refused_at) {
            decisions[index] = self.give_back(check, &decisions[index]).await?;
        }
        // The refusal was decided with the hits of earlier checks of its bucket held; its retry
        // time is right for the group (the bucket must take all of them), its state is not: a
        // query once everything is given back has it.
        let refused = &checks[refused_at];
        if checks[..refused_at].iter().any(|check| check.key == refused.key) {
            let now = self.query(refused).await?;
            let refusal = &mut decisions[refused_at];
            (refusal.remaining, refusal.reset_after) = (now.remaining, now.reset_after);
        }
        for check in &checks[refused_at + 1..] {
            decisions.push(self.query(check).await?);
        }
        Ok(GroupDecision { allowed: false, decisions, refused_at: Some(refused_at) })
    }

    /// The answer to a group that can never pass (see [`never_passes`]): nothing is taken, every
    /// check has the answer to a query, and the one that cannot pass is refused with no retry
    /// time — as a single check costlier than its capacity is.
    async fn refuse_for_good(
        &self,
        checks: &[GroupCheck],
        refused_at: usize,
    ) -> Result<GroupDecision, CheckError> {
        let mut decisions = Vec::with_capacity(checks.len());
        for check in checks {
            decisions.push(self.query(check).await?);
        }
        let refusal = &mut decisions[refused_at];
        (refusal.allowed, refusal.retry_after) = (false, None);
        Ok(GroupDecision { allowed: false, decisions, refused_at: Some(refused_at) })
    }

    /// A cost-0 check of `check`'s bucket: its state, taking nothing.
    async fn query(&self, check: &GroupCheck) -> Result<Decision, CheckError> {
        self.check_hashed(&check.policy, check.key, 0, None).await
    }

    /// Gives back what an admitted check of a refused group took.
    async fn give_back(&self, check: &GroupCheck, admitted: &Decision) -> Result<Decision, CheckError> {
        if let Some(lease) = admitted.lease {
            match self.release(&check.policy, check.key, lease)? {
                Released::Ended | Released::NotHeld | Released::SentToOwner(_) => {}
            }
            // The lease's hits are free again (the owner applies the release; no answer comes).
            let remaining = admitted.remaining.saturating_add(check.cost).min(admitted.limit);
            return Ok(Decision { lease: None, remaining, ..*admitted });
        }
        if check.cost == 0 {
            return Ok(*admitted);
        }
        match self.adjust(&check.policy, check.key, Adjustment::Refund, check.cost).await {
            Ok(decision) => Ok(decision),
            Err(AdjustError::Joining) => Err(CheckError::Joining),
            Err(_) => Err(CheckError::ShutDown),
        }
    }
}

/// The first check of `checks` that the group can never pass: with the checks before it of the
/// same bucket (the same key hash: one policy's namespace), it costs more than the bucket's
/// capacity, so no wait makes room for all of them.
/// (Bounded: a map of at most `checks.len()` buckets.)
fn never_passes(checks: &[GroupCheck]) -> Option<usize> {
    let mut totals: HashMap<KeyHash, u64> = HashMap::with_capacity(checks.len());
    checks.iter().position(|check| {
        let total = totals.entry(check.key).or_default();
        // A cost-0 check passes only if a hit would (a query answers for a cost-1 check).
        let never = total.saturating_add(check.cost.max(1)) > check.policy.limit.capacity();
        *total = total.saturating_add(check.cost);
        never
    })
}
