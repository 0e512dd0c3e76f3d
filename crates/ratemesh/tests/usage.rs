//! Refunds, charges and all-or-nothing checks through the library, on a cluster of three real
//! nodes on loopback: from a node that does not own the key, typed errors for what does not apply.

#![allow(clippy::unwrap_used)]

mod support;

use ratemesh::{AdjustError, GroupCheck, NodeId};
use ratemesh_core::{Algorithm, LimitSpec, Mode};
use std::time::Duration;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_charges_and_groups_through_a_follower() {
    let nodes = start_cluster(3).await;
    let (owner, follower) = (&nodes[0].node, &nodes[1].node);
    let policy = hourly_bucket("usage", 10, Mode::Exact);
    let key = key_owned_by(follower, &policy, owner.id());

    // A charge takes everything; a refund gives back exactly its hits, never above the capacity.
    let charged = follower.charge(&policy, &key, 10).await.unwrap();
    assert_eq!((charged.allowed, charged.remaining), (false, 0));
    let refunded = follower.refund(&policy, &key, 4).await.unwrap();
    assert_eq!((refunded.allowed, refunded.remaining), (true, 4));
    let full = follower.refund(&policy, &key, 1_000).await.unwrap();
    assert_eq!(full.remaining, 10, "never above the capacity");

    // A group whose last check refuses takes nothing from the others.
    let spent = key_owned_by(follower, &policy, NodeId(3));
    follower.charge(&policy, &spent, 10).await.unwrap();
    let other = hourly_bucket("usage-other", 5, Mode::Exact);
    let group = [
        GroupCheck::new(&policy, &key, 2),
        GroupCheck::new(&other, b"tenant", 1),
        GroupCheck::new(&policy, &spent, 1),
    ];
    let answer = follower.check_all(&group).await.unwrap();
    assert_eq!((answer.allowed, answer.refused_at, answer.decisions.len()), (false, Some(2), 3));
    assert_eq!(owner.check(&policy, &key, 0).await.unwrap().remaining, 10);
    assert_eq!(follower.check(&other, b"tenant", 0).await.unwrap().remaining, 5);
    let answer = follower.check_all(&group[..2]).await.unwrap();
    assert!(answer.allowed && answer.refused_at.is_none());
    assert_eq!(owner.check(&policy, &key, 0).await.unwrap().remaining, 8);

    // A group that one bucket can never take — its checks of the key cost more than the capacity
    // together — takes nothing and has no retry time (retrying would loop forever).
    let policy = hourly_bucket("usage-groups", 10, Mode::Exact);
    let fresh = key_owned_by(follower, &policy, owner.id());
    let twice = [GroupCheck::new(&policy, &fresh, 6), GroupCheck::new(&policy, &fresh, 6)];
    let answer = follower.check_all(&twice).await.unwrap();
    assert_eq!((answer.allowed, answer.refused_at), (false, Some(1)));
    assert_eq!(answer.decisions[1].retry_after, None, "{answer:?}");
    assert_eq!(answer.decisions[1].remaining, 10, "nothing taken");
    assert_eq!(owner.check(&policy, &fresh, 0).await.unwrap().remaining, 10);
    // A cost-0 check after the whole capacity passes only if a hit would: never, either.
    let full_then_query = [GroupCheck::new(&policy, &fresh, 10), GroupCheck::new(&policy, &fresh, 0)];
    let answer = follower.check_all(&full_then_query).await.unwrap();
    assert_eq!((answer.refused_at, answer.decisions[1].retry_after), (Some(1), None), "{answer:?}");
    // One that fits the capacity but not the bucket now: refused with a retry time, and the
    // refusal states the bucket after the give-back, not with the earlier check's hits held.
    follower.charge(&policy, &fresh, 5).await.unwrap();
    let split = [
        GroupCheck::new(&policy, &fresh, 2),
        GroupCheck::new(&policy, &fresh, 1),
        GroupCheck::new(&policy, &fresh, 0),
        GroupCheck::new(&policy, &fresh, 3),
    ];
    let answer = follower.check_all(&split).await.unwrap();
    assert_eq!((answer.allowed, answer.refused_at), (false, Some(3)));
    assert!(answer.decisions[3].retry_after.is_some(), "{answer:?}");
    assert_eq!(answer.decisions[3].remaining, 5, "{answer:?}");
    assert_eq!(owner.check(&policy, &fresh, 0).await.unwrap().remaining, 5);

    // Leases are not hits: a typed error, nothing sent.
    let spec = LimitSpec::new(Algorithm::Concurrency, 2, Duration::from_secs(60));
    let leases = support::policy("usage-leases", spec, Mode::Exact);
    assert_eq!(follower.refund(&leases, b"job", 1).await, Err(AdjustError::Concurrency));
    assert_eq!(follower.charge(&leases, b"job", 1).await, Err(AdjustError::Concurrency));
    // A refused group releases its leases, and says so in the give-back's state.
    let group = [GroupCheck::new(&leases, b"job", 1), GroupCheck::new(&policy, &fresh, 6)];
    let answer = follower.check_all(&group).await.unwrap();
    assert_eq!((answer.allowed, answer.refused_at), (false, Some(1)));
    assert_eq!((answer.decisions[0].remaining, answer.decisions[0].lease), (2, None), "{answer:?}");

    for node in nodes {
        node.shutdown().await;
    }
}
