//! Dead letters in the log: a message's own dead-letter topic travels with
//! it (one that is not a topic, or is its own, is dropped as read), and a
//! dead letter the owner settled is applied as the store records it.

use super::*;
use crate::message::{DeadLetter, DeadReason};

#[tokio::test]
async fn a_dead_letter_topic_travels_with_its_message_and_a_dead_letter_applies_as_settled() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let with =
        |text: &str, to: &str| LogMessage { dead_letter_topic: Some(to.to_owned()), ..message(text, 10) };
    let line = |text: &str, deadline_ms, error: &str| SettledLine {
        id: id(text).as_bytes().to_vec(),
        at_ms: 2_000,
        outcome: Some(SettledOutcome::DeadLettered(record::SettledDeadLetter {
            topic: "t.dead".into(),
            partition: 1,
            offset: 9,
            deadline_ms,
            error: error.into(),
            tried: true,
        })),
    };
    store
        .apply(vec![
            logged(0, Change::Scheduled(with("late", "t.dead"))),
            logged(1, Change::Scheduled(with("own", "t"))),
            logged(2, Change::Scheduled(with("bad", "no such/topic"))),
            settled(3, vec![line("late", 1_010, ""), line("own", 0, "Unknown topic")]),
        ])
        .await
        .unwrap();
    let got = store.reader().get(Scope::everything(), id("late")).await.unwrap().unwrap();
    assert_eq!(got.envelope.dead_letter_topic.as_deref(), Some("t.dead"));
    let letter = |reason| {
        State::DeadLettered(DeadLetter {
            at: UnixMillis(2_000),
            topic: "t.dead".into(),
            partition: 1,
            offset: 9,
            reason,
            attempts: 1,
        })
    };
    assert_eq!(got.state, letter(DeadReason::Expired { deadline: UnixMillis(1_010) }));
    let own = store.reader().get(Scope::everything(), id("own")).await.unwrap().unwrap();
    assert_eq!(
        own.envelope.dead_letter_topic, None,
        "its own topic is no dead-letter topic: dropped as read"
    );
    assert_eq!(own.state, letter(DeadReason::Failed { error: "Unknown topic".into() }));
    let bad = store.reader().get(Scope::everything(), id("bad")).await.unwrap().unwrap();
    assert_eq!(bad.envelope.dead_letter_topic, None, "not a topic: dropped as read");
    let stats = store.reader().stats(Scope::everything(), UnixMillis(3_000)).await.unwrap();
    assert_eq!((stats.counts.pending, stats.counts.dead_lettered), (1, 2));
    store.close().await;
}

fn dead_letter_line(text: &str) -> SettledLine {
    SettledLine {
        id: id(text).as_bytes().to_vec(),
        at_ms: 2_000,
        outcome: Some(SettledOutcome::DeadLettered(record::SettledDeadLetter {
            topic: "t.dead".into(),
            partition: 0,
            offset: 4,
            deadline_ms: 1_000,
            error: String::new(),
            tried: false,
        })),
    }
}

/// A dead letter wins over a cancel that came before it, as a delivery
/// does (two nodes owned the shard at once: the record is on the topic);
/// a reschedule of a dead-lettered message takes it out of the count.
#[tokio::test]
async fn a_dead_letter_wins_over_an_earlier_cancel_and_a_re_drive_leaves_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let cancel = |offset, text: &str| {
        logged(offset, Change::Cancelled(record::Cancelled { message: Some(message(text, 10)), at_ms: 20 }))
    };
    store
        .apply(vec![
            logged(0, Change::Scheduled(message("both", 10))),
            logged(1, Change::Scheduled(message("again", 10))),
            cancel(2, "both"),
            settled(3, vec![dead_letter_line("both"), dead_letter_line("again")]),
        ])
        .await
        .unwrap();
    assert!(matches!(state(&store, "both").await, Some(State::DeadLettered(DeadLetter { offset: 4, .. }))));
    let stats = store.reader().stats(Scope::everything(), UnixMillis(3_000)).await.unwrap();
    assert_eq!((stats.counts.cancelled, stats.counts.dead_lettered, stats.counts.pending), (0, 2, 0));
    store.apply(vec![logged(4, Change::Rescheduled(message("again", 5_000)))]).await.unwrap();
    assert!(matches!(state(&store, "again").await, Some(State::Pending { .. })));
    let stats = store.reader().stats(Scope::everything(), UnixMillis(3_000)).await.unwrap();
    assert_eq!(
        (stats.counts.dead_lettered, stats.counts.pending),
        (1, 1),
        "re-driven: pending, out of the count"
    );
    store.close().await;
}
