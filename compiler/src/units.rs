//! Units: durations and sizes as base numbers, and readable renderings.
//!
//! The compiler works in milliseconds and bytes. Values saturate instead of
//! overflowing: a duration of `9223372036854775807h` is simply "huge", and the
//! range checks say so.

use gov_lang::ast::{Duration, Size, SizeUnit, TimeUnit};

/// A duration in milliseconds (the factors are the syntax tree's).
pub(crate) fn millis(d: &Duration) -> i64 {
    d.value.saturating_mul(d.unit.millis())
}

/// A size in bytes.
pub(crate) fn bytes(s: &Size) -> i64 {
    s.value.saturating_mul(s.unit.bytes())
}

/// `90000` -> `90s`, `1500` -> `1.5s`, `7200000` -> `2h`, `10` -> `10ms`.
/// The units are the language's ([`TimeUnit`]), as sizes are [`SizeUnit`]'s.
pub fn fmt_millis(ms: i64) -> String {
    use TimeUnit::{Hours, Minutes, Seconds};
    for unit in [Hours, Minutes, Seconds] {
        let factor = unit.millis();
        if ms != 0 && ms % factor == 0 {
            return format!("{}{}", ms / factor, unit.suffix());
        }
    }
    if ms.abs() >= 1_000 {
        // Not a whole number of seconds: at most three decimals.
        let s = format!("{:.3}", ms as f64 / 1_000.0);
        return format!("{}s", s.trim_end_matches('0').trim_end_matches('.'));
    }
    format!("{ms}ms")
}

/// `10485760` -> `10MiB`, `5000000` -> `5MB`, `700` -> `700B`.
pub fn fmt_bytes(b: i64) -> String {
    use SizeUnit::{GB, GiB, KB, KiB, MB, MiB};
    for unit in [GiB, GB, MiB, MB, KiB, KB] {
        let factor = unit.bytes();
        if b != 0 && b % factor == 0 {
            return format!("{}{}", b / factor, unit.suffix());
        }
    }
    format!("{b}B")
}

/// `50_000` thousandths -> `50%`, `12_500` -> `12.5%`.
pub fn fmt_milli_percent(milli: i64) -> String {
    if milli % 1_000 == 0 {
        return format!("{}%", milli / 1_000);
    }
    let s = format!("{}.{:03}", milli / 1_000, (milli % 1_000).abs());
    format!("{}%", s.trim_end_matches('0'))
}

/// A count or duration as `u64`; a negative one (which the range checks
/// report) as 0.
pub(crate) fn unsigned(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A count as `u32`; a negative or larger one (which the range checks
/// report) as 0.
pub(crate) fn u32_of(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// [`fmt_millis`] of an unsigned count of milliseconds.
pub(crate) fn fmt_ms(ms: u64) -> String {
    fmt_millis(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// Adds a field to a plan's list of a rule's fields, unless its value is
/// empty.
pub(crate) fn push(f: &mut Vec<(String, String)>, k: &str, v: String) {
    if !v.is_empty() {
        f.push((k.to_string(), v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_readable_units() {
        assert_eq!(fmt_millis(90_000), "90s");
        assert_eq!(fmt_millis(1_500), "1.5s");
        assert_eq!(fmt_millis(7_200_000), "2h");
        assert_eq!(fmt_millis(60_000), "1m");
        assert_eq!(fmt_millis(10), "10ms");
        assert_eq!(fmt_millis(0), "0ms");
        assert_eq!(fmt_bytes(10 << 20), "10MiB");
        assert_eq!(fmt_bytes(5_000_000), "5MB");
        assert_eq!(fmt_bytes(700), "700B");
        assert_eq!(fmt_milli_percent(50_000), "50%");
        assert_eq!(fmt_milli_percent(12_500), "12.5%");
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let d = Duration {
            value: i64::MAX,
            unit: TimeUnit::Hours,
        };
        assert_eq!(millis(&d), i64::MAX);
    }
}
