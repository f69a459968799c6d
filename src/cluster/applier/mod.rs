//! The applier: follows one partition of the schedule log and applies it to
//! the shard's store, in offset order, from where the store says it is.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, watch};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{
    kafka::{Appended, Fetched, LogConsumer, LogProducer, LogReader, Read, key_digest},
    replica,
    waiters::Waiters,
};
use crate::{
    clock::Clock as _,
    cluster::log::record::{Change, Entry, LogRecord},
    kafka::seek::Seek,
    message::UnixMillis,
    metrics,
    store::{LogEntry, Store, StoreConfig, StoreError},
};

/// Records applied in one call at most.
const BATCH: usize = 2048;
/// How long to wait before reading again after a failure.
const BACKOFF: Duration = Duration::from_secs(1);
/// How long a read after a seek may find nothing before the partition's
/// end is looked at.
const SEEK_WAIT: Duration = Duration::from_secs(3);
/// How often, when nothing comes, how far the partition is read is looked
/// at.
const POSITION_EVERY: Duration = Duration::from_millis(250);

pub(crate) struct Applier {
    partition: i32,
    store: Store,
    reader: Arc<LogReader>,
    waiters: Arc<Waiters>,
    /// Where the reader was put first.
    first: Seek,
    /// The shard's owner released it last, with nothing in doubt, as far
    /// as this process applied the log (see [`View::released_clean`]).
    released_clean: Arc<AtomicBool>,
}

impl Applier {
    /// An applier of `partition` of the log `log` reads, reading from
    /// where `store` has applied to.
    pub(crate) fn new(
        log: &Arc<LogConsumer>,
        partition: i32,
        store: Store,
        waiters: Arc<Waiters>,
    ) -> Result<Applier, StoreError> {
        let first = Seek::to(store.log_next(), 0);
        let reader = log.reader(partition, first.at).map_err(|e| {
            StoreError::LogUnavailable(format!("reading partition {partition} of the schedule log: {e}"))
        })?;
        let released_clean = Arc::new(AtomicBool::new(false));
        Ok(Applier { partition, store, reader: Arc::new(reader), waiters, first, released_clean })
    }

    /// What it reads the partition with.
    pub(crate) fn reader(&self) -> Arc<LogReader> {
        Arc::clone(&self.reader)
    }

    /// Applies until `stop`. `applied` follows the next offset to apply.
    /// Records this node appended come on `acked` too, from their acks:
    /// each is applied as soon as every record before it is, without
    /// waiting to read it back.
    pub(crate) async fn run(self, stop: CancellationToken, applied: watch::Sender<i64>, acks: AckReceiver) {
        let mut last_owner = self.store.log_owner();
        let mut seek = Some(self.first);
        let (mut acked, mut early) = (acks.rx, Early::new(acks.held));
        let (mut acks_open, mut woken_by_ack, mut seek_by) = (true, false, tokio::time::Instant::now());
        loop {
            if !std::mem::take(&mut woken_by_ack) {
                seek_by = tokio::time::Instant::now() + SEEK_WAIT;
            }
            let read = tokio::select! {
                _ = stop.cancelled() => return,
                got = acked.recv(), if acks_open => {
                    match got {
                        Some(got) => early.add(got),
                        None => acks_open = false,
                    }
                    // Whatever else came meanwhile, applied together.
                    while let Ok(got) = acked.try_recv() {
                        early.add(got);
                    }
                    self.apply_early(&mut early).await;
                    self.applied(&applied, &mut last_owner);
                    woken_by_ack = true;
                    continue;
                }
                read = self.reader.next_from(BATCH, self.store.log_next()) => Some(read),
                // After a seek, a broker that skipped the rest of the last
                // batch answers nothing at all.
                _ = tokio::time::sleep_until(seek_by), if seek.is_some() => None,
                // A partition that ends in what the client steps past (a
                // transaction's marker) hands nothing out: how far it is
                // read is looked at now and then.
                _ = tokio::time::sleep(POSITION_EVERY), if seek.is_none() => {
                    if crate::failpoint::fires("log-reader-stalls") {
                        // A copy that stops following the log for good (a
                        // reader stuck longer than Kafka keeps tombstones).
                        tracing::warn!(partition = self.partition, "fail point log-reader-stalls: this copy stops applying");
                        stop.cancelled().await;
                        return;
                    }
                    self.applied(&applied, &mut last_owner);
                    woken_by_ack = true;
                    continue;
                }
            };
            let read = match (read, seek) {
                (Some(read), _) => read,
                (None, Some(put)) => {
                    let Some(end) = end_of(&self.reader, &stop).await else { return };
                    // Nothing past the offset yet: the next record read is
                    // the one appended next, at the offset.
                    seek = put.check(i64::MAX).filter(|_| end > put.next);
                    if let Some(again) = seek {
                        tracing::debug!(
                            partition = self.partition,
                            ?put,
                            end,
                            "nothing read from a seek before the partition's end; reading from further back"
                        );
                        if !self.put(again, &stop).await {
                            return;
                        }
                    }
                    continue;
                }
                (None, None) => continue,
            };
            let fetched = match read {
                Ok(fetched) => fetched,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the schedule log failed; trying again");
                    self.pause(&stop).await;
                    continue;
                }
            };
            if let (Some(put), Some(first)) = (seek, fetched.first()) {
                seek = put.check(first.offset());
                if let Some(again) = seek {
                    tracing::debug!(
                        partition = self.partition,
                        ?put,
                        first = first.offset(),
                        "the first record read lies past the offset to apply; reading from further back"
                    );
                    if !self.put(again, &stop).await {
                        return;
                    }
                    continue;
                }
            }
            // Records read again (after a seek, or a failure), or applied
            // from their acks, are already applied.
            let mut reads = Vec::with_capacity(fetched.len());
            for f in fetched {
                match f {
                    Fetched::Read(read) => reads.push(read),
                    Fetched::Before { offset, key } => early.read_back(self.partition, offset, key),
                }
            }
            let next = self.store.log_next();
            reads.retain(|r| r.offset >= next);
            if !reads.is_empty() {
                count_skipped(self.partition, next, &reads);
                let entries =
                    reads.into_iter().map(|Read { offset, at, entry }| (offset, at, entry)).collect();
                let applied = self.apply(entries).await;
                if self.store.damaged().is_cancelled() {
                    // Stopped (an unreadable record, or damage): nothing
                    // more is applied; the node closes this copy.
                    return;
                }
                if let Err(e) = applied {
                    tracing::error!(error = %e, "applying the schedule log failed; reading it again from the last record applied");
                    self.pause(&stop).await;
                    let again = Seek::to(self.store.log_next(), 0);
                    if !self.put(again, &stop).await {
                        return;
                    }
                    seek = Some(again);
                }
            }
            // What was acked past a record read only now may follow it.
            self.apply_early(&mut early).await;
            self.applied(&applied, &mut last_owner);
        }
    }

    /// Applies `entries`, in offset order from the store's next offset,
    /// and answers the requests of this node that wrote them. Up to the
    /// first record this build cannot read: there the store stops
    /// ([`Self::stop_at`]).
    async fn apply(&self, mut entries: Vec<(i64, UnixMillis, Entry)>) -> Result<(), StoreError> {
        let unreadable = entries.iter().position(|(_, _, entry)| matches!(entry, Entry::Unreadable(_)));
        let unreadable = unreadable.map(|at| entries.split_off(at).swap_remove(0));
        if !entries.is_empty() {
            self.apply_readable(entries).await?;
        }
        if let Some((offset, _, Entry::Unreadable(why))) = unreadable {
            self.stop_at(offset, &why);
        }
        Ok(())
    }

    /// Stops the store before the record at `offset`, which this build
    /// cannot read: skipped, a change it holds (a schedule, a cancel) would
    /// be lost on this copy without a word. A standby copy is closed and
    /// opened again later; an owned one stops the node, and its shards go
    /// to nodes that read the record.
    fn stop_at(&self, offset: i64, why: &str) {
        metrics::LOG_UNREADABLE.inc();
        self.store.stop_for(format!(
            "partition {} of the schedule log holds at offset {offset} a record this build ({}) cannot read: \
             {why}. A newer release of hourglass wrote it, or it is damaged: this copy of the shard applies \
             nothing from it on rather than skip a change. Run the release that wrote it (see OPERATIONS.md, \
             Upgrades)",
            self.partition,
            env!("CARGO_PKG_VERSION"),
        ));
    }

    async fn apply_readable(&self, entries: Vec<(i64, UnixMillis, Entry)>) -> Result<(), StoreError> {
        let forged = self.forged(&entries);
        let released = released_clean(self.store.log_owner(), &entries);
        let writers: Vec<Option<(u64, u64)>> = entries
            .iter()
            .map(|(_, _, entry)| match entry {
                Entry::Logged { writer, request, .. } => Some((*writer, *request)),
                _ => None,
            })
            .collect();
        let entries: Vec<LogEntry> = entries
            .into_iter()
            .zip(self.waiters.take_locals(&writers))
            .map(|((offset, at, entry), local)| replica::entry(offset, at, entry, local))
            .collect();
        let count = entries.len() as u64;
        let answers = self.store.apply(entries).await?;
        if let Some(clean) = released {
            self.released_clean.store(clean, Ordering::Release);
        }
        // Once: a batch that fails is read and applied again.
        self.report(forged);
        metrics::LOG_APPLIED.inc_by(count);
        self.waiters.answer_all(writers.into_iter().zip(answers));
        Ok(())
    }

    /// The forged records among `entries` (their offsets, and why), to say
    /// once they are applied: a forged record is counted and logged by the
    /// shard's owner when it is read (every copy of the shard reads it, and
    /// would count it again), following the claims and releases among
    /// `entries` as the store does.
    fn forged(&self, entries: &[(i64, UnixMillis, Entry)]) -> Vec<(i64, &'static str)> {
        let me = self.waiters.me();
        let mut owner = self.store.log_owner();
        let mut found = Vec::new();
        for (offset, _, entry) in entries {
            match entry {
                Entry::Logged { writer, change: Change::Owner(claim), .. } => {
                    if !claim.released {
                        owner = *writer;
                    } else if owner == *writer {
                        owner = 0;
                    }
                }
                Entry::Forged(why) if owner == me => found.push((*offset, *why)),
                _ => {}
            }
        }
        found
    }

    fn report(&self, forged: Vec<(i64, &'static str)>) {
        let partition = self.partition;
        for (offset, why) in forged {
            metrics::FORGED.with_label_values(&["log"]).inc();
            tracing::warn!(
                partition,
                offset,
                "refused {why}: no node of this cluster wrote it (check who may write the schedule log, \
                 and that every node has the same --cluster-key-file; Kafka-native schedules go to an \
                 ingress topic, not the log)"
            )
        }
    }

    /// Applies the records acked from the store's next offset on, without
    /// a gap.
    async fn apply_early(&self, early: &mut Early) {
        let ready = early.ready(self.store.log_next());
        if ready.is_empty() {
            return;
        }
        let count = ready.len() as u64;
        let entries = ready
            .into_iter()
            .map(|a| {
                (a.offset, a.at, Entry::Logged { writer: a.writer, request: a.request, change: a.change })
            })
            .collect();
        match self.apply(entries).await {
            Ok(()) => metrics::LOG_APPLIED_ON_ACK.inc_by(count),
            Err(e) => {
                // Read back, they are applied from there.
                tracing::warn!(partition = self.partition, error = %e, "applying records of the schedule log from their acks failed");
                early.clear();
            }
        }
    }

    /// Says how far the partition is applied, and notes a claim by another
    /// node: the store's next offset, or past it, where the client stepped
    /// past records it never hands out (a transaction's markers, which take
    /// offsets) after everything it handed out was applied.
    fn applied(&self, applied: &watch::Sender<i64>, last_owner: &mut u64) {
        let next = self.store.log_next();
        let read = self.reader.position().unwrap_or(next);
        applied.send_if_modified(|was| {
            let now = next.max(read);
            std::mem::replace(was, now) != now
        });
        let owner = self.store.log_owner();
        if owner != *last_owner {
            if *last_owner == self.waiters.me() && owner != 0 {
                tracing::warn!(
                    partition = self.partition,
                    "another node claimed the shard in the schedule log: this node no longer dispatches it"
                );
            }
            *last_owner = owner;
        }
    }

    /// Puts the reader at `seek.at`, trying again until it is there;
    /// false if stopped first.
    async fn put(&self, seek: Seek, stop: &CancellationToken) -> bool {
        loop {
            // The client answers a seek once it has moved: off the runtime.
            let reader = Arc::clone(&self.reader);
            match tokio::task::spawn_blocking(move || reader.seek_to(seek.at)).await {
                Ok(Ok(())) => return true,
                Ok(Err(e)) => tracing::warn!(error = %e, "seeking in the schedule log failed; trying again"),
                Err(e) => tracing::warn!(error = %e, "seeking in the schedule log failed; trying again"),
            }
            self.pause(stop).await;
            if stop.is_cancelled() {
                return false;
            }
        }
    }

    async fn pause(&self, stop: &CancellationToken) {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(BACKOFF) => {}
        }
    }
}

/// A record this node appended to a shard's partition, as its ack tells.
pub struct Acked {
    pub offset: i64,
    pub at: UnixMillis,
    /// Its key's [`key_digest`]: the record read
    /// back at the offset later must have the same.
    pub key: u64,
    pub writer: u64,
    pub request: u64,
    pub change: Change,
    /// About what it holds in memory: its encoded size.
    pub bytes: usize,
}

impl Acked {
    /// `record`, `bytes` long encoded, appended under `key` where `appended`
    /// says; `None` if the ack did not tell its timestamp.
    pub fn new(appended: Appended, key: &[u8], bytes: usize, record: LogRecord) -> Option<Acked> {
        let (at, change) = (appended.at?, record.change?);
        Some(Acked {
            offset: appended.offset,
            at,
            key: key_digest(Some(key)),
            writer: record.writer,
            request: record.request,
            change,
            bytes: bytes + key.len(),
        })
    }
}

/// The most bytes of acked records a shard holds for its applier, on the
/// way and waiting behind a gap together: what does not fit is applied
/// once read back, as without acks.
const EARLY_BYTES: usize = 16 << 20;
/// What an acked record holds besides its encoded size, about.
const ACKED_OVERHEAD: usize = 128;
/// Most records applied from their acks kept to check against what is read
/// back.
const CHECKED_MAX: usize = 1 << 16;

/// Where a shard's front and recorder hand its applier what the log acked.
#[derive(Clone)]
pub struct AckSender {
    tx: mpsc::UnboundedSender<Vec<Acked>>,
    held: Arc<AtomicUsize>,
}

/// The applier's end of an [`AckSender`].
pub(crate) struct AckReceiver {
    rx: mpsc::UnboundedReceiver<Vec<Acked>>,
    held: Arc<AtomicUsize>,
}

pub(crate) fn ack_channel() -> (AckSender, AckReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let held = Arc::new(AtomicUsize::new(0));
    (AckSender { tx, held: Arc::clone(&held) }, AckReceiver { rx, held })
}

impl AckSender {
    /// Hands `acked` over, unless the shard holds too much already (or its
    /// applier stopped): then they are applied once read back.
    pub fn send(&self, acked: Vec<Acked>) {
        let bytes: usize = acked.iter().map(|a| a.bytes + ACKED_OVERHEAD).sum();
        if self.held.fetch_add(bytes, Ordering::Relaxed) + bytes > EARLY_BYTES || self.tx.send(acked).is_err()
        {
            self.held.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

/// Records acked but not yet applied, by offset; and those applied from
/// their acks, until read back.
struct Early {
    ahead: BTreeMap<i64, Acked>,
    /// The bytes of what is on the way and in `ahead`.
    held: Arc<AtomicUsize>,
    applied: VecDeque<(i64, u64)>,
    /// A record read back was not where its ack said: acks are not trusted
    /// any more.
    off: bool,
}

impl Early {
    fn new(held: Arc<AtomicUsize>) -> Early {
        Early { ahead: BTreeMap::new(), held, applied: VecDeque::new(), off: false }
    }

    fn add(&mut self, acked: Vec<Acked>) {
        for a in acked {
            if self.off {
                self.release(&a);
                continue;
            }
            if let Some(replaced) = self.ahead.insert(a.offset, a) {
                self.release(&replaced);
            }
        }
    }

    fn release(&self, a: &Acked) {
        self.held.fetch_sub(a.bytes + ACKED_OVERHEAD, Ordering::Relaxed);
    }

    /// The records from `next` on without a gap, taken; those before
    /// `next` (applied as read) dropped.
    fn ready(&mut self, next: i64) -> Vec<Acked> {
        let after = self.ahead.split_off(&next);
        for dropped in std::mem::replace(&mut self.ahead, after).values() {
            self.release(dropped);
        }
        let mut ready = Vec::new();
        while let Some(entry) = self.ahead.first_entry() {
            if *entry.key() != next + ready.len() as i64 {
                break;
            }
            ready.push(entry.remove());
        }
        for a in &ready {
            self.release(a);
            if self.applied.len() >= CHECKED_MAX {
                self.applied.pop_front();
            }
            self.applied.push_back((a.offset, a.key));
        }
        ready
    }

    fn clear(&mut self) {
        for a in std::mem::take(&mut self.ahead).values() {
            self.release(a);
        }
    }

    /// A record at `offset` with `key` was read back, before the next to
    /// apply: if it was applied from its ack, the ack must have said where
    /// it is. (Not its timestamp: the answer to a retried append the broker
    /// found a duplicate gives the batch's, and a timestamp only dates the
    /// store's last apply.)
    fn read_back(&mut self, partition: i32, offset: i64, key: u64) {
        while self.applied.front().is_some_and(|(acked, _)| *acked < offset) {
            self.applied.pop_front();
        }
        if let Some((acked, acked_key)) = self.applied.front().copied()
            && acked == offset
        {
            self.applied.pop_front();
            if acked_key != key {
                metrics::LOG_ACK_MISMATCHES.inc();
                self.off = true;
                self.clear();
                tracing::error!(
                    partition,
                    offset,
                    "the schedule log holds another record than the one its ack placed at this offset, which \
                     was applied from the ack: the broker misreported where it appended (or lost acknowledged \
                     records: an unclean leader election); this node's copy of the shard may differ from the \
                     log: stop the node, remove the shard's store and start it again to rebuild it from the log; \
                     until then it applies only what it reads back"
                );
            }
        }
    }
}

/// Counts offsets the reads skipped: compaction removes records (and
/// transactions leave markers), so gaps are expected on a compacted log;
/// the count tells how many records a restore did not see.
fn count_skipped(partition: i32, next: i64, reads: &[Read]) {
    let mut expected = next;
    let mut skipped = 0;
    for read in reads {
        skipped += (read.offset - expected).max(0);
        expected = read.offset + 1;
    }
    if skipped > 0 {
        metrics::LOG_SKIPPED.inc_by(skipped as u64);
        tracing::debug!(partition, from = next, skipped, "offsets of the schedule log skipped");
    }
}

/// The end of the partition `reader` reads, the offset its next record
/// gets; retried until the broker answers or `stop`.
pub(crate) async fn end_of(reader: &Arc<LogReader>, stop: &CancellationToken) -> Option<i64> {
    loop {
        let reading = Arc::clone(reader);
        match tokio::task::spawn_blocking(move || reading.end(Duration::from_secs(5))).await {
            Ok(Ok(end)) => return Some(end),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading the end of the schedule log failed; trying again")
            }
            Err(e) => tracing::warn!(error = %e, "reading the end of the schedule log failed; trying again"),
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(BACKOFF) => {}
        }
    }
}

/// How long ago a copy of a shard may have last applied the log and still
/// be brought up to date from there. Kafka keeps a tombstone for
/// `delete.retention.ms` once compaction reached it (hourglass creates the
/// log with a day, Kafka's default), and then drops it along with the
/// records it replaced: a copy that resumed later would miss that the
/// message was delivered, and still hold it pending. Half of it leaves a
/// margin for compaction's own pace.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(12 * 3600);

/// Whether `store` last applied its partition longer than [`STALE_AFTER`]
/// ago (by the timestamps of hourglass's own records) and records were
/// appended since: when its copy opens, and when a standby copy that kept
/// running (its applier stuck, say) is taken over. A partition's end the
/// broker does not tell within 30 s counts as past: rebuilding is the safe
/// side.
async fn stale(store: &Store, reader: &Arc<LogReader>) -> bool {
    let (next, last) = (store.log_next(), store.log_time().0);
    let behind = crate::clock::SystemClock.now().0.saturating_sub(last);
    tracing::debug!(
        next,
        last_applied_at = last,
        behind_ms = behind,
        "is the copy further behind than tombstones are kept?"
    );
    if next == 0 || last == 0 || Duration::from_millis(behind) < STALE_AFTER {
        return false;
    }
    let end = tokio::time::timeout(Duration::from_secs(30), end_of(reader, &CancellationToken::new())).await;
    !matches!(end, Ok(Some(end)) if end <= next)
}

/// After `entries`, applied over the owner `owner`: whether the shard is
/// left released with nothing in doubt, if any of them claims or releases
/// it (as the store follows them: a release by a node that is not the
/// owner changes nothing).
fn released_clean(mut owner: u64, entries: &[(i64, UnixMillis, Entry)]) -> Option<bool> {
    let mut clean = None;
    for (_, _, entry) in entries {
        if let Entry::Logged { writer, change: Change::Owner(record), .. } = entry {
            if !record.released {
                (owner, clean) = (*writer, Some(false));
            } else if owner == *writer {
                (owner, clean) = (0, Some(record.clean));
            }
        }
    }
    clean
}

/// A shard's store following its partition of the log: opened, and its
/// applier running. An owner dispatches from it; a standby only keeps it
/// up to date, ready to be taken over.
pub(crate) struct View {
    /// Set while the last `Owner` record applied here is a clean release
    /// by the shard's owner (see [`Self::released_clean`]).
    released_clean: Arc<AtomicBool>,
    pub store: Store,
    pub reader: Arc<LogReader>,
    /// The next offset to apply, as applied.
    pub applied: watch::Receiver<i64>,
    /// Stops the applier.
    pub stop: CancellationToken,
    /// Where this node's appends to the partition go once acked.
    pub acked: AckSender,
    partition: i32,
    applier: TaskTracker,
}

impl View {
    /// Opens the store `config` names (empty if there is none) and starts
    /// applying its partition from the offset it recorded. A copy too far
    /// behind to be brought up to date (see [`STALE_AFTER`]) is dropped and
    /// rebuilt from the start of the partition.
    pub(crate) async fn open(
        config: &StoreConfig,
        log: &Arc<LogConsumer>,
        waiters: Arc<Waiters>,
    ) -> Result<View, StoreError> {
        let (store, applier) = Self::open_copy(config, log, &waiters).await?;
        let (store, applier) = if !stale(&store, &applier.reader).await {
            (store, applier)
        } else {
            metrics::STALE_COPIES.inc();
            tracing::warn!(
                path = %config.path.display(),
                applied_to = store.log_next(),
                last_applied_at = store.log_time_at_open().0,
                "this copy of the shard fell further behind the schedule log than Kafka keeps tombstones: \
                 rebuilding it from the log"
            );
            store.close().await;
            // Every handle gone, RocksDB is closed before its files go;
            // moved aside first, so that a crash midway leaves no half
            // store where the shard's is opened.
            drop((store, applier));
            let aside = config.path.with_extension("stale");
            let removed = std::fs::remove_dir_all(&aside)
                .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
                .and_then(|()| std::fs::rename(&config.path, &aside))
                .and_then(|()| std::fs::remove_dir_all(&aside));
            removed.map_err(|e| {
                StoreError::Io(format!("removing the stale copy {}: {e}", config.path.display()))
            })?;
            Self::open_copy(config, log, &waiters).await?
        };
        let (reader, stop, tracker) = (applier.reader(), CancellationToken::new(), TaskTracker::new());
        let released_clean = Arc::clone(&applier.released_clean);
        let (tx, applied) = watch::channel(store.log_next());
        let (acked, acks) = ack_channel();
        tracker.spawn(applier.run(stop.clone(), tx, acks));
        tracker.close();
        let partition = config.shard.shard as i32;
        Ok(View { released_clean, store, reader, applied, stop, acked, partition, applier: tracker })
    }

    /// The store and an applier of its partition, not started.
    async fn open_copy(
        config: &StoreConfig,
        log: &Arc<LogConsumer>,
        waiters: &Arc<Waiters>,
    ) -> Result<(Store, Applier), StoreError> {
        let opening = config.clone();
        let store = tokio::task::spawn_blocking(move || Store::open(&opening))
            .await
            .map_err(|e| StoreError::Io(format!("opening the store: {e}")))??;
        let recorded = store.recorded_shard();
        if recorded != config.shard {
            store.close().await;
            return Err(StoreError::Corrupt(format!(
                "the store in {} is shard {} of {}, not shard {} of {}: each partition of the schedule log \
                 needs its own store",
                config.path.display(),
                recorded.shard,
                recorded.shards,
                config.shard.shard,
                config.shard.shards,
            )));
        }
        let partition = config.shard.shard as i32;
        let applier = Applier::new(log, partition, store.clone(), Arc::clone(waiters));
        match applier {
            Ok(applier) => Ok((store, applier)),
            Err(e) => {
                store.close().await;
                Err(e)
            }
        }
    }

    /// Whether the shard has no owner because its last owner released it
    /// with nothing in doubt, by the records this process applied (a
    /// release applied before it started is not known: false).
    pub(crate) fn released_clean(&self) -> bool {
        self.store.log_owner() == 0 && self.released_clean.load(Ordering::Acquire)
    }

    /// What stopped this copy's store, if it stopped (damage found, or
    /// its writer thread gone): it applies nothing more.
    pub(crate) fn stopped(&self) -> Option<String> {
        self.store.damaged().is_cancelled().then(|| self.store.damage().unwrap_or_default())
    }

    /// Whether this copy fell further behind the log than it may be
    /// brought up to date from (see [`STALE_AFTER`]).
    pub(crate) async fn stale(&self) -> bool {
        stale(&self.store, &self.reader).await
    }

    /// The partition's end now; see [`end_of`].
    pub(crate) async fn end(&self, stop: &CancellationToken) -> Option<i64> {
        end_of(&self.reader, stop).await
    }

    /// Appends this node's `record` to the partition under `key`, and
    /// hands its ack to the applier: it is applied as soon as every record
    /// before it is, not once read back (a round trip of its own, up to a
    /// fetch's wait). Returns its offset.
    pub(crate) async fn append(
        &self,
        log: &LogProducer,
        key: &[u8],
        record: LogRecord,
    ) -> Result<i64, rdkafka::error::KafkaError> {
        let value = record.encode();
        let appended = log.enqueue_appended(self.partition, key, Some(&value)).await?;
        let offset = appended.offset;
        if let Some(acked) = Acked::new(appended, key, value.len(), record) {
            self.acked.send(vec![acked]);
        }
        Ok(offset)
    }

    /// Stops applying and closes the store.
    pub(crate) async fn close(&self) {
        self.stop.cancel();
        self.applier.wait().await;
        self.store.close().await;
    }
}

/// How long a step of a take may last before the log says so (and again
/// each time as long).
const SLOW_TAKE: Duration = Duration::from_secs(10);
/// Whether the store applied the log up to `end` (false: cancelled, or the
/// applier stopped).
pub(super) async fn applied_to(applied: &watch::Receiver<i64>, end: i64, cancel: &CancellationToken) -> bool {
    let mut applied = applied.clone();
    tokio::select! {
        _ = cancel.cancelled() => false,
        reached = applied.wait_for(|next| *next >= end) => reached.is_ok(),
    }
}

/// [`applied_to`] for a take of `shard`, saying every [`SLOW_TAKE`] how far
/// the store is, so that a take that does not end is seen in the log.
pub(super) async fn taking_applied_to(
    shard: usize,
    applied: &watch::Receiver<i64>,
    end: i64,
    cancel: &CancellationToken,
) -> bool {
    let started = Instant::now();
    let reached = applied_to(applied, end, cancel);
    tokio::pin!(reached);
    loop {
        tokio::select! {
            reached = &mut reached => return reached,
            _ = tokio::time::sleep(SLOW_TAKE) => tracing::warn!(
                shard,
                applied_to = *applied.borrow(),
                end,
                waited = ?started.elapsed(),
                "taking the shard: the schedule log is not applied to where the take needs it yet"
            ),
        }
    }
}

#[cfg(test)]
mod tests;
