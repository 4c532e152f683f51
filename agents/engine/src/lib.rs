//! gov-engine: the enforcement engine of gov, a library a Rust service embeds in
//! process (as Java services embed Resilience4j or Sentinel), and the core of the
//! `gov-agent` sidecar. It has no HTTP server, gRPC or Redis client among its
//! dependencies.
//!
//! # The engine API
//!
//! ```no_run
//! # async fn demo(target: gov_proto::v1::TargetConfig) -> Result<(), Box<dyn std::error::Error>> {
//! use gov_engine::{Engine, Outcome, RequestInfo};
//!
//! let engine = Engine::empty("order");
//! engine.apply_target(&target)?; // typed `InvalidConfig` (with the rule) on bad wire data
//!
//! let (method, headers) = (http::Method::GET, http::HeaderMap::new());
//! match engine.admit(&RequestInfo::inbound(&method, "/orders/7", &headers)).await {
//!     Ok(mut admission) => {
//!         // ... forward, honouring `admission.timeout()`; count streamed
//!         // bytes with `admission.add_bytes(n)` or `admission.byte_meter()` ...
//!         admission.record(Outcome::Status(200)); // at the response head
//!         drop(admission); // when the body is done: releases permits
//!     }
//!     Err(rejection) => {
//!         let _response = rejection.to_response(); // status, `gov-rejected-by`, `Retry-After`
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! - [`Engine`] (cheap `Clone`): [`Engine::apply`] / [`Engine::apply_target`]
//!   swap the config atomically, keeping the state of unchanged rules;
//!   [`Engine::admit`] (async, may wait for a bulkhead permit or a shaping
//!   delay) and [`Engine::try_admit`] (never waits; returns
//!   [`Decision::Wait`] with a [`Pending`] to await) decide per request;
//!   [`Engine::release_fuse`] / [`Engine::release_limit`] are the operator
//!   commands; [`Engine::stats`] (per rule: in flight, waiting, admitted,
//!   rejected by reason, latency buckets, fuse state, limit engaged),
//!   [`Engine::tripped_fuses`], [`Engine::engaged_limits`] and
//!   [`Engine::subscribe`] (fuse tripped / limit engaged / released events)
//!   feed `/metrics` and the control plane; [`Engine::latches`] and
//!   [`Engine::restore_latch`] export and re-arm tripped fuses and engaged
//!   limits ([`Latch`]) across a restart.
//! - [`Admission`]: an RAII guard. [`Admission::record`] reports the
//!   [`Outcome`] (fuses, latency), dropping releases the permits;
//!   [`Admission::timeout`] is the route's deadline, [`Admission::timed_out`]
//!   turns an expired one into a 504 [`Rejection`].
//! - [`deadline`]: the caller's own deadline (`grpc-timeout`, `gov-timeout`):
//!   [`Engine::admit_until`] refuses a call that used it up before admission
//!   (counted by [`Engine::doomed_calls`]), it caps [`Admission::timeout`],
//!   and [`Admission::forwarded_deadline`] is what the forwarded request
//!   carries ([`deadline::write`]).
//! - [`Rejection`]: rule (`service/rule`), [`RejectReason`], status,
//!   `Retry-After`; [`Rejection::to_response`] is the one mapping to HTTP.
//! - Rules in [`Mode::Shadow`] never reject or delay: what they would have
//!   refused is counted ([`RuleStats::shadow_rejected`]) and listed per call
//!   as [`WouldReject`]s by [`Admission::would_reject`] and
//!   [`Rejection::would_reject`]; [`Admission::stamps`] names those to mark
//!   upstream ([`WOULD_REJECT_BY`], written by [`Admission::stamp`]).
//! - [`GovernLayer`] / [`Govern`]: an admitted call's whole life as a tower
//!   layer around any `Service<http::Request<B>>` (`examples/in_process.rs`),
//!   and the sidecar's hyper path: an [`Observe`]r told of the decisions
//!   (a decision log), a [`CallTarget`] extension for outbound calls, a
//!   [`CallError`] by which the inner service tells how a call failed.
//! - [`path::normalize`]: the path normalization the sidecar applies before
//!   matching (RFC 3986 section 6).
//! - [`cluster::ClusterStore`]: shared counters of `scope cluster` limits over a
//!   [`cluster::Backend`] (Redis in `gov-agent`).
//!
//! The decision does not allocate and takes no lock when at most
//! [`route::INLINE_RULES`] rules match and their scopes exist (a governed
//! call's state is boxed from a per-thread free list, allocated only while
//! a thread's list is empty); only
//! `tokio::time` is read, so every state machine runs under paused time in tests.

pub mod admission;
pub mod body;
mod clock;
pub mod cluster;
pub mod config;
pub mod criticality;
pub mod deadline;
pub mod decision;
mod divisor;
pub mod engine;
pub mod events;
pub mod grpc;
pub mod judged;
pub mod latch;
pub mod layer;
pub mod outcome;
mod phase;
mod primitive;
mod quick;
pub mod rejection;
pub mod request;
pub mod route;
mod snapshot;
mod state;
pub mod stats;
mod stripe;
mod weight;
mod window;

pub use admission::Ended;
pub use body::{GovBody, MeteredBody};
pub use cluster::ClusterStore;
pub use config::{CompiledConfig, Direction, InvalidConfig, Mode, RuleId, RuleKind};
pub use engine::{
    Admission, Applied, ByteMeter, CommandError, Decision, Engine, FuseView, LimitView, Observe,
    Pending, RequestInfo, StatsSnapshot, Target, VerifiedClaims,
};
pub use events::{Event, EventKind};
pub use gov_proto::path;
pub use judged::JudgedHeaderError;
pub use latch::{InvalidLatch, Latch, LatchKind, Restored};
pub use layer::{CallError, CallTarget, CountAsSystemError, Govern, GovernLayer};
pub use outcome::Outcome;
pub use rejection::{
    DEADLINE_EXCEEDED, DeadlineEnd, LimitPolicy, RATELIMIT, RATELIMIT_POLICY, REJECTED_BY,
    RejectReason, Rejection, WOULD_REJECT_BY, WouldReject,
};
pub use route::Headers;
pub use state::retry::RetryPolicy;
pub use stats::{FuseState, LATENCY_BUCKETS_MS, MAX_ENGAGED_KEYS, RuleStats};
pub use weight::FULL_WEIGHT;
