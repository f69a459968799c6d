//! A message past its deadline, settled expired: its state, the counts,
//! what a cancel answers, and a reschedule that re-drives it; and the
//! same through a reopen.

use super::*;

#[tokio::test]
async fn an_expired_message_is_counted_kept_and_can_be_driven_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let id = park(&store, "reminder", 10).await;
    park(&store, "sent", 10).await;
    let taken = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    let settles = taken
        .ready
        .iter()
        .map(|r| match r.id.as_str() {
            "reminder" => settle(r, 90, Outcome::Expired { deadline: UnixMillis(70) }),
            _ => settle(r, 90, Outcome::Delivered { partition: 0, offset: 1 }),
        })
        .collect();
    store.settle(settles, None).await.unwrap();
    barrier(&store).await;
    assert_eq!(state(&store, &id).await, State::Expired { at: UnixMillis(90), deadline: UnixMillis(70) });
    let stats = store.reader().stats(Scope::everything(), UnixMillis(100)).await.unwrap();
    assert_eq!((stats.counts.pending, stats.counts.expired, stats.counts.delivered), (0, 1, 1));
    let cancel =
        Intent::Cancel { scope: Scope::everything(), id: id.clone(), now: UnixMillis(95), only: None };
    let answer = store.change(cancel).await.unwrap().cancelled();
    assert!(matches!(answer, Ok(CancelOutcome::AlreadyExpired)), "{answer:?}");

    // Kept through a reopen, and counted.
    store.close().await;
    drop(store);
    let store = open(dir.path());
    assert!(state(&store, &id).await.is_expired());
    assert_eq!(store.reader().stats(Scope::everything(), UnixMillis(100)).await.unwrap().counts.expired, 1);

    let again = Intent::Reschedule { scope: Scope::everything(), id: id.clone(), due: UnixMillis(200) };
    store.change(again).await.unwrap().rescheduled().unwrap();
    assert_eq!(state(&store, &id).await, State::Pending { attempts: 0, last_error: None });
    let stats = store.reader().stats(Scope::everything(), UnixMillis(100)).await.unwrap();
    assert_eq!((stats.counts.pending, stats.counts.expired), (1, 0), "re-driven: pending, no longer expired");
    let taken = store.take_due(DispatchKey::MIN, UnixMillis(200), 10).await.unwrap();
    assert_eq!(taken.ready.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["reminder"]);
    store.close().await;
}
