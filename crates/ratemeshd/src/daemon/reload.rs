//! Hot reload (see the module documentation of `crate::daemon`): a file read again and applied
//! whole if it changes only reloadable settings (`crate::config::restart_only_changes`).

use std::sync::Arc;

use tokio::sync::watch;

use super::SourceError;
use super::{Current, Daemon};
use crate::config::{Config, ConfigError, RELOADABLE, restart_only_changes};
use crate::envoy_ratelimit::EnvoyConfigError;
use crate::policy::PolicyTable;

/// Why a reload was not applied. The running configuration stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The daemon was started without a file (the embedded default): nothing to reload from.
    #[error("no configuration file to reload (started on the embedded default)")]
    NoFile,
    /// The file is invalid; the error names the line and the field.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// A YAML file of `ratemeshd envoy-ratelimit` is invalid; the error names the file.
    #[error(transparent)]
    EnvoyRatelimit(#[from] EnvoyConfigError),
    /// The file changes settings that only a restart applies.
    #[error("not applied: {} can only change with a restart (reloadable: {})", fields.join(", "), *RELOADABLE)]
    RestartRequired {
        /// The fields that changed.
        fields: Vec<&'static str>,
    },
}

impl From<SourceError> for ReloadError {
    fn from(error: SourceError) -> ReloadError {
        match error {
            SourceError::Config(error) => ReloadError::Invalid(error),
            SourceError::EnvoyRatelimit(error) => ReloadError::EnvoyRatelimit(error),
        }
    }
}

/// What a reload did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// The new configuration is in force.
    Applied,
    /// The file's configuration equals the running one.
    Unchanged,
}

impl Daemon {
    /// A counter of reload attempts (applied or not): wait on it to see that a reload happened.
    pub fn subscribe_reloads(&self) -> watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// Reads the configuration file again and applies it (as [`Daemon::apply`]), holding the
    /// reload lock from the read to the swap. Errors are logged by the caller; the running
    /// configuration stays.
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        let mut source = self.lock_source();
        let result = match source.as_mut() {
            None => Err(ReloadError::NoFile),
            Some(source) => {
                source.load().map_err(ReloadError::from).and_then(|config| self.apply_locked(config))
            }
        };
        self.count_reload(&result);
        result
    }

    /// Applies a validated configuration if it changes only reloadable settings (see the module
    /// documentation); otherwise refuses it and keeps the running one.
    pub fn apply(&self, config: Config) -> Result<Reloaded, ReloadError> {
        let _source = self.lock_source();
        let result = self.apply_locked(config);
        self.count_reload(&result);
        result
    }

    /// Counts a reload attempt in metrics and for [`Daemon::subscribe_reloads`].
    fn count_reload(&self, result: &Result<Reloaded, ReloadError>) {
        let label = match result {
            Ok(Reloaded::Applied) => "applied",
            Ok(Reloaded::Unchanged) => "unchanged",
            Err(_) => "refused",
        };
        self.metrics.record_reload(label);
        self.reloads.send_modify(|count| *count = count.wrapping_add(1));
    }

    /// [`Daemon::apply`]; the caller holds the reload lock.
    fn apply_locked(&self, config: Config) -> Result<Reloaded, ReloadError> {
        let (running, running_policies) = self.current();
        if *running == config {
            return Ok(Reloaded::Unchanged);
        }
        let fields = restart_only_changes(&running, &config);
        if !fields.is_empty() {
            return Err(ReloadError::RestartRequired { fields });
        }
        let policies = Arc::new(PolicyTable::new(&crate::overrides::apply(&self.live, &config.policies)));
        let removed: Vec<&str> = running_policies
            .iter()
            .map(|entry| entry.name.as_str())
            .filter(|name| policies.get(name).is_none())
            .collect();
        let level = config.log.level;
        {
            let mut current = self.current.write();
            *current = Current { config: Arc::new(config), policies: Arc::clone(&policies) };
        }
        self.metrics.set_policies(policies);
        self.metrics.forget_policies(removed);
        self.log_level.send_if_modified(|current| std::mem::replace(current, level) != level);
        Ok(Reloaded::Applied)
    }
}
