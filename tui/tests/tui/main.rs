//! gov-tui tests: one binary (see STYLE.md rule 11).
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers outside #[test] functions fail loudly on purpose"
)]

mod client;
mod e2e;
mod fixtures;
mod screens;
mod update;
