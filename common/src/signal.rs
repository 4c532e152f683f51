//! How `govd` and `gov-agent` wait for the signals that stop them (feature
//! `daemon`): one place, so both daemons stop on the same signals.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGTERM and SIGINT, caught from the moment [`Signals::install`] returns: a
/// signal sent as soon as the "started" line is out must not find the default
/// action (exit without draining) still in place. Install it before anything
/// is announced.
#[derive(Debug)]
pub struct Signals(Option<(Signal, Signal)>);

impl Signals {
    /// Installs the handlers. If they cannot be installed, logs it with
    /// `otherwise` (how else to stop the process); [`Signals::next`] then
    /// never returns.
    pub fn install(otherwise: &str) -> Self {
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Self(Some((term, int))),
            _ => {
                tracing::error!("cannot install signal handlers; {otherwise}");
                Self(None)
            }
        }
    }

    /// Waits for the next SIGTERM or SIGINT and returns its name.
    pub async fn next(&mut self) -> &'static str {
        let Some((term, int)) = &mut self.0 else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    }
}
