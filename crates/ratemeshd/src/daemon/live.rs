//! The daemon's side of live per-key overrides (`crate::overrides`): merged from gossip and
//! republished every [`crate::overrides::SYNC_INTERVAL`], applied into the policy table, written
//! to the data directory, and set or listed by the admin API.

use std::sync::{Arc, MutexGuard};
use std::time::SystemTime;

use tracing::warn;

use super::Daemon;
use crate::config::Rule;
use crate::overrides::{LiveOverride, LiveTable, OverrideError};
use crate::policy::PolicyTable;

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
    Table(#[from] OverrideError),
}

impl Daemon {
    /// Merges the other members' live overrides and republishes this node's table, every
    /// [`crate::overrides::SYNC_INTERVAL`], until the daemon is dropped or shuts down.
    pub(super) fn spawn_override_sync(self: &Arc<Self>) {
        let daemon = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::overrides::SYNC_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(daemon) = daemon.upgrade() else { return };
                if daemon.is_shutting_down() {
                    return;
                }
                daemon.sync_overrides().await;
            }
        });
    }

    /// One round of [`Daemon::spawn_override_sync`].
    async fn sync_overrides(&self) {
        let published = self.node.shared_values(crate::overrides::GOSSIP_PREFIX).await;
        let incoming: Vec<LiveOverride> = published
            .iter()
            .filter(|(member, _)| *member != self.id())
            .flat_map(|(_, chunks)| chunks.iter().flat_map(|chunk| LiveTable::parse_chunk(chunk)))
            .collect();
        let changed = self.lock_live().0.merge(incoming);
        if changed {
            self.overrides_changed();
        }
        let chunks = {
            let live = self.lock_live();
            let chunks = live.0.chunks();
            (chunks != live.1).then_some(chunks)
        };
        if let Some(chunks) = chunks {
            match self.node.publish_shared_values(crate::overrides::GOSSIP_PREFIX, &chunks).await {
                Ok(()) => self.lock_live().1 = chunks,
                Err(error) => warn!(%error, "live overrides not published (retried next round)"),
            }
        }
    }

    pub(super) fn lock_live(&self) -> MutexGuard<'_, (LiveTable, Vec<String>)> {
        self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// After the live table changed: rebuilds the policy table and writes the data directory's
    /// file.
    fn overrides_changed(&self) {
        let _source = self.lock_source();
        let (config, _) = self.current();
        let live = self.lock_live().0.clone();
        let policies = Arc::new(PolicyTable::new(&live.apply(&config.policies)));
        {
            let mut current = self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            current.policies = policies;
        }
        if let Some(dir) = &config.node.data_dir
            && let Err(error) = live.save(dir)
        {
            warn!(%error, "live overrides not written to the data directory");
        }
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
            let message = "live overrides apply to limited policies only (not calendar or unlimited)";
            return Err(AdminError::Invalid { field: "policy".to_owned(), message: message.to_owned() });
        };
        let (limit, burst, period_ms) = values.unwrap_or_default();
        if values.is_some() {
            crate::overrides::variant_policy(base, limit, burst, period_ms).map_err(|error| {
                AdminError::Invalid {
                    field: crate::config::limit_error_field(&error).to_owned(),
                    message: crate::config::limit_error_message(&error),
                }
            })?;
        }
        let now_ms =
            SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let written = {
            let mut live = self.lock_live();
            let entry = LiveOverride {
                policy: policy.to_owned(),
                key: key.to_owned(),
                limit,
                burst,
                period_ms,
                deleted: values.is_none(),
                version_ms: live.0.next_version_ms(now_ms),
                writer: self.id().0,
            };
            live.0.put(entry.clone())?;
            entry
        };
        self.overrides_changed();
        Ok(written)
    }

    /// The live overrides of `policy`.
    pub fn overrides_of(&self, policy: &str) -> Result<Vec<LiveOverride>, AdminError> {
        let (_, table) = self.current();
        table.get(policy).ok_or_else(|| AdminError::UnknownPolicy(policy.to_owned()))?;
        Ok(self.lock_live().0.of_policy(policy).cloned().collect())
    }
}
