//! The store's own record: the dispatcher's progress and its counters.

use super::DispatchKey;

/// The dispatcher's progress and the store's counters, rewritten by every
/// commit that changes them.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Meta {
    /// Next acceptance sequence number.
    #[prost(uint64, tag = "1")]
    pub next_seq: u64,
    /// Messages waiting to be delivered.
    #[prost(uint64, tag = "2")]
    pub pending: u64,
    /// The due key of the latest delivery, encoded; empty before the first.
    /// Everything in the due CF below the dispatcher's position is settled;
    /// compaction uses this to drop the tombstones they left.
    #[prost(bytes = "vec", tag = "3")]
    pub last_delivered_key: Vec<u8>,
    #[prost(uint64, tag = "4")]
    pub delivered_total: u64,
    /// Cancelled since the store was created (counted from the version that
    /// added this field; 0 in older stores).
    #[prost(uint64, tag = "5")]
    pub cancelled_total: u64,
    /// Failed and not re-driven since: a failed message that is rescheduled
    /// leaves this count.
    #[prost(uint64, tag = "6")]
    pub failed_total: u64,
    /// Set when the store was closed with nothing in doubt: every produce
    /// handed to Kafka was answered and recorded. Cleared at open. A store
    /// opened without it (after a crash, or written by an older release)
    /// treats what was due before the open as possibly produced.
    #[prost(bool, tag = "7")]
    pub closed_cleanly: bool,
    /// Which layout of the counts entries ("c") the store holds: 0 (none,
    /// an older release) or [`COUNTS_VERSION`].
    #[prost(uint32, tag = "8")]
    pub counts_version: u32,
    /// The node's shard count when this store was first opened, and which
    /// of them it is; 0 shards: not recorded (an older release, which ran
    /// one shard).
    #[prost(uint32, tag = "9")]
    pub shards: u32,
    #[prost(uint32, tag = "10")]
    pub shard: u32,
    /// No due entry below this key is pending, encoded; empty: none known
    /// (a store written before 0.2, whose settled entries were deleted).
    /// Raised with the deliveries the dispatcher settles.
    #[prost(bytes = "vec", tag = "11")]
    pub floor: Vec<u8>,
    /// Cluster mode: the offset of the shard's log partition to apply
    /// next; everything before it is applied. Written in the batch that
    /// applies the records before it.
    #[prost(int64, tag = "12")]
    pub log_next: i64,
    /// Cluster mode: the node incarnation whose `Owner` record was applied
    /// last (0: none yet). Only it dispatches the shard.
    #[prost(uint64, tag = "13")]
    pub log_owner: u64,
    /// Cluster mode: the timestamp of the last record hourglass wrote that
    /// was applied (0: none yet, or a store from before this field). A
    /// copy that fell further behind than Kafka keeps tombstones may have
    /// missed some: see `cluster::applier::STALE_AFTER`.
    #[prost(uint64, tag = "14")]
    pub log_time_ms: u64,
    /// The dispatcher produces nothing due after this time (Unix ms) until
    /// a later value is recorded: after an unclean stop, only what was due
    /// by then can have been produced. None: a store from before this
    /// field, where whatever was due at the open may have been.
    #[prost(uint64, optional, tag = "15")]
    pub dispatch_horizon_ms: Option<u64>,
    /// The dispatcher produces nothing from below this key, encoded, until
    /// a lower value is recorded; empty: the floor. Above the floor when a
    /// paused topic's messages hold the floor down: they cannot have been
    /// produced, so after an unclean stop they are not in doubt.
    #[prost(bytes = "vec", tag = "16")]
    pub produced_from: Vec<u8>,
    /// Expired and not re-driven since.
    #[prost(uint64, tag = "17")]
    pub expired_total: u64,
    /// Dead-lettered and not re-driven since.
    #[prost(uint64, tag = "18")]
    pub dead_lettered_total: u64,
    /// The dispatcher produces nothing from this key on, encoded, until a
    /// later one is recorded: finer than `dispatch_horizon_ms` (which is
    /// kept at its time, for a build from before this field), so that a
    /// backlog due in one millisecond is in doubt after an unclean stop
    /// only as far as the dispatcher had read it. Empty: the time alone.
    #[prost(bytes = "vec", tag = "19")]
    pub dispatch_horizon: Vec<u8>,
}

impl Meta {
    /// The store-wide count of messages settled `kind`; none for one
    /// retrying (it is pending).
    pub fn settled_total(&mut self, kind: super::SettlementKind) -> Option<&mut u64> {
        match kind {
            super::SettlementKind::Retrying => None,
            super::SettlementKind::Delivered => Some(&mut self.delivered_total),
            super::SettlementKind::Cancelled => Some(&mut self.cancelled_total),
            super::SettlementKind::Failed => Some(&mut self.failed_total),
            super::SettlementKind::Expired => Some(&mut self.expired_total),
            super::SettlementKind::DeadLettered => Some(&mut self.dead_lettered_total),
        }
    }

    /// Below which the dispatcher may have produced without recording more
    /// (none: a store from before the horizon, where whatever was due). A
    /// build from before the key drops it when it rewrites this record,
    /// and keeps the time alone.
    pub fn horizon(&self) -> Option<DispatchKey> {
        DispatchKey::decode(&self.dispatch_horizon)
            .or_else(|| self.dispatch_horizon_ms.map(|ms| DispatchKey::after(crate::message::UnixMillis(ms))))
    }

    /// Records that the dispatcher may produce below `until`; false if it
    /// already could.
    pub fn extend_horizon(&mut self, until: DispatchKey) -> bool {
        if self.horizon().is_some_and(|h| h >= until) {
            return false;
        }
        self.set_horizon(until);
        true
    }

    /// Records that the dispatcher produced nothing from `until` on, and
    /// will not until it records more; false if that is recorded already.
    pub fn lower_horizon(&mut self, until: DispatchKey) -> bool {
        if self.horizon() == Some(until) {
            return false;
        }
        self.set_horizon(until);
        true
    }

    fn set_horizon(&mut self, until: DispatchKey) {
        self.dispatch_horizon = until.encode().to_vec();
        // Keys below `until` were due by its time. Never lowered: a build
        // from before the key reads the time alone, and must not find less
        // than was produced.
        self.dispatch_horizon_ms = Some(self.dispatch_horizon_ms.unwrap_or(0).max(until.at.0));
    }

    /// Where the first pending due entry may be.
    pub fn floor(&self) -> DispatchKey {
        DispatchKey::decode(&self.floor).unwrap_or(DispatchKey::MIN)
    }

    /// Where the first due entry the dispatcher may have produced may be:
    /// never below the floor.
    pub fn produced_from(&self) -> DispatchKey {
        DispatchKey::decode(&self.produced_from).map_or(self.floor(), |key| key.max(self.floor()))
    }
}

/// The layout of the counts entries this release writes.
pub(crate) const COUNTS_VERSION: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::UnixMillis;

    #[test]
    fn a_horizon_is_a_key_and_its_time_for_an_older_build() {
        let key = |at: u64, seq: u64| DispatchKey { at: UnixMillis(at), seq };
        let mut meta = Meta::default();
        assert_eq!(meta.horizon(), None, "a store from before the horizon");
        meta.dispatch_horizon_ms = Some(20);
        assert_eq!(meta.horizon(), Some(DispatchKey::after(UnixMillis(20))), "a time alone");
        assert!(!meta.extend_horizon(key(20, 5)), "within the time already recorded");
        assert!(meta.extend_horizon(key(30, 5)));
        assert_eq!(meta.horizon(), Some(key(30, 5)));
        assert_eq!(meta.dispatch_horizon_ms, Some(30), "what an older build reads covers the key");
        assert!(!meta.extend_horizon(key(30, 4)), "a horizon only moves on");
        // An older build rewrites the record without the key, and may move
        // the time on: the time alone bounds it then.
        meta.dispatch_horizon.clear();
        meta.dispatch_horizon_ms = Some(40);
        assert_eq!(meta.horizon(), Some(DispatchKey::after(UnixMillis(40))));
    }
}
