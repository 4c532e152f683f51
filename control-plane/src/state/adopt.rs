//! Taking in a state another govd replica stored (`--store etcd://`): its
//! policy is pushed to this replica's agents of the services whose config
//! changed ([`changed_services`]), its releases are sent to this replica's
//! agents, and its latches are merged with those this replica's agents
//! reported (`Latches::adopt`, delivered by `latch_agents.rs`).

use std::collections::{BTreeMap, BTreeSet};

use crate::store::AppliedPolicy;

/// What [`State::adopt`] changed.
///
/// [`State::adopt`]: super::State::adopt
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// The policy in force is another one.
    pub policy: bool,
}

/// The services whose config differs between two policies (a service in
/// one only included).
pub(super) fn changed_services(
    before: Option<&AppliedPolicy>,
    after: Option<&AppliedPolicy>,
) -> Vec<String> {
    let versions = |p: Option<&AppliedPolicy>| -> BTreeMap<String, String> {
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
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use gov_proto::v1 as pb;
    use tokio::sync::mpsc;

    use super::*;
    use crate::latch::{Latch, LatchKind, Released};
    use crate::state::{Outbox, State};
    use crate::store::Persisted;

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

    fn latch(rule: &str, since: u64, instance: &str) -> Latch {
        Latch {
            kind: LatchKind::Fuse,
            rule: rule.into(),
            key: String::new(),
            since_unix_ms: since,
            reason: "errors".into(),
            half_open: false,
            deadline_unix_ms: None,
            instances: [instance.to_string()].into(),
            not_enforced: Default::default(),
            reported_by: Default::default(),
        }
    }

    fn kinds(out: &Outbox) -> Vec<(String, &'static str)> {
        out.iter()
            .map(|o| {
                let what = match &o.msg.message().msg {
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
            latches: vec![
                // Reported here, not yet written.
                latch("order/mine", 10, "o1"),
                // Reported here and released through another replica since.
                latch("order/released", 10, "o1"),
                // Reported here and elsewhere.
                latch("order/both", 10, "o1"),
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
                latches: vec![
                    latch("order/theirs", 20, "o9"),
                    latch("order/both", 12, "o9"),
                ],
                releases: vec![Released {
                    kind: LatchKind::Fuse,
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
            .latches()
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
                latches: s.latches().cloned().collect(),
                releases: vec![Released {
                    kind: LatchKind::Fuse,
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
