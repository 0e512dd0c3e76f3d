//! Live per-key overrides: `PUT`/`DELETE /v1/overrides/{policy}/{key}` on any node, applied by
//! every node within a few gossip rounds, kept across restarts.
//!
//! Every node keeps the same small table (at most [`LIVE_OVERRIDES_MAX`] entries, deletions
//! included) and publishes all of it in its sealed gossip state ([`ratemesh::Node::publish_shared_values`],
//! chunks of JSON under [`GOSSIP_PREFIX`]); every [`SYNC_INTERVAL`] it merges what the others
//! publish. An entry's version is `(unix milliseconds, writer node)`, the newer wins (last writer
//! wins; a deletion is an entry too, so that an older value cannot come back from a member that
//! missed it). Because every node republishes the whole table, a restarted node learns it again
//! from the others; with a data directory it is also written to `overrides.json` there and read
//! back at start. A live override wins over the policy file's for the same key; like those, it
//! counts in buckets of its own limit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ratemesh::{SHARED_VALUE_BYTES_MAX, SHARED_VALUES_MAX};
use ratemesh_core::{Limit, LimitError, LimitSpec, Policy};
use serde::{Deserialize, Serialize};

use crate::config::{PolicyConfig, Rule};

/// The most live overrides (deletions included) of the whole cluster.
pub const LIVE_OVERRIDES_MAX: usize = 32;
/// The longest key of a live override, in bytes.
pub const OVERRIDE_KEY_BYTES_MAX: usize = 128;
/// The longest entry as gossip carries it (JSON), in bytes: two fit a chunk, so the whole table
/// fits the [`SHARED_VALUES_MAX`] chunks a node publishes.
pub const ENTRY_BYTES_MAX: usize = (SHARED_VALUE_BYTES_MAX - 3) / 2;
/// The gossip keys' prefix.
pub const GOSSIP_PREFIX: &str = "app.ratemeshd.overrides.";
/// How often a node merges the others' tables and republishes its own.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(200);
/// The file in the data directory.
pub const FILE_NAME: &str = "overrides.json";

/// One live override, or its deletion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveOverride {
    /// The policy.
    pub policy: String,
    /// The client's key.
    pub key: String,
    /// Hits per period (default: the policy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Burst (default: the policy's without `limit`, else the algorithm's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// The period in milliseconds (default: the policy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_ms: Option<u64>,
    /// A deletion: the key is back under its policy's limit (or its file override).
    #[serde(default)]
    pub deleted: bool,
    /// When it was written, in Unix milliseconds (at least one above every version known then).
    pub version_ms: u64,
    /// The node it was written on (breaks ties between versions).
    pub writer: u64,
}

impl LiveOverride {
    fn version(&self) -> (u64, u64) {
        (self.version_ms, self.writer)
    }

    /// Whether it could be an entry this build wrote (what comes from gossip is checked).
    pub fn plausible(&self) -> bool {
        !self.policy.is_empty()
            && self.policy.len() <= crate::config::NAME_BYTES_MAX
            && !self.key.is_empty()
            && self.key.len() <= OVERRIDE_KEY_BYTES_MAX
            && serde_json::to_string(self).is_ok_and(|text| text.len() <= ENTRY_BYTES_MAX)
    }
}

/// The limit `entry` gives a key of `base`'s policy.
pub fn variant_policy(
    base: &Policy,
    limit: Option<u64>,
    burst: Option<u64>,
    period_ms: Option<u64>,
) -> Result<Policy, LimitError> {
    let spec = base.limit.spec();
    let burst = match (burst, limit) {
        (Some(burst), _) => Some(burst),
        (None, Some(_)) => None,
        (None, None) => spec.burst,
    };
    let variant = LimitSpec {
        limit: limit.unwrap_or(spec.limit),
        burst,
        period: period_ms.map_or(spec.period, Duration::from_millis),
        ..spec.clone()
    };
    Ok(Policy { limit: Limit::new(variant)?, ..base.clone() })
}

/// Why a live override was not written. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    /// The table is full.
    #[error("the cluster holds {LIVE_OVERRIDES_MAX} live overrides (deletions included) already")]
    Full,
    /// The policy's name and the key together are too long for gossip.
    #[error(
        "policy name and key are too long for a live override (at most {ENTRY_BYTES_MAX} bytes of JSON, keys at most {OVERRIDE_KEY_BYTES_MAX} bytes)"
    )]
    TooLong,
}

/// The table of live overrides, by `(policy, key)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveTable {
    entries: BTreeMap<(String, String), LiveOverride>,
}

impl LiveTable {
    /// The version a new entry written now (`now_ms`) gets: above every one known.
    pub fn next_version_ms(&self, now_ms: u64) -> u64 {
        let newest = self.entries.values().map(|e| e.version_ms).max().unwrap_or(0);
        now_ms.max(newest.saturating_add(1))
    }

    /// Writes `entry` (a local change).
    pub fn put(&mut self, entry: LiveOverride) -> Result<(), OverrideError> {
        if !entry.plausible() {
            return Err(OverrideError::TooLong);
        }
        match self.admit(entry) {
            true => Ok(()),
            false => Err(OverrideError::Full),
        }
    }

    /// Merges entries from elsewhere; whether anything changed.
    pub fn merge(&mut self, incoming: impl IntoIterator<Item = LiveOverride>) -> bool {
        let mut changed = false;
        for entry in incoming.into_iter().filter(LiveOverride::plausible) {
            let slot = (entry.policy.clone(), entry.key.clone());
            let newer = self.entries.get(&slot).is_none_or(|known| entry.version() > known.version());
            if newer {
                changed |= self.admit(entry);
            }
        }
        changed
    }

    /// Takes `entry` if it is newer than what the table has for its key and there is room (the
    /// oldest deletion makes room when the table is full).
    fn admit(&mut self, entry: LiveOverride) -> bool {
        let slot = (entry.policy.clone(), entry.key.clone());
        if let Some(known) = self.entries.get(&slot)
            && entry.version() <= known.version()
        {
            return known == &entry;
        }
        if !self.entries.contains_key(&slot) && self.entries.len() >= LIVE_OVERRIDES_MAX {
            let oldest_deletion = self
                .entries
                .iter()
                .filter(|(_, e)| e.deleted)
                .min_by_key(|(_, e)| e.version())
                .map(|(k, _)| k.clone());
            match oldest_deletion {
                Some(oldest) => {
                    self.entries.remove(&oldest);
                }
                None => return false,
            }
        }
        self.entries.insert(slot, entry);
        true
    }

    /// The live (not deleted) overrides of `policy`, by key.
    pub fn of_policy<'a>(&'a self, policy: &'a str) -> impl Iterator<Item = &'a LiveOverride> + 'a {
        self.entries.values().filter(move |e| e.policy == policy && !e.deleted)
    }

    /// The table as gossip chunks: JSON arrays of at most [`SHARED_VALUE_BYTES_MAX`] bytes.
    pub fn chunks(&self) -> Vec<String> {
        let mut chunks = Vec::new();
        let mut current: Vec<String> = Vec::new();
        let mut len = 2;
        for entry in self.entries.values() {
            let Ok(text) = serde_json::to_string(entry) else { continue };
            if len + text.len() + 1 > SHARED_VALUE_BYTES_MAX && !current.is_empty() {
                chunks.push(format!("[{}]", current.join(",")));
                current.clear();
                len = 2;
            }
            len += text.len() + 1;
            current.push(text);
        }
        if !current.is_empty() {
            chunks.push(format!("[{}]", current.join(",")));
        }
        chunks.truncate(SHARED_VALUES_MAX);
        chunks
    }

    /// The entries of a chunk from gossip (malformed ones are ignored: a member of another
    /// version, or an insider's garbage, changes nothing).
    pub fn parse_chunk(chunk: &str) -> Vec<LiveOverride> {
        serde_json::from_str::<Vec<LiveOverride>>(chunk).unwrap_or_default()
    }

    /// `policies` with the live overrides in their `overrides` (over the file's for the same
    /// key). Overrides of unknown or not limited policies, or whose limit no longer validates
    /// (the policy changed), are left out.
    pub fn apply(&self, policies: &[PolicyConfig]) -> Vec<PolicyConfig> {
        let mut policies = policies.to_vec();
        for policy in &mut policies {
            let Rule::Limited(base) = &policy.rule else { continue };
            let base = Arc::clone(base);
            for entry in self.of_policy(&policy.name) {
                if let Ok(variant) = variant_policy(&base, entry.limit, entry.burst, entry.period_ms) {
                    policy.overrides.insert(entry.key.clone(), Arc::new(variant));
                }
            }
        }
        policies
    }

    /// Reads `dir`'s file (absent: empty; unreadable or malformed: an error to log).
    pub fn load(dir: &Path) -> Result<LiveTable, String> {
        let path = dir.join(FILE_NAME);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LiveTable::default()),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let entries: Vec<LiveOverride> =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut table = LiveTable::default();
        table.merge(entries);
        Ok(table)
    }

    /// Writes the table to `dir`'s file (a temporary file renamed over it).
    pub fn save(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let path = dir.join(FILE_NAME);
        let temp = dir.join(format!("{FILE_NAME}.tmp"));
        let entries: Vec<&LiveOverride> = self.entries.values().collect();
        let text = serde_json::to_vec_pretty(&entries).map_err(std::io::Error::other)?;
        std::fs::create_dir_all(dir)?;
        std::fs::write(&temp, text)?;
        std::fs::rename(&temp, &path)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, version_ms: u64, writer: u64, deleted: bool) -> LiveOverride {
        LiveOverride {
            policy: "api".to_owned(),
            key: key.to_owned(),
            limit: Some(7),
            burst: None,
            period_ms: None,
            deleted,
            version_ms,
            writer,
        }
    }

    #[test]
    fn the_newest_version_wins_in_any_order_and_deletions_stay() {
        let (old, new, gone) = (entry("k", 1, 1, false), entry("k", 2, 1, false), entry("k", 3, 2, true));
        let mut forward = LiveTable::default();
        assert!(forward.merge([old.clone(), new.clone(), gone.clone()]));
        let mut backward = LiveTable::default();
        backward.merge([gone, new, old]);
        assert_eq!(forward, backward);
        assert_eq!(forward.of_policy("api").count(), 0, "deleted");
        assert!(!forward.clone().merge([entry("k", 2, 9, false)]), "an older write does not come back");
    }

    #[test]
    fn the_table_is_bounded_and_deletions_make_room() {
        let mut table = LiveTable::default();
        for i in 0..LIVE_OVERRIDES_MAX as u64 {
            table.put(entry(&format!("k{i}"), i + 1, 1, i == 0)).expect("room");
        }
        table.put(entry("new", 100, 1, false)).expect("the oldest deletion makes room");
        assert!(matches!(table.put(entry("more", 101, 1, false)), Err(OverrideError::Full)));
        assert_eq!(table.entries.len(), LIVE_OVERRIDES_MAX);
    }

    #[test]
    fn chunks_fit_gossip_and_round_trip() {
        let mut table = LiveTable::default();
        for i in 0..LIVE_OVERRIDES_MAX as u64 {
            let mut e = entry(&format!("{i:03}"), u64::MAX - 100 + i, u64::MAX, false);
            (e.limit, e.burst, e.period_ms) = (Some(u64::MAX), Some(u64::MAX), Some(u64::MAX));
            let room = ENTRY_BYTES_MAX - serde_json::to_string(&e).expect("json").len();
            e.key.push_str(&"k".repeat(room.min(OVERRIDE_KEY_BYTES_MAX - 3)));
            e.policy.push_str(&"p".repeat(room.saturating_sub(OVERRIDE_KEY_BYTES_MAX - 3)));
            assert!(e.plausible(), "{}", serde_json::to_string(&e).expect("json").len());
            table.put(e).expect("room");
        }
        let chunks = table.chunks();
        assert!(
            chunks.len() <= SHARED_VALUES_MAX && chunks.iter().all(|c| c.len() <= SHARED_VALUE_BYTES_MAX)
        );
        let mut back = LiveTable::default();
        back.merge(chunks.iter().flat_map(|c| LiveTable::parse_chunk(c)));
        assert_eq!(back, table);
        assert!(LiveTable::parse_chunk("{not json").is_empty());
    }
}
