//! The Redis backend of the engine's cluster counter store (`scope cluster`
//! limits): `gov_agent::cluster::redis(url)` makes a [`ClusterStore`] for
//! [`Engine::with_cluster_store`](gov_engine::Engine::with_cluster_store).
//!
//! Keys and the failure behaviour are the engine's (`gov_engine::cluster`).
//! `sync exact` runs one small Lua script per call (`EVALSHA`: latch check,
//! `INCRBY`, `PEXPIRE` on the first hit, engage when over): one round trip.
//! `sync batch D` sends every key's delta every D in one pipeline (`INCRBY` +
//! `PEXPIRE` + `PTTL` of the latch), reading back the cluster totals.

use std::time::Duration;

use gov_engine::cluster::{
    Backend, ExactCall, ExactReply, FlushItem, FlushReply, Latch, StoreFuture, latch_key,
};
pub use gov_engine::cluster::{ClusterStore, DEFAULT_TIMEOUT};

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

/// A store on the Redis server at `url` (`redis://HOST:PORT[/DB]`), with
/// [`DEFAULT_TIMEOUT`] per call. Connects lazily (a Redis that is down at
/// start is an outage like any other); must be called inside a Tokio runtime.
pub fn redis(url: &str) -> Result<ClusterStore, ClusterError> {
    redis_with_timeout(url, DEFAULT_TIMEOUT)
}

/// Like [`redis`] with another per-call deadline.
pub fn redis_with_timeout(url: &str, timeout: Duration) -> Result<ClusterStore, ClusterError> {
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
    Ok(ClusterStore::from_backend(
        Box::new(Redis {
            conn,
            script: redis::Script::new(EXACT_SCRIPT),
        }),
        timeout,
    ))
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
