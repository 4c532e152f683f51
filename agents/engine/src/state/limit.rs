//! Limits: calls and bytes per window, per key (all, domain, service,
//! consumer), with an optional latch.
//!
//! Calls are counted exactly in a fixed window (one atomic word holds the
//! window number and the count, updated by compare-exchange). Bytes
//! (request + response) are added as the proxy streams them, after
//! admission; a call is refused when the window's bytes have reached the
//! amount. Without `release`, counters simply reset every window. With
//! `release after D` or `release manual`, an exceeded limit *engages*: every
//! call of that key is refused until the timer ends or an operator releases it.
//!
//! `scope cluster` limits with a [`ClusterStore`] share their counters:
//! - `sync exact`: the engine asks the store for every call ([`Limit::remote`],
//!   [`Limit::admit_exact`]), one round trip that counts, checks the latch and
//!   engages it; the window clock is Unix time, the same for every agent;
//! - `sync batch D`: calls are *leased* ([`Lease`]): an agent takes a slice
//!   of the window's remaining calls from the store and admits locally while
//!   it holds some; a task tops the lease up every D and gives back the
//!   lease of an idle key ([`Limit::flush`]), and a call that finds the lease
//!   empty asks the store itself ([`Limit::admit_leased`]). While the store
//!   answers, a window admits at most the amount (a sliding window what its
//!   estimate allows; a token bucket its rate and burst, give or take two
//!   periods' calls: [`lease`]), whatever the number of agents; the store
//!   down, each agent counts on from the last state it heard of.
//!
//! Bytes of cluster limits are always batched (they are counted as bodies
//! stream, after admission), every D, or every 100ms with `sync exact`.
//! Latches live in the store too (`PX` = `release after`), so a limit engaged
//! by one agent is engaged for all; an operator release deletes them. While the
//! store is down, every agent counts on its own with the full amount.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::{self, Now};
use crate::cluster::{ClusterStore, ExactCall, ExactReply, FlushItem, Latch};
use crate::criticality::Class;
use crate::divisor::Divisor;
use crate::events::{EventKind, Events};
// `cluster::Latch` is the store's view of a latch; this one is the exported kind.
use crate::latch::{self, Latch as Kept, LatchKind, Restored};
use crate::outcome::Outcome;
use crate::primitive::{Answer, Grant, Keys, Phase, Primitive, Waiting};
use crate::rejection::RejectReason;
use crate::route::FxBuild;
use crate::state::keys::KeyTable;
use crate::stats::Counters;
use crate::stats::{MAX_ENGAGED_KEYS, RuleStats};
use crate::stripe::Slot;
use crate::weight::Weight;
use http::StatusCode;

mod algo;
pub(crate) mod attrs;
mod decide;
mod keyed;
mod latches;
mod lease;
mod quota;
mod share;
mod spec;
mod store;

pub(crate) use lease::Lease;
pub(crate) use spec::spec;
pub use spec::{
    Algorithm, ExactSync, Fallback, LimitAction, LimitKey, LimitScope, LimitSpec, RateSpec,
    ReleaseSpec,
};

const NOT_ENGAGED: u64 = 0;
const MANUAL: u64 = u64::MAX;

/// How often a `sync exact` limit flushes bytes and reads its latches back.
pub(crate) const EXACT_BYTES_FLUSH: Duration = Duration::from_millis(100);

/// The bytes of one key of a cluster limit in one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Part {
    /// Window number (Unix ms / window length).
    pub window: u64,
    /// The cluster total at the last flush (own calls included).
    pub base: u64,
    /// Own calls sent to the store, not yet answered.
    pub inflight: u64,
    /// Own calls since the last flush.
    pub delta: u64,
}

impl Part {
    fn roll(&mut self, window: u64) {
        if self.window != window {
            *self = Part {
                window,
                ..Part::default()
            };
        }
    }

    fn used(&self) -> u64 {
        self.base
            .saturating_add(self.inflight)
            .saturating_add(self.delta)
    }
}

/// The shared-store view of one key of a cluster limit.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub lease: Lease,
    pub bytes: Part,
    /// Used since the last flush (the flush reads the cluster total back).
    pub active: bool,
    /// Engaged here; the next flush engages it in the store.
    pub engage: bool,
}

/// The counters of one key. Cache-line aligned: the word every call
/// writes shares no line with the rule's read-only fields.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct LimitCell {
    /// Fixed and sliding windows: `(window number as u32) << 32 | calls in
    /// that window`; token bucket: the theoretical arrival time ([`algo`]).
    calls: AtomicU64,
    /// Sliding window: the previous window's word.
    previous: AtomicU64,
    bytes_window: AtomicU64,
    bytes: AtomicU64,
    /// `NOT_ENGAGED`, `MANUAL`, or engaged until this many ms after the epoch.
    engaged_until: AtomicU64,
    engaged_reason: AtomicU8,
    /// When it engaged (Unix ms, for the wire and the agent's state only).
    engaged_since_unix_ms: AtomicU64,
    /// The key (consumer, service; empty for the rule's single counter).
    key: Box<str>,
    /// Cluster limits only.
    shared: Mutex<Shared>,
    /// Held by the one call of this key that asks the store for a lease;
    /// the others wait for its answer rather than ask too.
    lease_turn: tokio::sync::Mutex<()>,
}

impl LimitCell {
    fn keyed(key: &str) -> Self {
        Self {
            key: key.into(),
            ..Self::default()
        }
    }

    fn shared(&self) -> MutexGuard<'_, Shared> {
        // Plain counters: a panic elsewhere cannot leave them inconsistent.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How a cluster limit reaches the store.
#[derive(Debug)]
struct ClusterLink {
    store: ClusterStore,
    /// `sync exact`: its deadline and fallback; `None`: `sync batch`.
    exact: Option<ExactSync>,
    period: Duration,
}

/// Not a refusal: a `sync batch` call found its key's lease empty while the
/// store answers, so it leases first ([`Limit::admit_leased`]). A real
/// refusal's wait is never zero (a window has at least 1ms left).
pub(crate) const LEASE_FIRST: Exceeded = Exceeded {
    reason: RejectReason::LimitCalls,
    wait: Some(Duration::ZERO),
    engaged: false,
    room_left: false,
};

/// Which key's counters a call uses.
#[derive(Clone, Debug)]
pub(crate) enum CellRef {
    /// The rule's own counter: unkeyed, or the overflow of a keyed limit
    /// whose keys are all engaged (`overflow share`).
    Single,
    Keyed(Arc<LimitCell>),
    /// No room for the key, and the limit says `overflow reject`.
    Full,
    /// The rule's own counter, for a call of this consumer class of its
    /// fair share ([`share`]), if it has one, and of this criticality.
    Own(Option<share::Class>, Class),
}

/// A limit was exceeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exceeded {
    pub reason: RejectReason,
    /// Until the current window ends (when the call would fit again), or
    /// until an engaged limit releases itself; `None` for manual release.
    pub wait: Option<Duration>,
    /// Whether the limit is engaged (shaping cannot help).
    pub engaged: bool,
    /// The limit has room, but not for this call: its consumer is over its
    /// fair share ([`share`]), or it is sheddable and the window is nearly
    /// used up. No latch engages for it.
    pub room_left: bool,
}

#[derive(Debug)]
// `counters` first and one alignment for every primitive: at the same
// offset of each (`state::tests`, issue 39), so `State::counters` reads
// them without a match on the kind.
#[repr(C, align(64))]
pub(crate) struct Limit {
    pub(crate) counters: Counters,
    pub(crate) spec: LimitSpec,
    name: Arc<str>,
    events: Events,
    pub(crate) epoch: Instant,
    /// `epoch` in nanoseconds since the clock's base ([`crate::clock`]).
    epoch_ns: u64,
    /// `epoch` as a clock read (token buckets count nanoseconds from it).
    epoch_now: Now,
    single: LimitCell,
    keyed: RwLock<HashMap<Box<str>, Arc<LimitCell>, FxBuild>>,
    table: KeyTable,
    cluster: Option<ClusterLink>,
    /// `scale with warmup`: the engine's slow-start weight.
    weight: Option<Weight>,
    /// `share by consumer { ... }`: the calls of a window shared by weight.
    share: Option<share::LimitShare>,
    /// A local fixed window of calls alone (no bytes, store, share or
    /// warm-up weight): its amount and window, worked out once (issue 39: a
    /// call of such a limit goes straight to the window).
    plain: Option<Plain>,
    /// A local sliding window or token bucket of calls alone (as `plain`
    /// but for its algorithm), worked out once: a call of the rule's own
    /// counter goes straight to it (issue 39).
    paced: Option<Paced>,
}

/// A paced limit ([`Limit::paced`]). The two kinds a call may be counted
/// inline first (issue 39: a limit with neither, or none at all, is then
/// told by one comparison of the kind).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Paced {
    /// A sliding window whose number a plain window's numbers tell (its
    /// nanoseconds in a `u64`, the epoch before 2^63): a call of the
    /// rule's own counter far enough below the amount is counted inline
    /// ([`Limit::paced_at_once`], issue 39).
    SlidingPlain(Plain),
    /// A token bucket: a call every `interval_ns`, at most `tolerance_ns`
    /// ahead of now.
    Bucket { interval_ns: u64, tolerance_ns: u64 },
    /// `amount` calls per sliding window of `w_ms` milliseconds (at least
    /// 1; `w`: its divisor).
    Sliding { amount: u64, w_ms: u64, w: Divisor },
}

/// A plain limit's window ([`Limit::plain`]): `amount` calls per `w_ms`
/// milliseconds, `w_ns` nanoseconds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plain {
    amount: u64,
    /// `amount` as far as the count of a window's word holds it (at most
    /// `0xffff_ffff`): a word whose count is below it counts one more
    /// call with an add ([`Limit::plain_calls`]).
    room: u64,
    /// Where the word keeps its window's number: 32 bits up, as [`pack`]
    /// puts it. A field, not the constant (issue 39: the multiply's high
    /// half shifted by a constant 32 took three instructions, through its
    /// low half; by a field, one).
    at: u32,
    w_ms: u64,
    w_ns: Divisor,
}

fn pack(window: u64, count: u64) -> u64 {
    ((window & 0xffff_ffff) << 32) | count.min(0xffff_ffff)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Limit {
    /// A limit; `scope cluster` limits share their counters through `store`
    /// when there is one (without, they count locally).
    pub(crate) fn new(
        spec: LimitSpec,
        name: Arc<str>,
        events: Events,
        store: Option<&ClusterStore>,
        weight: &Weight,
    ) -> Self {
        let cluster = match (spec.scope, store) {
            (LimitScope::Local, _) | (_, None) => None,
            (LimitScope::ClusterExact(sync), Some(store)) => Some(ClusterLink {
                store: store.clone(),
                exact: Some(sync),
                period: EXACT_BYTES_FLUSH,
            }),
            (LimitScope::ClusterBatch(period), Some(store)) => Some(ClusterLink {
                store: store.clone(),
                exact: None,
                period: period.max(Duration::from_millis(1)),
            }),
        };
        let epoch = Instant::now();
        let spec_scales = spec.warmup_scale;
        let share = spec.share.as_ref().map(share::LimitShare::new);
        let mut limit = Self {
            spec,
            name,
            events,
            epoch,
            epoch_ns: clock::ns(epoch),
            epoch_now: Now::from(epoch),
            single: LimitCell::default(),
            keyed: RwLock::default(),
            table: KeyTable::default(),
            cluster,
            counters: Counters::default(),
            weight: spec_scales.then(|| weight.clone()),
            share,
            plain: None,
            paced: None,
        };
        limit.set_plain();
        limit
    }

    /// Whether calls must be counted in the store first ([`Limit::admit_exact`]):
    /// a `sync exact` limit calls while its store is up.
    pub(crate) fn remote(&self) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|l| l.exact.is_some() && self.spec.calls.is_some() && l.store.is_up())
    }

    /// Whole milliseconds since the epoch.
    #[inline]
    fn now_ms(&self, now: impl Into<Now>) -> u64 {
        now.into().ms_since(self.epoch_ns)
    }

    pub(crate) fn cell<'a>(&'a self, r: &'a CellRef) -> &'a LimitCell {
        match r {
            CellRef::Single | CellRef::Full | CellRef::Own(..) => &self.single,
            CellRef::Keyed(c) => c,
        }
    }

    fn is_engaged(&self, cell: &LimitCell, now_ms: u64) -> bool {
        match cell.engaged_until.load(Relaxed) {
            NOT_ENGAGED => false,
            until => until == MANUAL || now_ms < until,
        }
    }

    fn window_left(rate: &RateSpec, now_ms: u64) -> Duration {
        let w = ms(rate.window).max(1);
        Duration::from_millis(w - now_ms % w)
    }

    /// Counts one call against the key's counters, or says why it does not fit.
    pub(crate) fn try_admit(&self, cell: &LimitCell, now: impl Into<Now>) -> Result<(), Exceeded> {
        self.try_admit_as(cell, now.into(), None, Class::Default)
    }

    /// [`Limit::try_admit`] for a call of a fair share's `class`, of
    /// criticality `crit`.
    pub(crate) fn try_admit_as(
        &self,
        cell: &LimitCell,
        now: Now,
        class: Option<share::Class>,
        crit: Class,
    ) -> Result<(), Exceeded> {
        let now_ms = self.now_ms(now);
        let until = cell.engaged_until.load(Relaxed);
        if until != NOT_ENGAGED {
            if until == MANUAL || now_ms < until {
                return Err(Exceeded {
                    reason: reason_from(cell.engaged_reason.load(Relaxed)),
                    wait: (until != MANUAL).then(|| Duration::from_millis(until - now_ms)),
                    engaged: true,
                    room_left: false,
                });
            }
            // `release after` has elapsed: whoever sees it first releases.
            if cell
                .engaged_until
                .compare_exchange(until, NOT_ENGAGED, Relaxed, Relaxed)
                .is_ok()
            {
                self.events.emit_key(
                    EventKind::LimitReleased,
                    &self.name,
                    &cell.key,
                    "released after its `release after` time".into(),
                );
            }
        }
        if let Some(plain) = &self.plain
            && crit != Class::Sheddable
        {
            return Self::plain_calls(cell, plain, now.ns(), self.epoch_ns);
        }
        if let Some(link) = &self.cluster {
            self.check_shared_bytes(link, cell, now.at())?;
            if let Some(sync) = link.exact {
                // Here only without the store's answer: the fallback decides.
                return self.exact_fallback(link, sync, cell, now, now_ms);
            }
            return self.batch_calls(link, cell, now.at());
        }
        if let Some(rate) = &self.spec.bytes {
            let window = now_ms / ms(rate.window).max(1);
            let used = if cell.bytes_window.load(Relaxed) == window {
                cell.bytes.load(Relaxed)
            } else {
                0
            };
            if used >= rate.amount {
                return Err(Exceeded {
                    reason: RejectReason::LimitBytes,
                    wait: Some(Self::window_left(rate, now_ms)),
                    engaged: false,
                    room_left: false,
                });
            }
        }
        if crit == Class::Sheddable {
            self.sheddable_fits(cell, now, now_ms)?;
        }
        match (&self.share, class) {
            (Some(share), Some(class)) => self.shared_calls(share, class, cell, now, now_ms),
            _ => self.local_calls(cell, now, now_ms),
        }
    }

    /// The latch as the store encodes it: 0 none, -1 manual, else ms.
    fn latch_ms(&self) -> i64 {
        match self.spec.release {
            None => 0,
            Some(ReleaseSpec::Manual) => -1,
            Some(ReleaseSpec::After(d)) => i64::try_from(ms(d)).unwrap_or(i64::MAX).max(1),
        }
    }

    fn engaged_message(&self, reason: RejectReason) -> String {
        let what = match reason {
            RejectReason::LimitBytes => "bytes",
            _ => "calls",
        };
        let release = match self.spec.release {
            Some(ReleaseSpec::After(d)) => format!("releases after {}s", d.as_secs()),
            _ => "until released by an operator".into(),
        };
        let scope = if self.cluster.is_some() {
            " for every agent"
        } else {
            ""
        };
        format!("{what} per window exceeded; engaged{scope} {release}")
    }

    /// The call is refused: engage the latch if the limit has one. Returns
    /// the `Retry-After` to send.
    pub(crate) fn refuse(&self, cell: &LimitCell, e: Exceeded, now: Instant) -> Option<Duration> {
        if e.engaged || e.room_left {
            return e.wait;
        }
        let Some(release) = self.spec.release else {
            return e.wait;
        };
        let now_ms = self.now_ms(now);
        let (until, wait) = match release {
            ReleaseSpec::After(d) => (now_ms.saturating_add(ms(d)).max(1), Some(d)),
            ReleaseSpec::Manual => (MANUAL, None),
        };
        cell.engaged_reason.store(e.reason as u8, Relaxed);
        if self.cluster.as_ref().is_some_and(|l| l.exact.is_none()) {
            // The next flush engages it for every agent.
            cell.shared().engage = true;
        }
        if cell
            .engaged_until
            .compare_exchange(NOT_ENGAGED, until, Relaxed, Relaxed)
            .is_ok()
        {
            cell.engaged_since_unix_ms.store(now_unix_ms(), Relaxed);
            self.events.emit_key(
                EventKind::LimitEngaged,
                &self.name,
                &cell.key,
                self.engaged_message(e.reason),
            );
        }
        wait
    }

    /// Adds request or response bytes of an admitted call.
    pub(crate) fn count_bytes(&self, cell: &LimitCell, n: u64, now: Instant) {
        let Some(rate) = &self.spec.bytes else { return };
        if let Some(link) = &self.cluster {
            let w = ms(rate.window).max(1);
            let mut s = cell.shared();
            s.bytes.roll(link.store.unix_ms(now) / w);
            s.bytes.delta = s.bytes.delta.saturating_add(n);
            s.active = true;
            return;
        }
        let window = self.now_ms(now) / ms(rate.window).max(1);
        let seen = cell.bytes_window.load(Relaxed);
        if seen != window
            && seen < window
            && cell
                .bytes_window
                .compare_exchange(seen, window, Relaxed, Relaxed)
                .is_ok()
        {
            cell.bytes.store(0, Relaxed);
        }
        cell.bytes.fetch_add(n, Relaxed);
    }
}

fn now_unix_ms() -> u64 {
    latch::unix_ms(std::time::SystemTime::now())
}

fn reason_from(v: u8) -> RejectReason {
    if v == RejectReason::LimitBytes as u8 {
        RejectReason::LimitBytes
    } else {
        RejectReason::LimitCalls
    }
}

// === impl Primitive ===

/// The rule's own scope, for a call that holds no keyed one.
static SINGLE: CellRef = CellRef::Single;

impl Primitive for Limit {
    const PHASE: Phase = Phase::Limits;

    type Scope = CellRef;

    #[inline]
    fn scope(&self, keys: &Keys<'_>) -> CellRef {
        if self.share.is_some() || self.spec.by_class && self.spec.unkeyed() {
            // A share only on a limit without a key (its spec's conversion).
            let share = self.share.as_ref().map(|s| s.class(keys.consumer));
            return CellRef::Own(share, keys.class);
        }
        if !self.spec.parts.is_empty() {
            let mut buf = attrs::KeyBuf::new();
            attrs::compose(&self.spec.parts, keys, &mut buf);
            return self.cell_for(Some(buf.as_str()));
        }
        let key = match self.spec.key {
            LimitKey::All | LimitKey::Domain => None,
            LimitKey::Service => keys.target,
            LimitKey::Consumer => keys.consumer,
        };
        self.cell_for(key)
    }

    /// A plain limit's own counter, not engaged, inline: straight to its
    /// window (as `try_admit_as` would go after its latch test; issue 39).
    #[inline(always)]
    fn try_acquire(&self, scope: Option<&CellRef>, now: Now, start: Now) -> Answer {
        if scope.is_none()
            && let Some(plain) = &self.plain
            && self.single.engaged_until.load(Relaxed) == NOT_ENGAGED
        {
            return match Self::plain_calls(&self.single, plain, now.ns(), self.epoch_ns) {
                // A plain limit counts no bytes: its grant is the default.
                Ok(()) => Answer::Granted(Grant::default()),
                Err(e) => self.refused(&self.single, e, now, start),
            };
        }
        self.try_acquire_any(scope, now, start)
    }

    async fn acquire(
        &self,
        scope: Option<&CellRef>,
        start: Instant,
    ) -> Result<Grant, (RejectReason, Option<Duration>)> {
        if let Some(CellRef::Full) = scope
            && let Answer::Refused(reason, retry) = self.no_room(Instant::now())
        {
            return Err((reason, retry));
        }
        let cell = self.cell(scope_ref(scope));
        // A call in flight to the store is not "waiting".
        let to_store = self.remote() || self.needs_lease(cell, Instant::now());
        let _waiting = (!to_store).then(|| Waiting::new(&self.counters));
        loop {
            let now = Instant::now();
            let answer = if self.remote() {
                match self.admit_exact(cell, now).await {
                    Ok(()) => Answer::Granted(self.grant()),
                    Err(e) => self.shape(cell, e, now, start),
                }
            } else if self.leases() {
                match self.admit_leased(cell).await {
                    Ok(()) => Answer::Granted(self.grant()),
                    Err(e) => self.shape(cell, e, now, start),
                }
            } else {
                self.try_acquire(scope, now.into(), start.into())
            };
            match answer {
                Answer::Granted(grant) => return Ok(grant),
                Answer::Refused(reason, retry) => return Err((reason, retry)),
                // Only asked when the window ends before the shaping
                // deadline; then the call is tried again in the next window.
                Answer::Wait(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    fn release(&self, _scope: Option<&CellRef>, _grant: Grant) {}

    fn record(&self, _slot: Slot, _outcome: Outcome, _grant: Grant, _now: Now, _elapsed_ns: u64) {}

    #[inline]
    fn add_bytes(&self, scope: Option<&CellRef>, n: u64, now: Instant) {
        self.count_bytes(self.cell(scope_ref(scope)), n, now);
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
        stats.capacity = self.spec.calls.map_or(0, |c| c.amount);
        let (keys, count) = self.engaged_keys();
        stats.limit_engaged = count > 0;
        stats.engaged_keys_truncated = count > keys.len();
        stats.engaged_keys = keys;
        (stats.keys, stats.keys_overflowed) = self.table.counts();
    }

    fn latches(&self, now: Instant, now_unix_ms: u64, out: &mut Vec<Kept>) {
        self.latches_into(now, now_unix_ms, out);
    }

    fn restore(&self, latch: &Kept, now: Instant, now_unix_ms: u64) -> Option<Restored> {
        (latch.kind == LatchKind::Limit).then(|| self.restore_latch(latch, now, now_unix_ms))
    }
}

/// The limit scope in `scope` (`None`: the rule's own).
#[inline]
fn scope_ref(scope: Option<&CellRef>) -> &CellRef {
    scope.unwrap_or(&SINGLE)
}

impl Limit {
    fn grant(&self) -> Grant {
        Grant {
            probe: false,
            bytes: self.spec.bytes.is_some(),
            ..Grant::default()
        }
    }

    /// The one shaping decision: a call over the limit waits for the next
    /// window when the limit shapes, is not engaged, and the window ends
    /// within `max_delay` of the decision's start; else it is refused (and
    /// the limit engages if it latches).
    fn shape(&self, cell: &LimitCell, e: Exceeded, now: Instant, start: Instant) -> Answer {
        if let LimitAction::Shape { max_delay } = self.spec.action
            && !e.engaged
            && let Some(wait) = e.wait
            && now + wait <= start + max_delay
        {
            return Answer::Wait(wait);
        }
        let retry = self.refuse(cell, e, now);
        Answer::Refused(e.reason, retry)
    }
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;
    const MAX_KEYS: usize = crate::state::keys::DEFAULT_MAX_KEYS as usize;
    use crate::config::{LimitAction, LimitScope};
    use crate::events::Event;

    /// A cluster limit's bytes (`Part`) and leased calls (`Lease`) of one
    /// key start afresh in a new window and are kept within one; a lease
    /// keeps the rate it learned (`per_period`) across windows.
    #[test]
    fn parts_and_leases_start_afresh_in_a_new_window() {
        let mut p = Part {
            window: 7,
            base: 10,
            inflight: 2,
            delta: 3,
        };
        assert_eq!(p.used(), 15);
        p.roll(7);
        assert_eq!(p.used(), 15, "the same window: kept");
        p.roll(8);
        assert_eq!(
            p,
            Part {
                window: 8,
                ..Part::default()
            }
        );
        assert_eq!(p.used(), 0);
        let mut l = Lease {
            window: 7,
            left: 5,
            demand: 9,
            per_period: 40,
            total: 100,
            unleased: 1,
            sending: 2,
            ..Lease::default()
        };
        let before = l;
        l.roll(7);
        assert_eq!(l, before, "the same window: kept");
        l.roll(8);
        assert_eq!(
            l,
            Lease {
                window: 8,
                per_period: 40,
                // A sliding window's count of the window before.
                previous: 103,
                ..Lease::default()
            }
        );
    }

    fn limit(
        calls: Option<u64>,
        bytes: Option<u64>,
        release: Option<ReleaseSpec>,
    ) -> (Limit, tokio::sync::broadcast::Receiver<Event>) {
        let events = Events::new();
        let rx = events.subscribe();
        let spec = LimitSpec {
            algorithm: Algorithm::FixedWindow,
            calls: calls.map(|amount| RateSpec {
                amount,
                window: Duration::from_secs(1),
            }),
            bytes: bytes.map(|amount| RateSpec {
                amount,
                window: Duration::from_secs(1),
            }),
            key: LimitKey::All,
            action: LimitAction::Reject,
            reject_status: StatusCode::TOO_MANY_REQUESTS,
            reject_grpc: gov_proto::v1::GrpcCode::ResourceExhausted,
            release,
            scope: LimitScope::Local,
            keys: crate::state::keys::KeyCap::default(),
            headers_always: false,
            warmup_scale: false,
            parts: Box::default(),
            share: None,
            by_class: false,
        };
        (
            Limit::new(spec, "svc/l".into(), events, None, &Weight::default()),
            rx,
        )
    }

    /// A local limit of `amount` calls per `window`, counted by `algorithm`.
    pub(crate) fn limit_with(algorithm: Algorithm, amount: u64, window: Duration) -> Limit {
        let (mut l, _) = limit(Some(amount), None, None);
        l.spec.algorithm = algorithm;
        l.spec.calls = Some(RateSpec { amount, window });
        l.set_plain();
        l
    }

    /// A plain limit admits exactly its amount in a window when threads
    /// race for it, through its one-add word and the general way alike
    /// (issue 39: the add is a compare-exchange of the word read, never a
    /// blind add past the amount).
    #[test]
    fn a_plain_limit_is_exact_across_threads() {
        for amount in [1, 7, 1000] {
            let l = limit_with(Algorithm::FixedWindow, amount, Duration::from_secs(3600));
            assert!(l.plain.is_some());
            let granted = std::sync::atomic::AtomicU64::new(0);
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        for _ in 0..600 {
                            let now = Now::read();
                            if let Answer::Granted(_) = Primitive::try_acquire(&l, None, now, now) {
                                granted.fetch_add(1, Relaxed);
                            }
                        }
                    });
                }
            });
            assert_eq!(granted.into_inner(), amount, "amount {amount}");
        }
    }

    /// A plain limit (its window's number from the nanoseconds, issue 39)
    /// and a paced one (straight to its algorithm) admit and refuse, with
    /// the same `Retry-After`, as the limit counted the general way does,
    /// at any time of its windows.
    #[tokio::test(start_paused = true)]
    async fn a_plain_or_paced_limit_decides_as_the_general_way() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket { burst: 2 },
        ] {
            for window in [
                Duration::from_millis(1),
                Duration::from_millis(7),
                Duration::from_secs(1),
                Duration::from_millis(1500),
            ] {
                let plain = limit_with(algorithm, 3, window);
                let fixed = algorithm == Algorithm::FixedWindow;
                assert_eq!(plain.plain.is_some(), fixed);
                assert_eq!(plain.paced.is_some(), !fixed);
                let mut general = limit_with(algorithm, 3, window);
                general.plain = None;
                general.paced = None;
                let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
                for i in 0..3_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let now = Now::read();
                    let at = |l: &Limit| match Primitive::try_acquire(l, None, now, now) {
                        Answer::Granted(grant) => Ok(grant),
                        Answer::Refused(reason, retry) => Err((reason, retry)),
                        Answer::Wait(d) => panic!("a plain limit waits {d:?}"),
                    };
                    let got = at(&plain);
                    assert_eq!(got, at(&general), "{algorithm:?} {window:?}, call {i}");
                    tokio::time::advance(Duration::from_nanos(x % 400_000_000)).await;
                }
            }
        }
    }

    /// A plain limit's word as the general way leaves it, and its answers,
    /// for every amount the word's count holds or not (0, 1, up to 2^32 and
    /// past it, where the count stays at `0xffff_ffff`), from any count of
    /// the window, another window's, and a time before the epoch (issue 39:
    /// a call with room in the word's window adds one to it).
    #[tokio::test(start_paused = true)]
    async fn a_plain_word_counts_as_the_general_way() {
        let window = Duration::from_millis(7);
        for amount in [0, 1, 2, 0xffff_fffe, 0xffff_ffff, 1 << 32, u64::MAX] {
            let plain = limit_with(Algorithm::FixedWindow, amount, window);
            let mut general = limit_with(Algorithm::FixedWindow, amount, window);
            general.plain = None;
            assert_eq!(plain.plain.map(|p| p.at), Some(32), "as `pack` puts it");
            // The clock is paused: one epoch.
            assert_eq!(plain.epoch_ns, general.epoch_ns);
            let epoch = plain.epoch_ns;
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            for i in 0..2_000u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Counts near zero, near `amount` and at the word's top,
                // in this window, the one before or one long gone.
                let now_ns = match x % 8 {
                    0 => epoch - x % 5_000_000,
                    _ => epoch + (i * 1_300_000) + x % 900_000,
                };
                let number = (now_ns - plain.epoch_ns.min(now_ns)) / 7_000_000;
                let count = match (x >> 8) % 4 {
                    0 => (x >> 16) % 3,
                    1 => amount.saturating_sub((x >> 16) % 3),
                    2 => 0xffff_ffff - (x >> 16) % 3,
                    _ => x >> 20,
                };
                let win = match (x >> 12) % 3 {
                    0 => number,
                    1 => number.wrapping_sub(1),
                    _ => x >> 30,
                };
                let word = pack(win, count);
                for l in [&plain, &general] {
                    l.single.calls.store(word, Relaxed);
                }
                let now = Now::from_ns(now_ns);
                let at = |l: &Limit| match Primitive::try_acquire(l, None, now, now) {
                    Answer::Granted(grant) => Ok(grant),
                    Answer::Refused(reason, retry) => Err((reason, retry)),
                    Answer::Wait(d) => panic!("a plain limit waits {d:?}"),
                };
                let (got, want) = (at(&plain), at(&general));
                let ctx = format!("amount {amount}, call {i}, word {word:#x} at {now_ns}");
                assert_eq!(got, want, "{ctx}");
                assert_eq!(
                    plain.single.calls.load(Relaxed),
                    general.single.calls.load(Relaxed),
                    "{ctx}"
                );
                // A refusal of either engages neither (no `release`).
                assert!(!plain.is_engaged(&plain.single, 0), "{ctx}");
            }
        }
    }

    /// At `MAX_KEYS` keys a new key evicts the idle keys that are not
    /// engaged: a key engaged until its release time and a key a call holds
    /// stay; an engaged key goes once its release time has come. (Without
    /// room, a new key counts in the overflow scope.)
    #[tokio::test(start_paused = true)]
    async fn keyed_cells_evict_idle_keys_that_are_not_engaged() {
        let (l, _rx) = limit(
            Some(1),
            None,
            Some(ReleaseSpec::After(Duration::from_secs(60))),
        );
        let keys = |l: &Limit| l.keyed.read().map(|m| m.len()).unwrap_or(0);
        let has = |l: &Limit, k: &str| l.keyed.read().is_ok_and(|m| m.contains_key(k));
        let engaged = l.cell_for(Some("engaged"));
        assert!(l.try_admit(l.cell(&engaged), Instant::now()).is_ok());
        let e = l.try_admit(l.cell(&engaged), Instant::now()).unwrap_err();
        assert!(l.refuse(l.cell(&engaged), e, Instant::now()).is_some());
        drop(engaged);
        let held = l.cell_for(Some("held"));
        for i in 2..MAX_KEYS {
            drop(l.cell_for(Some(&format!("k{i}"))));
        }
        assert_eq!(keys(&l), MAX_KEYS, "no eviction below the bound");
        let new = l.cell_for(Some("new"));
        assert!(matches!(new, CellRef::Keyed(_)));
        assert_eq!(keys(&l), 3, "engaged, held and new");
        assert!(has(&l, "engaged") && has(&l, "held"));

        // At its release time the engaged key is idle like any other.
        tokio::time::advance(Duration::from_secs(60)).await;
        for i in 3..MAX_KEYS {
            drop(l.cell_for(Some(&format!("j{i}"))));
        }
        assert_eq!(keys(&l), MAX_KEYS);
        let again = l.cell_for(Some("again"));
        assert!(matches!(again, CellRef::Keyed(_)));
        assert!(!has(&l, "engaged"), "released by then");
        assert_eq!(keys(&l), 3, "held, new and again");
        drop((held, new, again));
    }

    /// The bytes of a response that runs into a new window before any call
    /// is admitted in it count in the new window.
    #[tokio::test(start_paused = true)]
    async fn bytes_that_cross_into_a_new_window_count_in_it() {
        let (l, _rx) = limit(None, Some(1000), None);
        let c = CellRef::Single;
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        l.count_bytes(l.cell(&c), 600, Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        l.count_bytes(l.cell(&c), 500, Instant::now());
        assert!(
            l.try_admit(l.cell(&c), Instant::now()).is_ok(),
            "500 of 1000"
        );
        l.count_bytes(l.cell(&c), 500, Instant::now());
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert_eq!(e.reason, RejectReason::LimitBytes);
    }

    /// An engaged limit says what it counted and how it releases, keeps
    /// refusing for that reason, and records when it engaged; the store's
    /// encoding of its release (0 none, -1 manual, else ms) and its gRPC code
    /// are as configured.
    #[tokio::test(start_paused = true)]
    async fn an_engaged_limit_says_why_and_until_when() {
        let (l, mut rx) = limit(
            None,
            Some(1000),
            Some(ReleaseSpec::After(Duration::from_secs(60))),
        );
        let c = CellRef::Single;
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        l.count_bytes(l.cell(&c), 1000, Instant::now());
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert!(l.refuse(l.cell(&c), e, Instant::now()).is_some());
        let event = rx.try_recv().unwrap();
        assert_eq!(
            event.reason,
            "bytes per window exceeded; engaged releases after 60s"
        );
        assert!(l.cell(&c).engaged_since_unix_ms.load(Relaxed) > 1_600_000_000_000);
        tokio::time::advance(Duration::from_secs(2)).await;
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert_eq!(e.reason, RejectReason::LimitBytes, "engaged for bytes");
        assert_eq!(l.latch_ms(), 60_000);

        let (l, mut rx) = limit(Some(1), None, Some(ReleaseSpec::Manual));
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert_eq!(l.refuse(l.cell(&c), e, Instant::now()), None);
        assert_eq!(
            rx.try_recv().unwrap().reason,
            "calls per window exceeded; engaged until released by an operator"
        );
        assert_eq!(l.latch_ms(), -1);
        assert_eq!(limit(Some(1), None, None).0.latch_ms(), 0);
        assert_eq!(
            Primitive::reject_grpc(&l),
            gov_proto::v1::GrpcCode::ResourceExhausted
        );
    }

    /// Stats list at most [`MAX_ENGAGED_KEYS`](crate::MAX_ENGAGED_KEYS)
    /// engaged keys and say when there were more.
    #[tokio::test(start_paused = true)]
    async fn stats_say_when_the_engaged_keys_are_cut() {
        let (l, _rx) = limit(Some(1), None, Some(ReleaseSpec::Manual));
        let engage = |l: &Limit, k: &str| {
            let c = l.cell_for(Some(k));
            assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
            let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
            l.refuse(l.cell(&c), e, Instant::now());
        };
        let stats = |l: &Limit| {
            let mut s = l.counters.snapshot(&l.name, gov_proto::v1::RuleKind::Limit);
            Primitive::stats(l, &mut s);
            (
                s.limit_engaged,
                s.engaged_keys.len(),
                s.engaged_keys_truncated,
            )
        };
        assert_eq!(stats(&l), (false, 0, false));
        for i in 0..crate::MAX_ENGAGED_KEYS {
            engage(&l, &format!("k{i}"));
        }
        assert_eq!(stats(&l), (true, crate::MAX_ENGAGED_KEYS, false));
        engage(&l, "one-more");
        assert_eq!(stats(&l), (true, crate::MAX_ENGAGED_KEYS, true));
    }

    #[tokio::test(start_paused = true)]
    async fn calls_per_window_roll_over() {
        let (l, _rx) = limit(Some(3), None, None);
        let c = CellRef::Single;
        for _ in 0..3 {
            assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        }
        tokio::time::advance(Duration::from_millis(400)).await;
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert_eq!(e.reason, RejectReason::LimitCalls);
        assert_eq!(e.wait, Some(Duration::from_millis(600)));
        assert_eq!(
            l.refuse(l.cell(&c), e, Instant::now()),
            Some(Duration::from_millis(600))
        );
        // The next window admits again.
        tokio::time::advance(Duration::from_millis(600)).await;
        for _ in 0..3 {
            assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        }
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_per_window() {
        let (l, _rx) = limit(None, Some(1000), None);
        let c = CellRef::Single;
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        l.count_bytes(l.cell(&c), 600, Instant::now());
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        l.count_bytes(l.cell(&c), 400, Instant::now());
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert_eq!(e.reason, RejectReason::LimitBytes);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        l.count_bytes(l.cell(&c), 10, Instant::now());
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn latch_releases_after_its_time() {
        let (l, mut rx) = limit(
            Some(1),
            None,
            Some(ReleaseSpec::After(Duration::from_secs(7200))),
        );
        let c = CellRef::Single;
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert_eq!(
            l.refuse(l.cell(&c), e, Instant::now()),
            Some(Duration::from_secs(7200))
        );
        assert_eq!(rx.try_recv().unwrap().kind, EventKind::LimitEngaged);
        assert!(l.engaged());
        // Engaged: refused even in later windows.
        tokio::time::advance(Duration::from_secs(3600)).await;
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert!(e.engaged);
        assert_eq!(e.wait, Some(Duration::from_secs(3600)));
        assert_eq!(l.remaining(), Some(Duration::from_secs(3600)));
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        assert_eq!(rx.try_recv().unwrap().kind, EventKind::LimitReleased);
        assert!(!l.engaged());
    }

    #[tokio::test(start_paused = true)]
    async fn manual_latch_needs_a_release() {
        let (l, mut rx) = limit(Some(1), None, Some(ReleaseSpec::Manual));
        let c = CellRef::Single;
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        let e = l.try_admit(l.cell(&c), Instant::now()).unwrap_err();
        assert_eq!(l.refuse(l.cell(&c), e, Instant::now()), None);
        tokio::time::advance(Duration::from_secs(100_000)).await;
        assert!(l.try_admit(l.cell(&c), Instant::now()).unwrap_err().engaged);
        assert_eq!(l.remaining(), None);
        assert!(l.release("ops", None));
        assert!(!l.release("ops", None), "nothing left to release");
        assert!(l.try_admit(l.cell(&c), Instant::now()).is_ok());
        let kinds: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, [EventKind::LimitEngaged, EventKind::LimitReleased]);
    }

    mod cluster {
        use std::sync::atomic::Ordering::Relaxed;

        use super::*;
        use crate::cluster::fake::{Memory, Shared as Fake};

        const WINDOW: Duration = Duration::from_secs(10);

        fn store(memory: &Arc<Memory>) -> ClusterStore {
            ClusterStore::from_backend(Box::new(Fake(memory.clone())), Duration::from_millis(50))
        }

        fn agent(
            store: &ClusterStore,
            scope: LimitScope,
            amount: u64,
            release: Option<ReleaseSpec>,
        ) -> (Arc<Limit>, tokio::sync::broadcast::Receiver<Event>) {
            counting(store, scope, amount, release, Algorithm::FixedWindow)
        }

        fn counting(
            store: &ClusterStore,
            scope: LimitScope,
            amount: u64,
            release: Option<ReleaseSpec>,
            algorithm: Algorithm,
        ) -> (Arc<Limit>, tokio::sync::broadcast::Receiver<Event>) {
            let events = Events::new();
            let rx = events.subscribe();
            let spec = LimitSpec {
                algorithm,
                calls: Some(RateSpec {
                    amount,
                    window: WINDOW,
                }),
                bytes: None,
                key: LimitKey::All,
                action: LimitAction::Reject,
                reject_status: StatusCode::TOO_MANY_REQUESTS,
                reject_grpc: gov_proto::v1::GrpcCode::ResourceExhausted,
                release,
                scope,
                keys: crate::state::keys::KeyCap::default(),
                headers_always: false,
                warmup_scale: false,
                parts: Box::default(),
                share: None,
                by_class: false,
            };
            (
                Arc::new(Limit::new(
                    spec,
                    "svc/shared".into(),
                    events,
                    Some(store),
                    &Weight::default(),
                )),
                rx,
            )
        }

        /// Moves paused time to the start of a cluster window.
        async fn align(store: &ClusterStore) {
            let w = ms(WINDOW);
            let unix = store.unix_ms(Instant::now());
            tokio::time::advance(Duration::from_millis(w - unix % w)).await;
        }

        /// `n` calls through the primitive's decision (a `sync batch` call
        /// with an empty lease asks the store); how many were admitted.
        async fn admit_n(l: &Limit, n: usize) -> usize {
            let mut admitted = 0;
            for _ in 0..n {
                let now = Instant::now();
                let ok = match l.try_acquire(None, now.into(), now.into()) {
                    Answer::Granted(_) => true,
                    Answer::Refused(..) => false,
                    Answer::Wait(_) => l.acquire(None, now).await.is_ok(),
                };
                admitted += usize::from(ok);
            }
            admitted
        }

        fn lease(l: &Limit) -> Lease {
            l.single.shared().lease
        }

        /// The store's count of leased calls in the current window.
        fn leased(memory: &Memory, store: &ClusterStore) -> u64 {
            let window = store.unix_ms(Instant::now()) / ms(WINDOW);
            memory.get(&crate::cluster::calls_key("svc/shared", "", window))
        }

        const BATCH: LimitScope = LimitScope::ClusterBatch(Duration::from_millis(100));

        #[tokio::test(start_paused = true)]
        async fn batch_agents_lease_shares_and_never_admit_more_than_the_amount() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let agents: Vec<_> = (0..3).map(|_| agent(&store, BATCH, 100, None).0).collect();
            // The first call of each asks for a lease of two calls.
            assert_eq!(admit_n(&agents[0], 1).await, 1);
            assert_eq!(lease(&agents[0]).left, 1);
            assert_eq!(leased(&memory, &store), 2);
            // 20 calls per agent per period, every period topped up, for a
            // whole window: 3,000 calls offered for 100.
            let mut admitted = 1;
            for _ in 0..50 {
                for l in &agents {
                    admitted += admit_n(l, 20).await;
                }
                for l in &agents {
                    l.flush().await;
                    // A slice is at most what was left / LEASE_SHARE.
                    let lease = lease(l);
                    assert!(lease.left <= 40, "{lease:?}");
                }
                tokio::time::advance(Duration::from_millis(100)).await;
                assert!(leased(&memory, &store) <= 100);
            }
            assert_eq!(admitted, 100, "leasing admits the amount, no more");
            // Spent: refused without asking the store; only the top-up asks
            // again (once a period, for calls an idle agent gave back).
            let leases = memory.leases.load(Relaxed);
            assert_eq!(admit_n(&agents[2], 20).await, 0);
            assert_eq!(memory.leases.load(Relaxed), leases);
            // The next window starts from zero: the old lease expired with it.
            tokio::time::advance(WINDOW).await;
            assert_eq!(admit_n(&agents[1], 4).await, 4);
        }

        #[tokio::test(start_paused = true)]
        async fn concurrent_calls_waiting_for_a_lease_stay_within_the_amount() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let agents: Vec<_> = (0..2).map(|_| agent(&store, BATCH, 100, None).0).collect();
            // 2 x 40 calls at once, each of 4 rounds: they queue for the
            // leases, and those that find a fresh lease emptied lease again.
            let mut admitted = 0;
            for _ in 0..4 {
                let calls = agents
                    .iter()
                    .flat_map(|l| (0..40).map(move |_| admit_n(l, 1)));
                admitted += futures::future::join_all(calls)
                    .await
                    .into_iter()
                    .sum::<usize>();
                assert!(admitted <= 100, "{admitted}");
            }
            assert_eq!(admitted, 100);
            assert_eq!(leased(&memory, &store), 100);
            assert!(agents.iter().all(|l| lease(l).unleased == 0));
        }

        #[tokio::test(start_paused = true)]
        async fn a_lease_running_low_is_topped_up_off_the_request_path() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let (a, _) = agent(&store, BATCH, 10_000, None);
            assert_eq!(admit_n(&a, 30).await, 30);
            // The first lease was 2, then each empty lease asked for twice
            // the calls asked for so far.
            let asked = memory.leases.load(Relaxed);
            assert!((2..=6).contains(&asked), "{asked}");
            a.flush().await;
            // 30 calls in the period: topped up to two periods' worth.
            assert_eq!(lease(&a).left, 60);
            assert_eq!(lease(&a).per_period, 30);
            let asked = memory.leases.load(Relaxed);
            // Another period at that rate uses the lease: no store call.
            assert_eq!(admit_n(&a, 30).await, 30);
            assert_eq!(memory.leases.load(Relaxed), asked);
            assert!(!a.needs_lease(&a.single, Instant::now()));
            // Low (30 of 60 left): the next period's top-up asks for more.
            a.flush().await;
            assert_eq!(lease(&a).left, 60);
            assert_eq!(leased(&memory, &store), 30 + 30 + 60);
        }

        #[tokio::test(start_paused = true)]
        async fn the_last_calls_go_in_shrinking_slices_and_an_idle_agent_gives_its_lease_back() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let (a, _) = agent(&store, BATCH, 100, None);
            let (b, _) = agent(&store, BATCH, 100, None);
            // a is busy: 40 a period, topped up to 80 but at most 1/8 of
            // what is left at each lease.
            assert_eq!(admit_n(&a, 40).await, 40);
            let before = lease(&a);
            a.flush().await;
            let topped = lease(&a).left - before.left;
            assert!(
                topped <= (100 - before.total).div_ceil(8),
                "{topped} more on {before:?}"
            );
            // Then a has no traffic for a period: its lease goes back.
            tokio::time::advance(Duration::from_millis(100)).await;
            a.flush().await;
            a.flush().await;
            assert_eq!(lease(&a).left, 0);
            assert_eq!(leased(&memory, &store), 40);
            // b gets everything that is left.
            assert_eq!(admit_n(&b, 100).await, 60);
            assert_eq!(leased(&memory, &store), 100);
            assert_eq!(admit_n(&a, 5).await, 0, "the budget is spent");
        }

        #[tokio::test(start_paused = true)]
        async fn a_lease_expires_with_its_window() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let (a, _) = agent(&store, BATCH, 10, None);
            assert_eq!(admit_n(&a, 3).await, 3);
            a.flush().await;
            assert!(lease(&a).left > 0);
            tokio::time::advance(WINDOW).await;
            // The new window holds nothing: the old lease is not used.
            assert!(a.needs_lease(&a.single, Instant::now()));
            assert_eq!(lease(&a).left, 0);
            assert_eq!(leased(&memory, &store), 0);
            assert_eq!(admit_n(&a, 12).await, 10);
            assert_eq!(leased(&memory, &store), 10);
        }

        #[tokio::test(start_paused = true)]
        async fn redis_down_mid_lease_uses_the_lease_then_counts_locally_and_reports_back() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let (a, _) = agent(&store, BATCH, 50, None);
            let (b, _) = agent(&store, BATCH, 50, None);
            assert_eq!(admit_n(&b, 10).await, 10);
            assert_eq!(admit_n(&a, 10).await, 10);
            a.flush().await;
            let held = lease(&a);
            assert!(held.left > 0, "{held:?}");
            let total = held.total;
            assert_eq!(leased(&memory, &store), total, "a's answer was the last");
            memory.down.store(true, Relaxed);
            // The lease is used first, with no store call...
            assert_eq!(admit_n(&a, held.left as usize).await, held.left as usize);
            assert!(store.is_up(), "no call to the store yet");
            // ...then the call that finds it empty notices the outage and the
            // agent counts on from the window's last known total.
            assert_eq!(admit_n(&a, 100).await as u64, 50 - total);
            assert!(!store.is_up());
            assert_eq!(store.outages(), 1);
            assert_eq!(lease(&a).unleased, 50 - total);
            // The store is back: the unleased calls reach it with the next lease.
            memory.down.store(false, Relaxed);
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(store.is_up(), "the probe saw it back");
            a.flush().await;
            assert_eq!(lease(&a).unleased, 0);
            // Its calls fill the window's budget: no lease on top.
            assert_eq!(leased(&memory, &store), 50);
            assert_eq!(lease(&a).left, 0);
        }

        /// Why a window can admit fewer than the amount: an agent that stops
        /// taking calls holds the calls it leased until its next top-ups give
        /// them back, and the other agent's refusal meanwhile engages a latch.
        /// Nothing is lost: once given back, the store counts the calls made.
        #[tokio::test(start_paused = true)]
        async fn an_idle_agents_lease_is_given_back_late_not_lost() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let latch = Some(ReleaseSpec::After(Duration::from_secs(3600)));
            let (a, _) = agent(&store, BATCH, 4, latch);
            let (b, _) = agent(&store, BATCH, 4, latch);
            assert_eq!(admit_n(&a, 1).await, 1);
            // a's top-up leases ahead of traffic that does not come.
            a.flush().await;
            let held = lease(&a).left;
            assert!(held > 0, "{:?}", lease(&a));
            // b gets what is left, then is refused: the latch engages.
            let made_by_b = admit_n(&b, 4).await;
            assert_eq!(1 + made_by_b + held as usize, 4);
            assert!(b.engaged());
            b.flush().await;
            // a's next top-ups: it learns the latch and gives its lease back.
            a.flush().await;
            a.flush().await;
            assert_eq!(lease(&a).left, 0);
            assert_eq!(leased(&memory, &store), 1 + made_by_b as u64);
        }

        #[tokio::test(start_paused = true)]
        async fn exact_counts_every_call_in_the_store() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let (a, _) = agent(&store, EXACT, 5, None);
            let (b, _) = agent(&store, EXACT, 5, None);
            assert!(a.remote());
            let mut admitted = 0;
            for i in 0..12 {
                let l = if i % 2 == 0 { &a } else { &b };
                if l.admit_exact(&l.single, Instant::now()).await.is_ok() {
                    admitted += 1;
                }
            }
            assert_eq!(admitted, 5);
        }

        /// Sets a counter of the fake store.
        fn set(memory: &Memory, key: String, value: u64) {
            memory.counters.lock().unwrap().insert(key, value);
        }

        /// Sliding-window leases stay within the weighted estimate at every
        /// moment: with 80 calls in the window before, the calls leased at
        /// the window's start are what those 80 leave then (20), and more
        /// come as the previous window weighs less. (Leased as a fixed
        /// window, the first period would take all 100.)
        #[tokio::test(start_paused = true)]
        async fn batch_sliding_window_leases_stay_within_the_estimate() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let w = ms(WINDOW);
            let window = store.unix_ms(Instant::now()) / w;
            set(
                &memory,
                crate::cluster::calls_key("svc/shared", "", window - 1),
                80,
            );
            let sliding = |_| counting(&store, BATCH, 100, None, Algorithm::SlidingWindow).0;
            let agents: Vec<_> = (0..3).map(sliding).collect();
            let mut admitted = 0;
            for _ in 0..100 {
                for l in &agents {
                    admitted += admit_n(l, 5).await as u64;
                }
                let elapsed = store.unix_ms(Instant::now()) % w;
                let fits = crate::cluster::sliding_left(100, w, elapsed, 80, 0);
                assert!(admitted <= fits, "{admitted} at {elapsed} ms, {fits} fit");
                for l in &agents {
                    l.flush().await;
                }
                tokio::time::advance(Duration::from_millis(100)).await;
            }
            // At 9.9 s the 80 weigh 0.8: 100 fit; leases left unused at the
            // end are the rest.
            assert!(admitted >= 95, "{admitted}");
            // Halfway through the next window, this one's leased calls
            // weigh half.
            let previous = memory.get(&crate::cluster::calls_key("svc/shared", "", window));
            tokio::time::advance(WINDOW / 2).await;
            let fits = crate::cluster::sliding_left(100, w, w / 2, previous, 0);
            let mut next = 0;
            for l in &agents {
                next += admit_n(l, 40).await as u64;
            }
            assert!(next <= fits && next + 3 >= fits, "{next} of {fits}");
        }

        /// A token bucket leased by three agents: the burst, then the rate,
        /// never more than the bucket admits with a burst larger by the
        /// calls of two periods (the hold of a leased call: the bound of
        /// docs/operations.md), and the bucket's one key holds the arrival
        /// time. (Leased as a fixed window, 100 would pass in the first 2 s.)
        #[tokio::test(start_paused = true)]
        async fn batch_token_bucket_agents_share_one_bucket_within_its_bound() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            // 100 per 10 s: one call every 100 ms, 10 at once.
            let bucket = Algorithm::TokenBucket { burst: 10 };
            let agents: Vec<_> = (0..3)
                .map(|_| counting(&store, BATCH, 100, None, bucket).0)
                .collect();
            let start = Instant::now();
            let mut admitted = 0;
            for _ in 0..50 {
                for l in &agents {
                    admitted += admit_n(l, 5).await as u64;
                }
                let t = ms(start.elapsed());
                // The bucket alone: 10 + t / 100 ms; the hold adds 2 x 100 ms.
                let bound = 10 + t / 100 + 2;
                assert!(admitted <= bound, "{admitted} at {t} ms");
                for l in &agents {
                    l.flush().await;
                }
                tokio::time::advance(Duration::from_millis(100)).await;
            }
            // 4.9 s: the bucket alone admits 59.
            assert!((54..=61).contains(&admitted), "{admitted}");
            let tat = memory.get(&crate::cluster::bucket_key("svc/shared", ""));
            let now_us = store.unix_us(Instant::now());
            assert!(
                tat > now_us && tat <= now_us + 1_100_000,
                "{tat} at {now_us}"
            );
        }

        /// An idle agent gives its bucket calls back when nobody leased after
        /// them; after another agent's lease they stay spent (their times in
        /// the bucket are behind the other's calls, which keep theirs).
        #[tokio::test(start_paused = true)]
        async fn an_idle_bucket_lease_goes_back_only_from_the_end_of_the_bucket() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let bucket = Algorithm::TokenBucket { burst: 10 };
            let (a, _) = counting(&store, BATCH, 100, None, bucket);
            let (b, _) = counting(&store, BATCH, 100, None, bucket);
            let key = crate::cluster::bucket_key("svc/shared", "");
            let t0 = store.unix_us(Instant::now());
            assert_eq!(admit_n(&a, 1).await, 1);
            a.flush().await;
            let held = lease(&a).left;
            assert!(held > 0, "{:?}", lease(&a));
            assert_eq!(memory.get(&key), t0 + (1 + held) * 100_000);
            // Idle for a period: all of it goes back.
            tokio::time::advance(Duration::from_millis(100)).await;
            a.flush().await;
            a.flush().await;
            assert_eq!(lease(&a).left, 0);
            assert_eq!(memory.get(&key), t0 + 100_000, "the one call made");
            // a leases again, then b after it: a's calls stay spent.
            assert_eq!(admit_n(&a, 1).await, 1);
            a.flush().await;
            assert_eq!(admit_n(&b, 1).await, 1);
            let before = memory.get(&key);
            tokio::time::advance(Duration::from_millis(100)).await;
            a.flush().await;
            a.flush().await;
            assert_eq!(lease(&a).left, 0, "dropped here");
            assert_eq!(memory.get(&key), before, "not returned to the store");
        }

        /// Releasing one key deletes its algorithm's state in the store: the
        /// bucket's key (full again), a sliding window's count and the
        /// window before's (as a local release does), not only a window's
        /// counter.
        #[tokio::test(start_paused = true)]
        async fn releasing_a_key_deletes_its_algorithms_counters_in_the_store() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let window = store.unix_ms(Instant::now()) / ms(WINDOW);
            let calls = |w| crate::cluster::calls_key("svc/shared", "", w);
            let bucket = crate::cluster::bucket_key("svc/shared", "");
            for (algorithm, keys) in [
                (Algorithm::TokenBucket { burst: 5 }, vec![bucket]),
                (
                    Algorithm::SlidingWindow,
                    vec![calls(window), calls(window - 1)],
                ),
            ] {
                let (l, _) = counting(&store, BATCH, 10, None, algorithm);
                for key in &keys {
                    set(&memory, key.clone(), 7);
                }
                assert_eq!(l.release_shared(Some("")).await, Some(0));
                let left = memory.counters.lock().unwrap().clone();
                assert!(keys.iter().all(|k| !left.contains_key(k)), "{left:?}");
            }
        }

        /// `sync exact timeout 200ms` with `fallback`.
        fn exact(fallback: Fallback) -> LimitScope {
            LimitScope::ClusterExact(ExactSync {
                timeout: Duration::from_millis(200),
                fallback,
            })
        }

        const EXACT: LimitScope = LimitScope::ClusterExact(ExactSync {
            timeout: Duration::from_millis(200),
            fallback: Fallback::Local,
        });

        /// Calls of `sync exact` agents in turn; how many were admitted.
        async fn exact_calls(agents: &[&Arc<Limit>], n: usize) -> usize {
            let mut admitted = 0;
            for i in 0..n {
                admitted += admit_n(agents[i % agents.len()], 1).await;
            }
            admitted
        }

        fn fallbacks(store: &ClusterStore, f: Fallback) -> u64 {
            store.fallbacks()[f as usize].1
        }

        #[tokio::test(start_paused = true)]
        async fn exact_waits_for_a_slow_store_up_to_its_timeout() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            // Slower than the store's 50ms default, within the limit's 200ms.
            memory.delay_ms.store(150, Relaxed);
            let (a, _) = agent(&store, exact(Fallback::Local), 5, None);
            let (b, _) = agent(&store, exact(Fallback::Local), 5, None);
            assert_eq!(exact_calls(&[&a, &b], 12).await, 5);
            assert!(store.is_up());
            assert!(store.fallbacks().iter().all(|(_, n)| *n == 0));
        }

        /// A store that answers late: the first calls are counted there, then
        /// every call waits the timeout and the declared fallback decides it.
        async fn slow_store_admits(fallback: Fallback) -> (usize, ClusterStore, Arc<Limit>) {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let latch = Some(ReleaseSpec::After(Duration::from_secs(3600)));
            let (a, _) = agent(&store, exact(fallback), 4, latch);
            let (b, _) = agent(&store, exact(fallback), 4, latch);
            let mut admitted = exact_calls(&[&a, &b], 2).await;
            memory.delay_ms.store(300, Relaxed);
            let start = Instant::now();
            admitted += exact_calls(&[&a, &b], 2).await;
            assert_eq!(
                start.elapsed(),
                Duration::from_millis(200),
                "waited the timeout"
            );
            assert!(!store.is_up());
            // Down: decided at once, without waiting.
            admitted += exact_calls(&[&a, &b], 10).await;
            (admitted, store, a)
        }

        #[tokio::test(start_paused = true)]
        async fn exact_fallback_reject_never_admits_more_than_the_amount() {
            let (admitted, store, a) = slow_store_admits(Fallback::Reject).await;
            assert_eq!(admitted, 2, "the two the store counted");
            assert!(
                !a.engaged(),
                "the store's silence is not a call over the amount"
            );
            assert_eq!(fallbacks(&store, Fallback::Reject), 12);
            assert_eq!(fallbacks(&store, Fallback::Local), 0);
        }

        #[tokio::test(start_paused = true)]
        async fn exact_fallback_local_counts_each_agent_alone() {
            let (admitted, store, _) = slow_store_admits(Fallback::Local).await;
            // Two in the store, then each agent its full amount locally (and
            // the calls over it engage the latch, as without a store).
            assert_eq!(admitted, 2 + 4 + 4);
            // Each agent's sixth call met its own latch, not the fallback.
            assert_eq!(fallbacks(&store, Fallback::Local), 10);
        }

        #[tokio::test(start_paused = true)]
        async fn exact_fallback_allow_admits_every_call() {
            let (admitted, store, _) = slow_store_admits(Fallback::Allow).await;
            assert_eq!(admitted, 14);
            assert_eq!(fallbacks(&store, Fallback::Allow), 12);
        }

        #[tokio::test(start_paused = true)]
        async fn a_store_slower_than_the_default_but_within_the_timeout_comes_back() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let (a, _) = agent(&store, exact(Fallback::Reject), 100, None);
            memory.delay_ms.store(300, Relaxed);
            assert_eq!(exact_calls(&[&a], 1).await, 0);
            assert!(!store.is_up());
            // 150ms: over the store's 50ms default, within the limit's 200ms.
            memory.delay_ms.store(150, Relaxed);
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(
                store.is_up(),
                "the probe waits as long as the missed deadline"
            );
            assert_eq!(exact_calls(&[&a], 3).await, 3);
        }

        #[tokio::test(start_paused = true)]
        async fn a_latch_engaged_by_one_agent_holds_for_all_until_released() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let batch = BATCH;
            let latch = Some(ReleaseSpec::After(Duration::from_secs(3600)));
            let (a, _) = agent(&store, batch, 2, latch);
            let (b, mut b_events) = agent(&store, batch, 2, latch);
            assert_eq!(admit_n(&a, 3).await, 2);
            assert!(a.engaged());
            a.flush().await;
            b.flush().await;
            assert!(b.engaged(), "b sees the latch a engaged");
            assert_eq!(b_events.try_recv().unwrap().kind, EventKind::LimitEngaged);
            // Engaged for b in later windows too.
            tokio::time::advance(WINDOW).await;
            assert_eq!(admit_n(&b, 1).await, 0);
            // A release on a clears the store; b follows at its next flush.
            assert!(a.release("ops", None));
            // The background delete or this one removed the latch.
            assert!(a.release_shared(None).await.is_some());
            assert!(memory.latches.lock().unwrap().is_empty());
            b.flush().await;
            assert!(!b.engaged());
            assert_eq!(b_events.try_recv().unwrap().kind, EventKind::LimitReleased);
            assert_eq!(admit_n(&b, 1).await, 1);
        }

        #[tokio::test(start_paused = true)]
        async fn an_outage_counts_locally_and_keeps_deltas_until_the_store_is_back() {
            let memory = Arc::new(Memory::default());
            let store = store(&memory);
            align(&store).await;
            let (a, _) = agent(&store, BATCH, 10, None);
            let (x, _) = agent(&store, EXACT, 3, None);
            memory.down.store(true, Relaxed);
            assert_eq!(admit_n(&a, 4).await, 4);
            a.flush().await;
            assert!(!store.is_up());
            assert_eq!(store.outages(), 1);
            // Exact falls back to the full local amount without asking the store.
            assert!(!x.remote());
            let mut admitted = 0;
            for _ in 0..5 {
                if x.admit_exact(&x.single, Instant::now()).await.is_ok() {
                    admitted += 1;
                }
            }
            assert_eq!(admitted, 3);
            // Flushes while down do not touch the store; deltas stay.
            a.flush().await;
            assert_eq!(lease(&a).unleased, 4);
            assert_eq!(store.outages(), 1, "one outage, however many calls");
            memory.down.store(false, Relaxed);
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(store.is_up(), "the probe saw it back");
            assert!(x.remote());
            a.flush().await;
            assert_eq!(lease(&a).unleased, 0);
            assert_eq!(
                leased(&memory, &store),
                4 + lease(&a).left,
                "the outage's calls reached the store with the next lease"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn keys_count_separately() {
        let (l, _rx) = limit(Some(1), None, Some(ReleaseSpec::Manual));
        let crm = l.cell_for(Some("crm"));
        let shop = l.cell_for(Some("shop"));
        assert!(l.try_admit(l.cell(&crm), Instant::now()).is_ok());
        let e = l.try_admit(l.cell(&crm), Instant::now()).unwrap_err();
        l.refuse(l.cell(&crm), e, Instant::now());
        // One consumer engaged does not affect another.
        assert!(l.try_admit(l.cell(&shop), Instant::now()).is_ok());
        assert!(
            l.try_admit(l.cell(&l.cell_for(Some("crm"))), Instant::now())
                .is_err()
        );
    }

    /// A local limit of `amount` calls per second by `algorithm`, shared
    /// `a 1  b 1  default 1`.
    fn shared(algorithm: Algorithm, amount: u64, release: Option<ReleaseSpec>) -> Limit {
        let (l, _rx) = limit(Some(amount), None, release);
        let spec = LimitSpec {
            algorithm,
            share: Some(crate::state::bulkhead::share::ShareSpec {
                weights: vec![("a".into(), 1), ("b".into(), 1)],
                default_weight: 1,
            }),
            ..l.spec.clone()
        };
        Limit::new(
            spec,
            "svc/l".into(),
            Events::new(),
            None,
            &Weight::default(),
        )
    }

    /// One call of `consumer` through the limit's primitive, now.
    fn call(l: &Limit, consumer: Option<&str>) -> bool {
        let class = l.share.as_ref().map(|s| s.class(consumer));
        let scope = match class {
            Some(c) => CellRef::Own(Some(c), crate::criticality::Class::Default),
            None => CellRef::Single,
        };
        let now = Instant::now();
        match l.try_acquire(Some(&scope), now.into(), now.into()) {
            Answer::Granted(_) => true,
            Answer::Refused(RejectReason::LimitCalls, _) => false,
            other => panic!("{other:?}"),
        }
    }

    /// Runs `windows` windows of 100 ticks of 10ms: each tick `greedy` calls
    /// once (100 a window, 10x its share of 30) and, on every tenth tick
    /// from tick `polite_from` on, `a` and `b` call once (10 a window). Returns
    /// the calls admitted by consumer (greedy, a, b), by window.
    async fn run(l: &Limit, windows: usize, polite_from: usize) -> Vec<[u32; 3]> {
        let mut out = vec![[0; 3]; windows];
        for (w, got) in out.iter_mut().enumerate() {
            for tick in 0..100 {
                got[0] += u32::from(call(l, Some("greedy")));
                if tick % 10 == 5 && w * 100 + tick >= polite_from {
                    got[1] += u32::from(call(l, Some("a")));
                    got[2] += u32::from(call(l, Some("b")));
                }
                tokio::time::advance(Duration::from_millis(10)).await;
            }
        }
        out
    }

    /// A greedy consumer at 10x its share cannot starve two polite ones:
    /// with a fixed window each polite one is admitted every call it asks
    /// for (10, its share), the greedy one its share; with a sliding window
    /// or a token bucket at least 6 of 10 (the room trickles back); without
    /// the share the polite ones get 2 or none. No latch engages for a call
    /// refused over its share.
    #[tokio::test(start_paused = true)]
    async fn a_greedy_consumer_cannot_starve_polite_ones() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket { burst: 30 },
        ] {
            // Latched by hand: only the fixed window never exceeds (the
            // others refuse some calls within a share at the window's edge).
            let fixed = algorithm == Algorithm::FixedWindow;
            let l = shared(algorithm, 30, fixed.then_some(ReleaseSpec::Manual));
            let got = run(&l, 6, 0).await;
            for (w, [greedy, a, b]) in got.iter().enumerate().skip(1) {
                if fixed {
                    assert_eq!([*greedy, *a, *b], [10; 3], "window {w}: {got:?}");
                } else {
                    // The algorithm's room comes back a little at a time, and
                    // a call within its share takes what there is: the one
                    // calling 10x as often takes more of it.
                    assert!(*a >= 6 && *b >= 6, "{algorithm:?} {w}: {got:?}");
                    assert!(*greedy <= 17, "{algorithm:?} {w}: {got:?}");
                }
            }
            assert!(!l.is_engaged(&l.single, l.now_ms(Instant::now())));

            let (mut plain, _rx) = limit(Some(30), None, None);
            plain.spec.algorithm = algorithm;
            plain.set_plain();
            let got = run(&plain, 3, 0).await;
            assert!(got[2][1] <= 2, "{algorithm:?} without a share: {got:?}");
        }
    }

    /// Consumers that do not call are idle: the greedy one has the whole
    /// window. A returning consumer is owed its share from its first call
    /// on: it takes what the window has left (nothing here: the polite ones
    /// return halfway through a window the greedy one has used up), then,
    /// active, all it asks for in the next.
    #[tokio::test(start_paused = true)]
    async fn an_idle_share_is_lent_and_taken_back() {
        let l = shared(Algorithm::FixedWindow, 30, None);
        let got = run(&l, 6, 350).await;
        for w in [1, 2, 3] {
            assert_eq!(got[w], [30, 0, 0], "lent: {got:?}");
        }
        for w in [4, 5] {
            assert_eq!(got[w], [10, 10, 10], "taken back: {got:?}");
        }
        // Once the polite ones stop, their shares are lent again after a
        // window.
        let mut greedy = [0; 3];
        for g in &mut greedy {
            for _ in 0..100 {
                *g += u32::from(call(&l, Some("greedy")));
                tokio::time::advance(Duration::from_millis(10)).await;
            }
        }
        assert_eq!(greedy[2], 30, "{greedy:?}");
    }

    /// In a config that declares criticality, a sheddable call leaves the
    /// last tenth of a window to the others, and its refusal engages no
    /// latch; a default or critical call may use the whole window.
    #[tokio::test(start_paused = true)]
    async fn a_sheddable_call_leaves_a_tenth_of_the_window() {
        use crate::criticality::Class;
        let (mut l, _rx) = limit(Some(20), None, Some(ReleaseSpec::Manual));
        l.spec.by_class = true;
        let at = |l: &Limit, crit| {
            let now = Instant::now();
            matches!(
                l.try_acquire(Some(&CellRef::Own(None, crit)), now.into(), now.into()),
                Answer::Granted(_)
            )
        };
        let shed = (0..20).filter(|_| at(&l, Class::Sheddable)).count();
        assert_eq!(shed, 18, "18 of 20: 2 left to the others");
        assert!(!l.is_engaged(&l.single, l.now_ms(Instant::now())));
        assert!(at(&l, Class::Default) && at(&l, Class::Critical));
        assert!(!at(&l, Class::Critical), "the window is used up");
        assert!(l.is_engaged(&l.single, l.now_ms(Instant::now())));
    }

    /// A paced limit's own call ([`Limit::try_acquire_own`], counted at
    /// once where it fits, issue 39), as an answer of the general way.
    fn own(l: &Limit, now: Now) -> Result<Grant, (RejectReason, Option<Duration>)> {
        match l.try_acquire_own(now) {
            Ok(()) => Ok(Grant::default()),
            Err(Answer::Granted(grant)) => Ok(grant),
            Err(Answer::Refused(reason, retry)) => Err((reason, retry)),
            Err(Answer::Wait(d)) => panic!("a local limit waits {d:?}"),
        }
    }

    /// A sliding window or token bucket admits exactly what the old way
    /// admits when 8 threads race for its own counter at one time, with
    /// a previous window's count weighing on the sliding one (issue 39:
    /// the calls counted at once add to the count of the word they read,
    /// by a compare-exchange, and stop where the count and the previous
    /// window's reach the amount; the rest go the exact way), and leaves
    /// the same words.
    #[test]
    fn a_paced_limit_counted_at_once_is_exact_across_threads() {
        let w = Duration::from_secs(1);
        // Small amounts in many rounds: threads let go at once race for
        // the last call of the window.
        let cases: [(Algorithm, u64, u64, u64); 10] = [
            (Algorithm::SlidingWindow, 1, 0, 150),
            (Algorithm::SlidingWindow, 3, 1, 150),
            (Algorithm::SlidingWindow, 10, 6, 30),
            (Algorithm::SlidingWindow, 1000, 0, 3),
            (Algorithm::SlidingWindow, 1000, 700, 3),
            (Algorithm::TokenBucket { burst: 1 }, 10, 0, 150),
            (Algorithm::TokenBucket { burst: 2 }, 10, 0, 150),
            (Algorithm::TokenBucket { burst: 7 }, 10, 0, 30),
            (Algorithm::TokenBucket { burst: 500 }, 1000, 0, 3),
            (Algorithm::SlidingWindow, 2, 0, 150),
        ];
        for (algorithm, amount, previous, rounds) in cases {
            for round in 0..rounds {
                let mut l = limit_with(algorithm, amount, w);
                let mut general = limit_with(algorithm, amount, w);
                // An epoch well after the clock's base, at no whole window.
                set_epoch(&mut l, 5_000_000_123_457);
                set_epoch(&mut general, 5_000_000_123_457);
                general.plain = None;
                general.paced = None;
                assert!(l.paced.is_some());
                // Window 5 (or one wrapped past 2^32), a third of it gone.
                let number: u64 = [5, 1 << 32 | 5, 0xffff_ffff][round as usize % 3];
                let since = number * 1_000_000_000 + 333_333_333;
                let now = Now::from_ns(l.epoch_ns + since);
                let general_now = Now::from_ns(general.epoch_ns + since);
                if previous > 0 {
                    for c in [&l.single, &general.single] {
                        c.calls.store(pack(number - 1, previous), Relaxed);
                    }
                }
                let mut want = 0;
                while own(&general, general_now).is_ok() {
                    want += 1;
                    assert!(want <= amount + previous, "{algorithm:?}");
                }
                let granted = std::sync::atomic::AtomicU64::new(0);
                let start = std::sync::Barrier::new(8);
                std::thread::scope(|s| {
                    for _ in 0..8 {
                        s.spawn(|| {
                            start.wait();
                            for _ in 0..(amount + 50) / 4 + 10 {
                                if own(&l, now).is_ok() {
                                    granted.fetch_add(1, Relaxed);
                                }
                            }
                        });
                    }
                });
                let ctx = format!("{algorithm:?} {amount} {previous} window {number}");
                assert!(want > 0, "{ctx}");
                assert_eq!(granted.into_inner(), want, "{ctx}");
                let words = |c: &LimitCell| (c.calls.load(Relaxed), c.previous.load(Relaxed));
                assert_eq!(words(&l.single), words(&general.single), "{ctx}");
            }
        }
    }

    /// The last call of a window, raced for by threads let go at once (a
    /// spin, not a lock, so they start together), is admitted once: a
    /// call counted at once is counted by a compare-exchange of the word
    /// it read, never an add (or a bucket's move) after a test of a word
    /// another call has counted since (issue 39).
    #[test]
    fn the_last_call_counted_at_once_is_admitted_once() {
        use std::sync::atomic::AtomicUsize;
        let threads = 4;
        for (algorithm, amount) in [
            (Algorithm::SlidingWindow, 2),
            (Algorithm::TokenBucket { burst: 2 }, 10),
        ] {
            for round in 0..1_500 {
                let l = limit_with(algorithm, amount, Duration::from_secs(1));
                let now = Now::from_ns(l.epoch_ns + 7_000_000_000);
                // The window's first call (a sliding one's rolls the word
                // the exact way): one left.
                assert!(own(&l, now).is_ok());
                let (ready, granted) = (AtomicUsize::new(0), AtomicUsize::new(0));
                std::thread::scope(|s| {
                    for _ in 0..threads {
                        s.spawn(|| {
                            ready.fetch_add(1, Relaxed);
                            let mut spins = 0u32;
                            while ready.load(Relaxed) < threads {
                                spins += 1;
                                if spins.is_multiple_of(4096) {
                                    std::thread::yield_now();
                                }
                                std::hint::spin_loop();
                            }
                            granted.fetch_add(usize::from(own(&l, now).is_ok()), Relaxed);
                        });
                    }
                });
                assert_eq!(granted.into_inner(), 1, "{algorithm:?} round {round}");
            }
        }
    }

    /// Puts a limit's epoch `ns` after the clock's base (its windows'
    /// numbers and a bucket's arrival times counted from there), and sets
    /// it up again.
    fn set_epoch(l: &mut Limit, ns: u64) {
        l.epoch_ns = ns;
        l.epoch_now = Now::from_ns(ns);
        l.set_plain();
    }

    /// A paced limit's own call (counted at once where it fits, issue 39)
    /// admits and refuses as the general way does, with the same
    /// `Retry-After`, and leaves the same words, from whatever its words
    /// held: counts of this window, the one before, two before, one
    /// ahead and one 2^32 windows back, near the amount and the 32 bits of
    /// a count, at a window's edges and before the epoch; engaged (a
    /// latch of the general way), released (a fresh count), and again.
    #[test]
    fn a_paced_limit_counted_at_once_decides_as_the_general_way() {
        const MS: u64 = 1_000_000;
        let mut checked = 0u64;
        for algorithm in [
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket { burst: 1 },
            Algorithm::TokenBucket { burst: 3 },
        ] {
            for w_ms in [1u64, 7, 1000] {
                for amount in [0u64, 1, 3, 10, 0xffff_fffe, 1 << 32] {
                    let w = Duration::from_millis(w_ms);
                    let (mut l, _rx) = limit(Some(amount), None, Some(ReleaseSpec::Manual));
                    l.spec.algorithm = algorithm;
                    l.spec.calls = Some(RateSpec { amount, window: w });
                    // An epoch at no whole window after the clock's base:
                    // 3.5 windows (the base's time in the window's range
                    // too), or 83 minutes.
                    let w_ns = w_ms * MS;
                    let epoch =
                        [3 * w_ns + w_ns / 2 + 12_345, 5_000_000_123_457][amount as usize % 2];
                    set_epoch(&mut l, epoch);
                    let (mut general, _rx2) = limit(Some(amount), None, Some(ReleaseSpec::Manual));
                    general.spec = l.spec.clone();
                    set_epoch(&mut general, epoch);
                    general.plain = None;
                    general.paced = None;
                    let sliding = algorithm == Algorithm::SlidingWindow;
                    if sliding {
                        assert!(matches!(l.paced, Some(Paced::SlidingPlain(_))));
                    }
                    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ amount ^ w_ms;
                    for i in 0..3_000u64 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let since = match x % 16 {
                            0 => None,
                            1 => Some((x >> 8) % 3 * w_ns),
                            2 => Some(((x >> 8) % 40 + 1) * w_ns - 1),
                            3 => Some((1 << 32) * w_ns + (x >> 8) % w_ns),
                            4 => Some(0xffff_ffff * w_ns + (x >> 8) % (2 * w_ns)),
                            _ => Some(i * w_ns / 3 + (x >> 8) % w_ns),
                        };
                        let at = |l: &Limit| match since {
                            Some(s) => Now::from_ns(l.epoch_ns + s),
                            None => {
                                Now::from_ns(l.epoch_ns.saturating_sub(1 + (x >> 8) % (5 * w_ns)))
                            }
                        };
                        let number = since.unwrap_or(0) / w_ns;
                        // The words: kept from the last call most times, set.
                        if x >> 60 < 6 {
                            // And the windows the epoch's distance from the
                            // clock's base (or two) puts ahead: counted as
                            // ahead, not as now.
                            let ahead = l.epoch_ns / w_ns + (x >> 10) % 2;
                            let back = [
                                0,
                                1,
                                2,
                                u64::MAX,
                                1 << 32,
                                ahead.wrapping_neg(),
                                u64::MAX - 1,
                            ][(x >> 4) as usize % 7];
                            let win = number.wrapping_sub(back);
                            let count = match (x >> 24) % 5 {
                                0 => (x >> 32) % 4,
                                1 => amount.saturating_sub((x >> 32) % 4),
                                2 => 0xffff_ffff - (x >> 32) % 3,
                                3 => (x >> 32) % 12,
                                _ => x >> 33,
                            };
                            let pc = match (x >> 40) % 3 {
                                0 => (x >> 42) % 12,
                                1 => amount.saturating_sub((x >> 42) % 4),
                                _ => x >> 42,
                            };
                            let pwin = win.wrapping_sub([1, 0, 2, 7][(x >> 50) as usize % 4]);
                            // A count at the word's top, none before it.
                            let top = [(0xffff_ffff, 0), (0xffff_fffe, 0), (0xffff_fffe, 1)];
                            let (calls, previous) = if sliding && (x >> 56).is_multiple_of(8) {
                                let (count, pc) = top[(x >> 20) as usize % 3];
                                (pack(number, count), pack(number.wrapping_sub(1), pc))
                            } else if sliding {
                                (pack(win, count), pack(pwin, pc))
                            } else {
                                let t = since.unwrap_or(0) + w_ns * ((x >> 24) % 4);
                                (t - (x >> 30) % (2 * w_ns).min(t + 1), 0)
                            };
                            for c in [&l.single, &general.single] {
                                c.calls.store(calls, Relaxed);
                                c.previous.store(previous, Relaxed);
                            }
                        }
                        let ctx = format!(
                            "{algorithm:?} {w_ms} ms {amount}, call {i} at {since:?}, words {:#x} {:#x}",
                            l.single.calls.load(Relaxed),
                            l.single.previous.load(Relaxed)
                        );
                        let got = own(&l, at(&l));
                        let want = own(&general, at(&general));
                        assert_eq!(got, want, "{ctx}");
                        for (a, b) in [
                            (&l.single.calls, &general.single.calls),
                            (&l.single.previous, &general.single.previous),
                            (&l.single.engaged_until, &general.single.engaged_until),
                        ] {
                            assert_eq!(a.load(Relaxed), b.load(Relaxed), "{ctx}");
                        }
                        if l.single.engaged_until.load(Relaxed) != NOT_ENGAGED
                            && x.is_multiple_of(3)
                        {
                            assert_eq!(l.release("op", None), general.release("op", None));
                            // A fresh count of the wall clock's window: the
                            // general way's as the limit's.
                            for (a, b) in [
                                (&l.single.calls, &general.single.calls),
                                (&l.single.previous, &general.single.previous),
                            ] {
                                b.store(a.load(Relaxed), Relaxed);
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked >= 50_000, "{checked}");
    }

    /// Under `scale with warmup` a sliding window or token bucket is not
    /// paced, so no call of it is counted at once (issue 39): at a tenth
    /// of its weight its own calls admit a tenth of the amount.
    #[test]
    fn a_warming_paced_limit_is_not_counted_at_once() {
        for algorithm in [
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket { burst: 10 },
        ] {
            let (mut l, _rx) = limit(Some(10), None, None);
            l.spec.algorithm = algorithm;
            l.spec.warmup_scale = true;
            let weight = Weight::default();
            weight.set(crate::weight::FULL_WEIGHT / 10);
            l.weight = Some(weight);
            l.set_plain();
            assert!(l.paced.is_none() && l.plain.is_none(), "{algorithm:?}");
            let now = Now::from_ns(l.epoch_ns + 3_000_000_000);
            let granted = (0..20).filter(|_| own(&l, now).is_ok()).count();
            assert_eq!(granted, 1, "{algorithm:?}");
        }
    }
}
