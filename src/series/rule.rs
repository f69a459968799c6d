//! When a series' occurrences fall: a cron expression read in an IANA time
//! zone, or a fixed interval from an anchor; bounded by a start, an end
//! and a count; each moved by a jitter of its own that the same series
//! and occurrence always get.
//!
//! Cron expressions are parsed and walked by `croner`: five fields, or six
//! with seconds first, the `@yearly` … `@hourly` names, and `L`, `W` and
//! `#` in the day fields. Zones come from `chrono-tz`, which carries the
//! IANA database inside the binary, so a slim container without
//! `/usr/share/zoneinfo` computes the same times as a laptop. The wall
//! clock of a zone skips and repeats times when daylight saving starts and
//! ends; an expression of fixed times (`30 2 * * *`) then fires once a day
//! still: a 02:30 that does not exist fires at the first instant after the
//! gap (03:00 where the clock jumps from 02:00 to 03:00), and a 02:30 that
//! happens twice fires at the first of them. An expression of wildcards
//! and steps in its hour field (`*/15 * * * *`) fires on every instant
//! that matches on the clock as it runs: none inside a gap, and each of
//! the repeated quarter hours twice (they are different instants).
//!
//! An interval counts in absolute time from its anchor (the series' start,
//! or when it was made): daylight saving does not move it.

use std::{str::FromStr as _, time::Duration};

use chrono::{DateTime, TimeZone as _, Utc};
use chrono_tz::Tz;
use croner::{Cron, errors::CronError};

use crate::message::{UnixMillis, duration_ms};

/// The shortest interval a series may have: occurrences are ordinary
/// messages, each written to the store (and, in a cluster, to the log).
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Occurrences of a cron expression walked to find its closest two: its
/// fields repeat, so a walk meets each kind of gap early (a burst on one
/// day of the year at that day's first occurrence).
const GAP_WALK: usize = 1000;
/// The longest a series looks ahead for its next occurrence: an
/// expression that matches nothing within it (`0 0 30 2 *`) is refused.
const HORIZON_YEARS: i32 = 10;

/// Why a rule was refused, in words for the person who wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RuleError {
    #[error("cron expression {expr:?}: {reason}")]
    Cron { expr: String, reason: String },
    #[error("unknown time zone {0:?}: give an IANA name such as Europe/Berlin, America/New_York or UTC")]
    Zone(String),
    #[error("interval {0:?} is shorter than the shortest a series may have, {MIN_INTERVAL:?}")]
    Interval(Duration),
}

/// How a series repeats.
#[derive(Debug, Clone)]
pub(crate) enum Every {
    /// A cron expression read in `zone`.
    Cron { cron: Box<Cron>, zone: Tz },
    /// A fixed interval, counted from `anchor`.
    Interval { every: Duration, anchor: UnixMillis },
}

impl Every {
    /// A cron expression read in the IANA zone `zone`.
    pub(crate) fn cron(expr: &str, zone: &str) -> Result<Every, RuleError> {
        let every = Every::cron_read(expr, zone)?;
        // An expression that never matches (a 30th of February) is no
        // series: say so now rather than park nothing.
        let from = UnixMillis(Utc::now().timestamp_millis().max(0) as u64);
        if every.next_after(from).is_none() {
            let reason = format!("matches no time in the next {HORIZON_YEARS} years");
            return Err(RuleError::Cron { expr: expr.to_owned(), reason });
        }
        Ok(every)
    }

    /// A cron expression as [`cron`](Self::cron) reads it, without asking
    /// that it match again: for one read back, whose last match may have
    /// passed since.
    pub(crate) fn cron_read(expr: &str, zone: &str) -> Result<Every, RuleError> {
        let zone: Tz = zone.parse().map_err(|_| RuleError::Zone(zone.to_owned()))?;
        let refused = |reason: String| RuleError::Cron { expr: expr.to_owned(), reason };
        let cron = Cron::from_str(expr).map_err(|e| refused(cron_reason(&e)))?;
        Ok(Every::Cron { cron: Box::new(cron), zone })
    }

    /// Every `every`, from `anchor`.
    pub(crate) fn interval(every: Duration, anchor: UnixMillis) -> Result<Every, RuleError> {
        if every < MIN_INTERVAL {
            return Err(RuleError::Interval(every));
        }
        Ok(Every::Interval { every, anchor })
    }

    /// The least time between two occurrences from `from` on: the
    /// interval; for a cron expression, the least among its next
    /// [`GAP_WALK`] occurrences. None if fewer than two follow.
    pub(crate) fn shortest_gap(&self, from: UnixMillis) -> Option<Duration> {
        match self {
            Every::Interval { every, .. } => Some(*every),
            Every::Cron { .. } => {
                let mut at = self.next_after(from)?;
                let mut least: Option<u64> = None;
                for _ in 0..GAP_WALK {
                    let Some(next) = self.next_after(at) else { break };
                    let gap = next.0.saturating_sub(at.0);
                    least = Some(least.map_or(gap, |least| least.min(gap)));
                    at = next;
                }
                least.map(Duration::from_millis)
            }
        }
    }

    /// The last occurrence at or before `t`, if there is one within the
    /// horizon.
    pub(crate) fn at_or_before(&self, t: UnixMillis) -> Option<UnixMillis> {
        match self {
            Every::Interval { every, anchor } => {
                let step = duration_ms(*every).max(1);
                (t >= *anchor).then(|| UnixMillis(t.0 - (t.0 - anchor.0) % step))
            }
            Every::Cron { cron, zone, .. } => {
                let previous = cron.find_previous_occurrence(&in_zone(t, zone)?, true).ok()?;
                unix_millis(previous.timestamp_millis())
            }
        }
    }

    /// The first occurrence strictly after `t`, if there is one within
    /// the horizon.
    pub(crate) fn next_after(&self, t: UnixMillis) -> Option<UnixMillis> {
        match self {
            Every::Interval { every, anchor } => {
                let step = duration_ms(*every).max(1);
                if t < *anchor {
                    return Some(*anchor);
                }
                let k = (t.0 - anchor.0) / step + 1;
                anchor.0.checked_add(k.checked_mul(step)?).map(UnixMillis)
            }
            Every::Cron { cron, zone, .. } => {
                let at = in_zone(t, zone)?;
                let next = cron.find_next_occurrence(&at, false).ok()?;
                let limit =
                    at.naive_utc().checked_add_months(chrono::Months::new(12 * HORIZON_YEARS as u32))?;
                (next.naive_utc() <= limit).then(|| unix_millis(next.timestamp_millis())).flatten()
            }
        }
    }
}

/// What bounds a series: no occurrence before `start` or after `end`, and
/// no more than `count` of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub start: Option<UnixMillis>,
    pub end: Option<UnixMillis>,
    pub count: Option<u64>,
}

/// A series' rule: how it repeats, within what, with how much jitter.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub every: Every,
    pub bounds: Bounds,
    /// Each occurrence is moved later by up to this much, the same for the
    /// same series and occurrence however often it is computed.
    pub jitter: Duration,
}

impl Rule {
    /// The first occurrence after `t` (its nominal time, before jitter),
    /// when `fired` occurrences were made already; `None` once the series
    /// is over.
    pub(crate) fn next_after(&self, t: UnixMillis, fired: u64) -> Option<UnixMillis> {
        if self.bounds.count.is_some_and(|count| fired >= count) {
            return None;
        }
        // The start itself may be an occurrence.
        let t = match self.bounds.start {
            Some(start) if start.0 > t.0 => UnixMillis(start.0 - 1),
            _ => t,
        };
        let next = self.every.next_after(t)?;
        self.bounds.end.is_none_or(|end| next <= end).then_some(next)
    }

    /// The next `n` occurrences after `t`, `fired` made already.
    pub(crate) fn upcoming(&self, t: UnixMillis, fired: u64, n: usize) -> Vec<UnixMillis> {
        let mut out = Vec::with_capacity(n);
        let mut at = t;
        while out.len() < n {
            let Some(next) = self.next_after(at, fired + out.len() as u64) else { break };
            out.push(next);
            at = next;
        }
        out
    }

    /// When the occurrence of nominal time `nominal` of series `series` is
    /// due: `nominal` plus its share of the jitter.
    pub(crate) fn due(&self, series: &str, nominal: UnixMillis) -> UnixMillis {
        let span = duration_ms(self.jitter);
        if span == 0 {
            return nominal;
        }
        UnixMillis(nominal.0.saturating_add(stable_hash(series, nominal) % (span + 1)))
    }
}

/// What a series does with the occurrences it missed while hourglass or
/// Kafka was down (Quartz's misfire instructions, Temporal's catch-up):
/// decided when an occurrence comes due later than the series allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missed {
    /// Fire none of them; go on from the next occurrence after now.
    Skip,
    /// Fire the latest of them, once, now.
    Latest,
    /// Fire each of them now, in order, the latest `at_most` when there
    /// are more.
    Each { at_most: u32 },
}

impl Missed {
    /// How many of the missed occurrences the policy fires: the latest
    /// ones, this many.
    pub(crate) fn keeps(self) -> usize {
        match self {
            Missed::Skip => 0,
            Missed::Latest => 1,
            Missed::Each { at_most } => at_most as usize,
        }
    }
}

/// The most missed occurrences a catch-up looks at: a series every second
/// that was down for a week has 604,800, and each would cost a computation.
pub(crate) const MISSED_LOOKED_AT: usize = 10_000;

/// What a catch-up comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CatchUp {
    /// The nominal times of the missed occurrences to fire now, in order.
    pub fire: Vec<UnixMillis>,
    /// How many missed occurrences were left out: at least, as no more
    /// than [`MISSED_LOOKED_AT`] are counted (nor counted against the
    /// series' count).
    pub skipped: u64,
    /// The first occurrence after now, `None` once the series is over.
    pub next: Option<UnixMillis>,
}

impl Rule {
    /// The occurrence of nominal time `nominal` comes due at `now`, too
    /// late: it and every occurrence after it up to `now` were missed
    /// (`fired` made before it). What fires now, by `policy`, and the
    /// occurrence after.
    pub(crate) fn catch_up(
        &self,
        nominal: UnixMillis,
        now: UnixMillis,
        fired: u64,
        policy: Missed,
    ) -> CatchUp {
        let mut missed = vec![nominal];
        while missed.len() < MISSED_LOOKED_AT {
            let last = *missed.last().expect("one at least");
            match self.next_after(last, fired + missed.len() as u64) {
                Some(next) if next <= now => missed.push(next),
                _ => break,
            }
        }
        let keep = policy.keeps();
        let fire = if missed.len() < MISSED_LOOKED_AT {
            missed.split_off(missed.len().saturating_sub(keep))
        } else {
            // More were missed than are looked at: the latest lie beyond
            // them, found walking back from now (or the end).
            let last = *missed.last().expect("one at least");
            let mut latest = Vec::with_capacity(keep);
            let mut at = self.bounds.end.map_or(now, |end| end.min(now));
            while latest.len() < keep {
                match self.every.at_or_before(at) {
                    Some(t) if t > last => {
                        latest.push(t);
                        at = UnixMillis(t.0 - 1);
                    }
                    _ => break,
                }
            }
            latest.reverse();
            latest
        };
        let made = fired + (missed.len() + fire.len()) as u64;
        CatchUp {
            next: self.next_after(now.max(*fire.last().unwrap_or(&nominal)), made),
            skipped: missed.len() as u64,
            fire,
        }
    }
}

/// `t` in `zone`; none past what a date holds. Checked, not cast: a time
/// beyond `i64` milliseconds would wrap to one before 1970, and a series
/// would fire in 1970 forever.
fn in_zone(t: UnixMillis, zone: &Tz) -> Option<DateTime<Tz>> {
    let utc = DateTime::from_timestamp_millis(i64::try_from(t.0).ok()?)?;
    Some(zone.from_utc_datetime(&utc.naive_utc()))
}

/// Unix milliseconds from chrono's; none before 1970.
fn unix_millis(ms: i64) -> Option<UnixMillis> {
    u64::try_from(ms).ok().map(UnixMillis)
}

/// FNV-1a over the series id and the occurrence's time: the same on every
/// node and in every release (std's hasher promises neither).
fn stable_hash(series: &str, nominal: UnixMillis) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in series.bytes().chain(nominal.0.to_le_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

fn cron_reason(e: &CronError) -> String {
    match e {
        CronError::EmptyPattern => "it is empty".to_owned(),
        CronError::InvalidPattern(why)
        | CronError::IllegalCharacters(why)
        | CronError::ComponentError(why) => {
            format!(
                "{why} (five fields, minute hour day-of-month month day-of-week, or six with seconds first; \
                 or @yearly, @monthly, @weekly, @daily, @hourly)"
            )
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
