//! The one interface of the enforcement primitives: a [`Bulkhead`], a
//! [`Limit`] and a [`Fuse`] each acquire (or ask the call to wait), release,
//! record an outcome and report stats the same way, so the admission
//! ([`crate::admission`]) and the engine handle every rule kind through
//! [`State`] without knowing which it is.
//!
//! [`State`] is a closed enum over the primitives (no `dyn`, no allocation):
//! the decision matches once per step and the primitive's method is inlined.
//! Adding a primitive means one file implementing [`Primitive`] and one
//! variant of [`State`] (named in `State::new` and the `dispatch!` macro).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

use crate::bulkhead::{self, Bulkhead};
use crate::cluster::ClusterStore;
use crate::config::RuleSpec;
use crate::events::Events;
use crate::fuse::Fuse;
use crate::latch::{Latch, Restored};
use crate::limit::{self, Limit};
use crate::outcome::Outcome;
use crate::rejection::RejectReason;
use crate::stats::{Counters, RuleStats};
use crate::stripe::Slot;

/// A primitive's answer to one call, given without waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The call may pass.
    Granted(Grant),
    /// The call may pass after waiting at most this long (`ZERO`: the
    /// answer comes from elsewhere, a cluster store); see [`Primitive::acquire`].
    Wait(Duration),
    /// The call is refused, with a `Retry-After` hint.
    Refused(RejectReason, Option<Duration>),
}

/// What a granted call holds from its primitive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The call is a half-open fuse's probe: it must report its outcome, or
    /// give the probe back when it ends without one.
    pub probe: bool,
    /// The primitive counts the call's bytes ([`Primitive::add_bytes`]).
    pub bytes: bool,
}

/// The order of the steps of a decision: fuses (cheapest, and they refuse
/// everyone), then limits, then bulkheads (the only step that holds a
/// resource another call may be waiting for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Fuses,
    Limits,
    Bulkheads,
}

impl Phase {
    pub(crate) const ALL: [Phase; 3] = [Phase::Fuses, Phase::Limits, Phase::Bulkheads];
}

/// What the scopes (cells) of a request's rules are keyed by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Keys<'a> {
    /// Outbound: the called service.
    pub target: Option<&'a str>,
    /// The consumer header's value (read only when a rule keys on it).
    pub consumer: Option<&'a str>,
    /// Outbound: the upstream instance.
    pub instance: Option<&'a str>,
    pub path: &'a str,
}

/// The scope one call is counted in, resolved before the decision.
#[derive(Clone, Debug)]
pub(crate) enum Scope {
    /// The rule's own (fuses; unkeyed limits and bulkheads).
    Rule,
    Limit(limit::CellRef),
    Bulkhead(bulkhead::CellRef),
}

impl Scope {
    /// Whether the scope is a keyed one (an `Arc` the admission keeps).
    pub(crate) fn is_keyed(&self) -> bool {
        matches!(
            self,
            Scope::Limit(limit::CellRef::Keyed(_)) | Scope::Bulkhead(bulkhead::CellRef::Keyed(_))
        )
    }
}

/// An enforcement primitive: the state of one rule.
pub(crate) trait Primitive {
    /// Where this rule stands in a decision.
    const PHASE: Phase;

    /// The scope a call with `keys` is counted in.
    fn scope(&self, keys: &Keys<'_>) -> Scope;

    /// Decides without waiting. `start`: when the decision began (a shaping
    /// delay counts from it).
    fn try_acquire(&self, scope: &Scope, now: Instant, start: Instant) -> Answer;

    /// Waits as the rule allows, after [`Primitive::try_acquire`] answered
    /// [`Answer::Wait`]: the grant, or the refusal and its `Retry-After`.
    async fn acquire(
        &self,
        scope: &Scope,
        start: Instant,
    ) -> Result<Grant, (RejectReason, Option<Duration>)>;

    /// A granted call ended: gives back what it held (`scope`: `None` for
    /// the rule's own).
    fn release(&self, scope: Option<&Scope>, grant: Grant);

    /// How a granted call ended.
    fn record(&self, slot: Slot, outcome: Outcome, grant: Grant, now: Instant);

    /// Counts `n` request or response bytes of a call granted with `bytes`.
    fn add_bytes(&self, _scope: Option<&Scope>, _n: u64, _now: Instant) {}

    /// The deadline this rule sets on a call.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// Whether the scope needs the consumer (read from a header only then).
    fn needs_consumer(&self) -> bool {
        false
    }

    /// The status of a refusal.
    fn reject_status(&self) -> StatusCode;

    fn counters(&self) -> &Counters;

    /// Fills in this primitive's part of the rule's stats.
    fn stats(&self, stats: &mut RuleStats);

    /// Appends the latches this rule holds.
    fn latches(&self, _now: Instant, _now_unix_ms: u64, _out: &mut Vec<Latch>) {}

    /// Re-arms `latch` here; `None` when this rule does not latch its kind.
    fn restore(&self, _latch: &Latch, _now: Instant, _now_unix_ms: u64) -> Option<Restored> {
        None
    }
}

/// Counts a call as waiting while it waits.
pub(crate) struct Waiting<'a>(&'a Counters);

impl<'a> Waiting<'a> {
    pub(crate) fn new(c: &'a Counters) -> Self {
        c.waiting.fetch_add(1, Relaxed);
        Self(c)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Relaxed);
    }
}

/// The state of one rule: one of the primitives, enum-dispatched.
#[derive(Clone, Debug)]
pub(crate) enum State {
    Bulkhead(Arc<Bulkhead>),
    Limit(Arc<Limit>),
    Fuse(Arc<Fuse>),
}

/// Calls `$method` on the primitive inside a [`State`].
macro_rules! dispatch {
    ($state:expr, $p:ident => $call:expr) => {
        match $state {
            State::Bulkhead($p) => $call,
            State::Limit($p) => $call,
            State::Fuse($p) => $call,
        }
    };
}

impl State {
    pub(crate) fn new(
        spec: &RuleSpec,
        name: &Arc<str>,
        events: &Events,
        cluster: Option<&ClusterStore>,
    ) -> Self {
        match spec {
            RuleSpec::Bulkhead(s) => State::Bulkhead(Arc::new(Bulkhead::new(s.clone()))),
            RuleSpec::Limit(s) => {
                let limit = Arc::new(Limit::new(s.clone(), name.clone(), events.clone(), cluster));
                limit.start();
                State::Limit(limit)
            }
            RuleSpec::Fuse(s) => {
                State::Fuse(Arc::new(Fuse::new(s.clone(), name.clone(), events.clone())))
            }
        }
    }

    #[inline]
    pub(crate) fn phase(&self) -> Phase {
        fn phase<P: Primitive>(_: &P) -> Phase {
            P::PHASE
        }
        dispatch!(self, p => phase(&**p))
    }

    #[inline]
    pub(crate) fn scope(&self, keys: &Keys<'_>) -> Scope {
        dispatch!(self, p => Primitive::scope(&**p, keys))
    }

    #[inline]
    pub(crate) fn try_acquire(&self, scope: &Scope, now: Instant, start: Instant) -> Answer {
        dispatch!(self, p => Primitive::try_acquire(&**p, scope, now, start))
    }

    pub(crate) async fn acquire(
        &self,
        scope: &Scope,
        start: Instant,
    ) -> Result<Grant, (RejectReason, Option<Duration>)> {
        dispatch!(self, p => Primitive::acquire(&**p, scope, start).await)
    }

    #[inline]
    pub(crate) fn release(&self, scope: Option<&Scope>, grant: Grant) {
        dispatch!(self, p => Primitive::release(&**p, scope, grant))
    }

    #[inline]
    pub(crate) fn record(&self, slot: Slot, outcome: Outcome, grant: Grant, now: Instant) {
        dispatch!(self, p => Primitive::record(&**p, slot, outcome, grant, now))
    }

    #[inline]
    pub(crate) fn add_bytes(&self, scope: Option<&Scope>, n: u64, now: Instant) {
        dispatch!(self, p => Primitive::add_bytes(&**p, scope, n, now))
    }

    #[inline]
    pub(crate) fn timeout(&self) -> Option<Duration> {
        dispatch!(self, p => Primitive::timeout(&**p))
    }

    #[inline]
    pub(crate) fn needs_consumer(&self) -> bool {
        dispatch!(self, p => Primitive::needs_consumer(&**p))
    }

    pub(crate) fn reject_status(&self) -> StatusCode {
        dispatch!(self, p => Primitive::reject_status(&**p))
    }

    #[inline]
    pub(crate) fn counters(&self) -> &Counters {
        dispatch!(self, p => Primitive::counters(&**p))
    }

    pub(crate) fn stats(&self, stats: &mut RuleStats) {
        dispatch!(self, p => Primitive::stats(&**p, stats))
    }

    pub(crate) fn latches(&self, now: Instant, now_unix_ms: u64, out: &mut Vec<Latch>) {
        dispatch!(self, p => Primitive::latches(&**p, now, now_unix_ms, out))
    }

    pub(crate) fn restore(
        &self,
        latch: &Latch,
        now: Instant,
        now_unix_ms: u64,
    ) -> Option<Restored> {
        dispatch!(self, p => Primitive::restore(&**p, latch, now, now_unix_ms))
    }
}
