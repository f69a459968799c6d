//! Where the dispatcher reads: the due index walked forward one chunk
//! ahead of what is produced, and the entries looked at again apart from
//! the walk (handed over, held by the writer, unreadable, or put off).

use super::{Dispatcher, GATE_RECHECK, HOLD_FOR, Next, Reading};
use crate::{
    command::{DueBatch, Ready},
    message::UnixMillis,
};

/// Messages read from the store in one go; the next chunk is read while
/// this one is produced. In a backlog, each chunk waits for its horizon's
/// commit (see [`doubt`](super::doubt)): a chunk must take longer to
/// produce than a commit takes behind the settles, or the drain waits on
/// the writer. At 2048 it did (a chunk went out in about 6 ms at 350k
/// msg/s, the writer's round took as long); at 8192 a drain ran 12% faster.
/// After an unclean stop mid-backlog, what is in doubt is at most a chunk
/// beyond what was in flight.
const READ_CHUNK: usize = 8192;

/// The most due entries one look goes through before the loop's upkeep.
const LOOK_AT_MOST: usize = 64 * 1024;

impl Dispatcher {
    /// In-flight slots taken: records Kafka is answering in time.
    fn active(&self) -> usize {
        self.sent.waiting()
    }

    /// Claims and produces whatever is due now, as far as in-flight room
    /// allows.
    pub(super) async fn dispatch_due(&mut self) -> Next {
        let now = self.clock.now();
        self.give_back_ahead(false).await;
        if self.store.writes_failing() {
            // What would be produced could not be recorded: a restart would
            // produce it again. Wait for the store.
            return Next::At(now.saturating_add(self.config.max_sleep));
        }
        if !self.gate.open() {
            // Another node may own the shard by now: wait for the group to
            // confirm this one (or for good, if the log names another).
            return Next::At(now.saturating_add(GATE_RECHECK));
        }
        let late = self.store.wake().take();
        self.scan.recheck.extend(late.entries);
        self.scan.rescan(late.rescan_from);
        // A read under way moves the scan on when it lands: the rescan
        // waits for that.
        if let Some(from) = self.scan.rescan_from
            && self.ahead.reading.is_none()
        {
            self.scan.from = self.scan.from.min(from);
            self.scan.rescan_from = None;
            self.ahead.given_back = None;
        }
        self.scan.from = self.doubt.walk_from(self.scan.from);
        self.release_unheld(now);
        if now >= self.scan.unreadable_retry {
            self.scan.recheck.append(&mut self.scan.unreadable);
        }
        // Stalled records keep their claims but not their slots. Twice the
        // limit bounds everything produced and not recorded yet: memory when
        // everything stalls, and what a restart produces again when commits
        // fail before the store reports it.
        let slots = self.config.max_in_flight.saturating_sub(self.active());
        let window = 2 * self.config.max_in_flight;
        let committing = self.store.wake().unrecorded();
        let unrecorded = self.sent.unhanded() + self.settling.settles.len() + committing;
        let mut room = slots.min(window.saturating_sub(unrecorded));
        if room == 0 {
            if slots == 0 || committing == 0 {
                return Next::Full;
            }
            // Waiting on the writer rather than on Kafka: its next commit
            // of settles wakes this loop (unless one just came).
            return if self.store.wake().await_commits() < committing { Next::Now } else { Next::Commits };
        }

        // Entries to look at again first: they are due, and behind the scan.
        // Those found held by the writer again wait for the next look.
        let mut recheck = std::mem::take(&mut self.scan.recheck);
        while !recheck.is_empty() && room > 0 {
            let take = recheck.len().min(room).min(READ_CHUNK);
            let entries: Vec<_> = recheck.drain(..take).collect();
            let lowest = entries.iter().map(|(key, _)| *key).min();
            let batch = match self.store.take_listed(entries).await {
                Ok(batch) => batch,
                Err(e) => {
                    // None of them was looked at: the walk reads them again
                    // from the index, and the rest wait for the next look.
                    self.scan.rescan(lowest);
                    self.scan.recheck.append(&mut recheck);
                    self.store.due_read_failed(&e);
                    return Next::At(now.saturating_add(self.config.max_sleep));
                }
            };
            room = room.saturating_sub(self.handle(batch, now).await);
        }
        self.scan.recheck.append(&mut recheck);
        if room == 0 {
            return Next::Full;
        }

        // Then what dispatch policies held back and may go now: it was due
        // before what the walk finds.
        room = room.saturating_sub(self.run_lanes(now, room).await);
        if room == 0 {
            return Next::Full;
        }

        // Then the due index, in chunks, the next one read while this one
        // is produced and while reports are awaited.
        let mut next = Next::Now;
        let mut looked_at = 0;
        loop {
            if !self.ahead.ready.is_empty() {
                if !self.gate.open() {
                    return Next::At(now.saturating_add(GATE_RECHECK));
                }
                // What is put off or held back takes no room: only what
                // is produced does. A walk past many held back (a paused
                // topic's millions) stops now and then for the loop's
                // upkeep (reports, settles), and goes on at once.
                let take = room.min(self.ahead.ready.len());
                looked_at += take;
                let ready: Vec<Ready> = if take == self.ahead.ready.len() {
                    std::mem::take(&mut self.ahead.ready)
                } else {
                    self.ahead.ready.drain(..take).collect()
                };
                room = room.saturating_sub(self.handle(DueBatch { ready, ..DueBatch::default() }, now).await);
                if !self.ahead.ready.is_empty() {
                    if room > 0 && looked_at < LOOK_AT_MOST {
                        continue;
                    }
                    return if room > 0 { Next::Now } else { Next::Full };
                }
                self.ahead.since = None;
                next = self.ahead.after;
            }
            if next != Next::Now {
                break;
            }
            if room == 0 {
                return Next::Full;
            }
            if looked_at >= LOOK_AT_MOST {
                return Next::Now;
            }
            let reading = match self.ahead.reading.take() {
                Some(reading) => reading,
                None => self.start_read(now),
            };
            let from = reading.from;
            let mut batch = match reading.task.await {
                Ok(Ok((batch, recording))) => {
                    self.doubt.horizon.recording(recording);
                    batch
                }
                Ok(Err(e)) => {
                    self.store.due_read_failed(&e);
                    return Next::At(now.saturating_add(self.config.max_sleep));
                }
                Err(e) => {
                    tracing::error!(error = %e, "the due-message reader panicked; retrying shortly");
                    return Next::At(now.saturating_add(self.config.max_sleep));
                }
            };
            // A rescan asked for meanwhile starts lower than this read did,
            // or within what it read (after it started).
            if self.scan.from >= from {
                self.scan.from = batch.next_from;
            }
            let rescan = self.scan.rescan_from.take().filter(|&at| at < self.scan.from);
            if let Some(at) = rescan {
                self.scan.from = at;
                batch.more = true;
            }
            // Entries read ahead and given back below this read since it
            // started go first: it goes back as well (before the next read
            // could meet its claims), and is read again after them, so that
            // what is produced goes in dispatch order (a delivery recorded
            // below one recorded before it is the slow kind). Other rescans
            // (a held topic's entries over the cap) do not: they may find
            // nothing to produce.
            let behind = self.ahead.given_back.take().is_some_and(|at| at < from);
            if behind {
                let ids = batch.ready.drain(..).map(|r| r.id).collect();
                if let Err(e) = self.store.release(ids).await {
                    tracing::warn!(error = %e, "returning claims failed");
                }
            }
            looked_at += batch.stepped_over;
            for (lane, lowest) in std::mem::take(&mut batch.held_back) {
                self.policies.stepped_over(lane, lowest, now);
            }
            self.ahead.after = match (batch.more, batch.next_dispatch_at) {
                (true, _) => Next::Now,
                (false, Some(due)) => Next::At(due),
                (false, None) => Next::Idle,
            };
            next = self.ahead.after;
            self.ahead.next_topic = batch.next_topic.take().filter(|t| !self.doubt.marked.contains(&**t));
            if batch.more {
                if let Some(last) = batch.ready.iter().map(|r| r.key).max() {
                    // A backlog: the horizon recorded while nothing was
                    // due may reach past much of it.
                    let queued = self.settling.letters.iter().map(|l| l.key());
                    self.doubt.horizon.down_to(last.successor(), queued).await;
                }
                self.ahead.reading = Some(self.start_read(now));
            }
            if !behind {
                self.ahead.ready = std::mem::take(&mut batch.ready);
                self.ahead.since = Some(tokio::time::Instant::now());
            }
            // What it found and cannot produce is dealt with now.
            self.handle(batch, now).await;
        }
        self.store.metrics().in_flight.set(self.sent.len() as i64);
        let next = self.sooner(next);
        self.sooner_for_lanes(next)
    }

    /// Gives back what was read ahead and has waited for room too long
    /// (everything in flight stalled, or the store failing): its claims
    /// would hold cancels. Too long is [`HOLD_FOR`], or as long as a
    /// produce takes lately if longer: room comes as answers do. At
    /// shutdown (`all`) it goes back at once.
    pub(super) async fn give_back_ahead(&mut self, all: bool) {
        let too_long = HOLD_FOR.max(self.sent.answer_time());
        let waited = self.ahead.since.is_some_and(|since| since.elapsed() >= too_long);
        if self.ahead.ready.is_empty() || !(all || waited) {
            return;
        }
        self.ahead.since = None;
        self.ahead.after = Next::Now;
        let ahead = std::mem::take(&mut self.ahead.ready);
        let first = ahead.first().map(|r| r.key);
        self.scan.rescan(first);
        if let Some(first) = first {
            self.ahead.given_back = Some(self.ahead.given_back.map_or(first, |g| g.min(first)));
        }
        let ids = ahead.into_iter().map(|r| r.id).collect();
        if let Err(e) = self.store.release(ids).await {
            tracing::warn!(error = %e, "returning claims failed");
        }
    }

    /// `next`, or earlier if a probe or a read is due to be tried again.
    fn sooner(&self, next: Next) -> Next {
        let probe = self
            .topics
            .states
            .values()
            .filter_map(|t| t.refusal.as_ref().filter(|r| !r.probing && !t.deferred.is_empty()))
            .map(|r| r.probe_at)
            .min();
        let unreadable = (!self.scan.unreadable.is_empty()).then_some(self.scan.unreadable_retry);
        match (next, probe.into_iter().chain(unreadable).min()) {
            (Next::Now | Next::Full | Next::Commits, _) => next,
            (Next::At(t), Some(other)) => Next::At(t.min(other)),
            (Next::Idle, Some(other)) => Next::At(other),
            (next, None) => next,
        }
    }

    /// Starts reading (and claiming) the next chunk of messages due at
    /// `now`, from where the scan stands, and then recording the horizon
    /// past it: while the chunk before it is produced, not after. The
    /// chunk waits for that record only when it is produced.
    fn start_read(&self, now: UnixMillis) -> Reading {
        let (store, ahead) = (self.store.clone(), self.doubt.horizon.ahead());
        let (from, limit) = (self.scan.from, READ_CHUNK.min(self.config.max_in_flight.max(1)));
        let held = self.policies.held_lanes();
        let task = tokio::spawn(async move {
            let batch = store.take_due_but(from, now, limit, held).await?;
            let recording = ahead.past(&batch);
            Ok((batch, recording))
        });
        Reading { from, task }
    }
}
