//! The two background tasks whose cost grows with the number of agents,
//! written so that an ACK never costs a walk of every agent:
//!
//! - the view publisher: the `ClusterView` (O(agents) to build) is built
//!   only while someone watches it (a `Watch` stream, the demo, the TUI;
//!   `Status` and `/metrics` build their own when asked), gathering every
//!   change of at least `VIEW_COALESCE` and of ten times the last build's
//!   time into one build, so that building views takes at most about a
//!   tenth of a core however many agents there are;
//! - the agent-registry writer: after a sync change, the records of the
//!   agents that changed (`State::take_agent_changes`), appended to the
//!   directory's journal, or written to their own keys in etcd (an ACK its
//!   agent's version key).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gov_proto::v1 as pb;
use tokio::sync::watch;

use crate::control_plane::Inner;
use crate::error::Error;

/// Stats-only changes publish a new view at most this often.
pub(crate) const STATS_PERIOD: Duration = Duration::from_secs(1);
/// Other changes publish a new view this soon at the earliest, gathering
/// whatever else changes meanwhile: an apply to N agents is N ACKs, and one
/// O(N) view per ACK would make it O(N^2).
const VIEW_COALESCE: Duration = Duration::from_millis(50);
/// At most this long between a change and its view.
const MAX_COALESCE: Duration = Duration::from_secs(1);
/// The gather time is this many times the last build's.
const BUILD_SHARE: u32 = 10;
/// Debounce of agent-registry writes.
const PERSIST_DEBOUNCE: Duration = Duration::from_millis(250);

impl Inner {
    /// A receiver of the published view, which is brought up to date first
    /// when it fell behind while nobody watched.
    pub(crate) fn subscribe_view(&self) -> watch::Receiver<Arc<pb::ClusterView>> {
        let receiver = self.view.subscribe();
        if self.view_stale.swap(false, Ordering::SeqCst) {
            self.view.send_replace(Arc::new(self.view_now()));
        }
        receiver
    }

    /// Writes the agent records changed since the last write, apart from
    /// the shared state (the directory's journal, etcd's key per agent) or
    /// with it. Records that could not be written are written next time.
    pub(crate) async fn persist_agents(&self) -> Result<(), Error> {
        {
            // Journal writes in the order their records were taken.
            let _write = self.write_lock.lock().await;
            let changes = self.lock().take_agent_changes();
            if changes.is_empty() {
                return Ok(());
            }
            let all = || -> Vec<crate::store::KnownAgent> {
                self.lock()
                    .agents()
                    .map(crate::state::Agent::record)
                    .collect()
            };
            if let Some(write) = self.store.append_agents(&changes, &all) {
                let written = write.await;
                if written.is_err() {
                    self.lock().restore_agent_changes(&changes);
                }
                return written;
            }
        }
        self.persist().await
    }
}

impl Inner {
    /// Publishes the view after changes (see the module doc), and the version
    /// in force whenever it changed (what the expiry task wakes on).
    pub(crate) async fn publish_views(self: Arc<Self>) {
        let inner = self;
        let mut tick = tokio::time::interval(STATS_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut coalesce = VIEW_COALESCE;
        loop {
            tokio::select! {
                () = inner.shutdown.cancelled() => return,
                () = inner.changed_view.notified() => {
                    tokio::select! {
                        () = inner.shutdown.cancelled() => return,
                        () = tokio::time::sleep(coalesce) => {}
                    }
                }
                _ = tick.tick() => {
                    // Remaining times of limits and fuses tick down too.
                    let any_latch = inner.lock().latches().next().is_some();
                    if !inner.stats_dirty.swap(false, Ordering::Relaxed) && !any_latch {
                        continue;
                    }
                }
            }
            let version = inner.lock().version().to_owned();
            inner.policy_version.send_if_modified(|v| {
                let changed = *v != version;
                *v = version;
                changed
            });
            // Marked first: a watcher that subscribes after the count below
            // finds it set and builds the view itself.
            inner.view_stale.store(true, Ordering::SeqCst);
            if inner.view.receiver_count() == 0 {
                continue;
            }
            inner.view_stale.store(false, Ordering::SeqCst);
            let started = tokio::time::Instant::now();
            let view = inner.view_now();
            inner.view.send_replace(Arc::new(view));
            coalesce = (started.elapsed() * BUILD_SHARE).clamp(VIEW_COALESCE, MAX_COALESCE);
        }
    }

    /// Writes the agent registry shortly after it changes.
    pub(crate) async fn persist_agents_soon(self: Arc<Self>) {
        let inner = self;
        loop {
            tokio::select! {
                () = inner.shutdown.cancelled() => return,
                () = inner.persist_soon.notified() => {}
            }
            tokio::time::sleep(PERSIST_DEBOUNCE).await;
            if let Err(error) = inner.persist_agents().await {
                tracing::error!(error = %miette::Report::new(error), "cannot write the agent registry");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::control_plane::{ControlPlane, Options};

    fn connect(cp: &ControlPlane, instance: &str) {
        let (tx, rx) = mpsc::channel(8);
        std::mem::forget(rx);
        let hello = pb::Hello {
            service: "order".into(),
            instance: instance.into(),
            ..Default::default()
        };
        cp.inner.lock().hello(hello, tx, 1, &mut Vec::new());
        cp.inner.changed();
    }

    /// Issue 35: with nobody watching, changes build no view (an apply's N
    /// ACKs cost no O(N) rebuilds); a watcher that comes later gets the
    /// view as it is now, and is sent the views of later changes.
    #[tokio::test(start_paused = true)]
    async fn no_view_is_built_while_nobody_watches_and_a_new_watcher_gets_it_current() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shutdown = CancellationToken::new();
        let cp = ControlPlane::open(Options::new(dir.path()), shutdown.clone()).expect("open");
        connect(&cp, "a");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            cp.inner.view.borrow().agents.is_empty(),
            "a view was built with nobody watching"
        );
        let mut view = cp.watch();
        assert_eq!(view.borrow_and_update().agents.len(), 1);
        connect(&cp, "b");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(view.has_changed().expect("open"));
        assert_eq!(view.borrow_and_update().agents.len(), 2);
        shutdown.cancel();
    }
}
