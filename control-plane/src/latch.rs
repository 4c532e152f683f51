//! Latches: tripped fuses and engaged limits, as the control plane knows
//! them from its agents' events and stats, with absolute deadlines for
//! limits that release themselves, and the releases govd made. This module
//! owns the concept: its types (stored as they are), and every rule of
//! latching, releasing and expiring; the state (`state.rs`) holds one
//! [`Latches`] and calls its API, and `state/latch_agents.rs` delivers what
//! it decides (releases, re-arms) to the agents.
//!
//! A latch (a tripped fuse with `recover manual`, an engaged limit before
//! its deadline) ends only by an operator's release, govd's `release after`
//! timer, or an agent's explicit release event. An agent whose stats say
//! the rule is closed while govd holds the latch (an agent that restarted
//! and forgot it) does not end it: the latch stays, that instance is marked
//! as not enforcing it (shown in the view) and the divergence is audited.
//! Every latch and every end of a latch is an audit entry.
//!
//! - `latch/report.rs`: what agents report (events, stats) does to the
//!   latches;
//! - `latch/release.rs`: releases (by an operator, the timer, another
//!   replica, or missed while an agent was away), re-arming an agent that
//!   lost a latch, and merging another replica's latches.

use std::collections::{BTreeMap, BTreeSet};

use gov_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::audit::AuditEntry;

pub mod release;
mod report;

/// Audit entries of latch changes, written by the caller after the state.
pub type Audits = Vec<AuditEntry>;

/// The kind of rule a latch belongs to (the engine's `LatchKind`; on the
/// wire `pb::ReleaseKind`). Stored as `fuse` or `limit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LatchKind {
    Fuse,
    Limit,
}

/// A tripped fuse or an engaged limit, as stored (a part of its own, or an
/// entry of the `trips` list of an earlier release's `state.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latch {
    pub kind: LatchKind,
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

/// When a rule (or one key of it) was last released, as stored: an agent
/// that was away and comes back with the latch gets the release instead
/// of latching it again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Released {
    pub kind: LatchKind,
    pub rule: String,
    /// A limit's key released alone. Empty: every key of the rule.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    pub at_unix_ms: u64,
}

/// Which latch: kind, `service/rule` and the key of a limit keyed by
/// consumer or called service (`""`: the rule's own counter, and always for
/// fuses).
pub type LatchId = (LatchKind, String, String);

/// What a release names: the kind, the rule, and one key (or every key).
pub type Release<'a> = (LatchKind, &'a str, Option<&'a str>);

/// The agent a latch change comes from: its service and instance, and the
/// identity its stream proved (`auth::AgentIdentity::label`).
#[derive(Clone, Copy, Debug)]
pub struct Reporter<'a> {
    pub service: &'a str,
    pub instance: &'a str,
    pub identity: &'a str,
}

/// Every latch, by kind, `service/rule` and key, and when each was last
/// released.
#[derive(Debug, Default)]
pub struct Latches {
    latches: BTreeMap<LatchId, Latch>,
    /// When each rule was last released (see `Agent::releasing`).
    /// By kind, rule and key (`""`: every key of the rule).
    released: BTreeMap<LatchId, u64>,
}

// === impl LatchKind ===

impl LatchKind {
    /// The kind of rule that holds it.
    pub fn rule_kind(self) -> pb::RuleKind {
        match self {
            LatchKind::Fuse => pb::RuleKind::Fuse,
            LatchKind::Limit => pb::RuleKind::Limit,
        }
    }

    /// `fuse` or `limit`: the kind's word.
    pub fn as_str(self) -> &'static str {
        self.rule_kind().word()
    }

    /// The kind a latch or release on the wire names.
    pub fn from_wire(kind: pb::ReleaseKind) -> Self {
        match kind {
            pb::ReleaseKind::Fuse => LatchKind::Fuse,
            pb::ReleaseKind::Limit => LatchKind::Limit,
        }
    }

    /// The kind as the wire names it in a latch or a release.
    pub fn wire(self) -> pb::ReleaseKind {
        match self {
            LatchKind::Fuse => pb::ReleaseKind::Fuse,
            LatchKind::Limit => pb::ReleaseKind::Limit,
        }
    }
}

// === impl Latch ===

impl Latch {
    pub fn id(&self) -> LatchId {
        (self.kind, self.rule.clone(), self.key.clone())
    }

    /// The service whose rule it is.
    pub fn service(&self) -> &str {
        service_of(&self.rule)
    }
}

// === impl Latches ===

impl Latches {
    /// The latches and releases the store holds.
    pub fn new(latches: Vec<Latch>, releases: Vec<Released>) -> Self {
        Self {
            latches: latches.into_iter().map(|l| (l.id(), l)).collect(),
            released: releases
                .into_iter()
                .map(|r| ((r.kind, r.rule, r.key), r.at_unix_ms))
                .collect(),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Latch> {
        self.latches.values()
    }

    /// The releases, as the store holds them.
    pub fn releases(&self) -> Vec<Released> {
        self.released
            .iter()
            .map(|((kind, rule, key), at)| Released {
                kind: *kind,
                rule: rule.clone(),
                key: key.clone(),
                at_unix_ms: *at,
            })
            .collect()
    }

    /// The latches of `rule`: of `key` only, or every key (`None`).
    pub fn of<'a>(
        &'a self,
        kind: LatchKind,
        rule: &'a str,
        key: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Latch> + 'a {
        self.latches
            .values()
            .filter(move |l| l.kind == kind && l.rule == rule && key.is_none_or(|k| l.key == k))
    }

    /// Whether `rule` is latched for `key` (`None`: for any key).
    pub fn contains(&self, kind: LatchKind, rule: &str, key: Option<&str>) -> bool {
        self.of(kind, rule, key).next().is_some()
    }

    /// Limit latches (rule, key) whose `release after` deadline has passed.
    pub fn expired(&self, now: u64) -> Vec<(String, String)> {
        self.latches
            .values()
            .filter(|l| l.kind == LatchKind::Limit && l.deadline_unix_ms.is_some_and(|d| d <= now))
            .map(|l| (l.rule.clone(), l.key.clone()))
            .collect()
    }

    /// The earliest limit deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        self.latches
            .values()
            .filter_map(|l| l.deadline_unix_ms)
            .min()
    }
}

/// The stored latches and releases once `rule` (its `key` only, or every
/// key) is released at `now`.
pub fn stored_without(
    latches: &mut Vec<Latch>,
    releases: &mut Vec<Released>,
    (kind, rule, key): Release<'_>,
    now: u64,
) {
    let gone = |k: &str| key.is_none_or(|key| key == k);
    latches.retain(|l| !(l.kind == kind && l.rule == rule && gone(&l.key)));
    releases.retain(|r| !(r.kind == kind && r.rule == rule && gone(&r.key)));
    releases.push(Released {
        kind,
        rule: rule.to_owned(),
        key: key.unwrap_or("").to_owned(),
        at_unix_ms: now,
    });
}

/// The keys a limit's stats report latched: its `engaged_keys`, or, from an
/// agent older than that field, the rule's own counter when engaged.
pub fn engaged_keys(r: &pb::RuleStats) -> Vec<&str> {
    if r.engaged_keys.is_empty() {
        if r.limit_engaged { vec![""] } else { vec![] }
    } else {
        r.engaged_keys.iter().map(String::as_str).collect()
    }
}

/// The `release after` of limit `rule`, if it has one.
pub fn release_after(policy: Option<&pb::Bundle>, rule: &str) -> Option<u64> {
    let (service, _) = rule.split_once('/')?;
    let limit = target(policy, service)?.rule(rule)?.limit()?;
    match limit.release.as_ref()?.kind.as_ref()? {
        pb::release::Kind::AfterMs(ms) => Some(*ms),
        pb::release::Kind::Manual(_) => None,
    }
}

/// The automatic recovery delay of fuse `rule` (`None`: manual).
pub fn fuse_recovery(policy: Option<&pb::Bundle>, rule: &str) -> Option<u64> {
    let (service, _) = rule.split_once('/')?;
    let fuse = target(policy, service)?.rule(rule)?.fuse()?;
    match fuse.recover.as_ref()?.kind.as_ref()? {
        pb::recovery::Kind::After(a) => Some(a.after_ms),
        pb::recovery::Kind::Manual(_) => None,
    }
}

/// What the reason of a shadow rule's latch ends with. The view takes it
/// off (or puts it on) as the rule's mode changes after the latch.
pub const SHADOW_NOTE: &str = " (mode shadow: rejects nothing)";

/// Whether `rule` is in mode shadow in `policy`.
fn is_shadow(policy: Option<&pb::Bundle>, rule: &str) -> bool {
    let Some((service, _)) = rule.split_once('/') else {
        return false;
    };
    target(policy, service)
        .and_then(|t| t.rules.iter().find(|r| r.name == rule))
        .is_some_and(|r| r.mode() == pb::Mode::Shadow)
}

fn target<'a>(policy: Option<&'a pb::Bundle>, service: &str) -> Option<&'a pb::TargetConfig> {
    policy?.targets.iter().find(|t| t.service == service)
}

/// The service of `service/rule` (`""` without a `/`).
fn service_of(rule: &str) -> &str {
    rule.split_once('/').map_or("", |(s, _)| s)
}

fn id(kind: LatchKind, rule: &str, key: &str) -> LatchId {
    (kind, rule.to_owned(), key.to_owned())
}
