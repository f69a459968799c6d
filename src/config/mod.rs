//! Server settings, each declared once: its name (the key in the config
//! file, and the flag `--name-with-dashes`), its `HOURGLASS_*` environment
//! variable, its default and its `--help` text come from one line of
//! [`settings!`], so `--help`, the TOML file, the environment and the
//! defaults cannot drift apart.
//!
//! Precedence, highest first: command-line flag, environment variable,
//! config file (`--config`), default. [`Config::merge`] applies it, knowing
//! from clap where each value came from.
//!
//! A leaf: every layer may read its settings here; this module reads no
//! layer (the pieces each layer is built from are made where it is built).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{
    secret::{self, Origin, Properties, SecretError},
    store::Durability,
};

/// A length of time written as people write it: `200ms`, `30s`, `15m`,
/// `7days`, in a flag, a variable or the config file alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub fn get(self) -> Duration {
        self.0
    }
}

impl From<Duration> for HumanDuration {
    fn from(d: Duration) -> Self {
        HumanDuration(d)
    }
}

impl std::ops::Deref for HumanDuration {
    type Target = Duration;

    fn deref(&self) -> &Duration {
        &self.0
    }
}

impl std::str::FromStr for HumanDuration {
    type Err = humantime::DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s).map(HumanDuration)
    }
}

impl std::fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::message::duration_text(self.0))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// One setting, as [`settings!`] declared it: for docs, `--help` and the
/// tests that check the example config covers every one.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// The key in the config file; the flag is `--` and this with dashes.
    pub key: &'static str,
    pub env: &'static str,
    /// The default as written (none: unset unless given).
    pub default: Option<&'static str>,
}

/// How many values a flag of this type takes: a `bool` is a switch
/// (`--cluster` alone means true; `--cluster false` still works).
macro_rules! value_count {
    (bool) => {
        0..=1
    };
    ($other:ident) => {
        1
    };
}

/// What a flag given without a value means: `true` for a switch.
macro_rules! missing_value {
    (bool) => {
        Some("true")
    };
    ($other:ident) => {
        None::<&'static str>
    };
}

/// Declares the settings. Each line of `with_default` is
/// `name: Type = "default", "HOURGLASS_NAME";`, each of `optional` is
/// `name: Type as "VALUE", "HOURGLASS_NAME";` (unset unless given; `VALUE`
/// names the value in `--help`), both after their
/// doc comment, which is the `--help` text. It makes the struct (clap
/// arguments and serde fields at once), its `Default` (from the same
/// default strings, parsed as a flag would be), [`Config::merge`], and
/// [`Config::SETTINGS`].
macro_rules! settings {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            with_default {
                $( $(#[doc = $doc:literal])* $field:ident : $ty:ident = $default:literal , $env:literal ; )*
            }
            optional {
                $( $(#[doc = $odoc:literal])* $ofield:ident : $oty:ty as $ovalue:literal , $oenv:literal ; )*
            }
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, clap::Args, Deserialize, Serialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct $name {
            $(
                $(#[doc = $doc])*
                #[arg(
                    long, env = $env, default_value = $default, action = clap::ArgAction::Set,
                    num_args = value_count!($ty), default_missing_value = missing_value!($ty)
                )]
                pub $field: $ty,
            )*
            $(
                $(#[doc = $odoc])*
                #[arg(long, env = $oenv, value_name = $ovalue)]
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $ofield: Option<$oty>,
            )*
            /// librdkafka producer properties, passed through (SASL, SSL,
            /// ...); a value may be `env:NAME` or `file:/path`. On the command
            /// line `--kafka-property KEY=VALUE`; `Debug` hides secret values.
            #[arg(skip)]
            pub kafka_properties: Properties,
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $( $field: $default.parse().expect(concat!("the default of ", stringify!($field), " parses")), )*
                    $( $ofield: None, )*
                    kafka_properties: Properties::default(),
                }
            }
        }

        impl $name {
            /// Every setting, in declaration order.
            pub const SETTINGS: &[Setting] = &[
                $( Setting { key: stringify!($field), env: $env, default: Some($default) }, )*
                $( Setting { key: stringify!($ofield), env: $oenv, default: None }, )*
            ];

            /// The config file's settings, overridden by those the command
            /// line or the environment gave (`matches` says which, for the
            /// flags of `flags`). Kafka properties add up, the command
            /// line's winning.
            pub fn merge(file: Self, flags: Self, matches: &clap::ArgMatches) -> Self {
                use clap::parser::ValueSource;
                let given = |id: &str| {
                    matches!(matches.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable))
                };
                let mut kafka_properties = file.kafka_properties;
                kafka_properties.extend(flags.kafka_properties.0);
                $name {
                    $( $field: if given(stringify!($field)) { flags.$field } else { file.$field }, )*
                    $( $ofield: if given(stringify!($ofield)) { flags.$ofield } else { file.$ofield }, )*
                    kafka_properties,
                }
            }
        }
    };
}

settings! {
    /// The settings of `hourglass serve`.
    pub struct Config {
        with_default {
            /// gRPC listen address. On any address but a loopback one it
            /// needs --auth-tokens, or --allow-unauthenticated.
            listen: SocketAddr = "127.0.0.1:50051", "HOURGLASS_LISTEN";
            /// Prometheus /metrics listen address.
            metrics_listen: SocketAddr = "127.0.0.1:9464", "HOURGLASS_METRICS_LISTEN";
            /// Directory of the RocksDB store (of its shards, with more than
            /// one).
            data_dir: PathBuf = "hourglass-data", "HOURGLASS_DATA_DIR";
            /// Stores this node keeps, each with its own dispatcher; ids are
            /// spread over them by the hash Kafka's Java client uses for
            /// keys. Fixed once a data dir holds messages.
            shards: u32 = "1", "HOURGLASS_SHARDS";
            /// Kafka bootstrap servers, host:port[,host:port].
            kafka_brokers: String = "127.0.0.1:9092", "HOURGLASS_KAFKA_BROKERS";
            /// When a change is acknowledged: after fsync (sync), or once the
            /// OS has the write (buffered: loses the last moments on power
            /// loss).
            durability: Durability = "sync", "HOURGLASS_DURABILITY";
            /// How long delivered, cancelled and failed messages stay
            /// queryable (and their ids remembered).
            retention: HumanDuration = "7days", "HOURGLASS_RETENTION";
            /// Keep a delivered message's key, value and headers until
            /// retention ends. By default they are dropped once its delivery
            /// is on disk (within minutes): Get then answers with
            /// body_dropped, and a retried Schedule is still recognised.
            keep_delivered_bodies: bool = "false", "HOURGLASS_KEEP_DELIVERED_BODIES";
            /// Latest due time accepted, counted from now.
            max_delay: HumanDuration = "1098days", "HOURGLASS_MAX_DELAY";
            /// Largest message (key + value + headers) in bytes.
            max_message_bytes: usize = "1048576", "HOURGLASS_MAX_MESSAGE_BYTES";
            /// Most headers on one message.
            max_headers: usize = "64", "HOURGLASS_MAX_HEADERS";
            /// Most bytes of headers on one message.
            max_headers_bytes: usize = "65536", "HOURGLASS_MAX_HEADERS_BYTES";
            /// Most items in one ScheduleBatch call.
            max_batch: usize = "10000", "HOURGLASS_MAX_BATCH";
            /// Largest ScheduleBatch request in bytes.
            max_batch_bytes: usize = "16777216", "HOURGLASS_MAX_BATCH_BYTES";
            /// Series one tenant may have (without --auth-tokens the whole
            /// server is one tenant); more are refused with
            /// RESOURCE_EXHAUSTED.
            series_max_per_tenant: usize = "10000", "HOURGLASS_SERIES_MAX_PER_TENANT";
            /// The shortest time a new series may leave between two
            /// occurrences: its interval, or its cron expression's closest
            /// two (never less than 1s).
            series_min_interval: HumanDuration = "1s", "HOURGLASS_SERIES_MIN_INTERVAL";
            /// Requests one ScheduleStream may have unanswered before the
            /// server stops reading it.
            stream_window: usize = "8192", "HOURGLASS_STREAM_WINDOW";
            /// gRPC calls served at once; more are refused at once with
            /// RESOURCE_EXHAUSTED.
            max_concurrent_requests: usize = "4096", "HOURGLASS_MAX_CONCURRENT_REQUESTS";
            /// Messages pending at once; new ones are refused with
            /// RESOURCE_EXHAUSTED and health turns NOT_SERVING until
            /// deliveries make room. 0: no cap.
            max_pending: u64 = "0", "HOURGLASS_MAX_PENDING";
            /// Read every entry of the store with its checksum in the
            /// background after start-up, so that damage stops hourglass with
            /// a clear error at once; false leaves damage to be found when it
            /// is read.
            verify_on_start: bool = "true", "HOURGLASS_VERIFY_ON_START";
            /// Messages produced and not yet acknowledged by Kafka, per shard
            /// (a node holds up to its shards times this).
            max_in_flight: usize = "10000", "HOURGLASS_MAX_IN_FLIGHT";
            /// Times the broker may refuse a message (or its topic) before it
            /// is failed; --fail-after must have passed too.
            max_delivery_attempts: u32 = "5", "HOURGLASS_MAX_DELIVERY_ATTEMPTS";
            /// How long the broker must have refused a message (or its topic,
            /// e.g. deleted or not authorised) before it is failed; a shorter
            /// refusal only delays it.
            fail_after: HumanDuration = "10m", "HOURGLASS_FAIL_AFTER";
            /// A produce Kafka has not answered for this long holds the other
            /// messages of its topic back, so that it cannot hold every
            /// topic's.
            stall_after: HumanDuration = "10s", "HOURGLASS_STALL_AFTER";
            /// First retry delay after a failed produce; doubles each try.
            retry_backoff: HumanDuration = "200ms", "HOURGLASS_RETRY_BACKOFF";
            /// Longest retry delay.
            retry_backoff_max: HumanDuration = "30s", "HOURGLASS_RETRY_BACKOFF_MAX";
            /// How often topic metadata is refreshed.
            metadata_refresh: HumanDuration = "30s", "HOURGLASS_METADATA_REFRESH";
            /// How long shutdown waits for requests and produces in flight.
            shutdown_grace: HumanDuration = "10s", "HOURGLASS_SHUTDOWN_GRACE";
            /// HTTP/2 streams (calls) one connection may have open at once;
            /// the client waits for a free one. 0: no limit.
            max_streams_per_connection: u32 = "128", "HOURGLASS_MAX_STREAMS_PER_CONNECTION";
            /// gRPC connections open at once; further ones wait to be
            /// accepted.
            max_connections: usize = "1024", "HOURGLASS_MAX_CONNECTIONS";
            /// Bytes of request bodies the server holds at once, across all
            /// calls; a call that would take more is refused with
            /// RESOURCE_EXHAUSTED.
            max_request_memory: usize = "268435456", "HOURGLASS_MAX_REQUEST_MEMORY";
            /// A ScheduleStream with nothing unanswered that sends nothing
            /// for this long is ended with UNAVAILABLE.
            stream_idle_timeout: HumanDuration = "2m", "HOURGLASS_STREAM_IDLE_TIMEOUT";
            /// gRPC health Watch streams open at once (they need no token);
            /// more are refused with RESOURCE_EXHAUSTED.
            max_health_watches: usize = "64", "HOURGLASS_MAX_HEALTH_WATCHES";
            /// Dispatch policies one tenant may keep of its own (pauses,
            /// limits, deadlines, dead-letter topics of its messages to a
            /// topic); a new one past it is refused with RESOURCE_EXHAUSTED.
            /// Topic-wide policies (admin = "all") have a room of their own
            /// of 10000.
            max_policies_per_tenant: usize = "1000", "HOURGLASS_MAX_POLICIES_PER_TENANT";
            /// Serve gRPC on a non-loopback --listen address without
            /// --auth-tokens: whoever reaches the port may then schedule to,
            /// read and cancel on every topic. Only for a network where
            /// something else (a NetworkPolicy, a firewall) keeps everyone
            /// else out.
            allow_unauthenticated: bool = "false", "HOURGLASS_ALLOW_UNAUTHENTICATED";
            /// Cluster mode: every change goes to the schedule log (a
            /// compacted Kafka topic) first, and each shard's store is a
            /// view of one of its partitions.
            cluster: bool = "false", "HOURGLASS_CLUSTER";
            /// Cluster mode: the schedule log's topic, created (compacted)
            /// if missing.
            log_topic: String = "hourglass-log", "HOURGLASS_LOG_TOPIC";
            /// Cluster mode: the schedule log's partitions, one shard each.
            /// Fixed once the topic exists: each message id belongs to one
            /// partition by its hash.
            log_partitions: u32 = "12", "HOURGLASS_LOG_PARTITIONS";
            /// Cluster mode: the Kafka consumer group whose members (the
            /// nodes) own the schedule log's partitions.
            group_id: String = "hourglass", "HOURGLASS_GROUP_ID";
            /// Cluster mode: how long the group waits for a silent node
            /// before its shards go to others; also how long a node cut off
            /// from the group goes on dispatching, at most.
            group_session_timeout: HumanDuration = "6s", "HOURGLASS_GROUP_SESSION_TIMEOUT";
            /// Cluster mode: how many nodes besides its owner keep each
            /// shard's store up to date, so that a node taking it over
            /// after a failure starts at once (0: none).
            standby_replicas: u32 = "1", "HOURGLASS_STANDBY_REPLICAS";
            /// How due records reach their topics: idempotent (any broker;
            /// after a crash, what reached Kafka unrecorded is found by
            /// reading the topics back) or exactly-once (Kafka transactions,
            /// a transactional id per shard: read_committed consumers see
            /// each message once, and a node that lost its shard is fenced
            /// at the broker; needs a broker with transactions).
            delivery: DeliveryMode = "idempotent", "HOURGLASS_DELIVERY";
            /// The console: how long a client may take to send a request
            /// (its TLS handshake; its head, or the wait for it on a
            /// kept-alive connection; then its body); a slower one is
            /// answered 408 or closed.
            console_request_timeout: HumanDuration = "10s", "HOURGLASS_CONSOLE_REQUEST_TIMEOUT";
            /// The console: connections one address (an IPv6 /64) may hold
            /// open; more are closed at once.
            console_connections_per_peer: usize = "32", "HOURGLASS_CONSOLE_CONNECTIONS_PER_PEER";
        }
        optional {
            /// PEM certificate (chain) for TLS on the gRPC port; needs
            /// --tls-key.
            tls_cert: PathBuf as "FILE", "HOURGLASS_TLS_CERT";
            /// PEM private key of --tls-cert.
            tls_key: PathBuf as "FILE", "HOURGLASS_TLS_KEY";
            /// PEM CA certificate(s): only clients with a certificate signed
            /// by it get in (mutual TLS); needs --tls-cert and --tls-key.
            tls_client_ca: PathBuf as "FILE", "HOURGLASS_TLS_CLIENT_CA";
            /// Cluster mode: PEM CA certificate(s) that sign the other
            /// nodes' certificates, checked when a node forwards a request
            /// to another over TLS [default: --tls-client-ca, else the
            /// system's roots].
            tls_peer_ca: PathBuf as "FILE", "HOURGLASS_TLS_PEER_CA";
            /// Tokens file (TOML): every call but health then needs
            /// `authorization: Bearer <token>`, and each token may use its
            /// listed topics only, in its tenant's id space. Reloaded when
            /// its contents change, and on SIGHUP [default: no
            /// authentication].
            auth_tokens: PathBuf as "FILE", "HOURGLASS_AUTH_TOKENS";
            /// Cluster mode (required): a file holding the cluster's secret
            /// key, the same on every node (make one with `openssl rand -hex
            /// 32`). Every record a node writes to the schedule log and the
            /// routing topic is sealed with it; one that claims to be
            /// hourglass's own without its seal is refused.
            cluster_key_file: PathBuf as "FILE", "HOURGLASS_CLUSTER_KEY_FILE";
            /// Replicas of each partition of the topics hourglass creates: in
            /// cluster mode the schedule log and its routing topic, and the
            /// ingress topics standalone too [default: the brokers' default].
            log_replication: i32 as "REPLICAS", "HOURGLASS_LOG_REPLICATION";
            /// --delivery exactly-once: the transactional ids are
            /// <this>-<shard>. Unique to this node standalone, shared by the
            /// nodes of one cluster [default: standalone, an id of each
            /// store's own; cluster mode, <group-id>-<log-topic>].
            transactional_id: String as "PREFIX", "HOURGLASS_TRANSACTIONAL_ID";
            /// The ingress topics Kafka-native schedules are produced to,
            /// comma-separated, each TOPIC or TOPIC=GRANT: GRANT names an
            /// entry of --auth-tokens, whose topics and tenant the records
            /// get (required with --auth-tokens); `none` reads none. Created
            /// when missing (with --log-partitions partitions in cluster
            /// mode, --shards standalone) [default: standalone, none; cluster
            /// mode, <log-topic>-ingress, and none with --auth-tokens].
            ingress: String as "TOPIC[=GRANT],...", "HOURGLASS_INGRESS";
            /// Cluster mode: where the other nodes reach this one's gRPC
            /// port, as a URL (http://host:port, https:// with TLS); a node
            /// forwards requests for shards it does not own to their owner
            /// [default: --listen, when it names one address].
            advertise_addr: String as "URL", "HOURGLASS_ADVERTISE_ADDR";
            /// Where messages that fail or expire go, when neither they nor
            /// their topic's policy name a dead-letter topic: produced
            /// there as they were, with headers that say why, and settled
            /// DEAD_LETTERED [default: none; they stay FAILED or EXPIRED].
            dead_letter_topic: String as "TOPIC", "HOURGLASS_DEAD_LETTER_TOPIC";
            /// Serves the operator console (web pages: what is parked, find
            /// a message and act on it) on this address. On any address but
            /// a loopback one it needs --auth-tokens [default: no console].
            console_listen: SocketAddr as "ADDR", "HOURGLASS_CONSOLE_LISTEN";
            /// Exports a span for each traced Schedule call and for each
            /// traced record's dispatch, linked, over OTLP/gRPC to this
            /// collector (http://host:4317). A Schedule's `traceparent` is
            /// kept on its record either way [default: no spans].
            otlp_endpoint: String as "URL", "HOURGLASS_OTLP_ENDPOINT";
        }
    }
}

/// How due records reach their topics (see `--delivery`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryMode {
    #[default]
    Idempotent,
    ExactlyOnce,
}

impl std::str::FromStr for DeliveryMode {
    type Err = NotADeliveryMode;

    fn from_str(s: &str) -> Result<Self, NotADeliveryMode> {
        match s {
            "idempotent" => Ok(DeliveryMode::Idempotent),
            "exactly-once" => Ok(DeliveryMode::ExactlyOnce),
            other => Err(NotADeliveryMode(other.to_owned())),
        }
    }
}

/// A `--delivery` that names no delivery mode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a delivery mode; use idempotent or exactly-once")]
pub struct NotADeliveryMode(pub String);

impl std::fmt::Display for DeliveryMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeliveryMode::Idempotent => "idempotent",
            DeliveryMode::ExactlyOnce => "exactly-once",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// Where and why, without the text of the line: it may hold a secret.
    #[error("config file {path}{at}: {reason}")]
    Parse { path: PathBuf, at: String, reason: String },
    /// A setting outside what hourglass takes.
    #[error("{setting} {why}")]
    OutOfRange { setting: &'static str, why: String },
    /// Two settings that cannot go together.
    #[error("{0}")]
    Clash(String),
    /// A Kafka property librdkafka does not take (its value never shown).
    #[error(transparent)]
    Property(#[from] SecretError),
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

    fn out_of_range(setting: &'static str, why: impl Into<String>) -> ConfigError {
        ConfigError::OutOfRange { setting, why: why.into() }
    }
}

impl Config {
    /// The topics hourglass reads or writes itself and no message may name
    /// (see [`crate::message::ReservedTopics`]): the ingress topics, and in
    /// cluster mode the schedule log and its routing topic.
    pub fn reserved_topics(&self) -> Vec<String> {
        let log = self.log_topic.trim();
        let mut topics = match self.cluster {
            true => vec![log.to_owned(), format!("{log}-owners")],
            false => Vec::new(),
        };
        // Settings that do not validate are refused before this is asked.
        topics.extend(self.ingress_topics().unwrap_or_default().into_iter().map(|(topic, _)| topic));
        topics
    }

    /// The ingress topics and the grant each is mapped to, as --ingress
    /// says (see its help), defaults applied.
    pub fn ingress_topics(&self) -> Result<Vec<(String, Option<String>)>, ConfigError> {
        let Some(list) = &self.ingress else {
            return Ok(match (self.cluster, &self.auth_tokens) {
                (true, None) => vec![(format!("{}-ingress", self.log_topic.trim()), None)],
                _ => Vec::new(),
            });
        };
        if list.trim() == "none" {
            return Ok(Vec::new());
        }
        let mut topics: Vec<(String, Option<String>)> = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (topic, grant) = match entry.split_once('=') {
                Some((topic, grant)) => (topic.trim(), Some(grant.trim())),
                None => (entry, None),
            };
            let bad =
                |reason: String| Err(ConfigError::out_of_range("ingress", format!("{entry:?} {reason}")));
            if topic.is_empty() || !topic.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
                return bad("is no topic name (letters, digits, '.', '_' and '-')".into());
            }
            if self.cluster && (topic == self.log_topic || topic == format!("{}-owners", self.log_topic)) {
                return bad("is a topic only the nodes write (the schedule log or its routing topic)".into());
            }
            match grant {
                Some("") => return bad("names an empty grant".into()),
                Some(_) if self.auth_tokens.is_none() => {
                    return bad("names a grant, but there is no --auth-tokens to find it in".into());
                }
                None if self.auth_tokens.is_some() => {
                    return bad(
                        "names no grant: with --auth-tokens, give each ingress topic one (TOPIC=NAME, NAME an \
                         entry of the tokens file)"
                            .into(),
                    );
                }
                _ => {}
            }
            if topics.iter().any(|(t, _)| t == topic) {
                return bad("is listed twice".into());
            }
            topics.push((topic.to_owned(), grant.map(str::to_owned)));
        }
        Ok(topics)
    }
}

/// An --advertise-addr: http:// or https://, a host and a port.
fn check_advertised(addr: &str) -> Result<(), ConfigError> {
    let bad = |why: &str| {
        Err(ConfigError::out_of_range(
            "advertise_addr",
            format!(
                "is {addr:?}: {why}; give the URL other nodes reach this one at, like http://10.0.0.7:50051"
            ),
        ))
    };
    let Ok(uri) = addr.parse::<tonic::codegen::http::Uri>() else {
        return bad("not a URL");
    };
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return bad("it must start with http:// or https://");
    }
    if uri.host().is_none_or(str::is_empty) || uri.port_u16().is_none() {
        return bad("it needs a host and a port");
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return bad("it must not have a path");
    }
    Ok(())
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

/// The longest `shutdown_grace` accepted.
const MAX_SHUTDOWN_GRACE: Duration = Duration::from_secs(3600);

/// The most shards a node keeps.
pub const MAX_SHARDS: u32 = 256;

/// Room a request of one message has beside the message itself.
pub const REQUEST_OVERHEAD_BYTES: usize = 64 * 1024;

impl Config {
    /// The settings of a config file; unset ones keep their defaults.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        toml::from_str(&text).map_err(|e| ConfigError::parse(path, &text, &e))
    }

    /// Checks what can be checked without the files and the broker the
    /// settings name (`server::check` reads the files too).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(topic) = &self.dead_letter_topic {
            crate::message::validate_topic_name(topic)
                .map_err(|e| ConfigError::out_of_range("dead_letter_topic", e.reason))?;
            if self.reserved_topics().iter().any(|reserved| reserved == topic) {
                return Err(ConfigError::out_of_range(
                    "dead_letter_topic",
                    format!(
                        "is {topic:?}, a topic hourglass reads or writes itself (an ingress topic, the schedule \
                         log or its routing topic); name another"
                    ),
                ));
            }
        }
        let fail = |setting, why: &str| Err(ConfigError::out_of_range(setting, why));
        if self.kafka_brokers.trim().is_empty() {
            return fail("kafka_brokers", "is empty; give host:port of at least one broker");
        }
        if self.kafka_properties.contains_key("bootstrap.servers") {
            return Err(ConfigError::Clash(
                "set the brokers with --kafka-brokers, not the bootstrap.servers property".into(),
            ));
        }
        if !self.listen.ip().is_loopback() && self.auth_tokens.is_none() && !self.allow_unauthenticated {
            return Err(ConfigError::Clash(format!(
                "listen is {}, reachable from other machines, and there are no auth_tokens: whoever reaches it \
                 could schedule to, read and cancel on every topic. Set --auth-tokens, listen on 127.0.0.1, or \
                 pass --allow-unauthenticated if something else keeps everyone else out",
                self.listen
            )));
        }
        if self.listen == self.metrics_listen && self.listen.port() != 0 {
            return Err(ConfigError::Clash(format!("listen and metrics_listen are both {}", self.listen)));
        }
        if let Some(console) = self.console_listen {
            if console.port() != 0 && (console == self.listen || console == self.metrics_listen) {
                return Err(ConfigError::Clash(format!(
                    "console_listen is {console}, which listen or metrics_listen uses already"
                )));
            }
            if !console.ip().is_loopback() && self.auth_tokens.is_none() {
                return Err(ConfigError::Clash(format!(
                    "console_listen is {console}, reachable from other machines, and there are no auth_tokens: \
                     whoever reaches it could cancel messages. Set --auth-tokens, or listen on 127.0.0.1"
                )));
            }
        }
        if self.cluster {
            if self.log_partitions == 0 || self.log_partitions > MAX_SHARDS {
                return Err(ConfigError::out_of_range(
                    "log_partitions",
                    format!("is {}; use 1 to {MAX_SHARDS}", self.log_partitions),
                ));
            }
            if self.shards != 1 && self.shards != self.log_partitions {
                return Err(ConfigError::Clash(format!(
                    "in cluster mode the shards are the schedule log's partitions: drop --shards {} or set \
                     --log-partitions {}",
                    self.shards, self.shards
                )));
            }
            if self.log_topic.trim().is_empty() {
                return fail("log_topic", "is empty");
            }
            if self.group_id.trim().is_empty() {
                return fail("group_id", "is empty");
            }
            if !(Duration::from_secs(1)..=Duration::from_secs(300)).contains(&*self.group_session_timeout) {
                return fail("group_session_timeout", "use 1s to 5m (brokers allow 6s to 5m by default)");
            }
            if self.cluster_key_file.is_none() {
                return Err(ConfigError::Clash(
                    "cluster mode needs --cluster-key-file: the nodes seal their records in the schedule log with \
                     it, so that no one else can write them. Make one with `openssl rand -hex 32 > cluster.key` \
                     and give every node of the cluster the same file"
                        .into(),
                ));
            }
            match &self.advertise_addr {
                Some(addr) => check_advertised(addr)?,
                None if self.listen.ip().is_unspecified() => {
                    return Err(ConfigError::Clash(format!(
                        "in cluster mode the other nodes forward requests to this one: --listen {} names no \
                         one address, so set --advertise-addr to the URL they reach it at (for example \
                         http://hourglass-0.hourglass:{})",
                        self.listen,
                        self.listen.port()
                    )));
                }
                None => {}
            }
        }
        self.ingress_topics()?;
        if self.log_replication.is_some_and(|r| r < 1) {
            return Err(ConfigError::out_of_range("log_replication", "must be at least 1"));
        }
        match (&self.transactional_id, self.delivery) {
            (Some(_), DeliveryMode::Idempotent) => {
                return Err(ConfigError::Clash(
                    "--transactional-id names the transactional producers of --delivery exactly-once; \
                     set that too, or drop it"
                        .into(),
                ));
            }
            (Some(id), _) if id.trim().is_empty() => return fail("transactional_id", "is empty"),
            _ => {}
        }
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(ConfigError::out_of_range(
                "shards",
                format!("is {}; use 1 to {MAX_SHARDS}", self.shards),
            ));
        }
        for (setting, value) in [
            ("max_in_flight", self.max_in_flight),
            ("max_batch", self.max_batch),
            ("stream_window", self.stream_window),
            ("max_concurrent_requests", self.max_concurrent_requests),
            ("max_connections", self.max_connections),
            ("max_health_watches", self.max_health_watches),
            ("max_policies_per_tenant", self.max_policies_per_tenant),
            ("console_connections_per_peer", self.console_connections_per_peer),
        ] {
            if value == 0 {
                return fail(setting, "must be at least 1");
            }
        }
        if self.max_batch_bytes > 256 << 20 {
            return Err(ConfigError::out_of_range(
                "max_batch_bytes",
                format!("is {}; use at most 256 MiB", self.max_batch_bytes),
            ));
        }
        if self.max_delivery_attempts == 0 {
            return fail("max_delivery_attempts", "must be at least 1");
        }
        if self.max_message_bytes == 0 || self.max_message_bytes > 64 << 20 {
            return Err(ConfigError::out_of_range(
                "max_message_bytes",
                format!("is {}; use 1 to 64 MiB", self.max_message_bytes),
            ));
        }
        if self.retry_backoff.is_zero() || self.retry_backoff > self.retry_backoff_max {
            return fail("retry_backoff", "must be positive and at most retry_backoff_max");
        }
        if *self.metadata_refresh < Duration::from_secs(1) {
            return fail("metadata_refresh", "must be at least 1s");
        }
        if *self.shutdown_grace > MAX_SHUTDOWN_GRACE {
            return Err(ConfigError::out_of_range(
                "shutdown_grace",
                format!("is {}; use at most {}", self.shutdown_grace, HumanDuration(MAX_SHUTDOWN_GRACE)),
            ));
        }
        for (setting, value) in [
            ("stall_after", self.stall_after),
            ("stream_idle_timeout", self.stream_idle_timeout),
            ("console_request_timeout", self.console_request_timeout),
        ] {
            if *value < Duration::from_secs(1) {
                return fail(setting, "must be at least 1s");
            }
        }
        let largest = self.max_batch_bytes.max(self.max_message_bytes + REQUEST_OVERHEAD_BYTES);
        if self.max_request_memory < largest {
            return Err(ConfigError::out_of_range(
                "max_request_memory",
                format!(
                    "is {} bytes, less than one request may take ({largest} bytes, from max_batch_bytes and \
                     max_message_bytes)",
                    self.max_request_memory
                ),
            ));
        }
        for (name, value) in self.kafka_properties.iter() {
            secret::check_property(name, value, Origin::Named)?;
            // A record timed out locally may still have been written:
            // producing it again could duplicate it.
            if matches!(name.as_str(), "message.timeout.ms" | "delivery.timeout.ms") && value.trim() != "0" {
                return Err(ConfigError::Clash(format!(
                    "kafka property {name} must stay 0: hourglass never times a record out and sends it again, \
                     which could duplicate it (a topic that stops answering is held by --stall-after instead)"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
