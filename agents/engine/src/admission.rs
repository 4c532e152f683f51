//! An admitted call's life, from the decision to its end: what it holds of
//! each matched rule, its deadline (a timeout becomes a 504 [`Rejection`]),
//! its outcome (fuses, latency), the bytes it streams (byte limits), and the
//! release of its permits.
//!
//! Every rule is reached through [`crate::state::State`], so nothing here
//! knows a rule kind. Statistics (admitted, latency) and fuse windows are
//! counted in the calling thread's stripe ([`crate::stripe`]), without a
//! locked instruction.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::clock::Now;
use crate::config::Mode;
use crate::outcome::Outcome;
use crate::primitive::{Answer, Grant};
use crate::rejection::{RejectReason, Rejection, WouldReject};
use crate::snapshot::Snapshot;
use crate::state::Scope;
use crate::stats::Latency;
use crate::stripe::{self, Slot};

mod meter;
mod ratelimit;

pub use meter::ByteMeter;

/// One step of a decision: a matched rule and the scope (key) of this call.
#[derive(Debug)]
pub(crate) struct Step {
    pub(crate) rule: u32,
    pub(crate) scope: Scope,
}

pub(crate) type Steps = SmallVec<[Step; 4]>;

/// Why a step did not pass at once.
pub(crate) enum StepError {
    Rejected(Rejection),
    /// The step may pass after waiting.
    Wait(Step),
}

/// What an admission holds of one rule until it ends. Eight bytes, copied
/// whole: a keyed scope (an `Arc`) is kept aside in [`Admission::keyed`].
#[derive(Clone, Copy, Debug)]
struct Held {
    rule: u32,
    grant: Grant,
    /// The scope is in `Admission::keyed`, else the rule's own.
    keyed: bool,
    /// The rule has something to give back when the call ends (a bulkhead
    /// permit, a fuse's probe): the end of the call visits only these.
    gives_back: bool,
    /// A rule in mode shadow that would have refused the call, and why: it
    /// holds nothing, and the call is not counted or recorded by it.
    refused: Option<RejectReason>,
}

impl Held {
    /// Whether the rule granted the call (and so counts and records it).
    #[inline]
    fn granted(&self) -> bool {
        self.refused.is_none()
    }
}

/// An admitted call. Holds its bulkhead permits until dropped; report how
/// the call ended with [`Admission::record`] (or [`Admission::finish`]) so
/// fuses and latency stats see it.
#[derive(Debug)]
#[must_use = "dropping an admission ends the call at once"]
pub struct Admission {
    /// `None` when no rule matched: nothing to hold or record.
    pub(crate) snap: Option<Arc<Snapshot>>,
    held: SmallVec<[Held; 4]>,
    /// The keyed scopes of `held` (consumers, instances), by rule; `None`
    /// (no drop to run) until a rule keys the call.
    keyed: Option<SmallVec<[(u32, Scope); 1]>>,
    /// When the decision began (`None` when no rule matched: no clock read).
    start: Option<Now>,
    /// The rule with the shortest matched timeout.
    timeout: Option<u32>,
    /// The caller's own deadline (`grpc-timeout`, `gov-timeout`).
    caller_deadline: Option<Instant>,
    /// A gRPC call whose status comes in its trailers (its head had none).
    awaits_grpc_status: bool,
    has_bytes: bool,
    /// Every step passed (counted as admitted in every rule).
    admitted: bool,
    recorded: bool,
    /// Fuses count the call as a system error whatever its outcome.
    system_error: bool,
    /// The rules that made this call wait, and how long (the decision log
    /// reports them; empty unless a step waited, so the hot path never
    /// allocates for it).
    waits: Vec<(u32, Duration)>,
    /// Told how the call ended ([`Admission::on_end`]); `None` for almost
    /// every call.
    trace: Option<Box<Trace>>,
}

/// How an admitted call ended, for [`Admission::on_end`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    /// The recorded outcome; `None` when the call ended without one (the
    /// client left, or the request never reached the upstream).
    pub outcome: Option<Outcome>,
    /// When the outcome was recorded (the response head, usually): when
    /// fuses and latency histograms counted the call, which can be well
    /// before its end. `None` with `outcome`.
    pub outcome_at: Option<Instant>,
    /// Response bytes counted through [`Admission::add_bytes`].
    pub bytes: u64,
    /// When the admission was dropped (its permits given back).
    pub at: Instant,
}

/// An observer of one call's end, with what it needs counted.
struct Trace {
    outcome: Option<(Outcome, Instant)>,
    bytes: std::sync::atomic::AtomicU64,
    then: Box<dyn FnOnce(Ended) + Send + Sync>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace")
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

/// A decision that has to wait (bulkhead permit or shaping delay). Boxed:
/// [`crate::Decision`] is as small as an [`Admission`], so the decision
/// that does not wait (almost every one) moves less.
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
    pub(crate) fn unmatched() -> Self {
        Self {
            snap: None,
            held: SmallVec::new(),
            keyed: None,
            start: None,
            timeout: None,
            caller_deadline: None,
            awaits_grpc_status: false,
            has_bytes: false,
            admitted: true,
            recorded: true,
            system_error: false,
            waits: Vec::new(),
            trace: None,
        }
    }

    /// An admission whose decision began at `now` (its snapshot is set when
    /// the decision ends).
    pub(crate) fn started(now: Now) -> Self {
        Self {
            snap: None,
            held: SmallVec::new(),
            keyed: None,
            start: Some(now),
            timeout: None,
            caller_deadline: None,
            awaits_grpc_status: false,
            has_bytes: false,
            admitted: false,
            recorded: false,
            system_error: false,
            waits: Vec::new(),
            trace: None,
        }
    }

    #[inline]
    fn hold(&mut self, step: Step, grant: Grant, gives_back: bool) {
        let keyed = step.scope.is_keyed();
        let rule = step.rule;
        if keyed {
            self.keyed.get_or_insert_default().push((rule, step.scope));
        }
        self.has_bytes |= grant.bytes;
        self.held.push(Held {
            rule,
            grant,
            keyed,
            gives_back: gives_back || grant.probe,
            refused: None,
        });
    }

    /// The keyed scope held for `h` (`None`: the rule's own).
    #[inline]
    fn scope(&self, h: &Held) -> Option<&Scope> {
        if !h.keyed {
            return None;
        }
        self.keyed
            .iter()
            .flatten()
            .find_map(|(rule, scope)| (*rule == h.rule).then_some(scope))
    }

    /// Sets the rule whose deadline the call has (the shortest matched).
    #[inline]
    pub(crate) fn set_timeout_rule(&mut self, rule: Option<u32>) {
        self.timeout = rule;
    }

    /// Runs one step of a decision on `snap` without waiting. A shadow
    /// rule's step always passes: what it would refuse (or make wait) is
    /// counted and kept in `held` as refused, and it holds nothing then.
    #[inline]
    pub(crate) fn step_now(
        &mut self,
        snap: &Snapshot,
        step: Step,
        now: Now,
    ) -> Result<(), StepError> {
        let start = self.start.map_or(now.at, |s| s.at);
        let state = &snap.states[step.rule as usize];
        match state.try_acquire(&step.scope, now, start) {
            Answer::Granted(grant) => {
                self.hold(step, grant, state.gives_back());
                Ok(())
            }
            Answer::Wait(_) if snap.is_shadow(step.rule) => {
                self.shadow(snap, step.rule, state.wait_refusal());
                Ok(())
            }
            Answer::Refused(reason, _) if snap.is_shadow(step.rule) => {
                self.shadow(snap, step.rule, reason);
                Ok(())
            }
            Answer::Wait(_) => Err(StepError::Wait(step)),
            Answer::Refused(reason, retry) => Err(StepError::Rejected(
                self.rejection(snap, step.rule, reason, retry),
            )),
        }
    }

    /// Counts and keeps a shadow rule's would-be refusal.
    #[cold]
    fn shadow(&mut self, snap: &Snapshot, rule: u32, reason: RejectReason) {
        snap.shadow_reject(rule, reason);
        self.held.push(Held {
            rule,
            grant: Grant::default(),
            keyed: false,
            gives_back: false,
            refused: Some(reason),
        });
    }

    /// Counts the rejection of this call by `rule` and builds it, with the
    /// shadow rules that would have refused it too.
    fn rejection(
        &self,
        snap: &Snapshot,
        rule: u32,
        reason: RejectReason,
        retry: Option<Duration>,
    ) -> Rejection {
        let mut r = snap.reject(rule, reason, retry);
        if snap.any_shadow && self.held.iter().any(|h| !h.granted()) {
            r.would_reject = self.would_reject_on(snap).collect();
        }
        r
    }

    /// Runs one step, waiting as the rule allows (a shadow rule's step
    /// never waits).
    async fn step_wait(&mut self, step: Step) -> Result<(), Rejection> {
        let Some(snap) = self.snap.clone() else {
            return Ok(());
        };
        if snap.is_shadow(step.rule) {
            return match self.step_now(&snap, step, Now::read()) {
                Ok(()) | Err(StepError::Wait(_)) => Ok(()),
                Err(StepError::Rejected(r)) => Err(r),
            };
        }
        let start = self.start.map_or_else(Instant::now, |s| s.at);
        let state = &snap.states[step.rule as usize];
        let began = Instant::now();
        match state.acquire(&step.scope, start).await {
            Ok(grant) => {
                let waited = began.elapsed();
                if !waited.is_zero() {
                    self.waits.push((step.rule, waited));
                }
                let gives_back = state.gives_back();
                self.hold(step, grant, gives_back);
                Ok(())
            }
            Err((reason, retry)) => Err(self.rejection(&snap, step.rule, reason, retry)),
        }
    }

    /// Every step passed: count the call as admitted by every matched rule
    /// (in the stripe of `slot`, the calling thread's).
    #[inline]
    pub(crate) fn complete(&mut self, slot: Slot) {
        self.admitted = true;
        if let Some(snap) = &self.snap {
            for h in self.held.iter().filter(|h| h.granted()) {
                snap.states[h.rule as usize].counters().admit(slot);
            }
        }
    }

    /// The deadline for this call from now (the shortest matched timeout,
    /// or what is left of the caller's own when shorter), if any.
    pub fn timeout(&self) -> Option<Duration> {
        let caller = self
            .caller_deadline
            .map(|at| at.saturating_duration_since(Instant::now()));
        match (self.rule_timeout(), caller) {
            (Some(rule), Some(caller)) => Some(rule.min(caller)),
            (rule, caller) => rule.or(caller),
        }
    }

    /// The deadline the request forwarded carries (in the header it came
    /// in, [`crate::deadline::write`]): [`Admission::timeout`] when the
    /// caller sent a deadline, else none.
    pub fn forwarded_deadline(&self) -> Option<Duration> {
        self.caller_deadline.and(self.timeout())
    }

    fn rule_timeout(&self) -> Option<Duration> {
        self.snap.as_deref()?.rule_timeout(self.timeout?)
    }

    /// Sets when the deadline the caller gave the call passes
    /// ([`crate::deadline::read`]): the call's deadline when sooner than its
    /// rules'. A call cut off by it is a timeout for fuses, answered 504 or
    /// DEADLINE_EXCEEDED without naming a rule.
    pub fn set_caller_deadline(&mut self, at: Option<Instant>) {
        self.caller_deadline = at;
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
            None => self.awaits_grpc_status = true,
        }
    }

    /// A gRPC call's response ended: a call whose status never came ended
    /// `UNKNOWN`, as its client reads it. Nothing for any other call.
    pub(crate) fn end_of_response(&mut self) {
        if self.awaits_grpc_status {
            self.record(Outcome::Grpc(gov_proto::v1::GrpcCode::Unknown));
        }
    }

    /// The version of the config this call was decided under (`None` when
    /// no rule matched). For logs: which rules let a request through.
    pub fn config_version(&self) -> Option<&str> {
        self.snap.as_deref().map(|s| &*s.config.version)
    }

    /// The shadow rules that would have refused this call, in decision
    /// order (empty when none did, or none is in mode shadow). For logs of
    /// what a policy would do; the counts are in the rules' stats.
    pub fn would_reject(&self) -> impl Iterator<Item = WouldReject> + '_ {
        self.snap
            .as_deref()
            .into_iter()
            .flat_map(|snap| self.would_reject_on(snap))
    }

    fn would_reject_on<'a>(&'a self, snap: &'a Snapshot) -> impl Iterator<Item = WouldReject> + 'a {
        self.held.iter().filter_map(|h| {
            Some(WouldReject {
                rule: snap.config.rules.get(h.rule as usize)?.name.clone(),
                reason: h.refused?,
            })
        })
    }

    /// The rules to name to the upstream in `gov-would-reject-by`: those of
    /// [`Admission::would_reject`] written with `mode shadow stamp`.
    pub fn stamps(&self) -> impl Iterator<Item = &str> + '_ {
        let rules = self.snap.as_deref().map(|s| &s.config.rules[..]);
        self.held
            .iter()
            .filter(|h| !h.granted())
            .filter_map(move |h| {
                let rule = rules?.get(h.rule as usize)?;
                (rule.mode == Mode::Shadow { stamp: true }).then_some(&*rule.name)
            })
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
        let snap = self.snap.as_deref();
        self.held.iter().filter_map(move |h| {
            let rule = &snap?.config.rules.get(h.rule as usize)?.name;
            let wait = self
                .waits
                .iter()
                .find_map(|&(r, d)| (r == h.rule).then_some(d));
            Some((rule, wait))
        })
    }

    /// The retry rule that matched this call (the first), unless it is in
    /// mode shadow: what the proxy's retry loop asks. The call's attempts
    /// happen under this one admission.
    pub fn retry(&self) -> Option<crate::RetryPolicy> {
        let snap = self.snap.as_deref()?;
        self.held
            .iter()
            .filter(|h| h.granted() && !snap.is_shadow(h.rule))
            .find_map(|h| snap.states[h.rule as usize].retry())
    }

    /// Whether any rule matched (an unmatched admission holds nothing).
    pub fn is_governed(&self) -> bool {
        self.snap.is_some()
    }

    /// Whether a byte limit counts this call's bytes.
    pub fn counts_bytes(&self) -> bool {
        self.has_bytes
    }

    /// Calls `then` once when this call ends (the admission is dropped),
    /// with its outcome and the response bytes counted through
    /// [`Admission::add_bytes`]: how a decision log sees both proxy paths
    /// end a call. A second call replaces the first observer.
    pub fn on_end(&mut self, then: impl FnOnce(Ended) + Send + Sync + 'static) {
        self.trace = Some(Box::new(Trace {
            outcome: None,
            bytes: std::sync::atomic::AtomicU64::new(0),
            then: Box::new(then),
        }));
    }

    /// Adds request or response bytes to every matched byte limit. Call it as
    /// the body streams; it never blocks.
    pub fn add_bytes(&self, n: u64) {
        if let Some(trace) = &self.trace {
            trace
                .bytes
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
        if !self.has_bytes {
            return;
        }
        if let Some(snap) = &self.snap {
            let now = Instant::now();
            for h in self.held.iter().filter(|h| h.grant.bytes) {
                snap.states[h.rule as usize].add_bytes(self.scope(h), n, now);
            }
        }
    }

    /// A handle that counts bytes for this call's byte limits from another
    /// place (a request body wrapper). `None` when no byte limit matched.
    pub fn byte_meter(&self) -> Option<ByteMeter> {
        if !self.has_bytes {
            return None;
        }
        let snap = self.snap.as_ref()?.clone();
        let scopes = self
            .held
            .iter()
            .filter(|h| h.grant.bytes)
            .map(|h| (h.rule, self.scope(h).cloned().unwrap_or(Scope::Rule)))
            .collect();
        Some(ByteMeter { snap, scopes })
    }

    /// Records how the call ended (first call wins): latency for every
    /// matched rule, the outcome for fuses. Permits stay held until drop, so
    /// record at the response head and drop when the body is done.
    #[inline]
    pub fn record(&mut self, outcome: Outcome) {
        if let Some(trace) = &mut self.trace
            && trace.outcome.is_none()
        {
            trace.outcome = Some((outcome, Instant::now()));
        }
        if !self.recorded {
            self.recorded = true;
            self.record_outcome(outcome);
        }
    }

    fn record_outcome(&mut self, outcome: Outcome) {
        let Some(snap) = self.snap.as_deref() else {
            return;
        };
        let slot = stripe::current();
        let now = Now::read();
        let elapsed = self.start.map_or(0, |s| now.nanos_since(s));
        let latency = Latency::of_nanos(elapsed);
        for h in self.held.iter_mut().filter(|h| h.granted()) {
            let state = &snap.states[h.rule as usize];
            state.counters().latency(slot, latency);
            if let Outcome::Grpc(code) = outcome {
                state.counters().grpc(slot, code);
            }
            let grant = Grant {
                system_error: self.system_error,
                ..h.grant
            };
            state.record(slot, outcome, grant, now, Duration::from_nanos(elapsed));
            // A probe has reported; dropping must not give it back.
            h.grant.probe = false;
        }
        if snap.any_shadow {
            shadow_timeouts(snap, &self.held, Duration::from_nanos(elapsed));
        }
    }

    /// Fuses count this call as a system error whatever its outcome: a
    /// caller whose credential did not verify (`consumer from jwt ... on
    /// invalid count`, a `token invalid` error). Other rules see its outcome.
    pub fn count_as_system_error(&mut self) {
        self.system_error = true;
    }

    /// Records the outcome and ends the call (releases its permits).
    #[inline]
    pub fn finish(mut self, outcome: Outcome) {
        self.record(outcome);
        if self.snap.is_none() && self.trace.is_none() {
            // No rule matched and nothing observes the call: it holds
            // nothing (rules, scopes and waits are only held with a
            // snapshot), so its end is nothing, without the drop's call.
            debug_assert!(self.held.is_empty() && self.keyed.is_none());
            debug_assert!(self.waits.capacity() == 0);
            std::mem::forget(self);
        }
    }

    /// The call exceeded [`Admission::timeout`]: records a timeout for fuses,
    /// counts it on the timeout's rule, and returns the 504 rejection (the
    /// one answer to a timeout, on every path).
    pub fn timed_out(mut self) -> Rejection {
        self.record(Outcome::Timeout);
        // The timer fired: the rule's, unless the caller's deadline passed.
        let caller_passed = crate::deadline::passed(self.caller_deadline, Instant::now());
        let rule_first = self.rule_timeout().is_some() && !caller_passed;
        match (self.snap.as_ref(), self.timeout) {
            (Some(snap), Some(rule)) if rule_first => {
                snap.reject(rule, RejectReason::Timeout, None)
            }
            // No rule's deadline passed: the caller's own.
            _ => Rejection::caller_deadline(crate::rejection::DeadlineEnd::InFlight),
        }
    }

    /// Ends a governed call: returns permits and abandoned probes.
    fn end(&mut self) {
        let Some(snap) = &self.snap else { return };
        // A recorded call ended in a latency bucket; count the others here.
        let unrecorded = (self.admitted && !self.recorded).then(stripe::current);
        for h in self
            .held
            .iter()
            .filter(|h| h.granted() && (h.gives_back || unrecorded.is_some()))
        {
            let state = &snap.states[h.rule as usize];
            if let Some(slot) = unrecorded {
                state.counters().end(slot);
            }
            state.release(self.scope(h), h.grant);
        }
    }
}

impl Drop for Admission {
    /// Inline, and all an unmatched admission without an observer pays.
    #[inline]
    fn drop(&mut self) {
        if self.snap.is_some() || self.trace.is_some() {
            self.ended();
        }
    }
}

impl Admission {
    /// The end of a governed or observed call (out of line: the drop of an
    /// unmatched one stays small enough to inline).
    #[inline(never)]
    fn ended(&mut self) {
        if self.snap.is_some() {
            self.end();
        }
        if let Some(trace) = self.trace.take() {
            let ended = Ended {
                outcome: trace.outcome.map(|(o, _)| o),
                outcome_at: trace.outcome.map(|(_, at)| at),
                bytes: trace.bytes.into_inner(),
                at: Instant::now(),
            };
            (trace.then)(ended);
        }
    }
}

/// A shadow rule's deadline is not enforced: counts the calls that
/// outlived it as the timeouts it would have cut off.
#[cold]
fn shadow_timeouts(snap: &Snapshot, held: &[Held], elapsed: Duration) {
    for h in held
        .iter()
        .filter(|h| h.granted() && snap.is_shadow(h.rule))
    {
        if snap.states[h.rule as usize]
            .timeout()
            .is_some_and(|t| elapsed > t)
        {
            snap.shadow_reject(h.rule, RejectReason::Timeout);
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
        for step in steps {
            admission.step_wait(step).await?;
        }
        admission.complete(stripe::current());
        Ok(admission)
    }
}
