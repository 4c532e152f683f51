//! The agent's control-plane client: one `Connect` stream to `govd`.
//!
//! ```text
//!  agent                                   govd
//!   │ Hello{service, instance, last_version} ─▶
//!   │ ◀─ Config{target, nonce}                 (when last_version differs)
//!   │ Ack{version, nonce} | Nack{error, rule} ─▶
//!   │ Stats (every second), Event (as they happen) ─▶
//!   │ ◀─ Command{Release | Drain | Arm}
//!   │ ◀─ Endpoints{set, version} | EndpointsDelta{base, changes, version}
//!   │ EndpointsAck{version} | EndpointsAck{held, want_full} ─▶
//! ```
//!
//! A pushed config is checked and applied through [`Engine::apply_target`]
//! (an atomic swap); only then is it written to `--state-dir` (atomically)
//! and ACKed. A config the agent enforces but cannot write (a full or
//! read-only disk) is ACKed with `unsaved` and the reason: govd shows the
//! agent UNSAVED, its last good still the saved version, and the hello names
//! the saved version so that the next stream brings the config again and
//! retries the write. A config the agent cannot enforce is NACKed with the reason
//! and the rule at fault, and the previous config stays in force. On start
//! the last good config is loaded from disk before connecting, so an agent
//! restarted while the control plane is down enforces what it had. When the
//! control plane goes away the agent keeps enforcing and reconnects with
//! exponential backoff and jitter; HTTP/2 keepalive notices a dead peer.
//!
//! The hello lists the latches the agent enforces (restored from its state
//! directory by [`crate::latches`]); the control plane answers with an `Arm`
//! command for each latch it holds for this instance that the list lacks (an
//! agent restarted without its state), and the agent re-arms it and sends its
//! stats at once.
//!
//! Endpoint sets come whole, or as a delta onto the version this stream
//! holds (the hello says the agent applies them; `control/endpoints.rs`):
//! a delta onto any other version is answered `want_full`, and govd sends
//! the whole set.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gov_proto::v1 as proto;
use gov_proto::v1::control_plane_client::ControlPlaneClient;
use proto::control_message::Msg as ControlMsg;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use gov_engine::{Engine, Latch};

use crate::state_dir::write_atomically;
pub use backoff::Backoff;
pub use reach::urls;
pub(crate) use reach::{chain, now_unix_ms};

pub(crate) mod backoff;
pub(crate) mod commands;
pub(crate) mod endpoints;
pub(crate) mod reach;

/// File name of the last good config in the state directory.
pub const LAST_GOOD_FILE: &str = "last-good-config.json";

/// Called with every config the agent starts enforcing (from disk or pushed).
pub type OnApplied = Arc<dyn Fn(&proto::TargetConfig) + Send + Sync>;
/// Called with `true` when a stream to the control plane opens, `false` when it ends.
pub type OnConnection = Arc<dyn Fn(bool) + Send + Sync>;
/// Called when the control plane commands a drain (deadline, 0 = default).
pub type OnDrain = Arc<dyn Fn(Duration) + Send + Sync>;
/// Called with a service's registered instances each time govd pushes them.
pub type OnEndpoints = Arc<dyn Fn(&proto::Endpoints) + Send + Sync>;
/// Called with the reason when govd refuses this agent's credentials (token
/// or certificate), and with `None` once a stream is accepted.
pub type OnRefused = Arc<dyn Fn(Option<&str>) + Send + Sync>;
/// Called when govd says every agent dropped this instance.
pub type OnDeregistered = Arc<dyn Fn() + Send + Sync>;
/// Called after each pushed config the agent enforces: `None` when it is
/// saved in `--state-dir` (or there is none), the reason when it is not.
pub type OnSaved = Arc<dyn Fn(Option<&str>) + Send + Sync>;

/// How to reach and talk to the control plane.
#[derive(Clone)]
pub struct ControlOptions {
    /// `http://host:port`, or several comma-separated (govd replicas):
    /// each reconnect tries the next.
    pub url: String,
    pub service: String,
    /// Unique per agent.
    pub instance: String,
    /// Where other agents reach this instance's inbound listener.
    pub address: String,
    /// That listener takes mutual TLS from other agents (`--inbound-mtls`).
    pub inbound_mtls: bool,
    pub labels: BTreeMap<String, String>,
    /// Where the last good config is kept. `None`: nothing persisted.
    pub state_dir: Option<PathBuf>,
    /// The agent token, sent as `authorization: Bearer ...`.
    pub token: Option<String>,
    /// TLS to govd (`https://` URLs): the CA, and this agent's certificate
    /// for mutual TLS.
    pub tls: gov_common::tls::ClientTls,
    /// This agent's certificate as it changes (issued by govd, or reloaded
    /// files): each new connection takes the one in force, over `tls`'s.
    pub credentials: Option<crate::identity::Credentials>,
    /// How often stats are sent.
    pub stats_interval: Duration,
    /// Reconnect delays.
    pub backoff: Backoff,
    pub on_applied: Option<OnApplied>,
    /// Told whether each pushed config was saved (`/metrics`).
    pub on_saved: Option<OnSaved>,
    /// Told when the stream to the control plane opens (`true`) and ends (`false`).
    pub on_connection: Option<OnConnection>,
    /// Where refusals of this agent's credentials are reported (`/ready`,
    /// `/metrics`).
    pub on_refused: Option<OnRefused>,
    pub on_drain: Option<OnDrain>,
    /// Where govd's `Endpoints` go (the outbound listener's directory).
    pub on_endpoints: Option<OnEndpoints>,
    /// What govd's `Deregistered` ends (a `wait for gov` step).
    pub on_deregistered: Option<OnDeregistered>,
    /// The instance's lifecycle (phase and weight), sent on connect and on change.
    /// `None`: no `Lifecycle` message is sent.
    pub lifecycle: Option<tokio::sync::watch::Receiver<crate::lifecycle::State>>,
}

impl std::fmt::Debug for ControlOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlOptions")
            .field("url", &self.url)
            .field("service", &self.service)
            .field("instance", &self.instance)
            .field("address", &self.address)
            .field("state_dir", &self.state_dir)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

impl ControlOptions {
    /// Options with defaults: stats every second, backoff 100ms..30s, no
    /// state directory, no token.
    pub fn new(
        url: impl Into<String>,
        service: impl Into<String>,
        instance: impl Into<String>,
    ) -> Self {
        Self {
            url: url.into(),
            service: service.into(),
            instance: instance.into(),
            address: String::new(),
            inbound_mtls: false,
            labels: BTreeMap::new(),
            state_dir: None,
            token: None,
            tls: gov_common::tls::ClientTls::default(),
            credentials: None,
            stats_interval: Duration::from_secs(1),
            backoff: Backoff::default(),
            on_applied: None,
            on_saved: None,
            on_connection: None,
            on_refused: None,
            on_drain: None,
            on_endpoints: None,
            on_deregistered: None,
            lifecycle: None,
        }
    }
}

/// Why a session with the control plane ended.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ControlError {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Url(#[from] gov_common::tls::TlsError),
    #[error("cannot connect to the control plane at `{url}`: {reason}")]
    #[diagnostic(
        code(gov::agent::control_connect),
        help("the agent keeps enforcing its last good config and retries")
    )]
    Connect { url: String, reason: String },
    #[error("the control plane refused the stream: {0}")]
    #[diagnostic(code(gov::agent::control_refused))]
    Refused(tonic::Status),
    #[error("the stream to the control plane broke: {0}")]
    #[diagnostic(code(gov::agent::control_stream))]
    Stream(tonic::Status),
    #[error("cannot {op} the last good config `{path}`")]
    #[diagnostic(code(gov::agent::state_io), help("check that --state-dir is writable"))]
    State {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the last good config `{path}` is unusable: {reason}")]
    #[diagnostic(
        code(gov::agent::state_corrupt),
        help("delete it; the control plane will send the config again")
    )]
    Corrupt { path: PathBuf, reason: String },
}

// === the last good config on disk ===

/// Reads the last good config of `service` from `dir` (`None`: there is
/// none, or it belongs to another service).
pub fn read_last_good(
    dir: &Path,
    service: &str,
) -> Result<Option<proto::TargetConfig>, ControlError> {
    let path = dir.join(LAST_GOOD_FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ControlError::State {
                op: "read",
                path,
                source,
            });
        }
    };
    let target: proto::TargetConfig =
        serde_json::from_slice(&bytes).map_err(|e| ControlError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    if target.service != service {
        tracing::warn!(path = %path.display(), found = %target.service, service, "the last good config is for another service; ignoring it");
        return Ok(None);
    }
    Ok(Some(target))
}

/// Writes the config atomically (temp file, fsync, rename, fsync dir).
pub fn write_last_good(dir: &Path, target: &proto::TargetConfig) -> Result<(), ControlError> {
    let bytes = serde_json::to_vec_pretty(target).map_err(|e| ControlError::Corrupt {
        path: dir.join(LAST_GOOD_FILE),
        reason: e.to_string(),
    })?;
    write_atomically(dir, LAST_GOOD_FILE, &bytes).map_err(|e| ControlError::State {
        op: e.op,
        path: e.path,
        source: e.source,
    })
}

// === the client ===

/// Loads the last good config (if any) into `engine`, then keeps a stream
/// to the control plane open until `shutdown`, reconnecting with backoff.
/// Never returns an error: the agent keeps enforcing whatever it has.
pub async fn run(engine: Engine, options: ControlOptions, shutdown: CancellationToken) {
    // The version the hello names: the one saved in the state directory (the
    // one in force without a state directory).
    let mut current = String::new();
    if let Some(dir) = &options.state_dir {
        match read_last_good(dir, &options.service) {
            // The sidecar loaded it before it began to serve.
            Ok(Some(target))
                if !target.version.is_empty() && *engine.config().version == *target.version =>
            {
                current.clone_from(&target.version);
            }
            Ok(Some(target)) => match check(&options, &target).and_then(|()| {
                engine
                    .apply_target(&target)
                    .map(|_| ())
                    .map_err(|e| (e.to_string(), e.rule().map(str::to_owned)))
            }) {
                Ok(()) => {
                    tracing::info!(version = %target.version, "enforcing the last good config from disk");
                    current.clone_from(&target.version);
                    if let Some(f) = &options.on_applied {
                        f(&target);
                    }
                }
                Err((error, _)) => {
                    tracing::warn!(%error, "the last good config on disk is refused; starting without it")
                }
            },
            Ok(None) => {}
            Err(error) => tracing::warn!(error = %error, "cannot load the last good config"),
        }
    }
    let mut backoff = options.backoff.clone();
    let urls = urls(&options.url);
    for attempt in 0.. {
        let url = urls[attempt % urls.len()];
        let ended = session(
            &engine,
            &options,
            url,
            &mut current,
            &shutdown,
            &mut backoff,
        )
        .await;
        if let Some(f) = &options.on_connection {
            f(false);
        }
        match ended {
            Ok(()) if shutdown.is_cancelled() => return,
            Ok(()) => tracing::info!("the control plane closed the stream; reconnecting"),
            // Refusals say what to fix: they do not heal by retrying.
            Err(ControlError::Refused(status))
                if matches!(
                    status.code(),
                    tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                ) =>
            {
                if let Some(f) = &options.on_refused {
                    f(Some(status.message()));
                }
                tracing::error!(
                    reason = %status.message(),
                    "the control plane refused this agent's credentials; enforcing the last good config until it is fixed (check --control-plane-token-file against govd's --token-file `agent` line for this --service, and the --tls-cert identity against --service)"
                )
            }
            Err(ControlError::Refused(status)) if status.code() == tonic::Code::AlreadyExists => {
                tracing::error!(
                    reason = %status.message(),
                    "the control plane refused this agent's name; enforcing the last good config (give each agent its own --instance)"
                )
            }
            Err(error) => {
                tracing::warn!(%error, "control plane unavailable; enforcing the last good config")
            }
        }
        let delay = backoff.next_delay();
        tracing::debug!(?delay, "reconnecting after");
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// How long the agent waits for govd to answer its `Connect` before it
/// tries the next URL.
const CONNECT_ANSWER: std::time::Duration = std::time::Duration::from_secs(5);
/// An open stream to a govd that sends nothing is pinged this often, and
/// left for the next URL when a ping is not answered within the timeout: a
/// replica that hangs (stopped, not dead) keeps its agents at most about 8 s
/// (was 15 s). At 10,000 agents that is 2,000 pings a second at govd, each
/// answered by HTTP/2 itself.
const STREAM_PING: std::time::Duration = std::time::Duration::from_secs(5);
const STREAM_PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Whether this agent can enforce `target`, beyond what the engine checks.
fn check(
    options: &ControlOptions,
    target: &proto::TargetConfig,
) -> Result<(), (String, Option<String>)> {
    if target.service != options.service {
        return Err((
            format!(
                "the config is for service `{}`, this agent runs beside `{}`",
                target.service, options.service
            ),
            None,
        ));
    }
    crate::lifecycle::check_steps(target).map_err(|e| (e.to_string(), None))?;
    crate::sidecar::Outliers::from_target(target)
        .map(|_| ())
        .map_err(|e| (e.to_string(), None))
}

/// One stream: hello, then configs and commands in, ACK/NACK, stats and
/// events out. `Ok(())` when the server or `shutdown` ended it.
async fn session(
    engine: &Engine,
    options: &ControlOptions,
    url: &str,
    current: &mut String,
    shutdown: &CancellationToken,
    backoff: &mut Backoff,
) -> Result<(), ControlError> {
    let Some(channel) = channel(options, url, shutdown).await? else {
        return Ok(());
    };
    let mut client = ControlPlaneClient::new(channel).max_decoding_message_size(64 << 20);

    let (tx, rx) = mpsc::channel::<proto::AgentMessage>(64);
    let send = |msg: proto::agent_message::Msg| proto::AgentMessage { msg: Some(msg) };
    let hello = hello(engine, options, current);
    // The queue is fresh: the hello always fits.
    let _ = tx.try_send(send(proto::agent_message::Msg::Hello(hello)));
    let mut lifecycle = options.lifecycle.clone();
    if let Some(state) = lifecycle.as_mut() {
        let now = *state.borrow_and_update();
        let _ = tx.try_send(send(proto::agent_message::Msg::Lifecycle(now.to_proto())));
    }
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(token) = &options.token {
        let value = format!("Bearer {}", token.trim()).parse().map_err(|_| {
            ControlError::Refused(tonic::Status::invalid_argument(
                "the agent token is not a valid header value",
            ))
        })?;
        request.metadata_mut().insert("authorization", value);
    }
    let mut events = engine.subscribe();
    // A govd that accepts the connection but does not answer (stopped,
    // hung) is left for the next URL after this bound, not after keepalive.
    let answered = tokio::time::timeout(CONNECT_ANSWER, client.connect(request))
        .await
        .map_err(|_| ControlError::Connect {
            url: url.to_owned(),
            reason: format!(
                "no answer to Connect within {CONNECT_ANSWER:?}: govd is stopped, hung or overloaded"
            ),
        })?;
    let mut inbound = answered.map_err(ControlError::Refused)?.into_inner();
    backoff.reset();
    if let Some(f) = &options.on_refused {
        f(None);
    }
    tracing::info!(%url, last_version = %current, "connected to the control plane");
    if let Some(f) = &options.on_connection {
        f(true);
    }

    // The endpoint set versions are this stream's: govd sends every set anew.
    let mut held = endpoints::Held::default();
    let mut stats = tokio::time::interval(options.stats_interval);
    stats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            msg = inbound.message() => {
                let msg = match msg {
                    Ok(Some(m)) => m,
                    Ok(None) => return Ok(()),
                    Err(status) => return Err(ControlError::Stream(status)),
                };
                if let Some(reply) = handle(engine, options, current, &mut held, msg).await
                    && tx.send(send(reply)).await.is_err()
                {
                    return Ok(());
                }
            }
            changed = lifecycle_changed(lifecycle.as_mut()) => {
                let Some(now) = changed else {
                    lifecycle = None;
                    continue;
                };
                if tx.send(send(proto::agent_message::Msg::Lifecycle(now.to_proto()))).await.is_err() {
                    return Ok(());
                }
            }
            _ = stats.tick() => {
                let s = engine.stats().to_proto(now_unix_ms());
                if tx.send(send(proto::agent_message::Msg::Stats(s))).await.is_err() {
                    return Ok(());
                }
            }
            event = events.recv() => match event {
                Ok(e) => {
                    if tx.send(send(proto::agent_message::Msg::Event(e.to_proto()))).await.is_err() {
                        return Ok(());
                    }
                }
                // Lost events are made good by the next stats (fuse state, limit engaged).
                Err(broadcast::error::RecvError::Lagged(n)) => tracing::warn!(n, "dropped events"),
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            },
        }
    }
}

/// A connection to govd at `url`, with the certificate in force now (a
/// stream already open keeps its own); `None` when `shutdown` came first.
async fn channel(
    options: &ControlOptions,
    url: &str,
    shutdown: &CancellationToken,
) -> Result<Option<tonic::transport::Channel>, ControlError> {
    let tls = match &options.credentials {
        None => options.tls.clone(),
        Some(credentials) => match credentials.wait(shutdown).await {
            Some(c) => options.tls.with_identity(&c.chain_pem, &c.key_pem),
            None => return Ok(None),
        },
    };
    let endpoint = tls
        .endpoint(url)?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(STREAM_PING)
        .keep_alive_timeout(STREAM_PING_TIMEOUT)
        .keep_alive_while_idle(true);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| ControlError::Connect {
            url: url.to_owned(),
            reason: chain(&e),
        })?;
    Ok(Some(channel))
}

/// The stream's first message: who this agent is, the version it saved
/// (`current`) and the latches it enforces.
fn hello(engine: &Engine, options: &ControlOptions, current: &str) -> proto::Hello {
    proto::Hello {
        service: options.service.clone(),
        instance: options.instance.clone(),
        address: options.address.clone(),
        labels: options.labels.clone().into_iter().collect(),
        last_version: current.to_owned(),
        latches: engine
            .latches(now_unix_ms())
            .iter()
            .map(Latch::to_proto)
            .collect(),
        inbound_mtls: options.inbound_mtls,
        endpoint_deltas: true,
    }
}

/// The next lifecycle state; `None` when its sender is gone; pending forever without
/// a lifecycle.
async fn lifecycle_changed(
    state: Option<&mut tokio::sync::watch::Receiver<crate::lifecycle::State>>,
) -> Option<crate::lifecycle::State> {
    let Some(state) = state else {
        return std::future::pending().await;
    };
    state.changed().await.ok()?;
    Some(*state.borrow_and_update())
}

/// Handles one control message; returns the reply to send, if any.
async fn handle(
    engine: &Engine,
    options: &ControlOptions,
    current: &mut String,
    held: &mut endpoints::Held,
    msg: proto::ControlMessage,
) -> Option<proto::agent_message::Msg> {
    match msg.msg? {
        ControlMsg::Config(config) => Some(apply_config(engine, options, current, config).await),
        ControlMsg::Command(proto::Command { kind }) => command(engine, options, kind?),
        ControlMsg::Endpoints(endpoints) => Some(proto::agent_message::Msg::EndpointsAck(
            held.on_full(endpoints, |e| apply_endpoints(options, e)),
        )),
        ControlMsg::EndpointsDelta(delta) => Some(proto::agent_message::Msg::EndpointsAck(
            held.on_delta(delta, |e| apply_endpoints(options, e)),
        )),
    }
}

/// Checks and applies a pushed config, then saves it: the ACK (`unsaved`
/// when the write failed), or the NACK with the reason and the rule at fault.
async fn apply_config(
    engine: &Engine,
    options: &ControlOptions,
    current: &mut String,
    proto::Config { target, nonce }: proto::Config,
) -> proto::agent_message::Msg {
    let Some(target) = target else {
        return nack(
            current,
            "",
            nonce,
            "the config message has no target".into(),
            None,
        );
    };
    let version = target.version.clone();
    let applied = check(options, &target).and_then(|()| {
        engine
            .apply_target(&target)
            .map_err(|e| (e.to_string(), e.rule().map(str::to_owned)))
    });
    match applied {
        Ok(applied) => {
            tracing::info!(version = %version, kept = applied.kept, fresh = applied.fresh, "config applied");
            let unsaved = save(options, &target).await;
            // INVARIANT: the hello names a version the agent would enforce
            // after a restart, so an unsaved config is sent again.
            if unsaved.is_none() {
                *current = version.clone();
            }
            if let Some(f) = &options.on_applied {
                f(&target);
            }
            if let Some(f) = &options.on_saved {
                f(unsaved.as_deref());
            }
            proto::agent_message::Msg::Ack(proto::Ack {
                version,
                nonce,
                unsaved: unsaved.unwrap_or_default(),
            })
        }
        Err((error, rule)) => {
            tracing::warn!(version = %version, %error, "config refused; keeping the previous one");
            nack(current, &version, nonce, error, rule)
        }
    }
}

/// Carries out a command; an `Arm` is answered with the stats at once, so
/// that the control plane sees the latch enforced again.
fn command(
    engine: &Engine,
    options: &ControlOptions,
    kind: proto::command::Kind,
) -> Option<proto::agent_message::Msg> {
    match kind {
        proto::command::Kind::Release(r) => commands::release(engine, &r),
        proto::command::Kind::Arm(latch) => {
            commands::arm(engine, &latch);
            return Some(proto::agent_message::Msg::Stats(
                engine.stats().to_proto(now_unix_ms()),
            ));
        }
        proto::command::Kind::Drain(d) => {
            tracing::info!(deadline_ms = d.deadline_ms, "drain command");
            if let Some(f) = &options.on_drain {
                f(Duration::from_millis(d.deadline_ms));
            }
        }
        proto::command::Kind::Deregistered(d) => {
            tracing::info!(version = d.version, "every agent dropped this instance");
            if let Some(f) = &options.on_deregistered {
                f();
            }
        }
    }
    None
}

/// A whole set (pushed or made by a delta) to the balancer.
fn apply_endpoints(options: &ControlOptions, endpoints: &proto::Endpoints) {
    if let Some(f) = &options.on_endpoints {
        f(endpoints);
    }
}

/// Writes `target` to the state directory: `None` when it is saved (or there
/// is no state directory), the reason when it is not (it stays enforced, in
/// memory only).
async fn save(options: &ControlOptions, target: &proto::TargetConfig) -> Option<String> {
    let dir = options.state_dir.clone()?;
    let t = target.clone();
    let reason = match tokio::task::spawn_blocking(move || write_last_good(&dir, &t)).await {
        Ok(Ok(())) => return None,
        Ok(Err(error)) => chain(&error),
        Err(error) => format!("the write of the last good config did not finish: {error}"),
    };
    tracing::error!(version = %target.version, %reason, "cannot save the config; it is enforced but a restart without the control plane goes back to the last saved one (govd shows this agent UNSAVED)");
    Some(reason)
}

fn nack(
    _current: &str,
    version: &str,
    nonce: String,
    error: String,
    rule: Option<String>,
) -> proto::agent_message::Msg {
    proto::agent_message::Msg::Nack(proto::Nack {
        version: version.to_owned(),
        nonce,
        error,
        rule: rule.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng as _;

    #[test]
    fn a_list_of_control_planes_is_tried_in_turn() {
        assert_eq!(urls("http://a:1"), ["http://a:1"]);
        assert_eq!(
            urls("http://a:1, http://b:2,,http://c:3"),
            ["http://a:1", "http://b:2", "http://c:3"]
        );
        // Nothing usable: the text itself, refused where it is checked.
        assert_eq!(urls(","), [","]);
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_grows_with_jitter_caps_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut ceilings = Vec::new();
        for _ in 0..8 {
            let ceiling = b.ceiling();
            let d = b.next_with(&mut rng);
            assert!(
                d >= ceiling / 2 && d <= ceiling,
                "{d:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
            // The delay is a tokio sleep: under paused time it takes exactly that long.
            let start = tokio::time::Instant::now();
            tokio::time::sleep(d).await;
            assert_eq!(start.elapsed(), d);
            ceilings.push(ceiling.as_millis());
        }
        assert_eq!(ceilings, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
        b.reset();
        assert_eq!(b.ceiling(), Duration::from_millis(100));
        // Jitter spreads agents out: 20 draws are not all equal.
        let draws: std::collections::BTreeSet<_> = (0..20)
            .map(|_| {
                Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).next_with(&mut rng)
            })
            .collect();
        assert!(draws.len() > 1);
    }

    /// Issue 35: a fleet that lost its streams at once (govd restarted)
    /// reconnects spread over the first attempt's window, then backs off
    /// exponentially from where a fresh backoff would be at its second try.
    #[tokio::test(start_paused = true)]
    async fn the_first_reconnect_after_a_lost_stream_is_spread_then_backs_off() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(35);
        let fleet = 1000u64;
        let spread = Duration::from_secs(1);
        let mut per_tenth = [0u64; 10];
        let start = tokio::time::Instant::now();
        let mut delays = Vec::new();
        for _ in 0..fleet {
            let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30))
                .with_spread(spread);
            b.reset();
            let first = b.next_with(&mut rng);
            assert!(first <= spread, "{first:?}");
            let bucket = usize::try_from(first.as_millis() / 100).unwrap_or(9).min(9);
            per_tenth[bucket] += 1;
            // Then exponential, as without a spread.
            assert_eq!(b.ceiling(), Duration::from_millis(200));
            delays.push(first);
        }
        // Spread: every tenth of the window gets a share (1,000 draws, about
        // 100 each; no tenth under 50).
        assert!(per_tenth.iter().all(|&n| n >= 50), "{per_tenth:?}");
        // The delays are tokio sleeps: the last agent is back within the window.
        let last = delays.into_iter().max().unwrap_or_default();
        tokio::time::sleep(last).await;
        assert!(start.elapsed() <= spread);
        // The default backoff, which the agent uses, spreads its first reconnect.
        assert_eq!(Backoff::default().spread, backoff::RECONNECT_SPREAD);
    }

    #[test]
    fn the_last_good_config_round_trips_and_belongs_to_its_service() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_last_good(dir.path(), "order").unwrap().is_none());
        let target = proto::TargetConfig {
            version: "abc".into(),
            ..gov_proto::compiled::target("order")
        };
        write_last_good(dir.path(), &target).unwrap();
        write_last_good(dir.path(), &target).unwrap();
        assert_eq!(read_last_good(dir.path(), "order").unwrap(), Some(target));
        assert!(read_last_good(dir.path(), "payment").unwrap().is_none());
        fs::write(dir.path().join(LAST_GOOD_FILE), b"{oops").unwrap();
        assert!(read_last_good(dir.path(), "order").is_err());
    }

    #[tokio::test]
    async fn a_config_that_cannot_be_saved_is_acked_unsaved_and_the_hello_keeps_the_saved_one() {
        let dir = tempfile::tempdir().unwrap();
        // The rename cannot replace a non-empty directory.
        let blocker = dir.path().join(LAST_GOOD_FILE);
        fs::create_dir_all(blocker.join("x")).unwrap();
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut options = ControlOptions::new("http://127.0.0.1:1", "order", "a");
        options.state_dir = Some(dir.path().to_owned());
        let t = told.clone();
        options.on_saved = Some(Arc::new(move |r: Option<&str>| {
            t.lock().unwrap().push(r.map(str::to_owned));
        }));
        let engine = Engine::empty("order");
        let config = |version: &str| proto::ControlMessage {
            msg: Some(ControlMsg::Config(proto::Config {
                target: Some(proto::TargetConfig {
                    version: version.into(),
                    ..gov_proto::compiled::target("order")
                }),
                nonce: format!("n-{version}"),
            })),
        };
        let mut current = "v0".to_owned();
        let Some(proto::agent_message::Msg::Ack(ack)) = handle(
            &engine,
            &options,
            &mut current,
            &mut endpoints::Held::default(),
            config("v1"),
        )
        .await
        else {
            panic!("no ACK");
        };
        assert_eq!(ack.version, "v1");
        assert!(
            ack.unsaved.contains("cannot rename the last good config"),
            "{}",
            ack.unsaved
        );
        // Enforced, but the hello still names the saved version.
        assert_eq!(&*engine.config().version, "v1");
        assert_eq!(current, "v0");
        // Room again: the next push is saved and ACKed plainly.
        fs::remove_dir_all(&blocker).unwrap();
        let Some(proto::agent_message::Msg::Ack(ack)) = handle(
            &engine,
            &options,
            &mut current,
            &mut endpoints::Held::default(),
            config("v2"),
        )
        .await
        else {
            panic!("no ACK");
        };
        assert_eq!(ack.unsaved, "");
        assert_eq!(current, "v2");
        let saved = read_last_good(dir.path(), "order").unwrap().unwrap();
        assert_eq!(saved.version, "v2");
        let told = told.lock().unwrap().clone();
        assert_eq!(told.len(), 2);
        assert!(told[0].is_some() && told[1].is_none(), "{told:?}");
        // Without a state directory nothing is saved, by design: not unsaved.
        options.state_dir = None;
        let Some(proto::agent_message::Msg::Ack(ack)) = handle(
            &engine,
            &options,
            &mut current,
            &mut endpoints::Held::default(),
            config("v3"),
        )
        .await
        else {
            panic!("no ACK");
        };
        assert_eq!((ack.unsaved.as_str(), current.as_str()), ("", "v3"));
    }

    /// Issue 35: a whole set, then deltas onto it reach the balancer as whole
    /// sets and are ACKed with their versions; a delta onto a version this
    /// stream does not hold changes nothing and asks govd for the whole set.
    #[tokio::test]
    async fn endpoint_deltas_apply_onto_their_base_and_a_mismatch_asks_for_the_whole_set() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut options = ControlOptions::new("http://127.0.0.1:1", "web", "w1");
        let s = seen.clone();
        options.on_endpoints = Some(Arc::new(move |e: &proto::Endpoints| {
            let ids = e.instances.iter().map(|i| i.instance.clone()).collect();
            s.lock().unwrap().push((e.version, ids));
        }));
        let engine = Engine::empty("web");
        let mut current = String::new();
        let mut held = endpoints::Held::default();
        let instance = |id: &str| proto::Instance {
            instance: id.into(),
            address: "127.0.0.1:9001".into(),
            phase: proto::Phase::Ready as i32,
            weight_milli_percent: 100_000,
            mtls: false,
        };
        let full = proto::ControlMessage {
            msg: Some(ControlMsg::Endpoints(proto::Endpoints {
                service: "inv".into(),
                instances: vec![instance("a"), instance("b")],
                version: 7,
            })),
        };
        let delta = |base: u64, version: u64, up: &[&str], rm: &[&str]| proto::ControlMessage {
            msg: Some(ControlMsg::EndpointsDelta(proto::EndpointsDelta {
                service: "inv".into(),
                version,
                base_version: base,
                upserted: up.iter().map(|i| instance(i)).collect(),
                removed: rm.iter().map(|i| (*i).to_owned()).collect(),
            })),
        };
        let ack = |reply: Option<proto::agent_message::Msg>| match reply {
            Some(proto::agent_message::Msg::EndpointsAck(a)) => (a.version, a.want_full),
            other => panic!("not an endpoints ack: {other:?}"),
        };
        let mut handle = async |msg| handle(&engine, &options, &mut current, &mut held, msg).await;
        // A delta before any whole set: nothing to apply it onto.
        assert_eq!(ack(handle(delta(6, 7, &["c"], &[])).await), (0, true));
        assert_eq!(ack(handle(full).await), (7, false));
        assert_eq!(ack(handle(delta(7, 8, &["c"], &["a"])).await), (8, false));
        // A delta onto another version than the one held: refused, set kept.
        assert_eq!(ack(handle(delta(9, 10, &[], &["b"])).await), (8, true));
        assert_eq!(ack(handle(delta(8, 9, &[], &["b"])).await), (9, false));
        let seen = seen.lock().unwrap().clone();
        let expected: Vec<(u64, Vec<String>)> = vec![
            (7, vec!["a".into(), "b".into()]),
            (8, vec!["b".into(), "c".into()]),
            (9, vec!["c".into()]),
        ];
        assert_eq!(seen, expected, "the balancer saw only whole, right sets");
    }

    #[test]
    fn a_config_for_another_service_is_refused() {
        let options = ControlOptions::new("http://127.0.0.1:1", "order", "a");
        let ours = proto::TargetConfig {
            ..gov_proto::compiled::target("order")
        };
        assert!(check(&options, &ours).is_ok());
        // The empty config govd sends an agent whose service the policy does not name.
        assert!(Engine::empty("order").apply_target(&ours).is_ok());
        let other = proto::TargetConfig {
            ..gov_proto::compiled::target("payment")
        };
        let (error, rule) = check(&options, &other).unwrap_err();
        assert!(error.contains("`payment`"), "{error}");
        assert_eq!(rule, None);
    }

    #[tokio::test]
    async fn cluster_limits_without_a_store_are_refused_by_the_engine_naming_the_rule() {
        // The NACK the control plane sees comes from this refusal.
        let engine = Engine::empty("order");
        let target = proto::TargetConfig {
            rules: vec![proto::Rule {
                name: "order/crm".into(),
                on: Some(proto::MatchExpr {
                    kind: Some(proto::match_expr::Kind::Any(true)),
                }),
                mode: proto::Mode::Enforce as i32,
                spec: Some(proto::rule::Spec::Limit(proto::Limit {
                    scope: proto::LimitScope::Cluster as i32,
                    calls: Some(proto::Rate {
                        amount: 1,
                        window_ms: 1000,
                    }),
                    sync_timeout_ms: gov_proto::compiled::SYNC_EXACT_TIMEOUT_MS,
                    fallback: proto::ClusterFallback::Local as i32,
                    reject_status: proto::RuleKind::Limit.reject_status(),
                    reject_grpc_status: proto::RuleKind::Limit.reject_grpc() as i32,
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..gov_proto::compiled::target("order")
        };
        let error = engine.apply_target(&target).unwrap_err();
        assert_eq!(error.rule(), Some("order/crm"));
        assert!(error.to_string().contains("scope cluster"), "{error}");
    }
}
