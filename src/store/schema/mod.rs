//! Key layout and value codecs of the three column families. Nothing outside
//! this file knows how a key or a value is laid out in bytes.
//!
//! ```text
//! CF due         dispatch_ms:u64be ‖ seq:u64be   → DueEntry: the message whole (the due index)
//! CF messages    message id                       → MessageRecord: whole, or where its due entry is
//! CF checkpoint  "m"                              → Meta (dispatcher progress, counters)
//!                "s" ‖ message id                 → Settlement (tries, delivery, cancel, failure)
//!                "r" ‖ settled_ms:u64be ‖ id      → ()   retention index, purged in order
//!                "d" ‖ first dispatch key         → DeliveryLog: a chunk delivered at first try
//!                "c" ‖ space ‖ topic              → Counts of one tenant's messages on one topic
//!                "o" ‖ topic ‖ 0 ‖ partition:i32be  → offset:i64be: none of this store's records
//!                                                   on the target partition lies before it
//!                "S" ‖ series id                  → a row of the series table (the series room's bytes)
//!                "w" ‖ wake_ms:u64be ‖ series id  → ()   when the series next parks an occurrence
//!                "P" ‖ tenant ‖ 0 ‖ topic         → a row of the policy table (a TopicPolicy)
//!                "p" ‖ wake_ms:u64be ‖ key        → ()   the policy table's wake index (unused)
//!                "i" ‖ topic ‖ 0 ‖ partition:i32be → next:i64be: a row of the ingress table, how far
//!                                                   an ingress partition was read ("j": its unused
//!                                                   wake index)
//! ```
//!
//! Each table (`crate::command::Table`) has a prefix for its rows and one
//! for its wake index ([`table`]); a new table takes two free bytes.
//!
//! A due entry holds the message whole, so the dispatcher reads what is due
//! in one sequential pass. The message is written once: while its due entry
//! lives, its `messages` entry is a locator (the record without its key,
//! value and headers, and [`MessageRecord::entry_at_ms`] saying where the
//! due entry is). A message that leaves the due index other than by a
//! first-try delivery (cancelled, failed, delivered after retries) gets its
//! record back whole in `messages`. Stores written before 0.2 hold the id
//! alone in a due entry; such an entry is read through the messages CF, as
//! it was written ([`DueValue::Legacy`]), and drains away as it is
//! dispatched.
//!
//! A due entry delivered at its first try stays where it is, as the record
//! of its message, until retention ends: a delivery writes one line of its
//! chunk's log and deletes nothing. Below [`Meta::floor`] no entry is
//! pending (the dispatcher starts there); at and above it, an entry a
//! delivery log lists is delivered, and every read of the due index skips
//! it ([`super::read::Logged`]). A new entry is never put below the floor or
//! below where the dispatcher reads, so the floor only rises. Retention
//! deletes a chunk's entries with one range delete once its range lies
//! below the floor. Before that, compaction drops the key, value and
//! headers of such an entry and keeps a digest of its content instead
//! ([`MessageRecord::digest`]; see `super::shed`).
//!
//! A message delivered at its first try gets no settlement and no retention
//! entry of its own: its delivery is one line of the delivery log of the
//! chunk it went out with. Chunks are logged in dispatch order and their
//! key ranges never overlap, so the one chunk that may hold a message is
//! found with one backward seek from its dispatch key. Everything else
//! (retries, cancels, failures, and deliveries that come back out of
//! order) is settled one message at a time, as before.
//!
//! A message id is stored as [`MessageId::as_bytes`] gives it: the id alone
//! in the shared space, `\0 tenant \0 id` in a tenant's. A space in a
//! counts key is `\0` for the shared one and `\1 tenant \0` for a tenant's.
//!
//! Big-endian integers make byte order equal numeric order, so iterating the
//! due CF walks messages in dispatch order; `seq` breaks ties in acceptance order
//! and makes every key unique. Values are protobuf (prost derives, no .proto
//! file): unknown fields are skipped, so a newer build can add fields and an
//! older one still reads the store.

pub(super) use crate::command::{Counts, DispatchKey, HeaderRecord, LabelRecord, MessageRecord};
use crate::message::{MessageId, UnixMillis};

mod meta;
mod peek;
mod table;
pub(super) use meta::*;
pub(super) use peek::peek_due_entry;
pub(super) use table::*;

pub(super) const CF_DUE: &str = "due";
pub(super) const CF_MESSAGES: &str = "messages";
pub(super) const CF_CHECKPOINT: &str = "checkpoint";

const META_KEY: &[u8] = b"m";
const SETTLEMENT_PREFIX: u8 = b's';
const RETENTION_PREFIX: u8 = b'r';
const COUNTS_PREFIX: u8 = b'c';
const DELIVERY_LOG_PREFIX: u8 = b'd';
const LOG_CHUNK_PREFIX: u8 = b'k';
const MARK_PREFIX: u8 = b'o';
/// The first byte of a due entry in the current layout. A legacy entry is
/// a bare id, whose first byte is printable or 0 (a tenant's space).
const DUE_ENTRY_MARK: u8 = 1;

/// The bytes of a due position: its time, then its sequence, both
/// big-endian, so that byte order is due order.
pub(super) const DUE_KEY_LEN: usize = 16;

impl DispatchKey {
    pub(in crate::store) fn encode(self) -> [u8; DUE_KEY_LEN] {
        let mut out = [0u8; DUE_KEY_LEN];
        out[..8].copy_from_slice(&self.at.0.to_be_bytes());
        out[8..].copy_from_slice(&self.seq.to_be_bytes());
        out
    }

    pub(in crate::store) fn decode(bytes: &[u8]) -> Option<DispatchKey> {
        let bytes: &[u8; DUE_KEY_LEN] = bytes.try_into().ok()?;
        let (at, seq) = bytes.split_at(8);
        Some(DispatchKey {
            at: UnixMillis(u64::from_be_bytes(at.try_into().ok()?)),
            seq: u64::from_be_bytes(seq.try_into().ok()?),
        })
    }
}

pub(super) fn meta_key() -> &'static [u8] {
    META_KEY
}

pub(super) fn settlement_key(id: &MessageId) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + id.as_bytes().len());
    k.push(SETTLEMENT_PREFIX);
    k.extend_from_slice(id.as_bytes());
    k
}

/// The key range holding every settlement.
pub(super) fn settlements_range() -> (Vec<u8>, Vec<u8>) {
    (vec![SETTLEMENT_PREFIX], vec![SETTLEMENT_PREFIX + 1])
}

pub(super) fn retention_key(settled_at: UnixMillis, id: &MessageId) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + id.as_bytes().len());
    k.push(RETENTION_PREFIX);
    k.extend_from_slice(&settled_at.0.to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

/// The retention index range holding everything settled before `t`.
pub(super) fn retention_range_before(t: UnixMillis) -> (Vec<u8>, Vec<u8>) {
    (vec![RETENTION_PREFIX], {
        let mut k = vec![RETENTION_PREFIX];
        k.extend_from_slice(&t.0.to_be_bytes());
        k
    })
}

/// Where a purge goes on from: the first retention key after `key`.
pub(super) fn retention_successor(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// The key of the delivery log of a chunk whose first message was
/// dispatched from `first`.
pub(super) fn delivery_log_key(first: DispatchKey) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + DUE_KEY_LEN);
    k.push(DELIVERY_LOG_PREFIX);
    k.extend_from_slice(&first.encode());
    k
}

/// The key range holding every delivery log.
pub(super) fn delivery_logs_range() -> (Vec<u8>, Vec<u8>) {
    (vec![DELIVERY_LOG_PREFIX], vec![DELIVERY_LOG_PREFIX + 1])
}

/// The first dispatch key of the chunk a delivery log key names.
pub(super) fn decode_delivery_log_key(key: &[u8]) -> Option<DispatchKey> {
    DispatchKey::decode(key.strip_prefix(&[DELIVERY_LOG_PREFIX])?)
}

/// Cluster mode: the index entry of a chunk's record in the schedule log,
/// by its key there (which begins with the chunk's time, so the index
/// sorts by it): kept until the chunk's retention ends and its tombstone
/// is applied.
pub(super) fn log_chunk_key(chunk: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + chunk.len());
    k.push(LOG_CHUNK_PREFIX);
    k.extend_from_slice(chunk);
    k
}

/// Cluster mode: what a [`log_chunk_key`] entry keeps: the ids its chunk
/// settled. Its tombstone waits until every one of them is forgotten.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct LogChunk {
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub ids: Vec<Vec<u8>>,
}

/// The chunk key a [`log_chunk_key`] names.
pub(super) fn decode_log_chunk_key(key: &[u8]) -> Option<&[u8]> {
    key.strip_prefix(&[LOG_CHUNK_PREFIX])
}

/// The key of a target partition's mark: where a search for this store's
/// records on it may start (see `crate::dispatcher::reconcile`). Kafka's
/// topic names never hold a 0 byte.
pub(super) fn mark_key(topic: &str, partition: i32) -> Vec<u8> {
    let mut k = mark_prefix(topic);
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

/// The key prefix of every mark of `topic`.
pub(super) fn mark_prefix(topic: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + topic.len() + 4);
    k.push(MARK_PREFIX);
    k.extend_from_slice(topic.as_bytes());
    k.push(0);
    k
}

/// The key range holding every mark.
pub(super) fn marks_range() -> (Vec<u8>, Vec<u8>) {
    (vec![MARK_PREFIX], vec![MARK_PREFIX + 1])
}

/// The topic and partition a [`mark_key`] names, and the offset its value
/// holds.
pub(super) fn decode_mark(key: &[u8], value: &[u8]) -> Option<(String, i32, i64)> {
    let rest = key.strip_prefix(&[MARK_PREFIX])?;
    let (partition, topic) = rest.split_last_chunk::<4>().map(|(t, p)| (i32::from_be_bytes(*p), t))?;
    let topic = std::str::from_utf8(topic.strip_suffix(&[0])?).ok()?;
    Some((topic.to_owned(), partition, i64::from_be_bytes(value.try_into().ok()?)))
}

/// Whose messages on which topic a [`Counts`] entry counts: a tenant's
/// (none: the shared space) on one topic.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct CountsKey {
    pub tenant: Option<String>,
    pub topic: String,
}

impl CountsKey {
    pub(super) fn of(id: &MessageId, topic: &str) -> CountsKey {
        CountsKey { tenant: id.tenant().map(str::to_owned), topic: topic.to_owned() }
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut k = vec![COUNTS_PREFIX];
        match &self.tenant {
            None => k.push(0),
            Some(t) => {
                k.push(1);
                k.extend_from_slice(t.as_bytes());
                k.push(0);
            }
        }
        k.extend_from_slice(self.topic.as_bytes());
        k
    }

    pub(super) fn decode(key: &[u8]) -> Option<CountsKey> {
        let rest = key.strip_prefix(&[COUNTS_PREFIX])?;
        let (tenant, topic) = match rest.split_first()? {
            (0, topic) => (None, topic),
            (1, rest) => {
                let end = rest.iter().position(|b| *b == 0)?;
                (Some(std::str::from_utf8(&rest[..end]).ok()?.to_owned()), &rest[end + 1..])
            }
            _ => return None,
        };
        Some(CountsKey { tenant, topic: std::str::from_utf8(topic).ok()?.to_owned() })
    }

    /// The key range holding every counts entry.
    pub(super) fn range() -> (Vec<u8>, Vec<u8>) {
        (vec![COUNTS_PREFIX], vec![COUNTS_PREFIX + 1])
    }
}

impl Counts {
    /// The count of messages settled `kind`; for one retrying, pending.
    pub fn of_kind(&mut self, kind: SettlementKind) -> &mut u64 {
        match kind {
            SettlementKind::Retrying => &mut self.pending,
            SettlementKind::Delivered => &mut self.delivered,
            SettlementKind::Cancelled => &mut self.cancelled,
            SettlementKind::Failed => &mut self.failed,
            SettlementKind::Expired => &mut self.expired,
            SettlementKind::DeadLettered => &mut self.dead_lettered,
        }
    }
}

pub(super) fn decode_retention_key(key: &[u8]) -> Option<(UnixMillis, MessageId)> {
    let rest = key.strip_prefix(&[RETENTION_PREFIX])?;
    if rest.len() < 8 {
        return None;
    }
    let (at, id) = rest.split_at(8);
    Some((UnixMillis(u64::from_be_bytes(at.try_into().ok()?)), MessageId::from_stored(id)?))
}

impl MessageRecord {
    /// The message's due time (moves on reschedule).
    pub fn due(&self) -> UnixMillis {
        UnixMillis(self.due_ms)
    }

    /// The locator of this record: what the messages CF holds while the
    /// due entry at [`MessageRecord::entry_at_ms`] holds the message whole.
    pub fn locator(&self) -> MessageRecord {
        MessageRecord {
            topic: self.topic.clone(),
            key: None,
            value: Vec::new(),
            headers: Vec::new(),
            partition: self.partition,
            due_ms: self.due_ms,
            seq: self.seq,
            scheduled_at_ms: self.scheduled_at_ms,
            requested_at_ms: self.requested_at_ms,
            requested_delay_ms: self.requested_delay_ms,
            entry_at_ms: self.entry_at_ms,
            labels: Vec::new(),
            max_lateness_ms: self.max_lateness_ms,
            dead_letter_topic: self.dead_letter_topic.clone(),
            digest: None,
        }
    }

    /// Whether this is a locator: the message whole is in its due entry.
    pub fn is_locator(&self) -> bool {
        self.entry_at_ms.is_some()
    }
}

/// A due entry: the message whole, with its tries so far.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct DueEntry {
    /// The message id, as [`MessageId::as_bytes`] stores it.
    #[prost(bytes = "vec", tag = "1")]
    pub id: Vec<u8>,
    #[prost(message, optional, tag = "2")]
    pub record: Option<MessageRecord>,
    /// Present when the message has a settlement entry (it was tried, or
    /// rescheduled after a try): what the retry policy and a listing need of it.
    #[prost(message, optional, tag = "3")]
    pub tries: Option<TriesRecord>,
}

/// A pending message's tries, as its settlement holds them.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct TriesRecord {
    #[prost(uint32, tag = "1")]
    pub attempts: u32,
    #[prost(uint32, tag = "2")]
    pub rejections: u32,
    #[prost(uint64, tag = "3")]
    pub first_refused_at_ms: u64,
    #[prost(string, tag = "4")]
    pub last_error: String,
}

impl TriesRecord {
    pub(super) fn of(s: &Settlement) -> TriesRecord {
        TriesRecord {
            attempts: s.attempts,
            rejections: s.rejections,
            first_refused_at_ms: s.first_refused_at_ms,
            last_error: s.last_error.clone(),
        }
    }
}

/// What a due entry holds.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum DueValue {
    Entry(Box<DueEntry>),
    /// Written before 0.2: the id alone; the record and the settlement are
    /// read from their own entries.
    Legacy(MessageId),
}

/// The due entry of `record` (with `id` and its tries), encoded from the
/// parts without copying them into a [`DueEntry`] first.
pub(super) fn encode_due_parts(id: &[u8], record: &MessageRecord, tries: Option<&TriesRecord>) -> Vec<u8> {
    use prost::encoding;
    let len = encoding::key_len(1)
        + encoding::encoded_len_varint(id.len() as u64)
        + id.len()
        + encoding::message::encoded_len(2, record)
        + tries.map_or(0, |t| encoding::message::encoded_len(3, t));
    let mut out = Vec::with_capacity(1 + len);
    out.push(DUE_ENTRY_MARK);
    encoding::encode_key(1, encoding::WireType::LengthDelimited, &mut out);
    encoding::encode_varint(id.len() as u64, &mut out);
    out.extend_from_slice(id);
    encoding::message::encode(2, record, &mut out);
    if let Some(tries) = tries {
        encoding::message::encode(3, tries, &mut out);
    }
    out
}

pub(super) fn decode_due_value(bytes: &[u8]) -> Option<DueValue> {
    match bytes.split_first() {
        Some((&DUE_ENTRY_MARK, rest)) => {
            let entry: DueEntry = decode(rest).ok()?;
            if !MessageId::is_stored_form(&entry.id) {
                return None;
            }
            entry.record.as_ref()?;
            Some(DueValue::Entry(Box::new(entry)))
        }
        _ => MessageId::from_stored(bytes).map(DueValue::Legacy),
    }
}

/// A due entry of the current layout without its message's key, value and
/// headers, and with the digest of its content instead; `None` if it is
/// none, or shed already.
pub(super) fn shed_due_value(bytes: &[u8]) -> Option<Vec<u8>> {
    let (&DUE_ENTRY_MARK, rest) = bytes.split_first()? else { return None };
    let mut entry: DueEntry = decode(rest).ok()?;
    let record = entry.record.as_mut().filter(|r| r.digest.is_none())?;
    record.shed();
    Some(encode_due_parts(&entry.id, record, entry.tries.as_ref()))
}

/// What one chunk delivered at first try: one line per message, in
/// dispatch order. `first` (in the key) and `last` bound the chunk: no
/// other chunk's range overlaps it.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct DeliveryLog {
    /// The dispatch key of the last line, encoded.
    #[prost(bytes = "vec", tag = "1")]
    pub last: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    pub lines: Vec<DeliveryLine>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct DeliveryLine {
    #[prost(bytes = "vec", tag = "1")]
    pub id: Vec<u8>,
    /// The dispatch key the message went out from.
    #[prost(uint64, tag = "2")]
    pub at_ms: u64,
    #[prost(uint64, tag = "3")]
    pub seq: u64,
    #[prost(int32, tag = "4")]
    pub partition: i32,
    #[prost(int64, tag = "5")]
    pub offset: i64,
    #[prost(uint64, tag = "6")]
    pub delivered_at_ms: u64,
}

/// The last dispatch key of an encoded [`DeliveryLog`], read without
/// decoding its lines (prost writes field 1 first).
pub(super) fn delivery_log_last(bytes: &[u8]) -> Option<DispatchKey> {
    const LAST_FIELD: [u8; 2] = [0x0a, DUE_KEY_LEN as u8];
    match bytes.strip_prefix(&LAST_FIELD[..]) {
        Some(rest) if rest.len() >= DUE_KEY_LEN => DispatchKey::decode(&rest[..DUE_KEY_LEN]),
        _ => decode::<DeliveryLog>(bytes).ok()?.last_key(),
    }
}

impl DeliveryLog {
    pub(super) fn last_key(&self) -> Option<DispatchKey> {
        DispatchKey::decode(&self.last)
    }

    /// When the latest of its lines was delivered.
    pub(super) fn delivered_until(&self) -> UnixMillis {
        UnixMillis(self.lines.iter().map(|l| l.delivered_at_ms).max().unwrap_or(0))
    }
}

impl DeliveryLine {
    /// The settlement this line stands for.
    pub(super) fn settlement(&self) -> Settlement {
        Settlement {
            kind: SettlementKind::Delivered as i32,
            attempts: 1,
            at_ms: self.delivered_at_ms,
            partition: self.partition,
            offset: self.offset,
            ..Settlement::default()
        }
    }
}

/// What has happened to a message since it was parked. Absent = pending and
/// never tried, or delivered at first try (see [`DeliveryLog`]).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Settlement {
    #[prost(enumeration = "SettlementKind", tag = "1")]
    pub kind: i32,
    /// Produce tries so far.
    #[prost(uint32, tag = "2")]
    pub attempts: u32,
    /// Tries the broker refused for this message itself (not outages); these
    /// count toward the delivery attempt limit.
    #[prost(uint32, tag = "3")]
    pub rejections: u32,
    #[prost(string, tag = "4")]
    pub last_error: String,
    /// Retrying: when the next try is due.
    #[prost(uint64, tag = "5")]
    pub retry_at_ms: u64,
    /// Delivered, cancelled or failed: when.
    #[prost(uint64, tag = "6")]
    pub at_ms: u64,
    #[prost(int32, tag = "7")]
    pub partition: i32,
    #[prost(int64, tag = "8")]
    pub offset: i64,
    /// When the broker first refused this message itself; 0 if it never
    /// did. A message is failed only once refusals have gone on this long
    /// enough, and numerous enough.
    #[prost(uint64, tag = "9")]
    pub first_refused_at_ms: u64,
    /// Expired, or dead-lettered after it expired: the deadline that
    /// passed.
    #[prost(uint64, tag = "10")]
    pub deadline_ms: u64,
    /// Dead-lettered: the topic it went to (`partition` and `offset` say
    /// where on it). It expired if `deadline_ms` is set, else it failed
    /// with `last_error`.
    #[prost(string, tag = "11")]
    pub dead_letter_topic: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum SettlementKind {
    Retrying = 0,
    Delivered = 1,
    Cancelled = 2,
    Failed = 3,
    /// Its deadline passed before it was produced.
    Expired = 4,
    /// It failed or expired, and was produced to its dead-letter topic.
    DeadLettered = 5,
}

impl Settlement {
    pub(crate) fn is_settled(&self) -> bool {
        self.kind() != SettlementKind::Retrying
    }

    pub(crate) fn settled_at(&self) -> Option<UnixMillis> {
        self.is_settled().then_some(UnixMillis(self.at_ms))
    }
}

pub(super) fn encode<M: prost::Message>(m: &M) -> Vec<u8> {
    m.encode_to_vec()
}

pub(super) fn decode<M: prost::Message + Default>(bytes: &[u8]) -> Result<M, prost::DecodeError> {
    M::decode(bytes)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::message::{DueSpec, Envelope, Header};

    fn key() -> impl Strategy<Value = DispatchKey> {
        (any::<u64>(), any::<u64>()).prop_map(|(d, s)| DispatchKey { at: UnixMillis(d), seq: s })
    }

    proptest! {
        #[test]
        fn marks_round_trip_and_a_topic_s_marks_share_a_prefix_no_other_topic_has(
            topic in "[A-Za-z0-9._-]{1,249}", other in "[A-Za-z0-9._-]{1,249}",
            partition in 0..i32::MAX, offset in 0..i64::MAX
        ) {
            let key = mark_key(&topic, partition);
            prop_assert_eq!(decode_mark(&key, &offset.to_be_bytes()), Some((topic.clone(), partition, offset)));
            prop_assert!(key.starts_with(&mark_prefix(&topic)));
            prop_assert_eq!(key.starts_with(&mark_prefix(&other)), topic == other);
            let (lo, hi) = marks_range();
            prop_assert!(key >= lo && key < hi);
        }

        #[test]
        fn counts_keys_round_trip_and_stay_in_their_range(
            tenant in proptest::option::of("[A-Za-z0-9._-]{1,64}"), topic in "[A-Za-z0-9._-]{1,249}"
        ) {
            let key = CountsKey { tenant, topic };
            let bytes = key.encode();
            prop_assert_eq!(CountsKey::decode(&bytes), Some(key));
            let (lo, hi) = CountsKey::range();
            prop_assert!(bytes >= lo && bytes < hi);
            prop_assert!(bytes.as_slice() != meta_key() && ![SETTLEMENT_PREFIX, RETENTION_PREFIX, DELIVERY_LOG_PREFIX].contains(&bytes[0]));
        }

        #[test]
        fn retention_successor_is_the_next_key(at in any::<u64>(), id in "[!-~]{1,128}", other in "[!-~]{1,128}") {
            let id = MessageId::parse(&id).unwrap();
            let key = retention_key(UnixMillis(at), &id);
            let next = retention_successor(&key);
            prop_assert!(next > key);
            let later = retention_key(UnixMillis(at), &MessageId::parse(&other).unwrap());
            prop_assert!(later <= key || later >= next, "nothing lies between a key and its successor");
        }

        #[test]
        fn due_values_of_both_layouts_read_back(
            id in "[!-~]{1,128}", tenant in proptest::option::of("[a-z0-9-]{1,32}"), attempts in proptest::option::of(1u32..10)
        ) {
            let tenant = tenant.map(|t| crate::message::Tenant::parse(&t).unwrap());
            let id = MessageId::parse_in(tenant.as_ref(), &id).unwrap();
            prop_assert_eq!(decode_due_value(id.as_bytes()), Some(DueValue::Legacy(id.clone())));
            let envelope = Envelope { topic: "t".into(), value: vec![1], ..Default::default() };
            let record = MessageRecord::new(envelope, DueSpec::At(UnixMillis(5)), UnixMillis(5), 9, UnixMillis(1));
            let entry = DueEntry {
                id: id.as_bytes().to_vec(),
                record: Some(record),
                tries: attempts.map(|attempts| TriesRecord { attempts, ..TriesRecord::default() }),
            };
            prop_assert_eq!(
                encode_due_parts(&entry.id, entry.record.as_ref().unwrap(), entry.tries.as_ref()),
                encode_due_entry(&entry)
            );
            let peeked = peek_due_entry(&encode_due_entry(&entry)).map(|(i, t)| (i.to_vec(), t.to_vec()));
            prop_assert_eq!(peeked, Some((entry.id.clone(), b"t".to_vec())), "the id and topic, read without decoding");
            prop_assert_eq!(peek_due_entry(id.as_bytes()), None, "a legacy entry has no topic in it");
            prop_assert_eq!(decode_due_value(&encode_due_entry(&entry)), Some(DueValue::Entry(Box::new(entry))));
        }

        #[test]
        fn delivery_log_keys_sort_like_their_chunks(a in key(), b in key()) {
            let (ka, kb) = (delivery_log_key(a), delivery_log_key(b));
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            prop_assert_eq!(decode_delivery_log_key(&ka), Some(a));
            let (lo, hi) = delivery_logs_range();
            prop_assert!(ka >= lo && ka < hi);
        }

        #[test]
        fn dispatch_key_round_trips(k in key()) {
            prop_assert_eq!(DispatchKey::decode(&k.encode()), Some(k));
        }

        #[test]
        fn dispatch_key_bytes_sort_like_keys(a in key(), b in key()) {
            prop_assert_eq!(a.encode().cmp(&b.encode()), a.cmp(&b));
        }

        #[test]
        fn successor_is_next(k in key()) {
            let next = k.successor();
            prop_assume!(k != DispatchKey { at: UnixMillis(u64::MAX), seq: u64::MAX });
            prop_assert!(next > k);
            prop_assert!(next.encode() > k.encode());
        }

        #[test]
        fn after_bounds_everything_due_by_t(t in 0u64..u64::MAX - 1, seq in any::<u64>()) {
            let bound = DispatchKey::after(UnixMillis(t));
            let (at_t, after_t) = (DispatchKey { at: UnixMillis(t), seq }, DispatchKey { at: UnixMillis(t + 1), seq });
            prop_assert!(at_t < bound);
            prop_assert!(after_t >= bound);
        }

        #[test]
        fn retention_keys_round_trip_and_sort_by_time(
            a in any::<u64>(), b in any::<u64>(), id in "[!-~]{1,128}"
        ) {
            let id = MessageId::parse(&id).unwrap();
            let ka = retention_key(UnixMillis(a), &id);
            prop_assert_eq!(decode_retention_key(&ka), Some((UnixMillis(a), id.clone())));
            let kb = retention_key(UnixMillis(b), &id);
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            let (lo, hi) = retention_range_before(UnixMillis(a));
            prop_assert!(ka >= lo && ka >= hi, "settled at t is not before t");
            let (_, hi_after) = retention_range_before(UnixMillis(a.saturating_add(1)));
            prop_assert!(a == u64::MAX || ka < hi_after);
        }

        #[test]
        fn message_record_round_trips(
            topic in "[a-z]{1,20}",
            key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..32)),
            value in proptest::collection::vec(any::<u8>(), 1..256),
            headers in proptest::collection::vec(("[a-z]{1,8}", proptest::collection::vec(any::<u8>(), 0..16)), 0..4),
            partition in proptest::option::of(0i32..100),
            due in any::<u64>(), seq in any::<u64>(), delay in proptest::option::of(0u64..1 << 40),
        ) {
            let envelope = Envelope {
                topic, key, value, partition,
                headers: headers.into_iter().map(|(key, value)| Header { key, value }).collect(),
                labels: Default::default(),
                max_lateness: None,
                dead_letter_topic: None,
            };
            let requested = match delay {
                Some(d) => DueSpec::After(Duration::from_millis(d)),
                None => DueSpec::At(UnixMillis(due)),
            };
            let record = MessageRecord::new(envelope.clone(), requested, UnixMillis(due), seq, UnixMillis(7));
            let back: MessageRecord = decode(&encode(&record)).unwrap();
            prop_assert_eq!(&back, &record);
            prop_assert_eq!(back.envelope(), envelope.clone());
            prop_assert!(back.is_same_request(&envelope, requested));
        }
    }

    /// A due entry encoded whole: what [`encode_due_parts`] must equal.
    fn encode_due_entry(entry: &DueEntry) -> Vec<u8> {
        let mut out = vec![DUE_ENTRY_MARK];
        prost::Message::encode(entry, &mut out).expect("a Vec grows to fit");
        out
    }

    #[test]
    fn meta_without_the_newer_counters_reads_as_zero() {
        #[derive(Clone, PartialEq, prost::Message)]
        struct OldMeta {
            #[prost(uint64, tag = "2")]
            pending: u64,
            #[prost(uint64, tag = "4")]
            delivered_total: u64,
        }
        let meta: Meta = decode(&encode(&OldMeta { pending: 3, delivered_total: 9 })).unwrap();
        assert_eq!(
            (meta.pending, meta.delivered_total, meta.cancelled_total, meta.failed_total),
            (3, 9, 0, 0)
        );
        assert!(!meta.closed_cleanly, "an older store is not known to have closed cleanly");
        assert_eq!(meta.counts_version, 0, "and holds no counts entries");
    }
}
