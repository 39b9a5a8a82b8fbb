//! Thin entry point: flags, then the library does the work.

use std::process::ExitCode;

use clap::Parser;

/// ic-index-server: the prefix index behind LookupRoute.
#[derive(Debug, Parser)]
#[command(name = ic_index_server::BINARY, version)]
struct Args {
    #[command(flatten)]
    log: ic_telemetry::LogArgs,
    #[command(flatten)]
    config: ic_index_server::Config,
}

#[tokio::main]
async fn main() -> ExitCode {
    let Args { log, config } = Args::parse();
    ic_telemetry::run_service(ic_index_server::BINARY, &log, |shutdown| {
        ic_index_server::run(config, shutdown)
    })
    .await
}
