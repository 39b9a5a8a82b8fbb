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
}

#[tokio::main]
async fn main() -> ExitCode {
    let Args { log, config } = Args::parse();
    ic_telemetry::run_service(&log, |shutdown| ic_coordinator::run(config, shutdown)).await
}
