//! A cluster's routing topic, read as a node reads it: who owns which
//! shard now.

use std::{collections::BTreeSet, time::Duration};

use anyhow::Context as _;
use hourglass::cluster::{
    ClusterKey,
    log::{route, seal::SEAL_HEADER},
};
use rdkafka::{
    ClientConfig, Message as _, Offset, TopicPartitionList,
    consumer::{BaseConsumer, Consumer as _},
    message::Headers as _,
};

use crate::cluster_key_file;

/// The shards the routing topic of `log_topic` says the node at `addr`
/// owns now, of `shards`: its records to its end, those sealed with this
/// process's [`cluster_key_file`] only. Blocking.
pub fn shards_owned_by(
    brokers: &str,
    log_topic: &str,
    shards: u32,
    addr: &str,
) -> anyhow::Result<BTreeSet<u32>> {
    let topic = route::topic_of(log_topic);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "hourglass-testkit-routes")
        .set("enable.auto.commit", "false")
        .create()
        .context("creating a reader of the routing topic")?;
    let (_, end) = consumer.fetch_watermarks(&topic, 0, Duration::from_secs(10))?;
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(&topic, 0, Offset::Beginning)?;
    consumer.assign(&assignment)?;
    let key = ClusterKey::load(&cluster_key_file()?)?;
    let mut table = route::Table::new(shards);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut next = 0;
    while next < end {
        anyhow::ensure!(std::time::Instant::now() < deadline, "reading the routing topic {topic} timed out");
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m?;
            next = m.offset() + 1;
            let seal =
                m.headers().and_then(|h| h.iter().find(|h| h.key == SEAL_HEADER)).and_then(|h| h.value);
            let sealed = key.verifies(&topic, m.partition(), m.key(), m.payload(), seal);
            if let Ok(Some((shard, r))) = route::read(m.key(), m.payload(), sealed) {
                table.apply(shard, r);
            }
        }
    }
    Ok((0..shards).filter(|s| table.addr_of(*s) == Some(addr)).collect())
}
