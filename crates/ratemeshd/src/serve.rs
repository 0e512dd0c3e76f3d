//! `ratemeshd serve`: the listeners, reload triggers, signals and graceful shutdown.
//!
//! [`run`] is the whole command: start the [`Daemon`], bind the HTTP API, the Envoy RLS
//! gRPC listener and, when configured, the Redis protocol listener ([`start`]), reload on SIGHUP and when the configuration file changes
//! ([`spawn_file_watcher`]), and on SIGINT or SIGTERM shut down gracefully ([`Servers::shutdown`]):
//! readiness turns false at once, the node announces its leave and hands its keys to their new
//! owners while both servers keep answering (in-flight requests complete; new ones get their
//! answer, 503 for checks), and only then do the servers stop accepting and finish the requests
//! in progress (at most [`DRAIN_TIMEOUT`]).
//!
//! # Shutdown time
//!
//! SIGTERM to exit is the node's leave — the gossip rounds until every live member has shown
//! that it knows of the leave (one or two; at most `3 + log2(members) + 1`), the handoff, then
//! at most `cluster.leave_linger_ms` waiting for its acknowledgements (a round trip when the
//! peers answer) — plus the drain of requests still in progress. With the default 200 ms gossip
//! and nothing else leaving it is well under a second (measured 0.2–0.3 s, three processes on
//! loopback, `tests/processes.rs`); at most `(3 + log2(members) + 1) × gossip_interval +
//! leave_linger_ms` plus the drain. Kubernetes' `terminationGracePeriodSeconds` must exceed that
//! (see `deploy/kubernetes`).
//!
//! # Connections
//!
//! Each listener keeps at most `limits.connections_max` connections open (`crate::listener`:
//! one more is closed as soon as it is accepted). An HTTP connection is served by the API's
//! front (`crate::http::Front`: `POST /v1/check` itself, anything else by hyper's HTTP/1 server
//! with a timer, to which it hands the connection), so that a request's head must arrive within
//! [`crate::http::HEADER_READ_TIMEOUT`] of the connection waiting for it: a connection that
//! sends nothing, sends its head a byte at a time, or sits idle after a keep-alive answer is
//! closed then. (`axum::serve` installs no timer and could not bound this.)

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{error, info, warn};

use crate::config::Config;
use crate::daemon::{ConfigSource, Daemon, DaemonError, ReloadError, Reloaded, XdsDocuments};
use crate::envoy_ratelimit::ConfigFile;
use crate::http::Front;
use crate::listener::{LimitedIncoming, serve_connections};
use crate::logging::LogControl;

/// How long the servers may take to finish the requests in progress at shutdown.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the configuration file's stamp ([`crate::daemon::FileStamp`]) is polled.
pub const FILE_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The daemon (its node) could not start.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// A listener could not be bound.
    #[error("binding the {what} listener on {addr}: {source}")]
    Bind {
        /// `HTTP`, `gRPC` or `RESP`.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// A server stopped with an error.
    #[error("{what} server: {message}")]
    Server {
        /// `HTTP` or `gRPC`.
        what: &'static str,
        /// What happened.
        message: String,
    },
    /// Signal handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signals(std::io::Error),
    /// A listener's TLS files could not be used.
    #[error("TLS on the {listener} listener: {error}")]
    Tls {
        /// `gRPC`.
        listener: &'static str,
        /// Which file, and why.
        error: crate::rls::tls::TlsError,
    },
}

/// The time bounds of both servers. The defaults are those of [`crate::http`] and
/// [`crate::rls`]; tests shorten them to see them work without waiting seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// The HTTP API's.
    pub http: crate::http::Timeouts,
    /// The Envoy RLS server's.
    pub grpc: crate::rls::Timeouts,
    /// The Redis protocol listener's.
    pub resp: crate::resp::Timeouts,
}

/// The running servers of a daemon, with the addresses they are bound to (port 0 in the
/// configuration is replaced by the port the system chose).
#[derive(Debug)]
pub struct Servers {
    daemon: Arc<Daemon>,
    http_addr: SocketAddr,
    grpc_addr: Option<SocketAddr>,
    resp_addr: Option<SocketAddr>,
    rlqs_addr: Option<SocketAddr>,
    http_connections: Arc<Semaphore>,
    grpc_connections: Arc<Semaphore>,
    resp_connections: Arc<Semaphore>,
    tasks: JoinSet<(&'static str, Result<(), String>)>,
}

impl Servers {
    /// The HTTP API's address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The Envoy RLS gRPC address (`None` if the gRPC server is not built in).
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc_addr
    }

    /// The Redis protocol address (`None` unless `[listen] resp` is set).
    pub fn resp_addr(&self) -> Option<SocketAddr> {
        self.resp_addr
    }

    /// The RLQS address (`None` unless `[listen] rlqs` is set).
    pub fn rlqs_addr(&self) -> Option<SocketAddr> {
        self.rlqs_addr
    }

    /// The daemon served.
    pub fn daemon(&self) -> &Arc<Daemon> {
        &self.daemon
    }

    /// The HTTP listener's connection bound (`limits.connections_max` permits, one held by each
    /// open connection). Waiting for a permit tells when a connection has been let go.
    pub fn http_connections(&self) -> &Arc<Semaphore> {
        &self.http_connections
    }

    /// The gRPC listener's connection bound, as [`Servers::http_connections`].
    pub fn grpc_connections(&self) -> &Arc<Semaphore> {
        &self.grpc_connections
    }

    /// The RESP listener's connection bound, as [`Servers::http_connections`].
    pub fn resp_connections(&self) -> &Arc<Semaphore> {
        &self.resp_connections
    }

    /// Waits until a server stops by itself (an error, or the shutdown began).
    pub async fn stopped(&mut self) -> Result<(), ServeError> {
        match self.tasks.join_next().await {
            None => Ok(()),
            Some(Ok((_, Ok(())))) => Ok(()),
            Some(Ok((what, Err(message)))) => Err(ServeError::Server { what, message }),
            Some(Err(join)) => Err(ServeError::Server { what: "a", message: join.to_string() }),
        }
    }

    /// Graceful shutdown: the daemon stops being ready and refuses new checks, the node leaves the
    /// cluster, handing its keys over, while the servers keep answering; then the servers stop
    /// accepting and finish what is in progress (at most [`DRAIN_TIMEOUT`], then the rest is
    /// dropped).
    pub async fn shutdown(mut self) {
        let started = std::time::Instant::now();
        self.daemon.shutdown().await;
        info!(elapsed_ms = started.elapsed().as_millis(), "node left the cluster; closing the listeners");
        let drain = async {
            // Bounded by the number of servers.
            while let Some(joined) = self.tasks.join_next().await {
                match joined {
                    Ok((what, Err(message))) => {
                        warn!(server = what, %message, "server stopped with an error")
                    }
                    Ok((what, Ok(()))) => info!(server = what, "server stopped"),
                    Err(join) => warn!(%join, "server task failed"),
                }
            }
        };
        if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
            warn!(timeout = ?DRAIN_TIMEOUT, "requests still in progress after the drain timeout: dropped");
            self.tasks.abort_all();
        }
        info!(elapsed_ms = started.elapsed().as_millis(), "shut down");
    }
}

/// Binds the HTTP API on `listen.http` and the gRPC server on `listen.grpc`, and serves them
/// until the daemon's node has left at shutdown ([`Servers::shutdown`]).
pub async fn start(daemon: Arc<Daemon>) -> Result<Servers, ServeError> {
    start_with(daemon, Options::default()).await
}

/// [`start`] with other time bounds.
pub async fn start_with(daemon: Arc<Daemon>, options: Options) -> Result<Servers, ServeError> {
    let (config, _) = daemon.current();
    let mut tasks = JoinSet::new();
    // One bound per listener: a flood of connections to one server does not lock the other out.
    let http_connections = Arc::new(Semaphore::new(config.limits.connections_max));
    let grpc_connections = Arc::new(Semaphore::new(config.limits.connections_max));
    let resp_connections = Arc::new(Semaphore::new(config.limits.connections_max));
    let http_addr =
        start_http(&daemon, config.listen.http, Arc::clone(&http_connections), options.http, &mut tasks)
            .await?;
    let grpc_addr =
        start_grpc(&daemon, config.listen.grpc, Arc::clone(&grpc_connections), options.grpc, &mut tasks)
            .await?;
    let resp_addr = match config.listen.resp {
        Some(addr) => {
            Some(start_resp(&daemon, addr, Arc::clone(&resp_connections), options.resp, &mut tasks).await?)
        }
        None => None,
    };
    let rlqs_addr = match config.listen.rlqs {
        // Its own connection bound, as every listener.
        Some(addr) => Some(
            start_rlqs(&daemon, addr, Arc::new(Semaphore::new(config.limits.connections_max)), &mut tasks)
                .await?,
        ),
        None => None,
    };
    Ok(Servers {
        daemon,
        http_addr,
        grpc_addr,
        resp_addr,
        rlqs_addr,
        http_connections,
        grpc_connections,
        resp_connections,
        tasks,
    })
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServeError> {
    let bind_error = |source| ServeError::Bind { what, addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

/// The HTTP API server.
async fn start_http(
    daemon: &Arc<Daemon>,
    addr: SocketAddr,
    connections: Arc<Semaphore>,
    timeouts: crate::http::Timeouts,
    tasks: &mut JoinSet<(&'static str, Result<(), String>)>,
) -> Result<SocketAddr, ServeError> {
    let (listener, local) = bind("HTTP", addr).await?;
    let refused = daemon.metrics().connections_refused("http");
    let incoming = LimitedIncoming::new(TcpListenerStream::new(listener), connections, "http", refused)
        .write_timeout(timeouts.write);
    let front = Front::new(Arc::clone(daemon), timeouts);
    let shutdown = daemon.close_signal();
    tasks.spawn(async move {
        serve_http(incoming, front, shutdown).await;
        ("HTTP", Ok(()))
    });
    Ok(local)
}

/// Serves the API on every connection of `incoming` ([`Front`]) until `shutdown` completes,
/// then stops accepting, asks every connection to close after its request in progress, and
/// returns once they all did. The connections are tasks of this future: dropping it (the drain
/// timeout) drops them.
async fn serve_http(
    incoming: LimitedIncoming<TcpListenerStream>,
    front: Front,
    shutdown: impl std::future::Future<Output = ()>,
) {
    serve_connections(incoming, "HTTP", shutdown, |stream, closing| front.clone().serve(stream, closing))
        .await;
}

/// The Envoy Rate Limit Service (gRPC) server: binds `listen.grpc` and runs
/// [`crate::rls::serve`] until shutdown.
async fn start_grpc(
    daemon: &Arc<Daemon>,
    addr: SocketAddr,
    connections: Arc<Semaphore>,
    timeouts: crate::rls::Timeouts,
    tasks: &mut JoinSet<(&'static str, Result<(), String>)>,
) -> Result<Option<SocketAddr>, ServeError> {
    let tls = match &daemon.current().0.listen.grpc_tls {
        Some(files) => {
            Some(files.server_config().map_err(|error| ServeError::Tls { listener: "gRPC", error })?)
        }
        None => None,
    };
    let (listener, local) = bind("gRPC", addr).await?;
    let shutdown = daemon.close_signal();
    let server = crate::rls::serve(Arc::clone(daemon), listener, connections, timeouts, tls, shutdown);
    tasks.spawn(async move {
        server.await;
        ("gRPC", Ok(()))
    });
    Ok(Some(local))
}

/// The Redis protocol listener: binds `listen.resp` and runs [`crate::resp::serve`] until
/// shutdown.
async fn start_resp(
    daemon: &Arc<Daemon>,
    addr: SocketAddr,
    connections: Arc<Semaphore>,
    timeouts: crate::resp::Timeouts,
    tasks: &mut JoinSet<(&'static str, Result<(), String>)>,
) -> Result<SocketAddr, ServeError> {
    let (listener, local) = bind("RESP", addr).await?;
    let server =
        crate::resp::serve(Arc::clone(daemon), listener, connections, timeouts, daemon.close_signal());
    tasks.spawn(async move {
        server.await;
        ("RESP", Ok(()))
    });
    Ok(local)
}

/// Envoy's Rate Limit Quota Service: binds `listen.rlqs` and runs [`crate::rlqs::serve`] until
/// shutdown (its streams end when shutdown begins).
async fn start_rlqs(
    daemon: &Arc<Daemon>,
    addr: SocketAddr,
    connections: Arc<Semaphore>,
    tasks: &mut JoinSet<(&'static str, Result<(), String>)>,
) -> Result<SocketAddr, ServeError> {
    let (listener, local) = bind("RLQS", addr).await?;
    let server = crate::rlqs::serve(Arc::clone(daemon), listener, connections, daemon.close_signal());
    tasks.spawn(async move { ("RLQS", server.await) });
    Ok(local)
}

/// Reloads the configuration and logs the outcome; `why` says what triggered it.
pub fn reload_and_log(daemon: &Daemon, why: &str) -> Result<Reloaded, ReloadError> {
    let result = daemon.reload();
    match &result {
        Ok(Reloaded::Applied) => {
            let (config, _) = daemon.current();
            info!(
                trigger = why,
                policies = config.policies.len(),
                level = config.log.level.name(),
                "configuration reloaded"
            );
        }
        Ok(Reloaded::Unchanged) => info!(trigger = why, "configuration unchanged"),
        Err(e) => {
            error!(trigger = why, error = %e, "configuration reload refused; the running configuration stays")
        }
    }
    result
}

/// Polls the daemon's configuration files every `period` (their identity, modification time and
/// length, symlinks followed: a Kubernetes ConfigMap's symlink swap is a change; no file-system
/// notification dependency) and reloads when it differs from the file as it was
/// last read (at start, or by any reload: [`Daemon::read_stamp`]) and then stayed the same for
/// one more poll: an editor that truncates and then writes is never read half-way. A change made
/// between the start's read and the watcher's first poll is therefore seen too. Stops when the
/// daemon shuts down. `None` when the daemon has no file.
pub fn spawn_file_watcher(daemon: Arc<Daemon>, period: Duration) -> Option<JoinHandle<()>> {
    daemon.source_path()?;
    let shutdown = daemon.shutdown_signal();
    Some(tokio::spawn(async move {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pending = daemon.read_stamp();
        // Runs until the daemon shuts down.
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = tick.tick() => {}
            }
            let now = daemon.stamp_now();
            if now != daemon.read_stamp() && now == pending {
                let _ = reload_and_log(&daemon, "file changed");
            }
            pending = now;
        }
    }))
}

/// Applies the daemon's log level to the installed subscriber whenever a reload changes it.
fn spawn_log_level_follower(daemon: &Daemon, log: LogControl) -> JoinHandle<()> {
    let mut levels = daemon.subscribe_log_level();
    tokio::spawn(async move {
        // Ends when the daemon is dropped (the sender closes).
        while levels.changed().await.is_ok() {
            let level = *levels.borrow_and_update();
            match log.set_level(level) {
                Ok(()) => info!(level = level.name(), "log level changed"),
                Err(e) => warn!(%e, "log level not changed"),
            }
        }
    })
}

/// `ratemeshd serve`: runs a node on `config` until SIGINT or SIGTERM. `source` is the file the
/// configuration came from (reloaded on SIGHUP and when it changes); `log` applies reloaded
/// log levels.
pub async fn run(
    config: Config,
    source: Option<ConfigSource>,
    log: Option<LogControl>,
) -> Result<(), ServeError> {
    run_with_debug(config, source, log, None, None).await
}

/// Stops a daemon that was signalled before its listeners opened.
async fn stop_before_serving(daemon: &Daemon, signal: &'static str) -> Result<(), ServeError> {
    info!(signal, "stopping");
    daemon.shutdown().await;
    Ok(())
}

/// A task aborted when this is dropped (the xDS client, when the daemon stops).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `ratemeshd envoy-ratelimit`: [`run`], and `GET /rlconfig` on `debug` (envoyproxy/ratelimit's
/// `DEBUG_PORT`); with `CONFIG_TYPE=GRPC_XDS_SOTW`, the xDS client (see [`XdsStart`]).
pub async fn run_envoy_ratelimit(
    config: Config,
    source: ConfigSource,
    log: Option<LogControl>,
    debug: SocketAddr,
    xds: Option<XdsStart>,
) -> Result<(), ServeError> {
    run_with_debug(config, Some(source), log, Some(debug), xds).await
}

/// The xDS client of `ratemeshd envoy-ratelimit` (`CONFIG_TYPE=GRPC_XDS_SOTW`): each
/// configuration the server sends is checked as files are, put in the source's documents and
/// reloaded; one that is refused is answered with a NACK and the running one stays.
#[derive(Debug)]
pub struct XdsStart {
    /// How to reach the server.
    pub settings: crate::xds::XdsSettings,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: serve before the first configuration.
    pub force_start: bool,
    /// `MERGE_DOMAIN_CONFIG`.
    pub merge_domains: bool,
}

impl XdsStart {
    /// Spawns the client over `daemon`; the receiver turns true once a configuration from the
    /// server is in force.
    fn spawn(self, daemon: &Arc<Daemon>, documents: XdsDocuments) -> (JoinHandle<()>, watch::Receiver<bool>) {
        let (applied, first) = watch::channel(false);
        let reloaded = Arc::clone(daemon);
        let merge_domains = self.merge_domains;
        let apply = move |sent: Vec<crate::xds::ConfigDocument>| -> Result<(), String> {
            let files: Vec<ConfigFile> = sent
                .into_iter()
                .map(|document| ConfigFile { name: document.name, text: document.yaml })
                .collect();
            // Checked before it replaces anything: a refused configuration is not even stored.
            crate::envoy_ratelimit::load(&files, merge_domains).map_err(|error| error.to_string())?;
            let previous = std::mem::replace(&mut *documents.lock(), files);
            match reloaded.reload() {
                Ok(_) => {
                    applied.send_replace(true);
                    Ok(())
                }
                Err(error) => {
                    *documents.lock() = previous;
                    Err(error.to_string())
                }
            }
        };
        let task = tokio::spawn(crate::xds::run(self.settings, apply, daemon.close_signal()));
        (task, first)
    }
}

/// Serves `GET /rlconfig` on `addr` until the daemon closes its servers.
async fn start_debug(daemon: &Arc<Daemon>, addr: SocketAddr) -> Result<JoinHandle<()>, ServeError> {
    let (listener, local) = bind("debug", addr).await?;
    let shown = Arc::clone(daemon);
    let router = axum::Router::new().route(
        "/rlconfig",
        axum::routing::get(move || std::future::ready(crate::http::envoy_ratelimit::rlconfig_text(&shown))),
    );
    info!(debug = %local, "serving /rlconfig");
    let shutdown = daemon.close_signal();
    Ok(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).with_graceful_shutdown(shutdown).await {
            warn!(%error, "debug listener failed");
        }
    }))
}

async fn run_with_debug(
    config: Config,
    source: Option<ConfigSource>,
    log: Option<LogControl>,
    debug: Option<SocketAddr>,
    xds: Option<XdsStart>,
) -> Result<(), ServeError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = signal(SignalKind::hangup()).map_err(ServeError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(ServeError::Signals)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(ServeError::Signals)?;
    let documents = source.as_ref().and_then(ConfigSource::xds_documents);
    let daemon = Daemon::start_with_source(config, source).await?;
    let mut _xds_client = None;
    if let (Some(xds), Some(documents)) = (xds, documents) {
        let force_start = xds.force_start;
        let (task, mut first) = xds.spawn(&daemon, documents);
        _xds_client = Some(AbortOnDrop(task));
        if !force_start {
            // As envoyproxy/ratelimit starts: no listener before the first configuration.
            info!(
                "waiting for the first configuration from the xDS server (FORCE_START_WITHOUT_INITIAL_CONFIG is off)"
            );
            tokio::select! {
                _ = first.wait_for(|applied| *applied) => {}
                _ = interrupt.recv() => return stop_before_serving(&daemon, "SIGINT").await,
                _ = terminate.recv() => return stop_before_serving(&daemon, "SIGTERM").await,
            }
        }
    }
    let mut servers = match start(Arc::clone(&daemon)).await {
        Ok(servers) => servers,
        Err(e) => {
            daemon.shutdown().await;
            return Err(e);
        }
    };
    info!(
        http = %servers.http_addr(),
        grpc = %servers.grpc_addr().map_or_else(|| "-".to_owned(), |addr| addr.to_string()),
        resp = %servers.resp_addr().map_or_else(|| "-".to_owned(), |addr| addr.to_string()),
        rlqs = %servers.rlqs_addr().map_or_else(|| "-".to_owned(), |addr| addr.to_string()),
        node = daemon.id().0,
        "serving"
    );
    let debug = match debug {
        Some(addr) => match start_debug(&daemon, addr).await {
            Ok(task) => Some(task),
            Err(e) => {
                servers.shutdown().await;
                return Err(e);
            }
        },
        None => None,
    };
    let _log_follower = log.map(|log| spawn_log_level_follower(&daemon, log));
    let _watcher = spawn_file_watcher(Arc::clone(&daemon), FILE_POLL_INTERVAL);
    // Runs until a stop signal or a server failure.
    let outcome = loop {
        tokio::select! {
            _ = hangup.recv() => {
                let _ = reload_and_log(&daemon, "SIGHUP");
            }
            _ = interrupt.recv() => {
                info!(signal = "SIGINT", "stopping");
                break Ok(());
            }
            _ = terminate.recv() => {
                info!(signal = "SIGTERM", "stopping");
                break Ok(());
            }
            stopped = servers.stopped() => {
                break Err(stopped.err().unwrap_or(ServeError::Server {
                    what: "a",
                    message: "stopped unexpectedly".to_owned(),
                }));
            }
        }
    };
    servers.shutdown().await;
    if let Some(debug) = debug {
        debug.abort();
    }
    outcome
}
