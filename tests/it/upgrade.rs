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

/// A node reads a sealed record of the schedule log in a format a newer
/// release writes. Skipped, a change it holds (a schedule, a cancel) would
/// be lost on that copy of the shard without a word: the copy applies
/// nothing from it on instead. The node that owns the shard stops (exit 1),
/// so that a node that reads the record can take it; the other node counts
/// the record, does not take the shard over, and goes on delivering every
/// other shard once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_log_record_of_a_newer_release_stops_its_shard_instead_of_being_skipped() {
    use std::time::Instant;

    use crate::cluster_nodes::{Bed, LOG_PARTITIONS, id_in_shard, now_ms, on_any_node, wait_spread};
    use common::verify::{Ledger, collect_async, due_message};
    use hourglass::cluster::log::{
        RECORD_HEADER,
        record::{Change, LogRecord, Owner},
        seal::{ClusterKey, SEAL_HEADER},
    };
    use rdkafka::{
        message::{Header, OwnedHeaders},
        producer::FutureRecord,
    };

    let Bed { broker, topic, log_topic, dirs: _dirs, mut nodes } = Bed::start(2, 2).await;
    wait_spread(&nodes[..2], &[0, 1], Duration::from_secs(60)).await;
    // Shard 0's partition gets a record written as a newer format.
    let key = b"newer-release";
    let value = LogRecord { writer: 7, request: 1, change: Some(Change::Owner(Owner::default())) }.encode();
    let cluster_key = ClusterKey::load(&hourglass_testkit::cluster_key_file().unwrap()).unwrap();
    let seal = cluster_key.seal(&log_topic, 0, Some(key), Some(&value));
    let headers = OwnedHeaders::new()
        .insert(Header { key: RECORD_HEADER, value: Some(b"99") })
        .insert(Header { key: SEAL_HEADER, value: Some(&seal) });
    let record =
        FutureRecord::<[u8], [u8]>::to(&log_topic).partition(0).key(key).payload(&value).headers(headers);
    native_producer(&broker).send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();

    let began = Instant::now();
    let (stopped, status) = loop {
        assert!(began.elapsed() < Duration::from_secs(60), "the shard's owner did not stop");
        let mut exited = None;
        for (i, node) in nodes[..2].iter_mut().enumerate() {
            if let Some(status) = node.wait_exit(Duration::from_millis(100)).await {
                exited = Some((i, status));
                break;
            }
        }
        if let Some(exited) = exited {
            break exited;
        }
    };
    assert_eq!(status.code(), Some(1), "the owner exits as for a damaged store: {status:?}");
    let survivor = &nodes[1 - stopped];
    survivor
        .wait_metric("hourglass_cluster_log_unreadable_total", 1.0, Duration::from_secs(60))
        .await
        .expect("the other node's copy of the shard stopped at the record too");

    // Every other shard moves to the survivor and delivers once, on time.
    let client = reconnecting_client(&survivor.grpc, Duration::from_secs(5));
    let (ledger, run) = (Ledger::default(), random_name("newer"));
    let due = now_ms() + 3_000;
    for shard in 1..LOG_PARTITIONS {
        let id = id_in_shard(&format!("{run}-{shard}"), shard);
        let request = due_message(&topic, &id, due);
        on_any_node(std::slice::from_ref(&client), 0, move |mut c| {
            let request = request.clone();
            Box::pin(async move { c.schedule(request).await.map(|_| ()) })
        })
        .await
        .unwrap();
        ledger.ack(&id, due, &topic);
    }
    let deliveries = collect_async(
        broker.addr(),
        &[topic.as_str()],
        ledger.expected(),
        Duration::from_secs(60),
        Duration::from_secs(3),
    )
    .await;
    let verdict = ledger.verdict(&deliveries);
    verdict.assert_nothing_lost_or_early();
    assert!(verdict.duplicates.is_empty(), "duplicates: {:?}", verdict.duplicates);
    assert_eq!(
        survivor.metric("hourglass_cluster_shards_owned").await.unwrap(),
        f64::from(LOG_PARTITIONS - 1),
        "every shard but the stopped one is owned, and that one by no node that cannot read its log"
    );
    let survivor = &mut nodes[1 - stopped];
    assert!(
        survivor.wait_exit(Duration::ZERO).await.is_none(),
        "the node that owned nothing of it serves on"
    );
    survivor.stop().unwrap();
}

/// The previous release's server, which `tests/fixtures/previous-release.sh`
/// builds beside this build's (the README's test command runs it first).
fn previous_release() -> std::path::PathBuf {
    let this = Path::new(env!("CARGO_BIN_EXE_hourglass"));
    let target = this.parent().and_then(Path::parent).expect("the target directory");
    let previous = target.join("previous-release/hourglass-0.2.0");
    assert!(
        previous.exists(),
        "{} is missing: run CARGO_TARGET_DIR={} bash tests/fixtures/previous-release.sh (bash .ci/test does)",
        previous.display(),
        target.display()
    );
    previous
}

/// A rolling upgrade of a three-node cluster from the previous release to
/// this build, one node at a time as a StatefulSet's rollout does (SIGTERM,
/// then the new server on the same data dir and address), while messages
/// are scheduled through every node and delivered all along: calls pass
/// between nodes of both releases, shards move from old nodes to new and
/// back, and every message is delivered once, none early.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_upgrade_from_the_previous_release_loses_and_repeats_nothing() {
    use std::time::Instant;

    use crate::cluster_nodes::{
        Bed, THREE_NODES, node, node_of, now_ms, schedule_anywhere, wait_even, wait_spread,
    };
    use common::verify::{Ledger, collect_async, due_message};

    let previous = previous_release();
    let _turn = THREE_NODES.lock().await;
    // The Bed's nodes are this build's, not started: their data dirs and
    // names serve both releases.
    let Bed { broker, topic, log_topic, dirs, nodes: unstarted } = Bed::start(2, 0).await;
    let group = random_name("upgrade");
    let mut nodes = Vec::new();
    for (dir, planned) in dirs.iter().zip(&unstarted) {
        let mut old = node_of(&previous, &broker, dir.path(), &log_topic, &group);
        (old.grpc, old.metrics) = (planned.grpc.clone(), planned.metrics.clone());
        old.spawn().unwrap();
        nodes.push(old);
    }
    for node in &mut nodes {
        node.wait_serving(Duration::from_secs(120)).await.unwrap();
    }
    wait_even(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;
    let built = nodes[0].metrics_text().await.unwrap();
    assert!(built.contains("b98674251c68"), "the first nodes run the previous release");

    // Ten a second through every node in turn, each due 2 to 4 s later,
    // until the upgrade is over.
    let clients: Vec<_> =
        nodes.iter().map(|n| reconnecting_client(&n.grpc, Duration::from_secs(5))).collect();
    let (ledger, run) = (Arc::new(Ledger::default()), random_name("rolling"));
    let stop = CancellationToken::new();
    let load = {
        let (ledger, stop, topic) = (Arc::clone(&ledger), stop.clone(), topic.clone());
        tokio::spawn(async move {
            let mut scheduling = tokio::task::JoinSet::new();
            for i in 0i64.. {
                if stop.is_cancelled() {
                    break;
                }
                let request = due_message(&topic, &format!("{run}-{i}"), now_ms() + 2_000 + (i % 20) * 100);
                let (mut clients, ledger) = (clients.clone(), Arc::clone(&ledger));
                scheduling.spawn(async move {
                    schedule_anywhere(&mut clients, i as usize % 3, request, &ledger).await
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            scheduling.join_all().await;
        })
    };

    for i in 0..3 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let began = Instant::now();
        nodes[i].stop().unwrap();
        let mut new = node(&broker, dirs[i].path(), &log_topic, &group);
        (new.grpc, new.metrics) = (nodes[i].grpc.clone(), nodes[i].metrics.clone());
        new.spawn().unwrap();
        new.wait_serving(Duration::from_secs(120)).await.unwrap();
        nodes[i] = new;
        let spread = wait_spread(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;
        eprintln!("node {i} upgraded in {:?}: shards {spread:?}", began.elapsed());
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    load.await.unwrap();

    let deliveries = collect_async(
        broker.addr(),
        &[topic.as_str()],
        ledger.expected(),
        Duration::from_secs(60),
        Duration::from_secs(3),
    )
    .await;
    let verdict = ledger.verdict(&deliveries);
    eprintln!("rolling upgrade 0.2.0 -> this build: {}", verdict.summary());
    assert!(verdict.acknowledged >= 100, "scheduled all along: {}", verdict.summary());
    verdict.assert_nothing_lost_or_early();
    assert!(verdict.duplicates.is_empty(), "delivered twice: {:?}", verdict.duplicates);
    assert_eq!(verdict.unacknowledged, 0, "delivered what no one scheduled");
    for node in &mut nodes {
        let version = node.metrics_text().await.unwrap();
        assert!(
            version.contains(env!("HOURGLASS_COMMIT").split(' ').next().unwrap()),
            "every node runs this build"
        );
        node.stop().unwrap();
    }
}
