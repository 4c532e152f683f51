//! The state's side of latches: re-arming an agent that lost one,
//! releases (previewed for the audit record, persisted, then sent), and the
//! `release after` deadlines. The latches themselves are `crate::latches`.

use std::collections::BTreeSet;

use gov_proto::v1 as pb;

use super::{Agent, AgentKey, Outbox, Outgoing, State};
use crate::latches;
use crate::store::{Persisted, TripKind};

impl State {
    /// The latches `hello` reports that govd released while the agent was
    /// away (tripped no later than the release): it gets the release, not a
    /// new trip.
    pub(super) fn missed_releases(&self, hello: &pb::Hello) -> BTreeSet<(TripKind, String)> {
        hello
            .latches
            .iter()
            .filter(|l| {
                let k = trip_kind(l.kind());
                !self.latches.contains(k, &l.rule)
                    && self
                        .released
                        .get(&(k, l.rule.clone()))
                        .is_some_and(|&at| at >= l.since_unix_ms)
            })
            .map(|l| (trip_kind(l.kind()), l.rule.clone()))
            .collect()
    }

    /// Queues the releases `key` missed and remembers them until its stats
    /// say they are done.
    pub(super) fn send_missed(
        &mut self,
        key: &AgentKey,
        missed: BTreeSet<(TripKind, String)>,
        out: &mut Outbox,
    ) {
        let Some(agent) = self.agents.get_mut(key) else {
            return;
        };
        if let Some(conn) = &agent.conn {
            for (kind, rule) in &missed {
                tracing::info!(%rule, instance = %key.1, kind = kind.as_str(), "sending a release the agent missed while away");
                out.push(Outgoing {
                    key: key.clone(),
                    conn: conn.id,
                    tx: conn.tx.clone(),
                    msg: release_message(
                        *kind,
                        rule,
                        "govd (a release made while this agent was away)",
                    ),
                });
            }
        }
        agent.releasing = missed;
    }

    /// Queues an `Arm` command for every latch of `key`'s service that this
    /// instance held (or was marked as not enforcing) and that is not in `held`.
    pub(super) fn rearm(
        &self,
        key: &AgentKey,
        held: &BTreeSet<(TripKind, String)>,
        out: &mut Outbox,
    ) {
        let Some(conn) = self.agents.get(key).and_then(|a| a.conn.as_ref()) else {
            return;
        };
        let (service, instance) = key;
        for trip in self.latches.iter() {
            let ours = trip.rule.split_once('/').map(|(s, _)| s) == Some(service.as_str());
            let held_here =
                trip.instances.contains(instance) || trip.not_enforced.contains(instance);
            if !ours || !held_here || held.contains(&(trip.kind, trip.rule.clone())) {
                continue;
            }
            tracing::info!(rule = %trip.rule, %instance, kind = trip.kind.as_str(), "re-arming a latch the agent lost");
            let latch = pb::Latch {
                kind: match trip.kind {
                    TripKind::Fuse => pb::ReleaseKind::Fuse,
                    TripKind::Limit => pb::ReleaseKind::Limit,
                } as i32,
                rule: trip.rule.clone(),
                key: String::new(),
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
    pub fn release_preview(&self, kind: TripKind, rule: &str) -> (bool, Vec<String>) {
        let service = rule.split_once('/').map_or("", |(s, _)| s);
        let mut was = self.latches.contains(kind, rule);
        let mut notified = Vec::new();
        for a in self.connected(service) {
            was |= reports_tripped(a, kind, rule);
            notified.push(a.instance.clone());
        }
        (was, notified)
    }

    /// What `state.json` holds once `rule` is released.
    pub fn persisted_without(&self, kind: TripKind, rule: &str, now: u64) -> Persisted {
        let mut p = self.to_persisted();
        p.trips.retain(|t| !(t.kind == kind && t.rule == rule));
        p.releases.retain(|r| !(r.kind == kind && r.rule == rule));
        p.releases.push(crate::store::Released {
            kind,
            rule: rule.to_owned(),
            at_unix_ms: now,
        });
        p
    }

    /// Queues a release command to every connected agent of the rule's
    /// service and forgets the trip. Returns (was tripped, instances notified).
    // INVARIANT: called only after `persisted_without(kind, rule)` is on
    // disk and the release is in the audit log.
    pub fn release(
        &mut self,
        kind: TripKind,
        rule: &str,
        who: &str,
        now: u64,
        out: &mut Outbox,
    ) -> (bool, Vec<String>) {
        let service = rule.split_once('/').map_or("", |(s, _)| s).to_owned();
        self.released.insert((kind, rule.to_owned()), now);
        let mut was = self.latches.remove(kind, rule);
        let mut notified = Vec::new();
        for a in self.connected(&service) {
            was |= reports_tripped(a, kind, rule);
            if let Some(conn) = &a.conn {
                out.push(Outgoing {
                    key: (a.service.clone(), a.instance.clone()),
                    conn: conn.id,
                    tx: conn.tx.clone(),
                    msg: release_message(kind, rule, who),
                });
                notified.push(a.instance.clone());
            }
        }
        (was, notified)
    }

    /// The automatic recovery delay of fuse `rule` (`None`: manual).
    pub fn fuse_recovery(&self, rule: &str) -> Option<u64> {
        latches::fuse_recovery(self.bundle(), rule)
    }

    /// Limits whose `release after` deadline has passed.
    pub fn expired(&self, now: u64) -> Vec<String> {
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

/// The command that releases `rule` on an agent.
pub(super) fn release_message(kind: TripKind, rule: &str, who: &str) -> pb::ControlMessage {
    let cmd = pb::ReleaseCommand {
        kind: match kind {
            TripKind::Fuse => pb::ReleaseKind::Fuse,
            TripKind::Limit => pb::ReleaseKind::Limit,
        } as i32,
        rule: rule.to_owned(),
        who: who.to_owned(),
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

/// Whether `agent`'s stats say `rule` is tripped (stats may know of a trip
/// the events did not tell).
fn reports_tripped(agent: &Agent, kind: TripKind, rule: &str) -> bool {
    agent.stats.as_ref().is_some_and(|s| {
        s.rules.iter().any(|r| {
            r.rule == rule
                && match kind {
                    TripKind::Fuse => r.fuse_state() != pb::FuseState::Closed,
                    TripKind::Limit => r.limit_engaged,
                }
        })
    })
}
