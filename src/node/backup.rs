//! A backup of every store of a standalone node, while it serves: each
//! shard's store checkpointed where it would lie in a data dir of the same
//! shard count, so that the backup is a data dir ([`crate::store`] says what
//! opening one does).

use std::path::{Path, PathBuf};

use futures_util::future;

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

impl Node {
    /// Writes a backup of every shard to `dir`, a new directory whose
    /// parent exists, taken at `now`.
    pub async fn back_up(&self, dir: &Path, now: UnixMillis) -> Result<Backup, Error> {
        let invalid = |reason: String| Error::Invalid(Invalid::new("dir", reason));
        if !dir.is_absolute() {
            return Err(invalid(format!(
                "{} is not an absolute path on the server's machine",
                dir.display()
            )));
        }
        if dir.symlink_metadata().is_ok() {
            return Err(invalid(format!("{} exists: name a new directory", dir.display())));
        }
        match dir.parent().map(Path::is_dir) {
            Some(true) => {}
            _ => return Err(invalid(format!("the parent of {} is not a directory", dir.display()))),
        }
        let readers = self.readers();
        let shards = self.shards.count() as u32;
        let stores: Vec<PathBuf> = if shards == 1 {
            vec![dir.to_owned()]
        } else {
            std::fs::create_dir(dir)
                .map_err(|e| StoreError::Io(format!("creating {}: {e}", dir.display())))?;
            readers.iter().map(|(shard, _)| super::shard_dir(dir, *shard)).collect()
        };
        let copies = readers.iter().zip(stores).map(|((_, reader), to)| reader.back_up(to, now));
        let pending = future::try_join_all(copies).await?.into_iter().sum();
        Ok(Backup { dir: dir.to_owned(), shards, pending, taken_at: now })
    }
}
