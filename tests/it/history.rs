//! The history checker: Jepsen's and Elle's idea, on hourglass's verbs.
//!
//! Clients issue random Schedule, Cancel, Reschedule and Get calls on a
//! pool of ids (each id has one client, so its calls are sequential) while a
//! nemesis kills the server with SIGKILL and restarts it, and stops the
//! broker and starts it again. Every call is recorded with when it was
//! invoked, when it completed and what it answered. Afterwards a real Kafka
//! consumer reads the topic, a final Get asks for every id, and the model
//! checks the whole history against it:
//!
//! - a message answered CANCELLED is never on the topic;
//! - no copy is produced before the due time of the last answer that moved
//!   it (Schedule or Reschedule, whichever committed last);
//! - a Reschedule answered OK never follows a copy already on the topic;
//! - every acknowledged message ends delivered or cancelled, as the final
//!   Get says; delivered ones are on the topic, at the partition and offset
//!   Get gives; nothing is lost;
//! - NOT_FOUND never answers for an id acknowledged before the call;
//! - a Get that says DELIVERED names a record that is there, one that says
//!   CANCELLED has none;
//! - duplicates only in the window a kill explains (the first copy before
//!   a kill, another after it), counted.
//!
//! CI runs it for a short while; `HOURGLASS_RELIABILITY_FULL=1` runs it for
//! two minutes with more clients and faults. Figures: docs/RELIABILITY.md.

use crate::common;

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::{verify::collect_async, *};
use hourglass::{
    proto::{self, CancelOutcome, State, get_response::Settlement, scheduler_client::SchedulerClient},
    store::Durability,
};
use hourglass_testkit::ServerProcess;
use rand::Rng as _;
use tonic::{Code, transport::Channel};

const BIN: &str = env!("CARGO_BIN_EXE_hourglass");

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// One call and its answer.
#[derive(Clone, Debug)]
struct Op {
    invoked: i64,
    completed: i64,
    call: Call,
    answer: Answer,
}

#[derive(Clone, Debug)]
enum Call {
    Schedule { due: i64 },
    Cancel,
    Reschedule { due: i64 },
    Get,
}

#[derive(Clone, Debug)]
enum Answer {
    Scheduled {
        due: i64,
    },
    Cancel(CancelOutcome),
    Rescheduled {
        due: i64,
    },
    Got {
        state: State,
        delivered: Option<(i32, i64)>,
    },
    /// The call failed with this code: it may or may not have taken effect
    /// when the code says the server may have done the work (a crash, a
    /// deadline).
    Failed(Code),
}

/// Every call made, by id.
#[derive(Default)]
struct History {
    ops: Mutex<BTreeMap<String, Vec<Op>>>,
    /// When the nemesis killed the server.
    kills: Mutex<Vec<i64>>,
}

impl History {
    fn record(&self, id: &str, op: Op) {
        self.ops.lock().unwrap().entry(id.to_owned()).or_default().push(op);
    }
}

fn client(grpc: &str) -> SchedulerClient<Channel> {
    reconnecting_client(grpc, Duration::from_secs(5))
}

fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: ms.div_euclid(1000), nanos: (ms.rem_euclid(1000) * 1_000_000) as i32 }
}

/// One client: `live` ids of its own at a time, random calls on them until
/// `until`; an id whose message the answers show settled is retired and a
/// new one takes its place, so that each lives one life.
async fn run_client(
    grpc: String,
    topic: String,
    name: String,
    live: usize,
    history: Arc<History>,
    until: Instant,
) {
    let mut client = client(&grpc);
    let mut next = live;
    let mut ids: Vec<String> = (0..live).map(|i| format!("{name}-{i}")).collect();
    // The due time each id was first scheduled with: a retry sends the same
    // request, so that it is recognised as one.
    let mut first_due: HashMap<String, i64> = HashMap::new();
    let mut acknowledged: HashMap<String, bool> = HashMap::new();
    while Instant::now() < until {
        let slot = rand::rng().random_range(0..ids.len());
        let id = ids[slot].clone();
        let roll = rand::rng().random_range(0..100);
        let invoked = now_ms();
        let (call, answer) = if !acknowledged.get(&id).copied().unwrap_or(false) || roll < 10 {
            let due = *first_due
                .entry(id.clone())
                .or_insert_with(|| invoked + rand::rng().random_range(200..4_000));
            let request = proto::ScheduleRequest {
                message: Some(proto::Message {
                    topic: topic.clone(),
                    key: Some(id.as_bytes().to_vec()),
                    value: id.as_bytes().to_vec(),
                    headers: vec![],
                    partition: None,
                }),
                due: Some(proto::schedule_request::Due::DeliverAt(timestamp(due))),
                id: Some(id.clone()),
                on_conflict: 0,
                labels: Default::default(),
                max_lateness: None,
                dead_letter_topic: String::new(),
            };
            let answer = match client.schedule(request).await {
                Ok(r) => {
                    acknowledged.insert(id.clone(), true);
                    Answer::Scheduled { due: millis(&r.into_inner().deliver_at.unwrap()) }
                }
                Err(s) => Answer::Failed(s.code()),
            };
            (Call::Schedule { due }, answer)
        } else if roll < 20 {
            let answer =
                match client.cancel(proto::CancelRequest { id: id.clone(), ..Default::default() }).await {
                    Ok(r) => Answer::Cancel(r.into_inner().outcome()),
                    Err(s) => Answer::Failed(s.code()),
                };
            (Call::Cancel, answer)
        } else if roll < 45 {
            let due = invoked + rand::rng().random_range(0..3_000);
            let request = proto::RescheduleRequest {
                id: id.clone(),
                due: Some(proto::reschedule_request::Due::DeliverAt(timestamp(due))),
                ..Default::default()
            };
            let answer = match client.reschedule(request).await {
                Ok(r) => Answer::Rescheduled { due: millis(&r.into_inner().deliver_at.unwrap()) },
                Err(s) => Answer::Failed(s.code()),
            };
            (Call::Reschedule { due }, answer)
        } else {
            let answer = match client.get(proto::GetRequest { id: id.clone(), ..Default::default() }).await {
                Ok(r) => got(r.into_inner()),
                Err(s) => Answer::Failed(s.code()),
            };
            (Call::Get, answer)
        };
        let settled = matches!(
            answer,
            Answer::Cancel(_) | Answer::Got { state: State::Delivered | State::Cancelled, .. }
        ) && !matches!(answer, Answer::Cancel(CancelOutcome::NotFound));
        let failed = matches!(answer, Answer::Failed(_));
        history.record(&id, Op { invoked, completed: now_ms(), call, answer });
        if settled {
            ids[slot] = format!("{name}-{next}");
            next += 1;
        }
        let pause = if failed { 50 } else { 10 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

fn got(g: proto::GetResponse) -> Answer {
    let delivered = match &g.settlement {
        Some(Settlement::Delivered(d)) => Some((d.partition, d.offset)),
        _ => None,
    };
    Answer::Got { state: g.state(), delivered }
}

/// What went wrong, and what was counted.
#[derive(Debug, Default)]
struct Findings {
    violations: Vec<String>,
    acknowledged: usize,
    delivered: usize,
    cancelled: usize,
    duplicates: usize,
    /// Delivered, the broker not saying at which offset.
    offset_unknown: usize,
    calls: usize,
    failed_calls: usize,
}

/// Whether a delivery Get reported is on the topic: at its partition and
/// offset, or once on its partition when the broker did not say where (-1:
/// it took the record as one it already had).
fn names_a_copy(copies: &[(i32, i64, i64)], partition: i32, offset: i64) -> bool {
    match offset {
        -1 => copies.iter().filter(|c| c.0 == partition).count() == 1,
        _ => copies.iter().any(|c| (c.0, c.1) == (partition, offset)),
    }
}

/// Whether a failed call may have done its work anyway.
fn in_doubt(code: Code) -> bool {
    !matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::PermissionDenied
    )
}

/// Checks the history of one id against the records on the topic and the
/// final Get.
fn check(id: &str, ops: &[Op], copies: &[(i32, i64, i64)], last: &Answer, kills: &[i64], f: &mut Findings) {
    let mut violations = Vec::new();
    let mut fail = |what: String| violations.push(format!("{id}: {what}"));
    let acked_at =
        ops.iter().filter(|o| matches!(o.answer, Answer::Scheduled { .. })).map(|o| o.completed).min();
    // Moves that certainly happened: (invoked, completed, due).
    let moves: Vec<(i64, i64, i64)> = ops
        .iter()
        .filter_map(|o| match (&o.call, &o.answer) {
            (_, Answer::Scheduled { due }) | (_, Answer::Rescheduled { due }) => {
                Some((o.invoked, o.completed, *due))
            }
            _ => None,
        })
        .collect();
    // Moves that may have happened: failed calls that may have committed.
    let maybe_moves: Vec<(i64, i64)> = ops
        .iter()
        .filter_map(|o| match (&o.call, &o.answer) {
            (Call::Schedule { due } | Call::Reschedule { due }, Answer::Failed(code)) if in_doubt(*code) => {
                Some((o.invoked, *due))
            }
            _ => None,
        })
        .collect();
    let cancelled_answer = ops.iter().any(|o| matches!(o.answer, Answer::Cancel(CancelOutcome::Cancelled)));

    if cancelled_answer && !copies.is_empty() {
        fail(format!("answered CANCELLED, yet on the topic {} times", copies.len()));
    }
    for &(partition, offset, ts) in copies {
        // The due time in force when this copy was produced: the last move
        // that completed before it, or any that was under way or in doubt.
        let last_done = moves.iter().filter(|m| m.1 <= ts).max_by_key(|m| m.1).map(|m| m.2);
        let mut allowed: Vec<i64> = last_done.into_iter().collect();
        allowed.extend(moves.iter().filter(|m| m.0 <= ts && ts < m.1).map(|m| m.2));
        allowed.extend(maybe_moves.iter().filter(|m| m.0 <= ts).map(|m| m.1));
        match allowed.iter().min() {
            Some(&due) if ts < due => {
                fail(format!("copy at {partition}/{offset} produced {} ms before its due time", due - ts))
            }
            None => fail(format!("copy at {partition}/{offset} produced before any schedule was invoked")),
            _ => {}
        }
    }
    for o in ops {
        match (&o.call, &o.answer) {
            (Call::Reschedule { .. }, Answer::Rescheduled { .. }) => {
                if let Some(copy) = copies.iter().find(|c| c.2 < o.invoked) {
                    fail(format!(
                        "Reschedule answered OK at {} after a copy was produced at {}",
                        o.completed, copy.2
                    ));
                }
            }
            (Call::Cancel, Answer::Cancel(CancelOutcome::NotFound))
            | (Call::Get | Call::Reschedule { .. }, Answer::Failed(Code::NotFound))
                if acked_at.is_some_and(|at| at < o.invoked) =>
            {
                fail(format!("NOT_FOUND at {} for an id acknowledged at {acked_at:?}", o.invoked));
            }
            (Call::Cancel, Answer::Cancel(CancelOutcome::AlreadyDelivered)) if copies.is_empty() => {
                fail("ALREADY_DELIVERED, yet never on the topic".into());
            }
            (Call::Get, Answer::Got { state: State::Delivered, delivered: Some((p, off)), .. })
                if !names_a_copy(copies, *p, *off) =>
            {
                fail(format!("Get said delivered at {p}/{off}, where no copy is"));
            }
            (Call::Get, Answer::Got { state: State::Cancelled, .. }) if !copies.is_empty() => {
                fail("Get said CANCELLED, yet it is on the topic".into());
            }
            _ => {}
        }
    }
    if acked_at.is_some() {
        f.acknowledged += 1;
        match last {
            Answer::Got { state: State::Delivered, delivered: Some((p, off)), .. } => {
                f.delivered += 1;
                f.offset_unknown += usize::from(*off == -1);
                if !names_a_copy(copies, *p, *off) {
                    fail(format!("ends delivered at {p}/{off}, where no copy is"));
                }
            }
            Answer::Got { state: State::Cancelled, .. } => {
                f.cancelled += 1;
                if !copies.is_empty() {
                    fail("ends CANCELLED, yet it is on the topic".into());
                }
            }
            other => fail(format!("acknowledged, yet ends {other:?}")),
        }
    }
    if copies.len() > 1 {
        f.duplicates += 1;
        let mut at: Vec<i64> = copies.iter().map(|c| c.2).collect();
        at.sort_unstable();
        let explained = kills.iter().any(|&k| at[0] <= k && at[1..].iter().any(|&t| t >= k));
        if !explained {
            fail(format!("{} copies at {at:?}, with no kill in between", copies.len()));
        }
    }
    f.violations.extend(violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_history_of_random_calls_through_crashes_and_outages_checks_out() {
    let full = reliability_full();
    let (clients, live, seconds, faults) = if full { (16, 40, 120, 12) } else { (6, 40, 24, 3) };
    let mut broker = Broker::start_persistent();
    let topic = random_name("history");
    broker.create_topic(&topic, 3).await;
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::new(Path::new(BIN), dir.path(), broker.addr(), Durability::Sync)
        .unwrap()
        .launch()
        .await
        .unwrap();
    let history = Arc::new(History::default());
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (grpc, topic, history) = (server.grpc.clone(), topic.clone(), history.clone());
        tasks.push(tokio::spawn(run_client(grpc, topic, format!("h{c}"), live, history, until)));
    }
    // The nemesis: kills, and broker outages, spread over the run.
    let gap = Duration::from_secs(seconds) / (faults + 1);
    let (mut kills, mut outages) = (0, 0);
    for fault in 0..faults {
        tokio::time::sleep(gap).await;
        if fault % 3 == 2 {
            broker.stop();
            tokio::time::sleep(Duration::from_secs(3)).await;
            broker.resume();
            outages += 1;
        } else {
            server.kill();
            history.kills.lock().unwrap().push(now_ms());
            server.spawn().unwrap();
            server.wait_serving(Duration::from_secs(60)).await.unwrap();
            kills += 1;
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Quiesce: everything still pending comes due within seconds.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let ops = history.ops.lock().unwrap().clone();
    let mut client = client(&server.grpc);
    let mut last: HashMap<String, Answer> = HashMap::new();
    let give_up = Instant::now() + Duration::from_secs(120);
    for id in ops.keys() {
        let answer = loop {
            match client.get(proto::GetRequest { id: id.clone(), ..Default::default() }).await {
                Ok(r) => {
                    let g = r.into_inner();
                    if g.state() == State::Pending && Instant::now() < give_up {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                    break got(g);
                }
                Err(s) if s.code() == Code::NotFound => break Answer::Failed(Code::NotFound),
                Err(s) => panic!("final Get of {id}: {s:?}"),
            }
        };
        last.insert(id.clone(), answer);
    }
    let delivered = last
        .iter()
        .filter(|(_, a)| matches!(a, Answer::Got { state: State::Delivered, .. }))
        .map(|(id, _)| id.clone())
        .collect();
    let records =
        collect_async(broker.addr(), &[&topic], delivered, Duration::from_secs(60), Duration::from_secs(3))
            .await;
    let mut copies: HashMap<String, Vec<(i32, i64, i64)>> = HashMap::new();
    for r in records {
        copies.entry(r.id).or_default().push((r.partition, r.offset, r.timestamp_ms));
    }
    let kills_at = history.kills.lock().unwrap().clone();
    let mut findings = Findings::default();
    for (id, ops) in &ops {
        findings.calls += ops.len();
        findings.failed_calls += ops.iter().filter(|o| matches!(o.answer, Answer::Failed(_))).count();
        check(id, ops, copies.get(id).map_or(&[][..], Vec::as_slice), &last[id], &kills_at, &mut findings);
    }
    let unknown = copies.keys().filter(|id| !ops.contains_key(*id)).count();
    eprintln!(
        "history: {} calls ({} failed) by {clients} clients on {} ids over {seconds} s, {kills} kills, {outages} \
         broker outages: {} acknowledged, {} delivered ({} at an offset the broker did not give), {} cancelled, \
         {} duplicated (each explained by a kill), {} violations",
        findings.calls,
        findings.failed_calls,
        ops.len(),
        findings.acknowledged,
        findings.delivered,
        findings.offset_unknown,
        findings.cancelled,
        findings.duplicates,
        findings.violations.len()
    );
    assert_eq!(unknown, 0, "records on the topic for ids nobody scheduled");
    assert!(
        findings.violations.is_empty(),
        "{:#?}",
        &findings.violations[..findings.violations.len().min(20)]
    );
    assert!(
        findings.delivered > 0 && findings.cancelled > 0,
        "the history exercised too little: {findings:?}"
    );
    server.stop().unwrap();
}
