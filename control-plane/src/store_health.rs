//! The health of govd's store as this replica sees it, for `govc status`'s
//! `Store:` line, the TUI's header and `/metrics`. [`Tracked`] wraps the
//! store and records the outcome of its calls: every write of the state
//! (the directory: a read-only or full disk shows at the first write that
//! fails), and on etcd every call, since each one needs the quorum. On
//! etcd, [`watch`] also reads the leader key every [`PROBE_PERIOD`], so a
//! replica cut off from the majority says so before an apply finds out.

use std::sync::Arc;
use std::time::Duration;

use gov_proto::v1 as pb;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::audit::{Page, Query};
use crate::convert::now_unix_ms;
use crate::error::Error;
use crate::store::{
    AuditEntry, Fence, KnownAgent, Loaded, Persisted, Revision, Store, StoreFuture,
};

/// How often a shared store (etcd) is probed: cheap (one linearizable read
/// of a small key, bounded by the store's own probe timeout), and a lost
/// quorum shows within about two periods.
pub(crate) const PROBE_PERIOD: Duration = Duration::from_secs(2);

/// What this replica knows of its store.
#[derive(Debug)]
pub(crate) struct Health {
    /// etcd: every call needs the quorum, and the store is probed.
    shared: bool,
    record: std::sync::Mutex<Record>,
    /// Whether the store is writable changed, or a new failure: publish a
    /// view.
    changed: Notify,
}

/// The outcomes recorded (Unix ms; 0: not since this govd started).
#[derive(Debug)]
struct Record {
    writable: bool,
    failing_since: u64,
    last_error: String,
    last_error_at: u64,
    last_write: u64,
    quorum: u64,
    leader_name: String,
}

/// What a recorded call was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    /// A write of the state (or the agent registry).
    Write,
    /// Anything else: a read, an audit record, a probe.
    Other,
}

/// The store with its [`Health`] recorded on every call.
pub(crate) struct Tracked {
    store: Arc<dyn Store>,
    health: Arc<Health>,
}

// === impl Health ===

impl Health {
    fn new(shared: bool) -> Self {
        Self {
            shared,
            record: std::sync::Mutex::new(Record {
                writable: true,
                failing_since: 0,
                last_error: String::new(),
                last_error_at: 0,
                last_write: 0,
                quorum: 0,
                leader_name: String::new(),
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the outcome of one call of the store.
    fn observe<T>(&self, call: Call, result: &Result<T, Error>) {
        let now = now_unix_ms();
        let mut r = self.lock();
        let was = r.writable;
        match result {
            Err(error @ (Error::Etcd { .. } | Error::Io(_)))
                if self.shared || call == Call::Write =>
            {
                if r.writable {
                    r.failing_since = now;
                }
                r.writable = false;
                r.last_error = chain(error);
                r.last_error_at = now;
                drop(r);
                self.changed.notify_one();
                return;
            }
            // The directory is known by its writes only.
            _ if !self.shared && call == Call::Other => return,
            // Answered (a conflict or a refusal is an answer too).
            result => {
                if result.is_ok() && call == Call::Write {
                    r.last_write = now;
                }
                if self.shared {
                    r.quorum = now;
                }
                r.writable = true;
                r.failing_since = 0;
            }
        }
        drop(r);
        if !was {
            self.changed.notify_one();
        }
    }

    /// The health as the view shows it.
    pub(crate) fn view(&self, store: &dyn Store) -> pb::StoreHealth {
        let leader = *store.leader().borrow();
        let r = self.lock();
        let kind = if self.shared { "" } else { "directory " };
        pb::StoreHealth {
            store: format!("{kind}{}", store.describe()),
            writable: r.writable,
            failing_since_unix_ms: r.failing_since,
            last_error: r.last_error.clone(),
            last_error_unix_ms: r.last_error_at,
            last_write_unix_ms: r.last_write,
            quorum_unix_ms: r.quorum,
            leader,
            leader_name: r.leader_name.clone(),
        }
    }
}

/// `error` and its causes on one line, without the help.
fn chain(error: &Error) -> String {
    let mut line = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}

// === impl Tracked ===

impl Tracked {
    /// `store`, recorded; a store with something to probe (etcd) is shared.
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        let shared = store.probe().is_some();
        Self {
            store,
            health: Arc::new(Health::new(shared)),
        }
    }

    pub(crate) fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// Runs `call`, recording its outcome.
    fn tracked<'a, T: Send + 'a>(
        &'a self,
        what: Call,
        call: StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let result = call.await;
            self.health.observe(what, &result);
            result
        })
    }
}

impl Store for Tracked {
    fn describe(&self) -> String {
        self.store.describe()
    }

    fn load(&self) -> StoreFuture<'_, Loaded> {
        self.tracked(Call::Other, self.store.load())
    }

    fn save<'a>(
        &'a self,
        state: &'a Persisted,
        expected: Revision,
        fence: Fence,
    ) -> StoreFuture<'a, Revision> {
        self.tracked(Call::Write, self.store.save(state, expected, fence))
    }

    fn audit<'a>(&'a self, entry: &'a AuditEntry) -> StoreFuture<'a, ()> {
        self.tracked(Call::Other, self.store.audit(entry))
    }

    fn audit_page(&self, query: Query) -> StoreFuture<'_, Page> {
        self.tracked(Call::Other, self.store.audit_page(query))
    }

    fn append_agents<'a>(
        &'a self,
        changes: &'a crate::store::AgentChanges,
        all: &dyn Fn() -> Vec<KnownAgent>,
    ) -> Option<StoreFuture<'a, ()>> {
        let write = self.store.append_agents(changes, all)?;
        Some(self.tracked(Call::Write, write))
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<Revision>> {
        self.store.changes()
    }

    fn current_revision(&self) -> Option<StoreFuture<'_, Revision>> {
        let read = self.store.current_revision()?;
        Some(self.tracked(Call::Other, read))
    }

    fn leader(&self) -> tokio::sync::watch::Receiver<bool> {
        self.store.leader()
    }

    fn probe(&self) -> Option<StoreFuture<'_, String>> {
        let probe = self.store.probe()?;
        Some(Box::pin(async move {
            let result = probe.await;
            if let Ok(name) = &result {
                name.clone_into(&mut self.health.lock().leader_name);
            }
            self.health.observe(Call::Other, &result);
            result
        }))
    }
}

/// Probes a shared store every [`PROBE_PERIOD`] until `shutdown`, and calls
/// `changed` (publish a view) whenever the store's health changes, and at
/// start: the first view was made without it.
pub(crate) async fn watch(
    store: Arc<dyn Store>,
    health: Arc<Health>,
    shutdown: CancellationToken,
    changed: impl Fn() + Send,
) {
    let mut tick = tokio::time::interval(PROBE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    changed();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = health.changed.notified() => changed(),
            _ = tick.tick(), if health.shared => {
                let Some(probe) = store.probe() else {
                    continue;
                };
                let name = health.lock().leader_name.clone();
                if probe.await.is_ok_and(|now| now != name) {
                    changed();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    use crate::apply::ApplyRequest;
    use crate::control_plane::{ControlPlane, Options};
    use crate::store::Source;

    fn apply(max: u32) -> ApplyRequest {
        ApplyRequest {
            sources: vec![Source {
                name: "p.gov".into(),
                text: format!(
                    "service order {{\n  match all = path prefix \"/\"\n  bulkhead b on all {{\n    max_concurrent {max}\n  }}\n}}\n"
                ),
            }],
            who: "alice".into(),
            dry_run: false,
            shadow: false,
            allow_remove_all: false,
            expect_version: String::new(),
            rollback_to: String::new(),
            canary: None,
            wait: std::time::Duration::ZERO,
        }
    }

    /// A write of `policy.json` that fails (its temp file cannot be created,
    /// as on a read-only or full disk) shows in the view and in `/metrics`
    /// with its error, until a write succeeds again.
    #[tokio::test]
    async fn a_failed_write_of_the_state_directory_shows_in_the_view_until_one_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let cp = ControlPlane::open(Options::new(dir.path()), CancellationToken::new()).unwrap();
        let fresh = cp.status().store.unwrap();
        assert_eq!(
            fresh.store,
            format!("directory {}", dir.path().display()),
            "{fresh:?}"
        );
        assert!(fresh.writable && fresh.leader, "{fresh:?}");
        assert_eq!((fresh.last_write_unix_ms, fresh.quorum_unix_ms), (0, 0));
        cp.apply(apply(1)).await.unwrap();
        let written = cp.status().store.unwrap().last_write_unix_ms;
        assert!(written > 0);

        let blocker = dir
            .path()
            .join(format!(".policy.json.tmp.{}", std::process::id()));
        std::fs::create_dir(&blocker).unwrap();
        assert!(cp.apply(apply(2)).await.is_err());
        let failed = cp.status().store.unwrap();
        assert!(!failed.writable, "{failed:?}");
        assert!(failed.failing_since_unix_ms >= written, "{failed:?}");
        assert_eq!(failed.last_error_unix_ms, failed.failing_since_unix_ms);
        assert!(
            failed.last_error.contains(".policy.json.tmp."),
            "{}",
            failed.last_error
        );
        assert_eq!(failed.last_write_unix_ms, written);
        let metrics = cp.metrics_text();
        assert!(metrics.contains("\ngovd_store_reachable 0\n"), "{metrics}");

        std::fs::remove_dir(&blocker).unwrap();
        cp.apply(apply(3)).await.unwrap();
        let back = cp.status().store.unwrap();
        assert!(back.writable && back.failing_since_unix_ms == 0, "{back:?}");
        assert!(back.last_write_unix_ms >= failed.last_error_unix_ms);
        assert_eq!(
            back.last_error, failed.last_error,
            "the last failure is kept"
        );
        assert!(cp.metrics_text().contains("\ngovd_store_reachable 1\n"));
    }
}
