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

use crate::kind::limit::{Limit, LimitKey, LimitSetting};
use crate::resolve::{Ctx, Src};

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

pub(crate) fn check<D: From<MissingField>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some((missing, help)) = rule.imp.missing(rule.def) else {
                continue;
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
            let Some(l) = Limit::of(rule) else { continue };
            for s in &l.settings {
                if let LimitSetting::Per { key, span, .. } = s
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
