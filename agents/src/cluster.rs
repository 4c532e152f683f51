//! The shared counter store of `scope cluster` limits: Redis.
//!
//! Keys (one Redis database; the rule name never contains `:`):
//! - `gov:{rule}:{key}:{window}`: calls of one key in one fixed window
//!   (`window` = Unix time in ms / window length), expiring after two windows;
//! - `gov:bytes:{rule}:{key}:{window}`: request + response bytes, likewise;
//! - `gov:latch:{rule}:{key}`: present while the limit is engaged for that key,
//!   with `PX` = `release after` (no expiry for `release manual`).
//!
//! `sync exact` runs one small Lua script per call (`EVALSHA`: latch check,
//! `INCRBY`, `PEXPIRE` on the first hit, engage when over): one round trip.
//! `sync batch D` counts locally and sends every key's delta every D in one
//! pipeline (`INCRBY` + `PEXPIRE` + `PTTL` of the latch), reading back the
//! cluster totals. Every call has a deadline ([`DEFAULT_TIMEOUT`]); on an
//! error or a timeout the store is marked down (logged once per outage), limits
//! count locally with their full amount, and a background probe marks it up
//! again when Redis answers `PING`. Requests never fail because Redis is down.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// The longest a request waits for Redis before it is decided locally.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// How often a down store is probed with `PING`.
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// The `sync exact` script. KEYS: counter, latch. ARGV: increment, counter
/// expiry (ms), amount, latch (0: none, -1: manual, else ms).
/// Returns `{count, 0}`, `{-1, latch pttl}` when already engaged (pttl -1:
/// manual), or `{-2, latch ms}` when this call engaged it.
const EXACT_SCRIPT: &str = r"
local latch = redis.call('PTTL', KEYS[2])
if latch ~= -2 then return {-1, latch} end
local inc = tonumber(ARGV[1])
local c = redis.call('INCRBY', KEYS[1], inc)
if c == inc then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
local l = tonumber(ARGV[4])
if c > tonumber(ARGV[3]) and l ~= 0 then
  if l > 0 then redis.call('SET', KEYS[2], '1', 'PX', l) else redis.call('SET', KEYS[2], '1') end
  return {-2, l}
end
return {c, 0}
";

/// The latch state read from the store: `None` not engaged, `Some(None)`
/// engaged until released by hand, `Some(Some(d))` engaged for `d` more.
pub(crate) type Latch = Option<Option<Duration>>;

/// One `sync exact` call.
#[derive(Clone, Debug)]
pub(crate) struct ExactCall {
    pub counter: String,
    pub latch: String,
    pub expiry_ms: u64,
    pub amount: u64,
    /// 0: no latch, -1: manual, else `release after` in ms.
    pub latch_ms: i64,
}

/// The answer to an [`ExactCall`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExactReply {
    /// The key's count in this window, this call included.
    Counted(u64),
    /// The limit is engaged (by this call or before).
    Engaged(Option<Duration>),
}

/// One key of a batch flush.
#[derive(Clone, Debug, Default)]
pub(crate) struct FlushItem {
    /// Counter key and local delta.
    pub calls: Option<(String, u64)>,
    pub bytes: Option<(String, u64)>,
    pub calls_expiry_ms: u64,
    pub bytes_expiry_ms: u64,
    pub latch: String,
    /// Engage the latch first (same encoding as [`ExactCall::latch_ms`]).
    pub engage: Option<i64>,
}

/// What the store holds for one [`FlushItem`] after adding its deltas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct FlushReply {
    pub calls: Option<u64>,
    pub bytes: Option<u64>,
    pub latch: Latch,
}

type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// The operations limits need from a shared store. Redis in production; an
/// in-memory fake in unit tests of the batching logic.
pub(crate) trait Backend: Send + Sync + std::fmt::Debug {
    fn exact(&self, call: ExactCall) -> StoreFuture<'_, ExactReply>;
    fn flush(&self, items: Vec<FlushItem>) -> StoreFuture<'_, Vec<FlushReply>>;
    /// Deletes every latch of `rule`; returns how many there were.
    fn release(&self, rule: String) -> StoreFuture<'_, u64>;
    fn ping(&self) -> StoreFuture<'_, ()>;
}

/// A handle on the shared counter store (cheap to clone). Give it to the
/// engine with [`Engine::with_cluster_store`](crate::Engine::with_cluster_store).
#[derive(Clone, Debug)]
pub struct ClusterStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: Box<dyn Backend>,
    timeout: Duration,
    up: AtomicBool,
    outages: AtomicU64,
    /// Unix time in ms when `started` was taken: the wall clock of windows is
    /// derived from `tokio::time` so paused-time tests can drive it.
    unix_ms_at_start: u64,
    started: Instant,
}

/// The Redis URL cannot be used.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("cannot use redis url `{url}`: {message}")]
#[diagnostic(
    code(gov::agent::redis_url),
    help("give `--redis redis://HOST:PORT` (or `GOV_REDIS`), e.g. `redis://127.0.0.1:6379`")
)]
pub struct ClusterError {
    pub url: String,
    pub message: String,
}

impl ClusterStore {
    /// A store on the Redis server at `url` (`redis://HOST:PORT[/DB]`), with
    /// [`DEFAULT_TIMEOUT`] per call. Connects lazily (a Redis that is down at
    /// start is an outage like any other); must be called inside a Tokio runtime.
    pub fn redis(url: &str) -> Result<Self, ClusterError> {
        Self::redis_with_timeout(url, DEFAULT_TIMEOUT)
    }

    /// Like [`ClusterStore::redis`] with another per-call deadline.
    pub fn redis_with_timeout(url: &str, timeout: Duration) -> Result<Self, ClusterError> {
        let error = |e: redis::RedisError| ClusterError {
            url: url.to_owned(),
            message: e.to_string(),
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ClusterError {
                url: url.to_owned(),
                message: "no tokio runtime: create the store inside one".into(),
            });
        }
        let client = redis::Client::open(url).map_err(error)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(100))))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1));
        let conn =
            redis::aio::ConnectionManager::new_lazy_with_config(client, config).map_err(error)?;
        Ok(Self::from_backend(
            Box::new(Redis {
                conn,
                script: redis::Script::new(EXACT_SCRIPT),
            }),
            timeout,
        ))
    }

    pub(crate) fn from_backend(backend: Box<dyn Backend>, timeout: Duration) -> Self {
        let unix_ms_at_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            inner: Arc::new(Inner {
                backend,
                timeout,
                up: AtomicBool::new(true),
                outages: AtomicU64::new(0),
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

    /// Unix time in ms, the clock of cluster windows.
    pub(crate) fn unix_ms(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.inner.started);
        self.inner
            .unix_ms_at_start
            .saturating_add(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
    }

    async fn call<T>(&self, fut: StoreFuture<'_, T>) -> Option<T> {
        match tokio::time::timeout(self.inner.timeout, fut).await {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                self.mark_down(&e);
                None
            }
            Err(_) => {
                self.mark_down(&format!("no answer within {:?}", self.inner.timeout));
                None
            }
        }
    }

    fn mark_down(&self, error: &str) {
        if !self.inner.up.swap(false, Relaxed) {
            return;
        }
        self.inner.outages.fetch_add(1, Relaxed);
        tracing::warn!(
            %error,
            "cluster store (redis) unreachable: `scope cluster` limits count locally until it is back"
        );
        let store = self.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { store.probe().await });
        }
    }

    async fn probe(&self) {
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            // Stop when the last engine holding the store is gone.
            if Arc::strong_count(&self.inner) <= 1 {
                return;
            }
            let ok = matches!(
                tokio::time::timeout(self.inner.timeout, self.inner.backend.ping()).await,
                Ok(Ok(()))
            );
            if ok {
                self.inner.up.store(true, Relaxed);
                tracing::info!("cluster store (redis) reachable again: limits are shared again");
                return;
            }
        }
    }

    pub(crate) async fn exact(&self, call: ExactCall) -> Option<ExactReply> {
        if !self.is_up() {
            return None;
        }
        self.call(self.inner.backend.exact(call)).await
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
pub(crate) fn calls_key(rule: &str, key: &str, window: u64) -> String {
    format!("gov:{rule}:{key}:{window}")
}

pub(crate) fn bytes_key(rule: &str, key: &str, window: u64) -> String {
    format!("gov:bytes:{rule}:{key}:{window}")
}

pub(crate) fn latch_key(rule: &str, key: &str) -> String {
    format!("gov:latch:{rule}:{key}")
}

/// `PTTL` to a latch: -2 absent, -1 no expiry.
fn latch_from_pttl(pttl: i64) -> Latch {
    match pttl {
        -2 => None,
        -1 => Some(None),
        ms => Some(Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))),
    }
}

fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

// === Redis ===

struct Redis {
    conn: redis::aio::ConnectionManager,
    script: redis::Script,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis").finish_non_exhaustive()
    }
}

fn text(e: redis::RedisError) -> String {
    e.to_string()
}

impl Backend for Redis {
    fn exact(&self, call: ExactCall) -> StoreFuture<'_, ExactReply> {
        let mut conn = self.conn.clone();
        Box::pin(async move {
            let reply: (i64, i64) = self
                .script
                .key(&call.counter)
                .key(&call.latch)
                .arg(1)
                .arg(call.expiry_ms)
                .arg(call.amount)
                .arg(call.latch_ms)
                .invoke_async(&mut conn)
                .await
                .map_err(text)?;
            Ok(match reply {
                (-1, pttl) => ExactReply::Engaged(latch_from_pttl(pttl).flatten()),
                (-2, ms) => ExactReply::Engaged(
                    (ms > 0).then(|| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
                ),
                (count, _) => ExactReply::Counted(u64::try_from(count).unwrap_or(0)),
            })
        })
    }

    fn flush(&self, items: Vec<FlushItem>) -> StoreFuture<'_, Vec<FlushReply>> {
        let mut conn = self.conn.clone();
        Box::pin(async move {
            let mut pipe = redis::pipe();
            for item in &items {
                match item.engage {
                    Some(ms) if ms > 0 => {
                        pipe.cmd("SET")
                            .arg(&item.latch)
                            .arg(1)
                            .arg("NX")
                            .arg("PX")
                            .arg(ms)
                            .ignore();
                    }
                    Some(_) => {
                        pipe.cmd("SET").arg(&item.latch).arg(1).arg("NX").ignore();
                    }
                    None => {}
                }
                for (part, expiry) in [
                    (&item.calls, item.calls_expiry_ms),
                    (&item.bytes, item.bytes_expiry_ms),
                ] {
                    if let Some((key, delta)) = part {
                        pipe.cmd("INCRBY").arg(key).arg(*delta);
                        pipe.cmd("PEXPIRE").arg(key).arg(expiry).ignore();
                    }
                }
                pipe.cmd("PTTL").arg(&item.latch);
            }
            let values: Vec<i64> = pipe.query_async(&mut conn).await.map_err(text)?;
            let mut values = values.into_iter();
            let mut next = || {
                values
                    .next()
                    .ok_or_else(|| "short pipeline reply".to_owned())
            };
            let mut replies = Vec::with_capacity(items.len());
            for item in &items {
                let calls = match item.calls {
                    Some(_) => Some(u64::try_from(next()?).unwrap_or(0)),
                    None => None,
                };
                let bytes = match item.bytes {
                    Some(_) => Some(u64::try_from(next()?).unwrap_or(0)),
                    None => None,
                };
                let latch = latch_from_pttl(next()?);
                replies.push(FlushReply {
                    calls,
                    bytes,
                    latch,
                });
            }
            Ok(replies)
        })
    }

    fn release(&self, rule: String) -> StoreFuture<'_, u64> {
        let mut conn = self.conn.clone();
        Box::pin(async move {
            let pattern = format!("{}*", glob_escape(&latch_key(&rule, "")));
            let mut cursor = 0u64;
            let mut deleted = 0;
            // Bounded: SCAN visits each key at most a few times.
            for _ in 0..100_000 {
                let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await
                    .map_err(text)?;
                if !keys.is_empty() {
                    let n: u64 = redis::cmd("DEL")
                        .arg(&keys)
                        .query_async(&mut conn)
                        .await
                        .map_err(text)?;
                    deleted += n;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            Ok(deleted)
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        let mut conn = self.conn.clone();
        Box::pin(async move {
            let _: String = redis::cmd("PING")
                .query_async(&mut conn)
                .await
                .map_err(text)?;
            Ok(())
        })
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
        pub flushes: AtomicU64,
    }

    impl Memory {
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
                m.check()?;
                if let Some(l) = m.latch(&call.latch) {
                    return Ok(ExactReply::Engaged(l));
                }
                let c = m.incr(&call.counter, 1);
                if c > call.amount && call.latch_ms != 0 {
                    m.engage(&call.latch, call.latch_ms);
                    return Ok(ExactReply::Engaged(m.latch(&call.latch).flatten()));
                }
                Ok(ExactReply::Counted(c))
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
                            calls: item.calls.as_ref().map(|(k, d)| m.incr(k, *d)),
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
                let prefix = latch_key(&rule, "");
                let mut l = self.0.latches.lock().map_err(|e| e.to_string())?;
                let before = l.len();
                l.retain(|k, _| !k.starts_with(&prefix));
                Ok((before - l.len()) as u64)
            })
        }

        fn ping(&self) -> StoreFuture<'_, ()> {
            Box::pin(async move { self.0.check() })
        }
    }
}
