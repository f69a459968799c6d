//! The deploy artifacts, checked without Docker or a cluster: every command
//! they run parses with the real command line, every environment variable
//! they set is one hourglass reads, probes ask gRPC health on the port the
//! server listens on, the example config sets every option and validates,
//! and the alert rules and the dashboard are valid PromQL over metrics
//! hourglass exports (checked by `promtool`).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use hourglass::config::Config;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_hourglass");

pub(crate) fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

pub(crate) fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The flags of `hourglass serve`, as config keys (`max-pending` →
/// `max_pending`), and the environment variables they read: from the real
/// binary's `--help`.
pub(crate) fn serve_options() -> (BTreeSet<String>, BTreeSet<String>) {
    let out = Command::new(BIN).args(["serve", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let mut keys = BTreeSet::new();
    let mut env = BTreeSet::new();
    for line in help.lines() {
        if let Some(long) = line.trim_start().strip_prefix("--").and_then(|l| l.split([' ', '=']).next()) {
            match long {
                // The binary's own, for every subcommand: not a setting
                // of the server's (like HOURGLASS_LOG, its filter).
                "config" | "print-config" | "help" | "log-format" => {}
                "kafka-property" => drop(keys.insert("kafka_properties".to_owned())),
                other => drop(keys.insert(other.replace('-', "_"))),
            }
        }
        let mut rest = line;
        while let Some(at) = rest.find("[env: ") {
            let var = &rest[at + 6..];
            let end = var.find(['=', ']']).unwrap_or(var.len());
            env.insert(var[..end].to_owned());
            rest = &var[end..];
        }
    }
    assert!(keys.contains("kafka_brokers") && env.contains("HOURGLASS_KAFKA_BROKERS"), "{help}");
    // Read by the binary itself rather than by a flag.
    env.extend(["HOURGLASS_LOG", "HOURGLASS_SERVER", "HOURGLASS_KAFKA_PROPERTIES"].map(str::to_owned));
    (keys, env)
}

/// The secrets the examples mount, made by the script they tell people to
/// run (`deploy/secrets/make-secrets.sh`), once per test run.
fn secrets() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        tool(
            "bash",
            &[repo("deploy/secrets/make-secrets.sh").to_str().unwrap(), dir.path().to_str().unwrap()],
        );
        dir
    })
    .path()
}

/// Where a secret the examples mount is found here: its file made by the
/// script, whatever directory the example mounts it in.
fn mounted(path: Option<PathBuf>) -> Option<PathBuf> {
    path.map(|p| {
        let mounts = ["/run/secrets/", "/etc/hourglass/secrets/", "/etc/hourglass/cluster/"];
        if mounts.iter().any(|m| p.starts_with(m)) { secrets().join(p.file_name().unwrap()) } else { p }
    })
}

/// The settings `hourglass ARGS...` runs with, as the binary prints them
/// (`serve --print-config`, which checks them and the files they name);
/// fails the test with the binary's own message if it would refuse them.
/// The config file named is the example one, installed; the secrets are
/// those make-secrets.sh made.
fn parse_serve(args: &[String], what: &str) -> Config {
    parse_serve_with(args, &[], what)
}

/// [`parse_serve`] with the `HOURGLASS_*` environment the example sets.
pub(crate) fn parse_serve_with(args: &[String], env: &[(String, String)], what: &str) -> Config {
    assert_eq!(args.first().map(String::as_str), Some("serve"), "{what} does not run `hourglass serve`");
    let mut local = Vec::new();
    let mut after_config = false;
    for arg in &args[1..] {
        let arg = match arg.split_once('=') {
            Some(("--config", _)) => format!("--config={}", repo("deploy/hourglass.toml").display()),
            Some((flag, value)) if flag.starts_with("--") => {
                format!("{flag}={}", mounted(Some(value.into())).unwrap().display())
            }
            _ if after_config => repo("deploy/hourglass.toml").display().to_string(),
            _ => mounted(Some(arg.into())).unwrap().display().to_string(),
        };
        after_config = arg == "--config";
        local.push(arg);
    }
    let out = Command::new(BIN)
        .args(["serve", "--print-config"])
        .args(&local)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what} runs `hourglass {}`, which the binary refuses:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    toml::from_str(&printed)
        .unwrap_or_else(|e| panic!("{what}: the printed settings do not parse: {e}\n{printed}"))
}

/// A server reachable beyond its own machine must ask for tokens.
pub(crate) fn assert_not_open(config: &Config, what: &str) {
    if !config.listen.ip().is_loopback() {
        assert!(
            config.auth_tokens.is_some(),
            "{what} listens on {} with no tokens file: anyone who reaches it may schedule",
            config.listen
        );
    }
}

pub(crate) fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
}

pub(crate) fn port_of(addr: &str) -> u64 {
    addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or_else(|| panic!("no port in {addr}"))
}

/// YAML documents as JSON, through PyYAML (installed with yamllint).
fn yaml(path: &str) -> Vec<Value> {
    yaml_of(&read(path), path)
}

/// [`yaml`] of `text`, which `what` names.
pub(crate) fn yaml_of(text: &str, what: &str) -> Vec<Value> {
    use std::io::Write as _;
    let mut python = Command::new("python3")
        .args(["-c", "import sys, json, yaml; json.dump(list(yaml.safe_load_all(sys.stdin)), sys.stdout)"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    python.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = python.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what} is not valid YAML (or PyYAML is missing: bash deploy/local/install-deps.sh):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

pub(crate) fn tool(name: &str, args: &[&str]) {
    let out = Command::new(name).args(args).output().unwrap_or_else(|e| {
        panic!("running {name} ({e}); install it with bash deploy/local/install-deps.sh")
    });
    assert!(
        out.status.success(),
        "{name} {}:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().map_or_else(|| s.to_string(), str::to_owned)).collect())
        .unwrap_or_default()
}

#[test]
fn the_example_config_sets_every_option_and_is_valid() {
    let config = Config::from_file(&repo("deploy/hourglass.toml")).unwrap();
    config.validate().unwrap();
    let text = read("deploy/hourglass.toml");
    let table: toml::Table = text.parse().unwrap();
    let mut set: BTreeSet<String> = table.keys().cloned().collect();
    // Options without a default are shown commented out: `# tls_cert = ...`.
    set.extend(text.lines().filter_map(|l| {
        let (key, _) = l.strip_prefix("# ")?.split_once(" = ")?;
        key.chars().all(|c| c.is_ascii_lowercase() || c == '_').then(|| key.to_owned())
    }));
    let (options, _) = serve_options();
    let missing: Vec<_> = options.difference(&set).collect();
    assert!(missing.is_empty(), "deploy/hourglass.toml does not explain {missing:?}");
    // Its values are the defaults, but for where the store lives.
    let defaults = Config { data_dir: config.data_dir.clone(), ..Config::default() };
    assert_eq!(config, defaults, "the example shows the defaults");
}

#[test]
fn the_systemd_unit_runs_a_valid_server_and_waits_for_its_shutdown() {
    let unit = read("deploy/systemd/hourglass.service");
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|l| l.strip_prefix('=')))
            .unwrap_or_else(|| panic!("the unit has no {key}"))
    };
    let exec: Vec<String> = value("ExecStart").split_whitespace().map(str::to_owned).collect();
    assert_eq!(exec[0], "/usr/local/bin/hourglass");
    let config = parse_serve(&exec[1..], "the systemd unit");
    let stop: u64 = value("TimeoutStopSec").parse().unwrap();
    assert!(Duration::from_secs(stop) > *config.shutdown_grace, "TimeoutStopSec must exceed shutdown_grace");
    assert_eq!(value("StateDirectory"), "hourglass");
    assert_eq!(config.data_dir, Path::new("/var/lib/hourglass"), "the store is in the StateDirectory");
}

#[test]
fn the_dockerfile_copies_what_exists_and_runs_a_valid_server() {
    let dockerfile = read("deploy/Dockerfile");
    let (_, env) = serve_options();
    let mut command = Vec::new();
    let mut set_env = Vec::new();
    // What the build stage sees: the files it copies, where it puts them.
    let context = tempfile::tempdir().unwrap();
    let lines: Vec<String> = dockerfile.replace("\\\n", " ").lines().map(str::to_owned).collect();
    for line in &lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().copied() {
            Some("COPY") if !words[1].starts_with("--from") => {
                let to = words[words.len() - 1];
                for source in &words[1..words.len() - 1] {
                    assert!(
                        repo(source).exists(),
                        "the Dockerfile copies {source}, which is not in the repo"
                    );
                    let into = match to {
                        "./" => context.path().join(source),
                        to => context.path().join(to),
                    };
                    copy_tree(&repo(source), &into);
                }
            }
            Some("ENTRYPOINT") | Some("CMD") => {
                let json: Value = serde_json::from_str(line.split_once(' ').unwrap().1).unwrap();
                command.extend(strings(&json));
            }
            Some("ENV") => {
                set_env.extend(words[1..].iter().filter_map(|w| w.split_once('=').map(|(k, _)| k)))
            }
            _ => {}
        }
    }
    // The build stage has every file the build reads: cargo resolves the
    // workspace (members, the [patch]) from what was copied, and every
    // file the server's source builds in is there.
    let metadata = Command::new(env!("CARGO"))
        .args(["metadata", "--offline", "--locked", "--format-version", "1", "--manifest-path"])
        .arg(context.path().join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        metadata.status.success(),
        "cargo cannot read the workspace the Dockerfile copies: {}",
        String::from_utf8_lossy(&metadata.stderr)
    );
    for (file, included) in included_files(&context.path().join("src")) {
        assert!(
            included.exists(),
            "{} builds in {}, which the Dockerfile does not copy",
            file.display(),
            included.display()
        );
    }
    for var in &set_env {
        assert!(env.contains(*var), "the Dockerfile sets {var}, which hourglass does not read");
    }
    assert_eq!(command[0], "hourglass");
    let config = parse_serve(&command[1..], "the Dockerfile");
    // What its ENV sets, over the command line's defaults.
    let value = |var: &str| {
        lines
            .iter()
            .flat_map(|l| l.split_whitespace())
            .find_map(|w| w.strip_prefix(&format!("{var}=")).map(str::to_owned))
    };
    let listen: std::net::SocketAddr = value("HOURGLASS_LISTEN").expect("HOURGLASS_LISTEN").parse().unwrap();
    let tokens = mounted(value("HOURGLASS_AUTH_TOKENS").map(PathBuf::from));
    assert!(
        tokens.as_ref().is_some_and(|t| t.exists()),
        "the Dockerfile's tokens file is one make-secrets.sh makes"
    );
    assert_not_open(&Config { listen, auth_tokens: tokens, ..config }, "the Dockerfile");
}

#[test]
fn compose_runs_valid_servers_built_from_the_dockerfile() {
    let (_, env) = serve_options();
    for file in ["deploy/docker-compose.yml", "deploy/docker-compose.cluster.yml"] {
        tool("yamllint", &["-d", "relaxed", "--no-warnings", repo(file).to_str().unwrap()]);
        let compose = &yaml(file)[0];
        let mut advertised = BTreeSet::new();
        let nodes: Vec<(&String, &Value)> = compose["services"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, service)| service["image"].as_str().is_some_and(|i| i.starts_with("hourglass:")))
            .collect();
        for (name, hourglass) in &nodes {
            let what = format!("{file}, service {name}");
            let dockerfile = hourglass["build"]["dockerfile"].as_str().unwrap();
            assert!(repo(dockerfile).exists(), "{what} builds {dockerfile}, which is not in the repo");
            let vars: Vec<(String, String)> = hourglass["environment"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect();
            for (var, _) in &vars {
                assert!(env.contains(var), "{what} sets {var}, which hourglass does not read");
            }
            let config = parse_serve_with(&strings(&hourglass["command"]), &vars, &what);
            // The image listens on every interface: compose asks for tokens
            // and TLS, from secrets it mounts, and publishes the open
            // metrics port locally.
            assert!(
                config.auth_tokens.is_some() && config.tls_cert.is_some(),
                "{what} runs with tokens and TLS"
            );
            let mounted_secrets: Vec<String> = strings(&hourglass["secrets"]);
            for file in [&config.auth_tokens, &config.tls_cert, &config.tls_key, &config.tls_peer_ca] {
                let Some(file) = file else { continue };
                let name = file.file_name().unwrap().to_str().unwrap().to_owned();
                assert!(mounted_secrets.contains(&name), "{what} mounts {name}");
                let source = compose["secrets"][&name]["file"].as_str().expect("a secret from a file");
                assert!(
                    source.starts_with("./secrets/"),
                    "{name} comes from what make-secrets.sh makes: {source}"
                );
            }
            if config.cluster {
                // Each node is reached at its own name, which its
                // certificate holds (make-secrets.sh).
                let addr = config.advertise_addr.clone().expect("a cluster node says where it is reached");
                let host = addr.trim_start_matches("https://").split(':').next().unwrap().to_owned();
                assert_eq!(host, **name, "{what} is reached at its service name");
                let ext = std::fs::read_to_string(repo("deploy/secrets/make-secrets.sh")).unwrap();
                assert!(ext.contains(&format!("DNS:{host},")), "the certificate names {host}");
                advertised.insert(addr);
            }
        }
        // Nothing is published beyond this machine: not the metrics port,
        // which is open, nor the broker, which is.
        for (name, service) in compose["services"].as_object().unwrap() {
            for port in strings(&service["ports"]) {
                assert!(
                    port.starts_with("127.0.0.1:"),
                    "{file}: {name} publishes {port} beyond this machine"
                );
            }
        }
        let cluster = advertised.len();
        assert!(
            cluster == 0 || cluster == nodes.len(),
            "{file}: every node of a cluster is advertised apart"
        );
        if file.contains("cluster") {
            assert_eq!(cluster, 3, "{file} runs a 3-node cluster");
        }
    }
}

/// Every `hourglass_*` series exported, with a value for each labelled one.
fn exported_metrics() -> BTreeSet<String> {
    use hourglass::metrics::*;
    init();
    GRPC_REQUESTS.with_label_values(&["Schedule", "Ok"]).inc();
    GRPC_SECONDS.with_label_values(&["Schedule"]).observe(0.001);
    SCHEDULE_ITEMS.with_label_values(&["ScheduleBatch", "Ok"]).inc();
    ShardMetrics::of(0).pending.set(0);
    FORGED.with_label_values(&["log"]);
    INGRESS_RECORDS.with_label_values(&["hourglass-log-ingress", "refused"]);
    TOPIC_PAUSED_SINCE.with_label_values(&["orders", ""]).set(0);
    let text = render();
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("hourglass_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

fn assert_exported(names: &BTreeSet<String>, exported: &BTreeSet<String>, what: &str) {
    for name in names {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| exported.contains(*f)))
            .unwrap_or(name);
        assert!(exported.contains(family), "{what} uses {name}, which hourglass does not export");
    }
}

#[test]
fn alert_rules_and_the_dashboard_are_valid_promql_over_real_metrics() {
    let exported = exported_metrics();
    tool("promtool", &["check", "rules", repo("deploy/monitoring/alerts.yml").to_str().unwrap()]);
    assert_exported(&metric_names(&read("deploy/monitoring/alerts.yml")), &exported, "alerts.yml");

    let dashboard: Value = serde_json::from_str(&read("deploy/monitoring/grafana-dashboard.json")).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(exprs.len() >= 10, "the dashboard shows the main series");
    // promtool checks PromQL in rule files: each query as a recording rule.
    let rules: String = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "      - record: dashboard:query{i}\n        expr: {}\n",
                serde_json::to_string(e).unwrap()
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-queries.yml");
    std::fs::write(&file, format!("groups:\n  - name: dashboard\n    rules:\n{rules}")).unwrap();
    tool("promtool", &["check", "rules", file.to_str().unwrap()]);
    assert_exported(&metric_names(&exprs.join("\n")), &exported, "the dashboard");
}

/// The configuration reference's table of settings: every one of them,
/// each with the default it really has (from where it is declared).
#[test]
fn the_configuration_page_lists_every_setting_with_its_default() {
    let readme = read("docs/CONFIGURATION.md");
    let rows: Vec<Vec<String>> = readme
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .map(|l| l.trim().trim_matches('|').split('|').map(|c| c.trim().to_owned()).collect())
        .collect();
    for setting in Config::SETTINGS {
        let flag = format!("`--{}`", setting.key.replace('_', "-"));
        let row = rows
            .iter()
            .find(|r| r[0].split(" / ").any(|f| f == flag))
            .unwrap_or_else(|| panic!("docs/CONFIGURATION.md's settings table has no row for {flag}"));
        let at = row[0].split(" / ").position(|f| f == flag).unwrap();
        let shown = row[1].split(" / ").nth(at).unwrap_or("");
        let shown = shown.split('`').nth(1).unwrap_or("");
        assert_eq!(shown, setting.default.unwrap_or(""), "docs/CONFIGURATION.md's default of {flag}");
    }
}

/// The token make-secrets.sh writes is the examples' operator token: it
/// may pause topics and see the cluster, as their walkthroughs do.
#[test]
fn the_example_token_administers() {
    use hourglass::auth::{AdminScope, Authenticator};
    let auth = Authenticator::load(&secrets().join("tokens.toml")).unwrap();
    let token = std::fs::read_to_string(secrets().join("admin-token")).unwrap();
    let access = auth.token(token.trim()).unwrap();
    assert_eq!(access.admin().unwrap(), AdminScope::All, "the example token cannot administer");
}

/// `deploy/release.sh`, with the binaries this suite runs: every artifact
/// it names is made, the checksums hold, the server's tarball runs and
/// says its commit, and a second run makes the same bytes.
#[test]
fn the_release_script_packs_every_artifact_the_same_way_twice() {
    let binaries = Path::new(BIN).parent().unwrap();
    let release = |out: &Path| {
        let run = Command::new("bash")
            .arg(repo("deploy/release.sh"))
            .arg("--binaries")
            .arg(binaries)
            .arg("--out")
            .arg(out)
            // The suite may run on a tree with changes; the script packs
            // the commit all the same.
            .arg("--allow-dirty")
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "release.sh failed: {}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        std::fs::read_to_string(out.join("SHA256SUMS")).unwrap()
    };
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let sums = release(first.path());
    let version = env!("CARGO_PKG_VERSION");
    let server = format!("hourglass-{version}-x86_64-linux-gnu");
    for artifact in [
        format!("{server}.tar.gz"),
        format!("hourglass_kafka-{version}-py3-none-any.whl"),
        format!("hourglass_kafka-{version}.tar.gz"),
        format!("hourglass-kafka-{version}.tgz"),
        format!("hourglass-kafka-{version}.crate"),
    ] {
        assert!(sums.lines().any(|l| l.ends_with(&format!("  {artifact}"))), "{artifact} in {sums}");
    }
    tool_in(first.path(), "sha256sum", &["--check", "--quiet", "SHA256SUMS"]);
    tool_in(first.path(), "tar", &["-xzf", &format!("{server}.tar.gz")]);
    let unpacked = first.path().join(&server);
    for file in ["LICENSE", "README.md", "CHANGELOG.md", "docs/OPERATIONS.md", "deploy/hourglass.toml"] {
        assert!(unpacked.join(file).is_file(), "{file} is in the tarball");
    }
    let said = Command::new(unpacked.join("bin/hourglass")).arg("--version").output().unwrap();
    let ours = Command::new(BIN).arg("--version").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&said.stdout), String::from_utf8_lossy(&ours.stdout));
    assert!(!String::from_utf8_lossy(&said.stdout).contains("unknown"), "the build names its commit");
    // A directory of other files is not made a release's.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(elsewhere.path().join("notes.txt"), "mine").unwrap();
    let refused = Command::new("bash")
        .arg(repo("deploy/release.sh"))
        .args(["--binaries", binaries.to_str().unwrap(), "--allow-dirty", "--out"])
        .arg(elsewhere.path())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("holds files of its own"));
    assert!(elsewhere.path().join("notes.txt").exists(), "nothing of it was removed");
    // The same commit packs to the same bytes (but for the Python sdist,
    // whose gzip header setuptools dates now).
    let again = release(second.path());
    let sdist = format!("  hourglass_kafka-{version}.tar.gz");
    let reproducible =
        |sums: &str| sums.lines().filter(|l| !l.ends_with(&sdist)).collect::<Vec<_>>().join("\n");
    assert_eq!(reproducible(&sums), reproducible(&again), "the artifacts are reproducible");
}

fn tool_in(dir: &Path, name: &str, args: &[&str]) {
    let out = Command::new(name).args(args).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "{name} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Copies a file, or a directory's tree (without build output), to `to`.
fn copy_tree(from: &Path, to: &Path) {
    if from.is_file() {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
        return;
    }
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if ["target", "node_modules", "build"].contains(&name.to_str().unwrap_or_default()) {
            continue;
        }
        copy_tree(&entry.path(), &to.join(name));
    }
}

/// Every `include_str!`/`include_bytes!` under `dir`: the file that has
/// it, and the file it names.
fn included_files(dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(included_files(&path));
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for macro_name in ["include_str!(\"", "include_bytes!(\""] {
            for (at, _) in text.match_indices(macro_name) {
                let rest = &text[at + macro_name.len()..];
                let named = &rest[..rest.find('"').unwrap()];
                found.push((path.clone(), path.parent().unwrap().join(named)));
            }
        }
    }
    found
}
