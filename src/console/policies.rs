//! Dispatch policies: each topic's pause, rate limit, deadline and
//! dead-letter topic, for every tenant or the caller's own, seen and
//! changed as the `Admin` service sees and changes them (with its checks:
//! an `admin` token, the topic's grant).

use std::{fmt::Write as _, time::Duration};

use serde::Deserialize;

use super::html::{esc, refused, time};
use crate::{
    Error,
    admin::{Change, PolicyService, Whose},
    auth::Access,
    message::UnixMillis,
    policy::Rate,
};

/// A change asked for by one of the page's forms.
#[derive(Debug, Deserialize)]
pub(super) struct PolicyForm {
    #[serde(default)]
    pub csrf: String,
    pub topic: String,
    /// "on": the policy of every tenant's messages on the topic.
    #[serde(default)]
    pub every: String,
    /// A tenant's own policy (a row's, for an operator); empty: the
    /// caller's own.
    #[serde(default)]
    pub tenant: String,
    /// pause, resume, rate, deadline, dead-letter.
    pub change: String,
    #[serde(default)]
    pub value: String,
    #[serde(default)]
    pub burst: String,
}

fn at(ms: u64) -> String {
    time((ms > 0).then(|| UnixMillis(ms).to_timestamp()))
}

/// The policies the caller sees, with the forms that change them.
pub(super) fn render(policies: &PolicyService, access: &Access, csrf: &str) -> String {
    let mut out = String::new();
    match policies.list(access) {
        Err(e) => out.push_str(&refused(e)),
        Ok(list) if list.is_empty() => out.push_str("<p id=\"none\">No topic has a dispatch policy.</p>"),
        Ok(list) => {
            out.push_str(
                "<table id=\"policies\"><thead><tr><th>Topic</th><th>For</th><th>Paused</th><th>Rate limit</th>\
                 <th>Deadline</th><th>Dead-letter topic</th><th>Changed</th><th></th></tr></thead><tbody>",
            );
            for (key, p) in list {
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} by {}</td><td>",
                    esc(&key.topic),
                    key.tenant.as_ref().map_or("every tenant".to_owned(), |t| esc(t.as_str()).to_string()),
                    if p.paused() { format!("since {}", at(p.paused_at_ms)) } else { "no".to_owned() },
                    if p.rate_per_second > 0 {
                        format!("{}/s, burst {}", p.rate_per_second, p.rate_burst)
                    } else {
                        "none".to_owned()
                    },
                    if p.max_lateness_ms > 0 {
                        humantime::format_duration(Duration::from_millis(p.max_lateness_ms)).to_string()
                    } else {
                        "none".to_owned()
                    },
                    if p.dead_letter_topic.is_empty() {
                        "–".to_owned()
                    } else {
                        esc(&p.dead_letter_topic).to_string()
                    },
                    at(p.updated_ms),
                    esc(if p.updated_by.is_empty() { "–" } else { &p.updated_by }),
                );
                let change = if p.paused() { "resume" } else { "pause" };
                let _ = write!(
                    out,
                    "<form method=\"post\" action=\"/policies\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                     <input type=\"hidden\" name=\"topic\" value=\"{}\">{}\
                     <input type=\"hidden\" name=\"change\" value=\"{change}\"><button>{}</button></form></td></tr>",
                    esc(csrf),
                    esc(&key.topic),
                    // The row's own policy, whoever's it is: an operator's
                    // click acts on that tenant's, not on its own.
                    match &key.tenant {
                        None => "<input type=\"hidden\" name=\"every\" value=\"on\">".to_owned(),
                        Some(t) =>
                            format!("<input type=\"hidden\" name=\"tenant\" value=\"{}\">", esc(t.as_str())),
                    },
                    if p.paused() { "Resume" } else { "Pause" },
                );
            }
            out.push_str("</tbody></table>");
        }
    }
    let _ = write!(
        out,
        "<h2>Change a policy</h2><form class=\"find\" id=\"change-policy\" method=\"post\" action=\"/policies\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <label>Topic <input name=\"topic\" required></label>\
         <label>Change <select name=\"change\">\
         <option value=\"pause\">pause</option><option value=\"resume\">resume</option>\
         <option value=\"rate\">rate limit (per second; 0: none)</option>\
         <option value=\"deadline\">deadline (e.g. 10m; empty: none)</option>\
         <option value=\"dead-letter\">dead-letter topic (empty: none)</option></select></label>\
         <label>Value <input name=\"value\"></label>\
         <label>Burst <input name=\"burst\" placeholder=\"rate limit only\"></label>\
         <label class=\"check\"><span>Every tenant</span><input type=\"checkbox\" name=\"every\"></label>\
         <button>Apply</button></form>\
         <p class=\"hint\">A policy for every tenant needs an admin = \"all\" token; one for your tenant, \
         admin = \"tenant\". A rate limit's burst defaults to a tenth of a second's worth.</p>",
        esc(csrf)
    );
    out
}

/// Makes the change a form asks for; what to say about it.
pub(super) async fn apply(policies: &PolicyService, access: &Access, form: &PolicyForm) -> String {
    match change_of(form) {
        Ok(change) => {
            let whose = Whose::of(form.every == "on", form.tenant.trim().to_owned());
            match policies.change(access, form.topic.trim(), &whose, change).await {
                Ok((key, _)) => {
                    format!("<p class=\"done\" id=\"outcome\">Changed: {}</p>", esc(&key.describe()))
                }
                Err(e) => refused(e),
            }
        }
        Err(e) => refused(e),
    }
}

fn change_of(form: &PolicyForm) -> Result<Change, Error> {
    let value = form.value.trim();
    let bad = |why: String| Error::from(crate::message::Invalid::new("value", why));
    Ok(match form.change.as_str() {
        "pause" => Change::Pause,
        "resume" => Change::Resume,
        "rate" => {
            let per_second: u32 = value
                .parse()
                .map_err(|_| bad(format!("{value:?} is not a number of messages per second")))?;
            let burst = match form.burst.trim() {
                "" => Rate::default_burst(per_second),
                b => b.parse().map_err(|_| bad(format!("burst {b:?} is not a number")))?,
            };
            Change::Limit((per_second > 0).then_some(Rate { per_second, burst }))
        }
        "deadline" if value.is_empty() => Change::MaxLateness(None),
        "deadline" => Change::MaxLateness(Some(
            humantime::parse_duration(value)
                .map_err(|e| bad(format!("{value:?} is not a length of time: {e}")))?,
        )),
        "dead-letter" => Change::DeadLetterTopic((!value.is_empty()).then(|| value.to_owned())),
        other => return Err(bad(format!("{other:?} is not a change this page makes"))),
    })
}
