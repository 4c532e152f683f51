//! The running canary as the state holds it: what is stored of it, which
//! agents are on trial, and the outcomes counted from every stats report of
//! the agents of its services since it started (or since govd started: the
//! counts are not stored, the agents' next reports start them again).

use std::collections::{BTreeMap, BTreeSet};

use gov_proto::v1 as pb;

use super::agent::{Agent, AgentKey};
use crate::canary::{Counts, rule_counts};
use crate::store::{AppliedPolicy, StoredCanary};

/// The connected instances of each of `services` a canary of `share`
/// percent tries its version on: the first by name, at least one of each
/// service with one connected (`State::agents` is in key order).
pub fn pick<'a>(
    agents: impl IntoIterator<Item = &'a Agent>,
    services: &[String],
    share: u32,
) -> BTreeSet<AgentKey> {
    let mut connected: BTreeMap<&str, Vec<AgentKey>> = BTreeMap::new();
    for agent in agents {
        if agent.conn.is_some() && services.contains(&agent.service) {
            connected
                .entry(&agent.service)
                .or_default()
                .push(agent.key());
        }
    }
    connected
        .into_values()
        .flat_map(|keys| {
            let n = crate::canary::on_trial(keys.len(), share);
            keys.into_iter().take(n)
        })
        .collect()
}

/// A canary running.
#[derive(Debug)]
pub struct Canary {
    pub(super) stored: StoredCanary,
    /// Per agent of its services, per rule: what it counted since the
    /// canary started, under the version it must enforce.
    counted: BTreeMap<AgentKey, BTreeMap<String, Counts>>,
}

impl Canary {
    pub(super) fn new(stored: StoredCanary) -> Self {
        Canary {
            stored,
            counted: BTreeMap::new(),
        }
    }

    pub fn stored(&self) -> &StoredCanary {
        &self.stored
    }

    pub fn version(&self) -> &str {
        &self.stored.policy.version
    }

    /// Whether `key` is on trial.
    pub fn on_trial(&self, key: &AgentKey) -> bool {
        self.stored.instances.contains(key)
    }

    /// The config on trial for `service`, when the canary changes it.
    pub(super) fn target(&self, service: &str) -> Option<pb::TargetConfig> {
        if !self.stored.services.iter().any(|s| s == service) {
            return None;
        }
        Some(
            self.stored
                .policy
                .bundle
                .targets
                .iter()
                .find(|t| t.service == service)
                .cloned()
                .unwrap_or_else(|| gov_proto::compiled::target(service)),
        )
    }

    /// Counts what `key` reported between `before` and `now`, when both were
    /// taken under the version it must enforce (the first report of a
    /// version only starts the count).
    pub(super) fn observe(
        &mut self,
        key: &AgentKey,
        applied: Option<&AppliedPolicy>,
        before: Option<&pb::Stats>,
        now: &pb::Stats,
    ) {
        if !self.stored.services.contains(&key.0) {
            return;
        }
        let expected = if self.on_trial(key) {
            self.target(&key.0).map(|t| t.version)
        } else {
            applied.map(|a| {
                a.bundle
                    .targets
                    .iter()
                    .find(|t| t.service == key.0)
                    .map_or(String::new(), |t| t.version.clone())
            })
        };
        let Some(before) = before else { return };
        if expected.as_deref() != Some(now.version.as_str()) || before.version != now.version {
            return;
        }
        let before = rule_counts(before);
        let counted = self.counted.entry(key.clone()).or_default();
        for (rule, counts) in rule_counts(now) {
            let delta = counts.since(before.get(rule).unwrap_or(&Counts::default()));
            counted.entry(rule.to_owned()).or_default().add(&delta);
        }
    }

    /// The comparison so far, one entry per rule seen on either side.
    pub fn rules(&self) -> Vec<pb::CanaryRule> {
        #[derive(Default)]
        struct Side {
            counts: Counts,
            instances: u32,
        }
        let mut sides: BTreeMap<&str, (Side, Side)> = BTreeMap::new();
        for (key, rules) in &self.counted {
            for (rule, counts) in rules {
                let (canary, baseline) = sides.entry(rule).or_default();
                let side = if self.on_trial(key) { canary } else { baseline };
                side.counts.add(counts);
                side.instances += 1;
            }
        }
        sides
            .into_iter()
            .map(|(rule, (canary, baseline))| pb::CanaryRule {
                rule: rule.to_owned(),
                canary: Some(canary.counts.to_proto(canary.instances)),
                baseline: Some(baseline.counts.to_proto(baseline.instances)),
            })
            .collect()
    }

    /// A reason to roll back now: an instance on trial refused the version.
    pub fn refused<'a>(&self, agents: impl IntoIterator<Item = &'a Agent>) -> Option<String> {
        agents.into_iter().find_map(|agent| {
            let key = agent.key();
            if !self.on_trial(&key) {
                return None;
            }
            let nack = agent.nack.as_ref()?;
            (Some(nack.version.as_str()) == self.target(&key.0).map(|t| t.version).as_deref())
                .then(|| format!("{}/{} refused the version: {}", key.0, key.1, nack.error))
        })
    }

    /// Its view (`ClusterView.canary`), running.
    pub fn view(&self) -> pb::CanaryView {
        let s = &self.stored;
        pb::CanaryView {
            version: s.policy.version.clone(),
            previous_version: s.previous.clone(),
            who: s.policy.who.clone(),
            started_unix_ms: s.started_unix_ms,
            ends_unix_ms: s.ends_unix_ms,
            spec: Some(crate::canary::wire_spec(&s.spec)),
            services: s.services.clone(),
            instances: s
                .instances
                .iter()
                .map(|(service, instance)| format!("{service}/{instance}"))
                .collect(),
            rules: self.rules(),
            state: "running".into(),
            reason: String::new(),
        }
    }
}
