//! The `hourglass` binary: parses the command line, sets up logging, and
//! hands over to the server or to a client subcommand.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use hourglass::{
    cli::{Cli, Command, ServeArgs},
    client,
};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    hourglass::memory::limit_arenas();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("HOURGLASS_LOG")
                .unwrap_or_else(|_| EnvFilter::new("info,librdkafka=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve(*args).await.map(|()| ExitCode::SUCCESS),
            Command::Schedule(args) => client::schedule(args).await,
            Command::Cancel(args) => client::cancel(args).await,
            Command::Reschedule(args) => client::reschedule(args).await,
            Command::Get(args) => client::get(args).await,
            Command::List(args) => client::list(args).await,
            Command::Stats(args) => client::stats(args).await,
            Command::Bench(args) => {
                let settings = args.settings().map_err(anyhow::Error::msg)?;
                hourglass::bench::main(settings, args.json).await
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = args.into_config().context("configuration")?;
    let listeners = hourglass::Listeners::bind(&config).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(on_signal(shutdown.clone()));
    hourglass::run(config, listeners, shutdown).await
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
