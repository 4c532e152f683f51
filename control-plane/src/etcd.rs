//! govd's state in etcd (`--store etcd://HOST:PORT,...[/PREFIX]`, or
//! `etcds://` over TLS: [`tls`]), shared by several govd replicas. Keys
//! under `PREFIX` (default `gov`):
//!
//! - `PREFIX/state`: the shared state, as `state.json` holds it (without
//!   the agents). Every write is a transaction on its mod revision
//!   (compare-and-swap): two replicas writing from the same revision never
//!   both win, the loser reloads ([`crate::store::Store::save`]).
//! - `PREFIX/agents/REPLICA`: the agents this replica has seen (each
//!   replica writes its own key: no contention on what agents report).
//! - `PREFIX/audit/UNIXMS-REPLICA-SEQ`: one audit record each, created once
//!   and never rewritten.
//! - `PREFIX/leader`: the leader's name, attached to its lease. A replica
//!   keeps its lease alive every third of its TTL and campaigns for the
//!   key while it is free; it leads while it holds the key, and every write
//!   it makes as the leader ([`Fence::Leader`]) is conditioned on the key's
//!   create revision, so a replica whose lease expired (a long pause, a
//!   partition) cannot write as the leader any more, whatever it believes.

mod tls;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::audit::{Page, Query};
use crate::error::Error;
use crate::store::{
    AuditEntry, Fence, KnownAgent, Loaded, Persisted, Revision, Store, StoreFuture, decode, encode,
};
pub use tls::EtcdTlsFiles;

/// Each etcd call gives up after this (the store is then unavailable, and
/// the caller says so).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon a broken watch or campaign is tried again.
const RETRY: Duration = Duration::from_millis(500);
/// How often a call that failed in transit is sent (the client balances
/// over every member, and sends some calls to a member that is down before
/// it notices), the pause between tries, and how long all tries of one
/// call may take (two timeouts of a member that died under the call).
const RETRY_ATTEMPTS: usize = 5;
const RETRY_PAUSE: Duration = Duration::from_millis(100);
const RETRY_BUDGET: Duration = Duration::from_secs(12);
/// How long the store's health probe waits for a quorum read.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the state lives in etcd and who this replica is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `http://HOST:PORT` of each member (`https://` with `etcds://`).
    pub endpoints: Vec<String>,
    /// TLS (`etcds://`): the files to read at connect; `None`: plain.
    pub tls: Option<EtcdTlsFiles>,
    /// Key prefix, without a trailing `/`.
    pub prefix: String,
    /// This replica's name (its agents key, its audit keys, the leader key's value).
    pub replica: String,
    /// The leader lease's time to live: how long a dead leader's timers wait
    /// for a new leader at most.
    pub lease_ttl: Duration,
}

impl EtcdConfig {
    /// Reads `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` (`etcds://`: TLS,
    /// whose files [`EtcdConfig::with_tls`] sets).
    pub fn parse(url: &str, replica: &str, lease_ttl: Duration) -> Result<Self, Error> {
        let bad = |problem: &str| Error::StoreUrl {
            url: url.to_owned(),
            problem: problem.to_owned(),
        };
        let (rest, scheme) = match url.strip_prefix("etcds://") {
            Some(rest) => (rest, "https"),
            None => (
                url.strip_prefix("etcd://")
                    .ok_or_else(|| bad("it does not start with `etcd://` or `etcds://`"))?,
                "http",
            ),
        };
        let (hosts, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_matches('/');
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let Some((name, port)) = host.rsplit_once(':') else {
                return Err(bad(&format!("`{host}` has no port")));
            };
            if name.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad(&format!("`{host}` is not HOST:PORT")));
            }
            endpoints.push(format!("{scheme}://{host}"));
        }
        // Not the URL's fault: the error names the flag.
        if replica.is_empty() || replica.contains('/') {
            return Err(Error::StoreOption {
                flag: "--replica",
                problem: format!(
                    "`{replica}` is not a replica name: it must be non-empty without `/`"
                ),
            });
        }
        if lease_ttl < Duration::from_secs(2) {
            return Err(Error::StoreOption {
                flag: "--leader-lease",
                problem: format!("{lease_ttl:?} is shorter than etcd's minimum lease, 2s"),
            });
        }
        Ok(Self {
            tls: (scheme == "https").then(EtcdTlsFiles::default),
            endpoints,
            prefix: if prefix.is_empty() {
                "gov".into()
            } else {
                prefix.to_owned()
            },
            replica: replica.to_owned(),
            lease_ttl,
        })
    }

    /// With the TLS files of `--etcd-ca`, `--etcd-cert`, `--etcd-key` (all
    /// unset for `etcd://`; a CA at least for `etcds://`).
    pub fn with_tls(mut self, files: EtcdTlsFiles) -> Result<Self, Error> {
        files.check(self.tls.is_some())?;
        if self.tls.is_some() {
            self.tls = Some(files);
        }
        Ok(self)
    }

    fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.prefix)
    }
}

/// The state in etcd (cheap to share: `Arc`).
pub struct EtcdStore {
    client: Client,
    config: EtcdConfig,
    /// The create revision of the leader key while this replica holds it; 0 otherwise.
    leader_rev: AtomicI64,
    leader: watch::Sender<bool>,
    changes: watch::Sender<Revision>,
    audit_seq: AtomicU64,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects (checking that etcd answers), then follows the state key and
    /// campaigns for leadership until `shutdown`.
    pub async fn connect(
        config: EtcdConfig,
        shutdown: CancellationToken,
    ) -> Result<Arc<Self>, Error> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CALL_TIMEOUT)
            .with_timeout(CALL_TIMEOUT)
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
        if let Some(files) = &config.tls {
            files.check(true)?;
            options = options.with_tls(files.read()?);
        }
        let client = Client::connect(&config.endpoints, Some(options))
            .await
            .map_err(|source| etcd_error(&config, "connect", source))?;
        let store = Arc::new(Self {
            client,
            leader_rev: AtomicI64::new(0),
            leader: watch::channel(false).0,
            changes: watch::channel(0).0,
            audit_seq: AtomicU64::new(0),
            config,
        });
        // A first call: a wrong address fails here, not in the first apply.
        store.get(store.config.key("state"), None, "answer").await?;
        tokio::spawn(follow(store.clone(), shutdown.clone()));
        tokio::spawn(campaign(store.clone(), shutdown));
        Ok(store)
    }

    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Whether this replica leads now.
    pub fn is_leader(&self) -> bool {
        self.leader_rev.load(Ordering::SeqCst) != 0
    }

    fn error(&self, op: &'static str, source: etcd_client::Error) -> Error {
        etcd_error(&self.config, op, source)
    }

    /// Runs `call` again while it fails in a way that says the call may not
    /// have reached a member that could serve it, or its answer was lost
    /// ([`transient`]: a member killed mid-call, a leader change, a
    /// timeout), at most `RETRY_ATTEMPTS` times and for `RETRY_BUDGET`. A
    /// write tried again may have landed the first time: the conditional
    /// writes here find that out (a compare that fails on their own write).
    async fn retry<T, F>(&self, op: &'static str, call: impl Fn() -> F) -> Result<T, Error>
    where
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + RETRY_BUDGET;
        let mut attempt = 1;
        loop {
            match call().await {
                Err(error)
                    if transient(&error)
                        && attempt < RETRY_ATTEMPTS
                        && tokio::time::Instant::now() + RETRY_PAUSE < deadline =>
                {
                    tracing::debug!(op, attempt, error = %error, "etcd call failed in transit; trying again");
                    attempt += 1;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                result => return result.map_err(|e| self.error(op, e)),
            }
        }
    }

    async fn get(
        &self,
        key: String,
        options: Option<GetOptions>,
        op: &'static str,
    ) -> Result<etcd_client::GetResponse, Error> {
        self.retry(op, || {
            let (key, options) = (key.clone(), options.clone());
            let mut kv = self.client.kv_client();
            async move { kv.get(key, options).await }
        })
        .await
    }

    async fn txn(&self, txn: Txn, op: &'static str) -> Result<etcd_client::TxnResponse, Error> {
        self.retry(op, || {
            let txn = txn.clone();
            let mut kv = self.client.kv_client();
            async move { kv.txn(txn).await }
        })
        .await
    }

    fn set_leader(&self, rev: Revision) {
        let was = self.leader_rev.swap(rev, Ordering::SeqCst);
        if (was != 0) != (rev != 0) {
            if rev != 0 {
                tracing::info!(replica = %self.config.replica, "elected leader: running the timers");
            } else {
                tracing::warn!(replica = %self.config.replica, "lost the leader lease: no more leader writes");
            }
            self.leader.send_replace(rev != 0);
        }
    }
}

/// Whether `error` may be a call that never reached a member able to serve
/// it, or one whose answer was lost: worth trying again. A refusal on the
/// merits (a bad request, a permission) is not.
fn transient(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
                | tonic::Code::Unknown
                | tonic::Code::Aborted
        ),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

fn etcd_error(config: &EtcdConfig, op: &'static str, source: etcd_client::Error) -> Error {
    Error::Etcd {
        endpoints: config.endpoints.join(","),
        op,
        source,
    }
}

impl Store for EtcdStore {
    fn describe(&self) -> String {
        let hosts: Vec<&str> = self
            .config
            .endpoints
            .iter()
            .map(|e| e.split_once("://").map_or(e.as_str(), |(_, host)| host))
            .collect();
        let scheme = if self.config.tls.is_some() {
            "etcds"
        } else {
            "etcd"
        };
        format!("{scheme}://{}/{}", hosts.join(","), self.config.prefix)
    }

    fn current_revision(&self) -> Option<StoreFuture<'_, Revision>> {
        Some(Box::pin(async move {
            // Linearizable (etcd's default): a member cut off from the
            // majority cannot answer it, so an old revision is never read.
            let got = self
                .get(
                    self.config.key("state"),
                    Some(GetOptions::new().with_keys_only()),
                    "read the state's revision",
                )
                .await?;
            Ok(got.kvs().first().map_or(0, |kv| kv.mod_revision()))
        }))
    }

    fn load(&self) -> StoreFuture<'_, Loaded> {
        Box::pin(async move {
            let key = self.config.key("state");
            let got = self.get(key.clone(), None, "read the state").await?;
            let (mut state, revision) = match got.kvs().first() {
                Some(kv) => (
                    decode(kv.value(), &format!("etcd:{key}"))?,
                    kv.mod_revision(),
                ),
                None => (decode(&encode(&Persisted::default())?, "")?, 0),
            };
            let agents_key = self.config.key(&format!("agents/{}", self.config.replica));
            let got = self.get(agents_key, None, "read the agents").await?;
            if let Some(kv) = got.kvs().first() {
                // An unreadable registry only costs the DISCONNECTED rows.
                state.agents = serde_json::from_slice(kv.value()).unwrap_or_default();
            }
            Ok(Loaded { state, revision })
        })
    }

    fn save<'a>(
        &'a self,
        state: &'a Persisted,
        expected: Revision,
        fence: Fence,
    ) -> StoreFuture<'a, Revision> {
        Box::pin(async move {
            let key = self.config.key("state");
            let leader_key = self.config.key("leader");
            let mut shared = state.clone();
            shared.agents.clear();
            let bytes = encode(&shared)?;
            let mut when = vec![Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                expected,
            )];
            if fence == Fence::Leader {
                let rev = self.leader_rev.load(Ordering::SeqCst);
                if rev == 0 {
                    return Err(Error::NotLeader {
                        store: self.describe(),
                    });
                }
                when.push(Compare::create_revision(
                    leader_key.as_str(),
                    CompareOp::Equal,
                    rev,
                ));
            }
            let txn = Txn::new()
                .when(when)
                .and_then(vec![TxnOp::put(key.as_str(), bytes, None)])
                .or_else(vec![TxnOp::get(key.as_str(), None)]);
            let response = self.txn(txn, "write the state").await?;
            if response.succeeded() {
                return Ok(response.header().map_or(0, |h| h.revision()));
            }
            let found = response
                .op_responses()
                .into_iter()
                .find_map(|r| match r {
                    TxnOpResponse::Get(g) => {
                        Some(g.kvs().first().map_or(0, |kv| kv.mod_revision()))
                    }
                    _ => None,
                })
                .unwrap_or(0);
            if found == expected {
                // The state was as expected: the leader key was not ours.
                self.set_leader(0);
                return Err(Error::NotLeader {
                    store: self.describe(),
                });
            }
            Err(Error::Conflict {
                store: self.describe(),
                expected,
                found,
            })
        })
    }

    fn audit<'a>(&'a self, entry: &'a AuditEntry) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let value = serde_json::to_vec(entry).map_err(Error::Encode)?;
            // Created once, never overwritten: a name taken (a restarted
            // replica reusing a sequence number in the same millisecond)
            // takes the next number.
            for _ in 0..8 {
                let seq = self.audit_seq.fetch_add(1, Ordering::SeqCst);
                let key = self.config.key(&format!(
                    "audit/{:013}-{}-{seq:010}",
                    entry.at_unix_ms, self.config.replica
                ));
                let txn = Txn::new()
                    .when(vec![Compare::create_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        0,
                    )])
                    .and_then(vec![TxnOp::put(key.as_str(), value.clone(), None)]);
                let response = self.txn(txn, "append to the audit log").await?;
                if response.succeeded() {
                    return Ok(());
                }
                // Taken: by this very record when a first try landed and its
                // answer was lost (the retry then finds the key), which must
                // not be written twice.
                let got = self.get(key, None, "read back the audit record").await?;
                if got
                    .kvs()
                    .first()
                    .is_some_and(|kv| kv.value() == value.as_slice())
                {
                    return Ok(());
                }
            }
            Err(self.error(
                "append to the audit log",
                etcd_client::Error::InvalidArgs("no free audit key".into()),
            ))
        })
    }

    fn audit_page(&self, query: Query) -> StoreFuture<'_, Page> {
        Box::pin(async move {
            let prefix = self.config.key("audit/");
            let options = GetOptions::new().with_prefix();
            let got = self
                .get(prefix, Some(options), "read the audit log")
                .await?;
            crate::audit::page_of(got.kvs().iter().map(|kv| Ok(kv.value().to_vec())), &query)
        })
    }

    fn save_agents<'a>(&'a self, agents: &'a [KnownAgent]) -> Option<StoreFuture<'a, ()>> {
        Some(Box::pin(async move {
            let value = serde_json::to_vec(agents).map_err(Error::Encode)?;
            let key = self.config.key(&format!("agents/{}", self.config.replica));
            self.retry("write the agents", || {
                let (key, value) = (key.clone(), value.clone());
                let mut kv = self.client.kv_client();
                async move { kv.put(key, value, None).await }
            })
            .await?;
            Ok(())
        }))
    }

    fn changes(&self) -> Option<watch::Receiver<Revision>> {
        Some(self.changes.subscribe())
    }

    fn leader(&self) -> watch::Receiver<bool> {
        self.leader.subscribe()
    }

    fn probe(&self) -> Option<StoreFuture<'_, String>> {
        Some(Box::pin(async move {
            // One try, linearizable (a member cut off from the majority
            // cannot answer it), within a bound of its own: a probe says
            // how etcd is now, not after the retries of a write.
            let mut kv = self.client.kv_client();
            let read = kv.get(self.config.key("leader"), None);
            let got = match tokio::time::timeout(PROBE_TIMEOUT, read).await {
                Ok(got) => got.map_err(|e| self.error("read the leader key", e))?,
                Err(_) => {
                    return Err(self.error(
                        "read the leader key",
                        etcd_client::Error::IoError(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("no answer from a quorum within {PROBE_TIMEOUT:?}"),
                        )),
                    ));
                }
            };
            Ok(got
                .kvs()
                .first()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                .unwrap_or_default())
        }))
    }
}

/// Publishes the mod revision of every write of the state key (by any
/// replica), re-watching after a broken stream from what it saw last.
async fn follow(store: Arc<EtcdStore>, shutdown: CancellationToken) {
    let key = store.config.key("state");
    loop {
        let mut kv = store.client.kv_client();
        if let Ok(got) = kv.get(key.as_str(), None).await {
            let seen = got.kvs().first().map_or(0, |kv| kv.mod_revision());
            store.changes.send_if_modified(|r| {
                let newer = seen > *r;
                *r = (*r).max(seen);
                newer
            });
            let from = got.header().map_or(0, |h| h.revision()) + 1;
            let options = WatchOptions::new().with_start_revision(from);
            if let Ok(mut stream) = store
                .client
                .watch_client()
                .watch(key.as_str(), Some(options))
                .await
            {
                loop {
                    let message = tokio::select! {
                        () = shutdown.cancelled() => return,
                        m = stream.message() => m,
                    };
                    let Ok(Some(response)) = message else { break };
                    if response.canceled() {
                        break;
                    }
                    for event in response.events() {
                        if let Some(kv) = event.kv() {
                            let rev = kv.mod_revision();
                            store.changes.send_if_modified(|r| {
                                let newer = rev > *r;
                                *r = (*r).max(rev);
                                newer
                            });
                        }
                    }
                }
            }
        }
        tracing::warn!("the watch of the state in etcd broke; watching again");
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// Holds a lease and campaigns for the leader key while it is free; gives
/// leadership up as soon as the lease cannot be kept alive, and revokes
/// the lease on shutdown (the next leader takes over at once).
async fn campaign(store: Arc<EtcdStore>, shutdown: CancellationToken) {
    let ttl = store.config.lease_ttl;
    let period = ttl / 3;
    let leader_key = store.config.key("leader");
    loop {
        let mut lease_client = store.client.lease_client();
        let ttl_secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let lease = match lease_client.grant(ttl_secs, None).await {
            Ok(granted) => granted.id(),
            Err(error) => {
                tracing::warn!(%error, "cannot get a lease from etcd; retrying");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(RETRY) => {}
                }
                continue;
            }
        };
        let mut alive_until = tokio::time::Instant::now() + ttl;
        let mut keeper = None;
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => {
                    if store.leader_rev.swap(0, Ordering::SeqCst) != 0 {
                        tracing::info!("stopping: giving the leadership up");
                        store.leader.send_replace(false);
                    }
                    let revoke = lease_client.revoke(lease);
                    let _ = tokio::time::timeout(Duration::from_secs(1), revoke).await;
                    return;
                }
                _ = tick.tick() => {}
            }
            // Keep the lease alive (a new stream after a broken one, while
            // the lease may still be alive).
            if keeper.is_none() {
                keeper = lease_client.keep_alive(lease).await.ok();
            }
            let renewed = match keeper.as_mut() {
                Some((k, acks)) => {
                    let sent = k.keep_alive().await.is_ok();
                    sent && matches!(
                        tokio::time::timeout(period, acks.message()).await,
                        Ok(Ok(Some(ack))) if ack.ttl() > 0
                    )
                }
                None => false,
            };
            if renewed {
                alive_until = tokio::time::Instant::now() + ttl;
            } else {
                keeper = None;
            }
            // Not renewed since its TTL: the lease may be gone, and with it
            // the leader key.
            if tokio::time::Instant::now() >= alive_until {
                store.set_leader(0);
                break;
            }
            if !renewed {
                store.set_leader(0);
                continue;
            }
            let txn = Txn::new()
                .when(vec![Compare::create_revision(
                    leader_key.as_str(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then(vec![TxnOp::put(
                    leader_key.as_str(),
                    store.config.replica.as_str(),
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else(vec![TxnOp::get(leader_key.as_str(), None)]);
            match store.txn(txn, "campaign").await {
                Ok(r) if r.succeeded() => {
                    store.set_leader(r.header().map_or(0, |h| h.revision()));
                }
                Ok(r) => {
                    // Someone holds it: this replica, or another.
                    let holder = r.op_responses().into_iter().find_map(|op| match op {
                        TxnOpResponse::Get(g) => g.kvs().first().cloned(),
                        _ => None,
                    });
                    match holder {
                        Some(kv) if kv.lease() == lease => store.set_leader(kv.create_revision()),
                        _ => store.set_leader(0),
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot reach etcd to campaign");
                    store.set_leader(0);
                }
            }
        }
        tracing::warn!("the leader lease expired; taking a new one");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_name_every_member_and_a_prefix() {
        let ttl = Duration::from_secs(10);
        let c = EtcdConfig::parse("etcd://10.0.0.1:2379,10.0.0.2:2379/prod", "a", ttl).unwrap();
        assert_eq!(
            c.endpoints,
            ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert_eq!(c.prefix, "prod");
        assert_eq!(c.key("state"), "prod/state");
        let c = EtcdConfig::parse("etcd://localhost:2379", "a", ttl).unwrap();
        assert_eq!(c.prefix, "gov");
        assert_eq!(c.tls, None);
        let c = EtcdConfig::parse("etcds://10.0.0.1:2379/prod", "a", ttl).unwrap();
        assert_eq!(c.endpoints, ["https://10.0.0.1:2379"]);
        assert_eq!(c.tls, Some(EtcdTlsFiles::default()));
        for (url, problem) in [
            ("http://h:1", "etcd://"),
            ("etcd://h", "no port"),
            ("etcd://h:0", "HOST:PORT"),
            ("etcd://:1", "HOST:PORT"),
            ("etcd://h:1,", "no port"),
            ("etcd://h:x", "HOST:PORT"),
        ] {
            let err = EtcdConfig::parse(url, "a", ttl).unwrap_err();
            assert!(matches!(err, Error::StoreUrl { .. }), "{url}: {err}");
            assert!(crate::one_line(&err).contains(problem), "{url}: {err}");
        }
        // TLS files go with `etcds://`, a CA at least, a key with a certificate.
        let file = |name: &str| Some(std::path::PathBuf::from(name));
        for (url, files, problem) in [
            (
                "etcd://h:1",
                EtcdTlsFiles {
                    ca: file("ca.pem"),
                    ..EtcdTlsFiles::default()
                },
                "`etcd://` (plain)",
            ),
            ("etcds://h:1", EtcdTlsFiles::default(), "needs --etcd-ca"),
            (
                "etcds://h:1",
                EtcdTlsFiles {
                    ca: file("ca.pem"),
                    cert: file("c.pem"),
                    key: None,
                },
                "go together",
            ),
        ] {
            let err = EtcdConfig::parse(url, "a", ttl)
                .unwrap()
                .with_tls(files)
                .unwrap_err();
            assert!(matches!(err, Error::EtcdTls { .. }), "{url}: {err}");
            assert!(err.to_string().contains(problem), "{url}: {err}");
        }
        // A bad --replica or --leader-lease is not blamed on the URL.
        for (replica, lease, flag) in [
            ("a/b", ttl, "--replica"),
            ("", ttl, "--replica"),
            ("a", Duration::from_secs(1), "--leader-lease 1s is shorter"),
        ] {
            let err = EtcdConfig::parse("etcd://h:1", replica, lease).unwrap_err();
            assert!(matches!(err, Error::StoreOption { .. }), "{err}");
            assert!(err.to_string().starts_with(flag), "{err}");
        }
    }
}
