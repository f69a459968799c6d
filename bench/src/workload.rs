//! The records the bench sends: the same shape for hourglass and for the
//! limits measured beside it.

use hourglass::{message::Envelope, proto};

#[derive(Clone, Debug)]
pub struct Workload {
    pub topic: String,
    pub value_bytes: usize,
    /// Distinct keys, spread over the partitions.
    pub keys: usize,
    /// Ids `<prefix>-<i>` chosen by the client, spread over every shard;
    /// none: each node makes ids of its own shards.
    pub ids: Option<String>,
    /// Labels every record is scheduled with.
    pub labels: Vec<(String, String)>,
    /// Whether each call carries a sampled `traceparent` of its own
    /// (`--trace`).
    pub traced: bool,
}

impl Workload {
    /// Records for `topic` of `value_bytes`, over 10,000 keys, with ids the
    /// server makes and no labels.
    pub fn new(topic: &str, value_bytes: usize) -> Workload {
        Workload {
            topic: topic.to_owned(),
            value_bytes,
            keys: 10_000,
            ids: None,
            labels: Vec::new(),
            traced: false,
        }
    }

    fn key(&self, i: usize) -> Vec<u8> {
        format!("key-{:06}", i % self.keys.max(1)).into_bytes()
    }

    fn value(&self, i: usize) -> Vec<u8> {
        let mut v = format!("{i:012}").into_bytes();
        v.resize(self.value_bytes.max(v.len()), b'.');
        v
    }

    pub fn envelope(&self, i: usize) -> Envelope {
        Envelope {
            topic: self.topic.clone(),
            key: Some(self.key(i)),
            value: self.value(i),
            headers: vec![],
            partition: None,
            labels: Default::default(),
            max_lateness: None,
            dead_letter_topic: None,
        }
    }

    /// A request for record `i`, due at `due_ms` (Unix milliseconds).
    pub fn at(&self, i: usize, due_ms: u64) -> proto::ScheduleRequest {
        proto::ScheduleRequest {
            message: Some(self.envelope(i).into()),
            due: Some(proto::schedule_request::Due::DeliverAt(hourglass::api::convert::timestamp(
                hourglass::message::UnixMillis(due_ms),
            ))),
            id: self.ids.as_ref().map(|prefix| format!("{prefix}-{i}")),
            on_conflict: 0,
            labels: self.labels.iter().cloned().collect(),
            max_lateness: None,
            dead_letter_topic: String::new(),
        }
    }

    /// A call with `message`, traced if the workload is.
    pub fn call<T>(&self, message: T) -> tonic::Request<T> {
        let mut call = tonic::Request::new(message);
        if self.traced {
            call.metadata_mut().insert("traceparent", crate::otlp::traceparent());
        }
        call
    }
}

pub fn now_ms() -> u64 {
    chrono::Utc::now().timestamp_millis() as u64
}
