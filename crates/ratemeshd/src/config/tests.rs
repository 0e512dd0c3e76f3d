//! The configuration's tests: one case per refusal (each naming its field and line), defaults,
//! environment overrides. Long because it is a table of small cases, which reads best in one place.

use std::time::Duration;

use ratemesh::security::CLUSTER_SECRET_LEN_MIN;
use ratemesh::{ClusterSecurity, Region, Seed};
use ratemesh_core::{
    Algorithm, Fallback, Limit, LimitSpec, Mode, NodeId, PolicyRegion, RegionFallback, RegionId,
};

use super::*;

const ORIGIN: &str = "test.toml";

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, ORIGIN)
}

fn parse_env(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::parse_with_env(text, ORIGIN, vars.iter().copied())
}

/// Asserts that `text` is refused with an error naming `field` at `line`, and returns the message.
#[track_caller]
fn refused(text: &str, field: &str, line: usize) -> String {
    let error = parse(text).expect_err("must be refused");
    let rendered = error.to_string();
    assert_eq!(error.field(), Some(field), "{rendered}");
    assert_eq!(error.line(), Some(line), "{rendered}");
    assert!(rendered.starts_with(&format!("{ORIGIN}:{line}:")), "{rendered}");
    assert!(rendered.contains(field), "{rendered}");
    rendered
}

/// A valid policy table, to which a test appends one bad line.
const POLICY: &str =
    "[[policies]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 100\nperiod_ms = 1000\n";

#[test]
fn the_embedded_configuration_is_the_default_with_the_quick_start_policy() {
    let config = Config::parse(EMBEDDED_CONFIG, EMBEDDED_CONFIG_ORIGIN).expect("valid");
    assert_eq!(Config { policies: Vec::new(), ..config.clone() }, Config::default());
    let names: Vec<&str> = config.policies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["api"]);
}

#[test]
fn empty_file_is_the_default_single_node_config() {
    let config = parse("").expect("empty file is valid");
    assert_eq!(config, Config::default());
    assert_eq!(config.node.id, NodeId(1));
    assert_eq!(config.node.incarnation, None);
    assert_eq!(config.listen.http, "127.0.0.1:8080".parse().expect("address"));
    assert_eq!(config.listen.grpc, "127.0.0.1:8081".parse().expect("address"));
    assert_eq!(config.listen.gossip, "127.0.0.1:7946".parse().expect("address"));
    assert_eq!(config.listen.quic, "127.0.0.1:7947".parse().expect("address"));
    assert_eq!(config.listen.resp, None, "the RESP listener is off by default");
    assert_eq!(config.listen.gossip_advertised(), config.listen.gossip);
    assert!(config.cluster.seeds.is_empty());
    assert!(config.cluster.auth.is_dev_secret());
    assert!(DEV_CLUSTER_SECRET.len() >= CLUSTER_SECRET_LEN_MIN);
    assert_eq!(config.log.format, LogFormat::Text);
    assert_eq!(config.log.level, LogLevel::Info);
    assert_eq!(config.limits.http_body_bytes_max, 64 * 1024);
    assert_eq!(config.limits.key_bytes_max, 4096);
    assert!(config.policies.is_empty());
    // Empty sections are the same as absent ones.
    assert_eq!(parse("[node]\n[cluster]\n[listen]\n[limits]\n[log]\n").expect("valid"), config);
}

#[test]
fn the_secret_never_shows_in_debug_output() {
    let config = parse("[cluster]\nsecret = \"0123456789abcdef-very-secret\"").expect("valid");
    let debug = format!("{config:?}");
    assert!(!debug.contains("very-secret"), "{debug}");
    assert!(!format!("{:?}", Config::default()).contains(DEV_CLUSTER_SECRET));
}

#[test]
fn a_full_file_is_read_into_typed_values() {
    let text = r#"
[node]
id = 7
incarnation = 3
data_dir = "/var/lib/ratemesh"
snapshot_interval_ms = 2000
snapshot_period_min_ms = 3600000
region = "eu-west"
region_sync_interval_ms = 100
region_lease_ms = 1000
region_fallback = "last"
audit_keys_max = 1000

[cluster]
cluster_id = "prod-eu"
seeds = ["10.0.0.1:7946", "[::1]:7000"]
secret = "0123456789abcdef"
gossip_interval_ms = 100
sync_interval_ms = 20
dead_member_forget_ms = 5000

[listen]
http = "0.0.0.0:9000"
grpc = "0.0.0.0:9001"
gossip = "0.0.0.0:9002"
quic = "0.0.0.0:9003"
advertise_gossip = "10.0.0.7:9002"
advertise_quic = "10.0.0.7:9003"

[limits]
keys_max = 5000
http_body_bytes_max = 1024
http_in_flight_max = 10
connections_max = 30
batch_len_max = 20
key_bytes_max = 100
log_bytes_max = 1048576

[log]
format = "json"
level = "debug"

[[policies]]
name = "login"
algorithm = "leaky_bucket"
limit = 10
period_ms = 1000
burst = 20
delay = 5
mode = "exact"
fallback = "fail_closed"
shadow_mode = true

[[policies]]
name = "edge"
domain = "edge"
descriptors = [{ key = "remote_address" }, { key = "path", value = "/api/*" }, { key = "m", value = "GET" }]
unlimited = true
"#;
    let config = parse(text).expect("valid");
    let node = NodeSection {
        id: NodeId(7),
        id_from: None,
        incarnation: Some(3),
        data_dir: Some("/var/lib/ratemesh".into()),
        snapshot_interval: Duration::from_secs(2),
        snapshot_period_min: Duration::from_secs(3600),
        region: Region::new("eu-west").expect("valid"),
        region_sync_interval: Duration::from_millis(100),
        region_lease: Duration::from_secs(1),
        region_fallback: RegionFallback::Last,
        audit_keys_max: 1000,
    };
    assert_eq!(config.node, node);
    let core = config.node_config();
    assert_eq!(core.region, RegionId::from_name("eu-west"));
    assert_eq!(
        (core.region_sync_interval, core.region_lease),
        (node.region_sync_interval, node.region_lease)
    );
    assert_eq!(core.region_fallback, RegionFallback::Last);
    assert_eq!(config.cluster.cluster_id, "prod-eu");
    assert_eq!(config.cluster.seeds.len(), 2);
    assert_eq!(
        config.cluster.auth,
        ClusterAuth::Secret { secret: SecretString::new("0123456789abcdef"), accepted: None }
    );
    assert!(!config.cluster.auth.is_dev_secret());
    assert!(matches!(config.cluster.auth.security(), Ok(ClusterSecurity::Secret(_))));
    assert_eq!(config.cluster.gossip_interval, Duration::from_millis(100));
    assert_eq!(config.cluster.sync_interval, Duration::from_millis(20));
    assert_eq!(config.cluster.dead_member_forget, Duration::from_secs(5));
    assert_eq!(config.listen.gossip_advertised(), "10.0.0.7:9002".parse().expect("address"));
    assert_eq!(config.listen.quic_advertised(), "10.0.0.7:9003".parse().expect("address"));
    assert_eq!(
        config.limits,
        Bounds {
            keys_max: 5000,
            http_body_bytes_max: 1024,
            http_in_flight_max: 10,
            connections_max: 30,
            batch_len_max: 20,
            key_bytes_max: 100,
            log_bytes_max: 1 << 20,
            rlqs_streams_max: RLQS_STREAMS_MAX_DEFAULT,
            rlqs_buckets_per_stream_max: RLQS_BUCKETS_PER_STREAM_MAX_DEFAULT,
        }
    );
    assert_eq!(config.log, LogSection { format: LogFormat::Json, level: LogLevel::Debug });
    let node_config = config.node_config();
    assert_eq!(node_config.sync_interval, Duration::from_millis(20));
    assert_eq!(node_config.store.keys_max, 5000);
    assert_eq!(node_config.store.log_bytes_max, 1 << 20);

    let login = &config.policies[0];
    assert_eq!(login.name, "login");
    assert!(login.shadow_mode);
    assert_eq!(login.envoy, None);
    let policy = login.rule.policy().expect("limited");
    let spec =
        LimitSpec::new(Algorithm::LeakyBucketShaper, 10, Duration::from_secs(1)).with_burst(20).with_delay(5);
    assert_eq!(policy.limit, Limit::new(spec).expect("valid"));
    assert_eq!(policy.mode, Mode::Exact);
    assert_eq!(policy.fallback, Fallback::FailClosed);

    let edge = &config.policies[1];
    assert_eq!(edge.rule, Rule::Unlimited);
    let envoy = edge.envoy.as_ref().expect("envoy");
    assert_eq!(envoy.domain, "edge");
    assert_eq!(
        envoy.descriptors,
        vec![
            DescriptorPattern { key: "remote_address".into(), value: ValuePattern::Any },
            DescriptorPattern { key: "path".into(), value: ValuePattern::Prefix("/api/".into()) },
            DescriptorPattern { key: "m".into(), value: ValuePattern::Exact("GET".into()) },
        ]
    );
}

#[test]
fn policy_defaults_are_approximate_local_share_enforced() {
    let config = parse(POLICY).expect("valid");
    let policy = &config.policies[0];
    assert!(!policy.shadow_mode);
    let core = policy.rule.policy().expect("limited");
    assert_eq!(core.mode, Mode::Approximate);
    assert_eq!(core.fallback, Fallback::LocalShare);
    assert_eq!(core.limit.capacity(), 100);
}

#[test]
fn a_policy_sets_its_terms_between_regions() {
    let default = parse(POLICY).expect("valid");
    assert_eq!(default.policies[0].rule.policy().expect("limited").region, PolicyRegion::default());
    let text = POLICY.to_owned() + "home_region = \"eu-west\"\nregion_fallback = \"closed\"\n";
    let config = parse(&text).expect("valid");
    let region = config.policies[0].rule.policy().expect("limited").region;
    assert_eq!(region.home, Some(RegionId::from_name("eu-west")));
    assert_eq!(region.fallback, Some(RegionFallback::Closed));
    let message = refused(&(POLICY.to_owned() + "home_region = \"EU\"\n"), "policies[0].home_region", 6);
    assert!(message.contains("a-z, 0-9"), "{message}");
    refused(&(POLICY.to_owned() + "home_region = \"\"\n"), "policies[0].home_region", 6);
    let message =
        refused(&(POLICY.to_owned() + "region_fallback = \"open\"\n"), "policies[0].region_fallback", 6);
    assert!(message.contains("floor, last or closed"), "{message}");
}

#[test]
fn with_certificate_paths_the_secret_seals_gossip() {
    let paths =
        "[cluster]\nca_cert_path = \"/c/ca.pem\"\ncert_path = \"/c/n.pem\"\nkey_path = \"/c/n.key\"\n";
    let listen = "[listen]\ngossip = \"10.1.1.1:7946\"\nquic = \"10.1.1.1:7947\"\n";
    let message = refused(&format!("{paths}{listen}"), "cluster.secret", 2);
    assert!(message.contains("seals gossip"), "{message}");
    let text =
        format!("{paths}secret = \"a gossip secret!\"\nsecret_accepted = \"the older secret\"\n{listen}");
    let config = parse(&text).expect("valid");
    assert_eq!(
        config.cluster.auth,
        ClusterAuth::Certs {
            ca_cert_path: "/c/ca.pem".into(),
            cert_path: "/c/n.pem".into(),
            key_path: "/c/n.key".into(),
            gossip_secret: SecretString::new("a gossip secret!"),
            accepted: Some(SecretString::new("the older secret")),
        }
    );
    assert!(matches!(config.cluster.auth.security(), Ok(ClusterSecurity::Provided(_))));
}

#[test]
fn an_accepted_secret_is_checked_like_the_secret() {
    let text = "[cluster]\nsecret = \"0123456789abcdef\"\nsecret_accepted = \"short\"\n";
    let message = refused(text, "cluster.secret_accepted", 3);
    assert!(message.contains("at least 16"), "{message}");
}

#[test]
fn unknown_algorithm_names_field_and_line() {
    let text = POLICY.replace("token_bucket", "leaky_token");
    let message = refused(&text, "policies[0].algorithm", 3);
    assert!(message.contains("token_bucket, gcra"), "{message}");
}

#[test]
fn limit_errors_from_the_core_name_the_field_and_its_line() {
    refused(&POLICY.replace("limit = 100", "limit = 0"), "policies[0].limit", 4);
    refused(&POLICY.replace("period_ms = 1000", "period_ms = 0"), "policies[0].period_ms", 5);
    let huge_period = POLICY.replace("period_ms = 1000", "period_ms = 18446744073709551615");
    refused(&huge_period, "policies[0].period_ms", 5);
    let concurrency = POLICY.replace("token_bucket", "concurrency") + "burst = 5\n";
    let message = refused(&concurrency, "policies[0].burst", 6);
    assert!(message.contains("burst does not apply to concurrency"), "{message}");
    let delay = POLICY.to_owned() + "delay = 5\n";
    refused(&delay, "policies[0].delay", 6);
    let shaper = POLICY.replace("token_bucket", "leaky_bucket") + "burst = 2\ndelay = 5\n";
    refused(&shaper, "policies[0].delay", 7);
    refused(&POLICY.replace("limit = 100", "limit = 10000000000000"), "policies[0].limit", 4);
}

#[test]
fn missing_and_malformed_policy_fields_are_named() {
    refused(&POLICY.replace("name = \"api\"\n", ""), "policies[0].name", 1);
    refused(&POLICY.replace("limit = 100\n", ""), "policies[0].limit", 1);
    refused(&POLICY.replace("algorithm = \"token_bucket\"\n", ""), "policies[0].algorithm", 1);
    refused(&POLICY.replace("\"api\"", "\"has space\""), "policies[0].name", 2);
    refused(&POLICY.replace("\"api\"", "\"inline:x\""), "policies[0].name", 2);
    refused(&(POLICY.to_owned() + "mode = \"strict\"\n"), "policies[0].mode", 6);
    refused(&(POLICY.to_owned() + "fallback = \"maybe\"\n"), "policies[0].fallback", 6);
}

#[test]
fn the_inline_label_is_not_a_policy_name() {
    let text = POLICY.replace("name = \"api\"", "name = \"inline\"");
    let message = refused(&text, "policies[0].name", 2);
    assert!(message.contains("reserved"), "{message}");
    // Only the exact label: names that merely contain it are fine.
    assert!(parse(&POLICY.replace("name = \"api\"", "name = \"inline-api\"")).is_ok());
}

#[test]
fn duplicate_policy_names_are_refused_at_the_second() {
    let text = format!("{POLICY}\n{POLICY}");
    let message = refused(&text, "policies[1].name", 8);
    assert!(message.contains("duplicate"), "{message}");
}

#[test]
fn envoy_paths_must_be_unique_per_domain_and_complete() {
    let envoy = |name: &str, domain: &str, descriptors: &str| {
        POLICY.replace("\"api\"", &format!("\"{name}\""))
            + &format!("domain = \"{domain}\"\ndescriptors = {descriptors}\n")
    };
    let path = r#"[{ key = "a" }, { key = "b", value = "x*" }]"#;
    let same = format!("{}{}", envoy("one", "d", path), envoy("two", "d", path));
    let message = refused(&same, "policies[1].descriptors", 14);
    assert!(message.contains("\"one\""), "{message}");
    // The same path in another domain, or another value, is another policy.
    let other_domain = format!("{}{}", envoy("one", "d", path), envoy("two", "e", path));
    assert_eq!(parse(&other_domain).expect("valid").policies.len(), 2);
    let other_value = format!(
        "{}{}",
        envoy("one", "d", path),
        envoy("two", "d", r#"[{ key = "a" }, { key = "b", value = "x" }]"#)
    );
    assert_eq!(parse(&other_value).expect("valid").policies.len(), 2);

    refused(&(POLICY.to_owned() + "descriptors = [{ key = \"a\" }]\n"), "policies[0].domain", 6);
    refused(&(POLICY.to_owned() + "domain = \"d\"\n"), "policies[0].descriptors", 6);
    refused(&envoy("x", "d", "[]"), "policies[0].descriptors", 7);
    refused(&envoy("x", "", "[{ key = \"a\" }]"), "policies[0].domain", 6);
    refused(&envoy("x", "d", "[{ key = \"\" }]"), "policies[0].descriptors[0].key", 7);
    refused(&envoy("x", "d", "[{ value = \"v\" }]"), "policies[0].descriptors[0].key", 7);
    refused(
        &envoy("x", "d", "[{ key = \"a\" }, { key = \"b\", value = \"\" }]"),
        "policies[0].descriptors[1].value",
        7,
    );
    let deep = format!("[{}]", vec!["{ key = \"k\" }"; DESCRIPTOR_DEPTH_MAX + 1].join(", "));
    refused(&envoy("x", "d", &deep), "policies[0].descriptors", 7);
}

#[test]
fn unlimited_is_for_envoy_descriptors_without_a_limit() {
    refused(&(POLICY.to_owned() + "unlimited = true\n"), "policies[0].unlimited", 6);
    let text =
        "[[policies]]\nname = \"u\"\ndomain = \"d\"\ndescriptors = [{ key = \"a\" }]\nunlimited = true\n";
    assert_eq!(parse(text).expect("valid").policies[0].rule, Rule::Unlimited);
    refused(&format!("{text}limit = 5\n"), "policies[0].limit", 6);
    refused(&format!("{text}mode = \"exact\"\n"), "policies[0].mode", 6);
}

#[test]
fn toml_type_errors_name_the_field_and_line() {
    refused("[node]\nid = \"one\"\n", "node.id", 2);
    refused("[node]\nid = -1\n", "node.id", 2);
    refused("\n[limits]\nkeys_max = 1.5\n", "limits.keys_max", 3);
    refused(&POLICY.replace("limit = 100", "limit = \"100\""), "policies[0].limit", 4);
    let second = format!("{POLICY}\n{}", POLICY.replace("\"api\"", "\"b\"")) + "shadow_mode = \"yes\"\n";
    refused(&second, "policies[1].shadow_mode", 12);
    let inline = "policies = [{ name = \"a\" }, { name = \"b\", limit = -1 }]\n";
    refused(inline, "policies[1].limit", 1);
    refused("[cluster]\nseeds = \"10.0.0.1:7946\"\n", "cluster.seeds", 2);
    refused("[node]\ndata_dir = \"\"\n", "node.data_dir", 2);
    refused("[node]\ndata_dir = \"var/lib/ratemesh\"\n", "node.data_dir", 2);
    refused("[node]\nsnapshot_interval_ms = 10\n", "node.snapshot_interval_ms", 2);
    refused("[node]\nsnapshot_interval_ms = 0\n", "node.snapshot_interval_ms", 2);
}

#[test]
fn calendar_windows_are_parsed_and_their_mistakes_named() {
    let calendar =
        "[[policies]]\nname = \"monthly\"\nwindow = \"month\"\ntime_zone = \"Europe/Berlin\"\nlimit = 10\n";
    let config = parse(calendar).expect("valid");
    let Rule::Calendar(rule) = &config.policies[0].rule else { panic!("a calendar rule") };
    assert_eq!(
        (rule.calendar().unit().name(), rule.calendar().zone_name(), rule.limit()),
        ("month", "Europe/Berlin", 10)
    );
    let policy = config.policies[0].rule.policy().expect("limited");
    assert_eq!(policy.limit.algorithm(), Algorithm::FixedWindow);
    assert!(policy.limit.spec().calendar.is_some());
    refused(&calendar.replace("\"month\"", "\"fortnight\""), "policies[0].window", 3);
    refused(&calendar.replace("Europe/Berlin", "Mars/Base"), "policies[0].time_zone", 4);
    refused(&format!("{calendar}period_ms = 1000\n"), "policies[0].period_ms", 6);
    refused(&format!("{calendar}algorithm = \"token_bucket\"\n"), "policies[0].algorithm", 6);
    refused(&format!("{POLICY}time_zone = \"UTC\"\n"), "policies[0].time_zone", 6);
}

#[test]
fn unknown_fields_and_sections_are_refused() {
    refused("[node]\nid = 1\nname = \"x\"\n", "node.name", 3);
    refused("[nodes]\nid = 1\n", "nodes", 1);
    refused(&(POLICY.to_owned() + "requests_per_unit = 5\n"), "policies[0].requests_per_unit", 6);
    let descriptors = "domain = \"d\"\ndescriptors = [{ key = \"a\" }, { key = \"a\", val = \"b\" }]\n";
    refused(&(POLICY.to_owned() + descriptors), "policies[0].descriptors[1].val", 7);
    let second = format!("{POLICY}\n{}", POLICY.replace("\"api\"", "\"b\"")) + descriptors;
    refused(&second, "policies[1].descriptors[1].val", 13);
}

#[test]
fn syntax_errors_have_a_line() {
    let error = parse("[node]\nid = = 1\n").expect_err("invalid TOML");
    assert!(matches!(error, ConfigError::Syntax { .. }), "{error}");
    assert_eq!(error.line(), Some(2), "{error}");
}

#[test]
fn cluster_values_are_checked() {
    let secret = refused("[cluster]\nsecret = \"short\"\n", "cluster.secret", 2);
    assert!(secret.contains("at least 16"), "{secret}");
    let incomplete = "[cluster]\nsecret = \"0123456789abcdef\"\nca_cert_path = \"/ca.pem\"\n";
    refused(incomplete, "cluster.cert_path", 3);
    refused("[cluster]\nca_cert_path = \"/ca.pem\"\ncert_path = \"/n.pem\"\n", "cluster.key_path", 2);
    refused(
        "[cluster]\nca_cert_path = \"\"\ncert_path = \"/n.pem\"\nkey_path = \"/n.key\"\n",
        "cluster.ca_cert_path",
        2,
    );
    refused("[cluster]\nseeds = [\"10.0.0.1:7946\", \"nowhere\"]\n", "cluster.seeds[1]", 2);
    refused("[cluster]\nseeds = [\"10.0.0.1:0\"]\n", "cluster.seeds[0]", 2);
    refused("[cluster]\nseeds = [\"0.0.0.0:7946\"]\n", "cluster.seeds[0]", 2);
    refused("[cluster]\ncluster_id = \"\"\n", "cluster.cluster_id", 2);
    refused("[cluster]\ngossip_interval_ms = 0\n", "cluster.gossip_interval_ms", 2);
    refused("[cluster]\nsync_interval_ms = 600000\n", "cluster.sync_interval_ms", 2);
    refused(
        "[cluster]\ngossip_interval_ms = 500\ndead_member_forget_ms = 100\n",
        "cluster.dead_member_forget_ms",
        3,
    );
}

#[test]
fn the_dev_secret_is_refused_off_loopback() {
    let exposed = "[listen]\ngossip = \"0.0.0.0:7946\"\nadvertise_gossip = \"10.0.0.1:7946\"\n";
    let message = refused(exposed, "cluster.secret", 2);
    assert!(message.contains("development secret"), "{message}");
    let explicit = format!("[cluster]\nsecret = \"{DEV_CLUSTER_SECRET}\"\n{exposed}");
    refused(&explicit, "cluster.secret", 2);
    let with_secret = format!("[cluster]\nsecret = \"0123456789abcdef\"\n{exposed}");
    assert!(parse(&with_secret).is_ok());
    // HTTP and gRPC may listen anywhere with it: they are not how peers join.
    assert!(parse("[listen]\nhttp = \"0.0.0.0:8080\"\ngrpc = \"0.0.0.0:8081\"\n").is_ok());
}

#[test]
fn listen_addresses_are_checked() {
    let message = refused("[listen]\n\nhttp = \"localhost:80\"\n", "listen.http", 3);
    assert!(message.contains("ip:port"), "{message}");
    refused("[listen]\ngrpc = \"127.0.0.1\"\n", "listen.grpc", 2);
    refused("[listen]\ngrpc = \"127.0.0.1:8080\"\n", "listen.grpc", 2);
    refused("[listen]\nhttp = \"127.0.0.1:8081\"\n", "listen.http", 2);
    refused("[listen]\nquic = \"127.0.0.1:7946\"\n", "listen.quic", 2);
    refused("[listen]\nresp = \"127.0.0.1:8080\"\n", "listen.resp", 2);
    refused("[listen]\nresp = \"127.0.0.1:8081\"\n", "listen.resp", 2);
    refused("[listen]\nresp = \"localhost:6380\"\n", "listen.resp", 2);
    let resp = parse("[listen]\nresp = \"127.0.0.1:6380\"\n").expect("valid");
    assert_eq!(resp.listen.resp, Some("127.0.0.1:6380".parse().expect("address")));
    let unreachable = "[cluster]\nsecret = \"0123456789abcdef\"\n[listen]\ngossip = \"0.0.0.0:7946\"\n";
    refused(unreachable, "listen.gossip", 4);
    refused("[listen]\nadvertise_quic = \"0.0.0.0:1\"\n", "listen.advertise_quic", 2);
    // Port 0 (the OS chooses) never clashes.
    let any_port = "[listen]\nhttp = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\ngossip = \"127.0.0.1:0\"\nquic = \"127.0.0.1:0\"\n";
    assert!(parse(any_port).is_ok());
}

#[test]
fn bounds_and_log_values_are_checked() {
    refused("[limits]\nkeys_max = 0\n", "limits.keys_max", 2);
    refused("[limits]\nhttp_body_bytes_max = 1000000000\n", "limits.http_body_bytes_max", 2);
    refused("[limits]\nhttp_in_flight_max = 0\n", "limits.http_in_flight_max", 2);
    refused("[limits]\nconnections_max = 0\n", "limits.connections_max", 2);
    refused("[limits]\nconnections_max = 100000000\n", "limits.connections_max", 2);
    // The connection bound follows the in-flight bound unless it is given.
    assert_eq!(parse("").expect("valid").limits.connections_max, 4 * HTTP_IN_FLIGHT_MAX_DEFAULT);
    assert_eq!(parse("[limits]\nhttp_in_flight_max = 7\n").expect("valid").limits.connections_max, 28);
    refused("[limits]\nbatch_len_max = 1000000\n", "limits.batch_len_max", 2);
    refused("[limits]\nhttp_body_bytes_max = 1000\nkey_bytes_max = 2000\n", "limits.key_bytes_max", 3);
    // A smaller body bound lowers the default key bound with it.
    assert_eq!(parse("[limits]\nhttp_body_bytes_max = 1000\n").expect("valid").limits.key_bytes_max, 1000);
    refused("[log]\nformat = \"xml\"\n", "log.format", 2);
    refused("[log]\nlevel = \"verbose\"\n", "log.level", 2);
}

#[test]
fn columns_count_characters() {
    let error = parse("# é\n[log]\n   format = \"é\"\n").expect_err("unknown format");
    assert_eq!(
        error.location(),
        Some(&Location::File { origin: ORIGIN.to_owned(), line: 3, column: 13 }),
        "{error}"
    );
}

#[test]
fn environment_overrides_replace_file_values() {
    let text = "[node]\nid = 1\n[log]\nformat = \"text\"\n";
    let vars = [
        ("PATH", "/usr/bin"),
        ("RATEMESH_NODE_ID", "42"),
        ("RATEMESH_CLUSTER_SEEDS", " 10.0.0.1:7946, 10.0.0.2:7946 ,"),
        ("RATEMESH_CLUSTER_SECRET", "from the environment"),
        ("RATEMESH_LISTEN_HTTP", "127.0.0.1:9999"),
        ("RATEMESH_LISTEN_RESP", "127.0.0.1:6380"),
        ("RATEMESH_LOG_FORMAT", "json"),
        ("RATEMESH_LIMITS_KEY_BYTES_MAX", "64"),
    ];
    let config = parse_env(text, &vars).expect("valid");
    assert_eq!(config.node.id, NodeId(42));
    assert_eq!(
        config.cluster.seeds,
        vec!["10.0.0.1:7946".parse().expect("a"), "10.0.0.2:7946".parse().expect("a")]
    );
    assert_eq!(
        config.cluster.auth,
        ClusterAuth::Secret { secret: SecretString::new("from the environment"), accepted: None }
    );
    assert_eq!(config.listen.http, "127.0.0.1:9999".parse().expect("address"));
    assert_eq!(config.listen.resp, Some("127.0.0.1:6380".parse().expect("address")));
    assert_eq!(config.log.format, LogFormat::Json);
    assert_eq!(config.limits.key_bytes_max, 64);
    assert!(parse_env("", &[("RATEMESH_CLUSTER_SEEDS", "")]).expect("valid").cluster.seeds.is_empty());
}

#[test]
fn environment_errors_name_the_variable() {
    let cases = [
        ("RATEMESH_NODE_ID", "seven", "node.id"),
        ("RATEMESH_LISTEN_HTTP", "nowhere:80", "listen.http"),
        ("RATEMESH_CLUSTER_SECRET", "short", "cluster.secret"),
        ("RATEMESH_CLUSTER_SEEDS", "10.0.0.1:7946,bad", "cluster.seeds[1]"),
        ("RATEMESH_LOG_LEVEL", "loud", "log.level"),
        ("RATEMESH_LIMITS_KEYS_MAX", "-1", "limits.keys_max"),
    ];
    for (variable, value, field) in cases {
        let error = parse_env("", &[(variable, value)]).expect_err("refused");
        assert_eq!(error.field(), Some(field), "{error}");
        assert_eq!(error.location(), Some(&Location::Env { variable: variable.to_owned() }), "{error}");
        assert!(error.to_string().contains(variable), "{error}");
    }
    let error = parse_env("", &[("RATEMESH_NODE_IDD", "1")]).expect_err("unknown variable");
    assert!(matches!(&error, ConfigError::UnknownVariable { variable } if variable == "RATEMESH_NODE_IDD"));
    assert!(error.to_string().contains("RATEMESH_NODE_ID,"), "{error}");
}

#[cfg(unix)]
#[test]
fn environment_values_must_be_utf8() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt as _;
    let vars = [(OsStr::new("RATEMESH_CLUSTER_SECRET"), OsStr::from_bytes(b"\xff0123456789abcdef"))];
    let error = Config::parse_with_env("", ORIGIN, vars).expect_err("refused");
    assert_eq!(error.field(), Some("cluster.secret"), "{error}");
}

#[test]
fn every_variable_overrides_its_field() {
    let names: Vec<String> = env_variable_names().collect();
    assert_eq!(names.len(), 54);
    assert!(names.contains(&"RATEMESH_CLUSTER_DEAD_MEMBER_FORGET_MS".to_owned()));
    assert_eq!(env_variable_name("listen.advertise_quic"), "RATEMESH_LISTEN_ADVERTISE_QUIC");
    // A value each field refuses: every variable must reach its own field's check.
    for name in &names {
        let error = parse_env("", &[(name.as_str(), "!")]).expect_err("refused");
        let field = error.field().expect("names a field").to_owned();
        let expected = name.trim_start_matches(ENV_PREFIX).to_ascii_lowercase();
        let path = field.split('[').next().unwrap_or_default().replacen('.', "_", 1);
        if name.starts_with("RATEMESH_CLUSTER_") && name.ends_with("_PATH") {
            // One certificate path alone is refused for lack of the others.
            assert!(path.starts_with("cluster_") && path.ends_with("_path"), "{name}: {error}");
        } else {
            assert_eq!(path, expected, "{name}: {error}");
        }
    }
}

#[test]
fn size_bound_and_files() {
    let big = "#".repeat(CONFIG_FILE_BYTES_MAX + 1);
    assert!(matches!(parse(&big), Err(ConfigError::TooLarge { .. })));

    let dir = std::env::temp_dir().join(format!("ratemeshd-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("ratemesh.toml");
    std::fs::write(&path, "[node]\nid = 3\n").expect("write");
    assert_eq!(Config::load(&path).expect("valid").node.id, NodeId(3));
    let config = Config::load_with_env(&path, [("RATEMESH_NODE_ID", "4")]).expect("valid");
    assert_eq!(config.node.id, NodeId(4));
    std::fs::write(&path, "[node]\nid = \"x\"\n").expect("write");
    let error = Config::load(&path).expect_err("invalid");
    assert!(error.to_string().starts_with(&format!("{}:2:", path.display())), "{error}");
    std::fs::write(&path, &big).expect("write");
    assert!(matches!(Config::load(&path), Err(ConfigError::TooLarge { .. })));
    std::fs::write(&path, b"\xff\xfe").expect("write");
    assert!(matches!(Config::load(&path), Err(ConfigError::Read { .. })));
    assert!(matches!(Config::load(&dir.join("missing.toml")), Err(ConfigError::Read { .. })));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn regions_are_checked() {
    let config = parse("").expect("valid");
    assert_eq!(config.node.region, Region::NONE, "no region by default: one region");
    assert_eq!(config.node_config().region, RegionId::NONE);
    assert_eq!(config.node.region_fallback, RegionFallback::Last);
    assert_eq!(parse("[node]\nregion = \"\"\n").expect("valid").node.region, Region::NONE);
    let long = "x".repeat(ratemesh::REGION_NAME_BYTES_MAX);
    let config = parse(&format!("[node]\nregion = \"{long}\"\n")).expect("valid");
    assert_eq!(config.node.region.name(), long);
    for bad in ["EU-West", "eu west", "eu/west", "région"] {
        let message = refused(&format!("[node]\nid = 2\nregion = \"{bad}\"\n"), "node.region", 3);
        assert!(message.contains("a-z, 0-9"), "{message}");
    }
    let message = refused(&format!("[node]\nregion = \"{long}x\"\n"), "node.region", 2);
    assert!(message.contains("at most 64 bytes"), "{message}");
    let message = refused("[node]\nregion_fallback = \"open\"\n", "node.region_fallback", 2);
    assert!(message.contains("floor, last or closed"), "{message}");
    refused("[node]\nregion_sync_interval_ms = 0\n", "node.region_sync_interval_ms", 2);
    refused("[node]\nregion_lease_ms = 0\n", "node.region_lease_ms", 2);
    let message =
        refused("[node]\nregion_sync_interval_ms = 500\nregion_lease_ms = 1000\n", "node.region_lease_ms", 3);
    assert!(message.contains("longer than twice node.region_sync_interval_ms"), "{message}");
    let config =
        parse_env("", &[("RATEMESH_NODE_REGION", "us-east-1"), ("RATEMESH_NODE_REGION_FALLBACK", "closed")])
            .expect("valid");
    assert_eq!(config.node.region.name(), "us-east-1");
    assert_eq!(config.node.region_fallback, RegionFallback::Closed);
    let error = parse_env("", &[("RATEMESH_NODE_REGION", "US")]).expect_err("refused");
    assert_eq!(error.location(), Some(&Location::Env { variable: "RATEMESH_NODE_REGION".to_owned() }));
}

#[test]
fn the_example_file_is_valid() {
    let config = parse(include_str!("../../ratemesh.example.toml")).expect("example validates");
    let names: Vec<&str> = config.policies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["api", "login", "upload", "exports", "edge-login-per-ip", "edge-api-per-ip", "edge-health"]
    );
    assert!(!config.cluster.auth.is_dev_secret());
}

#[test]
fn auth_headers_default_and_are_checked() {
    let config = Config::parse("", ORIGIN).expect("valid");
    assert_eq!(config.auth.policy_header, "x-ratelimit-policy");
    assert_eq!(config.auth.key_header, "x-ratelimit-key");
    let config = Config::parse("[auth]\npolicy_header = \"X-Limit\"\nkey_header = \"X-User_Id\"\n", ORIGIN)
        .expect("valid");
    assert_eq!(
        (config.auth.policy_header.as_str(), config.auth.key_header.as_str()),
        ("x-limit", "x-user_id")
    );
    let error = Config::parse("[auth]\nkey_header = \"X User\"\n", ORIGIN).expect_err("refused");
    assert_eq!(error.field(), Some("auth.key_header"), "{error}");
    assert_eq!(error.line(), Some(2), "{error}");
    let error = parse_env("", &[("RATEMESH_AUTH_POLICY_HEADER", "")]).expect_err("refused");
    assert_eq!(error.field(), Some("auth.policy_header"), "{error}");
}

#[test]
fn seeds_may_be_dns_names() {
    let text = "[cluster]\nseeds = [\"10.0.0.1:7946\", \"ratemesh-peers.default.svc.cluster.local:7946\"]\n";
    let config = parse(text).expect("valid");
    let shown: Vec<String> = config.cluster.seeds.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["10.0.0.1:7946", "ratemesh-peers.default.svc.cluster.local:7946"]);
    assert!(matches!(config.cluster.seeds[1], Seed::Host(_)));
    let name = refused("[cluster]\nseeds = [\"ratemesh peers:7946\"]\n", "cluster.seeds[0]", 2);
    assert!(name.contains("not a DNS name"), "{name}");
    refused("[cluster]\nseeds = [\"ratemesh-peers:0\"]\n", "cluster.seeds[0]", 2);
    refused("[cluster]\nseeds = [\"ratemesh-peers\"]\n", "cluster.seeds[0]", 2);
    let config = parse_env("", &[("RATEMESH_CLUSTER_SEEDS", "ratemesh:7946")]).expect("valid");
    assert_eq!(config.cluster.seeds, vec!["ratemesh:7946".parse::<Seed>().expect("a name")]);
}

#[test]
fn seed_resolution_and_leave_linger_are_bounded_settings() {
    let config = parse("").expect("valid");
    assert_eq!(config.cluster.seed_resolve_interval, Duration::from_secs(10));
    assert_eq!(config.cluster.leave_linger, Duration::from_secs(2));
    let text = "[cluster]\nseed_resolve_interval_ms = 30000\nleave_linger_ms = 0\n";
    let config = parse(text).expect("valid");
    assert_eq!(config.cluster.seed_resolve_interval, Duration::from_secs(30));
    assert_eq!(config.cluster.leave_linger, Duration::ZERO);
    refused("[cluster]\nseed_resolve_interval_ms = 10\n", "cluster.seed_resolve_interval_ms", 2);
    refused("[cluster]\nleave_linger_ms = 600000\n", "cluster.leave_linger_ms", 2);
}

#[test]
fn the_id_and_advertised_ip_may_come_from_the_environment() {
    let config = parse("[node]\nid_from = \"hostname\"\n").expect("valid");
    assert_eq!(config.node.id_from, Some(IdFrom::Hostname));
    let vars = [("RATEMESH_NODE_ID_FROM", "reverse_dns"), ("RATEMESH_LISTEN_ADVERTISE_IP_FROM", "hostname")];
    let wildcard = "[listen]\ngossip = \"0.0.0.0:7946\"\nquic = \"0.0.0.0:7947\"\n[cluster]\nsecret = \"0123456789abcdef\"\n";
    let config = parse_env(wildcard, &vars).expect("a wildcard listener with an IP found at start");
    assert_eq!(config.node.id_from, Some(IdFrom::ReverseDns));
    assert_eq!(config.listen.advertise_ip_from, Some(AdvertiseIpFrom::Hostname));
    let both = refused("[node]\nid = 2\nid_from = \"hostname\"\n", "node.id_from", 3);
    assert!(both.contains("conflicts with node.id"), "{both}");
    refused("[node]\nid_from = \"pod\"\n", "node.id_from", 2);
    refused("[listen]\nadvertise_ip_from = \"eth0\"\n", "listen.advertise_ip_from", 2);
    let text = "[listen]\nadvertise_ip_from = \"hostname\"\nadvertise_quic = \"10.0.0.1:7947\"\n";
    refused(text, "listen.advertise_quic", 3);
    refused(
        "[listen]\nadvertise_ip_from = \"hostname\"\nquic = \"127.0.0.1:0\"\n",
        "listen.advertise_ip_from",
        2,
    );
}

#[test]
fn overrides_and_tiers_are_validated_like_limits() {
    let good = POLICY.to_owned()
        + "overrides = [{ key = \"customer:acme\", limit = 1000 }]\ntiers = [{ name = \"pro\", limit = 500, burst = 600 }]\n";
    let config = parse(&good).expect("valid");
    let policy = &config.policies[0];
    assert_eq!(policy.overrides["customer:acme"].limit.spec().limit, 1000);
    assert_eq!(policy.tiers["pro"].limit.spec().burst, Some(600));
    refused(&(POLICY.to_owned() + "overrides = [{ limit = 5 }]\n"), "policies[0].overrides[0].key", 6);
    refused(
        &(POLICY.to_owned() + "tiers = [{ name = \"pro\", limit = 0 }]\n"),
        "policies[0].tiers[0].limit",
        6,
    );
    let duplicate = POLICY.to_owned() + "overrides = [{ key = \"a\" }, { key = \"a\", limit = 5 }]\n";
    refused(&duplicate, "policies[0].overrides[1].key", 6);
    refused(&(POLICY.to_owned() + "tiers = [{ key = \"pro\" }]\n"), "policies[0].tiers[0].key", 6);
    let calendar =
        "[[policies]]\nname = \"daily\"\nwindow = \"day\"\nlimit = 5\ntiers = [{ name = \"pro\" }]\n";
    refused(calendar, "policies[0].tiers", 5);
}

#[test]
fn all_or_nothing_domains_are_plain_names_of_policies_domains() {
    let domains = "[[policies]]\nname = \"a\"\ndomain = \"edge\"\ndescriptors = [{ key = \"k\" }]\nunlimited = true\n\
                   [[policies]]\nname = \"b\"\ndomain = \"envoy.api\"\ndescriptors = [{ key = \"k\" }]\nunlimited = true\n";
    let config = parse(&format!("[rls]\nall_or_nothing_domains = [\"edge\", \"envoy.api\"]\n{domains}"))
        .expect("valid");
    assert_eq!(config.rls.all_or_nothing_domains, ["edge", "envoy.api"]);
    refused(
        &format!("[rls]\nall_or_nothing_domains = [\"edge\", \"two words\"]\n{domains}"),
        "rls.all_or_nothing_domains[1]",
        2,
    );
    let misspelt = refused(
        &format!("[rls]\nall_or_nothing_domains = [\"edge\", \"envoy.apl\"]\n{domains}"),
        "rls.all_or_nothing_domains[1]",
        2,
    );
    assert!(misspelt.contains("no policy has this domain"), "{misspelt}");
    assert!(parse("").expect("valid").rls.all_or_nothing_domains.is_empty(), "none by default");
}

#[test]
fn grpc_tls_takes_a_certificate_and_a_key_and_a_client_ca_only_beside_them() {
    use crate::rls::tls::TlsFiles;
    assert_eq!(parse("").expect("valid").listen.grpc_tls, None);
    let text = "[listen]\ngrpc_tls_cert_path = \"/certs/tls.crt\"\ngrpc_tls_key_path = \"/certs/tls.key\"\n";
    let plain = TlsFiles { cert: "/certs/tls.crt".into(), key: "/certs/tls.key".into(), client_ca: None };
    assert_eq!(parse(text).expect("valid").listen.grpc_tls, Some(plain.clone()));
    let vars = [("RATEMESH_LISTEN_GRPC_TLS_CLIENT_CA_PATH", "/certs/ca.crt")];
    let mutual = parse_env(text, &vars).expect("valid").listen.grpc_tls;
    assert_eq!(mutual, Some(TlsFiles { client_ca: Some("/certs/ca.crt".into()), ..plain }));
    let alone =
        refused("[listen]\ngrpc_tls_cert_path = \"/certs/tls.crt\"\n", "listen.grpc_tls_cert_path", 2);
    assert!(alone.contains("needs listen.grpc_tls_cert_path and listen.grpc_tls_key_path"), "{alone}");
    refused("[listen]\ngrpc_tls_client_ca_path = \"/certs/ca.crt\"\n", "listen.grpc_tls_client_ca_path", 2);
    refused("[listen]\ngrpc_tls_key_path = \"\"\n", "listen.grpc_tls_key_path", 2);
}

#[test]
fn rlqs_domains_and_bounds() {
    let policy = POLICY;
    let config = parse("").expect("valid");
    assert_eq!(config.listen.rlqs, None, "the RLQS listener is off by default");
    assert_eq!(config.rlqs, RlqsSection::default());
    assert_eq!(config.rlqs.report_period, Duration::from_secs(5));
    assert_eq!(config.rlqs.unknown_domain, UnknownDomain::AllowAll);
    let text = format!(
        "[listen]\nrlqs = \"127.0.0.1:8083\"\n[limits]\nrlqs_streams_max = 7\nrlqs_buckets_per_stream_max = 9\n\
         [rls]\nrlqs_unknown_domain = \"deny_all\"\nrlqs_report_period_ms = 1000\nrlqs_abandon_after_periods = 2\nrlqs_sync_interval_ms = 250\n\
         {policy}[[rlqs]]\ndomain = \"edge\"\npolicy = \"api\"\n[[rlqs]]\ndomain = \"web\"\npolicy = \"api\"\n\
         key_entries = [\"user\", \"app\"]\n"
    );
    let config = parse(&text).expect("valid");
    assert_eq!(config.listen.rlqs, Some("127.0.0.1:8083".parse().expect("address")));
    assert_eq!((config.limits.rlqs_streams_max, config.limits.rlqs_buckets_per_stream_max), (7, 9));
    assert_eq!(config.rlqs.unknown_domain, UnknownDomain::DenyAll);
    assert_eq!(config.rlqs.report_period, Duration::from_secs(1));
    assert_eq!(config.rlqs.abandon_after_periods, 2);
    assert_eq!(config.rlqs.sync_interval, Duration::from_millis(250));
    assert_eq!(
        config.rlqs.domains,
        [
            RlqsDomain { domain: "edge".into(), policy: "api".into(), key_entries: None, tier_entry: None },
            RlqsDomain {
                domain: "web".into(),
                policy: "api".into(),
                key_entries: Some(vec!["user".into(), "app".into()]),
                tier_entry: None
            },
        ]
    );
    let env = parse_env("", &[("RATEMESH_LISTEN_RLQS", "127.0.0.1:9083")]).expect("valid");
    assert_eq!(env.listen.rlqs, Some("127.0.0.1:9083".parse().expect("address")));
    refused("[listen]\nrlqs = \"127.0.0.1:8081\"\n", "listen.rlqs", 2);
    refused("[rls]\nrlqs_unknown_domain = \"allow\"\n", "rls.rlqs_unknown_domain", 2);
    refused("[rls]\nrlqs_report_period_ms = 10\n", "rls.rlqs_report_period_ms", 2);
    refused("[rls]\nrlqs_sync_interval_ms = 5\n", "rls.rlqs_sync_interval_ms", 2);
    refused(&format!("{policy}[[rlqs]]\ndomain = \"edge\"\npolicy = \"apl\"\n"), "rlqs[0].policy", 8);
    refused(&format!("{policy}[[rlqs]]\npolicy = \"api\"\n"), "rlqs[0].domain", 6);
    refused(
        &format!(
            "{policy}[[rlqs]]\ndomain = \"e\"\npolicy = \"api\"\n[[rlqs]]\ndomain = \"e\"\npolicy = \"api\"\n"
        ),
        "rlqs[1].domain",
        10,
    );
    refused(
        &format!("{policy}[[rlqs]]\ndomain = \"e\"\npolicy = \"api\"\nkey_entries = [\"a\", \"a\"]\n"),
        "rlqs[0].key_entries[1]",
        9,
    );
    refused(
        &format!("{policy}[[rlqs]]\ndomain = \"e\"\npolicy = \"api\"\ntier_entry = \"\"\n"),
        "rlqs[0].tier_entry",
        9,
    );
}

#[test]
fn audits_are_checked_and_apply_to_tiers_overrides_and_calendar_windows() {
    use ratemesh_core::Audit;
    let policy = |extra: &str| {
        format!(
            "[[policies]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 100\nperiod_ms = 1000\n{extra}"
        )
    };
    let group = ratemesh::NamedPolicy::audit_group("api");
    let audit_of = |config: &Config| config.policies[0].rule.policy().expect("limited").audit;
    let config = parse(&policy("tiers = [{ name = \"pro\", limit = 500 }]\n")).expect("valid");
    assert_eq!(audit_of(&config), Audit::On { group, window: None }, "audited by default, under its name");
    assert_eq!(config.policies[0].tiers["pro"].audit, Audit::On { group, window: None });
    assert_eq!(config.node.audit_keys_max, ratemesh_core::AUDIT_KEYS_MAX_DEFAULT);
    assert_eq!(config.node_config().audit_keys_max, ratemesh_core::AUDIT_KEYS_MAX_DEFAULT);
    let config = parse(&policy(
        "audit_window_ms = 500\noverrides = [{ key = \"big\", limit = 1000 }]\n[node]\naudit_keys_max = 0\n",
    ))
    .expect("valid");
    let half = Audit::On { group, window: Some(Duration::from_millis(500)) };
    assert_eq!((audit_of(&config), config.policies[0].overrides["big"].audit), (half, half));
    assert_eq!(config.node_config().audit_keys_max, 0, "0: nothing audited");
    assert_eq!(audit_of(&parse(&policy("audit = false\n")).expect("valid")), Audit::Off);
    let calendar = "[[policies]]\nname = \"day\"\nwindow = \"day\"\nlimit = 10\naudit = false\n";
    assert_eq!(parse(calendar).expect("valid").policies[0].rule.policy().expect("limited").audit, Audit::Off);
    let concurrency =
        "[[policies]]\nname = \"c\"\nalgorithm = \"concurrency\"\nlimit = 5\nperiod_ms = 1000\n";
    assert_eq!(
        parse(concurrency).expect("valid").policies[0].rule.policy().expect("limited").audit,
        Audit::Off
    );
    let message =
        refused(&format!("{concurrency}audit_window_ms = 1000\n"), "policies[0].audit_window_ms", 6);
    assert!(message.contains("not audited"), "{message}");
    let message =
        refused(&policy("audit = false\naudit_window_ms = 1000\n"), "policies[0].audit_window_ms", 7);
    assert!(message.contains("audit = false"), "{message}");
    for bad in [0, 9, 86_400_001] {
        let message =
            refused(&policy(&format!("audit_window_ms = {bad}\n")), "policies[0].audit_window_ms", 6);
        assert!(message.contains("10 to 86400000"), "{message}");
    }
    refused(&policy("audit = 1\n"), "policies[0].audit", 6);
    refused("[node]\naudit_keys_max = 16777217\n", "node.audit_keys_max", 2);
    let unlimited = "[[policies]]\nname = \"u\"\ndomain = \"d\"\ndescriptors = [{ key = \"k\" }]\nunlimited = true\naudit = true\n";
    refused(unlimited, "policies[0].audit", 6);
}
