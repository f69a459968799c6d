//! Forecasts: how many pending messages come due in each interval of a
//! window, per topic. The window is resolved once, where a call comes in,
//! so that every shard and every node counts into the same intervals.

use std::{collections::BTreeMap, time::Duration};

use super::{Invalid, UnixMillis, duration_ms, validate_topic_name};

/// What a caller asks to count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForecastQuery {
    pub topic: Option<String>,
    /// Default: now.
    pub from: Option<UnixMillis>,
    /// Default: [`ForecastQuery::DEFAULT_WINDOW`] after `from`.
    pub to: Option<UnixMillis>,
    /// Default: the window in [`ForecastQuery::DEFAULT_INTERVALS`].
    pub interval: Option<Duration>,
}

impl ForecastQuery {
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);
    pub const DEFAULT_INTERVALS: u64 = 60;
    pub const MAX_INTERVALS: u64 = 1000;
    pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);
    pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

    /// The window to count, with the defaults filled in from `now`.
    pub fn window(&self, now: UnixMillis) -> Result<Window, Invalid> {
        if let Some(topic) = &self.topic {
            validate_topic_name(topic).map_err(|e| Invalid::new("topic", e.reason))?;
        }
        let from = self.from.unwrap_or(now);
        let to = self.to.unwrap_or(from.saturating_add(Self::DEFAULT_WINDOW));
        if to <= from {
            return Err(Invalid::new(
                "to",
                format!("{} is not after from {}", to.to_rfc3339(), from.to_rfc3339()),
            ));
        }
        let span = to.0 - from.0;
        if span > duration_ms(Self::MAX_WINDOW) {
            return Err(Invalid::new("to", "makes a window longer than a year; count a year at a time"));
        }
        let interval = match self.interval {
            None => span.div_ceil(Self::DEFAULT_INTERVALS).max(duration_ms(Self::MIN_INTERVAL)),
            Some(i) if i < Self::MIN_INTERVAL => {
                return Err(Invalid::new("interval", format!("is {i:?}; the least is one second")));
            }
            Some(i) => duration_ms(i),
        };
        if span.div_ceil(interval) > Self::MAX_INTERVALS {
            return Err(Invalid::new(
                "interval",
                format!(
                    "cuts the window into {} intervals; the most is {}: make it longer or the window shorter",
                    span.div_ceil(interval),
                    Self::MAX_INTERVALS
                ),
            ));
        }
        Ok(Window { from, to, interval_ms: interval })
    }
}

/// A resolved window: `[from, to)` in intervals of `interval_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub from: UnixMillis,
    pub to: UnixMillis,
    pub interval_ms: u64,
}

impl Window {
    pub fn intervals(&self) -> usize {
        (self.to.0 - self.from.0).div_ceil(self.interval_ms) as usize
    }

    /// The interval `at` falls in, if it is in the window.
    pub fn interval_of(&self, at: UnixMillis) -> Option<usize> {
        (at >= self.from && at < self.to).then(|| ((at.0 - self.from.0) / self.interval_ms) as usize)
    }

    /// When interval `i` starts.
    pub fn start_of(&self, i: usize) -> UnixMillis {
        UnixMillis(self.from.0 + i as u64 * self.interval_ms)
    }
}

/// Counts per topic and interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forecast {
    pub window: Window,
    pub topics: BTreeMap<String, Vec<u64>>,
    /// Set when a count stopped early: whole before this, nothing after.
    pub counted_to: Option<UnixMillis>,
}

impl Forecast {
    pub fn new(window: Window) -> Forecast {
        Forecast { window, topics: BTreeMap::new(), counted_to: None }
    }

    /// Counts one message of `topic` due `at` (outside the window: none).
    pub fn add(&mut self, topic: &str, at: UnixMillis) {
        let Some(i) = self.window.interval_of(at) else { return };
        if !self.topics.contains_key(topic) {
            self.topics.insert(topic.to_owned(), vec![0; self.window.intervals()]);
        }
        if let Some(counts) = self.topics.get_mut(topic) {
            counts[i] += 1;
        }
    }

    /// Adds another part's counts (another shard's, another node's), of the
    /// same window.
    pub fn merge(&mut self, other: Forecast) {
        for (topic, counts) in other.topics {
            let mine = self.topics.entry(topic).or_insert_with(|| vec![0; counts.len()]);
            mine.iter_mut().zip(counts).for_each(|(a, b)| *a += b);
        }
        self.stop_at(other.counted_to);
    }

    /// Marks the count as stopped at `at` (in one part at least): the
    /// interval that holds it and those after it are dropped, so that
    /// what is left is whole; `counted_to` is where they start.
    pub fn stop_at(&mut self, at: Option<UnixMillis>) {
        let Some(at) = at else { return };
        let keep = self.window.interval_of(at.max(self.window.from)).unwrap_or(self.window.intervals());
        let cut = self.window.start_of(keep).min(self.window.to);
        self.counted_to = Some(self.counted_to.map_or(cut, |c| c.min(cut)));
        for counts in self.topics.values_mut() {
            counts.iter_mut().skip(keep).for_each(|c| *c = 0);
        }
    }

    /// Every topic's counts added up, interval by interval.
    pub fn totals(&self) -> Vec<u64> {
        let mut totals = vec![0; self.window.intervals()];
        for counts in self.topics.values() {
            totals.iter_mut().zip(counts).for_each(|(t, c)| *t += c);
        }
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> UnixMillis {
        UnixMillis(ms)
    }

    #[test]
    fn the_default_window_is_the_next_hour_in_minutes() {
        let w = ForecastQuery::default().window(at(1_000_000)).unwrap();
        assert_eq!((w.from, w.to, w.interval_ms, w.intervals()), (at(1_000_000), at(4_600_000), 60_000, 60));
    }

    #[test]
    fn a_window_must_be_forward_short_enough_and_cut_in_few_enough_intervals() {
        let q = |from, to, interval: Option<u64>| ForecastQuery {
            from: Some(at(from)),
            to: Some(at(to)),
            interval: interval.map(Duration::from_millis),
            topic: None,
        };
        assert_eq!(q(10, 10, None).window(at(0)).unwrap_err().field, "to");
        assert_eq!(q(0, 400 * 86_400_000, None).window(at(0)).unwrap_err().field, "to");
        assert_eq!(q(0, 10_000, Some(10)).window(at(0)).unwrap_err().field, "interval");
        assert_eq!(q(0, 2_000_000, Some(1000)).window(at(0)).unwrap_err().field, "interval");
        let w = q(0, 2500, Some(1000)).window(at(0)).unwrap();
        assert_eq!(w.intervals(), 3, "the last interval runs past `to`");
        assert_eq!((w.interval_of(at(2499)), w.interval_of(at(2500))), (Some(2), None));
    }

    #[test]
    fn parts_add_up_and_a_part_that_stopped_early_cuts_what_follows() {
        let window = Window { from: at(0), to: at(4000), interval_ms: 1000 };
        let mut a = Forecast::new(window);
        [0, 999, 1000, 3999, 4000].into_iter().for_each(|t| a.add("x", at(t)));
        let mut b = Forecast::new(window);
        b.add("y", at(500));
        b.add("x", at(2500));
        b.add("x", at(3500));
        b.stop_at(Some(at(2700)));
        a.merge(b);
        assert_eq!(a.topics["x"], [2, 1, 0, 0], "from the interval that holds 2700 on, nothing is whole");
        assert_eq!(a.topics["y"], [1, 0, 0, 0]);
        assert_eq!(a.totals(), [3, 1, 0, 0]);
        assert_eq!(a.counted_to, Some(at(2000)), "where the whole intervals end");
    }
}
