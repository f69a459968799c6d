//! # hourglass
//!
//! Delayed delivery for Apache Kafka. A client schedules a Kafka record for
//! later over gRPC; hourglass parks it durably in RocksDB and produces it to
//! its topic when it is due, recording where it landed.
//!
//! The modules follow a message's journey:
//!
//! ```text
//! client ─gRPC─► api ─► service ─► store (CFs: due, messages, checkpoint) ─► dispatcher ─► kafka ─► topic
//!                                    ▲                                          │ delivery report
//!                                    └──────────── checkpoint ◄─────────────────┘
//! ```
//!
//! - [`api`]: the gRPC adapter; converts and calls, decides nothing.
//! - [`service`]: what a request means; validation against [`message::Limits`]
//!   and the Kafka topic catalog, due times from the [`clock`].
//! - [`message`]: the domain: ids, due times, envelopes, states.
//! - [`store`]: RocksDB with three column families; one writer thread
//!   commits every change as one atomic, group-committed `WriteBatch`.
//! - [`dispatcher`]: sleeps until the earliest due time, produces, and
//!   settles each delivery (partition, offset) in the checkpoint CF.
//! - [`kafka`]: the idempotent producer and the cached topic metadata.
//! - [`shard`]: one store plus its dispatcher, the unit a process owns.
//! - [`auth`]: bearer tokens, the tenant each belongs to and the topics each
//!   may use, handed to every service method as the caller's
//!   [`auth::Access`]; [`tls`]: the gRPC port's certificates; [`secret`]:
//!   Kafka secrets from the environment or files, kept out of logs.
//! - [`server`]: wiring, the bounds on what clients can hold (connections,
//!   health watches; calls and request bytes are bounded in [`api`]), and
//!   ordered shutdown; [`config`] and [`cli`] feed it.

pub mod api;
pub mod auth;
pub mod bench;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod dispatcher;
mod error;
pub mod failpoint;
pub mod kafka;
pub mod memory;
pub mod message;
pub mod metrics;
pub mod secret;
pub mod server;
pub mod service;
pub mod shard;
pub mod store;
pub mod tls;

pub use error::Error;
pub use server::{Listeners, run, run_with_clock};

/// The wire types and the gRPC service, generated from
/// `proto/hourglass/v1/hourglass.proto`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("hourglass.v1");

    /// Descriptors served by gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("hourglass_descriptor");
}
