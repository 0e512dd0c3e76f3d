//! Live per-key overrides: a key's limit changed at run time, on any node, for the whole cluster.
//!
//! Every node keeps the same small table (at most [`LIVE_OVERRIDES_MAX`] entries, deletions
//! included) and publishes all of it in its sealed gossip state ([`Node::publish_shared_values`],
//! chunks of JSON under [`GOSSIP_PREFIX`]); every [`SYNC_INTERVAL`] it merges what the members
//! publish ([`Node::shared_values`]). An entry's version is `(Unix milliseconds, writer node)` and
//! the newer wins (last writer wins; a deletion is an entry too, so that an older value cannot
//! come back from a member that missed it). Because every node republishes the whole table, a
//! restarted node learns it again from the others; with a data directory it is also written to
//! [`FILE_NAME`] there and read back at start.
//!
//! **Delay.** A write is published by its node at once (its sync round is woken), reaches every
//! member within a few gossip rounds (chitchat gossips with three members a round), and is merged
//! there within [`SYNC_INTERVAL`]: measured on loopback with 100 ms gossip, under 0.4 s for three
//! nodes. Until then a member checks the key under the limit it knew.
//!
//! **Semantics** (the daemon's, which runs on this module): an override replaces the `limit`,
//! `burst` and `period` of the policy a check names, for one key, under the policy's algorithm,
//! mode and fallback ([`OverrideLimit`]). It counts in buckets of its own limit: a key moved to an
//! override starts afresh there, and two overrides of equal limits share buckets. A policy whose
//! limit is calendar-aligned takes no overrides (its window is computed per check); an override
//! that does not validate under the policy a check names (the policy changed) is not applied.
//!
//! ```
//! use std::time::Duration;
//! use ratemesh::{ClusterSecurity, NamedPolicy, NodeBuilder, NodeId, OverrideLimit};
//! use ratemesh_core::{Algorithm, Limit, LimitSpec, Mode, Policy};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let security = ClusterSecurity::from_secret("an example secret, shared by every node")?;
//! let node = NodeBuilder::new(NodeId(1)).security(security).start().await?;
//! let overrides = node.start_live_overrides(None); // or Some(data directory)
//!
//! let limit = Limit::new(LimitSpec::new(Algorithm::TokenBucket, 100, Duration::from_secs(60)))?;
//! let api = NamedPolicy::new("api", Policy::new(limit, Mode::Exact));
//! overrides.set(&api, "customer:acme", OverrideLimit { limit: Some(1000), ..OverrideLimit::default() })?;
//!
//! // Every check resolves its policy first: the key's override, else the policy itself.
//! let decision = node.check(&overrides.resolve(&api, b"customer:acme"), b"customer:acme", 1).await?;
//! assert_eq!(decision.limit, 1000);
//! let decision = node.check(&overrides.resolve(&api, b"customer:42"), b"customer:42", 1).await?;
//! assert_eq!(decision.limit, 100);
//!
//! overrides.remove("api", "customer:acme")?;
//! assert!(overrides.list("api").is_empty());
//! node.shutdown().await;
//! # Ok(())
//! # }
//! ```

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use ratemesh_core::{Limit, LimitError, LimitSpec, Policy};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};
use tracing::warn;

use crate::node::{NamedPolicy, Node, SHARED_VALUE_BYTES_MAX, SHARED_VALUES_MAX};
use crate::sync::{Mutex, RwLock};

/// The most live overrides (deletions included) of the whole cluster.
pub const LIVE_OVERRIDES_MAX: usize = 32;
/// The longest key of a live override, in bytes.
pub const OVERRIDE_KEY_BYTES_MAX: usize = 128;
/// The longest policy name of a live override, in bytes.
pub const POLICY_NAME_BYTES_MAX: usize = 255;
/// The longest entry as gossip carries it (JSON), in bytes: two fit a chunk, so the whole table
/// fits the [`SHARED_VALUES_MAX`] chunks a node publishes.
pub const ENTRY_BYTES_MAX: usize = (SHARED_VALUE_BYTES_MAX - 3) / 2;
/// The gossip keys' prefix (`…0` to `…15`). The name predates the library: kept so that daemons
/// and embedded nodes of one cluster share one table.
pub const GOSSIP_PREFIX: &str = "app.ratemeshd.overrides.";
/// How often a node merges the members' tables and republishes its own.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(200);
/// The file in the data directory: a JSON array of [`LiveOverride`]s, deletions included.
pub const FILE_NAME: &str = "overrides.json";
/// The largest file read back at start (the table's bound written pretty is far below it).
const FILE_BYTES_MAX: u64 = 64 * 1024;

/// The limit of an override: each value replaces the policy's, under the policy's algorithm,
/// mode and fallback.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OverrideLimit {
    /// Hits per period (default: the policy's).
    pub limit: Option<u64>,
    /// Burst (default: the policy's when `limit` is not given either, else the algorithm's
    /// default for the new limit).
    pub burst: Option<u64>,
    /// The period in milliseconds (default: the policy's).
    pub period_ms: Option<u64>,
}

impl OverrideLimit {
    /// The policy a key of `base` is checked under with this override.
    pub fn variant(&self, base: &Policy) -> Result<Policy, LimitError> {
        let spec = base.limit.spec();
        let burst = match (self.burst, self.limit) {
            (Some(burst), _) => Some(burst),
            (None, Some(_)) => None,
            (None, None) => spec.burst,
        };
        let variant = LimitSpec {
            limit: self.limit.unwrap_or(spec.limit),
            burst,
            period: self.period_ms.map_or(spec.period, Duration::from_millis),
            ..spec.clone()
        };
        Ok(Policy { limit: Limit::new(variant)?, ..base.clone() })
    }
}

/// One live override, or its deletion, as gossip and the data directory's file carry it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveOverride {
    /// The policy's name.
    pub policy: String,
    /// The client's key.
    pub key: String,
    /// Hits per period (default: the policy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Burst (see [`OverrideLimit::burst`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// The period in milliseconds (default: the policy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_ms: Option<u64>,
    /// A deletion: the key is back under its policy's limit.
    #[serde(default)]
    pub deleted: bool,
    /// When it was written, in Unix milliseconds (at least one above every version known then).
    pub version_ms: u64,
    /// The node it was written on (breaks ties between versions).
    pub writer: u64,
}

impl LiveOverride {
    /// The override's limit.
    pub fn override_limit(&self) -> OverrideLimit {
        OverrideLimit { limit: self.limit, burst: self.burst, period_ms: self.period_ms }
    }

    fn version(&self) -> (u64, u64) {
        (self.version_ms, self.writer)
    }

    /// Why this entry cannot be written or carried: its names or its gossip form too long.
    fn bound_error(&self) -> Option<OverrideError> {
        let key_len = self.key.len();
        if key_len == 0 || key_len > OVERRIDE_KEY_BYTES_MAX {
            return Some(OverrideError::Key { len: key_len });
        }
        let policy_len = self.policy.len();
        if policy_len == 0 || policy_len > POLICY_NAME_BYTES_MAX {
            return Some(OverrideError::PolicyName { len: policy_len });
        }
        let len = serde_json::to_string(self).map_or(usize::MAX, |text| text.len());
        (len > ENTRY_BYTES_MAX).then_some(OverrideError::TooLong { len })
    }
}

/// Why a live override was not written. Caused by the caller's input or by the table's bound;
/// nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OverrideError {
    /// The cluster's table is full and holds no deletion to make room with.
    #[error("the cluster holds {LIVE_OVERRIDES_MAX} live overrides (deletions included) already")]
    Full,
    /// The key is empty or longer than [`OVERRIDE_KEY_BYTES_MAX`].
    #[error("a key of {len} bytes: live overrides take keys of 1 to {OVERRIDE_KEY_BYTES_MAX} bytes")]
    Key {
        /// The key's length in bytes.
        len: usize,
    },
    /// The policy's name is empty or longer than [`POLICY_NAME_BYTES_MAX`].
    #[error("a policy name of {len} bytes: live overrides take names of 1 to {POLICY_NAME_BYTES_MAX} bytes")]
    PolicyName {
        /// The name's length in bytes.
        len: usize,
    },
    /// The entry is too long for gossip (policy name and key together).
    #[error(
        "a live override of {len} bytes of JSON, at most {ENTRY_BYTES_MAX}: shorten the key or the policy name"
    )]
    TooLong {
        /// The entry's length as JSON.
        len: usize,
    },
    /// The policy's limit is calendar-aligned: its window is computed per check, so it takes no
    /// overrides.
    #[error("calendar-aligned policies take no live overrides")]
    Calendar,
    /// The override's values do not make a valid limit under the policy.
    #[error(transparent)]
    Limit(#[from] LimitError),
}

/// The table of live overrides, by `(policy, key)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct LiveTable {
    entries: BTreeMap<(String, String), LiveOverride>,
}

impl LiveTable {
    /// The version a new entry written now (`now_ms`) gets: above every one known.
    fn next_version_ms(&self, now_ms: u64) -> u64 {
        let newest = self.entries.values().map(|e| e.version_ms).max().unwrap_or(0);
        now_ms.max(newest.saturating_add(1))
    }

    /// Writes `entry` (a local change).
    fn put(&mut self, entry: LiveOverride) -> Result<(), OverrideError> {
        if let Some(error) = entry.bound_error() {
            return Err(error);
        }
        match self.admit(entry) {
            true => Ok(()),
            false => Err(OverrideError::Full),
        }
    }

    /// Merges entries from elsewhere (gossip, the file); whether anything changed. Entries out
    /// of bounds (a member of another version, an insider's garbage) are ignored.
    fn merge(&mut self, incoming: impl IntoIterator<Item = LiveOverride>) -> bool {
        let mut changed = false;
        for entry in incoming.into_iter().filter(|e| e.bound_error().is_none()) {
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
    fn of_policy<'a>(&'a self, policy: &'a str) -> impl Iterator<Item = &'a LiveOverride> + 'a {
        self.entries.values().filter(move |e| e.policy == policy && !e.deleted)
    }

    /// The live overrides by policy and key, for checks.
    fn index(&self) -> Index {
        let mut index = Index::new();
        for entry in self.entries.values().filter(|e| !e.deleted) {
            let keys = index.entry(entry.policy.clone()).or_default();
            keys.insert(entry.key.as_bytes().into(), entry.override_limit());
        }
        index
    }

    /// The table as gossip chunks: JSON arrays of at most [`SHARED_VALUE_BYTES_MAX`] bytes (every
    /// entry is at most [`ENTRY_BYTES_MAX`], so the table fits [`SHARED_VALUES_MAX`] chunks).
    fn chunks(&self) -> Vec<String> {
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

    /// The entries of a chunk from gossip (a malformed chunk has none: a member of another
    /// version, or an insider's garbage, changes nothing).
    fn parse_chunk(chunk: &str) -> Vec<LiveOverride> {
        serde_json::from_str::<Vec<LiveOverride>>(chunk).unwrap_or_default()
    }

    /// Reads `dir`'s file (absent: empty).
    fn load(dir: &Path) -> std::io::Result<LiveTable> {
        let path = dir.join(FILE_NAME);
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LiveTable::default()),
            Err(e) => return Err(e),
        };
        if file.metadata()?.len() > FILE_BYTES_MAX {
            return Err(std::io::Error::other(format!("longer than {FILE_BYTES_MAX} bytes")));
        }
        let entries: Vec<LiveOverride> = serde_json::from_reader(std::io::BufReader::new(file))?;
        let mut table = LiveTable::default();
        table.merge(entries);
        Ok(table)
    }

    /// Writes the table to `dir`'s file: a temporary file, flushed to disk, renamed over it.
    fn save(&self, dir: &Path) -> std::io::Result<()> {
        let path = dir.join(FILE_NAME);
        let temp = dir.join(format!("{FILE_NAME}.tmp"));
        let entries: Vec<&LiveOverride> = self.entries.values().collect();
        let text = serde_json::to_vec_pretty(&entries).map_err(std::io::Error::other)?;
        std::fs::create_dir_all(dir)?;
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(&text)?;
        file.sync_all()?;
        std::fs::rename(&temp, &path)
    }
}

/// Live overrides by policy name and key.
type Index = HashMap<String, HashMap<Box<[u8]>, OverrideLimit>>;

/// The live overrides of a node: the cluster's table as this node knows it, merged from gossip
/// and republished every [`SYNC_INTERVAL`] by a task of the node. Cheap to clone; every clone is
/// the same table. Start it once per node ([`Node::start_live_overrides`]); it runs until the node
/// stops or the last handle is dropped.
#[derive(Clone)]
pub struct LiveOverrides {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LiveOverrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveOverrides")
            .field("node", &self.inner.node.id())
            .field("data_dir", &self.inner.data_dir)
            .finish()
    }
}

struct Inner {
    node: Node,
    /// The table (the index is rebuilt under this lock, so it never goes back in time).
    table: Mutex<LiveTable>,
    /// What checks read: the live entries by policy and key.
    index: RwLock<Index>,
    data_dir: Option<PathBuf>,
    /// Held while the file is written, so that an older table is never written over a newer.
    saving: Mutex<()>,
    /// Counts changes of the table (local writes and merges).
    changes: watch::Sender<u64>,
    /// Runs a sync round now (after a local write: publish at once). Shared with the sync task,
    /// which holds no strong handle while it waits.
    wake: Arc<Notify>,
}

impl Node {
    /// Starts this node's live overrides: reads the table back from `data_dir`'s [`FILE_NAME`]
    /// (a file that cannot be read is logged and ignored: gossip brings the table again), then
    /// merges and publishes it every [`SYNC_INTERVAL`] until the node stops. Call it once per
    /// node and keep the handle.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it spawns the sync task).
    pub fn start_live_overrides(&self, data_dir: Option<&Path>) -> LiveOverrides {
        let table = data_dir.map_or_else(LiveTable::default, |dir| {
            LiveTable::load(dir).unwrap_or_else(|error| {
                let path = dir.join(FILE_NAME);
                warn!(%error, path = %path.display(), "live overrides not read back: starting without them (gossip brings them again)");
                LiveTable::default()
            })
        });
        let inner = Arc::new(Inner {
            node: self.clone(),
            index: RwLock::new(table.index()),
            table: Mutex::new(table),
            data_dir: data_dir.map(Path::to_path_buf),
            saving: Mutex::new(()),
            changes: watch::channel(0).0,
            wake: Arc::new(Notify::new()),
        });
        tokio::spawn(sync(Arc::downgrade(&inner), Arc::clone(&inner.wake), self.subscribe_members()));
        LiveOverrides { inner }
    }
}

/// Runs [`Inner::sync_round`] every [`SYNC_INTERVAL`] and when woken, until the node stops (its
/// members channel closes) or every handle is dropped.
async fn sync(inner: Weak<Inner>, wake: Arc<Notify>, members: watch::Receiver<Vec<crate::Member>>) {
    let mut tick = tokio::time::interval(SYNC_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut published = Vec::new();
    loop {
        // A wake-up during a round is kept as a permit: the next wait returns at once.
        tokio::select! {
            _ = tick.tick() => {}
            () = wake.notified() => {}
        }
        if members.has_changed().is_err() {
            return;
        }
        let Some(inner) = inner.upgrade() else { return };
        inner.sync_round(&mut published).await;
    }
}

impl Inner {
    /// Merges what the members publish (this node's earlier runs included) and publishes this
    /// node's table when it differs from `published`, what it published last.
    async fn sync_round(&self, published: &mut Vec<String>) {
        let incoming: Vec<LiveOverride> = self
            .node
            .shared_values(GOSSIP_PREFIX)
            .await
            .iter()
            .flat_map(|(_, chunks)| chunks.iter().flat_map(|chunk| LiveTable::parse_chunk(chunk)))
            .collect();
        let chunks = {
            let mut table = self.lock_table();
            let merged = table.merge(incoming);
            let chunks = table.chunks();
            if merged {
                self.changed(table);
            }
            chunks
        };
        if chunks == *published {
            return;
        }
        match self.node.publish_shared_values(GOSSIP_PREFIX, &chunks).await {
            Ok(()) => *published = chunks,
            Err(error) => warn!(%error, "live overrides not published (retried next round)"),
        }
    }

    fn lock_table(&self) -> MutexGuard<'_, LiveTable> {
        // The table is replaced entry by entry under the lock; a panic elsewhere cannot leave an
        // entry half-written.
        self.table.lock()
    }

    /// After `table` changed (its guard is released here): rebuilds the index, counts the change
    /// and writes the file.
    fn changed(&self, table: MutexGuard<'_, LiveTable>) {
        *self.index.write() = table.index();
        drop(table);
        self.changes.send_modify(|count| *count = count.wrapping_add(1));
        self.save();
    }

    /// Writes the table to the data directory, if there is one (a failure is logged: the table
    /// is still gossiped, and written again with the next change).
    fn save(&self) {
        let Some(dir) = &self.data_dir else { return };
        let _saving = self.saving.lock();
        let table = self.lock_table().clone();
        if let Err(error) = table.save(dir) {
            warn!(%error, dir = %dir.display(), "live overrides not written to the data directory");
        }
    }
}

impl LiveOverrides {
    /// Sets the override of `key` under `policy` to `limit`, cluster-wide: every member applies
    /// it within the delay the module documents. Refused, with nothing changed, when the key or
    /// the policy's name is out of bounds, the policy is calendar-aligned, `limit` does not make
    /// a valid limit under `policy`, or the cluster's table is full. Returns the entry written.
    pub fn set(
        &self,
        policy: &NamedPolicy,
        key: &str,
        limit: OverrideLimit,
    ) -> Result<LiveOverride, OverrideError> {
        if policy.policy().limit.spec().calendar.is_some() {
            return Err(OverrideError::Calendar);
        }
        limit.variant(policy.policy())?;
        self.write(policy.name(), key, Some(limit))
    }

    /// Deletes the override of `key` under the policy named `policy`, cluster-wide (a deletion is
    /// an entry of the table until newer entries need its room). Refused, with nothing changed,
    /// when the key or the name is out of bounds or the table is full. Returns the entry written.
    pub fn remove(&self, policy: &str, key: &str) -> Result<LiveOverride, OverrideError> {
        self.write(policy, key, None)
    }

    /// Writes an override (`Some`) or its deletion, versioned above every one known.
    fn write(
        &self,
        policy: &str,
        key: &str,
        limit: Option<OverrideLimit>,
    ) -> Result<LiveOverride, OverrideError> {
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
        let values = limit.unwrap_or_default();
        let mut table = self.inner.lock_table();
        let entry = LiveOverride {
            policy: policy.to_owned(),
            key: key.to_owned(),
            limit: values.limit,
            burst: values.burst,
            period_ms: values.period_ms,
            deleted: limit.is_none(),
            version_ms: table.next_version_ms(now_ms),
            writer: self.inner.node.id().0,
        };
        table.put(entry.clone())?;
        self.inner.changed(table);
        self.inner.wake.notify_one();
        Ok(entry)
    }

    /// The live (not deleted) overrides of the policy named `policy`, by key.
    pub fn list(&self, policy: &str) -> Vec<LiveOverride> {
        self.inner.lock_table().of_policy(policy).cloned().collect()
    }

    /// The policy a check of `key` under `policy` runs under: the key's live override of `policy`,
    /// else `policy` itself (also when `policy` is calendar-aligned or the override does not
    /// validate under it). An override is a policy of its own name,
    /// `<policy>#override:<algorithm>:<limit>/<period>ns:<burst>`: that name keeps its buckets
    /// apart, and is the name its checks are counted under in the top-keys sketches and written
    /// in the `RateLimit-Policy` header. Pass the result to [`Node::check`], `check_now`,
    /// `refund`, `charge`, `release` or [`crate::GroupCheck::new`] with the same key.
    pub fn resolve<'a>(&self, policy: &'a NamedPolicy, key: &[u8]) -> Cow<'a, NamedPolicy> {
        let limit = {
            let index = self.inner.index.read();
            index.get(policy.name()).and_then(|keys| keys.get(key)).copied()
        };
        let Some(limit) = limit else { return Cow::Borrowed(policy) };
        if policy.policy().limit.spec().calendar.is_some() {
            return Cow::Borrowed(policy);
        }
        match limit.variant(policy.policy()) {
            Ok(variant) => Cow::Owned(NamedPolicy::new(variant_name(policy.name(), &variant), variant)),
            Err(_) => Cow::Borrowed(policy),
        }
    }

    /// Counts the table's changes (local writes and merges from gossip): wait on it to follow
    /// the table, then read it with [`LiveOverrides::list`].
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }
}

/// The name of the policy `variant`, an override of the policy named `base`: what names its
/// buckets.
fn variant_name(base: &str, variant: &Policy) -> String {
    variant_namespace_name(base, "override", variant)
}

/// The name of a variant of the policy named `base` (`kind`: `override`, `tier`, …) whose
/// buckets are counted under `variant`'s limit: a key moved to another limit starts afresh there,
/// two variants of equal limits share buckets. The library's live overrides and the daemon's
/// overrides and tiers name their buckets with this one function.
pub fn variant_namespace_name(base: &str, kind: &str, variant: &Policy) -> String {
    let spec = variant.limit.spec();
    format!(
        "{base}#{kind}:{}:{}/{}ns:{:?}",
        spec.algorithm.name(),
        spec.limit,
        spec.period.as_nanos(),
        spec.burst
    )
}

#[cfg(test)]
mod tests;
