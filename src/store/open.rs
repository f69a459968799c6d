//! Opening a store and closing it: RocksDB with the store's options, the
//! writer thread and the clock that wakes it, and the verifier that reads
//! the whole store for damage in the background.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, AtomicU64, Ordering},
        mpsc::RecvTimeoutError,
    },
    time::Duration,
};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    Backlog, BlockCache, Inner, Lifecycle, LogPosition, Opened, PurgeCursors, Store, StoreConfig, StoreError,
    Threads, Upkeep, backup,
    claims::{Claims, Wake},
    health::HealthBoard,
    options::open_db_with_cache,
    schema,
    shed::Shed,
    verify,
    writer::{Op, Shared, Writer, WriterConfig},
};
use crate::{
    clock::{Clock as _, SystemClock},
    message::UnixMillis,
    metrics::ShardMetrics,
};

/// How often parked requests are checked for having waited too long.
const TICK: Duration = Duration::from_millis(500);

impl Store {
    /// Opens (or creates) the store at `config.path` and starts its writer.
    pub fn open(config: &StoreConfig) -> Result<Store, StoreError> {
        let with_report = |e| match e {
            StoreError::Corrupt(detail) => StoreError::Corrupt(verify::damage_report(&detail, &config.path)),
            other => other,
        };
        std::fs::create_dir_all(&config.path)
            .map_err(|e| StoreError::Io(format!("creating {}: {e}", config.path.display())))?;
        let shed = Shed::new(config.keep_delivered_bodies, config.durability);
        let filters = shed.filters();
        let (db, cache) = open_db_with_cache(config, |due| {
            if let Some(filters) = filters {
                due.set_compaction_filter_factory(filters);
            }
        })
        .map_err(with_report)?;
        let db = Arc::new(db);
        let metrics = ShardMetrics::of(config.shard.shard);
        let (ops, rx) = mpsc::channel(16 * 1024);
        let shared = Shared {
            db: Arc::clone(&db),
            claims: Arc::new(Claims::default()),
            wake: Arc::new(Wake::default()),
            pending: Arc::new(AtomicU64::new(0)),
            log_next: Arc::new(AtomicI64::new(0)),
            log_owner: Arc::new(AtomicU64::new(0)),
            log_time: Arc::new(AtomicU64::new(0)),
            health: Arc::new(HealthBoard::new(metrics.writable.clone())),
            metrics: metrics.clone(),
            dropped_holds: Arc::default(),
            policies: Arc::new(tokio::sync::watch::Sender::new(Arc::new(
                super::policy::load(&db).map_err(with_report)?,
            ))),
        };
        let policies = Arc::clone(&shared.policies);
        let (claims, wake, pending, health, log_next, log_owner) = (
            Arc::clone(&shared.claims),
            Arc::clone(&shared.wake),
            Arc::clone(&shared.pending),
            Arc::clone(&shared.health),
            Arc::clone(&shared.log_next),
            Arc::clone(&shared.log_owner),
        );
        let log_time_now = Arc::clone(&shared.log_time);
        let writer_config = WriterConfig {
            durability: config.durability,
            max_pending: config.max_pending,
            max_round: 4096,
            shard: config.shard,
            keep_delivered_bodies: config.keep_delivered_bodies,
        };
        let restored = backup::restored_from(&config.path)?;
        let writer = Writer::open(shared, writer_config, rx, SystemClock.now(), restored.is_some())
            .map_err(with_report)?;
        if let Some(taken) = restored {
            backup::restore_recorded(&config.path)?;
            tracing::warn!(
                path = %config.path.display(),
                backup_taken_at_ms = taken.0,
                "opened a backup: its messages pending and due by now are searched for on their topics before \
                 any is produced, so that none delivered since the backup is sent again"
            );
        }
        let (recorded_shard, log_time, in_doubt, horizon_at_open) =
            (writer.recorded_shard(), writer.log_time(), writer.in_doubt_window(), writer.horizon());
        metrics.pending.set(pending.load(Ordering::Relaxed) as i64);
        metrics.max_pending.set(config.max_pending.map_or(0, |cap| i64::try_from(cap).unwrap_or(i64::MAX)));
        let (damaged, damage) = (CancellationToken::new(), Arc::new(Mutex::new(None)));
        let stopped = WriterStopped {
            damaged: damaged.clone(),
            damage: Arc::clone(&damage),
            path: config.path.display().to_string(),
        };
        let handle = spawn("hourglass-writer", "the writer thread", move || {
            if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.run())) {
                stopped.say(&*panic);
            }
        })?;
        let ticks = ops.downgrade();
        let (stop_ticks, stopped) = std::sync::mpsc::channel::<()>();
        let tick = spawn("hourglass-tick", "the writer's clock", move || {
            // Until the store closes (its sender dropped) or the writer is gone.
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(TICK) {
                match ticks.upgrade() {
                    Some(ops) if ops.try_send(Op::Tick).is_ok() || !ops.is_closed() => {}
                    _ => return,
                }
            }
        })?;
        let store = Store {
            inner: Arc::new(Inner {
                db,
                cache: BlockCache { cache, bytes: config.cache_bytes },
                ops,
                claims,
                wake,
                held: Default::default(),
                backlog: Backlog { pending, cap: config.max_pending },
                log: LogPosition { next: log_next, owner: log_owner, time: log_time_now },
                health,
                metrics,
                threads: Threads {
                    writer: Mutex::new(Some(handle)),
                    tick: Mutex::new(Some((stop_ticks, tick))),
                    verifier: Mutex::new(None),
                },
                lifecycle: Lifecycle { damaged, damage, closing: CancellationToken::new() },
                opened: Opened {
                    path: config.path.clone(),
                    recorded_shard,
                    in_doubt,
                    at: std::time::Instant::now(),
                    horizon: horizon_at_open,
                    log_time,
                },
                upkeep: Upkeep {
                    purge: PurgeCursors {
                        retention: Mutex::new(schema::retention_range_before(UnixMillis(0)).0),
                        logs: Mutex::new(schema::delivery_logs_range().0),
                        chunks: Mutex::default(),
                    },
                    shed,
                },
                policies,
            }),
        };
        if config.verify_on_open && !verify::verified(&config.path) {
            let verifying = store.clone();
            let handle = spawn("hourglass-verify", "the verifier thread", move || verifying.verify())?;
            *store.inner.threads.verifier.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        }
        Ok(store)
    }

    /// Reads the whole store with checksums, in the background of a
    /// running server, and reports damage it finds.
    fn verify(&self) {
        match verify::verify(&self.inner.db, &self.inner.opened.path, &self.inner.lifecycle.closing) {
            Ok(()) => {}
            Err(StoreError::Corrupt(detail)) => self.report_damage(&detail),
            Err(e) => tracing::warn!(error = %e, "verifying the store's checksums failed"),
        }
    }

    /// Stops the writer after it has committed everything queued. Requests
    /// made after this fail with `Closed`.
    pub async fn close(&self) {
        self.inner.lifecycle.closing.cancel();
        let _ = self.send(Op::Close).await;
        let handle = self.inner.threads.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
        // Stop the verifier (it sees `closing` within 4096 entries) and
        // RocksDB's flushes and compactions, and wait for them: the process
        // may exit while the handle is still held, and RocksDB work still
        // running then would lock mutexes that exit has destroyed.
        // The clock stops at once, and is waited for too: a thread that ends
        // while the process exits can abort it (glibc frees the thread's
        // malloc arena as exit tears it down).
        let tick = self.inner.threads.tick.lock().unwrap_or_else(|e| e.into_inner()).take();
        let verifier = self.inner.threads.verifier.lock().unwrap_or_else(|e| e.into_inner()).take();
        let store = self.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some((stop, tick)) = tick {
                drop(stop);
                let _ = tick.join();
            }
            if let Some(verifier) = verifier {
                let _ = verifier.join();
            }
            store.inner.db.cancel_all_background_work(true);
            store.inner.upkeep.shed.wait_idle();
        })
        .await;
    }
}

/// What a writer thread that panicked leaves behind: the store takes no
/// more changes, so it is reported as damage is, and the server stops (in
/// cluster mode, for a shard it owns, handing its shards over as at any
/// stop) rather than stay up and answer every change "the store is
/// closed". Nothing acknowledged is lost: an answer waits for its commit,
/// and a restart reopens the store where its last commit left it.
struct WriterStopped {
    damaged: CancellationToken,
    damage: Arc<Mutex<Option<String>>>,
    path: String,
}

impl WriterStopped {
    fn say(self, panic: &(dyn std::any::Any + Send)) {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned());
        let report = format!(
            "the writer of the store in {} stopped ({why}): the store takes no more changes; \
             restart the server, which reopens it where its last commit left it",
            self.path
        );
        tracing::error!("{report}");
        self.damage.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(report);
        self.damaged.cancel();
    }
}

/// Starts a named thread of the store.
fn spawn<T: Send + 'static>(
    name: &str,
    what: &str,
    run: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<T>, StoreError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(run)
        .map_err(|e| StoreError::Io(format!("starting {what}: {e}")))
}
