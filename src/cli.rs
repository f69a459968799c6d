//! The command line: `hourglass serve` and the client subcommands. Every
//! flag can also come from an `HOURGLASS_*` environment variable; the doc
//! comments are the `--help` text.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::{
    config::{Config, ConfigError, Durability},
    secret::{self, Origin, Secret},
};

#[derive(Debug, Parser)]
#[command(name = "hourglass", version, about = "Delayed delivery for Apache Kafka", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server: accept messages over gRPC, park them, produce them when due.
    Serve(Box<ServeArgs>),
    /// Schedule a message for later delivery.
    Schedule(ScheduleArgs),
    /// Cancel a pending message; says whether it was cancelled or already settled.
    Cancel(IdArgs),
    /// Move a pending (or failed) message to a new due time.
    Reschedule(RescheduleArgs),
    /// Show a message, its due time and its state.
    Get(IdArgs),
    /// List pending messages in the order they will be produced, a page at a
    /// time; filter by topic and dispatch-time range.
    List(ListArgs),
    /// Counts by state, the oldest overdue message, the store's size.
    Stats(StatsArgs),
    /// Measure ingest, drain, precision and footprint against a real broker
    /// and store, beside the machine's own limits; prints one table.
    Bench(BenchArgs),
}

fn duration(s: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(s)
}

/// Flags of `hourglass serve`. Unset flags fall back to the config file, then
/// to the defaults shown.
#[derive(Debug, Default, Args)]
pub struct ServeArgs {
    /// TOML config file; flags and environment variables override it.
    #[arg(long, env = "HOURGLASS_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listen address [default: 127.0.0.1:50051]
    #[arg(long, env = "HOURGLASS_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Prometheus /metrics listen address [default: 127.0.0.1:9464]
    #[arg(long, env = "HOURGLASS_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Directory of the RocksDB store [default: ./hourglass-data]
    #[arg(long, env = "HOURGLASS_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Kafka bootstrap servers, host:port[,host:port] [default: 127.0.0.1:9092]
    #[arg(long, env = "HOURGLASS_KAFKA_BROKERS")]
    pub kafka_brokers: Option<String>,
    /// librdkafka producer property KEY=VALUE, repeatable (e.g.
    /// security.protocol=SASL_SSL). A VALUE of env:NAME or file:/path is read
    /// from there at start-up. In the environment, HOURGLASS_KAFKA_PROPERTIES
    /// takes them comma-separated, with \, for a comma inside a value.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_properties: Vec<Secret>,
    /// When a change is acknowledged: after fsync (sync) or after the OS has
    /// the write (buffered: loses the last moments on power loss) [default: sync]
    #[arg(long, env = "HOURGLASS_DURABILITY", value_enum)]
    pub durability: Option<Durability>,
    /// How long delivered/cancelled/failed messages stay queryable [default: 7d]
    #[arg(long, env = "HOURGLASS_RETENTION", value_parser = duration)]
    pub retention: Option<Duration>,
    /// Latest due time accepted, counted from now [default: 3 years]
    #[arg(long, env = "HOURGLASS_MAX_DELAY", value_parser = duration)]
    pub max_delay: Option<Duration>,
    /// Largest message (key + value + headers) in bytes [default: 1048576]
    #[arg(long, env = "HOURGLASS_MAX_MESSAGE_BYTES")]
    pub max_message_bytes: Option<usize>,
    /// Most headers on one message [default: 64]
    #[arg(long, env = "HOURGLASS_MAX_HEADERS")]
    pub max_headers: Option<usize>,
    /// Most bytes of headers on one message [default: 65536]
    #[arg(long, env = "HOURGLASS_MAX_HEADERS_BYTES")]
    pub max_headers_bytes: Option<usize>,
    /// Most items in one ScheduleBatch call [default: 10000]
    #[arg(long, env = "HOURGLASS_MAX_BATCH")]
    pub max_batch: Option<usize>,
    /// Largest ScheduleBatch request in bytes [default: 16777216]
    #[arg(long, env = "HOURGLASS_MAX_BATCH_BYTES")]
    pub max_batch_bytes: Option<usize>,
    /// Requests one ScheduleStream may have unanswered before the server
    /// stops reading it [default: 8192]
    #[arg(long, env = "HOURGLASS_STREAM_WINDOW")]
    pub stream_window: Option<usize>,
    /// gRPC calls served at once; more are refused at once with
    /// RESOURCE_EXHAUSTED [default: 4096]
    #[arg(long, env = "HOURGLASS_MAX_CONCURRENT_REQUESTS")]
    pub max_concurrent_requests: Option<usize>,
    /// Messages pending at once; new ones are refused with
    /// RESOURCE_EXHAUSTED and health turns NOT_SERVING until deliveries make
    /// room. 0: no cap [default: 0]
    #[arg(long, env = "HOURGLASS_MAX_PENDING")]
    pub max_pending: Option<u64>,
    /// Read every entry of the store with its checksum in the background
    /// after start-up, so that damage stops hourglass with a clear error at
    /// once; false leaves damage to be found when it is read [default: true]
    #[arg(long, env = "HOURGLASS_VERIFY_ON_START", value_name = "BOOL")]
    pub verify_on_start: Option<bool>,
    /// Messages produced and not yet acknowledged by Kafka [default: 10000]
    #[arg(long, env = "HOURGLASS_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// Times the broker may refuse a message (or its topic) before it is
    /// failed; --fail-after must have passed too [default: 5]
    #[arg(long, env = "HOURGLASS_MAX_DELIVERY_ATTEMPTS")]
    pub max_delivery_attempts: Option<u32>,
    /// How long the broker must have refused a message (or its topic, e.g.
    /// deleted or not authorised) before it is failed; a shorter refusal
    /// only delays it [default: 10m]
    #[arg(long, env = "HOURGLASS_FAIL_AFTER", value_parser = duration)]
    pub fail_after: Option<Duration>,
    /// A produce Kafka has not answered for this long holds the other
    /// messages of its topic back, so that it cannot hold every topic's
    /// [default: 10s]
    #[arg(long, env = "HOURGLASS_STALL_AFTER", value_parser = duration)]
    pub stall_after: Option<Duration>,
    /// First retry delay after a failed produce; doubles each try [default: 200ms]
    #[arg(long, env = "HOURGLASS_RETRY_BACKOFF", value_parser = duration)]
    pub retry_backoff: Option<Duration>,
    /// Longest retry delay [default: 30s]
    #[arg(long, env = "HOURGLASS_RETRY_BACKOFF_MAX", value_parser = duration)]
    pub retry_backoff_max: Option<Duration>,
    /// How often topic metadata is refreshed [default: 30s]
    #[arg(long, env = "HOURGLASS_METADATA_REFRESH", value_parser = duration)]
    pub metadata_refresh: Option<Duration>,
    /// How long shutdown waits for requests and produces in flight [default: 10s]
    #[arg(long, env = "HOURGLASS_SHUTDOWN_GRACE", value_parser = duration)]
    pub shutdown_grace: Option<Duration>,
    /// PEM certificate (chain) for TLS on the gRPC port; needs --tls-key
    #[arg(long, env = "HOURGLASS_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert
    #[arg(long, env = "HOURGLASS_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s): only clients with a certificate signed by it
    /// get in (mutual TLS); needs --tls-cert and --tls-key
    #[arg(long, env = "HOURGLASS_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Tokens file (TOML): every call but health then needs
    /// `authorization: Bearer <token>`, and each token may schedule to its
    /// listed topics only. Reloaded on SIGHUP [default: no authentication]
    #[arg(long, env = "HOURGLASS_AUTH_TOKENS", value_name = "FILE")]
    pub auth_tokens: Option<PathBuf>,
    /// HTTP/2 streams (calls) one connection may have open at once; the
    /// client waits for a free one. 0: no limit [default: 128]
    #[arg(long, env = "HOURGLASS_MAX_STREAMS_PER_CONNECTION")]
    pub max_streams_per_connection: Option<u32>,
    /// gRPC connections open at once; further ones wait to be accepted
    /// [default: 1024]
    #[arg(long, env = "HOURGLASS_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Bytes of request bodies the server holds at once, across all calls;
    /// a call that would take more is refused with RESOURCE_EXHAUSTED
    /// [default: 268435456]
    #[arg(long, env = "HOURGLASS_MAX_REQUEST_MEMORY")]
    pub max_request_memory: Option<usize>,
    /// A ScheduleStream with nothing unanswered that sends nothing for this
    /// long is ended with UNAVAILABLE [default: 2m]
    #[arg(long, env = "HOURGLASS_STREAM_IDLE_TIMEOUT", value_parser = duration)]
    pub stream_idle_timeout: Option<Duration>,
    /// gRPC health Watch streams open at once (they need no token); more
    /// are refused with RESOURCE_EXHAUSTED [default: 64]
    #[arg(long, env = "HOURGLASS_MAX_HEALTH_WATCHES")]
    pub max_health_watches: Option<usize>,
}

/// The environment variable that holds Kafka properties, comma-separated.
pub const KAFKA_PROPERTIES_ENV: &str = "HOURGLASS_KAFKA_PROPERTIES";

impl ServeArgs {
    /// Defaults, then the config file, then the environment and these
    /// flags; validated.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let listed = std::env::var(KAFKA_PROPERTIES_ENV).ok().map(Secret::new);
        self.into_config_with(listed)
    }

    /// As [`ServeArgs::into_config`], with `listed` as the value of
    /// `HOURGLASS_KAFKA_PROPERTIES`.
    pub fn into_config_with(self, listed: Option<Secret>) -> Result<Config, ConfigError> {
        let mut c = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        macro_rules! set {
            ($($field:ident),*) => { $( if let Some(v) = self.$field { c.$field = v; } )* };
        }
        set!(
            listen,
            metrics_listen,
            data_dir,
            kafka_brokers,
            durability,
            retention,
            max_delay,
            max_message_bytes,
            max_headers,
            max_headers_bytes,
            max_batch,
            max_batch_bytes,
            stream_window,
            max_concurrent_requests,
            max_pending,
            verify_on_start,
            max_in_flight,
            max_delivery_attempts,
            retry_backoff,
            retry_backoff_max,
            metadata_refresh,
            shutdown_grace,
            max_streams_per_connection,
            fail_after,
            stall_after,
            max_connections,
            max_request_memory,
            stream_idle_timeout,
            max_health_watches
        );
        for (flag, field) in [
            (self.tls_cert, &mut c.tls_cert),
            (self.tls_key, &mut c.tls_key),
            (self.tls_client_ca, &mut c.tls_client_ca),
            (self.auth_tokens, &mut c.auth_tokens),
        ] {
            if flag.is_some() {
                *field = flag;
            }
        }
        // The environment's list, then the flags; the list's items are
        // checked here, where their positions are known, and named by them.
        for (n, key, value) in
            listed.as_ref().map(|l| secret::parse_list(l.expose())).transpose()?.unwrap_or_default()
        {
            secret::check_property(&key, &value, Origin::ListItem(n))?;
            c.kafka_properties.insert(key, value);
        }
        for (n, property) in (1..).zip(&self.kafka_properties) {
            let (k, v) = property.expose().split_once('=').ok_or_else(|| {
                ConfigError::Invalid(format!("--kafka-property number {n} is not KEY=VALUE"))
            })?;
            c.kafka_properties.insert(k.trim().to_owned(), v.trim().to_owned());
        }
        c.validate()?;
        Ok(c)
    }
}

/// Flags of `hourglass bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Run at the scale the targets are set for (10M parked, 1M drained;
    /// about seven minutes here) instead of the reduced default (a few minutes).
    #[arg(long)]
    pub full: bool,
    /// Multiply every count by this, e.g. 0.01 for a smoke run.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Kafka bootstrap servers to run against; without it a local Tansu
    /// broker is started on a free port.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Also write the figures as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Where the stores go (a temporary directory in it); it decides which
    /// disk is measured [default: the system temp dir]
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Durability of the server and of the raw store limit.
    #[arg(long, value_enum, default_value = "sync")]
    pub durability: Durability,
    /// Partitions of the bench topic.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Record value size in bytes.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Concurrent callers of unary Schedule.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// HTTP/2 connections those callers share [default: one each]
    #[arg(long)]
    pub connections: Option<usize>,
    /// Items per ScheduleBatch call.
    #[arg(long, default_value_t = 1000)]
    pub batch_size: usize,
    /// Concurrent ScheduleBatch callers.
    #[arg(long, default_value_t = 4)]
    pub batch_callers: usize,
    /// Concurrent ScheduleStream calls.
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
}

impl BenchArgs {
    pub fn settings(&self) -> Result<crate::bench::Settings, String> {
        if !(self.scale > 0.0 && self.scale <= 100.0) {
            return Err(format!("--scale {} must be above 0 and at most 100", self.scale));
        }
        if self.partitions < 1 || self.clients == 0 || self.batch_size == 0 || self.streams == 0 {
            return Err("--partitions, --clients, --batch-size and --streams must be at least 1".into());
        }
        let scale = if self.full { crate::bench::Scale::full() } else { crate::bench::Scale::reduced() };
        Ok(crate::bench::Settings {
            scale: scale.times(self.scale),
            brokers: self.brokers.clone(),
            dir: self.dir.clone(),
            durability: self.durability,
            partitions: self.partitions,
            value_bytes: self.value_bytes,
            clients: self.clients,
            connections: self.connections.unwrap_or(self.clients),
            batch_size: self.batch_size,
            batch_callers: self.batch_callers.max(1),
            streams: self.streams,
        })
    }
}

/// Flags every client subcommand takes.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// Address of the hourglass server.
    #[arg(long, env = "HOURGLASS_SERVER", default_value = "http://127.0.0.1:50051")]
    pub server: String,
    /// Bearer token, for a server with --auth-tokens.
    #[arg(long, env = "HOURGLASS_TOKEN", hide_env_values = true)]
    pub token: Option<Secret>,
    /// PEM CA certificate to trust for an https:// server [default: the
    /// system's trusted roots]
    #[arg(long, env = "HOURGLASS_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// PEM client certificate, for a server that requires mutual TLS.
    #[arg(long, env = "HOURGLASS_CLIENT_CERT", value_name = "FILE", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(long, env = "HOURGLASS_CLIENT_KEY", value_name = "FILE", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// What to print: text for people, json for scripts (one object per
    /// line; field names are documented in the README).
    #[arg(long, env = "HOURGLASS_OUTPUT", value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Args)]
#[group(id = "when", required = true, multiple = false)]
pub struct When {
    /// Deliver after this long, e.g. 30s, 15m, 2h 30m.
    #[arg(long, value_parser = duration, group = "when")]
    pub delay: Option<Duration>,
    /// Deliver at this time, RFC 3339, e.g. 2030-01-01T09:00:00Z.
    #[arg(long, group = "when")]
    pub at: Option<chrono::DateTime<chrono::FixedOffset>>,
}

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Kafka topic to deliver to.
    #[arg(long)]
    pub topic: String,
    /// Record value (text).
    #[arg(long)]
    pub value: String,
    /// Record key (text).
    #[arg(long)]
    pub key: Option<String>,
    /// Record header KEY=VALUE, repeatable.
    #[arg(long = "header", value_name = "KEY=VALUE")]
    pub headers: Vec<String>,
    /// Explicit partition (otherwise chosen from the key).
    #[arg(long)]
    pub partition: Option<i32>,
    /// Idempotency key: retrying with the same id never schedules twice.
    #[arg(long)]
    pub id: Option<String>,
    #[command(flatten)]
    pub when: When,
}

#[derive(Debug, Args)]
pub struct IdArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Message id.
    pub id: String,
}

#[derive(Debug, Args)]
pub struct RescheduleArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Message id.
    pub id: String,
    #[command(flatten)]
    pub when: When,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Only messages for this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only messages dispatched at or after this time, RFC 3339.
    #[arg(long)]
    pub from: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// Only messages dispatched before this time, RFC 3339.
    #[arg(long)]
    pub to: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// Messages per page, at most 1000 [default: 100]
    #[arg(long)]
    pub page_size: Option<u32>,
    /// Start at this page (a previous page's next page token).
    #[arg(long)]
    pub page_token: Option<String>,
    /// Follow the pages to the end instead of stopping after one.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("hourglass").chain(args.iter().copied()))
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_flags_override_defaults() {
        let Command::Serve(args) = parse(&[
            "serve",
            "--listen",
            "0.0.0.0:7000",
            "--retention",
            "1h",
            "--kafka-property",
            "compression.type=zstd",
        ])
        .unwrap()
        .command
        else {
            panic!("not serve");
        };
        let config = args.into_config_with(None).unwrap();
        assert_eq!(config.listen.port(), 7000);
        assert_eq!(config.retention, Duration::from_secs(3600));
        assert_eq!(config.kafka_properties["compression.type"], "zstd");
        assert_eq!(config.metrics_listen, Config::default().metrics_listen);
    }

    #[test]
    fn a_malformed_property_is_refused() {
        let args = ServeArgs { kafka_properties: vec![Secret::new("novalue")], ..ServeArgs::default() };
        assert!(args.into_config_with(None).unwrap_err().to_string().contains("KEY=VALUE"));
    }

    /// A password with every character that has tripped a parser.
    const PASSWORD: &str = "Pw1,Xq9=Zk\"Jj";

    #[test]
    fn kafka_properties_from_the_environment_keep_secrets_out_of_errors_and_debug() {
        let escaped = PASSWORD.replace(',', "\\,");
        let listed = Secret::new(format!("security.protocol=SASL_SSL,sasl.password={escaped}"));
        let config = ServeArgs::default().into_config_with(Some(listed)).unwrap();
        assert_eq!(config.kafka_properties["sasl.password"], PASSWORD, "an escaped comma stays in the value");
        // Unescaped, the password splits in two; neither piece may show,
        // nor what parsed the arguments.
        for listed in [format!("sasl.password={PASSWORD}"), "sasl.password=Pw1,Xq9".to_owned()] {
            let err =
                ServeArgs::default().into_config_with(Some(Secret::new(listed))).unwrap_err().to_string();
            assert!(err.contains("HOURGLASS_KAFKA_PROPERTIES"), "{err}");
            for piece in ["Pw1", "Xq9", "Zk", "Jj"] {
                assert!(!err.contains(piece), "{err}");
            }
        }
        let Command::Serve(args) =
            parse(&["serve", "--kafka-property", &format!("sasl.password={PASSWORD}")]).unwrap().command
        else {
            panic!("not serve");
        };
        assert!(!format!("{args:?}").contains("Pw1"), "{args:?}");
        assert_eq!(args.into_config_with(None).unwrap().kafka_properties["sasl.password"], PASSWORD);
        let Command::Get(get) = parse(&["get", "x", "--token", PASSWORD]).unwrap().command else { panic!() };
        assert!(!format!("{get:?}").contains("Pw1"), "{get:?}");
    }

    #[test]
    fn schedule_needs_exactly_one_due_time() {
        assert!(parse(&["schedule", "--topic", "t", "--value", "v"]).is_err());
        assert!(
            parse(&[
                "schedule",
                "--topic",
                "t",
                "--value",
                "v",
                "--delay",
                "1s",
                "--at",
                "2030-01-01T00:00:00Z"
            ])
            .is_err()
        );
        assert!(parse(&["schedule", "--topic", "t", "--value", "v", "--delay", "1m 30s"]).is_ok());
        assert!(parse(&["reschedule", "id1", "--at", "2030-01-01T00:00:00+02:00"]).is_ok());
    }

    #[test]
    fn security_flags_reach_the_config_and_the_client() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, "[[token]]\nname = \"a\"\ntoken = \"t\"\ntopics = [\"*\"]\n").unwrap();
        let tokens = tokens.to_str().unwrap();
        let Command::Serve(args) =
            parse(&["serve", "--auth-tokens", tokens, "--max-streams-per-connection", "64"]).unwrap().command
        else {
            panic!("not serve");
        };
        let config = args.into_config_with(None).unwrap();
        assert_eq!(config.auth_tokens.as_deref(), Some(std::path::Path::new(tokens)));
        assert_eq!(config.max_streams_per_connection, 64);
        let Command::Serve(args) = parse(&["serve", "--tls-cert", "c.pem"]).unwrap().command else {
            panic!("not serve");
        };
        assert!(
            args.into_config_with(None)
                .unwrap_err()
                .to_string()
                .contains("--tls-cert is given without --tls-key")
        );

        assert!(parse(&["get", "id1", "--client-cert", "c.pem"]).is_err(), "a certificate needs its key");
        let Command::Get(args) =
            parse(&["get", "id1", "--token", "t", "--ca-cert", "ca.pem"]).unwrap().command
        else {
            panic!("not get");
        };
        assert_eq!(args.client.token.as_ref().map(Secret::expose), Some("t"));
        assert_eq!(args.client.ca_cert, Some(PathBuf::from("ca.pem")));
    }

    #[test]
    fn every_client_subcommand_takes_output() {
        for args in [
            &["schedule", "--topic", "t", "--value", "v", "--delay", "1s"][..],
            &["cancel", "id1"],
            &["reschedule", "id1", "--delay", "1s"],
            &["get", "id1"],
            &["list", "--topic", "t", "--from", "2030-01-01T00:00:00Z", "--page-size", "5", "--all"],
            &["stats"],
        ] {
            let with = [args, &["--output", "json"]].concat();
            assert!(parse(&with).is_ok(), "{with:?}");
            let bad = [args, &["--output", "yaml"]].concat();
            assert!(parse(&bad).is_err(), "{bad:?}");
        }
        assert!(parse(&["serve", "--output", "json"]).is_err(), "serve prints no answers");
    }
}
