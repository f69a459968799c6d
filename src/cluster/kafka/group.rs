//! Membership of the node in its consumer group: which partitions of the
//! schedule log it owns. The group consumer fetches nothing (what it is
//! assigned is paused at once; the shards read the log themselves, from the
//! offsets their stores recorded) and commits nothing: it is the
//! coordinator, not a reader.
//!
//! A thread polls the consumer; rebalances reach the node as [`Moved`]. A
//! revocation holds the rebalance until the node says it let go (or
//! [`REVOKE_WAIT`] passes), so that a partition reaches its next owner only
//! once this one has stopped dispatching it and recorded what it delivered.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::Duration,
};

use rdkafka::{
    ClientConfig, ClientContext, TopicPartitionList,
    consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance},
    error::KafkaError,
};
use tokio::sync::mpsc::UnboundedSender;

use crate::kafka::{KafkaConfig, is_producer_only};

/// Longest a revocation waits for the node to let go of its partitions.
/// Within it the node stops dispatching, records its last deliveries and
/// closes the stores; past it the partitions go anyway.
pub const REVOKE_WAIT: Duration = Duration::from_secs(30);

/// How the node takes part in the group.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// `--group-id`.
    pub id: String,
    /// The schedule log, whose partitions are owned.
    pub topic: String,
    /// How long the coordinator waits for a member's heartbeat before it
    /// gives the member's partitions to others.
    pub session_timeout: Duration,
}

impl GroupConfig {
    /// A twelfth of the session timeout (500 ms at the default; Kafka's
    /// own defaults are 3 s in 45 s): many heartbeats can be lost, and a
    /// member learns of a rebalance (a dead member's shards to take)
    /// within half a second.
    pub fn heartbeat_interval(&self) -> Duration {
        self.session_timeout / 12
    }

    /// How long a node that did not run for a while (SIGSTOP, a paused
    /// VM) waits before it dispatches again: two thirds of the session,
    /// long enough for the group to have told it whether it lost its
    /// shards.
    pub fn confirm_after(&self) -> Duration {
        self.session_timeout * 2 / 3
    }
}

/// What the group did to this node's partitions.
#[derive(Debug)]
pub enum Moved {
    /// A rebalance completed; these (maybe none) are now this node's too.
    Assigned(Vec<i32>),
    /// These go to other nodes once `done` is sent (or dropped). `lost`:
    /// the group already gave them away (the session ran out), so other
    /// nodes may be dispatching them now.
    Revoked { partitions: Vec<i32>, lost: bool, done: mpsc::SyncSender<()> },
}

/// The node's member in the group; leaves it when dropped (revoking
/// everything first, through [`Moved::Revoked`]).
pub struct GroupMember {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl GroupMember {
    /// Joins `group`; what it is given and what it loses goes to `moves`.
    pub fn join(
        kafka: &KafkaConfig,
        group: &GroupConfig,
        moves: UnboundedSender<Moved>,
    ) -> Result<GroupMember, KafkaError> {
        let session = group.session_timeout.as_millis().to_string();
        let heartbeat = group.heartbeat_interval().as_millis().to_string();
        let mut client = ClientConfig::new();
        for (k, v) in [
            ("bootstrap.servers", kafka.brokers.as_str()),
            ("group.id", group.id.as_str()),
            ("partition.assignment.strategy", "cooperative-sticky"),
            ("session.timeout.ms", session.as_str()),
            ("heartbeat.interval.ms", heartbeat.as_str()),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", "latest"),
            ("reconnect.backoff.max.ms", "1000"),
        ] {
            client.set(k, v);
        }
        for (k, v) in &kafka.properties {
            if !is_producer_only(k) {
                client.set(k, v);
            }
        }
        let context = Moves { topic: group.topic.clone(), moves };
        let consumer: BaseConsumer<Moves> = client.create_with_context(context)?;
        consumer.subscribe(&[group.topic.as_str()])?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("hourglass-group".into())
            .spawn(move || {
                while !stopping.load(Ordering::Acquire) {
                    // Paused partitions fetch nothing; a record that slipped
                    // in before the pause is not ours to read.
                    if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
                        tracing::warn!(error = %e, "the consumer group reported an error");
                    }
                }
                // Dropping the consumer revokes what it owns (the node lets
                // go first) and leaves the group, so others take over now.
                drop(consumer);
            })
            .map_err(|e| KafkaError::ClientCreation(format!("starting the group thread: {e}")))?;
        Ok(GroupMember { stop, thread: Some(thread) })
    }

    /// Leaves the group, once the node has let go of everything it owns.
    /// Blocks: call it off the async threads.
    pub fn leave(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the group thread panicked");
        }
    }
}

impl Drop for GroupMember {
    fn drop(&mut self) {
        self.leave();
    }
}

struct Moves {
    topic: String,
    moves: UnboundedSender<Moved>,
}

impl Moves {
    fn partitions(&self, list: &TopicPartitionList) -> Vec<i32> {
        let mut partitions: Vec<i32> =
            list.elements_for_topic(&self.topic).iter().map(|e| e.partition()).collect();
        partitions.sort_unstable();
        partitions
    }
}

impl ClientContext for Moves {}

impl ConsumerContext for Moves {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(list) = rebalance else { return };
        let partitions = self.partitions(list);
        if partitions.is_empty() {
            return;
        }
        let lost = consumer.assignment_lost();
        tracing::info!(?partitions, lost, "the group takes partitions of the schedule log from this node");
        let (done, let_go) = mpsc::sync_channel(1);
        if self.moves.send(Moved::Revoked { partitions, lost, done }).is_err() {
            return;
        }
        match let_go.recv_timeout(REVOKE_WAIT) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => tracing::error!(
                wait = ?REVOKE_WAIT,
                "letting go of revoked partitions took too long; they go to other nodes now"
            ),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(list) => {
                // Sent even when nothing is added: the node learns that a
                // rebalance completed.
                let partitions = self.partitions(list);
                if !partitions.is_empty()
                    && let Err(e) = consumer.pause(list)
                {
                    tracing::warn!(error = %e, "pausing the group consumer's partitions failed");
                }
                if !partitions.is_empty() {
                    tracing::info!(
                        ?partitions,
                        "the group gives partitions of the schedule log to this node"
                    );
                }
                let _ = self.moves.send(Moved::Assigned(partitions));
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!(error = %e, "a rebalance of the consumer group failed"),
        }
    }
}
