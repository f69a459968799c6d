//! A schedule with `OnConflict::Replace`: what it does to each state of the
//! message under its id, and how it meets the dispatcher.

use super::*;

fn message(id: &str, value: &str, due: u64, on_conflict: OnConflict) -> NewMessage {
    NewMessage {
        id: NewId::Client(MessageId::parse(id).unwrap()),
        scope: Scope::everything(),
        envelope: Envelope { topic: "t".into(), value: value.into(), ..Default::default() },
        requested: DueSpec::At(UnixMillis(due)),
        due: UnixMillis(due),
        now: UnixMillis(0),
        on_conflict,
    }
}

async fn replace(store: &Store, id: &str, value: &str, due: u64) -> Result<Scheduled, StoreError> {
    store.schedule(message(id, value, due, OnConflict::Replace)).await
}

async fn value(store: &Store, id: &str) -> (Vec<u8>, UnixMillis) {
    let m = store.reader().get(Scope::everything(), MessageId::parse(id).unwrap()).await.unwrap().unwrap();
    (m.envelope.value, m.due)
}

async fn counts(store: &Store) -> (u64, u64) {
    let stats = store.reader().stats(Scope::everything(), UnixMillis(0)).await.unwrap();
    (stats.counts.pending, stats.counts.failed)
}

#[tokio::test]
async fn a_pending_message_is_replaced_in_one_step_and_a_retry_of_the_replace_is_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    park(&store, "a", 1_000).await;

    let reject = store.schedule(message("a", "new", 500, OnConflict::Reject)).await;
    assert!(matches!(reject, Err(StoreError::IdConflict(_))), "the default refuses: {reject:?}");
    assert_eq!(value(&store, "a").await, (b"a".to_vec(), UnixMillis(1_000)));

    let replaced = replace(&store, "a", "new", 500).await.unwrap();
    assert_eq!((replaced.placed, replaced.due), (Placed::Replaced, UnixMillis(500)));
    assert_eq!(value(&store, "a").await, (b"new".to_vec(), UnixMillis(500)));
    assert_eq!(counts(&store).await, (1, 0), "one message pending, as before");

    let again = replace(&store, "a", "new", 500).await.unwrap();
    assert_eq!(again.placed, Placed::Duplicate, "the same request again changes nothing");

    let created = replace(&store, "b", "b", 10).await.unwrap();
    assert_eq!(created.placed, Placed::Created, "nothing under the id: a new message");

    let taken = store.take_due(DispatchKey::MIN, UnixMillis(2_000), 10).await.unwrap();
    let sent: Vec<(&str, &[u8])> =
        taken.ready.iter().map(|r| (r.id.as_str(), r.envelope.value.as_slice())).collect();
    assert_eq!(sent, [("b", &b"b"[..]), ("a", &b"new"[..])], "the old content and due entry are gone");
    store.close().await;
}

#[tokio::test]
async fn a_delivered_or_cancelled_message_is_final_and_a_failed_one_is_armed_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for id in ["sent", "failed", "gone"] {
        park(&store, id, 10).await;
    }
    store
        .change(Intent::Cancel {
            scope: Scope::everything(),
            id: MessageId::parse("gone").unwrap(),
            now: UnixMillis(5),
            only: None,
        })
        .await
        .unwrap();
    let taken = store.take_due(DispatchKey::MIN, UnixMillis(10), 10).await.unwrap();
    let settles = taken
        .ready
        .iter()
        .map(|r| match r.id.as_str() {
            "sent" => settle(r, 11, Outcome::Delivered { partition: 0, offset: 1 }),
            _ => settle(r, 11, Outcome::Failed { error: "topic deleted".into(), tried: true }),
        })
        .collect();
    store.settle(settles, None).await.unwrap();
    barrier(&store).await;
    assert_eq!(counts(&store).await, (0, 1));

    assert!(matches!(replace(&store, "sent", "x", 20).await, Err(StoreError::AlreadyDelivered(_))));
    assert!(matches!(replace(&store, "gone", "x", 20).await, Err(StoreError::AlreadyCancelled(_))));
    assert_eq!(value(&store, "sent").await.0, b"sent", "a refused replace changes nothing");

    let armed = replace(&store, "failed", "fixed", 20).await.unwrap();
    assert_eq!(armed.placed, Placed::Replaced);
    assert_eq!(state(&store, &armed.id).await, State::Pending { attempts: 0, last_error: None });
    assert_eq!(counts(&store).await, (1, 0), "it left the failed count");
    store.close().await;
}

#[tokio::test]
async fn a_replace_of_a_message_being_produced_waits_for_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path()));
    park(&store, "late", 10).await;
    park(&store, "retried", 10).await;
    let taken = store.take_due(DispatchKey::MIN, UnixMillis(10), 10).await.unwrap();

    let late = tokio::spawn({
        let store = Arc::clone(&store);
        async move { replace(&store, "late", "too late", 50).await }
    });
    // Within a batch: the replace waits alone, the new message does not
    // wait for it to be parked.
    let batch = tokio::spawn({
        let store = Arc::clone(&store);
        async move {
            store
                .schedule_batch(vec![
                    message("retried", "second", 50, OnConflict::Replace),
                    message("fresh", "fresh", 50, OnConflict::Replace),
                ])
                .await
        }
    });
    let reader = store.reader();
    let get = |id: &str| reader.get(Scope::everything(), MessageId::parse(id).unwrap());
    // The spawned calls reach the writer when the runtime runs them: wait
    // (bounded) for the batch's new message, rather than for a barrier
    // queued maybe before them.
    for _ in 0..500 {
        barrier(&store).await;
        if get("fresh").await.unwrap().is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(get("fresh").await.unwrap().is_some(), "the batch parked what did not wait");
    assert!(!late.is_finished() && !batch.is_finished(), "both wait while the produces are out");

    let settles = taken
        .ready
        .iter()
        .map(|r| match r.id.as_str() {
            "late" => settle(r, 11, Outcome::Delivered { partition: 0, offset: 1 }),
            _ => settle(
                r,
                11,
                Outcome::Retry { retry_at: UnixMillis(40), error: "down".into(), refused: false },
            ),
        })
        .collect();
    store.settle(settles, None).await.unwrap();

    let late = late.await.unwrap();
    assert!(matches!(late, Err(StoreError::AlreadyDelivered(_))), "delivered meanwhile: {late:?}");
    let batch = batch.await.unwrap().unwrap();
    let placed: Vec<Placed> = batch.iter().map(|r| r.as_ref().unwrap().placed).collect();
    assert_eq!(placed, [Placed::Replaced, Placed::Created]);
    assert_eq!(value(&store, "retried").await, (b"second".to_vec(), UnixMillis(50)));
    assert_eq!(
        state(&store, &MessageId::parse("retried").unwrap()).await,
        State::Pending { attempts: 0, last_error: None },
        "the replacement starts with no tries"
    );
}

/// Cluster mode: a replace decided here is applied in a round that also
/// settles another message, lower in the due index. A walk of the
/// dispatcher that read the replaced entry before the commit and claims it
/// after must check it again: the hold's release disturbs every walk, not
/// only those above the round's settles.
#[tokio::test]
async fn a_walk_that_read_a_replaced_entry_checks_it_again() {
    use crate::store::writer::{Decision, Local, LogEntry, Proposed, Replica, SettledLine};
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let logged = |offset: i64, change: Replica, local: Option<Local>| LogEntry {
        offset,
        at: UnixMillis(0),
        writer: Some(1),
        change,
        local,
    };
    let parked = |id: &str, due: u64| Replica::Schedule {
        id: MessageId::parse(id).unwrap(),
        record: schema::MessageRecord::new(
            message(id, id, due, OnConflict::Reject).envelope,
            DueSpec::At(UnixMillis(due)),
            UnixMillis(due),
            0,
            UnixMillis(0),
        ),
        fresh: false,
    };
    let owner = Replica::Owner { writer: 1, released: false };
    store
        .apply(vec![
            logged(0, owner, None),
            logged(1, parked("a", 100), None),
            logged(2, parked("b", 10), None),
        ])
        .await
        .unwrap();

    let Decision::Log { id, change, held } =
        store.decide(Intent::schedule(message("a", "new", 200, OnConflict::Replace))).await.unwrap()
    else {
        panic!("a replace of a pending message is logged")
    };
    let Proposed::Schedule { record, fresh } = *change else { panic!("logged as a schedule") };
    // The dispatcher starts a walk at a's entry once the writer holds it.
    let walk = store.inner.claims.watch(DispatchKey { at: UnixMillis(100), seq: 0 });
    let b = SettledLine {
        id: MessageId::parse("b").unwrap(),
        at: UnixMillis(11),
        outcome: Outcome::Delivered { partition: 0, offset: 1 },
        handed: Handed::Alone,
    };
    let settled = Replica::Settled { chunk: vec![1], ids: Vec::new(), lines: vec![b] };
    let replace = Replica::Schedule { id: id.clone(), record, fresh };
    let held = held.map(|h| Local::Held(h.into_id()));
    store.apply(vec![logged(3, settled, None), logged(4, replace, held)]).await.unwrap();
    let (claims, undisturbed) = walk.claim_all([id].iter());
    assert_eq!(claims.len(), 1);
    assert!(!undisturbed, "the walk may have read a's old entry: it must look again");
    store.close().await;
}
