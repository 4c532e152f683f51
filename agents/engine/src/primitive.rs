//! The one interface of the enforcement primitives: a bulkhead, a limit and
//! a fuse each acquire (or ask the call to wait), release, record an outcome
//! and report stats the same way, so the admission ([`crate::admission`])
//! and the engine handle every rule kind through [`crate::state::State`]
//! without knowing which it is.
//!
//! This module knows no primitive: each implements [`Primitive`] in its own
//! file, and `state.rs` enumerates them (the one dispatch), so the imports
//! point one way, from the primitives and `state.rs` to here.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

use crate::clock::Now;
use crate::latch::{Latch, Restored};
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
    /// The call counts as a system error whatever its outcome (a fuse's
    /// class), set at record time ([`crate::Admission::count_as_system_error`]).
    pub system_error: bool,
    /// A bulkhead with a fair share: the consumer class its permit counts
    /// against (given back to that class).
    pub share_class: Option<u8>,
}

pub(crate) use crate::phase::Phase;

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
    /// The query (after `?`; empty without one), for keys on a parameter.
    pub query: &'a str,
    /// The request headers, for keys on a header.
    pub headers: crate::route::Headers<'a>,
    /// The verified token's claims the config keys on (name, value).
    pub claims: &'a [(String, String)],
    /// The call's criticality ([`crate::criticality`]).
    pub class: crate::criticality::Class,
}

/// An enforcement primitive: the state of one rule.
pub(crate) trait Primitive {
    /// Where this rule stands in a decision.
    const PHASE: Phase;

    /// Where a call is counted: the rule's own cell or a keyed one
    /// (consumer, instance). `None` in the methods below: the rule's own.
    type Scope;

    /// The scope a call with `keys` is counted in.
    fn scope(&self, keys: &Keys<'_>) -> Self::Scope;

    /// Decides without waiting. `start`: when the decision began (a shaping
    /// delay counts from it).
    fn try_acquire(&self, scope: Option<&Self::Scope>, now: Now, start: Now) -> Answer;

    /// Waits as the rule allows, after [`Primitive::try_acquire`] answered
    /// [`Answer::Wait`]: the grant, or the refusal and its `Retry-After`.
    async fn acquire(
        &self,
        scope: Option<&Self::Scope>,
        start: Instant,
    ) -> Result<Grant, (RejectReason, Option<Duration>)>;

    /// A granted call ended: gives back what it held.
    fn release(&self, scope: Option<&Self::Scope>, grant: Grant);

    /// How a granted call ended, `elapsed_ns` nanoseconds after its
    /// decision began (the latency the histogram counts; a fuse's slow
    /// calls, an adaptive bulkhead's sample).
    fn record(&self, slot: Slot, outcome: Outcome, grant: Grant, now: Now, elapsed_ns: u64);

    /// Counts `n` request or response bytes of a call granted with `bytes`.
    fn add_bytes(&self, _scope: Option<&Self::Scope>, _n: u64, _now: Instant) {}

    /// The deadline this rule sets on a call.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// The status of a refusal.
    fn reject_status(&self) -> StatusCode;

    /// The gRPC status of a refusal of a gRPC call.
    fn reject_grpc(&self) -> gov_proto::v1::GrpcCode;

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
