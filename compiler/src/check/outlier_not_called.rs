//! `gov::lint::outlier-not-called` (warning): `outlier to NAME` in a service
//! none of whose matches or rules calls `NAME` (`calls to NAME`).
//!
//! Why: the block applies to the service's calls to `NAME` through its
//! outbound listener; a service that declares no rule on those calls may
//! still make them, but more often the block names the wrong service (or
//! sits in the wrong one: the caller declares it, not the callee).
//!
//! Example: `service web { outlier to checkout { eject 30s } }` with no
//! `calls to checkout` in `web`.
//!
//! Fix: put the block in the service that makes the calls, name the service
//! it calls, or declare the calls (`match checkout = calls to checkout`).

use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src, calls_to};

#[derive(Debug, Error, miette::Diagnostic)]
#[error(
    "`{service}` has an outlier policy for calls to `{to}` that none of its matches or rules makes"
)]
#[diagnostic(
    code("gov::lint::outlier-not-called"),
    severity(Warning),
    help(
        "put the block in the service that calls `{to}`, or declare the calls (`match {to} = calls to {to}`)"
    )
)]
pub struct OutlierNotCalled {
    pub service: String,
    pub to: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "no match or rule of `{service}` calls `{to}`")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<OutlierNotCalled>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        if svc.outliers.iter().all(|b| b.to.is_none()) {
            continue;
        }
        let mut called = Vec::new();
        for stmt in &svc.ast.body {
            if let gov_lang::ast::ServiceStmt::Match(m) = stmt {
                calls_to(&m.expr, &mut called);
            }
        }
        for rule in &svc.rules {
            calls_to(rule.on(), &mut called);
        }
        for to in svc.outliers.iter().filter_map(|b| b.to.as_ref()) {
            // An unknown service is `gov::unknown-service`'s.
            if called.iter().any(|c| c.node == to.node)
                || !cx.service_index.contains_key(to.node.as_str())
            {
                continue;
            }
            out.push(
                OutlierNotCalled {
                    service: svc.name().to_string(),
                    to: to.node.clone(),
                    src: cx.src(svc.file),
                    span: to.span.into(),
                }
                .into(),
            );
        }
    }
}
