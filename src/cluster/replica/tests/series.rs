//! Series records in the log.

use super::*;

/// A series record of the log: applied from the shard's owner only (one
/// fenced by a later claim decided from what the owner may have changed
/// since), its wake moved in the index; a deletion and its tombstone
/// leave nothing.
#[tokio::test]
async fn series_records_apply_from_the_owner_only_and_move_the_wake() {
    use crate::command::{Row, RowValue, Table};
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let write = |bytes: Option<&[u8]>, old: Option<u64>, wake: Option<u64>| Row {
        table: Table::Series,
        key: id("daily").as_bytes().to_vec(),
        value: bytes.map_or(RowValue::Delete, |b| RowValue::Put(b.to_vec())),
        old_wake: old.map(UnixMillis),
        wake: wake.map(UnixMillis),
    };
    let series = |w: Row| crate::cluster::replica::row(w, None).1;
    let waking = |store: &Store| {
        let store = store.clone();
        async move {
            store.reader().waking(Table::Series, UnixMillis(0), UnixMillis(u64::MAX - 1), 10).await.unwrap().0
        }
    };
    let daily = || id("daily").as_bytes().to_vec();
    let answers = store
        .apply(vec![
            claim(0, 1),
            logged_by(1, 1, series(write(Some(b"v1"), None, Some(100)))),
            // A node the log no longer names the owner.
            logged_by(2, 2, series(write(Some(b"stale"), Some(100), Some(50)))),
            logged_by(1, 3, series(write(Some(b"v2"), Some(100), Some(200)))),
        ])
        .await
        .unwrap();
    assert!(matches!(answers[1], Answer::Rows(Ok(()))), "{:?}", answers[1]);
    assert!(matches!(answers[2], Answer::Rows(Err(_))), "{:?}", answers[2]);
    assert_eq!(store.reader().row(Table::Series, daily()).await.unwrap().as_deref(), Some(&b"v2"[..]));
    assert_eq!(waking(&store).await, [(UnixMillis(200), daily())], "the old wake is gone");

    let key = record::row_key(Table::Series, &daily());
    let tombstone = record::read(
        Some(&key),
        None,
        [(crate::cluster::log::RECORD_HEADER, Some(record::FORMAT.as_bytes()))],
        true,
    );
    assert_eq!(tombstone, Entry::ForgetRow(Table::Series, daily()));
    store
        .apply(vec![
            logged_by(1, 4, series(write(None, Some(200), None))),
            entry(5, UnixMillis(0), tombstone, None),
        ])
        .await
        .unwrap();
    assert_eq!(store.reader().row(Table::Series, daily()).await.unwrap(), None);
    assert!(waking(&store).await.is_empty());
    assert_eq!(store.log_next(), 6);
    store.close().await;
}
