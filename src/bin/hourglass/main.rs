//! The `hourglass` binary: parses the command line, sets up logging, and
//! hands over to the server or to a client subcommand. The command line
//! ([`cli`]) and the client ([`client`]) belong to this binary, not to the
//! library.

mod cli;
mod client;
mod series;
mod topic;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory as _, FromArgMatches as _};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use cli::{Cli, Command, LogFormat, ServeArgs};

hourglass::memory::jemalloc!();

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::Bench(args) = cli.command {
        return bench(args.args);
    }
    log_to_stderr(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => {
                let serve_matches = matches.subcommand_matches("serve").context("the serve arguments")?;
                serve(*args, serve_matches).await
            }
            Command::Schedule(args) => client::schedule(args).await,
            Command::Cancel(args) => client::cancel(args).await,
            Command::Reschedule(args) => client::reschedule(args).await,
            Command::Get(args) => client::get(args).await,
            Command::List(args) => client::list(args).await,
            Command::Stats(args) => client::stats(args).await,
            Command::Backup(args) => client::backup(args).await,
            Command::Health(args) => client::health(args).await,
            Command::Series(args) => series::run(args).await,
            Command::Topic(args) => topic::run(args).await,
            Command::Bench(_) => unreachable!("run before the runtime starts"),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            match cli.log_format {
                LogFormat::Text => eprintln!("error: {e:#}"),
                LogFormat::Json => tracing::error!("{e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr, filtered by `HOURGLASS_LOG`: lines for people (coloured
/// at a terminal, unless `NO_COLOR`), or one JSON object per event with
/// the spans it happened in.
fn log_to_stderr(format: LogFormat) {
    let filter =
        EnvFilter::try_from_env("HOURGLASS_LOG").unwrap_or_else(|_| EnvFilter::new("info,librdkafka=warn"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs
            .with_ansi(
                std::io::IsTerminal::is_terminal(&std::io::stderr())
                    && std::env::var_os("NO_COLOR").is_none(),
            )
            .init(),
        LogFormat::Json => {
            logs.json().flatten_event(true).with_current_span(true).with_span_list(true).init();
            // A panic is an event like any other, not text among the JSON.
            std::panic::set_hook(Box::new(|panic| {
                let thread = std::thread::current();
                tracing::error!(thread = thread.name().unwrap_or("unnamed"), "{panic}");
            }));
        }
    }
}

async fn serve(args: ServeArgs, matches: &clap::ArgMatches) -> anyhow::Result<ExitCode> {
    let print = args.print_config;
    let config = args.into_config(matches).context("configuration")?;
    if print {
        print!("{}", toml::to_string(&config).context("writing the settings as TOML")?);
        return Ok(ExitCode::SUCCESS);
    }
    // SIGHUP's default action ends the process; once a handler is
    // registered it never runs again, so none that comes after the ports
    // are bound can (the server reloads its tokens on it).
    let _ = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    let listeners = hourglass::Listeners::bind(&config).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(on_signal(shutdown.clone()));
    hourglass::run(config, listeners, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `hourglass-bench` from beside this binary with `args`, and exits
/// as it does. The bench is a tool of its own crate, not part of the
/// server's build.
fn bench(args: Vec<std::ffi::OsString>) -> ExitCode {
    let beside = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join("hourglass-bench")));
    let Some(bench) = beside.filter(|path| path.exists()) else {
        eprintln!(
            "error: hourglass bench runs the hourglass-bench binary, which is not installed beside this one; \
             build it with `cargo build --release -p hourglass-bench` (see docs/BENCHMARKS.md)"
        );
        return ExitCode::FAILURE;
    };
    match std::process::Command::new(&bench).args(args).status() {
        Ok(status) => {
            status.code().and_then(|c| u8::try_from(c).ok()).map_or(ExitCode::FAILURE, ExitCode::from)
        }
        Err(e) => {
            eprintln!("error: running {}: {e}", bench.display());
            ExitCode::FAILURE
        }
    }
}

/// Cancels `shutdown` on SIGTERM or SIGINT.
async fn on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    shutdown.cancel();
}
