//! The configuration file (TOML): node, cluster, listeners, bounds, logging and policies.
//!
//! Every field has a default, so an empty file is valid and gives [`Config::default`]: a single
//! node on loopback (HTTP 127.0.0.1:8080, Envoy RLS gRPC 127.0.0.1:8081, gossip UDP
//! 127.0.0.1:7946, QUIC 127.0.0.1:7947) secured by the public [`DEV_CLUSTER_SECRET`].
//!
//! Loading is three steps: TOML into a raw model that remembers where each value came from, then
//! environment overrides (`RATEMESH_<SECTION>_<FIELD>`, see [`env_variable_names`]), then
//! validation into the typed [`Config`]. Every refusal is a [`ConfigError`] that names the field
//! and where its value came from: `file:line:column`, or the environment variable. A refused file
//! changes nothing: the caller keeps the configuration it runs on (hot reload relies on this).
//!
//! The model is `model.rs`, its defaults `defaults.rs` (stated once), the raw file `raw.rs`,
//! overrides `env.rs`, validation `validate.rs` and `policies.rs`, errors `error.rs`, and which
//! fields a reload may change `reload.rs`. A field of the sections of single values is declared
//! twice, each time in a table that generates the rest: in `raw.rs` (its name and kind: the raw
//! struct and its environment override) and in `model.rs` (its type, default and reload class:
//! the struct, its `Default` and the reload classification); then validated in `validate.rs`.
//!
//! ```toml
//! [node]
//! id = 1
//!
//! [cluster]
//! seeds = ["10.0.0.2:7946"]     # or a DNS name: ["ratemesh-peers:7946"]
//! secret = "a long shared secret, 16 bytes or more"
//!
//! [[policies]]
//! name = "api"
//! algorithm = "token_bucket"
//! limit = 100
//! period_ms = 1000
//! ```

mod defaults;
mod env;
mod error;
mod model;
mod policies;
mod raw;
mod reload;
#[cfg(test)]
mod tests;
mod validate;

use std::io::Read as _;
use std::path::Path;

pub use defaults::*;
pub use env::{ENV_PREFIX, variable_name as env_variable_name, variable_names as env_variable_names};
pub use error::{ConfigError, Location};
pub(crate) use error::{limit_error_field, limit_error_message};
pub use model::*;
pub(crate) use model::{algorithm_names, fallback_from_name, fallback_name, mode_from_name, mode_name};
use raw::RawConfig;
pub use reload::{RELOADABLE, restart_only_changes};
use validate::Ctx;
pub use validate::{
    ADMIN_TOKEN_BYTES_MIN, DESCRIPTOR_DEPTH_MAX, NAME_BYTES_MAX, POLICIES_MAX, SEEDS_MAX, VARIANTS_MAX,
};

/// The largest configuration file accepted, in bytes. A policy file is small; a larger one is a
/// wrong path (a log, a binary), refused before it is parsed.
pub const CONFIG_FILE_BYTES_MAX: usize = 1 << 20;

impl Config {
    /// Parses and validates `text`, with no environment overrides. `origin` names the text in
    /// errors (usually the file's path).
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        Config::parse_with_env(text, origin, std::iter::empty::<(&str, &str)>())
    }

    /// Parses `text`, applies the `RATEMESH_` variables among `vars` (pass `std::env::vars_os()`),
    /// and validates the result.
    pub fn parse_with_env<I, K, V>(text: &str, origin: &str, vars: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<std::ffi::OsStr>,
        V: AsRef<std::ffi::OsStr>,
    {
        if text.len() > CONFIG_FILE_BYTES_MAX {
            return Err(ConfigError::TooLarge {
                origin: origin.to_owned(),
                max_bytes: CONFIG_FILE_BYTES_MAX,
            });
        }
        let ctx = Ctx { text, origin };
        let mut raw: RawConfig = toml::from_str(text).map_err(|error| ctx.toml_error(error))?;
        env::apply(&mut raw, vars)?;
        ctx.validate(&raw)
    }

    /// Reads (at most [`CONFIG_FILE_BYTES_MAX`] bytes), parses and validates the file at `path`,
    /// with no environment overrides.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_with_env(path, std::iter::empty::<(&str, &str)>())
    }

    /// [`Config::load`], then the `RATEMESH_` variables among `vars`.
    pub fn load_with_env<I, K, V>(path: &Path, vars: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<std::ffi::OsStr>,
        V: AsRef<std::ffi::OsStr>,
    {
        let text = read_bounded(path)?;
        Config::parse_with_env(&text, &path.display().to_string(), vars)
    }
}

fn read_bounded(path: &Path) -> Result<String, ConfigError> {
    let read_error = |source| ConfigError::Read { path: path.to_owned(), source };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    // One byte more than the bound, to tell "exactly at the bound" from "over it".
    file.take(CONFIG_FILE_BYTES_MAX as u64 + 1).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() > CONFIG_FILE_BYTES_MAX {
        return Err(ConfigError::TooLarge {
            origin: path.display().to_string(),
            max_bytes: CONFIG_FILE_BYTES_MAX,
        });
    }
    String::from_utf8(bytes)
        .map_err(|error| read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, error.utf8_error())))
}
