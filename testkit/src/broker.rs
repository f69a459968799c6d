//! A local Kafka-protocol broker (Tansu) on a free loopback port, for the
//! bench and the tests when no broker is given. Tansu is a test tool here;
//! hourglass itself targets Apache Kafka.

use std::{
    collections::BTreeSet,
    net::{TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use rdkafka::{
    ClientConfig,
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
};

/// The Tansu binary: `$HOURGLASS_TANSU`, else `tansu` on the PATH.
fn tansu() -> String {
    std::env::var("HOURGLASS_TANSU").unwrap_or_else(|_| "tansu".into())
}

/// A free port on 127.0.0.1, never one this process handed out before.
pub fn free_port() -> std::io::Result<u16> {
    free_ports::<1>().map(|[port]| port)
}

/// Two free ports that differ; see [`free_ports`].
pub fn free_port_pair() -> std::io::Result<(u16, u16)> {
    free_ports::<2>().map(|[first, second]| (first, second))
}

/// `N` free ports on 127.0.0.1, none of them handed out by this process
/// before. Tests of one binary run at once, each starting servers and
/// brokers: a port chosen by binding and then released can be handed out
/// again at once, and two servers told to listen on it find each other
/// (one fails to bind while its test talks to the other). Every port
/// chosen is held while the others are, and remembered.
pub fn free_ports<const N: usize>() -> std::io::Result<[u16; N]> {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let (mut held, mut ports) = (Vec::new(), Vec::with_capacity(N));
    while ports.len() < N {
        if held.len() > 10_000 {
            return Err(std::io::Error::other("no free port left that this process has not used"));
        }
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        if handed_out.insert(port) {
            ports.push(port);
        }
        held.push(listener);
    }
    Ok(ports.try_into().expect("N ports"))
}

/// A Tansu broker process; stopped when dropped.
pub struct LocalBroker {
    child: Option<Child>,
    pub addr: String,
    storage: String,
    _dir: Option<tempfile::TempDir>,
}

impl LocalBroker {
    /// A broker that keeps its data in memory.
    pub fn start() -> anyhow::Result<LocalBroker> {
        Self::start_with("memory://tansu/".into(), None)
    }

    /// A broker that keeps its data (SQLite) across its own restarts.
    pub fn start_persistent() -> anyhow::Result<LocalBroker> {
        let dir = tempfile::tempdir()?;
        // sqlite:// then an absolute path: four slashes in all.
        let storage = format!("sqlite:///{}", dir.path().join("tansu.db").display());
        Self::start_with(storage, Some(dir))
    }

    fn start_with(storage: String, dir: Option<tempfile::TempDir>) -> anyhow::Result<LocalBroker> {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let mut broker = LocalBroker { child: None, addr, storage, _dir: dir };
        broker.resume()?;
        Ok(broker)
    }

    /// Starts the broker process (again) on the same port and storage.
    pub fn resume(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("the broker is already running");
        }
        let url = format!("tcp://{}", self.addr);
        let tansu = tansu();
        let child = Command::new(&tansu)
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", &self.storage])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "cannot run {tansu:?}, the local test broker; install it with \
                     `bash deploy/local/install-deps.sh`, or give a broker with --brokers"
                )
            })?;
        self.child = Some(child);
        wait_for_port(&self.addr, Duration::from_secs(30))
    }

    /// The broker process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the broker process was started and not stopped since.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the broker process; `resume` starts it again.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for LocalBroker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether something listens on `addr`. A connect to a port nothing
/// listens on can still succeed: when the kernel picks that same port as
/// the connection's own, it connects to itself (TCP simultaneous open), so
/// such a connection does not count.
pub fn listening(addr: &str) -> bool {
    TcpStream::connect(addr)
        .is_ok_and(|s| !matches!((s.local_addr(), s.peer_addr()), (Ok(l), Ok(p)) if l == p))
}

fn wait_for_port(addr: &str, within: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    while !listening(addr) {
        if started.elapsed() > within {
            bail!("nothing listens on {addr} after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn admin(brokers: &str) -> anyhow::Result<AdminClient<DefaultClientContext>> {
    Ok(ClientConfig::new().set("bootstrap.servers", brokers).create()?)
}

/// Creates `name` and returns once the broker's metadata lists all its
/// partitions: a client that asks right after (hourglass checking a topic
/// exists) finds it.
pub async fn create_topic(brokers: &str, name: &str, partitions: i32) -> anyhow::Result<()> {
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let admin = admin(brokers)?;
    for r in admin.create_topics([&topic], &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
    }
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let listed = admin.inner().fetch_metadata(Some(name), Duration::from_secs(5)).ok().is_some_and(|m| {
            m.topics().iter().any(|t| {
                t.name() == name && t.error().is_none() && t.partitions().len() == partitions as usize
            })
        });
        if listed {
            return Ok(());
        }
        if Instant::now() > give_up {
            bail!("topic {name} was created but the broker's metadata does not list it after 10 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn delete_topic(brokers: &str, name: &str) -> anyhow::Result<()> {
    for r in admin(brokers)?.delete_topics(&[name], &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("deleting topic {t}: {e}"))?;
    }
    Ok(())
}
