//! What a shard counts of one tenant's messages on one topic.

/// One tenant's messages on one topic, by state. `delivered`, `cancelled`,
/// `failed`, `expired` and `dead_lettered` count since the entry was made,
/// purged messages included.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Counts {
    #[prost(uint64, tag = "1")]
    pub pending: u64,
    #[prost(uint64, tag = "2")]
    pub delivered: u64,
    #[prost(uint64, tag = "3")]
    pub cancelled: u64,
    #[prost(uint64, tag = "4")]
    pub failed: u64,
    #[prost(uint64, tag = "5")]
    pub expired: u64,
    #[prost(uint64, tag = "6")]
    pub dead_lettered: u64,
}

impl Counts {
    pub fn add(&mut self, other: &Counts) {
        self.pending = self.pending.saturating_add(other.pending);
        self.delivered = self.delivered.saturating_add(other.delivered);
        self.cancelled = self.cancelled.saturating_add(other.cancelled);
        self.failed = self.failed.saturating_add(other.failed);
        self.expired = self.expired.saturating_add(other.expired);
        self.dead_lettered = self.dead_lettered.saturating_add(other.dead_lettered);
    }
}
