//! The engine's clock, read through `tokio::time` (paused in tests): each
//! read is turned once into nanoseconds since one process-wide base, so a
//! decision subtracts one `Instant` per clock read, and each windowed rule
//! works out its milliseconds from its epoch (kept in nanoseconds since the
//! same base) with integer arithmetic. The results are those of
//! `now.saturating_duration_since(epoch)`, exactly: both are whole
//! nanoseconds since the base.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// How long before the first read the base lies: every instant the engine
/// sees (a paused clock starts at the real time its runtime was built, and
/// only moves forward) is after it.
const BEFORE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(|| {
        let now = Instant::now();
        now.checked_sub(BEFORE).unwrap_or(now)
    })
}

/// Nanoseconds from the base to `at`.
#[inline]
pub(crate) fn ns(at: Instant) -> u64 {
    // `as_nanos` without its 128-bit product: whole seconds since the base
    // (about a century, times 10^9, fits in 64 bits; saturated past that).
    let d = at.saturating_duration_since(base());
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
}

/// One clock read: the instant, and its nanoseconds since the base.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Now {
    pub(crate) at: Instant,
    ns: u64,
}

impl Now {
    /// Reads the clock.
    #[inline]
    pub(crate) fn read() -> Self {
        Self::from(Instant::now())
    }

    /// Whole milliseconds from `epoch_ns` (nanoseconds since the base) to
    /// this read; 0 before it.
    #[inline]
    pub(crate) fn ms_since(self, epoch_ns: u64) -> u64 {
        self.ns.saturating_sub(epoch_ns) / 1_000_000
    }

    /// Nanoseconds from the base to this read.
    #[inline]
    pub(crate) fn ns(self) -> u64 {
        self.ns
    }

    /// Nanoseconds from `earlier` to this read (0 if it is later).
    #[inline]
    pub(crate) fn nanos_since(self, earlier: Now) -> u64 {
        self.ns.saturating_sub(earlier.ns)
    }
}

impl From<Instant> for Now {
    #[inline]
    fn from(at: Instant) -> Self {
        Self { at, ns: ns(at) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Milliseconds and durations as `saturating_duration_since` gives them.
    #[tokio::test(start_paused = true)]
    async fn reads_subtract_as_instants_do() {
        let epoch = Instant::now();
        let epoch_ns = ns(epoch);
        for step_ns in [
            0,
            1,
            999_999,
            1_000_000,
            1_000_001,
            1_999_999_999,
            7_000_000_123,
        ] {
            tokio::time::advance(Duration::from_nanos(step_ns)).await;
            let now = Now::read();
            let d = now.at.saturating_duration_since(epoch);
            assert_eq!(now.ms_since(epoch_ns), d.as_millis() as u64);
            assert_eq!(now.nanos_since(Now::from(epoch)), d.as_nanos() as u64);
        }
        let now = Now::read();
        let later = Now::from(now.at + Duration::from_millis(5));
        assert_eq!(now.ms_since(ns(later.at)), 0);
        assert_eq!(now.nanos_since(later), 0);
    }
}
