//! Kafka-native schedules: a record an application produces to an ingress
//! topic instead of calling `Schedule`.
//!
//! ```text
//! key                        the message id (as `Schedule`'s `id`)
//! value                      the value of the record to deliver; none (a
//!                            tombstone) asks to cancel the message
//! hourglass-topic            the topic to deliver to (required)
//! hourglass-deliver-at       when: Unix milliseconds, or RFC 3339
//! hourglass-delay            or how long after the record's timestamp:
//!                            milliseconds, or a duration such as 90s or 30m
//! hourglass-key              the key of the record to deliver (optional)
//! hourglass-partition        its partition (optional; else by its key)
//! hourglass-labels           labels to find the message by: `k=v,k2=v2`
//! hourglass-max-lateness     its deadline past its due time (as
//!                            `Schedule`'s `max_lateness`): milliseconds,
//!                            or a duration such as 10m
//! hourglass-dead-letter-topic where it goes if it fails or expires (as
//!                            `Schedule`'s `dead_letter_topic`)
//! hourglass-on-conflict      `reject` (the default) or `replace`: what a
//!                            record does when its id is taken by a
//!                            different message (as `Schedule`'s
//!                            `on_conflict`); `replace` makes the latest
//!                            record for an id win while it is pending
//! any other header           passed through to the delivered record
//! ```
//!
//! Exactly one of `hourglass-deliver-at` and `hourglass-delay`. Any other
//! `hourglass-` header is refused by name, so a misspelt one is not passed
//! through unnoticed. A delay counts from the record's own timestamp, not
//! from when a node reads it, so a record read again (by the next owner
//! of its shard) asks for the same due time, and is a retry.
//!
//! A record that breaks these rules is [`Rejected`], with the id when it
//! has one and a reason a person can act on.

use std::time::Duration;

use crate::message::{
    DueSpec, Envelope, Header, Invalid, Labels, Limits, MessageId, OnConflict, RESERVED_HEADER_PREFIX,
    UnixMillis,
};

pub(crate) const TOPIC_HEADER: &str = "hourglass-topic";
pub(crate) const DELIVER_AT_HEADER: &str = "hourglass-deliver-at";
pub(crate) const DELAY_HEADER: &str = "hourglass-delay";
pub(crate) const KEY_HEADER: &str = "hourglass-key";
pub(crate) const PARTITION_HEADER: &str = "hourglass-partition";
pub(crate) const ON_CONFLICT_HEADER: &str = "hourglass-on-conflict";
pub(crate) const LABELS_HEADER: &str = "hourglass-labels";
pub(crate) const MAX_LATENESS_HEADER: &str = "hourglass-max-lateness";
pub(crate) const DEAD_LETTER_TOPIC_HEADER: &str = "hourglass-dead-letter-topic";

/// Every `hourglass-` header a native record may carry.
pub(crate) const HEADERS: [&str; 9] = [
    TOPIC_HEADER,
    DELIVER_AT_HEADER,
    DELAY_HEADER,
    KEY_HEADER,
    PARTITION_HEADER,
    ON_CONFLICT_HEADER,
    LABELS_HEADER,
    MAX_LATENESS_HEADER,
    DEAD_LETTER_TOPIC_HEADER,
];

/// What a native record asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Native {
    Schedule {
        id: MessageId,
        envelope: Envelope,
        requested: DueSpec,
        on_conflict: OnConflict,
    },
    /// A tombstone: cancel the message, if it is still pending.
    Cancel(MessageId),
}

/// A native record that cannot be applied, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{reason}", id.as_ref().map(|id| format!("message {id}: ")).unwrap_or_default())]
pub(crate) struct Rejected {
    /// The id, when the record's key is one.
    pub id: Option<MessageId>,
    pub(crate) reason: Invalid,
}

/// Reads a native record: its key, its value (none for a tombstone) and its
/// headers, a header's value none when Kafka's is null. Everything that can
/// be checked without the broker is checked here, against `limits`.
pub(crate) fn parse<'a>(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
    limits: &Limits,
) -> Result<Native, Rejected> {
    let id = parse_id(key).map_err(|reason| Rejected { id: None, reason })?;
    let reject = |reason: Invalid| Rejected { id: Some(id.clone()), reason };
    let Some(value) = value else {
        return Ok(Native::Cancel(id));
    };
    let mut fields = Fields::default();
    let mut passed = Vec::new();
    for (name, bytes) in headers {
        if name.starts_with(RESERVED_HEADER_PREFIX) {
            fields.set(name, bytes).map_err(reject)?;
        } else {
            passed.push(Header { key: name.to_owned(), value: bytes.unwrap_or_default().to_vec() });
        }
    }
    let topic = fields
        .topic
        .ok_or_else(|| reject(Invalid::new(TOPIC_HEADER, "is missing: it names the topic to deliver to")))?;
    let requested = match (fields.deliver_at, fields.delay) {
        (Some(at), None) => DueSpec::At(at),
        (None, Some(delay)) => DueSpec::After(delay),
        (None, None) => {
            return Err(reject(Invalid::new(
                DELIVER_AT_HEADER,
                format!("is missing, and so is {DELAY_HEADER}: one of them says when to deliver"),
            )));
        }
        (Some(_), Some(_)) => {
            return Err(reject(Invalid::new(
                DELAY_HEADER,
                format!("is set beside {DELIVER_AT_HEADER}; set one of them"),
            )));
        }
    };
    let envelope = Envelope {
        topic,
        key: fields.key,
        value: value.to_vec(),
        headers: passed,
        partition: fields.partition,
        labels: fields.labels.unwrap_or_default(),
        // Whole milliseconds, as a call's; zero: none.
        max_lateness: fields
            .max_lateness
            .map(|late| Duration::from_millis(late.as_millis() as u64))
            .filter(|late| !late.is_zero()),
        dead_letter_topic: fields.dead_letter_topic,
    };
    envelope.validate(limits).map_err(reject)?;
    Ok(Native::Schedule { id, envelope, requested, on_conflict: fields.on_conflict.unwrap_or_default() })
}

fn parse_id(key: Option<&[u8]>) -> Result<MessageId, Invalid> {
    let no_id = |reason: &str| Invalid::new("key", reason.to_owned());
    let key = key.ok_or_else(|| no_id("is missing: the record's key is the message id"))?;
    let text = std::str::from_utf8(key).map_err(|_| no_id("is not UTF-8: the key is the message id"))?;
    MessageId::parse(text).map_err(|e| no_id(&format!("is not a message id: {}", e.reason)))
}

/// The `hourglass-` headers of one record, as read.
#[derive(Default)]
struct Fields {
    topic: Option<String>,
    deliver_at: Option<UnixMillis>,
    delay: Option<Duration>,
    key: Option<Vec<u8>>,
    partition: Option<i32>,
    on_conflict: Option<OnConflict>,
    labels: Option<Labels>,
    max_lateness: Option<Duration>,
    dead_letter_topic: Option<String>,
}

impl Fields {
    fn set(&mut self, name: &str, bytes: Option<&[u8]>) -> Result<(), Invalid> {
        let field: &'static str = HEADERS.into_iter().find(|h| *h == name).ok_or_else(|| {
            Invalid::new(
                "headers",
                format!(
                    "{name:?} is not a header hourglass reads (the {RESERVED_HEADER_PREFIX:?} prefix is \
                     reserved; known: {})",
                    HEADERS.join(", ")
                ),
            )
        })?;
        let repeated = || Invalid::new(field, "is set twice");
        if field == KEY_HEADER {
            if self.key.is_some() {
                return Err(repeated());
            }
            self.key = Some(bytes.unwrap_or_default().to_vec());
            return Ok(());
        }
        let text = bytes
            .map(std::str::from_utf8)
            .transpose()
            .map_err(|_| Invalid::new(field, "is not UTF-8 text"))?
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Invalid::new(field, "is empty"))?;
        match field {
            TOPIC_HEADER if self.topic.is_none() => self.topic = Some(text.to_owned()),
            DELIVER_AT_HEADER if self.deliver_at.is_none() => self.deliver_at = Some(deliver_at(text)?),
            DELAY_HEADER if self.delay.is_none() => self.delay = Some(duration(DELAY_HEADER, text)?),
            MAX_LATENESS_HEADER if self.max_lateness.is_none() => {
                self.max_lateness = Some(duration(MAX_LATENESS_HEADER, text)?)
            }
            PARTITION_HEADER if self.partition.is_none() => {
                let p = text.parse::<i32>().ok().filter(|p| *p >= 0).ok_or_else(|| {
                    Invalid::new(field, format!("{text:?} is not a partition number (0 or more)"))
                })?;
                self.partition = Some(p);
            }
            LABELS_HEADER if self.labels.is_none() => self.labels = Some(labels(text)?),
            DEAD_LETTER_TOPIC_HEADER if self.dead_letter_topic.is_none() => {
                self.dead_letter_topic = Some(text.to_owned())
            }
            ON_CONFLICT_HEADER if self.on_conflict.is_none() => {
                self.on_conflict = Some(match text.to_ascii_lowercase().as_str() {
                    "reject" => OnConflict::Reject,
                    "replace" => OnConflict::Replace,
                    _ => return Err(Invalid::new(field, format!("{text:?} is neither reject nor replace"))),
                });
            }
            _ => return Err(repeated()),
        }
        Ok(())
    }
}

/// `key=value` pairs, comma-separated.
fn labels(text: &str) -> Result<Labels, Invalid> {
    let pairs = text.split(',').map(str::trim).filter(|p| !p.is_empty()).map(|pair| {
        pair.split_once('=').map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned())).ok_or_else(|| {
            Invalid::new(LABELS_HEADER, format!("{pair:?} is not key=value (write order=42,step=ship)"))
        })
    });
    let pairs = pairs.collect::<Result<Vec<_>, _>>()?;
    Labels::new(pairs).map_err(|e| Invalid::new(LABELS_HEADER, e.reason))
}

/// Unix milliseconds, or an RFC 3339 time.
fn deliver_at(text: &str) -> Result<UnixMillis, Invalid> {
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(UnixMillis(ms));
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .and_then(|t| u64::try_from(t.timestamp_millis()).ok())
        .map(UnixMillis)
        .ok_or_else(|| {
            Invalid::new(
                DELIVER_AT_HEADER,
                format!("{text:?} is neither Unix milliseconds nor an RFC 3339 time (2026-11-23T09:00:00Z)"),
            )
        })
}

/// Milliseconds, or a duration as people write it (`90s`, `30m`, `1h 30m`).
fn duration(header: &'static str, text: &str) -> Result<Duration, Invalid> {
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(Duration::from_millis(ms));
    }
    humantime::parse_duration(text).map_err(|e| {
        Invalid::new(header, format!("{text:?} is neither milliseconds nor a duration such as 30m ({e})"))
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn read(key: Option<&str>, value: Option<&str>, headers: &[(&str, &str)]) -> Result<Native, Rejected> {
        parse(
            key.map(str::as_bytes),
            value.map(str::as_bytes),
            headers.iter().map(|(k, v)| (*k, Some(v.as_bytes()))),
            &Limits::default(),
        )
    }

    /// A read, and what its rejection should be: (id, field, words in the reason).
    type Case = (Result<Native, Rejected>, Option<String>, &'static str, &'static str);

    fn reason(r: Result<Native, Rejected>) -> (Option<String>, &'static str, String) {
        let e = r.expect_err("rejected");
        (e.id.map(|id| id.as_str().to_owned()), e.reason.field, e.reason.reason)
    }

    #[test]
    fn a_full_record_reads_as_its_schedule() {
        let got = read(
            Some("order-1"),
            Some("payload"),
            &[
                (TOPIC_HEADER, "orders"),
                (DELAY_HEADER, "30m"),
                (KEY_HEADER, "customer-7"),
                (PARTITION_HEADER, "3"),
                ("trace", "abc"),
            ],
        )
        .unwrap();
        let Native::Schedule { id, envelope, requested, on_conflict } = got else { panic!("{got:?}") };
        assert_eq!(on_conflict, OnConflict::Reject, "reject unless the record asks to replace");
        assert!(envelope.labels.is_empty());
        assert_eq!(id.as_str(), "order-1");
        assert_eq!(requested, DueSpec::After(Duration::from_secs(1800)));
        assert_eq!(envelope.topic, "orders");
        assert_eq!(envelope.key.as_deref(), Some(&b"customer-7"[..]));
        assert_eq!(envelope.partition, Some(3));
        assert_eq!(envelope.value, b"payload");
        assert_eq!(envelope.headers, [Header { key: "trace".into(), value: b"abc".to_vec() }]);
    }

    #[test]
    fn a_due_time_is_milliseconds_or_rfc_3339_and_a_delay_milliseconds_or_words() {
        let due = |headers: &[(&str, &str)]| match read(Some("a"), Some("v"), headers).unwrap() {
            Native::Schedule { requested, .. } => requested,
            other => panic!("{other:?}"),
        };
        let topic = (TOPIC_HEADER, "t");
        assert_eq!(
            due(&[topic, (DELIVER_AT_HEADER, "1795424400000")]),
            DueSpec::At(UnixMillis(1_795_424_400_000))
        );
        assert_eq!(
            due(&[topic, (DELIVER_AT_HEADER, "2026-11-23T09:00:00.250Z")]),
            DueSpec::At(UnixMillis(1_795_424_400_250))
        );
        assert_eq!(due(&[topic, (DELAY_HEADER, "1500")]), DueSpec::After(Duration::from_millis(1500)));
        assert_eq!(due(&[topic, (DELAY_HEADER, "1h 30m")]), DueSpec::After(Duration::from_secs(5400)));
    }

    #[test]
    fn a_deadline_is_milliseconds_or_words_and_zero_is_none() {
        let late = |text: &str| {
            read(
                Some("a"),
                Some("v"),
                &[(TOPIC_HEADER, "t"), (DELAY_HEADER, "1s"), (MAX_LATENESS_HEADER, text)],
            )
            .map(|got| match got {
                Native::Schedule { envelope, .. } => envelope.max_lateness,
                other => panic!("{other:?}"),
            })
        };
        assert_eq!(late("10m"), Ok(Some(Duration::from_secs(600))));
        assert_eq!(late("1500"), Ok(Some(Duration::from_millis(1_500))));
        assert_eq!(late("0"), Ok(None));
        assert_eq!(late("soon").unwrap_err().reason.field, MAX_LATENESS_HEADER);
    }

    #[test]
    fn labels_and_a_replace_are_asked_for_by_header() {
        let got = read(
            Some("a"),
            Some("v"),
            &[
                (TOPIC_HEADER, "t"),
                (DELAY_HEADER, "1s"),
                (LABELS_HEADER, "step=ship, order=42"),
                (ON_CONFLICT_HEADER, "Replace"),
            ],
        )
        .unwrap();
        let Native::Schedule { envelope, on_conflict, .. } = got else { panic!("{got:?}") };
        assert_eq!(on_conflict, OnConflict::Replace);
        assert_eq!(envelope.labels.iter().collect::<Vec<_>>(), [("order", "42"), ("step", "ship")]);
    }

    #[test]
    fn a_tombstone_cancels() {
        assert_eq!(read(Some("a"), None, &[]).unwrap(), Native::Cancel(MessageId::parse("a").unwrap()));
    }

    #[test]
    fn bad_records_are_refused_by_name_with_the_id_when_there_is_one() {
        let t = (TOPIC_HEADER, "t");
        let d = (DELAY_HEADER, "1s");
        let a = Some("a".to_owned());
        let cases: Vec<Case> = vec![
            (read(None, Some("v"), &[t, d]), None, "key", "is missing"),
            (read(Some(""), Some("v"), &[t, d]), None, "key", "is not a message id"),
            (read(Some("a"), Some("v"), &[d]), a.clone(), TOPIC_HEADER, "is missing"),
            (read(Some("a"), Some("v"), &[t]), a.clone(), DELIVER_AT_HEADER, "is missing"),
            (
                read(Some("a"), Some("v"), &[t, d, (DELIVER_AT_HEADER, "5")]),
                a.clone(),
                DELAY_HEADER,
                "set one",
            ),
            (read(Some("a"), Some("v"), &[t, (DELAY_HEADER, "soon")]), a.clone(), DELAY_HEADER, "\"soon\""),
            (
                read(Some("a"), Some("v"), &[t, (DELIVER_AT_HEADER, "noon")]),
                a.clone(),
                DELIVER_AT_HEADER,
                "RFC 3339",
            ),
            (
                read(Some("a"), Some("v"), &[t, d, (PARTITION_HEADER, "-1")]),
                a.clone(),
                PARTITION_HEADER,
                "partition",
            ),
            (
                read(Some("a"), Some("v"), &[t, d, ("hourglass-dely", "1s")]),
                a.clone(),
                "headers",
                "hourglass-dely",
            ),
            (read(Some("a"), Some("v"), &[t, d, t]), a.clone(), TOPIC_HEADER, "twice"),
            (
                read(Some("a"), Some("v"), &[(TOPIC_HEADER, "no spaces"), d]),
                a.clone(),
                "message.topic",
                "contains",
            ),
            (read(Some("a"), Some(""), &[t, d]), a.clone(), "message.value", "empty"),
            (read(Some("a"), Some("v"), &[(TOPIC_HEADER, " "), d]), a.clone(), TOPIC_HEADER, "is empty"),
            (
                read(Some("a"), Some("v"), &[t, d, (LABELS_HEADER, "order")]),
                a.clone(),
                LABELS_HEADER,
                "key=value",
            ),
            (read(Some("a"), Some("v"), &[t, d, (LABELS_HEADER, "k=a b")]), a.clone(), LABELS_HEADER, "' '"),
            (
                read(Some("a"), Some("v"), &[t, d, (ON_CONFLICT_HEADER, "merge")]),
                a.clone(),
                ON_CONFLICT_HEADER,
                "merge",
            ),
        ];
        for (i, (got, id, field, says)) in cases.into_iter().enumerate() {
            let (got_id, got_field, got_reason) = reason(got);
            assert_eq!((got_id, got_field), (id, field), "case {i}: {got_reason}");
            assert!(got_reason.contains(says), "case {i}: {got_reason:?} should say {says:?}");
        }
    }

    #[test]
    fn a_rejection_reads_as_a_sentence() {
        let e = read(Some("a"), Some("v"), &[(DELAY_HEADER, "1s")]).unwrap_err();
        assert_eq!(e.to_string(), "message a: hourglass-topic is missing: it names the topic to deliver to");
    }

    proptest! {
        #[test]
        fn any_headers_but_ours_pass_through_in_order(
            headers in proptest::collection::vec(("[a-z][a-z0-9._-]{0,15}", proptest::collection::vec(any::<u8>(), 0..16)), 0..8),
            ms in any::<u64>(),
        ) {
            let headers: Vec<(String, Vec<u8>)> =
                headers.into_iter().filter(|(k, _)| !k.starts_with(RESERVED_HEADER_PREFIX)).collect();
            let ms_text = ms.to_string();
            let ours = [(TOPIC_HEADER, Some(&b"t"[..])), (DELIVER_AT_HEADER, Some(ms_text.as_bytes()))];
            let all = headers.iter().map(|(k, v)| (k.as_str(), Some(&v[..]))).chain(ours);
            match parse(Some(b"id"), Some(b"v"), all, &Limits::default()) {
                Ok(Native::Schedule { envelope, requested, .. }) => {
                    prop_assert_eq!(requested, DueSpec::At(UnixMillis(ms)));
                    let passed: Vec<(String, Vec<u8>)> =
                        envelope.headers.into_iter().map(|h| (h.key, h.value)).collect();
                    prop_assert_eq!(passed, headers);
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }
    }
}
