//! The physical limits each figure is measured against, on the same
//! machine in the same run: RocksDB writing the same records with no gRPC
//! in front, a bare rdkafka producer sending the same records, the two
//! together for a drain (the producer beside a bare pass of the store over
//! the same due entries), the producer sending at a steady rate for
//! precision, and a bare consumer reading a topic back.

use std::{
    path::Path,
    sync::{
        Arc, Barrier,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use rdkafka::{
    ClientConfig, ClientContext, Message as _, Offset, TopicPartitionList,
    consumer::{BaseConsumer, Consumer as _, StreamConsumer},
    error::{KafkaError, RDKafkaErrorCode},
    message::{DeliveryResult, Header, OwnedHeaders},
    producer::{BaseRecord, FutureProducer, FutureRecord, Producer as _, ProducerContext, ThreadedProducer},
};

use hourglass::{
    cluster::kafka::{log_consumer_config, log_producer_config},
    kafka::{KafkaConfig, producer_config},
    message::{DUE_HEADER, ID_HEADER, MessageId, UnixMillis},
    store::{BareWrites, Durability, StoreConfig},
};

use crate::{load::Run, workload::Workload};

/// Messages per second RocksDB takes as atomic batches of `batch`
/// messages, written the way the store writes them ([`BareWrites`]).
pub fn store_writes(
    dir: &Path,
    sync: bool,
    batch: usize,
    messages: usize,
    w: &Workload,
) -> anyhow::Result<f64> {
    let mut config = StoreConfig::new(dir);
    config.durability = if sync { Durability::Sync } else { Durability::Buffered };
    let mut store = BareWrites::open(&config).context("opening RocksDB for the store limit")?;
    let now = UnixMillis(chrono::Utc::now().timestamp_millis() as u64);
    let due = now.saturating_add(Duration::from_secs(86_400));
    let started = Instant::now();
    let mut written = 0;
    while written < messages {
        let end = (written + batch).min(messages);
        store.park((written..end).map(|i| w.envelope(i)), due, now)?;
        written = end;
    }
    Ok(messages as f64 / started.elapsed().as_secs_f64())
}

struct Counting {
    acked: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl ClientContext for Counting {}

impl ProducerContext for Counting {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.acked.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// Messages per second a bare rdkafka producer, configured as hourglass's
/// producer is, gets acknowledged: the same records with the same headers,
/// to the same broker.
pub fn producer(kafka: &KafkaConfig, topic: &str, messages: usize, w: &Workload) -> anyhow::Result<f64> {
    let (started, ended) = produce(kafka, topic, messages, w, &Barrier::new(1))?;
    Ok(messages as f64 / (ended - started).as_secs_f64())
}

/// Messages per second the machine drains with none of hourglass's logic:
/// the bare producer sending `messages` records while, beside it, a bare
/// pass of the store ([`BareWrites::deliver_due`]) reads as many due
/// entries whole, in chunks of `read`, and logs their deliveries `settle`
/// at a time, with the same sync setting. Both start together, on the same
/// two cores a drain has; timed until both are done. The entries are
/// written first, untimed.
#[allow(clippy::too_many_arguments)]
pub fn drain(
    dir: &Path,
    sync: bool,
    kafka: &KafkaConfig,
    topic: &str,
    messages: usize,
    read: usize,
    settle: usize,
    w: &Workload,
) -> anyhow::Result<f64> {
    let mut config = StoreConfig::new(dir);
    config.durability = if sync { Durability::Sync } else { Durability::Buffered };
    let mut store = BareWrites::open(&config).context("opening RocksDB for the drain limit")?;
    let now = UnixMillis(chrono::Utc::now().timestamp_millis() as u64);
    let due = UnixMillis(now.0.saturating_sub(1_000));
    for start in (0..messages).step_by(4096) {
        store.park((start..(start + 4096).min(messages)).map(|i| w.envelope(i)), due, now)?;
    }
    let go = Barrier::new(2);
    let (produced, passed) = std::thread::scope(|scope| {
        let producing = scope.spawn(|| produce(kafka, topic, messages, w, &go));
        let passing = scope.spawn(|| -> anyhow::Result<(Instant, Instant)> {
            go.wait();
            let started = Instant::now();
            let passed = store.deliver_due(now, read, settle)?;
            anyhow::ensure!(passed == messages, "the store pass found {passed} of {messages} due entries");
            Ok((started, Instant::now()))
        });
        (
            producing.join().expect("the producer thread panicked"),
            passing.join().expect("the store pass panicked"),
        )
    });
    let ((p0, p1), (s0, s1)) = (produced?, passed?);
    Ok(messages as f64 / (p1.max(s1) - p0.min(s0)).as_secs_f64())
}

/// Sends `messages` records as [`producer`] says, once `go` lets every
/// party start (after the producer is warm); returns when it started and
/// when the last was acknowledged.
fn produce(
    kafka: &KafkaConfig,
    topic: &str,
    messages: usize,
    w: &Workload,
    go: &Barrier,
) -> anyhow::Result<(Instant, Instant)> {
    let acked = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let context = Counting { acked: Arc::clone(&acked), failed: Arc::clone(&failed) };
    let producer: anyhow::Result<ThreadedProducer<Counting>> = (|| {
        let producer: ThreadedProducer<Counting> =
            producer_config(kafka).create_with_context(context).context("creating the raw producer")?;
        // Connect and get a producer id first: hourglass's producer is warm too.
        producer.send(BaseRecord::<(), [u8]>::to(topic).payload(&b"warm-up"[..])).map_err(|(e, _)| e)?;
        producer.flush(Duration::from_secs(30)).context("raw producer warm-up")?;
        Ok(producer)
    })();
    // Every party waits here, ready or not, so that none is left waiting
    // for one that failed.
    go.wait();
    let producer = producer?;
    acked.store(0, Ordering::Relaxed);
    let due = (chrono::Utc::now().timestamp_millis()).to_string();
    let mut ids = ulid::Generator::new();
    let started = Instant::now();
    for i in 0..messages {
        let envelope = w.envelope(i);
        let id = MessageId::generate(&mut ids, None);
        let headers = OwnedHeaders::new_with_capacity(2)
            .insert(Header { key: ID_HEADER, value: Some(id.as_bytes()) })
            .insert(Header { key: DUE_HEADER, value: Some(due.as_bytes()) });
        let mut record = BaseRecord::to(topic).payload(&envelope.value).headers(headers);
        if let Some(key) = envelope.key.as_deref() {
            record = record.key(key);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => return Err(e).context("raw producer send"),
            }
        }
    }
    producer.flush(Duration::from_secs(120)).context("raw producer flush")?;
    let ended = Instant::now();
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        anyhow::bail!("the raw producer had {failed} failed deliveries");
    }
    let acked = acked.load(Ordering::Relaxed);
    anyhow::ensure!(acked == messages as u64, "the raw producer had {acked} of {messages} acknowledged");
    Ok((started, ended))
}

/// The lateness a bare rdkafka producer, configured as hourglass's
/// producer is, shows for records due at `rate` a second over `window`:
/// each sent at its due millisecond by a thread that sleeps until then,
/// and timed as the bench times a delivery, from its due time to the
/// broker's answer (wall-clock milliseconds). The floor of the precision
/// phase on this broker at this rate. Sorted.
pub fn producer_lateness(
    kafka: &KafkaConfig,
    topic: &str,
    rate: usize,
    window: Duration,
    w: &Workload,
) -> anyhow::Result<Vec<i64>> {
    let answered = Arc::new(std::sync::Mutex::new(Vec::new()));
    let failed = Arc::new(AtomicU64::new(0));
    let context = Timing { answered: Arc::clone(&answered), failed: Arc::clone(&failed) };
    let producer: ThreadedProducer<Timing> =
        producer_config(kafka).create_with_context(context).context("creating the paced producer")?;
    producer
        .send(BaseRecord::<(), [u8], usize>::with_opaque_to(topic, usize::MAX).payload(&b"warm-up"[..]))
        .map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(30)).context("paced producer warm-up")?;
    let count = rate * window.as_secs().max(1) as usize;
    let start = now_ms() + 100;
    let mut ids = ulid::Generator::new();
    for i in 0..count {
        let due = start + (i as u64 * 1000 / rate as u64) as i64;
        while now_ms() < due {
            std::thread::sleep(Duration::from_micros(200));
        }
        let envelope = w.envelope(i);
        let id = MessageId::generate(&mut ids, None);
        let due_text = due.to_string();
        let headers = OwnedHeaders::new_with_capacity(2)
            .insert(Header { key: ID_HEADER, value: Some(id.as_bytes()) })
            .insert(Header { key: DUE_HEADER, value: Some(due_text.as_bytes()) });
        let mut record =
            BaseRecord::with_opaque_to(topic, due as usize).payload(&envelope.value).headers(headers);
        if let Some(key) = envelope.key.as_deref() {
            record = record.key(key);
        }
        producer.send(record).map_err(|(e, _)| e).context("paced producer send")?;
    }
    producer.flush(Duration::from_secs(60)).context("paced producer flush")?;
    let failed = failed.load(Ordering::Relaxed);
    anyhow::ensure!(failed == 0, "the paced producer had {failed} failed deliveries");
    let mut late = std::mem::take(&mut *answered.lock().expect("not poisoned"));
    anyhow::ensure!(late.len() == count, "the paced producer had {} of {count} answered", late.len());
    late.sort_unstable();
    Ok(late)
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Each answer's lateness: its arrival less the due time in its opaque.
struct Timing {
    answered: Arc<std::sync::Mutex<Vec<i64>>>,
    failed: Arc<AtomicU64>,
}

impl ClientContext for Timing {}

impl ProducerContext for Timing {
    /// The record's due time, Unix ms (`usize::MAX`: the warm-up's).
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, due: usize) {
        if result.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        } else if due != usize::MAX {
            let late = now_ms() - due as i64;
            self.answered.lock().expect("not poisoned").push(late);
        }
    }
}

/// Records per second bare rdkafka consumers read of `topic`, one per
/// partition, all at once, each from the partition's start to the end it
/// has now: the limit of restoring every shard from the schedule log on
/// this broker, read as a restoring node reads it. Timed from the moment
/// every consumer is assigned its partition (librdkafka fetches ahead of
/// what is polled) to the last record read. Returns the rate and how many
/// records they read.
pub fn consumer(kafka: &KafkaConfig, topic: &str, partitions: i32) -> anyhow::Result<(f64, u64)> {
    let ready = std::sync::Barrier::new(partitions as usize);
    let read_one = |p: i32| -> anyhow::Result<(u64, Instant, Instant)> {
        let consumer: anyhow::Result<(BaseConsumer, i64)> = (|| {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &kafka.brokers)
                .set("group.id", "hourglass-bench-consumer-limit")
                .set("enable.auto.commit", "false")
                .set("auto.offset.reset", "earliest")
                .create()
                .context("creating the raw consumer")?;
            let (_, end) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
            Ok((consumer, end))
        })();
        // Every thread waits here, ready or not, so that none is left
        // waiting for one that failed.
        ready.wait();
        let (consumer, end) = consumer?;
        let started = Instant::now();
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(topic, p, Offset::Beginning)?;
        consumer.assign(&assignment)?;
        let (mut records, mut next, mut last) = (0u64, 0i64, started);
        let deadline = started + Duration::from_secs(600);
        while next < end {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the raw consumer did not reach the end of {topic}/{p}"
            );
            let Some(m) = consumer.poll(Duration::from_millis(500)) else { continue };
            let m = m.context("raw consumer")?;
            last = Instant::now();
            records += 1;
            next = m.offset() + 1;
        }
        Ok((records, started, last))
    };
    let read = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..partitions).map(|p| scope.spawn(move || read_one(p))).collect();
        readers.into_iter().map(|r| r.join().expect("a consumer thread panicked")).collect::<Vec<_>>()
    });
    let (mut records, mut first, mut last) = (0u64, None::<Instant>, None::<Instant>);
    for one in read {
        let (n, started, ended) = one?;
        records += n;
        first = Some(first.map_or(started, |f| f.min(started)));
        last = Some(last.map_or(ended, |l| l.max(ended)));
    }
    let elapsed = match (first, last) {
        (Some(first), Some(last)) => last - first,
        _ => Duration::ZERO,
    };
    Ok((records as f64 / elapsed.as_secs_f64().max(1e-9), records))
}

/// The schedule log's unary floor on this broker: `callers` tasks, each
/// appending one record at a time as a node appends (the log producer's
/// settings: `acks=all`, idempotent, its linger) and waiting for its
/// acknowledgement before the next, `messages` in all. A cluster node
/// answers a unary call one such append after deciding it (it applies its
/// own change from the acknowledgement).
pub async fn log_appends(
    kafka: &KafkaConfig,
    topic: &str,
    messages: usize,
    callers: usize,
    w: &Workload,
) -> anyhow::Result<Run> {
    let producer: FutureProducer =
        log_producer_config(kafka).create().context("creating the log producer")?;
    warm_up(&producer, topic).await?;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers.max(1) {
        let (producer, next, w, topic) = (producer.clone(), Arc::clone(&next), w.clone(), topic.to_owned());
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= messages {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let envelope = w.envelope(i);
                let key = envelope.key.as_deref().unwrap_or_default();
                let sent = Instant::now();
                let record = FutureRecord::to(&topic).key(key).payload(&envelope.value);
                producer.send(record, APPEND_TIMEOUT).await.map_err(|(e, _)| e).context("bare log append")?;
                latencies.push(sent.elapsed());
            }
        });
    }
    let mut latencies = Vec::with_capacity(messages);
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done??);
    }
    latencies.sort_unstable();
    Ok(Run { messages, elapsed: started.elapsed(), latencies, scheduled: Vec::new() })
}

/// One replicated write and its reading on this broker, as the nodes
/// write and read the schedule log: `samples` records appended one after
/// another (each to the next of `partitions`), each timed from its send
/// to its acknowledgement and to a reader following every partition (a
/// node's log consumer's settings) getting it. `topic` is new: the
/// reader reads it from its start. Both sorted.
pub async fn log_round_trips(
    kafka: &KafkaConfig,
    topic: &str,
    partitions: i32,
    samples: usize,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let producer: FutureProducer =
        log_producer_config(kafka).create().context("creating the log producer")?;
    let reader: StreamConsumer = log_consumer_config(kafka).create().context("creating the log reader")?;
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    reader.assign(&assignment)?;
    let (mut acked, mut seen) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    // The first one waits for the reader's first fetches; it is not
    // counted.
    for i in 0..=samples {
        let key = format!("round-trip-{i}");
        let sent = Instant::now();
        let record = FutureRecord::to(topic).key(&key).payload(&b"x"[..]).partition(i as i32 % partitions);
        producer.send(record, APPEND_TIMEOUT).await.map_err(|(e, _)| e).context("bare log append")?;
        let ack = sent.elapsed();
        loop {
            let m = tokio::time::timeout(APPEND_TIMEOUT, reader.recv())
                .await
                .with_context(|| {
                    format!("the log reader did not get the record it waited for within {APPEND_TIMEOUT:?}")
                })?
                .context("bare log reader")?;
            if m.key() == Some(key.as_bytes()) {
                break;
            }
        }
        if i > 0 {
            acked.push(ack);
            seen.push(sent.elapsed());
        }
    }
    acked.sort_unstable();
    seen.sort_unstable();
    Ok((acked, seen))
}

/// How long a bare append may take before the limit gives up.
const APPEND_TIMEOUT: Duration = Duration::from_secs(10);

/// One record sent and acknowledged: the producer has its connection and
/// its producer id, as a node's has.
async fn warm_up(producer: &FutureProducer, topic: &str) -> anyhow::Result<()> {
    let record = FutureRecord::<(), [u8]>::to(topic).payload(&b"warm-up"[..]);
    producer.send(record, APPEND_TIMEOUT).await.map_err(|(e, _)| e).context("log producer warm-up")?;
    Ok(())
}

/// The consumer group's own failover on this broker: `members` members
/// of a bare group on `topic` (as the nodes join theirs: their assignor,
/// `session`, heartbeats), one of them a process of its own (this binary
/// run with `--group-member`). Once the group is settled that process is
/// killed; returned: how long until the others are given the first of
/// its partitions, and all of them. What a node's failure costs when only
/// the group notices it.
pub async fn group_failover(
    kafka: &KafkaConfig,
    topic: &str,
    partitions: i32,
    members: usize,
    session: Duration,
) -> anyhow::Result<(Duration, Duration)> {
    use hourglass::cluster::kafka::{GroupConfig, GroupMember, Moved};
    const SETTLED: Duration = Duration::from_secs(3);
    const WAIT: Duration = Duration::from_secs(120);
    let group = GroupConfig {
        id: format!("hourglass-bench-group-{}", ulid::Ulid::new().to_string().to_lowercase()),
        topic: topic.to_owned(),
        session_timeout: session,
    };
    // Every partition the members in this process hold, and when that
    // last changed.
    let held =
        Arc::new(std::sync::Mutex::new((vec![std::collections::BTreeSet::new(); members], Instant::now())));
    let mut survivors = Vec::new();
    for i in 0..members.saturating_sub(1) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        survivors.push(GroupMember::join(kafka, &group, tx).context("joining the bare group")?);
        let held = Arc::clone(&held);
        tokio::spawn(async move {
            while let Some(moved) = rx.recv().await {
                let mut held = held.lock().unwrap_or_else(|e| e.into_inner());
                match moved {
                    Moved::Assigned(given) => held.0[i].extend(given),
                    // Let go at once: `done` is dropped.
                    Moved::Revoked { partitions, .. } => held.0[i].retain(|p| !partitions.contains(p)),
                }
                held.1 = Instant::now();
            }
        });
    }
    let union = || {
        let held = held.lock().unwrap_or_else(|e| e.into_inner());
        let all: std::collections::BTreeSet<i32> = held.0.iter().flatten().copied().collect();
        (all, held.1)
    };
    let mut victim = std::process::Command::new(std::env::current_exe().context("this binary's path")?)
        .args(["--group-member", &kafka.brokers, &group.id, topic, &session.as_millis().to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("starting the bare group's member process")?;
    let started = Instant::now();
    let before = loop {
        let (all, changed) = union();
        if !all.is_empty() && (all.len() as i32) < partitions && changed.elapsed() >= SETTLED {
            break all;
        }
        if started.elapsed() > WAIT {
            let _ = victim.kill();
            anyhow::bail!("the bare group did not settle with a partition on each member within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    victim.kill().context("killing the bare group's member process")?;
    victim.wait().ok();
    let killed = Instant::now();
    let mut first = None;
    loop {
        let (all, _) = union();
        if first.is_none() && all.iter().any(|p| !before.contains(p)) {
            first = Some(killed.elapsed());
        }
        if all.len() as i32 == partitions {
            return Ok((first.unwrap_or_else(|| killed.elapsed()), killed.elapsed()));
        }
        anyhow::ensure!(
            killed.elapsed() < WAIT,
            "the bare group did not give the killed member's partitions away within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// This binary as a bare group's member (see [`group_failover`]): joins
/// `group` on `topic` and holds what it is given until killed.
pub fn group_member(brokers: &str, group: &str, topic: &str, session: Duration) -> anyhow::Result<()> {
    use hourglass::cluster::kafka::{GroupConfig, GroupMember};
    let kafka = KafkaConfig { brokers: brokers.to_owned(), properties: Default::default() };
    let config = GroupConfig { id: group.to_owned(), topic: topic.to_owned(), session_timeout: session };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _member = GroupMember::join(&kafka, &config, tx).context("joining the bare group")?;
    // Revocations are answered at once (`done` dropped).
    while rx.blocking_recv().is_some() {}
    Ok(())
}
