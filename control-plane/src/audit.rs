//! The audit log a page at a time (`Audit`, `govc audit`): the newest
//! records that match, bounded in count and in bytes, with a cursor (a
//! record's position in the log) to page back. The log is read line by
//! line, so a long log costs time, never memory.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::path::Path;

use crate::error::{Error, StateIo};
use serde::{Deserialize, Serialize};

/// One line of `audit.jsonl`.
///
/// An operator's action is two records: its intent (`apply-intended`,
/// `release-intended`), written before anything takes effect, then its
/// outcome (`apply` or `apply-refused`, `release` or `release-refused`),
/// written once the outcome is stored, both with the same `intent`. An
/// outcome that could not be written (govd stopped between the two) is
/// written later from what the state says (`crate::control_plane`'s
/// reconciliation), so no record says something happened that did not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at_unix_ms: u64,
    pub who: String,
    /// `apply-intended`, `apply`, `apply-refused`, `release-intended`,
    /// `release`, `release-refused`; for latches reported by agents:
    /// `trip`, `untrip`, `latch-not-enforced`.
    pub action: String,
    /// An intent and its outcome: the same id (unique per intent). Empty:
    /// a record that stands alone.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub intent: String,
    /// Apply: the new bundle version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Release: `fuse` or `limit`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Release: `service/rule`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rule: String,
    /// Limits keyed by consumer or called service: the latch's key. Empty:
    /// the rule's own counter, or every key (a release of all).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// Apply: the services changed; release: the instances notified.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// A new intent id: unique across replicas and restarts (time, then 64
/// random bits).
pub fn new_intent() -> String {
    format!(
        "{:x}-{:016x}",
        crate::convert::now_unix_ms(),
        rand::random::<u64>()
    )
}

/// The outcome action of an intent's action (`apply-intended` -> `apply`);
/// `None` when `action` is no intent.
pub fn intended(action: &str) -> Option<&str> {
    action.strip_suffix("-intended")
}

/// Most records one page holds.
pub const MAX_RECORDS: usize = 10_000;
/// About the most bytes of records one page holds (as JSON lines; the wire
/// form is smaller). A page always holds at least one record.
pub const MAX_PAGE_BYTES: usize = 1 << 20;

/// Which records a page is of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Query {
    /// Only records at or after this time.
    pub since_unix_ms: u64,
    /// Only records before this position (0: up to the newest).
    pub before_seq: u64,
    /// At most this many (0 or above [`MAX_RECORDS`]: [`MAX_RECORDS`]).
    pub limit: usize,
}

/// The newest records matching a [`Query`], oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    /// Each with its position in the log (1 for the first line).
    pub records: Vec<(u64, AuditEntry)>,
    /// Older matching records that did not fit.
    pub left_out: u64,
    /// With `left_out`: the `before_seq` of the next older page.
    pub next_before_seq: u64,
}

/// One page of the audit log at `path` (a missing log is empty; unreadable
/// lines are skipped but keep their position).
pub fn page(path: &Path, query: &Query) -> Result<Page, Error> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Page::default()),
        Err(source) => return Err(StateIo::new("read", path, source).into()),
    };
    page_of(
        BufReader::new(file)
            .split(b'\n')
            .map(|line| line.map_err(|source| StateIo::new("read", path, source).into())),
        query,
    )
}

/// One page of a log given as its JSON records, oldest first (position 1
/// for the first); a record that does not parse is skipped but keeps its
/// position.
pub fn page_of(
    lines: impl Iterator<Item = Result<Vec<u8>, Error>>,
    query: &Query,
) -> Result<Page, Error> {
    let limit = match query.limit {
        0 => MAX_RECORDS,
        n => n.min(MAX_RECORDS),
    };
    let mut window: VecDeque<(u64, AuditEntry, usize)> = VecDeque::new();
    let (mut bytes, mut matched) = (0usize, 0u64);
    for (seq, line) in (1u64..).zip(lines) {
        if query.before_seq != 0 && seq >= query.before_seq {
            break;
        }
        let line = line?;
        let Ok(entry) = serde_json::from_slice::<AuditEntry>(&line) else {
            continue;
        };
        if entry.at_unix_ms < query.since_unix_ms {
            continue;
        }
        matched += 1;
        bytes += line.len();
        window.push_back((seq, entry, line.len()));
        while window.len() > limit || (bytes > MAX_PAGE_BYTES && window.len() > 1) {
            if let Some((_, _, n)) = window.pop_front() {
                bytes -= n;
            }
        }
    }
    let left_out = matched - window.len() as u64;
    Ok(Page {
        next_before_seq: if left_out > 0 {
            window.front().map_or(0, |(seq, _, _)| *seq)
        } else {
            0
        },
        left_out,
        records: window.into_iter().map(|(seq, e, _)| (seq, e)).collect(),
    })
}

/// A page of the audit log on the wire.
impl Page {
    pub fn to_wire(self) -> gov_proto::v1::AuditResult {
        gov_proto::v1::AuditResult {
            records: self
                .records
                .into_iter()
                .map(|(seq, e)| gov_proto::v1::AuditRecord {
                    at_unix_ms: e.at_unix_ms,
                    who: e.who,
                    action: e.action,
                    intent: e.intent,
                    version: e.version,
                    kind: e.kind,
                    rule: e.rule,
                    key: e.key,
                    targets: e.targets,
                    detail: e.detail,
                    seq,
                })
                .collect(),
            left_out: self.left_out,
            next_before_seq: self.next_before_seq,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DirStore as Store;

    fn entry(at: u64, detail: String) -> AuditEntry {
        AuditEntry {
            at_unix_ms: at,
            who: "alice".into(),
            action: "apply".into(),
            intent: String::new(),
            version: String::new(),
            kind: String::new(),
            rule: String::new(),
            key: String::new(),
            targets: Vec::new(),
            detail,
        }
    }

    fn seqs(page: &Page) -> Vec<u64> {
        page.records.iter().map(|(s, _)| *s).collect()
    }

    #[test]
    fn pages_walk_back_over_the_whole_log_without_gaps_or_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(
            page(&store.audit_path(), &Query::default()).unwrap(),
            Page::default()
        );
        for at in 1..=25 {
            store.audit(&entry(at, String::new())).unwrap();
        }
        // A line that is not a record keeps its position.
        std::fs::OpenOptions::new()
            .append(true)
            .open(store.audit_path())
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"{torn\n"))
            .unwrap();
        store.audit(&entry(26, String::new())).unwrap();

        let mut query = Query {
            since_unix_ms: 3,
            limit: 10,
            before_seq: 0,
        };
        let mut seen = Vec::new();
        loop {
            let p = page(&store.audit_path(), &query).unwrap();
            assert!(p.records.len() <= 10);
            seen.splice(0..0, seqs(&p));
            if p.left_out == 0 {
                assert_eq!(p.next_before_seq, 0);
                break;
            }
            assert_eq!(p.next_before_seq, p.records[0].0);
            query.before_seq = p.next_before_seq;
        }
        let want: Vec<u64> = (3..=25).chain([27]).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn a_page_stays_under_the_byte_bound_but_holds_at_least_one_record() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let big = "x".repeat(MAX_PAGE_BYTES / 3);
        for at in 1..=5 {
            store.audit(&entry(at, big.clone())).unwrap();
        }
        let p = page(&store.audit_path(), &Query::default()).unwrap();
        assert_eq!(seqs(&p), [4, 5]);
        assert_eq!((p.left_out, p.next_before_seq), (3, 4));
        store
            .audit(&entry(6, "y".repeat(2 * MAX_PAGE_BYTES)))
            .unwrap();
        let p = page(&store.audit_path(), &Query::default()).unwrap();
        assert_eq!(seqs(&p), [6], "one record even if it alone is larger");
    }
}
