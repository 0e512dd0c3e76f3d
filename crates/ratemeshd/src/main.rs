//! The `ratemeshd` command line.
//!
//! ```text
//! ratemeshd [serve] [--config FILE]      run a node (the default command)
//! ratemeshd check --policy NAME --key K  ask a running node from the shell (exit 0 allowed, 1 refused, 2 error)
//! ratemeshd cluster                      print members, owners, ring balance
//! ratemeshd top --policy NAME            a policy's heaviest keys, cluster-wide
//! ratemeshd audit [--policy NAME] [-n N] what the cluster admitted against one ideal limiter, per
//!                                        policy, and the keys admitted most above it
//! ratemeshd certs --out DIR --nodes 1,2,3
//! ratemeshd validate --config FILE
//! ratemeshd envoy-ratelimit [--config FILE]   a drop-in for envoyproxy/ratelimit (its env variables;
//!                                             also what `ratemeshd` runs when started as `ratelimit`)
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use ratemesh::NodeId;
use ratemesh::security::{CERT_FILES_NODES_MAX, ClusterCa, write_cert_files};
use ratemeshd::Config;
use ratemeshd::client;
use ratemeshd::config::{EMBEDDED_CONFIG, EMBEDDED_CONFIG_ORIGIN, HTTP_LISTEN_DEFAULT};
use ratemeshd::daemon::ConfigSource;
use ratemeshd::http::body::{CheckBody, CostJson, LimitBody};
use ratemeshd::http::{AUDIT_N_DEFAULT, TOP_BY_DEFAULT, TOP_N_DEFAULT};

/// How long `cluster`, `top` and `audit` wait for the node's answer by default, in milliseconds.
const ANSWER_TIMEOUT_MS_DEFAULT: u64 = 5000;
/// Exit status of `check` when the request is allowed.
const EXIT_ALLOWED: u8 = 0;
/// Exit status of `check` when the request is refused.
const EXIT_REFUSED: u8 = 1;
/// Exit status of `check` and `cluster` when the node could not answer.
const EXIT_ERROR: u8 = 2;

/// The ratemesh daemon: one global rate limit per key across a cluster, over HTTP and the Envoy
/// Rate Limit Service.
#[derive(Debug, Parser)]
#[command(name = "ratemeshd", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Options of `serve`, the command run when none is given.
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a node (the default).
    Serve(ServeArgs),
    /// Ask a running node for a decision; prints the JSON answer. Exit 0 allowed, 1 refused,
    /// 2 error.
    Check(CheckArgs),
    /// Print the cluster's members, their ring shares and the ring balance, as a running node
    /// sees them.
    Cluster(ClusterArgs),
    /// Print a policy's heaviest keys cluster-wide (refused hits or demand over the last minute
    /// at most), as a running node merges them from every member (`GET /v1/top`).
    Top(TopArgs),
    /// Print the audit of the last minute, cluster-wide (`GET /v1/audit`): per policy and window,
    /// what the whole cluster admitted against one ideal limiter fed the same arrivals (the
    /// worst window against the limit, the over-admission and false-refusal shares), then the
    /// keys admitted most above the ideal, with their owners.
    Audit(AuditArgs),
    /// Create a cluster CA and a certificate per node, for `ca_cert_path`/`cert_path`/`key_path`.
    Certs(CertsArgs),
    /// Check a configuration file (and the RATEMESH_ environment overrides) and exit.
    Validate(ValidateArgs),
    /// Run a node as a drop-in for envoyproxy/ratelimit: its YAML files
    /// ($RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY), its environment variables
    /// (GRPC_PORT, PORT, DEBUG_PORT, SHADOW_MODE, LIMIT_RESPONSE_HEADERS_ENABLED, LOG_LEVEL, …)
    /// and its HTTP endpoints; --config (a TOML file) and RATEMESH_ variables set the cluster.
    EnvoyRatelimit(ServeArgs),
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// The node's HTTP API address (host:port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: String,
    /// A configured policy's name (or give an inline limit with --algorithm).
    #[arg(long, required_unless_present = "algorithm")]
    policy: Option<String>,
    /// The key to check.
    #[arg(long)]
    key: String,
    /// Hits to take (default 1; 0 only asks; below 0 gives that many back: a refund).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_cost)]
    cost: Option<CostJson>,
    /// One of the policy's tiers (a key's override still wins; not with an inline limit).
    #[arg(long, conflicts_with = "algorithm")]
    tier: Option<String>,
    /// Inline limit: token_bucket, gcra, leaky_bucket, fixed_window, sliding_window_counter,
    /// sliding_window_log, concurrency or expiring_counter.
    #[arg(long, conflicts_with = "policy", requires_all = ["limit", "period_ms"])]
    algorithm: Option<String>,
    /// Inline limit: hits per period (concurrency: leases at once).
    #[arg(long, requires = "algorithm")]
    limit: Option<u64>,
    /// Inline limit: the period in milliseconds.
    #[arg(long, requires = "algorithm")]
    period_ms: Option<u64>,
    /// Inline limit: bucket capacity / burst.
    #[arg(long, requires = "algorithm")]
    burst: Option<u64>,
    /// Inline limit (leaky_bucket): hits that pass without delay.
    #[arg(long, requires = "algorithm")]
    delay: Option<u64>,
    /// Inline limit: exact or approximate.
    #[arg(long, requires = "algorithm")]
    mode: Option<String>,
    /// Inline limit: local_share, fail_open or fail_closed.
    #[arg(long, requires = "algorithm")]
    fallback: Option<String>,
    /// How long to wait for the answer, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
}

#[derive(Debug, Args)]
struct ClusterArgs {
    /// The node's HTTP API address (host:port).
    #[arg(long, default_value_t = HTTP_LISTEN_DEFAULT.to_string())]
    addr: String,
    /// Print the node's JSON answer as it is.
    #[arg(long)]
    json: bool,
    /// How long to wait for the answer, in milliseconds.
    #[arg(long, default_value_t = ANSWER_TIMEOUT_MS_DEFAULT)]
    timeout_ms: u64,
}

#[derive(Debug, Args)]
struct TopArgs {
    /// The node's HTTP API address (host:port).
    #[arg(long, default_value_t = HTTP_LISTEN_DEFAULT.to_string())]
    addr: String,
    /// A configured policy's name.
    #[arg(long)]
    policy: String,
    /// How many keys (1 to 100).
    #[arg(long, default_value_t = TOP_N_DEFAULT)]
    n: usize,
    /// refused or demand.
    #[arg(long, default_value_t = TOP_BY_DEFAULT.name().to_owned())]
    by: String,
    /// Print the node's JSON answer as it is.
    #[arg(long)]
    json: bool,
    /// How long to wait for the answer, in milliseconds.
    #[arg(long, default_value_t = ANSWER_TIMEOUT_MS_DEFAULT)]
    timeout_ms: u64,
}

#[derive(Debug, Args)]
struct AuditArgs {
    /// The node's HTTP API address (host:port).
    #[arg(long, default_value_t = HTTP_LISTEN_DEFAULT.to_string())]
    addr: String,
    /// A configured policy's name (or inline); without it, every policy.
    #[arg(long)]
    policy: Option<String>,
    /// How many keys (1 to 100).
    #[arg(short = 'n', long, default_value_t = AUDIT_N_DEFAULT)]
    n: usize,
    /// Print the node's JSON answer as it is.
    #[arg(long)]
    json: bool,
    /// How long to wait for the answer, in milliseconds.
    #[arg(long, default_value_t = ANSWER_TIMEOUT_MS_DEFAULT)]
    timeout_ms: u64,
}

#[derive(Debug, Default, Args)]
struct ServeArgs {
    /// The configuration file; without it, the embedded default (a single node on loopback).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct CertsArgs {
    /// The directory to write into (created if missing; existing files are never overwritten).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The node ids to issue certificates for, comma separated.
    #[arg(long, value_name = "IDS", value_delimiter = ',', required = true)]
    nodes: Vec<u64>,
}

#[derive(Debug, Args)]
struct ValidateArgs {
    /// The configuration file.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(arguments(std::env::args_os()));
    let result = match cli.command {
        None => serve(&cli.serve),
        Some(Command::Serve(args)) => serve(&args),
        Some(Command::Check(args)) => Ok(check(&args)),
        Some(Command::Cluster(args)) => Ok(cluster(&args)),
        Some(Command::Top(args)) => Ok(top(&args)),
        Some(Command::Audit(args)) => Ok(audit(&args)),
        Some(Command::Certs(args)) => certs(&args),
        Some(Command::Validate(args)) => Ok(validate(&args.config)),
        Some(Command::EnvoyRatelimit(args)) => envoy_ratelimit(&args),
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {}", error_text(&error));
        ExitCode::FAILURE
    })
}

/// The configuration `serve` would run on: the file (or the embedded default) with the process's
/// `RATEMESH_` overrides.
fn load_config(path: Option<&Path>) -> Result<Config, ratemeshd::ConfigError> {
    match path {
        Some(path) => Config::load_with_env(path, std::env::vars_os()),
        None => Config::parse_with_env(EMBEDDED_CONFIG, EMBEDDED_CONFIG_ORIGIN, std::env::vars_os()),
    }
}

/// `serve`: runs a node until SIGINT or SIGTERM.
fn serve(args: &ServeArgs) -> Result<ExitCode> {
    // Read through the source, so that the file watcher starts from the file this read.
    let mut source = args.config.clone().map(|path| ConfigSource::new(path, std::env::vars_os()));
    let config = match source.as_mut() {
        Some(source) => source.load()?,
        None => load_config(None)?,
    };
    let log = ratemeshd::logging::init(&config.log)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ratemeshd")
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(ratemeshd::serve::run(config, source, Some(log)))?;
    Ok(ExitCode::SUCCESS)
}

/// `envoy-ratelimit`: runs a node on envoyproxy/ratelimit's configuration until SIGINT or
/// SIGTERM.
fn envoy_ratelimit(args: &ServeArgs) -> Result<ExitCode> {
    let settings = ratemeshd::envoy_ratelimit::Settings::from_vars(std::env::vars_os())?;
    let debug = settings.debug;
    let ignored = settings.ignored.clone();
    let xds = settings.xds.clone().map(|xds| ratemeshd::serve::XdsStart {
        settings: xds,
        force_start: settings.force_start_without_initial_config,
        merge_domains: settings.merge_domains,
    });
    let mut source = ConfigSource::envoy_ratelimit(settings, args.config.clone(), std::env::vars_os());
    let config = source.load()?;
    let log = ratemeshd::logging::init(&config.log)?;
    if !ignored.is_empty() {
        tracing::info!(variables = ignored.join(","), "ignored: ratemesh needs no Redis, Memcache or statsd");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ratemeshd")
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(ratemeshd::serve::run_envoy_ratelimit(config, source, Some(log), debug, xds))?;
    Ok(ExitCode::SUCCESS)
}

/// A current-thread runtime for the client commands.
fn client_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the tokio runtime")
}

/// `--cost`: hits to take, or below 0 hits to give back (the HTTP API's `cost`).
fn parse_cost(text: &str) -> Result<CostJson, String> {
    let hits: i128 = text.parse().map_err(|_| format!("{text:?} is not an integer (below 0: a refund)"))?;
    let magnitude = u64::try_from(hits.unsigned_abs()).map_err(|_| format!("{text} is out of range"))?;
    Ok(if hits < 0 { CostJson::Refund(magnitude) } else { CostJson::Take(magnitude) })
}

/// The command line, with `envoy-ratelimit` put first when the program runs as `ratelimit`:
/// envoyproxy/ratelimit's command, which Envoy Gateway's Deployment runs (`/bin/ratelimit`, a
/// link to `ratemeshd` in the image).
fn arguments(args: impl IntoIterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut args: Vec<_> = args.into_iter().collect();
    let program = args.first().map(Path::new).and_then(Path::file_name);
    if program.is_some_and(|name| name == "ratelimit") {
        args.insert(1, "envoy-ratelimit".into());
    }
    args
}

/// `check`: `POST /v1/check` to a running node.
fn check(args: &CheckArgs) -> ExitCode {
    let limit = args.algorithm.as_ref().map(|algorithm| LimitBody {
        algorithm: Some(algorithm.clone()),
        limit: args.limit,
        period_ms: args.period_ms,
        window: None,
        time_zone: None,
        burst: args.burst,
        delay: args.delay,
        mode: args.mode.clone(),
        fallback: args.fallback.clone(),
    });
    let body = CheckBody {
        key: Some(args.key.clone()),
        cost: args.cost,
        limit,
        policy: args.policy.clone(),
        tier: args.tier.clone(),
    };
    let answer = serde_json::to_vec(&body).context("encoding the request").and_then(|body| {
        let timeout = Duration::from_millis(args.timeout_ms);
        client_runtime()?
            .block_on(client::request(
                &args.addr,
                "POST",
                "/v1/check",
                &[("Content-Type", "application/json")],
                &body,
                timeout,
            ))
            .with_context(|| format!("asking {}", args.addr))
    });
    let response = match answer {
        Ok(response) => response,
        Err(error) => {
            eprintln!("error: {}", error_text(&error));
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let json = response.json().ok();
    let pretty = json.as_ref().and_then(|json| serde_json::to_string_pretty(json).ok());
    let allowed = json.as_ref().and_then(|json| json.get("allowed")?.as_bool());
    match (response.status, allowed) {
        (200, Some(allowed)) => match write_out(&(pretty.unwrap_or_else(|| response.text()) + "\n")) {
            Ok(()) => ExitCode::from(if allowed { EXIT_ALLOWED } else { EXIT_REFUSED }),
            Err(error) => output_failed(&error),
        },
        (status, _) => {
            eprintln!("error: HTTP {status}: {}", pretty.unwrap_or_else(|| response.text()));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// `cluster`: `GET /v1/cluster` from a running node, as a table.
fn cluster(args: &ClusterArgs) -> ExitCode {
    get_and_print(&args.addr, "/v1/cluster", args.timeout_ms, args.json, cluster_table)
}

/// `top`: `GET /v1/top` from a running node, as a table.
fn top(args: &TopArgs) -> ExitCode {
    let encode = |text: &str| {
        percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let path = format!("/v1/top?policy={}&n={}&by={}", encode(&args.policy), args.n, encode(&args.by));
    get_and_print(&args.addr, &path, args.timeout_ms, args.json, top_table)
}

/// `audit`: `GET /v1/audit` from a running node, as a table.
fn audit(args: &AuditArgs) -> ExitCode {
    let mut path = format!("/v1/audit?n={}", args.n);
    if let Some(policy) = &args.policy {
        let encoded = percent_encoding::utf8_percent_encode(policy, percent_encoding::NON_ALPHANUMERIC);
        path.push_str(&format!("&policy={encoded}"));
    }
    get_and_print(&args.addr, &path, args.timeout_ms, args.json, audit_table)
}

/// The `GET /v1/audit` answer as text for a person: a row per policy and window, then the worst
/// keys, then the members.
fn audit_table(json: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let list = |value: &serde_json::Value| value.as_array().map(Vec::as_slice).unwrap_or_default().to_vec();
    let ratio = |value: &serde_json::Value| value.as_f64().unwrap_or(0.0);
    let seconds = |value: &serde_json::Value| value.as_u64().unwrap_or(0) as f64 / 1000.0;
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "audit of the last {} s: {} of {} members answered; what the cluster admitted against one ideal limiter",
        json["span_s"], json["nodes_answered"], json["nodes_asked"]
    );
    let _ = writeln!(
        out,
        "{:<20} {:>7} {:>8} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}",
        "policy", "window", "windows", "admitted", "ideal", "arrivals", "worst/L", "over", "false ref"
    );
    let policies = list(&json["policies"]);
    if policies.is_empty() {
        let _ = writeln!(out, "(no audited window closed in the last minute)");
    }
    for p in &policies {
        let incomplete = p["incomplete_key_windows"].as_u64().unwrap_or(0);
        let note = if incomplete > 0 { format!("  (+{incomplete} incomplete)") } else { String::new() };
        let _ = writeln!(
            out,
            "{:<20} {:>6}s {:>8} {:>10} {:>10} {:>10} {:>9.3} {:>8.2}% {:>8.2}%{note}",
            p["policy"].as_str().unwrap_or_default(),
            seconds(&p["window_ms"]),
            p["key_windows"],
            p["admitted"],
            p["ideal"],
            p["arrivals"],
            ratio(&p["admitted_over_limit_ratio"]),
            ratio(&p["over_admission_ratio"]) * 100.0,
            ratio(&p["false_refusal_ratio"]) * 100.0,
        );
    }
    let keys = list(&json["keys"]);
    if !keys.is_empty() {
        let _ = writeln!(out, "worst keys (most admitted above the ideal):");
        let _ = writeln!(
            out,
            "{:>4}  {:<20} {:>6} {:>10} {:>10} {:>9} {:>9}  key",
            "rank", "policy", "owner", "admitted", "ideal", "worst/L", "over"
        );
    }
    for (rank, k) in keys.iter().enumerate() {
        let key = match k["key"].as_str() {
            Some(text) => text.to_owned(),
            None => format!("(hash {})", k["key_hash"].as_str().unwrap_or_default()),
        };
        let _ = writeln!(
            out,
            "{:>4}  {:<20} {:>6} {:>10} {:>10} {:>9.3} {:>8.2}%  {key}",
            rank + 1,
            k["policy"].as_str().unwrap_or_default(),
            k["owner"],
            k["admitted"],
            k["ideal"],
            ratio(&k["admitted_over_limit_ratio"]),
            ratio(&k["over_admission_ratio"]) * 100.0,
        );
    }
    for missing in list(&json["missing"]) {
        let _ = writeln!(
            out,
            "MISSING member {}: {} (the keys it owns are not in the audit)",
            missing["id"],
            missing["reason"].as_str().unwrap_or_default()
        );
    }
    out
}

/// GETs `path` from the node at `addr` and prints the JSON answer, as it is or through `table`.
fn get_and_print(
    addr: &str,
    path: &str,
    timeout_ms: u64,
    as_json: bool,
    table: fn(&serde_json::Value) -> String,
) -> ExitCode {
    let timeout = Duration::from_millis(timeout_ms);
    let answer = client_runtime().and_then(|runtime| {
        runtime
            .block_on(client::request(addr, "GET", path, &[], &[], timeout))
            .with_context(|| format!("asking {addr}"))
    });
    let json = match answer {
        Ok(response) if response.status == 200 => match response.json() {
            Ok(json) => json,
            Err(error) => {
                eprintln!("error: the answer is not JSON: {error}");
                return ExitCode::from(EXIT_ERROR);
            }
        },
        Ok(response) => {
            eprintln!("error: HTTP {}: {}", response.status, response.text());
            return ExitCode::from(EXIT_ERROR);
        }
        Err(error) => {
            eprintln!("error: {}", error_text(&error));
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let text = match as_json {
        true => serde_json::to_string_pretty(&json).unwrap_or_else(|_| json.to_string()) + "\n",
        false => table(&json),
    };
    match write_out(&text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => output_failed(&error),
    }
}

/// An error and its causes, each once: a cause that the message before it already ends with (a
/// library error that names its source in its own text) is not repeated.
fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain().map(ToString::to_string) {
        if !text.ends_with(&cause) {
            text += if text.is_empty() { "" } else { ": " };
            text += &cause;
        }
    }
    text
}

/// Writes `text` to standard output, flushed: an error (a pipe closed early, a full disk) where
/// `print!` would panic.
fn write_out(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// The exit of a command whose answer could not be written: the error code, and why on standard
/// error (if that can be written).
fn output_failed(error: &std::io::Error) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "error: writing the answer to standard output: {error}");
    ExitCode::from(EXIT_ERROR)
}

/// The `GET /v1/top` answer as text for a person.
fn top_table(json: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let seconds = json["window_ms"].as_u64().unwrap_or(0) as f64 / 1000.0;
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "policy {} by {}: last {seconds:.0} s, {} hits; estimates exceed the true count by at most {}",
        json["policy"].as_str().unwrap_or_default(),
        json["by"].as_str().unwrap_or_default(),
        json["total"],
        json["error_bound"]
    );
    let _ = writeln!(out, "{:>4}  {:>10}  {:>8}  key", "rank", "hits", "± max");
    for (rank, key) in json["keys"].as_array().map(Vec::as_slice).unwrap_or_default().iter().enumerate() {
        let text = key["key"].as_str().unwrap_or_default();
        let _ = writeln!(out, "{:>4}  {:>10}  {:>8}  {text}", rank + 1, key["count"], key["error"]);
    }
    let members: Vec<String> = json["members"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|m| m.to_string())
        .collect();
    let _ = writeln!(out, "members answered: {}", members.join(", "));
    for missing in json["missing"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let _ = writeln!(
            out,
            "MISSING member {}: {}",
            missing["id"],
            missing["reason"].as_str().unwrap_or_default()
        );
    }
    out
}

/// The `GET /v1/cluster` answer as text for a person.
fn cluster_table(json: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let text = |value: &serde_json::Value| match value {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let mut out = String::new();
    let ready = if json["ready"].as_bool() == Some(true) { "ready" } else { "NOT ready" };
    // Writing to a String cannot fail.
    let _ = writeln!(out, "node {} of cluster {}: {ready}", text(&json["node"]), text(&json["cluster_id"]));
    let _ = writeln!(
        out,
        "{:>6}  {:<11} {:<16} {:<24} {:>10}",
        "member", "status", "region", "quic address", "ring share"
    );
    for member in json["members"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let share = member["ring_share"].as_f64().unwrap_or(0.0) * 100.0;
        // No region (or a node that does not report one): a dash.
        let region = member["region"].as_str().filter(|region| !region.is_empty()).unwrap_or("-");
        let _ = writeln!(
            out,
            "{:>6}  {:<11} {:<16} {:<24} {:>9.1}%",
            text(&member["id"]),
            text(&member["status"]),
            region,
            text(&member["quic_addr"]),
            share
        );
    }
    let ring = &json["ring"];
    let _ = writeln!(
        out,
        "ring: {} owners, this node owns {:.1}%, balance {:.2} (largest share over the fair one; 1.00 is even)",
        ring["owners"],
        ring["this_node_share"].as_f64().unwrap_or(0.0) * 100.0,
        ring["balance"].as_f64().unwrap_or(0.0),
    );
    out
}

/// `validate`: the configuration as `serve` reads it, and the cluster's certificates as a start
/// loads them (`ClusterSecurity::identity`: files readable, PEM parsed, the key matching the
/// certificate, the certificate accepted by the CA and naming the node:
/// `ClusterSecurity::checked_identity`).
fn validate(path: &Path) -> ExitCode {
    let checked = load_config(Some(path)).map_err(anyhow::Error::from).and_then(|config| {
        check_identity(&config)?;
        Ok(config)
    });
    match checked {
        Ok(config) => {
            match write_out(&format!("ok: {} ({} policies)\n", path.display(), config.policies.len())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => output_failed(&error),
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Builds the node's TLS identity from `config` as a start does (the node id resolved as a start
/// resolves it when it comes from the environment).
fn check_identity(config: &ratemeshd::Config) -> Result<()> {
    let security = config.cluster.auth.security().context("cluster security")?;
    if !matches!(security, ratemesh::ClusterSecurity::Provided(_)) {
        return Ok(());
    }
    let node = match config.node.id_from {
        None => config.node.id,
        Some(_) => client_runtime()?.block_on(ratemeshd::identity::resolve(config))?.id,
    };
    // The error names the file and the reason, and is not wrapped: a context would repeat it.
    security.checked_identity(node).map_err(|error| anyhow::anyhow!("cluster certificates: {error}"))?;
    Ok(())
}

/// The node ids of `certs --nodes`, sorted: at most [`CERT_FILES_NODES_MAX`], each once (a
/// repeated id is more likely a typo for a missing one than a wish for one file).
fn cert_node_ids(ids: &[u64]) -> Result<Vec<NodeId>> {
    anyhow::ensure!(
        ids.len() <= CERT_FILES_NODES_MAX,
        "{} nodes requested, at most {CERT_FILES_NODES_MAX}",
        ids.len()
    );
    let mut nodes: Vec<NodeId> = ids.iter().copied().map(NodeId).collect();
    nodes.sort_unstable();
    if let Some(pair) = nodes.windows(2).find(|pair| pair[0] == pair[1]) {
        anyhow::bail!("--nodes lists node {} more than once", pair[0].0);
    }
    Ok(nodes)
}

fn certs(args: &CertsArgs) -> Result<ExitCode> {
    let nodes = cert_node_ids(&args.nodes)?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let ca = ClusterCa::generate().context("generating the cluster CA")?;
    let files = write_cert_files(&args.out, &ca, &nodes).context("writing certificates")?;
    let mut text = format!(
        "CA certificate: {}\nCA key:         {} (keep it offline: it can issue certificates for any node)\n",
        files.ca_cert.display(),
        files.ca_key.display()
    );
    for node in &files.nodes {
        text += &format!("node {}: {} {}\n", node.node.0, node.cert.display(), node.key.display());
    }
    text += "\nIn each node's configuration file:\n\n";
    text += &format!("[cluster]\nca_cert_path = {:?}\n", files.ca_cert.display().to_string());
    text += &format!("cert_path = \"{}\"\n", args.out.join("node-<id>.pem").display());
    text += &format!("key_path = \"{}\"\n", args.out.join("node-<id>.key").display());
    write_out(&text).context("writing to standard output")?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    /// A cause the message already ends with is said once; other causes follow it.
    #[test]
    fn an_error_names_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("binding on 127.0.0.1:8080: {source}")]
        struct Bind {
            source: std::io::Error,
        }
        let io = || std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address already in use");
        let error = anyhow::Error::from(Bind { source: io() });
        assert_eq!(error_text(&error), "binding on 127.0.0.1:8080: Address already in use");
        let error = anyhow::Error::from(io()).context("starting");
        assert_eq!(error_text(&error), "starting: Address already in use");
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_command_means_serve() {
        let cli = Cli::try_parse_from(["ratemeshd"]).expect("parses");
        assert!(cli.command.is_none() && cli.serve.config.is_none());
        let as_ratelimit = Cli::try_parse_from(arguments(["/bin/ratelimit".into()])).expect("parses");
        assert!(matches!(as_ratelimit.command, Some(Command::EnvoyRatelimit(_))));
        let plain = Cli::try_parse_from(arguments(["/usr/bin/ratemeshd".into()])).expect("parses");
        assert!(plain.command.is_none());
        let cli = Cli::try_parse_from(["ratemeshd", "--config", "a.toml"]).expect("parses");
        assert_eq!(cli.serve.config.as_deref(), Some(Path::new("a.toml")));
        assert!(
            Cli::try_parse_from(["ratemeshd", "--config", "a.toml", "validate", "--config", "b"]).is_err()
        );
    }

    #[test]
    fn check_takes_a_policy_or_an_inline_limit() {
        let cli =
            Cli::try_parse_from(["ratemeshd", "check", "--policy", "api", "--key", "k"]).expect("parses");
        assert!(matches!(cli.command, Some(Command::Check(_))));
        let inline = [
            "ratemeshd",
            "check",
            "--key",
            "k",
            "--algorithm",
            "gcra",
            "--limit",
            "5",
            "--period-ms",
            "1000",
        ];
        assert!(Cli::try_parse_from(inline).is_ok());
        assert!(Cli::try_parse_from(["ratemeshd", "check", "--key", "k"]).is_err(), "needs policy or limit");
        assert!(
            Cli::try_parse_from(["ratemeshd", "check", "--key", "k", "--algorithm", "gcra"]).is_err(),
            "an inline limit needs --limit and --period-ms"
        );
        let both = [
            "ratemeshd",
            "check",
            "--key",
            "k",
            "--policy",
            "p",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--period-ms",
            "1",
        ];
        assert!(Cli::try_parse_from(both).is_err());
    }

    #[test]
    fn check_takes_a_negative_cost_as_a_refund_and_a_tier_of_a_policy() {
        let parse = |args: &[&str]| {
            let base = ["ratemeshd", "check", "--policy", "api", "--key", "k"];
            match Cli::try_parse_from(base.iter().chain(args)).map(|cli| cli.command) {
                Ok(Some(Command::Check(check))) => Ok((check.cost, check.tier)),
                Ok(other) => panic!("{other:?}"),
                Err(error) => Err(error.to_string()),
            }
        };
        assert_eq!(parse(&["--cost", "-3"]), Ok((Some(CostJson::Refund(3)), None)));
        assert_eq!(parse(&["--cost=-3"]), Ok((Some(CostJson::Refund(3)), None)));
        assert_eq!(parse(&["--cost", "7"]), Ok((Some(CostJson::Take(7)), None)));
        assert_eq!(parse(&["--tier", "pro"]), Ok((None, Some("pro".to_owned()))));
        assert!(parse(&["--cost", "-1.5"]).is_err_and(|e| e.contains("not an integer")));
        assert!(parse(&["--cost", "18446744073709551616"]).is_err_and(|e| e.contains("out of range")));
        let inline_with_tier =
            ["ratemeshd", "check", "--key", "k", "--algorithm", "gcra", "--limit", "1", "--period-ms", "1"];
        let with_tier = inline_with_tier.iter().chain(&["--tier", "pro"]);
        assert!(Cli::try_parse_from(with_tier).is_err(), "a tier belongs to a policy");
    }

    #[test]
    fn cluster_table_lists_members_and_balance() {
        let json = serde_json::json!({
            "node": 1, "cluster_id": "c", "ready": true,
            "members": [
                {"id": 1, "status": "live", "region": "eu-west", "quic_addr": "127.0.0.1:1", "ring_share": 0.5},
                {"id": 2, "status": "live", "region": "", "quic_addr": "127.0.0.1:2", "ring_share": 0.5},
            ],
            "ring": {"owners": 2, "this_node_share": 0.5, "balance": 1.0},
        });
        let table = cluster_table(&json);
        assert!(
            table.lines().any(|line| line.contains("eu-west") && line.contains("127.0.0.1:1")),
            "{table}"
        );
        assert!(table.lines().any(|line| line.contains(" - ") && line.contains("127.0.0.1:2")), "{table}");
        assert!(table.contains("node 1 of cluster c: ready"), "{table}");
        assert!(table.contains("127.0.0.1:1") && table.contains("50.0%"), "{table}");
        assert!(table.contains("balance 1.00"), "{table}");
    }

    #[test]
    fn top_table_ranks_keys_and_names_missing_members() {
        let json = serde_json::json!({
            "policy": "api", "by": "refused", "total": 130, "error_bound": 2, "window_ms": 42_000,
            "keys": [{"key": "abuser-a", "count": 90, "error": 0}, {"key": "user 7", "count": 40, "error": 2}],
            "members": [1, 2], "missing": [{"id": 3, "reason": "query timed out"}],
        });
        let table = top_table(&json);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "policy api by refused: last 42 s, 130 hits; estimates exceed the true count by at most 2"
        );
        assert_eq!(lines[2].split_whitespace().collect::<Vec<_>>(), ["1", "90", "0", "abuser-a"]);
        assert!(lines[3].ends_with("  user 7"), "{table}");
        assert_eq!(lines[4], "members answered: 1, 2");
        assert_eq!(lines[5], "MISSING member 3: query timed out");
    }

    #[test]
    fn audit_table_lists_policies_then_worst_keys_and_missing_members() {
        let json = serde_json::json!({
            "span_s": 60, "nodes_asked": 3, "nodes_answered": 2,
            "policies": [{"policy": "api", "window_ms": 1000, "key_windows": 180, "incomplete_key_windows": 2,
                "admitted": 18000, "ideal": 17900, "arrivals": 36000, "over_admitted": 150, "false_refused": 50,
                "admitted_over_limit_ratio": 1.02, "over_admission_ratio": 0.0056, "false_refusal_ratio": 0.0014}],
            "keys": [
                {"policy": "api", "key": "user:42", "key_hash": "00ff", "owner": 2, "window_ms": 1000,
                 "admitted": 130, "ideal": 100, "admitted_over_limit_ratio": 1.3, "over_admission_ratio": 0.3},
                {"policy": "api", "key": null, "key_hash": "abcd", "owner": 1, "window_ms": 1000,
                 "admitted": 100, "ideal": 100, "admitted_over_limit_ratio": 1.0, "over_admission_ratio": 0.0}],
            "missing": [{"id": 3, "reason": "query timed out"}],
        });
        let table = audit_table(&json);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("audit of the last 60 s: 2 of 3 members answered"), "{table}");
        let row: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            row,
            ["api", "1s", "180", "18000", "17900", "36000", "1.020", "0.56%", "0.14%", "(+2", "incomplete)"]
        );
        assert_eq!(lines[3], "worst keys (most admitted above the ideal):");
        assert_eq!(
            lines[5].split_whitespace().collect::<Vec<_>>(),
            ["1", "api", "2", "130", "100", "1.300", "30.00%", "user:42"]
        );
        assert!(lines[6].ends_with("(hash abcd)"), "{table}");
        assert_eq!(lines[7], "MISSING member 3: query timed out (the keys it owns are not in the audit)");
        let parsed =
            Cli::try_parse_from(["ratemeshd", "audit", "-n", "5", "--policy", "api"]).expect("parses");
        let Some(Command::Audit(args)) = parsed.command else { panic!("audit expected") };
        assert_eq!((args.n, args.policy.as_deref()), (5, Some("api")));
    }

    #[test]
    fn certs_takes_a_comma_separated_node_list() {
        let cli =
            Cli::try_parse_from(["ratemeshd", "certs", "--out", "d", "--nodes", "1,2,3"]).expect("parses");
        let Some(Command::Certs(args)) = cli.command else { panic!("certs expected") };
        assert_eq!(args.nodes, [1, 2, 3]);
        assert!(Cli::try_parse_from(["ratemeshd", "certs", "--out", "d"]).is_err());
        assert!(Cli::try_parse_from(["ratemeshd", "certs", "--out", "d", "--nodes", "1,x"]).is_err());
    }

    #[test]
    fn certs_refuses_a_node_listed_twice() {
        assert_eq!(cert_node_ids(&[3, 1, 2]).expect("distinct"), [NodeId(1), NodeId(2), NodeId(3)]);
        let error = cert_node_ids(&[1, 1, 0]).expect_err("1 twice").to_string();
        assert_eq!(error, "--nodes lists node 1 more than once");
    }
}
