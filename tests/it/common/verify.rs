//! The verifier: what the reliability scenarios judge hourglass by.
//!
//! A [`Ledger`] records every message hourglass acknowledged (id, due time,
//! topic) and every one it said it cancelled. [`collect`] reads the target
//! topics with a real Kafka consumer. [`Verdict`] compares the two:
//! *lost* = acknowledged and never delivered (nor cancelled); *early* =
//! delivered before its due time; *duplicate* = the same `hourglass-id`
//! seen more than once.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Mutex,
    time::{Duration, Instant},
};

use hourglass::proto;
use rdkafka::{
    ClientConfig, Message as _, Offset, TopicPartitionList,
    consumer::{BaseConsumer, Consumer},
    message::Headers,
};

/// One acknowledged message, as its acknowledgement said.
#[derive(Clone, Debug)]
pub struct Acked {
    pub due_ms: i64,
    pub topic: String,
}

#[derive(Default)]
pub struct Ledger {
    acked: Mutex<HashMap<String, Acked>>,
    cancelled: Mutex<HashSet<String>>,
}

impl Ledger {
    pub fn ack(&self, id: &str, due_ms: i64, topic: &str) {
        let acked = Acked { due_ms, topic: topic.to_owned() };
        let mut all = self.acked.lock().unwrap();
        if let Some(before) = all.insert(id.to_owned(), acked)
            && before.due_ms != due_ms
        {
            panic!("{id} was acknowledged twice with different due times: {} and {due_ms}", before.due_ms);
        }
    }

    /// `id` was moved to `due_ms` by a reschedule.
    pub fn rescheduled(&self, id: &str, due_ms: i64) {
        let mut all = self.acked.lock().unwrap();
        let acked = all.get_mut(id).unwrap_or_else(|| panic!("{id} was rescheduled but never acknowledged"));
        acked.due_ms = due_ms;
    }

    pub fn cancelled(&self, id: &str) {
        self.cancelled.lock().unwrap().insert(id.to_owned());
    }

    pub fn len(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids that must be delivered: acknowledged and not cancelled.
    pub fn expected(&self) -> HashSet<String> {
        let cancelled = self.cancelled.lock().unwrap();
        self.acked.lock().unwrap().keys().filter(|id| !cancelled.contains(*id)).cloned().collect()
    }

    pub fn verdict(&self, records: &[Delivery]) -> Verdict {
        let acked = self.acked.lock().unwrap();
        let cancelled = self.cancelled.lock().unwrap();
        let mut seen: BTreeMap<&str, Vec<&Delivery>> = BTreeMap::new();
        for r in records {
            seen.entry(r.id.as_str()).or_default().push(r);
        }
        let mut v = Verdict { acknowledged: acked.len(), cancelled: cancelled.len(), ..Verdict::default() };
        for (id, a) in acked.iter() {
            let Some(copies) = seen.get(id.as_str()) else {
                if !cancelled.contains(id) {
                    v.lost.push(id.clone());
                }
                continue;
            };
            if cancelled.contains(id) {
                v.delivered_after_cancel.push(id.clone());
            }
            v.delivered += 1;
            let first = copies.iter().map(|c| c.timestamp_ms).min().unwrap_or_default();
            v.lateness_ms.push(first - a.due_ms);
            for c in copies {
                if c.timestamp_ms < a.due_ms {
                    v.early.push((id.clone(), a.due_ms - c.timestamp_ms));
                }
                if c.topic != a.topic {
                    v.wrong_topic.push(id.clone());
                }
            }
        }
        for (id, copies) in &seen {
            if copies.len() > 1 {
                let mut at: Vec<i64> = copies.iter().map(|c| c.timestamp_ms).collect();
                at.sort_unstable();
                v.duplicates.push(((*id).to_owned(), at));
            }
            if !acked.contains_key(*id) {
                v.unacknowledged += 1;
            }
        }
        v.lateness_ms.sort_unstable();
        v
    }
}

/// One record as the consumer saw it.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub id: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The record's create time: when hourglass produced it, Unix ms.
    pub timestamp_ms: i64,
}

/// Reads `topics` from the beginning until every id in `expected` arrived
/// or `within` passed, then `settle` longer to catch late duplicates.
/// Blocking: call it from `spawn_blocking` or a plain thread.
pub fn collect(
    broker: &str,
    topics: &[&str],
    expected: &HashSet<String>,
    within: Duration,
    settle: Duration,
) -> Vec<Delivery> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", super::random_name("verifier"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100")
        .create()
        .expect("creating the verifier's consumer");
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(30)).expect("topic metadata");
        for p in metadata.topics()[0].partitions() {
            assignment.add_partition_offset(topic, p.id(), Offset::Beginning).unwrap();
        }
    }
    consumer.assign(&assignment).unwrap();
    let mut out = Vec::new();
    let mut missing = expected.clone();
    let mut deadline = Instant::now() + within;
    let mut settling = false;
    while Instant::now() < deadline {
        if missing.is_empty() && !settling {
            settling = true;
            deadline = Instant::now() + settle;
        }
        let Some(message) = consumer.poll(Duration::from_millis(100)) else { continue };
        let m = match message {
            Ok(m) => m,
            Err(e) => {
                eprintln!("verifier: consumer error {e}; going on");
                continue;
            }
        };
        // Records of other producers on the same topic carry no id.
        let Some(id) = m
            .headers()
            .and_then(|hs| hs.iter().find(|h| h.key == "hourglass-id").and_then(|h| h.value))
            .map(|v| String::from_utf8_lossy(v).into_owned())
        else {
            continue;
        };
        missing.remove(&id);
        out.push(Delivery {
            id,
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            timestamp_ms: m.timestamp().to_millis().unwrap_or(-1),
        });
    }
    out
}

pub async fn collect_async(
    broker: &str,
    topics: &[&str],
    expected: HashSet<String>,
    within: Duration,
    settle: Duration,
) -> Vec<Delivery> {
    let broker = broker.to_owned();
    let topics: Vec<String> = topics.iter().map(|t| (*t).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        collect(&broker, &topics, &expected, within, settle)
    })
    .await
    .unwrap()
}

#[derive(Debug, Default)]
pub struct Verdict {
    pub acknowledged: usize,
    pub cancelled: usize,
    /// Acknowledged ids seen at least once.
    pub delivered: usize,
    pub lost: Vec<String>,
    /// (id, how many ms before its due time).
    pub early: Vec<(String, i64)>,
    /// (id, the create time of every copy).
    pub duplicates: Vec<(String, Vec<i64>)>,
    pub delivered_after_cancel: Vec<String>,
    pub wrong_topic: Vec<String>,
    /// Records whose id was never acknowledged (stored, then the answer was
    /// lost with a crash): allowed, and counted.
    pub unacknowledged: usize,
    /// First copy's create time minus due time, sorted.
    pub lateness_ms: Vec<i64>,
}

impl Verdict {
    pub fn lateness(&self, p: f64) -> i64 {
        if self.lateness_ms.is_empty() {
            return 0;
        }
        let i = ((self.lateness_ms.len() - 1) as f64 * p).round() as usize;
        self.lateness_ms[i]
    }

    /// One line with every figure, for the test's output and the docs.
    pub fn summary(&self) -> String {
        format!(
            "acknowledged {} cancelled {} delivered {} lost {} early {} duplicates {} \
             delivered-after-cancel {} unacknowledged-delivered {} lateness ms p50 {} p99 {} max {}",
            self.acknowledged,
            self.cancelled,
            self.delivered,
            self.lost.len(),
            self.early.len(),
            self.duplicates.len(),
            self.delivered_after_cancel.len(),
            self.unacknowledged,
            self.lateness(0.5),
            self.lateness(0.99),
            self.lateness_ms.last().copied().unwrap_or_default(),
        )
    }

    /// Fails the test on any loss, early delivery, delivery after a
    /// cancel or record on the wrong topic.
    pub fn assert_nothing_lost_or_early(&self) {
        let show = |v: &[String]| v.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        assert!(
            self.lost.is_empty(),
            "lost {}: {} … ({})",
            self.lost.len(),
            show(&self.lost),
            self.summary()
        );
        assert!(
            self.early.is_empty(),
            "early: {:?} ({})",
            &self.early[..self.early.len().min(5)],
            self.summary()
        );
        assert!(
            self.delivered_after_cancel.is_empty(),
            "delivered after cancel: {}",
            show(&self.delivered_after_cancel)
        );
        assert!(self.wrong_topic.is_empty(), "on the wrong topic: {}", show(&self.wrong_topic));
    }
}

/// A message for `topic` under `id` (its key too), due at `due_ms`.
pub fn due_message(topic: &str, id: &str, due_ms: i64) -> proto::ScheduleRequest {
    proto::ScheduleRequest {
        message: Some(proto::Message {
            topic: topic.into(),
            key: Some(id.as_bytes().to_vec()),
            value: format!("payload of {id}").into_bytes(),
            headers: vec![],
            partition: None,
        }),
        due: Some(proto::schedule_request::Due::DeliverAt(prost_types::Timestamp {
            seconds: due_ms.div_euclid(1000),
            nanos: (due_ms.rem_euclid(1000) * 1_000_000) as i32,
        })),
        id: Some(id.into()),
        on_conflict: 0,
        labels: Default::default(),
        max_lateness: None,
        dead_letter_topic: String::new(),
    }
}
