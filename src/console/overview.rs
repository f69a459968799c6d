//! The overview: counts by state, this node's deliveries over the last
//! minutes, and what comes due over the next hour, day or week, per topic.

use std::fmt::Write as _;

use serde::Deserialize;

use super::{
    html::{Query, esc, time},
    pulse::{EVERY, Pulse},
    recent::{Counted, Recent},
};
use crate::{
    Error,
    message::UnixMillis,
    proto,
    scheduler::{Call, Scheduler},
};

/// What the overview is drawn from.
pub(super) struct Sources<'a> {
    pub scheduler: &'a dyn Scheduler,
    pub pulse: &'a Pulse,
    pub recent: &'a Recent,
}

/// What the forecast on the overview covers.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum Span {
    #[default]
    Hour,
    Day,
    Week,
}

impl Span {
    const ALL: [Span; 3] = [Span::Hour, Span::Day, Span::Week];

    fn name(self) -> &'static str {
        match self {
            Span::Hour => "hour",
            Span::Day => "day",
            Span::Week => "week",
        }
    }

    /// The interval of one bar, and how many bars.
    fn cut(self) -> (u64, u64) {
        match self {
            Span::Hour => (60_000, 60),
            Span::Day => (15 * 60_000, 96),
            Span::Week => (3_600_000, 168),
        }
    }

    /// The window from the start of the current interval on, so that bars
    /// fall on whole minutes, quarter hours and hours.
    pub(super) fn request(self, now: UnixMillis, topic: &str) -> proto::ForecastRequest {
        let (interval, bars) = self.cut();
        let from = UnixMillis(now.0 - now.0 % interval);
        proto::ForecastRequest {
            topic: topic.to_owned(),
            from: Some(from.to_timestamp()),
            to: Some(UnixMillis(from.0 + interval * bars).to_timestamp()),
            interval: Some(prost_types::Duration { seconds: (interval / 1000) as i64, nanos: 0 }),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct OverviewQuery {
    #[serde(default)]
    pub span: Span,
    #[serde(default)]
    pub topic: String,
}

pub(super) async fn render(
    from: Sources<'_>,
    call: &Call,
    query: &OverviewQuery,
    now: UnixMillis,
) -> Result<String, Error> {
    let stats = from.scheduler.stats(call).await?;
    let request = query.span.request(now, &query.topic);
    let count = from.scheduler.forecast(call, request.clone());
    let forecast = from.recent.forecast(call.access.scope(), request, now, count).await?;
    let mut body = String::new();
    counts(&mut body, &stats);
    if call.access.scope().is_everything() {
        deliveries(&mut body, from.pulse);
    }
    due(&mut body, query, &forecast, now);
    Ok(body)
}

fn counts(out: &mut String, s: &proto::StatsResponse) {
    out.push_str("<section><h2>Messages</h2><dl class=\"counts\">");
    let rows = [
        ("pending", "Pending", s.pending),
        ("dispatching", "Being sent", s.dispatching),
        ("delivered", "Delivered", s.delivered),
        ("cancelled", "Cancelled", s.cancelled),
        ("failed", "Failed", s.failed),
        ("expired", "Expired", s.expired),
        ("dead-lettered", "Dead-lettered", s.dead_lettered),
    ];
    for (id, name, n) in rows {
        let _ = write!(out, "<div id=\"count-{id}\"><dt>{name}</dt><dd>{n}</dd></div>");
    }
    out.push_str("</dl>");
    if let Some(m) = &s.oldest_overdue {
        let _ = write!(
            out,
            "<p class=\"warn\">Oldest overdue: <a href=\"/message?id={}\">{}</a> on {}, due {}.</p>",
            Query(&m.id),
            esc(&m.id),
            esc(&m.topic),
            time(m.dispatch_at)
        );
    }
    for h in &s.held_back {
        let reason = proto::HeldReason::try_from(h.reason).map_or("HELD", |r| r.as_str_name());
        let _ = write!(
            out,
            "<p class=\"warn\">{} is held back ({}){} since {}.</p>",
            esc(&h.topic),
            esc(reason.trim_start_matches("HELD_REASON_")),
            if h.tenant.is_empty() { String::new() } else { format!(" for tenant {}", esc(&h.tenant)) },
            time(h.since)
        );
    }
    out.push_str("</section>");
}

fn seconds(s: Option<f64>) -> String {
    match s {
        None => "–".to_owned(),
        Some(s) if s.is_infinite() => "over 5 min".to_owned(),
        Some(s) if s < 1.0 => format!("≤ {} ms", (s * 1000.0).round()),
        Some(s) => format!("≤ {s} s"),
    }
}

fn deliveries(out: &mut String, pulse: &Pulse) {
    out.push_str("<section><h2>Deliveries on this node</h2>");
    let Some(minute) = pulse.last(std::time::Duration::from_secs(60)) else {
        out.push_str("<p>No samples yet.</p></section>");
        return;
    };
    let _ = write!(
        out,
        "<p id=\"pulse\">Last {:.0} s: <b>{:.1}</b> messages/s; lateness p50 {}, p99 {}.</p>",
        minute.seconds,
        minute.rate(),
        seconds(minute.p50),
        seconds(minute.p99)
    );
    let intervals = pulse.intervals();
    if intervals.iter().any(|s| s.delivered > 0) {
        let values: Vec<(f64, String)> = intervals
            .iter()
            .map(|s| (s.rate(), format!("{:.1}/s, p99 {}", s.rate(), seconds(s.p99))))
            .collect();
        bars(out, "deliveries", "deliveries per second", 80.0, &values);
        let _ = write!(
            out,
            "<p class=\"axis\">The last {} min, every {} s.</p>",
            intervals.len() * EVERY.as_secs() as usize / 60,
            EVERY.as_secs()
        );
    }
    out.push_str("</section>");
}

/// A bar chart: a bar per value, scaled to the largest, each with its
/// value in `data-count` and a title a pointer shows.
fn bars(out: &mut String, id: &str, label: &str, height: f64, values: &[(f64, String)]) {
    let max = values.iter().map(|(v, _)| *v).fold(0.0, f64::max);
    let width = 960.0 / values.len().max(1) as f64;
    let _ = write!(
        out,
        "<svg class=\"chart\" id=\"{id}\" viewBox=\"0 0 960 {height}\" role=\"img\" aria-label=\"{label}\">"
    );
    for (i, (value, title)) in values.iter().enumerate() {
        let h = if *value <= 0.0 { 0.0 } else { (value / max * (height - 4.0)).max(1.0) };
        let _ = write!(
            out,
            "<rect data-count=\"{value}\" x=\"{:.2}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{h:.1}\"><title>{}</title></rect>",
            i as f64 * width,
            height - h,
            (width - 0.5).max(0.5),
            esc(title)
        );
    }
    out.push_str("</svg>");
}

fn due(out: &mut String, query: &OverviewQuery, counted: &Counted, now: UnixMillis) {
    let f = &counted.forecast;
    out.push_str("<section><h2>Coming due</h2><p class=\"tabs\">");
    for span in Span::ALL {
        let class = if span == query.span { " class=\"on\"" } else { "" };
        let _ = write!(
            out,
            "<a{class} href=\"/?span={}&amp;topic={}\">Next {}</a>",
            span.name(),
            Query(&query.topic),
            span.name()
        );
    }
    if !query.topic.is_empty() {
        let _ = write!(out, "<a href=\"/?span={}\">Every topic</a>", query.span.name());
    }
    out.push_str("</p>");
    let interval_s = f.interval.map_or(60, |d| d.seconds.max(1)) as u64;
    let total: u64 = f.totals.iter().sum();
    let _ = write!(
        out,
        "<p id=\"window\" data-from=\"{}\" data-to=\"{}\" data-interval=\"{interval_s}\">{} pending{} from {} to {}, a bar every {}.</p>",
        time(f.from),
        time(f.to),
        total,
        if query.topic.is_empty() { String::new() } else { format!(" on {}", esc(&query.topic)) },
        time(f.from),
        time(f.to),
        humantime::format_duration(std::time::Duration::from_secs(interval_s)),
    );
    if let Some(at) = counted.again {
        // A count of a large window is shown again for a while: see
        // `recent`.
        let _ = write!(
            out,
            "<p id=\"counted\" data-at=\"{}\">Counted {} s ago; a window this large is counted again every few seconds.</p>",
            at.to_rfc3339(),
            now.since(at).as_secs()
        );
    }
    if let Some(cut) = f.counted_to {
        let _ = write!(
            out,
            "<p class=\"warn\">Too many to count at once: counted up to {} only.</p>",
            time(Some(cut))
        );
    }
    let from_ms = f.from.map_or(0, |t| t.seconds as u64 * 1000);
    let values: Vec<(f64, String)> = f
        .totals
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (*n as f64, format!("{}: {n}", UnixMillis(from_ms + i as u64 * interval_s * 1000).to_rfc3339()))
        })
        .collect();
    bars(out, "histogram", "messages coming due", 160.0, &values);
    if !f.topics.is_empty() {
        out.push_str("<table><thead><tr><th>Topic</th><th>Pending in the window</th></tr></thead><tbody>");
        for t in f.topics.iter().take(50) {
            let _ = write!(
                out,
                "<tr><td><a href=\"/?span={}&amp;topic={}\">{}</a></td><td>{}</td></tr>",
                query.span.name(),
                Query(&t.topic),
                esc(&t.topic),
                t.total
            );
        }
        out.push_str("</tbody></table>");
    }
    out.push_str("</section>");
}
