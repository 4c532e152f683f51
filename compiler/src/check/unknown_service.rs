//! `gov::unknown-service`: `calls to NAME` or `outlier to NAME` names a
//! service that no file defines.
//!
//! Why: a client-side bulkhead or limit on calls to a misspelt service
//! never matches a call, so the caller is unprotected.
//!
//! Example: `bulkhead b on calls to inventroy { ... }` when the service is
//! `inventory`.
//!
//! Fix: use the name of a service defined in one of the checked files, or
//! add that service (an empty `service inventory {}` is enough).
//! The check is skipped when some file failed to parse, since the service
//! may be defined there.

use miette::SourceSpan;
use thiserror::Error;

use crate::resolve::{Ctx, Src, calls_to};
use crate::suggest;

#[derive(Debug, Error, miette::Diagnostic)]
#[error("unknown service `{name}`")]
#[diagnostic(code("gov::unknown-service"))]
pub struct UnknownService {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "no service of this name in the checked files")]
    pub span: SourceSpan,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<UnknownService>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    let known: Vec<&str> = cx.service_index.keys().copied().collect();
    for svc in &cx.services {
        let mut targets = Vec::new();
        for stmt in &svc.ast.body {
            if let gov_lang::ast::ServiceStmt::Match(m) = stmt {
                calls_to(&m.expr, &mut targets);
            }
        }
        for rule in &svc.rules {
            calls_to(rule.on(), &mut targets);
        }
        targets.extend(svc.outliers.iter().filter_map(|b| b.to.as_ref()));
        for target in targets {
            if cx.service_index.contains_key(target.node.as_str())
                || !cx.service_surely_unknown(&target.node)
            {
                continue;
            }
            out.push(
                UnknownService {
                    name: target.node.clone(),
                    src: cx.src(svc.file),
                    span: target.span.into(),
                    help: suggest::help("service", &target.node, &known),
                }
                .into(),
            );
        }
    }
}
