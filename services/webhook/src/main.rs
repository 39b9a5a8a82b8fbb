//! Thin entry point: flags, then the library does the work.

use std::process::ExitCode;

use clap::Parser;

/// ic-webhook: CacheBackend defaulting/validation and engine Pod wiring.
#[derive(Debug, Parser)]
#[command(name = ic_webhook::BINARY, version)]
struct Args {
    #[command(flatten)]
    log: ic_telemetry::LogArgs,
    #[command(flatten)]
    config: ic_webhook::Config,
}

#[tokio::main]
async fn main() -> ExitCode {
    let Args { log, config } = Args::parse();
    ic_telemetry::run_service(ic_webhook::BINARY, &log, |shutdown| {
        ic_webhook::run(config, shutdown)
    })
    .await
}
