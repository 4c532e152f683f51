//! The shared state as the stores keep it: the policy in force, its
//! history, the latches and releases (their types are `crate::latch`'s),
//! a running canary. Plain data;
//! `parts.rs` says how it is split into parts and `legacy.rs` how the
//! single `state.json` of earlier releases held it.

use std::collections::{BTreeMap, BTreeSet};

use gov_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use super::agents::KnownAgent;
use crate::latch::{Latch, Released};

/// The shared state: what the parts (`parts.rs`) hold, and in memory the
/// agents too (kept apart: `agents.jsonl`, or a key per agent under
/// `PREFIX/agents/REPLICA/`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Persisted {
    pub format: u32,
    #[serde(default)]
    pub applied: Option<AppliedPolicy>,
    /// Oldest first, bounded.
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
    /// Stored as `trips` (the name earlier releases wrote and read).
    #[serde(default, rename = "trips")]
    pub latches: Vec<Latch>,
    #[serde(default)]
    pub agents: Vec<KnownAgent>,
    /// The last release of each rule, so that an agent that was away and
    /// comes back with the latch gets the release instead of latching it again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub releases: Vec<Released>,
    /// On disk only: the history's source texts by content address (one
    /// copy of each distinct text however many versions share it). Empty
    /// in memory: [`Store::load`](super::Store::load) puts the texts back
    /// into the history.
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

/// A history source on disk: its name and its text's content address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRef {
    pub name: String,
    /// `sha256:HEX` of the text.
    pub text: String,
}

/// `sha256:HEX` of `text`.
pub fn content_address(text: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}
