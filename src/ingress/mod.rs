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
//! this process serves, and where their rows are, a [`ShardSet`].

mod feed;
pub(crate) mod native;

pub(crate) use feed::{Feed, FeedError, PartitionFeed, Raw};

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use futures_util::future;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use self::native::Native;
use crate::{
    auth::{Access, Authenticator},
    command::{IngressPosition, Place, Table},
    kafka::seek::Seek,
    message::{Limits, OnConflict},
    metrics,
    node::ShardSet,
    proto,
    scheduler::{Call, Scheduler},
};

/// Records taken from a partition at once, at most.
const BATCH: usize = 512;
/// How often, at most, the read position is written while records come.
const NOTE_EVERY: Duration = Duration::from_secs(1);
/// How long a call answered "try again" waits before it is.
const BACKOFF: Duration = Duration::from_millis(500);
/// How long the start waits for the ingress topics to be made.
const START_WAIT: Duration = Duration::from_secs(5);
/// The longest wait before making or reading an ingress topic again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a read after a seek may find nothing before the partition's
/// end is looked at.
const SEEK_WAIT: Duration = Duration::from_secs(3);
/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

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

/// What makes the calls: the node's scheduler, the grants, the limits a
/// record is read against.
struct Caller {
    scheduler: Arc<dyn Scheduler>,
    auth: Authenticator,
    limits: Limits,
}

/// Where records come from: a partition of an ingress topic, and the
/// grant they are called with.
struct Source<'a> {
    topic: &'a str,
    grant: Option<&'a str>,
    partition: i32,
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

/// Waits a moment; false if `lost` first.
async fn pause(lost: &CancellationToken) -> bool {
    tokio::select! {
        _ = lost.cancelled() => false,
        _ = tokio::time::sleep(BACKOFF) => true,
    }
}

/// What became of one record.
enum Outcome {
    Done(&'static str),
    /// Refused for what it says, and why.
    Refused(String),
    /// Not answered for good: made again.
    Again(String),
}

/// The call a record asks for.
enum Ask {
    Schedule(Box<proto::ScheduleRequest>),
    Cancel(proto::CancelRequest),
}

/// Turns `records` into calls, in order per id; true once every one is
/// answered for good, false if `lost` first.
async fn take(caller: &Caller, source: &Source<'_>, records: Vec<Raw>, lost: &CancellationToken) -> bool {
    let mut wave: Vec<(i64, Ask)> = Vec::new();
    let mut ids = HashSet::new();
    for raw in records {
        let parsed = native::parse(
            raw.key.as_deref(),
            raw.value.as_deref(),
            raw.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())),
            &caller.limits,
        );
        let ask = match parsed {
            Ok(Native::Schedule { id, envelope, requested, on_conflict }) => {
                let due = requested.resolve(raw.at);
                let due = std::time::UNIX_EPOCH + Duration::from_millis(due.0);
                let labels = envelope.labels.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
                let max_lateness = envelope.max_lateness.map(crate::api::convert::wire_duration);
                let dead_letter_topic = envelope.dead_letter_topic.clone().unwrap_or_default();
                Ask::Schedule(Box::new(proto::ScheduleRequest {
                    // As a client sends it (the API's own conversion).
                    message: Some(proto::Message::from(envelope)),
                    due: Some(proto::schedule_request::Due::DeliverAt(due.into())),
                    id: Some(id.as_str().to_owned()),
                    labels,
                    max_lateness,
                    dead_letter_topic,
                    on_conflict: match on_conflict {
                        OnConflict::Reject => proto::OnConflict::Reject,
                        OnConflict::Replace => proto::OnConflict::Replace,
                    } as i32,
                }))
            }
            Ok(Native::Cancel(id)) => {
                Ask::Cancel(proto::CancelRequest { id: id.as_str().to_owned(), ..Default::default() })
            }
            Err(rejected) => {
                refused(
                    source,
                    raw.offset,
                    rejected.id.as_ref().map(|id| id.as_str()),
                    &rejected.reason.to_string(),
                );
                continue;
            }
        };
        let id = match &ask {
            Ask::Schedule(s) => s.id.clone().unwrap_or_default(),
            Ask::Cancel(c) => c.id.clone(),
        };
        if !ids.insert(id.clone()) {
            if !call_all(caller, source, std::mem::take(&mut wave), lost).await {
                return false;
            }
            ids = HashSet::from([id]);
        }
        wave.push((raw.offset, ask));
    }
    call_all(caller, source, wave, lost).await
}

/// Makes every call of `wave` (of distinct ids) until each is answered for
/// good; false if `lost` first.
async fn call_all(
    caller: &Caller,
    source: &Source<'_>,
    mut wave: Vec<(i64, Ask)>,
    lost: &CancellationToken,
) -> bool {
    while !wave.is_empty() {
        if lost.is_cancelled() {
            return false;
        }
        // The grant as the tokens file says now (it is reloaded on SIGHUP).
        let access = match caller.auth.named(source.grant) {
            Ok(access) => access,
            Err(why) => {
                for (offset, ask) in wave {
                    refused(source, offset, Some(ask_id(&ask)), &format!("the topic's grant {why}"));
                }
                return true;
            }
        };
        let outcomes = tokio::select! {
            // A call cut short is as a caller that went away: made or not,
            // the next owner makes it again.
            _ = lost.cancelled() => return false,
            outcomes = call_once(caller, &access, &wave) => outcomes,
        };
        let mut again = Vec::new();
        let mut last_error = None;
        for ((offset, ask), outcome) in wave.into_iter().zip(outcomes) {
            match outcome {
                Outcome::Done(how) => {
                    metrics::INGRESS_RECORDS.with_label_values(&[source.topic, how]).inc();
                }
                Outcome::Refused(why) => refused(source, offset, Some(ask_id(&ask)), &why),
                Outcome::Again(why) => {
                    last_error = Some(why);
                    again.push((offset, ask));
                }
            }
        }
        if let Some(why) = last_error {
            tracing::debug!(topic = source.topic, partition = source.partition, waiting = again.len(), error = %why, "Kafka-native schedules wait for their shards; trying again");
            if !pause(lost).await {
                return false;
            }
        }
        wave = again;
    }
    true
}

fn ask_id(ask: &Ask) -> &str {
    match ask {
        Ask::Schedule(s) => s.id.as_deref().unwrap_or_default(),
        Ask::Cancel(c) => &c.id,
    }
}

/// One try at every call of `wave`: the schedules as batches, the cancels
/// each on its own, all at once.
async fn call_once(caller: &Caller, access: &Access, wave: &[(i64, Ask)]) -> Vec<Outcome> {
    let call = Call {
        access: access.clone(),
        forwarded: false,
        deadline: Some(tokio::time::Instant::now() + CALL_TIMEOUT),
    };
    let schedules: Vec<(usize, proto::ScheduleRequest)> = wave
        .iter()
        .enumerate()
        .filter_map(|(i, (_, ask))| match ask {
            Ask::Schedule(s) => Some((i, (**s).clone())),
            Ask::Cancel(_) => None,
        })
        .collect();
    let batches = schedules.chunks(caller.limits.max_batch.max(1)).map(|chunk| {
        let (places, items): (Vec<usize>, Vec<proto::ScheduleRequest>) = chunk.iter().cloned().unzip();
        let call = &call;
        async move {
            let results = caller.scheduler.schedule_batch(call, "Ingress", items).await;
            places.into_iter().zip(results.into_iter().map(scheduled)).collect::<Vec<_>>()
        }
    });
    let cancels = wave.iter().enumerate().filter_map(|(i, (_, ask))| match ask {
        Ask::Cancel(c) => Some((i, c.clone())),
        Ask::Schedule(_) => None,
    });
    let cancels = cancels.map(|(i, request)| {
        let call = &call;
        async move {
            let outcome = match caller.scheduler.cancel(call, request).await {
                Ok(_) => Outcome::Done("cancelled"),
                Err(e) => by_status(tonic::Status::from(e)),
            };
            (i, outcome)
        }
    });
    let (batches, cancels) = tokio::join!(future::join_all(batches), future::join_all(cancels));
    let mut outcomes: Vec<Option<Outcome>> = (0..wave.len()).map(|_| None).collect();
    for (i, outcome) in batches.into_iter().flatten().chain(cancels) {
        outcomes[i] = Some(outcome);
    }
    outcomes.into_iter().map(|o| o.unwrap_or_else(|| Outcome::Again("no answer came".to_owned()))).collect()
}

fn scheduled(result: proto::ScheduleResult) -> Outcome {
    use proto::schedule_result::Result as R;
    match result.result {
        Some(R::Scheduled(s)) if s.duplicate => Outcome::Done("duplicate"),
        Some(R::Scheduled(s)) if s.outcome == proto::ScheduleOutcome::Replaced as i32 => {
            Outcome::Done("replaced")
        }
        Some(R::Scheduled(_)) => Outcome::Done("scheduled"),
        Some(R::Error(e)) => by_status(tonic::Status::new(tonic::Code::from_i32(e.code), e.message)),
        None => Outcome::Again("an empty answer".to_owned()),
    }
}

/// A refusal for what the record says, or an answer to try again later.
fn by_status(status: tonic::Status) -> Outcome {
    use tonic::Code;
    match status.code() {
        Code::InvalidArgument
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::NotFound
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unauthenticated => Outcome::Refused(format!("{:?}: {}", status.code(), status.message())),
        _ => Outcome::Again(format!("{:?}: {}", status.code(), status.message())),
    }
}

fn refused(source: &Source<'_>, offset: i64, id: Option<&str>, why: &str) {
    metrics::INGRESS_RECORDS.with_label_values(&[source.topic, "refused"]).inc();
    let (topic, partition) = (source.topic, source.partition);
    tracing::warn!(topic, partition, offset, id, reason = why, "a Kafka-native schedule was refused");
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{Error, message::UnixMillis, scheduler::Listing};

    /// A scheduler that notes every call, answers `again` ids UNAVAILABLE
    /// the first time, and refuses `refuse` ids as a bad request.
    #[derive(Default)]
    struct Noted {
        limits: Limits,
        calls: Mutex<Vec<String>>,
        again: Mutex<HashSet<String>>,
        refuse: HashSet<String>,
    }

    impl Noted {
        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    #[tonic::async_trait]
    impl Scheduler for Noted {
        fn limits(&self) -> &Limits {
            &self.limits
        }

        async fn schedule(
            &self,
            _: &Call,
            _: proto::ScheduleRequest,
        ) -> Result<proto::ScheduleResponse, Error> {
            unreachable!("schedules go in batches")
        }

        async fn schedule_batch(
            &self,
            _: &Call,
            method: &'static str,
            items: Vec<proto::ScheduleRequest>,
        ) -> Vec<proto::ScheduleResult> {
            assert_eq!(method, "Ingress");
            use proto::schedule_result::Result as R;
            let error =
                |code: tonic::Code| R::Error(proto::ItemError { code: code as i32, ..Default::default() });
            (0..)
                .zip(items)
                .map(|(index, item)| {
                    let id = item.id.unwrap_or_default();
                    self.calls.lock().unwrap().push(format!("schedule {id}"));
                    let result = if self.again.lock().unwrap().remove(&id) {
                        error(tonic::Code::Unavailable)
                    } else if self.refuse.contains(&id) {
                        error(tonic::Code::InvalidArgument)
                    } else {
                        R::Scheduled(proto::ScheduleResponse { id, ..Default::default() })
                    };
                    proto::ScheduleResult { index, result: Some(result) }
                })
                .collect()
        }

        async fn cancel(
            &self,
            _: &Call,
            request: proto::CancelRequest,
        ) -> Result<proto::CancelResponse, Error> {
            self.calls.lock().unwrap().push(format!("cancel {}", request.id));
            Ok(proto::CancelResponse { outcome: proto::CancelOutcome::Cancelled as i32 })
        }

        async fn reschedule(
            &self,
            _: &Call,
            _: proto::RescheduleRequest,
        ) -> Result<proto::RescheduleResponse, Error> {
            unreachable!()
        }

        async fn get(&self, _: &Call, _: proto::GetRequest) -> Result<proto::GetResponse, Error> {
            unreachable!()
        }

        async fn list(&self, _: &Call, _: proto::ListRequest) -> Result<Listing, Error> {
            unreachable!()
        }

        async fn stats(&self, _: &Call) -> Result<proto::StatsResponse, Error> {
            unreachable!()
        }

        async fn forecast(
            &self,
            _: &Call,
            _: proto::ForecastRequest,
        ) -> Result<proto::ForecastResponse, Error> {
            unreachable!()
        }

        async fn describe(&self, _: &Call) -> Result<proto::DescribeClusterResponse, Error> {
            unreachable!()
        }
    }

    fn record(offset: i64, id: &str, schedule: bool) -> Raw {
        let headers = [("hourglass-topic", "orders"), ("hourglass-delay", "1s")];
        Raw {
            offset,
            at: UnixMillis(1_000),
            key: Some(id.as_bytes().to_vec()),
            value: schedule.then(|| b"v".to_vec()),
            headers: headers.iter().map(|(k, v)| ((*k).to_owned(), Some(v.as_bytes().to_vec()))).collect(),
        }
    }

    /// A partition's records are called in order per id: those of distinct
    /// ids together, one of an id already among them once those before it
    /// are answered for good (a retry included); a refusal is counted, and
    /// holds nothing back.
    #[tokio::test]
    async fn records_are_called_in_order_per_id_and_a_call_answered_try_again_is_made_again() {
        let noted = Arc::new(Noted {
            again: Mutex::new(HashSet::from(["b".to_owned()])),
            refuse: HashSet::from(["bad".to_owned()]),
            ..Noted::default()
        });
        let caller = Caller {
            scheduler: Arc::clone(&noted) as Arc<dyn Scheduler>,
            auth: Authenticator::disabled(),
            limits: Limits::default(),
        };
        let topic = format!("ingress-{}", std::process::id());
        let source = Source { topic: &topic, grant: None, partition: 0 };
        let records = vec![
            record(0, "a", true),
            record(1, "b", true),
            record(2, "bad", true),
            record(3, "a", false),
            record(4, "c", true),
        ];
        assert!(take(&caller, &source, records, &CancellationToken::new()).await);
        let calls = noted.calls();
        let at =
            |call: &str| calls.iter().rposition(|c| c == call).unwrap_or_else(|| panic!("{call}: {calls:?}"));
        assert_eq!(
            calls.iter().filter(|c| *c == "schedule b").count(),
            2,
            "b again after UNAVAILABLE: {calls:?}"
        );
        assert!(at("cancel a") > at("schedule a"), "a's tombstone after its schedule: {calls:?}");
        assert!(
            at("cancel a") > at("schedule b"),
            "the next wave after the first is answered for good: {calls:?}"
        );
        assert!(at("schedule c") > at("schedule b"), "{calls:?}");
        let count =
            |outcome: &str| metrics::INGRESS_RECORDS.with_label_values(&[topic.as_str(), outcome]).get();
        assert_eq!((count("scheduled"), count("cancelled"), count("refused")), (3, 1, 1));
        // The grant its topic names must be in the tokens file.
        let mapped = Source { topic: &topic, grant: Some("orders"), partition: 0 };
        assert!(take(&caller, &mapped, vec![record(5, "d", true)], &CancellationToken::new()).await);
        assert_eq!(count("refused"), 2, "no tokens file to find the grant in");
        assert!(!noted.calls().iter().any(|c| c == "schedule d"), "nothing called without its grant");
    }

    #[test]
    fn a_refusal_for_what_a_record_says_is_final_and_anything_else_is_tried_again() {
        use tonic::{Code, Status};
        for code in [Code::InvalidArgument, Code::AlreadyExists, Code::PermissionDenied, Code::NotFound] {
            assert!(matches!(by_status(Status::new(code, "x")), Outcome::Refused(_)), "{code:?}");
        }
        for code in [Code::Unavailable, Code::ResourceExhausted, Code::DeadlineExceeded, Code::Internal] {
            assert!(matches!(by_status(Status::new(code, "x")), Outcome::Again(_)), "{code:?}");
        }
    }

    #[test]
    fn a_retried_schedule_is_a_duplicate_a_replace_is_told_and_an_empty_answer_is_asked_again() {
        let ok = |outcome: proto::ScheduleOutcome| proto::ScheduleResult {
            index: 0,
            result: Some(proto::schedule_result::Result::Scheduled(proto::ScheduleResponse {
                id: "a".into(),
                deliver_at: None,
                duplicate: outcome == proto::ScheduleOutcome::Duplicate,
                outcome: outcome as i32,
            })),
        };
        assert!(matches!(scheduled(ok(proto::ScheduleOutcome::Created)), Outcome::Done("scheduled")));
        assert!(matches!(scheduled(ok(proto::ScheduleOutcome::Duplicate)), Outcome::Done("duplicate")));
        assert!(matches!(scheduled(ok(proto::ScheduleOutcome::Replaced)), Outcome::Done("replaced")));
        assert!(matches!(scheduled(proto::ScheduleResult { index: 0, result: None }), Outcome::Again(_)));
    }
}
