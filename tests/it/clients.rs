//! The packaged clients (clients/), each installed as its README says into
//! an environment of its own, and its own tests run against a real server
//! with tokens and a real broker.

use crate::common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use common::*;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Runs `command`, failing the test with its output if it fails; its
/// output, stdout and stderr together.
fn run(command: &mut Command, what: &str) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what}: {}\n{said}", out.status);
    said
}

/// A fresh virtual environment in `venv` with the Python package installed
/// as its README says (`pip install ./clients/python`); its python. The
/// system's grpcio and protobuf serve, as a team's own would.
pub(crate) fn python_with_package(venv: &Path) -> PathBuf {
    run(Command::new("python3").args(["-m", "venv", "--system-site-packages"]).arg(venv), "python3 -m venv");
    let python = venv.join("bin/python");
    run(
        Command::new(&python).args(["-m", "pip", "install", "--quiet"]).arg(repo("clients/python")),
        "pip install ./clients/python",
    );
    python
}

/// The stubs the Python package ships are what generate.sh makes from
/// the proto now: the package never drifts from the server.
#[test]
fn the_python_package_ships_the_stubs_of_the_proto_as_it_is() {
    let fresh = tempfile::tempdir().unwrap();
    run(
        Command::new("bash").arg(repo("clients/python/generate.sh")).arg(fresh.path()),
        "generate.sh (pip install grpcio-tools)",
    );
    let shipped = repo("clients/python/src/hourglass_kafka/_proto");
    for file in ["__init__.py", "hourglass_pb2.py", "hourglass_pb2.pyi", "hourglass_pb2_grpc.py"] {
        let (now, kept) =
            (std::fs::read(fresh.path().join(file)).unwrap(), std::fs::read(shipped.join(file)).unwrap());
        assert!(now == kept, "{file} differs from the proto's: run bash clients/python/generate.sh");
    }
}

/// `pip install clients/python` into a fresh virtual environment, then the
/// package's own tests against a server with tokens: schedule, retry,
/// get, cancel, reschedule, list, upsert, series, policies, the errors and
/// their field violations, a token's grant, UNAVAILABLE retried with the
/// same id, and the asyncio client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_package_installs_and_passes_its_tests_against_a_real_server() {
    let (dir, (_broker, server, _pki), env) = server_with_tokens().await;
    let venv = dir.path().join("venv");
    tokio::task::spawn_blocking(move || {
        let python = python_with_package(&venv);
        // From outside the checkout: the installed package, not the sources.
        let said = run(
            Command::new(&python)
                .args(["-m", "unittest", "discover", "-v", "-s"])
                .arg(repo("clients/python/tests"))
                .current_dir(&venv)
                .envs(env),
            "the Python package's tests",
        );
        // Every test of the file ran, and none was skipped.
        assert!(said.contains("Ran 9 tests") && said.trim_end().ends_with("OK"), "{said}");
    })
    .await
    .unwrap();
    server.stop().await;
}

/// A server with mutual TLS and tokens, and a broker, for a package's
/// tests: a token for one tenant's topics (with `admin = "tenant"`) and
/// another tenant's topic; the environment its tests read
/// (HOURGLASS_TEST_*: the server's https:// URL, the CA, a client
/// certificate and key).
pub(crate) async fn server_with_tokens()
-> (tempfile::TempDir, (Broker, Hourglass, tempfile::TempDir), Vec<(&'static str, String)>) {
    let broker = Broker::start();
    let prefix = random_name("client");
    let (topic, other) = (format!("{prefix}.events"), random_name("others"));
    broker.create_topic(&topic, 1).await;
    broker.create_topic(&other, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let pki = crate::security::pki();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nname = \"client\"\ntoken = \"client-token\"\ntopics = [\"{prefix}.*\"]\nadmin = \"tenant\"\n\n\
             [[token]]\nname = \"others\"\ntoken = \"others-token\"\ntopics = [\"{other}\"]\n"
        ),
    )
    .unwrap();
    let server = Hourglass::start(hourglass::config::Config {
        auth_tokens: Some(tokens),
        tls_cert: Some(pki.path().join("server.pem")),
        tls_key: Some(pki.path().join("server.key")),
        tls_client_ca: Some(pki.path().join("ca.pem")),
        // The clients' tests read a delivered message's body back.
        keep_delivered_bodies: true,
        ..config(&broker, &dir.path().join("data"))
    })
    .await;
    let file = |name: &str| pki.path().join(name).display().to_string();
    let env = vec![
        ("HOURGLASS_TEST_SERVER", format!("https://{}", server.addr)),
        ("HOURGLASS_TEST_CA", file("ca.pem")),
        ("HOURGLASS_TEST_CERT", file("client.pem")),
        ("HOURGLASS_TEST_KEY", file("client.key")),
        ("HOURGLASS_TEST_TOPIC", topic),
        ("HOURGLASS_TEST_TOKEN", "client-token".to_owned()),
        ("HOURGLASS_TEST_OTHER_TOPIC", other),
    ];
    (dir, (broker, server, pki), env)
}

/// The code the TypeScript package ships is what `npm run generate` makes
/// from the proto now.
#[test]
fn the_typescript_package_ships_the_code_of_the_proto_as_it_is() {
    let package = repo("clients/typescript");
    run(
        Command::new("npm").args(["ci", "--no-audit", "--no-fund", "--silent"]).current_dir(&package),
        "npm ci in clients/typescript (Node.js and npm: bash deploy/local/install-deps.sh)",
    );
    let fresh = tempfile::tempdir().unwrap();
    run(
        Command::new("npx")
            .args(["buf", "generate", "../../proto", "--template", "buf.gen.yaml", "-o"])
            .arg(fresh.path())
            .current_dir(&package),
        "buf generate",
    );
    for file in ["hourglass_pb.js", "hourglass_pb.d.ts"] {
        let at = Path::new("src/gen/hourglass/v1").join(file);
        let (now, kept) =
            (std::fs::read(fresh.path().join(&at)).unwrap(), std::fs::read(package.join(&at)).unwrap());
        assert!(now == kept, "{file} differs from the proto's: run npm run generate in clients/typescript");
    }
}

/// `npm install --install-links clients/typescript` into a project of its
/// own, as its README says; its declarations type-check a TypeScript
/// caller (`tsc --strict`), and its tests pass against a server with
/// tokens: schedule, retry, get, cancel, reschedule, list, upsert, series,
/// policies, errors with their field violations, a token's grant, and
/// UNAVAILABLE retried with the same id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_package_installs_type_checks_and_passes_its_tests_against_a_real_server() {
    let (dir, (_broker, server, _pki), env) = server_with_tokens().await;
    let project = dir.path().join("project");
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&project).unwrap();
        std::fs::write(
            project.join("package.json"),
            r#"{"name": "uses-hourglass", "private": true, "type": "module"}"#,
        )
        .unwrap();
        run(
            Command::new("npm")
                .args(["install", "--install-links", "--no-audit", "--no-fund", "--silent"])
                .arg(repo("clients/typescript"))
                .arg("typescript@5")
                .current_dir(&project),
            "npm install --install-links clients/typescript",
        );
        for file in ["client.test.js", "types.ts"] {
            std::fs::copy(repo("clients/typescript/test").join(file), project.join(file)).unwrap();
        }
        run(
            Command::new("node_modules/.bin/tsc")
                .args(["--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext"])
                .args(["--target", "es2022", "types.ts"])
                .current_dir(&project),
            "tsc --strict types.ts",
        );
        let said = run(
            Command::new("node").args(["--test", "client.test.js"]).current_dir(&project).envs(env),
            "the TypeScript package's tests",
        );
        assert!(said.contains("# pass 6") && said.contains("# fail 0"), "{said}");
    })
    .await
    .unwrap();
    server.stop().await;
}

/// The Rust package (clients/rust, which the command line uses too)
/// against a server with mutual TLS and tokens: schedule (an id made
/// before the first try, a repeat answered as a duplicate), get, the
/// delivery, list, reschedule, cancel, and the errors with their fields;
/// the other tenant's topic and a missing token refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_package_schedules_reads_and_cancels_against_a_real_server() {
    use hourglass_kafka::{Client, Schedule, proto};
    use std::time::{Duration, SystemTime};

    let (_dir, (_broker, server, _pki), env) = server_with_tokens().await;
    let get = |name: &str| env.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    let (topic, other) = (get("HOURGLASS_TEST_TOPIC"), get("HOURGLASS_TEST_OTHER_TOPIC"));
    let builder = Client::builder(get("HOURGLASS_TEST_SERVER"))
        .ca_cert(get("HOURGLASS_TEST_CA"))
        .identity(get("HOURGLASS_TEST_CERT"), get("HOURGLASS_TEST_KEY"));
    let client = builder.clone().token("client-token").connect().await.unwrap();

    let soon =
        Schedule::new(&topic, "from rust").delay(Duration::from_millis(300)).key("k").label("from", "rust");
    let done = client.schedule(soon.clone().id("rust-1")).await.unwrap();
    assert_eq!((done.id.as_str(), done.duplicate), ("rust-1", false));
    assert!(done.deliver_at > SystemTime::now() - Duration::from_secs(5));
    assert!(client.schedule(soon.id("rust-1")).await.unwrap().duplicate);
    let mut got = client.get("rust-1").await.unwrap();
    for _ in 0..100 {
        if got.state() == proto::State::Delivered {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        got = client.get("rust-1").await.unwrap();
    }
    assert_eq!(got.state(), proto::State::Delivered);
    assert_eq!(got.message.unwrap().value, b"from rust");

    let later =
        client.schedule(Schedule::new(&topic, "later").delay(Duration::from_secs(3600))).await.unwrap();
    assert_eq!(later.id.len(), 26, "an id made by the client, a ULID: {}", later.id);
    let listed =
        client.list(proto::ListRequest { topic: topic.clone(), page_size: 1, ..Default::default() }).await;
    assert!(listed.unwrap().iter().any(|m| m.id == later.id));
    let at = SystemTime::now() + Duration::from_secs(7200);
    let moved = client.reschedule(&later.id, at).await.unwrap();
    assert!(moved.duration_since(at).unwrap_or_else(|e| e.duration()) < Duration::from_millis(1));
    assert_eq!(client.cancel(&later.id).await.unwrap(), proto::CancelOutcome::Cancelled);
    assert_eq!(client.cancel(&later.id).await.unwrap(), proto::CancelOutcome::AlreadyCancelled);

    let bad = client.schedule(Schedule::new(&topic, "x").id("has space")).await.unwrap_err();
    assert_eq!(bad.code(), Some(tonic::Code::InvalidArgument));
    assert_eq!(bad.violations()[0].field, "id", "{bad}");
    let theirs = client.schedule(Schedule::new(&other, "x")).await.unwrap_err();
    assert_eq!(theirs.code(), Some(tonic::Code::PermissionDenied), "{theirs}");
    let anonymous = builder.connect().await.unwrap();
    let refused = anonymous.get("rust-1").await.unwrap_err();
    assert_eq!(refused.code(), Some(tonic::Code::Unauthenticated), "{refused}");
    let plaintext = Client::builder("http://127.0.0.1:1").ca_cert("ca.pem").connect().await.unwrap_err();
    assert!(plaintext.to_string().contains("https://"), "{plaintext}");
    server.stop().await;
}
