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
mod h1;
mod headers;
mod listener;
mod metrics;
mod mtls;
mod options;
mod proxy;
mod reload;
mod serve;
mod upgrade;
mod upstream;

pub use mtls::{Caller, InboundMtls, MtlsError, OutboundMtls, PeerTls};
pub use options::*;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;

use gov_engine::Engine;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use crate::health::Health;
pub use abandoned::DEFAULT_CLIENT_GONE_HOLD;
pub use consumer::{Invalid, Verifier};
pub use endpoints::{endpoints_to, restore_endpoints};
pub use listener::GOV_SERVICE;
pub use reload::{ConfigError, ConfigStatus, parse_config, read_config};
pub use upstream::{Balance, Directory, EndpointSpec, InvalidOutlier, Outliers, UpstreamProtocol};

/// Most open connections of the admin listener (scrapes and probes).
const MAX_ADMIN_CONNECTIONS: usize = 64;

/// A sidecar that could not start.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum StartError {
    /// A listener could not bind.
    #[error("cannot listen on `{addr}` for the {listener} listener")]
    #[diagnostic(
        code(gov::agent::bind),
        help("is another process using the port? pick another with the matching --*listen flag")
    )]
    Bind {
        /// Which listener.
        listener: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The decision log cannot start.
    #[error(transparent)]
    #[diagnostic(transparent)]
    DecisionLog(#[from] crate::decision_log::LogError),
    /// The config file at start is unusable.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Config(#[from] ConfigError),
}

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
        let initial = match &options.config {
            Some(path) => {
                let (bytes, target) = read_config(path).await?;
                let version = apply(&engine, &directory, &options.service, path, &target)?;
                config.record_applied(&target, &version, format!("file {}", path.display()));
                lifecycle.set_plan(&target);
                health.set_config_loaded();
                tracing::info!(%version, path = %path.display(), "config loaded");
                Some(bytes)
            }
            None => None,
        };
        // With a control plane, the last good config it sent, from the state directory:
        // in force before the first connection is accepted, whether govd is up or not.
        if initial.is_none()
            && options.control_plane.is_some()
            && let Some(dir) = &options.state_dir
        {
            let path = dir.join(crate::control::LAST_GOOD_FILE);
            match crate::control::read_last_good(dir, &options.service) {
                Ok(Some(target)) => {
                    match apply(&engine, &directory, &options.service, &path, &target) {
                        Ok(version) => {
                            config.record_applied(
                                &target,
                                &version,
                                format!("state-dir {}", path.display()),
                            );
                            lifecycle.set_plan(&target);
                            health.set_config_loaded();
                            tracing::info!(%version, "enforcing the last good config from disk");
                        }
                        Err(error) => {
                            tracing::warn!(%error, "the last good config on disk is refused; starting without it")
                        }
                    }
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "cannot load the last good config"),
            }
        }
        // Then the latches kept across the restart, before any call is admitted: a fuse
        // tripped before the restart refuses the first call after it.
        let latches = match &options.state_dir {
            Some(dir) => Some(crate::latches::LatchStore::open(
                &engine,
                dir,
                &options.service,
            )),
            None => {
                tracing::info!(
                    "no --state-dir: tripped fuses and engaged limits do not survive a restart"
                );
                None
            }
        };

        // Standalone without a file: nothing will ever bring a config, so run with no
        // rules rather than never becoming ready. With a control plane the agent is not
        // ready until it sends a config.
        if initial.is_none() && options.control_plane.is_none() {
            tracing::warn!("no --config and no --control-plane: proxying with no rules");
            lifecycle.set_plan(&gov_proto::v1::TargetConfig::default());
            health.set_config_loaded();
        }

        let inbound = bind("inbound", options.listen).await?;
        let outbound = match options.outbound_listen {
            Some(addr) => Some(bind("outbound", addr).await?),
            None => None,
        };
        let admin = match options.admin_listen {
            Some(addr) => Some(bind("admin", addr).await?),
            None => None,
        };
        let inbound_addr = local_addr("inbound", &inbound)?;
        let outbound_addr = outbound
            .as_ref()
            .map(|l| local_addr("outbound", l))
            .transpose()?;
        let admin_addr = admin.as_ref().map(|l| local_addr("admin", l)).transpose()?;

        if let (Some(path), Some(bytes)) = (&options.config, initial) {
            let status = config.clone();
            let health = health.clone();
            let engine = engine.clone();
            let directory = directory.clone();
            let service = options.service.clone();
            let file = path.clone();
            let lifecycle = lifecycle.clone();
            reload::spawn_watch(
                path.clone(),
                bytes,
                stop.clone(),
                config.clone(),
                move |target| {
                    let version = apply(&engine, &directory, &service, &file, &target)
                        .map_err(|e| e.to_string())?;
                    status.record_applied(&target, &version, format!("file {}", file.display()));
                    lifecycle.set_plan(&target);
                    health.set_config_loaded();
                    Ok(version)
                },
            )?;
        }

        let decision_log = options
            .decision_log
            .as_ref()
            .map(|o| crate::decision_log::DecisionLog::start(o, &options.service, engine.clone()))
            .transpose()?;
        let inbound_conns = Arc::new(serve::Connections::new(
            options.max_connections,
            options.max_connections_per_client,
        ));
        let outbound_conns = Arc::new(serve::Connections::new(options.max_connections, usize::MAX));
        let shared = Arc::new(listener::Shared {
            engine: engine.clone(),
            clients: upstream::Clients::new(
                options.upstream_protocol,
                options.mtls.clone(),
                directory.clone(),
            ),
            mtls: options.mtls.clone(),
            local: options.upstream.clone(),
            directory: directory.clone(),
            log: decision_log.clone(),
            client_gone_hold: options.client_gone_hold,
            verifier: consumer::Verifier::default(),
        });
        // Idle upstream connections of the HTTP/1 path, shared by both listeners.
        let idle = Arc::new(h1::IdlePool::default());

        // The proxy listeners drain on `stop`; the admin listener keeps answering
        // (`/ready` says 503) until they are done, then stops on `admin_stop`.
        let mut proxies = JoinSet::new();
        // HTTP/1 clients take the HTTP/1 path unless every upstream call must be HTTP/2.
        let fast = options.upstream_protocol != UpstreamProtocol::Http2;
        let mut listener_stats = vec![("inbound", inbound_conns.clone())];
        if outbound.is_some() {
            listener_stats.push(("outbound", outbound_conns.clone()));
        }
        let listeners = [
            Some(("inbound", inbound, listener::Side::Inbound, inbound_conns)),
            outbound.map(|l| ("outbound", l, listener::Side::Outbound, outbound_conns)),
        ];
        for (name, listener, side, conns) in listeners.into_iter().flatten() {
            let cx = h1::Listener::new(
                shared.clone(),
                side,
                stop.clone(),
                options.header_read_timeout,
                options.client_timeout,
                conns.clone(),
                idle.clone(),
            );
            proxies.spawn(serve::accept_loop(
                name,
                listener,
                stop.clone(),
                drain_deadline.clone(),
                conns,
                move |stream, peer| {
                    let cx = cx.clone();
                    async move {
                        // The inbound listener's mutual TLS: the calling agent.
                        let (stream, caller) = match side {
                            listener::Side::Inbound => match cx.shared.mtls.accept(stream).await {
                                Ok(accepted) => accepted,
                                Err(why) => {
                                    tracing::debug!(listener = name, %peer, why, "refused a connection");
                                    return;
                                }
                            },
                            listener::Side::Outbound => (mtls::Stream::Plain(stream), None),
                        };
                        let hyper = |io| {
                            // Stops this connection: the listener's stop, or
                            // its own (a client over its budget of abandoned calls).
                            let close = cx.stop.child_token();
                            let handler = proxy::Handler::new(
                                cx.shared.clone(),
                                side,
                                peer,
                                cx.conns.clone(),
                                fast,
                                close.clone(),
                                caller.clone(),
                            );
                            serve::serve_hyper(
                                name,
                                TokioIo::new(io),
                                peer,
                                close,
                                cx.header_read_timeout,
                                move |req| {
                                    let handler = handler.clone();
                                    async move { handler.handle(req).await }
                                },
                            )
                        };
                        // ALPN h2 goes to hyper without the HTTP/1 path's look.
                        if fast && stream.alpn() != Some(b"h2") {
                            h1::serve(stream, peer, caller.clone(), cx.clone(), hyper).await;
                        } else {
                            hyper(h1::Prefixed::new(bytes::BytesMut::new(), stream)).await;
                        }
                    }
                },
            ));
        }
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
            let admin_stop_conns = admin_stop.clone();
            tokio::spawn(serve::accept_loop(
                "admin",
                listener,
                admin_stop.clone(),
                crate::lifecycle::DrainDeadline::new(Duration::from_secs(1)),
                Arc::new(serve::Connections::new(MAX_ADMIN_CONNECTIONS, usize::MAX)),
                move |stream, peer| {
                    let admin = admin.clone();
                    serve::serve_hyper(
                        "admin",
                        TokioIo::new(stream),
                        peer,
                        admin_stop_conns.clone(),
                        Some(DEFAULT_HEADER_READ_TIMEOUT),
                        move |req| {
                            let admin = admin.clone();
                            async move { admin.handle(req).await }
                        },
                    )
                },
            ));
        }

        if let Some(store) = &latches {
            // Until the proxies have drained: a call finishing late may still trip a fuse.
            tokio::spawn(store.clone().run(admin_stop.clone()));
        }

        let done = {
            let stop = stop.clone();
            let health = health.clone();
            tokio::spawn(async move {
                stop.cancelled().await;
                health.set_draining();
                tracing::info!("stopping: no new connections, draining in-flight requests");
                while proxies.join_next().await.is_some() {}
                admin_stop.cancel();
                tracing::info!("stopped");
            })
        };

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
        let (config, health) = (self.config.clone(), self.health.clone());
        let lifecycle = self.lifecycle.clone();
        let directory = self.directory.clone();
        let source = format!(
            "control-plane {}",
            self.control_plane.as_deref().unwrap_or_default()
        );
        Arc::new(move |target: &gov_proto::v1::TargetConfig| {
            config.record_applied(target, &target.version, source.clone());
            lifecycle.set_plan(target);
            // `control::check` refused a config whose policies are invalid.
            match crate::sidecar::Outliers::from_target(target) {
                Ok(outliers) => directory.set_outliers(outliers),
                Err(error) => tracing::error!(%error, "outlier policies not applied"),
            }
            health.set_config_loaded();
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

/// Checks that `target` is for this agent's service and swaps it into the engine
/// and its outlier policies into the balancer; returns its version.
fn apply(
    engine: &Engine,
    directory: &Directory,
    service: &str,
    path: &std::path::Path,
    target: &gov_proto::v1::TargetConfig,
) -> Result<String, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        path: path.to_owned(),
        message,
    };
    if target.service != service {
        return Err(invalid(format!(
            "it is the config of service `{}`, and this agent runs beside `{service}`",
            target.service
        )));
    }
    crate::lifecycle::check_steps(target).map_err(|e| invalid(e.to_string()))?;
    let outliers = Outliers::from_target(target).map_err(|e| invalid(e.to_string()))?;
    let applied = engine
        .apply_target(target)
        .map_err(|e| invalid(e.to_string()))?;
    directory.set_outliers(outliers);
    Ok(applied.version.to_string())
}

async fn bind(listener: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind {
            listener,
            addr,
            source,
        })
}

fn local_addr(listener: &'static str, l: &TcpListener) -> Result<SocketAddr, StartError> {
    l.local_addr().map_err(|source| StartError::Bind {
        listener,
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })
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
