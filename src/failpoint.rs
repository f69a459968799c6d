//! Fail points: named places where a test can make the process crash, to
//! prove that a crash exactly there loses nothing. Compiled in only with the
//! `failpoints` cargo feature; without it [`hit`] is empty.
//!
//! `HOURGLASS_FAILPOINT=NAME` aborts the process the first time NAME is
//! reached, `NAME@N` the N-th time. The points:
//!
//! | name                     | where                                                        |
//! |--------------------------|--------------------------------------------------------------|
//! | `store-mid-batch`        | half of a `ScheduleBatch` is in the write batch, none written |
//! | `store-before-ack`       | a commit is durable, its requests not yet answered           |
//! | `dispatch-before-settle` | Kafka acknowledged a record, the delivery is not recorded    |
//!
//! And one that does not crash but breaks something ([`fires`]):
//!
//! | name          | what                                                             |
//! |---------------|------------------------------------------------------------------|
//! | `kafka-fatal` | the producer raises a fatal error (as an idempotent producer does when the broker lost its sequence state) |

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::{
        LazyLock,
        atomic::{AtomicU64, Ordering},
    };

    /// The armed point and how many more hits it lets pass.
    static ARMED: LazyLock<Option<(String, AtomicU64)>> = LazyLock::new(|| {
        let spec = std::env::var("HOURGLASS_FAILPOINT").ok()?;
        let (name, nth) = match spec.split_once('@') {
            Some((name, n)) => (name.to_owned(), n.parse::<u64>().unwrap_or(1).max(1)),
            None => (spec, 1),
        };
        Some((name, AtomicU64::new(nth - 1)))
    });

    /// True the N-th time `name` is reached, once.
    pub fn fires(name: &str) -> bool {
        let Some((armed, left)) = ARMED.as_ref() else { return false };
        armed == name && left.fetch_sub(1, Ordering::SeqCst) == 0
    }
}

/// Crashes the process here if the test armed this point.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    if armed::fires(name) {
        eprintln!("fail point {name} reached: aborting");
        std::process::abort();
    }
}

/// Whether the test armed this point and it is now reached: the caller
/// then breaks what the point names.
#[cfg(feature = "failpoints")]
pub fn fires(name: &str) -> bool {
    armed::fires(name)
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn fires(_name: &str) -> bool {
    false
}
