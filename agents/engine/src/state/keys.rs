//! The key table of a keyed rule (a limit `per consumer` or `per service`,
//! a bulkhead `per instance [path]`): how many keys it tracks, and what a
//! call of a new key gets when the table is full (issue 29).
//!
//! A key that is engaged (a call in flight, calls or bytes counted in the
//! current window, a latch) is never forgotten to make room: forgetting it
//! would hand its caller a fresh budget. Only keys at rest (nothing held,
//! nothing counted in the window, no latch) are evicted. When every key is
//! engaged, a call of a new key goes to the rule's overflow: one shared
//! counter (or permit pool) with the rule's own limit (`overflow share`, the
//! default), or a refusal (`overflow reject`). Overflowed calls are counted
//! (`/metrics`), so a cap that is too small is visible.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use gov_proto::v1 as proto;
use tokio::time::Instant;

use crate::config::invalid::{Ctx, InvalidConfig};

/// The keys a keyed rule tracks when neither its policy (`max_keys N`) nor
/// the agent (`--max-keys-per-rule`) says otherwise.
pub const DEFAULT_MAX_KEYS: u32 = 4096;

/// The most keys any rule may track (a policy or flag above is refused).
pub const MAX_MAX_KEYS: u32 = gov_proto::compiled::MAX_KEYS_PER_RULE;

/// After a sweep that found no key at rest, new keys go to the overflow
/// without sweeping again for this long: a flood of new keys costs one
/// sweep of the table per interval, not one per call.
const SWEEP_BACKOFF: Duration = Duration::from_millis(100);

/// What a call of a new key gets when every tracked key is engaged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyOverflow {
    /// It shares the rule's one overflow counter (or permit pool), with the
    /// rule's own amount.
    #[default]
    Share,
    /// It is refused with the rule's rejection.
    Reject,
}

/// How many keys a keyed rule tracks, and what happens past that.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyCap {
    /// `None`: the agent's default ([`crate::Engine::set_max_keys_per_rule`]).
    pub max: Option<u32>,
    pub overflow: KeyOverflow,
}

impl KeyCap {
    /// The cap in force.
    pub(crate) fn max(&self) -> usize {
        self.max.unwrap_or(DEFAULT_MAX_KEYS) as usize
    }
}

/// A key cap from the wire: `max_keys` (0: the agent's default) and
/// `overflow`.
pub(crate) fn cap(ctx: &Ctx<'_>, max_keys: u32, overflow: i32) -> Result<KeyCap, InvalidConfig> {
    if max_keys > MAX_MAX_KEYS {
        return Err(ctx.err(format!(
            "`max_keys` {max_keys} is over {MAX_MAX_KEYS} (each key holds memory)"
        )));
    }
    Ok(KeyCap {
        max: (max_keys > 0).then_some(max_keys),
        overflow: match ctx.known::<proto::KeyOverflow>("overflow", overflow)? {
            proto::KeyOverflow::Share => KeyOverflow::Share,
            proto::KeyOverflow::Reject => KeyOverflow::Reject,
        },
    })
}

/// The counts of a key table.
#[derive(Debug)]
pub(crate) struct KeyTable {
    /// Keys tracked now (updated under the table's write lock).
    keys: AtomicU64,
    /// Calls that went to the overflow (shared or refused), cumulative.
    overflowed: AtomicU64,
    /// No sweep before this (ms since `epoch`).
    no_sweep_until_ms: AtomicU64,
    epoch: Instant,
}

impl Default for KeyTable {
    fn default() -> Self {
        Self {
            keys: AtomicU64::new(0),
            overflowed: AtomicU64::new(0),
            no_sweep_until_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl KeyTable {
    fn ms(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether a full table may be swept now.
    pub(crate) fn may_sweep(&self, now: Instant) -> bool {
        self.ms(now) >= self.no_sweep_until_ms.load(Relaxed)
    }

    /// A sweep found no key at rest: none again for a while.
    pub(crate) fn swept_in_vain(&self, now: Instant) {
        let until = self
            .ms(now)
            .saturating_add(SWEEP_BACKOFF.as_millis() as u64);
        self.no_sweep_until_ms.store(until, Relaxed);
    }

    /// A call went to the overflow.
    pub(crate) fn overflowed(&self) {
        self.overflowed.fetch_add(1, Relaxed);
    }

    pub(crate) fn set_keys(&self, n: usize) {
        self.keys.store(n as u64, Relaxed);
    }

    /// `(keys tracked now, calls overflowed)`.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.keys.load(Relaxed), self.overflowed.load(Relaxed))
    }
}
