//! The live-override table: merge, bounds, chunks and file, without a network.

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
    assert!(forward.index().is_empty(), "a deletion governs no check");
    assert!(!forward.clone().merge([entry("k", 2, 9, false)]), "an older write does not come back");
}

#[test]
fn the_table_is_bounded_and_deletions_make_room() {
    let mut table = LiveTable::default();
    for i in 0..LIVE_OVERRIDES_MAX as u64 {
        table.put(entry(&format!("k{i}"), i + 1, 1, i == 0)).expect("room");
    }
    table.put(entry("new", 100, 1, false)).expect("the oldest deletion makes room");
    assert_eq!(table.put(entry("more", 101, 1, false)), Err(OverrideError::Full));
    assert_eq!(table.entries.len(), LIVE_OVERRIDES_MAX);
}

#[test]
fn entries_out_of_bounds_are_refused_and_not_merged() {
    let mut table = LiveTable::default();
    let long_key = "k".repeat(OVERRIDE_KEY_BYTES_MAX + 1);
    assert_eq!(table.put(entry("", 1, 1, false)), Err(OverrideError::Key { len: 0 }));
    assert_eq!(
        table.put(entry(&long_key, 1, 1, false)),
        Err(OverrideError::Key { len: OVERRIDE_KEY_BYTES_MAX + 1 })
    );
    let mut nameless = entry("k", 1, 1, false);
    nameless.policy.clear();
    assert_eq!(table.put(nameless.clone()), Err(OverrideError::PolicyName { len: 0 }));
    let mut wide = entry(&"k".repeat(OVERRIDE_KEY_BYTES_MAX), 1, 1, false);
    wide.policy = "p".repeat(POLICY_NAME_BYTES_MAX);
    (wide.limit, wide.burst, wide.period_ms) = (Some(u64::MAX), Some(u64::MAX), Some(u64::MAX));
    assert!(matches!(table.put(wide.clone()), Err(OverrideError::TooLong { len }) if len > ENTRY_BYTES_MAX));
    assert!(!table.merge([nameless, wide, entry(&long_key, 1, 1, false)]));
    assert_eq!(table, LiveTable::default());
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
        assert_eq!(e.bound_error(), None, "{}", serde_json::to_string(&e).expect("json").len());
        table.put(e).expect("room");
    }
    let chunks = table.chunks();
    assert!(chunks.len() <= SHARED_VALUES_MAX && chunks.iter().all(|c| c.len() <= SHARED_VALUE_BYTES_MAX));
    let mut back = LiveTable::default();
    back.merge(chunks.iter().flat_map(|c| LiveTable::parse_chunk(c)));
    assert_eq!(back, table);
    assert!(LiveTable::parse_chunk("{not json").is_empty());
}

#[test]
fn the_file_round_trips_and_reads_what_the_daemon_wrote() {
    let dir = std::env::temp_dir().join(format!("ratemesh-overrides-file-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(LiveTable::load(&dir).expect("absent is empty"), LiveTable::default());
    let mut table = LiveTable::default();
    table.put(entry("a", 1, 1, false)).expect("room");
    table.put(entry("b", 2, 1, true)).expect("room");
    table.save(&dir).expect("written");
    assert_eq!(LiveTable::load(&dir).expect("read back"), table);
    // The daemon's file before the table moved into the library.
    let written_by_the_daemon = r#"[
  {"policy": "exact", "key": "tenant:acme", "limit": 7, "deleted": false, "version_ms": 1764620000000, "writer": 2}
]"#;
    std::fs::write(dir.join(FILE_NAME), written_by_the_daemon).expect("written");
    let table = LiveTable::load(&dir).expect("read back");
    let limit = table.index()["exact"][b"tenant:acme".as_slice()];
    assert_eq!(limit, OverrideLimit { limit: Some(7), ..OverrideLimit::default() });
    std::fs::write(dir.join(FILE_NAME), "[{").expect("written");
    assert!(LiveTable::load(&dir).is_err(), "a malformed file is an error to log");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_variant_takes_the_policy_defaults() {
    use ratemesh_core::{Algorithm, Mode};
    let spec = LimitSpec::new(Algorithm::TokenBucket, 100, Duration::from_secs(60)).with_burst(150);
    let base = Policy::new(Limit::new(spec).expect("valid"), Mode::Exact);
    let same = OverrideLimit::default().variant(&base).expect("valid");
    assert_eq!(same, base, "no values: the policy itself");
    let higher =
        OverrideLimit { limit: Some(1000), ..OverrideLimit::default() }.variant(&base).expect("valid");
    assert_eq!((higher.limit.capacity(), higher.mode), (1000, Mode::Exact), "a new limit: its own burst");
    let zero = OverrideLimit { limit: Some(0), ..OverrideLimit::default() };
    assert_eq!(zero.variant(&base), Err(LimitError::ZeroLimit));
    assert_eq!(variant_name("api", &higher), "api#override:token_bucket:1000/60000000000ns:None");
}
