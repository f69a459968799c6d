//! A delivered message sheds its key, value and headers once its delivery
//! is on disk; what `Get` and a retried `Schedule` see of it then.

use super::*;
use crate::message::{Header, Labels};

fn message(id: &str, value: &str, trace: &str, due: u64) -> NewMessage {
    NewMessage {
        id: NewId::Client(MessageId::parse(id).unwrap()),
        scope: Scope::everything(),
        envelope: Envelope {
            topic: "t".into(),
            key: Some(b"k".to_vec()),
            value: value.into(),
            headers: vec![
                Header { key: "h".into(), value: b"x".to_vec() },
                Header { key: "traceparent".into(), value: trace.into() },
            ],
            partition: Some(2),
            labels: Labels::from_stored([("customer".to_owned(), "c-1".to_owned())]),
            max_lateness: None,
            dead_letter_topic: None,
        },
        requested: DueSpec::At(UnixMillis(due)),
        due: UnixMillis(due),
        now: UnixMillis(0),
        on_conflict: OnConflict::Reject,
    }
}

fn config(dir: &Path, keep_delivered_bodies: bool) -> StoreConfig {
    StoreConfig { durability: Durability::Buffered, keep_delivered_bodies, ..StoreConfig::new(dir) }
}

/// Delivers at their first try whatever is due by `now`, with the floor
/// the dispatcher would send.
async fn deliver_due(store: &Store, now: u64) -> usize {
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(now), 100).await.unwrap();
    let settles: Vec<Settle> = batch
        .ready
        .iter()
        .enumerate()
        .map(|(i, r)| settle(r, now, Outcome::Delivered { partition: 2, offset: 40 + i as i64 }))
        .collect();
    let n = settles.len();
    store.settle(settles, Some(store.wake().floor(batch.next_from, batch.next_from))).await.unwrap();
    barrier(store).await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_message_sheds_its_body_and_a_retry_is_still_told_from_a_different_request() {
    for keep in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), keep);
        let mut store = Store::open(&config).unwrap();
        store.schedule(message("a", "body-a", "00-aa", 1)).await.unwrap();
        store.schedule(message("b", "body-b", "00-bb", 2)).await.unwrap();
        store.schedule(message("later", "body-later", "00-cc", 1_000)).await.unwrap();
        assert_eq!(deliver_due(&store, 10).await, 2);
        assert_eq!(store.shed_delivered(true).await.unwrap(), !keep);

        for round in ["before a restart", "after a restart"] {
            let get = |id: &str| {
                let (reader, id) = (store.reader(), MessageId::parse(id).unwrap());
                async move { reader.get(Scope::everything(), id).await.unwrap().unwrap() }
            };
            let a = get("a").await;
            assert_eq!(
                a.state,
                State::Delivered(crate::message::Delivery {
                    partition: 2,
                    offset: 40,
                    delivered_at: UnixMillis(10)
                })
            );
            assert_eq!(a.envelope.topic, "t", "{round}");
            assert_eq!(a.envelope.partition, Some(2));
            assert_eq!(a.envelope.labels.iter().collect::<Vec<_>>(), [("customer", "c-1")], "{round}");
            assert_eq!((a.due, a.scheduled_at), (UnixMillis(1), UnixMillis(0)));
            if keep {
                assert!(!a.body_dropped, "{round}");
                assert_eq!(
                    (a.envelope.key.as_deref(), &a.envelope.value[..]),
                    (Some(&b"k"[..]), &b"body-a"[..])
                );
                assert_eq!(a.envelope.headers.len(), 2);
            } else {
                assert!(a.body_dropped, "{round}");
                assert_eq!((a.envelope.key, a.envelope.value, a.envelope.headers.len()), (None, vec![], 0));
            }
            assert_eq!(get("b").await.body_dropped, !keep, "the last delivered, below the floor");
            let later = get("later").await;
            assert_eq!(
                (later.body_dropped, &later.envelope.value[..]),
                (false, &b"body-later"[..]),
                "pending"
            );

            // The same request again, with its own trace: a retry.
            let again = store.schedule(message("a", "body-a", "00-dd", 1)).await.unwrap();
            assert_eq!(again.placed, Placed::Duplicate, "{round}, keep {keep}");
            for other in [message("a", "body-A", "00-aa", 1), message("a", "body-a", "00-aa", 2)] {
                let refused = store.schedule(other).await;
                assert!(
                    matches!(refused, Err(StoreError::IdConflict(_))),
                    "{round}, keep {keep}: {refused:?}"
                );
            }
            store.close().await;
            drop(store);
            store = Store::open(&config).unwrap();
        }
        store.close().await;
    }
}

/// A message delivered other than first in order (after a retry here) is
/// settled on its own: its record goes back to the messages CF without
/// its body at once, in the write that records its delivery.
#[tokio::test]
async fn a_message_delivered_after_a_retry_drops_its_body_with_its_settle() {
    for keep in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&config(dir.path(), keep)).unwrap();
        store.schedule(message("r", "body-r", "00-aa", 10)).await.unwrap();
        let batch = store.take_due(DispatchKey::MIN, UnixMillis(10), 10).await.unwrap();
        let retry = Outcome::Retry { retry_at: UnixMillis(50), error: "broker down".into(), refused: false };
        store.settle(vec![settle(&batch.ready[0], 10, retry)], None).await.unwrap();
        barrier(&store).await;
        let batch = store.take_due(DispatchKey::MIN, UnixMillis(50), 10).await.unwrap();
        let delivered = Outcome::Delivered { partition: 2, offset: 7 };
        store.settle(vec![settle(&batch.ready[0], 60, delivered)], None).await.unwrap();
        barrier(&store).await;
        let r =
            store.reader().get(Scope::everything(), MessageId::parse("r").unwrap()).await.unwrap().unwrap();
        assert!(matches!(r.state, State::Delivered(_)), "{:?}", r.state);
        assert_eq!((r.body_dropped, r.envelope.value.is_empty()), (!keep, !keep), "keep {keep}");
        assert_eq!(r.envelope.labels.iter().collect::<Vec<_>>(), [("customer", "c-1")]);
        let again = store.schedule(message("r", "body-r", "00-bb", 10)).await.unwrap();
        assert_eq!(again.placed, Placed::Duplicate, "keep {keep}");
        let other = store.schedule(message("r", "body-R", "00-aa", 10)).await;
        assert!(matches!(other, Err(StoreError::IdConflict(_))), "keep {keep}: {other:?}");
        store.close().await;
    }
}

/// A store that kept its bodies (an earlier release's, or one run with
/// `--keep-delivered-bodies`) sheds every delivered body at the first pass
/// of a run that drops them, however far below the floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_kept_its_bodies_sheds_them_all_at_its_first_pass() {
    const HOURS: u64 = 3_600_000;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&config(dir.path(), true)).unwrap();
    for (id, due) in [("old", 1), ("older-by-hours", 5 * HOURS), ("recent", 9 * HOURS)] {
        store.schedule(message(id, id, "00-aa", due)).await.unwrap();
    }
    assert_eq!(deliver_due(&store, 10 * HOURS).await, 3);
    assert!(!store.shed_delivered(true).await.unwrap(), "kept: no pass");
    store.close().await;
    drop(store);

    let store = Store::open(&config(dir.path(), false)).unwrap();
    assert!(store.shed_delivered(true).await.unwrap());
    for id in ["old", "older-by-hours", "recent"] {
        let got =
            store.reader().get(Scope::everything(), MessageId::parse(id).unwrap()).await.unwrap().unwrap();
        assert!(got.body_dropped, "{id}");
    }
    store.close().await;
}
