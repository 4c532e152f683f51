//! Literals as written: durations, sizes, percents, rates, status codes.

use std::fmt;

use super::span::Spanned;

// === Literals ===

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeUnit {
    Millis,  // ms
    Seconds, // s
    Minutes, // m or min
    Hours,   // h
}

/// A duration as written: `10ms`, `30s`, `1m`, `2h`; a fraction in the
/// largest unit it is whole in (`1.5s` is `1500ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Duration {
    pub value: i64,
    pub unit: TimeUnit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SizeUnit {
    B,
    /// 1000 bytes, written `kB` (the SI symbol) or `KB`; printed `kB`.
    KB,
    MB,  // 1000^2
    GB,  // 1000^3
    KiB, // 1024
    MiB, // 1024^2
    GiB, // 1024^3
}

/// A byte size as written: `512B`, `10KiB`, `5MB` (`10KB` reads as `10kB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Size {
    pub value: i64,
    pub unit: SizeUnit,
}

/// A percentage in thousandths of a percent: `50%` is 50_000, `12.5%` is 12_500.
/// At most three decimals are accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Percent {
    pub milli: i64,
}

/// An instant as written (`2026-12-31T00:00Z`) and what it means:
/// milliseconds since the Unix epoch, UTC ([`gov_common::instant`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Instant {
    pub unix_ms: u64,
    /// The text as written (the formatter prints it back).
    pub text: String,
}

/// `100 per 1s`: an amount per window.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rate<T> {
    pub amount: Spanned<T>,
    pub window: Spanned<Duration>,
}

/// An HTTP status code as written (range checked by the compiler).
pub type Status = Spanned<i64>;

// === impl literals ===

impl TimeUnit {
    /// The unit written `suffix` (`min` is `m`): the one table of time
    /// units apart from the grammar's `duration` rule.
    pub fn from_suffix(suffix: &str) -> Option<Self> {
        use TimeUnit::{Hours, Millis, Minutes, Seconds};
        let alias = (suffix == "min").then_some(Minutes);
        [Millis, Seconds, Minutes, Hours]
            .into_iter()
            .find(|u| u.suffix() == suffix)
            .or(alias)
    }

    /// The unit as written after the number (`Minutes` prints as `m`).
    pub const fn suffix(self) -> &'static str {
        match self {
            TimeUnit::Millis => "ms",
            TimeUnit::Seconds => "s",
            TimeUnit::Minutes => "m",
            TimeUnit::Hours => "h",
        }
    }

    pub const fn millis(self) -> i64 {
        match self {
            TimeUnit::Millis => 1,
            TimeUnit::Seconds => 1_000,
            TimeUnit::Minutes => 60_000,
            TimeUnit::Hours => 3_600_000,
        }
    }
}

impl Duration {
    /// The duration in milliseconds, `None` on overflow.
    pub const fn as_millis(&self) -> Option<i64> {
        self.value.checked_mul(self.unit.millis())
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.value, self.unit.suffix())
    }
}

impl SizeUnit {
    /// The unit written `suffix` (`KB` is `kB`): the one table of size
    /// units apart from the grammar's `size` rule.
    pub fn from_suffix(suffix: &str) -> Option<Self> {
        use SizeUnit::{B, GB, GiB, KB, KiB, MB, MiB};
        let alias = (suffix == "KB").then_some(KB);
        [B, KB, MB, GB, KiB, MiB, GiB]
            .into_iter()
            .find(|u| u.suffix() == suffix)
            .or(alias)
    }

    pub const fn suffix(self) -> &'static str {
        match self {
            SizeUnit::B => "B",
            SizeUnit::KB => "kB",
            SizeUnit::MB => "MB",
            SizeUnit::GB => "GB",
            SizeUnit::KiB => "KiB",
            SizeUnit::MiB => "MiB",
            SizeUnit::GiB => "GiB",
        }
    }

    pub const fn bytes(self) -> i64 {
        match self {
            SizeUnit::B => 1,
            SizeUnit::KB => 1_000,
            SizeUnit::MB => 1_000_000,
            SizeUnit::GB => 1_000_000_000,
            SizeUnit::KiB => 1 << 10,
            SizeUnit::MiB => 1 << 20,
            SizeUnit::GiB => 1 << 30,
        }
    }
}

impl Size {
    /// The size in bytes, `None` on overflow.
    pub const fn as_bytes(&self) -> Option<i64> {
        self.value.checked_mul(self.unit.bytes())
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.value, self.unit.suffix())
    }
}

impl Percent {
    /// The percentage as a fraction of one: `50%` is `0.5`.
    pub fn as_fraction(&self) -> f64 {
        self.milli as f64 / 100_000.0
    }
}

/// Prints the shortest form: `50%`, `12.5%`, `0.125%`.
impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.milli < 0 { "-" } else { "" };
        let abs = self.milli.unsigned_abs();
        let (whole, frac) = (abs / 1000, abs % 1000);
        if frac == 0 {
            write!(f, "{sign}{whole}%")
        } else {
            let digits = format!("{frac:03}");
            write!(f, "{sign}{whole}.{}%", digits.trim_end_matches('0'))
        }
    }
}
