//! Durable quotas: the node's state written to storage every few seconds and read back at start,
//! so that per-hour, per-day and per-month limits survive a restart of the whole cluster.
//!
//! - [`StateStore`]: where the bytes go. [`FileStateStore`] (a file in a data directory, written
//!   atomically) is the default; an embedding service can keep them anywhere else (a database, an
//!   object store) by implementing the trait's two methods.
//! - The snapshot format ([`encode`], [`decode`]): versioned, checksummed, bound to the cluster
//!   (a snapshot of another cluster is refused), bounded in size. What goes in is the core's
//!   [`ratemesh_core::Node::durable_keys`]; what comes out goes to
//!   [`ratemesh_core::Node::restore`], which joins it conservatively.
//!
//! # Format (version 1)
//!
//! ```text
//! offset  size  field
//! 0       8     magic "RMSNAP\r\n" (the CR LF catches text-mode mangling)
//! 8       2     format version, little endian (1)
//! 10      2     reserved, 0
//! 12      8     payload length in bytes, little endian
//! 20      8     XXH3-64 of bytes 0..20 and the payload, little endian
//! 28      n     payload: postcard encoding of the body (cluster fingerprint, writer node,
//!               Unix time written, the distinct limits, then per key: hash, limit index, state)
//! ```
//!
//! A file is trusted only whole: wrong magic, version, length, checksum, trailing bytes, an
//! invalid limit or a state that does not fit its limit refuses all of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use ratemesh_core::DurableKey;
use tracing::{debug, error, info, warn};

use crate::defaults;
use crate::sync::Mutex;

mod format;
mod store;

pub use format::{ClusterFingerprint, Decoded, SnapshotError, cluster_fingerprint, decode, encode};
use store::too_large;
pub use store::{FileStateStore, StateStore};

/// The first bytes of every snapshot.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"RMSNAP\r\n";
/// The format version this build writes and reads.
pub const SNAPSHOT_VERSION: u16 = 1;
/// The name of the snapshot file in a data directory.
pub const SNAPSHOT_FILE_NAME: &str = "ratemesh.snapshot";

const HEADER_LEN: usize = 28;

/// How a node keeps its snapshots (see [`crate::NodeBuilder::state_store`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotSettings {
    /// Time between snapshots.
    pub interval: Duration,
    /// Keys of limits whose period is shorter are not written.
    pub period_min: Duration,
    /// The largest snapshot written or read.
    pub bytes_max: usize,
}

impl Default for SnapshotSettings {
    fn default() -> Self {
        SnapshotSettings {
            interval: Duration::from_millis(defaults::SNAPSHOT_INTERVAL_MS),
            period_min: Duration::from_millis(defaults::SNAPSHOT_PERIOD_MIN_MS),
            bytes_max: defaults::SNAPSHOT_BYTES_MAX,
        }
    }
}

/// Counters and gauges of a node's snapshots, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotMetrics {
    /// Whether the node keeps snapshots at all.
    pub enabled: bool,
    /// Snapshots written.
    pub writes: u64,
    /// Snapshots that could not be written (encoding over the bound, storage errors).
    pub write_failures: u64,
    /// Keys in the last snapshot written.
    pub last_keys: u64,
    /// Bytes of the last snapshot written.
    pub last_bytes: u64,
    /// How long the last snapshot held the node's lock (taking the keys out of the core), its
    /// pages together (checks go between two pages).
    pub last_export: Duration,
    /// How long the last snapshot took in all: export, encoding and the atomic write.
    pub last_duration: Duration,
    /// When the last snapshot was written, in nanoseconds since the Unix epoch.
    pub last_written_unix_nanos: Option<u64>,
    /// What the start made of the stored snapshot: `disabled`, `none` (nothing stored),
    /// `loaded`, `refused_corrupt`, `refused_version`, `refused_foreign` or `error`.
    pub load_result: &'static str,
    /// Keys taken back at start.
    pub loaded_keys: u64,
}

/// A node's snapshot machinery: its store, its settings, and what it did.
#[derive(Debug)]
pub(crate) struct Persistence {
    store: Arc<dyn StateStore>,
    cluster: ClusterFingerprint,
    node: u64,
    settings: SnapshotSettings,
    /// Replaced whole or counted only (as is `saved`): a panic elsewhere cannot leave these torn,
    /// so a poisoned lock is recovered (`crate::sync`).
    metrics: Mutex<SnapshotMetrics>,
    /// Numbers snapshots in the order their keys were taken out of the core.
    next_generation: AtomicU64,
    /// The generation of the last snapshot saved. Held while saving: saves never overlap, and a
    /// snapshot older than the one saved (a periodic one that lost the race against the final
    /// one) is dropped instead of overwriting newer state.
    saved: Mutex<u64>,
}

impl Persistence {
    pub(crate) fn new(
        store: Arc<dyn StateStore>,
        cluster: ClusterFingerprint,
        node: u64,
        settings: SnapshotSettings,
    ) -> Persistence {
        let metrics = SnapshotMetrics { enabled: true, load_result: "none", ..SnapshotMetrics::default() };
        Persistence {
            store,
            cluster,
            node,
            settings,
            metrics: Mutex::new(metrics),
            next_generation: AtomicU64::new(1),
            saved: Mutex::new(0),
        }
    }

    pub(crate) fn settings(&self) -> SnapshotSettings {
        self.settings
    }

    pub(crate) fn metrics(&self) -> SnapshotMetrics {
        self.metrics.lock().clone()
    }

    /// Reads the stored snapshot: its keys and how long ago they were written, or nothing (none
    /// stored, or refused: logged and counted, never trusted).
    pub(crate) async fn load(self: &Arc<Self>) -> Option<(Vec<DurableKey>, Duration)> {
        let this = Arc::clone(self);
        let read = tokio::task::spawn_blocking(move || {
            let bytes = this.store.load(this.settings.bytes_max)?;
            bytes.map(|bytes| decode(&bytes, &this.cluster).map(|decoded| (decoded, bytes.len()))).transpose()
        })
        .await
        .unwrap_or_else(|error| Err(SnapshotError::Io(std::io::Error::other(error))));
        let store = &self.store;
        match read {
            Ok(None) => {
                info!(?store, "no snapshot stored: starting with no saved state");
                None
            }
            Ok(Some((decoded, bytes))) => {
                let age = unix_nanos_now().saturating_sub(decoded.written_unix_nanos);
                if decoded.written_unix_nanos > unix_nanos_now() {
                    warn!(
                        ?store,
                        "the snapshot was written in the future (clock stepped back?): no refill credited"
                    );
                }
                let keys = decoded.keys.len();
                info!(
                    ?store,
                    keys,
                    bytes,
                    age_s = age as f64 / 1e9,
                    writer = decoded.node,
                    "snapshot loaded"
                );
                let mut metrics = self.metrics.lock();
                metrics.load_result = "loaded";
                metrics.loaded_keys = keys as u64;
                Some((decoded.keys, Duration::from_nanos(age)))
            }
            Err(error) => {
                error!(
                    ?store,
                    %error,
                    "snapshot REFUSED: starting with no saved state (nothing of it is used; the next \
                     snapshot replaces it)"
                );
                self.metrics.lock().load_result = error.label();
                None
            }
        }
    }

    /// Encodes and saves `keys`, taken out of the core in `export` (under its lock) from `started` on,
    /// on a blocking thread. Failures are logged and counted.
    pub(crate) async fn save(
        self: &Arc<Self>,
        keys: Vec<DurableKey>,
        export: Duration,
        started: std::time::Instant,
    ) {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let written_unix_nanos = unix_nanos_now();
        let this = Arc::clone(self);
        let saved = tokio::task::spawn_blocking(move || {
            let len = keys.len();
            let bytes = encode(&this.cluster, this.node, written_unix_nanos, keys, this.settings.bytes_max)?;
            let mut saved = this.saved.lock();
            if *saved > generation {
                return Ok(None);
            }
            this.store.save(&bytes)?;
            *saved = generation;
            Ok::<_, SnapshotError>(Some((len, bytes.len())))
        })
        .await
        .unwrap_or_else(|error| Err(SnapshotError::Io(std::io::Error::other(error))));
        let mut metrics = self.metrics.lock();
        match saved {
            Ok(None) => {}
            Ok(Some((keys, bytes))) => {
                metrics.writes += 1;
                metrics.last_keys = keys as u64;
                metrics.last_bytes = bytes as u64;
                metrics.last_export = export;
                metrics.last_duration = started.elapsed();
                metrics.last_written_unix_nanos = Some(written_unix_nanos);
                debug!(keys, bytes, "snapshot written");
            }
            Err(error) => {
                metrics.write_failures += 1;
                drop(metrics);
                error!(store = ?self.store, %error, "snapshot NOT written: the previous one stays");
            }
        }
    }
}

/// Nanoseconds since the Unix epoch now (0 for a clock before it).
pub fn unix_nanos_now() -> u64 {
    let since = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}
