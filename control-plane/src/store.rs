//! Where the control plane keeps its state, behind one [`Store`] trait:
//!
//! - [`DirStore`], the embedded default (`--state-dir`): `state.json` holds
//!   the applied policy (sources and compiled bundle), its history
//!   (bounded; each distinct source text stored once, by content address),
//!   tripped fuses and engaged limits with absolute deadlines, the last
//!   releases and the agents last seen. Rewritten atomically: temp file,
//!   fsync, rename, fsync of the directory, so a crash leaves the old file
//!   or the new one, never a torn one. The agents are apart, in
//!   `agents.jsonl` (`store/agents.rs`): a journal an ACK appends one line
//!   to, rewritten whole once it is twice as long as it needs to be.
//!   `audit.jsonl` has one JSON object
//!   per line for every operator action (apply, release) and every timer
//!   release; append-only, fsynced.
//! - `crate::etcd::EtcdStore` (`--store etcd://...`): the same state in
//!   etcd, shared by several govd replicas, with one elected leader.
//!
//! Every write of the shared state is conditioned on the revision it was
//! made from (compare-and-swap): a replica whose state is behind gets
//! [`Error::Conflict`], reloads and decides again, so two writers never
//! both win.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use gov_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::error::{Error, StateIo};

mod agents;
mod atomic;
pub use agents::{AgentChanges, KnownAgent};
pub use atomic::write_atomic;

/// Version of the `state.json` layout.
const FORMAT: u32 = 1;
const STATE_FILE: &str = "state.json";
const AUDIT_FILE: &str = "audit.jsonl";

/// Everything `state.json` holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Persisted {
    pub format: u32,
    #[serde(default)]
    pub applied: Option<AppliedPolicy>,
    /// Oldest first, bounded.
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
    #[serde(default)]
    pub trips: Vec<Trip>,
    #[serde(default)]
    pub agents: Vec<KnownAgent>,
    /// The last release of each rule, so that an agent that was away and
    /// comes back with the latch gets the release instead of re-tripping it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub releases: Vec<Released>,
    /// On disk only: the history's source texts by content address (one
    /// copy of each distinct text however many versions share it). Empty
    /// in memory: [`Store::load`] puts the texts back into the history.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub texts: BTreeMap<String, String>,
    /// A canary apply running (`crate::canary`): the version on trial is on
    /// its instances only until it is promoted or rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<StoredCanary>,
}

/// A canary as stored: what a restart needs to carry it on (the comparison
/// of outcomes starts again from the agents' next reports).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoredCanary {
    /// The policy on trial, as it is applied when promoted.
    pub policy: AppliedPolicy,
    /// The version in force when it started (on the other instances).
    pub previous: String,
    /// The services it changes.
    pub services: Vec<String>,
    /// The instances on trial.
    pub instances: BTreeSet<(String, String)>,
    pub started_unix_ms: u64,
    /// Promoted then unless a threshold is crossed first (wall clock, so a
    /// restart keeps the window).
    pub ends_unix_ms: u64,
    pub spec: CanarySpec,
}

/// A canary's share, window and thresholds (`pb::CanarySpec`, checked).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CanarySpec {
    pub share_percent: u32,
    pub window_ms: u64,
    /// 0: not checked.
    pub max_reject_ratio: f64,
    /// 0: not checked.
    pub max_error_ratio: f64,
    pub min_calls: u64,
}

/// The policy in force.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AppliedPolicy {
    pub version: String,
    pub who: String,
    pub at_unix_ms: u64,
    pub sources: Vec<Source>,
    pub bundle: pb::Bundle,
    /// Every rule in mode shadow, with when (Unix ms) the apply that put it
    /// there without a break since was made: `govc status` shows how long
    /// a rule has been in shadow.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shadow_since: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Source {
    pub name: String,
    pub text: String,
}

/// One applied version (the current one is the last).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub version: String,
    pub who: String,
    pub at_unix_ms: u64,
    /// Services added, changed or removed by this apply.
    pub services: Vec<String>,
    /// In memory (and in files written before content addressing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<Source>,
    /// On disk: each source's name and the address of its text in
    /// [`Persisted::texts`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_refs: Vec<SourceRef>,
}

/// When a rule was last released.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Released {
    pub kind: TripKind,
    pub rule: String,
    /// A limit's key released alone. Empty: every key of the rule.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    pub at_unix_ms: u64,
}

/// A history source on disk: its name and its text's content address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRef {
    pub name: String,
    /// `sha256:HEX` of the text.
    pub text: String,
}

/// A tripped fuse or an engaged limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TripKind {
    Fuse,
    Limit,
}

impl TripKind {
    /// The kind of rule that holds it.
    pub fn rule_kind(self) -> gov_proto::v1::RuleKind {
        match self {
            TripKind::Fuse => gov_proto::v1::RuleKind::Fuse,
            TripKind::Limit => gov_proto::v1::RuleKind::Limit,
        }
    }

    /// `fuse` or `limit`: the kind's word.
    pub fn as_str(self) -> &'static str {
        self.rule_kind().word()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trip {
    pub kind: TripKind,
    /// `service/rule`.
    pub rule: String,
    /// Limits keyed by consumer or called service: the latched key. Empty:
    /// the rule's own counter (and always for fuses).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    pub since_unix_ms: u64,
    pub reason: String,
    /// Fuses: half-open now (probing).
    #[serde(default)]
    pub half_open: bool,
    /// Limits with `release after`: when the control plane releases it.
    #[serde(default)]
    pub deadline_unix_ms: Option<u64>,
    /// Instances that reported it tripped/engaged.
    #[serde(default)]
    pub instances: BTreeSet<String>,
    /// Instances that later reported it released although nobody released
    /// it (an agent restart): the latch holds, but they do not enforce it.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub not_enforced: BTreeSet<String>,
    /// Who each instance of `instances` was when it reported the latch (its
    /// proved identity): govd re-arms it on an instance only while that
    /// instance proves the same identity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reported_by: BTreeMap<String, String>,
}

pub use crate::audit::AuditEntry;

/// A stored version of the shared state: what a conditional write
/// compares (etcd's mod revision of the state key; a write counter for the
/// directory, which has one writer).
pub type Revision = i64;

/// The shared state as stored, and its revision.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub state: Persisted,
    pub revision: Revision,
}

/// What a write of the shared state must also hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fence {
    /// Any replica may write it (an apply, an operator's release, latches
    /// its agents reported).
    Any,
    /// Only the elected leader (the `release after` timer): refused with
    /// [`Error::NotLeader`] once this replica's lease is gone.
    Leader,
}

/// A future of a store operation.
pub type StoreFuture<'a, T> = futures::future::BoxFuture<'a, Result<T, Error>>;

/// Where govd's state lives: the directory ([`DirStore`]) or etcd
/// (`crate::etcd::EtcdStore`).
pub trait Store: Send + Sync + 'static {
    /// Where it is, as the operator named it (for messages): the
    /// directory's path or `etcd://HOSTS/PREFIX`.
    fn describe(&self) -> String;

    /// The shared state and its revision (an empty state at revision 0
    /// when nothing was stored yet).
    fn load(&self) -> StoreFuture<'_, Loaded>;

    /// Writes `state` if the stored revision is still `expected` (and, with
    /// [`Fence::Leader`], this replica still leads); returns the new
    /// revision. [`Error::Conflict`] when another replica wrote first.
    fn save<'a>(
        &'a self,
        state: &'a Persisted,
        expected: Revision,
        fence: Fence,
    ) -> StoreFuture<'a, Revision>;

    /// Appends one audit record, durably.
    fn audit<'a>(&'a self, entry: &'a AuditEntry) -> StoreFuture<'a, ()>;

    /// One page of the audit log, oldest first.
    fn audit_page(&self, query: crate::audit::Query) -> StoreFuture<'_, crate::audit::Page>;

    /// Writes the agents this replica has seen apart from the shared state
    /// (each replica its own), or `None` when they are part of it (the
    /// directory: write it with [`Store::save`]).
    fn save_agents<'a>(&'a self, _agents: &'a [KnownAgent]) -> Option<StoreFuture<'a, ()>> {
        None
    }

    /// Writes the agent records that changed (`changes`) apart from the
    /// shared state, where the store keeps a journal of them (the
    /// directory); `all` gives every record, for a rewrite of the journal.
    /// `None`: it keeps none (write them with [`Store::save_agents`]).
    fn append_agents<'a>(
        &'a self,
        _changes: &'a AgentChanges,
        _all: &dyn Fn() -> Vec<KnownAgent>,
    ) -> Option<StoreFuture<'a, ()>> {
        None
    }

    /// The revision of each write of the shared state by anyone (another
    /// replica included), as it happens. `None`: nobody else writes it.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<Revision>> {
        None
    }

    /// The revision of the shared state as stored now, read from the store
    /// itself (a quorum read on etcd), not from what this replica last heard.
    /// `None`: this process is the only writer, so what it holds is current.
    fn current_revision(&self) -> Option<StoreFuture<'_, Revision>> {
        None
    }

    /// Whether this replica is the elected leader, as it changes. A lone
    /// govd always is.
    fn leader(&self) -> tokio::sync::watch::Receiver<bool> {
        tokio::sync::watch::channel(true).1
    }

    /// One cheap call that needs the store's quorum, bounded in time, for
    /// `crate::store_health`: etcd reads the leader key (linearizable) and
    /// answers the leader's name (`""`: none). `None`: nothing to probe
    /// (the directory is known by its writes).
    fn probe(&self) -> Option<StoreFuture<'_, String>> {
        None
    }
}

/// The next change of leadership. A closed channel never changes again (a
/// lone govd's store drops its sender: it is the leader for good), so this
/// then waits forever instead of being ready at once, which made the timer
/// spin a core on every govd with a state directory.
pub(crate) async fn leadership_change(leader: &mut tokio::sync::watch::Receiver<bool>) {
    if leader.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The state directory.
#[derive(Debug)]
pub struct DirStore {
    dir: PathBuf,
    /// Writes of `state.json` by this process: the directory has one
    /// writer, so a conditional write can only find it equal.
    revision: std::sync::atomic::AtomicI64,
    /// Lines in `agents.jsonl`; `usize::MAX` when it must be rewritten
    /// before anything is appended (a write failed, or its last line was
    /// cut short).
    journal_lines: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl DirStore {
    /// Creates the directory if needed.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| StateIo::new("create", &dir, source))?;
        remove_stale_temp_files(&dir);
        Ok(Self {
            dir,
            revision: std::sync::atomic::AtomicI64::new(0),
            journal_lines: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX)),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    pub fn audit_path(&self) -> PathBuf {
        self.dir.join(AUDIT_FILE)
    }

    /// Reads `state.json` and the agent journal over the agents it holds
    /// (a `state.json` written before the journal); a missing file is an
    /// empty state. Such older agents are written to a new journal at once,
    /// so that the next `state.json`, which holds none, loses none.
    pub fn load(&self) -> Result<Persisted, Error> {
        let path = self.state_path();
        let mut state = match fs::read(&path) {
            Ok(bytes) => decode(&bytes, &path.display().to_string())?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Persisted {
                format: FORMAT,
                ..Persisted::default()
            },
            Err(source) => return Err(StateIo::new("read", &path, source).into()),
        };
        self.load_agents(&mut state)?;
        Ok(state)
    }

    /// Replaces `state.json` atomically (without the agents: they are
    /// kept in the journal, [`DirStore::write_agents`]).
    pub fn save(&self, state: &Persisted) -> Result<(), Error> {
        write_atomic(&self.state_path(), &encode_parts(state, false)?)
    }

    /// Appends one line to `audit.jsonl` and syncs it.
    pub fn audit(&self, entry: &AuditEntry) -> Result<(), Error> {
        let path = self.audit_path();
        let mut line = serde_json::to_vec(entry).map_err(Error::Encode)?;
        line.push(b'\n');
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| StateIo::new("open", &path, source))?;
        file.write_all(&line)
            .map_err(|source| StateIo::new("write", &path, source))?;
        file.sync_data()
            .map_err(|source| StateIo::new("sync", &path, source))?;
        Ok(())
    }

    /// Reads `state.json` with its revision (this process's write count).
    pub fn load_now(&self) -> Result<Loaded, Error> {
        Ok(Loaded {
            state: self.load()?,
            revision: self.revision.load(std::sync::atomic::Ordering::SeqCst),
        })
    }

    /// Every audit entry, oldest first (unreadable lines are skipped).
    pub fn read_audit(&self) -> Result<Vec<AuditEntry>, Error> {
        let path = self.audit_path();
        match fs::read_to_string(&path) {
            Ok(text) => Ok(text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(StateIo::new("read", &path, source).into()),
        }
    }
}

impl Store for DirStore {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn load(&self) -> StoreFuture<'_, Loaded> {
        Box::pin(async move {
            let dir = self.handle();
            tokio::task::spawn_blocking(move || dir.load_now())
                .await
                .map_err(|e| blocking_failed("read", &self.dir, e))?
        })
    }

    fn save<'a>(
        &'a self,
        state: &'a Persisted,
        expected: Revision,
        _fence: Fence,
    ) -> StoreFuture<'a, Revision> {
        use std::sync::atomic::Ordering::SeqCst;
        Box::pin(async move {
            let found = self.revision.load(SeqCst);
            if found != expected {
                return Err(Error::Conflict {
                    store: self.describe(),
                    expected,
                    found,
                });
            }
            let state = state.clone();
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || DirStore::at(dir).save(&state))
                .await
                .map_err(|e| blocking_failed("write", &self.dir, e))??;
            Ok(self.revision.fetch_add(1, SeqCst) + 1)
        })
    }

    fn append_agents<'a>(
        &'a self,
        changes: &'a AgentChanges,
        all: &dyn Fn() -> Vec<KnownAgent>,
    ) -> Option<StoreFuture<'a, ()>> {
        let lines = self.journal_lines.load(std::sync::atomic::Ordering::SeqCst);
        let all = agents::due_rewrite(lines, changes).then(all);
        let (dir, changes) = (self.handle(), changes.clone());
        Some(Box::pin(async move {
            tokio::task::spawn_blocking(move || dir.write_agents(&changes, all.as_deref()))
                .await
                .map_err(|e| blocking_failed("write", &self.dir, e))?
        }))
    }

    fn audit<'a>(&'a self, entry: &'a AuditEntry) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let entry = entry.clone();
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || DirStore::at(dir).audit(&entry))
                .await
                .map_err(|e| blocking_failed("append to", &self.dir, e))?
        })
    }

    fn audit_page(&self, query: crate::audit::Query) -> StoreFuture<'_, crate::audit::Page> {
        Box::pin(async move {
            let path = self.audit_path();
            tokio::task::spawn_blocking(move || crate::audit::page(&path, &query))
                .await
                .map_err(|e| blocking_failed("read", &self.dir, e))?
        })
    }
}

impl DirStore {
    /// The directory, for a blocking task (the revision is the caller's).
    fn at(dir: PathBuf) -> Self {
        Self {
            dir,
            revision: std::sync::atomic::AtomicI64::new(0),
            journal_lines: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX)),
        }
    }

    /// This directory for a blocking task: its revision as now, its
    /// journal's line count shared.
    fn handle(&self) -> Self {
        Self {
            dir: self.dir.clone(),
            revision: std::sync::atomic::AtomicI64::new(
                self.revision.load(std::sync::atomic::Ordering::SeqCst),
            ),
            journal_lines: self.journal_lines.clone(),
        }
    }
}

/// A blocking task of the directory store panicked or was cancelled.
fn blocking_failed(op: &'static str, dir: &Path, e: tokio::task::JoinError) -> Error {
    Error::Io(StateIo::new(op, dir, std::io::Error::other(e)))
}

/// The stored form of `state` (JSON, history texts by content address),
/// as the directory and etcd keep it.
pub fn encode(state: &Persisted) -> Result<Vec<u8>, Error> {
    encode_parts(state, true)
}

/// [`encode`], with the agents or without them.
fn encode_parts(state: &Persisted, with_agents: bool) -> Result<Vec<u8>, Error> {
    let mut state = address_texts(state, with_agents);
    state.format = FORMAT;
    serde_json::to_vec_pretty(&state).map_err(Error::Encode)
}

/// The inverse of [`encode`]; `path` names where it was read, for errors.
pub fn decode(bytes: &[u8], path: &str) -> Result<Persisted, Error> {
    let state: Persisted = serde_json::from_slice(bytes).map_err(|source| Error::CorruptState {
        path: path.to_owned(),
        source,
    })?;
    if state.format != FORMAT {
        return Err(Error::StateFormat {
            path: path.to_owned(),
            found: state.format,
        });
    }
    resolve_texts(state).map_err(|address| Error::MissingText {
        path: path.to_owned(),
        address,
    })
}

/// `state` with each history source's text moved into `texts` under its
/// content address: 50 versions of a policy whose files rarely change cost
/// about one copy of it, not 50.
fn address_texts(state: &Persisted, with_agents: bool) -> Persisted {
    let mut out = Persisted {
        history: Vec::with_capacity(state.history.len()),
        agents: if with_agents {
            state.agents.clone()
        } else {
            Vec::new()
        },
        applied: state.applied.clone(),
        trips: state.trips.clone(),
        releases: state.releases.clone(),
        texts: state.texts.clone(),
        canary: state.canary.clone(),
        format: state.format,
    };
    out.history.clear();
    for entry in &state.history {
        let mut entry = entry.clone();
        for source in std::mem::take(&mut entry.sources) {
            let address = content_address(&source.text);
            out.texts.entry(address.clone()).or_insert(source.text);
            entry.source_refs.push(SourceRef {
                name: source.name,
                text: address,
            });
        }
        out.history.push(entry);
    }
    out
}

/// The inverse of [`address_texts`]; a reference to a text the file lacks
/// is the error (its address).
fn resolve_texts(mut state: Persisted) -> Result<Persisted, String> {
    let texts = std::mem::take(&mut state.texts);
    for entry in &mut state.history {
        for r in std::mem::take(&mut entry.source_refs) {
            let text = texts.get(&r.text).ok_or_else(|| r.text.clone())?;
            entry.sources.push(Source {
                name: r.name,
                text: text.clone(),
            });
        }
    }
    Ok(state)
}

/// `sha256:HEX` of `text`.
fn content_address(text: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Removes the temp files of [`write_atomic`] that a killed govd left in
/// `dir` (`.NAME.tmp.PID`): the directory has one writer, this process, so
/// none of them is being written. A file that cannot be removed is logged
/// and left; it is never read.
fn remove_stale_temp_files(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_temp_file_name(name) {
            continue;
        }
        let path = entry.path();
        match fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "removed a temp file a stopped govd left")
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot remove a temp file a stopped govd left")
            }
        }
    }
}

/// `.NAME.tmp.PID`, as [`write_atomic`] names its temp files.
fn is_temp_file_name(name: &str) -> bool {
    name.starts_with('.')
        && name.rsplit_once(".tmp.").is_some_and(|(head, pid)| {
            head.len() > 1 && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
        })
}

impl DirStore {
    pub fn agents_path(&self) -> PathBuf {
        self.dir.join(agents::AGENTS_FILE)
    }

    /// Replays the journal over the agents of `state` ([`agents::load`]).
    pub(super) fn load_agents(&self, state: &mut Persisted) -> Result<(), Error> {
        agents::load(&self.agents_path(), &self.journal_lines, &mut state.agents)
    }

    /// Writes `changes` to the agent journal ([`agents::write`]).
    pub fn write_agents(
        &self,
        changes: &AgentChanges,
        all: Option<&[KnownAgent]>,
    ) -> Result<(), Error> {
        agents::write(&self.agents_path(), &self.journal_lines, changes, all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_the_state_directory_removes_the_temp_files_a_killed_govd_left() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(".state.json.tmp.4242");
        let keep = [
            "state.json",
            ".state.json.tmp.",
            ".tmp.12",
            "notes.tmp.7",
            ".x.tmp.1a",
        ];
        std::fs::write(&stale, b"{").unwrap();
        for name in keep {
            std::fs::write(dir.path().join(name), b"{}").unwrap();
        }
        DirStore::open(dir.path()).unwrap();
        assert!(!stale.exists());
        for name in keep {
            assert!(dir.path().join(name).exists(), "{name} is not a temp file");
        }
    }

    #[test]
    fn state_round_trips_and_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::open(dir.path().join("s")).unwrap();
        assert!(store.load().unwrap().applied.is_none());
        let mut state = Persisted::default();
        state.trips.push(Trip {
            kind: TripKind::Limit,
            rule: "order/crm".into(),
            key: "alice".into(),
            since_unix_ms: 5,
            reason: "calls 100 per 1s".into(),
            half_open: false,
            deadline_unix_ms: Some(7_200_005),
            instances: ["a".to_string()].into(),
            not_enforced: ["b".to_string()].into(),
            reported_by: [("a".to_string(), "token `order-agents`".to_string())].into(),
        });
        store.save(&state).unwrap();
        store.save(&state).unwrap();
        let back = store.load().unwrap();
        assert_eq!(back.trips, state.trips);
        // No temp file is left behind.
        let names: Vec<_> = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")]);
    }

    #[test]
    fn corrupt_state_is_an_error_not_an_empty_state() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::open(dir.path()).unwrap();
        fs::write(store.state_path(), b"{not json").unwrap();
        let err = store.load().unwrap_err();
        assert!(err.to_string().contains("state.json"), "{err}");
    }

    #[test]
    fn history_sources_are_stored_once_per_distinct_text_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::open(dir.path()).unwrap();
        let big = "# a large policy file\n".repeat(10_000);
        let entry = |i: usize| HistoryEntry {
            version: format!("v{i}"),
            who: "alice".into(),
            at_unix_ms: i as u64,
            services: vec!["order".into()],
            sources: vec![
                Source {
                    name: "big.gov".into(),
                    text: big.clone(),
                },
                Source {
                    name: "small.gov".into(),
                    text: format!("# version {}\n", i % 2),
                },
            ],
            source_refs: Vec::new(),
        };
        let state = Persisted {
            history: (0..50).map(entry).collect(),
            ..Persisted::default()
        };
        store.save(&state).unwrap();
        let size = fs::metadata(store.state_path()).unwrap().len();
        assert!(
            size < 2 * big.len() as u64,
            "50 versions sharing one large file take {size} bytes (one copy: {})",
            big.len()
        );
        let loaded = store.load().unwrap();
        assert!(loaded.texts.is_empty());
        assert_eq!(loaded.history.len(), 50);
        for (i, e) in loaded.history.iter().enumerate() {
            assert_eq!(e.sources, entry(i).sources);
            assert!(e.source_refs.is_empty());
        }
        // A file that lost a text is refused, not read as an empty history.
        let text = fs::read_to_string(store.state_path()).unwrap();
        let broken = text.replacen("sha256:", "sha256:0", 1);
        fs::write(store.state_path(), broken).unwrap();
        assert!(matches!(store.load(), Err(Error::MissingText { .. })));
    }

    #[test]
    fn audit_appends_lines() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::open(dir.path()).unwrap();
        for who in ["alice", "bob"] {
            store
                .audit(&AuditEntry {
                    at_unix_ms: 1,
                    who: who.into(),
                    action: "apply".into(),
                    intent: String::new(),
                    version: "v".into(),
                    kind: String::new(),
                    rule: String::new(),
                    key: String::new(),
                    targets: vec![],
                    detail: String::new(),
                })
                .unwrap();
        }
        let entries = store.read_audit().unwrap();
        assert_eq!(
            entries.iter().map(|e| e.who.as_str()).collect::<Vec<_>>(),
            ["alice", "bob"]
        );
    }
}
