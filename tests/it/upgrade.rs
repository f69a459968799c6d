//! A data dir written by the previous release (one store, no shard
//! recorded; `tests/fixtures/store-0.1.0.tar.gz`, made by
//! `tests/fixtures/make-release-store.sh`) opens unchanged as a node of one
//! shard: its delivered, pending and cancelled messages read back as they
//! were, the pending one is delivered when due, and a start with more
//! shards is refused instead of hashing its ids elsewhere.

use crate::common;

use std::{path::Path, sync::Arc, time::Duration};

use common::*;
use hourglass::{
    clock::ManualClock,
    message::UnixMillis,
    proto::{self, State, get_response::Settlement},
};
use tokio_util::sync::CancellationToken;

/// When the fixture was made, a little after: the clock the server runs on,
/// so that nothing in it has aged past retention or come due.
const MADE: &str = "2026-11-23T17:00:00Z";
/// When its pending message is due.
const PENDING_DUE: &str = "2029-11-01T00:00:00Z";
const TOPIC: &str = "fixture-orders";

fn ms(rfc3339: &str) -> u64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339).unwrap().timestamp_millis() as u64
}

/// The fixture, unpacked into `dir`.
fn unpack(dir: &Path) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-0.1.0.tar.gz");
    let status = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&fixture)
        .arg("-C")
        .arg(dir)
        .status()
        .expect("tar runs");
    assert!(status.success(), "unpacking {}", fixture.display());
    assert!(dir.join("CURRENT").exists(), "a store at the top of the data dir, as releases laid it out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_the_previous_release_opens_unchanged_as_one_shard() {
    let broker = Broker::start();
    broker.create_topic(TOPIC, 2).await;
    let dir = tempfile::tempdir().unwrap();
    unpack(dir.path());

    // More shards: refused, and the store left as it was.
    let two = hourglass::config::Config { shards: 2, ..config(&broker, dir.path()) };
    let listeners = hourglass::Listeners::bind(&two).await.unwrap();
    let refused = hourglass::run(two, listeners, CancellationToken::new()).await.unwrap_err();
    let message = format!("{refused:#}");
    assert!(message.contains("holds 1 shard(s)") && message.contains("--shards 1"), "{message}");
    assert!(!dir.path().join("shard-0").exists(), "nothing was created beside the old store");

    let clock = Arc::new(ManualClock::new(UnixMillis(ms(MADE))));
    let server = Hourglass::start_with_clock(config(&broker, dir.path()), clock.clone()).await;
    let mut client = server.client().await;
    let get = |id: &str| proto::GetRequest { id: id.into(), ..Default::default() };

    let delivered = client.get(get("delivered-1")).await.unwrap().into_inner();
    assert_eq!(delivered.state(), State::Delivered);
    let Some(Settlement::Delivered(delivery)) = &delivered.settlement else { panic!("{delivered:?}") };
    assert!(delivery.offset >= 0 && (0..2).contains(&delivery.partition), "{delivery:?}");
    let message = delivered.message.as_ref().unwrap();
    assert_eq!((message.key.as_deref(), &message.value[..]), (Some(&b"k1"[..]), &b"delivered"[..]));
    assert_eq!(
        message.headers.iter().map(|h| (h.key.as_str(), &h.value[..])).collect::<Vec<_>>(),
        [("origin", &b"fixture"[..])]
    );

    let pending = client.get(get("pending-1")).await.unwrap().into_inner();
    assert_eq!(pending.state(), State::Pending);
    assert_eq!(millis(pending.deliver_at.as_ref().unwrap()) as u64, ms(PENDING_DUE));
    let cancelled = client.get(get("cancelled-1")).await.unwrap().into_inner();
    assert_eq!(cancelled.state(), State::Cancelled);

    let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!((stats.pending, stats.delivered, stats.cancelled, stats.failed), (1, 1, 1, 0));
    let page = client.list(proto::ListRequest::default()).await.unwrap().into_inner();
    assert_eq!(page.messages.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["pending-1"]);
    assert!(page.next_page_token.is_empty());

    // Its id is taken, by the same request; another is refused.
    let mut again = request(TOPIC, "cancelled", Duration::ZERO);
    again.id = Some("cancelled-1".into());
    again.due = Some(proto::schedule_request::Due::DeliverAt(pending.deliver_at.unwrap()));
    assert!(client.schedule(again).await.unwrap().into_inner().duplicate);

    // When it is due, the pending message goes out, as it was scheduled.
    clock.set(UnixMillis(ms(PENDING_DUE) + 1));
    let got = consume_async(&broker, TOPIC, 1, Duration::from_secs(30), Duration::from_secs(1)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].key.as_deref(), &got[0].value[..]), (Some(&b"k2"[..]), &b"pending"[..]));
    assert_eq!(got[0].header("origin"), Some("fixture"));
    assert_eq!(got[0].id(), "pending-1");
    server.stop().await;
    assert!(!dir.path().join("shard-0").exists(), "still one store, where it was");
}
