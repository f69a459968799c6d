//! Rows of tables every shard keeps (`crate::command::Spread::Everywhere`,
//! the dispatch policies) in cluster mode: a change is a record in every
//! partition of the schedule log, appended by whichever node took the
//! call, so that every shard's store, wherever it is and whoever owns it
//! later, applies it from its own partition (see the log's rows). Answered
//! once every partition has it and the shards this node owns have applied
//! it.

use futures_util::future;

use super::{Cluster, log::record::LogRecord, replica};
use crate::{command::Row, store::StoreError};

impl Cluster {
    pub(super) async fn write_everywhere(&self, rows: Vec<Row>) -> Result<(), StoreError> {
        let log = self.log();
        let writer = self.me();
        let owned = self.owned();
        let mut appends = Vec::new();
        let mut applied = Vec::new();
        for partition in 0..self.partitions() {
            match owned.iter().find(|(p, _)| *p == partition) {
                // Appended and waited for until applied here.
                Some((_, shard)) => applied.push(shard.front().write_rows(rows.clone())),
                None => {
                    for row in &rows {
                        let (key, change) = replica::row(row.clone(), None);
                        let record = LogRecord { writer, request: 0, change: Some(change) };
                        appends.push(log.enqueue(partition as i32, &key, Some(&record.encode())));
                    }
                }
            }
        }
        let (appended, applied) = future::join(future::join_all(appends), future::join_all(applied)).await;
        for appended in appended {
            appended.map_err(|e| {
                StoreError::LogUnavailable(format!(
                    "the schedule log {} did not take the change: {e}; retry (a change is the same however often \
                     it is made)",
                    log.topic()
                ))
            })?;
        }
        applied.into_iter().collect()
    }
}
