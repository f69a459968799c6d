//! Dispatch policies in cluster mode: a change is a record in every
//! partition of the schedule log, appended by whichever node took the
//! call, so that every shard's store, wherever it is and whoever owns it
//! later, applies it from its own partition (see the log's `Policy`
//! records). Answered once every partition has it and the shards this
//! node owns have applied it.

use std::time::Duration;

use futures_util::future;

use super::{Cluster, log::record::LogRecord, replica};
use crate::{
    policy::PolicyWrite,
    store::{Store, StoreError},
};

/// How long a change, once in the log, may take to be applied here.
const APPLY_WAIT: Duration = Duration::from_secs(10);

impl Cluster {
    pub(super) async fn write_policies(&self, writes: Vec<PolicyWrite>) -> Result<(), StoreError> {
        let log = self.log();
        let writer = self.me();
        let mut appends = Vec::new();
        for partition in 0..self.partitions() as i32 {
            for write in &writes {
                let (key, change) = replica::policy(write);
                let record = LogRecord { writer, request: 0, change: Some(change) };
                appends.push(log.enqueue(partition, &key, Some(&record.encode())));
            }
        }
        for appended in future::join_all(appends).await {
            appended.map_err(|e| {
                StoreError::LogUnavailable(format!(
                    "the schedule log {} did not take the policy change: {e}; retry (a change is the same \
                     however often it is made)",
                    log.topic()
                ))
            })?;
        }
        let stores: Vec<Store> = self.owned().into_iter().map(|(_, owned)| owned.store().clone()).collect();
        let applied = future::join_all(stores.iter().map(|store| applied(store, &writes)));
        match tokio::time::timeout(APPLY_WAIT, applied).await {
            Ok(answers) => answers.into_iter().collect(),
            Err(_) => Err(StoreError::LogUnavailable(
                "the policy change is in the schedule log but was not applied here in time; every shard \
                 applies it as it reads its partition"
                    .to_owned(),
            )),
        }
    }
}

/// Resolves once `store`'s table has each of `writes`, or a later change of
/// its policy (an error, naming it).
async fn applied(store: &Store, writes: &[PolicyWrite]) -> Result<(), StoreError> {
    let mut table = store.policies();
    loop {
        let done = {
            let table = table.borrow_and_update();
            writes.iter().all(|w| match (&w.policy, table.last_change(&w.key)) {
                (Some(new), Some(kept)) => kept.updated_ms >= new.updated_ms,
                (Some(_), None) => false,
                (None, kept) => kept.is_none(),
            })
        };
        if done {
            // Kept as written, or superseded by a later change made
            // meanwhile through another node.
            let table = table.borrow();
            let superseded = writes.iter().find(|w| w.policy.as_ref() != table.last_change(&w.key));
            return match superseded {
                Some(w) => Err(StoreError::LogUnavailable(format!(
                    "the change of the policy of {} was superseded by a later one made meanwhile through \
                     another node; read it again (GetTopicPolicy)",
                    w.key.describe()
                ))),
                None => Ok(()),
            };
        }
        if table.changed().await.is_err() {
            return Ok(());
        }
    }
}
