//! Requests of this node waiting for their log records to be applied, by
//! request number; and what the node knows of each record because it
//! wrote it ([`Local`]).

use std::{
    collections::HashMap,
    hash::{BuildHasherDefault, Hasher},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::sync::oneshot;

use crate::{command::Answer, store::Local};

pub struct Waiters {
    /// This node incarnation: records it wrote carry it.
    me: u64,
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, Waiter, BuildHasherDefault<RequestHasher>>>,
}

/// Request numbers are drawn in sequence: a multiply spreads them over the
/// table's buckets and tags, at a fraction of SipHash's cost.
#[derive(Default)]
struct RequestHasher(u64);

impl Hasher for RequestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

struct Waiter {
    /// The partition its record went to.
    partition: i32,
    local: Option<Local>,
    reply: Option<oneshot::Sender<Answer>>,
}

impl Waiters {
    pub fn new() -> Waiters {
        Waiters { me: incarnation(), next: AtomicU64::new(1), waiting: Mutex::default() }
    }

    pub fn me(&self) -> u64 {
        self.me
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiter, BuildHasherDefault<RequestHasher>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new request number, for a record of `partition`, with what the
    /// record will need when applied and, if `reply`, where its answer
    /// goes.
    pub(crate) fn register(
        &self,
        partition: i32,
        local: Option<Local>,
        reply: bool,
    ) -> (u64, Option<oneshot::Receiver<Answer>>) {
        let request = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = if reply {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        self.waiting().insert(request, Waiter { partition, local, reply: tx });
        (request, rx)
    }

    /// This node no longer applies `partition`: its requests whose records
    /// were not applied are forgotten (a caller still waiting learns that
    /// its answer will not come). How many.
    pub(crate) fn let_go(&self, partition: i32) -> usize {
        let mut waiting = self.waiting();
        let before = waiting.len();
        waiting.retain(|_, w| w.partition != partition);
        before - waiting.len()
    }

    /// The record of `request` was never written: what it held, if it was
    /// not applied meanwhile.
    pub(crate) fn forget(&self, request: u64) -> Option<Option<Local>> {
        self.waiting().remove(&request).map(|w| w.local)
    }

    /// Nobody waits for the answer to `request` any more, but its record is
    /// in the log: what it holds stays until the record is applied.
    pub(crate) fn stop_waiting(&self, request: u64) {
        let mut waiting = self.waiting();
        let keep = waiting.get_mut(&request).is_some_and(|w| {
            w.reply = None;
            w.local.is_some()
        });
        if !keep {
            waiting.remove(&request);
        }
    }

    /// What this node knows of each record read from the log (by the
    /// writer and request it carries), where it wrote it.
    pub(crate) fn take_locals(&self, records: &[Option<(u64, u64)>]) -> Vec<Option<Local>> {
        let mut waiting = self.waiting();
        records
            .iter()
            .map(|record| {
                let (writer, request) = (*record)?;
                if writer != self.me {
                    return None;
                }
                let waiter = waiting.get_mut(&request)?;
                let local = waiter.local.take();
                if waiter.reply.is_none() {
                    waiting.remove(&request);
                }
                local
            })
            .collect()
    }

    /// Answers the requests that wrote records, once they are applied.
    pub fn answer_all(&self, answers: impl IntoIterator<Item = (Option<(u64, u64)>, Answer)>) {
        let mut replies = Vec::new();
        {
            let mut waiting = self.waiting();
            for (record, answer) in answers {
                let Some((_, request)) = record.filter(|(writer, _)| *writer == self.me) else {
                    continue;
                };
                if let Some(Waiter { reply: Some(reply), .. }) = waiting.remove(&request) {
                    replies.push((reply, answer));
                }
            }
        }
        // Sent once the map is let go: a woken caller may register again.
        for (reply, answer) in replies {
            let _ = reply.send(answer);
        }
    }

    /// Records whose answer is still awaited.
    pub fn len(&self) -> usize {
        self.waiting().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for Waiters {
    fn default() -> Self {
        Waiters::new()
    }
}

/// A number no other start of a node draws, in all likelihood.
fn incarnation() -> u64 {
    use std::hash::BuildHasher as _;
    let now = std::time::SystemTime::now();
    std::collections::hash_map::RandomState::new().hash_one((now, std::process::id())) | 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::MessageId;

    #[test]
    fn a_record_read_back_gives_its_local_to_the_apply_and_its_answer_to_the_caller() {
        let waiters = Waiters::new();
        let me = waiters.me();
        let id = MessageId::parse("held").unwrap();
        let (asked, reply) = waiters.register(0, Some(Local::Held(id.clone())), true);
        let (recorded, none) = waiters.register(0, Some(Local::Settles(Vec::new(), None)), false);
        assert!(none.is_none());
        let mut reply = reply.expect("a reply was asked for");

        // Records of another node, or not hourglass's, take nothing.
        let read = [Some((me, asked)), Some((me ^ 2, recorded)), None, Some((me, recorded))];
        let locals = waiters.take_locals(&read);
        assert!(matches!(&locals[0], Some(Local::Held(held)) if *held == id));
        assert!(locals[1].is_none() && locals[2].is_none());
        assert!(matches!(&locals[3], Some(Local::Settles(..))));
        assert_eq!(waiters.len(), 1, "a record nobody waits for is forgotten once read");
        assert!(waiters.take_locals(&read[..1])[0].is_none(), "a local is taken once");

        waiters.answer_all([(Some((me ^ 2, asked)), Answer::None), (None, Answer::None)]);
        assert!(reply.try_recv().is_err(), "not answered by another node's record");
        waiters.answer_all([(Some((me, asked)), Answer::None)]);
        assert!(matches!(reply.try_recv(), Ok(Answer::None)));
        assert!(waiters.is_empty());
    }

    #[test]
    fn letting_go_of_a_partition_forgets_its_requests_only() {
        let waiters = Waiters::new();
        let (_, reply) = waiters.register(3, Some(Local::Held(MessageId::parse("a").unwrap())), true);
        let mut reply = reply.unwrap();
        waiters.register(3, Some(Local::Settles(Vec::new(), None)), false);
        let (kept, _) = waiters.register(4, None, true);
        assert_eq!(waiters.let_go(3), 2);
        assert_eq!(waiters.len(), 1);
        assert!(
            matches!(reply.try_recv(), Err(oneshot::error::TryRecvError::Closed)),
            "its caller learns no answer will come"
        );
        waiters.answer_all([(Some((waiters.me(), kept)), Answer::None)]);
        assert!(waiters.is_empty(), "another partition's request is still answered");
    }
}
