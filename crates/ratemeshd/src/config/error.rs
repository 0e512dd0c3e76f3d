//! Why a configuration was refused, and where the refused value came from.

use std::fmt;
use std::path::PathBuf;

use ratemesh_core::{LimitError, LimitParameter};

#[cfg(doc)]
use super::CONFIG_FILE_BYTES_MAX;
use super::env_variable_names;

/// Where a refused value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A position in a configuration text, both 1-based; the column counts characters.
    File {
        /// The file's name, or what the text was called by the caller.
        origin: String,
        /// Line.
        line: usize,
        /// Column.
        column: usize,
    },
    /// An environment variable.
    Env {
        /// The variable's name.
        variable: String,
    },
    /// The configuration as a whole (a rule about values that all took their defaults).
    Whole {
        /// The file's name, or what the text was called by the caller.
        origin: String,
    },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File { origin, line, column } => write!(f, "{origin}:{line}:{column}"),
            Location::Env { variable } => write!(f, "environment variable {variable}"),
            Location::Whole { origin } => f.write_str(origin),
        }
    }
}

/// Why a configuration was refused. The operator's input is at fault; nothing was applied.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The text is larger than [`CONFIG_FILE_BYTES_MAX`].
    #[error("{origin}: larger than {max_bytes} bytes")]
    TooLarge {
        /// The file's name, or what the text was called.
        origin: String,
        /// The bound.
        max_bytes: usize,
    },
    /// The text is not valid TOML (no field can be named yet).
    #[error("{location}: invalid TOML: {message}")]
    Syntax {
        /// Where.
        location: Location,
        /// What is wrong.
        message: String,
    },
    /// A field has a wrong type or value, is unknown, missing, or conflicts with another.
    #[error("{location}: {field}: {message}")]
    Invalid {
        /// Where the value came from.
        location: Location,
        /// The field, as a path: `listen.http`, `policies[2].limit`,
        /// `policies[0].descriptors[1].value`. Errors found while reading TOML types name the
        /// path without array indices (`policies.limit`); the location has the line.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// An environment variable starts with [`ENV_PREFIX`](super::ENV_PREFIX) but overrides no field.
    #[error("environment variable {variable}: unknown (known: {})", env_variable_names().collect::<Vec<_>>().join(", "))]
    UnknownVariable {
        /// The variable's name.
        variable: String,
    },
}

impl ConfigError {
    /// The field the error names, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }

    /// Where the error is, if it has a place.
    pub fn location(&self) -> Option<&Location> {
        match self {
            ConfigError::Invalid { location, .. } | ConfigError::Syntax { location, .. } => Some(location),
            _ => None,
        }
    }

    /// The line in the file, if the error is at one.
    pub fn line(&self) -> Option<usize> {
        match self.location() {
            Some(Location::File { line, .. }) => Some(*line),
            _ => None,
        }
    }
}
/// The user-facing field a [`LimitError`] is about (`limit`, `period_ms`, `burst` or `delay`), so
/// that the error can name it; the checks themselves stay in `Limit::new`.
pub(crate) fn limit_error_field(error: &LimitError) -> &'static str {
    match error.parameter() {
        LimitParameter::Limit => "limit",
        LimitParameter::Period => "period_ms",
        LimitParameter::Burst => "burst",
        LimitParameter::Delay => "delay",
        LimitParameter::Window => "window",
    }
}

/// A [`LimitError`] in the units users write: the core counts periods in nanoseconds, the
/// configuration and the API in milliseconds (`period_ms`).
pub(crate) fn limit_error_message(error: &LimitError) -> String {
    const NANOS_PER_MS: u64 = 1_000_000;
    match error {
        LimitError::TooLarge { parameter: LimitParameter::Period, max } => {
            format!("period_ms is too large (at most {} ms, 100 years)", max / NANOS_PER_MS)
        }
        LimitError::RateTooHigh { limit, period_nanos } => {
            let period_ms = period_nanos / NANOS_PER_MS;
            format!(
                "{limit} per {period_ms} ms is above one hit per nanosecond: at most {} per {period_ms} ms",
                period_nanos
            )
        }
        other => other.to_string(),
    }
}
