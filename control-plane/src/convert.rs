//! Conversions at the wire edge: compiler diagnostics to `gov.v1.Diagnostic`,
//! compiler plans to `gov.v1.Plan`, and clock helpers.

use std::time::{SystemTime, UNIX_EPOCH};

use gov_compiler::SourceFile;
use gov_proto::v1 as pb;
use miette::{Diagnostic as _, LabeledSpan, Severity};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A compiler diagnostic as it travels to `govc`: code, severity, message,
/// the primary location (file, 1-based line and column), help, and every
/// other label (including those of related diagnostics such as "first
/// defined here").
pub fn diagnostic(d: &gov_compiler::Diagnostic, files: &[SourceFile]) -> pb::Diagnostic {
    let severity = match d.severity() {
        Some(Severity::Warning) => pb::Severity::Warning,
        Some(Severity::Advice) => pb::Severity::Advice,
        Some(Severity::Error) | None => pb::Severity::Error,
    };
    let mut labels = located_labels(d, files);
    if let Some(related) = d.related() {
        for r in related {
            labels.extend(located_labels(r, files));
        }
    }
    let primary = labels
        .iter()
        .position(|(primary, _)| *primary)
        .or(if labels.is_empty() { None } else { Some(0) });
    let (file, line, column) = match primary {
        Some(i) => {
            let (_, l) = labels.remove(i);
            (l.file, l.line, l.column)
        }
        None => (String::new(), 0, 0),
    };
    pb::Diagnostic {
        code: d.code().map(|c| c.to_string()).unwrap_or_default(),
        severity: severity as i32,
        message: d.to_string(),
        file,
        line,
        column,
        help: d.help().map(|h| h.to_string()).unwrap_or_default(),
        labels: labels.into_iter().map(|(_, l)| l).collect(),
    }
}

/// Every label of `d` with its file name, line and column.
fn located_labels(
    d: &dyn miette::Diagnostic,
    files: &[SourceFile],
) -> Vec<(bool, pb::DiagnosticLabel)> {
    let Some(labels) = d.labels() else {
        return Vec::new();
    };
    let source = d.source_code();
    labels
        .map(|l: LabeledSpan| {
            let name = source
                .and_then(|s| s.read_span(l.inner(), 0, 0).ok())
                .and_then(|c| c.name().map(str::to_owned))
                .unwrap_or_default();
            let (line, column) = files
                .iter()
                .find(|f| f.name == name)
                .map_or((0, 0), |f| line_column(&f.text, l.offset()));
            (
                l.primary(),
                pb::DiagnosticLabel {
                    message: l.label().unwrap_or_default().to_owned(),
                    file: name,
                    line,
                    column,
                },
            )
        })
        .collect()
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
pub fn line_column(text: &str, offset: usize) -> (u32, u32) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (
        u32::try_from(line).unwrap_or(u32::MAX),
        u32::try_from(col).unwrap_or(u32::MAX),
    )
}

/// The wire plan: only the services that change (the compiler's plan lists
/// every service).
pub fn plan(p: &gov_compiler::Plan) -> pb::Plan {
    let mut out = p.to_proto();
    out.services.retain(|s| s.change() != pb::Change::Unchanged);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based() {
        let text = "a\nbc\ndéf";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 3), (2, 2));
        assert_eq!(line_column(text, text.find('f').unwrap()), (3, 3));
    }

    #[test]
    fn compiler_errors_keep_code_location_and_help() {
        let files = [SourceFile::new(
            "bad.gov",
            "service a {\n  bulkhead b on nope {\n    max_concurrent 1\n  }\n}\n",
        )];
        let Err(diags) = gov_compiler::compile(&files) else {
            panic!("must not compile")
        };
        let wire: Vec<_> = diags.iter().map(|d| diagnostic(d, &files)).collect();
        let d = wire
            .iter()
            .find(|d| d.code == "gov::unknown-match")
            .expect("unknown match");
        assert_eq!(d.severity(), pb::Severity::Error);
        assert_eq!((d.file.as_str(), d.line), ("bad.gov", 2));
        assert!(d.column > 1);
        assert!(d.message.contains("nope"), "{}", d.message);
    }
}
