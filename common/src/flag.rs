//! Parsing of duration flags (`--drain-timeout 5s`, `--wait 500ms`) shared by
//! the three binaries, so that `govd`, `gov-agent` and `govc` accept the same
//! spellings as `.gov` files do and say the same thing about a bad one.

use std::time::Duration;

use crate::duration::parse_millis;

/// `250ms`, `5s`, `1.5s`, `2m` (or `2min`), `1h`: [`crate::duration`]'s rules,
/// the language's. The error is the duration error and its help on one line,
/// as clap prints it after the flag's name.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_millis(s)
        .map(Duration::from_millis)
        .map_err(|e| match miette::Diagnostic::help(&e) {
            Some(help) => format!("{e}; {help}"),
            None => e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_spellings() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2min"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn says_what_to_write_instead() {
        assert_eq!(
            parse_duration("7"),
            Err("`7` has no unit; durations need a unit: `ms`, `s`, `m` (or `min`) or `h`, as in `7s` or `7ms`".into())
        );
        assert!(
            parse_duration("5d")
                .unwrap_err()
                .starts_with("`5d` has an unknown unit `d`; use `ms`")
        );
        assert!(
            parse_duration("2.5ms")
                .unwrap_err()
                .starts_with("`2.5ms` is finer than a millisecond")
        );
    }
}
