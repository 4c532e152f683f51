//! Fuses: service-level circuit breakers.
//!
//! Closed: every call passes; outcomes are counted in rolling windows (one
//! per `trip when` condition) and each error, or slow call, re-evaluates
//! the conditions. A call is slow for a `slow_calls` or `slow_call_ratio`
//! condition when its latency (from admission to its recorded outcome, as
//! the latency histogram measures it) is above the condition's
//! `slower_than`, or when it timed out. When one holds, the fuse trips
//! (Open): every matching call is rejected, for all consumers. Recovery is
//! manual (an operator's release) or, when declared, automatic: after
//! `after`, the fuse goes half-open and admits `probes` calls; if they all
//! succeed (no error, and no slower than any slow condition allows) it
//! closes, if one fails it opens again for another `after`.
//!
//! The fast path (Closed) is one atomic load on admission and one bucket
//! increment per window on completion, in the calling thread's stripe of the
//! window (a plain store, see [`crate::window`]). State changes take a mutex
//! (rare).

use std::sync::atomic::{
    AtomicU8, AtomicU32, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::{self, Now};
use crate::events::{EventKind, Events};
use crate::latch::{self, Latch, LatchKind, Restored};
use crate::outcome::Outcome;
use crate::primitive::{Answer, Grant, Keys, Phase, Primitive};
use crate::rejection::RejectReason;
use crate::stats::RuleStats;
use crate::stats::{Counters, FuseState};
use crate::stripe::Slot;
use crate::window::{Class, RollingWindow, Totals};
use http::StatusCode;

mod spec;

pub use spec::{Classifier, CompareOp, FuseSpec, RecoverSpec, Threshold, TripMetric, TripSpec};
pub(crate) use spec::{classifier, spec};

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

#[derive(Debug)]
// `counters` first and one alignment for every primitive: at the same
// offset of each (`state::tests`, issue 39), so `State::counters` reads
// them without a match on the kind.
#[repr(C, align(64))]
pub(crate) struct Fuse {
    pub(crate) counters: Counters,
    pub(crate) spec: FuseSpec,
    name: Arc<str>,
    events: Events,
    pub(crate) epoch: Instant,
    /// `epoch` in nanoseconds since the clock's base ([`crate::clock`]).
    epoch_ns: u64,
    // INVARIANT: one window per `spec.trips` entry, same order: `window`
    // the first's (a window no trip reads without one), `more` the others'.
    /// The first condition's window, in place (issue 39: most fuses have
    /// one condition, whose window a call then counts in with no pointer
    /// and no length read first).
    window: RollingWindow,
    more: Box<[RollingWindow]>,
    /// The outcomes a call may not end with to count as one that went well
    /// ([`Fuse::record`]): the errors of either class, and a timeout when a
    /// condition counts slow calls.
    not_plain: Classifier,
    /// The smallest `slower_than` of the slow conditions, in nanoseconds
    /// (`u64::MAX` without one): a call no slower is slow for none.
    fast_ns: u64,
    /// A call that went well and took less than this many nanoseconds
    /// counts with one increment in `window` alone ([`Fuse::record`]):
    /// `fast_ns + 1` (saturated) with one window, 0 with more (issue 39: a
    /// fuse with one condition tests for no others; the calls of one with
    /// more, and of one that took `u64::MAX`, are counted out of line).
    plain_below_ns: u64,
    state: AtomicU8,
    opened_at_ms: AtomicU64,
    /// When it tripped (Unix ms, for the wire and the agent's state only):
    /// kept while it probes and opens again.
    since_unix_ms: AtomicU64,
    probes_taken: AtomicU32,
    probes_ok: AtomicU32,
    /// Serialises state changes; holds the reason of the last trip.
    transition: Mutex<String>,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Fuse {
    pub(crate) fn new(spec: FuseSpec, name: Arc<str>, events: Events) -> Self {
        let epoch = Instant::now();
        let epoch_ns = clock::ns(epoch);
        let slowest = spec.trips.iter().filter_map(|t| t.slower_than).min();
        let mut not_plain = spec.system.or(&spec.business);
        not_plain.timeout |= slowest.is_some();
        let window = |t: &TripSpec| RollingWindow::new(ms(t.window), epoch_ns);
        let fast_ns = slowest.map_or(u64::MAX, |t| {
            u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
        });
        Self {
            window: spec
                .trips
                .first()
                .map_or_else(|| RollingWindow::new(0, epoch_ns), window),
            more: spec.trips.iter().skip(1).map(window).collect(),
            not_plain,
            fast_ns,
            plain_below_ns: if spec.trips.len() > 1 {
                0
            } else {
                fast_ns.saturating_add(1)
            },
            spec,
            name,
            events,
            epoch,
            epoch_ns,
            state: AtomicU8::new(CLOSED),
            opened_at_ms: AtomicU64::new(0),
            since_unix_ms: AtomicU64::new(0),
            probes_taken: AtomicU32::new(0),
            probes_ok: AtomicU32::new(0),
            transition: Mutex::new(String::new()),
            counters: Counters::default(),
        }
    }

    /// The windows of the conditions, in order (with none, one no trip
    /// reads).
    fn windows(&self) -> impl Iterator<Item = &RollingWindow> {
        std::iter::once(&self.window).chain(&*self.more)
    }

    /// Whole milliseconds since the epoch.
    #[inline]
    fn now_ms(&self, now: impl Into<Now>) -> u64 {
        now.into().ms_since(self.epoch_ns)
    }

    /// The answer to a call the fuse does not let pass: with automatic
    /// recovery, it tells callers when probes start.
    #[cold]
    pub(crate) fn refusal(&self) -> Answer {
        Answer::Refused(
            RejectReason::FuseOpen,
            self.remaining().filter(|d| !d.is_zero()),
        )
    }

    /// Whether a call may pass. `Ok(true)`: it passes as a half-open probe.
    pub(crate) fn try_admit(&self, now: impl Into<Now>) -> Result<bool, ()> {
        match self.state.load(Acquire) {
            CLOSED => Ok(false),
            OPEN => {
                let RecoverSpec::After { after, .. } = self.spec.recover else {
                    return Err(());
                };
                let opened = self.opened_at_ms.load(Relaxed);
                if self.now_ms(now) < opened.saturating_add(ms(after)) {
                    return Err(());
                }
                self.to_half_open(opened);
                self.take_probe()
            }
            _ => self.take_probe(),
        }
    }

    fn to_half_open(&self, opened: u64) {
        let Ok(_reason) = self.transition.lock() else {
            return;
        };
        // Someone else may have moved on already.
        if self.state.load(Acquire) == OPEN && self.opened_at_ms.load(Relaxed) == opened {
            self.probes_taken.store(0, Relaxed);
            self.probes_ok.store(0, Relaxed);
            self.state.store(HALF_OPEN, Release);
            self.events.emit(
                EventKind::FuseHalfOpen,
                &self.name,
                "half-open: admitting probe calls".into(),
            );
        }
    }

    fn take_probe(&self) -> Result<bool, ()> {
        let RecoverSpec::After { probes, .. } = self.spec.recover else {
            return Err(());
        };
        if self.state.load(Acquire) != HALF_OPEN {
            // Closed in the meantime: pass normally; opened again: refuse.
            return if self.state.load(Acquire) == CLOSED {
                Ok(false)
            } else {
                Err(())
            };
        }
        if self.probes_taken.fetch_add(1, Relaxed) < probes {
            Ok(true)
        } else {
            self.abandon_probe();
            Err(())
        }
    }

    /// A probe that will never report (its call was refused elsewhere or dropped).
    pub(crate) fn abandon_probe(&self) {
        let _ = self
            .probes_taken
            .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
    }

    fn classify(&self, outcome: Outcome) -> Class {
        if self.spec.system.has(outcome) {
            Class::System
        } else if self.spec.business.has(outcome) {
            Class::Business
        } else {
            Class::Ok
        }
    }

    /// Records how an admitted call ended (counted in the stripe of `slot`)
    /// after `elapsed`.
    #[cfg(test)]
    pub(crate) fn record_outcome(
        &self,
        slot: Slot,
        outcome: Outcome,
        elapsed: Duration,
        probe: bool,
        now: Instant,
    ) {
        let grant = Grant {
            probe,
            ..Grant::default()
        };
        let elapsed_ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        Primitive::record(self, slot, outcome, grant, now.into(), elapsed_ns);
    }

    /// Records a call [`Fuse::record`] does not count inline: one that
    /// went well in each window, any other (one that did not go well, or a
    /// probe) classified (a call counted as a system error is one whatever
    /// its outcome). Out of line: the record of a call that went well
    /// stays small.
    #[inline(never)]
    fn record_classified(
        &self,
        slot: Slot,
        outcome: Outcome,
        (probe, system_error): (bool, bool),
        now: Now,
        elapsed_ns: u64,
    ) {
        if !(probe | system_error) && elapsed_ns <= self.fast_ns && !self.not_plain.has(outcome) {
            for w in self.windows() {
                w.count_ok(slot, now);
            }
            return;
        }
        let class = if system_error {
            Class::System
        } else {
            self.classify(outcome)
        };
        let call = Call {
            class,
            elapsed_ns,
            timed_out: outcome == Outcome::Timeout,
        };
        self.record_call(slot, call, probe, now);
    }

    /// Records a call (a `token invalid` call is a system error whatever its
    /// outcome).
    #[inline(always)]
    fn record_call(&self, slot: Slot, call: Call, probe: bool, now: Now) {
        if probe {
            self.record_probe(call, now);
            return;
        }
        let now_ms = self.now_ms(now);
        let mut slow = false;
        for (trip, w) in self.spec.trips.iter().zip(self.windows()) {
            let s = call.is_slow(trip.slower_than);
            slow |= s;
            w.record(slot, now_ms, call.class, s);
        }
        if call.class == Class::Ok && !slow {
            return;
        }
        self.check_trips(now_ms);
    }

    /// After a failed or slow call: trips the fuse when closed and one of
    /// its conditions holds. Out of line (issue 39): the record of a call
    /// that went well stays small.
    #[cold]
    #[inline(never)]
    fn check_trips(&self, now_ms: u64) {
        if self.state.load(Acquire) != CLOSED {
            return;
        }
        for (trip, w) in self.spec.trips.iter().zip(self.windows()) {
            if let Some(reason) = fires(trip, w.totals(now_ms)) {
                self.trip(now_ms, reason);
                return;
            }
        }
    }

    /// The smallest `slower_than` of the fuse's slow conditions that `call`
    /// exceeded: a probe that slow fails as an error does.
    fn slow_for_probe(&self, call: Call) -> Option<Duration> {
        self.spec
            .trips
            .iter()
            .filter_map(|t| t.slower_than)
            .filter(|&t| call.is_slow(Some(t)))
            .min()
    }

    /// Out of line (issue 39): a probe is rare, and its reason's
    /// formatting, inlined, was worked out ahead for every call.
    #[cold]
    #[inline(never)]
    fn record_probe(&self, call: Call, now: Now) {
        let RecoverSpec::After { probes, .. } = self.spec.recover else {
            return;
        };
        let slow = self.slow_for_probe(call);
        if call.class == Class::Ok && slow.is_none() {
            if self.probes_ok.fetch_add(1, Relaxed) + 1 >= probes {
                let Ok(_reason) = self.transition.lock() else {
                    return;
                };
                if self.state.load(Acquire) == HALF_OPEN {
                    self.close();
                    self.events.emit(
                        EventKind::FuseReleased,
                        &self.name,
                        format!("{probes} probe calls succeeded"),
                    );
                }
            }
        } else {
            let now_ms = self.now_ms(now);
            let Ok(mut reason) = self.transition.lock() else {
                return;
            };
            if self.state.load(Acquire) == HALF_OPEN {
                self.opened_at_ms.store(now_ms, Relaxed);
                self.state.store(OPEN, Release);
                let why = match (call.class, slow) {
                    (Class::Ok, Some(t)) if call.timed_out => {
                        format!("a probe call timed out (slower than {})", secs(t))
                    }
                    (Class::Ok, Some(t)) => format!(
                        "a probe call was slower than {} ({})",
                        secs(t),
                        secs(Duration::from_nanos(call.elapsed_ns))
                    ),
                    _ => "a probe call failed".into(),
                };
                reason.clone_from(&why);
                self.events.emit(EventKind::FuseTripped, &self.name, why);
            }
        }
    }

    fn trip(&self, now_ms: u64, why: String) {
        let Ok(mut reason) = self.transition.lock() else {
            return;
        };
        if self.state.load(Acquire) != CLOSED {
            return;
        }
        self.opened_at_ms.store(now_ms, Relaxed);
        self.since_unix_ms
            .store(latch::unix_ms(std::time::SystemTime::now()), Relaxed);
        self.state.store(OPEN, Release);
        *reason = why.clone();
        self.events.emit(EventKind::FuseTripped, &self.name, why);
    }

    /// Caller holds `transition`.
    fn close(&self) {
        for w in self.windows() {
            w.reset();
        }
        self.probes_taken.store(0, Relaxed);
        self.probes_ok.store(0, Relaxed);
        self.state.store(CLOSED, Release);
    }

    /// Operator release. Returns whether the fuse was open or half-open.
    pub(crate) fn release(&self, who: &str) -> bool {
        let Ok(_reason) = self.transition.lock() else {
            return false;
        };
        if self.state.load(Acquire) == CLOSED {
            return false;
        }
        self.close();
        self.events.emit(
            EventKind::FuseReleased,
            &self.name,
            format!("released by {who}"),
        );
        true
    }

    pub(crate) fn state(&self) -> FuseState {
        match self.state.load(Acquire) {
            CLOSED => FuseState::Closed,
            OPEN => FuseState::Open,
            _ => FuseState::HalfOpen,
        }
    }

    /// Why it last tripped.
    pub(crate) fn reason(&self) -> String {
        self.transition
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// While open with automatic recovery: time until half-open.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        let RecoverSpec::After { after, .. } = self.spec.recover else {
            return None;
        };
        if self.state.load(Acquire) != OPEN {
            return None;
        }
        let at = self.opened_at_ms.load(Relaxed).saturating_add(ms(after));
        Some(Duration::from_millis(
            at.saturating_sub(self.now_ms(Instant::now())),
        ))
    }
}

// === latches ===

impl Fuse {
    /// The latch of this fuse while it is open or half-open (a half-open
    /// fuse still refuses every call but its probes).
    pub(crate) fn latch(&self, now: Instant, now_unix_ms: u64) -> Option<Latch> {
        // A panic elsewhere cannot make the reason inconsistent: read it anyway.
        let reason = self.transition.lock().unwrap_or_else(|e| e.into_inner());
        if self.state.load(Acquire) == CLOSED {
            return None;
        }
        let deadline_unix_ms = match self.spec.recover {
            RecoverSpec::After { after, .. } => {
                let at = self.opened_at_ms.load(Relaxed).saturating_add(ms(after));
                Some(now_unix_ms.saturating_add(at.saturating_sub(self.now_ms(now))))
            }
            RecoverSpec::Manual => None,
        };
        Some(Latch {
            kind: LatchKind::Fuse,
            rule: self.name.to_string(),
            key: String::new(),
            since_unix_ms: self.since_unix_ms.load(Relaxed),
            deadline_unix_ms,
            reason: reason.clone(),
        })
    }

    /// Opens a closed fuse again as it was since `latch.since_unix_ms`
    /// (restart, carry-over). No event: nothing new happened.
    pub(crate) fn restore_latch(&self, latch: &Latch, now: Instant, now_unix_ms: u64) -> Restored {
        let mut reason = self.transition.lock().unwrap_or_else(|e| e.into_inner());
        if self.state.load(Acquire) != CLOSED {
            return Restored::Held;
        }
        // The recovery timer counts from the trip; it cannot start before
        // this fuse existed, so a restored fuse never recovers earlier than
        // its `recover after` says.
        let age = ms(latch::age(latch.since_unix_ms, now_unix_ms));
        self.opened_at_ms
            .store(self.now_ms(now).saturating_sub(age), Relaxed);
        self.since_unix_ms.store(latch.since_unix_ms, Relaxed);
        self.probes_taken.store(0, Relaxed);
        self.probes_ok.store(0, Relaxed);
        self.state.store(OPEN, Release);
        reason.clone_from(&latch.reason);
        Restored::Armed
    }
}

/// How one call ended, as a fuse counts it.
#[derive(Clone, Copy, Debug)]
struct Call {
    class: Class,
    /// Its latency in nanoseconds, as the latency histogram has it.
    elapsed_ns: u64,
    /// It was cut off by its deadline: slow whatever `elapsed_ns` says.
    timed_out: bool,
}

impl Call {
    /// Whether it is slow for a condition with this `slower_than`.
    #[inline]
    fn is_slow(self, slower_than: Option<Duration>) -> bool {
        // `t` in nanoseconds worked out only for a slow condition (issue
        // 39: `u128` of the elapsed time split it into seconds and
        // nanoseconds for every call); past `u64::MAX` nothing is slower.
        slower_than.is_some_and(|t| {
            self.timed_out || self.elapsed_ns > u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
        })
    }
}

/// `2s`, `0.25s`: as the windows are written in reasons.
fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// `Some(reason)` when the condition holds for these totals.
fn fires(t: &TripSpec, tot: Totals) -> Option<String> {
    if tot.calls == 0 || tot.calls < t.min_calls {
        return None;
    }
    let errors = match t.metric {
        TripMetric::Errors | TripMetric::ErrorRatio => tot.business + tot.system,
        TripMetric::BusinessErrors | TripMetric::BusinessErrorRatio => tot.business,
        TripMetric::SystemErrors | TripMetric::SystemErrorRatio => tot.system,
        TripMetric::SlowCalls | TripMetric::SlowCallRatio => tot.slow,
    };
    // What the calls in parentheses were: `23 calls`, or for a slow
    // condition `31 of 50 calls slower than 2s`.
    let calls = || match t.slower_than {
        Some(slower) if t.metric.is_slow() => {
            format!(
                "{errors} of {} calls slower than {}",
                tot.calls,
                secs(slower)
            )
        }
        _ => format!("{} calls", tot.calls),
    };
    let cmp = |lhs: u128, rhs: u128| match t.op {
        CompareOp::Gt => lhs > rhs,
        CompareOp::Ge => lhs >= rhs,
    };
    let op = match t.op {
        CompareOp::Gt => ">",
        CompareOp::Ge => ">=",
    };
    let window = t.window.as_secs_f64();
    match t.threshold {
        Threshold::Count(n) => cmp(u128::from(errors), u128::from(n)).then(|| {
            format!(
                "{} {errors} {op} {n} over {window}s ({})",
                t.metric.as_str(),
                calls()
            )
        }),
        Threshold::MilliPercent(p) => cmp(
            u128::from(errors) * 100_000,
            u128::from(p) * u128::from(tot.calls),
        )
        .then(|| {
            let actual = u128::from(errors) * 100_000 / u128::from(tot.calls);
            format!(
                "{} {} {op} {} over {window}s ({})",
                t.metric.as_str(),
                percent(actual),
                percent(u128::from(p)),
                calls()
            )
        }),
    }
}

/// `50000` -> `50%`, `12500` -> `12.5%`.
fn percent(milli: u128) -> String {
    let whole = milli / 1000;
    let frac = milli % 1000;
    if frac == 0 {
        format!("{whole}%")
    } else {
        let s = format!("{whole}.{frac:03}");
        format!("{}%", s.trim_end_matches('0'))
    }
}

// === impl Primitive ===

impl Primitive for Fuse {
    const PHASE: Phase = Phase::Fuses;

    /// A fuse counts every call of its rule together.
    type Scope = ();

    #[inline]
    fn scope(&self, _keys: &Keys<'_>) {}

    #[inline]
    fn try_acquire(&self, _scope: Option<&()>, now: Now, _start: Now) -> Answer {
        match self.try_admit(now) {
            Ok(probe) => Answer::Granted(Grant {
                probe,
                ..Grant::default()
            }),
            Err(()) => self.refusal(),
        }
    }

    async fn acquire(
        &self,
        scope: Option<&()>,
        start: Instant,
    ) -> Result<Grant, (RejectReason, Option<Duration>)> {
        match self.try_acquire(scope, Now::read(), start.into()) {
            Answer::Granted(grant) => Ok(grant),
            Answer::Refused(reason, retry) => Err((reason, retry)),
            // A fuse never asks to wait.
            Answer::Wait(_) => Err((RejectReason::FuseOpen, None)),
        }
    }

    #[inline]
    fn release(&self, _scope: Option<&()>, grant: Grant) {
        if grant.probe {
            self.abandon_probe();
        }
    }

    /// A call that went well (no error, not a probe, slow for no condition)
    /// is one more call in each window now, counted without classifying it
    /// (issue 39: most calls), inline in a fuse's one window
    /// (`plain_below_ns`); any other is classified. Inlined into the end of
    /// a call, where only the grant's two bits are read.
    #[inline(always)]
    fn record(&self, slot: Slot, outcome: Outcome, grant: Grant, now: Now, elapsed_ns: u64) {
        if !(grant.probe | grant.system_error)
            && elapsed_ns < self.plain_below_ns
            && !self.not_plain.has(outcome)
        {
            self.window.count_ok(slot, now);
            return;
        }
        // The grant's two bits, not the grant (issue 39: the record pass
        // keeps no grant word for this call).
        let bits = (grant.probe, grant.system_error);
        self.record_classified(slot, outcome, bits, now, elapsed_ns);
    }

    fn reject_status(&self) -> StatusCode {
        self.spec.reject_status
    }

    fn reject_grpc(&self) -> gov_proto::v1::GrpcCode {
        self.spec.reject_grpc
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn stats(&self, stats: &mut RuleStats) {
        stats.fuse = Some(self.state());
    }

    fn latches(&self, now: Instant, now_unix_ms: u64, out: &mut Vec<Latch>) {
        out.extend(self.latch(now, now_unix_ms));
    }

    fn restore(&self, latch: &Latch, now: Instant, now_unix_ms: u64) -> Option<Restored> {
        (latch.kind == LatchKind::Fuse).then(|| self.restore_latch(latch, now, now_unix_ms))
    }
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;
    use crate::events::Event;

    fn trip(
        metric: TripMetric,
        op: CompareOp,
        threshold: Threshold,
        window_s: u64,
        min_calls: u64,
    ) -> TripSpec {
        TripSpec {
            metric,
            op,
            threshold,
            window: Duration::from_secs(window_s),
            min_calls,
            slower_than: None,
        }
    }

    fn fuse(
        trips: Vec<TripSpec>,
        recover: RecoverSpec,
    ) -> (Fuse, tokio::sync::broadcast::Receiver<Event>) {
        let mut business = Classifier::default();
        business.add_statuses(500, 599);
        let system = Classifier {
            connect_failure: true,
            timeout: true,
            reset: true,
            ..Classifier::default()
        };
        let events = Events::new();
        let rx = events.subscribe();
        let spec = FuseSpec {
            trips,
            business,
            system,
            recover,
            reject_status: StatusCode::SERVICE_UNAVAILABLE,
            reject_grpc: gov_proto::v1::GrpcCode::Unavailable,
        };
        (Fuse::new(spec, "svc/f".into(), events), rx)
    }

    fn calls(f: &Fuse, n: usize, outcome: Outcome) {
        for _ in 0..n {
            assert!(
                f.try_admit(Instant::now()).is_ok(),
                "fuse refused while closed"
            );
            f.record_outcome(
                crate::stripe::current(),
                outcome,
                Duration::ZERO,
                false,
                Instant::now(),
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn trips_on_count() {
        let (f, mut rx) = fuse(
            vec![trip(
                TripMetric::SystemErrors,
                CompareOp::Ge,
                Threshold::Count(3),
                10,
                0,
            )],
            RecoverSpec::Manual,
        );
        calls(&f, 10, Outcome::Status(200));
        calls(&f, 2, Outcome::ConnectFailure);
        calls(&f, 5, Outcome::Status(500)); // business, not system
        assert_eq!(f.state(), FuseState::Closed);
        calls(&f, 1, Outcome::Timeout);
        assert_eq!(f.state(), FuseState::Open);
        assert!(f.try_admit(Instant::now()).is_err());
        let e = rx.try_recv().unwrap();
        assert_eq!(e.kind, EventKind::FuseTripped);
        assert_eq!(e.reason, "system_errors 3 >= 3 over 10s (18 calls)");
    }

    /// Each condition counts every call in its own window, the first's in
    /// place and the others' apart (issue 39), calls that went well too:
    /// the second condition trips the fuse, and the reason counts its calls.
    #[tokio::test(start_paused = true)]
    async fn every_condition_counts_in_its_own_window() {
        let never = trip(
            TripMetric::Errors,
            CompareOp::Ge,
            Threshold::Count(99),
            60,
            0,
        );
        let system = trip(
            TripMetric::SystemErrors,
            CompareOp::Ge,
            Threshold::Count(2),
            10,
            0,
        );
        let (f, mut rx) = fuse(vec![never, system], RecoverSpec::Manual);
        let slot = crate::stripe::current();
        for _ in 0..4 {
            assert!(f.try_admit(Instant::now()).is_ok());
            let ok = Outcome::Status(200);
            Primitive::record(&f, slot, ok, Grant::default(), Now::read(), 0);
        }
        let now_ms = f.now_ms(Instant::now());
        let counted = |w: &RollingWindow| w.totals(now_ms).calls;
        assert_eq!(f.windows().map(counted).collect::<Vec<_>>(), [4, 4]);
        calls(&f, 2, Outcome::ConnectFailure);
        assert_eq!(f.state(), FuseState::Open);
        let e = rx.try_recv().unwrap();
        assert_eq!(e.reason, "system_errors 2 >= 2 over 10s (6 calls)");
    }

    /// A call that went well counts the same inline (a fuse of one
    /// condition, faster than `plain_below_ns`) or out of line (issue 39):
    /// in every window, slow for a slow condition alone, with one condition
    /// or two, at the edges of `slower_than` and of the clock.
    #[tokio::test(start_paused = true)]
    async fn a_call_that_went_well_counts_the_same_inline_or_not() {
        let errors = trip(
            TripMetric::Errors,
            CompareOp::Ge,
            Threshold::Count(99),
            10,
            0,
        );
        let slow = TripSpec {
            slower_than: Some(Duration::from_nanos(1000)),
            ..trip(
                TripMetric::SlowCalls,
                CompareOp::Ge,
                Threshold::Count(99),
                10,
                0,
            )
        };
        let elapsed = [0, 999, 1000, 1001, u64::MAX - 1, u64::MAX];
        for trips in [
            vec![errors.clone()],
            vec![slow.clone()],
            vec![errors.clone(), slow.clone()],
            vec![slow.clone(), errors.clone()],
        ] {
            let (f, _rx) = fuse(trips.clone(), RecoverSpec::Manual);
            let fast = match trips.iter().any(|t| t.slower_than.is_some()) {
                true => 1000,
                false => u64::MAX,
            };
            let below = match trips.len() {
                1 => fast.saturating_add(1),
                _ => 0,
            };
            assert_eq!((f.fast_ns, f.plain_below_ns), (fast, below), "{trips:?}");
            let slot = crate::stripe::current();
            for e in elapsed {
                let ok = Outcome::Status(200);
                Primitive::record(&f, slot, ok, Grant::default(), Now::read(), e);
            }
            let now_ms = f.now_ms(Instant::now());
            for (t, w) in trips.iter().zip(f.windows()) {
                let slow = match t.slower_than {
                    Some(_) => 3,
                    None => 0,
                };
                let got = w.totals(now_ms);
                assert_eq!((got.calls, got.slow, got.business), (6, slow, 0), "{t:?}");
            }
            assert_eq!(f.state(), FuseState::Closed);
        }
    }

    /// A call marked `system_error` (a token that did not verify, `on
    /// invalid count`) is a system error whatever its outcome.
    #[tokio::test(start_paused = true)]
    async fn a_call_marked_as_a_system_error_counts_as_one_whatever_its_status() {
        let (f, _rx) = fuse(
            vec![trip(
                TripMetric::SystemErrors,
                CompareOp::Ge,
                Threshold::Count(3),
                10,
                0,
            )],
            RecoverSpec::Manual,
        );
        let marked = Grant {
            system_error: true,
            ..Grant::default()
        };
        for i in 0..3 {
            assert_eq!(f.state(), FuseState::Closed, "after {i}");
            assert!(f.try_admit(Instant::now()).is_ok());
            let slot = crate::stripe::current();
            Primitive::record(&f, slot, Outcome::Status(200), marked, Now::read(), 0);
        }
        assert_eq!(f.state(), FuseState::Open);
    }

    /// A call that went well counts as slow when it is slower than a slow
    /// condition allows, or timed out (an outcome no class holds here): it
    /// is not counted as one that went well.
    #[tokio::test(start_paused = true)]
    async fn a_call_that_went_well_may_be_slow() {
        let slow = TripSpec {
            slower_than: Some(Duration::from_secs(1)),
            ..trip(
                TripMetric::SlowCalls,
                CompareOp::Ge,
                Threshold::Count(2),
                10,
                0,
            )
        };
        let (f, _rx) = fuse(vec![slow], RecoverSpec::Manual);
        let mut spec = f.spec.clone();
        spec.system.timeout = false;
        let f = Fuse::new(spec, "svc/f".into(), Events::new());
        let record = |outcome, elapsed| {
            let slot = crate::stripe::current();
            f.record_outcome(slot, outcome, elapsed, false, Instant::now());
        };
        record(Outcome::Status(200), Duration::from_secs(1));
        record(Outcome::Status(200), Duration::from_millis(10));
        record(Outcome::Status(200), Duration::from_millis(1001));
        assert_eq!(f.state(), FuseState::Closed);
        record(Outcome::Timeout, Duration::ZERO);
        assert_eq!(f.state(), FuseState::Open);
        let w = &f.window;
        let t = w.totals(f.now_ms(Instant::now()));
        assert_eq!((t.calls, t.slow, t.system, t.business), (4, 2, 0, 0));

        // Without a slow condition a timeout in no class went well.
        let errors = trip(
            TripMetric::Errors,
            CompareOp::Ge,
            Threshold::Count(1),
            10,
            0,
        );
        let (f, _rx) = fuse(vec![errors], RecoverSpec::Manual);
        let mut spec = f.spec.clone();
        spec.system.timeout = false;
        let f = Fuse::new(spec, "svc/f".into(), Events::new());
        let slot = crate::stripe::current();
        f.record_outcome(slot, Outcome::Timeout, Duration::MAX, false, Instant::now());
        assert_eq!(f.state(), FuseState::Closed);
        let t = f.window.totals(f.now_ms(Instant::now()));
        assert_eq!((t.calls, t.slow, t.system, t.business), (1, 0, 0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn errors_outside_the_window_do_not_count() {
        let (f, _rx) = fuse(
            vec![trip(
                TripMetric::Errors,
                CompareOp::Ge,
                Threshold::Count(3),
                10,
                0,
            )],
            RecoverSpec::Manual,
        );
        calls(&f, 2, Outcome::Status(503));
        tokio::time::advance(Duration::from_secs(11)).await;
        calls(&f, 2, Outcome::Status(503));
        assert_eq!(f.state(), FuseState::Closed);
        calls(&f, 1, Outcome::Status(503));
        assert_eq!(f.state(), FuseState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn trips_on_ratio_only_after_min_calls() {
        let (f, mut rx) = fuse(
            vec![trip(
                TripMetric::BusinessErrorRatio,
                CompareOp::Gt,
                Threshold::MilliPercent(50_000),
                60,
                20,
            )],
            RecoverSpec::Manual,
        );
        // 10 errors of 10 calls: 100%, but below min_calls.
        calls(&f, 10, Outcome::Status(500));
        assert_eq!(f.state(), FuseState::Closed);
        // 10 successes: 20 calls, 50% is not > 50%.
        calls(&f, 10, Outcome::Status(200));
        calls(&f, 1, Outcome::Status(200));
        assert_eq!(f.state(), FuseState::Closed);
        // 11 of 22 = 50%: still not >; 12 of 23 = 52.17%: trips.
        calls(&f, 1, Outcome::Status(500));
        assert_eq!(f.state(), FuseState::Closed);
        calls(&f, 1, Outcome::Status(502));
        assert_eq!(f.state(), FuseState::Open);
        assert_eq!(
            rx.try_recv().unwrap().reason,
            "business_error_ratio 52.173% > 50% over 60s (23 calls)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn manual_fuse_stays_open_until_released() {
        let (f, mut rx) = fuse(
            vec![trip(
                TripMetric::Errors,
                CompareOp::Ge,
                Threshold::Count(1),
                10,
                0,
            )],
            RecoverSpec::Manual,
        );
        calls(&f, 1, Outcome::Reset);
        assert_eq!(f.state(), FuseState::Open);
        tokio::time::advance(Duration::from_secs(86_400)).await;
        assert!(f.try_admit(Instant::now()).is_err(), "latched");
        assert_eq!(f.remaining(), None);
        assert!(f.release("ops"));
        assert!(!f.release("ops"));
        assert_eq!(f.state(), FuseState::Closed);
        // The old error is forgotten: one success does not re-trip.
        calls(&f, 1, Outcome::Status(200));
        assert_eq!(f.state(), FuseState::Closed);
        let kinds: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, [EventKind::FuseTripped, EventKind::FuseReleased]);
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_probes_close_the_fuse() {
        let (f, mut rx) = fuse(
            vec![trip(
                TripMetric::Errors,
                CompareOp::Ge,
                Threshold::Count(1),
                10,
                0,
            )],
            RecoverSpec::After {
                after: Duration::from_secs(30),
                probes: 2,
            },
        );
        calls(&f, 1, Outcome::Status(500));
        assert_eq!(f.remaining(), Some(Duration::from_secs(30)));
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(f.try_admit(Instant::now()).is_err());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(f.try_admit(Instant::now()), Ok(true));
        assert_eq!(f.state(), FuseState::HalfOpen);
        assert_eq!(f.try_admit(Instant::now()), Ok(true));
        assert!(f.try_admit(Instant::now()).is_err(), "only two probes");
        f.record_outcome(
            crate::stripe::current(),
            Outcome::Status(200),
            Duration::ZERO,
            true,
            Instant::now(),
        );
        assert_eq!(f.state(), FuseState::HalfOpen);
        f.record_outcome(
            crate::stripe::current(),
            Outcome::Status(204),
            Duration::ZERO,
            true,
            Instant::now(),
        );
        assert_eq!(f.state(), FuseState::Closed);
        assert_eq!(f.try_admit(Instant::now()), Ok(false));
        let kinds: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e.kind)
            .collect();
        assert_eq!(
            kinds,
            [
                EventKind::FuseTripped,
                EventKind::FuseHalfOpen,
                EventKind::FuseReleased
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_opens_again() {
        let (f, _rx) = fuse(
            vec![trip(
                TripMetric::Errors,
                CompareOp::Ge,
                Threshold::Count(1),
                10,
                0,
            )],
            RecoverSpec::After {
                after: Duration::from_secs(30),
                probes: 3,
            },
        );
        calls(&f, 1, Outcome::Status(500));
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(f.try_admit(Instant::now()), Ok(true));
        f.record_outcome(
            crate::stripe::current(),
            Outcome::Status(200),
            Duration::ZERO,
            true,
            Instant::now(),
        );
        assert_eq!(f.try_admit(Instant::now()), Ok(true));
        f.record_outcome(
            crate::stripe::current(),
            Outcome::ConnectFailure,
            Duration::ZERO,
            true,
            Instant::now(),
        );
        assert_eq!(f.state(), FuseState::Open);
        // Another full `after` from the failed probe.
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(f.try_admit(Instant::now()).is_err());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(f.try_admit(Instant::now()), Ok(true));
    }

    #[tokio::test(start_paused = true)]
    async fn abandoned_probes_are_given_back() {
        let (f, _rx) = fuse(
            vec![trip(
                TripMetric::Errors,
                CompareOp::Ge,
                Threshold::Count(1),
                10,
                0,
            )],
            RecoverSpec::After {
                after: Duration::from_secs(1),
                probes: 1,
            },
        );
        calls(&f, 1, Outcome::Status(500));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(f.try_admit(Instant::now()), Ok(true));
        assert!(f.try_admit(Instant::now()).is_err());
        f.abandon_probe();
        assert_eq!(f.try_admit(Instant::now()), Ok(true));
    }

    #[test]
    fn percent_rendering() {
        assert_eq!(percent(50_000), "50%");
        assert_eq!(percent(12_500), "12.5%");
        assert_eq!(percent(52_173), "52.173%");
    }
}
