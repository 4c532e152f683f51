//! govd's state in etcd (`--store etcd://HOST:PORT,...[/PREFIX]`, or
//! `etcds://` over TLS: `tls`), shared by several govd replicas. Keys
//! under `PREFIX` (default `gov`):
//!
//! - `PREFIX/state/PART`: the shared state, a key per part as the state
//!   directory has a file per part (`crate::store::parts`). A write puts
//!   the parts that changed and removes those gone in one transaction with
//!   `PREFIX/revision`, conditioned on that key's mod revision
//!   (compare-and-swap): of two replicas writing from one revision, the
//!   loser reloads. A new latch writes its part and `PREFIX/revision`. New
//!   source texts, services' configs and lists go just before (not read
//!   until a commit names them), in transactions conditioned on the same
//!   revision, removals past one txn after (`txn.rs`).
//! - `PREFIX/state`: the whole state in one value, as earlier releases kept
//!   it (`crate::store::legacy`): read while `PREFIX/revision` does not
//!   exist, converted to parts at start ([`EtcdStore::load_converted`]).
//! - `PREFIX/agents/REPLICA/SERVICE/INSTANCE[/v]`: the agents this replica
//!   has seen, a record and a version key each (`agents.rs`: an ACK writes
//!   its agent's version; each replica its own keys, no contention).
//! - `PREFIX/audit/UNIXMS-REPLICA-SEQ`: one audit record each, created once
//!   and never rewritten.
//! - `PREFIX/leader`: the leader's name, attached to its lease. A replica
//!   keeps its lease alive every third of its TTL and campaigns for the
//!   key while it is free; it leads while it holds the key, and every write
//!   it makes as the leader ([`Fence::Leader`]) is conditioned on the key's
//!   create revision, so a replica whose lease expired (a long pause, a
//!   partition) cannot write as the leader any more, whatever it believes.

mod agents;
pub mod client;
mod config;
mod tls;
mod txn;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::audit::{Page, Query};
use crate::error::Error;
use crate::store::parts::{self, Stored};
use crate::store::{
    AgentChanges, AuditEntry, Fence, KnownAgent, Loaded, Persisted, Revision, Store, StoreFuture,
};
use client::pb::etcdserverpb::{
    Compare, RangeRequest, RangeResponse, RequestOp, TxnRequest, TxnResponse,
};
use client::{Client, ConnectOptions, EtcdError};
pub use config::EtcdConfig;
use config::etcd_error;
pub use tls::EtcdTlsFiles;
use txn::{
    MAX_OPS, Split, batches, commit, found, mod_revisions, removals, split, state_of, state_read,
    txn_op, unchanged_since,
};

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

/// The state in etcd (cheap to share: `Arc`).
pub struct EtcdStore {
    client: Client,
    config: EtcdConfig,
    /// The create revision of the leader key while this replica holds it; 0 otherwise.
    leader_rev: AtomicI64,
    leader: watch::Sender<bool>,
    changes: watch::Sender<Revision>,
    audit_seq: AtomicU64,
    /// The revision of the state this replica last read or wrote, and its
    /// parts: what a write is compared with.
    stored: std::sync::Mutex<(Revision, Stored)>,
    /// Bytes of the shared state written (keys and values), for benchmarks.
    written: AtomicU64,
    /// This replica's agents as etcd holds them (`agents.rs`).
    agents: std::sync::Mutex<agents::Written>,
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
        let mut options = ConnectOptions {
            timeout: Some(CALL_TIMEOUT),
            connect_timeout: Some(CALL_TIMEOUT),
            keep_alive: Some((Duration::from_secs(5), Duration::from_secs(5))),
            tls: None,
        };
        if let Some(files) = &config.tls {
            files.check(true)?;
            options.tls = Some(files.read()?);
        }
        let client = Client::connect(&config.endpoints, &options)
            .map_err(|source| etcd_error(&config, "connect", source))?;
        let store = Arc::new(Self {
            client,
            leader_rev: AtomicI64::new(0),
            leader: watch::channel(false).0,
            changes: watch::channel(0).0,
            audit_seq: AtomicU64::new(0),
            stored: std::sync::Mutex::new((-1, Stored::unknown([], false))),
            written: AtomicU64::new(0),
            agents: std::sync::Mutex::default(),
            config,
        });
        // A first call: a wrong address fails here, not in the first apply.
        store
            .get(RangeRequest::key(store.config.key("revision")), "answer")
            .await?;
        tokio::spawn(follow(store.clone(), shutdown.clone()));
        tokio::spawn(campaign(store.clone(), shutdown));
        Ok(store)
    }

    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Loads the state ([`Store::load`]) and converts a `PREFIX/state` an
    /// earlier govd wrote into parts at once; when another replica converts
    /// or writes first, what it wrote is read instead.
    pub async fn load_converted(&self) -> Result<Loaded, Error> {
        for _ in 0..5 {
            let mut loaded = self.load().await?;
            if !self.stored().1.legacy {
                return Ok(loaded);
            }
            match self.save(&loaded.state, loaded.revision, Fence::Any).await {
                Ok(revision) => {
                    tracing::info!(store = %self.describe(), "converted the state an earlier govd kept in one value to one key per part");
                    loaded.revision = revision;
                    return Ok(loaded);
                }
                Err(Error::Conflict { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        self.load().await
    }

    /// Bytes of the shared state this replica wrote (each key and value),
    /// since it connected.
    pub fn bytes_written(&self) -> u64 {
        self.written.load(Ordering::SeqCst)
    }

    fn stored(&self) -> std::sync::MutexGuard<'_, (Revision, Stored)> {
        self.stored
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this replica leads now.
    pub fn is_leader(&self) -> bool {
        self.leader_rev.load(Ordering::SeqCst) != 0
    }

    fn error(&self, op: &'static str, source: EtcdError) -> Error {
        etcd_error(&self.config, op, source)
    }

    /// Runs `call` again while it fails in a way that says the call may not
    /// have reached a member that could serve it, or its answer was lost
    /// ([`EtcdError::transient`]: a member killed mid-call, a leader change, a
    /// timeout), at most `RETRY_ATTEMPTS` times and for `RETRY_BUDGET`. A
    /// write tried again may have landed the first time: the conditional
    /// writes here find that out (a compare that fails on their own write).
    async fn retry<T, F>(&self, op: &'static str, call: impl Fn() -> F) -> Result<T, Error>
    where
        F: std::future::Future<Output = Result<T, EtcdError>>,
    {
        let deadline = tokio::time::Instant::now() + RETRY_BUDGET;
        let mut attempt = 1;
        loop {
            match call().await {
                Err(error)
                    if error.transient()
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

    async fn get(&self, request: RangeRequest, op: &'static str) -> Result<RangeResponse, Error> {
        self.retry(op, || self.client.range(request.clone())).await
    }

    async fn txn(&self, txn: TxnRequest, op: &'static str) -> Result<TxnResponse, Error> {
        self.retry(op, || self.client.txn(txn.clone())).await
    }

    /// [`EtcdStore::txn`] with the rest of each paged read
    /// ([`Client::txn_whole`]), tried again whole when it fails in transit.
    async fn txn_whole(&self, txn: TxnRequest, op: &'static str) -> Result<TxnResponse, Error> {
        self.retry(op, || self.client.txn_whole(txn.clone())).await
    }

    /// The shared state without the agents ([`Store::load_shared`]): one
    /// transaction, so the parts are of one revision.
    async fn load_state(&self) -> Result<Loaded, Error> {
        let got = self
            .txn_whole(state_read(&self.config), "read the state")
            .await?;
        let (state, stored, revision) = state_of(&got, &self.config)?;
        *self.stored() = (revision, stored);
        Ok(Loaded { state, revision })
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

    /// Writes `plan` (module doc), the commit conditioned on `expected`
    /// (and on the leader key with [`Fence::Leader`]): the new revision and
    /// the removals that failed (to make with the next write).
    async fn write(
        &self,
        plan: &parts::Plan,
        expected: Revision,
        fence: Fence,
        legacy: bool,
    ) -> Result<(Revision, Vec<String>), Error> {
        let mut when = unchanged_since(&self.config, expected, legacy);
        // What goes before the commit lands only while the state is still
        // the one the commit is made from (`txn::split`).
        let unchanged = when.clone();
        if fence == Fence::Leader {
            let rev = self.leader_rev.load(Ordering::SeqCst);
            if rev == 0 {
                return Err(Error::NotLeader {
                    store: self.describe(),
                });
            }
            let leader_key = self.config.key("leader");
            when.push(Compare::create_revision_is(leader_key.as_str(), rev));
        }
        // The commit's own: `PREFIX/revision`, the legacy value's removal.
        let Split { pre, main, after } =
            split(&plan.ops, plan.first, 1 + usize::from(legacy)).map_err(|puts| {
                self.error(
                    "write the state",
                    EtcdError::Invalid(format!(
                        "{puts} latches and releases change at once: more than one transaction takes"
                    )),
                )
            })?;
        let mut bytes = 0;
        self.write_before(&pre, unchanged, expected, legacy, &mut bytes)
            .await?;
        let txn = commit(&self.config, &main, when, legacy, &mut bytes);
        let response = self.txn(txn, "write the state").await?;
        if !response.succeeded {
            self.written.fetch_add(bytes as u64, Ordering::SeqCst);
            let found = found(&response, legacy);
            if found == expected {
                // The state was as expected: the leader key was not ours.
                self.set_leader(0);
                return Err(Error::NotLeader {
                    store: self.describe(),
                });
            }
            return Err(Error::Conflict {
                store: self.describe(),
                expected,
                found,
            });
        }
        let revision = response.revision();
        let mut left = Vec::new();
        for batch in batches(&after) {
            let ops: Vec<RequestOp> = batch
                .iter()
                .map(|op| txn_op(&self.config, op, &mut bytes))
                .collect();
            let done = self.txn(
                removals(&self.config.key("revision"), revision, ops),
                "remove parts",
            );
            let done = done.await.inspect_err(|error| tracing::warn!(error = %crate::error::one_line(error), "cannot remove parts of the state; trying again with the next write"));
            if !done.is_ok_and(|r| r.succeeded) {
                left.extend(batch.iter().map(|op| op.name().to_owned()));
            }
        }
        self.written.fetch_add(bytes as u64, Ordering::SeqCst);
        Ok((revision, left))
    }
}

impl EtcdStore {
    fn agents(&self) -> std::sync::MutexGuard<'_, agents::Written> {
        self.agents
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes `pre`, what a write puts (and removes) before its commit, in
    /// transactions that land only while the state is still the one the
    /// commit is made from (`unchanged`); [`Error::Conflict`] otherwise.
    async fn write_before(
        &self,
        pre: &[&parts::Op],
        unchanged: Vec<Compare>,
        expected: Revision,
        legacy: bool,
        bytes: &mut usize,
    ) -> Result<(), Error> {
        let (rev_key, legacy_key) = (self.config.key("revision"), self.config.key("state"));
        for batch in batches(pre) {
            let ops: Vec<RequestOp> = batch
                .iter()
                .map(|op| txn_op(&self.config, op, bytes))
                .collect();
            let txn = TxnRequest::default()
                .when(unchanged.clone())
                .and_then(ops)
                .or_else(vec![
                    RequestOp::get(rev_key.as_str()),
                    RequestOp::get(legacy_key.as_str()),
                ]);
            let response = self.txn(txn, "write the state").await?;
            if !response.succeeded {
                self.written.fetch_add(*bytes as u64, Ordering::SeqCst);
                return Err(Error::Conflict {
                    store: self.describe(),
                    expected,
                    found: found(&response, legacy),
                });
            }
        }
        Ok(())
    }
}

impl Store for EtcdStore {
    fn describe(&self) -> String {
        self.config.describe()
    }

    fn current_revision(&self) -> Option<StoreFuture<'_, Revision>> {
        Some(Box::pin(async move {
            // Linearizable (etcd's default): a member cut off from the
            // majority cannot answer it, so an old revision is never read.
            let keys =
                |name| RequestOp::range(RangeRequest::key(self.config.key(name)).keys_only());
            let txn = TxnRequest::default().and_then(vec![keys("revision"), keys("state")]);
            let got = self.txn(txn, "read the state's revision").await?;
            let [revision, legacy] = mod_revisions(&got);
            Ok(revision.or(legacy).unwrap_or(0))
        }))
    }

    fn load(&self) -> StoreFuture<'_, Loaded> {
        Box::pin(async move {
            let mut loaded = self.load_state().await?;
            let txn = |txn, op| self.txn_whole(txn, op);
            let (agents, written) = agents::load(&self.config, MAX_OPS, txn).await?;
            *self.agents() = written;
            loaded.state.agents = agents;
            Ok(loaded)
        })
    }

    fn load_shared(&self) -> StoreFuture<'_, Loaded> {
        Box::pin(self.load_state())
    }

    fn save<'a>(
        &'a self,
        state: &'a Persisted,
        expected: Revision,
        fence: Fence,
    ) -> StoreFuture<'a, Revision> {
        Box::pin(async move {
            let (plan, legacy) = {
                let stored = self.stored();
                if stored.0 != expected {
                    // Made from another revision than this replica read.
                    return Err(Error::Conflict {
                        store: self.describe(),
                        expected,
                        found: stored.0,
                    });
                }
                (parts::plan(&stored.1, state)?, stored.1.legacy)
            };
            match self.write(&plan, expected, fence, legacy).await {
                Ok((revision, left)) => {
                    let mut stored = self.stored();
                    *stored = (revision, plan.stored);
                    stored.1.left(left);
                    Ok(revision)
                }
                Err(error) => {
                    self.stored().1.forget(&plan.ops);
                    Err(error)
                }
            }
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
                let txn = TxnRequest::default()
                    .when(vec![Compare::create_revision_is(key.as_str(), 0)])
                    .and_then(vec![RequestOp::put(key.as_str(), value.clone(), 0)]);
                let response = self.txn(txn, "append to the audit log").await?;
                if response.succeeded {
                    return Ok(());
                }
                // Taken: by this very record when a first try landed and its
                // answer was lost (the retry then finds the key), which must
                // not be written twice.
                let got = self
                    .get(RangeRequest::key(key), "read back the audit record")
                    .await?;
                if got.kvs.first().is_some_and(|kv| kv.value == value) {
                    return Ok(());
                }
            }
            Err(self.error(
                "append to the audit log",
                EtcdError::Invalid("no free audit key".into()),
            ))
        })
    }

    fn audit_page(&self, query: Query) -> StoreFuture<'_, Page> {
        Box::pin(async move {
            let prefix = RangeRequest::prefix(self.config.key("audit/"));
            let got = self.get(prefix, "read the audit log").await?;
            crate::audit::page_of(got.kvs.into_iter().map(|kv| Ok(kv.value)), &query)
        })
    }

    fn append_agents<'a>(
        &'a self,
        changes: &'a AgentChanges,
        _all: &dyn Fn() -> Vec<KnownAgent>,
    ) -> Option<StoreFuture<'a, ()>> {
        Some(Box::pin(async move {
            let batches = agents::ops(&self.config, changes, &self.agents(), MAX_OPS);
            for batch in batches {
                let txn = TxnRequest::default().and_then(batch);
                self.txn(txn, "write the agents").await?;
            }
            agents::record(changes, &mut self.agents());
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
            let read = self.client.get(self.config.key("leader"));
            let got = match tokio::time::timeout(PROBE_TIMEOUT, read).await {
                Ok(got) => got.map_err(|e| self.error("read the leader key", e))?,
                Err(_) => {
                    // No answer from a quorum within the bound.
                    let error = EtcdError::TimedOut(PROBE_TIMEOUT);
                    return Err(self.error("read the leader key", error));
                }
            };
            Ok(got
                .kvs
                .first()
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
                .unwrap_or_default())
        }))
    }
}

/// Publishes the mod revision of every write of the state key (by any
/// replica), re-watching after a broken stream from what it saw last.
async fn follow(store: Arc<EtcdStore>, shutdown: CancellationToken) {
    let key = store.config.key("revision");
    loop {
        let Some(why) = watch_once(&store, &key, &shutdown).await else {
            return;
        };
        tracing::warn!(reason = %why, "the watch of the state in etcd broke; watching again");
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// Reads the state key's revision, then watches it from there until the
/// watch breaks: why it broke, or `None` on shutdown.
async fn watch_once(store: &EtcdStore, key: &str, shutdown: &CancellationToken) -> Option<String> {
    let got = match store.client.get(key).await {
        Ok(got) => got,
        Err(error) => return Some(format!("cannot read {key}: {error}")),
    };
    let seen = got.kvs.first().map_or(0, |kv| kv.mod_revision);
    store.changes.send_if_modified(|r| {
        let newer = seen > *r;
        *r = (*r).max(seen);
        newer
    });
    let from = got.revision() + 1;
    let mut stream = match store.client.watch(key, from).await {
        Ok(stream) => stream,
        Err(error) => return Some(format!("cannot watch {key}: {error}")),
    };
    loop {
        let message = tokio::select! {
            () = shutdown.cancelled() => return None,
            m = stream.message() => m,
        };
        let response = match message {
            Ok(Some(response)) => response,
            Ok(None) => return Some("etcd ended the watch stream".to_owned()),
            Err(error) => return Some(format!("the watch stream failed: {error}")),
        };
        // Canceled: by etcd, or its start revision compacted away (read
        // again, then watch from there).
        if response.canceled {
            return Some(if response.compact_revision > 0 {
                format!(
                    "revision {from} was compacted (to {})",
                    response.compact_revision
                )
            } else if response.cancel_reason.is_empty() {
                "etcd canceled the watch".to_owned()
            } else {
                format!("etcd canceled the watch: {}", response.cancel_reason)
            });
        }
        for event in &response.events {
            if let Some(kv) = &event.kv {
                let rev = kv.mod_revision;
                store.changes.send_if_modified(|r| {
                    let newer = rev > *r;
                    *r = (*r).max(rev);
                    newer
                });
            }
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
        let ttl_secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let lease = match store.client.lease_grant(ttl_secs).await {
            Ok(id) => id,
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
                    let revoke = store.client.lease_revoke(lease);
                    let _ = tokio::time::timeout(Duration::from_secs(1), revoke).await;
                    return;
                }
                _ = tick.tick() => {}
            }
            // Keep the lease alive (a new stream after a broken one, while
            // the lease may still be alive).
            if keeper.is_none() {
                keeper = store.client.lease_keep_alive(lease).await.ok();
            }
            let renewed = match keeper.as_mut() {
                Some(k) => matches!(
                    tokio::time::timeout(period, k.renew()).await,
                    Ok(Ok(ttl)) if ttl > 0
                ),
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
            let txn = TxnRequest::default()
                .when(vec![Compare::create_revision_is(leader_key.as_str(), 0)])
                .and_then(vec![RequestOp::put(
                    leader_key.as_str(),
                    store.config.replica.as_str(),
                    lease,
                )])
                .or_else(vec![RequestOp::get(leader_key.as_str())]);
            match store.txn(txn, "campaign").await {
                Ok(r) if r.succeeded => store.set_leader(r.revision()),
                Ok(r) => {
                    // Someone holds it: this replica, or another.
                    let holder = r.ranges().find_map(|g| g.kvs.first());
                    match holder {
                        Some(kv) if kv.lease == lease => store.set_leader(kv.create_revision),
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
        assert_eq!(c.part("policy.json"), "prod/state/policy.json");
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
