//! Every agent govd knows, in slots, with an ordered index by key.
//!
//! An agent lives in a slot of a vector, which never moves it to another
//! slot while it is known; the index `(service, instance) -> slot` keeps
//! the key order that records, views, pruning and a service's range need.
//! A connected agent's stream holds its slot ([`Stream`]), so a message it
//! sends reaches its agent in O(1) instead of walking the index (an
//! O(log N) descent of string compares that missed the cache at 10,000
//! agents: issue 35). A freed slot is reused; a stream's connection id,
//! unique over govd's life, tells a slot's agent from a later one. Also the
//! records changed since the store last took them (`Dirty`).

use std::collections::{BTreeMap, BTreeSet};

use super::agent::{Agent, AgentKey};
use crate::store::AgentChanges;

/// Every agent known, by key and by slot.
#[derive(Debug, Default)]
pub(crate) struct Agents {
    by_key: BTreeMap<AgentKey, usize>,
    slots: Vec<Option<Agent>>,
    free: Vec<usize>,
}

/// How long an agent's name stays held by its stream after it was last
/// heard from (`State::live_claim`).
pub const LIVE_FOR_MS: u64 = 5_000;

/// Where one connected stream's agent lives: its key, its connection id and
/// its slot. Stale once the agent reconnects (another connection id) or is
/// forgotten: `Agents::of_stream` then finds nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    pub key: AgentKey,
    pub id: u64,
    slot: usize,
}

impl Stream {
    /// The slot of its agent.
    pub(super) fn slot(&self) -> usize {
        self.slot
    }
}

impl Agents {
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    pub(crate) fn contains_key(&self, key: &AgentKey) -> bool {
        self.by_key.contains_key(key)
    }

    pub(crate) fn get(&self, key: &AgentKey) -> Option<&Agent> {
        let slot = *self.by_key.get(key)?;
        self.slots.get(slot)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, key: &AgentKey) -> Option<&mut Agent> {
        let slot = *self.by_key.get(key)?;
        self.slots.get_mut(slot)?.as_mut()
    }

    /// The agent of `key`, made by `new` when there is none.
    pub(crate) fn get_or_insert_with(
        &mut self,
        key: &AgentKey,
        new: impl FnOnce() -> Agent,
    ) -> &mut Agent {
        match self.by_key.get(key) {
            Some(&slot) => self.slots[slot].get_or_insert_with(new),
            None => self.put(key.clone(), new()),
        }
    }

    /// Adds `agent` (a stored record), replacing one of the same key.
    pub(crate) fn insert(&mut self, agent: Agent) {
        let key = agent.key();
        match self.by_key.get(&key) {
            Some(&slot) => self.slots[slot] = Some(agent),
            None => {
                self.put(key, agent);
            }
        }
    }

    fn put(&mut self, key: AgentKey, agent: Agent) -> &mut Agent {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        self.by_key.insert(key, slot);
        self.slots[slot].insert(agent)
    }

    pub(crate) fn remove(&mut self, key: &AgentKey) -> Option<Agent> {
        let slot = self.by_key.remove(key)?;
        self.free.push(slot);
        self.slots.get_mut(slot)?.take()
    }

    /// Every agent, in key order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Agent> {
        self.iter().map(|(_, a)| a)
    }

    /// Every agent with its key, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&AgentKey, &Agent)> {
        self.by_key
            .iter()
            .filter_map(|(k, &slot)| Some((k, self.slots.get(slot)?.as_ref()?)))
    }

    /// Every agent, in no particular order.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut Agent> {
        self.slots.iter_mut().flatten()
    }

    /// The agents of `service`, in instance order (a range of the index).
    pub(crate) fn of_service<'a>(&'a self, service: &'a str) -> impl Iterator<Item = &'a Agent> {
        self.slots_of_service(service).map(|(_, a)| a)
    }

    /// [`Agents::of_service`] with each agent's slot.
    pub(crate) fn slots_of_service<'a>(
        &'a self,
        service: &'a str,
    ) -> impl Iterator<Item = (usize, &'a Agent)> {
        self.by_key
            .range((service.to_owned(), String::new())..)
            .take_while(move |(k, _)| k.0 == service)
            .filter_map(|(_, &slot)| Some((slot, self.slots.get(slot)?.as_ref()?)))
    }

    /// The slot of `key`'s agent.
    pub(crate) fn slot(&self, key: &AgentKey) -> Option<usize> {
        self.by_key.get(key).copied()
    }

    /// The agent in `slot`.
    pub(crate) fn at(&self, slot: usize) -> Option<&Agent> {
        self.slots.get(slot)?.as_ref()
    }

    /// The agent in `slot`, to change.
    pub(crate) fn at_mut(&mut self, slot: usize) -> Option<&mut Agent> {
        self.slots.get_mut(slot)?.as_mut()
    }

    /// The identity holding the name `service`/`instance` when it is not
    /// `identity` (see `State::held_by_another`).
    pub(crate) fn held_by_another(
        &self,
        service: &str,
        instance: &str,
        identity: &str,
    ) -> Option<&str> {
        let agent = self.get(&(service.to_owned(), instance.to_owned()))?;
        (!agent.identity.is_empty() && agent.identity != identity)
            .then_some(agent.identity.as_str())
    }

    /// How long ago the connected agent of `service`/`instance` was last heard
    /// from, if within [`LIVE_FOR_MS`] (see `State::live_claim`).
    pub(crate) fn live_claim(&self, service: &str, instance: &str, now: u64) -> Option<u64> {
        let agent = self.get(&(service.to_owned(), instance.to_owned()))?;
        let ago = now.saturating_sub(agent.last_seen_unix_ms);
        (agent.conn.is_some() && ago < LIVE_FOR_MS).then_some(ago)
    }

    /// Whether `service`/`instance` would be a new instance of a service with
    /// `max` already (connected or not).
    pub(crate) fn service_full(&self, service: &str, instance: &str, max: usize) -> bool {
        !self.contains_key(&(service.to_owned(), instance.to_owned()))
            && self.of_service(service).count() >= max
    }

    /// The handle of stream `id` of `key`, when it is the agent's stream now.
    pub(crate) fn stream(&self, key: &AgentKey, id: u64) -> Option<Stream> {
        let slot = *self.by_key.get(key)?;
        let stream = Stream {
            key: key.clone(),
            id,
            slot,
        };
        self.of_stream(&stream).is_some().then_some(stream)
    }

    /// The agent of `stream`, in O(1), while the stream is its current one.
    pub(crate) fn of_stream(&self, stream: &Stream) -> Option<&Agent> {
        let agent = self.slots.get(stream.slot)?.as_ref()?;
        agent
            .conn
            .as_ref()
            .is_some_and(|c| c.id == stream.id)
            .then_some(agent)
    }

    /// [`Agents::of_stream`], to change.
    pub(crate) fn of_stream_mut(&mut self, stream: &Stream) -> Option<&mut Agent> {
        let agent = self.slots.get_mut(stream.slot)?.as_mut()?;
        agent
            .conn
            .as_ref()
            .is_some_and(|c| c.id == stream.id)
            .then_some(agent)
    }
}

/// The agents whose stored record (address, labels, identity, last good
/// version) changed since the store last took them, and the names
/// forgotten since: what the next write of the agent registry holds, so
/// that an ACK costs a write of its own agent, not of every agent.
///
/// A changed agent is flagged (`Agent::record_changed`) and its slot listed
/// once: an ACK marks its agent in O(1), found by its stream's slot, with
/// no key cloned or compared (issue 35). A listed slot whose agent was
/// forgotten, or whose flag is clear, is skipped when taken; a new agent in
/// a reused slot lists it again when it changes.
#[derive(Debug, Default)]
pub(super) struct Dirty {
    changed: Vec<usize>,
    gone: BTreeSet<AgentKey>,
}

impl Dirty {
    /// The record of `agent`, in `slot`, changed.
    pub(super) fn touch(&mut self, agent: &mut Agent, slot: usize) {
        if !agent.record_changed {
            agent.record_changed = true;
            self.changed.push(slot);
        }
        if !self.gone.is_empty() {
            self.gone.remove(&agent.key());
        }
    }

    /// The record of `key`'s agent changed.
    pub(super) fn touch_key(&mut self, agents: &mut Agents, key: &AgentKey) {
        if let Some(slot) = agents.slot(key)
            && let Some(agent) = agents.at_mut(slot)
        {
            self.touch(agent, slot);
        }
    }

    /// `key` was forgotten.
    pub(super) fn forget(&mut self, key: &AgentKey) {
        self.gone.insert(key.clone());
    }

    /// The changes since the last call, as records of `agents` now, in the
    /// order the agents first changed.
    pub(super) fn take(&mut self, agents: &mut Agents) -> AgentChanges {
        let changed = std::mem::take(&mut self.changed)
            .into_iter()
            .filter_map(|slot| {
                let agent = agents.at_mut(slot)?;
                std::mem::take(&mut agent.record_changed).then(|| agent.record())
            })
            .collect();
        AgentChanges {
            changed,
            gone: std::mem::take(&mut self.gone).into_iter().collect(),
            live: agents.len(),
        }
    }

    /// `changes` were not written: they are taken again next time, unless
    /// the agent was forgotten since (or changed again since: then what it
    /// is now is written).
    pub(super) fn restore(&mut self, agents: &mut Agents, changes: &AgentChanges) {
        for a in &changes.changed {
            let key = (a.service.clone(), a.instance.clone());
            if !self.gone.contains(&key) {
                self.touch_key(agents, &key);
            }
        }
        for key in &changes.gone {
            if agents.get(key).is_none_or(|a| !a.record_changed) {
                self.gone.insert(key.clone());
            }
        }
    }
}

/// The agents of `services` (each service's a range of the map: an apply
/// to one service walks its agents only).
pub(super) fn of_services<'a>(
    agents: &'a Agents,
    services: &'a [String],
) -> impl Iterator<Item = &'a Agent> {
    slots_of_services(agents, services).map(|(_, a)| a)
}

/// [`of_services`] with each agent's slot.
pub(super) fn slots_of_services<'a>(
    agents: &'a Agents,
    services: &'a [String],
) -> impl Iterator<Item = (usize, &'a Agent)> {
    let mut services: Vec<&String> = services.iter().collect();
    services.sort_unstable();
    services.dedup();
    services
        .into_iter()
        .flat_map(move |service| agents.slots_of_service(service))
}

/// Forgets the agents not connected and not heard from for `retention_ms`
/// (see `State::prune`); returns their keys.
pub(super) fn prune(agents: &mut Agents, now: u64, retention_ms: u64) -> Vec<AgentKey> {
    let mut gone = Vec::new();
    for agent in agents.values_mut() {
        if agent.conn.is_some() {
            continue;
        }
        if agent.last_seen_unix_ms == 0 {
            agent.last_seen_unix_ms = now;
        }
        if now.saturating_sub(agent.last_seen_unix_ms) > retention_ms {
            gone.push(agent.key());
        }
    }
    gone.sort_unstable();
    for key in &gone {
        agents.remove(key);
    }
    gone
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::agent::Conn;

    fn connected(agents: &mut Agents, service: &str, instance: &str, id: u64) -> Stream {
        let key = (service.to_owned(), instance.to_owned());
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let agent = agents.get_or_insert_with(&key, || {
            Agent::new(service.to_owned(), instance.to_owned(), 0)
        });
        agent.conn = Some(Conn { id, tx });
        agents.stream(&key, id).expect("its stream")
    }

    #[test]
    fn a_stream_reaches_its_agent_until_it_reconnects_or_is_forgotten() {
        let mut agents = Agents::default();
        let a = connected(&mut agents, "svc", "a", 1);
        let b = connected(&mut agents, "svc", "b", 2);
        assert_eq!(agents.of_stream(&a).map(|a| a.instance.as_str()), Some("a"));
        assert_eq!(agents.of_stream(&b).map(|a| a.instance.as_str()), Some("b"));

        // A reconnect: the older stream finds nothing, the newer its agent.
        let a2 = connected(&mut agents, "svc", "a", 3);
        assert!(agents.of_stream(&a).is_none());
        assert!(agents.of_stream_mut(&a).is_none());
        assert!(agents.of_stream(&a2).is_some());
        assert!(agents.stream(&a.key, a.id).is_none());

        // Forgotten, its slot taken by another agent: still nothing.
        assert!(agents.remove(&a2.key).is_some());
        let c = connected(&mut agents, "other", "c", 4);
        assert_eq!(c.slot, a2.slot);
        assert!(agents.of_stream(&a2).is_none());
        assert_eq!(agents.of_stream(&c).map(|a| a.instance.as_str()), Some("c"));
    }

    #[test]
    fn agents_iterate_in_key_order_whatever_their_slots() {
        let mut agents = Agents::default();
        for (s, i) in [("b", "2"), ("a", "9"), ("b", "1"), ("a", "1"), ("c", "1")] {
            agents.insert(Agent::new(s.to_owned(), i.to_owned(), 0));
        }
        agents.remove(&("a".to_owned(), "9".to_owned()));
        agents.insert(Agent::new("a".to_owned(), "5".to_owned(), 0));
        let keys: Vec<AgentKey> = agents.values().map(Agent::key).collect();
        let names: Vec<String> = keys.iter().map(|(s, i)| format!("{s}/{i}")).collect();
        assert_eq!(names, ["a/1", "a/5", "b/1", "b/2", "c/1"]);
        let b: Vec<&str> = agents
            .of_service("b")
            .map(|a| a.instance.as_str())
            .collect();
        assert_eq!(b, ["1", "2"]);
        assert_eq!(agents.len(), 5);
        assert_eq!(agents.values_mut().count(), 5);
    }
}
