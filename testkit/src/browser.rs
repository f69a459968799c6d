//! A real browser for the console's tests: Debian's Chromium, headless,
//! driven over the W3C WebDriver protocol by `chromedriver` (both from
//! `deploy/local/install-deps.sh`). The client is the protocol's plain
//! JSON over HTTP/1.1, enough for what the tests do: open a page, find
//! elements by CSS selector, type, click, read text and take screenshots.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow, bail};
use serde_json::{Value, json};

use crate::free_port;

/// The W3C element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// One browser session, closed (and its driver stopped) on drop.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

/// An element of the current page.
#[derive(Clone, Debug)]
pub struct Element(String);

impl Browser {
    /// Starts chromedriver and a headless Chromium.
    pub fn start() -> anyhow::Result<Browser> {
        let port = free_port()?;
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting chromedriver (deploy/local/install-deps.sh installs chromium-driver)")?;
        let mut browser = Browser { driver, port, session: String::new() };
        let deadline = Instant::now() + Duration::from_secs(20);
        while browser.http("GET", "/status", None).is_err() {
            if Instant::now() > deadline {
                bail!("chromedriver did not answer on port {port} within 20 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let binary = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("chromium");
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            // Test servers' certificates are signed by a test CA.
            "acceptInsecureCerts": true,
            "goog:chromeOptions": {
                "binary": binary,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,1000", "--hide-scrollbars"]
            }
        }}});
        let answer = browser.http("POST", "/session", Some(capabilities))?;
        browser.session = answer["value"]["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow!("chromedriver started no session: {answer}"))?
            .to_owned();
        // A search waits this long for its element: a click that submits
        // a form returns before the next page is there.
        browser.command("POST", "timeouts", json!({ "implicit": 5000 }))?;
        Ok(browser)
    }

    /// Opens `url` and waits for it to load.
    pub fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.command("POST", "url", json!({ "url": url })).map(drop)
    }

    pub fn url(&self) -> anyhow::Result<String> {
        Ok(self.command("GET", "url", Value::Null)?.as_str().unwrap_or_default().to_owned())
    }

    /// Waits (up to 10 s) until the page's address holds `part`: a click
    /// that submits a form returns before the next page is there.
    pub fn wait_for_url(&self, part: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let url = self.url()?;
            if url.contains(part) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the page stayed at {url}, not one with {part:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The page's HTML as the browser holds it now.
    pub fn source(&self) -> anyhow::Result<String> {
        Ok(self.command("GET", "source", Value::Null)?.as_str().unwrap_or_default().to_owned())
    }

    /// The first element `css` selects.
    pub fn find(&self, css: &str) -> anyhow::Result<Element> {
        let found = self
            .command("POST", "element", json!({"using": "css selector", "value": css}))
            .with_context(|| format!("finding {css:?} on {}", self.url().unwrap_or_default()))?;
        Ok(Element(found[ELEMENT].as_str().ok_or_else(|| anyhow!("no element in {found}"))?.to_owned()))
    }

    /// Every element `css` selects (after waiting for one, at most the
    /// implicit wait: an empty answer takes that long).
    pub fn find_all(&self, css: &str) -> anyhow::Result<Vec<Element>> {
        let found = self.command("POST", "elements", json!({"using": "css selector", "value": css}))?;
        Ok(found
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e[ELEMENT].as_str().map(|id| Element(id.to_owned())))
            .collect())
    }

    pub fn click(&self, e: &Element) -> anyhow::Result<()> {
        self.command("POST", &format!("element/{}/click", e.0), json!({})).map(drop)
    }

    /// Types `text` into a field (after what it holds).
    pub fn type_into(&self, e: &Element, text: &str) -> anyhow::Result<()> {
        self.command("POST", &format!("element/{}/value", e.0), json!({ "text": text })).map(drop)
    }

    pub fn clear(&self, e: &Element) -> anyhow::Result<()> {
        self.command("POST", &format!("element/{}/clear", e.0), json!({})).map(drop)
    }

    /// The element's text as rendered.
    pub fn text(&self, e: &Element) -> anyhow::Result<String> {
        Ok(self
            .command("GET", &format!("element/{}/text", e.0), Value::Null)?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    pub fn attribute(&self, e: &Element, name: &str) -> anyhow::Result<Option<String>> {
        Ok(self
            .command("GET", &format!("element/{}/attribute/{name}", e.0), Value::Null)?
            .as_str()
            .map(str::to_owned))
    }

    /// The page's cookie `name` (`HttpOnly` ones too), as WebDriver gives
    /// it: `value`, `secure`, `httpOnly`, `sameSite` and the rest.
    pub fn cookie(&self, name: &str) -> Option<Value> {
        self.command("GET", &format!("cookie/{name}"), Value::Null).ok()
    }

    /// The text of an alert, confirm or prompt dialog, if one is open.
    pub fn dialog(&self) -> Option<String> {
        self.command("GET", "alert/text", Value::Null).ok().map(|v| v.as_str().unwrap_or_default().to_owned())
    }

    /// A PNG of the window, written to `path`.
    pub fn screenshot(&self, path: &std::path::Path) -> anyhow::Result<()> {
        use base64::Engine as _;
        let data = self.command("GET", "screenshot", Value::Null)?;
        let png = base64::engine::general_purpose::STANDARD.decode(data.as_str().unwrap_or_default())?;
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }

    fn command(&self, method: &str, path: &str, body: Value) -> anyhow::Result<Value> {
        let body = (method == "POST").then_some(body);
        let answer = self.http(method, &format!("/session/{}/{path}", self.session), body)?;
        Ok(answer["value"].clone())
    }

    /// One WebDriver request; the answer's JSON, or its error.
    fn http(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        )?;
        // Read up to the body's length (or the last chunk): the driver may
        // keep the connection open.
        let mut raw = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        let (head, payload) = loop {
            let n = stream.read(&mut buf)?;
            raw.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&raw);
            if let Some((head, payload)) = text.split_once("\r\n\r\n") {
                let lower = head.to_ascii_lowercase();
                let length = lower
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok());
                let done = match length {
                    Some(len) => payload.len() >= len,
                    None if lower.contains("transfer-encoding: chunked") => payload.ends_with("0\r\n\r\n"),
                    None => n == 0,
                };
                if done || n == 0 {
                    let payload = if length.is_none() && lower.contains("transfer-encoding: chunked") {
                        unchunk(payload)
                    } else {
                        payload.to_owned()
                    };
                    break (head.to_owned(), payload);
                }
            } else if n == 0 {
                bail!("no HTTP answer: {text}");
            }
        };
        let status: u16 = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let json: Value =
            serde_json::from_str(&payload).with_context(|| format!("WebDriver answered {payload:?}"))?;
        if status != 200 {
            bail!(
                "WebDriver {method} {path}: {status} {}",
                json["value"]["message"].as_str().unwrap_or(&payload)
            );
        }
        Ok(json)
    }
}

fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.http("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
