use clap::{CommandFactory as _, FromArgMatches as _};

use super::*;

/// The settings as clap parses `args`, and the matches that say where
/// each came from.
fn flags(args: &[&str]) -> (Config, clap::ArgMatches) {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        config: Config,
    }
    let matches = Cli::command().get_matches_from(std::iter::once("hourglass").chain(args.iter().copied()));
    (Cli::from_arg_matches(&matches).unwrap().config, matches)
}

#[test]
fn defaults_are_valid() {
    Config::default().validate().unwrap();
    let advertised = Some("https://hourglass-0.hourglass.ns.svc:50051".into());
    let listen = "0.0.0.0:50051".parse().unwrap();
    let key = Some("cluster.key".into());
    let tokens = Some("tokens.toml".into());
    Config {
        cluster: true,
        listen,
        advertise_addr: advertised,
        cluster_key_file: key,
        auth_tokens: tokens,
        ..Config::default()
    }
    .validate()
    .unwrap();
}

#[test]
fn grpc_beyond_this_machine_needs_tokens_or_says_it_means_it() {
    let open = Config { listen: "0.0.0.0:50051".parse().unwrap(), ..Config::default() };
    let err = open.validate().unwrap_err().to_string();
    assert!(err.contains("--auth-tokens") && err.contains("--allow-unauthenticated"), "{err}");
    Config { auth_tokens: Some("tokens.toml".into()), ..open.clone() }.validate().unwrap();
    Config { allow_unauthenticated: true, ..open.clone() }.validate().unwrap();
    let v6 = Config { listen: "[::]:50051".parse().unwrap(), ..Config::default() };
    assert!(v6.validate().is_err());
    Config { listen: "[::1]:50051".parse().unwrap(), ..Config::default() }.validate().unwrap();
}

/// The drift test: a default can be written in one place only, so the
/// defaults clap applies, those of an empty config file and
/// `Config::default()` are the same, and every setting has its flag and
/// variable named after its key.
#[test]
fn flags_file_and_defaults_agree() {
    let (parsed, _) = flags(&[]);
    let from_empty_file: Config = toml::from_str("").unwrap();
    assert_eq!(parsed, Config::default(), "clap's defaults");
    assert_eq!(from_empty_file, Config::default(), "an empty file's");
    let command = {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            config: Config,
        }
        Cli::command()
    };
    for setting in Config::SETTINGS {
        let flag = setting.key.replace('_', "-");
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()))
            .unwrap_or_else(|| panic!("no --{flag} for {}", setting.key));
        assert_eq!(arg.get_env().and_then(|e| e.to_str()), Some(setting.env), "{}", setting.key);
        assert_eq!(setting.env, format!("HOURGLASS_{}", setting.key.to_uppercase()), "{}", setting.key);
        let shown: Vec<_> =
            arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
        assert_eq!(
            shown,
            setting.default.map(str::to_owned).into_iter().collect::<Vec<_>>(),
            "{}",
            setting.key
        );
        // Every default round-trips through the file as written.
        if let Some(default) = setting.default {
            let file = format!("{} = {}", setting.key, toml_value(default));
            let from_file: Config = toml::from_str(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(from_file, Config::default(), "{file}");
        }
    }
}

/// A boolean flag is a switch: alone it means true, and it still takes
/// a value after it or `=`, for scripts that write one.
#[test]
fn boolean_flags_are_switches_that_still_take_a_value() {
    assert!(flags(&["--cluster"]).0.cluster);
    assert!(flags(&["--cluster", "--log-topic", "l"]).0.cluster, "a flag after it is no value");
    assert!(flags(&["--cluster", "true"]).0.cluster);
    assert!(!flags(&["--cluster", "false"]).0.cluster);
    assert!(!flags(&["--cluster=false"]).0.cluster);
    assert!(!flags(&["--verify-on-start", "false"]).0.verify_on_start);
    assert!(flags(&["--verify-on-start"]).0.verify_on_start);
    assert!(!flags(&[]).0.cluster, "off unless given");
}

/// Settings print as they are written: `--print-config`'s file reads
/// back as the same values, in the units people wrote them in.
#[test]
fn durations_print_in_one_unit() {
    let shown = |s: &str| s.parse::<HumanDuration>().unwrap().to_string();
    assert_eq!(shown("1098days"), "1098days");
    assert_eq!(shown("7days"), "7days");
    assert_eq!(shown("10m"), "10m");
    assert_eq!(shown("90s"), "90s");
    assert_eq!(shown("1h 30m"), "90m");
    assert_eq!(shown("200ms"), "200ms");
    assert_eq!(shown("1500ms"), "1500ms");
    assert_eq!(shown("0s"), "0s");
    for text in ["1098days", "36h", "1s 1ns"] {
        let d: HumanDuration = text.parse().unwrap();
        assert_eq!(d.to_string().parse::<HumanDuration>().unwrap(), d, "{text} reads back");
    }
}

/// A default string as a TOML value of its setting's type.
fn toml_value(default: &str) -> String {
    if default.parse::<u64>().is_ok() || default == "true" || default == "false" {
        default.to_owned()
    } else {
        format!("{default:?}")
    }
}

#[test]
fn flags_beat_the_environment_the_file_and_the_defaults_in_turn() {
    let file: Config = toml::from_str(
        r#"
        kafka_brokers = "k1:9092,k2:9092"
        durability = "buffered"
        retention = "2days"
        shutdown_grace = "500ms"
        max_pending = 7
        [kafka_properties]
        "security.protocol" = "SASL_SSL"
        "#,
    )
    .unwrap();
    let (cli, matches) = flags(&["--retention", "1h", "--max-pending", "9"]);
    let merged = Config::merge(file, cli, &matches);
    assert_eq!(merged.kafka_brokers, "k1:9092,k2:9092", "the file's");
    assert_eq!(merged.durability, Durability::Buffered);
    assert_eq!(*merged.retention, Duration::from_secs(3600), "the flag's");
    assert_eq!(merged.max_pending, 9);
    assert_eq!(*merged.shutdown_grace, Duration::from_millis(500));
    assert_eq!(merged.listen, Config::default().listen, "the default");
    assert_eq!(merged.kafka_properties["security.protocol"], "SASL_SSL");
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
    let shown = format!("{config:?}");
    assert!(!shown.contains("Pw1") && shown.contains("hourglass"), "{shown}");
}

#[test]
fn unknown_keys_are_refused() {
    let err = toml::from_str::<Config>("kafka_broker = \"x\"").unwrap_err();
    assert!(err.to_string().contains("kafka_broker"), "{err}");
}

#[test]
fn the_console_may_listen_beyond_loopback_only_with_tokens() {
    let open = Config { console_listen: Some("127.0.0.1:9470".parse().unwrap()), ..Config::default() };
    assert!(open.validate().is_ok());
    let tokens = Config {
        console_listen: Some("0.0.0.0:9470".parse().unwrap()),
        auth_tokens: Some("tokens.toml".into()),
        ..Config::default()
    };
    assert!(tokens.validate().is_ok());
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
        Config { shards: 0, ..Config::default() },
        Config { retry_backoff: Duration::from_secs(60).into(), ..Config::default() },
        Config { metrics_listen: Config::default().listen, ..Config::default() },
        Config { console_listen: Some(Config::default().metrics_listen), ..Config::default() },
        // Reachable from elsewhere, and whoever reaches it could act.
        Config { console_listen: Some("0.0.0.0:9470".parse().unwrap()), ..Config::default() },
        Config {
            kafka_properties: Properties::from([("bootstrap.servers".into(), "x:1".into())]),
            ..Config::default()
        },
        Config { shutdown_grace: Duration::MAX.into(), ..Config::default() },
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
        Config { cluster: true, listen: "0.0.0.0:50051".parse().unwrap(), ..clustered() },
        Config { cluster: true, advertise_addr: Some("node-1:50051".into()), ..clustered() },
        Config { cluster: true, advertise_addr: Some("http://node-1".into()), ..clustered() },
        Config { cluster: true, advertise_addr: Some("ftp://node-1:50051".into()), ..clustered() },
        Config { cluster_key_file: None, ..clustered() },
        Config { transactional_id: Some("orders".into()), ..Config::default() },
        Config {
            delivery: DeliveryMode::ExactlyOnce,
            transactional_id: Some(" ".into()),
            ..Config::default()
        },
    ];
    clustered().validate().unwrap();
    for config in bad {
        let err = config.validate().unwrap_err();
        assert!(
            matches!(err, ConfigError::OutOfRange { .. } | ConfigError::Clash(_) | ConfigError::Property(_)),
            "{err}"
        );
    }
}

/// A valid cluster node's settings.
fn clustered() -> Config {
    Config { cluster: true, cluster_key_file: Some("cluster.key".into()), ..Config::default() }
}

#[test]
fn ingress_topics_default_to_the_log_s_without_tokens_and_need_a_grant_with_them() {
    let topics = |c: Config| c.ingress_topics().unwrap();
    assert_eq!(topics(clustered()), [("hourglass-log-ingress".to_owned(), None)]);
    let tokens = Config { auth_tokens: Some("tokens.toml".into()), ..clustered() };
    assert!(topics(tokens.clone()).is_empty(), "with tokens, none unless named with a grant");
    let mapped = Config { ingress: Some("orders-in=orders, billing-in = billing".into()), ..tokens.clone() };
    assert_eq!(
        topics(mapped),
        [
            ("orders-in".to_owned(), Some("orders".to_owned())),
            ("billing-in".to_owned(), Some("billing".to_owned()))
        ]
    );
    assert!(topics(Config { ingress: Some("none".into()), ..clustered() }).is_empty());
    let refused = |ingress: &str, base: &Config, says: &str| {
        let config = Config { ingress: Some(ingress.into()), ..base.clone() };
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains(says), "--ingress {ingress}: {err:?} should say {says:?}");
    };
    refused("orders-in", &tokens, "names no grant");
    refused("orders-in=", &tokens, "empty grant");
    refused("orders-in=orders", &clustered(), "no --auth-tokens");
    refused("hourglass-log", &clustered(), "only the nodes write");
    refused("hourglass-log-owners", &clustered(), "only the nodes write");
    refused("a,a", &clustered(), "twice");
    refused("no spaces", &clustered(), "no topic name");
    // Standalone: none unless named, the same rules, and no log to clash with.
    assert!(topics(Config::default()).is_empty());
    let standalone = Config { ingress: Some("orders-in".into()), ..Config::default() };
    assert_eq!(topics(standalone.clone()), [("orders-in".to_owned(), None)]);
    assert_eq!(standalone.reserved_topics(), ["orders-in"], "no message may be delivered to it");
    assert!(Config { ingress: Some("hourglass-log".into()), ..Config::default() }.validate().is_ok());
    let standalone_tokens = Config { auth_tokens: Some("tokens.toml".into()), ..Config::default() };
    refused("orders-in", &standalone_tokens, "names no grant");
    refused("orders-in=orders", &Config::default(), "no --auth-tokens");
}
