//! Printing diagnostics, for people or for tools.
//!
//! Every command that reports diagnostics flattens [`ReportArgs`] into its
//! arguments and hands its diagnostics to a [`Reporter`]:
//!
//! ```ignore
//! let reporter = Reporter::new(args.report.error_format);
//! let summary = reporter.emit(&diagnostics);
//! summary.exit_code(args.deny_warnings)
//! ```
//!
//! `human` is miette's graphical report, headed by the primary label (see
//! [`Focused`]), coloured only when stderr is a terminal and `NO_COLOR` is
//! unset or empty. `json` is one object per diagnostic per line, with the
//! fields of miette's JSON report; every label span carries, beside its
//! byte `offset` and `length`, the 1-based `line` and `column` where it
//! starts and `end_line` / `end_column` where it ends (columns count UTF-8
//! bytes, as the human header shows them), and whether it is `primary`. The
//! object's own `line` and `column` are those of its primary label.

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use gov_lang::report::Focused;
use miette::{Diagnostic, GraphicalReportHandler, GraphicalTheme, Severity, SourceCode};
use serde_json::{Value, json};

/// `-o` of the commands that read the control plane (`status`, `audit`):
/// tables for people, JSON for tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// How diagnostics are printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ErrorFormat {
    /// Graphical reports with the source snippet.
    #[default]
    Human,
    /// One JSON object per diagnostic per line.
    Json,
}

/// The `--error-format` option.
#[derive(Clone, Debug, clap::Args)]
pub struct ReportArgs {
    /// How to print diagnostics on stderr.
    #[arg(long, value_enum, env = "GOV_ERROR_FORMAT", default_value_t = ErrorFormat::Human)]
    pub error_format: ErrorFormat,
}

/// Prints diagnostics to stderr.
pub struct Reporter {
    format: ErrorFormat,
    color: bool,
}

/// How many diagnostics of each severity were printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub errors: usize,
    pub warnings: usize,
}

// === impl Reporter ===

/// Width of human reports: fixed so output does not depend on the terminal.
const WIDTH: usize = 100;

impl Reporter {
    /// Colour is on only for a terminal without `NO_COLOR`.
    pub fn new(format: ErrorFormat) -> Self {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Reporter {
            format,
            color: !no_color && std::io::stderr().is_terminal(),
        }
    }

    /// One diagnostic as text: a graphical report, or one JSON line.
    pub fn render(&self, diagnostic: &dyn Diagnostic) -> String {
        let mut out = String::new();
        let result = match self.format {
            ErrorFormat::Human => {
                let theme = if self.color {
                    GraphicalTheme::unicode()
                } else {
                    GraphicalTheme::unicode_nocolor()
                };
                // The header names the primary label, not the first in
                // source order.
                GraphicalReportHandler::new_themed(theme)
                    .with_width(WIDTH)
                    .render_report(&mut out, &Focused::new(diagnostic))
            }
            ErrorFormat::Json => {
                out = to_json(diagnostic, None).to_string();
                Ok(())
            }
        };
        if result.is_err() {
            // Rendering into a String fails only if a Display impl fails;
            // the message alone is still worth printing.
            out = diagnostic.to_string();
        }
        if !out.ends_with('\n') {
            out.push('\n');
        }
        out
    }

    /// Prints every diagnostic to stderr and counts them.
    pub fn emit<'a>(&self, diagnostics: impl IntoIterator<Item = &'a miette::Report>) -> Summary {
        let mut summary = Summary::default();
        let mut stderr = std::io::stderr().lock();
        for report in diagnostics {
            let diagnostic: &dyn Diagnostic = report.as_ref();
            match diagnostic.severity() {
                Some(Severity::Warning) => summary.warnings += 1,
                Some(Severity::Advice) => {}
                Some(Severity::Error) | None => summary.errors += 1,
            }
            // A closed stderr is not worth a panic; the exit code still tells.
            let _ = stderr.write_all(self.render(diagnostic).as_bytes());
        }
        summary
    }
}

/// One diagnostic as a JSON object (`parent` gives the source to related
/// diagnostics that have none of their own).
fn to_json(d: &dyn Diagnostic, parent: Option<&dyn SourceCode>) -> Value {
    let source = d.source_code().or(parent);
    let severity = match d.severity() {
        Some(Severity::Warning) => "warning",
        Some(Severity::Advice) => "advice",
        Some(Severity::Error) | None => "error",
    };
    let mut causes = Vec::new();
    let mut cause = std::error::Error::source(d);
    while let Some(c) = cause {
        causes.push(c.to_string());
        cause = c.source();
    }
    let labels: Vec<_> = d.labels().into_iter().flatten().collect();
    let primary = labels.iter().find(|l| l.primary()).or(labels.first());
    let at = |offset: usize| {
        source
            .and_then(|s| gov_lang::report::position(s, &miette::SourceSpan::new(offset.into(), 0)))
    };
    let (line, column) = primary.and_then(|l| at(l.offset())).unzip();
    let labels: Vec<Value> = labels
        .iter()
        .map(|l| {
            let (line, column) = at(l.offset()).unzip();
            let (end_line, end_column) = at(l.offset() + l.len()).unzip();
            json!({
                "label": l.label(),
                "primary": l.primary(),
                "span": {
                    "offset": l.offset(),
                    "length": l.len(),
                    "line": line,
                    "column": column,
                    "end_line": end_line,
                    "end_column": end_column,
                },
            })
        })
        .collect();
    let related: Vec<Value> = d
        .related()
        .into_iter()
        .flatten()
        .map(|r| to_json(r, source))
        .collect();
    let filename = source
        .and_then(|s| s.read_span(&(0, 0).into(), 0, 0).ok())
        .and_then(|c| c.name().map(str::to_owned));
    json!({
        "message": d.to_string(),
        "code": d.code().map(|c| c.to_string()),
        "severity": severity,
        "causes": causes,
        "url": d.url().map(|u| u.to_string()),
        "help": d.help().map(|h| h.to_string()),
        "filename": filename,
        "line": line,
        "column": column,
        "labels": labels,
        "related": related,
    })
}

// === impl Summary ===

impl Summary {
    /// 0 when clean, 1 on errors (or on warnings with `deny_warnings`).
    pub fn exit_code(&self, deny_warnings: bool) -> ExitCode {
        if self.errors > 0 || (deny_warnings && self.warnings > 0) {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }
}
