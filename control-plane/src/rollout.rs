//! A canary apply's end: promoted when its window ends clean, rolled back
//! on its own when a threshold is crossed (or an instance on trial refuses
//! the version), or ended by an operator (`govc canary abort`, `govc canary
//! promote`). The start is an apply (`apply.rs`); the decision is
//! `canary.rs`; the canary itself lives in the state (`state/canary.rs`).
//!
//! Each end is written as every operator action is: the intent in the
//! audit log, then the state without the canary (and, promoted, with its
//! policy in force) conditioned on the stored revision, and only then the
//! change in memory and the pushes to the agents; then the outcome in the
//! audit log. A refused write ends nothing: the canary goes on and the
//! watcher tries again.

use std::sync::Arc;
use std::time::Duration;

use gov_proto::v1 as pb;

use crate::canary::{CanaryError, Decision, decide};
use crate::change::{Change, Recheck};
use crate::control_plane::Inner;
use crate::convert::now_unix_ms;
use crate::state::{Outbox, State};
use crate::store::{AuditEntry, Fence};

/// How often the watcher compares a running canary's outcomes (agents
/// report their stats about once per second).
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// How soon the watcher tries again an end it could not record.
const END_RETRY: Duration = Duration::from_secs(5);

/// How a canary ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Its version goes to every instance (the window ended clean, or an
    /// operator said so).
    Promote,
    /// A threshold was crossed: its instances get the version in force.
    Rollback,
    /// An operator ended it: its instances get the version in force.
    Abort,
}

impl End {
    /// Its audit action.
    pub fn action(self) -> &'static str {
        match self {
            End::Promote => "canary-promote",
            End::Rollback => "canary-rollback",
            End::Abort => "canary-abort",
        }
    }

    /// Its word in a `CanaryView.state`.
    pub fn word(self) -> &'static str {
        match self {
            End::Promote => "promoted",
            End::Rollback => "rolled back",
            End::Abort => "aborted",
        }
    }
}

impl Inner {
    /// Ends the canary running (of `version`, when named), recorded as
    /// `who` did it for `why`: see the module doc. Returns the canary as it
    /// ended.
    pub(crate) async fn end_canary(
        &self,
        end: End,
        version: Option<&str>,
        who: &str,
        why: &str,
        fence: Fence,
    ) -> Result<pb::CanaryView, CanaryError> {
        // Not while an apply is being written: it plans against the state.
        let _apply = self.apply_lock.lock().await;
        let write = self.write_lock.lock().await;
        let running = |state: &State| {
            state
                .canary()
                .filter(|c| version.is_none_or(|v| v == c.version()))
                .map(|c| c.view())
        };
        let mut view = running(&self.lock()).ok_or(CanaryError::NotRunning)?;
        let entry = AuditEntry {
            at_unix_ms: now_unix_ms(),
            who: who.to_owned(),
            action: end.action().into(),
            version: view.version.clone(),
            targets: if end == End::Promote {
                view.services.clone()
            } else {
                view.instances.clone()
            },
            detail: why.to_owned(),
            ..AuditEntry::default()
        };
        let promote = end == End::Promote;
        let history = self.history;
        let change = Change {
            audit: Some(entry),
            fence,
            next: |s: &State| s.persisted_ending_canary(promote, history),
            // Another replica ended it first: nothing left to do.
            recheck: |s: &State| match running(s) {
                Some(_) => Recheck::Again,
                None => Recheck::Refused(CanaryError::NotRunning),
            },
            commit: |s: &mut State, out: &mut Outbox| s.end_canary(promote, history, out),
            audit_failed: CanaryError::Audit,
            store_failed: CanaryError::Store,
        };
        self.transact(write, change).await?;
        end.word().clone_into(&mut view.state);
        why.clone_into(&mut view.reason);
        tracing::info!(version = %view.version, who, why, "canary {}", end.word());
        self.bump_sync();
        Ok(view)
    }

    /// Watches the running canary (on the elected leader): rolls it back
    /// as soon as its outcomes cross a threshold or an instance on trial
    /// refuses its version, and promotes it when its window ends. The
    /// window is kept as a wall-clock end (it survives a restart) and
    /// waited for on `tokio::time`.
    pub(crate) async fn watch_canary(self: Arc<Self>) {
        let mut leader = self.store.leader();
        // The canary watched and when its window ends on `tokio::time`.
        let mut watched: Option<(String, tokio::time::Instant)> = None;
        loop {
            while !*leader.borrow_and_update() {
                tokio::select! {
                    () = self.shutdown.cancelled() => return,
                    r = leader.changed() => if r.is_err() { return },
                }
            }
            let mut wait = None;
            let step = {
                let state = self.lock();
                state.canary().map(|c| {
                    let version = c.version().to_owned();
                    let ends = match &watched {
                        Some((v, ends)) if *v == version => *ends,
                        _ => {
                            let left = c.stored().ends_unix_ms.saturating_sub(now_unix_ms());
                            tokio::time::Instant::now() + Duration::from_millis(left)
                        }
                    };
                    let over = tokio::time::Instant::now() >= ends;
                    let decision = match c.refused(state.agents()) {
                        Some(why) => Decision::Rollback(why),
                        None => decide(&c.stored().spec, &c.rules(), over),
                    };
                    (version, ends, decision)
                })
            };
            watched = step.as_ref().map(|(v, ends, _)| (v.clone(), *ends));
            if let Some((version, ends, decision)) = step {
                let end = match decision {
                    Decision::Continue => None,
                    Decision::Promote(why) => Some((End::Promote, why)),
                    Decision::Rollback(why) => Some((End::Rollback, why)),
                };
                let mut refused = false;
                if let Some((end, why)) = end {
                    let ended = self
                        .end_canary(end, Some(&version), "govd (canary)", &why, Fence::Leader)
                        .await;
                    if let Err(error) = ended
                        && !matches!(error, CanaryError::NotRunning)
                    {
                        tracing::error!(error = %crate::error::one_line(&error), "cannot end the canary; retrying");
                        refused = true;
                    }
                }
                // Never sooner than the next check once the window is over:
                // the loop always sleeps.
                let now = tokio::time::Instant::now();
                wait = Some(if refused {
                    now + END_RETRY
                } else if ends > now {
                    (now + CHECK_EVERY).min(ends)
                } else {
                    now + CHECK_EVERY
                });
            }
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = self.canary.notified() => {}
                () = sleep_until(wait) => {}
                () = crate::store::leadership_change(&mut leader) => {}
            }
        }
    }
}

/// An operator's `Canary` call (authenticated by `server.rs`): ends the
/// canary running, even if the client goes away meanwhile.
pub(crate) async fn by_operator(
    inner: Arc<Inner>,
    request: pb::CanaryRequest,
    who: String,
) -> Result<tonic::Response<pb::CanaryResult>, tonic::Status> {
    let end = match pb::CanaryAction::try_from(request.action) {
        Ok(pb::CanaryAction::Abort) => End::Abort,
        Ok(pb::CanaryAction::Promote) => End::Promote,
        Err(_) => {
            return Err(tonic::Status::invalid_argument(format!(
                "unknown canary action {}",
                request.action
            )));
        }
    };
    let why = if request.reason.trim().is_empty() {
        format!("{} by an operator", end.word())
    } else {
        request.reason.trim().to_owned()
    };
    let view =
        tokio::spawn(async move { inner.end_canary(end, None, &who, &why, Fence::Any).await })
            .await
            .map_err(|e| tonic::Status::internal(format!("the canary's end failed: {e}")))?
            .map_err(|e| canary_status(&e))?;
    let message = format!(
        "canary of version {} {}: {} instance(s) {}",
        view.version,
        view.state,
        view.instances.len(),
        if view.state == End::Promote.word() {
            format!(
                "were on trial; every instance of {} gets it",
                view.services.join(", ")
            )
        } else {
            format!("go back to version {}", view.previous_version)
        }
    );
    Ok(tonic::Response::new(pb::CanaryResult {
        message,
        canary: Some(view),
    }))
}

/// A canary error as the client reads it.
pub(crate) fn canary_status(error: &CanaryError) -> tonic::Status {
    let message = crate::error::one_line(error);
    match error {
        CanaryError::Share(_) | CanaryError::Window(_) | CanaryError::Threshold { .. } => {
            tonic::Status::invalid_argument(message)
        }
        CanaryError::NotRunning => tonic::Status::not_found(message),
        CanaryError::Audit(_) | CanaryError::Store(_) => {
            tonic::Status::failed_precondition(message)
        }
    }
}

/// Sleeps until `at`; forever without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gov_proto::v1 as pb;
    use pb::agent_message::Msg as AgentMsg;
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;

    use crate::apply::ApplyRequest;
    use crate::control_plane::{ControlPlane, Options};
    use crate::state::AgentKey;
    use crate::store::{CanarySpec, DirStore, Source};

    fn request(max: u32, canary: Option<CanarySpec>) -> ApplyRequest {
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
            canary,
            wait: Duration::ZERO,
        }
    }

    const TEN_SECONDS: CanarySpec = CanarySpec {
        share_percent: 50,
        window_ms: 10_000,
        max_reject_ratio: 0.05,
        max_error_ratio: 0.05,
        min_calls: 10,
    };

    /// A govd on `dir` with agents `order/a` and `order/b` connected (their
    /// streams' receivers kept open) and version 1 applied.
    async fn two_agents(
        dir: &std::path::Path,
        shutdown: CancellationToken,
    ) -> (
        ControlPlane,
        Vec<(AgentKey, u64)>,
        Vec<mpsc::Receiver<Box<crate::encoded::Encoded>>>,
    ) {
        let cp = ControlPlane::open(Options::new(dir), shutdown).unwrap();
        let mut keys = Vec::new();
        let mut streams = Vec::new();
        for instance in ["a", "b"] {
            let (tx, rx) = mpsc::channel(64);
            let hello = pb::Hello {
                service: "order".into(),
                instance: instance.into(),
                ..Default::default()
            };
            keys.push(cp.inner.lock().hello(hello, tx, 1, &mut Vec::new()));
            streams.push(rx);
        }
        assert!(cp.apply(request(100, None)).await.unwrap().applied);
        (cp, keys, streams)
    }

    /// `key` reports `admitted` and `rejected` calls of `order/b` so far,
    /// under the version it was last sent.
    fn report(cp: &ControlPlane, (key, id): &(AgentKey, u64), admitted: u64, rejected: u64) {
        let mut state = cp.inner.lock();
        let version = state.agent(key).unwrap().version().to_owned();
        let stats = pb::Stats {
            version,
            rules: vec![pb::RuleStats {
                rule: "order/b".into(),
                admitted,
                rejected: Some(pb::Rejections {
                    bulkhead_full: rejected,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        state.on_message(key, *id, AgentMsg::Stats(stats), 1);
    }

    fn actions(dir: &std::path::Path) -> Vec<(String, String)> {
        DirStore::open(dir)
            .unwrap()
            .read_audit()
            .unwrap()
            .into_iter()
            .map(|e| (e.action, e.who))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_clean_canary_is_promoted_when_its_window_ends_and_not_before() {
        let dir = tempfile::tempdir().unwrap();
        let (cp, keys, _streams) = two_agents(dir.path(), CancellationToken::new()).await;
        let v1 = cp.status().version;
        let started = cp.apply(request(50, Some(TEN_SECONDS))).await.unwrap();
        let canary = started.canary.expect("a canary started");
        assert_eq!(canary.instances, ["order/a"]);
        // Calls on both sides, the canary no worse than the others.
        for (n, key) in keys.iter().enumerate() {
            report(&cp, key, 10, 0);
            report(&cp, key, 60 + n as u64, 1);
        }
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(cp.inner.lock().canary().is_some(), "still in its window");
        assert_eq!(cp.status().version, v1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(cp.inner.lock().canary().is_none(), "promoted");
        assert_eq!(cp.status().version, canary.version);
        let stored = DirStore::open(dir.path()).unwrap().load().unwrap();
        assert!(stored.canary.is_none());
        assert_eq!(stored.applied.unwrap().version, canary.version);
        let acts = actions(dir.path());
        assert_eq!(
            acts[acts.len() - 2..],
            [
                ("canary-promote-intended".into(), "govd (canary)".into()),
                ("canary-promote".into(), "govd (canary)".into())
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_canary_that_rejects_more_is_rolled_back_within_its_window() {
        let dir = tempfile::tempdir().unwrap();
        let (cp, keys, _streams) = two_agents(dir.path(), CancellationToken::new()).await;
        let v1 = cp.status().version;
        cp.apply(request(50, Some(TEN_SECONDS))).await.unwrap();
        // The canary rejects 20% more of its calls than the other instance.
        report(&cp, &keys[0], 0, 0);
        report(&cp, &keys[1], 0, 0);
        report(&cp, &keys[0], 80, 20);
        report(&cp, &keys[1], 100, 0);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(cp.inner.lock().canary().is_none(), "rolled back");
        assert_eq!(cp.status().version, v1, "the version in force stays");
        let view = cp.status();
        let a = view.agents.iter().find(|a| a.instance == "a").unwrap();
        assert_eq!(
            a.version,
            cp.inner.lock().current_version("order").unwrap(),
            "sent the version in force again"
        );
        let acts = actions(dir.path());
        assert_eq!(acts.last().unwrap().0, "canary-rollback");
        let stored = DirStore::open(dir.path()).unwrap().load().unwrap();
        assert!(stored.canary.is_none());
        assert_eq!(stored.applied.unwrap().version, v1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_canary_survives_a_restart_with_its_instances_and_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let shutdown = CancellationToken::new();
        let (cp, _keys, _streams) = two_agents(dir.path(), shutdown.clone()).await;
        let started = cp.apply(request(50, Some(TEN_SECONDS))).await.unwrap();
        let version = started.canary.unwrap().version;
        drop(cp);
        // A second govd on the same directory (the first one's tasks stop
        // with its token) takes the canary up where it was.
        shutdown.cancel();
        let cp = ControlPlane::open(Options::new(dir.path()), CancellationToken::new()).unwrap();
        let canary = cp.status().canary.expect("kept");
        assert_eq!(
            (canary.version.as_str(), canary.instances.as_slice()),
            (version.as_str(), ["order/a".to_owned()].as_slice())
        );
        let (tx, _rx) = mpsc::channel(8);
        let hello = pb::Hello {
            service: "order".into(),
            instance: "a".into(),
            ..Default::default()
        };
        let mut out = Vec::new();
        cp.inner.lock().hello(hello, tx, 1, &mut out);
        let pushed: Vec<String> = out
            .iter()
            .filter_map(|o| match &o.msg.message().msg {
                Some(pb::control_message::Msg::Config(c)) => {
                    c.target.as_ref().map(|t| t.version.clone())
                }
                _ => None,
            })
            .collect();
        let trial = cp
            .inner
            .lock()
            .version_for(&("order".into(), "a".into()))
            .unwrap();
        assert_eq!(
            pushed,
            [trial],
            "the instance on trial gets the version on trial again"
        );
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(cp.status().version, version, "promoted at the stored end");
    }
}
