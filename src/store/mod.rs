//! The store: where messages are parked until due, and where the dispatcher
//! records what it delivered. One RocksDB with three column families (see
//! [`schema`]).
//!
//! A narrow interface: the service calls `schedule`, `cancel`, `reschedule`
//! and `get`, and `list_pending` and `stats` for operators; the dispatcher
//! calls `take_due` and `settle`. Every change goes
//! through the single [`writer`] thread as one atomic `WriteBatch`; reads go
//! straight to RocksDB from a blocking thread. Nothing here knows about gRPC
//! or Kafka.

mod claims;
pub mod schema;
mod writer;

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBRecoveryMode, Direction, IteratorMode, Options,
    ReadOptions,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use claims::Claims;
pub(crate) use claims::Wake;
use schema::{DueKey, MessageRecord, Meta, Settlement};
pub use writer::NewMessage;
pub(crate) use writer::cf;
use writer::{Op, Writer};
pub(crate) use writer::{Outcome, Settle};

use crate::message::{
    CancelOutcome, MessageId, PendingMessage, PendingPage, Scheduled, ScheduledMessage, UnixMillis,
};

#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no message with id {0:?}")]
    NotFound(MessageId),
    #[error("id {0:?} is already taken by a different message")]
    IdConflict(MessageId),
    #[error("message {0:?} was already delivered")]
    AlreadyDelivered(MessageId),
    #[error("message {0:?} was cancelled")]
    AlreadyCancelled(MessageId),
    #[error("the store's disk is full: {0}")]
    Full(String),
    #[error(
        "{pending} messages are pending, the most this server holds (--max-pending); try again once some are delivered"
    )]
    AtCapacity { pending: u64 },
    #[error("the store is closed")]
    Closed,
    #[error("the store is corrupt: {0}")]
    Corrupt(String),
    #[error("store I/O failed: {0}")]
    Io(String),
}

impl StoreError {
    fn corrupt(what: impl Into<String>) -> Self {
        StoreError::Corrupt(what.into())
    }
}

impl From<rocksdb::Error> for StoreError {
    fn from(e: rocksdb::Error) -> Self {
        let text = e.into_string();
        match () {
            _ if text.contains("No space left") => StoreError::Full(text),
            _ if text.starts_with("Corruption") => StoreError::Corrupt(text),
            _ => StoreError::Io(text),
        }
    }
}

/// How the store is opened.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub path: PathBuf,
    /// Sync the WAL before acknowledging (survives power loss), or leave it
    /// in the OS page cache (survives a process crash only).
    pub sync_writes: bool,
    /// Block cache shared by the column families.
    pub cache_bytes: usize,
    /// Memtable budget across the column families.
    pub write_buffer_bytes: usize,
    /// Most messages pending at once; new ones are refused beyond it.
    pub max_pending: Option<u64>,
    /// Read every entry with its checksum, in the background after opening,
    /// so that damage is reported at once instead of when the dispatcher
    /// reaches it. Costs a full read of the store at each start.
    pub verify_on_open: bool,
}

/// Whether the store takes new messages, as its last commit found. A
/// process reports it as gRPC health, so a load balancer sends its traffic
/// elsewhere while the store cannot take it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreHealth {
    Ok,
    /// The backlog cap is reached; it clears as messages are delivered.
    AtCapacity,
    /// The last write failed (disk full, I/O error). Nothing in it was
    /// acknowledged; the store probes until a write succeeds again.
    Failing(String),
}

impl StoreConfig {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StoreConfig {
            path: path.into(),
            sync_writes: true,
            cache_bytes: 32 << 20,
            write_buffer_bytes: 64 << 20,
            max_pending: None,
            verify_on_open: true,
        }
    }
}

/// Which pending messages `list_pending` reads.
#[derive(Clone, Debug)]
pub struct ListFilter {
    pub topic: Option<String>,
    /// The first position to look at.
    pub from: DueKey,
    /// Dispatch time before this.
    pub to: Option<UnixMillis>,
    /// Messages in the page, at most.
    pub limit: usize,
    /// Due entries looked at, at most: what bounds one call when a topic
    /// filter matches little of a large backlog.
    pub examine: usize,
}

/// What the store knows about itself for `Stats`.
#[derive(Clone, Debug)]
pub struct StoreStats {
    /// The counters of the last commit.
    pub meta: Meta,
    pub oldest_overdue: Option<PendingMessage>,
}

/// A message the dispatcher claimed and may produce now.
#[derive(Debug)]
pub(crate) struct Ready {
    pub id: MessageId,
    pub key: DueKey,
    pub record: MessageRecord,
    /// Its tries so far (default when never tried).
    pub prev: Settlement,
}

/// What one look at the due CF found.
#[derive(Debug, Default)]
pub(crate) struct DueBatch {
    pub ready: Vec<Ready>,
    /// Where the next look starts.
    pub next_from: DueKey,
    /// More is due now than `limit` allowed.
    pub more: bool,
    /// When nothing more is due now: when the next message is.
    pub next_due: Option<UnixMillis>,
    /// Claims taken on entries that turned out stale; give them back.
    pub stale: Vec<MessageId>,
}

/// A handle on one store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<DB>,
    ops: mpsc::Sender<Op>,
    claims: Arc<Claims>,
    wake: Arc<Wake>,
    pending: Arc<AtomicU64>,
    health: watch::Receiver<StoreHealth>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    path: PathBuf,
    /// Cancelled when damage is found; `damage` says what and where.
    damaged: CancellationToken,
    damage: Mutex<Option<String>>,
    /// Cancelled by `close`: background reads stop.
    closing: CancellationToken,
    max_pending: Option<u64>,
}

impl Store {
    /// Opens (or creates) the store at `config.path` and starts its writer.
    pub fn open(config: &StoreConfig) -> Result<Store, StoreError> {
        std::fs::create_dir_all(&config.path)
            .map_err(|e| StoreError::Io(format!("creating {}: {e}", config.path.display())))?;
        let db = open_db(config).map_err(|e| match e {
            StoreError::Corrupt(detail) => StoreError::Corrupt(damage_report(&detail, &config.path)),
            other => other,
        })?;
        let db = Arc::new(db);
        let meta = match db.get_pinned_cf(cf(&db, schema::CF_CHECKPOINT), schema::meta_key())? {
            Some(bytes) => schema::decode::<Meta>(&bytes)
                .map_err(|e| StoreError::corrupt(format!("checkpoint meta: {e}")))?,
            None => Meta::default(),
        };
        let claims = Arc::new(Claims::default());
        let wake = Arc::new(Wake::default());
        let pending = Arc::new(AtomicU64::new(meta.pending));
        crate::metrics::PENDING.set(meta.pending as i64);
        let (ops, rx) = mpsc::channel(16 * 1024);
        let (health_tx, health) = watch::channel(StoreHealth::Ok);
        let mut writer = Writer::new(
            Arc::clone(&db),
            Arc::clone(&claims),
            Arc::clone(&wake),
            Arc::clone(&pending),
            meta,
            config.sync_writes,
            rx,
        );
        writer.max_pending = config.max_pending;
        writer.health = health_tx;
        writer.report_capacity();
        let handle = std::thread::Builder::new()
            .name("hourglass-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| StoreError::Io(format!("starting the writer thread: {e}")))?;
        let store = Store {
            inner: Arc::new(Inner {
                db,
                ops,
                claims,
                wake,
                pending,
                health,
                writer: Mutex::new(Some(handle)),
                path: config.path.clone(),
                damaged: CancellationToken::new(),
                damage: Mutex::new(None),
                closing: CancellationToken::new(),
                max_pending: config.max_pending,
            }),
        };
        if config.verify_on_open {
            let verifying = store.clone();
            std::thread::Builder::new()
                .name("hourglass-verify".into())
                .spawn(move || verifying.verify())
                .map_err(|e| StoreError::Io(format!("starting the verifier thread: {e}")))?;
        }
        Ok(store)
    }

    /// Reads the whole store with checksums, in the background of a
    /// running server, and reports damage it finds.
    fn verify(&self) {
        match verify(&self.inner.db, &self.inner.closing) {
            Ok(()) => {}
            Err(StoreError::Corrupt(detail)) => self.report_damage(&detail),
            Err(e) => tracing::warn!(error = %e, "verifying the store's checksums failed"),
        }
    }

    /// Cancelled once damage is found in the store (at start-up by the
    /// verifier, or by any read since): the server stops rather than go on
    /// without the records past the damage.
    pub fn damaged(&self) -> CancellationToken {
        self.inner.damaged.clone()
    }

    /// What damage was found, and what to do about it.
    pub fn damage(&self) -> Option<String> {
        self.inner.damage.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn report_damage(&self, detail: &str) {
        let mut damage = self.inner.damage.lock().unwrap_or_else(|e| e.into_inner());
        if damage.is_none() {
            let path = self.inner.path.display();
            let report =
                format!("the store in {path} is corrupt: {}", damage_report(detail, &self.inner.path));
            tracing::error!("{report}");
            *damage = Some(report);
        }
        self.inner.damaged.cancel();
    }

    async fn call<T>(&self, op: impl FnOnce(writer::Reply<T>) -> Op) -> Result<T, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.inner.ops.send(op(tx)).await.map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    async fn send(&self, op: Op) -> Result<(), StoreError> {
        self.inner.ops.send(op).await.map_err(|_| StoreError::Closed)
    }

    /// Parks a message; returns once it is durable.
    pub async fn schedule(&self, msg: NewMessage) -> Result<Scheduled, StoreError> {
        self.call(|reply| Op::Schedule { msg, reply }).await
    }

    /// Parks many messages in one atomic, durable write. Each message gets
    /// its own answer (an id taken by a different message fails alone); the
    /// call fails as a whole only if the write does, and then nothing of it
    /// was stored.
    pub async fn schedule_batch(
        &self,
        msgs: Vec<NewMessage>,
    ) -> Result<Vec<Result<Scheduled, StoreError>>, StoreError> {
        if msgs.is_empty() {
            return Ok(Vec::new());
        }
        self.call(|reply| Op::ScheduleBatch { msgs, reply }).await
    }

    pub async fn cancel(&self, id: MessageId, now: UnixMillis) -> Result<CancelOutcome, StoreError> {
        self.call(|reply| Op::Cancel { id, now, reply }).await
    }

    pub async fn reschedule(&self, id: MessageId, due: UnixMillis) -> Result<UnixMillis, StoreError> {
        self.call(|reply| Op::Reschedule { id, due, reply }).await
    }

    /// Forgets up to `limit` messages settled before `before`; returns how many.
    pub async fn purge(&self, before: UnixMillis, limit: usize) -> Result<usize, StoreError> {
        self.call(|reply| Op::Purge { before, limit, reply }).await
    }

    pub async fn get(&self, id: MessageId) -> Result<Option<ScheduledMessage>, StoreError> {
        let db = Arc::clone(&self.inner.db);
        let read = blocking(move || read_message(&db, id)).await;
        if let Err(StoreError::Corrupt(detail)) = &read {
            self.report_damage(detail);
        }
        read
    }

    /// A page of pending messages in dispatch order, read from one snapshot.
    pub async fn list_pending(&self, filter: ListFilter) -> Result<PendingPage, StoreError> {
        let db = Arc::clone(&self.inner.db);
        let read = blocking(move || list_pending(&db, &filter)).await;
        if let Err(StoreError::Corrupt(detail)) = &read {
            self.report_damage(detail);
        }
        read
    }

    /// The counters and the oldest pending message due before `now`, from
    /// one snapshot.
    pub async fn stats(&self, now: UnixMillis) -> Result<StoreStats, StoreError> {
        let db = Arc::clone(&self.inner.db);
        let read = blocking(move || read_stats(&db, now)).await;
        if let Err(StoreError::Corrupt(detail)) = &read {
            self.report_damage(detail);
        }
        read
    }

    /// The backlog cap, if one is set.
    pub fn max_pending(&self) -> Option<u64> {
        self.inner.max_pending
    }

    /// Records what became of produces, in one commit.
    pub(crate) async fn settle(&self, settles: Vec<Settle>) -> Result<(), StoreError> {
        if settles.is_empty() {
            return Ok(());
        }
        self.send(Op::Settle(settles)).await
    }

    pub(crate) async fn release(&self, ids: Vec<MessageId>) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.send(Op::Release(ids)).await
    }

    /// Whether the store takes new messages; changes as commits succeed or fail.
    pub fn health(&self) -> watch::Receiver<StoreHealth> {
        self.inner.health.clone()
    }

    /// Writes nothing but the store's own metadata, to learn whether writes
    /// succeed again after a failure.
    pub async fn probe(&self) -> Result<(), StoreError> {
        self.call(|reply| Op::Probe { reply }).await
    }

    pub(crate) fn wake(&self) -> &Wake {
        &self.inner.wake
    }

    /// Messages waiting for delivery.
    pub fn pending(&self) -> u64 {
        self.inner.pending.load(Ordering::Relaxed)
    }

    /// Messages the dispatcher holds for producing right now.
    pub fn dispatching(&self) -> usize {
        self.inner.claims.dispatching()
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Bytes on disk (SST files) plus memtables.
    pub fn size_bytes(&self) -> u64 {
        let db = &self.inner.db;
        [schema::CF_DUE, schema::CF_MESSAGES, schema::CF_CHECKPOINT]
            .iter()
            .flat_map(|name| {
                let cf = cf(db, name);
                ["rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"]
                    .map(|p| db.property_int_value_cf(cf, p).ok().flatten().unwrap_or(0))
            })
            .sum()
    }

    /// Claims what is due at `now`, starting at `from`, at most `limit`
    /// messages, reading each one's record. Blocking: call it off the runtime.
    ///
    /// Three steps, each batched: walk the due index, claim what it names
    /// under one lock, then read the records and their settlements with two
    /// MultiGets.
    pub(crate) fn take_due(
        &self,
        from: DueKey,
        now: UnixMillis,
        limit: usize,
    ) -> Result<DueBatch, StoreError> {
        let db = &self.inner.db;
        let due_cf = cf(db, schema::CF_DUE);
        let upper = DueKey::after(now);
        let mut opts = ReadOptions::default();
        // Bounds keep the seek clear of the tombstones that settled messages
        // leave behind the dispatcher's position.
        opts.set_iterate_lower_bound(from.encode());
        opts.set_iterate_upper_bound(upper.encode());
        let mut batch = DueBatch { next_from: from, ..DueBatch::default() };
        let mut entries: Vec<(DueKey, MessageId)> = Vec::new();
        let start = from.encode();
        for item in db.iterator_cf_opt(due_cf, opts, IteratorMode::From(&start, Direction::Forward)) {
            if entries.len() >= limit {
                batch.more = true;
                break;
            }
            let (k, v) = item?;
            let key = DueKey::decode(&k).ok_or_else(|| StoreError::corrupt(format!("due key {k:?}")))?;
            let id = MessageId::from_stored(&v)
                .ok_or_else(|| StoreError::corrupt(format!("due entry {key:?} names no id")))?;
            batch.next_from = key.successor();
            entries.push((key, id));
        }
        // What the writer holds is being cancelled or moved; its commit decides.
        let claimed = self.inner.claims.claim_for_dispatch_all(entries.iter().map(|(_, id)| id));
        let entries: Vec<(DueKey, MessageId)> =
            entries.into_iter().zip(claimed).filter_map(|(e, claimed)| claimed.then_some(e)).collect();
        let records = db.batched_multi_get_cf(
            cf(db, schema::CF_MESSAGES),
            entries.iter().map(|(_, id)| id.as_bytes()),
            false,
        );
        let settlement_keys: Vec<Vec<u8>> =
            entries.iter().map(|(_, id)| schema::settlement_key(id)).collect();
        let settlements = db.batched_multi_get_cf(cf(db, schema::CF_CHECKPOINT), &settlement_keys, false);
        let mut failed: Option<DueKey> = None;
        for (((key, id), record), settlement) in entries.into_iter().zip(records).zip(settlements) {
            if failed.is_some() {
                batch.stale.push(id);
                continue;
            }
            match ready(&id, key, record, settlement) {
                Ok(Some(ready)) => batch.ready.push(ready),
                Ok(None) => batch.stale.push(id),
                Err(e) => {
                    // Give the claims back and look here again in a while.
                    tracing::error!(%id, error = %e, "reading a due message failed");
                    if let StoreError::Corrupt(detail) = &e {
                        self.report_damage(detail);
                    }
                    failed = Some(key);
                    batch.stale.push(id);
                }
            }
        }
        if let Some(key) = failed {
            batch.next_from = key;
            batch.more = false;
            batch.next_due = Some(UnixMillis(now.0 + 1000));
            return Ok(batch);
        }
        if batch.more {
            return Ok(batch);
        }
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(upper.encode());
        let next = db
            .iterator_cf_opt(due_cf, opts, IteratorMode::From(&upper.encode(), Direction::Forward))
            .next()
            .transpose()?;
        batch.next_due = next.and_then(|(k, _)| DueKey::decode(&k)).map(|k| k.due);
        Ok(batch)
    }

    /// Drops the tombstones settled messages left in the due CF below `below`.
    pub fn compact_settled(&self, below: DueKey) {
        let db = &self.inner.db;
        db.compact_range_cf(cf(db, schema::CF_DUE), None::<&[u8]>, Some(&below.encode()[..]));
    }

    /// Stops the writer after it has committed everything queued. Requests
    /// made after this fail with `Closed`.
    pub async fn close(&self) {
        self.inner.closing.cancel();
        let _ = self.send(Op::Close).await;
        let handle = self.inner.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
    }
}

type Read<'a> = Result<Option<rocksdb::DBPinnableSlice<'a>>, rocksdb::Error>;

/// The message under `key` from its read record and settlement, if it is
/// still pending there.
fn ready(
    id: &MessageId,
    key: DueKey,
    record: Read<'_>,
    settlement: Read<'_>,
) -> Result<Option<Ready>, StoreError> {
    let Some(bytes) = record? else {
        return Ok(None);
    };
    let (record, settlement) = decode_stored(id, &bytes, settlement?.as_deref())?;
    if settlement.as_ref().is_some_and(Settlement::is_settled)
        || schema::dispatch_key(&record, settlement.as_ref()) != key
    {
        return Ok(None);
    }
    Ok(Some(Ready { id: id.clone(), key, record, prev: settlement.unwrap_or_default() }))
}

/// A message's record and settlement from their stored bytes.
fn decode_stored(
    id: &MessageId,
    record: &[u8],
    settlement: Option<&[u8]>,
) -> Result<(MessageRecord, Option<Settlement>), StoreError> {
    let record = schema::decode::<MessageRecord>(record)
        .map_err(|e| StoreError::corrupt(format!("message {id}: {e}")))?;
    let settlement = settlement
        .map(schema::decode::<Settlement>)
        .transpose()
        .map_err(|e| StoreError::corrupt(format!("settlement of {id}: {e}")))?;
    Ok((record, settlement))
}

pub(crate) fn read_record(
    db: &DB,
    id: &MessageId,
    opts: &ReadOptions,
) -> Result<Option<(MessageRecord, Option<Settlement>)>, StoreError> {
    let Some(bytes) = db.get_pinned_cf_opt(cf(db, schema::CF_MESSAGES), id.as_bytes(), opts)? else {
        return Ok(None);
    };
    let settlement = db.get_pinned_cf_opt(cf(db, schema::CF_CHECKPOINT), schema::settlement_key(id), opts)?;
    decode_stored(id, &bytes, settlement.as_deref()).map(Some)
}

fn read_message(db: &DB, id: MessageId) -> Result<Option<ScheduledMessage>, StoreError> {
    // One snapshot, so the record and its settlement agree.
    let snapshot = db.snapshot();
    let mut opts = ReadOptions::default();
    opts.set_snapshot(&snapshot);
    Ok(read_record(db, &id, &opts)?
        .map(|(record, settlement)| schema::scheduled_message(id, &record, settlement.as_ref())))
}

/// Upper bound on the key bytes of one listing page, so that a page of
/// large keys stays well below a client's default 4 MiB message limit.
const LIST_KEY_BYTES: usize = 1 << 20;

fn list_pending(db: &DB, filter: &ListFilter) -> Result<PendingPage, StoreError> {
    let snapshot = db.snapshot();
    let mut read = ReadOptions::default();
    read.set_snapshot(&snapshot);
    let mut opts = ReadOptions::default();
    opts.set_snapshot(&snapshot);
    opts.set_iterate_lower_bound(filter.from.encode());
    if let Some(to) = filter.to {
        opts.set_iterate_upper_bound(DueKey { due: to, seq: 0 }.encode());
    }
    let start = filter.from.encode();
    let mut page = PendingPage::default();
    let (mut examined, mut key_bytes) = (0, 0);
    for item in
        db.iterator_cf_opt(cf(db, schema::CF_DUE), opts, IteratorMode::From(&start, Direction::Forward))
    {
        let (k, v) = item?;
        let key = DueKey::decode(&k).ok_or_else(|| StoreError::corrupt(format!("due key {k:?}")))?;
        if page.messages.len() >= filter.limit || examined >= filter.examine || key_bytes >= LIST_KEY_BYTES {
            page.next = Some(key.token());
            break;
        }
        examined += 1;
        let id = MessageId::from_stored(&v)
            .ok_or_else(|| StoreError::corrupt(format!("due entry {key:?} names no id")))?;
        if let Some(message) = pending_at(db, &read, id, key)?
            && filter.topic.as_ref().is_none_or(|t| *t == message.topic)
        {
            key_bytes += message.key.as_ref().map_or(0, Vec::len);
            page.messages.push(message);
        }
    }
    Ok(page)
}

/// The message a due entry names, if it is still pending under that key.
fn pending_at(
    db: &DB,
    opts: &ReadOptions,
    id: MessageId,
    key: DueKey,
) -> Result<Option<PendingMessage>, StoreError> {
    let Some((record, settlement)) = read_record(db, &id, opts)? else {
        return Ok(None);
    };
    if settlement.as_ref().is_some_and(Settlement::is_settled)
        || schema::dispatch_key(&record, settlement.as_ref()) != key
    {
        return Ok(None);
    }
    Ok(Some(schema::pending_message(id, key, record, settlement.as_ref())))
}

fn read_stats(db: &DB, now: UnixMillis) -> Result<StoreStats, StoreError> {
    // Entries that name no pending message cannot outlive a commit; looking
    // past a few is only a guard.
    const LOOK_PAST: usize = 64;
    let snapshot = db.snapshot();
    let mut read = ReadOptions::default();
    read.set_snapshot(&snapshot);
    let meta = match db.get_pinned_cf_opt(cf(db, schema::CF_CHECKPOINT), schema::meta_key(), &read)? {
        Some(bytes) => schema::decode::<Meta>(&bytes)
            .map_err(|e| StoreError::corrupt(format!("checkpoint meta: {e}")))?,
        None => Meta::default(),
    };
    let mut opts = ReadOptions::default();
    opts.set_snapshot(&snapshot);
    opts.set_iterate_upper_bound(DueKey { due: now, seq: 0 }.encode());
    let mut oldest_overdue = None;
    for item in db.iterator_cf_opt(cf(db, schema::CF_DUE), opts, IteratorMode::Start).take(LOOK_PAST) {
        let (k, v) = item?;
        let key = DueKey::decode(&k).ok_or_else(|| StoreError::corrupt(format!("due key {k:?}")))?;
        let id = MessageId::from_stored(&v)
            .ok_or_else(|| StoreError::corrupt(format!("due entry {key:?} names no id")))?;
        if let Some(message) = pending_at(db, &read, id, key)? {
            oldest_overdue = Some(message);
            break;
        }
    }
    Ok(StoreStats { meta, oldest_overdue })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| StoreError::Io(format!("store read task: {e}")))?
}

/// Reads every entry of every column family with checksums on, until done
/// or `stop`. RocksDB checks a table file's blocks only when it reads them,
/// so without this a damaged block would surface only when a message in it
/// comes due or is asked for.
fn verify(db: &DB, stop: &CancellationToken) -> Result<(), StoreError> {
    let started = std::time::Instant::now();
    let mut entries = 0u64;
    for name in [schema::CF_DUE, schema::CF_MESSAGES, schema::CF_CHECKPOINT] {
        let mut opts = ReadOptions::default();
        opts.set_verify_checksums(true);
        opts.fill_cache(false);
        opts.set_readahead_size(2 << 20);
        for item in db.iterator_cf_opt(cf(db, name), opts, IteratorMode::Start) {
            item.map_err(|e| match StoreError::from(e) {
                StoreError::Corrupt(detail) => StoreError::Corrupt(format!("column family {name}: {detail}")),
                other => other,
            })?;
            entries += 1;
            if entries % 4096 == 0 && stop.is_cancelled() {
                return Ok(());
            }
        }
    }
    tracing::info!(entries, elapsed = ?started.elapsed(), "store checksums verified");
    Ok(())
}

/// Damage stops hourglass: serving from the store would go on without the
/// records past the damage.
fn damage_report(detail: &str, path: &Path) -> String {
    format!(
        "{detail}; hourglass will not run on a damaged store, because it would go on without the records \
         past the damage. Restore {path} from a backup, or move it aside to start with an empty store (the \
         messages parked in it are then lost)",
        path = path.display()
    )
}

/// Opens the database with the store's options and no writer: what
/// `hourglass bench` measures RocksDB's own limit on.
pub(crate) fn open_raw(config: &StoreConfig) -> Result<DB, StoreError> {
    open_db(config)
}

fn open_db(config: &StoreConfig) -> Result<DB, StoreError> {
    let cache = Cache::new_lru_cache(config.cache_bytes);
    let table = |bloom: bool| {
        let mut t = BlockBasedOptions::default();
        t.set_block_cache(&cache);
        t.set_cache_index_and_filter_blocks(true);
        if bloom {
            t.set_bloom_filter(10.0, false);
        }
        t
    };
    let mut db_opts = Options::default();
    db_opts.create_if_missing(true);
    db_opts.create_missing_column_families(true);
    // A torn record at the WAL's tail was never acknowledged (acks wait for
    // the write); corruption anywhere else stops the open instead of
    // silently dropping what follows it.
    db_opts.set_wal_recovery_mode(DBRecoveryMode::TolerateCorruptedTailRecords);
    db_opts.set_paranoid_checks(true);
    db_opts.set_db_write_buffer_size(config.write_buffer_bytes);
    db_opts.set_max_background_jobs(2);
    db_opts.set_bytes_per_sync(1 << 20);
    db_opts.set_keep_log_file_num(4);
    db_opts.set_max_total_wal_size(256 << 20);

    let mut due = Options::default();
    due.set_block_based_table_factory(&table(false));
    // The due CF is a queue: its head fills with tombstones. Compact files
    // dense with deletions so later seeks do not wade through them.
    due.add_compact_on_deletion_collector_factory(64 * 1024, 16 * 1024, 0.5);
    let mut messages = Options::default();
    messages.set_block_based_table_factory(&table(true));
    messages.add_compact_on_deletion_collector_factory(64 * 1024, 16 * 1024, 0.5);
    let mut checkpoint = Options::default();
    checkpoint.set_block_based_table_factory(&table(true));

    let cfs = vec![
        ColumnFamilyDescriptor::new(schema::CF_DUE, due),
        ColumnFamilyDescriptor::new(schema::CF_MESSAGES, messages),
        ColumnFamilyDescriptor::new(schema::CF_CHECKPOINT, checkpoint),
    ];
    Ok(DB::open_cf_descriptors(&db_opts, &config.path, cfs)?)
}

#[cfg(test)]
mod tests {
    //! The store's dispatch cycle against a real RocksDB: take what is due,
    //! settle it, and what each outcome leaves behind.

    use super::*;
    use crate::message::{DueSpec, Envelope, State};

    fn open(dir: &Path) -> Store {
        let mut config = StoreConfig::new(dir);
        config.sync_writes = false;
        Store::open(&config).unwrap()
    }

    async fn park(store: &Store, id: &str, due: u64) -> MessageId {
        let envelope = Envelope {
            topic: "t".into(),
            key: None,
            value: id.as_bytes().to_vec(),
            headers: vec![],
            partition: None,
        };
        let msg = NewMessage {
            id: Some(MessageId::parse(id).unwrap()),
            envelope,
            requested: DueSpec::At(UnixMillis(due)),
            due: UnixMillis(due),
            now: UnixMillis(0),
        };
        store.schedule(msg).await.unwrap().id
    }

    /// Every op queued before this one has been committed when it returns.
    async fn barrier(store: &Store) {
        store.purge(UnixMillis(0), 1).await.unwrap();
    }

    fn settle(ready: &Ready, outcome: Outcome) -> Settle {
        Settle {
            id: ready.id.clone(),
            key: ready.key,
            due: ready.record.due(),
            prev: ready.prev.clone(),
            outcome,
        }
    }

    async fn state(store: &Store, id: &MessageId) -> State {
        store.get(id.clone()).await.unwrap().unwrap().state
    }

    #[tokio::test]
    async fn take_due_takes_in_due_order_up_to_the_limit_and_only_what_is_due() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        for (id, due) in [("c", 30), ("a", 10), ("b", 20), ("later", 1_000)] {
            park(&store, id, due).await;
        }
        let batch = store.take_due(DueKey::MIN, UnixMillis(100), 2).unwrap();
        let ids: Vec<&str> = batch.ready.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert!(batch.more, "more is due than the limit allowed");
        let rest = store.take_due(batch.next_from, UnixMillis(100), 10).unwrap();
        assert_eq!(rest.ready.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["c"]);
        assert!(!rest.more);
        assert_eq!(rest.next_due, Some(UnixMillis(1_000)), "and when the next one is due");
        assert_eq!(store.dispatching(), 3, "what was taken is claimed");
        store.close().await;
    }

    #[tokio::test]
    async fn take_due_skips_what_the_writer_holds() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = park(&store, "a", 10).await;
        park(&store, "b", 20).await;
        assert!(store.inner.claims.reserve_for_writer(&a));
        let batch = store.take_due(DueKey::MIN, UnixMillis(100), 10).unwrap();
        assert_eq!(batch.ready.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["b"]);
        store.inner.claims.release(&a);
        store.close().await;
    }

    #[tokio::test]
    async fn retries_carry_their_tries_until_delivered_or_failed() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let ok = park(&store, "ok", 10).await;
        let bad = park(&store, "bad", 10).await;
        let batch = store.take_due(DueKey::MIN, UnixMillis(10), 10).unwrap();
        let retry =
            |at| Outcome::Retry { retry_at: UnixMillis(at), error: "broker down".into(), rejected: false };
        let settles = batch.ready.iter().map(|r| settle(r, retry(50))).collect();
        store.settle(settles).await.unwrap();
        barrier(&store).await;
        assert_eq!(
            state(&store, &ok).await,
            State::Pending { attempts: 1, last_error: Some("broker down".into()) }
        );
        assert_eq!(store.dispatching(), 0, "settling gives the claims back");
        assert!(
            store.take_due(DueKey::MIN, UnixMillis(49), 10).unwrap().ready.is_empty(),
            "not before the retry time"
        );

        let batch = store.take_due(DueKey::MIN, UnixMillis(50), 10).unwrap();
        assert_eq!(batch.ready.len(), 2, "both come back at their retry time");
        assert!(batch.ready.iter().all(|r| r.prev.attempts == 1), "with the tries so far");
        let settles = batch
            .ready
            .iter()
            .map(|r| {
                if r.id == ok {
                    settle(r, Outcome::Delivered { partition: 3, offset: 42, at: UnixMillis(51) })
                } else {
                    settle(r, Outcome::Failed { at: UnixMillis(51), error: "topic deleted".into() })
                }
            })
            .collect();
        store.settle(settles).await.unwrap();
        barrier(&store).await;
        match state(&store, &ok).await {
            State::Delivered(d) => {
                assert_eq!((d.partition, d.offset, d.delivered_at), (3, 42, UnixMillis(51)))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            state(&store, &bad).await,
            State::Failed { reason: "topic deleted".into(), attempts: 2, at: UnixMillis(51) }
        );
        assert_eq!(store.pending(), 0);
        assert!(
            store.take_due(DueKey::MIN, UnixMillis(10_000), 10).unwrap().ready.is_empty(),
            "nothing left to send"
        );
        store.close().await;
    }

    fn filter(from: DueKey, limit: usize, examine: usize) -> ListFilter {
        ListFilter { topic: None, from, to: None, limit, examine }
    }

    #[tokio::test]
    async fn listing_pages_through_pending_messages_in_dispatch_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        for (id, due) in [("c", 30), ("a", 10), ("b", 20), ("d", 40)] {
            park(&store, id, due).await;
        }
        let ids = |page: &PendingPage| page.messages.iter().map(|m| m.id.to_string()).collect::<Vec<_>>();
        let first = store.list_pending(filter(DueKey::MIN, 2, 100)).await.unwrap();
        assert_eq!(ids(&first), ["a", "b"]);
        let next = DueKey::from_token(first.next.expect("more to come"));
        let second = store.list_pending(filter(next, 2, 100)).await.unwrap();
        assert_eq!(ids(&second), ["c", "d"]);
        assert_eq!(second.next, None, "the end");

        let until_30 = ListFilter { to: Some(UnixMillis(30)), ..filter(DueKey::MIN, 10, 100) };
        assert_eq!(ids(&store.list_pending(until_30).await.unwrap()), ["a", "b"], "due_to is exclusive");

        // A filter that matches nothing stops after `examine` entries and
        // says where to go on.
        let other_topic = ListFilter { topic: Some("other".into()), ..filter(DueKey::MIN, 10, 3) };
        let page = store.list_pending(other_topic.clone()).await.unwrap();
        assert!(page.messages.is_empty());
        let next = DueKey::from_token(page.next.expect("not done"));
        assert_eq!(next.due, UnixMillis(40), "three looked at, the fourth is next");
        let page = store.list_pending(ListFilter { from: next, ..other_topic }).await.unwrap();
        assert_eq!((page.messages.len(), page.next), (0, None));
        store.close().await;
    }

    #[tokio::test]
    async fn listing_and_stats_see_retries_and_settlements() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let retried = park(&store, "retried", 10).await;
        park(&store, "delivered", 20).await;
        let cancelled = park(&store, "cancelled", 30).await;
        park(&store, "failed", 40).await;
        let batch = store.take_due(DueKey::MIN, UnixMillis(40), 10).unwrap();
        let settles = batch
            .ready
            .iter()
            .filter_map(|r| match r.id.as_str() {
                "retried" => Some(settle(
                    r,
                    Outcome::Retry {
                        retry_at: UnixMillis(500),
                        error: "broker down".into(),
                        rejected: false,
                    },
                )),
                "delivered" => {
                    Some(settle(r, Outcome::Delivered { partition: 0, offset: 1, at: UnixMillis(41) }))
                }
                "failed" => {
                    Some(settle(r, Outcome::Failed { at: UnixMillis(41), error: "too large".into() }))
                }
                _ => None,
            })
            .collect();
        store.release(vec![cancelled.clone()]).await.unwrap();
        store.settle(settles).await.unwrap();
        barrier(&store).await;
        assert_eq!(store.cancel(cancelled, UnixMillis(42)).await.unwrap(), CancelOutcome::Cancelled);

        let page = store.list_pending(filter(DueKey::MIN, 10, 100)).await.unwrap();
        assert_eq!(page.messages.len(), 1, "only what is pending: {page:?}");
        let m = &page.messages[0];
        assert_eq!(m.id, retried);
        assert_eq!((m.due, m.dispatch_at, m.attempts), (UnixMillis(10), UnixMillis(500), 1));
        assert_eq!(m.last_error.as_deref(), Some("broker down"));

        let stats = store.stats(UnixMillis(1_000)).await.unwrap();
        let meta = &stats.meta;
        assert_eq!(
            (meta.pending, meta.delivered_total, meta.cancelled_total, meta.failed_total),
            (1, 1, 1, 1)
        );
        assert_eq!(stats.oldest_overdue.map(|m| m.id), Some(retried.clone()));
        assert!(
            store.stats(UnixMillis(500)).await.unwrap().oldest_overdue.is_none(),
            "due at 500 is not overdue at 500"
        );

        let failed = MessageId::parse("failed").unwrap();
        store.reschedule(failed, UnixMillis(2_000)).await.unwrap();
        let meta = store.stats(UnixMillis(1_000)).await.unwrap().meta;
        assert_eq!((meta.pending, meta.failed_total), (2, 0), "a re-driven failure is pending again");
        store.close().await;
    }
}
