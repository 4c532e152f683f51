//! Latches: tripped fuses and engaged limits, as the control plane knows
//! them from its agents' events and stats, with absolute deadlines for
//! limits that release themselves. Plain data, owned by `State`.

use std::collections::BTreeMap;

use gov_proto::v1 as pb;

use crate::store::{Trip, TripKind};

/// Every tripped fuse and engaged limit, by kind and `service/rule`.
#[derive(Debug, Default)]
pub struct Latches {
    trips: BTreeMap<(TripKind, String), Trip>,
}

// === impl Latches ===

impl Latches {
    pub fn from_trips(trips: Vec<Trip>) -> Self {
        Self {
            trips: trips
                .into_iter()
                .map(|t| ((t.kind, t.rule.clone()), t))
                .collect(),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Trip> {
        self.trips.values()
    }

    pub fn contains(&self, kind: TripKind, rule: &str) -> bool {
        self.trips.contains_key(&(kind, rule.to_owned()))
    }

    /// Forgets `rule` (released); whether it was tripped.
    pub fn remove(&mut self, kind: TripKind, rule: &str) -> bool {
        self.trips.remove(&(kind, rule.to_owned())).is_some()
    }

    /// Records a fuse/limit event of an agent of `service`. Events about
    /// rules of another service are ignored: an agent speaks for itself only.
    pub fn on_event(
        &mut self,
        policy: Option<&pb::Bundle>,
        service: &str,
        instance: &str,
        event: &pb::Event,
        now: u64,
    ) -> bool {
        if event.rule.split_once('/').map(|(s, _)| s) != Some(service) {
            tracing::warn!(service, instance, rule = %event.rule, "ignoring an event about another service's rule");
            return false;
        }
        let at = if event.at_unix_ms == 0 {
            now
        } else {
            event.at_unix_ms
        };
        match event.kind() {
            pb::EventKind::FuseTripped | pb::EventKind::FuseHalfOpen => {
                let half_open = event.kind() == pb::EventKind::FuseHalfOpen;
                let trip = self.trip(TripKind::Fuse, &event.rule, at, &event.reason);
                trip.instances.insert(instance.to_owned());
                trip.half_open = half_open;
                if !half_open {
                    trip.reason.clone_from(&event.reason);
                }
                true
            }
            pb::EventKind::LimitEngaged => {
                let deadline = release_after(policy, &event.rule).map(|ms| at.saturating_add(ms));
                let trip = self.trip(TripKind::Limit, &event.rule, at, &event.reason);
                trip.instances.insert(instance.to_owned());
                if trip.deadline_unix_ms.is_none() {
                    trip.deadline_unix_ms = deadline;
                }
                true
            }
            pb::EventKind::FuseReleased => self.untrip(TripKind::Fuse, &event.rule, instance),
            pb::EventKind::LimitReleased => self.untrip(TripKind::Limit, &event.rule, instance),
            pb::EventKind::Unspecified => false,
        }
    }

    fn trip(&mut self, kind: TripKind, rule: &str, at: u64, reason: &str) -> &mut Trip {
        self.trips
            .entry((kind, rule.to_owned()))
            .or_insert_with(|| Trip {
                kind,
                rule: rule.to_owned(),
                since_unix_ms: at,
                reason: reason.to_owned(),
                half_open: false,
                deadline_unix_ms: None,
                instances: Default::default(),
            })
    }

    fn untrip(&mut self, kind: TripKind, rule: &str, instance: &str) -> bool {
        let k = (kind, rule.to_owned());
        let Some(trip) = self.trips.get_mut(&k) else {
            return false;
        };
        trip.instances.remove(instance);
        if trip.instances.is_empty() {
            self.trips.remove(&k);
        }
        true
    }

    /// Stats are the agents' truth: a fuse an agent reports open is tripped
    /// (an event may have been lost), one it reports closed is not tripped
    /// on that agent any more.
    pub fn reconcile(
        &mut self,
        policy: Option<&pb::Bundle>,
        service: &str,
        instance: &str,
        stats: &pb::Stats,
        now: u64,
    ) -> bool {
        let mut changed = false;
        for r in &stats.rules {
            if r.rule.split_once('/').map(|(s, _)| s) != Some(service) {
                continue;
            }
            match r.kind() {
                pb::RuleKind::Fuse => {
                    let open = r.fuse_state() != pb::FuseState::Closed;
                    let tripped = self
                        .trips
                        .get(&(TripKind::Fuse, r.rule.clone()))
                        .is_some_and(|t| t.instances.contains(instance));
                    if open && !tripped {
                        let trip =
                            self.trip(TripKind::Fuse, &r.rule, now, "reported open by the agent");
                        trip.instances.insert(instance.to_owned());
                        changed = true;
                    } else if !open && tripped {
                        changed |= self.untrip(TripKind::Fuse, &r.rule, instance);
                    }
                }
                pb::RuleKind::Limit => {
                    let tripped = self
                        .trips
                        .get(&(TripKind::Limit, r.rule.clone()))
                        .is_some_and(|t| t.instances.contains(instance));
                    if r.limit_engaged && !tripped {
                        let deadline =
                            release_after(policy, &r.rule).map(|ms| now.saturating_add(ms));
                        let trip = self.trip(
                            TripKind::Limit,
                            &r.rule,
                            now,
                            "reported engaged by the agent",
                        );
                        trip.instances.insert(instance.to_owned());
                        if trip.deadline_unix_ms.is_none() {
                            trip.deadline_unix_ms = deadline;
                        }
                        changed = true;
                    } else if !r.limit_engaged && tripped {
                        changed |= self.untrip(TripKind::Limit, &r.rule, instance);
                    }
                }
                _ => {}
            }
        }
        changed
    }

    /// Limits whose `release after` deadline has passed.
    pub fn expired(&self, now: u64) -> Vec<String> {
        self.trips
            .values()
            .filter(|t| t.kind == TripKind::Limit && t.deadline_unix_ms.is_some_and(|d| d <= now))
            .map(|t| t.rule.clone())
            .collect()
    }

    /// The earliest limit deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        self.trips.values().filter_map(|t| t.deadline_unix_ms).min()
    }
}

/// The `release after` of limit `rule`, if it has one.
pub fn release_after(policy: Option<&pb::Bundle>, rule: &str) -> Option<u64> {
    let (service, _) = rule.split_once('/')?;
    let limit = target(policy, service)?
        .limits
        .iter()
        .find(|l| l.rule == rule)?;
    match limit.release.as_ref()?.kind.as_ref()? {
        pb::release::Kind::AfterMs(ms) => Some(*ms),
        pb::release::Kind::Manual(_) => None,
    }
}

/// The automatic recovery delay of fuse `rule` (`None`: manual).
pub fn fuse_recovery(policy: Option<&pb::Bundle>, rule: &str) -> Option<u64> {
    let (service, _) = rule.split_once('/')?;
    let fuse = target(policy, service)?
        .fuses
        .iter()
        .find(|f| f.rule == rule)?;
    match fuse.recover.as_ref()?.kind.as_ref()? {
        pb::recovery::Kind::After(a) => Some(a.after_ms),
        pb::recovery::Kind::Manual(_) => None,
    }
}

fn target<'a>(policy: Option<&'a pb::Bundle>, service: &str) -> Option<&'a pb::TargetConfig> {
    policy?.targets.iter().find(|t| t.service == service)
}
