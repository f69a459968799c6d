//! The command line: `hourglass serve` and the client subcommands. Every
//! flag can also come from an `HOURGLASS_*` environment variable; the doc
//! comments are the `--help` text. The server's settings are declared once,
//! in [`hourglass::config::Config`], and flattened in here.

use std::{ffi::OsString, path::PathBuf, time::Duration};

use clap::{ArgMatches, Args, Parser, Subcommand};
use hourglass::{
    config::{Config, ConfigError},
    secret::{self, Origin, Secret, SecretError},
    server::settings::{self, SettingsError},
};

/// `hourglass --version`: the version, the commit and its date.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("HOURGLASS_COMMIT"), ")");

#[derive(Debug, Parser)]
#[command(name = "hourglass", version = VERSION, about = "Delayed delivery for Apache Kafka", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How hourglass logs to stderr: text, a line per event for people;
    /// json, one object per line for a log pipeline (docs/CONFIGURATION.md
    /// lists its fields).
    #[arg(
        long,
        global = true,
        env = "HOURGLASS_LOG_FORMAT",
        value_enum,
        ignore_case = true,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server: accept messages over gRPC, park them, produce them when due.
    Serve(Box<ServeArgs>),
    /// Schedule a message for later delivery.
    Schedule(ScheduleArgs),
    /// Cancel a pending message, or every one a label selector picks; says
    /// whether each was cancelled or already settled.
    Cancel(CancelArgs),
    /// Move a pending (or failed) message to a new due time.
    Reschedule(RescheduleArgs),
    /// Show a message, its due time and its state.
    Get(IdArgs),
    /// List pending messages in the order they will be produced, a page at a
    /// time; filter by topic and dispatch-time range.
    List(ListArgs),
    /// Counts by state, the oldest overdue message, the store's size.
    Stats(StatsArgs),
    /// Ask the server's gRPC health whether it serves (over TLS too): exits
    /// 0 if so, 1 if not or unreachable. For probes and scripts.
    Health(HealthArgs),
    /// Write a consistent copy of a standalone server's stores into a new
    /// directory on the server's machine, while it serves; restore by
    /// starting a stopped server on it (docs/OPERATIONS.md, "Backup and
    /// restore"). Needs an operator token (admin = "all").
    Backup(BackupArgs),
    /// Recurring schedules: create, get, list, update, pause, resume and
    /// delete series.
    Series(crate::series::SeriesArgs),
    /// Dispatch policy of a target topic: pause, resume, rate limit, show.
    Topic(crate::topic::TopicArgs),
    /// Measure ingest, drain, precision and footprint against a real broker
    /// and store: runs the hourglass-bench binary installed beside this one
    /// with the arguments given (`hourglass bench --help` shows them).
    #[command(disable_help_flag = true)]
    Bench(BenchArgs),
}

/// A length of time as people write it; the error shows how.
pub fn duration(s: &str) -> Result<Duration, BadValue> {
    humantime::parse_duration(s)
        .map_err(|e| BadValue(format!("{e}; write a length of time like 30s, 15m or 2h 30m")))
}

/// Why a value given on the command line does not read, and how to write
/// it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadValue(String);

/// A time as RFC 3339; the error shows the format with an example.
pub fn time(s: &str) -> Result<chrono::DateTime<chrono::FixedOffset>, BadValue> {
    // chrono's own parser: RFC 3339, and the forms near it that tools
    // print (`date +%FT%T%z` writes +0100).
    s.parse::<chrono::DateTime<chrono::FixedOffset>>().map_err(|e| {
        BadValue(format!(
            "{e}: write the date, the time and the offset, as RFC 3339 has it: 2030-01-01T09:00:00Z (UTC) \
             or 2030-01-01T10:00:00+01:00"
        ))
    })
}

/// A record header given as KEY=VALUE.
pub fn header(s: &str) -> Result<(String, String), BadValue> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| BadValue("a header is KEY=VALUE, e.g. --header source=billing".to_owned()))
}

pub fn label(s: &str) -> Result<(String, String), BadValue> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| BadValue("a label is KEY=VALUE, e.g. --label order=42".to_owned()))
}

/// The server to call: a URL (`http://host:port`, `https://host:port`), or
/// `host:port` as grpcurl takes it, which means plaintext `http://`.
fn server(s: &str) -> Result<String, BadValue> {
    let url = if s.contains("://") { s.to_owned() } else { format!("http://{s}") };
    let hint = "give host:port (127.0.0.1:50051) or a URL (http://127.0.0.1:50051, https://hourglass:50051)";
    let uri: tonic::codegen::http::Uri = url.parse().map_err(|e| BadValue(format!("{e}; {hint}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(BadValue(format!("the scheme must be http or https; {hint}")));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(BadValue(format!("there is no host; {hint}")));
    }
    Ok(url)
}

/// Flags of `hourglass serve`: the settings, then the config file, then
/// the defaults shown.
#[derive(Debug, Default, Args)]
pub struct ServeArgs {
    /// TOML config file; flags and environment variables override it.
    #[arg(long = "config", env = "HOURGLASS_CONFIG", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Config,
    /// librdkafka producer property KEY=VALUE, repeatable (e.g.
    /// security.protocol=SASL_SSL). A VALUE of env:NAME or file:/path is read
    /// from there at start-up. In the environment, HOURGLASS_KAFKA_PROPERTIES
    /// takes them comma-separated, with \, for a comma inside a value.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_properties: Vec<Secret>,
    /// Check the settings (and the files they name), print them as a config
    /// file (secret values hidden) and exit, without starting.
    #[arg(long)]
    pub print_config: bool,
}

/// The environment variable that holds Kafka properties, comma-separated.
pub const KAFKA_PROPERTIES_ENV: &str = "HOURGLASS_KAFKA_PROPERTIES";

impl ServeArgs {
    /// The config file, overridden by the environment and these flags
    /// (`matches` says which were given); checked.
    pub fn into_config(self, matches: &ArgMatches) -> Result<Config, SettingsError> {
        let listed = std::env::var(KAFKA_PROPERTIES_ENV).ok().map(Secret::new);
        self.into_config_with(matches, listed)
    }

    /// As [`ServeArgs::into_config`], with `listed` as the value of
    /// `HOURGLASS_KAFKA_PROPERTIES`.
    pub fn into_config_with(
        self,
        matches: &ArgMatches,
        listed: Option<Secret>,
    ) -> Result<Config, SettingsError> {
        let file = match &self.config_file {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        let mut c = Config::merge(file, self.settings, matches);
        // The environment's list, then the flags; the list's items are
        // checked here, where their positions are known, and named by them.
        let listed =
            listed.as_ref().map(|l| secret::parse_list(l.expose())).transpose().map_err(ConfigError::from)?;
        for (n, key, value) in listed.unwrap_or_default() {
            secret::check_property(&key, &value, Origin::ListItem(n)).map_err(ConfigError::from)?;
            c.kafka_properties.insert(key, value);
        }
        for (n, property) in (1..).zip(&self.kafka_properties) {
            let (k, v) = property
                .expose()
                .split_once('=')
                .ok_or(ConfigError::Property(SecretError::FlagNotKeyValue(n)))?;
            c.kafka_properties.insert(k.trim().to_owned(), v.trim().to_owned());
        }
        settings::check(&c)?;
        Ok(c)
    }
}

/// `hourglass bench`: everything after it goes to hourglass-bench.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    pub args: Vec<OsString>,
}

/// Flags every client subcommand takes.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// Address of the hourglass server: host:port (plaintext), or a URL,
    /// http:// or https://.
    #[arg(long, env = "HOURGLASS_SERVER", default_value = "127.0.0.1:50051", value_parser = server)]
    pub server: String,
    /// Bearer token, for a server with --auth-tokens.
    #[arg(long, env = "HOURGLASS_TOKEN", hide_env_values = true)]
    pub token: Option<Secret>,
    /// PEM CA certificate to trust for an https:// server [default: the
    /// system's trusted roots]
    #[arg(long, env = "HOURGLASS_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// The name the server's certificate must hold, when it is not the
    /// host of --server (a probe in the server's own pod connects to
    /// 127.0.0.1 and names the Service here).
    #[arg(long, env = "HOURGLASS_TLS_SERVER_NAME", value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// PEM client certificate, for a server that requires mutual TLS.
    #[arg(long, env = "HOURGLASS_CLIENT_CERT", value_name = "FILE", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(long, env = "HOURGLASS_CLIENT_KEY", value_name = "FILE", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// What to print: text for people, json for scripts (one object per
    /// line; docs/API.md lists the field names).
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
    #[arg(long, value_parser = time, group = "when")]
    pub at: Option<chrono::DateTime<chrono::FixedOffset>>,
}

/// The record to produce: of a message, or of each occurrence of a series.
#[derive(Debug, Args)]
pub struct RecordArgs {
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
    #[arg(long = "header", value_name = "KEY=VALUE", value_parser = header)]
    pub headers: Vec<(String, String)>,
    /// Explicit partition (otherwise chosen from the key).
    #[arg(long)]
    pub partition: Option<i32>,
}

impl RecordArgs {
    pub fn message(&self) -> hourglass_kafka::proto::Message {
        hourglass_kafka::proto::Message {
            topic: self.topic.clone(),
            key: self.key.clone().map(String::into_bytes),
            value: self.value.clone().into_bytes(),
            headers: self
                .headers
                .iter()
                .map(|(key, value)| hourglass_kafka::proto::Header {
                    key: key.clone(),
                    value: value.clone().into_bytes(),
                })
                .collect(),
            partition: self.partition,
        }
    }
}

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub record: RecordArgs,
    /// Idempotency key: retrying with the same id never schedules twice.
    #[arg(long)]
    pub id: Option<String>,
    /// Label KEY=VALUE to find the message by (list --selector, cancel
    /// --selector), repeatable; not produced.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label)]
    pub labels: Vec<(String, String)>,
    /// Replace the pending (or failed) message under --id with this one,
    /// content and due time, instead of refusing a different request. A
    /// delivered or cancelled message is final: the replace is refused.
    #[arg(long, requires = "id")]
    pub replace: bool,
    /// A deadline, e.g. 10m: if the message cannot be produced within this
    /// long after its due time (an outage, a paused topic), it is not
    /// produced but settled expired.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub max_lateness: Option<Duration>,
    /// Where the message goes if it fails or expires: it is produced to
    /// this topic instead, with headers that say why. Default: its topic's
    /// dead-letter topic, else the server's --dead-letter-topic.
    #[arg(long, value_name = "TOPIC")]
    pub dead_letter_topic: Option<String>,
    #[command(flatten)]
    pub when: When,
}

#[derive(Debug, Args)]
pub struct IdArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Message id.
    pub id: String,
    /// Another tenant's message, for an operator token (admin = "all");
    /// your own tenant's unless given.
    #[arg(long, default_value = "")]
    pub tenant: String,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Message id.
    #[arg(required_unless_present = "selector")]
    pub id: Option<String>,
    /// Cancel every pending message whose labels match, e.g. order=42 or
    /// order=42,kind!=digest, instead of one id.
    #[arg(long, conflicts_with = "id")]
    pub selector: Option<String>,
    /// With --selector: only messages for this topic.
    #[arg(long, requires = "selector")]
    pub topic: Option<String>,
    /// With --selector: only messages dispatched at or after this time, RFC 3339.
    #[arg(long, value_parser = time, requires = "selector")]
    pub from: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// With --selector: only messages dispatched before this time, RFC 3339.
    #[arg(long, value_parser = time, requires = "selector")]
    pub to: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// Another tenant's message (with an id), for an operator token
    /// (admin = "all"); your own tenant's unless given.
    #[arg(long, default_value = "", conflicts_with = "selector")]
    pub tenant: String,
}

#[derive(Debug, Args)]
pub struct RescheduleArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Message id.
    pub id: String,
    #[command(flatten)]
    pub when: When,
    /// Another tenant's message, for an operator token (admin = "all");
    /// your own tenant's unless given.
    #[arg(long, default_value = "")]
    pub tenant: String,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Only messages for this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only messages dispatched at or after this time, RFC 3339.
    #[arg(long, value_parser = time)]
    pub from: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// Only messages dispatched before this time, RFC 3339.
    #[arg(long, value_parser = time)]
    pub to: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// Only messages whose labels match: key=value, key!=value, key or !key,
    /// comma-separated, all of which must hold.
    #[arg(long)]
    pub selector: Option<String>,
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

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// A new directory on the server's machine (an absolute path whose
    /// parent exists). On the store's filesystem the copy is made of hard
    /// links, in about no time or space; copy it elsewhere to keep it.
    pub dir: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// What to ask about: "" for the server as a whole (SERVING while it
    /// takes new messages: for readiness), liveness (SERVING while the
    /// process answers: for liveness), or hourglass.v1.Scheduler.
    #[arg(long, default_value = "")]
    pub service: String,
    /// How long to wait for the answer, connecting included.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("hourglass").chain(args.iter().copied()))
    }

    /// The settings `hourglass serve ARGS` runs with, `listed` standing for
    /// HOURGLASS_KAFKA_PROPERTIES.
    fn serve(args: &[&str], listed: Option<Secret>) -> Result<Config, SettingsError> {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let argv = ["hourglass", "serve"].into_iter().chain(args.iter().copied());
        let matches = Cli::command().try_get_matches_from(argv).unwrap();
        let serve = matches.subcommand_matches("serve").unwrap();
        ServeArgs::from_arg_matches(serve).unwrap().into_config_with(serve, listed)
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_flags_override_defaults() {
        let config = serve(
            &[
                "--listen",
                "0.0.0.0:7000",
                "--allow-unauthenticated",
                "--retention",
                "1h",
                "--kafka-property",
                "compression.type=zstd",
            ],
            None,
        )
        .unwrap();
        assert_eq!(config.listen.port(), 7000);
        assert!(config.allow_unauthenticated, "a switch alone means true");
        assert_eq!(*config.retention, Duration::from_secs(3600));
        assert_eq!(config.kafka_properties["compression.type"], "zstd");
        assert_eq!(config.metrics_listen, Config::default().metrics_listen);
    }

    #[test]
    fn a_config_file_fills_in_what_the_flags_leave() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hourglass.toml");
        std::fs::write(
            &file,
            "retention = \"2days\"\nmax_pending = 5\n[kafka_properties]\n\"linger.ms\" = \"7\"\n",
        )
        .unwrap();
        let file = file.to_str().unwrap();
        let config =
            serve(&["--config", file, "--max-pending", "9", "--kafka-property", "acks=all"], None).unwrap();
        assert_eq!(*config.retention, Duration::from_secs(2 * 86_400), "the file's");
        assert_eq!(config.max_pending, 9, "the flag's");
        assert_eq!(config.kafka_properties["linger.ms"], "7");
        assert_eq!(config.kafka_properties["acks"], "all");
        assert_eq!(config.listen, Config::default().listen, "the default");
    }

    #[test]
    fn a_malformed_property_is_refused() {
        assert!(serve(&["--kafka-property", "novalue"], None).unwrap_err().to_string().contains("KEY=VALUE"));
    }
    /// A password with every character that has tripped a parser.
    const PASSWORD: &str = "Pw1,Xq9=Zk\"Jj";

    #[test]
    fn kafka_properties_from_the_environment_keep_secrets_out_of_errors_and_debug() {
        let escaped = PASSWORD.replace(',', "\\,");
        let listed = Secret::new(format!("security.protocol=SASL_SSL,sasl.password={escaped}"));
        let config = serve(&[], Some(listed)).unwrap();
        assert_eq!(config.kafka_properties["sasl.password"], PASSWORD, "an escaped comma stays in the value");
        // Unescaped, the password splits in two; neither piece may show,
        // nor what parsed the arguments.
        for listed in [format!("sasl.password={PASSWORD}"), "sasl.password=Pw1,Xq9".to_owned()] {
            let err = serve(&[], Some(Secret::new(listed))).unwrap_err().to_string();
            assert!(err.contains("HOURGLASS_KAFKA_PROPERTIES"), "{err}");
            for piece in ["Pw1", "Xq9", "Zk", "Jj"] {
                assert!(!err.contains(piece), "{err}");
            }
        }
        let flag = format!("sasl.password={PASSWORD}");
        let Command::Serve(args) = parse(&["serve", "--kafka-property", &flag]).unwrap().command else {
            panic!("not serve");
        };
        assert!(!format!("{args:?}").contains("Pw1"), "{args:?}");
        assert_eq!(
            serve(&["--kafka-property", &flag], None).unwrap().kafka_properties["sasl.password"],
            PASSWORD
        );
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

    /// Usage errors are clap's (exit 2) and say what to write instead.
    #[test]
    fn bad_values_say_what_to_write() {
        let err = parse(&["schedule", "--topic", "t", "--value", "v", "--at", "2027-01-01"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("2030-01-01T09:00:00Z"), "{err}");
        let err = parse(&["schedule", "--topic", "t", "--value", "v", "--delay", "5"]).unwrap_err();
        assert!(err.to_string().contains("30s, 15m"), "{err}");
        let err =
            parse(&["schedule", "--topic", "t", "--value", "v", "--delay", "1s", "--header", "novalue"])
                .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("KEY=VALUE"), "{err}");
        assert!(parse(&["list", "--from", "tomorrow"]).unwrap_err().to_string().contains("RFC 3339"));
        assert!(parse(&["list", "--from", "2030-01-01T09:00:00+0100"]).is_ok(), "as date +%FT%T%z prints it");
        let err =
            parse(&["schedule", "--topic", "t", "--value", "v", "--delay", "1s", "--replace"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--id"), "a replace names the message it replaces: {err}");
        assert!(
            parse(&["schedule", "--topic", "t", "--value", "v", "--delay", "1s", "--id", "a", "--replace"])
                .is_ok()
        );
    }

    #[test]
    fn the_server_is_host_port_or_a_url() {
        let server = |s: &str| match parse(&["stats", "--server", s]).map(|c| c.command) {
            Ok(Command::Stats(args)) => Ok(args.client.server),
            Ok(_) => unreachable!(),
            Err(e) => Err(e),
        };
        assert_eq!(server("127.0.0.1:50051").unwrap(), "http://127.0.0.1:50051");
        assert_eq!(server("hourglass.internal:50051").unwrap(), "http://hourglass.internal:50051");
        assert_eq!(server("https://hourglass:50051").unwrap(), "https://hourglass:50051");
        assert_eq!(server("http://127.0.0.1:50051").unwrap(), "http://127.0.0.1:50051");
        let err = server("ftp://x:1").unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("host:port"), "{err}");
        let Command::Stats(args) = parse(&["stats"]).unwrap().command else { panic!() };
        assert_eq!(args.client.server, "http://127.0.0.1:50051", "the default");
    }

    #[test]
    fn security_flags_reach_the_config_and_the_client() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, "[[token]]\nname = \"a\"\ntoken = \"t\"\ntopics = [\"*\"]\n").unwrap();
        let tokens = tokens.to_str().unwrap();
        let config = serve(&["--auth-tokens", tokens, "--max-streams-per-connection", "64"], None).unwrap();
        assert_eq!(config.auth_tokens.as_deref(), Some(std::path::Path::new(tokens)));
        assert_eq!(config.max_streams_per_connection, 64);
        assert!(
            serve(&["--tls-cert", "c.pem"], None)
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

    #[test]
    fn bench_takes_every_argument_as_it_is() {
        let Command::Bench(bench) = parse(&["bench", "--scale", "0.01", "--help"]).unwrap().command else {
            panic!("not bench");
        };
        assert_eq!(bench.args, ["--scale", "0.01", "--help"]);
    }
}
