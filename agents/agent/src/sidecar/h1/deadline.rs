//! One timer per connection for recurring deadlines.

use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// One timer per connection for a recurring deadline (the header-read timeout, a
/// route timeout), re-armed only when the deadline has moved by more than an eighth
/// of its length. Registering a tokio timer takes the timer wheel's lock, and a
/// timer per request costs about a tenth of a proxied request's CPU; a deadline
/// that has only moved a little is checked when the timer fires instead, and the
/// timer is then re-armed for the rest.
pub(crate) struct Deadline {
    sleep: Pin<Box<Sleep>>,
    armed: bool,
}

impl Deadline {
    pub(crate) fn new() -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: false,
        }
    }

    /// Arms the timer for a deadline `limit` from now that may be served late by
    /// up to an eighth of `limit` (a client gets at least `limit`). Returns the
    /// deadline to pass to [`Deadline::expired`].
    pub(crate) fn arm_at_least(&mut self, limit: Duration) -> Instant {
        let at = Instant::now() + limit;
        let slack = limit / 8;
        if !self.armed || self.sleep.deadline() < at || self.sleep.deadline() > at + slack {
            self.sleep.as_mut().reset(at + slack);
            self.armed = true;
        }
        self.sleep.deadline()
    }

    /// Arms the timer to fire at or before `at` (a route deadline, checked exactly
    /// when it fires).
    pub(crate) fn arm_before(&mut self, at: Instant) {
        let now = Instant::now();
        let slack = at.saturating_duration_since(now) / 8;
        if !self.armed || self.sleep.deadline() > at || self.sleep.deadline() + slack < at {
            self.sleep.as_mut().reset(at);
            self.armed = true;
        }
    }

    /// Completes once `at` has passed.
    pub(crate) async fn expired(&mut self, at: Instant) {
        loop {
            self.sleep.as_mut().await;
            if Instant::now() >= at {
                return;
            }
            self.sleep.as_mut().reset(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn deadlines_fire_no_earlier_than_asked_and_rearm_rarely() {
        let mut d = Deadline::new();
        let start = Instant::now();
        let at = d.arm_at_least(Duration::from_secs(8));
        assert!(at >= start + Duration::from_secs(8) && at <= start + Duration::from_secs(9));
        // A second later the same timer still serves (no re-arm).
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(d.arm_at_least(Duration::from_secs(8)), at);
        d.expired(at).await;
        assert!(Instant::now() >= at);

        // A route deadline fires exactly, even when the timer was armed earlier.
        let mut d = Deadline::new();
        let first = Instant::now() + Duration::from_secs(8);
        d.arm_before(first);
        tokio::time::advance(Duration::from_millis(300)).await;
        let second = Instant::now() + Duration::from_secs(8);
        d.arm_before(second);
        assert_eq!(d.sleep.deadline(), first, "moved less than an eighth: kept");
        d.expired(second).await;
        assert_eq!(Instant::now(), second);
    }
}
