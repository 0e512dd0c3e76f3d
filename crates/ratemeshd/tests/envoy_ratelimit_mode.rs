//! `ratemeshd envoy-ratelimit`: answers as envoyproxy/ratelimit gives them (its
//! `test/service/ratelimit_test.go`: `replaces`, per-descriptor and global shadow mode, its
//! headers), bad files refused with the running configuration kept, and the command end to end
//! on loopback (environment, gRPC, `/healthcheck`, `/json`, `/rlconfig`, reloads).

use std::ffi::OsString;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use ratemeshd::Daemon;
use ratemeshd::daemon::{ConfigSource, ReloadError};
use ratemeshd::envoy_ratelimit::{FILE_BYTES_MAX, Settings};
use ratemeshd::rls::RlsService;

mod support;
use support::{code, descriptor, overall, request};

/// The daemon's own settings: everything on loopback, ports chosen by the system.
const BASE: &str = r#"
[listen]
http = "127.0.0.1:0"
grpc = "127.0.0.1:0"
gossip = "127.0.0.1:0"
quic = "127.0.0.1:0"
"#;

const LIMITS: &str = r#"
domain: shop
descriptors:
  - key: api
    rate_limit: {name: global, unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit:
      name: per-user
      unit: MINUTE
      requests_per_unit: 100
      replaces: [{name: global}]
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: banned
    rate_limit: {name: banned, unit: minute, requests_per_unit: 0}
  - key: pardon
    rate_limit: {unit: minute, requests_per_unit: 5, replaces: [{name: banned}]}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

/// A temporary `RUNTIME_ROOT` with `config/` and a base TOML file.
struct Root(PathBuf);

impl Root {
    fn new(name: &str) -> Root {
        let dir = std::env::temp_dir().join(format!("ratemeshd-envoy-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("config")).expect("temp dir");
        std::fs::write(dir.join("base.toml"), BASE).expect("base file");
        Root(dir)
    }

    fn write(&self, name: &str, text: &str) {
        // Written aside, then renamed: the watcher never sees half a file.
        let tmp = self.0.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, self.0.join("config").join(name)).expect("rename");
    }

    fn vars(&self, extra: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        let mut vars =
            vec![("RUNTIME_ROOT", self.0.to_str().expect("utf-8 path")), ("RUNTIME_SUBDIRECTORY", "")];
        vars.extend_from_slice(extra);
        vars.into_iter().map(|(k, v)| (k.into(), v.into())).collect()
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn daemon(root: &Root, extra: &[(&str, &str)]) -> Arc<Daemon> {
    let settings = Settings::from_vars(root.vars(extra)).expect("settings");
    let mut source = ConfigSource::envoy_ratelimit(settings, Some(root.0.join("base.toml")), Vec::new());
    let config = source.load().expect("valid config");
    Daemon::start_with_source(config, Some(source)).await.expect("daemon starts")
}

/// A request of the `shop` domain, one single-entry descriptor per pair.
fn shop(pairs: &[(&str, &str)]) -> RateLimitRequest {
    request("shop", pairs.iter().map(|pair| descriptor(&[*pair])).collect())
}

async fn ask(service: &RlsService, descriptors: &[(&str, &str)]) -> RateLimitResponse {
    service.should_rate_limit_request(&shop(descriptors)).await.expect("answered")
}

fn limit_of(status: &DescriptorStatus) -> Option<(String, u32)> {
    status.current_limit.as_ref().map(|limit| (limit.name.clone(), limit.requests_per_unit))
}

#[tokio::test]
async fn a_replaced_limit_is_not_applied_when_the_replacing_one_matches() {
    let root = Root::new("replaces");
    root.write("limits.yaml", LIMITS);
    let daemon = daemon(&root, &[]).await;
    let service = RlsService::new(Arc::clone(&daemon));
    for _ in 0..3 {
        let response = ask(&service, &[("api", "x"), ("user", "bob")]).await;
        assert_eq!(overall(&response), Code::Ok);
        assert_eq!((code(&response.statuses[0]), limit_of(&response.statuses[0])), (Code::Ok, None));
        assert_eq!(limit_of(&response.statuses[1]), Some(("per-user".to_owned(), 100)));
    }
    // Without the replacing limit, the replaced one applies: 1 per minute.
    let first = ask(&service, &[("api", "x")]).await;
    assert_eq!(limit_of(&first.statuses[0]), Some(("global".to_owned(), 1)));
    assert_eq!(overall(&first), Code::Ok);
    assert_eq!(overall(&ask(&service, &[("api", "x")]).await), Code::OverLimit);
    daemon.shutdown().await;
}

#[tokio::test]
async fn shadow_mode_answers_ok_with_the_limit_and_nothing_remaining() {
    let root = Root::new("shadow");
    root.write("limits.yaml", LIMITS);
    let daemon = daemon(&root, &[]).await;
    let service = RlsService::new(Arc::clone(&daemon));
    ask(&service, &[("shadow", "a")]).await;
    let over = ask(&service, &[("shadow", "a")]).await;
    assert_eq!(overall(&over), Code::Ok);
    assert_eq!(code(&over.statuses[0]), Code::Ok);
    assert_eq!(limit_of(&over.statuses[0]), Some((String::new(), 1)));
    assert_eq!(over.statuses[0].limit_remaining, 0);
    let free = ask(&service, &[("free", "a")]).await;
    assert_eq!((code(&free.statuses[0]), free.statuses[0].limit_remaining), (Code::Ok, u32::MAX));
    assert!(free.response_headers_to_add.is_empty(), "no headers unless LIMIT_RESPONSE_HEADERS_ENABLED");
    daemon.shutdown().await;
}

#[tokio::test]
async fn global_shadow_mode_makes_the_overall_code_ok_and_keeps_the_statuses() {
    let root = Root::new("global-shadow");
    root.write("limits.yaml", LIMITS);
    let daemon = daemon(&root, &[("SHADOW_MODE", "true")]).await;
    let service = RlsService::new(Arc::clone(&daemon));
    ask(&service, &[("api", "x")]).await;
    let over = ask(&service, &[("api", "x")]).await;
    assert_eq!(overall(&over), Code::Ok);
    assert_eq!(code(&over.statuses[0]), Code::OverLimit);
    daemon.shutdown().await;
}

#[tokio::test]
async fn response_headers_are_upstreams_when_enabled() {
    let root = Root::new("headers");
    root.write("limits.yaml", LIMITS);
    let daemon =
        daemon(&root, &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true"), ("LIMIT_RESET_HEADER", "X-Reset")]).await;
    let service = RlsService::new(Arc::clone(&daemon));
    let response = ask(&service, &[("user", "bob"), ("free", "a")]).await;
    let headers: Vec<(&str, &str)> =
        response.response_headers_to_add.iter().map(|h| (h.key.as_str(), h.value.as_str())).collect();
    assert_eq!(headers[..2], [("RateLimit-Limit", "100"), ("RateLimit-Remaining", "99")]);
    assert_eq!(headers[2].0, "X-Reset");
    let reset: u64 = headers[2].1.parse().expect("seconds");
    assert!((1..=60).contains(&reset), "{reset}");
    // Whole seconds, as upstream: the header and the status agree.
    let until_reset = response.statuses[0].duration_until_reset.expect("set");
    assert_eq!((until_reset.seconds, until_reset.nanos), (i64::try_from(reset).expect("small"), 0));
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_zero_limit_is_over_until_replaced() {
    let root = Root::new("zero");
    root.write("limits.yaml", LIMITS);
    let daemon = daemon(&root, &[]).await;
    let service = RlsService::new(Arc::clone(&daemon));
    let banned = ask(&service, &[("banned", "x")]).await;
    assert_eq!(overall(&banned), Code::OverLimit);
    assert_eq!(limit_of(&banned.statuses[0]), Some(("banned".to_owned(), 0)));
    let reset = banned.statuses[0].duration_until_reset.expect("reset").seconds;
    assert!((0..=60).contains(&reset), "{reset}");
    let pardoned = ask(&service, &[("banned", "x"), ("pardon", "y")]).await;
    assert_eq!(overall(&pardoned), Code::Ok);
    assert_eq!(limit_of(&pardoned.statuses[0]), None);
    daemon.shutdown().await;
}

#[tokio::test]
async fn quota_mode_fails_a_call_only_when_every_quota_descriptor_is_over() {
    let root = Root::new("quota");
    root.write("limits.yaml", LIMITS);
    let daemon = daemon(&root, &[]).await;
    let service = RlsService::new(Arc::clone(&daemon));
    assert_eq!(overall(&ask(&service, &[("quota", "a"), ("quota", "b")]).await), Code::Ok);
    // "a" is over its quota, "b" is not yet: the call passes.
    let one = ask(&service, &[("quota", "a"), ("quota", "c")]).await;
    assert_eq!((code(&one.statuses[0]), overall(&one)), (Code::OverLimit, Code::Ok));
    // Both over: the call is over.
    assert_eq!(overall(&ask(&service, &[("quota", "a"), ("quota", "b")]).await), Code::OverLimit);
    // A descriptor not in quota mode over its limit fails the call whatever the quotas say.
    ask(&service, &[("api", "q")]).await;
    assert_eq!(overall(&ask(&service, &[("api", "q"), ("quota", "d")]).await), Code::OverLimit);
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_limit_override_applies_to_any_descriptor_of_a_known_domain() {
    let root = Root::new("override");
    root.write("limits.yaml", LIMITS);
    let daemon = daemon(&root, &[]).await;
    let service = RlsService::new(Arc::clone(&daemon));
    let with_override = |domain: &str| {
        let mut descriptor = descriptor(&[("unlisted", "x")]);
        descriptor.limit =
            Some(RateLimitOverride { requests_per_unit: 1, unit: RateLimitUnit::Minute.into() });
        request(domain, vec![descriptor])
    };
    let first = service.should_rate_limit_request(&with_override("shop")).await.expect("answered");
    assert_eq!((overall(&first), limit_of(&first.statuses[0])), (Code::Ok, Some((String::new(), 1))));
    let second = service.should_rate_limit_request(&with_override("shop")).await.expect("answered");
    assert_eq!(overall(&second), Code::OverLimit);
    let unknown = service.should_rate_limit_request(&with_override("elsewhere")).await.expect("answered");
    assert_eq!((overall(&unknown), limit_of(&unknown.statuses[0])), (Code::Ok, None));
    // On a matching limit too, in place of it: no name, and shadow mode does not apply.
    let mut shadow = descriptor(&[("shadow", "z")]);
    shadow.limit = Some(RateLimitOverride { requests_per_unit: 1, unit: RateLimitUnit::Hour.into() });
    let request = request("shop", vec![shadow]);
    service.should_rate_limit_request(&request).await.expect("answered");
    let over = service.should_rate_limit_request(&request).await.expect("answered");
    assert_eq!((overall(&over), limit_of(&over.statuses[0])), (Code::OverLimit, Some((String::new(), 1))));
    daemon.shutdown().await;
}

/// Writes `text` as a second file and reloads: refused with `expected` in the error, and the
/// running configuration still answers.
async fn refused(daemon: &Daemon, root: &Root, name: &str, text: &[u8], expected: &str) {
    let path = root.0.join("config").join(name);
    std::fs::write(&path, text).expect("write");
    match daemon.reload() {
        Err(error @ ReloadError::EnvoyRatelimit(_)) => {
            let message = error.to_string();
            assert!(message.contains(expected), "{name}: {message:?} lacks {expected:?}");
        }
        other => panic!("{name}: {other:?}"),
    }
    let (config, _) = daemon.current();
    let answers = config.rls.envoy_ratelimit.as_ref().expect("envoy-ratelimit mode");
    assert!(answers.dump.starts_with("shop.api: unit=MINUTE requests_per_unit=1"), "{}", answers.dump);
    std::fs::remove_file(&path).expect("remove");
}

#[tokio::test]
async fn bad_files_are_refused_and_the_running_configuration_stays() {
    let root = Root::new("bad");
    root.write("limits.yaml", LIMITS);
    let daemon = daemon(&root, &[]).await;
    let limited = |unit: &str, requests: &str| {
        format!(
            "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, requests_per_unit: {requests}}}\n"
        )
    };
    refused(&daemon, &root, "dup-domain.yaml", b"domain: shop\n", "duplicate domain 'shop' in config file")
        .await;
    let duplicate = "domain: other\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n";
    refused(
        &daemon,
        &root,
        "dup-key.yaml",
        duplicate.as_bytes(),
        "duplicate descriptor composite key 'other.k_v'",
    )
    .await;
    refused(
        &daemon,
        &root,
        "unit.yaml",
        limited("fortnight", "1").as_bytes(),
        "invalid rate limit unit 'fortnight'",
    )
    .await;
    refused(
        &daemon,
        &root,
        "negative.yaml",
        limited("second", "-5").as_bytes(),
        "requests_per_unit: -5 is not",
    )
    .await;
    refused(&daemon, &root, "overflow.yaml", limited("second", "4294967296").as_bytes(), "4294967296 is not")
        .await;
    let huge = vec![b'#'; FILE_BYTES_MAX + 1];
    refused(&daemon, &root, "huge.yaml", &huge, "huge.yaml: larger than").await;
    let mut deep = String::from("domain: deep\ndescriptors:\n");
    for level in 0..1000 {
        let indent = "  ".repeat(level * 2);
        deep.push_str(&format!("{indent}- key: k{level}\n{indent}  descriptors:\n"));
    }
    refused(&daemon, &root, "deep.yaml", deep.as_bytes(), "nested deeper than").await;
    refused(&daemon, &root, "binary.yaml", &[0xff, 0xfe, 0x00], "binary.yaml: cannot read: not UTF-8").await;
    // Still answering on the configuration it had.
    let service = RlsService::new(Arc::clone(&daemon));
    let response = ask(&service, &[("user", "bob")]).await;
    assert_eq!(limit_of(&response.statuses[0]), Some(("per-user".to_owned(), 100)));
    daemon.shutdown().await;
}

/// A port free now (bound and released: the command is given fixed ports, as in a pod).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

struct Process {
    child: Child,
    log: PathBuf,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- ratemeshd log ---\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
        }
    }
}

fn spawn(root: &Root, ports: [u16; 3]) -> Process {
    let log = root.0.join("ratemeshd.log");
    let out = std::fs::File::create(&log).expect("log file");
    let [http, grpc, debug] = ports.map(|port| port.to_string());
    let child = Command::new(env!("CARGO_BIN_EXE_ratemeshd"))
        .arg("envoy-ratelimit")
        .env_clear()
        .env("RUNTIME_ROOT", &root.0)
        .env("RUNTIME_SUBDIRECTORY", "")
        .env("HOST", "127.0.0.1")
        .env("GRPC_HOST", "127.0.0.1")
        .env("DEBUG_HOST", "127.0.0.1")
        .env("PORT", http)
        .env("GRPC_PORT", grpc)
        .env("DEBUG_PORT", debug)
        .env("REDIS_URL", "redis:6379")
        .env("LOG_LEVEL", "info")
        .env("RATEMESH_LISTEN_GOSSIP", "127.0.0.1:0")
        .env("RATEMESH_LISTEN_QUIC", "127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .spawn()
        .expect("ratemeshd starts");
    Process { child, log }
}

async fn get(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Option<ratemeshd::client::Response> {
    let headers = [("Content-Type", "application/json")];
    ratemeshd::client::request(&addr.to_string(), method, path, &headers, body, Duration::from_secs(5))
        .await
        .ok()
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn log_has(log: &Path, text: &str) -> bool {
    std::fs::read_to_string(log).is_ok_and(|log| log.contains(text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_serves_reloads_and_keeps_the_last_good_configuration() {
    let root = Root::new("process");
    root.write(
        "limits.yaml",
        "domain: shop\ndescriptors:\n  - key: api\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    );
    let ports = [free_port(), free_port(), free_port()];
    let process = spawn(&root, ports);
    let [http, grpc, debug] = ports.map(|port| SocketAddr::from(([127, 0, 0, 1], port)));
    eventually("/healthcheck", || async {
        get(http, "GET", "/healthcheck", &[]).await.is_some_and(|r| r.status == 200 && r.text() == "OK")
    })
    .await;
    assert!(log_has(&process.log, "REDIS_URL"), "the ignored variables are logged");
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}")).await.expect("gRPC connects");
    let mut call = async |descriptors: &[(&str, &str)]| {
        let response = client.should_rate_limit(shop(descriptors)).await.expect("answered").into_inner();
        overall(&response)
    };
    assert_eq!(call(&[("api", "a")]).await, Code::Ok);
    assert_eq!(call(&[("api", "a")]).await, Code::Ok);
    assert_eq!(call(&[("api", "a")]).await, Code::OverLimit);
    // POST /json answers as the gRPC call does, 429 when over the limit.
    let body = br#"{"domain":"shop","descriptors":[{"entries":[{"key":"api","value":"a"}]}]}"#;
    let over = get(http, "POST", "/json", body).await.expect("answered");
    assert_eq!(over.status, 429, "{}", over.text());
    assert_eq!(over.json().expect("json")["overallCode"], "OVER_LIMIT");
    assert_eq!(get(http, "POST", "/json", b"{\"nope\":1}").await.expect("answered").status, 400);

    // A changed file applies.
    root.write(
        "limits.yaml",
        "domain: shop\ndescriptors:\n  - key: api\n    rate_limit: {unit: hour, requests_per_unit: 50}\n",
    );
    let shows = |addr: SocketAddr, text: &'static str| async move {
        get(addr, "GET", "/rlconfig", &[]).await.is_some_and(|r| r.text().contains(text))
    };
    eventually("the new configuration", || shows(http, "unit=HOUR requests_per_unit=50")).await;
    assert!(shows(debug, "shop.api: unit=HOUR requests_per_unit=50").await, "DEBUG_PORT serves /rlconfig");
    assert_eq!(call(&[("api", "b")]).await, Code::Ok);

    // A bad file is refused: logged, and the last good configuration stays.
    root.write("broken.yaml", "domain: shop\n");
    eventually("the refusal in the log", || async { log_has(&process.log, "duplicate domain 'shop'") }).await;
    assert!(shows(http, "unit=HOUR requests_per_unit=50").await);
    assert_eq!(call(&[("api", "b")]).await, Code::Ok);
    let answered = get(http, "GET", "/healthcheck", &[]).await.expect("answered");
    assert_eq!(answered.status, 200);
}
