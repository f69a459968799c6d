//! `hourglass serve` as a child process: the real binary, on free ports,
//! for tests that kill it, stop it or read what it prints.

use std::{
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use hourglass::proto::scheduler_client::SchedulerClient;

use super::Broker;

pub const BIN: &str = env!("CARGO_BIN_EXE_hourglass");

/// Starts `hourglass serve` over `data_dir` against `broker`; returns the
/// child and its gRPC address. `stderr` says where its log goes.
pub fn spawn_serve(broker: &Broker, data_dir: &Path, stderr: Stdio) -> (Child, String) {
    let (child, grpc, _) = spawn_serve_with(broker, data_dir, stderr, &[], &[]);
    (child, grpc)
}

/// As [`spawn_serve`], with more flags; also returns the metrics address.
pub fn spawn_serve_with(
    broker: &Broker,
    data_dir: &Path,
    stderr: Stdio,
    flags: &[&str],
    env: &[(&str, &str)],
) -> (Child, String, String) {
    let (grpc, metrics) = hourglass_testkit::free_port_pair().unwrap();
    let (grpc, metrics) = (format!("127.0.0.1:{grpc}"), format!("127.0.0.1:{metrics}"));
    let child = Command::new(BIN)
        .args(["serve", "--listen", &grpc, "--metrics-listen", &metrics])
        .args(["--kafka-brokers", broker.addr()])
        .args(flags)
        .arg("--data-dir")
        .arg(data_dir)
        .env("HOURGLASS_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    (child, grpc, metrics)
}

pub struct Serve {
    pub child: Child,
    pub grpc: String,
    pub metrics: String,
}

impl Serve {
    /// Starts the server and waits until its gRPC port accepts connections.
    pub fn start(broker: &Broker, data_dir: &Path) -> Serve {
        Serve::start_with(broker, data_dir, &[])
    }

    /// As [`Serve::start`], with more flags.
    pub fn start_with(broker: &Broker, data_dir: &Path, flags: &[&str]) -> Serve {
        Serve::start_env(broker, data_dir, flags, &[])
    }

    /// As [`Serve::start_with`], with more environment variables.
    pub fn start_env(broker: &Broker, data_dir: &Path, flags: &[&str], env: &[(&str, &str)]) -> Serve {
        let (child, grpc, metrics) = spawn_serve_with(broker, data_dir, Stdio::inherit(), flags, env);
        Serve::once_listening(child, grpc, metrics)
    }

    /// A server [`spawn_serve_with`] started, once its gRPC port accepts
    /// connections.
    pub fn once_listening(mut child: Child, grpc: String, metrics: String) -> Serve {
        let started = Instant::now();
        while !hourglass_testkit::listening(&grpc) {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("hourglass exited with {status} at start-up (see its log)");
            }
            assert!(started.elapsed() < Duration::from_secs(30), "hourglass did not start listening");
            std::thread::sleep(Duration::from_millis(50));
        }
        Serve { child, grpc, metrics }
    }

    /// A metric's value as the server reports it (0 if it has none).
    pub async fn metric(&self, name: &str) -> f64 {
        let body = super::http_get(self.metrics.parse().unwrap(), "/metrics").await;
        body.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    pub async fn client(&self) -> SchedulerClient<tonic::transport::Channel> {
        SchedulerClient::connect(self.url()).await.unwrap()
    }

    /// Waits up to `within` for the server to exit on its own (a fail
    /// point); its status.
    pub fn exited(&mut self, within: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < within {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// SIGKILL: a crash.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        self.child.wait().unwrap()
    }
}

impl Drop for Serve {
    /// A test that fails midway leaves no server behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
