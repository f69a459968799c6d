//! Kafka-native schedules: applications that would rather write to Kafka
//! than call gRPC produce to an **ingress topic** (`--ingress`, see
//! [`native`] for a record's format), standalone or in cluster mode.
//!
//! ```text
//! producer ─► ingress topic, partition p ─► the node serving shard p % shards ─► Scheduler (as a gRPC call)
//!                                                      └── how far it read: a row of the shard's ingress table
//! ```
//!
//! - **The same checks as a gRPC call.** Each record becomes the call a
//!   client would make (`Schedule`, or `Cancel` for a tombstone), made on
//!   the node's own [`Scheduler`] with the grant its topic is mapped to
//!   (`--ingress TOPIC=NAME`, an entry of the tokens file): validation, the
//!   idempotency rule, the topic grant and the tenant's id space apply as
//!   they do to a caller with that token. In a cluster, a record whose id
//!   belongs to another shard than its partition's goes to that shard's
//!   owner, as any call does.
//! - **In order per id.** A partition's records are taken in order; those
//!   with distinct ids go together, and a record of an id already among
//!   them waits for the ones before it.
//! - **Nothing read is lost.** A call that could not be made (a shard
//!   moving, the store or the log unreachable) is made again until it is
//!   answered; a record is refused only for what it says (counted in
//!   `hourglass_ingress_records_total{outcome="refused"}` and logged with
//!   its partition, offset and why).
//! - **Where the reader is** in each partition is a row of the shard's
//!   ingress table ([`Table::Ingress`]), written about once a second while
//!   it reads, durably (in a cluster, through the schedule log): a restart,
//!   or the shard's next owner, goes on from there. What it reads again was
//!   answered before, and its calls are retries (a delay counts from the
//!   record's timestamp, so it asks for the same time).
//! - An open transaction of a producer holds back only its ingress
//!   partition (read committed); commit and abort markers are skipped.
//!
//! Where the records come from is a [`Feed`], the wiring's; which shards
//! this process serves, and where their rows are, a [`ShardSet`]; how a
//! record becomes a call, [`call`].

mod call;
mod feed;
pub(crate) mod native;

pub(crate) use feed::{Feed, FeedError, PartitionFeed, Raw};

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures_util::future;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use self::call::{BACKOFF, Caller, Source, pause, take};
use crate::{
    auth::Authenticator,
    command::{IngressPosition, Place, Table},
    kafka::seek::Seek,
    message::Limits,
    metrics,
    node::ShardSet,
    scheduler::Scheduler,
};

/// Records taken from a partition at once, at most.
const BATCH: usize = 512;
/// How often, at most, the read position is written while records come.
const NOTE_EVERY: Duration = Duration::from_secs(1);
/// How long the start waits for the ingress topics to be made.
const START_WAIT: Duration = Duration::from_secs(5);
/// The longest wait before making or reading an ingress topic again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a read after a seek may find nothing before the partition's
/// end is looked at.
const SEEK_WAIT: Duration = Duration::from_secs(3);

/// Why the ingress could not start.
#[derive(Debug, thiserror::Error)]
#[error("--ingress {topic}: {reason}")]
pub(crate) struct IngressError {
    pub(crate) topic: String,
    pub(crate) reason: String,
}

/// Reads the ingress topics for the shards this process serves.
pub(crate) struct Ingress {
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// What every follower shares.
struct Shared {
    shards: Arc<dyn ShardSet>,
    caller: Caller,
    topics: Vec<Topic>,
}

/// An ingress topic as read, and the grant its records are checked
/// against.
pub(crate) struct Topic {
    pub(crate) feed: Arc<dyn Feed>,
    /// The name of an entry of the tokens file; none: authentication is
    /// off, and the records may use every topic, in the shared id space.
    pub(crate) grant: Option<String>,
}

impl Ingress {
    /// Checks that each topic's grant is one the tokens file lists, and
    /// follows every partition whose shard this process serves, for as
    /// long as it does. Each partition `p` is read for shard `p % shards`.
    pub(crate) async fn start(
        topics: Vec<Topic>,
        shards: Arc<dyn ShardSet>,
        scheduler: Arc<dyn Scheduler>,
        auth: Authenticator,
        limits: Limits,
    ) -> Result<Ingress, IngressError> {
        for topic in &topics {
            let name = topic.feed.topic();
            auth.named(topic.grant.as_deref())
                .map_err(|why| IngressError { topic: name.to_owned(), reason: why.to_string() })?;
            // Every outcome exported from the start, at 0.
            for outcome in ["scheduled", "duplicate", "replaced", "cancelled", "refused"] {
                metrics::INGRESS_RECORDS.with_label_values(&[name, outcome]);
            }
        }
        // Made now, as a rule, before the first call is served; a broker
        // that does not answer within START_WAIT holds the start no longer.
        // Each try goes on in a task of its own rather than being dropped
        // half-way through the client's call; its follower waits for it.
        let first = topics.iter().map(|topic| {
            let feed = Arc::clone(&topic.feed);
            tokio::spawn(async move { feed.partitions().await.is_ok() })
        });
        let _ = tokio::time::timeout(START_WAIT, future::join_all(first.collect::<Vec<_>>())).await;
        let (stop, tasks) = (CancellationToken::new(), TaskTracker::new());
        let caller = Caller { scheduler, auth, limits };
        let shared = Arc::new(Shared { shards, caller, topics });
        for topic in 0..shared.topics.len() {
            tasks.spawn(follow_topic(Arc::clone(&shared), topic, stop.clone()));
        }
        tasks.close();
        Ok(Ingress { stop, tasks })
    }

    /// Stops reading (each follower notes where it got to, if its shard is
    /// still served here).
    pub(crate) async fn stop(&self) {
        self.stop.cancel();
        self.tasks.wait().await;
    }
}

/// Follows the ingress topic `topic` (of `shared.topics`) until `stop`:
/// once it is made (or found) on the broker, which is tried again until it
/// is, every partition of each shard this process serves.
async fn follow_topic(shared: Arc<Shared>, topic: usize, stop: CancellationToken) {
    let feed = &shared.topics[topic].feed;
    let mut wait = BACKOFF;
    let partitions = loop {
        match feed.partitions().await {
            Ok(partitions) => break partitions,
            Err(e) => tracing::warn!(
                topic = %feed.topic(),
                error = %e,
                retry_in = ?wait,
                "making or reading an ingress topic failed: its records wait until it works"
            ),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(MAX_BACKOFF);
    };
    let grant = &shared.topics[topic].grant;
    tracing::info!(topic = %feed.topic(), partitions, ?grant, "reading Kafka-native schedules");
    let shards =
        (0..shared.shards.count()).map(|shard| follow_shard(&shared, topic, partitions, shard, &stop));
    future::join_all(shards).await;
}

/// While this process serves `shard`, follows every partition of the
/// ingress topic `topic` that maps to it.
async fn follow_shard(
    shared: &Shared,
    topic: usize,
    partitions: i32,
    shard: usize,
    stop: &CancellationToken,
) {
    let count = shared.shards.count() as i32;
    let topic = &shared.topics[topic];
    loop {
        let served = tokio::select! {
            _ = stop.cancelled() => return,
            served = shared.shards.served(shard) => served,
        };
        let lost = stop.child_token();
        let followers = (0..partitions)
            .filter(|p| p % count == shard as i32)
            .map(|p| follow(shared, topic, shard, p, lost.clone()));
        let watch = async {
            tokio::select! {
                _ = served.cancelled() => {}
                _ = lost.cancelled() => {}
            }
            lost.cancel();
            served.cancel();
        };
        tokio::join!(future::join_all(followers), watch);
        if stop.is_cancelled() {
            return;
        }
    }
}

/// Follows partition `partition` of `topic` for `shard`, from where its
/// ingress table says it was read to, until `lost`.
async fn follow(shared: &Shared, topic: &Topic, shard: usize, partition: i32, lost: CancellationToken) {
    let name = topic.feed.topic();
    let at = Position { shards: shared.shards.as_ref(), shard, topic: name, partition };
    let Some(mut next) = at.read(&lost).await else { return };
    let Some(reader) = open_reader(topic, partition, next, &lost).await else { return };
    let mut seek = Some(Seek::to(next, 0));
    let (mut noted, mut noted_at) = (next, Instant::now());
    loop {
        let note_due = noted_at + NOTE_EVERY;
        let read = tokio::select! {
            _ = lost.cancelled() => break,
            read = reader.next(BATCH) => Some(read),
            _ = tokio::time::sleep(SEEK_WAIT), if seek.is_some() => None,
            _ = tokio::time::sleep_until(note_due.into()), if noted < next => {
                if at.note(next).await {
                    noted = next;
                }
                noted_at = Instant::now();
                continue;
            }
        };
        let records = match read {
            Some(Ok(records)) => records,
            Some(Err(e)) => {
                tracing::warn!(topic = %name, partition, error = %e, "reading an ingress topic failed; trying again");
                pause(&lost).await;
                continue;
            }
            // Nothing read since the seek: a broker that skipped the rest
            // of a batch answers nothing at all when nothing follows.
            None => {
                let Some(put) = seek else { continue };
                seek = match end_of(reader.as_ref(), &lost).await {
                    Some(end) if end > put.next => put.check(i64::MAX),
                    Some(_) => None,
                    None => break,
                };
                if let Some(again) = seek
                    && !put_at(reader.as_ref(), again, &lost).await
                {
                    break;
                }
                continue;
            }
        };
        if let (Some(put), Some(first)) = (seek, records.first()) {
            seek = put.check(first.offset);
            if let Some(again) = seek {
                if !put_at(reader.as_ref(), again, &lost).await {
                    break;
                }
                continue;
            }
        }
        let records: Vec<Raw> = records.into_iter().filter(|r| r.offset >= next).collect();
        let Some(last) = records.last().map(|r| r.offset) else { continue };
        let source = Source { topic: name, grant: topic.grant.as_deref(), partition };
        if !take(&shared.caller, &source, records, &lost).await {
            break;
        }
        next = last + 1;
        if noted_at.elapsed() >= NOTE_EVERY {
            if at.note(next).await {
                noted = next;
            }
            noted_at = Instant::now();
        }
    }
    if noted < next {
        at.note(next).await;
    }
}

/// Where a partition's reader is kept: a row of its shard's ingress table.
struct Position<'a> {
    shards: &'a dyn ShardSet,
    shard: usize,
    topic: &'a str,
    partition: i32,
}

impl Position<'_> {
    /// Where the partition was read to (its start, if it never was); none
    /// if `lost` first.
    async fn read(&self, lost: &CancellationToken) -> Option<i64> {
        let key = IngressPosition::key(self.topic, self.partition);
        loop {
            let read = match self.shards.reader(self.shard).await {
                Ok(reader) => reader.row(Table::Ingress, key.clone()).await,
                Err(e) => Err(e),
            };
            match read {
                Ok(None) => return Some(0),
                Ok(Some(bytes)) => match IngressPosition::read(&key, &bytes) {
                    Some(position) => return Some(position.next),
                    None => {
                        tracing::error!(
                            topic = self.topic,
                            partition = self.partition,
                            "the ingress read position does not read; reading the partition from its start (its records are retries)"
                        );
                        return Some(0);
                    }
                },
                Err(e) => tracing::warn!(
                    topic = self.topic,
                    partition = self.partition,
                    error = %e,
                    "reading where the ingress was read to failed"
                ),
            }
            if !pause(lost).await {
                return None;
            }
        }
    }

    /// Writes that the partition was read up to `next`; false if it was
    /// not (the shard is no longer served here, or the write failed: the
    /// next note says it again).
    async fn note(&self, next: i64) -> bool {
        let row = IngressPosition { topic: self.topic.to_owned(), partition: self.partition, next }.row();
        match self.shards.write_rows(Place::Shard(self.shard), vec![row]).await {
            Ok(()) => true,
            Err(e) => {
                let (topic, partition) = (self.topic, self.partition);
                tracing::debug!(topic, partition, next, error = %e, "noting how far an ingress partition was read failed");
                false
            }
        }
    }
}

/// A reader of the partition, put a little before `next`; none if `lost`
/// first.
async fn open_reader(
    topic: &Topic,
    partition: i32,
    next: i64,
    lost: &CancellationToken,
) -> Option<Arc<dyn PartitionFeed>> {
    loop {
        match topic.feed.open(partition, Seek::to(next, 0).at) {
            Ok(reader) => return Some(reader),
            Err(e) => {
                tracing::warn!(topic = %topic.feed.topic(), partition, error = %e, "reading an ingress topic failed; trying again")
            }
        }
        if !pause(lost).await {
            return None;
        }
    }
}

/// The end of the partition `reader` reads; none if `lost` first.
async fn end_of(reader: &dyn PartitionFeed, lost: &CancellationToken) -> Option<i64> {
    loop {
        match reader.end().await {
            Ok(end) => return Some(end),
            Err(e) => {
                tracing::warn!(error = %e, "reading the end of an ingress partition failed; trying again")
            }
        }
        if !pause(lost).await {
            return None;
        }
    }
}

/// Puts the reader at `seek.at`; false if `lost` first.
async fn put_at(reader: &dyn PartitionFeed, seek: Seek, lost: &CancellationToken) -> bool {
    loop {
        match reader.seek(seek.at).await {
            Ok(()) => return true,
            Err(e) => tracing::warn!(error = %e, "seeking in an ingress topic failed; trying again"),
        }
        if !pause(lost).await {
            return false;
        }
    }
}
