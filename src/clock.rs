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
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> UnixMillis {
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        UnixMillis(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
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
