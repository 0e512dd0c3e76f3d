//! The snapshot format: magic, version, length, XXH3 checksum, a postcard body bound to the
//! cluster ([`encode`], [`decode`]).

use std::time::Duration;

use ratemesh_core::{Algorithm, CalendarWindow, DurableKey, KeyHash, LeaseId, Limit, LimitSpec, Snapshot};
use serde::{Deserialize, Serialize};

use super::{HEADER_LEN, SNAPSHOT_MAGIC, SNAPSHOT_VERSION, too_large};

/// Why a snapshot was not taken back. Nothing of it was applied: the node starts without it.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The store could not be read.
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    /// Shorter than its header or its stated length: a write cut short, or a truncated copy.
    #[error("truncated: {len} bytes, the header says {expected}")]
    Truncated {
        /// Bytes present.
        len: usize,
        /// Bytes the header announces.
        expected: usize,
    },
    /// Not a ratemesh snapshot at all.
    #[error("not a ratemesh snapshot (wrong magic bytes)")]
    Magic,
    /// A format this build does not read.
    #[error("snapshot format version {0} (this build reads {SNAPSHOT_VERSION})")]
    Version(u16),
    /// The bytes are not what was written: corruption on disk or in transit.
    #[error("checksum mismatch (stored {stored:016x}, computed {computed:016x}): corrupt")]
    Checksum {
        /// The checksum in the header.
        stored: u64,
        /// The checksum of the bytes.
        computed: u64,
    },
    /// The checksum holds but the content does not decode or validate (a bug, never trusted).
    #[error("malformed content: {0}")]
    Malformed(String),
    /// Written by a node of another cluster (another cluster id or CA).
    #[error("written by another cluster (its fingerprint {theirs}, ours {ours})")]
    ForeignCluster {
        /// The snapshot's cluster fingerprint, hex (first 8 bytes).
        theirs: String,
        /// This node's, hex (first 8 bytes).
        ours: String,
    },
}

impl SnapshotError {
    /// The `result` label of the load metric: `refused_corrupt`, `refused_version`,
    /// `refused_foreign` or `error` (the store could not be read).
    pub fn label(&self) -> &'static str {
        match self {
            SnapshotError::Io(_) => "error",
            SnapshotError::Version(_) => "refused_version",
            SnapshotError::ForeignCluster { .. } => "refused_foreign",
            _ => "refused_corrupt",
        }
    }
}

/// The identity a snapshot is bound to: a SHA-256 of the cluster id and the cluster CA
/// certificates, so a snapshot moved to a node of another cluster (another secret, CA or id)
/// is refused.
pub type ClusterFingerprint = [u8; 32];

/// The fingerprint of a cluster named `cluster_id` whose CA certificates are `ca_certs` (DER).
pub fn cluster_fingerprint(cluster_id: &str, ca_certs: &[&[u8]]) -> ClusterFingerprint {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(b"ratemesh snapshot cluster v1\0");
    for part in std::iter::once(cluster_id.as_bytes()).chain(ca_certs.iter().copied()) {
        context.update(&(part.len() as u64).to_le_bytes());
        context.update(part);
    }
    let mut fingerprint = [0; 32];
    fingerprint.copy_from_slice(context.finish().as_ref());
    fingerprint
}

/// A snapshot as read back: who wrote it, when, and the keys.
#[derive(Debug)]
pub struct Decoded {
    /// The node that wrote it.
    pub node: u64,
    /// When, in nanoseconds since the Unix epoch on the writer's clock.
    pub written_unix_nanos: u64,
    /// The keys, relative to the instant they were written.
    pub keys: Vec<DurableKey>,
}

#[derive(Serialize, Deserialize)]
struct Body {
    cluster: ClusterFingerprint,
    node: u64,
    written_unix_nanos: u64,
    limits: Vec<LimitRecord>,
    keys: Vec<KeyRecord>,
}

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
struct LimitRecord {
    algorithm: String,
    limit: u64,
    period_nanos: u64,
    burst: Option<u64>,
    delay: Option<u64>,
    /// A calendar window's start and end, Unix nanoseconds.
    calendar: Option<(u64, u64)>,
}

#[derive(Serialize, Deserialize)]
struct KeyRecord {
    key: u128,
    limit: u32,
    state: StateRecord,
}

#[derive(Serialize, Deserialize)]
enum StateRecord {
    Tat { backlog_nanos: u64 },
    Window { elapsed_nanos: u64, prev: u64, curr: u64 },
    Log(Vec<(u64, u64)>),
    Leases(Vec<(u64, u64, u64)>),
    Calendar { elapsed_nanos: u64, remaining_nanos: u64, curr: u64 },
}

impl LimitRecord {
    fn of(limit: &Limit) -> LimitRecord {
        let spec = limit.spec();
        LimitRecord {
            algorithm: spec.algorithm.name().to_owned(),
            limit: spec.limit,
            period_nanos: u64::try_from(spec.period.as_nanos()).unwrap_or(u64::MAX),
            burst: spec.burst,
            delay: spec.delay,
            calendar: spec.calendar.map(|window| (window.start.as_nanos(), window.end.as_nanos())),
        }
    }

    fn to_limit(&self) -> Result<Limit, SnapshotError> {
        let algorithm = Algorithm::from_name(&self.algorithm)
            .ok_or_else(|| SnapshotError::Malformed(format!("unknown algorithm {:?}", self.algorithm)))?;
        let spec = LimitSpec {
            algorithm,
            limit: self.limit,
            period: Duration::from_nanos(self.period_nanos),
            burst: self.burst,
            delay: self.delay,
            calendar: self.calendar.map(|(start, end)| CalendarWindow {
                start: ratemesh_core::Instant::from_nanos(start),
                end: ratemesh_core::Instant::from_nanos(end),
            }),
        };
        Limit::new(spec).map_err(|error| SnapshotError::Malformed(format!("invalid limit: {error}")))
    }
}

impl From<Snapshot> for StateRecord {
    fn from(snapshot: Snapshot) -> Self {
        match snapshot {
            Snapshot::Tat { backlog_nanos } => StateRecord::Tat { backlog_nanos },
            Snapshot::Window { elapsed_nanos, prev, curr } => {
                StateRecord::Window { elapsed_nanos, prev, curr }
            }
            Snapshot::Log { hits } => StateRecord::Log(hits),
            Snapshot::Leases { leases } => {
                StateRecord::Leases(leases.into_iter().map(|(id, slots, left)| (id.0, slots, left)).collect())
            }
            Snapshot::Calendar { elapsed_nanos, remaining_nanos, curr } => {
                StateRecord::Calendar { elapsed_nanos, remaining_nanos, curr }
            }
        }
    }
}

impl From<StateRecord> for Snapshot {
    fn from(record: StateRecord) -> Self {
        match record {
            StateRecord::Tat { backlog_nanos } => Snapshot::Tat { backlog_nanos },
            StateRecord::Window { elapsed_nanos, prev, curr } => {
                Snapshot::Window { elapsed_nanos, prev, curr }
            }
            StateRecord::Log(hits) => Snapshot::Log { hits },
            StateRecord::Leases(leases) => Snapshot::Leases {
                leases: leases.into_iter().map(|(id, slots, left)| (LeaseId(id), slots, left)).collect(),
            },
            StateRecord::Calendar { elapsed_nanos, remaining_nanos, curr } => {
                Snapshot::Calendar { elapsed_nanos, remaining_nanos, curr }
            }
        }
    }
}

/// Encodes `keys` (written at `written_unix_nanos` by `node` of the cluster `cluster`), refusing
/// to produce more than `bytes_max` bytes.
pub fn encode(
    cluster: &ClusterFingerprint,
    node: u64,
    written_unix_nanos: u64,
    keys: Vec<DurableKey>,
    bytes_max: usize,
) -> Result<Vec<u8>, SnapshotError> {
    let mut limits: Vec<LimitRecord> = Vec::new();
    let mut index: std::collections::HashMap<Limit, u32> = std::collections::HashMap::new();
    let mut records = Vec::with_capacity(keys.len());
    for durable in keys {
        let limit = *index.entry(durable.limit).or_insert_with_key(|limit| {
            limits.push(LimitRecord::of(limit));
            u32::try_from(limits.len() - 1).unwrap_or(u32::MAX)
        });
        records.push(KeyRecord { key: durable.key.0, limit, state: durable.state.into() });
    }
    let body = Body { cluster: *cluster, node, written_unix_nanos, limits, keys: records };
    let payload = postcard::to_allocvec(&body).map_err(|e| SnapshotError::Malformed(e.to_string()))?;
    let len = HEADER_LEN + payload.len();
    if len > bytes_max {
        return Err(SnapshotError::Io(too_large(bytes_max)));
    }
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(&SNAPSHOT_MAGIC);
    bytes.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&0u16.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    let checksum = checksum(&bytes, &payload);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    bytes.extend_from_slice(&payload);
    Ok(bytes)
}

fn checksum(header: &[u8], payload: &[u8]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(header);
    hasher.update(payload);
    hasher.digest()
}

/// Decodes and validates a snapshot of the cluster `cluster`. All or nothing.
pub fn decode(bytes: &[u8], cluster: &ClusterFingerprint) -> Result<Decoded, SnapshotError> {
    let truncated = |expected| SnapshotError::Truncated { len: bytes.len(), expected };
    let header = bytes.get(..HEADER_LEN).ok_or_else(|| truncated(HEADER_LEN))?;
    if header[..8] != SNAPSHOT_MAGIC {
        return Err(SnapshotError::Magic);
    }
    let field = |range: std::ops::Range<usize>| -> [u8; 8] {
        let mut out = [0; 8];
        out[..range.len()].copy_from_slice(&header[range]);
        out
    };
    let version = u16::from_le_bytes([header[8], header[9]]);
    if version != SNAPSHOT_VERSION {
        return Err(SnapshotError::Version(version));
    }
    let payload_len = usize::try_from(u64::from_le_bytes(field(12..20))).unwrap_or(usize::MAX);
    let expected = HEADER_LEN.saturating_add(payload_len);
    if bytes.len() != expected {
        return Err(match bytes.len() < expected {
            true => truncated(expected),
            false => SnapshotError::Malformed(format!("{} bytes after the payload", bytes.len() - expected)),
        });
    }
    let payload = &bytes[HEADER_LEN..];
    let stored = u64::from_le_bytes(field(20..28));
    let computed = checksum(&header[..20], payload);
    if stored != computed {
        return Err(SnapshotError::Checksum { stored, computed });
    }
    let body: Body = postcard::from_bytes(payload).map_err(|e| SnapshotError::Malformed(e.to_string()))?;
    if body.cluster != *cluster {
        return Err(SnapshotError::ForeignCluster { theirs: hex8(&body.cluster), ours: hex8(cluster) });
    }
    let limits = body.limits.iter().map(LimitRecord::to_limit).collect::<Result<Vec<_>, _>>()?;
    let keys = body
        .keys
        .into_iter()
        .map(|record| {
            let limit = limits.get(record.limit as usize).ok_or_else(|| {
                SnapshotError::Malformed(format!("limit index {} of {}", record.limit, limits.len()))
            })?;
            Ok(DurableKey { key: KeyHash(record.key), limit: limit.clone(), state: record.state.into() })
        })
        .collect::<Result<Vec<_>, SnapshotError>>()?;
    Ok(Decoded { node: body.node, written_unix_nanos: body.written_unix_nanos, keys })
}

fn hex8(bytes: &[u8]) -> String {
    bytes.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::{FileStateStore, StateStore};

    const CLUSTER: ClusterFingerprint = [7; 32];

    fn keys() -> Vec<DurableKey> {
        let daily = Limit::new(LimitSpec::new(Algorithm::TokenBucket, 100, Duration::from_secs(86_400)))
            .expect("valid limit");
        let log = Limit::new(LimitSpec::new(Algorithm::SlidingWindowLog, 10, Duration::from_secs(3_600)))
            .expect("valid limit");
        vec![
            DurableKey { key: KeyHash(1), limit: daily.clone(), state: Snapshot::Tat { backlog_nanos: 5 } },
            DurableKey { key: KeyHash(2), limit: daily, state: Snapshot::Tat { backlog_nanos: 9 } },
            DurableKey { key: KeyHash(3), limit: log, state: Snapshot::Log { hits: vec![(1, 2), (3, 4)] } },
        ]
    }

    fn snapshot() -> Vec<u8> {
        encode(&CLUSTER, 2, 1_700_000_000_000_000_000, keys(), crate::defaults::SNAPSHOT_BYTES_MAX)
            .expect("encodes")
    }

    #[test]
    fn a_snapshot_round_trips_with_its_limits_shared() {
        let bytes = snapshot();
        let decoded = decode(&bytes, &CLUSTER).expect("decodes");
        assert_eq!((decoded.node, decoded.written_unix_nanos), (2, 1_700_000_000_000_000_000));
        assert_eq!(decoded.keys, keys());
    }

    #[test]
    fn every_truncation_and_bit_flip_is_refused() {
        let bytes = snapshot();
        for len in 0..bytes.len() {
            let error = decode(&bytes[..len], &CLUSTER).expect_err("a truncated snapshot is refused");
            assert!(
                matches!(error, SnapshotError::Truncated { .. } | SnapshotError::Magic),
                "{len}: {error}"
            );
        }
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&flipped, &CLUSTER).is_err(), "bit {bit} flipped was accepted");
        }
    }

    #[test]
    fn a_foreign_cluster_or_version_is_refused_by_name() {
        let bytes = snapshot();
        let other = cluster_fingerprint("ratemesh", &[b"another CA"]);
        assert!(matches!(decode(&bytes, &other), Err(SnapshotError::ForeignCluster { .. })));
        let mut future = bytes.clone();
        future[8] = 2;
        assert!(matches!(decode(&future, &CLUSTER), Err(SnapshotError::Version(2))));
        assert_ne!(cluster_fingerprint("a", &[b"ca"]), cluster_fingerprint("b", &[b"ca"]));
        assert_ne!(cluster_fingerprint("a", &[b"ca"]), cluster_fingerprint("a", &[b"cb"]));
    }

    #[test]
    fn the_size_bound_holds_both_ways() {
        let bytes = snapshot();
        assert!(encode(&CLUSTER, 2, 1_700_000_000_000_000_000, keys(), bytes.len() - 1).is_err());
        let dir = std::env::temp_dir().join(format!("ratemesh-durable-{}", std::process::id()));
        let store = FileStateStore::new(&dir);
        assert!(store.load(1 << 20).expect("no file is no snapshot").is_none());
        store.save(&bytes).expect("saved");
        assert_eq!(store.load(bytes.len()).expect("loads").as_deref(), Some(bytes.as_slice()));
        let error = store.load(bytes.len() - 1).expect_err("over the bound");
        assert_eq!(error.kind(), std::io::ErrorKind::FileTooLarge);
        assert!(!store.temp_path().exists(), "the temporary file was renamed");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
