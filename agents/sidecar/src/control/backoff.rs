//! How long the agent waits before it reconnects to the control plane.

use std::time::Duration;

/// Exponential backoff with jitter: attempt `n` waits a random time in
/// `[d/2, d]` where `d = min(max, initial * 2^n)` ("equal jitter"), so a
/// control-plane restart is not met by every agent at the same instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    attempt: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(30))
    }
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            attempt: 0,
        }
    }

    /// The ceiling of the next delay (before jitter).
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The next delay, drawn with `rng`.
    pub fn next_with(&mut self, rng: &mut impl rand::Rng) -> Duration {
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
