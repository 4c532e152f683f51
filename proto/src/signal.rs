//! How `govd` and `gov-agent` wait for the signal that stops them (feature
//! `signal`): one place, so both daemons stop on the same signals.

/// Waits for SIGTERM or SIGINT and returns its name. If the handlers cannot
/// be installed, logs it with `otherwise` (how else to stop the process) and
/// never returns.
pub async fn termination(otherwise: &str) -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; {otherwise}");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
