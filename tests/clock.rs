//! Wall-clock steps: hourglass on a manual clock that is jumped back an
//! hour, forward past the due time, and back again. Nothing may go out
//! before it is due by that clock, nothing twice, the dispatcher must not
//! spin while it waits, and it must not sleep through a forward jump.
//!
//! "Early" is judged by the manual clock (the `hourglass-due-ms` header
//! against the clock's value when the record could have been produced);
//! Kafka record timestamps are real time and say nothing here.
//!
//! One test function: it reads process-wide metrics.

// Apart from `tests/it/`: it reads the Prometheus registry of the servers
// it starts in this process, which every server in the process shares.
#[path = "it/common/mod.rs"]
mod common;

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use common::*;
use hourglass::{
    clock::ManualClock,
    message::UnixMillis,
    proto::{self, State, get_response::Settlement},
};

const WAKEUPS: &str = "hourglass_dispatch_wakeups_total";
const HOUR: u64 = 3_600_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_steps_never_deliver_early_or_twice_and_never_spin_or_oversleep() {
    let (messages, idle) =
        if reliability_full() { (500, Duration::from_secs(20)) } else { (20, Duration::from_secs(4)) };
    let broker = Broker::start();
    let topic = random_name("clock");
    broker.create_topic(&topic, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let t0 = chrono::Utc::now().timestamp_millis() as u64;
    let clock = Arc::new(ManualClock::new(UnixMillis(t0)));
    let server = Hourglass::start_with_clock(config(&broker, dir.path()), clock.clone()).await;
    let mut client = server.client().await;

    // Due one minute from t0 (spread over 1 s), and one an hour away that
    // the forward jump does not reach.
    let mut due_soon = HashSet::new();
    for i in 0..messages {
        let delay = Duration::from_millis(60_000 + (i as u64 * 1000) / messages as u64);
        let reply = client.schedule(request(&topic, &format!("m{i}"), delay)).await.unwrap().into_inner();
        assert_eq!(millis(reply.deliver_at.as_ref().unwrap()) as u64, t0 + delay.as_millis() as u64);
        due_soon.insert(reply.id);
    }
    let far = client.schedule(request(&topic, "far", Duration::from_millis(HOUR))).await.unwrap();
    let far = far.into_inner().id;

    // Each idle window is a consume that expects nothing; the dispatcher's
    // wake-ups over it show whether it spins. Idle, it wakes about once
    // per `max_sleep` (1 s); a busy loop wakes thousands of times.
    let idle_wakeups = |before: f64, after: f64, what: &str| {
        let woke = after - before;
        eprintln!("clock: {what}: {woke} wake-ups in {idle:?}");
        let bound = 5.0 * idle.as_secs_f64() + 10.0;
        assert!(woke <= bound, "{what}: {woke} wake-ups in {idle:?} is a busy loop");
        assert!(woke >= 1.0, "{what}: the dispatcher must still look at the clock");
    };

    // 1. The clock stands still a minute before the due time.
    let w = metric(&server, WAKEUPS).await;
    let got = consume_async(&broker, &topic, 1, idle, Duration::ZERO).await;
    assert!(got.is_empty(), "delivered before due: {got:?}");
    idle_wakeups(w, metric(&server, WAKEUPS).await, "waiting, clock still");

    // 2. Back an hour: still nothing, still no spinning.
    clock.set(UnixMillis(t0 - HOUR));
    let w = metric(&server, WAKEUPS).await;
    let got = consume_async(&broker, &topic, 1, idle, Duration::ZERO).await;
    assert!(got.is_empty(), "delivered after the clock went back: {got:?}");
    idle_wakeups(w, metric(&server, WAKEUPS).await, "clock an hour back");

    // 3. Forward past the due time: delivered promptly, not after the hour
    // a sleep computed before the jump would have lasted.
    let jumped_to = t0 + 61_000 + 1000;
    clock.set(UnixMillis(jumped_to));
    let jumped = Instant::now();
    let got = consume_async(&broker, &topic, messages, Duration::from_secs(60), Duration::from_secs(1)).await;
    let took = jumped.elapsed();
    let ids: Vec<&str> = got.iter().map(Received::id).collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "a message delivered twice");
    assert_eq!(unique, due_soon.iter().map(String::as_str).collect(), "exactly the due messages");
    for r in &got {
        let due: u64 = r.header("hourglass-due-ms").unwrap().parse().unwrap();
        assert!(due <= jumped_to, "{} produced before its due time {due} by the clock", r.id());
    }
    eprintln!("clock: {} delivered {took:?} (real time) after the forward jump", got.len());
    for id in &due_soon {
        let g = client
            .get(proto::GetRequest { id: id.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(g.state(), State::Delivered, "{g:?}");
        let Some(Settlement::Delivered(d)) = &g.settlement else { panic!("{g:?}") };
        let at = millis(d.delivered_at.as_ref().unwrap());
        assert!(
            at >= millis(g.deliver_at.as_ref().unwrap()),
            "delivered at {at}, before due by the clock: {g:?}"
        );
    }

    // 4. Back an hour again, after delivery: nothing goes out again, and
    // the far message stays parked.
    clock.set(UnixMillis(t0 - HOUR));
    let w = metric(&server, WAKEUPS).await;
    let again = consume_async(&broker, &topic, messages + 1, idle, Duration::ZERO).await;
    idle_wakeups(w, metric(&server, WAKEUPS).await, "clock back after delivery");
    assert_eq!(again.len(), messages, "re-delivered after the clock went back: {again:?}");
    let far = client.get(proto::GetRequest { id: far, ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(far.state(), State::Pending, "{far:?}");
    assert_eq!(far.attempts, 0);
    server.stop().await;
}
