//! The forecast read: what it counts is what `List` pages through.

use super::*;
use crate::{
    message::{Forecast, Tenant, Window},
    store::read::forecast::{CLOCK_EVERY, FORECAST_BUDGET, Walk, forecast},
};

/// What `List` returns for the window, counted as a forecast counts.
async fn listed(store: &Store, scope: &Scope, window: Window) -> Forecast {
    let mut forecast = Forecast::new(window);
    let mut from = DispatchKey { at: window.from, seq: 0 };
    loop {
        let filter = ListFilter {
            topic: None,
            selector: Default::default(),
            from,
            to: Some(window.to),
            limit: 2,
            examine: 3,
        };
        let page = store.reader().list_pending(scope.clone(), filter).await.unwrap();
        page.messages.iter().for_each(|(key, m)| forecast.add(&m.topic, key.at));
        match page.next {
            Some(next) => from = next,
            None => return forecast,
        }
    }
}

#[tokio::test]
async fn a_forecast_counts_what_list_pages_through_per_topic_and_interval() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let everything = Scope::everything();
    let orders = Scope::space(Some(Tenant::parse("orders").unwrap()));
    for (id, topic, due) in [
        ("a", "x", 100),
        ("b", "x", 1500),
        ("c", "y", 1999),
        ("d", "x", 2500),
        ("e", "y", 3999),
        ("f", "x", 4000),
    ] {
        park_on(&store, &everything, id, topic, due).await;
    }
    let mine = park_on(&store, &orders, "g", "x", 2600).await;
    let billing = Scope::space(Some(Tenant::parse("billing").unwrap()));
    park_on(&store, &billing, "i", "x", 3100).await;
    let cancelled = park_on(&store, &everything, "h", "x", 2700).await;
    store
        .change(Intent::Cancel { scope: everything.clone(), id: cancelled, now: UnixMillis(0), only: None })
        .await
        .unwrap();
    // a is delivered: its due entry waits for its retention, logged.
    let batch = store.take_due(DispatchKey::MIN, UnixMillis(100), 10).await.unwrap();
    let delivered = settle(&batch.ready[0], 150, Outcome::Delivered { partition: 0, offset: 1 });
    store.settle(vec![delivered], None).await.unwrap();
    barrier(&store).await;

    let window = Window { from: UnixMillis(0), to: UnixMillis(4000), interval_ms: 1000 };
    let all = store.reader().forecast(everything.clone(), window, None, usize::MAX).await.unwrap();
    assert_eq!(all.topics["x"], [0, 1, 2, 1], "b; d and the orders tenant's g; billing's i; not a, h or f");
    assert_eq!(all.topics["y"], [0, 1, 0, 1]);
    assert_eq!(all.counted_to, None);
    assert_eq!(all, listed(&store, &everything, window).await);

    let theirs = store.reader().forecast(orders.clone(), window, None, usize::MAX).await.unwrap();
    assert_eq!(
        theirs.topics["x"],
        [0, 1, 2, 0],
        "a tenant counts its own and the shared space's, not billing's"
    );
    assert_eq!(theirs, listed(&store, &orders, window).await);
    assert!(store.reader().get(orders, mine).await.unwrap().is_some());

    let y = store.reader().forecast(everything.clone(), window, Some("y".into()), usize::MAX).await.unwrap();
    assert_eq!(y.topics.keys().collect::<Vec<_>>(), ["y"]);

    // A walk that stops early says where the whole intervals end.
    let cut = store.reader().forecast(everything, window, None, 3).await.unwrap();
    assert_eq!(
        cut.counted_to,
        Some(UnixMillis(2000)),
        "the fourth entry looked at (d, at 2500) was not counted"
    );
    assert_eq!(
        (cut.topics["x"].as_slice(), cut.topics["y"].as_slice()),
        ([0, 1, 0, 0].as_slice(), [0, 1, 0, 0].as_slice())
    );
    store.close().await;
}

/// Where a tenant's count stops depends on its own entries alone, however
/// many other tenants' entries lie in between.
#[tokio::test]
async fn a_tenants_forecast_stops_only_at_its_own_entries() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let acme = Scope::space(Some(Tenant::parse("acme").unwrap()));
    let other = Scope::space(Some(Tenant::parse("other").unwrap()));
    for (i, due) in [100, 200, 300, 400, 500].into_iter().enumerate() {
        park_on(&store, &other, &format!("o{i}"), "x", due).await;
    }
    park_on(&store, &acme, "a1", "x", 1100).await;
    park_on(&store, &acme, "a2", "x", 2100).await;
    barrier(&store).await;
    let window = Window { from: UnixMillis(0), to: UnixMillis(4000), interval_ms: 1000 };
    let walk = |examine| Walk { examine, budget: FORECAST_BUDGET };
    let from = DispatchKey { at: window.from, seq: 0 };
    let db = &store.inner.db;

    let whole = forecast(db, &acme, window, from, None, walk(3)).unwrap();
    assert_eq!(
        whole.counted_to, None,
        "two entries of its own: nothing cut, the other tenant's five are not counted"
    );
    assert_eq!(whole.topics["x"], [0, 1, 1, 0]);
    let cut = forecast(db, &acme, window, from, None, walk(1)).unwrap();
    assert_eq!(cut.counted_to, Some(UnixMillis(2000)), "cut at its own second entry's interval");
    assert_eq!(cut.topics["x"], [0, 1, 0, 0]);
    let operator = forecast(db, &Scope::everything(), window, from, None, walk(5)).unwrap();
    assert_eq!(operator.counted_to, Some(UnixMillis(1000)), "one who sees everything counts every entry");

    // Out of time among entries it does not see: refused, not cut there.
    let hurried = Walk { examine: usize::MAX, budget: std::time::Duration::ZERO };
    let many = Scope::space(Some(Tenant::parse("many").unwrap()));
    for i in 0..2 * CLOCK_EVERY {
        park_on(&store, &many, &format!("m{i}"), "x", 600).await;
    }
    barrier(&store).await;
    let refused = forecast(db, &acme, window, from, None, hurried).unwrap_err();
    assert!(matches!(refused, StoreError::WalkTooLong { .. }), "{refused:?}");
    let seen = forecast(db, &Scope::everything(), window, from, None, hurried).unwrap();
    assert!(seen.counted_to.is_some_and(|at| at <= UnixMillis(600)), "{seen:?}");
    store.close().await;

    // A tenant alone in the window is cut at its own entry when out of
    // time: nobody else's entries were passed.
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for i in 0..2 * CLOCK_EVERY {
        park_on(&store, &acme, &format!("a{i}"), "x", 1100).await;
    }
    barrier(&store).await;
    let alone = forecast(&store.inner.db, &acme, window, from, None, hurried).unwrap();
    assert_eq!(alone.counted_to, Some(UnixMillis(1000)), "{alone:?}");
    store.close().await;
}
