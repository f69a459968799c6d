//! A replace (on_conflict REPLACE) in cluster mode: decided by the owner
//! against its store, logged as a schedule of the id, applied alike by
//! every copy.

use super::*;

fn replacing(text: &str, value: &str, due: u64) -> Intent {
    Intent::schedule(NewMessage { on_conflict: OnConflict::Replace, ..new_message(text, value, due) })
}

/// Logs what `store` decided at `offset`, applies it to `store` (which
/// holds its message) and to `copy` (a node that only follows the log),
/// and answers as `store` does.
async fn log(store: &Store, copy: &Store, offset: i64, decision: Decision) -> Answer {
    let Decision::Log { id, change, held } = decision else { panic!("not logged: {decision:?}") };
    let change = proposed(&id, *change).1;
    let entry = |local| {
        entry(offset, UnixMillis(0), Entry::Logged { writer: 1, request: 1, change: change.clone() }, local)
    };
    copy.apply(vec![claim(offset - 1, 1), entry(None)]).await.unwrap();
    let local = held.map(|held| Local::Held(held.into_id()));
    store.apply(vec![claim(offset - 1, 1), entry(local)]).await.unwrap().pop().unwrap()
}

async fn value(store: &Store, text: &str) -> Vec<u8> {
    store.reader().get(Scope::everything(), id(text)).await.unwrap().unwrap().envelope.value
}

#[tokio::test]
async fn a_replace_is_logged_as_the_new_message_and_every_copy_replaces() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (store, copy) = (open(dirs.0.path()), open(dirs.1.path()));
    let created = store.decide(Intent::schedule(new_message("a", "old", 10))).await.unwrap();
    let created = log(&store, &copy, 1, created).await.scheduled().unwrap();
    assert_eq!(created.placed, Placed::Created);

    let decided = store.decide(replacing("a", "new", 20)).await.unwrap();
    assert!(
        matches!(&decided, Decision::Log { change, .. } if matches!(&**change, Proposed::Schedule { fresh: false, .. })),
        "{decided:?}"
    );
    let taken = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    assert!(taken.ready.is_empty(), "the dispatcher does not take a message a logged change holds");
    let replaced = log(&store, &copy, 3, decided).await.scheduled().unwrap();
    assert_eq!((replaced.placed, replaced.due), (Placed::Replaced, UnixMillis(20)));
    for s in [&store, &copy] {
        assert_eq!(value(s, "a").await, b"new");
        assert_eq!(s.pending(), 1, "one message, as before");
    }
    let again = store.decide(replacing("a", "new", 20)).await.unwrap();
    assert!(matches!(again, Decision::Answer(Answer::Scheduled(Ok(s))) if s.placed == Placed::Duplicate));

    // Delivered: final, and nothing is logged.
    for s in [&store, &copy] {
        s.apply(vec![settled(5, vec![delivered("a", 7)])]).await.unwrap();
    }
    let refused = store.decide(replacing("a", "newer", 30)).await.unwrap();
    assert!(
        matches!(refused, Decision::Answer(Answer::Scheduled(Err(StoreError::AlreadyDelivered(_))))),
        "{refused:?}"
    );
    assert_eq!(value(&store, "a").await, b"new");
    store.close().await;
    copy.close().await;
}

#[tokio::test]
async fn a_replace_waits_for_the_produce_of_the_message_it_replaces() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (store, copy) = (open(dirs.0.path()), open(dirs.1.path()));
    let created = store.decide(Intent::schedule(new_message("a", "old", 10))).await.unwrap();
    log(&store, &copy, 1, created).await;
    let taken = store.take_due(DispatchKey::MIN, UnixMillis(10), 10).await.unwrap();
    assert_eq!(taken.ready.len(), 1);

    let decided = {
        let store = store.clone();
        tokio::spawn(async move { store.decide(replacing("a", "new", 20)).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!decided.is_finished(), "the replace waits while the dispatcher holds the message");
    let ready = &taken.ready[0];
    let settle = Settle {
        id: ready.id.clone(),
        key: ready.key,
        due: ready.due,
        topic: ready.envelope.topic.as_str().into(),
        tries: ready.tries,
        at: UnixMillis(11),
        outcome: Outcome::Retry { retry_at: UnixMillis(40), error: "down".into(), refused: false },
        handed: Handed::Alone,
    };
    store.settle(vec![settle], None).await.unwrap();
    let decided = decided.await.unwrap().unwrap();
    let replaced = log(&store, &copy, 3, decided).await.scheduled().unwrap();
    assert_eq!(replaced.placed, Placed::Replaced, "a produce that failed leaves it pending: replaced");
    assert_eq!(value(&store, "a").await, b"new");
    store.close().await;
    copy.close().await;
}
