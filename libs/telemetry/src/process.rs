//! The common body of every binary's `main`: logging, signals, exit code.

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use crate::{LogArgs, shutdown_token};

/// Initialises logging from `log`, installs the SIGTERM/SIGINT handlers, runs
/// the service and maps its outcome to an exit code: 0 after a clean
/// shutdown, 1 when the service failed, 2 for unusable logging flags.
pub async fn run_service<F, Fut, E>(log: &LogArgs, service: F) -> ExitCode
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    if let Err(error) = log.init() {
        eprintln!("{error}");
        return ExitCode::from(2);
    }
    let shutdown = match shutdown_token() {
        Ok(token) => token,
        Err(error) => {
            tracing::error!(%error, "cannot install signal handlers");
            return ExitCode::FAILURE;
        }
    };
    match service(shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` prints an anyhow error with its whole cause chain.
            tracing::error!(error = format!("{error:#}"), "exiting");
            ExitCode::FAILURE
        }
    }
}
