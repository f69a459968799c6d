//! The policy table a store keeps in memory too (see [`crate::policy`]):
//! read from its rows at open, and handed to whoever watches it (the
//! dispatcher, the admin API) after each commit that changed it.

use std::sync::Arc;

use rocksdb::DB;
use tokio::sync::watch;

use super::{Reader, Store, StoreError, rows};
use crate::{
    command::{Row, RowValue, Table as Rows},
    policy::{PolicyKey, Table, TopicPolicy},
};

impl Store {
    /// The policies as they are now, and each change after this.
    pub fn policies(&self) -> watch::Receiver<Arc<Table>> {
        self.inner.policies.subscribe()
    }
}

impl Reader {
    /// The policies as they are now, and each change after this.
    pub fn policies(&self) -> watch::Receiver<Arc<Table>> {
        self.store.policies()
    }
}

/// Every policy kept in `db`.
pub(super) fn load(db: &DB) -> Result<Table, StoreError> {
    let mut table = Table::default();
    for (key, bytes) in rows::all(db, Rows::Policy)? {
        let (key, policy) = read(&key, &bytes)?;
        table.set(key, Some(policy));
    }
    Ok(table)
}

/// Tells the watchers of `table` what a commit wrote of it.
pub(super) fn publish(table: &watch::Sender<Arc<Table>>, written: Vec<Row>) {
    let mut changes = Vec::with_capacity(written.len());
    for row in written.into_iter().filter(|row| row.table == Rows::Policy) {
        let read = match &row.value {
            RowValue::Put(bytes) => read(&row.key, bytes).map(|(key, policy)| (key, Some(policy))),
            RowValue::Delete => PolicyKey::decode(&row.key)
                .map(|key| (key, None))
                .ok_or_else(|| StoreError::Corrupt(format!("policy key {:?}", row.key))),
            RowValue::Keep => continue,
        };
        match read {
            Ok(change) => changes.push(change),
            // Kept as written; refused at open, as at the write.
            Err(e) => tracing::error!(error = %e, "a policy written does not read"),
        }
    }
    table.send_modify(|table| {
        let table = Arc::make_mut(table);
        for (key, policy) in changes {
            table.set(key, policy);
        }
    });
}

fn read(key: &[u8], bytes: &[u8]) -> Result<(PolicyKey, TopicPolicy), StoreError> {
    let key = PolicyKey::decode(key).ok_or_else(|| StoreError::Corrupt(format!("policy key {key:?}")))?;
    let policy: TopicPolicy = prost::Message::decode(bytes)
        .map_err(|e| StoreError::Corrupt(format!("the policy of {}: {e}", key.describe())))?;
    Ok((key, policy))
}
