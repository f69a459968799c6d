//! Wall-clock time, injectable. Due times are wall-clock; waiting is done on
//! tokio's monotonic timer and the wall clock is read again on waking, so a
//! clock step never delivers early. Tests swap in a [`ManualClock`].

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::message::UnixMillis;

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> UnixMillis;

    /// How long until `t` begins; zero if it has. A clock that knows time
    /// finer than milliseconds says so here, so a sleep ends at the start of
    /// the due millisecond rather than up to a millisecond after it.
    fn until(&self, t: UnixMillis) -> Duration {
        t.since(self.now())
    }
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

fn since_epoch() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO)
}

impl Clock for SystemClock {
    fn now(&self) -> UnixMillis {
        UnixMillis(u64::try_from(since_epoch().as_millis()).unwrap_or(u64::MAX))
    }

    fn until(&self, t: UnixMillis) -> Duration {
        Duration::from_millis(t.0).saturating_sub(since_epoch())
    }
}

/// A clock that moves only when told to, forwards or backwards.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(now: UnixMillis) -> Self {
        ManualClock(AtomicU64::new(now.0))
    }

    pub fn set(&self, now: UnixMillis) {
        self.0.store(now.0, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(u64::try_from(by.as_millis()).unwrap_or(u64::MAX), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> UnixMillis {
        UnixMillis(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_counts_to_the_start_of_the_millisecond() {
        let now = SystemClock.now();
        let left = SystemClock.until(UnixMillis(now.0 + 10));
        assert!(left <= Duration::from_millis(10) && left > Duration::from_millis(8), "{left:?}");
        assert_eq!(SystemClock.until(UnixMillis(now.0.saturating_sub(5))), Duration::ZERO);
        let manual = ManualClock::new(UnixMillis(1_000));
        assert_eq!(manual.until(UnixMillis(1_250)), Duration::from_millis(250));
    }
}
