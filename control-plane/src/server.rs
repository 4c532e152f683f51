//! The `ControlPlane` gRPC service and the tasks behind it: the view
//! publisher (one `watch` channel of the `ClusterView`), the debounced state
//! writer, and the `release after` timer.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use gov_compiler::SourceFile;
use gov_proto::v1 as pb;
use pb::agent_message::Msg as AgentMsg;
use pb::control_plane_server::ControlPlane as ControlPlaneRpc;
use tokio::sync::{Mutex as AsyncMutex, Notify, mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, WatchStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::Tokens;
use crate::convert::{self, now_unix_ms};
use crate::error::Error;
use crate::state::{AgentKey, Outbox, State, filter_view};
use crate::store::{AppliedPolicy, AuditEntry, Source, Store, TripKind};

/// Longest `Apply` wait honoured.
pub const MAX_APPLY_WAIT: Duration = Duration::from_secs(60);
/// How long a new stream may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages queued per agent stream.
const AGENT_QUEUE: usize = 64;
/// How long a push may wait for room in an agent's queue before the
/// agent's stream is cut (it reconnects and gets the current config).
const SEND_TIMEOUT: Duration = Duration::from_millis(250);
/// Stats-only changes publish a new view at most this often.
const STATS_PERIOD: Duration = Duration::from_secs(1);
/// Debounce of agent-registry writes.
const PERSIST_DEBOUNCE: Duration = Duration::from_millis(250);
/// Most sources accepted in one apply (bytes).
const MAX_SOURCE_BYTES: usize = 16 << 20;

/// How to run a control plane.
#[derive(Clone, Debug)]
pub struct Options {
    pub state_dir: std::path::PathBuf,
    /// Bearer token operators present for `Apply` and `Release`.
    pub token: Option<String>,
    /// Bearer token agents present on `Connect`.
    pub agent_token: Option<String>,
    /// Applied versions kept in the history.
    pub history_limit: usize,
}

impl Options {
    pub fn new(state_dir: impl Into<std::path::PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            token: None,
            agent_token: None,
            history_limit: 50,
        }
    }
}

/// A running control plane (cheap to clone). Serve it with
/// [`ControlPlane::grpc`] (see `crate::serve`).
#[derive(Clone)]
pub struct ControlPlane {
    inner: Arc<Inner>,
}

struct Inner {
    state: std::sync::Mutex<State>,
    store: Store,
    tokens: Tokens,
    history_limit: usize,
    /// The cluster view, republished on change.
    view: watch::Sender<Arc<pb::ClusterView>>,
    /// Something other than stats changed: publish a view now.
    changed: Notify,
    /// Stats changed: publish within `STATS_PERIOD`.
    stats_dirty: AtomicBool,
    /// Sync state changed (ACK, NACK, disconnect): `Apply` waiters re-check.
    sync: watch::Sender<u64>,
    /// The agent registry changed: write `state.json` soon.
    persist_soon: Notify,
    /// Trips changed: re-plan the `release after` timer.
    timer: Notify,
    /// Serializes writers of `state.json` and appliers.
    write_lock: AsyncMutex<()>,
    apply_lock: AsyncMutex<()>,
    shutdown: CancellationToken,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

// === impl ControlPlane ===

impl ControlPlane {
    /// Loads the state directory and starts the background tasks (they stop
    /// when `shutdown` is cancelled).
    pub fn open(options: Options, shutdown: CancellationToken) -> Result<Self, Error> {
        let store = Store::open(&options.state_dir)?;
        let persisted = store.load()?;
        let state = State::from_persisted(persisted);
        tracing::info!(
            dir = %store.dir().display(),
            version = %state.version(),
            trips = state.trips.len(),
            agents = state.agents.len(),
            "state loaded"
        );
        let view = watch::channel(Arc::new(state.view(now_unix_ms()))).0;
        let inner = Arc::new(Inner {
            state: std::sync::Mutex::new(state),
            store,
            tokens: Tokens {
                operator: options.token,
                agent: options.agent_token,
            },
            history_limit: options.history_limit,
            view,
            changed: Notify::new(),
            stats_dirty: AtomicBool::new(false),
            sync: watch::channel(0).0,
            persist_soon: Notify::new(),
            timer: Notify::new(),
            write_lock: AsyncMutex::new(()),
            apply_lock: AsyncMutex::new(()),
            shutdown,
        });
        tokio::spawn(publish_views(inner.clone()));
        tokio::spawn(persist_agents(inner.clone()));
        tokio::spawn(release_timer(inner.clone()));
        Ok(Self { inner })
    }

    /// The gRPC service.
    pub fn grpc(&self) -> pb::control_plane_server::ControlPlaneServer<Self> {
        pb::control_plane_server::ControlPlaneServer::new(self.clone())
    }

    /// The cluster view, republished on every change (at most about once
    /// per second for stats): what `Watch` streams, for in-process users.
    pub fn watch(&self) -> watch::Receiver<Arc<pb::ClusterView>> {
        self.inner.view.subscribe()
    }

    /// The cluster view now.
    pub fn status(&self) -> pb::ClusterView {
        self.inner.lock().view(now_unix_ms())
    }

    /// The state directory.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Writes the state to disk now (on shutdown).
    pub async fn flush(&self) -> Result<(), Error> {
        self.inner.persist().await
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State half-updated in a
        // way that matters more than stopping the control plane would.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes `state.json` (serialized with other writers).
    async fn persist(&self) -> Result<(), Error> {
        let _guard = self.write_lock.lock().await;
        let snapshot = self.lock().to_persisted();
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.save(&snapshot))
            .await
            .map_err(|e| {
                Error::Io(crate::error::StateIo::new(
                    "write",
                    self.store.dir(),
                    std::io::Error::other(e),
                ))
            })?
    }

    async fn audit(&self, entry: AuditEntry) {
        let store = self.store.clone();
        let result = tokio::task::spawn_blocking(move || store.audit(&entry)).await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::error!(error = %miette::Report::new(error), "cannot write the audit log")
            }
            Err(error) => tracing::error!(%error, "cannot write the audit log"),
        }
    }

    /// Sends queued messages (outside the state lock). A full or closed
    /// queue means the agent is gone or hopelessly slow: its stream task
    /// notices and marks it disconnected.
    async fn send(&self, out: Outbox) {
        // All at once, each bounded: one stuck agent cannot hold up the others.
        let sends = out.into_iter().map(|o| async move {
            match tokio::time::timeout(SEND_TIMEOUT, o.tx.send(Ok(o.msg))).await {
                // Sent, or the stream is gone already (its reader records that).
                Ok(_) => None,
                Err(_) => Some((o.key, o.conn)),
            }
        });
        let stuck: Vec<_> = futures::future::join_all(sends)
            .await
            .into_iter()
            .flatten()
            .collect();
        if stuck.is_empty() {
            return;
        }
        {
            let mut state = self.lock();
            for (key, id) in &stuck {
                tracing::warn!(service = %key.0, instance = %key.1, "the agent does not read its stream; cutting it so it reconnects and resyncs");
                state.disconnect(
                    key,
                    *id,
                    "cut: its queue stayed full (the agent does not read its stream)",
                    now_unix_ms(),
                );
            }
        }
        self.bump_sync();
        self.changed();
    }

    fn changed(&self) {
        self.changed.notify_one();
    }

    fn bump_sync(&self) {
        self.sync.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Releases `rule` everywhere and records who did it.
    async fn release(&self, kind: TripKind, rule: &str, who: &str) -> (bool, Vec<String>) {
        let mut out = Vec::new();
        let (was, notified) = self.lock().release(kind, rule, who, &mut out);
        self.send(out).await;
        if let Err(error) = self.persist().await {
            tracing::error!(error = %miette::Report::new(error), "cannot write the state after a release");
        }
        self.audit(AuditEntry {
            at_unix_ms: now_unix_ms(),
            who: who.to_owned(),
            action: "release".into(),
            version: String::new(),
            kind: kind.as_str().into(),
            rule: rule.to_owned(),
            targets: notified.clone(),
            detail: if was {
                String::new()
            } else {
                "was not tripped".into()
            },
        })
        .await;
        self.changed();
        self.timer.notify_one();
        (was, notified)
    }
}

// === background tasks ===

/// Rebuilds the view when something changed, and at most once per
/// `STATS_PERIOD` when only stats changed.
async fn publish_views(inner: Arc<Inner>) {
    let mut tick = tokio::time::interval(STATS_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = inner.shutdown.cancelled() => return,
            () = inner.changed.notified() => {}
            _ = tick.tick() => {
                // Remaining times of limits and fuses tick down too.
                let any_trip = !inner.lock().trips.is_empty();
                if !inner.stats_dirty.swap(false, Ordering::Relaxed) && !any_trip {
                    continue;
                }
            }
        }
        let view = inner.lock().view(now_unix_ms());
        inner.view.send_replace(Arc::new(view));
    }
}

/// Writes the agent registry shortly after it changes.
async fn persist_agents(inner: Arc<Inner>) {
    loop {
        tokio::select! {
            () = inner.shutdown.cancelled() => return,
            () = inner.persist_soon.notified() => {}
        }
        tokio::time::sleep(PERSIST_DEBOUNCE).await;
        if let Err(error) = inner.persist().await {
            tracing::error!(error = %miette::Report::new(error), "cannot write the state");
        }
    }
}

/// Releases limits whose `release after` deadline passed. Deadlines are
/// absolute (wall clock, stored on disk) so they survive a restart; the
/// wait itself uses `tokio::time`.
async fn release_timer(inner: Arc<Inner>) {
    loop {
        let (expired, next) = {
            let state = inner.lock();
            let now = now_unix_ms();
            (
                state.expired(now),
                state.next_deadline().map(|d| d.saturating_sub(now)),
            )
        };
        for rule in expired {
            tracing::info!(%rule, "release after: releasing the limit");
            inner
                .release(TripKind::Limit, &rule, "govd (release after)")
                .await;
        }
        // Re-check at least every minute in case the wall clock jumps.
        let wait = next.map_or(Duration::from_secs(60), |ms| {
            Duration::from_millis(ms.clamp(1, 60_000))
        });
        tokio::select! {
            () = inner.shutdown.cancelled() => return,
            () = inner.timer.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

// === the gRPC service ===

#[tonic::async_trait]
impl ControlPlaneRpc for ControlPlane {
    async fn apply(
        &self,
        request: Request<pb::ApplyRequest>,
    ) -> Result<Response<pb::ApplyResult>, Status> {
        // A dry run changes nothing and shows what `Status` shows: no token needed.
        if !request.get_ref().dry_run {
            self.inner.tokens.operator(&request)?;
        }
        let req = request.into_inner();
        if req.sources.is_empty() {
            return Err(Status::invalid_argument(
                "no sources: send at least one `.gov` file",
            ));
        }
        let total: usize = req
            .sources
            .iter()
            .map(|s| s.text.len() + s.name.len())
            .sum();
        if total > MAX_SOURCE_BYTES {
            return Err(Status::invalid_argument(format!(
                "the sources are {total} bytes, more than the {MAX_SOURCE_BYTES} accepted"
            )));
        }
        if let Some(s) = req.sources.iter().find(|s| s.name.trim().is_empty()) {
            return Err(Status::invalid_argument(format!(
                "a source has no file name ({} bytes)",
                s.text.len()
            )));
        }
        let who = if req.who.trim().is_empty() {
            "unknown".to_owned()
        } else {
            req.who.clone()
        };
        let files: Vec<SourceFile> = req
            .sources
            .iter()
            .map(|s| SourceFile::new(&s.name, &s.text))
            .collect();

        // One apply at a time: the plan is against the version it replaces.
        let apply_guard = self.inner.apply_lock.lock().await;
        let started = tokio::time::Instant::now();
        let compiled = {
            let files = files.clone();
            tokio::task::spawn_blocking(move || gov_compiler::compile(&files))
                .await
                .map_err(|e| Status::internal(format!("the compiler failed: {e}")))?
        };
        let current = self.inner.lock().version().to_owned();
        let compiled = match compiled {
            Ok(c) => c,
            Err(diagnostics) => {
                tracing::info!(
                    who,
                    errors = diagnostics.error_count(),
                    "apply refused: invalid policy"
                );
                return Ok(Response::new(pb::ApplyResult {
                    applied: false,
                    version: current,
                    plan: None,
                    diagnostics: diagnostics
                        .iter()
                        .map(|d| convert::diagnostic(d, &files))
                        .collect(),
                    outcomes: Vec::new(),
                }));
            }
        };
        let diagnostics: Vec<pb::Diagnostic> = compiled
            .warnings
            .iter()
            .map(|d| convert::diagnostic(d, &files))
            .collect();
        let empty = pb::Bundle::default();
        let plan = {
            let state = self.inner.lock();
            gov_compiler::plan(state.bundle().unwrap_or(&empty), &compiled.bundle)
        };
        let changed: Vec<String> = plan
            .services
            .iter()
            .filter(|s| s.change != gov_compiler::plan::Change::Unchanged)
            .map(|s| s.service.clone())
            .collect();
        let first = current.is_empty();
        if req.dry_run || (changed.is_empty() && !first) {
            return Ok(Response::new(pb::ApplyResult {
                applied: false,
                version: current,
                plan: Some(convert::plan(&plan)),
                diagnostics,
                outcomes: Vec::new(),
            }));
        }

        // Durable first, then pushed: a restart never forgets an apply whose
        // config some agent already enforces.
        let policy = AppliedPolicy {
            version: compiled.bundle.version.clone(),
            who: who.clone(),
            at_unix_ms: now_unix_ms(),
            sources: req
                .sources
                .iter()
                .map(|s| Source {
                    name: s.name.clone(),
                    text: s.text.clone(),
                })
                .collect(),
            bundle: compiled.bundle,
        };
        let version = policy.version.clone();
        let mut out = Vec::new();
        let previous = {
            let mut state = self.inner.lock();
            let previous = (state.applied.clone(), state.history.clone());
            state.apply(policy, &changed, self.inner.history_limit, &mut out);
            previous
        };
        let compiled_at = started.elapsed();
        if let Err(error) = self.inner.persist().await {
            // Undo: nothing was sent yet.
            let mut state = self.inner.lock();
            state.applied = previous.0;
            state.history = previous.1;
            drop(state);
            tracing::error!(error = %miette::Report::new(error), "apply not stored");
            return Err(Status::unavailable(
                "cannot store the policy in the state directory; nothing was applied",
            ));
        }
        let stored_at = started.elapsed();
        // The audit line is written while the agents apply (joined before answering).
        let audit = {
            let inner = self.inner.clone();
            let entry = AuditEntry {
                at_unix_ms: now_unix_ms(),
                who: who.clone(),
                action: "apply".into(),
                version: version.clone(),
                kind: String::new(),
                rule: String::new(),
                targets: changed.clone(),
                detail: String::new(),
            };
            tokio::spawn(async move { inner.audit(entry).await })
        };
        tracing::info!(who, %version, services = ?changed, agents = out.len(), "applied");
        self.inner.send(out).await;
        let pushed_at = started.elapsed();
        self.inner.changed();
        self.inner.timer.notify_one();
        // Waiting for ACKs must not hold up the next apply.
        drop(apply_guard);

        if req.wait_ms > 0 {
            let wait = Duration::from_millis(u64::from(req.wait_ms)).min(MAX_APPLY_WAIT);
            let mut sync = self.inner.sync.subscribe();
            let deadline = tokio::time::Instant::now() + wait;
            loop {
                if self.inner.lock().settled(&changed) {
                    break;
                }
                tokio::select! {
                    r = sync.changed() => if r.is_err() { break },
                    () = tokio::time::sleep_until(deadline) => break,
                    () = self.inner.shutdown.cancelled() => break,
                }
            }
        }
        let settled_at = started.elapsed();
        if let Err(error) = audit.await {
            tracing::error!(%error, "the audit writer failed");
        }
        tracing::debug!(
            compile_plan_ms = compiled_at.as_secs_f64() * 1e3,
            store_ms = (stored_at - compiled_at).as_secs_f64() * 1e3,
            push_ms = (pushed_at - stored_at).as_secs_f64() * 1e3,
            acks_ms = (settled_at - pushed_at).as_secs_f64() * 1e3,
            "apply timing"
        );
        let outcomes = self.inner.lock().outcomes(&changed);
        Ok(Response::new(pb::ApplyResult {
            applied: true,
            version,
            plan: Some(convert::plan(&plan)),
            diagnostics,
            outcomes,
        }))
    }

    type ConnectStream = BoxStream<pb::ControlMessage>;

    async fn connect(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        self.inner.tokens.agent(&request)?;
        let mut incoming = request.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, incoming.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no hello within 10s"))??;
        let hello = match first.and_then(|m| m.msg) {
            Some(AgentMsg::Hello(h)) => h,
            Some(_) => {
                return Err(Status::invalid_argument(
                    "the first message must be a hello",
                ));
            }
            None => {
                return Err(Status::invalid_argument(
                    "the stream ended before the hello",
                ));
            }
        };
        if hello.service.trim().is_empty() || hello.instance.trim().is_empty() {
            return Err(Status::invalid_argument(
                "hello needs a service and an instance",
            ));
        }
        let (tx, rx) = mpsc::channel(AGENT_QUEUE);
        let mut out = Vec::new();
        let (key, id) = self.inner.lock().hello(hello, tx, now_unix_ms(), &mut out);
        tracing::info!(service = %key.0, instance = %key.1, pushed = !out.is_empty(), "agent connected");
        self.inner.send(out).await;
        self.inner.changed();
        self.inner.bump_sync();
        self.inner.persist_soon.notify_one();
        tokio::spawn(read_agent(self.inner.clone(), key, id, incoming));
        let stream =
            ReceiverStream::new(rx).take_until(self.inner.shutdown.clone().cancelled_owned());
        Ok(Response::new(Box::pin(stream)))
    }

    type WatchStream = BoxStream<pb::ClusterView>;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let service = request.into_inner().service;
        let stream = WatchStream::new(self.inner.view.subscribe())
            .map(move |view| Ok(filter_view((*view).clone(), &service)))
            .take_until(self.inner.shutdown.clone().cancelled_owned());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn status(
        &self,
        request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::ClusterView>, Status> {
        let service = request.into_inner().service;
        Ok(Response::new(filter_view(self.status(), &service)))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResult>, Status> {
        self.inner.tokens.operator(&request)?;
        let req = request.into_inner();
        let kind = match pb::ReleaseKind::try_from(req.kind) {
            Ok(pb::ReleaseKind::Fuse) => TripKind::Fuse,
            Ok(pb::ReleaseKind::Limit) => TripKind::Limit,
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown release kind {}",
                    req.kind
                )));
            }
        };
        match req.rule.split_once('/') {
            Some((s, r)) if !s.is_empty() && !r.is_empty() && !r.contains('/') => {}
            _ => {
                return Err(Status::invalid_argument(format!(
                    "`{}` is not `service/rule`",
                    req.rule
                )));
            }
        }
        {
            let state = self.inner.lock();
            if !state.has_rule(kind, &req.rule)
                && !state.trips.contains_key(&(kind, req.rule.clone()))
            {
                return Err(Status::not_found(format!(
                    "the applied policy has no {} `{}`",
                    kind.as_str(),
                    req.rule
                )));
            }
        }
        let who = if req.who.trim().is_empty() {
            "unknown".to_owned()
        } else {
            req.who
        };
        let (was, notified) = self.inner.release(kind, &req.rule, &who).await;
        tracing::info!(who, rule = %req.rule, kind = kind.as_str(), was, agents = notified.len(), "released");
        let message = match (was, notified.len()) {
            (true, n) => format!("released {} `{}` on {n} agent(s)", kind.as_str(), req.rule),
            (false, n) => format!(
                "{} `{}` was not {}; sent the release to {n} agent(s) anyway",
                kind.as_str(),
                req.rule,
                if kind == TripKind::Fuse {
                    "tripped"
                } else {
                    "engaged"
                }
            ),
        };
        Ok(Response::new(pb::ReleaseResult {
            released: was,
            message,
            agents_notified: u32::try_from(notified.len()).unwrap_or(u32::MAX),
        }))
    }
}

/// Reads one agent's stream until it ends, the agent reconnects elsewhere,
/// or the server stops.
async fn read_agent(
    inner: Arc<Inner>,
    key: AgentKey,
    id: u64,
    mut incoming: Streaming<pb::AgentMessage>,
) {
    let reason = loop {
        let msg = tokio::select! {
            () = inner.shutdown.cancelled() => break "control plane stopping".to_owned(),
            m = incoming.message() => m,
        };
        let msg = match msg {
            Ok(Some(pb::AgentMessage { msg: Some(msg) })) => msg,
            Ok(Some(pb::AgentMessage { msg: None })) => continue,
            Ok(None) => break "stream closed by the agent".to_owned(),
            Err(status) => break format!("stream error: {}", status.message()),
        };
        let effect = inner.lock().on_message(&key, id, msg, now_unix_ms());
        if effect.sync {
            inner.bump_sync();
            inner.changed();
            inner.persist_soon.notify_one();
        }
        if effect.trips {
            if let Err(error) = inner.persist().await {
                tracing::error!(error = %miette::Report::new(error), "cannot write the fuse/limit state");
            }
            inner.timer.notify_one();
            inner.changed();
        }
        if effect.stats {
            inner.stats_dirty.store(true, Ordering::Relaxed);
        }
    };
    if inner.lock().disconnect(&key, id, &reason, now_unix_ms()) {
        tracing::info!(service = %key.0, instance = %key.1, %reason, "agent disconnected");
        inner.bump_sync();
        inner.changed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(instance: &str) -> pb::Hello {
        pb::Hello {
            service: "order".into(),
            instance: instance.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_stuck_agent_is_cut_and_the_others_still_get_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let cp = ControlPlane::open(Options::new(dir.path()), CancellationToken::new()).unwrap();
        // A queue that is full and never read: the agent does not read its stream.
        let (stuck, _never_read) = mpsc::channel(1);
        stuck.try_send(Ok(pb::ControlMessage::default())).unwrap();
        let (good, mut received) = mpsc::channel(8);
        {
            let mut state = cp.inner.lock();
            state.hello(hello("stuck"), stuck, 1, &mut Vec::new());
            state.hello(hello("good"), good, 1, &mut Vec::new());
        }
        let request = pb::ApplyRequest {
            sources: vec![pb::SourceFile {
                name: "p.gov".into(),
                text: "service order {\n  match all = path prefix \"/\"\n  bulkhead b on all {\n    max_concurrent 1\n  }\n}\n".into(),
            }],
            ..Default::default()
        };
        let result = ControlPlaneRpc::apply(&cp, Request::new(request))
            .await
            .unwrap()
            .into_inner();
        assert!(result.applied, "{:?}", result.diagnostics);
        let msg = received.try_recv().unwrap().unwrap();
        assert!(matches!(msg.msg, Some(pb::control_message::Msg::Config(_))));
        let view = cp.status();
        let stuck = view.agents.iter().find(|a| a.instance == "stuck").unwrap();
        assert_eq!(stuck.state(), pb::SyncState::Disconnected);
        assert!(
            stuck.reason.contains("queue stayed full"),
            "{}",
            stuck.reason
        );
        let good = view.agents.iter().find(|a| a.instance == "good").unwrap();
        assert_eq!(
            good.state(),
            pb::SyncState::Stale,
            "sent, waiting for its ACK"
        );
        // The apply is on disk and in the audit log.
        assert_eq!(
            cp.store().load().unwrap().applied.unwrap().version,
            result.version
        );
        assert_eq!(cp.store().read_audit().unwrap().len(), 1);
    }
}
