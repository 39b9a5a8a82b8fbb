//! Thin entry point: flags, then the library does the work.

use std::process::ExitCode;

use clap::Parser;

/// ic-kvevent-subscriber: the engine-pod sidecar that turns the engine's
#[derive(Debug, Parser)]
#[command(name = ic_kvevent_subscriber::BINARY, version)]
struct Args {
    #[command(flatten)]
    log: ic_telemetry::LogArgs,
    #[command(flatten)]
    config: ic_kvevent_subscriber::Config,
}

#[tokio::main]
async fn main() -> ExitCode {
    let Args { log, config } = Args::parse();
    ic_telemetry::run_service(ic_kvevent_subscriber::BINARY, &log, |shutdown| {
        ic_kvevent_subscriber::run(config, shutdown)
    })
    .await
}
