//! Latches as data: the tripped fuses and engaged limits of an engine,
//! exported with wall-clock times so that they mean the same after a restart,
//! and restored (re-armed) into a running engine.
//!
//! The agent writes [`Engine::latches`](crate::Engine::latches) to its state
//! directory on every change and restores them with
//! [`Engine::restore_latch`](crate::Engine::restore_latch) before it serves
//! again; the control plane re-sends the latches it holds for an agent that
//! lost them. [`Engine::apply`](crate::Engine::apply) uses the same two steps
//! to carry the latch of a rule whose parameters changed into its new state.
//!
//! Restoring is silent: it emits no event, since the trip was reported when it
//! happened and nothing was released. Only the rule's own timer (a limit's
//! `release after`, a fuse's `recover after`, counted from `since`) or a
//! release ends a restored latch.

use std::time::{Duration, SystemTime};

use gov_proto::v1 as proto;

/// Which kind of rule holds a latch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LatchKind {
    /// A tripped (open or half-open) fuse.
    Fuse,
    /// An engaged limit.
    Limit,
}

/// A tripped fuse or an engaged limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Latch {
    pub kind: LatchKind,
    /// `service/rule`.
    pub rule: String,
    /// Limits keyed by consumer or called service: the key. Empty: the
    /// rule's own counter (and always for fuses).
    pub key: String,
    /// When it tripped or engaged (Unix ms).
    pub since_unix_ms: u64,
    /// Limits: when it releases itself (Unix ms); `None`: as the rule's own
    /// `release` says from `since` (never for `release manual`). Fuses: when
    /// it goes half-open, for display only (a restored fuse recovers as its
    /// own `recover` says, from `since`).
    pub deadline_unix_ms: Option<u64>,
    /// Lowercase, as in the trip or engage event.
    pub reason: String,
}

/// What [`Engine::restore_latch`](crate::Engine::restore_latch) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restored {
    /// The rule was not latched; it is now.
    Armed,
    /// The rule (key) was latched already; nothing changed.
    Held,
    /// Its deadline had passed (the agent was down when it would have
    /// released itself); nothing was armed.
    Expired,
    /// A latch of a limit keyed by consumer or called service came without
    /// its key (the control plane knows latches by rule only); nothing was
    /// armed, since the key decides which calls it refuses.
    KeyMissing,
}

/// A latch on the wire is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, miette::Diagnostic)]
#[error("a latch without a rule name")]
#[diagnostic(
    code(gov::agent::invalid_latch),
    help("rule names look like `service/rule`")
)]
pub struct InvalidLatch;

// === impl Latch ===

impl Latch {
    /// The wire form (`gov.v1.Latch`).
    pub fn to_proto(&self) -> proto::Latch {
        proto::Latch {
            kind: match self.kind {
                LatchKind::Fuse => proto::ReleaseKind::Fuse,
                LatchKind::Limit => proto::ReleaseKind::Limit,
            } as i32,
            rule: self.rule.clone(),
            key: self.key.clone(),
            since_unix_ms: self.since_unix_ms,
            deadline_unix_ms: self.deadline_unix_ms.unwrap_or(0),
            reason: self.reason.clone(),
        }
    }

    /// Whether two latches are the same for the disk: the same rule and
    /// key, since, and kind of end (a deadline read twice may differ by a
    /// millisecond of clock drift between the engine's timer and the wall
    /// clock).
    pub fn same_as(&self, other: &Latch) -> bool {
        let close = match (self.deadline_unix_ms, other.deadline_unix_ms) {
            (Some(a), Some(b)) => a.abs_diff(b) <= 1_000,
            (a, b) => a == b,
        };
        self.kind == other.kind
            && self.rule == other.rule
            && self.key == other.key
            && self.since_unix_ms == other.since_unix_ms
            && close
    }
}

impl TryFrom<&proto::Latch> for Latch {
    type Error = InvalidLatch;

    fn try_from(p: &proto::Latch) -> Result<Self, InvalidLatch> {
        if p.rule.trim().is_empty() {
            return Err(InvalidLatch);
        }
        Ok(Self {
            kind: match p.kind() {
                proto::ReleaseKind::Fuse => LatchKind::Fuse,
                proto::ReleaseKind::Limit => LatchKind::Limit,
            },
            rule: p.rule.clone(),
            key: p.key.clone(),
            since_unix_ms: p.since_unix_ms,
            deadline_unix_ms: (p.deadline_unix_ms != 0).then_some(p.deadline_unix_ms),
            reason: p.reason.clone(),
        })
    }
}

/// Milliseconds since the Unix epoch of `t` (0 before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How long ago `since_unix_ms` was, at `now_unix_ms`.
pub(crate) fn age(since_unix_ms: u64, now_unix_ms: u64) -> Duration {
    Duration::from_millis(now_unix_ms.saturating_sub(since_unix_ms))
}
