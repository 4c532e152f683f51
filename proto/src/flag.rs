//! Parsing of duration flags (`--drain-timeout 5s`, `--wait 500ms`) shared by
//! the three binaries, so that `govd`, `gov-agent` and `govc` accept the same
//! spellings and say the same thing about a bad one.

use std::time::Duration;

/// `250ms`, `5s`, `1.5s`, `2m` (or `2min`), `1h`, or a bare number of seconds: the
/// units of the language's durations, and a decimal fraction down to the
/// millisecond. Never panics: a value too large to represent, or finer than a
/// millisecond, is an error like any other bad input.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let bad = || format!("`{s}` is not a duration such as `5s`, `1.5s` or `500ms`");
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || (number.contains('.') && fraction.is_empty()) {
        return Err(bad());
    }
    let whole: u64 = whole.parse().map_err(|_| bad())?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(format!(
                "`{s}`: unknown unit `{unit}`, use `ms`, `s`, `m` (or `min`) or `h`"
            ));
        }
    };
    // The fraction in units of 10^-len, then in milliseconds; it must come out whole.
    let mut fraction_millis = 0u64;
    if !fraction.is_empty() {
        let digits = u32::try_from(fraction.len()).map_err(|_| bad())?;
        let scale = 10u64.checked_pow(digits).ok_or_else(bad)?;
        let numerator: u64 = fraction.parse().map_err(|_| bad())?;
        let scaled = u128::from(numerator) * u128::from(millis_per_unit);
        if scaled % u128::from(scale) != 0 {
            return Err(format!("`{s}` is finer than a millisecond"));
        }
        fraction_millis = u64::try_from(scaled / u128::from(scale)).map_err(|_| bad())?;
    }
    whole
        .checked_mul(millis_per_unit)
        .and_then(|ms| ms.checked_add(fraction_millis))
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{s}` is too large for a duration"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_spellings() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration(" 2m "), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("2min"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0.25m"), Ok(Duration::from_secs(15)));
        assert_eq!(
            parse_duration("2.5ms"),
            Err("`2.5ms` is finer than a millisecond".into())
        );
    }

    #[test]
    fn refuses_bad_input_without_panicking() {
        assert!(
            parse_duration("5d")
                .unwrap_err()
                .contains("unknown unit `d`")
        );
        assert!(parse_duration("1.s").is_err());
        assert!(parse_duration(".5s").is_err());
        assert!(parse_duration("1.2.3s").is_err());
        assert!(parse_duration("0.00000000000000000000001s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
        assert!(
            parse_duration("999999999999999999m")
                .unwrap_err()
                .contains("too large")
        );
    }
}
