//! Applying the schedule log, and deciding before logging, against a real
//! RocksDB.

use std::path::Path;

use super::{entry, proposed};
use crate::{
    cluster::log::{
        native::Native,
        record::{self, Change, Entry, LogMessage, Settled, SettledLine, SettledOutcome},
    },
    message::{CancelOutcome, DueSpec, Envelope, MessageId, Scope, State, UnixMillis},
    store::{
        Answer, Decision, Durability, Intent, Local, LogEntry, NewId, NewMessage, Outcome, Proposed, Settle,
        Store, StoreConfig, StoreError, schema::DispatchKey,
    },
};

fn open(dir: &Path) -> Store {
    let mut config = StoreConfig::new(dir);
    config.durability = Durability::Buffered;
    Store::open(&config).unwrap()
}

fn envelope(value: &str) -> Envelope {
    Envelope {
        topic: "t".into(),
        key: None,
        value: value.as_bytes().to_vec(),
        headers: vec![],
        partition: None,
    }
}

fn id(text: &str) -> MessageId {
    MessageId::parse(text).unwrap()
}

fn message(text: &str, due: u64) -> LogMessage {
    LogMessage::new(&id(text), &envelope(text), DueSpec::At(UnixMillis(due)), UnixMillis(due), UnixMillis(1))
}

fn logged(offset: i64, change: Change) -> LogEntry {
    logged_by(1, offset, change)
}

fn logged_by(writer: u64, offset: i64, change: Change) -> LogEntry {
    entry(offset, UnixMillis(0), Entry::Logged { writer, request: offset as u64, change }, None)
}

fn delivered(text: &str, offset: i64) -> SettledLine {
    SettledLine {
        id: id(text).as_bytes().to_vec(),
        at_ms: 50,
        outcome: Some(SettledOutcome::Delivered(record::Delivered { partition: 0, offset, in_order: true })),
    }
}

fn settled(offset: i64, lines: Vec<SettledLine>) -> LogEntry {
    logged(offset, Change::Settled(Settled { lines, at_ms: 0 }))
}

async fn state(store: &Store, text: &str) -> Option<State> {
    store.get(Scope::everything(), id(text)).await.unwrap().map(|m| m.state)
}

fn new_message(text: &str, value: &str, due: u64) -> NewMessage {
    NewMessage {
        id: NewId::Client(id(text)),
        scope: Scope::everything(),
        envelope: envelope(value),
        requested: DueSpec::At(UnixMillis(due)),
        due: UnixMillis(due),
        now: UnixMillis(1),
    }
}

#[tokio::test]
async fn applying_parks_settles_and_keeps_the_next_offset_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let answers = store
        .apply(vec![
            logged(0, Change::Scheduled(message("a", 10))),
            logged(1, Change::Scheduled(message("b", 20))),
            // Delivered in the same call as it was parked.
            settled(2, vec![delivered("a", 7)]),
        ])
        .await
        .unwrap();
    assert!(matches!(&answers[0], Answer::Scheduled(Ok(s)) if !s.duplicate));
    assert_eq!(store.log_next(), 3);
    assert!(matches!(state(&store, "a").await, Some(State::Delivered(d)) if d.offset == 7));
    assert!(matches!(state(&store, "b").await, Some(State::Pending { .. })));
    assert_eq!(store.pending(), 1);
    store.close().await;
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.log_next(), 3, "the next offset is committed with what it applied");
    assert!(matches!(state(&store, "a").await, Some(State::Delivered(_))));
    let due = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    assert_eq!(due.ready.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["b"], "a is not due again");
    store.close().await;
}

#[tokio::test]
async fn the_first_schedule_of_an_id_wins_and_later_ones_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut other = message("a", 10);
    other.value = b"other".to_vec();
    let answers = store
        .apply(vec![
            logged(0, Change::Scheduled(message("a", 10))),
            logged(1, Change::Scheduled(message("a", 10))),
            logged(2, Change::Scheduled(other)),
        ])
        .await
        .unwrap();
    assert!(matches!(&answers[1], Answer::Scheduled(Ok(s)) if s.duplicate));
    assert!(matches!(&answers[2], Answer::Scheduled(Err(StoreError::IdConflict(_)))));
    let got = store.get(Scope::everything(), id("a")).await.unwrap().unwrap();
    assert_eq!(got.envelope.value, b"a");
    assert_eq!(store.pending(), 1);
    store.close().await;
}

#[tokio::test]
async fn the_latest_record_of_an_id_restores_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // What compaction leaves: the latest record of each id.
    store
        .apply(vec![
            logged(5, Change::Cancelled(record::Cancelled { message: Some(message("c", 10)), at_ms: 9 })),
            logged(6, Change::Rescheduled(message("r", 500))),
            logged(
                7,
                Change::Failed(record::Failed {
                    id: id("f").as_bytes().to_vec(),
                    reason: "no topic".into(),
                    at_ms: 3,
                    message: None,
                }),
            ),
        ])
        .await
        .unwrap();
    assert!(matches!(state(&store, "c").await, Some(State::Cancelled { at }) if at == UnixMillis(9)));
    let r = store.get(Scope::everything(), id("r")).await.unwrap().unwrap();
    assert!(matches!(r.state, State::Pending { .. }));
    assert_eq!(r.due, UnixMillis(500));
    assert!(matches!(state(&store, "f").await, Some(State::Failed { reason, .. }) if reason == "no topic"));
    assert_eq!(store.pending(), 1);
    assert_eq!(store.log_next(), 8);
    store.close().await;
}

#[tokio::test]
async fn a_delivery_wins_over_a_cancel_that_came_first_and_a_cancel_after_it_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let cancel = |offset, text: &str| {
        logged(offset, Change::Cancelled(record::Cancelled { message: Some(message(text, 10)), at_ms: 20 }))
    };
    let answers = store
        .apply(vec![
            logged(0, Change::Scheduled(message("x", 10))),
            logged(1, Change::Scheduled(message("y", 10))),
            cancel(2, "x"),
            settled(3, vec![delivered("x", 1), delivered("y", 2)]),
            cancel(4, "y"),
        ])
        .await
        .unwrap();
    assert!(matches!(&answers[2], Answer::Cancelled(Ok(CancelOutcome::Cancelled))));
    assert!(matches!(&answers[4], Answer::Cancelled(Ok(CancelOutcome::AlreadyDelivered))));
    assert!(matches!(state(&store, "x").await, Some(State::Delivered(d)) if d.offset == 1));
    assert!(matches!(state(&store, "y").await, Some(State::Delivered(d)) if d.offset == 2));
    assert_eq!(store.pending(), 0);
    store.close().await;
}

#[tokio::test]
async fn native_records_schedule_cancel_and_are_refused_by_id() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let native =
        |offset, native| entry(offset, UnixMillis(0), Entry::Native { native, at: UnixMillis(100) }, None);
    let schedule = |text: &str| Native::Schedule {
        id: id(text),
        envelope: envelope(text),
        requested: DueSpec::After(std::time::Duration::from_secs(1)),
    };
    let refused = crate::cluster::log::native::Rejected {
        id: Some(id("bad")),
        reason: crate::message::Invalid::new("hourglass-topic", "is missing"),
        arrived: Box::new(crate::cluster::log::native::Arrived {
            record: crate::message::Envelope {
                topic: String::new(),
                key: None,
                value: b"what came".to_vec(),
                headers: Vec::new(),
                partition: None,
            },
            due: Some(DueSpec::After(std::time::Duration::from_secs(2))),
        }),
    };
    store
        .apply(vec![
            native(0, schedule("n1")),
            native(1, schedule("n2")),
            native(2, Native::Cancel(id("n2"))),
            entry(3, UnixMillis(0), Entry::Rejected { rejected: refused, at: UnixMillis(100) }, None),
            entry(4, UnixMillis(0), Entry::Skip("newer".into()), None),
            entry(5, UnixMillis(0), Entry::Forged("unsealed"), None),
        ])
        .await
        .unwrap();
    let n1 = store.get(Scope::everything(), id("n1")).await.unwrap().unwrap();
    assert_eq!(n1.due, UnixMillis(1_100), "a delay counts from the record's timestamp");
    assert!(matches!(state(&store, "n2").await, Some(State::Cancelled { .. })));
    assert!(
        matches!(state(&store, "bad").await, Some(State::Failed { reason, .. }) if reason.contains("hourglass-topic"))
    );
    let bad = store.get(Scope::everything(), id("bad")).await.unwrap().unwrap();
    assert_eq!(bad.envelope.value, b"what came", "shown as it arrived");
    assert_eq!(bad.due, UnixMillis(2_100), "its delay from the record's timestamp");
    assert_eq!(store.log_next(), 6, "a skipped or forged record is passed over, not retried");
    store.close().await;
}

#[tokio::test]
async fn a_decided_change_holds_its_message_until_its_record_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.apply(vec![logged(0, Change::Scheduled(message("a", 10)))]).await.unwrap();
    let Decision::Log { change, held: Some(held), .. } = store
        .decide(Intent::Cancel { scope: Scope::everything(), id: id("a"), now: UnixMillis(5) })
        .await
        .unwrap()
    else {
        panic!("a pending message's cancel is logged")
    };
    // The dispatcher cannot take it meanwhile.
    let due = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    assert!(due.ready.is_empty(), "held: not taken");
    // A second change waits for the first to be applied, then sees it.
    let second = {
        let store = store.clone();
        tokio::spawn(async move {
            store.decide(Intent::Cancel { scope: Scope::everything(), id: id("a"), now: UnixMillis(6) }).await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!second.is_finished());
    let answers = store
        .apply(vec![entry(
            1,
            UnixMillis(0),
            Entry::Logged { writer: 1, request: 1, change: proposed(&id("a"), *change).1 },
            Some(Local::Held(held.into_id())),
        )])
        .await
        .unwrap();
    assert!(matches!(&answers[0], Answer::Cancelled(Ok(CancelOutcome::Cancelled))));
    let second = second.await.unwrap().unwrap();
    assert!(matches!(second, Decision::Answer(Answer::Cancelled(Ok(CancelOutcome::AlreadyCancelled)))));
    store.close().await;
}

#[tokio::test]
async fn a_schedule_is_decided_against_the_store_and_a_second_waits_for_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let Decision::Log { change, held, .. } =
        store.decide(Intent::Schedule(new_message("a", "v", 10))).await.unwrap()
    else {
        panic!("a new id is logged")
    };
    let retry = {
        let store = store.clone();
        tokio::spawn(async move { store.decide(Intent::Schedule(new_message("a", "v", 10))).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!retry.is_finished(), "the retry waits for the first to be applied");
    store
        .apply(vec![entry(
            0,
            UnixMillis(0),
            Entry::Logged { writer: 1, request: 1, change: proposed(&id("a"), *change).1 },
            held.map(|held| Local::Held(held.into_id())),
        )])
        .await
        .unwrap();
    let retry = retry.await.unwrap().unwrap();
    assert!(matches!(retry, Decision::Answer(Answer::Scheduled(Ok(s))) if s.duplicate));
    let conflict = store.decide(Intent::Schedule(new_message("a", "other", 10))).await.unwrap();
    assert!(matches!(conflict, Decision::Answer(Answer::Scheduled(Err(StoreError::IdConflict(_))))));
    // A decided change that is never logged lets go of its hold.
    let Decision::Log { held: Some(held), .. } = store
        .decide(Intent::Reschedule { scope: Scope::everything(), id: id("a"), due: UnixMillis(50) })
        .await
        .unwrap()
    else {
        panic!("a pending message's reschedule is logged")
    };
    store.unhold(held.into_id()).await.unwrap();
    let again = store
        .decide(Intent::Reschedule { scope: Scope::everything(), id: id("a"), due: UnixMillis(60) })
        .await
        .unwrap();
    assert!(
        matches!(again, Decision::Log { change, .. } if matches!(&*change, Proposed::Reschedule { record } if record.due_ms == 60))
    );
    store.close().await;
}

#[tokio::test]
async fn two_stores_applying_one_log_agree() {
    let log = || {
        vec![
            logged(0, Change::Scheduled(message("a", 10))),
            logged(1, Change::Scheduled(message("b", 20))),
            logged(2, Change::Scheduled(message("c", 30))),
            settled(3, vec![delivered("a", 1)]),
            logged(4, Change::Rescheduled(message("b", 40))),
            logged(5, Change::Cancelled(record::Cancelled { message: Some(message("c", 30)), at_ms: 7 })),
            settled(
                6,
                vec![SettledLine {
                    id: id("b").as_bytes().to_vec(),
                    at_ms: 41,
                    outcome: Some(SettledOutcome::Retry(record::Retry {
                        retry_at_ms: 90,
                        error: "down".into(),
                        refused: false,
                    })),
                }],
            ),
        ]
    };
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (one, two) = (open(d1.path()), open(d2.path()));
    // One store applies record by record; the other in one call.
    for entry in log() {
        one.apply(vec![entry]).await.unwrap();
    }
    two.apply(log()).await.unwrap();
    for text in ["a", "b", "c"] {
        let (x, y) = (state(&one, text).await, state(&two, text).await);
        assert_eq!(format!("{x:?}"), format!("{y:?}"), "{text}");
    }
    assert!(matches!(state(&one, "b").await, Some(State::Pending { attempts: 1, .. })));
    assert_eq!((one.pending(), two.pending()), (1, 1));
    one.close().await;
    two.close().await;
}

#[tokio::test]
async fn the_last_owner_record_applied_names_the_owner_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert_eq!(store.log_owner(), 0, "no owner before any claim");
    let owner = |offset: i64, writer: u64, released: bool| {
        entry(
            offset,
            UnixMillis(0),
            Entry::Logged { writer, request: 0, change: Change::Owner(record::Owner { at_ms: 5, released }) },
            None,
        )
    };
    let answers = store
        .apply(vec![owner(0, 7, false), logged(1, Change::Scheduled(message("a", 10))), owner(2, 9, false)])
        .await
        .unwrap();
    assert!(matches!(answers[0], Answer::None));
    assert_eq!(store.log_owner(), 9, "the later claim wins");
    store.apply(vec![owner(3, 7, true)]).await.unwrap();
    assert_eq!(store.log_owner(), 9, "a release by a fenced node changes nothing");
    store.apply(vec![owner(4, 9, true)]).await.unwrap();
    assert_eq!(store.log_owner(), 0, "the owner's release leaves the shard without one");
    store.apply(vec![owner(5, 9, false)]).await.unwrap();
    assert_eq!(store.log_next(), 6);
    store.close().await;
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.log_owner(), 9, "the owner is committed with the offset");
    store.close().await;
}

#[tokio::test]
async fn retention_forgets_through_tombstones_messages_first_then_their_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let chunk = |offset: i64, at: u64, lines| {
        let entry = logged(offset, Change::Settled(Settled { lines, at_ms: at }));
        (entry, record::chunk_key(UnixMillis(at), 1, offset as u64))
    };
    let retry = SettledLine {
        id: id("c").as_bytes().to_vec(),
        at_ms: 50,
        outcome: Some(SettledOutcome::Retry(record::Retry {
            retry_at_ms: 55,
            error: "down".into(),
            refused: false,
        })),
    };
    let (first, first_key) = chunk(3, 50, vec![delivered("a", 1), delivered("b", 2), retry]);
    store
        .apply(vec![
            logged(0, Change::Scheduled(message("a", 10))),
            logged(1, Change::Scheduled(message("b", 10))),
            logged(2, Change::Scheduled(message("c", 10))),
            first,
        ])
        .await
        .unwrap();

    // Retention ended for what was delivered: chosen and held, not yet
    // forgotten; the chunk waits for c, still retrying.
    let (_, mut chosen) = store.purge_to_log(UnixMillis(100), 100).await.unwrap();
    chosen.sort_by(|x, y| x.as_str().cmp(y.as_str()));
    assert_eq!(chosen, [id("a"), id("b")]);
    assert!(matches!(state(&store, "a").await, Some(State::Delivered(_))), "forgotten only when applied");
    assert!(store.purge_to_log(UnixMillis(100), 100).await.unwrap().1.is_empty(), "chosen once");
    assert!(
        store.expired_chunks(record::chunk_key(UnixMillis(100), 0, 0), 100).await.unwrap().is_empty(),
        "c is still here"
    );
    let reuse = {
        let store = store.clone();
        tokio::spawn(async move { store.decide(Intent::Schedule(new_message("a", "new", 500))).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!reuse.is_finished(), "a new message under a held id waits for its tombstone");
    let forget = |offset, text: &str| entry(offset, UnixMillis(0), Entry::Forget(id(text)), None);
    store.apply(vec![forget(4, "a"), forget(5, "b")]).await.unwrap();
    assert_eq!((state(&store, "a").await, state(&store, "b").await), (None, None));
    assert!(matches!(reuse.await.unwrap().unwrap(), Decision::Log { .. }), "then it is logged, after it");

    // c delivered on a retry, then forgotten: both chunks may go, oldest
    // first; each once its tombstone is applied.
    let (second, second_key) = chunk(6, 60, vec![delivered("c", 3)]);
    store.apply(vec![second]).await.unwrap();
    assert_eq!(store.purge_to_log(UnixMillis(100), 100).await.unwrap().1, [id("c")]);
    assert!(store.expired_chunks(record::chunk_key(UnixMillis(100), 0, 0), 100).await.unwrap().is_empty());
    store.apply(vec![forget(7, "c")]).await.unwrap();
    assert_eq!(
        store.expired_chunks(record::chunk_key(UnixMillis(55), 0, 0), 100).await.unwrap(),
        std::slice::from_ref(&first_key),
        "by time"
    );
    assert_eq!(
        store.expired_chunks(record::chunk_key(UnixMillis(100), 0, 0), 100).await.unwrap(),
        [first_key.clone(), second_key.clone()]
    );
    let gone = entry(8, UnixMillis(0), Entry::ForgetChunk(first_key), None);
    store.apply(vec![gone]).await.unwrap();
    assert_eq!(
        store.expired_chunks(record::chunk_key(UnixMillis(100), 0, 0), 100).await.unwrap(),
        [second_key]
    );
    let (looked_at, chosen) = store.purge_to_log(UnixMillis(100), 100).await.unwrap();
    assert!(chosen.is_empty(), "nothing left to forget ({looked_at} entries looked at)");
    store.close().await;
}

#[tokio::test]
async fn a_hold_whose_caller_went_away_before_logging_is_let_go() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.apply(vec![logged(0, Change::Scheduled(message("a", 10)))]).await.unwrap();
    let Decision::Log { held: Some(held), .. } = store
        .decide(Intent::Cancel { scope: Scope::everything(), id: id("a"), now: UnixMillis(5) })
        .await
        .unwrap()
    else {
        panic!("a pending message's cancel is logged")
    };
    assert_eq!(held.id(), &id("a"));
    // The caller's deadline passed before it logged the change.
    drop(held);
    let again = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        store.decide(Intent::Cancel { scope: Scope::everything(), id: id("a"), now: UnixMillis(6) }),
    )
    .await
    .expect("a dropped hold does not keep the message held");
    assert!(matches!(again.unwrap(), Decision::Log { .. }));
    store.close().await;
}

/// A delivery the log records for a message this node's dispatcher still
/// holds (sent by a node the shard was taken from, say) settles it; the
/// dispatcher's own settle of the same message, applied later, finds it
/// settled and counts nothing again.
#[tokio::test]
async fn a_delivery_read_from_the_log_while_the_dispatcher_holds_the_message_is_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let claim = Change::Owner(record::Owner { at_ms: 1, released: false });
    store.apply(vec![logged(0, claim), logged(1, Change::Scheduled(message("a", 10)))]).await.unwrap();
    let due = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    let [ready] = &due.ready[..] else { panic!("a is due: {:?}", due.ready.len()) };
    // From a node the shard was taken from: no mark.
    let before = Change::Settled(Settled { lines: vec![delivered("a", 7)], at_ms: 0 });
    store.apply(vec![logged_by(2, 2, before)]).await.unwrap();
    assert_eq!(store.marks_of("t").await.unwrap().get(&0), None);
    assert!(matches!(state(&store, "a").await, Some(State::Delivered(d)) if d.offset == 7));
    let own = Settle {
        id: ready.id.clone(),
        key: ready.key,
        due: UnixMillis(10),
        topic: "t".into(),
        tries: ready.tries,
        at: UnixMillis(60),
        outcome: Outcome::Delivered { partition: 0, offset: 9 },
        in_order: true,
    };
    let mut entry = settled(3, vec![delivered("a", 9)]);
    entry.local = Some(Local::Settles(vec![own], None));
    store.apply(vec![entry]).await.unwrap();
    let stats = store.stats(Scope::everything(), UnixMillis(100)).await.unwrap();
    assert_eq!((stats.counts.pending, stats.counts.delivered), (0, 1), "settled once");
    assert!(
        matches!(state(&store, "a").await, Some(State::Delivered(d)) if d.offset == 7),
        "the first delivery recorded stays the message's"
    );
    assert_eq!(store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap().ready.len(), 0);
    let marks = store.marks_of("t").await.unwrap();
    assert_eq!(marks.get(&0), Some(&10), "the own in-order delivery still raises its partition's mark");
    store.close().await;
}

#[tokio::test]
async fn a_reschedule_keeps_the_due_time_first_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // A failure recorded without its message: its record says neither an
    // instant nor a delay, so its due time (none: 0) is what was asked for.
    let failed =
        record::Failed { id: id("f").as_bytes().to_vec(), reason: "x".into(), at_ms: 40, message: None };
    store.apply(vec![logged(0, Change::Failed(failed))]).await.unwrap();
    let Decision::Log { change, .. } = store
        .decide(Intent::Reschedule { scope: Scope::everything(), id: id("f"), due: UnixMillis(90) })
        .await
        .unwrap()
    else {
        panic!("a failed message's reschedule is logged")
    };
    let (key, Change::Rescheduled(m)) = proposed(&id("f"), *change) else { panic!("logged as a reschedule") };
    assert_eq!(key, id("f").as_bytes());
    assert_eq!((m.due_ms, m.requested_at_ms, m.requested_delay_ms), (90, Some(0), None));
    store.close().await;
}
