//! Where each shard's owner answers: the routing topic (see
//! [`crate::cluster::log::route`]), followed by every node and written by each
//! node for the shards it takes and lets go of.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{
    ClusterConfig, ClusterError,
    kafka::{LogProducer, LogReader, LogTopic, ensure_log_topic},
};
use crate::{
    clock::Clock,
    cluster::log::route::{self, Route, Table},
    metrics,
};

/// How long to wait before reading the topic again after a failure.
const BACKOFF: Duration = Duration::from_secs(1);

pub struct Routes {
    table: watch::Sender<Table>,
    log: LogProducer,
    /// This node incarnation, and where it answers.
    me: u64,
    addr: String,
    clock: Arc<dyn Clock>,
}

impl Routes {
    /// Creates or checks the routing topic and follows it until `stop`.
    pub async fn start(
        config: &ClusterConfig,
        me: u64,
        clock: Arc<dyn Clock>,
        tasks: &TaskTracker,
        stop: CancellationToken,
    ) -> Result<Arc<Routes>, ClusterError> {
        let topic = LogTopic {
            name: route::topic_of(&config.log.name),
            partitions: 1,
            replication: config.log.replication,
        };
        ensure_log_topic(&config.kafka, &topic, config.admin_timeout).await?;
        let log = LogProducer::new(&config.kafka, &topic.name, &config.key)
            .map_err(|e| ClusterError::Log(format!("creating the producer of {}: {e}", topic.name)))?;
        let reader = LogReader::new(&config.kafka, &topic.name, &config.key, 0, 0)
            .map_err(|e| ClusterError::Log(format!("reading {}: {e}", topic.name)))?;
        let routes = Arc::new(Routes {
            table: watch::channel(Table::new(config.log.partitions as u32)).0,
            log,
            me,
            addr: config.advertise.clone(),
            clock,
        });
        tasks.spawn(follow(Arc::clone(&routes), reader, stop));
        Ok(routes)
    }

    /// Says that this node owns `shard` now, or (`released`) no longer.
    /// In the background: a failed write is logged, and a request routed
    /// by an old record is refused by the node it reaches and sent again.
    pub fn publish(self: &Arc<Self>, shard: u32, released: bool) {
        let route = Route { writer: self.me, addr: self.addr.clone(), at_ms: self.clock.now().0, released };
        let written = self.log.enqueue(0, &route::key(shard), Some(&prost::Message::encode_to_vec(&route)));
        tokio::spawn(async move {
            if let Err(e) = written.await {
                tracing::warn!(shard, released, error = %e, "writing the shard's owner to the routing topic failed");
            }
        });
    }

    /// Where the owner of `shard` answers, by the topic, if another node.
    pub fn peer_of(&self, shard: u32) -> Option<String> {
        self.table.borrow().addr_of(shard).filter(|addr| *addr != self.addr).map(str::to_owned)
    }

    /// Waits, up to `deadline`, for the topic to name another node than
    /// `not` as the owner of `shard`.
    pub async fn await_peer(
        &self,
        shard: u32,
        not: Option<&str>,
        deadline: tokio::time::Instant,
    ) -> Option<String> {
        let mut table = self.table.subscribe();
        let named = tokio::time::timeout_at(
            deadline,
            table.wait_for(|t| t.addr_of(shard).is_some_and(|a| a != self.addr && Some(a) != not)),
        )
        .await;
        match named {
            Ok(Ok(t)) => t.addr_of(shard).map(str::to_owned),
            _ => None,
        }
    }

    /// The shards this node keeps a standby copy of (see
    /// [`Table::standby_for`]).
    pub fn standby_for(&self, replicas: usize) -> Vec<u32> {
        self.table.borrow().standby_for(&self.addr, replicas)
    }

    /// Waits until the topic changes.
    pub async fn changed(&self) {
        let _ = self.table.subscribe().changed().await;
    }

    /// Every other node the topic names as an owner.
    pub fn peers(&self) -> Vec<String> {
        self.table.borrow().addrs().into_iter().filter(|a| *a != self.addr).collect()
    }
}

async fn follow(routes: Arc<Routes>, reader: LogReader, stop: CancellationToken) {
    loop {
        let read = tokio::select! {
            _ = stop.cancelled() => return,
            read = reader.next_with(256, |m, sealed| {
                use rdkafka::Message as _;
                (m.offset(), route::read(m.key(), m.payload(), sealed))
            }) => read,
        };
        match read {
            Ok(records) => routes.table.send_modify(|table| {
                for (offset, record) in records {
                    match record {
                        Ok(Some((shard, route))) => table.apply(shard, route),
                        Ok(None) => {}
                        Err(route::Forged) => {
                            metrics::FORGED.with_label_values(&["routing"]).inc();
                            tracing::warn!(
                                offset,
                                "refused a record of the routing topic without the cluster's seal: no node of \
                                 this cluster wrote it (check who may write the routing topic, and that every \
                                 node has the same --cluster-key-file)"
                            );
                        }
                    }
                }
            }),
            Err(e) => {
                tracing::warn!(error = %e, "reading the routing topic failed; trying again shortly");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(BACKOFF) => {}
                }
            }
        }
    }
}
