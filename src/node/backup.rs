//! A backup of every store of a standalone node, while it serves: each
//! shard's store checkpointed where it would lie in a data dir of the same
//! shard count, so that the backup is a data dir ([`crate::store`] says what
//! opening one does).
//!
//! A backup appears whole or not at all: it is made in a directory of its
//! own beside the one asked for (readable by the server's user alone),
//! every store and its marker written and synced, then renamed into place.
//! One is made at a time.

use std::{
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use super::Node;
use crate::{
    Error,
    message::{Invalid, UnixMillis},
    store::StoreError,
};

/// What a backup holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Backup {
    pub dir: PathBuf,
    pub shards: u32,
    pub pending: u64,
    pub taken_at: UnixMillis,
}

/// One backup at a time, on this process.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Node {
    /// Writes a backup of every shard to `dir`, a new directory whose
    /// parent exists, outside `data_dir`, taken at `now`. The work goes on
    /// to its end, and cleans up after itself, if the caller goes away.
    pub async fn back_up(&self, dir: &Path, data_dir: &Path, now: UnixMillis) -> Result<Backup, Error> {
        let one = ONE_AT_A_TIME.lock().await;
        let (parent, name) = where_to(dir, data_dir)?;
        let (readers, shards) = (self.readers(), self.shards.count() as u32);
        let work = tokio::spawn(async move {
            let _one = one;
            let staging = parent.join(format!(".{name}.partial-{}-{}", std::process::id(), now.0));
            let made = make(&staging, &parent.join(&name), readers, shards, now).await;
            // Empty once renamed (one shard), or what a failure left.
            let _ = std::fs::remove_dir_all(&staging);
            made.map(|pending| Backup { dir: parent.join(&name), shards, pending, taken_at: now })
        });
        work.await.map_err(|e| Error::Store(StoreError::Io(format!("the backup's task: {e}"))))?
    }
}

/// Checkpoints every store in `staging` (readable by this user alone), then
/// renames it (with one shard, its store) to `to`. Returns the messages
/// pending in it.
async fn make(
    staging: &Path,
    to: &Path,
    readers: Vec<(u32, crate::store::Reader)>,
    shards: u32,
    now: UnixMillis,
) -> Result<u64, Error> {
    let io = |what: &str, path: &Path, e: std::io::Error| {
        Error::Store(StoreError::Io(format!("{what} {}: {e}", path.display())))
    };
    std::fs::DirBuilder::new().mode(0o700).create(staging).map_err(|e| io("creating", staging, e))?;
    let root = if shards == 1 { staging.join("store") } else { staging.to_owned() };
    let mut pending = 0;
    for (shard, reader) in readers {
        let into = if shards == 1 { root.clone() } else { super::shard_dir(&root, shard) };
        pending += reader.back_up(into, now).await?;
    }
    let sync =
        |dir: &Path| std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("syncing", dir, e));
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io("restricting", &root, e))?;
    sync(&root)?;
    std::fs::rename(&root, to).map_err(|e| io("moving the backup to", to, e))?;
    sync(to.parent().unwrap_or(Path::new("/")))?;
    Ok(pending)
}

/// `dir`'s parent and name, if it may be a backup's: an absolute path that
/// does not exist, whose parent does, outside the data dir.
fn where_to(dir: &Path, data_dir: &Path) -> Result<(PathBuf, String), Error> {
    let invalid = |reason: String| Error::Invalid(Invalid::new("dir", reason));
    if !dir.is_absolute() {
        return Err(invalid(format!("{} is not an absolute path on the server's machine", dir.display())));
    }
    let name = dir.file_name().and_then(|n| n.to_str()).filter(|n| !n.starts_with('.'));
    let Some(name) = name else {
        return Err(invalid(format!(
            "{} does not end in a name (one not beginning with '.')",
            dir.display()
        )));
    };
    if dir.symlink_metadata().is_ok() {
        return Err(invalid(format!("{} exists: name a new directory", dir.display())));
    }
    let parent = dir.parent().and_then(|p| p.canonicalize().ok()).filter(|p| p.is_dir());
    let Some(parent) = parent else {
        return Err(invalid(format!("the parent of {} is not a directory", dir.display())));
    };
    let data = data_dir.canonicalize().unwrap_or_else(|_| data_dir.to_owned());
    if parent.starts_with(&data) {
        return Err(invalid(format!(
            "{} lies in the data dir {}: name a directory outside it",
            dir.display(),
            data.display()
        )));
    }
    Ok((parent, name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_goes_to_a_new_absolute_directory_outside_the_data_dir() {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("data");
        std::fs::create_dir_all(data.join("shard-0")).unwrap();
        let refused = |dir: PathBuf, says: &str| {
            let e = where_to(&dir, &data).unwrap_err().to_string();
            assert!(e.contains(says), "{}: {e}", dir.display());
        };
        refused(PathBuf::from("backup"), "absolute");
        refused(root.path().join(".hidden"), "name");
        refused(data.join("shard-0"), "exists");
        refused(data.join("backup"), "data dir");
        refused(root.path().join("missing/backup"), "parent");
        let (parent, name) = where_to(&root.path().join("backup"), &data).unwrap();
        assert_eq!((parent, name.as_str()), (root.path().canonicalize().unwrap(), "backup"));
    }
}
