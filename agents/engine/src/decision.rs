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

use std::borrow::{Borrow, Cow};
use std::cell::Cell;
use std::sync::Arc;

use crate::admission::{Admission, Call, Pending, Plain, Step, StepError, Steps};
use crate::clock::Now;
use crate::config::{CompiledConfig, Direction};
use crate::criticality::Class;
use crate::primitive::Keys;
use crate::rejection::Rejection;
use crate::request::RequestInfo;
use crate::route::{Plan, PlanAt, Reach, Router, RuleId, View};
use crate::snapshot::Snapshot;
use crate::state::Scope;
use crate::stripe;

/// The result of [`Engine::try_admit`](crate::Engine::try_admit). Tagged
/// by a byte of its own (issue 39: without it the variant was read from a
/// niche of [`Rejection`], a dozen instructions on every decision).
#[derive(Debug)]
#[repr(u8)]
pub enum Decision {
    Admitted(Admission),
    Rejected(Rejection),
    /// A bulkhead or a shaping limit asks the call to wait: await [`Pending::wait`].
    Wait(Pending),
}

/// A [`Decision`] as the engine's out-of-line part hands it to the inlined
/// [`Engine::try_admit`](crate::Engine::try_admit): two words, returned in
/// registers (issue 39: a `Decision` holds its [`Rejection`] inline, so it
/// was returned through memory, stored by every decision and loaded again
/// by every caller).
pub(crate) enum Decided {
    Admitted(Admission),
    Wait(Pending),
    Rejected(Refused),
}

impl Decided {
    /// The decision this is.
    #[inline(always)]
    pub(crate) fn decision(self) -> Decision {
        match self {
            Self::Admitted(a) => Decision::Admitted(a),
            Self::Wait(p) => Decision::Wait(p),
            Self::Rejected(r) => Decision::Rejected(r.rejection()),
        }
    }
}

/// A refusal's [`Rejection`], in a box this thread reuses from one refusal
/// to the next: refusals (at a high rate under overload) allocate nothing
/// but the thread's first.
pub(crate) struct Refused(Box<Rejection>);

thread_local! {
    /// This thread's box of [`Refused`] between refusals. It holds the last
    /// refusal's rule name (plain data, no rule state) until the next.
    static SPARE: Cell<Option<Box<Rejection>>> = const { Cell::new(None) };
}

impl Refused {
    /// `rejection`, in this thread's spare box when it has one.
    fn new(rejection: Rejection) -> Self {
        match SPARE.try_with(Cell::take) {
            Ok(Some(mut spare)) => {
                *spare = rejection;
                Self(spare)
            }
            _ => Self(Box::new(rejection)),
        }
    }

    /// The rejection, its box kept as this thread's spare: the rule name
    /// is shared (a reference count) and the shadow rules' list taken, the
    /// rest copied, so nothing is allocated.
    #[cold]
    #[inline(never)]
    fn rejection(mut self) -> Rejection {
        let kept = &mut *self.0;
        let rejection = Rejection {
            rule: kept.rule.clone(),
            would_reject: std::mem::take(&mut kept.would_reject),
            ..*kept
        };
        let _ = SPARE.try_with(|spare| spare.set(Some(self.0)));
        rejection
    }
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

/// Where the plan of the rules of the config `shared` that `req` matches
/// is (in step order; `scratch`: where it is built when it is not the
/// compiled plan of one index entry; read it with
/// [`CompiledConfig::plan`]); `None` when no rule matched. A decision
/// gives the `Arc` where it keeps it (issue 39: in the thread cache's
/// entry or the snapshot, whose address it holds anyway; not the config's
/// own address, one more value kept across the routing).
#[inline]
pub(crate) fn route<C: Borrow<CompiledConfig>>(
    shared: &C,
    req: &RequestInfo<'_>,
    scratch: &mut Option<Plan>,
) -> Option<PlanAt> {
    let router = shared.borrow().router(req.direction);
    if router.passes_gate(&req.headers) {
        return route_past_gate(shared, req, true, scratch);
    }
    // A request only rules of its path may match is planned by the path
    // alone when they have nothing more to check (issue 39: one scan of
    // its second byte's index entries, no path filter first).
    match router.path_plan(req.path) {
        Some(at) => at,
        None => route_past_gate(shared, req, false, scratch),
    }
}

/// [`route`] of a request not planned by its path alone (`always`: it
/// passes the gate of the rules without a path). Out of line (issue 39:
/// what it reads is not kept across the path's look-up).
#[inline(never)]
fn route_past_gate<C: Borrow<CompiledConfig>>(
    shared: &C,
    req: &RequestInfo<'_>,
    always: bool,
    scratch: &mut Option<Plan>,
) -> Option<PlanAt> {
    let config = shared.borrow();
    let router = config.router(req.direction);
    // Most requests no rule matches are told so here, before their path
    // is folded or a view of them is built.
    let reach = router.reach_past_gate(req.path, always);
    if reach.nothing() {
        return None;
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
    if config.expiring {
        return live_plan(config, router, &view, reach, scratch);
    }
    router.plan(&view, reach, &config.metas, scratch)
}

/// The plan of `view` in `router` without the rules of `config` expired by
/// now, built in `scratch`: off the hot path (only a config with an
/// expiring rule reads the clock here).
#[cold]
#[inline(never)]
fn live_plan(
    config: &CompiledConfig,
    router: &Router,
    view: &View<'_>,
    reach: Reach,
    scratch: &mut Option<Plan>,
) -> Option<PlanAt> {
    let mut built = None;
    let at = router.plan(view, reach, &config.metas, &mut built)?;
    let mut plan = router.resolve(at, &built).clone();
    plan.drop_expired(&config.metas, Now::read().ns());
    let live = !plan.is_empty();
    *scratch = Some(plan);
    live.then_some(PlanAt::SCRATCH)
}

/// The criticality class of `req` by the classes `config` declares: read
/// only for a config that declares some (every bulkhead of it keys its
/// calls by class then).
#[cold]
#[inline(never)]
fn request_class(config: &CompiledConfig, req: &RequestInfo<'_>) -> Class {
    let path = matched_path(config, req);
    let view = View::new(
        req.method,
        &path,
        req.headers,
        &config.consumer_header,
        req.target.map(|t| t.service),
    );
    config.classes.of(req.direction, &view)
}

/// Whether the rules of `config` match `req` on its path folded to lower
/// case (inbound to a case-insensitive service).
#[inline]
fn folds(config: &CompiledConfig, req: &RequestInfo<'_>) -> bool {
    config.paths.case_insensitive && req.direction == Direction::Inbound
}

/// The path the rules of `config` match `req` on, and key it by: its path, or,
/// inbound to a case-insensitive service, its path folded to lower case
/// (allocates only then, and only for a path with an upper-case letter).
#[inline]
fn matched_path<'a>(config: &CompiledConfig, req: &RequestInfo<'a>) -> Cow<'a, str> {
    if folds(config, req) {
        gov_proto::path::fold_case(req.path)
    } else {
        Cow::Borrowed(req.path)
    }
}

/// The decision for a request whose matched rules of `snap` are at `at`
/// (`scratch`: the plan [`route`] was given).
#[inline]
pub(crate) fn admit_matched(
    snap: Arc<Snapshot>,
    at: PlanAt,
    scratch: &Option<Plan>,
    req: &RequestInfo<'_>,
) -> Decided {
    let config = &*snap.config;
    let plan = config.plan(at, scratch);
    let now = Now::read();
    // Worked on in its box, made an `Admission` (which ends it when
    // dropped) at every return.
    // With the shortest deadline a matched rule enforces (a shadow rule's
    // is counted, not enforced: `Admission::record`).
    let mut call = Call::take(Some(now), &plan.deadline_rule);
    // A plan some rule of which keys its calls reads the request's keys
    // first, apart (issue 39: the others build no empty keys, test none).
    if plan.keyed {
        return admit_keyed(call, snap, at, scratch, req, now);
    }
    // A step that does not pass returns with its rule (issue 39: the loop
    // keeps no count of the steps left; `not_admitted_at` finds them).
    let states = &snap.states[..];
    let mut plain = Plain::default();
    for &(_, id) in &plan.steps {
        if let Err(e) = call.step_own::<false>(&snap, states, id.0, now, &mut plain) {
            call.hold_plain(plain);
            return not_admitted_at(call, snap, at, scratch, e, id);
        }
    }
    call.hold_plain(plain);
    admitted(call, snap)
}

/// [`not_admitted`] of a plan's step `id` (a plan holds a rule once): the
/// steps after it wait too when it waits.
#[cold]
#[inline(never)]
fn not_admitted_at(
    call: Box<Call>,
    snap: Arc<Snapshot>,
    at: PlanAt,
    scratch: &Option<Plan>,
    e: StepError,
    id: RuleId,
) -> Decided {
    let rest = match e {
        StepError::Wait(_) => {
            let config = &*snap.config;
            let steps = &config.plan(at, scratch).steps;
            // `Plan::add` adds a rule not in the plan yet.
            debug_assert_eq!(steps.iter().filter(|&&(_, s)| s == id).count(), 1);
            let after = steps
                .iter()
                .position(|&(_, s)| s == id)
                .map_or(steps.len(), |i| i + 1);
            (steps[after..].iter())
                .map(|&(_, id)| step_of(&snap, config, None, id))
                .collect()
        }
        StepError::Rejected(_) => Steps::new(),
    };
    not_admitted(call, snap, e, rest)
}

/// [`admit_matched`] of a plan some rule of which keys its calls: the
/// request's keys read (the consumer only when a rule's scope needs it),
/// then each step in its scope.
fn admit_keyed(
    mut call: Box<Call>,
    snap: Arc<Snapshot>,
    at: PlanAt,
    scratch: &Option<Plan>,
    req: &RequestInfo<'_>,
    now: Now,
) -> Decided {
    let config = &*snap.config;
    let plan = config.plan(at, scratch);
    let path = matched_path(config, req);
    let keys = Keys {
        target: req.target.map(|t| t.service),
        consumer: plan
            .consumer
            .then(|| req.headers.get_str(&config.consumer_header))
            .flatten(),
        instance: req.target.and_then(|t| t.instance),
        path: &path,
        query: req.query,
        headers: req.headers,
        claims: req.claims,
        class: if config.classes.is_empty() {
            Class::default()
        } else {
            request_class(config, req)
        },
    };
    // A rule that keys no call steps in its own scope as in a plan
    // without keys (issue 39: its plain grant kept in a word, no scope
    // built or held), the others in theirs.
    let states = &snap.states[..];
    let mut plain = Plain::default();
    let mut steps = plan.steps.iter();
    while let Some(&(_, id)) = steps.next() {
        let stepped = if keys_its_calls(config, id) {
            call.step_now::<true>(&snap, step_of(&snap, config, Some(&keys), id), now)
        } else {
            call.step_own::<true>(&snap, states, id.0, now, &mut plain)
        };
        if let Err(e) = stepped {
            call.join_plain(plain);
            let rest = match e {
                StepError::Wait(_) => (steps.as_slice().iter())
                    .map(|&(_, id)| step_of(&snap, config, Some(&keys), id))
                    .collect(),
                StepError::Rejected(_) => Steps::new(),
            };
            return not_admitted(call, snap, e, rest);
        }
    }
    call.join_plain(plain);
    admitted(call, snap)
}

/// Whether rule `id` of `config` keys its calls (its scope is read from
/// the request's keys).
#[inline(always)]
fn keys_its_calls(config: &CompiledConfig, id: RuleId) -> bool {
    config.metas.get(id.0 as usize).is_some_and(|m| m.keyed)
}

/// A decision every step of which passed: the call holds its snapshot and
/// is counted as admitted by every matched rule.
#[inline(always)]
fn admitted(call: Box<Call>, snap: Arc<Snapshot>) -> Decided {
    call.count_admitted_in(&snap.states, stripe::current());
    holding(call, snap)
}

/// [`admitted`] of a call counted as admitted already: it holds its
/// snapshot.
#[inline(always)]
fn holding(mut call: Box<Call>, snap: Arc<Snapshot>) -> Decided {
    // A box is taken blank: no snapshot to drop (issue 39: not even the
    // test of it).
    debug_assert!(call.snap.is_none());
    std::mem::forget(call.snap.replace(snap));
    Decided::Admitted(Admission::of(call))
}

/// A decision whose step did not pass at once (`e`): refused (what the
/// earlier steps took is given back), or waiting with the steps left
/// (`rest`).
#[cold]
#[inline(never)]
fn not_admitted(mut call: Box<Call>, snap: Arc<Snapshot>, e: StepError, rest: Steps) -> Decided {
    call.snap = Some(snap);
    call.deciding();
    match e {
        StepError::Rejected(r) => {
            // Gives back what the earlier steps took.
            drop(Admission::of(call));
            Decided::Rejected(Refused::new(r))
        }
        StepError::Wait(waiting) => {
            let mut steps = Steps::new();
            steps.push(waiting);
            steps.extend(rest);
            Decided::Wait(Pending::new(Admission::of(call), steps))
        }
    }
}

/// The step of rule `id`: its scope by `keys` when the rule keys its calls
/// (and `keys` were read), else the rule's own.
#[inline(always)]
fn step_of(snap: &Snapshot, config: &CompiledConfig, keys: Option<&Keys<'_>>, id: RuleId) -> Step {
    Step {
        rule: id.0,
        scope: match keys {
            Some(keys) if keys_its_calls(config, id) => snap.states[id.0 as usize].scope(keys),
            _ => Scope::Rule,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gov_proto::v1::GrpcCode;
    use http::StatusCode;

    use super::*;
    use crate::Outcome;
    use crate::rejection::{RejectReason, WouldReject};

    fn rejection(rule: &str, shadow: bool) -> Rejection {
        Rejection {
            rule: rule.into(),
            reason: RejectReason::Timeout,
            status: StatusCode::TOO_MANY_REQUESTS,
            retry_after: Some(Duration::from_secs(3)),
            grpc: GrpcCode::ResourceExhausted,
            would_reject: (shadow.then(|| WouldReject {
                rule: "s/shadow".into(),
                reason: RejectReason::Timeout,
            }))
            .into_iter()
            .collect(),
            limit: None,
            deadline: None,
        }
    }

    fn rejected(decided: Decided) -> Rejection {
        match decided.decision() {
            Decision::Rejected(r) => r,
            other => panic!("not rejected: {other:?}"),
        }
    }

    /// A plan some rule of which keys its calls: a bulkhead of the rule's
    /// own scope (stepped as in a plan without keys), one keyed by instance
    /// (an inbound call has none: its grant is plain too, held by its own
    /// step) and a shared one (held aside), one permit each. However the
    /// call ends, each gives its permit back and counts it once; a refusal
    /// gives back what the steps before it took.
    #[test]
    fn a_keyed_plan_gives_back_every_rules_permit() {
        let yaml = r#"
service: order
rules:
- name: order/own
  on: {path: {kind: PATH_KIND_PREFIX, value: /k}}
  bulkhead: {max_concurrent: 1}
- name: order/by_instance
  on: {path: {kind: PATH_KIND_PREFIX, value: /k}}
  bulkhead: {key: BULKHEAD_KEY_INSTANCE, max_concurrent: 1}
- name: order/shared
  on: {path: {kind: PATH_KIND_PREFIX, value: /k}}
  bulkhead:
    max_concurrent: 1
    share: {weights: [{consumer: crm, weight: 3}], default_weight: 1}
- name: order/rate
  on: {path: {kind: PATH_KIND_PREFIX, value: /k}}
  limit: {calls: {amount: 1000, window_ms: 60000}}
"#;
        let mut target: gov_proto::v1::TargetConfig = serde_yaml::from_str(yaml).unwrap();
        gov_proto::compiled::fill(&mut target);
        let engine = crate::Engine::empty("order");
        assert!(engine.apply_target(&target).is_ok());
        let mut h = http::HeaderMap::new();
        h.insert("x-gov-consumer", http::HeaderValue::from_static("crm"));
        let get = http::Method::GET;
        let decide = || engine.try_admit(&RequestInfo::inbound(&get, "/k/1", &h));
        let in_flight = || {
            let stats = engine.stats().rules;
            (stats.iter().map(|r| r.in_flight).collect::<Vec<_>>())
                .into_iter()
                .take(3)
                .sum::<u64>()
        };
        for end in 0..3 {
            let Decision::Admitted(mut a) = decide() else {
                panic!("call {end} not admitted");
            };
            assert_eq!(in_flight(), 3);
            assert!(matches!(decide(), Decision::Rejected(_)), "one permit each");
            match end {
                0 => a.finish(Outcome::Status(200)),
                1 => {
                    a.record(Outcome::Status(200));
                    drop(a);
                }
                _ => drop(a),
            }
            assert_eq!(in_flight(), 0, "end {end}: every permit given back");
        }
        let stats = engine.stats().rules;
        for r in &stats {
            assert_eq!(r.admitted, 3, "{}", r.rule);
            // The two recorded calls, in a latency bucket once each.
            assert_eq!(r.latency.iter().sum::<u64>(), 2, "{}", r.rule);
        }
    }

    /// A refusal's rejection comes out of [`Decided`] whole, and the next
    /// refusal on the thread reuses its box (nothing allocated).
    #[test]
    fn refusals_reuse_the_threads_box() {
        let first = Refused::new(rejection("s/a", true));
        let boxed: *const Rejection = &*first.0;
        assert_eq!(rejected(Decided::Rejected(first)), rejection("s/a", true));
        let second = Refused::new(rejection("s/b", false));
        assert!(std::ptr::eq(&*second.0, boxed));
        assert_eq!(rejected(Decided::Rejected(second)), rejection("s/b", false));
    }
}
