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

/// The file, in a store's directory, where its dispatcher notes when it
/// last had produces unanswered (`crate::dispatcher`'s pulse).
pub(crate) const IN_FLIGHT_FILE: &str = "HOURGLASS-IN-FLIGHT";

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
/// was and the restore is not recorded yet. A marker that cannot be read
/// fails the open: taken for none, the store would open as closed cleanly.
pub(super) fn restored_from(path: &Path) -> Result<Option<UnixMillis>, StoreError> {
    let marker = path.join(MARKER);
    match std::fs::read_to_string(&marker) {
        Ok(text) => Ok(Some(UnixMillis(text.trim().parse().unwrap_or(0)))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::Io(format!("reading {}: {e}", marker.display()))),
    }
}

/// The restore is recorded: the store opens as any other from now on. The
/// dispatcher's note of when it last had produces unanswered
/// ([`IN_FLIGHT_FILE`]) goes first, if the directory the backup was put
/// in holds one: it is of another process, and would bound the search.
pub(super) fn restore_recorded(path: &Path) -> Result<(), StoreError> {
    let (in_flight, marker) = (path.join(IN_FLIGHT_FILE), path.join(MARKER));
    let removed = |file: &Path| match std::fs::remove_file(file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(StoreError::Io(format!("removing {}: {e}", file.display())))
        }
        _ => Ok(()),
    };
    removed(&in_flight)?;
    removed(&marker)?;
    std::fs::File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| StoreError::Io(format!("syncing {}: {e}", path.display())))
}
