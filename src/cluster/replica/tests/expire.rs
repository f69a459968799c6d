//! Deadlines in the log: a message's own deadline travels with it, and an
//! expiry the owner settled is applied as the store records it.

use std::time::Duration;

use super::*;

#[tokio::test]
async fn a_deadline_travels_with_its_message_and_an_expiry_applies_as_settled() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let with_deadline = LogMessage {
        max_lateness_ms: Some(1_000),
        ..LogMessage::new(
            &id("late"),
            &Envelope { max_lateness: Some(Duration::from_secs(1)), ..envelope("late") },
            DueSpec::At(UnixMillis(10)),
            UnixMillis(10),
            UnixMillis(1),
        )
    };
    assert_eq!(with_deadline.max_lateness_ms, Some(1_000), "the log record carries it");
    let expired = SettledLine {
        id: id("late").as_bytes().to_vec(),
        at_ms: 2_000,
        outcome: Some(SettledOutcome::Expired(record::SettledExpiry { deadline_ms: 1_010 })),
    };
    store.apply(vec![logged(0, Change::Scheduled(with_deadline)), settled(1, vec![expired])]).await.unwrap();
    let got = store.reader().get(Scope::everything(), id("late")).await.unwrap().unwrap();
    assert_eq!(got.state, State::Expired { at: UnixMillis(2_000), deadline: UnixMillis(1_010) });
    assert_eq!(got.envelope.max_lateness, Some(Duration::from_secs(1)));
    let stats = store.reader().stats(Scope::everything(), UnixMillis(3_000)).await.unwrap();
    assert_eq!((stats.counts.pending, stats.counts.expired), (0, 1));
    store.close().await;
}
