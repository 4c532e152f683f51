//! The shared counter store of `scope cluster` limits, behind a [`Backend`]
//! (Redis in `gov-agent`: `gov_agent::cluster::redis`; an in-memory fake in unit
//! tests). This crate has no Redis client: it says what limits need from a store
//! and what happens when the store fails.
//!
//! Keys (one Redis database; the rule name never contains `:`; `RULE`, `KEY`
//! and `W` are placeholders, the braces are literal):
//! - `gov:{RULE:KEY}:W`: calls of one key in one fixed window (`sync exact`:
//!   made; `sync batch`: leased) (`W` = Unix time in ms / window length),
//!   expiring after two windows;
//! - `gov:{RULE:KEY}:bucket`: a token bucket's arrival time (Unix us),
//!   made or leased alike, expiring when the bucket is full again;
//! - `gov:{RULE:KEY}:bytes:W`: request + response bytes, likewise;
//! - `gov:{RULE:KEY}:latch`: present while the limit is engaged for that key,
//!   with `PX` = `release after` (no expiry for `release manual`).
//!
//! The braces are a Redis Cluster hash tag: the keys of one rule and key hash
//! to one slot, so the `sync exact` script (counter and latch) and a key's
//! flush pipeline run on one node of a cluster, while the keys of different
//! consumers spread over the cluster. The tag ends at the first `}`, which is
//! at the same place in all three keys whatever `KEY` holds.
//!
//! `sync exact` runs one small Lua script per call (`EVALSHA`: latch check,
//! `INCRBY`, `PEXPIRE` on the first hit, engage when over): one round trip.
//! `sync batch D` *leases* calls: an agent takes a slice of the window's
//! remaining calls from the store in one atomic script ([`LeaseCall`]: the
//! counter holds the calls leased, not the calls made) and admits locally
//! while it holds permits. Every D it tops the lease up for keys that were
//! used (asking for about two periods of its own traffic) and gives back the
//! lease of keys that were not, so an idle agent strands nothing; a slice
//! is at most [`LEASE_SHARE`]th of what is left, so slices shrink as the
//! budget runs out (a sliding window leases from what its estimate leaves
//! when leased, a token bucket calls whose times in the bucket fit its
//! burst then: [`LeaseAlgorithm`]). A call that finds its lease empty asks the store itself
//! (one round trip, the uncommon case). While the store answers, a window
//! admits at most the amount. Bytes are counted locally and flushed every D in
//! one pipeline (`INCRBY` + `PEXPIRE` + `PTTL` of the latch), reading back the
//! cluster totals. Every call has a deadline: a `sync exact` call its limit's
//! declared `timeout`, the others [`DEFAULT_TIMEOUT`]. On an error or a
//! timeout the store is marked down (logged once per outage), and a
//! background probe marks it up again when Redis answers `PING`. Meanwhile
//! `sync batch` limits count locally with their full amount (calls admitted
//! without a lease are added to the store with the next lease of the
//! window), and a `sync exact` limit's declared [`Fallback`] decides each
//! call (counted in [`ClusterStore::fallbacks`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// The deadline of a lease, a flush and a probe's `PING` (a `sync exact`
/// call has its limit's own, [`ExactSync::timeout`](crate::config::ExactSync)).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// What decides a `sync exact` call the store did not answer within the
/// limit's timeout, or while the store is down: `sync exact timeout D
/// fallback local|reject|allow`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// Counted by this agent alone with the full amount: N agents admit up
    /// to N times the amount while the store is away.
    Local,
    /// Refused with the limit's rejection (no latch engages): the window
    /// never admits more than the amount.
    Reject,
    /// Admitted without counting.
    Allow,
}

impl Fallback {
    /// Every fallback, in the order of [`ClusterStore::fallbacks`].
    pub const ALL: [Fallback; 3] = [Fallback::Local, Fallback::Reject, Fallback::Allow];

    /// `local`, `reject`, `allow`: the word in `.gov` and in `/metrics`.
    pub fn word(self) -> &'static str {
        match self {
            Fallback::Local => "local",
            Fallback::Reject => "reject",
            Fallback::Allow => "allow",
        }
    }
}

/// How often a down store is probed with `PING`.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(250);

/// How long a store that answered the probe must go without an error before
/// its outage ends (logged, counted). A store that fails again within it (a
/// failover that the probe sees before the calls do) is the same outage: it
/// is logged once, not once per flap.
pub(crate) const SETTLE: Duration = Duration::from_secs(1);

/// A lease takes at most this fraction (1/N) of the calls a window has left,
/// so the last calls of a window go out in small slices and an agent that
/// stops taking traffic holds few of them.
pub const LEASE_SHARE: u64 = 8;

/// The latch state read from the store: `None` not engaged, `Some(None)`
/// engaged until released by hand, `Some(Some(d))` engaged for `d` more.
pub type Latch = Option<Option<Duration>>;

/// One `sync exact` call.
#[derive(Clone, Debug)]
pub struct ExactCall {
    pub counter: String,
    pub latch: String,
    pub expiry_ms: u64,
    pub amount: u64,
    /// 0: no latch, -1: manual, else `release after` in ms.
    pub latch_ms: i64,
    /// How `counter` counts.
    pub algorithm: StoreAlgorithm,
}

/// The calls algorithm of an [`ExactCall`] (`algorithm` of the limit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreAlgorithm {
    /// `counter` is the window's count; every call adds one (over the
    /// amount too: the engine refuses a count above it).
    FixedWindow,
    /// `counter` is this window's count, `previous` the window before's; a
    /// call is counted only when `previous * (window - elapsed) / window +
    /// count < amount`, else refused ([`ExactReply::Refused`]).
    SlidingWindow {
        previous: String,
        window_ms: u64,
        elapsed_ms: u64,
    },
    /// GCRA: `counter` (the bucket's one key, [`bucket_key`]) holds the
    /// theoretical arrival time in Unix microseconds; a call is admitted
    /// while it is at most `tolerance_us` ahead of `now_us`, and moves it
    /// `interval_us` on.
    TokenBucket {
        now_us: u64,
        interval_us: u64,
        tolerance_us: u64,
    },
}

/// The answer to an [`ExactCall`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExactReply {
    /// The key's count in this window, this call included (fixed window);
    /// admitted (the other algorithms).
    Counted(u64),
    /// Not counted: over the limit (sliding window, token bucket); a call
    /// fits after the wait.
    Refused(Duration),
    /// The limit is engaged (by this call or before).
    Engaged(Option<Duration>),
}

/// A sliding window's wait: the milliseconds from `elapsed` (into the current
/// window) until `previous * (w - e) + count * w < amount * w`, the current
/// window's count being `count`; past the window's end, the next one starts
/// with `previous = count`.
pub fn sliding_wait_ms(amount: u64, w: u64, elapsed: u64, previous: u64, count: u64) -> u64 {
    let w = w.max(1);
    let elapsed = elapsed.min(w - 1);
    let (amount, w128) = (u128::from(amount), u128::from(w));
    let fits_at = |previous: u128, count: u128| -> Option<u64> {
        // The smallest e with previous * (w - e) < (amount - count) * w.
        if count >= amount {
            return None;
        }
        if previous == 0 {
            return Some(0);
        }
        let room = (amount - count) * w128;
        let span = room.div_ceil(previous); // w - e must be < room / previous
        Some(u64::try_from(w128.saturating_sub(span) + 1).unwrap_or(w))
    };
    if let Some(e) = fits_at(u128::from(previous), u128::from(count)) {
        return e.saturating_sub(elapsed).max(1);
    }
    // Not in this window: in the next, whose previous count is this one's.
    let next = fits_at(u128::from(count), 0).unwrap_or(w);
    (w - elapsed).saturating_add(next).max(1)
}

/// One lease of `sync batch` calls for one key and window, in one atomic
/// step: give back `give_back`, add `unleased`, then lease up to `want` of
/// what is left ([`lease_grant`]), unless the latch is set.
#[derive(Clone, Debug)]
pub struct LeaseCall {
    /// The window's counter of leased calls.
    pub counter: String,
    pub latch: String,
    pub expiry_ms: u64,
    pub amount: u64,
    /// Calls wanted.
    pub want: u64,
    /// Calls this agent admitted in the window without a lease (while the
    /// store was down): counted first.
    pub unleased: u64,
    /// Unused calls of this agent's lease in the window, returned first.
    pub give_back: u64,
    /// How the calls are counted (`counter` is the bucket's key for a token
    /// bucket).
    pub algorithm: LeaseAlgorithm,
}

/// The calls algorithm of a [`LeaseCall`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseAlgorithm {
    /// `counter` holds the window's leased and counted calls; a lease
    /// grants from `amount - counter` ([`lease_grant`]).
    FixedWindow,
    /// The same counter, and `previous` the window before's: a lease grants
    /// from what the weighted estimate leaves ([`sliding_left`]), so that
    /// calls leased now still fit when they are made later in the window
    /// (the previous window only weighs less by then).
    SlidingWindow {
        previous: String,
        window_ms: u64,
        elapsed_ms: u64,
    },
    /// GCRA: `counter` is the bucket's theoretical arrival time (Unix us); a
    /// lease of k calls moves it k intervals on, within the tolerance
    /// ([`bucket_lease`]). `give_back` calls are returned only when the
    /// bucket's arrival time is still `end_us`, the end of this agent's last
    /// lease (nobody leased after it: their calls' times stay unique);
    /// `unleased` is not sent (calls made without the store are in the
    /// bucket's past).
    TokenBucket {
        now_us: u64,
        interval_us: u64,
        tolerance_us: u64,
        end_us: u64,
    },
}

/// The answer to a [`LeaseCall`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseReply {
    /// `granted` calls are this agent's; `total` calls of the window are
    /// leased or counted by all agents, these included (a token bucket: its
    /// arrival time after the lease, Unix us, the end of the calls
    /// granted); `previous`: the window before's count (sliding window; 0
    /// for the others).
    Granted {
        granted: u64,
        total: u64,
        previous: u64,
    },
    /// The limit is engaged (nothing leased).
    Engaged(Option<Duration>),
}

/// How many calls a lease grants: at most `want` and at most a
/// [`LEASE_SHARE`]th (rounded up) of what the window has left after the
/// give-back and the unleased calls. The Redis script computes the same.
pub fn lease_grant(amount: u64, count: u64, unleased: u64, give_back: u64, want: u64) -> u64 {
    let left = amount.saturating_sub(count.saturating_sub(give_back).saturating_add(unleased));
    want.min(left.div_ceil(LEASE_SHARE))
}

/// How many calls a sliding window has left `elapsed` ms into a window of
/// `w` ms, with `previous` calls in the window before and `count` in this
/// one: the calls that, made one after the other now, each still find
/// `previous * (w - elapsed) / w + count < amount`. Made later in the
/// window they fit too (the previous window weighs less).
pub fn sliding_left(amount: u64, w: u64, elapsed: u64, previous: u64, count: u64) -> u64 {
    let w = u128::from(w.max(1));
    let weighed = u128::from(previous) * (w - u128::from(elapsed).min(w - 1));
    let room = (u128::from(amount) * w).saturating_sub(weighed);
    u64::try_from(room.div_ceil(w).saturating_sub(u128::from(count))).unwrap_or(u64::MAX)
}

/// A token bucket's lease at `now_us` of a bucket whose arrival time is
/// `tat_us`: `(granted, arrival time after)`. Grants at most `want`, and at
/// most a [`LEASE_SHARE`]th (rounded up) of the calls that fit now (the
/// arrival time at most `tolerance_us` ahead of now for each); the arrival
/// time moves one interval per call granted. The Redis script computes
/// the same.
pub fn bucket_lease(
    now_us: u64,
    tat_us: u64,
    interval_us: u64,
    tolerance_us: u64,
    want: u64,
) -> (u64, u64) {
    let interval = interval_us.max(1);
    let from = tat_us.max(now_us);
    if from - now_us > tolerance_us {
        return (0, tat_us);
    }
    let fit = (now_us + tolerance_us - from) / interval + 1;
    let granted = want.min(fit.div_ceil(LEASE_SHARE));
    if granted == 0 {
        return (0, tat_us);
    }
    (
        granted,
        from.saturating_add(granted.saturating_mul(interval)),
    )
}

/// One key of a batch flush (bytes and the latch; calls are leased).
#[derive(Clone, Debug, Default)]
pub struct FlushItem {
    /// Counter key and local delta.
    pub bytes: Option<(String, u64)>,
    pub bytes_expiry_ms: u64,
    pub latch: String,
    /// Engage the latch first (same encoding as [`ExactCall::latch_ms`]).
    pub engage: Option<i64>,
}

/// What the store holds for one [`FlushItem`] after adding its deltas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlushReply {
    pub bytes: Option<u64>,
    pub latch: Latch,
}

/// What a [`Backend`] call returns: the value, or the error as text (logged once
/// per outage).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// The operations limits need from a shared store. Redis in production
/// (`gov-agent`); an in-memory fake in unit tests of the batching logic.
pub trait Backend: Send + Sync + std::fmt::Debug {
    fn exact(&self, call: ExactCall) -> StoreFuture<'_, ExactReply>;
    fn lease(&self, call: LeaseCall) -> StoreFuture<'_, LeaseReply>;
    fn flush(&self, items: Vec<FlushItem>) -> StoreFuture<'_, Vec<FlushReply>>;
    /// Deletes every latch and counter of `rule` (a release starts every
    /// key on a fresh count); returns how many latches there were.
    fn release(&self, rule: String) -> StoreFuture<'_, u64>;
    /// Deletes one key's latch (a [`latch_key`]) and its `counters` of the
    /// current windows (a release starts the key on a fresh count: the
    /// next call does not engage it again); returns 1 if the latch was
    /// there, else 0. All share one hash tag.
    fn release_key(&self, latch: String, counters: Vec<String>) -> StoreFuture<'_, u64>;
    fn ping(&self) -> StoreFuture<'_, ()>;
}

/// A handle on the shared counter store (cheap to clone). Give it to the
/// engine with [`Engine::with_cluster_store`](crate::Engine::with_cluster_store).
/// Make one with [`ClusterStore::from_backend`].
#[derive(Clone, Debug)]
pub struct ClusterStore {
    inner: Arc<Inner>,
}

/// Where the store is in an outage. Changed only under its lock, at a
/// transition; calls read [`Inner::up`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Up,
    /// Calls decided without the store; the probe runs.
    Down,
    /// The probe answered at `since`: calls go to the store again, and the
    /// outage ends at `since + SETTLE` unless a call fails before.
    Settling {
        since: Instant,
    },
}

#[derive(Debug)]
struct Inner {
    backend: Box<dyn Backend>,
    timeout: Duration,
    /// Calls go to the store (`Up` or `Settling`).
    up: AtomicBool,
    phase: std::sync::Mutex<Phase>,
    outages: AtomicU64,
    /// Calls each [`Fallback`] decided, indexed as [`Fallback::ALL`].
    fallbacks: [AtomicU64; 3],
    /// The longest deadline a call missed, in ms: the probe waits as long,
    /// so that a store that answers `sync exact` within its declared timeout
    /// is not kept down by the shorter default.
    probe_ms: AtomicU64,
    /// Unix time in ms when `started` was taken: the wall clock of windows is
    /// derived from `tokio::time` so paused-time tests can drive it.
    unix_ms_at_start: u64,
    started: Instant,
}

impl ClusterStore {
    /// A store over `backend`, each call bounded by `timeout` (then counted as an
    /// outage, and limits count locally).
    pub fn from_backend(backend: Box<dyn Backend>, timeout: Duration) -> Self {
        let unix_ms_at_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            inner: Arc::new(Inner {
                backend,
                timeout,
                up: AtomicBool::new(true),
                phase: std::sync::Mutex::new(Phase::Up),
                outages: AtomicU64::new(0),
                fallbacks: Default::default(),
                probe_ms: AtomicU64::new(0),
                unix_ms_at_start,
                started: Instant::now(),
            }),
        }
    }

    /// Whether the last call to the store succeeded (limits count locally
    /// while it is down).
    pub fn is_up(&self) -> bool {
        self.inner.up.load(Relaxed)
    }

    /// How many outages began since start.
    pub fn outages(&self) -> u64 {
        self.inner.outages.load(Relaxed)
    }

    /// How many `sync exact` calls each fallback decided since start (the
    /// store slow or down), in the order of [`Fallback::ALL`].
    pub fn fallbacks(&self) -> [(Fallback, u64); 3] {
        Fallback::ALL.map(|f| (f, self.inner.fallbacks[f as usize].load(Relaxed)))
    }

    pub(crate) fn count_fallback(&self, fallback: Fallback) {
        self.inner.fallbacks[fallback as usize].fetch_add(1, Relaxed);
    }

    /// Unix time in microseconds, the clock of cluster token buckets.
    pub(crate) fn unix_us(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.inner.started);
        self.inner
            .unix_ms_at_start
            .saturating_mul(1000)
            .saturating_add(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX))
    }

    /// Unix time in ms, the clock of cluster windows.
    pub(crate) fn unix_ms(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.inner.started);
        self.inner
            .unix_ms_at_start
            .saturating_add(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
    }

    async fn call<T>(&self, fut: StoreFuture<'_, T>) -> Option<T> {
        self.call_within(fut, self.inner.timeout).await
    }

    async fn call_within<T>(&self, fut: StoreFuture<'_, T>, deadline: Duration) -> Option<T> {
        match tokio::time::timeout(deadline, fut).await {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                self.mark_down(&e);
                None
            }
            Err(_) => {
                let ms = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX);
                self.inner.probe_ms.fetch_max(ms, Relaxed);
                self.mark_down(&format!("no answer within {deadline:?}"));
                None
            }
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        // A plain enum: a panic elsewhere cannot leave it half-written.
        self.inner.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call failed: calls stop going to the store. A new outage is logged
    /// and counted, and its probe started; a failure while the store settles
    /// continues the outage it was ending, silently.
    fn mark_down(&self, error: &str) {
        if !self.is_up() {
            return;
        }
        let mut phase = self.phase();
        if !self.inner.up.swap(false, Relaxed) {
            return;
        }
        let was = std::mem::replace(&mut *phase, Phase::Down);
        drop(phase);
        if was != Phase::Up {
            // The probe of this outage is still running.
            return;
        }
        self.inner.outages.fetch_add(1, Relaxed);
        tracing::warn!(
            %error,
            "cluster store (redis) unreachable: `scope cluster` limits decide calls without it until it is back"
        );
        let store = self.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { store.probe().await });
        }
    }

    /// Probes a down store until it answers, then ends the outage once the
    /// store has gone [`SETTLE`] without a failed call.
    async fn probe(&self) {
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            // Stop when the last engine holding the store is gone.
            if Arc::strong_count(&self.inner) <= 1 {
                return;
            }
            let now = Instant::now();
            {
                // INVARIANT: the phase is read and changed under one lock, so
                // a failure in between cannot be overwritten.
                let mut phase = self.phase();
                match *phase {
                    Phase::Up => return,
                    Phase::Settling { since } if now.saturating_duration_since(since) >= SETTLE => {
                        *phase = Phase::Up;
                        drop(phase);
                        tracing::info!(
                            "cluster store (redis) reachable again: limits are shared again"
                        );
                        return;
                    }
                    Phase::Settling { .. } => continue,
                    Phase::Down => {}
                }
            }
            let deadline = self
                .inner
                .timeout
                .max(Duration::from_millis(self.inner.probe_ms.load(Relaxed)));
            let ok = matches!(
                tokio::time::timeout(deadline, self.inner.backend.ping()).await,
                Ok(Ok(()))
            );
            let mut phase = self.phase();
            if ok && *phase == Phase::Down {
                *phase = Phase::Settling {
                    since: Instant::now(),
                };
                self.inner.up.store(true, Relaxed);
            }
        }
    }

    /// Runs a `sync exact` call, waiting at most `deadline`; `None` when the
    /// store is down or did not answer in time (the call may still have
    /// been counted there: the fallback's decision errs on the safe side for
    /// `reject`).
    pub(crate) async fn exact(&self, call: ExactCall, deadline: Duration) -> Option<ExactReply> {
        if !self.is_up() {
            return None;
        }
        self.call_within(self.inner.backend.exact(call), deadline)
            .await
    }

    pub(crate) async fn lease(&self, call: LeaseCall) -> Option<LeaseReply> {
        if !self.is_up() {
            return None;
        }
        self.call(self.inner.backend.lease(call)).await
    }

    pub(crate) async fn flush(&self, items: Vec<FlushItem>) -> Option<Vec<FlushReply>> {
        if !self.is_up() || items.is_empty() {
            return None;
        }
        self.call(self.inner.backend.flush(items)).await
    }

    /// Deletes the latches of `rule` in the store (in the background).
    pub(crate) fn release(&self, rule: &str) {
        let store = self.clone();
        let rule = rule.to_owned();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { store.release_now(&rule).await });
        }
    }

    /// Deletes the latch and `counters` of one key of `rule` in the store
    /// (in the background).
    pub(crate) fn release_key(&self, rule: &str, key: &str, counters: Vec<String>) {
        let store = self.clone();
        let (rule, key) = (rule.to_owned(), key.to_owned());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { store.release_key_now(&rule, &key, counters).await });
        }
    }

    /// Deletes the latch and `counters` of one key of `rule` in the store;
    /// `None` if it failed.
    pub(crate) async fn release_key_now(
        &self,
        rule: &str,
        key: &str,
        counters: Vec<String>,
    ) -> Option<u64> {
        match tokio::time::timeout(
            self.inner.timeout * 20,
            self.inner
                .backend
                .release_key(latch_key(rule, key), counters),
        )
        .await
        {
            Ok(Ok(n)) => Some(n),
            Ok(Err(error)) => {
                tracing::warn!(%error, rule, key, "cannot release the limit's key in the cluster store");
                None
            }
            Err(_) => {
                tracing::warn!(
                    rule,
                    key,
                    "releasing the limit's key in the cluster store timed out"
                );
                None
            }
        }
    }

    /// Deletes the latches of `rule` in the store; `None` if it failed.
    pub(crate) async fn release_now(&self, rule: &str) -> Option<u64> {
        // An operator command: worth a longer deadline than a request.
        match tokio::time::timeout(
            self.inner.timeout * 20,
            self.inner.backend.release(rule.to_owned()),
        )
        .await
        {
            Ok(Ok(n)) => Some(n),
            Ok(Err(error)) => {
                tracing::warn!(%error, rule, "cannot release the limit in the cluster store");
                None
            }
            Err(_) => {
                tracing::warn!(
                    rule,
                    "cannot release the limit in the cluster store: timeout"
                );
                None
            }
        }
    }
}

/// Counter key of calls.
pub fn calls_key(rule: &str, key: &str, window: u64) -> String {
    format!("gov:{{{rule}:{}}}:{window}", in_tag(key))
}

/// The one key of a token bucket (`algorithm token bucket`).
pub fn bucket_key(rule: &str, key: &str) -> String {
    format!("gov:{{{rule}:{}}}:bucket", in_tag(key))
}

/// Counter key of bytes.
pub fn bytes_key(rule: &str, key: &str, window: u64) -> String {
    format!("gov:{{{rule}:{}}}:bytes:{window}", in_tag(key))
}

/// Latch key of one key of a rule: `gov:{RULE:KEY}:latch`.
pub fn latch_key(rule: &str, key: &str) -> String {
    format!("gov:{{{rule}:{}{LATCH_SUFFIX}", in_tag(key))
}

/// A rule's key as it goes inside the hash tag `{RULE:KEY}`: `%` and `}`
/// percent-encoded (`%25`, `%7D`), so that the tag ends where the key does
/// (one slot per rule and key) and no name ends in `}}:latch`, the name
/// older releases gave latches (renamed when an agent starts). A key
/// without either character is written as it is.
fn in_tag(key: &str) -> std::borrow::Cow<'_, str> {
    if !key.contains(['%', '}']) {
        return key.into();
    }
    key.replace('%', "%25").replace('}', "%7D").into()
}

/// Every latch key of `rule` starts with this (the rule name has no `:`)...
pub fn latch_prefix(rule: &str) -> String {
    format!("gov:{{{rule}:")
}

/// ...and ends with this (the hash tag's `}`, then `:latch`); counter keys
/// end with a window number.
pub const LATCH_SUFFIX: &str = "}:latch";

/// Whether `redis_key` is a latch of `rule`.
pub fn is_latch_of(rule: &str, redis_key: &str) -> bool {
    redis_key.starts_with(&latch_prefix(rule)) && redis_key.ends_with(LATCH_SUFFIX)
}

#[cfg(test)]
mod keys {
    use super::*;

    /// The hash tag of a Redis Cluster key: between the first `{` and the
    /// first `}` after it, when not empty.
    fn tag(key: &str) -> &str {
        let Some(open) = key.find('{') else {
            return key;
        };
        match key[open + 1..].find('}') {
            Some(0) | None => key,
            Some(close) => &key[open + 1..open + 1 + close],
        }
    }

    #[test]
    fn the_keys_of_one_rule_and_key_share_a_hash_tag() {
        for key in ["", "crm", "a}b", "{x}", "a:b", "*"] {
            let latch = latch_key("order/shared", key);
            let t = tag(&latch);
            assert_eq!(t, tag(&calls_key("order/shared", key, 7)), "{key}");
            assert_eq!(t, tag(&bytes_key("order/shared", key, 7)), "{key}");
            assert!(is_latch_of("order/shared", &latch_key("order/shared", key)));
            assert!(!is_latch_of(
                "order/shared",
                &calls_key("order/shared", key, 7)
            ));
            assert!(!is_latch_of(
                "order/shared",
                &bytes_key("order/shared", key, 7)
            ));
            assert!(!is_latch_of("order/share", &latch_key("order/shared", key)));
        }
        let (crm, shop) = (latch_key("r", "crm"), latch_key("r", "shop"));
        assert_ne!(tag(&crm), tag(&shop));
        assert_eq!(calls_key("r", "crm", 9), "gov:{r:crm}:9");
        // As docs/operations.md names it (older releases wrote `}}:latch`).
        assert_eq!(crm, "gov:{r:crm}:latch");
        // A key with `}` cannot end its tag early or pass for an older
        // latch (which a start renames): `x}` is not `x`.
        assert_eq!(latch_key("r", "x}"), "gov:{r:x%7D}:latch");
        assert_eq!(tag(&latch_key("r", "a}b")), "r:a%7Db");
        assert_ne!(latch_key("r", "x%7D"), latch_key("r", "x}"));
        assert_eq!(latch_key("svc/l", ""), "gov:{svc/l:}:latch");
    }
}

#[cfg(test)]
mod transitions {
    use std::sync::Mutex;

    use super::fake::{Memory, Shared};
    use super::*;

    /// What a test subscriber wrote, line by line.
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Log {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
        type Writer = Log;

        fn make_writer(&'a self) -> Log {
            self.clone()
        }
    }

    impl Log {
        fn count(&self, text: &str) -> usize {
            let bytes = self.0.lock().unwrap();
            String::from_utf8_lossy(&bytes)
                .lines()
                .filter(|l| l.contains(text))
                .count()
        }
    }

    async fn call(store: &ClusterStore) -> bool {
        let call = ExactCall {
            counter: calls_key("svc/l", "", 1),
            latch: latch_key("svc/l", ""),
            expiry_ms: 1000,
            amount: 1_000_000,
            latch_ms: 0,
            algorithm: StoreAlgorithm::FixedWindow,
        };
        store.exact(call, DEFAULT_TIMEOUT).await.is_some()
    }

    /// A failover seen by the probe before the calls: the store answers
    /// `PING`, the next call fails, six times over. One outage, one line
    /// each way.
    #[tokio::test(start_paused = true)]
    async fn a_flapping_store_is_one_outage_logged_once_each_way() {
        let log = Log::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(log.clone())
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let memory = Arc::new(Memory::default());
        let store = ClusterStore::from_backend(Box::new(Shared(memory.clone())), DEFAULT_TIMEOUT);
        let (down, back) = ("unreachable", "reachable again");
        memory.down.store(true, Relaxed);
        assert!(!call(&store).await);
        for _ in 0..6 {
            memory.down.store(false, Relaxed);
            tokio::time::sleep(PROBE_EVERY + Duration::from_millis(10)).await;
            assert!(store.is_up(), "the probe answered");
            assert!(call(&store).await);
            memory.down.store(true, Relaxed);
            assert!(!call(&store).await);
        }
        assert_eq!((log.count(down), log.count(back)), (1, 0));
        memory.down.store(false, Relaxed);
        tokio::time::sleep(SETTLE + PROBE_EVERY * 3).await;
        assert!(store.is_up());
        assert_eq!(store.outages(), 1);
        assert_eq!((log.count(down), log.count(back)), (1, 1));
        // A later outage is another one.
        memory.down.store(true, Relaxed);
        assert!(!call(&store).await);
        memory.down.store(false, Relaxed);
        tokio::time::sleep(SETTLE + PROBE_EVERY * 3).await;
        assert_eq!(store.outages(), 2);
        assert_eq!((log.count(down), log.count(back)), (2, 2));
    }
}

// === an in-memory store for unit tests ===

#[cfg(test)]
pub(crate) mod fake {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// Counters and latches in memory (no expiry of counters: tests use
    /// fresh window keys). Latches expire on `tokio::time`.
    #[derive(Debug, Default)]
    pub(crate) struct Memory {
        pub counters: Mutex<HashMap<String, u64>>,
        pub latches: Mutex<HashMap<String, Option<Instant>>>,
        pub down: AtomicBool,
        /// How long `exact` and `ping` take to answer, in ms (a slow store).
        pub delay_ms: AtomicU64,
        pub flushes: AtomicU64,
        pub leases: AtomicU64,
    }

    impl Memory {
        async fn slow(&self) {
            let ms = self.delay_ms.load(Relaxed);
            if ms > 0 {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
        }

        fn check(&self) -> Result<(), String> {
            if self.down.load(Relaxed) {
                Err("connection refused".into())
            } else {
                Ok(())
            }
        }

        fn latch(&self, key: &str) -> Latch {
            let mut latches = self.latches.lock().ok()?;
            match latches.get(key).copied() {
                None => None,
                Some(None) => Some(None),
                Some(Some(until)) => {
                    let now = Instant::now();
                    if now >= until {
                        latches.remove(key);
                        None
                    } else {
                        Some(Some(until - now))
                    }
                }
            }
        }

        fn engage(&self, key: &str, ms: i64) {
            let until = (ms > 0)
                .then(|| Instant::now() + Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
            if let Ok(mut l) = self.latches.lock() {
                l.entry(key.to_owned()).or_insert(until);
            }
        }

        pub(crate) fn get(&self, key: &str) -> u64 {
            self.counters
                .lock()
                .ok()
                .and_then(|c| c.get(key).copied())
                .unwrap_or(0)
        }

        /// Adds `plus` and takes `minus` off in one step; the new value.
        fn add(&self, key: &str, plus: u64, minus: u64) -> u64 {
            let Ok(mut c) = self.counters.lock() else {
                return 0;
            };
            let v = c.entry(key.to_owned()).or_default();
            *v = v.saturating_sub(minus) + plus;
            *v
        }

        fn incr(&self, key: &str, by: u64) -> u64 {
            let Ok(mut c) = self.counters.lock() else {
                return 0;
            };
            let v = c.entry(key.to_owned()).or_default();
            *v += by;
            *v
        }
    }

    /// Lets a test keep a handle on the memory the store uses.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Shared(pub Arc<Memory>);

    impl Backend for Shared {
        fn exact(&self, call: ExactCall) -> StoreFuture<'_, ExactReply> {
            Box::pin(async move {
                let m = &self.0;
                m.slow().await;
                m.check()?;
                if let Some(l) = m.latch(&call.latch) {
                    return Ok(ExactReply::Engaged(l));
                }
                let (c, refused) = match &call.algorithm {
                    StoreAlgorithm::FixedWindow => {
                        let c = m.incr(&call.counter, 1);
                        (c, (c > call.amount).then_some(Duration::ZERO))
                    }
                    StoreAlgorithm::SlidingWindow {
                        previous,
                        window_ms,
                        elapsed_ms,
                    } => {
                        let (p, c) = (m.get(previous), m.get(&call.counter));
                        let w = u128::from(*window_ms);
                        let weighted =
                            u128::from(p) * (w - u128::from(*elapsed_ms)) + u128::from(c) * w;
                        if weighted < u128::from(call.amount) * w {
                            (m.incr(&call.counter, 1), None)
                        } else {
                            let wait = sliding_wait_ms(call.amount, *window_ms, *elapsed_ms, p, c);
                            (c, Some(Duration::from_millis(wait)))
                        }
                    }
                    StoreAlgorithm::TokenBucket {
                        now_us,
                        interval_us,
                        tolerance_us,
                    } => {
                        let tat = m.get(&call.counter).max(*now_us);
                        if tat - now_us > *tolerance_us {
                            let wait = (tat - now_us - tolerance_us).min(*interval_us);
                            (0, Some(Duration::from_micros(wait)))
                        } else {
                            m.add(&call.counter, tat + interval_us, m.get(&call.counter));
                            (1, None)
                        }
                    }
                };
                match refused {
                    Some(_) if call.latch_ms != 0 => {
                        m.engage(&call.latch, call.latch_ms);
                        Ok(ExactReply::Engaged(m.latch(&call.latch).flatten()))
                    }
                    Some(wait) if wait > Duration::ZERO => Ok(ExactReply::Refused(wait)),
                    _ => Ok(ExactReply::Counted(c)),
                }
            })
        }

        fn lease(&self, call: LeaseCall) -> StoreFuture<'_, LeaseReply> {
            Box::pin(async move {
                let m = &self.0;
                m.check()?;
                m.leases.fetch_add(1, Relaxed);
                let latch = m.latch(&call.latch);
                let count = m.get(&call.counter);
                let want = if latch.is_some() { 0 } else { call.want };
                let (granted, total, previous) = match &call.algorithm {
                    LeaseAlgorithm::FixedWindow => {
                        let granted =
                            lease_grant(call.amount, count, call.unleased, call.give_back, want);
                        let total = m.add(&call.counter, granted + call.unleased, call.give_back);
                        (granted, total, 0)
                    }
                    LeaseAlgorithm::SlidingWindow {
                        previous,
                        window_ms,
                        elapsed_ms,
                    } => {
                        let p = m.get(previous);
                        let counted = count.saturating_sub(call.give_back) + call.unleased;
                        let left = sliding_left(call.amount, *window_ms, *elapsed_ms, p, counted);
                        let granted = want.min(left.div_ceil(LEASE_SHARE));
                        let total = m.add(&call.counter, granted + call.unleased, call.give_back);
                        (granted, total, p)
                    }
                    LeaseAlgorithm::TokenBucket {
                        now_us,
                        interval_us,
                        tolerance_us,
                        end_us,
                    } => {
                        let mut tat = count;
                        if call.give_back > 0 && tat == *end_us {
                            tat = tat.saturating_sub(call.give_back * interval_us);
                        }
                        let (granted, after) =
                            bucket_lease(*now_us, tat, *interval_us, *tolerance_us, want);
                        m.add(&call.counter, after, count);
                        (granted, after, 0)
                    }
                };
                Ok(match latch {
                    Some(l) => LeaseReply::Engaged(l),
                    None => LeaseReply::Granted {
                        granted,
                        total,
                        previous,
                    },
                })
            })
        }

        fn flush(&self, items: Vec<FlushItem>) -> StoreFuture<'_, Vec<FlushReply>> {
            Box::pin(async move {
                let m = &self.0;
                m.check()?;
                m.flushes.fetch_add(1, Relaxed);
                Ok(items
                    .iter()
                    .map(|item| {
                        if let Some(ms) = item.engage {
                            m.engage(&item.latch, ms);
                        }
                        FlushReply {
                            bytes: item.bytes.as_ref().map(|(k, d)| m.incr(k, *d)),
                            latch: m.latch(&item.latch),
                        }
                    })
                    .collect())
            })
        }

        fn release(&self, rule: String) -> StoreFuture<'_, u64> {
            Box::pin(async move {
                self.0.check()?;
                let prefix = latch_prefix(&rule);
                self.0
                    .counters
                    .lock()
                    .map_err(|e| e.to_string())?
                    .retain(|k, _| !k.starts_with(&prefix));
                let mut l = self.0.latches.lock().map_err(|e| e.to_string())?;
                let before = l.len();
                l.retain(|k, _| !is_latch_of(&rule, k));
                Ok((before - l.len()) as u64)
            })
        }

        fn release_key(&self, latch: String, counters: Vec<String>) -> StoreFuture<'_, u64> {
            Box::pin(async move {
                self.0.check()?;
                let mut c = self.0.counters.lock().map_err(|e| e.to_string())?;
                for counter in &counters {
                    c.remove(counter);
                }
                let mut l = self.0.latches.lock().map_err(|e| e.to_string())?;
                Ok(u64::from(l.remove(&latch).is_some()))
            })
        }

        fn ping(&self) -> StoreFuture<'_, ()> {
            Box::pin(async move {
                self.0.slow().await;
                self.0.check()
            })
        }
    }
}
