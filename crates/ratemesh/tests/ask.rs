//! The application's questions between members (`Node::ask`, `Node::answer_queries`) on a real
//! two-node cluster: answered by the asked member's handler over the transport, by this node's
//! own handler without it, refused clearly when there is no handler, no member, or no room.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use ratemesh::{APP_QUESTION_LEN_MAX, AskError, NodeId};
use support::*;

const LIMIT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_answers_with_its_handler_and_knows_who_asked() {
    let nodes = start_cluster(2).await;
    let (one, two) = (nodes[0].node.clone(), nodes[1].node.clone());
    // Before node 2 sets a handler, it answers nothing.
    let asked = one.clone();
    let early = nodes[0].run(async move { asked.ask(NodeId(2), b"hello", LIMIT).await }).await;
    assert!(matches!(early, Err(AskError::NotAnswered)), "{early:?}");

    let handler = Arc::new(|from: NodeId, question: &[u8]| {
        let mut answer = format!("{}:", from.0).into_bytes();
        answer.extend(question.iter().rev());
        answer
    });
    assert!(two.answer_queries(handler.clone()));
    assert!(!two.answer_queries(handler.clone()), "the handler is set once");
    assert!(one.answer_queries(handler));

    let asked = one.clone();
    let answer = nodes[0].run(async move { asked.ask(NodeId(2), b"abc", LIMIT).await }).await.unwrap();
    assert_eq!(answer, b"1:cba", "node 2's handler, told the asker from its certificate");
    // A question to itself is answered by its own handler.
    let answer = one.ask(NodeId(1), b"xy", LIMIT).await.unwrap();
    assert_eq!(answer, b"1:yx");
    // The largest question goes through; one byte more is refused before sending.
    let big = vec![7u8; APP_QUESTION_LEN_MAX];
    let asked = one.clone();
    let answer = nodes[0].run(async move { asked.ask(NodeId(2), &big, LIMIT).await }).await.unwrap();
    assert_eq!(answer.len(), APP_QUESTION_LEN_MAX + 2);
    let too_big = vec![7u8; APP_QUESTION_LEN_MAX + 1];
    assert!(matches!(one.ask(NodeId(2), &too_big, LIMIT).await, Err(AskError::QuestionLen { .. })));
    assert!(matches!(one.ask(NodeId(2), b"", LIMIT).await, Err(AskError::QuestionLen { len_bytes: 0 })));
    assert!(matches!(one.ask(NodeId(9), b"q", LIMIT).await, Err(AskError::NotLive(NodeId(9)))));
    // The top-keys questions still reach their own handler (the tag keeps them apart).
    let report = nodes[0].run(async move { one.top("none", ratemesh::TopBy::Demand, 5).await }).await;
    assert!(report.missing.is_empty(), "{:?}", report.missing);
}
