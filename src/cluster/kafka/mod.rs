//! The Kafka clients of cluster mode: the schedule log's producer, readers
//! and consumer (`log`, which also reads the ingress topics), the topics'
//! creation and check (`admin`), and the
//! consumer group whose members own the log's partitions (`group`).

mod admin;
mod group;
mod log;

pub use admin::{Ensured, LogTopic, TopicError, ensure_ingress_topic, ensure_log_topic};
pub use group::{GroupConfig, GroupMember, Moved, REVOKE_WAIT};
pub(crate) use log::timestamp;
pub use log::{
    Appended, Fetched, LogConsumer, LogProducer, LogReader, Read, key_digest, log_consumer_config,
    log_producer_config,
};
