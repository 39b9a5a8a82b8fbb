//! Thin entry point: flags, then the library does the work.

use std::process::ExitCode;

use clap::Parser;

/// ic-controller: CacheBackend reconciliation, the CacheIndex poller and the
/// CachePolicy / CacheTenant pushers, behind Lease leader election.
#[derive(Debug, Parser)]
#[command(name = ic_controller::BINARY, version)]
struct Args {
    #[command(flatten)]
    log: ic_telemetry::LogArgs,
    #[command(flatten)]
    config: ic_controller::Config,
}

#[tokio::main]
async fn main() -> ExitCode {
    let Args { log, config } = Args::parse();
    ic_telemetry::run_service(ic_controller::BINARY, &log, |shutdown| {
        ic_controller::run(config, shutdown)
    })
    .await
}
