//! Cluster mode: the shards' stores are views of a Kafka topic, the
//! schedule log, one partition per shard.
//!
//! ```text
//! caller ─► front: decide ─► append to the log partition ─┐
//!                  ┌─────── its ack (offset, record) ◄────┤
//!                  ▼                                      ▼
//!           store ◄── applier: apply in offset order ◄── log ◄── Kafka-native producers
//!             │                          ▲
//!             └─► dispatcher ─► topic    └── recorder: one Settled record per settle
//! ```
//!
//! - [`front`]: a caller's change is decided against the store (answered
//!   at once when nothing changes: a retried schedule, a cancel of what
//!   was delivered), appended to the log, and answered once the applier
//!   has applied it, with the store's answer.
//! - [`applier`]: follows the partition from the offset the store has
//!   applied to, and applies each record, the offset in the same commit.
//!   A change the front appended is applied from its ack as soon as every
//!   record before it is, rather than once read back.
//! - [`recorder`]: the dispatcher's settles go to the log as one record
//!   per settle, and are applied from there.
//! - [`waiters`]: which request of this node wrote which record.
//! - [`gate`]: a shard's dispatcher produces only while the node's
//!   [`lease`] holds and the log names this node the shard's owner.
//! - `shards`: the [`Cluster`] as the node's
//!   [`ShardSet`](crate::node::ShardSet): the shards this node owns now,
//!   read from their stores, changed through their fronts.
//!
//! Before a shard dispatches anything, its store has applied the partition
//! to the end it had when the shard started, so that nothing recorded as
//! delivered or cancelled goes out again.

pub(crate) mod applier;
mod everywhere;
mod forward;
pub(crate) mod front;
pub(crate) mod gate;
pub mod kafka;
pub(crate) mod lease;
pub mod log;
pub(crate) mod owner;
pub(crate) mod recorder;
pub(crate) mod replica;
mod retention;
pub(crate) mod routes;
mod shards;
mod vouch;
pub(crate) mod waiters;

pub use forward::{Router, SeriesRouter};
pub use kafka::{GroupConfig, LogTopic, TopicError};
pub use log::seal::{ClusterKey, KeyError};
pub use owner::{Cluster, Place, Shards};
pub use vouch::Voucher;

use std::time::Duration;

use crate::{kafka::KafkaConfig, message::Limits};

/// What cluster mode is built from.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub kafka: KafkaConfig,
    /// The schedule log: its name, partition count (the shard count) and
    /// replication.
    pub log: LogTopic,
    /// The consumer group whose members own the log's partitions.
    pub group: GroupConfig,
    /// What a Kafka-native record is checked against before it is called.
    pub limits: Limits,
    /// How long creating or checking the log topic may take.
    pub admin_timeout: Duration,
    /// Where the other nodes reach this one's gRPC port (a URL).
    pub advertise: String,
    /// How many nodes besides its owner keep each shard's store up to date.
    pub standby_replicas: usize,
    /// What seals the records of this cluster (`--cluster-key-file`).
    pub key: ClusterKey,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    LogTopic(#[from] TopicError),
    #[error("the schedule log: {0}")]
    Log(String),
    #[error("the consumer group: {0}")]
    Group(String),
}
