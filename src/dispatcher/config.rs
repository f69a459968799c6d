//! The dispatcher's settings, and the retry policy they make: how long to
//! back off, and when refusals have gone on long enough to give up.

use std::{sync::Arc, time::Duration};

use crate::{
    command::{Outcome, Tries},
    kafka::{Fault, ProduceError},
    message::{ReservedTopics, UnixMillis},
};

#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    /// Messages produced and not yet acknowledged, at most (stalled ones
    /// aside).
    pub max_in_flight: usize,
    /// Refusals before a message (or the messages of a refused topic) may be
    /// failed.
    pub max_attempts: u32,
    /// How long refusals must have gone on before a message may be failed.
    pub fail_after: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Longest sleep before reading the wall clock again.
    pub max_sleep: Duration,
    /// How long shutdown waits for in-flight produces to be acknowledged.
    pub shutdown_grace: Duration,
    /// A produce unanswered for this long stalls its topic.
    pub stall_after: Duration,
    /// Where messages that fail or expire go when neither they nor their
    /// topic's policy say.
    pub dead_letter_topic: Option<Arc<str>>,
    /// Topics hourglass writes itself: never produced to for a message,
    /// whatever it names (one parked before they were refused at the door).
    pub reserved: ReservedTopics,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            max_in_flight: 10_000,
            max_attempts: 5,
            fail_after: Duration::from_secs(10 * 60),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            max_sleep: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
            stall_after: Duration::from_secs(10),
            dead_letter_topic: None,
            reserved: ReservedTopics::default(),
        }
    }
}

impl DispatcherConfig {
    /// Wait before try number `attempts + 1`: exponential, capped.
    pub fn backoff(&self, attempts: u32) -> Duration {
        let factor = 1u32.checked_shl(attempts.min(20)).unwrap_or(u32::MAX);
        self.backoff_initial.saturating_mul(factor).min(self.backoff_max)
    }

    /// Whether refusals that began at `since`, `tries` of them by now, are
    /// enough to give up.
    pub(super) fn gives_up(&self, since: UnixMillis, tries: u32, now: UnixMillis) -> bool {
        tries >= self.max_attempts && now.since(since) >= self.fail_after
    }

    /// What a produce error means for a message with `prev` tries behind
    /// it, when the fault is the message's own or an outage. (A refused
    /// topic is handled for the whole topic.)
    pub(super) fn outcome_of_error(&self, error: ProduceError, prev: &Tries, now: UnixMillis) -> Outcome {
        let refused = error.fault == Fault::MessageRefused;
        if refused {
            let since = prev.first_refused_at.unwrap_or(now);
            if self.gives_up(since, prev.rejections.saturating_add(1), now) {
                return Outcome::Failed { error: error.reason, tried: true };
            }
        }
        Outcome::Retry {
            retry_at: now.saturating_add(self.backoff(prev.attempts)),
            error: error.reason,
            refused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let c = DispatcherConfig {
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
            ..DispatcherConfig::default()
        };
        assert_eq!(c.backoff(0), Duration::from_millis(100));
        assert_eq!(c.backoff(1), Duration::from_millis(200));
        assert_eq!(c.backoff(3), Duration::from_millis(800));
        assert_eq!(c.backoff(4), Duration::from_secs(1));
        assert_eq!(c.backoff(u32::MAX), Duration::from_secs(1));
    }

    fn tried(attempts: u32, rejections: u32, first_refused_at_ms: u64) -> Tries {
        let first_refused_at = (first_refused_at_ms > 0).then_some(UnixMillis(first_refused_at_ms));
        Tries { attempts, rejections, first_refused_at, recorded: attempts > 0 }
    }

    #[test]
    fn a_refused_message_fails_only_after_enough_tries_and_enough_time() {
        let c = DispatcherConfig {
            max_attempts: 3,
            fail_after: Duration::from_secs(60),
            ..DispatcherConfig::default()
        };
        let too_large = || ProduceError { fault: Fault::MessageRefused, reason: "too large".into() };
        let outage = ProduceError { fault: Fault::Outage, reason: "queue full".into() };
        let at = |ms| UnixMillis(ms);
        assert!(matches!(
            c.outcome_of_error(outage, &tried(500, 2, 1), at(1_000_000)),
            Outcome::Retry { refused: false, .. }
        ));
        // Enough tries, not enough time: the glitch fails nothing.
        assert!(matches!(
            c.outcome_of_error(too_large(), &tried(9, 9, 1_000), at(30_000)),
            Outcome::Retry { refused: true, .. }
        ));
        // Enough time, not enough tries.
        assert!(matches!(
            c.outcome_of_error(too_large(), &tried(1, 1, 1_000), at(1_000_000)),
            Outcome::Retry { refused: true, .. }
        ));
        // The first refusal starts the clock.
        assert!(matches!(
            c.outcome_of_error(too_large(), &tried(5, 5, 0), at(1_000_000)),
            Outcome::Retry { refused: true, .. }
        ));
        match c.outcome_of_error(too_large(), &tried(2, 2, 1_000), at(61_000)) {
            Outcome::Failed { error, tried } => assert!(tried && error == "too large"),
            other => panic!("the third refusal a minute on must fail the message, got {other:?}"),
        }
    }

    #[test]
    fn counters_at_their_limits_neither_wrap_nor_panic() {
        let c = DispatcherConfig { max_attempts: u32::MAX, ..DispatcherConfig::default() };
        let too_large = || ProduceError { fault: Fault::MessageRefused, reason: "too large".into() };
        let worn = tried(u32::MAX, u32::MAX, 1);
        match c.outcome_of_error(too_large(), &worn, UnixMillis(u64::MAX)) {
            Outcome::Failed { .. } => {}
            other => panic!("a message refused u32::MAX times for ages is failed, not retried: {other:?}"),
        }
        let retry = c.outcome_of_error(
            ProduceError { fault: Fault::Outage, reason: "x".into() },
            &worn,
            UnixMillis(u64::MAX - 1),
        );
        assert!(matches!(retry, Outcome::Retry { retry_at: UnixMillis(u64::MAX), .. }), "{retry:?}");
        assert!(c.gives_up(UnixMillis(0), u32::MAX, UnixMillis(u64::MAX)));
        assert!(!c.gives_up(UnixMillis(u64::MAX), u32::MAX, UnixMillis(0)), "a clock behind counts no time");
    }
}
