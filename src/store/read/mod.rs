//! Reads that answer operators and clients: one message (`Get`), a page of
//! pending ones (`List`), counts (`Stats`), and the store's own state at
//! open. Each read is limited to what the caller's [`Scope`] sees, and
//! starts the due index where live entries start, not at the tombstones of
//! what was settled long ago.
//!
//! Nothing here writes; reads run on blocking threads, never on the writer;
//! the long walks (a page, counts, a forecast) on the store's browsing
//! threads, which yield the CPU to deliveries ([`super::browse`]).

use std::collections::HashMap;

use rocksdb::{DB, Direction, IteratorMode, ReadOptions};

type Snapshot<'a> = rocksdb::SnapshotWithThreadMode<'a, DB>;

use super::{
    Store, StoreError,
    options::cf,
    schema::{
        self, Counts, CountsKey, DeliveryLog, DispatchKey, DueValue, MessageRecord, Meta, Settlement,
        SettlementKind,
    },
    view,
};
use crate::message::{MessageId, PendingMessage, ScheduledMessage, Scope, Selector, UnixMillis, Visibility};

pub(crate) mod forecast;
mod purge;
pub use forecast::FORECAST_EXAMINE;
pub(crate) use purge::*;

/// Due entries `stats` looks at for the oldest overdue message a caller
/// sees, at most: one caller's messages may lie behind many of others'.
pub(super) const STATS_EXAMINE: usize = 10_000;

/// A shard's store as its readers see it (the services, the console, the
/// series driver): what is parked, pages and counts of it, the tables it
/// keeps. It changes nothing: changes go to the shard's writer through the
/// node. Cheap to clone.
#[derive(Clone)]
pub struct Reader {
    pub(in crate::store) store: Store,
}

impl Store {
    /// This store as its readers see it.
    pub fn reader(&self) -> Reader {
        Reader { store: self.clone() }
    }
}

/// The reads, each on a blocking thread; damage a read finds is reported.
impl Reader {
    /// The message `id` names for `scope`.
    pub async fn get(&self, scope: Scope, id: MessageId) -> Result<Option<ScheduledMessage>, StoreError> {
        let mut found = self.store.blocking(move |s| message(&s.inner.db, &scope, id)).await?;
        if let Some(m) = &mut found {
            self.store.inner.held.explain(m);
        }
        Ok(found)
    }

    /// A page of the pending messages `scope` sees, in dispatch order, read
    /// from one snapshot. It starts no lower than the first entry that may
    /// still be pending.
    pub async fn list_pending(&self, scope: Scope, mut filter: ListFilter) -> Result<StorePage, StoreError> {
        filter.from = filter.from.max(self.store.inner.wake.low_water());
        let mut page = self.store.browsing(move |s| list_pending(&s.inner.db, &scope, &filter)).await?;
        page.messages.iter_mut().for_each(|(_, m)| self.store.inner.held.explain_listed(m));
        Ok(page)
    }

    /// The counts `scope` sees and its oldest pending message due before
    /// `now`, from one snapshot.
    pub async fn stats(&self, scope: Scope, now: UnixMillis) -> Result<StoreStats, StoreError> {
        let from = self.store.inner.wake.low_water();
        let mut stats =
            self.store.browsing(move |s| stats(&s.inner.db, &scope, now, from, STATS_EXAMINE)).await?;
        if let Some(m) = &mut stats.oldest_overdue {
            self.store.inner.held.explain_listed(m);
        }
        Ok(stats)
    }

    /// Bytes on disk (SST files) plus memtables.
    pub async fn size_bytes(&self) -> Result<u64, StoreError> {
        self.store.blocking(|s| Ok(size_bytes(&s.inner.db))).await
    }

    /// What RocksDB holds in memory for this store, by part.
    pub async fn memory(&self) -> Result<StoreMemory, StoreError> {
        self.store.blocking(|s| Ok(memory(&s.inner.db))).await
    }

    /// Messages waiting for delivery.
    pub fn pending(&self) -> u64 {
        self.store.pending()
    }

    /// Messages the dispatcher holds for producing right now.
    pub fn dispatching(&self) -> usize {
        self.store.dispatching()
    }

    /// What damage was found in the store, and what to do about it.
    pub fn damage(&self) -> Option<String> {
        self.store.damage()
    }

    /// The lanes dispatch policies hold back now.
    pub fn held_back(&self) -> Vec<crate::message::HeldBack> {
        self.store.held().held_back()
    }
}

/// What the block cache keeps beyond its pinned blocks while the store is
/// at rest.
const REST_CACHE_BYTES: usize = 1 << 20;

/// The store's own upkeep, each on a blocking thread.
impl Store {
    /// RocksDB's sequence number: it moves with every write.
    pub fn write_seq(&self) -> u64 {
        self.inner.db.latest_sequence_number()
    }

    /// A store at rest: writes the memtables out and lets the block cache
    /// shrink to what stays pinned (the top levels of indexes and filters),
    /// so that a quiet backlog holds neither write buffers nor cached
    /// blocks. [`Self::in_use`] gives the cache back its size.
    pub async fn rest(&self) -> Result<(), StoreError> {
        let mut cache = self.inner.cache.cache.clone();
        cache.set_capacity(REST_CACHE_BYTES);
        self.blocking(|s| {
            crate::store::options::flush_all(&s.inner.db)?;
            Ok(())
        })
        .await
    }

    /// The store is written again after a rest: the block cache gets its
    /// size back.
    pub fn in_use(&self) {
        let mut cache = self.inner.cache.cache.clone();
        cache.set_capacity(self.inner.cache.bytes);
    }

    /// Drops the tombstones that cancels, retries and purges left in the
    /// due CF below `below`. Files at the bottom level were written by a
    /// compaction already, and are left as they are.
    pub async fn compact_settled(&self, below: DispatchKey) -> Result<(), StoreError> {
        self.blocking(move |s| {
            let db = &s.inner.db;
            let mut options = rocksdb::CompactOptions::default();
            options.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Skip);
            db.compact_range_cf_opt(cf(db, schema::CF_DUE), None::<&[u8]>, Some(below.encode()), &options);
            Ok(())
        })
        .await
    }
}

fn size_bytes(db: &DB) -> u64 {
    [schema::CF_DUE, schema::CF_MESSAGES, schema::CF_CHECKPOINT]
        .iter()
        .flat_map(|name| {
            let cf = cf(db, name);
            ["rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"]
                .map(|p| db.property_int_value_cf(cf, p).ok().flatten().unwrap_or(0))
        })
        .sum()
}

/// What RocksDB holds in memory for one store, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreMemory {
    /// The block cache's content (32 MiB at most): data blocks read,
    /// and the partitions of the files' indexes and filters.
    pub block_cache: u64,
    /// The part of it that stays: the top levels of each file's index and
    /// filter, and whole ones of the newest files (level 0).
    pub pinned: u64,
    /// Write buffers: what was written and not yet flushed to files
    /// (64 MiB at most; nothing once the store is at rest).
    pub memtables: u64,
    /// What open files hold outside the cache.
    pub table_readers: u64,
}

fn memory(db: &DB) -> StoreMemory {
    let per_cf = |property: &str| -> u64 {
        [schema::CF_DUE, schema::CF_MESSAGES, schema::CF_CHECKPOINT]
            .iter()
            .map(|name| db.property_int_value_cf(cf(db, name), property).ok().flatten().unwrap_or(0))
            .sum()
    };
    // One cache serves the column families: its figures are the same from
    // each of them (not from the default one, which has its own).
    let cache = |property: &str| {
        db.property_int_value_cf(cf(db, schema::CF_DUE), property).ok().flatten().unwrap_or(0)
    };
    StoreMemory {
        block_cache: cache("rocksdb.block-cache-usage"),
        pinned: cache("rocksdb.block-cache-pinned-usage"),
        memtables: per_cf("rocksdb.cur-size-all-mem-tables"),
        table_readers: per_cf("rocksdb.estimate-table-readers-mem"),
    }
}

fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::Corrupt(what.into())
}

/// The store's metadata.
pub(crate) fn meta(db: &DB, opts: &ReadOptions) -> Result<Meta, StoreError> {
    match db.get_pinned_cf_opt(cf(db, schema::CF_CHECKPOINT), schema::meta_key(), opts)? {
        Some(bytes) => schema::decode::<Meta>(&bytes).map_err(|e| corrupt(format!("checkpoint meta: {e}"))),
        None => Ok(Meta::default()),
    }
}

/// Every counts entry, from `snapshot` if given.
pub(crate) fn counts(
    db: &DB,
    snapshot: Option<&Snapshot<'_>>,
) -> Result<HashMap<CountsKey, Counts>, StoreError> {
    let (lower, upper) = CountsKey::range();
    let mut bounded = ReadOptions::default();
    bounded.set_iterate_upper_bound(upper);
    if let Some(snapshot) = snapshot {
        bounded.set_snapshot(snapshot);
    }
    let mut out = HashMap::new();
    for item in db.iterator_cf_opt(
        cf(db, schema::CF_CHECKPOINT),
        bounded,
        IteratorMode::From(&lower, Direction::Forward),
    ) {
        let (k, v) = item?;
        let key = CountsKey::decode(&k).ok_or_else(|| corrupt(format!("counts key {k:?}")))?;
        let value = schema::decode::<Counts>(&v).map_err(|e| corrupt(format!("counts of {key:?}: {e}")))?;
        out.insert(key, value);
    }
    Ok(out)
}

/// Counts every message the store holds by space, topic and state: the
/// counts entries of a store written before they existed. One pass over
/// the messages and, in step with it, the settlements (both in id order).
/// (Such a store predates delivery logs too: a message without a
/// settlement is pending there.)
pub(crate) fn count_every_message(db: &DB) -> Result<HashMap<CountsKey, Counts>, StoreError> {
    let mut out: HashMap<CountsKey, Counts> = HashMap::new();
    let (lower, upper) = schema::settlements_range();
    let mut opts = ReadOptions::default();
    opts.set_iterate_upper_bound(upper);
    let mut settlements = db
        .iterator_cf_opt(cf(db, schema::CF_CHECKPOINT), opts, IteratorMode::From(&lower, Direction::Forward))
        .map(|item| item.map(|(k, v)| (k[1..].to_vec(), v)));
    let mut next_settlement = settlements.next().transpose()?;
    for item in db.iterator_cf(cf(db, schema::CF_MESSAGES), IteratorMode::Start) {
        let (k, v) = item?;
        let id = MessageId::from_stored(&k).ok_or_else(|| corrupt(format!("message key {k:?}")))?;
        let record =
            schema::decode::<MessageRecord>(&v).map_err(|e| corrupt(format!("message {id}: {e}")))?;
        while next_settlement.as_ref().is_some_and(|(sid, _)| sid.as_slice() < &*k) {
            next_settlement = settlements.next().transpose()?;
        }
        let settlement = match &next_settlement {
            Some((sid, bytes)) if sid.as_slice() == &*k => Some(
                schema::decode::<Settlement>(bytes)
                    .map_err(|e| corrupt(format!("settlement of {id}: {e}")))?,
            ),
            _ => None,
        };
        let counts = out.entry(CountsKey::of(&id, &record.topic)).or_default();
        *counts.of_kind(settlement.map_or(SettlementKind::Retrying, |s| s.kind())) += 1;
    }
    Ok(out)
}

/// A message's record and settlement from their stored bytes.
pub(crate) fn decode_stored(
    id: &MessageId,
    record: &[u8],
    settlement: Option<&[u8]>,
) -> Result<(MessageRecord, Option<Settlement>), StoreError> {
    let record = schema::decode::<MessageRecord>(record)
        .map_err(|e| corrupt(format!("message {}: {e}", id.qualified())))?;
    let settlement = settlement
        .map(schema::decode::<Settlement>)
        .transpose()
        .map_err(|e| corrupt(format!("settlement of {}: {e}", id.qualified())))?;
    Ok((record, settlement))
}

/// Read options on `snapshot`, or on the latest state.
pub(super) fn at(snapshot: Option<&Snapshot<'_>>) -> ReadOptions {
    let mut opts = ReadOptions::default();
    if let Some(snapshot) = snapshot {
        opts.set_snapshot(snapshot);
    }
    opts
}

/// The record and settlement stored under `id`. A message delivered at its
/// first try has no settlement entry: its chunk's delivery log stands in.
pub(crate) fn record(
    db: &DB,
    id: &MessageId,
    snapshot: Option<&Snapshot<'_>>,
) -> Result<Option<(MessageRecord, Option<Settlement>)>, StoreError> {
    record_with(db, id, snapshot, &mut DeliveryLogs::default())
}

/// [`record`], with the delivery logs it reads decoded once into `logs`.
pub(crate) fn record_with(
    db: &DB,
    id: &MessageId,
    snapshot: Option<&Snapshot<'_>>,
    logs: &mut DeliveryLogs,
) -> Result<Option<(MessageRecord, Option<Settlement>)>, StoreError> {
    let opts = at(snapshot);
    let Some(bytes) = db.get_pinned_cf_opt(cf(db, schema::CF_MESSAGES), id.as_bytes(), &opts)? else {
        return Ok(None);
    };
    let settlement =
        db.get_pinned_cf_opt(cf(db, schema::CF_CHECKPOINT), schema::settlement_key(id), &opts)?;
    let (record, settlement) = decode_stored(id, &bytes, settlement.as_deref())?;
    let record = if record.is_locator() { whole_record(db, id, &record, &opts)? } else { record };
    let settlement = match settlement {
        Some(s) => Some(s),
        None => logged_delivery(db, view::dispatch_key(&record, None), snapshot, logs)?,
    };
    Ok(Some((record, settlement)))
}

/// The record stored under `id`, whole (read from its due entry if the
/// messages CF holds a locator), without what became of it.
pub(crate) fn whole(db: &DB, id: &MessageId) -> Result<Option<MessageRecord>, StoreError> {
    let opts = ReadOptions::default();
    let Some(bytes) = db.get_pinned_cf_opt(cf(db, schema::CF_MESSAGES), id.as_bytes(), &opts)? else {
        return Ok(None);
    };
    let (record, _) = decode_stored(id, &bytes, None)?;
    if record.is_locator() { whole_record(db, id, &record, &opts).map(Some) } else { Ok(Some(record)) }
}

/// The record a locator points at, read whole from its due entry.
fn whole_record(
    db: &DB,
    id: &MessageId,
    locator: &MessageRecord,
    opts: &ReadOptions,
) -> Result<MessageRecord, StoreError> {
    let key = view::dispatch_key(locator, None);
    let missing = || corrupt(format!("the due entry {key:?} of message {} is missing", id.qualified()));
    let bytes = db.get_pinned_cf_opt(cf(db, schema::CF_DUE), key.encode(), opts)?.ok_or_else(missing)?;
    match schema::decode_due_value(&bytes) {
        Some(DueValue::Entry(entry)) if entry.id == id.as_bytes() => entry.record.ok_or_else(missing),
        _ => Err(missing()),
    }
}

/// The first-try deliveries the delivery logs list, asked about in
/// ascending key order, as a walk of the due index meets them. A delivered
/// due entry stays in the index until its retention ends, so every read of
/// the index that wants pending messages skips these.
pub(crate) struct Logged<'a> {
    it: rocksdb::DBRawIteratorWithThreadMode<'a, DB>,
    /// The range of the log the iterator is at; its lines once needed.
    current: Option<(DispatchKey, DispatchKey)>,
    lines: Option<Vec<DispatchKey>>,
}

impl<'a> Logged<'a> {
    /// Ready to answer for keys from `from` on.
    pub(super) fn from(
        db: &'a DB,
        from: DispatchKey,
        snapshot: Option<&Snapshot<'_>>,
    ) -> Result<Self, StoreError> {
        let (lower, upper) = schema::delivery_logs_range();
        let mut opts = at(snapshot);
        opts.set_iterate_lower_bound(lower);
        opts.set_iterate_upper_bound(upper);
        let mut it = db.raw_iterator_cf_opt(cf(db, schema::CF_CHECKPOINT), opts);
        // The one log that may hold `from` starts at or before it.
        it.seek_for_prev(schema::delivery_log_key(from));
        if !it.valid() {
            it.status()?;
            it.seek(schema::delivery_log_key(from));
        }
        let mut logged = Logged { it, current: None, lines: None };
        logged.load()?;
        Ok(logged)
    }

    /// Reads the range of the log the iterator is at.
    fn load(&mut self) -> Result<(), StoreError> {
        self.lines = None;
        self.current = match (self.it.key(), self.it.value()) {
            (Some(k), Some(v)) => {
                let first = schema::decode_delivery_log_key(k)
                    .ok_or_else(|| corrupt(format!("delivery log key {k:?}")))?;
                let last = schema::delivery_log_last(v)
                    .ok_or_else(|| corrupt(format!("delivery log at {first:?} has no last key")))?;
                Some((first, last))
            }
            _ => {
                self.it.status()?;
                None
            }
        };
        Ok(())
    }

    /// Whether the entry at `key` was delivered at its first try. Each key
    /// asked about is at least the one before.
    pub(super) fn contains(&mut self, key: DispatchKey) -> Result<bool, StoreError> {
        loop {
            let Some((first, last)) = self.current else { return Ok(false) };
            if key < first {
                return Ok(false);
            }
            if key > last {
                self.it.next();
                self.load()?;
                continue;
            }
            if self.lines.is_none() {
                let v = self.it.value().expect("the iterator is at the log it loaded");
                let log = schema::decode::<DeliveryLog>(v)
                    .map_err(|e| corrupt(format!("delivery log at {first:?}: {e}")))?;
                let mut keys: Vec<DispatchKey> =
                    log.lines.iter().map(|l| DispatchKey { at: UnixMillis(l.at_ms), seq: l.seq }).collect();
                keys.sort_unstable();
                self.lines = Some(keys);
            }
            return Ok(self.lines.as_ref().is_some_and(|lines| lines.binary_search(&key).is_ok()));
        }
    }
}

/// The delivery of the message dispatched from `key` at its first try, if
/// a chunk's delivery log holds it. Chunk ranges do not overlap, so the
/// only chunk that can is the last one starting at or before `key`.
pub(crate) fn logged_delivery(
    db: &DB,
    key: DispatchKey,
    snapshot: Option<&Snapshot<'_>>,
    logs: &mut DeliveryLogs,
) -> Result<Option<Settlement>, StoreError> {
    let (lower, _) = schema::delivery_logs_range();
    let mut opts = at(snapshot);
    opts.set_iterate_lower_bound(lower);
    let mut it = db.raw_iterator_cf_opt(cf(db, schema::CF_CHECKPOINT), opts);
    it.seek_for_prev(schema::delivery_log_key(key));
    let (Some(k), Some(v)) = (it.key(), it.value()) else {
        it.status()?;
        return Ok(None);
    };
    // Most keys asked about lie past the chunk before them (a message
    // still pending, or one settled otherwise): its last key tells so
    // without decoding its lines.
    if schema::delivery_log_last(v).is_none_or(|last| key > last) {
        return Ok(None);
    }
    let lines = match logs.by_key.get(k) {
        Some(lines) => lines,
        None => {
            let first = schema::decode_delivery_log_key(k)
                .ok_or_else(|| corrupt(format!("delivery log key {k:?}")))?;
            let log = schema::decode::<DeliveryLog>(v)
                .map_err(|e| corrupt(format!("delivery log at {first:?}: {e}")))?;
            let lines = log
                .lines
                .iter()
                .map(|l| (DispatchKey { at: UnixMillis(l.at_ms), seq: l.seq }, l.settlement()))
                .collect();
            logs.by_key.entry(k.to_vec()).or_insert(lines)
        }
    };
    Ok(lines.get(&key).cloned())
}

/// Delivery logs decoded by one reader (a round of the writer), by their
/// key: a chunk's many messages read one after another decode it once. A
/// reader keeps it only while the logs cannot change under it.
#[derive(Default)]
pub(crate) struct DeliveryLogs {
    by_key: HashMap<Vec<u8>, HashMap<DispatchKey, Settlement>>,
}

/// The message `id` names for `scope` (in the caller's space, else in the
/// shared one), from one snapshot.
pub(crate) fn message(db: &DB, scope: &Scope, id: MessageId) -> Result<Option<ScheduledMessage>, StoreError> {
    let snapshot = db.snapshot();
    for candidate in std::iter::once(id.clone()).chain(scope.fallback(&id)) {
        let Some((record, settlement)) = record(db, &candidate, Some(&snapshot))? else { continue };
        match scope.sees(&candidate, &record.topic) {
            Visibility::Visible => {
                return Ok(Some(view::scheduled_message(candidate, &record, settlement.as_ref())));
            }
            Visibility::Forbidden => {
                return Err(StoreError::Forbidden { token: scope.name.to_string(), topic: record.topic });
            }
            Visibility::Hidden => {}
        }
    }
    Ok(None)
}

/// Which pending messages `list_pending` reads.
#[derive(Clone, Debug)]
pub struct ListFilter {
    pub topic: Option<String>,
    /// Only messages whose labels match.
    pub selector: Selector,
    /// The first position to look at.
    pub from: DispatchKey,
    /// Dispatch time before this.
    pub to: Option<UnixMillis>,
    /// Messages in the page, at most.
    pub limit: usize,
    /// Due entries looked at, at most: what bounds one call when a filter
    /// matches little of a large backlog.
    pub examine: usize,
}

/// Upper bound on the key bytes of one listing page, so that a page of
/// large keys stays well below a client's default 4 MiB message limit.
pub const LIST_KEY_BYTES: usize = 1 << 20;

/// A page of pending messages, each with where it lies in the due index.
#[derive(Clone, Debug, Default)]
pub struct StorePage {
    pub messages: Vec<(DispatchKey, PendingMessage)>,
    /// Where the next page starts; none at the end.
    pub next: Option<DispatchKey>,
}

/// A page of the pending messages `scope` sees, in dispatch order, from one
/// snapshot.
pub(crate) fn list_pending(db: &DB, scope: &Scope, filter: &ListFilter) -> Result<StorePage, StoreError> {
    let snapshot = db.snapshot();
    let mut opts = ReadOptions::default();
    opts.set_snapshot(&snapshot);
    opts.set_iterate_lower_bound(filter.from.encode());
    if let Some(to) = filter.to {
        opts.set_iterate_upper_bound(DispatchKey { at: to, seq: 0 }.encode());
    }
    let start = filter.from.encode();
    let mut page = StorePage::default();
    let (mut examined, mut key_bytes) = (0, 0);
    let mut logged = Logged::from(db, filter.from, Some(&snapshot))?;
    for item in
        db.iterator_cf_opt(cf(db, schema::CF_DUE), opts, IteratorMode::From(&start, Direction::Forward))
    {
        let (k, v) = item?;
        let key = DispatchKey::decode(&k).ok_or_else(|| corrupt(format!("due key {k:?}")))?;
        if page.messages.len() >= filter.limit || examined >= filter.examine || key_bytes >= LIST_KEY_BYTES {
            page.next = Some(key);
            break;
        }
        examined += 1;
        if logged.contains(key)? {
            continue;
        }
        if let (_, Some(message)) = visible_at(db, &snapshot, scope, &k, &v)?
            && filter.topic.as_ref().is_none_or(|t| *t == message.topic)
            && filter.selector.matches(&message.labels)
        {
            key_bytes += message.key.as_ref().map_or(0, Vec::len);
            page.messages.push((key, message));
        }
    }
    Ok(page)
}

/// A due entry's key, and the pending message it holds if `scope` sees it.
fn visible_at(
    db: &DB,
    snapshot: &Snapshot<'_>,
    scope: &Scope,
    k: &[u8],
    v: &[u8],
) -> Result<(DispatchKey, Option<PendingMessage>), StoreError> {
    let key = DispatchKey::decode(k).ok_or_else(|| corrupt(format!("due key {k:?}")))?;
    let message = match schema::decode_due_value(v) {
        Some(DueValue::Entry(entry)) => {
            let id = MessageId::from_stored(&entry.id)
                .ok_or_else(|| corrupt(format!("due entry {key:?} names no id")))?;
            let record = entry.record.ok_or_else(|| corrupt(format!("due entry {key:?} holds no record")))?;
            scope
                .sees_space(id.tenant())
                .then(|| view::pending_message(id, key, record, entry.tries.as_ref()))
        }
        Some(DueValue::Legacy(id)) if scope.sees_space(id.tenant()) => pending_at(db, snapshot, id, key)?,
        Some(DueValue::Legacy(_)) => None,
        None => return Err(corrupt(format!("due entry {key:?} is unreadable"))),
    };
    Ok((key, message.filter(|m| scope.sees(&m.id, &m.topic) == Visibility::Visible)))
}

/// The message a legacy due entry names, if it is still pending under that key.
fn pending_at(
    db: &DB,
    snapshot: &Snapshot<'_>,
    id: MessageId,
    key: DispatchKey,
) -> Result<Option<PendingMessage>, StoreError> {
    let Some((record, settlement)) = record(db, &id, Some(snapshot))? else {
        return Ok(None);
    };
    if settlement.as_ref().is_some_and(Settlement::is_settled)
        || view::dispatch_key(&record, settlement.as_ref()) != key
    {
        return Ok(None);
    }
    let tries = settlement.as_ref().map(schema::TriesRecord::of);
    Ok(Some(view::pending_message(id, key, record, tries.as_ref())))
}

/// Every mark (see [`schema::mark_key`]): by topic and partition.
pub(crate) fn marks(db: &DB) -> Result<HashMap<(std::sync::Arc<str>, i32), i64>, StoreError> {
    let (lower, upper) = schema::marks_range();
    let mut marks = HashMap::new();
    for (topic, partition, offset) in marks_in(db, lower, upper)? {
        marks.insert((topic.into(), partition), offset);
    }
    Ok(marks)
}

/// The marks of `topic`'s partitions.
pub(crate) fn marks_of(db: &DB, topic: &str) -> Result<HashMap<i32, i64>, StoreError> {
    let lower = schema::mark_prefix(topic);
    let mut upper = lower.clone();
    *upper.last_mut().expect("a prefix ends with its separator") += 1;
    Ok(marks_in(db, lower, upper)?.into_iter().map(|(_, partition, offset)| (partition, offset)).collect())
}

/// Marks between two keys: (topic, partition, offset).
fn marks_in(db: &DB, lower: Vec<u8>, upper: Vec<u8>) -> Result<Vec<(String, i32, i64)>, StoreError> {
    let mut opts = ReadOptions::default();
    opts.set_iterate_lower_bound(lower.clone());
    opts.set_iterate_upper_bound(upper);
    let mut marks = Vec::new();
    for item in db.iterator_cf_opt(
        cf(db, schema::CF_CHECKPOINT),
        opts,
        IteratorMode::From(&lower, Direction::Forward),
    ) {
        let (k, v) = item?;
        marks.push(schema::decode_mark(&k, &v).ok_or_else(|| corrupt(format!("mark {k:?}")))?);
    }
    Ok(marks)
}

/// The pending messages accepted before sequence `before_seq` and due to
/// be dispatched before `below`: what a dispatcher stopped uncleanly may
/// have produced without recording it.
pub(crate) fn in_doubt(
    db: &DB,
    from: DispatchKey,
    below: DispatchKey,
    before_seq: u64,
) -> Result<Vec<(DispatchKey, PendingMessage)>, StoreError> {
    let snapshot = db.snapshot();
    let mut opts = at(Some(&snapshot));
    opts.set_iterate_upper_bound(below.encode().to_vec());
    let start = from.encode();
    let mut logged = Logged::from(db, from, Some(&snapshot))?;
    let mut found = Vec::new();
    for item in
        db.iterator_cf_opt(cf(db, schema::CF_DUE), opts, IteratorMode::From(&start, Direction::Forward))
    {
        let (k, v) = item?;
        let key = DispatchKey::decode(&k).ok_or_else(|| corrupt(format!("due key {k:?}")))?;
        if key.seq >= before_seq || logged.contains(key)? {
            continue;
        }
        if let (_, Some(message)) = visible_at(db, &snapshot, &Scope::everything(), &k, &v)? {
            found.push((key, message));
        }
    }
    Ok(found)
}

/// What the store knows about itself for `Stats`.
#[derive(Clone, Debug)]
pub struct StoreStats {
    /// The whole store's counters, as of the last commit.
    pub meta: Meta,
    /// What the caller sees, by state: the whole store for a caller that
    /// sees everything.
    pub counts: Counts,
    pub oldest_overdue: Option<PendingMessage>,
}

/// The counts `scope` sees and its oldest pending message due before
/// `now`, looking at no more than `examine` due entries from `from`, from
/// one snapshot.
pub(crate) fn stats(
    db: &DB,
    scope: &Scope,
    now: UnixMillis,
    from: DispatchKey,
    examine: usize,
) -> Result<StoreStats, StoreError> {
    let snapshot = db.snapshot();
    let mut read = ReadOptions::default();
    read.set_snapshot(&snapshot);
    let meta = meta(db, &read)?;
    let counts = if scope.is_everything() {
        Counts {
            pending: meta.pending,
            delivered: meta.delivered_total,
            cancelled: meta.cancelled_total,
            failed: meta.failed_total,
            expired: meta.expired_total,
            dead_lettered: meta.dead_lettered_total,
        }
    } else {
        let mut sum = Counts::default();
        for (key, counts) in counts(db, Some(&snapshot))? {
            if scope.sees_space(key.tenant.as_deref()) && scope.covers(&key.topic) {
                sum.add(&counts);
            }
        }
        sum
    };
    let upper = DispatchKey { at: now, seq: 0 };
    let mut opts = ReadOptions::default();
    opts.set_snapshot(&snapshot);
    opts.set_iterate_lower_bound(from.encode());
    opts.set_iterate_upper_bound(upper.encode());
    let mut oldest_overdue = None;
    let start = from.encode();
    let entries =
        db.iterator_cf_opt(cf(db, schema::CF_DUE), opts, IteratorMode::From(&start, Direction::Forward));
    let mut logged = Logged::from(db, from, Some(&snapshot))?;
    for item in entries.take(examine) {
        let (k, v) = item?;
        let key = DispatchKey::decode(&k).ok_or_else(|| corrupt(format!("due key {k:?}")))?;
        if logged.contains(key)? {
            continue;
        }
        if let (_, Some(message)) = visible_at(db, &snapshot, scope, &k, &v)? {
            oldest_overdue = Some(message);
            break;
        }
    }
    Ok(StoreStats { meta, counts, oldest_overdue })
}
