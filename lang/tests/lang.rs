//! Tests of the `.gov` language: examples, syntax errors, formatter, properties.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod lang {
    pub mod common;
    mod examples;
    mod format;
    mod fuzz;
    mod props;
    mod syntax;
}
