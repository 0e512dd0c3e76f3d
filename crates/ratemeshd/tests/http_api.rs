//! The HTTP API of an in-process daemon on ephemeral ports, spoken over raw HTTP/1.1: every
//! endpoint's happy path, bad input of every kind (each a clear 4xx JSON naming the field, and
//! the node keeps serving), hot reload, load shedding, connection bounds and time bounds,
//! readiness, and shutdown.
//!
//! Every wait is on a signal (a watch channel) or a bounded poll, never a sleep.
//!
//! Long (one file per front end): every test shares its harness and policy file.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratemesh::{CheckError, MemberStatus};
use ratemeshd::ConfigError;
use ratemeshd::client::{self, Response};
use ratemeshd::config::LogLevel;
use ratemeshd::daemon::{ConfigSource, Daemon, OBSERVE_IN_FLIGHT_MAX, ReloadError, Reloaded};
use ratemeshd::serve::{self, Options, Servers};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The bound of one request, and of every wait.
const TIMEOUT: Duration = Duration::from_secs(20);

/// Every listener on an ephemeral loopback port; bodies up to 128 KiB so that a 64 KiB key
/// reaches the key check (and is refused there, naming `key`).
const BASE: &str = r#"
[listen]
http = "127.0.0.1:0"
grpc = "127.0.0.1:0"
gossip = "127.0.0.1:0"
quic = "127.0.0.1:0"

[limits]
http_body_bytes_max = 131072
http_in_flight_max = 4
batch_len_max = 10

[log]
level = "info"
"#;

/// The algorithms, each as a policy of that name: 3 per hour, exact mode.
const ALGORITHMS: [&str; 8] = [
    "token_bucket",
    "gcra",
    "leaky_bucket",
    "fixed_window",
    "sliding_window_counter",
    "sliding_window_log",
    "concurrency",
    "expiring_counter",
];

/// Whether `algorithm` has a burst parameter (its default is 1 for GCRA and the shaper: set it
/// to the limit so that every algorithm admits 3 in a row).
fn takes_burst(algorithm: &str) -> bool {
    matches!(algorithm, "token_bucket" | "gcra" | "leaky_bucket")
}

fn policies() -> String {
    let mut text = String::new();
    for algorithm in ALGORITHMS {
        let burst = if takes_burst(algorithm) { "burst = 3\n" } else { "" };
        text.push_str(&format!(
            "[[policies]]\nname = \"{algorithm}\"\nalgorithm = \"{algorithm}\"\nlimit = 3\nperiod_ms = 3600000\n{burst}mode = \"exact\"\n\n"
        ));
    }
    text.push_str(
        r#"
[[policies]]
name = "login"
algorithm = "fixed_window"
limit = 2
period_ms = 3600000
mode = "exact"
home_region = "eu-west"
region_fallback = "closed"

[[policies]]
name = "shadow"
algorithm = "fixed_window"
limit = 1
period_ms = 3600000
mode = "exact"
shadow_mode = true

[[policies]]
name = "free"
domain = "edge"
descriptors = [{ key = "internal" }]
unlimited = true

[[policies]]
name = "envoy"
domain = "edge"
descriptors = [{ key = "remote_address" }]
algorithm = "gcra"
limit = 10
period_ms = 1000
"#,
    );
    text
}

/// A daemon serving on ephemeral ports, its configuration in a scratch file.
struct Harness {
    servers: Option<Servers>,
    daemon: Arc<Daemon>,
    addr: String,
    path: PathBuf,
    dir: PathBuf,
}

impl Harness {
    async fn start(name: &str, config: &str) -> Harness {
        Harness::start_with(name, config, Options::default()).await
    }

    async fn start_with(name: &str, config: &str, options: Options) -> Harness {
        let dir = std::env::temp_dir().join(format!("ratemeshd-http-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let path = dir.join("ratemesh.toml");
        std::fs::write(&path, config).expect("write config");
        let mut source = ConfigSource::new(path.clone(), std::iter::empty());
        let config = source.load().expect("valid config");
        let daemon = Daemon::start_with_source(config, Some(source)).await.expect("daemon starts");
        let servers = serve::start_with(Arc::clone(&daemon), options).await.expect("servers start");
        let addr = servers.http_addr().to_string();
        assert!(servers.grpc_addr().is_some_and(|addr| addr.port() != 0), "gRPC bound");
        Harness { servers: Some(servers), daemon, addr, path, dir }
    }

    async fn standard(name: &str) -> Harness {
        Harness::start(name, &format!("{BASE}\n{}", policies())).await
    }

    async fn request(&self, method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        client::request(&self.addr, method, target, headers, body, TIMEOUT).await.expect("an answer")
    }

    async fn post(&self, path: &str, body: &Value) -> Response {
        self.post_raw(path, body.to_string().as_bytes()).await
    }

    async fn post_raw(&self, path: &str, body: &[u8]) -> Response {
        self.request("POST", path, &[("Content-Type", "application/json")], body).await
    }

    async fn get(&self, target: &str) -> Response {
        self.request("GET", target, &[], &[]).await
    }

    fn servers(&self) -> &Servers {
        self.servers.as_ref().expect("serving")
    }

    async fn stop(mut self) {
        if let Some(servers) = self.servers.take() {
            servers.shutdown().await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn json_of(response: &Response) -> Value {
    response.json().unwrap_or_else(|e| panic!("JSON body ({e}): {}", response.text()))
}

/// Asserts a JSON error answer with `status`, naming `field` when given.
#[track_caller]
fn assert_error(response: &Response, status: u16, field: Option<&str>, what: &str) {
    assert_eq!(response.status, status, "{what}: {}", response.text());
    assert_eq!(response.header("content-type"), Some("application/json"), "{what}");
    let body = json_of(response);
    assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "{what}: {body}");
    if let Some(field) = field {
        assert_eq!(body["field"], json!(field), "{what}: {body}");
    }
}

/// Asserts the good request the node must answer after any bad one.
async fn assert_still_serving(h: &Harness) {
    let r = h.post("/v1/check", &json!({"key": "alive", "policy": "free"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(json_of(&r)["allowed"], json!(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_admits_then_refuses_with_headers() {
    let h = Harness::standard("algorithms").await;
    for algorithm in ALGORITHMS {
        for (how, body) in [
            ("named", json!({"key": "k", "policy": algorithm})),
            (
                "inline",
                json!({"key": "k", "limit": {
                    "algorithm": algorithm, "limit": 3, "period_ms": 3600000, "mode": "exact",
                    "burst": takes_burst(algorithm).then_some(3),
                }}),
            ),
        ] {
            let label = if how == "named" { algorithm } else { "inline" };
            let mut admitted = 0;
            let mut refused = None;
            // Bounded: every algorithm refuses within a few checks of a limit of 3 per hour.
            for _ in 0..10 {
                let r = h.post("/v1/check", &body).await;
                assert_eq!(r.status, 200, "{algorithm} {how}: {}", r.text());
                let answer = json_of(&r);
                assert_eq!(answer["limit"], json!(3), "{algorithm} {how}: {answer}");
                assert_eq!(r.header("x-ratelimit-limit"), Some("3"), "{algorithm} {how}");
                assert!(r.header("x-ratelimit-remaining").is_some(), "{algorithm} {how}");
                assert!(r.header("x-ratelimit-reset").is_some(), "{algorithm} {how}");
                let policy_header = format!("\"{label}\";q=3;w=3600");
                assert_eq!(r.header("ratelimit-policy"), Some(policy_header.as_str()), "{algorithm} {how}");
                assert_eq!(answer.get("delay_ms").is_some(), algorithm == "leaky_bucket", "{answer}");
                assert_eq!(
                    answer.get("lease").is_some(),
                    algorithm == "concurrency" && answer["allowed"] == true
                );
                if answer["allowed"] == json!(true) {
                    admitted += 1;
                    assert_eq!(answer["retry_after_ms"], Value::Null);
                } else {
                    assert!(
                        r.header("retry-after").is_some(),
                        "{algorithm} {how}: refused without Retry-After"
                    );
                    assert!(answer["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{answer}");
                    refused = Some(answer);
                    break;
                }
            }
            assert!(refused.is_some(), "{algorithm} {how}: never refused");
            // The shaper, like nginx's limit_req with burst=3, passes one hit plus 3 queued.
            let expected = if algorithm == "leaky_bucket" { 4 } else { 3 };
            assert_eq!(admitted, expected, "{algorithm} {how}: a limit (and burst) of 3");
        }
    }
    // The two families of buckets are apart: a named policy and an inline limit with the same
    // parameters and key do not share a bucket (each admitted 3 above).
    let metrics = h.get("/metrics").await.text();
    assert!(metrics.contains(r#"ratemesh_requests_total{policy="gcra",decision="allowed"} 3"#), "{metrics}");
    let inline_refused = format!(r#"ratemesh_over_limit_total{{policy="inline"}} {}"#, ALGORITHMS.len());
    assert!(metrics.contains(&inline_refused), "{metrics}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_checks_take_nothing_and_batches_answer_in_order() {
    let h = Harness::standard("batch").await;
    let query = h.post("/v1/check", &json!({"key": "q", "policy": "login", "cost": 0})).await;
    assert_eq!(json_of(&query)["remaining"], json!(2), "cost 0 takes nothing");
    let batch = json!([
        {"key": "b", "policy": "login"},
        {"key": "b", "policy": "login"},
        {"key": "b", "policy": "login"},
        {"key": "b", "policy": "free"},
        {"key": "b", "limit": {"algorithm": "token_bucket", "limit": 1, "period_ms": 1000}},
    ]);
    let r = h.post("/v1/check/batch", &batch).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let answers = json_of(&r);
    let allowed: Vec<_> = answers.as_array().expect("array").iter().map(|a| a["allowed"].clone()).collect();
    assert_eq!(allowed, [json!(true), json!(true), json!(false), json!(true), json!(true)]);
    let r = h.post("/v1/check/batch", &json!([{"key": "b", "policy": "login"}, {"policy": "login"}])).await;
    assert_error(&r, 400, Some("[1].key"), "batch item without key");
    let r = h.post("/v1/check/batch", &json!([{"key": "b", "policy": "nope"}])).await;
    assert_error(&r, 404, Some("[0].policy"), "batch item with an unknown policy");
    let long: Vec<Value> = (0..11).map(|_| json!({"key": "b", "policy": "free"})).collect();
    let r = h.post("/v1/check/batch", &Value::Array(long)).await;
    assert_error(&r, 400, Some("[10]"), "batch over batch_len_max");
    let r = h.post("/v1/check/batch", &json!({"key": "b"})).await;
    assert_error(&r, 400, None, "batch that is not an array");
    let r = h.post("/v1/check/batch", &json!([])).await;
    assert_eq!((r.status, json_of(&r)), (200, json!([])), "an empty batch is an empty answer");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_concurrency_lease_admits_the_next_request() {
    let config = format!(
        "{BASE}\n[[policies]]\nname = \"jobs\"\nalgorithm = \"concurrency\"\nlimit = 1\nperiod_ms = 60000\nmode = \"exact\"\n\n\
         [[policies]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 5\nperiod_ms = 1000\n"
    );
    let h = Harness::start("release", &config).await;
    let first = json_of(&h.post("/v1/check", &json!({"key": "w", "policy": "jobs"})).await);
    assert_eq!(first["allowed"], json!(true), "{first}");
    // A decimal string: lease ids use all 64 bits, beyond what JavaScript numbers hold.
    let lease = first["lease"].as_str().expect("a lease, as a string").to_owned();
    assert!(lease.parse::<u64>().is_ok(), "{lease}");
    let second = json_of(&h.post("/v1/check", &json!({"key": "w", "policy": "jobs"})).await);
    assert_eq!(second["allowed"], json!(false), "one lease at a time: {second}");
    let r = h.post("/v1/release", &json!({"key": "w", "policy": "jobs"})).await;
    assert_error(&r, 400, Some("lease"), "release without lease");
    let r = h.post("/v1/release", &json!({"key": "w", "policy": "api", "lease": lease})).await;
    assert_error(&r, 400, Some("policy"), "release under a non-concurrency policy");
    let r = h.post("/v1/release", &json!({"key": "w", "policy": "nope", "lease": lease})).await;
    assert_error(&r, 404, Some("policy"), "release under an unknown policy");
    // A proxy's auth subrequest could never give its lease back.
    assert_error(
        &h.get("/v1/auth?policy=jobs&key=w").await,
        400,
        Some("policy"),
        "auth of a concurrency limit",
    );
    let r = h.post("/v1/release", &json!({"key": "w", "policy": "jobs", "lease": lease})).await;
    assert_eq!((r.status, json_of(&r)), (200, json!({"released": true})));
    let r = h.post("/v1/release", &json!({"key": "w", "policy": "jobs", "lease": lease})).await;
    assert_eq!((r.status, json_of(&r)), (200, json!({"released": false})), "released already: not held");
    let third = json_of(&h.post("/v1/check", &json!({"key": "w", "policy": "jobs"})).await);
    assert_eq!(third["allowed"], json!(true), "the lease was given back: {third}");
    // Inline concurrency limits release the same way.
    let inline = json!({"algorithm": "concurrency", "limit": 1, "period_ms": 60000, "mode": "exact"});
    let taken = json_of(&h.post("/v1/check", &json!({"key": "i", "limit": inline})).await);
    // Given back as a number, as earlier versions wrote it: accepted too.
    let lease: u64 = taken["lease"].as_str().expect("a lease").parse().expect("decimal");
    let r = h.post("/v1/release", &json!({"key": "i", "limit": inline, "lease": lease})).await;
    assert_eq!((r.status, json_of(&r)), (200, json!({"released": true})));
    let again = json_of(&h.post("/v1/check", &json!({"key": "i", "limit": inline})).await);
    assert_eq!(again["allowed"], json!(true), "{again}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_answers_200_then_429_with_headers() {
    let h = Harness::standard("auth").await;
    for _ in 0..2 {
        let r = h.get("/v1/auth?policy=login&key=10.0.0.1").await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    }
    let r = h.get("/v1/auth?policy=login&key=10.0.0.1").await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert!(r.header("retry-after").and_then(|s| s.parse::<u64>().ok()).is_some_and(|s| s >= 1));
    assert_eq!(r.header("ratelimit-policy"), Some(r#""login";q=2;w=3600"#));
    assert!(r.header("ratelimit").is_some_and(|v| v.starts_with(r#""login";r=0;t="#)));
    assert!(r.header("x-ratelimit-reset").is_some());
    assert_eq!(json_of(&r)["allowed"], json!(false));

    // The same bucket from the headers a proxy sets: the policy header, and the client address
    // as the proxy saw it: the last X-Forwarded-For entry (the one the proxy appended). What the
    // client put before it is not trusted: a made-up first entry gets no fresh bucket.
    let headers = [("X-RateLimit-Policy", "login"), ("X-Forwarded-For", "203.0.113.9, 10.0.0.1")];
    let r = h.request("GET", "/v1/auth", &headers, &[]).await;
    assert_eq!(r.status, 429, "X-Forwarded-For's last entry is the key: {}", r.text());
    let headers = [
        ("X-RateLimit-Policy", "login"),
        ("X-Forwarded-For", "203.0.113.10"),
        ("X-Forwarded-For", "192.0.2.1, 10.0.0.1"),
    ];
    let r = h.request("GET", "/v1/auth", &headers, &[]).await;
    assert_eq!(r.status, 429, "of several X-Forwarded-For lines, the last one's last entry: {}", r.text());
    // X-Real-IP comes first: here a fresh bucket, although X-Forwarded-For names the spent one.
    let headers =
        [("X-RateLimit-Policy", "login"), ("X-Real-IP", "10.0.0.2"), ("X-Forwarded-For", "10.0.0.1")];
    assert_eq!(h.request("GET", "/v1/auth", &headers, &[]).await.status, 200, "X-Real-IP first");
    let headers = [("X-RateLimit-Policy", "login"), ("X-Real-IP", "10.0.0.2")];
    assert_eq!(h.request("GET", "/v1/auth", &headers, &[]).await.status, 200);
    assert_eq!(h.request("GET", "/v1/auth", &headers, &[]).await.status, 429, "X-Real-IP's bucket is spent");
    let headers = [("X-RateLimit-Policy", "login"), ("X-RateLimit-Key", "user-9")];
    assert_eq!(h.request("GET", "/v1/auth?cost=2", &headers, &[]).await.status, 200);
    assert_eq!(h.request("GET", "/v1/auth", &headers, &[]).await.status, 429, "cost 2 took both");

    // Shadow mode: refusals are answered 200 and counted as shadow_refused.
    for _ in 0..3 {
        let r = h.get("/v1/auth?policy=shadow&key=s").await;
        assert_eq!(r.status, 200, "shadow mode never refuses");
        assert!(r.header("retry-after").is_none());
    }
    // Unlimited: 200 without rate-limit headers.
    let r = h.get("/v1/auth?policy=free&key=f").await;
    assert_eq!(r.status, 200);
    assert!(r.header("x-ratelimit-limit").is_none());

    assert_error(&h.get("/v1/auth?key=k").await, 400, Some("policy"), "no policy");
    assert_error(&h.get("/v1/auth?policy=nope&key=k").await, 404, Some("policy"), "unknown policy");
    assert_error(&h.get("/v1/auth?policy=login").await, 400, Some("key"), "no key");
    assert_error(&h.get("/v1/auth?policy=login&key=").await, 400, Some("key"), "empty key");
    assert_error(&h.get("/v1/auth?policy=login&key=k&cost=-1").await, 400, Some("cost"), "negative cost");
    assert_error(
        &h.get("/v1/auth?policy=login&key=k&cost=1e3").await,
        400,
        Some("cost"),
        "cost not an integer",
    );
    let r = h.get("/v1/auth?policy=login&key=k&cost=99999999999999999999").await;
    assert_error(&r, 400, Some("cost"), "cost beyond u64");
    assert_error(&h.request("POST", "/v1/auth", &[], b"").await, 405, None, "POST /v1/auth");
    // Keys are text: bytes that are not UTF-8 are refused, never replaced (which would put
    // distinct byte strings in one bucket); UTF-8 in percent-encoding, and `+` as space, decode.
    for not_utf8 in ["%FF", "%C3", "a%ED%A0%80"] {
        let r = h.get(&format!("/v1/auth?policy=login&key={not_utf8}")).await;
        assert_error(&r, 400, Some("key"), not_utf8);
    }
    assert_eq!(h.get("/v1/auth?policy=login&key=caf%C3%A9+au+lait").await.status, 200);
    assert_error(&h.get("/v1/auth?policy=login&key=a&key=b").await, 400, Some("key"), "two keys");

    let metrics = h.get("/metrics").await.text();
    assert!(
        metrics.contains(r#"ratemesh_requests_total{policy="shadow",decision="shadow_refused"} 2"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"ratemesh_requests_total{policy="login",decision="refused"} 5"#), "{metrics}");
    assert!(metrics.contains(r#"ratemesh_requests_total{policy="free",decision="allowed"} 1"#), "{metrics}");
    h.stop().await;
}

/// One sample of an exposition: name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Checks that `text` is well-formed Prometheus/OpenMetrics text: comment lines of known kinds,
/// samples `name{label="value",...} number`. Returns the samples.
fn parse_exposition(text: &str) -> Vec<Sample> {
    let is_name = |s: &str| {
        !s.is_empty()
            && s.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    let mut samples = Vec::new();
    assert_eq!(text.lines().last(), Some("# EOF"), "ends with # EOF");
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut words = comment.splitn(3, ' ');
            let kind = words.next().unwrap_or_default();
            assert!(matches!(kind, "HELP" | "TYPE" | "UNIT" | "EOF"), "{line}");
            if kind != "EOF" {
                assert!(is_name(words.next().unwrap_or_default()), "{line}");
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("sample without value: {line}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value of {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => {
                let inner = rest.strip_suffix('}').unwrap_or_else(|| panic!("labels of {line}"));
                let labels = inner
                    .split(',')
                    .map(|pair| {
                        let (k, v) = pair.split_once('=').unwrap_or_else(|| panic!("label in {line}"));
                        assert!(is_name(k), "{line}");
                        let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).expect("quoted");
                        (k.to_owned(), v.to_owned())
                    })
                    .collect();
                (name, labels)
            }
        };
        assert!(is_name(name), "{line}");
        samples.push((name.to_owned(), labels, value));
    }
    samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_readiness_cluster_and_policies() {
    let h = Harness::standard("observe").await;
    assert_eq!(h.post("/v1/check", &json!({"key": "m", "policy": "login"})).await.status, 200);

    let r = h.get("/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").is_some_and(|t| t.starts_with("application/openmetrics-text")));
    let samples = parse_exposition(&r.text());
    let value = |name: &str, labels: &[(&str, &str)]| {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == name && labels.iter().all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, v)| *v)
    };
    assert_eq!(value("ratemesh_requests_total", &[("policy", "login"), ("decision", "allowed")]), Some(1.0));
    assert_eq!(value("ratemesh_members", &[("status", "live")]), Some(1.0));
    assert_eq!(value("ratemesh_members_counted", &[]), Some(1.0));
    assert_eq!(value("ratemesh_bucket_fill_ratio_count", &[("policy", "login")]), Some(1.0));
    assert!(value("ratemesh_keys", &[]).is_some_and(|keys| keys >= 1.0));
    assert!(
        value("ratemesh_http_request_duration_seconds_count", &[("route", "check"), ("status", "200")])
            .is_some()
    );
    for name in [
        "ratemesh_http_in_flight_requests",
        "ratemesh_forwarded_total",
        "ratemesh_forward_batches_total",
        "ratemesh_fallback_decisions_total",
        "ratemesh_evictions_total",
        "ratemesh_retransmits_total",
        "ratemesh_handoffs_sent_total",
    ] {
        assert!(value(name, &[]).is_some(), "{name} exported");
    }
    // docs/http-api.md's metrics table lists every series the daemon writes.
    let readme = include_str!("../../../docs/http-api.md");
    let table = &readme[readme.find("## Metrics").expect("the metrics table")..];
    for line in r.text().lines().filter_map(|line| line.strip_prefix("# TYPE ")) {
        let (name, kind) = line.split_once(' ').expect("# TYPE name kind");
        let listed = if kind == "counter" { format!("`{name}_total") } else { format!("`{name}") };
        assert!(table.contains(&listed), "{name} ({kind}) is missing from docs/http-api.md's metrics table");
    }

    let r = h.get("/healthz").await;
    assert_eq!((r.status, json_of(&r)), (200, json!({"status": "ok"})));
    let r = h.get("/readyz").await;
    assert_eq!((r.status, json_of(&r)), (200, json!({"ready": true})));

    // Alone, the node owns the whole ring (exact shares, no sampling).
    assert!(h.daemon.node().is_on_ring());
    assert_eq!(h.daemon.ring_shares(), vec![(h.daemon.id(), 1.0)]);

    let r = h.get("/v1/cluster").await;
    assert_eq!(r.status, 200);
    let cluster = json_of(&r);
    assert_eq!(cluster["node"], json!(1));
    assert_eq!(cluster["members"][0]["status"], json!("live"));
    assert_eq!(cluster["members"][0]["ring_share"], json!(1.0));
    assert_eq!(cluster["ring"]["owners"], json!(1));
    assert_eq!(cluster["ring"]["balance"], json!(1.0));
    assert_eq!(cluster["ready"], json!(true));
    assert_eq!(cluster["members_counted"], json!(1), "alone, a node counts its own share");

    let r = h.get("/v1/policies").await;
    assert_eq!(r.status, 200);
    let policies = json_of(&r);
    let list = policies["policies"].as_array().expect("a list");
    assert_eq!(list.len(), ALGORITHMS.len() + 4);
    let login = list.iter().find(|p| p["name"] == "login").expect("login listed");
    assert_eq!(login["algorithm"], json!("fixed_window"));
    assert_eq!(login["limit"], json!(2));
    assert_eq!(login["period_ms"], json!(3_600_000));
    assert_eq!(login["mode"], json!("exact"));
    assert_eq!(login["home_region"], json!("eu-west"));
    assert_eq!(login["region_fallback"], json!("closed"));
    let shadow = list.iter().find(|p| p["name"] == "shadow").expect("shadow listed");
    assert!(shadow.get("home_region").is_none() && shadow.get("region_fallback").is_none(), "{shadow}");
    let free = list.iter().find(|p| p["name"] == "free").expect("free listed");
    assert_eq!(free["unlimited"], json!(true));
    let envoy = list.iter().find(|p| p["name"] == "envoy").expect("envoy listed");
    assert_eq!(envoy["domain"], json!("edge"));
    assert_eq!(envoy["descriptors"], json!([{"key": "remote_address", "value": null}]));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_4xx_naming_the_field_and_the_node_keeps_serving() {
    let h = Harness::standard("bad-input").await;
    let limit = |extra: Value| {
        let mut limit = json!({"algorithm": "token_bucket", "limit": 10, "period_ms": 1000});
        if let (Some(limit), Some(extra)) = (limit.as_object_mut(), extra.as_object()) {
            limit.extend(extra.clone());
        }
        limit
    };
    let long_key = "k".repeat(64 * 1024);
    let cases: Vec<(&str, Vec<u8>, u16, Option<&str>)> = vec![
        ("malformed JSON", br#"{"key": "a", "policy": "#.to_vec(), 400, None),
        ("trailing garbage", br#"{"key": "a", "policy": "free"} x"#.to_vec(), 400, None),
        ("empty body", Vec::new(), 400, None),
        ("not an object", b"[1, 2]".to_vec(), 400, None),
        ("XML", b"<check><key>a</key></check>".to_vec(), 400, None),
        ("form data", b"key=a&policy=free".to_vec(), 400, None),
        ("binary, not UTF-8", vec![0xff, 0xfe, 0x00, 0x01], 400, None),
        ("key of the wrong type", br#"{"key": 5, "policy": "free"}"#.to_vec(), 400, Some("key")),
        ("cost of the wrong type", br#"{"key": "a", "policy": "free", "cost": "1"}"#.to_vec(), 400, Some("cost")),
        ("cost below i64", br#"{"key": "a", "policy": "free", "cost": -9223372036854775809}"#.to_vec(), 400, Some("cost")),
        ("fractional cost", br#"{"key": "a", "policy": "free", "cost": 1.5}"#.to_vec(), 400, Some("cost")),
        ("cost beyond u64", br#"{"key": "a", "policy": "free", "cost": 18446744073709551616}"#.to_vec(), 400, Some("cost")),
        ("cost beyond f64", br#"{"key": "a", "policy": "free", "cost": 1e400}"#.to_vec(), 400, Some("cost")),
        ("missing key", br#"{"policy": "free"}"#.to_vec(), 400, Some("key")),
        ("empty key", br#"{"key": "", "policy": "free"}"#.to_vec(), 400, Some("key")),
        ("64 KiB key", json!({"key": long_key, "policy": "free"}).to_string().into_bytes(), 400, Some("key")),
        ("unknown field", br#"{"key": "a", "policy": "free", "colour": 1}"#.to_vec(), 400, None),
        ("neither limit nor policy", br#"{"key": "a"}"#.to_vec(), 400, Some("limit")),
        (
            "both limit and policy",
            json!({"key": "a", "policy": "free", "limit": limit(json!({}))}).to_string().into_bytes(),
            400,
            Some("policy"),
        ),
        ("unknown policy", br#"{"key": "a", "policy": "nope"}"#.to_vec(), 404, Some("policy")),
        ("policy of the wrong type", br#"{"key": "a", "policy": 7}"#.to_vec(), 400, Some("policy")),
        (
            "unknown algorithm",
            json!({"key": "a", "limit": limit(json!({"algorithm": "magic"}))}).to_string().into_bytes(),
            400,
            Some("limit.algorithm"),
        ),
        (
            "zero limit",
            json!({"key": "a", "limit": limit(json!({"limit": 0}))}).to_string().into_bytes(),
            400,
            Some("limit.limit"),
        ),
        (
            "negative limit",
            br#"{"key": "a", "limit": {"algorithm": "gcra", "limit": -5, "period_ms": 1000}}"#.to_vec(),
            400,
            Some("limit.limit"),
        ),
        (
            "zero period",
            json!({"key": "a", "limit": limit(json!({"period_ms": 0}))}).to_string().into_bytes(),
            400,
            Some("limit.period_ms"),
        ),
        (
            "huge limit",
            json!({"key": "a", "limit": limit(json!({"limit": u64::MAX, "period_ms": 1}))}).to_string().into_bytes(),
            400,
            Some("limit.limit"),
        ),
        (
            "huge period",
            br#"{"key": "a", "limit": {"algorithm": "gcra", "limit": 1, "period_ms": 99999999999999999999999}}"#
                .to_vec(),
            400,
            Some("limit.period_ms"),
        ),
        (
            "unknown mode",
            json!({"key": "a", "limit": limit(json!({"mode": "eventual"}))}).to_string().into_bytes(),
            400,
            Some("limit.mode"),
        ),
        ("limit of the wrong type", br#"{"key": "a", "limit": "100/s"}"#.to_vec(), 400, Some("limit")),
    ];
    for (what, body, status, field) in &cases {
        let r = h.post_raw("/v1/check", body).await;
        assert_error(&r, *status, *field, what);
        assert!(r.header("x-ratelimit-limit").is_none(), "{what}: no decision, no headers");
    }
    assert_still_serving(&h).await;

    // Oversize bodies: announced (refused before reading) and chunked (refused once past the bound).
    let big = vec![b' '; 200 * 1024];
    assert_error(&h.post_raw("/v1/check", &big).await, 413, Some("body"), "oversize body");
    assert_error(&h.post_raw("/v1/check/batch", &big).await, 413, Some("body"), "oversize batch");
    assert_error(&h.post_raw("/v1/release", &big).await, 413, Some("body"), "oversize release");
    let mut chunked =
        b"POST /v1/check HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    for _ in 0..4 {
        chunked.extend_from_slice(format!("{:x}\r\n", 64 * 1024).as_bytes());
        chunked.extend(std::iter::repeat_n(b' ', 64 * 1024));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let r = client::raw(&h.addr, &chunked, TIMEOUT).await.expect("an answer");
    assert_error(&r, 413, Some("body"), "oversize chunked body");

    // Wrong paths and methods.
    assert_error(&h.get("/v1/nothing").await, 404, None, "unknown path");
    // The root is the dashboard page (GET only).
    assert_error(&h.post("/", &json!({})).await, 405, None, "POST /");
    assert_error(&h.get("/v1/check").await, 405, None, "GET /v1/check");
    assert_error(&h.request("DELETE", "/v1/policies", &[], b"").await, 405, None, "DELETE /v1/policies");
    assert_error(&h.post("/metrics", &json!({})).await, 405, None, "POST /metrics");

    // Garbage that is not HTTP at all (a TLS ClientHello's first bytes): answered 400, or the
    // connection closed without an answer; either way closed, within the bound.
    let garbage = exchange(&h.addr, b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n").await;
    match &garbage {
        Closed::Answered(r) => assert_eq!(r.status, 400, "{}", r.text()),
        Closed::Silently => {}
    }
    assert_still_serving(&h).await;
    h.stop().await;
}

/// How a connection ended: with an answer, or closed (or reset) without one.
#[derive(Debug)]
enum Closed {
    Answered(Response),
    Silently,
}

/// Sends `bytes` on a new connection and reads until the server closes it (at most
/// [`TIMEOUT`], or the test fails): the HTTP answer, if any, and how long the connection lasted.
async fn exchange_timed(addr: &str, bytes: &[u8]) -> (Closed, Duration) {
    let (received, elapsed) = until_closed(addr, bytes).await;
    let closed = if received.is_empty() {
        Closed::Silently
    } else {
        Closed::Answered(client::parse(&received).expect("an HTTP answer"))
    };
    (closed, elapsed)
}

/// Sends `bytes` on a new connection and reads until the server closes it (at most
/// [`TIMEOUT`], or the test fails): what was received, and how long the connection lasted.
async fn until_closed(addr: &str, bytes: &[u8]) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    stream.write_all(bytes).await.expect("sends");
    let mut received = Vec::new();
    let read = tokio::time::timeout(TIMEOUT, stream.read_to_end(&mut received))
        .await
        .unwrap_or_else(|_| panic!("the connection is still open after {TIMEOUT:?}"));
    let elapsed = started.elapsed();
    // A reset is a close too, only a ruder one; whatever arrived before it is read.
    if let Err(error) = read {
        assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    }
    (received, elapsed)
}

async fn exchange(addr: &str, bytes: &[u8]) -> Closed {
    exchange_timed(addr, bytes).await.0
}

/// Waits (bounded) until the daemon counted another reload attempt.
async fn next_reload(reloads: &mut tokio::sync::watch::Receiver<u64>) {
    tokio::time::timeout(TIMEOUT, reloads.changed())
        .await
        .expect("a reload within the timeout")
        .expect("the daemon is alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_serves_new_policies_and_keeps_the_running_config_on_a_bad_file() {
    let first =
        format!("{BASE}\n[[policies]]\nname = \"a\"\nalgorithm = \"gcra\"\nlimit = 5\nperiod_ms = 1000\n");
    let h = Harness::start("reload", &first).await;
    let check = |policy: &'static str| json!({"key": "r", "policy": policy});
    assert_eq!(h.post("/v1/check", &check("a")).await.status, 200);
    assert_eq!(h.post("/v1/check", &check("b")).await.status, 404);

    // SIGHUP's path: reload the file by hand.
    let second = format!(
        "{}\n[[policies]]\nname = \"b\"\nalgorithm = \"token_bucket\"\nlimit = 1\nperiod_ms = 60000\n",
        first.replace("level = \"info\"", "level = \"debug\"")
    );
    std::fs::write(&h.path, &second).expect("write");
    let mut levels = h.daemon.subscribe_log_level();
    assert_eq!(h.daemon.reload().expect("applied"), Reloaded::Applied);
    assert_eq!(h.post("/v1/check", &check("b")).await.status, 200, "the new policy is served");
    assert_eq!(*levels.borrow_and_update(), LogLevel::Debug, "the log level follows the file");
    assert_eq!(h.daemon.reload().expect("same file"), Reloaded::Unchanged);

    // An invalid file: refused with line and field, the running policies stay.
    let bad = second.replace("limit = 1\n", "limit = 0\n");
    std::fs::write(&h.path, &bad).expect("write");
    let error = h.daemon.reload().expect_err("refused");
    let ReloadError::Invalid(ConfigError::Invalid { field, .. }) = &error else { panic!("{error}") };
    assert_eq!(field, "policies[1].limit");
    let line = bad.lines().position(|l| l == "limit = 0").expect("the bad line") + 1;
    assert!(error.to_string().contains(&format!("ratemesh.toml:{line}:")), "{error}");
    let r = h.post("/v1/check", &check("b")).await;
    assert_eq!(json_of(&r)["allowed"], json!(false), "policy b still served, its bucket kept: {}", r.text());
    std::fs::write(&h.path, "this is not [toml").expect("write");
    assert!(matches!(h.daemon.reload(), Err(ReloadError::Invalid(_))));
    assert_eq!(h.post("/v1/check", &check("a")).await.status, 200);

    // A change that needs a restart is refused, naming the field.
    std::fs::write(&h.path, second.replace("http = \"127.0.0.1:0\"", "http = \"127.0.0.1:1\""))
        .expect("write");
    let error = h.daemon.reload().expect_err("refused");
    assert!(
        matches!(&error, ReloadError::RestartRequired { fields } if fields == &["listen.http"]),
        "{error}"
    );
    assert!(error.to_string().contains("listen.http"), "{error}");
    assert_eq!(h.post("/v1/check", &check("b")).await.status, 200);

    // The file watcher: a changed file is picked up without a signal, even when it changed
    // before the watcher started (its starting point is the file as last read, not as it is
    // when the watcher starts).
    let mut reloads = h.daemon.subscribe_reloads();
    reloads.borrow_and_update();
    let third = format!(
        "{second}\n[[policies]]\nname = \"c\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod_ms = 1000\n"
    );
    std::fs::write(&h.path, &third).expect("write");
    let watcher =
        serve::spawn_file_watcher(Arc::clone(&h.daemon), Duration::from_millis(20)).expect("a file");
    // Bounded: each wait is bounded and the watcher reloads once per change.
    for _ in 0..5 {
        next_reload(&mut reloads).await;
        if h.daemon.current().1.get("c").is_some() {
            break;
        }
    }
    assert_eq!(h.post("/v1/check", &check("c")).await.status, 200, "picked up from the file");
    let metrics = h.get("/metrics").await.text();
    assert!(metrics.contains(r#"ratemesh_config_reloads_total{result="refused"} 3"#), "{metrics}");

    // A policy removed by a reload takes its series with it.
    assert!(metrics.contains(r#"ratemesh_requests_total{policy="a",decision="allowed"}"#), "{metrics}");
    let without_a = third.replace("name = \"a\"", "name = \"a2\"");
    std::fs::write(&h.path, &without_a).expect("write");
    // The watcher may apply it first; either way it is in force after this.
    assert!(h.daemon.reload().is_ok());
    assert!(h.daemon.current().1.get("a").is_none());
    let metrics = h.get("/metrics").await.text();
    assert!(!metrics.contains(r#"policy="a""#), "{metrics}");
    assert!(metrics.contains(r#"ratemesh_requests_total{policy="b","#), "kept: {metrics}");
    h.stop().await;
    tokio::time::timeout(TIMEOUT, watcher).await.expect("the watcher stops at shutdown").expect("no panic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_shed_with_503_at_once_and_shutdown_refuses_checks() {
    let h = Harness::standard("overload").await;
    // Hold every in-flight permit: the next request finds none and is shed, not queued.
    let held = Arc::clone(h.daemon.http_permits()).try_acquire_many_owned(4).expect("all 4 permits");
    let r = h.post("/v1/check", &json!({"key": "o", "policy": "free"})).await;
    assert_error(&r, 503, None, "overloaded");
    assert_error(&h.get("/v1/auth?policy=free&key=o").await, 503, None, "auth is shed too");
    // The observation routes have a pool of their own: an overloaded API stays observable.
    assert_eq!(h.get("/readyz").await.status, 200, "readyz");
    assert_eq!(h.get("/v1/cluster").await.status, 200, "cluster");
    let metrics = h.get("/metrics").await;
    assert_eq!(metrics.status, 200, "metrics stay observable under overload");
    let shed = r#"ratemesh_shed_requests_total{server="http",route="check"} 1"#;
    assert!(metrics.text().contains(shed), "{}", metrics.text());
    assert_eq!(h.get("/healthz").await.status, 200, "liveness too");
    drop(held);
    assert_still_serving(&h).await;

    // That pool is small, and bounded too; /healthz needs no permit at all.
    let observe = u32::try_from(OBSERVE_IN_FLIGHT_MAX).expect("small");
    let held = Arc::clone(h.daemon.observe_permits()).try_acquire_many_owned(observe).expect("all of them");
    for route in ["/metrics", "/readyz", "/v1/cluster", "/v1/policies"] {
        assert_error(&h.get(route).await, 503, None, route);
    }
    assert_eq!(h.get("/healthz").await.status, 200, "liveness needs no permit");
    assert_still_serving(&h).await;
    drop(held);
    let metrics = h.get("/metrics").await.text();
    assert!(
        metrics.contains(r#"ratemesh_shed_requests_total{server="http",route="metrics"} 1"#),
        "{metrics}"
    );

    // Shutdown: not ready, checks refused with ShutDown (the HTTP answer is 503).
    let target =
        h.daemon.current().1.get("login").map(|entry| ratemeshd::check::Target::Named(Arc::clone(entry)));
    let target = target.expect("login");
    h.daemon.begin_shutdown();
    assert!(!h.daemon.is_ready());
    let key = target.namespace().key(b"s");
    assert_eq!(h.daemon.check(&target, key, "k", 1).await.expect_err("refused"), CheckError::ShutDown);
    h.stop().await;
}

/// A body trickling in holds no in-flight permit: with as many connections as there are permits
/// each sending a head and a byte of its body (a batch, the router's route), checks on both the
/// fast path and the router are still answered. (Before, the permit was taken first: the last
/// slow request and both checks were shed with 503.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_hold_no_in_flight_permit() {
    let mut options = Options::default();
    options.http.body_read = Duration::from_secs(60);
    let h = Harness::start_with("slow-bodies", &format!("{BASE}\n{}", policies()), options).await;
    let permits = h.daemon.http_permits().available_permits();
    // `Expect: 100-continue`: the server's `100 Continue` says it has begun to read the body.
    let head =
        b"POST /v1/check/batch HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n";
    let mut slow = Vec::new();
    for _ in 0..permits + 1 {
        let mut stream = TcpStream::connect(&h.addr).await.expect("connects");
        stream.write_all(head).await.expect("sends");
        let mut interim = [0u8; 25];
        tokio::time::timeout(TIMEOUT, stream.read_exact(&mut interim))
            .await
            .expect("in time")
            .expect("reads");
        assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n", "{}", String::from_utf8_lossy(&interim));
        stream.write_all(b"[").await.expect("sends");
        slow.push(stream);
    }
    for path in ["/v1/check", "/v1/check/batch"] {
        let body = match path {
            "/v1/check" => json!({"key": "s", "policy": "free"}),
            _ => json!([{"key": "s", "policy": "free"}]),
        };
        let r = h.post(path, &body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    assert_eq!(h.daemon.http_permits().available_permits(), permits, "no permit held by a slow body");
    drop(slow);
    assert_still_serving(&h).await;
    h.stop().await;
}

/// The connection bound: with `connections_max` idle connections open (no request, but well
/// within the head timeout), one more is closed at once; once one of them went away, a new one
/// is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_bound_are_closed_at_once() {
    let config = format!(
        "{}\n{}",
        BASE.replace("batch_len_max = 10", "batch_len_max = 10\nconnections_max = 2"),
        policies()
    );
    // Idle connections are closed only after a minute: any close seen here is the bound's.
    let long = Duration::from_secs(60);
    let mut options = Options::default();
    options.http.header_read = long;
    let h = Harness::start_with("connections", &config, options).await;
    assert_eq!(h.daemon.current().0.limits.connections_max, 2);
    let first = TcpStream::connect(&h.addr).await.expect("connects");
    let second = TcpStream::connect(&h.addr).await.expect("connects");
    // Accepted in order: the third finds both permits taken, and is closed with no answer.
    let (closed, elapsed) = exchange_timed(&h.addr, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").await;
    assert!(matches!(closed, Closed::Silently), "{closed:?}");
    assert!(elapsed < long, "closed by the bound, not a timeout: {elapsed:?}");

    // One idle connection goes away: its permit comes back (waited for, not polled), and a new
    // connection is served.
    drop(first);
    let permits = Arc::clone(h.servers().http_connections());
    let freed = tokio::time::timeout(TIMEOUT, permits.acquire()).await.expect("a permit comes back");
    drop(freed.expect("the semaphore stays open"));
    assert_eq!(h.get("/healthz").await.status, 200);
    let metrics = h.get("/metrics").await.text();
    assert!(metrics.contains(r#"ratemesh_connections_refused_total{server="http"} 1"#), "{metrics}");
    drop(second);
    h.stop().await;
}

/// The time bounds of a connection: a request head must arrive within the head timeout (also
/// after a keep-alive answer: an idle connection is closed), a body within the body timeout, and
/// a gRPC connection must send its HTTP/2 preface within the handshake timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_connections_are_closed_after_their_timeouts() {
    let short = Duration::from_millis(200);
    let mut options = Options::default();
    options.http.header_read = short;
    options.http.body_read = short;
    options.grpc.handshake = short;
    let h = Harness::start_with("timeouts", &format!("{BASE}\n{}", policies()), options).await;

    // Half a request line, then nothing: disconnected after the head timeout (hyper may answer
    // 408 first).
    let (closed, elapsed) = exchange_timed(&h.addr, b"GET /heal").await;
    assert!(elapsed >= short, "not before the timeout: {elapsed:?}");
    if let Closed::Answered(r) = &closed {
        assert_eq!(r.status, 408, "{}", r.text());
    }

    // A whole request on a keep-alive connection is answered; the idle connection is then closed.
    let (closed, elapsed) = exchange_timed(&h.addr, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").await;
    let Closed::Answered(r) = closed else { panic!("no answer") };
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(elapsed >= short, "kept alive until the timeout: {elapsed:?}");

    // A body that does not arrive: 408 naming the body, and the request's permit is let go.
    let head = b"POST /v1/check HTTP/1.1\r\nHost: t\r\nContent-Length: 64\r\n\r\n{\"key\": ";
    let mut stream = TcpStream::connect(&h.addr).await.expect("connects");
    stream.write_all(head).await.expect("sends");
    let r = read_response(&mut stream).await;
    assert_error(&r, 408, Some("body"), "a body that never arrives");
    drop(stream);
    assert_still_serving(&h).await;

    // A gRPC connection that never sends its preface is closed after the handshake timeout (the
    // server may have sent its own HTTP/2 settings meanwhile).
    let grpc = h.servers().grpc_addr().expect("gRPC").to_string();
    let (_, elapsed) = until_closed(&grpc, b"").await;
    assert!(elapsed >= short, "not before the timeout: {elapsed:?}");
    h.stop().await;
}

/// Slow readers: `connections_max` connections pipeline requests and never read the answers
/// (one reads a byte now and then, which is progress but no real reading), through a tiny
/// receive window, until the server's writes stall. Each is closed once a write waited for the
/// write timeout, so a new client is served then (without the timeout, never).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_cannot_hold_the_connection_slots() {
    const SLOTS: usize = 4;
    let config =
        BASE.replace("batch_len_max = 10", &format!("batch_len_max = 10\nconnections_max = {SLOTS}"));
    let mut options = Options::default();
    // Long head and idle timeouts (any close here is the write timeout's), a short write timeout.
    options.http.header_read = Duration::from_secs(60);
    options.http.write = Duration::from_millis(500);
    let h = Harness::start_with("slow-readers", &config, options).await;
    let permits = Arc::clone(h.servers().http_connections());
    let mut readers = Vec::new();
    for index in 0..SLOTS {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("a small receive buffer");
        let mut stream = socket.connect(h.addr.parse().expect("address")).await.expect("connects");
        // Pipelined scrapes (kilobytes each): far more answer than the buffers hold.
        let requests = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n".repeat(2000);
        readers.push(tokio::spawn(async move {
            // The server stops reading once its writes stall: this write may never end.
            let _ = stream.write_all(&requests).await;
            if index == 0 {
                // The trickler: a byte every 50 ms until the server gives up on it.
                let mut byte = [0_u8; 1];
                while stream.read(&mut byte).await.is_ok_and(|n| n > 0) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            } else {
                std::future::pending::<()>().await;
            }
        }));
    }
    // Every slot taken (waited on the permits, bounded), then a new client: refused at accept
    // while the slow readers hold the slots, served once the server cut them off.
    tokio::time::timeout(TIMEOUT, async {
        while permits.available_permits() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the slow readers hold every slot");
    let started = Instant::now();
    let served = tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Closed::Answered(r) =
                exchange(&h.addr, b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").await
            {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a new client is served while slow readers try to hold every slot");
    assert_eq!(served.status, 200, "{}", served.text());
    println!(
        "new client served {:?} after the slow readers took every slot (write timeout {:?})",
        started.elapsed(),
        options.http.write
    );
    for reader in readers {
        reader.abort();
    }
    h.stop().await;
}

/// Reads one response from `stream` (which stays open), at most [`TIMEOUT`].
async fn read_response(stream: &mut TcpStream) -> Response {
    let read = async {
        let mut received = Vec::new();
        let mut buffer = [0_u8; 4096];
        // Bounded by the timeout around it; every round reads at least one byte or ends.
        loop {
            if let Ok(response) = client::parse(&received) {
                return response;
            }
            let n = stream.read(&mut buffer).await.expect("reads");
            assert!(n > 0, "closed before a whole answer: {}", String::from_utf8_lossy(&received));
            received.extend_from_slice(&buffer[..n]);
        }
    };
    tokio::time::timeout(TIMEOUT, read).await.expect("an answer within the timeout")
}

/// A node with seeds is ready only once another member is live; alone without seeds it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_node_is_ready_only_with_a_live_peer() {
    // Port 9 (discard): nothing answers gossip there.
    let unreachable = BASE.replace("[limits]", "[cluster]\nseeds = [\"127.0.0.1:9\"]\n\n[limits]");
    let lonely = Harness::start("seeded-alone", &unreachable).await;
    assert!(!lonely.daemon.is_ready());
    let r = lonely.get("/readyz").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        json_of(&r)["reason"].as_str().is_some_and(|reason| reason.contains("cluster.seeds")),
        "{}",
        r.text()
    );
    lonely.stop().await;

    // A node without seeds is a cluster of one: ready alone.
    let first = Harness::start("seeded-first", BASE).await;
    assert!(first.daemon.is_ready());
    // A node seeded with it becomes ready once it sees it live (waited for on the member view).
    let seed = first.daemon.node().gossip_addr();
    let seeded =
        BASE.replace("[limits]", &format!("[node]\nid = 2\n\n[cluster]\nseeds = [\"{seed}\"]\n\n[limits]"));
    let second = Harness::start("seeded-second", &seeded).await;
    let first_id = first.daemon.id();
    assert_ne!(first_id, second.daemon.id());
    let mut members = second.daemon.node().subscribe_members();
    tokio::time::timeout(
        TIMEOUT,
        members.wait_for(|m| m.iter().any(|m| m.id == first_id && m.status == MemberStatus::Live)),
    )
    .await
    .expect("the seed is seen live within the timeout")
    .expect("the node is running");
    // Then, once its join grace passed (the others learned of it), it is ready.
    second.daemon.node().wait_serving().await;
    assert!(second.daemon.is_ready(), "{:?}", second.daemon.not_ready_reason());
    assert_eq!(second.get("/readyz").await.status, 200);
    second.stop().await;
    first.stop().await;
}

/// Publishes `content` in `dir` the way the kubelet updates a ConfigMap volume: a new directory
/// `..<version>` holding the file, then the `..data` symlink swapped to it atomically (a rename
/// over it); `ratemesh.toml` is a symlink to `..data/ratemesh.toml`, made once. With `modified`,
/// the new file gets that modification time.
fn publish_like_a_configmap(
    dir: &std::path::Path,
    version: &str,
    content: &str,
    modified: Option<std::time::SystemTime>,
) {
    let versioned = dir.join(format!("..{version}"));
    std::fs::create_dir(&versioned).expect("version directory");
    let file = versioned.join("ratemesh.toml");
    std::fs::write(&file, content).expect("write");
    if let Some(modified) = modified {
        std::fs::File::options()
            .write(true)
            .open(&file)
            .expect("open")
            .set_modified(modified)
            .expect("mtime");
    }
    let swap = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{version}"), &swap).expect("symlink");
    std::fs::rename(&swap, dir.join("..data")).expect("atomic swap");
    let link = dir.join("ratemesh.toml");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("..data/ratemesh.toml", &link).expect("symlink");
    }
}

/// A ConfigMap mounted as a volume is updated by swapping a symlink, not by writing the file:
/// the watcher must see the new file even when its length and modification time equal the old
/// one's (here made equal on purpose, so that only the file's identity differs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_watcher_sees_a_configmap_symlink_swap() {
    let dir = std::env::temp_dir().join(format!("ratemeshd-http-configmap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let policy = |name: &str| {
        format!(
            "{BASE}\n[[policies]]\nname = \"{name}\"\nalgorithm = \"token_bucket\"\nlimit = 1\nperiod_ms = 60000\n"
        )
    };
    publish_like_a_configmap(&dir, "2026_01_01_00_00_00.1", &policy("aaaa"), None);
    let path = dir.join("ratemesh.toml");
    let mut source = ConfigSource::new(path.clone(), std::iter::empty());
    let config = source.load().expect("valid config");
    let daemon = Daemon::start_with_source(config, Some(source)).await.expect("daemon starts");
    let mut reloads = daemon.subscribe_reloads();
    reloads.borrow_and_update();
    let watcher = serve::spawn_file_watcher(Arc::clone(&daemon), Duration::from_millis(20)).expect("a file");

    let modified = std::fs::metadata(&path).and_then(|m| m.modified()).expect("mtime");
    publish_like_a_configmap(&dir, "2026_01_01_00_00_01.2", &policy("bbbb"), Some(modified));
    next_reload(&mut reloads).await;
    assert!(daemon.current().1.get("bbbb").is_some(), "the swapped-in file is in force");
    assert!(daemon.current().1.get("aaaa").is_none());
    daemon.shutdown().await;
    tokio::time::timeout(TIMEOUT, watcher).await.expect("the watcher stops at shutdown").expect("no panic");
    let _ = std::fs::remove_dir_all(&dir);
}

fn unix_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    u64::try_from(since.as_millis()).expect("in range")
}

/// Sends `body` to `/v1/check` and returns the answer with the Unix milliseconds just before and
/// just after it.
async fn check_timed(h: &Harness, body: &Value) -> (Response, u64, u64) {
    let before = unix_ms();
    let response = h.post("/v1/check", body).await;
    (response, before, unix_ms())
}

/// Requires `reset_after_ms` (and the refusal's `retry_after_ms`, and `X-RateLimit-Reset`) to
/// point at `boundary_ms` of a check answered between `before` and `after`.
#[track_caller]
fn points_at(response: &Response, before: u64, after: u64, boundary_ms: impl Fn(u64) -> u64) {
    let answer = json_of(response);
    let reset = answer["reset_after_ms"].as_u64().expect("reset_after_ms");
    let (earliest, latest) =
        (boundary_ms(before).min(boundary_ms(after)), boundary_ms(before).max(boundary_ms(after)));
    // Rounded up to whole milliseconds: at most 1 ms beyond the boundary seen from `before`.
    assert!(
        earliest.saturating_sub(after) <= reset && reset <= latest - before + 1,
        "reset_after_ms {reset} does not point at the boundary {earliest}..{latest} (asked {before}..{after})"
    );
    if let Some(retry) = answer["retry_after_ms"].as_u64() {
        assert!(retry.abs_diff(reset) <= 1, "a refusal passes at the boundary: retry {retry}, reset {reset}");
    }
    let header: u64 =
        response.header("x-ratelimit-reset").expect("X-RateLimit-Reset").parse().expect("seconds");
    assert_eq!(header, reset.div_ceil(1000), "X-RateLimit-Reset in whole seconds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_windows_reset_at_the_next_boundary() {
    let config = format!(
        "{BASE}\n[[policies]]\nname = \"daily-berlin\"\nwindow = \"day\"\ntime_zone = \"Europe/Berlin\"\nlimit = 2\nmode = \"exact\"\n"
    );
    let h = Harness::start("calendar", &config).await;
    // An inline limit of 2 per UTC minute: its boundary is the next whole minute since 1970.
    let minute = json!({"key": "m", "limit": {"algorithm": "fixed_window", "limit": 2, "window": "minute", "mode": "exact"}});
    let next_minute = |ms: u64| (ms / 60_000 + 1) * 60_000;
    for expected_allowed in [true, true, false] {
        let (r, before, after) = check_timed(&h, &minute).await;
        assert_eq!(r.status, 200, "{}", r.text());
        // A check that straddled a minute boundary counts in either window: skip it.
        if before / 60_000 == after / 60_000 && (before + 50) / 60_000 == before / 60_000 {
            assert_eq!(json_of(&r)["allowed"], json!(expected_allowed), "{}", r.text());
        }
        points_at(&r, before, after, next_minute);
        assert_eq!(r.header("ratelimit-policy"), Some("\"inline\";q=2;w=60"));
    }
    // A policy of 2 per day in Berlin: its boundary is the next local midnight, 22:00 or 23:00
    // UTC (the calendar's arithmetic is checked against a naive calendar in the ratemesh crate).
    let day = ratemesh::Calendar::new(ratemesh::CalendarUnit::Day, "Europe/Berlin").expect("zone");
    let next_midnight = |ms: u64| day.window_at(ms * 1_000_000).end.as_nanos() / 1_000_000;
    let local_midnight_utc_hour = (next_midnight(unix_ms()) / 3_600_000) % 24;
    assert!([22, 23].contains(&local_midnight_utc_hour), "Berlin's midnight is 22:00 or 23:00 UTC");
    for expected_allowed in [true, true, false] {
        let (r, before, after) = check_timed(&h, &json!({"key": "d", "policy": "daily-berlin"})).await;
        assert_eq!(json_of(&r)["allowed"], json!(expected_allowed), "{}", r.text());
        points_at(&r, before, after, next_midnight);
    }
    let listed = json_of(&h.get("/v1/policies").await);
    let entry = &listed["policies"].as_array().expect("a list")[0];
    assert_eq!((entry["window"].clone(), entry["time_zone"].clone()), (json!("day"), json!("Europe/Berlin")));
    // Bad calendar input names its field.
    let bad = json!({"key": "m", "limit": {"algorithm": "fixed_window", "limit": 2, "window": "fortnight"}});
    assert_error(&h.post("/v1/check", &bad).await, 400, Some("limit.window"), "unknown window");
    let bad = json!({"key": "m", "limit": {"algorithm": "fixed_window", "limit": 2, "window": "day", "time_zone": "Mars/Base"}});
    assert_error(&h.post("/v1/check", &bad).await, 400, Some("limit.time_zone"), "unknown zone");
    let bad = json!({"key": "m", "limit": {"algorithm": "token_bucket", "limit": 2, "window": "day"}});
    assert_error(&h.post("/v1/check", &bad).await, 400, Some("limit.algorithm"), "calendar token bucket");
    h.stop().await;
}

/// An expiring counter's window starts at its first hit (not on a grid of the period) and ends
/// a period later; a query starts nothing; the first hit after the end starts the next window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_counter_starts_its_window_at_the_first_hit() {
    let h = Harness::standard("expiring").await;
    let period_ms = 1500;
    let body = |cost: i64| {
        json!({"key": "e", "cost": cost, "limit": {
            "algorithm": "expiring_counter", "limit": 2, "period_ms": period_ms, "mode": "exact"}})
    };
    // A query of an empty counter: nothing counted, nothing to reset, no window started.
    let r = h.post("/v1/check", &body(0)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = json_of(&r);
    assert_eq!((answer["allowed"].clone(), answer["remaining"].clone()), (json!(true), json!(2)), "{answer}");
    assert_eq!(answer["reset_after_ms"], json!(0), "{answer}");
    // Start off any grid of the period: 700 ms after a whole multiple of 1.5 s since 1970.
    let offset = unix_ms() % period_ms;
    tokio::time::sleep(Duration::from_millis((period_ms + 700 - offset) % period_ms)).await;
    for round in 0..2 {
        let (r, before, after) = check_timed(&h, &body(1)).await;
        let answer = json_of(&r);
        assert_eq!(answer["allowed"], json!(true), "round {round}: {answer}");
        // The window ends a period after this first hit, wherever the grid is.
        points_at(&r, before, after, |ms| ms + period_ms);
        let (r, before, after) = check_timed(&h, &body(1)).await;
        assert_eq!(json_of(&r)["remaining"], json!(0), "round {round}: {}", r.text());
        // Asked at most a few ms later: still the first hit's window (1 ms of rounding).
        let first_end = before + period_ms;
        let reset = json_of(&r)["reset_after_ms"].as_u64().expect("reset_after_ms");
        assert!(reset <= first_end - before + 1 && after - before < 500, "round {round}: {reset}");
        let (r, _, _) = check_timed(&h, &body(1)).await;
        let answer = json_of(&r);
        assert_eq!(answer["allowed"], json!(false), "round {round}: {answer}");
        let retry = answer["retry_after_ms"].as_u64().expect("retry_after_ms");
        assert!(retry <= period_ms && retry.abs_diff(answer["reset_after_ms"].as_u64().unwrap_or(0)) <= 1);
        // After the window: empty (a query starts nothing), then a hit starts a new window.
        tokio::time::sleep(Duration::from_millis(retry + 20)).await;
        let answer = json_of(&h.post("/v1/check", &body(0)).await);
        assert_eq!(
            (answer["remaining"].clone(), answer["reset_after_ms"].clone()),
            (json!(2), json!(0)),
            "{answer}"
        );
        // The second round starts 300 ms later than a period after the first: still off the grid.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A refund of every hit empties the counter: the next hit starts a new window.
    let (r, before, after) = check_timed(&h, &body(1)).await;
    points_at(&r, before, after, |ms| ms + period_ms);
    assert_eq!(h.post("/v1/check", &body(-5)).await.status, 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (r, before, after) = check_timed(&h, &body(1)).await;
    points_at(&r, before, after, |ms| ms + period_ms);
    assert_still_serving(&h).await;
    h.stop().await;
}

/// `remaining` of `key` under `policy`, by a query.
async fn remaining_of(h: &Harness, policy: &str, key: &str) -> Value {
    let r = h.post("/v1/check", &json!({"key": key, "policy": policy, "cost": 0})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    json_of(&r)["remaining"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_charges_and_groups_answer_and_bad_ones_change_nothing() {
    let h = Harness::standard("usage").await;
    // A refund returns hits, never above the capacity (3 of an hour's token bucket).
    for _ in 0..3 {
        h.post("/v1/check", &json!({"key": "r", "policy": "token_bucket"})).await;
    }
    assert_eq!(remaining_of(&h, "token_bucket", "r").await, json!(0));
    let r = h.post("/v1/check", &json!({"key": "r", "policy": "token_bucket", "cost": -2})).await;
    assert_eq!((r.status, json_of(&r)["remaining"].clone()), (200, json!(2)), "{}", r.text());
    let r = h.post("/v1/check", &json!({"key": "r", "policy": "token_bucket", "cost": -50})).await;
    assert_eq!(json_of(&r)["remaining"], json!(3), "never above the capacity");
    // A charge goes into debt: 3 hits a hour, a charge of 9 owes 6 (two hours) and the next hit.
    let r = h.post("/v1/charge", &json!({"key": "c", "policy": "token_bucket", "cost": 9})).await;
    let charged = json_of(&r);
    assert_eq!((r.status, charged["allowed"].clone()), (200, json!(false)), "{charged}");
    let retry_ms = charged["retry_after_ms"].as_u64().expect("a retry time");
    assert!((2 * 3_600_000 + 1_199_000..=2 * 3_600_000 + 1_200_000).contains(&retry_ms), "{charged}");
    assert_eq!(remaining_of(&h, "token_bucket", "c").await, json!(0));
    // All or nothing: the spent third key refuses the group, the first two keep their hits.
    let group = json!([
        {"key": "g1", "policy": "token_bucket"},
        {"key": "g2", "policy": "gcra"},
        {"key": "c", "policy": "token_bucket"},
    ]);
    let r = h.post("/v1/check/all", &group).await;
    let answer = json_of(&r);
    assert_eq!((r.status, answer["allowed"].clone()), (200, json!(false)), "{answer}");
    let allowed: Vec<Value> =
        answer["results"].as_array().expect("results").iter().map(|a| a["allowed"].clone()).collect();
    assert_eq!(allowed.len(), 3, "{answer}");
    assert_eq!(allowed[2], json!(false), "{answer}");
    assert_eq!(remaining_of(&h, "token_bucket", "g1").await, json!(3), "g1 untouched");
    assert_eq!(remaining_of(&h, "gcra", "g2").await, json!(3), "g2 untouched");
    let r = h
        .post(
            "/v1/check/all",
            &json!([{"key": "g1", "policy": "token_bucket"}, {"key": "g2", "policy": "gcra"}]),
        )
        .await;
    assert_eq!(json_of(&r)["allowed"], json!(true), "{}", r.text());
    assert_eq!(remaining_of(&h, "token_bucket", "g1").await, json!(2), "a passing group takes its hits");

    // Bad input: a clear 4xx naming the field, and nothing changed.
    let lease = h.post("/v1/check", &json!({"key": "l", "policy": "concurrency"})).await;
    assert_eq!(json_of(&lease)["remaining"], json!(2), "{}", lease.text());
    let r = h.post("/v1/check", &json!({"key": "l", "policy": "concurrency", "cost": -1})).await;
    assert_error(&r, 400, Some("cost"), "a refund on a concurrency policy");
    assert_eq!(remaining_of(&h, "concurrency", "l").await, json!(2), "the lease is still held");
    let r = h.post("/v1/charge", &json!({"key": "r", "policy": "token_bucket"})).await;
    assert_error(&r, 400, Some("cost"), "a charge without a cost");
    let r = h.post("/v1/charge", &json!({"key": "r", "policy": "token_bucket", "cost": -1})).await;
    assert_error(&r, 400, Some("cost"), "a negative charge");
    let r = h.post("/v1/charge", &json!({"key": "l", "policy": "concurrency", "cost": 1})).await;
    assert_error(&r, 400, Some("policy"), "a charge on a concurrency policy");
    let r = h.post("/v1/charge", &json!({"key": "r", "policy": "nope", "cost": 1})).await;
    assert_error(&r, 404, Some("policy"), "a charge of an unknown policy");
    let r = h.post("/v1/charge", &json!({"policy": "token_bucket", "cost": 1})).await;
    assert_error(&r, 400, Some("key"), "a charge without a key");
    assert_eq!(remaining_of(&h, "token_bucket", "r").await, json!(3), "no bad charge took anything");
    let long: Vec<Value> = (0..11).map(|_| json!({"key": "g1", "policy": "token_bucket"})).collect();
    let r = h.post("/v1/check/all", &Value::Array(long)).await;
    assert_error(&r, 400, Some("[10]"), "a group over batch_len_max");
    let r = h.post("/v1/check/all", &json!([{"key": "g1", "policy": "token_bucket", "cost": -1}])).await;
    assert_error(&r, 400, Some("[0].cost"), "a refund in a group");
    let r = h.post("/v1/check/all", &json!([{"key": "g1", "policy": "nope"}])).await;
    assert_error(&r, 404, Some("[0].policy"), "a group with an unknown policy");
    assert_eq!(remaining_of(&h, "token_bucket", "g1").await, json!(2), "no bad group took anything");
    // Refunds and charges are counted apart from checks, the refused bad ones not at all.
    let samples = parse_exposition(&h.get("/metrics").await.text());
    let value = |name: &str, adjustment: &str| {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && l.iter().any(|(k, v)| k == "policy" && v == "token_bucket")
                    && l.iter().any(|(k, v)| k == "adjustment" && v == adjustment)
            })
            .map(|(_, _, v)| *v)
    };
    assert_eq!(value("ratemesh_adjustments_total", "refund"), Some(2.0));
    assert_eq!(value("ratemesh_adjusted_hits_total", "refund"), Some(52.0));
    assert_eq!(value("ratemesh_adjustments_total", "charge"), Some(1.0));
    assert_eq!(value("ratemesh_adjusted_hits_total", "charge"), Some(9.0));
    assert_still_serving(&h).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_and_tiers_govern_their_keys() {
    let config = format!(
        "{BASE}\n[[policies]]\nname = \"plans\"\nalgorithm = \"token_bucket\"\nlimit = 2\nperiod_ms = 3600000\n\
         overrides = [{{ key = \"customer:acme\", limit = 5 }}]\ntiers = [{{ name = \"pro\", limit = 4 }}]\n"
    );
    let h = Harness::start("variants", &config).await;
    let passes = |key: &'static str, tier: Option<&'static str>| {
        let h = &h;
        async move {
            let mut body = json!({"key": key, "policy": "plans"});
            if let Some(tier) = tier {
                body["tier"] = json!(tier);
            }
            let mut passed = 0;
            for _ in 0..8 {
                let r = h.post("/v1/check", &body).await;
                assert_eq!(r.status, 200, "{}", r.text());
                passed += u64::from(json_of(&r)["allowed"] == json!(true));
            }
            passed
        }
    };
    assert_eq!(passes("customer:other", None).await, 2, "the policy's limit");
    assert_eq!(passes("customer:acme", None).await, 5, "the key's override");
    assert_eq!(passes("customer:pro", Some("pro")).await, 4, "the tier asked for");
    assert_eq!(passes("customer:acme", Some("pro")).await, 0, "the override wins, and it is spent");
    let r = h.post("/v1/check", &json!({"key": "k", "policy": "plans", "tier": "gold"})).await;
    assert_error(&r, 400, Some("tier"), "an unknown tier");
    let metrics = h.get("/metrics").await.text();
    assert!(!metrics.contains("customer:acme"), "metric labels never carry override keys");
    h.stop().await;
}

const ADMIN_TOKEN: &str = "http-api test admin token";

/// A bad admin request: method, path, headers, body, the status and the field expected.
type AdminCase<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a [u8], u16, Option<&'a str>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_overrides_need_the_token_govern_checks_and_survive_a_restart_with_a_data_dir() {
    let dir = std::env::temp_dir().join(format!("ratemeshd-http-overrides-data-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let policies = "[[policies]]\nname = \"plans\"\nalgorithm = \"token_bucket\"\nlimit = 2\nperiod_ms = 3600000\n\n\
                    [[policies]]\nname = \"daily\"\nwindow = \"day\"\nlimit = 2\n";
    let without_token = format!("{BASE}\n{policies}");
    let h = Harness::start("overrides-off", &without_token).await;
    let r = h.request("PUT", "/v1/overrides/plans/k", &[], br#"{"limit": 5}"#).await;
    assert_error(&r, 403, Some("authorization"), "no admin token configured");
    h.stop().await;

    let config = format!(
        "{BASE}\n[node]\ndata_dir = {:?}\n\n[auth]\nadmin_token = \"{ADMIN_TOKEN}\"\n\n{policies}",
        dir.display().to_string()
    );
    let h = Harness::start("overrides", &config).await;
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let admin = [("Authorization", bearer.as_str())];
    let cases: [AdminCase; 9] = [
        ("PUT", "/v1/overrides/plans/k", &[], br#"{"limit": 5}"#, 401, Some("authorization")),
        (
            "PUT",
            "/v1/overrides/plans/k",
            &[("Authorization", "Bearer wrong token of some length")],
            br#"{"limit": 5}"#,
            401,
            Some("authorization"),
        ),
        ("DELETE", "/v1/overrides/plans/k", &[], b"", 401, Some("authorization")),
        ("PUT", "/v1/overrides/nope/k", &admin, br#"{"limit": 5}"#, 404, Some("policy")),
        ("PUT", "/v1/overrides/plans/k", &admin, br#"{"limit": 0}"#, 400, Some("limit")),
        ("PUT", "/v1/overrides/plans/k", &admin, br#"{"colour": 1}"#, 400, None),
        ("PUT", "/v1/overrides/daily/k", &admin, br#"{"limit": 5}"#, 400, Some("policy")),
        // A key that is not UTF-8 once percent-decoded: the JSON error, naming the path.
        ("PUT", "/v1/overrides/plans/a%2Fb%00%FF", &admin, br#"{"limit": 5}"#, 400, Some("path")),
        ("DELETE", "/v1/overrides/plans/%FF", &admin, b"", 400, Some("path")),
    ];
    for (method, path, headers, body, status, field) in cases {
        let r = h.request(method, path, headers, body).await;
        assert_error(&r, status, field, &format!("{method} {path} {}", String::from_utf8_lossy(body)));
    }
    let listed = json_of(&h.get("/v1/overrides/plans").await);
    assert_eq!(listed["overrides"], json!([]), "nothing changed: {listed}");
    assert_error(&h.get("/v1/overrides/nope").await, 404, Some("policy"), "list of an unknown policy");

    let r = h.request("PUT", "/v1/overrides/plans/customer:acme", &admin, br#"{"limit": 5}"#).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let passes = |key: &'static str| {
        let h = &h;
        async move {
            let mut passed = 0;
            for _ in 0..8 {
                let r = h.post("/v1/check", &json!({"key": key, "policy": "plans"})).await;
                passed += u64::from(json_of(&r)["allowed"] == json!(true));
            }
            passed
        }
    };
    assert_eq!(passes("customer:acme").await, 5, "the live override governs its key");
    assert_eq!(passes("customer:other").await, 2, "other keys keep the policy's limit");
    let listed = json_of(&h.get("/v1/overrides/plans").await);
    assert_eq!(listed["overrides"][0]["limit"], json!(5), "{listed}");
    assert!(!h.get("/metrics").await.text().contains("customer:acme"), "never in metric labels");
    h.stop().await;

    // A restart reads the table back from the data directory.
    let h = Harness::start("overrides-again", &config).await;
    let listed = json_of(&h.get("/v1/overrides/plans").await);
    assert_eq!(listed["overrides"][0]["key"], json!("customer:acme"), "{listed}");
    let r = h.request("DELETE", "/v1/overrides/plans/customer:acme", &admin, b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(json_of(&h.get("/v1/overrides/plans").await)["overrides"], json!([]));
    assert_eq!(passes_after_delete(&h).await, 2, "deleted: the policy's limit again");
    h.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Checks of `customer:acme` under `plans` (its own bucket under the policy's limit).
async fn passes_after_delete(h: &Harness) -> u64 {
    let mut passed = 0;
    for _ in 0..8 {
        let r = h.post("/v1/check", &json!({"key": "customer:acme", "policy": "plans"})).await;
        passed += u64::from(json_of(&r)["allowed"] == json!(true));
    }
    passed
}

/// `POST /v1/check` raw over one keep-alive connection: `count` requests for `keys`, pipelined in
/// one write.
fn check_requests(keys: &[&str], extra_header: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    for key in keys {
        let body = format!(r#"{{"key": "{key}", "policy": "token_bucket"}}"#);
        let head = format!(
            "POST /v1/check HTTP/1.1\r\nHost: t\r\n{extra_header}Content-Length: {}\r\n\r\n",
            body.len()
        );
        bytes.extend_from_slice(head.as_bytes());
        bytes.extend_from_slice(body.as_bytes());
    }
    bytes
}

/// Reads `count` whole responses from `stream` and returns their raw bytes, each without its
/// `date` line (the only part that may differ between two servers a second apart).
async fn raw_responses(stream: &mut TcpStream, count: usize) -> Vec<String> {
    let mut received = Vec::new();
    let mut responses = Vec::new();
    let mut buffer = [0_u8; 4096];
    let read = async {
        // Bounded by the timeout around it; each round parses what arrived or reads more.
        while responses.len() < count {
            let text = String::from_utf8_lossy(&received).into_owned();
            let whole = text.find("\r\n\r\n").and_then(|head_end| {
                let head = &text[..head_end];
                let len: usize = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length: "))
                    .and_then(|len| len.parse().ok())?;
                (text.len() >= head_end + 4 + len).then_some((head_end + 4 + len, head.to_owned()))
            });
            if let Some((end, head)) = whole {
                let body = &text[head.len() + 4..end];
                let head: Vec<&str> = head.lines().filter(|line| !line.starts_with("date: ")).collect();
                responses.push(format!("{}\r\n\r\n{body}", head.join("\r\n")));
                received.drain(..end);
                continue;
            }
            let n = stream.read(&mut buffer).await.expect("reads");
            assert!(n > 0, "closed before {count} answers: {responses:?} {text}");
            received.extend_from_slice(&buffer[..n]);
        }
    };
    tokio::time::timeout(TIMEOUT, read).await.expect("answers within the timeout");
    responses
}

/// `answer` with its `reset_after_ms` rounded to whole seconds (its other bytes as they are).
fn to_reset_seconds(answer: &str) -> String {
    const FIELD: &str = "\"reset_after_ms\":";
    let Some(at) = answer.find(FIELD).map(|at| at + FIELD.len()) else { return answer.to_owned() };
    let digits = answer[at..].bytes().take_while(u8::is_ascii_digit).count();
    let ms: u64 = answer[at..at + digits].parse().expect("milliseconds");
    format!("{}{}s{}", &answer[..at], (ms + 500) / 1000, &answer[at + digits..])
}

/// The front that answers `POST /v1/check` itself answers with the router's bytes: the same
/// check answered by the front (first on its connection) and by the router (after another
/// route handed the connection over) gives the same response but for its date; pipelined
/// checks are answered in order, a check split across writes waits for its rest, and requests
/// the front does not take (chunked bodies, bad bodies, HTTP/1.0) are still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_front_answers_with_the_routers_bytes() {
    let h = Harness::standard("front").await;
    // The front: three pipelined checks in one write, then a fourth split mid-body.
    let mut front = TcpStream::connect(&h.addr).await.expect("connects");
    front.write_all(&check_requests(&["f1", "f2", "f1"], "")).await.expect("sends");
    let split = check_requests(&["f3"], "");
    front.write_all(&split[..split.len() - 5]).await.expect("sends");
    let answers = raw_responses(&mut front, 3).await;
    front.write_all(&split[split.len() - 5..]).await.expect("sends");
    let split_answer = raw_responses(&mut front, 1).await;

    // The router: a scrape first hands the connection over, then the same checks.
    let mut router = TcpStream::connect(&h.addr).await.expect("connects");
    let mut bytes = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n".to_vec();
    bytes.extend_from_slice(&check_requests(&["r1", "r2", "r1", "r3"], ""));
    router.write_all(&bytes).await.expect("sends");
    let routed = raw_responses(&mut router, 5).await;
    assert!(routed[0].starts_with("HTTP/1.1 200 OK"), "{}", routed[0]);
    // A key's second check is answered with the time since its first, in milliseconds: on a
    // loaded machine the router's pair may be a millisecond further apart than the front's.
    let coarse = |answers: &[String]| answers.iter().map(|a| to_reset_seconds(a)).collect::<Vec<_>>();
    assert_eq!(coarse(&answers), coarse(&routed[1..4]), "front and router answer the same checks alike");
    assert_eq!(split_answer[0], routed[4]);
    assert!(answers[0].contains("x-ratelimit-remaining: 2\r\n"), "{}", answers[0]);
    assert!(answers[2].contains("x-ratelimit-remaining: 1\r\n"), "{}", answers[2]);

    // `Connection: close`: answered alike, then closed.
    let (front_closed, _) = until_closed(&h.addr, &check_requests(&["c1"], "Connection: close\r\n")).await;
    let bytes = [
        b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n".as_slice(),
        &check_requests(&["c2"], "Connection: close\r\n"),
    ]
    .concat();
    let (router_closed, _) = until_closed(&h.addr, &bytes).await;
    let without_date = |bytes: &[u8]| -> String {
        let text = String::from_utf8_lossy(bytes);
        text.split("\r\n").filter(|line| !line.starts_with("date: ")).collect::<Vec<_>>().join("\r\n")
    };
    let router_text = without_date(&router_closed);
    let check_at = router_text.rfind("HTTP/1.1 ").expect("two answers");
    assert_eq!(without_date(&front_closed), router_text[check_at..]);
    assert!(router_text[check_at..].contains("connection: close\r\n"), "{router_text}");

    // Not the front's: a chunked body, HTTP/1.0, a bad body. Still answered, by the router.
    let mut chunked =
        b"POST /v1/check HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec();
    for chunk in [r#"{"key": "k", "#, r#""policy": "gcra"}"#] {
        chunked.extend_from_slice(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes());
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let Closed::Answered(r) = exchange(&h.addr, &chunked).await else { panic!("no answer") };
    assert_eq!(r.status, 200, "{}", r.text());
    let old =
        b"POST /v1/check HTTP/1.0\r\nContent-Length: 34\r\n\r\n{\"key\": \"k\", \"policy\": \"gcra\"}    ";
    let Closed::Answered(r) = exchange(&h.addr, old).await else { panic!("no answer") };
    assert_eq!(r.status, 200, "{}", r.text());
    let r = h.post_raw("/v1/check", br#"{"key": "k", "policy": "gcra", "cost": "x"}"#).await;
    assert_error(&r, 400, Some("cost"), "a bad body is the router's to answer");
    // A check, then garbage on the same connection: the check is answered, the garbage gets
    // hyper's 400 and the connection closes.
    let bytes = [check_requests(&["g1"], "").as_slice(), b"\x00\x01 GARBAGE\r\n\r\n"].concat();
    let (received, _) = until_closed(&h.addr, &bytes).await;
    let text = String::from_utf8_lossy(&received);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("}HTTP/1.1 400 Bad Request\r\n"), "{text}");
    // Two lengths, or a length and chunked (request smuggling): never the front's, refused.
    for smuggled in [
        "Content-Length: 34\r\nContent-Length: 35\r\n",
        "Content-Length: 34\r\nTransfer-Encoding: chunked\r\n",
    ] {
        let head = format!("POST /v1/check HTTP/1.1\r\nHost: t\r\n{smuggled}Connection: close\r\n\r\n");
        let bytes = [head.as_bytes(), br#"{"key": "k", "policy": "gcra"}    "#].concat();
        let (received, _) = until_closed(&h.addr, &bytes).await;
        let text = String::from_utf8_lossy(&received);
        assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{smuggled:?}: {text}");
    }
    assert_still_serving(&h).await;
    let metrics = h.get("/metrics").await.text();
    assert!(
        metrics.contains(r#"ratemesh_http_request_duration_seconds_count{route="check",status="200"}"#),
        "{metrics}"
    );
    h.stop().await;
}

/// RFC 9112, section 3.2: an HTTP/1.1 request without exactly one `Host` is answered 400, by the
/// front's route and the others alike, and counts nothing; HTTP/1.0 may omit it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_1_request_needs_exactly_one_host() {
    let h = Harness::standard("host").await;
    let body = r#"{"key": "hostless", "policy": "token_bucket"}"#;
    let check = |version: &str, hosts: &str| {
        format!("POST /v1/check HTTP/{version}\r\n{hosts}Content-Length: {}\r\n\r\n{body}", body.len())
    };
    let cases = [
        (check("1.1", ""), "400"),
        (check("1.1", "Host: a\r\nHost: b\r\n"), "400"),
        ("GET /healthz HTTP/1.1\r\n\r\n".to_owned(), "400"),
        (check("1.0", ""), "200"),
        (check("1.1", "Host: t\r\n"), "200"),
    ];
    for (request, status) in cases {
        let mut stream = TcpStream::connect(&h.addr).await.expect("connects");
        stream.write_all(request.as_bytes()).await.expect("sends");
        let answer = raw_responses(&mut stream, 1).await.remove(0);
        let code = answer.split(' ').nth(1);
        assert_eq!(code, Some(status), "{request:?} → {answer}");
        if status == "400" {
            assert!(answer.contains(r#""field":"host""#), "{answer}");
        }
    }
    // Two checks passed (HTTP/1.0 and the last): the refused ones took nothing.
    let r = h.post("/v1/check", &json!({"key": "hostless", "policy": "token_bucket", "cost": 0})).await;
    let limit = json_of(&r)["limit"].as_u64().expect("a limit");
    assert_eq!(json_of(&r)["remaining"].as_u64(), Some(limit.saturating_sub(2)), "{}", json_of(&r));
    h.stop().await;
}

/// An HTTP/2 client with prior knowledge (`curl --http2-prior-knowledge`) is told why it is
/// refused: the server preface and a GOAWAY with HTTP_1_1_REQUIRED, then the close (hyper
/// closed without a byte); the preface split across reads is recognised too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_preface_is_refused_with_http_1_1_required() {
    let h = Harness::standard("h2").await;
    // The client preface and an empty SETTINGS frame, as curl sends them.
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    for split in [preface.len(), 12] {
        let mut stream = TcpStream::connect(&h.addr).await.expect("connects");
        stream.write_all(&preface[..split]).await.expect("sends");
        if split < preface.len() {
            tokio::task::yield_now().await;
            stream.write_all(&preface[split..]).await.expect("sends");
        }
        let mut received = Vec::new();
        tokio::time::timeout(TIMEOUT, stream.read_to_end(&mut received))
            .await
            .expect("closed in time")
            .expect("reads");
        assert_eq!(received[..9], [0, 0, 0, 4, 0, 0, 0, 0, 0], "the server preface: an empty SETTINGS");
        let goaway = &received[9..];
        let len = usize::from(goaway[1]) << 8 | usize::from(goaway[2]);
        assert_eq!((goaway[3], goaway.len()), (7, 9 + len), "one GOAWAY frame: {received:?}");
        assert_eq!(goaway[13..17], [0, 0, 0, 0xd], "HTTP_1_1_REQUIRED");
        let reason = String::from_utf8_lossy(&goaway[17..]);
        assert!(reason.contains("HTTP/1.1"), "{reason}");
    }
    assert_still_serving(&h).await;
    h.stop().await;
}

/// `GET /v1/audit` on `h`, polled until `done` holds (audit windows close a settle time after
/// they end), at most [`TIMEOUT`].
async fn audit_until(h: &Harness, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let answer = json_of(&h.get("/v1/audit").await);
        if done(&answer) {
            return answer;
        }
        assert!(tokio::time::Instant::now() < deadline, "not within {TIMEOUT:?}: {answer}");
        // The interval of a bounded poll, not a synchronization.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /v1/audit` and the `ratemesh_audit_*` series on one node: a named policy's checks and
/// an inline limit's are audited (the inline one under `inline`), a policy with `audit = false`
/// is not; the key is named; a key first checked once the node has been calm for longer than
/// its limit takes to refill is audited whole from its first window; bad queries are refused
/// naming the field (an unknown policy 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_is_served_per_policy_with_its_worst_keys_and_exported() {
    let config = format!(
        "{BASE}\n[[policies]]\nname = \"tb\"\nalgorithm = \"token_bucket\"\nlimit = 10\nperiod_ms = 1000\nmode = \"exact\"\n\n\
         [[policies]]\nname = \"quiet\"\nalgorithm = \"token_bucket\"\nlimit = 10\nperiod_ms = 1000\naudit = false\n"
    );
    let h = Harness::start("audit", &config).await;
    let mut admitted = 0;
    for _ in 0..30 {
        let r = h.post("/v1/check", &json!({"key": "user:1", "policy": "tb"})).await;
        admitted += u64::from(json_of(&r)["allowed"] == json!(true));
        h.post("/v1/check", &json!({"key": "user:1", "policy": "quiet"})).await;
        let inline =
            json!({"key": "i", "limit": {"algorithm": "token_bucket", "limit": 5, "period_ms": 1000}});
        assert_eq!(h.post("/v1/check", &inline).await.status, 200);
    }
    assert!((10..30).contains(&admitted), "{admitted}");
    // The keys' first windows close, complete or not: whether the node was up for a second (the
    // limits' refill) before their first checks is up to the host.
    let row = |answer: &Value, name: &str| {
        answer["policies"]
            .as_array()
            .and_then(|rows| rows.iter().find(|row| row["policy"] == json!(name)).cloned())
    };
    let closed =
        |r: Value| r["key_windows"].as_u64().unwrap_or(0) + r["incomplete_key_windows"].as_u64().unwrap_or(0);
    let first_closed = |answer: &Value| {
        ["tb", "inline"].iter().all(|name| row(answer, name).is_some_and(|r| closed(r) >= 1))
    };
    audit_until(&h, first_closed).await;
    // A window has closed since: the node has been calm for longer than a second, so a key born
    // now has no history and is audited from its first window.
    for _ in 0..5 {
        assert_eq!(h.post("/v1/check", &json!({"key": "user:2", "policy": "tb"})).await.status, 200);
        assert_eq!(h.post("/v1/check", &json!({"key": "user:1", "policy": "tb"})).await.status, 200);
        let inline =
            json!({"key": "i", "limit": {"algorithm": "token_bucket", "limit": 5, "period_ms": 1000}});
        assert_eq!(h.post("/v1/check", &inline).await.status, 200);
    }
    let key = |answer: &Value, name: &str| {
        answer["keys"].as_array().and_then(|keys| keys.iter().find(|k| k["key"] == json!(name)).cloned())
    };
    let complete = |answer: &Value| {
        ["tb", "inline"]
            .iter()
            .all(|name| row(answer, name).is_some_and(|r| r["key_windows"].as_u64() >= Some(1)))
            && key(answer, "user:2").is_some_and(|k| k["admitted"] == json!(5))
    };
    let answer = audit_until(&h, complete).await;
    let born = key(&answer, "user:2").expect("user:2");
    assert_eq!(
        (born["arrivals"].clone(), born["incomplete_windows"].clone()),
        (json!(5), json!(0)),
        "{born}"
    );
    assert_eq!(
        (answer["span_s"].clone(), answer["nodes_asked"].clone(), answer["nodes_answered"].clone()),
        (json!(60), json!(1), json!(1))
    );
    let rows = answer["policies"].as_array().expect("rows");
    assert!(rows.iter().all(|row| row["policy"] != json!("quiet")), "audit = false: {answer}");
    let tb = rows.iter().find(|row| row["policy"] == json!("tb")).expect("tb");
    assert_eq!(tb["window_ms"], json!(1000));
    assert_eq!(
        (tb["over_admitted"].clone(), tb["over_admission_ratio"].clone()),
        (json!(0), json!(0.0)),
        "{tb}"
    );
    let user = key(&answer, "user:1").expect("user:1");
    assert_eq!((user["policy"].clone(), user["owner"].clone()), (json!("tb"), json!(1)), "{user}");
    assert_eq!(user["key_hash"].as_str().map(str::len), Some(32), "{user}");
    let only = json_of(&h.get("/v1/audit?policy=tb&n=1").await);
    assert_eq!(only["policies"].as_array().map(Vec::len), Some(1), "{only}");
    assert_eq!(only["keys"].as_array().map(Vec::len), Some(1), "{only}");
    let quiet = json_of(&h.get("/v1/audit?policy=quiet").await);
    assert_eq!((quiet["policies"].clone(), quiet["keys"].clone()), (json!([]), json!([])), "{quiet}");
    for (query, status, field) in [
        ("policy=nope", 404, "policy"),
        ("n=0", 400, "n"),
        ("n=101", 400, "n"),
        ("by=x", 400, "by"),
        ("n=1&n=2", 400, "n"),
    ] {
        let r = h.get(&format!("/v1/audit?{query}")).await;
        assert_eq!((r.status, json_of(&r)["field"].clone()), (status, json!(field)), "{query}: {}", r.text());
    }

    let samples = parse_exposition(&h.get("/metrics").await.text());
    let value = |name: &str, labels: &[(&str, &str)]| {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == name && labels.iter().all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, v)| *v)
    };
    let tb_labels = [("policy", "tb"), ("window", "1")];
    assert_eq!(value("ratemesh_audit_over_admission_ratio", &tb_labels), Some(0.0));
    assert!(value("ratemesh_audit_admitted_over_limit_ratio", &tb_labels).is_some());
    assert!(value("ratemesh_audit_false_refusal_ratio", &[("policy", "inline")]).is_some());
    let incomplete = [("policy", "tb"), ("window", "1"), ("complete", "false")];
    // user:1's first window if it began before its record, and the next if it had hits (within
    // the ideal's memory of the first); none of user:2's.
    let left_out = value("ratemesh_audit_key_windows", &incomplete).unwrap_or(0.0);
    assert!((0.0..=2.0).contains(&left_out), "{left_out:?}");
    let complete = [("policy", "tb"), ("window", "1"), ("complete", "true")];
    assert!(value("ratemesh_audit_key_windows", &complete).is_some_and(|n| n >= 1.0));
    assert!(
        samples
            .iter()
            .filter(|(n, _, _)| n.starts_with("ratemesh_audit_"))
            .all(|(_, labels, _)| !labels.iter().any(|(_, v)| v == "quiet")),
        "audit = false exports nothing"
    );
    assert_eq!(value("ratemesh_audit_keys", &[]), Some(3.0), "tb's two keys and the inline one");
    assert_eq!(value("ratemesh_audit_sample_bits", &[]), Some(0.0));
    assert!(value("ratemesh_audit_late_hits_total", &[]).is_some());
    h.stop().await;
}
