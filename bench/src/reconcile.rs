//! `reconcile`: a drain cut by `kill -9` with the producer's in-flight
//! window full, then the restart's reconciliation: how many messages were
//! in doubt, how many of them it found on the topic, how many records it
//! read back to find them and how long it took, with and without another
//! producer writing to the same topic; and the duplicates a consumer sees.

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use rdkafka::{
    ClientConfig, Message as _, Offset, TopicPartitionList,
    consumer::{BaseConsumer, Consumer as _},
    message::Headers as _,
};

use hourglass::message::ID_HEADER;
use hourglass_testkit::ServerProcess;

use crate::{
    lead_time, load,
    workload::{Workload, now_ms},
};

/// What one cut drain's restart found.
pub struct Reconciled {
    pub in_doubt: f64,
    pub found: f64,
    pub read: f64,
    pub millis: f64,
    /// From starting the new process to its first delivery: what is not in
    /// doubt goes out while the search runs.
    pub dispatching_ms: f64,
    /// Records of the drain on the topic beyond one per message.
    pub duplicates: usize,
    /// Records of the other producer written meanwhile.
    pub foreign: u64,
}

/// Schedules `messages` due at once, kills the server once a third of them
/// are delivered, starts it again, and waits until all are; `foreign`
/// records a second go to the same topic from another producer meanwhile.
pub async fn cut_drain(
    server: &mut ServerProcess,
    brokers: &str,
    w: &Workload,
    messages: usize,
    streams: usize,
    foreign: u64,
) -> anyhow::Result<Reconciled> {
    let from = ends(brokers, &w.topic)?;
    let running = Arc::new(AtomicBool::new(true));
    let other = (foreign > 0)
        .then(|| hourglass_testkit::other_producer(brokers, &w.topic, foreign, Arc::clone(&running)))
        .transpose()?;
    let pending = server.metric("hourglass_messages_pending").await?;
    let delivered = server.metric("hourglass_messages_delivered_total").await?;
    let t0 = now_ms() + lead_time(messages);
    load::stream(std::slice::from_ref(server), w, messages, streams, Arc::new(move |_| t0), false).await?;
    server
        .wait_metric(
            "hourglass_messages_delivered_total",
            delivered + messages as f64 / 3.0,
            Duration::from_secs(300),
        )
        .await?;
    server.kill();
    let restarted = Instant::now();
    server.spawn()?;
    server.wait_serving(Duration::from_secs(120)).await?;
    // The new process's counter starts at 0.
    while server.metric("hourglass_messages_delivered_total").await? == 0.0 {
        anyhow::ensure!(restarted.elapsed() < Duration::from_secs(600), "the restart delivered nothing");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let dispatching_ms = restarted.elapsed().as_secs_f64() * 1000.0;
    // Once the drain is done, so is the reconciliation, if anything was in
    // doubt: what it looks for waits for it.
    let started = Instant::now();
    while server.metric("hourglass_messages_pending").await? > pending {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "the cut drain did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metric = |name: &'static str| server.metric(name);
    let (in_doubt, found, read, millis) = (
        metric("hourglass_reconcile_in_doubt_total").await?,
        metric("hourglass_reconcile_found_total").await?,
        metric("hourglass_reconcile_records_read_total").await?,
        metric("hourglass_reconcile_last_milliseconds").await?,
    );
    running.store(false, Ordering::Relaxed);
    let foreign = match other {
        Some(thread) => tokio::task::spawn_blocking(move || thread.join()).await?.unwrap_or(0),
        None => 0,
    };
    let (brokers, topic) = (brokers.to_owned(), w.topic.clone());
    let (records, ids) = tokio::task::spawn_blocking(move || ours(&brokers, &topic, &from)).await??;
    Ok(Reconciled { in_doubt, found, read, millis, dispatching_ms, duplicates: records - ids, foreign })
}

/// Where each partition of `topic` ends now.
fn ends(brokers: &str, topic: &str) -> anyhow::Result<TopicPartitionList> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut list = TopicPartitionList::new();
    for p in metadata.topics().first().context("the bench topic")?.partitions() {
        let (_, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
        list.add_partition_offset(topic, p.id(), Offset::Offset(high))?;
    }
    Ok(list)
}

/// Reads `topic` from `from` to its end: hourglass's records there (those
/// with an id), and how many distinct ids they carry.
fn ours(brokers: &str, topic: &str, from: &TopicPartitionList) -> anyhow::Result<(usize, usize)> {
    let until = ends(brokers, topic)?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "hourglass-bench-reconcile")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()?;
    consumer.assign(from)?;
    let mut open: HashSet<i32> = from.elements().iter().map(|e| e.partition()).collect();
    let (mut records, mut ids) = (0, HashSet::new());
    let deadline = Instant::now() + Duration::from_secs(300);
    while !open.is_empty() {
        anyhow::ensure!(Instant::now() < deadline, "reading the bench topic back took too long");
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let end = until.find_partition(topic, m.partition()).map(|e| e.offset());
                if matches!(end, Some(Offset::Offset(end)) if m.offset() + 1 >= end) {
                    open.remove(&m.partition());
                }
                let id =
                    m.headers().and_then(|h| h.iter().find(|h| h.key == ID_HEADER).and_then(|h| h.value));
                if let Some(id) = id {
                    records += 1;
                    ids.insert(id.to_vec());
                }
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    Ok((records, ids.len()))
}
