//! Bulkheads: at most `max_concurrent` calls in flight per scope.
//!
//! A scope is the whole match (server side, per operation), or, on the client
//! side, one upstream instance or one instance+path, created lazily on first
//! use. Permits are one atomic word per scope (permits in use, waiters): the
//! fast path is a compare-exchange to take and a subtraction to return, no
//! lock. While anyone waits, new calls do not take free permits ahead of
//! them; waiters are woken one at a time in arrival order (tokio `Notify`).
//! A call that finds no permit waits at most `max_wait`, with at most
//! `max_queue` waiters per scope; else it is rejected.
//!
//! The permits of a scope are the rule's limit: `max_concurrent`, or, for
//! an adaptive bulkhead, a limit that moves between `min` and `max` with
//! the latency of the calls it admitted ([`adaptive`]), updated at record
//! time once per window, never on admit.
//!
//! A bulkhead with a queue discipline other than FIFO (`queue codel`,
//! `queue lifo`), or in a config that declares criticality, serves its
//! waiters from an ordered list instead ([`queue`]).

use std::collections::HashMap;
use std::sync::atomic::{
    AtomicU32, AtomicU64, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::{Arc, RwLock};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::clock::Now;
use crate::outcome::Outcome;
use crate::primitive::{Answer, Grant, Keys, Phase, Primitive};
use crate::rejection::RejectReason;
use crate::route::FxBuild;
use crate::state::keys::{KeyOverflow, KeyTable};
use crate::stats::Counters;
use crate::stats::RuleStats;
use crate::stripe::Slot;

pub(crate) mod adaptive;
pub(crate) mod queue;
pub(crate) mod share;
mod spec;

pub(crate) use spec::spec;
pub use spec::{BulkheadKey, BulkheadSpec};

use adaptive::Adaptive;
pub use adaptive::AdaptiveSpec;
pub use queue::QueueDiscipline;
use queue::{Permits, Waitlist};

use crate::criticality::Class;
use http::StatusCode;
use share::Share;
use std::time::Duration;

/// One waiter in the high half of `Cell::state`.
const WAITER: u64 = 1 << 32;

/// The permits of one scope. Cache-line aligned: the word every call
/// writes shares no line with the rule's read-only fields.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct Cell {
    /// Low 32 bits: permits in use; high 32 bits: calls waiting.
    // INVARIANT: a permit is taken only while permits in use < the owning
    // bulkhead's limit (an adaptive limit that shrank leaves the calls in
    // flight their permits: none is taken until they fall below it).
    state: AtomicU64,
    notify: Notify,
    waiting: AtomicU32,
    /// The waiters of an ordered bulkhead.
    ordered: Waitlist,
}

impl Cell {
    fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
            notify: Notify::new(),
            waiting: AtomicU32::new(0),
            ordered: Waitlist::default(),
        }
    }

    /// Permits in use.
    pub(crate) fn in_use(&self, _max: u32) -> u64 {
        self.state.load(Relaxed) & 0xffff_ffff
    }

    /// Takes a permit if one is free; unless `waiter`, only when nobody waits.
    /// One attempt inline, any retry out of line (issue 39: the loop's
    /// alignment padding and its back edge cost a call with no contention).
    #[inline]
    fn take(&self, max: u32, waiter: bool) -> bool {
        let current = self.state.load(Relaxed);
        if !free(current, max, waiter) {
            return false;
        }
        match self
            .state
            .compare_exchange_weak(current, current + 1, Acquire, Relaxed)
        {
            Ok(_) => true,
            Err(actual) => self.take_from(actual, max, waiter),
        }
    }

    /// [`Cell::take`] once the word moved under it (`current`: its value
    /// then), until the permit is taken or none is free.
    #[cold]
    #[inline(never)]
    fn take_from(&self, mut current: u64, max: u32, waiter: bool) -> bool {
        loop {
            if !free(current, max, waiter) {
                return false;
            }
            match self
                .state
                .compare_exchange_weak(current, current + 1, Acquire, Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }
}

/// Whether a cell whose word is `current` has a permit for a call (a
/// waiter's, with `waiter`). Unless `waiter`, the whole word below `max`
/// says both in one compare (issue 39): nobody waits (its high half is 0)
/// and a permit is free.
#[inline(always)]
fn free(current: u64, max: u32, waiter: bool) -> bool {
    if waiter {
        current & 0xffff_ffff < u64::from(max)
    } else {
        current < u64::from(max)
    }
}

/// A scope's permits as its ordered wait list sees them.
struct Pool<'a> {
    cell: &'a Cell,
    limit: &'a AtomicU32,
}

impl Permits for Pool<'_> {
    fn join(&self) {
        self.cell.state.fetch_add(WAITER, AcqRel);
    }

    fn grant(&self) -> bool {
        let max = u64::from(self.limit.load(Relaxed));
        let state = &self.cell.state;
        let mut current = state.load(Relaxed);
        while current & 0xffff_ffff < max {
            match state.compare_exchange_weak(current, current + 1 - WAITER, AcqRel, Relaxed) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
        false
    }

    fn leave(&self) {
        self.cell.state.fetch_sub(WAITER, AcqRel);
    }

    fn give_back(&self) {
        self.cell.state.fetch_sub(1, Release);
    }
}

/// Which scope of a bulkhead a call uses.
#[derive(Clone, Debug)]
pub(crate) enum CellRef {
    /// The rule's own scope (per operation, or the overflow scope).
    Single,
    Keyed(Arc<Cell>),
    /// No room for the scope, and the bulkhead says `overflow reject`.
    Full,
    /// The rule's own scope, for a call of this consumer class of its share.
    Share(share::Class),
}

/// A call's scope in a bulkhead and its criticality.
#[derive(Clone, Debug)]
pub(crate) struct BulkheadScope {
    pub(crate) cell: CellRef,
    pub(crate) class: Class,
}

#[derive(Debug, Default)]
struct InstanceEntry {
    cell: Option<Arc<Cell>>,
    paths: HashMap<Box<str>, Arc<Cell>, FxBuild>,
}

#[derive(Debug)]
// `counters` first and one alignment for every primitive: at the same
// offset of each (`state::tests`, issue 39), so `State::counters` reads
// them without a match on the kind.
#[repr(C, align(64))]
pub(crate) struct Bulkhead {
    pub(crate) counters: Counters,
    pub(crate) spec: BulkheadSpec,
    /// The permit pools, shared with the bulkhead this one resized (see
    /// [`Bulkhead::resized`]).
    single: Arc<Cell>,
    keyed: Arc<RwLock<HashMap<Box<str>, InstanceEntry, FxBuild>>>,
    table: Arc<KeyTable>,
    /// The permits of each scope now: `max_concurrent`, or the adaptive
    /// limit, which `adaptive` moves.
    limit: AtomicU32,
    adaptive: Option<Adaptive>,
    share: Option<Share>,
    /// [`BulkheadSpec::ordered`], read on every release.
    ordered: bool,
}

impl Bulkhead {
    pub(crate) fn new(spec: BulkheadSpec) -> Self {
        let adaptive = spec.adaptive.map(|a| Adaptive::new(a, None));
        Self {
            single: Arc::new(Cell::new()),
            limit: AtomicU32::new(
                adaptive
                    .as_ref()
                    .map_or(spec.max_concurrent, Adaptive::limit),
            ),
            adaptive,
            share: spec.share.as_ref().map(Share::new),
            ordered: spec.ordered(),
            spec,
            keyed: Arc::default(),
            table: Arc::default(),
            counters: Counters::default(),
        }
    }

    /// A bulkhead with new parameters over the permit pools of `before` (same
    /// scopes): calls in flight keep their permits and count against the new
    /// limit at once, so a shrink never admits above the new limit; a release
    /// by a call admitted before wakes the new bulkhead's waiters.
    /// An adaptive limit goes on from the limit and baseline it had (or
    /// from the fixed limit before, within `min..=max`).
    pub(crate) fn resized(spec: BulkheadSpec, before: &Bulkhead) -> Self {
        let adaptive = spec.adaptive.map(|a| {
            let was = match &before.adaptive {
                Some(b) => b.carried(),
                None => (before.limit(), 0.0),
            };
            Adaptive::new(a, Some(was))
        });
        Self {
            limit: AtomicU32::new(
                adaptive
                    .as_ref()
                    .map_or(spec.max_concurrent, Adaptive::limit),
            ),
            adaptive,
            share: spec.share.as_ref().map(Share::new),
            ordered: spec.ordered(),
            single: before.single.clone(),
            keyed: before.keyed.clone(),
            table: before.table.clone(),
            spec,
            counters: Counters::default(),
        }
    }

    /// Whether [`Bulkhead::resized`] can keep `self`'s pools for `spec`: the
    /// scopes are keyed the same way.
    pub(crate) fn can_resize_to(&self, spec: &BulkheadSpec) -> bool {
        self.spec.key == spec.key && self.spec.ordered() == spec.ordered()
    }

    /// The scope for a call to `instance` (outbound) at `path`.
    pub(crate) fn cell_for(&self, instance: Option<&str>, path: &str) -> CellRef {
        let Some(instance) = instance else {
            return CellRef::Single;
        };
        let path = match self.spec.key {
            BulkheadKey::Operation => return CellRef::Single,
            BulkheadKey::Instance => None,
            BulkheadKey::InstancePath => Some(path),
        };
        // Fast path: a read lock, no allocation.
        if let Ok(map) = self.keyed.read()
            && let Some(entry) = map.get(instance)
        {
            let cell = match path {
                None => entry.cell.as_ref(),
                Some(p) => entry.paths.get(p),
            };
            if let Some(cell) = cell {
                return CellRef::Keyed(cell.clone());
            }
        }
        self.insert(instance, path)
    }

    fn insert(&self, instance: &str, path: Option<&str>) -> CellRef {
        let max = self.spec.keys.max();
        let now = Instant::now();
        let count = |map: &HashMap<Box<str>, InstanceEntry, FxBuild>| -> usize {
            map.values()
                .map(|e| usize::from(e.cell.is_some()) + e.paths.len())
                .sum()
        };
        if !self.table.may_sweep(now) && self.keyed.read().is_ok_and(|m| count(&m) >= max) {
            return self.overflow();
        }
        let Ok(mut map) = self.keyed.write() else {
            return self.overflow();
        };
        if count(&map) >= max {
            // Only idle scopes go: one with a call in flight or held keeps
            // its permits counted.
            let max_c = self.spec.max_concurrent;
            let idle = |c: &Arc<Cell>| Arc::strong_count(c) == 1 && c.in_use(max_c) == 0;
            for entry in map.values_mut() {
                entry.paths.retain(|_, c| !idle(c));
                if entry.cell.as_ref().is_some_and(idle) {
                    entry.cell = None;
                }
            }
            map.retain(|_, e| e.cell.is_some() || !e.paths.is_empty());
            let n = count(&map);
            self.table.set_keys(n);
            if n >= max {
                self.table.swept_in_vain(now);
                return self.overflow();
            }
        }
        let entry = map.entry(instance.into()).or_default();
        let cell = match path {
            None => entry.cell.get_or_insert_with(|| Arc::new(Cell::new())),
            Some(p) => entry
                .paths
                .entry(p.into())
                .or_insert_with(|| Arc::new(Cell::new())),
        }
        .clone();
        self.table.set_keys(count(&map));
        CellRef::Keyed(cell)
    }

    /// A call of a scope that found no room.
    fn overflow(&self) -> CellRef {
        self.table.overflowed();
        match self.spec.keys.overflow {
            KeyOverflow::Share => CellRef::Single,
            KeyOverflow::Reject => CellRef::Full,
        }
    }

    /// Drops the idle scopes of `instances`, which left the service's set of
    /// endpoints, so that the scopes follow the live set instead of waiting
    /// for `max_keys`. A scope with a call in flight (or held by one) stays
    /// until it is idle and the next change, or eviction, drops it.
    pub(crate) fn forget_instances(&self, instances: &[Arc<str>]) {
        if self.spec.key == BulkheadKey::Operation {
            return;
        }
        let Ok(mut map) = self.keyed.write() else {
            return;
        };
        let max = self.spec.max_concurrent;
        let idle = |c: &Arc<Cell>| Arc::strong_count(c) == 1 && c.in_use(max) == 0;
        for instance in instances {
            let Some(entry) = map.get_mut(&**instance) else {
                continue;
            };
            entry.paths.retain(|_, c| !idle(c));
            if entry.cell.as_ref().is_some_and(idle) {
                entry.cell = None;
            }
            if entry.cell.is_none() && entry.paths.is_empty() {
                map.remove(&**instance);
            }
        }
        self.table.set_keys(
            map.values()
                .map(|e| usize::from(e.cell.is_some()) + e.paths.len())
                .sum(),
        );
    }

    /// Scopes kept per instance (and per instance and path).
    #[cfg(test)]
    pub(crate) fn keyed_scopes(&self) -> usize {
        self.keyed.read().map_or(0, |map| {
            map.values()
                .map(|e| usize::from(e.cell.is_some()) + e.paths.len())
                .sum()
        })
    }

    pub(crate) fn cell<'a>(&'a self, r: &'a CellRef) -> &'a Cell {
        match r {
            CellRef::Single | CellRef::Full | CellRef::Share(_) => &self.single,
            CellRef::Keyed(c) => c,
        }
    }

    /// The permits of each scope now.
    #[inline]
    pub(crate) fn limit(&self) -> u32 {
        self.limit.load(Relaxed)
    }

    /// Takes a permit if one is free now and nobody is waiting for one.
    pub(crate) fn try_take(&self, cell: &Cell) -> bool {
        cell.take(self.limit(), false)
    }

    /// Whether a call that found no permit may wait for one: not with no
    /// `max_wait`, nor with a queue of 0 (`queue 0`: no call waits).
    pub(crate) fn may_wait(&self) -> bool {
        !self.spec.max_wait.is_zero() && self.spec.max_queue != Some(0)
    }

    /// Waits at most `max_wait` for a permit (bounded by `max_queue` waiters).
    #[cfg(test)]
    pub(crate) async fn wait_for(&self, cell: &Cell) -> Result<(), RejectReason> {
        self.wait_as(cell, Class::Default).await
    }

    /// [`Bulkhead::wait_for`] for a call of `class`.
    pub(crate) async fn wait_as(&self, cell: &Cell, class: Class) -> Result<(), RejectReason> {
        if self.try_take(cell) {
            return Ok(());
        }
        if !self.may_wait() || class == Class::Sheddable {
            return Err(RejectReason::BulkheadFull);
        }
        if self.ordered {
            let _waiting = crate::primitive::Waiting::new(&self.counters);
            let rules = queue::Rules {
                discipline: self.spec.queue,
                max_wait: self.spec.max_wait,
                max_queue: self.spec.max_queue,
            };
            let pool = Pool {
                cell,
                limit: &self.limit,
            };
            return cell.ordered.wait(pool, class, rules).await;
        }
        let deadline = Instant::now() + self.spec.max_wait;
        let waiters = cell.waiting.fetch_add(1, Relaxed);
        let mut queued = Queued {
            cell,
            counters: &self.counters,
            limit: &self.limit,
            registered: false,
        };
        self.counters.waiting.fetch_add(1, Relaxed);
        if self.spec.max_queue.is_some_and(|max| waiters >= max) {
            return Err(RejectReason::BulkheadFull);
        }
        let before = cell.state.fetch_add(WAITER, AcqRel);
        queued.registered = true;
        // Behind older waiters: a permit free now is being handed to one of
        // them, so wait for our turn instead of taking it.
        let mut behind = before >> 32 > 0;
        loop {
            // Register for a wake-up before looking, so a release in between
            // is not missed.
            let notified = cell.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !behind && cell.take(self.limit(), true) {
                return Ok(());
            }
            behind = false;
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(RejectReason::BulkheadTimeout);
            }
        }
    }

    /// Returns a permit taken by `try_take` or `wait_for`: inline, and all
    /// a permit no call waits for costs (issue 39).
    #[inline]
    pub(crate) fn give(&self, cell: &Cell) {
        let before = cell.state.fetch_sub(1, Release);
        if before >> 32 > 0 {
            self.wake(cell);
        }
    }

    /// A permit came back to `cell` while calls wait for one.
    #[cold]
    #[inline(never)]
    fn wake(&self, cell: &Cell) {
        if !self.ordered {
            cell.notify.notify_one();
            return;
        }
        let pool = Pool {
            cell,
            limit: &self.limit,
        };
        cell.ordered.dispatch(&pool, self.spec.queue);
    }

    /// Permits in use over every scope.
    pub(crate) fn in_use(&self) -> u64 {
        let max = self.spec.max_concurrent;
        let mut n = self.single.in_use(max);
        if let Ok(map) = self.keyed.read() {
            for e in map.values() {
                n += e.cell.as_ref().map_or(0, |c| c.in_use(max));
                n += e.paths.values().map(|c| c.in_use(max)).sum::<u64>();
            }
        }
        n
    }
}

/// Counts a waiter for as long as it waits (also when the wait is cancelled).
struct Queued<'a> {
    cell: &'a Cell,
    counters: &'a Counters,
    /// The bulkhead's limit, read when the waiter leaves.
    limit: &'a AtomicU32,
    /// Counted in `Cell::state`.
    registered: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.cell.waiting.fetch_sub(1, Relaxed);
        self.counters.waiting.fetch_sub(1, Relaxed);
        if self.registered {
            let after = self.cell.state.fetch_sub(WAITER, AcqRel) - WAITER;
            // This waiter may have consumed a wake-up meant for a free permit
            // (then timed out or was cancelled): pass it on.
            if after >> 32 > 0 && after & 0xffff_ffff < u64::from(self.limit.load(Relaxed)) {
                self.cell.notify.notify_one();
            }
        }
    }
}

// === impl Primitive ===

impl Primitive for Bulkhead {
    const PHASE: Phase = Phase::Bulkheads;

    type Scope = BulkheadScope;

    #[inline]
    fn scope(&self, keys: &Keys<'_>) -> BulkheadScope {
        let cell = match &self.share {
            Some(s) => CellRef::Share(s.class(keys.consumer)),
            None => self.cell_for(keys.instance, keys.path),
        };
        BulkheadScope {
            cell,
            class: keys.class,
        }
    }

    #[inline]
    fn try_acquire(&self, scope: Option<&BulkheadScope>, _now: Now, _start: Now) -> Answer {
        if let Some(BulkheadScope {
            cell: CellRef::Full,
            ..
        }) = scope
        {
            return Answer::Refused(RejectReason::BulkheadFull, None);
        }
        let class = scope.map_or(Class::Default, |s| s.class);
        if let Some((s, share)) = self.shared(scope) {
            if s.try_take(&self.pool(), share) {
                return Answer::Granted(shared_grant(share));
            }
        } else if self.try_take(self.scope_cell(scope)) {
            return Answer::Granted(Grant::default());
        }
        if self.may_wait() && class != Class::Sheddable {
            Answer::Wait(self.spec.max_wait)
        } else {
            Answer::Refused(RejectReason::BulkheadFull, None)
        }
    }

    async fn acquire(
        &self,
        scope: Option<&BulkheadScope>,
        _start: Instant,
    ) -> Result<Grant, (RejectReason, Option<Duration>)> {
        let class = match scope {
            Some(BulkheadScope {
                cell: CellRef::Full,
                ..
            }) => return Err((RejectReason::BulkheadFull, None)),
            Some(s) => s.class,
            None => Class::Default,
        };
        if let Some((s, share)) = self.shared(scope) {
            if class == Class::Sheddable {
                // Never waits: a permit free now, or a refusal.
                return match s.try_take(&self.pool(), share) {
                    true => Ok(shared_grant(share)),
                    false => Err((RejectReason::BulkheadFull, None)),
                };
            }
            let (wait, queue) = (self.spec.max_wait, self.spec.max_queue);
            return match s.wait(&self.pool(), share, wait, queue).await {
                Ok(()) => Ok(shared_grant(share)),
                Err(reason) => Err((reason, None)),
            };
        }
        match self.wait_as(self.scope_cell(scope), class).await {
            Ok(()) => Ok(Grant::default()),
            Err(reason) => Err((reason, None)),
        }
    }

    #[inline]
    fn release(&self, scope: Option<&BulkheadScope>, grant: Grant) {
        // The class rides on the grant: the admission keeps no scope of the
        // rule's own pool.
        match (&self.share, grant.share_class) {
            (Some(s), Some(class)) => s.release(&self.pool(), class),
            _ => self.give(self.scope_cell(scope)),
        }
    }

    #[inline]
    fn record(&self, _slot: Slot, _outcome: Outcome, _grant: Grant, now: Now, elapsed_ns: u64) {
        if let Some(a) = &self.adaptive {
            a.sample(&self.limit, elapsed_ns, now);
        }
    }

    fn timeout(&self) -> Option<Duration> {
        self.spec.timeout
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
        stats.capacity = u64::from(self.limit());
        stats.in_flight = self.in_use();
        (stats.keys, stats.keys_overflowed) = self.table.counts();
    }
}

/// The grant of a permit of a share's class.
#[inline]
fn shared_grant(class: share::Class) -> Grant {
    Grant {
        share_class: Some(class),
        ..Grant::default()
    }
}

impl Bulkhead {
    /// The cell of `scope` (`None`: the rule's own).
    #[inline]
    fn scope_cell<'a>(&'a self, scope: Option<&'a BulkheadScope>) -> &'a Cell {
        match scope {
            Some(s) => self.cell(&s.cell),
            None => &self.single,
        }
    }

    /// The share and the class of a call of `scope`, with a share.
    #[inline]
    fn shared<'a>(&'a self, scope: Option<&BulkheadScope>) -> Option<(&'a Share, share::Class)> {
        match (scope.map(|s| &s.cell), &self.share) {
            (Some(CellRef::Share(class)), Some(s)) => Some((s, *class)),
            _ => None,
        }
    }

    /// The rule's own pool, as its share sees it.
    fn pool(&self) -> share::Pool<'_> {
        share::Pool {
            state: &self.single.state,
            notify: &self.single.notify,
            waiting: &self.single.waiting,
            gauge: &self.counters.waiting,
            limit: &self.limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::StatusCode;
    use tokio::time::Instant;

    use super::*;
    use crate::state::keys::KeyCap;
    const MAX_KEYS: usize = crate::state::keys::DEFAULT_MAX_KEYS as usize;

    fn bulkhead(max: u32, wait_ms: u64, queue: Option<u32>, key: BulkheadKey) -> Arc<Bulkhead> {
        Arc::new(Bulkhead::new(BulkheadSpec {
            key,
            max_concurrent: max,
            max_wait: Duration::from_millis(wait_ms),
            max_queue: queue,
            timeout: None,
            reject_status: StatusCode::REQUEST_TIMEOUT,
            reject_grpc: gov_proto::v1::GrpcCode::Unavailable,
            keys: KeyCap::default(),
            adaptive: None,
            share: None,
            queue: QueueDiscipline::Fifo,
            by_class: false,
        }))
    }

    /// A permit is taken as "permits in use below the limit, and nobody
    /// waits unless a waiter takes it" says, whatever the word (issue 39:
    /// a call that is no waiter compares the whole word).
    #[test]
    fn a_permit_is_taken_while_one_is_free_and_nobody_waits() {
        let halves = [0, 1, 2, 9, 10, 11, 0x7fff_ffff, 0xffff_fffe, 0xffff_ffff];
        for max in [0, 1, 10, u32::MAX - 1, u32::MAX] {
            for waiters in halves {
                for in_use in halves {
                    for waiter in [false, true] {
                        let word = (waiters << 32) | in_use;
                        let cell = Cell::new();
                        cell.state.store(word, Relaxed);
                        let free = in_use < u64::from(max) && (waiter || waiters == 0);
                        let ctx = format!("{waiters} waiting, {in_use} of {max}, {waiter}");
                        assert_eq!(cell.take(max, waiter), free, "{ctx}");
                        let after = if free { word + 1 } else { word };
                        assert_eq!(cell.state.load(Relaxed), after, "{ctx}");
                        // The retry out of line decides as `take` on the
                        // word a failed exchange read, and on the word as
                        // it is when it moved again since.
                        for seen in [word, word ^ 1] {
                            if seen != word && !super::free(seen, max, waiter) {
                                continue;
                            }
                            cell.state.store(word, Relaxed);
                            assert_eq!(cell.take_from(seen, max, waiter), free, "{ctx}");
                            assert_eq!(cell.state.load(Relaxed), after, "{ctx}");
                        }
                    }
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn fail_fast_without_wait() {
        let b = bulkhead(2, 0, None, BulkheadKey::Operation);
        let c = CellRef::Single;
        assert!(b.wait_for(b.cell(&c)).await.is_ok());
        assert!(b.wait_for(b.cell(&c)).await.is_ok());
        assert_eq!(
            b.wait_for(b.cell(&c)).await,
            Err(RejectReason::BulkheadFull)
        );
        assert_eq!(b.in_use(), 2);
        b.give(b.cell(&c));
        assert!(b.wait_for(b.cell(&c)).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn waits_at_most_max_wait() {
        let b = bulkhead(1, 50, None, BulkheadKey::Operation);
        assert!(b.try_take(b.cell(&CellRef::Single)));
        let start = Instant::now();
        assert_eq!(
            b.wait_for(b.cell(&CellRef::Single)).await,
            Err(RejectReason::BulkheadTimeout)
        );
        assert_eq!(start.elapsed(), Duration::from_millis(50));
        assert_eq!(b.counters.waiting.load(Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gets_the_released_permit() {
        let b = bulkhead(1, 100, None, BulkheadKey::Operation);
        assert!(b.try_take(b.cell(&CellRef::Single)));
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                b.wait_for(b.cell(&CellRef::Single))
                    .await
                    .map(|()| start.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(b.counters.waiting.load(Relaxed), 1);
        b.give(b.cell(&CellRef::Single));
        // A later caller cannot overtake the waiter.
        assert!(!b.try_take(b.cell(&CellRef::Single)));
        let waited = waiter.await.unwrap().unwrap();
        assert_eq!(waited, Duration::from_millis(30));
        assert_eq!(b.in_use(), 1);
    }

    /// A newcomer that waits queues behind the waiter a released permit is
    /// being handed to, instead of taking it on its first look.
    #[tokio::test(start_paused = true)]
    async fn a_new_waiter_does_not_take_the_permit_handed_to_an_older_one() {
        let b = bulkhead(1, 1000, None, BulkheadKey::Operation);
        assert!(b.try_take(b.cell(&CellRef::Single)));
        let first = {
            let b = b.clone();
            tokio::spawn(async move { b.wait_for(b.cell(&CellRef::Single)).await })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        b.give(b.cell(&CellRef::Single));
        let newcomer = b.wait_for(b.cell(&CellRef::Single));
        tokio::pin!(newcomer);
        // One poll: it must queue, not take the permit.
        assert!(
            tokio::time::timeout(Duration::ZERO, newcomer.as_mut())
                .await
                .is_err(),
            "the newcomer overtook the waiter"
        );
        assert_eq!(first.await.unwrap(), Ok(()));
        assert_eq!(b.in_use(), 1);
        b.give(b.cell(&CellRef::Single));
        assert_eq!(newcomer.await, Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_in_arrival_order() {
        let b = bulkhead(1, 1000, None, BulkheadKey::Operation);
        assert!(b.try_take(b.cell(&CellRef::Single)));
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for n in 0..3 {
            let (b, order) = (b.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                b.wait_for(b.cell(&CellRef::Single)).await.unwrap();
                order.lock().unwrap().push(n);
                tokio::time::sleep(Duration::from_millis(10)).await;
                b.give(b.cell(&CellRef::Single));
            }));
            // Arrive one after the other.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        b.give(b.cell(&CellRef::Single));
        // A newcomer does not take the permit being handed to a waiter.
        assert!(!b.try_take(b.cell(&CellRef::Single)));
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
        assert_eq!(b.in_use(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn queue_bound_rejects_at_once() {
        let b = bulkhead(1, 1000, Some(1), BulkheadKey::Operation);
        assert!(b.try_take(b.cell(&CellRef::Single)));
        let first = {
            let b = b.clone();
            tokio::spawn(async move { b.wait_for(b.cell(&CellRef::Single)).await })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        let start = Instant::now();
        assert_eq!(
            b.wait_for(b.cell(&CellRef::Single)).await,
            Err(RejectReason::BulkheadFull)
        );
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(first.await.unwrap(), Err(RejectReason::BulkheadTimeout));
    }

    #[tokio::test(start_paused = true)]
    async fn per_instance_scopes_are_independent() {
        let b = bulkhead(1, 0, None, BulkheadKey::Instance);
        let a1 = b.cell_for(Some("10.0.0.1:80"), "/x");
        let a2 = b.cell_for(Some("10.0.0.1:80"), "/y");
        let other = b.cell_for(Some("10.0.0.2:80"), "/x");
        assert!(b.try_take(b.cell(&a1)));
        assert!(!b.try_take(b.cell(&a2)), "same instance shares permits");
        assert!(b.try_take(b.cell(&other)));
        assert_eq!(b.in_use(), 2);

        let p = bulkhead(1, 0, None, BulkheadKey::InstancePath);
        let x = p.cell_for(Some("i"), "/x");
        let y = p.cell_for(Some("i"), "/y");
        assert!(p.try_take(p.cell(&x)));
        assert!(p.try_take(p.cell(&y)), "instance+path keys are separate");
        assert_eq!(p.in_use(), 2, "counted over every instance+path scope");
        assert!(!p.try_take(p.cell(&p.cell_for(Some("i"), "/x"))));
    }

    #[tokio::test(start_paused = true)]
    async fn scopes_of_instances_that_left_are_dropped_once_idle() {
        let b = bulkhead(1, 0, None, BulkheadKey::InstancePath);
        let busy = b.cell_for(Some("10.0.0.1:80"), "/x");
        assert!(b.try_take(b.cell(&busy)));
        drop(b.cell_for(Some("10.0.0.1:80"), "/y"));
        drop(b.cell_for(Some("10.0.0.2:80"), "/x"));
        assert_eq!(b.keyed_scopes(), 3);
        b.forget_instances(&["10.0.0.1:80".into(), "10.9.9.9:80".into()]);
        // The idle scope of the departed instance is gone; its busy one stays
        // (the call in flight gives its permit back to it), the other's too.
        assert_eq!(b.keyed_scopes(), 2);
        b.give(b.cell(&busy));
        drop(busy);
        b.forget_instances(&["10.0.0.1:80".into()]);
        assert_eq!(b.keyed_scopes(), 1);
        // A returning instance starts from a fresh, empty scope.
        let again = b.cell_for(Some("10.0.0.1:80"), "/x");
        assert!(b.try_take(b.cell(&again)));
    }

    #[tokio::test(start_paused = true)]
    async fn keyed_scopes_are_bounded() {
        let b = bulkhead(1, 0, None, BulkheadKey::InstancePath);
        let mut held = Vec::new();
        for i in 0..MAX_KEYS {
            let c = b.cell_for(Some("i"), &format!("/{i}"));
            assert!(b.try_take(b.cell(&c)));
            held.push(c);
        }
        // Every keyed scope is busy: a new key falls back to the overflow scope.
        assert!(matches!(b.cell_for(Some("i"), "/new"), CellRef::Single));
        // Idle scopes are evicted to make room, at the next sweep: one
        // that found none idle is not repeated for a moment.
        for c in held.drain(..) {
            b.give(b.cell(&c));
        }
        assert!(matches!(b.cell_for(Some("i"), "/new"), CellRef::Single));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(matches!(b.cell_for(Some("i"), "/new"), CellRef::Keyed(_)));
        assert_eq!(b.table.counts(), (1, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_bulkhead_with_overflow_reject_refuses_new_scopes() {
        let b = Arc::new(Bulkhead::new(BulkheadSpec {
            keys: KeyCap {
                max: Some(2),
                overflow: KeyOverflow::Reject,
            },
            ..bulkhead(5, 0, None, BulkheadKey::InstancePath).spec.clone()
        }));
        let (x, y) = (b.cell_for(Some("i"), "/x"), b.cell_for(Some("i"), "/y"));
        assert!(b.try_take(b.cell(&x)) && b.try_take(b.cell(&y)));
        let z = BulkheadScope {
            cell: b.cell_for(Some("i"), "/z"),
            class: Class::Default,
        };
        let now = Instant::now();
        assert!(matches!(
            b.try_acquire(Some(&z), now.into(), now.into()),
            Answer::Refused(RejectReason::BulkheadFull, None)
        ));
        assert!(b.acquire(Some(&z), now).await.is_err());
        b.give(b.cell(&x));
        drop((x, z.cell));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(matches!(b.cell_for(Some("i"), "/z"), CellRef::Keyed(_)));
        drop(y);
    }

    /// A scope a call holds before taking its permit (between `cell_for` and
    /// `take`, or while it waits) is not idle: dropping it would give the
    /// next call to that key a fresh scope beside it, and both would be
    /// admitted past the bulkhead. Neither eviction nor a departed instance
    /// drops it.
    #[tokio::test(start_paused = true)]
    async fn a_scope_held_by_a_call_without_a_permit_is_not_dropped() {
        let b = bulkhead(1, 0, None, BulkheadKey::InstancePath);
        let held = b.cell_for(Some("10.0.0.3:80"), "/x");
        b.forget_instances(&["10.0.0.3:80".into()]);
        assert!(b.try_take(b.cell(&held)));
        let next = b.cell_for(Some("10.0.0.3:80"), "/x");
        assert!(!b.try_take(b.cell(&next)), "one scope, one permit");
        b.give(b.cell(&held));
        drop((held, next));

        // Eviction at MAX_KEYS: every other scope is idle and goes, the held one stays.
        let b = bulkhead(1, 0, None, BulkheadKey::InstancePath);
        let held = b.cell_for(Some("i"), "/held");
        for i in 1..MAX_KEYS {
            drop(b.cell_for(Some("i"), &format!("/{i}")));
        }
        assert_eq!(b.keyed_scopes(), MAX_KEYS);
        assert!(matches!(b.cell_for(Some("i"), "/new"), CellRef::Keyed(_)));
        assert_eq!(b.keyed_scopes(), 2, "the held scope and the new one");
        assert!(b.try_take(b.cell(&held)));
        let next = b.cell_for(Some("i"), "/held");
        assert!(!b.try_take(b.cell(&next)), "one scope, one permit");
    }
}
