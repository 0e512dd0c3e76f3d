//! The Envoy Rate Limit Service v3 of a daemon started in-process (ephemeral ports), called with
//! the tonic client of the `envoy-types` crate.
//!
//! Long (one file per front end): every test shares its harness and policy file.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;
use ratemeshd::rls::{DESCRIPTORS_MAX, ENTRIES_MAX, RlsService};
use ratemeshd::serve::{Options, Servers, start, start_with};
use ratemeshd::{Config, Daemon};
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;
use tonic::transport::Channel;

mod support;
use support::{code, descriptor, header, limit, overall, request, until_reset};

/// Limits long enough that nothing refills during a test (token buckets: one token per 20 min).
const POLICIES: &str = r#"
[listen]
http = "127.0.0.1:0"
grpc = "127.0.0.1:0"
gossip = "127.0.0.1:0"
quic = "127.0.0.1:0"

[[policies]]
name = "per-ip"
domain = "edge"
descriptors = [{ key = "remote_address" }]
algorithm = "token_bucket"
limit = 3
period_ms = 3600000
mode = "exact"

[[policies]]
name = "login-per-ip"
domain = "edge"
descriptors = [{ key = "remote_address" }, { key = "path", value = "/login" }]
algorithm = "token_bucket"
limit = 2
period_ms = 3600000
mode = "exact"

[[policies]]
name = "api-per-ip"
domain = "edge"
descriptors = [{ key = "remote_address" }, { key = "path", value = "/api/*" }]
algorithm = "fixed_window"
limit = 100
period_ms = 86400000
mode = "exact"

[[policies]]
name = "health"
domain = "edge"
descriptors = [{ key = "path", value = "/healthz" }]
unlimited = true

[rls]
all_or_nothing_domains = ["strict"]

[[policies]]
name = "strict-per-ip"
domain = "strict"
descriptors = [{ key = "remote_address" }]
algorithm = "token_bucket"
limit = 3
period_ms = 3600000
mode = "exact"

[[policies]]
name = "strict-per-path"
domain = "strict"
descriptors = [{ key = "path" }]
algorithm = "token_bucket"
limit = 1
period_ms = 3600000
mode = "exact"

[[policies]]
name = "jobs"
domain = "edge"
descriptors = [{ key = "job" }]
algorithm = "concurrency"
limit = 2
period_ms = 60000
mode = "exact"

[[policies]]
name = "tuning"
domain = "edge"
descriptors = [{ key = "tenant" }]
algorithm = "token_bucket"
limit = 1
period_ms = 3600000
mode = "exact"
shadow_mode = true
"#;

/// A daemon with its HTTP and gRPC servers, and an RLS client connected to it.
struct Rls {
    servers: Servers,
    client: RateLimitServiceClient<Channel>,
}

impl Rls {
    async fn start() -> Rls {
        let config = Config::parse(POLICIES, "rls-test.toml").expect("the test policies are valid");
        let daemon = Daemon::start(config).await.expect("the daemon starts");
        let servers = start(daemon).await.expect("the servers start");
        Rls::connect(servers).await
    }

    async fn connect(servers: Servers) -> Rls {
        let addr = servers.grpc_addr().expect("the gRPC server is built in");
        let client = RateLimitServiceClient::connect(format!("http://{addr}")).await.expect("connects");
        Rls { servers, client }
    }

    fn daemon(&self) -> &Arc<Daemon> {
        self.servers.daemon()
    }

    async fn call(&self, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        // Bounded: a hung server fails the test instead of hanging it.
        let mut client = self.client.clone();
        let call = client.should_rate_limit(request);
        match tokio::time::timeout(Duration::from_secs(10), call).await {
            Ok(result) => result.map(tonic::Response::into_inner),
            Err(_) => panic!("ShouldRateLimit did not answer within 10 s"),
        }
    }

    /// A call that must succeed, with one status per descriptor.
    async fn ok(&self, request: RateLimitRequest) -> RateLimitResponse {
        let descriptors = request.descriptors.len();
        let response = self.call(request).await.expect("the call succeeds");
        assert_eq!(response.statuses.len(), descriptors, "one status per descriptor");
        response
    }

    async fn stop(self) {
        self.servers.shutdown().await;
    }
}

fn ip(address: &str) -> RateLimitDescriptor {
    descriptor(&[("remote_address", address)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ok_until_the_limit_then_over_limit_with_every_status_filled() {
    let rls = Rls::start().await;
    for remaining in [2, 1, 0] {
        let response = rls.ok(request("edge", vec![ip("10.0.0.1")])).await;
        assert_eq!(overall(&response), Code::Ok);
        let [status] = response.statuses.as_slice() else { panic!("one status per descriptor") };
        assert_eq!(code(status), Code::Ok);
        assert_eq!(limit(status), Some(("per-ip".to_owned(), 3, Unit::Hour)));
        assert_eq!(status.limit_remaining, remaining);
        assert!(until_reset(status) > Duration::ZERO && until_reset(status) <= Duration::from_secs(3600));
        assert_eq!(header(&response, "x-ratelimit-limit"), Some("3"));
        assert_eq!(header(&response, "x-ratelimit-remaining"), Some(remaining.to_string().as_str()));
        assert_eq!(header(&response, "retry-after"), None);
    }
    let response = rls.ok(request("edge", vec![ip("10.0.0.1")])).await;
    assert_eq!(overall(&response), Code::OverLimit);
    let status = &response.statuses[0];
    assert_eq!(code(status), Code::OverLimit);
    assert_eq!(limit(status), Some(("per-ip".to_owned(), 3, Unit::Hour)));
    assert_eq!(status.limit_remaining, 0);
    // A token comes back every 20 minutes: that is when to retry.
    let wait = until_reset(status);
    assert!(wait > Duration::from_secs(1100) && wait <= Duration::from_secs(1200), "{wait:?}");
    assert_eq!(header(&response, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&response, "ratelimit-policy"), Some(r#""per-ip";q=3;w=3600"#));
    let retry: u64 =
        header(&response, "retry-after").expect("Retry-After when refused").parse().expect("secs");
    assert!((1100..=1200).contains(&retry), "{retry}");
    // Another address is another bucket.
    let response = rls.ok(request("edge", vec![ip("10.0.0.2")])).await;
    assert_eq!((overall(&response), response.statuses[0].limit_remaining), (Code::Ok, 2));
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_descriptors_and_wildcard_values_are_matched_in_request_order() {
    let rls = Rls::start().await;
    let login = |address: &str| descriptor(&[("remote_address", address), ("path", "/login")]);
    let api = |address: &str, path: &str| descriptor(&[("remote_address", address), ("path", path)]);
    let response = rls
        .ok(request(
            "edge",
            vec![
                login("10.0.0.1"),
                api("10.0.0.1", "/api/users"),
                api("10.0.0.1", "/static/app.js"),
                ip("10.0.0.1"),
                descriptor(&[("path", "/healthz")]),
            ],
        ))
        .await;
    assert_eq!(overall(&response), Code::Ok);
    let summary: Vec<_> = response.statuses.iter().map(|s| (code(s), limit(s), s.limit_remaining)).collect();
    assert_eq!(
        summary,
        [
            (Code::Ok, Some(("login-per-ip".to_owned(), 2, Unit::Hour)), 1),
            (Code::Ok, Some(("api-per-ip".to_owned(), 100, Unit::Day)), 99),
            // No policy for /static: OK, no limit, nothing counted.
            (Code::Ok, None, 0),
            (Code::Ok, Some(("per-ip".to_owned(), 3, Unit::Hour)), 2),
            // Unlimited.
            (Code::Ok, None, u32::MAX),
        ]
    );
    // One over-limit descriptor makes the whole answer OVER_LIMIT; the others still report.
    rls.ok(request("edge", vec![login("10.0.0.1")])).await;
    let response = rls.ok(request("edge", vec![ip("10.0.0.9"), login("10.0.0.1")])).await;
    assert_eq!(overall(&response), Code::OverLimit);
    assert_eq!(response.statuses.iter().map(code).collect::<Vec<_>>(), [Code::Ok, Code::OverLimit]);
    // The headers are the refused descriptor's.
    assert_eq!(header(&response, "x-ratelimit-limit"), Some("2"));
    // Each value of a wildcard entry is its own bucket; the prefix wildcard counts per path.
    let response = rls.ok(request("edge", vec![login("10.0.0.2"), api("10.0.0.1", "/api/orders")])).await;
    let remaining: Vec<_> = response.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!((overall(&response), remaining), (Code::Ok, vec![1, 99]));
    // A descriptor with more entries than any policy path matches nothing.
    let deep = descriptor(&[("remote_address", "10.0.0.1"), ("path", "/login"), ("method", "POST")]);
    let response = rls.ok(request("edge", vec![deep])).await;
    assert_eq!((code(&response.statuses[0]), limit(&response.statuses[0])), (Code::Ok, None));
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_domain_is_ok_for_every_descriptor() {
    let rls = Rls::start().await;
    for _ in 0..5 {
        let response = rls.ok(request("other", vec![ip("10.0.0.1"), descriptor(&[("a", "b")])])).await;
        assert_eq!(overall(&response), Code::Ok);
        assert_eq!(response.statuses.len(), 2);
        assert!(response.statuses.iter().all(|s| code(s) == Code::Ok && s.current_limit.is_none()));
        assert!(response.response_headers_to_add.is_empty());
    }
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_zero_queries_and_larger_values_take_that_many() {
    let rls = Rls::start().await;
    let remaining = |response: &RateLimitResponse| response.statuses[0].limit_remaining;
    // Request-level 0 means 1.
    let response = rls.ok(request("edge", vec![ip("10.0.0.1")])).await;
    assert_eq!(remaining(&response), 2);
    // A descriptor's own 0 is a query: nothing taken, however often.
    for _ in 0..3 {
        let mut query = ip("10.0.0.1");
        query.hits_addend = Some(UInt64Value { value: 0 });
        let response = rls.ok(request("edge", vec![query])).await;
        assert_eq!((overall(&response), remaining(&response)), (Code::Ok, 2));
    }
    // The request-level value applies to descriptors without their own.
    let mut two = request("edge", vec![ip("10.0.0.1")]);
    two.hits_addend = 2;
    let response = rls.ok(two).await;
    assert_eq!((overall(&response), remaining(&response)), (Code::Ok, 0));
    // The descriptor's own value wins over the request's: 1 of 3 still left elsewhere.
    let mut own = ip("10.0.0.2");
    own.hits_addend = Some(UInt64Value { value: 2 });
    let mut other = request("edge", vec![own, ip("10.0.0.3")]);
    other.hits_addend = 3;
    let response = rls.ok(other).await;
    let left: Vec<_> = response.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!((overall(&response), left), (Code::Ok, vec![1, 0]));
    // More hits than remain are refused (and take nothing).
    let mut four = ip("10.0.0.4");
    four.hits_addend = Some(UInt64Value { value: 4 });
    let response = rls.ok(request("edge", vec![four])).await;
    assert_eq!(overall(&response), Code::OverLimit);
    let response = rls.ok(request("edge", vec![ip("10.0.0.4")])).await;
    assert_eq!((overall(&response), remaining(&response)), (Code::Ok, 2));
    // A refund gives its hit back.
    let mut refund = ip("10.0.0.4");
    refund.is_negative_hits = true;
    refund.hits_addend = Some(UInt64Value { value: 1 });
    let response = rls.ok(request("edge", vec![refund])).await;
    assert_eq!(remaining(&response), 3);
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_override_replaces_the_policy_limit_in_its_own_bucket() {
    let rls = Rls::start().await;
    let overridden = |requests_per_unit, unit: RateLimitUnit| {
        let mut d = ip("10.0.0.1");
        d.limit = Some(RateLimitOverride { requests_per_unit, unit: unit.into() });
        d
    };
    for remaining in (0..5).rev() {
        let response = rls.ok(request("edge", vec![overridden(5, RateLimitUnit::Minute)])).await;
        let status = &response.statuses[0];
        assert_eq!((code(status), status.limit_remaining), (Code::Ok, remaining));
        assert_eq!(limit(status), Some(("per-ip".to_owned(), 5, Unit::Minute)));
    }
    let response = rls.ok(request("edge", vec![overridden(5, RateLimitUnit::Minute)])).await;
    assert_eq!(overall(&response), Code::OverLimit);
    // The configured limit's bucket is untouched, and so is another override's.
    let response = rls.ok(request("edge", vec![ip("10.0.0.1")])).await;
    assert_eq!((overall(&response), response.statuses[0].limit_remaining), (Code::Ok, 2));
    let response = rls.ok(request("edge", vec![overridden(10, RateLimitUnit::Hour)])).await;
    assert_eq!(limit(&response.statuses[0]), Some(("per-ip".to_owned(), 10, Unit::Hour)));
    assert_eq!(response.statuses[0].limit_remaining, 9);
    // Invalid overrides refuse the whole request, and nothing of it is counted.
    for bad in [overridden(5, RateLimitUnit::Unknown), overridden(0, RateLimitUnit::Second)] {
        let status = rls.call(request("edge", vec![ip("10.0.0.1"), bad])).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("descriptors[1].limit"), "{}", status.message());
    }
    let response = rls.ok(request("edge", vec![ip("10.0.0.1")])).await;
    assert_eq!(response.statuses[0].limit_remaining, 1);
    // On an unlimited policy an override changes nothing.
    let mut health = descriptor(&[("path", "/healthz")]);
    health.limit = Some(RateLimitOverride { requests_per_unit: 1, unit: RateLimitUnit::Second.into() });
    for _ in 0..3 {
        let response = rls.ok(request("edge", vec![health.clone()])).await;
        assert_eq!((overall(&response), response.statuses[0].limit_remaining), (Code::Ok, u32::MAX));
    }
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlimited_descriptors_are_always_ok() {
    let rls = Rls::start().await;
    for _ in 0..20 {
        let response = rls.ok(request("edge", vec![descriptor(&[("path", "/healthz")])])).await;
        assert_eq!(overall(&response), Code::Ok);
        let status = &response.statuses[0];
        assert_eq!((code(status), limit(status), status.limit_remaining), (Code::Ok, None, u32::MAX));
        assert!(response.response_headers_to_add.is_empty());
    }
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_answers_ok_but_counts_refusals_in_metrics() {
    let rls = Rls::start().await;
    for _ in 0..3 {
        let response = rls.ok(request("edge", vec![descriptor(&[("tenant", "acme")])])).await;
        assert_eq!(overall(&response), Code::Ok);
        let status = &response.statuses[0];
        assert_eq!((code(status), limit(status)), (Code::Ok, Some(("tuning".to_owned(), 1, Unit::Hour))));
        assert_eq!(header(&response, "retry-after"), None);
    }
    let metrics = rls.daemon().metrics().encode().expect("metrics encode");
    let shadow_refused = metrics
        .lines()
        .find(|line| {
            line.starts_with("ratemesh_requests_total")
                && line.contains(r#"policy="tuning""#)
                && line.contains(r#"decision="shadow_refused""#)
        })
        .unwrap_or_else(|| panic!("no shadow_refused sample in:\n{metrics}"));
    assert!(shadow_refused.ends_with(" 2"), "{shadow_refused}");
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_invalid_arguments_and_count_nothing() {
    let rls = Rls::start().await;
    let too_many = vec![ip("10.0.0.1"); DESCRIPTORS_MAX + 1];
    let deep = vec![ip("10.0.0.1"), descriptor(&[("k", "v"); ENTRIES_MAX + 1])];
    let empty = vec![ip("10.0.0.1"), descriptor(&[])];
    let mut lease_refund = descriptor(&[("job", "nightly")]);
    lease_refund.is_negative_hits = true;
    let cases = [
        (request("edge", vec![ip("10.0.0.1"), lease_refund]), "descriptors[1].is_negative_hits"),
        (request("edge", too_many), "descriptors"),
        (request("edge", deep), "descriptors[1].entries"),
        (request("edge", empty), "descriptors[1].entries"),
        (request("edge", Vec::new()), "descriptors"),
        (request("", vec![ip("10.0.0.1")]), "domain"),
    ];
    for (bad, field) in cases {
        let status = rls.call(bad).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().starts_with(field), "{}", status.message());
    }
    // Exactly the bounds are accepted; nothing above was counted.
    let response = rls.ok(request("edge", vec![descriptor(&[("k", "v")]); DESCRIPTORS_MAX])).await;
    assert_eq!(response.statuses.len(), DESCRIPTORS_MAX);
    let response = rls.ok(request("edge", vec![ip("10.0.0.1")])).await;
    assert_eq!(response.statuses[0].limit_remaining, 2);
    // A message above the size bound is refused as gRPC's own servers refuse one.
    let huge = descriptor(&[("remote_address", &"x".repeat(100 * 1024))]);
    let status = rls.call(request("edge", vec![huge])).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    // And the server keeps serving.
    let response = rls.ok(request("edge", vec![ip("10.0.0.1")])).await;
    assert_eq!(response.statuses[0].limit_remaining, 1);
    rls.stop().await;
}

/// A gRPC codec of raw bytes: what a client sends when its message is not a protobuf at all.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let len = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, len).to_vec()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_are_invalid_arguments() {
    let rls = Rls::start().await;
    let addr = rls.servers.grpc_addr().expect("gRPC");
    let channel =
        Channel::from_shared(format!("http://{addr}")).expect("uri").connect().await.expect("connects");
    let path =
        http::uri::PathAndQuery::from_static("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
    // A field of wire type 7 (none), a length beyond the message, a truncated varint.
    for garbage in [vec![0x0f], vec![0x0a, 0x7f, 0x01], vec![0x08, 0xff]] {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.expect("ready");
        let call = grpc.unary(tonic::Request::new(garbage.clone()), path.clone(), RawCodec);
        let status = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("answered")
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{garbage:?}: {status:?}");
    }
    // The server keeps serving, and counted nothing.
    let response = rls.ok(request("edge", vec![ip("10.0.0.9")])).await;
    assert_eq!(response.statuses[0].limit_remaining, 2);
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shut_down_node_makes_limited_descriptors_unavailable() {
    let rls = Rls::start().await;
    let response = rls.ok(request("edge", vec![ip("10.0.0.1")])).await;
    assert_eq!(overall(&response), Code::Ok);
    // The node stops; the gRPC server keeps running.
    rls.daemon().node().shutdown().await;
    let status = rls.call(request("edge", vec![ip("10.0.0.1")])).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    // Descriptors that need no decision are still answered.
    let response = rls.ok(request("edge", vec![descriptor(&[("path", "/healthz")])])).await;
    assert_eq!(overall(&response), Code::Ok);
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_shutdown_begins_checks_are_unavailable() {
    let config = Config::parse(POLICIES, "rls-test.toml").expect("valid");
    let daemon = Daemon::start(config).await.expect("starts");
    let service = RlsService::new(Arc::clone(&daemon));
    let call = |descriptors: Vec<RateLimitDescriptor>| {
        let service = service.clone();
        let request = request("edge", descriptors);
        async move { service.should_rate_limit_request(&request).await }
    };
    assert_eq!(overall(&call(vec![ip("10.0.0.1")]).await.expect("answers")), Code::Ok);
    daemon.begin_shutdown();
    let status = call(vec![ip("10.0.0.1")]).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");

    // A shadow-mode descriptor is never enforced: its failed check is answered OK (like a
    // descriptor without a limit) and counted, instead of failing the call.
    let tenant = || descriptor(&[("tenant", "acme")]);
    let response = call(vec![tenant(), descriptor(&[("path", "/healthz")])]).await.expect("answers");
    assert_eq!(overall(&response), Code::Ok);
    assert_eq!(response.statuses.len(), 2);
    assert_eq!((code(&response.statuses[0]), limit(&response.statuses[0])), (Code::Ok, None));
    assert!(response.response_headers_to_add.is_empty(), "no decision, no headers");
    // Next to an enforced descriptor that cannot be decided, the call still fails.
    let status = call(vec![tenant(), ip("10.0.0.1")]).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let metrics = daemon.metrics().encode().expect("metrics encode");
    assert!(metrics.contains(r#"ratemesh_shadow_check_errors_total{policy="tuning"} 2"#), "{metrics}");
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_in_flight_bound_are_shed_at_once() {
    let config = Config::parse(POLICIES, "rls-test.toml").expect("valid");
    let in_flight_max = config.limits.http_in_flight_max;
    let daemon = Daemon::start(config).await.expect("starts");
    let service = RlsService::new(Arc::clone(&daemon));
    let request = request("edge", vec![ip("10.0.0.1")]);
    let held = Arc::clone(service.permits())
        .try_acquire_many_owned(u32::try_from(in_flight_max).expect("fits"))
        .expect("every permit is free");
    let status = service.should_rate_limit_request(&request).await.expect_err("shed");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let metrics = daemon.metrics().encode().expect("metrics encode");
    let shed = r#"ratemesh_shed_requests_total{server="grpc",route="should_rate_limit"} 1"#;
    assert!(metrics.contains(shed), "{metrics}");
    drop(held);
    let response = service.should_rate_limit_request(&request).await.expect("answers");
    // The shed call counted nothing.
    assert_eq!(response.statuses[0].limit_remaining, 2);
    daemon.shutdown().await;
}

/// The connection bound of the gRPC listener: with `connections_max` connections open (idle,
/// well within the handshake timeout), one more is closed at once; once one went away, a new
/// client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_bound_are_closed_at_once() {
    let text = POLICIES.replace("[listen]", "[limits]\nconnections_max = 2\n\n[listen]");
    let config = Config::parse(&text, "rls-test.toml").expect("valid");
    let daemon = Daemon::start(config).await.expect("the daemon starts");
    // Connections without a preface are closed only after a minute: any close seen here is the
    // bound's.
    let long = Duration::from_secs(60);
    let mut options = Options::default();
    options.grpc.handshake = long;
    let servers = start_with(daemon, options).await.expect("the servers start");
    let addr = servers.grpc_addr().expect("gRPC");
    let first = TcpStream::connect(addr).await.expect("connects");
    let second = TcpStream::connect(addr).await.expect("connects");
    // Accepted in order: the third finds both permits taken and is closed with nothing sent, long
    // before a handshake deadline could have closed it.
    let mut third = TcpStream::connect(addr).await.expect("connects");
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), third.read_to_end(&mut received))
        .await
        .expect("closed within the bound");
    if let Err(error) = read {
        assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    }
    assert!(received.is_empty(), "{received:?}");

    // One goes away: its permit comes back (waited for, not polled), and a client is served.
    drop(first);
    let permits = Arc::clone(servers.grpc_connections());
    let freed = tokio::time::timeout(Duration::from_secs(20), permits.acquire()).await.expect("a permit");
    drop(freed.expect("the semaphore stays open"));
    let rls = Rls::connect(servers).await;
    let response = rls.ok(request("edge", vec![ip("10.0.0.1")])).await;
    assert_eq!(overall(&response), Code::Ok);
    let metrics = rls.daemon().metrics().encode().expect("metrics encode");
    assert!(metrics.contains(r#"ratemesh_connections_refused_total{server="grpc"} 1"#), "{metrics}");
    drop(second);
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_all_or_nothing_domain_gives_back_the_hits_of_a_refused_request() {
    let rls = Rls::start().await;
    let both = || vec![ip("10.0.0.9"), descriptor(&[("path", "/upload")])];
    let response = rls.ok(request("strict", both())).await;
    let left: Vec<_> = response.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!((overall(&response), left), (Code::Ok, vec![2, 0]));
    // The path is spent: the request is refused, and the address keeps its hits.
    for _ in 0..3 {
        let response = rls.ok(request("strict", both())).await;
        assert_eq!(overall(&response), Code::OverLimit);
        assert_eq!(code(&response.statuses[1]), Code::OverLimit);
    }
    let alone = rls.ok(request("strict", vec![ip("10.0.0.9")])).await;
    assert_eq!(
        alone.statuses[0].limit_remaining, 1,
        "2 left before, one taken now: none by the refused requests"
    );
    // Another domain counts every descriptor on its own, like Envoy's ratelimit service.
    let edge = || vec![ip("10.0.0.9"), descriptor(&[("remote_address", "10.0.0.9"), ("path", "/login")])];
    rls.ok(request("edge", edge())).await;
    rls.ok(request("edge", edge())).await;
    let refused = rls.ok(request("edge", edge())).await;
    assert_eq!(overall(&refused), Code::OverLimit);
    assert_eq!(refused.statuses[0].limit_remaining, 0, "edge: the address's hits were taken");
    rls.stop().await;
}

/// A client that lets the server send 16 bytes per stream before it reads them (every answer
/// is longer): the server's answers wait for the client's WINDOW_UPDATEs, on many streams at
/// once, and every call is answered whole and in its own stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_wait_for_a_small_client_window_and_all_arrive() {
    let rls = Rls::start().await;
    let addr = rls.servers.grpc_addr().expect("gRPC");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("a valid address")
        .initial_stream_window_size(Some(16))
        .connect()
        .await
        .expect("connects");
    let client = RateLimitServiceClient::new(channel);
    let calls = (0..200).map(|index| {
        let mut client = client.clone();
        async move {
            let address = format!("10.1.{}.{}", index / 100, index % 100);
            let call = client.should_rate_limit(request("edge", vec![ip(&address)]));
            let response =
                tokio::time::timeout(Duration::from_secs(20), call).await.expect("answered in time");
            (address, response.expect("succeeds").into_inner())
        }
    });
    for (address, response) in futures_join_all(calls).await {
        assert_eq!(overall(&response), Code::Ok, "{address}");
        assert_eq!(response.statuses[0].limit_remaining, 2, "{address}: its own bucket, one hit");
        assert_eq!(header(&response, "x-ratelimit-limit"), Some("3"), "{address}");
    }
    rls.stop().await;
}

/// 600 calls on one connection whose client keeps HTTP/2's default 64 KiB windows and reads every
/// answer as it comes (a raw h2 client): it waits for streams past the server's limit, and every
/// call is answered — none taken for a slow reader. (A client that wrote 600 calls in one write
/// before reading, which this one does not do, once got GOAWAY and no answer: one round's answers
/// outgrew its window past the 256 a connection could hold, under a limit of 1 024 streams. The
/// stream limit is now that bound, so no client within it can pass it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_calls_than_a_default_window_holds_are_all_answered() {
    use prost::Message as _;
    let rls = Rls::start().await;
    let socket = TcpStream::connect(rls.servers.grpc_addr().expect("gRPC")).await.expect("connects");
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(65_535)
        .initial_connection_window_size(65_535)
        .handshake::<_, bytes::Bytes>(socket)
        .await
        .expect("HTTP/2");
    let connection = tokio::spawn(connection);
    let mut answers = tokio::task::JoinSet::new();
    let mut client = client;
    for index in 0..600u32 {
        client = client.ready().await.expect("a stream");
        let head = http::Request::post("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("a request head");
        let message =
            request("edge", vec![ip(&format!("10.2.{}.{}", index / 100, index % 100))]).encode_to_vec();
        let mut body = vec![0];
        body.extend_from_slice(&(message.len() as u32).to_be_bytes());
        body.extend_from_slice(&message);
        let (response, mut send) = client.send_request(head, false).expect("sent");
        send.send_data(body.into(), true).expect("body sent");
        answers.spawn(async move {
            let mut body = response.await.expect("an answer").into_body();
            let mut read = 0;
            while let Some(chunk) = body.data().await {
                let chunk = chunk.expect("data");
                read += chunk.len();
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            let trailers = body.trailers().await.expect("trailers").expect("grpc-status");
            (read, trailers.get("grpc-status").cloned())
        });
    }
    let mut answered = 0;
    while let Some(answer) = answers.join_next().await {
        let (read, status) = answer.expect("the reader ran");
        assert!(read > 5 && status.as_ref().is_some_and(|s| s == "0"), "{read} bytes, {status:?}");
        answered += 1;
    }
    assert_eq!(answered, 600);
    drop(client);
    connection.abort();
    rls.stop().await;
}

/// Runs every future of `futures` on this task, concurrently; their outputs in order.
async fn futures_join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<_> = futures.map(Box::pin).enumerate().collect();
    let mut outputs: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    // Polled together by hand: no 'static bound, no extra dependency.
    std::future::poll_fn(|cx| {
        pending.retain_mut(|(index, future)| match future.as_mut().poll(cx) {
            std::task::Poll::Ready(output) => {
                outputs[*index] = Some(output);
                false
            }
            std::task::Poll::Pending => true,
        });
        if pending.is_empty() { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
    })
    .await;
    outputs.into_iter().map(|output| output.expect("every future finished")).collect()
}

/// A connection that breaks HTTP/2 gets a GOAWAY naming the error and is closed; the server
/// serves the next client as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_error_is_answered_with_goaway_and_the_server_goes_on() {
    use tokio::io::AsyncWriteExt as _;
    let rls = Rls::start().await;
    let addr = rls.servers.grpc_addr().expect("gRPC");
    let mut socket = TcpStream::connect(addr).await.expect("connects");
    let mut input = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    input.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // SETTINGS, empty
    input.extend_from_slice(&[0, 0, 1, 0, 0, 0, 0, 0, 0, b'x']); // DATA on stream 0
    socket.write_all(&input).await.expect("written");
    let mut received = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut received))
        .await
        .expect("closed in time")
        .expect("closed cleanly, not reset");
    // Frames: SETTINGS, WINDOW_UPDATE, SETTINGS ack, GOAWAY (type 7) with PROTOCOL_ERROR (1).
    let mut frames = Vec::new();
    let mut rest = &received[..];
    while rest.len() >= 9 {
        let length = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        frames.push((rest[3], rest[9..9 + length].to_vec()));
        rest = &rest[9 + length..];
    }
    let goaway = frames.iter().find(|(kind, _)| *kind == 7).expect("a GOAWAY");
    assert_eq!(
        goaway.1[4..8],
        1u32.to_be_bytes(),
        "PROTOCOL_ERROR: {:?}",
        String::from_utf8_lossy(&goaway.1[8..])
    );
    let response = rls.ok(request("edge", vec![ip("10.0.0.77")])).await;
    assert_eq!(overall(&response), Code::Ok);
    rls.stop().await;
}

/// A message whose length prefix says 4 GiB is refused `RESOURCE_EXHAUSTED` as soon as the prefix
/// is read (as gRPC's own servers answer a message above their receive limit), without waiting
/// for the bytes it announces; the server goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_prefix_above_the_limit_is_resource_exhausted_at_once() {
    let rls = Rls::start().await;
    let addr = rls.servers.grpc_addr().expect("gRPC");
    let socket = TcpStream::connect(addr).await.expect("connects");
    let (client, driver) = h2::client::handshake(socket).await.expect("HTTP/2");
    tokio::spawn(driver);
    let mut head = http::Request::new(());
    *head.method_mut() = http::Method::POST;
    *head.uri_mut() = format!("http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        .parse()
        .expect("uri");
    head.headers_mut().insert("content-type", http::HeaderValue::from_static("application/grpc"));
    let mut client = client.ready().await.expect("ready");
    let (answer, mut send) = client.send_request(head, false).expect("sent");
    // The prefix and a few bytes of the 4 GiB it announces; the stream stays open.
    let prefix = bytes::Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff, 0x0a, 0x04]);
    send.send_data(prefix, false).expect("sent");
    let answer =
        tokio::time::timeout(Duration::from_secs(10), answer).await.expect("answered").expect("a head");
    let status = answer.headers().get("grpc-status").map(|value| value.to_str().expect("text").to_owned());
    assert_eq!(status.as_deref(), Some("8"), "RESOURCE_EXHAUSTED in a trailers-only answer: {answer:?}");
    let response = rls.ok(request("edge", vec![ip("10.0.0.78")])).await;
    assert_eq!(overall(&response), Code::Ok);
    rls.stop().await;
}
