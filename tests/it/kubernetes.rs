//! The Kubernetes bases of `deploy/kubernetes/` (standalone, cluster,
//! sidecar, and the monitoring component), without a cluster: each renders
//! with `kubectl kustomize` and validates against Kubernetes' own schemas
//! (`kubernetes-validate --strict`), alone and with the monitoring
//! component; the server each runs parses with the real command line; its
//! probes run `hourglass health` against the port it listens on; and each
//! has what a platform team deploys with: volumes sized for its caps,
//! Services for clients and peers, a PodDisruptionBudget and topology
//! spread where there is more than one pod, and a NetworkPolicy.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;

use crate::deploy::{
    assert_not_open, flag, parse_serve_with, port_of, read, repo, serve_options, strings, tool, yaml_of,
};

const BASES: [&str; 3] = ["standalone", "cluster", "sidecar"];

/// Disk per parked message with 100-byte values ([docs/OPERATIONS.md],
/// "Sizing"): the backlog a base caps takes at most half its volume, the
/// rest is for the deliveries kept for `--retention` and compaction.
const BYTES_PER_PENDING: u64 = 340;

/// `kubectl kustomize DIR`.
fn render(dir: &Path) -> String {
    let out = Command::new("kubectl").arg("kustomize").arg(dir).output().unwrap_or_else(|e| {
        panic!("running kubectl ({e}); install it with bash deploy/local/install-deps.sh")
    });
    assert!(
        out.status.success(),
        "kubectl kustomize {}:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `kubernetes-validate --strict` of `text`: every resource of a kind
/// Kubernetes knows matches its schema, with no field it does not know.
fn validate(text: &str, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, text).unwrap();
    let out =
        Command::new("kubernetes-validate").args(["--strict", "--quiet"]).arg(&file).output().unwrap_or_else(
            |e| {
                panic!("running kubernetes-validate ({e}); install it with bash deploy/local/install-deps.sh")
            },
        );
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && !said.contains("ERROR"), "{what} does not validate:\n{said}");
}

/// An overlay of `base` with the monitoring component, in a directory of
/// its own (kustomize takes bases and components by relative path).
fn with_monitoring(base: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let up = "../".repeat(dir.path().components().count() - 1);
    let from_root = |p: &str| format!("{up}{}", repo(p).display().to_string().trim_start_matches('/'));
    let overlay = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{}]\ncomponents: [{}]\n",
        from_root(&format!("deploy/kubernetes/{base}")),
        from_root("deploy/kubernetes/monitoring"),
    );
    std::fs::write(dir.path().join("kustomization.yaml"), overlay).unwrap();
    let path = dir.path().to_owned();
    (dir, path)
}

#[test]
fn every_base_renders_and_validates_against_the_kubernetes_schemas() {
    for dir in BASES.iter().chain(&["monitoring"]) {
        for file in std::fs::read_dir(repo(&format!("deploy/kubernetes/{dir}"))).unwrap() {
            let file = file.unwrap().path();
            if file.extension().is_some_and(|e| e == "yaml") {
                tool("yamllint", &["-d", "relaxed", "--no-warnings", file.to_str().unwrap()]);
            }
        }
    }
    for base in BASES {
        let rendered = render(&repo(&format!("deploy/kubernetes/{base}")));
        validate(&rendered, base);
        let (_dir, overlay) = with_monitoring(base);
        let monitored = render(&overlay);
        validate(&monitored, &format!("{base} with monitoring"));
        let docs = yaml_of(&monitored, base);
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        for kind in ["ServiceMonitor", "PrometheusRule"] {
            assert!(kinds.contains(&kind), "{base} with monitoring has a {kind}: {kinds:?}");
        }
        // The ServiceMonitor scrapes each pod once: through one Service.
        let monitor = docs.iter().find(|d| d["kind"] == "ServiceMonitor").unwrap();
        let wanted = monitor["spec"]["selector"]["matchLabels"].as_object().unwrap();
        let scraped: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"] == "Service")
            .filter(|d| wanted.iter().all(|(k, v)| &d["metadata"]["labels"][k] == v))
            .collect();
        assert_eq!(scraped.len(), 1, "{base}: one Service for the ServiceMonitor");
        let port = monitor["spec"]["endpoints"][0]["port"].as_str().unwrap();
        assert!(
            scraped[0]["spec"]["ports"].as_array().unwrap().iter().any(|p| p["name"] == port),
            "{base}: the scraped Service has the port {port}"
        );
        let job = monitor["spec"]["jobLabel"].as_str().unwrap();
        assert_eq!(
            scraped[0]["metadata"]["labels"][job], "hourglass",
            "{base}: job=\"hourglass\", as the alerts ask"
        );
    }
}

/// The alert rules are one: the PrometheusRule holds alerts.yml's groups
/// as `make-rule.sh` writes them.
#[test]
fn the_prometheus_rule_is_the_alert_rules() {
    let alerts = read("deploy/monitoring/alerts.yml");
    let rule = read("deploy/kubernetes/monitoring/prometheusrule.yaml");
    let expected: String = alerts
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| if l.is_empty() { "\n".to_owned() } else { format!("  {l}\n") })
        .collect();
    let spec = rule.split_once("spec:\n").expect("a spec").1;
    assert!(
        spec == expected,
        "prometheusrule.yaml is not alerts.yml: run deploy/kubernetes/monitoring/make-rule.sh"
    );
    let alerts = &yaml_of(&alerts, "alerts.yml")[0]["groups"];
    assert_eq!(&yaml_of(&rule, "prometheusrule.yaml")[0]["spec"]["groups"], alerts);
}

/// `2Gi`, `500Mi` in bytes.
fn quantity(q: &str) -> u64 {
    let units = [("Ki", 1u64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("Ti", 1 << 40)];
    let (n, unit) = units.iter().find_map(|(u, m)| Some((q.strip_suffix(u)?, *m))).unwrap_or((q, 1));
    n.parse::<u64>().unwrap_or_else(|_| panic!("a quantity: {q}")) * unit
}

fn selects(selector: &Value, labels: &Value) -> bool {
    selector.as_object().is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &labels[k] == v))
}

#[test]
fn every_base_runs_a_valid_server_probed_fenced_and_sized_as_documented() {
    let (_, read_env) = serve_options();
    for base in BASES {
        let docs = yaml_of(&render(&repo(&format!("deploy/kubernetes/{base}"))), base);
        let of_kind = |kind: &'static str| docs.iter().filter(move |d| d["kind"] == kind);
        let mut checked = 0;
        for set in of_kind("StatefulSet").chain(of_kind("Deployment")) {
            let what = format!("{base}: {} {}", set["kind"], set["metadata"]["name"]);
            let pod = &set["spec"]["template"]["spec"];
            let pod_labels = &set["spec"]["template"]["metadata"]["labels"];
            let replicas = set["spec"]["replicas"].as_u64().unwrap_or(1);
            for c in pod["containers"].as_array().unwrap() {
                if !c["image"].as_str().unwrap().starts_with("hourglass:") {
                    continue;
                }
                let what = format!("{what}, container {}", c["name"]);
                let mut env: BTreeMap<String, String> = BTreeMap::new();
                for source in c["envFrom"].as_array().into_iter().flatten() {
                    let name = &source["configMapRef"]["name"];
                    let map =
                        of_kind("ConfigMap").find(|m| &m["metadata"]["name"] == name).expect("its ConfigMap");
                    for (k, v) in map["data"].as_object().unwrap() {
                        assert!(
                            read_env.contains(k),
                            "{what}: its ConfigMap sets {k}, which hourglass does not read"
                        );
                        env.insert(k.clone(), v.as_str().unwrap().to_owned());
                    }
                }
                // Kubernetes expands $(VAR) in args from the container's env.
                let fields = [("POD_NAME", "orders-0"), ("POD_NAMESPACE", "default"), ("POD_IP", "10.1.2.3")];
                let args: Vec<String> = strings(&c["args"])
                    .into_iter()
                    .map(|a| fields.iter().fold(a, |a, (k, v)| a.replace(&format!("$({k})"), v)))
                    .collect();
                for var in c["env"].as_array().into_iter().flatten() {
                    let name = var["name"].as_str().unwrap();
                    let expanded = strings(&c["args"]).iter().any(|a| a.contains(&format!("$({name})")));
                    assert!(
                        read_env.contains(name) || expanded,
                        "{what} sets {name}, which hourglass does not read"
                    );
                }
                let vars: Vec<(String, String)> = env.clone().into_iter().collect();
                let config = parse_serve_with(&args, &vars, &what);
                assert_not_open(&config, &what);

                if config.cluster {
                    let addr =
                        config.advertise_addr.as_deref().expect("a node says where its peers reach it");
                    match set["spec"]["serviceName"].as_str() {
                        // A StatefulSet's pods have names under its headless
                        // Service.
                        Some(service) => {
                            assert!(
                                addr.contains(&format!("orders-0.{service}.default.svc")),
                                "{what}: a pod is reached at its own name under the headless Service: {addr}"
                            );
                            let peers = of_kind("Service")
                                .find(|d| d["metadata"]["name"] == service)
                                .expect("the StatefulSet's Service");
                            assert_eq!(peers["spec"]["clusterIP"], "None", "{what}: peers find pods by name");
                            assert_eq!(
                                peers["spec"]["publishNotReadyAddresses"], true,
                                "{what}: a pod is reached as soon as it owns shards"
                            );
                        }
                        // A Deployment's have none (a subdomain without a
                        // hostname makes no record per pod): their IPs.
                        None => {
                            assert!(
                                addr.contains("10.1.2.3"),
                                "{what}: a pod is reached at its own IP: {addr}"
                            );
                            let ip = c["env"].as_array().unwrap().iter().find(|v| v["name"] == "POD_IP");
                            assert_eq!(ip.unwrap()["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
                        }
                    }
                }

                // The tokens file from a Secret mounted as a directory: the
                // kubelet updates it in place, and hourglass reads it again.
                let mounts = c["volumeMounts"].as_array().unwrap();
                let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
                let tokens = flag(&args, "--auth-tokens").expect("--auth-tokens");
                let tokens_mount = mounts
                    .iter()
                    .find(|m| Path::new(tokens).starts_with(m["mountPath"].as_str().unwrap()))
                    .unwrap_or_else(|| panic!("{what}: the tokens file is mounted"));
                assert!(tokens_mount["subPath"].is_null(), "{what}: a subPath mount is never updated");
                assert!(
                    volumes.iter().any(|v| v["name"] == tokens_mount["name"] && v["secret"].is_object()),
                    "{what}: the tokens file comes from a Secret"
                );

                // Probes run `hourglass health` against the port it serves on.
                let grpc_port = port_of(flag(&args, "--listen").expect("--listen"));
                // Beside an application, readiness asks for liveness: a
                // sidecar at its cap would take the application's pods out
                // of its Service.
                let sidecar = pod["containers"].as_array().unwrap().len() > 1;
                let ready = if sidecar { "liveness" } else { "" };
                for (probe, service) in
                    [("readinessProbe", ready), ("livenessProbe", "liveness"), ("startupProbe", "liveness")]
                {
                    let command = strings(&c[probe]["exec"]["command"]);
                    assert_eq!(
                        &command[..2],
                        ["hourglass", "health"],
                        "{what}: {probe} runs hourglass health"
                    );
                    assert_eq!(
                        flag(&command, "--service").unwrap_or(""),
                        service,
                        "{what}: {probe} asks for {service:?}"
                    );
                    let server = flag(&command, "--server")
                        .map(str::to_owned)
                        .or_else(|| env.get("HOURGLASS_SERVER").cloned())
                        .unwrap_or_else(|| "127.0.0.1:50051".to_owned());
                    assert_eq!(port_of(&server), grpc_port, "{what}: {probe} asks the port it listens on");
                    let timeout = c[probe]["timeoutSeconds"].as_u64().unwrap_or(1);
                    let asks = flag(&command, "--timeout").expect("--timeout");
                    assert!(
                        humantime::parse_duration(asks).unwrap() < Duration::from_secs(timeout),
                        "{what}: {probe} gives up before the kubelet does"
                    );
                }
                let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
                    .args(&strings(&c["readinessProbe"]["exec"]["command"])[1..])
                    .arg("--help")
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{what}: the probe's command parses");

                // The store: on a volume claim, or a copy of the log.
                let data = mounts
                    .iter()
                    .find(|m| Path::new(m["mountPath"].as_str().unwrap()) == config.data_dir)
                    .unwrap_or_else(|| panic!("{what}: the store is on a mounted volume"));
                let claim = set["spec"]["volumeClaimTemplates"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|v| v["metadata"]["name"] == data["name"]);
                let size = match claim {
                    Some(claim) => {
                        quantity(claim["spec"]["resources"]["requests"]["storage"].as_str().unwrap())
                    }
                    None => {
                        assert!(
                            config.cluster,
                            "{what}: a standalone store outlives the pod on a volume claim"
                        );
                        let volume = volumes.iter().find(|v| v["name"] == data["name"]).unwrap();
                        quantity(volume["emptyDir"]["sizeLimit"].as_str().expect("a size limit"))
                    }
                };
                // A pod holds its share of the owned copies, and as many
                // standby copies.
                let copies = if config.cluster { u64::from(1 + config.standby_replicas) } else { 1 };
                let cap = config.max_pending;
                assert!(cap > 0, "{what}: a backlog cap, so that a full disk is not how one learns of it");
                let pending = cap * copies / replicas * BYTES_PER_PENDING;
                assert!(
                    pending <= size / 2,
                    "{what}: the backlog cap ({cap}, {pending} bytes a pod) takes more than half the volume ({size})"
                );
                assert!(
                    *config.retention <= Duration::from_secs(2 * 86_400),
                    "{what}: deliveries kept for {:?} (sized for at most two days)",
                    *config.retention
                );
                let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
                assert!(Duration::from_secs(grace) > *config.shutdown_grace, "{what}: grace period");

                // Fenced: only the ports it names, from whom it names.
                let policy = of_kind("NetworkPolicy")
                    .find(|p| selects(&p["spec"]["podSelector"]["matchLabels"], pod_labels))
                    .unwrap_or_else(|| panic!("{what}: a NetworkPolicy"));
                let ports = c["ports"].as_array().unwrap();
                let grpc_name =
                    ports.iter().find(|p| p["containerPort"] == grpc_port).unwrap()["name"].clone();
                let allowed: Vec<&Value> = policy["spec"]["ingress"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|rule| rule["ports"].as_array().unwrap().iter().map(|p| &p["port"]))
                    .collect();
                assert!(allowed.contains(&&grpc_name), "{what}: the policy lets the gRPC port be reached");
                assert!(allowed.contains(&&Value::from("metrics")), "{what}: and the metrics port");
                checked += 1;
            }
            if replicas > 1 {
                let budget = of_kind("PodDisruptionBudget")
                    .find(|b| selects(&b["spec"]["selector"]["matchLabels"], pod_labels))
                    .unwrap_or_else(|| panic!("{what}: a PodDisruptionBudget"));
                assert_eq!(budget["spec"]["maxUnavailable"], 1, "{what}: one pod down at a time");
                assert!(pod["topologySpreadConstraints"].is_array(), "{what}: spread over hosts");
            }
            if set["kind"] == "StatefulSet" {
                let clients = of_kind("Service").find(|s| {
                    s["spec"]["clusterIP"] != "None"
                        && selects(&s["spec"]["selector"], pod_labels)
                        && s["spec"]["ports"].as_array().unwrap().iter().any(|p| p["name"] == "grpc")
                });
                assert!(clients.is_some(), "{what}: a ClusterIP Service for clients, of ready pods");
            }
        }
        assert_eq!(checked, 1, "{base} runs one hourglass per pod");
    }
}
