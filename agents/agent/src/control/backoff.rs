//! How long the agent waits before it reconnects to the control plane.

use std::time::Duration;

/// Exponential backoff with jitter: attempt `n` waits a random time in
/// `[d/2, d]` where `d = min(max, initial * 2^n)` ("equal jitter"), so a
/// control-plane restart is not met by every agent at the same instant.
/// The first attempt after a reset (a stream that was open ended: govd
/// restarted, and every agent of the fleet lost its stream at once) waits a
/// random time in `[0, spread]` instead, so that a fleet's reconnects
/// arrive spread over `spread`, not within `initial / 2`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    /// The first attempt's window (zero: `[initial / 2, initial]` as any).
    pub spread: Duration,
    attempt: u32,
}

/// The first reconnect of an agent that lost its stream is drawn within
/// this: 10,000 agents after a govd restart arrive at about 10,000 a
/// second, which govd's admission rate (1,000 a second by default) queues
/// or refuses cheaply, instead of 10,000 within 50 ms.
pub const RECONNECT_SPREAD: Duration = Duration::from_secs(1);

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(30)).with_spread(RECONNECT_SPREAD)
    }
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            spread: Duration::ZERO,
            attempt: 0,
        }
    }

    /// The first attempt after a reset waits within `[0, spread]`.
    #[must_use]
    pub fn with_spread(mut self, spread: Duration) -> Self {
        self.spread = spread;
        self
    }

    /// The ceiling of the next delay (before jitter).
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The next delay, drawn with `rng`.
    pub fn next_with(&mut self, rng: &mut impl rand::Rng) -> Duration {
        if self.attempt == 0 && !self.spread.is_zero() {
            self.attempt = 1;
            let spread_ms = u64::try_from(self.spread.as_millis()).unwrap_or(u64::MAX);
            return Duration::from_millis(rng.random_range(0..=spread_ms));
        }
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        // Whole milliseconds: the resolution of tokio's timer.
        let ceiling_ms = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        let half = ceiling_ms / 2;
        Duration::from_millis(half + rng.random_range(0..=ceiling_ms - half))
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        self.next_with(&mut rand::rng())
    }

    /// After a session that got as far as the stream: start over.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}
