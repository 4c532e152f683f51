//! gov-agent: the sidecar around the gov engine ([`gov_engine`]): a reverse proxy
//! beside one service instance (its own HTTP/1.1 path and hyper for HTTP/2 and
//! the unusual), the control-plane client, the instance lifecycle (readiness,
//! registration, ramp, ordered shutdown), the latches kept in the state
//! directory across restarts, and the Redis backend of cluster counters. The `gov-agent` binary runs it.
//!
//! A Rust service that wants the rules in process uses [`gov_engine`] directly.

pub mod cluster;
pub mod control;
pub mod decision_log;
pub mod health;
pub mod identity;
pub mod latches;
pub mod lifecycle;
pub mod sidecar;
mod state_dir;
