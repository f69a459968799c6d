//! A message as a shard keeps it: what the client sent, when it is due,
//! and the bookkeeping a retried request is recognised by. The same record
//! is the store's value and what a replica of a shard restores from the
//! schedule log; its bytes are its protobuf encoding (prost derives, no
//! .proto file), so a newer build can add fields an older one skips.

/// A message as parked.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MessageRecord {
    #[prost(string, tag = "1")]
    pub topic: String,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub key: Option<Vec<u8>>,
    #[prost(bytes = "vec", tag = "3")]
    pub value: Vec<u8>,
    #[prost(message, repeated, tag = "4")]
    pub headers: Vec<HeaderRecord>,
    #[prost(int32, optional, tag = "5")]
    pub partition: Option<i32>,
    /// The current due time (moves on reschedule).
    #[prost(uint64, tag = "6")]
    pub due_ms: u64,
    #[prost(uint64, tag = "7")]
    pub seq: u64,
    #[prost(uint64, tag = "8")]
    pub scheduled_at_ms: u64,
    /// The due time as first requested, for recognising a retried request.
    #[prost(uint64, optional, tag = "9")]
    pub requested_at_ms: Option<u64>,
    #[prost(uint64, optional, tag = "10")]
    pub requested_delay_ms: Option<u64>,
    /// Where the message's due entry is: at `(entry_at_ms, seq)`. Set in a
    /// locator (the `messages` entry of a message whose due entry holds it
    /// whole, without key, value and headers) and in the record that entry
    /// holds. It can lie after the due time: a new entry is never put
    /// behind where the dispatcher reads.
    #[prost(uint64, optional, tag = "11")]
    pub entry_at_ms: Option<u64>,
    /// The caller's labels, sorted by key (not in a locator).
    #[prost(message, repeated, tag = "12")]
    pub labels: Vec<LabelRecord>,
    /// Its deadline past its due time, in ms: past it, it expires.
    #[prost(uint64, optional, tag = "13")]
    pub max_lateness_ms: Option<u64>,
    /// Its own dead-letter topic, if it names one.
    #[prost(string, optional, tag = "14")]
    pub dead_letter_topic: Option<String>,
    /// Set when the message was delivered and its key, value and headers
    /// were dropped afterwards: the SHA-256 of the request's content, so
    /// that a retried request is still told from a different one.
    #[prost(bytes = "vec", optional, tag = "15")]
    pub digest: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelRecord {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderRecord {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}
