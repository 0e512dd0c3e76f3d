//! Envoy's Rate Limit Quota Service of an in-process daemon on an ephemeral loopback port, spoken
//! by envoy-types' generated client (tonic) as Envoy's filter speaks it (FIELD-NOTES-3 §1.2): an
//! immediate 0-s first report, the domain on every message, all buckets every 5 s.
//!
//! The bounds tests emulate Envoys over simulated time: each Envoy's token bucket is simulated
//! from the assignments the server really sent (a changed strategy starts full, an identical one
//! carries over), its reports say what it admitted and refused over 5 s, and they are sent at
//! once; so a minute of traffic takes well under a second. Every wait is bounded by [`TIMEOUT`];
//! nothing sleeps.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use ratemeshd::config::Config;
use ratemeshd::daemon::Daemon;
use ratemeshd::serve::{self, Servers};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status, Streaming};

/// The bound of every wait.
const TIMEOUT: Duration = Duration::from_secs(20);
/// Envoy's report period.
const PERIOD_S: u64 = 5;
/// The policy's limit per second.
const LIMIT: f64 = 1000.0;

fn config(extra: &str) -> String {
    format!(
        r#"
[listen]
http = "127.0.0.1:0"
grpc = "127.0.0.1:0"
rlqs = "127.0.0.1:0"
gossip = "127.0.0.1:0"
quic = "127.0.0.1:0"
{extra}
[[policies]]
name = "api"
algorithm = "token_bucket"
limit = 1000
period_ms = 1000
burst = 1000

[[rlqs]]
domain = "edge"
policy = "api"
"#
    )
}

async fn start(extra: &str) -> Servers {
    let config = Config::parse(&config(extra), "rlqs.toml").expect("valid config");
    let daemon = Daemon::start(config).await.expect("daemon starts");
    serve::start(Arc::clone(&daemon)).await.expect("servers start")
}

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId { bucket: entries.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect() }
}

fn usage(id: &BucketId, seconds: i64, allowed: u64, denied: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(id.clone()),
        time_elapsed: Some(ProtoDuration { seconds, nanos: 0 }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

/// A bucket's assignment as the filter holds it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Held {
    /// `rate` tokens per second, at most `max` (`Strategy::TokenBucket`); `ttl_s` whole seconds.
    Bucket {
        tokens_per_fill: u32,
        fill_interval_s: i64,
        max: u32,
        ttl_s: i64,
    },
    Blanket(BlanketRule),
    Abandoned,
}

impl Held {
    fn rate(self) -> f64 {
        match self {
            Held::Bucket { tokens_per_fill, fill_interval_s, .. } => {
                f64::from(tokens_per_fill) / fill_interval_s as f64
            }
            Held::Blanket(BlanketRule::AllowAll) => f64::INFINITY,
            Held::Blanket(BlanketRule::DenyAll) | Held::Abandoned => 0.0,
        }
    }
    fn max(self) -> u32 {
        match self {
            Held::Bucket { max, .. } => max,
            _ => 0,
        }
    }
}

fn key(id: &BucketId) -> String {
    let mut entries: Vec<_> = id.bucket.iter().collect();
    entries.sort();
    format!("{entries:?}")
}

/// One emulated Envoy: a stream of one domain, and the assignments it holds.
struct Envoy {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: Streaming<RateLimitQuotaResponse>,
    domain: String,
    held: HashMap<String, Held>,
    /// Strategy changes received (each hands out a fresh bucket in Envoy).
    changes: usize,
    marker: u64,
}

impl Envoy {
    async fn open(addr: SocketAddr, domain: &str) -> Result<Envoy, Status> {
        let mut client =
            tokio::time::timeout(TIMEOUT, RateLimitQuotaServiceClient::connect(format!("http://{addr}")))
                .await
                .expect("bounded")
                .expect("connects");
        let (tx, rx) = mpsc::channel(16);
        let rx = tokio::time::timeout(TIMEOUT, client.stream_rate_limit_quotas(ReceiverStream::new(rx)))
            .await
            .expect("bounded")?
            .into_inner();
        Ok(Envoy { tx, rx, domain: domain.to_owned(), held: HashMap::new(), changes: 0, marker: 0 })
    }

    async fn send(&self, domain: &str, usages: Vec<BucketQuotaUsage>) {
        let report = RateLimitQuotaUsageReports { domain: domain.to_owned(), bucket_quota_usages: usages };
        tokio::time::timeout(TIMEOUT, self.tx.send(report)).await.expect("bounded").expect("stream open");
    }

    /// The next message (`Ok(None)`: the stream ended with OK).
    async fn next(&mut self) -> Result<Option<RateLimitQuotaResponse>, Status> {
        tokio::time::timeout(TIMEOUT, self.rx.message()).await.expect("an answer within the bound")
    }

    fn apply(&mut self, response: &RateLimitQuotaResponse) {
        for action in &response.bucket_action {
            let id = action.bucket_id.as_ref().expect("every action names its bucket");
            let held = match action.bucket_action.expect("an action") {
                bucket_action::BucketAction::AbandonAction(_) => Held::Abandoned,
                bucket_action::BucketAction::QuotaAssignmentAction(q) => {
                    let ttl = q.assignment_time_to_live.expect("a TTL");
                    assert_eq!(ttl.nanos, 0, "whole-second TTLs");
                    match q.rate_limit_strategy.and_then(|s| s.strategy).expect("a strategy") {
                        Strategy::TokenBucket(b) => {
                            let fill = b.fill_interval.expect("a fill interval");
                            assert!(fill.seconds >= 1 && fill.nanos == 0, "whole-second fill intervals");
                            assert!(b.max_tokens > 0);
                            Held::Bucket {
                                tokens_per_fill: b.tokens_per_fill.expect("tokens_per_fill").value,
                                fill_interval_s: fill.seconds,
                                max: b.max_tokens,
                                ttl_s: ttl.seconds,
                            }
                        }
                        Strategy::BlanketRule(rule) => {
                            Held::Blanket(BlanketRule::try_from(rule).expect("rule"))
                        }
                        Strategy::RequestsPerTimeUnit(_) => panic!("Envoy ignores requests_per_time_unit"),
                    }
                }
            };
            let previous = self.held.insert(key(id), held);
            let same_strategy = |a: Option<Held>, b: Held| match (a, b) {
                (
                    Some(Held::Bucket { tokens_per_fill: t1, fill_interval_s: f1, max: m1, .. }),
                    Held::Bucket { tokens_per_fill: t2, fill_interval_s: f2, max: m2, .. },
                ) => (t1, f1, m1) == (t2, f2, m2),
                (a, b) => a == Some(b),
            };
            // Markers are new buckets each time: only the buckets reported again count.
            if previous.is_some() && !same_strategy(previous, held) {
                if std::env::var_os("RLQS_DEBUG").is_some() {
                    eprintln!("{}: {previous:?} -> {held:?}", key(id));
                }
                self.changes += 1;
            }
        }
    }

    /// Reports `usages` with a marker bucket of its own and applies every message until the
    /// answer to this report (the one naming the marker): pushes before it included.
    async fn report(&mut self, usages: Vec<BucketQuotaUsage>) {
        // Unique across Envoys: a marker is a group of its own.
        static MARKERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        self.marker = MARKERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let marker = bucket(&[("marker", &self.marker.to_string())]);
        let mut usages = usages;
        usages.push(usage(&marker, 0, 0, 0));
        let domain = self.domain.clone();
        self.send(&domain, usages).await;
        let wanted = key(&marker);
        for _ in 0..1000 {
            let response = self.next().await.expect("no error").expect("stream open");
            self.apply(&response);
            if response.bucket_action.iter().any(|a| a.bucket_id.as_ref().map(key) == Some(wanted.clone())) {
                return;
            }
        }
        panic!("no answer to the report");
    }

    fn held(&self, id: &BucketId) -> Held {
        *self.held.get(&key(id)).expect("an assignment")
    }
}

/// An Envoy's token bucket over simulated time, refilled continuously as Envoy's is.
#[derive(Default)]
struct Sim {
    tokens: f64,
    strategy: Option<Held>,
    arrivals: f64,
}

impl Sim {
    /// `demand` requests per second for `PERIOD_S` under `held`: (allowed, denied).
    fn run(&mut self, held: Held, demand: f64) -> (u64, u64) {
        let same = matches!((self.strategy, held), (Some(Held::Bucket { tokens_per_fill: a, fill_interval_s: b, max: c, .. }), Held::Bucket { tokens_per_fill: x, fill_interval_s: y, max: z, .. }) if (a, b, c) == (x, y, z));
        if !same {
            // A changed bucket starts full (Envoy @0b55961).
            self.tokens = f64::from(held.max());
        }
        self.strategy = Some(held);
        let (rate, max) = (held.rate(), f64::from(held.max()));
        let (mut allowed, mut denied) = (0, 0);
        let steps = PERIOD_S * 1000;
        for _ in 0..steps {
            self.tokens = (self.tokens + rate / 1000.0).min(max);
            self.arrivals += demand / 1000.0;
            while self.arrivals >= 1.0 {
                self.arrivals -= 1.0;
                if self.tokens >= 1.0 {
                    self.tokens -= 1.0;
                    allowed += 1;
                } else {
                    denied += 1;
                }
            }
        }
        (allowed, denied)
    }
}

/// Emulated Envoys with `demands` (requests per second) against one bucket for `periods`
/// report periods: the admitted count per Envoy and period.
async fn fleet(addr: SocketAddr, demands: &[f64], periods: usize) -> (Vec<Envoy>, Vec<Vec<u64>>) {
    let id = bucket(&[("user", "alice")]);
    let mut envoys = Vec::new();
    for _ in demands {
        let mut envoy = Envoy::open(addr, "edge").await.expect("opens");
        // The first request's immediate report: 0 s, answered at once.
        envoy.report(vec![usage(&id, 0, 1, 0)]).await;
        assert!(matches!(envoy.held(&id), Held::Bucket { ttl_s: 10, .. }), "{:?}", envoy.held(&id));
        envoys.push(envoy);
    }
    let mut sims: Vec<Sim> = demands.iter().map(|_| Sim::default()).collect();
    let mut admitted = vec![Vec::new(); demands.len()];
    for _ in 0..periods {
        for (i, envoy) in envoys.iter_mut().enumerate() {
            let (allowed, denied) = sims[i].run(envoy.held(&id), demands[i]);
            admitted[i].push(allowed);
            envoy.report(vec![usage(&id, PERIOD_S as i64, allowed, denied)]).await;
        }
        // Every Envoy takes the pushes its peers' reports caused (a real one reads them at once).
        for envoy in envoys.iter_mut() {
            envoy.report(Vec::new()).await;
        }
        let rate: f64 = envoys.iter().map(|e| e.held(&id).rate()).sum();
        let burst: u32 = envoys.iter().map(|e| e.held(&id).max()).sum();
        assert!(rate <= LIMIT, "Σ assigned rate {rate} over the limit");
        assert!(burst <= 1000, "Σ max_tokens {burst} over the burst");
    }
    (envoys, admitted)
}

/// Admitted per second by each Envoy over the periods after the first two (10 s).
fn rates_after_warmup(admitted: &[Vec<u64>]) -> Vec<f64> {
    admitted
        .iter()
        .map(|periods| {
            let steady = &periods[2..];
            steady.iter().sum::<u64>() as f64 / (steady.len() as u64 * PERIOD_S) as f64
        })
        .collect()
}

#[tokio::test]
async fn three_envoys_over_the_limit_share_it_fairly() {
    let servers = start("").await;
    let addr = servers.rlqs_addr().expect("RLQS bound");
    let (envoys, admitted) = fleet(addr, &[600.0, 600.0, 600.0], 12).await;
    let rates = rates_after_warmup(&admitted);
    let total: f64 = rates.iter().sum();
    eprintln!("3 × 600/s against 1000/s: admitted {rates:?}/s, Σ {total:.1}/s");
    assert!((0.95 * LIMIT..=1.05 * LIMIT).contains(&total), "Σ admitted {total}");
    for rate in &rates {
        assert!((rate - LIMIT / 3.0).abs() <= 0.1 * LIMIT / 3.0, "{rates:?}");
    }
    // Steady demand: no strategy changes after the first periods.
    let changes: Vec<usize> = envoys.iter().map(|e| e.changes).collect();
    eprintln!("strategy changes per Envoy over 12 periods: {changes:?}");
    assert!(changes.iter().all(|c| *c <= 6), "share churn: {changes:?}");
    servers.shutdown().await;
}

#[tokio::test]
async fn skewed_demand_is_split_in_proportion() {
    let servers = start("").await;
    let addr = servers.rlqs_addr().expect("RLQS bound");
    let (_, admitted) = fleet(addr, &[1500.0, 300.0, 200.0], 12).await;
    let rates = rates_after_warmup(&admitted);
    eprintln!("1500/300/200 per s against 1000/s: admitted {rates:?}/s");
    for (rate, expected) in rates.iter().zip([750.0, 150.0, 100.0]) {
        assert!((rate - expected).abs() <= 0.1 * expected, "{rates:?}");
    }
    servers.shutdown().await;
}

#[tokio::test]
async fn below_the_limit_everything_is_admitted_and_a_leaver_frees_its_share() {
    let servers = start("").await;
    let addr = servers.rlqs_addr().expect("RLQS bound");
    let demands = [200.0, 200.0, 200.0];
    let (mut envoys, admitted) = fleet(addr, &demands, 12).await;
    let offered: f64 = demands.iter().sum::<f64>() * 10.0 * PERIOD_S as f64;
    let got: u64 = admitted.iter().map(|p| p[2..].iter().sum::<u64>()).sum();
    eprintln!("3 × 200/s against 1000/s: {:.2} % admitted", 100.0 * got as f64 / offered);
    assert!(got as f64 >= 0.99 * offered, "{got} of {offered}");

    // Two of three at 600/s: one leaves; the other two reach the whole limit within 3 periods.
    let id = bucket(&[("user", "alice")]);
    for envoy in envoys.iter_mut().take(2) {
        envoy.report(vec![usage(&id, PERIOD_S as i64, 3000, 0)]).await;
    }
    let leaver = envoys.pop().expect("three");
    drop(leaver);
    let mut periods = 0;
    loop {
        periods += 1;
        for envoy in envoys.iter_mut() {
            envoy.report(vec![usage(&id, PERIOD_S as i64, 2500, 500)]).await;
        }
        for envoy in envoys.iter_mut() {
            envoy.report(Vec::new()).await;
        }
        let rate: f64 = envoys.iter().map(|e| e.held(&id).rate()).sum();
        if rate >= 0.99 * LIMIT {
            eprintln!("after a leave: the whole limit within {periods} report period(s)");
            break;
        }
        assert!(periods < 3, "Σ {rate} after {periods} periods");
    }
    servers.shutdown().await;
}

#[tokio::test]
async fn bad_input_ends_only_its_stream() {
    let servers = start("[limits]\nrlqs_streams_max = 6\nrlqs_buckets_per_stream_max = 50\n").await;
    let addr = servers.rlqs_addr().expect("RLQS bound");
    let good_id = bucket(&[("user", "bob")]);
    let mut good = Envoy::open(addr, "edge").await.expect("opens");
    good.report(vec![usage(&good_id, 0, 1, 0)]).await;

    let refused = |code: Code| {
        move |result: Result<Option<RateLimitQuotaResponse>, Status>| match result {
            Err(status) => assert_eq!(status.code(), code, "{status}"),
            Ok(other) => panic!("expected {code:?}, got {other:?}"),
        }
    };
    // An empty bucket id, an empty value.
    for id in [bucket(&[]), bucket(&[("user", "")])] {
        let mut envoy = Envoy::open(addr, "edge").await.expect("opens");
        envoy.send("edge", vec![usage(&id, 0, 1, 0)]).await;
        refused(Code::InvalidArgument)(envoy.next().await);
    }
    // No domain first; another domain later.
    let mut envoy = Envoy::open(addr, "edge").await.expect("opens");
    envoy.send("", vec![usage(&good_id, 0, 1, 0)]).await;
    refused(Code::InvalidArgument)(envoy.next().await);
    let mut envoy = Envoy::open(addr, "edge").await.expect("opens");
    envoy.report(vec![usage(&good_id, 0, 1, 0)]).await;
    envoy.send("other", vec![usage(&good_id, 5, 1, 0)]).await;
    refused(Code::InvalidArgument)(envoy.next().await);
    // Too many buckets on one stream.
    let mut envoy = Envoy::open(addr, "edge").await.expect("opens");
    let many: Vec<_> = (0..51).map(|i| usage(&bucket(&[("user", &format!("u{i}"))]), 0, 1, 0)).collect();
    envoy.send("edge", many).await;
    refused(Code::ResourceExhausted)(envoy.next().await);
    // A message over 4 MiB.
    let mut envoy = Envoy::open(addr, "edge").await.expect("opens");
    let huge = bucket(&[("user", &"x".repeat(5 << 20))]);
    envoy.send("edge", vec![usage(&huge, 0, 1, 0)]).await;
    refused(Code::ResourceExhausted)(envoy.next().await);
    // Too many streams: six open at most (the good one and five more).
    let mut open = Vec::new();
    for _ in 0..5 {
        open.push(Envoy::open(addr, "edge").await.expect("opens"));
    }
    match Envoy::open(addr, "edge").await {
        Err(status) => assert_eq!(status.code(), Code::ResourceExhausted, "{status}"),
        Ok(_) => panic!("a seventh stream was accepted"),
    }
    drop(open);
    // The good stream was not disturbed.
    good.report(vec![usage(&good_id, 5, 10, 0)]).await;
    assert!(matches!(good.held(&good_id), Held::Bucket { .. }));
    servers.shutdown().await;
}

#[tokio::test]
async fn unknown_domains_abandonment_and_shutdown() {
    let servers =
        start("[rls]\nrlqs_report_period_ms = 200\nrlqs_abandon_after_periods = 2\nrlqs_unknown_domain = \"deny_all\"\n")
            .await;
    let addr = servers.rlqs_addr().expect("RLQS bound");
    let id = bucket(&[("user", "carol")]);
    let mut other = Envoy::open(addr, "nobody-configured-this").await.expect("opens");
    other.report(vec![usage(&id, 0, 1, 0)]).await;
    assert_eq!(other.held(&id), Held::Blanket(BlanketRule::DenyAll));

    let mut envoy = Envoy::open(addr, "edge").await.expect("opens");
    envoy.report(vec![usage(&id, 0, 1, 0)]).await;
    // TTL: two 200-ms periods, rounded up to whole seconds.
    assert!(matches!(envoy.held(&id), Held::Bucket { ttl_s: 1, .. }), "{:?}", envoy.held(&id));
    // Silent for two periods: abandoned (bounded: the abandon comes within a few periods).
    for _ in 0..100 {
        let response = envoy.next().await.expect("no error").expect("open");
        envoy.apply(&response);
        if envoy.held(&id) == Held::Abandoned {
            break;
        }
    }
    assert_eq!(envoy.held(&id), Held::Abandoned);

    // Graceful shutdown ends the streams with OK (Envoy reconnects elsewhere).
    let shutdown = tokio::spawn(servers.shutdown());
    loop {
        match envoy.next().await {
            Ok(Some(response)) => envoy.apply(&response),
            Ok(None) => break,
            Err(status) => panic!("ended with {status}"),
        }
    }
    tokio::time::timeout(TIMEOUT, shutdown).await.expect("bounded").expect("shut down");
}

#[tokio::test]
async fn tiers_and_unknown_domains_as_configured_and_counted() {
    let servers = start(
        "[[policies]]\nname = \"plans\"\nalgorithm = \"token_bucket\"\nlimit = 100\nperiod_ms = 1000\n\
         tiers = [{ name = \"pro\", limit = 5000 }]\n\n[[rlqs]]\ndomain = \"tiered\"\npolicy = \"plans\"\n\
         tier_entry = \"plan\"\n",
    )
    .await;
    let addr = servers.rlqs_addr().expect("RLQS bound");
    let mut envoy = Envoy::open(addr, "tiered").await.expect("opens");
    let pro = bucket(&[("tenant", "a"), ("plan", "pro")]);
    let plain = bucket(&[("tenant", "b")]);
    let unknown_tier = bucket(&[("tenant", "c"), ("plan", "platinum")]);
    envoy.report(vec![usage(&pro, 0, 0, 0), usage(&plain, 0, 0, 0), usage(&unknown_tier, 0, 0, 0)]).await;
    assert_eq!(envoy.held(&pro).rate(), 5000.0, "the tier's limit");
    assert_eq!(envoy.held(&plain).rate(), 100.0, "no tier entry: the policy's own limit");
    assert_eq!(envoy.held(&unknown_tier).rate(), 100.0, "a tier the policy lacks: its own limit");

    let mut stranger = Envoy::open(addr, "nobody-configured-this").await.expect("opens");
    stranger.report(vec![usage(&plain, 0, 1, 0)]).await;
    let metrics = http_get(servers.http_addr(), "/metrics").await;
    // The stranger's bucket and its marker; the configured stream by its domain.
    assert!(metrics.contains("ratemesh_rlqs_unknown_domain_reports_total 2"), "{metrics}");
    assert!(metrics.contains("ratemesh_rlqs_domain_streams{domain=\"tiered\"} 1"), "{metrics}");
    assert!(metrics.contains("ratemesh_rlqs_domain_buckets{domain=\"tiered\"} 4"), "{metrics}");
    assert!(metrics.contains("ratemesh_rlqs_domain_streams{domain=\"unknown\"} 1"), "{metrics}");
    // Four keys of "plans" (three buckets and the marker): one node holds each whole limit.
    for series in ["limit_rate", "node_rate", "assigned_rate"] {
        let line = format!("ratemesh_rlqs_{series}{{policy=\"plans\"}} 5300");
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    let state = http_get(servers.http_addr(), "/v1/rlqs").await;
    assert!(state.contains("\"streams\":2"), "{state}");
    tokio::time::timeout(TIMEOUT, servers.shutdown()).await.expect("bounded");
}

/// `GET path` from the daemon's HTTP API: the body.
async fn http_get(addr: SocketAddr, path: &str) -> String {
    let response = ratemeshd::client::request(&addr.to_string(), "GET", path, &[], b"", TIMEOUT)
        .await
        .expect("the HTTP API answers");
    assert_eq!(response.status, 200, "{path}: {}", response.text());
    response.text()
}
