//! Live overrides through the library, on real nodes on loopback: an override set on one node
//! governs checks on every node once gossip brought it (waited on each node's change signal,
//! bounded), a deletion too, bad input is a typed error that changes nothing, and a node with a
//! data directory reads its table back after a restart.

#![allow(clippy::unwrap_used)]

mod support;

use std::borrow::Cow;
use std::time::{Duration, Instant as WallInstant};

use ratemesh::overrides::LIVE_OVERRIDES_MAX;
use ratemesh::{LiveOverrides, NamedPolicy, OverrideError, OverrideLimit};
use ratemesh_core::{Algorithm, CalendarWindow, Instant, LimitError, LimitParameter, LimitSpec, Mode};
use support::*;
use tokio::task::JoinSet;
use tokio::time::timeout;

/// Starts the live overrides of `node` on its own runtime (a kill stops them with it).
async fn start_overrides(node: &TestNode, data_dir: Option<std::path::PathBuf>) -> LiveOverrides {
    let handle = node.node.clone();
    node.run(async move { handle.start_live_overrides(data_dir.as_deref()) }).await
}

/// Waits on `overrides`' change signal, bounded by [`WAIT`], until a check of `key` under
/// `policy` runs under a limit of `limit`.
async fn wait_limit(overrides: &LiveOverrides, policy: &NamedPolicy, key: &[u8], limit: u64) {
    let mut changes = overrides.subscribe();
    let applied = |_: &u64| overrides.resolve(policy, key).policy().limit.reported_limit() == limit;
    let waited = timeout(WAIT, changes.wait_for(applied)).await;
    assert!(waited.is_ok_and(|r| r.is_ok()), "{key:?} not under a limit of {limit} within {WAIT:?}");
}

/// Sends `total` checks of cost 1 of `key`, each under the policy its node resolves, spread
/// round-robin over the nodes, all in flight at once; returns how many were allowed and the
/// limits the decisions carried.
async fn admitted(
    nodes: &[(ratemesh::Node, LiveOverrides)],
    policy: &NamedPolicy,
    key: &[u8],
    total: usize,
) -> (u64, Vec<u64>) {
    let mut checks = JoinSet::new();
    for i in 0..total {
        let (node, overrides) = nodes[i % nodes.len()].clone();
        let (policy, key) = (policy.clone(), key.to_vec());
        checks.spawn(async move {
            let resolved = overrides.resolve(&policy, &key).into_owned();
            node.check(&resolved, &key, 1).await.unwrap()
        });
    }
    let (mut allowed, mut limits) = (0, Vec::new());
    while let Some(decision) = checks.join_next().await {
        let decision = decision.unwrap();
        allowed += u64::from(decision.allowed);
        limits.push(decision.limit);
    }
    limits.sort_unstable();
    limits.dedup();
    (allowed, limits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_set_on_one_node_governs_every_node_and_so_does_its_deletion() {
    let nodes = start_cluster(3).await;
    let mut handles = Vec::new();
    for node in &nodes {
        handles.push((node.node.clone(), start_overrides(node, None).await));
    }
    let policy = hourly_bucket("plans", 10, Mode::Exact);
    let three = OverrideLimit { limit: Some(3), ..OverrideLimit::default() };

    let written_at = WallInstant::now();
    let written = handles[0].1.set(&policy, "customer:acme", three).unwrap();
    assert_eq!((written.writer, written.limit, written.deleted), (1, Some(3), false));
    for (node, overrides) in &handles {
        wait_limit(overrides, &policy, b"customer:acme", 3).await;
        eprintln!("node {:?} applies the override after {:?}", node.id(), written_at.elapsed());
    }
    assert_eq!(handles[2].1.list("plans"), std::slice::from_ref(&written), "every node lists it");
    assert!(handles[2].1.list("other").is_empty());

    // Every node checks the key in the override's bucket: exactly its limit, cluster-wide.
    assert_eq!(admitted(&handles, &policy, b"customer:acme", 12).await, (3, vec![3]));
    assert_eq!(admitted(&handles, &policy, b"customer:42", 12).await, (10, vec![10]), "other keys");

    // A deletion written on another node puts the key back under the policy on every node.
    let deleted = handles[1].1.remove("plans", "customer:acme").unwrap();
    assert!(deleted.deleted && deleted.version_ms > written.version_ms, "{deleted:?}");
    for (_, overrides) in &handles {
        wait_limit(overrides, &policy, b"customer:acme", 10).await;
        assert!(matches!(overrides.resolve(&policy, b"customer:acme"), Cow::Borrowed(_)));
        assert!(overrides.list("plans").is_empty());
    }
    assert_eq!(admitted(&handles, &policy, b"customer:acme", 12).await, (10, vec![10]));

    drop(handles);
    for node in nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_typed_error_and_changes_nothing() {
    let nodes = start_cluster(1).await;
    let overrides = start_overrides(&nodes[0], None).await;
    let policy = hourly_bucket("bad-input", 10, Mode::Approximate);
    let windows = support::policy(
        "windows",
        LimitSpec::new(Algorithm::FixedWindow, 10, Duration::from_secs(60)),
        Mode::Exact,
    );
    let window =
        CalendarWindow { start: Instant::from_nanos(0), end: Instant::from_nanos(86_400_000_000_000) };
    let daily = support::policy("daily", LimitSpec::calendar(100, window), Mode::Exact);
    let limit = |limit| OverrideLimit { limit: Some(limit), ..OverrideLimit::default() };
    let long_key = "k".repeat(ratemesh::overrides::OVERRIDE_KEY_BYTES_MAX + 1);

    let changes = overrides.subscribe();
    let refused = [
        (overrides.set(&policy, "", limit(5)), OverrideError::Key { len: 0 }),
        (overrides.set(&policy, &long_key, limit(5)), OverrideError::Key { len: long_key.len() }),
        (overrides.set(&policy, "k", limit(0)), OverrideError::Limit(LimitError::ZeroLimit)),
        (
            overrides.set(&windows, "k", OverrideLimit { burst: Some(5), ..OverrideLimit::default() }),
            OverrideError::Limit(LimitError::NotApplicable {
                parameter: LimitParameter::Burst,
                algorithm: Algorithm::FixedWindow,
            }),
        ),
        (overrides.set(&daily, "k", limit(5)), OverrideError::Calendar),
        (overrides.remove("", "k"), OverrideError::PolicyName { len: 0 }),
    ];
    for (result, expected) in refused {
        assert_eq!(result, Err(expected));
    }
    assert!(!changes.has_changed().unwrap(), "nothing changed");
    assert!(overrides.list("bad-input").is_empty() && overrides.list("windows").is_empty());

    // The cluster's table is bounded; a deletion stays an entry until a newer write needs its room.
    for i in 0..LIVE_OVERRIDES_MAX {
        overrides.set(&policy, &format!("key-{i}"), limit(5)).unwrap();
    }
    let full = overrides.list("bad-input");
    let version = *overrides.subscribe().borrow();
    assert_eq!(overrides.set(&policy, "one-more", limit(5)), Err(OverrideError::Full));
    assert_eq!(overrides.remove("bad-input", "never-set"), Err(OverrideError::Full));
    assert_eq!((overrides.list("bad-input"), *overrides.subscribe().borrow()), (full, version));
    overrides.remove("bad-input", "key-0").unwrap();
    overrides.set(&policy, "one-more", limit(5)).unwrap();
    assert_eq!(overrides.list("bad-input").len(), LIVE_OVERRIDES_MAX, "the deletion made room");

    drop(overrides);
    for node in nodes {
        node.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_data_directory_reads_its_overrides_back_after_a_restart() {
    let dir = std::env::temp_dir().join(format!("ratemesh-overrides-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let policy = hourly_bucket("kept", 10, Mode::Exact);
    let first = start_cluster(1).await;
    let overrides = start_overrides(&first[0], Some(dir.clone())).await;
    overrides
        .set(&policy, "customer:acme", OverrideLimit { limit: Some(4), ..OverrideLimit::default() })
        .unwrap();
    drop(overrides);
    for node in first {
        node.shutdown().await;
    }

    let again = start_cluster(1).await;
    let overrides = start_overrides(&again[0], Some(dir.clone())).await;
    assert_eq!(overrides.list("kept").len(), 1, "read back from the data directory at start");
    let resolved = overrides.resolve(&policy, b"customer:acme").into_owned();
    let decision = again[0].node.check(&resolved, b"customer:acme", 1).await.unwrap();
    assert_eq!((decision.limit, decision.remaining), (4, 3));

    drop(overrides);
    for node in again {
        node.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
