//! Server configuration: defaults, the optional TOML file, validation, and
//! the pieces each part of the server is built from.
//!
//! Precedence, highest first: command-line flag, `HOURGLASS_*` environment
//! variable, config file (`--config`), built-in default.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::{
    dispatcher::DispatcherConfig,
    kafka::KafkaConfig,
    message::Limits,
    secret::{self, Origin, Properties},
    shard::ShardConfig,
    store::StoreConfig,
};

/// When an acknowledged change is safe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Acknowledge after the WAL is fsynced: survives a power loss or a
    /// kernel crash. Concurrent requests share fsyncs (group commit).
    #[default]
    Sync,
    /// Acknowledge after the WAL write reached the OS: survives a crash of
    /// hourglass itself, but a power loss or kernel crash can lose the last
    /// few hundred milliseconds of acknowledged changes.
    Buffered,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// gRPC address. Default 127.0.0.1:50051.
    pub listen: SocketAddr,
    /// Prometheus `/metrics` address. Default 127.0.0.1:9464.
    pub metrics_listen: SocketAddr,
    /// Where the RocksDB store lives. Default ./hourglass-data.
    pub data_dir: PathBuf,
    /// Kafka bootstrap servers. Default 127.0.0.1:9092.
    pub kafka_brokers: String,
    /// librdkafka producer properties, passed through (SASL, SSL, ...).
    /// A value may be `env:NAME` or `file:/path` (see `secret`). `Debug`
    /// hides secret values.
    pub kafka_properties: Properties,
    /// Default sync.
    pub durability: Durability,
    /// How long settled messages stay queryable. Default 7d.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Latest due time accepted, from now. Default 3 years.
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
    /// Key + value + headers of one message. Default 1 MiB.
    pub max_message_bytes: usize,
    /// Default 64.
    pub max_headers: usize,
    /// Default 64 KiB.
    pub max_headers_bytes: usize,
    /// Items in one `ScheduleBatch` call. Default 10000.
    pub max_batch: usize,
    /// Encoded size of one `ScheduleBatch` request. Default 16 MiB.
    pub max_batch_bytes: usize,
    /// Requests on one `ScheduleStream` read ahead of their answers.
    /// Default 8192.
    pub stream_window: usize,
    /// gRPC calls served at once; more are refused with RESOURCE_EXHAUSTED.
    /// Default 4096.
    pub max_concurrent_requests: usize,
    /// Messages pending at once; new ones are refused with
    /// RESOURCE_EXHAUSTED beyond it. 0 (the default): no cap.
    pub max_pending: u64,
    /// Read the whole store with checksums in the background after
    /// start-up. Default true.
    pub verify_on_start: bool,
    /// Messages produced and not yet acknowledged. Default 10000.
    pub max_in_flight: usize,
    /// Refusals by the broker before a message is failed. Default 5.
    pub max_delivery_attempts: u32,
    /// How long the broker must have refused a message (or its topic)
    /// before it is failed, tries permitting. Default 10m.
    #[serde(with = "humantime_serde")]
    pub fail_after: Duration,
    /// A produce Kafka has not answered for this long holds its topic's
    /// other messages back (the rest go on). Default 10s.
    #[serde(with = "humantime_serde")]
    pub stall_after: Duration,
    /// First retry delay after a failed produce, doubling. Default 200ms.
    #[serde(with = "humantime_serde")]
    pub retry_backoff: Duration,
    /// Longest retry delay. Default 30s.
    #[serde(with = "humantime_serde")]
    pub retry_backoff_max: Duration,
    /// How often topic metadata is refreshed. Default 30s.
    #[serde(with = "humantime_serde")]
    pub metadata_refresh: Duration,
    /// How long shutdown waits for requests and produces in flight. Default 10s.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// PEM certificate (chain) of the gRPC port; with `tls_key`, the port
    /// speaks TLS only. Default: none, plaintext.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s): clients must present a certificate signed by
    /// one (mutual TLS). Default: none.
    pub tls_client_ca: Option<PathBuf>,
    /// Tokens file (see `auth`); with it, every call but health needs a
    /// bearer token. Default: none, no authentication.
    pub auth_tokens: Option<PathBuf>,
    /// HTTP/2 streams (calls) one connection may have open at once; 0: no
    /// limit. Default 128.
    pub max_streams_per_connection: u32,
    /// gRPC connections open at once; more wait to be accepted. Default 1024.
    pub max_connections: usize,
    /// Bytes of request bodies held at once, across all calls; a call that
    /// would take more is refused with RESOURCE_EXHAUSTED. Default 256 MiB.
    pub max_request_memory: usize,
    /// A `ScheduleStream` with nothing unanswered that sends nothing for
    /// this long is ended. Default 2m.
    #[serde(with = "humantime_serde")]
    pub stream_idle_timeout: Duration,
    /// gRPC health `Watch` streams open at once (they need no token).
    /// Default 64.
    pub max_health_watches: usize,
}

/// The longest `shutdown_grace` accepted.
const MAX_SHUTDOWN_GRACE: Duration = Duration::from_secs(3600);

impl Default for Config {
    fn default() -> Self {
        let limits = Limits::default();
        let dispatcher = DispatcherConfig::default();
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            data_dir: PathBuf::from("hourglass-data"),
            kafka_brokers: "127.0.0.1:9092".into(),
            kafka_properties: Properties::default(),
            durability: Durability::Sync,
            retention: Duration::from_secs(7 * 24 * 3600),
            max_delay: limits.max_delay,
            max_message_bytes: limits.max_message_bytes,
            max_headers: limits.max_headers,
            max_headers_bytes: limits.max_headers_bytes,
            max_batch: limits.max_batch,
            max_batch_bytes: limits.max_batch_bytes,
            stream_window: 8192,
            max_concurrent_requests: 4096,
            max_pending: 0,
            verify_on_start: true,
            max_in_flight: dispatcher.max_in_flight,
            max_delivery_attempts: dispatcher.max_attempts,
            fail_after: dispatcher.fail_after,
            stall_after: dispatcher.stall_after,
            retry_backoff: dispatcher.backoff_initial,
            retry_backoff_max: dispatcher.backoff_max,
            metadata_refresh: Duration::from_secs(30),
            shutdown_grace: dispatcher.shutdown_grace,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            auth_tokens: None,
            max_streams_per_connection: 128,
            max_connections: 1024,
            max_request_memory: 256 << 20,
            stream_idle_timeout: Duration::from_secs(120),
            max_health_watches: 64,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// Where and why, without the text of the line: it may hold a secret.
    #[error("config file {path}{at}: {reason}")]
    Parse { path: PathBuf, at: String, reason: String },
    #[error("{0}")]
    Invalid(String),
}

impl ConfigError {
    /// A TOML error as `Parse`: its line and column, and its reason with
    /// every quoted value taken out (toml and serde quote the value they
    /// choke on, and that value may be a password).
    pub fn parse(path: &std::path::Path, text: &str, e: &toml::de::Error) -> ConfigError {
        let at = e
            .span()
            .map(|span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.lines().count().max(1);
                let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                format!(" at line {line}, column {column}")
            })
            .unwrap_or_default();
        ConfigError::Parse { path: path.to_owned(), at, reason: unquote(e.message()) }
    }
}

/// `text` with everything between double quotes replaced (quotes escaped
/// with a backslash inside them included).
fn unquote(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut inside = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (c, inside) {
            ('"', false) => {
                inside = true;
                out.push_str("\"…\"");
            }
            ('"', true) => inside = false,
            ('\\', true) => {
                chars.next();
            }
            (_, true) => {}
            (c, false) => out.push(c),
        }
    }
    out
}

impl Config {
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        toml::from_str(&text).map_err(|e| ConfigError::parse(path, &text, &e))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |m: String| Err(ConfigError::Invalid(m));
        if self.kafka_brokers.trim().is_empty() {
            return fail("kafka_brokers is empty; give host:port of at least one broker".into());
        }
        if self.kafka_properties.contains_key("bootstrap.servers") {
            return fail("set the brokers with --kafka-brokers, not the bootstrap.servers property".into());
        }
        if self.listen == self.metrics_listen && self.listen.port() != 0 {
            return fail(format!("listen and metrics_listen are both {}", self.listen));
        }
        if self.max_in_flight == 0 {
            return fail("max_in_flight must be at least 1".into());
        }
        if self.max_batch == 0 || self.stream_window == 0 || self.max_concurrent_requests == 0 {
            return fail("max_batch, stream_window and max_concurrent_requests must be at least 1".into());
        }
        if self.max_batch_bytes > 256 << 20 {
            return fail(format!("max_batch_bytes is {}; use at most 256 MiB", self.max_batch_bytes));
        }
        if self.max_delivery_attempts == 0 {
            return fail("max_delivery_attempts must be at least 1".into());
        }
        if self.max_message_bytes == 0 || self.max_message_bytes > 64 << 20 {
            return fail(format!("max_message_bytes is {}; use 1 to 64 MiB", self.max_message_bytes));
        }
        if self.retry_backoff.is_zero() || self.retry_backoff > self.retry_backoff_max {
            return fail("retry_backoff must be positive and at most retry_backoff_max".into());
        }
        if self.metadata_refresh < Duration::from_secs(1) {
            return fail("metadata_refresh must be at least 1s".into());
        }
        if self.shutdown_grace > MAX_SHUTDOWN_GRACE {
            return fail(format!(
                "shutdown_grace is {}; use at most {}",
                humantime::format_duration(self.shutdown_grace),
                humantime::format_duration(MAX_SHUTDOWN_GRACE)
            ));
        }
        if self.stall_after < Duration::from_secs(1) || self.stream_idle_timeout < Duration::from_secs(1) {
            return fail("stall_after and stream_idle_timeout must be at least 1s".into());
        }
        if self.max_connections == 0 || self.max_health_watches == 0 {
            return fail("max_connections and max_health_watches must be at least 1".into());
        }
        let largest = self.limits().max_batch_request_bytes();
        if self.max_request_memory < largest {
            return fail(format!(
                "max_request_memory is {} bytes, less than one request may take ({largest} bytes, from \
                 max_batch_bytes and max_message_bytes)",
                self.max_request_memory
            ));
        }
        for (name, value) in self.kafka_properties.iter() {
            secret::check_property(name, value, Origin::Named)?;
            // A record timed out locally may still have been written:
            // producing it again could duplicate it.
            if matches!(name.as_str(), "message.timeout.ms" | "delivery.timeout.ms") && value.trim() != "0" {
                return fail(format!(
                    "kafka property {name} must stay 0: hourglass never times a record out and sends it again, \
                     which could duplicate it (a topic that stops answering is held by --stall-after instead)"
                ));
            }
        }
        self.check_security()
    }

    /// TLS files present and readable PEM, the tokens file well-formed.
    fn check_security(&self) -> Result<(), ConfigError> {
        if let Some(tls) = self.tls()? {
            tls.load()?;
        }
        if let Some(path) = &self.auth_tokens {
            crate::auth::Tokens::load(path)?;
        }
        Ok(())
    }

    /// The TLS files of the gRPC port, or none for plaintext.
    pub fn tls(&self) -> Result<Option<crate::tls::TlsFiles>, ConfigError> {
        crate::tls::TlsFiles::from_parts(
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.tls_client_ca.as_deref(),
        )
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_message_bytes: self.max_message_bytes,
            max_headers: self.max_headers,
            max_headers_bytes: self.max_headers_bytes,
            max_delay: self.max_delay,
            max_batch: self.max_batch,
            max_batch_bytes: self.max_batch_bytes,
        }
    }

    pub fn kafka(&self) -> KafkaConfig {
        let mut properties = self.kafka_properties.0.clone();
        // librdkafka refuses records over its message.max.bytes (1000000 by
        // default); let it take every message hourglass accepts, with room
        // for the record's framing and hourglass's own headers.
        properties
            .entry("message.max.bytes".into())
            .or_insert_with(|| (self.max_message_bytes + 64 * 1024).max(1_000_000).to_string());
        KafkaConfig { brokers: self.kafka_brokers.clone(), properties }
    }

    pub fn shard(&self) -> ShardConfig {
        let mut store = StoreConfig::new(&self.data_dir);
        store.sync_writes = self.durability == Durability::Sync;
        store.max_pending = (self.max_pending > 0).then_some(self.max_pending);
        store.verify_on_open = self.verify_on_start;
        ShardConfig {
            store,
            dispatcher: DispatcherConfig {
                max_in_flight: self.max_in_flight,
                max_attempts: self.max_delivery_attempts,
                backoff_initial: self.retry_backoff,
                backoff_max: self.retry_backoff_max,
                shutdown_grace: self.shutdown_grace,
                fail_after: self.fail_after,
                stall_after: self.stall_after,
                ..DispatcherConfig::default()
            },
            retention: self.retention,
            upkeep_every: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert!(Config::default().validate().is_ok());
    }

    #[test]
    fn a_file_sets_what_it_names_and_keeps_the_rest() {
        let config: Config = toml::from_str(
            r#"
            kafka_brokers = "k1:9092,k2:9092"
            durability = "buffered"
            retention = "2days"
            shutdown_grace = "500ms"
            [kafka_properties]
            "security.protocol" = "SASL_SSL"
            "sasl.mechanism" = "SCRAM-SHA-512"
            "#,
        )
        .unwrap();
        assert_eq!(config.kafka_brokers, "k1:9092,k2:9092");
        assert_eq!(config.durability, Durability::Buffered);
        assert_eq!(config.retention, Duration::from_secs(2 * 24 * 3600));
        assert_eq!(config.shutdown_grace, Duration::from_millis(500));
        assert_eq!(config.kafka_properties["sasl.mechanism"], "SCRAM-SHA-512");
        assert_eq!(config.listen, Config::default().listen);
        assert!(!config.shard().store.sync_writes);
    }

    #[test]
    fn the_producer_takes_every_message_the_server_accepts() {
        let config = Config { max_message_bytes: 4 << 20, ..Config::default() };
        assert_eq!(config.kafka().properties["message.max.bytes"], ((4 << 20) + 64 * 1024).to_string());
        let mut set = Config::default();
        set.kafka_properties.insert("message.max.bytes".into(), "500000".into());
        assert_eq!(set.kafka().properties["message.max.bytes"], "500000", "the operator's setting wins");
    }

    /// A password with every character that has tripped a parser.
    const PASSWORD: &str = "Pw1,Xq9=Zk\\\"Jj";

    #[test]
    fn a_broken_config_file_is_named_by_line_without_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hourglass.toml");
        let broken = [
            // An unterminated string: toml quotes the rest of the line.
            format!("[kafka_properties]\n\"sasl.password\" = \"{PASSWORD}\nretention = \"1d\"\n"),
            // A value of the wrong type: serde quotes the value.
            format!("max_pending = \"{PASSWORD}\"\n"),
            // A table where a string belongs.
            format!(
                "kafka_brokers = \"k:9092\"\n[kafka_properties]\n\"sasl.password\" = {{ v = \"{PASSWORD}\" }}\n"
            ),
        ];
        for text in broken {
            std::fs::write(&path, &text).unwrap();
            let err = Config::from_file(&path).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(shown.contains("hourglass.toml at line"), "{shown}");
            for piece in ["Pw1", "Xq9", "Zk", "Jj"] {
                assert!(!shown.contains(piece), "the secret leaked: {shown}");
            }
        }
    }

    #[test]
    fn debug_output_hides_kafka_secrets() {
        let mut config = Config::default();
        config.kafka_properties.insert("sasl.password".into(), PASSWORD.into());
        config.kafka_properties.insert("sasl.username".into(), "hourglass".into());
        let shown = format!("{config:?} {:?}", config.kafka());
        assert!(!shown.contains("Pw1") && shown.contains("hourglass"), "{shown}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = toml::from_str::<Config>("kafka_broker = \"x\"").unwrap_err();
        assert!(err.to_string().contains("kafka_broker"), "{err}");
    }

    #[test]
    fn validation_explains_what_is_wrong() {
        let bad = [
            Config { kafka_brokers: " ".into(), ..Config::default() },
            Config { max_in_flight: 0, ..Config::default() },
            Config { max_delivery_attempts: 0, ..Config::default() },
            Config { max_batch: 0, ..Config::default() },
            Config { stream_window: 0, ..Config::default() },
            Config { max_concurrent_requests: 0, ..Config::default() },
            Config { max_message_bytes: 0, ..Config::default() },
            Config { retry_backoff: Duration::from_secs(60), ..Config::default() },
            Config { metrics_listen: Config::default().listen, ..Config::default() },
            Config {
                kafka_properties: Properties::from([("bootstrap.servers".into(), "x:1".into())]),
                ..Config::default()
            },
            Config { shutdown_grace: Duration::MAX, ..Config::default() },
            Config { max_request_memory: 1024, ..Config::default() },
            Config { max_connections: 0, ..Config::default() },
            Config {
                kafka_properties: Properties::from([("no.such.thing".into(), "1".into())]),
                ..Config::default()
            },
            Config {
                kafka_properties: Properties::from([("message.timeout.ms".into(), "30000".into())]),
                ..Config::default()
            },
        ];
        for config in bad {
            let err = config.validate().unwrap_err();
            assert!(matches!(err, ConfigError::Invalid(_)), "{err}");
        }
    }

    #[test]
    fn security_settings_are_checked_with_the_flag_and_file_named() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            (
                Config { tls_cert: Some("c.pem".into()), ..Config::default() },
                "--tls-cert is given without --tls-key",
            ),
            (
                Config { tls_key: Some("k.pem".into()), ..Config::default() },
                "--tls-key is given without --tls-cert",
            ),
            (Config { tls_client_ca: Some("ca.pem".into()), ..Config::default() }, "--tls-client-ca needs"),
            (
                Config {
                    tls_cert: Some(dir.path().join("none.pem")),
                    tls_key: Some(dir.path().join("none.pem")),
                    ..Config::default()
                },
                "--tls-cert",
            ),
            (
                Config { auth_tokens: Some(dir.path().join("tokens.toml")), ..Config::default() },
                "--auth-tokens",
            ),
        ];
        for (config, expected) in cases {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
        }
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, "[[token]]\nname = \"a\"\ntoken = \"t\"\ntopics = [\"*\"]\n").unwrap();
        let config: Config = toml::from_str(&format!(
            "auth_tokens = {:?}\nmax_streams_per_connection = 100",
            tokens.display().to_string()
        ))
        .unwrap();
        assert_eq!(config.max_streams_per_connection, 100);
        config.validate().unwrap();
    }
}
