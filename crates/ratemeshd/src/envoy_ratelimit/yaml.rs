//! One envoyproxy/ratelimit YAML file, read as upstream reads it: its size and nesting bounded
//! first (from the parser's events, before a tree is built), then its keys checked as upstream's
//! `validateYamlKeys` does, then the typed `domain`/`descriptors` tree.

use std::collections::HashMap;

use saphyr::{LoadableYamlNode as _, Scalar, Yaml};
use saphyr_parser::{Event, Parser};

use super::Problem;

/// The deepest nesting of mappings and sequences in a file. A descriptor level is two (its
/// mapping in a `descriptors` list), so this leaves room for [`crate::config::DESCRIPTOR_DEPTH_MAX`]
/// levels with their `rate_limit` and `replaces`; anything deeper is refused before a tree is
/// built (the tree is recursive).
pub const YAML_DEPTH_MAX: usize = 64;

/// The most nodes a file may hold, aliases expanded (an alias repeats its anchor's nodes: a few
/// lines of anchors can otherwise stand for billions of nodes).
pub const YAML_NODES_MAX: u64 = 1_000_000;

/// The keys upstream accepts (`validKeys` in its `config_impl.go`).
const VALID_KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// A file's root: `domain` and its `descriptors`.
#[derive(Debug, Default)]
pub(super) struct Root {
    pub(super) domain: String,
    pub(super) descriptors: Vec<Descriptor>,
}

/// One `descriptors` entry.
#[derive(Debug, Default)]
pub(super) struct Descriptor {
    pub(super) key: String,
    pub(super) value: String,
    pub(super) rate_limit: Option<RateLimit>,
    pub(super) descriptors: Vec<Descriptor>,
    pub(super) shadow_mode: bool,
    pub(super) quota_mode: bool,
    pub(super) share_threshold: bool,
}

/// A `rate_limit`.
#[derive(Debug, Default)]
pub(super) struct RateLimit {
    pub(super) requests_per_unit: u32,
    pub(super) unit: String,
    pub(super) unlimited: bool,
    pub(super) name: String,
    pub(super) replaces: Vec<String>,
}

/// Parses `text` into its root (upstream's `ConfigFileContentToYaml`).
pub(super) fn parse(text: &str) -> Result<Root, Problem> {
    check_shape(text)?;
    let documents = Yaml::load_from_str(text).map_err(|error| Problem::Yaml(error.to_string()))?;
    // Upstream reads the first document; an empty file is an empty root.
    let Some(root) = documents.first().filter(|root| !root.is_null()) else {
        return Ok(Root::default());
    };
    let Yaml::Mapping(map) = root else {
        return Err(Problem::Yaml(format!("cannot unmarshal {} into a map", shown(root))));
    };
    validate_keys(map)?;
    Ok(Root { domain: string(map, "domain")?, descriptors: descriptors(map)? })
}

/// Refuses a file nested deeper than [`YAML_DEPTH_MAX`] or of more than [`YAML_NODES_MAX`]
/// nodes, aliases expanded, from the parser's events alone.
fn check_shape(text: &str) -> Result<(), Problem> {
    let mut depth = 0usize;
    let mut nodes = 0u64;
    // Anchor id -> (nodes, nesting) of its node; open collections: (anchor, nodes at start, depth at start).
    let mut anchors: HashMap<usize, (u64, usize)> = HashMap::new();
    let mut open: Vec<(usize, u64, usize)> = Vec::new();
    let mut deepest_in: Vec<usize> = Vec::new();
    for event in Parser::new_from_str(text) {
        let (event, _) = event.map_err(|error| Problem::Yaml(error.to_string()))?;
        match event {
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                nodes += 1;
                depth += 1;
                if depth > YAML_DEPTH_MAX {
                    return Err(Problem::TooDeep { max: YAML_DEPTH_MAX });
                }
                open.push((anchor, nodes, depth));
                deepest_in.push(depth);
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (anchor, start, at) = open.pop().unwrap_or_default();
                let deepest = deepest_in.pop().unwrap_or(at);
                if let Some(parent) = deepest_in.last_mut() {
                    *parent = (*parent).max(deepest);
                }
                if anchor != 0 {
                    anchors.insert(anchor, (nodes - start + 1, deepest - at + 1));
                }
                depth = depth.saturating_sub(1);
            }
            Event::Scalar(_, _, anchor, _) => {
                nodes += 1;
                if anchor != 0 {
                    anchors.insert(anchor, (1, 0));
                }
            }
            Event::Alias(anchor) => {
                let (count, nesting) = anchors.get(&anchor).copied().unwrap_or((1, 0));
                nodes = nodes.saturating_add(count);
                if depth + nesting > YAML_DEPTH_MAX {
                    return Err(Problem::TooDeep { max: YAML_DEPTH_MAX });
                }
                if let Some(parent) = deepest_in.last_mut() {
                    *parent = (*parent).max(depth + nesting);
                }
            }
            _ => {}
        }
        if nodes > YAML_NODES_MAX {
            return Err(Problem::TooManyNodes { max: YAML_NODES_MAX });
        }
    }
    Ok(())
}

/// Upstream's `validateYamlKeys`: every key a string among [`VALID_KEYS`], every list of maps,
/// every leaf a string, integer, boolean or null (`metadata` is not looked into).
fn validate_keys(map: &saphyr::Mapping<'_>) -> Result<(), Problem> {
    for (key, value) in map {
        let Some(key) = key.as_str() else {
            return Err(Problem::NonStringKey(shown(key)));
        };
        if !VALID_KEYS.contains(&key) {
            return Err(Problem::UnknownKey(key.to_owned()));
        }
        if key == "metadata" {
            continue;
        }
        match value {
            Yaml::Sequence(items) => {
                for item in items {
                    let Yaml::Mapping(item) = item else { return Err(Problem::NonMapList(shown(item))) };
                    validate_keys(item)?;
                }
            }
            Yaml::Mapping(inner) => validate_keys(inner)?,
            Yaml::Value(Scalar::String(_) | Scalar::Integer(_) | Scalar::Boolean(_) | Scalar::Null) => {}
            // An integer too large for 64 bits reads as a float: say which field.
            other if key == "requests_per_unit" => return Err(Problem::RequestsPerUnit(shown(other))),
            other => return Err(Problem::BadValue { key: key.to_owned(), value: shown(other) }),
        }
    }
    Ok(())
}

/// A scalar as upstream prints it in an error (`%v`).
fn shown(node: &Yaml<'_>) -> String {
    match node {
        Yaml::Value(Scalar::String(text)) => text.to_string(),
        Yaml::Value(Scalar::Integer(n)) => n.to_string(),
        Yaml::Value(Scalar::FloatingPoint(f)) => f.to_string(),
        Yaml::Value(Scalar::Boolean(b)) => b.to_string(),
        Yaml::Value(Scalar::Null) => "<nil>".to_owned(),
        Yaml::Sequence(_) => "!!seq".to_owned(),
        Yaml::Mapping(_) => "!!map".to_owned(),
        _ => "a node".to_owned(),
    }
}

fn get<'a, 'b>(map: &'a saphyr::Mapping<'b>, key: &str) -> Option<&'a Yaml<'b>> {
    map.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v).filter(|v| !v.is_null())
}

/// A string field; an integer is read as its digits (as upstream's YAML decoder does).
fn string(map: &saphyr::Mapping<'_>, key: &str) -> Result<String, Problem> {
    match get(map, key) {
        None => Ok(String::new()),
        Some(Yaml::Value(Scalar::String(text))) => Ok(text.to_string()),
        Some(Yaml::Value(Scalar::Integer(n))) => Ok(n.to_string()),
        Some(other) => Err(unmarshal(key, other, "string")),
    }
}

fn boolean(map: &saphyr::Mapping<'_>, key: &str) -> Result<bool, Problem> {
    match get(map, key) {
        None => Ok(false),
        Some(Yaml::Value(Scalar::Boolean(b))) => Ok(*b),
        Some(other) => Err(unmarshal(key, other, "bool")),
    }
}

fn unmarshal(key: &str, value: &Yaml<'_>, expected: &str) -> Problem {
    Problem::Yaml(format!("{key}: cannot unmarshal `{}` into {expected}", shown(value)))
}

fn descriptors(map: &saphyr::Mapping<'_>) -> Result<Vec<Descriptor>, Problem> {
    let Some(list) = get(map, "descriptors") else { return Ok(Vec::new()) };
    let Yaml::Sequence(items) = list else { return Err(unmarshal("descriptors", list, "a list")) };
    items
        .iter()
        .map(|item| match item {
            Yaml::Mapping(item) => descriptor(item),
            other => Err(Problem::NonMapList(shown(other))),
        })
        .collect()
}

fn descriptor(map: &saphyr::Mapping<'_>) -> Result<Descriptor, Problem> {
    let rate_limit = match get(map, "rate_limit") {
        None => None,
        Some(Yaml::Mapping(limit)) => Some(rate_limit(limit)?),
        Some(other) => return Err(unmarshal("rate_limit", other, "a map")),
    };
    Ok(Descriptor {
        key: string(map, "key")?,
        value: string(map, "value")?,
        rate_limit,
        descriptors: descriptors(map)?,
        shadow_mode: boolean(map, "shadow_mode")?,
        quota_mode: boolean(map, "quota_mode")?,
        share_threshold: boolean(map, "share_threshold")?,
    })
}

fn rate_limit(map: &saphyr::Mapping<'_>) -> Result<RateLimit, Problem> {
    let requests_per_unit = match get(map, "requests_per_unit") {
        None => 0,
        Some(Yaml::Value(Scalar::Integer(n))) => {
            u32::try_from(*n).map_err(|_| Problem::RequestsPerUnit(n.to_string()))?
        }
        Some(other) => return Err(Problem::RequestsPerUnit(shown(other))),
    };
    let replaces = match get(map, "replaces") {
        None => Vec::new(),
        Some(Yaml::Sequence(items)) => items
            .iter()
            .map(|item| match item {
                Yaml::Mapping(item) => string(item, "name"),
                other => Err(Problem::NonMapList(shown(other))),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(unmarshal("replaces", other, "a list")),
    };
    Ok(RateLimit {
        requests_per_unit,
        unit: string(map, "unit")?,
        unlimited: boolean(map, "unlimited")?,
        name: string(map, "name")?,
        replaces,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_and_aliases_are_bounded_before_a_tree_is_built() {
        let deep = format!("{}{}", "[".repeat(YAML_DEPTH_MAX + 1), "]".repeat(YAML_DEPTH_MAX + 1));
        assert_eq!(check_shape(&deep), Err(Problem::TooDeep { max: YAML_DEPTH_MAX }));
        let ok = format!("{}{}", "[".repeat(YAML_DEPTH_MAX), "]".repeat(YAML_DEPTH_MAX));
        assert_eq!(check_shape(&ok), Ok(()));
        // Each level repeats the previous one ten times: 10^9 nodes in a few lines.
        let mut laughs = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for (name, previous) in
            ["b", "c", "d", "e", "f", "g", "h", "i"].iter().zip(["a", "b", "c", "d", "e", "f", "g", "h"])
        {
            let row = vec![format!("*{previous}"); 10].join(", ");
            laughs.push_str(&format!("{name}: &{name} [{row}]\n"));
        }
        assert_eq!(check_shape(&laughs), Err(Problem::TooManyNodes { max: YAML_NODES_MAX }));
    }

    #[test]
    fn requests_per_unit_is_a_u32() {
        let of = |n: &str| {
            parse(&format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: {n}}}\n"
            ))
        };
        assert!(of("4294967295").is_ok());
        assert_eq!(of("-1").err(), Some(Problem::RequestsPerUnit("-1".to_owned())));
        assert_eq!(of("4294967296").err(), Some(Problem::RequestsPerUnit("4294967296".to_owned())));
        assert!(matches!(of("99999999999999999999999").err(), Some(Problem::RequestsPerUnit(_))));
        assert!(matches!(of("1.5").err(), Some(Problem::RequestsPerUnit(_))));
    }
}
