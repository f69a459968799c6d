//! The log's rows read as the `Series` and `Policy` records of earlier
//! builds were written, and are written as those builds read them: a
//! cluster of mixed builds agrees on every series and policy.

use super::*;
use crate::{
    cluster::log::{RECORD_HEADER, record::LogRecord},
    command::{Row, RowValue, Table},
    policy::{PolicyKey, TopicPolicy},
};

/// The series record as earlier builds declared it.
#[derive(Clone, PartialEq, prost::Message)]
struct EarlierSeries {
    #[prost(bytes = "vec", tag = "1")]
    id: Vec<u8>,
    #[prost(bytes = "vec", optional, tag = "2")]
    bytes: Option<Vec<u8>>,
    #[prost(uint64, optional, tag = "3")]
    old_wake_ms: Option<u64>,
    #[prost(uint64, optional, tag = "4")]
    wake_ms: Option<u64>,
}

/// The policy record as earlier builds declared it.
#[derive(Clone, PartialEq, prost::Message)]
struct EarlierPolicy {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    policy: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum EarlierChange {
    #[prost(message, tag = "11")]
    Series(EarlierSeries),
    #[prost(message, tag = "12")]
    Policy(EarlierPolicy),
}

#[derive(Clone, PartialEq, prost::Message)]
struct EarlierRecord {
    #[prost(uint64, tag = "1")]
    writer: u64,
    #[prost(uint64, tag = "2")]
    request: u64,
    #[prost(oneof = "EarlierChange", tags = "11, 12")]
    change: Option<EarlierChange>,
}

fn read(key: &[u8], value: &[u8]) -> Entry {
    record::read(Some(key), Some(value), [(RECORD_HEADER, Some(record::FORMAT.as_bytes()))], true)
}

#[test]
fn an_earlier_builds_series_and_policy_records_read_as_rows_and_rows_read_as_them() {
    let series = EarlierSeries {
        id: b"\0acme\0daily".to_vec(),
        bytes: Some(b"spec".to_vec()),
        old_wake_ms: Some(100),
        wake_ms: Some(200),
    };
    let policy = TopicPolicy { paused_at_ms: 5, updated_ms: 7, ..TopicPolicy::default() };
    let key = PolicyKey::topic_wide("orders").encode();
    let earlier_policy = EarlierPolicy { key: key.clone(), policy: prost::Message::encode_to_vec(&policy) };

    // What an earlier build wrote, read here: under the same keys.
    let row = Row {
        table: Table::Series,
        key: series.id.clone(),
        value: RowValue::Put(b"spec".to_vec()),
        old_wake: Some(UnixMillis(100)),
        wake: Some(UnixMillis(200)),
    };
    let (written_key, change) = crate::cluster::replica::row(row.clone(), None);
    assert_eq!(written_key, [&[record::SERIES_KEY_MARK][..], &series.id].concat());
    let earlier =
        EarlierRecord { writer: 1, request: 2, change: Some(EarlierChange::Series(series.clone())) };
    let Entry::Logged { change: read_back, .. } =
        read(&written_key, &prost::Message::encode_to_vec(&earlier))
    else {
        panic!("an earlier series record reads")
    };
    assert_eq!(read_back, change);

    let policy_row = Row::put(Table::Policy, key.clone(), prost::Message::encode_to_vec(&policy));
    let (policy_key, policy_change) = crate::cluster::replica::row(policy_row, None);
    assert_eq!(policy_key, [&[record::POLICY_KEY_MARK][..], &key].concat());
    let earlier =
        EarlierRecord { writer: 1, request: 0, change: Some(EarlierChange::Policy(earlier_policy.clone())) };
    let Entry::Logged { change: read_back, .. } = read(&policy_key, &prost::Message::encode_to_vec(&earlier))
    else {
        panic!("an earlier policy record reads")
    };
    assert_eq!(read_back, policy_change);

    // What this build writes, read by an earlier one: the same records.
    for (change, expected) in
        [(change, EarlierChange::Series(series)), (policy_change, EarlierChange::Policy(earlier_policy))]
    {
        let bytes = LogRecord { writer: 1, request: 2, change: Some(change) }.encode();
        let earlier: EarlierRecord = prost::Message::decode(&*bytes).unwrap();
        assert_eq!(earlier.change, Some(expected));
    }
}
