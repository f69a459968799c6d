//! Building pages: every piece of text that is not the page's own goes
//! through [`esc`], and the page carries no script at all (the
//! Content-Security-Policy in [`super::headers`] allows none), so that
//! nothing a message holds (key, value, headers, labels, errors, topic
//! names) can run in an operator's browser.

use std::fmt::{self, Write as _};

use crate::{Error, proto};

/// Text escaped for HTML element content and quoted attribute values.
pub(super) struct Esc<'a>(pub &'a str);

pub(super) fn esc(text: &str) -> Esc<'_> {
    Esc(text)
}

impl fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut last = 0;
        for (i, c) in self.0.char_indices() {
            let with = match c {
                '&' => "&amp;",
                '<' => "&lt;",
                '>' => "&gt;",
                '"' => "&quot;",
                '\'' => "&#39;",
                _ => continue,
            };
            f.write_str(&self.0[last..i])?;
            f.write_str(with)?;
            last = i + c.len_utf8();
        }
        f.write_str(&self.0[last..])
    }
}

/// Text escaped for a URL's query component (then for HTML, as it goes in
/// an attribute).
pub(super) struct Query<'a>(pub &'a str);

impl fmt::Display for Query<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0.bytes() {
            match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    f.write_char(b as char)?
                }
                _ => write!(f, "%{b:02X}")?,
            }
        }
        Ok(())
    }
}

/// Bytes as a person can read them: UTF-8 text as text (escaped), anything
/// else as hex. Never interpreted.
pub(super) enum Shown {
    Text(String),
    Hex(String),
}

pub(super) fn bytes(b: &[u8]) -> Shown {
    match std::str::from_utf8(b) {
        Ok(text) if !text.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t')) => {
            Shown::Text(text.to_owned())
        }
        _ => Shown::Hex(hex(b)),
    }
}

pub(super) fn hex(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len() * 3);
    for (i, byte) in b.iter().enumerate() {
        if i > 0 {
            out.push(if i % 16 == 0 { '\n' } else { ' ' });
        }
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// A wire time as RFC 3339 (UTC, milliseconds), or a dash.
pub(super) fn time(t: Option<prost_types::Timestamp>) -> String {
    t.and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32))
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| "–".to_owned())
}

/// A state as the API names it, without its prefix.
pub(super) fn state(s: i32) -> &'static str {
    proto::State::try_from(s).map_or("UNKNOWN", |s| s.as_str_name().trim_start_matches("STATE_"))
}

/// An error as the API gives it: its gRPC code and message.
pub(super) fn refused(e: Error) -> String {
    let status = tonic::Status::from(e);
    format!(
        "<p class=\"error\" id=\"refused\"><b>{}</b>: {}</p>",
        esc(&format!("{:?}", status.code())),
        esc(status.message())
    )
}

/// The page around `body`: the header with the navigation, and the title.
pub(super) fn page(title: &str, signed_in: Option<&str>, csrf: &str, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 1024);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · hourglass</title><link rel=\"stylesheet\" href=\"/console.css\"></head><body>\
         <header><a class=\"brand\" href=\"/\">hourglass</a><nav>\
         <a href=\"/\">Overview</a><a href=\"/messages\">Find</a><a href=\"/series\">Series</a>\
         <a href=\"/policies\">Policies</a><a href=\"/cluster\">Cluster</a></nav>",
        esc(title)
    );
    if let Some(who) = signed_in {
        let _ = write!(
            out,
            "<form class=\"who\" method=\"post\" action=\"/sign-out\"><span>{}</span>\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\"><button>Sign out</button></form>",
            esc(if who.is_empty() { "no authentication" } else { who }),
            esc(csrf)
        );
    }
    let _ = write!(out, "</header><main><h1>{}</h1>{body}</main></body></html>", esc(title));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_text_is_shown_not_run() {
        let evil = "<script>alert('x')</script><img src=x onerror=\"y\">&";
        assert_eq!(
            esc(evil).to_string(),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&lt;img src=x onerror=&quot;y&quot;&gt;&amp;"
        );
        assert_eq!(Query("a b&c=<d>/é").to_string(), "a%20b%26c%3D%3Cd%3E%2F%C3%A9");
    }

    #[test]
    fn bytes_are_text_when_they_read_as_text_else_hex() {
        assert!(matches!(bytes(b"{\"a\": 1}\n"), Shown::Text(t) if t == "{\"a\": 1}\n"));
        assert!(matches!(bytes(&[0xff, 0x00, 0x41]), Shown::Hex(h) if h == "ff 00 41"));
        assert!(matches!(bytes(b"a\x1bb"), Shown::Hex(_)), "a terminal escape is not shown as text");
        assert_eq!(hex(&[0; 17]).lines().count(), 2, "16 bytes a line");
    }
}
