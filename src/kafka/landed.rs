//! Which records of hourglass's own reached a target topic: read back from
//! the partitions, between where the store's marks say its unrecorded
//! records can start and where each partition ended when the search began.
//! Used after an unclean stop, before anything is produced again, so that
//! a message Kafka already has is recorded as delivered rather than sent a
//! second time (see `crate::dispatcher::reconcile`).

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use rdkafka::{
    ClientConfig, ClientContext, Message as _, Offset, TopicPartitionList,
    consumer::{BaseConsumer, Consumer as _, ConsumerContext},
    error::{KafkaError, RDKafkaErrorCode},
    message::Headers as _,
};

use super::{KafkaConfig, is_producer_only, seek::Seek};
use crate::message::{
    DEAD_LETTER_ERROR_HEADER, DEAD_LETTER_REASON_HEADER, DEADLINE_HEADER, DUE_HEADER, DeadReason, ID_HEADER,
    MessageId, TENANT_HEADER, UnixMillis,
};

/// How long the broker may take to answer metadata and offset requests.
const ASK: Duration = Duration::from_secs(10);
/// How long the last check of a search waits for the reader to reach the
/// ends taken for it. A partition whose last offsets hold no record (a
/// transaction marker) is never shown reached but by this.
const CHECK_WITHIN: Duration = Duration::from_secs(1);
/// How long a read put before its offset may find nothing before it is put
/// further back.
const SEEK_WAIT: Duration = Duration::from_secs(1);

/// Where a message looked for was found, and whether as a dead letter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spot {
    pub partition: i32,
    pub offset: i64,
    /// A dead letter of the message: why it went there.
    pub dead: Option<DeadReason>,
}

/// What a search found on one topic.
#[derive(Debug, Default)]
pub struct Landed {
    /// The messages looked for that are there: the first copy of each.
    pub found: HashMap<MessageId, Spot>,
    /// Records read, ours and others'.
    pub read: u64,
    /// Partitions read (the others had nothing past their mark).
    pub partitions: usize,
}

/// When the records a stopped process had already sent stop arriving: a
/// broker works through the requests a connection sent before it closed,
/// and under load that can take more than a second. A search reads on past
/// the partitions' ends until none of the wanted records has appeared
/// there for `quiet`.
#[derive(Clone, Copy, Debug)]
pub struct Late {
    /// How long no wanted record may appear before the search is done.
    pub quiet: Duration,
    /// When one last appeared past an end (at first: when the stopped
    /// process's requests could last have been sent).
    pub last: Instant,
}

impl Late {
    fn settled(&self) -> bool {
        self.last.elapsed() >= self.quiet
    }
}

/// What a search looks for.
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    /// The messages, with the due time each is wanted with.
    pub ids: &'a HashMap<MessageId, UnixMillis>,
    /// No record of them is older than the first or newer than the second.
    pub times: (UnixMillis, UnixMillis),
}

/// Reads `topic`'s partitions from their `marks` (from the start where
/// there is none) to where each ends now, and on past that while `late`
/// records keep appearing, and finds the records carrying one of the
/// `wanted` ids with the due time it was wanted with. Where the broker
/// looks offsets up by time, records outside the wanted times are not
/// read. A topic that does not exist has none of them.
/// Gives up after `within`. With `committed`, only records of committed
/// transactions count (transactional delivery: a record of an aborted
/// transaction was never delivered). `late.last` moves to when a wanted
/// record last appeared past an end.
pub fn search(
    config: &KafkaConfig,
    committed: bool,
    topic: &str,
    marks: &HashMap<i32, i64>,
    wanted: Wanted<'_>,
    late: &mut Late,
    within: Duration,
) -> Result<Landed, KafkaError> {
    let deadline = Instant::now() + within;
    // Where partitions end, and offsets by time, as written: a
    // read_committed client is told the last stable offset instead, which
    // any open transaction (another application's, another shard's) holds
    // back, and past which ours may lie. A client apart from the reader:
    // on a connection busy with the reader's fetches its requests would
    // wait behind them (a broker answers a connection's requests in
    // order, and may hold a fetch at the end for its whole wait).
    let ask = consumer(config, false)?;
    let reader = &consumer(config, committed)?;
    let metadata = ask.fetch_metadata(Some(topic), ASK)?;
    let Some(described) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(Landed::default());
    };
    match described.error().map(RDKafkaErrorCode::from) {
        None => {}
        // Deleted: nothing of it can be produced to, or read.
        Some(RDKafkaErrorCode::UnknownTopicOrPartition) => return Ok(Landed::default()),
        Some(code) => return Err(KafkaError::MetadataFetch(code)),
    }
    let partitions: Vec<i32> = described.partitions().iter().map(|p| p.id()).collect();
    let after = by_time(&ask, topic, &partitions, wanted.times.0)?;
    let before = by_time(&ask, topic, &partitions, wanted.times.1)?;
    let (lows, highs) =
        (edges(&ask, topic, &partitions, Offset::Beginning)?, edges(&ask, topic, &partitions, Offset::End)?);
    // Every partition is read, from its mark: a late record can appear on
    // one that had nothing past its mark when the search began.
    let mut ends = HashMap::new();
    let mut froms = HashMap::new();
    // Reads put before their offset, as the broker may skip the rest of
    // a batch (see `seek`), and when each was put there.
    let mut seeks: HashMap<i32, (Seek, Instant)> = HashMap::new();
    let mut unread = HashSet::new();
    // Past each partition's last record read, or where its read started.
    let mut read_to = HashMap::new();
    // Marks past the end the broker lists, not yet seen reached by the
    // partition's records: the topic was made again since, or the broker
    // lists an end behind its last records (Tansu 0.6 lists the first
    // offset of the last batch, plus one). The read says which: a record
    // at the mark or past it, or the partition's end before it.
    let mut unconfirmed: HashMap<i32, i64> = HashMap::new();
    // Past the last record of each read at all.
    let mut seen_to: HashMap<i32, i64> = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for &partition in &partitions {
        let (low, mut high) = (lows[&partition], highs[&partition]);
        let mut from = match marks.get(&partition) {
            Some(&mark) if mark > high => {
                unconfirmed.insert(partition, mark);
                high = mark;
                mark
            }
            Some(&mark) => mark.max(low),
            None => low,
        };
        let mut end = high;
        // Only an answer inside the range narrows it: a broker that does
        // not look offsets up by time answers the start, or nothing.
        if let Some(&at) = after.get(&partition).filter(|&&at| from < at && at <= end) {
            from = at;
        }
        if let Some(&at) = before.get(&partition).filter(|&&at| from < at && at < end) {
            end = at;
        }
        tracing::debug!(
            topic,
            partition,
            low,
            high,
            mark = marks.get(&partition),
            from,
            end,
            "reading a target partition back"
        );
        // Past the end, what comes is appended after the search began: a
        // batch of its own.
        let mut start = from;
        if from < high || unconfirmed.contains_key(&partition) {
            let seek = Seek::to(from, low);
            seeks.insert(partition, (seek, Instant::now()));
            start = seek.at;
        }
        assignment.add_partition_offset(topic, partition, Offset::Offset(start))?;
        ends.insert(partition, end);
        froms.insert(partition, from);
        read_to.insert(partition, from);
        if from < end || unconfirmed.contains_key(&partition) {
            unread.insert(partition);
        }
    }
    let mut landed = Landed { partitions: unread.len(), ..Landed::default() };
    if ends.is_empty() {
        return Ok(landed);
    }
    reader.assign(&assignment)?;
    // Taken once the ends were read and none of ours appeared past them
    // for a quiet while: what the reader shows lags the broker by a fetch.
    let mut check: Option<Check> = None;
    // Once the check is done, what the client fetched but was not read yet
    // is read too (Tansu 0.6 gives a partition's end as it was before its
    // last batch: records past that end come in the same fetches).
    let (mut draining, mut drained) = (false, false);
    loop {
        if Instant::now() > deadline {
            return Err(KafkaError::MessageConsumption(RDKafkaErrorCode::OperationTimedOut));
        }
        if unread.is_empty() && late.settled() {
            match &check {
                None => {
                    let at = Instant::now();
                    let now_ends = edges(&ask, topic, &partitions, Offset::End)?;
                    let behind =
                        now_ends.iter().filter(|&(p, &end)| read_to[p] < end).map(|(&p, _)| p).collect();
                    tracing::debug!(topic, ?behind, ends = ?now_ends, "read to the ends: a last check");
                    check = Some(Check { at, ends: now_ends, behind });
                }
                Some(done) if done.behind.is_empty() || done.at.elapsed() > CHECK_WITHIN => {
                    if late.last < done.at {
                        if drained {
                            tracing::debug!(topic, behind = ?done.behind, took = ?done.at.elapsed(), "the search's last check is done");
                            break;
                        }
                        draining = true;
                    } else {
                        // One of ours appeared meanwhile: another quiet while.
                        (check, draining, drained) = (None, false, false);
                    }
                }
                Some(_) => {}
            }
        }
        // A read put before its offset that found nothing: the broker
        // skipped the rest of the partition's last batch.
        let stalled: Vec<i32> =
            seeks.iter().filter(|(_, (_, at))| at.elapsed() > SEEK_WAIT).map(|(&p, _)| p).collect();
        for partition in stalled {
            reseek(reader, topic, partition, &mut seeks, i64::MAX)?;
        }
        let wait = if draining { Duration::ZERO } else { Duration::from_millis(100) };
        match reader.poll(wait) {
            Some(Ok(record)) => {
                let (partition, offset) = (record.partition(), record.offset());
                let Some(&end) = ends.get(&partition) else { continue };
                if seeks.contains_key(&partition) && reseek(reader, topic, partition, &mut seeks, offset)? {
                    continue;
                }
                landed.read += 1;
                seen_to.insert(partition, offset + 1);
                if unconfirmed.get(&partition).is_some_and(|&mark| offset + 1 >= mark) {
                    unconfirmed.remove(&partition);
                }
                if offset < froms[&partition] {
                    continue;
                }
                read_to.insert(partition, offset + 1);
                if let Some((id, dead)) = ours(&record, wanted.ids) {
                    if offset >= end {
                        late.last = Instant::now();
                        (draining, drained) = (false, false);
                        tracing::debug!(topic, partition, offset, end, id = %id.qualified(), "found a message in doubt appended after the search began");
                    } else {
                        tracing::debug!(topic, partition, offset, id = %id.qualified(), "found a message in doubt");
                    }
                    landed.found.entry(id).or_insert(Spot { partition, offset, dead });
                }
                if offset + 1 >= end {
                    unread.remove(&partition);
                }
                if let Some(check) = &mut check
                    && offset + 1 >= check.ends[&partition]
                {
                    check.behind.remove(&partition);
                }
            }
            // The partition's end as the broker has it now, past the one
            // taken at the start: read through (offsets that hold no
            // record, such as transaction markers, are never returned).
            // Reading committed records, the end reached is the last
            // stable offset: done once it has reached the end taken at the
            // start (every committed record before it was read; aborted
            // ones and transaction markers are never returned). Until
            // then an open transaction holds it back.
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                if seeks.contains_key(&partition) && reseek(reader, topic, partition, &mut seeks, i64::MAX)? {
                    continue;
                }
                if let Some(mark) = unconfirmed.remove(&partition) {
                    // Its records end before its mark.
                    tracing::warn!(
                        topic,
                        partition,
                        mark,
                        listed = highs[&partition],
                        records_end = seen_to.get(&partition),
                        "a target partition ends before its mark (was the topic made again?): reading it whole"
                    );
                    let low = lows[&partition];
                    let mut list = TopicPartitionList::new();
                    list.add_partition_offset(topic, partition, Offset::Offset(low))?;
                    reader.seek_partitions(list, ASK)?;
                    froms.insert(partition, low);
                    read_to.insert(partition, low);
                    ends.insert(partition, highs[&partition]);
                    continue;
                }
                if let Some(check) = &mut check {
                    check.behind.remove(&partition);
                }
                if !unread.contains(&partition) {
                    continue;
                }
                if !committed || stable_end(reader, topic, partition)? >= ends[&partition] {
                    unread.remove(&partition);
                }
            }
            Some(Err(e)) => return Err(e),
            None => drained = draining,
        }
    }
    Ok(landed)
}

/// The search's last look: the partitions' ends as the broker gave them
/// `at` a moment when none of the wanted records had appeared past the
/// ends for a quiet while, and the partitions not yet read to them. Done
/// once all are, unless one of ours appeared meanwhile.
struct Check {
    at: Instant,
    ends: HashMap<i32, i64>,
    behind: HashSet<i32>,
}

/// Checks the first record (at `first`; `i64::MAX`: none came) read by
/// the seek pending for `partition`: true if the reader was put further
/// back, and the record is to be left; false if the read goes on.
fn reseek(
    reader: &BaseConsumer<Quiet>,
    topic: &str,
    partition: i32,
    seeks: &mut HashMap<i32, (Seek, Instant)>,
    first: i64,
) -> Result<bool, KafkaError> {
    let Some(again) = seeks.get(&partition).and_then(|(seek, _)| seek.check(first)) else {
        seeks.remove(&partition);
        return Ok(false);
    };
    tracing::debug!(
        topic,
        partition,
        first,
        ?again,
        "the read skipped records before its offset: reading from further back"
    );
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, partition, Offset::Offset(again.at))?;
    let moved = reader.seek_partitions(list, ASK)?;
    if let Some(Err(e)) = moved.elements().first().map(|e| e.error()) {
        return Err(e);
    }
    seeks.insert(partition, (again, Instant::now()));
    Ok(true)
}

/// Where `partition` ends for a read_committed `reader`: its last stable
/// offset, before which every transaction is decided.
fn stable_end(reader: &BaseConsumer<Quiet>, topic: &str, partition: i32) -> Result<i64, KafkaError> {
    reader.fetch_watermarks(topic, partition, ASK).map(|(_, stable)| stable)
}

/// The broker's answer, for each of `partitions`, to `asked`: a time, or
/// the start or end (one `ListOffsets` request).
fn list_offsets(
    consumer: &BaseConsumer<Quiet>,
    topic: &str,
    partitions: &[i32],
    asked: Offset,
) -> Result<TopicPartitionList, KafkaError> {
    let mut list = TopicPartitionList::new();
    for &partition in partitions {
        list.add_partition_offset(topic, partition, asked)?;
    }
    consumer.offsets_for_times(list, ASK)
}

/// Where each of `partitions` starts (`Offset::Beginning`) or ends
/// (`Offset::End`) now, asked of the broker in one request.
fn edges(
    consumer: &BaseConsumer<Quiet>,
    topic: &str,
    partitions: &[i32],
    edge: Offset,
) -> Result<HashMap<i32, i64>, KafkaError> {
    let answered = list_offsets(consumer, topic, partitions, edge)?;
    let mut edges = HashMap::with_capacity(partitions.len());
    for element in answered.elements() {
        element.error()?;
        match element.offset() {
            Offset::Offset(offset) => edges.insert(element.partition(), offset),
            _ => return Err(KafkaError::OffsetFetch(RDKafkaErrorCode::OffsetOutOfRange)),
        };
    }
    if !partitions.iter().all(|p| edges.contains_key(p)) {
        return Err(KafkaError::OffsetFetch(RDKafkaErrorCode::UnknownPartition));
    }
    Ok(edges)
}

/// The first offset of each partition whose record is at `at` or later,
/// where the broker says.
fn by_time(
    consumer: &BaseConsumer<Quiet>,
    topic: &str,
    partitions: &[i32],
    at: UnixMillis,
) -> Result<HashMap<i32, i64>, KafkaError> {
    let at = Offset::Offset(i64::try_from(at.0).unwrap_or(i64::MAX));
    let answered = list_offsets(consumer, topic, partitions, at)?;
    Ok(answered
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(offset) if e.error().is_ok() => Some((e.partition(), offset)),
            _ => None,
        })
        .collect())
}

/// The message a record is a delivery (or a dead letter) of, if it
/// carries one of the wanted ids with the due time that message has; and
/// if a dead letter, why.
fn ours(
    record: &impl rdkafka::Message,
    wanted: &HashMap<MessageId, UnixMillis>,
) -> Option<(MessageId, Option<DeadReason>)> {
    let headers = record.headers()?;
    let (mut id, mut tenant, mut due) = (None, None, None);
    let (mut reason, mut deadline, mut error) = (None, None, None);
    for header in headers.iter() {
        match header.key {
            ID_HEADER => id = header.value,
            TENANT_HEADER => tenant = header.value,
            DUE_HEADER => due = header.value,
            DEAD_LETTER_REASON_HEADER => reason = header.value,
            DEADLINE_HEADER => deadline = header.value,
            DEAD_LETTER_ERROR_HEADER => error = header.value,
            _ => {}
        }
    }
    let stored = match tenant {
        None => id?.to_vec(),
        Some(tenant) => [&[0][..], tenant, &[0], id?].concat(),
    };
    let id = MessageId::from_stored(&stored)?;
    let due: u64 = std::str::from_utf8(due?).ok()?.parse().ok()?;
    if wanted.get(&id) != Some(&UnixMillis(due)) {
        return None;
    }
    // Read, not trusted: bounded as an error the broker gives.
    let text =
        |v: Option<&[u8]>| String::from_utf8_lossy(v.unwrap_or_default()).chars().take(1_000).collect();
    let dead = reason.map(|reason| {
        let deadline = std::str::from_utf8(deadline.unwrap_or_default()).ok().and_then(|d| d.parse().ok());
        match (reason, deadline) {
            (b"expired", Some(deadline)) => DeadReason::Expired { deadline: UnixMillis(deadline) },
            (b"failed", _) => DeadReason::Failed { error: text(error) },
            _ => DeadReason::Failed { error: format!("a dead letter that says {:?}", text(Some(reason))) },
        }
    });
    Some((id, dead))
}

/// The search's consumer context: reaching a partition's end is how the
/// search knows it is done, not an error to log (librdkafka also raises
/// it as a client-wide error).
struct Quiet;

impl ClientContext for Quiet {
    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::PartitionEOF) => {}
            _ => tracing::warn!(%error, %reason, "librdkafka (reading a target topic back)"),
        }
    }
}

impl ConsumerContext for Quiet {}

fn consumer(config: &KafkaConfig, committed: bool) -> Result<BaseConsumer<Quiet>, KafkaError> {
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.brokers)
        .set("group.id", "hourglass-reconcile")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        // Tells when a partition was read to its end.
        .set("enable.partition.eof", "true")
        // Idempotent delivery: every record a producer wrote, committed or
        // not (another producer's open transaction must not hide ours).
        // Transactional delivery: committed records only; the producer
        // that wrote ours was fenced and its open transaction resolved
        // before the search, so nothing of ours is left undecided.
        .set("isolation.level", if committed { "read_committed" } else { "read_uncommitted" })
        // Reading on past the ends: new records come within this.
        .set("fetch.wait.max.ms", "100")
        .set("reconnect.backoff.max.ms", "1000");
    for (k, v) in &config.properties {
        if !is_producer_only(k) {
            client.set(k, v);
        }
    }
    client.create_with_context(Quiet)
}
