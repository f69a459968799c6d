//! Finding messages and acting on one: pending messages by label
//! selector, topic and dispatch time (a page at a time, as `List` pages),
//! any message by id, a message's whole record, and cancel, reschedule and
//! re-drive, each answered as the API answers it.

use std::fmt::Write as _;

use serde::Deserialize;

use super::html::{Query, Shown, bytes, esc, hex, refused, state, time};
use crate::{
    Error,
    message::{Invalid, SHARED_SPACE},
    proto,
    scheduler::{Call, Scheduler},
};

/// Messages on one page of a search.
const PAGE: u32 = 50;

#[derive(Debug, Default, Deserialize)]
pub(super) struct FindQuery {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub topic: String,
    /// Dispatch time range, RFC 3339 (or `2026-11-29T09:00`, UTC).
    #[serde(default)]
    pub from: String,
    #[serde(default)]
    pub to: String,
    #[serde(default)]
    pub page: String,
}

/// A time a person typed: RFC 3339, or a date and time without a zone
/// (taken as UTC).
fn parse_time(field: &'static str, text: &str) -> Result<Option<prost_types::Timestamp>, Invalid> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let t = chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&chrono::Utc))
        .or_else(|_| {
            ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"]
                .iter()
                .find_map(|f| chrono::NaiveDateTime::parse_from_str(text, f).ok())
                .map(|t| t.and_utc())
                .ok_or(())
        })
        .map_err(|_| {
            Invalid::new(
                field,
                format!("{text:?} is not a time; write 2026-11-29T09:00:00Z (UTC if no zone)"),
            )
        })?;
    Ok(Some(prost_types::Timestamp { seconds: t.timestamp(), nanos: t.timestamp_subsec_nanos() as i32 }))
}

fn form(out: &mut String, q: &FindQuery) {
    let _ = write!(
        out,
        "<form class=\"find\" method=\"get\" action=\"/messages\">\
         <label>Id <input name=\"id\" value=\"{}\" placeholder=\"any state\"></label>\
         <label>Labels <input name=\"label\" value=\"{}\" placeholder=\"customer=42,!test\"></label>\
         <label>Topic <input name=\"topic\" value=\"{}\"></label>\
         <label>Due from <input name=\"from\" value=\"{}\" placeholder=\"2026-11-29T09:00Z\"></label>\
         <label>to <input name=\"to\" value=\"{}\"></label>\
         <button>Find</button></form>",
        esc(&q.id),
        esc(&q.label),
        esc(&q.topic),
        esc(&q.from),
        esc(&q.to)
    );
}

/// The find page: the form, and a page of pending messages that match.
pub(super) async fn render(scheduler: &dyn Scheduler, call: &Call, q: &FindQuery) -> Result<String, Error> {
    let mut out = String::new();
    form(&mut out, q);
    let request = match (parse_time("from", &q.from), parse_time("to", &q.to)) {
        (Ok(from), Ok(to)) => proto::ListRequest {
            topic: q.topic.trim().to_owned(),
            page_size: PAGE,
            page_token: q.page.clone(),
            dispatch_from: from,
            dispatch_to: to,
            selector: q.label.trim().to_owned(),
            ..Default::default()
        },
        (Err(why), _) | (_, Err(why)) => {
            let _ = write!(out, "<p class=\"error\">{}</p>", esc(&format!("{}: {}", why.field, why.reason)));
            return Ok(out);
        }
    };
    let listing = match scheduler.list(call, request).await {
        Ok(listing) => listing.page,
        Err(e) => {
            out.push_str(&refused(e));
            return Ok(out);
        }
    };
    out.push_str(
        "<p class=\"hint\">Pending messages, in the order they will be sent. A message in any state is found \
         by its id.</p>",
    );
    if listing.messages.is_empty() {
        out.push_str("<p id=\"none\">No pending message on this page matches.</p>");
    } else {
        out.push_str(
            "<table id=\"found\"><thead><tr><th>Id</th><th>Topic</th><th>Due</th><th>Labels</th>\
             <th>Attempts</th><th>Last error</th></tr></thead><tbody>",
        );
        let own = call.access.scope().tenant.map(|t| t.as_str().to_owned()).unwrap_or_default();
        for m in &listing.messages {
            // An operator sees every tenant's: whose, when not its own.
            let theirs = match m.tenant.as_str() {
                "" if !own.is_empty() => Some(SHARED_SPACE),
                t if t.is_empty() || t == own => None,
                t => Some(t),
            };
            let mut labels: Vec<_> = m.labels.iter().collect();
            labels.sort();
            let labels = labels.iter().map(|(k, v)| format!("{}={}", esc(k), esc(v))).collect::<Vec<_>>();
            let _ = write!(
                out,
                "<tr><td><a href=\"/message?id={}{}\">{}{}</a></td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td></tr>",
                Query(&m.id),
                theirs.map(|t| format!("&amp;tenant={}", Query(t))).unwrap_or_default(),
                theirs.map(|t| format!("{}/", esc(t))).unwrap_or_default(),
                esc(&m.id),
                esc(&m.topic),
                time(m.dispatch_at),
                labels.join(", "),
                m.attempts,
                esc(&m.last_error)
            );
        }
        out.push_str("</tbody></table>");
    }
    if !listing.next_page_token.is_empty() {
        let _ = write!(
            out,
            "<p><a id=\"next\" href=\"/messages?label={}&amp;topic={}&amp;from={}&amp;to={}&amp;page={}\">Next page</a></p>",
            Query(&q.label),
            Query(&q.topic),
            Query(&q.from),
            Query(&q.to),
            Query(&listing.next_page_token)
        );
    }
    Ok(out)
}

/// What a person asked to do to a message.
#[derive(Debug, Deserialize)]
pub(super) struct Act {
    pub id: String,
    /// The message's tenant, for an operator acting on another tenant's;
    /// empty: the caller's own.
    #[serde(default)]
    pub tenant: String,
    #[serde(default)]
    pub csrf: String,
    /// For a reschedule: a time, or a delay such as `10m`; empty: now.
    #[serde(default)]
    pub at: String,
}

pub(super) async fn cancel(scheduler: &dyn Scheduler, call: &Call, tenant: &str, id: &str) -> String {
    let request = proto::CancelRequest { id: id.to_owned(), tenant: tenant.to_owned(), ..Default::default() };
    match scheduler.cancel(call, request).await {
        Ok(r) => {
            let outcome = proto::CancelOutcome::try_from(r.outcome).map_or("UNKNOWN", |o| o.as_str_name());
            format!(
                "<p class=\"done\" id=\"outcome\">Cancel: <b>{}</b></p>",
                outcome.trim_start_matches("CANCEL_OUTCOME_")
            )
        }
        Err(e) => refused(e),
    }
}

pub(super) async fn reschedule(
    scheduler: &dyn Scheduler,
    call: &Call,
    tenant: &str,
    id: &str,
    at: &str,
) -> String {
    use proto::reschedule_request::Due;
    let due = match parse_time("at", at) {
        Ok(Some(t)) => Due::DeliverAt(t),
        Ok(None) => Due::Delay(prost_types::Duration::default()),
        Err(why) => match humantime::parse_duration(at.trim()) {
            Ok(d) => Due::Delay(prost_types::Duration {
                seconds: d.as_secs() as i64,
                nanos: d.subsec_nanos() as i32,
            }),
            Err(_) => {
                return format!(
                    "<p class=\"error\">{} Or a delay, such as 10m.</p>",
                    esc(&format!("{}: {}", why.field, why.reason))
                );
            }
        },
    };
    let request = proto::RescheduleRequest { id: id.to_owned(), due: Some(due), tenant: tenant.to_owned() };
    match scheduler.reschedule(call, request).await {
        Ok(r) => {
            format!("<p class=\"done\" id=\"outcome\">Rescheduled: due <b>{}</b></p>", time(r.deliver_at))
        }
        Err(e) => refused(e),
    }
}

/// A message's page: everything `Get` answers, and the actions its state
/// allows.
pub(super) async fn message(
    scheduler: &dyn Scheduler,
    call: &Call,
    (tenant, id): (&str, &str),
    csrf: &str,
    hex_view: bool,
) -> String {
    let m =
        match scheduler.get(call, proto::GetRequest { id: id.to_owned(), tenant: tenant.to_owned() }).await {
            Ok(m) => m,
            Err(e) => return refused(e),
        };
    let record = m.message.clone().unwrap_or_default();
    let mut out = String::new();
    let st = state(m.state);
    let _ = write!(
        out,
        "<dl class=\"detail\"><dt>State</dt><dd id=\"state\" class=\"state {}\">{st}</dd>",
        st.to_lowercase()
    );
    let row = |out: &mut String, name: &str, value: &str| {
        let _ = write!(out, "<dt>{name}</dt><dd>{value}</dd>");
    };
    row(&mut out, "Id", &esc(&m.id).to_string());
    if !m.tenant.is_empty() {
        row(&mut out, "Tenant", &esc(&m.tenant).to_string());
    }
    row(&mut out, "Topic", &esc(&record.topic).to_string());
    if let Some(p) = record.partition {
        row(&mut out, "Partition", &p.to_string());
    }
    row(&mut out, "Due", &time(m.deliver_at));
    row(&mut out, "Scheduled", &time(m.scheduled_at));
    row(&mut out, "Attempts", &m.attempts.to_string());
    if !m.last_error.is_empty() {
        row(&mut out, "Last error", &esc(&m.last_error).to_string());
    }
    if let Some(d) = m.max_lateness {
        row(&mut out, "Deadline", &format!("{} s after due", d.seconds));
    }
    if !m.dead_letter_topic.is_empty() {
        row(&mut out, "Dead-letter topic", &esc(&m.dead_letter_topic).to_string());
    }
    use proto::get_response::Settlement as S;
    match &m.settlement {
        Some(S::Delivered(d)) => row(
            &mut out,
            "Delivered",
            &format!("{} to partition {} at offset {}", time(d.delivered_at), d.partition, d.offset),
        ),
        Some(S::Cancelled(c)) => row(&mut out, "Cancelled", &time(c.cancelled_at)),
        Some(S::Failed(f)) => row(&mut out, "Failed", &format!("{}: {}", time(f.failed_at), esc(&f.reason))),
        Some(S::Expired(e)) => {
            row(&mut out, "Expired", &format!("{} (deadline {})", time(e.expired_at), time(e.deadline)))
        }
        Some(S::DeadLettered(d)) => row(
            &mut out,
            "Dead-lettered",
            &format!(
                "{} to {} partition {} at offset {} ({}{})",
                time(d.dead_lettered_at),
                esc(&d.topic),
                d.partition,
                d.offset,
                esc(&d.reason),
                if d.error.is_empty() { String::new() } else { format!(": {}", esc(&d.error)) }
            ),
        ),
        None => {}
    }
    let mut labels: Vec<_> = m.labels.iter().collect();
    labels.sort();
    if !labels.is_empty() {
        let text =
            labels.iter().map(|(k, v)| format!("{}={}", esc(k), esc(v))).collect::<Vec<_>>().join(", ");
        row(&mut out, "Labels", &text);
    }
    out.push_str("</dl>");
    actions(&mut out, (tenant, &m.id), st, csrf);
    out.push_str("<h2>Record</h2>");
    if m.body_dropped {
        out.push_str(
            "<p id=\"body-dropped\">Delivered: its key, value and headers were not kept once the delivery was \
             on disk (the server keeps them with <code>--keep-delivered-bodies</code>).</p>",
        );
        return out;
    }
    if let Some(key) = &record.key {
        out.push_str("<h3>Key</h3>");
        shown(&mut out, "key", key, hex_view);
    }
    if !record.headers.is_empty() {
        out.push_str("<h3>Headers</h3><table id=\"headers\"><tbody>");
        for h in &record.headers {
            let value = match bytes(&h.value) {
                Shown::Text(t) => esc(&t).to_string(),
                Shown::Hex(x) => format!("<code>{}</code> (hex)", esc(&x)),
            };
            let _ = write!(out, "<tr><th>{}</th><td>{value}</td></tr>", esc(&h.key));
        }
        out.push_str("</tbody></table>");
    }
    let _ = write!(
        out,
        "<h3>Value <small>{} bytes · <a href=\"/message?id={}{}{}\">{}</a></small></h3>",
        record.value.len(),
        Query(&m.id),
        if tenant.is_empty() { String::new() } else { format!("&amp;tenant={}", Query(tenant)) },
        if hex_view { "" } else { "&amp;view=hex" },
        if hex_view { "as text" } else { "as hex" }
    );
    shown(&mut out, "value", &record.value, hex_view);
    out
}

fn shown(out: &mut String, id: &str, b: &[u8], hex_view: bool) {
    let (class, text) = match bytes(b) {
        Shown::Text(t) if !hex_view => ("text", t),
        Shown::Text(_) => ("hex", hex(b)),
        Shown::Hex(x) => ("hex", x),
    };
    let _ = write!(out, "<pre id=\"{id}\" class=\"{class}\">{}</pre>", esc(&text));
}

fn actions(out: &mut String, (tenant, id): (&str, &str), state: &str, csrf: &str) {
    let hidden = format!(
        "<input type=\"hidden\" name=\"id\" value=\"{}\"><input type=\"hidden\" name=\"tenant\" value=\"{}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(id),
        esc(tenant),
        esc(csrf)
    );
    out.push_str("<div class=\"actions\">");
    if state == "PENDING" {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/message/cancel\">{hidden}<button id=\"cancel\">Cancel</button></form>"
        );
    }
    if matches!(state, "FAILED" | "EXPIRED" | "DEAD_LETTERED") {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/message/reschedule\">{hidden}<button id=\"redrive\">Re-drive now</button></form>"
        );
    }
    if state != "DELIVERED" && state != "CANCELLED" {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/message/reschedule\">{hidden}\
             <input name=\"at\" placeholder=\"2026-11-29T09:00Z or 10m\"><button id=\"reschedule\">Reschedule</button></form>"
        );
    }
    out.push_str("</div>");
}
