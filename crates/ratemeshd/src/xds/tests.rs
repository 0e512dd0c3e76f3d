//! The xDS client against a stand-in management server (tonic, in this process): configurations
//! applied and acknowledged, refused ones NACKed with the last good version, reconnection.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitReplace;
use futures_util::Stream;
use tokio::net::TcpListener;
use tonic::codegen::tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, Streaming};

use super::*;

fn settings(var: &[(&str, &str)]) -> Result<XdsSettings, XdsError> {
    let vars: BTreeMap<String, String> =
        var.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    XdsSettings::from_env(|name| vars.get(name).cloned())
}

fn config(name: &str, domain: &str, per_unit: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: name.into(),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: "remote_address".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Second as i32,
                requests_per_unit: per_unit,
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
    }
}

fn any(config: &RateLimitConfig) -> Any {
    Any { type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(), value: config.encode_to_vec() }
}

#[test]
fn a_resource_becomes_envoyproxy_ratelimits_yaml_with_every_field() {
    let mut resource = config("eg", "eg-domain", 10);
    resource.descriptors[0].value = "10.0.0.1".into();
    resource.descriptors[0].shadow_mode = true;
    resource.descriptors[0].descriptors = vec![RateLimitDescriptor {
        key: "path".into(),
        rate_limit: Some(RateLimitPolicy {
            unit: RateLimitUnit::Hour as i32,
            requests_per_unit: 5,
            name: "per-path".into(),
            replaces: vec![RateLimitReplace { name: "global".into() }],
            ..RateLimitPolicy::default()
        }),
        detailed_metric: true,
        ..RateLimitDescriptor::default()
    }];
    let documents = documents(&[any(&resource)]).expect("converted");
    assert_eq!(documents.len(), 1);
    assert_eq!(documents[0].name, "eg");
    let yaml: Json = serde_json::from_str(&documents[0].yaml).expect("JSON, which is YAML");
    assert_eq!(
        yaml,
        json!({
            "domain": "eg-domain",
            "descriptors": [{
                "key": "remote_address",
                "value": "10.0.0.1",
                "shadow_mode": true,
                "rate_limit": { "unit": "SECOND", "requests_per_unit": 10 },
                "descriptors": [{
                    "key": "path",
                    "detailed_metric": true,
                    "rate_limit": {
                        "unit": "HOUR", "requests_per_unit": 5, "name": "per-path",
                        "replaces": [{ "name": "global" }]
                    }
                }]
            }]
        })
    );
}

#[test]
fn resources_of_another_type_garbage_bad_units_and_deep_nesting_are_refused_by_index() {
    let good = any(&config("a", "d", 1));
    let other_type =
        Any { type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(), value: vec![] };
    let error = documents(&[good.clone(), other_type]).expect_err("another type");
    assert!(error.starts_with("resources[1]: type"), "{error}");
    let garbage = Any { type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(), value: vec![0xff, 0xff, 0xff] };
    let error = documents(&[garbage]).expect_err("garbage");
    assert!(error.starts_with("resources[0]: not a RateLimitConfig"), "{error}");
    let mut bad_unit = config("a", "d", 1);
    bad_unit.descriptors[0].rate_limit.as_mut().expect("a policy").unit = 99;
    let error = documents(&[any(&bad_unit)]).expect_err("unit 99");
    assert!(error.contains("99 is not a RateLimitUnit"), "{error}");
    let mut deep = RateLimitDescriptor { key: "k".into(), ..RateLimitDescriptor::default() };
    for _ in 0..1_000 {
        deep = RateLimitDescriptor {
            key: "k".into(),
            descriptors: vec![deep],
            ..RateLimitDescriptor::default()
        };
    }
    let deep = RateLimitConfig { name: "deep".into(), domain: "d".into(), descriptors: vec![deep] };
    // prost bounds decoding recursion (100 levels): refused either by the decoder or here.
    let error = documents(&[any(&deep)]).expect_err("1 000 deep");
    assert!(error.starts_with("resources[0]"), "{error}");
}

#[test]
fn settings_take_envoyproxy_ratelimits_names_and_defaults_and_refuse_bad_values() {
    let defaults = settings(&[]).expect("defaults");
    assert_eq!(defaults.server_url, "localhost:18000");
    assert_eq!(defaults.node_id, "default");
    assert_eq!(defaults.backoff_initial, Duration::from_secs(10));
    assert_eq!(defaults.backoff_max, Duration::from_secs(60));
    assert_eq!(defaults.message_bytes_max, MESSAGE_BYTES_MAX_DEFAULT);
    assert!(defaults.tls.is_none());
    let set = settings(&[
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,broken,cluster=eg"),
        ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-token:abc"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "500ms"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "2s"),
    ])
    .expect("valid");
    assert_eq!(set.node().id, "envoy-ratelimit");
    assert_eq!(set.node_metadata.len(), 2, "{:?}", set.node_metadata);
    assert_eq!(set.headers, vec![("x-token".to_owned(), "abc".to_owned())]);
    assert_eq!(set.backoff_initial, Duration::from_millis(500));
    for failures in 1..10 {
        let delay = set.backoff(failures);
        assert!(delay >= Duration::from_millis(250) && delay <= Duration::from_secs(3), "{delay:?}");
    }
    for (name, value) in [
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "soon"),
        ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
        ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "-1"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "yes please"),
    ] {
        let error = settings(&[(name, value)]).expect_err(name).to_string();
        assert!(error.starts_with(name), "{error}");
    }
    let error = settings(&[
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent/ca.crt"),
    ])
    .expect_err("a missing CA file");
    assert!(error.to_string().contains("/nonexistent/ca.crt"), "{error}");
}

/// The stand-in management server: every stream's requests are recorded; the test sends
/// responses to the stream open at the time (a new stream replaces the previous one's sender).
#[derive(Clone, Default)]
struct StandIn {
    requests: Arc<Mutex<Vec<DiscoveryRequest>>>,
    stream: Arc<Mutex<Option<ResponseSender>>>,
    streams_opened: Arc<Mutex<u32>>,
    changed: Arc<tokio::sync::Notify>,
}

type ResponseSender = mpsc::Sender<Result<DiscoveryResponse, Status>>;
type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

impl AggregatedDiscoveryService for StandIn {
    type StreamAggregatedResourcesStream = ResponseStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    fn stream_aggregated_resources<'a, 'b>(
        &'a self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<ResponseStream>, Status>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(async move {
            let (responses, queue) = mpsc::channel(8);
            *self.stream.lock().expect("lock") = Some(responses);
            *self.streams_opened.lock().expect("lock") += 1;
            let mut incoming = request.into_inner();
            let recorded = self.clone();
            tokio::spawn(async move {
                while let Ok(Some(request)) = incoming.message().await {
                    recorded.requests.lock().expect("lock").push(request);
                    recorded.changed.notify_waiters();
                }
            });
            self.changed.notify_waiters();
            Ok(Response::new(Box::pin(ReceiverStream::new(queue)) as ResponseStream))
        })
    }

    fn delta_aggregated_resources<'a, 'b>(
        &'a self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<DeltaStream>, Status>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(async { Err(Status::unimplemented("delta xDS is not used")) })
    }
}

impl StandIn {
    /// Waits until `done` holds of the recorded requests (bounded: 10 s).
    async fn until(
        &self,
        what: &str,
        done: impl Fn(&[DiscoveryRequest], u32) -> bool,
    ) -> Vec<DiscoveryRequest> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let notified = self.changed.notified();
            {
                let requests = self.requests.lock().expect("lock");
                if done(&requests, *self.streams_opened.lock().expect("lock")) {
                    return requests.clone();
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("timed out waiting for {what}: {:?}", self.requests.lock().expect("lock"));
            }
        }
    }

    async fn respond(&self, version: &str, nonce: &str, resources: Vec<Any>) {
        let sender = self.stream.lock().expect("lock").clone().expect("a stream is open");
        let response = DiscoveryResponse {
            version_info: version.into(),
            resources,
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
            nonce: nonce.into(),
            ..DiscoveryResponse::default()
        };
        sender.send(Ok(response)).await.expect("the stream is open");
    }

    /// Ends the open stream with an error status.
    async fn fail_stream(&self) {
        let sender = self.stream.lock().expect("lock").take().expect("a stream is open");
        sender.send(Err(Status::unavailable("management server restarting"))).await.expect("open");
    }
}

#[tokio::test]
async fn configurations_are_applied_and_acked_refused_ones_nacked_and_the_stream_comes_back() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stand_in = StandIn::default();
    let server = tonic::transport::Server::builder()
        .add_service(AggregatedDiscoveryServiceServer::new(stand_in.clone()))
        .serve_with_incoming(TcpListenerStream::new(listener));
    let server = tokio::spawn(server);
    let settings = settings(&[
        ("CONFIG_GRPC_XDS_SERVER_URL", &addr.to_string()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "50ms"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "100ms"),
    ])
    .expect("valid");
    let applied: Arc<Mutex<Vec<Vec<ConfigDocument>>>> = Arc::default();
    let recorded = applied.clone();
    let apply = move |documents: Vec<ConfigDocument>| {
        // The loader's refusal, as a duplicate domain would be.
        if documents.iter().any(|d| d.name == "refused") {
            return Err("domain d: duplicate domain".to_owned());
        }
        recorded.lock().expect("lock").push(documents);
        Ok(())
    };
    let (close, closing) = tokio::sync::oneshot::channel::<()>();
    let client = tokio::spawn(run(settings, apply, async move { drop(closing.await) }));

    let first = stand_in.until("the first request", |r, _| !r.is_empty()).await;
    assert_eq!(first[0].type_url, RATE_LIMIT_CONFIG_TYPE_URL);
    assert_eq!(first[0].node.as_ref().map(|n| n.id.as_str()), Some("envoy-ratelimit"));
    assert_eq!((first[0].version_info.as_str(), first[0].response_nonce.as_str()), ("", ""));

    stand_in.respond("1", "n1", vec![any(&config("a", "d", 10)), any(&config("b", "e", 5))]).await;
    let requests = stand_in.until("the ACK of 1", |r, _| r.len() >= 2).await;
    let ack = &requests[1];
    assert_eq!((ack.version_info.as_str(), ack.response_nonce.as_str()), ("1", "n1"));
    assert!(ack.error_detail.is_none(), "{ack:?}");
    assert_eq!(applied.lock().expect("lock").last().map(Vec::len), Some(2));

    stand_in.respond("2", "n2", vec![any(&config("refused", "d", 1))]).await;
    let requests = stand_in.until("the NACK of 2", |r, _| r.len() >= 3).await;
    let nack = &requests[2];
    assert_eq!((nack.version_info.as_str(), nack.response_nonce.as_str()), ("1", "n2"));
    let detail = nack.error_detail.as_ref().expect("a NACK carries the error");
    assert!(detail.message.contains("duplicate domain"), "{detail:?}");
    assert_eq!(applied.lock().expect("lock").len(), 1, "the refused configuration was not applied");

    stand_in
        .respond("3", "n3", vec![Any { type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(), value: vec![0xff; 7] }])
        .await;
    let requests = stand_in.until("the NACK of garbage", |r, _| r.len() >= 4).await;
    assert_eq!(requests[3].version_info, "1");
    assert!(requests[3].error_detail.is_some());

    // The server's stream fails: the client comes back on a new stream, reporting version 1.
    stand_in.fail_stream().await;
    let requests = stand_in.until("a new stream", |r, opened| opened >= 2 && r.len() >= 5).await;
    assert_eq!(requests[4].version_info, "1");
    assert_eq!(requests[4].response_nonce, "");
    stand_in.respond("4", "n4", vec![any(&config("c", "f", 7))]).await;
    stand_in.until("the ACK of 4", |r, _| r.len() >= 6).await;
    assert_eq!(applied.lock().expect("lock").len(), 2);
    assert_eq!(applied.lock().expect("lock")[1][0].name, "c");

    close.send(()).expect("the client listens");
    client.await.expect("the client stops when asked");
    server.abort();
}
