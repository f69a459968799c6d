//! The tables' keys in the checkpoint CF ([`Table`]): each row under its
//! table's prefix and its key, and each entry of a table's wake index
//! under the index's prefix, its time and the row's key (the layout is
//! drawn at the top of the schema).

use crate::{command::Table, message::UnixMillis};

/// The first byte of a table's rows, and of its wake index: two bytes no
/// other key of the checkpoint CF starts with (a test checks).
fn prefixes(table: Table) -> (u8, u8) {
    match table {
        Table::Series => (b'S', b'w'),
        Table::Policy => (b'P', b'p'),
        // Its rows keep the keys of earlier builds' ingress offsets.
        Table::Ingress => (b'i', b'j'),
    }
}

/// Where row `key` of `table` is kept.
pub(crate) fn row_key(table: Table, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(prefixes(table).0);
    k.extend_from_slice(key);
    k
}

/// The first key of the rows of `table` whose keys start with `start`
/// (every row: an empty one).
pub(crate) fn row_prefix(table: Table, start: &[u8]) -> Vec<u8> {
    row_key(table, start)
}

/// The first key after every row of `table`.
pub(crate) fn row_end(table: Table) -> Vec<u8> {
    vec![prefixes(table).0 + 1]
}

/// The row key of a stored key of `table`.
pub(crate) fn decode_row_key(table: Table, key: &[u8]) -> Option<&[u8]> {
    key.strip_prefix(&[prefixes(table).0])
}

/// Row `key` of `table` next wakes at `at`.
pub(crate) fn wake_key(table: Table, at: UnixMillis, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.len());
    k.push(prefixes(table).1);
    k.extend_from_slice(&at.0.to_be_bytes());
    k.extend_from_slice(key);
    k
}

/// The first wake key of `table` after every wake at or before `t`.
pub(crate) fn wake_bound(table: Table, t: UnixMillis) -> Vec<u8> {
    let mut k = vec![prefixes(table).1];
    k.extend_from_slice(&t.0.saturating_add(1).to_be_bytes());
    k
}

/// The first key after every wake key of `table`.
pub(crate) fn wake_end(table: Table) -> Vec<u8> {
    vec![prefixes(table).1 + 1]
}

/// When and which row a wake key of `table` names.
pub(crate) fn decode_wake_key(table: Table, key: &[u8]) -> Option<(UnixMillis, &[u8])> {
    let rest = key.strip_prefix(&[prefixes(table).1])?;
    if rest.len() <= 8 {
        return None;
    }
    let (at, key) = rest.split_at(8);
    Some((UnixMillis(u64::from_be_bytes(at.try_into().ok()?)), key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_keep_the_keys_they_always_had() {
        // Stores written before rows were one pattern read on.
        assert_eq!(row_key(Table::Series, b"a"), b"Sa");
        assert_eq!(row_key(Table::Policy, b"\0t"), b"P\0t");
        assert_eq!(wake_key(Table::Series, UnixMillis(1), b"a"), b"w\0\0\0\0\0\0\0\x01a");
        assert_eq!(row_key(Table::Ingress, b"in\0\0\0\0\x03"), b"iin\0\0\0\0\x03");
    }

    #[test]
    fn no_two_tables_share_a_prefix() {
        let mut seen: Vec<u8> = Table::ALL.iter().flat_map(|t| [prefixes(*t).0, prefixes(*t).1]).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 2 * Table::ALL.len());
        use super::super::{
            COUNTS_PREFIX, DELIVERY_LOG_PREFIX, LOG_CHUNK_PREFIX, MARK_PREFIX, META_KEY, RETENTION_PREFIX,
            SETTLEMENT_PREFIX,
        };
        let others =
            [SETTLEMENT_PREFIX, RETENTION_PREFIX, COUNTS_PREFIX, DELIVERY_LOG_PREFIX, LOG_CHUNK_PREFIX];
        for taken in others.into_iter().chain([MARK_PREFIX, META_KEY[0]]) {
            assert!(!seen.contains(&taken), "{}", taken as char);
        }
    }

    #[test]
    fn a_wake_key_reads_back() {
        let key = wake_key(Table::Series, UnixMillis(42), b"\0acme\0x");
        assert_eq!(decode_wake_key(Table::Series, &key), Some((UnixMillis(42), &b"\0acme\0x"[..])));
        assert!(wake_key(Table::Series, UnixMillis(42), b"x") < wake_bound(Table::Series, UnixMillis(42)));
        assert!(wake_key(Table::Series, UnixMillis(43), b"x") >= wake_bound(Table::Series, UnixMillis(42)));
    }
}
