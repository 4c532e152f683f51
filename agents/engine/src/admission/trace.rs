//! An observed call's trace (kept in its `Call`): what its observer
//! ([`Admission::on_end`](super::Admission::on_end)) is told when it ends,
//! and what is counted for it until then.

use tokio::time::Instant;

use crate::outcome::Outcome;

/// How an admitted call ended, for [`Admission::on_end`](super::Admission::on_end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    /// The recorded outcome (the first given after the observer was set:
    /// [`Admission::on_end`](super::Admission::on_end)); `None` when the
    /// call ended without one (the client left, or the request never
    /// reached the upstream).
    pub outcome: Option<Outcome>,
    /// When the outcome was recorded (the response head, usually): when
    /// fuses and latency histograms counted the call, which can be well
    /// before its end. `None` with `outcome`.
    pub outcome_at: Option<Instant>,
    /// Response bytes counted through [`Admission::add_bytes`](super::Admission::add_bytes).
    pub bytes: u64,
    /// When the admission was dropped (its permits given back).
    pub at: Instant,
}

/// An observer of one call's end, with what it needs counted.
pub(super) struct Trace {
    outcome: Option<(Outcome, Instant)>,
    pub(super) bytes: std::sync::atomic::AtomicU64,
    then: Box<dyn FnOnce(Ended) + Send + Sync>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace")
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

impl Trace {
    /// A trace that calls `then` once when its call ends.
    pub(super) fn new(then: Box<dyn FnOnce(Ended) + Send + Sync>) -> Box<Self> {
        Box::new(Self {
            outcome: None,
            bytes: std::sync::atomic::AtomicU64::new(0),
            then,
        })
    }
}

/// Keeps the outcome for a call's observer, if it has one (first call
/// wins). Out of line (issue 39: few calls are observed).
#[cold]
#[inline(never)]
pub(super) fn keep_outcome(trace: &mut Option<Box<Trace>>, outcome: Outcome) {
    if let Some(trace) = trace
        && trace.outcome.is_none()
    {
        trace.outcome = Some((outcome, Instant::now()));
    }
}

/// [`tell`] of a call that ended (takes its trace): the test inline,
/// the telling out of line.
#[inline]
pub(super) fn ended(trace: &mut Option<Box<Trace>>) {
    if trace.is_some() {
        tell(trace);
    }
}

/// Tells a call's observer, if it has one, how the call ended.
#[cold]
#[inline(never)]
pub(super) fn tell(trace: &mut Option<Box<Trace>>) {
    if let Some(trace) = trace.take() {
        let ended = Ended {
            outcome: trace.outcome.map(|(o, _)| o),
            outcome_at: trace.outcome.map(|(_, at)| at),
            bytes: trace.bytes.into_inner(),
            at: Instant::now(),
        };
        (trace.then)(ended);
    }
}
