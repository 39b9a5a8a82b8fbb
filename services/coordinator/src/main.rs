//! Thin entry point: flags, then the library does the work.

use std::process::ExitCode;

use clap::Parser;

// The request paths allocate per key and per entry; mimalloc's fast paths
// cost a fraction of glibc's there (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Run the coordinator, as `lmcache coordinator ...` does (the same
    /// flags; the bare form without a subcommand is the same thing).
    Coordinator(Box<CoordinatorArgs>),
    /// Replay a recorded `.lct` event trace into a running coordinator.
    Replay(ic_coordinator_client::replay::ReplayArgs),
}

#[derive(Debug, clap::Args)]
struct CoordinatorArgs {
    #[command(flatten)]
    config: ic_coordinator::Config,
}

#[tokio::main]
async fn main() -> ExitCode {
    let Args {
        log,
        config,
        command,
    } = Args::parse();
    // The log and OTLP flags are global, so they parse before or after
    // the subcommand alike.
    let (config, replay) = match command {
        Some(Command::Coordinator(args)) => (args.config, None),
        Some(Command::Replay(args)) => (config, Some(args)),
        None => (config, None),
    };
    match replay {
        None => {
            ic_telemetry::run_service(ic_coordinator::BINARY, &log, |shutdown| {
                ic_coordinator::run(config, shutdown)
            })
            .await
        }
        Some(args) => {
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
