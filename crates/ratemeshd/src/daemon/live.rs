//! The daemon's side of live per-key overrides: the library's [`ratemesh::overrides`] table
//! (merged from gossip, published, written to the data directory) applied into the policy table,
//! and set or listed by the admin API.

use std::sync::Arc;

use ratemesh::{NamedPolicy, OverrideLimit};

use super::Daemon;
use crate::config::Rule;
use crate::overrides::{LiveOverride, OverrideError};
use crate::policy::PolicyTable;

/// Why an override of a calendar or unlimited policy is refused.
const LIMITED_ONLY: &str = "live overrides apply to limited policies only (not calendar or unlimited)";

/// Why a live override was not written or listed. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No such policy (404).
    #[error("policy: no policy named {0:?}")]
    UnknownPolicy(String),
    /// The policy is not a plain limit (calendar or unlimited), or the override's values do not
    /// make a valid limit under it (400, naming the field).
    #[error("{field}: {message}")]
    Invalid {
        /// The field at fault.
        field: String,
        /// Why.
        message: String,
    },
    /// The table is full, or the entry too long (409 / 400).
    #[error(transparent)]
    Table(OverrideError),
}

impl From<OverrideError> for AdminError {
    fn from(error: OverrideError) -> Self {
        match error {
            OverrideError::Limit(error) => AdminError::Invalid {
                field: crate::config::limit_error_field(&error).to_owned(),
                message: crate::config::limit_error_message(&error),
            },
            OverrideError::Calendar => {
                AdminError::Invalid { field: "policy".to_owned(), message: LIMITED_ONLY.to_owned() }
            }
            other => AdminError::Table(other),
        }
    }
}

impl Daemon {
    /// Rebuilds the policy table whenever the live overrides change (merged from gossip), until
    /// the daemon is dropped or shuts down.
    pub(super) fn spawn_override_watch(self: &Arc<Self>) {
        let daemon = Arc::downgrade(self);
        let mut changes = self.live.subscribe();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let Some(daemon) = daemon.upgrade() else { return };
                if daemon.is_shutting_down() {
                    return;
                }
                daemon.overrides_changed();
            }
        });
    }

    /// After the live table changed: rebuilds the policy table (the library wrote the data
    /// directory's file).
    fn overrides_changed(&self) {
        let _source = self.lock_source();
        let (config, _) = self.current();
        let policies = Arc::new(PolicyTable::new(&crate::overrides::apply(&self.live, &config.policies)));
        let mut current = self.current.write();
        current.policies = policies;
    }

    /// Sets (`Some`: limit, burst, period in ms) or deletes (`None`) the live override of `key`
    /// under `policy`, on every node within a few gossip rounds.
    pub fn set_override(
        &self,
        policy: &str,
        key: &str,
        values: Option<(Option<u64>, Option<u64>, Option<u64>)>,
    ) -> Result<LiveOverride, AdminError> {
        let (config, table) = self.current();
        if table.get(policy).is_none() {
            return Err(AdminError::UnknownPolicy(policy.to_owned()));
        }
        let file_entry = config.policies.iter().find(|p| p.name == policy);
        let Some(Rule::Limited(base)) = file_entry.map(|p| &p.rule) else {
            return Err(AdminError::Invalid { field: "policy".to_owned(), message: LIMITED_ONLY.to_owned() });
        };
        let written = match values {
            Some((limit, burst, period_ms)) => {
                let named = NamedPolicy::new(policy, base.as_ref().clone());
                self.live.set(&named, key, OverrideLimit { limit, burst, period_ms })?
            }
            None => self.live.remove(policy, key)?,
        };
        self.overrides_changed();
        Ok(written)
    }

    /// The live overrides of `policy`.
    pub fn overrides_of(&self, policy: &str) -> Result<Vec<LiveOverride>, AdminError> {
        let (_, table) = self.current();
        table.get(policy).ok_or_else(|| AdminError::UnknownPolicy(policy.to_owned()))?;
        Ok(self.live.list(policy))
    }
}
