//! Validation of the bodies against the policy table and the bounds: the target (a policy,
//! its override or tier, or an inline limit), the key, the cost; every refusal names its field.

use std::sync::Arc;
use std::time::Duration;

use ratemesh::{Calendar, CalendarPolicy, CalendarUnit};
use ratemesh_core::{
    Algorithm, Audit, Fallback, KeyHash, LeaseId, Limit, LimitSpec, Mode, Namespace, Policy, PolicyRegion,
};

use super::{BodyError, ChargeBody, CheckBody, CostJson, LimitBody, ReleaseBody, invalid};
use crate::check::{InlineLimit, Target, ValidCheck};
use crate::config::{
    Bounds, FALLBACK_DEFAULT, MODE_DEFAULT, TIME_ZONE_DEFAULT, algorithm_names, fallback_from_name,
    fallback_name, limit_error_field, limit_error_message, mode_from_name, mode_name,
};
use crate::policy::{PolicyTable, UnknownTier};

/// A validated charge.
#[derive(Clone, Debug)]
pub struct ValidCharge {
    /// What it counts against (never a concurrency limit).
    pub target: Target,
    /// The bucket.
    pub key: KeyHash,
    /// Hits to apply.
    pub cost: u64,
}

/// A validated release of a concurrency lease.
#[derive(Clone, Debug)]
pub struct ValidRelease {
    /// The limit the lease was taken under (always a concurrency limit).
    pub policy: Arc<Policy>,
    /// The target, for metrics labels.
    pub target: Target,
    /// The bucket.
    pub key: KeyHash,
    /// The lease.
    pub lease: LeaseId,
}

impl LimitBody {
    /// Validates the inline limit; errors name fields under `field` (`limit`).
    pub fn validate(&self, field: &str) -> Result<InlineLimit, BodyError> {
        let sub = |name: &str| format!("{field}.{name}");
        let algorithm_name = self.algorithm.as_deref().ok_or_else(|| invalid(sub("algorithm"), "missing"))?;
        let algorithm = Algorithm::from_name(algorithm_name).ok_or_else(|| {
            invalid(
                sub("algorithm"),
                format!("unknown algorithm {algorithm_name:?}: use one of {}", algorithm_names()),
            )
        })?;
        let limit = self.limit.ok_or_else(|| invalid(sub("limit"), "missing"))?;
        let (mode, fallback) = self.mode_and_fallback(field)?;
        if let Some(window) = self.window.as_deref() {
            return self.calendar(field, algorithm, limit, window, mode, fallback);
        }
        if self.time_zone.is_some() {
            return Err(invalid(sub("time_zone"), "applies only with window (a calendar window)"));
        }
        let period_ms = self.period_ms.ok_or_else(|| invalid(sub("period_ms"), "missing"))?;
        let spec = LimitSpec {
            algorithm,
            limit,
            period: Duration::from_millis(period_ms),
            burst: self.burst,
            delay: self.delay,
            calendar: None,
        };
        let limit = Limit::new(spec)
            .map_err(|error| invalid(sub(limit_error_field(&error)), limit_error_message(&error)))?;
        Ok(InlineLimit::new(Policy { fallback, ..Policy::new(limit, mode) }))
    }

    /// An inline calendar window, resolved for now (the request is decided at once). Its buckets
    /// are named by the rule (limit, window, zone), not by the current window's bounds.
    fn calendar(
        &self,
        field: &str,
        algorithm: Algorithm,
        limit: u64,
        window: &str,
        mode: Mode,
        fallback: Fallback,
    ) -> Result<InlineLimit, BodyError> {
        let sub = |name: &str| format!("{field}.{name}");
        let unit = CalendarUnit::from_name(window).ok_or_else(|| {
            let units: Vec<&str> = CalendarUnit::ALL.iter().map(|u| u.name()).collect();
            invalid(sub("window"), format!("unknown window {window:?}: use one of {}", units.join(", ")))
        })?;
        if algorithm != Algorithm::FixedWindow {
            return Err(invalid(sub("algorithm"), "a calendar window (window) is a fixed_window"));
        }
        let not_with_window = [("period_ms", self.period_ms), ("burst", self.burst), ("delay", self.delay)];
        if let Some((name, _)) = not_with_window.into_iter().find(|(_, value)| value.is_some()) {
            return Err(invalid(sub(name), "does not apply with window (the window is the period)"));
        }
        let zone = self.time_zone.as_deref().unwrap_or(TIME_ZONE_DEFAULT);
        let calendar =
            Calendar::new(unit, zone).map_err(|error| invalid(sub("time_zone"), error.to_string()))?;
        let rule =
            CalendarPolicy::new(calendar, limit, (mode, fallback, Audit::default(), PolicyRegion::default()))
                .map_err(|error| invalid(sub("limit"), error.to_string()))?;
        let name = format!(
            "inline:fixed_window:{limit}/calendar:{}@{zone}:{}:{}",
            unit.name(),
            mode_name(mode),
            fallback_name(fallback)
        );
        Ok(InlineLimit { policy: rule.policy_now(), namespace: Namespace::new(name.as_bytes()) })
    }

    fn mode_and_fallback(&self, field: &str) -> Result<(Mode, Fallback), BodyError> {
        let sub = |name: &str| format!("{field}.{name}");
        let mode = match self.mode.as_deref() {
            None => MODE_DEFAULT,
            Some(name) => mode_from_name(name).ok_or_else(|| {
                invalid(sub("mode"), format!("unknown mode {name:?}: use exact or approximate"))
            })?,
        };
        let fallback = match self.fallback.as_deref() {
            None => FALLBACK_DEFAULT,
            Some(name) => fallback_from_name(name).ok_or_else(|| {
                invalid(
                    sub("fallback"),
                    format!("unknown fallback {name:?}: use local_share, fail_open or fail_closed"),
                )
            })?,
        };
        Ok((mode, fallback))
    }
}

/// The target of a check of `key`: as [`target`] names it, then the key's override or the
/// `tier` asked for (a tier needs a policy).
fn resolved_target(
    limit: Option<&LimitBody>,
    policy: Option<&str>,
    tier: Option<&str>,
    key: &str,
    table: &PolicyTable,
) -> Result<Target, BodyError> {
    match target(limit, policy, table)? {
        Target::Named(entry) => entry
            .resolve(key, tier)
            .map(Target::Named)
            .map_err(|error: UnknownTier| invalid("tier", error.to_string())),
        Target::Inline(_) if tier.is_some() => Err(invalid("tier", "tiers belong to configured policies")),
        inline => Ok(inline),
    }
}

/// The target named by exactly one of `limit` and `policy`.
fn target(limit: Option<&LimitBody>, policy: Option<&str>, table: &PolicyTable) -> Result<Target, BodyError> {
    match (limit, policy) {
        (Some(_), Some(_)) => Err(invalid("policy", "give either limit or policy, not both")),
        (None, None) => Err(invalid("limit", "missing: give limit or policy")),
        (Some(limit), None) => limit.validate("limit").map(Target::Inline),
        (None, Some(name)) => match table.get(name) {
            Some(entry) => Ok(Target::Named(Arc::clone(entry))),
            None => Err(BodyError::UnknownPolicy { field: "policy".to_owned(), name: name.to_owned() }),
        },
    }
}

/// The client's key, checked against the bounds.
fn key<'a>(key: Option<&'a str>, bounds: &Bounds) -> Result<&'a str, BodyError> {
    match key {
        None => Err(invalid("key", "missing")),
        Some("") => Err(invalid("key", "must not be empty")),
        Some(key) if key.len() > bounds.key_bytes_max => {
            Err(invalid("key", format!("{} bytes, at most {} are accepted", key.len(), bounds.key_bytes_max)))
        }
        Some(key) => Ok(key),
    }
}

impl CheckBody {
    /// Validates the check against the configured policies and bounds.
    pub fn validate(&self, table: &PolicyTable, bounds: &Bounds) -> Result<ValidCheck, BodyError> {
        let key = key(self.key.as_deref(), bounds)?;
        let target =
            resolved_target(self.limit.as_ref(), self.policy.as_deref(), self.tier.as_deref(), key, table)?;
        let (cost, refund) = match self.cost.unwrap_or(CostJson::Take(1)) {
            CostJson::Take(hits) => (hits, false),
            CostJson::Refund(hits) => (hits, true),
        };
        if refund && is_concurrency(&target) {
            return Err(invalid(
                "cost",
                "a negative cost (refund) does not apply to a concurrency limit: release the lease \
                 (POST /v1/release)",
            ));
        }
        let key_text = key.to_owned();
        let key = target.namespace().key(key.as_bytes());
        Ok(ValidCheck { target, key, key_text, cost, refund })
    }
}

/// Whether `target` is a concurrency limit (leases, not hits).
pub(crate) fn is_concurrency(target: &Target) -> bool {
    target.policy().is_some_and(|policy| policy.limit.algorithm() == Algorithm::Concurrency)
}

impl ChargeBody {
    /// Validates the charge: `cost` is required, the target counts hits.
    pub fn validate(&self, table: &PolicyTable, bounds: &Bounds) -> Result<ValidCharge, BodyError> {
        let key = key(self.key.as_deref(), bounds)?;
        let target =
            resolved_target(self.limit.as_ref(), self.policy.as_deref(), self.tier.as_deref(), key, table)?;
        let cost = self.cost.ok_or_else(|| invalid("cost", "missing: the hits to charge"))?;
        if is_concurrency(&target) {
            let field = if self.limit.is_some() { "limit.algorithm" } else { "policy" };
            return Err(invalid(field, "a charge does not apply to a concurrency limit (it counts leases)"));
        }
        let key = target.namespace().key(key.as_bytes());
        Ok(ValidCharge { target, key, cost })
    }
}

impl ReleaseBody {
    /// Validates the release: the target must be a concurrency limit.
    pub fn validate(&self, table: &PolicyTable, bounds: &Bounds) -> Result<ValidRelease, BodyError> {
        let key = key(self.key.as_deref(), bounds)?;
        let target = target(self.limit.as_ref(), self.policy.as_deref(), table)?;
        let field = if self.limit.is_some() { "limit.algorithm" } else { "policy" };
        let policy = match target.policy() {
            Some(policy) if policy.limit.algorithm() == Algorithm::Concurrency => policy,
            _ => return Err(invalid(field, "leases exist only under concurrency limits")),
        };
        let lease = LeaseId(self.lease.ok_or_else(|| invalid("lease", "missing"))?.0);
        let key = target.namespace().key(key.as_bytes());
        Ok(ValidRelease { policy, target, key, lease })
    }
}
