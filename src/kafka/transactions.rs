//! Transactional delivery (`--delivery exactly-once`): one shard's records
//! go to their topics inside Kafka transactions, under a transactional id
//! of the shard's own, so that a `read_committed` consumer sees only what
//! was committed, and a process that took the shard over fences the one it
//! took it from at the broker.
//!
//! One thread owns the shard's transactional producer. The dispatcher
//! hands it records (owned copies) over a channel, as it would hand them
//! to librdkafka; the thread opens a transaction, produces what waits, and
//! commits as soon as nothing more waits (or the transaction holds
//! [`MAX_RECORDS`]): under load, what queues during one commit makes the
//! next transaction, so transactions grow with the load and a lone due
//! record is committed at once.
//!
//! A record's delivery report reaches the dispatcher only once its
//! transaction is committed: a delivery the store records is one a
//! `read_committed` consumer sees. When a transaction must be aborted (a
//! record refused, a broker error), the records that failed get their own
//! errors (the dispatcher's retry and refusal rules apply as usual) and the
//! others are produced again in the next transaction, unseen by the
//! dispatcher: their aborted copies are invisible to `read_committed`
//! readers.
//!
//! Before anything is produced, `init_transactions` fences every earlier
//! producer of the same transactional id (a crashed incarnation of this
//! node, or the node the shard was taken from) and completes or aborts its
//! open transaction, so a search for what it left behind ([`super::landed`],
//! reading `read_committed`) sees exactly what was committed. The
//! dispatcher waits for that ([`Outlet::ready`]).
//!
//! Fenced itself (another producer took the transactional id), the thread
//! either stops the node ([`OnFence::Stop`]: standalone, where the id is
//! this node's alone and a second user of it is a mistake) or gives every
//! record it holds, and every one handed to it later, back to the
//! dispatcher untouched ([`OnFence::Yield`]: cluster mode, where the shard
//! moved). A dispatcher whose shard comes back starts a new producer of
//! the id, which fences in turn, and reads the topics back first.
//!
//! It must not decide anything about messages: tokens in, reports out.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use rdkafka::{
    ClientConfig, ClientContext, Message as _,
    error::{KafkaError, RDKafkaErrorCode},
    message::{DeliveryResult, OwnedHeaders},
    producer::{BaseProducer, BaseRecord, Producer as _, ProducerContext},
};
use tokio::sync::{mpsc::UnboundedSender, watch};
use tokio_util::sync::CancellationToken;

use super::{
    outlet::{Outlet, ProducerStopped},
    report::{DeliveryReport, Fault, ProduceError, produce_error},
};
use crate::{message::Envelope, metrics};

/// Most records in one transaction.
const MAX_RECORDS: usize = 10_000;
/// How long one commit, abort or initialisation may take before it is
/// tried again.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// One step of an abort (see `Thread::abort`).
const ABORT_STEP: Duration = Duration::from_millis(200);
/// Aborts in a row that no record's own error explains before the records
/// go back to the dispatcher with the transaction's error.
const FRUITLESS_ABORTS: u32 = 3;
/// How long the thread waits for records before it serves librdkafka's
/// events anyway.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// How long a produce may go unanswered inside a transaction; it must not
/// exceed `transaction.timeout.ms`. A record timed out is in an aborted
/// transaction, so producing it again is no duplicate.
const TRANSACTION_TIMEOUT_MS: &str = "60000";

/// What a shard's transactional producer does when another producer takes
/// its transactional id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFence {
    /// Stop the node (the producer's fatal error): standalone.
    Stop,
    /// Give the records back to the dispatcher untouched; take the id back
    /// if records still come: cluster mode, where the shard moved.
    Yield,
}

/// A record handed to the transaction thread.
pub(super) struct Queued {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: OwnedHeaders,
    pub partition: Option<i32>,
    pub token: u64,
    pub reports: UnboundedSender<DeliveryReport>,
}

impl Queued {
    fn report(&self, result: Result<(i32, i64), ProduceError>) {
        // The dispatcher gone means the shard stopped; its messages stay
        // pending in the store.
        let _ = self.reports.send(DeliveryReport::now(self.token, result));
    }
}

/// Where the transaction thread stands, for those who wait on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum TxnState {
    /// Not initialised yet (the broker not reached, say).
    Starting,
    /// Earlier producers of the id are fenced; records can go.
    Ready,
    /// Fenced by another producer of the id, or failed for good.
    Stopped(String),
}

/// The handle of one shard's transaction thread; dropping it ends the
/// thread once what it holds is committed (or given back). While the
/// broker is away the thread goes on trying; the next producer of the id
/// fences it.
pub(super) struct Txn {
    queue: mpsc::Sender<Queued>,
    state: watch::Receiver<TxnState>,
    id: String,
}

impl Txn {
    /// Starts the thread of transactional id `id`. Under [`OnFence::Stop`],
    /// `fatal` is cancelled, with the reason in `why`, when it stops for
    /// good.
    pub(super) fn start(
        client: ClientConfig,
        id: String,
        on_fence: OnFence,
        (fatal, why): (CancellationToken, Arc<Mutex<Option<String>>>),
    ) -> std::io::Result<Txn> {
        let (queue, queued) = mpsc::channel();
        let (state_tx, state) = watch::channel(TxnState::Starting);
        let mut client = client;
        client.set("transactional.id", &id);
        client.set("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS);
        client.set("message.timeout.ms", TRANSACTION_TIMEOUT_MS);
        let thread = Thread {
            client,
            id: id.clone(),
            on_fence,
            fatal,
            why,
            queued,
            state: state_tx,
            waiting: VecDeque::new(),
            closed: false,
            fruitless: 0,
        };
        std::thread::Builder::new().name(format!("txn {id}")).spawn(move || thread.run())?;
        Ok(Txn { queue, state, id })
    }

    /// Waits until earlier producers of the id are fenced and their open
    /// transactions resolved. `false` if the thread stopped first.
    async fn started(&self) -> bool {
        let mut state = self.state.clone();
        match state.wait_for(|s| *s != TxnState::Starting).await {
            Ok(s) => *s == TxnState::Ready,
            Err(_) => false,
        }
    }

    /// Why it stopped, if it did.
    pub(super) fn stopped(&self) -> Option<String> {
        match &*self.state.borrow() {
            TxnState::Stopped(why) => Some(why.clone()),
            _ => None,
        }
    }
}

#[tonic::async_trait]
impl Outlet for Txn {
    /// Hands a record over; its report comes once its transaction is
    /// committed (or with its own error).
    fn send(
        &self,
        record: &Envelope,
        headers: OwnedHeaders,
        token: u64,
        reports: &UnboundedSender<DeliveryReport>,
    ) -> Result<(), ProduceError> {
        let queued = Queued {
            topic: record.topic.clone(),
            key: record.key.clone(),
            value: record.value.clone(),
            headers,
            partition: record.partition,
            token,
            reports: reports.clone(),
        };
        self.queue.send(queued).map_err(|_| ProduceError {
            fault: Fault::Fenced,
            reason: format!("the transactional producer {} has stopped", self.id),
        })
    }

    async fn ready(&self) -> Result<(), ProducerStopped> {
        if self.started().await {
            return Ok(());
        }
        Err(ProducerStopped(
            self.stopped().unwrap_or_else(|| format!("the transactional producer {} has stopped", self.id)),
        ))
    }

    fn failure(&self) -> Option<String> {
        self.stopped()
    }

    /// Nothing to wait for: the transaction thread commits what it holds
    /// when its dispatcher lets go of it.
    fn flush(&self, _: Duration) -> Result<(), KafkaError> {
        Ok(())
    }

    fn transactional_id(&self) -> Option<&str> {
        Some(&self.id)
    }
}

/// Where Kafka put a record, or why it did not.
type Outcome = Result<(i32, i64), KafkaError>;

/// Delivery results by index in the open transaction, gathered by
/// librdkafka's callbacks on the thread.
#[derive(Default)]
struct Results {
    got: Mutex<Vec<(usize, Outcome)>>,
}

struct TxnContext {
    results: Arc<Results>,
}

impl ClientContext for TxnContext {
    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::AllBrokersDown | RDKafkaErrorCode::BrokerTransportFailure) => {
                tracing::debug!(%error, %reason, "librdkafka (transactional producer)")
            }
            _ => tracing::warn!(%error, %reason, "librdkafka (transactional producer)"),
        }
    }
}

impl ProducerContext for TxnContext {
    type DeliveryOpaque = Box<usize>;

    fn delivery(&self, result: &DeliveryResult<'_>, index: Box<usize>) {
        let result = match result {
            Ok(m) => Ok((m.partition(), m.offset())),
            Err((e, _)) => Err(e.clone()),
        };
        self.results.got.lock().unwrap_or_else(|e| e.into_inner()).push((*index, result));
    }
}

/// A record in the open transaction, and what Kafka said of it.
struct InTxn {
    record: Queued,
    result: Option<Outcome>,
}

/// Why the thread cannot go on with its producer.
enum Stop {
    /// Another producer took the id, or librdkafka raised a fatal error.
    Fenced(String),
    /// The dispatcher let go of the handle and nothing is left.
    Closed,
}

struct Thread {
    client: ClientConfig,
    id: String,
    on_fence: OnFence,
    fatal: CancellationToken,
    why: Arc<Mutex<Option<String>>>,
    queued: mpsc::Receiver<Queued>,
    state: watch::Sender<TxnState>,
    /// Records to produce in the next transaction: handed over, or given
    /// back by an aborted one.
    waiting: VecDeque<Queued>,
    /// The handle was dropped.
    closed: bool,
    /// Aborts in a row that no record's own error explained.
    fruitless: u32,
}

impl Thread {
    fn run(mut self) {
        let stop = match self.producer() {
            Ok((producer, results)) => self.serve(&producer, &results),
            Err(stop) => stop,
        };
        let Stop::Fenced(why) = stop else { return };
        metrics::TRANSACTIONS.with_label_values(&["fenced"]).inc();
        match self.on_fence {
            OnFence::Stop => {
                tracing::error!(
                    transactional_id = %self.id,
                    reason = %why,
                    "the transactional producer was fenced or failed: another process uses this \
                     transactional id, or the broker refuses it; stopping (each node needs its own \
                     --transactional-id)"
                );
                self.why.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| {
                    format!("the transactional producer {} was fenced or failed: {why}", self.id)
                });
                self.state.send_replace(TxnState::Stopped(why));
                self.fatal.cancel();
            }
            OnFence::Yield => {
                tracing::warn!(
                    transactional_id = %self.id,
                    reason = %why,
                    "the shard's transactional producer was fenced: another node took the shard; \
                     what this one held goes back to its store unproduced"
                );
                self.state.send_replace(TxnState::Stopped(why.clone()));
                // Everything handed over from now on goes back too, until
                // the dispatcher lets go of this producer (it starts a new
                // one if the shard comes back to this node).
                for record in self.waiting.drain(..).chain(self.queued.iter()) {
                    record.report(Err(fenced(&why)));
                }
            }
        }
    }

    /// A new producer of the id, initialised: every earlier one fenced.
    fn producer(&mut self) -> Result<(BaseProducer<TxnContext>, Arc<Results>), Stop> {
        let results = Arc::new(Results::default());
        let context = TxnContext { results: Arc::clone(&results) };
        let producer: BaseProducer<TxnContext> = self
            .client
            .create_with_context(context)
            .map_err(|e| Stop::Fenced(format!("creating the transactional producer: {e}")))?;
        let started = Instant::now();
        loop {
            match producer.init_transactions(CALL_TIMEOUT) {
                Ok(()) => break,
                Err(KafkaError::Transaction(e)) if e.is_fatal() => {
                    return Err(Stop::Fenced(e.to_string()));
                }
                Err(e) => {
                    tracing::warn!(
                        transactional_id = %self.id,
                        error = %e,
                        waited = ?started.elapsed(),
                        "initialising the transactional producer failed; trying again (nothing is \
                         produced until then)"
                    );
                    if self.take_queued() {
                        return Err(Stop::Closed);
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        tracing::info!(transactional_id = %self.id, took = ?started.elapsed(), "transactional producer ready");
        self.state.send_replace(TxnState::Ready);
        Ok((producer, results))
    }

    /// Moves what the channel holds to `waiting`; true once the handle is
    /// dropped and nothing waits.
    fn take_queued(&mut self) -> bool {
        while self.waiting.len() < MAX_RECORDS {
            match self.queued.try_recv() {
                Ok(record) => self.waiting.push_back(record),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.closed = true;
                    break;
                }
            }
        }
        self.closed && self.waiting.is_empty()
    }

    /// Produces and commits transactions until the handle is dropped or
    /// the producer is fenced.
    fn serve(&mut self, producer: &BaseProducer<TxnContext>, results: &Results) -> Stop {
        let mut txn: Vec<InTxn> = Vec::new();
        loop {
            if self.waiting.is_empty() && !self.closed {
                match self.queued.recv_timeout(IDLE_POLL) {
                    Ok(record) => self.waiting.push_back(record),
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        producer.poll(Duration::ZERO);
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => self.closed = true,
                }
            }
            if self.take_queued() {
                return Stop::Closed;
            }
            match producer.begin_transaction() {
                Ok(()) => {}
                Err(KafkaError::Transaction(e)) if e.is_fatal() => {
                    return self.give_back(&mut txn, Stop::Fenced(format!("beginning a transaction: {e}")));
                }
                Err(e) => {
                    tracing::warn!(transactional_id = %self.id, error = %e, "beginning a transaction: trying again");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
            while txn.len() < MAX_RECORDS {
                let Some(record) = self.waiting.pop_front() else { break };
                let sent = send(producer, &record, txn.len());
                txn.push(InTxn { record, result: sent.err().map(Err) });
                // More may have come while these were produced.
                if self.waiting.is_empty() {
                    self.take_queued();
                }
            }
            if let Err(stop) = self.commit(producer, results, &mut txn) {
                return self.give_back(&mut txn, stop);
            }
        }
    }

    /// Commits the open transaction and reports its records; or aborts it,
    /// reports the records that failed and puts the others back in front
    /// of `waiting`.
    fn commit(
        &mut self,
        producer: &BaseProducer<TxnContext>,
        results: &Results,
        txn: &mut Vec<InTxn>,
    ) -> Result<(), Stop> {
        let started = Instant::now();
        let failed_early = txn.iter().any(|r| matches!(r.result, Some(Err(_))));
        let outcome = if failed_early {
            Err(("a record was refused before it was sent".to_owned(), None))
        } else {
            loop {
                // Wait for the records' acknowledgements here, in steps of a
                // millisecond: the client library's own flush serves events
                // in steps of 100 ms, which a lone due record would wait.
                wait_acknowledged(producer, CALL_TIMEOUT);
                let committed = producer.commit_transaction(CALL_TIMEOUT);
                gather(results, txn);
                match committed {
                    Ok(()) => break Ok(()),
                    Err(KafkaError::Transaction(e)) if e.is_fatal() => {
                        return Err(Stop::Fenced(format!("committing: {e}")));
                    }
                    Err(KafkaError::Transaction(e)) if e.txn_requires_abort() => {
                        break Err((e.to_string(), Some(e.code())));
                    }
                    // Still flushing (a broker away), or a retriable
                    // coordinator error: the same commit again.
                    Err(e) => {
                        tracing::warn!(transactional_id = %self.id, error = %e, "committing a transaction: trying again");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        };
        match outcome {
            Ok(()) => {
                self.fruitless = 0;
                metrics::TRANSACTIONS.with_label_values(&["committed"]).inc();
                metrics::TRANSACTION_SECONDS.observe(started.elapsed().as_secs_f64());
                metrics::TRANSACTION_RECORDS.observe(txn.len() as f64);
                for done in txn.drain(..) {
                    let result = match done.result {
                        Some(Ok(at)) => Ok(at),
                        Some(Err(e)) => Err(produce_error(&e)),
                        // Committed, yet no report: librdkafka flushes
                        // before it commits, so this does not happen; the
                        // record is in the committed transaction.
                        None => Err(ProduceError {
                            fault: Fault::Outage,
                            reason: "committed without a delivery report".into(),
                        }),
                    };
                    done.record.report(result);
                }
                Ok(())
            }
            Err((why, code)) => {
                tracing::warn!(transactional_id = %self.id, reason = %why, records = txn.len(), "aborting a transaction");
                self.abort(producer, results, txn)?;
                metrics::TRANSACTIONS.with_label_values(&["aborted"]).inc();
                // Each failed record goes back with its own error; the
                // others go first into the next transaction. An abort
                // that no record's own error explains (the broker refused
                // the transaction a partition, say) is waited out with a
                // growing pause; after a few in a row, the records go back
                // to the dispatcher with the transaction's error, so that
                // its retry and refusal rules hold them, not this loop.
                let own = txn.iter().any(|r| matches!(&r.result, Some(Err(e)) if !purged(e)));
                self.fruitless = if own { 0 } else { self.fruitless + 1 };
                let give_up = self.fruitless >= FRUITLESS_ABORTS;
                let why =
                    ProduceError { fault: code.map_or(Fault::Outage, super::report::classify), reason: why };
                for aborted in txn.drain(..).rev() {
                    match aborted.result {
                        Some(Err(e)) if !purged(&e) => aborted.record.report(Err(produce_error(&e))),
                        _ if give_up => aborted.record.report(Err(why.clone())),
                        _ => self.waiting.push_front(aborted.record),
                    }
                }
                if give_up {
                    self.fruitless = 0;
                } else if self.fruitless > 0 {
                    std::thread::sleep(Duration::from_millis(100 << self.fruitless.min(5)));
                }
                Ok(())
            }
        }
    }

    /// Aborts the open transaction. librdkafka purges what it still holds
    /// (adjusting its sequence numbers, which a purge of ours would not)
    /// and waits for the reports of those records, which only this thread
    /// serves: so the abort is asked in short steps, serving reports
    /// between them.
    fn abort(
        &mut self,
        producer: &BaseProducer<TxnContext>,
        results: &Results,
        txn: &mut [InTxn],
    ) -> Result<(), Stop> {
        let started = Instant::now();
        loop {
            let aborted = producer.abort_transaction(ABORT_STEP);
            wait_acknowledged(producer, ABORT_STEP);
            gather(results, txn);
            match aborted {
                Ok(()) => return Ok(()),
                Err(KafkaError::Transaction(e)) if e.is_fatal() => {
                    return Err(Stop::Fenced(format!("aborting: {e}")));
                }
                Err(e) => {
                    if started.elapsed() >= CALL_TIMEOUT {
                        tracing::warn!(transactional_id = %self.id, error = %e, "aborting a transaction: trying again");
                    }
                }
            }
        }
    }

    /// Fenced with a transaction open: under [`OnFence::Yield`] its
    /// records go back to the dispatcher untouched (the broker aborts the
    /// transaction); under [`OnFence::Stop`] they stay unreported (the node
    /// stops, and they stay pending in the store).
    fn give_back(&mut self, txn: &mut Vec<InTxn>, stop: Stop) -> Stop {
        if let (Stop::Fenced(why), OnFence::Yield) = (&stop, self.on_fence) {
            for record in txn.drain(..) {
                record.record.report(Err(fenced(why)));
            }
        }
        txn.clear();
        stop
    }
}

/// Produces one record into the open transaction, waiting while
/// librdkafka's queue is full.
fn send(producer: &BaseProducer<TxnContext>, record: &Queued, index: usize) -> Result<(), KafkaError> {
    loop {
        let mut base = BaseRecord::with_opaque_to(&record.topic, Box::new(index))
            .payload(&record.value)
            .headers(record.headers.clone());
        if let Some(key) = &record.key {
            base = base.key(key);
        }
        if let Some(partition) = record.partition {
            base = base.partition(partition);
        }
        match producer.send(base) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                producer.poll(Duration::from_millis(10));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Serves delivery reports until librdkafka holds no record (every one
/// acknowledged or failed, and its report served), or `within` passed.
fn wait_acknowledged(producer: &BaseProducer<TxnContext>, within: Duration) {
    let deadline = Instant::now() + within;
    producer.poll(Duration::ZERO);
    while producer.in_flight_count() > 0 && Instant::now() < deadline {
        producer.poll(Duration::from_millis(1));
    }
}

/// Moves the delivery results librdkafka reported to their records.
fn gather(results: &Results, txn: &mut [InTxn]) {
    for (index, result) in results.got.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        if let Some(record) = txn.get_mut(index) {
            record.result = Some(result);
        }
    }
}

/// A record librdkafka dropped because its transaction was aborted (or
/// refused because the transaction was to be aborted), not one Kafka
/// failed: it goes into the next transaction. Every other error goes back
/// to the dispatcher, whose retry, refusal and stall rules apply as
/// without transactions (a record that timed out, say, is retried after a
/// backoff, so one stuck partition does not hold every transaction).
fn purged(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight | RDKafkaErrorCode::State)
    )
}

fn fenced(why: &str) -> ProduceError {
    ProduceError { fault: Fault::Fenced, reason: format!("fenced: {why}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aborted_transaction_gives_back_what_failed_for_others() {
        // A record Kafka failed keeps its error, an outage's too (the
        // dispatcher retries it after a backoff, and holds a stalled
        // topic); those caught in the abort go into the next transaction.
        assert!(!purged(&KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)));
        assert!(!purged(&KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopicOrPartition)));
        assert!(!purged(&KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut)));
        assert!(!purged(&KafkaError::MessageProduction(RDKafkaErrorCode::NotLeaderForPartition)));
        assert!(purged(&KafkaError::MessageProduction(RDKafkaErrorCode::PurgeInflight)));
        assert!(purged(&KafkaError::MessageProduction(RDKafkaErrorCode::PurgeQueue)));
        assert!(purged(&KafkaError::MessageProduction(RDKafkaErrorCode::State)));
    }
}
