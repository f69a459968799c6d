//! The store: where messages are parked until due, and where the dispatcher
//! records what it delivered. One RocksDB with three column families (see
//! [`schema`]).
//!
//! A narrow interface: the service calls `schedule`, `cancel`, `reschedule`
//! and `get`, and `list_pending` and `stats` for operators, each with the
//! caller's [`Scope`]; the dispatcher calls `take_due`, `take_listed` and
//! `settle` ([`scan`]). Every change goes through the single [`writer`]
//! thread as one atomic `WriteBatch`; reads ([`read`]) go straight to
//! RocksDB from a blocking thread. Nothing here knows about gRPC or Kafka.

mod claims;
mod health;
mod read;
mod scan;
pub mod schema;
mod writer;

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBRecoveryMode, ErrorKind, IteratorMode, Options,
    ReadOptions,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use claims::Claims;
pub(crate) use claims::Wake;
use health::HealthBoard;
pub use health::StoreHealth;
pub use read::{ListFilter, StoreStats};
pub(crate) use scan::{DueBatch, Ready};
use schema::DueKey;
pub use writer::NewMessage;
pub(crate) use writer::cf;
use writer::{Op, Shared, Writer, WriterConfig};
pub(crate) use writer::{Outcome, Settle};

use crate::message::{CancelOutcome, MessageId, PendingPage, Scheduled, ScheduledMessage, Scope, UnixMillis};

#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no message with id {0}")]
    NotFound(MessageId),
    #[error("id {0} is already taken by a different message")]
    IdConflict(MessageId),
    #[error("message {0} was already delivered")]
    AlreadyDelivered(MessageId),
    #[error("message {0} was cancelled")]
    AlreadyCancelled(MessageId),
    #[error(
        "message {0} is being produced to Kafka and Kafka has not confirmed it yet, so it is not known \
         whether it is on its topic; retry: the answer then says so"
    )]
    Dispatching(MessageId),
    #[error(
        "the token {token:?} may not use topic {topic:?}; the tokens file (--auth-tokens) lists its topics"
    )]
    Forbidden { token: String, topic: String },
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

impl From<rocksdb::Error> for StoreError {
    fn from(e: rocksdb::Error) -> Self {
        match e.kind() {
            ErrorKind::Corruption => StoreError::Corrupt(e.into_string()),
            // RocksDB reports a full disk as an I/O error whose text names it.
            ErrorKind::IOError if e.as_ref().contains("No space left") => StoreError::Full(e.into_string()),
            _ => StoreError::Io(e.into_string()),
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

/// Due entries `stats` looks at for the oldest overdue message a caller
/// sees, at most: one caller's messages may lie behind many of others'.
const STATS_EXAMINE: usize = 10_000;

/// How often parked requests are checked for having waited too long.
const TICK: Duration = Duration::from_millis(500);

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
    health: Arc<HealthBoard>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    path: PathBuf,
    /// Cancelled when damage is found; `damage` says what and where.
    damaged: CancellationToken,
    damage: Mutex<Option<String>>,
    /// Cancelled by `close`: background reads stop.
    closing: CancellationToken,
    max_pending: Option<u64>,
    /// Where the next purge reads the retention index from: past the
    /// tombstones earlier purges left.
    purge_from: Mutex<Vec<u8>>,
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
        let (ops, rx) = mpsc::channel(16 * 1024);
        let shared = Shared {
            db: Arc::clone(&db),
            claims: Arc::new(Claims::default()),
            wake: Arc::new(Wake::default()),
            pending: Arc::new(AtomicU64::new(0)),
            health: Arc::new(HealthBoard::new()),
        };
        let (claims, wake, pending, health) = (
            Arc::clone(&shared.claims),
            Arc::clone(&shared.wake),
            Arc::clone(&shared.pending),
            Arc::clone(&shared.health),
        );
        let writer_config =
            WriterConfig { sync: config.sync_writes, max_pending: config.max_pending, max_round: 4096 };
        let writer =
            Writer::open(shared, writer_config, rx, crate::clock::Clock::now(&crate::clock::SystemClock))
                .map_err(|e| match e {
                    StoreError::Corrupt(detail) => StoreError::Corrupt(damage_report(&detail, &config.path)),
                    other => other,
                })?;
        crate::metrics::PENDING.set(pending.load(Ordering::Relaxed) as i64);
        let handle = std::thread::Builder::new()
            .name("hourglass-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| StoreError::Io(format!("starting the writer thread: {e}")))?;
        let ticks = ops.downgrade();
        std::thread::Builder::new()
            .name("hourglass-tick".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(TICK);
                    match ticks.upgrade() {
                        Some(ops) if ops.try_send(Op::Tick).is_ok() || !ops.is_closed() => {}
                        _ => return,
                    }
                }
            })
            .map_err(|e| StoreError::Io(format!("starting the writer's clock: {e}")))?;
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
                purge_from: Mutex::new(schema::retention_range_before(UnixMillis(0)).0),
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

    /// Runs `read` on a blocking thread; damage it finds is reported.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&DB) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = Arc::clone(&self.inner.db);
        let result = tokio::task::spawn_blocking(move || read(&db))
            .await
            .map_err(|e| StoreError::Io(format!("store read task: {e}")))?;
        if let Err(StoreError::Corrupt(detail)) = &result {
            self.report_damage(detail);
        }
        result
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

    /// Cancels the message `id` names for `scope`; the check and the change
    /// are one step of the writer.
    pub async fn cancel(
        &self,
        scope: Scope,
        id: MessageId,
        now: UnixMillis,
    ) -> Result<CancelOutcome, StoreError> {
        self.call(|reply| Op::Cancel { scope, id, now, reply }).await
    }

    pub async fn reschedule(
        &self,
        scope: Scope,
        id: MessageId,
        due: UnixMillis,
    ) -> Result<UnixMillis, StoreError> {
        self.call(|reply| Op::Reschedule { scope, id, due, reply }).await
    }

    /// Forgets up to `limit` messages settled before `before`; returns how
    /// many entries of the retention index it looked at. The index is read
    /// here, from where the last purge stopped; the writer only deletes.
    pub async fn purge(&self, before: UnixMillis, limit: usize) -> Result<usize, StoreError> {
        let from = self.inner.purge_from.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let candidates = self.read(move |db| read::purge_candidates(db, &from, before, limit)).await?;
        let Some((last, _, _)) = candidates.last() else { return Ok(0) };
        let next = schema::retention_successor(last);
        let looked_at = candidates.len();
        self.call(|reply| Op::Purge { candidates, reply }).await?;
        *self.inner.purge_from.lock().unwrap_or_else(|e| e.into_inner()) = next;
        Ok(looked_at)
    }

    /// The message `id` names for `scope`.
    pub async fn get(&self, scope: Scope, id: MessageId) -> Result<Option<ScheduledMessage>, StoreError> {
        self.read(move |db| read::message(db, &scope, id)).await
    }

    /// A page of the pending messages `scope` sees, in dispatch order, read
    /// from one snapshot. It starts no lower than the first entry that may
    /// still be pending.
    pub async fn list_pending(
        &self,
        scope: Scope,
        mut filter: ListFilter,
    ) -> Result<PendingPage, StoreError> {
        filter.from = filter.from.max(self.inner.wake.low_water());
        self.read(move |db| read::list_pending(db, &scope, &filter)).await
    }

    /// The counts `scope` sees and its oldest pending message due before
    /// `now`, from one snapshot.
    pub async fn stats(&self, scope: Scope, now: UnixMillis) -> Result<StoreStats, StoreError> {
        let from = self.inner.wake.low_water();
        self.read(move |db| read::stats(db, &scope, now, from, STATS_EXAMINE)).await
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

    /// The dispatcher gives back claims it took and did not produce (stale
    /// entries, messages of held topics): at once, so that its next look
    /// can claim them again; requests that waited on them then run.
    pub(crate) async fn release(&self, ids: Vec<MessageId>) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.inner.claims.release_dispatched(&ids);
        self.send(Op::Unpark(ids)).await
    }

    /// Produces whose outcome will not be known: see [`Op::InDoubt`].
    pub(crate) async fn in_doubt(&self, ids: Vec<MessageId>) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.send(Op::InDoubt(ids)).await
    }

    /// Whether the store takes new messages; changes as commits succeed or
    /// fail and as due messages can or cannot be read.
    pub fn health(&self) -> watch::Receiver<StoreHealth> {
        self.inner.health.subscribe()
    }

    /// Whether the store's writes fail now.
    pub(crate) fn writes_failing(&self) -> bool {
        self.inner.health.writes_failing()
    }

    /// A due message could not be read (`Some`), or could again (`None`).
    pub(crate) fn report_reads(&self, failure: Option<String>) {
        self.inner.health.set_reads(failure);
    }

    /// Writes nothing but the store's own metadata, to learn whether writes
    /// succeed again after a failure. Every change queued before it is
    /// committed when it returns.
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
    pub async fn size_bytes(&self) -> u64 {
        self.read(|db| Ok(size_bytes(db))).await.unwrap_or(0)
    }

    /// Drops the tombstones settled messages left in the due CF below `below`.
    pub async fn compact_settled(&self, below: DueKey) {
        let _ = self
            .read(move |db| {
                db.compact_range_cf(cf(db, schema::CF_DUE), None::<&[u8]>, Some(&below.encode()[..]));
                Ok(())
            })
            .await;
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
            scope: Scope::everything(),
            envelope,
            requested: DueSpec::At(UnixMillis(due)),
            due: UnixMillis(due),
            now: UnixMillis(0),
        };
        store.schedule(msg).await.unwrap().id
    }

    /// Every op queued before this one has been committed when it returns.
    async fn barrier(store: &Store) {
        store.probe().await.unwrap();
    }

    fn settle(ready: &Ready, at: u64, outcome: Outcome) -> Settle {
        Settle {
            id: ready.id.clone(),
            key: ready.key,
            due: ready.record.due(),
            topic: ready.record.topic.as_str().into(),
            prev: ready.prev.clone(),
            at: UnixMillis(at),
            outcome,
        }
    }

    async fn state(store: &Store, id: &MessageId) -> State {
        store.get(Scope::everything(), id.clone()).await.unwrap().unwrap().state
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
        assert_eq!(
            batch.contended,
            [(DueKey { due: UnixMillis(10), seq: 0 }, a.clone())],
            "to look at again"
        );
        store.inner.claims.release(&a);
        let again = store.take_listed(batch.contended);
        assert_eq!(
            again.ready.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["a"],
            "once the writer let go"
        );
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
            |at| Outcome::Retry { retry_at: UnixMillis(at), error: "broker down".into(), refused: false };
        let settles = batch.ready.iter().map(|r| settle(r, 10, retry(50))).collect();
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
                    settle(r, 51, Outcome::Delivered { partition: 3, offset: 42 })
                } else {
                    settle(r, 51, Outcome::Failed { error: "topic deleted".into(), tried: true })
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
        let list = |filter| store.list_pending(Scope::everything(), filter);
        let first = list(filter(DueKey::MIN, 2, 100)).await.unwrap();
        assert_eq!(ids(&first), ["a", "b"]);
        let next = DueKey::from_token(first.next.expect("more to come"));
        let second = list(filter(next, 2, 100)).await.unwrap();
        assert_eq!(ids(&second), ["c", "d"]);
        assert_eq!(second.next, None, "the end");

        let until_30 = ListFilter { to: Some(UnixMillis(30)), ..filter(DueKey::MIN, 10, 100) };
        assert_eq!(ids(&list(until_30).await.unwrap()), ["a", "b"], "due_to is exclusive");

        // A filter that matches nothing stops after `examine` entries and
        // says where to go on.
        let other_topic = ListFilter { topic: Some("other".into()), ..filter(DueKey::MIN, 10, 3) };
        let page = list(other_topic.clone()).await.unwrap();
        assert!(page.messages.is_empty());
        let next = DueKey::from_token(page.next.expect("not done"));
        assert_eq!(next.due, UnixMillis(40), "three looked at, the fourth is next");
        let page = list(ListFilter { from: next, ..other_topic }).await.unwrap();
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
                    40,
                    Outcome::Retry { retry_at: UnixMillis(500), error: "broker down".into(), refused: false },
                )),
                "delivered" => Some(settle(r, 41, Outcome::Delivered { partition: 0, offset: 1 })),
                "failed" => Some(settle(r, 41, Outcome::Failed { error: "too large".into(), tried: true })),
                _ => None,
            })
            .collect();
        store.release(vec![cancelled.clone()]).await.unwrap();
        store.settle(settles).await.unwrap();
        barrier(&store).await;
        assert_eq!(
            store.cancel(Scope::everything(), cancelled, UnixMillis(42)).await.unwrap(),
            CancelOutcome::Cancelled
        );

        let page = store.list_pending(Scope::everything(), filter(DueKey::MIN, 10, 100)).await.unwrap();
        assert_eq!(page.messages.len(), 1, "only what is pending: {page:?}");
        let m = &page.messages[0];
        assert_eq!(m.id, retried);
        assert_eq!((m.due, m.dispatch_at, m.attempts), (UnixMillis(10), UnixMillis(500), 1));
        assert_eq!(m.last_error.as_deref(), Some("broker down"));

        let stats = store.stats(Scope::everything(), UnixMillis(1_000)).await.unwrap();
        let meta = &stats.meta;
        assert_eq!(
            (meta.pending, meta.delivered_total, meta.cancelled_total, meta.failed_total),
            (1, 1, 1, 1)
        );
        assert_eq!(stats.oldest_overdue.map(|m| m.id), Some(retried.clone()));
        assert!(
            store.stats(Scope::everything(), UnixMillis(500)).await.unwrap().oldest_overdue.is_none(),
            "due at 500 is not overdue at 500"
        );

        let failed = MessageId::parse("failed").unwrap();
        store.reschedule(Scope::everything(), failed, UnixMillis(2_000)).await.unwrap();
        let meta = store.stats(Scope::everything(), UnixMillis(1_000)).await.unwrap().meta;
        assert_eq!((meta.pending, meta.failed_total), (2, 0), "a re-driven failure is pending again");
        store.close().await;
    }
}

#[cfg(test)]
mod tombstones {
    //! Reads of the due index and the retention index at a scale where the
    //! tombstones of settled messages matter: each counted with RocksDB's
    //! perf counters (deleted entries an iterator stepped over), beside what
    //! the same read from the start of the index costs.

    use rocksdb::perf::{PerfContext, PerfMetric, PerfStatsLevel, set_perf_stats};

    use super::*;
    use crate::message::{DueSpec, Envelope};

    const SETTLED: u64 = 20_000;

    /// Tombstones stepped over by `read`, run on this thread.
    fn skipped<T>(read: impl FnOnce() -> T) -> (T, u64) {
        set_perf_stats(PerfStatsLevel::EnableCount);
        let mut context = PerfContext::default();
        context.reset();
        let out = read();
        (out, context.metric(PerfMetric::InternalDeleteSkippedCount))
    }

    fn message(id: &str, due: u64) -> NewMessage {
        NewMessage {
            id: Some(MessageId::parse(id).unwrap()),
            scope: Scope::everything(),
            envelope: Envelope {
                topic: "t".into(),
                key: None,
                value: b"v".to_vec(),
                headers: vec![],
                partition: None,
            },
            requested: DueSpec::At(UnixMillis(due)),
            due: UnixMillis(due),
            now: UnixMillis(0),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_start_where_live_entries_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = StoreConfig::new(dir.path());
        config.sync_writes = false;
        let store = Store::open(&config).unwrap();
        // SETTLED messages parked, produced and delivered: their due
        // entries are tombstones now, and so will their retention entries
        // be once purged.
        for chunk in (1..=SETTLED).collect::<Vec<_>>().chunks(5_000) {
            let msgs = chunk.iter().map(|i| message(&format!("m{i}"), *i)).collect();
            store.schedule_batch(msgs).await.unwrap();
        }
        let mut from = DueKey::MIN;
        loop {
            let batch = store.take_due(from, UnixMillis(SETTLED), 4_096).unwrap();
            from = batch.next_from;
            let settles = batch
                .ready
                .iter()
                .map(|r| Settle {
                    id: r.id.clone(),
                    key: r.key,
                    due: r.record.due(),
                    topic: "t".into(),
                    prev: r.prev.clone(),
                    at: UnixMillis(SETTLED + 1),
                    outcome: Outcome::Delivered { partition: 0, offset: 0 },
                })
                .collect();
            store.settle(settles).await.unwrap();
            if !batch.more {
                break;
            }
        }
        store.probe().await.unwrap();
        // What the dispatcher publishes once it has read past them.
        store.wake().set_low_water(from);
        let live = MessageId::parse("live").unwrap();
        store.schedule(message("live", SETTLED + 100)).await.unwrap();
        let db = Arc::clone(&store.inner.db);
        let now = UnixMillis(SETTLED + 1_000);

        // Stats: the oldest overdue message.
        let ((stats, from_start), cost) = skipped(|| {
            let low = store.wake().low_water();
            let stats = read::stats(&db, &Scope::everything(), now, low, STATS_EXAMINE).unwrap();
            (stats, read::stats(&db, &Scope::everything(), now, DueKey::MIN, STATS_EXAMINE).unwrap())
        });
        let (_, new_cost) =
            skipped(|| read::stats(&db, &Scope::everything(), now, store.wake().low_water(), 64));
        assert_eq!(stats.oldest_overdue.map(|m| m.id), Some(live.clone()));
        assert_eq!(from_start.oldest_overdue.map(|m| m.id), Some(live.clone()), "the same answer");
        assert!(cost >= SETTLED, "the scale matters: {cost} tombstones from the start");
        assert!(new_cost < 100, "Stats stepped over {new_cost} tombstones");

        // List: a client's first page starts at the live entries.
        let filter = ListFilter { topic: None, from: DueKey::MIN, to: None, limit: 10, examine: 1_000 };
        let start = filter.from.max(store.wake().low_water());
        let (page, cost) =
            skipped(|| read::list_pending(&db, &Scope::everything(), &ListFilter { from: start, ..filter }));
        assert_eq!(page.unwrap().messages.len(), 1);
        assert!(cost < 100, "List stepped over {cost} tombstones");

        // A message scheduled behind the dispatcher's position (past due):
        // handed over by the writer and read by itself, not by rescanning.
        store.take_due(from, now, 10).unwrap();
        store.inner.claims.release_dispatched(std::slice::from_ref(&live));
        store.schedule(message("late", 5)).await.unwrap();
        let late = store.wake().take();
        assert_eq!(late.entries.iter().map(|(_, id)| id.as_str()).collect::<Vec<_>>(), ["late"]);
        let (batch, cost) = skipped(|| store.take_listed(late.entries));
        assert_eq!(batch.ready.len(), 1);
        assert!(cost < 10, "reading the late message stepped over {cost} tombstones");
        let (_, rescan) = skipped(|| store.take_due(DueKey { due: UnixMillis(5), seq: 0 }, now, 10).unwrap());
        assert!(rescan >= SETTLED - 10, "rescanning from it would step over all of them: {rescan}");

        // Purge: the second pass starts where the first stopped.
        let purged = store.purge(UnixMillis(SETTLED + 2), SETTLED as usize + 10).await.unwrap();
        assert_eq!(purged as u64, SETTLED);
        let cursor = store.inner.purge_from.lock().unwrap().clone();
        let ((), cost) = skipped(|| {
            read::purge_candidates(&db, &cursor, UnixMillis(SETTLED + 2), 100).unwrap();
        });
        let (_, from_start) = skipped(|| {
            let start = schema::retention_range_before(UnixMillis(0)).0;
            read::purge_candidates(&db, &start, UnixMillis(SETTLED + 2), 100).unwrap()
        });
        assert!(from_start >= SETTLED, "from the start, a purge steps over every purged entry: {from_start}");
        assert!(cost < 10, "the next purge stepped over {cost} tombstones");
        store.close().await;
    }
}
