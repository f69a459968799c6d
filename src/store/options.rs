//! How the store opens RocksDB: its settings ([`StoreConfig`]), when an
//! acknowledged change is safe ([`Durability`]), and RocksDB's options for
//! each column family.

use std::path::PathBuf;

use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBRecoveryMode, FlushOptions,
    Options, WriteBatch, WriteOptions,
};
use serde::{Deserialize, Serialize};

use super::{StoreError, schema};

/// When an acknowledged change is safe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Acknowledge after the WAL is fsynced: survives a power loss or a
    /// kernel crash. Concurrent requests share fsyncs (group commit).
    #[default]
    Sync,
    /// Acknowledge after the WAL write reached the OS: survives a crash of
    /// hourglass itself, but a power loss or kernel crash can lose the last
    /// few hundred milliseconds of acknowledged changes.
    Buffered,
    /// Cluster mode: the store is a view of its shard's partition of the
    /// schedule log, which holds every change (appended with acks=all)
    /// before the store applies it. Nothing is written ahead: RocksDB writes
    /// every column family's memtable out at once, so that a crash leaves
    /// the store as it was after some commit, the offset it had applied to
    /// with it, and the store applies the log again from there. Not a
    /// user's choice: a standalone store has no log to apply again.
    #[serde(skip)]
    Replayed,
}

impl Durability {
    /// How a commit is written.
    pub(crate) fn write_options(self) -> WriteOptions {
        let mut options = WriteOptions::default();
        match self {
            Durability::Sync => options.set_sync(true),
            Durability::Buffered => {}
            Durability::Replayed => options.disable_wal(true),
        }
        options
    }

    /// Writes `batch` so that it survives a crash of the machine when this
    /// returns: synced to the WAL, or, with none, flushed with everything
    /// written before it.
    pub(crate) fn write_durably(self, db: &DB, batch: WriteBatch) -> Result<(), rocksdb::Error> {
        match self {
            Durability::Sync | Durability::Buffered => {
                let mut options = WriteOptions::default();
                options.set_sync(true);
                db.write_opt(batch, &options)
            }
            Durability::Replayed => {
                db.write_opt(batch, &self.write_options())?;
                flush_all(db)
            }
        }
    }

    /// Makes what was written so far survive a crash of the machine.
    pub(crate) fn persist(self, db: &DB) -> Result<(), rocksdb::Error> {
        match self {
            Durability::Sync | Durability::Buffered => db.flush_wal(true),
            Durability::Replayed => flush_all(db),
        }
    }
}

/// Writes every column family's memtable out, in one flush: with no WAL,
/// what is on disk is then one moment of the store, never one column
/// family ahead of another.
pub(crate) fn flush_all(db: &DB) -> Result<(), rocksdb::Error> {
    flush_all_with(db, true)
}

/// [`flush_all`], in the background.
pub(crate) fn start_flush_all(db: &DB) -> Result<(), rocksdb::Error> {
    flush_all_with(db, false)
}

fn flush_all_with(db: &DB, wait: bool) -> Result<(), rocksdb::Error> {
    let cfs: Vec<_> = [schema::CF_DUE, schema::CF_MESSAGES, schema::CF_CHECKPOINT]
        .into_iter()
        .map(|name| cf(db, name))
        .collect();
    let mut options = FlushOptions::default();
    options.set_wait(wait);
    db.flush_cfs_opt(&cfs, &options)
}

impl std::str::FromStr for Durability {
    type Err = NotADurability;

    fn from_str(s: &str) -> Result<Self, NotADurability> {
        match s {
            "sync" => Ok(Durability::Sync),
            "buffered" => Ok(Durability::Buffered),
            other => Err(NotADurability(other.to_owned())),
        }
    }
}

/// A `--durability` that names no durability.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a durability; use sync or buffered")]
pub struct NotADurability(pub String);

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Durability::Sync => "sync",
            Durability::Buffered => "buffered",
            Durability::Replayed => "replayed from the schedule log",
        })
    }
}

/// How the store is opened.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub path: PathBuf,
    pub durability: Durability,
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
    /// Which of its node's shards this store is (the `shard` label of its
    /// metrics), and of how many: recorded at its first open.
    pub shard: ShardOf,
    /// Keep the key, value and headers of a delivered message until
    /// retention ends, rather than drop them once the delivery is on disk.
    pub keep_delivered_bodies: bool,
}

/// Which shard of how many a store is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardOf {
    pub shard: u32,
    pub shards: u32,
}

impl ShardOf {
    /// The only shard of a node.
    pub const ALONE: ShardOf = ShardOf { shard: 0, shards: 1 };
}

impl std::fmt::Display for ShardOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shard {} of {}", self.shard, self.shards)
    }
}

impl StoreConfig {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StoreConfig {
            path: path.into(),
            durability: Durability::Sync,
            cache_bytes: 32 << 20,
            write_buffer_bytes: 64 << 20,
            max_pending: None,
            verify_on_open: true,
            shard: ShardOf::ALONE,
            keep_delivered_bodies: false,
        }
    }
}

/// Opens RocksDB the way the store does (its column families, caches and
/// checks), with no writer: for the store itself, and for tools that
/// measure what RocksDB does with hourglass's options.
pub fn open_db(config: &StoreConfig) -> Result<DB, StoreError> {
    open_db_with_cache(config, |_| {}).map(|(db, _)| db)
}

/// [`open_db`], with the block cache its column families share; `due_too`
/// adds to the due CF's options (its compaction filter).
pub(crate) fn open_db_with_cache(
    config: &StoreConfig,
    due_too: impl FnOnce(&mut Options),
) -> Result<(DB, Cache), StoreError> {
    let cache = Cache::new_lru_cache(config.cache_bytes);
    let table = |bloom: bool| {
        let mut t = BlockBasedOptions::default();
        t.set_block_cache(&cache);
        t.set_cache_index_and_filter_blocks(true);
        // Each file's index and filter in partitions, cached as data
        // blocks are, under a small top level kept pinned. Whole ones were
        // evicted by reads spread over more data than the cache holds (a
        // series' record, read once a minute each): every point read then
        // read a file's whole filter and index again and checked their
        // checksums, most of the driver's time at 300k series.
        t.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
        t.set_pin_top_level_index_and_filter(true);
        t.set_pin_l0_filter_and_index_blocks_in_cache(true);
        if bloom {
            t.set_bloom_filter(10.0, false);
            t.set_partition_filters(true);
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
    // Compactions yield the CPU to the dispatcher and the API: on a small
    // machine a compaction of the backlog would otherwise delay deliveries
    // by milliseconds. Under a sustained load they still run in what is
    // left, and RocksDB slows writes down if they fall behind. Flushes keep
    // their priority.
    let mut env = rocksdb::Env::new()?;
    env.lower_thread_pool_cpu_priority();
    db_opts.set_env(&env);
    db_opts.set_max_total_wal_size(256 << 20);
    if config.durability == Durability::Replayed {
        // With no WAL, column families flushed apart would leave one ahead
        // of another after a crash.
        db_opts.set_atomic_flush(true);
    }

    let mut due = Options::default();
    due.set_block_based_table_factory(&table(false));
    // The due CF is a queue: its head fills with tombstones. Compact files
    // dense with deletions so later seeks do not wade through them.
    due.add_compact_on_deletion_collector_factory(64 * 1024, 16 * 1024, 0.5);
    due_too(&mut due);
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
    Ok((DB::open_cf_descriptors(&db_opts, &config.path, cfs)?, cache))
}

/// The handle of a column family the store opened.
pub(crate) fn cf<'a>(db: &'a DB, name: &str) -> &'a rocksdb::ColumnFamily {
    // Every column family is created when the store opens; a missing one is a
    // bug in this crate, not a condition to handle.
    db.cf_handle(name).unwrap_or_else(|| panic!("column family {name} is not open"))
}
