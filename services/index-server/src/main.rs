//! Thin entry point: flags, then the library does the work.

use std::process::ExitCode;

use clap::Parser;

// mimalloc below 1 MiB: the endpoint picker's decision no longer waits for
// glibc to consolidate what tokenizing the prompt freed, and tokenizing
// itself allocates less dearly (docs/benchmarks.md, "The picker's decision
// against LookupRoute"); huge blocks stay with glibc (libs/alloc).
#[global_allocator]
static ALLOCATOR: ic_alloc::SplitAlloc = ic_alloc::SplitAlloc;

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
