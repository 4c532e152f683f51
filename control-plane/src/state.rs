//! The control plane's in-memory model: the applied policy, every agent with
//! its sync state, tripped fuses and engaged limits. Plain data with
//! synchronous methods, guarded by one mutex in `server.rs`; nothing here
//! awaits, so the lock is never held across a network call. Fields are
//! private: the applied policy changes only through [`State::commit`], which
//! the apply use case (`apply.rs`) calls once the new state is on disk.
//!
//! Sync state per agent follows xDS: a pushed config carries a nonce; the
//! agent's ACK or NACK names it. An agent is SYNCED only when its last ACK
//! is the current version of its service; a NACK is NEVER counted as
//! applied (istio#30498): it stays NACKED, with the reason and rule, and
//! keeps its last good version until it ACKs a later push.
//!
//! `State` holds its parts and says when each is used; each part owns its
//! data and never reaches back: `agent.rs` (one agent, what is queued to
//! it, its sync state), `agents.rs` (every agent, in slots an agent's
//! stream reaches in O(1), ordered by key; the records to write),
//! `registry.rs` (endpoint sets and removals),
//! `latch_agents.rs` (what the latches, `crate::latch`, send to agents),
//! `adopt.rs` (what another replica's state changes).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use gov_proto::v1 as pb;
use pb::agent_message::Msg as AgentMsg;

use crate::history::HistoryLimit;
use crate::latch::{self, Latch, LatchId, LatchKind, Latches};
use crate::store::{AgentChanges, AppliedPolicy, HistoryEntry, Persisted, StoredCanary};

mod adopt;
mod agent;
mod agents;
mod canary;
mod latch_agents;
mod registry;
pub mod versions;

pub use adopt::Adopted;
use agent::Conn;
pub use agent::{Agent, AgentKey, AgentTx, Nacked, Outbox, Outgoing, Unsaved};
use agents::{Agents, Dirty};
pub use agents::{LIVE_FOR_MS, Stream};
pub use canary::{Canary, pick as canary_instances};
use registry::Registry;

use crate::encoded::{Encoded, EncodedTargets};

/// Everything the control plane knows.
#[derive(Debug, Default)]
pub struct State {
    /// Shared with in-flight applies and dry runs, which plan against it
    /// without holding the lock.
    applied: Option<Arc<AppliedPolicy>>,
    history: VecDeque<HistoryEntry>,
    latches: Latches,
    agents: Agents,
    registry: Registry,
    /// Connected agents with a push not yet answered, per service: what
    /// [`State::settled`] reads in O(1) on every ACK.
    unanswered: BTreeMap<String, usize>,
    /// A canary apply running: its instances enforce its version.
    canary: Option<Canary>,
    /// Agent records to write (`Inner::persist_agents`).
    dirty: Dirty,
    next_conn: u64,
    next_nonce: u64,
    nonce_prefix: u32,
    /// Each config version encoded once for every agent it goes to.
    encoded: EncodedTargets,
}

/// What an agent message changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Effect {
    /// Sync state changed (wake `Apply` waiters).
    pub sync: bool,
    /// Fuse/limit state changed (persist now, wake the timer).
    pub trips: bool,
    /// Only stats changed (view at most once per second).
    pub stats: bool,
    /// Latch changes to append to the audit log.
    pub audits: latch::Audits,
    /// A service's registered instances changed: send
    /// [`State::endpoint_pushes`].
    pub endpoints: bool,
}

// === impl State ===

impl State {
    pub fn from_persisted(p: Persisted) -> Self {
        let mut state = State {
            applied: p.applied.map(Arc::new),
            history: p.history.into(),
            latches: Latches::new(p.latches, p.releases),
            canary: p.canary.map(Canary::new),
            nonce_prefix: rand::random(),
            ..State::default()
        };
        for a in p.agents {
            state.agents.insert(Agent::from_record(a));
        }
        state
    }

    pub fn to_persisted(&self) -> Persisted {
        Persisted {
            format: 0,
            applied: self.applied.as_deref().cloned(),
            history: self.history.iter().cloned().collect(),
            texts: BTreeMap::new(),
            releases: self.latches.releases(),
            latches: self.latches.iter().cloned().collect(),
            agents: self.agents.values().map(Agent::record).collect(),
            canary: self.canary.as_ref().map(|c| c.stored.clone()),
        }
    }

    /// The bundle version in force ("" before the first apply).
    pub fn version(&self) -> &str {
        self.applied.as_ref().map_or("", |a| a.version.as_str())
    }

    pub fn bundle(&self) -> Option<&pb::Bundle> {
        self.applied.as_ref().map(|a| &a.bundle)
    }

    /// The policy in force, shared (a plan made against it needs no lock).
    pub fn applied(&self) -> Option<Arc<AppliedPolicy>> {
        self.applied.clone()
    }

    /// Every agent known, connected or not.
    pub fn agents(&self) -> impl Iterator<Item = &Agent> {
        self.agents.values()
    }

    pub fn agent(&self, key: &AgentKey) -> Option<&Agent> {
        self.agents.get(key)
    }

    /// The latches: tripped fuses and engaged limits.
    pub fn latches(&self) -> impl Iterator<Item = &Latch> {
        self.latches.iter()
    }

    pub fn is_latched(&self, kind: LatchKind, rule: &str) -> bool {
        self.latches.contains(kind, rule, None)
    }

    /// Whether `version` is still in the kept history.
    pub fn in_history(&self, version: &str) -> bool {
        self.history.iter().any(|h| h.version == version)
    }

    /// Since when (Unix ms) `rule` has been in mode shadow; `None` when it
    /// is not in shadow.
    pub fn shadow_since(&self, rule: &str) -> Option<u64> {
        self.applied.as_ref()?.shadow_since.get(rule).copied()
    }

    pub fn target(&self, service: &str) -> Option<&pb::TargetConfig> {
        self.bundle()?.targets.iter().find(|t| t.service == service)
    }

    /// The version agents of `service` must enforce: `None` before any
    /// apply (nothing to push), `""` for a service the policy does not name
    /// (its agents get an empty config).
    pub fn current_version(&self, service: &str) -> Option<String> {
        self.applied.as_ref()?;
        Some(
            self.target(service)
                .map(|t| t.version.clone())
                .unwrap_or_default(),
        )
    }

    /// The config agent `key` must enforce: the canary's when it is on
    /// trial, else its service's in the policy in force.
    fn target_for(&self, key: &AgentKey) -> pb::TargetConfig {
        self.canary
            .as_ref()
            .filter(|c| c.on_trial(key))
            .and_then(|c| c.target(&key.0))
            .or_else(|| self.target(&key.0).cloned())
            .unwrap_or_else(|| gov_proto::compiled::target(&key.0))
    }

    /// The version agent `key` must enforce (see [`State::current_version`]).
    pub fn version_for(&self, key: &AgentKey) -> Option<String> {
        let current = self.current_version(&key.0)?;
        Some(match &self.canary {
            Some(c) if c.on_trial(key) => self.target_for(key).version,
            _ => current,
        })
    }

    fn nonce(&mut self) -> String {
        self.next_nonce += 1;
        format!("{:08x}-{}", self.nonce_prefix, self.next_nonce)
    }

    /// Queues the current config of `key`'s service to it, with a fresh
    /// nonce, and marks it STALE until it answers.
    fn push(&mut self, key: &AgentKey, out: &mut Outbox) {
        if let Some(slot) = self.agents.slot(key) {
            self.push_slot(slot, out);
        }
    }

    /// [`State::push`] to the agent in `slot` (no walk of the index: an
    /// apply pushes to every agent of its services).
    fn push_slot(&mut self, slot: usize, out: &mut Outbox) {
        let Some(agent) = self.agents.at(slot).filter(|a| a.conn.is_some()) else {
            return;
        };
        // `State::target_for`'s version and field, encoded once per version.
        let trial = (self.canary.as_ref())
            .filter(|c| c.on_trial(&agent.key()))
            .and_then(|c| c.target(&agent.service));
        let bundle = self.applied.as_ref().map(|a| &a.bundle);
        let (version, target) = (self.encoded).for_service(trial.as_ref(), bundle, &agent.service);
        let nonce = self.nonce();
        let Some(agent) = self.agents.at_mut(slot) else {
            return;
        };
        agent.version = version;
        let msg = Encoded::config(&target, &nonce);
        if agent.pending.replace(nonce).is_none() {
            *self.unanswered.entry(agent.service.clone()).or_default() += 1;
        }
        out.extend(agent.outgoing(msg));
    }

    /// Queues the current config to every connected agent of `services`.
    fn push_to(&mut self, services: &[String], out: &mut Outbox) {
        let slots: Vec<usize> = agents::slots_of_services(&self.agents, services)
            .filter(|(_, a)| a.conn.is_some())
            .map(|(slot, _)| slot)
            .collect();
        for slot in slots {
            self.push_slot(slot, out);
        }
    }

    /// The agents of `services` (see [`agents::of_services`]).
    fn of_services<'a>(&'a self, services: &'a [String]) -> impl Iterator<Item = &'a Agent> {
        agents::of_services(&self.agents, services)
    }

    /// A new stream of an unverified agent (`--insecure`) said hello: see
    /// [`State::hello_as`].
    pub fn hello(
        &mut self,
        hello: pb::Hello,
        tx: AgentTx,
        now: u64,
        out: &mut Outbox,
    ) -> (AgentKey, u64) {
        self.hello_as(hello, crate::auth::UNVERIFIED_AGENT, tx, now, out)
    }

    /// The identity holding the name `service`/`instance`, when it is not
    /// `identity`: a stream that proved `identity` may not connect under it.
    /// A name stays held while govd remembers the instance (until it is
    /// pruned, connected or not).
    pub fn held_by_another(&self, service: &str, instance: &str, identity: &str) -> Option<&str> {
        self.agents.held_by_another(service, instance, identity)
    }

    /// A new stream that proved `identity` said hello (the caller checked
    /// [`State::held_by_another`]). Returns its connection id; queues its
    /// config when its version differs from the current one.
    pub fn hello_as(
        &mut self,
        hello: pb::Hello,
        identity: &str,
        tx: AgentTx,
        now: u64,
        out: &mut Outbox,
    ) -> (AgentKey, u64) {
        self.next_conn += 1;
        let id = self.next_conn;
        let key = (hello.service.clone(), hello.instance.clone());
        let held: BTreeSet<LatchId> = hello.latches.iter().map(latch::release::wire_id).collect();
        let missed = self.latches.missed_releases(&hello);
        let agent = self.agents.get_or_insert_with(&key, || {
            Agent::new(hello.service.clone(), hello.instance.clone(), now)
        });
        let last_version = hello.last_version.clone();
        agent.connected(hello, identity, Conn { id, tx }, now, &mut self.unanswered);
        self.dirty.touch_key(&mut self.agents, &key);
        // An agent with no config at all gets one even when its service is not
        // in the policy (an empty one): it is what makes it ready.
        if let Some(current) = self.version_for(&key)
            && (current != last_version || last_version.is_empty())
        {
            self.push(&key, out);
        }
        // After the config (the agent applies messages in order): every latch
        // govd holds for this instance that the agent no longer enforces.
        latch_agents::rearm(&self.latches, &self.agents, &key, &held, out);
        latch_agents::send_missed(&mut self.agents, &key, missed, out);
        // The endpoints of every service with a registered instance: where its
        // outbound calls go from now on.
        // Each the set as last pushed (encoded once per version): a change
        // not pushed yet reaches it with the next push, as every agent.
        if let Some(agent) = self.agents.get(&key) {
            out.extend(
                self.registry
                    .fulls()
                    .filter_map(|m| agent.outgoing(m.clone())),
            );
        }
        (key, id)
    }

    /// How long ago the agent holding `service`/`instance` was last heard from,
    /// if it is connected and was heard from within [`LIVE_FOR_MS`]: a second
    /// agent claiming a live name is refused (its stats, releases and endpoint
    /// would be mixed up with the first's). A stream that went quiet longer is
    /// taken over (a reconnect whose old stream was not closed yet).
    pub fn live_claim(&self, service: &str, instance: &str, now: u64) -> Option<u64> {
        self.agents.live_claim(service, instance, now)
    }

    /// Whether a hello as `service`/`instance` would add an instance to a
    /// service that has `max` already (connected or not).
    pub fn service_full(&self, service: &str, instance: &str, max: usize) -> bool {
        self.agents.service_full(service, instance, max)
    }

    /// Forgets the instances not connected and not heard from for
    /// `retention_ms`: their names are free again. An instance remembered
    /// from before a restart (never heard from since) gets a full retention
    /// from the first call. Returns the keys forgotten.
    pub fn prune(&mut self, now: u64, retention_ms: u64) -> Vec<AgentKey> {
        let gone = agents::prune(&mut self.agents, now, retention_ms);
        gone.iter().for_each(|k| self.dirty.forget(k));
        gone
    }

    /// The agent records changed or forgotten since the last call (see
    /// [`State::restore_agent_changes`] when they could not be written).
    pub fn take_agent_changes(&mut self) -> AgentChanges {
        self.dirty.take(&mut self.agents)
    }

    pub fn restore_agent_changes(&mut self, changes: &AgentChanges) {
        self.dirty.restore(&mut self.agents, changes);
    }

    /// The stream `id` of `key` ended.
    pub fn disconnect(&mut self, key: &AgentKey, id: u64, reason: &str, now: u64) -> bool {
        let Some(agent) = self.agents.get_mut(key) else {
            return false;
        };
        if agent.conn.as_ref().is_none_or(|c| c.id != id) {
            // A newer stream replaced this one.
            return false;
        }
        if agent.disconnected(reason, now, &mut self.unanswered) {
            // A lost instance leaves its callers' sets at once (a restart
            // registers it again when its lifecycle says so).
            self.registry.changed(&agent.service);
        }
        true
    }
    /// The handle by which stream `id` of `key` reaches its agent in O(1)
    /// ([`State::on_stream_message`]); `None` when a newer stream replaced it.
    pub fn stream(&self, key: &AgentKey, id: u64) -> Option<Stream> {
        self.agents.stream(key, id)
    }

    /// A message (other than the hello) from stream `id` of `key`, as an
    /// agent's reader passes it to [`State::on_stream_message`].
    pub fn on_message(&mut self, key: &AgentKey, id: u64, msg: AgentMsg, now: u64) -> Effect {
        match self.agents.stream(key, id) {
            Some(stream) => self.on_stream_message(&stream, msg, now),
            None => Effect::default(),
        }
    }

    /// A message (other than the hello) from `stream`, refused (no effect)
    /// once a newer stream replaced it or its agent was forgotten.
    pub fn on_stream_message(&mut self, stream: &Stream, msg: AgentMsg, now: u64) -> Effect {
        let mut effect = Effect::default();
        let Some(agent) = self.agents.of_stream_mut(stream) else {
            return effect;
        };
        let key = &stream.key;
        agent.last_seen_unix_ms = now;
        match msg {
            AgentMsg::Hello(_) => {}
            AgentMsg::Ack(ack) => {
                agent.acked(ack, &mut self.unanswered);
                self.dirty.touch(agent, stream.slot());
                effect.sync = true;
            }
            AgentMsg::Nack(nack) => {
                agent.nacked(nack, &mut self.unanswered);
                effect.sync = true;
            }
            AgentMsg::EndpointsAck(ack) => {
                if ack.want_full {
                    // It holds another version than a delta's base: the
                    // whole set, never a guess.
                    self.registry.resend(key, &ack.service);
                }
                let seen = agent.endpoints_acked.entry(ack.service).or_insert(0);
                *seen = (*seen).max(ack.version);
                // A removal may now be acknowledged by everyone.
                effect.endpoints = true;
            }
            AgentMsg::Lifecycle(l) => {
                if agent.on_lifecycle(&l) {
                    self.registry.changed(&agent.service);
                    effect.endpoints = true;
                }
                effect.stats = true;
            }
            AgentMsg::Stats(stats) => {
                let policy = self.applied.as_deref();
                let (by, releasing) = latch_agents::reporter_releasing(agent);
                effect.trips |= self.latches.on_stats(
                    policy.map(|a| &a.bundle),
                    by,
                    releasing,
                    &stats,
                    now,
                    &mut effect.audits,
                );
                let before = agent.stats.replace(stats);
                if let (Some(canary), Some(now)) = (&mut self.canary, &agent.stats) {
                    canary.observe(key, policy, before.as_ref(), now);
                }
                effect.stats = true;
            }
            AgentMsg::Event(event) => {
                let policy = self.applied.as_deref().map(|a| &a.bundle);
                let by = latch_agents::reporter(agent);
                effect.trips |= self
                    .latches
                    .on_event(policy, by, &event, now, &mut effect.audits);
            }
        }
        effect
    }

    /// What `state.json` would hold once `policy` is committed: the apply
    /// use case writes this before [`State::commit`] changes anything, so
    /// a refused write leaves the state (and every agent's sync state) as
    /// it was.
    pub fn persisted_with(
        &self,
        policy: &AppliedPolicy,
        changed: &[String],
        history: HistoryLimit,
    ) -> Persisted {
        let mut p = self.to_persisted();
        let mut kept: VecDeque<HistoryEntry> = std::mem::take(&mut p.history).into();
        kept.push_back(crate::history::entry(policy, changed));
        crate::history::bound(&mut kept, history);
        p.history = kept.into();
        p.applied = Some(policy.clone());
        p
    }

    /// Makes `policy` the one in force and queues it to every connected
    /// agent of `changed` services.
    // INVARIANT: called only after `persisted_with(policy, ..)` is on disk,
    // so an agent never gets a version a restart would forget.
    pub fn commit(
        &mut self,
        policy: Arc<AppliedPolicy>,
        changed: &[String],
        history: HistoryLimit,
        out: &mut Outbox,
    ) {
        self.history
            .push_back(crate::history::entry(&policy, changed));
        crate::history::bound(&mut self.history, history);
        self.applied = Some(policy);
        self.push_to(changed, out);
    }

    /// Takes `stored` (written by another replica) in: its releases go to
    /// this replica's agents, its latches are merged with this replica's
    /// (`Latches::adopt`), and its policy, when it is another one, is pushed
    /// to the agents of every service whose config changed.
    pub fn adopt(&mut self, stored: Persisted, out: &mut Outbox) -> Adopted {
        let (releases, theirs) = (stored.releases, stored.latches);
        latch_agents::adopt(&mut self.latches, &mut self.agents, releases, theirs, out);
        self.history = stored.history.into();
        let before = self.applied.take();
        self.applied = stored.applied.map(Arc::new);
        let changed = adopt::changed_services(before.as_deref(), self.applied.as_deref());
        self.push_to(&changed, out);
        // A canary another replica started or ended: its instances' config.
        let mut trial: Vec<String> = self
            .canary
            .iter()
            .flat_map(|c| c.stored.services.clone())
            .collect();
        self.canary = stored.canary.map(Canary::new);
        trial.extend(self.canary.iter().flat_map(|c| c.stored.services.clone()));
        self.reconcile(&trial, out);
        Adopted {
            policy: before.map(|p| p.version.clone())
                != self.applied.as_ref().map(|p| p.version.clone()),
        }
    }

    // --- a canary apply (`canary.rs`, `crate::rollout`) ---

    /// The canary running, if any.
    pub fn canary(&self) -> Option<&Canary> {
        self.canary.as_ref()
    }

    /// What `state.json` holds once `canary` starts.
    pub fn persisted_with_canary(&self, canary: &StoredCanary) -> Persisted {
        let mut p = self.to_persisted();
        p.canary = Some(canary.clone());
        p
    }

    /// Starts `canary`: its instances get its version.
    // INVARIANT: called only after `persisted_with_canary(canary)` is on disk.
    pub fn start_canary(&mut self, canary: StoredCanary, out: &mut Outbox) {
        let services = canary.services.clone();
        self.canary = Some(Canary::new(canary));
        self.reconcile(&services, out);
    }

    /// What `state.json` holds once the canary ends: promoted (its policy in
    /// force), or not (the policy in force stays).
    pub fn persisted_ending_canary(&self, promote: bool, history: HistoryLimit) -> Persisted {
        let mut p = match (&self.canary, promote) {
            (Some(c), true) => self.persisted_with(&c.stored.policy, &c.stored.services, history),
            _ => self.to_persisted(),
        };
        p.canary = None;
        p
    }

    /// Ends the canary: promoted, its policy is in force and goes to every
    /// agent of its services not on it yet; else its instances get the
    /// policy in force again.
    // INVARIANT: called only after `persisted_ending_canary(promote, ..)` is on disk.
    pub fn end_canary(&mut self, promote: bool, history: HistoryLimit, out: &mut Outbox) {
        let Some(canary) = self.canary.take() else {
            return;
        };
        let services = canary.stored.services;
        if promote {
            self.history
                .push_back(crate::history::entry(&canary.stored.policy, &services));
            crate::history::bound(&mut self.history, history);
            self.applied = Some(Arc::new(canary.stored.policy));
        }
        self.reconcile(&services, out);
    }

    /// Pushes to each connected agent of `services` whose last config sent
    /// is not the one it must enforce now.
    fn reconcile(&mut self, services: &[String], out: &mut Outbox) {
        let keys: Vec<AgentKey> = self
            .of_services(services)
            .filter(|a| a.conn.is_some())
            .filter(|a| self.version_for(&a.key()).is_some_and(|v| v != a.version))
            .map(Agent::key)
            .collect();
        for key in keys {
            self.push(&key, out);
        }
    }

    /// Connected agents of `service`.
    pub fn connected<'a>(&'a self, service: &'a str) -> impl Iterator<Item = &'a Agent> {
        self.agents.of_service(service).filter(|a| a.conn.is_some())
    }

    /// The sync state of `agent`, as `istioctl proxy-status` would show it.
    pub fn sync_state(&self, agent: &Agent) -> (pb::SyncState, String, String) {
        agent.sync_state(self.version_for(&agent.key()).as_deref())
    }

    /// The outcome of every agent of `services` (for `ApplyResult`).
    pub fn outcomes(&self, services: &[String]) -> Vec<pb::AgentOutcome> {
        self.of_services(services)
            .map(|a| a.outcome(self.version_for(&a.key()).as_deref()))
            .collect()
    }

    // --- the registry (`registry.rs`) ---

    /// The registered instances of `service` (govd is the registry of
    /// record): connected agents whose lifecycle says WARMING (registered,
    /// ramping up) or READY, with the address their inbound listener has
    /// and their weight.
    pub fn endpoints(&self, service: &str) -> pb::Endpoints {
        self.registry.endpoints(&self.agents, service)
    }

    /// Queues to every connected agent the endpoints of each service whose
    /// set changed since the last call (a registration, a deregistration, a
    /// lost stream, a new weight), and tells each deregistered instance
    /// that every other agent acknowledged the set without it.
    pub fn endpoint_pushes(&mut self, out: &mut Outbox) {
        self.registry.pushes(&mut self.agents, out);
    }

    /// The connected agents (`service/instance`) that have not acknowledged
    /// the endpoint set of `agent`'s service without it, while it is being
    /// removed (empty otherwise): what its `wait for gov` step waits for.
    pub fn removal_waiting_on(&self, agent: &Agent) -> Vec<String> {
        registry::removal_waiting_on(&self.agents, agent)
    }

    // --- latches (`crate::latch`, `latch_agents.rs`) ---

    /// What [`State::release`] would return, without changing anything:
    /// for the audit record written before the release takes effect.
    pub fn release_preview(
        &self,
        kind: LatchKind,
        rule: &str,
        key: Option<&str>,
    ) -> (Vec<String>, Vec<String>) {
        latch_agents::release_preview(&self.latches, &self.agents, (kind, rule, key))
    }

    /// What `state.json` holds once `rule` (its `key` only, or every key)
    /// is released.
    pub fn persisted_without(
        &self,
        kind: LatchKind,
        rule: &str,
        key: Option<&str>,
        now: u64,
    ) -> Persisted {
        let mut p = self.to_persisted();
        latch::stored_without(&mut p.latches, &mut p.releases, (kind, rule, key), now);
        p
    }

    /// Queues a release command (of `key`, or every key) to every connected
    /// agent of the rule's service and forgets the latches. Returns (the
    /// keys that were latched, instances notified).
    // INVARIANT: called only after `persisted_without(kind, rule, key)` is
    // on disk and the release is in the audit log.
    pub fn release(
        &mut self,
        kind: LatchKind,
        rule: &str,
        key: Option<&str>,
        who: &str,
        now: u64,
        out: &mut Outbox,
    ) -> (Vec<String>, Vec<String>) {
        let (latches, agents) = (&mut self.latches, &mut self.agents);
        latch_agents::release(latches, agents, (kind, rule, key), who, now, out)
    }

    /// The automatic recovery delay of fuse `rule` (`None`: manual).
    pub fn fuse_recovery(&self, rule: &str) -> Option<u64> {
        latch::fuse_recovery(self.bundle(), rule)
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
    pub fn has_rule(&self, kind: LatchKind, rule: &str) -> bool {
        let Some((service, _)) = rule.split_once('/') else {
            return false;
        };
        let Some(t) = self.target(service) else {
            return false;
        };
        t.rule(rule).is_some_and(|r| r.kind() == kind.rule_kind())
    }

    /// Whether every connected agent of `services` has answered its last push.
    pub fn settled(&self, services: &[String]) -> bool {
        services
            .iter()
            .all(|s| self.unanswered.get(s).is_none_or(|&n| n == 0))
    }
}
#[cfg(test)]
mod tests {
    /// The history bound of the tests.
    const TEN: HistoryLimit = HistoryLimit {
        entries: 10,
        bytes: usize::MAX,
    };
    use tokio::sync::mpsc;

    use super::*;
    use crate::latch::Reporter;

    fn policy(version: &str, targets: Vec<pb::TargetConfig>) -> Arc<AppliedPolicy> {
        Arc::new(AppliedPolicy {
            version: version.into(),
            who: "t".into(),
            at_unix_ms: 1,
            sources: vec![],
            bundle: pb::Bundle {
                targets,
                version: version.into(),
            },
            shadow_since: Default::default(),
        })
    }

    fn target(service: &str, version: &str) -> pb::TargetConfig {
        pb::TargetConfig {
            version: version.into(),
            ..gov_proto::compiled::target(service)
        }
    }

    fn hello(service: &str, instance: &str, last: &str) -> pb::Hello {
        pb::Hello {
            service: service.into(),
            instance: instance.into(),
            last_version: last.into(),
            ..Default::default()
        }
    }

    fn nonce_of(msg: &crate::encoded::Encoded) -> String {
        match &msg.message().msg {
            Some(pb::control_message::Msg::Config(c)) => c.nonce.clone(),
            other => panic!("not a config: {other:?}"),
        }
    }

    fn lifecycle(phase: pb::Phase, weight: u32) -> AgentMsg {
        AgentMsg::Lifecycle(pb::Lifecycle {
            phase: phase as i32,
            weight_milli_percent: weight,
        })
    }

    /// The instances in the `Endpoints` pushes of `out`, per receiving agent.
    fn pushed(out: &Outbox) -> Vec<(String, Vec<(String, u32)>)> {
        out.iter()
            .filter_map(|o| match &o.msg.message().msg {
                Some(pb::control_message::Msg::Endpoints(e)) => Some((
                    o.key.1.clone(),
                    e.instances
                        .iter()
                        .map(|i| (i.instance.clone(), i.weight_milli_percent))
                        .collect(),
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_registry_holds_instances_past_readiness_and_pushes_every_change() {
        let mut s = State::default();
        let mut out = Vec::new();
        let (tx, _rx) = mpsc::channel(64);
        let with_address = |instance: &str| {
            let mut h = hello("inv", instance, "");
            h.address = format!("127.0.0.1:{}", 9000 + instance.len());
            h
        };
        let (caller, caller_id) = s.hello(hello("web", "web-1", ""), tx.clone(), 1, &mut out);
        let (a, a_id) = s.hello(with_address("a"), tx.clone(), 1, &mut out);
        out.clear();
        // Starting: not registered, nothing to push.
        s.on_message(&a, a_id, lifecycle(pb::Phase::Starting, 0), 2);
        s.endpoint_pushes(&mut out);
        assert!(pushed(&out).is_empty());
        // Warming at 10%: registered with its weight, pushed to every agent.
        let effect = s.on_message(&a, a_id, lifecycle(pb::Phase::Warming, 10_000), 3);
        assert!(effect.endpoints);
        s.endpoint_pushes(&mut out);
        let pushes = pushed(&out);
        assert_eq!(pushes.len(), 2, "{pushes:?}");
        assert!(
            pushes
                .iter()
                .all(|(_, set)| set == &[("a".to_owned(), 10_000)])
        );
        // READY with no weight is full weight.
        out.clear();
        s.on_message(&a, a_id, lifecycle(pb::Phase::Ready, 0), 4);
        s.endpoint_pushes(&mut out);
        assert_eq!(pushed(&out)[0].1, [("a".to_owned(), 100_000)]);
        // Stats and an unchanged lifecycle push nothing.
        out.clear();
        let effect = s.on_message(&a, a_id, lifecycle(pb::Phase::Ready, 0), 5);
        assert!(!effect.endpoints);
        s.endpoint_pushes(&mut out);
        assert!(out.is_empty());
        // A new agent gets the current set with its hello.
        let (_, _) = s.hello(hello("web", "web-2", ""), tx.clone(), 6, &mut out);
        assert_eq!(
            pushed(&out),
            [("web-2".to_owned(), vec![("a".to_owned(), 100_000)])]
        );
        // Draining deregisters; a lost stream too.
        out.clear();
        s.on_message(&a, a_id, lifecycle(pb::Phase::Draining, 0), 7);
        s.endpoint_pushes(&mut out);
        assert!(pushed(&out).iter().all(|(_, set)| set.is_empty()));
        let (b, b_id) = s.hello(with_address("bb"), tx, 8, &mut out);
        s.on_message(&b, b_id, lifecycle(pb::Phase::Ready, 0), 9);
        s.endpoint_pushes(&mut out);
        out.clear();
        assert!(s.disconnect(&b, b_id, "lost", 10));
        s.endpoint_pushes(&mut out);
        let pushes = pushed(&out);
        assert!(!pushes.is_empty() && pushes.iter().all(|(_, set)| set.is_empty()));
        assert!(s.disconnect(&caller, caller_id, "done", 11));
    }

    /// The `Deregistered` commands in `out`, by receiving instance.
    fn deregistered(out: &Outbox) -> Vec<String> {
        out.iter()
            .filter(|o| {
                matches!(
                    &o.msg.message().msg,
                    Some(pb::control_message::Msg::Command(pb::Command {
                        kind: Some(pb::command::Kind::Deregistered(_))
                    }))
                )
            })
            .map(|o| o.key.1.clone())
            .collect()
    }

    fn ack(service: &str, version: u64) -> AgentMsg {
        AgentMsg::EndpointsAck(pb::EndpointsAck {
            service: service.into(),
            version,
            want_full: false,
        })
    }

    #[test]
    fn a_deregistered_instance_hears_once_every_other_agent_acked_the_set_without_it() {
        let mut s = State::default();
        let mut out = Vec::new();
        let (tx, _rx) = mpsc::channel(64);
        let mut h = hello("inv", "a", "");
        h.address = "127.0.0.1:9001".into();
        let (a, a_id) = s.hello(h, tx.clone(), 1, &mut out);
        let (w1, w1_id) = s.hello(hello("web", "w1", ""), tx.clone(), 1, &mut out);
        let (w2, w2_id) = s.hello(hello("web", "w2", ""), tx, 1, &mut out);
        s.on_message(&a, a_id, lifecycle(pb::Phase::Ready, 0), 2);
        s.endpoint_pushes(&mut out);
        out.clear();
        let waiting = |s: &State| s.removal_waiting_on(s.agent(&a).unwrap());
        assert!(waiting(&s).is_empty(), "not being removed");
        // `a` deregisters: version 2 of `inv` leaves it out.
        s.on_message(&a, a_id, lifecycle(pb::Phase::Draining, 0), 3);
        assert_eq!(waiting(&s), ["web/w1", "web/w2"], "not pushed yet");
        s.endpoint_pushes(&mut out);
        assert!(deregistered(&out).is_empty());
        assert_eq!(waiting(&s), ["web/w1", "web/w2"]);
        out.clear();
        // An ack of the older set counts for nothing; one of two callers is not enough.
        s.on_message(&w1, w1_id, ack("inv", 1), 4);
        assert_eq!(waiting(&s), ["web/w1", "web/w2"]);
        s.on_message(&w1, w1_id, ack("inv", 2), 4);
        s.endpoint_pushes(&mut out);
        assert!(deregistered(&out).is_empty());
        assert_eq!(waiting(&s), ["web/w2"]);
        // The last caller leaving (or acking) completes it, once.
        assert!(s.disconnect(&w2, w2_id, "gone", 5));
        s.endpoint_pushes(&mut out);
        assert_eq!(deregistered(&out), ["a"]);
        assert!(waiting(&s).is_empty(), "done");
        out.clear();
        s.on_message(&w1, w1_id, ack("inv", 2), 6);
        s.endpoint_pushes(&mut out);
        assert!(deregistered(&out).is_empty(), "said once");
        // DRAINING said again (the `drain` step after `wait for gov`) starts
        // no second removal: nothing to wait for, nothing pushed, nothing said.
        s.on_message(&a, a_id, lifecycle(pb::Phase::Draining, 0), 7);
        assert!(waiting(&s).is_empty(), "still done");
        s.endpoint_pushes(&mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn a_nack_is_never_synced_and_keeps_the_last_good_version() {
        let mut s = State::default();
        s.commit(
            policy("b1", vec![target("order", "v1")]),
            &["order".into()],
            TEN,
            &mut Vec::new(),
        );
        let (tx, _rx) = mpsc::channel(8);
        let mut out = Vec::new();
        let (key, id) = s.hello(hello("order", "a", "v1"), tx, 1, &mut out);
        assert!(out.is_empty(), "an agent already on v1 gets nothing");
        assert_eq!(
            s.sync_state(s.agent(&key).unwrap()).0,
            pb::SyncState::Synced
        );

        s.commit(
            policy("b2", vec![target("order", "v2")]),
            &["order".into()],
            TEN,
            &mut out,
        );
        assert_eq!(out.len(), 1);
        let nonce = nonce_of(&out[0].msg);
        assert_eq!(s.sync_state(s.agent(&key).unwrap()).0, pb::SyncState::Stale);
        assert!(!s.settled(&["order".into()]));

        let nack = pb::Nack {
            version: "v2".into(),
            nonce,
            error: "no redis".into(),
            rule: "order/x".into(),
        };
        s.on_message(&key, id, AgentMsg::Nack(nack), 2);
        assert!(s.settled(&["order".into()]));
        let (state, reason, rule) = s.sync_state(s.agent(&key).unwrap());
        assert_eq!(
            (state, reason.as_str(), rule.as_str()),
            (pb::SyncState::Nacked, "no redis", "order/x")
        );
        let outcome = &s.outcomes(&["order".into()])[0];
        assert_eq!(outcome.state(), pb::SyncState::Nacked);
        assert_eq!(
            outcome.version, "v1",
            "still enforcing the last good version"
        );
    }

    #[test]
    fn an_unsaved_ack_settles_the_push_but_keeps_the_saved_version_as_last_good() {
        let mut s = State::default();
        s.commit(
            policy("b1", vec![target("order", "v1")]),
            &["order".into()],
            TEN,
            &mut Vec::new(),
        );
        let (tx, _rx) = mpsc::channel(8);
        let mut out = Vec::new();
        let (key, id) = s.hello(hello("order", "a", "v1"), tx.clone(), 1, &mut out);
        s.commit(
            policy("b2", vec![target("order", "v2")]),
            &["order".into()],
            TEN,
            &mut out,
        );
        let ack = |version: &str, nonce: String, unsaved: &str| {
            AgentMsg::Ack(pb::Ack {
                version: version.into(),
                nonce,
                unsaved: unsaved.into(),
            })
        };
        let nonce = nonce_of(&out[0].msg);
        s.on_message(&key, id, ack("v2", nonce, "no space left on device"), 2);
        // Applied: `govc apply` does not wait for it any longer.
        assert!(s.settled(&["order".into()]));
        let agent = s.agent(&key).unwrap();
        let (state, reason, _) = s.sync_state(agent);
        assert_eq!(
            (state, reason.as_str()),
            (pb::SyncState::Unsaved, "no space left on device")
        );
        assert_eq!((agent.last_good(), agent.enforces()), ("v1", "v2"));
        let outcome = &s.outcomes(&["order".into()])[0];
        assert_eq!(
            (
                outcome.state(),
                outcome.version.as_str(),
                outcome.error.as_str()
            ),
            (pb::SyncState::Unsaved, "v2", "no space left on device")
        );
        // What govd keeps is what the agent would come back with.
        assert_eq!(s.to_persisted().agents[0].last_good_version, "v1");

        // The agent reconnects naming its saved version: v2 is sent again,
        // and this time the save works.
        out.clear();
        let (key, id) = s.hello(hello("order", "a", "v1"), tx, 3, &mut out);
        assert_eq!(out.len(), 1, "the unsaved config is sent again");
        assert_eq!(s.sync_state(s.agent(&key).unwrap()).0, pb::SyncState::Stale);
        s.on_message(&key, id, ack("v2", nonce_of(&out[0].msg), ""), 4);
        let agent = s.agent(&key).unwrap();
        assert_eq!(s.sync_state(agent).0, pb::SyncState::Synced);
        assert_eq!((agent.last_good(), agent.enforces()), ("v2", "v2"));
    }

    #[test]
    fn stale_acks_do_not_settle_a_newer_push_and_old_streams_are_ignored() {
        let mut s = State::default();
        s.commit(
            policy("b1", vec![target("order", "v1")]),
            &["order".into()],
            TEN,
            &mut Vec::new(),
        );
        let (tx, _rx) = mpsc::channel(8);
        let mut out = Vec::new();
        let (key, id) = s.hello(hello("order", "a", ""), tx.clone(), 1, &mut out);
        let first = nonce_of(&out[0].msg);
        s.commit(
            policy("b2", vec![target("order", "v2")]),
            &["order".into()],
            TEN,
            &mut out,
        );
        s.on_message(
            &key,
            id,
            AgentMsg::Ack(pb::Ack {
                version: "v1".into(),
                nonce: first,
                ..Default::default()
            }),
            2,
        );
        assert_eq!(s.sync_state(s.agent(&key).unwrap()).0, pb::SyncState::Stale);
        // The agent reconnects; the old stream's end must not mark it disconnected.
        let (key2, id2) = s.hello(hello("order", "a", "v1"), tx, 3, &mut out);
        assert!(!s.disconnect(&key, id, "old", 4));
        assert_eq!(
            s.sync_state(s.agent(&key2).unwrap()).0,
            pb::SyncState::Stale
        );
        let last = nonce_of(&out.last().unwrap().msg);
        s.on_message(
            &key2,
            id2,
            AgentMsg::Ack(pb::Ack {
                version: "v2".into(),
                nonce: last,
                ..Default::default()
            }),
            5,
        );
        assert_eq!(
            s.sync_state(s.agent(&key2).unwrap()).0,
            pb::SyncState::Synced
        );
        assert!(s.disconnect(&key2, id2, "gone", 6));
        assert_eq!(
            s.sync_state(s.agent(&key2).unwrap()).0,
            pb::SyncState::Disconnected
        );
    }

    /// Issue 35: an ACK marks its own agent's record to write, not every
    /// agent's; a forgotten agent is written as gone; records that could
    /// not be written are taken again, unless the agent changed since.
    #[test]
    fn an_ack_changes_only_its_own_agent_record() {
        let mut s = State::default();
        s.commit(
            policy("b1", vec![target("order", "v1")]),
            &[],
            TEN,
            &mut Vec::new(),
        );
        let mut ids = Vec::new();
        let mut out = Vec::new();
        let (tx, _rx) = mpsc::channel(256);
        for i in 0..50 {
            let instance = format!("i{i}");
            ids.push(s.hello(hello("order", &instance, ""), tx.clone(), 1, &mut out));
        }
        assert_eq!(s.take_agent_changes().changed.len(), 50, "every hello");
        assert!(s.take_agent_changes().is_empty());
        let (key, id) = ids[7].clone();
        let nonce = nonce_of(&out[7].msg);
        let ack = AgentMsg::Ack(pb::Ack {
            version: "v1".into(),
            nonce,
            ..Default::default()
        });
        s.on_message(&key, id, ack, 2);
        let changes = s.take_agent_changes();
        assert_eq!(changes.live, 50);
        assert_eq!(changes.changed.len(), 1);
        assert_eq!(changes.changed[0].instance, "i7");
        assert_eq!(changes.changed[0].last_good_version, "v1");

        // Not written: taken again.
        s.restore_agent_changes(&changes);
        assert_eq!(s.take_agent_changes(), changes);

        assert!(s.disconnect(&key, id, "gone", 3));
        assert_eq!(s.prune(10_000, 1_000), std::slice::from_ref(&key));
        s.restore_agent_changes(&changes);
        let forgotten = s.take_agent_changes();
        assert!(forgotten.changed.is_empty(), "{forgotten:?}");
        assert_eq!(forgotten.gone, [key]);
    }

    #[test]
    fn an_agent_with_nothing_gets_a_config_even_for_a_service_the_policy_does_not_name() {
        let mut s = State::default();
        s.commit(
            policy("b1", vec![target("order", "v1")]),
            &[],
            TEN,
            &mut Vec::new(),
        );
        let (tx, _rx) = mpsc::channel(8);
        let mut out = Vec::new();
        let (key, id) = s.hello(hello("search", "s", ""), tx, 1, &mut out);
        let nonce = nonce_of(&out[0].msg);
        assert_eq!(s.sync_state(s.agent(&key).unwrap()).0, pb::SyncState::Stale);
        s.on_message(
            &key,
            id,
            AgentMsg::Ack(pb::Ack {
                version: String::new(),
                nonce,
                ..Default::default()
            }),
            2,
        );
        assert_eq!(
            s.sync_state(s.agent(&key).unwrap()).0,
            pb::SyncState::Synced
        );
    }

    #[test]
    fn unchanged_services_get_nothing() {
        let mut s = State::default();
        s.commit(
            policy("b1", vec![target("order", "v1"), target("pay", "p1")]),
            &[],
            TEN,
            &mut Vec::new(),
        );
        let mut out = Vec::new();
        let (tx, _rx) = mpsc::channel(8);
        s.hello(hello("pay", "p", "p1"), tx, 1, &mut out);
        s.commit(
            policy("b2", vec![target("order", "v2"), target("pay", "p1")]),
            &["order".into()],
            TEN,
            &mut out,
        );
        assert!(out.is_empty());
    }

    #[test]
    fn engaged_limits_get_an_absolute_deadline_and_stats_reconcile_fuses() {
        let mut t = target("order", "v1");
        t.rules.push(pb::Rule {
            name: "order/crm".into(),
            spec: Some(pb::rule::Spec::Limit(pb::Limit {
                release: Some(pb::Release {
                    kind: Some(pb::release::Kind::AfterMs(7_200_000)),
                }),
                ..Default::default()
            })),
            ..Default::default()
        });
        let mut s = State::default();
        s.commit(policy("b1", vec![t]), &[], TEN, &mut Vec::new());
        let engaged = pb::Event {
            key: String::new(),
            kind: pb::EventKind::LimitEngaged as i32,
            rule: "order/crm".into(),
            reason: "calls".into(),
            at_unix_ms: 1_000,
        };
        assert!(s.latches.on_event(
            s.applied.as_deref().map(|a| &a.bundle),
            Reporter {
                service: "order",
                instance: "a",
                identity: "unverified",
            },
            &engaged,
            1_000,
            &mut Vec::new()
        ));
        assert_eq!(s.next_deadline(), Some(7_201_000));
        assert!(s.expired(7_200_999).is_empty());
        assert_eq!(
            s.expired(7_201_000),
            vec![("order/crm".to_string(), String::new())]
        );
        // Another service's agent cannot engage our limit.
        assert!(!s.latches.on_event(
            s.applied.as_deref().map(|a| &a.bundle),
            Reporter {
                service: "pay",
                instance: "p",
                identity: "unverified",
            },
            &engaged,
            1_000,
            &mut Vec::new()
        ));

        let stats = pb::Stats {
            rules: vec![pb::RuleStats {
                rule: "order/mdm".into(),
                kind: pb::RuleKind::Fuse as i32,
                fuse_state: pb::FuseState::Open as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(s.latches.on_stats(
            s.applied.as_deref().map(|a| &a.bundle),
            Reporter {
                service: "order",
                instance: "a",
                identity: "unverified",
            },
            &mut BTreeSet::new(),
            &stats,
            5,
            &mut Vec::new()
        ));
        assert!(s.is_latched(LatchKind::Fuse, "order/mdm"));
        let mut out = Vec::new();
        let (was, _) = s.release(LatchKind::Fuse, "order/mdm", None, "op", 1, &mut out);
        assert_eq!(was, [""], "the fuse was tripped");
        assert!(!s.is_latched(LatchKind::Fuse, "order/mdm"));
    }

    /// Issue 12 item 1: an agent that comes back without a latch govd holds
    /// for it gets it re-armed, after its config; one that kept it gets nothing.
    #[test]
    fn a_reconnecting_agent_that_lost_a_latch_gets_it_re_armed_after_its_config() {
        let mut s = State::default();
        s.commit(
            policy("b1", vec![target("order", "v1")]),
            &["order".into()],
            TEN,
            &mut Vec::new(),
        );
        let tripped = pb::Event {
            key: String::new(),
            kind: pb::EventKind::FuseTripped as i32,
            rule: "order/mdm".into(),
            reason: "errors 3 >= 3 over 10s (3 calls)".into(),
            at_unix_ms: 1_000,
        };
        let bundle = s.applied.clone();
        for instance in ["a", "b"] {
            assert!(s.latches.on_event(
                bundle.as_deref().map(|a| &a.bundle),
                Reporter {
                    service: "order",
                    instance,
                    identity: "unverified",
                },
                &tripped,
                1_000,
                &mut Vec::new()
            ));
        }
        let arms = |out: &Outbox| -> Vec<pb::Latch> {
            out.iter()
                .filter_map(|o| match &o.msg.message().msg {
                    Some(pb::control_message::Msg::Command(pb::Command {
                        kind: Some(pb::command::Kind::Arm(l)),
                    })) => Some(l.clone()),
                    _ => None,
                })
                .collect()
        };

        // `a` restarted without its state and without a config: config, then arm.
        let (tx, _rx) = mpsc::channel(8);
        let mut out = Vec::new();
        s.hello(hello("order", "a", ""), tx, 2_000, &mut out);
        assert_eq!(out.len(), 2);
        assert!(matches!(
            out[0].msg.message().msg,
            Some(pb::control_message::Msg::Config(_))
        ));
        let armed = arms(&out);
        assert_eq!(armed.len(), 1);
        assert_eq!(armed[0].rule, "order/mdm");
        assert_eq!(armed[0].kind(), pb::ReleaseKind::Fuse);
        assert_eq!(armed[0].since_unix_ms, 1_000);
        assert_eq!(armed[0].reason, tripped.reason);

        // `b` kept it: nothing to re-arm. `c` never held it: nothing either.
        let mut kept = hello("order", "b", "v1");
        kept.latches.push(armed[0].clone());
        let (tx, _rx) = mpsc::channel(8);
        let mut out = Vec::new();
        s.hello(kept, tx, 2_000, &mut out);
        assert!(out.is_empty(), "{out:?}");
        let (tx, _rx) = mpsc::channel(8);
        s.hello(hello("order", "c", "v1"), tx, 2_000, &mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    /// A latch is re-armed on an instance only while it proves the identity
    /// that reported it: a latch planted under a name by another identity
    /// is never pushed onto the agent that holds the name later.
    #[test]
    fn a_latch_is_re_armed_only_on_the_identity_that_reported_it() {
        let mut s = State::default();
        s.commit(
            policy("b1", vec![target("order", "v1")]),
            &["order".into()],
            TEN,
            &mut Vec::new(),
        );
        let (tx, _rx) = mpsc::channel(8);
        let (key, id) = s.hello_as(
            hello("order", "a", "v1"),
            "token `x`",
            tx,
            1,
            &mut Vec::new(),
        );
        let tripped = pb::Event {
            kind: pb::EventKind::FuseTripped as i32,
            rule: "order/mdm".into(),
            reason: "planted".into(),
            ..Default::default()
        };
        let effect = s.on_message(&key, id, AgentMsg::Event(tripped), 5);
        assert_eq!(effect.audits[0].who, "agent order/a (token `x`)");
        assert!(s.disconnect(&key, id, "gone", 6));
        assert_eq!(
            s.held_by_another("order", "a", "token `y`"),
            Some("token `x`")
        );
        assert_eq!(s.held_by_another("order", "a", "token `x`"), None);
        // The name passes to `y` (here: a state that kept no holder).
        let mut stored = s.to_persisted();
        stored.agents[0].identity.clear();
        let arms = |identity: &str| {
            let mut s = State::from_persisted(stored.clone());
            let (tx, _rx) = mpsc::channel(8);
            let mut out = Vec::new();
            s.hello_as(hello("order", "a", "v1"), identity, tx, 7, &mut out);
            assert!(
                s.is_latched(LatchKind::Fuse, "order/mdm"),
                "govd keeps the latch"
            );
            out.iter()
                .filter(|o| {
                    matches!(
                        o.msg.message().msg,
                        Some(pb::control_message::Msg::Command(pb::Command {
                            kind: Some(pb::command::Kind::Arm(_)),
                        }))
                    )
                })
                .count()
        };
        assert_eq!(arms("token `y`"), 0);
        assert_eq!(arms("token `x`"), 1);
    }

    #[test]
    fn a_full_service_takes_no_new_instance_and_old_disconnected_ones_are_forgotten() {
        let mut s = State::default();
        let (tx, _rx) = mpsc::channel(8);
        let (a, a_id) = s.hello(hello("order", "a", ""), tx.clone(), 1_000, &mut Vec::new());
        s.hello(hello("order", "b", ""), tx, 1_000, &mut Vec::new());
        assert!(s.service_full("order", "c", 2));
        assert!(
            !s.service_full("order", "a", 2),
            "a known instance may come back"
        );
        assert!(!s.service_full("pay", "p", 2));
        assert!(s.disconnect(&a, a_id, "gone", 2_000));
        assert!(s.prune(2_500, 1_000).is_empty(), "within the retention");
        assert_eq!(s.prune(3_001, 1_000), [a], "b is connected, a forgotten");
        assert!(!s.service_full("order", "c", 2));
    }

    /// A reader's stream handle, taken once: its messages count while it is
    /// the agent's stream, and are refused after a reconnect, and after the
    /// agent was forgotten and its slot given to another agent.
    #[test]
    fn a_stream_handle_is_refused_once_replaced_or_its_agent_forgotten() {
        let mut s = State::default();
        let (tx, _rx) = mpsc::channel(8);
        let (key, id) = s.hello(hello("order", "a", ""), tx.clone(), 1_000, &mut Vec::new());
        let old = s.stream(&key, id).expect("its current stream");
        let effect = s.on_stream_message(&old, lifecycle(pb::Phase::Ready, 0), 1_100);
        assert!(effect.endpoints, "READY registers it");
        assert_eq!(s.agent(&key).unwrap().last_seen_unix_ms, 1_100);

        let (_, id2) = s.hello(hello("order", "a", ""), tx.clone(), 1_200, &mut Vec::new());
        assert!(s.stream(&key, id).is_none());
        let effect = s.on_stream_message(&old, lifecycle(pb::Phase::Draining, 0), 1_300);
        assert_eq!(effect, Effect::default(), "the old stream is refused");
        assert_eq!(s.agent(&key).unwrap().phase, pb::Phase::Ready);
        assert_eq!(s.agent(&key).unwrap().last_seen_unix_ms, 1_200);

        let new = s.stream(&key, id2).expect("the new stream");
        assert!(s.disconnect(&key, id2, "gone", 2_000));
        assert_eq!(s.prune(5_000, 1_000), std::slice::from_ref(&key));
        let (other, other_id) = s.hello(hello("pay", "p", ""), tx, 5_000, &mut Vec::new());
        let reused = s.stream(&other, other_id).expect("pay/p's stream");
        let effect = s.on_stream_message(&new, lifecycle(pb::Phase::Ready, 0), 5_100);
        assert_eq!(effect, Effect::default(), "a forgotten agent's stream");
        assert_eq!(s.agent(&other).unwrap().phase, pb::Phase::Unspecified);
        assert!(
            s.on_stream_message(&reused, lifecycle(pb::Phase::Ready, 0), 5_200)
                .endpoints
        );
    }

    /// A keyed limit: each key is re-armed alone on a hello that lacks it,
    /// a key-release tells agents that key only, and the last stats no
    /// longer count a released key (a release of all right after names the
    /// keys still latched, not the one just released).
    #[test]
    fn keys_of_a_limit_are_re_armed_and_released_one_by_one() {
        let mut s = State::default();
        s.commit(
            policy("b1", vec![target("order", "v1")]),
            &["order".into()],
            TEN,
            &mut Vec::new(),
        );
        let (tx, _rx) = mpsc::channel(64);
        let mut out = Vec::new();
        let (key, id) = s.hello(hello("order", "a", "v1"), tx, 1_000, &mut out);
        let stats = pb::Stats {
            rules: vec![pb::RuleStats {
                rule: "order/crm".into(),
                kind: pb::RuleKind::Limit as i32,
                limit_engaged: true,
                engaged_keys: vec!["alice".into(), "bob".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let effect = s.on_message(&key, id, AgentMsg::Stats(stats), 1_500);
        assert_eq!(effect.audits.len(), 2, "one trip per key");
        let keys: Vec<&str> = s.latches().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["alice", "bob"]);

        // `a` comes back with bob only: alice alone is re-armed.
        let mut back = hello("order", "a", "v1");
        back.latches.push(pb::Latch {
            kind: pb::ReleaseKind::Limit as i32,
            rule: "order/crm".into(),
            key: "bob".into(),
            ..Default::default()
        });
        let (tx, _rx) = mpsc::channel(64);
        let mut out = Vec::new();
        let (key, id) = s.hello(back, tx, 2_000, &mut out);
        let armed: Vec<String> = out
            .iter()
            .filter_map(|o| match &o.msg.message().msg {
                Some(pb::control_message::Msg::Command(pb::Command {
                    kind: Some(pb::command::Kind::Arm(l)),
                })) => Some(l.key.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(armed, ["alice"]);
        let stats = pb::Stats {
            rules: vec![pb::RuleStats {
                rule: "order/crm".into(),
                kind: pb::RuleKind::Limit as i32,
                limit_engaged: true,
                engaged_keys: vec!["alice".into(), "bob".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        s.on_message(&key, id, AgentMsg::Stats(stats), 2_500);

        let mut out = Vec::new();
        let (was, notified) = s.release(
            LatchKind::Limit,
            "order/crm",
            Some("bob"),
            "op",
            3_000,
            &mut out,
        );
        assert_eq!(
            (was, notified),
            (vec!["bob".to_string()], vec!["a".to_string()])
        );
        let sent: Vec<String> = out
            .iter()
            .filter_map(|o| match o.msg.message().msg {
                Some(pb::control_message::Msg::Command(pb::Command {
                    kind: Some(pb::command::Kind::Release(r)),
                })) => Some(r.key),
                _ => None,
            })
            .collect();
        assert_eq!(sent, ["bob"]);
        assert!(
            s.latches
                .contains(LatchKind::Limit, "order/crm", Some("alice"))
        );
        // Before the agent's next stats: bob is no longer counted.
        assert_eq!(
            s.release_preview(LatchKind::Limit, "order/crm", None).0,
            ["alice"]
        );
        let stored = s.persisted_without(LatchKind::Limit, "order/crm", None, 4_000);
        assert!(stored.latches.is_empty());
        assert_eq!(s.to_persisted().latches.len(), 1, "alice is persisted");
        assert_eq!(s.to_persisted().releases[0].key, "bob");
    }
}
