//! Parsing of duration flags (`--drain-timeout 5s`, `--wait 500ms`) shared by
//! the three binaries, so that `govd`, `gov-agent` and `govc` accept the same
//! spellings and say the same thing about a bad one.

use std::time::Duration;

/// `250ms`, `5s`, `2m`, or a bare number of seconds. Never panics: a value too
/// large to represent is an error like any other bad input.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a duration such as `5s` or `500ms`"))?;
    let too_large = || format!("`{s}` is too large for a duration");
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => n
            .checked_mul(60)
            .map(Duration::from_secs)
            .ok_or_else(too_large),
        _ => Err(format!(
            "`{s}`: unknown unit `{unit}`, use `ms`, `s` or `m`"
        )),
    }
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
    }

    #[test]
    fn refuses_bad_input_without_panicking() {
        assert!(
            parse_duration("5h")
                .unwrap_err()
                .contains("unknown unit `h`")
        );
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
