//! The shared state as parts, each its own file (the state directory) or
//! key (etcd), so that a write writes only what changed: a new latch its part,
//! a release its release (and removes the latches it ends), an apply the
//! policy, its history entry and the source texts not stored yet.
//!
//! | part | holds |
//! |---|---|
//! | `policy.json` | the policy in force: version, who, when, its sources by content address, the compiled bundle's version, its services' list and the number and id of the write that put it |
//! | `config-KEY-SEQ-WRITE.json` | one service's compiled config (`targets.rs`): written by the applies that change it, removed when a newer one replaces it |
//! | `services-HEX.json` | the services' names, in the bundle's order, by the sha256 of its contents (`targets.rs`) |
//! | `history-UNIXMS-VERSION.json` | one applied version: who, when, the services it changed, its sources by content address |
//! | `text-HEX.json` | one distinct source text (a JSON string), by the sha256 of its text; written once, removed with the last entry that names it |
//! | `latch-ID.json` | one tripped fuse or engaged limit (`ID`: a hash of its kind, rule and key) |
//! | `release-ID.json` | the last release of one rule (or of one key of a limit) |
//! | `canary.json` | a canary apply running |
//!
//! A write is a [`Plan`]: its puts in the order that keeps every prefix of
//! them loadable (texts, services' configs, history entries, releases,
//! latches, the canary, then the policy, the commit point of an apply),
//! then its removals; the removals of config parts the policy in force does
//! not commit come first (`targets.rs`). A `policy.json` of the layouts
//! before (the whole bundle inline, then the configs' content addresses
//! listed, 35 bytes a service) is read as it is, and the next write
//! writes the layout of today.
//! Loading repairs what a write cut short leaves: history entries after the
//! one of the policy in force (an apply that never reached its commit point)
//! and latches a release covers (a release whose removals did not run) are
//! not taken in, and the next write removes them.

use std::collections::{BTreeMap, BTreeSet};

use gov_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use super::model::{
    AppliedPolicy, HistoryEntry, Persisted, Source, SourceRef, StoredCanary, content_address,
};
use super::targets::{self, CONFIG, Committed, SERVICES, TARGET, TargetsIn};
use crate::error::Error;
use crate::latch::{Latch, LatchKind, Released};

pub const POLICY: &str = "policy.json";
pub const CANARY: &str = "canary.json";
const HISTORY: &str = "history-";
const TEXT: &str = "text-";
const LATCH: &str = "latch-";
const RELEASE: &str = "release-";
const JSON: &str = ".json";

/// Whether `name` is a part's name (a file of the state directory or a key
/// under etcd's `PREFIX/state/`).
pub fn is_part(name: &str) -> bool {
    name == POLICY
        || name == CANARY
        || ([HISTORY, TEXT, TARGET, CONFIG, SERVICES, LATCH, RELEASE]
            .iter()
            .any(|p| name.starts_with(p))
            && name.ends_with(JSON))
}

/// One write of a part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Put(String, Vec<u8>),
    Delete(String),
}

impl Op {
    pub fn name(&self) -> &str {
        match self {
            Op::Put(name, _) | Op::Delete(name) => name,
        }
    }
}

/// What the store holds, part by part, as it was last read or written:
/// what the next write is compared with.
#[derive(Clone, Debug, Default)]
pub struct Stored {
    /// The parts' contents are unknown (never read, or read from the legacy
    /// layout): the next write puts every part and removes the others.
    full: bool,
    /// Read from the legacy layout (`legacy.rs`): the next write removes it.
    pub legacy: bool,
    policy: Option<(String, String, u64)>,
    /// The text parts the policy names.
    policy_texts: Vec<String>,
    /// The configs of the policy in force (`None`: unknown, or a layout
    /// before: the next policy write writes every one).
    configs: Option<Committed>,
    /// The config and list parts (`targets.rs`), of any layout.
    bundle_parts: BTreeSet<String>,
    /// History entries: the text parts each names.
    history: BTreeMap<String, Vec<String>>,
    texts: BTreeSet<String>,
    latches: BTreeMap<String, Latch>,
    releases: BTreeMap<String, Released>,
    canary: Option<(String, u64)>,
    /// Parts known by name only (`full`).
    others: BTreeSet<String>,
}

impl Stored {
    /// Parts whose contents are unknown: `names` exist (and are removed by
    /// the next write unless it puts them); `legacy`: the legacy layout holds
    /// the state.
    pub fn unknown(names: impl IntoIterator<Item = String>, legacy: bool) -> Self {
        Stored {
            full: true,
            legacy,
            others: names.into_iter().collect(),
            ..Stored::default()
        }
    }

    /// After a write of `ops` that failed: the parts it put may hold
    /// either value, so the next write puts them again or removes them.
    pub fn forget(&mut self, ops: &[Op]) {
        for op in ops {
            let Op::Put(name, _) = op else { continue };
            self.history.remove(name);
            self.texts.remove(name);
            self.bundle_parts.remove(name);
            self.latches.remove(name);
            self.releases.remove(name);
            if name == POLICY || name.starts_with(CONFIG) || name.starts_with(SERVICES) {
                // Its configs may be in force or not: the next policy
                // write writes every one, above any `SEQ` written.
                self.policy = None;
                self.configs = None;
            }
            if name == CANARY {
                self.canary = None;
            }
            self.others.insert(name.clone());
        }
    }

    /// Parts a write could not remove: the next write removes them.
    pub fn left(&mut self, names: Vec<String>) {
        self.others.extend(names);
    }

    /// Every part it holds but the policy and the canary.
    fn names(&self) -> impl Iterator<Item = &String> {
        self.history
            .keys()
            .chain(&self.texts)
            .chain(&self.bundle_parts)
            .chain(self.latches.keys())
            .chain(self.releases.keys())
            .chain(&self.others)
    }
}

/// The writes that take the store from `base` to `next`, and what it holds
/// then.
#[derive(Debug)]
pub struct Plan {
    pub ops: Vec<Op>,
    /// How many of `ops`, first, are removals that must be made before
    /// its puts (a write that cannot make them fails).
    pub first: usize,
    pub stored: Stored,
}

impl Plan {
    /// Bytes it writes: each put's name and value.
    pub fn bytes(&self) -> u64 {
        self.ops
            .iter()
            .map(|op| match op {
                Op::Put(name, value) => (name.len() + value.len()) as u64,
                Op::Delete(name) => name.len() as u64,
            })
            .sum()
    }

    /// Whether it writes nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// The policy part: the policy with its sources and its services'
/// configs by content address. It has no `bundle`, so that a govd of the
/// layout before refuses it rather than reads an empty bundle.
#[derive(Serialize)]
struct PolicyOut<'a> {
    version: &'a str,
    who: &'a str,
    at_unix_ms: u64,
    sources: Vec<SourceRef>,
    bundle_version: &'a str,
    /// The services' list and the write that put their configs.
    targets: &'a targets::Configs,
    #[serde(skip_serializing_if = "no_shadow")]
    shadow_since: &'a BTreeMap<String, u64>,
}

#[derive(Deserialize)]
struct PolicyIn {
    version: String,
    who: String,
    at_unix_ms: u64,
    sources: Vec<SourceRef>,
    /// The whole bundle inline: the layout before config parts.
    #[serde(default)]
    bundle: Option<pb::Bundle>,
    #[serde(default)]
    bundle_version: String,
    #[serde(default)]
    targets: TargetsIn,
    #[serde(default)]
    shadow_since: BTreeMap<String, u64>,
}

fn no_shadow(m: &&BTreeMap<String, u64>) -> bool {
    m.is_empty()
}

fn json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(value).map_err(Error::Encode)
}

/// `history-UNIXMS-VERSION.json` (the version's characters outside
/// `[A-Za-z0-9._-]` as `_`): sorted by name, oldest first.
fn history_name(entry: &HistoryEntry) -> String {
    let version: String = entry
        .version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{HISTORY}{:013}-{version}{JSON}", entry.at_unix_ms)
}

/// `text-HEX.json` of a `sha256:HEX` address.
fn text_name(address: &str) -> String {
    let hex = address.strip_prefix("sha256:").unwrap_or(address);
    format!("{TEXT}{hex}{JSON}")
}

/// The `sha256:HEX` address of a text part.
fn text_address(name: &str) -> Option<String> {
    let hex = name.strip_prefix(TEXT)?.strip_suffix(JSON)?;
    Some(format!("sha256:{hex}"))
}

/// A latch's or a release's part: `PREFIX-HASH.json`, the hash of its kind,
/// rule and key (a key is a consumer's name: any text).
fn id_name(prefix: &str, kind: LatchKind, rule: &str, key: &str) -> String {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    for part in [kind.as_str(), rule, key] {
        hash.update(part.as_bytes());
        hash.update([0u8]);
    }
    let digest = hash.finalize();
    let mut out = String::with_capacity(prefix.len() + 32 + JSON.len());
    out.push_str(prefix);
    for b in &digest[..16] {
        out.push_str(&format!("{b:02x}"));
    }
    out.push_str(JSON);
    out
}

/// The part of the release of `rule` (its `key`; `""`: every key): the
/// file a release writes first (tests make it fail).
pub fn release_part(kind: LatchKind, rule: &str, key: &str) -> String {
    id_name(RELEASE, kind, rule, key)
}

fn latch_name(t: &Latch) -> String {
    id_name(LATCH, t.kind, &t.rule, &t.key)
}

fn release_name(r: &Released) -> String {
    release_part(r.kind, &r.rule, &r.key)
}

/// Moves `sources` to content addresses: the references, and each text
/// part not in `have` to put (added to `have`).
fn refs(
    sources: &[Source],
    have: &mut BTreeSet<String>,
    puts: &mut Vec<Op>,
) -> Result<(Vec<SourceRef>, Vec<String>), Error> {
    let mut out = Vec::with_capacity(sources.len());
    let mut names = Vec::with_capacity(sources.len());
    for s in sources {
        let address = content_address(&s.text);
        let name = text_name(&address);
        if have.insert(name.clone()) {
            puts.push(Op::Put(name.clone(), json(&s.text)?));
        }
        names.push(name);
        out.push(SourceRef {
            name: s.name.clone(),
            text: address,
        });
    }
    Ok((out, names))
}

/// The writes that take the store from `base` to `next` (see the module doc
/// for their order).
pub fn plan(base: &Stored, next: &Persisted) -> Result<Plan, Error> {
    let known = !base.full;
    let mut stored = Stored::default();
    // Texts the store holds (or this plan puts).
    let mut have: BTreeSet<String> = if known {
        base.texts.clone()
    } else {
        BTreeSet::new()
    };
    let (mut texts, mut history, mut latches, mut releases, mut tail) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut configs = Vec::new();
    for entry in &next.history {
        let name = history_name(entry);
        if let Some(names) = base.history.get(&name).filter(|_| known) {
            stored.history.insert(name, names.clone());
            continue;
        }
        let (source_refs, names) = refs(&entry.sources, &mut have, &mut texts)?;
        let stored_entry = HistoryEntry {
            sources: Vec::new(),
            source_refs,
            ..entry.clone()
        };
        history.push(Op::Put(name.clone(), json(&stored_entry)?));
        stored.history.insert(name, names);
    }
    for r in &next.releases {
        let name = release_name(r);
        if !known || base.releases.get(&name) != Some(r) {
            releases.push(Op::Put(name.clone(), json(r)?));
        }
        stored.releases.insert(name, r.clone());
    }
    for t in &next.latches {
        let name = latch_name(t);
        if !known || base.latches.get(&name) != Some(t) {
            latches.push(Op::Put(name.clone(), json(t)?));
        }
        stored.latches.insert(name, t.clone());
    }
    if let Some(c) = &next.canary {
        let id = (c.policy.version.clone(), c.started_unix_ms);
        if !known || base.canary.as_ref() != Some(&id) {
            tail.push(Op::Put(CANARY.to_owned(), json(c)?));
        }
        stored.canary = Some(id);
    }
    let mut policy_texts = Vec::new();
    if let Some(p) = &next.applied {
        let id = (p.version.clone(), p.who.clone(), p.at_unix_ms);
        if known && base.policy.as_ref() == Some(&id) && base.configs.is_some() {
            policy_texts.clone_from(&base.policy_texts);
            stored.configs.clone_from(&base.configs);
        } else {
            let mut puts = Puts {
                have: &mut have,
                texts: &mut texts,
                configs: &mut configs,
            };
            let (names, held) = policy_part(p, base, known, &mut puts, &mut tail)?;
            policy_texts = names;
            stored.configs = Some(held);
        }
        stored.policy = Some(id);
        stored.policy_texts.clone_from(&policy_texts);
    }
    stored.bundle_parts = stored
        .configs
        .iter()
        .flat_map(targets::part_names)
        .cloned()
        .collect();
    // Texts still named by an entry or the policy.
    stored.texts = stored
        .history
        .values()
        .flatten()
        .chain(&policy_texts)
        .cloned()
        .collect();
    let mut ops = texts;
    ops.append(&mut configs);
    ops.append(&mut history);
    ops.append(&mut releases);
    ops.append(&mut latches);
    ops.append(&mut tail);
    let (first, after) = gone(base, &stored, known);
    let first_len = first.len();
    let delete = |n: &String| Op::Delete(n.clone());
    let mut ops: Vec<Op> = first.into_iter().map(delete).chain(ops).collect();
    ops.extend(after.into_iter().map(delete));
    if stored.canary.is_none() && (base.canary.is_some() || base.others.contains(CANARY)) {
        ops.push(Op::Delete(CANARY.to_owned()));
    }
    if stored.policy.is_none() && (base.policy.is_some() || base.others.contains(POLICY)) {
        ops.push(Op::Delete(POLICY.to_owned()));
    }
    Ok(Plan {
        ops,
        first: first_len,
        stored,
    })
}

/// The parts of `base` that `stored` no longer holds, in the order they are
/// removed: those to remove before the plan's puts, and after them.
fn gone<'a>(base: &'a Stored, stored: &Stored, known: bool) -> (Vec<&'a String>, Vec<&'a String>) {
    let keep: BTreeSet<&String> = stored
        .history
        .keys()
        .chain(&stored.texts)
        .chain(&stored.bundle_parts)
        .chain(stored.latches.keys())
        .chain(stored.releases.keys())
        .collect();
    let mut gone: Vec<&String> = base
        .names()
        .filter(|n| !keep.contains(n) && n.as_str() != POLICY && n.as_str() != CANARY)
        .collect();
    gone.sort_by(|a, b| removal_rank(a).cmp(&removal_rank(b)));
    gone.dedup();
    // Config parts the store's policy does not commit go first: once the
    // policy part is written, a later `SEQ` could commit them.
    let held = base.configs.as_ref().filter(|_| known);
    gone.into_iter()
        .partition(|name| targets::remove_first(name, held))
}

/// Where a plan collects what it puts: the text parts the store holds (or
/// the plan puts), the new texts, the new configs.
struct Puts<'a> {
    have: &'a mut BTreeSet<String>,
    texts: &'a mut Vec<Op>,
    configs: &'a mut Vec<Op>,
}

/// The policy part of `p` put into `tail`, its texts and configs not in
/// the store into `puts`: the text parts it names, and the configs the
/// store holds then.
fn policy_part(
    p: &AppliedPolicy,
    base: &Stored,
    known: bool,
    puts: &mut Puts<'_>,
    tail: &mut Vec<Op>,
) -> Result<(Vec<String>, Committed), Error> {
    let (sources, names) = refs(&p.sources, puts.have, puts.texts)?;
    let write = targets::write_id(&p.version, &p.who, p.at_unix_ms);
    let held = base.configs.as_ref().filter(|_| known);
    let mut put = |name, bytes| puts.configs.push(Op::Put(name, bytes));
    let held = targets::plan(&p.bundle, held, next_seq(base), write, &mut put)?;
    let part = PolicyOut {
        version: &p.version,
        who: &p.who,
        at_unix_ms: p.at_unix_ms,
        sources,
        bundle_version: &p.bundle.version,
        targets: &held.configs,
        shadow_since: &p.shadow_since,
    };
    tail.push(Op::Put(POLICY.to_owned(), json(&part)?));
    Ok((names, held))
}

/// The `SEQ` of the next policy write: above every config part the store
/// holds or may hold.
fn next_seq(base: &Stored) -> u64 {
    let seen = base
        .names()
        .filter_map(|n| targets::parse(n).map(|(_, seq, _)| seq));
    let held = base.configs.iter().map(|c| c.configs.seq);
    seen.chain(held).max().unwrap_or(0) + 1
}

/// Removals in this order: latches (a release's), releases, history
/// entries, then texts and configs (no longer named by any).
fn removal_rank(name: &str) -> (u8, &str) {
    let rank = [LATCH, RELEASE, HISTORY, TEXT, TARGET, CONFIG, SERVICES]
        .iter()
        .position(|p| name.starts_with(p))
        .map_or(5, |i| i.min(3));
    (u8::try_from(rank).unwrap_or(5), name)
}

/// The state the parts hold, and what the store holds (for the next
/// [`plan`]); `place` names a part for errors (its file or key).
pub fn assemble(
    parts: Vec<(String, Vec<u8>)>,
    place: &dyn Fn(&str) -> String,
) -> Result<(Persisted, Stored), Error> {
    let corrupt = |name: &str| {
        let path = place(name);
        move |source| Error::CorruptState { path, source }
    };
    let mut stored = Stored::default();
    let mut state = Persisted {
        format: super::legacy::FORMAT,
        ..Persisted::default()
    };
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    let mut bundle_parts: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut entries: BTreeMap<String, HistoryEntry> = BTreeMap::new();
    let mut policy = None;
    for (name, bytes) in parts {
        if let Some(address) = text_address(&name) {
            let text: String = serde_json::from_slice(&bytes).map_err(corrupt(&name))?;
            texts.insert(address, text);
            stored.texts.insert(name);
        } else if [TARGET, CONFIG, SERVICES]
            .iter()
            .any(|p| name.starts_with(p))
        {
            // Read once the policy names it: a config part nothing names is
            // removed by the next write.
            stored.bundle_parts.insert(name.clone());
            bundle_parts.insert(name, bytes);
        } else if name.starts_with(HISTORY) {
            let entry: HistoryEntry = serde_json::from_slice(&bytes).map_err(corrupt(&name))?;
            entries.insert(name, entry);
        } else if name.starts_with(LATCH) {
            let latch: Latch = serde_json::from_slice(&bytes).map_err(corrupt(&name))?;
            stored.latches.insert(name, latch);
        } else if name.starts_with(RELEASE) {
            let r: Released = serde_json::from_slice(&bytes).map_err(corrupt(&name))?;
            stored.releases.insert(name, r);
        } else if name == CANARY {
            let c: StoredCanary = serde_json::from_slice(&bytes).map_err(corrupt(&name))?;
            stored.canary = Some((c.policy.version.clone(), c.started_unix_ms));
            state.canary = Some(c);
        } else if name == POLICY {
            let p: PolicyIn = serde_json::from_slice(&bytes).map_err(corrupt(&name))?;
            stored.policy = Some((p.version.clone(), p.who.clone(), p.at_unix_ms));
            stored.policy_texts = p.sources.iter().map(|r| text_name(&r.text)).collect();
            policy = Some(p);
        }
    }
    let resolve = |name: &str, r: Vec<SourceRef>| -> Result<Vec<Source>, Error> {
        r.into_iter()
            .map(|r| match texts.get(&r.text) {
                Some(text) => Ok(Source {
                    name: r.name,
                    text: text.clone(),
                }),
                None => Err(Error::MissingText {
                    path: place(name),
                    address: r.text,
                }),
            })
            .collect()
    };
    for (name, mut entry) in entries {
        let refs = std::mem::take(&mut entry.source_refs);
        stored.history.insert(
            name.clone(),
            refs.iter().map(|r| text_name(&r.text)).collect(),
        );
        entry.sources = resolve(&name, refs)?;
        state.history.push(entry);
    }
    if let Some(p) = policy {
        let missing = |part: String| Error::MissingConfig {
            path: place(POLICY),
            part,
        };
        let corrupt = |name: &str, e| corrupt(name)(e);
        let (version, parts) = (p.bundle_version, &bundle_parts);
        let bundle = match (p.bundle, p.targets) {
            (None, TargetsIn::Parts(configs)) => {
                let (bundle, held) =
                    targets::assemble(version, configs, parts, &missing, &corrupt)?;
                stored.configs = Some(held);
                bundle
            }
            // The layouts before: rewritten by the next write.
            (Some(bundle), _) => bundle,
            (None, TargetsIn::Ids(ids)) => {
                targets::listed(version, &ids, parts, &missing, &corrupt)?
            }
        };
        state.applied = Some(AppliedPolicy {
            sources: resolve(POLICY, p.sources)?,
            version: p.version,
            who: p.who,
            at_unix_ms: p.at_unix_ms,
            bundle,
            shadow_since: p.shadow_since,
        });
    }
    state.releases = stored.releases.values().cloned().collect();
    state.latches = stored.latches.values().cloned().collect();
    repair(&mut state);
    Ok((state, stored))
}

/// Drops what a write cut short left (see the module doc).
fn repair(state: &mut Persisted) {
    match &state.applied {
        Some(p) => {
            if let Some(i) = state
                .history
                .iter()
                .rposition(|e| e.version == p.version && e.at_unix_ms == p.at_unix_ms)
            {
                state.history.truncate(i + 1);
            }
        }
        None => state.history.clear(),
    }
    let released = |kind: LatchKind, rule: &str, key: &str, since: u64| {
        state.releases.iter().any(|r| {
            r.kind == kind
                && r.rule == rule
                && (r.key.is_empty() || r.key == key)
                && r.at_unix_ms >= since
        })
    };
    let latches = std::mem::take(&mut state.latches);
    state.latches = latches
        .into_iter()
        .filter(|t| !released(t.kind, &t.rule, &t.key, t.since_unix_ms))
        .collect();
    // A promoted canary whose removal did not run: its version is in force.
    if let (Some(c), Some(p)) = (&state.canary, &state.applied)
        && c.policy.version == p.version
        && c.policy.at_unix_ms == p.at_unix_ms
    {
        state.canary = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Disk = BTreeMap<String, Vec<u8>>;

    fn run(disk: &mut Disk, ops: &[Op]) {
        for op in ops {
            match op {
                Op::Put(name, value) => {
                    disk.insert(name.clone(), value.clone());
                }
                Op::Delete(name) => {
                    disk.remove(name);
                }
            }
        }
    }

    fn load(disk: &Disk) -> (Persisted, Stored) {
        let parts = disk.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
        assemble(parts, &|n| n.to_owned()).unwrap()
    }

    fn policy(version: &str, at: u64) -> AppliedPolicy {
        AppliedPolicy {
            version: version.into(),
            who: "alice".into(),
            at_unix_ms: at,
            sources: vec![
                Source {
                    name: "big.gov".into(),
                    text: "# a policy\n".repeat(1_000),
                },
                Source {
                    name: "v.gov".into(),
                    text: format!("# {version}\n"),
                },
            ],
            bundle: pb::Bundle::default(),
            shadow_since: BTreeMap::new(),
        }
    }

    /// `state` once `version` is applied at `at` (history bounded to 1,000).
    fn applied(mut state: Persisted, version: &str, at: u64) -> Persisted {
        let p = policy(version, at);
        state.history.push(HistoryEntry {
            version: version.into(),
            who: p.who.clone(),
            at_unix_ms: at,
            services: vec!["order".into()],
            sources: p.sources.clone(),
            source_refs: Vec::new(),
        });
        if state.history.len() > 1_000 {
            state.history.remove(0);
        }
        state.applied = Some(p);
        state
    }

    fn latch(rule: &str, key: &str, since: u64) -> Latch {
        Latch {
            kind: LatchKind::Limit,
            rule: rule.into(),
            key: key.into(),
            since_unix_ms: since,
            reason: "calls 100 per 1s".into(),
            half_open: false,
            deadline_unix_ms: None,
            instances: ["a".to_owned()].into(),
            not_enforced: BTreeSet::new(),
            reported_by: BTreeMap::new(),
        }
    }

    /// A state with `history` versions applied, written whole, and read back.
    fn stored_with(history: usize) -> (Disk, Persisted, Stored) {
        let mut state = Persisted::default();
        for i in 0..history {
            state = applied(state, &format!("v{i}"), 1_000 + i as u64);
        }
        let first = plan(&Stored::unknown([], false), &state).unwrap();
        let mut disk = Disk::new();
        run(&mut disk, &first.ops);
        let (back, stored) = load(&disk);
        assert_eq!(back.history.len(), history);
        (disk, back, stored)
    }

    #[test]
    fn a_new_latch_writes_its_part_alone_whatever_the_history() {
        let mut sizes = Vec::new();
        for history in [10, 1_000] {
            let (_, mut state, stored) = stored_with(history);
            state.latches.push(latch("order/crm", "alice", 5));
            let p = plan(&stored, &state).unwrap();
            assert_eq!(p.ops.len(), 1, "{:?}", p.ops);
            assert!(matches!(&p.ops[0], Op::Put(n, _) if n.starts_with(LATCH)));
            sizes.push(p.bytes());
            // Nothing changed: nothing written.
            assert!(plan(&p.stored, &state).unwrap().is_empty());
        }
        assert_eq!(sizes[0], sizes[1]);
    }

    #[test]
    fn an_apply_writes_its_policy_its_entry_and_new_texts_and_drops_the_oldest() {
        let (mut disk, state, stored) = stored_with(1_000);
        let next = applied(state, "v1000", 5_000);
        let p = plan(&stored, &next).unwrap();
        let names: Vec<&str> = p.ops.iter().map(Op::name).collect();
        let puts: Vec<&str> = p
            .ops
            .iter()
            .filter(|o| matches!(o, Op::Put(..)))
            .map(Op::name)
            .collect();
        // The new small text, the entry, the policy (last: the commit point).
        assert_eq!(puts.len(), 3, "{names:?}");
        assert!(puts[0].starts_with(TEXT) && puts[1].starts_with(HISTORY));
        assert_eq!(puts[2], POLICY);
        // The oldest entry and its own text go.
        let gone: Vec<&str> = p
            .ops
            .iter()
            .filter(|o| matches!(o, Op::Delete(..)))
            .map(Op::name)
            .collect();
        assert_eq!(gone.len(), 2, "{gone:?}");
        assert!(gone[0].starts_with(HISTORY) && gone[1].starts_with(TEXT));
        run(&mut disk, &p.ops);
        let (back, _) = load(&disk);
        assert_eq!(back.history.len(), 1_000);
        assert_eq!(back.history[999].version, "v1000");
        assert_eq!(
            back.applied.unwrap().sources,
            policy("v1000", 5_000).sources
        );
    }

    #[test]
    fn an_apply_cut_short_before_its_policy_is_not_in_the_history_and_is_removed() {
        let (mut disk, state, stored) = stored_with(3);
        let next = applied(state.clone(), "v3", 9_000);
        let p = plan(&stored, &next).unwrap();
        let commit = p.ops.iter().position(|o| o.name() == POLICY).unwrap();
        run(&mut disk, &p.ops[..commit]);
        let (back, stored) = load(&disk);
        assert_eq!(back.applied.as_ref().unwrap().version, "v2");
        assert_eq!(back.history.len(), 3, "the entry of v3 is not taken in");
        // The next write removes it (and the text only it named).
        let again = plan(&stored, &back).unwrap();
        assert_eq!(again.ops.len(), 2, "{:?}", again.ops);
        assert!(again.ops.iter().all(|o| matches!(o, Op::Delete(_))));
    }

    #[test]
    fn a_release_cut_short_before_its_removals_ends_the_latch_at_load() {
        let (mut disk, mut state, _) = stored_with(1);
        state.latches.push(latch("order/crm", "alice", 5));
        state.latches.push(latch("order/crm", "bob", 7));
        let (_, stored) = {
            let p = plan(&Stored::unknown([], false), &state).unwrap();
            run(&mut disk, &p.ops);
            load(&disk)
        };
        state.latches.retain(|t| t.key != "alice");
        state.releases.push(Released {
            kind: LatchKind::Limit,
            rule: "order/crm".into(),
            key: "alice".into(),
            at_unix_ms: 6,
        });
        let p = plan(&stored, &state).unwrap();
        assert_eq!(p.ops.len(), 2, "{:?}", p.ops);
        assert!(matches!(&p.ops[0], Op::Put(n, _) if n.starts_with(RELEASE)));
        assert!(matches!(&p.ops[1], Op::Delete(n) if n.starts_with(LATCH)));
        run(&mut disk, &p.ops[..1]);
        let (back, _) = load(&disk);
        let keys: Vec<&str> = back.latches.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["bob"]);
        assert_eq!(back.releases, state.releases);
    }

    #[test]
    fn a_failed_write_is_written_again_or_removed() {
        let (_, state, mut stored) = stored_with(1);
        let next = applied(state.clone(), "v1", 9_000);
        let p = plan(&stored, &next).unwrap();
        stored.forget(&p.ops);
        // Given up: what it may have put goes, and the policy in force is
        // put again with its services' list and configs (the failed write
        // may have replaced it; here there are none).
        let back = plan(&stored, &state).unwrap();
        let names: Vec<&str> = back.ops.iter().map(Op::name).collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(matches!(&back.ops[0], Op::Put(n, _) if n.starts_with(SERVICES)));
        assert!(matches!(&back.ops[1], Op::Put(n, _) if n == POLICY));
        assert!(matches!(&back.ops[2], Op::Delete(n) if n.starts_with(HISTORY)));
        assert!(matches!(&back.ops[3], Op::Delete(n) if n.starts_with(TEXT)));
        let again = plan(&stored, &next).unwrap();
        // Tried again: put again, with the services' list (after a failed
        // write, which configs the store holds is not known).
        assert_eq!(again.ops.len(), p.ops.len() + 1);
    }

    #[test]
    fn part_names_hold_any_key() {
        let hostile = latch("order/crm", "../../etc/passwd\0/x", 1);
        let name = latch_name(&hostile);
        assert!(is_part(&name) && !name.contains('/') && !name.contains(".."));
        let entry = HistoryEntry {
            version: "../x y".into(),
            who: String::new(),
            at_unix_ms: 1,
            services: Vec::new(),
            sources: Vec::new(),
            source_refs: Vec::new(),
        };
        assert_eq!(history_name(&entry), "history-0000000000001-.._x_y.json");
    }

    /// A bundle of `n` services, `changed` at `edit` (its consumer header).
    fn bundle(n: usize, edit: usize) -> pb::Bundle {
        pb::Bundle {
            version: format!("b{edit}"),
            targets: (0..n)
                .map(|i| pb::TargetConfig {
                    service: format!("s{i:04}"),
                    version: format!("{i}-{}", if i == 0 { edit } else { 0 }),
                    consumer_header: format!("x-consumer-{}", if i == 0 { edit } else { 0 }),
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn with_bundle(state: Persisted, version: &str, at: u64, bundle: pb::Bundle) -> Persisted {
        let mut next = applied(state, version, at);
        if let Some(p) = next.applied.as_mut() {
            p.bundle = bundle;
        }
        next
    }

    fn puts(p: &Plan) -> Vec<&str> {
        p.ops
            .iter()
            .filter(|o| matches!(o, Op::Put(..)))
            .map(Op::name)
            .collect()
    }

    #[test]
    fn an_apply_that_changes_one_service_writes_the_same_bytes_whatever_the_services() {
        let mut writes = Vec::new();
        for n in [10, 1_000] {
            let (mut disk, state, stored) = stored_with(1);
            let first = with_bundle(state, "v1", 2_000, bundle(n, 1));
            let p = plan(&stored, &first).unwrap();
            let configs = p.ops.iter().filter(|o| o.name().starts_with(CONFIG));
            assert_eq!(configs.count(), n, "the first apply puts every config");
            run(&mut disk, &p.ops);
            let (back, stored) = load(&disk);
            assert_eq!(back.applied.as_ref().unwrap().bundle, bundle(n, 1));
            let next = with_bundle(back, "v2", 3_000, bundle(n, 2));
            let p = plan(&stored, &next).unwrap();
            let names: Vec<&str> = p.ops.iter().map(Op::name).collect();
            let puts = puts(&p);
            // The new small text, the changed service's config, the entry,
            // the policy (last); the set of services is the same, so its
            // list is not written again; the config it replaces goes.
            assert_eq!(puts.len(), 4, "{names:?}");
            assert!(puts[0].starts_with(TEXT) && puts[1].starts_with(CONFIG));
            assert!(puts[2].starts_with(HISTORY) && puts[3] == POLICY);
            assert_eq!(p.first, 0);
            let gone: Vec<&str> = names[4..].to_vec();
            assert!(gone.iter().any(|n| n.starts_with(CONFIG)), "{gone:?}");
            assert!(p.ops[4..].iter().all(|o| matches!(o, Op::Delete(_))));
            writes.push(p.bytes());
            // Cut short before the policy: the old bundle is in force, and
            // the next write removes the new config before anything else.
            let commit = p.ops.iter().position(|o| o.name() == POLICY).unwrap();
            let mut cut = disk.clone();
            run(&mut cut, &p.ops[..commit]);
            let (back, stored_cut) = load(&cut);
            assert_eq!(back.applied.as_ref().unwrap().bundle, bundle(n, 1));
            let again = plan(&stored_cut, &back).unwrap();
            assert_eq!(again.first, 1, "{:?}", again.ops);
            assert!(matches!(&again.ops[0], Op::Delete(n) if n.starts_with(CONFIG)));
            run(&mut disk, &p.ops);
            let (back, _) = load(&disk);
            assert_eq!(back.applied.unwrap().bundle, bundle(n, 2));
            assert_eq!(
                disk.keys().filter(|k| k.starts_with(CONFIG)).count(),
                n,
                "one config part per service"
            );
        }
        assert_eq!(
            writes[0], writes[1],
            "bytes of the apply at 10 and 1,000 services"
        );
    }

    /// A bundle of `n` services, `s0` at `a` and `s1` at `b`.
    fn two(a: usize, b: usize) -> pb::Bundle {
        let mut out = bundle(3, a);
        out.targets[1] = bundle(3, b).targets.swap_remove(0);
        out.targets[1].service = "s0001".into();
        out
    }

    /// An apply cut short (or another replica's that lost) leaves a config
    /// part of a `SEQ` the policy in force does not commit; a later apply
    /// that does not change that service would commit it by its `SEQ`, so
    /// it is removed first.
    #[test]
    fn a_config_an_apply_left_uncommitted_is_removed_before_a_later_apply_commits() {
        let (mut disk, state, stored) = stored_with(1);
        let v1 = with_bundle(state, "v1", 2_000, two(1, 1));
        run(&mut disk, &plan(&stored, &v1).unwrap().ops);
        let (back, stored) = load(&disk);
        // Two applies from the same state: `lost` changes s0, `won` s1.
        let lost = with_bundle(back.clone(), "v2", 3_000, two(2, 1));
        let won = with_bundle(back, "v3", 3_001, two(1, 3));
        let lost = plan(&stored, &lost).unwrap();
        let won = plan(&stored, &won).unwrap();
        let commit = lost.ops.iter().position(|o| o.name() == POLICY).unwrap();
        run(&mut disk, &lost.ops[..commit]);
        run(&mut disk, &won.ops);
        let (back, stored) = load(&disk);
        assert_eq!(back.applied.as_ref().unwrap().bundle, two(1, 3));
        // A third apply, s1 again: the part `lost` left goes first.
        let v4 = with_bundle(back, "v4", 4_000, two(1, 4));
        let p = plan(&stored, &v4).unwrap();
        assert_eq!(p.first, 1, "{:?}", p.ops);
        let left = lost.ops.iter().find(|o| o.name().starts_with(CONFIG));
        assert_eq!(p.ops[0], Op::Delete(left.unwrap().name().to_owned()));
        let mut skipped = disk.clone();
        run(&mut disk, &p.ops);
        assert_eq!(load(&disk).0.applied.unwrap().bundle, two(1, 4));
        // Without that removal, s0 would read as `lost` wrote it.
        run(&mut skipped, &p.ops[1..]);
        let read = load(&skipped).0.applied.unwrap().bundle;
        assert_eq!(read.targets, two(2, 4).targets);
    }

    /// Adding or removing a service writes the list of services; a service
    /// removed is removed from the store after the commit.
    #[test]
    fn the_list_of_services_is_written_when_the_set_changes() {
        let (mut disk, state, stored) = stored_with(1);
        let v1 = with_bundle(state, "v1", 2_000, bundle(3, 1));
        run(&mut disk, &plan(&stored, &v1).unwrap().ops);
        let (back, stored) = load(&disk);
        let v2 = with_bundle(back, "v2", 3_000, bundle(2, 1));
        let p = plan(&stored, &v2).unwrap();
        let puts = puts(&p);
        assert!(puts.iter().any(|n| n.starts_with(SERVICES)), "{puts:?}");
        assert!(!puts.iter().any(|n| n.starts_with(CONFIG)), "{puts:?}");
        run(&mut disk, &p.ops);
        assert_eq!(load(&disk).0.applied.unwrap().bundle, bundle(2, 1));
        assert_eq!(disk.keys().filter(|k| k.starts_with(CONFIG)).count(), 2);
        assert_eq!(disk.keys().filter(|k| k.starts_with(SERVICES)).count(), 1);
    }

    #[test]
    fn a_policy_part_that_names_a_missing_config_is_refused() {
        let (mut disk, state, stored) = stored_with(1);
        let next = with_bundle(state, "v1", 2_000, bundle(3, 1));
        run(&mut disk, &plan(&stored, &next).unwrap().ops);
        for prefix in [CONFIG, SERVICES] {
            let mut disk = disk.clone();
            let part = disk.keys().find(|k| k.starts_with(prefix)).unwrap().clone();
            disk.remove(&part);
            let parts = disk.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
            let err = assemble(parts, &|n| n.to_owned()).unwrap_err();
            assert!(matches!(&err, Error::MissingConfig { .. }), "{err}");
        }
    }
}
