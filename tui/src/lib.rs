//! `gov-tui`: the live governance view behind `govc tui`.
//!
//! The crate follows the Elm shape (STYLE.md rule 12): [`App`] holds all state,
//! [`update`] is the only function that changes it, and [`render`] draws a frame
//! as a pure function of it. The runtime ([`run`]) feeds terminal keys, a
//! one-second tick and messages from a background `Watch` task into one loop
//! and performs the [`Action`]s that `update` returns.
//!
//! Everything but [`run`] works without a terminal, so tests render whole
//! screens into `ratatui::backend::TestBackend`.

mod app;
mod client;
mod format;
mod history;
mod keys;
mod render;
mod runtime;

pub use app::{Action, App, Connection, Mode, Msg, Pane, ReleaseOutcome, update};
pub use client::{WatchOptions, release, watch};
pub use format::duration;
pub use history::{RATE_WINDOW_MS, RuleRates};
pub use render::render;
pub use runtime::{TuiError, TuiOptions, run};

/// Re-exported so callers and tests build messages with the same types.
pub use gov_proto::v1 as proto;
