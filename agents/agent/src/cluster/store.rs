//! The Redis [`Backend`] of the engine's cluster store: what each of its
//! calls sends (a script, a pipeline, a scan) on any of the three
//! connections of [`Conn`].

use std::time::Duration;

use gov_engine::cluster::{
    Backend, ExactCall, ExactReply, FlushItem, FlushReply, LATCH_SUFFIX, LEASE_SHARE, Latch,
    LeaseAlgorithm, LeaseCall, LeaseReply, StoreAlgorithm, StoreFuture, latch_prefix,
    sliding_wait_ms,
};
use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::scripts;
use super::topology::{Conn, cluster_masters};

pub(super) struct Redis {
    conn: Conn,
    exact: redis::Script,
    sliding: redis::Script,
    bucket: redis::Script,
    lease: redis::Script,
    sliding_lease: redis::Script,
    bucket_lease: redis::Script,
}

impl Redis {
    pub(super) fn new(conn: Conn) -> Self {
        Self {
            conn,
            exact: redis::Script::new(scripts::EXACT_SCRIPT),
            sliding: redis::Script::new(scripts::SLIDING_SCRIPT),
            bucket: redis::Script::new(scripts::BUCKET_SCRIPT),
            lease: redis::Script::new(scripts::LEASE_SCRIPT),
            sliding_lease: redis::Script::new(scripts::SLIDING_LEASE_SCRIPT),
            bucket_lease: redis::Script::new(scripts::BUCKET_LEASE_SCRIPT),
        }
    }
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.conn {
            Conn::Single(_) => "single",
            Conn::Cluster(_) => "cluster",
            Conn::Sentinel(_) => "sentinel",
        };
        f.debug_struct("Redis")
            .field("mode", &mode)
            .finish_non_exhaustive()
    }
}

fn text(e: redis::RedisError) -> String {
    e.to_string()
}

/// Runs `$body` with `$c` bound to a connection of any mode; a sentinel
/// connection that failed is dropped so the next call looks the master up.
macro_rules! with_conn {
    ($self:expr, $c:ident => $body:expr) => {
        match &$self.conn {
            Conn::Single(conn) => {
                let mut $c = conn.clone();
                $body.await
            }
            Conn::Cluster(cluster) => {
                let mut $c = cluster.conn();
                $body.await
            }
            Conn::Sentinel(sentinel) => {
                let mut $c = sentinel.get().await.map_err(text)?;
                let result = $body.await;
                if result.is_err() {
                    sentinel.forget();
                }
                result
            }
        }
    };
}

impl Redis {
    /// Applies `op` to every key matching `pattern`: SCAN walks one node,
    /// so on a cluster every master is walked (each command is routed to
    /// its key's slot).
    async fn scan_all(&self, pattern: &str, op: KeyOp) -> Result<u64, String> {
        match &self.conn {
            Conn::Cluster(cluster) => {
                let mut conn = cluster.conn();
                let mut done = 0;
                for (host, port) in cluster_masters(&mut conn).await? {
                    done += cluster_scan(&mut conn, pattern, &host, port, op)
                        .await
                        .map_err(text)?;
                }
                Ok(done)
            }
            _ => with_conn!(self, conn => scan(&mut conn, pattern, op)).map_err(text),
        }
    }

    /// Gives every latch an older gov wrote as `gov:{RULE:KEY}}:latch` its
    /// documented name, `gov:{RULE:KEY}:latch`, with its expiry, so that an
    /// upgrade forgets no engaged limit. Tried until it succeeds once (at
    /// most [`MIGRATION_TRIES`] times, backing off): Redis may be down at
    /// start.
    pub(super) async fn migrate_legacy_latches(self) {
        let mut delay = Duration::from_millis(500);
        for _ in 0..MIGRATION_TRIES {
            match self
                .scan_all(
                    &format!("gov:{{*{LEGACY_LATCH_SUFFIX}"),
                    KeyOp::RenameLegacyLatch,
                )
                .await
            {
                Ok(0) => return,
                Ok(renamed) => {
                    tracing::info!(
                        renamed,
                        "latches of an older release renamed to gov:{{RULE:KEY}}:latch"
                    );
                    return;
                }
                Err(error) => {
                    tracing::debug!(%error, "cannot look for latches of an older release yet")
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(30));
        }
        tracing::warn!(
            "latches of an older release (gov:{{RULE:KEY}}}}:latch) were not renamed: Redis did not answer; they are still released by `govc release`, and expire as set"
        );
    }
}

/// How often [`Redis::migrate_legacy_latches`] tries (about 10 minutes).
const MIGRATION_TRIES: u32 = 25;

impl Backend for Redis {
    fn exact(&self, call: ExactCall) -> StoreFuture<'_, ExactReply> {
        Box::pin(async move {
            let invocation = match &call.algorithm {
                StoreAlgorithm::FixedWindow => {
                    let mut i = self.exact.key(&call.counter);
                    i.key(&call.latch)
                        .arg(1)
                        .arg(call.expiry_ms)
                        .arg(call.amount)
                        .arg(call.latch_ms);
                    i
                }
                StoreAlgorithm::SlidingWindow {
                    previous,
                    window_ms,
                    elapsed_ms,
                } => {
                    let mut i = self.sliding.key(&call.counter);
                    i.key(previous)
                        .key(&call.latch)
                        .arg(call.amount)
                        .arg(call.expiry_ms)
                        .arg(call.latch_ms)
                        .arg(*window_ms)
                        .arg(*elapsed_ms);
                    i
                }
                StoreAlgorithm::TokenBucket {
                    now_us,
                    interval_us,
                    tolerance_us,
                } => {
                    let mut i = self.bucket.key(&call.counter);
                    i.key(&call.latch)
                        .arg(*now_us)
                        .arg(*interval_us)
                        .arg(*tolerance_us)
                        .arg(call.latch_ms);
                    i
                }
            };
            let reply: Vec<i64> =
                with_conn!(self, conn => invocation.invoke_async(&mut conn)).map_err(text)?;
            let at = |i: usize| reply.get(i).copied().unwrap_or(0);
            let unsigned = |v: i64| u64::try_from(v).unwrap_or(0);
            Ok(match (at(0), &call.algorithm) {
                (-1, _) => ExactReply::Engaged(latch_from_pttl(at(1)).flatten()),
                (-2, _) => {
                    ExactReply::Engaged((at(1) > 0).then(|| Duration::from_millis(unsigned(at(1)))))
                }
                (
                    -3,
                    StoreAlgorithm::SlidingWindow {
                        window_ms,
                        elapsed_ms,
                        ..
                    },
                ) => ExactReply::Refused(Duration::from_millis(sliding_wait_ms(
                    call.amount,
                    *window_ms,
                    *elapsed_ms,
                    unsigned(at(1)),
                    unsigned(at(2)),
                ))),
                (-3, _) => ExactReply::Refused(Duration::from_micros(unsigned(at(1)))),
                (count, _) => ExactReply::Counted(unsigned(count)),
            })
        })
    }

    fn lease(&self, call: LeaseCall) -> StoreFuture<'_, LeaseReply> {
        Box::pin(async move {
            let invocation = match &call.algorithm {
                LeaseAlgorithm::FixedWindow => {
                    let mut i = self.lease.key(&call.counter);
                    i.key(&call.latch)
                        .arg(call.want)
                        .arg(call.amount)
                        .arg(call.expiry_ms)
                        .arg(call.unleased)
                        .arg(call.give_back)
                        .arg(LEASE_SHARE);
                    i
                }
                LeaseAlgorithm::SlidingWindow {
                    previous,
                    window_ms,
                    elapsed_ms,
                } => {
                    let mut i = self.sliding_lease.key(&call.counter);
                    i.key(previous)
                        .key(&call.latch)
                        .arg(call.want)
                        .arg(call.amount)
                        .arg(call.expiry_ms)
                        .arg(call.unleased)
                        .arg(call.give_back)
                        .arg(LEASE_SHARE)
                        .arg(*window_ms)
                        .arg(*elapsed_ms);
                    i
                }
                LeaseAlgorithm::TokenBucket {
                    now_us,
                    interval_us,
                    tolerance_us,
                    end_us,
                } => {
                    let mut i = self.bucket_lease.key(&call.counter);
                    i.key(&call.latch)
                        .arg(call.want)
                        .arg(*now_us)
                        .arg(*interval_us)
                        .arg(*tolerance_us)
                        .arg(call.give_back)
                        .arg(*end_us)
                        .arg(LEASE_SHARE);
                    i
                }
            };
            let reply: Vec<i64> =
                with_conn!(self, conn => invocation.invoke_async(&mut conn)).map_err(text)?;
            let at = |i: usize| reply.get(i).copied().unwrap_or(0);
            let unsigned = |v: i64| u64::try_from(v).unwrap_or(0);
            Ok(match at(0) {
                -1 => LeaseReply::Engaged(latch_from_pttl(at(1)).flatten()),
                granted => LeaseReply::Granted {
                    granted: unsigned(granted),
                    total: unsigned(at(1)),
                    previous: unsigned(at(2)),
                },
            })
        })
    }

    fn flush(&self, items: Vec<FlushItem>) -> StoreFuture<'_, Vec<FlushReply>> {
        Box::pin(async move {
            let values: Vec<i64> = match &self.conn {
                // A cluster pipeline must stay in one slot: one per key (its
                // bytes and latch share a hash tag), sent together.
                Conn::Cluster(cluster) => {
                    let conn = cluster.conn();
                    let mut sends = tokio::task::JoinSet::new();
                    for (i, item) in items.iter().enumerate() {
                        let mut pipe = redis::pipe();
                        flush_commands(&mut pipe, item);
                        let mut conn = conn.clone();
                        sends.spawn(
                            async move { (i, pipe.query_async::<Vec<i64>>(&mut conn).await) },
                        );
                    }
                    let mut parts = vec![Vec::new(); items.len()];
                    while let Some(done) = sends.join_next().await {
                        let (i, part) = done.map_err(|e| e.to_string())?;
                        parts[i] = part.map_err(text)?;
                    }
                    parts.concat()
                }
                _ => {
                    let mut pipe = redis::pipe();
                    for item in &items {
                        flush_commands(&mut pipe, item);
                    }
                    with_conn!(self, conn => pipe.query_async::<Vec<i64>>(&mut conn))
                        .map_err(text)?
                }
            };
            let mut values = values.into_iter();
            let mut next = || {
                values
                    .next()
                    .ok_or_else(|| "short pipeline reply".to_owned())
            };
            let mut replies = Vec::with_capacity(items.len());
            for item in &items {
                let bytes = match item.bytes {
                    Some(_) => Some(u64::try_from(next()?).unwrap_or(0)),
                    None => None,
                };
                let latch = latch_from_pttl(next()?);
                replies.push(FlushReply { bytes, latch });
            }
            Ok(replies)
        })
    }

    fn release(&self, rule: String) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            // Every key of the rule, latches (older spellings too) and
            // counters: the rule starts on a fresh count.
            let prefix = glob_escape(&latch_prefix(&rule));
            self.scan_all(&format!("{prefix}*"), KeyOp::Delete).await
        })
    }

    fn release_key(&self, latch: String, counters: Vec<String>) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            // DEL is routed to the keys' slot on a cluster (one hash tag).
            let mut pipe = redis::pipe();
            pipe.cmd("DEL").arg(&latch);
            if !counters.is_empty() {
                pipe.cmd("DEL").arg(&counters).ignore();
            }
            let (latches,): (u64,) =
                with_conn!(self, conn => pipe.query_async(&mut conn)).map_err(text)?;
            Ok(latches)
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            // Called while the store is down: look the master up again.
            if let Conn::Sentinel(sentinel) = &self.conn {
                sentinel.forget();
            }
            if let Conn::Cluster(cluster) = &self.conn {
                return cluster.probe().await.map_err(text);
            }
            // On a cluster, PING goes to every master of the slot map: up again
            // when each slot has a master that answers.
            let _: String = with_conn!(self, conn => redis::cmd("PING").query_async(&mut conn))
                .map_err(text)?;
            Ok(())
        })
    }
}

/// Appends one flush item's commands: its replies are the bytes count (if
/// present), then the latch's `PTTL`.
fn flush_commands(pipe: &mut redis::Pipeline, item: &FlushItem) {
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
    if let Some((key, delta)) = &item.bytes {
        pipe.cmd("INCRBY").arg(key).arg(*delta);
        pipe.cmd("PEXPIRE")
            .arg(key)
            .arg(item.bytes_expiry_ms)
            .ignore();
    }
    pipe.cmd("PTTL").arg(&item.latch);
}

/// What to do with the keys a SCAN finds.
#[derive(Clone, Copy, Debug)]
enum KeyOp {
    /// Delete the keys; counts the latches among them (older spellings too).
    Delete,
    /// Give a latch an older gov named `gov:{RULE:KEY}}:latch` (one `}` too
    /// many) its documented name, `gov:{RULE:KEY}:latch`, keeping its expiry.
    /// RENAMENX: a latch written under the new name meanwhile stays.
    RenameLegacyLatch,
}

/// The documented name of a latch an older gov wrote as `legacy`.
fn documented_latch(legacy: &[u8]) -> Option<Vec<u8>> {
    legacy
        .strip_suffix(LEGACY_LATCH_SUFFIX.as_bytes())
        .map(|head| [head, LATCH_SUFFIX.as_bytes()].concat())
}

/// What older releases ended a latch key with.
const LEGACY_LATCH_SUFFIX: &str = "}}:latch";

/// Applies `op` to `keys`; returns how many it deleted or renamed.
async fn apply<C: ConnectionLike + Send>(
    conn: &mut C,
    op: KeyOp,
    keys: &[Vec<u8>],
) -> Result<u64, redis::RedisError> {
    if keys.is_empty() {
        return Ok(0);
    }
    match op {
        KeyOp::Delete => {
            // On a cluster, DEL is split by slot by the client.
            let () = redis::cmd("DEL").arg(keys).query_async(conn).await?;
            Ok(keys
                .iter()
                .filter(|k| k.ends_with(LATCH_SUFFIX.as_bytes()))
                .count() as u64)
        }
        KeyOp::RenameLegacyLatch => {
            let mut renamed = 0;
            for key in keys {
                let Some(new) = documented_latch(key) else {
                    continue;
                };
                // Both names share the hash tag `{RULE:KEY}`: one slot.
                match redis::cmd("RENAMENX")
                    .arg(key)
                    .arg(&new)
                    .query_async::<u64>(conn)
                    .await
                {
                    Ok(n) => renamed += n,
                    // Expired or renamed by another agent meanwhile.
                    Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(renamed)
        }
    }
}

/// Applies `op` to every key matching `pattern` on `conn`'s node.
async fn scan<C: ConnectionLike + Send>(
    conn: &mut C,
    pattern: &str,
    op: KeyOp,
) -> Result<u64, redis::RedisError> {
    let mut cursor = 0u64;
    let mut done = 0;
    // Bounded: SCAN visits each key at most a few times.
    for _ in 0..100_000 {
        let (next, keys): (u64, Vec<Vec<u8>>) = scan_cmd(cursor, pattern).query_async(conn).await?;
        done += apply(conn, op, &keys).await?;
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok(done)
}

/// Like [`scan`] on the cluster node at `host:port`.
async fn cluster_scan(
    conn: &mut ClusterConnection,
    pattern: &str,
    host: &str,
    port: u16,
    op: KeyOp,
) -> Result<u64, redis::RedisError> {
    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: host.to_owned(),
        port,
    });
    let mut cursor = 0u64;
    let mut done = 0;
    // Bounded: SCAN visits each key at most a few times.
    for _ in 0..100_000 {
        let value = conn
            .route_command(scan_cmd(cursor, pattern), route.clone())
            .await?;
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::from_redis_value(value)?;
        done += apply(conn, op, &keys).await?;
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok(done)
}

fn scan_cmd(cursor: u64, pattern: &str) -> redis::Cmd {
    let mut scan = redis::cmd("SCAN");
    scan.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000);
    scan
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
