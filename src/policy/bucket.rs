//! A token bucket: `per_second` tokens a second, at most `burst` kept. The
//! dispatcher takes one per message it produces to a limited topic; when
//! none is left the topic waits, and [`Bucket::ready_in`] says how long
//! until a step's worth is back (a step is 5 ms of the rate, so a backlog
//! comes out in small even steps rather than one message per wake-up).

use std::time::Duration;

use tokio::time::Instant;

use super::Rate;

/// The share of a second a backlog comes out in at once, at most.
const STEP: Duration = Duration::from_millis(5);

#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    rate: Rate,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket.
    pub(crate) fn new(rate: Rate, now: Instant) -> Bucket {
        Bucket { rate, tokens: f64::from(rate.burst.max(1)), at: now }
    }

    pub(crate) fn rate(&self) -> Rate {
        self.rate
    }

    /// Keeps what it holds under a changed limit (no more than the new
    /// burst).
    pub(crate) fn set_rate(&mut self, rate: Rate, now: Instant) {
        self.refill(now);
        self.rate = rate;
        self.tokens = self.tokens.min(f64::from(rate.burst.max(1)));
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens =
            (self.tokens + elapsed * f64::from(self.rate.per_second)).min(f64::from(self.rate.burst.max(1)));
        self.at = now;
    }

    /// Whole tokens now.
    pub(crate) fn available(&mut self, now: Instant) -> u64 {
        self.refill(now);
        self.tokens.floor() as u64
    }

    /// Takes one token if there is one.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How long until a step's worth of tokens (at least one, at most the
    /// burst) is there.
    pub(crate) fn ready_in(&mut self, now: Instant) -> Duration {
        self.refill(now);
        let per_second = f64::from(self.rate.per_second.max(1));
        let step = (per_second * STEP.as_secs_f64()).clamp(1.0, f64::from(self.rate.burst.max(1)));
        let missing = step - self.tokens;
        if missing <= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(missing / per_second) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_gives_its_burst_then_the_rate() {
        let start = Instant::now();
        let mut b = Bucket::new(Rate { per_second: 1000, burst: 10 }, start);
        assert_eq!((0..20).filter(|_| b.take(start)).count(), 10, "the burst at once");
        assert!(!b.take(start));
        let later = start + Duration::from_millis(5);
        assert_eq!(b.available(later), 5, "then the rate: 5 ms of 1000/s");
        let much_later = start + Duration::from_secs(60);
        assert_eq!(b.available(much_later), 10, "never more than the burst");
    }

    #[test]
    fn it_says_when_a_step_is_back() {
        let start = Instant::now();
        let mut b = Bucket::new(Rate { per_second: 20_000, burst: 2_000 }, start);
        while b.take(start) {}
        // 5 ms of 20,000/s is 100 tokens.
        assert_eq!(b.ready_in(start), Duration::from_millis(5));
        let mut slow = Bucket::new(Rate { per_second: 2, burst: 1 }, start);
        assert!(slow.take(start));
        assert_eq!(slow.ready_in(start), Duration::from_millis(500), "one token, at the rate");
    }

    #[test]
    fn a_lower_limit_keeps_no_more_than_its_burst() {
        let start = Instant::now();
        let mut b = Bucket::new(Rate { per_second: 1000, burst: 1000 }, start);
        b.set_rate(Rate { per_second: 10, burst: 1 }, start);
        assert_eq!(b.available(start), 1);
    }
}
