//! Cluster mode: the dispatcher of a shard produces only while the node's
//! lease holds, a deadline on the monotonic clock that the node's group
//! membership keeps pushing forward. A process that was stopped (SIGSTOP, a
//! paused VM) finds its lease run out the moment it runs again, before its
//! membership is confirmed: it cannot produce what another node may own by
//! now.

use std::{
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

pub(crate) struct Lease {
    /// Where the monotonic clock is measured from.
    epoch: Instant,
    /// Microseconds after `epoch` until which the lease holds.
    until: AtomicU64,
}

impl Lease {
    /// A lease that holds nothing yet.
    pub(crate) fn new() -> Lease {
        Lease { epoch: Instant::now(), until: AtomicU64::new(0) }
    }

    /// Whether the node may produce now.
    pub(crate) fn holds(&self) -> bool {
        self.micros(Instant::now()) < self.until.load(Ordering::Acquire)
    }

    /// Holds until `at` (a later deadline than it has).
    pub(crate) fn extend_to(&self, at: Instant) {
        self.until.fetch_max(self.micros(at), Ordering::AcqRel);
    }

    /// Holds no more, until extended again.
    pub(crate) fn end(&self) {
        self.until.store(0, Ordering::Release);
    }

    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }
}

impl Default for Lease {
    fn default() -> Self {
        Lease::new()
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let left = self.until.load(Ordering::Acquire).saturating_sub(self.micros(Instant::now()));
        f.debug_struct("Lease").field("left", &Duration::from_micros(left)).finish()
    }
}

/// Keeps the lease: renewed for a second every 100 ms, unless the process
/// did not run for a while (then not until `confirm_after` later, when the
/// group will have said whether the node lost its shards).
pub(super) fn keep(lease: &Lease, confirm_after: Duration, stopping: &AtomicBool) {
    const TICK: Duration = Duration::from_millis(100);
    const TERM: Duration = Duration::from_secs(1);
    let mut last = Instant::now();
    let mut confirm_at = last;
    while !stopping.load(Ordering::Acquire) {
        std::thread::sleep(TICK);
        let now = Instant::now();
        let gap = now.saturating_duration_since(last);
        if gap >= TERM {
            lease.end();
            confirm_at = now + confirm_after;
            tracing::warn!(
                stopped_for = ?gap,
                "this process did not run for a while: not dispatching until the group confirms its shards"
            );
        }
        last = now;
        if now >= confirm_at {
            lease.extend_to(now + TERM);
        }
    }
    lease.end();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_holds_until_its_deadline_and_not_after_it_ends() {
        let lease = Lease::new();
        assert!(!lease.holds(), "a new lease holds nothing");
        lease.extend_to(Instant::now() + Duration::from_secs(60));
        assert!(lease.holds());
        lease.extend_to(Instant::now());
        assert!(lease.holds(), "an earlier deadline does not shorten it");
        lease.end();
        assert!(!lease.holds());
        lease.extend_to(Instant::now() - Duration::from_millis(1));
        assert!(!lease.holds(), "a deadline passed holds nothing");
    }
}
