//! What a produce came to: a delivery report, tagged with the dispatcher's
//! token, and what an error says about the cluster, the topic or the
//! record. Shared by the idempotent producer and the transactional ones.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// The outcome of one produce, tagged with the dispatcher's token, and
/// when the producer learnt it: the dispatcher may read the report later
/// (it is busy reading or producing), and a delivery is timed by the
/// broker's answer, not by that.
#[derive(Debug)]
pub struct DeliveryReport {
    pub token: u64,
    pub result: Result<(i32, i64), ProduceError>,
    pub known: std::time::Instant,
}

impl DeliveryReport {
    /// The outcome of produce `token`, known now.
    pub fn now(token: u64, result: Result<(i32, i64), ProduceError>) -> DeliveryReport {
        DeliveryReport { token, result, known: std::time::Instant::now() }
    }
}

/// Why a produce failed, and whether it is the message's fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceError {
    pub fault: Fault,
    pub reason: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The record was not sent (librdkafka's queue is full, say): try again
    /// later, for as long as it takes.
    Outage,
    /// The broker refuses the topic (deleted, not authorised): every record
    /// for it would be refused alike. Often brief (an ACL being fixed, a
    /// topic being re-created), so the dispatcher holds the topic and tries
    /// it again rather than failing its messages.
    TopicRefused,
    /// The broker refused this record itself (too large, invalid): try a
    /// bounded number of times, then give up.
    MessageRefused,
    /// Transactional delivery: another producer took the shard's
    /// transactional id (the shard moved) before this record's transaction
    /// was known to be committed. Most likely it was aborted; if the commit
    /// reached the broker and only its answer was lost, the record is on
    /// its topic, and whoever produces for the shard next finds it there
    /// first (every new producer of the id reads the topics back before
    /// producing). Either way it is not this node's to settle now: give it
    /// back to the store untouched.
    Fenced,
}

/// What a produce error says about the cluster, the topic or the record.
pub fn classify(code: RDKafkaErrorCode) -> Fault {
    use RDKafkaErrorCode::*;
    match code {
        // An unknown partition too: partitions are checked when a message is
        // scheduled and a topic never loses any, so its topic was deleted
        // (and perhaps re-created smaller).
        UnknownTopicOrPartition
        | UnknownTopic
        | UnknownPartition
        | TopicAuthorizationFailed
        | ClusterAuthorizationFailed
        | InvalidTopic => Fault::TopicRefused,
        MessageSizeTooLarge | InvalidMessageSize | InvalidMessage | MessageBatchTooLarge
        | PolicyViolation | InvalidRecord | InvalidTimestamp | InvalidPartitions => Fault::MessageRefused,
        _ => Fault::Outage,
    }
}

pub(super) fn produce_error(e: &KafkaError) -> ProduceError {
    let fault = e.rdkafka_error_code().map_or(Fault::Outage, classify);
    ProduceError { fault, reason: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_faults_are_told_from_outages() {
        assert_eq!(classify(RDKafkaErrorCode::MessageSizeTooLarge), Fault::MessageRefused);
        assert_eq!(classify(RDKafkaErrorCode::UnknownPartition), Fault::TopicRefused);
        assert_eq!(classify(RDKafkaErrorCode::UnknownTopicOrPartition), Fault::TopicRefused);
        assert_eq!(classify(RDKafkaErrorCode::TopicAuthorizationFailed), Fault::TopicRefused);
        assert_eq!(classify(RDKafkaErrorCode::MessageTimedOut), Fault::Outage);
        assert_eq!(classify(RDKafkaErrorCode::AllBrokersDown), Fault::Outage);
        assert_eq!(classify(RDKafkaErrorCode::NotLeaderForPartition), Fault::Outage);
        assert_eq!(classify(RDKafkaErrorCode::QueueFull), Fault::Outage);
    }
}
