//! `gov::invalid-status`: an HTTP status code outside `100..=599`, or a
//! range whose start is above its end (`status 599..500`).
//!
//! Why: an agent cannot answer with status 999, and a reversed range
//! classifies nothing, so a fuse meant to count 5xx never trips.
//!
//! Example: `reject with 4290`, `classify business status 599..500`.
//!
//! Fix: use a code between 100 and 599; write ranges low to high.

use gov_lang::ast::{
    BulkheadSetting, ClassifyItem, FuseSetting, LimitSetting, ServiceStmt, Span, Status, WarmupStep,
};
use miette::SourceSpan;
use thiserror::Error;

use crate::diagnostic::Diagnostic;
use crate::resolve::{Ctx, Rule, Src};

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

pub(crate) fn check(cx: &Ctx<'_>, out: &mut Vec<Diagnostic>) {
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
        for rule in &svc.rules {
            match rule {
                Rule::Bulkhead(b) => {
                    for s in &b.settings {
                        if let BulkheadSetting::RejectWith { status, .. } = s {
                            codes.push(status);
                        }
                    }
                }
                Rule::Limit(l) => {
                    for s in &l.settings {
                        if let LimitSetting::RejectWith { status, .. } = s {
                            codes.push(status);
                        }
                    }
                }
                Rule::Fuse(f) => {
                    for s in &f.settings {
                        match s {
                            FuseSetting::RejectWith { status, .. } => codes.push(status),
                            FuseSetting::Classify(c) => {
                                for item in &c.items {
                                    let ClassifyItem::Status { codes: rs, .. } = item else {
                                        continue;
                                    };
                                    for r in rs {
                                        codes.push(&r.from);
                                        if let Some(to) = &r.to {
                                            codes.push(to);
                                            ranges.push((&r.from, to, r.span));
                                        }
                                    }
                                }
                            }
                            FuseSetting::Trip(_) | FuseSetting::Recover { .. } => {}
                        }
                    }
                }
            }
        }
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
