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

pub mod apply;
pub mod audit;
pub mod auth;
pub mod client;
pub mod connections;
mod control_plane;
pub mod convert;
mod error;
pub mod etcd;
pub mod history;
pub mod latches;
pub mod limits;
pub mod metrics;
mod server;
pub mod state;
pub mod store;
pub mod view;

use std::time::Duration;

use gov_proto::v1 as pb;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use apply::{ApplyError, ApplyRequest, MAX_APPLY_WAIT};
pub use connections::ConnectionLimits;
pub use control_plane::{ControlPlane, Options};
pub use error::{Error, StateIo, one_line};
pub use history::HistoryLimit;
pub use limits::Limits;

/// HTTP/2 keepalive: pings this often notice a dead agent or client.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// ... and give up on a peer that does not answer within this.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks that `tls` can be served (the certificate and key match and
/// parse), so that govd says so before it reports itself started.
pub fn check_tls(tls: &tonic::transport::ServerTlsConfig) -> Result<(), Error> {
    tonic::transport::Server::builder()
        .tls_config(tls.clone())
        .map(|_| ())
        .map_err(Error::Tls)
}

/// Serves `control_plane` on `listener` until `shutdown` is cancelled, then:
/// health NOT_SERVING, agent and watch streams closed, in-flight calls
/// drained (at most `drain`), state flushed to disk.
pub async fn serve(
    listener: TcpListener,
    control_plane: ControlPlane,
    shutdown: CancellationToken,
    drain: Duration,
) -> Result<(), Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<pb::control_plane_server::ControlPlaneServer<ControlPlane>>()
        .await;
    // No Nagle: a response's headers, data and trailers go out at once instead of
    // waiting for the peer's delayed ACK (about 40ms per small RPC otherwise).
    let limits = control_plane.inner.connections;
    let incoming = tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(limits.tcp_keepalive));
    let incoming = connections::capped(incoming, limits);
    let signal = {
        let shutdown = shutdown.clone();
        let reporter = reporter.clone();
        async move {
            shutdown.cancelled().await;
            reporter
                .set_not_serving::<pb::control_plane_server::ControlPlaneServer<ControlPlane>>()
                .await;
            reporter
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
        }
    };
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = control_plane.inner.tls.clone() {
        builder = builder
            .tls_config(tls.timeout(limits.handshake_timeout))
            .map_err(Error::Tls)?;
    }
    let server = builder
        .http2_keepalive_interval(Some(limits.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(limits.http2_keepalive_timeout))
        .max_concurrent_streams(limits.max_streams_per_connection)
        .add_service(health)
        .add_service(control_plane.grpc())
        .serve_with_incoming_shutdown(incoming, signal);
    let mut server = std::pin::pin!(server);
    tokio::select! {
        result = &mut server => {
            // The server stopped on its own: that is an error unless we were stopping.
            result.map_err(Error::Serve)?;
        }
        () = shutdown.cancelled() => {
            tracing::info!("stopping: NOT_SERVING, closing streams, draining");
            match tokio::time::timeout(drain, &mut server).await {
                Ok(result) => result.map_err(Error::Serve)?,
                Err(_) => tracing::warn!(?drain, "drain deadline passed; closing remaining connections"),
            }
        }
    }
    control_plane.flush().await?;
    tracing::info!("state flushed; stopped");
    Ok(())
}
