//! The steps of [`Sidecar::start`](super::Sidecar::start): the config in
//! force at start, and the accept loops of the proxy and admin listeners.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gov_engine::Engine;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::options::{DEFAULT_HEADER_READ_TIMEOUT, Options};
use super::reload::{ConfigError, ConfigStatus, read_config};
use super::upstream::{Directory, Outliers, UpstreamProtocol};
use super::{admin, h1, listener, mtls, proxy, serve};

/// Most open connections of the admin listener (scrapes and probes).
const MAX_ADMIN_CONNECTIONS: usize = 64;
use crate::health::Health;
use crate::lifecycle::{DrainDeadline, Lifecycle};

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

/// What a config that comes into force changes besides the engine: the
/// status `GET /config` shows, the lifecycle's plan, readiness. Every
/// source of a config (the file at start and on change, the state
/// directory's last good one, the control plane) records it here.
#[derive(Clone)]
pub(crate) struct Applied {
    pub config: Arc<ConfigStatus>,
    pub lifecycle: Arc<Lifecycle>,
    pub health: Arc<Health>,
}

impl Applied {
    /// `target`, with `version`, is in force, from `source`.
    pub(crate) fn record(
        &self,
        target: &gov_proto::v1::TargetConfig,
        version: &str,
        source: String,
    ) {
        self.config.record_applied(target, version, source);
        self.lifecycle.set_plan(target);
        self.health.set_config_loaded();
    }
}

/// The config in force before the first connection: the `--config` file
/// (a bad file is an error, not a silent empty policy), else the last good
/// config the control plane sent, from the state directory, else none;
/// without a file or a control plane, an empty one. Returns the file's
/// bytes, for its watch.
pub(super) async fn load_config(
    options: &Options,
    engine: &Engine,
    directory: &Directory,
    applied: &Applied,
) -> Result<Option<Vec<u8>>, StartError> {
    let initial = match &options.config {
        Some(path) => {
            let (bytes, target) = read_config(path).await?;
            let version = apply(engine, directory, &options.service, path, &target)?;
            applied.record(&target, &version, format!("file {}", path.display()));
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
            Ok(Some(target)) => match apply(engine, directory, &options.service, &path, &target) {
                Ok(version) => {
                    applied.record(&target, &version, format!("state-dir {}", path.display()));
                    tracing::info!(%version, "enforcing the last good config from disk");
                }
                Err(error) => {
                    tracing::warn!(%error, "the last good config on disk is refused; starting without it")
                }
            },
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "cannot load the last good config"),
        }
    }
    // Standalone without a file: nothing will ever bring a config, so run with no
    // rules rather than never becoming ready. With a control plane the agent is not
    // ready until it sends a config.
    if initial.is_none() && options.control_plane.is_none() {
        tracing::warn!("no --config and no --control-plane: proxying with no rules");
        applied
            .lifecycle
            .set_plan(&gov_proto::v1::TargetConfig::default());
        applied.health.set_config_loaded();
    }
    Ok(initial)
}

/// Accepts on a proxy listener until `cx`'s stop, each connection served
/// by the HTTP/1 path or hyper.
pub(super) async fn serve_proxy(
    name: &'static str,
    listener: TcpListener,
    side: listener::Side,
    conns: Arc<serve::Connections>,
    cx: h1::Listener,
    drain_deadline: DrainDeadline,
    fast: bool,
) {
    serve::accept_loop(
        name,
        listener,
        cx.stop.clone(),
        drain_deadline,
        conns,
        serve::Placement::Workers,
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
    )
    .await;
}

/// Accepts on the admin listener until `admin_stop`.
pub(super) async fn serve_admin(
    listener: TcpListener,
    admin: Arc<admin::Admin>,
    admin_stop: tokio_util::sync::CancellationToken,
) {
    serve::accept_loop(
        "admin",
        listener,
        admin_stop.clone(),
        crate::lifecycle::DrainDeadline::new(Duration::from_secs(1)),
        Arc::new(serve::Connections::new(MAX_ADMIN_CONNECTIONS, usize::MAX)),
        serve::Placement::Here,
        move |stream, peer| {
            let admin = admin.clone();
            serve::serve_hyper(
                "admin",
                TokioIo::new(stream),
                peer,
                admin_stop.clone(),
                Some(DEFAULT_HEADER_READ_TIMEOUT),
                move |req| {
                    let admin = admin.clone();
                    async move { admin.handle(req).await }
                },
            )
        },
    )
    .await;
}

/// Checks that `target` is for this agent's service and swaps it into the engine
/// and its outlier policies into the balancer; returns its version.
pub(super) fn apply(
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

/// The latches kept across a restart (`--state-dir`), opened before any
/// call is admitted: a fuse tripped before the restart refuses the first
/// call after it.
pub(super) fn open_latches(
    options: &Options,
    engine: &Engine,
) -> Option<Arc<crate::latches::LatchStore>> {
    match &options.state_dir {
        Some(dir) => Some(crate::latches::LatchStore::open(
            engine,
            dir,
            &options.service,
        )),
        None => {
            tracing::info!(
                "no --state-dir: tripped fuses and engaged limits do not survive a restart"
            );
            None
        }
    }
}

/// Watches the `--config` file (`bytes` as read at start) and applies
/// each change that is valid, until `stop`.
pub(super) fn watch_file(
    options: &Options,
    path: &std::path::Path,
    bytes: Vec<u8>,
    stop: tokio_util::sync::CancellationToken,
    (engine, directory, applied): (Engine, Arc<Directory>, Applied),
) -> Result<(), StartError> {
    let service = options.service.clone();
    let file = path.to_owned();
    let status = applied.config.clone();
    super::reload::spawn_watch(path.to_owned(), bytes, stop, status, move |target| {
        let version =
            apply(&engine, &directory, &service, &file, &target).map_err(|e| e.to_string())?;
        applied.record(&target, &version, format!("file {}", file.display()));
        Ok(version)
    })?;
    Ok(())
}

/// What both proxy listeners share: the engine, the upstream clients, the
/// decision log.
pub(super) fn shared(
    options: &Options,
    engine: &Engine,
    directory: &Arc<Directory>,
    log: Option<crate::decision_log::DecisionLog>,
) -> Arc<listener::Shared> {
    Arc::new(listener::Shared {
        engine: engine.clone(),
        clients: super::upstream::Clients::new(
            options.upstream_protocol,
            options.mtls.clone(),
            directory.clone(),
        ),
        mtls: options.mtls.clone(),
        local: options.upstream.clone(),
        directory: directory.clone(),
        log,
        client_gone_hold: options.client_gone_hold,
        verifier: super::consumer::Verifier::default(),
    })
}

/// Once `stop` is cancelled: not ready, the proxy listeners drain, then the
/// admin listener stops.
pub(super) fn supervise(
    stop: tokio_util::sync::CancellationToken,
    health: Arc<Health>,
    mut proxies: tokio::task::JoinSet<()>,
    admin_stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        stop.cancelled().await;
        health.set_draining();
        tracing::info!("stopping: no new connections, draining in-flight requests");
        while proxies.join_next().await.is_some() {}
        admin_stop.cancel();
        tracing::info!("stopped");
    })
}

/// The listeners, bound, and their addresses (inbound, outbound, admin).
pub(super) struct Bound {
    pub inbound: TcpListener,
    pub outbound: Option<TcpListener>,
    pub admin: Option<TcpListener>,
    pub addrs: (SocketAddr, Option<SocketAddr>, Option<SocketAddr>),
}

/// Binds every listener the options ask for.
pub(super) async fn bind_all(options: &Options) -> Result<Bound, StartError> {
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
    Ok(Bound {
        inbound,
        outbound,
        admin,
        addrs: (inbound_addr, outbound_addr, admin_addr),
    })
}

/// The connections of one listener, for `/metrics`.
pub(super) type ListenerStats = Vec<(&'static str, Arc<serve::Connections>)>;

/// Serves the inbound listener and, if bound, the outbound one, until
/// `stop`; returns their tasks and their connection counts.
pub(super) fn serve_proxies(
    options: &Options,
    shared: Arc<listener::Shared>,
    stop: &tokio_util::sync::CancellationToken,
    drain_deadline: &DrainDeadline,
    (inbound, outbound): (TcpListener, Option<TcpListener>),
) -> (tokio::task::JoinSet<()>, ListenerStats) {
    let inbound_conns = Arc::new(serve::Connections::new(
        options.max_connections,
        options.max_connections_per_client,
    ));
    let outbound_conns = Arc::new(serve::Connections::new(options.max_connections, usize::MAX));
    // Idle upstream connections of the HTTP/1 path, shared by both listeners.
    let idle = Arc::new(h1::IdlePool::default());

    let mut proxies = tokio::task::JoinSet::new();
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
        let deadline = drain_deadline.clone();
        proxies.spawn(serve_proxy(name, listener, side, conns, cx, deadline, fast));
    }
    (proxies, listener_stats)
}
