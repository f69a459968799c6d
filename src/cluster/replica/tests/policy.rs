//! Dispatch policies in the log: written to every partition by any node,
//! so two copies may apply two changes of one policy in either order; each
//! keeps the later. A record that does not read is skipped.

use super::*;
use crate::{
    command::{Row, Table},
    policy::{PolicyKey, TopicPolicy},
};

fn change(updated_ms: u64, paused: bool) -> (Row, Change) {
    let policy =
        TopicPolicy { paused_at_ms: if paused { 5 } else { 0 }, updated_ms, ..TopicPolicy::default() };
    let write = Row::put(
        Table::Policy,
        PolicyKey::topic_wide("orders").encode(),
        prost::Message::encode_to_vec(&policy),
    );
    let change = crate::cluster::replica::row(write.clone(), None).1;
    (write, change)
}

#[tokio::test]
async fn two_copies_applying_two_changes_in_either_order_keep_the_later() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (one, other) = (open(a.path()), open(b.path()));
    let (_, paused) = change(10, true);
    let (_, resumed) = change(20, false);
    // Each in a commit of its own, and two in one.
    one.apply(vec![logged(0, paused.clone())]).await.unwrap();
    one.apply(vec![logged(1, resumed.clone())]).await.unwrap();
    other.apply(vec![logged(0, resumed.clone())]).await.unwrap();
    other.apply(vec![logged(1, paused.clone())]).await.unwrap();
    let (c, d) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (same_round, reversed) = (open(c.path()), open(d.path()));
    same_round.apply(vec![logged(0, paused.clone()), logged(1, resumed.clone())]).await.unwrap();
    reversed.apply(vec![logged(0, resumed), logged(1, paused)]).await.unwrap();
    for copy in [&same_round, &reversed] {
        assert!(copy.policies().borrow().get(&PolicyKey::topic_wide("orders")).is_none());
        copy.close().await;
    }
    let key = PolicyKey::topic_wide("orders");
    assert!(one.policies().borrow().get(&key).is_none(), "resumed last: the policy says nothing and is gone");
    assert!(other.policies().borrow().get(&key).is_none(), "the earlier pause, applied later, loses");
    let (_, paused_again) = change(30, true);
    other.apply(vec![logged(2, paused_again)]).await.unwrap();
    assert!(other.policies().borrow().get(&key).is_some_and(TopicPolicy::paused));
    one.close().await;
    other.close().await;
}

#[tokio::test]
async fn a_policy_record_that_does_not_read_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let policy = |key: Vec<u8>, value: Option<Vec<u8>>| record::Row { key, value, ..record::Row::default() };
    let bad = [
        policy(b"no separator".to_vec(), Some(Vec::new())),
        policy(PolicyKey::topic_wide("orders").encode(), Some(b"\xff\xff".to_vec())),
        policy(
            PolicyKey::topic_wide("orders").encode(),
            Some(prost::Message::encode_to_vec(&TopicPolicy {
                rate_per_second: u32::MAX,
                ..TopicPolicy::default()
            })),
        ),
        // A deletion: a policy is removed by a later, empty change.
        policy(PolicyKey::topic_wide("orders").encode(), None),
    ];
    let entries = bad.into_iter().enumerate().map(|(i, p)| logged(i as i64, Change::Policy(p))).collect();
    store.apply(entries).await.unwrap();
    assert!(store.policies().borrow().is_empty());
    assert_eq!(store.log_next(), 4, "passed over, not stuck on");
    store.close().await;
}
