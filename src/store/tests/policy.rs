//! What the store does for dispatch policies: it keeps them through a
//! reopen and tells watchers of each change, and it walks one lane of the
//! due index (one topic, for one tenant or all) apart from the rest.

use super::*;
use crate::{
    message::Tenant,
    policy::{PolicyKey, PolicyWrite, TopicPolicy},
};

async fn park_to(store: &Store, tenant: Option<&str>, id: &str, topic: &str, due: u64) {
    let tenant = tenant.map(|t| Tenant::parse(t).unwrap());
    let msg = NewMessage {
        id: NewId::Client(MessageId::parse_in(tenant.as_ref(), id).unwrap()),
        scope: Scope::everything(),
        envelope: Envelope { topic: topic.into(), value: id.into(), ..Default::default() },
        requested: DueSpec::At(UnixMillis(due)),
        due: UnixMillis(due),
        now: UnixMillis(0),
        on_conflict: OnConflict::Reject,
    };
    store.schedule(msg).await.unwrap();
}

fn lane(topic: &str, tenant: Option<&str>) -> Lane {
    Lane { topic: topic.into(), tenant: tenant.map(|t| Tenant::parse(t).unwrap()) }
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
    let write = |policy| vec![PolicyWrite { key: key.clone(), policy }];
    store.write_policies(write(Some(paused.clone()))).await.unwrap();
    assert!(watch.has_changed().unwrap(), "watchers are told");
    assert_eq!(watch.borrow_and_update().get(&key), Some(&paused));
    store.close().await;
    drop(store);

    let store = open(dir.path());
    assert_eq!(store.policies().borrow().get(&key), Some(&paused), "kept through a reopen");
    store.write_policies(write(Some(TopicPolicy::default()))).await.unwrap();
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
