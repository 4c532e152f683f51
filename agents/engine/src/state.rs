//! The rule kinds, listed once: each kind's module (its spec, converted
//! from the wire, and its primitive), [`RuleSpec`] (what a rule does) and
//! [`State`] (the state of one rule), enum-dispatched over the primitives.
//! [`State`] is a closed enum (no `dyn`, no allocation), so a decision
//! matches once per step and the primitive's method is inlined, and
//! [`Scope`] is the scope of one call in whichever primitive decided it.
//!
//! Adding a kind means one module here (`state/<kind>.rs`: its spec type,
//! its `spec` conversion from the wire and its primitive implementing
//! [`Primitive`]) and its variant in this file (`mod`, the `pub use` of its
//! spec types in `specs`, `RuleSpec` and its methods, `spec`, `State`,
//! `State::new`, `Scope` if it keys its calls, and `dispatch!`): nothing
//! else in the engine needs an arm for a new kind.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

use gov_proto::v1::{self as proto, RuleKind};

use self::specs::{BulkheadSpec, FuseSpec, LimitSpec, RetrySpec};

use self::bulkhead::Bulkhead;
use self::fuse::Fuse;
use self::limit::Limit;
use self::retry::Retry;
use crate::clock::Now;
use crate::cluster::ClusterStore;
use crate::config::invalid::{Ctx, InvalidConfig};
use crate::events::Events;
use crate::latch::{Latch, Restored};
use crate::outcome::Outcome;
use crate::primitive::{Answer, Grant, Keys, Phase, Primitive};
use crate::rejection::RejectReason;
use crate::stats::{Counters, Latency, RuleStats};
use crate::stripe::Slot;
use crate::weight::Weight;

pub(crate) mod bulkhead;
pub(crate) mod fuse;
pub(crate) mod keys;
pub(crate) mod limit;
pub(crate) mod retry;

/// What a rule does and every kind's spec type: `config` re-exports them
/// all (`gov_engine::config::BulkheadSpec`).
pub mod specs {
    pub use crate::state::RuleSpec;
    pub use crate::state::bulkhead::{AdaptiveSpec, BulkheadKey, BulkheadSpec, QueueDiscipline};
    pub use crate::state::fuse::{
        Classifier, CompareOp, FuseSpec, RecoverSpec, Threshold, TripMetric, TripSpec,
    };
    pub use crate::state::keys::{DEFAULT_MAX_KEYS, KeyCap, KeyOverflow, MAX_MAX_KEYS};
    pub use crate::state::limit::attrs::{ABSENT, INVALID, KeyPart, MAX_KEY_PARTS, MAX_VALUE};
    pub use crate::state::limit::{
        ExactSync, Fallback, LimitAction, LimitKey, LimitScope, LimitSpec, RateSpec, ReleaseSpec,
    };
    pub use crate::state::retry::{RetryBudgetSpec, RetrySpec};
}

/// What a rule does. Equal specs under the same rule name keep their state
/// across a config swap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleSpec {
    Bulkhead(BulkheadSpec),
    Limit(LimitSpec),
    Fuse(FuseSpec),
    Retry(RetrySpec),
}

impl RuleSpec {
    /// The kind of rule.
    pub fn kind(&self) -> RuleKind {
        match self {
            RuleSpec::Bulkhead(_) => RuleKind::Bulkhead,
            RuleSpec::Limit(_) => RuleKind::Limit,
            RuleSpec::Fuse(_) => RuleKind::Fuse,
            RuleSpec::Retry(_) => RuleKind::Retry,
        }
    }

    /// Where the rule's step runs in a decision (its primitive's phase).
    pub(crate) fn phase(&self) -> Phase {
        match self {
            RuleSpec::Bulkhead(_) => <Bulkhead as Primitive>::PHASE,
            RuleSpec::Limit(_) => <Limit as Primitive>::PHASE,
            RuleSpec::Fuse(_) => <Fuse as Primitive>::PHASE,
            RuleSpec::Retry(_) => <Retry as Primitive>::PHASE,
        }
    }

    /// Whether the rule's scope needs the consumer (read from a header only
    /// then): a limit per consumer, a limit or bulkhead with a share.
    pub(crate) fn needs_consumer(&self) -> bool {
        match self {
            RuleSpec::Limit(l) => {
                l.key == specs::LimitKey::Consumer
                    || l.parts.contains(&specs::KeyPart::Consumer)
                    || l.share.is_some()
            }
            RuleSpec::Bulkhead(b) => b.share.is_some(),
            RuleSpec::Fuse(_) | RuleSpec::Retry(_) => false,
        }
    }

    /// Whether a call's scope in the rule depends on the request (a key:
    /// consumer, service, instance, attributes): without one, every call
    /// is counted in the rule's own scope and no [`Keys`] are read for it.
    pub(crate) fn keyed(&self) -> bool {
        match self {
            RuleSpec::Bulkhead(b) => {
                b.key != specs::BulkheadKey::Operation || b.share.is_some() || b.by_class
            }
            RuleSpec::Limit(l) => {
                !l.parts.is_empty()
                    || matches!(l.key, specs::LimitKey::Service | specs::LimitKey::Consumer)
                    || l.share.is_some()
                    || l.by_class
            }
            RuleSpec::Fuse(_) | RuleSpec::Retry(_) => false,
        }
    }

    /// The cap on the keys the rule tracks, when it keys its calls (a
    /// limit's, a bulkhead's).
    pub(crate) fn keys_mut(&mut self) -> Option<&mut specs::KeyCap> {
        match self {
            RuleSpec::Limit(l) => Some(&mut l.keys),
            RuleSpec::Bulkhead(b) => Some(&mut b.keys),
            RuleSpec::Fuse(_) | RuleSpec::Retry(_) => None,
        }
    }

    /// The deadline the rule sets on a call (its state's
    /// [`Primitive::timeout`]).
    pub(crate) fn timeout(&self) -> Option<Duration> {
        match self {
            RuleSpec::Bulkhead(b) => b.timeout,
            RuleSpec::Limit(_) | RuleSpec::Fuse(_) | RuleSpec::Retry(_) => None,
        }
    }
}

/// The spec of one wire rule: the one place that turns a `oneof spec` into
/// a [`RuleSpec`].
pub(crate) fn spec(ctx: &Ctx<'_>, r: &proto::Rule) -> Result<RuleSpec, InvalidConfig> {
    use proto::rule::Spec;
    Ok(match &r.spec {
        Some(Spec::Bulkhead(b)) => RuleSpec::Bulkhead(bulkhead::spec(ctx, b)?),
        Some(Spec::Limit(l)) => RuleSpec::Limit(limit::spec(ctx, l)?),
        Some(Spec::Fuse(f)) => RuleSpec::Fuse(fuse::spec(ctx, f)?),
        Some(Spec::Retry(_)) if r.direction() != proto::Direction::Outbound => {
            return Err(ctx.err("a retry rule applies to outbound calls only"));
        }
        Some(Spec::Retry(x)) => RuleSpec::Retry(retry::spec(ctx, x)?),
        None => {
            return Err(ctx.err(
                "the rule has no spec: its kind is missing, or one this agent does not know (upgrade the agent)",
            ));
        }
    })
}

/// The scope one call is counted in, resolved before the decision.
#[derive(Clone, Debug)]
pub(crate) enum Scope {
    /// The rule's own (fuses; unkeyed limits and bulkheads).
    Rule,
    Limit(limit::CellRef),
    Bulkhead(bulkhead::BulkheadScope),
}

impl Scope {
    /// Whether the scope is a keyed one (an `Arc` the admission keeps).
    pub(crate) fn is_keyed(&self) -> bool {
        match self {
            Scope::Limit(c) => matches!(c, limit::CellRef::Keyed(_)),
            Scope::Bulkhead(b) => matches!(b.cell, bulkhead::CellRef::Keyed(_)),
            Scope::Rule => false,
        }
    }

    /// The bulkhead's scope in this one (`None`: the rule's own).
    #[inline]
    fn bulkhead(&self) -> Option<&bulkhead::BulkheadScope> {
        match self {
            Scope::Bulkhead(c) => Some(c),
            Scope::Rule | Scope::Limit(_) => None,
        }
    }

    /// The limit's scope in this one (`None`: the rule's own).
    #[inline]
    fn limit(&self) -> Option<&limit::CellRef> {
        match self {
            Scope::Limit(c) => Some(c),
            Scope::Rule | Scope::Bulkhead(_) => None,
        }
    }
}

/// The state of one rule: one of the primitives, enum-dispatched.
#[derive(Clone, Debug)]
pub(crate) enum State {
    Bulkhead(Arc<Bulkhead>),
    Limit(Arc<Limit>),
    Fuse(Arc<Fuse>),
    Retry(Arc<Retry>),
}

/// Calls `$method` on the primitive inside a [`State`].
macro_rules! dispatch {
    ($state:expr, $p:ident => $call:expr) => {
        match $state {
            State::Bulkhead($p) => $call,
            State::Limit($p) => $call,
            State::Fuse($p) => $call,
            State::Retry($p) => $call,
        }
    };
}

impl State {
    pub(crate) fn new(
        spec: &RuleSpec,
        name: &Arc<str>,
        events: &Events,
        cluster: Option<&ClusterStore>,
        weight: &Weight,
    ) -> Self {
        match spec {
            RuleSpec::Bulkhead(s) => State::Bulkhead(Arc::new(Bulkhead::new(s.clone()))),
            RuleSpec::Limit(s) => {
                let limit = Arc::new(Limit::new(
                    s.clone(),
                    name.clone(),
                    events.clone(),
                    cluster,
                    weight,
                ));
                limit.start();
                State::Limit(limit)
            }
            RuleSpec::Fuse(s) => {
                State::Fuse(Arc::new(Fuse::new(s.clone(), name.clone(), events.clone())))
            }
            RuleSpec::Retry(s) => State::Retry(Arc::new(Retry::new(s.clone(), name.clone()))),
        }
    }

    #[inline]
    pub(crate) fn scope(&self, keys: &Keys<'_>) -> Scope {
        match self {
            State::Bulkhead(b) => Scope::Bulkhead(Primitive::scope(&**b, keys)),
            State::Limit(l) => Scope::Limit(Primitive::scope(&**l, keys)),
            State::Fuse(f) => {
                Primitive::scope(&**f, keys);
                Scope::Rule
            }
            State::Retry(r) => {
                Primitive::scope(&**r, keys);
                Scope::Rule
            }
        }
    }

    #[inline]
    pub(crate) fn try_acquire(&self, scope: &Scope, now: Now, start: Now) -> Answer {
        match self {
            State::Bulkhead(b) => Primitive::try_acquire(&**b, scope.bulkhead(), now, start),
            State::Limit(l) => Primitive::try_acquire(&**l, scope.limit(), now, start),
            State::Fuse(f) => Primitive::try_acquire(&**f, None, now, start),
            State::Retry(r) => Primitive::try_acquire(&**r, None, now, start),
        }
    }

    /// [`State::try_acquire`] in the rule's own scope, of a decision that
    /// began `now`, and whether a grant may have something to give back
    /// ([`State::gives_back`]): one dispatch for both (issue 39).
    ///
    /// The answer goes to `then` inside the kind's own arm (issue 39: a
    /// grant's hold is then built with that kind's constants, not from an
    /// answer merged from every arm through memory).
    #[inline(always)]
    pub(crate) fn try_acquire_own<R>(
        &self,
        now: Now,
        then: impl FnOnce(Result<(Grant, bool), Answer>) -> R,
    ) -> R {
        macro_rules! own {
            ($p:expr, $gives_back:expr) => {
                match Primitive::try_acquire(&**$p, None, now, now) {
                    Answer::Granted(grant) => then(Ok((grant, $gives_back))),
                    answer => then(Err(answer)),
                }
            };
        }
        match self {
            State::Bulkhead(b) => own!(b, true),
            // A plain limit's grant is the default (issue 39: a constant);
            // its other answers go to one `then` (with two, the step's result
            // was merged through memory).
            State::Limit(l) => match l.try_acquire_own(now) {
                Ok(()) => then(Ok((Grant::default(), false))),
                Err(answer) => then(match answer {
                    Answer::Granted(grant) => Ok((grant, false)),
                    answer => Err(answer),
                }),
            },
            // A closed fuse's grant is the default (issue 39: a constant,
            // as a plain limit's).
            State::Fuse(f) => match f.try_admit(now) {
                Ok(false) => then(Ok((Grant::default(), false))),
                Ok(true) => {
                    let probe = Grant {
                        probe: true,
                        ..Grant::default()
                    };
                    then(Ok((probe, false)))
                }
                Err(()) => then(Err(f.refusal())),
            },
            State::Retry(r) => own!(r, false),
        }
    }

    pub(crate) async fn acquire(
        &self,
        scope: &Scope,
        start: Instant,
    ) -> Result<Grant, (RejectReason, Option<Duration>)> {
        match self {
            State::Bulkhead(b) => Primitive::acquire(&**b, scope.bulkhead(), start).await,
            State::Limit(l) => Primitive::acquire(&**l, scope.limit(), start).await,
            State::Fuse(f) => Primitive::acquire(&**f, None, start).await,
            State::Retry(r) => Primitive::acquire(&**r, None, start).await,
        }
    }

    #[inline]
    pub(crate) fn release(&self, scope: Option<&Scope>, grant: Grant) {
        match self {
            State::Bulkhead(b) => Primitive::release(&**b, scope.and_then(Scope::bulkhead), grant),
            State::Limit(l) => Primitive::release(&**l, scope.and_then(Scope::limit), grant),
            State::Fuse(f) => Primitive::release(&**f, None, grant),
            State::Retry(r) => Primitive::release(&**r, None, grant),
        }
    }

    /// Counts a granted call's `latency` (and a gRPC call's code) and
    /// records its outcome; with `give_back`, then gives back a plain grant
    /// ([`Grant::default`]) in the rule's own scope: one dispatch for all
    /// (issue 39: the end of a finished call's plain holds matched the kind
    /// twice; only a bulkhead's arm gives something back).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn count_and_record(
        &self,
        slot: Slot,
        latency: Latency,
        outcome: Outcome,
        grant: Grant,
        now: Now,
        elapsed_ns: u64,
        give_back: bool,
    ) {
        // Every kind's counters are at one offset (issue 39: counted before
        // the dispatch, once, not in each kind's arm).
        let counters = self.counters();
        counters.latency(slot, latency);
        if let Outcome::Grpc(code) = outcome {
            counters.grpc(slot, code);
        }
        dispatch!(self, p => {
            Primitive::record(&**p, slot, outcome, grant, now, elapsed_ns);
            if give_back {
                Primitive::release(&**p, None, Grant::default());
            }
        })
    }

    #[inline]
    pub(crate) fn add_bytes(&self, scope: Option<&Scope>, n: u64, now: Instant) {
        match self {
            State::Bulkhead(b) => {
                Primitive::add_bytes(&**b, scope.and_then(Scope::bulkhead), n, now)
            }
            State::Limit(l) => Primitive::add_bytes(&**l, scope.and_then(Scope::limit), n, now),
            State::Fuse(f) => Primitive::add_bytes(&**f, None, n, now),
            State::Retry(r) => Primitive::add_bytes(&**r, None, n, now),
        }
    }

    /// Whether a call this rule granted may have something to give back
    /// when it ends (a bulkhead's permit; a fuse's probe, told by its
    /// grant): the end of a call skips the other rules.
    #[inline]
    pub(crate) fn gives_back(&self) -> bool {
        matches!(self, State::Bulkhead(_))
    }

    /// What a call counts as when this rule, in mode shadow, would have
    /// made it wait: the refusal a failed wait gives.
    pub(crate) fn wait_refusal(&self) -> RejectReason {
        match self {
            State::Bulkhead(_) => RejectReason::BulkheadTimeout,
            State::Limit(_) => RejectReason::LimitCalls,
            State::Fuse(_) => RejectReason::FuseOpen,
            // Never asked: a retry rule never makes a call wait.
            State::Retry(_) => RejectReason::FuseOpen,
        }
    }

    /// The retry rule's policy, when this is one.
    pub(crate) fn retry(&self) -> Option<crate::RetryPolicy> {
        match self {
            State::Retry(r) => Some(retry::RetryPolicy(r.clone())),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn timeout(&self) -> Option<Duration> {
        dispatch!(self, p => Primitive::timeout(&**p))
    }

    /// The `RateLimit-Policy` and `RateLimit` items of an admitted call for
    /// this rule, when it is a limit that says `headers always`: its policy
    /// (calls, or bytes for a limit of bytes alone) and what is left to the
    /// call's key (`scope`, `None`: the rule's own counter) at `now`, when
    /// this instance knows it.
    pub(crate) fn admitted_ratelimit(
        &self,
        rule: &str,
        scope: Option<&Scope>,
        now: Now,
    ) -> Option<(String, Option<String>)> {
        let State::Limit(l) = self else { return None };
        if !l.spec.headers_always {
            return None;
        }
        let reason = if l.spec.calls.is_some() {
            RejectReason::LimitCalls
        } else {
            RejectReason::LimitBytes
        };
        let policy = self.limit_policy(reason)?;
        let cell = match scope {
            Some(Scope::Limit(r)) => l.cell(r),
            _ => l.cell(&limit::CellRef::Single),
        };
        let left = l.quota_left(cell, now);
        let secs = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
        Some(policy.items(rule, left.map(|q| q.remaining), left.map(|q| secs(q.reset))))
    }

    /// The limit a refusal for `reason` names in its `RateLimit` headers.
    pub(crate) fn limit_policy(&self, reason: RejectReason) -> Option<crate::LimitPolicy> {
        let State::Limit(l) = self else { return None };
        let bytes = reason == RejectReason::LimitBytes;
        let rate = if bytes { l.spec.bytes } else { l.spec.calls }?;
        Some(crate::LimitPolicy {
            quota: rate.amount,
            window: rate.window,
            bytes,
        })
    }

    pub(crate) fn reject_status(&self) -> StatusCode {
        dispatch!(self, p => Primitive::reject_status(&**p))
    }

    pub(crate) fn reject_grpc(&self) -> gov_proto::v1::GrpcCode {
        dispatch!(self, p => Primitive::reject_grpc(&**p))
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

#[cfg(test)]
mod tests {
    use std::mem::{align_of, offset_of};

    use super::*;

    /// Every primitive has its counters first and one alignment: at the
    /// same offset of each (issue 39: `State::counters` reads them
    /// without a match on the kind).
    #[test]
    fn counters_are_at_one_offset_in_every_primitive() {
        assert_eq!(offset_of!(Bulkhead, counters), 0);
        assert_eq!(offset_of!(Limit, counters), 0);
        assert_eq!(offset_of!(Fuse, counters), 0);
        assert_eq!(offset_of!(Retry, counters), 0);
        let align = align_of::<Bulkhead>();
        assert_eq!(align_of::<Limit>(), align);
        assert_eq!(align_of::<Fuse>(), align);
        assert_eq!(align_of::<Retry>(), align);
    }
}
