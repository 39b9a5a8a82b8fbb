//! Thin entry point: flags, then the library does the work.

use std::process::ExitCode;

use clap::Parser;

/// ic-coordinator: the LMCache-compatible fleet coordinator.
#[derive(Debug, Parser)]
#[command(name = ic_coordinator::BINARY, version)]
struct Args {
    #[command(flatten)]
    log: ic_telemetry::LogArgs,
    #[command(flatten)]
    config: ic_coordinator::Config,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Replay a recorded `.lct` event trace into a running coordinator.
    Replay(ic_coordinator_client::replay::ReplayArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let Args {
        log,
        config,
        command,
    } = Args::parse();
    match command {
        None => {
            ic_telemetry::run_service(ic_coordinator::BINARY, &log, |shutdown| {
                ic_coordinator::run(config, shutdown)
            })
            .await
        }
        Some(Command::Replay(args)) => {
            ic_telemetry::run_service(ic_coordinator::BINARY, &log, |_shutdown| async move {
                let report = ic_coordinator_client::replay::replay(&args).await?;
                tracing::info!(
                    frames = report.frames,
                    applied = report.applied,
                    duplicates = report.duplicates,
                    stale = report.stale,
                    lifecycle = report.lifecycle,
                    rejected = report.rejected,
                    unknown_qualnames = report.unknown_qualnames,
                    unknown_phases = report.unknown_phases,
                    malformed = report.malformed,
                    "replay finished"
                );
                anyhow::Ok(())
            })
            .await
        }
    }
}
