//! The registry of record: which instances are registered (connected,
//! with an address, WARMING or READY), the endpoint sets pushed to every
//! agent, and deregistrations waiting for every caller's acknowledgement.
//! [`Registry`] owns what changed and the set versions; it reads and marks
//! the agents it is given.

use std::collections::{BTreeMap, BTreeSet};

use gov_proto::v1 as pb;

use super::agent::{Agent, AgentKey, Agents, Outbox, Removal};
use crate::encoded::Encoded;

/// The endpoint sets: what changed since the last push, and each
/// service's set version.
#[derive(Debug, Default)]
pub(super) struct Registry {
    /// Services whose set of registered instances (or a weight) changed since
    /// the last [`Registry::pushes`].
    changed: BTreeSet<String>,
    /// The version of each service's last pushed endpoint set.
    versions: BTreeMap<String, u64>,
}

pub(super) fn endpoints_message(endpoints: pb::Endpoints) -> pb::ControlMessage {
    pb::ControlMessage {
        msg: Some(pb::control_message::Msg::Endpoints(endpoints)),
    }
}

impl Registry {
    /// `service`'s set changed: pushed on the next [`Registry::pushes`].
    pub(super) fn changed(&mut self, service: &str) {
        self.changed.insert(service.to_owned());
    }

    /// Every service whose endpoint set ever changed: those that may have
    /// a registered instance (a registration is a change).
    pub(super) fn services(&self) -> impl Iterator<Item = &String> {
        self.versions.keys().chain(&self.changed)
    }

    /// The registered instances of `service` among `agents` (govd is the
    /// registry of record): connected agents whose lifecycle says WARMING
    /// (registered, ramping up) or READY, with the address their inbound
    /// listener has and their weight.
    pub(super) fn endpoints(&self, agents: &Agents, service: &str) -> pb::Endpoints {
        pb::Endpoints {
            service: service.to_owned(),
            version: self.versions.get(service).copied().unwrap_or(0),
            instances: agents
                .range((service.to_owned(), String::new())..)
                .map(|(_, a)| a)
                .take_while(|a| a.service == service)
                .filter(|a| a.is_registered())
                .map(|a| pb::Instance {
                    instance: a.instance.clone(),
                    address: a.address.clone(),
                    phase: a.phase as i32,
                    weight_milli_percent: a.weight_milli_percent,
                    mtls: a.mtls,
                })
                .collect(),
        }
    }

    /// Queues to every connected agent the endpoints of each service whose set
    /// changed since the last call (a registration, a deregistration, a lost
    /// stream, a new weight).
    pub(super) fn pushes(&mut self, agents: &mut Agents, out: &mut Outbox) {
        for service in std::mem::take(&mut self.changed) {
            let version = self.versions.entry(service.clone()).or_insert(0);
            *version += 1;
            let version = *version;
            for agent in agents.values_mut() {
                if agent.service == service && agent.removal == Some(Removal::Pending) {
                    agent.removal = Some(Removal::Pushed(version));
                }
            }
            // Encoded once: every stream sends the same bytes.
            let msg = Encoded::new(&endpoints_message(self.endpoints(agents, &service)));
            out.extend(agents.values().filter_map(|a| a.outgoing(msg.clone())));
        }
        confirm_removals(agents, out);
    }
}

/// The connected agents (`service/instance`) that have not acknowledged
/// the endpoint set of `agent`'s service without it, while it is being
/// removed (empty otherwise): what its `wait for gov` step waits for.
pub(super) fn removal_waiting_on(agents: &Agents, agent: &Agent) -> Vec<String> {
    let version = match agent.removal {
        None | Some(Removal::Done) => return Vec::new(),
        // Not pushed yet: nobody has it.
        Some(Removal::Pending) => u64::MAX,
        Some(Removal::Pushed(v)) => v,
    };
    not_acked(agents, agent, version)
        .map(|a| format!("{}/{}", a.service, a.instance))
        .collect()
}

/// The connected agents other than `me` that have not acknowledged
/// version `version` of `me`'s service's endpoint set.
fn not_acked<'a>(
    agents: &'a Agents,
    me: &'a Agent,
    version: u64,
) -> impl Iterator<Item = &'a Agent> {
    agents.values().filter(move |a| {
        !(a.service == me.service && a.instance == me.instance)
            && a.conn.is_some()
            && a.endpoints_acked
                .get(&me.service)
                .is_none_or(|&got| got < version)
    })
}

/// Tells each deregistered instance whose removal every other connected
/// agent has acknowledged (its `wait for gov` step ends).
fn confirm_removals(agents: &mut Agents, out: &mut Outbox) {
    let done: Vec<(AgentKey, u64)> = agents
        .iter()
        .filter_map(|(key, a)| match a.removal {
            Some(Removal::Pushed(v)) if not_acked(agents, a, v).next().is_none() => {
                Some((key.clone(), v))
            }
            _ => None,
        })
        .collect();
    for (key, version) in done {
        let Some(agent) = agents.get_mut(&key) else {
            continue;
        };
        agent.removal = Some(Removal::Done);
        out.extend(agent.outgoing(Encoded::new(&pb::ControlMessage {
            msg: Some(pb::control_message::Msg::Command(pb::Command {
                kind: Some(pb::command::Kind::Deregistered(pb::Deregistered {
                    version,
                })),
            })),
        })));
    }
}
