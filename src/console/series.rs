//! Recurring schedules: the series the caller sees, a page at a time, with
//! their rule and next occurrences, and pause, resume and delete, as the
//! `Series` service answers them.

use std::fmt::Write as _;

use serde::Deserialize;

use super::html::{Query, esc, refused, time};
use crate::{
    message::SHARED_SPACE,
    proto,
    scheduler::{Call, SeriesCalls},
};

const PAGE: u32 = 50;

#[derive(Debug, Default, Deserialize)]
pub(super) struct SeriesQuery {
    #[serde(default)]
    pub topic: String,
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub page: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct SeriesForm {
    #[serde(default)]
    pub csrf: String,
    pub id: String,
    /// The series' tenant: a row's, for an operator acting on another
    /// tenant's; empty for the caller's own.
    #[serde(default)]
    pub tenant: String,
    /// pause, resume or delete.
    pub change: String,
}

fn state(s: i32) -> &'static str {
    proto::SeriesState::try_from(s).map_or("UNKNOWN", |s| s.as_str_name().trim_start_matches("SERIES_STATE_"))
}

/// A page of series, and the search that picks them.
pub(super) async fn render(series: &dyn SeriesCalls, call: &Call, q: &SeriesQuery, csrf: &str) -> String {
    let mut out = String::new();
    // A row of the shared space, to a caller with a tenant, is named so.
    let has_tenant = call.access.scope().tenant.is_some();
    let _ = write!(
        out,
        "<form class=\"find\" method=\"get\" action=\"/series\">\
         <label>Topic <input name=\"topic\" value=\"{}\"></label>\
         <label>Labels <input name=\"label\" value=\"{}\" placeholder=\"team=growth\"></label>\
         <button>Find</button></form>",
        esc(&q.topic),
        esc(&q.label)
    );
    let request = proto::ListSeriesRequest {
        topic: q.topic.trim().to_owned(),
        selector: q.label.trim().to_owned(),
        page_size: PAGE,
        page_token: q.page.clone(),
    };
    let page = match series.list_series(call, request).await {
        Ok(page) => page,
        Err(e) => {
            out.push_str(&refused(e));
            return out;
        }
    };
    if page.series.is_empty() {
        out.push_str("<p id=\"none\">No series on this page.</p>");
    } else {
        out.push_str(
            "<table id=\"series\"><thead><tr><th>Id</th><th>Topic</th><th>Recurs</th><th>State</th>\
             <th>Next</th><th>Fired</th><th></th></tr></thead><tbody>",
        );
        for s in &page.series {
            let spec = s.spec.clone().unwrap_or_default();
            let rule = match &spec.every {
                Some(proto::series_spec::Every::Cron(cron)) => format!(
                    "<code>{}</code>{}",
                    esc(cron),
                    if spec.time_zone.is_empty() {
                        String::new()
                    } else {
                        format!(" in {}", esc(&spec.time_zone))
                    }
                ),
                Some(proto::series_spec::Every::Interval(d)) => format!(
                    "every {}",
                    humantime::format_duration(std::time::Duration::new(d.seconds.max(0) as u64, 0))
                ),
                None => "–".to_owned(),
            };
            let st = state(s.state);
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{rule}</td><td>{st}</td><td>{}</td><td>{}</td><td><div class=\"row-actions\">",
                esc(&s.id),
                esc(spec.template.as_ref().map(|t| t.topic.as_str()).unwrap_or("")),
                time(s.next.first().copied()),
                s.fired,
            );
            let changes: &[(&str, &str)] = match st {
                "ACTIVE" => &[("pause", "Pause"), ("delete", "Delete")],
                "PAUSED" => &[("resume", "Resume"), ("delete", "Delete")],
                _ => &[("delete", "Delete")],
            };
            for (change, label) in changes {
                let _ = write!(
                    out,
                    "<form method=\"post\" action=\"/series\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                     <input type=\"hidden\" name=\"id\" value=\"{}\"><input type=\"hidden\" name=\"tenant\" \
                     value=\"{}\"><input type=\"hidden\" name=\"change\" value=\"{change}\"><button>{label}</button>\
                     </form>",
                    esc(csrf),
                    esc(&s.id),
                    esc(if s.tenant.is_empty() && has_tenant { SHARED_SPACE } else { &s.tenant })
                );
            }
            out.push_str("</div></td></tr>");
        }
        out.push_str("</tbody></table>");
    }
    if !page.next_page_token.is_empty() {
        let _ = write!(
            out,
            "<p><a id=\"next\" href=\"/series?topic={}&amp;label={}&amp;page={}\">Next page</a></p>",
            Query(&q.topic),
            Query(&q.label),
            Query(&page.next_page_token)
        );
    }
    out
}

/// Pauses, resumes or deletes a series; what to say about it.
pub(super) async fn apply(series: &dyn SeriesCalls, call: &Call, form: &SeriesForm) -> String {
    let (id, tenant) = (form.id.clone(), form.tenant.clone());
    let done = |what: &str, cancelled: usize| {
        format!(
            "<p class=\"done\" id=\"outcome\">{what} {}{}</p>",
            esc(&form.id),
            if cancelled > 0 {
                format!("; {cancelled} parked occurrence(s) cancelled")
            } else {
                String::new()
            }
        )
    };
    let answer = match form.change.as_str() {
        "pause" => series
            .pause_series(call, proto::PauseSeriesRequest { id, tenant })
            .await
            .map(|r| done("Paused", r.occurrences.len())),
        "resume" => series
            .resume_series(call, proto::ResumeSeriesRequest { id, tenant })
            .await
            .map(|_| done("Resumed", 0)),
        "delete" => series
            .delete_series(call, proto::DeleteSeriesRequest { id, tenant })
            .await
            .map(|r| done("Deleted", r.occurrences.len())),
        other => return format!("<p class=\"error\">{} is not a change this page makes.</p>", esc(other)),
    };
    answer.unwrap_or_else(refused)
}
