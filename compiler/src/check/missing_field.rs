//! `gov::missing-field`: a rule without the setting that gives it meaning:
//! a bulkhead without `max_concurrent`, a limit without `calls` or `bytes`,
//! a fuse without any `trip when`.
//!
//! Why: such a rule would enforce nothing, yet reads as protection.
//! Sentinel and ServiceComb skip such a rule with a log line at run time;
//! here it is an error before anything is applied.
//!
//! Also: a limit counted `per domain` in a service that declares no
//! `domain "..."`: there is no domain to count by.
//!
//! Example: `bulkhead b on slow { max_wait 10ms }`.
//!
//! Fix: add the missing setting (the help says which and what it means).

use miette::SourceSpan;
use thiserror::Error;

use gov_lang::ast::{BulkheadSetting, FuseSetting, LimitKey, LimitSetting};

use crate::diagnostic::Diagnostic;
use crate::resolve::{Ctx, Rule, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("{kind} `{name}` has no {missing}")]
#[diagnostic(code("gov::missing-field"))]
pub struct MissingField {
    pub kind: String,
    pub name: String,
    pub missing: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "{label}")]
    pub span: SourceSpan,
    pub label: String,
    #[help]
    pub help: String,
}

pub(crate) fn check(cx: &Ctx<'_>, out: &mut Vec<Diagnostic>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let (missing, help) = match rule {
                Rule::Bulkhead(b)
                    if !b
                        .settings
                        .iter()
                        .any(|s| matches!(s, BulkheadSetting::MaxConcurrent { .. })) =>
                {
                    (
                        "`max_concurrent`",
                        "add `max_concurrent N`: the most calls in flight at once",
                    )
                }
                Rule::Limit(l)
                    if !l.settings.iter().any(|s| {
                        matches!(s, LimitSetting::Calls { .. } | LimitSetting::Bytes { .. })
                    }) =>
                {
                    (
                        "`calls` or `bytes`",
                        "add `calls N per D`, `bytes SIZE per D`, or both",
                    )
                }
                Rule::Fuse(f) if !f.settings.iter().any(|s| matches!(s, FuseSetting::Trip(_))) => (
                    "`trip when`",
                    "add a condition such as `trip when error_ratio > 50% over 1m min_calls 20`",
                ),
                _ => continue,
            };
            out.push(
                MissingField {
                    kind: rule.kind().to_string(),
                    name: rule.name().node.clone(),
                    missing: missing.to_string(),
                    src: cx.src(svc.file),
                    span: rule.name().span.into(),
                    label: format!("this {} enforces nothing", rule.kind()),
                    help: help.to_string(),
                }
                .into(),
            );
        }
        if svc.domain.is_some() {
            continue;
        }
        for rule in &svc.rules {
            let Rule::Limit(l) = rule else { continue };
            for s in &l.settings {
                if let LimitSetting::Per { key, span } = s
                    && key.node == LimitKey::Domain
                {
                    out.push(
                        MissingField {
                            kind: "service".to_string(),
                            name: svc.name().to_string(),
                            missing: "`domain`".to_string(),
                            src: cx.src(svc.file),
                            span: (*span).into(),
                            label: format!("limit `{}` counts per domain", l.name.node),
                            help: "declare the service's domain (`domain \"trade\"`), or count `per service`"
                                .to_string(),
                        }
                        .into(),
                    );
                }
            }
        }
    }
}
