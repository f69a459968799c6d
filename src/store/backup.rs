//! A backup of a store taken while it serves, and what a store opened from
//! one does first.
//!
//! A backup is a RocksDB checkpoint: a consistent copy of every column
//! family as of one moment (hard links to the store's files where the
//! backup is on the same filesystem, copies elsewhere), opened as a store
//! like any other. Beside the checkpoint's files lies [`MARKER`]. A store
//! opened with the marker is a restore: since the copy was taken, the
//! process it came from may have produced any of its pending messages, so
//! everything pending and due by the open is in doubt, searched for on its
//! topics from the copy's marks before any of it is produced, as after a
//! crash (the dispatch horizon recorded in the copy no longer bounds what
//! was produced). The marker goes once that is recorded.

use std::path::{Path, PathBuf};

use rocksdb::checkpoint::Checkpoint;

use super::{StoreError, read::Reader};
use crate::message::UnixMillis;

/// The file a backup carries beside its store's files: the time it was
/// taken, in Unix milliseconds, as text.
const MARKER: &str = "HOURGLASS-BACKUP";

impl Reader {
    /// Writes a consistent copy of the store to `dir`, which must not
    /// exist (its parent must), taken at `now`. Returns the messages
    /// pending in it.
    pub async fn back_up(&self, dir: PathBuf, now: UnixMillis) -> Result<u64, StoreError> {
        self.store
            .blocking(move |store| {
                let pending = store.pending();
                Checkpoint::new(&store.inner.db)
                    .and_then(|checkpoint| checkpoint.create_checkpoint(&dir))
                    .map_err(|e| {
                        StoreError::Io(format!("writing a backup of the store to {}: {e}", dir.display()))
                    })?;
                let marker = dir.join(MARKER);
                std::fs::write(&marker, now.0.to_string())
                    .and_then(|()| std::fs::File::open(&marker)?.sync_all())
                    .and_then(|()| std::fs::File::open(&dir)?.sync_all())
                    .map_err(|e| StoreError::Io(format!("writing {}: {e}", marker.display())))?;
                Ok(pending)
            })
            .await
    }
}

/// When the backup the store in `path` was restored from was taken, if it
/// was and the restore is not recorded yet.
pub(super) fn restored_from(path: &Path) -> Option<UnixMillis> {
    let text = std::fs::read_to_string(path.join(MARKER)).ok()?;
    Some(UnixMillis(text.trim().parse().unwrap_or(0)))
}

/// The restore is recorded: the store opens as any other from now on.
pub(super) fn restore_recorded(path: &Path) -> Result<(), StoreError> {
    let marker = path.join(MARKER);
    std::fs::remove_file(&marker)
        .and_then(|()| std::fs::File::open(path)?.sync_all())
        .map_err(|e| StoreError::Io(format!("removing {}: {e}", marker.display())))
}
