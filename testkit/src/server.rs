//! hourglass under test: the real binary, started as its own process, so
//! its memory is its own and it restarts as it would in production.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::transport::Channel;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use hourglass::{proto::scheduler_client::SchedulerClient, store::Durability};

use crate::free_port_pair;

/// The `hourglass` binary to run: `$HOURGLASS_BIN` if set, else the one
/// beside the running executable (the bench, `target/*/hourglass-bench`) or
/// one directory up from it (a test, `target/*/deps/…`).
pub fn hourglass_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("HOURGLASS_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("locating the running executable")?;
    let dir = exe.parent().context("the running executable has no directory")?;
    for candidate in [dir.join("hourglass"), dir.join("../hourglass")] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "no hourglass binary beside {}: build it first (cargo build --release --workspace), or name it \
         with HOURGLASS_BIN",
        exe.display()
    )
}

/// A cluster key file for the nodes this process starts (each test
/// process, each bench run, its own cluster): 64 random hex digits, as
/// `openssl rand -hex 32` makes, in a directory that lasts as long as the
/// process.
pub fn cluster_key_file() -> anyhow::Result<PathBuf> {
    use std::hash::{BuildHasher as _, Hasher as _};
    static KEY: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let dir = match KEY.get() {
        Some(dir) => dir,
        None => {
            let dir = tempfile::tempdir().context("a directory for the cluster key")?;
            // Random per process: std seeds each RandomState from the OS.
            let key: String = (0..4)
                .map(|_| {
                    format!("{:016x}", std::collections::hash_map::RandomState::new().build_hasher().finish())
                })
                .collect();
            std::fs::write(dir.path().join("cluster.key"), key + "\n").context("writing the cluster key")?;
            KEY.get_or_init(|| dir)
        }
    };
    Ok(dir.path().join("cluster.key"))
}

pub struct ServerProcess {
    child: Option<Child>,
    pub grpc: String,
    pub metrics: String,
    data_dir: PathBuf,
    exe: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl ServerProcess {
    /// Starts [`hourglass_binary`] as `hourglass serve`.
    pub async fn start(
        data_dir: &Path,
        brokers: &str,
        durability: Durability,
    ) -> anyhow::Result<ServerProcess> {
        ServerProcess::new(&hourglass_binary()?, data_dir, brokers, durability)?.launch().await
    }

    /// `exe serve` on free ports over `data_dir`, not started yet; add flags
    /// with [`arg`](Self::arg) and environment with [`env`](Self::env).
    pub fn new(
        exe: &Path,
        data_dir: &Path,
        brokers: &str,
        durability: Durability,
    ) -> anyhow::Result<ServerProcess> {
        let durability = match durability {
            Durability::Sync => "sync",
            Durability::Buffered => "buffered",
            Durability::Replayed => {
                anyhow::bail!("--durability is sync or buffered; cluster mode sets its own")
            }
        };
        let log = std::env::var("HOURGLASS_BENCH_SERVER_LOG").unwrap_or_else(|_| "warn".into());
        let (grpc, metrics) = free_port_pair()?;
        Ok(ServerProcess {
            child: None,
            grpc: format!("127.0.0.1:{grpc}"),
            metrics: format!("127.0.0.1:{metrics}"),
            data_dir: data_dir.to_owned(),
            exe: exe.to_owned(),
            args: ["--kafka-brokers", brokers, "--durability", durability].map(str::to_owned).to_vec(),
            env: vec![("HOURGLASS_LOG".into(), log)],
        })
    }

    /// A node of cluster mode, with this process's [`cluster_key_file`].
    pub fn clustered(self) -> anyhow::Result<Self> {
        Ok(self.arg("--cluster", "true").arg("--cluster-key-file", cluster_key_file()?.display()))
    }

    pub fn arg(mut self, flag: &str, value: impl ToString) -> Self {
        self.args.push(flag.to_owned());
        self.args.push(value.to_string());
        self
    }

    /// Sets an environment variable for every later start.
    pub fn env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
    }

    /// Starts the process and waits until it serves.
    pub async fn launch(mut self) -> anyhow::Result<ServerProcess> {
        self.spawn()?;
        self.wait_serving(Duration::from_secs(120)).await?;
        Ok(self)
    }

    /// Starts the process, without waiting for it to serve. With
    /// `HOURGLASS_TEST_LOG_DIR` set, its stderr goes to `<port>.log` there
    /// (appended across restarts), so that the nodes of a cluster can be
    /// told apart.
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        let stderr = match std::env::var_os("HOURGLASS_TEST_LOG_DIR") {
            Some(dir) => {
                let port = self.grpc.rsplit(':').next().unwrap_or("node");
                let path = Path::new(&dir).join(format!("{port}.log"));
                let file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
                Stdio::from(file)
            }
            None => Stdio::inherit(),
        };
        let child = Command::new(&self.exe)
            .args(["serve", "--listen", &self.grpc, "--metrics-listen", &self.metrics])
            .args(&self.args)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("starting hourglass serve")?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits for the process to exit by itself (a crash at a fail point,
    /// say); None if it still runs after `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < within {
            let child = self.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// What gRPC health says of the whole server.
    pub async fn health(&self) -> anyhow::Result<ServingStatus> {
        let channel = Channel::from_shared(format!("http://{}", self.grpc))?.connect().await?;
        let reply = HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await?;
        Ok(reply.into_inner().status())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Waits until gRPC health says SERVING.
    pub async fn wait_serving(&mut self, within: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("hourglass serve exited during start-up: {status}");
            }
            if let Ok(channel) = Channel::from_shared(format!("http://{}", self.grpc))?.connect().await {
                let reply =
                    HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await;
                if reply.is_ok_and(|r| r.into_inner().status() == ServingStatus::Serving) {
                    return Ok(());
                }
            }
            if started.elapsed() > within {
                bail!("hourglass did not serve within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn client(&self) -> anyhow::Result<SchedulerClient<Channel>> {
        let channel = Channel::from_shared(format!("http://{}", self.grpc))?.connect().await?;
        Ok(SchedulerClient::new(channel)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20))
    }

    /// Resident memory of the server process, in bytes.
    pub fn rss_bytes(&self) -> Option<u64> {
        rss_of(self.pid()?)
    }

    /// One counter or gauge from the server's /metrics.
    /// The value of the series `name` (summed over its labels, for a name
    /// without: the shards of a per-shard series).
    pub async fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let body = self.metrics_text().await?;
        series_value(&body, name).with_context(|| format!("{name} missing from /metrics"))
    }

    /// `name`'s value, or 0 while the server shows none (a labelled series
    /// appears with its first observation).
    pub async fn metric_or_zero(&self, name: impl AsRef<str>) -> anyhow::Result<f64> {
        Ok(series_value(&self.metrics_text().await?, name.as_ref()).unwrap_or(0.0))
    }

    /// The server's /metrics, whole (with the HTTP response's head).
    pub async fn metrics_text(&self) -> anyhow::Result<String> {
        let mut s = tokio::net::TcpStream::connect(&self.metrics).await?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await?;
        let mut body = String::new();
        s.read_to_string(&mut body).await?;
        Ok(body)
    }

    /// Waits until `name` reaches `target`, polling every 5 ms (rendering
    /// /metrics costs the server CPU); returns when it first read so.
    pub async fn wait_metric(&self, name: &str, target: f64, within: Duration) -> anyhow::Result<Instant> {
        let started = Instant::now();
        loop {
            if self.metric(name).await? >= target {
                return Ok(Instant::now());
            }
            if started.elapsed() > within {
                bail!("{name} did not reach {target} within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status().context("sending SIGTERM")?;
        let status = child.wait()?;
        if !status.success() {
            bail!("hourglass exited with {status} on SIGTERM");
        }
        Ok(())
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Resident memory of process `pid`, in bytes.
pub fn rss_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The value of `name` in a Prometheus text exposition; a name without
/// labels sums every labelled series of that name.
pub fn series_value(body: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = body
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            *series == name
                || (!name.contains('{') && series.strip_prefix(name).is_some_and(|l| l.starts_with('{')))
        })
        .filter_map(|(_, v)| v.trim().parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// CPU time process `pid` has used so far (user and system), in seconds.
pub fn cpu_seconds_of(pid: u32) -> Option<f64> {
    cpu_of_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU seconds (user and system) in a `/proc` `stat` line.
fn cpu_of_stat(stat: &str) -> Option<f64> {
    // Fields after the command's closing parenthesis: utime is the 12th
    // of them, stime the 13th.
    let mut fields = stat[stat.rfind(')')? + 2..].split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf only reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) as f64 / ticks as f64)
}

/// What one thread of a process has used so far.
#[derive(Clone, Debug)]
pub struct ThreadUse {
    /// Its id.
    pub id: u32,
    /// Its name (Linux keeps the first 15 bytes).
    pub name: String,
    /// CPU seconds, user and system.
    pub cpu: f64,
    /// Times it was switched off a core, by choice (it waited) or not.
    pub switches: u64,
}

/// Every live thread of process `pid` and what it has used so far (a
/// thread that ended is not among them; the process's own total in
/// [`cpu_seconds_of`] still counts it).
pub fn threads_of(pid: u32) -> Vec<ThreadUse> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|task| {
            let dir = task.ok()?.path();
            let id = dir.file_name()?.to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            let name = stat.get(stat.find('(')? + 1..stat.rfind(')')?)?.to_owned();
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            let switches = status
                .lines()
                .filter(|l| {
                    l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary_ctxt_switches")
                })
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum();
            Some(ThreadUse { id, name, cpu: cpu_of_stat(&stat)?, switches })
        })
        .collect()
}
