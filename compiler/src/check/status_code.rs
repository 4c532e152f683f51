//! `gov::invalid-status`: an HTTP status code outside `100..=599`, or a
//! range whose start is above its end (`status 599..500`).
//!
//! Why: an agent cannot answer with status 999, and a reversed range
//! classifies nothing, so a fuse meant to count 5xx never trips.
//!
//! Example: `reject with 4290`, `classify business status 599..500`.
//!
//! Fix: use a code between 100 and 599; write ranges low to high.

use gov_lang::ast::{ServiceStmt, Span, Status, WarmupStep};
use miette::SourceSpan;
use thiserror::Error;

use crate::kind::Values;
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("{message}")]
#[diagnostic(code("gov::invalid-status"))]
pub struct InvalidStatus {
    pub message: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "{label}")]
    pub span: SourceSpan,
    pub label: String,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<InvalidStatus>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let mut codes: Vec<&Status> = Vec::new();
        let mut ranges: Vec<(&Status, &Status, Span)> = Vec::new();
        for stmt in &svc.ast.body {
            if let ServiceStmt::Warmup(w) = stmt {
                for step in &w.steps {
                    if let WarmupStep::Ready { status, .. } = step {
                        codes.push(status);
                    }
                }
            }
        }
        let mut values = Values::default();
        for rule in &svc.rules {
            let text = |span| cx.text(svc.file, span).to_string();
            rule.imp.values(rule.def, &text, &mut values);
        }
        codes.extend(&values.statuses);
        ranges.extend(values.ranges.iter().map(|(f, t, s)| (f, t, *s)));
        for code in codes {
            if (100..=599).contains(&code.node) {
                continue;
            }
            out.push(
                InvalidStatus {
                    message: format!("status code `{}` is outside 100..=599", code.node),
                    src: cx.src(svc.file),
                    span: code.span.into(),
                    label: "not an http status code".to_string(),
                    help: "use a code between 100 and 599".to_string(),
                }
                .into(),
            );
        }
        for (from, to, span) in ranges {
            if from.node <= to.node {
                continue;
            }
            out.push(
                InvalidStatus {
                    message: format!("status range `{}..{}` is empty", from.node, to.node),
                    src: cx.src(svc.file),
                    span: span.into(),
                    label: "the start is above the end".to_string(),
                    help: format!("write the range low to high: `{}..{}`", to.node, from.node),
                }
                .into(),
            );
        }
    }
}
