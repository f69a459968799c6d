//! What the store does for dispatch policies: it keeps them through a
//! reopen and tells watchers of each change, and it walks one lane of the
//! due index (one topic, for one tenant or all) apart from the rest.

use std::sync::Arc;

use super::*;
use crate::{
    command::{Handed, Intent, Row, Table},
    message::Tenant,
    policy::{PolicyKey, TopicPolicy},
};

async fn park_to(store: &Store, tenant: Option<&str>, id: &str, topic: &str, due: u64) {
    store.schedule(new_message(tenant, id, topic, due)).await.unwrap();
}

fn lane(topic: &str, tenant: Option<&str>) -> PolicyKey {
    PolicyKey { topic: topic.into(), tenant: tenant.map(|t| Tenant::parse(t).unwrap()) }
}

/// The ids taken, with their tenants.
fn ids(batch: &DueBatch) -> Vec<String> {
    batch
        .ready
        .iter()
        .map(|r| format!("{}{}", r.id.tenant().map_or(String::new(), |t| format!("{t}/")), r.id.as_str()))
        .collect()
}

#[tokio::test]
async fn policies_are_kept_through_a_reopen_and_watchers_see_each_change() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut watch = store.policies();
    assert!(watch.borrow_and_update().is_empty());
    let key = PolicyKey { tenant: Some(Tenant::parse("acme").unwrap()), topic: "orders".into() };
    let paused = TopicPolicy { paused_at_ms: 42, rate_per_second: 10, ..TopicPolicy::default() };
    let write = |policy: &TopicPolicy| {
        vec![Row::put(Table::Policy, key.encode(), prost::Message::encode_to_vec(policy))]
    };
    store.write_rows(write(&paused)).await.unwrap();
    assert!(watch.has_changed().unwrap(), "watchers are told");
    assert_eq!(watch.borrow_and_update().get(&key), Some(&paused));
    store.close().await;
    drop(store);

    let store = open(dir.path());
    assert_eq!(store.policies().borrow().get(&key), Some(&paused), "kept through a reopen");
    store.write_rows(write(&TopicPolicy::default())).await.unwrap();
    assert!(store.policies().borrow().is_empty(), "a policy that says nothing is removed");
    store.close().await;
    drop(store);
    assert!(open(dir.path()).policies().borrow().is_empty(), "and stays removed");
}

#[tokio::test]
async fn a_lane_walk_takes_its_topic_and_tenant_only_and_stops_where_it_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    park_to(&store, None, "a1", "a", 10).await;
    park_to(&store, None, "b1", "b", 20).await;
    park_to(&store, Some("acme"), "a2", "a", 30).await;
    park_to(&store, Some("other"), "a3", "a", 40).await;
    park_to(&store, None, "a4", "a", 50).await;
    park_to(&store, None, "a5", "a", 5_000).await;
    let everything = DispatchKey::after(UnixMillis(100));

    let all_of_a = store.take_lane(lane("a", None), DispatchKey::MIN, everything, 10).await.unwrap();
    assert_eq!(
        ids(&all_of_a),
        ["a1", "acme/a2", "other/a3", "a4"],
        "every tenant's, in due order, nothing later"
    );
    assert!(!all_of_a.more);
    store.release(all_of_a.ready.iter().map(|r| r.id.clone()).collect()).await.unwrap();
    barrier(&store).await;

    let acme = store.take_lane(lane("a", Some("acme")), DispatchKey::MIN, everything, 10).await.unwrap();
    assert_eq!(ids(&acme), ["acme/a2"], "one tenant's");
    let first = store.take_lane(lane("a", None), DispatchKey::MIN, everything, 1).await.unwrap();
    assert_eq!(ids(&first), ["a1"], "up to the limit");
    assert!(first.more);
    let rest = store.take_lane(lane("a", None), first.next_from, everything, 10).await.unwrap();
    assert_eq!(
        ids(&rest),
        ["other/a3", "a4"],
        "from where the last stopped; what is claimed is not taken again"
    );
    let until =
        store.take_lane(lane("b", None), DispatchKey::MIN, DispatchKey::after(UnixMillis(15)), 10).await;
    assert!(until.unwrap().ready.is_empty(), "nothing at or past where the walk is told to stop");
    store.close().await;
}

#[tokio::test]
async fn a_listed_entry_delivered_at_its_first_try_since_is_stale_not_due_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    park_to(&store, None, "a1", "a", 10).await;
    park_to(&store, None, "a2", "a", 20).await;
    // Listed (put off with its topic, say), then taken and delivered by
    // a walk of its lane.
    let walked =
        store.take_lane(lane("a", None), DispatchKey::MIN, DispatchKey::after(UnixMillis(100)), 1).await;
    let walked = walked.unwrap();
    assert_eq!(ids(&walked), ["a1"]);
    let key_of_a1 = walked.ready[0].key;
    let delivered = settle(&walked.ready[0], 50, Outcome::Delivered { partition: 0, offset: 1 });
    store.settle(vec![Settle { handed: Handed::InTurn, ..delivered }], None).await.unwrap();
    barrier(&store).await;
    let listed = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    let a2 = listed.ready.iter().find(|r| r.id.as_str() == "a2").unwrap().key;
    store.release(listed.ready.iter().map(|r| r.id.clone()).collect()).await.unwrap();
    barrier(&store).await;
    let again = store
        .take_listed(vec![
            (key_of_a1, MessageId::parse("a1").unwrap()),
            (a2, MessageId::parse("a2").unwrap()),
        ])
        .await
        .unwrap();
    assert_eq!(ids(&again), ["a2"], "a1 was delivered: not produced again");
    assert_eq!(again.stale.iter().map(MessageId::as_str).collect::<Vec<_>>(), ["a1"]);
    store.close().await;
}

#[tokio::test]
async fn a_walk_steps_over_held_lanes_unclaimed_and_says_where_each_starts() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    park_to(&store, None, "a1", "a", 10).await;
    park_to(&store, Some("acme"), "b1", "b", 20).await;
    park_to(&store, None, "c1", "c", 30).await;
    park_to(&store, None, "a2", "a", 40).await;
    park_to(&store, None, "b2", "b", 50).await;
    let held: Arc<[PolicyKey]> = Arc::from([lane("a", None), lane("b", Some("acme"))]);
    let batch = store.take_due_but(DispatchKey::MIN, UnixMillis(100), 10, held).await.unwrap();
    assert_eq!(ids(&batch), ["c1", "b2"], "every other entry, another tenant's of a held topic too");
    let lowest: Vec<(String, u64)> =
        batch.held_back.iter().map(|(l, k)| (l.topic.to_string(), k.at.0)).collect();
    assert_eq!(lowest, [("a".to_owned(), 10), ("b".to_owned(), 20)], "each held lane's lowest entry");
    assert_eq!(store.dispatching(), 2, "what was stepped over is not claimed");
    store.close().await;
}

/// After an unclean stop, what a paused topic held below where the
/// dispatcher produced from is not in doubt, however low it holds the
/// floor; once the dispatcher records that it produces from there again,
/// it is.
#[tokio::test]
async fn what_a_paused_topic_holds_below_where_produces_start_is_not_in_doubt() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for (id, due) in [("paused", 10), ("b", 20), ("c", 30)] {
        park(&store, id, due).await;
    }
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    let (paused, b, c) = (&batch.ready[0], &batch.ready[1], &batch.ready[2]);
    store.release(vec![paused.id.clone()]).await.unwrap();
    let floor = store.wake().floor(paused.key, c.key);
    assert_eq!(floor.produced_from, c.key);
    let delivered = settle(b, 50, Outcome::Delivered { partition: 0, offset: 1 });
    store.settle(vec![delivered], Some(floor)).await.unwrap();
    store.in_doubt(vec![c.id.clone()]).await.unwrap();
    store.close().await;
    drop(store);

    let store = open(dir.path());
    let window = store.in_doubt_window().expect("not closed cleanly");
    assert_eq!(window.from, c.key);
    let doubt = store.in_doubt_messages(window).await.unwrap();
    assert_eq!(
        doubt.iter().map(|(_, m)| m.id.as_str()).collect::<Vec<_>>(),
        ["c"],
        "the paused one cannot have gone"
    );

    // The topic resumes: its walk records where it produces from first.
    store.producing_from(paused.key).await.unwrap();
    store.in_doubt(vec![c.id.clone()]).await.unwrap();
    store.close().await;
    drop(store);
    let store = open(dir.path());
    let doubt = store.in_doubt_messages(store.in_doubt_window().unwrap()).await.unwrap();
    assert_eq!(doubt.iter().map(|(_, m)| m.id.as_str()).collect::<Vec<_>>(), ["paused", "c"]);

    // Paused again, in a quiet store: a floor alone that leaves it out is
    // written, not kept for a later commit that may never come.
    store.settle(vec![], Some(store.wake().floor(paused.key, c.key))).await.unwrap();
    store.in_doubt(vec![c.id.clone()]).await.unwrap();
    store.close().await;
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.in_doubt_window().unwrap().from, c.key);
    store.close().await;
}

fn new_message(tenant: Option<&str>, id: &str, topic: &str, due: u64) -> NewMessage {
    let tenant = tenant.map(|t| Tenant::parse(t).unwrap());
    NewMessage {
        id: NewId::Client(MessageId::parse_in(tenant.as_ref(), id).unwrap()),
        scope: Scope::everything(),
        envelope: Envelope { topic: topic.into(), value: id.into(), ..Default::default() },
        requested: DueSpec::At(UnixMillis(due)),
        due: UnixMillis(due),
        now: UnixMillis(0),
        on_conflict: OnConflict::Reject,
    }
}

/// Parks `n` messages of `topic` due at `due`, named `{prefix}{i}`, in
/// batches.
async fn wall(store: &Store, prefix: &str, topic: &str, due: u64, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let msgs = chunk.iter().map(|i| new_message(None, &format!("{prefix}{i}"), topic, due)).collect();
        for placed in store.schedule_batch(msgs).await.unwrap() {
            placed.unwrap();
        }
    }
}

/// Walks the due index as the dispatcher does, holding `held` back, until
/// something is taken: what was taken, and in how many walks.
async fn walk_until_taken(store: &Store, held: &[PolicyKey], now: u64) -> (Vec<String>, usize) {
    let held: Arc<[PolicyKey]> = Arc::from(held);
    let (mut from, mut walks) = (DispatchKey::MIN, 0);
    loop {
        let batch = store.take_due_but(from, UnixMillis(now), 100, held.clone()).await.unwrap();
        walks += 1;
        from = batch.next_from;
        if !batch.ready.is_empty() || !batch.more {
            return (ids(&batch), walks);
        }
    }
}

#[tokio::test]
async fn a_walk_seeks_past_a_held_topic_s_wall_and_finds_what_is_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // 200,000 due in one millisecond, one walk examines 65,536 entries at
    // most: stepped over one by one, the wall takes four walks.
    wall(&store, "a", "a", 1_000, 200_000).await;
    park_to(&store, None, "b1", "b", 1_001).await;
    let (taken, walks) = walk_until_taken(&store, &[lane("a", None)], 2_000).await;
    assert_eq!(taken, ["b1"]);
    assert_eq!(walks, 1, "the walk seeks past the wall");
    // The lane still takes its own, from the lowest.
    let a = store.take_lane(lane("a", None), DispatchKey::MIN, DispatchKey::after(UnixMillis(2_000)), 3);
    assert_eq!(ids(&a.await.unwrap()), ["a0", "a1", "a2"]);
}

#[tokio::test]
async fn an_entry_moved_into_a_wall_is_found_by_the_walk() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // `c1` is numbered between the wall's halves, due later; then moved
    // into the wall's millisecond, between them.
    wall(&store, "a", "a", 1_000, 3_000).await;
    park_to(&store, None, "c1", "c", 5_000).await;
    wall(&store, "z", "a", 1_000, 3_000).await;
    let c1 = MessageId::parse("c1").unwrap();
    store
        .change(Intent::Reschedule { scope: Scope::everything(), id: c1, due: UnixMillis(1_000) })
        .await
        .unwrap()
        .rescheduled()
        .unwrap();
    let (taken, _) = walk_until_taken(&store, &[lane("a", None)], 2_000).await;
    assert_eq!(taken, ["c1"]);
}

#[tokio::test]
async fn a_lane_walk_seeks_past_another_topic_s_wall() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    park_to(&store, None, "a1", "a", 999).await;
    wall(&store, "b", "b", 1_000, 100_000).await;
    park_to(&store, None, "a2", "a", 1_001).await;
    let until = DispatchKey::after(UnixMillis(2_000));
    // The dispatcher's walk has gone past it all (a lane is walked up to
    // where that walk stands).
    store.take_due_but(until, UnixMillis(2_000), 1, Arc::from([])).await.unwrap();
    let batch = store.take_lane(lane("a", None), DispatchKey::MIN, until, 10).await.unwrap();
    assert_eq!(ids(&batch), ["a1", "a2"], "one walk, not one per 16,384 stepped over");
}
