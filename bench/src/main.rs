//! `hourglass-bench`: measures ingest, drain, precision and footprint of the
//! real `hourglass serve` (the binary beside this one, or `$HOURGLASS_BIN`)
//! against a real broker and store, beside the machine's own limits; prints
//! one table. See docs/BENCHMARKS.md.

use std::{path::PathBuf, process::ExitCode};

use clap::Parser;
use hourglass::store::Durability;
use hourglass_bench::{MOCK, Phase, Scale, Settings, cluster::ClusterSettings};

// The server's allocator and settings, for every allocation of the limits
// measured here too (librdkafka's and RocksDB's among them): a limit
// measured with glibc's malloc would be the same work done slower.
hourglass::memory::jemalloc!();

/// Measure ingest, drain, precision and footprint of hourglass against a
/// real broker and store, beside the machine's own limits; prints one table.
#[derive(Debug, Parser)]
#[command(name = "hourglass-bench", version)]
struct Args {
    /// Run at the scale the targets are set for (10M parked, 1M drained;
    /// about seven minutes here) instead of the reduced default (a few minutes).
    #[arg(long)]
    full: bool,
    /// Multiply every count by this, e.g. 0.01 for a smoke run.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Kafka bootstrap servers to run against, or `mock` for librdkafka's
    /// mock cluster in this process (it has transactions, which Tansu 0.6
    /// has not); without it a local Tansu broker is started on a free port.
    #[arg(long)]
    brokers: Option<String>,
    /// How the server delivers: idempotent, or exactly-once (Kafka
    /// transactions; needs a broker that has them, such as `--brokers mock`).
    #[arg(long, default_value = "idempotent")]
    delivery: hourglass::config::DeliveryMode,
    /// Also write the figures as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Where the stores go (a temporary directory in it); it decides which
    /// disk is measured [default: the system temp dir]
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Durability of the server and of the raw store limit.
    #[arg(long, default_value = "sync")]
    durability: Durability,
    /// Partitions of the bench topic.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Record value size in bytes.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Concurrent callers of unary Schedule.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// HTTP/2 connections those callers share [default: one each]
    #[arg(long)]
    connections: Option<usize>,
    /// Items per ScheduleBatch call.
    #[arg(long, default_value_t = 1000)]
    batch_size: usize,
    /// Concurrent ScheduleBatch callers.
    #[arg(long, default_value_t = 4)]
    batch_callers: usize,
    /// Concurrent ScheduleStream calls.
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// Trace every call: each carries a sampled W3C `traceparent`, and
    /// the server exports its spans (`--otlp-endpoint`) to an OTLP
    /// collector in the bench, which counts them. Compare a run with it
    /// and one without for tracing's cost.
    #[arg(long)]
    trace: bool,
    /// Run only these phases (the limits and the parked backlog always
    /// run), e.g. `--only drain,burst` while working on one figure.
    #[arg(long, value_delimiter = ',', value_name = "PHASE")]
    only: Vec<Phase>,
    /// Measure a cluster of this many nodes (`hourglass serve --cluster`
    /// processes on this machine sharing the broker) instead of one
    /// standalone server: ingest, drain, failover after a SIGKILL, and
    /// restore from the log. Phases: ingest, drain, failover, restore.
    #[arg(long, value_name = "NODES")]
    cluster: Option<usize>,
    /// Cluster mode: the schedule log's partitions.
    #[arg(long, default_value_t = 12)]
    log_partitions: u32,
    /// Cluster mode: standby replicas of each shard.
    #[arg(long, default_value_t = 1)]
    standby_replicas: u32,
    /// Runs as a member of a bare consumer group until killed (the
    /// cluster bench measures the group's own failover with it).
    #[arg(long, hide = true, num_args = 4, value_names = ["BROKERS", "GROUP", "TOPIC", "SESSION_MS"])]
    group_member: Vec<String>,
}

impl Args {
    fn settings(&self) -> Result<Settings, String> {
        if !(self.scale > 0.0 && self.scale <= 100.0) {
            return Err(format!("--scale {} must be above 0 and at most 100", self.scale));
        }
        if self.partitions < 1 || self.clients == 0 || self.batch_size == 0 || self.streams == 0 {
            return Err("--partitions, --clients, --batch-size and --streams must be at least 1".into());
        }
        if self.cluster.is_some_and(|n| n < 2) {
            return Err("--cluster needs at least 2 nodes: its failover phase kills one".into());
        }
        if self.cluster.is_some() && self.brokers.as_deref() == Some(MOCK) {
            return Err("--cluster needs a broker that creates topics; the mock cluster does not".into());
        }
        if self.trace && self.cluster.is_some() {
            return Err("--trace measures one standalone server: leave out --cluster".into());
        }
        if self.log_partitions == 0 {
            return Err("--log-partitions must be at least 1".into());
        }
        let scale = if self.full { Scale::full() } else { Scale::reduced() };
        Ok(Settings {
            scale: scale.times(self.scale),
            brokers: self.brokers.clone(),
            delivery: self.delivery,
            dir: self.dir.clone(),
            durability: self.durability,
            partitions: self.partitions,
            value_bytes: self.value_bytes,
            clients: self.clients,
            connections: self.connections.unwrap_or(self.clients),
            batch_size: self.batch_size,
            batch_callers: self.batch_callers.max(1),
            streams: self.streams,
            trace: self.trace,
            phases: if self.only.is_empty() { Phase::ALL.to_vec() } else { self.only.clone() },
            cluster: self.cluster.map(|nodes| ClusterSettings {
                nodes,
                log_partitions: self.log_partitions,
                standby_replicas: self.standby_replicas,
            }),
        })
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let [brokers, group, topic, session] = args.group_member.as_slice() {
        let session = std::time::Duration::from_millis(session.parse().unwrap_or(6_000));
        return match hourglass_bench::limits::group_member(brokers, group, topic, session) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let settings = match args.settings() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(hourglass_bench::main(settings, args.json)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arguments_are_consistent_and_checked() {
        use clap::CommandFactory;
        Args::command().debug_assert();
        let args = Args::try_parse_from(["hourglass-bench", "--scale", "0"]).unwrap();
        assert!(args.settings().unwrap_err().contains("--scale"));
        let args = Args::try_parse_from(["hourglass-bench", "--durability", "buffered"]).unwrap();
        assert_eq!(args.settings().unwrap().durability, Durability::Buffered);
        assert_eq!(args.settings().unwrap().phases, Phase::ALL);
        let args = Args::try_parse_from(["hourglass-bench", "--only", "drain,burst"]).unwrap();
        assert_eq!(args.settings().unwrap().phases, [Phase::Drain, Phase::Burst]);
        assert!(Args::try_parse_from(["hourglass-bench", "--only", "everything"]).is_err());
        let args = Args::try_parse_from(["hourglass-bench", "--trace", "--cluster", "3"]).unwrap();
        assert!(args.settings().unwrap_err().contains("--trace"));
    }
}
