//! What a delivered message sheds. A message delivered at its first try
//! stays in the due index until retention ends, as its record ([`schema`]).
//! Once it lies below a floor that survives a crash of the machine,
//! compaction drops its key, value and headers and keeps the rest (id,
//! topic, partition, times, labels) with the SHA-256 of the request's
//! content: `Get` still answers for it, and a retried `Schedule` is still
//! told from a different one. `--keep-delivered-bodies` keeps them whole.
//!
//! The floor the filter sheds below is raised only by a pass
//! ([`Store::shed_delivered`]), after what recorded it is on disk: a crash
//! then never brings back as pending a message whose content is gone. The
//! pass also compacts the newly delivered part of the due index, so that
//! bodies are shed soon after their delivery rather than whenever RocksDB
//! compacts there: a pass runs once 64 MiB were delivered since the last,
//! when the store goes quiet, and every 5 minutes while deliveries go on.
//!
//! A message delivered otherwise (after a retry, or acknowledged out of
//! order) is settled on its own and its record moves to the messages
//! column family: it goes there without its body at once, in the write
//! that records its delivery. Cancelled, failed, expired and
//! dead-lettered messages keep theirs: they may be rescheduled.
//!
//! In cluster mode a standby copy's floor does not move (the log's settle
//! lines do not carry it): it keeps bodies until it owns the shard, and
//! its first pass then starts where bodies were left ([`first_pass_from`]).

use std::{
    ffi::CStr,
    sync::{Arc, Mutex, MutexGuard, TryLockError},
    time::{Duration, Instant},
};

use rocksdb::{
    BottommostLevelCompaction, CompactOptions, DB, Range, ReadOptions,
    compaction_filter::{CompactionFilter, Decision},
    compaction_filter_factory::{CompactionFilterContext, CompactionFilterFactory},
};

use tokio_util::sync::CancellationToken;

use super::{Durability, Store, StoreError, options::cf, read, schema};
use crate::{command::DispatchKey, message::UnixMillis};

/// The step, in due time, of the first pass's look for where bodies were
/// left (see [`first_pass_from`]).
const FIRST_PASS_BACK_MS: u64 = 3_600_000;

/// Bytes delivered and not yet shed that start a pass at the next look.
const PASS_BYTES: u64 = 64 << 20;

/// A pass at least this often while deliveries go on, however few.
const PASS_EVERY: Duration = Duration::from_secs(300);

/// The floor delivered bodies are shed below, shared with the filters
/// compactions make.
pub(super) struct Shed {
    /// Due entries below this key are delivered, and that is on disk.
    below: Arc<Mutex<DispatchKey>>,
    /// Bodies are kept (`--keep-delivered-bodies`): no filter, no pass.
    keep: bool,
    durability: Durability,
    passes: Mutex<Passes>,
}

/// Where the next pass compacts from (where the last one ended), and when
/// the last one ran.
struct Passes {
    compacted_to: Option<DispatchKey>,
    last: Instant,
}

impl Shed {
    pub(super) fn new(keep: bool, durability: Durability) -> Shed {
        Shed {
            below: Arc::new(Mutex::new(DispatchKey::MIN)),
            keep,
            durability,
            passes: Mutex::new(Passes { compacted_to: None, last: Instant::now() }),
        }
    }

    /// The filter factory of the due column family, if bodies are shed.
    pub(super) fn filters(&self) -> Option<Filters> {
        (!self.keep).then(|| Filters { below: Arc::clone(&self.below) })
    }

    /// A pass, if one is due: `now` (the store went quiet), or once
    /// `PASS_BYTES` were delivered since the last, or `PASS_EVERY` went
    /// by. It reads the floor as the store holds it, makes that survive a
    /// crash, sheds below it from then on, and compacts the due index from
    /// where the last pass ended up to it, bottom files too, so that what
    /// lies there is shed now. Whether it ran (not while another runs, nor
    /// once the store closes).
    fn pass(&self, db: &DB, now: bool, closing: &CancellationToken) -> Result<bool, StoreError> {
        if self.keep {
            return Ok(false);
        }
        // One pass at a time; the next look starts another if one is due.
        let mut passes = match self.passes.try_lock() {
            Ok(passes) => passes,
            Err(TryLockError::Poisoned(passes)) => passes.into_inner(),
            Err(TryLockError::WouldBlock) => return Ok(false),
        };
        if closing.is_cancelled() {
            return Ok(false);
        }
        // What a commit wrote, not what the writer holds: a floor it
        // raised without writing is not on disk yet.
        let floor = read::meta(db, &ReadOptions::default())?.floor();
        let below = *lock(&self.below);
        if floor <= below {
            return Ok(false);
        }
        let due = cf(db, schema::CF_DUE);
        let from = match passes.compacted_to {
            Some(to) => to,
            None => first_pass_from(db, floor)?,
        };
        let (lower, upper) = (from.encode(), floor.encode());
        let settled = db.get_approximate_sizes_cf(&due, &[Range::new(&lower, &upper)]);
        let settled = settled.first().copied().unwrap_or(0);
        if !now && passes.last.elapsed() < PASS_EVERY && settled < PASS_BYTES {
            return Ok(false);
        }
        let started = Instant::now();
        self.durability.persist(db)?;
        *lock(&self.below) = floor;
        if from < floor {
            let mut options = CompactOptions::default();
            options.set_bottommost_level_compaction(BottommostLevelCompaction::ForceOptimized);
            // Beside RocksDB's own compactions of the backlog, not after
            // them: those can take minutes on a busy machine.
            options.set_exclusive_manual_compaction(false);
            db.compact_range_cf_opt(due, Some(lower), Some(upper), &options);
        }
        *passes = Passes { compacted_to: Some(from.max(floor)), last: Instant::now() };
        tracing::debug!(?from, ?floor, settled, took = ?started.elapsed(), "dropped the bodies of delivered messages");
        Ok(true)
    }

    /// Waits for a pass under way to end (the store is closing: the next
    /// sees it and does nothing).
    pub(super) fn wait_idle(&self) {
        drop(lock(&self.passes));
    }
}

/// Where the first pass of a process starts: a sample's step before the
/// first entry below `floor` that still has its body (a store of an
/// earlier release, a copy that was a standby, what the last run
/// delivered after its last pass), sampling an entry every
/// `FIRST_PASS_BACK_MS` of due time from the oldest (passes shed in due
/// order); else that step before `floor`.
fn first_pass_from(db: &DB, floor: DispatchKey) -> Result<DispatchKey, StoreError> {
    let mut it = db.raw_iterator_cf(cf(db, schema::CF_DUE));
    it.seek_to_first();
    let mut found = floor;
    while let (Some(k), Some(value)) = (it.key(), it.value()) {
        let Some(key) = DispatchKey::decode(k).filter(|key| *key < floor) else { break };
        if schema::shed_due_value(value).is_some() {
            found = key;
            break;
        }
        let next = DispatchKey { at: UnixMillis(key.at.0.saturating_add(FIRST_PASS_BACK_MS)), seq: 0 };
        it.seek(next.encode());
    }
    it.status()?;
    Ok(DispatchKey { at: UnixMillis(found.at.0.saturating_sub(FIRST_PASS_BACK_MS)), seq: 0 })
}

impl Store {
    /// Sheds the bodies of messages delivered below the floor the store
    /// holds now, if enough were delivered since the last time, or long
    /// enough ago, or `now` (see [`Shed`]). Whether it did.
    pub async fn shed_delivered(&self, now: bool) -> Result<bool, StoreError> {
        if self.inner.upkeep.shed.keep {
            return Ok(false);
        }
        // The writer writes a raised floor with its next change; a store
        // gone quiet is asked for one.
        let written =
            self.blocking(|s| Ok(read::meta(&s.inner.db, &ReadOptions::default())?.floor())).await?;
        if self.inner.wake.floor_recorded() > written {
            self.probe().await?;
        }
        self.blocking(move |s| s.inner.upkeep.shed.pass(&s.inner.db, now, &s.inner.lifecycle.closing)).await
    }
}

/// Makes the filter of each compaction of the due column family.
pub(super) struct Filters {
    below: Arc<Mutex<DispatchKey>>,
}

impl CompactionFilterFactory for Filters {
    type Filter = Filter;

    fn create(&mut self, _: CompactionFilterContext) -> Filter {
        Filter { below: *lock(&self.below), out: Vec::new() }
    }

    fn name(&self) -> &CStr {
        c"hourglass-shed-delivered"
    }
}

/// One compaction's filter: the floor as the compaction began, and the
/// buffer of the last value it changed.
pub(super) struct Filter {
    below: DispatchKey,
    out: Vec<u8>,
}

impl CompactionFilter for Filter {
    fn filter(&mut self, _level: u32, key: &[u8], value: &[u8]) -> Decision {
        let Some(key) = DispatchKey::decode(key) else { return Decision::Keep };
        if key >= self.below {
            return Decision::Keep;
        }
        match schema::shed_due_value(value) {
            Some(shed) => {
                self.out = shed;
                // SAFETY: RocksDB copies the new value as soon as this
                // returns (its C API assigns it to the compaction's own
                // string), and `out` is neither changed nor dropped before
                // the next call, which only this compaction's thread makes.
                Decision::Change(unsafe { std::slice::from_raw_parts(self.out.as_ptr(), self.out.len()) })
            }
            None => Decision::Keep,
        }
    }

    fn name(&self) -> &CStr {
        c"hourglass-shed-delivered"
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
