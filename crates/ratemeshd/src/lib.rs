//! ratemeshd: the ratemesh daemon, for services in any language and for API gateways.
//!
//! This library holds the daemon's pure parts, which the network servers plug into:
//!
//! - [`config`]: the TOML configuration file with environment overrides, validated into a
//!   [`Config`] whose every refusal names the field and the line.
//! - [`policy`]: the [`PolicyTable`] built from a configuration (lookup by name, Envoy descriptor
//!   matching with envoyproxy/ratelimit semantics), and the JSON bodies of the HTTP API
//!   (`POST /v1/check`, `/v1/check/batch`, `/v1/release`) with their validation and responses.

pub mod config;
pub mod policy;

pub use config::{Config, ConfigError};
pub use policy::{BodyError, PolicyTable};
