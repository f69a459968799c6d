//! The dispatch policies a store keeps (see [`crate::policy`]): written in
//! one durable commit, read into a table at open, and handed to whoever
//! watches them (the dispatcher, the admin API) after each commit that
//! changed them.

use std::sync::Arc;

use rocksdb::{DB, Direction, IteratorMode, ReadOptions};
use tokio::sync::watch;

use super::{Store, StoreError, options::cf, schema, writer::Op};
use crate::policy::{PolicyWrite, Table, TopicPolicy};

impl Store {
    /// Writes `writes` in one commit; returns once it is durable and the
    /// table watchers see has them.
    pub async fn write_policies(&self, writes: Vec<PolicyWrite>) -> Result<(), StoreError> {
        if writes.is_empty() {
            return Ok(());
        }
        self.call(|reply| Op::Policy { writes, reply }).await
    }

    /// The policies as they are now, and each change after this.
    pub fn policies(&self) -> watch::Receiver<Arc<Table>> {
        self.inner.policies.subscribe()
    }
}

/// Every policy kept in `db`.
pub(super) fn load(db: &DB) -> Result<Table, StoreError> {
    let mut opts = ReadOptions::default();
    opts.set_iterate_upper_bound(schema::policy_end());
    let start = schema::policy_start();
    let mut table = Table::default();
    for item in db.iterator_cf_opt(
        cf(db, schema::CF_CHECKPOINT),
        opts,
        IteratorMode::From(&start, Direction::Forward),
    ) {
        let (k, v) = item?;
        let key =
            schema::decode_policy_key(&k).ok_or_else(|| StoreError::Corrupt(format!("policy key {k:?}")))?;
        let policy: TopicPolicy = prost::Message::decode(&*v)
            .map_err(|e| StoreError::Corrupt(format!("the policy of {}: {e}", key.describe())))?;
        table.set(key, Some(policy));
    }
    Ok(table)
}
