//! Rolling-window counters for fuses: calls, business errors, system
//! errors and slow calls over the last `window`, in ten buckets, with
//! atomics only.
//!
//! The buckets are thread-striped ([`crate::stripe`]): each thread slot has
//! its own ten buckets, written only by the thread owning the slot with plain
//! loads and stores, so counting a call takes no locked instruction; the
//! sums over a window add every stripe's buckets. A bucket is tagged with
//! the window generation and its time index; a writer that finds a stale
//! tag in its own stripe restarts the bucket at its count. Forgetting
//! everything ([`RollingWindow::reset`]) bumps the generation, so it writes
//! no stripe.
//!
//! Each owned stripe keeps a cursor on the bucket it counted in last (its
//! start on the clock, its generation and place): a call that went well
//! inside it counts with one increment there, without working out the
//! bucket from the time (issue 39: the count of a successful call was the
//! largest part of a fuse's record).
//!
//! The shared stripe (threads without a slot) is written by several threads:
//! there the first writer that sees a stale bucket claims it (a
//! compare-exchange on its tag) and zeroes it, and counts use `fetch_add`.
//! A count that races with that reset, or with a reader summing a bucket
//! being restarted, may be lost or read late; fuses compare against
//! thresholds, so that is harmless, and it keeps the hot path lock-free.
//! The old calls of a restarted bucket are never read in the new window:
//! it is untagged while it is zeroed.

use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

use crate::clock::Now;
use crate::divisor::Divisor;
use crate::stripe::{self, Slot, Striped};

/// Buckets per window.
pub(crate) const BUCKETS: u64 = 10;

/// Bits of a bucket tag that hold the time index (the generation is above).
const INDEX_BITS: u32 = 44;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

/// [`RollingWindow::generation`] counts generations in steps of this, past
/// the place of a bucket in a stripe: a cursor keeps its generation and its
/// place in one word ([`Cursor::gen_at`]).
const GEN_STEP: u64 = 1 << 8;

// A place is below a step: a generation's places are its own.
const _: () = assert!(BUCKETS < GEN_STEP);

/// Sums over a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub calls: u64,
    pub business: u64,
    pub system: u64,
    /// Calls slower than the window's trip allows (its `slower_than`).
    pub slow: u64,
}

/// How one call ended, as a fuse counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Ok,
    Business,
    System,
}

/// A bucket's tag and error counts (its calls are in [`Buckets::calls`]).
#[derive(Debug, Default)]
struct Bucket {
    /// `generation / GEN_STEP << INDEX_BITS | (time index + 1)`; 0 means
    /// never used.
    tag: AtomicU64,
    business: AtomicU64,
    system: AtomicU64,
    slow: AtomicU64,
}

/// One stripe's buckets and its cursor (416 bytes, aligned to 64: no two
/// stripes share a cache line).
#[derive(Debug, Default)]
#[repr(align(64))]
struct Buckets {
    buckets: [Bucket; BUCKETS as usize],
    /// The calls of each bucket, apart (issue 39: a call that went well
    /// finds its count at eight bytes a place, with no multiply by a
    /// bucket's size).
    calls: [AtomicU64; BUCKETS as usize],
    /// The bucket this stripe counted in last, for the owner of the stripe
    /// alone (the shared stripe's is never used).
    cursor: Cursor,
}

/// Where an owned stripe counted last: the bucket at `at` holds the tag of
/// the bucket of the window that starts `from_ns` (on the clock,
/// [`Now::ns`]) in generation `g` (as [`RollingWindow::generation`] keeps
/// it, a multiple of [`GEN_STEP`]), `gen_at` = `g + at`, until the owner
/// writes another (issue 39: a call finds its bucket's place, and whether
/// its generation is the window's, in one subtraction: `at` below
/// [`BUCKETS`] in that generation alone). Never set: `neg_from_ns` 0 and
/// `gen_at` `u64::MAX`, at least [`GEN_STEP`] - 1 past any generation.
#[derive(Debug)]
struct Cursor {
    /// `from_ns` negated (wrapping): a time's distance past it is one add
    /// (issue 39: a subtraction took a copy of the time and a load too).
    neg_from_ns: AtomicU64,
    gen_at: AtomicU64,
}

impl Default for Cursor {
    fn default() -> Self {
        Self {
            neg_from_ns: AtomicU64::new(0),
            gen_at: AtomicU64::new(u64::MAX),
        }
    }
}

#[derive(Debug)]
pub(crate) struct RollingWindow {
    bucket_ms: Divisor,
    /// A bucket's length in nanoseconds (saturated: a bucket that long
    /// holds every call).
    bucket_ns: u64,
    /// The start of bucket 0 on the clock ([`Now::ns`]): the milliseconds
    /// given to [`RollingWindow::record`] count from it.
    epoch_ns: u64,
    /// Bumped by `reset`, by [`GEN_STEP`]: buckets of older generations
    /// count for nothing.
    generation: AtomicU64,
    stripes: Striped<Buckets>,
}

impl RollingWindow {
    /// A window of `window_ms` whose milliseconds count from `epoch_ns` on
    /// the clock ([`Now::ns`]).
    pub(crate) fn new(window_ms: u64, epoch_ns: u64) -> Self {
        let bucket_ms = Divisor::new(window_ms / BUCKETS);
        Self {
            bucket_ms,
            bucket_ns: bucket_ms.get().saturating_mul(1_000_000),
            epoch_ns,
            generation: AtomicU64::new(0),
            stripes: Striped::default(),
        }
    }

    /// The tag of the bucket holding `now_ms` in the current generation,
    /// its place in a stripe, and the generation (as `generation` keeps
    /// it).
    #[inline]
    fn tag(&self, now_ms: u64) -> (u64, usize, u64) {
        let index = self.bucket_ms.div(now_ms);
        let generation = self.generation.load(Acquire);
        let tag = ((generation / GEN_STEP) << INDEX_BITS) | ((index + 1) & INDEX_MASK);
        (tag, (index % BUCKETS) as usize, generation)
    }

    /// Counts one call that went well (no error, not slow) at `now`, in the
    /// stripe of `slot`: one increment in the bucket its cursor is on when
    /// `now` lies in that bucket (issue 39), else as
    /// [`RollingWindow::record`] counts it.
    #[inline]
    pub(crate) fn count_ok(&self, slot: Slot, now: Now) {
        let (stripe, owned) = self.stripes.get(slot);
        let c = &stripe.cursor;
        if owned
            && now.ns().wrapping_add(c.neg_from_ns.load(Relaxed)) < self.bucket_ns
            && let at = c
                .gen_at
                .load(Relaxed)
                .wrapping_sub(self.generation.load(Acquire))
            && let Some(calls) = stripe.calls.get(at as usize)
        {
            // Only this thread writes here, and the bucket's tag is the
            // one `now` has (`Cursor`).
            stripe::add(calls, true, 1);
            return;
        }
        self.count_ok_by_time(slot, now);
    }

    /// [`RollingWindow::count_ok`] off the cursor: by the milliseconds.
    #[inline(never)]
    fn count_ok_by_time(&self, slot: Slot, now: Now) {
        self.record(slot, now.ms_since(self.epoch_ns), Class::Ok, false);
    }

    /// Counts one call that ended at `now_ms` (milliseconds since the fuse's
    /// epoch), in the stripe of `slot`; `slow`: it was slower than the
    /// window's trip allows.
    pub(crate) fn record(&self, slot: Slot, now_ms: u64, class: Class, slow: bool) {
        let (tag, i, generation) = self.tag(now_ms);
        let (stripe, owned) = self.stripes.get(slot);
        let bucket = &stripe.buckets[i];
        let calls = &stripe.calls[i];
        let (business, system) = match class {
            Class::Ok => (0, 0),
            Class::Business => (1, 0),
            Class::System => (0, 1),
        };
        let slow = u64::from(slow);
        if owned {
            // Only this thread writes here.
            if bucket.tag.load(Relaxed) == tag {
                stripe::add(calls, true, 1);
                if class != Class::Ok {
                    stripe::add(&bucket.business, true, business);
                    stripe::add(&bucket.system, true, system);
                }
                if slow > 0 {
                    stripe::add(&bucket.slow, true, 1);
                }
            } else {
                calls.store(1, Relaxed);
                bucket.business.store(business, Relaxed);
                bucket.system.store(system, Relaxed);
                bucket.slow.store(slow, Relaxed);
                bucket.tag.store(tag, Release);
            }
            // The cursor is on this bucket now: its start on the clock
            // (`index * bucket_ms` ms after the epoch, `index` of `tag`).
            let index = self.bucket_ms.div(now_ms);
            let c = &stripe.cursor;
            let from_ns = self
                .epoch_ns
                .saturating_add(index.saturating_mul(self.bucket_ns));
            c.neg_from_ns.store(from_ns.wrapping_neg(), Relaxed);
            c.gen_at.store(generation + i as u64, Relaxed);
            return;
        }
        let current = bucket.tag.load(Relaxed);
        // Claimed as never used (0: no reader sums it) while it is zeroed,
        // then tagged (`Release`): a reader that sees the new tag sees the
        // bucket zeroed, never its calls of a window ago.
        if current < tag
            && bucket
                .tag
                .compare_exchange(current, 0, Relaxed, Relaxed)
                .is_ok()
        {
            calls.store(0, Relaxed);
            bucket.business.store(0, Relaxed);
            bucket.system.store(0, Relaxed);
            bucket.slow.store(0, Relaxed);
            bucket.tag.store(tag, Release);
        }
        calls.fetch_add(1, Relaxed);
        if business > 0 {
            bucket.business.fetch_add(1, Relaxed);
        }
        if system > 0 {
            bucket.system.fetch_add(1, Relaxed);
        }
        if slow > 0 {
            bucket.slow.fetch_add(1, Relaxed);
        }
    }

    /// Sums the buckets that lie within the window ending at `now_ms`.
    pub(crate) fn totals(&self, now_ms: u64) -> Totals {
        let (newest, _, _) = self.tag(now_ms);
        // Tags of the current generation from `oldest` to `newest` (the
        // index part never wraps: 2^44 ms is over 500 years).
        let oldest = (newest & !INDEX_MASK) | ((newest & INDEX_MASK).saturating_sub(BUCKETS - 1));
        let mut t = Totals::default();
        for stripe in self.stripes.all() {
            for (b, calls) in stripe.buckets.iter().zip(&stripe.calls) {
                let tag = b.tag.load(Acquire);
                if tag >= oldest.max(1) && tag <= newest && tag & INDEX_MASK != 0 {
                    t.calls += calls.load(Relaxed);
                    t.business += b.business.load(Relaxed);
                    t.system += b.system.load(Relaxed);
                    t.slow += b.slow.load(Relaxed);
                }
            }
        }
        t
    }

    /// Forgets everything (after a release, so old errors do not re-trip).
    pub(crate) fn reset(&self) {
        self.generation.fetch_add(GEN_STEP, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_within_window_and_forgets_old_buckets() {
        let w = RollingWindow::new(1000, 0); // 100 ms buckets
        let slot = stripe::current();
        w.record(slot, 0, Class::Business, false);
        w.record(slot, 50, Class::Ok, true);
        w.record(slot, 150, Class::System, false);
        assert_eq!(
            w.totals(150),
            Totals {
                calls: 3,
                business: 1,
                system: 1,
                slow: 1,
            }
        );
        // At 950 ms, bucket 0 is still inside the window (buckets 0..=9).
        assert_eq!(w.totals(950).calls, 3);
        // At 1000 ms the window is buckets 1..=10: bucket 0 is gone.
        assert_eq!(
            w.totals(1000),
            Totals {
                calls: 1,
                business: 0,
                system: 1,
                slow: 0,
            }
        );
        // Much later, everything is gone, and a reused bucket starts at zero.
        assert_eq!(w.totals(10_000), Totals::default());
        w.record(slot, 10_000, Class::Ok, true);
        assert_eq!(
            w.totals(10_000),
            Totals {
                calls: 1,
                business: 0,
                system: 0,
                slow: 1,
            }
        );
        w.reset();
        assert_eq!(w.totals(10_000), Totals::default());
    }

    /// A cursor never set, or set in another generation, is on no bucket:
    /// its word less the window's generation is [`BUCKETS`] or more
    /// (issue 39: one subtraction tells the place and the generation).
    #[test]
    fn a_cursor_of_another_generation_is_on_no_bucket() {
        let w = RollingWindow::new(1000, 0);
        for _ in 0..3 {
            let g = w.generation.load(Acquire);
            assert_eq!(g % GEN_STEP, 0);
            let never = Cursor::default().gen_at.load(Relaxed);
            assert!(never.wrapping_sub(g) >= BUCKETS);
            for at in 0..BUCKETS {
                assert_eq!((g + at).wrapping_sub(g), at);
                for other in [g.wrapping_sub(GEN_STEP), g + GEN_STEP, g + 7 * GEN_STEP] {
                    assert!((other + at).wrapping_sub(g) >= BUCKETS, "{other} {at}");
                }
            }
            w.reset();
        }
    }

    /// Calls counted by [`RollingWindow::count_ok`] (through the cursor or
    /// not) are counted as [`RollingWindow::record`] counts them, across
    /// buckets, windows, resets, a clock before the epoch and going back.
    #[test]
    fn counting_ok_calls_is_recording_them() {
        let epoch_ns = 5_000_000_123;
        let slot = stripe::current();
        for window_ms in [1000, 10, 7, 0, 60_000, u64::MAX] {
            let by_cursor = RollingWindow::new(window_ms, epoch_ns);
            let by_time = RollingWindow::new(window_ms, epoch_ns);
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            let mut ns = epoch_ns - 3_000_000;
            for i in 0..5_000u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ns = match x % 100 {
                    0 => ns.saturating_sub(x % 150_000_000),
                    1..=9 => ns + x % 1_500_000_000,
                    _ => ns + x % 2_000_000,
                };
                if i % 997 == 0 {
                    by_cursor.reset();
                    by_time.reset();
                }
                let now = Now::from_ns(ns);
                by_cursor.count_ok(slot, now);
                by_time.record(slot, now.ms_since(epoch_ns), Class::Ok, false);
                let now_ms = now.ms_since(epoch_ns);
                assert_eq!(
                    by_cursor.totals(now_ms),
                    by_time.totals(now_ms),
                    "{window_ms} ms, call {i} at {ns} ns"
                );
            }
        }
    }

    /// A reader summing the shared stripe while a writer starts buckets
    /// afresh never counts a restarted bucket's calls of a window ago (a
    /// fuse would trip on errors past its window; the shared stripe is
    /// written by every thread that has not decided).
    #[test]
    fn a_reader_never_sums_a_restarted_buckets_old_calls() {
        use std::sync::atomic::AtomicBool;
        const STEPS: u64 = 1_000_000;
        // A thousand calls in each of ten buckets, then one in each of ten.
        let calls = |k: u64| if k % 20 < 10 { 1000 } else { 1 };
        let w = std::sync::Arc::new(RollingWindow::new(1000, 0));
        let step = std::sync::Arc::new(AtomicU64::new(0));
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let writer = {
            let (w, step, done) = (w.clone(), step.clone(), done.clone());
            std::thread::spawn(move || {
                for s in 0..STEPS {
                    step.store(s, Release);
                    w.record(Slot::shared(), s * 100, Class::Ok, false);
                    // The step's other calls, in the bucket started (the
                    // shared stripe is the last), as many records would.
                    let shared = w.stripes.all().last().expect("a shared stripe");
                    shared.calls[(s % BUCKETS) as usize].fetch_add(calls(s) - 1, Relaxed);
                }
                done.store(true, Release);
            })
        };
        let mut checked = 0;
        while !done.load(Acquire) {
            let from = step.load(Acquire);
            let t = w.totals(from * 100);
            let to = step.load(Acquire);
            if to - from >= BUCKETS {
                continue;
            }
            // Each bucket read holds a step of the window from its first
            // step on (one restarted while it was read, a later step's):
            // at most the most calls of a step of its place.
            let most: u64 = (0..BUCKETS)
                .map(|at| {
                    let steps = from.saturating_sub(BUCKETS - 1)..=to;
                    steps
                        .filter(|k| k % BUCKETS == at)
                        .map(calls)
                        .max()
                        .unwrap_or(0)
                })
                .sum();
            assert!(
                t.calls <= most,
                "{} calls summed at {from}, at most {most}",
                t.calls
            );
            checked += 1;
        }
        writer.join().expect("the writer ends");
        assert!(checked > 0);
    }
}
