//! The bench's output: one table for people, the same figures as JSON for
//! tools. Each figure has its unit and, where it has one, the limit
//! measured beside it, the ratio to that limit, and its target.

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use crate::machine::Machine;

#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    pub name: String,
    pub value: f64,
    pub unit: &'static str,
    /// What the hardware does without hourglass, measured in the same run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub met: Option<bool>,
}

/// A bound a figure should meet (at full scale on a 2-core machine).
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    AtLeast(f64),
    AtMost(f64),
    /// value / limit at least this.
    RatioAtLeast(f64),
}

impl Target {
    fn met(self, value: f64, ratio: Option<f64>) -> Option<bool> {
        match self {
            Target::AtLeast(t) => Some(value >= t),
            Target::AtMost(t) => Some(value <= t),
            Target::RatioAtLeast(t) => ratio.map(|r| r >= t),
        }
    }

    fn describe(self, unit: &str) -> String {
        match self {
            Target::AtLeast(t) => format!(">= {} {unit}", number(t)),
            Target::AtMost(t) => format!("<= {} {unit}", number(t)),
            Target::RatioAtLeast(t) => format!(">= {:.0}% of limit", t * 100.0),
        }
    }
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub settings: BTreeMap<String, String>,
    pub measurements: Vec<Measurement>,
    pub notes: Vec<String>,
}

impl Report {
    /// Adds a figure; `limit` gives it a ratio, `targets` what it should meet.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        value: f64,
        unit: &'static str,
        limit: Option<f64>,
        targets: &[Target],
    ) {
        let ratio = limit.filter(|l| *l > 0.0).map(|l| value / l);
        let checks: Vec<bool> = targets.iter().filter_map(|t| t.met(value, ratio)).collect();
        let met = (!checks.is_empty()).then(|| checks.iter().all(|m| *m));
        // JSON carries the first target; the table shows them all.
        let target = targets.first().copied();
        self.measurements.push(Measurement { name: name.into(), value, unit, limit, ratio, target, met });
        if targets.len() > 1 {
            let all: Vec<String> = targets.iter().map(|t| t.describe(unit)).collect();
            self.notes.push(format!(
                "{}: targets {}",
                self.measurements.last().map_or("", |m| &m.name),
                all.join(" and ")
            ));
        }
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    pub fn table(&self) -> String {
        let mut out = String::new();
        let m = &self.machine;
        let _ = writeln!(out, "machine:  {} cores, {}, {} GiB RAM", m.cores, m.cpu, m.memory_bytes >> 30);
        let _ = writeln!(out, "disk:     {}", m.disk);
        let _ = writeln!(out, "os:       {}", m.kernel);
        let settings: Vec<String> = self.settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "settings: {}", settings.join(", "));
        let _ = writeln!(out);
        let rows: Vec<[String; 6]> = self
            .measurements
            .iter()
            .map(|m| {
                [
                    m.name.clone(),
                    number(m.value),
                    m.unit.to_owned(),
                    m.limit.map(number).unwrap_or_default(),
                    m.ratio.map(|r| format!("{:.0}%", r * 100.0)).unwrap_or_default(),
                    match (m.target, m.met) {
                        (Some(t), Some(met)) => {
                            format!("{} {}", t.describe(m.unit), if met { "ok" } else { "MISSED" })
                        }
                        _ => String::new(),
                    },
                ]
            })
            .collect();
        let header = ["measurement", "value", "unit", "limit", "of limit", "target"].map(String::from);
        let mut widths = header.clone().map(|h| h.len());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in std::iter::once(&header).chain(&rows) {
            let line = format!(
                "{:<w0$}  {:>w1$}  {:<w2$}  {:>w3$}  {:>w4$}  {}",
                row[0],
                row[1],
                row[2],
                row[3],
                row[4],
                row[5],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2],
                w3 = widths[3],
                w4 = widths[4],
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
        if !self.notes.is_empty() {
            let _ = writeln!(out);
            for note in &self.notes {
                let _ = writeln!(out, "note: {note}");
            }
        }
        out
    }
}

/// A figure as people read it: thousands separated, at most 3 significant
/// decimals below 10.
fn number(v: f64) -> String {
    if v.abs() < 10.0 && v.fract() != 0.0 {
        return format!("{v:.2}");
    }
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 { format!("-{out}") } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(number(1234567.4), "1,234,567");
        assert_eq!(number(999.0), "999");
        assert_eq!(number(2.345), "2.35");
        assert_eq!(number(0.0), "0");
        assert_eq!(number(-1500.0), "-1,500");
    }

    #[test]
    fn ratios_and_targets_are_computed() {
        let mut r = Report::default();
        r.add("drain", 80.0, "msg/s", Some(100.0), &[Target::RatioAtLeast(0.8)]);
        r.add("p99", 7.0, "ms", None, &[Target::AtMost(5.0)]);
        r.add("rss", 100.0, "MB", None, &[]);
        assert_eq!(r.measurements[0].ratio, Some(0.8));
        assert_eq!(r.measurements[0].met, Some(true));
        assert_eq!(r.measurements[1].met, Some(false));
        assert_eq!(r.measurements[2].met, None);
        let table = r.table();
        assert!(table.contains("MISSED"), "{table}");
        assert!(table.contains("80%"), "{table}");
    }
}
