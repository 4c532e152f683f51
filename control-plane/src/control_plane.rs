//! The running control plane: its state behind one lock, its store (the
//! state directory or etcd), and the tasks behind it: the view publisher
//! (one `watch` channel of the `ClusterView`), the debounced state writer,
//! the `release after` timer (run by the elected leader only), and, on a
//! shared store, the follower that takes in what other replicas wrote. The
//! gRPC adapter is `server.rs`; the apply use case is `apply.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use gov_proto::v1 as pb;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Mutex as AsyncMutex, Notify, Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::auth::Tokens;
use crate::change::{Change, Recheck};
use crate::convert::now_unix_ms;
use crate::error::Error;
use crate::latch::LatchKind;
use crate::limits::Limits;
use crate::state::{Outbox, Outgoing, State};
use crate::store::{AuditEntry, DirStore, Fence, Loaded, Persisted, Revision, Store};
use crate::view::cluster_view;

/// How long a push may wait for room in an agent's queue before the
/// agent's stream is cut (it reconnects and gets the current config).
const SEND_TIMEOUT: Duration = Duration::from_millis(250);
/// How soon the `release after` timer retries a release it could not record.
const RELEASE_RETRY: Duration = Duration::from_secs(5);
/// How soon a replica that could not reload the state tries again.
const RESYNC_RETRY: Duration = Duration::from_secs(1);

pub use crate::options::Options;

/// A running control plane (cheap to clone). Serve it with
/// [`ControlPlane::grpc`] (see `crate::serve`).
#[derive(Clone)]
pub struct ControlPlane {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    state: std::sync::Mutex<State>,
    /// The store, its health recorded (`store_health`).
    pub(crate) store: Arc<dyn Store>,
    pub(crate) health: Arc<crate::store_health::Health>,
    /// The stored revision the state reflects: what the next write of the
    /// shared state is conditioned on. Changed under `write_lock` only.
    revision: AtomicI64,
    /// Swapped whole by [`ControlPlane::set_tokens`] (SIGHUP).
    tokens: std::sync::RwLock<Arc<Tokens>>,
    pub(crate) history: crate::HistoryLimit,
    pub(crate) limits: Limits,
    pub(crate) tls: Option<crate::tls_server::ServerTls>,
    pub(crate) agent_certificates: bool,
    pub(crate) identity: Option<Arc<crate::identity::Issuer>>,
    pub(crate) connections: crate::ConnectionLimits,
    /// New agent streams at a bounded rate (reconnect storms).
    pub(crate) admission: crate::connections::Admission,
    pub(crate) agent_limits: crate::AgentLimits,
    /// The cluster view, republished on change while anyone watches it
    /// (`publish.rs`); read it with [`Inner::subscribe_view`].
    pub(crate) view: watch::Sender<Arc<pb::ClusterView>>,
    /// The published view may be behind: nobody watched when it changed.
    pub(crate) view_stale: AtomicBool,
    /// The version in force, republished when it changes (`publish.rs`).
    pub(crate) policy_version: watch::Sender<String>,
    /// Something other than stats changed: publish a view now.
    pub(crate) changed_view: Notify,
    /// Stats changed: publish within `publish::STATS_PERIOD`.
    pub(crate) stats_dirty: AtomicBool,
    /// Sync state changed (ACK, NACK, disconnect): `Apply` waiters re-check.
    pub(crate) sync: watch::Sender<u64>,
    /// The agent registry changed: write `state.json` soon.
    pub(crate) persist_soon: Notify,
    /// Latches changed: re-plan the `release after` timer.
    pub(crate) timer: Notify,
    /// A canary started or ended: the canary watcher (`rollout`) looks.
    pub(crate) canary: Notify,
    /// Serializes writers of `state.json`. An apply holds it from the
    /// snapshot it writes until its commit, so no other writer can put an
    /// older snapshot on disk in between.
    pub(crate) write_lock: AsyncMutex<()>,
    /// One real apply at a time: its plan is against the version it
    /// replaces. Dry runs never take it.
    pub(crate) apply_lock: Arc<AsyncMutex<()>>,
    /// Bounds the compiles running at once (applies and dry runs).
    pub(crate) compile_slots: Arc<Semaphore>,
    pub(crate) shutdown: CancellationToken,
    /// What `/metrics` counts.
    pub(crate) metrics: crate::metrics::Metrics,
    /// Audit records that could not be written yet (`journal`).
    pub(crate) pending_audit: crate::journal::Pending,
    /// See [`Options::intent_grace`].
    pub(crate) intent_grace: Duration,
}

// === impl ControlPlane ===

impl ControlPlane {
    /// Loads the state directory and starts the background tasks (they stop
    /// when `shutdown` is cancelled).
    pub fn open(options: Options, shutdown: CancellationToken) -> Result<Self, Error> {
        let store = DirStore::open(&options.state_dir)?;
        let loaded = store.load_now()?;
        Ok(Self::with_store(options, Arc::new(store), loaded, shutdown))
    }

    /// Runs on `store` (etcd: see `crate::etcd`), from `loaded`, what it
    /// held at start; `options.state_dir` is not used.
    pub fn with_store(
        options: Options,
        store: Arc<dyn Store>,
        loaded: Loaded,
        shutdown: CancellationToken,
    ) -> Self {
        let revision = AtomicI64::new(loaded.revision);
        let state = State::from_persisted(loaded.state);
        tracing::info!(
            store = %store.describe(),
            version = %state.version(),
            latches = state.latches().count(),
            agents = state.agents().count(),
            "state loaded"
        );
        let view = watch::channel(Arc::new(cluster_view(&state, now_unix_ms()))).0;
        let state_version = state.version().to_owned();
        let store = crate::store_health::Tracked::new(store);
        let inner = Arc::new(Inner {
            state: std::sync::Mutex::new(state),
            health: store.health(),
            store: Arc::new(store),
            revision,
            tokens: std::sync::RwLock::new(Arc::new(Tokens {
                named: options.tokens,
                agent: options.agent_token,
            })),
            history: options.history,
            compile_slots: Arc::new(Semaphore::new(options.limits.concurrent_compiles.max(1))),
            limits: options.limits,
            tls: options.tls,
            agent_certificates: options.agent_certificates,
            identity: options.identity,
            connections: options.connections,
            admission: crate::connections::Admission::new(
                options.connections.agent_admissions_per_second,
            ),
            agent_limits: options.agent_limits,
            view,
            view_stale: AtomicBool::new(false),
            policy_version: watch::channel(state_version).0,
            changed_view: Notify::new(),
            stats_dirty: AtomicBool::new(false),
            sync: watch::channel(0).0,
            persist_soon: Notify::new(),
            timer: Notify::new(),
            canary: Notify::new(),
            write_lock: AsyncMutex::new(()),
            apply_lock: Arc::new(AsyncMutex::new(())),
            shutdown,
            metrics: crate::metrics::Metrics::default(),
            pending_audit: crate::journal::Pending::default(),
            intent_grace: options.intent_grace,
        });
        tokio::spawn(inner.clone().publish_views());
        tokio::spawn(inner.clone().persist_agents_soon());
        tokio::spawn(release_timer(inner.clone()));
        tokio::spawn(inner.clone().expire_rules());
        tokio::spawn(inner.clone().watch_canary());
        tokio::spawn(keep_audit_true(inner.clone()));
        let changed = inner.clone();
        tokio::spawn(crate::store_health::watch(
            inner.store.clone(),
            inner.health.clone(),
            inner.shutdown.clone(),
            move || changed.changed(),
        ));
        if let Some(changes) = inner.store.changes() {
            tokio::spawn(follow_store(inner.clone(), changes));
        }
        Self { inner }
    }

    /// The cluster view, republished on every change (at most about once
    /// per second for stats): what `Watch` streams, for in-process users.
    pub fn watch(&self) -> watch::Receiver<Arc<pb::ClusterView>> {
        self.inner.subscribe_view()
    }

    /// The cluster view now.
    pub fn status(&self) -> pb::ClusterView {
        self.inner.view_now()
    }

    /// `/metrics` now: the counters, with the cluster view and whether
    /// this govd leads (what [`crate::metrics::serve_metrics`] serves).
    pub fn metrics_text(&self) -> String {
        let leader = *self.inner.store.leader().borrow();
        self.inner.metrics.render(&self.status(), leader)
    }

    /// Where the state is kept.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Replaces the tokens people and agents present (govd re-reads its
    /// token files on SIGHUP): calls from now on are checked against these;
    /// a token no longer in them stops working at once. The change is
    /// audited (names and roles, never a token).
    pub async fn set_tokens(&self, tokens: Tokens, why: &str) {
        let detail = tokens
            .named
            .iter()
            .map(|t| format!("{} ({})", t.name, t.role.as_str()))
            .collect::<Vec<_>>()
            .join(", ");
        let agent = tokens.agent.is_some();
        *self
            .inner
            .tokens
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(tokens);
        self.inner
            .audit(AuditEntry {
                at_unix_ms: now_unix_ms(),
                who: format!("govd ({why})"),
                action: "tokens-reloaded".into(),
                intent: String::new(),
                version: String::new(),
                kind: String::new(),
                rule: String::new(),
                key: String::new(),
                targets: Vec::new(),
                detail: format!(
                    "people: {}; agent token: {}",
                    if detail.is_empty() {
                        "none (open)"
                    } else {
                        &detail
                    },
                    if agent { "set" } else { "none" }
                ),
            })
            .await;
    }

    /// The tokens in force.
    pub fn tokens(&self) -> Arc<Tokens> {
        self.inner.tokens()
    }

    /// Writes the state to disk now (on shutdown).
    pub async fn flush(&self) -> Result<(), Error> {
        self.inner.persist().await?;
        self.inner.persist_agents().await
    }
}

// === impl Inner ===

impl Inner {
    /// The cluster view now, with the store's health: what `Status`,
    /// `Watch` and `/metrics` show.
    pub(crate) fn view_now(&self) -> pb::ClusterView {
        let mut view = cluster_view(&self.lock(), now_unix_ms());
        view.store = Some(self.health.view(self.store.as_ref()));
        view
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State half-updated in a
        // way that matters more than stopping the control plane would.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The tokens in force (a snapshot: a reload does not change a call
    /// already checked).
    pub(crate) fn tokens(&self) -> Arc<Tokens> {
        self.tokens
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Writes the state (latches its agents reported, each audited as it
    /// was reported): the write protocol (`transact.rs`) without an
    /// operator's intent. A write refused because another replica wrote
    /// first takes its state in (keeping the latches this replica's agents
    /// reported) and writes again.
    pub(crate) async fn persist(&self) -> Result<(), Error> {
        let write = self.write_lock.lock().await;
        let change = Change {
            audit: None,
            fence: Fence::Any,
            next: State::to_persisted,
            recheck: |_: &State| Recheck::Again,
            commit: |_: &mut State, _: &mut Outbox| (),
            audit_failed: std::convert::identity,
            store_failed: std::convert::identity,
        };
        self.transact(write, change).await.map(drop)
    }

    /// Writes `snapshot`, conditioned on the revision the state reflects;
    /// the caller holds `write_lock` and commits to the state on success.
    pub(crate) async fn save(&self, snapshot: Persisted, fence: Fence) -> Result<(), Error> {
        let expected = self.revision.load(Ordering::SeqCst);
        let revision = self.store.save(&snapshot, expected, fence).await?;
        self.revision.store(revision, Ordering::SeqCst);
        Ok(())
    }

    /// Takes in what another replica stored since this one's revision:
    /// its policy (pushed to this replica's agents), releases (sent to
    /// them), latches (merged with theirs). The caller holds `write_lock`.
    /// Makes sure the state this replica serves is the stored one: on a
    /// shared store, reads the stored revision (a quorum read) and takes in
    /// what is newer. A replica resumed after a pause longer than its lease,
    /// or cut off from etcd, would otherwise hand a connecting agent the
    /// policy it held before, an older one than the agent may enforce. An
    /// error: the revision could not be read, so nothing is current enough
    /// to serve.
    pub(crate) async fn confirm_current(&self) -> Result<(), Error> {
        let Some(current) = self.store.current_revision() else {
            return Ok(());
        };
        let current = current.await?;
        if current <= self.revision.load(Ordering::SeqCst) {
            return Ok(());
        }
        let _write = self.write_lock.lock().await;
        self.resync().await
    }

    pub(crate) async fn resync(&self) -> Result<(), Error> {
        let loaded = self.store.load_shared().await?;
        if loaded.revision <= self.revision.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut out = Vec::new();
        let adopted = self.lock().adopt(loaded.state, &mut out);
        self.revision.store(loaded.revision, Ordering::SeqCst);
        if adopted.policy {
            tracing::info!(version = %self.lock().version(), revision = loaded.revision, "took in a policy applied on another replica");
        }
        self.send(out).await;
        self.bump_sync();
        self.changed();
        self.timer.notify_one();
        self.canary.notify_one();
        Ok(())
    }

    /// Appends `entry` to the audit log.
    pub(crate) async fn append_audit(&self, entry: AuditEntry) -> Result<(), Error> {
        self.store.audit(&entry).await
    }

    /// Appends `entry` to the audit log, logging a failure (for records of
    /// actions that happen whether or not they can be written).
    /// A record that cannot be written now is kept and tried again until
    /// it is (`journal`), after the records already waiting.
    pub(crate) async fn audit(&self, entry: AuditEntry) {
        self.pending_audit.write(&*self.store, entry).await;
    }

    /// Sends queued messages (outside the state lock). A full or closed
    /// queue means the agent is gone or hopelessly slow: its stream task
    /// notices and marks it disconnected.
    pub(crate) async fn send(&self, out: Outbox) {
        // A queue with room takes its message at once, without a future and
        // a timer per agent (an apply to N agents is N messages, polled by
        // the runtime in batches); only the messages for full queues wait,
        // all at once, each bounded: one stuck agent cannot hold up the
        // others. Once one message of a stream waits, its later ones wait
        // behind it, so that each stream gets its messages in order.
        let mut waiting: Vec<Outgoing> = Vec::new();
        let mut waiting_streams = std::collections::HashSet::new();
        for o in out {
            self.metrics.on_send(&o.msg);
            if waiting_streams.contains(&o.conn) {
                waiting.push(o);
                continue;
            }
            let Outgoing { key, conn, tx, msg } = o;
            match tx.try_send(Box::new(msg)) {
                // Sent, or the stream is gone already (its reader records that).
                Ok(()) | Err(TrySendError::Closed(_)) => {}
                Err(TrySendError::Full(msg)) => {
                    waiting_streams.insert(conn);
                    waiting.push(Outgoing {
                        key,
                        conn,
                        tx,
                        msg: *msg,
                    });
                }
            }
        }
        if waiting.is_empty() {
            return;
        }
        let sends = waiting.into_iter().map(|o| async move {
            match tokio::time::timeout(SEND_TIMEOUT, o.tx.send(Box::new(o.msg))).await {
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

    pub(crate) fn changed(&self) {
        self.changed_view.notify_one();
    }

    /// Only stats changed: publish within `STATS_PERIOD`.
    pub(crate) fn stats_changed(&self) {
        self.stats_dirty.store(true, Ordering::Relaxed);
    }

    pub(crate) fn bump_sync(&self) {
        self.sync.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Releases `rule` (a limit's `key` only, or every key) everywhere and
    /// records who did it, all or nothing (`transact.rs`): the audit
    /// record, then the stored state without the latch, and only then the
    /// latch is forgotten and the agents are told. Returns (the keys that
    /// were latched, instances notified).
    pub(crate) async fn release(
        &self,
        kind: LatchKind,
        rule: &str,
        key: Option<&str>,
        who: &str,
        fence: Fence,
    ) -> Result<(Vec<String>, Vec<String>), ReleaseError> {
        let write = self.write_lock.lock().await;
        let (keys, notified) = {
            let state = self.lock();
            if !state.has_rule(kind, rule) && !state.is_latched(kind, rule) {
                return Err(ReleaseError::NoSuchRule {
                    kind: kind.as_str(),
                    rule: rule.to_owned(),
                });
            }
            state.release_preview(kind, rule, key)
        };
        let released_at = now_unix_ms();
        let entry = AuditEntry {
            at_unix_ms: released_at,
            who: who.to_owned(),
            action: "release".into(),
            kind: kind.as_str().into(),
            rule: rule.to_owned(),
            key: key.unwrap_or("").to_owned(),
            targets: notified.clone(),
            detail: released_detail(kind, key, &keys),
            ..AuditEntry::default()
        };
        // Another replica that wrote first (latches its agents reported)
        // is taken in, and the release written on top.
        let change = Change {
            audit: Some(entry),
            fence,
            next: |s: &State| s.persisted_without(kind, rule, key, released_at),
            recheck: |_: &State| Recheck::Again,
            commit: |s: &mut State, out: &mut Outbox| {
                s.release(kind, rule, key, who, released_at, out)
            },
            audit_failed: ReleaseError::Audit,
            store_failed: ReleaseError::Store,
        };
        let released = self.transact(write, change).await?;
        Ok(released.unwrap_or((keys, notified)))
    }
}

/// The audit detail of a release: nothing when it released what was asked,
/// else what it found (the keys of a release of every key of a limit).
fn released_detail(kind: LatchKind, key: Option<&str>, keys: &[String]) -> String {
    match (kind, key, keys) {
        (_, _, []) => "was not tripped".into(),
        (LatchKind::Limit, None, keys) if keys.iter().any(|k| !k.is_empty()) => {
            format!("keys: {}", keys.join(", "))
        }
        _ => String::new(),
    }
}

/// Why a release was refused. Nothing was released in every case.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ReleaseError {
    #[error("the applied policy has no {kind} `{rule}`")]
    #[diagnostic(code(gov::govd::no_such_rule))]
    NoSuchRule { kind: &'static str, rule: String },

    #[error("cannot record the release in the audit log; nothing was released")]
    #[diagnostic(
        code(gov::govd::audit),
        help(
            "make --state-dir writable (or free disk space), or bring the etcd members of --store back, then release again"
        )
    )]
    Audit(#[source] Error),

    #[error("cannot store the release; nothing was released")]
    #[diagnostic(
        code(gov::govd::store),
        help(
            "make --state-dir writable (or free disk space), or bring the etcd members of --store back; after a conflict with another replica, look at the state again; then release again"
        )
    )]
    Store(#[source] Error),
}

// === background tasks ===

/// Releases limits whose `release after` deadline passed. Deadlines are
/// absolute (wall clock, stored on disk) so they survive a restart; the
/// wait itself uses `tokio::time`.
async fn release_timer(inner: Arc<Inner>) {
    let mut leader = inner.store.leader();
    loop {
        // Only the leader runs the timer: every replica knows the
        // deadlines, one releases.
        while !*leader.borrow_and_update() {
            tokio::select! {
                () = inner.shutdown.cancelled() => return,
                r = leader.changed() => if r.is_err() { return },
            }
        }
        let (expired, next) = {
            let state = inner.lock();
            let now = now_unix_ms();
            (
                state.expired(now),
                state.next_deadline().map(|d| d.saturating_sub(now)),
            )
        };
        let mut refused = false;
        for (rule, key) in expired {
            tracing::info!(%rule, %key, "release after: releasing the limit");
            if let Err(error) = inner
                .release(
                    LatchKind::Limit,
                    &rule,
                    Some(&key),
                    "govd (release after)",
                    Fence::Leader,
                )
                .await
            {
                tracing::error!(%rule, %key, error = %crate::error::one_line(&error), "release after: cannot release the limit; retrying");
                refused = true;
            }
        }
        // Re-check at least every minute in case the wall clock jumps; after
        // a refused release, not sooner than `RELEASE_RETRY`.
        let wait = next.map_or(Duration::from_secs(60), |ms| {
            Duration::from_millis(ms.clamp(1, 60_000))
        });
        let wait = if refused {
            wait.max(RELEASE_RETRY)
        } else {
            wait
        };
        tokio::select! {
            () = inner.shutdown.cancelled() => return,
            () = inner.timer.notified() => {}
            () = tokio::time::sleep(wait) => {}
            () = crate::store::leadership_change(&mut leader) => {}
        }
    }
}

/// Keeps the audit log true (`journal`): tries again the records that could
/// not be written, and, on the leader, writes the outcome of intents that
/// have none (at start of each term, and after the grace of young ones).
async fn keep_audit_true(inner: Arc<Inner>) {
    let mut leader = inner.store.leader();
    let mut due = Some(tokio::time::Instant::now());
    loop {
        if *leader.borrow_and_update() && due.is_some_and(|at| at <= tokio::time::Instant::now()) {
            let (old, young) = crate::journal::unanswered(&*inner.store, inner.intent_grace).await;
            for intent in old {
                let outcome = crate::journal::outcome_of(&inner.lock(), intent);
                inner.audit(outcome).await;
            }
            due = young.then(|| tokio::time::Instant::now() + inner.intent_grace);
        }
        inner.pending_audit.flush(&*inner.store).await;
        tokio::select! {
            () = inner.shutdown.cancelled() => return,
            () = tokio::time::sleep(crate::journal::RETRY) => {}
            () = crate::store::leadership_change(&mut leader) => {
                due = due.or(Some(tokio::time::Instant::now()));
            }
        }
    }
}

/// Takes in each write of the shared state by another replica (a write of
/// this one is already reflected: its revision is not newer).
async fn follow_store(inner: Arc<Inner>, mut changes: watch::Receiver<Revision>) {
    loop {
        tokio::select! {
            () = inner.shutdown.cancelled() => return,
            r = changes.changed() => if r.is_err() { return },
        }
        let seen = *changes.borrow_and_update();
        // INVARIANT: a replica does not stay behind a write it heard of:
        // a reload that fails (etcd unreachable) is tried again.
        loop {
            {
                let _write = inner.write_lock.lock().await;
                if seen <= inner.revision.load(Ordering::SeqCst) {
                    break;
                }
                match inner.resync().await {
                    Ok(()) => break,
                    Err(error) => {
                        tracing::error!(error = %miette::Report::new(error), "cannot take in the state another replica wrote; retrying");
                    }
                }
            }
            tokio::select! {
                () = inner.shutdown.cancelled() => return,
                () = tokio::time::sleep(RESYNC_RETRY) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoded::Encoded;
    use crate::state::AgentTx;

    /// Issue 35: a send to a queue with room happens at once, without a
    /// waiting future per agent; messages for a full queue wait (bounded)
    /// and reach their stream in the order they were queued, later ones
    /// for the same stream included, while the other streams get theirs.
    #[tokio::test(start_paused = true)]
    async fn sends_to_a_full_queue_wait_in_order_and_the_others_go_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cp =
            ControlPlane::open(Options::new(dir.path()), CancellationToken::new()).expect("open");
        let (slow, mut slow_rx) = tokio::sync::mpsc::channel(1);
        let (fast, mut fast_rx) = tokio::sync::mpsc::channel(8);
        let push = |tx: &AgentTx, conn: u64, nonce: &str| Outgoing {
            key: ("order".into(), format!("i{conn}")),
            conn,
            tx: tx.clone(),
            msg: Encoded::config(&bytes::Bytes::new(), nonce),
        };
        let outbox = vec![
            push(&slow, 1, "a"),
            push(&slow, 1, "b"),
            push(&fast, 2, "c"),
            push(&slow, 1, "d"),
        ];
        let inner = cp.inner.clone();
        let sending = tokio::spawn(async move { inner.send(outbox).await });
        tokio::task::yield_now().await;
        let nonce = |m: Option<Box<Encoded>>| m.expect("a message").nonce().map(str::to_owned);
        assert_eq!(nonce(fast_rx.try_recv().ok()).as_deref(), Some("c"));
        assert!(!sending.is_finished(), "b and d wait for room");
        for expected in ["a", "b", "d"] {
            assert_eq!(nonce(slow_rx.recv().await).as_deref(), Some(expected));
        }
        sending.await.expect("send");
    }

    /// An idle govd on a state directory sleeps: on paused time the clock
    /// only moves when every task waits, so an hour passes at once unless a
    /// loop is always ready. A spinning loop never lets it move, and the
    /// guard below turns that hang into a failure.
    #[test]
    fn an_idle_control_plane_lets_time_pass() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let dir = tempfile::tempdir().expect("tempdir");
                let shutdown = CancellationToken::new();
                let _govd =
                    ControlPlane::open(Options::new(dir.path()), shutdown.clone()).expect("open");
                tokio::time::sleep(Duration::from_secs(3600)).await;
                shutdown.cancel();
            });
            let _ = done.send(());
        });
        finished.recv_timeout(Duration::from_secs(60)).expect(
            "an idle govd kept the paused clock from moving: one of its loops never sleeps",
        );
    }
}
