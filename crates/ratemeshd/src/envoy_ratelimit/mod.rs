//! `ratemeshd envoy-ratelimit`: envoyproxy/ratelimit's configuration, environment and HTTP
//! endpoints over the daemon (see `docs/integrations/envoy-ratelimit.md`).
//!
//! # Configuration
//!
//! envoyproxy/ratelimit's YAML files (`domain`, nested `descriptors` with `key`, optional `value`
//! — `*` in a value is a wildcard —, `rate_limit { unit, requests_per_unit, unlimited, name,
//! replaces }`, `shadow_mode`, `detailed_metric`, …) are read as upstream reads them
//! (`src/config/config_impl.go`: the same key checks and, where reasonable, the same error
//! messages, `"<file>: <problem>"`), then turned into the daemon's own policies
//! ([`crate::config::PolicyConfig`]): one per descriptor with a `rate_limit`, whose Envoy path is
//! the descriptor's path from its domain, plus a policy-less path for a descriptor without a
//! `rate_limit` (which matches a request's entry and so takes it from a wildcard or a key without
//! value, as upstream). [`crate::policy::PolicyTable`] matches them, as it matches the TOML
//! file's.
//!
//! A limit of `requests_per_unit` per `unit` is a fixed window of one unit (`month` = 30 days,
//! `year` = 365 days, as upstream counts them), exact or approximate as `[[policies]]` default
//! ([`crate::config::MODE_DEFAULT`]). `unlimited` is an unlimited policy. Every file is refused
//! whole on the first problem; a set of files is applied whole or not at all.

mod answers;
mod files;
pub mod json;
pub mod settings;
mod tree;
mod yaml;

pub use files::{FILE_BYTES_MAX, FILES_BYTES_MAX, FILES_MAX, list, read_dir};
pub use settings::{Settings, SettingsError};
pub use tree::{Loaded, load};
pub use yaml::{YAML_DEPTH_MAX, YAML_NODES_MAX};

pub(crate) use answers::{deny_all, quota_mode, replaced, status_limit_name};

/// One configuration file: its name (in errors) and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigFile {
    /// The file's path relative to the configuration directory.
    pub name: String,
    /// Its contents.
    pub text: String,
}

/// A configuration file was refused: the file is at fault; nothing was applied (the running
/// configuration stays). Displayed as upstream's errors are, `"<file>: <problem>"`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct EnvoyConfigError {
    /// The file (relative to the configuration directory), or the directory itself.
    pub file: String,
    /// What is wrong with it.
    pub problem: Problem,
}

/// What is wrong with a configuration file. The messages that upstream's own tests expect are
/// upstream's words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// The file (or directory) could not be read.
    #[error("cannot read: {0}")]
    Read(String),
    /// The file is larger than [`FILE_BYTES_MAX`].
    #[error("larger than {max} bytes: refused unread")]
    TooLarge {
        /// The bound.
        max: usize,
    },
    /// More files, or more bytes in all, than [`FILES_MAX`] and [`FILES_BYTES_MAX`].
    #[error("more than {files} files or {bytes} bytes in all: refused")]
    TooMany {
        /// The bound on files.
        files: usize,
        /// The bound on bytes.
        bytes: usize,
    },
    /// Nested deeper than [`YAML_DEPTH_MAX`] mappings and lists.
    #[error("error loading config file: nested deeper than {max} levels")]
    TooDeep {
        /// The bound.
        max: usize,
    },
    /// More than [`YAML_NODES_MAX`] nodes, aliases expanded.
    #[error("error loading config file: more than {max} nodes (aliases expanded)")]
    TooManyNodes {
        /// The bound.
        max: u64,
    },
    /// Not YAML, or a field of the wrong type.
    #[error("error loading config file: {0}")]
    Yaml(String),
    /// A key that is not a string.
    #[error("config error, key is not of type string: {0}")]
    NonStringKey(String),
    /// A key upstream does not know.
    #[error("config error, unknown key '{0}'")]
    UnknownKey(String),
    /// A list whose items are not maps.
    #[error("config error, yaml file contains list of type other than map: {0}")]
    NonMapList(String),
    /// A value that is not a string, integer, boolean or null.
    #[error("error checking config ({key}: {value})")]
    BadValue {
        /// Its key.
        key: String,
        /// The value.
        value: String,
    },
    /// `requests_per_unit` is not an integer from 0 to 4294967295 (upstream's `uint32`).
    #[error("error loading config file: requests_per_unit: {0} is not an integer from 0 to 4294967295")]
    RequestsPerUnit(String),
    /// No `domain`.
    #[error("config file cannot have empty domain")]
    EmptyDomain,
    /// A domain already loaded from another file (without `MERGE_DOMAIN_CONFIG`).
    #[error("duplicate domain '{0}' in config file")]
    DuplicateDomain(String),
    /// A descriptor without `key`.
    #[error("descriptor has empty key")]
    EmptyKey,
    /// Two descriptors of the same level with the same key and value.
    #[error("duplicate descriptor composite key '{0}'")]
    DuplicateKey(String),
    /// A unit other than second, minute, hour, day, month or year (any case).
    #[error("invalid rate limit unit '{0}'")]
    InvalidUnit(String),
    /// `unlimited` with a unit.
    #[error("should not specify rate limit unit when unlimited")]
    UnlimitedWithUnit,
    /// A `replaces` entry without name.
    #[error("should not have an empty replaces entry")]
    EmptyReplaces,
    /// A limit that replaces itself.
    #[error("replaces should not contain name of same descriptor")]
    ReplacesSelf,
    /// `share_threshold` on a descriptor without wildcard.
    #[error("share_threshold can only be used with wildcard values (containing '*'), but found key '{0}'")]
    ShareThresholdWithoutWildcard(String),
    /// A descriptor path deeper than the daemon's policies may be.
    #[error("descriptor '{key}' is {depth} levels deep: at most {max} are supported")]
    DescriptorTooDeep {
        /// The descriptor's composite key.
        key: String,
        /// Its depth.
        depth: usize,
        /// The bound ([`crate::config::DESCRIPTOR_DEPTH_MAX`]).
        max: usize,
    },
    /// More descriptors than the daemon's policies may be.
    #[error("more than {0} descriptors in all")]
    TooManyDescriptors(usize),
    /// A limit the daemon cannot hold (`requests_per_unit: 0`, …).
    #[error("rate limit of '{key}': {message}")]
    Limit {
        /// The descriptor's composite key.
        key: String,
        /// Why.
        message: String,
    },
}
