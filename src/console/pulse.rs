//! The last minutes of this node's deliveries, for the overview: every few
//! seconds the console samples the dispatcher's own metrics (messages
//! delivered, and the lateness histogram), keeps a few minutes of samples,
//! and answers with the rate and the lateness between two of them.

use std::{
    collections::VecDeque,
    sync::Mutex,
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;

use crate::metrics;

/// How often the metrics are sampled.
pub(super) const EVERY: Duration = Duration::from_secs(5);
/// Samples kept: ten minutes.
const KEPT: usize = 120;

#[derive(Clone)]
struct Sample {
    at: Instant,
    delivered: u64,
    /// Cumulative counts per lateness bucket (upper bounds in seconds).
    lateness: Vec<(f64, u64)>,
}

impl Sample {
    fn now() -> Sample {
        let histogram = {
            use prometheus::core::Collector as _;
            metrics::LATENESS.collect()
        };
        let lateness = histogram
            .first()
            .and_then(|family| family.get_metric().first())
            .map(|m| {
                m.get_histogram()
                    .get_bucket()
                    .iter()
                    .map(|b| (b.upper_bound(), b.cumulative_count()))
                    .collect()
            })
            .unwrap_or_default();
        Sample { at: Instant::now(), delivered: metrics::DELIVERED.get(), lateness }
    }
}

/// Deliveries over one stretch of time.
pub(super) struct Stretch {
    pub seconds: f64,
    pub delivered: u64,
    /// Lateness at or under which 50% and 99% of them were acknowledged
    /// (bucket upper bounds, seconds); none when nothing was delivered.
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

impl Stretch {
    pub(super) fn rate(&self) -> f64 {
        if self.seconds > 0.0 { self.delivered as f64 / self.seconds } else { 0.0 }
    }
}

#[derive(Default)]
pub(super) struct Pulse {
    samples: Mutex<VecDeque<Sample>>,
}

impl Pulse {
    /// Samples until `stop`.
    pub(super) async fn run(&self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => self.sample(),
            }
        }
    }

    fn sample(&self) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if samples.len() == KEPT {
            samples.pop_front();
        }
        samples.push_back(Sample::now());
    }

    /// Each interval between samples, oldest first.
    pub(super) fn intervals(&self) -> Vec<Stretch> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.iter().zip(samples.iter().skip(1)).map(|(a, b)| between(a, b)).collect()
    }

    /// The last `span` (or what there is of it), up to now.
    pub(super) fn last(&self, span: Duration) -> Option<Stretch> {
        let now = Sample::now();
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let from = samples.iter().find(|s| now.at.duration_since(s.at) <= span).or(samples.back())?;
        Some(between(from, &now))
    }
}

fn between(a: &Sample, b: &Sample) -> Stretch {
    let counts: Vec<(f64, u64)> = b
        .lateness
        .iter()
        .map(|&(bound, n)| {
            (bound, n - a.lateness.iter().find(|(x, _)| *x == bound).map_or(0, |(_, m)| *m).min(n))
        })
        .collect();
    let delivered = b.delivered.saturating_sub(a.delivered);
    let total = counts.last().map_or(0, |(_, n)| *n).max(delivered);
    let quantile = |q: f64| {
        (total > 0).then(|| {
            let want = (total as f64 * q).ceil() as u64;
            counts.iter().find(|(_, n)| *n >= want).map_or(f64::INFINITY, |(bound, _)| *bound)
        })
    };
    Stretch {
        seconds: b.at.duration_since(a.at).as_secs_f64(),
        delivered,
        p50: quantile(0.5),
        p99: quantile(0.99),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stretch_reads_the_quantiles_off_the_buckets_it_added() {
        let at = Instant::now();
        let a = Sample { at, delivered: 10, lateness: vec![(0.001, 5), (0.01, 10), (f64::INFINITY, 10)] };
        let b = Sample {
            at: at + Duration::from_secs(10),
            delivered: 110,
            lateness: vec![(0.001, 55), (0.01, 108), (f64::INFINITY, 110)],
        };
        let s = between(&a, &b);
        assert_eq!((s.delivered, s.rate()), (100, 10.0));
        assert_eq!((s.p50, s.p99), (Some(0.001), Some(f64::INFINITY)), "2 of 100 later than 10 ms");
    }
}
