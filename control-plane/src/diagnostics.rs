//! What govd says of a policy beside the compiler's diagnostics: the
//! compiler's own, capped for the wire, and the warning of an apply that
//! would empty every agent.

use gov_compiler::SourceFile;
use gov_proto::v1 as pb;

use crate::convert;

/// At most `max` diagnostics on the wire (errors come first), then one note
/// saying how many more there are.
pub fn wire_diagnostics(
    diagnostics: &gov_compiler::Diagnostics,
    files: &[SourceFile],
    max: usize,
) -> Vec<pb::Diagnostic> {
    let mut out: Vec<pb::Diagnostic> = diagnostics
        .iter()
        .take(max)
        .map(|d| convert::diagnostic(d, files))
        .collect();
    let total = diagnostics.iter().count();
    if total > out.len() {
        out.push(pb::Diagnostic {
            code: "gov::govd::diagnostics-truncated".into(),
            severity: pb::Severity::Advice as i32,
            message: format!(
                "{} more diagnostic(s) not shown (govd sends at most {max})",
                total - out.len()
            ),
            help: "run `govc check` on the files to see every diagnostic, or raise \
                   `govd --max-diagnostics` (GOV_MAX_DIAGNOSTICS)"
                .into(),
            ..Default::default()
        });
    }
    out
}

/// The services in force (listed, at most five named) when `after` has
/// none and `before` has some: an apply that empties every agent.
pub fn removes_every_service(before: &pb::Bundle, after: &pb::Bundle) -> Option<String> {
    if !after.targets.is_empty() || before.targets.is_empty() {
        return None;
    }
    let names: Vec<&str> = before.targets.iter().map(|t| t.service.as_str()).collect();
    let mut listed = names
        .iter()
        .take(5)
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > 5 {
        listed.push_str(&format!(" and {} more", names.len() - 5));
    }
    Some(listed)
}

/// What a dry run says of an apply [`removes_every_service`] would refuse.
/// Warnings for the rules of `bundle` whose `for` ran out before
/// `now_unix_ms` (the apply keeps their instant: keeping a rule never
/// restarts its clock). An `expires` in the past is the compiler's
/// `gov::lint::expired-rule`.
pub fn expired_for_warnings(bundle: &pb::Bundle, now_unix_ms: u64) -> Vec<pb::Diagnostic> {
    bundle
        .targets
        .iter()
        .flat_map(|t| &t.rules)
        .filter(|r| r.for_ms > 0 && r.expires_at_unix_ms > 0 && r.expires_at_unix_ms <= now_unix_ms)
        .map(|r| {
            let source = r.source.clone().unwrap_or_default();
            pb::Diagnostic {
                code: "gov::lint::expired-rule".into(),
                severity: pb::Severity::Warning as i32,
                message: format!(
                    "{} `{}` expired at {} (its `for` runs from the apply that introduced it): no agent enforces it",
                    r.kind().word(),
                    r.name,
                    gov_common::instant::Utc(r.expires_at_unix_ms)
                ),
                file: source.file,
                line: source.line,
                column: source.column,
                help: "remove the rule, or change its `for` (a changed `for` starts again at the apply)".into(),
                ..Default::default()
            }
        })
        .collect()
}

pub fn removes_every_service_warning(services: &str) -> pb::Diagnostic {
    pb::Diagnostic {
        code: "gov::govd::removes_every_service".into(),
        severity: pb::Severity::Warning as i32,
        message: format!(
            "this policy has no service, so applying it would remove the rules of every service ({services}) from every agent"
        ),
        help: "check that you passed the right files; to remove every service on purpose, apply with `govc apply --remove-all-services`".into(),
        ..Default::default()
    }
}
