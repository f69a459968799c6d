//! The claims a copy's writer lets go of when it applies what it decided.

use super::*;

/// A new schedule is held from its decision until its record is applied.
/// The commit that applies it makes its due entry visible before the hold
/// goes, and a walk of the due index may claim an overdue entry in that
/// gap: letting go of the hold must leave that claim, or the message is
/// taken again while it is being produced.
#[tokio::test]
async fn applying_a_held_schedule_leaves_a_claim_the_dispatcher_took_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let Decision::Log { change, held: Some(held), .. } =
        store.decide(Intent::schedule(new_message("a", "v", 10))).await.unwrap()
    else {
        panic!("a new id is logged and held")
    };
    // The walk between the commit's write and the hold's release.
    assert!(store.claim_for_dispatch(&id("a")), "the hold is the writer's, not a claim");
    store.apply(vec![decided(0, *change, Some(Local::Held(held.into_id())))]).await.unwrap();
    assert_eq!(store.dispatching(), 1, "the dispatcher still holds what it is producing");
    let again = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    assert!(
        again.ready.is_empty(),
        "taken twice: {:?}",
        again.ready.iter().map(|r| &r.id).collect::<Vec<_>>()
    );
    store.close().await;
}
