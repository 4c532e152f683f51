//! `govd`, the gov control plane: compiles applied policies with
//! `gov-compiler`, keeps them (and fuse/limit state, and an audit log) on
//! disk, pushes each service's `TargetConfig` to that service's agents over
//! one gRPC stream per agent, and tracks what every agent enforces with
//! xDS-style nonces and ACK/NACK.
//!
//! ```no_run
//! # async fn demo() -> Result<(), gov_control_plane::Error> {
//! use gov_control_plane::{ControlPlane, Options, serve};
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let cp = ControlPlane::open(Options::new("./.gov-state"), shutdown.clone())?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7070").await
//!     .map_err(|source| gov_control_plane::Error::Bind { addr: "127.0.0.1:7070".into(), source })?;
//! serve(listener, cp, shutdown, std::time::Duration::from_secs(5)).await
//! # }
//! ```
//!
//! - [`ControlPlane`]: the service and its state ([`ControlPlane::watch`]
//!   gives the live `ClusterView` in process).
//! - [`ControlPlane::apply`] ([`apply`]): compile, plan, store, then push.
//! - [`serve`]: the gRPC server (`gov.v1.ControlPlane` and `grpc.health.v1`
//!   on one port) with the shutdown order every gov binary follows.
//! - [`client`]: what `govc` uses to reach a control plane.
//! - [`metrics::serve_metrics`]: `/metrics` on a listener of its own.

pub mod agent_limits;
mod agent_streams;
pub mod apply;
pub mod audit;
pub mod auth;
pub mod canary;
mod certify;
mod change;
pub mod client;
pub mod connections;
mod control_plane;
pub mod convert;
mod diagnostics;
pub mod encoded;
mod error;
pub mod etcd;
pub mod expiry;
mod gate;
pub mod history;
pub mod identity;
mod journal;
pub mod latch;
pub mod limits;
pub mod metrics;
mod options;
mod publish;
mod rollout;
mod server;
pub mod state;
pub mod store;
mod store_health;
pub mod tls_server;
mod transact;
pub mod view;
pub mod watches;

pub use agent_limits::AgentLimits;
pub use apply::{ApplyError, ApplyRequest, MAX_APPLY_WAIT};
pub use connections::{ConnectionLimits, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT};
pub use control_plane::{ControlPlane, Options};
pub use error::{Error, StateIo, one_line};
pub use history::HistoryLimit;
pub use limits::Limits;
pub use server::serve;
