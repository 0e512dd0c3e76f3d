//! The xDS client of `ratemeshd envoy-ratelimit` with `CONFIG_TYPE=GRPC_XDS_SOTW`: rate limit
//! configurations (`ratelimit.config.ratelimit.v3.RateLimitConfig`) streamed by a management
//! server, as envoyproxy/ratelimit receives them from Envoy Gateway.
//!
//! # The protocol, as envoyproxy/ratelimit speaks it
//!
//! One state-of-the-world stream of the aggregated discovery service
//! (`envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources`) for the
//! one type [`RATE_LIMIT_CONFIG_TYPE_URL`]. The first request names the node
//! (`CONFIG_GRPC_XDS_NODE_ID`, metadata from `CONFIG_GRPC_XDS_NODE_METADATA`); every response
//! holds the whole configuration (every `RateLimitConfig`), which is handed to the caller as
//! envoyproxy/ratelimit's YAML documents (one per resource, named by the resource). The caller
//! loads them as it loads files: when it takes them, the response is acknowledged (its version
//! and nonce); when it refuses them (a resource that does not decode, a configuration the loader
//! refuses), the response is refused (NACK: the last accepted version, the nonce and the error),
//! and the configuration in force stays.
//!
//! # Failures
//!
//! A server that cannot be reached, a stream that fails or ends, or a message above
//! `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES` (4 MiB by default, gRPC's) ends the stream: the client
//! reconnects after a backoff (`XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`, doubling up to
//! `XDS_CLIENT_BACKOFF_MAX_INTERVAL`, ±`XDS_CLIENT_BACKOFF_RANDOM_FACTOR` of jitter), back to
//! the initial interval once a stream delivered a configuration. The configuration in force is
//! kept meanwhile: a management server that goes away does not remove the limits.

use std::collections::BTreeMap;
use std::hash::{BuildHasher as _, RandomState};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::{Any, Struct, Value, value::Kind};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy,
};
use prost::Message as _;
use serde_json::{Map, Value as Json, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tracing::{info, warn};

/// The type of the resources asked for.
pub const RATE_LIMIT_CONFIG_TYPE_URL: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The largest message taken from the server by default (gRPC's default receive limit).
pub const MESSAGE_BYTES_MAX_DEFAULT: usize = 4 * 1024 * 1024;

/// Descriptors nested deeper than this in a resource refuse it (the YAML loader bounds depth too;
/// this keeps the conversion itself bounded).
const DESCRIPTOR_DEPTH_MAX: usize = 64;

/// Why the xDS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    /// A variable holds a value that cannot be used.
    #[error("{name}: {reason}")]
    Setting {
        /// The environment variable.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A TLS file could not be read.
    #[error("{name}: cannot read {path}: {source}")]
    File {
        /// The environment variable that names the file.
        name: &'static str,
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// How to reach the management server and what to tell it, from envoyproxy/ratelimit's
/// environment variables (the same names and defaults).
#[derive(Clone, Debug)]
pub struct XdsSettings {
    /// `CONFIG_GRPC_XDS_SERVER_URL`: `host:port` (default `localhost:18000`).
    pub server_url: String,
    /// `CONFIG_GRPC_XDS_NODE_ID` (default `default`).
    pub node_id: String,
    /// `CONFIG_GRPC_XDS_NODE_METADATA`: `key=value` pairs separated by commas.
    pub node_metadata: BTreeMap<String, String>,
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`: `name:value` pairs separated by commas, sent
    /// with the stream.
    pub headers: Vec<(String, String)>,
    /// TLS to the server, when `CONFIG_GRPC_XDS_SERVER_USE_TLS` is true.
    pub tls: Option<ClientTlsConfig>,
    /// `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL` (default 10 s).
    pub backoff_initial: Duration,
    /// `XDS_CLIENT_BACKOFF_MAX_INTERVAL` (default 60 s).
    pub backoff_max: Duration,
    /// `XDS_CLIENT_BACKOFF_RANDOM_FACTOR` (default 0.5): each delay is scaled by a random factor
    /// within 1 ± this.
    pub backoff_random_factor: f64,
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES` (default [`MESSAGE_BYTES_MAX_DEFAULT`]).
    pub message_bytes_max: usize,
}

impl XdsSettings {
    /// The settings from `var` (the process environment, or a test's), with envoyproxy/ratelimit's
    /// defaults; TLS files are read here, so that a missing one is an error at start.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<XdsSettings, XdsError> {
        let text = |name: &'static str, default: &str| var(name).unwrap_or_else(|| default.to_owned());
        let tls = match parse_bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", var("CONFIG_GRPC_XDS_SERVER_USE_TLS"))? {
            true => Some(tls_config(&var)?),
            false => None,
        };
        let backoff_initial = parse_duration(
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            var("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"),
            Duration::from_secs(10),
        )?;
        let backoff_max = parse_duration(
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            var("XDS_CLIENT_BACKOFF_MAX_INTERVAL"),
            Duration::from_secs(60),
        )?;
        let backoff_random_factor = match var("XDS_CLIENT_BACKOFF_RANDOM_FACTOR") {
            None => 0.5,
            Some(value) => value.trim().parse::<f64>().ok().filter(|f| (0.0..=1.0).contains(f)).ok_or(
                XdsError::Setting {
                    name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
                    reason: format!("{value:?} is not a number from 0 to 1"),
                },
            )?,
        };
        let message_bytes_max = match var("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES").filter(|v| !v.trim().is_empty())
        {
            None => MESSAGE_BYTES_MAX_DEFAULT,
            Some(value) => {
                value.trim().parse::<usize>().ok().filter(|&n| n > 0).ok_or(XdsError::Setting {
                    name: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
                    reason: format!("{value:?} is not a positive number of bytes"),
                })?
            }
        };
        Ok(XdsSettings {
            server_url: text("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
            node_id: text("CONFIG_GRPC_XDS_NODE_ID", "default"),
            node_metadata: pairs(&text("CONFIG_GRPC_XDS_NODE_METADATA", ""), '=').into_iter().collect(),
            headers: pairs(&text("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ""), ':'),
            tls,
            backoff_initial,
            backoff_max: backoff_max.max(backoff_initial),
            backoff_random_factor,
            message_bytes_max,
        })
    }

    /// The endpoint to dial: `CONFIG_GRPC_XDS_SERVER_URL` with its scheme (`https` with TLS).
    fn endpoint(&self) -> Result<Endpoint, String> {
        let url = match self.server_url.contains("://") {
            true => self.server_url.clone(),
            false if self.tls.is_some() => format!("https://{}", self.server_url),
            false => format!("http://{}", self.server_url),
        };
        let endpoint = Endpoint::from_shared(url.clone()).map_err(|error| format!("{url:?}: {error}"))?;
        let endpoint = endpoint.connect_timeout(Duration::from_secs(10)).tcp_nodelay(true);
        match &self.tls {
            Some(tls) => endpoint.tls_config(tls.clone()).map_err(|error| format!("TLS: {error}")),
            None => Ok(endpoint),
        }
    }

    /// The node this client announces.
    fn node(&self) -> Node {
        let fields = self
            .node_metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value { kind: Some(Kind::StringValue(v.clone())) }))
            .collect();
        Node { id: self.node_id.clone(), metadata: Some(Struct { fields }), ..Node::default() }
    }

    /// The delay before reconnect attempt `failures` (≥ 1), jittered.
    fn backoff(&self, failures: u32) -> Duration {
        let base = ratemesh::Backoff { initial: self.backoff_initial, max: self.backoff_max }.delay(failures);
        // A uniform draw in [0, 1) from the process's random hasher keys: no RNG crate for this.
        let draw = (RandomState::new().hash_one(failures) >> 11) as f64 / (1u64 << 53) as f64;
        base.mul_f64(1.0 - self.backoff_random_factor + 2.0 * self.backoff_random_factor * draw)
    }
}

/// `name:value` (or `name=value`) pairs separated by commas; entries without the separator are
/// ignored, as envoyproxy/ratelimit does.
fn pairs(text: &str, separator: char) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|entry| entry.split_once(separator))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

fn parse_bool(name: &'static str, value: Option<String>) -> Result<bool, XdsError> {
    match value.as_deref().map(str::trim) {
        None | Some("") => Ok(false),
        Some(v) if ["true", "1", "t", "TRUE", "True", "T"].contains(&v) => Ok(true),
        Some(v) if ["false", "0", "f", "FALSE", "False", "F"].contains(&v) => Ok(false),
        Some(v) => Err(XdsError::Setting { name, reason: format!("{v:?} is not a boolean") }),
    }
}

/// A Go duration as envoyproxy/ratelimit's settings take it (`10s`, `500ms`, `1m`), or plain
/// seconds.
fn parse_duration(
    name: &'static str,
    value: Option<String>,
    default: Duration,
) -> Result<Duration, XdsError> {
    let Some(value) = value.filter(|v| !v.trim().is_empty()) else { return Ok(default) };
    let v = value.trim();
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" => 60.0,
        "h" => 3600.0,
        _ => f64::NAN,
    };
    number
        .parse::<f64>()
        .ok()
        .map(|n| n * scale)
        .filter(|secs| secs.is_finite() && *secs >= 0.0 && *secs <= 86_400.0)
        .map(Duration::from_secs_f64)
        .ok_or(XdsError::Setting {
            name,
            reason: format!("{value:?} is not a duration such as 10s or 500ms"),
        })
}

/// TLS to the management server from envoyproxy/ratelimit's variables: the server's CA
/// (`CONFIG_GRPC_XDS_SERVER_TLS_CACERT`), this client's certificate and key
/// (`CONFIG_GRPC_XDS_CLIENT_TLS_CERT`, `_KEY`; mutual TLS as Envoy Gateway sets it up), and
/// the name to verify (`CONFIG_GRPC_XDS_SERVER_TLS_SAN`, else the URL's host).
fn tls_config(var: &impl Fn(&str) -> Option<String>) -> Result<ClientTlsConfig, XdsError> {
    let read = |name: &'static str| -> Result<Option<Vec<u8>>, XdsError> {
        match var(name).filter(|p| !p.is_empty()) {
            None => Ok(None),
            Some(path) => {
                std::fs::read(&path).map(Some).map_err(|source| XdsError::File { name, path, source })
            }
        }
    };
    let mut tls = ClientTlsConfig::new();
    if let Some(ca) = read("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")? {
        tls = tls.ca_certificate(Certificate::from_pem(ca));
    }
    match (read("CONFIG_GRPC_XDS_CLIENT_TLS_CERT")?, read("CONFIG_GRPC_XDS_CLIENT_TLS_KEY")?) {
        (Some(cert), Some(key)) => tls = tls.identity(Identity::from_pem(cert, key)),
        (None, None) => {}
        _ => {
            return Err(XdsError::Setting {
                name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                reason: "the client certificate and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together".into(),
            });
        }
    }
    if let Some(san) = var("CONFIG_GRPC_XDS_SERVER_TLS_SAN").filter(|s| !s.is_empty()) {
        tls = tls.domain_name(san);
    }
    Ok(tls)
}

/// One resource of a response, as envoyproxy/ratelimit's loader takes it: its name and its
/// configuration as a YAML document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigDocument {
    /// The resource's name (`RateLimitConfig.name`).
    pub name: String,
    /// The configuration in envoyproxy/ratelimit's YAML format (written as JSON, which YAML
    /// parsers read).
    pub yaml: String,
}

/// The documents of a response's resources, in their order; an error names the first resource
/// that is not a `RateLimitConfig` or does not decode.
pub fn documents(resources: &[Any]) -> Result<Vec<ConfigDocument>, String> {
    resources
        .iter()
        .enumerate()
        .map(|(index, any)| {
            if any.type_url != RATE_LIMIT_CONFIG_TYPE_URL {
                return Err(format!(
                    "resources[{index}]: type {:?}, not {RATE_LIMIT_CONFIG_TYPE_URL}",
                    any.type_url
                ));
            }
            let config = RateLimitConfig::decode(any.value.as_slice())
                .map_err(|error| format!("resources[{index}]: not a RateLimitConfig: {error}"))?;
            let root =
                json!({ "domain": config.domain, "descriptors": descriptors(&config.descriptors, 1)? });
            Ok(ConfigDocument { name: config.name, yaml: root.to_string() })
        })
        .collect()
}

/// `descriptors` as envoyproxy/ratelimit's YAML (`ConfigXdsProtoToYaml`: the same fields; a
/// policy's unit by its enum name).
fn descriptors(list: &[RateLimitDescriptor], depth: usize) -> Result<Json, String> {
    if depth > DESCRIPTOR_DEPTH_MAX && !list.is_empty() {
        return Err(format!("descriptors nested more than {DESCRIPTOR_DEPTH_MAX} deep"));
    }
    let mut out = Vec::with_capacity(list.len());
    for d in list {
        let mut entry = Map::new();
        entry.insert("key".into(), d.key.clone().into());
        if !d.value.is_empty() {
            entry.insert("value".into(), d.value.clone().into());
        }
        if let Some(policy) = &d.rate_limit {
            entry.insert("rate_limit".into(), rate_limit(policy)?);
        }
        if !d.descriptors.is_empty() {
            entry.insert("descriptors".into(), descriptors(&d.descriptors, depth + 1)?);
        }
        if d.shadow_mode {
            entry.insert("shadow_mode".into(), true.into());
        }
        if d.detailed_metric {
            entry.insert("detailed_metric".into(), true.into());
        }
        out.push(Json::Object(entry));
    }
    Ok(Json::Array(out))
}

fn rate_limit(policy: &RateLimitPolicy) -> Result<Json, String> {
    let unit = RateLimitUnit::try_from(policy.unit)
        .map_err(|_| format!("rate_limit.unit: {} is not a RateLimitUnit", policy.unit))?;
    let mut out = Map::new();
    out.insert("unit".into(), unit.as_str_name().into());
    out.insert("requests_per_unit".into(), policy.requests_per_unit.into());
    if policy.unlimited {
        out.insert("unlimited".into(), true.into());
    }
    if !policy.name.is_empty() {
        out.insert("name".into(), policy.name.clone().into());
    }
    if !policy.replaces.is_empty() {
        let replaces: Vec<Json> = policy.replaces.iter().map(|r| json!({ "name": r.name })).collect();
        out.insert("replaces".into(), replaces.into());
    }
    Ok(Json::Object(out))
}

/// How one stream ended.
enum StreamEnd {
    /// It ended after delivering at least one configuration (the backoff starts over).
    AfterConfig(String),
    /// It ended before (or could not be opened).
    BeforeConfig(String),
}

/// Runs the client until `shutdown` completes: `apply` is called with every configuration the
/// server sends (all its resources at once) and returns whether it was taken (`Err`: why not,
/// sent back as a NACK).
pub async fn run<F>(settings: XdsSettings, mut apply: F, shutdown: impl Future<Output = ()>)
where
    F: FnMut(Vec<ConfigDocument>) -> Result<(), String> + Send,
{
    let mut shutdown = std::pin::pin!(shutdown);
    let mut failures = 0u32;
    // The version last taken, across streams: a new stream reports it, as xDS clients do.
    let mut accepted = String::new();
    loop {
        info!(server = %settings.server_url, node = %settings.node_id, "xDS: connecting for rate limit configurations");
        let end = tokio::select! {
            end = stream_once(&settings, &mut apply, &mut accepted) => end,
            () = &mut shutdown => return,
        };
        let why = match end {
            StreamEnd::AfterConfig(why) => {
                failures = 1;
                why
            }
            StreamEnd::BeforeConfig(why) => {
                failures = failures.saturating_add(1);
                why
            }
        };
        let delay = settings.backoff(failures);
        warn!(error = %why, ?delay, "xDS: the stream ended; the configuration in force is kept, reconnecting");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = &mut shutdown => return,
        }
    }
}

/// One stream: opened, every response applied and answered, until it fails or ends.
async fn stream_once<F>(settings: &XdsSettings, apply: &mut F, accepted: &mut String) -> StreamEnd
where
    F: FnMut(Vec<ConfigDocument>) -> Result<(), String>,
{
    let channel = match settings.endpoint() {
        Ok(endpoint) => match endpoint.connect().await {
            Ok(channel) => channel,
            Err(error) => return StreamEnd::BeforeConfig(format!("cannot connect: {error}")),
        },
        Err(error) => return StreamEnd::BeforeConfig(format!("CONFIG_GRPC_XDS_SERVER_URL {error}")),
    };
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(settings.message_bytes_max);
    // Requests are few (one per response): a small queue.
    let (requests, outgoing) = mpsc::channel(4);
    let first = request(settings, accepted, "", None);
    if requests.send(first).await.is_err() {
        return StreamEnd::BeforeConfig("the request queue closed".into());
    }
    let mut call = tonic::Request::new(ReceiverStream::new(outgoing));
    for (name, value) in &settings.headers {
        match (name.parse::<tonic::metadata::MetadataKey<_>>(), value.parse()) {
            (Ok(name), Ok(value)) => drop(call.metadata_mut().insert(name, value)),
            _ => {
                warn!(header = %name, "xDS: CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: not a valid header, not sent")
            }
        }
    }
    let mut responses = match client.stream_aggregated_resources(call).await {
        Ok(response) => response.into_inner(),
        Err(status) => return StreamEnd::BeforeConfig(format!("the stream was refused: {status}")),
    };
    let mut delivered = false;
    loop {
        let response = match responses.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return end(delivered, "the server ended the stream".into()),
            Err(status) => return end(delivered, format!("the stream failed: {status}")),
        };
        let next = answer(settings, apply, accepted, &response);
        delivered |= next.error_detail.is_none();
        if requests.send(next).await.is_err() {
            return end(delivered, "the stream closed".into());
        }
    }
}

fn end(delivered: bool, why: String) -> StreamEnd {
    match delivered {
        true => StreamEnd::AfterConfig(why),
        false => StreamEnd::BeforeConfig(why),
    }
}

/// Applies a response and returns its ACK (or NACK).
fn answer<F>(
    settings: &XdsSettings,
    apply: &mut F,
    accepted: &mut String,
    response: &DiscoveryResponse,
) -> DiscoveryRequest
where
    F: FnMut(Vec<ConfigDocument>) -> Result<(), String>,
{
    let outcome = match response.type_url.as_str() {
        RATE_LIMIT_CONFIG_TYPE_URL => documents(&response.resources).and_then(&mut *apply),
        other => Err(format!("a response of type {other:?}, not {RATE_LIMIT_CONFIG_TYPE_URL}")),
    };
    match outcome {
        Ok(()) => {
            info!(version = %response.version_info, resources = response.resources.len(), "xDS: configuration applied");
            accepted.clone_from(&response.version_info);
            request(settings, accepted, &response.nonce, None)
        }
        Err(error) => {
            warn!(version = %response.version_info, %error, "xDS: configuration refused (NACK); the one in force is kept");
            request(settings, accepted, &response.nonce, Some(error))
        }
    }
}

/// A request of the stream: the node, the version taken last, the nonce answered and, for a
/// NACK, the error (gRPC's `INVALID_ARGUMENT`, as Envoy sends it).
fn request(settings: &XdsSettings, accepted: &str, nonce: &str, error: Option<String>) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: accepted.to_owned(),
        node: Some(settings.node()),
        type_url: RATE_LIMIT_CONFIG_TYPE_URL.to_owned(),
        response_nonce: nonce.to_owned(),
        error_detail: error.map(|message| RpcStatus {
            code: tonic::Code::InvalidArgument as i32,
            message,
            details: vec![],
        }),
        ..DiscoveryRequest::default()
    }
}

#[cfg(test)]
mod tests;
