//! Applying the schedule log, and deciding before logging, against a real
//! RocksDB.

use std::path::Path;

use super::{entry, proposed};
use crate::{
    cluster::log::record::{self, Change, Entry, LogMessage, Settled, SettledLine, SettledOutcome},
    command::DispatchKey,
    command::{Answer, Handed, Intent, NewId, NewMessage, Outcome, Settle},
    message::{CancelOutcome, DueSpec, Envelope, MessageId, OnConflict, Placed, Scope, State, UnixMillis},
    store::{Decision, Durability, Local, LogEntry, Proposed, Store, StoreConfig, StoreError},
};

mod claims;
mod dead_letter;
mod expire;
mod policy;
mod replace;
mod rows;
mod series;

fn open(dir: &Path) -> Store {
    let mut config = StoreConfig::new(dir);
    config.durability = Durability::Replayed;
    Store::open(&config).unwrap()
}

fn envelope(value: &str) -> Envelope {
    Envelope {
        topic: "t".into(),
        key: None,
        value: value.as_bytes().to_vec(),
        headers: vec![],
        partition: None,
        labels: Default::default(),
        max_lateness: None,
        dead_letter_topic: None,
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

/// `writer`'s claim of the shard, at `offset`.
fn claim(offset: i64, writer: u64) -> LogEntry {
    logged_by(writer, offset, Change::Owner(record::Owner { at_ms: 1, released: false, clean: false }))
}

/// The record of a change this node decided for "a", at `offset`, as its
/// applier hands it over: with the hold it was decided under.
fn decided(offset: i64, change: Proposed, held: Option<Local>) -> LogEntry {
    let change = proposed(&id("a"), change).1;
    entry(offset, UnixMillis(0), Entry::Logged { writer: 1, request: 1, change }, held)
}

fn delivered(text: &str, offset: i64) -> SettledLine {
    SettledLine {
        id: id(text).as_bytes().to_vec(),
        at_ms: 50,
        outcome: Some(SettledOutcome::Delivered(record::Delivered {
            partition: 0,
            offset,
            in_order: true,
            ahead: false,
        })),
    }
}

fn settled(offset: i64, lines: Vec<SettledLine>) -> LogEntry {
    logged(offset, Change::Settled(Settled { lines, at_ms: 0 }))
}

async fn state(store: &Store, text: &str) -> Option<State> {
    store.reader().get(Scope::everything(), id(text)).await.unwrap().map(|m| m.state)
}

fn new_message(text: &str, value: &str, due: u64) -> NewMessage {
    NewMessage {
        id: NewId::Client(id(text)),
        scope: Scope::everything(),
        envelope: envelope(value),
        requested: DueSpec::At(UnixMillis(due)),
        due: UnixMillis(due),
        now: UnixMillis(1),
        on_conflict: OnConflict::Reject,
    }
}

/// The bytes of the store's write-ahead log files.
fn wal_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

#[tokio::test]
async fn a_view_of_the_log_writes_no_wal_and_keeps_what_it_applied_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.apply(vec![logged(0, Change::Scheduled(message("a", 10)))]).await.unwrap();
    assert_eq!(wal_bytes(dir.path()), 0, "the log is the store's WAL");
    store.close().await;
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.log_next(), 1, "written out at close");
    assert!(matches!(state(&store, "a").await, Some(State::Pending { .. })));
    store.close().await;
    // A standalone store writes ahead.
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(dir.path());
    config.durability = Durability::Buffered;
    let store = Store::open(&config).unwrap();
    store.apply(vec![logged(0, Change::Scheduled(message("a", 10)))]).await.unwrap();
    assert!(wal_bytes(dir.path()) > 0);
    store.close().await;
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
    assert!(matches!(&answers[0], Answer::Scheduled(Ok(s)) if !s.duplicate()));
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

/// The latest record of an id says what the shard holds of it, as a copy
/// built once compaction kept only that record would: a retry of the same
/// schedule changes nothing, another message under the id replaces it.
/// (The owner logs neither: it answers them from its store. They reach the
/// log only when two nodes own the shard at once, or a record is written
/// again.)
#[tokio::test]
async fn the_latest_schedule_of_an_id_says_what_it_holds_and_a_retry_changes_nothing() {
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
    assert!(matches!(&answers[1], Answer::Scheduled(Ok(s)) if s.duplicate()));
    assert!(matches!(&answers[2], Answer::Scheduled(Ok(s)) if !s.duplicate()));
    let got = store.reader().get(Scope::everything(), id("a")).await.unwrap().unwrap();
    assert_eq!(got.envelope.value, b"other");
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
    let r = store.reader().get(Scope::everything(), id("r")).await.unwrap().unwrap();
    assert!(matches!(r.state, State::Pending { .. }));
    assert_eq!(r.due, UnixMillis(500));
    assert!(matches!(state(&store, "f").await, Some(State::Failed { reason, .. }) if reason == "no topic"));
    assert_eq!(store.pending(), 1);
    assert_eq!(store.log_next(), 8);
    store.close().await;
}

/// A delivery is a fact: it wins over a cancel that came before it. A
/// cancel after it is the id's latest record, and a copy built from the
/// compacted log keeps only that: every copy records the message as
/// cancelled then, and says so. (Only a node fenced by another's claim
/// delivers a message whose cancel is logged after it.)
#[tokio::test]
async fn a_delivery_wins_over_a_cancel_that_came_first_and_a_cancel_after_it_is_the_latest_word() {
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
    assert!(matches!(&answers[4], Answer::Cancelled(Ok(CancelOutcome::Cancelled))));
    assert!(matches!(state(&store, "x").await, Some(State::Delivered(d)) if d.offset == 1));
    assert!(matches!(state(&store, "y").await, Some(State::Cancelled { .. })));
    assert_eq!(store.pending(), 0);
    store.close().await;
}

/// The `Ingress` records of earlier builds and the ingress table's rows of
/// this one are one key: the latest of either says how far a partition was
/// read, whoever wrote it (a copy rebuilt from the compacted log has lost
/// the claims before the latest).
#[tokio::test]
async fn ingress_offsets_are_kept_the_latest_winning_and_skipped_records_passed_over() {
    use crate::command::{IngressPosition, Table};
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let earlier = |topic: &str, partition, next| {
        Change::Ingress(record::Ingress { topic: topic.into(), partition, next })
    };
    let row = |topic: &str, partition, next| {
        let row = IngressPosition { topic: topic.into(), partition, next }.row();
        let crate::command::RowValue::Put(bytes) = row.value else { unreachable!() };
        Change::IngressRead(record::Row {
            key: row.key,
            value: Some(bytes),
            old_wake_ms: None,
            wake_ms: None,
        })
    };
    store
        .apply(vec![
            claim(0, 1),
            logged(1, earlier("in", 0, 10)),
            logged(2, row("in", 1, 4)),
            logged(3, earlier("in", 0, 7)),
            logged(4, row("in", 1, 9)),
            entry(5, UnixMillis(0), Entry::Skip("newer".into()), None),
            entry(6, UnixMillis(0), Entry::Forged("unsealed"), None),
            // Not the owner's: applied too.
            logged_by(2, 7, row("in", 2, 3)),
        ])
        .await
        .unwrap();
    let reader = store.reader();
    let next = async |topic: &str, partition| {
        let key = IngressPosition::key(topic, partition);
        let bytes = reader.row(Table::Ingress, key.clone()).await.unwrap()?;
        Some(IngressPosition::read(&key, &bytes).unwrap().next)
    };
    assert_eq!(next("in", 0).await, Some(7), "the latest record, as compaction keeps");
    assert_eq!(next("in", 1).await, Some(9));
    assert_eq!(next("in", 2).await, Some(3));
    assert_eq!(next("other", 0).await, None);
    assert_eq!(store.log_next(), 8, "a skipped or forged record is passed over, not retried");
    store.close().await;
}

#[tokio::test]
async fn a_decided_change_holds_its_message_until_its_record_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.apply(vec![claim(0, 1), logged(1, Change::Scheduled(message("a", 10)))]).await.unwrap();
    let Decision::Log { change, held: Some(held), .. } = store
        .decide(Intent::Cancel { scope: Scope::everything(), id: id("a"), now: UnixMillis(5), only: None })
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
            store
                .decide(Intent::Cancel {
                    scope: Scope::everything(),
                    id: id("a"),
                    now: UnixMillis(6),
                    only: None,
                })
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!second.is_finished());
    let answers = store.apply(vec![decided(2, *change, Some(Local::Held(held.into_id())))]).await.unwrap();
    assert!(matches!(&answers[0], Answer::Cancelled(Ok(CancelOutcome::Cancelled))));
    let second = second.await.unwrap().unwrap();
    assert!(matches!(second, Decision::Answer(Answer::Cancelled(Ok(CancelOutcome::AlreadyCancelled)))));
    store.close().await;
}

/// A change the front decided while its node owned the shard, applied
/// after another node's claim: applied on every copy all the same, but not
/// answered as done, since the new owner's dispatcher may have taken the
/// message first.
#[tokio::test]
async fn a_change_applied_after_another_node_s_claim_is_not_answered_as_done() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.apply(vec![claim(0, 1), logged(1, Change::Scheduled(message("a", 10)))]).await.unwrap();
    let Decision::Log { change, held: Some(held), .. } = store
        .decide(Intent::Cancel { scope: Scope::everything(), id: id("a"), now: UnixMillis(5), only: None })
        .await
        .unwrap()
    else {
        panic!("a pending message's cancel is logged")
    };
    let cancel = Entry::Logged { writer: 1, request: 3, change: proposed(&id("a"), *change).1 };
    let answers = store
        .apply(vec![claim(2, 2), entry(3, UnixMillis(0), cancel, Some(Local::Held(held.into_id())))])
        .await
        .unwrap();
    assert!(
        matches!(&answers[1], Answer::Cancelled(Err(StoreError::LogUnavailable(why))) if why.contains("moved")),
        "{:?}",
        answers[1]
    );
    assert!(matches!(state(&store, "a").await, Some(State::Cancelled { .. })), "applied all the same");
    store.close().await;
}

#[tokio::test]
async fn a_schedule_is_decided_against_the_store_and_a_second_waits_for_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let Decision::Log { change, held, .. } =
        store.decide(Intent::schedule(new_message("a", "v", 10))).await.unwrap()
    else {
        panic!("a new id is logged")
    };
    let retry = {
        let store = store.clone();
        tokio::spawn(async move { store.decide(Intent::schedule(new_message("a", "v", 10))).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!retry.is_finished(), "the retry waits for the first to be applied");
    store.apply(vec![decided(0, *change, held.map(|held| Local::Held(held.into_id())))]).await.unwrap();
    let retry = retry.await.unwrap().unwrap();
    assert!(matches!(retry, Decision::Answer(Answer::Scheduled(Ok(s))) if s.duplicate()));
    let conflict = store.decide(Intent::schedule(new_message("a", "other", 10))).await.unwrap();
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
            Entry::Logged {
                writer,
                request: 0,
                change: Change::Owner(record::Owner { at_ms: 5, released, clean: false }),
            },
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
        tokio::spawn(async move { store.decide(Intent::schedule(new_message("a", "new", 500))).await })
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
        .decide(Intent::Cancel { scope: Scope::everything(), id: id("a"), now: UnixMillis(5), only: None })
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
        store.decide(Intent::Cancel {
            scope: Scope::everything(),
            id: id("a"),
            now: UnixMillis(6),
            only: None,
        }),
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
    let claim = Change::Owner(record::Owner { at_ms: 1, released: false, clean: false });
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
        handed: Handed::InTurn,
    };
    let mut entry = settled(3, vec![delivered("a", 9)]);
    entry.local = Some(Local::Settles(vec![own], None));
    store.apply(vec![entry]).await.unwrap();
    let stats = store.reader().stats(Scope::everything(), UnixMillis(100)).await.unwrap();
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

/// One record of a generated log, before it is given its offset.
#[derive(Clone, Debug)]
enum Step {
    Schedule {
        id: usize,
        value: u8,
        due: u64,
        writer: u64,
    },
    Reschedule {
        id: usize,
        due: u64,
        writer: u64,
    },
    Cancel {
        id: usize,
        at: u64,
        writer: u64,
    },
    /// A settle's lines: (id, 0 delivered, 1 retry, 2 failed).
    Settle {
        lines: Vec<(usize, u8)>,
        writer: u64,
    },
    Claim {
        writer: u64,
        released: bool,
    },
    /// An id's tombstone.
    Forget {
        id: usize,
    },
    /// The tombstone of the n-th chunk so far, where its owner would write
    /// one: once every id it names was forgotten since.
    ForgetChunk {
        nth: usize,
    },
}

const IDS: [&str; 3] = ["a", "b", "c"];

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    let id = 0..IDS.len();
    let writer = 1u64..3;
    prop_oneof![
        3 => (id.clone(), 0u8..2, 1u64..4, writer.clone())
            .prop_map(|(id, value, due, writer)| Step::Schedule { id, value, due: due * 10, writer }),
        1 => (id.clone(), 1u64..4, writer.clone()).prop_map(|(id, due, writer)| Step::Reschedule { id, due: due * 10 + 5, writer }),
        2 => (id.clone(), 1u64..9, writer.clone()).prop_map(|(id, at, writer)| Step::Cancel { id, at, writer }),
        3 => (proptest::collection::vec((id.clone(), 0u8..3), 1..3), writer.clone())
            .prop_map(|(lines, writer)| Step::Settle { lines, writer }),
        1 => (writer, any::<bool>()).prop_map(|(writer, released)| Step::Claim { writer, released }),
        1 => id.prop_map(|id| Step::Forget { id }),
        1 => (0usize..4).prop_map(|nth| Step::ForgetChunk { nth }),
    ]
}

/// The log `steps` make: each record with its key, in offset order.
fn log_of(steps: &[Step]) -> Vec<(Vec<u8>, Entry)> {
    let mut log: Vec<(Vec<u8>, Entry)> = Vec::new();
    let mut chunks: Vec<(Vec<u8>, Vec<usize>, usize)> = Vec::new();
    // The offset of each id's latest record, and whether it was a tombstone.
    let mut latest: [Option<(usize, bool)>; IDS.len()] = [None; IDS.len()];
    let logged = |writer: u64, request: usize, change: Change| Entry::Logged {
        writer,
        request: request as u64,
        change,
    };
    for step in steps {
        let offset = log.len();
        let (key, entry) = match step.clone() {
            Step::Schedule { id, value, due, writer } => {
                let mut m = message(IDS[id], due);
                m.value = vec![b'v', value];
                (IDS[id].as_bytes().to_vec(), logged(writer, offset, Change::Scheduled(m)))
            }
            Step::Reschedule { id, due, writer } => (
                IDS[id].as_bytes().to_vec(),
                logged(writer, offset, Change::Rescheduled(message(IDS[id], due))),
            ),
            Step::Cancel { id, at, writer } => {
                let cancelled = record::Cancelled { message: Some(message(IDS[id], 10)), at_ms: at };
                (IDS[id].as_bytes().to_vec(), logged(writer, offset, Change::Cancelled(cancelled)))
            }
            Step::Settle { lines, writer } => {
                let at = 100 + offset as u64;
                let key = record::chunk_key(UnixMillis(at), writer, offset as u64);
                // A settle covers distinct produces: one line per message.
                let mut lines = lines;
                lines.dedup_by_key(|(id, _)| *id);
                lines.sort_by_key(|(id, _)| *id);
                lines.dedup_by_key(|(id, _)| *id);
                let lines: Vec<SettledLine> = lines
                    .iter()
                    .map(|(id, outcome)| {
                        let outcome = match outcome {
                            0 => SettledOutcome::Delivered(record::Delivered {
                                partition: 0,
                                offset: offset as i64,
                                in_order: false,
                                ahead: false,
                            }),
                            1 => SettledOutcome::Retry(record::Retry {
                                retry_at_ms: at + 50,
                                error: "later".into(),
                                refused: false,
                            }),
                            _ => SettledOutcome::Failed(record::SettledFailure {
                                error: "no".into(),
                                tried: true,
                            }),
                        };
                        SettledLine { id: id_bytes(*id), at_ms: at, outcome: Some(outcome) }
                    })
                    .collect();
                chunks.push((key.clone(), lines_ids(&lines), offset));
                (key.clone(), logged(writer, offset, Change::Settled(Settled { lines, at_ms: at })))
            }
            Step::Claim { writer, released } => (
                record::owner_key(),
                logged(writer, offset, Change::Owner(record::Owner { at_ms: 1, released, clean: false })),
            ),
            Step::Forget { id } => {
                (IDS[id].as_bytes().to_vec(), Entry::Forget(MessageId::parse(IDS[id]).unwrap()))
            }
            Step::ForgetChunk { nth } => {
                let Some((key, ids, at)) = chunks.get(nth).cloned() else { continue };
                let forgotten = ids.iter().all(|id| latest[*id].is_some_and(|(o, tomb)| tomb && o > at));
                if !forgotten || log.iter().any(|(k, e)| *k == key && matches!(e, Entry::ForgetChunk(_))) {
                    continue;
                }
                (key.clone(), Entry::ForgetChunk(key))
            }
        };
        if let Some(id) = IDS.iter().position(|i| i.as_bytes() == key.as_slice()) {
            latest[id] = Some((offset, matches!(entry, Entry::Forget(_))));
        }
        log.push((key, entry));
    }
    log
}

fn id_bytes(id: usize) -> Vec<u8> {
    IDS[id].as_bytes().to_vec()
}

fn lines_ids(lines: &[SettledLine]) -> Vec<usize> {
    lines.iter().filter_map(|l| IDS.iter().position(|i| i.as_bytes() == l.id.as_slice())).collect()
}

/// What Kafka's compaction leaves of `log`: the last record of each key,
/// at its offset; with `tombstones` false, also without the tombstones
/// (dropped once `delete.retention.ms` has passed).
fn compacted(log: &[(Vec<u8>, Entry)], tombstones: bool) -> Vec<(i64, Entry)> {
    log.iter()
        .enumerate()
        .filter(|(i, (key, _))| !log[i + 1..].iter().any(|(later, _)| later == key))
        .filter(|(_, (_, entry))| tombstones || !matches!(entry, Entry::Forget(_) | Entry::ForgetChunk(_)))
        .map(|(i, (_, entry))| (i as i64, entry.clone()))
        .collect()
}

/// Every message a store built from `records` holds, as `Get` shows it.
async fn applied(records: Vec<(i64, Entry)>) -> Vec<Option<crate::message::ScheduledMessage>> {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let entries =
        records.into_iter().map(|(offset, e)| entry(offset, UnixMillis(offset as u64), e, None)).collect();
    store.apply(entries).await.unwrap();
    let mut held = Vec::new();
    for text in IDS {
        let mut got = store.reader().get(Scope::everything(), id(text)).await.unwrap();
        // A delivered message drops its body with its settle or at the
        // store's next pass, as the settle came: compared once it is gone.
        if let Some(m) = got.as_mut().filter(|m| matches!(m.state, crate::message::State::Delivered(_))) {
            (m.envelope.key, m.envelope.value, m.envelope.headers) = (None, Vec::new(), Vec::new());
            m.body_dropped = true;
        }
        held.push(got);
    }
    store.close().await;
    held
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, ..Default::default() })]

    /// Compaction cannot change what a shard holds: a copy built from the
    /// whole log and one built from what compaction leaves of it (the last
    /// record of each key, with its tombstones or after they are gone)
    /// hold the same messages in the same states, whatever the records
    /// say: conflicting schedules of one id, cancels, settles of any
    /// outcome, claims by any writer, tombstones.
    #[test]
    fn a_copy_built_from_the_compacted_log_holds_what_the_whole_log_made(
        steps in proptest::collection::vec(step(), 1..24)
    ) {
        let log = log_of(&steps);
        let whole: Vec<(i64, Entry)> = log.iter().enumerate().map(|(i, (_, e))| (i as i64, e.clone())).collect();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (all, kept, gone) = runtime.block_on(async {
            (applied(whole).await, applied(compacted(&log, true)).await, applied(compacted(&log, false)).await)
        });
        proptest::prop_assert_eq!(&all, &kept, "with tombstones kept");
        proptest::prop_assert_eq!(&all, &gone, "with tombstones gone");
    }
}
