//! How `govd` and `gov-agent` print a fatal error: its code, message, causes and
//! help on stderr, as miette's plain handler would, without pulling miette's
//! fancy renderer into the daemons (`govc` uses it); or, once the logs are
//! JSON (`--log-format json`), as one JSON line like every other log line.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by [`crate::log::init`] for `--log-format json`.
static JSON: AtomicBool = AtomicBool::new(false);

/// Fatal errors from now on as JSON lines (`--log-format json`).
pub fn set_json(json: bool) {
    JSON.store(json, Ordering::Relaxed);
}

/// Writes `error` to stderr (a closed stderr is ignored): `error[CODE]: message`, then each cause and the help.
pub fn plain(error: &(dyn miette::Diagnostic + 'static)) {
    if JSON.load(Ordering::Relaxed) {
        crate::errln!("{}", json(error, now_unix_ms()));
    } else {
        crate::err!("{}", render(error));
    }
}

/// One log line, as the JSON logs' (`timestamp`, `level`, `message`), with
/// the code, each cause and the help as fields.
fn json(error: &(dyn miette::Diagnostic + 'static), unix_ms: u64) -> String {
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        causes.push(cause.to_string());
        source = cause.source();
    }
    serde_json::json!({
        "timestamp": rfc3339(unix_ms),
        "level": "ERROR",
        "message": error.to_string(),
        "code": error.code().map(|c| c.to_string()),
        "causes": causes,
        "help": error.help().map(|h| h.to_string()),
    })
    .to_string()
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `2026-12-01T08:00:00Z` for ms since the epoch.
pub fn rfc3339(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // The inverse of `days_from_civil`.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

fn render(error: &(dyn miette::Diagnostic + 'static)) -> String {
    let mut out = match error.code() {
        Some(code) => format!("error[{code}]: {error}\n"),
        None => format!("error: {error}\n"),
    };
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        out.push_str(&format!("  caused by: {cause}\n"));
        source = cause.source();
    }
    if let Some(help) = error.help() {
        out.push_str(&format!("  help: {help}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    /// An error with a code, as the daemons report them.
    #[derive(Debug, thiserror::Error, miette::Diagnostic)]
    #[error("the path climbs above the root with `..`")]
    #[diagnostic(code(gov::path::above_root))]
    struct AboveRoot;

    #[test]
    fn a_fatal_error_is_one_json_line_when_the_logs_are_json() {
        let line = super::json(&AboveRoot, 1_796_112_000_000);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(v["level"], "ERROR");
        assert_eq!(v["timestamp"], "2026-12-01T08:00:00Z");
        assert_eq!(v["code"], "gov::path::above_root");
        assert_eq!(v["message"], "the path climbs above the root with `..`");
    }

    #[test]
    fn code_message_and_help_in_plain_text() {
        let text = super::render(&AboveRoot);
        assert_eq!(
            text,
            "error[gov::path::above_root]: the path climbs above the root with `..`\n"
        );
    }
}
