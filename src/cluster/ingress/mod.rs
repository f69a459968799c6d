//! Kafka-native schedules in cluster mode: applications that would rather
//! write to Kafka than call gRPC produce to an **ingress topic** (default
//! `<log-topic>-ingress`, see [`native`] for a record's format). Only the
//! nodes write the schedule log itself.
//!
//! ```text
//! producer ─► ingress topic, partition p ─► owner of shard p % shards ─► Scheduler (as a gRPC call) ─► log
//!                                                      └── how far it read: an Ingress record of the log
//! ```
//!
//! - **The same checks as a gRPC call.** Each record becomes the call a
//!   client would make (`Schedule`, or `Cancel` for a tombstone), made on
//!   the node's own [`Scheduler`] with the grant its topic is mapped to
//!   (`--ingress TOPIC=NAME`, an entry of the tokens file): validation, the
//!   idempotency rule, the topic grant and the tenant's id space apply as
//!   they do to a caller with that token. A record whose id belongs to
//!   another shard than its partition's goes to that shard's owner, as any
//!   call does.
//! - **In order per id.** A partition's records are taken in order; those
//!   with distinct ids go together, and a record of an id already among
//!   them waits for the ones before it.
//! - **Nothing read is lost.** A call that could not be made (a shard
//!   moving, the log unreachable) is made again until it is answered; a
//!   record is refused only for what it says (counted in
//!   `hourglass_ingress_records_total{outcome="refused"}` and logged with
//!   its partition, offset and why).
//! - **Where the shard's owner is** in each partition is a record of the
//!   shard's log partition (`Ingress`, `super::log::record`), written about once a
//!   second while it reads: the next owner goes on from there. What it
//!   reads again was answered before, and its calls are retries (a delay
//!   counts from the record's timestamp, so it asks for the same time).
//! - An open transaction of a producer holds back only its ingress
//!   partition (read committed); commit and abort markers are skipped.

pub mod native;

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use futures_util::future;
use rdkafka::{Message as _, message::Headers as _};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use self::native::Native;
use super::{
    Cluster, ClusterConfig, ClusterError,
    applier::end_of,
    kafka::{LogConsumer, LogReader, LogTopic, ensure_ingress_topic},
    owner::Owned,
};
use crate::{
    auth::{Access, Authenticator},
    kafka::seek::Seek,
    message::{Limits, OnConflict, UnixMillis},
    metrics, proto,
    scheduler::{Call, Scheduler},
};

/// Records taken from a partition at once, at most.
const BATCH: usize = 512;
/// How often, at most, the read position goes to the log while records come.
const NOTE_EVERY: Duration = Duration::from_secs(1);
/// How long a call answered "try again" waits before it is.
const BACKOFF: Duration = Duration::from_millis(500);
/// How long a read after a seek may find nothing before the partition's
/// end is looked at.
const SEEK_WAIT: Duration = Duration::from_secs(3);
/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// An ingress topic and the grant its records are checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngressTopic {
    pub topic: String,
    /// The name of an entry of the tokens file; none: authentication is
    /// off, and the records may use every topic, in the shared id space.
    pub grant: Option<String>,
}

/// Reads the ingress topics for the shards this node owns.
pub struct Ingress {
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// What every follower shares.
struct Shared {
    cluster: Arc<Cluster>,
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

/// An ingress topic as read.
struct Topic {
    name: String,
    grant: Option<String>,
    partitions: i32,
    consumer: Arc<LogConsumer>,
}

impl Ingress {
    /// Makes sure each ingress topic exists, checks that its grant is one
    /// the tokens file lists, and follows every partition whose shard this
    /// node owns, for as long as it does.
    pub async fn start(
        config: &ClusterConfig,
        cluster: Arc<Cluster>,
        scheduler: Arc<dyn Scheduler>,
        auth: Authenticator,
    ) -> Result<Ingress, ClusterError> {
        let mut topics = Vec::new();
        for ingress in &config.ingress {
            auth.named(ingress.grant.as_deref())
                .map_err(|why| ClusterError::Ingress(format!("--ingress {}: {why}", ingress.topic)))?;
            let topic = LogTopic {
                name: ingress.topic.clone(),
                partitions: config.log.partitions,
                replication: config.log.replication,
            };
            let partitions = ensure_ingress_topic(&config.kafka, &topic, config.admin_timeout).await?;
            let consumer =
                LogConsumer::committed(&config.kafka, &ingress.topic, &config.key).map_err(|e| {
                    ClusterError::Ingress(format!("creating the consumer of {}: {e}", ingress.topic))
                })?;
            tracing::info!(topic = %ingress.topic, partitions, grant = ?ingress.grant, "reading Kafka-native schedules");
            // Every outcome exported from the start, at 0.
            for outcome in ["scheduled", "duplicate", "replaced", "cancelled", "refused"] {
                metrics::INGRESS_RECORDS.with_label_values(&[&ingress.topic, outcome]);
            }
            topics.push(Topic {
                name: ingress.topic.clone(),
                grant: ingress.grant.clone(),
                partitions,
                consumer,
            });
        }
        let (stop, tasks) = (CancellationToken::new(), TaskTracker::new());
        if !topics.is_empty() {
            let caller = Caller { scheduler, auth, limits: config.limits.clone() };
            let shared = Arc::new(Shared { cluster, caller, topics });
            for shard in 0..shared.cluster.partitions() as usize {
                tasks.spawn(follow_shard(Arc::clone(&shared), shard, stop.clone()));
            }
        }
        tasks.close();
        Ok(Ingress { stop, tasks })
    }

    /// Stops reading (each follower notes where it got to, if its shard is
    /// still this node's).
    pub async fn stop(&self) {
        self.stop.cancel();
        self.tasks.wait().await;
    }
}

/// While this node owns `shard`, follows every ingress partition that maps
/// to it.
async fn follow_shard(shared: Arc<Shared>, shard: usize, stop: CancellationToken) {
    let count = shared.cluster.partitions() as i32;
    loop {
        let owned = tokio::select! {
            _ = stop.cancelled() => return,
            owned = shared.cluster.until_owned(shard) => owned,
        };
        let lost = stop.child_token();
        let followers = shared.topics.iter().flat_map(|topic| {
            (0..topic.partitions)
                .filter(|p| p % count == shard as i32)
                .map(|p| follow(&shared, topic, p, &owned, lost.clone()))
                .collect::<Vec<_>>()
        });
        let watch = async {
            tokio::select! {
                _ = shared.cluster.until_gone(shard, &owned) => {}
                _ = lost.cancelled() => {}
            }
            lost.cancel();
        };
        tokio::join!(future::join_all(followers), watch);
        if stop.is_cancelled() {
            return;
        }
    }
}

/// A record of an ingress topic, as read.
struct Raw {
    offset: i64,
    at: UnixMillis,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Raw {
    fn of(m: &rdkafka::message::BorrowedMessage<'_>) -> Raw {
        let headers = m
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        Raw {
            offset: m.offset(),
            at: super::kafka::timestamp(m.timestamp()).unwrap_or_default(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers,
        }
    }
}

/// Follows partition `partition` of `topic` for the shard `owned`, from
/// where the log says its owner got to, until `lost`.
async fn follow(shared: &Shared, topic: &Topic, partition: i32, owned: &Arc<Owned>, lost: CancellationToken) {
    let Some(mut next) = start_at(owned, &topic.name, partition, &lost).await else { return };
    let Some(reader) = open_reader(topic, partition, next, &lost).await else { return };
    let mut seek = Some(Seek::to(next, 0));
    let (mut noted, mut noted_at) = (next, Instant::now());
    loop {
        let note_due = noted_at + NOTE_EVERY;
        let read = tokio::select! {
            _ = lost.cancelled() => break,
            read = reader.next_with(BATCH, |m, _| Raw::of(m)) => Some(read),
            _ = tokio::time::sleep(SEEK_WAIT), if seek.is_some() => None,
            _ = tokio::time::sleep_until(note_due.into()), if noted < next => {
                if note(owned, &topic.name, partition, next).await {
                    noted = next;
                }
                noted_at = Instant::now();
                continue;
            }
        };
        let records = match read {
            Some(Ok(records)) => records,
            Some(Err(e)) => {
                tracing::warn!(topic = %topic.name, partition, error = %e, "reading an ingress topic failed; trying again");
                pause(&lost).await;
                continue;
            }
            // Nothing read since the seek: a broker that skipped the rest
            // of a batch answers nothing at all when nothing follows.
            None => {
                let Some(put) = seek else { continue };
                seek = match end_of(&reader, &lost).await {
                    Some(end) if end > put.next => put.check(i64::MAX),
                    Some(_) => None,
                    None => break,
                };
                if let Some(again) = seek
                    && !put_at(&reader, again, &lost).await
                {
                    break;
                }
                continue;
            }
        };
        if let (Some(put), Some(first)) = (seek, records.first()) {
            seek = put.check(first.offset);
            if let Some(again) = seek {
                if !put_at(&reader, again, &lost).await {
                    break;
                }
                continue;
            }
        }
        let records: Vec<Raw> = records.into_iter().filter(|r| r.offset >= next).collect();
        let Some(last) = records.last().map(|r| r.offset) else { continue };
        let source = Source { topic: &topic.name, grant: topic.grant.as_deref(), partition };
        if !take(&shared.caller, &source, records, &lost).await {
            break;
        }
        next = last + 1;
        if noted_at.elapsed() >= NOTE_EVERY {
            if note(owned, &topic.name, partition, next).await {
                noted = next;
            }
            noted_at = Instant::now();
        }
    }
    if noted < next {
        note(owned, &topic.name, partition, next).await;
    }
}

/// Where the shard's owner got to in the partition, as its store says (the
/// start, if it never read it); none if `lost` first.
async fn start_at(owned: &Owned, topic: &str, partition: i32, lost: &CancellationToken) -> Option<i64> {
    loop {
        match owned.store().ingress_next(topic, partition).await {
            Ok(next) => return Some(next.unwrap_or(0)),
            Err(e) => {
                tracing::warn!(topic, partition, error = %e, "reading where the ingress was read to failed")
            }
        }
        if !pause(lost).await {
            return None;
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
) -> Option<Arc<LogReader>> {
    loop {
        match topic.consumer.reader(partition, Seek::to(next, 0).at) {
            Ok(reader) => return Some(Arc::new(reader)),
            Err(e) => {
                tracing::warn!(topic = %topic.name, partition, error = %e, "reading an ingress topic failed; trying again")
            }
        }
        if !pause(lost).await {
            return None;
        }
    }
}

/// Puts the reader at `seek.at`; false if `lost` first.
async fn put_at(reader: &Arc<LogReader>, seek: Seek, lost: &CancellationToken) -> bool {
    loop {
        let moving = Arc::clone(reader);
        match tokio::task::spawn_blocking(move || moving.seek_to(seek.at)).await {
            Ok(Ok(())) => return true,
            Ok(Err(e)) => tracing::warn!(error = %e, "seeking in an ingress topic failed; trying again"),
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

/// Notes in the log that the partition was read up to `next`; false if it
/// was not (the shard is no longer this node's, or the log did not take
/// it: the next note says it again).
async fn note(owned: &Owned, topic: &str, partition: i32, next: i64) -> bool {
    match owned.note_ingress(topic, partition, next).await {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(topic, partition, next, error = %e, "noting how far an ingress partition was read failed");
            false
        }
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
    use crate::{Error, scheduler::Listing};

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
