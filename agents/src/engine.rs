//! The engine: one service's rules and their live state, and the decision
//! for each request.
//!
//! The current rules and their state form one immutable `Snapshot` behind
//! an `ArcSwap`; a request takes one snapshot and sees the old rules or the
//! new, never a mix. Applying a config builds a new snapshot that reuses the
//! state of every rule that still exists with the same parameters, so a
//! reload under load keeps in-flight counts, windows and tripped fuses.
//!
//! A decision checks, in order: fuses (one atomic load when closed), limits
//! (a compare-exchange per counter), then bulkheads (a semaphore permit, the
//! only step that may wait, with shaping limits). A call is admitted only
//! when every matched rule admits it; permits taken before a later rule
//! refuses are returned at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use gov_proto::v1 as proto;
use http::{HeaderMap, Method, Request, StatusCode};
use smallvec::SmallVec;
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::bulkhead::{self, Bulkhead};
use crate::cluster::ClusterStore;
use crate::config::{
    CompiledConfig, Direction, InvalidConfig, LimitAction, LimitKey, LimitScope, RuleKind, RuleSpec,
};
use crate::events::{Event, Events};
use crate::fuse::Fuse;
use crate::limit::{self, Limit};
use crate::outcome::Outcome;
use crate::rejection::{RejectReason, Rejection};
use crate::route::{Headers, Matched, View};
use crate::stats::{Counters, FuseState, RuleStats};

/// The enforcement engine of one service. Cheap to clone (one `Arc`).
#[derive(Clone, Debug)]
pub struct Engine {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    current: ArcSwap<Snapshot>,
    events: Events,
    /// Serialises `apply` (state carry-over reads the snapshot it replaces).
    apply: Mutex<()>,
    /// Where `scope cluster` limits share their counters.
    cluster: Option<ClusterStore>,
}

/// One config and the state of each of its rules.
#[derive(Debug)]
struct Snapshot {
    config: Arc<CompiledConfig>,
    // INVARIANT: `states[i]` belongs to `config.rules[i]` and has its kind.
    states: Box<[State]>,
}

#[derive(Clone, Debug)]
enum State {
    Bulkhead(Arc<Bulkhead>),
    Limit(Arc<Limit>),
    Fuse(Arc<Fuse>),
    Timeout(Arc<TimeoutState>),
}

#[derive(Debug)]
struct TimeoutState {
    timeout: Duration,
    counters: Counters,
}

impl State {
    fn new(
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
            RuleSpec::Timeout(t) => State::Timeout(Arc::new(TimeoutState {
                timeout: *t,
                counters: Counters::default(),
            })),
        }
    }

    fn counters(&self) -> &Counters {
        match self {
            State::Bulkhead(b) => &b.counters,
            State::Limit(l) => &l.counters,
            State::Fuse(f) => &f.counters,
            State::Timeout(t) => &t.counters,
        }
    }
}

/// What the engine needs to know about a request.
#[derive(Clone, Copy, Debug)]
pub struct RequestInfo<'a> {
    /// Which listener the request came through.
    pub direction: Direction,
    pub method: &'a Method,
    /// The URI path, without the query.
    pub path: &'a str,
    /// The request headers (the consumer is read from the configured header).
    pub headers: Headers<'a>,
    /// Outbound: the called service and, once chosen, the upstream instance.
    pub target: Option<Target<'a>>,
}

/// The destination of an outbound call.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// The called service (matched by `calls to SERVICE`).
    pub service: &'a str,
    /// The upstream instance (e.g. `10.0.0.7:8080`), the key of
    /// `per instance` bulkheads. `None`: those bulkheads use one shared scope.
    pub instance: Option<&'a str>,
}

impl<'a> RequestInfo<'a> {
    /// An inbound request (server side rules).
    pub fn inbound(method: &'a Method, path: &'a str, headers: &'a HeaderMap) -> Self {
        Self {
            direction: Direction::Inbound,
            method,
            path,
            headers: Headers::Map(headers),
            target: None,
        }
    }

    /// An outbound request to `service` (client side rules).
    pub fn outbound(
        method: &'a Method,
        path: &'a str,
        headers: &'a HeaderMap,
        service: &'a str,
        instance: Option<&'a str>,
    ) -> Self {
        Self {
            direction: Direction::Outbound,
            method,
            path,
            headers: Headers::Map(headers),
            target: Some(Target { service, instance }),
        }
    }

    /// The inbound view of an `http::Request`.
    pub fn from_request<B>(req: &'a Request<B>) -> Self {
        Self::inbound(req.method(), req.uri().path(), req.headers())
    }
}

/// The result of [`Engine::try_admit`].
#[derive(Debug)]
pub enum Decision {
    Admitted(Admission),
    Rejected(Rejection),
    /// A bulkhead or a shaping limit asks the call to wait: await [`Pending::wait`].
    Wait(Pending),
}

/// One step of a decision, with the scope (key) already resolved.
#[derive(Debug)]
enum Step {
    Fuse(u32),
    Limit(u32, limit::CellRef),
    Bulkhead(u32, bulkhead::CellRef),
}

/// What an admission holds until it ends.
#[derive(Debug)]
enum Held {
    Fuse { rule: u32, probe: bool },
    Limit { rule: u32, cell: limit::CellRef },
    Bulkhead { rule: u32, cell: bulkhead::CellRef },
    Timeout { rule: u32 },
}

impl Held {
    fn rule(&self) -> u32 {
        match self {
            Held::Fuse { rule, .. }
            | Held::Limit { rule, .. }
            | Held::Bulkhead { rule, .. }
            | Held::Timeout { rule } => *rule,
        }
    }
}

type Steps = SmallVec<[Step; 4]>;

/// An admitted call. Holds its bulkhead permits until dropped; report how
/// the call ended with [`Admission::record`] (or [`Admission::finish`]) so
/// fuses and latency stats see it.
#[derive(Debug)]
#[must_use = "dropping an admission ends the call at once"]
pub struct Admission {
    /// `None` when no rule matched: nothing to hold or record.
    snap: Option<Arc<Snapshot>>,
    held: SmallVec<[Held; 4]>,
    /// When the decision began (`None` when no rule matched: no clock read).
    start: Option<Instant>,
    /// The shortest matched timeout, and the rule it came from.
    timeout: Option<(Duration, u32)>,
    has_bytes: bool,
    /// Every step passed (counted as admitted in every rule).
    admitted: bool,
    recorded: bool,
}

/// A decision that has to wait (bulkhead permit or shaping delay).
#[derive(Debug)]
#[must_use = "a pending decision does nothing unless waited for"]
pub struct Pending {
    admission: Admission,
    steps: Steps,
}

/// Summary of [`Engine::apply`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub version: Arc<str>,
    /// Rules whose state (counters, permits, fuse state) was carried over.
    pub kept: usize,
    /// Rules that start with fresh state.
    pub fresh: usize,
}

/// A command named a rule that cannot take it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, miette::Diagnostic)]
pub enum CommandError {
    #[error("no rule `{rule}` in the current config")]
    #[diagnostic(
        code(gov::agent::unknown_rule),
        help("rule names look like `service/rule`")
    )]
    UnknownRule { rule: String },
    #[error("rule `{rule}` is a {actual}, not a {expected}")]
    #[diagnostic(code(gov::agent::wrong_rule_kind))]
    WrongKind {
        rule: String,
        actual: &'static str,
        expected: &'static str,
    },
}

/// A tripped (open or half-open) fuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuseView {
    pub rule: Arc<str>,
    pub state: FuseState,
    pub reason: String,
    /// Until automatic half-open; `None` for manual recovery.
    pub remaining: Option<Duration>,
}

/// An engaged limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitView {
    pub rule: Arc<str>,
    /// Until it releases itself; `None` for manual release.
    pub remaining: Option<Duration>,
}

/// Stats of every rule of the current config.
#[derive(Clone, Debug)]
pub struct StatsSnapshot {
    pub version: Arc<str>,
    pub rules: Vec<RuleStats>,
    /// Whether the cluster store (Redis) answers; `None`: the engine has none.
    /// While it is down, `scope cluster` limits count locally.
    pub cluster_store_up: Option<bool>,
}

impl StatsSnapshot {
    /// The wire form (`gov.v1.Stats`), stamped with `at_unix_ms`.
    pub fn to_proto(&self, at_unix_ms: u64) -> proto::Stats {
        proto::Stats {
            at_unix_ms,
            version: self.version.to_string(),
            rules: self.rules.iter().map(RuleStats::to_proto).collect(),
        }
    }
}

fn kind_name(kind: RuleKind) -> &'static str {
    match kind {
        RuleKind::Bulkhead => "bulkhead",
        RuleKind::Limit => "limit",
        RuleKind::Fuse => "fuse",
        RuleKind::Timeout => "timeout",
    }
}

// === impl Engine ===

impl Engine {
    /// An engine enforcing `config`.
    ///
    /// Without a cluster store, `scope cluster` limits given to
    /// [`Engine::apply`] count locally, and [`Engine::apply_target`] refuses them.
    pub fn new(config: CompiledConfig) -> Self {
        Self::build(config, None)
    }

    /// An engine with no rules for `service` whose `scope cluster` limits
    /// share their counters through `store` (Redis). Call it inside a Tokio
    /// runtime: batched limits run a flush task.
    pub fn with_cluster_store(service: &str, store: ClusterStore) -> Self {
        Self::build(CompiledConfig::empty(service), Some(store))
    }

    fn build(config: CompiledConfig, cluster: Option<ClusterStore>) -> Self {
        let events = Events::new();
        let snapshot = Snapshot::fresh(Arc::new(config), &events, cluster.as_ref());
        Self {
            shared: Arc::new(Shared {
                current: ArcSwap::from_pointee(snapshot),
                events,
                apply: Mutex::new(()),
                cluster,
            }),
        }
    }

    /// An engine with no rules (everything is admitted) for `service`.
    pub fn empty(service: &str) -> Self {
        Self::new(CompiledConfig::empty(service))
    }

    /// The cluster store, if the engine has one.
    pub fn cluster_store(&self) -> Option<&ClusterStore> {
        self.shared.cluster.as_ref()
    }

    /// Validates and applies a wire config. On error the current config stays.
    /// `scope cluster` limits are refused when the engine has no cluster
    /// store (counting them per agent would silently multiply the quota).
    pub fn apply_target(&self, target: &proto::TargetConfig) -> Result<Applied, InvalidConfig> {
        let config = CompiledConfig::try_from(target)?;
        if self.shared.cluster.is_none()
            && let Some(rule) = config
                .rules
                .iter()
                .find(|r| matches!(&r.spec, RuleSpec::Limit(l) if l.scope != LimitScope::Local))
        {
            return Err(InvalidConfig::NoClusterStore {
                rule: rule.name.to_string(),
            });
        }
        Ok(self.apply(config))
    }

    /// Atomically replaces the config. Rules that exist in both configs with
    /// the same name, direction and parameters keep their state.
    pub fn apply(&self, config: CompiledConfig) -> Applied {
        // A poisoned lock only means another apply panicked; the swap itself is atomic.
        let _guard = self.shared.apply.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.shared.current.load_full();
        let by_name: HashMap<&str, usize> = old
            .config
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| (&*r.name, i))
            .collect();
        let mut kept = 0;
        let states: Box<[State]> = config
            .rules
            .iter()
            .map(|rule| {
                let same = by_name.get(&*rule.name).and_then(|&i| {
                    let before = &old.config.rules[i];
                    (before.spec == rule.spec && before.direction == rule.direction)
                        .then(|| old.states[i].clone())
                });
                match same {
                    Some(state) => {
                        kept += 1;
                        state
                    }
                    None => State::new(
                        &rule.spec,
                        &rule.name,
                        &self.shared.events,
                        self.shared.cluster.as_ref(),
                    ),
                }
            })
            .collect();
        let applied = Applied {
            version: config.version.clone(),
            kept,
            fresh: states.len() - kept,
        };
        self.shared.current.store(Arc::new(Snapshot {
            config: Arc::new(config),
            states,
        }));
        applied
    }

    /// The config in force.
    pub fn config(&self) -> Arc<CompiledConfig> {
        self.shared.current.load().config.clone()
    }

    /// Events (fuse tripped, limit engaged, released) from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// Decides without waiting. Does not allocate when at most
    /// [`INLINE_RULES`](crate::route::INLINE_RULES) rules match and their
    /// scopes already exist.
    pub fn try_admit(&self, req: &RequestInfo<'_>) -> Decision {
        let guard = self.shared.current.load();
        let config = &*guard.config;
        let router = match req.direction {
            Direction::Inbound => &config.inbound,
            Direction::Outbound => &config.outbound,
        };
        if router.is_empty {
            return Decision::Admitted(Admission::unmatched());
        }
        let target = req.target.map(|t| t.service);
        let view = View::new(
            req.method,
            req.path,
            req.headers,
            &config.consumer_header,
            target,
        );
        let mut matched = Matched::new();
        router.matches(&config.rules, &view, &mut matched);
        if matched.is_empty() {
            return Decision::Admitted(Admission::unmatched());
        }

        // Read the consumer only when a consumer-keyed limit needs it.
        let consumer = matched
            .iter()
            .any(|id| {
                matches!(&config.rules[id.0 as usize].spec,
                    RuleSpec::Limit(l) if l.key == LimitKey::Consumer)
            })
            .then(|| req.headers.get_str(&config.consumer_header))
            .flatten();
        let snap = Guard::into_inner(guard);
        let now = Instant::now();
        let mut steps = Steps::new();
        let mut admission = Admission {
            snap: None,
            held: SmallVec::new(),
            start: Some(now),
            timeout: None,
            has_bytes: false,
            admitted: false,
            recorded: false,
        };
        // Fuses first (cheapest, and they refuse everyone), then limits, then
        // bulkheads (the only waiting step).
        for &id in &matched {
            match &snap.states[id.0 as usize] {
                State::Fuse(_) => steps.push(Step::Fuse(id.0)),
                State::Timeout(t) => {
                    admission.shorten_timeout(t.timeout, id.0);
                    admission.held.push(Held::Timeout { rule: id.0 });
                }
                State::Limit(_) | State::Bulkhead(_) => {}
            }
        }
        for &id in &matched {
            if let State::Limit(l) = &snap.states[id.0 as usize] {
                let key = match l.spec.key {
                    LimitKey::All | LimitKey::Domain => None,
                    LimitKey::Service => target,
                    LimitKey::Consumer => consumer,
                };
                steps.push(Step::Limit(id.0, l.cell_for(key)));
            }
        }
        let instance = req.target.and_then(|t| t.instance);
        for &id in &matched {
            if let State::Bulkhead(b) = &snap.states[id.0 as usize] {
                if let Some(t) = b.spec.timeout {
                    admission.shorten_timeout(t, id.0);
                }
                steps.push(Step::Bulkhead(id.0, b.cell_for(instance, req.path)));
            }
        }
        admission.snap = Some(snap);

        let mut steps = steps.into_iter();
        while let Some(step) = steps.next() {
            match admission.step_now(step, now) {
                Ok(()) => {}
                Err(StepError::Rejected(r)) => return Decision::Rejected(r),
                Err(StepError::Wait(step, _)) => {
                    let mut rest = Steps::new();
                    rest.push(step);
                    rest.extend(steps);
                    return Decision::Wait(Pending {
                        admission,
                        steps: rest,
                    });
                }
            }
        }
        admission.complete();
        Decision::Admitted(admission)
    }

    /// Decides, waiting for a bulkhead permit or a shaping delay if the
    /// rules allow it.
    pub async fn admit(&self, req: &RequestInfo<'_>) -> Result<Admission, Rejection> {
        match self.try_admit(req) {
            Decision::Admitted(a) => Ok(a),
            Decision::Rejected(r) => Err(r),
            Decision::Wait(p) => p.wait().await,
        }
    }

    fn find(&self, rule: &str, expected: RuleKind) -> Result<State, CommandError> {
        let snap = self.shared.current.load();
        let id = snap
            .config
            .rule_id(rule)
            .ok_or_else(|| CommandError::UnknownRule { rule: rule.into() })?;
        let state = &snap.states[id.0 as usize];
        let actual = snap.config.rules[id.0 as usize].spec.kind();
        if actual != expected {
            return Err(CommandError::WrongKind {
                rule: rule.into(),
                actual: kind_name(actual),
                expected: kind_name(expected),
            });
        }
        Ok(state.clone())
    }

    /// Releases a tripped fuse (operator command). `Ok(false)`: it was closed.
    pub fn release_fuse(&self, rule: &str, who: &str) -> Result<bool, CommandError> {
        match self.find(rule, RuleKind::Fuse)? {
            State::Fuse(f) => Ok(f.release(who)),
            _ => Ok(false),
        }
    }

    /// Releases an engaged limit, every key (operator command or the control
    /// plane's timer). `Ok(false)`: it was not engaged here. A cluster limit
    /// is also released in the store, for every agent, in the background.
    pub fn release_limit(&self, rule: &str, who: &str) -> Result<bool, CommandError> {
        match self.find(rule, RuleKind::Limit)? {
            State::Limit(l) => Ok(l.release(who)),
            _ => Ok(false),
        }
    }

    /// [`Engine::release_limit`], waiting until the store has deleted the
    /// latches of a cluster limit. `Ok(true)`: it was engaged here or in the store.
    pub async fn release_limit_everywhere(
        &self,
        rule: &str,
        who: &str,
    ) -> Result<bool, CommandError> {
        match self.find(rule, RuleKind::Limit)? {
            State::Limit(l) => {
                let here = l.release(who);
                let there = l.release_shared().await.unwrap_or(0) > 0;
                Ok(here || there)
            }
            _ => Ok(false),
        }
    }

    /// Stats of every rule, in rule order. Cheap enough to take every second
    /// (atomic loads; keyed scopes are walked under a read lock).
    pub fn stats(&self) -> StatsSnapshot {
        let snap = self.shared.current.load();
        let rules = snap
            .config
            .rules
            .iter()
            .zip(&*snap.states)
            .map(|(rule, state)| {
                let mut s = state.counters().snapshot(&rule.name, rule.spec.kind());
                match state {
                    State::Bulkhead(b) => {
                        s.capacity = u64::from(b.spec.max_concurrent);
                        s.in_flight = b.in_use();
                    }
                    State::Limit(l) => {
                        s.capacity = l.spec.calls.map_or(0, |c| c.amount);
                        s.limit_engaged = l.engaged();
                    }
                    State::Fuse(f) => s.fuse = Some(f.state()),
                    State::Timeout(_) => {}
                }
                s
            })
            .collect();
        StatsSnapshot {
            version: snap.config.version.clone(),
            rules,
            cluster_store_up: self.shared.cluster.as_ref().map(ClusterStore::is_up),
        }
    }

    /// Fuses that are open or half-open now.
    pub fn tripped_fuses(&self) -> Vec<FuseView> {
        let snap = self.shared.current.load();
        snap.config
            .rules
            .iter()
            .zip(&*snap.states)
            .filter_map(|(rule, state)| match state {
                State::Fuse(f) if f.state() != FuseState::Closed => Some(FuseView {
                    rule: rule.name.clone(),
                    state: f.state(),
                    reason: f.reason(),
                    remaining: f.remaining(),
                }),
                _ => None,
            })
            .collect()
    }

    /// Limits engaged (latched) for at least one key now.
    pub fn engaged_limits(&self) -> Vec<LimitView> {
        let snap = self.shared.current.load();
        snap.config
            .rules
            .iter()
            .zip(&*snap.states)
            .filter_map(|(rule, state)| match state {
                State::Limit(l) if l.engaged() => Some(LimitView {
                    rule: rule.name.clone(),
                    remaining: l.remaining(),
                }),
                _ => None,
            })
            .collect()
    }
}

// === impl Snapshot ===

impl Snapshot {
    fn fresh(config: Arc<CompiledConfig>, events: &Events, cluster: Option<&ClusterStore>) -> Self {
        let states = config
            .rules
            .iter()
            .map(|r| State::new(&r.spec, &r.name, events, cluster))
            .collect();
        Self { config, states }
    }

    /// Counts a rejection by `rule` and builds it.
    fn reject(&self, rule: u32, reason: RejectReason, retry_after: Option<Duration>) -> Rejection {
        let state = &self.states[rule as usize];
        state.counters().reject(reason);
        let status = match (state, reason) {
            (_, RejectReason::Timeout) => StatusCode::GATEWAY_TIMEOUT,
            (State::Bulkhead(b), _) => b.spec.reject_status,
            (State::Limit(l), _) => l.spec.reject_status,
            (State::Fuse(f), _) => f.spec.reject_status,
            (State::Timeout(_), _) => StatusCode::GATEWAY_TIMEOUT,
        };
        Rejection {
            rule: self.config.rules[rule as usize].name.clone(),
            reason,
            status,
            retry_after,
        }
    }
}

enum StepError {
    Rejected(Rejection),
    /// The step may succeed after waiting (at most this long for a limit's window).
    Wait(Step, Duration),
}

// === impl Admission ===

impl Admission {
    fn unmatched() -> Self {
        Self {
            snap: None,
            held: SmallVec::new(),
            start: None,
            timeout: None,
            has_bytes: false,
            admitted: true,
            recorded: true,
        }
    }

    fn shorten_timeout(&mut self, t: Duration, rule: u32) {
        if self.timeout.is_none_or(|(current, _)| t < current) {
            self.timeout = Some((t, rule));
        }
    }

    fn snap(&self) -> Option<&Arc<Snapshot>> {
        self.snap.as_ref()
    }

    /// Runs one step without waiting.
    fn step_now(&mut self, step: Step, now: Instant) -> Result<(), StepError> {
        // Borrow the snapshot field only (no refcount traffic on the hot path).
        let Some(snap) = self.snap.as_deref() else {
            return Ok(());
        };
        match step {
            Step::Fuse(id) => {
                let State::Fuse(f) = &snap.states[id as usize] else {
                    return Ok(());
                };
                match f.try_admit(now) {
                    Ok(probe) => {
                        self.held.push(Held::Fuse { rule: id, probe });
                        Ok(())
                    }
                    // With automatic recovery, tell callers when probes start.
                    Err(()) => Err(StepError::Rejected(snap.reject(
                        id,
                        RejectReason::FuseOpen,
                        f.remaining().filter(|d| !d.is_zero()),
                    ))),
                }
            }
            Step::Limit(id, cell) => {
                let State::Limit(l) = &snap.states[id as usize] else {
                    return Ok(());
                };
                if l.remote() {
                    // `sync exact`: counted in the store, asynchronously.
                    return Err(StepError::Wait(Step::Limit(id, cell), Duration::ZERO));
                }
                match l.try_admit(l.cell(&cell), now) {
                    Ok(()) => {
                        self.has_bytes |= l.spec.bytes.is_some();
                        self.held.push(Held::Limit { rule: id, cell });
                        Ok(())
                    }
                    Err(e) => {
                        let shape = match l.spec.action {
                            LimitAction::Shape { max_delay } => {
                                !e.engaged
                                    && e.wait.is_some_and(|w| {
                                        now + w <= self.start.unwrap_or(now) + max_delay
                                    })
                            }
                            LimitAction::Reject => false,
                        };
                        if let (true, Some(wait)) = (shape, e.wait) {
                            Err(StepError::Wait(Step::Limit(id, cell), wait))
                        } else {
                            let retry = l.refuse(l.cell(&cell), e, now);
                            Err(StepError::Rejected(snap.reject(id, e.reason, retry)))
                        }
                    }
                }
            }
            Step::Bulkhead(id, cell) => {
                let State::Bulkhead(b) = &snap.states[id as usize] else {
                    return Ok(());
                };
                if b.try_acquire(b.cell(&cell)) {
                    self.held.push(Held::Bulkhead { rule: id, cell });
                    Ok(())
                } else if b.may_wait() {
                    Err(StepError::Wait(Step::Bulkhead(id, cell), b.spec.max_wait))
                } else {
                    Err(StepError::Rejected(snap.reject(
                        id,
                        RejectReason::BulkheadFull,
                        None,
                    )))
                }
            }
        }
    }

    /// Runs one step, waiting as the rule allows.
    async fn step_wait(&mut self, step: Step) -> Result<(), Rejection> {
        let Some(snap) = self.snap.clone() else {
            return Ok(());
        };
        match step {
            Step::Bulkhead(id, cell) => {
                let State::Bulkhead(b) = &snap.states[id as usize] else {
                    return Ok(());
                };
                match b.acquire(b.cell(&cell)).await {
                    Ok(()) => {
                        self.held.push(Held::Bulkhead { rule: id, cell });
                        Ok(())
                    }
                    Err(reason) => Err(snap.reject(id, reason, None)),
                }
            }
            Step::Limit(id, cell) => {
                let State::Limit(l) = &snap.states[id as usize] else {
                    return Ok(());
                };
                // A `sync exact` call in flight to the store is not "waiting".
                let _waiting = (!l.remote()).then(|| Waiting::new(&l.counters));
                loop {
                    if l.remote() {
                        let now = Instant::now();
                        match l.admit_exact(l.cell(&cell), now).await {
                            Ok(()) => {
                                self.has_bytes |= l.spec.bytes.is_some();
                                self.held.push(Held::Limit { rule: id, cell });
                                return Ok(());
                            }
                            Err(e) => {
                                let start = self.start.unwrap_or(now);
                                let shape = match l.spec.action {
                                    LimitAction::Shape { max_delay } => {
                                        !e.engaged
                                            && e.wait.is_some_and(|w| now + w <= start + max_delay)
                                    }
                                    LimitAction::Reject => false,
                                };
                                match (shape, e.wait) {
                                    (true, Some(wait)) => tokio::time::sleep(wait).await,
                                    _ => {
                                        let retry = l.refuse(l.cell(&cell), e, now);
                                        return Err(snap.reject(id, e.reason, retry));
                                    }
                                }
                            }
                        }
                        continue;
                    }
                    match self.step_now(Step::Limit(id, cell.clone()), Instant::now()) {
                        Ok(()) => return Ok(()),
                        Err(StepError::Rejected(r)) => return Err(r),
                        // Only asked when the window ends before the shaping
                        // deadline; then the call is retried in the next window.
                        Err(StepError::Wait(_, wait)) => tokio::time::sleep(wait).await,
                    }
                }
            }
            Step::Fuse(id) => self
                .step_now(Step::Fuse(id), Instant::now())
                .map_err(|e| match e {
                    StepError::Rejected(r) => r,
                    // Fuses never ask to wait.
                    StepError::Wait(..) => snap.reject(id, RejectReason::FuseOpen, None),
                }),
        }
    }

    /// Every step passed: count the call as admitted by every matched rule.
    fn complete(&mut self) {
        self.admitted = true;
        if let Some(snap) = &self.snap {
            for h in &self.held {
                snap.states[h.rule() as usize]
                    .counters()
                    .admitted
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// The deadline for this call (the shortest matched timeout), if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout.map(|(t, _)| t)
    }

    /// The version of the config this call was decided under (`None` when
    /// no rule matched). For logs: which rules let a request through.
    pub fn config_version(&self) -> Option<&str> {
        self.snap.as_deref().map(|s| &*s.config.version)
    }

    /// Whether any rule matched (an unmatched admission holds nothing).
    pub fn is_governed(&self) -> bool {
        self.snap.is_some()
    }

    /// Whether a byte limit counts this call's bytes.
    pub fn counts_bytes(&self) -> bool {
        self.has_bytes
    }

    /// Adds request or response bytes to every matched byte limit. Call it as
    /// the body streams; it never blocks.
    pub fn add_bytes(&self, n: u64) {
        if !self.has_bytes {
            return;
        }
        if let Some(snap) = self.snap() {
            add_bytes(snap, &self.held, n);
        }
    }

    /// A handle that counts bytes for this call's byte limits from another
    /// place (a request body wrapper). `None` when no byte limit matched.
    pub fn byte_meter(&self) -> Option<ByteMeter> {
        if !self.has_bytes {
            return None;
        }
        let snap = self.snap()?.clone();
        let cells = self
            .held
            .iter()
            .filter_map(|h| match h {
                Held::Limit { rule, cell } => Some((*rule, cell.clone())),
                _ => None,
            })
            .collect();
        Some(ByteMeter { snap, cells })
    }

    /// Records how the call ended (first call wins): latency for every
    /// matched rule, the outcome for fuses. Permits stay held until drop, so
    /// record at the response head and drop when the body is done.
    pub fn record(&mut self, outcome: Outcome) {
        if self.recorded {
            return;
        }
        self.recorded = true;
        let Some(snap) = self.snap.as_deref() else {
            return;
        };
        let now = Instant::now();
        let latency = now.saturating_duration_since(self.start.unwrap_or(now));
        for h in &mut self.held {
            let state = &snap.states[h.rule() as usize];
            state.counters().latency(latency);
            if let (Held::Fuse { probe, .. }, State::Fuse(f)) = (h, state) {
                f.record(outcome, *probe, now);
                // The probe has reported; dropping must not give it back.
                *probe = false;
            }
        }
    }

    /// Records the outcome and ends the call (releases its permits).
    pub fn finish(mut self, outcome: Outcome) {
        self.record(outcome);
    }

    /// The call exceeded [`Admission::timeout`]: records a timeout for fuses,
    /// counts it on the timeout's rule, and returns the 504 rejection.
    pub fn timed_out(mut self) -> Option<Rejection> {
        self.record(Outcome::Timeout);
        let (_, rule) = self.timeout?;
        Some(self.snap()?.reject(rule, RejectReason::Timeout, None))
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let Some(snap) = &self.snap else { return };
        for h in &self.held {
            let state = &snap.states[h.rule() as usize];
            // A recorded call ended in a latency bucket; count the others here.
            if self.admitted && !self.recorded {
                state.counters().end();
            }
            match (h, state) {
                (Held::Bulkhead { cell, .. }, State::Bulkhead(b)) => b.release(b.cell(cell)),
                (Held::Fuse { probe: true, .. }, State::Fuse(f)) => f.abandon_probe(),
                _ => {}
            }
        }
    }
}

fn add_bytes(snap: &Snapshot, held: &[Held], n: u64) {
    let now = Instant::now();
    for h in held {
        if let (Held::Limit { cell, .. }, State::Limit(l)) = (h, &snap.states[h.rule() as usize]) {
            l.add_bytes(l.cell(cell), n, now);
        }
    }
}

/// Counts streamed bytes for the byte limits of one admitted call.
#[derive(Clone, Debug)]
pub struct ByteMeter {
    snap: Arc<Snapshot>,
    cells: SmallVec<[(u32, limit::CellRef); 2]>,
}

impl ByteMeter {
    /// Adds `n` request or response bytes.
    pub fn add(&self, n: u64) {
        let now = Instant::now();
        for (rule, cell) in &self.cells {
            if let State::Limit(l) = &self.snap.states[*rule as usize] {
                l.add_bytes(l.cell(cell), n, now);
            }
        }
    }
}

// === impl Pending ===

impl Pending {
    /// Waits as the rules allow, then admits or rejects.
    pub async fn wait(mut self) -> Result<Admission, Rejection> {
        let steps = std::mem::take(&mut self.steps);
        for step in steps {
            self.admission.step_wait(step).await?;
        }
        self.admission.complete();
        Ok(self.admission)
    }
}

/// Counts a shaped call as waiting while it sleeps.
struct Waiting<'a>(&'a Counters);

impl<'a> Waiting<'a> {
    fn new(c: &'a Counters) -> Self {
        c.waiting.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(c)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}
