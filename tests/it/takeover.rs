//! A node that takes a shard over from one that died answers no change its
//! search could still contradict: while it reads the target topics back
//! for what the dead owner produced without recording it, a cancel or
//! reschedule of a message that search may find is `UNAVAILABLE` (retry),
//! and once the search is over, the answer is what it found.

use crate::common;

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use common::{verify::*, *};
use futures_util::future;
use hourglass::proto::{self, CancelOutcome};
use tonic::Code;

use crate::cluster_nodes::{Bed, now_ms, wait_spread};

/// Two nodes; the first aborts once Kafka acknowledged the first chunk it
/// produced, before recording it (the `dispatch-before-settle` fail
/// point), so every message of its shards due at that moment is on its
/// topic and unrecorded. Meanwhile every message is cancelled through the
/// second node, over and over, until each cancel has a final answer: the
/// second node's own were delivered, and those of the dead node's shards
/// wait for it to take them, claim them and search. Before the search
/// held them, the calls that waited for the take were let in as the grace
/// ended, while the search had not yet recorded what it found: they were
/// answered CANCELLED for messages already on their topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_message_a_takeover_finds_on_its_topic_is_answered_cancelled() {
    let Bed { broker, topic, log_topic: _, dirs: _dirs, mut nodes } = Bed::start(2, 0).await;
    // The survivor joins first, so that it leads the group: Tansu 0.6 makes
    // no other member the leader once its leader died, and the survivor
    // would never be given the dead node's shards.
    nodes[1].spawn().unwrap();
    nodes[1].wait_serving(Duration::from_secs(120)).await.unwrap();
    nodes[0].env("HOURGLASS_FAILPOINT", "dispatch-before-settle");
    nodes[0].spawn().unwrap();
    nodes[0].wait_serving(Duration::from_secs(120)).await.unwrap();
    wait_spread(&nodes, &[0, 1], Duration::from_secs(60)).await;
    let client = reconnecting_client(&nodes[1].grpc, Duration::from_secs(10));
    let (run, due) = (random_name("t"), now_ms() + 3_000);
    let ids: Vec<String> = (0..240).map(|i| format!("{run}-{i}")).collect();
    for chunk in ids.chunks(60) {
        let requests = chunk.iter().map(|id| due_message(&topic, id, due)).collect();
        let results = client
            .clone()
            .schedule_batch(proto::ScheduleBatchRequest { requests })
            .await
            .unwrap()
            .into_inner()
            .results;
        for result in results {
            assert!(
                matches!(result.result, Some(proto::schedule_result::Result::Scheduled(_))),
                "{result:?}"
            );
        }
    }
    let exit = nodes[0].wait_exit(Duration::from_secs(30)).await;
    assert!(exit.is_some_and(|e| !e.success()), "node 0 reached its fail point and aborted: {exit:?}");

    let mut answered: HashMap<String, CancelOutcome> = HashMap::new();
    let (mut refused_while_searching, mut last) = (0, None);
    let started = Instant::now();
    while answered.len() < ids.len() {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "{} cancels never answered; the last refusal: {last:?}",
            ids.len() - answered.len()
        );
        let asks = ids.iter().filter(|id| !answered.contains_key(*id)).map(|id| {
            let mut client = client.clone();
            async move {
                (
                    id.clone(),
                    client.cancel(proto::CancelRequest { id: id.clone(), ..Default::default() }).await,
                )
            }
        });
        for (id, answer) in future::join_all(asks).await {
            match answer {
                Ok(reply) => {
                    answered.insert(id, reply.into_inner().outcome());
                }
                // A node that died, or a shard on the move: asked again.
                Err(status)
                    if matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Cancelled) =>
                {
                    refused_while_searching += usize::from(status.message().contains("being produced"));
                    last = Some(status);
                }
                Err(status) => panic!("cancelling {id}: {status:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let expected: HashSet<String> =
        ids.iter().filter(|id| answered[*id] != CancelOutcome::Cancelled).cloned().collect();
    let delivered = collect_async(
        broker.addr(),
        &[topic.as_str()],
        expected.clone(),
        Duration::from_secs(30),
        Duration::from_secs(3),
    )
    .await;
    let on_topic: HashSet<&str> = delivered.iter().map(|d| d.id.as_str()).collect();
    let wrongly: Vec<&String> = ids
        .iter()
        .filter(|id| answered[*id] == CancelOutcome::Cancelled && on_topic.contains(id.as_str()))
        .collect();
    let counts = answered.values().fold(HashMap::new(), |mut counts, outcome| {
        *counts.entry(format!("{outcome:?}")).or_insert(0) += 1;
        counts
    });
    eprintln!(
        "takeover cancels: {counts:?}; {} on the topic; {refused_while_searching} refused while the search ran",
        on_topic.len()
    );
    assert!(wrongly.is_empty(), "answered CANCELLED, yet on the topic: {wrongly:?}");
    assert!(
        expected.iter().all(|id| on_topic.contains(id.as_str())),
        "every message not cancelled was delivered"
    );
    let found = nodes[1].metric("hourglass_reconcile_found_total").await.unwrap();
    assert!(
        found > 0.0,
        "the dead node had produced messages its successor found on their topic: {counts:?}"
    );
    nodes[1].stop().unwrap();
}
