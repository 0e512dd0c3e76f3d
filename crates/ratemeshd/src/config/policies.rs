//! Validation of `[[policies]]`: names, Envoy descriptor paths, limits (plain, calendar or
//! unlimited), overrides and tiers; every refusal names `policies[i].field` and its line.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ratemesh::{Calendar, CalendarPolicy, CalendarUnit, Region};
use ratemesh_core::{Algorithm, Audit, Fallback, Limit, LimitSpec, Mode, Policy, PolicyRegion};
use toml::Spanned;

use super::defaults::{FALLBACK_DEFAULT, MODE_DEFAULT, TIME_ZONE_DEFAULT};
use super::error::{ConfigError, limit_error_field, limit_error_message};
use super::model::*;
use super::raw::{At, RawDescriptor, RawPolicy, RawVariant, Val};
use super::validate::{
    AUDIT_WINDOW_MS_MAX, AUDIT_WINDOW_MS_MIN, Ctx, DESCRIPTOR_DEPTH_MAX, NAME_BYTES_MAX, POLICIES_MAX,
    VARIANTS_MAX, is_plain_name,
};

impl Ctx<'_> {
    pub(super) fn policies(&self, raw: &[Spanned<RawPolicy>]) -> Result<Vec<PolicyConfig>, ConfigError> {
        if raw.len() > POLICIES_MAX {
            let at = At::File(raw[POLICIES_MAX].span());
            return Err(self.invalid("policies", &at, format!("more than {POLICIES_MAX} policies")));
        }
        let mut policies: Vec<PolicyConfig> = Vec::with_capacity(raw.len());
        for (i, spanned) in raw.iter().enumerate() {
            let policy = self.policy(i, spanned)?;
            if let Some(first) = policies.iter().find(|p| p.name == policy.name) {
                let at = spanned.get_ref().name.as_ref().map_or(At::File(spanned.span()), |v| v.at.clone());
                return Err(self.invalid(
                    format!("policies[{i}].name"),
                    &at,
                    format!("duplicate policy name {:?} (names must be unique)", first.name),
                ));
            }
            if let Some(envoy) = &policy.envoy
                && let Some(first) = policies.iter().find(|p| p.envoy.as_ref() == Some(envoy))
            {
                let descriptors = spanned.get_ref().descriptors.as_ref();
                let at = descriptors.map_or(At::File(spanned.span()), |v| v.at.clone());
                return Err(self.invalid(
                    format!("policies[{i}].descriptors"),
                    &at,
                    format!(
                        "policy {:?} has the same domain {:?} and descriptors (each path must be unique)",
                        first.name, envoy.domain
                    ),
                ));
            }
            policies.push(policy);
        }
        Ok(policies)
    }

    fn policy(&self, i: usize, spanned: &Spanned<RawPolicy>) -> Result<PolicyConfig, ConfigError> {
        let p = spanned.get_ref();
        let table = At::File(spanned.span());
        let field = |name: &str| format!("policies[{i}].{name}");
        let name = match &p.name {
            None => return Err(self.invalid(field("name"), &table, "missing")),
            Some(v) if !is_plain_name(&v.value) => {
                return Err(self.invalid(
                    field("name"),
                    &v.at,
                    format!("{:?}: use 1 to {NAME_BYTES_MAX} letters, digits, '_', '-' or '.'", v.value),
                ));
            }
            // Metrics and rate-limit headers label inline limits with this name: a policy of the
            // same name could not be told apart from them.
            Some(v) if v.value == INLINE_LABEL => {
                return Err(self.invalid(
                    field("name"),
                    &v.at,
                    format!("{INLINE_LABEL:?} is reserved for the limits given inline in requests"),
                ));
            }
            Some(v) => v.value.clone(),
        };
        let envoy = self.envoy_pattern(i, p)?;
        let (region, home_region) = self.region(i, p)?;
        let unlimited = p.unlimited.as_ref().is_some_and(|v| v.value);
        let rule = if unlimited {
            if envoy.is_none() {
                let at = p.unlimited.as_ref().map_or(&table, |v| &v.at);
                return Err(self.invalid(
                    field("unlimited"),
                    at,
                    "applies to Envoy descriptors only: set domain and descriptors",
                ));
            }
            let limit_fields = [
                ("algorithm", p.algorithm.as_ref().map(|v| &v.at)),
                ("limit", p.limit.as_ref().map(|v| &v.at)),
                ("period_ms", p.period_ms.as_ref().map(|v| &v.at)),
                ("burst", p.burst.as_ref().map(|v| &v.at)),
                ("delay", p.delay.as_ref().map(|v| &v.at)),
                ("mode", p.mode.as_ref().map(|v| &v.at)),
                ("fallback", p.fallback.as_ref().map(|v| &v.at)),
                ("window", p.window.as_ref().map(|v| &v.at)),
                ("time_zone", p.time_zone.as_ref().map(|v| &v.at)),
                ("audit", p.audit.as_ref().map(|v| &v.at)),
                ("audit_window_ms", p.audit_window_ms.as_ref().map(|v| &v.at)),
                ("home_region", p.home_region.as_ref().map(|v| &v.at)),
                ("region_fallback", p.region_fallback.as_ref().map(|v| &v.at)),
            ];
            if let Some((name, Some(at))) = limit_fields.into_iter().find(|(_, at)| at.is_some()) {
                return Err(self.invalid(field(name), at, "does not apply to an unlimited policy"));
            }
            Rule::Unlimited
        } else if p.window.is_some() {
            Rule::Calendar(Arc::new(self.calendar(i, p, &table, region)?))
        } else {
            Rule::Limited(Arc::new(self.limited(i, p, &table, region)?))
        };
        let shadow_mode = p.shadow_mode.as_ref().is_some_and(|v| v.value);
        let overrides = self.variants(i, "overrides", p.overrides.as_ref(), &rule)?;
        let tiers = self.variants(i, "tiers", p.tiers.as_ref(), &rule)?;
        Ok(PolicyConfig { name, envoy, rule, shadow_mode, overrides, tiers, home_region })
    }

    /// A policy's `overrides` (named by `key`) or `tiers` (named by `name`): each its own limit
    /// under the policy's algorithm, mode and fallback; `limit` and `period_ms` default to the
    /// policy's, `burst` to the policy's when `limit` is not given (else the algorithm's default).
    fn variants(
        &self,
        i: usize,
        list: &str,
        raw: Option<&Val<Vec<Spanned<RawVariant>>>>,
        rule: &Rule,
    ) -> Result<BTreeMap<String, Arc<Policy>>, ConfigError> {
        let mut variants = BTreeMap::new();
        let Some(raw) = raw else { return Ok(variants) };
        let field = format!("policies[{i}].{list}");
        let Rule::Limited(base) = rule else {
            return Err(self.invalid(
                field,
                &raw.at,
                "applies to a limited policy only (not calendar or unlimited)",
            ));
        };
        if raw.value.len() > VARIANTS_MAX {
            return Err(self.invalid(field, &raw.at, format!("more than {VARIANTS_MAX} entries")));
        }
        let name_field = if list == "overrides" { "key" } else { "name" };
        for (j, spanned) in raw.value.iter().enumerate() {
            let v = spanned.get_ref();
            let at = At::File(spanned.span());
            let sub = |name: &str| format!("{field}[{j}].{name}");
            let (named, other) = if list == "overrides" { (&v.key, &v.name) } else { (&v.name, &v.key) };
            if let Some(other) = other {
                let other_name = if list == "overrides" { "name" } else { "key" };
                return Err(self.invalid(
                    sub(other_name),
                    &other.at,
                    format!("{list} are named by {name_field}"),
                ));
            }
            let name = match named {
                None => return Err(self.invalid(sub(name_field), &at, "missing")),
                Some(n) if n.value.is_empty() || n.value.len() > NAME_BYTES_MAX => {
                    return Err(self.invalid(
                        sub(name_field),
                        &n.at,
                        format!("must be 1 to {NAME_BYTES_MAX} bytes"),
                    ));
                }
                Some(n) if variants.contains_key(&n.value) => {
                    return Err(self.invalid(
                        sub(name_field),
                        &n.at,
                        format!("duplicate {name_field} {:?}", n.value),
                    ));
                }
                Some(n) => n.value.clone(),
            };
            let spec = base.limit.spec();
            let limit = v.limit.as_ref().map_or(spec.limit, |l| l.value);
            let burst = match (&v.burst, &v.limit) {
                (Some(b), _) => Some(b.value),
                (None, Some(_)) => None,
                (None, None) => spec.burst,
            };
            let period = v.period_ms.as_ref().map_or(spec.period, |p| Duration::from_millis(p.value));
            let variant = LimitSpec { limit, burst, period, ..spec.clone() };
            let limit = Limit::new(variant).map_err(|error| {
                let name = limit_error_field(&error);
                let v_at = match name {
                    "period_ms" => v.period_ms.as_ref(),
                    "burst" => v.burst.as_ref(),
                    _ => v.limit.as_ref(),
                };
                self.invalid(sub(name), v_at.map_or(&at, |v| &v.at), limit_error_message(&error))
            })?;
            variants.insert(name, Arc::new(Policy { limit, ..Policy::clone(base) }));
        }
        Ok(variants)
    }

    fn limited(
        &self,
        i: usize,
        p: &RawPolicy,
        table: &At,
        region: PolicyRegion,
    ) -> Result<Policy, ConfigError> {
        let field = |name: &str| format!("policies[{i}].{name}");
        let missing =
            |name: &str| self.invalid(field(name), table, "missing (required unless unlimited = true)");
        let algorithm_v = p.algorithm.as_ref().ok_or_else(|| missing("algorithm"))?;
        let algorithm = Algorithm::from_name(&algorithm_v.value).ok_or_else(|| {
            self.invalid(
                field("algorithm"),
                &algorithm_v.at,
                format!("unknown algorithm {:?}: use one of {}", algorithm_v.value, algorithm_names()),
            )
        })?;
        let limit = p.limit.as_ref().ok_or_else(|| missing("limit"))?;
        let period_ms = p.period_ms.as_ref().ok_or_else(|| missing("period_ms"))?;
        let spec = LimitSpec {
            algorithm,
            limit: limit.value,
            period: Duration::from_millis(period_ms.value),
            burst: p.burst.as_ref().map(|v| v.value),
            delay: p.delay.as_ref().map(|v| v.value),
            calendar: None,
        };
        if let Some(v) = &p.time_zone {
            return Err(self.invalid(
                field("time_zone"),
                &v.at,
                "applies only with window (a calendar window)",
            ));
        }
        let limit = Limit::new(spec).map_err(|error| {
            let name = limit_error_field(&error);
            let v = match name {
                "period_ms" => Some(period_ms),
                "burst" => p.burst.as_ref(),
                "delay" => p.delay.as_ref(),
                _ => Some(limit),
            };
            self.invalid(field(name), v.map_or(table, |v| &v.at), limit_error_message(&error))
        })?;
        let (mode, fallback) = self.mode_and_fallback(i, p)?;
        let audit = self.audit(i, p, algorithm)?;
        Ok(Policy { limit, mode, fallback, audit, region })
    }

    /// A calendar-aligned fixed window: `window` (and `time_zone`, default UTC) instead of
    /// `period_ms`; `algorithm`, if given, is `fixed_window`.
    fn calendar(
        &self,
        i: usize,
        p: &RawPolicy,
        table: &At,
        region: PolicyRegion,
    ) -> Result<CalendarPolicy, ConfigError> {
        let field = |name: &str| format!("policies[{i}].{name}");
        let window = p.window.as_ref().ok_or_else(|| self.invalid(field("window"), table, "missing"))?;
        let unit = CalendarUnit::from_name(&window.value).ok_or_else(|| {
            let units: Vec<&str> = CalendarUnit::ALL.iter().map(|u| u.name()).collect();
            self.invalid(
                field("window"),
                &window.at,
                format!("unknown window {:?}: use one of {}", window.value, units.join(", ")),
            )
        })?;
        if let Some(v) = p.algorithm.as_ref().filter(|v| v.value != Algorithm::FixedWindow.name()) {
            return Err(self.invalid(
                field("algorithm"),
                &v.at,
                "a calendar window (window) is a fixed_window",
            ));
        }
        let not_with_window = [
            ("period_ms", p.period_ms.as_ref().map(|v| &v.at)),
            ("burst", p.burst.as_ref().map(|v| &v.at)),
            ("delay", p.delay.as_ref().map(|v| &v.at)),
        ];
        if let Some((name, Some(at))) = not_with_window.into_iter().find(|(_, at)| at.is_some()) {
            return Err(self.invalid(
                field(name),
                at,
                "does not apply with window (the window is the period)",
            ));
        }
        let limit = p.limit.as_ref().ok_or_else(|| self.invalid(field("limit"), table, "missing"))?;
        let zone = p.time_zone.as_ref().map_or(TIME_ZONE_DEFAULT, |v| v.value.as_str());
        let zone_at = p.time_zone.as_ref().map_or(&window.at, |v| &v.at);
        let calendar =
            Calendar::new(unit, zone).map_err(|error| self.invalid(field("time_zone"), zone_at, error))?;
        let (mode, fallback) = self.mode_and_fallback(i, p)?;
        let audit = self.audit(i, p, Algorithm::FixedWindow)?;
        CalendarPolicy::new(calendar, limit.value, (mode, fallback, audit, region))
            .map_err(|error| self.invalid(field("limit"), &limit.at, error))
    }

    /// `audit` (default true) and `audit_window_ms` (default: the core's, the period for the
    /// window algorithms, 1 s for the bucket ones): the audit of the policy named `p.name`, in
    /// the group [`ratemesh::NamedPolicy::audit_group`] of its name, so that its tiers and
    /// overrides (copies of it) are audited under the policy. A concurrency limit is never
    /// audited (leases, not rates): a window for one is refused.
    fn audit(&self, i: usize, p: &RawPolicy, algorithm: Algorithm) -> Result<Audit, ConfigError> {
        let field = |name: &str| format!("policies[{i}].{name}");
        let on = p.audit.as_ref().is_none_or(|v| v.value);
        let window = match &p.audit_window_ms {
            None => None,
            Some(v) if !on => {
                return Err(self.invalid(
                    field("audit_window_ms"),
                    &v.at,
                    "does not apply with audit = false",
                ));
            }
            Some(v) if algorithm == Algorithm::Concurrency => {
                return Err(self.invalid(
                    field("audit_window_ms"),
                    &v.at,
                    "a concurrency limit is not audited (leases, not a rate)",
                ));
            }
            Some(v) if !(AUDIT_WINDOW_MS_MIN..=AUDIT_WINDOW_MS_MAX).contains(&v.value) => {
                return Err(self.invalid(
                    field("audit_window_ms"),
                    &v.at,
                    format!(
                        "{}: use {AUDIT_WINDOW_MS_MIN} to {AUDIT_WINDOW_MS_MAX} (10 ms to a day)",
                        v.value
                    ),
                ));
            }
            Some(v) => Some(Duration::from_millis(v.value)),
        };
        if !on || algorithm == Algorithm::Concurrency {
            return Ok(Audit::Off);
        }
        let name = p.name.as_ref().map_or("", |v| v.value.as_str());
        Ok(Audit::On { group: ratemesh::NamedPolicy::audit_group(name), window })
    }

    /// `home_region` (a region's name, as in `node.region`; default: a hash of each key over
    /// the regions) and `region_fallback` (`last`, `floor` or `closed`; default: the node's
    /// `node.region_fallback`): the policy's terms between regions, and its home's name.
    fn region(&self, i: usize, p: &RawPolicy) -> Result<(PolicyRegion, Option<Region>), ConfigError> {
        let field = |name: &str| format!("policies[{i}].{name}");
        let home = match &p.home_region {
            None => None,
            Some(v) => match Region::new(&v.value) {
                Ok(region) if !region.is_none() => Some(region),
                Ok(_) => {
                    return Err(self.invalid(field("home_region"), &v.at, "empty: leave it out for none"));
                }
                Err(error) => {
                    return Err(self.invalid(field("home_region"), &v.at, format!("{:?}: {error}", v.value)));
                }
            },
        };
        let fallback = match &p.region_fallback {
            None => None,
            Some(v) => Some(
                region_fallback_named(&v.value)
                    .map_err(|message| self.invalid(field("region_fallback"), &v.at, message))?,
            ),
        };
        Ok((PolicyRegion { home: home.map(|region| region.id()), fallback }, home))
    }

    fn mode_and_fallback(&self, i: usize, p: &RawPolicy) -> Result<(Mode, Fallback), ConfigError> {
        let field = |name: &str| format!("policies[{i}].{name}");
        let mode = match &p.mode {
            None => MODE_DEFAULT,
            Some(v) => mode_from_name(&v.value).ok_or_else(|| {
                self.invalid(
                    field("mode"),
                    &v.at,
                    format!("unknown mode {:?}: use exact or approximate", v.value),
                )
            })?,
        };
        let fallback = match &p.fallback {
            None => FALLBACK_DEFAULT,
            Some(v) => fallback_from_name(&v.value).ok_or_else(|| {
                self.invalid(
                    field("fallback"),
                    &v.at,
                    format!("unknown fallback {:?}: use local_share, fail_open or fail_closed", v.value),
                )
            })?,
        };
        Ok((mode, fallback))
    }

    fn envoy_pattern(&self, i: usize, p: &RawPolicy) -> Result<Option<EnvoyPattern>, ConfigError> {
        let field = |name: &str| format!("policies[{i}].{name}");
        let (domain, descriptors) = match (&p.domain, &p.descriptors) {
            (None, None) => return Ok(None),
            (None, Some(v)) => {
                return Err(self.invalid(field("domain"), &v.at, "missing: descriptors need a domain"));
            }
            (Some(v), None) => {
                return Err(self.invalid(field("descriptors"), &v.at, "missing: a domain needs descriptors"));
            }
            (Some(domain), Some(descriptors)) => (domain, descriptors),
        };
        if domain.value.is_empty() || domain.value.len() > NAME_BYTES_MAX {
            return Err(self.invalid(
                field("domain"),
                &domain.at,
                format!("must be 1 to {NAME_BYTES_MAX} bytes"),
            ));
        }
        let entries = &descriptors.value;
        if entries.is_empty() || entries.len() > DESCRIPTOR_DEPTH_MAX {
            return Err(self.invalid(
                field("descriptors"),
                &descriptors.at,
                format!("must hold 1 to {DESCRIPTOR_DEPTH_MAX} entries"),
            ));
        }
        let descriptors = entries
            .iter()
            .enumerate()
            .map(|(j, entry)| self.descriptor(&field(&format!("descriptors[{j}]")), entry))
            .collect::<Result<Vec<_>, _>>()?;
        let domain = domain.value.clone();
        Ok(Some(EnvoyPattern {
            domain,
            descriptors,
            limit_name: None,
            replaces: Vec::new(),
            path_only: false,
            deny_all: None,
            quota_mode: false,
        }))
    }

    fn descriptor(
        &self,
        field: &str,
        entry: &Spanned<RawDescriptor>,
    ) -> Result<DescriptorPattern, ConfigError> {
        let e = entry.get_ref();
        let key = match &e.key {
            None => return Err(self.invalid(format!("{field}.key"), &At::File(entry.span()), "missing")),
            Some(v) if v.value.is_empty() || v.value.len() > NAME_BYTES_MAX => {
                return Err(self.invalid(
                    format!("{field}.key"),
                    &v.at,
                    format!("must be 1 to {NAME_BYTES_MAX} bytes"),
                ));
            }
            Some(v) => v.value.clone(),
        };
        let value = match &e.value {
            None => ValuePattern::Any,
            // An empty value would match nothing in Envoy's format (it means "no value"): say so
            // rather than silently treat it as a wildcard.
            Some(v) if v.value.is_empty() || v.value.len() > NAME_BYTES_MAX => {
                return Err(self.invalid(
                    format!("{field}.value"),
                    &v.at,
                    format!("must be 1 to {NAME_BYTES_MAX} bytes; leave value out to match any value"),
                ));
            }
            Some(v) => match v.value.strip_suffix('*') {
                Some(prefix) => ValuePattern::Prefix(prefix.to_owned()),
                None => ValuePattern::Exact(v.value.clone()),
            },
        };
        Ok(DescriptorPattern { key, value })
    }
}
