//! Rolling-window counters for fuses: calls, business errors and system
//! errors over the last `window`, in ten buckets, with atomics only.
//!
//! A bucket is reused when time moves past it: the first writer that sees a
//! stale bucket claims it (a compare-exchange on its epoch) and zeroes it. A
//! count that races with that reset may be lost; fuses compare against
//! thresholds, so that is harmless, and it keeps the hot path lock-free.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Buckets per window.
pub(crate) const BUCKETS: u64 = 10;

/// Sums over a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub calls: u64,
    pub business: u64,
    pub system: u64,
}

/// How one call ended, as a fuse counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Ok,
    Business,
    System,
}

#[derive(Debug, Default)]
struct Bucket {
    /// Bucket index + 1; 0 means never used.
    epoch: AtomicU64,
    calls: AtomicU64,
    business: AtomicU64,
    system: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct RollingWindow {
    bucket_ms: u64,
    buckets: Box<[Bucket]>,
}

impl RollingWindow {
    pub(crate) fn new(window_ms: u64) -> Self {
        Self {
            bucket_ms: (window_ms / BUCKETS).max(1),
            buckets: (0..BUCKETS).map(|_| Bucket::default()).collect(),
        }
    }

    /// Counts one call that ended at `now_ms` (milliseconds since the fuse's epoch).
    pub(crate) fn record(&self, now_ms: u64, class: Class) {
        let index = now_ms / self.bucket_ms;
        let bucket = &self.buckets[(index % BUCKETS) as usize];
        let epoch = bucket.epoch.load(Relaxed);
        if epoch != index + 1
            && epoch < index + 1
            && bucket
                .epoch
                .compare_exchange(epoch, index + 1, Relaxed, Relaxed)
                .is_ok()
        {
            bucket.calls.store(0, Relaxed);
            bucket.business.store(0, Relaxed);
            bucket.system.store(0, Relaxed);
        }
        bucket.calls.fetch_add(1, Relaxed);
        match class {
            Class::Ok => {}
            Class::Business => {
                bucket.business.fetch_add(1, Relaxed);
            }
            Class::System => {
                bucket.system.fetch_add(1, Relaxed);
            }
        }
    }

    /// Sums the buckets that lie within the window ending at `now_ms`.
    pub(crate) fn totals(&self, now_ms: u64) -> Totals {
        let index = now_ms / self.bucket_ms;
        let oldest = (index + 1).saturating_sub(BUCKETS - 1);
        let mut t = Totals::default();
        for b in &*self.buckets {
            let epoch = b.epoch.load(Relaxed);
            if epoch >= oldest && epoch <= index + 1 && epoch != 0 {
                t.calls += b.calls.load(Relaxed);
                t.business += b.business.load(Relaxed);
                t.system += b.system.load(Relaxed);
            }
        }
        t
    }

    /// Forgets everything (after a release, so old errors do not re-trip).
    pub(crate) fn reset(&self) {
        for b in &*self.buckets {
            b.epoch.store(0, Relaxed);
            b.calls.store(0, Relaxed);
            b.business.store(0, Relaxed);
            b.system.store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_within_window_and_forgets_old_buckets() {
        let w = RollingWindow::new(1000); // 100 ms buckets
        w.record(0, Class::Business);
        w.record(50, Class::Ok);
        w.record(150, Class::System);
        assert_eq!(
            w.totals(150),
            Totals {
                calls: 3,
                business: 1,
                system: 1
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
                system: 1
            }
        );
        // Much later, everything is gone, and a reused bucket starts at zero.
        assert_eq!(w.totals(10_000), Totals::default());
        w.record(10_000, Class::Ok);
        assert_eq!(
            w.totals(10_000),
            Totals {
                calls: 1,
                business: 0,
                system: 0
            }
        );
        w.reset();
        assert_eq!(w.totals(10_000), Totals::default());
    }
}
