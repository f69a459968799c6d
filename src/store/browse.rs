//! The threads that walk the store for its readers: a page of pending
//! messages, counts, a forecast of the console. Such a walk may take a
//! core for a second; on the threads deliveries use it would make them
//! late by as much. They run instead on a few threads of their own, at a
//! lower CPU priority than the rest of the process (nice +10 on Linux,
//! where a nice value is a thread's own), so that the scheduler gives the
//! dispatcher, the writer and the producer's threads the CPU first when
//! they want it; with CPU to spare, the walks run at full speed, and on a
//! busy machine they still progress (about a tenth of a core's share
//! against a thread at nice 0; Linux's idle class would all but stop
//! them).
//!
//! One pool per process, shared by its shards. A walk waits for a thread
//! when all are busy: a console polled hard, or many listings at once,
//! slow each other down, not the threads of the deliveries.

use std::{
    panic::AssertUnwindSafe,
    sync::{Mutex, OnceLock, mpsc},
};

use tokio::sync::oneshot;

use super::StoreError;

/// The threads' nice value: a thread at nice 0 gets about ten times the
/// CPU of one at +10 when both want it.
const NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// Runs `walk` on a browsing thread and returns what it returned.
pub(super) async fn run<T: Send + 'static>(
    walk: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(walk());
    });
    pool().send(job).map_err(|_| ended())?;
    rx.await.map_err(|_| ended())
}

fn ended() -> StoreError {
    StoreError::Io("a store read ended without an answer (its thread panicked)".to_owned())
}

/// The pool's queue; its threads start with the first walk.
fn pool() -> &'static mpsc::Sender<Job> {
    static POOL: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = std::sync::Arc::new(Mutex::new(rx));
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8));
        for i in 0..threads {
            let rx = std::sync::Arc::clone(&rx);
            std::thread::Builder::new()
                .name(format!("hourglass-browse-{i}"))
                .spawn(move || {
                    lower_priority();
                    loop {
                        let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        let Ok(job) = job else { return };
                        // A walk that panics answers its caller with an
                        // error (its reply is dropped); the thread goes on.
                        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                    }
                })
                .expect("spawning a store browsing thread");
        }
        tx
    })
}

/// Lowers the calling thread's CPU priority. Where it cannot (a process
/// already at a higher nice value, another system), the thread runs as the
/// process does.
pub(super) fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take and return plain integers.
        let done = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, NICE) };
        if done != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "the store's browsing threads keep their priority");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_walk_runs_on_a_thread_of_lower_priority_and_a_panic_is_an_error() {
        let (name, nice) = run(|| {
            let name = std::thread::current().name().map(str::to_owned);
            // SAFETY: as in `lower_priority`.
            #[cfg(target_os = "linux")]
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
            #[cfg(not(target_os = "linux"))]
            let nice = NICE;
            (name, nice)
        })
        .await
        .unwrap();
        assert!(name.unwrap().starts_with("hourglass-browse-"));
        // SAFETY: as in `lower_priority`.
        #[cfg(target_os = "linux")]
        let process = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        #[cfg(not(target_os = "linux"))]
        let process = 0;
        assert_eq!(nice, NICE.max(process), "the process runs at nice {process}");
        let failed = run(|| -> u8 { panic!("a walk that panics") }).await;
        assert!(matches!(failed, Err(StoreError::Io(_))));
        // The pool still answers.
        assert_eq!(run(|| 7).await.unwrap(), 7);
    }
}
