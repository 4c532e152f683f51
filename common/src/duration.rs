//! Durations as people write them: `250ms`, `5s`, `1.5s`, `2m` (or `2min`),
//! `1h`. The one parser of duration flags (`govd`, `gov-agent`, `govc`, through
//! [`crate::flag::parse_duration`]) and of duration literals in `.gov` files
//! (gov-lang's grammar finds the token, this reads it), so that both accept the
//! same spellings and say the same thing about a bad one.
//!
//! A duration is a number, optionally with a decimal fraction, followed
//! directly by a unit; it must come out a whole number of milliseconds.
//! Never panics: a value too large to represent is an error like any other.

use std::fmt;

/// A time unit, as written after the number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// `ms`
    Millis,
    /// `s`
    Seconds,
    /// `m` or `min`
    Minutes,
    /// `h`
    Hours,
}

/// A duration as written, before it is turned into milliseconds: `1.5s` is
/// `whole` 1, `fraction_millis` 500, `unit` seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Literal {
    /// The whole units.
    pub whole: u64,
    /// The decimal fraction, in milliseconds (0 without one).
    pub fraction_millis: u64,
    pub unit: Unit,
}

/// Why a duration does not parse. Each carries the text as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, miette::Diagnostic)]
pub enum DurationError {
    #[error("`{0}` has no unit")]
    #[diagnostic(
        code(gov::duration::no_unit),
        help("durations need a unit: `ms`, `s`, `m` (or `min`) or `h`, as in `{0}s` or `{0}ms`")
    )]
    NoUnit(String),
    #[error("`{text}` has an unknown unit `{unit}`")]
    #[diagnostic(
        code(gov::duration::unknown_unit),
        help("use `ms`, `s`, `m` (or `min`) or `h`, as in `10ms` or `1.5s`")
    )]
    UnknownUnit { text: String, unit: String },
    #[error("`{0}` is not a duration")]
    #[diagnostic(
        code(gov::duration::syntax),
        help(
            "a duration is a number (a decimal fraction is allowed) followed directly by `ms`, `s`, `m` (or `min`) or `h`, as in `10ms` or `1.5s`"
        )
    )]
    Syntax(String),
    #[error("`{0}` is finer than a millisecond")]
    #[diagnostic(
        code(gov::duration::finer_than_a_millisecond),
        help("durations count whole milliseconds: round it to one, as in `1.5s` or `1500ms`")
    )]
    FinerThanAMillisecond(String),
    #[error("`{0}` is too large for a duration")]
    #[diagnostic(
        code(gov::duration::too_large),
        help("a duration fits in 64 bits of milliseconds (about 584 million years)")
    )]
    TooLarge(String),
}

// === impl Unit ===

impl Unit {
    /// Every unit, smallest first.
    pub const ALL: [Unit; 4] = [Unit::Millis, Unit::Seconds, Unit::Minutes, Unit::Hours];

    /// The unit written `suffix` (`min` is minutes, as `m` is).
    pub fn from_suffix(suffix: &str) -> Option<Self> {
        let alias = (suffix == "min").then_some(Unit::Minutes);
        Self::ALL
            .into_iter()
            .find(|u| u.suffix() == suffix)
            .or(alias)
    }

    /// How the unit is printed (minutes as `m`).
    pub const fn suffix(self) -> &'static str {
        match self {
            Unit::Millis => "ms",
            Unit::Seconds => "s",
            Unit::Minutes => "m",
            Unit::Hours => "h",
        }
    }

    /// Milliseconds in one unit.
    pub const fn millis(self) -> u64 {
        match self {
            Unit::Millis => 1,
            Unit::Seconds => 1_000,
            Unit::Minutes => 60_000,
            Unit::Hours => 3_600_000,
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.suffix())
    }
}

// === impl Literal ===

impl Literal {
    /// The whole duration in milliseconds; `text` is what the error quotes.
    pub fn millis(&self, text: &str) -> Result<u64, DurationError> {
        self.whole
            .checked_mul(self.unit.millis())
            .and_then(|ms| ms.checked_add(self.fraction_millis))
            .ok_or_else(|| DurationError::TooLarge(text.to_owned()))
    }
}

/// Reads a duration written as the language and the flags write them.
pub fn parse(text: &str) -> Result<Literal, DurationError> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let syntax = || DurationError::Syntax(text.to_owned());
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || (number.contains('.') && fraction.is_empty()) || fraction.contains('.') {
        return Err(syntax());
    }
    if suffix.is_empty() {
        return Err(DurationError::NoUnit(text.to_owned()));
    }
    let Some(unit) = Unit::from_suffix(suffix) else {
        // `-1s`, `1 s`, `s`: not a number and a unit at all.
        return Err(if suffix.starts_with(|c: char| c.is_ascii_alphabetic()) {
            DurationError::UnknownUnit {
                text: text.to_owned(),
                unit: suffix.to_owned(),
            }
        } else {
            syntax()
        });
    };
    let whole: u64 = whole
        .parse()
        .map_err(|_| DurationError::TooLarge(text.to_owned()))?;
    // The fraction in units of 10^-digits, then in milliseconds: it must come
    // out whole. Trailing zeros say nothing (`1.50s` is `1.5s`).
    let fraction = fraction.trim_end_matches('0');
    let mut fraction_millis = 0;
    if !fraction.is_empty() {
        let finer = || DurationError::FinerThanAMillisecond(text.to_owned());
        // A unit is at most 3.6e6 ms: more than 7 significant decimals is finer.
        let digits = u32::try_from(fraction.len()).map_err(|_| finer())?;
        if digits > 7 {
            return Err(finer());
        }
        let numerator: u64 = fraction.parse().map_err(|_| syntax())?;
        let scaled = numerator * unit.millis();
        let scale = 10u64.pow(digits);
        if !scaled.is_multiple_of(scale) {
            return Err(finer());
        }
        fraction_millis = scaled / scale;
    }
    Ok(Literal {
        whole,
        fraction_millis,
        unit,
    })
}

/// Reads a duration and returns it in milliseconds.
pub fn parse_millis(text: &str) -> Result<u64, DurationError> {
    parse(text)?.millis(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> Result<u64, DurationError> {
        parse_millis(text)
    }

    #[test]
    fn accepts_every_unit_and_fractions_down_to_the_millisecond() {
        assert_eq!(ms("5s"), Ok(5_000));
        assert_eq!(ms("0s"), Ok(0));
        assert_eq!(ms("250ms"), Ok(250));
        assert_eq!(ms("2m"), Ok(120_000));
        assert_eq!(ms("2min"), Ok(120_000));
        assert_eq!(ms("1h"), Ok(3_600_000));
        assert_eq!(ms("1.5s"), Ok(1_500));
        assert_eq!(ms("1.50s"), Ok(1_500));
        assert_eq!(ms("0.25m"), Ok(15_000));
        assert_eq!(ms("0.0001h"), Ok(360));
        assert_eq!(ms("2.000ms"), Ok(2));
        assert_eq!(
            parse("1.5h"),
            Ok(Literal {
                whole: 1,
                fraction_millis: 1_800_000,
                unit: Unit::Hours
            })
        );
    }

    #[test]
    fn says_what_is_wrong() {
        assert_eq!(ms("7"), Err(DurationError::NoUnit("7".into())));
        assert_eq!(ms("1.5"), Err(DurationError::NoUnit("1.5".into())));
        assert_eq!(
            ms("5d"),
            Err(DurationError::UnknownUnit {
                text: "5d".into(),
                unit: "d".into()
            })
        );
        assert_eq!(
            ms("2.5ms"),
            Err(DurationError::FinerThanAMillisecond("2.5ms".into()))
        );
        assert_eq!(
            ms("0.00000000000000000000001s"),
            Err(DurationError::FinerThanAMillisecond(
                "0.00000000000000000000001s".into()
            ))
        );
        assert_eq!(
            ms("99999999999999999999s"),
            Err(DurationError::TooLarge("99999999999999999999s".into()))
        );
        assert_eq!(
            ms("999999999999999999m"),
            Err(DurationError::TooLarge("999999999999999999m".into()))
        );
        for bad in [
            "", "1.s", ".5s", "1.2.3s", "-1s", "ms", "1 s", " 5s", "5s ", "1m30s",
        ] {
            assert!(ms(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn every_suffix_reads_back() {
        for unit in Unit::ALL {
            assert_eq!(Unit::from_suffix(unit.suffix()), Some(unit));
            assert_eq!(ms(&format!("3{unit}")), Ok(3 * unit.millis()));
        }
    }
}
