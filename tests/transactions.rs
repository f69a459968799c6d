//! Transactional delivery (`--delivery exactly-once`) against librdkafka's
//! mock cluster, which implements Kafka's transactions (InitProducerId with
//! a transactional id, AddPartitionsToTxn, EndTxn) and lets a test make the
//! broker refuse a request. Tansu 0.6 does not route EndTxn.
//!
//! What the mock does not do, and these tests therefore do not show: it
//! keeps an aborted transaction's records visible to `read_committed`
//! readers, and it gives a second producer of a transactional id an id of
//! its own instead of fencing the first. The fence is made here as the
//! broker's answer (PRODUCER_FENCED); the abort is made where no record of
//! the aborted transaction was appended.

// Apart from `tests/it/`: it reads the Prometheus registry of the servers
// it starts in this process, which every server in the process shares.
#[path = "it/common/mod.rs"]
mod common;

use std::{collections::HashMap, path::Path, time::Duration};

use common::{
    mock::{Mock, RDKafkaRespErr as RespErr},
    *,
};
use hourglass::{
    config::{Config, DeliveryMode},
    proto::{self, GetRequest},
    store::Durability,
};
use hourglass_testkit::ServerProcess;
use rdkafka::types::RDKafkaApiKey;

const BIN: &str = env!("CARGO_BIN_EXE_hourglass");

/// The in-process servers share one metrics registry: one test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn exactly_once(mock: &Mock, dir: &std::path::Path) -> Config {
    Config { delivery: DeliveryMode::ExactlyOnce, ..config_at(&mock.bootstrap(), dir) }
}

async fn records(mock: &Mock, topic: &str, count: usize, settle: Duration) -> Vec<Received> {
    let (bootstrap, topic) = (mock.bootstrap(), topic.to_owned());
    tokio::task::spawn_blocking(move || consume(&bootstrap, &topic, count, Duration::from_secs(60), settle))
        .await
        .unwrap()
}

/// How many copies of each id arrived.
fn copies(got: &[Received]) -> HashMap<String, usize> {
    let mut copies = HashMap::new();
    for r in got {
        *copies.entry(r.id().to_owned()).or_default() += 1;
    }
    copies
}

/// Every one of `ids` arrived, and each once.
fn each_once(got: &[Received], ids: &[String]) {
    let copies = copies(got);
    let missing: Vec<_> = ids.iter().filter(|id| !copies.contains_key(*id)).take(5).collect();
    assert!(missing.is_empty(), "not delivered: {missing:?}");
    let twice: Vec<_> = copies.iter().filter(|&(_, &n)| n > 1).take(5).collect();
    assert!(twice.is_empty(), "sent twice: {twice:?}");
}

/// Every message `ledger` acknowledged reached `topic` within `within`,
/// none early, each once.
async fn delivered_once(mock: &Mock, topic: &str, ledger: &verify::Ledger, within: Duration, what: &str) {
    let deliveries =
        verify::collect_async(&mock.bootstrap(), &[topic], ledger.expected(), within, Duration::from_secs(3))
            .await;
    let verdict = ledger.verdict(&deliveries);
    eprintln!("{what} (mock cluster): {}", verdict.summary());
    verdict.assert_nothing_lost_or_early();
    assert!(
        verdict.duplicates.is_empty(),
        "duplicates: {:?}",
        verdict.duplicates.iter().take(5).collect::<Vec<_>>()
    );
}

/// The mock cluster with a fresh topic of `partitions`, and a standalone
/// hourglass in this process delivering to it with transactions.
struct Standalone {
    mock: Mock,
    topic: String,
    dir: tempfile::TempDir,
    server: Hourglass,
}

impl Standalone {
    async fn start(prefix: &str, partitions: i32) -> Standalone {
        let mock = Mock::start(1);
        let topic = random_name(prefix);
        mock.topic_with(&topic, partitions);
        let dir = tempfile::tempdir().unwrap();
        let server = Hourglass::start(exactly_once(&mock, dir.path())).await;
        Standalone { mock, topic, dir, server }
    }
}

async fn schedule_due_in(server: &Hourglass, topic: &str, ids: &[String], delay: Duration) {
    let mut client = server.client().await;
    let due = chrono::Utc::now().timestamp_millis() + delay.as_millis() as i64;
    for chunk in ids.chunks(500) {
        let requests = chunk.iter().map(|id| verify::due_message(topic, id, due)).collect();
        client.schedule_batch(proto::ScheduleBatchRequest { requests }).await.unwrap();
    }
}

/// Every message goes out once, in committed transactions, and what the
/// store records for it is where the consumer found it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deliveries_go_out_in_committed_transactions_and_are_recorded_where_they_landed() {
    let _serial = SERIAL.lock().await;
    let Standalone { mock, topic, dir: _dir, server } = Standalone::start("txn", 3).await;
    let committed_before = metric(&server, "hourglass_transactions_total{outcome=\"committed\"}").await;
    let records_before = metric(&server, "hourglass_transaction_records_sum").await;

    let ids: Vec<String> = (0..2_000).map(|i| format!("{}-{i}", random_name("m"))).collect();
    schedule_due_in(&server, &topic, &ids, Duration::from_millis(800)).await;
    let got = records(&mock, &topic, ids.len(), Duration::from_secs(2)).await;
    each_once(&got, &ids);

    // Reports reach the store only once their transaction is committed:
    // every delivered record was in one, and the store says where it is.
    let mut client = server.client().await;
    for _ in 0..100 {
        if metric(&server, "hourglass_messages_delivered_total").await >= ids.len() as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let committed = metric(&server, "hourglass_transaction_records_sum").await - records_before;
    assert_eq!(committed, ids.len() as f64, "every record in a committed transaction");
    let transactions =
        metric(&server, "hourglass_transactions_total{outcome=\"committed\"}").await - committed_before;
    assert!(transactions >= 1.0 && transactions <= ids.len() as f64, "{transactions} transactions");
    let at: HashMap<&str, (i32, i64)> = got.iter().map(|r| (r.id(), (r.partition, r.offset))).collect();
    for id in ids.iter().step_by(97) {
        let message =
            client.get(GetRequest { id: id.clone(), ..Default::default() }).await.unwrap().into_inner();
        let Some(proto::get_response::Settlement::Delivered(d)) = message.settlement else {
            panic!("{id} is not recorded as delivered: {message:?}");
        };
        assert_eq!((d.partition, d.offset), at[id.as_str()], "{id}: recorded where the consumer found it");
    }
    eprintln!("{} messages in {transactions} committed transactions", ids.len());
    server.stop().await;
}

/// A record the broker refuses aborts its transaction; the record comes
/// back to the dispatcher with its own error, is tried again, and is
/// delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_record_aborts_its_transaction_and_is_delivered_once_on_the_retry() {
    let _serial = SERIAL.lock().await;
    let Standalone { mock, topic, dir: _dir, server } = Standalone::start("txn-abort", 1).await;
    let aborted_before = metric(&server, "hourglass_transactions_total{outcome=\"aborted\"}").await;
    let refused_before = metric(&server, "hourglass_kafka_produce_errors_total{kind=\"rejected\"}").await;

    // The first Produce is refused whole: nothing of the transaction is
    // appended (the mock would keep it visible after the abort).
    mock.fail_next(RDKafkaApiKey::Produce, &[RespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE]);
    let id = random_name("m");
    schedule_due_in(&server, &topic, std::slice::from_ref(&id), Duration::from_millis(300)).await;
    let got = records(&mock, &topic, 1, Duration::from_secs(2)).await;
    assert_eq!(copies(&got).get(&id), Some(&1), "delivered once: {got:?}");

    let aborted = metric(&server, "hourglass_transactions_total{outcome=\"aborted\"}").await - aborted_before;
    assert!(aborted >= 1.0, "the transaction of the refused record was aborted");
    let mut client = server.client().await;
    let message = client.get(GetRequest { id: id.clone(), ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(message.state, proto::State::Delivered as i32, "{message:?}");
    let refused =
        metric(&server, "hourglass_kafka_produce_errors_total{kind=\"rejected\"}").await - refused_before;
    assert_eq!(refused, 1.0, "the refusal reached the dispatcher as the record's own");
    server.stop().await;
}

/// Transactions the broker keeps refusing with no record to blame (here
/// it refuses to add the topic's partition to them) are not retried in a
/// tight loop: after a few aborts the records go back to the dispatcher
/// with the broker's error, which holds the topic and probes it with
/// backoff, as without transactions. Once the broker takes them, each is
/// delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_refused_for_a_topic_hand_it_to_the_dispatchers_hold() {
    let _serial = SERIAL.lock().await;
    let Standalone { mock, topic, dir: _dir, server } = Standalone::start("txn-refused", 1).await;
    let refused_before = metric(&server, "hourglass_kafka_produce_errors_total{kind=\"rejected\"}").await;
    let aborted_before = metric(&server, "hourglass_transactions_total{outcome=\"aborted\"}").await;
    mock.fail_next(
        RDKafkaApiKey::AddPartitionsToTxn,
        &[RespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 8],
    );
    let ids: Vec<String> = (0..20).map(|i| format!("{}-{i}", random_name("m"))).collect();
    schedule_due_in(&server, &topic, &ids, Duration::from_millis(300)).await;
    let got = records(&mock, &topic, ids.len(), Duration::from_secs(2)).await;
    each_once(&got, &ids);
    let aborted = metric(&server, "hourglass_transactions_total{outcome=\"aborted\"}").await - aborted_before;
    let refused =
        metric(&server, "hourglass_kafka_produce_errors_total{kind=\"rejected\"}").await - refused_before;
    eprintln!("{aborted} transactions aborted, {refused} refusals reached the dispatcher");
    assert!(aborted >= 3.0, "the refused transactions were aborted: {aborted}");
    assert!(refused >= 1.0, "the topic's refusal reached the dispatcher, which held it");
    server.stop().await;
}

/// A standalone node whose transactional producer is fenced (another
/// process took its transactional id) stops with an error that says so,
/// keeps every undelivered message, and delivers each once when started
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fenced_node_stops_and_its_restart_delivers_each_message_once() {
    let _serial = SERIAL.lock().await;
    let Standalone { mock, topic, dir, server } = Standalone::start("txn-fenced", 2).await;
    let ids: Vec<String> = (0..300).map(|i| format!("{}-{i}", random_name("m"))).collect();
    // The broker answers the first commit: a newer producer of this id.
    mock.fail_next(RDKafkaApiKey::EndTxn, &[RespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED]);
    schedule_due_in(&server, &topic, &ids, Duration::from_millis(500)).await;
    let error = server.stopped(Duration::from_secs(60)).await.expect_err("a fenced node stops with an error");
    let said = format!("{error:#}");
    assert!(said.contains("fenced"), "the error names the fence: {said}");

    // Restarted (the broker no longer refuses): what the fenced
    // transaction held is settled once. On Kafka it was aborted and is
    // produced again; the mock keeps it visible, and the restart finds it.
    let server = Hourglass::start(exactly_once(&mock, dir.path())).await;
    let got = records(&mock, &topic, ids.len(), Duration::from_secs(3)).await;
    each_once(&got, &ids);
    server.stop().await;
}

/// Cluster mode with transactional delivery: two `hourglass serve
/// --cluster --delivery exactly-once` processes on the mock cluster (the
/// log, routing and ingress topics made beforehand: the mock does not
/// create topics). One is killed with SIGKILL while messages come due, and the
/// other takes its shards: each new owner's transactional producer (the
/// shard's id, the same on both nodes) starts before it reads the target
/// topic back or produces. Every message delivered, once, none early.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_failover_with_transactions_delivers_each_message_once() {
    let _serial = SERIAL.lock().await;
    let mock = Mock::start(1);
    let topic = random_name("txn-orders");
    let log_topic = random_name("hourglass-log");
    let partitions = 4;
    mock.topic_with(&topic, 2);
    mock.topic_with(&log_topic, partitions);
    mock.topic_with(&format!("{log_topic}-owners"), 1);
    mock.topic_with(&format!("{log_topic}-ingress"), partitions);
    let group = random_name("hourglass");
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes: Vec<ServerProcess> =
        dirs.iter().map(|d| cluster_node(&mock, d.path(), &log_topic, &group, partitions)).collect();
    for node in &mut nodes {
        node.spawn().unwrap();
    }
    for node in &mut nodes {
        node.wait_serving(Duration::from_secs(120)).await.unwrap();
    }

    let ledger = verify::Ledger::default();
    let count = 1_500;
    let (start, over) = (chrono::Utc::now().timestamp_millis() + 2_000, 10_000);
    let mut client = reconnecting_client(&nodes[0].grpc, Duration::from_secs(20));
    let run = random_name("m");
    let ids: Vec<String> = (0..count).map(|i| format!("{run}-{i}")).collect();
    for (n, chunk) in ids.chunks(50).enumerate() {
        let requests: Vec<_> = chunk
            .iter()
            .map(|id| {
                let i: i64 = id.rsplit('-').next().unwrap().parse().unwrap();
                verify::due_message(&topic, id, start + over * i / count as i64)
            })
            .collect();
        // Through node 0, which forwards what node 1 owns (until it is
        // killed, a third of the way through; then it owns everything).
        // Items of a shard on the move answer UNAVAILABLE: sent again.
        let mut pending = requests;
        while !pending.is_empty() {
            let batch = proto::ScheduleBatchRequest { requests: pending.clone() };
            let results = match client.schedule_batch(batch).await {
                Ok(reply) => reply.into_inner().results,
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(status) => panic!("scheduling failed: {status:?}"),
            };
            let mut again = Vec::new();
            for item in results {
                let request = &pending[item.index as usize];
                match item.result {
                    Some(proto::schedule_result::Result::Scheduled(done)) => {
                        ledger.ack(&done.id, millis(done.deliver_at.as_ref().unwrap()), &topic)
                    }
                    // A shard on the move, or the node the call went on to
                    // killed under it: safe to send again with the same id.
                    Some(proto::schedule_result::Result::Error(e))
                        if [tonic::Code::Unavailable, tonic::Code::Unknown, tonic::Code::Cancelled]
                            .contains(&tonic::Code::from_i32(e.code)) =>
                    {
                        again.push(request.clone())
                    }
                    other => panic!("an item was refused: {other:?}"),
                }
            }
            if !again.is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            pending = again;
        }
        if n == ids.len() / 50 / 3 {
            // Some are due and delivered by both nodes by now.
            tokio::time::sleep(Duration::from_millis(4_000)).await;
            nodes[1].kill();
            eprintln!("killed node 1 after {} scheduled", (n + 1) * 50);
        }
    }
    delivered_once(&mock, &topic, &ledger, Duration::from_secs(120), "cluster failover with transactions")
        .await;
    let committed = nodes[0].metric("hourglass_transactions_total{outcome=\"committed\"}").await.unwrap();
    assert!(committed >= 1.0, "node 0 delivered in transactions");
    nodes[0].stop().unwrap();
}

/// A `hourglass serve --cluster --delivery exactly-once` process on the
/// mock cluster, not started yet.
fn cluster_node(mock: &Mock, dir: &Path, log_topic: &str, group: &str, partitions: i32) -> ServerProcess {
    let mut node = ServerProcess::new(Path::new(BIN), dir, &mock.bootstrap(), Durability::Buffered)
        .unwrap()
        .clustered()
        .unwrap()
        .arg("--log-topic", log_topic)
        .arg("--log-partitions", partitions)
        .arg("--group-id", group)
        .arg("--delivery", "exactly-once");
    node.env("HOURGLASS_LOG", "info,librdkafka=warn");
    node
}

/// A cluster node whose shard producer is fenced while the log still
/// names it the shard's owner (as after the group gave the shard to
/// another node for a moment and back): the records of the fenced
/// transaction go back to the store, and once the log has named the node
/// for a moment, a new producer of the shard's id starts, the topic is
/// read back for what was committed, and the rest is produced. Each
/// message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fenced_cluster_shard_takes_its_producer_back_and_delivers_each_message_once() {
    let _serial = SERIAL.lock().await;
    let mock = Mock::start(1);
    let topic = random_name("txn-retake");
    let log_topic = random_name("hourglass-log");
    mock.topic_with(&topic, 2);
    mock.topic_with(&log_topic, 1);
    mock.topic_with(&format!("{log_topic}-owners"), 1);
    mock.topic_with(&format!("{log_topic}-ingress"), 1);
    let dir = tempfile::tempdir().unwrap();
    let mut node = cluster_node(&mock, dir.path(), &log_topic, &random_name("hourglass"), 1);
    node.spawn().unwrap();
    node.wait_serving(Duration::from_secs(120)).await.unwrap();

    let ledger = verify::Ledger::default();
    let mut client = reconnecting_client(&node.grpc, Duration::from_secs(20));
    let run = random_name("m");
    let start = chrono::Utc::now().timestamp_millis() + 1_500;
    // The first commit is answered: a newer producer of this id.
    mock.fail_next(RDKafkaApiKey::EndTxn, &[RespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED]);
    let requests: Vec<_> =
        (0..400).map(|i| verify::due_message(&topic, &format!("{run}-{i}"), start + i * 5)).collect();
    for chunk in requests.chunks(100) {
        let reply = client
            .schedule_batch(proto::ScheduleBatchRequest { requests: chunk.to_vec() })
            .await
            .unwrap()
            .into_inner();
        for item in reply.results {
            let Some(proto::schedule_result::Result::Scheduled(done)) = item.result else {
                panic!("an item was refused: {item:?}");
            };
            ledger.ack(&done.id, millis(done.deliver_at.as_ref().unwrap()), &topic);
        }
    }
    delivered_once(
        &mock,
        &topic,
        &ledger,
        Duration::from_secs(60),
        "a fenced cluster shard taking its producer back",
    )
    .await;
    let fenced = node.metric("hourglass_transactions_total{outcome=\"fenced\"}").await.unwrap();
    assert_eq!(fenced, 1.0, "the shard's producer was fenced once");
    let found = node.metric("hourglass_reconcile_found_total").await.unwrap();
    eprintln!("{found} messages of the fenced transaction found on the topic and recorded");
    node.stop().unwrap();
}

/// A transactional producer on the mock cluster, its transactions begun
/// and ready for records.
fn transactional(mock: &Mock) -> rdkafka::producer::FutureProducer {
    use rdkafka::producer::Producer as _;
    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", mock.bootstrap())
        .set("transactional.id", random_name("native"))
        .create()
        .unwrap();
    producer.init_transactions(Duration::from_secs(10)).unwrap();
    producer.begin_transaction().unwrap();
    producer
}

/// Sends `value` under `key` to `partition` of `topic` with `headers`.
async fn send_to(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    partition: i32,
    key: &str,
    headers: &[(&str, &str)],
) {
    use rdkafka::message::{Header, OwnedHeaders};
    let mut h = OwnedHeaders::new();
    for (k, v) in headers {
        h = h.insert(Header { key: k, value: Some(v.as_bytes()) });
    }
    let record =
        rdkafka::producer::FutureRecord::to(topic).partition(partition).key(key).payload("v").headers(h);
    producer.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();
}

/// Transactions of other producers hold no shard. The schedule log may hold
/// a transaction's records (a producer with WRITE on it wrote them; they
/// are refused as forged), committed or still open: a node takes each
/// shard all the same (the log is read uncommitted, and how far it is read
/// counts what the client steps past). A Kafka-native schedule committed
/// on the ingress topic is taken, and calls for every shard are served
/// while another transaction on the ingress topic is still open.
///
/// What the mock does not show: it writes no commit markers into the
/// partitions, and hands an open transaction's records to read-committed
/// readers at once (so the open native schedule is taken here, where a
/// Kafka broker holds it back until its transaction ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_on_the_log_and_the_ingress_topic_hold_no_shard() {
    use rdkafka::producer::Producer as _;
    let _serial = SERIAL.lock().await;
    let mock = Mock::start(1);
    let (topic, log_topic) = (random_name("txn-native"), random_name("hourglass-log"));
    let ingress = format!("{log_topic}-ingress");
    mock.topic_with(&topic, 1);
    mock.topic_with(&log_topic, 2);
    mock.topic_with(&format!("{log_topic}-owners"), 1);
    mock.topic_with(&ingress, 2);
    // What a producer with WRITE on the log left there before any node
    // started: a committed transaction ending partition 0, and an open one
    // on partition 1.
    let committed = transactional(&mock);
    send_to(&committed, &log_topic, 0, "forged", &[]).await;
    committed.commit_transaction(Duration::from_secs(10)).unwrap();
    let open = transactional(&mock);
    send_to(&open, &log_topic, 1, "forged-too", &[]).await;

    let dir = tempfile::tempdir().unwrap();
    let mut node = cluster_node(&mock, dir.path(), &log_topic, &random_name("hourglass"), 2);
    node.spawn().unwrap();
    node.wait_serving(Duration::from_secs(30)).await.expect("the node took both shards within 30 s");
    let mut client = reconnecting_client(&node.grpc, Duration::from_secs(10));

    let native = [("hourglass-topic", topic.as_str()), ("hourglass-delay", "0")];
    let taken = transactional(&mock);
    send_to(&taken, &ingress, 0, "committed-native", &native).await;
    taken.commit_transaction(Duration::from_secs(10)).unwrap();
    send_to(&open, &ingress, 1, "open-native", &native).await;

    // Every shard answers calls meanwhile: an id in each.
    let ids: Vec<String> = (0..8).map(|i| format!("call-{i}")).collect();
    for id in &ids {
        client
            .schedule(proto::ScheduleRequest {
                id: Some(id.clone()),
                ..request(&topic, id, Duration::from_millis(100))
            })
            .await
            .unwrap_or_else(|e| panic!("{id}: {e:?}"));
    }
    let got = records(&mock, &topic, ids.len() + 2, Duration::from_secs(3)).await;
    let delivered: std::collections::HashSet<&str> = got.iter().map(|r| r.id()).collect();
    for id in ids.iter().map(String::as_str).chain(["committed-native"]) {
        assert!(delivered.contains(id), "{id} was not delivered: {delivered:?}");
    }
    assert_eq!(delivered.len(), got.len(), "each once");
    open.abort_transaction(Duration::from_secs(10)).unwrap();
    node.stop().unwrap();
}
