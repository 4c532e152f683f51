//! The calls algorithms of a local limit ([`Algorithm`]), each on the key's
//! atomic words, lock-free and without allocation:
//! - fixed window: `calls` holds `window number << 32 | count`;
//! - sliding window: the same, and `previous` holds the previous window's
//!   final count (`window number << 32 | count`, written by whoever rolls the
//!   window, before the roll is published); a call is admitted while
//!   `previous * (w - elapsed) / w + count < amount`;
//! - token bucket (GCRA): `calls` holds the theoretical arrival time (ns
//!   since the limit's start); a call is admitted while it is at most
//!   `(burst - 1) * interval` ahead of now, and moves it one interval on.
//!
//! A refusal says how long until a call would fit (`Exceeded::wait`): the
//! `Retry-After` and `RateLimit` headers, and a shaped call's delay.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::Duration;

use super::share::{Class, LimitShare, Verdict};
use super::{Algorithm, Exceeded, Limit, LimitCell, NOT_ENGAGED, Paced, Plain, RateSpec, ms, pack};
use crate::clock::Now;
use crate::cluster::sliding_wait_ms;
use crate::rejection::RejectReason;
use crate::weight::{self, FULL_WEIGHT};

/// The nanoseconds between two calls of a token bucket (rounded up: never
/// more than the rate).
pub(crate) fn interval_ns(rate: &RateSpec) -> u64 {
    let w = u64::try_from(rate.window.as_nanos()).unwrap_or(u64::MAX);
    w.div_ceil(rate.amount.max(1)).max(1)
}

/// The tolerance of a token bucket: how far ahead of now its theoretical
/// arrival time may be for a call to be admitted.
pub(crate) fn tolerance_ns(rate: &RateSpec, burst: u64) -> u64 {
    interval_ns(rate).saturating_mul(burst.max(1) - 1)
}

impl Limit {
    /// Counts one call by the limit's algorithm, or says how long until it fits.
    /// `now_ms`: `now` in whole ms since the limit's start.
    #[inline]
    pub(super) fn local_calls(
        &self,
        cell: &LimitCell,
        now: Now,
        now_ms: u64,
    ) -> Result<(), Exceeded> {
        let Some(rate) = &self.spec.calls else {
            return Ok(());
        };
        let (rate, burst) = self.effective(rate);
        match self.spec.algorithm {
            Algorithm::FixedWindow => fixed(cell, &rate, now_ms),
            Algorithm::SlidingWindow => sliding(cell, &rate, now_ms),
            Algorithm::TokenBucket { .. } => {
                bucket(cell, &rate, burst, now.nanos_since(self.epoch_now))
            }
        }
    }
}

impl Plain {
    /// Whether `word` counts calls of window `number` with room for one
    /// more. The word less the window's number its low 32 bits keep (as
    /// `pack` does, `at` bits up) is below 2^32 (and so below `room`) only
    /// in that window: then it is the count; so is the word but for those
    /// bits (issue 39: an exclusive or, unlike a subtraction, needs no copy
    /// of the word the exchange keeps).
    #[inline(always)]
    pub(super) fn has_room(&self, word: u64, number: u64) -> bool {
        (word ^ (number << self.at)) < self.room
    }
}

impl Limit {
    /// A call of a plain limit ([`Limit::plain`]) at `now_ns` on the clock,
    /// its epoch at `epoch_ns`: its window's number from the nanoseconds,
    /// in one multiply (issue 39: the milliseconds are worked out on a
    /// refusal alone), the number [`fixed`] works out from the
    /// milliseconds. A call in the window the word counts, with room left
    /// in it, adds one to the word (issue 39: its count is the word but for
    /// the window's number above it, below `room` in that window alone);
    /// any other (a window's first call, a full window, a time before the
    /// epoch or past the multiply) is counted by [`Limit::plain_by_window`].
    #[inline(always)]
    pub(super) fn plain_calls(
        cell: &LimitCell,
        plain: &Plain,
        now_ns: u64,
        epoch_ns: u64,
    ) -> Result<(), Exceeded> {
        // Before the epoch this wraps past 2^63 (the epoch is below it,
        // `plain_window`), past the multiply's range for a window of 1 ms
        // or more: `None`.
        let since_ns = now_ns.wrapping_sub(epoch_ns);
        if let Some(number) = plain.w_ns.div_near(since_ns) {
            let word = cell.calls.load(Relaxed);
            if plain.has_room(word, number)
                && cell
                    .calls
                    .compare_exchange_weak(word, word + 1, Relaxed, Relaxed)
                    .is_ok()
            {
                return Ok(());
            }
        }
        Self::plain_by_window(cell, plain, now_ns.saturating_sub(epoch_ns))
    }

    /// [`Limit::plain_calls`] `since_ns` after the epoch, as [`fixed`]
    /// counts it.
    #[cold]
    #[inline(never)]
    fn plain_by_window(cell: &LimitCell, plain: &Plain, since_ns: u64) -> Result<(), Exceeded> {
        fixed_in(
            cell,
            plain.amount,
            (plain.w_ns.div(since_ns), plain.w_ms),
            || plain.w_ms - (since_ns / 1_000_000) % plain.w_ms,
        )
    }

    /// Counts a call of a paced limit ([`Limit::paced`]) at `now_ns` on the
    /// clock, its epoch at `epoch_ns`, if it fits at once, inline (issue
    /// 39): whether it did. A sliding window of plain numbers counts a call
    /// in the window its word counts whose count and the previous window's
    /// (whole, unweighted) add up to less than `room` (the weighted
    /// estimate is at most their sum, so [`sliding`] admits it too, with
    /// no multiply); a token bucket one its arrival time admits. Any other
    /// call, with nothing counted, goes to [`Limit::paced_calls`], as does
    /// any of a limit not paced, or engaged (issue 39: its kind told in
    /// one match, not by `Option` first).
    #[inline(always)]
    pub(super) fn paced_at_once(
        cell: &LimitCell,
        paced: Option<&Paced>,
        now_ns: u64,
        epoch_ns: u64,
    ) -> bool {
        let free = || cell.engaged_until.load(Relaxed) == NOT_ENGAGED;
        match paced {
            Some(Paced::SlidingPlain(window)) if free() => {
                // Its number as `plain_calls` works it out (the one
                // `sliding` works out from the milliseconds).
                let Some(number) = window.w_ns.div_near(now_ns.wrapping_sub(epoch_ns)) else {
                    return false;
                };
                let word = cell.calls.load(Acquire);
                // The count, below 2^32 in its window alone (as in
                // `Plain::has_room`), and the previous word's count
                // whatever its window (no test of it: one of another
                // window counts none, so this errs on the slow path alone;
                // and as every roll writes the word first, it is then the
                // blank word of a cell's first window, or one fresh after a
                // release).
                let count = word ^ (number << window.at);
                let previous = cell.previous.load(Acquire) & 0xffff_ffff;
                count < window.room
                    && previous < window.room - count
                    && cell
                        .calls
                        .compare_exchange_weak(word, word + 1, Release, Acquire)
                        .is_ok()
            }
            Some(&Paced::Bucket {
                interval_ns,
                tolerance_ns,
            }) if free() => {
                let now_ns = now_ns.saturating_sub(epoch_ns);
                let current = cell.calls.load(Relaxed);
                let tat = current.max(now_ns);
                tat - now_ns <= tolerance_ns
                    && cell
                        .calls
                        .compare_exchange_weak(
                            current,
                            tat.saturating_add(interval_ns),
                            Relaxed,
                            Relaxed,
                        )
                        .is_ok()
            }
            _ => false,
        }
    }

    /// [`Limit::paced_calls`] of a sliding window of plain numbers,
    /// `since_ns` after the epoch, as [`sliding`] counts it.
    fn sliding_by_window(cell: &LimitCell, window: &Plain, since_ns: u64) -> Result<(), Exceeded> {
        let now_ms = since_ns / 1_000_000;
        let number = window.w_ns.div(since_ns);
        sliding_in(
            cell,
            window.amount,
            window.w_ms,
            number,
            now_ms - number * window.w_ms,
        )
    }

    /// A call of a paced limit ([`Limit::paced`]) `since_ns` nanoseconds
    /// after its epoch: as [`Limit::local_calls`] counts it without a
    /// warm-up weight (`since_ns` whole ms are its `now_ms`), with the
    /// window's divisor, or the bucket's interval and tolerance, worked out
    /// once (issue 39).
    pub(super) fn paced_calls(
        cell: &LimitCell,
        paced: &Paced,
        since_ns: u64,
    ) -> Result<(), Exceeded> {
        match *paced {
            Paced::Sliding { amount, w_ms, w } => {
                let now_ms = since_ns / 1_000_000;
                let number = w.div(now_ms);
                sliding_in(cell, amount, w_ms, number, now_ms - number * w_ms)
            }
            Paced::SlidingPlain(ref window) => Self::sliding_by_window(cell, window, since_ns),
            Paced::Bucket {
                interval_ns,
                tolerance_ns,
            } => bucket_in(cell, interval_ns, tolerance_ns, since_ns),
        }
    }

    /// The calls rate and a token bucket's burst now: under `scale with
    /// warmup`, while the instance ramps, the amount (and the burst) times
    /// its weight, at least 1.
    #[inline]
    fn effective(&self, rate: &RateSpec) -> (RateSpec, u64) {
        match (&self.weight, self.spec.algorithm) {
            (Some(w), algorithm) if w.get() < FULL_WEIGHT => {
                let weight = w.get();
                let scaled = RateSpec {
                    amount: weight::scaled(rate.amount, weight),
                    window: rate.window,
                };
                let burst = match algorithm {
                    Algorithm::TokenBucket { burst } => weight::scaled(burst, weight),
                    _ => 0,
                };
                (scaled, burst)
            }
            (_, Algorithm::TokenBucket { burst }) => (*rate, burst),
            _ => (*rate, 0),
        }
    }

    /// The calls the algorithm would admit now.
    fn room(&self, cell: &LimitCell, rate: &RateSpec, burst: u64, now: Now, now_ms: u64) -> u64 {
        match self.spec.algorithm {
            Algorithm::FixedWindow => fixed_room(cell, rate, now_ms),
            Algorithm::SlidingWindow => sliding_room(cell, rate, now_ms),
            Algorithm::TokenBucket { .. } => {
                bucket_room(cell, rate, burst, now.nanos_since(self.epoch_now))
            }
        }
    }

    /// Whether a sheddable call fits: it leaves a tenth of the calls per
    /// window (rounded up) to the other classes, so it is admitted while
    /// the algorithm would still admit more than that. Read before the
    /// call is counted: calls decided at the same moment may take one more.
    pub(super) fn sheddable_fits(
        &self,
        cell: &LimitCell,
        now: Now,
        now_ms: u64,
    ) -> Result<(), Exceeded> {
        let Some(rate) = &self.spec.calls else {
            return Ok(());
        };
        let (rate, burst) = self.effective(rate);
        if self.room(cell, &rate, burst, now, now_ms) > rate.amount.div_ceil(10) {
            return Ok(());
        }
        let w = ms(rate.window).max(1);
        Err(Exceeded {
            room_left: true,
            ..over(w - now_ms % w)
        })
    }

    /// Counts one call of a share's `class` ([`share`](super::share)): the
    /// share's verdict, then the algorithm's, both under the share's lock.
    pub(super) fn shared_calls(
        &self,
        share: &LimitShare,
        class: Class,
        cell: &LimitCell,
        now: Now,
        now_ms: u64,
    ) -> Result<(), Exceeded> {
        let Some(rate) = &self.spec.calls else {
            return Ok(());
        };
        let (rate, burst) = self.effective(rate);
        let w = ms(rate.window).max(1);
        let mut turn = share.turn(class, now_ms / w);
        let room = || self.room(cell, &rate, burst, now, now_ms);
        if turn.verdict(rate.amount, room) == Verdict::Refused {
            return Err(Exceeded {
                room_left: true,
                ..over(w - now_ms % w)
            });
        }
        self.local_calls(cell, now, now_ms)?;
        turn.admitted();
        Ok(())
    }
}

impl Limit {
    /// Whether forgetting the key's calls state gives nothing back: no call
    /// counted in the current window (fixed), nor in it or the one before
    /// (sliding, whose previous window weighs), or the bucket full again.
    pub(super) fn calls_at_rest(&self, cell: &LimitCell, now_ms: u64) -> bool {
        let Some(rate) = &self.spec.calls else {
            return true;
        };
        let number = now_ms / ms(rate.window).max(1);
        let calls = cell.calls.load(Relaxed);
        let counted_in =
            |window: u64| calls >> 32 == window & 0xffff_ffff && calls & 0xffff_ffff > 0;
        match self.spec.algorithm {
            Algorithm::FixedWindow => !counted_in(number),
            Algorithm::SlidingWindow => !counted_in(number) && !counted_in(number.wrapping_sub(1)),
            // The arrival time in ns; `now_ms` whole ms, so this errs on
            // keeping the key for under 1 ms.
            Algorithm::TokenBucket { .. } => calls <= now_ms.saturating_mul(1_000_000),
        }
    }
}

fn over(wait_ms: u64) -> Exceeded {
    Exceeded {
        reason: RejectReason::LimitCalls,
        wait: Some(Duration::from_millis(wait_ms.max(1))),
        engaged: false,
        room_left: false,
    }
}

#[inline]
fn fixed(cell: &LimitCell, rate: &RateSpec, now_ms: u64) -> Result<(), Exceeded> {
    let w = ms(rate.window).max(1);
    fixed_in(cell, rate.amount, (now_ms / w, w), || w - now_ms % w)
}

/// [`fixed`] of `amount` calls per window of `w_ms`, now in window
/// `number`; `left_ms`: the milliseconds left of it, asked on a refusal (a
/// late call's refusal, in the window after it, waits a window more).
#[inline]
fn fixed_in(
    cell: &LimitCell,
    amount: u64,
    (number, w_ms): (u64, u64),
    left_ms: impl FnOnce() -> u64,
) -> Result<(), Exceeded> {
    let mut window = number & 0xffff_ffff;
    let mut late_ms = 0;
    let mut current = cell.calls.load(Relaxed);
    loop {
        if just_after(current, window) {
            window = current >> 32;
            late_ms += w_ms;
        }
        let count = if current >> 32 == window {
            current & 0xffff_ffff
        } else {
            0
        };
        if count >= amount {
            return Err(over(left_ms().saturating_add(late_ms)));
        }
        match cell
            .calls
            .compare_exchange_weak(current, pack(window, count + 1), Relaxed, Relaxed)
        {
            Ok(_) => return Ok(()),
            Err(actual) => current = actual,
        }
    }
}

/// Whether the number of a window word `current` is the one just after a
/// call's `window` (both 32-bit, as [`pack`] keeps them): the call read the
/// clock before another call rolled the word on, and counts in the word's
/// window rather than rolling it back, which would forget the calls already
/// counted there and admit them again. A call later by more windows than
/// one rolls the word back as before; only a word idle for 2^32 - 1
/// windows looks one ahead, and counts calls one window too long. A word
/// never written (0: a counted window has a call) is no window.
#[inline]
fn just_after(current: u64, window: u64) -> bool {
    current != 0 && current >> 32 == (window + 1) & 0xffff_ffff
}

fn sliding(cell: &LimitCell, rate: &RateSpec, now_ms: u64) -> Result<(), Exceeded> {
    let w = ms(rate.window).max(1);
    sliding_in(cell, rate.amount, w, now_ms / w, now_ms % w)
}

/// [`sliding`] of `amount` calls per window of `w` milliseconds (at least
/// 1), now `elapsed` ms into window `number`. Inline (issue 39: a paced
/// limit's call paid for a call, its saved registers and its answer
/// through memory).
#[inline(always)]
fn sliding_in(
    cell: &LimitCell,
    amount: u64,
    w: u64,
    number: u64,
    elapsed: u64,
) -> Result<(), Exceeded> {
    let (mut window, mut elapsed) = (number & 0xffff_ffff, elapsed);
    // How long before the window counted in the call is: a late call's
    // wait starts there.
    let mut late_ms = 0;
    let mut current = cell.calls.load(Acquire);
    loop {
        if just_after(current, window) {
            // Counted at the start of the word's window: its previous
            // count weighs the most there.
            late_ms += w - elapsed;
            (window, elapsed) = (current >> 32, 0);
        }
        let before = window.wrapping_sub(1) & 0xffff_ffff;
        let (count, previous, rolls) = if current >> 32 == window {
            let p = cell.previous.load(Acquire);
            let previous = if p >> 32 == before {
                p & 0xffff_ffff
            } else {
                0
            };
            (current & 0xffff_ffff, previous, false)
        } else if current >> 32 == before && current != 0 {
            (0, current & 0xffff_ffff, true)
        } else {
            (0, 0, true)
        };
        // previous * (w - elapsed) / w + count < amount, in integers.
        let weighted =
            u128::from(previous) * u128::from(w - elapsed) + u128::from(count) * u128::from(w);
        if weighted >= u128::from(amount) * u128::from(w) {
            let wait = sliding_wait_ms(amount, w, elapsed, previous, count);
            return Err(over(wait.saturating_add(late_ms)));
        }
        if rolls {
            // Published before the roll: a call that sees the new window
            // sees its previous count.
            keep_previous(cell, before, previous);
        }
        match cell
            .calls
            .compare_exchange_weak(current, pack(window, count + 1), Release, Acquire)
        {
            Ok(_) => return Ok(()),
            Err(actual) => current = actual,
        }
    }
}

/// The calls a fixed window would admit now.
fn fixed_room(cell: &LimitCell, rate: &RateSpec, now_ms: u64) -> u64 {
    let window = (now_ms / ms(rate.window).max(1)) & 0xffff_ffff;
    let current = cell.calls.load(Relaxed);
    let count = if current >> 32 == window {
        current & 0xffff_ffff
    } else {
        0
    };
    rate.amount.saturating_sub(count)
}

/// The calls a sliding window would admit now: the `k` with
/// `previous * (w - elapsed) + (count + k - 1) * w < amount * w`.
fn sliding_room(cell: &LimitCell, rate: &RateSpec, now_ms: u64) -> u64 {
    let w = ms(rate.window).max(1);
    let number = now_ms / w;
    let (window, before) = (number & 0xffff_ffff, number.wrapping_sub(1) & 0xffff_ffff);
    let current = cell.calls.load(Acquire);
    let (count, previous) = if current >> 32 == window {
        let p = cell.previous.load(Acquire);
        let previous = if p >> 32 == before {
            p & 0xffff_ffff
        } else {
            0
        };
        (current & 0xffff_ffff, previous)
    } else if current >> 32 == before && current != 0 {
        (0, current & 0xffff_ffff)
    } else {
        (0, 0)
    };
    let left = (u128::from(rate.amount) * u128::from(w))
        .saturating_sub(u128::from(previous) * u128::from(w - now_ms % w));
    let fits = u64::try_from(left.div_ceil(u128::from(w))).unwrap_or(u64::MAX);
    fits.saturating_sub(count)
}

/// The calls a token bucket would admit now: while its arrival time is at
/// most the tolerance ahead, one interval more each.
fn bucket_room(cell: &LimitCell, rate: &RateSpec, burst: u64, now_ns: u64) -> u64 {
    let tolerance = tolerance_ns(rate, burst);
    let ahead = cell.calls.load(Relaxed).max(now_ns) - now_ns;
    match tolerance.checked_sub(ahead) {
        Some(slack) => slack / interval_ns(rate) + 1,
        None => 0,
    }
}

/// Stores `before`'s final count unless a roll already stored as much.
fn keep_previous(cell: &LimitCell, before: u64, count: u64) {
    let word = pack(before, count);
    let mut p = cell.previous.load(Relaxed);
    while !(p >> 32 == before && p >= word) {
        match cell
            .previous
            .compare_exchange_weak(p, word, Release, Relaxed)
        {
            Ok(_) => return,
            Err(actual) => p = actual,
        }
    }
}

fn bucket(cell: &LimitCell, rate: &RateSpec, burst: u64, now_ns: u64) -> Result<(), Exceeded> {
    bucket_in(cell, interval_ns(rate), tolerance_ns(rate, burst), now_ns)
}

/// [`bucket`] of a call every `interval` ns, at most `tolerance` ns ahead.
#[inline]
fn bucket_in(cell: &LimitCell, interval: u64, tolerance: u64, now_ns: u64) -> Result<(), Exceeded> {
    let mut current = cell.calls.load(Relaxed);
    loop {
        let tat = current.max(now_ns);
        let ahead = tat - now_ns;
        if ahead > tolerance {
            let wait_ns = ahead - tolerance;
            return Err(over(wait_ns.div_ceil(1_000_000)));
        }
        match cell.calls.compare_exchange_weak(
            current,
            tat.saturating_add(interval),
            Relaxed,
            Relaxed,
        ) {
            Ok(_) => return Ok(()),
            Err(actual) => current = actual,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain word has room for a call of its window alone, while its
    /// count is below the amount (as far as the word holds it), whatever
    /// the window's number (issue 39: tested by an exclusive or).
    #[test]
    fn a_plain_word_has_room_in_its_window_alone() {
        let numbers = [
            0,
            1,
            2,
            0xffff_fffe,
            0xffff_ffff,
            1 << 32,
            (1 << 40) + 5,
            u64::MAX,
        ];
        let counts = [0, 1, 2, 99, 100, 101, 0xffff_fffe, 0xffff_ffff, u64::MAX];
        for amount in [0, 1, 100, 0xffff_fffe, 0xffff_ffff, 1 << 40, u64::MAX] {
            let plain = Plain {
                amount,
                room: amount.min(0xffff_ffff),
                at: 32,
                w_ms: 1000,
                w_ns: crate::divisor::Divisor::new(1_000_000_000),
            };
            for window in numbers {
                for count in counts {
                    let word = pack(window, count);
                    for number in numbers {
                        let same = window & 0xffff_ffff == number & 0xffff_ffff;
                        let room = same && count.min(0xffff_ffff) < amount.min(0xffff_ffff);
                        let ctx = format!("{amount} {window} {count} {number}");
                        assert_eq!(plain.has_room(word, number), room, "{ctx}");
                    }
                }
            }
        }
    }

    /// The wait of a sliding window is the first millisecond the estimate
    /// admits a call: within the window, or in the next one.
    #[test]
    fn sliding_wait_is_the_first_millisecond_that_fits() {
        // 10 per 1000ms; previous 10, none yet: 10 * (1000 - e) < 1000 * 10
        // from e = 1 on... and after one more call, from e = 101.
        assert_eq!(sliding_wait_ms(10, 1000, 0, 10, 0), 1);
        assert_eq!(sliding_wait_ms(10, 1000, 0, 10, 1), 101);
        assert_eq!(sliding_wait_ms(10, 1000, 50, 10, 1), 51);
        // The window is full: the next window, with previous = 10.
        assert_eq!(sliding_wait_ms(10, 1000, 900, 0, 10), 100 + 1);
        // Nothing before: fits at once (but never a zero wait).
        assert_eq!(sliding_wait_ms(10, 1000, 10, 0, 3), 1);
    }

    /// A call that read the clock in a window the word has already left
    /// (another call rolled it on meanwhile) is counted in the word's
    /// window: rolling the word back would forget that window's calls, and
    /// the next call would roll it on afresh, admitting them again.
    #[test]
    fn a_late_call_counts_in_the_newer_window_and_forgets_none() {
        let cell = LimitCell::default();
        // Window 7 has 3 calls of 3 (fixed) when a call of window 6 arrives.
        cell.calls.store(pack(7, 3), Relaxed);
        // Its refusal waits for window 7's end: 1 ms of window 6, then 1000.
        let wait = fixed_in(&cell, 3, (6, 1000), || 1).map_err(|e| e.wait);
        assert_eq!(
            wait,
            Err(Some(Duration::from_millis(1001))),
            "counted in window 7: full"
        );
        let wait = fixed_in(&cell, 3, (7, 1000), || 1).map_err(|e| e.wait);
        assert_eq!(
            wait,
            Err(Some(Duration::from_millis(1))),
            "on time: window 7's 1 ms"
        );
        cell.calls.store(pack(7, 2), Relaxed);
        assert!(fixed_in(&cell, 3, (6, 1000), || 1).is_ok());
        assert_eq!(
            cell.calls.load(Relaxed),
            pack(7, 3),
            "window 7 keeps its calls"
        );
        assert!(fixed_in(&cell, 3, (7, 1000), || 1).is_err(), "and is full");
        // Windows further back, and forward, roll the word as before.
        cell.calls.store(pack(9, 3), Relaxed);
        assert!(fixed_in(&cell, 3, (6, 1000), || 1).is_ok());
        assert_eq!(cell.calls.load(Relaxed), pack(6, 1));
        assert!(fixed_in(&cell, 3, (7, 1000), || 1).is_ok());
        assert_eq!(cell.calls.load(Relaxed), pack(7, 1));
        // Across the 32 bits the word keeps.
        cell.calls.store(pack(0, 3), Relaxed);
        assert!(fixed_in(&cell, 3, (0xffff_ffff, 1000), || 1).is_err());
        // Sliding: window 7 has 2 calls and 10 before it (of 10 per 1000
        // ms): a call of window 6 weighs as at window 7's start, refused.
        let cell = LimitCell::default();
        cell.previous.store(pack(6, 10), Relaxed);
        cell.calls.store(pack(7, 0), Relaxed);
        // It waits the 1 ms left of window 6, then what window 7's start
        // would (1 ms: 10 * 999 < 10 * 1000).
        let wait = sliding_in(&cell, 10, 1000, 6, 999).map_err(|e| e.wait);
        assert_eq!(wait, Err(Some(Duration::from_millis(2))));
        assert_eq!(
            cell.calls.load(Relaxed),
            pack(7, 0),
            "window 7 keeps its calls"
        );
        // Late past the rolled window with room: counted in window 7.
        cell.previous.store(pack(6, 5), Relaxed);
        assert!(sliding_in(&cell, 10, 1000, 6, 999).is_ok());
        assert_eq!(cell.calls.load(Relaxed), pack(7, 1));
    }

    /// A word never written (0) is no window, not window 0 just after a
    /// call's: a first call in a window whose 32 bits are all ones counts
    /// there, and the next window (0 in 32 bits) starts empty (fixed), or
    /// weighs it as the one before (sliding).
    #[test]
    fn a_blank_word_is_no_window_after_the_call() {
        let last = 0xffff_ffff;
        let cell = LimitCell::default();
        assert!(fixed_in(&cell, 1, (last, 1000), || 1).is_ok());
        assert_eq!(cell.calls.load(Relaxed), pack(last, 1));
        assert!(
            fixed_in(&cell, 1, (last + 1, 1000), || 1).is_ok(),
            "a new window"
        );
        let cell = LimitCell::default();
        assert!(sliding_in(&cell, 1, 1000, last, 0).is_ok());
        assert_eq!(cell.calls.load(Relaxed), pack(last, 1));
        assert!(
            sliding_in(&cell, 1, 1000, last + 1, 999).is_ok(),
            "weighs 1/1000"
        );
    }

    /// A sliding window of plain numbers, counted by
    /// [`Limit::paced_at_once`] (issue 39), then [`Limit::paced_calls`],
    /// or by the latter alone, admits and refuses exactly as [`sliding`]
    /// does from the milliseconds, with the same wait, and leaves the same
    /// words, whatever they held: at a window's edges, near the amount and
    /// the 32 bits of a count, with a previous word of another window,
    /// before the epoch.
    #[test]
    fn a_plain_sliding_window_decides_as_the_milliseconds_do() {
        const MS: u64 = 1_000_000;
        let mut checked = 0;
        for w_ms in [1, 2, 7, 1000, 86_400_000] {
            let w_ns = w_ms * MS;
            for amount in [
                0,
                1,
                2,
                10,
                0xffff_fffe,
                0xffff_ffff,
                1 << 32,
                1 << 40,
                u64::MAX,
            ] {
                let rate = RateSpec {
                    amount,
                    window: Duration::from_millis(w_ms),
                };
                let plain = Plain::new(&rate).expect("a window's ns fit");
                let paced = Paced::SlidingPlain(plain);
                let counts: Vec<u64> = [0, 1, 2, 9, 10, 0xffff_fffe, 0xffff_ffff]
                    .into_iter()
                    .chain([amount.saturating_sub(1), amount, amount.saturating_add(1)])
                    .filter(|&c| c <= 0xffff_ffff)
                    .collect();
                for epoch in [0, 3 * MS + 7, 1 << 40] {
                    let mut times = vec![epoch.saturating_sub(1), epoch.saturating_sub(5 * MS)];
                    for k in [0u64, 1, 2, 5, 0xffff_ffff, 1 << 32] {
                        for at in [0, 1, MS - 1, MS, w_ns / 2, w_ns - MS, w_ns - 1] {
                            let since = k.checked_mul(w_ns).and_then(|t| t.checked_add(at));
                            times.extend(since.and_then(|t| t.checked_add(epoch)));
                        }
                    }
                    for now in times {
                        let now_ms = now.saturating_sub(epoch) / MS;
                        let number = now_ms / w_ms;
                        let near = [0, 1, 2, 5].map(|d| number.wrapping_sub(d));
                        let mut words = vec![0];
                        let mut previous = vec![0];
                        for window in near.into_iter().chain([number + 1]) {
                            for &c in &counts {
                                words.push(pack(window, c));
                                previous.push(pack(window, c));
                            }
                        }
                        for &word in &words {
                            for &p in &previous {
                                let (old, new, paced_cell) = (
                                    LimitCell::default(),
                                    LimitCell::default(),
                                    LimitCell::default(),
                                );
                                for cell in [&old, &new, &paced_cell] {
                                    cell.calls.store(word, Relaxed);
                                    cell.previous.store(p, Relaxed);
                                }
                                let want = sliding(&old, &rate, now_ms);
                                let since = now.saturating_sub(epoch);
                                let got = if Limit::paced_at_once(&new, Some(&paced), now, epoch) {
                                    Ok(())
                                } else {
                                    Limit::paced_calls(&new, &paced, since)
                                };
                                let by_paced = Limit::paced_calls(&paced_cell, &paced, since);
                                let words = |c: &LimitCell| {
                                    (c.calls.load(Relaxed), c.previous.load(Relaxed))
                                };
                                let ctx =
                                    || format!("{w_ms} {amount} {epoch} {now} {word:x} {p:x}");
                                assert_eq!(got, want, "{}", ctx());
                                assert_eq!(by_paced, want, "{}", ctx());
                                assert_eq!(words(&new), words(&old), "{}", ctx());
                                assert_eq!(words(&paced_cell), words(&old), "{}", ctx());
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 1_000_000, "{checked}");
    }

    /// A token bucket counted by [`Limit::paced_at_once`] (issue 39), then
    /// [`Limit::paced_calls`], admits and refuses exactly as [`bucket`]
    /// does, with the same wait, and leaves the same arrival time: ahead
    /// of now by up to the tolerance and past it, at the `u64`'s edge,
    /// before the epoch.
    #[test]
    fn a_token_bucket_at_once_decides_as_the_bucket_does() {
        let mut checked = 0;
        for (amount, w_ms, burst) in [(1, 1, 1), (3, 1000, 1), (3, 1000, 3), (10, 7, 4)] {
            let rate = RateSpec {
                amount,
                window: Duration::from_millis(w_ms),
            };
            let (interval, tolerance) = (interval_ns(&rate), tolerance_ns(&rate, burst));
            let paced = Paced::Bucket {
                interval_ns: interval,
                tolerance_ns: tolerance,
            };
            for epoch in [0u64, 12_345, 1 << 40] {
                for since in [0, 1, interval - 1, interval, 5 * interval + 3, u64::MAX - 1] {
                    let now = epoch.saturating_add(since);
                    for now in [now, epoch.saturating_sub(1)] {
                        let at = now.saturating_sub(epoch);
                        let ahead = [0, 1, tolerance, tolerance + 1, tolerance + interval];
                        let tats = ahead
                            .iter()
                            .flat_map(|&a| [at.saturating_add(a), at.saturating_sub(a)])
                            .chain([0, u64::MAX, u64::MAX - interval]);
                        for tat in tats {
                            let (old, new) = (LimitCell::default(), LimitCell::default());
                            old.calls.store(tat, Relaxed);
                            new.calls.store(tat, Relaxed);
                            let want = bucket(&old, &rate, burst, at);
                            let got = if Limit::paced_at_once(&new, Some(&paced), now, epoch) {
                                Ok(())
                            } else {
                                Limit::paced_calls(&new, &paced, at)
                            };
                            let ctx = format!("{amount} {w_ms} {burst} {epoch} {now} {tat}");
                            assert_eq!(got, want, "{ctx}");
                            assert_eq!(new.calls.load(Relaxed), old.calls.load(Relaxed), "{ctx}");
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 1000, "{checked}");
    }

    /// Nothing is counted at once for an engaged cell (its refusal is
    /// `try_acquire_any`'s), nor for a limit not paced, or a sliding
    /// window of no plain numbers.
    #[test]
    fn nothing_is_counted_at_once_engaged_or_unpaced() {
        let rate = RateSpec {
            amount: 10,
            window: Duration::from_secs(1),
        };
        let window = Plain::new(&rate).expect("plain");
        let bucket = Paced::Bucket {
            interval_ns: 1,
            tolerance_ns: 1_000,
        };
        let sliding = Paced::Sliding {
            amount: 10,
            w_ms: 1000,
            w: crate::divisor::Divisor::new(1000),
        };
        for paced in [Paced::SlidingPlain(window), bucket] {
            let cell = LimitCell::default();
            assert!(Limit::paced_at_once(&cell, Some(&paced), 5, 0), "free");
            let counted = cell.calls.load(Relaxed);
            cell.engaged_until.store(super::super::MANUAL, Relaxed);
            assert!(!Limit::paced_at_once(&cell, Some(&paced), 5, 0), "engaged");
            cell.engaged_until.store(7, Relaxed);
            assert!(!Limit::paced_at_once(&cell, Some(&paced), 5, 0), "engaged");
            assert_eq!(cell.calls.load(Relaxed), counted, "nothing counted");
        }
        let cell = LimitCell::default();
        assert!(!Limit::paced_at_once(&cell, None, 5, 0));
        assert!(!Limit::paced_at_once(&cell, Some(&sliding), 5, 0));
        assert_eq!(cell.calls.load(Relaxed), 0);
    }

    #[test]
    fn a_token_bucket_spaces_calls_by_the_rate() {
        let rate = RateSpec {
            amount: 3,
            window: Duration::from_secs(1),
        };
        assert_eq!(interval_ns(&rate), 333_333_334, "rounded up");
        assert_eq!(tolerance_ns(&rate, 1), 0);
        assert_eq!(tolerance_ns(&rate, 3), 666_666_668);
    }
}
