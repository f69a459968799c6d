//! The schedule log of cluster mode: a compacted Kafka topic whose
//! partitions are the shards, and what a record of it means. A shard's
//! store is a view of its partition, applied in offset order.
//!
//! Two kinds of record reach a partition:
//!
//! - **Kafka-native schedules** ([`native`]), produced by applications that
//!   would rather write to Kafka than call gRPC: the key is the message id,
//!   the value and the other headers are the record to deliver, and
//!   `hourglass-` headers say where and when.
//! - **Records hourglass writes itself**, marked with [`RECORD_HEADER`]
//!   and sealed with the cluster key ([`seal`]): one that claims to be
//!   hourglass's own without a valid seal is refused.
//!
//! This module only says what a record means; it reads and writes nothing.
//! Nothing here knows of the store or of Kafka clients.

pub mod native;
pub mod record;
pub mod route;
pub mod seal;

/// Marks a record hourglass wrote itself; its value is the version of the
/// record format (decimal text). Records without it are Kafka-native
/// schedules.
pub const RECORD_HEADER: &str = "hourglass-record";
