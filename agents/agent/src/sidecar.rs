//! The `gov-agent` sidecar: a reverse proxy that enforces a service's `TargetConfig`.
//!
//! ```text
//!  clients ──▶ inbound listener ──▶ local service           (server-side rules)
//!  local service ──▶ outbound listener ──▶ other services   (client-side rules)
//!  admin listener: /metrics /ready /live POST /shutdown
//! ```
//!
//! [`Sidecar::start`] binds every listener, loads the config file (and watches it for
//! changes), and serves until [`Sidecar::shutdown`] (or `POST /shutdown`); then it
//! stops accepting, drains in-flight requests within the drain deadline, and
//! [`Sidecar::stopped`] returns. The `gov-agent` binary is a thin shell around this,
//! and the integration tests run it in process.
//!
//! HTTP/1.1 requests take the agent's own path (`h1`: heads parsed in place, one
//! task per client connection driving its upstream connections too); hyper serves
//! HTTP/2 and whatever that path hands over (`proxy`, with the upstream clients of `upstream`).

mod abandoned;
mod admin;
mod consumer;
mod drain;
mod endpoints;
mod front;
mod h1;
mod headers;
mod listener;
mod metrics;
mod mtls;
mod options;
mod proxy;
mod reload;
mod serve;
mod start;
mod upgrade;
mod upstream;
pub mod workers;

pub use mtls::{Caller, InboundMtls, MtlsError, OutboundMtls, PeerTls};
pub use options::*;

use std::net::SocketAddr;
use std::sync::Arc;

use gov_engine::Engine;
use tokio_util::sync::CancellationToken;

pub use crate::health::Health;
pub use abandoned::DEFAULT_CLIENT_GONE_HOLD;
pub use consumer::{Invalid, Verifier};
pub use endpoints::{endpoints_to, restore_endpoints};
pub use listener::GOV_SERVICE;
pub use reload::{ConfigError, ConfigStatus, parse_config, read_config};
pub use start::StartError;
pub use upstream::{Balance, Directory, EndpointSpec, InvalidOutlier, Outliers, UpstreamProtocol};

/// A running sidecar.
pub struct Sidecar {
    inbound: SocketAddr,
    outbound: Option<SocketAddr>,
    admin: Option<SocketAddr>,
    stop: CancellationToken,
    health: Arc<Health>,
    config: Arc<ConfigStatus>,
    engine: Engine,
    latches: Option<Arc<crate::latches::LatchStore>>,
    lifecycle: Arc<crate::lifecycle::Lifecycle>,
    directory: Arc<Directory>,
    mtls: Arc<PeerTls>,
    /// `--control-plane`, for the source `GET /config` names.
    control_plane: Option<String>,
    done: tokio::task::JoinHandle<()>,
}

impl Sidecar {
    /// Loads the config, binds every listener and starts serving.
    pub async fn start(options: Options) -> Result<Self, StartError> {
        let stop = CancellationToken::new();
        let health = Arc::new(Health::default());
        let config = Arc::new(ConfigStatus::default());
        let drain_deadline = crate::lifecycle::DrainDeadline::new(options.drain_timeout);
        let admin_stop = CancellationToken::new();
        let lifecycle = crate::lifecycle::Lifecycle::new(crate::lifecycle::Parts {
            health: health.clone(),
            stop: stop.clone(),
            drained: admin_stop.clone(),
            drain_deadline: drain_deadline.clone(),
            service: Arc::new(crate::lifecycle::HttpService {
                upstream: options.upstream.clone(),
                pid: options.service_pid,
            }),
        });

        // The config first: a bad file at start is an error, not a silent empty policy.
        let engine = match options.cluster_store.clone() {
            Some(store) => Engine::with_cluster_store(&options.service, store),
            None => Engine::empty(&options.service),
        };
        engine.set_max_keys_per_rule(options.max_keys_per_rule);
        tokio::spawn(lifecycle.follow_weight(engine.clone()));
        // Before the config: a config's outlier policies are the directory's.
        let directory = Arc::new(Directory::new(options.balance, &options.instances));
        let applied = start::Applied {
            config: config.clone(),
            lifecycle: lifecycle.clone(),
            health: health.clone(),
        };
        let initial = start::load_config(&options, &engine, &directory, &applied).await?;
        // Then the latches kept across the restart, before any call is admitted: a fuse
        // tripped before the restart refuses the first call after it.
        let latches = start::open_latches(&options, &engine);

        let start::Bound {
            inbound,
            outbound,
            admin,
            addrs: (inbound_addr, outbound_addr, admin_addr),
        } = start::bind_all(&options).await?;

        if let (Some(path), Some(bytes)) = (&options.config, initial) {
            let cx = (engine.clone(), directory.clone(), applied.clone());
            start::watch_file(&options, path, bytes, stop.clone(), cx)?;
        }

        let decision_log = options
            .decision_log
            .as_ref()
            .map(|o| crate::decision_log::DecisionLog::start(o, &options.service, engine.clone()))
            .transpose()?;
        let shared = start::shared(&options, &engine, &directory, decision_log.clone());
        // The proxy listeners drain on `stop`; the admin listener keeps answering
        // (`/ready` says 503) until they are done, then stops on `admin_stop`.
        let listeners = (inbound, outbound);
        let (proxies, listener_stats) =
            start::serve_proxies(&options, shared, &stop, &drain_deadline, listeners);
        if let Some(listener) = admin {
            let admin = Arc::new(admin::Admin {
                health: health.clone(),
                stop: stop.clone(),
                lifecycle: lifecycle.clone(),
                metrics: metrics::Source {
                    service: options.service.clone(),
                    config: config.clone(),
                    engine: engine.clone(),
                    lifecycle: lifecycle.subscribe(),
                    listeners: listener_stats,
                    directory: directory.clone(),
                    latches: latches.clone(),
                    control_plane: options.control_plane.is_some(),
                    decision_log,
                    mtls: options.mtls.clone(),
                },
            });
            tokio::spawn(start::serve_admin(listener, admin, admin_stop.clone()));
        }

        if let Some(store) = &latches {
            // Until the proxies have drained: a call finishing late may still trip a fuse.
            tokio::spawn(store.clone().run(admin_stop.clone()));
        }

        let done = start::supervise(stop.clone(), health.clone(), proxies, admin_stop);

        tokio::spawn(lifecycle.clone().run_warmup());

        // Tests and scripts read the bound ports from this line.
        tracing::info!(
            service = %options.service,
            inbound = %inbound_addr,
            outbound = %OrDash(outbound_addr),
            admin = %OrDash(admin_addr),
            upstream = %options.upstream,
            "gov-agent started"
        );
        Ok(Self {
            inbound: inbound_addr,
            outbound: outbound_addr,
            admin: admin_addr,
            stop,
            health,
            config,
            engine,
            latches,
            lifecycle,
            directory,
            mtls: options.mtls.clone(),
            control_plane: options.control_plane.clone(),
            done,
        })
    }

    /// Mutual TLS between agents uses the certificate in force in
    /// `credentials` from now on (`--identity`, `--tls-cert`).
    pub fn use_credentials(&self, credentials: crate::identity::Credentials) {
        self.mtls.use_credentials(credentials);
    }

    /// The inbound listener presents the certificate in force in
    /// `credentials` to clients that name a server (`--inbound-tls-cert`).
    pub fn use_ingress_credentials(&self, credentials: crate::identity::Credentials) {
        self.mtls.use_ingress_credentials(credentials);
    }

    /// The inbound listener's mutual TLS mode (told to govd in the hello).
    pub fn inbound_mtls(&self) -> InboundMtls {
        self.mtls.inbound()
    }

    /// The address of the inbound listener.
    pub fn inbound_addr(&self) -> SocketAddr {
        self.inbound
    }

    /// The address of the outbound listener, if there is one.
    pub fn outbound_addr(&self) -> Option<SocketAddr> {
        self.outbound
    }

    /// The address of the admin listener, if there is one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// Readiness as `/ready` reports it.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Where the agent's certificate events go (`/metrics`).
    pub fn on_certificate(&self) -> crate::identity::OnCertificate {
        let health = self.health.clone();
        Arc::new(move |event| health.on_certificate(event))
    }

    /// The endpoints of the services the local service calls, which the outbound
    /// listener balances over: [`Directory::replace`] swaps a service's set (from
    /// `Endpoints` pushed by the control plane) while requests keep flowing.
    pub fn directory(&self) -> &Arc<Directory> {
        &self.directory
    }

    /// The enforcement engine (stats, events, release commands).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The latches kept in the state directory (`None` without one).
    pub fn latch_store(&self) -> Option<&Arc<crate::latches::LatchStore>> {
        self.latches.as_ref()
    }

    /// The config in force.
    pub fn config_status(&self) -> &ConfigStatus {
        &self.config
    }

    /// What the control-plane client calls after the engine took a config (from its
    /// state dir or pushed): records the version for `/metrics` and marks the agent
    /// ready. (Added for `crate::control`.)
    pub fn on_config_applied(&self) -> crate::control::OnApplied {
        let applied = start::Applied {
            config: self.config.clone(),
            lifecycle: self.lifecycle.clone(),
            health: self.health.clone(),
        };
        let directory = self.directory.clone();
        let source = format!(
            "control-plane {}",
            self.control_plane.as_deref().unwrap_or_default()
        );
        Arc::new(move |target: &gov_proto::v1::TargetConfig| {
            // `control::check` refused a config whose policies are invalid.
            match crate::sidecar::Outliers::from_target(target) {
                Ok(outliers) => directory.set_outliers(outliers),
                Err(error) => tracing::error!(%error, "outlier policies not applied"),
            }
            applied.record(target, &target.version, source.clone());
        })
    }

    /// What the control-plane client calls after each pushed config: whether it
    /// was saved in the state directory, for `/metrics`.
    pub fn on_config_saved(&self) -> crate::control::OnSaved {
        let config = self.config.clone();
        Arc::new(move |unsaved: Option<&str>| config.set_unsaved(unsaved.is_some()))
    }

    /// What the control-plane client calls when its stream to the control plane
    /// opens (`true`) and ends (`false`), for `/metrics`.
    pub fn on_control_plane_connection(&self) -> crate::control::OnConnection {
        let config = self.config.clone();
        Arc::new(move |connected| config.set_control_plane_connected(connected))
    }

    /// What the control-plane client calls when govd refuses this agent's
    /// credentials (and with `None` once accepted): `/ready` says why, and
    /// `/metrics` counts it. (Added for `crate::control`.)
    pub fn on_control_plane_refused(&self) -> crate::control::OnRefused {
        let health = self.health.clone();
        Arc::new(move |reason: Option<&str>| health.set_control_plane_refused(reason))
    }

    /// The lifecycle (warmup, phase and weight, ordered shutdown).
    pub fn lifecycle(&self) -> &Arc<crate::lifecycle::Lifecycle> {
        &self.lifecycle
    }

    /// Begins the ordered shutdown of the config's `shutdown` steps, or the plain
    /// graceful stop when it has none (idempotent). [`Self::stopped`] waits for it.
    pub fn terminate(&self) {
        self.lifecycle.begin_shutdown();
    }

    /// Begins a graceful stop (idempotent): not ready, no new connections, drain.
    pub fn shutdown(&self) {
        self.stop.cancel();
    }

    /// A token that is cancelled when the sidecar begins to stop (by [`Self::shutdown`]
    /// or `POST /shutdown`).
    pub fn stopping(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Waits until the sidecar has stopped: every proxy listener closed and drained
    /// (or the drain deadline passed).
    pub async fn stopped(self) {
        if let Err(error) = self.done.await {
            tracing::error!(%error, "the sidecar's supervisor task failed");
        }
        self.lifecycle.finished().await;
    }
}

/// Displays an optional address, `-` when absent.
struct OrDash(Option<SocketAddr>);

impl std::fmt::Display for OrDash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(addr) => addr.fmt(f),
            None => f.write_str("-"),
        }
    }
}
