//! The registry of record: which instances are registered (connected,
//! with an address, WARMING or READY), the endpoint sets pushed to every
//! agent, and deregistrations waiting for every caller's acknowledgement.
//! [`Registry`] owns what changed, the set versions and the last set pushed
//! of each service; it reads and marks the agents it is given.
//!
//! A change of one instance goes as an `EndpointsDelta` (what joined or
//! changed, what left) to each agent that said it applies deltas and whose
//! last `EndpointsAck` of the service is the version before; every other
//! agent gets the whole `Endpoints` (issue 35). Each version is encoded once,
//! full and delta, whatever the number of agents it goes to.

use std::collections::{BTreeMap, BTreeSet};

use gov_proto::v1 as pb;

use super::agent::{Agent, AgentKey, Outbox, Removal};
use super::agents::Agents;
use crate::encoded::Encoded;

/// The endpoint sets: what changed since the last push, and each
/// service's last pushed set.
#[derive(Debug, Default)]
pub(super) struct Registry {
    /// Services whose set of registered instances (or a weight) changed since
    /// the last [`Registry::pushes`].
    changed: BTreeSet<String>,
    /// The last set pushed of each service, with its version.
    sets: BTreeMap<String, Pushed>,
    /// Agents that asked for a service's full set (they could not apply a
    /// delta): sent on the next [`Registry::pushes`].
    resend: BTreeSet<(AgentKey, String)>,
}

/// One service's set as last pushed: what a delta is computed from and what
/// a full set (to a new stream, or one that asks) says, so that every agent
/// holding version `v` holds the same instances.
#[derive(Debug)]
struct Pushed {
    version: u64,
    /// By instance id.
    instances: BTreeMap<String, pb::Instance>,
    /// This version as a whole `Endpoints`, encoded once.
    full: Encoded,
}

fn endpoints_message(endpoints: pb::Endpoints) -> pb::ControlMessage {
    pb::ControlMessage {
        msg: Some(pb::control_message::Msg::Endpoints(endpoints)),
    }
}

/// The whole set `instances` of `service` at `version`, encoded.
fn full(service: &str, version: u64, instances: &BTreeMap<String, pb::Instance>) -> Encoded {
    Encoded::new(&endpoints_message(pb::Endpoints {
        service: service.to_owned(),
        version,
        instances: instances.values().cloned().collect(),
    }))
}

/// What changed from `base` to `now` (version `version`), encoded.
fn delta(
    service: &str,
    version: u64,
    base: &Pushed,
    now: &BTreeMap<String, pb::Instance>,
) -> Encoded {
    let upserted = now
        .iter()
        .filter(|(id, i)| base.instances.get(*id) != Some(*i))
        .map(|(_, i)| i.clone())
        .collect();
    let removed = base
        .instances
        .keys()
        .filter(|id| !now.contains_key(*id))
        .cloned()
        .collect();
    Encoded::new(&pb::ControlMessage {
        msg: Some(pb::control_message::Msg::EndpointsDelta(
            pb::EndpointsDelta {
                service: service.to_owned(),
                version,
                base_version: base.version,
                upserted,
                removed,
            },
        )),
    })
}

impl Registry {
    /// `service`'s set changed: pushed on the next [`Registry::pushes`].
    pub(super) fn changed(&mut self, service: &str) {
        self.changed.insert(service.to_owned());
    }

    /// `key` could not apply a delta of `service`: its full set goes on the
    /// next [`Registry::pushes`].
    pub(super) fn resend(&mut self, key: &AgentKey, service: &str) {
        self.resend.insert((key.clone(), service.to_owned()));
    }

    /// The full sets a new stream is sent with its hello: every service's
    /// last pushed set, encoded once per version. An empty one too: it
    /// clears what the agent kept from before, and its ACK is what a
    /// removal of that service's last instance waits for.
    pub(super) fn fulls(&self) -> impl Iterator<Item = &Encoded> {
        self.sets.values().map(|p| &p.full)
    }

    /// The registered instances of `service` among `agents` (govd is the
    /// registry of record): connected agents whose lifecycle says WARMING
    /// (registered, ramping up) or READY, with the address their inbound
    /// listener has and their weight.
    pub(super) fn endpoints(&self, agents: &Agents, service: &str) -> pb::Endpoints {
        pb::Endpoints {
            service: service.to_owned(),
            version: self.sets.get(service).map_or(0, |p| p.version),
            instances: registered(agents, service).into_values().collect(),
        }
    }

    /// Queues to every connected agent the endpoints of each service whose set
    /// changed since the last call (a registration, a deregistration, a lost
    /// stream, a new weight): a delta to an agent that applies deltas and
    /// acknowledged the version before, else the whole set; then the whole
    /// sets agents asked for.
    pub(super) fn pushes(&mut self, agents: &mut Agents, out: &mut Outbox) {
        for service in std::mem::take(&mut self.changed) {
            let instances = registered(agents, &service);
            let base = self.sets.remove(&service);
            let version = base.as_ref().map_or(0, |p| p.version) + 1;
            for agent in agents.values_mut() {
                if agent.service == service && agent.removal == Some(Removal::Pending) {
                    agent.removal = Some(Removal::Pushed(version));
                }
            }
            // Encoded once each: every stream sends the same bytes.
            let full = full(&service, version, &instances);
            // A delta as large as the set (most instances changed) is not sent.
            let delta = base
                .map(|b| (b.version, delta(&service, version, &b, &instances)))
                .filter(|(_, d)| d.len() < full.len());
            out.extend(agents.values().filter_map(|a| {
                let msg = match &delta {
                    Some((base, d)) if takes_delta(a, &service, *base) => d.clone(),
                    _ => full.clone(),
                };
                a.outgoing(msg)
            }));
            let pushed = Pushed {
                version,
                instances,
                full,
            };
            self.sets.insert(service, pushed);
        }
        for (key, service) in std::mem::take(&mut self.resend) {
            let Some(agent) = agents.get(&key) else {
                continue;
            };
            let acked = agent.endpoints_acked.get(&service).copied();
            let msg = match self.sets.get(&service) {
                // It acknowledged this version already: an ask is not a
                // reason to send the set again (nor a way to have it sent
                // over and over).
                Some(p) if acked >= Some(p.version) => continue,
                Some(p) => p.full.clone(),
                // Never pushed: govd knows no instance of it.
                None => full(&service, 0, &BTreeMap::new()),
            };
            out.extend(agent.outgoing(msg));
        }
        confirm_removals(agents, out);
    }
}

/// Whether `agent` is sent the delta onto `base` of `service`: it applies
/// deltas and its last acknowledgement of the service on this stream is
/// `base` (an ACK lost or not yet arrived: the whole set).
fn takes_delta(agent: &Agent, service: &str, base: u64) -> bool {
    agent.endpoint_deltas && agent.endpoints_acked.get(service) == Some(&base)
}

/// The registered instances of `service` among `agents`, by instance id.
fn registered(agents: &Agents, service: &str) -> BTreeMap<String, pb::Instance> {
    agents
        .of_service(service)
        .filter(|a| a.is_registered())
        .map(|a| {
            let instance = pb::Instance {
                instance: a.instance.clone(),
                address: a.address.clone(),
                phase: a.phase as i32,
                weight_milli_percent: a.weight_milli_percent,
                mtls: a.mtls,
            };
            (a.instance.clone(), instance)
        })
        .collect()
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

#[cfg(test)]
mod tests;
