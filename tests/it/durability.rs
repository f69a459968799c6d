//! The durability oracle: every acknowledged change was synced to the
//! write-ahead log before its answer left, with `--durability sync`.
//!
//! A process crash keeps the page cache, so the crash tests pass whether or
//! not hourglass waits for fsync; this test does not. `hourglass serve` runs
//! with a probe preloaded (`tests/durability/sync_probe.c`, built here with
//! the system's C compiler) that counts the syncs of RocksDB's WAL files,
//! each after a short pause. The test reads the count before each call and
//! after its answer: an acknowledgement that did not wait for its sync
//! arrives before the count moves. The same run against `--durability
//! buffered` must be caught, or the oracle proves nothing.
//!
//! `HOURGLASS_RELIABILITY_FULL=1` checks more calls.

use crate::common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use common::*;
use hourglass::{proto, store::Durability};
use hourglass_testkit::ServerProcess;

const BIN: &str = env!("CARGO_BIN_EXE_hourglass");

/// Builds the probe into `dir`.
fn build_probe(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/durability/sync_probe.c");
    let out = dir.join("sync_probe.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&out)
        .arg(&source)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("running {cc} ({e}); install a C compiler (build-essential)"));
    assert!(status.success(), "building the sync probe failed");
    out
}

struct Probe {
    counter: PathBuf,
}

impl Probe {
    fn syncs(&self) -> u64 {
        let bytes = std::fs::read(&self.counter).unwrap();
        u64::from_ne_bytes(bytes[..8].try_into().unwrap())
    }
}

/// Calls that change the store, each checked against the probe: how many
/// were answered before a WAL sync completed, of how many.
async fn unsynced_answers(durability: Durability, calls: usize) -> (usize, usize) {
    let broker = Broker::start();
    let topic = random_name("durable");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let library = build_probe(dir.path());
    let probe = Probe { counter: dir.path().join("syncs") };
    std::fs::write(&probe.counter, [0u8; 8]).unwrap();
    let mut server = ServerProcess::new(Path::new(BIN), &dir.path().join("data"), broker.addr(), durability)
        .unwrap()
        // Nothing comes due, so no delivery commits in between.
        .arg("--verify-on-start", "false");
    server.env("LD_PRELOAD", library.to_str().unwrap());
    server.env("HOURGLASS_SYNC_PROBE", probe.counter.to_str().unwrap());
    let server = server.launch().await.unwrap();
    let mut client = server.client().await.unwrap();
    let far = Duration::from_secs(3600);
    let mut unsynced = 0;
    for i in 0..calls {
        let before = probe.syncs();
        let id = format!("m{i}");
        match i % 4 {
            0 => {
                let mut r = request(&topic, "v", far);
                r.id = Some(id);
                client.schedule(r).await.unwrap();
            }
            1 => {
                let requests = (0..10)
                    .map(|j| {
                        let mut r = request(&topic, "v", far);
                        r.id = Some(format!("{id}-{j}"));
                        r
                    })
                    .collect();
                client.schedule_batch(proto::ScheduleBatchRequest { requests }).await.unwrap();
            }
            2 => {
                let due = Some(proto::reschedule_request::Due::Delay(prost_types::Duration {
                    seconds: 7200,
                    nanos: 0,
                }));
                client
                    .reschedule(proto::RescheduleRequest {
                        id: format!("m{}", i - 2),
                        due,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
            }
            _ => {
                let outcome = client
                    .cancel(proto::CancelRequest { id: format!("m{}", i - 3), ..Default::default() })
                    .await
                    .unwrap();
                assert_eq!(outcome.into_inner().outcome(), proto::CancelOutcome::Cancelled);
            }
        }
        if probe.syncs() == before {
            unsynced += 1;
        }
    }
    drop(server);
    (unsynced, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_change_is_synced_before_its_answer() {
    let calls = if reliability_full() { 400 } else { 60 };
    let (unsynced, total) = unsynced_answers(Durability::Sync, calls).await;
    eprintln!("durability sync: {unsynced} of {total} acknowledgements left before their WAL sync");
    assert_eq!(unsynced, 0, "{unsynced} of {total} acknowledgements did not wait for the sync");

    // The oracle has teeth: with buffered durability it catches them.
    let (unsynced, total) = unsynced_answers(Durability::Buffered, 20).await;
    eprintln!("durability buffered: {unsynced} of {total} acknowledgements left before a WAL sync");
    assert!(unsynced >= total / 2, "the probe failed to see acknowledgements without a sync");
}
