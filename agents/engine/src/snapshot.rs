//! One config and the live state of each of its rules ([`Snapshot`]), and
//! each thread's cache of the snapshots it decides with.
//!
//! Each thread caches, per engine, the snapshot it last used with the
//! engine's generation (set anew after every swap, unique in the process):
//! while the generation is unchanged, a decision routes with the cached
//! config (no shared write at all for a request no rule matches) and
//! upgrades the cached weak reference to hold the snapshot only when a rule
//! matched. The cache keeps configs
//! (plain data) alive, never rule state.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use gov_proto::v1::GrpcCode;
use http::StatusCode;

use crate::cluster::ClusterStore;
use crate::config::CompiledConfig;
use crate::events::Events;
use crate::rejection::{RejectReason, Rejection};
use crate::state::State;
use crate::stripe;
use crate::weight::Weight;

/// One config and the state of each of its rules. Cache-line aligned, so
/// that in its `Arc` the reference counts (written by every governed call)
/// and the fields every decision reads are on different lines.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct Snapshot {
    pub(crate) config: Arc<CompiledConfig>,
    // INVARIANT: `states[i]` belongs to `config.rules[i]` and has its kind.
    pub(crate) states: Box<[State]>,
    /// Whether any rule is in mode shadow: without one, a decision never
    /// reads a rule's mode.
    pub(crate) any_shadow: bool,
    /// Whether any limit says `headers always`: without one, an admitted
    /// call's response is not looked at for the `RateLimit` headers.
    pub(crate) any_headers_always: bool,
    /// The rules below 64 whose state [gives back](State::gives_back), a
    /// bit each: what a call's plain holds give back at its end (issue 39:
    /// not kept by each decision's steps).
    pub(crate) gives_back: u64,
}

impl Snapshot {
    pub(crate) fn fresh(
        config: Arc<CompiledConfig>,
        events: &Events,
        cluster: Option<&ClusterStore>,
        weight: &Weight,
    ) -> Self {
        let states = config
            .rules
            .iter()
            .map(|r| State::new(&r.spec, &r.name, events, cluster, weight))
            .collect();
        Self::new(config, states)
    }

    /// The snapshot of `config` with the state of each of its rules.
    pub(crate) fn new(config: Arc<CompiledConfig>, states: Box<[State]>) -> Self {
        let any_shadow = config.rules.iter().any(|r| r.mode.is_shadow());
        let any_headers_always = config
            .rules
            .iter()
            .any(|r| matches!(&r.spec, crate::state::RuleSpec::Limit(l) if l.headers_always));
        let gives_back = (states.iter().take(64).enumerate())
            .filter(|(_, s)| s.gives_back())
            .fold(0, |bits, (i, _)| bits | 1 << i);
        Self {
            config,
            states,
            any_shadow,
            any_headers_always,
            gives_back,
        }
    }

    /// Whether rule `rule` is in mode shadow.
    #[inline]
    pub(crate) fn is_shadow(&self, rule: u32) -> bool {
        self.any_shadow
            && self
                .config
                .rules
                .get(rule as usize)
                .is_some_and(|r| r.mode.is_shadow())
    }

    /// Counts a would-be rejection by the shadow rule `rule`.
    pub(crate) fn shadow_reject(&self, rule: u32, reason: RejectReason) {
        self.states[rule as usize]
            .counters()
            .shadow_reject(stripe::current(), reason);
    }

    /// Counts a rejection by `rule` and builds it.
    pub(crate) fn reject(
        &self,
        rule: u32,
        reason: RejectReason,
        retry_after: Option<Duration>,
    ) -> Rejection {
        let state = &self.states[rule as usize];
        state.counters().reject(stripe::current(), reason);
        let (status, grpc) = match reason {
            RejectReason::Timeout => (StatusCode::GATEWAY_TIMEOUT, GrpcCode::DeadlineExceeded),
            _ => (state.reject_status(), state.reject_grpc()),
        };
        Rejection {
            rule: self.config.rules[rule as usize].name.clone(),
            reason,
            status,
            retry_after,
            grpc,
            would_reject: Vec::new(),
            limit: state.limit_policy(reason),
            deadline: None,
        }
    }

    /// The deadline rule `rule` sets on a call.
    pub(crate) fn rule_timeout(&self, rule: u32) -> Option<Duration> {
        self.states.get(rule as usize)?.timeout()
    }
}

// === the thread cache ===

/// Engines whose snapshot one thread keeps at hand.
const CACHED_ENGINES: usize = 4;

/// One engine's current snapshot as one thread last saw it.
pub(crate) struct CachedSnapshot {
    pub(crate) engine: u64,
    /// The engine's generation when the snapshot was current: unique in
    /// the process ([`next_generation`]), so it alone finds the entry
    /// (issue 39: one compare, not one of the engine and one of the
    /// generation); 0 in an entry that caches nothing.
    pub(crate) generation: u64,
    /// The snapshot's config: plain data (rules and routers), so keeping it
    /// after a swap or after the engine is gone holds no live state. An
    /// empty entry's is [`nothing`] (issue 39: a found entry has a config,
    /// with no `Option` to test).
    pub(crate) config: Arc<CompiledConfig>,
    /// The snapshot itself, not kept alive by the cache: rule state (tasks,
    /// store connections) ends with the last admission that uses it.
    pub(crate) snap: Weak<Snapshot>,
}

/// A generation no engine had before: engines' generations are unique in
/// the process, and never 0 (an empty cache entry's).
pub(crate) fn next_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Relaxed)
}

/// The config of an empty cache entry (never routed with: no engine has
/// its generation 0).
fn nothing() -> Arc<CompiledConfig> {
    static NOTHING: OnceLock<Arc<CompiledConfig>> = OnceLock::new();
    NOTHING
        .get_or_init(|| Arc::new(CompiledConfig::empty("")))
        .clone()
}

/// Each thread's snapshots of the engines it decides for, so that a
/// decision reads one atomic (the engine's generation) instead of loading
/// the `ArcSwap`, and an unmatched request touches no shared counter.
pub(crate) struct SnapshotCache {
    entries: [CachedSnapshot; CACHED_ENGINES],
    /// The entry to replace next when an engine is not cached.
    next: usize,
}

impl Default for SnapshotCache {
    fn default() -> Self {
        Self {
            entries: std::array::from_fn(|_| CachedSnapshot {
                engine: 0,
                generation: 0,
                config: nothing(),
                snap: Weak::new(),
            }),
            next: 0,
        }
    }
}

impl SnapshotCache {
    /// The entry of `generation` (an engine's, never 0).
    #[inline]
    pub(crate) fn find(&self, generation: u64) -> Option<&CachedSnapshot> {
        self.entries.iter().find(|e| e.generation == generation)
    }

    pub(crate) fn insert(&mut self, engine: u64, generation: u64, snap: &Arc<Snapshot>) {
        let entry = CachedSnapshot {
            engine,
            generation,
            config: snap.config.clone(),
            snap: Arc::downgrade(snap),
        };
        let at = match self
            .entries
            .iter()
            .position(|e| e.generation == 0 || e.engine == engine)
        {
            Some(i) => i,
            None => {
                let i = self.next % CACHED_ENGINES;
                self.next = i + 1;
                i
            }
        };
        if let Some(slot) = self.entries.get_mut(at) {
            *slot = entry;
        }
    }
}

thread_local! {
    /// Made on a thread's first decision (its entries empty).
    pub(crate) static CACHE: RefCell<SnapshotCache> = RefCell::default();
}
