//! # hourglass
//!
//! Delayed delivery for Apache Kafka. A client schedules a Kafka record for
//! later over gRPC; hourglass parks it durably in RocksDB and produces it to
//! its topic when it is due, recording where it landed.
//!
//! The modules follow a message's journey:
//!
//! ```text
//! client ─gRPC─► api ─► service ─► node ─► store (CFs: due, messages, checkpoint) ─► dispatcher ─► kafka ─► topic
//!                                   │        ▲                                          │ delivery report
//!                          one shard per id  └──────────── checkpoint ◄─────────────────┘
//! ```
//!
//! - [`api`]: the gRPC adapter over a [`scheduler::Scheduler`], the seam of
//!   the calls hourglass serves; decides nothing. Standalone it serves
//!   [`api::Local`] (this node's service); in cluster mode the cluster's
//!   router, which serves each call here or on its shard's owner. Every
//!   error becomes a status in one table, [`status`].
//! - [`bulk`]: calls on many messages (cancel by label selector), made of
//!   the one-message calls of a [`scheduler::Scheduler`], page by page.
//! - [`service`]: what a request means; validation against [`message::Limits`]
//!   and the Kafka topic catalog, due times from the [`clock`], ids for
//!   messages sent without one.
//! - [`node`]: the shards a process serves, reached through a seam,
//!   [`node::ShardSet`] (standalone [`node::LocalShards`], every shard
//!   opened here; in cluster mode the cluster); routes each id to its shard
//!   by Kafka's murmur2 key hash, and merges what spans shards (batches,
//!   `List`, `Stats`, health).
//! - [`cluster`]: cluster mode (`--cluster`): each shard's store is a view
//!   of one partition of the schedule log; a change is decided, appended
//!   to the log, applied from it, and only then answered, and the
//!   dispatcher's settles go the same way. The cluster is then the node's
//!   `ShardSet` (the shards this node owns now), and its router passes
//!   calls on to the node that owns their shard.
//! - [`shard`]: one store, the dispatcher that drains it, and their upkeep.
//! - [`store`]: RocksDB with three column families; one writer thread per
//!   store commits every change as one atomic, group-committed `WriteBatch`.
//! - [`dispatcher`]: sleeps until the earliest message is due, produces, and
//!   settles each delivery (partition, offset) in the checkpoint CF.
//! - [`kafka`]: the idempotent producer (or, with `--delivery exactly-once`,
//!   one transactional producer per shard) and the cached topic metadata.
//! - [`message`]: the domain: ids, due times, envelopes, states; no I/O.
//! - [`auth`]: bearer tokens, the tenant each belongs to and the topics each
//!   may use, handed to every service method as the caller's
//!   [`auth::Access`]; [`tls`]: the gRPC port's certificates; [`secret`]:
//!   Kafka secrets from the environment or files, kept out of logs.
//! - [`audit`]: one structured log line per change a caller makes (who,
//!   what, the outcome), under the target `hourglass::audit`.
//! - [`otel`]: trace context kept on the records of traced Schedule
//!   calls, and with `--otlp-endpoint` the OTLP spans of the call and of
//!   the dispatch, linked.
//! - [`console`]: the operator console, web pages over the same
//!   [`scheduler::Scheduler`] seam as the gRPC adapter, with the same
//!   grants (`--console-listen`).
//! - [`web`]: the doors beside gRPC on its port: every unary call as JSON
//!   over HTTP (the Connect protocol), gRPC-Web, the OpenAPI document;
//!   each transcoded into the gRPC call it stands for.
//! - [`server`]: wiring (from [`config`], each setting declared once), the
//!   bounds on what clients can hold (connections, health watches; calls and
//!   request bytes are bounded in [`api`]), and ordered shutdown.
//!
//! Modules depend downward only, in this order from the top: `server`;
//! `console`, `web`, `api`; `bulk`; `service`; `cluster`; `node`; `scheduler`, `status`; `shard`; `dispatcher`; `kafka`, `store`,
//! `auth`; `config`, `tls`, `secret`, `message`, `clock`, `metrics` and the
//! other leaves. `tests/it/architecture.rs` fails on an import that would close
//! a circle, and on any module but the wiring (`server`) that imports
//! `cluster`: cluster mode plugs in through seams. The `hourglass` binary (`src/bin/hourglass`: the command line
//! and the client subcommands) is built on this library; the bench and the
//! test kit are crates of their own (`bench/`, `testkit/`). Only the modules
//! those and the tests name are public; the rest (the command vocabulary,
//! the dispatcher, the node, the series, the console...) are the crate's
//! own, and the architecture test keeps it so; within a public module, an
//! item its users cannot reach is the crate's own too (`unreachable_pub`).

#![warn(unreachable_pub)]

pub(crate) mod admin;
pub mod api;
pub(crate) mod audit;
pub mod auth;
pub(crate) mod bulk;
pub mod clock;
pub mod cluster;
pub(crate) mod command;
pub mod config;
pub(crate) mod console;
pub(crate) mod dispatcher;
mod error;
pub(crate) mod failpoint;
pub(crate) mod ingress;
pub mod kafka;
pub mod memory;
pub mod message;
pub mod metrics;
pub(crate) mod node;
pub(crate) mod otel;
pub(crate) mod policy;
pub(crate) mod scheduler;
pub mod secret;
pub(crate) mod series;
pub mod server;
pub(crate) mod service;
pub(crate) mod shard;
pub(crate) mod status;
pub mod store;
pub(crate) mod tls;
pub(crate) mod watched;
pub(crate) mod web;

pub use error::Error;

/// The version of this build (`Cargo.toml`'s).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit this build was made from and its date (`0123456789ab
/// 2026-12-05`), or `unknown` for a build outside a git checkout that was
/// not told (`HOURGLASS_COMMIT` at build time).
pub const COMMIT: &str = env!("HOURGLASS_COMMIT");
pub use server::{Listeners, run, run_with_clock};

/// The wire types and the gRPC service, generated from
/// `proto/hourglass/v1/hourglass.proto`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("hourglass.v1");

    /// Descriptors served by gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("hourglass_descriptor");
}
