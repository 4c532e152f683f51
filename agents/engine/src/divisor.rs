//! Division by a divisor fixed when a rule is built (a window's or a
//! bucket's length) as a multiply by its reciprocal (issue 39: a `div`
//! costs tens of cycles, twice on every governed call), exact.
//!
//! For `d` of `l = ceil(log2 d)` bits and `m = ceil(2^(63 + l) / d)` (below
//! 2^64), `floor(n / d) = floor(n * m / 2^(63 + l))` for every `n` below
//! 2^63 (Granlund and Montgomery, "Division by invariant integers using
//! multiplication", 1994, theorem 4.2: `m * d - 2^(63 + l) < d <= 2^l`). So
//! the high word of one multiply, shifted right by `l - 1`, divides any `n`
//! below 2^63 (292 years of nanoseconds since a rule's epoch); a larger `n`
//! (a time before the epoch, wrapped) is left to the caller.

/// A divisor and its reciprocal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Divisor {
    d: u64,
    /// `ceil(2^(63 + l) / d)` (0 for `d` = 1, which `max` = 0 keeps off
    /// the multiply but for `n` = 0).
    m: u64,
    /// `l - 1`: the shift of the multiply's high word.
    shift: u32,
    /// The largest `n` [`Divisor::div_near`] divides: 2^63 - 1.
    max: u64,
}

impl Divisor {
    /// Division by `d` (at least 1).
    pub(crate) fn new(d: u64) -> Self {
        let d = d.max(1);
        if d == 1 {
            return Self {
                d,
                m: 0,
                shift: 0,
                max: 0,
            };
        }
        let l = u64::BITS - (d - 1).leading_zeros();
        let m = (1u128 << (63 + l)).div_ceil(u128::from(d));
        Self {
            d,
            // Below 2^64 for any `d` of 2 or more (the module's doc).
            m: u64::try_from(m).unwrap_or(u64::MAX),
            shift: l - 1,
            max: (1 << 63) - 1,
        }
    }

    /// The divisor.
    #[inline]
    pub(crate) fn get(self) -> u64 {
        self.d
    }

    /// `n / d`, rounded down.
    #[inline]
    pub(crate) fn div(self, n: u64) -> u64 {
        self.div_near(n).unwrap_or_else(|| n / self.d)
    }

    /// `n / d` by the multiply alone: `None` for an `n` past its range
    /// (2^63 or more: a time before a rule's epoch, wrapped; none at all
    /// for `d` = 1), which a caller sends to its slow path with no division
    /// inline (issue 39). Its range was `n * d < 2^64` before, 18 seconds of
    /// nanoseconds for a window of one second: a limit older than that took
    /// its slow path on every call.
    #[inline]
    pub(crate) fn div_near(self, n: u64) -> Option<u64> {
        (n <= self.max).then(|| (((u128::from(n) * u128::from(self.m)) >> 64) as u64) >> self.shift)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divides_as_the_division_does() {
        let divisors = [
            1, 2, 3, 7, 10, 100, 999, 1000, 1024, 6000, 60_000, 3_600_000, 86_400_000,
        ];
        let mut ns: Vec<u64> = vec![0, 1, 2, 999, 1000, 1001, u64::MAX, u64::MAX - 1, 1 << 53];
        // Milliseconds since an epoch up to centuries, and around every multiple edge.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ns.push(x >> (x % 40));
        }
        for &d in &divisors {
            let v = Divisor::new(d);
            assert_eq!(v.get(), d);
            for k in [1u64, 2, 1000, 1 << 20, (1 << 40) / d.max(1)] {
                for n in [k * d - 1, k * d, k * d + 1] {
                    assert_eq!(v.div(n), n / d, "{n} / {d}");
                }
            }
            for &n in &ns {
                assert_eq!(v.div(n), n / d, "{n} / {d}");
            }
            // Past the multiply's range: divided.
            let edge = u64::MAX / d;
            for n in [edge, edge.saturating_add(1), u64::MAX] {
                assert_eq!(v.div(n), n / d, "{n} / {d}");
            }
        }
        // The multiply's range: every `n` below 2^63, whatever `d`.
        for &d in &divisors[1..] {
            let v = Divisor::new(d);
            let top = (1u64 << 63) - 1;
            let edges = [top, top - 1, top / d * d, top / d * d - 1, u64::MAX / d + 1];
            let edges = edges.into_iter().filter(|&n| n <= top);
            for n in edges.chain(ns.iter().map(|&n| n & top)) {
                assert_eq!(v.div_near(n), Some(n / d), "{n} / {d}");
            }
            for n in [1 << 63, u64::MAX] {
                assert_eq!(v.div_near(n), None, "{n} / {d}");
            }
        }
        // A window of one second in nanoseconds, a year after its epoch.
        let year_ns = 365 * 24 * 3600 * 1_000_000_000u64;
        assert_eq!(
            Divisor::new(1_000_000_000).div_near(year_ns),
            Some(365 * 24 * 3600)
        );
        let huge = Divisor::new((1 << 63) + 5);
        assert_eq!((huge.div_near(1), huge.div(u64::MAX)), (Some(0), 1));
        assert_eq!(Divisor::new(0).div(5), 5);
        assert_eq!(Divisor::new(1).div_near(0), Some(0));
        assert_eq!(Divisor::new(1).div_near(1), None);
        assert_eq!(Divisor::new(1000).div_near(u64::MAX), None);
        assert_eq!(
            Divisor::new(1000).div_near(u64::MAX / 1000),
            Some(u64::MAX / 1000 / 1000)
        );
    }
}
