//! Where the counters live: a `--redis` URL read into a [`RedisTarget`], and the
//! connection to it ([`Conn`]): one server, a Redis Cluster (with the probe's
//! fresh connection after a failover), or the master a Sentinel set names.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::sentinel::{SentinelClient, SentinelServerType};

/// Where the counters live, read from a `--redis` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: the URL as the redis crate reads it (`rediss://`: TLS).
    Single(String),
    /// A Redis Cluster: seed nodes as `redis://HOST:PORT` (`rediss://`: TLS).
    Cluster(Vec<String>),
    /// The master the sentinels (`redis://HOST:PORT`) call `master`.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

const CLUSTER_SCHEME: &str = "redis+cluster://";
const TLS_CLUSTER_SCHEME: &str = "rediss+cluster://";
const SENTINEL_SCHEME: &str = "redis+sentinel://";
const TLS_SENTINEL_SCHEME: &str = "rediss+sentinel://";

impl RedisTarget {
    /// Reads a `--redis` URL; the message says what is wrong.
    pub fn parse(url: &str) -> Result<Self, String> {
        if url.starts_with(TLS_SENTINEL_SCHEME) {
            return Err(
                "a Sentinel set over TLS is not supported yet: reach the master with `rediss://`, \
                 or the sentinels and master without TLS"
                    .into(),
            );
        }
        if url.starts_with("rediss") && url.contains('#') {
            return Err(
                "a `#` fragment (such as `#insecure`, no certificate check) is not accepted: \
                 give the servers' CA with --redis-ca instead"
                    .into(),
            );
        }
        let (cluster, scheme) = match url.strip_prefix(TLS_CLUSTER_SCHEME) {
            Some(rest) => (Some(rest), "rediss"),
            None => (url.strip_prefix(CLUSTER_SCHEME), "redis"),
        };
        if let Some(rest) = cluster {
            let hosts = rest.strip_suffix('/').unwrap_or(rest);
            if hosts.contains('/') || hosts.contains('?') {
                return Err(
                    "a cluster URL takes no database or options: a Redis Cluster has only database 0"
                        .into(),
                );
            }
            return Ok(Self::Cluster(nodes(scheme, hosts)?));
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
                sentinels: nodes("redis", hosts)?,
                master: master.to_owned(),
            });
        }
        redis::Client::open(url).map_err(|e| e.to_string())?;
        Ok(Self::Single(url.to_owned()))
    }

    /// Whether the connections are TLS (`rediss://`, `rediss+cluster://`).
    pub fn tls(&self) -> bool {
        match self {
            Self::Single(url) => url.starts_with("rediss:"),
            Self::Cluster(nodes) => nodes.iter().any(|n| n.starts_with("rediss:")),
            Self::Sentinel { .. } => false,
        }
    }
}

/// `HOST:PORT,HOST:PORT` to `SCHEME://` URLs, each checked.
fn nodes(scheme: &str, hosts: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for host in hosts.split(',') {
        if host.is_empty() {
            return Err("an empty address in the list: give `HOST:PORT[,HOST:PORT...]`".into());
        }
        let url = format!("{scheme}://{host}");
        redis::IntoConnectionInfo::into_connection_info(url.as_str())
            .map_err(|e| format!("`{host}`: {e}"))?;
        out.push(url);
    }
    Ok(out)
}

pub(super) enum Conn {
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
pub(super) struct ClusterConns {
    client: redis::cluster::ClusterClient,
    config: redis::cluster::ClusterConfig,
    current: arc_swap::ArcSwap<ClusterConnection>,
    next: std::sync::Mutex<Option<ClusterConnection>>,
}

/// The connection to the master the sentinels name, looked up on first use
/// and again after an error (a failover makes the old master refuse writes
/// or vanish).
pub(super) struct SentinelConn {
    client: tokio::sync::Mutex<SentinelClient>,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    config: redis::AsyncConnectionConfig,
    lookup_timeout: Duration,
}

/// The longest the Redis client waits for a reply: a `sync exact timeout`
/// above it waits this long.
pub(super) const REPLY_TIMEOUT: Duration = Duration::from_secs(1);

// === impl Conn ===

impl Conn {
    /// A lazy connection to `target`; the message says what is wrong. The
    /// store bounds each call (`timeout`, or a `sync exact` limit's own); the
    /// client gives up on a reply after [`REPLY_TIMEOUT`] at the latest.
    /// `certs`: the TLS files' contents for a `rediss` target.
    pub(super) fn connect(
        target: RedisTarget,
        timeout: Duration,
        certs: Option<redis::TlsCertificates>,
    ) -> Result<Self, String> {
        let connect_timeout = timeout.max(Duration::from_millis(100));
        let reply_timeout = timeout.max(REPLY_TIMEOUT);
        Ok(match target {
            RedisTarget::Single(url) => {
                let client = match certs {
                    Some(certs) => redis::Client::build_with_tls(url, certs),
                    None => redis::Client::open(url),
                }
                .map_err(|e| e.to_string())?;
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(reply_timeout))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_secs(1));
                Conn::Single(
                    redis::aio::ConnectionManager::new_lazy_with_config(client, config)
                        .map_err(|e| e.to_string())?,
                )
            }
            RedisTarget::Cluster(nodes) => {
                // Few retries inside the client: the store's deadline decides, and
                // the engine counts locally while a slot has no master.
                let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
                    .retries(2)
                    .min_retry_wait(10)
                    .max_retry_wait(100);
                if let Some(certs) = certs {
                    builder = builder.certs(certs);
                }
                let client = builder.build().map_err(|e| e.to_string())?;
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(connect_timeout)
                    .set_response_timeout(reply_timeout);
                let conn = client.get_pending_async_connection_with_config(config.clone());
                Conn::Cluster(Box::new(ClusterConns {
                    client,
                    config,
                    current: arc_swap::ArcSwap::from_pointee(conn),
                    next: std::sync::Mutex::new(None),
                }))
            }
            RedisTarget::Sentinel { sentinels, master } => {
                let client =
                    SentinelClient::build(sentinels, master, None, SentinelServerType::Master)
                        .map_err(|e| e.to_string())?;
                Conn::Sentinel(Arc::new(SentinelConn {
                    client: tokio::sync::Mutex::new(client),
                    conn: tokio::sync::Mutex::new(None),
                    config: redis::AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(connect_timeout))
                        .set_response_timeout(Some(reply_timeout)),
                    lookup_timeout: (timeout * 20).max(Duration::from_secs(1)),
                }))
            }
        })
    }
}

/// The masters of a cluster (`host`, `port`), from `CLUSTER NODES` of any node.
pub(super) async fn cluster_masters(
    conn: &mut ClusterConnection,
) -> Result<Vec<(String, u16)>, String> {
    let value = conn
        .route_command(
            redis::cmd("CLUSTER").arg("NODES").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(|e| e.to_string())?;
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
    pub(super) fn conn(&self) -> ClusterConnection {
        (**self.current.load()).clone()
    }

    /// `PING` to every master of a connection made at the previous probe
    /// (the current one at the first); it becomes current if all answer.
    pub(super) async fn probe(&self) -> Result<(), redis::RedisError> {
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
    pub(super) async fn get(self: &Arc<Self>) -> Result<MultiplexedConnection, redis::RedisError> {
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
    pub(super) fn forget(&self) {
        if let Ok(mut slot) = self.conn.try_lock() {
            *slot = None;
        }
    }
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
            RedisTarget::parse("rediss+cluster://10.0.0.1:7000"),
            Ok(RedisTarget::Cluster(vec!["rediss://10.0.0.1:7000".into()]))
        );
        assert!(RedisTarget::parse("rediss://h:6380").unwrap().tls());
        assert!(!RedisTarget::parse("redis://h:6379").unwrap().tls());
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
            ("rediss+sentinel://a:1/m", "not supported yet"),
            ("rediss://a:1/#insecure", "--redis-ca"),
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
