//! Seeds given by DNS name (`crate::seeds`): a node seeded only with `localhost:<port>` (resolved
//! through `/etc/hosts` by the library's own resolver, not by chitchat) joins the cluster, and
//! both nodes see each other live.

mod support;

use ratemesh::{NodeId, Seed};
use support::{SECRET, TestNode, builder, wait_live};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_seeded_by_name_joins() {
    let first = TestNode::start(builder(1, SECRET, &[])).await;
    let port = first.node.gossip_addr().port();
    let by_name: Seed = format!("localhost:{port}").parse().expect("a seed name");
    assert!(matches!(by_name, Seed::Host(_)), "{by_name:?}");
    let second = TestNode::start(builder(2, SECRET, &[]).seeds([by_name])).await;
    let both = [NodeId(1), NodeId(2)];
    wait_live(&second.node, &both).await;
    wait_live(&first.node, &both).await;
    second.shutdown().await;
    first.shutdown().await;
}
