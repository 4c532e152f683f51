//! The engine: one service's rules and their live state, and the decision
//! for each request.
//!
//! The current rules and their state form one immutable `Snapshot` behind
//! an `ArcSwap`; a request takes one snapshot and sees the old rules or the
//! new, never a mix. Applying a config builds a new snapshot that reuses the
//! state of every rule that still exists with the same parameters, so a
//! reload under load keeps in-flight counts, windows and tripped fuses.
//!
//! The decision itself is in [`crate::decision`], an admitted call's life
//! in [`crate::admission`], each rule's state behind one interface in
//! `crate::primitive`; this module owns the engine's config and its
//! commands and views (release, stats, latches).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use gov_proto::v1 as proto;
use tokio::sync::broadcast;
use tokio::time::Instant;

pub use crate::admission::{Admission, ByteMeter, Pending};
use crate::cluster::ClusterStore;
use crate::config::{
    CompiledConfig, DEFAULT_MAX_KEYS, Direction, InvalidConfig, LimitScope, RuleKind, RuleSpec,
};
use crate::decision::observed;
pub use crate::decision::{Decision, Observe};
use crate::events::{Event, Events};
use crate::judged::JudgedHeaderError;
use crate::latch::{Latch, LatchKind, Restored};
use crate::quick::MissFilter;
use crate::rejection::Rejection;
pub use crate::request::{RequestInfo, Target, VerifiedClaims};
use crate::route::Headers;
use crate::snapshot::{Snapshot, next_generation};
use crate::state::State;
use crate::state::bulkhead::Bulkhead;
use crate::stats::{FuseState, RuleStats};
use crate::weight::Weight;

mod cached;

/// The enforcement engine of one service. Cheap to clone (one `Arc`).
#[derive(Clone, Debug)]
pub struct Engine {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    current: ArcSwap<Snapshot>,
    /// Unique per engine in the process: which thread cache entry a new
    /// snapshot replaces.
    id: u64,
    /// Set anew after every swap of `current` (under `apply`), unique in the
    /// process ([`next_generation`]): a thread whose cached snapshot has
    /// this generation may use it without loading `current`.
    generation: AtomicU64,
    /// What a request must miss to match no rule of the current config,
    /// read before the thread cache (kept in step with `current` by `apply`).
    miss: MissFilter,
    events: Events,
    /// Serialises `apply` (state carry-over reads the snapshot it replaces).
    apply: Mutex<()>,
    /// The key cap of keyed rules whose policy names none.
    max_keys: AtomicU32,
    /// Where `scope cluster` limits share their counters.
    cluster: Option<ClusterStore>,
    /// The instance's slow-start weight (`scale with warmup` limits).
    weight: Weight,
    /// Calls refused because their caller's deadline was used up.
    doomed: crate::deadline::Doomed,
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

    fn build(mut config: CompiledConfig, cluster: Option<ClusterStore>) -> Self {
        config.default_max_keys(DEFAULT_MAX_KEYS);
        let events = Events::new();
        let weight = Weight::default();
        let miss = MissFilter::new(&config);
        let snapshot = Snapshot::fresh(Arc::new(config), &events, cluster.as_ref(), &weight);
        Self {
            shared: Arc::new(Shared {
                current: ArcSwap::from_pointee(snapshot),
                id: NEXT_ENGINE_ID.fetch_add(1, Relaxed),
                generation: AtomicU64::new(next_generation()),
                miss,
                events,
                apply: Mutex::new(()),
                max_keys: AtomicU32::new(DEFAULT_MAX_KEYS),
                cluster,
                weight,
                doomed: Default::default(),
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
    /// the same name, direction and parameters keep their state, whatever
    /// their mode: a rule switched between shadow and enforce keeps its
    /// windows, latches and fuse state.
    pub fn apply(&self, mut config: CompiledConfig) -> Applied {
        config.default_max_keys(self.shared.max_keys.load(Relaxed));
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
                                        &self.shared.weight,
                                    ),
                                }
                            }
                            _ => State::new(
                                &rule.spec,
                                &rule.name,
                                &self.shared.events,
                                self.shared.cluster.as_ref(),
                                &self.shared.weight,
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
        let config = Arc::new(config);
        self.shared.miss.widen(&config);
        self.shared
            .current
            .store(Arc::new(Snapshot::new(config.clone(), states)));
        // After the store: a thread that reads the new generation sees the
        // new snapshot.
        self.shared.generation.store(next_generation(), Release);
        self.shared.miss.narrow(&config);
        applied
    }

    /// The instance's slow-start weight in thousandths of a percent
    /// ([`crate::FULL_WEIGHT`] is full, the weight until told otherwise): while it is below full,
    /// limits with `scale with warmup` admit their calls amount times it,
    /// at least one call per window. The agent's warmup ramp sets it.
    pub fn set_warmup_weight(&self, milli_percent: u32) {
        self.shared.weight.set(milli_percent);
    }

    /// How many keys a keyed limit or bulkhead tracks when its policy says
    /// no `max_keys` (the agent's `--max-keys-per-rule`; 4096 unless set),
    /// from the next config applied on.
    pub fn set_max_keys_per_rule(&self, max: u32) {
        self.shared.max_keys.store(max, Relaxed);
    }

    /// The config in force.
    pub fn config(&self) -> Arc<CompiledConfig> {
        self.shared.current.load().config.clone()
    }

    /// How the service reads request paths, by the config in force (read per
    /// request, without cloning the config).
    pub fn path_reading(&self) -> gov_proto::path::Reading {
        self.shared.current.load().config.paths
    }

    /// Whether the headers the config in force judges (the consumer header,
    /// those rules match on) can reach the upstream as judged: each once,
    /// without surrounding whitespace, not spelled with `_`, not named by
    /// `connection` ([`crate::judged`]). Read per request, without cloning
    /// the config.
    pub fn check_judged(&self, headers: Headers<'_>) -> Result<(), JudgedHeaderError> {
        crate::judged::check(headers, self.shared.current.load().config.judged_headers())
    }

    /// Where the consumer comes from, by the config in force (cheap: an
    /// `Arc` for a JWT source, nothing to copy for the header).
    pub fn consumer_source(&self) -> crate::config::ConsumerSource {
        self.shared.current.load().config.consumer_source.clone()
    }

    /// Events (fuse tripped, limit engaged, released) from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// Decides without waiting. Does not allocate when at most
    /// [`INLINE_RULES`](crate::route::INLINE_RULES) rules match and their
    /// scopes already exist (and, for a matched call, this thread's free
    /// list has a box: `admission::call`).
    #[inline(always)]
    pub fn try_admit(&self, req: &RequestInfo<'_>) -> Decision {
        if self.shared.miss.misses(req) {
            return Decision::Admitted(Admission::unmatched());
        }
        self.shared.try_admit_routed(req).decision()
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

    /// [`Engine::admit`] of a call whose caller's deadline passes at
    /// `deadline` ([`crate::deadline::read`]): refused as doomed when it is
    /// used up on arrival or while the call waits, else admitted with it
    /// ([`Admission::set_caller_deadline`]).
    pub async fn admit_until(
        &self,
        req: &RequestInfo<'_>,
        deadline: Option<Instant>,
    ) -> Result<Admission, Rejection> {
        if let Some(doomed) = self.refuse_doomed(req.direction, deadline) {
            return Err(doomed);
        }
        let mut admission = match self.try_admit(req) {
            Decision::Admitted(a) => a,
            Decision::Rejected(r) => return Err(r),
            Decision::Wait(p) => self.wait_until(p, req.direction, deadline).await?,
        };
        admission.set_caller_deadline(deadline);
        Ok(admission)
    }

    /// [`Engine::admit_until`], told to `observer` when it samples the call
    /// (the decision log of both of the sidecar's proxy paths;
    /// [`crate::Govern`] tells its observer the same way). `request_bytes`:
    /// the request body's declared length, when known.
    #[inline]
    pub async fn admit_observed<O: Observe>(
        &self,
        req: &RequestInfo<'_>,
        observer: &O,
        request_bytes: Option<u64>,
        deadline: Option<Instant>,
    ) -> Result<Admission, Rejection> {
        let Some(sample) = observer.sample() else {
            return self.admit_until(req, deadline).await;
        };
        let decided = self.admit_until(req, deadline).await;
        observed(observer, sample, req, request_bytes, decided)
    }

    /// The refusal of a call of `direction` whose caller's deadline
    /// (`deadline`) is used up now, counted ([`Engine::doomed_calls`]);
    /// `None` when it is not (the clock is read only for a call with one).
    #[inline]
    pub fn refuse_doomed(
        &self,
        direction: Direction,
        deadline: Option<Instant>,
    ) -> Option<Rejection> {
        let at = deadline?;
        (Instant::now() >= at).then(|| self.shared.doomed.refuse(direction))
    }

    /// [`Pending::wait`] for at most the caller's `deadline`: a call still
    /// waiting when it passes (or admitted only as it passed) is refused as
    /// doomed, and holds no permit.
    pub async fn wait_until(
        &self,
        pending: Pending,
        direction: Direction,
        deadline: Option<Instant>,
    ) -> Result<Admission, Rejection> {
        let Some(at) = deadline else {
            return pending.wait().await;
        };
        match tokio::time::timeout_at(at, pending.wait()).await {
            Ok(Ok(admission)) => match self.refuse_doomed(direction, deadline) {
                // Its permits go back before the refusal is answered.
                Some(doomed) => {
                    drop(admission);
                    Err(doomed)
                }
                None => Ok(admission),
            },
            Ok(Err(rejection)) => Err(rejection),
            Err(_) => Err(self.shared.doomed.refuse(direction)),
        }
    }

    /// The calls of `direction` refused because their caller's deadline was
    /// used up before they were admitted (doomed work), since the start.
    pub fn doomed_calls(&self, direction: Direction) -> u64 {
        self.shared.doomed.count(direction)
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

    /// Releases an engaged limit, every key or only `key` (`Some("")`: the
    /// rule's own counter), by operator command or the control plane's
    /// timer. `Ok(false)`: it was not engaged here. A cluster limit is also
    /// released in the store, for every agent, in the background.
    pub fn release_limit(
        &self,
        rule: &str,
        key: Option<&str>,
        who: &str,
    ) -> Result<bool, CommandError> {
        match self.find(rule, RuleKind::Limit)? {
            State::Limit(l) => Ok(l.release(who, key)),
            _ => Ok(false),
        }
    }

    /// [`Engine::release_limit`], waiting until the store has deleted the
    /// latches of a cluster limit. `Ok(true)`: it was engaged here or in the store.
    pub async fn release_limit_everywhere(
        &self,
        rule: &str,
        key: Option<&str>,
        who: &str,
    ) -> Result<bool, CommandError> {
        match self.find(rule, RuleKind::Limit)? {
            State::Limit(l) => {
                let here = l.release(who, key);
                let there = l.release_shared(key).await.unwrap_or(0) > 0;
                Ok(here || there)
            }
            _ => Ok(false),
        }
    }

    /// Tells the engine that these instances (`host:port`, as in
    /// [`Target::instance`]) left their service's set of endpoints: the
    /// per-instance bulkhead scopes follow the live set (idle scopes of
    /// departed instances are dropped; busy ones when next idle and told).
    pub fn forget_instances(&self, instances: &[Arc<str>]) {
        if instances.is_empty() {
            return;
        }
        let snap = self.shared.current.load();
        for state in snap.states.iter() {
            if let State::Bulkhead(b) = state {
                b.forget_instances(instances);
            }
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
                s.shadow = rule.mode.is_shadow();
                state.stats(&mut s);
                s
            })
            .collect();
        StatsSnapshot {
            version: snap.config.version.clone(),
            rules,
            cluster_store_up: self.shared.cluster.as_ref().map(ClusterStore::is_up),
        }
    }

    /// When each windowed rule (limit, fuse) of the current config started
    /// counting: its windows are aligned to this instant. A decision log
    /// writes it so that a replay starts each rule where the live one did.
    pub fn epochs(&self) -> Vec<(Arc<str>, Instant)> {
        let snap = self.shared.current.load();
        snap.config
            .rules
            .iter()
            .zip(&*snap.states)
            .filter_map(|(rule, state)| match state {
                State::Limit(l) => Some((rule.name.clone(), l.epoch)),
                State::Fuse(f) => Some((rule.name.clone(), f.epoch)),
                _ => None,
            })
            .collect()
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

/// Engine ids (which thread cache entry a new snapshot replaces); 0 is
/// never used.
static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

#[cfg(test)]
pub(super) mod tests {
    use std::sync::atomic::Ordering::Acquire;

    use super::*;
    use http::{HeaderMap, Method};

    /// A bulkhead of two permits on `/slow` (the thread cache's tests use
    /// it too).
    pub(super) const BULKHEAD: &str = r#"
service: order
rules:
- name: order/slow_calls
  on: {path: {kind: PATH_KIND_PREFIX, value: /slow}}
  bulkhead:
    max_concurrent: 2
"#;

    pub(super) fn engine(yaml: &str) -> Engine {
        let engine = Engine::empty("order");
        let mut target: proto::TargetConfig =
            serde_yaml::from_str(yaml).expect("the test config parses");
        gov_proto::compiled::fill(&mut target);
        assert!(engine.apply_target(&target).is_ok());
        engine
    }

    pub(super) fn decide(e: &Engine, path: &str) -> Option<Admission> {
        let h = HeaderMap::new();
        match e.try_admit(&RequestInfo::inbound(&Method::GET, path, &h)) {
            Decision::Admitted(a) => Some(a),
            _ => None,
        }
    }

    #[test]
    fn a_case_insensitive_service_matches_and_keys_inbound_paths_folded() {
        let e = engine(
            r#"
service: order
paths: PATH_DIALECT_STRICT_CASE_INSENSITIVE
rules:
- name: order/admin
  on: {path: {kind: PATH_KIND_PREFIX, value: /Admin}}
  bulkhead:
    max_concurrent: 1
- name: order/out
  on: {and: {exprs: [{calls_to: inventory}, {path: {kind: PATH_KIND_EXACT, value: /items}}]}}
  direction: DIRECTION_OUTBOUND
  bulkhead:
    max_concurrent: 1
"#,
        );
        let held = decide(&e, "/ADMIN/x");
        assert!(held.as_ref().is_some_and(Admission::is_governed));
        // Every case of the path meets the rule, and its one permit.
        for path in ["/admin", "/aDmIn/y", "/Admin/"] {
            assert!(decide(&e, path).is_none(), "{path}");
        }
        assert!(decide(&e, "/other/ADMIN").is_some_and(|a| !a.is_governed()));
        drop(held);
        assert!(decide(&e, "/admin").is_some_and(|a| a.is_governed()));
        // Outbound calls go to other services: read case-sensitively.
        let h = HeaderMap::new();
        let out = |path| {
            e.try_admit(&RequestInfo::outbound(
                &Method::GET,
                path,
                &h,
                "inventory",
                None,
            ))
        };
        assert!(matches!(out("/ITEMS"), Decision::Admitted(a) if !a.is_governed()));
        assert!(matches!(out("/items"), Decision::Admitted(a) if a.is_governed()));
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

    /// Engines' generations are unique in the process and never an empty
    /// cache entry's 0 (issue 39: a thread's cache finds an entry by its
    /// generation alone): engines deciding on one thread each decide by
    /// their own rules, before and after a swap.
    #[test]
    fn engines_on_one_thread_decide_by_their_own_rules() {
        let other = BULKHEAD.replace("order/slow_calls", "order/other_calls");
        let (a, b) = (engine(BULKHEAD), engine(&other));
        let generation = |e: &Engine| e.shared.generation.load(Acquire);
        let rule = |e: &Engine| {
            let a = decide(e, "/slow").expect("admitted");
            a.rules().next().map(|(r, _)| r.to_string())
        };
        assert!(![generation(&a), generation(&b)].contains(&0));
        assert_ne!(generation(&a), generation(&b));
        for _ in 0..2 {
            assert_eq!(rule(&a).as_deref(), Some("order/slow_calls"));
            assert_eq!(rule(&b).as_deref(), Some("order/other_calls"));
        }
        // Each takes the other's rules (the configs as they were).
        let swap = |e: &Engine, yaml: &str| {
            let mut target: proto::TargetConfig = serde_yaml::from_str(yaml).unwrap();
            gov_proto::compiled::fill(&mut target);
            assert!(e.apply_target(&target).is_ok());
        };
        swap(&a, &other);
        swap(&b, BULKHEAD);
        assert_ne!(generation(&a), generation(&b));
        for _ in 0..2 {
            assert_eq!(rule(&a).as_deref(), Some("order/other_calls"));
            assert_eq!(rule(&b).as_deref(), Some("order/slow_calls"));
        }
    }

    /// A thread's first decision asks for its stripe (issue 39: a count
    /// does not), so its counts take no locked instruction.
    #[test]
    fn a_deciding_thread_counts_in_its_own_stripe() {
        let e = engine(BULKHEAD);
        std::thread::spawn(move || {
            drop(decide(&e, "/slow"));
            assert!(crate::stripe::leased());
        })
        .join()
        .unwrap();
    }

    /// The engine passes departed instances to every bulkhead, whose idle
    /// scopes of them go.
    #[tokio::test(start_paused = true)]
    async fn departed_instances_reach_every_bulkhead() {
        let e = engine(
            r#"
service: order
rules:
- name: order/per_instance
  on: {calls_to: inventory}
  direction: DIRECTION_OUTBOUND
  bulkhead: {key: BULKHEAD_KEY_INSTANCE, max_concurrent: 1}
"#,
        );
        let h = HeaderMap::new();
        for instance in ["10.0.0.1:80", "10.0.0.2:80"] {
            let info =
                RequestInfo::outbound(&Method::GET, "/stock", &h, "inventory", Some(instance));
            drop(e.admit(&info).await.unwrap());
        }
        let Ok(State::Bulkhead(b)) = e.find("order/per_instance", RuleKind::Bulkhead) else {
            panic!("no bulkhead");
        };
        assert_eq!(b.keyed_scopes(), 2);
        e.forget_instances(&["10.0.0.1:80".into()]);
        assert_eq!(b.keyed_scopes(), 1);
    }

    /// Every windowed rule (limit and fuse) has an epoch; a bulkhead has none.
    #[test]
    fn epochs_name_every_limit_and_fuse() {
        let e = engine(
            r#"
service: order
rules:
- name: order/slow_calls
  on: {path: {kind: PATH_KIND_PREFIX, value: /slow}}
  bulkhead: {max_concurrent: 2}
- name: order/pace
  on: {path: {kind: PATH_KIND_PREFIX, value: /}}
  limit: {calls: {amount: 5, window_ms: 1000}}
- name: order/errors
  on: {path: {kind: PATH_KIND_PREFIX, value: /}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_SYSTEM_ERRORS, op: COMPARE_OP_GE, count: 2, window_ms: 60000}
"#,
        );
        let names: Vec<_> = e.epochs().into_iter().map(|(rule, _)| rule).collect();
        assert_eq!(names, [Arc::from("order/pace"), Arc::from("order/errors")]);
    }

    /// Released everywhere: `true` only when it was engaged (here; with no
    /// cluster store there is nothing elsewhere), and it admits again.
    #[tokio::test(start_paused = true)]
    async fn release_everywhere_says_whether_the_limit_was_engaged() {
        let e = engine(
            r#"
service: order
rules:
- name: order/burst
  on: {path: {kind: PATH_KIND_PREFIX, value: /burst}}
  limit: {calls: {amount: 1, window_ms: 60000}, release: {after_ms: 7200000}}
"#,
        );
        let release = async || {
            e.release_limit_everywhere("order/burst", None, "test")
                .await
        };
        assert!(!release().await.unwrap(), "not engaged");
        drop(decide(&e, "/burst").unwrap());
        assert!(decide(&e, "/burst").is_none(), "engaged");
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(decide(&e, "/burst").is_none(), "latched past its window");
        assert!(release().await.unwrap());
        assert!(decide(&e, "/burst").is_some(), "released");
        assert!(!release().await.unwrap(), "not engaged any more");
    }
}
