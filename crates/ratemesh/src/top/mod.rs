//! Who is being limited: the heaviest keys per policy over a recent window, bounded in memory.
//!
//! - [`SpaceSaving`] is the heavy-hitter sketch (Metwally, Agrawal, El Abbadi 2005) with a filter
//!   in front of takeovers (Filtered Space-Saving, Homem and Carvalho 2010): at most `capacity`
//!   counters; once they are taken, a key without a counter adds to a filter cell and takes over
//!   the smallest counter only when its cell's sum passes the smallest count, inheriting the
//!   cell's sum as its error. Keys are named by a 128-bit hash of policy and key text, which for
//!   the library's checks of short UTF-8 keys is the bucket hash the check computed already
//!   ([`KeyHash`]): such a hit hashes nothing and copies no key. A takeover finds a smallest
//!   counter among those a scan of the counts found (amortised `O(1)` under even load,
//!   `O(capacity)` at worst).
//!   **Bound:** a counted key's estimate is never below its true count and exceeds it by at most
//!   its counter's `error`, which is at most the sketch's smallest count, which is at most
//!   `total / capacity`; a key without a counter has a true count of at most that smallest
//!   count. So every key whose true count exceeds `total / capacity` has a counter.
//! - [`PolicyTop`] keeps, per policy, two sketches (demand: every hit checked; refused: hits
//!   refused) per *half-window*; two half-windows rotate (`half_window`, 30 s by default), so a
//!   query covers between one and two half-windows: the last minute at most.
//! - A [`TopShard`] holds one lane's policies; the node keeps it under the lane's lock with the
//!   lane's core, so that a check records itself under the lock it decided under (one lock per
//!   check) and never contends with checks of other lanes. [`TopTable`] is what the shards
//!   share: the bounds and the policies recorded (at most `policies_max`; checks under further
//!   policies are not recorded, and counted).
//! - [`TopSummary`] is one sketch's content as it travels between members; [`merge`] joins the
//!   summaries of every member and half-window into a [`TopAnswer`]. **Merged bound:** an
//!   estimate is the sum over summaries of the key's count there, or of that summary's smallest
//!   count where it has no counter; it is never below the true count and exceeds it by at most
//!   `error_bound`, the sum of the summaries' smallest counts (each at most its `total /
//!   capacity`).
//!
//! The sketches count keys as answered. A key is cut at `key_bytes_max` bytes (64 by default, on
//! a UTF-8 character boundary; bytes that are not UTF-8 are replaced), so memory per counter is
//! bounded, and every bucket answered under one text is one key of the sketch: keys that share
//! their first `key_bytes_max` bytes, and a key's tiers and override variants (buckets of their
//! own in the limiter). The bounds are those of the text. Keys are never metric labels: they are
//! only in these sketches and in the answers of [`crate::Node::top`].
//!
//! The identities are unseeded hashes of what clients send: keys crafted to collide cost a
//! sketch's index `O(capacity)` probes per hit and can share one filter cell (the filter then
//! degenerates to plain Space-Saving, with the same bounds) — the exposure of the core's key
//! table, whose hash this is.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratemesh_core::{Instant, KeyHash, Namespace};
use serde::{Deserialize, Serialize};

use crate::TopLabel;
use crate::defaults;
use crate::sync::Mutex;

mod query;
mod sketch;

pub use query::{
    TOP_QUERY_VERSION, TopQueryError, TopQuestion, TopReply, decode_question, decode_reply, encode_message,
};
pub use sketch::SpaceSaving;

/// Bounds of the top-keys sketches. Every field has a default ([`Default`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopConfig {
    /// Counters per sketch (default [`defaults::TOP_CAPACITY`]). A policy holds four sketches (demand and
    /// refused, two half-windows) per lane of the node: at most `4 × capacity × lanes` keys. A
    /// sketch whose counters are all taken also holds a filter of 8 bytes per cell, the power of
    /// two of at least 8 cells per counter (8 KiB at the default capacity).
    pub capacity: usize,
    /// Bytes of a key kept (default [`defaults::TOP_KEY_BYTES_MAX`]); longer keys are cut (see the module
    /// documentation).
    pub key_bytes_max: usize,
    /// Length of one half-window (default [`defaults::TOP_HALF_WINDOW_MS`]): a query covers the current
    /// half-window and the previous one.
    pub half_window: Duration,
    /// Policies recorded (default [`defaults::TOP_POLICIES_MAX`]); checks under further policies are not
    /// recorded. Zero turns top keys off: no check pays for them (about 20–60 ns a check on
    /// 10 000 evenly hit keys: the README's performance section and docs/performance-history.md).
    pub policies_max: usize,
}

impl Default for TopConfig {
    fn default() -> Self {
        TopConfig {
            capacity: defaults::TOP_CAPACITY,
            key_bytes_max: defaults::TOP_KEY_BYTES_MAX,
            half_window: Duration::from_millis(defaults::TOP_HALF_WINDOW_MS),
            policies_max: defaults::TOP_POLICIES_MAX,
        }
    }
}

/// Which hits a top-keys query ranks by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TopBy {
    /// Hits refused.
    Refused,
    /// Hits checked, allowed or not.
    Demand,
}

impl TopBy {
    /// `"refused"` or `"demand"`.
    pub fn name(self) -> &'static str {
        match self {
            TopBy::Refused => "refused",
            TopBy::Demand => "demand",
        }
    }

    /// The kind named `name` (`refused` or `demand`).
    pub fn from_name(name: &str) -> Option<TopBy> {
        match name {
            "refused" => Some(TopBy::Refused),
            "demand" => Some(TopBy::Demand),
            _ => None,
        }
    }
}

/// One key of a [`TopSummary`] or a [`TopAnswer`]: its estimated hits and how much of that may
/// be overestimate (the true count is in `count - error ..= count`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopEntry {
    /// The key, cut at the length bound.
    pub key: String,
    /// Estimated hits (never below the true count).
    pub count: u64,
    /// The most by which `count` may exceed the true count.
    pub error: u64,
}

/// One sketch's content: what a member sends when asked for its top keys.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopSummary {
    /// Hits the sketch counted.
    pub total: u64,
    /// Its smallest count when full, else 0 ([`SpaceSaving::error_bound`]).
    pub error_bound: u64,
    /// Its counters.
    pub entries: Vec<TopEntry>,
}

/// The answer to a top-keys query: the heaviest keys, best first, with the bound of the
/// estimates and the window they cover.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopAnswer {
    /// At most the `n` asked for, heaviest first (ties by key).
    pub entries: Vec<TopEntry>,
    /// No estimate exceeds its key's true count by more than this; a key not listed was hit at
    /// most this often (or less than the last listed).
    pub error_bound: u64,
    /// Hits counted in the window, over every summary merged.
    pub total: u64,
    /// The window covered: the longest span of the merged summaries.
    pub window: Duration,
}

/// Merges summaries (of members and half-windows) into the `n` heaviest keys; `window` is the
/// span they cover. See the module documentation for the bound.
pub fn merge(summaries: &[TopSummary], n: usize, window: Duration) -> TopAnswer {
    let mut estimates: HashMap<&str, (u64, u64)> = HashMap::new();
    for (at, summary) in summaries.iter().enumerate() {
        for entry in &summary.entries {
            let slot = estimates.entry(entry.key.as_str()).or_insert_with(|| {
                // Summaries before this one that had no counter for the key: their smallest counts.
                let absent: u64 = summaries[..at].iter().map(|s| s.error_bound).sum();
                (absent, absent)
            });
            slot.0 = slot.0.saturating_add(entry.count);
            slot.1 = slot.1.saturating_add(entry.error);
        }
        // Keys seen before but without a counter here.
        let here: std::collections::HashSet<&str> = summary.entries.iter().map(|e| e.key.as_str()).collect();
        for (key, slot) in &mut estimates {
            if !here.contains(key) {
                slot.0 = slot.0.saturating_add(summary.error_bound);
                slot.1 = slot.1.saturating_add(summary.error_bound);
            }
        }
    }
    let mut entries: Vec<TopEntry> = estimates
        .into_iter()
        .map(|(key, (count, error))| TopEntry { key: key.to_owned(), count, error })
        .collect();
    entries.sort_unstable_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    entries.truncate(n);
    TopAnswer {
        entries,
        error_bound: summaries.iter().map(|s| s.error_bound).fold(0, u64::saturating_add),
        total: summaries.iter().map(|s| s.total).fold(0, u64::saturating_add),
        window,
    }
}

/// `key` cut to at most `bytes_max` bytes on a character boundary (bytes that are not UTF-8 are
/// replaced first).
pub fn cut_key(key: &[u8], bytes_max: usize) -> Cow<'_, str> {
    // The common case first: a head that is UTF-8 as it is (about a third of the lossy path's
    // cost on short keys). A head cut inside a character is not, and takes the path below.
    if let Ok(head) = std::str::from_utf8(&key[..key.len().min(bytes_max)]) {
        return Cow::Borrowed(head);
    }
    let text = String::from_utf8_lossy(&key[..key.len().min(bytes_max.saturating_mul(3))]);
    if text.len() <= bytes_max {
        return text;
    }
    let mut end = bytes_max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(text[..end].to_owned())
}

/// The sketches of one half-window.
#[derive(Clone, Debug)]
struct HalfWindow {
    start: Instant,
    demand: SpaceSaving,
    refused: SpaceSaving,
}

impl HalfWindow {
    fn new(start: Instant, capacity: usize) -> HalfWindow {
        HalfWindow { start, demand: SpaceSaving::new(capacity), refused: SpaceSaving::new(capacity) }
    }

    fn sketch(&self, by: TopBy) -> &SpaceSaving {
        match by {
            TopBy::Refused => &self.refused,
            TopBy::Demand => &self.demand,
        }
    }
}

/// One policy's demand and refused sketches over two rotating half-windows.
#[derive(Clone, Debug)]
pub struct PolicyTop {
    half_window_nanos: u64,
    current: HalfWindow,
    previous: Option<HalfWindow>,
}

impl PolicyTop {
    /// Empty sketches starting at `now`.
    pub fn new(now: Instant, config: &TopConfig) -> PolicyTop {
        let half_window_nanos = ratemesh_core::duration_nanos(config.half_window).max(1);
        PolicyTop { half_window_nanos, current: HalfWindow::new(now, config.capacity), previous: None }
    }

    /// Counts a check of `cost` hits of the key of identity `id` at `now`, refused or not; `key`
    /// writes its text (cut) when a sketch gives it a counter. One text, one identity
    /// ([`TopTable::record`] derives it).
    pub fn record(&mut self, now: Instant, id: KeyHash, key: impl Fn(&mut String), cost: u64, refused: bool) {
        self.rotate(now);
        self.current.demand.add(id.0, cost, &key);
        if refused {
            self.current.refused.add(id.0, cost, &key);
        }
    }

    /// The summaries of the half-windows still in the window at `now` (current first), and the
    /// span they cover.
    pub fn summaries(&mut self, now: Instant, by: TopBy) -> (Vec<TopSummary>, Duration) {
        self.rotate(now);
        let oldest = self.previous.as_ref().map_or(self.current.start, |previous| previous.start);
        let window = Duration::from_nanos(now.nanos_since(oldest));
        let mut summaries = vec![self.current.sketch(by).summary()];
        summaries.extend(self.previous.as_ref().map(|previous| previous.sketch(by).summary()));
        (summaries, window)
    }

    /// The text of the key of identity `id`, if a demand sketch of the window holds it.
    pub fn key_of(&self, id: KeyHash) -> Option<&str> {
        let previous = self.previous.as_ref().and_then(|previous| previous.demand.key_of(id.0));
        self.current.demand.key_of(id.0).or(previous)
    }

    /// Bytes of heap memory held by the four sketches.
    pub fn heap_bytes(&self) -> usize {
        let half = |h: &HalfWindow| h.demand.heap_bytes() + h.refused.heap_bytes();
        half(&self.current) + self.previous.as_ref().map_or(0, half)
    }

    /// Starts a new half-window once the current one is over (and forgets the previous one; both
    /// when two half-windows passed without a hit).
    fn rotate(&mut self, now: Instant) {
        let elapsed = now.nanos_since(self.current.start);
        if elapsed < self.half_window_nanos {
            return;
        }
        let capacity = self.current.demand.capacity;
        // Half-windows start on their grid, so that the window is the same whatever the traffic.
        let start = self.current.start.add_nanos(elapsed - elapsed % self.half_window_nanos);
        let finished = std::mem::replace(&mut self.current, HalfWindow::new(start, capacity));
        self.previous = (elapsed < 2 * self.half_window_nanos).then_some(finished);
    }
}

type PolicyNames = std::collections::HashSet<Arc<str>, foldhash::fast::RandomState>;

/// One lane's sketches of every policy it recorded: the node keeps it with the lane's core,
/// under the lane's lock. A key is counted in the shard of its lane only; the node's summaries
/// merge the shards' like those of members ([`TopTable::combine`]). Each shard keeps `capacity`
/// counters per sketch.
#[derive(Debug, Default)]
pub struct TopShard {
    policies: HashMap<Arc<str>, PolicyTop, foldhash::fast::RandomState>,
}

impl TopShard {
    /// This shard's summaries of `policy` at `now` (none if it recorded nothing under it), one
    /// per half-window, current first, and the span they cover.
    pub fn summaries(
        &mut self,
        now: Instant,
        policy: &str,
        by: TopBy,
    ) -> Option<(Vec<TopSummary>, Duration)> {
        self.policies.get_mut(policy).map(|top| top.summaries(now, by))
    }

    /// Bytes of heap memory held by its sketches.
    pub fn heap_bytes(&self) -> usize {
        self.policies.values().map(PolicyTop::heap_bytes).sum()
    }

    /// The text of the bucket `id` as a client named it, if a policy whose audit group is `group`
    /// ([`crate::NamedPolicy::audit_group`] of its name) counts it under that identity: the
    /// bucket of a key under its policy's name (not a tier's or an override's, whose buckets
    /// are other hashes), its text not cut. One hash per policy recorded.
    pub fn key_of(&self, group: u64, id: KeyHash) -> Option<String> {
        self.policies
            .iter()
            .filter(|(name, _)| Namespace::new(name.as_bytes()).0 == group)
            .find_map(|(_, top)| top.key_of(id).map(str::to_owned))
    }
}

/// What the top-keys shards of one node share: the bounds, and the policies recorded (every
/// shard records the same policies, at most `policies_max` together).
#[derive(Debug)]
pub struct TopTable {
    config: TopConfig,
    /// The policies recorded (a shard takes one of these only).
    admitted: Mutex<PolicyNames>,
    /// The same set once `policies_max` policies are in it, when it can no longer change: read
    /// without the lock (a check of a policy left out would otherwise take this node-wide lock
    /// under its lane's, every time).
    admitted_final: std::sync::OnceLock<PolicyNames>,
    /// Checks not recorded because `policies_max` policies are recorded already.
    unrecorded: AtomicU64,
}

impl TopTable {
    /// A table of no policy yet, with `config`'s bounds.
    pub fn new(config: TopConfig) -> TopTable {
        TopTable {
            config,
            admitted: Mutex::default(),
            admitted_final: std::sync::OnceLock::new(),
            unrecorded: AtomicU64::new(0),
        }
    }

    /// The bounds.
    pub fn config(&self) -> &TopConfig {
        &self.config
    }

    /// Counts a check of `cost` hits (0, a query, counts nothing) under `label` in `shard`. The
    /// sketches count keys as answered: one identity per policy and cut key text, so that every
    /// bucket answered under one text (a key's tiers and override variants, keys that share their
    /// first `key_bytes_max` bytes) adds to one counter and the bounds hold for the text.
    ///
    /// `label_bucket` is the bucket of `label.key` under the namespace named `label.policy`
    /// ([`crate::NamedPolicy::key`]), when the caller has it: for a key that is its own text (short
    /// and UTF-8, the common case) it is the identity, and the hit hashes nothing. Otherwise the
    /// text is hashed. The text is copied only when a sketch gives it a counter.
    pub fn record(
        &self,
        shard: &mut TopShard,
        now: Instant,
        label: TopLabel<'_>,
        label_bucket: Option<KeyHash>,
        cost: u64,
        refused: bool,
    ) {
        if cost == 0 || self.config.policies_max == 0 {
            return;
        }
        let TopLabel { policy, key } = label;
        let bytes_max = self.config.key_bytes_max;
        // The common case first: a short ASCII key is its own text, so its identity is its bucket
        // and no text is made unless a sketch gives it a counter (a UTF-8 check per hit was a
        // tenth of the recording).
        debug_assert!(
            key.len() > bytes_max
                || label_bucket.is_none_or(|b| b == Namespace::new(policy.as_bytes()).key(key)),
            "not the label's bucket"
        );
        let (id, text) = if key.len() <= bytes_max && key.is_ascii() {
            (label_bucket.unwrap_or_else(|| Namespace::new(policy.as_bytes()).key(key)), None)
        } else {
            let text = cut_key(key, bytes_max);
            let id = match label_bucket {
                Some(bucket) if text.len() == key.len() && matches!(text, Cow::Borrowed(_)) => bucket,
                _ => Namespace::new(policy.as_bytes()).key(text.as_bytes()),
            };
            (id, Some(text))
        };
        let write = |buffer: &mut String| match &text {
            Some(text) => buffer.push_str(text),
            None => buffer.push_str(&cut_key(key, bytes_max)),
        };
        if let Some(top) = shard.policies.get_mut(policy) {
            return top.record(now, id, write, cost, refused);
        }
        // A policy this shard has not seen: taken only if the table records it or has room.
        let Some(name) = self.admit(policy) else {
            self.unrecorded.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let mut top = PolicyTop::new(now, &self.config);
        top.record(now, id, write, cost, refused);
        shard.policies.insert(name, top);
    }

    /// The table's name of `policy` if it records it, entering it when there is room.
    fn admit(&self, policy: &str) -> Option<Arc<str>> {
        if let Some(admitted) = self.admitted_final.get() {
            return admitted.get(policy).cloned();
        }
        let mut admitted = self.admitted.lock();
        if let Some(name) = admitted.get(policy) {
            return Some(name.clone());
        }
        if admitted.len() >= self.config.policies_max {
            // Full: the set can no longer change.
            let _ = self.admitted_final.set(admitted.clone());
            return None;
        }
        let name: Arc<str> = policy.into();
        admitted.insert(name.clone());
        Some(name)
    }

    /// A node's summaries of one policy from its shards' ([`TopShard::summaries`]): one per
    /// half-window, each the shards' sketches of that half-window combined (`combine`), and the
    /// longest span they cover.
    pub fn combine(
        &self,
        shards: impl IntoIterator<Item = (Vec<TopSummary>, Duration)>,
    ) -> (Vec<TopSummary>, Duration) {
        let (mut by_half, mut window) = (Vec::<Vec<TopSummary>>::new(), Duration::ZERO);
        for (shard_summaries, shard_window) in shards {
            for (half, summary) in shard_summaries.into_iter().enumerate() {
                match by_half.get_mut(half) {
                    Some(summaries) => summaries.push(summary),
                    None => by_half.push(vec![summary]),
                }
            }
            window = window.max(shard_window);
        }
        let capacity = self.config.capacity;
        (by_half.iter().map(|summaries| combine(summaries, capacity)).collect(), window)
    }

    /// Checks not recorded because the table was full of other policies.
    pub fn unrecorded(&self) -> u64 {
        self.unrecorded.load(Ordering::Relaxed)
    }
}

/// The shards' summaries of one half-window as one, of at most `capacity` entries, so that a
/// member's answer has as many summaries and entries whatever its lane count. Each entry is the
/// shards' [`merge`]d estimate (a key counted in one shard gets the other shards' smallest counts
/// added, as across members); the bound is the shards' summed one, or the largest estimate left
/// out when more than `capacity` keys had one, whichever is larger: a key not listed was hit at
/// most that often.
fn combine(summaries: &[TopSummary], capacity: usize) -> TopSummary {
    if let [summary] = summaries {
        return summary.clone();
    }
    let mut merged = merge(summaries, usize::MAX, Duration::ZERO);
    let left_out = merged.entries.get(capacity).map_or(0, |entry| entry.count);
    merged.entries.truncate(capacity);
    TopSummary { total: merged.total, error_bound: merged.error_bound.max(left_out), entries: merged.entries }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn shards(count: usize) -> Vec<TopShard> {
        (0..count).map(|_| TopShard::default()).collect()
    }

    /// Records a check of `key` under `policy` at time zero, as the node does (the bucket named by
    /// the key's hash).
    fn record(table: &TopTable, shard: &mut TopShard, policy: &str, key: &[u8], cost: u64, refused: bool) {
        let bucket = ratemesh_core::Namespace::new(policy.as_bytes()).key(key);
        table.record(shard, Instant::ZERO, TopLabel { policy, key }, Some(bucket), cost, refused);
    }

    /// The node's summaries of `policy` over `shards`, as the node takes them.
    fn summaries(
        table: &TopTable,
        shards: &mut [TopShard],
        now: Instant,
        policy: &str,
        by: TopBy,
    ) -> Vec<TopSummary> {
        table.combine(shards.iter_mut().filter_map(|shard| shard.summaries(now, policy, by))).0
    }

    #[test]
    fn messages_round_trip_and_garbage_is_an_error() {
        let question = TopQuestion { policy: "api".to_owned(), by: TopBy::Refused };
        assert_eq!(decode_question(&encode_message(&question)).expect("round trip"), question);
        let reply = TopReply {
            window_nanos: 7,
            summaries: vec![TopSummary {
                total: 3,
                error_bound: 1,
                entries: vec![TopEntry { key: "k".to_owned(), count: 3, error: 1 }],
            }],
        };
        assert_eq!(decode_reply(&encode_message(&reply)).expect("round trip"), reply);
        for garbage in [&b""[..], b"\x02\x00", b"\x01\xff\xff\xff\xff\xff", b"\x01\x03api\x00\x00"] {
            assert!(decode_question(garbage).is_err(), "{garbage:?}");
            assert!(decode_reply(garbage).is_err(), "{garbage:?}");
        }
    }

    #[test]
    fn keys_are_cut_on_a_character_boundary() {
        assert_eq!(cut_key(b"short", 64), "short");
        assert_eq!(cut_key("ééé".as_bytes(), 3), "é");
        assert_eq!(cut_key(b"abcdef", 4), "abcd");
        assert_eq!(cut_key(b"a\xffb", 64), "a\u{fffd}b");
    }

    #[test]
    fn half_windows_rotate_and_expire() {
        let config = TopConfig { half_window: Duration::from_secs(30), ..TopConfig::default() };
        let mut top = PolicyTop::new(Instant::ZERO, &config);
        top.record(Instant::from_nanos(SECOND), KeyHash(1), |key| key.push('a'), 5, true);
        top.record(Instant::from_nanos(31 * SECOND), KeyHash(2), |key| key.push('b'), 2, false);
        let (summaries, window) = top.summaries(Instant::from_nanos(40 * SECOND), TopBy::Demand);
        assert_eq!(window, Duration::from_secs(40));
        let answer = merge(&summaries, 10, window);
        let keys: Vec<_> = answer.entries.iter().map(|e| (e.key.as_str(), e.count)).collect();
        assert_eq!(keys, [("a", 5), ("b", 2)]);
        let (summaries, _) = top.summaries(Instant::from_nanos(65 * SECOND), TopBy::Refused);
        assert!(merge(&summaries, 10, Duration::ZERO).entries.is_empty(), "a's half-window is over");
        let (summaries, window) = top.summaries(Instant::from_nanos(200 * SECOND), TopBy::Demand);
        assert_eq!((summaries.len(), window), (1, Duration::from_secs(20)), "both expired");
        assert_eq!(summaries[0].total, 0);
    }

    #[test]
    fn the_table_records_at_most_policies_max_policies_over_all_its_shards() {
        let (table, mut shards) =
            (TopTable::new(TopConfig { policies_max: 1, ..TopConfig::default() }), shards(4));
        record(&table, &mut shards[0], "p", b"k", 1, false);
        record(&table, &mut shards[1], "q", b"k", 1, false);
        // Full from here on: the admitted set is read without its lock.
        record(&table, &mut shards[2], "p", b"j", 1, false);
        record(&table, &mut shards[3], "q", b"k", 1, false);
        assert_eq!(table.unrecorded(), 2, "q is refused in every shard, p taken in a new one");
        assert_eq!(summaries(&table, &mut shards, Instant::ZERO, "p", TopBy::Demand)[0].total, 2);
    }

    #[test]
    fn the_table_records_at_most_policies_max_policies() {
        let (table, mut shard) =
            (TopTable::new(TopConfig { policies_max: 1, ..TopConfig::default() }), shards(1));
        record(&table, &mut shard[0], "p", b"k", 1, false);
        record(&table, &mut shard[0], "q", b"k", 1, false);
        record(&table, &mut shard[0], "p", b"k", 0, true);
        assert_eq!(table.unrecorded(), 1);
        let recorded = summaries(&table, &mut shard, Instant::ZERO, "p", TopBy::Demand);
        assert_eq!(recorded[0].total, 1, "a query counts nothing");
        assert!(summaries(&table, &mut shard, Instant::ZERO, "q", TopBy::Demand).is_empty());
    }

    #[test]
    fn every_shard_is_in_the_summaries() {
        let (table, mut shards) = (TopTable::new(TopConfig::default()), shards(3));
        record(&table, &mut shards[0], "p", b"a", 2, false);
        record(&table, &mut shards[1], "p", b"b", 3, false);
        let summaries = summaries(&table, &mut shards, Instant::ZERO, "p", TopBy::Demand);
        assert_eq!(summaries.len(), 1, "one summary per half-window, whatever the shards");
        let answer = merge(&summaries, 10, Duration::from_secs(1));
        let counts: Vec<(&str, u64)> = answer.entries.iter().map(|e| (e.key.as_str(), e.count)).collect();
        assert_eq!(counts, [("b", 3), ("a", 2)]);
    }

    /// What `shard` answers for `policy`, as (key, count, error).
    fn answer(table: &TopTable, shard: &mut TopShard, policy: &str) -> Vec<(String, u64, u64)> {
        let summaries = summaries(table, std::slice::from_mut(shard), Instant::ZERO, policy, TopBy::Demand);
        let answer = merge(&summaries, 10, Duration::ZERO);
        answer.entries.into_iter().map(|e| (e.key, e.count, e.error)).collect()
    }

    #[test]
    fn buckets_answered_under_one_text_are_one_key() {
        let config = TopConfig { capacity: 2, key_bytes_max: 4, ..TopConfig::default() };
        let (table, mut shard) = (TopTable::new(config), TopShard::default());
        // "u" in its own bucket and "x" take both counters; then "u" in a tier's bucket (the
        // daemon labels it with the same text, without the label's bucket). Counted apart, the
        // tier's hits would sit in the filter (5 <= the smallest count 5): "u" answered at 5 of 10.
        record(&table, &mut shard, "p", b"u", 5, false);
        record(&table, &mut shard, "p", b"x", 5, false);
        let label = TopLabel { policy: "p", key: b"u" };
        table.record(&mut shard, Instant::ZERO, label, None, 5, false);
        assert_eq!(answer(&table, &mut shard, "p"), [("u".to_owned(), 10, 0), ("x".to_owned(), 5, 0)]);
        // Keys cut to one text, and keys whose bytes are replaced to one text, are one key too.
        record(&table, &mut shard, "q", b"abcd-1", 3, false);
        record(&table, &mut shard, "q", b"abcd-2", 4, false);
        record(&table, &mut shard, "q", b"\xff", 1, false);
        record(&table, &mut shard, "q", b"\xfe", 2, false);
        let replaced = char::REPLACEMENT_CHARACTER.to_string();
        assert_eq!(answer(&table, &mut shard, "q"), [("abcd".to_owned(), 7, 0), (replaced, 3, 0)]);
    }

    #[test]
    fn combined_shards_keep_capacity_entries_and_bound_what_they_leave_out() {
        let config = TopConfig { capacity: 2, ..TopConfig::default() };
        let (table, mut shards) = (TopTable::new(config), shards(64));
        for (shard, key, hits) in [(0, "a", 9), (1, "b", 7), (2, "c", 5), (3, "d", 1)] {
            record(&table, &mut shards[shard], "p", key.as_bytes(), hits, false);
        }
        let summaries = summaries(&table, &mut shards, Instant::ZERO, "p", TopBy::Demand);
        assert_eq!(summaries.len(), 1);
        let keys: Vec<&str> = summaries[0].entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(summaries[0].total, 22);
        assert!(summaries[0].error_bound >= 5, "c (5 hits) is left out: the bound covers it");
    }
}
