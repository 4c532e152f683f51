//! The Redis backend of the engine's cluster counter store (`scope cluster`
//! limits): `gov_agent::cluster::redis(url)` makes a [`ClusterStore`] for
//! [`Engine::with_cluster_store`](gov_engine::Engine::with_cluster_store).
//!
//! Three deployments, by URL:
//! - `redis://HOST:PORT[/DB]`: one server (a connection manager that reconnects);
//! - `redis+cluster://HOST:PORT[,HOST:PORT...]`: a Redis Cluster, reached through
//!   any of the seed nodes (the redis crate's cluster client follows `MOVED`,
//!   `ASK` and failovers);
//! - `redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER`: the master that the
//!   sentinels name `MASTER`, looked up again after every error.
//!
//! Keys and the failure behaviour are the engine's (`gov_engine::cluster`): a
//! rule's keys for one limit key share a hash tag, so each of the calls below
//! touches one slot of a cluster.
//! `sync exact` runs one small Lua script per call (`EVALSHA`: latch check,
//! `INCRBY`, `PEXPIRE` on the first hit, engage when over): one round trip.
//! `sync batch D` sends every key's delta every D in one pipeline (`INCRBY` +
//! `PEXPIRE` + `PTTL` of the latch), reading back the cluster totals; on a
//! cluster, one pipeline per key, all at once.

use std::sync::Arc;
use std::time::Duration;

use gov_engine::cluster::{
    Backend, ExactCall, ExactReply, FlushItem, FlushReply, LATCH_SUFFIX, Latch, StoreFuture,
    latch_prefix,
};
pub use gov_engine::cluster::{ClusterStore, DEFAULT_TIMEOUT};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::sentinel::{SentinelClient, SentinelServerType};

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
    help(
        "give `--redis` (or `GOV_REDIS`) one of `redis://HOST:PORT[/DB]`, \
         `redis+cluster://HOST:PORT[,HOST:PORT...]` or \
         `redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME`, \
         e.g. `redis://127.0.0.1:6379`"
    )
)]
pub struct ClusterError {
    pub url: String,
    pub message: String,
}

/// Where the counters live, read from a `--redis` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: the URL as the redis crate reads it.
    Single(String),
    /// A Redis Cluster: seed nodes as `redis://HOST:PORT`.
    Cluster(Vec<String>),
    /// The master the sentinels (`redis://HOST:PORT`) call `master`.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

const CLUSTER_SCHEME: &str = "redis+cluster://";
const SENTINEL_SCHEME: &str = "redis+sentinel://";

impl RedisTarget {
    /// Reads a `--redis` URL; the message says what is wrong.
    pub fn parse(url: &str) -> Result<Self, String> {
        if let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) {
            let hosts = rest.strip_suffix('/').unwrap_or(rest);
            if hosts.contains('/') || hosts.contains('?') {
                return Err(
                    "a cluster URL takes no database or options: a Redis Cluster has only database 0"
                        .into(),
                );
            }
            return Ok(Self::Cluster(nodes(hosts)?));
        }
        if let Some(rest) = url.strip_prefix(SENTINEL_SCHEME) {
            let Some((hosts, master)) = rest.split_once('/') else {
                return Err(
                    "a sentinel URL ends with `/MASTER_NAME`, the name the sentinels monitor"
                        .into(),
                );
            };
            if master.is_empty() || master.contains(['/', '?', ' ']) {
                return Err(format!(
                    "`{master}` is not a master name: a sentinel URL ends with `/MASTER_NAME`"
                ));
            }
            return Ok(Self::Sentinel {
                sentinels: nodes(hosts)?,
                master: master.to_owned(),
            });
        }
        redis::Client::open(url).map_err(|e| e.to_string())?;
        Ok(Self::Single(url.to_owned()))
    }
}

/// `HOST:PORT,HOST:PORT` to `redis://` URLs, each checked.
fn nodes(hosts: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for host in hosts.split(',') {
        if host.is_empty() {
            return Err("an empty address in the list: give `HOST:PORT[,HOST:PORT...]`".into());
        }
        let url = format!("redis://{host}");
        redis::IntoConnectionInfo::into_connection_info(url.as_str())
            .map_err(|e| format!("`{host}`: {e}"))?;
        out.push(url);
    }
    Ok(out)
}

/// A store on the Redis at `url` (see the module doc for the three forms), with
/// [`DEFAULT_TIMEOUT`] per call. Connects lazily (a Redis that is down at
/// start is an outage like any other); must be called inside a Tokio runtime.
pub fn redis(url: &str) -> Result<ClusterStore, ClusterError> {
    redis_with_timeout(url, DEFAULT_TIMEOUT)
}

/// Like [`redis`] with another per-call deadline.
pub fn redis_with_timeout(url: &str, timeout: Duration) -> Result<ClusterStore, ClusterError> {
    let error = |message: String| ClusterError {
        url: url.to_owned(),
        message,
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(error(
            "no tokio runtime: create the store inside one".into(),
        ));
    }
    let connect_timeout = timeout.max(Duration::from_millis(100));
    let conn = match RedisTarget::parse(url).map_err(error)? {
        RedisTarget::Single(url) => {
            let client = redis::Client::open(url).map_err(|e| error(e.to_string()))?;
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_secs(1));
            Conn::Single(
                redis::aio::ConnectionManager::new_lazy_with_config(client, config)
                    .map_err(|e| error(e.to_string()))?,
            )
        }
        RedisTarget::Cluster(nodes) => {
            // Few retries inside the client: the store's deadline decides, and
            // the engine counts locally while a slot has no master.
            let client = redis::cluster::ClusterClientBuilder::new(nodes)
                .retries(2)
                .min_retry_wait(10)
                .max_retry_wait(100)
                .build()
                .map_err(|e| error(e.to_string()))?;
            let config = redis::cluster::ClusterConfig::new()
                .set_connection_timeout(connect_timeout)
                .set_response_timeout(timeout);
            let conn = client.get_pending_async_connection_with_config(config.clone());
            Conn::Cluster(Box::new(ClusterConns {
                client,
                config,
                current: arc_swap::ArcSwap::from_pointee(conn),
                next: std::sync::Mutex::new(None),
            }))
        }
        RedisTarget::Sentinel { sentinels, master } => {
            let client = SentinelClient::build(sentinels, master, None, SentinelServerType::Master)
                .map_err(|e| error(e.to_string()))?;
            Conn::Sentinel(Arc::new(SentinelConn {
                client: tokio::sync::Mutex::new(client),
                conn: tokio::sync::Mutex::new(None),
                config: redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(timeout)),
                lookup_timeout: (timeout * 20).max(Duration::from_secs(1)),
            }))
        }
    };
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
    conn: Conn,
    script: redis::Script,
}

enum Conn {
    Single(redis::aio::ConnectionManager),
    Cluster(Box<ClusterConns>),
    Sentinel(Arc<SentinelConn>),
}

/// The cluster connection, and the one the next probe tries.
///
/// While the store is down the engine sends only the probe's `PING`, and the
/// cluster client refreshes its slot map on errors of its own choosing: one
/// refreshed before the failover ended could keep pinging the dead master.
/// So each probe tries a connection made at the previous probe (its slot map
/// read then, from the seeds) and leaves a new one for the next.
struct ClusterConns {
    client: redis::cluster::ClusterClient,
    config: redis::cluster::ClusterConfig,
    current: arc_swap::ArcSwap<ClusterConnection>,
    next: std::sync::Mutex<Option<ClusterConnection>>,
}

/// The connection to the master the sentinels name, looked up on first use
/// and again after an error (a failover makes the old master refuse writes
/// or vanish).
struct SentinelConn {
    client: tokio::sync::Mutex<SentinelClient>,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    config: redis::AsyncConnectionConfig,
    lookup_timeout: Duration,
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

impl Backend for Redis {
    fn exact(&self, call: ExactCall) -> StoreFuture<'_, ExactReply> {
        Box::pin(async move {
            let reply: (i64, i64) = with_conn!(self, conn => self
                .script
                .key(&call.counter)
                .key(&call.latch)
                .arg(1)
                .arg(call.expiry_ms)
                .arg(call.amount)
                .arg(call.latch_ms)
                .invoke_async(&mut conn))
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
        Box::pin(async move {
            let values: Vec<i64> = match &self.conn {
                // A cluster pipeline must stay in one slot: one per key (its
                // calls, bytes and latch share a hash tag), sent together.
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
        Box::pin(async move {
            let pattern = format!("{}*{LATCH_SUFFIX}", glob_escape(&latch_prefix(&rule)));
            match &self.conn {
                // SCAN walks one node: walk every master, delete by key (DEL is
                // routed to each key's slot).
                Conn::Cluster(cluster) => {
                    let mut conn = cluster.conn();
                    let mut deleted = 0;
                    for (host, port) in cluster_masters(&mut conn).await? {
                        deleted += cluster_scan_delete(&mut conn, &pattern, &host, port)
                            .await
                            .map_err(text)?;
                    }
                    Ok(deleted)
                }
                _ => with_conn!(self, conn => scan_delete(&mut conn, &pattern)).map_err(text),
            }
        })
    }

    fn release_latch(&self, latch: String) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            // DEL is routed to the key's slot on a cluster.
            with_conn!(self, conn => redis::cmd("DEL").arg(&latch).query_async::<u64>(&mut conn))
                .map_err(text)
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

/// Appends one flush item's commands: its replies are the calls count, the
/// bytes count (each if present), then the latch's `PTTL`.
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

/// Deletes the keys matching `pattern` on one server; returns how many there
/// were.
async fn scan_delete<C: ConnectionLike + Send>(
    conn: &mut C,
    pattern: &str,
) -> Result<u64, redis::RedisError> {
    let mut cursor = 0u64;
    let mut deleted = 0;
    // Bounded: SCAN visits each key at most a few times.
    for _ in 0..100_000 {
        let (next, keys): (u64, Vec<Vec<u8>>) = scan_cmd(cursor, pattern).query_async(conn).await?;
        if !keys.is_empty() {
            let n: u64 = redis::cmd("DEL").arg(&keys).query_async(conn).await?;
            deleted += n;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok(deleted)
}

/// Like [`scan_delete`] on the cluster node at `host:port`.
async fn cluster_scan_delete(
    conn: &mut ClusterConnection,
    pattern: &str,
    host: &str,
    port: u16,
) -> Result<u64, redis::RedisError> {
    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: host.to_owned(),
        port,
    });
    let mut cursor = 0u64;
    let mut deleted = 0;
    // Bounded: SCAN visits each key at most a few times.
    for _ in 0..100_000 {
        let value = conn
            .route_command(scan_cmd(cursor, pattern), route.clone())
            .await?;
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::from_redis_value(value)?;
        if !keys.is_empty() {
            // DEL is split by slot and summed by the cluster client.
            let n: u64 = redis::cmd("DEL").arg(&keys).query_async(conn).await?;
            deleted += n;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok(deleted)
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

/// The masters of a cluster (`host`, `port`), from `CLUSTER NODES` of any node.
async fn cluster_masters(conn: &mut ClusterConnection) -> Result<Vec<(String, u16)>, String> {
    let value = conn
        .route_command(
            redis::cmd("CLUSTER").arg("NODES").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(text)?;
    let nodes: String = redis::from_redis_value(value).map_err(|e| e.to_string())?;
    Ok(parse_cluster_masters(&nodes))
}

/// Masters that are not failed, from `CLUSTER NODES` text: one node a line,
/// `ID HOST:PORT@BUSPORT[,HOSTNAME] FLAGS ...`.
fn parse_cluster_masters(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let address = fields.nth(1)?;
            let flags = fields.next()?;
            let flags: Vec<&str> = flags.split(',').collect();
            if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
                return None;
            }
            let address = address.split(['@', ',']).next()?;
            let (host, port) = address.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

// === impl ClusterConns ===

impl ClusterConns {
    fn conn(&self) -> ClusterConnection {
        (**self.current.load()).clone()
    }

    /// `PING` to every master of a connection made at the previous probe
    /// (the current one at the first); it becomes current if all answer.
    async fn probe(&self) -> Result<(), redis::RedisError> {
        let fresh = self
            .client
            .get_pending_async_connection_with_config(self.config.clone());
        let candidate = match self.next.lock() {
            Ok(mut next) => next.replace(fresh),
            Err(_) => None,
        };
        let mut candidate = candidate.unwrap_or_else(|| self.conn());
        let _: String = redis::cmd("PING").query_async(&mut candidate).await?;
        self.current.store(Arc::new(candidate));
        if let Ok(mut next) = self.next.lock() {
            *next = None;
        }
        Ok(())
    }
}

// === impl SentinelConn ===

impl SentinelConn {
    /// The master's connection, looked up through the sentinels if there is none.
    async fn get(self: &Arc<Self>) -> Result<MultiplexedConnection, redis::RedisError> {
        if let Ok(slot) = self.conn.try_lock()
            && let Some(conn) = slot.as_ref()
        {
            return Ok(conn.clone());
        }
        // In its own task: a caller's deadline must not cancel the lookup half
        // way; the next caller finds its result.
        let this = Arc::clone(self);
        let lookup = tokio::spawn(async move {
            let mut slot = this.conn.lock().await;
            if let Some(conn) = slot.as_ref() {
                return Ok(conn.clone());
            }
            let connect = async {
                this.client
                    .lock()
                    .await
                    .get_async_connection_with_config(&this.config)
                    .await
            };
            let conn = tokio::time::timeout(this.lookup_timeout, connect)
                .await
                .map_err(|_| {
                    redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "no master from the sentinels within the deadline",
                    ))
                })??;
            *slot = Some(conn.clone());
            Ok(conn)
        });
        lookup.await.map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::Io,
                "sentinel lookup failed",
                e.to_string(),
            ))
        })?
    }

    /// Drops the connection (unless a lookup is under way) so the next call
    /// asks the sentinels again.
    fn forget(&self) {
        if let Ok(mut slot) = self.conn.try_lock() {
            *slot = None;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_one_server_a_cluster_or_a_sentinel_set() {
        assert_eq!(
            RedisTarget::parse("redis://127.0.0.1:6379/2"),
            Ok(RedisTarget::Single("redis://127.0.0.1:6379/2".into()))
        );
        assert_eq!(
            RedisTarget::parse("redis+cluster://10.0.0.1:7000,10.0.0.2:7001/"),
            Ok(RedisTarget::Cluster(vec![
                "redis://10.0.0.1:7000".into(),
                "redis://10.0.0.2:7001".into()
            ]))
        );
        assert_eq!(
            RedisTarget::parse("redis+sentinel://s1:26379,s2:26379/counters"),
            Ok(RedisTarget::Sentinel {
                sentinels: vec!["redis://s1:26379".into(), "redis://s2:26379".into()],
                master: "counters".into()
            })
        );
        for (bad, says) in [
            ("redis+cluster://", "empty address"),
            ("redis+cluster://a:1,,b:2", "empty address"),
            ("redis+cluster://a:1/3", "database"),
            ("redis+cluster://a:notaport", "`a:notaport`"),
            ("redis+sentinel://a:1", "MASTER_NAME"),
            ("redis+sentinel://a:1/", "master name"),
            ("redis+sentinel://a:1/m/2", "master name"),
            ("http://a:1", ""),
        ] {
            let e = RedisTarget::parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn masters_are_read_from_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001,host-b master - 0 0 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master,fail - 0 0 3 connected
d4 127.0.0.1:7003@17003 slave b2 0 0 2 connected
e5 ::1:7004@17004 master - 0 0 4 connected 10923-16383
";
        assert_eq!(
            parse_cluster_masters(nodes),
            vec![
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7001),
                ("::1".to_owned(), 7004)
            ]
        );
    }
}
