//! Engine events (a fuse tripped, a limit engaged, either released), sent
//! on a tokio broadcast channel as they happen. The agent forwards them to
//! the control plane and logs them; nobody listening is fine.

use std::sync::Arc;
use std::time::SystemTime;

use gov_proto::v1 as proto;
use tokio::sync::broadcast;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    FuseTripped,
    FuseHalfOpen,
    FuseReleased,
    LimitEngaged,
    LimitReleased,
}

/// One state change of a fuse or a limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// `service/rule`.
    pub rule: Arc<str>,
    /// Lowercase, e.g. `business_error_ratio 62.5% > 50% over 60s (32 calls)`.
    pub reason: String,
    /// Limits keyed by consumer or called service: the key that engaged or
    /// released. Empty: the rule's own counter, a fuse, or every key.
    pub key: Box<str>,
    /// Wall-clock time, for the wire and logs only (state machines use `tokio::time`).
    pub at: SystemTime,
}

impl Event {
    /// The wire form (`gov.v1.Event`).
    pub fn to_proto(&self) -> proto::Event {
        let at_unix_ms = self
            .at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        proto::Event {
            kind: match self.kind {
                EventKind::FuseTripped => proto::EventKind::FuseTripped,
                EventKind::FuseHalfOpen => proto::EventKind::FuseHalfOpen,
                EventKind::FuseReleased => proto::EventKind::FuseReleased,
                EventKind::LimitEngaged => proto::EventKind::LimitEngaged,
                EventKind::LimitReleased => proto::EventKind::LimitReleased,
            } as i32,
            rule: self.rule.to_string(),
            reason: self.reason.clone(),
            at_unix_ms,
            key: self.key.to_string(),
        }
    }
}

/// Capacity of the event channel; a slow receiver loses the oldest events.
pub const EVENT_CAPACITY: usize = 1024;

/// The sending side, shared by every rule state.
#[derive(Clone, Debug)]
pub(crate) struct Events {
    tx: broadcast::Sender<Event>,
}

impl Events {
    pub(crate) fn new() -> Self {
        Self {
            tx: broadcast::channel(EVENT_CAPACITY).0,
        }
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    pub(crate) fn emit(&self, kind: EventKind, rule: &Arc<str>, reason: String) {
        self.emit_key(kind, rule, "", reason);
    }

    /// [`Events::emit`] about one key of a keyed limit (`""`: the rule's
    /// own counter, or every key).
    pub(crate) fn emit_key(&self, kind: EventKind, rule: &Arc<str>, key: &str, reason: String) {
        tracing::info!(rule = %rule, key, ?kind, %reason, "gov event");
        // No receiver is not an error: events are informational.
        let _ = self.tx.send(Event {
            kind,
            rule: rule.clone(),
            reason,
            key: key.into(),
            at: SystemTime::now(),
        });
    }
}
