//! Graceful shutdown on SIGTERM (Kubernetes) and SIGINT (terminals).

use tokio_util::sync::CancellationToken;

/// Returns a token that is cancelled when the process receives SIGTERM or
/// SIGINT. Every long-running task selects on it and winds down; `main`
/// returns once they have.
///
/// Must be called from within a tokio runtime.
pub fn shutdown_token() -> std::io::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        let which = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            () = trigger.cancelled() => return,
        };
        tracing::info!(signal = which, "shutdown requested");
        trigger.cancel();
    });
    Ok(token)
}
