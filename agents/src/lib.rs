//! Placeholder until this crate is built; see the open issues.
