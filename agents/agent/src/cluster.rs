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
//! `rediss://` and `rediss+cluster://` are the first two over TLS (rustls),
//! checked against the CA of `--redis-ca` (else the system's roots), with a
//! client certificate when `--redis-cert`/`--redis-key` are given
//! ([`RedisTlsFiles`]). A Sentinel set over TLS is not supported yet.
//!
//! Keys and the failure behaviour are the engine's (`gov_engine::cluster`): a
//! rule's keys for one limit key share a hash tag, so each of the calls below
//! touches one slot of a cluster.
//! `sync exact` runs one small Lua script per call (`EVALSHA`: latch check,
//! `INCRBY`, `PEXPIRE` on the first hit, engage when over): one round trip.
//! `sync batch D` leases calls with another script (`EVALSHA`: give back,
//! count unleased calls, grant a slice of what is left, unless the latch is
//! set), when a key's lease runs out and every D for busy keys; every D it
//! also sends each key's bytes in one pipeline (`INCRBY` + `PEXPIRE` + `PTTL`
//! of the latch), reading back the cluster totals; on a cluster, one pipeline
//! per key, all at once.

mod scripts;
mod store;
mod tls;
mod topology;

use std::time::Duration;

pub use gov_engine::cluster::{ClusterStore, DEFAULT_TIMEOUT};
pub use tls::{RedisTlsError, RedisTlsFiles};
use topology::Conn;
pub use topology::RedisTarget;

/// The Redis URL or its TLS files cannot be used.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ClusterError {
    #[error("cannot use redis url `{url}`: {message}")]
    #[diagnostic(
        code(gov::agent::redis_url),
        help(
            "give `--redis` (or `GOV_REDIS`) one of `redis://HOST:PORT[/DB]`, \
             `redis+cluster://HOST:PORT[,HOST:PORT...]` or \
             `redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME` \
             (`rediss://` and `rediss+cluster://` over TLS), \
             e.g. `redis://127.0.0.1:6379`"
        )
    )]
    Url { url: String, message: String },

    #[error(transparent)]
    #[diagnostic(transparent)]
    Files(#[from] RedisTlsError),

    #[error(
        "`{url}` is plain Redis, but TLS files (--redis-ca, --redis-cert, --redis-key) were given"
    )]
    #[diagnostic(
        code(gov::agent::redis_tls),
        help(
            "write the URL as `rediss://...` or `rediss+cluster://...` to reach Redis over TLS, \
             or drop the TLS files"
        )
    )]
    PlainWithTls { url: String },

    #[error("cannot set up TLS to `{url}`: {message}")]
    #[diagnostic(
        code(gov::agent::redis_tls),
        help(
            "--redis-ca must be the PEM CA that signed the servers' certificates, \
             --redis-cert a PEM certificate and --redis-key its PEM private key"
        )
    )]
    Tls { url: String, message: String },
}

/// A store on the Redis at `url` (see the module doc for the three forms), with
/// [`DEFAULT_TIMEOUT`] per call. Connects lazily (a Redis that is down at
/// start is an outage like any other); must be called inside a Tokio runtime.
pub fn redis(url: &str) -> Result<ClusterStore, ClusterError> {
    redis_with_timeout(url, DEFAULT_TIMEOUT)
}

/// Like [`fn@redis`] with another per-call deadline.
pub fn redis_with_timeout(url: &str, timeout: Duration) -> Result<ClusterStore, ClusterError> {
    redis_with(url, timeout, &RedisTlsFiles::default())
}

/// Like [`redis_with_timeout`], over TLS with `tls`'s files (a `rediss://`
/// URL needs none of them: the system's roots check the server).
pub fn redis_with(
    url: &str,
    timeout: Duration,
    tls: &RedisTlsFiles,
) -> Result<ClusterStore, ClusterError> {
    let error = |message: String| ClusterError::Url {
        url: url.to_owned(),
        message,
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(error(
            "no tokio runtime: create the store inside one".into(),
        ));
    }
    let target = RedisTarget::parse(url).map_err(error)?;
    if !target.tls() && !tls.is_empty() {
        return Err(ClusterError::PlainWithTls {
            url: url.to_owned(),
        });
    }
    let certs = tls.read()?;
    let tls_error = |message: String| match target.tls() {
        true => ClusterError::Tls {
            url: url.to_owned(),
            message,
        },
        false => error(message),
    };
    // Latches an older release named `gov:{RULE:KEY}}:latch` get their
    // documented name, on a connection of their own (it ends with the task).
    let migration = Conn::connect(target.clone(), timeout, certs.clone()).map_err(tls_error)?;
    let conn = Conn::connect(target.clone(), timeout, certs).map_err(tls_error)?;
    tokio::spawn(store::Redis::new(migration).migrate_legacy_latches());
    Ok(ClusterStore::from_backend(
        Box::new(store::Redis::new(conn)),
        timeout,
    ))
}
