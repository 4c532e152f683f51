//! The registry of record: which instances are registered (connected,
//! with an address, WARMING or READY), the endpoint sets pushed to every
//! agent, and deregistrations waiting for every caller's acknowledgement.

use gov_proto::v1 as pb;

use super::{Agent, AgentKey, Outbox, Outgoing, State};

/// A deregistration waiting for every agent's acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Removal {
    /// The set without the instance is not pushed yet.
    Pending,
    /// Pushed as this version.
    Pushed(u64),
    /// Every caller acknowledged it and the instance was told. Kept (until
    /// the instance leaves DRAINING or its stream ends) so that DRAINING said
    /// again, as the `drain` step does after `wait for gov`, starts nothing.
    Done,
}

pub(super) fn endpoints_message(endpoints: pb::Endpoints) -> pb::ControlMessage {
    pb::ControlMessage {
        msg: Some(pb::control_message::Msg::Endpoints(endpoints)),
    }
}

impl State {
    /// The registered instances of `service` (govd is the registry of record):
    /// connected agents whose lifecycle says WARMING (registered, ramping up) or
    /// READY, with the address their inbound listener has and their weight.
    pub fn endpoints(&self, service: &str) -> pb::Endpoints {
        pb::Endpoints {
            service: service.to_owned(),
            version: self.endpoints_version.get(service).copied().unwrap_or(0),
            instances: self
                .agents
                .values()
                .filter(|a| a.service == service && a.is_registered())
                .map(|a| pb::Instance {
                    instance: a.instance.clone(),
                    address: a.address.clone(),
                    phase: a.phase as i32,
                    weight_milli_percent: a.weight_milli_percent,
                })
                .collect(),
        }
    }

    /// Queues to every connected agent the endpoints of each service whose set
    /// changed since the last call (a registration, a deregistration, a lost
    /// stream, a new weight).
    pub fn endpoint_pushes(&mut self, out: &mut Outbox) {
        for service in std::mem::take(&mut self.endpoints_changed) {
            let version = self.endpoints_version.entry(service.clone()).or_insert(0);
            *version += 1;
            let version = *version;
            for agent in self.agents.values_mut() {
                if agent.service == service && agent.removal == Some(Removal::Pending) {
                    agent.removal = Some(Removal::Pushed(version));
                }
            }
            let msg = endpoints_message(self.endpoints(&service));
            for (key, agent) in &self.agents {
                if let Some(conn) = &agent.conn {
                    out.push(Outgoing {
                        key: key.clone(),
                        conn: conn.id,
                        tx: conn.tx.clone(),
                        msg: msg.clone(),
                    });
                }
            }
        }
        self.confirm_removals(out);
    }

    /// The connected agents (`service/instance`) that have not acknowledged
    /// the endpoint set of `agent`'s service without it, while it is being
    /// removed (empty otherwise): what its `wait for gov` step waits for.
    pub fn removal_waiting_on(&self, agent: &Agent) -> Vec<String> {
        let version = match agent.removal {
            None | Some(Removal::Done) => return Vec::new(),
            // Not pushed yet: nobody has it.
            Some(Removal::Pending) => u64::MAX,
            Some(Removal::Pushed(v)) => v,
        };
        self.not_acked(agent, version)
            .map(|a| format!("{}/{}", a.service, a.instance))
            .collect()
    }

    /// The connected agents other than `me` that have not acknowledged
    /// version `version` of `me`'s service's endpoint set.
    fn not_acked<'a>(&'a self, me: &'a Agent, version: u64) -> impl Iterator<Item = &'a Agent> {
        self.agents.values().filter(move |a| {
            !(a.service == me.service && a.instance == me.instance)
                && a.conn.is_some()
                && a.endpoints_acked
                    .get(&me.service)
                    .is_none_or(|&got| got < version)
        })
    }

    /// Tells each deregistered instance whose removal every other connected
    /// agent has acknowledged (its `wait for gov` step ends).
    fn confirm_removals(&mut self, out: &mut Outbox) {
        let done: Vec<(AgentKey, u64)> = self
            .agents
            .iter()
            .filter_map(|(key, a)| match a.removal {
                Some(Removal::Pushed(v)) if self.not_acked(a, v).next().is_none() => {
                    Some((key.clone(), v))
                }
                _ => None,
            })
            .collect();
        for (key, version) in done {
            let Some(agent) = self.agents.get_mut(&key) else {
                continue;
            };
            agent.removal = Some(Removal::Done);
            if let Some(conn) = &agent.conn {
                out.push(Outgoing {
                    key: key.clone(),
                    conn: conn.id,
                    tx: conn.tx.clone(),
                    msg: pb::ControlMessage {
                        msg: Some(pb::control_message::Msg::Command(pb::Command {
                            kind: Some(pb::command::Kind::Deregistered(pb::Deregistered {
                                version,
                            })),
                        })),
                    },
                });
            }
        }
    }
}
