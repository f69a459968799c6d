//! The schedule log of cluster mode: a compacted Kafka topic whose
//! partitions are the shards, and what a record of it means. A shard's
//! store is a view of its partition, applied in offset order.
//!
//! Only the nodes of the cluster write the log: each record is marked with
//! [`RECORD_HEADER`] and sealed with the cluster key ([`seal`]), and one
//! without a valid seal is refused as forged. Applications that would
//! rather write to Kafka than call gRPC produce to an ingress topic
//! (`crate::ingress`), whose records the shards' owners check and
//! turn into the log's.
//!
//! This module only says what a record means; it reads and writes nothing.
//! Nothing here knows of the store or of Kafka clients.

pub mod record;
pub mod route;
pub mod seal;

/// Marks a record hourglass wrote itself; its value is the version of the
/// record format (decimal text). Records without it are Kafka-native
/// schedules.
pub const RECORD_HEADER: &str = "hourglass-record";
