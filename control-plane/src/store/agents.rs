//! The agent registry in the state directory: `agents.jsonl`, a journal of
//! agent records apart from `state.json`. A write appends the records that
//! changed since the last one (an ACK costs its own agent's line, not a
//! rewrite of every agent and of the policy), fsynced; once the journal
//! holds more than twice the lines it needs, it is rewritten whole
//! (atomically, as `state.json`), so its size stays linear in the agents
//! and the cost per change constant on average. Loading replays it in
//! order over the agents an older `state.json` held.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;

use serde::{Deserialize, Serialize};

use super::atomic::write_atomic;
use crate::error::{Error, StateIo};

/// An agent the control plane has seen, shown as DISCONNECTED after a
/// restart until it reconnects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownAgent {
    pub service: String,
    pub instance: String,
    pub address: String,
    pub last_good_version: String,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// The identity that holds its name (`""`: written before identities
    /// were kept; the next agent to connect under the name takes it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
}

pub(super) const AGENTS_FILE: &str = "agents.jsonl";

/// Lines of slack before the journal is rewritten whole.
const SLACK_LINES: usize = 64;

/// What changed in the agent registry since its last write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentChanges {
    /// The records of agents that changed, as they are now.
    pub changed: Vec<KnownAgent>,
    /// Agents forgotten: `(service, instance)`.
    pub gone: Vec<(String, String)>,
    /// How many agents are known now.
    pub live: usize,
}

impl AgentChanges {
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.gone.is_empty()
    }

    /// Lines an append of these writes.
    pub(super) fn lines(&self) -> usize {
        self.changed.len() + self.gone.len()
    }
}

/// One line of the journal.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Record {
    Agent(KnownAgent),
    Gone { service: String, instance: String },
}

/// Whether a journal of `lines` lines, after `changes`, is due a rewrite.
pub(super) fn due_rewrite(lines: usize, changes: &AgentChanges) -> bool {
    lines.saturating_add(changes.lines()) > changes.live.saturating_mul(2) + SLACK_LINES
}

/// Replays the journal at `path` over `agents`. Returns its line count,
/// and whether its last line was cut short (a crash while appending,
/// before the write was confirmed: skipped, and the journal must be
/// rewritten before anything is appended to it); `None` when there is no
/// journal. Any other unreadable line is an error: the registry holds who
/// may use each instance name, and is not read half.
pub(super) fn replay(
    path: &Path,
    agents: &mut Vec<KnownAgent>,
) -> Result<Option<(usize, bool)>, Error> {
    let text = match fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StateIo::new("read", path, source).into()),
    };
    let mut by_key: std::collections::BTreeMap<(String, String), KnownAgent> = agents
        .drain(..)
        .map(|a| ((a.service.clone(), a.instance.clone()), a))
        .collect();
    let complete = text.ends_with(b"\n");
    let lines: Vec<&[u8]> = text
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_slice::<Record>(line) {
            Ok(Record::Agent(a)) => {
                by_key.insert((a.service.clone(), a.instance.clone()), a);
            }
            Ok(Record::Gone { service, instance }) => {
                by_key.remove(&(service, instance));
            }
            Err(_) if i + 1 == lines.len() && !complete => {}
            Err(source) => {
                return Err(Error::CorruptState {
                    path: format!("{} (line {})", path.display(), i + 1),
                    source,
                });
            }
        }
    }
    agents.extend(by_key.into_values());
    // A journal that does not end with a whole line is rewritten before
    // anything is appended to it.
    let torn = !complete && !lines.is_empty();
    Ok(Some((lines.len(), torn)))
}

fn line(record: &Record, out: &mut Vec<u8>) -> Result<(), Error> {
    serde_json::to_writer(&mut *out, record).map_err(Error::Encode)?;
    out.push(b'\n');
    Ok(())
}

/// Appends `changes` to the journal at `path` and syncs it. On an error
/// the journal may end in part of a line: the caller rewrites it whole
/// next time.
pub(super) fn append(path: &Path, changes: &AgentChanges) -> Result<(), Error> {
    let mut bytes = Vec::new();
    for a in &changes.changed {
        line(&Record::Agent(a.clone()), &mut bytes)?;
    }
    for (service, instance) in &changes.gone {
        let gone = Record::Gone {
            service: service.clone(),
            instance: instance.clone(),
        };
        line(&gone, &mut bytes)?;
    }
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| StateIo::new("open", path, source))?;
    file.write_all(&bytes)
        .map_err(|source| StateIo::new("write", path, source))?;
    file.sync_data()
        .map_err(|source| StateIo::new("sync", path, source))?;
    Ok(())
}

/// Replaces the journal at `path` with one line per agent of `all`.
pub(super) fn rewrite(path: &Path, all: &[KnownAgent]) -> Result<(), Error> {
    let mut bytes = Vec::new();
    for a in all {
        line(&Record::Agent(a.clone()), &mut bytes)?;
    }
    write_atomic(path, &bytes)
}

/// Replays the journal at `path` over `agents` (those of a `state.json`
/// written before the journal, which are written to a new journal at once,
/// so that the next `state.json`, which holds none, loses none), and sets
/// `lines` to the journal's length (`usize::MAX`: rewrite it next).
pub(super) fn load(
    path: &Path,
    lines: &AtomicUsize,
    agents: &mut Vec<KnownAgent>,
) -> Result<(), Error> {
    match replay(path, agents)? {
        Some((n, torn)) => lines.store(if torn { usize::MAX } else { n }, SeqCst),
        None if agents.is_empty() => lines.store(0, SeqCst),
        None => {
            rewrite(path, agents)?;
            lines.store(agents.len(), SeqCst);
        }
    }
    Ok(())
}

/// Writes `changes` to the journal at `path`: appended, or, with `all`
/// (every record), a rewrite of the whole journal; `lines` follows its
/// length. A failed append makes the next write a rewrite.
pub(super) fn write(
    path: &Path,
    lines: &AtomicUsize,
    changes: &AgentChanges,
    all: Option<&[KnownAgent]>,
) -> Result<(), Error> {
    let written = match all {
        Some(all) => rewrite(path, all).map(|()| all.len()),
        None => append(path, changes).map(|()| lines.load(SeqCst).saturating_add(changes.lines())),
    };
    lines.store(*written.as_ref().unwrap_or(&usize::MAX), SeqCst);
    written.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::super::{DirStore, Persisted};
    use super::*;

    fn agent(instance: &str, version: &str) -> KnownAgent {
        KnownAgent {
            service: "order".into(),
            instance: instance.into(),
            address: format!("10.0.0.1:{}", instance.len()),
            last_good_version: version.into(),
            labels: [("zone".to_string(), "a".to_string())].into(),
            identity: format!("token `{instance}`"),
        }
    }

    fn changes(changed: Vec<KnownAgent>, gone: &[&str], live: usize) -> AgentChanges {
        AgentChanges {
            changed,
            gone: gone
                .iter()
                .map(|i| ("order".to_string(), (*i).to_string()))
                .collect(),
            live,
        }
    }

    fn lines(store: &DirStore) -> usize {
        fs::read_to_string(store.agents_path())
            .unwrap()
            .lines()
            .count()
    }

    /// An ACK writes its own agent's line: the journal grows by the
    /// changes, `state.json` holds no agent, and a restart reads every
    /// agent back as last written (forgotten ones gone).
    #[test]
    fn a_change_appends_its_own_records_and_a_restart_replays_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::open(dir.path()).unwrap();
        store.load().unwrap();
        let all: Vec<KnownAgent> = (0..100).map(|i| agent(&format!("i{i}"), "v1")).collect();
        store
            .write_agents(&changes(all.clone(), &[], 100), Some(&all))
            .unwrap();
        store
            .write_agents(&changes(vec![agent("i7", "v2")], &[], 100), None)
            .unwrap();
        store
            .write_agents(&changes(Vec::new(), &["i9"], 99), None)
            .unwrap();
        assert_eq!(
            lines(&store),
            102,
            "one line per change after the first write"
        );
        store
            .save(&Persisted {
                agents: all,
                ..Persisted::default()
            })
            .unwrap();
        for file in fs::read_dir(dir.path()).unwrap() {
            let file = file.unwrap().path();
            if file != store.agents_path() {
                let text = fs::read_to_string(&file).unwrap();
                assert!(!text.contains("i7"), "{} holds an agent", file.display());
            }
        }

        let back = DirStore::open(dir.path()).unwrap().load().unwrap().agents;
        assert_eq!(back.len(), 99);
        let i7 = back.iter().find(|a| a.instance == "i7").unwrap();
        assert_eq!(i7, &agent("i7", "v2"));
        assert!(back.iter().all(|a| a.instance != "i9"));
    }

    /// The journal stays linear in the agents: once it is more than twice
    /// as long as it needs to be, the next write rewrites it whole.
    #[test]
    fn a_long_journal_is_rewritten_whole() {
        let live = 10;
        let mut lines_now = live;
        let mut rewrites = 0;
        for _ in 0..1_000 {
            let c = changes(vec![agent("a", "v")], &[], live);
            if due_rewrite(lines_now, &c) {
                rewrites += 1;
                lines_now = live;
            } else {
                lines_now += 1;
            }
            assert!(lines_now <= 2 * live + SLACK_LINES);
        }
        assert!((10..=20).contains(&rewrites), "{rewrites}");
    }

    /// A crash while appending leaves part of a line: it is skipped (its
    /// write was never confirmed) and the next write rewrites the journal
    /// instead of appending after it. A bad line elsewhere is an error.
    #[test]
    fn a_torn_last_line_is_skipped_and_a_bad_line_before_it_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::open(dir.path()).unwrap();
        store.load().unwrap();
        let two = vec![agent("a", "v1"), agent("b", "v1")];
        store
            .write_agents(&changes(two.clone(), &[], 2), Some(&two))
            .unwrap();
        let mut file = OpenOptions::new()
            .append(true)
            .open(store.agents_path())
            .unwrap();
        file.write_all(br#"{"agent":{"service":"order","inst"#)
            .unwrap();
        drop(file);

        let store = DirStore::open(dir.path()).unwrap();
        assert_eq!(store.load().unwrap().agents, two);
        let c = changes(vec![agent("c", "v1")], &[], 3);
        assert!(due_rewrite(
            store
                .journal_lines
                .load(std::sync::atomic::Ordering::SeqCst),
            &c
        ));
        let three = vec![agent("a", "v1"), agent("b", "v1"), agent("c", "v1")];
        store.write_agents(&c, Some(&three)).unwrap();
        assert_eq!(
            DirStore::open(dir.path()).unwrap().load().unwrap().agents,
            three
        );

        let text = fs::read_to_string(store.agents_path()).unwrap();
        fs::write(store.agents_path(), text.replacen("{", "{x", 1)).unwrap();
        let error = DirStore::open(dir.path()).unwrap().load().unwrap_err();
        assert!(error.to_string().contains("agents.jsonl"), "{error}");
    }

    /// A state directory written before the journal keeps its agents in
    /// `state.json`: the load writes them to a journal at once, so the
    /// next `state.json` (which holds none) loses none.
    #[test]
    fn agents_of_an_older_state_file_move_to_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::open(dir.path()).unwrap();
        let old = Persisted {
            agents: vec![agent("a", "v1")],
            ..Persisted::default()
        };
        write_atomic(
            &store.state_path(),
            &super::super::legacy::encode(&old).unwrap(),
        )
        .unwrap();
        assert_eq!(store.load().unwrap().agents, old.agents);
        store.save(&Persisted::default()).unwrap();
        let back = DirStore::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(back.agents, old.agents);
    }
}
