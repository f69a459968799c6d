//! Recurring schedules (series): a template record and a rule of when it
//! recurs, each occurrence an ordinary parked message.
//!
//! - [`rule`]: when occurrences fall (cron in a time zone, or an interval),
//!   within a start, an end and a count, with a stable jitter; and what
//!   fires of the occurrences missed while hourglass or Kafka was down.
//! - [`spec`]: a series as a request gives it, checked against the limits
//!   a new one is held to; the ids of a series and of its occurrences
//!   (`<series>@<time in ms>`, placed in the series' shard).
//! - [`record`]: a series as its shard's store keeps it.
//! - [`book`]: where series are kept, and the lock of each.
//! - [`driver`]: parks each series' next occurrence shortly before it is
//!   due, and what a downtime policy fires.
//! - [`service`]: the calls (create, get, list, update, pause, resume,
//!   delete), served as [`SeriesCalls`](crate::scheduler::SeriesCalls).
//! - [`tally`]: how many series each tenant has, for its bound.
//!
//! Once parked, an occurrence is a message like any other: it is
//! delivered, cancelled, listed and reconciled as one, so everything
//! hourglass promises of a message holds for each occurrence.

pub(crate) mod book;
pub(crate) mod driver;
pub(crate) mod record;
pub(crate) mod rule;
mod service;
pub(crate) mod spec;
mod tally;

use std::sync::Arc;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{auth::Grants, clock::Clock, node::Node, service::Service};

/// The series of this node's shards.
pub(crate) struct Series {
    book: book::Book,
    clock: Arc<dyn Clock>,
    /// Checks a template as a schedule request's record is checked.
    service: Arc<Service>,
    /// Told when a call changed a series: the driver looks again.
    wake: Notify,
    /// What a new series may be, and how many a tenant may have.
    limits: spec::Limits,
    /// Held shared while a series is made or deleted, alone while a
    /// tenant's series are counted: a count sees no write of this node's
    /// in flight (see [`tally`]).
    making: tokio::sync::RwLock<()>,
    /// How many series each tenant has, as last counted.
    tally: tally::Tally,
    /// What each tenant's tokens cover now: a series whose tenant lost its
    /// topic (the tokens file was narrowed) is paused by the driver.
    grants: Arc<dyn Grants>,
}

impl Series {
    /// The series of the shards `node` serves: standalone every shard; in
    /// a cluster those it owns now, whose changes go through the schedule
    /// log (see [`Node::write_series`]).
    pub(crate) fn new(
        node: Arc<Node>,
        service: Arc<Service>,
        clock: Arc<dyn Clock>,
        limits: spec::Limits,
        grants: Arc<dyn Grants>,
    ) -> Series {
        Series {
            book: book::Book::new(node),
            clock,
            service,
            wake: Notify::new(),
            limits,
            making: tokio::sync::RwLock::new(()),
            tally: tally::Tally::default(),
            grants,
        }
    }

    /// How many shards the ids are spread over: where each occurrence's id
    /// is placed ([`spec::occurrence_id`]).
    fn shards(&self) -> u32 {
        self.book.node().shard_count() as u32
    }

    /// Starts the driver, which parks occurrences until `stop`.
    pub(crate) fn start(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(driver::run(Arc::clone(self), stop))
    }
}
