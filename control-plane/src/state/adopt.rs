//! Taking in a state another govd replica stored (`--store etcd://`): its
//! policy is pushed to this replica's agents of the services whose config
//! changed, its releases are sent to this replica's agents, and its latches
//! are merged with those this replica's agents reported.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Outbox, State};
use crate::latches::{LatchId, Latches};
use crate::store::{Persisted, Trip};

/// What [`State::adopt`] changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// The policy in force is another one.
    pub policy: bool,
}

impl State {
    /// Takes `stored` (written by another replica) in: see the module doc.
    /// A latch this replica holds that `stored` lacks is kept unless it was
    /// released since it tripped (it is then this replica's to write).
    pub fn adopt(&mut self, stored: Persisted, out: &mut Outbox) -> Adopted {
        for r in &stored.releases {
            let id: LatchId = (r.kind, r.rule.clone(), r.key.clone());
            if self.released.get(&id).is_some_and(|&at| at >= r.at_unix_ms) {
                continue;
            }
            let key = (!r.key.is_empty()).then_some(r.key.as_str());
            self.release(
                r.kind,
                &r.rule,
                key,
                "govd (a release made through another replica)",
                r.at_unix_ms,
                out,
            );
        }
        let mut merged: BTreeMap<LatchId, Trip> = stored
            .trips
            .into_iter()
            .map(|t| ((t.kind, t.rule.clone(), t.key.clone()), t))
            .collect();
        for local in self.latches.iter() {
            let id: LatchId = (local.kind, local.rule.clone(), local.key.clone());
            match merged.get_mut(&id) {
                Some(trip) => {
                    trip.instances.extend(local.instances.iter().cloned());
                    trip.not_enforced.extend(local.not_enforced.iter().cloned());
                }
                None if !self.released_since(&id, local.since_unix_ms) => {
                    merged.insert(id, local.clone());
                }
                None => {}
            }
        }
        self.latches = Latches::from_trips(merged.into_values().collect());
        self.history = stored.history.into();

        let before = self.applied.take();
        self.applied = stored.applied.map(Arc::new);
        let changed = changed_services(before.as_deref(), self.applied.as_deref());
        let keys: Vec<_> = self
            .agents
            .iter()
            .filter(|(k, a)| a.conn.is_some() && changed.contains(&k.0))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            self.push(&key, out);
        }
        Adopted {
            policy: before.map(|p| p.version.clone())
                != self.applied.as_ref().map(|p| p.version.clone()),
        }
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

/// The services whose config differs between two policies (a service in
/// one only included).
fn changed_services(
    before: Option<&crate::store::AppliedPolicy>,
    after: Option<&crate::store::AppliedPolicy>,
) -> Vec<String> {
    let versions = |p: Option<&crate::store::AppliedPolicy>| -> BTreeMap<String, String> {
        p.map(|p| {
            p.bundle
                .targets
                .iter()
                .map(|t| (t.service.clone(), t.version.clone()))
                .collect()
        })
        .unwrap_or_default()
    };
    let (a, b) = (versions(before), versions(after));
    a.keys()
        .chain(b.keys())
        .filter(|s| a.get(*s) != b.get(*s))
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use gov_proto::v1 as pb;
    use tokio::sync::mpsc;

    use super::*;
    use crate::store::{AppliedPolicy, Released, TripKind};

    fn policy(version: &str, order: &str) -> AppliedPolicy {
        AppliedPolicy {
            version: version.into(),
            who: "t".into(),
            at_unix_ms: 1,
            sources: vec![],
            shadow_since: Default::default(),
            bundle: pb::Bundle {
                targets: vec![
                    pb::TargetConfig {
                        version: order.into(),
                        ..gov_proto::compiled::target("order")
                    },
                    pb::TargetConfig {
                        version: "pay-1".into(),
                        ..gov_proto::compiled::target("payment")
                    },
                ],
                version: version.into(),
            },
        }
    }

    fn trip(rule: &str, since: u64, instance: &str) -> Trip {
        Trip {
            kind: TripKind::Fuse,
            rule: rule.into(),
            key: String::new(),
            since_unix_ms: since,
            reason: "errors".into(),
            half_open: false,
            deadline_unix_ms: None,
            instances: [instance.to_string()].into(),
            not_enforced: Default::default(),
        }
    }

    fn kinds(out: &Outbox) -> Vec<(String, &'static str)> {
        out.iter()
            .map(|o| {
                let what = match &o.msg.msg {
                    Some(pb::control_message::Msg::Config(_)) => "config",
                    Some(pb::control_message::Msg::Command(_)) => "command",
                    _ => "other",
                };
                (o.key.1.clone(), what)
            })
            .collect()
    }

    #[test]
    fn another_replicas_state_is_pushed_released_and_merged_without_losing_local_latches() {
        let mut s = State::from_persisted(Persisted {
            applied: Some(policy("v1", "order-1")),
            trips: vec![
                // Reported here, not yet written.
                trip("order/mine", 10, "o1"),
                // Reported here and released through another replica since.
                trip("order/released", 10, "o1"),
                // Reported here and elsewhere.
                trip("order/both", 10, "o1"),
            ],
            ..Persisted::default()
        });
        let (tx, _rx) = mpsc::channel(16);
        let hello = pb::Hello {
            service: "order".into(),
            instance: "o1".into(),
            last_version: "order-1".into(),
            ..Default::default()
        };
        s.hello(hello, tx, 1, &mut Vec::new());

        let mut out = Vec::new();
        let adopted = s.adopt(
            Persisted {
                applied: Some(policy("v2", "order-2")),
                trips: vec![trip("order/theirs", 20, "o9"), trip("order/both", 12, "o9")],
                releases: vec![Released {
                    kind: TripKind::Fuse,
                    rule: "order/released".into(),
                    key: String::new(),
                    at_unix_ms: 15,
                }],
                ..Persisted::default()
            },
            &mut out,
        );
        assert!(adopted.policy);
        assert_eq!(s.version(), "v2");
        // The release goes to this replica's agent, then the new config
        // (order changed; payment did not).
        assert_eq!(
            kinds(&out),
            [("o1".to_string(), "command"), ("o1".to_string(), "config")]
        );
        let latches: Vec<(String, Vec<String>)> = s
            .trips()
            .map(|t| (t.rule.clone(), t.instances.iter().cloned().collect()))
            .collect();
        assert_eq!(
            latches,
            [
                (
                    "order/both".to_string(),
                    vec!["o1".to_string(), "o9".to_string()]
                ),
                ("order/mine".to_string(), vec!["o1".to_string()]),
                ("order/theirs".to_string(), vec!["o9".to_string()]),
            ]
        );
        // Taking the same state in again changes nothing and sends nothing.
        let mut again = Vec::new();
        let same = s.adopt(
            Persisted {
                applied: Some(policy("v2", "order-2")),
                trips: s.trips().cloned().collect(),
                releases: vec![Released {
                    kind: TripKind::Fuse,
                    rule: "order/released".into(),
                    key: String::new(),
                    at_unix_ms: 15,
                }],
                ..Persisted::default()
            },
            &mut again,
        );
        assert!(!same.policy);
        assert!(again.is_empty(), "{:?}", kinds(&again));
    }
}
