//! Helpers for the integration tests: a real Kafka-protocol broker (Tansu) on
//! a free loopback port, hourglass itself on port 0 over a temp-dir RocksDB,
//! and a real Kafka consumer. Every test uses its own random topic names.
#![allow(dead_code)]

pub mod mock;
pub mod serve;
pub mod verify;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

#[allow(unused_imports)]
pub use serve::{BIN, Serve, spawn_serve, spawn_serve_with};

use hourglass::{
    config::Config,
    proto::{self, scheduler_client::SchedulerClient},
};
use rdkafka::{
    ClientConfig, Message as _, Offset, TopicPartitionList,
    consumer::{BaseConsumer, Consumer},
    message::Headers,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// A producer of Kafka-native schedules, as an application makes one: the
/// Java client's partitioner (each id lands in its shard's partition),
/// acks=all, idempotent.
pub fn native_producer(broker: &Broker) -> rdkafka::producer::FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", broker.addr())
        .set("partitioner", "murmur2_random")
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "0")
        .create()
        .unwrap()
}

/// Produces a Kafka-native record to `topic` (an ingress topic): a value
/// (none: a tombstone) and headers; returns once the broker has it.
pub async fn send_native(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    key: &str,
    value: Option<&str>,
    headers: &[(&str, &str)],
) {
    use rdkafka::message::{Header, OwnedHeaders};
    let mut h = OwnedHeaders::new();
    for (k, v) in headers {
        h = h.insert(Header { key: k, value: Some(v.as_bytes()) });
    }
    let mut record = rdkafka::producer::FutureRecord::<str, str>::to(topic).key(key).headers(h);
    if let Some(value) = value {
        record = record.payload(value);
    }
    producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
}

pub fn free_port() -> u16 {
    hourglass_testkit::free_port().unwrap()
}

pub fn random_name(prefix: &str) -> String {
    format!("{prefix}-{}", ulid::Ulid::new().to_string().to_lowercase())
}

/// A Tansu broker on a free port; see `hourglass_testkit::LocalBroker`.
pub struct Broker(pub hourglass_testkit::LocalBroker);

impl Broker {
    pub fn start() -> Broker {
        Broker(
            hourglass_testkit::LocalBroker::start()
                .expect("starting the test broker (install it with `bash .ci/test`)"),
        )
    }

    pub fn start_persistent() -> Broker {
        Broker(hourglass_testkit::LocalBroker::start_persistent().expect("starting the test broker"))
    }

    pub fn resume(&mut self) {
        self.0.resume().expect("restarting the test broker");
    }

    pub fn stop(&mut self) {
        self.0.stop();
    }

    pub fn is_running(&self) -> bool {
        self.0.is_running()
    }

    pub fn addr(&self) -> &str {
        &self.0.addr
    }

    pub async fn create_topic(&self, name: &str, partitions: i32) {
        hourglass_testkit::create_topic(&self.0.addr, name, partitions).await.unwrap();
    }

    pub async fn delete_topic(&self, name: &str) {
        hourglass_testkit::delete_topic(&self.0.addr, name).await.unwrap();
    }

    /// How many partitions `topic` has, as the broker's metadata says (0:
    /// none).
    pub async fn partitions(&self, topic: &str) -> usize {
        use rdkafka::consumer::{BaseConsumer, Consumer as _};
        let (addr, topic) = (self.addr().to_owned(), topic.to_owned());
        tokio::task::spawn_blocking(move || {
            let client: BaseConsumer =
                rdkafka::ClientConfig::new().set("bootstrap.servers", &addr).create().unwrap();
            let metadata = client.fetch_metadata(Some(&topic), Duration::from_secs(10)).unwrap();
            metadata.topics().iter().find(|t| t.name() == topic).map_or(0, |t| t.partitions().len())
        })
        .await
        .unwrap()
    }
}

/// A server config pointing at `broker`, storing in `data_dir`, on port 0.
pub fn config(broker: &Broker, data_dir: &Path) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data_dir.to_owned(),
        kafka_brokers: broker.addr().to_owned(),
        retry_backoff: Duration::from_millis(100).into(),
        retry_backoff_max: Duration::from_secs(1).into(),
        shutdown_grace: Duration::from_secs(5).into(),
        ..Config::default()
    }
}

/// hourglass running in this process.
pub struct Hourglass {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    /// The console's address, when the config turns it on.
    #[allow(dead_code)]
    pub console_addr: Option<SocketAddr>,
    pub data_dir: PathBuf,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Hourglass {
    pub async fn start(config: Config) -> Hourglass {
        Self::start_with_clock(config, std::sync::Arc::new(hourglass::clock::SystemClock)).await
    }

    pub async fn client(&self) -> SchedulerClient<Channel> {
        let url = format!("http://{}", self.addr);
        for _ in 0..100 {
            if let Ok(c) = SchedulerClient::connect(url.clone()).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("cannot connect to hourglass at {url}");
    }

    /// Waits for the server to stop by itself (a fatal error); what it
    /// returned.
    #[allow(dead_code)]
    pub async fn stopped(self, within: Duration) -> anyhow::Result<()> {
        tokio::time::timeout(within, self.task)
            .await
            .expect("the server did not stop")
            .expect("server task panicked")
    }

    /// Graceful shutdown, as on SIGTERM; fails the test if it errs.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("shutdown took longer than 30s")
            .expect("server task panicked")
            .expect("server returned an error");
    }
}

/// A broker with one fresh topic, and hourglass in front of it over a
/// temporary store: what most tests start from.
pub struct TestBed {
    pub broker: Broker,
    pub topic: String,
    pub dir: tempfile::TempDir,
    pub server: Hourglass,
}

impl TestBed {
    pub async fn start(prefix: &str, partitions: i32) -> TestBed {
        Self::start_with(prefix, partitions, |_| {}).await
    }

    /// As `start`, with the server's config changed by `tweak` first.
    pub async fn start_with(prefix: &str, partitions: i32, tweak: impl FnOnce(&mut Config)) -> TestBed {
        let broker = Broker::start();
        let topic = random_name(prefix);
        broker.create_topic(&topic, partitions).await;
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(&broker, dir.path());
        tweak(&mut config);
        let server = Hourglass::start(config).await;
        TestBed { broker, topic, dir, server }
    }
}

/// A schedule request for `topic`, due after `delay`.
pub fn request(topic: &str, value: &str, delay: Duration) -> proto::ScheduleRequest {
    proto::ScheduleRequest {
        message: Some(proto::Message {
            topic: topic.into(),
            key: None,
            value: value.as_bytes().to_vec(),
            headers: vec![],
            partition: None,
        }),
        due: Some(proto::schedule_request::Due::Delay(wire(delay))),
        id: None,
        on_conflict: 0,
        labels: Default::default(),
        max_lateness: None,
        dead_letter_topic: String::new(),
    }
}

/// A schedule request under the id `id` (its value too) for `topic`, due
/// at `due_ms` (Unix milliseconds).
pub fn request_at(topic: &str, id: &str, due_ms: u64) -> proto::ScheduleRequest {
    let mut r = request(topic, id, Duration::ZERO);
    r.id = Some(id.to_owned());
    r.due = Some(proto::schedule_request::Due::DeliverAt(timestamp(due_ms)));
    r
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A length of time as the wire carries it.
pub fn wire(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

/// A time (Unix milliseconds) as the wire carries it.
pub fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 }
}

pub fn millis(t: &prost_types::Timestamp) -> i64 {
    t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
}

/// A record as a consumer saw it.
#[derive(Clone, Debug)]
pub struct Received {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: BTreeMap<String, Vec<u8>>,
    /// Kafka record timestamp (the producer's create time), Unix ms.
    pub timestamp_ms: i64,
}

impl Received {
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers.get(key).map(|v| std::str::from_utf8(v).unwrap())
    }

    pub fn id(&self) -> &str {
        self.header("hourglass-id").expect("every record carries hourglass-id")
    }
}

/// Reads `topic` from the beginning until `count` records arrived or
/// `within` passed, then `settle` longer to catch any extra (duplicate)
/// records. Blocking: call from spawn_blocking or a plain thread.
pub fn consume(broker: &str, topic: &str, count: usize, within: Duration, settle: Duration) -> Vec<Received> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", random_name("verify"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    let partitions = metadata.topics()[0].partitions().len();
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment.add_partition_offset(topic, p as i32, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut out = Vec::new();
    let started = Instant::now();
    let mut deadline = started + within;
    let mut settling = false;
    while Instant::now() < deadline {
        if out.len() >= count && !settling {
            settling = true;
            deadline = Instant::now() + settle;
        }
        let Some(message) = consumer.poll(Duration::from_millis(100)) else { continue };
        let m = message.unwrap();
        let headers = m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec).unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        out.push(Received {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
            headers,
            timestamp_ms: m.timestamp().to_millis().unwrap_or(-1),
        });
    }
    out
}

pub async fn consume_async(
    broker: &Broker,
    topic: &str,
    count: usize,
    within: Duration,
    settle: Duration,
) -> Vec<Received> {
    let (addr, topic) = (broker.addr().to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || consume(&addr, &topic, count, within, settle)).await.unwrap()
}

/// Kafka's `Utils.murmur2`, as the Java client hashes record keys. Written
/// out here so tests check hourglass against an independent implementation.
pub fn murmur2(key: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = SEED ^ key.len() as u32;
    let chunks = key.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition the Java client's default partitioner picks for `key`.
pub fn java_partition(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions
}

/// A plain HTTP GET; fails the test unless the answer is 200.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// A client that connects when first used and again by itself after the
/// server comes back, each call held to `timeout`.
pub fn reconnecting_client(grpc: &str, timeout: Duration) -> SchedulerClient<Channel> {
    let channel = Channel::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .timeout(timeout)
        .connect_lazy();
    SchedulerClient::new(channel)
}

/// A client on a new connection of its own, for spreading calls over
/// several connections.
pub async fn connect(addr: SocketAddr) -> SchedulerClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    SchedulerClient::new(channel)
}

/// As `config`, for a cluster given by its bootstrap servers (librdkafka's
/// mock cluster, say) rather than a test broker.
pub fn config_at(bootstrap: &str, data_dir: &Path) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data_dir.to_owned(),
        kafka_brokers: bootstrap.to_owned(),
        retry_backoff: Duration::from_millis(100).into(),
        retry_backoff_max: Duration::from_secs(1).into(),
        shutdown_grace: Duration::from_secs(5).into(),
        ..Config::default()
    }
}

impl Hourglass {
    /// As `start`, telling time by `clock` instead of the system clock.
    pub async fn start_with_clock(
        config: Config,
        clock: std::sync::Arc<dyn hourglass::clock::Clock>,
    ) -> Hourglass {
        let grpc = TcpListener::bind(config.listen).await.unwrap();
        let metrics = TcpListener::bind(config.metrics_listen).await.unwrap();
        let console = match config.console_listen {
            Some(addr) => Some(TcpListener::bind(addr).await.unwrap()),
            None => None,
        };
        let (addr, metrics_addr) = (grpc.local_addr().unwrap(), metrics.local_addr().unwrap());
        let console_addr = console.as_ref().map(|c| c.local_addr().unwrap());
        let data_dir = config.data_dir.clone();
        let shutdown = CancellationToken::new();
        let listeners = hourglass::Listeners { grpc, metrics, console };
        let task = tokio::spawn(hourglass::run_with_clock(config, listeners, clock, shutdown.clone()));
        Hourglass { addr, metrics_addr, console_addr, data_dir, shutdown, task }
    }
}

/// The value of one series (name plus labels, as exported) from `/metrics`.
/// The value of `series` in /metrics; for a name without labels, summed
/// over the labels it has (the shards of a per-shard series).
pub async fn metric(server: &Hourglass, series: &str) -> f64 {
    let body = http_get(server.metrics_addr, "/metrics").await;
    hourglass_testkit::series_value(&body, series)
        .unwrap_or_else(|| panic!("{series} missing from /metrics:\n{body}"))
}

/// Whether to run the reliability tests at full scale
/// (`HOURGLASS_RELIABILITY_FULL=1`) rather than CI scale.
pub fn reliability_full() -> bool {
    std::env::var("HOURGLASS_RELIABILITY_FULL").is_ok_and(|v| v == "1")
}

/// A one-node cluster on the log topic `log_topic` (3 partitions), as a
/// tweak of [`TestBed::start_with`].
pub fn one_node_cluster(log_topic: &str) -> impl FnOnce(&mut Config) + '_ {
    move |config| {
        config.cluster = true;
        config.cluster_key_file = Some(hourglass_testkit::cluster_key_file().unwrap());
        config.log_topic = log_topic.to_owned();
        config.log_partitions = 3;
    }
}

/// The instant, on tokio's clock, `offset_ms` (-4 to 4, by `i`) from
/// `due`: a spread of calls around a message's due instant, so that many
/// meet the dispatcher. Returns the offset too.
pub fn around_due(i: usize, due: SystemTime) -> (i64, tokio::time::Instant) {
    let offset_ms = (i % 9) as i64 - 4;
    let at = if offset_ms >= 0 {
        due + Duration::from_millis(offset_ms as u64)
    } else {
        due - Duration::from_millis((-offset_ms) as u64)
    };
    let (now_sys, now) = (SystemTime::now(), tokio::time::Instant::now());
    (offset_ms, now + at.duration_since(now_sys).unwrap_or_default())
}

/// The token of the tenant `acme` in [`acme_and_ops`]'s file.
pub const ACME_TOKEN: &str = "acme-token-0123456789abcdef";
/// The token of the operator `ops` in [`acme_and_ops`]'s file.
pub const OPS_TOKEN: &str = "ops-token-0123456789abcdef";

/// Writes `tokens.toml` in `dir`: a tenant's token, `acme` (its own
/// policies' admin, the topic patterns `acme_topics`), and an operator's,
/// `ops` (`admin = "all"`, every topic); returns its path.
pub fn acme_and_ops(dir: &Path, acme_topics: &[&str]) -> PathBuf {
    let topics = acme_topics.iter().map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", ");
    let path = dir.join("tokens.toml");
    std::fs::write(
        &path,
        format!(
            "[[token]]\nname = \"acme\"\ntoken = \"{ACME_TOKEN}\"\ntopics = [{topics}]\nadmin = \"tenant\"\n\n\
             [[token]]\nname = \"ops\"\ntoken = \"{OPS_TOKEN}\"\ntopics = [\"*\"]\nadmin = \"all\"\n"
        ),
    )
    .unwrap();
    path
}
