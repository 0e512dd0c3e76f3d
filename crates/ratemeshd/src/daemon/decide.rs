//! The daemon's decisions: checks, refunds, charges, all-or-nothing groups and lease releases,
//! each answered as one [`Answer`] (counted in metrics for checks).

use std::sync::Arc;

use ratemesh::{AdjustError, Adjustment, CheckError, GroupCheck, Released, TopLabel};
use ratemesh_core::{KeyHash, LeaseId, Policy};

use super::Daemon;
use crate::check::{Answer, Target, ValidCheck};

impl Daemon {
    /// Checks `cost` hits of `key` against `target`, counted in metrics. A named policy's check
    /// is counted in the node's top-keys sketches under `key_text` (the key as the client wrote
    /// it); inline limits are not (they have no name to ask for).
    ///
    /// - An unlimited policy is allowed without asking the node ([`crate::check::Verdict::Unlimited`]).
    /// - A shadow-mode refusal is answered as allowed ([`Answer::answered`]) and counted as
    ///   `decision="shadow_refused"` in metrics.
    /// - Once shutdown began, [`CheckError::ShutDown`] (answer 503 / UNAVAILABLE: the client
    ///   should ask another node).
    pub async fn check(
        &self,
        target: &Target,
        key: KeyHash,
        key_text: &str,
        cost: u64,
    ) -> Result<Answer, CheckError> {
        let answer = match target.policy() {
            None => Answer::unlimited(target.clone()),
            Some(_) if self.is_shutting_down() => return Err(CheckError::ShutDown),
            Some(policy) => {
                // Named policies are counted in the top-keys sketches; inline limits have no name.
                let label = match target {
                    Target::Named(entry) => Some(TopLabel { policy: &entry.name, key: key_text.as_bytes() }),
                    Target::Inline(_) => None,
                };
                let decision = self.node.check_hashed(&policy, key, cost, label).await?;
                Answer::limited(target.clone(), policy, decision)
            }
        };
        self.metrics.record(&answer);
        Ok(answer)
    }

    /// Returns `hits` to `key`'s bucket (a negative cost), at the key's owner. The answer says
    /// whether a cost-1 check would pass afterwards.
    pub async fn refund(&self, target: &Target, key: KeyHash, hits: u64) -> Result<Answer, AdjustError> {
        self.adjust(target, key, Adjustment::Refund, hits).await
    }

    /// Applies `hits` to `key`'s bucket unconditionally (it may go into debt), at the key's owner.
    /// The answer says whether a cost-1 check would pass now, and when it will.
    pub async fn charge(&self, target: &Target, key: KeyHash, hits: u64) -> Result<Answer, AdjustError> {
        self.adjust(target, key, Adjustment::Charge, hits).await
    }

    async fn adjust(
        &self,
        target: &Target,
        key: KeyHash,
        adjustment: Adjustment,
        hits: u64,
    ) -> Result<Answer, AdjustError> {
        let Some(policy) = target.policy() else { return Ok(Answer::unlimited(target.clone())) };
        if self.is_shutting_down() {
            return Err(AdjustError::ShutDown);
        }
        let decision = self.node.adjust(&policy, key, adjustment, hits).await?;
        let answer = Answer::limited(target.clone(), policy, decision);
        self.metrics.record_adjustment(&answer, adjustment, hits);
        Ok(answer)
    }

    /// Checks every one of `checks`, all or nothing (see [`ratemesh::Node::check_all`]); an unlimited
    /// policy always passes, and a shadow-mode policy is checked on its own (it never refuses).
    /// The answers are in the order of `checks`.
    pub async fn check_all(&self, checks: &[ValidCheck]) -> Result<(bool, Vec<Answer>), CheckError> {
        if self.is_shutting_down() {
            return Err(CheckError::ShutDown);
        }
        // The limit each check of the group runs under (`None`: checked on its own).
        let grouped: Vec<Option<Arc<Policy>>> = checks
            .iter()
            .map(|check| check.target.policy().filter(|_| !check.target.shadow_mode()))
            .collect();
        let group: Vec<GroupCheck> = checks
            .iter()
            .zip(&grouped)
            .filter_map(|(check, policy)| {
                Some(GroupCheck { policy: Arc::clone(policy.as_ref()?), key: check.key, cost: check.cost })
            })
            .collect();
        let answer = self.node.check_all(&group).await?;
        let mut group_decisions = answer.decisions.into_iter();
        let mut answers = Vec::with_capacity(checks.len());
        for (check, policy) in checks.iter().zip(grouped) {
            // The group has one decision per check (`GroupDecision::decisions`).
            let grouped_decision = policy.and_then(|policy| Some((policy, group_decisions.next()?)));
            let answer = match grouped_decision {
                Some((policy, decision)) => {
                    let answer = Answer::limited(check.target.clone(), policy, decision);
                    self.metrics.record(&answer);
                    answer
                }
                None => self.check(&check.target, check.key, &check.key_text, check.cost).await?,
            };
            answers.push(answer);
        }
        Ok((answer.allowed, answers))
    }

    /// Gives back a concurrency lease taken under `policy` on `key`.
    pub fn release(&self, policy: &Policy, key: KeyHash, lease: LeaseId) -> Result<Released, CheckError> {
        if self.is_shutting_down() {
            return Err(CheckError::ShutDown);
        }
        self.node.release(policy, key, lease)
    }
}
