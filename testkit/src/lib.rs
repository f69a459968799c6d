//! What hourglass's integration tests and its bench start around the
//! product: a local Kafka-protocol broker on a free port ([`LocalBroker`],
//! Tansu), the real `hourglass serve` as a child process
//! ([`ServerProcess`]), free ports, topics, another producer's traffic, a
//! cluster's routes, a headless browser ([`Browser`]). Test tools only: nothing here
//! ships in the server.

mod broker;
mod browser;
mod routes;
mod server;
mod traffic;

pub use broker::{LocalBroker, create_topic, delete_topic, free_port, free_port_pair, listening};
pub use browser::{Browser, Element};
pub use routes::shards_owned_by;
pub use server::{
    ServerProcess, ThreadUse, cluster_key_file, cpu_seconds_of, hourglass_binary, rss_of, series_value,
    threads_of,
};
pub use traffic::other_producer;
