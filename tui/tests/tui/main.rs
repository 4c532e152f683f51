//! gov-tui tests: one binary (see STYLE.md rule 11).
#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions fail loudly on purpose"
)]

mod fixtures;
mod screens;
mod update;
