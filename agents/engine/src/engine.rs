//! The engine: one service's rules and their live state, and the decision
//! for each request.
//!
//! The current rules and their state form one immutable `Snapshot` behind
//! an `ArcSwap`; a request takes one snapshot and sees the old rules or the
//! new, never a mix. Applying a config builds a new snapshot that reuses the
//! state of every rule that still exists with the same parameters, so a
//! reload under load keeps in-flight counts, windows and tripped fuses.
//!
//! Each thread caches, per engine, the snapshot it last used with the
//! engine's generation (bumped after every swap): while the generation is
//! unchanged, a decision routes with the cached config (no shared write at
//! all for a request no rule matches) and upgrades the cached weak reference
//! to hold the snapshot only when a rule matched. The cache keeps configs
//! (plain data) alive, never rule state.
//!
//! A decision checks, in order: fuses (one atomic load when closed), limits
//! (a compare-exchange per counter), then bulkheads (a semaphore permit, the
//! only step that may wait, with shaping limits). A call is admitted only
//! when every matched rule admits it; permits taken before a later rule
//! refuses are returned at once. Statistics (admitted, latency, rejections)
//! and fuse windows are counted in the calling thread's stripe
//! ([`crate::stripe`]), without a locked instruction; the clock is read once
//! at admission and once when the outcome is recorded.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use gov_proto::v1 as proto;
use http::{HeaderMap, Method, Request, StatusCode};
use smallvec::SmallVec;
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::bulkhead::{self, Bulkhead};
use crate::cluster::ClusterStore;
use crate::config::RuleId;
use crate::config::{
    CompiledConfig, Direction, InvalidConfig, LimitAction, LimitKey, LimitScope, RuleKind, RuleSpec,
};
use crate::events::{Event, Events};
use crate::fuse::Fuse;
use crate::latch::{Latch, LatchKind, Restored};
use crate::limit::{self, Limit};
use crate::outcome::Outcome;
use crate::rejection::{RejectReason, Rejection};
use crate::route::{Headers, Matched, View};
use crate::stats::{Counters, FuseState, RuleStats};
use crate::stripe::{self, Slot};

/// The enforcement engine of one service. Cheap to clone (one `Arc`).
#[derive(Clone, Debug)]
pub struct Engine {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    current: ArcSwap<Snapshot>,
    /// Unique per engine in the process: the key of the thread-local cache.
    id: u64,
    /// Bumped after every swap of `current` (under `apply`): a thread whose
    /// cached snapshot has this generation may use it without loading `current`.
    generation: AtomicU64,
    events: Events,
    /// Serialises `apply` (state carry-over reads the snapshot it replaces).
    apply: Mutex<()>,
    /// Where `scope cluster` limits share their counters.
    cluster: Option<ClusterStore>,
}

/// One config and the state of each of its rules. Cache-line aligned, so
/// that in its `Arc` the reference counts (written by every governed call)
/// and the fields every decision reads are on different lines.
#[derive(Debug)]
#[repr(align(64))]
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

    /// Appends the latches this state holds.
    fn latches(&self, now: Instant, now_unix_ms: u64, out: &mut Vec<Latch>) {
        match self {
            State::Fuse(f) => out.extend(f.latch(now, now_unix_ms)),
            State::Limit(l) => l.latches(now, now_unix_ms, out),
            State::Bulkhead(_) | State::Timeout(_) => {}
        }
    }

    /// Re-arms `latch` here; `None` when this state is not of its kind.
    fn restore(&self, latch: &Latch, now: Instant, now_unix_ms: u64) -> Option<Restored> {
        match (self, latch.kind) {
            (State::Fuse(f), LatchKind::Fuse) => Some(f.restore(latch, now, now_unix_ms)),
            (State::Limit(l), LatchKind::Limit) => Some(l.restore(latch, now, now_unix_ms)),
            _ => None,
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

/// What an admission holds until it ends. Eight bytes, copied whole: a
/// keyed scope (an `Arc`) is kept aside in [`Admission::keyed`].
#[derive(Clone, Copy, Debug)]
enum Held {
    Fuse {
        rule: u32,
        probe: bool,
    },
    /// `keyed`: the scope is in `Admission::keyed`, else the rule's own.
    Limit {
        rule: u32,
        keyed: bool,
    },
    Bulkhead {
        rule: u32,
        keyed: bool,
    },
    Timeout {
        rule: u32,
    },
}

/// A keyed scope an admission holds, by rule.
#[derive(Debug)]
enum Keyed {
    Limit(limit::CellRef),
    Bulkhead(bulkhead::CellRef),
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
    /// The keyed scopes of `held` (consumers, instances), by rule.
    keyed: SmallVec<[(u32, Keyed); 1]>,
    /// When the decision began (`None` when no rule matched: no clock read).
    start: Option<Instant>,
    /// The rule with the shortest matched timeout (see [`rule_timeout`]).
    timeout: Option<u32>,
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
                id: NEXT_ENGINE_ID.fetch_add(1, Relaxed),
                generation: AtomicU64::new(0),
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
        // Read once, only to carry latches over (see below).
        let (now, now_unix_ms) = (Instant::now(), crate::latch::unix_ms(SystemTime::now()));
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
                    None => {
                        let state = match (by_name.get(&*rule.name), &rule.spec) {
                            // A resized bulkhead keeps one permit pool: in-flight
                            // calls count against the new limit.
                            (Some(&i), RuleSpec::Bulkhead(spec))
                                if old.config.rules[i].direction == rule.direction =>
                            {
                                match &old.states[i] {
                                    State::Bulkhead(b) if b.can_resize_to(spec) => State::Bulkhead(
                                        Arc::new(Bulkhead::resized(spec.clone(), b)),
                                    ),
                                    _ => State::new(
                                        &rule.spec,
                                        &rule.name,
                                        &self.shared.events,
                                        self.shared.cluster.as_ref(),
                                    ),
                                }
                            }
                            _ => State::new(
                                &rule.spec,
                                &rule.name,
                                &self.shared.events,
                                self.shared.cluster.as_ref(),
                            ),
                        };
                        // A rule whose parameters changed keeps its latch: a
                        // config swap is not a release.
                        if let Some(&i) = by_name.get(&*rule.name) {
                            let mut latches = Vec::new();
                            old.states[i].latches(now, now_unix_ms, &mut latches);
                            for latch in &latches {
                                state.restore(latch, now, now_unix_ms);
                            }
                        }
                        state
                    }
                }
            })
            .collect();
        for (rule, state) in old.config.rules.iter().zip(&*old.states) {
            if config.rule_id(&rule.name).is_none() {
                let mut gone = Vec::new();
                state.latches(now, now_unix_ms, &mut gone);
                if !gone.is_empty() {
                    tracing::warn!(rule = %rule.name, "the new config removes a latched rule; its latch ends with it");
                }
            }
        }
        let applied = Applied {
            version: config.version.clone(),
            kept,
            fresh: states.len() - kept,
        };
        self.shared.current.store(Arc::new(Snapshot {
            config: Arc::new(config),
            states,
        }));
        // After the store: a thread that reads the new generation sees the
        // new snapshot.
        self.shared.generation.fetch_add(1, Release);
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
        let generation = self.shared.generation.load(Acquire);
        let mut matched = Matched::new();
        // Route with this thread's cached config; take the snapshot only if
        // a rule matched.
        let hit = CACHE.try_with(|cache| {
            let cache = cache.try_borrow().ok()?;
            let entry = cache.find(self.shared.id, generation)?;
            if !route(&entry.config, req, &mut matched) {
                return Some(None);
            }
            // `None` (the snapshot was swapped and dropped since): load it.
            entry.snap.upgrade().map(Some)
        });
        let snap = match hit {
            Ok(Some(None)) => return Decision::Admitted(Admission::unmatched()),
            Ok(Some(Some(snap))) => snap,
            _ => {
                let snap = self.shared.current.load_full();
                let _ = CACHE.try_with(|cache| {
                    if let Ok(mut cache) = cache.try_borrow_mut() {
                        cache.insert(self.shared.id, generation, &snap);
                    }
                });
                matched.clear();
                if !route(&snap.config, req, &mut matched) {
                    return Decision::Admitted(Admission::unmatched());
                }
                snap
            }
        };
        admit_matched(snap, &matched, req)
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
                actual: actual.word(),
                expected: expected.word(),
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

    /// Every latch now (tripped fuses, engaged limits by key), with
    /// wall-clock times taken from `now_unix_ms`, in rule order. For the
    /// agent's state directory and its hello; not for the request path.
    pub fn latches(&self, now_unix_ms: u64) -> Vec<Latch> {
        let snap = self.shared.current.load();
        let now = Instant::now();
        let mut out = Vec::new();
        for state in &*snap.states {
            state.latches(now, now_unix_ms, &mut out);
        }
        out
    }

    /// Re-arms a latch kept across a restart or sent by the control plane
    /// (`now_unix_ms`: the wall clock, to turn its deadline into the
    /// engine's time). Emits no event: the trip was reported when it
    /// happened, and nothing is released.
    pub fn restore_latch(&self, latch: &Latch, now_unix_ms: u64) -> Result<Restored, CommandError> {
        // Under the apply lock: an apply running now carries it over.
        let _guard = self.shared.apply.lock().unwrap_or_else(|e| e.into_inner());
        let expected = match latch.kind {
            LatchKind::Fuse => RuleKind::Fuse,
            LatchKind::Limit => RuleKind::Limit,
        };
        let state = self.find(&latch.rule, expected)?;
        Ok(state
            .restore(latch, Instant::now(), now_unix_ms)
            .unwrap_or(Restored::Held))
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

// === the decision ===

/// Engine ids (the thread-local cache's keys); 0 is never used.
static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

/// Engines whose snapshot one thread keeps at hand.
const CACHED_ENGINES: usize = 4;

/// One engine's current snapshot as one thread last saw it.
struct CachedSnapshot {
    engine: u64,
    generation: u64,
    /// The snapshot's config: plain data (rules and routers), so keeping it
    /// after a swap or after the engine is gone holds no live state.
    config: Arc<CompiledConfig>,
    /// The snapshot itself, not kept alive by the cache: rule state (tasks,
    /// store connections) ends with the last admission that uses it.
    snap: Weak<Snapshot>,
}

/// Each thread's snapshots of the engines it decides for, so that a
/// decision reads one atomic (the engine's generation) instead of loading
/// the `ArcSwap`, and an unmatched request touches no shared counter.
#[derive(Default)]
struct SnapshotCache {
    entries: [Option<CachedSnapshot>; CACHED_ENGINES],
    /// The entry to replace next when an engine is not cached.
    next: usize,
}

impl SnapshotCache {
    #[inline]
    fn find(&self, engine: u64, generation: u64) -> Option<&CachedSnapshot> {
        self.entries
            .iter()
            .flatten()
            .find(|e| e.engine == engine && e.generation == generation)
    }

    fn insert(&mut self, engine: u64, generation: u64, snap: &Arc<Snapshot>) {
        let entry = CachedSnapshot {
            engine,
            generation,
            config: snap.config.clone(),
            snap: Arc::downgrade(snap),
        };
        let at = match self
            .entries
            .iter()
            .position(|e| e.as_ref().is_none_or(|e| e.engine == engine))
        {
            Some(i) => i,
            None => {
                let i = self.next % CACHED_ENGINES;
                self.next = i + 1;
                i
            }
        };
        if let Some(slot) = self.entries.get_mut(at) {
            *slot = Some(entry);
        }
    }
}

thread_local! {
    static CACHE: RefCell<SnapshotCache> = RefCell::default();
}

/// Matches `req` against `config`; `false` when no rule matched.
#[inline]
fn route(config: &CompiledConfig, req: &RequestInfo<'_>, matched: &mut Matched) -> bool {
    let router = match req.direction {
        Direction::Inbound => &config.inbound,
        Direction::Outbound => &config.outbound,
    };
    if router.is_empty {
        return false;
    }
    let target = req.target.map(|t| t.service);
    let view = View::new(
        req.method,
        req.path,
        req.headers,
        &config.consumer_header,
        target,
    );
    router.matches(&view, matched);
    !matched.is_empty()
}

/// The decision for a request that matched the rules `matched` of `snap`.
fn admit_matched(snap: Arc<Snapshot>, matched: &Matched, req: &RequestInfo<'_>) -> Decision {
    let config = &*snap.config;
    let target = req.target.map(|t| t.service);
    let now = Instant::now();
    let mut admission = Admission {
        snap: None,
        held: SmallVec::new(),
        keyed: SmallVec::new(),
        start: Some(now),
        timeout: None,
        has_bytes: false,
        admitted: false,
        recorded: false,
    };
    // Timeouts first (they hold nothing), and whether the consumer is needed.
    let mut consumer_keyed = false;
    for &id in matched {
        match &snap.states[id.0 as usize] {
            State::Timeout(t) => {
                admission.shorten_timeout(&snap, t.timeout, id.0);
                admission.held.push(Held::Timeout { rule: id.0 });
            }
            State::Bulkhead(b) => {
                if let Some(t) = b.spec.timeout {
                    admission.shorten_timeout(&snap, t, id.0);
                }
            }
            State::Limit(l) => consumer_keyed |= l.spec.key == LimitKey::Consumer,
            State::Fuse(_) => {}
        }
    }
    // Read the consumer only when a consumer-keyed limit needs it.
    let consumer = consumer_keyed
        .then(|| req.headers.get_str(&config.consumer_header))
        .flatten();
    let instance = req.target.and_then(|t| t.instance);
    let keys = Keys {
        target,
        consumer,
        instance,
        path: req.path,
    };
    // Fuses first (cheapest, and they refuse everyone), then limits, then
    // bulkheads (the only waiting step).
    for phase in Phase::ALL {
        for (i, &id) in matched.iter().enumerate() {
            let Some(step) = phase.step(&snap.states[id.0 as usize], id, &keys) else {
                continue;
            };
            match admission.step_now(&snap, step, now) {
                Ok(()) => {}
                Err(StepError::Rejected(r)) => {
                    // Gives back what the earlier steps took.
                    admission.snap = Some(snap);
                    return Decision::Rejected(r);
                }
                Err(StepError::Wait(step, _)) => {
                    let mut rest = Steps::new();
                    rest.push(step);
                    rest.extend(remaining(&snap, matched, &keys, phase, i + 1));
                    admission.snap = Some(snap);
                    return Decision::Wait(Pending {
                        admission,
                        steps: rest,
                    });
                }
            }
        }
    }
    admission.snap = Some(snap);
    admission.complete(stripe::current());
    Decision::Admitted(admission)
}

/// What the scopes (cells) of a request's limits and bulkheads are keyed by.
struct Keys<'a> {
    target: Option<&'a str>,
    consumer: Option<&'a str>,
    instance: Option<&'a str>,
    path: &'a str,
}

/// The order of the steps of a decision.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Fuses,
    Limits,
    Bulkheads,
}

impl Phase {
    const ALL: [Phase; 3] = [Phase::Fuses, Phase::Limits, Phase::Bulkheads];

    /// The step of rule `id` in this phase, if it has one.
    #[inline]
    fn step(self, state: &State, id: RuleId, keys: &Keys<'_>) -> Option<Step> {
        match (self, state) {
            (Phase::Fuses, State::Fuse(_)) => Some(Step::Fuse(id.0)),
            (Phase::Limits, State::Limit(l)) => {
                let key = match l.spec.key {
                    LimitKey::All | LimitKey::Domain => None,
                    LimitKey::Service => keys.target,
                    LimitKey::Consumer => keys.consumer,
                };
                Some(Step::Limit(id.0, l.cell_for(key)))
            }
            (Phase::Bulkheads, State::Bulkhead(b)) => {
                Some(Step::Bulkhead(id.0, b.cell_for(keys.instance, keys.path)))
            }
            _ => None,
        }
    }
}

/// The steps after the `from`th matched rule of `phase`.
fn remaining(
    snap: &Snapshot,
    matched: &Matched,
    keys: &Keys<'_>,
    phase: Phase,
    from: usize,
) -> Steps {
    let mut steps = Steps::new();
    let later = Phase::ALL.iter().skip_while(|&&p| p != phase);
    for (n, &p) in later.enumerate() {
        let skip = if n == 0 { from } else { 0 };
        for &id in matched.iter().skip(skip) {
            steps.extend(p.step(&snap.states[id.0 as usize], id, keys));
        }
    }
    steps
}

/// The deadline rule `rule` sets: a timeout's, or a bulkhead's `timeout`.
fn rule_timeout(snap: &Snapshot, rule: u32) -> Option<Duration> {
    match snap.states.get(rule as usize)? {
        State::Timeout(t) => Some(t.timeout),
        State::Bulkhead(b) => b.spec.timeout,
        State::Limit(_) | State::Fuse(_) => None,
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
        state.counters().reject(stripe::current(), reason);
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
            keyed: SmallVec::new(),
            start: None,
            timeout: None,
            has_bytes: false,
            admitted: true,
            recorded: true,
        }
    }

    fn hold_limit(&mut self, rule: u32, cell: limit::CellRef) {
        let keyed = matches!(cell, limit::CellRef::Keyed(_));
        if keyed {
            self.keyed.push((rule, Keyed::Limit(cell)));
        }
        self.held.push(Held::Limit { rule, keyed });
    }

    fn hold_bulkhead(&mut self, rule: u32, cell: bulkhead::CellRef) {
        let keyed = matches!(cell, bulkhead::CellRef::Keyed(_));
        if keyed {
            self.keyed.push((rule, Keyed::Bulkhead(cell)));
        }
        self.held.push(Held::Bulkhead { rule, keyed });
    }

    /// The keyed limit scope held for `rule` (`None`: the rule's own).
    fn limit_cell(&self, rule: u32, keyed: bool) -> Option<&limit::CellRef> {
        if !keyed {
            return None;
        }
        self.keyed.iter().find_map(|(r, k)| match k {
            Keyed::Limit(c) if *r == rule => Some(c),
            _ => None,
        })
    }

    /// The keyed bulkhead scope held for `rule` (`None`: the rule's own).
    fn bulkhead_cell(&self, rule: u32, keyed: bool) -> Option<&bulkhead::CellRef> {
        if !keyed {
            return None;
        }
        self.keyed.iter().find_map(|(r, k)| match k {
            Keyed::Bulkhead(c) if *r == rule => Some(c),
            _ => None,
        })
    }

    fn shorten_timeout(&mut self, snap: &Snapshot, t: Duration, rule: u32) {
        let current = self.timeout.and_then(|r| rule_timeout(snap, r));
        if current.is_none_or(|current| t < current) {
            self.timeout = Some(rule);
        }
    }

    fn snap(&self) -> Option<&Arc<Snapshot>> {
        self.snap.as_ref()
    }

    /// Runs one step of a decision on `snap` without waiting.
    fn step_now(&mut self, snap: &Snapshot, step: Step, now: Instant) -> Result<(), StepError> {
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
                        self.hold_limit(id, cell);
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
                    self.hold_bulkhead(id, cell);
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
                        self.hold_bulkhead(id, cell);
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
                                self.hold_limit(id, cell);
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
                    match self.step_now(&snap, Step::Limit(id, cell.clone()), Instant::now()) {
                        Ok(()) => return Ok(()),
                        Err(StepError::Rejected(r)) => return Err(r),
                        // Only asked when the window ends before the shaping
                        // deadline; then the call is retried in the next window.
                        Err(StepError::Wait(_, wait)) => tokio::time::sleep(wait).await,
                    }
                }
            }
            Step::Fuse(id) => self
                .step_now(&snap, Step::Fuse(id), Instant::now())
                .map_err(|e| match e {
                    StepError::Rejected(r) => r,
                    // Fuses never ask to wait.
                    StepError::Wait(..) => snap.reject(id, RejectReason::FuseOpen, None),
                }),
        }
    }

    /// Every step passed: count the call as admitted by every matched rule
    /// (in the stripe of `slot`, the calling thread's).
    fn complete(&mut self, slot: Slot) {
        self.admitted = true;
        if let Some(snap) = &self.snap {
            for h in &self.held {
                snap.states[h.rule() as usize].counters().admit(slot);
            }
        }
    }

    /// The deadline for this call (the shortest matched timeout), if any.
    pub fn timeout(&self) -> Option<Duration> {
        rule_timeout(self.snap.as_deref()?, self.timeout?)
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
            let now = Instant::now();
            for h in &self.held {
                if let (&Held::Limit { rule, keyed }, State::Limit(l)) =
                    (h, &snap.states[h.rule() as usize])
                {
                    l.add_bytes(l.cell_or_single(self.limit_cell(rule, keyed)), n, now);
                }
            }
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
            .filter_map(|h| match *h {
                Held::Limit { rule, keyed } => Some((
                    rule,
                    self.limit_cell(rule, keyed)
                        .cloned()
                        .unwrap_or(limit::CellRef::Single),
                )),
                _ => None,
            })
            .collect();
        Some(ByteMeter { snap, cells })
    }

    /// Records how the call ended (first call wins): latency for every
    /// matched rule, the outcome for fuses. Permits stay held until drop, so
    /// record at the response head and drop when the body is done.
    #[inline]
    pub fn record(&mut self, outcome: Outcome) {
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
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.start.unwrap_or(now));
        for h in &mut self.held {
            let state = &snap.states[h.rule() as usize];
            state.counters().latency(slot, elapsed);
            if let (Held::Fuse { probe, .. }, State::Fuse(f)) = (h, state) {
                f.record(slot, outcome, *probe, now);
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
        let rule = self.timeout?;
        Some(self.snap()?.reject(rule, RejectReason::Timeout, None))
    }
}

impl Drop for Admission {
    #[inline]
    fn drop(&mut self) {
        if self.snap.is_some() {
            self.end();
        }
    }
}

impl Admission {
    /// Ends a governed call: returns permits and abandoned probes.
    fn end(&mut self) {
        let Some(snap) = &self.snap else { return };
        // A recorded call ended in a latency bucket; count the others here.
        let unrecorded = (self.admitted && !self.recorded).then(stripe::current);
        for h in &self.held {
            let state = &snap.states[h.rule() as usize];
            if let Some(slot) = unrecorded {
                state.counters().end(slot);
            }
            match (*h, state) {
                (Held::Bulkhead { rule, keyed }, State::Bulkhead(b)) => {
                    b.release(b.cell_or_single(self.bulkhead_cell(rule, keyed)));
                }
                (Held::Fuse { probe: true, .. }, State::Fuse(f)) => f.abandon_probe(),
                _ => {}
            }
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
        self.admission.complete(stripe::current());
        Ok(self.admission)
    }
}

/// Counts a shaped call as waiting while it sleeps.
struct Waiting<'a>(&'a Counters);

impl<'a> Waiting<'a> {
    fn new(c: &'a Counters) -> Self {
        c.waiting.fetch_add(1, Relaxed);
        Self(c)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BULKHEAD: &str = r#"
service: order
bulkheads:
- rule: order/slow_calls
  on: {path: {kind: PATH_KIND_PREFIX, value: /slow}}
  max_concurrent: 2
"#;

    fn engine(yaml: &str) -> Engine {
        let engine = Engine::empty("order");
        let target: proto::TargetConfig = serde_yaml::from_str(yaml).unwrap_or_default();
        assert!(engine.apply_target(&target).is_ok());
        engine
    }

    fn decide(e: &Engine, path: &str) -> Option<Admission> {
        let h = HeaderMap::new();
        match e.try_admit(&RequestInfo::inbound(&Method::GET, path, &h)) {
            Decision::Admitted(a) => Some(a),
            _ => None,
        }
    }

    #[test]
    fn the_thread_cache_keeps_no_rule_state_alive() {
        let e = engine(BULKHEAD);
        let a = decide(&e, "/slow");
        assert!(a.as_ref().is_some_and(Admission::is_governed));
        let Ok(State::Bulkhead(b)) = e.find("order/slow_calls", RuleKind::Bulkhead) else {
            panic!("no bulkhead");
        };
        let old = Arc::downgrade(&b);
        drop(b);
        // The rule goes away; this thread's cache still has the old config.
        e.apply(CompiledConfig::empty("order"));
        assert!(old.upgrade().is_some(), "the admission holds its snapshot");
        drop(a);
        assert!(old.upgrade().is_none(), "nothing else holds the old state");
        assert!(decide(&e, "/slow").is_some_and(|a| !a.is_governed()));
    }
}
