//! Fail points: named places where a test can make the process crash, to
//! prove that a crash exactly there loses nothing. Compiled in only with the
//! `failpoints` cargo feature; without it [`hit`] is empty.
//!
//! `HOURGLASS_FAILPOINT=NAME` aborts the process the first time NAME is
//! reached, `NAME@N` the N-th time; `NAME@N..M` (for [`fires`]) from the
//! N-th time to the M-th. The points:
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
//! | `store-read-io` | reading a due message's record fails with an I/O error |
//! | `log-reader-stalls` | cluster mode: a copy of a shard stops applying the log the first time it has read all there was |
//! | `forecast-slow` | a forecast takes 2 s more once it has its turn |
//! | `forecast-short` | a forecast counts at most 3 due entries per store, not 2 million |
//! | `reconcile-slow` | the search for what an unclean stop left in doubt takes 5 s more |
//! | `store-writer-panics` | a store's writer thread panics before a round that is not only its clock's tick |
//! | `store-writes-out-at-once` | cluster mode: a store writes its memtables out at its next tick (500 ms), not 30 s after a commit |

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::{
        LazyLock,
        atomic::{AtomicU64, Ordering},
    };

    /// The armed point, the hits it fires on (from the first to the last,
    /// counted from 1), and how many hits there have been.
    static ARMED: LazyLock<Option<(String, u64, u64, AtomicU64)>> = LazyLock::new(|| {
        let spec = std::env::var("HOURGLASS_FAILPOINT").ok()?;
        let (name, first, last) = match spec.split_once('@') {
            Some((name, range)) => {
                let (first, last) = match range.split_once("..") {
                    Some((first, last)) => (first, last),
                    None => (range, range),
                };
                let first = first.parse::<u64>().unwrap_or(1).max(1);
                (name.to_owned(), first, last.parse::<u64>().unwrap_or(first).max(first))
            }
            None => (spec, 1, 1),
        };
        Some((name, first, last, AtomicU64::new(0)))
    });

    /// True the hits of `name` the test armed it for.
    pub(super) fn fires(name: &str) -> bool {
        let Some((armed, first, last, hits)) = ARMED.as_ref() else { return false };
        if armed != name {
            return false;
        }
        let hit = hits.fetch_add(1, Ordering::SeqCst) + 1;
        (*first..=*last).contains(&hit)
    }
}

/// Crashes the process here if the test armed this point.
#[cfg(feature = "failpoints")]
pub(crate) fn hit(name: &str) {
    if armed::fires(name) {
        eprintln!("fail point {name} reached: aborting");
        std::process::abort();
    }
}

/// Whether the test armed this point and it is now reached: the caller
/// then breaks what the point names.
#[cfg(feature = "failpoints")]
pub(crate) fn fires(name: &str) -> bool {
    armed::fires(name)
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn hit(_name: &str) {}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn fires(_name: &str) -> bool {
    false
}
