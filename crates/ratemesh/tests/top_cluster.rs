//! Top keys across a real three-node cluster on loopback: three abusive keys among 10 000 normal
//! ones, checked through every node, come first in `Node::top` on any node, with estimates
//! within the reported bound; a member that is gone is reported missing, not fatal.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;

use ratemesh::{NamedPolicy, Node, NodeId, TopBy};
use ratemesh_core::Mode;
use support::*;
use tokio::task::JoinSet;

const NORMAL_KEYS: usize = 10_000;
const ABUSIVE_CHECKS: usize = 300;
/// Checks in flight at once (bounded load).
const IN_FLIGHT_MAX: usize = 256;

/// Runs every `(key, node)` check, at most [`IN_FLIGHT_MAX`] at once; returns the hits refused
/// per key.
async fn drive(nodes: &[Node], policy: &NamedPolicy, checks: Vec<(String, usize)>) -> HashMap<String, u64> {
    let mut refused: HashMap<String, u64> = HashMap::new();
    let mut running: JoinSet<(String, bool)> = JoinSet::new();
    for (key, at) in checks {
        if running.len() >= IN_FLIGHT_MAX {
            let (key, allowed) = running.join_next().await.unwrap().unwrap();
            *refused.entry(key).or_default() += u64::from(!allowed);
        }
        let (node, policy) = (nodes[at % nodes.len()].clone(), policy.clone());
        running.spawn(async move {
            let allowed = node.check(&policy, key.as_bytes(), 1).await.unwrap().allowed;
            (key, allowed)
        });
    }
    while let Some(joined) = running.join_next().await {
        let (key, allowed) = joined.unwrap();
        *refused.entry(key).or_default() += u64::from(!allowed);
    }
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_abusive_keys_among_ten_thousand_come_first_on_every_node() {
    let nodes = start_cluster(3).await;
    let handles: Vec<Node> = nodes.iter().map(|n| n.node.clone()).collect();
    // 20 hits an hour: normal keys (two checks each) always pass, abusive ones mostly do not.
    let policy = hourly_bucket("top", 20, Mode::Approximate);
    let abusive = ["abuser-a", "abuser-b", "abuser-c"];
    let mut checks = Vec::new();
    for i in 0..NORMAL_KEYS {
        checks.push((format!("user-{i}"), i));
        checks.push((format!("user-{i}"), i + 1));
        if i % (NORMAL_KEYS / ABUSIVE_CHECKS) == 0 {
            for (a, key) in abusive.iter().enumerate() {
                checks.push(((*key).to_owned(), i + a));
            }
        }
    }
    let demand: HashMap<String, u64> = checks.iter().fold(HashMap::new(), |mut counts, (key, _)| {
        *counts.entry(key.clone()).or_default() += 1;
        counts
    });
    let refused = drive(&handles, &policy, checks).await;
    for key in abusive {
        assert!(refused[key] >= (ABUSIVE_CHECKS - 40) as u64, "{key}: {}", refused[key]);
    }
    for (by, truth) in [(TopBy::Refused, &refused), (TopBy::Demand, &demand)] {
        for node in &handles {
            let report = node.top("top", by, 20).await;
            assert!(report.missing.is_empty(), "{:?}", report.missing);
            assert_eq!(report.answered, [NodeId(1), NodeId(2), NodeId(3)]);
            let answer = &report.answer;
            let first: Vec<&str> = answer.entries.iter().take(3).map(|e| e.key.as_str()).collect();
            let mut sorted = first.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, abusive, "{by:?} on {:?}: {:?}", node.id(), answer.entries);
            for entry in &answer.entries {
                let true_count = truth.get(&entry.key).copied().unwrap_or(0);
                assert!(
                    entry.count >= true_count && entry.count - true_count <= answer.error_bound,
                    "{by:?} {entry:?}: true {true_count}, bound {}",
                    answer.error_bound
                );
            }
            assert_eq!(answer.total, truth.values().sum::<u64>(), "{by:?}: every hit counted once");
            assert!(answer.window > std::time::Duration::ZERO);
        }
    }
    let top = handles[0].top("top", TopBy::Demand, 20).await;
    println!(
        "demand: bound {} of {} hits; top {:?}",
        top.answer.error_bound,
        top.answer.total,
        top.answer.entries.iter().take(4).map(|e| (&e.key, e.count)).collect::<Vec<_>>()
    );
    assert!(handles[1].top("unknown", TopBy::Refused, 20).await.answer.entries.is_empty());

    // A member gone (killed, not yet declared dead): the others still answer.
    let mut nodes = nodes;
    nodes.pop().unwrap().kill();
    let report = handles[0].top("top", TopBy::Refused, 20).await;
    assert!(!report.answered.contains(&NodeId(3)), "{report:?}");
    let listed = report.missing.iter().any(|m| m.id == NodeId(3));
    let dropped =
        !handles[0].members().iter().any(|m| m.id == NodeId(3) && m.status == ratemesh::MemberStatus::Live);
    assert!(listed || dropped, "{report:?}");
    assert_eq!(report.answered, [NodeId(1), NodeId(2)]);
    for node in nodes {
        node.shutdown().await;
    }
}
