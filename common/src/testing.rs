//! Helpers for the binaries' tests (feature `testing`, a dev-dependency
//! only): each binary runs its own argument parser over what they find, so
//! neither `deploy/` nor a `--help` example can drift from the flags. A
//! failure panics with what it found, as a test's assertion does.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a failure is the calling test's"
)]

pub mod deploy_args;
pub mod help_examples;
