//! The integration tests, in one binary: one build and one link for all
//! of them, and one executable on disk instead of one per file. Each file
//! is a module named for what it tests: `cargo test --test it races::`
//! runs one of them; `-- --list` lists every test. The few that read the
//! metrics of servers they start in the test process (`tests/*.rs`) keep a
//! process of their own: the Prometheus registry is one per process.

mod common;

mod architecture;
mod audit;
mod backup;
mod bad_input;
mod cli;
mod clients;
mod cluster;
mod cluster_nodes;
mod console;
mod corruption;
mod dead_letter;
mod deadline;
mod delivery;
mod deploy;
mod docs;
mod durability;
mod examples;
mod forged;
mod history;
mod hung_peer;
mod ingress;
mod inspect;
mod kubernetes;
mod labels;
mod let_go;
mod log_topic;
mod own_topics;
mod poison;
mod policy;
mod races;
mod reliability;
mod resources;
mod secured;
mod security;
mod series;
mod standby;
// Its scenario crashes a node at a fail point.
#[cfg(feature = "failpoints")]
mod takeover;
mod tenants;
mod trace;
mod upgrade;
mod upsert;
mod volume;
mod web;
