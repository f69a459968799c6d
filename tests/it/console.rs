//! The operator console in a real browser (headless Chromium over
//! WebDriver), against a real server, broker and store: a person signs in
//! with a token, finds a message by label and cancels it, and the API
//! agrees; content is shown as text, never run; a token sees and touches
//! only what it covers, through any page or form; and the due-time
//! histogram is what `List` pages through for the same window. Over raw
//! HTTP, the console's bounds: clients that never finish a request,
//! connections per address, sign-in attempts, sessions per token, two
//! session cookies, and the peer a console without tokens serves.
//!
//! With `HOURGLASS_SCREENSHOTS=DIR` the tests leave a PNG of each page
//! there: the README's pictures (`docs/console/`) come from
//! `HOURGLASS_SCREENSHOTS=docs/console cargo test --test it console::`.

use crate::common;

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use common::*;
use hourglass::{
    auth::Bearer,
    proto::{
        self, CancelOutcome, State, admin_client::AdminClient, scheduler_client::SchedulerClient,
        series_client::SeriesClient,
    },
};
use hourglass_testkit::Browser;
use tonic::{service::interceptor::InterceptedService, transport::Channel};

type Client = SchedulerClient<InterceptedService<Channel, Bearer>>;

/// Runs the browser's blocking calls off the runtime's other work.
fn b<T>(f: impl FnOnce() -> anyhow::Result<T>) -> T {
    tokio::task::block_in_place(f).unwrap()
}

fn shot(browser: &Browser, name: &str) {
    if let Some(dir) = std::env::var_os("HOURGLASS_SCREENSHOTS") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        b(|| browser.screenshot(&dir.join(format!("{name}.png"))));
    }
}

/// A server with the console on, and tokens for two topics of one tenant
/// (`all` covers both and may set the tenant's policies, `orders` covers
/// one) and for another tenant (`rival`).
struct Shop {
    _broker: Broker,
    _dir: tempfile::TempDir,
    server: Hourglass,
    orders: String,
    payments: String,
}

impl Shop {
    async fn start() -> Shop {
        Shop::start_with(|_| {}).await
    }

    /// As `start`, with `adjust` applied to the server's settings.
    async fn start_with(adjust: impl FnOnce(&mut hourglass::config::Config)) -> Shop {
        let broker = Broker::start();
        let (orders, payments) = (random_name("orders"), random_name("payments"));
        broker.create_topic(&orders, 1).await;
        broker.create_topic(&payments, 1).await;
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(
            &tokens,
            format!(
                "[[token]]\nname = \"shop-ops\"\ntoken = \"all-token-5f1c9a0e\"\ntenant = \"shop\"\nadmin = \"tenant\"\ntopics = [\"{orders}\", \"{payments}\"]\n\n\
                 [[token]]\nname = \"shop-orders\"\ntoken = \"orders-token-5f1c9a0e\"\ntenant = \"shop\"\ntopics = [\"{orders}\"]\n\n\
                 [[token]]\nname = \"rival\"\ntoken = \"rival-token-5f1c9a0e\"\ntopics = [\"{orders}\", \"{payments}\"]\n\n\
                 [[token]]\nname = \"short\"\ntoken = \"tiny-token\"\ntopics = [\"{orders}\"]\n"
            ),
        )
        .unwrap();
        let mut config = config(&broker, &dir.path().join("data"));
        config.auth_tokens = Some(tokens);
        config.console_listen = Some("127.0.0.1:0".parse().unwrap());
        adjust(&mut config);
        let server = Hourglass::start(config).await;
        Shop { _broker: broker, _dir: dir, server, orders, payments }
    }

    fn console(&self) -> SocketAddr {
        self.server.console_addr.expect("the console is on")
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.console())
    }

    async fn channel(&self) -> Channel {
        let channel = Channel::from_shared(format!("http://{}", self.server.addr)).unwrap();
        for _ in 0..100 {
            if let Ok(channel) = channel.clone().connect().await {
                return channel;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("cannot connect to {}", self.server.addr);
    }

    async fn client(&self, token: &str) -> Client {
        SchedulerClient::with_interceptor(self.channel().await, Bearer::new(Some(token)).unwrap())
    }
}

fn labelled(topic: &str, id: &str, due_ms: u64, labels: &[(&str, &str)]) -> proto::ScheduleRequest {
    let mut r = request_at(topic, id, due_ms);
    r.labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    r
}

fn sign_in(browser: &Browser, shop: &Shop, token: &str) {
    b(|| browser.goto(&shop.url("/")));
    assert!(b(|| browser.url()).ends_with("/sign-in"), "a visitor is sent to sign in first");
    let field = b(|| browser.find("input[name=token]"));
    b(|| browser.type_into(&field, token));
    b(|| browser.click(&browser.find("#sign-in")?));
    // The next page: signed in, or refused.
    b(|| browser.find("header .who, #refused"));
}

/// A GET naming `host`, without a session.
async fn raw_get(addr: SocketAddr, path: &str, host: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// A form POSTed as a browser of the session would, outside any page.
async fn post(addr: SocketAddr, path: &str, cookie: &str, form: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nCookie: hourglass_console={cookie}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_finds_a_message_by_label_cancels_it_and_sees_only_what_the_token_covers() {
    let shop = Shop::start().await;
    let (mut all, mut rival) =
        (shop.client("all-token-5f1c9a0e").await, shop.client("rival-token-5f1c9a0e").await);
    let due = now_ms() + 3_600_000;
    let script = "<script>alert('value')</script><b>bold</b><img src=x onerror=alert(1)>";
    let mut evil = labelled(&shop.payments, "pay-1", due, &[("customer", "42")]);
    let message = evil.message.as_mut().unwrap();
    message.value = script.as_bytes().to_vec();
    message.key = Some(b"<i>key</i>".to_vec());
    message.headers =
        vec![proto::Header { key: "<h1>h</h1>".into(), value: b"<script>alert('header')</script>".to_vec() }];
    for r in [
        labelled(&shop.orders, "order-1", due, &[("customer", "42")]),
        labelled(&shop.orders, "order-2", due + 1000, &[("customer", "7")]),
        evil,
    ] {
        all.schedule(r).await.unwrap();
    }
    rival.schedule(labelled(&shop.orders, "rival-1", due, &[("customer", "42")])).await.unwrap();

    let browser = b(Browser::start);
    // A wrong token gets nowhere.
    sign_in(&browser, &shop, "not-a-token-5f1c9a0e");
    assert!(b(|| browser.text(&browser.find("#refused")?)).contains("not valid"));
    sign_in(&browser, &shop, "all-token-5f1c9a0e");
    assert_eq!(
        b(|| browser.text(&browser.find("#count-pending dd")?)),
        "3",
        "the shop's three, not the rival's"
    );

    // Find by label: the shop's customer 42, on both topics; not the rival's.
    b(|| browser.goto(&shop.url("/messages")));
    b(|| browser.type_into(&browser.find("input[name=label]")?, "customer=42"));
    b(|| browser.click(&browser.find("form.find button")?));
    b(|| browser.wait_for_url("label=customer"));
    let found = b(|| browser.text(&browser.find("#found")?));
    assert!(found.contains("order-1") && found.contains("pay-1"), "{found}");
    assert!(!found.contains("order-2") && !found.contains("rival-1"), "{found}");
    shot(&browser, "find");

    // Its page, and cancel from it.
    b(|| browser.click(&browser.find("a[href='/message?id=order-1']")?));
    assert_eq!(b(|| browser.text(&browser.find("#state")?)), "PENDING");
    b(|| browser.click(&browser.find("#cancel")?));
    assert_eq!(b(|| browser.text(&browser.find("#outcome")?)), "Cancel: CANCELLED");
    assert_eq!(b(|| browser.text(&browser.find("#state")?)), "CANCELLED");
    let again = all
        .cancel(proto::CancelRequest { id: "order-1".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.outcome(), CancelOutcome::AlreadyCancelled, "the API sees the page's cancel");

    // Markup in a record is shown as text, and runs nowhere.
    b(|| browser.goto(&shop.url("/message?id=pay-1")));
    assert_eq!(b(|| browser.text(&browser.find("#value")?)), script);
    assert_eq!(b(|| browser.text(&browser.find("#key")?)), "<i>key</i>");
    let headers = b(|| browser.text(&browser.find("#headers")?));
    assert!(
        headers.contains("<h1>h</h1>") && headers.contains("<script>alert('header')</script>"),
        "{headers}"
    );
    assert!(b(|| browser.find_all("script, img, #value *, #key *, #headers th *, #headers td *")).is_empty());
    assert_eq!(browser.dialog(), None, "no script ran");
    shot(&browser, "message-markup");
    b(|| browser.goto(&shop.url("/message?id=pay-1&view=hex")));
    assert!(b(|| browser.text(&browser.find("#value")?)).starts_with("3c 73 63 72"), "<scr as hex");

    // Another tenant's message is not there for this token.
    b(|| browser.goto(&shop.url("/message?id=rival-1")));
    assert!(b(|| browser.text(&browser.find("#refused")?)).starts_with("NotFound"));

    // A token for orders alone: payments are out of sight and out of reach.
    b(|| browser.click(&browser.find("header .who button")?));
    b(|| browser.wait_for_url("/sign-in"));
    sign_in(&browser, &shop, "orders-token-5f1c9a0e");
    assert_eq!(b(|| browser.text(&browser.find("#count-pending dd")?)), "1", "order-2 alone");
    let overview = b(|| browser.source());
    assert!(!overview.contains(&shop.payments), "the overview names no payments topic");
    b(|| browser.goto(&shop.url("/messages?label=customer%3D42")));
    assert!(b(|| browser.find_all("#found")).is_empty(), "order-1 is cancelled; pay-1 is not this token's");
    b(|| browser.goto(&shop.url(&format!("/messages?topic={}", shop.payments))));
    assert!(b(|| browser.text(&browser.find("#refused")?)).starts_with("PermissionDenied"));
    b(|| browser.goto(&shop.url("/message?id=pay-1")));
    assert!(b(|| browser.text(&browser.find("#refused")?)).starts_with("PermissionDenied"));
    assert!(!b(|| browser.source()).contains("alert"), "nothing of its record is shown");

    // Its own session's form, with its own CSRF token, still cannot touch
    // payments; without the token, or from another site, nothing is done.
    let cookie = browser.cookie("hourglass_console").expect("the session cookie");
    assert_eq!((cookie["httpOnly"].as_bool(), cookie["sameSite"].as_str()), (Some(true), Some("Strict")));
    let cookie = cookie["value"].as_str().unwrap().to_owned();
    b(|| browser.goto(&shop.url("/message?id=order-2")));
    let csrf = b(|| browser.attribute(&browser.find("input[name=csrf]")?, "value")).unwrap();
    for action in ["/message/cancel", "/message/reschedule"] {
        let answer = post(shop.console(), action, &cookie, &format!("id=pay-1&csrf={csrf}&at=1m")).await;
        assert!(answer.contains("PermissionDenied"), "{answer}");
    }
    let forged = post(shop.console(), "/message/cancel", &cookie, "id=order-2&csrf=0000").await;
    assert!(forged.starts_with("HTTP/1.1 403"), "{forged}");
    for id in ["pay-1", "order-2"] {
        let m =
            all.get(proto::GetRequest { id: id.into(), ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(m.state(), State::Pending, "{id}");
    }
    // A form of its own topic works as it should.
    let answer = post(shop.console(), "/message/cancel", &cookie, &format!("id=order-2&csrf={csrf}")).await;
    assert!(answer.contains("Cancel: <b>CANCELLED</b>"), "{answer}");
    drop(browser);
    shop.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_due_time_histogram_counts_what_list_returns_for_the_same_window() {
    let shop = Shop::start().await;
    let mut all = shop.client("all-token-5f1c9a0e").await;
    // Spread over the next day, with a wall at one minute past the hour.
    let now = now_ms();
    let mut requests = Vec::new();
    for i in 0..300u64 {
        let topic = if i % 3 == 0 { &shop.payments } else { &shop.orders };
        let due = now + 120_000 + (i * 7_919_000) % 86_000_000;
        requests.push(request_at(topic, &format!("spread-{i}"), due));
    }
    let wall = now + 3_600_000 - now % 3_600_000 + 60_000;
    for i in 0..100 {
        requests.push(request_at(&shop.orders, &format!("wall-{i}"), wall + i));
    }
    for batch in requests.chunks(100) {
        let answer =
            all.schedule_batch(proto::ScheduleBatchRequest { requests: batch.to_vec() }).await.unwrap();
        assert!(
            answer
                .into_inner()
                .results
                .iter()
                .all(|r| matches!(r.result, Some(proto::schedule_result::Result::Scheduled(_))))
        );
    }

    let browser = b(Browser::start);
    sign_in(&browser, &shop, "all-token-5f1c9a0e");
    for (span, topic) in [("hour", ""), ("day", ""), ("day", shop.orders.as_str())] {
        b(|| browser.goto(&shop.url(&format!("/?span={span}&topic={topic}"))));
        let window = b(|| browser.find("#window"));
        let attr = |name: &str| b(|| browser.attribute(&window, name)).unwrap();
        let parse = |t: String| chrono::DateTime::parse_from_rfc3339(&t).unwrap().timestamp_millis() as u64;
        let (from, to) = (parse(attr("data-from")), parse(attr("data-to")));
        let interval = attr("data-interval").parse::<u64>().unwrap() * 1000;
        let bars: Vec<u64> = b(|| browser.find_all("#histogram rect"))
            .iter()
            .map(|r| b(|| browser.attribute(r, "data-count")).unwrap().parse().unwrap())
            .collect();

        // The same window, paged through with List.
        let mut listed = vec![0u64; bars.len()];
        let mut token = String::new();
        loop {
            let page = all
                .list(proto::ListRequest {
                    topic: topic.to_owned(),
                    dispatch_from: Some(timestamp(from)),
                    dispatch_to: Some(timestamp(to)),
                    page_size: 1000,
                    page_token: token.clone(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            for m in &page.messages {
                listed[((millis(m.dispatch_at.as_ref().unwrap()) as u64 - from) / interval) as usize] += 1;
            }
            if page.next_page_token.is_empty() {
                break;
            }
            token = page.next_page_token;
        }
        assert_eq!(bars, listed, "{span} {topic}");
        assert!(bars.iter().sum::<u64>() > 0, "{span} {topic}: something in the window");
        if span == "day" && topic.is_empty() {
            let at_wall = ((wall - from) / interval) as usize;
            assert!(bars[at_wall] >= 100, "the wall shows: {bars:?}");
            shot(&browser, "overview");
        }
    }
    drop(browser);
    shop.server.stop().await;
}

/// Picks `value` in the `select` named `name` of the page's form.
fn choose(browser: &Browser, name: &str, value: &str) {
    b(|| browser.click(&browser.find(&format!("select[name={name}] option[value='{value}']"))?));
}

fn change_policy(browser: &Browser, topic: &str, change: &str, value: &str, every: bool) -> String {
    let form = "#change-policy";
    b(|| browser.type_into(&browser.find(&format!("{form} input[name=topic]"))?, topic));
    choose(browser, "change", change);
    b(|| browser.type_into(&browser.find(&format!("{form} input[name=value]"))?, value));
    if every {
        b(|| browser.click(&browser.find(&format!("{form} input[name=every]"))?));
    }
    b(|| browser.click(&browser.find(&format!("{form} button"))?));
    b(|| browser.text(&browser.find("#outcome, #refused")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_and_policies_are_seen_and_changed_within_what_the_token_may() {
    let shop = Shop::start().await;
    let with = |token: &str| Bearer::new(Some(token)).unwrap();
    let channel = shop.channel().await;
    let mut admin = AdminClient::with_interceptor(channel.clone(), with("all-token-5f1c9a0e"));
    let series_of = |token| SeriesClient::with_interceptor(channel.clone(), with(token));
    let spec = |topic: &str| proto::SeriesSpec {
        template: Some(proto::Message {
            topic: topic.into(),
            value: b"digest".to_vec(),
            ..Default::default()
        }),
        every: Some(proto::series_spec::Every::Cron("0 9 * * 1-5".into())),
        time_zone: "Europe/Paris".into(),
        ..Default::default()
    };
    let create =
        |id: &str, topic: &str| proto::CreateSeriesRequest { id: id.into(), spec: Some(spec(topic)) };
    series_of("all-token-5f1c9a0e").create_series(create("digest", &shop.orders)).await.unwrap();
    series_of("all-token-5f1c9a0e").create_series(create("payouts", &shop.payments)).await.unwrap();
    series_of("rival-token-5f1c9a0e").create_series(create("rival-digest", &shop.orders)).await.unwrap();

    let browser = b(Browser::start);
    sign_in(&browser, &shop, "all-token-5f1c9a0e");
    b(|| browser.goto(&shop.url("/series")));
    let listed = b(|| browser.text(&browser.find("#series")?));
    assert!(
        listed.contains("digest") && listed.contains("payouts") && listed.contains("Europe/Paris"),
        "{listed}"
    );
    assert!(!listed.contains("rival-digest"), "{listed}");
    shot(&browser, "series");
    b(|| browser.click(&browser.find("#series tr:nth-child(1) button")?));
    assert!(b(|| browser.text(&browser.find("#outcome")?)).starts_with("Paused digest"));
    let mut mine = series_of("all-token-5f1c9a0e");
    let digest = mine
        .get_series(proto::GetSeriesRequest { id: "digest".into(), next: 0, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(digest.into_inner().state(), proto::SeriesState::Paused);

    // The tenant's own policies: pause, a rate limit, a dead-letter topic.
    b(|| browser.goto(&shop.url("/policies")));
    assert!(change_policy(&browser, &shop.orders, "pause", "", false).starts_with("Changed"));
    b(|| browser.goto(&shop.url("/policies")));
    assert!(change_policy(&browser, &shop.orders, "rate", "100", false).starts_with("Changed"));
    b(|| browser.goto(&shop.url("/policies")));
    assert!(
        change_policy(&browser, &shop.orders, "dead-letter", &shop.payments, false).starts_with("Changed")
    );
    let table = b(|| browser.text(&browser.find("#policies")?));
    assert!(table.contains("100/s") && table.contains(&shop.payments) && table.contains("since"), "{table}");
    shot(&browser, "policies");
    let policy = admin
        .get_topic_policy(proto::TopicPolicyRequest {
            topic: shop.orders.clone(),
            all_tenants: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(policy.paused && policy.rate_limit.map(|r| r.per_second) == Some(100), "{policy:?}");
    assert_eq!(policy.dead_letter_topic, shop.payments);
    // What the token may not: every tenant's policy, a topic it is not granted.
    b(|| browser.goto(&shop.url("/policies")));
    assert!(change_policy(&browser, &shop.orders, "pause", "", true).starts_with("PermissionDenied"));
    b(|| browser.goto(&shop.url("/policies")));
    let refused = change_policy(&browser, &shop.orders, "dead-letter", "not-granted", false);
    assert!(refused.starts_with("PermissionDenied"), "{refused}");

    // The server's own state is not a tenant's to see.
    b(|| browser.goto(&shop.url("/cluster")));
    assert!(b(|| browser.text(&browser.find("#refused")?)).starts_with("PermissionDenied"));

    // A token of the same tenant without admin, and for orders alone.
    b(|| browser.click(&browser.find("header .who button")?));
    b(|| browser.wait_for_url("/sign-in"));
    sign_in(&browser, &shop, "orders-token-5f1c9a0e");
    b(|| browser.goto(&shop.url("/series")));
    let listed = b(|| browser.text(&browser.find("#series")?));
    assert!(listed.contains("digest") && !listed.contains("payouts"), "{listed}");
    b(|| browser.goto(&shop.url("/policies")));
    let table = b(|| browser.text(&browser.find("#policies")?));
    assert!(table.contains(&shop.orders), "it sees its topic's policy: {table}");
    assert!(change_policy(&browser, &shop.orders, "resume", "", false).starts_with("PermissionDenied"));
    let cookie = browser.cookie("hourglass_console").unwrap()["value"].as_str().unwrap().to_owned();
    let csrf = b(|| browser.attribute(&browser.find("input[name=csrf]")?, "value")).unwrap();
    let answer =
        post(shop.console(), "/series", &cookie, &format!("csrf={csrf}&id=payouts&change=delete")).await;
    assert!(answer.contains("PermissionDenied") || answer.contains("NotFound"), "{answer}");
    let payouts = mine
        .get_series(proto::GetSeriesRequest { id: "payouts".into(), next: 0, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(payouts.into_inner().state(), proto::SeriesState::Active);
    drop(browser);
    shop.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_grpc_ports_certificate_the_console_speaks_https_only() {
    let pki = crate::security::pki();
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&broker, dir.path());
    config.tls_cert = Some(pki.path().join("server.pem"));
    config.tls_key = Some(pki.path().join("server.key"));
    config.console_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = Hourglass::start(config).await;
    let console = server.console_addr.unwrap();

    let browser = b(Browser::start);
    // No tokens: the console opens a session at once, over TLS.
    b(|| browser.goto(&format!("https://{console}/")));
    assert_eq!(b(|| browser.text(&browser.find("h1")?)), "Overview");
    // A cookie no other site of the domain can set for it: `__Host-`,
    // Secure, for the whole host and no Domain.
    let cookie = browser.cookie("__Host-hourglass_console").expect("a session");
    assert_eq!(cookie["secure"].as_bool(), Some(true), "{cookie}");
    assert_eq!(cookie["path"].as_str(), Some("/"), "{cookie}");
    assert!(browser.cookie("hourglass_console").is_none(), "no cookie of the plain name");
    // Standalone, the cluster page shows one node owning every shard.
    b(|| browser.goto(&format!("https://{console}/cluster")));
    assert!(b(|| browser.text(&browser.find("#mode")?)).starts_with("Standalone"));
    assert!(b(|| browser.text(&browser.find("#shards")?)).contains("this server"));
    // Plain HTTP gets no page.
    let _ = tokio::task::block_in_place(|| browser.goto(&format!("http://{console}/")));
    assert!(!b(|| browser.source()).contains("Overview"));
    drop(browser);
    server.stop().await;
}

/// Two nodes of a cluster (librdkafka's mock cluster), two shards, each
/// node owning one and standing by for the other: the console of one
/// shows both nodes, each shard's owner and standby and how far each copy
/// is behind; once the other node is killed, that its shard moved here.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn any_node_shows_the_whole_cluster_and_its_moves() {
    use crate::let_go::{node, wait_metric};
    let mock = common::mock::Mock::start(1);
    let (log_topic, group) = (random_name("hourglass-log"), random_name("hourglass"));
    for (name, partitions) in
        [(log_topic.clone(), 2), (format!("{log_topic}-owners"), 1), (format!("{log_topic}-ingress"), 1)]
    {
        mock.topic_led(&name, partitions, 1);
    }
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let port = hourglass_testkit::free_port().unwrap();
    let mut here = node(&mock, dirs[0].path(), &log_topic, &group, 2)
        .arg("--console-listen", format!("127.0.0.1:{port}"));
    here.spawn().unwrap();
    here.wait_serving(Duration::from_secs(60)).await.unwrap();
    let mut there = node(&mock, dirs[1].path(), &log_topic, &group, 2);
    there.spawn().unwrap();
    there.wait_serving(Duration::from_secs(60)).await.unwrap();
    for n in [&here, &there] {
        wait_metric(n, "hourglass_cluster_shards_owned", 1.0, Duration::from_secs(60)).await;
        wait_metric(n, "hourglass_cluster_standbys", 1.0, Duration::from_secs(60)).await;
    }

    // Without tokens, a name other than a loopback one (a DNS rebinding
    // of some site to 127.0.0.1) gets no page.
    let answer = raw_get(SocketAddr::from(([127, 0, 0, 1], port)), "/sign-in", "evil.example:9470").await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(!answer.to_ascii_lowercase().contains("set-cookie"), "{answer}");

    let browser = b(Browser::start);
    // No tokens: the first visit opens a session.
    b(|| browser.goto(&format!("http://127.0.0.1:{port}/")));
    let page = format!("http://127.0.0.1:{port}/cluster");
    b(|| browser.goto(&page));
    assert!(b(|| browser.text(&browser.find("#mode")?)).starts_with("Cluster mode · 2 shards · 2 node(s)"));
    let nodes = b(|| browser.text(&browser.find("#nodes")?));
    assert!(nodes.contains(&here.grpc) && nodes.contains(&there.grpc), "{nodes}");
    let shards = b(|| browser.text(&browser.find("#shards")?));
    for line in shards.lines().skip(1) {
        assert!(
            !line.contains("no node answered") && !line.contains("none"),
            "an owner and a standby each: {shards}"
        );
    }
    shot(&browser, "cluster");

    there.kill();
    wait_metric(&here, "hourglass_cluster_shards_owned", 2.0, Duration::from_secs(60)).await;
    b(|| browser.goto(&page));
    let nodes = b(|| browser.text(&browser.find("#nodes")?));
    assert!(!nodes.contains(&there.grpc), "{nodes}");
    let moves = b(|| browser.text(&browser.find("#moves")?));
    assert!(
        moves.lines().filter(|l| l.contains("taken")).count() >= 2,
        "the first shard and the moved one: {moves}"
    );
    drop(browser);
    here.stop().unwrap();
}

/// A connection to the console from `from`: on Linux every 127.x.y.z is
/// this machine's, so each is a peer of its own.
async fn connect_from(from: IpAddr, to: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket.connect(to).await.unwrap()
}

/// What the console sends until it closes the connection (a reset closes
/// it too), waited for at most 30 s.
async fn until_closed(s: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out).into_owned();
    assert!(read.is_ok(), "the console did not close the connection; it sent {out:?}");
    out
}

/// `request` sent from `from`, and the answer until the console closes.
async fn exchange(from: IpAddr, to: SocketAddr, request: &str) -> String {
    use tokio::io::AsyncWriteExt;
    let mut s = connect_from(from, to).await;
    // A connection closed at once may refuse the request: the answer says.
    let _ = s.write_all(request.as_bytes()).await;
    until_closed(&mut s).await
}

fn sign_in_request(to: SocketAddr, token: &str) -> String {
    let form = format!("token={token}");
    format!(
        "POST /sign-in HTTP/1.1\r\nHost: {to}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    )
}

/// A GET with `cookies` (a `Cookie` header's value; none if empty).
fn get_request(to: SocketAddr, path: &str, cookies: &str) -> String {
    let cookies = if cookies.is_empty() { String::new() } else { format!("Cookie: {cookies}\r\n") };
    format!("GET {path} HTTP/1.1\r\nHost: {to}\r\n{cookies}Connection: close\r\n\r\n")
}

/// The `name=value` of the session cookie an answer sets.
fn session_cookie(answer: &str) -> String {
    answer
        .lines()
        .find_map(|l| l.get(..11).filter(|h| h.eq_ignore_ascii_case("set-cookie:")).map(|_| &l[11..]))
        .and_then(|v| v.trim().split(';').next())
        .unwrap_or_else(|| panic!("no session cookie set: {answer}"))
        .to_owned()
}

fn loopback(a: u8, b: u8, c: u8) -> IpAddr {
    IpAddr::from([127, a, b, c])
}

/// More connections than the console makes pages at once (16), each
/// sending the head of a sign-in and never its body: a signed-in person's
/// page is still served, and each of them is answered 408 and closed once
/// `--console-request-timeout` is over. A body larger than any form is
/// refused before it is read, and a kept-alive connection that sends no
/// next request is closed in the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_send_their_body_hold_no_page_and_are_closed_in_time() {
    use tokio::io::AsyncWriteExt;
    let shop = Shop::start_with(|c| c.console_request_timeout = Duration::from_secs(2).into()).await;
    let (console, here) = (shop.console(), loopback(0, 0, 1));
    let cookie =
        session_cookie(&exchange(here, console, &sign_in_request(console, "all-token-5f1c9a0e")).await);
    let mut stalled = Vec::new();
    for _ in 0..20 {
        let mut s = connect_from(here, console).await;
        let head = format!(
            "POST /sign-in HTTP/1.1\r\nHost: {console}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: 64\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        stalled.push(s);
    }
    // Time for the heads to be read, for order's sake; nothing is measured.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let page = exchange(here, console, &get_request(console, "/", &cookie)).await;
    assert!(page.starts_with("HTTP/1.1 200") && page.contains("Overview"), "{page}");
    for s in &mut stalled {
        let answer = until_closed(s).await;
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
    }

    let huge = format!(
        "POST /sign-in HTTP/1.1\r\nHost: {console}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: 100000\r\n\r\n"
    );
    let answer = exchange(here, console, &huge).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    let mut idle = connect_from(here, console).await;
    idle.write_all(format!("GET /console.css HTTP/1.1\r\nHost: {console}\r\n\r\n").as_bytes()).await.unwrap();
    let answer = until_closed(&mut idle).await;
    assert!(answer.starts_with("HTTP/1.1 200") && answer.matches("HTTP/1.1 ").count() == 1, "{answer}");
    shop.server.stop().await;
}

/// One address may hold `--console-connections-per-peer` connections:
/// one more is closed unanswered, while another address is served, and
/// a connection given back makes room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_share_of_one_address_are_closed_and_others_are_served() {
    let shop = Shop::start_with(|c| c.console_connections_per_peer = 4).await;
    let (console, here) = (shop.console(), loopback(0, 0, 1));
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from(here, console).await);
    }
    let over = exchange(here, console, &get_request(console, "/sign-in", "")).await;
    assert!(over.is_empty(), "{over}");
    let other = exchange(loopback(0, 0, 2), console, &get_request(console, "/sign-in", "")).await;
    assert!(other.starts_with("HTTP/1.1 200"), "{other}");
    held.pop();
    let mut tries = 0;
    loop {
        let answer = exchange(here, console, &get_request(console, "/sign-in", "")).await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        tries += 1;
        assert!(tries < 100, "the closed connection's room was not given back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shop.server.stop().await;
}

/// Sign-in is limited: ten attempts from one address, then 429 with
/// Retry-After, whatever the token; and wrong tokens tried from many
/// addresses soon stop every sign-in for a while, even with a good token
/// from an address never seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_attempts_are_limited_per_address_and_failures_across_all() {
    let shop = Shop::start().await;
    let console = shop.console();
    let (wrong, right) =
        (sign_in_request(console, "not-a-token-5f1c9a0e"), sign_in_request(console, "all-token-5f1c9a0e"));
    for _ in 0..10 {
        let answer = exchange(loopback(0, 0, 3), console, &wrong).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    }
    let limited = exchange(loopback(0, 0, 3), console, &right).await;
    assert!(limited.starts_with("HTTP/1.1 429"), "{limited}");
    assert!(limited.to_ascii_lowercase().contains("\r\nretry-after: "), "{limited}");
    let elsewhere = exchange(loopback(0, 0, 4), console, &right).await;
    assert!(elsewhere.starts_with("HTTP/1.1 303"), "another address signs in: {elsewhere}");

    // Ten wrong tokens from each new address, then a good one from another.
    let mut refused = None;
    for round in 0..30 {
        for _ in 0..10 {
            let answer = exchange(loopback(1, 0, round), console, &wrong).await;
            assert!(answer.starts_with("HTTP/1.1 401") || answer.starts_with("HTTP/1.1 429"), "{answer}");
        }
        let answer = exchange(loopback(2, 0, round), console, &right).await;
        if answer.starts_with("HTTP/1.1 429") {
            refused = Some(answer);
            break;
        }
        assert!(answer.starts_with("HTTP/1.1 303"), "{answer}");
    }
    let refused = refused.expect("failures from many addresses stop sign-ins for a while");
    assert!(refused.to_ascii_lowercase().contains("\r\nretry-after: "), "{refused}");
    shop.server.stop().await;
}

/// A token keeps at most 16 sessions: the 17th sign-in ends its oldest,
/// and another token's session lives on. A token shorter than 16
/// characters is refused though the tokens file has it, and a request
/// carrying two session cookies is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_ends_only_its_own_oldest_session_and_short_tokens_and_two_cookies_are_refused() {
    let shop = Shop::start().await;
    let console = shop.console();
    let sign_in = |n: u8, token: &str| {
        let request = sign_in_request(console, token);
        async move { exchange(loopback(3, 0, n), console, &request).await }
    };
    let rival = session_cookie(&sign_in(0, "rival-token-5f1c9a0e").await);
    let mut mine = Vec::new();
    for n in 1..=17 {
        mine.push(session_cookie(&sign_in(n, "all-token-5f1c9a0e").await));
    }
    let page = |cookie: String| {
        let request = get_request(console, "/", &cookie);
        async move { exchange(loopback(0, 0, 1), console, &request).await }
    };
    let oldest = page(mine[0].clone()).await;
    assert!(oldest.starts_with("HTTP/1.1 303") && oldest.contains("/sign-in"), "{oldest}");
    for cookie in [&mine[1], &mine[16], &rival] {
        let answer = page(cookie.clone()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{cookie}: {answer}");
    }

    let short = sign_in(100, "tiny-token").await;
    assert!(short.starts_with("HTTP/1.1 401") && short.contains("at least 16 characters"), "{short}");
    assert!(!short.to_ascii_lowercase().contains("set-cookie"), "{short}");

    let two = page(format!("{}; {}", mine[16], rival)).await;
    assert!(two.starts_with("HTTP/1.1 400"), "{two}");
    shop.server.stop().await;
}

/// An address of this machine other than loopback, found by asking the
/// routing table (a UDP socket connects without sending anything).
fn an_outside_address() -> IpAddr {
    for probe in ["192.0.2.1:9", "10.255.255.1:9", "198.51.100.1:9", "8.8.8.8:53"] {
        let Ok(socket) = std::net::UdpSocket::bind("0.0.0.0:0") else { continue };
        if socket.connect(probe).is_ok()
            && let Ok(local) = socket.local_addr()
            && !local.ip().is_loopback()
            && !local.ip().is_unspecified()
        {
            return local.ip();
        }
    }
    panic!("this test needs an address of this machine other than loopback, and a route from it");
}

/// Without tokens, a request that names a loopback host but comes from
/// another address (a forwarded port, a proxy on this machine) gets
/// nothing; from loopback, a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_only_a_loopback_peer_is_served() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&broker, dir.path());
    config.console_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = Hourglass::start(config).await;
    let console = server.console_addr.unwrap();
    let request =
        format!("GET /sign-in HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n", console.port());
    let outside = exchange(an_outside_address(), console, &request).await;
    assert!(outside.starts_with("HTTP/1.1 403"), "{outside}");
    assert!(!outside.to_ascii_lowercase().contains("set-cookie"), "{outside}");
    let here = exchange(loopback(0, 0, 1), console, &request).await;
    assert!(here.starts_with("HTTP/1.1 303"), "{here}");
    session_cookie(&here);
    server.stop().await;
}

/// An operator's click on a row of the Policies page acts on that row's
/// policy (another tenant's own), not on the operator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_click_on_a_policy_row_acts_on_that_rows_tenant() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let broker = Broker::start();
    let topic = random_name("orders");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = acme_and_ops(dir.path(), &[&topic]);
    let mut config = config(&broker, &dir.path().join("data"));
    config.auth_tokens = Some(tokens);
    config.console_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = Hourglass::start(config).await;
    let channel = Channel::from_shared(format!("http://{}", server.addr)).unwrap().connect().await.unwrap();
    let mut acme = AdminClient::with_interceptor(channel, Bearer::new(Some(ACME_TOKEN)).unwrap());
    let own = proto::TopicPolicyRequest { topic: topic.clone(), ..Default::default() };
    acme.pause_topic(own.clone()).await.unwrap();

    let to = server.console_addr.unwrap();
    let from = loopback(0, 0, 1);
    let cookie = session_cookie(&exchange(from, to, &sign_in_request(to, OPS_TOKEN)).await);
    let page = exchange(from, to, &get_request(to, "/policies", &cookie)).await;
    assert!(page.contains("name=\"tenant\" value=\"acme\""), "the row names its tenant: {page}");
    let csrf = page.split("name=\"csrf\" value=\"").nth(1).and_then(|r| r.split('"').next()).unwrap();
    let form = format!("csrf={csrf}&topic={topic}&tenant=acme&change=resume");
    let mut s = connect_from(from, to).await;
    let request = format!(
        "POST /policies HTTP/1.1\r\nHost: {to}\r\nCookie: {cookie}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    assert!(answer.contains("id=\"outcome\">Changed") && answer.contains("acme"), "{answer}");
    let theirs = acme.get_topic_policy(own).await.unwrap().into_inner();
    assert!(!theirs.paused, "the operator's resume reached acme's own policy: {theirs:?}");
    server.stop().await;
}
