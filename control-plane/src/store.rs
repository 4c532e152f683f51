//! Where the control plane keeps its state, behind one [`Store`] trait:
//!
//! - [`DirStore`], the embedded default (`--state-dir`): the shared state
//!   in parts, one file each (`store/parts.rs`): the policy in force, each
//!   service's compiled config (`store/targets.rs`), each history entry,
//!   each distinct source text, each latch, each rule's last release, a
//!   running canary. A write writes only the parts that changed
//!   (a new latch its part), each atomically: temp file, fsync, rename, fsync
//!   of the directory, so a crash leaves the old file or the new one, never
//!   a torn one, and the parts' order makes every prefix of a write
//!   loadable. A `state.json` an earlier govd wrote (`store/legacy.rs`) is
//!   read and converted to parts at start. The agents are apart, in
//!   `agents.jsonl` (`store/agents.rs`): a journal an ACK appends one line
//!   to, rewritten whole once it is twice as long as it needs to be.
//!   `audit.jsonl` has one JSON object
//!   per line for every operator action (apply, release) and every timer
//!   release; append-only, fsynced.
//! - `crate::etcd::EtcdStore` (`--store etcd://...`): the same parts in
//!   etcd, one key each, shared by several govd replicas, with one elected
//!   leader.
//!
//! Every write of the shared state is conditioned on the revision it was
//! made from (compare-and-swap): a replica whose state is behind gets
//! [`Error::Conflict`], reloads and decides again, so two writers never
//! both win. A store keeps what it last read or wrote ([`parts::Stored`])
//! and writes the difference.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use crate::error::{Error, StateIo};

mod agents;
mod atomic;
mod files;
pub mod legacy;
mod model;
pub mod parts;
mod targets;
pub use agents::{AgentChanges, KnownAgent};
pub use atomic::write_atomic;
pub use model::{
    AppliedPolicy, CanarySpec, HistoryEntry, Persisted, Source, SourceRef, StoredCanary,
};

/// The state file of earlier releases (`legacy.rs`).
const STATE_FILE: &str = "state.json";
const AUDIT_FILE: &str = "audit.jsonl";

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

    /// [`Store::load`] without this replica's agents (`agents` empty): what
    /// another replica's write can change (`State::adopt` takes no agent
    /// records), read without the records, which grow with the fleet (about
    /// 2 MB at 10,000 agents on etcd).
    fn load_shared(&self) -> StoreFuture<'_, Loaded> {
        self.load()
    }

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

    /// Writes the agent records that changed (`changes`) apart from the
    /// shared state: appended to the directory's journal (`all` gives every
    /// record, for a rewrite of the journal), a key per agent in etcd (each
    /// replica its own). `None`: they are part of the shared state (write
    /// it with [`Store::save`]).
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
    /// Writes of the shared state by this process: the directory has one
    /// writer, so a conditional write can only find it equal.
    revision: AtomicI64,
    /// Lines in `agents.jsonl`; `usize::MAX` when it must be rewritten
    /// before anything is appended (a write failed, or its last line was
    /// cut short).
    journal_lines: Arc<AtomicUsize>,
    /// The parts as last read or written: what a write is compared with.
    stored: Arc<Mutex<parts::Stored>>,
    /// Bytes of parts written (names and contents), for benchmarks.
    written: Arc<AtomicU64>,
}

impl DirStore {
    /// Creates the directory if needed.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| StateIo::new("create", &dir, source))?;
        files::remove_stale_temp_files(&dir);
        let legacy = dir.join(STATE_FILE).exists();
        let stored = parts::Stored::unknown(files::part_names(&dir)?, legacy);
        Ok(Self {
            dir,
            revision: AtomicI64::new(0),
            journal_lines: Arc::new(AtomicUsize::new(usize::MAX)),
            stored: Arc::new(Mutex::new(stored)),
            written: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `state.json` of earlier releases (converted to parts at start).
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    pub fn audit_path(&self) -> PathBuf {
        self.dir.join(AUDIT_FILE)
    }

    /// Bytes of the shared state this store wrote (each part's name and
    /// contents), since it was opened.
    pub fn bytes_written(&self) -> u64 {
        self.written.load(SeqCst)
    }

    /// Reads the shared state (its parts, or the `state.json` an earlier
    /// govd wrote) and the agent journal over the agents a `state.json`
    /// older still holds; nothing stored is an empty state. Such older
    /// agents are written to a new journal at once.
    pub fn load(&self) -> Result<Persisted, Error> {
        let (state, stored) = self.read()?;
        *self.stored() = stored;
        Ok(state)
    }

    /// The state, and what the directory holds of it.
    fn read(&self) -> Result<(Persisted, parts::Stored), Error> {
        let path = self.state_path();
        let (mut state, stored) = match fs::read(&path) {
            Ok(bytes) => (
                legacy::decode(&bytes, &path.display().to_string())?,
                parts::Stored::unknown(files::part_names(&self.dir)?, true),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let place = |name: &str| self.dir.join(name).display().to_string();
                parts::assemble(files::read_parts(&self.dir)?, &place)?
            }
            Err(source) => return Err(StateIo::new("read", &path, source).into()),
        };
        self.load_agents(&mut state)?;
        Ok((state, stored))
    }

    fn stored(&self) -> std::sync::MutexGuard<'_, parts::Stored> {
        self.stored
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes `state` (without the agents: they are kept in the journal,
    /// [`DirStore::write_agents`]): the parts that changed since the last
    /// read or write.
    pub fn save(&self, state: &Persisted) -> Result<(), Error> {
        let mut stored = self.stored();
        let plan = parts::plan(&stored, state)?;
        if plan.is_empty() && !stored.legacy {
            return Ok(());
        }
        let legacy = stored.legacy.then(|| self.state_path());
        match files::write(&self.dir, &plan.ops, plan.first, legacy.as_deref()) {
            Ok(left) => {
                self.written.fetch_add(plan.bytes(), SeqCst);
                *stored = plan.stored;
                stored.left(left);
                Ok(())
            }
            Err(error) => {
                stored.forget(&plan.ops);
                Err(error)
            }
        }
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

    /// Reads the state with its revision (this process's write count), and
    /// converts a `state.json` an earlier govd wrote into parts (removed
    /// once every part is written: a crash before leaves it to convert
    /// again).
    pub fn load_now(&self) -> Result<Loaded, Error> {
        let (state, stored) = self.read()?;
        let legacy = stored.legacy;
        *self.stored() = stored;
        if legacy {
            self.save(&state)?;
            tracing::info!(dir = %self.dir.display(), "converted the state.json of an earlier govd to one file per part");
        }
        Ok(Loaded {
            state,
            revision: self.revision.load(SeqCst),
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
        Box::pin(async move {
            let found = self.revision.load(SeqCst);
            if found != expected {
                return Err(Error::Conflict {
                    store: self.describe(),
                    expected,
                    found,
                });
            }
            // Only what changed is encoded and written; the state itself
            // is not copied.
            let plan = parts::plan(&self.stored(), state)?;
            let legacy = self.stored().legacy.then(|| self.state_path());
            if !plan.is_empty() || legacy.is_some() {
                let dir = self.dir.clone();
                let (ops, first) = (plan.ops.clone(), plan.first);
                let written = tokio::task::spawn_blocking(move || {
                    files::write(&dir, &ops, first, legacy.as_deref())
                })
                .await
                .map_err(|e| blocking_failed("write", &self.dir, e))
                .and_then(|r| r);
                let mut stored = self.stored();
                match written {
                    Ok(left) => {
                        self.written.fetch_add(plan.bytes(), SeqCst);
                        *stored = plan.stored;
                        stored.left(left);
                    }
                    Err(error) => {
                        stored.forget(&plan.ops);
                        return Err(error);
                    }
                }
            }
            Ok(self.revision.fetch_add(1, SeqCst) + 1)
        })
    }

    fn append_agents<'a>(
        &'a self,
        changes: &'a AgentChanges,
        all: &dyn Fn() -> Vec<KnownAgent>,
    ) -> Option<StoreFuture<'a, ()>> {
        let lines = self.journal_lines.load(SeqCst);
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
            let dir = self.handle();
            tokio::task::spawn_blocking(move || dir.audit(&entry))
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
    /// This directory for a blocking task: its revision as now, its
    /// journal's line count and its parts shared.
    fn handle(&self) -> Self {
        Self {
            dir: self.dir.clone(),
            revision: AtomicI64::new(self.revision.load(SeqCst)),
            journal_lines: self.journal_lines.clone(),
            stored: self.stored.clone(),
            written: self.written.clone(),
        }
    }
}

/// A blocking task of the directory store panicked or was cancelled.
fn blocking_failed(op: &'static str, dir: &Path, e: tokio::task::JoinError) -> Error {
    Error::Io(StateIo::new(op, dir, std::io::Error::other(e)))
}

impl DirStore {
    pub fn agents_path(&self) -> PathBuf {
        self.dir.join(agents::AGENTS_FILE)
    }

    /// Replays the journal over the agents of `state` ([`agents::load`]).
    pub(super) fn load_agents(&self, state: &mut Persisted) -> Result<(), Error> {
        agents::load(&self.agents_path(), &self.journal_lines, &mut state.agents)
    }

    /// Writes `changes` to the agent journal (`agents::write`).
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
    use crate::latch::{Latch, LatchKind};

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
        state.latches.push(Latch {
            kind: LatchKind::Limit,
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
        let written = store.bytes_written();
        store.save(&state).unwrap();
        assert_eq!(
            store.bytes_written(),
            written,
            "nothing changed: nothing written"
        );
        let back = store.load().unwrap();
        assert_eq!(back.latches, state.latches);
        // One file for the one latch; no temp file is left behind.
        let names: Vec<String> = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(
            names[0].starts_with("latch-") && names[0].ends_with(".json"),
            "{names:?}"
        );
    }

    #[test]
    fn corrupt_state_is_an_error_not_an_empty_state() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::open(dir.path()).unwrap();
        fs::write(store.state_path(), b"{not json").unwrap();
        let err = store.load().unwrap_err();
        assert!(err.to_string().contains("state.json"), "{err}");
        fs::remove_file(store.state_path()).unwrap();
        fs::write(store.dir().join("policy.json"), b"{not json").unwrap();
        let err = store.load().unwrap_err();
        assert!(err.to_string().contains("policy.json"), "{err}");
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
        let newest = entry(49);
        let state = Persisted {
            history: (0..50).map(entry).collect(),
            applied: Some(AppliedPolicy {
                version: newest.version,
                who: newest.who,
                at_unix_ms: newest.at_unix_ms,
                sources: newest.sources,
                bundle: Default::default(),
                shadow_since: Default::default(),
            }),
            ..Persisted::default()
        };
        store.save(&state).unwrap();
        let size: u64 = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
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
        // A directory that lost a text is refused, not read as an empty
        // history.
        let text = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with("text-")
            })
            .unwrap();
        fs::remove_file(text).unwrap();
        assert!(matches!(store.load(), Err(Error::MissingText { .. })));
    }

    /// `tests/fixtures/legacy-state/state.json` was written by the govd of
    /// the single-file layout (two applies of a policy; a latch, the release
    /// before it and an agent added in the same shape): it loads, and is
    /// converted to parts at once, `state.json` removed.
    #[test]
    fn a_state_json_of_an_earlier_govd_loads_and_is_converted_to_parts() {
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/legacy-state/state.json");
        let dir = tempfile::tempdir().unwrap();
        fs::copy(&fixture, dir.path().join("state.json")).unwrap();
        let store = DirStore::open(dir.path()).unwrap();
        let before = store.load_now().unwrap().state;
        let policy = before.applied.clone().unwrap();
        assert_eq!(policy.version, "0132180f030b77d8");
        assert_eq!(before.history.len(), 2);
        assert_eq!(before.history[1].sources, policy.sources);
        assert_eq!(before.latches.len(), 1);
        assert_eq!(before.releases.len(), 1);
        assert_eq!(before.agents.len(), 1);
        assert!(!store.state_path().exists(), "converted");
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .map(|n| n.split('-').next().unwrap().to_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "agents.jsonl",
                "config",
                "history",
                "history",
                "latch",
                "policy.json",
                "release",
                "services",
                "text",
                "text"
            ]
        );
        let after = DirStore::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(after.applied.unwrap().bundle, policy.bundle);
        assert_eq!(after.history.len(), 2);
        for (a, b) in after.history.iter().zip(&before.history) {
            assert_eq!((&a.version, &a.sources), (&b.version, &b.sources));
        }
        assert_eq!(after.latches, before.latches);
        assert_eq!(after.releases, before.releases);
        assert_eq!(after.agents, before.agents);
    }

    /// `tests/fixtures/parts-state/` was written by the govd of the layout
    /// before services' configs had parts of their own (the legacy fixture
    /// converted at its start): `policy.json` holds the whole bundle. It
    /// loads as it is, and the next apply writes the config parts.
    #[test]
    fn a_state_directory_before_config_parts_loads_and_the_next_apply_splits_it() {
        let dir = fixture_copy("parts-state");
        let store = DirStore::open(dir.path()).unwrap();
        let mut state = store.load_now().unwrap().state;
        assert_eq!(store.bytes_written(), 0, "read as it is");
        let policy = state.applied.clone().unwrap();
        assert_eq!(policy.version, "0132180f030b77d8");
        let services: Vec<&str> = policy
            .bundle
            .targets
            .iter()
            .map(|t| t.service.as_str())
            .collect();
        assert_eq!(services, ["fixture_order"]);
        assert!(!policy.bundle.targets[0].rules.is_empty());
        assert_eq!(state.history.len(), 2);
        assert_eq!(state.history[1].sources, policy.sources);
        assert_eq!(
            (
                state.latches.len(),
                state.releases.len(),
                state.agents.len()
            ),
            (1, 1, 1)
        );
        let mut next = policy.clone();
        next.who = "bob".into();
        next.at_unix_ms += 1;
        state.applied = Some(next);
        store.save(&state).unwrap();
        let configs = fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_str().unwrap().starts_with("config-")
            })
            .count();
        assert_eq!(configs, 1);
        let policy_part = fs::read_to_string(dir.path().join("policy.json")).unwrap();
        assert!(!policy_part.contains("\"bundle\""), "{policy_part}");
        let back = DirStore::open(dir.path()).unwrap().load().unwrap();
        let back_policy = back.applied.unwrap();
        assert_eq!(back_policy.who, "bob");
        assert_eq!(back_policy.bundle, policy.bundle);
        assert_eq!(back.history.len(), 2);
        assert_eq!(back.latches, state.latches);
    }

    /// A copy of the state directory `tests/fixtures/NAME`, to load and write.
    fn fixture_copy(name: &str) -> tempfile::TempDir {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let dir = tempfile::tempdir().unwrap();
        for e in fs::read_dir(&fixture).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
        }
        dir
    }

    /// The names of the files of `dir`, each up to its first `-`.
    fn kinds(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .map(|n| n.split('-').next().unwrap().to_owned())
            .collect();
        names.sort();
        names
    }

    /// `tests/fixtures/targets-state/` was written by the govd of the
    /// layout before this one (the parts-state fixture, applied again with
    /// a second service): `policy.json` lists every service's config by
    /// content address (`target-HEX.json`). It loads as it is; the next
    /// write writes the services' list and a config part each, and removes
    /// the `target-` parts once `policy.json` no longer names them.
    #[test]
    fn a_state_directory_with_listed_config_addresses_loads_and_the_next_write_converts_it() {
        let dir = fixture_copy("targets-state");
        let store = DirStore::open(dir.path()).unwrap();
        let state = store.load_now().unwrap().state;
        assert_eq!(store.bytes_written(), 0, "read as it is");
        let policy = state.applied.clone().unwrap();
        assert_eq!(
            (policy.version.as_str(), policy.who.as_str()),
            ("0132180f030b77d8", "bob")
        );
        let services: Vec<&str> = policy
            .bundle
            .targets
            .iter()
            .map(|t| t.service.as_str())
            .collect();
        assert_eq!(services, ["fixture_order", "fixture_pay"]);
        assert!(policy.bundle.targets.iter().all(|t| !t.rules.is_empty()));
        assert_eq!(state.history.len(), 2);
        assert_eq!(
            (
                state.latches.len(),
                state.releases.len(),
                state.agents.len()
            ),
            (1, 1, 1)
        );
        // Any write converts it (here the latch's end).
        let mut next = state.clone();
        next.latches.clear();
        store.save(&next).unwrap();
        assert_eq!(
            kinds(dir.path()),
            [
                "agents.jsonl",
                "config",
                "config",
                "history",
                "history",
                "policy.json",
                "release",
                "services",
                "text",
                "text"
            ]
        );
        let policy_part = fs::read_to_string(dir.path().join("policy.json")).unwrap();
        let value: serde_json::Value = serde_json::from_str(&policy_part).unwrap();
        assert!(value["targets"].is_object(), "{policy_part}");
        let back = DirStore::open(dir.path()).unwrap().load().unwrap();
        let back_policy = back.applied.unwrap();
        assert_eq!(back_policy.bundle, policy.bundle);
        assert_eq!(back_policy.sources, policy.sources);
        assert_eq!(back.history.len(), 2);
        assert!(back.latches.is_empty());
        assert_eq!(back.releases, state.releases);
        assert_eq!(back.agents, state.agents);
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
