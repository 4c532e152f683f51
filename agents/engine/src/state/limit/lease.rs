//! The calls an agent holds of a `sync batch` limit's key ([`Lease`]), and
//! how each algorithm uses them ([`Counting`]):
//! - fixed window: a lease is a slice of the window's amount, used in that
//!   window only;
//! - sliding window: a slice of what the weighted estimate leaves when it
//!   is leased, used in that window only (later in the window the previous
//!   window weighs less, so the calls still fit);
//! - token bucket: k calls of the shared bucket, each with its own time in
//!   the bucket (the lease moved the bucket's arrival time k intervals on).
//!   A call is made at most [`Counting::Bucket::hold_us`] after its time:
//!   older calls are dropped, not made, so the cluster never runs more than
//!   that far behind the bucket (the bound in docs/operations.md, "Shared
//!   counters in Redis").
//!
//! Without a lease (the store down, or the lease call failed) an agent
//! counts on from the last state it heard of: a window's total plus its own
//! calls, or the bucket's arrival time moved on by its own calls.

use std::time::Duration;

use crate::cluster::{sliding_left, sliding_wait_ms};

/// The calls of one key of a batched cluster limit: leased from the store,
/// or counted without a lease while the store is down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Lease {
    /// Window number (Unix ms / window length); always 0 for a token bucket.
    pub window: u64,
    /// Leased calls not used yet.
    pub left: u64,
    /// Calls asked for (admitted or not) since the last top-up.
    pub demand: u64,
    /// Calls asked for in the last period: the next lease is twice that.
    pub per_period: u64,
    /// The window's leased and counted calls in the store, all agents, at
    /// its last answer; a token bucket: its arrival time (Unix us) then,
    /// moved on by the calls counted here without a lease.
    pub total: u64,
    /// Calls admitted without a lease, not yet in the store (windows).
    pub unleased: u64,
    /// Unleased calls sent with a lease that has not been answered.
    pub sending: u64,
    /// Sliding window: the window before's count, as last known.
    pub previous: u64,
    /// Token bucket: the time in the bucket (Unix us) of the oldest call
    /// left (the calls left are taken as one after the other from it: no
    /// later than their real times).
    pub slot_us: u64,
    /// Token bucket: the calls of the last leases, back to back in the
    /// bucket, ending at `total` (what a give-back may return, while nobody
    /// leased after them).
    pub block: u64,
}

/// How a limit counts, at one moment: what its lease needs to decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counting {
    Fixed {
        amount: u64,
        window_ms: u64,
        elapsed_ms: u64,
    },
    Sliding {
        amount: u64,
        window_ms: u64,
        elapsed_ms: u64,
    },
    Bucket {
        now_us: u64,
        interval_us: u64,
        tolerance_us: u64,
        /// How long after its time in the bucket a leased call may still be
        /// made (two periods of the limit's `sync batch`).
        hold_us: u64,
    },
}

impl Lease {
    /// A new window: the old lease expires with it; a sliding window keeps
    /// the count of the window before when it is the one that ended.
    pub(super) fn roll(&mut self, window: u64) {
        if self.window != window {
            let before = (window == self.window.wrapping_add(1)).then(|| {
                self.total
                    .saturating_add(self.unleased)
                    .saturating_add(self.sending)
            });
            *self = Lease {
                window,
                per_period: self.per_period,
                previous: before.unwrap_or(0),
                ..Lease::default()
            };
        }
    }

    /// The window's calls as last known, this agent's unsent ones included.
    fn counted(&self) -> u64 {
        self.total
            .saturating_add(self.unleased)
            .saturating_add(self.sending)
    }

    /// Whether the store has calls left to lease, as last known.
    pub(super) fn budget_left(&self, c: Counting) -> bool {
        match c {
            Counting::Fixed { amount, .. } => self.counted() < amount,
            Counting::Sliding {
                amount,
                window_ms,
                elapsed_ms,
            } => sliding_left(amount, window_ms, elapsed_ms, self.previous, self.counted()) > 0,
            Counting::Bucket {
                now_us,
                tolerance_us,
                ..
            } => self.total <= now_us.saturating_add(tolerance_us),
        }
    }

    /// How many calls to ask for: two periods of this agent's traffic.
    pub(super) fn want(&self) -> u64 {
        self.per_period.max(self.demand).max(1).saturating_mul(2)
    }

    /// A token bucket: drops the calls left whose time in the bucket is more
    /// than `hold_us` ago (they are not made).
    pub(super) fn expire(&mut self, c: Counting) {
        let Counting::Bucket {
            now_us,
            interval_us,
            hold_us,
            ..
        } = c
        else {
            return;
        };
        let oldest = now_us.saturating_sub(hold_us);
        if self.left == 0 || self.slot_us >= oldest {
            return;
        }
        let interval = interval_us.max(1);
        let stale = (oldest - self.slot_us).div_ceil(interval).min(self.left);
        self.left -= stale;
        self.slot_us = self.slot_us.saturating_add(stale.saturating_mul(interval));
    }

    /// Uses one leased call, if any is left.
    pub(super) fn take(&mut self, c: Counting) -> bool {
        self.expire(c);
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        if let Counting::Bucket { interval_us, .. } = c {
            self.slot_us = self.slot_us.saturating_add(interval_us.max(1));
        }
        true
    }

    /// Counts one call without a lease (the store down, or its lease call
    /// failed), if the last known state leaves room for it.
    pub(super) fn count_unleased(&mut self, c: Counting) -> bool {
        if !self.budget_left(c) {
            return false;
        }
        match c {
            Counting::Fixed { .. } | Counting::Sliding { .. } => self.unleased += 1,
            Counting::Bucket {
                now_us,
                interval_us,
                ..
            } => self.total = self.total.max(now_us).saturating_add(interval_us.max(1)),
        }
        true
    }

    /// How long until a call may fit, as last known (a refusal's wait).
    pub(super) fn wait(&self, c: Counting) -> Duration {
        let ms = match c {
            Counting::Fixed {
                window_ms,
                elapsed_ms,
                ..
            } => window_ms - elapsed_ms,
            Counting::Sliding {
                amount,
                window_ms,
                elapsed_ms,
            } => sliding_wait_ms(amount, window_ms, elapsed_ms, self.previous, self.counted()),
            Counting::Bucket {
                now_us,
                tolerance_us,
                ..
            } => self
                .total
                .saturating_sub(now_us.saturating_add(tolerance_us))
                .div_ceil(1000),
        };
        Duration::from_millis(ms.max(1))
    }

    /// Takes a granted lease: `granted` more calls; `total` and `previous`
    /// as the store answered ([`crate::cluster::LeaseReply::Granted`]).
    pub(super) fn granted(&mut self, c: Counting, granted: u64, total: u64, previous: u64) {
        if let Counting::Bucket { interval_us, .. } = c
            && granted > 0
        {
            let start = total.saturating_sub(granted.saturating_mul(interval_us.max(1)));
            if self.left == 0 {
                self.slot_us = start;
            }
            // Right after the last lease (nobody leased between): one block.
            self.block = if self.left > 0 && start == self.total {
                self.block.saturating_add(granted)
            } else {
                granted
            };
        }
        self.left = self.left.saturating_add(granted);
        self.total = total;
        self.previous = previous;
    }

    /// Gives every call left back (an idle key): what to return to the
    /// store. A token bucket returns at most its last lease's calls (the
    /// store takes them back only if nobody leased after them).
    pub(super) fn give_back(&mut self, c: Counting) -> u64 {
        let left = std::mem::take(&mut self.left);
        match c {
            Counting::Bucket { .. } => left.min(std::mem::take(&mut self.block)),
            _ => left,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUCKET: Counting = Counting::Bucket {
        now_us: 10_000_000,
        interval_us: 1_000,
        tolerance_us: 9_000,
        hold_us: 200_000,
    };

    fn at(c: Counting, now_us: u64) -> Counting {
        match c {
            Counting::Bucket {
                interval_us,
                tolerance_us,
                hold_us,
                ..
            } => Counting::Bucket {
                now_us,
                interval_us,
                tolerance_us,
                hold_us,
            },
            other => other,
        }
    }

    /// A sliding window's lease keeps the count of the window that ended
    /// as the next one's previous count; a window further on has none.
    #[test]
    fn a_sliding_lease_carries_the_window_before_into_the_next() {
        let mut l = Lease {
            window: 7,
            left: 3,
            total: 40,
            unleased: 2,
            per_period: 9,
            ..Lease::default()
        };
        l.roll(8);
        assert_eq!((l.window, l.left, l.previous, l.per_period), (8, 0, 42, 9));
        let c = Counting::Sliding {
            amount: 50,
            window_ms: 1000,
            elapsed_ms: 0,
        };
        // 42 weigh in full at the window's start: 8 calls left.
        assert!(l.budget_left(c));
        for _ in 0..8 {
            assert!(l.count_unleased(c));
        }
        assert!(!l.count_unleased(c), "the estimate is at the amount");
        // 1 ms on, the 42 weigh 41.958: one more fits.
        assert_eq!(l.wait(c), Duration::from_millis(1));
        let c = Counting::Sliding {
            amount: 50,
            window_ms: 1000,
            elapsed_ms: 1,
        };
        assert!(l.count_unleased(c));
        assert!(!l.count_unleased(c));
        l.roll(10);
        assert_eq!(l.previous, 0, "the window before 10 had no calls here");
    }

    /// A token bucket's leased calls are made in the order of their times
    /// in the bucket; those older than `hold_us` are dropped, not made.
    #[test]
    fn bucket_calls_older_than_the_hold_are_dropped() {
        let mut l = Lease::default();
        // Five calls at 10.000-10.004 s in the bucket (it ends at 10.005 s).
        l.granted(BUCKET, 5, 10_005_000, 0);
        assert_eq!((l.left, l.slot_us, l.block), (5, 10_000_000, 5));
        assert!(l.take(BUCKET));
        assert_eq!(l.slot_us, 10_001_000);
        // 202.5 ms later: the calls at 10.001 and 10.002 s are more than
        // the hold of 200 ms old and dropped; the one at 10.003 s is made.
        let later = at(BUCKET, 10_202_500);
        assert!(l.take(later));
        assert_eq!((l.left, l.slot_us), (1, 10_004_000));
        // Another lease while one call is left: the oldest time is kept;
        // after another agent's lease, the new block starts apart.
        l.granted(later, 3, 10_300_000, 0);
        assert_eq!((l.left, l.slot_us, l.block), (4, 10_004_000, 3));
        // Right after it: one block of 5.
        l.granted(later, 2, 10_302_000, 0);
        assert_eq!((l.left, l.block), (6, 5));
        // Idle: at most the block goes back.
        assert_eq!(l.give_back(later), 5);
        assert_eq!((l.left, l.block), (0, 0));
    }

    /// Without a lease a token bucket counts on from the arrival time it
    /// last heard of, by its rate and tolerance, and says when a call fits.
    #[test]
    fn bucket_without_a_lease_counts_on_from_the_last_arrival_time() {
        let mut l = Lease {
            total: 10_004_000,
            ..Lease::default()
        };
        // 4 ms ahead with a tolerance of 9 ms: 6 more calls fit now.
        let mut n = 0;
        while l.count_unleased(BUCKET) {
            n += 1;
        }
        assert_eq!(n, 6);
        assert_eq!(l.total, 10_010_000);
        assert_eq!(l.wait(BUCKET), Duration::from_millis(1));
        assert!(l.count_unleased(at(BUCKET, 10_001_000)));
    }
}
