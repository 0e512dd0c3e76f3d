//! Files into policies: upstream's `loadConfig` and `loadDescriptors` checks, each descriptor a
//! [`PolicyConfig`] on its path.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use ratemesh_core::{Algorithm, Limit, LimitSpec, Policy};

use super::yaml::{self, Descriptor, RateLimit};
use super::{ConfigFile, EnvoyConfigError, Problem};
use crate::config::{
    DESCRIPTOR_DEPTH_MAX, DescriptorPattern, EnvoyPattern, FALLBACK_DEFAULT, MODE_DEFAULT, NAME_BYTES_MAX,
    POLICIES_MAX, PolicyConfig, Rule, ValuePattern, limit_error_message,
};

/// The units upstream knows, with their length in seconds (`MONTH` 30 days, `YEAR` 365, as it
/// counts them).
const UNITS: [(&str, u64); 6] = [
    ("SECOND", 1),
    ("MINUTE", 60),
    ("HOUR", 3600),
    ("DAY", 24 * 3600),
    ("MONTH", 30 * 24 * 3600),
    ("YEAR", 365 * 24 * 3600),
];

/// A loaded configuration: the policies, and the text `GET /rlconfig` prints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// One policy per descriptor with a `rate_limit` (and a policy-less path per leaf descriptor
    /// without one), in file order.
    pub policies: Vec<PolicyConfig>,
    /// One line per limit, as upstream's `Dump`: `<key>: unit=<UNIT> requests_per_unit=<n>,
    /// shadow_mode: <bool>, quota_mode: <bool>`.
    pub dump: String,
}

/// Loads `files` in order, as upstream's `NewRateLimitConfigImpl`: a domain in two files is an
/// error unless `merge_domains` (`MERGE_DOMAIN_CONFIG`), in which case their descriptors join
/// (a descriptor in both is still an error).
pub fn load(files: &[ConfigFile], merge_domains: bool) -> Result<Loaded, EnvoyConfigError> {
    let mut loader = Loader { merge_domains, ..Loader::default() };
    for file in files {
        loader.file(file).map_err(|problem| EnvoyConfigError { file: file.name.clone(), problem })?;
    }
    Ok(loader.loaded)
}

#[derive(Default)]
struct Loader {
    merge_domains: bool,
    /// Composite keys (`domain.key_value.key`) seen, by domain.
    domains: HashMap<String, HashSet<String>>,
    /// Policy names given.
    names: HashSet<String>,
    loaded: Loaded,
}

/// Where a descriptor sits: its domain, its path's patterns and its composite key.
struct At<'a> {
    domain: &'a str,
    path: Vec<DescriptorPattern>,
    key: String,
}

impl Loader {
    fn file(&mut self, file: &ConfigFile) -> Result<(), Problem> {
        let root = yaml::parse(&file.text)?;
        if root.domain.is_empty() {
            return Err(Problem::EmptyDomain);
        }
        if self.domains.contains_key(&root.domain) && !self.merge_domains {
            return Err(Problem::DuplicateDomain(root.domain));
        }
        self.domains.entry(root.domain.clone()).or_default();
        let at = At { domain: &root.domain, path: Vec::new(), key: root.domain.clone() };
        self.descriptors(&at, &root.descriptors)
    }

    fn descriptors(&mut self, parent: &At<'_>, descriptors: &[Descriptor]) -> Result<(), Problem> {
        for descriptor in descriptors {
            if descriptor.key.is_empty() {
                return Err(Problem::EmptyKey);
            }
            let final_key = match descriptor.value.as_str() {
                "" => descriptor.key.clone(),
                value => format!("{}_{value}", descriptor.key),
            };
            let key = format!("{}.{final_key}", parent.key);
            let seen = self.domains.entry(parent.domain.to_owned()).or_default();
            if !seen.insert(key.clone()) {
                return Err(Problem::DuplicateKey(key));
            }
            let mut path = parent.path.clone();
            path.push(DescriptorPattern {
                key: descriptor.key.clone(),
                value: value_pattern(&descriptor.value),
            });
            if path.len() > DESCRIPTOR_DEPTH_MAX {
                return Err(Problem::DescriptorTooDeep { key, depth: path.len(), max: DESCRIPTOR_DEPTH_MAX });
            }
            let at = At { domain: parent.domain, path, key };
            self.descriptor(&at, descriptor)?;
            self.descriptors(&at, &descriptor.descriptors)?;
        }
        Ok(())
    }

    /// Checks one descriptor and adds its policy.
    fn descriptor(&mut self, at: &At<'_>, descriptor: &Descriptor) -> Result<(), Problem> {
        let (rule, deny_all) = match &descriptor.rate_limit {
            Some(limit) => {
                let (rule, deny_all) = rule(&at.key, limit)?;
                (Some(rule), deny_all)
            }
            None => (None, None),
        };
        if descriptor.share_threshold && !at.key.contains('*') {
            let final_key = at.key.rsplit('.').next().unwrap_or_default();
            return Err(Problem::ShareThresholdWithoutWildcard(final_key.to_owned()));
        }
        // A descriptor without limit matters as a path only where no deeper one makes it.
        if rule.is_none() && !descriptor.descriptors.is_empty() {
            return Ok(());
        }
        if self.loaded.policies.len() >= POLICIES_MAX {
            return Err(Problem::TooManyDescriptors(POLICIES_MAX));
        }
        let limit = descriptor.rate_limit.as_ref();
        if let Some(limit) = limit {
            self.dump(&at.key, limit, descriptor);
        }
        let envoy = EnvoyPattern {
            domain: at.domain.to_owned(),
            descriptors: at.path.clone(),
            limit_name: limit.map(|l| l.name.clone()).filter(|name| !name.is_empty()),
            replaces: limit.map(|l| l.replaces.clone()).unwrap_or_default(),
            path_only: rule.is_none(),
            deny_all,
            quota_mode: descriptor.quota_mode,
        };
        let name = self.name(&at.key);
        self.loaded.policies.push(PolicyConfig {
            name,
            envoy: Some(envoy),
            rule: rule.unwrap_or(Rule::Unlimited),
            shadow_mode: descriptor.shadow_mode,
            overrides: Default::default(),
            tiers: Default::default(),
            home_region: None,
        });
        Ok(())
    }

    /// A policy name from a composite key: its characters that a name cannot hold become `_`,
    /// cut to the longest name, and a number added when taken.
    fn name(&mut self, key: &str) -> String {
        let plain: String = key
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') { c } else { '_' })
            .take(NAME_BYTES_MAX - 8)
            .collect();
        let mut name = plain.clone();
        let mut n = 1;
        while !self.names.insert(name.clone()) {
            n += 1;
            name = format!("{plain}-{n}");
        }
        name
    }

    fn dump(&mut self, key: &str, limit: &RateLimit, descriptor: &Descriptor) {
        let unit = match limit.unlimited {
            true => "UNKNOWN".to_owned(),
            false => limit.unit.to_uppercase(),
        };
        // Writing to a String cannot fail.
        let _ = writeln!(
            self.loaded.dump,
            "{key}: unit={unit} requests_per_unit={}, shadow_mode: {}, quota_mode: {}",
            limit.requests_per_unit, descriptor.shadow_mode, descriptor.quota_mode
        );
    }
}

/// A descriptor's value as a pattern: none, exact, or (with a `*`) a wildcard, tried in file
/// order as upstream does.
fn value_pattern(value: &str) -> ValuePattern {
    match value {
        "" => ValuePattern::Any,
        value if value.contains('*') => ValuePattern::Wildcard(value.split('*').map(str::to_owned).collect()),
        value => ValuePattern::Exact(value.to_owned()),
    }
}

/// A `rate_limit` checked as upstream checks it (unit, then `replaces`), as a rule; with
/// `requests_per_unit: 0`, the unit of a limit that every request is over (see
/// [`EnvoyPattern::deny_all`]).
fn rule(key: &str, limit: &RateLimit) -> Result<(Rule, Option<Duration>), Problem> {
    let unit = UNITS.iter().find(|(name, _)| limit.unit.eq_ignore_ascii_case(name));
    if limit.unlimited && unit.is_some() {
        return Err(Problem::UnlimitedWithUnit);
    }
    let unit = match (limit.unlimited, unit) {
        (true, _) => None,
        (false, Some(&(_, seconds))) => Some(seconds),
        (false, None) => return Err(Problem::InvalidUnit(limit.unit.clone())),
    };
    for replaced in &limit.replaces {
        if replaced.is_empty() {
            return Err(Problem::EmptyReplaces);
        }
        if *replaced == limit.name {
            return Err(Problem::ReplacesSelf);
        }
    }
    let Some(seconds) = unit else { return Ok((Rule::Unlimited, None)) };
    if limit.requests_per_unit == 0 {
        return Ok((Rule::Unlimited, Some(Duration::from_secs(seconds))));
    }
    let spec = LimitSpec::new(
        Algorithm::FixedWindow,
        u64::from(limit.requests_per_unit),
        Duration::from_secs(seconds),
    );
    let limit = Limit::new(spec)
        .map_err(|error| Problem::Limit { key: key.to_owned(), message: limit_error_message(&error) })?;
    let policy = Policy { fallback: FALLBACK_DEFAULT, ..Policy::new(limit, MODE_DEFAULT) };
    Ok((Rule::Limited(Arc::new(policy)), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> ConfigFile {
        ConfigFile { name: name.to_owned(), text: text.to_owned() }
    }

    #[test]
    fn a_descriptor_a_thousand_levels_deep_is_refused_with_a_clear_error() {
        let mut text = String::from("domain: d\ndescriptors:\n");
        for level in 0..1000 {
            let indent = "  ".repeat(level * 2);
            text.push_str(&format!("{indent}- key: k{level}\n{indent}  descriptors:\n"));
        }
        let error = load(&[file("deep.yaml", &text)], false).expect_err("too deep");
        assert_eq!(error.problem, Problem::TooDeep { max: yaml::YAML_DEPTH_MAX }, "{error}");
        // Within the YAML bound but beyond the policies' depth: named, with its depth.
        let mut text = String::from("domain: d\ndescriptors:\n");
        for level in 0..=DESCRIPTOR_DEPTH_MAX {
            let indent = "  ".repeat(level * 2);
            text.push_str(&format!("{indent}- key: k{level}\n{indent}  descriptors:\n"));
        }
        let error = load(&[file("deep.yaml", &text)], false).expect_err("too deep");
        assert!(matches!(error.problem, Problem::DescriptorTooDeep { depth: 17, .. }), "{error}");
    }

    #[test]
    fn a_zero_limit_denies_every_request_of_its_unit() {
        let text =
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: Second, requests_per_unit: 0}\n";
        let loaded = load(&[file("zero.yaml", text)], false).expect("valid");
        let envoy = loaded.policies[0].envoy.as_ref().expect("a path");
        assert_eq!(envoy.deny_all, Some(Duration::from_secs(1)));
        assert_eq!(loaded.policies[0].rule, Rule::Unlimited);
    }

    #[test]
    fn names_are_plain_and_unique() {
        let text = "domain: d\ndescriptors:\n  - key: k\n    value: 'a*'\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    value: 'a_'\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
        let loaded = load(&[file("names.yaml", text)], false).expect("valid");
        let names: Vec<&str> = loaded.policies.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["d.k_a_", "d.k_a_-2"]);
    }
}
