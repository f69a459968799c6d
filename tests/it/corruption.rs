//! A damaged store. The real binary is killed with SIGKILL after its writes
//! were acknowledged, then its files are damaged on disk:
//!
//! - a torn record at the tail of the newest WAL (a write cut short by the
//!   crash, never acknowledged): start-up drops it and every acknowledged
//!   message is still there and is delivered;
//! - damage in the middle of the WAL, with valid records after it, and
//!   damage inside a table (SST) file: start-up stops with a clear error
//!   and a non-zero exit instead of serving without the records, and the
//!   files are left as they were;
//! - the store's writer thread panics (a fail point): the server stops
//!   with a non-zero exit and says why, rather than stay up refusing
//!   every change, and a restart delivers every acknowledged message once.

use crate::common;

use std::{
    collections::HashSet,
    io::Read as _,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use common::*;
use hourglass::proto::{self, State};

/// Starts hourglass on a damaged store and expects it to refuse: a
/// non-zero exit within 60 s. Returns what it printed. (Its port accepts
/// connections before the store is open, so that says nothing.)
fn refused_start(broker: &Broker, data_dir: &Path) -> String {
    let (mut child, _grpc) = spawn_serve(broker, data_dir, Stdio::piped());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("hourglass still running on a damaged store after 60 s instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    eprintln!("corruption: start-up refused with {status}:\n{err}");
    assert!(!status.success(), "a refused start exits non-zero");
    err
}

/// The start-up error names the store, says it is corrupt, that hourglass
/// will not start rather than drop records, and what to do.
fn assert_clear_refusal(err: &str, data_dir: &Path) {
    assert!(err.contains(&data_dir.display().to_string()), "names the store: {err}");
    assert!(err.contains("corrupt"), "says it is corrupt: {err}");
    assert!(err.contains("will not run on a damaged store"), "says it will not run on it: {err}");
    assert!(err.contains("backup"), "says what to do: {err}");
}

/// Files in `dir` ending in `ext`, oldest name first.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    out.sort();
    out
}

/// Schedules `n` messages due after `delay`, each acknowledged; returns
/// their ids. Values are `prefix-0000`, `prefix-0001`, ...
async fn schedule(server: &Serve, topic: &str, prefix: &str, n: usize, delay: Duration) -> Vec<String> {
    let mut client = server.client().await;
    let mut ids = Vec::new();
    for i in 0..n {
        let r = request(topic, &format!("{prefix}-{i:04}"), delay);
        ids.push(client.schedule(r).await.unwrap().into_inner().id);
    }
    ids
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn scale() -> usize {
    if reliability_full() { 5_000 } else { 200 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_wal_tail_is_dropped_and_every_acknowledged_message_survives() {
    let n = scale();
    let broker = Broker::start();
    let topic = random_name("torn");
    broker.create_topic(&topic, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start(&broker, dir.path());
    let ids = schedule(&server, &topic, "torn", n, Duration::from_secs(5)).await;
    server.kill9();

    // A write cut short: a record header promising 500 bytes, and 100 of them.
    let wal = files(dir.path(), "log").pop().expect("a WAL file");
    let len = std::fs::metadata(&wal).unwrap().len();
    let mut torn = vec![0x5a, 0x17, 0xc3, 0x9e, 0xf4, 0x01, 1];
    torn.extend(std::iter::repeat_n(0xab, 100));
    let mut bytes = std::fs::read(&wal).unwrap();
    bytes.extend(&torn);
    std::fs::write(&wal, &bytes).unwrap();
    eprintln!("corruption: appended a torn record to {} ({len} bytes)", wal.display());

    let server = Serve::start(&broker, dir.path());
    let mut client = server.client().await;
    for id in &ids {
        let got = client
            .get(proto::GetRequest { id: id.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_ne!(got.state(), State::Unspecified, "{id} lost");
    }
    let got = consume_async(&broker, &topic, n, Duration::from_secs(60), Duration::from_secs(1)).await;
    let seen: HashSet<&str> = got.iter().map(Received::id).collect();
    assert_eq!(got.len(), n, "each delivered once");
    assert_eq!(seen, ids.iter().map(String::as_str).collect(), "every acknowledged message delivered");
    eprintln!("corruption: torn tail: {n} acknowledged, {} delivered after restart", got.len());
    assert!(server.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_in_the_middle_of_the_wal_stops_start_up_with_a_clear_error() {
    let n = scale();
    let broker = Broker::start();
    let topic = random_name("walmid");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start(&broker, dir.path());
    schedule(&server, &topic, "walmid", n, Duration::from_secs(3600)).await;
    server.kill9();

    // Damage a record in the middle: every later record is intact.
    let wal = files(dir.path(), "log").pop().expect("a WAL file");
    let mut bytes = std::fs::read(&wal).unwrap();
    let at = find(&bytes, format!("walmid-{:04}", n / 2).as_bytes()).expect("the record in the WAL");
    bytes[at..at + 6].copy_from_slice(b"XXXXXX");
    std::fs::write(&wal, &bytes).unwrap();
    eprintln!("corruption: damaged {} at byte {at} of {}", wal.display(), bytes.len());

    let err = refused_start(&broker, dir.path());
    assert_clear_refusal(&err, dir.path());
    assert_eq!(std::fs::read(&wal).unwrap(), bytes, "the damaged WAL is left as it was");
    let got = consume_async(&broker, &topic, 1, Duration::from_secs(2), Duration::ZERO).await;
    assert!(got.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_table_file_stops_start_up_with_a_clear_error() {
    let n = scale();
    let broker = Broker::start();
    let topic = random_name("sst");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start(&broker, dir.path());
    schedule(&server, &topic, "sst", n, Duration::from_secs(3600)).await;
    assert!(server.terminate().success());

    // Move everything into table files, as a long-running store has it.
    {
        let names = ["due", "messages", "checkpoint"];
        let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir.path(), names).unwrap();
        for name in names {
            db.flush_cf(db.cf_handle(name).unwrap()).unwrap();
        }
    }
    let ssts = files(dir.path(), "sst");
    let (sst, at) = ssts
        .iter()
        .find_map(|f| {
            find(&std::fs::read(f).unwrap(), format!("sst-{:04}", n / 2).as_bytes()).map(|at| (f, at))
        })
        .expect("a table file holding the messages");
    let mut bytes = std::fs::read(sst).unwrap();
    bytes[at..at + 6].copy_from_slice(b"XXXXXX");
    std::fs::write(sst, &bytes).unwrap();
    eprintln!("corruption: damaged {} at byte {at} of {}", sst.display(), bytes.len());

    let err = refused_start(&broker, dir.path());
    assert_clear_refusal(&err, dir.path());
    assert_eq!(std::fs::read(sst).unwrap(), bytes, "the damaged table file is left as it was");
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_panics_stops_the_server_and_loses_nothing_acknowledged() {
    let broker = Broker::start();
    let topic = random_name("writer-panic");
    broker.create_topic(&topic, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let panics = [("HOURGLASS_FAILPOINT", "store-writer-panics@20")];
    let (mut child, grpc, metrics) = spawn_serve_with(&broker, dir.path(), Stdio::piped(), &[], &panics);
    // Read as it is written, so that a full pipe never holds the server up.
    let mut stderr = child.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut err = String::new();
        stderr.read_to_string(&mut err).unwrap();
        err
    });
    let mut server = Serve::once_listening(child, grpc, metrics);
    let mut client = server.client().await;
    let mut acknowledged = Vec::new();
    for i in 0..200 {
        match client.schedule(request(&topic, &format!("panic-{i:04}"), Duration::from_secs(3))).await {
            Ok(answer) => acknowledged.push(answer.into_inner().id),
            Err(status) => {
                eprintln!("corruption: schedule {i} refused once the writer stopped: {status:?}");
                break;
            }
        }
    }
    assert!(
        !acknowledged.is_empty() && acknowledged.len() < 200,
        "the writer stopped after some of the schedules: {} acknowledged",
        acknowledged.len()
    );
    let status =
        server.exited(Duration::from_secs(60)).expect("the server stops once its store's writer has");
    assert!(!status.success(), "it stops with a non-zero exit: {status}");
    let err = said.join().unwrap();
    eprintln!("corruption: the writer panicked; the server stopped with {status}:\n{err}");
    assert!(
        err.contains("writer of the store in") && err.contains("restart"),
        "says what stopped and what to do: {err}"
    );
    drop(server);

    let server = Serve::start(&broker, dir.path());
    let got =
        consume_async(&broker, &topic, acknowledged.len(), Duration::from_secs(60), Duration::from_secs(2))
            .await;
    let seen: HashSet<&str> = got.iter().map(Received::id).collect();
    assert_eq!(got.len(), seen.len(), "each delivered once");
    assert_eq!(
        seen,
        acknowledged.iter().map(String::as_str).collect(),
        "every acknowledged message delivered"
    );
    eprintln!(
        "corruption: writer panic: {} acknowledged, {} delivered after restart",
        acknowledged.len(),
        got.len()
    );
    assert!(server.terminate().success());
}
