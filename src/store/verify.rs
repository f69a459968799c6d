//! Checksums: reading the whole store to find damage at once, and the
//! report a damaged store stops hourglass with.
//!
//! The read runs in the background at the browsing threads' lower CPU
//! priority (see [`super::browse`]), and once per store and process: a
//! cluster's shard opened again (moved away and back, or kept as a
//! standby after it was owned) is not read again while its deliveries and
//! its takeover want the CPU.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::Mutex,
};

use rocksdb::{DB, IteratorMode, ReadOptions};
use tokio_util::sync::CancellationToken;

use super::{StoreError, options::cf, schema};

/// The stores this process read whole.
static VERIFIED: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// Whether this process read the store at `path` whole already.
pub(super) fn verified(path: &Path) -> bool {
    VERIFIED.lock().unwrap_or_else(|e| e.into_inner()).contains(path)
}

/// Reads every entry of every column family of the store at `path` with
/// checksums on, until done or `stop`. RocksDB checks a table file's
/// blocks only when it reads them, so without this a damaged block would
/// surface only when a message in it comes due or is asked for.
pub(super) fn verify(db: &DB, path: &Path, stop: &CancellationToken) -> Result<(), StoreError> {
    super::browse::lower_priority();
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
    VERIFIED.lock().unwrap_or_else(|e| e.into_inner()).insert(path.to_owned());
    Ok(())
}

/// Damage stops hourglass: serving from the store would go on without the
/// records past the damage.
pub(super) fn damage_report(detail: &str, path: &Path) -> String {
    format!(
        "{detail}; hourglass will not run on a damaged store, because it would go on without the records \
         past the damage. Restore {path} from a backup, or move it aside to start with an empty store (the \
         messages parked in it are then lost)",
        path = path.display()
    )
}
