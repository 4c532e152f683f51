//! An admitted call's life, from the decision to its end: what it holds of
//! each matched rule, its deadline (a timeout becomes a 504 [`Rejection`]),
//! its outcome (fuses, latency), the bytes it streams (byte limits), and the
//! release of its permits.
//!
//! Every rule is reached through `crate::state::State`, so nothing here
//! knows a rule kind. Statistics (admitted, latency) and fuse windows are
//! counted in the calling thread's stripe (`crate::stripe`), without a
//! locked instruction.
//!
//! An [`Admission`] is one pointer: null for a request no rule matched and
//! nothing observes (issue 39: such a decision moves and drops one word),
//! else a box of `call::Call` from the thread's free list.

use std::sync::Arc;
use std::time::Duration;

use crate::outcome::Outcome;
use crate::rejection::{Rejection, WouldReject};
use crate::snapshot::Snapshot;
use crate::state::Scope;
use crate::stripe;

mod call;
mod course;
mod free;
mod held;
mod meter;
mod ratelimit;
mod report;
mod trace;

pub(crate) use call::{Call, Step, StepError, Steps};
pub(crate) use held::Plain;
pub use meter::ByteMeter;
pub use trace::Ended;

/// An admitted call. Holds its bulkhead permits until dropped; report how
/// the call ended with [`Admission::record`] (or [`Admission::finish`]) so
/// fuses and latency stats see it.
#[derive(Debug)]
#[must_use = "dropping an admission ends the call at once"]
pub struct Admission(Option<Box<Call>>);

/// A decision that has to wait (bulkhead permit or shaping delay). Boxed,
/// so that [`crate::Decision`] stays small.
#[derive(Debug)]
#[must_use = "a pending decision does nothing unless waited for"]
pub struct Pending(Box<Waiting>);

#[derive(Debug)]
struct Waiting {
    admission: Admission,
    steps: Steps,
}

// === impl Admission ===

impl Admission {
    /// The admission of a request no rule matched: holds nothing.
    #[inline]
    pub(crate) fn unmatched() -> Self {
        Self(None)
    }

    /// The admission of a decided call.
    #[inline]
    pub(crate) fn of(call: Box<Call>) -> Self {
        Self(Some(call))
    }

    /// The call's state, made (as an unmatched call's) when it has none.
    #[cold]
    fn made(&mut self) -> &mut Call {
        self.0.get_or_insert_with(|| Call::take(None, &None))
    }

    /// The deadline for this call from now (the shortest matched timeout,
    /// or what is left of the caller's own when shorter), if any.
    pub fn timeout(&self) -> Option<Duration> {
        let call = self.0.as_deref()?;
        let caller = call
            .caller_deadline()
            .map(|at| at.saturating_duration_since(tokio::time::Instant::now()));
        match (call.rule_timeout(), caller) {
            (Some(rule), Some(caller)) => Some(rule.min(caller)),
            (rule, caller) => rule.or(caller),
        }
    }

    /// The deadline the request forwarded carries (in the header it came
    /// in, [`crate::deadline::write`]): [`Admission::timeout`] when the
    /// caller sent a deadline, else none.
    pub fn forwarded_deadline(&self) -> Option<Duration> {
        self.0.as_deref()?.caller_deadline().and(self.timeout())
    }

    /// Sets when the deadline the caller gave the call passes
    /// ([`crate::deadline::read`]): the call's deadline when sooner than its
    /// rules'. A call cut off by it is a timeout for fuses, answered 504 or
    /// DEADLINE_EXCEEDED without naming a rule.
    pub fn set_caller_deadline(&mut self, at: Option<tokio::time::Instant>) {
        match (&mut self.0, at) {
            (Some(call), at) => call.set_caller_deadline(at),
            (None, None) => {}
            (None, at) => self.made().set_caller_deadline(at),
        }
    }

    /// Records the outcome a response head tells (first call wins): its
    /// status, or for a gRPC call (`grpc`) its `grpc-status` when the
    /// response is trailers-only; a gRPC call whose status comes in the
    /// trailers is recorded by its [`crate::GovBody`] at its end.
    pub fn record_head(&mut self, grpc: bool, status: http::StatusCode, headers: &http::HeaderMap) {
        let outcome = if grpc {
            crate::grpc::head_outcome(status, headers)
        } else {
            Some(Outcome::from(status))
        };
        match outcome {
            Some(outcome) => self.record(outcome),
            None => self.made().marks.awaits_grpc_status = true,
        }
    }

    /// A gRPC call's response ended: a call whose status never came ended
    /// `UNKNOWN`, as its client reads it. Nothing for any other call.
    pub(crate) fn end_of_response(&mut self) {
        if self.0.as_ref().is_some_and(|c| c.marks.awaits_grpc_status) {
            self.record(Outcome::Grpc(gov_proto::v1::GrpcCode::Unknown));
        }
    }

    /// The version of the config this call was decided under (`None` when
    /// no rule matched). For logs: which rules let a request through.
    pub fn config_version(&self) -> Option<&str> {
        self.snap().map(|s| &*s.config.version)
    }

    fn snap(&self) -> Option<&Snapshot> {
        self.0.as_deref()?.snap.as_deref()
    }

    /// The shadow rules that would have refused this call, in decision
    /// order (empty when none did, or none is in mode shadow). For logs of
    /// what a policy would do; the counts are in the rules' stats.
    pub fn would_reject(&self) -> impl Iterator<Item = WouldReject> + '_ {
        self.0.as_deref().into_iter().flat_map(|call| {
            call.snap
                .as_deref()
                .into_iter()
                .flat_map(|snap| call.would_reject_on(snap))
        })
    }

    /// The rules to name to the upstream in `gov-would-reject-by`: those of
    /// [`Admission::would_reject`] written with `mode shadow stamp`.
    pub fn stamps(&self) -> impl Iterator<Item = &str> + '_ {
        self.0.as_deref().into_iter().flat_map(Call::stamps)
    }

    /// Writes [`Admission::stamps`] into a request's `headers` as
    /// [`crate::WOULD_REJECT_BY`] (comma-separated), after removing any the
    /// caller sent: only the engine says which shadow rules would have refused
    /// a call. A rule name that is no header value is left out. [`crate::Govern`]
    /// stamps every admitted request; the sidecar's HTTP/1 path writes the
    /// same names into the head it sends.
    pub fn stamp(&self, headers: &mut http::HeaderMap) {
        const NAME: http::HeaderName = http::HeaderName::from_static(crate::WOULD_REJECT_BY);
        headers.remove(&NAME);
        let mut stamps = self
            .stamps()
            .filter(|r| http::HeaderValue::from_str(r).is_ok());
        let Some(first) = stamps.next() else {
            return;
        };
        let value = stamps.fold(first.to_owned(), |mut v, r| {
            v.push_str(", ");
            v.push_str(r);
            v
        });
        if let Ok(value) = http::HeaderValue::from_str(&value) {
            headers.insert(NAME, value);
        }
    }

    /// The rules that admitted this call, in decision order, each with how
    /// long it made the call wait (`None`: admitted at once). For the
    /// decision log; not for the request path.
    pub fn rules(&self) -> impl Iterator<Item = (&Arc<str>, Option<Duration>)> {
        self.0.as_deref().into_iter().flat_map(Call::rules)
    }

    /// The retry rule that matched this call (the first), unless it is in
    /// mode shadow: what the proxy's retry loop asks. The call's attempts
    /// happen under this one admission.
    pub fn retry(&self) -> Option<crate::RetryPolicy> {
        self.0.as_deref()?.retry()
    }

    /// Whether any rule matched (an unmatched admission holds nothing).
    pub fn is_governed(&self) -> bool {
        self.snap().is_some()
    }

    /// Whether a byte limit counts this call's bytes.
    pub fn counts_bytes(&self) -> bool {
        self.0.as_ref().is_some_and(|c| c.marks.has_bytes)
    }

    /// Calls `then` once when this call ends (the admission is dropped),
    /// with its outcome and the response bytes counted through
    /// [`Admission::add_bytes`]: how a decision log sees both proxy paths
    /// end a call. A second call replaces the first observer. Set it
    /// before the outcome is recorded (both proxy paths do): it is told the
    /// first outcome given after it was set, so one set after
    /// [`Admission::record`] is told the outcome [`Admission::finish`]
    /// gives (or none, if the call is dropped), not the one the fuses and
    /// latency histograms counted.
    pub fn on_end(&mut self, then: impl FnOnce(Ended) + Send + Sync + 'static) {
        self.made().observe(trace::Trace::new(Box::new(then)));
    }

    /// Adds request or response bytes to every matched byte limit. Call it as
    /// the body streams; it never blocks.
    pub fn add_bytes(&self, n: u64) {
        if let Some(call) = &self.0 {
            call.add_bytes(n);
        }
    }

    /// A handle that counts bytes for this call's byte limits from another
    /// place (a request body wrapper). `None` when no byte limit matched.
    pub fn byte_meter(&self) -> Option<ByteMeter> {
        let call = self.0.as_deref().filter(|c| c.marks.has_bytes)?;
        let snap = call.snap.as_ref()?.clone();
        let scopes = call
            .held
            .iter()
            .filter(|h| h.bytes())
            .map(|h| (h.rule, call.scope(h).cloned().unwrap_or(Scope::Rule)))
            .collect();
        Some(ByteMeter { snap, scopes })
    }

    /// Records how the call ended (first call wins): latency for every
    /// matched rule, the outcome for fuses. Permits stay held until drop, so
    /// record at the response head and drop when the body is done.
    #[inline]
    pub fn record(&mut self, outcome: Outcome) {
        if let Some(call) = &mut self.0 {
            call.record(outcome);
        }
    }

    /// Fuses count this call as a system error whatever its outcome: a
    /// caller whose credential did not verify (`consumer from jwt ... on
    /// invalid count`, a `token invalid` error). Other rules see its outcome.
    pub fn count_as_system_error(&mut self) {
        // Only a matched call's fuses read it.
        if let Some(call) = &mut self.0 {
            call.count_as_system_error();
        }
    }

    /// Records the outcome and ends the call (releases its permits).
    #[inline]
    pub fn finish(mut self, outcome: Outcome) {
        let call = self.0.take();
        // Holds nothing now: no drop to run (issue 39: not even the test of
        // the pointer just taken).
        std::mem::forget(self);
        if let Some(call) = call {
            call.finish(outcome);
        }
    }

    /// The call exceeded [`Admission::timeout`]: records a timeout for fuses,
    /// counts it on the timeout's rule, and returns the 504 rejection (the
    /// one answer to a timeout, on every path).
    pub fn timed_out(mut self) -> Rejection {
        match &mut self.0 {
            Some(call) => call.timed_out(),
            None => Rejection::caller_deadline(crate::rejection::DeadlineEnd::InFlight),
        }
    }
}

impl Drop for Admission {
    /// Inline, and all an unmatched admission without an observer pays: a
    /// test of its pointer.
    #[inline]
    fn drop(&mut self) {
        if let Some(call) = self.0.take() {
            call.end_and_give();
        }
    }
}

// === impl Pending ===

impl Pending {
    pub(crate) fn new(admission: Admission, steps: Steps) -> Self {
        Self(Box::new(Waiting { admission, steps }))
    }

    /// Waits as the rules allow, then admits or rejects.
    pub async fn wait(self) -> Result<Admission, Rejection> {
        let Waiting {
            mut admission,
            steps,
        } = *self.0;
        if let Some(call) = &mut admission.0 {
            for step in steps {
                call.step_wait(step).await?;
            }
            call.complete(stripe::current());
        }
        Ok(admission)
    }
}

/// An engine with the config of a test's YAML applied (the admission's
/// tests: one parse, fill and apply).
#[cfg(test)]
fn engine_of(yaml: &str) -> crate::Engine {
    let mut target: gov_proto::v1::TargetConfig =
        serde_yaml::from_str(yaml).expect("the test config parses");
    gov_proto::compiled::fill(&mut target);
    let engine = crate::Engine::empty(&target.service);
    assert!(engine.apply_target(&target).is_ok());
    engine
}
