//! ratemeshd: the ratemesh daemon, for services in any language and for API gateways.
//!
//! - [`config`]: the TOML configuration file with environment overrides, validated into a
//!   [`Config`] whose every refusal names the field and the line.
//! - [`policy`]: the [`PolicyTable`] built from a configuration (lookup by name, Envoy descriptor
//!   matching with envoyproxy/ratelimit semantics).
//! - [`check`]: what a check counts against ([`check::Target`]) and the one typed answer of the
//!   daemon's checks ([`check::Answer`]), which the HTTP API, the RLS server and the metrics
//!   render.
//! - [`identity`]: the node id and advertised addresses from the environment (`id_from`,
//!   `advertise_ip_from`: a StatefulSet pod's ordinal, a compose replica's container name).
//! - [`daemon`]: the running [`Daemon`]: the node, the current policies (hot reload), checks
//!   answered as one [`check::Answer`] and counted in metrics, readiness, shutdown.
//! - [`metrics`]: the Prometheus metrics; [`rates`]: recent decision rates for the dashboard;
//!   [`audit`]: the audit's figures named by policy, and their ratios.
//! - [`http`]: the HTTP API (axum), its JSON bodies ([`http::body`]) and the dashboard page
//!   (`dashboard.html`, served at `/`); [`rls`]: the Envoy Rate Limit Service (gRPC);
//!   [`resp`]: the Redis protocol listener (redis-cell's `CL.THROTTLE`); [`rlqs`]: Envoy's Rate
//!   Limit Quota Service (one limit split across Envoys by reported demand);
//!   [`serve`]: listeners, reload triggers, signals, graceful shutdown; [`listener`]: the
//!   listeners' connection bound; [`logging`]: text or JSON logs with a reloadable level.
//! - [`client`]: a minimal HTTP/1.1 client for the CLI's `check` and `cluster`.

pub mod audit;
pub mod check;
pub mod client;
pub mod config;
pub mod daemon;
pub mod envoy_ratelimit;
pub mod http;
pub mod identity;
pub mod listener;
pub mod logging;
pub mod metrics;
pub mod overrides;
pub mod policy;
pub mod rates;
pub mod resp;
pub mod rlqs;
pub mod rls;
pub mod serve;
pub mod xds;

pub use config::{Config, ConfigError};
pub use daemon::{Daemon, DaemonError};
pub use http::body::BodyError;
pub use policy::PolicyTable;
