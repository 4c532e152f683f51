//! The one write protocol of govd's shared state. Every change of it (an
//! apply, a canary's start and end, a release, the latches agents report)
//! is a [`Change`] run by [`Inner::transact`], so its steps are written
//! once:
//!
//! 1. an operator's action: its intent in the audit log (nothing takes
//!    effect unaudited; an intent that cannot be written refuses it);
//! 2. the stored state as the change makes it ([`Change::next`]),
//!    conditioned on the revision this replica's state reflects (and,
//!    fenced, on its leadership); the store writes only the parts that
//!    changed (`store/parts.rs`);
//! 3. when another replica wrote first: what it wrote taken in
//!    (`Inner::resync`), the change looked at again ([`Change::recheck`]:
//!    to write again on top, in the stored state already, or refused), at
//!    most [`WRITE_ATTEMPTS`] times;
//! 4. the change made in memory ([`Change::commit`]), only once stored;
//! 5. the outcome in the audit log: the action, or `ACTION-refused` with
//!    why;
//! 6. what the commit queued sent to the agents; the view, the `release
//!    after` timer and the canary watcher told.
//!
//! The caller takes the write lock, checks what the change needs under it,
//! and hands its guard over: held from the first snapshot to the outcome,
//! so no other writer puts a state without this change in the store in
//! between; released before the sends.

use crate::change::{Change, Recheck, WRITE_ATTEMPTS};
use crate::control_plane::Inner;
use crate::convert::now_unix_ms;
use crate::error::Error;
use crate::state::{Outbox, State};
use crate::store::{Fence, Persisted};

impl Inner {
    /// Runs `change` through the write protocol (see the module doc).
    /// `Ok(None)`: it was in the stored state already. An error: nothing
    /// of it took effect.
    pub(crate) async fn transact<T, E, N, R, C>(
        &self,
        write: tokio::sync::MutexGuard<'_, ()>,
        change: Change<N, R, C, E>,
    ) -> Result<Option<T>, E>
    where
        N: Fn(&State) -> Persisted,
        R: Fn(&State) -> Recheck<E>,
        C: FnOnce(&mut State, &mut Outbox) -> T,
        E: miette::Diagnostic,
    {
        let Change {
            audit,
            fence,
            next,
            recheck,
            commit,
            audit_failed,
            store_failed,
        } = change;
        let mut out = Vec::new();
        let result = {
            // INVARIANT: held from the first snapshot to the commit.
            let _write = write;
            let mut entry = audit;
            let action = entry.as_ref().map(|e| e.action.clone()).unwrap_or_default();
            if let Some(e) = &mut entry {
                e.action = format!("{action}-intended");
                e.intent = crate::audit::new_intent();
                e.at_unix_ms = now_unix_ms();
                self.append_audit(e.clone()).await.map_err(audit_failed)?;
            }
            let result = match self.store_change(fence, &next, &recheck).await {
                Ok(true) => {
                    let mut state = self.lock();
                    Ok(Some(commit(&mut state, &mut out)))
                }
                Ok(false) => Ok(None),
                Err(Failed::Store(error)) => Err(store_failed(error)),
                Err(Failed::Refused(error)) => Err(error),
            };
            if let Some(mut e) = entry {
                e.at_unix_ms = now_unix_ms();
                match &result {
                    Ok(_) => e.action = action,
                    Err(error) => {
                        let why = crate::error::one_line(error);
                        tracing::warn!(%action, error = %why, "refused: nothing took effect");
                        e.action = format!("{action}-refused");
                        e.detail = if e.detail.is_empty() {
                            why
                        } else {
                            format!("{}; {why}", e.detail)
                        };
                    }
                }
                self.audit(e).await;
            }
            result
        };
        self.send(out).await;
        self.changed();
        self.timer.notify_one();
        self.canary.notify_one();
        result
    }

    /// Steps 2 and 3: whether the change is to commit (`false`: it was in
    /// the stored state already).
    async fn store_change<E>(
        &self,
        fence: Fence,
        next: &impl Fn(&State) -> Persisted,
        recheck: &impl Fn(&State) -> Recheck<E>,
    ) -> Result<bool, Failed<E>> {
        let mut attempt = 1;
        loop {
            let snapshot = next(&self.lock());
            match self.save(snapshot, fence).await {
                Ok(()) => return Ok(true),
                Err(Error::Conflict { .. }) if attempt < WRITE_ATTEMPTS => {
                    attempt += 1;
                    self.resync().await.map_err(Failed::Store)?;
                    let verdict = recheck(&self.lock());
                    match verdict {
                        Recheck::Again => {}
                        Recheck::Done => return Ok(false),
                        Recheck::Refused(e) => return Err(Failed::Refused(e)),
                    }
                }
                Err(error) => return Err(Failed::Store(error)),
            }
        }
    }
}

/// Why a write did not land.
enum Failed<E> {
    Store(Error),
    Refused(E),
}
