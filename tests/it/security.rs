//! The gRPC port's security against a real server and broker: TLS and
//! mutual TLS with certificates made here, bearer tokens and the topics
//! each may use, and the client subcommands against a secured server.

use crate::common;

use std::{
    path::Path,
    process::{Command, Output},
    time::Duration,
};

use common::*;
use hourglass::{
    auth::Bearer,
    proto::{self, scheduler_client::SchedulerClient},
};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, Issuer, KeyPair};
use tonic::{
    Code,
    service::interceptor::InterceptedService,
    transport::{Certificate, Channel, ClientTlsConfig, Identity},
};

const BIN: &str = env!("CARGO_BIN_EXE_hourglass");

/// A CA of its own.
fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A certificate for `names` signed by `ca`, and its key, as PEM.
fn leaf(ca: &Issuer<'_, KeyPair>, names: &[&str]) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let cert = CertificateParams::new(names).unwrap().signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// In a temp dir: `ca.pem`; `server.pem`/`server.key` for 127.0.0.1 and
/// `client.pem`/`client.key`, both signed by that CA; `rogue.pem`/`rogue.key`,
/// a client certificate signed by another CA.
pub(crate) fn pki() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    let ca = new_ca("hourglass test CA");
    write("ca.pem", &ca.pem());
    for (name, names) in [("server", &["127.0.0.1", "localhost"][..]), ("client", &["client"][..])] {
        let (cert, key) = leaf(&ca, names);
        write(&format!("{name}.pem"), &cert);
        write(&format!("{name}.key"), &key);
    }
    let (cert, key) = leaf(&new_ca("another CA"), &["client"]);
    write("rogue.pem", &cert);
    write("rogue.key", &key);
    dir
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

/// A TLS channel trusting the test CA, presenting `identity` (a name in
/// `pki()`) if given.
pub(crate) async fn tls_channel(
    addr: std::net::SocketAddr,
    pki: &Path,
    identity: Option<&str>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(pki, "ca.pem")));
    if let Some(name) = identity {
        tls = tls.identity(Identity::from_pem(
            read(pki, &format!("{name}.pem")),
            read(pki, &format!("{name}.key")),
        ));
    }
    Channel::from_shared(format!("https://{addr}")).unwrap().tls_config(tls)?.connect().await
}

/// Whether a Get over `channel` (or the attempt to open it) is answered:
/// NOT_FOUND for an id nobody scheduled means the call went through.
async fn answered(channel: Result<Channel, tonic::transport::Error>) -> bool {
    let Ok(channel) = channel else { return false };
    match SchedulerClient::new(channel)
        .get(proto::GetRequest { id: "nobody-scheduled-this".into(), ..Default::default() })
        .await
    {
        Err(status) => status.code() == Code::NotFound,
        Ok(_) => panic!("a message nobody scheduled was found"),
    }
}

async fn plaintext_channel(addr: std::net::SocketAddr) -> Result<Channel, tonic::transport::Error> {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_clients_that_trust_the_ca_and_refuses_plaintext() {
    let pki = pki();
    let bed = TestBed::start_with("tls", 1, |c| {
        c.tls_cert = Some(pki.path().join("server.pem"));
        c.tls_key = Some(pki.path().join("server.key"));
    })
    .await;
    let addr = bed.server.addr;
    assert!(answered(tls_channel(addr, pki.path(), None).await).await, "a client trusting the CA is served");
    assert!(!answered(plaintext_channel(addr).await).await, "a plaintext client is not served");
    let untrusting = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(new_ca("stranger").pem()));
    let channel = Channel::from_shared(format!("https://{addr}")).unwrap().tls_config(untrusting).unwrap();
    assert!(!answered(channel.connect().await).await, "a client not trusting the server's CA gets nothing");
    bed.server.stop().await;
}

/// A certificate renewed on disk while the server runs: new connections
/// get it, no restart or signal needed. A certificate written before its
/// key (the pair does not match for a moment) changes nothing until the
/// key comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_renewed_on_disk_is_served_to_new_connections() {
    let (old, renewed) = (pki(), pki());
    let live = tempfile::tempdir().unwrap();
    let (cert, key) = (live.path().join("tls.crt"), live.path().join("tls.key"));
    std::fs::copy(old.path().join("server.pem"), &cert).unwrap();
    std::fs::copy(old.path().join("server.key"), &key).unwrap();
    let bed = TestBed::start_with("renewed", 1, |c| {
        c.tls_cert = Some(cert.clone());
        c.tls_key = Some(key.clone());
    })
    .await;
    let addr = bed.server.addr;
    let trusts = |pki: &Path| {
        let pki = pki.to_owned();
        async move { answered(tls_channel(addr, &pki, None).await).await }
    };
    assert!(trusts(old.path()).await, "the first certificate is served");
    assert!(!trusts(renewed.path()).await, "the renewed one is not yet");

    std::fs::copy(renewed.path().join("server.pem"), &cert).unwrap();
    // Longer than the files are looked at: the half-renewed pair was seen.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(trusts(old.path()).await, "a certificate without its key changes nothing");

    std::fs::copy(renewed.path().join("server.key"), &key).unwrap();
    let mut served = false;
    for _ in 0..100 {
        if trusts(renewed.path()).await {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "the renewed certificate is not served 10 s after it was written");
    assert!(!trusts(old.path()).await, "new connections no longer get the first certificate");
    bed.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_serves_only_clients_with_a_certificate_from_the_client_ca() {
    let pki = pki();
    let bed = TestBed::start_with("mtls", 1, |c| {
        c.tls_cert = Some(pki.path().join("server.pem"));
        c.tls_key = Some(pki.path().join("server.key"));
        c.tls_client_ca = Some(pki.path().join("ca.pem"));
    })
    .await;
    let addr = bed.server.addr;
    assert!(
        answered(tls_channel(addr, pki.path(), Some("client")).await).await,
        "a client certificate from the CA"
    );
    assert!(!answered(tls_channel(addr, pki.path(), None).await).await, "no client certificate");
    assert!(
        !answered(tls_channel(addr, pki.path(), Some("rogue")).await).await,
        "a certificate from another CA"
    );
    assert!(!answered(plaintext_channel(addr).await).await, "plaintext");
    bed.server.stop().await;
}

type Client = SchedulerClient<InterceptedService<Channel, Bearer>>;

async fn client_with(addr: std::net::SocketAddr, token: Option<&str>) -> Client {
    let channel = plaintext_channel(addr).await.expect("connecting");
    SchedulerClient::with_interceptor(channel, Bearer::new(token).unwrap())
}

fn with_id(mut request: proto::ScheduleRequest, id: &str) -> proto::ScheduleRequest {
    request.id = Some(id.into());
    request
}

fn sha256_hex(token: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_decide_who_may_schedule_to_which_topic() {
    let broker = Broker::start();
    let prefix = random_name("orders");
    let (by_prefix, exact, other) =
        (format!("{prefix}.created"), random_name("audit"), random_name("payments"));
    for topic in [&by_prefix, &exact, &other] {
        broker.create_topic(topic, 1).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nname = \"orders\"\nsha256 = \"{}\"\ntopics = [\"{prefix}.*\", \"{exact}\"]\n\n\
             [[token]]\nname = \"orders-narrow\"\ntoken = \"narrow-token\"\ntenant = \"orders\"\n\
             topics = [\"{exact}\"]\n\n\
             [[token]]\nname = \"admin\"\ntoken = \"admin-token\"\ntopics = [\"*\"]\n",
            sha256_hex("orders-token")
        ),
    )
    .unwrap();
    let mut config = config(&broker, &dir.path().join("data"));
    config.auth_tokens = Some(tokens);
    let server = Hourglass::start(config).await;
    // The server is up once health answers; health needs no token.
    let channel = plaintext_channel(server.addr).await.unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let mut serving = false;
    for _ in 0..100 {
        let check = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await;
        if check.is_ok_and(|r| {
            r.into_inner().status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        }) {
            serving = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(serving, "health answers without a token");

    let mut anonymous = client_with(server.addr, None).await;
    let mut impostor = client_with(server.addr, Some("guessed")).await;
    let mut orders = client_with(server.addr, Some("orders-token")).await;
    let mut narrow = client_with(server.addr, Some("narrow-token")).await;
    let mut admin = client_with(server.addr, Some("admin-token")).await;
    let now = Duration::ZERO;

    // No token, a bad token: refused before anything is read, and counted.
    let refused = |reason: &str| hourglass::metrics::AUTH_REFUSED.with_label_values(&[reason]).get();
    let (missing, invalid) = (refused("missing"), refused("invalid"));
    for (client, id) in [(&mut anonymous, "anonymous-1"), (&mut impostor, "impostor-1")] {
        let status = client.schedule(with_id(request(&by_prefix, "x", now), id)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        let status = client.get(proto::GetRequest { id: id.into(), ..Default::default() }).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        let status = orders.get(proto::GetRequest { id: id.into(), ..Default::default() }).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "nothing was stored for {id}");
    }
    // Other tests of this binary only add to the counters.
    assert!(refused("missing") >= missing + 2 && refused("invalid") >= invalid + 2);

    // A valid token, a topic it does not cover: refused, nothing stored.
    let status = orders.schedule(with_id(request(&other, "x", now), "forbidden-1")).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("orders") && status.message().contains(&other), "{}", status.message());
    let status =
        orders.get(proto::GetRequest { id: "forbidden-1".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "the refused message was not stored");

    // Covered topics: by prefix and by exact name; `*` covers every topic.
    orders.schedule(with_id(request(&by_prefix, "by-prefix", now), "prefix-1")).await.unwrap();
    orders.schedule(with_id(request(&exact, "by-name", now), "exact-1")).await.unwrap();
    admin.schedule(with_id(request(&other, "by-wildcard", now), "wildcard-1")).await.unwrap();
    for (topic, value) in [(&by_prefix, "by-prefix"), (&exact, "by-name"), (&other, "by-wildcard")] {
        let got = consume_async(&broker, topic, 1, Duration::from_secs(30), Duration::ZERO).await;
        assert_eq!(got.len(), 1, "{topic}");
        assert_eq!(got[0].value, value.as_bytes());
    }

    // Another tenant's message does not exist for a token (see tenants.rs);
    // its own tenant's message on a topic the token does not cover is
    // refused, and nothing changes.
    let reschedule = |id: &str| proto::RescheduleRequest {
        id: id.into(),
        due: Some(proto::reschedule_request::Due::Delay(prost_types::Duration { seconds: 60, nanos: 0 })),
        ..Default::default()
    };
    let status =
        orders.get(proto::GetRequest { id: "wildcard-1".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let status =
        narrow.get(proto::GetRequest { id: "prefix-1".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let status = narrow
        .cancel(proto::CancelRequest { id: "prefix-1".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(narrow.reschedule(reschedule("prefix-1")).await.unwrap_err().code(), Code::PermissionDenied);
    assert_eq!(
        narrow
            .get(proto::GetRequest { id: "exact-1".into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner()
            .id,
        "exact-1",
        "a token of the same tenant sees its messages on the topics it covers"
    );
    assert_eq!(
        orders
            .get(proto::GetRequest { id: "prefix-1".into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner()
            .state(),
        proto::State::Delivered,
        "untouched"
    );
    assert_eq!(
        admin
            .get(proto::GetRequest { id: "wildcard-1".into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner()
            .id,
        "wildcard-1"
    );

    // Batches and streams: each item for an uncovered topic is refused on
    // its own; the others are scheduled.
    let far = Duration::from_secs(3600);
    let batch = proto::ScheduleBatchRequest {
        requests: vec![
            with_id(request(&by_prefix, "x", far), "batch-ok"),
            with_id(request(&other, "x", far), "batch-denied"),
        ],
    };
    let results = orders.schedule_batch(batch).await.unwrap().into_inner().results;
    assert!(matches!(results[0].result, Some(proto::schedule_result::Result::Scheduled(_))), "{results:?}");
    let Some(proto::schedule_result::Result::Error(e)) = &results[1].result else { panic!("{results:?}") };
    assert_eq!(e.code, Code::PermissionDenied as i32, "{e:?}");
    let stream = tokio_stream::iter(vec![
        with_id(request(&other, "x", far), "stream-denied"),
        with_id(request(&exact, "x", far), "stream-ok"),
    ]);
    let mut answers = orders.schedule_stream(stream).await.unwrap().into_inner();
    let mut codes = Vec::new();
    while let Some(answer) = answers.message().await.unwrap() {
        codes.push(match answer.result {
            Some(proto::schedule_result::Result::Error(e)) => e.code,
            _ => Code::Ok as i32,
        });
    }
    assert_eq!(codes, [Code::PermissionDenied as i32, Code::Ok as i32]);
    for (id, stored) in
        [("batch-ok", true), ("batch-denied", false), ("stream-denied", false), ("stream-ok", true)]
    {
        let got = orders.get(proto::GetRequest { id: id.into(), ..Default::default() }).await;
        assert_eq!(got.is_ok(), stored, "{id}: {got:?}");
    }
    let status =
        anonymous.schedule_batch(proto::ScheduleBatchRequest { requests: vec![] }).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);

    // Reflection follows the tokens.
    assert_eq!(list_services(server.addr, None).await.unwrap_err().code(), Code::Unauthenticated);
    let services = list_services(server.addr, Some("orders-token")).await.unwrap();
    assert!(services.iter().any(|s| s == "hourglass.v1.Scheduler"), "{services:?}");

    server.stop().await;
}

/// The services reflection lists, asked with `token`.
async fn list_services(
    addr: std::net::SocketAddr,
    token: Option<&str>,
) -> Result<Vec<String>, tonic::Status> {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let channel = plaintext_channel(addr).await.unwrap();
    let mut client = ServerReflectionClient::with_interceptor(channel, Bearer::new(token).unwrap());
    let ask = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = client.server_reflection_info(tokio_stream::iter(vec![ask])).await?.into_inner();
    let Some(answer) = answers.message().await? else { return Ok(vec![]) };
    match answer.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            Ok(list.service.into_iter().map(|s| s.name).collect())
        }
        other => panic!("unexpected reflection answer {other:?}"),
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap()
}

/// The binary, without a token from the environment this test runs in.
fn hourglass() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("HOURGLASS_TOKEN");
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_subcommands_reach_a_server_with_mutual_tls_and_tokens() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, "[[token]]\nname = \"cli\"\ntoken = \"cli-token\"\ntopics = [\"*\"]\n").unwrap();
    let bed = TestBed::start_with("secure-cli", 1, |c| {
        c.tls_cert = Some(pki.path().join("server.pem"));
        c.tls_key = Some(pki.path().join("server.key"));
        c.tls_client_ca = Some(pki.path().join("ca.pem"));
        c.auth_tokens = Some(tokens.clone());
    })
    .await;
    let url = format!("https://{}", bed.server.addr);
    let path = |name: &str| pki.path().join(name).display().to_string();
    let tls = [
        "--server".to_owned(),
        url.clone(),
        "--ca-cert".to_owned(),
        path("ca.pem"),
        "--client-cert".to_owned(),
        path("client.pem"),
        "--client-key".to_owned(),
        path("client.key"),
    ];
    let schedule =
        ["schedule", "--topic", &bed.topic, "--value", "v", "--delay", "1h", "--id", "cli-secure-1"];

    // The server may still be starting: retry the first call a bounded
    // number of times.
    let mut out = run(hourglass().args(schedule).args(&tls).args(["--token", "cli-token"]));
    for _ in 0..50 {
        if out.status.success() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        out = run(hourglass().args(schedule).args(&tls).args(["--token", "cli-token"]));
    }
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("scheduled cli-secure-1 for "));

    let out = run(hourglass().args(["get", "cli-secure-1"]).args(&tls).env("HOURGLASS_TOKEN", "cli-token"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("state:        pending"));

    let out = run(hourglass().args(["get", "cli-secure-1"]).args(&tls));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Unauthenticated"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = run(hourglass().args([
        "get",
        "cli-secure-1",
        "--server",
        &url,
        "--ca-cert",
        &path("ca.pem"),
        "--token",
        "cli-token",
    ]));
    assert_eq!(out.status.code(), Some(1), "no client certificate, no answer");

    let out =
        run(hourglass().args(["get", "x", "--server", "http://127.0.0.1:1", "--ca-cert", &path("ca.pem")]));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("https://"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // `hourglass health`, as a probe runs it: over mutual TLS, without a
    // token, the certificate's name given apart from the address.
    let health = |extra: &[&str]| run(hourglass().arg("health").args(&tls).args(extra));
    let out = health(&["--tls-server-name", "localhost"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "the server: SERVING\n");
    let out = health(&["--service", "liveness", "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), r#"{"service":"liveness","serving":true}"#);
    // A name the certificate does not hold, a service health does not
    // know, and a server that is not there: each exits 1 and says why.
    let elsewhere = health(&["--tls-server-name", "elsewhere.example"]);
    let unknown = health(&["--service", "no.such.Service"]);
    let absent =
        run(hourglass().args(["health", "--server", "https://127.0.0.1:1", "--ca-cert", &path("ca.pem")]));
    for (out, says) in
        [(elsewhere, "error: the server at https://"), (unknown, "NotFound"), (absent, "127.0.0.1:1")]
    {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
    }
    bed.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_kafka_secret_stops_start_up_naming_the_property_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = hourglass::config::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().to_owned(),
        ..Default::default()
    };
    config.kafka_properties.insert("sasl.password".into(), "env:HOURGLASS_TEST_NEVER_SET".into());
    let listeners = hourglass::Listeners::bind(&config).await.unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let run = hourglass::run(config, listeners, shutdown.clone());
    let err = tokio::time::timeout(Duration::from_secs(30), run).await.expect("start-up stops").unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("kafka property sasl.password") && text.contains("HOURGLASS_TEST_NEVER_SET"),
        "{text}"
    );
}
