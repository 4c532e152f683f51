//! One agent as the state knows it (connected or not), the messages queued
//! to agents, and an agent's sync state as `istioctl proxy-status` shows it.
//! Plain data: the state (`state.rs`) and its parts (`registry.rs`,
//! `latch_agents.rs`) change it; nothing here reaches back into them.

use std::collections::{BTreeMap, BTreeSet};

use gov_proto::v1 as pb;
use tokio::sync::mpsc;

use crate::encoded::Encoded;

use crate::latch::LatchId;
use crate::store::KnownAgent;

/// 100% slow-start weight.
const FULL_WEIGHT: u32 = 100_000;

/// Messages queued to one agent's stream, encoded (`encoded.rs`), the bytes
/// shared with every other agent they go to. Boxed: a tokio channel
/// allocates its slots 32 at a time, so a queue of unboxed `Encoded`s
/// (112 bytes) held 3.5 KiB per agent whether or not it was ever full; a
/// queue of boxes holds 256 bytes and one box per message in flight.
pub type AgentTx = mpsc::Sender<Box<Encoded>>;

/// `(service, instance)`.
pub type AgentKey = (String, String);

/// One agent (connected or not).
#[derive(Debug)]
pub struct Agent {
    pub(super) service: String,
    pub(super) instance: String,
    /// The identity that holds its name (`auth::AgentIdentity::label`):
    /// another identity may not connect under it.
    pub(super) identity: String,
    pub(super) address: String,
    /// Its inbound listener takes agent-to-agent mutual TLS (its hello).
    pub(super) mtls: bool,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) conn: Option<Conn>,
    /// The version last sent to it (or reported in its hello).
    pub(super) version: String,
    /// The nonce of a push not yet answered.
    pub(super) pending: Option<String>,
    /// The last NACK, until a later ACK.
    pub(super) nack: Option<Nacked>,
    /// The last version it acknowledged and saved (or reported in its hello):
    /// what it enforces after a restart without govd.
    pub(super) last_good: String,
    /// The last ACK that said the config is enforced but not saved, until an
    /// ACK without it or a new stream.
    pub(super) unsaved: Option<Unsaved>,
    pub(super) phase: pb::Phase,
    /// Slow-start weight from its lifecycle (100% = 100000).
    pub(super) weight_milli_percent: u32,
    /// The endpoint set version it acknowledged, per service (this stream's).
    pub(super) endpoints_acked: BTreeMap<String, u64>,
    /// It applies endpoint deltas (its hello says so).
    pub(super) endpoint_deltas: bool,
    /// It deregistered (DRAINING) and waits to hear that every agent dropped
    /// it: `Some(v)` once the set version `v` without it was pushed.
    pub(super) removal: Option<Removal>,
    pub(super) last_seen_unix_ms: u64,
    pub(super) stats: Option<pb::Stats>,
    /// Why the stream ended.
    pub(super) disconnect_reason: String,
    /// Latches this agent came back with that were released while it was
    /// away: govd sent the release; until its stats say closed, they are
    /// not a new latch.
    pub(super) releasing: BTreeSet<LatchId>,
    /// Its stored record changed since the store last took it: its slot is
    /// in `Dirty`'s list once (`agents::Dirty`).
    pub(super) record_changed: bool,
}

/// An agent's open stream.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) id: u64,
    pub(super) tx: AgentTx,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nacked {
    pub version: String,
    pub error: String,
    pub rule: String,
}

/// A config the agent enforces but could not save in its state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsaved {
    pub version: String,
    /// The agent's reason (a full or read-only disk).
    pub reason: String,
}

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

/// A message to send once the lock is released.
#[derive(Debug)]
pub struct Outgoing {
    pub key: AgentKey,
    /// The connection it is for (a slow one is cut).
    pub conn: u64,
    pub tx: AgentTx,
    pub msg: Encoded,
}

/// Messages to send once the lock is released.
pub type Outbox = Vec<Outgoing>;

// === impl Agent ===

impl Agent {
    /// A new agent, as its first hello (or the stored state) names it.
    pub(super) fn new(service: String, instance: String, now: u64) -> Self {
        Agent {
            service,
            instance,
            identity: String::new(),
            address: String::new(),
            mtls: false,
            labels: BTreeMap::new(),
            conn: None,
            version: String::new(),
            pending: None,
            nack: None,
            last_good: String::new(),
            unsaved: None,
            phase: pb::Phase::Unspecified,
            weight_milli_percent: 0,
            endpoints_acked: BTreeMap::new(),
            endpoint_deltas: false,
            removal: None,
            last_seen_unix_ms: now,
            stats: None,
            disconnect_reason: String::new(),
            releasing: BTreeSet::new(),
            record_changed: false,
        }
    }

    /// An agent the store remembers, disconnected until it says hello.
    pub(super) fn from_record(a: KnownAgent) -> Self {
        let mut agent = Agent::new(a.service, a.instance, 0);
        agent.identity = a.identity;
        agent.address = a.address;
        agent.labels = a.labels;
        agent.version.clone_from(&a.last_good_version);
        agent.last_good = a.last_good_version;
        agent.disconnect_reason = "control plane restarted".into();
        agent
    }

    /// What the store keeps of it.
    pub fn record(&self) -> KnownAgent {
        KnownAgent {
            service: self.service.clone(),
            instance: self.instance.clone(),
            address: self.address.clone(),
            last_good_version: self.last_good.clone(),
            labels: self.labels.clone(),
            identity: self.identity.clone(),
        }
    }

    /// `(service, instance)`.
    pub(super) fn key(&self) -> AgentKey {
        (self.service.clone(), self.instance.clone())
    }

    /// `msg` for this agent's stream; `None` when it is not connected.
    pub(super) fn outgoing(&self, msg: Encoded) -> Option<Outgoing> {
        let conn = self.conn.as_ref()?;
        Some(Outgoing {
            key: self.key(),
            conn: conn.id,
            tx: conn.tx.clone(),
            msg,
        })
    }

    /// Registered in govd's registry: connected, with an address, and its
    /// lifecycle past readiness (WARMING or READY; DRAINING means it
    /// deregistered).
    pub(super) fn is_registered(&self) -> bool {
        self.conn.is_some()
            && !self.address.is_empty()
            && matches!(self.phase, pb::Phase::Warming | pb::Phase::Ready)
    }

    pub fn service(&self) -> &str {
        &self.service
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// The version last sent to it (or reported in its hello).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The last version it acknowledged and saved (or reported in its hello).
    pub fn last_good(&self) -> &str {
        &self.last_good
    }

    /// The version it enforces now: the last it acknowledged, saved or not.
    pub fn enforces(&self) -> &str {
        self.unsaved
            .as_ref()
            .map_or(&self.last_good, |u| &u.version)
    }

    /// Its push (if any) is answered, or will never be: one fewer awaited
    /// for its service in `unanswered`.
    pub(super) fn answered(&mut self, unanswered: &mut BTreeMap<String, usize>) {
        if self.pending.take().is_some()
            && let Some(n) = unanswered.get_mut(&self.service)
        {
            *n = n.saturating_sub(1);
        }
    }

    /// Its inbound listener takes mutual TLS from other agents.
    pub fn inbound_mtls(&self) -> bool {
        self.mtls
    }

    pub fn weight_milli_percent(&self) -> u32 {
        self.weight_milli_percent
    }

    pub fn phase(&self) -> pb::Phase {
        self.phase
    }

    pub fn last_seen_unix_ms(&self) -> u64 {
        self.last_seen_unix_ms
    }

    /// Its last stats report (connected agents only).
    pub fn stats(&self) -> Option<&pb::Stats> {
        self.stats.as_ref()
    }

    pub fn is_connected(&self) -> bool {
        self.conn.is_some()
    }

    /// A new stream of it said `hello`, proving `identity`: it starts over
    /// from what the hello says (the version the agent saved).
    pub(super) fn connected(
        &mut self,
        hello: pb::Hello,
        identity: &str,
        conn: Conn,
        now: u64,
        unanswered: &mut BTreeMap<String, usize>,
    ) {
        identity.clone_into(&mut self.identity);
        self.address = hello.address;
        self.mtls = hello.inbound_mtls;
        self.endpoint_deltas = hello.endpoint_deltas;
        self.labels = hello.labels.into_iter().collect();
        self.conn = Some(conn);
        self.version.clone_from(&hello.last_version);
        self.last_good = hello.last_version;
        self.answered(unanswered);
        self.nack = None;
        self.unsaved = None;
        self.stats = None;
        self.endpoints_acked.clear();
        self.removal = None;
        self.last_seen_unix_ms = now;
        self.disconnect_reason.clear();
    }

    /// Its stream ended for `reason`: whether it was registered (its
    /// service's endpoint set changes).
    pub(super) fn disconnected(
        &mut self,
        reason: &str,
        now: u64,
        unanswered: &mut BTreeMap<String, usize>,
    ) -> bool {
        let was_registered = self.is_registered();
        self.conn = None;
        self.answered(unanswered);
        self.stats = None;
        // A removal ends with the stream: nobody waits for it any more.
        self.removal = None;
        self.last_seen_unix_ms = now;
        reason.clone_into(&mut self.disconnect_reason);
        was_registered
    }

    /// Its lifecycle report: whether its registration changed (it registered,
    /// deregistered, took a new weight, or began a removal).
    pub(super) fn on_lifecycle(&mut self, l: &pb::Lifecycle) -> bool {
        let before = (self.is_registered(), self.weight_milli_percent);
        self.phase = l.phase();
        // READY with no weight means full weight.
        self.weight_milli_percent = match (self.phase, l.weight_milli_percent) {
            (pb::Phase::Ready, 0) => FULL_WEIGHT,
            (_, w) => w.min(FULL_WEIGHT),
        };
        let mut changed = (self.is_registered(), self.weight_milli_percent) != before;
        if self.phase != pb::Phase::Draining {
            self.removal = None;
        } else if self.removal.is_none() {
            // Its `wait for gov` waits for the set without it to be
            // acknowledged (even if it never registered: then at once).
            self.removal = Some(Removal::Pending);
            changed = true;
        }
        changed
    }

    /// Its ACK of `ack.version` (of the push it waited for or an older one:
    /// either way a config it enforces now).
    pub(super) fn acked(&mut self, ack: pb::Ack, unanswered: &mut BTreeMap<String, usize>) {
        if self.pending.as_deref() == Some(ack.nonce.as_str()) {
            self.answered(unanswered);
            self.nack = None;
        }
        // One it could not save is not what it enforces after a restart
        // without govd: its last good stays the saved one.
        if ack.unsaved.is_empty() {
            self.last_good = ack.version;
            self.unsaved = None;
        } else {
            self.unsaved = Some(Unsaved {
                version: ack.version,
                reason: ack.unsaved,
            });
        }
    }

    /// Its NACK: kept until a later ACK.
    pub(super) fn nacked(&mut self, nack: pb::Nack, unanswered: &mut BTreeMap<String, usize>) {
        if self.pending.as_deref() == Some(nack.nonce.as_str()) {
            self.answered(unanswered);
        }
        self.nack = Some(Nacked {
            version: nack.version,
            error: nack.error,
            rule: nack.rule,
        });
    }

    /// Its line of an `ApplyResult`, against `current` (as [`Self::sync_state`]).
    pub(super) fn outcome(&self, current: Option<&str>) -> pb::AgentOutcome {
        let (state, error, rule) = self.sync_state(current);
        pb::AgentOutcome {
            service: self.service.clone(),
            instance: self.instance.clone(),
            state: state as i32,
            version: self.enforces().to_owned(),
            error: if matches!(state, pb::SyncState::Nacked | pb::SyncState::Unsaved) {
                error
            } else {
                String::new()
            },
            rule,
        }
    }

    /// Its sync state, as `istioctl proxy-status` would show it, against
    /// `current`, the version its service must enforce (`None` before any
    /// apply): the state, why, and the rule a NACK names.
    pub fn sync_state(&self, current: Option<&str>) -> (pb::SyncState, String, String) {
        if self.conn.is_none() {
            return (
                pb::SyncState::Disconnected,
                self.disconnect_reason.clone(),
                String::new(),
            );
        }
        if self.pending.is_some() {
            return (
                pb::SyncState::Stale,
                "sent, not yet acknowledged".into(),
                String::new(),
            );
        }
        if let Some(n) = &self.nack
            && current == Some(n.version.as_str())
        {
            return (pb::SyncState::Nacked, n.error.clone(), n.rule.clone());
        }
        if let Some(u) = &self.unsaved
            && current == Some(u.version.as_str())
        {
            return (pb::SyncState::Unsaved, u.reason.clone(), String::new());
        }
        match current {
            Some(v) if v == self.last_good => (pb::SyncState::Synced, String::new(), String::new()),
            Some(_) => (pb::SyncState::Stale, "not sent".into(), String::new()),
            None => (
                pb::SyncState::Stale,
                "nothing applied yet: the agent enforces its own last good config".into(),
                String::new(),
            ),
        }
    }
}
