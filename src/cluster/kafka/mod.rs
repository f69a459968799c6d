//! The Kafka clients of cluster mode: the schedule log's producer, readers
//! and consumer (`log`), the topics' creation and check (`admin`), and the
//! consumer group whose members own the log's partitions (`group`); and
//! the ingress topics' reader (`feed`, standalone too).

mod admin;
mod feed;
mod group;
mod log;

pub use admin::{Ensured, LogTopic, TopicError, ensure_log_topic};
pub use feed::IngressFeed;
pub use group::{GroupConfig, GroupMember, Moved, REVOKE_WAIT};
pub use log::{
    Appended, Fetched, LogConsumer, LogProducer, LogReader, Read, key_digest, log_consumer_config,
    log_producer_config,
};
