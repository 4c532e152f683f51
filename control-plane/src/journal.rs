//! What keeps the audit log true: records that could not be written are
//! written later, and every intent gets its outcome.
//!
//! An operator's action is audited as an intent before it takes effect and
//! as its outcome once that is stored (`audit.rs`). Two things can leave the
//! log short of the truth: a record whose append failed (the audit log
//! unwritable for a moment, etcd unreachable), and an intent whose outcome
//! was never written (govd stopped between the two). The first are kept in
//! memory, in order, and tried again until they are written ([`Pending`]);
//! the second are found by reading the newest records ([`unanswered`]) and
//! answered from what the state says ([`outcome_of`]): an apply is `apply` if its version
//! is in force or in the history, else `apply-refused`; a release is
//! `release` if the latch is gone, else `release-refused`; a canary's
//! start if it runs or its version was applied, its promotion if its version
//! was applied, its rollback or abort if it no longer runs and its version
//! is not in force.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::audit::{AuditEntry, Query, intended};
use crate::convert::now_unix_ms;
use crate::latch::LatchKind;
use crate::state::State;
use crate::store::Store;

/// How often records that could not be written are tried again.
pub(crate) const RETRY: Duration = Duration::from_secs(5);
/// By default, an intent younger than this may still be in progress (on
/// this replica or another): its outcome is left to the writer
/// (`--audit-intent-grace`).
pub(crate) const GRACE: Duration = Duration::from_secs(120);
/// How many of the newest records are read for intents without an outcome.
const WINDOW: usize = 5_000;

/// Audit records not written yet, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Pending(Mutex<Vec<AuditEntry>>);

impl Pending {
    fn push(&self, entry: AuditEntry) {
        if let Ok(mut pending) = self.0.lock() {
            pending.push(entry);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.0.lock().map_or(0, |p| p.len())
    }

    fn take(&self) -> Vec<AuditEntry> {
        self.0
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }

    /// Puts back what is still not written, before anything pushed since.
    fn put_back(&self, mut left: Vec<AuditEntry>) {
        if let Ok(mut pending) = self.0.lock() {
            left.append(&mut pending);
            *pending = left;
        }
    }

    /// Appends `entry` to `store`'s audit log after the records already
    /// waiting; one that cannot be written now is kept to try again.
    pub(crate) async fn write(&self, store: &dyn Store, entry: AuditEntry) {
        if self.len() > 0 {
            self.push(entry);
            self.flush(store).await;
            return;
        }
        if let Err(error) = store.audit(&entry).await {
            tracing::error!(error = %miette::Report::new(error), "cannot write the audit log; keeping the record to try again");
            self.push(entry);
        }
    }

    /// Tries the records not written yet again, in order; stops at the
    /// first that still fails (order matters: an outcome after its intent).
    pub(crate) async fn flush(&self, store: &dyn Store) {
        let mut left = self.take();
        if left.is_empty() {
            return;
        }
        let mut written = 0;
        for entry in &left {
            if let Err(error) = store.audit(entry).await {
                tracing::warn!(error = %crate::error::one_line(&error), pending = left.len() - written, "the audit log still cannot be written; retrying");
                break;
            }
            written += 1;
        }
        if written > 0 {
            tracing::info!(
                records = written,
                "wrote audit records that could not be written before"
            );
        }
        self.put_back(left.split_off(written));
    }
}

/// The intents among the newest records of `store` that have no outcome
/// and are older than `grace`, oldest first, and whether younger ones
/// were left (to look at again after `grace`).
pub(crate) async fn unanswered(store: &dyn Store, grace: Duration) -> (Vec<AuditEntry>, bool) {
    let page = match store
        .audit_page(Query {
            limit: WINDOW,
            ..Query::default()
        })
        .await
    {
        Ok(page) => page,
        Err(error) => {
            tracing::warn!(error = %crate::error::one_line(&error), "cannot read the audit log for intents without an outcome");
            return (Vec::new(), true);
        }
    };
    let mut open: HashMap<String, AuditEntry> = HashMap::new();
    for (_, record) in page.records {
        if record.intent.is_empty() {
            continue;
        }
        if intended(&record.action).is_some() {
            open.insert(record.intent.clone(), record);
        } else {
            open.remove(&record.intent);
        }
    }
    let now = now_unix_ms();
    let grace = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
    let (old, young): (Vec<AuditEntry>, Vec<AuditEntry>) = open
        .into_values()
        .partition(|i| now.saturating_sub(i.at_unix_ms) >= grace);
    let mut old = old;
    old.sort_by_key(|e| e.at_unix_ms);
    (old, !young.is_empty())
}

/// The outcome of `intent` as `state` tells it: an apply took effect if
/// its version is in force or in the history; a release if the latch is
/// gone.
pub(crate) fn outcome_of(state: &State, mut intent: AuditEntry) -> AuditEntry {
    let (took_effect, action) = match intended(&intent.action) {
        Some("apply") => (
            state.version() == intent.version || state.in_history(&intent.version),
            "apply",
        ),
        Some("release") => {
            let kind = if intent.kind == LatchKind::Limit.as_str() {
                LatchKind::Limit
            } else {
                LatchKind::Fuse
            };
            let latched = state.latches().any(|t| {
                t.kind == kind
                    && t.rule == intent.rule
                    && (intent.key.is_empty() || t.key == intent.key)
            });
            (!latched, "release")
        }
        // A canary started if it runs or ran (its version is in force or
        // kept, or it was rolled back: then the rollback says so itself).
        Some("canary-start") => (
            state
                .canary()
                .is_some_and(|c| c.version() == intent.version)
                || state.version() == intent.version
                || state.in_history(&intent.version),
            "canary-start",
        ),
        Some("canary-promote") => (
            state.version() == intent.version || state.in_history(&intent.version),
            "canary-promote",
        ),
        Some(end @ ("canary-rollback" | "canary-abort")) => (
            state.canary().is_none_or(|c| c.version() != intent.version)
                && state.version() != intent.version,
            if end == "canary-rollback" {
                "canary-rollback"
            } else {
                "canary-abort"
            },
        ),
        _ => (false, "unknown"),
    };
    intent.at_unix_ms = now_unix_ms();
    if took_effect {
        intent.action = action.into();
        intent.detail =
            "recorded afterwards: it took effect, and govd stopped before it recorded so".into();
    } else {
        intent.action = format!("{action}-refused");
        intent.detail =
            "recorded afterwards: it did not take effect (govd stopped before it was stored)"
                .into();
    }
    tracing::info!(action = %intent.action, intent = %intent.intent, "wrote the outcome of an intent whose outcome was not recorded");
    intent
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use crate::apply::ApplyRequest;
    use crate::audit::AuditEntry;
    use crate::control_plane::{ControlPlane, Options};
    use crate::store::{DirStore, Source};

    fn apply_request(max: u32) -> ApplyRequest {
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
            wait: Duration::ZERO,
        }
    }

    fn intent(version: &str, id: &str) -> AuditEntry {
        AuditEntry {
            at_unix_ms: 1,
            who: "alice".into(),
            action: "apply-intended".into(),
            intent: id.into(),
            version: version.into(),
            ..AuditEntry::default()
        }
    }

    /// (action, intent) of each record, oldest first.
    fn log(dir: &std::path::Path) -> Vec<(String, String)> {
        DirStore::open(dir)
            .unwrap()
            .read_audit()
            .unwrap()
            .into_iter()
            .map(|e| (e.action, e.intent))
            .collect()
    }

    /// Two intents whose outcome govd never wrote (it stopped between the
    /// two): at the next start, one whose version is in force becomes
    /// `apply`, one that never took effect `apply-refused`, once each.
    #[tokio::test]
    async fn an_intent_without_an_outcome_gets_the_one_the_state_tells_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let version = {
            let cp = ControlPlane::open(Options::new(dir.path()), stop.clone()).unwrap();
            let applied = cp.apply(apply_request(1)).await.unwrap();
            stop.cancel();
            applied.version
        };
        let store = DirStore::open(dir.path()).unwrap();
        crate::store::Store::audit(&store, &intent(&version, "in-force"))
            .await
            .unwrap();
        crate::store::Store::audit(&store, &intent("0123456789abcdef", "never"))
            .await
            .unwrap();

        let stop = CancellationToken::new();
        let _cp = ControlPlane::open(Options::new(dir.path()), stop.clone()).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while log(dir.path()).len() < 6 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let records = log(dir.path());
        let outcomes: Vec<&(String, String)> = records.iter().skip(4).collect();
        assert_eq!(outcomes.len(), 2, "{records:?}");
        assert!(
            outcomes.contains(&&("apply".to_owned(), "in-force".to_owned())),
            "{records:?}"
        );
        assert!(
            outcomes.contains(&&("apply-refused".to_owned(), "never".to_owned())),
            "{records:?}"
        );
        // Answered once: another start finds nothing to answer.
        stop.cancel();
        let stop = CancellationToken::new();
        let _cp = ControlPlane::open(Options::new(dir.path()), stop.clone()).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(log(dir.path()).len(), 6);
        stop.cancel();
    }

    /// A record that cannot be written (the audit log unwritable) is kept
    /// and written, in order, once the log takes writes again.
    #[tokio::test(start_paused = true)]
    async fn a_record_that_cannot_be_written_is_written_once_the_log_takes_writes() {
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let cp = ControlPlane::open(Options::new(dir.path()), stop.clone()).unwrap();
        let audit_path = DirStore::open(dir.path()).unwrap().audit_path();
        // The log cannot be opened for appending.
        std::fs::create_dir(&audit_path).unwrap();
        let trip = |rule: &str| AuditEntry {
            at_unix_ms: 5,
            who: "agent order/order-1".into(),
            action: "trip".into(),
            rule: rule.into(),
            ..AuditEntry::default()
        };
        cp.inner.audit(trip("order/a")).await;
        cp.inner.audit(trip("order/b")).await;
        assert_eq!(cp.inner.pending_audit.len(), 2);
        std::fs::remove_dir(&audit_path).unwrap();
        tokio::time::sleep(super::RETRY * 2).await;
        assert_eq!(cp.inner.pending_audit.len(), 0);
        let rules: Vec<String> = DirStore::open(dir.path())
            .unwrap()
            .read_audit()
            .unwrap()
            .into_iter()
            .map(|e| e.rule)
            .collect();
        assert_eq!(rules, ["order/a", "order/b"]);
        stop.cancel();
    }
}
