//! The record to produce when due, the headers hourglass adds, and the
//! limits a message must meet at the door, with the error that says which.

use super::{Labels, MessageId, UnixMillis, duration_text};
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub key: String,
    pub value: Vec<u8>,
}

/// The Kafka record to produce when due, exactly as the client gave it,
/// and the labels it is found by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Envelope {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<Header>,
    pub partition: Option<i32>,
    /// The caller's labels: kept with the message, not produced.
    pub labels: Labels,
    /// Its deadline past its due time: past it, the message is settled
    /// expired instead of produced. Kept with the message, not produced.
    pub max_lateness: Option<Duration>,
    /// Where it goes if it fails or expires, if it names a topic of its
    /// own. Kept with the message, not produced.
    pub dead_letter_topic: Option<String>,
}

/// Prefix of the headers hourglass adds to every record it produces.
pub const RESERVED_HEADER_PREFIX: &str = "hourglass-";
/// The W3C trace context headers a traced Schedule keeps on its record
/// (`otel`): a retry under another span is still the same request.
pub const TRACE_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// Whether a header is trace context rather than the record's content.
pub fn is_trace_header(key: &str) -> bool {
    TRACE_HEADERS.iter().any(|trace| key.eq_ignore_ascii_case(trace))
}
/// Header carrying the message id, so consumers can deduplicate.
pub const ID_HEADER: &str = "hourglass-id";
/// Header carrying the due time in Unix milliseconds (decimal text).
pub const DUE_HEADER: &str = "hourglass-due-ms";
/// Header carrying the tenant whose id space the message is in; absent for
/// the shared space. Two tenants may use the same id: deduplicate on both.
pub const TENANT_HEADER: &str = "hourglass-tenant";
/// Dead letters: why it came here instead of its topic, `expired` or
/// `failed`.
pub const DEAD_LETTER_REASON_HEADER: &str = "hourglass-dead-letter-reason";
/// Dead letters that failed: the error its topic gave.
pub const DEAD_LETTER_ERROR_HEADER: &str = "hourglass-dead-letter-error";
/// Dead letters that expired: the deadline that passed, in Unix
/// milliseconds.
pub const DEADLINE_HEADER: &str = "hourglass-deadline-ms";
/// Dead letters: the topic it was scheduled for.
pub const ORIGINAL_TOPIC_HEADER: &str = "hourglass-original-topic";
/// Dead letters: the partition it was scheduled for, if it named one.
pub const ORIGINAL_PARTITION_HEADER: &str = "hourglass-original-partition";
/// Dead letters: how many times it was produced to its topic and refused.
pub const ATTEMPTS_HEADER: &str = "hourglass-attempts";

/// Why a message went to its dead-letter topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeadReason {
    /// Its deadline passed before it was produced.
    Expired { deadline: UnixMillis },
    /// Its topic did not take it, for good.
    Failed { error: String },
}

impl DeadReason {
    /// The reason header's value.
    pub fn name(&self) -> &'static str {
        match self {
            DeadReason::Expired { .. } => "expired",
            DeadReason::Failed { .. } => "failed",
        }
    }
}

/// A due message as delivery takes it: the client's record, whose it is
/// and when it was due.
#[derive(Clone, Copy, Debug)]
pub struct Outgoing<'a> {
    pub id: &'a MessageId,
    pub due: UnixMillis,
    pub envelope: &'a Envelope,
}

impl<'a> Outgoing<'a> {
    /// The headers the record goes out with: the client's, then those
    /// hourglass adds (its id, its due time, given as `due_text`, and its
    /// tenant, if any).
    pub fn headers(&self, due_text: &'a str) -> impl Iterator<Item = (&'a str, &'a [u8])> {
        let client = self.envelope.headers.iter().map(|h| (h.key.as_str(), h.value.as_slice()));
        let added = [
            Some((ID_HEADER, self.id.as_str().as_bytes())),
            Some((DUE_HEADER, due_text.as_bytes())),
            self.id.tenant().map(|tenant| (TENANT_HEADER, tenant.as_bytes())),
        ];
        client.chain(added.into_iter().flatten())
    }
}

impl Envelope {
    /// The record to produce to the dead-letter topic `to` in place of
    /// this one: key, value and headers as they were, no partition of its
    /// own, and headers that say why (`attempts` tries of its topic).
    pub fn dead_letter(mut self, to: &str, why: &DeadReason, attempts: u32) -> Envelope {
        let mut add = |key: &str, value: String| {
            self.headers.push(Header { key: key.to_owned(), value: value.into_bytes() })
        };
        add(DEAD_LETTER_REASON_HEADER, why.name().to_owned());
        match why {
            DeadReason::Expired { deadline } => add(DEADLINE_HEADER, deadline.0.to_string()),
            DeadReason::Failed { error } => add(DEAD_LETTER_ERROR_HEADER, error.clone()),
        }
        add(ORIGINAL_TOPIC_HEADER, self.topic.clone());
        if let Some(partition) = self.partition {
            add(ORIGINAL_PARTITION_HEADER, partition.to_string());
        }
        add(ATTEMPTS_HEADER, attempts.to_string());
        Envelope {
            topic: to.to_owned(),
            partition: None,
            dead_letter_topic: None,
            max_lateness: None,
            ..self
        }
    }

    /// Bytes the record carries: key, value and headers.
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len) + self.value.len() + self.headers_size()
    }

    fn headers_size(&self) -> usize {
        self.headers.iter().map(|h| h.key.len() + h.value.len()).sum()
    }

    /// Checks everything that can be checked without the broker.
    pub fn validate(&self, limits: &Limits) -> Result<(), Invalid> {
        validate_topic_name(&self.topic)?;
        limits.reserved.check("message.topic", &self.topic)?;
        if let Some(to) = &self.dead_letter_topic {
            validate_dead_letter_topic(&self.topic, to)
                .map_err(|e| Invalid { field: "dead_letter_topic", ..e })?;
            limits.reserved.check("dead_letter_topic", to)?;
        }
        if self.value.is_empty() {
            return Err(Invalid::new("message.value", "must not be empty"));
        }
        if self.headers.len() > limits.max_headers {
            return Err(Invalid::new(
                "message.headers",
                format!("has {} headers; the limit is {}", self.headers.len(), limits.max_headers),
            ));
        }
        for h in &self.headers {
            if h.key.is_empty() {
                return Err(Invalid::new("message.headers", "a header key must not be empty"));
            }
            if h.key.starts_with(RESERVED_HEADER_PREFIX) {
                return Err(Invalid::new(
                    "message.headers",
                    format!("header {:?} uses the reserved prefix {RESERVED_HEADER_PREFIX:?}", h.key),
                ));
            }
        }
        if self.headers_size() > limits.max_headers_bytes {
            return Err(Invalid::new(
                "message.headers",
                format!(
                    "headers take {} bytes; the limit is {}",
                    self.headers_size(),
                    limits.max_headers_bytes
                ),
            ));
        }
        if self.size() > limits.max_message_bytes {
            return Err(Invalid::new(
                "message",
                format!(
                    "key, value and headers take {} bytes; the limit is {}",
                    self.size(),
                    limits.max_message_bytes
                ),
            ));
        }
        if let Some(p) = self.partition
            && p < 0
        {
            return Err(Invalid::new("message.partition", format!("{p} is negative")));
        }
        Ok(())
    }
}

/// Kafka's own rule for topic names.
pub fn validate_topic_name(topic: &str) -> Result<(), Invalid> {
    const MAX: usize = 249;
    if topic.is_empty() {
        return Err(Invalid::new("message.topic", "must not be empty"));
    }
    if topic.len() > MAX {
        return Err(Invalid::new("message.topic", format!("is longer than {MAX} characters")));
    }
    if topic == "." || topic == ".." {
        return Err(Invalid::new("message.topic", "may not be \".\" or \"..\""));
    }
    if let Some(c) = topic.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(Invalid::new(
            "message.topic",
            format!("{topic:?} contains {c:?}; Kafka topics use letters, digits, '.', '_' and '-'"),
        ));
    }
    Ok(())
}

/// A dead-letter topic for the messages of `topic`: a topic name, and
/// another topic (a message that failed on its topic would fail there
/// again, and could not be told from one delivered).
pub fn validate_dead_letter_topic(topic: &str, to: &str) -> Result<(), Invalid> {
    validate_topic_name(to)?;
    if to == topic {
        return Err(Invalid::new(
            "message.topic",
            format!("{to:?} is the message's own topic; a dead-letter topic must be another"),
        ));
    }
    Ok(())
}

/// The topics hourglass writes itself: in cluster mode the schedule log,
/// its routing topic and the ingress topics. hourglass's own producer may
/// write them, so no message, series template or policy may name one as
/// its topic or its dead-letter topic, whatever the caller's grant: a
/// record produced there under a key the cluster uses would replace the
/// cluster's own record of it when the log is compacted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReservedTopics(std::sync::Arc<[String]>);

impl ReservedTopics {
    pub fn new(topics: impl IntoIterator<Item = String>) -> ReservedTopics {
        ReservedTopics(topics.into_iter().collect())
    }

    pub fn contains(&self, topic: &str) -> bool {
        self.0.iter().any(|reserved| reserved == topic)
    }

    /// Refuses `topic` as the destination `field` names if it is reserved.
    pub fn check(&self, field: &'static str, topic: &str) -> Result<(), Invalid> {
        if self.contains(topic) {
            return Err(Invalid::new(
                field,
                format!(
                    "{topic:?} is a topic hourglass keeps for itself (its schedule log, the log's routing \
                     topic, or an ingress topic): it is never a destination, whatever the token's grant"
                ),
            ));
        }
        Ok(())
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

/// What a message must meet to be accepted.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Key, value and headers together.
    pub max_message_bytes: usize,
    pub max_headers: usize,
    pub max_headers_bytes: usize,
    /// How far in the future a due time may lie.
    pub max_delay: Duration,
    /// Items in one `ScheduleBatch` call.
    pub max_batch: usize,
    /// Encoded size of one `ScheduleBatch` request.
    pub max_batch_bytes: usize,
    /// Topics hourglass writes itself, never a message's.
    pub reserved: ReservedTopics,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: 1024 * 1024,
            max_headers: 64,
            max_headers_bytes: 64 * 1024,
            max_delay: Duration::from_secs(3 * 366 * 24 * 3600),
            max_batch: 10_000,
            max_batch_bytes: 16 << 20,
            reserved: ReservedTopics::default(),
        }
    }
}

impl Limits {
    /// Refuses a batch of more than --max-batch items.
    pub fn check_batch(&self, items: usize) -> Result<(), Invalid> {
        if items > self.max_batch {
            return Err(Invalid::new(
                "requests",
                format!(
                    "has {items} items; the server takes at most {} per batch (--max-batch)",
                    self.max_batch
                ),
            ));
        }
        Ok(())
    }

    /// The largest request of one message the server decodes (`Schedule`,
    /// each request of a `ScheduleStream`, and the small ones): the message
    /// with room for its envelope. Anything larger is refused unread.
    pub fn max_request_bytes(&self) -> usize {
        self.max_message_bytes + 64 * 1024
    }

    /// The largest `ScheduleBatch` request the server decodes; never less
    /// than one message needs.
    pub fn max_batch_request_bytes(&self) -> usize {
        self.max_batch_bytes.max(self.max_request_bytes())
    }

    /// A due time in the past is fine (delivered at once); one beyond
    /// `max_delay` is refused rather than silently clamped.
    pub fn check_due(&self, due: UnixMillis, now: UnixMillis) -> Result<(), Invalid> {
        let latest = now.saturating_add(self.max_delay);
        if due > latest {
            return Err(Invalid::new(
                "due",
                format!(
                    "{} is further ahead than the server's --max-delay of {} allows (the latest due time it \
                     takes now is {}); pick an earlier time, or raise --max-delay",
                    due.to_rfc3339(),
                    duration_text(self.max_delay),
                    latest.to_rfc3339()
                ),
            ));
        }
        Ok(())
    }
}

/// A request field that is wrong, and why, in words a person can act on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} {reason}")]
pub struct Invalid {
    pub field: &'static str,
    pub reason: String,
}

impl Invalid {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Invalid { field, reason: reason.into() }
    }
}
