//! The store: where messages are parked until due, and where the dispatcher
//! records what it delivered. One RocksDB with three column families (see
//! [`schema`]).
//!
//! A narrow, async interface; every call that reads or changes a client's
//! message takes the caller's [`Scope`](crate::message::Scope):
//!
//! - changes ([`writer`]): `schedule`, `schedule_batch`, `cancel`,
//!   `reschedule`, `purge`, and the dispatcher's `settle`, `release`,
//!   `in_doubt`. Each goes to the single writer thread, which commits it
//!   with whatever else is queued as one atomic `WriteBatch`;
//! - reads ([`read`]): `get`, `list_pending`, `stats`, `forecast`, the
//!   tables' rows, from a blocking thread straight to RocksDB, through a
//!   [`Reader`]: what a shard's readers hold, which changes nothing;
//! - the dispatcher's scan ([`scan`]): `take_due`, `take_listed`.
//!
//! This file is the handle those share, with its health and damage;
//! [`open`] opens and closes it, [`options`] tunes RocksDB, [`verify`]
//! reads it whole for damage, [`schema`] lays out the bytes and [`view`]
//! says what they mean. Nothing here knows about gRPC or Kafka.

mod backup;
mod bare;
mod browse;
mod claims;
mod error;
mod health;
mod held;
mod open;
mod options;
mod policy;
mod read;
mod rows;
mod runs;
mod scan;
mod schema;
mod series;
mod shed;
mod verify;
mod view;
mod writer;

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
};

use rocksdb::DB;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

pub(crate) use backup::IN_FLIGHT_FILE;
pub use bare::BareWrites;
use claims::Claims;
pub(crate) use claims::{Floor, Wake};
pub use error::StoreError;
use health::HealthBoard;
pub use health::StoreHealth;
pub use held::HeldTopics;
pub use options::{Durability, ShardOf, StoreConfig, open_db};
pub use read::{FORECAST_EXAMINE, LIST_KEY_BYTES, ListFilter, Reader, StoreMemory, StorePage, StoreStats};
use writer::Op;
pub use writer::{Decided, Decision, Hold, Proposed};
pub(crate) use writer::{Local, LogEntry, Replica, SettledLine};

use crate::metrics::ShardMetrics;

/// A handle on one store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<DB>,
    cache: BlockCache,
    ops: mpsc::Sender<Op>,
    claims: Arc<Claims>,
    wake: Arc<Wake>,
    held: HeldTopics,
    backlog: Backlog,
    /// Cluster mode: how far the store has applied the schedule log.
    log: LogPosition,
    health: Arc<HealthBoard>,
    metrics: ShardMetrics,
    threads: Threads,
    lifecycle: Lifecycle,
    opened: Opened,
    upkeep: Upkeep,
    /// The dispatch policies, as of the last commit that changed them.
    policies: Arc<watch::Sender<Arc<crate::policy::Table>>>,
}

/// What the upkeep's purges and passes keep from one to the next.
struct Upkeep {
    purge: PurgeCursors,
    /// What delivered messages shed, and below where.
    shed: shed::Shed,
}

/// The block cache the store's column families share, and its size while
/// the store is in use.
struct BlockCache {
    cache: rocksdb::Cache,
    bytes: usize,
}

/// How many messages are pending, and how many may be.
struct Backlog {
    pending: Arc<AtomicU64>,
    cap: Option<u64>,
}

/// Cluster mode: the next offset of the schedule log to apply, and the
/// node incarnation the log names the shard's owner (0: none).
struct LogPosition {
    next: Arc<AtomicI64>,
    owner: Arc<AtomicU64>,
    /// The log's time of the last record of the nodes applied.
    time: Arc<AtomicU64>,
}

/// The store's own threads, joined at `close`.
struct Threads {
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The writer's clock, and what stops it.
    tick: Mutex<Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)>>,
    /// The thread reading the store's checksums after it opened, if any.
    verifier: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Damage found, and the store's closing.
struct Lifecycle {
    /// Cancelled when damage is found, or the writer stopped; `damage`
    /// says what and where. Either way the store takes no more changes.
    damaged: CancellationToken,
    damage: Arc<Mutex<Option<String>>>,
    /// Cancelled by `close`: background reads stop.
    closing: CancellationToken,
}

/// What the store was found to hold when it was opened.
struct Opened {
    /// Where.
    path: PathBuf,
    recorded_shard: ShardOf,
    /// What may have been produced and not recorded before the store was
    /// opened: none if it was closed cleanly.
    in_doubt: Option<crate::command::InDoubt>,
    /// When it was opened.
    at: std::time::Instant,
    /// The dispatch horizon recorded at the open.
    horizon: crate::command::DispatchKey,
    /// Cluster mode: the log's time of the last record applied, as opened.
    log_time: crate::message::UnixMillis,
}

/// Where the next purges start.
struct PurgeCursors {
    /// Where the next purge reads the retention index from: past the
    /// tombstones earlier purges left.
    retention: Mutex<Vec<u8>>,
    /// Where the next purge of delivery logs starts.
    logs: Mutex<Vec<u8>>,
    /// Cluster mode: where the next look for expired log chunks starts
    /// (empty: the first).
    chunks: Mutex<Vec<u8>>,
}

impl Store {
    /// Cancelled once damage is found in the store (at start-up by the
    /// verifier, or by any read since): the server stops rather than go on
    /// without the records past the damage.
    pub fn damaged(&self) -> CancellationToken {
        self.inner.lifecycle.damaged.clone()
    }

    /// What damage was found, and what to do about it.
    pub fn damage(&self) -> Option<String> {
        self.inner.lifecycle.damage.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn report_damage(&self, detail: &str) {
        self.stop_with(|| {
            let path = self.inner.opened.path.display();
            format!(
                "the store in {path} is corrupt: {}",
                verify::damage_report(detail, &self.inner.opened.path)
            )
        });
    }

    /// Stops the store as damage does ([`Self::damaged`]), for a reason of
    /// its owner's: `why` says what happened and what to do. The first
    /// reason given is kept.
    pub(crate) fn stop_for(&self, why: String) {
        self.stop_with(|| why);
    }

    fn stop_with(&self, report: impl FnOnce() -> String) {
        let mut damage = self.inner.lifecycle.damage.lock().unwrap_or_else(|e| e.into_inner());
        if damage.is_none() {
            let report = report();
            tracing::error!("{report}");
            *damage = Some(report);
        }
        self.inner.lifecycle.damaged.cancel();
    }

    /// Runs `read` on a blocking thread; damage it finds is reported.
    async fn blocking<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.clone();
        let result = tokio::task::spawn_blocking(move || read(&store))
            .await
            .map_err(|e| StoreError::Io(format!("store read task: {e}")))?;
        self.damage_in(result)
    }

    /// Runs `walk`, a long read for the store's readers, on a thread that
    /// yields the CPU to deliveries ([`browse`]); damage it finds is
    /// reported.
    async fn browsing<T: Send + 'static>(
        &self,
        walk: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.clone();
        let result = browse::run(move || walk(&store)).await?;
        self.damage_in(result)
    }

    /// `result`, with the damage it says of reported.
    fn damage_in<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::Corrupt(detail)) = &result {
            self.report_damage(detail);
        }
        result
    }

    /// Sends `op` to the writer and waits for its commit.
    async fn call<T>(&self, op: impl FnOnce(writer::Reply<T>) -> Op) -> Result<T, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.inner.ops.send(op(tx)).await.map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Queues `op` for the writer without waiting for it.
    async fn send(&self, op: Op) -> Result<(), StoreError> {
        self.inner.ops.send(op).await.map_err(|_| StoreError::Closed)
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

    /// A read of the due index failed: said, damage reported, and the
    /// store's reads marked failing until one succeeds.
    pub(crate) fn due_read_failed(&self, e: &StoreError) {
        tracing::error!(error = %e, "reading due messages failed; retrying shortly");
        if let StoreError::Corrupt(detail) = e {
            self.report_damage(detail);
        }
        self.report_reads(Some(format!("reading due messages failed: {e}")));
    }

    /// A due message could not be read (`Some`), or could again (`None`).
    pub(crate) fn report_reads(&self, failure: Option<String>) {
        self.inner.health.set_reads(failure);
    }

    pub(crate) fn wake(&self) -> &Wake {
        &self.inner.wake
    }

    /// The series this store (and its dispatcher) report, labelled with its
    /// shard.
    pub fn metrics(&self) -> &ShardMetrics {
        &self.inner.metrics
    }

    /// Where the dispatcher says which topics' messages wait and why, for
    /// the reads to show.
    pub fn held(&self) -> &HeldTopics {
        &self.inner.held
    }

    /// The backlog cap, if one is set.
    pub fn max_pending(&self) -> Option<u64> {
        self.inner.backlog.cap
    }

    /// Messages waiting for delivery.
    pub fn pending(&self) -> u64 {
        self.inner.backlog.pending.load(Ordering::Relaxed)
    }

    /// Messages the dispatcher holds for producing right now.
    pub fn dispatching(&self) -> usize {
        self.inner.claims.dispatching()
    }

    /// Takes `id` for producing as the dispatcher's walk does; false if
    /// someone holds it.
    #[cfg(test)]
    pub(crate) fn claim_for_dispatch(&self, id: &crate::message::MessageId) -> bool {
        self.inner.claims.claim_for_dispatch_all(std::iter::once(id)) == [claims::Claim::Taken]
    }

    /// Cluster mode: the offset of the log partition to apply next, as
    /// committed.
    pub fn log_next(&self) -> i64 {
        self.inner.log.next.load(Ordering::Acquire)
    }

    /// Cluster mode: the node incarnation that owns the shard, as the log
    /// applied so far says (0: none yet).
    pub fn log_owner(&self) -> u64 {
        self.inner.log.owner.load(Ordering::Acquire)
    }

    /// Cluster mode: the log's time (the record's timestamp) of the last
    /// record applied when the store was opened.
    pub fn log_time_at_open(&self) -> crate::message::UnixMillis {
        self.inner.opened.log_time
    }

    /// Cluster mode: the log's time (the record's timestamp) of the last
    /// record of the nodes applied, now.
    pub fn log_time(&self) -> crate::message::UnixMillis {
        crate::message::UnixMillis(self.inner.log.time.load(Ordering::Acquire))
    }

    /// When it was opened: a stop before that was at least this long ago.
    pub fn opened_at(&self) -> std::time::Instant {
        self.inner.opened.at
    }

    /// Which shard of how many the store was first opened as.
    pub fn recorded_shard(&self) -> ShardOf {
        self.inner.opened.recorded_shard
    }

    pub fn path(&self) -> &Path {
        &self.inner.opened.path
    }

    /// RocksDB's identity of this store: made when the store was created,
    /// kept as long as it lives. Names what belongs to this store alone
    /// (its transactional id, standalone).
    pub fn identity(&self) -> Result<String, StoreError> {
        let identity = self.inner.db.get_db_identity()?;
        Ok(String::from_utf8_lossy(&identity).trim().to_owned())
    }
}

#[cfg(test)]
mod tests;
