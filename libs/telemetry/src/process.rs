//! The common body of every binary's `main`: logging, signals, exit code.

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use crate::{LogArgs, shutdown_token};

/// Environment variable that turns every binary into a flag checker: with
/// it set to a true value the binary parses its command line and environment
/// as usual, prints that they were accepted and exits 0 without starting (a
/// parse error still exits 2 with clap's message). Deployment tests feed
/// each chart container's args through it.
pub const CHECK_ARGS_ENV: &str = "IC_CHECK_ARGS";

/// Whether [`CHECK_ARGS_ENV`] asks for a parse-only run.
pub fn check_args_requested() -> bool {
    std::env::var(CHECK_ARGS_ENV).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Initialises logging (and OTLP export) of binary `name` from `log`, installs the SIGTERM/SIGINT handlers, runs
/// the service and maps its outcome to an exit code: 0 after a clean
/// shutdown, 1 when the service failed, 2 for unusable logging flags. With
/// [`CHECK_ARGS_ENV`] set it only checks the logging flags and returns 0.
pub async fn run_service<F, Fut, E>(name: &str, log: &LogArgs, service: F) -> ExitCode
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    if let Err(error) = log.init(name) {
        eprintln!("{error}");
        return ExitCode::from(2);
    }
    if check_args_requested() {
        println!("arguments accepted");
        return ExitCode::SUCCESS;
    }
    let shutdown = match shutdown_token() {
        Ok(token) => token,
        Err(error) => {
            tracing::error!(%error, "cannot install signal handlers");
            return ExitCode::FAILURE;
        }
    };
    let outcome = service(shutdown).await;
    // Spans still queued and a last metrics push, bounded so a dead
    // collector cannot hold up the exit.
    crate::otel::shutdown(std::time::Duration::from_secs(5)).await;
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` prints an anyhow error with its whole cause chain.
            tracing::error!(error = format!("{error:#}"), "exiting");
            ExitCode::FAILURE
        }
    }
}
