//! Instants as people write them in `.gov` files (`expires
//! 2026-12-31T00:00Z`): the RFC 3339 forms gov accepts, read into
//! milliseconds since the Unix epoch (UTC), and printed back.
//!
//! Accepted: `YYYY-MM-DDTHH:MM` with an optional `:SS` and, after the
//! seconds, an optional fraction of up to 9 digits (read to the
//! millisecond, the rest dropped), then a zone: `Z` or an offset `+HH:MM` /
//! `-HH:MM`. `T` and `Z` are upper case. Not accepted: a date alone (which
//! day's midnight where?), a time without a zone (local time differs per
//! machine), a leap second (`:60`), years before 1970. RFC 3339 makes the
//! seconds mandatory; gov lets them out (`00:00Z`) since an expiry to the
//! minute is the usual case.

use std::fmt;

/// Why an instant does not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, miette::Diagnostic)]
pub enum InstantError {
    #[error("`{0}` is not an RFC 3339 instant")]
    #[diagnostic(help(
        "write `YYYY-MM-DDTHH:MM[:SS[.fff]]` and a zone, `Z` or `+HH:MM`: `2026-12-31T00:00Z`"
    ))]
    Shape(String),
    #[error("`{text}` has no such {what}")]
    #[diagnostic(help(
        "months are 01-12, days exist in their month, hours 00-23, minutes and seconds 00-59, offsets at most 23:59"
    ))]
    Range { text: String, what: &'static str },
    #[error("`{0}` is before 1970")]
    #[diagnostic(help("an expiry is an instant after 1970-01-01T00:00Z"))]
    BeforeEpoch(String),
}

/// Reads `text` (the whole of it) into milliseconds since the Unix epoch.
pub fn parse(text: &str) -> Result<u64, InstantError> {
    let shape = || InstantError::Shape(text.to_string());
    let range = |what| InstantError::Range {
        text: text.to_string(),
        what,
    };
    let b = text.as_bytes();
    let num = |from: usize, len: usize| -> Result<u64, InstantError> {
        let digits = b.get(from..from + len).ok_or_else(shape)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return Err(shape());
        }
        Ok(digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
    };
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    if !(at(4, b'-') && at(7, b'-') && at(10, b'T') && at(13, b':')) {
        return Err(shape());
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute) = (num(11, 2)?, num(14, 2)?);
    let mut i = 16;
    let mut second = 0;
    let mut millis = 0;
    if at(i, b':') {
        second = num(i + 1, 2)?;
        i += 3;
        if at(i, b'.') {
            let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            if digits == 0 || digits > 9 {
                return Err(shape());
            }
            let padded = (0..3).fold(0, |n, k| {
                n * 10
                    + b.get(i + 1 + k)
                        .filter(|_| k < digits)
                        .map_or(0, |d| u64::from(d - b'0'))
            });
            millis = padded;
            i += 1 + digits;
        }
    }
    let offset_minutes: i64 = match b.get(i) {
        Some(b'Z') if i + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) if i + 6 == b.len() && at(i + 3, b':') => {
            let (h, m) = (num(i + 1, 2)?, num(i + 4, 2)?);
            if h > 23 || m > 59 {
                return Err(range("offset"));
            }
            let minutes = i64::try_from(h * 60 + m).map_err(|_| shape())?;
            if sign == b'+' { minutes } else { -minutes }
        }
        _ => return Err(shape()),
    };
    if !(1..=12).contains(&month) {
        return Err(range("month"));
    }
    if day == 0 || day > days_in_month(year, month) {
        return Err(range("day"));
    }
    if hour > 23 {
        return Err(range("hour"));
    }
    if minute > 59 {
        return Err(range("minute"));
    }
    if second > 59 {
        return Err(range("second"));
    }
    let days = days_from_civil(year, month, day);
    let local_ms = ((days * 24 + i64::try_from(hour).unwrap_or(0)) * 60
        + i64::try_from(minute).unwrap_or(0))
        * 60_000
        + i64::try_from(second * 1000 + millis).unwrap_or(0);
    let utc = local_ms - offset_minutes * 60_000;
    u64::try_from(utc).map_err(|_| InstantError::BeforeEpoch(text.to_string()))
}

fn leap(year: u64) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

fn days_in_month(year: u64, month: u64) -> u64 {
    match month {
        2 if leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: u64, month: u64, day: u64) -> i64 {
    let (y, m, d) = (
        i64::try_from(year).unwrap_or(0),
        i64::try_from(month).unwrap_or(1),
        i64::try_from(day).unwrap_or(1),
    );
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count from 1970-01-01 (`civil_from_days`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The machine's clock: milliseconds since the Unix epoch (0 before it).
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// An instant printed in UTC, RFC 3339 (`2026-12-31T00:00:00Z`, with
/// `.fff` only when it has milliseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Utc(pub u64);

impl fmt::Display for Utc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = i64::try_from(self.0).unwrap_or(i64::MAX);
        let (days, in_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
        let (y, m, d) = civil_from_days(days);
        let s = in_day / 1000;
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
            s / 3600,
            s / 60 % 60,
            s % 60
        )?;
        if in_day % 1000 != 0 {
            write!(f, ".{:03}", in_day % 1000)?;
        }
        f.write_str("Z")
    }
}

/// A span of milliseconds as people read it: `1h 2m`, `3m 4s`, `5s`,
/// `250ms` (the two largest units).
pub fn left(ms: u64) -> String {
    let (h, m, s) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60);
    match (h, m, s) {
        (0, 0, 0) => format!("{ms}ms"),
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m {s}s"),
        (h, m, _) => format!("{h}h {m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_accepted_forms_and_prints_utc() {
        assert_eq!(parse("1970-01-01T00:00Z"), Ok(0));
        assert_eq!(parse("2026-12-31T00:00Z"), Ok(1_798_675_200_000));
        assert_eq!(parse("2026-12-31T00:00:00Z"), Ok(1_798_675_200_000));
        assert_eq!(parse("2026-12-31T01:00+01:00"), Ok(1_798_675_200_000));
        assert_eq!(parse("2026-12-30T23:30-00:30"), Ok(1_798_675_200_000));
        assert_eq!(parse("2026-12-31T00:00:00.25Z"), Ok(1_798_675_200_250));
        assert_eq!(
            parse("2026-12-31T00:00:00.123456789Z"),
            Ok(1_798_675_200_123)
        );
        assert_eq!(
            parse("2024-02-29T12:00Z").map(Utc).map(|u| u.to_string()),
            Ok("2024-02-29T12:00:00Z".into())
        );
        assert_eq!(
            Utc(1_798_675_200_250).to_string(),
            "2026-12-31T00:00:00.250Z"
        );
        assert_eq!(left(7_320_000), "2h 2m");
        assert_eq!(left(61_000), "1m 1s");
        assert_eq!(left(999), "999ms");
    }

    #[test]
    fn refuses_every_other_form_without_panicking() {
        for bad in [
            "2026-12-31",
            "2026-12-31T00:00",
            "2026-12-31t00:00z",
            "2026-12-31T00:00:60Z",
            "2026-13-01T00:00Z",
            "2025-02-29T00:00Z",
            "2026-04-31T00:00Z",
            "2026-12-31T24:00Z",
            "2026-12-31T00:60Z",
            "2026-12-31T00:00+24:00",
            "2026-12-31T00:00:00.Z",
            "2026-12-31T00:00:00.1234567890Z",
            "2026-12-31T00:00ZZ",
            "1970-01-01T00:00+00:01",
            "",
            "2026-1-1T00:00Z",
            "２026-12-31T00:00Z",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
