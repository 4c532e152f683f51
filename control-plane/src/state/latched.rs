//! The state's side of latches: re-arming an agent that lost one,
//! releases (previewed for the audit record, persisted, then sent), and the
//! `release after` deadlines. The latches themselves are `crate::latches`.

use std::collections::BTreeSet;

use gov_proto::v1 as pb;

use super::{Agent, AgentKey, Outbox, Outgoing, State};
use crate::latches::{self, LatchId};
use crate::store::{Persisted, TripKind};

/// The keys a release found latched (`""`: the rule's own counter, a fuse).
pub type Released = Vec<String>;

impl State {
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

    /// Queues the releases `key` missed and remembers them until its stats
    /// say they are done.
    pub(super) fn send_missed(
        &mut self,
        key: &AgentKey,
        missed: BTreeSet<LatchId>,
        out: &mut Outbox,
    ) {
        let Some(agent) = self.agents.get_mut(key) else {
            return;
        };
        if let Some(conn) = &agent.conn {
            for (kind, rule, latch_key) in &missed {
                tracing::info!(%rule, key = %latch_key, instance = %key.1, kind = kind.as_str(), "sending a release the agent missed while away");
                out.push(Outgoing {
                    key: key.clone(),
                    conn: conn.id,
                    tx: conn.tx.clone(),
                    msg: release_message(
                        *kind,
                        rule,
                        Some(latch_key),
                        "govd (a release made while this agent was away)",
                    ),
                });
            }
        }
        agent.releasing = missed;
    }

    /// Queues an `Arm` command for every latch of `key`'s service that this
    /// instance held (or was marked as not enforcing) and that is not in
    /// `held`: each key of a keyed limit alone.
    pub(super) fn rearm(&self, key: &AgentKey, held: &BTreeSet<LatchId>, out: &mut Outbox) {
        let Some(conn) = self.agents.get(key).and_then(|a| a.conn.as_ref()) else {
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
            tracing::info!(rule = %trip.rule, key = %trip.key, %instance, kind = trip.kind.as_str(), "re-arming a latch the agent lost");
            let latch = pb::Latch {
                kind: match trip.kind {
                    TripKind::Fuse => pb::ReleaseKind::Fuse,
                    TripKind::Limit => pb::ReleaseKind::Limit,
                } as i32,
                rule: trip.rule.clone(),
                key: trip.key.clone(),
                since_unix_ms: trip.since_unix_ms,
                deadline_unix_ms: trip.deadline_unix_ms.unwrap_or(0),
                reason: trip.reason.clone(),
            };
            out.push(Outgoing {
                key: key.clone(),
                conn: conn.id,
                tx: conn.tx.clone(),
                msg: pb::ControlMessage {
                    msg: Some(pb::control_message::Msg::Command(pb::Command {
                        kind: Some(pb::command::Kind::Arm(latch)),
                    })),
                },
            });
        }
    }

    /// What [`State::release`] would return, without changing anything:
    /// for the audit record written before the release takes effect.
    pub fn release_preview(
        &self,
        kind: TripKind,
        rule: &str,
        key: Option<&str>,
    ) -> (Released, Vec<String>) {
        let service = rule.split_once('/').map_or("", |(s, _)| s);
        let mut keys: BTreeSet<String> = self
            .latches
            .of(kind, rule, key)
            .map(|t| t.key.clone())
            .collect();
        let mut notified = Vec::new();
        for a in self.connected(service) {
            keys.extend(reports_tripped(a, kind, rule, key));
            notified.push(a.instance.clone());
        }
        (keys.into_iter().collect(), notified)
    }

    /// What `state.json` holds once `rule` (its `key` only, or every key)
    /// is released.
    pub fn persisted_without(
        &self,
        kind: TripKind,
        rule: &str,
        key: Option<&str>,
        now: u64,
    ) -> Persisted {
        let mut p = self.to_persisted();
        let gone = |k: &str| key.is_none_or(|key| key == k);
        let stored = key.unwrap_or("");
        p.trips
            .retain(|t| !(t.kind == kind && t.rule == rule && gone(&t.key)));
        p.releases
            .retain(|r| !(r.kind == kind && r.rule == rule && gone(&r.key)));
        p.releases.push(crate::store::Released {
            kind,
            rule: rule.to_owned(),
            key: stored.to_owned(),
            at_unix_ms: now,
        });
        p
    }

    /// Queues a release command (of `key`, or every key) to every connected
    /// agent of the rule's service and forgets the latches. Returns (the
    /// keys that were latched, instances notified).
    // INVARIANT: called only after `persisted_without(kind, rule, key)` is
    // on disk and the release is in the audit log.
    pub fn release(
        &mut self,
        kind: TripKind,
        rule: &str,
        key: Option<&str>,
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
        forget_reported(&mut self.agents, &service, kind, rule, key);
        let mut notified = Vec::new();
        for a in self.connected(&service) {
            keys.extend(reports_tripped(a, kind, rule, key));
            if let Some(conn) = &a.conn {
                out.push(Outgoing {
                    key: (a.service.clone(), a.instance.clone()),
                    conn: conn.id,
                    tx: conn.tx.clone(),
                    msg: release_message(kind, rule, key, who),
                });
                notified.push(a.instance.clone());
            }
        }
        (keys.into_iter().collect(), notified)
    }

    /// The automatic recovery delay of fuse `rule` (`None`: manual).
    pub fn fuse_recovery(&self, rule: &str) -> Option<u64> {
        latches::fuse_recovery(self.bundle(), rule)
    }

    /// Limit latches (rule, key) whose `release after` deadline has passed.
    pub fn expired(&self, now: u64) -> Vec<(String, String)> {
        self.latches.expired(now)
    }

    /// The earliest limit deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        self.latches.next_deadline()
    }

    /// Whether the applied policy has a fuse or limit called `rule`.
    pub fn has_rule(&self, kind: TripKind, rule: &str) -> bool {
        let Some((service, _)) = rule.split_once('/') else {
            return false;
        };
        let Some(t) = self.target(service) else {
            return false;
        };
        t.rule(rule).is_some_and(|r| r.kind() == kind.rule_kind())
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
        kind: match kind {
            TripKind::Fuse => pb::ReleaseKind::Fuse,
            TripKind::Limit => pb::ReleaseKind::Limit,
        } as i32,
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
    agents: &mut std::collections::BTreeMap<AgentKey, Agent>,
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
pub(super) fn hide_releasing(releasing: &mut BTreeSet<LatchId>, stats: &mut pb::Stats) {
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
