//! The domain: what a scheduled message is, its id, its due time, its states
//! and the limits a message must meet at the door.
//!
//! Plain types only. Nothing here does I/O, so validation and state
//! transitions are unit-tested without RocksDB or Kafka. Knowing whether a
//! topic exists needs the broker's metadata and lives in the service instead.

mod envelope;
mod forecast;
mod id;
mod labels;
mod page;
mod scope;
mod state;
mod time;

pub use envelope::*;
pub use forecast::*;
pub use id::*;
pub use labels::*;
pub use page::*;
pub use scope::*;
pub use state::*;
pub use time::*;

#[cfg(test)]
mod tests;
