//! How `govd` and `gov-agent` log: to stderr, filtered by `GOV_LOG` or `RUST_LOG`,
//! as text (the default) or one JSON object per line (`--log-format json`).
//!
//! A log write that fails (stderr closed: `govd 2>&1 | head -3`) is dropped. The
//! subscriber's own report of such a failure is turned off: it is an `eprintln!`,
//! which panics on the same closed stderr, inside whichever task was logging.

use std::str::FromStr;

use tracing_subscriber::EnvFilter;

/// The filter when neither variable is set.
const DEFAULT_FILTER: &str = "info";

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event, coloured on a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the
    /// event's fields at the top level.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(format!("`{s}` is not a log format: use `text` or `json`")),
        }
    }
}

/// A log filter that cannot be parsed.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("`{var}={value}` is not a valid log filter: {message}")]
#[diagnostic(
    code(gov::log::filter),
    help("use a level (`info`, `debug`) or directives such as `info,gov_agent=debug`")
)]
pub struct FilterError {
    /// The variable it came from (`GOV_LOG` or `RUST_LOG`).
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// The parser's reason.
    pub message: String,
}

/// Which variable gives the filter: `GOV_LOG` if set, else `RUST_LOG`, else none
/// (the default, `info`).
pub fn filter_source(
    gov_log: Option<String>,
    rust_log: Option<String>,
) -> Option<(&'static str, String)> {
    gov_log
        .map(|v| ("GOV_LOG", v))
        .or_else(|| rust_log.map(|v| ("RUST_LOG", v)))
}

/// Installs the global subscriber on stderr. Call once, first thing in `main`.
pub fn init(format: LogFormat) -> Result<(), FilterError> {
    let source = filter_source(
        std::env::var("GOV_LOG").ok(),
        std::env::var("RUST_LOG").ok(),
    );
    let filter = match source {
        None => EnvFilter::new(DEFAULT_FILTER),
        Some((var, value)) => EnvFilter::try_new(&value).map_err(|e| FilterError {
            var,
            value,
            message: e.to_string(),
        })?,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    // `try_init` fails only when a subscriber is already installed (a second
    // call); the first one stays, which is what the caller wants.
    crate::report::set_json(format == LogFormat::Json);
    // Colour on a terminal, unless NO_COLOR is set (https://no-color.org).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = match format {
        LogFormat::Text => builder.with_ansi(colour).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_ansi(false)
            .try_init(),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gov_log_wins_over_rust_log() {
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(
            filter_source(some("debug"), some("warn")),
            Some(("GOV_LOG", "debug".to_owned()))
        );
        assert_eq!(
            filter_source(None, some("warn")),
            Some(("RUST_LOG", "warn".to_owned()))
        );
        assert_eq!(filter_source(None, None), None);
    }

    #[test]
    fn formats_parse() {
        assert_eq!("text".parse(), Ok(LogFormat::Text));
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert!("yaml".parse::<LogFormat>().unwrap_err().contains("`yaml`"));
    }
}
