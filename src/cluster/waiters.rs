//! Requests of this node waiting for their log records to be applied, by
//! request number; and what the node knows of each record because it
//! wrote it ([`Local`]).

use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::sync::oneshot;

use crate::store::{Answer, Local};

pub struct Waiters {
    /// This node incarnation: records it wrote carry it.
    me: u64,
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, Waiter>>,
}

struct Waiter {
    local: Option<Local>,
    reply: Option<oneshot::Sender<Answer>>,
}

impl Waiters {
    pub fn new() -> Waiters {
        Waiters { me: incarnation(), next: AtomicU64::new(1), waiting: Mutex::new(HashMap::new()) }
    }

    pub fn me(&self) -> u64 {
        self.me
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiter>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new request number, with what the record will need when applied
    /// and, if `reply`, where its answer goes.
    pub(crate) fn register(
        &self,
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
        self.waiting().insert(request, Waiter { local, reply: tx });
        (request, rx)
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

    /// What this node knows of a record read from the log, if it wrote it.
    pub(crate) fn take_local(&self, writer: u64, request: u64) -> Option<Local> {
        if writer != self.me {
            return None;
        }
        let mut waiting = self.waiting();
        let waiter = waiting.get_mut(&request)?;
        let local = waiter.local.take();
        if waiter.reply.is_none() {
            waiting.remove(&request);
        }
        local
    }

    /// Answers the request that wrote a record, once it is applied.
    pub fn answer(&self, writer: u64, request: u64, answer: Answer) {
        if writer != self.me {
            return;
        }
        if let Some(Waiter { reply: Some(reply), .. }) = self.waiting().remove(&request) {
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
