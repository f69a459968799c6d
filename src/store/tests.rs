//! The store's dispatch cycle against a real RocksDB: take what is due,
//! settle it, and what each outcome leaves behind.

use std::{collections::HashMap, sync::Arc};

use super::{read::STATS_EXAMINE, schema::DispatchKey, *};
use crate::command::{DueBatch, Handed, InDoubt, Intent, NewId, NewMessage, Outcome, Ready, Settle, Tries};
use crate::message::{
    CancelOutcome, DueSpec, Envelope, MessageId, OnConflict, Placed, Scheduled, Scope, State, UnixMillis,
};

mod dead_letter;
mod expire;
mod forecast;
mod policy;
mod replace;
mod shed;

fn open(dir: &Path) -> Store {
    let mut config = StoreConfig::new(dir);
    config.durability = Durability::Buffered;
    Store::open(&config).unwrap()
}

async fn park(store: &Store, id: &str, due: u64) -> MessageId {
    park_on(store, &Scope::everything(), id, "t", due).await
}

/// Parks `id` (its value too) for `topic` in `scope`'s id space, due at `due`.
async fn park_on(store: &Store, scope: &Scope, id: &str, topic: &str, due: u64) -> MessageId {
    let envelope = Envelope {
        topic: topic.into(),
        key: None,
        value: id.as_bytes().to_vec(),
        headers: vec![],
        partition: None,
        labels: Default::default(),
        max_lateness: None,
        dead_letter_topic: None,
    };
    let msg = NewMessage {
        id: NewId::Client(scope.id(id).unwrap()),
        scope: scope.clone(),
        envelope,
        requested: DueSpec::At(UnixMillis(due)),
        due: UnixMillis(due),
        now: UnixMillis(0),
        on_conflict: OnConflict::Reject,
    };
    store.schedule(msg).await.unwrap().id
}

/// Every op queued before this one has been committed when it returns.
async fn barrier(store: &Store) {
    store.probe().await.unwrap();
}

fn settle(ready: &Ready, at: u64, outcome: Outcome) -> Settle {
    Settle {
        id: ready.id.clone(),
        key: ready.key,
        due: ready.due,
        topic: ready.envelope.topic.as_str().into(),
        tries: ready.tries,
        at: UnixMillis(at),
        outcome,
        handed: Handed::Alone,
    }
}

async fn state(store: &Store, id: &MessageId) -> State {
    store.reader().get(Scope::everything(), id.clone()).await.unwrap().unwrap().state
}

#[tokio::test]
async fn take_due_takes_in_due_order_up_to_the_limit_and_only_what_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for (id, due) in [("c", 30), ("a", 10), ("b", 20), ("later", 1_000)] {
        park(&store, id, due).await;
    }
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(100), 2).await.unwrap();
    let ids: Vec<&str> = batch.ready.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    assert!(batch.more, "more is due than the limit allowed");
    let rest = store.take_due(batch.next_from, UnixMillis(100), 10).await.unwrap();
    assert_eq!(rest.ready.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["c"]);
    assert!(!rest.more);
    assert_eq!(rest.next_dispatch_at, Some(UnixMillis(1_000)), "and when the next one is due");
    assert_eq!(store.dispatching(), 3, "what was taken is claimed");
    store.close().await;
}

#[tokio::test]
async fn a_message_inside_a_delivered_chunks_range_but_not_in_it_is_still_pending() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for (id, due) in [("a", 10), ("b", 20), ("c", 30), ("d", 40)] {
        park(&store, id, due).await;
    }
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    // a and c delivered in one chunk spanning b's key; b still in flight;
    // d delivered later, in a chunk of its own.
    let (a, b, c, d) = (&batch.ready[0], &batch.ready[1], &batch.ready[2], &batch.ready[3]);
    let first = vec![
        settle(a, 50, Outcome::Delivered { partition: 1, offset: 7 }),
        settle(c, 50, Outcome::Delivered { partition: 2, offset: 8 }),
    ];
    store.settle(first, None).await.unwrap();
    barrier(&store).await;
    store.settle(vec![settle(d, 60, Outcome::Delivered { partition: 3, offset: 9 })], None).await.unwrap();
    barrier(&store).await;

    let db = &store.inner.db;
    let mut logs = read::DeliveryLogs::default();
    let fate = |id: &MessageId, logs: &mut read::DeliveryLogs| {
        read::record_with(db, id, None, logs).unwrap().unwrap().1.map(|s| (s.partition, s.offset))
    };
    // Read through one set of decoded logs, and each on its own.
    for shared in [true, false] {
        let mut own = read::DeliveryLogs::default();
        let logs = if shared { &mut logs } else { &mut own };
        assert_eq!(fate(&a.id, logs), Some((1, 7)));
        assert_eq!(fate(&b.id, logs), None, "inside the chunk's range, not in it: pending");
        assert_eq!(fate(&c.id, logs), Some((2, 8)));
        assert_eq!(fate(&d.id, logs), Some((3, 9)), "the next chunk");
    }
    assert!(state(&store, &b.id).await.is_pending());
    store.close().await;
}

/// What the series driver reads of the occurrences it parked: in one
/// read, each is settled (delivered at the first try or later, failed),
/// pending (not due, in flight, or retrying) or gone.
#[tokio::test]
async fn settled_among_tells_settled_from_pending_in_one_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for (id, due) in [("a", 10), ("b", 20), ("c", 30), ("d", 40), ("e", 50), ("later", 1_000)] {
        park(&store, id, due).await;
    }
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    let [a, _in_flight, c, d, e] = &batch.ready[..] else { panic!("five due: {:?}", batch.ready.len()) };
    let retry = Outcome::Retry { retry_at: UnixMillis(500), error: "broker down".into(), refused: false };
    let settles = vec![
        settle(a, 60, Outcome::Delivered { partition: 0, offset: 1 }),
        settle(c, 60, Outcome::Delivered { partition: 0, offset: 2 }),
        settle(d, 60, retry),
        settle(e, 60, Outcome::Failed { error: "too large".into(), tried: true }),
    ];
    store.settle(settles, None).await.unwrap();
    barrier(&store).await;
    let ids = ["later", "e", "d", "c", "b", "gone", "a"].map(|id| MessageId::parse(id).unwrap());
    let settled = store.reader().settled_among(ids.to_vec()).await.unwrap();
    let expected = [false, true, false, true, false, true, true];
    for ((id, got), want) in ids.iter().zip(settled).zip(expected) {
        assert_eq!(
            got,
            want,
            "{id:?}: settled? its state is {:?}",
            store.reader().get(Scope::everything(), id.clone()).await
        );
        if let Ok(Some(m)) = store.reader().get(Scope::everything(), id.clone()).await {
            assert_eq!(!m.state.is_pending(), want, "{id:?} agrees with Get");
        }
    }
    assert!(store.reader().settled_among(Vec::new()).await.unwrap().is_empty());
    store.close().await;
}

#[tokio::test]
async fn take_due_skips_what_the_writer_holds() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let a = park(&store, "a", 10).await;
    park(&store, "b", 20).await;
    assert!(store.inner.claims.reserve_for_writer(&a));
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    assert_eq!(batch.ready.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(
        batch.contended,
        [(DispatchKey { at: UnixMillis(10), seq: 0 }, a.clone())],
        "to look at again"
    );
    store.inner.claims.release(&a);
    let again = store.take_listed(batch.contended).await.unwrap();
    assert_eq!(
        again.ready.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["a"],
        "once the writer let go"
    );
    store.close().await;
}

#[tokio::test]
async fn retries_carry_their_tries_until_delivered_or_failed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let ok = park(&store, "ok", 10).await;
    let bad = park(&store, "bad", 10).await;
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(10), 10).await.unwrap();
    let retry = |at| Outcome::Retry { retry_at: UnixMillis(at), error: "broker down".into(), refused: false };
    let settles = batch.ready.iter().map(|r| settle(r, 10, retry(50))).collect();
    store.settle(settles, None).await.unwrap();
    barrier(&store).await;
    assert_eq!(
        state(&store, &ok).await,
        State::Pending { attempts: 1, last_error: Some("broker down".into()) }
    );
    assert_eq!(store.dispatching(), 0, "settling gives the claims back");
    assert!(
        store.take_due(DispatchKey::MIN, UnixMillis(49), 10).await.unwrap().ready.is_empty(),
        "not before the retry time"
    );

    let batch = store.take_due(DispatchKey::MIN, UnixMillis(50), 10).await.unwrap();
    assert_eq!(batch.ready.len(), 2, "both come back at their retry time");
    assert!(batch.ready.iter().all(|r| r.tries.attempts == 1), "with the tries so far");
    let settles = batch
        .ready
        .iter()
        .map(|r| {
            if r.id == ok {
                settle(r, 51, Outcome::Delivered { partition: 3, offset: 42 })
            } else {
                settle(r, 51, Outcome::Failed { error: "topic deleted".into(), tried: true })
            }
        })
        .collect();
    store.settle(settles, None).await.unwrap();
    barrier(&store).await;
    match state(&store, &ok).await {
        State::Delivered(d) => {
            assert_eq!((d.partition, d.offset, d.delivered_at), (3, 42, UnixMillis(51)))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        state(&store, &bad).await,
        State::Failed { reason: "topic deleted".into(), attempts: 2, at: UnixMillis(51) }
    );
    assert_eq!(store.pending(), 0);
    assert!(
        store.take_due(DispatchKey::MIN, UnixMillis(10_000), 10).await.unwrap().ready.is_empty(),
        "nothing left to send"
    );
    store.close().await;
}

/// Keys in the checkpoint CF's range `range`.
fn checkpoint_keys(store: &Store, (lower, upper): (Vec<u8>, Vec<u8>)) -> usize {
    let db = &store.inner.db;
    let mut opts = rocksdb::ReadOptions::default();
    opts.set_iterate_upper_bound(upper);
    db.iterator_cf_opt(
        options::cf(db, schema::CF_CHECKPOINT),
        opts,
        rocksdb::IteratorMode::From(&lower, rocksdb::Direction::Forward),
    )
    .count()
}

/// a, b and c parked due at 10, 20 and 30, and taken due at 100.
async fn three_due(store: &Store) -> ([MessageId; 3], DueBatch) {
    let ids = [park(store, "a", 10).await, park(store, "b", 20).await, park(store, "c", 30).await];
    (ids, store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap())
}

#[tokio::test]
async fn first_try_deliveries_are_logged_by_chunk_and_read_back_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let ([a, b, c], batch) = three_due(&store).await;
    assert!(batch.ready.iter().all(|r| !r.tries.recorded), "never tried: nothing recorded yet");
    let delivered =
        |r: &Ready, offset| settle(r, 100 + offset as u64, Outcome::Delivered { partition: 2, offset });
    let settles =
        batch.ready.iter().filter(|r| r.id != b).map(|r| delivered(r, if r.id == a { 7 } else { 9 }));
    store.settle(settles.collect(), None).await.unwrap();
    barrier(&store).await;
    assert_eq!(checkpoint_keys(&store, schema::delivery_logs_range()), 1, "a and c: one chunk");
    assert_eq!(checkpoint_keys(&store, schema::settlements_range()), 0, "and no settlement of their own");
    for (id, offset) in [(&a, 7), (&c, 9)] {
        let want = State::Delivered(crate::message::Delivery {
            partition: 2,
            offset,
            delivered_at: UnixMillis(100 + offset as u64),
        });
        assert_eq!(state(&store, id).await, want, "{id}");
    }

    // b comes back after the chunk above it was logged: settled on its own.
    let late = batch.ready.iter().find(|r| r.id == b).unwrap();
    store.settle(vec![delivered(late, 8)], None).await.unwrap();
    barrier(&store).await;
    assert_eq!(checkpoint_keys(&store, schema::delivery_logs_range()), 1);
    assert_eq!(checkpoint_keys(&store, schema::settlements_range()), 1);
    assert!(matches!(state(&store, &b).await, State::Delivered(d) if d.offset == 8));
    assert_eq!(store.pending(), 0);

    // A delivery from a log is as final as one on its own.
    assert_eq!(
        store
            .change(Intent::Cancel {
                scope: Scope::everything(),
                id: a.clone(),
                now: UnixMillis(200),
                only: None
            })
            .await
            .unwrap()
            .cancelled()
            .unwrap(),
        CancelOutcome::AlreadyDelivered
    );
    assert!(matches!(
        store
            .change(Intent::Reschedule { scope: Scope::everything(), id: a.clone(), due: UnixMillis(900) })
            .await
            .unwrap()
            .rescheduled(),
        Err(StoreError::AlreadyDelivered(_))
    ));

    // Retention: the logged ones go with their log.
    assert_eq!(store.purge(UnixMillis(120), 100).await.unwrap(), 3);
    barrier(&store).await;
    for id in [&a, &b, &c] {
        assert!(store.reader().get(Scope::everything(), id.clone()).await.unwrap().is_none(), "{id} purged");
    }
    assert_eq!(checkpoint_keys(&store, schema::delivery_logs_range()), 0);
    store.close().await;
}

#[tokio::test]
async fn a_delivery_handed_over_ahead_is_settled_on_its_own_and_leaves_the_chunks_to_those_below_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let ([a, b, c], batch) = three_due(&store).await;
    let ready = |id: &MessageId| batch.ready.iter().find(|r| r.id == *id).unwrap();
    let delivered = |id: &MessageId, offset, handed| Settle {
        handed,
        ..settle(ready(id), 100 + offset as u64, Outcome::Delivered { partition: 2, offset })
    };
    // c was answered first and held long enough while a and b were not.
    store.settle(vec![delivered(&c, 9, Handed::Ahead)], None).await.unwrap();
    barrier(&store).await;
    assert_eq!(checkpoint_keys(&store, schema::delivery_logs_range()), 0, "no chunk above a and b");
    assert_eq!(checkpoint_keys(&store, schema::settlements_range()), 1, "c on its own");
    store
        .settle(vec![delivered(&a, 7, Handed::InTurn), delivered(&b, 8, Handed::InTurn)], None)
        .await
        .unwrap();
    barrier(&store).await;
    assert_eq!(checkpoint_keys(&store, schema::delivery_logs_range()), 1, "a and b: one chunk");
    assert_eq!(checkpoint_keys(&store, schema::settlements_range()), 1, "and no settlement of their own");
    for (id, offset) in [(&a, 7), (&b, 8), (&c, 9)] {
        assert!(matches!(state(&store, id).await, State::Delivered(d) if d.offset == offset), "{id}");
    }
    assert_eq!(store.pending(), 0);
    store.close().await;
}

#[tokio::test]
async fn a_retried_message_is_settled_on_its_own_and_keeps_its_record_in_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let id = park(&store, "r", 10).await;
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(10), 10).await.unwrap();
    let retry = Outcome::Retry { retry_at: UnixMillis(50), error: "too large".into(), refused: true };
    store.settle(vec![settle(&batch.ready[0], 10, retry)], None).await.unwrap();
    barrier(&store).await;
    let page =
        store.reader().list_pending(Scope::everything(), filter(DispatchKey::MIN, 10, 100)).await.unwrap();
    let (_, listed) = &page.messages[0];
    assert_eq!((listed.attempts, listed.last_error.as_deref()), (1, Some("too large")));
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(50), 10).await.unwrap();
    let ready = &batch.ready[0];
    assert_eq!(ready.envelope.value, b"r", "read whole from the due index");
    assert_eq!(
        ready.tries,
        Tries { attempts: 1, rejections: 1, first_refused_at: Some(UnixMillis(10)), recorded: true }
    );
    store
        .settle(vec![settle(ready, 60, Outcome::Delivered { partition: 0, offset: 3 })], None)
        .await
        .unwrap();
    barrier(&store).await;
    assert_eq!(checkpoint_keys(&store, schema::delivery_logs_range()), 0, "not logged in a chunk");
    match state(&store, &id).await {
        State::Delivered(d) => assert_eq!((d.offset, d.delivered_at), (3, UnixMillis(60))),
        other => panic!("{other:?}"),
    }
    store.close().await;
}

#[tokio::test]
async fn legacy_due_entries_naming_only_an_id_are_listed_and_dispatched() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let old = park(&store, "old", 10).await;
    park(&store, "new", 20).await;
    // What a store written before 0.2 holds: the id alone in the due
    // entry, the record whole in the messages CF.
    let db = &store.inner.db;
    let key = DispatchKey { at: UnixMillis(10), seq: 0 };
    let (mut record, _) = read::record(db, &old, None).unwrap().unwrap();
    record.entry_at_ms = None;
    db.put_cf(options::cf(db, schema::CF_MESSAGES), old.as_bytes(), schema::encode(&record)).unwrap();
    db.put_cf(options::cf(db, schema::CF_DUE), key.encode(), old.as_bytes()).unwrap();

    let page =
        store.reader().list_pending(Scope::everything(), filter(DispatchKey::MIN, 10, 100)).await.unwrap();
    let listed: Vec<&str> = page.messages.iter().map(|(_, m)| m.id.as_str()).collect();
    assert_eq!(listed, ["old", "new"]);
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    let read: Vec<(&str, &[u8])> =
        batch.ready.iter().map(|r| (r.id.as_str(), &r.envelope.value[..])).collect();
    assert_eq!(read, [("old", &b"old"[..]), ("new", &b"new"[..])], "in dispatch order, each read whole");
    let settles = batch.ready.iter().map(|r| settle(r, 100, Outcome::Delivered { partition: 1, offset: 5 }));
    store.settle(settles.collect(), None).await.unwrap();
    barrier(&store).await;
    assert!(matches!(state(&store, &old).await, State::Delivered(d) if d.partition == 1));
    assert_eq!(store.pending(), 0);
    store.close().await;
}

fn filter(from: DispatchKey, limit: usize, examine: usize) -> ListFilter {
    ListFilter { topic: None, selector: Default::default(), from, to: None, limit, examine }
}

#[tokio::test]
async fn listing_pages_through_pending_messages_in_dispatch_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for (id, due) in [("c", 30), ("a", 10), ("b", 20), ("d", 40)] {
        park(&store, id, due).await;
    }
    let ids = |page: &StorePage| page.messages.iter().map(|(_, m)| m.id.to_string()).collect::<Vec<_>>();
    let reader = store.reader();
    let list = |filter| reader.list_pending(Scope::everything(), filter);
    let first = list(filter(DispatchKey::MIN, 2, 100)).await.unwrap();
    assert_eq!(ids(&first), ["a", "b"]);
    let next = first.next.expect("more to come");
    let second = list(filter(next, 2, 100)).await.unwrap();
    assert_eq!(ids(&second), ["c", "d"]);
    assert_eq!(second.next, None, "the end");

    let until_30 = ListFilter { to: Some(UnixMillis(30)), ..filter(DispatchKey::MIN, 10, 100) };
    assert_eq!(ids(&list(until_30).await.unwrap()), ["a", "b"], "due_to is exclusive");

    // A filter that matches nothing stops after `examine` entries and
    // says where to go on.
    let other_topic = ListFilter { topic: Some("other".into()), ..filter(DispatchKey::MIN, 10, 3) };
    let page = list(other_topic.clone()).await.unwrap();
    assert!(page.messages.is_empty());
    let next = page.next.expect("not done");
    assert_eq!(next.at, UnixMillis(40), "three looked at, the fourth is next");
    let page = list(ListFilter { from: next, ..other_topic }).await.unwrap();
    assert_eq!((page.messages.len(), page.next), (0, None));
    store.close().await;
}

#[tokio::test]
async fn listing_and_stats_see_retries_and_settlements() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let retried = park(&store, "retried", 10).await;
    park(&store, "delivered", 20).await;
    let cancelled = park(&store, "cancelled", 30).await;
    park(&store, "failed", 40).await;
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(40), 10).await.unwrap();
    let settles = batch
        .ready
        .iter()
        .filter_map(|r| match r.id.as_str() {
            "retried" => Some(settle(
                r,
                40,
                Outcome::Retry { retry_at: UnixMillis(500), error: "broker down".into(), refused: false },
            )),
            "delivered" => Some(settle(r, 41, Outcome::Delivered { partition: 0, offset: 1 })),
            "failed" => Some(settle(r, 41, Outcome::Failed { error: "too large".into(), tried: true })),
            _ => None,
        })
        .collect();
    store.release(vec![cancelled.clone()]).await.unwrap();
    store.settle(settles, None).await.unwrap();
    barrier(&store).await;
    assert_eq!(
        store
            .change(Intent::Cancel {
                scope: Scope::everything(),
                id: cancelled,
                now: UnixMillis(42),
                only: None
            })
            .await
            .unwrap()
            .cancelled()
            .unwrap(),
        CancelOutcome::Cancelled
    );

    let page =
        store.reader().list_pending(Scope::everything(), filter(DispatchKey::MIN, 10, 100)).await.unwrap();
    assert_eq!(page.messages.len(), 1, "only what is pending: {page:?}");
    let (key, m) = &page.messages[0];
    assert_eq!(key.at, m.dispatch_at);
    assert_eq!(m.id, retried);
    assert_eq!((m.due, m.dispatch_at, m.attempts), (UnixMillis(10), UnixMillis(500), 1));
    assert_eq!(m.last_error.as_deref(), Some("broker down"));

    let stats = store.reader().stats(Scope::everything(), UnixMillis(1_000)).await.unwrap();
    let meta = &stats.meta;
    assert_eq!((meta.pending, meta.delivered_total, meta.cancelled_total, meta.failed_total), (1, 1, 1, 1));
    assert_eq!(stats.oldest_overdue.map(|m| m.id), Some(retried.clone()));
    assert!(
        store.reader().stats(Scope::everything(), UnixMillis(500)).await.unwrap().oldest_overdue.is_none(),
        "due at 500 is not overdue at 500"
    );

    let failed = MessageId::parse("failed").unwrap();
    store
        .change(Intent::Reschedule { scope: Scope::everything(), id: failed, due: UnixMillis(2_000) })
        .await
        .unwrap()
        .rescheduled()
        .unwrap();
    let meta = store.reader().stats(Scope::everything(), UnixMillis(1_000)).await.unwrap().meta;
    assert_eq!((meta.pending, meta.failed_total), (2, 0), "a re-driven failure is pending again");
    store.close().await;
}

mod scale {
    //! Reads of the due index and the retention index at a scale where what
    //! was delivered matters: delivered entries stay in the due index until
    //! retention, behind the floor; reads start there, and purging removes
    //! each chunk's entries with one range delete.

    use rocksdb::perf::{PerfContext, PerfMetric, PerfStatsLevel, set_perf_stats};

    use super::*;

    const SETTLED: u64 = 20_000;

    /// Tombstones stepped over by `read`, run on this thread.
    fn skipped<T>(read: impl FnOnce() -> T) -> (T, u64) {
        set_perf_stats(PerfStatsLevel::EnableCount);
        let mut context = PerfContext::default();
        context.reset();
        let out = read();
        (out, context.metric(PerfMetric::InternalDeleteSkippedCount))
    }

    /// The due entries from `from` up to the first one not delivered: what
    /// a read starting at `from` steps over.
    fn delivered_from(db: &rocksdb::DB, from: DispatchKey) -> u64 {
        let mut logged = read::Logged::from(db, from, None).unwrap();
        let mut n = 0;
        for item in db.iterator_cf(
            options::cf(db, schema::CF_DUE),
            rocksdb::IteratorMode::From(&from.encode(), rocksdb::Direction::Forward),
        ) {
            let key = DispatchKey::decode(&item.unwrap().0).unwrap();
            if !logged.contains(key).unwrap() {
                break;
            }
            n += 1;
        }
        n
    }

    fn message(id: &str, due: u64) -> NewMessage {
        NewMessage {
            id: NewId::Client(MessageId::parse(id).unwrap()),
            scope: Scope::everything(),
            envelope: Envelope {
                topic: "t".into(),
                key: None,
                value: b"v".to_vec(),
                headers: vec![],
                partition: None,
                labels: Default::default(),
                max_lateness: None,
                dead_letter_topic: None,
            },
            requested: DueSpec::At(UnixMillis(due)),
            due: UnixMillis(due),
            now: UnixMillis(0),
            on_conflict: OnConflict::Reject,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delivered_entries_stay_behind_the_floor_and_reads_start_there() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = StoreConfig::new(dir.path());
        config.durability = Durability::Buffered;
        let store = Store::open(&config).unwrap();
        // SETTLED messages parked, produced and delivered at their first
        // try, chunk by chunk, each chunk with the floor the dispatcher
        // would send.
        for chunk in (1..=SETTLED).collect::<Vec<_>>().chunks(5_000) {
            let msgs = chunk.iter().map(|i| message(&format!("m{i}"), *i)).collect();
            store.schedule_batch(msgs).await.unwrap();
        }
        let mut from = DispatchKey::MIN;
        loop {
            let batch = store.take_due(from, UnixMillis(SETTLED), 4_096).await.unwrap();
            from = batch.next_from;
            let settles = batch
                .ready
                .iter()
                .map(|r| Settle {
                    id: r.id.clone(),
                    key: r.key,
                    due: r.due,
                    topic: "t".into(),
                    tries: r.tries,
                    at: UnixMillis(SETTLED + 1),
                    outcome: Outcome::Delivered { partition: 0, offset: 0 },
                    handed: Handed::Alone,
                })
                .collect();
            store.settle(settles, Some(store.wake().floor(from, from))).await.unwrap();
            if !batch.more {
                break;
            }
        }
        store.probe().await.unwrap();
        let db = Arc::clone(&store.inner.db);
        assert_eq!(delivered_from(&db, DispatchKey::MIN), SETTLED, "delivered entries stay, as records");
        assert_eq!(store.wake().floor_recorded(), from, "the floor is where the walk stopped");
        assert_eq!(delivered_from(&db, store.wake().low_water()), 0, "reads start past them");
        let m1 = MessageId::parse("m1").unwrap();
        let got = store.reader().get(Scope::everything(), m1.clone()).await.unwrap().unwrap();
        assert_eq!(got.envelope.value, b"v", "a delivered message is read whole from its entry");

        // A message scheduled behind the dispatcher's position (past due)
        // is placed at it, never behind a walk: the walk from where it
        // stopped finds it, and nothing is handed over.
        store.schedule(message("late", 5)).await.unwrap();
        assert!(store.wake().take().entries.is_empty());
        let late = store
            .reader()
            .get(Scope::everything(), MessageId::parse("late").unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(late.due, UnixMillis(5), "its due time is as asked");
        let now = UnixMillis(SETTLED + 1_000);
        let batch = store.take_due(from, now, 10).await.unwrap();
        assert_eq!(batch.ready.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["late"]);
        store.inner.claims.release_dispatched(&[batch.ready[0].id.clone()]);

        // Stats and List from the start of the index give the same answers
        // as from where live entries start: delivered entries are skipped.
        let live = MessageId::parse("live").unwrap();
        store.schedule(message("live", SETTLED + 100)).await.unwrap();
        let low = store.wake().low_water();
        for start in [low, DispatchKey::MIN] {
            let stats = read::stats(&db, &Scope::everything(), now, start, STATS_EXAMINE * 10).unwrap();
            assert_eq!(stats.oldest_overdue.map(|m| m.id.as_str().to_owned()).as_deref(), Some("late"));
            let page =
                read::list_pending(&db, &Scope::everything(), &filter(start, 10, SETTLED as usize * 2))
                    .unwrap();
            let listed: Vec<&str> = page.messages.iter().map(|(_, m)| m.id.as_str()).collect();
            assert_eq!(listed, ["late", live.as_str()]);
        }
        drop(db);
        store.close().await;
        drop(store);

        // The floor outlives a restart: the dispatcher starts there.
        let store = Store::open(&config).unwrap();
        assert_eq!(store.wake().floor_recorded(), from);
        let batch = store.take_due(store.wake().floor_recorded(), now, 10).await.unwrap();
        assert_eq!(batch.ready.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["late"]);
        store.inner.claims.release_dispatched(&[batch.ready[0].id.clone()]);

        // Purge: each expired chunk goes with one range delete; the second
        // pass starts where the first stopped.
        let purged = store.purge(UnixMillis(SETTLED + 2), SETTLED as usize + 10).await.unwrap();
        assert_eq!(purged as u64, SETTLED);
        let db = Arc::clone(&store.inner.db);
        assert_eq!(delivered_from(&db, DispatchKey::MIN), 0);
        let due_entries =
            db.iterator_cf(options::cf(&db, schema::CF_DUE), rocksdb::IteratorMode::Start).count();
        assert_eq!(due_entries, 2, "late and live are left");
        assert!(store.reader().get(Scope::everything(), m1).await.unwrap().is_none());
        let cursor = store.inner.upkeep.purge.logs.lock().unwrap().clone();
        let ((), cost) = skipped(|| {
            read::purge_logs(&db, &cursor, UnixMillis(SETTLED + 2), 100).unwrap();
        });
        let (_, from_start) = skipped(|| {
            let start = schema::delivery_logs_range().0;
            read::purge_logs(&db, &start, UnixMillis(SETTLED + 2), 100).unwrap()
        });
        assert!(
            from_start >= SETTLED / 4_096,
            "from the start, a purge steps over every purged log: {from_start}"
        );
        assert!(cost < 2, "the next purge stepped over {cost} tombstones");
        store.close().await;
    }
}

#[tokio::test]
async fn marks_rise_with_deliveries_in_order_and_an_unclean_close_leaves_the_unrecorded_in_doubt() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for (id, due) in [("a", 10), ("b", 20), ("c", 30)] {
        park(&store, id, due).await;
    }
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    let (a, b, c) = (&batch.ready[0], &batch.ready[1], &batch.ready[2]);
    // Before the first produce to the topic: where its partitions end.
    store.mark("t".into(), vec![(0, 4), (1, 3)]).await.unwrap();
    let in_order =
        Settle { handed: Handed::InTurn, ..settle(a, 50, Outcome::Delivered { partition: 0, offset: 5 }) };
    // Handed over out of order (it had stalled): it raises no mark.
    let out_of_order = settle(b, 50, Outcome::Delivered { partition: 0, offset: 9 });
    store.settle(vec![in_order, out_of_order], None).await.unwrap();
    // A mark is set once; deliveries raise it.
    store.mark("t".into(), vec![(0, 100), (1, 100), (2, 7)]).await.unwrap();
    assert_eq!(store.marks_of("t").await.unwrap(), HashMap::from([(0, 6), (1, 3), (2, 7)]));
    assert!(store.marks_of("other").await.unwrap().is_empty());
    assert!(store.in_doubt_window().is_none(), "opened from nothing: nothing in doubt");

    // c was produced and never answered: the close is not clean.
    store.in_doubt(vec![c.id.clone()]).await.unwrap();
    store.close().await;
    drop(store);
    let store = open(dir.path());
    let doubt = store.in_doubt_messages(store.in_doubt_window().expect("not closed cleanly")).await.unwrap();
    assert_eq!(doubt.iter().map(|(_, m)| (m.id.as_str(), m.due.0)).collect::<Vec<_>>(), [("c", 30)]);
    assert_eq!(store.marks_of("t").await.unwrap(), HashMap::from([(0, 6), (1, 3), (2, 7)]), "kept");
    // Closed again before a search for c began: still in doubt.
    store.close().await;
    drop(store);
    let store = open(dir.path());
    assert!(store.in_doubt_window().is_some(), "closed before its search began: still in doubt");
    store.close().await;
}

#[tokio::test]
async fn after_an_unclean_close_only_what_lies_below_the_recorded_horizon_is_in_doubt() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // A backlog due in one millisecond: the horizon splits it.
    for id in ["a", "b", "c", "d"] {
        park(&store, id, 10).await;
    }
    park(&store, "later", 30).await;
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    let b = batch.ready[1].key;
    store.extend_horizon(b.successor()).await.unwrap();
    store.extend_horizon(batch.ready[0].key.successor()).await.unwrap();
    store.in_doubt(vec![batch.ready[0].id.clone()]).await.unwrap();
    store.close().await;
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.horizon_at_open(), b.successor(), "a horizon only moves on");
    let doubt = store.in_doubt_messages(store.in_doubt_window().unwrap()).await.unwrap();
    assert_eq!(
        doubt.iter().map(|(_, m)| m.id.as_str()).collect::<Vec<_>>(),
        ["a", "b"],
        "c and d were due as early, but lie past it; `later` was due past it"
    );
    store.close().await;
}

/// While a search for what an unclean stop left in doubt runs beside the
/// dispatcher, the marks the deliveries made meanwhile would raise wait:
/// after another unclean stop, the next search starts where the first
/// one's records may lie. They are written when the doubt ends; a clean
/// close before then leaves the doubt to the next open.
#[tokio::test]
async fn marks_wait_while_a_search_runs_beside_the_dispatcher() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for (id, due) in [("a", 10), ("b", 20), ("c", 30)] {
        park(&store, id, due).await;
    }
    store.mark("t".into(), vec![(0, 4)]).await.unwrap();
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    store.in_doubt(vec![batch.ready[0].id.clone()]).await.unwrap();
    store.close().await;
    drop(store);

    let store = open(dir.path());
    let window = store.in_doubt_window().expect("not closed cleanly");
    store.search_beside(window).await.unwrap();
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    let b = batch.ready.iter().find(|r| r.id.as_str() == "b").unwrap();
    let delivered =
        Settle { handed: Handed::InTurn, ..settle(b, 50, Outcome::Delivered { partition: 0, offset: 9 }) };
    store.settle(vec![delivered], None).await.unwrap();
    store.mark("u".into(), vec![(0, 7)]).await.unwrap();
    assert_eq!(store.marks_of("t").await.unwrap(), HashMap::from([(0, 4)]), "the delivery's mark waits");
    assert!(store.marks_of("u").await.unwrap().is_empty(), "a first mark waits too");
    // Stopped before the search ended: in doubt again at the next open.
    store.close().await;
    drop(store);

    let store = open(dir.path());
    let window = store.in_doubt_window().expect("the search had not ended");
    store.search_beside(window).await.unwrap();
    assert_eq!(store.marks_of("t").await.unwrap(), HashMap::from([(0, 4)]));
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    let c = batch.ready.iter().find(|r| r.id.as_str() == "c").unwrap();
    let later =
        Settle { handed: Handed::InTurn, ..settle(c, 60, Outcome::Delivered { partition: 0, offset: 12 }) };
    store.settle(vec![later], None).await.unwrap();
    store.mark("u".into(), vec![(0, 8)]).await.unwrap();
    store.doubt(None).await.unwrap();
    store.probe().await.unwrap();
    assert_eq!(store.marks_of("t").await.unwrap(), HashMap::from([(0, 13)]), "written when the doubt ends");
    assert_eq!(store.marks_of("u").await.unwrap(), HashMap::from([(0, 8)]));
    store.close().await;
    drop(store);
    let store = open(dir.path());
    assert!(store.in_doubt_window().is_none(), "closed cleanly once the search had ended");
    store.close().await;
}

/// While the search for what an earlier dispatcher produced unrecorded
/// runs, a change to a message it may find is refused as dispatching (the
/// caller retries); once it is over, the change is made.
#[tokio::test]
async fn a_message_in_doubt_is_not_changed_until_the_search_is_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let (due, later) = (park(&store, "due", 10).await, park(&store, "later", 1_000).await);
    let window =
        InDoubt { below: DispatchKey::after(UnixMillis(500)), before_seq: u64::MAX, from: DispatchKey::MIN };
    store.doubt(Some(window)).await.unwrap();
    let cancel = |id: &MessageId| Intent::Cancel {
        scope: Scope::everything(),
        id: id.clone(),
        now: UnixMillis(5),
        only: None,
    };
    let refused = store.change(cancel(&due)).await.unwrap().cancelled();
    assert!(matches!(refused, Err(StoreError::Dispatching(_))), "{refused:?}");
    let moved = store
        .change(Intent::Reschedule { scope: Scope::everything(), id: due.clone(), due: UnixMillis(2_000) })
        .await
        .unwrap()
        .rescheduled();
    assert!(matches!(moved, Err(StoreError::Dispatching(_))), "{moved:?}");
    let outside = store.change(cancel(&later)).await.unwrap().cancelled();
    assert!(matches!(outside, Ok(CancelOutcome::Cancelled)), "due past the window: {outside:?}");
    store.doubt(None).await.unwrap();
    let done = store.change(cancel(&due)).await.unwrap().cancelled();
    assert!(matches!(done, Ok(CancelOutcome::Cancelled)), "the search is over: {done:?}");
    store.close().await;
}
