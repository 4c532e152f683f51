//! What is left of a limit for one key, read from the key's words without
//! changing them: the `RateLimit` header of an admitted call when the limit
//! says `headers always` (a refusal's is always "nothing left").
//!
//! A local limit knows its own state; a cluster limit's count is in the
//! shared store, which an admitted call does not ask again for a header, so
//! it advertises its policy alone.

use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::time::Duration;

use super::algo::{interval_ns, tolerance_ns};
use super::{Algorithm, Limit, LimitCell, LimitScope, ms};
use crate::clock::Now;

/// Calls a key may still make now, and how long until its quota is whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QuotaLeft {
    pub remaining: u64,
    pub reset: Duration,
}

impl Limit {
    /// What is left of the calls quota of `cell` at `now`; `None` for a
    /// cluster limit or a limit of bytes alone.
    pub(crate) fn quota_left(&self, cell: &LimitCell, now: Now) -> Option<QuotaLeft> {
        let rate = self.spec.calls.as_ref()?;
        if self.spec.scope != LimitScope::Local {
            return None;
        }
        let now_ms = self.now_ms(now);
        let w = ms(rate.window).max(1);
        let to_window_end = Duration::from_millis(w - now_ms % w);
        let word = cell.calls.load(Acquire);
        let number = now_ms / w;
        let count_in = |word: u64, window: u64| {
            if word >> 32 == window & 0xffff_ffff {
                word & 0xffff_ffff
            } else {
                0
            }
        };
        Some(match self.spec.algorithm {
            Algorithm::FixedWindow => QuotaLeft {
                remaining: rate.amount.saturating_sub(count_in(word, number)),
                reset: to_window_end,
            },
            Algorithm::SlidingWindow => {
                let count = count_in(word, number);
                let previous = if word >> 32 == number & 0xffff_ffff {
                    count_in(cell.previous.load(Acquire), number.wrapping_sub(1))
                } else {
                    // Not rolled yet: the word is the previous window's.
                    count_in(word, number.wrapping_sub(1))
                };
                // previous * (w - elapsed) / w + count, rounded up.
                let elapsed = now_ms % w;
                let weighted = (u128::from(previous) * u128::from(w - elapsed))
                    .div_ceil(u128::from(w))
                    + u128::from(count);
                QuotaLeft {
                    remaining: u64::try_from(u128::from(rate.amount).saturating_sub(weighted))
                        .unwrap_or(0),
                    reset: to_window_end,
                }
            }
            Algorithm::TokenBucket { burst } => {
                let interval = interval_ns(rate);
                let tolerance = tolerance_ns(rate, burst);
                let now_ns = now.nanos_since(self.epoch_now);
                let ahead = cell.calls.load(Relaxed).saturating_sub(now_ns);
                QuotaLeft {
                    // A call fits while the arrival time is at most
                    // `tolerance` ahead, and each moves it one interval on.
                    remaining: if ahead > tolerance {
                        0
                    } else {
                        ((tolerance - ahead) / interval + 1).min(burst)
                    },
                    // The bucket is full again when the arrival time is now.
                    reset: Duration::from_nanos(ahead),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::limit::tests::limit_with;

    #[tokio::test(start_paused = true)]
    async fn a_fixed_window_counts_down_and_resets_at_its_end() {
        let l = limit_with(Algorithm::FixedWindow, 10, Duration::from_secs(1));
        let left = |l: &Limit| l.quota_left(&l.single, Now::read()).unwrap();
        assert_eq!(left(&l).remaining, 10);
        for _ in 0..3 {
            l.try_admit(&l.single, Now::read()).unwrap();
        }
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(
            left(&l),
            QuotaLeft {
                remaining: 7,
                reset: Duration::from_millis(750)
            }
        );
        tokio::time::advance(Duration::from_millis(750)).await;
        assert_eq!(left(&l).remaining, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sliding_window_weighs_the_previous_window() {
        let l = limit_with(Algorithm::SlidingWindow, 10, Duration::from_secs(1));
        for _ in 0..8 {
            l.try_admit(&l.single, Now::read()).unwrap();
        }
        // A quarter into the next window, 3/4 of the previous 8 still count.
        tokio::time::advance(Duration::from_millis(1250)).await;
        let left = l.quota_left(&l.single, Now::read()).unwrap();
        assert_eq!(left.remaining, 4);
        // What it says is what the limit admits.
        let admitted = (0..10)
            .filter(|_| l.try_admit(&l.single, Now::read()).is_ok())
            .count();
        assert_eq!(admitted, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_bucket_says_its_tokens_and_when_it_is_full() {
        let l = limit_with(
            Algorithm::TokenBucket { burst: 5 },
            10,
            Duration::from_secs(1),
        );
        let left = |l: &Limit| l.quota_left(&l.single, Now::read()).unwrap();
        assert_eq!(left(&l).remaining, 5);
        for _ in 0..3 {
            l.try_admit(&l.single, Now::read()).unwrap();
        }
        assert_eq!(
            left(&l),
            QuotaLeft {
                remaining: 2,
                reset: Duration::from_millis(300)
            }
        );
        let admitted = (0..10)
            .filter(|_| l.try_admit(&l.single, Now::read()).is_ok())
            .count();
        assert_eq!(admitted, 2);
        assert_eq!(left(&l).remaining, 0);
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(left(&l).remaining, 5);
    }
}
