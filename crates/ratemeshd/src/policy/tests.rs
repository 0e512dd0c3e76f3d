//! The policy table: names, descriptor matching (envoyproxy/ratelimit's rules), buckets.

use super::*;

/// The policies every test of the table and the HTTP bodies runs against.
pub(crate) const POLICIES: &str = r#"
[[policies]]
name = "api"
algorithm = "token_bucket"
limit = 100
period_ms = 1000

[[policies]]
name = "leases"
algorithm = "concurrency"
limit = 2
period_ms = 60000

[[policies]]
name = "shadow"
algorithm = "fixed_window"
limit = 1
period_ms = 1000
shadow_mode = true

[[policies]]
name = "per-ip"
domain = "edge"
descriptors = [{ key = "remote_address" }]
algorithm = "fixed_window"
limit = 10
period_ms = 60000

[[policies]]
name = "login"
domain = "edge"
descriptors = [{ key = "remote_address" }, { key = "path", value = "/login" }]
algorithm = "fixed_window"
limit = 5
period_ms = 60000

[[policies]]
name = "api-prefix"
domain = "edge"
descriptors = [{ key = "remote_address" }, { key = "path", value = "/api/*" }]
algorithm = "gcra"
limit = 50
period_ms = 1000

[[policies]]
name = "api-v2-prefix"
domain = "edge"
descriptors = [{ key = "remote_address" }, { key = "path", value = "/api/v2/*" }]
algorithm = "gcra"
limit = 20
period_ms = 1000

[[policies]]
name = "any-path"
domain = "edge"
descriptors = [{ key = "remote_address" }, { key = "path" }]
algorithm = "gcra"
limit = 1
period_ms = 1000

[[policies]]
name = "health"
domain = "edge"
descriptors = [{ key = "path", value = "/healthz" }]
unlimited = true

[[policies]]
name = "client-exact"
domain = "edge"
descriptors = [{ key = "client", value = "vip" }, { key = "tier", value = "gold" }]
algorithm = "gcra"
limit = 1000
period_ms = 1000

[[policies]]
name = "client-any"
domain = "edge"
descriptors = [{ key = "client" }, { key = "region" }]
algorithm = "gcra"
limit = 10
period_ms = 1000
"#;

pub(crate) fn config() -> Config {
    Config::parse(POLICIES, "policies.toml").expect("valid")
}

pub(crate) fn table() -> PolicyTable {
    PolicyTable::from_config(&config())
}

fn matched(table: &PolicyTable, domain: &str, entries: &[(&str, &str)]) -> Option<String> {
    table.match_descriptor(domain, entries).map(|m| m.entry.name.clone())
}

#[test]
fn policies_are_found_by_name_in_file_order() {
    let table = table();
    assert_eq!(table.len(), 11);
    assert!(!table.is_empty());
    let api = table.get("api").expect("configured");
    assert_eq!(api.namespace, Namespace::new(b"api"));
    assert_eq!(api.rule.policy().expect("limited").limit.reported_limit(), 100);
    assert!(table.get("nope").is_none());
    let names: Vec<&str> = table.iter().map(|entry| entry.name.as_str()).collect();
    assert_eq!(names[..3], ["api", "leases", "shadow"]);
    assert!(table.has_domain("edge"));
    assert!(!table.has_domain("api"));
    assert!(PolicyTable::default().is_empty());
}

#[test]
fn descriptors_match_paths_of_the_same_length_only() {
    let table = table();
    assert_eq!(matched(&table, "edge", &[("remote_address", "10.0.0.1")]).as_deref(), Some("per-ip"));
    let login = [("remote_address", "10.0.0.1"), ("path", "/login")];
    assert_eq!(matched(&table, "edge", &login).as_deref(), Some("login"));
    // Longer than every path, or a prefix of a path without a policy of its own.
    let longer = [("remote_address", "10.0.0.1"), ("path", "/login"), ("method", "GET")];
    assert_eq!(matched(&table, "edge", &longer), None);
    assert_eq!(matched(&table, "edge", &[("client", "vip")]), None);
    assert_eq!(matched(&table, "edge", &[] as &[(&str, &str)]), None);
    // Unknown domain, unknown key.
    assert_eq!(matched(&table, "other", &[("remote_address", "10.0.0.1")]), None);
    assert_eq!(matched(&table, "edge", &[("user", "42")]), None);
    // Owned strings work as well.
    let owned = vec![("remote_address".to_owned(), "10.0.0.1".to_owned())];
    assert!(table.match_descriptor("edge", &owned).is_some());
}

#[test]
fn exact_values_win_over_prefixes_and_longer_prefixes_over_shorter() {
    let table = table();
    let path = |path| [("remote_address", "10.0.0.1"), ("path", path)];
    assert_eq!(matched(&table, "edge", &path("/login")).as_deref(), Some("login"));
    assert_eq!(matched(&table, "edge", &path("/api/users")).as_deref(), Some("api-prefix"));
    assert_eq!(matched(&table, "edge", &path("/api/v2/users")).as_deref(), Some("api-v2-prefix"));
    assert_eq!(matched(&table, "edge", &path("/api/")).as_deref(), Some("api-prefix"));
    // Neither exact nor prefix: the pattern without value.
    assert_eq!(matched(&table, "edge", &path("/logout")).as_deref(), Some("any-path"));
    assert_eq!(matched(&table, "edge", &path("/ap")).as_deref(), Some("any-path"));
    // Exact values are case-sensitive, like Envoy's.
    assert_eq!(matched(&table, "edge", &path("/LOGIN")).as_deref(), Some("any-path"));
}

#[test]
fn matching_is_greedy_per_level_like_envoyproxy_ratelimit() {
    let table = table();
    let gold = [("client", "vip"), ("tier", "gold")];
    assert_eq!(matched(&table, "edge", &gold).as_deref(), Some("client-exact"));
    let other = [("client", "someone"), ("region", "eu")];
    assert_eq!(matched(&table, "edge", &other).as_deref(), Some("client-any"));
    // "vip" takes the exact branch at the first level; its second level has no `region`, and the
    // match does not backtrack into the wildcard branch (envoyproxy/ratelimit does the same).
    let vip_region = [("client", "vip"), ("region", "eu")];
    assert_eq!(matched(&table, "edge", &vip_region), None);
}

#[test]
fn every_distinct_value_is_its_own_bucket() {
    let table = table();
    let key = |entries: &[(&str, &str)]| table.match_descriptor("edge", entries).expect("matches").key_hash();
    let a = key(&[("remote_address", "10.0.0.1"), ("path", "/api/a")]);
    let b = key(&[("remote_address", "10.0.0.2"), ("path", "/api/a")]);
    let c = key(&[("remote_address", "10.0.0.1"), ("path", "/api/b")]);
    assert_ne!(a, b);
    assert_ne!(a, c);
    assert_eq!(a, key(&[("remote_address", "10.0.0.1"), ("path", "/api/a")]));
    // Length prefixes: moving bytes from a key to a value changes the bucket.
    let m1 = table.match_descriptor("edge", &[("client", "ab"), ("region", "c")]).expect("matches");
    let m2 = table.match_descriptor("edge", &[("client", "a"), ("region", "bc")]).expect("matches");
    assert_ne!(m1.bucket_key, m2.bucket_key);
    // No UTF-8 key of /v1/check can equal an Envoy bucket key.
    assert_eq!(m1.bucket_key[0], 0xFF);
    assert!(std::str::from_utf8(&m1.bucket_key).is_err());
}

#[test]
fn the_first_of_two_same_names_or_paths_is_kept() {
    let mut policies = config().policies;
    let mut copy = policies[0].clone();
    copy.rule = Rule::Unlimited;
    policies.push(copy);
    let table = PolicyTable::new(&policies);
    assert_eq!(table.len(), 11);
    assert!(table.get("api").expect("configured").rule.policy().is_some());
}
