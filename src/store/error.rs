//! RocksDB's errors as a shard's ([`StoreError`]): told apart by their kind.

use rocksdb::ErrorKind;

pub use crate::command::StoreError;

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
