//! Records and calls no node of the cluster made. A plain Kafka producer,
//! with no ACL to keep it out (Tansu has none), writes records that claim
//! to be hourglass's own to the schedule log and the routing topic. Without
//! the cluster key's seal they are refused and counted, and the cluster
//! goes on as if they were not there: no shard is taken from its owner,
//! nothing is delivered that no one scheduled, no request goes where a
//! forged route points. A call passed between nodes carries the caller's
//! grant, vouched for with the key, not its token; a client cannot pass a
//! call off as another node's.

use crate::common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use common::{verify::*, *};
use hourglass::{
    cluster::log::{
        RECORD_HEADER,
        record::{self, Change, LogRecord, Owner},
        route::{self, Route},
        seal::SEAL_HEADER,
    },
    proto::{self, scheduler_client::SchedulerClient},
};
use hourglass_testkit::ServerProcess;
use prost::Message as _;
use rdkafka::{
    ClientConfig, Message as _, Offset, TopicPartitionList,
    consumer::{BaseConsumer, Consumer as _},
    message::{Header, Headers as _, OwnedHeaders},
    producer::{FutureProducer, FutureRecord},
};
use tonic::{Code, transport::Channel};

use crate::cluster_nodes::{Bed, LOG_PARTITIONS, id_in_shard, node, now_ms, on_any_node, wait_spread};

/// A record as a producer writes it: where, under which key, what, and
/// which headers.
struct Forgery {
    partition: i32,
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
}

impl Forgery {
    /// A record marked as hourglass's own, with `seal` (none: no seal).
    fn marked(partition: i32, key: &[u8], value: Option<Vec<u8>>, seal: Option<&[u8]>) -> Forgery {
        let mut headers = vec![(RECORD_HEADER.to_owned(), record::FORMAT.as_bytes().to_vec())];
        headers.extend(seal.map(|s| (SEAL_HEADER.to_owned(), s.to_vec())));
        Forgery { partition, key: key.to_vec(), value, headers }
    }

    async fn write(&self, producer: &FutureProducer, topic: &str) {
        let mut headers = OwnedHeaders::new();
        for (name, value) in &self.headers {
            headers = headers.insert(Header { key: name, value: Some(value) });
        }
        let mut record =
            FutureRecord::<[u8], [u8]>::to(topic).partition(self.partition).key(&self.key).headers(headers);
        if let Some(value) = &self.value {
            record = record.payload(value);
        }
        producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
    }
}

/// Records of `topic` (of `partitions`) as they were written (sealed by the
/// node that wrote them), from its start: those whose value `wanted`
/// picks, until `enough` of them.
async fn as_written(
    broker: &Broker,
    topic: &str,
    partitions: i32,
    wanted: fn(&[u8]) -> bool,
    enough: fn(&[Forgery]) -> bool,
) -> Vec<Forgery> {
    let (brokers, topic) = (broker.addr().to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", random_name("forger"))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut assigned = TopicPartitionList::new();
        for p in 0..partitions {
            assigned.add_partition_offset(&topic, p, Offset::Beginning).unwrap();
        }
        consumer.assign(&assigned).unwrap();
        let (began, mut found) = (Instant::now(), Vec::new());
        while !enough(&found) {
            assert!(began.elapsed() < Duration::from_secs(30), "{topic} has not the records wanted");
            let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else { continue };
            if !m.payload().is_some_and(wanted) {
                continue;
            }
            found.push(Forgery {
                partition: m.partition(),
                key: m.key().unwrap().to_vec(),
                value: m.payload().map(<[u8]>::to_vec),
                headers: m
                    .headers()
                    .unwrap()
                    .iter()
                    .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                    .collect(),
            });
        }
        found
    })
    .await
    .unwrap()
}

/// The first `Scheduled` record of the log, as it was written.
async fn a_genuine_schedule(broker: &Broker, log_topic: &str) -> Forgery {
    let scheduled =
        |v: &[u8]| LogRecord::decode(v).is_ok_and(|r| matches!(r.change, Some(Change::Scheduled(_))));
    as_written(broker, log_topic, LOG_PARTITIONS as i32, scheduled, |found| !found.is_empty()).await.remove(0)
}

/// Schedules `id` through any node, due at `due`, and notes it.
async fn schedule(clients: &[SchedulerClient<Channel>], topic: &str, id: &str, due: i64, ledger: &Ledger) {
    let request = due_message(topic, id, due);
    on_any_node(clients, 0, move |mut c| {
        let request = request.clone();
        Box::pin(async move { c.schedule(request).await.map(|_| ()) })
    })
    .await
    .unwrap();
    ledger.ack(id, due, topic);
}

/// The sum over `nodes` of a series, 0 where a node has none yet.
async fn total(nodes: &[ServerProcess], series: &str) -> f64 {
    let mut sum = 0.0;
    for node in nodes {
        sum += node.metric(series).await.unwrap_or(0.0);
    }
    sum
}

/// The finding this answers: a plain producer wrote an `Owner` record to
/// every partition, and every delivery stopped. Here it writes those (one
/// without a seal, one with a made-up one), a real `Scheduled` record
/// copied under another key and to another partition, garbage, a
/// tombstone marked as hourglass's and a Kafka-native schedule: every message scheduled before and
/// after is delivered once, on time, nothing else is, and each forgery is
/// counted once by its shard's owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_no_node_wrote_neither_stop_a_shard_nor_deliver_anything() {
    let Bed { broker, topic, log_topic, dirs: _dirs, mut nodes } = Bed::start(2, 2).await;
    let live = &nodes[..2];
    wait_spread(live, &[0, 1], Duration::from_secs(60)).await;
    let clients: Vec<_> = live.iter().map(|n| reconnecting_client(&n.grpc, Duration::from_secs(5))).collect();
    let (ledger, run) = (Ledger::default(), random_name("f"));
    let before = now_ms() + 8_000;
    for i in 0..24 {
        schedule(&clients, &topic, &format!("{run}-before-{i}"), before, &ledger).await;
    }

    let genuine = a_genuine_schedule(&broker, &log_topic).await;
    let mut forgeries = Vec::new();
    for p in 0..LOG_PARTITIONS as i32 {
        let claim = LogRecord {
            writer: 0x5eed_0000 + p as u64,
            request: 1,
            change: Some(Change::Owner(Owner { at_ms: now_ms() as u64, released: false, clean: false })),
        };
        let made_up = [7u8; 32];
        let seal = (p % 2 == 1).then_some(&made_up[..]);
        forgeries.push(Forgery::marked(p, &record::owner_key(), Some(claim.encode()), seal));
    }
    let copied = format!("{run}-copied");
    forgeries.push(Forgery { key: copied.clone().into_bytes(), ..genuine_copy(&genuine) });
    let elsewhere = (genuine.partition + 1) % LOG_PARTITIONS as i32;
    forgeries.push(Forgery { partition: elsewhere, ..genuine_copy(&genuine) });
    forgeries.push(Forgery::marked(0, b"garbage", Some(b"\xff\xfe not a record".to_vec()), None));
    // What a Kafka-native schedule looked like when the log took them:
    // they go to the ingress topic now, and one on the log is forged too.
    let native = format!("{run}-native");
    forgeries.push(Forgery {
        partition: 1,
        key: native.clone().into_bytes(),
        value: Some(b"native".to_vec()),
        headers: vec![
            ("hourglass-topic".to_owned(), topic.as_bytes().to_vec()),
            ("hourglass-delay".to_owned(), b"0".to_vec()),
        ],
    });
    forgeries.push(Forgery::marked(1, &record::owner_key(), None, None));
    let producer = native_producer(&broker);
    for forgery in &forgeries {
        forgery.write(&producer, &log_topic).await;
    }

    let after = now_ms() + 3_000;
    for i in 0..24 {
        schedule(&clients, &topic, &format!("{run}-after-{i}"), after, &ledger).await;
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
    eprintln!("forged records in the log: {}", verdict.summary());
    verdict.assert_nothing_lost_or_early();
    assert_eq!(verdict.unacknowledged, 0, "delivered what no one scheduled");
    assert!(verdict.duplicates.is_empty(), "duplicates: {:?}", verdict.duplicates);

    let counted = "hourglass_cluster_forged_records_total{topic=\"log\"}";
    let began = Instant::now();
    while total(live, counted).await < forgeries.len() as f64 {
        assert!(began.elapsed() < Duration::from_secs(30), "forgeries not all counted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(total(live, counted).await, forgeries.len() as f64, "each counted once, by its shard's owner");
    assert_eq!(
        total(live, "hourglass_cluster_shards_owned").await,
        f64::from(LOG_PARTITIONS),
        "no shard lost"
    );
    let mut client = clients[0].clone();
    let copy = client.get(proto::GetRequest { id: copied, ..Default::default() }).await.unwrap_err();
    assert_eq!(copy.code(), Code::NotFound, "the copied record parked nothing: {copy:?}");
    let native = client.get(proto::GetRequest { id: native, ..Default::default() }).await.unwrap_err();
    assert_eq!(native.code(), Code::NotFound, "a native record on the log parked nothing: {native:?}");
    for node in &mut nodes[..2] {
        node.stop().unwrap();
    }
}

/// The first claim of each partition of the log, as it was written (by
/// the node incarnation that claimed it).
async fn first_claims(broker: &Broker, log_topic: &str) -> Vec<Forgery> {
    let claim = |v: &[u8]| {
        LogRecord::decode(v)
            .is_ok_and(|r| matches!(r.change, Some(Change::Owner(Owner { released: false, .. }))))
    };
    first_of_each(as_written(broker, log_topic, LOG_PARTITIONS as i32, claim, every_partition).await, |f| {
        f.partition.to_string().into_bytes()
    })
}

/// The first route of each shard in the routing topic, as it was written
/// (by the node incarnation that took the shard first).
async fn first_routes(broker: &Broker, log_topic: &str) -> Vec<Forgery> {
    let taken = |v: &[u8]| Route::decode(v).is_ok_and(|r| !r.released);
    let every_shard = |found: &[Forgery]| {
        found.iter().map(|f| f.key.clone()).collect::<std::collections::BTreeSet<_>>().len()
            == LOG_PARTITIONS as usize
    };
    first_of_each(as_written(broker, &route::topic_of(log_topic), 1, taken, every_shard).await, |f| {
        f.key.clone()
    })
}

fn every_partition(found: &[Forgery]) -> bool {
    found.iter().map(|f| f.partition).collect::<std::collections::BTreeSet<_>>().len()
        == LOG_PARTITIONS as usize
}

/// The first of `found` for each value of `of`, in the order found.
fn first_of_each(found: Vec<Forgery>, of: fn(&Forgery) -> Vec<u8>) -> Vec<Forgery> {
    let mut seen = std::collections::BTreeSet::new();
    found.into_iter().filter(|f| seen.insert(of(f))).collect()
}

/// A seal proves who wrote a record, not when: a copy of a node's old
/// claim, appended again by a producer with no key, still verifies. Here a
/// node runs, stops and runs again (a new incarnation, whose claims name
/// it); its first incarnation's claims, copied seal and all, are appended
/// to every partition, and its routes to the routing topic: the log and
/// the routing topic name an owner that no longer runs, as they do when a
/// node dies right after it took a shard that the group (wrongly, as
/// Tansu 0.6 may) still gives another. The node, which the group still
/// gives every shard, claims them back within a session timeout of the
/// last time the claimant said it owns them, and every message is
/// delivered. Before, it took them back only at the next rebalance, and
/// with the routes appended too, never: nothing was delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_old_claim_appended_again_holds_a_shard_no_longer_than_a_session_timeout() {
    let Bed { broker, topic, log_topic, dirs: _dirs, mut nodes } = Bed::start(2, 1).await;
    let node = &mut nodes[0];
    node.stop().unwrap();
    node.spawn().unwrap();
    node.wait_serving(Duration::from_secs(120)).await.unwrap();
    let client = reconnecting_client(&node.grpc, Duration::from_secs(5));
    let (ledger, run, due) = (Ledger::default(), random_name("replay"), now_ms() + 5_000);
    for id in one_id_per_shard(&run) {
        schedule(std::slice::from_ref(&client), &topic, &id, due, &ledger).await;
    }
    let replays = first_claims(&broker, &log_topic).await;
    assert_eq!(replays.len(), LOG_PARTITIONS as usize);
    let producer = native_producer(&broker);
    for replay in &replays {
        replay.write(&producer, &log_topic).await;
    }
    let routes = first_routes(&broker, &log_topic).await;
    assert_eq!(routes.len(), LOG_PARTITIONS as usize);
    for route in &routes {
        route.write(&producer, &route::topic_of(&log_topic)).await;
    }
    let deliveries = collect_async(
        broker.addr(),
        &[topic.as_str()],
        ledger.expected(),
        Duration::from_secs(45),
        Duration::from_secs(2),
    )
    .await;
    let verdict = ledger.verdict(&deliveries);
    eprintln!("old claims appended again: {}", verdict.summary());
    verdict.assert_nothing_lost_or_early();
    assert!(verdict.duplicates.is_empty(), "duplicates: {:?}", verdict.duplicates);
    let reclaimed = node.metric("hourglass_cluster_reclaims_total").await.unwrap_or(0.0);
    assert_eq!(reclaimed, f64::from(LOG_PARTITIONS), "each shard claimed back once");
    node.stop().unwrap();
}

/// A copy of `genuine`, seal and all.
fn genuine_copy(genuine: &Forgery) -> Forgery {
    Forgery {
        partition: genuine.partition,
        key: genuine.key.clone(),
        value: genuine.value.clone(),
        headers: genuine.headers.clone(),
    }
}

/// The finding this answers: a plain producer wrote routes naming a
/// listener of its own, and the nodes sent it requests (and would have sent
/// callers' tokens). Here routes for every shard name a listener of the
/// test's: it is never reached, and `Get`, `List` and `Stats` through
/// either node still answer for every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_route_no_node_wrote_sends_no_request_anywhere() {
    let Bed { broker, topic, log_topic, dirs: _dirs, mut nodes } = Bed::start(2, 2).await;
    let live = &nodes[..2];
    wait_spread(live, &[0, 1], Duration::from_secs(60)).await;
    let clients: Vec<_> = live.iter().map(|n| reconnecting_client(&n.grpc, Duration::from_secs(5))).collect();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stranger = format!("http://{}", listener.local_addr().unwrap());
    let reached = Arc::new(AtomicUsize::new(0));
    let counting = Arc::clone(&reached);
    let listening = tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counting.fetch_add(1, Ordering::SeqCst);
        }
    });

    // A message in every shard, far off.
    let (ledger, run, due) = (Ledger::default(), random_name("r"), now_ms() + 3_600_000);
    let ids = one_id_per_shard(&run);
    for id in &ids {
        schedule(&clients, &topic, id, due, &ledger).await;
    }

    let producer = native_producer(&broker);
    let routing = route::topic_of(&log_topic);
    for shard in 0..LOG_PARTITIONS {
        let route = Route {
            writer: 0x5eed,
            addr: stranger.clone(),
            at_ms: now_ms() as u64,
            released: false,
            ..Default::default()
        };
        let made_up = [9u8; 32];
        let headers = if shard % 2 == 0 { vec![] } else { vec![(SEAL_HEADER.to_owned(), made_up.to_vec())] };
        let forgery =
            Forgery { partition: 0, key: route::key(shard), value: Some(route.encode_to_vec()), headers };
        forgery.write(&producer, &routing).await;
    }
    let counted = "hourglass_cluster_forged_records_total{topic=\"routing\"}";
    for node in live {
        let began = Instant::now();
        while node.metric(counted).await.unwrap_or(0.0) < f64::from(LOG_PARTITIONS) {
            assert!(began.elapsed() < Duration::from_secs(30), "forged routes not counted on {}", node.grpc);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    for client in &clients {
        for id in &ids {
            let got = client
                .clone()
                .get(proto::GetRequest { id: id.clone(), ..Default::default() })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(got.state(), proto::State::Pending, "{id}");
        }
        let stats = client.clone().stats(proto::StatsRequest {}).await.unwrap().into_inner();
        assert_eq!(stats.pending, ids.len() as u64);
        let listed = client
            .clone()
            .list(proto::ListRequest { topic: topic.clone(), page_size: 100, ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.messages.len(), ids.len());
    }
    assert_eq!(reached.load(Ordering::SeqCst), 0, "a node connected to the forged route's listener");
    listening.abort();
    for node in &mut nodes[..2] {
        node.stop().unwrap();
    }
}

/// Tokens on, two nodes: a caller's calls through either node reach the
/// shard's owner with the caller's grant (its tenant's ids, its topics),
/// although no token is passed on; a call a client marks as passed on is
/// refused, its valid token notwithstanding.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_passed_on_keeps_its_caller_s_grant_and_no_client_can_pass_one_on() {
    use hourglass::auth::Bearer;
    let broker = Broker::start();
    let topic = random_name("orders");
    broker.create_topic(&topic, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let file = format!(
        "[[token]]\nname = \"orders\"\ntoken = \"orders-secret\"\ntopics = [\"{topic}\"]\n\n\
         [[token]]\nname = \"ops\"\ntoken = \"ops-secret\"\ntopics = [\"*\"]\n"
    );
    std::fs::write(&tokens, file).unwrap();
    let (log_topic, group) = (random_name("hourglass-log"), random_name("hourglass"));
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes: Vec<ServerProcess> = dirs
        .iter()
        .map(|d| node(&broker, d.path(), &log_topic, &group).arg("--auth-tokens", tokens.display()))
        .collect();
    for n in &mut nodes {
        n.spawn().unwrap();
    }
    for n in &mut nodes {
        n.wait_serving(Duration::from_secs(120)).await.unwrap();
    }
    wait_spread(&nodes, &[0, 1], Duration::from_secs(60)).await;
    let channel =
        |n: &ServerProcess| Channel::from_shared(format!("http://{}", n.grpc)).unwrap().connect_lazy();
    let client = |n: &ServerProcess, token: &str| {
        SchedulerClient::with_interceptor(channel(n), Bearer::new(Some(token)).unwrap())
    };

    // An id in every shard: half of them owned by the other node.
    let run = random_name("v");
    let ids = one_id_per_shard(&run);
    let due = now_ms() + 3_600_000;
    for id in &ids {
        client(&nodes[0], "orders-secret").schedule(due_message(&topic, id, due)).await.unwrap();
    }
    for id in &ids {
        let got = client(&nodes[1], "orders-secret")
            .get(proto::GetRequest { id: id.clone(), ..Default::default() })
            .await
            .unwrap();
        assert_eq!(got.into_inner().state(), proto::State::Pending, "{id}");
        let other = client(&nodes[1], "ops-secret")
            .get(proto::GetRequest { id: id.clone(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(other.code(), Code::NotFound, "{id}: the ops tenant's ids are its own, wherever served");
    }
    let stats = client(&nodes[1], "ops-secret").stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.pending, 0, "another tenant's figures, from every node");

    // A client that marks its call as passed on, with a valid token.
    let mut request = tonic::Request::new(proto::GetRequest { id: ids[0].clone(), ..Default::default() });
    request.metadata_mut().insert("hourglass-forwarded", "1".parse().unwrap());
    request.metadata_mut().insert("authorization", "Bearer orders-secret".parse().unwrap());
    let refused = SchedulerClient::new(channel(&nodes[0])).get(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("vouch"), "{refused:?}");
    let counted =
        nodes[0].metric("hourglass_grpc_unauthenticated_total{reason=\"unvouched\"}").await.unwrap();
    assert_eq!(counted, 1.0);
    for n in &mut nodes {
        n.stop().unwrap();
    }
}

/// An id beginning with `run` in each shard, in shard order.
fn one_id_per_shard(run: &str) -> Vec<String> {
    (0..LOG_PARTITIONS).map(|shard| id_in_shard(run, shard)).collect()
}

/// The cluster as production runs it: TLS on the gRPC ports and tokens.
/// A tenant's messages, scheduled through one node and read through the
/// other, go between the nodes over TLS with the caller's grant, and are
/// delivered once each, none early; a plaintext connection gets nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_with_tls_and_tokens_serves_and_delivers_through_any_node() {
    use hourglass::auth::Bearer;
    let broker = Broker::start();
    let topic = random_name("orders");
    broker.create_topic(&topic, 2).await;
    let pki = crate::security::pki();
    let tokens = pki.path().join("tokens.toml");
    let file = format!("[[token]]\nname = \"orders\"\ntoken = \"orders-secret\"\ntopics = [\"{topic}\"]\n");
    std::fs::write(&tokens, file).unwrap();
    let (log_topic, group) = (random_name("hourglass-log"), random_name("hourglass"));
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let file = |name: &str| pki.path().join(name).display().to_string();
    let mut nodes: Vec<ServerProcess> = dirs
        .iter()
        .map(|d| {
            node(&broker, d.path(), &log_topic, &group)
                .arg("--auth-tokens", tokens.display())
                .arg("--tls-cert", file("server.pem"))
                .arg("--tls-key", file("server.key"))
                .arg("--tls-peer-ca", file("ca.pem"))
        })
        .collect();
    for n in &mut nodes {
        n.spawn().unwrap();
    }
    // Health speaks TLS too: the metrics say when the shards are spread.
    wait_spread(&nodes, &[0, 1], Duration::from_secs(120)).await;
    let client = |n: &ServerProcess| {
        let addr = n.grpc.parse().unwrap();
        let pki = pki.path().to_owned();
        async move {
            let channel = crate::security::tls_channel(addr, &pki, None).await.unwrap();
            SchedulerClient::with_interceptor(channel, Bearer::new(Some("orders-secret")).unwrap())
        }
    };
    let (mut first, mut second) = (client(&nodes[0]).await, client(&nodes[1]).await);

    let ledger = Ledger::default();
    let ids = one_id_per_shard(&random_name("t"));
    let due = now_ms() + 4_000;
    for id in &ids {
        first.schedule(due_message(&topic, id, due)).await.unwrap();
        ledger.ack(id, due, &topic);
    }
    for id in &ids {
        let got = second
            .get(proto::GetRequest { id: id.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.state(), proto::State::Pending, "{id}");
    }
    let plaintext = Channel::from_shared(format!("http://{}", nodes[0].grpc)).unwrap().connect_lazy();
    let refused = SchedulerClient::new(plaintext)
        .get(proto::GetRequest { id: ids[0].clone(), ..Default::default() })
        .await;
    assert!(refused.is_err(), "a plaintext call was answered: {refused:?}");

    let deliveries = collect_async(
        broker.addr(),
        &[topic.as_str()],
        ledger.expected(),
        Duration::from_secs(60),
        Duration::from_secs(2),
    )
    .await;
    let verdict = ledger.verdict(&deliveries);
    verdict.assert_nothing_lost_or_early();
    assert!(verdict.duplicates.is_empty() && verdict.unacknowledged == 0, "{}", verdict.summary());
    assert!(
        nodes[0].metric("hourglass_cluster_forwarded_total").await.unwrap() >= 1.0,
        "some calls went across"
    );
    for n in &mut nodes {
        n.stop().unwrap();
    }
}
