//! What an admission keeps of a governed (or observed) call, behind one
//! pointer: the rules it holds, its deadlines, its outcome, its observer.
//! An [`Admission`](super::Admission) of a request no rule matched holds
//! none of it (a null pointer: nothing to move, nothing to drop).
//! The boxes come from a per-thread free list ([`super::free`]).

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::clock::Now;
use crate::outcome::Outcome;
use crate::primitive::{Answer, Grant};
use crate::rejection::{RejectReason, Rejection};
use crate::snapshot::Snapshot;
use crate::state::{Scope, State};
use crate::stats::Latency;
use crate::stripe::{self, Slot};

use super::course::{Course, Progress};
use super::held::{Held, Keyed, Plain, reported, scope_in, shadow_timeouts, state_of};
use super::trace::{self, Trace};

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

/// A governed or observed call. Blank (no snapshot, nothing held or
/// refused, no trace, no waits) while it is on a free list.
#[derive(Debug)]
pub(crate) struct Call {
    /// `None` when no rule matched: nothing to hold or record.
    pub(crate) snap: Option<Arc<Snapshot>>,
    /// The rules that granted the call plainly (most), a bit each: the
    /// passes over the holds walk these, then `held`.
    pub(super) plain: Plain,
    /// The other rules that granted the call, in decision order. A `Vec`, not a
    /// `SmallVec`: a box from the free list keeps its capacity (no
    /// allocation in steady state), and pushes and walks skip the
    /// inline-or-spilled test.
    pub(super) held: Vec<Held>,
    /// The rules in mode shadow that would have refused the call, and why,
    /// in decision order: they hold nothing, and do not count or record the
    /// call (issue 39: apart, so that no pass over `held` tests a hold).
    /// Room for two is made with the box (a decision that meets a shadow
    /// refusal then allocates nothing); a box keeps what it grew.
    pub(super) refused: Vec<(u32, RejectReason)>,
    /// The keyed scopes of `held` (consumers, instances), by rule; `None`
    /// (no drop to run) until a rule keys the call.
    pub(super) keyed: Keyed,
    /// When the decision began. Read only for a call a rule matched (with
    /// `snap`): a box taken for another keeps its last (issue 39: a plain
    /// word, not an `Option` tested by every record).
    pub(super) start: Now,
    /// The rule with the shortest matched timeout.
    pub(crate) timeout: Option<u32>,
    /// The caller's own deadline (`grpc-timeout`, `gov-timeout`), when the
    /// marks say the call has one ([`Call::caller_deadline`]): a box taken
    /// keeps its last (issue 39: `take` writes the marks, not this too).
    pub(super) caller_deadline: Option<Instant>,
    /// Its flags, set blank by one store (issue 39).
    pub(super) marks: Marks,
    /// The rules that made this call wait, and how long (the decision log
    /// reports them; empty unless a step waited, so the hot path never
    /// allocates for it).
    pub(super) waits: Vec<(u32, Duration)>,
    /// Told how the call ended; `None` for almost every call.
    pub(super) trace: Option<Box<Trace>>,
    /// The next box of this thread's free list (`None` in use).
    pub(super) next: Option<Box<Call>>,
    /// On a free list: how many boxes it holds from this one on.
    pub(super) kept: u32,
}

/// A call's flags, in one word (issue 39: `Call::take` sets them blank
/// with one store, not one a flag).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(4))]
pub(super) struct Marks {
    /// A gRPC call whose status comes in its trailers (its head had none).
    pub(super) awaits_grpc_status: bool,
    pub(super) has_bytes: bool,
    /// How far the call got: admitted (counted in every rule), then
    /// recorded; and whether it has an observer, or something kept in
    /// `held`, `refused`, `waits` or `keyed` (the give-back clears them only
    /// then, and the passes over the holds walk `held` only then: issue 39,
    /// a plain grant is kept in `plain`, so most calls hold nothing here).
    pub(super) course: Course,
    /// Whether `Call::caller_deadline` is the call's (else a box's last).
    /// Four bytes: blank marks are written by one store (issue 39: three
    /// took two).
    pub(super) caller_deadline: bool,
}

/// The course of a call admitted, observed by nothing, holding nothing
/// aside, not a system error ([`Call::record_outcome_and`]).
const PLAIN: Course = Course::at(Progress::Admitted);

/// An outcome as a record pass counts it: the stripe, the latency, the
/// outcome, when and how long after the decision began (ns).
type Counted = (Slot, Latency, Outcome, Now, u64);

impl Call {
    /// Ends the call (gives back what it holds, tells its observer), then
    /// puts its box on this thread's free list, blank (a call `finish`ed
    /// without an observer never comes here: its record pass gave
    /// everything back).
    #[inline(never)]
    pub(super) fn end_and_give(mut self: Box<Self>) {
        // Most calls: recorded, observed by nothing, holding nothing aside
        // (issue 39: one compare; no observer to tell, nothing aside to
        // give back or clear).
        if !self.marks.course.plain_at(Progress::Recorded) {
            return self.end_other_and_give();
        }
        if let Some(snap) = self.snap.take() {
            self.give_back_plain(&snap);
        }
        self.give_plain();
    }

    /// [`Call::end_and_give`] of a call observed, holding something aside,
    /// or not recorded.
    #[cold]
    #[inline(never)]
    fn end_other_and_give(mut self: Box<Self>) {
        // Recorded, observed by nothing, holding something aside (issue
        // 39: no observer to tell, no progress tested, `end_held` inline).
        let mut aside = Course::at(Progress::Recorded);
        aside.set_aside(true);
        if self.marks.course == aside {
            if let Some(snap) = self.snap.take() {
                self.give_back_plain(&snap);
                for h in self.held.iter().filter(|h| h.gives_back()) {
                    snap.states[h.rule as usize].release(self.scope(h), reported(h));
                }
            }
            self.put_back_aside();
            return self.give_plain();
        }
        // The snapshot is taken first and dropped once the call has ended
        // and its observer was told (issue 39: its pointer tested once, not
        // again by `give` or by the drop; an arm each, so that the paths do
        // not merge before the drop).
        match self.snap.take() {
            Some(snap) => {
                self.end(&snap);
                trace::ended(&mut self.trace);
                drop(snap);
            }
            None => trace::ended(&mut self.trace),
        }
        self.give();
    }

    /// Clears what was kept aside of the holds (`Call::aside`); not cold
    /// (issue 39: every call of a shared bulkhead keeps its class aside).
    #[inline]
    pub(super) fn put_back_aside(&mut self) {
        self.marks.course.set_aside(false);
        self.held.clear();
        self.refused.clear();
        self.keyed = None;
        self.waits.clear();
    }

    #[inline(always)]
    fn hold(&mut self, step: Step, grant: Grant, gives_back: bool) {
        let keyed = step.scope.is_keyed();
        let rule = step.rule;
        if !keyed && self.plain.add(rule, grant) {
            return;
        }
        if keyed {
            self.keyed.get_or_insert_default().push((rule, step.scope));
        }
        self.marks.course.set_aside(true);
        self.marks.has_bytes |= grant.bytes;
        self.held.push(Held::new(rule, grant, keyed, gives_back));
    }

    /// Holds the plain grants a decision's steps kept in `plain`
    /// ([`Call::step_own`]): before the call is admitted, refused or made
    /// to wait. Its own are none then (issue 39: stored, not joined): a
    /// box is taken blank, and `step_own` holds a plain grant in `plain`
    /// only.
    #[inline]
    pub(crate) fn hold_plain(&mut self, plain: Plain) {
        debug_assert_eq!(self.plain, Plain::default());
        self.plain = plain;
    }

    /// Holds the plain grants a keyed decision's [`Call::step_own`] kept
    /// in `plain` with those its keyed steps held here (issue 39).
    #[inline]
    pub(crate) fn join_plain(&mut self, plain: Plain) {
        self.plain = self.plain.joined(plain);
    }

    /// Holds a grant in the rule's own scope that is not plain. Out of
    /// line (issue 39: the step of a plain grant stays small enough to be
    /// inlined in each kind's arm).
    #[inline(never)]
    fn hold_own(&mut self, rule: u32, grant: Grant, gives_back: bool) {
        self.marks.course.set_aside(true);
        self.marks.has_bytes |= grant.bytes;
        self.held.push(Held::new(rule, grant, false, gives_back));
    }

    /// The caller's own deadline, if it gave one.
    #[inline]
    pub(super) fn caller_deadline(&self) -> Option<Instant> {
        self.caller_deadline.filter(|_| self.marks.caller_deadline)
    }

    /// Sets the caller's own deadline (`None`: it gave none).
    pub(super) fn set_caller_deadline(&mut self, at: Option<Instant>) {
        self.caller_deadline = at;
        self.marks.caller_deadline = at.is_some();
    }

    /// The keyed scope held for `h` (`None`: the rule's own).
    #[inline]
    pub(super) fn scope(&self, h: &Held) -> Option<&Scope> {
        scope_in(&self.keyed, h)
    }

    /// Runs one step of a decision on `snap` without waiting. A shadow
    /// rule's step always passes: what it would refuse (or make wait) is
    /// counted and kept in `refused`, and it holds nothing then. `KEYED`:
    /// a keyed decision's, a copy of its own (as [`Call::step_own`]).
    #[inline]
    pub(crate) fn step_now<const KEYED: bool>(
        &mut self,
        snap: &Snapshot,
        step: Step,
        now: Now,
    ) -> Result<(), StepError> {
        let start = self.start;
        let state = &snap.states[step.rule as usize];
        match state.try_acquire(&step.scope, now, start) {
            Answer::Granted(grant) => {
                self.hold(step, grant, state.gives_back());
                Ok(())
            }
            answer => self.not_granted(snap, step, answer),
        }
    }

    /// [`Call::step_now`] of a decision begun at `now`, in the rule's own
    /// scope (a rule that does not key its calls): no scope to move or
    /// keep (issue 39). `states`: `snap`'s, read once by the decision; a
    /// plain grant is held in `plain`, the decision's until it ends
    /// ([`Call::hold_plain`], issue 39: a word kept in a register, not
    /// stored to the box by every step). `KEYED`: a keyed decision's, a
    /// copy of its own (issue 39: each inlined in its one caller).
    #[inline]
    pub(crate) fn step_own<const KEYED: bool>(
        &mut self,
        snap: &Snapshot,
        states: &[State],
        rule: u32,
        now: Now,
        plain: &mut Plain,
    ) -> Result<(), StepError> {
        // A rule with a bit (below 64) is told from the others by the
        // bounds test of its state (issue 39: no test of the rule's number
        // when its grant is held); the others are stepped apart.
        let Some(state) = states.get(..64).unwrap_or(states).get(rule as usize) else {
            return self.step_past_64(snap, rule, now);
        };
        state.try_acquire_own(now, |answer| match answer {
            Ok((grant, gives_back)) => {
                if !plain.add(rule, grant) {
                    self.hold_own(rule, grant, gives_back);
                }
                Ok(())
            }
            Err(answer) => {
                let step = Step {
                    rule,
                    scope: Scope::Rule,
                };
                self.not_granted(snap, step, answer)
            }
        })
    }

    /// [`Call::step_own`] of a rule past the 64th (no bit of its own).
    #[cold]
    #[inline(never)]
    fn step_past_64(&mut self, snap: &Snapshot, rule: u32, now: Now) -> Result<(), StepError> {
        let step = Step {
            rule,
            scope: Scope::Rule,
        };
        self.step_now::<false>(snap, step, now)
    }

    /// A step that did not pass at once: a shadow rule's is counted and
    /// passes, another's waits or is refused.
    #[cold]
    #[inline(never)]
    fn not_granted(
        &mut self,
        snap: &Snapshot,
        step: Step,
        answer: Answer,
    ) -> Result<(), StepError> {
        let state = &snap.states[step.rule as usize];
        match answer {
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
        self.marks.course.set_aside(true);
        self.refused.push((rule, reason));
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
        if !self.refused.is_empty() {
            r.would_reject = self.would_reject_on(snap).collect();
        }
        r
    }

    /// Runs one step, waiting as the rule allows (a shadow rule's step
    /// never waits).
    pub(super) async fn step_wait(&mut self, step: Step) -> Result<(), Rejection> {
        let Some(snap) = self.snap.clone() else {
            return Ok(());
        };
        if snap.is_shadow(step.rule) {
            return match self.step_now::<false>(&snap, step, Now::read()) {
                Ok(()) | Err(StepError::Wait(_)) => Ok(()),
                Err(StepError::Rejected(r)) => Err(r),
            };
        }
        let start = self.start.at();
        let state = &snap.states[step.rule as usize];
        let began = Instant::now();
        match state.acquire(&step.scope, start).await {
            Ok(grant) => {
                let waited = began.elapsed();
                if !waited.is_zero() {
                    self.marks.course.set_aside(true);
                    self.waits.push((step.rule, waited));
                }
                let gives_back = state.gives_back();
                self.hold(step, grant, gives_back);
                Ok(())
            }
            Err((reason, retry)) => Err(self.rejection(&snap, step.rule, reason, retry)),
        }
    }

    /// A decision whose steps did not all pass at once: its call is not
    /// admitted (yet), and its end counts it in no rule.
    #[inline]
    pub(crate) fn deciding(&mut self) {
        self.marks.course.set(Progress::Deciding);
    }

    /// Every step passed after a wait: count the call as admitted.
    pub(super) fn complete(&mut self, slot: Slot) {
        self.marks.course.set(Progress::Admitted);
        if let Some(snap) = &self.snap {
            self.count_admitted_in(&snap.states, slot);
        }
    }

    /// Every step passed: count the call as admitted by every matched rule
    /// of `states`, its snapshot's (in the stripe of `slot`, the calling
    /// thread's); marked admitted already (by `take`, or by `complete`
    /// after a wait). Issue 39: a decision passes the states its steps
    /// read, not read again.
    #[inline]
    pub(crate) fn count_admitted_in(&self, states: &[State], slot: Slot) {
        for rule in self.plain.rules() {
            state_of(states, rule).counters().admit(slot);
        }
        if self.holds_aside() {
            self.count_held_admitted(states, slot);
        }
    }

    /// [`Call::count_admitted_in`] of the holds other than plain. Out of line
    /// (issue 39: as `record_held`).
    #[inline(never)]
    fn count_held_admitted(&self, states: &[State], slot: Slot) {
        for h in &self.held {
            states[h.rule as usize].counters().admit(slot);
        }
    }

    /// Whether the call may hold something other than plain grants (in
    /// `held`): `aside` says so (issue 39: a flag tested, not the length
    /// loaded); a hold is kept aside only with it set.
    #[inline]
    fn holds_aside(&self) -> bool {
        let aside = self.marks.course.aside();
        debug_assert!(aside || self.held.is_empty());
        aside
    }

    pub(super) fn rule_timeout(&self) -> Option<Duration> {
        self.snap.as_deref()?.rule_timeout(self.timeout?)
    }

    /// Adds request or response bytes to every matched byte limit.
    pub(super) fn add_bytes(&self, n: u64) {
        if let Some(trace) = &self.trace {
            trace
                .bytes
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
        if !self.marks.has_bytes {
            return;
        }
        if let Some(snap) = &self.snap {
            let now = Instant::now();
            for h in self.held.iter().filter(|h| h.bytes()) {
                snap.states[h.rule as usize].add_bytes(self.scope(h), n, now);
            }
        }
    }

    /// Records how the call ended (first call wins).
    #[inline]
    pub(super) fn record(&mut self, outcome: Outcome) {
        // Most calls: admitted, observed by nothing, holding nothing aside
        // (issue 39: one compare, not a test of each).
        if !self.marks.course.plain_at(Progress::Admitted) {
            return self.record_other(outcome);
        }
        self.marks.course = Course::at(Progress::Recorded);
        if let Some(snap) = &self.snap {
            self.record_outcome_and(snap, outcome, false, PLAIN);
        }
    }

    /// [`Call::record`] of a call observed, holding something aside, or
    /// not admitted (recorded already, or deciding).
    #[cold]
    #[inline(never)]
    fn record_other(&mut self, outcome: Outcome) {
        if self.trace.is_some() {
            trace::keep_outcome(&mut self.trace, outcome);
        }
        if !self.marks.course.is(Progress::Recorded) {
            self.marks.course.set(Progress::Recorded);
            if let Some(snap) = &self.snap {
                self.record_outcome_and(snap, outcome, false, self.marks.course);
            }
        }
    }

    /// [`Call::finish`] of a call recorded or observed before: the general
    /// way (out of line, issue 39: apart from the finish of most calls).
    #[cold]
    #[inline(never)]
    fn record_and_end(mut self: Box<Self>, outcome: Outcome) {
        // Admitted, observed by nothing, holding something aside: finished
        // as a plain call is, in one pass (issue 39: not record, then end).
        let mut aside = PLAIN;
        aside.set_aside(true);
        if self.marks.course == aside {
            if let Some(snap) = self.snap.take() {
                self.record_outcome_and(&snap, outcome, true, aside);
            }
            self.put_back_aside();
            return self.give_plain();
        }
        self.record(outcome);
        self.end_and_give();
    }

    /// Records the outcome, gives back what the call holds in the same
    /// pass over its holds, and gives its box back
    /// ([`Admission::finish`](super::Admission::finish), issue 39: a call
    /// finished holds nothing and is observed by nothing, so nothing is
    /// left for [`Call::end_and_give`] to do).
    #[inline]
    pub(super) fn finish(mut self: Box<Self>, outcome: Outcome) {
        // Admitted, observed by nothing, holding nothing aside (issue 39:
        // one compare; nothing aside to record or clear).
        if !self.marks.course.plain_at(Progress::Admitted) {
            return self.record_and_end(outcome);
        }
        // Not marked recorded: nothing reads it before `take` sets it again.
        // The snapshot is taken first, and dropped once the holds are given
        // back (issue 39: its pointer tested once).
        if let Some(snap) = self.snap.take() {
            self.record_outcome_and(&snap, outcome, true, PLAIN);
        }
        self.give_plain();
    }

    /// Records the outcome for every granted rule of `snap` (the call's);
    /// with `give_back`, gives back what each holds too. `course`: the
    /// call's, or [`PLAIN`] when the caller told it is (issue 39: then no
    /// hold aside or system error is tested again).
    #[inline(always)]
    fn record_outcome_and(
        &self,
        snap: &Snapshot,
        outcome: Outcome,
        give_back: bool,
        course: Course,
    ) {
        let slot = stripe::current();
        let now = Now::read();
        let elapsed = now.nanos_since(self.start);
        let latency = Latency::of_nanos(elapsed);
        let states = &snap.states[..];
        let plain = self.plain;
        let grant = Grant {
            system_error: course.system_error(),
            ..Grant::default()
        };
        for rule in plain.rules() {
            let state = state_of(states, rule);
            // Every hold may be released at the end (`end` does); only a
            // bulkhead's plain grant gives something back, told by the kind
            // the dispatch reads anyway (issue 39: no test of the bits, no
            // second dispatch).
            state.count_and_record(slot, latency, outcome, grant, now, elapsed, give_back);
        }
        if course.aside() {
            debug_assert!(self.holds_aside());
            let counted = (slot, latency, outcome, now, elapsed);
            if give_back {
                self.record_held::<true>(states, counted);
            } else {
                self.record_held::<false>(states, counted);
            }
        }
        if snap.any_shadow {
            let rules = plain.rules().chain(self.held.iter().map(|h| h.rule));
            shadow_timeouts(snap, rules, Duration::from_nanos(elapsed));
        }
    }

    /// [`Call::record_outcome_and`] of the holds other than plain, the
    /// outcome `counted` as the plain ones were; with `GIVE_BACK`, gives
    /// back what each holds too, a copy each (issue 39: a record and a
    /// finish each test no flag). Inline: a plain call's pass (its course
    /// a constant) has none, a call holding aside pays no call (issue 39).
    #[inline]
    fn record_held<const GIVE_BACK: bool>(&self, states: &[State], counted: Counted) {
        let (slot, latency, outcome, now, elapsed) = counted;
        for h in &self.held {
            let grant = Grant {
                system_error: self.marks.course.system_error(),
                ..h.grant()
            };
            let state = &states[h.rule as usize];
            state.count_and_record(slot, latency, outcome, grant, now, elapsed, false);
            // A probe has reported: it is not given back (here, or when the
            // call is dropped later: `end` reads the progress, issue 39: no
            // hold written here).
            if GIVE_BACK && h.gives_back() {
                state.release(scope_in(&self.keyed, h), reported(h));
            }
        }
    }

    /// The call exceeded its timeout: records a timeout for fuses, counts
    /// it on the timeout's rule, and returns the 504 rejection.
    pub(super) fn timed_out(&mut self) -> Rejection {
        self.record(Outcome::Timeout);
        // The timer fired: the rule's, unless the caller's deadline passed.
        let caller_passed = crate::deadline::passed(self.caller_deadline(), Instant::now());
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
    fn end(&self, snap: &Snapshot) {
        // A recorded call ended in a latency bucket; count the others here.
        if self.marks.course.is(Progress::Admitted) {
            return self.end_unrecorded(snap);
        }
        // A recorded call (the proxy's path: recorded at the head, dropped
        // when the body ends), or one refused or dropped while deciding,
        // visits only the holds that give back; a recorded call's probes
        // reported.
        self.give_back_plain(snap);
        // Most calls hold nothing but plain grants (issue 39: tested once,
        // the walk of the others out of line).
        if self.holds_aside() {
            self.end_held(snap);
        }
    }

    /// Gives back the plain holds that do (a bulkhead's permit) of a call
    /// recorded, or refused or dropped while deciding.
    #[inline]
    fn give_back_plain(&self, snap: &Snapshot) {
        for rule in self.plain.giving(snap.gives_back) {
            state_of(&snap.states, rule).release(None, Grant::default());
        }
    }

    /// Fuses count the call as a system error whatever its outcome: its
    /// end is then not a plain one.
    pub(super) fn count_as_system_error(&mut self) {
        self.marks.course.count_as_system_error();
    }

    /// Sets the call's observer: its end is then not a plain one.
    pub(super) fn observe(&mut self, trace: Box<Trace>) {
        self.trace = Some(trace);
        self.marks.course.observed();
    }

    /// [`Call::end`] of an admitted call dropped without an outcome:
    /// counted as unrecorded by every rule, everything given back. Out of
    /// line (issue 39: the end of most calls keeps fewer registers).
    #[inline(never)]
    fn end_unrecorded(&self, snap: &Snapshot) {
        let slot = stripe::current();
        for rule in self.plain.rules() {
            let state = &snap.states[rule as usize];
            state.counters().end(slot);
            state.release(None, Grant::default());
        }
        for h in &self.held {
            let state = &snap.states[h.rule as usize];
            state.counters().end(slot);
            state.release(self.scope(h), h.grant());
        }
    }

    /// [`Call::end`] of the holds other than plain of a call recorded, or
    /// refused or dropped while deciding: those that give back. Out of line
    /// (issue 39: as `end_unrecorded`).
    #[inline(never)]
    fn end_held(&self, snap: &Snapshot) {
        if self.marks.course.is(Progress::Recorded) {
            for h in self.held.iter().filter(|h| h.gives_back()) {
                snap.states[h.rule as usize].release(self.scope(h), reported(h));
            }
            return;
        }
        // A call refused or dropped while deciding: its probes never report.
        for h in self.held.iter().filter(|h| h.gives_back()) {
            snap.states[h.rule as usize].release(self.scope(h), h.grant());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::{HeaderMap, Method};

    use super::*;
    use crate::admission::engine_of;
    use crate::admission::free::{
        FREE, GONE, GUARD_STATE, GUARDED, Guard, KEPT, UNGUARDED, free_head,
    };
    use crate::{Admission, Decision, Engine, RequestInfo};
    use std::mem::ManuallyDrop;

    /// How many boxes this thread's free list holds.
    fn free_len() -> u32 {
        let head = free_head();
        let n = head.as_ref().map_or(0, |h| h.kept);
        FREE.set(ManuallyDrop::new(head));
        n
    }

    /// Whether the head of this thread's free list is blank.
    fn head_blank() -> bool {
        let head = free_head();
        let blank = head.as_ref().is_some_and(|c| {
            c.snap.is_none()
                && c.plain == Plain::default()
                && c.held.is_empty()
                && c.refused.is_empty()
                && c.keyed.is_none()
                && c.trace.is_none()
                && c.waits.is_empty()
                && !c.marks.course.aside()
        });
        FREE.set(ManuallyDrop::new(head));
        blank
    }

    /// An engine of the service the config `yaml` names, with it applied.
    fn engine() -> Engine {
        engine_of(
            r#"
service: order
rules:
- name: order/one
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  bulkhead:
    max_concurrent: 1
    timeout_ms: 1000
"#,
        )
    }

    fn decide(e: &Engine, path: &str) -> Option<Admission> {
        let h = HeaderMap::new();
        match e.try_admit(&RequestInfo::inbound(&Method::GET, path, &h)) {
            Decision::Admitted(a) => Some(a),
            _ => None,
        }
    }

    /// Trips the fuse on `/stock` of `e` (one call that fails to connect)
    /// and waits out its 30 s open: the next calls are its probes.
    async fn trip_and_wait(e: &Engine) {
        let Some(first) = decide(e, "/stock") else {
            panic!("not admitted");
        };
        first.finish(Outcome::ConnectFailure);
        assert!(decide(e, "/stock").is_none(), "the fuse is open");
        tokio::time::advance(Duration::from_secs(30)).await;
    }

    /// Each test on a thread of its own: a free list of its own.
    fn on_a_thread(test: impl FnOnce() + Send + 'static) {
        assert!(std::thread::spawn(test).join().is_ok());
    }

    #[test]
    fn an_unmatched_admission_takes_no_box() {
        on_a_thread(|| {
            let e = engine();
            let a = decide(&e, "/other");
            assert!(a.as_ref().is_some_and(|a| a.0.is_none()));
            drop(a);
            assert_eq!(free_len(), 0);
        });
    }

    #[test]
    fn an_ended_call_gives_its_box_back_blank_and_the_next_reuses_it() {
        on_a_thread(|| {
            let e = engine();
            let a = decide(&e, "/one");
            assert!(a.as_ref().is_some_and(Admission::is_governed));
            assert_eq!(free_len(), 0);
            assert!(decide(&e, "/one").is_none(), "the one permit is held");
            // The refused decision's box came back.
            assert_eq!(free_len(), 1);
            drop(a);
            assert_eq!(free_len(), 2);
            assert!(head_blank(), "no snapshot, rule or observer kept");
            // The permit came back, and a box is taken again.
            let b = decide(&e, "/one");
            assert!(b.as_ref().is_some_and(Admission::is_governed));
            assert_eq!(free_len(), 1);
            drop(b);
            assert_eq!(free_len(), 2);
            // An unmatched call that is observed takes a blank box: it
            // holds nothing of the governed call before it.
            let ended = Arc::new(AtomicUsize::new(0));
            let mut c = Admission::unmatched();
            let seen = ended.clone();
            c.on_end(move |end| {
                assert_eq!(end.outcome, None);
                seen.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(free_len(), 1);
            assert!(!c.is_governed());
            assert_eq!(c.rules().count(), 0);
            assert_eq!(c.timeout(), None);
            assert!(!c.counts_bytes());
            assert_eq!(c.config_version(), None);
            drop(c);
            assert_eq!(ended.load(Ordering::Relaxed), 1);
            assert!(head_blank());
        });
    }

    /// `finish` records and gives the permit back in one pass: the next
    /// call gets the one permit, the box comes back blank, and the call is
    /// counted once, in a latency bucket.
    #[test]
    fn a_finished_call_gives_its_permit_back_once() {
        on_a_thread(|| {
            let e = engine();
            for _ in 0..3 {
                let Some(a) = decide(&e, "/one") else {
                    panic!("the permit was not given back");
                };
                assert!(a.is_governed());
                a.finish(Outcome::Status(200));
                assert!(head_blank());
            }
            let stats = e.stats();
            let one = &stats.rules[0];
            assert_eq!((one.admitted, one.in_flight), (3, 0));
            assert_eq!(one.latency.iter().sum::<u64>(), 3);
        });
    }

    /// A call recorded or observed before `finish` is ended the general
    /// way: told once, counted once, its permit given back, its box blank.
    #[test]
    fn a_recorded_or_observed_call_finishes_once() {
        on_a_thread(|| {
            let e = engine();
            let told = Arc::new(AtomicUsize::new(0));
            for observed in [false, true] {
                let Some(mut a) = decide(&e, "/one") else {
                    panic!("the permit was not given back");
                };
                if observed {
                    let seen = told.clone();
                    a.on_end(move |end| {
                        assert_eq!(end.outcome, Some(Outcome::Status(500)));
                        seen.fetch_add(1, Ordering::Relaxed);
                    });
                } else {
                    a.record(Outcome::Status(200));
                }
                a.finish(Outcome::Status(500));
                assert!(head_blank());
            }
            assert_eq!(told.load(Ordering::Relaxed), 1);
            assert!(decide(&e, "/one").is_some(), "the permit came back");
            let stats = e.stats();
            let one = &stats.rules[0];
            assert_eq!((one.admitted, one.in_flight), (3, 0));
            assert_eq!(one.latency.iter().sum::<u64>(), 2);
        });
    }

    /// A shadow rule's would-be refusal is kept apart from the holds: the
    /// call lists every matched rule in decision order (phase, then id),
    /// and the shadow rule neither counts nor records it.
    #[test]
    fn a_shadow_refusal_is_listed_in_decision_order_and_holds_nothing() {
        on_a_thread(|| {
            let e = engine_of(
                r#"
service: order
rules:
- name: order/pool
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  bulkhead: {max_concurrent: 10}
- name: order/shadow_rate
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  mode: MODE_SHADOW
  limit: {calls: {amount: 1, window_ms: 60000}}
- name: order/fuse
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_SYSTEM_ERRORS, op: COMPARE_OP_GE, count: 10, window_ms: 10000}
- name: order/rate
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  limit: {calls: {amount: 100, window_ms: 60000}}
"#,
            );
            let order = [
                "order/fuse",
                "order/shadow_rate",
                "order/rate",
                "order/pool",
            ];
            let names =
                |a: &Admission| -> Vec<String> { a.rules().map(|(r, _)| r.to_string()).collect() };
            let Some(first) = decide(&e, "/one") else {
                panic!("not admitted");
            };
            assert_eq!(names(&first), order);
            assert_eq!(first.would_reject().count(), 0);
            first.finish(Outcome::Status(200));
            let Some(second) = decide(&e, "/one") else {
                panic!("a shadow rule refused");
            };
            assert_eq!(names(&second), order);
            let would: Vec<_> = second.would_reject().map(|w| w.rule).collect();
            assert_eq!(would, [Arc::from("order/shadow_rate")]);
            second.finish(Outcome::Status(200));
            assert!(head_blank());
            let stats = e.stats();
            let counted = |rule: &str| {
                let s = stats.rules.iter().find(|s| &*s.rule == rule);
                s.map(|s| (s.admitted, s.latency.iter().sum::<u64>(), s.in_flight))
            };
            assert_eq!(counted("order/shadow_rate"), Some((1, 1, 0)));
            for rule in ["order/fuse", "order/rate", "order/pool"] {
                assert_eq!(counted(rule), Some((2, 2, 0)), "{rule}");
            }
        });
    }

    /// A box taken from the free list is blank and linked to nothing: a
    /// decision and the give-back rely on it (they drop no snapshot or next
    /// box they find there). It has no caller's deadline, though its last
    /// call's is kept (only its mark is written blank).
    #[test]
    fn a_taken_box_is_blank_and_unlinked() {
        on_a_thread(|| {
            let e = engine();
            let governed = decide(&e, "/one");
            let observed: Vec<Admission> = (0..2)
                .map(|_| {
                    let mut a = Admission::unmatched();
                    a.set_caller_deadline(Some(Instant::now()));
                    a
                })
                .collect();
            drop((governed, observed));
            assert_eq!(free_len(), 3);
            let taken: Vec<_> = (0..3).map(|_| Call::take(None, &None)).collect();
            assert_eq!(free_len(), 0);
            for call in taken {
                assert!(
                    call.next.is_none()
                        && call.snap.is_none()
                        && call.plain == Plain::default()
                        && call.held.is_empty()
                        && call.caller_deadline().is_none()
                );
                call.give();
            }
            assert_eq!(free_len(), 3);
        });
    }

    /// A governed call counts its latency from its own decision, also in a
    /// box an unmatched call used since (which keeps the start it found).
    #[tokio::test(start_paused = true)]
    async fn a_governed_call_counts_its_latency_from_its_own_decision() {
        let e = engine();
        let Some(a) = decide(&e, "/one") else {
            panic!("not admitted");
        };
        tokio::time::advance(Duration::from_secs(10)).await;
        a.finish(Outcome::Status(200));
        let mut observed = Admission::unmatched();
        observed.set_caller_deadline(Some(Instant::now()));
        drop(observed);
        tokio::time::advance(Duration::from_secs(10)).await;
        let Some(b) = decide(&e, "/one") else {
            panic!("not admitted");
        };
        b.finish(Outcome::Status(200));
        let stats = e.stats();
        let latency = &stats.rules[0].latency;
        assert_eq!((latency[0], latency.iter().sum::<u64>()), (1, 2));
    }

    /// A call that keyed its scope or waited is marked so (`Call::aside`):
    /// its box comes back blank, the next call holds nothing of it.
    #[tokio::test(start_paused = true)]
    async fn a_keyed_or_waiting_call_gives_its_box_back_blank() {
        let e = engine_of(
            r#"
service: order
rules:
- name: order/per_instance
  on: {calls_to: inventory}
  direction: DIRECTION_OUTBOUND
  bulkhead: {key: BULKHEAD_KEY_INSTANCE, max_concurrent: 1, max_wait_ms: 500}
"#,
        );
        let h = HeaderMap::new();
        let info =
            RequestInfo::outbound(&Method::GET, "/stock", &h, "inventory", Some("10.0.0.1:80"));
        let Ok(first) = e.admit(&info).await else {
            panic!("not admitted");
        };
        assert!(
            first
                .0
                .as_ref()
                .is_some_and(|c| c.marks.course.aside() && c.keyed.is_some())
        );
        let e2 = e.clone();
        let second = tokio::spawn(async move {
            let h = HeaderMap::new();
            let info =
                RequestInfo::outbound(&Method::GET, "/stock", &h, "inventory", Some("10.0.0.1:80"));
            let admitted = e2.admit(&info).await;
            let Ok(a) = admitted else {
                panic!("not admitted after waiting");
            };
            assert!(
                a.0.as_ref()
                    .is_some_and(|c| c.marks.course.aside() && !c.waits.is_empty())
            );
            drop(a);
            assert!(head_blank(), "no keyed scope or wait kept");
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(first);
        assert!(head_blank(), "no keyed scope kept");
        assert!(second.await.is_ok());
    }

    /// A call counted as a system error is one for fuses whatever its
    /// outcome, finished or recorded (not the plain end of a call): one
    /// trips a fuse that trips on one error; a call that went well does not.
    #[tokio::test(start_paused = true)]
    async fn a_system_error_trips_a_fuse_whatever_the_outcome() {
        let config = r#"
service: inventory
rules:
- name: inventory/fuse
  on: {path: {kind: PATH_KIND_PREFIX, value: /stock}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 1, window_ms: 30000}
"#;
        for (system_error, record) in [(false, false), (true, false), (true, true)] {
            let e = engine_of(config);
            let Some(mut a) = decide(&e, "/stock") else {
                panic!("not admitted");
            };
            if system_error {
                a.count_as_system_error();
            }
            if record {
                a.record(Outcome::Status(200));
                drop(a);
            } else {
                a.finish(Outcome::Status(200));
            }
            let tripped = decide(&e, "/stock").is_none();
            assert_eq!(tripped, system_error, "{system_error} {record}");
        }
    }

    /// A half-open fuse's probe recorded at the head is not given back
    /// when the call is dropped later (the end reads that it reported, its
    /// hold is not rewritten): the fuse's one other probe is then taken,
    /// and a third call is refused.
    #[tokio::test(start_paused = true)]
    async fn a_recorded_probe_is_not_given_back_when_dropped() {
        let e = engine_of(
            r#"
service: inventory
rules:
- name: inventory/fuse
  on: {path: {kind: PATH_KIND_PREFIX, value: /stock}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 1, window_ms: 30000}
    recover: {after: {after_ms: 30000, probes: 2}}
"#,
        );
        trip_and_wait(&e).await;
        let Some(mut probe) = decide(&e, "/stock") else {
            panic!("no probe admitted");
        };
        probe.record(Outcome::Status(200));
        drop(probe);
        let second = decide(&e, "/stock");
        assert!(second.is_some(), "the second probe is admitted");
        assert!(
            decide(&e, "/stock").is_none(),
            "the recorded probe was given back"
        );
        drop(second);
    }

    /// A half-open fuse's probe finished (the record pass that gives
    /// back the call's holds, a bulkhead's plain permit beside it) is not
    /// given back: the fuse's one other probe is then taken, a third call
    /// refused, and the pool's permits are whole.
    #[tokio::test(start_paused = true)]
    async fn a_finished_probe_is_not_given_back() {
        let e = engine_of(
            r#"
service: inventory
rules:
- name: inventory/pool
  on: {path: {kind: PATH_KIND_PREFIX, value: /stock}}
  bulkhead: {max_concurrent: 2}
- name: inventory/fuse
  on: {path: {kind: PATH_KIND_PREFIX, value: /stock}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 1, window_ms: 30000}
    recover: {after: {after_ms: 30000, probes: 2}}
"#,
        );
        trip_and_wait(&e).await;
        let Some(probe) = decide(&e, "/stock") else {
            panic!("no probe admitted");
        };
        probe.finish(Outcome::Status(200));
        let Some(second) = decide(&e, "/stock") else {
            panic!("the second probe is not admitted (or the permit is held)");
        };
        assert!(
            decide(&e, "/stock").is_none(),
            "the finished probe was given back"
        );
        second.finish(Outcome::Status(200));
        let stats = e.stats();
        let pool = stats.rules.iter().find(|s| &*s.rule == "inventory/pool");
        assert_eq!(pool.map(|s| (s.admitted, s.in_flight)), Some((3, 0)));
    }

    /// A half-open fuse's probe taken by a call a later rule refuses is
    /// given back (the call never reported): the next call, once the limit
    /// lets it through, is the fuse's one probe.
    #[tokio::test(start_paused = true)]
    async fn a_probe_refused_by_a_later_rule_is_given_back() {
        let e = engine_of(
            r#"
service: inventory
rules:
- name: inventory/fuse
  on: {path: {kind: PATH_KIND_PREFIX, value: /stock}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 1, window_ms: 30000}
    recover: {after: {after_ms: 30000, probes: 1}}
- name: inventory/rate
  on: {path: {kind: PATH_KIND_PREFIX, value: /stock}}
  limit: {calls: {amount: 1, window_ms: 60000}}
"#,
        );
        let Some(first) = decide(&e, "/stock") else {
            panic!("not admitted");
        };
        first.finish(Outcome::ConnectFailure);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(
            decide(&e, "/stock").is_none(),
            "the limit refuses the probe"
        );
        tokio::time::advance(Duration::from_secs(31)).await;
        let probe = decide(&e, "/stock");
        assert!(probe.is_some(), "the refused call's probe was given back");
    }

    /// A call whose rules granted it plainly (bits) and not (a limit of
    /// bytes: a `Held`) lists them in decision order, counts its bytes,
    /// and gives everything back once.
    #[test]
    fn a_call_of_plain_and_other_holds_lists_and_gives_back_both() {
        on_a_thread(|| {
            let e = engine_of(
                r#"
service: order
rules:
- name: order/pool
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  bulkhead: {max_concurrent: 1}
- name: order/bytes
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  limit: {bytes: {amount: 1000000, window_ms: 60000}}
- name: order/fuse
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_SYSTEM_ERRORS, op: COMPARE_OP_GE, count: 10, window_ms: 10000}
"#,
            );
            for _ in 0..2 {
                let Some(a) = decide(&e, "/one") else {
                    panic!("the permit was not given back");
                };
                let names: Vec<String> = a.rules().map(|(r, _)| r.to_string()).collect();
                assert_eq!(names, ["order/fuse", "order/bytes", "order/pool"]);
                assert!(a.counts_bytes());
                assert!(decide(&e, "/one").is_none(), "the one permit is held");
                drop(a);
                assert!(head_blank());
            }
            let stats = e.stats();
            for s in &stats.rules {
                assert_eq!((s.admitted, s.in_flight), (2, 0), "{}", s.rule);
            }
        });
    }

    /// A rule past the 64th is held as a `Held` (no bit of its own): its
    /// permit is held and given back all the same, the call dropped,
    /// finished or recorded first.
    #[test]
    fn a_rule_past_the_64th_holds_and_gives_back_its_permit() {
        on_a_thread(|| {
            let mut yaml = String::from("service: order\nrules:\n");
            for i in 0..66 {
                yaml.push_str(&format!(
                    "- name: order/r{i}\n  on: {{path: {{kind: PATH_KIND_EXACT, value: /r{i}}}}}\n  bulkhead: {{max_concurrent: 1}}\n"
                ));
            }
            let e = engine_of(&yaml);
            for path in ["/r2", "/r65"] {
                // Dropped, finished, recorded then dropped, and once more.
                for end in 0..4 {
                    let a = decide(&e, path);
                    assert!(a.as_ref().is_some_and(Admission::is_governed), "{path}");
                    assert!(decide(&e, path).is_none(), "{path}: the one permit is held");
                    match (end, a) {
                        (1, Some(a)) => a.finish(Outcome::Status(200)),
                        (2, Some(mut a)) => {
                            a.record(Outcome::Status(200));
                            drop(a);
                        }
                        (_, a) => drop(a),
                    }
                }
            }
        });
    }

    /// A call in flight across a config swap that moves its bulkhead to
    /// another rule number (a limit where it was) gives its permit back by
    /// its own snapshot's rules and mask (issue 39: the mask is the
    /// snapshot's): recorded then dropped, finished, or dropped unrecorded.
    #[test]
    fn a_call_across_a_swap_gives_back_by_its_own_snapshot() {
        on_a_thread(|| {
            let before = r#"
service: order
rules:
- name: order/pool
  on: {path: {kind: PATH_KIND_PREFIX, value: /p}}
  bulkhead: {max_concurrent: 1}
- name: order/rate
  on: {path: {kind: PATH_KIND_PREFIX, value: /p}}
  limit: {calls: {amount: 100, window_ms: 60000}}
"#;
            let after = r#"
service: order
rules:
- name: order/rate
  on: {path: {kind: PATH_KIND_PREFIX, value: /p}}
  limit: {calls: {amount: 100, window_ms: 60000}}
- name: order/other
  on: {path: {kind: PATH_KIND_PREFIX, value: /q}}
  limit: {calls: {amount: 100, window_ms: 60000}}
- name: order/pool
  on: {path: {kind: PATH_KIND_PREFIX, value: /p}}
  bulkhead: {max_concurrent: 1}
"#;
            let target = |yaml: &str| {
                let mut t: gov_proto::v1::TargetConfig = serde_yaml::from_str(yaml).unwrap();
                gov_proto::compiled::fill(&mut t);
                t
            };
            let (before, after) = (target(before), target(after));
            let e = engine_of("service: order\nrules: []\n");
            for end in 0..3 {
                assert!(e.apply_target(&before).is_ok());
                let Some(mut a) = decide(&e, "/p") else {
                    panic!("{end}: not admitted");
                };
                if end == 0 {
                    a.record(Outcome::Status(200));
                }
                assert!(e.apply_target(&after).is_ok());
                assert!(decide(&e, "/p").is_none(), "{end}: the permit is held");
                match end {
                    1 => a.finish(Outcome::Status(200)),
                    _ => drop(a),
                }
                let b = decide(&e, "/p");
                assert!(b.is_some(), "{end}: the permit came back");
                drop(b);
                let stats = e.stats();
                for s in &stats.rules {
                    assert_eq!(s.in_flight, 0, "{end}: {}", s.rule);
                }
            }
        });
    }

    /// A call waiting across a config swap that resizes its bulkhead and
    /// moves it to another rule number keeps the plain holds of its own
    /// snapshot: admitted after the wait, counted once, and everything
    /// given back once by that snapshot's rules (the new pool whole after).
    #[tokio::test(start_paused = true)]
    async fn a_wait_across_a_swap_gives_back_by_its_own_snapshot() {
        let target = |yaml: &str| {
            let mut t: gov_proto::v1::TargetConfig = serde_yaml::from_str(yaml).unwrap();
            gov_proto::compiled::fill(&mut t);
            t
        };
        let before = target(
            r#"
service: order
rules:
- name: order/front
  on: {path: {kind: PATH_KIND_PREFIX, value: /w}}
  bulkhead: {max_concurrent: 5}
- name: order/pool
  on: {path: {kind: PATH_KIND_PREFIX, value: /w}}
  bulkhead: {max_concurrent: 1, max_wait_ms: 10000}
"#,
        );
        let after = target(
            r#"
service: order
rules:
- name: order/rate
  on: {path: {kind: PATH_KIND_PREFIX, value: /w}}
  limit: {calls: {amount: 100, window_ms: 60000}}
- name: order/front
  on: {path: {kind: PATH_KIND_PREFIX, value: /w}}
  bulkhead: {max_concurrent: 5}
- name: order/pool
  on: {path: {kind: PATH_KIND_PREFIX, value: /w}}
  bulkhead: {max_concurrent: 2, max_wait_ms: 10000}
"#,
        );
        let e = engine_of("service: order\nrules: []\n");
        assert!(e.apply_target(&before).is_ok());
        let h = HeaderMap::new();
        let req = RequestInfo::inbound(&Method::GET, "/w", &h);
        let Some(first) = decide(&e, "/w") else {
            panic!("not admitted");
        };
        let Decision::Wait(p) = e.try_admit(&req) else {
            panic!("not made to wait");
        };
        let waiting = tokio::spawn(p.wait());
        tokio::task::yield_now().await;
        assert!(e.apply_target(&after).is_ok());
        first.finish(Outcome::Status(200));
        let mut second = waiting.await.unwrap().expect("admitted after the wait");
        let stat = |rule: &str| {
            let stats = e.stats();
            let s = stats.rules.iter().find(|s| &*s.rule == rule).unwrap();
            (s.admitted, s.in_flight)
        };
        assert_eq!(stat("order/front"), (2, 1));
        // Recorded at the head, dropped at the end (the mask's way).
        second.record(Outcome::Status(200));
        drop(second);
        assert_eq!(stat("order/front"), (2, 0));
        assert_eq!(stat("order/pool").1, 0);
        // The resized pool of two is whole, and the front's five.
        let calls: Vec<_> = (0..2).map(|_| decide(&e, "/w")).collect();
        assert!(calls.iter().all(Option::is_some));
        assert_eq!(stat("order/front"), (4, 2));
    }

    /// The retry rule of a call is found among its plain holds (a bit)
    /// and its others (past the 64th) alike, a shadow one passed over.
    #[test]
    fn the_retry_rule_is_found_plain_or_not() {
        on_a_thread(|| {
            let retry = "retry: {attempts: 3, on: {status: [{from: 503, to: 503}]}, backoff_ms: 1, backoff_max_ms: 5, budget: {ratio_milli_percent: 10000, min_retries: 10, per_ms: 1000}}";
            let mut yaml = String::from("service: order\nrules:\n");
            yaml.push_str(&format!(
                "- {{name: order/shadow, mode: MODE_SHADOW, direction: DIRECTION_OUTBOUND, on: {{path: {{kind: PATH_KIND_PREFIX, value: /x}}}}, {retry}}}\n\
                 - {{name: order/own, direction: DIRECTION_OUTBOUND, on: {{path: {{kind: PATH_KIND_PREFIX, value: /x}}}}, {retry}}}\n"
            ));
            for i in 0..62 {
                yaml.push_str(&format!(
                    "- {{name: order/f{i}, on: {{path: {{kind: PATH_KIND_EXACT, value: /f{i}}}}}, bulkhead: {{max_concurrent: 1}}}}\n"
                ));
            }
            yaml.push_str(&format!(
                "- {{name: order/late, direction: DIRECTION_OUTBOUND, on: {{path: {{kind: PATH_KIND_PREFIX, value: /y}}}}, {retry}}}\n"
            ));
            let e = engine_of(&yaml);
            for (path, want) in [("/x", "order/own"), ("/y", "order/late")] {
                let h = HeaderMap::new();
                let req = RequestInfo::outbound(&Method::GET, path, &h, "inv", None);
                let Decision::Admitted(a) = e.try_admit(&req) else {
                    panic!("{path} not admitted");
                };
                assert!(a.is_governed(), "{path}");
                let rule = a.retry().map(|r| r.rule().to_string());
                assert_eq!(rule.as_deref(), Some(want), "{path}");
            }
            assert!(decide(&e, "/f1").expect("admitted").retry().is_none());
        });
    }

    /// A rule past the 64th is stepped apart: a shadow one's refusal is
    /// counted and passes, another's refusal gives back the plain holds
    /// before it, and a call it admits counts, records and gives back.
    #[test]
    fn a_rule_past_the_64th_refuses_shadows_and_records() {
        on_a_thread(|| {
            let mut yaml = String::from("service: order\nrules:\n");
            for i in 0..64 {
                yaml.push_str(&format!(
                    "- name: order/r{i}\n  on: {{path: {{kind: PATH_KIND_EXACT, value: /r{i}}}}}\n  bulkhead: {{max_concurrent: 1}}\n"
                ));
            }
            // Rule 64 (shadow) matches every path, rule 65 /r0 alone.
            yaml.push_str(
                "- name: order/shadow\n  mode: MODE_SHADOW\n  on: {path: {kind: PATH_KIND_PREFIX, value: /r}}\n  bulkhead: {max_concurrent: 1}\n\
                 - name: order/last\n  on: {path: {kind: PATH_KIND_EXACT, value: /r0}}\n  limit: {calls: {amount: 2, window_ms: 3600000}}\n",
            );
            let e = engine_of(&yaml);
            let in_flight = || {
                let stats = e.stats();
                stats.rules.iter().map(|s| s.in_flight).sum::<u64>()
            };
            let stat = |rule: &str| {
                let stats = e.stats();
                let s = stats.rules.iter().find(|s| &*s.rule == rule).unwrap();
                (s.admitted, s.in_flight)
            };
            let Some(mut a) = decide(&e, "/r0") else {
                panic!("not admitted");
            };
            let mut names: Vec<String> = a.rules().map(|(r, _)| r.to_string()).collect();
            names.sort();
            assert_eq!(names, ["order/last", "order/r0", "order/shadow"]);
            a.record(Outcome::Status(200));
            drop(a);
            assert_eq!(in_flight(), 0);
            assert_eq!(stat("order/r0"), (1, 0));
            assert_eq!(stat("order/last"), (1, 0));
            // The shadow pool held by one call: another's refusal by it is
            // counted, and passes.
            let a = decide(&e, "/r0").expect("admitted again");
            let b = decide(&e, "/r1").expect("the shadow refusal passes");
            let would: Vec<String> = b.would_reject().map(|w| w.rule.to_string()).collect();
            assert_eq!(would, ["order/shadow"]);
            b.finish(Outcome::Status(200));
            drop(a);
            assert_eq!(in_flight(), 0);
            // The limit past 64 (2 an hour) refuses the third: rule 0's
            // plain permit and the shadow rule's are given back.
            assert!(decide(&e, "/r0").is_none(), "the limit past 64 refuses");
            assert_eq!(in_flight(), 0);
            assert_eq!(stat("order/r0"), (2, 0));
            let b = decide(&e, "/r1").expect("admitted");
            assert_eq!(b.would_reject().count(), 0, "the shadow pool is whole");
        });
    }

    /// The snapshot's mask of the rules that give back (what a call's plain
    /// holds give back at its end) is its bulkheads below 64, whatever the
    /// rules' order; a recorded call dropped later gives its permit back.
    #[test]
    fn the_rules_that_give_back_are_the_bulkheads_below_64() {
        on_a_thread(|| {
            let mut yaml = String::from("service: order\nrules:\n");
            for i in 0..66 {
                let spec = if i % 3 == 1 {
                    "limit: {calls: {amount: 100, window_ms: 60000}}"
                } else {
                    "bulkhead: {max_concurrent: 1}"
                };
                yaml.push_str(&format!(
                    "- name: order/r{i}\n  on: {{path: {{kind: PATH_KIND_PREFIX, value: /r{i}}}}}\n  {spec}\n"
                ));
            }
            let e = engine_of(&yaml);
            let Some(mut a) = decide(&e, "/r0") else {
                panic!("not admitted");
            };
            let Some(snap) = a.0.as_ref().and_then(|c| c.snap.clone()) else {
                panic!("not governed");
            };
            for (i, state) in snap.states.iter().enumerate() {
                let bit = i < 64 && snap.gives_back >> i & 1 == 1;
                assert_eq!(bit, i < 64 && matches!(state, State::Bulkhead(_)), "{i}");
            }
            a.record(Outcome::Status(200));
            assert!(decide(&e, "/r0").is_none(), "the one permit is held");
            drop(a);
            assert!(decide(&e, "/r0").is_some(), "the permit came back");
        });
    }

    /// A call a later rule refuses is counted in no rule: the limit that
    /// granted it first sees only the call in flight.
    #[test]
    fn a_refused_call_is_counted_in_no_rule() {
        on_a_thread(|| {
            let e = engine_of(
                r#"
service: order
rules:
- name: order/pool
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  bulkhead: {max_concurrent: 1}
- name: order/rate
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  limit: {calls: {amount: 100, window_ms: 60000}}
"#,
            );
            let a = decide(&e, "/one");
            assert!(a.is_some());
            assert!(decide(&e, "/one").is_none(), "the one permit is held");
            let stats = e.stats();
            for s in &stats.rules {
                assert_eq!((s.admitted, s.in_flight), (1, 1), "{}", s.rule);
            }
            drop(a);
        });
    }

    /// A call made to wait by a later rule keeps the plain grants of the
    /// rules before it (issue 39: held as bits while the decision ran):
    /// given back once when its wait is dropped, counted as admitted once
    /// and given back once when the wait ends admitted.
    #[tokio::test(start_paused = true)]
    async fn plain_holds_before_a_wait_are_given_back_once() {
        let e = engine_of(
            r#"
service: order
rules:
- name: order/pool
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  bulkhead: {max_concurrent: 2}
- name: order/rate
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  limit: {calls: {amount: 100, window_ms: 60000}}
- name: order/one
  on: {path: {kind: PATH_KIND_PREFIX, value: /one}}
  bulkhead: {max_concurrent: 1, max_wait_ms: 10000}
"#,
        );
        let h = HeaderMap::new();
        let req = RequestInfo::inbound(&Method::GET, "/one", &h);
        let wait = || match e.try_admit(&req) {
            Decision::Wait(p) => p,
            _ => panic!("not made to wait"),
        };
        let stat = |rule: &str| {
            let stats = e.stats();
            let s = stats.rules.iter().find(|s| &*s.rule == rule).unwrap();
            (s.admitted, s.in_flight)
        };
        let Some(first) = decide(&e, "/one") else {
            panic!("not admitted");
        };
        // Dropped while waiting, three times: the pool's permit comes back
        // each time (else the third would be refused by it).
        for _ in 0..3 {
            drop(wait());
        }
        assert_eq!(stat("order/pool"), (1, 1));
        let waiting = tokio::spawn(wait().wait());
        tokio::task::yield_now().await;
        first.finish(Outcome::Status(200));
        let second = waiting.await.unwrap().expect("admitted after the wait");
        for rule in ["order/pool", "order/rate", "order/one"] {
            assert_eq!(stat(rule), (2, 1), "{rule}");
        }
        second.finish(Outcome::Status(200));
        for rule in ["order/pool", "order/rate", "order/one"] {
            assert_eq!(stat(rule), (2, 0), "{rule}");
        }
        // Both pools whole again: two calls at once pass the pool of two.
        let (a, b) = (decide(&e, "/one"), wait());
        assert!(a.is_some());
        drop((a, b));
    }

    /// A call's flags are one word, set blank by one store.
    #[test]
    fn marks_are_one_word() {
        assert_eq!(std::mem::size_of::<Marks>(), 4);
        assert_eq!(std::mem::align_of::<Marks>(), 4);
    }

    /// A list keeps boxes only while its guard will free them: the first
    /// box kept registers the guard; once it is dropped (the thread exits)
    /// the list is empty and a box given is freed, not kept (a leak).
    #[test]
    fn a_free_list_keeps_boxes_only_while_its_guard_will_free_them() {
        on_a_thread(|| {
            assert_eq!(GUARD_STATE.get(), UNGUARDED);
            drop(Admission::of(Call::take(None, &None)));
            assert_eq!((GUARD_STATE.get(), free_len()), (GUARDED, 1));
            // What `GUARD`'s destructor does at the thread's exit.
            drop(Guard);
            assert_eq!((GUARD_STATE.get(), free_len()), (GONE, 0));
            drop(Admission::of(Call::take(None, &None)));
            assert_eq!(free_len(), 0, "a box given after the guard is freed");
        });
    }

    #[test]
    fn a_free_list_keeps_at_most_kept_boxes() {
        on_a_thread(|| {
            let held: Vec<Admission> = (0..KEPT + 5)
                .map(|_| {
                    let mut a = Admission::unmatched();
                    a.set_caller_deadline(Some(Instant::now()));
                    a
                })
                .collect();
            assert_eq!(free_len(), 0);
            drop(held);
            assert_eq!(free_len(), KEPT);
        });
    }
}
