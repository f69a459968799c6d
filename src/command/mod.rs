//! What a shard is asked and what it answers: the vocabulary the doors
//! (the service, the cluster, the series driver) and the dispatcher share
//! with the store, in domain terms. How the store lays any of it out in
//! bytes is the store's own (`store::schema`, private to it).

mod counts;
mod due;
mod record;

pub use counts::Counts;
pub use due::DispatchKey;
pub use record::{HeaderRecord, LabelRecord, MessageRecord};
