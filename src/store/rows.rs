//! The tables a shard keeps beside its messages ([`Table`]): rows written
//! in the writer's next commit (durable as messages are) and read back by
//! key, by page and by their wake index. What a row holds is its room's;
//! the store keeps any table alike.

use rocksdb::{Direction, IteratorMode, ReadOptions};

use super::{Reader, Store, StoreError, options::cf, schema, writer::Op};
use crate::{
    command::{Row, Table},
    message::UnixMillis,
};

/// A row as a table keeps it: its key and its bytes.
pub(super) type KeptRow = (Vec<u8>, Vec<u8>);

impl Store {
    /// Writes `rows` in one commit; returns once it is durable (and a
    /// cached table's watchers see them).
    pub async fn write_rows(&self, rows: Vec<Row>) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        // What the log's rows are held to, a caller's are too: nothing is
        // kept that would not read back.
        if let Some(row) = rows.iter().find(|row| !row.table.admits(&row.key, &row.value)) {
            return Err(StoreError::Corrupt(format!(
                "{} would not read back: not written",
                row.table.describe(&row.key)
            )));
        }
        self.call(|reply| Op::Rows { rows, reply }).await
    }
}

impl Reader {
    /// The bytes of row `key` of `table`, if there is one.
    pub async fn row(&self, table: Table, key: Vec<u8>) -> Result<Option<Vec<u8>>, StoreError> {
        self.store
            .blocking(move |s| {
                let db = &s.inner.db;
                Ok(db.get_cf(cf(db, schema::CF_CHECKPOINT), schema::row_key(table, &key))?)
            })
            .await
    }

    /// The bytes of each of the rows `keys` of `table`, in order, in one
    /// read.
    pub async fn rows(&self, table: Table, keys: Vec<Vec<u8>>) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.store
            .blocking(move |s| {
                let db = &s.inner.db;
                let checkpoint = cf(db, schema::CF_CHECKPOINT);
                let keys: Vec<_> = keys.iter().map(|key| (checkpoint, schema::row_key(table, key))).collect();
                db.multi_get_cf(keys).into_iter().map(|r| r.map_err(StoreError::from)).collect()
            })
            .await
    }

    /// Up to `limit` rows of `table` whose keys start with `start` (a
    /// tenant's space: `\0 tenant \0`), in key order, after `after`;
    /// `shared`: of the shared space, whose keys never start with `\0`.
    pub async fn row_page(
        &self,
        table: Table,
        start: Vec<u8>,
        after: Option<Vec<u8>>,
        limit: usize,
        shared: bool,
    ) -> Result<Vec<KeptRow>, StoreError> {
        self.store
            .blocking(move |s| {
                let db = &s.inner.db;
                let prefix = schema::row_prefix(table, &start);
                let from = match &after {
                    Some(key) => {
                        let mut k = schema::row_key(table, key);
                        k.push(0);
                        k
                    }
                    // Past every tenant's rows (their keys start with 0).
                    None if shared => schema::row_prefix(table, &[1]),
                    None => prefix.clone(),
                };
                let mut opts = ReadOptions::default();
                opts.set_iterate_upper_bound(schema::row_end(table));
                let mut page = Vec::new();
                let iter = db.iterator_cf_opt(
                    cf(db, schema::CF_CHECKPOINT),
                    opts,
                    IteratorMode::From(&from, Direction::Forward),
                );
                for item in iter {
                    let (stored, value) = item?;
                    if !stored.starts_with(&prefix) || page.len() >= limit {
                        break;
                    }
                    let key = schema::decode_row_key(table, &stored).unwrap_or_default();
                    if shared && key.first() == Some(&0) {
                        continue;
                    }
                    page.push((key.to_vec(), value.into_vec()));
                }
                Ok(page)
            })
            .await
    }

    /// Up to `limit` rows of `table` whose wake is at or before `until`
    /// (none is below `from`), earliest first; and the earliest wake after
    /// them, if any.
    pub async fn waking(
        &self,
        table: Table,
        from: UnixMillis,
        until: UnixMillis,
        limit: usize,
    ) -> Result<(Vec<(UnixMillis, Vec<u8>)>, Option<UnixMillis>), StoreError> {
        self.store
            .blocking(move |s| {
                let db = &s.inner.db;
                let start = schema::wake_bound(table, UnixMillis(from.0.saturating_sub(1)));
                let bound = schema::wake_bound(table, until);
                let mut opts = ReadOptions::default();
                // Past the index: a walk ends there, not at the next key.
                opts.set_iterate_upper_bound(schema::wake_end(table));
                let mut due = Vec::new();
                let iter = db.iterator_cf_opt(
                    cf(db, schema::CF_CHECKPOINT),
                    opts,
                    IteratorMode::From(&start, Direction::Forward),
                );
                for item in iter {
                    let (key, _) = item?;
                    let (at, row) = schema::decode_wake_key(table, &key)
                        .ok_or_else(|| StoreError::Corrupt(format!("undecodable wake key {key:?}")))?;
                    if *key >= *bound || due.len() >= limit {
                        return Ok((due, Some(at)));
                    }
                    due.push((at, row.to_vec()));
                }
                Ok((due, None))
            })
            .await
    }
}

/// Every row of `table` in `db`, in key order (a cached table's, at open).
pub(super) fn all(db: &rocksdb::DB, table: Table) -> Result<Vec<KeptRow>, StoreError> {
    let mut opts = ReadOptions::default();
    opts.set_iterate_upper_bound(schema::row_end(table));
    let start = schema::row_prefix(table, &[]);
    let mut rows = Vec::new();
    for item in db.iterator_cf_opt(
        cf(db, schema::CF_CHECKPOINT),
        opts,
        IteratorMode::From(&start, Direction::Forward),
    ) {
        let (k, v) = item?;
        let key = schema::decode_row_key(table, &k).unwrap_or_default();
        rows.push((key.to_vec(), v.into_vec()));
    }
    Ok(rows)
}
