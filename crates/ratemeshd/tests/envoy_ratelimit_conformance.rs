//! envoyproxy/ratelimit's own configuration tests (`test/config/config_test.go`), on its own
//! fixtures (`envoy_ratelimit/upstream/`, copied unchanged, see the README there): which
//! descriptors match which limits, which files fail with which error. `GetLimit` is the daemon's
//! [`PolicyTable::match_descriptor`] over the policies `ratemeshd envoy-ratelimit` loads.
//!
//! Upstream's stats-key assertions are about statsd names, which ratemesh does not have; its
//! limit-override test is about answers (see `envoy_ratelimit_mode.rs`).

use std::time::Duration;

use ratemeshd::PolicyTable;
use ratemeshd::config::Rule;
use ratemeshd::envoy_ratelimit::{ConfigFile, EnvoyConfigError, load, read_dir};

/// What `GetLimit` returns for a descriptor that matches a limit.
#[derive(Debug, PartialEq, Eq)]
enum Got {
    /// `requests_per_unit` per `unit`, its `name`, `shadow_mode`.
    Limit { requests: u64, unit: &'static str, name: Option<String>, shadow: bool },
    /// `unlimited: true`.
    Unlimited,
}

fn limit(requests: u64, unit: &'static str) -> Option<Got> {
    Some(Got::Limit { requests, unit, name: None, shadow: false })
}

fn fixture(name: &str) -> ConfigFile {
    let path = format!("{}/tests/envoy_ratelimit/upstream/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    ConfigFile { name: name.to_owned(), text }
}

fn load_fixtures(names: &[&str], merge: bool) -> Result<PolicyTable, EnvoyConfigError> {
    let files: Vec<ConfigFile> = names.iter().map(|name| fixture(name)).collect();
    load(&files, merge).map(|loaded| PolicyTable::new(&loaded.policies))
}

fn table(name: &str) -> PolicyTable {
    load_fixtures(&[name], false).unwrap_or_else(|e| panic!("{name} loads: {e}"))
}

fn unit_name(period: Duration) -> &'static str {
    match period.as_secs() {
        1 => "SECOND",
        60 => "MINUTE",
        3600 => "HOUR",
        86_400 => "DAY",
        2_592_000 => "MONTH",
        31_536_000 => "YEAR",
        _ => "OTHER",
    }
}

/// Upstream's `GetLimit(domain, descriptor)`.
fn get_limit(table: &PolicyTable, domain: &str, entries: &[(&str, &str)]) -> Option<Got> {
    let matched = table.match_descriptor(domain, entries)?;
    let entry = &matched.entry;
    match &entry.rule {
        Rule::Unlimited => Some(Got::Unlimited),
        rule => {
            let policy = rule.policy()?;
            let spec = policy.limit.spec();
            Some(Got::Limit {
                requests: spec.limit,
                unit: unit_name(spec.period),
                name: entry.envoy.as_ref().and_then(|envoy| envoy.limit_name.clone()),
                shadow: entry.shadow_mode,
            })
        }
    }
}

fn error_of(names: &[&str], merge: bool) -> String {
    match load_fixtures(names, merge) {
        Ok(_) => panic!("{names:?} should be refused"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn basic_config() {
    let t = table("basic_config.yaml");
    assert_eq!(get_limit(&t, "foo_domain", &[("key1", "value1")]), None);
    assert_eq!(get_limit(&t, "test-domain", &[("key1", "something")]), None);
    assert_eq!(get_limit(&t, "test-domain", &[("key1", "value1")]), None);
    assert_eq!(get_limit(&t, "test-domain", &[("key2", "value2"), ("subkey", "subvalue")]), None);
    assert_eq!(get_limit(&t, "test-domain", &[("key5", "value5"), ("subkey5", "subvalue")]), None);
    assert_eq!(
        get_limit(&t, "test-domain", &[("key1", "value1"), ("subkey1", "something")]),
        limit(5, "SECOND")
    );
    assert_eq!(
        get_limit(&t, "test-domain", &[("key1", "value1"), ("subkey1", "subvalue1")]),
        limit(10, "SECOND")
    );
    assert_eq!(get_limit(&t, "test-domain", &[("key2", "something")]), limit(20, "MINUTE"));
    assert_eq!(get_limit(&t, "test-domain", &[("key2", "value2")]), limit(30, "MINUTE"));
    // A value listed without a rate limit: matched, and so not limited by the key's default.
    assert_eq!(get_limit(&t, "test-domain", &[("key2", "value3")]), None);
    assert_eq!(get_limit(&t, "test-domain", &[("key3", "foo")]), limit(1, "HOUR"));
    let key4 =
        Some(Got::Limit { requests: 1, unit: "DAY", name: Some("key4_rate_limit".into()), shadow: false });
    assert_eq!(get_limit(&t, "test-domain", &[("key4", "foo")]), key4);
    assert_eq!(get_limit(&t, "test-domain", &[("key6", "foo")]), Some(Got::Unlimited));
    assert_eq!(get_limit(&t, "test-domain", &[("key7", "unspecified_value")]), limit(70, "MINUTE"));
    assert_eq!(get_limit(&t, "test-domain", &[("key7", "another_value")]), limit(70, "MINUTE"));
    assert_eq!(get_limit(&t, "test-domain", &[("key5", "value5")]), limit(15, "DAY"));
    assert_eq!(
        get_limit(&t, "test-domain", &[("key5", "value5"), ("subkey5", "subvalue5")]),
        limit(25, "DAY")
    );
}

#[test]
fn domain_merge() {
    let t = load_fixtures(&["merge_domain_key1.yaml", "merge_domain_key2.yaml"], true).expect("merged");
    assert_eq!(get_limit(&t, "test-domain", &[("key1", "value1")]), limit(10, "MINUTE"));
    assert_eq!(get_limit(&t, "test-domain", &[("key2", "value2")]), limit(20, "MINUTE"));
}

#[test]
fn errors_are_upstreams() {
    let cases: [(&[&str], bool, &str); 14] = [
        (&["empty_domain.yaml"], false, "empty_domain.yaml: config file cannot have empty domain"),
        (
            &["basic_config.yaml", "duplicate_domain.yaml"],
            false,
            "duplicate_domain.yaml: duplicate domain 'test-domain' in config file",
        ),
        (&["empty_key.yaml"], false, "empty_key.yaml: descriptor has empty key"),
        (
            &["duplicate_key.yaml"],
            false,
            "duplicate_key.yaml: duplicate descriptor composite key 'test-domain.key1_value1'",
        ),
        (
            &["merge_domain_key1.yaml", "merge_domain_key1.yaml"],
            true,
            "merge_domain_key1.yaml: duplicate descriptor composite key 'test-domain.key1_value1'",
        ),
        (&["bad_limit_unit.yaml"], false, "bad_limit_unit.yaml: invalid rate limit unit 'foo'"),
        (
            &["replaces_self.yaml"],
            false,
            "replaces_self.yaml: replaces should not contain name of same descriptor",
        ),
        (&["replaces_empty.yaml"], false, "replaces_empty.yaml: should not have an empty replaces entry"),
        (&["misspelled_key.yaml"], false, "misspelled_key.yaml: config error, unknown key 'ratelimit'"),
        (
            &["misspelled_key2.yaml"],
            false,
            "misspelled_key2.yaml: config error, unknown key 'requestsperunit'",
        ),
        (
            &["non_string_key.yaml"],
            false,
            "non_string_key.yaml: config error, key is not of type string: 0.25",
        ),
        (
            &["non_map_list.yaml"],
            false,
            "non_map_list.yaml: config error, yaml file contains list of type other than map: a",
        ),
        (
            &["unlimited_with_unit.yaml"],
            false,
            "unlimited_with_unit.yaml: should not specify rate limit unit when unlimited",
        ),
        // Upstream's message is its YAML library's ("yaml: line 2: found unexpected end of stream").
        (&["bad_yaml.yaml"], false, "bad_yaml.yaml: error loading config file: "),
    ];
    for (files, merge, expected) in cases {
        let error = error_of(files, merge);
        assert!(error.starts_with(expected), "{files:?}: {error:?}, expected {expected:?}");
    }
}

#[test]
fn shadow_mode_config() {
    let t = table("shadowmode_config.yaml");
    let shadow = |requests, unit| Some(Got::Limit { requests, unit, name: None, shadow: true });
    assert_eq!(
        get_limit(&t, "test-domain", &[("key1", "value1"), ("subkey1", "something")]),
        limit(5, "SECOND")
    );
    assert_eq!(
        get_limit(&t, "test-domain", &[("key1", "value1"), ("subkey1", "subvalue1")]),
        shadow(10, "SECOND")
    );
    assert_eq!(get_limit(&t, "test-domain", &[("key2", "something")]), shadow(20, "MINUTE"));
    assert_eq!(get_limit(&t, "test-domain", &[("key2", "value2")]), limit(30, "MINUTE"));
}

#[test]
fn wildcard_config() {
    let t = table("wildcard.yaml");
    let d = "test-domain";
    assert_eq!(get_limit(&t, d, &[("noVal", "foo1")]), limit(20, "MINUTE"));
    assert_eq!(get_limit(&t, d, &[("noVal", "foo2")]), limit(20, "MINUTE"));
    assert_eq!(get_limit(&t, d, &[("wild", "foo1")]), limit(20, "MINUTE"));
    assert_eq!(get_limit(&t, d, &[("wild", "foo2")]), limit(20, "MINUTE"));
    assert_eq!(get_limit(&t, d, &[("nestedWild", "val1"), ("wild", "goo2")]), limit(20, "MINUTE"));
    assert_eq!(get_limit(&t, d, &[("wild", "bar")]), None);
    assert_eq!(get_limit(&t, d, &[("noWild", "foo1")]), None);
    for value in ["barab", "bar123b", "barb"] {
        assert_eq!(get_limit(&t, d, &[("midWild", value)]), limit(20, "MINUTE"), "{value}");
    }
    for value in ["bara", "xbarb"] {
        assert_eq!(get_limit(&t, d, &[("midWild", value)]), None, "{value}");
    }
    for value in ["foo123bar456baz", "foobarbaz"] {
        assert_eq!(get_limit(&t, d, &[("multiWild", value)]), limit(10, "MINUTE"), "{value}");
    }
    for value in ["foo123baz", "bar456baz"] {
        assert_eq!(get_limit(&t, d, &[("multiWild", value)]), None, "{value}");
    }
    // Each value is its own bucket, as upstream's cache keys are made of the request's values.
    let one = t.match_descriptor(d, &[("wild", "foo1")]).expect("matches");
    let two = t.match_descriptor(d, &[("wild", "foo2")]).expect("matches");
    assert_ne!(one.key_hash(), two.key_hash());
}

#[test]
fn metadata_and_share_threshold_configs_load() {
    let t = table("metadata.yaml");
    assert_eq!(get_limit(&t, "test-domain", &[("key1", "value1"), ("subkey1", "x")]), limit(5, "SECOND"));
    assert_eq!(get_limit(&t, "test-domain", &[("key2", "x")]), limit(20, "MINUTE"));
    let t = table("share_threshold.yaml");
    let d = "test-domain";
    assert_eq!(get_limit(&t, d, &[("files", "files/a.txt")]), limit(100, "MINUTE"));
    assert_eq!(get_limit(&t, d, &[("nested", "parent"), ("files", "nested/x")]), limit(200, "MINUTE"));
    assert_eq!(get_limit(&t, d, &[("files", "top/a"), ("files", "nested/b")]), limit(300, "MINUTE"));
    // An explicit value before a wildcard of the same key.
    assert_eq!(get_limit(&t, d, &[("file", "test1")]), limit(50, "MINUTE"));
    assert_eq!(get_limit(&t, d, &[("file", "test2")]), limit(100, "MINUTE"));
    assert_eq!(get_limit(&t, d, &[("midpath", "/api/users/v1")]), limit(100, "MINUTE"));
    assert_eq!(get_limit(&t, d, &[("tenant", "t1prod"), ("resource", "res-a-v2")]), limit(60, "MINUTE"));
}

#[test]
fn wildcards_are_tried_in_file_order_as_upstream() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    value: 'a*'\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    value: 'ab*'\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
    let loaded = load(&[ConfigFile { name: "order.yaml".into(), text: text.into() }], false).expect("valid");
    let t = PolicyTable::new(&loaded.policies);
    assert_eq!(get_limit(&t, "d", &[("k", "abc")]), limit(1, "SECOND"));
}

/// Every file of a fixture directory, as `ratemeshd envoy-ratelimit` reads a directory.
fn directory(dir: &str) -> PolicyTable {
    let path = std::path::PathBuf::from(format!(
        "{}/tests/envoy_ratelimit/upstream/{dir}",
        env!("CARGO_MANIFEST_DIR")
    ));
    let files = read_dir(&path, false).unwrap_or_else(|e| panic!("{dir}: {e}"));
    let loaded = load(&files, false).unwrap_or_else(|e| panic!("{dir}: {e}"));
    PolicyTable::new(&loaded.policies)
}

#[test]
fn upstreams_integration_and_example_configurations_load() {
    let t = directory("integration");
    assert_eq!(get_limit(&t, "basic", &[("key1", "foo")]), limit(50, "SECOND"));
    assert_eq!(get_limit(&t, "basic", &[("one_per_minute", "foo")]), limit(1, "MINUTE"));
    assert_eq!(get_limit(&t, "another", &[("key4", "foo")]), limit(20, "DAY"));
    assert_eq!(get_limit(&t, "share-threshold-test", &[("files", "files/a")]), limit(10, "HOUR"));
    // reload.yaml's `block` is `requests_per_unit: 0`: matched, every request over it.
    let block = t.match_descriptor("reload", &[("block", "x")]).expect("matches");
    assert_eq!(block.entry.envoy.as_ref().and_then(|e| e.deny_all), Some(Duration::from_secs(1)));
    let t = directory("examples");
    assert_eq!(get_limit(&t, "mongo_cps", &[("database", "users")]), limit(500, "SECOND"));
    assert_eq!(get_limit(&t, "rl", &[("foo", "x"), ("bar", "y")]), limit(3, "MINUTE"));
    let bkthomps =
        Some(Got::Limit { requests: 1, unit: "MINUTE", name: Some("bkthomps".into()), shadow: false });
    assert_eq!(get_limit(&t, "rl", &[("foo", "x"), ("bar", "bkthomps")]), bkthomps);
    let shady = Some(Got::Limit { requests: 3, unit: "MINUTE", name: None, shadow: true });
    assert_eq!(get_limit(&t, "rl", &[("foo", "x"), ("baz", "shady")]), shady);
    assert_eq!(get_limit(&t, "rl", &[("foo", "x"), ("bay", "y")]), Some(Got::Unlimited));
    let quota = t.match_descriptor("rl", &[("service", "service_1")]).expect("matches");
    assert!(quota.entry.envoy.as_ref().is_some_and(|e| e.quota_mode));
}
