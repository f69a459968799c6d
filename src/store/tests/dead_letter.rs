//! A message that failed or expired and went to its dead-letter topic:
//! its state (where it landed, why), the counts, what a cancel answers, a
//! reschedule that re-drives it, and the same through a reopen; and the
//! marks, which a dead letter never raises on its own topic.

use std::sync::Arc;

use super::*;
use crate::{
    command::{DeadLettered, Handed},
    message::{DeadLetter, DeadReason},
};

fn dead_lettered(reason: DeadReason, offset: i64) -> Outcome {
    Outcome::DeadLettered(Box::new(DeadLettered {
        topic: Arc::from("t.dead"),
        partition: 2,
        offset,
        reason,
        tried: true,
    }))
}

#[tokio::test]
async fn a_dead_lettered_message_says_where_and_why_is_counted_and_can_be_driven_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let late = park(&store, "late", 10).await;
    let refused = park(&store, "refused", 10).await;
    let taken = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    let settles = taken
        .ready
        .iter()
        .map(|r| match r.id.as_str() {
            "late" => settle(r, 90, dead_lettered(DeadReason::Expired { deadline: UnixMillis(70) }, 5)),
            _ => settle(r, 91, dead_lettered(DeadReason::Failed { error: "Unknown topic".into() }, 6)),
        })
        .map(|mut s| {
            s.handed = Handed::InTurn;
            s
        })
        .collect();
    store.settle(settles, None).await.unwrap();
    barrier(&store).await;
    let letter = |at, offset, reason, attempts| {
        State::DeadLettered(DeadLetter {
            at: UnixMillis(at),
            topic: "t.dead".into(),
            partition: 2,
            offset,
            reason,
            attempts,
        })
    };
    assert_eq!(
        state(&store, &late).await,
        letter(90, 5, DeadReason::Expired { deadline: UnixMillis(70) }, 1)
    );
    let failed = DeadReason::Failed { error: "Unknown topic".into() };
    assert_eq!(state(&store, &refused).await, letter(91, 6, failed, 1));
    let stats = store.reader().stats(Scope::everything(), UnixMillis(100)).await.unwrap();
    assert_eq!((stats.counts.pending, stats.counts.dead_lettered, stats.counts.failed), (0, 2, 0));
    assert!(
        store.marks_of("t").await.unwrap().is_empty(),
        "a dead letter raises no mark of its message's topic"
    );
    let cancel =
        Intent::Cancel { scope: Scope::everything(), id: late.clone(), now: UnixMillis(95), only: None };
    let answer = store.change(cancel).await.unwrap().cancelled();
    assert!(matches!(answer, Ok(CancelOutcome::AlreadyDeadLettered)), "{answer:?}");

    // Kept through a reopen, and counted.
    store.close().await;
    drop(store);
    let store = open(dir.path());
    assert!(matches!(state(&store, &late).await, State::DeadLettered(_)));
    assert_eq!(
        store.reader().stats(Scope::everything(), UnixMillis(100)).await.unwrap().counts.dead_lettered,
        2
    );

    let again = Intent::Reschedule { scope: Scope::everything(), id: late.clone(), due: UnixMillis(200) };
    store.change(again).await.unwrap().rescheduled().unwrap();
    assert_eq!(state(&store, &late).await, State::Pending { attempts: 0, last_error: None });
    let stats = store.reader().stats(Scope::everything(), UnixMillis(100)).await.unwrap();
    assert_eq!((stats.counts.pending, stats.counts.dead_lettered), (1, 1), "re-driven: pending again");
    let taken = store.take_due(DispatchKey::MIN, UnixMillis(200), 10).await.unwrap();
    assert_eq!(taken.ready.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["late"]);
    store.close().await;
}
