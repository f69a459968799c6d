//! The reliability scenarios that run the real `hourglass` binary: crashes
//! at random moments and at fail points, a broker outage, a burst, a full
//! disk and a backlog cap, graceful shutdown under load, and overload.
//!
//! Each one schedules through real gRPC, consumes with a real Kafka
//! consumer and judges with the verifier (`common::verify`): nothing
//! acknowledged lost, nothing early, duplicates only where a crash explains
//! them. They print their figures (run with `--nocapture` to see them);
//! docs/RELIABILITY.md records them. `HOURGLASS_RELIABILITY_FULL=1` runs
//! them at the scale the guarantees are stated for; the default is a
//! smaller scale that fits CI.

use crate::common;

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use common::{verify::*, *};
use hourglass::{
    kafka::{
        KafkaConfig,
        landed::{self, Late, Wanted},
    },
    message::{MessageId, UnixMillis},
    proto::{self, scheduler_client::SchedulerClient},
    store::Durability,
};
use hourglass_testkit::ServerProcess;
use rdkafka::{
    ClientConfig,
    message::{Header, OwnedHeaders},
    producer::{BaseProducer, BaseRecord, Producer as _},
};
use tonic::{Code, transport::Channel};
use tonic_health::pb::health_check_response::ServingStatus;

const BIN: &str = env!("CARGO_BIN_EXE_hourglass");

/// The scenarios load the machine heavily; one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `small` in CI, `large` with HOURGLASS_RELIABILITY_FULL=1.
fn scale<T>(small: T, large: T) -> T {
    if reliability_full() { large } else { small }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn server(data_dir: &Path, broker: &Broker) -> ServerProcess {
    ServerProcess::new(Path::new(BIN), data_dir, broker.addr(), Durability::Sync).unwrap()
}

/// A client that reconnects by itself after the server comes back.
fn client(grpc: &str) -> SchedulerClient<Channel> {
    reconnecting_client(grpc, Duration::from_secs(20))
}

/// Codes a client retries: the server is down, restarting, busy or full.
fn retryable(code: Code) -> bool {
    !matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::DataLoss
    )
}

/// Schedules `requests` as one batch, again and again, until every item is
/// acknowledged; records each acknowledgement. Returns how many calls failed
/// as a whole (a crash, a restart) on the way.
async fn schedule_until_acked(
    client: &mut SchedulerClient<Channel>,
    mut requests: Vec<proto::ScheduleRequest>,
    ledger: &Ledger,
    give_up: Instant,
) -> u64 {
    let mut failed_calls = 0;
    while !requests.is_empty() {
        assert!(Instant::now() < give_up, "{} requests still not acknowledged", requests.len());
        let reply = client.schedule_batch(proto::ScheduleBatchRequest { requests: requests.clone() }).await;
        let results = match reply {
            Ok(r) => r.into_inner().results,
            Err(status) => {
                assert!(retryable(status.code()), "batch refused: {status:?}");
                failed_calls += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let mut again = Vec::new();
        for (result, request) in results.into_iter().zip(requests) {
            match result.result.expect("every item is answered") {
                proto::schedule_result::Result::Scheduled(s) => {
                    let topic = &request.message.as_ref().unwrap().topic;
                    ledger.ack(&s.id, millis(s.deliver_at.as_ref().unwrap()), topic);
                }
                proto::schedule_result::Result::Error(e) => {
                    assert!(retryable(Code::from_i32(e.code)), "item refused: {e:?}");
                    again.push(request);
                }
            }
        }
        requests = again;
        if !requests.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    failed_calls
}

/// `count` messages for `topic`, ids `{run}-{i}`, due spread evenly over
/// `[from_ms, from_ms + over_ms)`, scheduled by `clients` concurrent
/// clients in batches of `batch`.
struct Spread {
    grpc: String,
    topic: String,
    run: String,
    count: usize,
    from_ms: i64,
    over_ms: i64,
    clients: usize,
    batch: usize,
    /// Spread the scheduling itself over this long (0: as fast as it goes).
    ingest_ms: u64,
}

async fn schedule_spread(spread: Spread, ledger: Arc<Ledger>) -> u64 {
    let Spread { grpc, topic, run, count, from_ms, over_ms: spread_ms, clients, batch, ingest_ms } = spread;
    let pause = Duration::from_millis(ingest_ms * (clients * batch) as u64 / count.max(1) as u64);
    let give_up = Instant::now() + Duration::from_secs(600);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (mut client, topic, run, ledger) = (client(&grpc), topic.clone(), run.clone(), ledger.clone());
        tasks.push(tokio::spawn(async move {
            let mine: Vec<usize> = (c..count).step_by(clients).collect();
            let mut failed = 0;
            for chunk in mine.chunks(batch) {
                let requests = chunk
                    .iter()
                    .map(|&i| {
                        let due = from_ms + spread_ms * i as i64 / count as i64;
                        due_message(&topic, &format!("{run}-{i}"), due)
                    })
                    .collect();
                failed += schedule_until_acked(&mut client, requests, &ledger, give_up).await;
                tokio::time::sleep(pause).await;
            }
            failed
        }));
    }
    let mut failed = 0;
    for t in tasks {
        failed += t.await.unwrap();
    }
    failed
}

/// Highest resident memory of the server while `running` is set.
fn sample_rss(pid: u32, running: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut peak = 0;
        while running.load(Ordering::Relaxed) {
            peak = peak.max(hourglass_testkit::rss_of(pid).unwrap_or(0));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        peak
    })
}

const MIB: u64 = 1 << 20;

/// Reads `topic` until every message `ledger` expects has arrived (or
/// `within` passed), a little longer for late duplicates, and judges.
async fn judge(broker: &Broker, topic: &str, ledger: &Ledger, within: Duration) -> Verdict {
    let deliveries =
        collect_async(broker.addr(), &[topic], ledger.expected(), within, Duration::from_secs(2)).await;
    ledger.verdict(&deliveries)
}

/// Refused requests stored nothing: `Get` finds none of them.
async fn assert_not_stored(client: &mut SchedulerClient<Channel>, ids: impl IntoIterator<Item = &String>) {
    for id in ids {
        let got = client.get(proto::GetRequest { id: id.clone(), ..Default::default() }).await;
        assert_eq!(got.map(|_| ()).unwrap_err().code(), Code::NotFound, "{id} was refused yet stored");
    }
}

/// 1. kill -9 at random moments while clients schedule and messages come
/// due; restart each time. Nothing acknowledged is lost or early, and what
/// Kafka took before a kill is found there after the restart rather than
/// sent again (but see [`kill_9_sweep_sends_nothing_twice`] for Tansu).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_sweep_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let broker = Broker::start();
    let topic = random_name("kill9");
    broker.create_topic(&topic, 4).await;
    let (verdict, kill_times) = kill_9_sweep(broker.addr(), &topic, "idempotent").await;
    for (id, at) in &verdict.duplicates {
        // Tansu 0.6 can show a record whose producer was killed sending it
        // only once the partition's next record is appended: after the
        // restart's search. Its first copy went out before a kill.
        let explained = kill_times.iter().any(|&k| at[0] <= k && at[1..].iter().any(|&t| t >= k));
        assert!(explained, "{id} was delivered {} times at {at:?}, with no kill in between", at.len());
    }
    assert!(
        verdict.duplicates.len() <= 2,
        "{} duplicates, kills at {kill_times:?}: {:?}",
        verdict.duplicates.len(),
        verdict.duplicates.iter().take(3).collect::<Vec<_>>()
    );
}

/// 1 (continued). The sweep against librdkafka's mock cluster, which shows
/// a record as soon as it is appended: not one duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_sweep_sends_nothing_twice() {
    kill_9_sweep_on_mock("idempotent").await;
}

/// 1 (continued). The sweep with transactional delivery
/// (`--delivery exactly-once`), against the mock cluster (Tansu 0.6 has no
/// EndTxn): each restart fences the killed producer's transactional id
/// before it reads the topics back. Not one duplicate. (The mock keeps an
/// aborted transaction's records visible, so a restart finds and records
/// them where Kafka would have them aborted and produced again; a
/// read_committed consumer sees each message once either way.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_sweep_with_transactions_sends_nothing_twice() {
    kill_9_sweep_on_mock("exactly-once").await;
}

/// The sweep with `--delivery` `delivery` against the mock cluster, which
/// shows a record as soon as it is appended: not one duplicate.
async fn kill_9_sweep_on_mock(delivery: &str) {
    let _serial = SERIAL.lock().await;
    let mock = common::mock::Mock::start(1);
    let topic = random_name("kill9");
    mock.topic_with(&topic, 4);
    let (verdict, kill_times) = kill_9_sweep(&mock.bootstrap(), &topic, delivery).await;
    assert!(
        verdict.duplicates.is_empty(),
        "{delivery}: {} duplicates, kills at {kill_times:?}: {:?}",
        verdict.duplicates.len(),
        verdict.duplicates.iter().take(3).collect::<Vec<_>>()
    );
}

/// 1 (continued). What the broker appends for a stopped process after the
/// search began is found: a broker works through the requests a closed
/// connection had sent, under load more than a second after the stop (a
/// sweep on a busy machine saw Tansu append a killed process's last batch
/// more than a second after the kill, then the restart's copy). The search reads on past
/// the partitions' ends until none of the messages in doubt has appeared
/// there for a quiet second; what appears after that is not waited for.
#[test]
fn what_appears_after_the_search_began_is_found_until_a_quiet_second() {
    let mock = common::mock::Mock::start(1);
    let topic = random_name("late");
    mock.topic_with(&topic, 2);
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", mock.bootstrap()).create().unwrap();
    let due = UnixMillis(1_000);
    let send = |id: &str, partition: i32| {
        producer.send(delivery(&topic, id, due, partition)).unwrap();
        producer.flush(Duration::from_secs(10)).unwrap();
    };
    let wanted: std::collections::HashMap<MessageId, UnixMillis> = ["before", "late", "later", "after"]
        .into_iter()
        .map(|id| (MessageId::parse(id).unwrap(), due))
        .collect();
    let config = KafkaConfig { brokers: mock.bootstrap(), properties: Default::default() };
    send("before", 0);
    let search = {
        let topic = topic.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut late = Late { quiet: Duration::from_secs(1), last: started };
            let wanted = Wanted { ids: &wanted, times: (UnixMillis(0), UnixMillis(u64::MAX)) };
            let marks = Default::default();
            let landed =
                landed::search(&config, false, &topic, &marks, wanted, &mut late, Duration::from_secs(30));
            (landed.unwrap(), late.last - started, started.elapsed())
        })
    };
    // While the search reads on: 0.6 s in, on the other partition; 0.8 s
    // after that, past the second since it began, inside the second since
    // the late one. Then, long after the last one, one too late.
    std::thread::sleep(Duration::from_millis(600));
    send("late", 1);
    std::thread::sleep(Duration::from_millis(800));
    send("later", 0);
    std::thread::sleep(Duration::from_millis(2_500));
    send("after", 1);
    let (landed, last, took) = search.join().unwrap();
    let found: std::collections::BTreeSet<String> = landed.found.keys().map(|id| id.to_string()).collect();
    eprintln!("search: found {found:?}, last late one at {last:?}, done after {took:?}");
    assert_eq!(
        found,
        ["before", "late", "later"].map(String::from).into(),
        "found past the ends while records kept appearing"
    );
    assert!(last >= Duration::from_millis(1_400), "the last late record moved the quiet second: {last:?}");
    assert!(took >= last + Duration::from_secs(1), "done only after a quiet second: {took:?}");
    assert_eq!(
        landed.partitions, 1,
        "only the partition with a record past its mark had any to read at the start"
    );
}

/// A record as hourglass delivers message `id` due at `due`.
fn delivery<'a>(topic: &'a str, id: &str, due: UnixMillis, partition: i32) -> BaseRecord<'a, (), str> {
    let due = due.0.to_string();
    let headers = OwnedHeaders::new()
        .insert(Header { key: "hourglass-id", value: Some(id) })
        .insert(Header { key: "hourglass-due-ms", value: Some(&due) });
    BaseRecord::to(topic).payload("x").partition(partition).headers(headers)
}

/// Writes `ids` to partition 0 of `topic` as deliveries due at `due`, one
/// batch of them (every record is queued before the first is sent).
fn one_batch(broker: &Broker, topic: &str, ids: &[String], due: UnixMillis) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.addr())
        .set("linger.ms", "1000")
        .create()
        .unwrap();
    for id in ids {
        producer.send(delivery(topic, id, due, 0)).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

/// Searches partition 0 of `topic` for `wanted`, due at `due`, from `mark`.
async fn search_from(
    broker: &Broker,
    topic: &str,
    mark: i64,
    wanted: &[String],
    due: UnixMillis,
) -> landed::Landed {
    let wanted: std::collections::HashMap<MessageId, UnixMillis> =
        wanted.iter().map(|id| (MessageId::parse(id).unwrap(), due)).collect();
    let config = KafkaConfig { brokers: broker.addr().to_owned(), properties: Default::default() };
    let (marks, topic) = (std::collections::HashMap::from([(0, mark)]), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut late = Late { quiet: Duration::ZERO, last: Instant::now() };
        let wanted = Wanted { ids: &wanted, times: (UnixMillis(0), UnixMillis(u64::MAX)) };
        landed::search(&config, false, &topic, &marks, wanted, &mut late, Duration::from_secs(60)).unwrap()
    })
    .await
    .unwrap()
}

/// A search whose mark lies inside a batch of records finds the records of
/// that batch past the mark. Tansu 0.6 answers a fetch from inside a batch
/// with the next batch (none here: the batch is the partition's last),
/// where Kafka answers with the whole batch; a mark lands inside a batch
/// whenever a delivery recorded before a stop was not the last of its
/// batch. Read from the mark, the rest of the batch would be sent again.
#[tokio::test]
async fn a_search_from_inside_a_batch_finds_the_rest_of_it() {
    let broker = Broker::start();
    let topic = random_name("batch");
    broker.create_topic(&topic, 1).await;
    let due = UnixMillis(1_000);
    let ids: Vec<String> = (0..200).map(|i| format!("b-{i}")).collect();
    one_batch(&broker, &topic, &ids, due);
    // The first 120 were recorded delivered; the rest are in doubt.
    let landed = search_from(&broker, &topic, 120, &ids[120..], due).await;
    let mut found: Vec<(i64, String)> =
        landed.found.iter().map(|(id, spot)| (spot.offset, id.to_string())).collect();
    found.sort();
    assert_eq!(found.len(), 80, "every record past the mark is found: {found:?}");
    assert_eq!(found.first(), Some(&(120, "b-120".to_owned())), "each at its offset");
    assert_eq!(found.last(), Some(&(199, "b-199".to_owned())));
}

/// A mark past the end the broker lists is not taken for a topic made
/// again when the partition's records reach it. Tansu 0.6 lists a
/// partition's end as the first offset of its last batch, plus one, so a
/// mark inside the last batch lay "past the end", and the search read
/// every partition whole: after a SIGKILL with millions delivered to the
/// topic, seconds before anything was produced (1.5 s with 2M on the
/// bench's topic), and the records appended meanwhile were read after
/// the quiet second was over and sent again.
#[tokio::test]
async fn a_mark_inside_the_last_batch_is_read_from_not_taken_for_a_topic_made_again() {
    let broker = Broker::start();
    let topic = random_name("listed");
    broker.create_topic(&topic, 1).await;
    let due = UnixMillis(1_000);
    // Others' records, then one batch of ours.
    let others: Vec<String> = (0..1_000).map(|i| format!("other-{i}")).collect();
    one_batch(&broker, &topic, &others, due);
    let ids: Vec<String> = (0..200).map(|i| format!("ours-{i}")).collect();
    one_batch(&broker, &topic, &ids, due);
    // The first 100 of ours were recorded delivered; the rest are in doubt.
    let landed = search_from(&broker, &topic, 1_100, &ids[100..], due).await;
    eprintln!("found {} of 100, read {} of 1,200 records", landed.found.len(), landed.read);
    assert_eq!(landed.found.len(), 100, "every record past the mark is found");
    assert!(landed.read < 1_000, "read from the mark, not whole: {} records", landed.read);
}

/// A mark past every record of its partition: the topic was deleted and
/// made again since the mark was recorded, and is read whole.
#[tokio::test]
async fn a_mark_past_every_record_reads_the_partition_whole() {
    let broker = Broker::start();
    let topic = random_name("again");
    broker.create_topic(&topic, 1).await;
    let due = UnixMillis(1_000);
    let ids: Vec<String> = (0..300).map(|i| format!("again-{i}")).collect();
    one_batch(&broker, &topic, &ids, due);
    let wanted: Vec<String> = ids.iter().step_by(3).cloned().collect();
    let landed = search_from(&broker, &topic, 5_000, &wanted, due).await;
    assert_eq!(landed.found.len(), 100, "every wanted record is found");
}

/// Messages spread over a window through a server killed with SIGKILL at
/// random moments and restarted each time; what reached `topic`, and when
/// the kills were.
async fn kill_9_sweep(brokers: &str, topic: &str, delivery: &str) -> (Verdict, Vec<i64>) {
    let (count, window_ms, kills) = scale((20_000, 25_000, 12), (100_000, 180_000, 25));
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::new(Path::new(BIN), dir.path(), brokers, Durability::Sync).unwrap();
    server.env("HOURGLASS_DELIVERY", delivery);
    let mut server = server.launch().await.unwrap();
    let ledger = Arc::new(Ledger::default());
    let start = now_ms();
    let load = tokio::spawn(schedule_spread(
        Spread {
            grpc: server.grpc.clone(),
            topic: topic.to_owned(),
            run: random_name("m"),
            count,
            from_ms: start + 2_000,
            over_ms: window_ms,
            clients: 4,
            batch: 50,
            ingest_ms: window_ms as u64 * 6 / 10,
        },
        ledger.clone(),
    ));

    let mut kill_times = Vec::new();
    for _ in 0..kills {
        let pause = rand::random_range(300..(2 * window_ms as u64 / kills as u64).max(400));
        tokio::time::sleep(Duration::from_millis(pause)).await;
        server.kill();
        kill_times.push(now_ms());
        server.spawn().unwrap();
        server.wait_serving(Duration::from_secs(60)).await.unwrap();
    }
    let failed_calls = load.await.unwrap();
    let within = Duration::from_millis(window_ms as u64) + Duration::from_secs(120);
    let deliveries =
        collect_async(brokers, &[topic], ledger.expected(), within, Duration::from_secs(2)).await;
    let verdict = ledger.verdict(&deliveries);
    let found = server.metric("hourglass_reconcile_found_total").await.unwrap_or(-1.0);
    eprintln!(
        "kill -9 sweep ({brokers}, {delivery}): {count} messages over {window_ms} ms, {kills} kills, \
         {failed_calls} client calls cut, {found} found in doubt by the last restart; {}",
        verdict.summary()
    );
    verdict.assert_nothing_lost_or_early();
    assert_eq!(verdict.acknowledged, count);
    server.stop().unwrap();
    (verdict, kill_times)
}

/// 1 (continued). A crash at each fail point: mid-batch, between the durable
/// write and the answer, between Kafka's acknowledgement and the recorded
/// delivery; and a fatal error of the idempotent producer (raised through
/// librdkafka's test hook as when a broker lost its sequence state), after
/// which the server stops by itself with exit status 1.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_at_each_fail_point_loses_nothing() {
    let _serial = SERIAL.lock().await;
    for (point, nth) in FAIL_POINTS {
        let broker = Broker::start();
        let topic = random_name("crash");
        broker.create_topic(&topic, 2).await;
        let Crashed { verdict, at: crashed_at, mut server } =
            crash_at(point, nth, broker.addr(), &topic, (500, 4_000)).await;
        server.stop().unwrap();
        // Records Kafka took before the crash are found there after it, and
        // recorded rather than sent again. Tansu 0.6 can show a record its
        // producer died sending only once the partition's next record is
        // appended, seconds later: after the search. What is sent again
        // had its first copy out before the crash.
        for (id, at) in &verdict.duplicates {
            assert!(at[0] <= crashed_at, "{point}: {id} duplicated with no crash in between: {at:?}");
        }
        assert!(verdict.duplicates.len() <= 1, "{point}: {} duplicates", verdict.duplicates.len());
    }
}

/// 1 (continued). The crash points again, against librdkafka's mock
/// cluster, which shows a record as soon as it is appended: not one
/// duplicate.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_at_each_fail_point_sends_nothing_twice() {
    crash_points_on_mock("idempotent", FAIL_POINTS.to_vec()).await;
}

/// 1 (continued). The crash points with transactional delivery, against
/// the mock cluster: not one duplicate. (The producer's fatal error is the
/// idempotent producer's fail point; a fenced transactional producer is
/// `tests/transactions.rs`.)
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_at_each_fail_point_with_transactions_sends_nothing_twice() {
    let points = FAIL_POINTS.into_iter().filter(|(point, _)| *point != "kafka-fatal").collect();
    crash_points_on_mock("exactly-once", points).await;
}

/// A crash at each of `points` with `--delivery` `delivery`, against the
/// mock cluster, which shows a record as soon as it is appended: not one
/// duplicate.
#[cfg(feature = "failpoints")]
async fn crash_points_on_mock(delivery: &str, points: Vec<(&str, u32)>) {
    let _serial = SERIAL.lock().await;
    for (point, nth) in points {
        let mock = common::mock::Mock::start(1);
        let topic = random_name("crash");
        mock.topic_with(&topic, 2);
        let Crashed { verdict, at: crashed_at, mut server } =
            crash_with(point, nth, &mock.bootstrap(), &topic, (500, 4_000), delivery).await;
        server.stop().unwrap();
        assert!(
            verdict.duplicates.is_empty(),
            "{delivery}, {point}: {} duplicates, crashed at {crashed_at}: {:?}",
            verdict.duplicates.len(),
            verdict.duplicates.iter().take(3).collect::<Vec<_>>()
        );
    }
}

/// Mid-batch, between the durable write and the answer, between Kafka's
/// acknowledgement and the recorded delivery, and the producer failing for
/// good; each at the nth time it is reached.
#[cfg(feature = "failpoints")]
const FAIL_POINTS: [(&str, u32); 4] = [
    ("store-mid-batch", 20),
    ("store-before-ack", 30),
    ("dispatch-before-settle", 200),
    ("kafka-fatal", 500),
];

/// What [`crash_at`] saw: the verdict, when the server crashed, and the
/// server, running again.
#[cfg(feature = "failpoints")]
struct Crashed {
    verdict: Verdict,
    at: i64,
    server: ServerProcess,
}

/// Schedules 3,000 messages to `topic`, due from `due.0` ms from now over
/// `due.1` ms, through a server that aborts at `point`, restarts it
/// without, and judges what reached the topic.
#[cfg(feature = "failpoints")]
async fn crash_at(point: &str, nth: u32, brokers: &str, topic: &str, due: (i64, i64)) -> Crashed {
    crash_with(point, nth, brokers, topic, due, "idempotent").await
}

/// As [`crash_at`], with `--delivery` `delivery`.
#[cfg(feature = "failpoints")]
async fn crash_with(
    point: &str,
    nth: u32,
    brokers: &str,
    topic: &str,
    due: (i64, i64),
    delivery: &str,
) -> Crashed {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::new(Path::new(BIN), dir.path(), brokers, Durability::Sync).unwrap();
    server.env("HOURGLASS_FAILPOINT", &format!("{point}@{nth}"));
    server.env("HOURGLASS_DELIVERY", delivery);
    let mut server = server.launch().await.unwrap();
    let ledger = Arc::new(Ledger::default());
    let count = 3_000;
    let load = tokio::spawn(schedule_spread(
        Spread {
            grpc: server.grpc.clone(),
            topic: topic.to_owned(),
            run: random_name("m"),
            count,
            from_ms: now_ms() + due.0,
            over_ms: due.1,
            clients: 2,
            batch: 20,
            ingest_ms: 3_000,
        },
        ledger.clone(),
    ));
    let status = server.wait_exit(Duration::from_secs(120)).await.expect("the fail point was never reached");
    let crashed_at = now_ms();
    assert!(!status.success(), "{point}: the server exited cleanly instead of crashing");
    if point == "kafka-fatal" {
        assert_eq!(status.code(), Some(1), "a failed producer stops the server with status 1: {status}");
    }
    server.env("HOURGLASS_FAILPOINT", "");
    server.spawn().unwrap();
    server.wait_serving(Duration::from_secs(60)).await.unwrap();
    load.await.unwrap();
    let deliveries =
        collect_async(brokers, &[topic], ledger.expected(), Duration::from_secs(120), Duration::from_secs(2))
            .await;
    let verdict = ledger.verdict(&deliveries);
    eprintln!("crash at {point} ({brokers}, {delivery}): {}", verdict.summary());
    verdict.assert_nothing_lost_or_early();
    assert_eq!(verdict.acknowledged, count);
    Crashed { verdict, at: crashed_at, server }
}

/// 1 (continued). A restart after a kill in the middle of a drain produces
/// what is not in doubt while the search for what is runs (slowed here by
/// a fail point, so that it is seen running); a second kill in the middle
/// of that search, and a third restart, send nothing twice and lose
/// nothing. On the mock cluster, which shows a record as soon as it is
/// appended.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_mid_drain_dispatches_beside_the_search_and_a_crash_in_it_sends_nothing_twice() {
    let _serial = SERIAL.lock().await;
    let mock = common::mock::Mock::start(1);
    let topic = random_name("beside");
    mock.topic_with(&topic, 2);
    let brokers = mock.bootstrap();
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::new(Path::new(BIN), dir.path(), &brokers, Durability::Sync).unwrap();
    server.env("HOURGLASS_FAILPOINT", "dispatch-before-settle@300");
    // What is in doubt is at most what is in flight and read ahead: a
    // small window leaves most of the drain out of it.
    server.env("HOURGLASS_MAX_IN_FLIGHT", "1000");
    let mut server = server.launch().await.unwrap();
    let ledger = Arc::new(Ledger::default());
    let count = 12_000;
    // All due in one millisecond, scheduled before it: a drain.
    let spread = Spread {
        grpc: server.grpc.clone(),
        topic: topic.clone(),
        run: random_name("m"),
        count,
        from_ms: now_ms() + 4_000,
        over_ms: 1,
        clients: 4,
        batch: 200,
        ingest_ms: 0,
    };
    assert_eq!(schedule_spread(spread, ledger.clone()).await, 0, "every call answered");
    let status = server.wait_exit(Duration::from_secs(120)).await.expect("the fail point was never reached");
    assert!(!status.success(), "the server exited cleanly instead of crashing");

    // The search takes 5 s more: what lies past what the drain had read
    // goes out meanwhile.
    server.env("HOURGLASS_FAILPOINT", "reconcile-slow");
    server.spawn().unwrap();
    server.wait_serving(Duration::from_secs(60)).await.unwrap();
    let mut beside = 0.0;
    for _ in 0..200 {
        let searching = server.metric("hourglass_reconcile_searching").await.unwrap_or(0.0);
        let delivered = server.metric("hourglass_messages_delivered_total").await.unwrap_or(0.0);
        if searching == 1.0 && delivered > 0.0 {
            beside = delivered;
            break;
        }
        assert_eq!(
            server.metric("hourglass_reconcile_last_milliseconds").await.unwrap_or(0.0),
            0.0,
            "the search ended before anything was delivered beside it"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(beside > 0.0, "nothing was delivered while the search ran");
    // Killed again in the middle of the search, while it delivers.
    server.kill();
    let searched_again_from = now_ms();
    server.env("HOURGLASS_FAILPOINT", "");
    server.spawn().unwrap();
    server.wait_serving(Duration::from_secs(60)).await.unwrap();
    let deliveries = collect_async(
        &brokers,
        &[&topic],
        ledger.expected(),
        Duration::from_secs(120),
        Duration::from_secs(2),
    )
    .await;
    let verdict = ledger.verdict(&deliveries);
    let in_doubt = server.metric("hourglass_reconcile_in_doubt_total").await.unwrap_or(-1.0);
    let found = server.metric("hourglass_reconcile_found_total").await.unwrap_or(-1.0);
    eprintln!(
        "a drain cut by a kill, its restart killed while searching ({beside} delivered beside the \
         search, killed at {searched_again_from}): the last search had {in_doubt} in doubt and found \
         {found}; {}",
        verdict.summary()
    );
    verdict.assert_nothing_lost_or_early();
    assert_eq!(verdict.acknowledged, count);
    assert!(
        verdict.duplicates.is_empty(),
        "{} duplicates: {:?}",
        verdict.duplicates.len(),
        verdict.duplicates.iter().take(3).collect::<Vec<_>>()
    );
    assert!(found > 0.0, "the last search found what the two before it had produced unrecorded");
    server.stop().unwrap();
}

/// 1 (continued). A crash while other producers write to the same topic at
/// 20,000 records a second: after the restart, reconciliation reads back
/// from the marks (the last deliveries recorded per partition), not the
/// topic's whole traffic, and still sends nothing twice.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_beside_foreign_traffic_reads_back_only_past_the_marks() {
    let _serial = SERIAL.lock().await;
    let broker = Broker::start();
    let topic = random_name("busy");
    broker.create_topic(&topic, 4).await;
    let running = Arc::new(AtomicBool::new(true));
    let foreign = hourglass_testkit::other_producer(broker.addr(), &topic, 20_000, running.clone()).unwrap();
    // The topic's traffic before the first message is due is never read.
    let Crashed { verdict, mut server, .. } =
        crash_at("dispatch-before-settle", 1500, broker.addr(), &topic, (5_000, 6_000)).await;
    running.store(false, Ordering::Relaxed);
    let written = tokio::task::spawn_blocking(move || foreign.join().unwrap()).await.unwrap();
    let read = server.metric("hourglass_reconcile_records_read_total").await.unwrap();
    let found = server.metric("hourglass_reconcile_found_total").await.unwrap();
    let took = server.metric("hourglass_reconcile_last_milliseconds").await.unwrap();
    eprintln!(
        "crash beside foreign traffic: {written} foreign records; reconciliation read {read} records back, \
         found {found} in doubt, in {took} ms; {}",
        verdict.summary()
    );
    assert!(
        verdict.duplicates.is_empty(),
        "duplicates: {:?}",
        verdict.duplicates.iter().take(3).collect::<Vec<_>>()
    );
    assert!(took > 0.0, "a reconciliation ran");
    // Five seconds of the topic's traffic came before the first delivery:
    // a read from the partitions' start would take at least that.
    assert!(
        read < written as f64 / 4.0,
        "reconciliation read {read} of the topic's {written} foreign records: not bounded by the marks"
    );
    server.stop().unwrap();
}

/// 1 (continued). What a crash leaves of a batch it cut: nothing when it hit
/// before the write, everything when it hit after it. Read straight from the
/// store while the server is down.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_cut_by_a_crash_is_stored_whole_or_not_at_all() {
    let _serial = SERIAL.lock().await;
    let broker = Broker::start();
    let topic = random_name("atomic");
    broker.create_topic(&topic, 1).await;
    for (point, stored) in [("store-mid-batch", false), ("store-before-ack", true)] {
        let dir = tempfile::tempdir().unwrap();
        let mut server = server(dir.path(), &broker).await;
        server.env("HOURGLASS_FAILPOINT", point);
        let mut server = server.launch().await.unwrap();
        let run = random_name("b");
        let ids: Vec<String> = (0..100).map(|i| format!("{run}-{i}")).collect();
        let due = now_ms() + 3_600_000;
        let requests = ids.iter().map(|id| due_message(&topic, id, due)).collect();
        let reply = client(&server.grpc).schedule_batch(proto::ScheduleBatchRequest { requests }).await;
        assert!(reply.is_err(), "{point}: the batch was answered although the server crashed");
        assert!(server.wait_exit(Duration::from_secs(30)).await.is_some(), "{point}: no crash");

        let store = hourglass::store::Store::open(&hourglass::store::StoreConfig::new(dir.path())).unwrap();
        let mut found = 0;
        for id in &ids {
            if store
                .reader()
                .get(
                    hourglass::message::Scope::everything(),
                    hourglass::message::MessageId::parse(id).unwrap(),
                )
                .await
                .unwrap()
                .is_some()
            {
                found += 1;
            }
        }
        store.close().await;
        eprintln!("crash at {point}: {found} of {} items of the cut batch stored", ids.len());
        assert_eq!(found, if stored { ids.len() } else { 0 }, "{point}: a batch is atomic");
    }
}

/// 2. The broker goes away while messages come due and new ones are
/// scheduled. Scheduling keeps working, delivery resumes when the broker
/// returns, memory stays bounded, nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_outage_loses_nothing_and_scheduling_goes_on() {
    let _serial = SERIAL.lock().await;
    let outage = Duration::from_secs(scale(15, 60));
    let mut broker = Broker::start_persistent();
    let topic = random_name("outage");
    broker.create_topic(&topic, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), &broker).await.launch().await.unwrap();
    let ledger = Arc::new(Ledger::default());
    let running = Arc::new(AtomicBool::new(true));
    let refused = Arc::new(AtomicU64::new(0));
    // A steady 200 messages/s, each due 1 to 3 s after it is scheduled.
    let load = {
        let (mut client, topic, ledger, running, refused) =
            (client(&server.grpc), topic.clone(), ledger.clone(), running.clone(), refused.clone());
        let run = random_name("m");
        tokio::spawn(async move {
            let mut i = 0u64;
            while running.load(Ordering::Relaxed) {
                let requests: Vec<_> = (i..i + 10)
                    .map(|n| {
                        due_message(&topic, &format!("{run}-{n}"), now_ms() + 1_000 + (n % 2_000) as i64)
                    })
                    .collect();
                i += 10;
                let give_up = Instant::now() + Duration::from_secs(300);
                refused.fetch_add(
                    schedule_until_acked(&mut client, requests, &ledger, give_up).await,
                    Ordering::Relaxed,
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let rss = sample_rss(server.pid().unwrap(), running.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before_outage = ledger.len();
    broker.stop();
    tokio::time::sleep(outage).await;
    let during_outage = ledger.len() - before_outage;
    let reachable = server.metric("hourglass_kafka_reachable").await.unwrap();
    assert_eq!(reachable, 0.0, "the outage shows in hourglass_kafka_reachable");
    let delivered_before_return = server.metric("hourglass_messages_delivered_total").await.unwrap();
    broker.resume();
    let returned = Instant::now();
    server
        .wait_metric(
            "hourglass_messages_delivered_total",
            delivered_before_return + 1.0,
            Duration::from_secs(120),
        )
        .await
        .unwrap();
    let resumed_after = returned.elapsed();
    server.wait_metric("hourglass_kafka_reachable", 1.0, Duration::from_secs(30)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    running.store(false, Ordering::Relaxed);
    load.await.unwrap();
    let peak = rss.await.unwrap();
    let verdict = judge(&broker, &topic, &ledger, Duration::from_secs(180)).await;
    eprintln!(
        "broker outage of {outage:?}: {during_outage} messages scheduled while it was down, {} calls refused; \
         delivery resumed {resumed_after:?} after the broker returned; peak RSS {} MiB; {}",
        refused.load(Ordering::Relaxed),
        peak / MIB,
        verdict.summary()
    );
    verdict.assert_nothing_lost_or_early();
    assert!(during_outage > 0, "scheduling stopped during the outage");
    assert_eq!(refused.load(Ordering::Relaxed), 0, "scheduling was refused during the outage");
    assert!(peak < 1024 * MIB, "memory grew to {} MiB", peak / MIB);
}

/// 4. A million messages due in the same instant (fewer in CI), with a
/// trickle due just after. All delivered once, memory bounded, and the
/// trickle's lateness reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_due_at_once_is_delivered_with_bounded_memory() {
    let _serial = SERIAL.lock().await;
    let burst = scale(50_000, 1_000_000);
    let broker = Broker::start();
    let (topic, trickle_topic) = (random_name("burst"), random_name("trickle"));
    broker.create_topic(&topic, 4).await;
    broker.create_topic(&trickle_topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), &broker).await.launch().await.unwrap();
    let ledger = Arc::new(Ledger::default());
    // Room to park the burst first: ~100k/s here at the least.
    let due = now_ms() + 5_000 + burst as i64 / 50;
    schedule_spread(
        Spread {
            grpc: server.grpc.clone(),
            topic: topic.clone(),
            run: random_name("b"),
            count: burst,
            from_ms: due,
            over_ms: 0,
            clients: 4,
            batch: 1_000,
            ingest_ms: 0,
        },
        ledger.clone(),
    )
    .await;
    assert!(now_ms() < due, "parking the burst took past its due time; lower the scale");
    let trickle = 500;
    let trickle_ledger = Arc::new(Ledger::default());
    let running = Arc::new(AtomicBool::new(true));
    let rss = sample_rss(server.pid().unwrap(), running.clone());
    schedule_spread(
        Spread {
            grpc: server.grpc.clone(),
            topic: trickle_topic.clone(),
            run: random_name("t"),
            count: trickle,
            from_ms: due + 100,
            over_ms: 5_000,
            clients: 1,
            batch: 50,
            ingest_ms: 0,
        },
        trickle_ledger.clone(),
    )
    .await;
    let verdict = judge(&broker, &topic, &ledger, Duration::from_secs(600)).await;
    running.store(false, Ordering::Relaxed);
    let peak = rss.await.unwrap();
    let trickle_verdict = judge(&broker, &trickle_topic, &trickle_ledger, Duration::from_secs(60)).await;
    eprintln!(
        "burst of {burst}: peak RSS {} MiB; burst: {}; trickle of {trickle} due after it: {}",
        peak / MIB,
        verdict.summary(),
        trickle_verdict.summary()
    );
    for v in [&verdict, &trickle_verdict] {
        v.assert_nothing_lost_or_early();
        assert!(v.duplicates.is_empty(), "duplicates without a crash: {:?}", &v.duplicates[..1]);
    }
    assert!(peak < 2048 * MIB, "memory grew to {} MiB", peak / MIB);
}

/// 9. SIGTERM under load: the server exits within its grace period, and after
/// a restart nothing is lost and nothing is sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_under_load_exits_in_grace_and_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let grace = Duration::from_secs(5);
    let broker = Broker::start();
    let topic = random_name("term");
    broker.create_topic(&topic, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let mut server = server(dir.path(), &broker).await.arg("--shutdown-grace", "5s").launch().await.unwrap();
    let ledger = Arc::new(Ledger::default());
    let count = scale(20_000, 200_000);
    let load = tokio::spawn(schedule_spread(
        Spread {
            grpc: server.grpc.clone(),
            topic: topic.clone(),
            run: random_name("m"),
            count,
            from_ms: now_ms() + 500,
            over_ms: 10_000,
            clients: 4,
            batch: 50,
            ingest_ms: 8_000,
        },
        ledger.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let asked = Instant::now();
    server.stop().unwrap();
    let took = asked.elapsed();
    server.spawn().unwrap();
    server.wait_serving(Duration::from_secs(60)).await.unwrap();
    let cut_calls = load.await.unwrap();
    let verdict = judge(&broker, &topic, &ledger, Duration::from_secs(120)).await;
    eprintln!(
        "SIGTERM under load: exited {took:?} after SIGTERM (grace {grace:?}), {cut_calls} client calls cut; {}",
        verdict.summary()
    );
    verdict.assert_nothing_lost_or_early();
    assert!(
        verdict.duplicates.is_empty(),
        "duplicates after a graceful stop: {:?}",
        &verdict.duplicates[..1]
    );
    assert!(took < grace + Duration::from_secs(10), "shutdown took {took:?}, grace is {grace:?}");
    server.stop().unwrap();
}

/// 11. Far more concurrent callers than the server serves at once, each
/// calling again as soon as it is answered: the excess is refused at once
/// with RESOURCE_EXHAUSTED (or UNAVAILABLE), memory stays bounded, and every
/// call that was answered OK is durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overload_is_refused_quickly_and_what_is_accepted_is_kept() {
    let _serial = SERIAL.lock().await;
    let limit = 64;
    let (connections, callers, seconds) = scale((16, 1_024, 5), (32, 4_096, 20));
    let broker = Broker::start();
    let topic = random_name("overload");
    broker.create_topic(&topic, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let server =
        server(dir.path(), &broker).await.arg("--max-concurrent-requests", limit).launch().await.unwrap();
    let running = Arc::new(AtomicBool::new(true));
    let rss = sample_rss(server.pid().unwrap(), running.clone());
    let run = random_name("o");
    let due = now_ms() + 5_000 + seconds * 1_000;
    let until = Instant::now() + Duration::from_secs(seconds as u64);
    let mut channels = Vec::new();
    for _ in 0..connections {
        channels
            .push(Channel::from_shared(format!("http://{}", server.grpc)).unwrap().connect().await.unwrap());
    }
    let mut tasks = Vec::new();
    for c in 0..callers {
        let mut client = SchedulerClient::new(channels[c % connections].clone());
        let (topic, run) = (topic.clone(), run.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            let mut n = 0;
            while Instant::now() < until {
                let id = format!("{run}-{c}-{n}");
                n += 1;
                let started = Instant::now();
                let reply = client.schedule(due_message(&topic, &id, due)).await;
                out.push((id, reply.map(|r| r.into_inner()).map_err(|s| s.code()), started.elapsed()));
            }
            out
        }));
    }
    let ledger = Ledger::default();
    let (mut accepted_times, mut refusal_times, mut refused_ids) = (Vec::new(), Vec::new(), Vec::new());
    for task in tasks {
        for (id, reply, took) in task.await.unwrap() {
            match reply {
                Ok(s) => {
                    ledger.ack(&s.id, millis(s.deliver_at.as_ref().unwrap()), &topic);
                    accepted_times.push(took);
                }
                Err(Code::ResourceExhausted | Code::Unavailable) => {
                    refusal_times.push(took);
                    refused_ids.push(id);
                }
                Err(code) => panic!("{id}: unexpected {code:?} under overload"),
            }
        }
    }
    running.store(false, Ordering::Relaxed);
    let peak = rss.await.unwrap();
    let ms = |mut v: Vec<Duration>, q: f64| {
        v.sort_unstable();
        v.get(((v.len().max(1) - 1) as f64 * q) as usize).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    eprintln!(
        "overload: {callers} callers over {connections} connections for {seconds} s against a limit of {limit}: \
         {} accepted (latency p50 {:.1} ms, p99 {:.1} ms), {} refused (latency p50 {:.1} ms, p99 {:.1} ms); \
         peak RSS {} MiB",
        accepted_times.len(),
        ms(accepted_times.clone(), 0.5),
        ms(accepted_times.clone(), 0.99),
        refusal_times.len(),
        ms(refusal_times.clone(), 0.5),
        ms(refusal_times.clone(), 0.99),
        peak / MIB
    );
    assert!(!refusal_times.is_empty(), "the overload was all served; raise it");
    assert!(!ledger.is_empty(), "nothing was accepted");
    assert!(peak < 1024 * MIB, "memory grew to {} MiB", peak / MIB);
    // Refused calls stored nothing; accepted ones are all delivered.
    let mut client = client(&server.grpc);
    assert_not_stored(&mut client, refused_ids.iter().step_by((refused_ids.len() / 200).max(1))).await;
    let verdict = judge(&broker, &topic, &ledger, Duration::from_secs(180)).await;
    eprintln!("overload, accepted calls: {}", verdict.summary());
    verdict.assert_nothing_lost_or_early();
    assert!(verdict.duplicates.is_empty());
}

/// 5. A backlog cap: beyond it Schedule says RESOURCE_EXHAUSTED and stores
/// nothing, health says NOT_SERVING; deliveries make room and it serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_cap_refuses_more_and_recovers_as_messages_leave() {
    let _serial = SERIAL.lock().await;
    let cap = 1_000;
    let broker = Broker::start();
    let topic = random_name("cap");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), &broker).await.arg("--max-pending", cap).launch().await.unwrap();
    let mut client = client(&server.grpc);
    let run = random_name("c");
    // Far enough out that none is delivered (making room) while the
    // 1,200 calls are made one by one, each waiting for its fsync, on a
    // busy machine.
    let due = now_ms() + 30_000;
    let ledger = Ledger::default();
    let (mut refused, mut refused_ids) = (0, Vec::new());
    for i in 0..cap + 200 {
        let id = format!("{run}-{i}");
        match client.schedule(due_message(&topic, &id, due)).await {
            Ok(r) => {
                let s = r.into_inner();
                ledger.ack(&s.id, millis(s.deliver_at.as_ref().unwrap()), &topic);
            }
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(status.message().contains("--max-pending"), "{}", status.message());
                refused += 1;
                refused_ids.push(id);
            }
        }
    }
    assert_eq!(ledger.len(), cap, "exactly the cap is accepted");
    assert_eq!(refused, 200);
    assert_eq!(server.health().await.unwrap(), ServingStatus::NotServing, "full: not serving");
    assert_not_stored(&mut client, &refused_ids).await;
    let verdict = judge(&broker, &topic, &ledger, Duration::from_secs(120)).await;
    eprintln!("backlog cap of {cap}: {refused} refused past it; {}", verdict.summary());
    verdict.assert_nothing_lost_or_early();
    wait_for_health(&server, ServingStatus::Serving, Duration::from_secs(30)).await;
    let again = client.schedule(due_message(&topic, &format!("{run}-after"), now_ms() + 100)).await;
    assert!(again.is_ok(), "room again after deliveries: {again:?}");
}

async fn wait_for_health(server: &ServerProcess, want: ServingStatus, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if server.health().await.ok() == Some(want) {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "health did not become {want:?} within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// 5. A full disk: the store on a small tmpfs. Schedule says
/// RESOURCE_EXHAUSTED (never OK for what was not stored), health says
/// NOT_SERVING; once there is room again it serves, and everything
/// acknowledged is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_refuses_writes_and_recovers_when_space_is_back() {
    let _serial = SERIAL.lock().await;
    let mount = Tmpfs::mount(32);
    let broker = Broker::start();
    let topic = random_name("disk");
    broker.create_topic(&topic, 1).await;
    let data = mount.path.join("store");
    let server = server(&data, &broker).await.launch().await.unwrap();
    let mut client = client(&server.grpc);
    let run = random_name("d");
    let ledger = Ledger::default();
    // Due once the disk has been full for a while and has room again.
    let due = now_ms() + 20_000;
    let value = vec![b'x'; 16 * 1024];
    let (mut refused, mut i) = (0, 0);
    let mut last_code = None;
    while refused < 20 && i < 20_000 {
        let mut request = due_message(&topic, &format!("{run}-{i}"), due);
        request.message.as_mut().unwrap().value = value.clone();
        match client.schedule(request).await {
            Ok(r) => {
                let s = r.into_inner();
                ledger.ack(&s.id, millis(s.deliver_at.as_ref().unwrap()), &topic);
            }
            Err(status) => {
                assert!(
                    matches!(status.code(), Code::ResourceExhausted | Code::Unavailable),
                    "a full disk gives {status:?}"
                );
                last_code = Some((status.code(), status.message().to_owned()));
                refused += 1;
            }
        }
        i += 1;
    }
    assert!(refused > 0, "the disk never filled");
    let accepted = ledger.len();
    let not_serving = wait_for_health(&server, ServingStatus::NotServing, Duration::from_secs(30)).await;
    eprintln!("{} adding space", chrono::Utc::now());
    mount.resize(256);
    let serving_again = wait_for_health(&server, ServingStatus::Serving, Duration::from_secs(120)).await;
    let verdict = judge(&broker, &topic, &ledger, Duration::from_secs(180)).await;
    eprintln!(
        "full disk (32 MiB tmpfs, 16 KiB values): {accepted} accepted, then {refused} refused with {last_code:?}; \
         NOT_SERVING seen after {not_serving:?}; SERVING {serving_again:?} after space was added; {}",
        verdict.summary()
    );
    verdict.assert_nothing_lost_or_early();
    assert!(verdict.duplicates.is_empty());
    drop(server);
}

/// A tmpfs of a given size, mounted for one test and unmounted after.
struct Tmpfs {
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mib: u64) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&path)
            .status()
            .expect("running mount");
        assert!(
            status.success(),
            "cannot mount a tmpfs at {} (the disk-full scenario runs as root)",
            path.display()
        );
        Tmpfs { path, _dir: dir }
    }

    fn resize(&self, mib: u64) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={mib}m")])
            .arg(&self.path)
            .status()
            .unwrap();
        assert!(status.success(), "cannot resize the tmpfs");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// 5 (continued). The disk fills while messages come due: the dispatcher
/// stops once a commit of deliveries fails (what it produced and has not
/// recorded is bounded by twice `--max-in-flight`, however slowly the
/// failure is reported),
/// health stays NOT_SERVING even across calls that write nothing, memory
/// stays bounded, SIGTERM exits within its grace plus the writer's last
/// tries; with room again every message is delivered, and only what went
/// out unrecorded goes out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_stops_dispatching_and_sigterm_still_exits() {
    let _serial = SERIAL.lock().await;
    let mount = Tmpfs::mount(64);
    let broker = Broker::start();
    let topic = random_name("full");
    broker.create_topic(&topic, 2).await;
    let data = mount.path.join("store");
    let max_in_flight = 50;
    let mut server = server(&data, &broker)
        .await
        .arg("--max-in-flight", max_in_flight)
        .arg("--shutdown-grace", "3s")
        .launch()
        .await
        .unwrap();
    let mut client = client(&server.grpc);
    let run = random_name("f");
    let ledger = Ledger::default();
    let count = 2_000;
    let due = now_ms() + 10_000;
    for chunk in (0..count).collect::<Vec<_>>().chunks(200) {
        let requests = chunk
            .iter()
            .map(|i| {
                let mut m = due_message(&topic, &format!("{run}-{i}"), due);
                m.message.as_mut().unwrap().value = vec![b'x'; 4096];
                m
            })
            .collect();
        schedule_until_acked(&mut client, requests, &ledger, Instant::now() + Duration::from_secs(60)).await;
    }
    // Fill what is left of the disk.
    let filler = mount.path.join("filler");
    let _ = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", filler.display()))
        .stderr(std::process::Stdio::null())
        .status();
    let running = Arc::new(AtomicBool::new(true));
    let rss = sample_rss(server.pid().unwrap(), running.clone());
    tokio::time::sleep(Duration::from_millis((due - now_ms()).max(0) as u64 + 5_000)).await;
    assert_eq!(server.health().await.unwrap(), ServingStatus::NotServing, "writes fail: not serving");
    // Calls that write nothing do not make it look healthy.
    for _ in 0..5 {
        let _ = client.cancel(proto::CancelRequest { id: "never-was".into(), ..Default::default() }).await;
        let _ = client.get(proto::GetRequest { id: "never-was".into(), ..Default::default() }).await;
        assert_eq!(server.health().await.unwrap(), ServingStatus::NotServing, "health flapped");
    }
    let during =
        consume_async(&broker, &topic, usize::MAX, Duration::from_secs(3), Duration::ZERO).await.len();
    let asked = Instant::now();
    let pid = server.pid().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let exited = server.wait_exit(Duration::from_secs(20)).await;
    let took = asked.elapsed();
    running.store(false, Ordering::Relaxed);
    let peak = rss.await.unwrap();
    eprintln!(
        "full disk while {count} came due: {during} produced before dispatching stopped (max in flight \
         {max_in_flight}); SIGTERM exited in {took:?}; peak RSS {} MiB",
        peak / MIB
    );
    assert!(exited.is_some(), "SIGTERM did not end the server within 20 s");
    assert!(during < count, "kept producing while deliveries could not be recorded: {during}");
    assert!(peak < 512 * MIB, "memory grew to {} MiB", peak / MIB);

    std::fs::remove_file(&filler).unwrap();
    server.spawn().unwrap();
    server.wait_serving(Duration::from_secs(60)).await.unwrap();
    let verdict = judge(&broker, &topic, &ledger, Duration::from_secs(120)).await;
    eprintln!("full disk, after room came back: {}", verdict.summary());
    verdict.assert_nothing_lost_or_early();
    // What went out unrecorded goes out again after the restart, and no
    // more was produced unrecorded than twice the in-flight limit.
    // (Whatever was produced before the write space ran out was recorded.)
    // A copy from before SIGTERM marks a message of that window; a message
    // whose copies all came after the restart was sent twice by the
    // producer's own retries, and is reported apart.
    let stopped_at = now_ms() - asked.elapsed().as_millis() as i64;
    let (window, retried): (Vec<_>, Vec<_>) =
        verdict.duplicates.iter().partition(|(_, copies)| copies.iter().any(|&t| t < stopped_at));
    eprintln!(
        "full disk: {} produced unrecorded and sent again after the restart; {} sent twice after it",
        window.len(),
        retried.len()
    );
    assert!(window.len() <= during, "only what went out unrecorded goes out again");
    assert!(
        window.len() <= 2 * max_in_flight,
        "kept producing while deliveries could not be recorded: {} of {during}",
        window.len()
    );
}

/// 14. Reading some due messages fails (an I/O error, injected): the
/// others go out on time, health says NOT_SERVING while reads fail, and
/// the failed ones are read again and delivered once.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_that_cannot_be_read_hold_nothing_else_back() {
    let _serial = SERIAL.lock().await;
    let broker = Broker::start();
    let topic = random_name("unreadable");
    broker.create_topic(&topic, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let mut server = server(dir.path(), &broker).await;
    server.env("HOURGLASS_FAILPOINT", "store-read-io@20..45");
    let server = server.launch().await.unwrap();
    let ledger = Arc::new(Ledger::default());
    let count = 400;
    schedule_spread(
        Spread {
            grpc: server.grpc.clone(),
            topic: topic.clone(),
            run: random_name("r"),
            count,
            from_ms: now_ms() + 2_000,
            over_ms: 4_000,
            clients: 2,
            batch: 50,
            ingest_ms: 0,
        },
        ledger.clone(),
    )
    .await;
    let mut not_serving = false;
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        not_serving |= server.health().await.ok() == Some(ServingStatus::NotServing);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let verdict = judge(&broker, &topic, &ledger, Duration::from_secs(60)).await;
    eprintln!("26 reads failed among {count} due messages: {}", verdict.summary());
    verdict.assert_nothing_lost_or_early();
    assert!(verdict.duplicates.is_empty());
    assert!(not_serving, "health never said the store could not read");
    wait_for_health(&server, ServingStatus::Serving, Duration::from_secs(10)).await;
    // Held back by a second at most (one retry), not stalled behind.
    assert!(verdict.lateness(0.99) < 3_000, "p99 lateness {} ms", verdict.lateness(0.99));
}
