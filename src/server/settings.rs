//! From the settings to what each layer is built from. [`Config`] is a
//! leaf that knows no layer; the layers know nothing of it. They meet here,
//! and here the settings are checked against the files they name.

use std::time::Duration;

use tonic::transport::ClientTlsConfig;

use crate::{
    admin::PolicyLimits,
    auth::{Tokens, TokensError},
    cluster::{ClusterConfig, ClusterKey, GroupConfig, KeyError, LogTopic},
    config::{Config, ConfigError, DeliveryMode, REQUEST_OVERHEAD_BYTES},
    dispatcher::DispatcherConfig,
    kafka::{Delivery, KafkaConfig, OnFence},
    message::{Limits, ReservedTopics},
    node::NodeConfig,
    shard::ShardConfig,
    store::StoreConfig,
    tls::{TlsError, TlsFiles},
};

/// What is wrong with the settings, named by setting (and file).
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Tokens(#[from] TokensError),
    #[error(transparent)]
    ClusterKey(#[from] KeyError),
}

/// Everything that can be checked before start: the settings themselves,
/// the TLS files (present, PEM), the tokens file (well-formed) and the
/// cluster key.
pub fn check(config: &Config) -> Result<(), SettingsError> {
    config.validate()?;
    if let Some(files) = tls(config)? {
        files.rustls(GRPC_ALPN)?;
    }
    if let Some(path) = &config.auth_tokens {
        Tokens::load(path)?;
    }
    cluster_key(config)?;
    Ok(())
}

/// The cluster's key, in cluster mode.
fn cluster_key(config: &Config) -> Result<Option<ClusterKey>, KeyError> {
    match (&config.cluster_key_file, config.cluster) {
        (Some(path), true) => ClusterKey::load(path).map(Some),
        _ => Ok(None),
    }
}

/// What the gRPC port offers in TLS's ALPN: HTTP/2 (gRPC), and HTTP/1.1
/// for the JSON door and gRPC-Web.
pub const GRPC_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// The TLS files of the gRPC port, or none for plaintext.
pub fn tls(config: &Config) -> Result<Option<TlsFiles>, TlsError> {
    TlsFiles::from_parts(
        config.tls_cert.as_deref(),
        config.tls_key.as_deref(),
        config.tls_client_ca.as_deref(),
    )
}

/// Cluster mode: how a node reaches the others when it forwards requests
/// over TLS: it checks them against --tls-peer-ca, else --tls-client-ca
/// (the CA of the cluster's certificates, when mutual TLS is on), else the
/// system's roots; and presents its own certificate when mutual TLS is on.
pub fn peer_tls(config: &Config, cluster: &ClusterConfig) -> Result<Option<ClientTlsConfig>, TlsError> {
    if !cluster.advertise.starts_with("https://") {
        return Ok(None);
    }
    let identity = match (&config.tls_cert, &config.tls_key, &config.tls_client_ca) {
        (Some(cert), Some(key), Some(_)) => Some((cert.as_path(), key.as_path())),
        _ => None,
    };
    let ca = config.tls_peer_ca.as_deref().or(config.tls_client_ca.as_deref());
    crate::tls::client_config(&cluster.advertise, ca, identity)
}

/// What a message and a request may hold.
pub fn limits(config: &Config) -> Limits {
    Limits {
        max_message_bytes: config.max_message_bytes,
        max_headers: config.max_headers,
        max_headers_bytes: config.max_headers_bytes,
        max_delay: *config.max_delay,
        max_batch: config.max_batch,
        max_batch_bytes: config.max_batch_bytes,
        reserved: ReservedTopics::new(config.reserved_topics()),
    }
}

/// What the policy calls may hold and name.
pub fn policy_limits(config: &Config) -> PolicyLimits {
    PolicyLimits {
        per_tenant: config.max_policies_per_tenant,
        reserved: ReservedTopics::new(config.reserved_topics()),
        skip_no_ops: !config.cluster,
    }
}

/// The producer's cluster and properties.
pub fn kafka(config: &Config) -> KafkaConfig {
    let mut properties = config.kafka_properties.0.clone();
    // librdkafka refuses records over its message.max.bytes (1000000 by
    // default); let it take every message hourglass accepts, with room for
    // the record's framing and hourglass's own headers.
    properties
        .entry("message.max.bytes".into())
        .or_insert_with(|| (config.max_message_bytes + REQUEST_OVERHEAD_BYTES).max(1_000_000).to_string());
    KafkaConfig { brokers: config.kafka_brokers.clone(), properties }
}

/// How due records reach their topics: the node's idempotent producer, or
/// one transactional producer per shard. Standalone, a fenced shard stops
/// the node (its transactional ids are its own); in a cluster it means the
/// shard moved.
pub fn delivery(config: &Config) -> Delivery {
    match config.delivery {
        DeliveryMode::Idempotent => Delivery::Idempotent,
        DeliveryMode::ExactlyOnce if config.cluster => Delivery::Transactional {
            prefix: Some(
                config
                    .transactional_id
                    .clone()
                    .unwrap_or_else(|| format!("{}-{}", config.group_id, config.log_topic)),
            ),
            on_fence: OnFence::Yield,
        },
        DeliveryMode::ExactlyOnce => {
            Delivery::Transactional { prefix: config.transactional_id.clone(), on_fence: OnFence::Stop }
        }
    }
}

/// The node: its shards (in cluster mode, the schedule log's partitions),
/// where they live, the backlog cap they share.
pub fn node(config: &Config) -> NodeConfig {
    NodeConfig {
        data_dir: config.data_dir.clone(),
        shards: if config.cluster { config.log_partitions } else { config.shards },
        shard: shard(config),
        max_pending: (config.max_pending > 0).then_some(config.max_pending),
    }
}

/// Cluster mode (`--cluster`): the schedule log, the consumer group, the
/// cluster's key, and where the other nodes reach this one. `grpc` is where
/// it listens, and `tls` whether with TLS: the address other nodes reach
/// it at, unless --advertise-addr says. None standalone.
pub fn cluster(
    config: &Config,
    grpc: std::net::SocketAddr,
    tls: bool,
) -> Result<Option<ClusterConfig>, SettingsError> {
    // Valid settings name a key file in cluster mode.
    config.validate()?;
    let Some(key) = cluster_key(config)? else { return Ok(None) };
    Ok(Some(ClusterConfig {
        kafka: kafka(config),
        log: LogTopic {
            name: config.log_topic.clone(),
            partitions: config.log_partitions as i32,
            replication: config.log_replication,
        },
        group: GroupConfig {
            id: config.group_id.clone(),
            topic: config.log_topic.clone(),
            session_timeout: *config.group_session_timeout,
        },
        limits: limits(config),
        admin_timeout: Duration::from_secs(30),
        standby_replicas: config.standby_replicas as usize,
        advertise: config
            .advertise_addr
            .clone()
            .unwrap_or_else(|| format!("{}://{grpc}", if tls { "https" } else { "http" })),
        key,
    }))
}

/// The ingress topics (`--ingress`), each as it is created when missing
/// (a partition per shard, the log's replication), with its grant.
pub fn ingress(config: &Config) -> Result<Vec<(LogTopic, Option<String>)>, SettingsError> {
    let partitions = node(config).shards as i32;
    let replication = config.log_replication;
    Ok(config
        .ingress_topics()?
        .into_iter()
        .map(|(name, grant)| (LogTopic { name, partitions, replication }, grant))
        .collect())
}

/// What each shard is built from (the node sets its path and its part of
/// the backlog cap).
pub fn shard(config: &Config) -> ShardConfig {
    let mut store = StoreConfig::new(&config.data_dir);
    store.durability = config.durability;
    store.max_pending = (config.max_pending > 0).then_some(config.max_pending);
    store.verify_on_open = config.verify_on_start;
    store.keep_delivered_bodies = config.keep_delivered_bodies;
    ShardConfig {
        store,
        dispatcher: DispatcherConfig {
            max_in_flight: config.max_in_flight,
            max_attempts: config.max_delivery_attempts,
            backoff_initial: *config.retry_backoff,
            backoff_max: *config.retry_backoff_max,
            shutdown_grace: *config.shutdown_grace,
            fail_after: *config.fail_after,
            stall_after: *config.stall_after,
            dead_letter_topic: config.dead_letter_topic.as_deref().map(Into::into),
            reserved: ReservedTopics::new(config.reserved_topics()),
            ..DispatcherConfig::default()
        },
        retention: *config.retention,
        upkeep_every: Duration::from_secs(10),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Durability;

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
        assert_eq!(*config.retention, Duration::from_secs(2 * 24 * 3600));
        assert_eq!(*config.shutdown_grace, Duration::from_millis(500));
        assert_eq!(config.kafka_properties["sasl.mechanism"], "SCRAM-SHA-512");
        assert_eq!(config.listen, Config::default().listen);
        assert_eq!(shard(&config).store.durability, Durability::Buffered);
        assert_eq!(shard(&config).dispatcher.shutdown_grace, Duration::from_millis(500));
    }

    #[test]
    fn transactional_ids_are_a_nodes_own_standalone_and_shared_in_a_cluster() {
        assert_eq!(delivery(&Config::default()), Delivery::Idempotent);
        let standalone = Config { delivery: DeliveryMode::ExactlyOnce, ..Config::default() };
        assert_eq!(delivery(&standalone), Delivery::Transactional { prefix: None, on_fence: OnFence::Stop });
        let named = Config { transactional_id: Some("orders".into()), ..standalone.clone() };
        assert_eq!(
            delivery(&named),
            Delivery::Transactional { prefix: Some("orders".into()), on_fence: OnFence::Stop }
        );
        let cluster = Config { cluster: true, ..standalone };
        assert_eq!(
            delivery(&cluster),
            Delivery::Transactional {
                prefix: Some("hourglass-hourglass-log".into()),
                on_fence: OnFence::Yield
            },
            "every node of a cluster names a shard's producer alike, so a new owner fences the old"
        );
    }

    #[test]
    fn the_producer_takes_every_message_the_server_accepts() {
        let config = Config { max_message_bytes: 4 << 20, ..Config::default() };
        assert_eq!(kafka(&config).properties["message.max.bytes"], ((4 << 20) + 64 * 1024).to_string());
        let mut set = Config::default();
        set.kafka_properties.insert("message.max.bytes".into(), "500000".into());
        assert_eq!(kafka(&set).properties["message.max.bytes"], "500000", "the operator's setting wins");
    }

    #[test]
    fn debug_output_of_the_kafka_settings_hides_secrets() {
        let mut config = Config::default();
        config.kafka_properties.insert("sasl.password".into(), "Pw1,Xq9".into());
        config.kafka_properties.insert("sasl.username".into(), "hourglass".into());
        let shown = format!("{:?}", kafka(&config));
        assert!(!shown.contains("Pw1") && shown.contains("hourglass"), "{shown}");
    }

    #[test]
    fn the_backlog_cap_is_the_node_s() {
        let config = Config { max_pending: 10, shards: 3, ..Config::default() };
        let built = node(&config);
        assert_eq!((built.max_pending, built.shards), (Some(10), 3));
        assert_eq!(node(&Config::default()).max_pending, None, "0: no cap");
    }

    #[test]
    fn a_node_is_advertised_where_it_listens_unless_told() {
        let grpc = "10.1.2.3:7000".parse().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("cluster.key");
        std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
        let config = Config { cluster: true, cluster_key_file: Some(key), ..Config::default() };
        let advertised = |config: &Config, tls| cluster(config, grpc, tls).unwrap().unwrap().advertise;
        assert_eq!(advertised(&config, false), "http://10.1.2.3:7000");
        assert_eq!(advertised(&config, true), "https://10.1.2.3:7000");
        let told = Config { advertise_addr: Some("http://hourglass-0.hourglass:50051".into()), ..config };
        assert_eq!(advertised(&told, false), "http://hourglass-0.hourglass:50051");
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
            (Config { cluster: true, ..Config::default() }, "cluster mode needs --cluster-key-file"),
            (
                Config {
                    cluster: true,
                    cluster_key_file: Some(dir.path().join("none.key")),
                    ..Config::default()
                },
                "none.key: cannot be read",
            ),
        ];
        for (config, expected) in cases {
            let err = check(&config).unwrap_err().to_string();
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
        check(&config).unwrap();
    }
}
