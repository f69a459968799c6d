//! Where a phase's lateness went, stage by stage: the server's
//! `hourglass_dispatch_stage_seconds` histograms, read before and after
//! the phase. `wait` (due until handed to the producer) and `broker` (until
//! the broker answered) make the lateness; `report` (until the dispatcher
//! took the answer in) delays only the settle.

use std::collections::BTreeMap;

use hourglass_testkit::ServerProcess;

use crate::report::Report;

const METRIC: &str = "hourglass_dispatch_stage_seconds_bucket";

/// The stages, in a message's order, with what each one is.
const STAGES: [(&str, &str); 3] = [
    ("wait", "due until handed to the producer"),
    ("broker", "handed until the broker answered"),
    ("report", "answered until the dispatcher took it in"),
];

/// The cumulative bucket counts of each stage: (stage, upper bound in
/// seconds) to count.
#[derive(Default)]
pub(crate) struct Stages(BTreeMap<(String, u64), f64>);

impl Stages {
    /// The server's stage histograms now; none when it has delivered
    /// nothing yet.
    pub(crate) async fn read(server: &ServerProcess) -> anyhow::Result<Stages> {
        Ok(Stages::parse(&server.metrics_text().await?))
    }

    fn parse(body: &str) -> Stages {
        let mut buckets = BTreeMap::new();
        for line in body.lines() {
            let Some(labels) = line.strip_prefix(METRIC).and_then(|l| l.strip_prefix('{')) else { continue };
            let Some((labels, count)) = labels.split_once("} ") else { continue };
            let label = |name: &str| {
                labels.split(',').find_map(|kv| kv.strip_prefix(name)?.strip_prefix("=\"")?.strip_suffix('"'))
            };
            let (Some(stage), Some(le), Ok(count)) =
                (label("stage"), label("le"), count.trim().parse::<f64>())
            else {
                continue;
            };
            // Bounds in microseconds, "+Inf" last.
            let bound = le.parse::<f64>().map_or(u64::MAX, |s| (s * 1e6).round() as u64);
            buckets.insert((stage.to_owned(), bound), count);
        }
        Stages(buckets)
    }

    /// The bound (ms) of the bucket that holds the `q` quantile of what
    /// `stage` counted since `before`; `None` when it counted nothing, or
    /// the quantile lies past the last bound.
    fn quantile_since(&self, before: &Stages, stage: &str, q: f64) -> Option<f64> {
        let added: Vec<(u64, f64)> = self
            .0
            .iter()
            .filter(|((s, _), _)| s == stage)
            .map(|((s, bound), n)| (*bound, n - before.0.get(&(s.clone(), *bound)).copied().unwrap_or(0.0)))
            .collect();
        let total = added.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let (bound, _) = added.into_iter().find(|(_, n)| *n >= q * total)?;
        (bound != u64::MAX).then(|| bound as f64 / 1000.0)
    }

    /// Adds each stage's p99 and p999 since `before` to `report`, under
    /// `prefix`.
    pub(crate) fn add_since(&self, before: &Stages, report: &mut Report, prefix: &str) {
        for (stage, what) in STAGES {
            for (name, q) in [("p99", 0.99), ("p999", 0.999)] {
                match self.quantile_since(before, stage, q) {
                    Some(ms) => {
                        report.add(format!("{prefix} {name} {stage} ({what}), at most"), ms, "ms", None, &[])
                    }
                    None => report.note(format!(
                        "{prefix} {name} {stage}: nothing counted, or past the last bucket bound"
                    )),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantile_is_the_bound_of_the_bucket_that_holds_it() {
        let before = Stages::parse(
            "hourglass_dispatch_stage_seconds_bucket{stage=\"wait\",le=\"0.001\"} 10\n\
             hourglass_dispatch_stage_seconds_bucket{stage=\"wait\",le=\"0.01\"} 10\n\
             hourglass_dispatch_stage_seconds_bucket{stage=\"wait\",le=\"+Inf\"} 10\n",
        );
        let after = Stages::parse(
            "hourglass_dispatch_stage_seconds_bucket{stage=\"wait\",le=\"0.001\"} 108\n\
             hourglass_dispatch_stage_seconds_bucket{stage=\"wait\",le=\"0.01\"} 110\n\
             hourglass_dispatch_stage_seconds_bucket{stage=\"wait\",le=\"+Inf\"} 110\n\
             hourglass_dispatch_stage_seconds_sum{stage=\"wait\"} 0.3\n",
        );
        // 100 added: 98 within 1 ms, all within 10 ms.
        assert_eq!(after.quantile_since(&before, "wait", 0.98), Some(1.0));
        assert_eq!(after.quantile_since(&before, "wait", 0.99), Some(10.0));
        assert_eq!(after.quantile_since(&before, "broker", 0.99), None);
        assert_eq!(after.quantile_since(&after, "wait", 0.99), None, "nothing added");
    }
}
