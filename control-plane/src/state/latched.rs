//! The state's side of latches: the releases govd made (so that an agent
//! coming back with a released latch gets the release, not a new trip),
//! re-arming an agent that lost one, releases (previewed for the audit
//! record, persisted, then sent), and merging another replica's latches.
//! [`Latched`] owns the latches and the releases; it reads and marks the
//! agents it is given. The latches themselves are `crate::latches`.

use std::collections::{BTreeMap, BTreeSet};

use gov_proto::v1 as pb;

use super::agent::{Agent, AgentKey, Agents, Outbox};
use crate::encoded::Encoded;
use crate::latches::{self, LatchId, Latches, Reporter};
use crate::store::{self, Persisted, Trip, TripKind};

/// The keys a release found latched (`""`: the rule's own counter, a fuse).
pub type Released = Vec<String>;

/// What a release names: the kind, the rule, and one key (or every key).
pub(super) type Release<'a> = (TripKind, &'a str, Option<&'a str>);

/// Tripped fuses and engaged limits, and when each was last released.
#[derive(Debug, Default)]
pub(super) struct Latched {
    latches: Latches,
    /// When each rule was last released (see `Agent::releasing`).
    /// By kind, rule and key (`""`: every key of the rule).
    released: BTreeMap<LatchId, u64>,
}

impl Latched {
    /// The latches and releases `state.json` holds.
    pub(super) fn new(trips: Vec<Trip>, releases: Vec<store::Released>) -> Self {
        Latched {
            latches: Latches::from_trips(trips),
            released: releases
                .into_iter()
                .map(|r| ((r.kind, r.rule, r.key), r.at_unix_ms))
                .collect(),
        }
    }

    pub(super) fn latches(&self) -> &Latches {
        &self.latches
    }

    #[cfg(test)]
    pub(super) fn latches_mut(&mut self) -> &mut Latches {
        &mut self.latches
    }

    /// Takes in the latches `agent`'s stats report: whether they changed.
    /// Rules whose missed release is on its way are not a trip; once
    /// reported closed they are done.
    pub(super) fn on_stats(
        &mut self,
        policy: Option<&pb::Bundle>,
        agent: &mut Agent,
        stats: &pb::Stats,
        now: u64,
        audits: &mut latches::Audits,
    ) -> bool {
        let mut seen = stats.clone();
        hide_releasing(&mut agent.releasing, &mut seen);
        let by = Reporter {
            instance: &agent.instance,
            identity: &agent.identity,
        };
        self.latches
            .reconcile(policy, &agent.service, by, &seen, now, audits)
    }

    /// Takes in a latch event `agent` reported: whether the latches changed.
    pub(super) fn on_event(
        &mut self,
        policy: Option<&pb::Bundle>,
        agent: &Agent,
        event: &pb::Event,
        now: u64,
        audits: &mut latches::Audits,
    ) -> bool {
        let by = Reporter {
            instance: &agent.instance,
            identity: &agent.identity,
        };
        self.latches
            .on_event(policy, &agent.service, by, event, now, audits)
    }

    /// The releases, as `state.json` holds them.
    pub(super) fn releases(&self) -> Vec<store::Released> {
        self.released
            .iter()
            .map(|((kind, rule, key), at)| store::Released {
                kind: *kind,
                rule: rule.clone(),
                key: key.clone(),
                at_unix_ms: *at,
            })
            .collect()
    }

    /// The latches `hello` reports that govd released while the agent was
    /// away (tripped no later than the release of that key, or of every key
    /// of the rule): it gets the release, not a new trip.
    pub(super) fn missed_releases(&self, hello: &pb::Hello) -> BTreeSet<LatchId> {
        hello
            .latches
            .iter()
            .filter(|l| {
                let k = trip_kind(l.kind());
                let released = |key: &str| {
                    self.released
                        .get(&(k, l.rule.clone(), key.to_owned()))
                        .is_some_and(|&at| at >= l.since_unix_ms)
                };
                !self.latches.contains(k, &l.rule, Some(&l.key))
                    && (released(&l.key) || released(""))
            })
            .map(|l| (trip_kind(l.kind()), l.rule.clone(), l.key.clone()))
            .collect()
    }

    /// Queues an `Arm` command for every latch of `key`'s service that this
    /// instance held (or was marked as not enforcing) and that is not in
    /// `held`: each key of a keyed limit alone.
    pub(super) fn rearm(
        &self,
        agents: &Agents,
        key: &AgentKey,
        held: &BTreeSet<LatchId>,
        out: &mut Outbox,
    ) {
        let Some(agent) = agents.get(key).filter(|a| a.conn.is_some()) else {
            return;
        };
        let (service, instance) = key;
        for trip in self.latches.iter() {
            let ours = trip.rule.split_once('/').map(|(s, _)| s) == Some(service.as_str());
            let held_here =
                trip.instances.contains(instance) || trip.not_enforced.contains(instance);
            let id = (trip.kind, trip.rule.clone(), trip.key.clone());
            if !ours || !held_here || held.contains(&id) {
                continue;
            }
            // A latch another identity reported under this name (a squatter
            // before the name was proved, or an older holder) is not this
            // agent's to enforce: govd keeps it, shown, until released.
            if let Some(reporter) = trip.reported_by.get(instance)
                && *reporter != agent.identity
            {
                tracing::warn!(rule = %trip.rule, key = %trip.key, %instance, %reporter, identity = %agent.identity, "not re-arming a latch another identity reported under this instance's name");
                continue;
            }
            tracing::info!(rule = %trip.rule, key = %trip.key, %instance, kind = trip.kind.as_str(), "re-arming a latch the agent lost");
            let latch = pb::Latch {
                kind: release_kind(trip.kind) as i32,
                rule: trip.rule.clone(),
                key: trip.key.clone(),
                since_unix_ms: trip.since_unix_ms,
                deadline_unix_ms: trip.deadline_unix_ms.unwrap_or(0),
                reason: trip.reason.clone(),
            };
            out.extend(agent.outgoing(Encoded::new(&pb::ControlMessage {
                msg: Some(pb::control_message::Msg::Command(pb::Command {
                    kind: Some(pb::command::Kind::Arm(latch)),
                })),
            })));
        }
    }

    /// What [`Latched::release`] would return, without changing anything:
    /// for the audit record written before the release takes effect.
    pub(super) fn release_preview(
        &self,
        agents: &Agents,
        (kind, rule, key): Release<'_>,
    ) -> (Released, Vec<String>) {
        let service = rule.split_once('/').map_or("", |(s, _)| s);
        let mut keys: BTreeSet<String> = self
            .latches
            .of(kind, rule, key)
            .map(|t| t.key.clone())
            .collect();
        let mut notified = Vec::new();
        for a in connected(agents, service) {
            keys.extend(reports_tripped(a, kind, rule, key));
            notified.push(a.instance.clone());
        }
        (keys.into_iter().collect(), notified)
    }

    /// Queues a release command (of `key`, or every key) to every connected
    /// agent of the rule's service and forgets the latches. Returns (the
    /// keys that were latched, instances notified).
    pub(super) fn release(
        &mut self,
        agents: &mut Agents,
        (kind, rule, key): Release<'_>,
        who: &str,
        now: u64,
        out: &mut Outbox,
    ) -> (Released, Vec<String>) {
        let service = rule.split_once('/').map_or("", |(s, _)| s).to_owned();
        if key.is_none() {
            self.released
                .retain(|(k, r, _), _| !(*k == kind && r == rule));
        }
        self.released
            .insert((kind, rule.to_owned(), key.unwrap_or("").to_owned()), now);
        let mut keys: BTreeSet<String> = self.latches.remove(kind, rule, key).into_iter().collect();
        forget_reported(agents, &service, kind, rule, key);
        let mut notified = Vec::new();
        let msg = Encoded::new(&release_message(kind, rule, key, who));
        for a in connected(agents, &service) {
            keys.extend(reports_tripped(a, kind, rule, key));
            out.extend(a.outgoing(msg.clone()));
            notified.push(a.instance.clone());
        }
        (keys.into_iter().collect(), notified)
    }

    /// Takes in another replica's latches and releases: each release not
    /// seen here yet goes to this replica's agents; a latch this replica
    /// holds that `trips` lacks is kept unless it was released since it
    /// tripped (it is then this replica's to write).
    pub(super) fn adopt(
        &mut self,
        agents: &mut Agents,
        releases: Vec<store::Released>,
        trips: Vec<Trip>,
        out: &mut Outbox,
    ) {
        for r in &releases {
            let id: LatchId = (r.kind, r.rule.clone(), r.key.clone());
            if self.released.get(&id).is_some_and(|&at| at >= r.at_unix_ms) {
                continue;
            }
            let key = (!r.key.is_empty()).then_some(r.key.as_str());
            self.release(
                agents,
                (r.kind, &r.rule, key),
                "govd (a release made through another replica)",
                r.at_unix_ms,
                out,
            );
        }
        let mut merged: BTreeMap<LatchId, Trip> = trips
            .into_iter()
            .map(|t| ((t.kind, t.rule.clone(), t.key.clone()), t))
            .collect();
        for local in self.latches.iter() {
            let id: LatchId = (local.kind, local.rule.clone(), local.key.clone());
            match merged.get_mut(&id) {
                Some(trip) => {
                    trip.instances.extend(local.instances.iter().cloned());
                    trip.not_enforced.extend(local.not_enforced.iter().cloned());
                    trip.reported_by.extend(
                        local
                            .reported_by
                            .iter()
                            .map(|(i, who)| (i.clone(), who.clone())),
                    );
                }
                None if !self.released_since(&id, local.since_unix_ms) => {
                    merged.insert(id, local.clone());
                }
                None => {}
            }
        }
        self.latches = Latches::from_trips(merged.into_values().collect());
    }

    /// Whether latch `id` (or every key of its rule) was released at or
    /// after `since`.
    fn released_since(&self, id: &LatchId, since: u64) -> bool {
        let all = (id.0, id.1.clone(), String::new());
        [id, &all]
            .into_iter()
            .any(|k| self.released.get(k).is_some_and(|&at| at >= since))
    }
}

/// Queues the releases `key` missed and remembers them until its stats
/// say they are done.
pub(super) fn send_missed(
    agents: &mut Agents,
    key: &AgentKey,
    missed: BTreeSet<LatchId>,
    out: &mut Outbox,
) {
    let Some(agent) = agents.get_mut(key) else {
        return;
    };
    for (kind, rule, latch_key) in &missed {
        let msg = release_message(
            *kind,
            rule,
            Some(latch_key),
            "govd (a release made while this agent was away)",
        );
        if let Some(o) = agent.outgoing(Encoded::new(&msg)) {
            tracing::info!(%rule, key = %latch_key, instance = %key.1, kind = kind.as_str(), "sending a release the agent missed while away");
            out.push(o);
        }
    }
    agent.releasing = missed;
}

/// `p` once `rule` (its `key` only, or every key) is released at `now`.
pub(super) fn persisted_without(
    mut p: Persisted,
    (kind, rule, key): Release<'_>,
    now: u64,
) -> Persisted {
    let gone = |k: &str| key.is_none_or(|key| key == k);
    let stored = key.unwrap_or("");
    p.trips
        .retain(|t| !(t.kind == kind && t.rule == rule && gone(&t.key)));
    p.releases
        .retain(|r| !(r.kind == kind && r.rule == rule && gone(&r.key)));
    p.releases.push(store::Released {
        kind,
        rule: rule.to_owned(),
        key: stored.to_owned(),
        at_unix_ms: now,
    });
    p
}

/// Connected agents of `service`.
fn connected<'a>(agents: &'a Agents, service: &'a str) -> impl Iterator<Item = &'a Agent> {
    agents
        .values()
        .filter(move |a| a.service == service && a.conn.is_some())
}

fn release_kind(kind: TripKind) -> pb::ReleaseKind {
    match kind {
        TripKind::Fuse => pb::ReleaseKind::Fuse,
        TripKind::Limit => pb::ReleaseKind::Limit,
    }
}

/// The command that releases `rule` (its `key` only, or every key) on an agent.
pub(super) fn release_message(
    kind: TripKind,
    rule: &str,
    key: Option<&str>,
    who: &str,
) -> pb::ControlMessage {
    let cmd = pb::ReleaseCommand {
        kind: release_kind(kind) as i32,
        rule: rule.to_owned(),
        who: who.to_owned(),
        key: key.unwrap_or("").to_owned(),
    };
    pb::ControlMessage {
        msg: Some(pb::control_message::Msg::Command(pb::Command {
            kind: Some(pb::command::Kind::Release(cmd)),
        })),
    }
}

pub(super) fn trip_kind(kind: pb::ReleaseKind) -> TripKind {
    match kind {
        pb::ReleaseKind::Fuse => TripKind::Fuse,
        pb::ReleaseKind::Limit => TripKind::Limit,
    }
}

/// Drops `rule` (its `key` only, or every key) from the last stats of the
/// agents of `service`: they were taken before the release, and would
/// otherwise show the released latch until the next stats (and count it in
/// a later release's answer).
fn forget_reported(
    agents: &mut Agents,
    service: &str,
    kind: TripKind,
    rule: &str,
    key: Option<&str>,
) {
    let stats = agents
        .values_mut()
        .filter(|a| a.service == service)
        .filter_map(|a| a.stats.as_mut());
    for s in stats {
        for r in s.rules.iter_mut().filter(|r| r.rule == rule) {
            match kind {
                TripKind::Fuse => r.fuse_state = pb::FuseState::Closed as i32,
                TripKind::Limit => match key {
                    None => {
                        r.engaged_keys.clear();
                        r.engaged_keys_truncated = false;
                        r.limit_engaged = false;
                    }
                    // An agent without `engaged_keys` has only the rule's own
                    // counter, which a release of one key leaves alone.
                    Some(_) if r.engaged_keys.is_empty() => {}
                    Some(key) => {
                        r.engaged_keys.retain(|k| k != key);
                        r.limit_engaged = !r.engaged_keys.is_empty() || r.engaged_keys_truncated;
                    }
                },
            }
        }
    }
}

/// The keys of `rule` (of `key` only, or all) `agent`'s stats say are
/// latched (stats may know of a trip the events did not tell).
fn reports_tripped(agent: &Agent, kind: TripKind, rule: &str, key: Option<&str>) -> Vec<String> {
    let Some(stats) = agent.stats.as_ref() else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    for r in stats.rules.iter().filter(|r| r.rule == rule) {
        match kind {
            TripKind::Fuse if r.fuse_state() != pb::FuseState::Closed => keys.push(String::new()),
            TripKind::Fuse => {}
            TripKind::Limit => keys.extend(
                latches::engaged_keys(r)
                    .into_iter()
                    .filter(|k| key.is_none_or(|key| key == *k))
                    .map(str::to_owned),
            ),
        }
    }
    keys
}

/// Hides from `stats` the latches whose missed release is on its way to
/// the agent (not a trip), and forgets those the stats report released.
fn hide_releasing(releasing: &mut BTreeSet<LatchId>, stats: &mut pb::Stats) {
    if !releasing.is_empty() {
        stats.rules.retain_mut(|r| {
            let kind = match r.kind() {
                pb::RuleKind::Fuse => TripKind::Fuse,
                pb::RuleKind::Limit => TripKind::Limit,
                _ => return true,
            };
            let open: Vec<String> = match kind {
                TripKind::Fuse if r.fuse_state() != pb::FuseState::Closed => {
                    vec![String::new()]
                }
                TripKind::Fuse => Vec::new(),
                TripKind::Limit => latches::engaged_keys(r)
                    .into_iter()
                    .map(str::to_owned)
                    .collect(),
            };
            let mut left = Vec::new();
            let mut hidden = false;
            for key in open {
                if releasing.contains(&(kind, r.rule.clone(), key.clone())) {
                    hidden = true;
                } else {
                    left.push(key);
                }
            }
            // Keys no longer reported latched: their release is done.
            releasing.retain(|(k, rule, key)| {
                !(*k == kind && *rule == r.rule)
                    || r.engaged_keys_truncated
                    || match kind {
                        TripKind::Fuse => r.fuse_state() != pb::FuseState::Closed,
                        TripKind::Limit => latches::engaged_keys(r).contains(&key.as_str()),
                    }
            });
            if !hidden {
                return true;
            }
            match kind {
                // The fuse's release is on its way: not a trip.
                TripKind::Fuse => false,
                TripKind::Limit => {
                    // Only the keys whose release is on its way are hidden.
                    r.limit_engaged = !left.is_empty();
                    r.engaged_keys = left;
                    true
                }
            }
        });
    }
}
