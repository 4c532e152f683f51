//! The terminal loop: keys, a one-second tick and control-plane messages go
//! through [`update`]; every change is followed by a redraw.
//!
//! The terminal is put back on every exit path: `ratatui::try_init` installs
//! a panic hook that restores it, and a guard restores it when [`run`]
//! returns or its future is dropped. Nothing here writes to stdout or stderr.

use std::io::IsTerminal as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use ratatui::DefaultTerminal;
use ratatui::crossterm::event::{Event, EventStream};
use tokio::sync::mpsc;

use crate::app::{Action, App, Msg, ReleaseOutcome, update};
use crate::client::{WatchOptions, error_chain, release, watch};
use crate::render::render;

/// What `govc tui` passes in.
#[derive(Debug, Clone)]
pub struct TuiOptions {
    /// The control plane, e.g. `http://127.0.0.1:7070`.
    pub control_plane: String,
    /// Bearer token for `Watch` and `Release`.
    pub token: Option<String>,
    /// TLS (`--tls-ca`) for an `https://` URL.
    pub tls: gov_common::tls::ClientTls,
    /// Hide and refuse release.
    pub readonly: bool,
    /// Recorded as the releasing operator in the audit log.
    pub who: String,
    /// Only this service; empty: all.
    pub service: String,
}

/// Why the TUI could not run.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum TuiError {
    #[error("invalid control plane url `{url}`: {reason}")]
    #[diagnostic(
        code(gov::tui::url),
        help(
            "give a URL such as `http://127.0.0.1:7070` with --control-plane or GOV_CONTROL_PLANE"
        )
    )]
    Url { url: String, reason: String },
    #[error("cannot use the terminal")]
    #[diagnostic(
        code(gov::tui::terminal),
        help("`govc tui` needs an interactive terminal; use `govc status` in scripts")
    )]
    Terminal(#[from] std::io::Error),
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Runs the TUI until the operator quits.
pub async fn run(opts: TuiOptions) -> Result<(), TuiError> {
    let watch_opts = WatchOptions {
        url: opts.control_plane.clone(),
        token: opts.token.clone(),
        tls: opts.tls.clone(),
        service: opts.service.clone(),
    };
    // Refuse a bad URL before taking over the terminal.
    watch_opts.endpoint().map_err(|e| TuiError::Url {
        url: opts.control_plane.clone(),
        reason: error_chain(&e),
    })?;

    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(TuiError::Terminal(std::io::Error::other(
            "standard input and output must be a terminal",
        )));
    }
    // Installs the panic hook that restores the terminal, then raw mode and
    // the alternate screen.
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            ratatui::restore();
            return Err(TuiError::Terminal(e));
        }
    };
    let (tx, rx) = mpsc::channel(64);
    // Restores the terminal and stops the watch task however this future
    // ends: returned, failed, or dropped by a caller's `select!`.
    let _guard = Guard(tokio::spawn(watch(watch_opts.clone(), tx.clone())));
    let mut app = App::new(opts.control_plane.clone(), opts.readonly, now_ms());
    event_loop(&mut terminal, &mut app, rx, tx, &watch_opts, &opts.who).await
}

/// Puts the terminal back and stops the watch task on drop.
struct Guard(tokio::task::JoinHandle<()>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.abort();
        ratatui::restore();
    }
}

async fn event_loop(
    terminal: &mut DefaultTerminal,
    app: &mut App,
    mut rx: mpsc::Receiver<Msg>,
    tx: mpsc::Sender<Msg>,
    opts: &WatchOptions,
    who: &str,
) -> Result<(), TuiError> {
    let mut events = EventStream::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut term = terminate_signal()?;

    terminal.draw(|f| render(app, f))?;
    loop {
        let msg = tokio::select! {
            event = events.next() => match event {
                Some(Ok(Event::Key(key))) => Msg::Key(key),
                // Resizes and other events only need a redraw.
                Some(Ok(_)) => Msg::Tick(now_ms()),
                Some(Err(e)) => return Err(TuiError::Terminal(e)),
                None => return Ok(()),
            },
            _ = tick.tick() => Msg::Tick(now_ms()),
            Some(msg) = rx.recv() => msg,
            () = &mut term => return Ok(()),
        };
        match update(app, msg) {
            Some(Action::Quit) => return Ok(()),
            Some(Action::Release { kind, rule }) => {
                let (tx, opts, who) = (tx.clone(), opts.clone(), who.to_owned());
                tokio::spawn(async move {
                    let result = release(&opts, kind, rule.clone(), who).await;
                    let _closed = tx
                        .send(Msg::ReleaseDone(ReleaseOutcome { kind, rule, result }))
                        .await;
                });
            }
            None => {}
        }
        terminal.draw(|f| render(app, f))?;
    }
}

/// Resolves on SIGTERM or SIGHUP, so that `kill` also restores the terminal.
#[cfg(unix)]
fn terminate_signal() -> std::io::Result<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    Ok(Box::pin(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
    }))
}

#[cfg(not(unix))]
fn terminate_signal() -> std::io::Result<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>> {
    Ok(Box::pin(std::future::pending()))
}
