//! The decision for one request: route it to the rules it matches, then ask
//! each matched rule's primitive, in phase order, without waiting.
//!
//! A decision checks, in order: fuses (one atomic load when closed), limits
//! (a compare-exchange per counter), then bulkheads (a permit, the only step
//! that holds a resource another call may wait for). A call is admitted only
//! when every matched rule admits it; what earlier steps took is returned at
//! once when a later rule refuses. A step that may pass after waiting (a
//! bulkhead permit, a shaping delay, a cluster store's answer) ends the
//! decision with a [`Pending`] holding the steps left; the clock is read
//! once here and once when the outcome is recorded.

use std::borrow::Cow;
use std::sync::Arc;

use crate::admission::{Admission, Pending, Step, StepError, Steps};
use crate::clock::Now;
use crate::config::{CompiledConfig, Direction};
use crate::primitive::Keys;
use crate::rejection::Rejection;
use crate::request::RequestInfo;
use crate::route::{Plan, View};
use crate::snapshot::Snapshot;
use crate::stripe;

/// The result of [`Engine::try_admit`](crate::Engine::try_admit).
#[derive(Debug)]
pub enum Decision {
    Admitted(Admission),
    Rejected(Rejection),
    /// A bulkhead or a shaping limit asks the call to wait: await [`Pending::wait`].
    Wait(Pending),
}

/// Told of the decisions it samples: a decision log, an audit trail. Both
/// [`crate::Govern`] (given by [`crate::GovernLayer::observe`]) and
/// [`Engine::admit_observed`](crate::Engine::admit_observed) tell it; `()` (the
/// default) and `None` sample nothing, so an unobserved call pays nothing.
pub trait Observe: Clone + Send + Sync + 'static {
    /// What the observer keeps of a call between [`Observe::sample`] and the
    /// decision (when it was sampled, say).
    type Sample: Send + 'static;

    /// Before the decision: whether to observe this call (`None`: not this
    /// one; a sampling observer says so for most calls).
    fn sample(&self) -> Option<Self::Sample>;

    /// A sampled call was admitted (after any wait). `request_bytes`: the
    /// request body's declared length, when known. The observer may keep
    /// watching the call through [`Admission::on_end`].
    fn admitted(
        &self,
        sample: Self::Sample,
        info: &RequestInfo<'_>,
        request_bytes: Option<u64>,
        admission: &mut Admission,
    );

    /// A sampled call was rejected (the client gets `rejection` now).
    fn rejected(
        &self,
        sample: Self::Sample,
        info: &RequestInfo<'_>,
        request_bytes: Option<u64>,
        rejection: &Rejection,
    );
}

/// Observes nothing.
impl Observe for () {
    type Sample = std::convert::Infallible;

    #[inline]
    fn sample(&self) -> Option<Self::Sample> {
        None
    }

    fn admitted(
        &self,
        never: Self::Sample,
        _: &RequestInfo<'_>,
        _: Option<u64>,
        _: &mut Admission,
    ) {
        match never {}
    }

    fn rejected(&self, never: Self::Sample, _: &RequestInfo<'_>, _: Option<u64>, _: &Rejection) {
        match never {}
    }
}

/// An observer that may be absent (`None` samples nothing).
impl<O: Observe> Observe for Option<O> {
    type Sample = O::Sample;

    #[inline]
    fn sample(&self) -> Option<Self::Sample> {
        self.as_ref()?.sample()
    }

    fn admitted(
        &self,
        sample: Self::Sample,
        info: &RequestInfo<'_>,
        request_bytes: Option<u64>,
        admission: &mut Admission,
    ) {
        if let Some(o) = self {
            o.admitted(sample, info, request_bytes, admission);
        }
    }

    fn rejected(
        &self,
        sample: Self::Sample,
        info: &RequestInfo<'_>,
        request_bytes: Option<u64>,
        rejection: &Rejection,
    ) {
        if let Some(o) = self {
            o.rejected(sample, info, request_bytes, rejection);
        }
    }
}

/// Tells `observer` the final decision on a call it sampled, and returns it.
pub(crate) fn observed<O: Observe>(
    observer: &O,
    sample: O::Sample,
    info: &RequestInfo<'_>,
    request_bytes: Option<u64>,
    decided: Result<Admission, Rejection>,
) -> Result<Admission, Rejection> {
    match decided {
        Ok(mut admission) => {
            observer.admitted(sample, info, request_bytes, &mut admission);
            Ok(admission)
        }
        Err(rejection) => {
            observer.rejected(sample, info, request_bytes, &rejection);
            Err(rejection)
        }
    }
}

/// Matches `req` against `config` into `plan`; `false` when no rule matched.
#[inline]
pub(crate) fn route(config: &CompiledConfig, req: &RequestInfo<'_>, plan: &mut Plan) -> bool {
    let router = match req.direction {
        Direction::Inbound => &config.inbound,
        Direction::Outbound => &config.outbound,
    };
    if router.is_empty {
        return false;
    }
    let target = req.target.map(|t| t.service);
    let path = matched_path(config, req);
    let view = View::new(
        req.method,
        &path,
        req.headers,
        &config.consumer_header,
        target,
    );
    router.matches(&view, &config.metas, plan);
    if !config.classes.is_empty() {
        plan.class = config.classes.of(req.direction, &view);
    }
    if config.expiring {
        drop_expired(config, plan);
    }
    !plan.is_empty()
}

/// Leaves out of `plan` the rules of `config` expired by now: off the hot
/// path (only a config with an expiring rule reads the clock here).
#[cold]
#[inline(never)]
fn drop_expired(config: &CompiledConfig, plan: &mut Plan) {
    plan.drop_expired(&config.metas, Now::read().ns());
}

/// The path the rules of `config` match `req` on, and key it by: its path, or,
/// inbound to a case-insensitive service, its path folded to lower case
/// (allocates only then, and only for a path with an upper-case letter).
#[inline]
fn matched_path<'a>(config: &CompiledConfig, req: &RequestInfo<'a>) -> Cow<'a, str> {
    if config.paths.case_insensitive && req.direction == Direction::Inbound {
        gov_proto::path::fold_case(req.path)
    } else {
        Cow::Borrowed(req.path)
    }
}

/// The decision for a request whose matched rules of `snap` are `plan`.
pub(crate) fn admit_matched(snap: Arc<Snapshot>, plan: &Plan, req: &RequestInfo<'_>) -> Decision {
    let config = &*snap.config;
    let now = Now::read();
    let mut admission = Admission::started(now);
    // The shortest deadline a matched rule enforces (a shadow rule's is
    // counted, not enforced: `Admission::record`).
    admission.set_timeout_rule(plan.timeout.map(|(_, id)| id.0));
    // Read the consumer only when a rule's scope needs it.
    let consumer = plan
        .consumer
        .then(|| req.headers.get_str(&config.consumer_header))
        .flatten();
    let path = matched_path(config, req);
    let keys = Keys {
        target: req.target.map(|t| t.service),
        consumer,
        instance: req.target.and_then(|t| t.instance),
        path: &path,
        query: req.query,
        headers: req.headers,
        claims: req.claims,
        class: plan.class,
    };
    for (i, id) in plan.ids().enumerate() {
        let step = Step {
            rule: id.0,
            scope: snap.states[id.0 as usize].scope(&keys),
        };
        match admission.step_now(&snap, step, now) {
            Ok(()) => {}
            Err(StepError::Rejected(r)) => {
                // Gives back what the earlier steps took.
                admission.snap = Some(snap);
                return Decision::Rejected(r);
            }
            Err(StepError::Wait(step)) => {
                let mut rest = Steps::new();
                rest.push(step);
                rest.extend(plan.ids().skip(i + 1).map(|id| Step {
                    rule: id.0,
                    scope: snap.states[id.0 as usize].scope(&keys),
                }));
                admission.snap = Some(snap);
                return Decision::Wait(Pending::new(admission, rest));
            }
        }
    }
    admission.snap = Some(snap);
    admission.complete(stripe::current());
    Decision::Admitted(admission)
}
