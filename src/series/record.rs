//! A series as its shard's store keeps it ([`SeriesRecord`], protobuf, so
//! that a newer build can add fields and an older one still reads it), and
//! what a record says: its state, its next occurrences, its answer to Get.

use super::spec::Spec;
use crate::{
    message::{Invalid, MessageId, UnixMillis},
    proto,
};

/// One series: its spec as the request gave it, and how far it has come.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SeriesRecord {
    #[prost(message, optional, tag = "1")]
    pub spec: Option<proto::SeriesSpec>,
    #[prost(uint64, tag = "2")]
    pub created_ms: u64,
    #[prost(uint64, tag = "3")]
    pub updated_ms: u64,
    /// Where an interval counts from when the spec gives no start.
    #[prost(uint64, tag = "4")]
    pub anchor_ms: u64,
    #[prost(bool, tag = "5")]
    pub paused: bool,
    /// The nominal time of the next occurrence to park; none once the
    /// series is over.
    #[prost(uint64, optional, tag = "6")]
    pub next_ms: Option<u64>,
    /// Occurrences parked so far, less those the downtime policy
    /// cancelled afterwards (Kafka could not take them in time).
    #[prost(uint64, tag = "7")]
    pub fired: u64,
    /// Missed occurrences the downtime policy left out.
    #[prost(uint64, tag = "8")]
    pub skipped: u64,
    /// Nominal times of the occurrences parked and not yet seen settled.
    #[prost(uint64, repeated, tag = "9")]
    pub parked: Vec<u64>,
    /// Nominal times of the occurrences being parked: written before they
    /// are, so that a crash between the two parks them again (the same id
    /// and content: a retry, answered as a duplicate).
    #[prost(uint64, repeated, tag = "10")]
    pub firing: Vec<u64>,
    /// The nominal time of the latest occurrence parked: a series changed
    /// (updated, resumed) goes on after it, never under the id of an
    /// occurrence it cancelled.
    #[prost(uint64, tag = "11")]
    pub last_parked_ms: u64,
    /// Nominal times of occurrences parked and still pending `missed.after`
    /// past their time (Kafka could not take them), which the downtime
    /// policy keeps: delivered when Kafka can take them.
    #[prost(uint64, repeated, tag = "12")]
    pub late: Vec<u64>,
    /// Why hourglass paused it itself (its tenant's grant no longer covers
    /// its topic); empty when a call paused it.
    #[prost(string, tag = "13")]
    pub paused_reason: String,
}

impl SeriesRecord {
    /// A series as its store keeps it.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<SeriesRecord, prost::DecodeError> {
        prost::Message::decode(bytes)
    }

    /// The bytes its store keeps.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(self)
    }

    /// The spec, read back: checked when it was written, so not again
    /// against the time now (an expression whose last match has passed
    /// reads, and the series is over).
    pub(crate) fn spec(&self) -> Result<Spec, Invalid> {
        Spec::read(&self.spec.clone().unwrap_or_default(), UnixMillis(self.anchor_ms))
    }

    /// The template's topic as written, even if the rest does not read:
    /// what a caller's grant is checked against.
    pub(crate) fn topic(&self) -> &str {
        self.spec.as_ref().and_then(|s| s.template.as_ref()).map_or("", |t| t.topic.as_str())
    }

    /// The first occurrence a changed series may park from `now` on: after
    /// every one it parked.
    pub(crate) fn next_from(&self, spec: &Spec, now: UnixMillis) -> Option<UnixMillis> {
        spec.rule.next_after(now.max(UnixMillis(self.last_parked_ms)), self.made())
    }

    /// Nominal times of the occurrences it parked that may be pending:
    /// parked and not seen settled, kept late, or being parked.
    pub(crate) fn pending(&self) -> impl Iterator<Item = &u64> {
        self.parked.iter().chain(&self.late).chain(&self.firing)
    }

    /// Occurrences passed so far, fired or skipped: what a count bounds.
    pub(crate) fn made(&self) -> u64 {
        self.fired + self.skipped
    }

    pub(crate) fn state(&self) -> proto::SeriesState {
        match (self.paused, self.next_ms) {
            (true, _) => proto::SeriesState::Paused,
            (false, None) => proto::SeriesState::Finished,
            (false, Some(_)) => proto::SeriesState::Active,
        }
    }

    /// The series' answer to Get: with its next `n` occurrences (their ids
    /// placed in `shards` shards).
    pub(crate) fn info(&self, id: &MessageId, spec: &Spec, n: usize, shards: u32) -> proto::SeriesInfo {
        let mut next = Vec::with_capacity(n);
        if let Some(at) = self.next_ms.filter(|_| !self.paused && n > 0) {
            next.push(UnixMillis(at));
            next.extend(spec.rule.upcoming(UnixMillis(at), self.made() + 1, n - 1));
        }
        proto::SeriesInfo {
            id: id.as_str().to_owned(),
            spec: self.spec.clone(),
            state: self.state().into(),
            created_at: Some(UnixMillis(self.created_ms).to_timestamp()),
            updated_at: Some(UnixMillis(self.updated_ms).to_timestamp()),
            fired: self.fired,
            next: next.into_iter().map(UnixMillis::to_timestamp).collect(),
            parked: self
                .pending()
                .map(|at| super::spec::occurrence_id(id, UnixMillis(*at), shards).as_str().to_owned())
                .collect(),
            skipped: self.skipped,
            tenant: id.tenant().unwrap_or_default().to_owned(),
            paused_reason: self.paused_reason.clone(),
        }
    }
}
