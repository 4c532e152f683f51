//! Division by a divisor fixed when a rule is built (a window's or a
//! bucket's milliseconds) as a multiply by its reciprocal (issue 39: a
//! `div` costs tens of cycles, twice on every governed call), exact.
//!
//! With `m = floor((2^64 - 1) / d) + 1`, `2^64 / d <= m < 2^64 / d + 1`, so
//! `n * m / 2^64` lies in `[n / d, n / d + n / 2^64)`: its floor is
//! `floor(n / d)` whenever `n / 2^64 < 1 / d`, that is `n * d < 2^64`
//! (`n <= floor((2^64 - 1) / d)`). Any larger `n` is divided.

/// A divisor and its reciprocal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Divisor {
    d: u64,
    /// `floor((2^64 - 1) / d) + 1` (0 for `d` = 1, which `max` = 0 keeps
    /// off the multiply but for `n` = 0).
    m: u64,
    /// The largest `n` the multiply divides exactly: `floor((2^64 - 1) / d)`.
    max: u64,
}

impl Divisor {
    /// Division by `d` (at least 1).
    pub(crate) fn new(d: u64) -> Self {
        let d = d.max(1);
        if d == 1 {
            return Self { d, m: 0, max: 0 };
        }
        let max = u64::MAX / d;
        Self { d, m: max + 1, max }
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
    /// (above `floor((2^64 - 1) / d)`, none at all for `d` = 1), which a
    /// caller sends to its slow path with no division inline (issue 39).
    #[inline]
    pub(crate) fn div_near(self, n: u64) -> Option<u64> {
        (n <= self.max).then(|| ((u128::from(n) * u128::from(self.m)) >> 64) as u64)
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
