use super::*;
use crate::cluster::log::record::Cancelled;

fn acked(offset: i64) -> Acked {
    let change = Change::Cancelled(Cancelled::default());
    Acked {
        offset,
        at: UnixMillis(1),
        key: offset as u64 * 10,
        writer: 1,
        request: offset as u64,
        change,
        bytes: 10,
    }
}

/// Holding what it is handed, as a sender would count it.
fn early() -> Early {
    Early::new(Arc::new(AtomicUsize::new(usize::MAX / 2)))
}

fn offsets(ready: &[Acked]) -> Vec<i64> {
    ready.iter().map(|a| a.offset).collect()
}

#[test]
fn acked_records_are_applied_from_the_next_offset_without_a_gap() {
    let mut early = early();
    // Acks of two appends that came out of order.
    early.add(vec![acked(13), acked(14)]);
    early.add(vec![acked(10), acked(11)]);
    assert!(early.ready(9).is_empty(), "offset 9 is not applied yet");
    assert_eq!(offsets(&early.ready(10)), [10, 11]);
    assert!(early.ready(12).is_empty(), "12, another writer's, is read back first");
    assert_eq!(offsets(&early.ready(13)), [13, 14]);
    assert!(early.ahead.is_empty());
}

#[test]
fn acked_records_applied_as_read_back_are_dropped() {
    let mut early = early();
    early.add(vec![acked(5), acked(6), acked(8)]);
    // The reader applied up to 7 first.
    assert!(early.ready(8).iter().map(|a| a.offset).eq([8]));
    assert!(early.ahead.is_empty());
    assert!(early.applied.iter().eq([&(8, 80)]), "only what was applied from its ack is checked");
}

#[test]
fn a_record_read_back_is_checked_against_its_ack() {
    let mut early = early();
    early.add(vec![acked(1), acked(2), acked(3)]);
    assert_eq!(early.ready(1).len(), 3);
    let before = metrics::LOG_ACK_MISMATCHES.get();
    early.read_back(0, 0, 0);
    early.read_back(0, 1, 10);
    assert_eq!(metrics::LOG_ACK_MISMATCHES.get(), before, "the same record where its ack said");
    // Offset 2 read back holds another key: counted. Offset 3 was not
    // read back (gone by compaction, or skipped): nothing said.
    early.read_back(0, 2, 99);
    early.read_back(0, 4, 0);
    assert!(metrics::LOG_ACK_MISMATCHES.get() > before);
    assert!(early.applied.is_empty());
    // From then on, nothing is applied from an ack.
    early.add(vec![acked(5)]);
    assert!(early.ready(5).is_empty());
}

#[test]
fn acks_are_held_up_to_a_budget_of_bytes_on_the_way_and_behind_a_gap() {
    let (sender, receiver) = ack_channel();
    let AckReceiver { mut rx, held } = receiver;
    let per = 10 + ACKED_OVERHEAD;
    let fit = EARLY_BYTES / per;
    sender.send((1..=fit as i64).map(acked).collect());
    sender.send(vec![acked(fit as i64 + 1)]);
    assert_eq!(held.load(Ordering::Relaxed), fit * per, "what does not fit is not handed over");
    let mut early = Early::new(Arc::clone(&held));
    while let Ok(got) = rx.try_recv() {
        early.add(got);
    }
    assert_eq!(early.ahead.len(), fit);
    // Offset 1 was read back first; the rest are applied from acks.
    assert_eq!(early.ready(2).len(), fit - 1);
    assert_eq!(held.load(Ordering::Relaxed), 0, "all of it let go");
    sender.send(vec![acked(fit as i64 + 5)]);
    early.add(rx.try_recv().unwrap());
    early.clear();
    assert_eq!(held.load(Ordering::Relaxed), 0);
    drop(rx);
    sender.send(vec![acked(fit as i64 + 6)]);
    assert_eq!(held.load(Ordering::Relaxed), 0, "nothing held for an applier that stopped");
}

#[test]
fn a_shard_is_released_clean_only_by_its_owner_s_last_clean_release() {
    use crate::cluster::log::record::Owner;
    let owner = |writer: u64, released: bool, clean: bool| {
        let change = Change::Owner(Owner { at_ms: 1, released, clean });
        (0, UnixMillis(1), Entry::Logged { writer, request: 0, change })
    };
    let other = (
        0,
        UnixMillis(1),
        Entry::Logged { writer: 7, request: 1, change: Change::Cancelled(Cancelled::default()) },
    );
    assert_eq!(released_clean(0, std::slice::from_ref(&other)), None, "no claim or release: as it was");
    assert_eq!(released_clean(7, &[owner(7, true, true), other]), Some(true));
    assert_eq!(released_clean(7, &[owner(7, true, false)]), Some(false), "a release with something in doubt");
    assert_eq!(released_clean(7, &[owner(8, true, true)]), None, "a fenced node's release changes nothing");
    assert_eq!(
        released_clean(7, &[owner(7, true, true), owner(8, false, false)]),
        Some(false),
        "claimed since"
    );
    assert_eq!(released_clean(7, &[owner(8, false, false), owner(8, true, true)]), Some(true));
}
