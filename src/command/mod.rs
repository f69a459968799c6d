//! What a shard is asked and what it answers: the vocabulary the doors
//! (the service, the cluster, the series driver) and the dispatcher share
//! with the store, in domain terms. How the store lays any of it out in
//! bytes is the store's own (`store::schema`, private to it).

mod change;
mod counts;
mod dispatch;
mod due;
mod error;
mod record;
mod table;

pub(crate) use change::{Answer, Intent, NewId, NewMessage};
pub(crate) use counts::Counts;
pub(crate) use dispatch::{DeadLettered, DueBatch, Handed, InDoubt, Outcome, Ready, Settle, Tries};
pub(crate) use due::DispatchKey;
pub use error::StoreError;
pub(crate) use record::{HeaderRecord, LabelRecord, MessageRecord};
pub(crate) use table::{IngressPosition, Place, Row, RowValue, Spread, Table};
