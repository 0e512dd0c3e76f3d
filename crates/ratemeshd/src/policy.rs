//! Policies at run time: the [`PolicyTable`] of a validated [`Config`], by name and by Envoy
//! descriptor ([`PolicyTable::match_descriptor`]). Immutable: a reload builds a new table and
//! swaps it in. What a check counts against and what it answers is `crate::check`; the HTTP
//! API's JSON bodies are `crate::http::body`.
//!
//! # Buckets
//!
//! Every bucket is a [`KeyHash`] of a [`Namespace`] and a key. A named policy's namespace is its
//! name (so a reload that changes a policy's limit keeps its buckets); an inline limit's is its
//! canonical text (`inline:token_bucket:100/1000ms:…`), so clients that send the same inline limit
//! share buckets and different limits never do. Policy names cannot contain `:`, so the two never
//! collide. Within a namespace, the key of an Envoy match starts with the byte `0xFF`, which no
//! UTF-8 key can: the keys of `/v1/check` and of Envoy descriptors never collide either.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ratemesh::Region;
use ratemesh_core::{KeyHash, Namespace, Policy};

use crate::config::{Config, EnvoyPattern, PolicyConfig, Rule, ValuePattern};

#[cfg(test)]
pub(crate) mod tests;

/// The first byte of every Envoy bucket key: never the first byte of a UTF-8 string.
const ENVOY_KEY_TAG: u8 = 0xFF;

/// A configured policy, ready to be checked against.
#[derive(Debug)]
pub struct PolicyEntry {
    /// The policy's name.
    pub name: String,
    /// Its limit, or unlimited.
    pub rule: Rule,
    /// Whether refusals are only reported, never enforced.
    pub shadow_mode: bool,
    /// The Envoy descriptor path it answers, if any.
    pub envoy: Option<EnvoyPattern>,
    /// The namespace of its buckets (from its name).
    pub namespace: Namespace,
    /// Per-key overrides, by key: each its own entry (same name, its own limit and buckets).
    pub overrides: BTreeMap<String, Arc<PolicyEntry>>,
    /// Named tiers, by name: each its own entry (same name, its own limit and buckets).
    pub tiers: BTreeMap<String, Arc<PolicyEntry>>,
    /// The name of its home region, if it pins one (`home_region`).
    pub home_region: Option<Region>,
}

impl PolicyEntry {
    /// The entry of `policy`, a variant (override or tier, `kind`) of this limited entry: the
    /// same name (metrics labels never carry keys), buckets in a namespace of the variant's
    /// limit (a key moved to another limit starts afresh there; two variants of equal limits
    /// share buckets).
    pub fn variant(&self, kind: &str, policy: Arc<Policy>) -> PolicyEntry {
        let namespace = ratemesh::overrides::variant_namespace_name(&self.name, kind, &policy);
        PolicyEntry {
            name: self.name.clone(),
            rule: Rule::Limited(policy),
            shadow_mode: self.shadow_mode,
            envoy: None,
            namespace: Namespace::new(namespace.as_bytes()),
            overrides: BTreeMap::new(),
            tiers: BTreeMap::new(),
            home_region: self.home_region,
        }
    }

    /// The entry a check of `key` (asking for `tier`, if any) runs under: the key's override,
    /// else the tier, else this one.
    pub fn resolve(self: &Arc<Self>, key: &str, tier: Option<&str>) -> Result<Arc<PolicyEntry>, UnknownTier> {
        if let Some(entry) = self.overrides.get(key) {
            return Ok(Arc::clone(entry));
        }
        match tier {
            None => Ok(Arc::clone(self)),
            Some(tier) => self.tiers.get(tier).cloned().ok_or_else(|| UnknownTier {
                policy: self.name.clone(),
                tier: tier.to_owned(),
                known: self.tiers.keys().cloned().collect(),
            }),
        }
    }
}

/// A check asked for a tier its policy does not have. The client is at fault; nothing was
/// counted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("policy {policy:?} has no tier {tier:?} (tiers: {known:?})")]
pub struct UnknownTier {
    /// The policy.
    pub policy: String,
    /// The tier asked for.
    pub tier: String,
    /// The policy's tiers.
    pub known: Vec<String>,
}

/// The policies of one configuration, by name and by Envoy descriptor path.
#[derive(Debug, Default)]
pub struct PolicyTable {
    entries: Vec<Arc<PolicyEntry>>,
    by_name: HashMap<String, usize>,
    /// Entries by audit group ([`ratemesh::NamedPolicy::audit_group`] of their name).
    by_audit_group: HashMap<u64, usize>,
    domains: HashMap<String, Level>,
}

/// One level of a domain's descriptor tree: the patterns a request's next entry is tried against.
#[derive(Debug, Default)]
struct Level {
    /// `key` → `value` → node, for exact values.
    exact: HashMap<String, HashMap<String, Node>>,
    /// Wildcards: prefixes longest first (ties in file order), then envoyproxy/ratelimit's
    /// wildcards in file order.
    wildcards: Vec<WildcardNode>,
    /// `key` → node, for patterns without value.
    any: HashMap<String, Node>,
}

#[derive(Debug)]
struct WildcardNode {
    key: String,
    pattern: ValuePattern,
    node: Node,
}

#[derive(Debug, Default)]
struct Node {
    /// The policy whose path ends here (index into `entries`).
    policy: Option<usize>,
    next: Level,
}

impl Level {
    fn child(&mut self, key: &str, value: &ValuePattern) -> &mut Node {
        match value {
            ValuePattern::Exact(value) => {
                self.exact.entry(key.to_owned()).or_default().entry(value.clone()).or_default()
            }
            ValuePattern::Any => self.any.entry(key.to_owned()).or_default(),
            ValuePattern::Prefix(_) | ValuePattern::Wildcard(_) => self.wildcard_child(key, value),
        }
    }

    fn wildcard_child(&mut self, key: &str, pattern: &ValuePattern) -> &mut Node {
        let found = self.wildcards.iter().position(|w| w.key == key && w.pattern == *pattern);
        let index = found.unwrap_or_else(|| {
            let index = match pattern {
                // Keep longest-first order: insert before the first shorter prefix or wildcard.
                ValuePattern::Prefix(prefix) => self
                    .wildcards
                    .iter()
                    .position(|w| !matches!(&w.pattern, ValuePattern::Prefix(p) if p.len() >= prefix.len()))
                    .unwrap_or(self.wildcards.len()),
                _ => self.wildcards.len(),
            };
            let node = WildcardNode { key: key.to_owned(), pattern: pattern.clone(), node: Node::default() };
            self.wildcards.insert(index, node);
            index
        });
        &mut self.wildcards[index].node
    }

    /// The node for one request entry: an exact value first, then the first matching wildcard,
    /// then a pattern without value. This is envoyproxy/ratelimit's order; among the prefixes of
    /// the TOML file the longest is tried first (envoyproxy/ratelimit, and its YAML files here,
    /// take the first listed), so that the order of the file does not matter.
    fn step(&self, key: &str, value: &str) -> Option<&Node> {
        self.exact
            .get(key)
            .and_then(|values| values.get(value))
            .or_else(|| {
                self.wildcards.iter().find(|w| w.key == key && w.pattern.matches(value)).map(|w| &w.node)
            })
            .or_else(|| self.any.get(key))
    }
}

/// A policy matched by an Envoy descriptor, and the bucket the descriptor counts against.
#[derive(Clone, Debug)]
pub struct Match {
    /// The policy.
    pub entry: Arc<PolicyEntry>,
    /// The bucket's key within the policy's namespace: the domain and every entry's key and value
    /// of the request, length-prefixed (so that each distinct value of a wildcard entry is its
    /// own bucket, and no two descriptors share a key by concatenation).
    pub bucket_key: Vec<u8>,
}

impl Match {
    /// The bucket's identity.
    pub fn key_hash(&self) -> KeyHash {
        self.entry.namespace.key(&self.bucket_key)
    }
}

impl PolicyTable {
    /// The table of `config`'s policies.
    pub fn from_config(config: &Config) -> PolicyTable {
        PolicyTable::new(&config.policies)
    }

    /// The table of `policies`. They are expected validated (as in a [`Config`]): of two
    /// policies with the same name or the same Envoy path, the first is the one found.
    pub fn new(policies: &[PolicyConfig]) -> PolicyTable {
        let mut table = PolicyTable::default();
        for policy in policies {
            if table.by_name.contains_key(&policy.name) {
                continue;
            }
            let index = table.entries.len();
            if let Some(envoy) = policy.envoy.as_ref().filter(|envoy| envoy.path_only) {
                table.insert_path(envoy);
                continue;
            }
            if let Some(envoy) = &policy.envoy {
                let mut level = table.domains.entry(envoy.domain.clone()).or_default();
                let mut node = None;
                for pattern in &envoy.descriptors {
                    let child = level.child(&pattern.key, &pattern.value);
                    level = &mut child.next;
                    node = Some(&mut child.policy);
                }
                if let Some(slot) = node {
                    slot.get_or_insert(index);
                }
            }
            table.by_name.insert(policy.name.clone(), index);
            table.by_audit_group.insert(ratemesh::NamedPolicy::audit_group(&policy.name), index);
            let mut entry = PolicyEntry {
                name: policy.name.clone(),
                rule: policy.rule.clone(),
                shadow_mode: policy.shadow_mode,
                envoy: policy.envoy.clone(),
                namespace: Namespace::new(policy.name.as_bytes()),
                overrides: BTreeMap::new(),
                tiers: BTreeMap::new(),
                home_region: policy.home_region,
            };
            let variants = |kind: &str, list: &BTreeMap<String, Arc<Policy>>| {
                let of = |(name, p): (&String, &Arc<Policy>)| {
                    (name.clone(), Arc::new(entry.variant(kind, Arc::clone(p))))
                };
                list.iter().map(of).collect::<BTreeMap<_, _>>()
            };
            let (overrides, tiers) =
                (variants("override", &policy.overrides), variants("tier", &policy.tiers));
            entry.overrides = overrides;
            entry.tiers = tiers;
            table.entries.push(Arc::new(entry));
        }
        table
    }

    /// Inserts the nodes of a path that holds no policy (see [`EnvoyPattern::path_only`]).
    fn insert_path(&mut self, envoy: &EnvoyPattern) {
        let mut level = self.domains.entry(envoy.domain.clone()).or_default();
        for pattern in &envoy.descriptors {
            level = &mut level.child(&pattern.key, &pattern.value).next;
        }
    }

    /// The policy whose audit group ([`ratemesh_core::Audit::On`]'s `group`: the
    /// [`ratemesh::NamedPolicy::audit_group`] of its name) is `group`.
    pub fn by_audit_group(&self, group: u64) -> Option<&Arc<PolicyEntry>> {
        self.by_audit_group.get(&group).map(|&index| &self.entries[index])
    }

    /// The policy named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<PolicyEntry>> {
        self.by_name.get(name).map(|&index| &self.entries[index])
    }

    /// Every policy, in file order (for `GET /v1/policies` and metrics).
    pub fn iter(&self) -> impl Iterator<Item = &Arc<PolicyEntry>> {
        self.entries.iter()
    }

    /// How many policies there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether any policy has this Envoy domain.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The policy an Envoy request descriptor (`domain` and its `(key, value)` entries) falls
    /// under, with envoyproxy/ratelimit's semantics: the entries are matched level by level, each
    /// against an exact value first, then a prefix wildcard (`value = "v*"`, the longest prefix
    /// first), then a pattern without value (any value); the first candidate found at a level is
    /// taken, without backtracking; the match counts only if the policy's path has exactly as many
    /// entries as the request. `None` when nothing matches (Envoy then expects OK).
    pub fn match_descriptor<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: &[(K, V)],
    ) -> Option<Match> {
        let mut level = self.domains.get(domain)?;
        let mut node = None;
        for (key, value) in entries {
            let next = level.step(key.as_ref(), value.as_ref())?;
            level = &next.next;
            node = Some(next);
        }
        let entry = Arc::clone(&self.entries[node?.policy?]);
        Some(Match { entry, bucket_key: envoy_bucket_key(domain, entries) })
    }
}

/// The bucket key of an Envoy descriptor within a namespace (see [`Match::bucket_key`]).
pub fn envoy_bucket_key<K: AsRef<str>, V: AsRef<str>>(domain: &str, entries: &[(K, V)]) -> Vec<u8> {
    let mut bucket_key = vec![ENVOY_KEY_TAG];
    push_field(&mut bucket_key, domain);
    for (key, value) in entries {
        push_field(&mut bucket_key, key.as_ref());
        push_field(&mut bucket_key, value.as_ref());
    }
    bucket_key
}

fn push_field(out: &mut Vec<u8>, field: &str) {
    // Descriptor fields come from a bounded gRPC message; saturating keeps the encoding total
    // (a 4 GiB field cannot exist in one).
    let len = u32::try_from(field.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(field.as_bytes());
}
